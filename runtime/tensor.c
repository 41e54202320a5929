/* runtime/tensor.c: tensors, storage, reference counts and scopes.
 *
 * A tensor is a header (sizes, strides, offset, dtype) over reference-counted storage; views
 * are new headers over the same storage. Storage and its data are one allocation (header, then
 * the data 64-byte aligned), so a new tensor costs two allocations, which keeps eager dispatch
 * cheap. Scopes (a thread-local stack of tensor lists) own op results so model code never
 * releases by hand, as DESIGN.md's C conventions say. */
#include "rt.h"
#include "cuda.h"

#include <string.h>

#define STORAGE_HEADER 128 /* rt_storage padded so data stays 64-byte aligned */
_Static_assert(sizeof(rt_storage) <= STORAGE_HEADER, "storage header outgrew its padding");

typedef struct scope {
  em_tensor **items;
  int64_t n, cap;
  const char *op; /* the composite op that opened it (rt_scope_begin_op), else NULL */
} scope;

/* EM_NONE's address; never read. */
struct em_tensor em_none_sentinel;

static uint64_t serial_counter;
static _Thread_local scope *scopes; /* scopes[0] is the base scope */
static _Thread_local int n_scopes, cap_scopes;

static void storage_release(rt_storage *s) {
  if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    if (s->release) s->release(s->release_ctx);
    else if (s->device == EM_CUDA) { if (s->block) cu_release(s->block->owner, s->block); }
    else rt_count_storage(-(int64_t)s->bytes);
    rt_free(s);
  }
}

bool rt_tensor_arg(const em_tensor *t, const char *name, em_site site) {
  if (!t) return false;
  if (t == EM_NONE) return rt_error(site, name, "an operand is EM_NONE, where a tensor is required"), false;
  return true;
}

/* EM_NONE is a static sentinel, not a counted tensor: retaining or releasing it does nothing
 * (an op handed it by mistake released it and freed its missing storage). */
em_tensor *em_retain(em_tensor *t) {
  if (t && t != EM_NONE) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
  return t;
}

void em_release(em_tensor *t) {
  if (!t || t == EM_NONE) return;
  if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    if (t->proxy) rt_trace_forget(t);
    if (t->watched) rt_watch_notify(t);
    em_release(t->view_base);
    em_release(t->grad);
    rt_node_release(t->grad_fn);
    storage_release(t->storage);
    rt_count_tensor(-1);
    rt_free(t->marks);
    rt_free(t);
  }
}

static em_tensor *new_header(rt_storage *s, em_dtype dt, int ndim, const int64_t *sizes,
                             const char *op, em_site site) {
  em_tensor *t = rt_alloc(sizeof *t, 16);
  if (!t) {
    char b[128];
    return rt_error(site, op, "out of memory allocating the header of %s",
                    ir_fmt_type(b, sizeof b, dt, ndim, sizes));
  }
  memset(t, 0, sizeof *t);
  t->refcount = 1;
  t->storage = s;
  t->dtype = dt;
  t->ndim = ndim;
  if (ndim) memcpy(t->sizes, sizes, sizeof(int64_t) * (size_t)ndim); /* sizes may be NULL for 0 dims */
  t->numel = ir_numel(ndim, sizes);
  t->serial = __atomic_add_fetch(&serial_counter, 1, __ATOMIC_RELAXED);
  rt_count_tensor(1);
  return t;
}

/* The bytes of a new tensor of this type, or false with an error (bad dtype, dims or sizes). */
static bool checked_bytes(em_dtype dt, int ndim, const int64_t *sizes, size_t *bytes, const char *op, em_site site) {
  char b[128];
  if (!ir_dtype_valid(dt)) return rt_error(site, op, "invalid dtype %d", (int)dt), false;
  if (ndim < 0 || ndim > EM_MAX_DIMS)
    return rt_error(site, op, "%d dims requested; a tensor has 0 to %d", ndim, EM_MAX_DIMS), false;
  if (ndim > 0 && !sizes) return rt_error(site, op, "sizes is NULL for %d dims", ndim), false;
  for (int i = 0; i < ndim; i++)
    if (sizes[i] < 0)
      return rt_error(site, op, "size %lld of dim %d is negative", (long long)sizes[i], i), false;
  if (!ir_nbytes(dt, ndim, sizes, 2 * STORAGE_HEADER, bytes))
    return rt_error(site, op, "%s is too large to address", ir_fmt_type(b, sizeof b, dt, ndim, sizes)), false;
  return true;
}

/* A contiguous header over new storage s (its one reference passes to the tensor; released on
 * failure). */
static em_tensor *contiguous_over(rt_storage *s, em_dtype dt, int ndim, const int64_t *sizes, const char *op, em_site site) {
  em_tensor *t = new_header(s, dt, ndim, sizes, op, site);
  if (!t) {
    storage_release(s);
    return NULL;
  }
  ir_contiguous_strides(ndim, sizes, t->strides);
  return t;
}

em_tensor *rt_new(em_dtype dt, int ndim, const int64_t *sizes, const char *op, em_site site) {
  char b[128];
  size_t bytes;
  if (!checked_bytes(dt, ndim, sizes, &bytes, op, site)) return NULL;
  rt_storage *s = rt_alloc(STORAGE_HEADER + (bytes ? bytes : 1), 64);
  if (!s)
    return rt_error(site, op, "out of memory allocating %s (%zu bytes)",
                    ir_fmt_type(b, sizeof b, dt, ndim, sizes), bytes);
  *s = (rt_storage){.refcount = 1, .bytes = bytes, .device = EM_CPU,
                    .data = (char *)s + STORAGE_HEADER, .serial = __atomic_add_fetch(&serial_counter, 1, __ATOMIC_RELAXED)};
  rt_count_storage((int64_t)bytes);
  return contiguous_over(s, dt, ndim, sizes, op, site);
}

/* On the device, the storage header is host memory and the data a block of the caching
 * allocator (live device bytes are its statistics, not the debug counters). */
em_tensor *rt_new_device(em_dtype dt, int ndim, const int64_t *sizes, em_device dev, const char *op, em_site site) {
  if (dev == EM_CPU) return rt_new(dt, ndim, sizes, op, site);
  size_t bytes;
  if (!checked_bytes(dt, ndim, sizes, &bytes, op, site)) return NULL;
  rt_storage *s = rt_alloc(sizeof *s, 16);
  if (!s) return rt_error(site, op, "out of memory");
  cu_block *blk = cu_storage_alloc(bytes, op, site);
  if (!blk) return rt_free(s), NULL;
  *s = (rt_storage){.refcount = 1, .bytes = bytes, .device = EM_CUDA, .data = (char *)(uintptr_t)blk->ptr, .block = blk,
                    .serial = __atomic_add_fetch(&serial_counter, 1, __ATOMIC_RELAXED)};
  return contiguous_over(s, dt, ndim, sizes, op, site);
}

em_tensor *rt_new_external(em_dtype dt, int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset,
                           em_device dev, void *data, size_t bytes, void (*release)(void *), void *ctx,
                           const char *op, em_site site) {
  char b[128];
  size_t contiguous_bytes;
  if (!checked_bytes(dt, ndim, sizes, &contiguous_bytes, op, site)) return NULL;
  int64_t st[EM_MAX_DIMS];
  if (strides) memcpy(st, strides, sizeof(int64_t) * (size_t)ndim);
  else ir_contiguous_strides(ndim, sizes, st);
  /* The lowest and highest element addressed, in elements from data, must lie in the buffer. */
  int64_t lo = offset, hi = offset, numel = ir_numel(ndim, sizes), esize = (int64_t)ir_dtype(dt)->size;
  bool ok = offset >= 0;
  for (int d = 0; ok && d < ndim && numel > 0; d++) {
    int64_t span;
    ok = ir_mul_ok(sizes[d] - 1, st[d], &span) && (span >= 0 ? ir_add_ok(hi, span, &hi) : ir_add_ok(lo, span, &lo));
  }
  int64_t end;
  if (!ok || lo < 0 || (numel > 0 && (!ir_add_ok(hi, 1, &end) || !ir_mul_ok(end, esize, &end) || (uint64_t)end > bytes)))
    return rt_error(site, op, "%s with strides and offset %lld does not fit in a buffer of %zu bytes",
                    ir_fmt_type(b, sizeof b, dt, ndim, sizes), (long long)offset, bytes);
  rt_storage *s = rt_alloc(sizeof *s, 16);
  if (!s) return rt_error(site, op, "out of memory");
  *s = (rt_storage){.refcount = 1, .bytes = bytes, .device = dev, .data = data, .release = release, .release_ctx = ctx};
  em_tensor *t = new_header(s, dt, ndim, sizes, op, site);
  if (!t) {
    rt_free(s); /* not storage_release: the caller keeps ctx on failure */
    return NULL;
  }
  memcpy(t->strides, st, sizeof(int64_t) * (size_t)ndim);
  t->offset = offset;
  return t;
}

em_tensor *rt_new_view(em_tensor *base, int ndim, const int64_t *sizes, const int64_t *strides,
                       int64_t offset, const char *op, em_site site) {
  em_tensor *t = new_header(base->storage, base->dtype, ndim, sizes, op, site);
  if (!t) return NULL;
  __atomic_add_fetch(&base->storage->refcount, 1, __ATOMIC_RELAXED);
  if (ndim) memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
  t->offset = offset;
  if (base->proxy && !rt_trace_adopt(t, base)) { /* a view of a proxy (em_detach) is a proxy */
    em_release(t);
    return rt_error(site, op, "out of memory recording a proxy");
  }
  return t;
}

uint64_t rt_serial_now(void) { return __atomic_load_n(&serial_counter, __ATOMIC_RELAXED); }

/* ---- proxies (the tracer's tensors, trace.c) ---- */

em_tensor *rt_new_proxy(em_tensor *base, const prim_meta *m, int value, rt_trace *tr, const char *op, em_site site) {
  em_tensor *t;
  if (base) {
    t = rt_new_view(base, m->ndim, m->sizes, m->strides, m->offset, op, site);
  } else {
    rt_storage *s = rt_alloc(STORAGE_HEADER, 64);
    if (!s) return rt_error(site, op, "out of memory allocating a proxy");
    /* on the device of the value it stands for, so ops on it record nodes on that device */
    *s = (rt_storage){.refcount = 1, .device = tr->g->values[value].type.device, .data = NULL};
    t = new_header(s, m->dtype, m->ndim, m->sizes, op, site);
    if (!t) {
      storage_release(s);
      return NULL;
    }
    ir_contiguous_strides(m->ndim, m->sizes, t->strides);
  }
  if (!t) return NULL;
  bool adopted = t->proxy != 0; /* rt_new_view registered it already */
  t->proxy = value + 1;
  t->proxy_trace = tr->id;
  if (!adopted && !rt_trace_register(tr, t)) {
    t->proxy = 0;
    em_release(t);
    return rt_error(site, op, "out of memory recording a proxy");
  }
  return t;
}

void rt_tensor_become(em_tensor *p, em_tensor *real) {
  EM_ASSERT(p->dtype == real->dtype && p->ndim == real->ndim);
  __atomic_add_fetch(&real->storage->refcount, 1, __ATOMIC_RELAXED);
  rt_storage *old = p->storage;
  p->storage = real->storage;
  memcpy(p->strides, real->strides, sizeof p->strides);
  p->offset = real->offset;
  p->proxy = 0;
  rt_node *old_fn = p->grad_fn;
  p->grad_fn = real->grad_fn;
  if (p->grad_fn) __atomic_add_fetch(&p->grad_fn->refcount, 1, __ATOMIC_RELAXED);
  p->requires_grad = real->requires_grad;
  em_tensor *old_base = p->view_base; /* a real tensor needs no provenance */
  p->view_base = NULL;
  rt_node_release(old_fn); /* may free other proxies; p itself is still owned */
  em_release(old_base);
  storage_release(old);
}

/* ---- scopes ---- */

static bool push_scope(void) {
  if (n_scopes == cap_scopes) {
    int cap = cap_scopes ? cap_scopes * 2 : 8;
    scope *s = rt_alloc(sizeof(scope) * (size_t)cap, 16);
    if (!s) return false;
    if (n_scopes) memcpy(s, scopes, sizeof(scope) * (size_t)n_scopes);
    rt_free(scopes);
    scopes = s;
    cap_scopes = cap;
  }
  scopes[n_scopes++] = (scope){0};
  return true;
}

static bool scope_append(scope *s, em_tensor *t) {
  if (s->n == s->cap) {
    int64_t cap = s->cap ? s->cap * 2 : 64;
    em_tensor **items = rt_alloc(sizeof(em_tensor *) * (size_t)cap, 16);
    if (!items) return false;
    if (s->n) memcpy(items, s->items, sizeof(em_tensor *) * (size_t)s->n);
    rt_free(s->items);
    s->items = items;
    s->cap = cap;
  }
  s->items[s->n++] = t;
  return true;
}

static void pop_scope(void) {
  scope *s = &scopes[--n_scopes];
  /* Release newest first, so views go before their bases in the common case. */
  for (int64_t i = s->n - 1; i >= 0; i--) em_release(s->items[i]);
  rt_free(s->items);
}

em_tensor *rt_scope_add(em_tensor *t, const char *op, em_site site) {
  if (!t) return NULL;
  if ((n_scopes == 0 && !push_scope()) || !scope_append(&scopes[n_scopes - 1], t)) {
    char b[128];
    rt_error(site, op, "out of memory recording the result %s in the current scope", rt_fmt(b, sizeof b, t));
    em_release(t);
    return NULL;
  }
  return t;
}

bool em_scope_begin_at(em_site site) {
  if ((n_scopes == 0 && !push_scope()) || !push_scope()) {
    rt_error(site, "em_scope_begin", "out of memory opening a scope");
    return false;
  }
  return true;
}

bool rt_scope_begin_op(const char *op, em_site site) {
  if (!em_scope_begin_at(site)) return false;
  scopes[n_scopes - 1].op = op;
  return true;
}

const char *rt_scope_op(void) {
  for (int i = 0; i < n_scopes; i++)
    if (scopes[i].op) return scopes[i].op;
  return NULL;
}

void em_scope_end_at(em_site site) {
  if (n_scopes <= 1) {
    rt_error(site, "em_scope_end", "no scope is open (em_scope_end without em_scope_begin)");
    return;
  }
  pop_scope();
}

em_tensor *em_keep_at(em_tensor *t, em_site site) {
  if (!t) return NULL;
  if (n_scopes <= 1) return t; /* already in the base scope, which outlives everything */
  if (!scope_append(&scopes[n_scopes - 2], t)) {
    char b[128];
    return rt_error(site, "em_keep", "out of memory moving %s to the enclosing scope", rt_fmt(b, sizeof b, t));
  }
  em_retain(t);
  return t;
}

void em_thread_cleanup(void) {
  while (n_scopes > 0) pop_scope();
  rt_free(scopes);
  scopes = NULL;
  cap_scopes = 0;
}

/* ---- metadata ---- */

int em_ndim(const em_tensor *t) { return t->ndim; }
int64_t em_size(const em_tensor *t, int dim) {
  int d = ir_norm_axis(dim, t->ndim);
  return d < 0 ? -1 : t->sizes[d];
}
const int64_t *em_sizes(const em_tensor *t) { return t->sizes; }
const int64_t *em_strides(const em_tensor *t) { return t->strides; }
int64_t em_numel(const em_tensor *t) { return t->numel; }
int64_t em_storage_offset(const em_tensor *t) { return t->offset; }
em_dtype em_dtype_of(const em_tensor *t) { return t->dtype; }
em_device em_device_of(const em_tensor *t) { return t->storage->device; }
bool em_is_contiguous(const em_tensor *t) { return ir_is_contiguous(t->ndim, t->sizes, t->strides); }
int64_t em_version(const em_tensor *t) { return __atomic_load_n(&t->storage->version, __ATOMIC_RELAXED); }
void *em_data_ptr_at(em_tensor *t, em_site site) {
  if (!t) return NULL;
  int tok = rt_break_begin("em_data_ptr", "reads a tensor's data pointer", site);
  if (tok < 0) return NULL;
  void *p = rt_data(t);
  rt_break_end(tok);
  return p;
}
bool em_shares_storage(const em_tensor *a, const em_tensor *b) { return a->storage == b->storage; }

prim_buf rt_buf(const em_tensor *t) {
  prim_buf b = {.data = rt_data(t), .dtype = t->dtype, .ndim = t->ndim};
  memcpy(b.sizes, t->sizes, sizeof b.sizes);
  memcpy(b.strides, t->strides, sizeof b.strides);
  return b;
}

prim_meta rt_meta(const em_tensor *t) {
  prim_meta m = {.dtype = t->dtype, .ndim = t->ndim, .offset = t->offset};
  memcpy(m.sizes, t->sizes, sizeof m.sizes);
  memcpy(m.strides, t->strides, sizeof m.strides);
  return m;
}
