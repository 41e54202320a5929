/* runtime/rt.h: the private header of the runtime/ layer.
 *
 * The runtime owns the tensor: storage and its allocator, reference counts and scopes, sticky
 * errors, the random generator, and the dispatcher every public op enters. Sections follow the
 * files: alloc.c, error.c, tensor.c (tensors, storage, scopes), dispatch.c, ops.c (public op
 * API), creation.c, print.c.
 *
 * Thread-local state (documented here, in one place): the scope stack (tensor.c), the last
 * error (error.c) and the open autocast regions (autocast.c). Process-wide state: the allocator
 * and the debug counters (alloc.c), the random generator (creation.c). */
#ifndef EMBER_RT_H
#define EMBER_RT_H

#include "../prims/prims.h"

struct ir_graph;
struct ir_type;

#include <stdarg.h>
#include <stdio.h>

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

/* ---- cache.c: the disk cache's directory and whole-file writes --------------------------- */

/* The kernel cache's directory (created), or NULL when caching is off or it is unusable. */
const char *rt_cache_dir(void);
/* Creates path and its missing parents; true when it is a directory afterwards. */
bool rt_mkdirs(char *path);
/* Writes head then body to path through a temporary file and a rename: the file is whole or
 * absent. False (nothing left behind) on any failure. */
bool rt_write_file_whole(const char *path, const void *head, size_t head_size, const void *body, size_t body_size);
/* Opens a cache file for reading: NULL unless path is a regular file (a FIFO put in its place
 * would block forever; a directory or device is no cache entry); its size in *size. */
FILE *rt_cache_open(const char *path, int64_t *size);

/* ---- profile.c: the Chrome-trace profiler ------------------------------------------------
 * Hooks test rt_prof_on (one load and a branch when off), take rt_prof_now() at the start and
 * record a complete event at the end: cat is a static category ("op", "compiled", "kernel",
 * "gemm", "phase"), name is copied, args a printf-style detail (or NULL). */
extern int rt_prof_on;
#define RT_PROF_ON() __builtin_expect(__atomic_load_n(&rt_prof_on, __ATOMIC_RELAXED), 0)
uint64_t rt_prof_now(void);
void rt_prof_complete(const char *cat, const char *name, uint64_t t0, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void rt_prof_instant(const char *cat, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An eager op's event, with its operands' types as the detail. */
void rt_prof_op(const char *name, em_tensor *const *in, int n_in, uint64_t t0);
/* A kernel's time on the device (ns on rt_prof_now's clock), for the trace's CUDA track. */
void rt_prof_device(const char *name, uint64_t ts, uint64_t dur);

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
  uint64_t serial;     /* creation order on the tensors' counter (rt_serial_now); 0: not Ember's memory,
                        * or taken as a leaf's gradient (autograd.c: can_steal) */
  size_t bytes;
  em_device device;
  char *data;
  const char *writer;  /* the last in-place op and its site, for autograd's version error */
  em_site writer_site;
  struct cu_block *block; /* EM_CUDA: the caching allocator's block; data is its device address */
  /* Memory Ember did not allocate (a mapped safetensors file, a DLPack producer's buffer):
   * release(release_ctx) runs when the last reference goes; NULL for Ember's own storage. */
  void (*release)(void *ctx);
  void *release_ctx;
} rt_storage;

typedef struct rt_node rt_node;

/* Per-dim marks a user put on a tensor for em_compile's dynamic shapes (bit d: dim d). */
typedef struct rt_dyn_marks {
  uint8_t dynamic, fixed;
  int64_t min[EM_MAX_DIMS], max[EM_MAX_DIMS]; /* the range of each dim marked dynamic */
} rt_dyn_marks;

struct em_tensor {
  int64_t refcount;             /* owners: scopes, views' bases do not count (views hold storage) */
  rt_storage *storage;          /* shared with views */
  em_dtype dtype;
  int ndim;
  int64_t sizes[EM_MAX_DIMS];   /* elements per dim */
  int64_t strides[EM_MAX_DIMS]; /* elements between neighbours along each dim; 0 when expanded */
  int64_t offset;               /* storage offset of element 0, in elements */
  int64_t numel;
  bool requires_grad;           /* a leaf marked so, or a result of a recorded op */
  em_tensor *grad;              /* leaves: accumulated gradient (owned), or NULL */
  rt_node *grad_fn;             /* results of recorded ops: the node (owned ref), else NULL */
  uint64_t serial;              /* creation order, process-wide: tells trace-local tensors apart */
  /* tracing (trace.c): a proxy stands for graph value `proxy - 1` of trace `proxy_trace` and
   * has no data; proxy_slot is its index in that trace's list of live proxies */
  int proxy;
  int proxy_slot;
  uint32_t proxy_trace;
  bool watched;                 /* some compiled entry holds a weak reference (trace.c) */
  rt_dyn_marks *marks;          /* em_mark_dynamic / em_mark_static (owned), or NULL */
  /* functionalization (trace.c): a proxy made by a view prim remembers its base (owned ref) and
   * the node that made it, in graph view_graph of its trace, so a write into it can be written
   * back into the base */
  em_tensor *view_base;
  int view_node;
  uint32_t view_graph;
};

/* A new contiguous tensor with uninitialised data, owned by the caller (refcount 1, in no
 * scope). NULL with an error recorded (naming op and site) on bad sizes or allocation failure. */
em_tensor *rt_new(em_dtype dt, int ndim, const int64_t *sizes, const char *op, em_site site);
/* The same on a device (EM_CPU: rt_new). A CUDA tensor's data pointer is a device address. */
em_tensor *rt_new_device(em_dtype dt, int ndim, const int64_t *sizes, em_device dev, const char *op, em_site site);
/* A tensor over memory Ember does not own: data (host, or a device address for EM_CUDA) holds
 * `bytes` bytes; the tensor has the given sizes and element strides (NULL: contiguous) and
 * offset in elements, and every element it addresses must lie inside those bytes (checked).
 * release(ctx) runs once, when the storage's last reference goes; on failure (NULL, error
 * recorded) it is not called and ctx stays the caller's. Caller-owned; not counted in the live
 * storage bytes (the memory is not Ember's). */
em_tensor *rt_new_external(em_dtype dt, int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset,
                           em_device dev, void *data, size_t bytes, void (*release)(void *), void *ctx,
                           const char *op, em_site site);
/* safetensors.c: the writer behind em_save and em_save_safetensors (metadata: key, value, ...,
 * NULL, or NULL), and em_load's reader for safetensors files; op names the public function. */
bool rt_save_safetensors(const char *path, int n, em_tensor *const *ts, const char *const *names,
                         const char *const *metadata, const char *op, em_site site);
bool rt_load_safetensors_into(const char *path, int n, em_tensor *const *ts, const char *const *names,
                              const char *op, em_site site);
/* The handle of em_load_safetensors with errors under op's name; whether name is a tensor of an
 * Ember dtype (its type in *dt, *ndim, sizes[EM_MAX_DIMS]); its CPU tensor, caller-owned (a view
 * of the mapping when aligned), or NULL with an error. */
em_safetensors *rt_safetensors_open(const char *path, const char *op, em_site site);
bool rt_safetensors_find(const em_safetensors *f, const char *name, em_dtype *dt, int *ndim, int64_t *sizes);
em_tensor *rt_safetensors_cpu(em_safetensors *f, const char *name, const char *op, em_site site);
/* cuda_ops.c: a copy of x on dev (a new reference to x when it is there already), caller-owned;
 * NULL with an error recorded. Not recorded by autograd or the tracer (em_to is). */
em_tensor *rt_to_device(em_tensor *x, em_device dev, const char *name, em_site site);
/* data.c: epoch's order of n examples (the identity, or a Philox-driven Fisher-Yates shuffle
 * keyed by seed and epoch), shared by em_batch_iter and em_loader. */
void rt_batch_order(int64_t *order, int64_t n, bool shuffle, uint64_t seed, uint64_t epoch);
/* creation.c: the device factories create on (em_set_default_device; thread-local). */
em_device rt_default_device(void);
/* A new header over t's storage with the given layout, owned by the caller. */
em_tensor *rt_new_view(em_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides,
                       int64_t offset, const char *op, em_site site);
/* Hands a caller-owned reference to the current scope. Returns t, or NULL (t released, error
 * recorded) if the scope cannot grow. NULL-safe. */
em_tensor *rt_scope_add(em_tensor *t, const char *op, em_site site);
/* em_scope_begin for a composite op: errors recorded while the scope is open are reported
 * under the outermost such op's name, the inner op's after it ("em_mean: em_sum: axis 2 out of
 * range"), so they name the op the user called. op is a static string, the C function's name
 * (__func__); an "_at" suffix is dropped. rt_scope_op: the outermost such name, or NULL. */
bool rt_scope_begin_op(const char *op, em_site site);
const char *rt_scope_op(void);
/* Views of a tensor as kernel operands. */
prim_buf rt_buf(const em_tensor *t);
prim_meta rt_meta(const em_tensor *t);
static inline char *rt_data(const em_tensor *t) {
  return t->storage->data + t->offset * (int64_t)ir_dtype(t->dtype)->size;
}
static inline void rt_bump_version(em_tensor *t, const char *op, em_site site) {
  __atomic_add_fetch(&t->storage->version, 1, __ATOMIC_RELAXED);
  t->storage->writer = op;
  t->storage->writer_site = site;
}

/* ---- dispatch.c -------------------------------------------------------------------------- */

/* The one entry of every op: checks operands (NULL in -> NULL out, silently), runs the meta
 * function, makes a view or allocates the result and runs the reference kernel. Returns a
 * caller-owned reference (not in any scope) or NULL with a located error naming `name`. This is
 * where tracing (trace.c) and autograd hook in. */
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
/* torch.result_type of two tensors, as the binary ops promote (0-dim operands count less). */
em_dtype rt_result_type(const em_tensor *a, const em_tensor *b);

/* ---- autograd.c: the engine; vjp.c: one vector-Jacobian rule per prim ---------------------- */

/* A node of the backward graph: one recorded prim application. Nodes are reference counted:
 * a result owns its grad_fn, and a node owns the nodes of its inputs (next) and the leaves it
 * accumulates into, so the graph lives exactly as long as some result of it does. */
/* A node whose backward is not one prim's rule: a compiled backward graph (aot_autograd/).
 * backward fills grads[i] for the inputs it has gradients for and may leave others NULL (no
 * gradient); free_saved drops what it saved (backward without retain_graph); destroy frees
 * ctx when the node goes. */
typedef struct rt_custom_ops {
  bool (*backward)(rt_node *n, em_tensor *g, em_tensor **grads);
  void (*free_saved)(void *ctx);
  void (*destroy)(void *ctx);
} rt_custom_ops;

struct rt_node {
  int64_t refcount;
  const rt_custom_ops *custom; /* NULL for prim nodes */
  void *custom_ctx;
  em_prim op;
  prim_attrs attrs;
  const char *name;       /* public op that recorded it, and where: errors in backward name it */
  em_site site;
  int n_in;
  rt_node **next;         /* [n_in] grad_fn of input i (owned), or NULL */
  em_tensor **leaf;       /* [n_in] input i when it is a leaf requiring grad (owned), or NULL */
  em_tensor **saved;      /* [n_in] input i saved for the rule (owned), or NULL */
  int64_t *saved_version; /* [n_in] its version when saved */
  prim_meta *in_meta;     /* [n_in] dtype and shape of input i */
  prim_meta out_meta;
  bool released;          /* saved tensors freed by a backward without retain_graph */
  /* engine scratch, valid during one backward */
  uint64_t epoch;
  int64_t deps;
  em_tensor *acc;
};

bool rt_grad_enabled(void);
/* Called by the dispatcher for every prim application: records a node on out when grad mode is
 * on and some input requires grad. Returns false (error recorded) on allocation failure. */
bool rt_autograd_record(const char *name, em_prim op, em_tensor *const *in, int n_in, const prim_attrs *at,
                        em_tensor *out, em_site site);
/* Checks an in-place write into out from in: refused in grad mode when any of them requires
 * grad (history rewriting is not supported; use the out-of-place op). */
bool rt_autograd_check_inplace(const char *name, em_tensor *out, em_tensor *const *in, int n_in, em_site site);
void rt_node_release(rt_node *n);
/* A custom node over inputs in (edges to those that require grad), producing a result with
 * metadata out_meta. Returns a node with one reference (the caller's), or NULL when out of
 * memory (error recorded; ctx is then the caller's to free). */
rt_node *rt_custom_node(const char *name, const rt_custom_ops *ops, void *ctx, em_tensor *const *in, int n_in,
                        const prim_meta *out_meta, em_site site);
/* Makes n the grad_fn of out (out takes its own reference) and marks out as requiring grad. */
void rt_set_grad_fn(em_tensor *out, rt_node *n);
/* em_grad with allow_unused: grads[i] is NULL (not zeros) for inputs the outputs do not
 * depend on. Grads belong to the current scope. */
bool rt_grad(int n_outputs, em_tensor *const *outputs, em_tensor *const *grad_outputs, int n_inputs,
             em_tensor *const *inputs, em_tensor **grads, bool retain_graph, bool create_graph, bool allow_unused,
             em_site site);
/* vjp.c: whether op's rule reads its saved inputs, and the rule itself: fills grads[i] (owned by
 * the current scope) for every input i with an edge, from the gradient g of the output. */
bool rt_vjp_saves_inputs(em_prim op);
bool rt_vjp(rt_node *n, em_tensor *g, em_tensor **grads);

/* ---- trace.c: the tracer --------------------------------------------------------------------
 *
 * While a trace is active on a thread, rt_dispatch records every prim application as a node of
 * the trace's graph and returns a proxy: a tensor with exact metadata (from the meta function)
 * and no data. Real tensors that reach an op are lifted into graph inputs (once each).
 * Operations that need data (em_item, em_data_ptr, data-dependent shapes, in-place writes,
 * opaque callbacks, em_backward's accumulation into .grad) call rt_break_begin / rt_break_end
 * around their eager work: begin hands the trace to its on_break callback (the frontend runs
 * the graph so far and materializes the live proxies into real tensors), end starts a new
 * graph. With no active trace both are no-ops. */

typedef struct rt_trace rt_trace;
/* Called at a graph break with the reason and the user's site. Must leave every live proxy
 * materialized and the trace ready for a new graph (rt_trace_reset), or return false with an
 * error recorded (fullgraph). */
typedef bool (*rt_break_fn)(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx);

struct rt_trace {
  struct ir_graph *g;
  uint32_t id;
  int suspended;            /* > 0 inside eager work at a break, or while running a graph */
  uint64_t serial_start;    /* tensors with a larger serial were created during the trace */
  em_tensor **proxies;      /* live proxies (weak; NULL holes), in creation order */
  int n_proxies, cap_proxies, live_proxies;
  em_tensor **lifted;       /* real tensors lifted into graph inputs (owned refs), in input order */
  int n_lifted, cap_lifted;
  rt_break_fn on_break;
  void *break_ctx;
  int n_ops;                /* prim applications recorded, all graphs */
  rt_trace *prev;           /* the trace this one interrupted (AOT traces inside a compile) */
  /* functionalization: the current value of each lifted tensor (in-place writes rebind it;
   * the graph's epilogue writes mutated ones back), and the real leaves whose .grad the trace
   * changed (owned refs) */
  int *lifted_value;
  bool *lifted_mutated;
  em_tensor **grad_leaves;
  int n_grad_leaves, cap_grad_leaves;
  bool has_backward;        /* the autograd engine ran under this trace (em_backward, em_grad) */
  uint32_t graph_serial;    /* bumped by rt_trace_reset: views recorded before are stale */
  /* values em_item returned to fn in this trace: a scalar operand equal to one enters later
   * graphs as a 0-dim input, not a constant, so one graph serves every value (torch.compile's
   * unspecialized floats); a ring of the latest */
  double item_values[16];
  int n_item_values;
  int max_nodes;            /* > 0: recording a node past this many fails the op (probe traces
                             * of dynamic shapes stop a size-dependent loop early) */
};

/* Whether t may be used where a tensor is required: false for NULL (an earlier failure, already
 * recorded) and for EM_NONE (recorded here, naming the op and the caller's line). */
bool rt_tensor_arg(const em_tensor *t, const char *name, em_site site);
/* An axis list of x at the public boundary: 0..EM_MAX_DIMS axes, not NULL when any, each in
 * [-ndim, ndim), none repeated. False with an error naming `name`, x and the bad axis. */
bool rt_axes_arg(const em_tensor *x, int n_axes, const int64_t *axes, const char *name, em_site site);
#define RT_ARG(t, name, site)                           \
  do {                                                  \
    if (!rt_tensor_arg((t), (name), (site))) return NULL; \
  } while (0)

/* Eager fusion (issue 23). A hot composite, once its arguments are checked, offers itself to
 * rt_fused: with the hook installed (frontend/eager_fusion.c does, at load time; runtime/ does not
 * call up into frontend/) and no trace active, the hook may run the composite as compiled kernels
 * made from the composite's own decomposition, returning true with *out set (a tensor owned by
 * the current scope). False: run the decomposition op by op (fusion off, tracing, inside a fused
 * call, too small, a compile that failed). args are the composite's non-tensor arguments, in[]
 * its tensor arguments (EM_NONE where absent). */
typedef enum rt_fuse_op {
  RT_FUSE_SOFTMAX,       /* args: axis */
  RT_FUSE_LOG_SOFTMAX,   /* args: axis */
  RT_FUSE_LAYER_NORM,    /* args: n_norm, eps; in: x, weight, bias */
  RT_FUSE_RMS_NORM,      /* args: n_norm, eps; in: x, weight */
  RT_FUSE_GELU,          /* args: tanh_approx */
  RT_FUSE_SILU,          /* no args */
  RT_FUSE_CROSS_ENTROPY, /* args: ignore_index, label_smoothing, reduction; in: logits, target, weight */
  RT_FUSE_RELU,          /* no args */
  RT_FUSE_SIGMOID,       /* no args */
  RT_FUSE_SGD,           /* args: weight_decay, momentum, dampening, nesterov; in: p, grad, buf, lr (an update:
                          * *out is p, written in place) */
  RT_FUSE_ADAMW,         /* args: beta1, beta2, eps, weight_decay, amsgrad; in: p, grad, m, v, vmax, step, lr
                          * (an update, as SGD's) */
  RT_FUSE_MSE_LOSS,      /* args: reduction; in: x, y */
  RT_FUSE_DROPOUT,       /* args: p (training, 0 < p < 1); in: x (draws its mask from the generator) */
  RT_FUSE_MAX_POOL2D,    /* args: kernel, stride, padding, dilation (pairs), ceil_mode, count_include_pad,
                          * divisor_override (em_pool2d_opts in order); in: x */
  RT_FUSE_AVG_POOL2D,    /* args and in: as max_pool2d's */
  RT_FUSE_BATCH_NORM,    /* args: training, momentum, eps; in: x, running_mean, running_var, weight, bias
                          * (training writes the running statistics in place, as op by op) */
  RT_FUSE_COUNT
} rt_fuse_op;
enum { RT_FUSE_MAX_ARGS = 11, RT_FUSE_MAX_IN = 8 };
typedef bool (*rt_fuse_fn)(rt_fuse_op op, const double *args, int n_args, em_tensor *const *in, int n_in,
                           em_tensor **out, em_site site);
extern rt_fuse_fn rt_fuse_hook;
bool rt_fused(rt_fuse_op op, const double *args, int n_args, em_tensor *const *in, int n_in, em_tensor **out,
              em_site site);

/* nn.c: one SGD update of p in place from its gradient g and momentum buffer buf (NULL when
 * momentum is 0; updated in place), lr a 0-dim tensor: the decomposition eager fusion compiles.
 * False with an error recorded. */
bool rt_sgd_update(em_tensor *p, em_tensor *g, em_tensor *buf, em_tensor *lr, double weight_decay, double momentum,
                   double dampening, bool nesterov, em_site site);

/* nn.c: one AdamW update of p, m, v (vmax with amsgrad, else NULL) and the step count t (0-dim),
 * all in place: the decomposition eager fusion compiles. False with an error recorded. */
bool rt_adamw_update(em_tensor *p, em_tensor *g, em_tensor *m, em_tensor *v, em_tensor *vmax, em_tensor *t,
                     em_tensor *lr, const em_adamw_opts *a, em_site site);

/* The active trace of this thread (NULL when none or suspended). */
rt_trace *rt_tracing(void);
/* The trace of this thread even while suspended at a break (NULL when none). */
rt_trace *rt_trace_current(void);
/* Starts and ends a trace on this thread. A trace begun while another is active (AOT autograd
 * tracing the joint graph while the frontend compiles) interrupts it until it ends. begin
 * returns false with an error when memory runs out. end drops the lifted
 * references and detaches the remaining proxies (they stay valid tensors without data: using
 * one in an op afterwards is an error that says it escaped its compiled function). */
bool rt_trace_begin(rt_trace *tr, const char *name, rt_break_fn on_break, void *ctx, em_site site);
void rt_trace_end(rt_trace *tr);
/* Frees the current graph and lifted references and starts an empty graph (after a break). */
bool rt_trace_reset(rt_trace *tr, const char *name);
/* The value a tensor stands for in the active trace: a proxy's value, or -1 for real tensors. */
int rt_trace_value_of(const rt_trace *tr, const em_tensor *t);
/* Drops the traced autograd history of every live proxy (the graph run gives the real tensors
 * theirs), so proxies that only that history kept alive die and do not become outputs. */
void rt_trace_drop_history(rt_trace *tr);
/* Marks graph outputs for every live proxy (deduplicated, in creation order). */
bool rt_trace_output_live(rt_trace *tr);
/* Turns each live proxy whose value is the graph's output k into the real tensor outs[k]
 * (storage, strides, offset, grad_fn, requires_grad), in place, so the user's pointers stay
 * valid. outs are borrowed. */
void rt_trace_materialize(rt_trace *tr, em_tensor *const *outs);
/* Called by tensor.c when a proxy's last reference goes. */
void rt_trace_forget(em_tensor *t);
/* Graph breaks, see above. begin returns -1 (error recorded) when the trace refuses the break
 * (fullgraph), 0 when no trace is active, 1 when the break happened; pass that to end. */
int rt_break_begin(const char *op, const char *reason, em_site site);
void rt_break_end(int token);
/* Suspends / resumes tracing on this thread (the interpreter runs real ops under a trace). */
void rt_trace_suspend(void);
void rt_trace_resume(void);
/* dispatch.c: records one prim application into the active trace and returns its proxy. */
em_tensor *rt_trace_dispatch(rt_trace *tr, const char *name, em_prim op, em_tensor *const *in, int n_in,
                             const prim_attrs *at, em_site site);
/* Lifts a tensor into the trace: its value id (a proxy's own, or for a real tensor its graph
 * input, or the value an in-place write left in it), -1 with an error for a proxy of another
 * trace, or -2 when t aliases the storage of a lifted tensor the trace has written to (the
 * caller breaks the graph, since t's data is not what the graph holds). */
int rt_trace_operand(rt_trace *tr, em_tensor *t, const char *name, em_site site);
/* dispatch.c: functionalization of an in-place write under a trace (see trace.c). Returns 1
 * when recorded, 0 when the write cannot be made functional here (the caller breaks the graph
 * and writes eagerly), -1 on error. */
int rt_trace_inplace(rt_trace *tr, const char *name, em_prim op, em_tensor *const *in, int n_in, const prim_attrs *at,
                     em_tensor *out, em_site site);
/* trace.c: records that in-place result value v now lives in out (and in the bases it views).
 * Returns 1, 0 when that cannot be expressed (the caller breaks), -1 on error. */
int rt_trace_write(rt_trace *tr, em_tensor *out, int v, em_site site);
/* trace.c: a real leaf's .grad is about to change under the trace (engine, zero_grad). */
void rt_trace_note_grad(em_tensor *leaf);
/* tensor.c: a proxy header (caller-owned) with metadata m, viewing base's storage when base is
 * not NULL (view prims), else over a storage without data; registered with tr. */
em_tensor *rt_new_proxy(em_tensor *base, const prim_meta *m, int value, rt_trace *tr, const char *op, em_site site);
bool rt_trace_register(rt_trace *tr, em_tensor *p);
/* Makes a new header over a proxy's storage (em_detach) a proxy of the same value. */
bool rt_trace_adopt(em_tensor *view, const em_tensor *base);
/* The serial number of the newest tensor so far. */
uint64_t rt_serial_now(void);
/* tensor.c: p takes over real's storage, layout and autograd history in place. */
void rt_tensor_become(em_tensor *p, em_tensor *real);

/* Weak references from compiled entries: when a watched tensor's last reference goes, every
 * callback registered for it runs (with the tensor still readable). */
bool rt_watch(em_tensor *t, void (*dead)(void *ctx, const em_tensor *t), void *ctx);
void rt_unwatch_all(void *ctx);
void rt_watch_notify(em_tensor *t);

/* ---- interp.c: the graph interpreter ---------------------------------------------------------- */

/* Counters of one random node in one execution, shared by a forward graph and the backward
 * graph that recomputes it (ir_node.rng_slot indexes a table of these). */
typedef struct rt_rng_slot {
  uint64_t seed, offset;
  bool filled;
} rt_rng_slot;

typedef struct rt_interp_opts {
  bool fresh_rng;      /* random nodes draw new counters (compiled execution), not their attributes */
  rt_rng_slot *slots;  /* with fresh_rng: a node with rng_slot k uses slots[k] when filled, else */
  int n_slots;         /*   draws and fills it, so a backward graph replays the forward's mask */
  bool trace_through;  /* record into the active trace instead of suspending it (AOT) */
} rt_interp_opts;

/* Runs g on inputs (borrowed; types must match g's inputs, binding symbolic sizes) with the
 * eager kernels through rt_dispatch, so autograd records as in eager mode. outputs receive
 * caller-owned references. Returns false with an error naming the node's op and the user's
 * site. opts may be NULL (attributes' counters, tracing suspended). */
bool rt_interpret(const struct ir_graph *g, em_tensor *const *inputs, int n_inputs, em_tensor **outputs,
                  const rt_interp_opts *opts, em_site site);
/* trace.c: a new graph input of type t in the active trace, as a proxy (caller-owned). */
em_tensor *rt_trace_new_input(rt_trace *tr, const struct ir_type *t, em_site site);

/* ---- creation.c -------------------------------------------------------------------------- */

/* Reserves `calls` Philox counters: returns the seed and the first offset to use. */
void rt_rng_reserve(uint64_t calls, uint64_t *seed, uint64_t *offset);

/* ---- autocast.c: mixed precision (em_autocast_begin) ---------------------------------------- */

/* An operand of a lower-precision op (matmul, linear, conv2d) inside an autocast region: cast to
 * the region's dtype when it is f32 or the other half type; x itself otherwise (and outside a
 * region); NULL with an error naming op for a cpu tensor (no cpu kernels compute in f16 / bf16). */
em_tensor *rt_autocast_low(em_tensor *x, const char *op, em_site site);
/* An operand of an f32-list op (softmax, log_softmax, layer_norm, cross_entropy, sum, prod):
 * f16 / bf16 cast to f32 inside a region, else x itself. */
em_tensor *rt_autocast_f32(em_tensor *x, em_site site);
/* The autograd engine's backward runs its rules outside autocast; suspensions nest. */
void rt_autocast_suspend(void);
void rt_autocast_resume(void);

#endif /* EMBER_RT_H */
