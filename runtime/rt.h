/* runtime/rt.h: the private header of the runtime/ layer.
 *
 * The runtime owns the tensor: storage and its allocator, reference counts and scopes, sticky
 * errors, the random generator, and the dispatcher every public op enters. Sections follow the
 * files: alloc.c, error.c, tensor.c (tensors, storage, scopes), dispatch.c, ops.c (public op
 * API), creation.c, print.c.
 *
 * Thread-local state (documented here, in one place): the scope stack (tensor.c) and the last
 * error (error.c). Process-wide state: the allocator and the debug counters (alloc.c), the
 * random generator (creation.c). */
#ifndef EMBER_RT_H
#define EMBER_RT_H

#include "../prims/prims.h"

#include <stdarg.h>

/* Invariant checks: a broken invariant is a bug in Ember, not a user error; abort with file:line. */
#define EM_ASSERT(c) ((c) ? (void)0 : rt_assert_fail(#c, __FILE__, __LINE__))
_Noreturn void rt_assert_fail(const char *what, const char *file, int line);

/* ---- alloc.c ----------------------------------------------------------------------------- */

/* Every allocation Ember makes goes through these two, so the fault injector sees them all. */
void *rt_alloc(size_t bytes, size_t align);
void rt_free(void *p);
/* Live-storage accounting (bytes of tensor data). */
void rt_count_storage(int64_t delta_bytes);
void rt_count_tensor(int delta);

/* ---- error.c ----------------------------------------------------------------------------- */

/* Records "file:line: op: message" unless an error is already recorded. Always returns NULL,
 * so error paths read `return rt_error(...)`. */
void *rt_error(em_site site, const char *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool rt_has_error(void);
/* "f32[3,4]" for a tensor, into buf. */
char *rt_fmt(char *buf, size_t cap, const em_tensor *t);

/* ---- tensor.c ---------------------------------------------------------------------------- */

/* Storage: one allocation holds this header and, 64-byte aligned after it, the data. Shared by
 * every view of it; its version counter is bumped by in-place writes through any view. */
typedef struct rt_storage {
  int64_t refcount;
  int64_t version;
  size_t bytes;
  em_device device;
  char *data;
} rt_storage;

struct em_tensor {
  int64_t refcount;             /* owners: scopes, views' bases do not count (views hold storage) */
  rt_storage *storage;          /* shared with views */
  em_dtype dtype;
  int ndim;
  int64_t sizes[EM_MAX_DIMS];   /* elements per dim */
  int64_t strides[EM_MAX_DIMS]; /* elements between neighbours along each dim; 0 when expanded */
  int64_t offset;               /* storage offset of element 0, in elements */
  int64_t numel;
};

/* A new contiguous tensor with uninitialised data, owned by the caller (refcount 1, in no
 * scope). NULL with an error recorded (naming op and site) on bad sizes or allocation failure. */
em_tensor *rt_new(em_dtype dt, int ndim, const int64_t *sizes, const char *op, em_site site);
/* A new header over t's storage with the given layout, owned by the caller. */
em_tensor *rt_new_view(em_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides,
                       int64_t offset, const char *op, em_site site);
/* Hands a caller-owned reference to the current scope. Returns t, or NULL (t released, error
 * recorded) if the scope cannot grow. NULL-safe. */
em_tensor *rt_scope_add(em_tensor *t, const char *op, em_site site);
/* Views of a tensor as kernel operands. */
prim_buf rt_buf(const em_tensor *t);
prim_meta rt_meta(const em_tensor *t);
static inline char *rt_data(const em_tensor *t) {
  return t->storage->data + t->offset * (int64_t)ir_dtype(t->dtype)->size;
}
static inline void rt_bump_version(em_tensor *t) { __atomic_add_fetch(&t->storage->version, 1, __ATOMIC_RELAXED); }

/* ---- dispatch.c -------------------------------------------------------------------------- */

/* The one entry of every op: checks operands (NULL in -> NULL out, silently), runs the meta
 * function, makes a view or allocates the result and runs the reference kernel. Returns a
 * caller-owned reference (not in any scope) or NULL with a located error naming `name`. This is
 * where tracing and autograd will hook in. */
em_tensor *rt_dispatch(const char *name, em_prim op, em_tensor *const *in, int n_in,
                       const prim_attrs *at, em_site site);
/* Runs a pointwise prim writing into an existing tensor out (any strides, not overlapping
 * itself), after checking that the meta function's result matches out's dtype and shape. */
bool rt_dispatch_out(const char *name, em_prim op, em_tensor *const *in, int n_in,
                     const prim_attrs *at, em_tensor *out, em_site site);

/* ---- ops.c: caller-owned building blocks used by several public ops ------------------------ */

em_tensor *rt_cast(em_tensor *x, em_dtype dt, const char *name, em_site site);
em_tensor *rt_expand(em_tensor *x, int ndim, const int64_t *sizes, const char *name, em_site site);
em_tensor *rt_reshape(em_tensor *x, int ndim, const int64_t *sizes, const char *name, em_site site);
em_tensor *rt_scalar(em_dtype dt, double v, const char *name, em_site site);

/* ---- creation.c -------------------------------------------------------------------------- */

/* Reserves `calls` Philox counters: returns the seed and the first offset to use. */
void rt_rng_reserve(uint64_t calls, uint64_t *seed, uint64_t *offset);

#endif /* EMBER_RT_H */
