/* frontend/eager_fusion.c: eager composites run as kernels compiled from their own
 * decomposition (issue 23).
 *
 * Eager runs a composite (softmax, layer_norm, cross_entropy, gelu, ...) as its decomposition
 * into prims, one pass over memory per prim. Here the hot ones run instead as the inductor's
 * kernels for that same decomposition: each (composite, non-tensor arguments, input dtypes and
 * ranks, which inputs are absent, requires_grad of each, grad mode) gets one lazily made
 * em_compiled whose model function calls the composite; under its trace the composite is its
 * prims (rt_fused declines while tracing), so eager, tracing and autograd keep one definition.
 * em_compile then brings everything it already has: guards, one autograd node whose backward is
 * the compiled (AOT) backward, symbolic sizes (EM_DYNAMIC_ALWAYS: one kernel module serves every
 * size whose schedule has the same shape), the in-memory and on-disk kernel caches, and its
 * tiering (a new size's first EMBER_DYNAMIC_COMPILE_AFTER - 1 calls run the graph op by op on
 * the eager kernels, then it is specialized and compiled).
 *
 * Tiering: a signature's first two calls run op by op (no trace for one-off calls); the third
 * starts the compile on a background thread and runs op by op as well, as every call does until
 * the compile is done. The background thread calls the compiled function on inputs like that
 * call's (shapes, dtypes, requires_grad; made on the compile thread, see compile_job) until its
 * kernels exist: the third call pays no compile and no copy. That relies on what
 * em_compile already promises to threads (independent compiled functions run in parallel): the
 * tracer, scopes, grad mode and errors are per thread, reference counts and the allocator's
 * counters atomic, the LLVM JIT behind its lock, table setup in pthread_once or constructors,
 * and one compiled function's calls serialized by its lock (the caller never calls a compiled
 * function while its background compile runs: the state says COMPILING). What stays global:
 * the fault injector's allocation count (em_debug_fail_alloc) and the live-tensor counters,
 * which see the compile's inputs: em_eager_fusion_wait waits for them. The process's exit waits
 * for the compiles too, before LLVM's static destructors run ("the end of the process" below says how).
 * EMBER_EAGER_FUSION_ASYNC=0 compiles on the calling thread instead, in the third call.
 *
 * Only contiguous CPU inputs whose sizes fit the symbols' range, at least min_numel elements,
 * are offered to the kernel; anything else, or a call that fails inside the compiled path,
 * runs op by op (the failure is logged under EMBER_LOGS=fusion and the signature is never
 * fused again). */
/* _GNU_SOURCE comes with the build's flags (LLVM's): syscall(SYS_gettid), a thread's own nice value */
#include "frontend.h"
#ifdef EMBER_HAVE_LLVM
#include "../inductor/llvm_guard.h"
#endif

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const char *const op_names[RT_FUSE_COUNT] = {
    "softmax", "log_softmax", "layer_norm", "rms_norm", "gelu", "silu", "cross_entropy", "relu", "sigmoid", "sgd",
    "adamw", "mse_loss", "dropout", "max_pool2d", "avg_pool2d", "batch_norm"};

typedef struct fuse_key {
  rt_fuse_op op;
  int n_args, n_in;
  double args[RT_FUSE_MAX_ARGS];
  em_dtype dtype[RT_FUSE_MAX_IN];
  int ndim[RT_FUSE_MAX_IN];
  bool none[RT_FUSE_MAX_IN], requires_grad[RT_FUSE_MAX_IN];
  bool grad_mode;
} fuse_key;

typedef struct fuse_slot {
  fuse_key key;       /* also the compiled function's ctx: its address is stable */
  em_compiled *c;
  int64_t calls;      /* offers of this signature, fused or not */
  int state;          /* COLD, COMPILING (on a background thread), READY, BROKEN (op by op from now on) */
  pthread_t thread;   /* the background compile, joinable while `joinable` */
  int joinable;
} fuse_slot;

enum { COLD, COMPILING, READY, BROKEN };

static struct {
  pthread_mutex_t lock;
  fuse_slot **slots;
  int n, cap;
  int64_t fused_calls, fallbacks, warmup_calls;
} table = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local bool inside; /* this thread is inside a fused call: composites decompose */

static int enabled_override = -1;       /* em_eager_fusion_config; -1: EMBER_EAGER_FUSION */
static int64_t min_numel_override = -1; /* -1: EMBER_EAGER_FUSION_MIN or the default */

/* The smallest input fused. Not the per-call overhead: a replayed em_call costs less than the
 * dispatches it replaces even at 16 elements (measured, mean of softmax, layer_norm and gelu on
 * [r, c] f32: 3.4 us op by op against 1.7 us fused at 16 elements, 13.7 against 5.2 us at 4096,
 * 82 against 24 us at 32768). It is the compile: a signature costs a trace, 6 probe traces and
 * two LLVM modules (tens of ms) that a small tensor, saving microseconds a call, pays back only
 * after thousands of calls; and small tensors are where tests compare eager results exactly. */
enum { DEFAULT_MIN_NUMEL = 4096 };
/* The sizes a symbol may take (dynamic.c's default range): a larger dim would fail the entry's
 * guards on every call. */
enum { MAX_SYMBOLIC_SIZE = 65536 };

static bool fusion_on(void) {
  int e = __atomic_load_n(&enabled_override, __ATOMIC_RELAXED);
  if (e >= 0) return e;
  const char *env = getenv("EMBER_EAGER_FUSION");
  return !(env && !strcmp(env, "0"));
}

static int64_t min_numel(void) {
  int64_t m = __atomic_load_n(&min_numel_override, __ATOMIC_RELAXED);
  if (m >= 0) return m;
  const char *env = getenv("EMBER_EAGER_FUSION_MIN");
  return env && *env ? atoll(env) : DEFAULT_MIN_NUMEL;
}

/* Offers before a signature is handed to em_call: a composite called once (a one-off at
 * start-up) never pays a trace. */
static int fuse_after(void) { return 2; }

/* The composite, called with the arguments the key recorded: what the compiled function traces. */
static em_outputs fused_fn(void *ctx, em_tensor *const *in, int n) {
  const fuse_key *k = ctx;
  const double *a = k->args;
  em_tensor *t[RT_FUSE_MAX_IN];
  for (int i = 0, j = 0; i < k->n_in; i++) t[i] = k->none[i] ? EM_NONE : j < n ? in[j++] : NULL;
  em_site site = EM_HERE;
  switch (k->op) {
  case RT_FUSE_SOFTMAX: return EM_OUTPUTS(em_softmax_at(t[0], (int)a[0], site));
  case RT_FUSE_LOG_SOFTMAX: return EM_OUTPUTS(em_log_softmax_at(t[0], (int)a[0], site));
  case RT_FUSE_LAYER_NORM: return EM_OUTPUTS(em_layer_norm_at(t[0], (int)a[0], t[1], t[2], a[1], site));
  case RT_FUSE_RMS_NORM: return EM_OUTPUTS(em_rms_norm_at(t[0], (int)a[0], t[1], a[1], site));
  case RT_FUSE_GELU: return EM_OUTPUTS(em_gelu_at(t[0], a[0] != 0, site));
  case RT_FUSE_SILU: return EM_OUTPUTS(em_silu_at(t[0], site));
  case RT_FUSE_RELU: return EM_OUTPUTS(em_relu_at(t[0], site));
  case RT_FUSE_SIGMOID: return EM_OUTPUTS(em_sigmoid_at(t[0], site));
  case RT_FUSE_SGD: /* an update: no outputs, the writes into p and buf are the result */
    if (!rt_sgd_update(t[0], t[1], t[2] == EM_NONE ? NULL : t[2], t[3], a[0], a[1], a[2], a[3] != 0, site))
      return EM_OUTPUTS(NULL);
    return (em_outputs){0};
  case RT_FUSE_ADAMW: {
    em_adamw_opts o = {.beta1 = a[0], .beta2 = a[1], .eps = a[2], .weight_decay = a[3], .amsgrad = a[4] != 0};
    if (!rt_adamw_update(t[0], t[1], t[2], t[3], t[4] == EM_NONE ? NULL : t[4], t[5], t[6], &o, site))
      return EM_OUTPUTS(NULL);
    return (em_outputs){0};
  }
  case RT_FUSE_CROSS_ENTROPY: {
    em_cross_entropy_opts o = {(int64_t)a[0], a[1], (em_reduction)a[2], t[2]};
    return EM_OUTPUTS(em_cross_entropy_at(t[0], t[1], o, site));
  }
  case RT_FUSE_MSE_LOSS: return EM_OUTPUTS(em_mse_loss_at(t[0], t[1], (em_reduction)a[0], site));
  /* dropout's mask is a Philox node: the compiled run reserves its counters from the generator as
   * em_rand does (inductor/run.c: reserve_random), and the backward replays them */
  case RT_FUSE_DROPOUT: return EM_OUTPUTS(em_dropout_at(t[0], a[0], true, site));
  case RT_FUSE_MAX_POOL2D:
  case RT_FUSE_AVG_POOL2D: {
    em_pool2d_opts o = {{(int64_t)a[0], (int64_t)a[1]}, {(int64_t)a[2], (int64_t)a[3]}, {(int64_t)a[4], (int64_t)a[5]},
                        {(int64_t)a[6], (int64_t)a[7]}, a[8] != 0, a[9] != 0, (int64_t)a[10]};
    if (k->op == RT_FUSE_MAX_POOL2D) return EM_OUTPUTS(em_max_pool2d_ex_at(t[0], o, site));
    return EM_OUTPUTS(em_avg_pool2d_ex_at(t[0], o, site));
  }
  /* training: the running statistics' in-place update is a write-back of the compiled function */
  case RT_FUSE_BATCH_NORM:
    return EM_OUTPUTS(em_batch_norm_at(t[0], t[1], t[2], t[3], t[4], a[0] != 0, a[1], a[2], site));
  case RT_FUSE_COUNT: break;
  }
  return (em_outputs){0};
}

/* Index targets out of range must fail with the eager gather's message, so they run op by op
 * (one pass over the targets, N against the logits' N x C). */
static bool targets_in_range(em_tensor *logits, em_tensor *target, int64_t ignore) {
  if (ir_is_float(target->dtype)) return true;
  int64_t c = logits->sizes[1];
  const char *p = rt_data(target);
  for (int64_t i = 0; i < target->numel; i++) {
    int64_t v = target->dtype == EM_I64   ? ((const int64_t *)p)[i]
                : target->dtype == EM_I32 ? ((const int32_t *)p)[i]
                                          : -1;
    if (v != ignore && (v < 0 || v >= c)) return false;
  }
  return true;
}

enum { MAX_POOL_ARG = 1 << 30 };

/* Training batch_norm writes running_mean and running_var (in[1], in[2]) in place: the compiled
 * function writes them back once after its run, which is the op-by-op result only when they
 * share no storage with each other or with an input the graph reads, and they are buffers (no
 * grad; a leaf requiring grad written under no-grad would be an input mutation the joint graph
 * has to differentiate around). */
static bool running_stats_private(em_tensor *const *in) {
  for (int i = 1; i < 3; i++) {
    if (in[i] == EM_NONE) continue;
    if (in[i]->requires_grad) return false;
    for (int j = 0; j < 5; j++)
      if (j != i && in[j] != EM_NONE && in[j]->storage == in[i]->storage) return false;
  }
  return true;
}

/* Whether these inputs may go to the kernel, filling the key. */
static bool signature(rt_fuse_op op, const double *args, int n_args, em_tensor *const *in, int n_in, fuse_key *k) {
  if ((unsigned)op >= RT_FUSE_COUNT || n_args > RT_FUSE_MAX_ARGS || n_in > RT_FUSE_MAX_IN || n_in < 1) return false;
  memset(k, 0, sizeof *k); /* keys are compared with memcmp */
  k->op = op, k->n_args = n_args, k->n_in = n_in;
  for (int i = 0; i < n_args; i++) k->args[i] = args[i];
  k->grad_mode = em_is_grad_enabled();
  /* floating inputs only (relu takes integers too, which stay op by op) */
  if (!in[0] || in[0] == EM_NONE || !ir_is_float(in[0]->dtype) || in[0]->numel < min_numel()) return false;
  for (int i = 0; i < n_in; i++) {
    em_tensor *t = in[i];
    if (!t) return false;
    if ((k->none[i] = t == EM_NONE)) continue;
    if (t->proxy || t->storage->device != EM_CPU || !em_is_contiguous(t)) return false;
    for (int d = 0; d < t->ndim; d++)
      if (t->sizes[d] > MAX_SYMBOLIC_SIZE) return false;
    k->dtype[i] = t->dtype, k->ndim[i] = t->ndim, k->requires_grad[i] = t->requires_grad;
  }
  if (op == RT_FUSE_CROSS_ENTROPY && !targets_in_range(in[0], in[1], (int64_t)args[0])) return false;
  /* mse_loss broadcasts inside (em_sub): a mismatch must fail with the op-by-op message */
  if (op == RT_FUSE_MSE_LOSS &&
      (in[0]->ndim != in[1]->ndim || memcmp(in[0]->sizes, in[1]->sizes, sizeof(int64_t) * (size_t)in[0]->ndim)))
    return false;
  /* pooling's window sizes go through the key as doubles: exact below 2^53, and a window that
   * large (a stride past any input) is rare enough to run op by op */
  if (op == RT_FUSE_MAX_POOL2D || op == RT_FUSE_AVG_POOL2D)
    for (int i = 0; i < n_args; i++)
      if (!(args[i] >= -MAX_POOL_ARG && args[i] <= MAX_POOL_ARG)) return false;
  if (op == RT_FUSE_BATCH_NORM && args[0] != 0 && !running_stats_private(in)) return false;
  return true;
}

/* The slot of k, made on first use; NULL when out of memory. */
static fuse_slot *slot_for(const fuse_key *k, em_site site) {
  fuse_slot *s = NULL;
  pthread_mutex_lock(&table.lock);
  for (int i = 0; i < table.n && !s; i++)
    if (!memcmp(&table.slots[i]->key, k, sizeof *k)) s = table.slots[i];
  if (!s && table.n == table.cap) {
    fuse_slot **grown = realloc(table.slots, sizeof *table.slots * (size_t)(table.cap * 2 + 8));
    if (grown) table.slots = grown, table.cap = table.cap * 2 + 8;
  }
  if (!s && table.n < table.cap && (s = calloc(1, sizeof *s))) {
    s->key = *k;
    char name[32];
    snprintf(name, sizeof name, "eager_%s", op_names[k->op]);
    /* no replay validation: fn reads nothing but its inputs and the key; many entries, as each
     * new pattern of equal sizes (duck sizing) makes one */
    /* the recompute partitioner: the backward reads only the composite's inputs, so double
     * backward (create_graph) through a fused call is exact, as through the op-by-op one */
    em_compile_options o = {.name = name, .check_every = -1, .recompile_limit = 64, .dynamic = EM_DYNAMIC_ALWAYS,
                            .partitioner = "recompute"};
    if (!(s->c = em_compile_at(fused_fn, &o, site))) free(s), s = NULL;
    else table.slots[table.n++] = s;
  }
  if (s) s->calls++;
  pthread_mutex_unlock(&table.lock);
  return s;
}

static bool is_update(rt_fuse_op op) { return op == RT_FUSE_SGD || op == RT_FUSE_ADAMW; }

/* A composite that draws from the generator (dropout's mask): a call reserves its Philox counters
 * from the global generator, so a background compile, whose calls draw too, would move the
 * generator past where op by op leaves it, and every later random number would change. These
 * compile on the calling thread, whose compile call is the call itself (one draw). */
static bool draws_random(rt_fuse_op op) { return op == RT_FUSE_DROPOUT; }

/* Whether a signature compiles on a background thread (the default) or, with
 * EMBER_EAGER_FUSION_ASYNC=0, on the calling thread in the call after its warm-up. */
static bool async_compile(void) {
  const char *env = getenv("EMBER_EAGER_FUSION_ASYNC");
  return !(env && !strcmp(env, "0"));
}

/* ---- the end of the process ----
 *
 * A compile thread runs LLVM, and exit() destroys LLVM's C++ statics: a compile still running
 * then crashes in them (bench/peers_ember died, status nonzero, nothing on stderr, under a
 * loaded test suite; tests/exit_probe reproduced it, 1 to 2 runs in 20 segfaulting in LLVM's
 * SelectionDAG type tables). So exit waits for the compiles before any LLVM destructor runs.
 * The difficulty is "before": exit() runs the atexit handlers newest first, then the ELF
 * destructors (this file's `finish`, too late: the first version waited there), and LLVM
 * registers some destructors lazily, at the first use of a function-local static, which may
 * be inside the very compile being waited for (measured: SDNode::getValueTypeList's type
 * tables, isPassInPrintList's, TargetLibraryInfo's, two in X86 passes, in a process's first
 * codegen; which ones depends on the kernel, so no warm-up can make them all in advance).
 * An atexit handler registered before such a compile runs after its destructors.
 *
 * What runs before every static destructor, however late it was registered, is the exiting
 * thread's thread_local destructors: C++ destroys them first ([basic.start.term]p1; glibc's
 * exit() calls __call_tls_dtors before the atexit handlers). So each thread that offers a
 * fusable call, and the thread that loads Ember (the main thread, whose return from main is
 * the usual exit), carries a thread-end hook (ind_llvm_at_thread_end) that waits for the
 * compiles running: when that thread exits the process, nothing of LLVM has been destroyed
 * yet. When it merely ends, the wait costs it at most the compiles then running. A thread
 * that never offered a fusable call and calls exit() while a compile runs (a watchdog, say)
 * is covered by an atexit handler registered anew on the calling thread just before each
 * compile thread starts, and again by that thread after each of its calls: newer than every
 * LLVM destructor registered before, older only than one the compile registers in the call it
 * is running (a window this cannot close: such an exit can still crash); it stops new compiles
 * (`exiting`: calls stay op by op, none compiles on the calling thread during exit) and waits
 * for the running ones, which stop at their next call. quick_exit and _exit run no
 * destructors: nothing to wait for. Another thread inside a fused call while the process
 * exits runs kernels already made (its signature READY) or op by op; it compiles only a new
 * size of a ready signature (em_call's dynamic tiers), as any em_compile caller racing exit.
 * A fork waits for the compile threads (see `gate`). */
static bool exiting;
static _Thread_local bool compile_thread; /* this thread runs a background compile */

/* Fork. A compile thread works inside LLVM, whose global state (pass registry, lazily made
 * statics) a fork's child inherits as it stood: half updated when the fork fell in the middle
 * of a compile, and the child's exit then ran LLVM's static destructors over it ("free():
 * invalid pointer", 1 run in 32 of tests/exit_probe's fork mode). So a fork waits until no
 * compile thread runs, and no compile thread starts while a fork is under way, as glibc holds
 * malloc's locks across a fork: `gate.running` counts the compile threads. A fork while one
 * runs takes as long as the rest of that compile (tens of ms). Not covered: a thread compiling
 * on its own (EMBER_EAGER_FUSION_ASYNC=0, dropout, em_compile) while another forks, the hazard
 * of any library a thread is inside when another forks. */
static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int running;  /* compile threads started and not yet ended */
  bool forking; /* a fork is under way: no compile thread starts */
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false};

static void gate_enter(void) {
  pthread_mutex_lock(&gate.mu);
  while (gate.forking) pthread_cond_wait(&gate.cv, &gate.mu);
  gate.running++;
  pthread_mutex_unlock(&gate.mu);
}
static void gate_leave(void) {
  pthread_mutex_lock(&gate.mu);
  gate.running--;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
}

static void at_exit(void) {
  __atomic_store_n(&exiting, true, __ATOMIC_RELEASE);
  em_eager_fusion_wait();
}

static void at_thread_end(void) { em_eager_fusion_wait(); }

/* Gives the calling thread its thread-end hook, once. */
static void hook_thread(void) {
#ifdef EMBER_HAVE_LLVM
  static _Thread_local bool hooked;
  if (!hooked && !compile_thread) hooked = true, ind_llvm_at_thread_end(at_thread_end);
#endif
}

/* A background compile: the compiled function called on inputs of the call's shapes, dtypes and
 * requires_grad, made on the compile thread (ones, zeros for integer tensors: class 0 is a valid
 * target), until its kernels exist. Not copies of the call's inputs: what em_compile traces,
 * guards and compiles depends on those properties, not on the values (a composite reads none
 * with em_item: an update's step count and lr are tensors in its graph), and a copy cost the
 * call that started the compile one more pass over its inputs, a third of an op-by-op softmax.
 * The caller's tensors are not touched: it may write or free them meanwhile, and an update
 * writes only these. */
typedef struct compile_input {
  em_dtype dtype;
  int ndim;
  int64_t sizes[EM_MAX_DIMS];
  bool requires_grad;
} compile_input;

typedef struct compile_job {
  fuse_slot *s;
  compile_input like[RT_FUSE_MAX_IN];
  int n;
  em_site site;
} compile_job;

/* The job's inputs into in (owned), under the caller's scope; false when out of memory. */
static bool make_inputs(const compile_job *j, em_tensor **in) {
  bool ok = true;
  em_no_grad_begin(); /* leaves: no autograd graph behind them */
  for (int i = 0; i < j->n; i++) {
    const compile_input *c = &j->like[i];
    in[i] = !ok ? NULL
            : ir_is_float(c->dtype) ? em_retain(em_ones_at(c->dtype, c->ndim, c->sizes, j->site))
                                    : em_retain(em_zeros_at(c->dtype, c->ndim, c->sizes, j->site));
    ok = in[i] && (!c->requires_grad || em_requires_grad__at(in[i], true, j->site));
  }
  em_no_grad_end();
  return ok;
}

static void *compile_job_run(void *arg) {
  compile_job *j = arg;
  fuse_slot *s = j->s;
  compile_thread = true;
  /* below the caller's threads: on a busy machine the compile yields to the op-by-op calls */
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10)) { /* best effort */
  }
  em_set_default_device(EM_CPU); /* fused inputs are CPU tensors */
  /* its calls (op by op at first, then the kernels) run their loops on this thread alone: one
   * holding the pool made the caller's op-by-op loops meanwhile serial (the pool never queues),
   * the call that started the compile 2-3x its op-by-op time on 2 cores */
  prim_serial_thread();
  em_tensor *in[RT_FUSE_MAX_IN] = {0};
  bool update = is_update(s->key.op), scoped = em_scope_begin_at(j->site), made = scoped && make_inputs(j, in);
  bool ok = made;
  if (!s->key.grad_mode) em_no_grad_begin(); /* grad mode is per thread: the signature's */
  /* a size's first calls run op by op, the EMBER_DYNAMIC_COMPILE_AFTER-th (3) compiles: one
   * more call than that leaves nothing to compile for the caller at this size */
  bool stopped = false; /* by the process's exit: the signature runs op by op */
  for (int i = 0; ok && i < 4 && !(stopped = __atomic_load_n(&exiting, __ATOMIC_ACQUIRE)); i++) {
    em_scope_begin_at(j->site);
    em_outputs r = em_call_at(s->c, &s->key, in, j->n, j->site);
    ok = update ? r.n == 0 && !em_last_error() : r.n == 1 && r.t[0];
    em_scope_end_at(j->site);
    /* newer than the LLVM destructors this call registered, if any (best effort: see above) */
    if (atexit(at_exit)) { /* out of memory: the handler registered before the thread stays */
    }
  }
  if (!s->key.grad_mode) em_no_grad_end();
  if (scoped) em_scope_end_at(j->site);
  if (!ok && made && !stopped) {
    fe_log(FE_LOG_FUSION, "em_%s at %s:%d: the background compile failed (%s); running op by op from now on",
           op_names[s->key.op], j->site.file, j->site.line, em_last_error() ? em_last_error() : "no message");
    __atomic_add_fetch(&table.fallbacks, 1, __ATOMIC_RELAXED);
  }
  em_clear_error();
  for (int i = 0; i < j->n; i++) em_release(in[i]);
  em_thread_cleanup();
  /* out of memory for the inputs: a later call tries again */
  __atomic_store_n(&s->state, ok && !stopped ? READY : !made && !stopped ? COLD : BROKEN, __ATOMIC_RELEASE);
  free(j);
  gate_leave(); /* the last thing: nothing of LLVM runs on this thread after it */
  return NULL;
}

enum { STARTED, REFUSED, SYNC }; /* start_compile: a thread runs it; none (exiting); compile on this call */

/* Starts s's background compile for inputs like in. SYNC when it cannot (then the caller
 * compiles), REFUSED when the process is exiting (the caller runs op by op). */
static int start_compile(fuse_slot *s, em_tensor *const *in, int n, em_site site) {
  if (__atomic_load_n(&exiting, __ATOMIC_ACQUIRE)) return REFUSED;
  if (!async_compile() || draws_random(s->key.op)) return SYNC;
  hook_thread();
  compile_job *j = calloc(1, sizeof *j);
  /* the atexit handler, registered anew: newer than LLVM's destructors registered so far (see
   * "the end of the process") */
  if (!j || atexit(at_exit)) return free(j), SYNC;
  j->s = s, j->n = n, j->site = site;
  for (int i = 0; i < n; i++) {
    compile_input *c = &j->like[i];
    c->dtype = in[i]->dtype, c->ndim = in[i]->ndim, c->requires_grad = in[i]->requires_grad;
    memcpy(c->sizes, in[i]->sizes, sizeof(int64_t) * (size_t)in[i]->ndim);
  }
  gate_enter();
  if (pthread_create(&s->thread, NULL, compile_job_run, j)) return gate_leave(), free(j), SYNC;
  __atomic_store_n(&s->joinable, 1, __ATOMIC_RELEASE);
  return STARTED;
}

static bool fuse(rt_fuse_op op, const double *args, int n_args, em_tensor *const *in, int n_in, em_tensor **out,
                 em_site site) {
  fuse_key k;
  if (inside || !fusion_on() || !signature(op, args, n_args, in, n_in, &k)) return false;
  hook_thread();
  fuse_slot *s = slot_for(&k, site);
  if (!s) return false;
  int state = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
  if (state == BROKEN) return false;
  em_tensor *ins[RT_FUSE_MAX_IN];
  int n = 0;
  for (int i = 0; i < n_in; i++)
    if (in[i] != EM_NONE) ins[n++] = in[i];
  bool had_error = em_last_error() != NULL, update = is_update(op);
  if (update && had_error) return false; /* an update's failure shows only as a new error */
  if (state != READY) {
    int cold = COLD, how = REFUSED; /* STARTED: this call started the background compile, runs op by op */
    if (s->calls > fuse_after() && state == COLD &&
        __atomic_compare_exchange_n(&s->state, &cold, COMPILING, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
        (how = start_compile(s, ins, n, site)) != STARTED)
      __atomic_store_n(&s->state, how == SYNC ? READY : COLD, __ATOMIC_RELEASE); /* SYNC: compile on this call */
    if (how == STARTED || __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != READY) {
      __atomic_add_fetch(&table.warmup_calls, 1, __ATOMIC_RELAXED);
      return false;
    }
  }
  uint64_t seed, offset;
  em_rng_get_state(&seed, &offset);
  inside = true;
  em_outputs r = em_call_at(s->c, &s->key, ins, n, site);
  inside = false;
  if (update ? r.n == 0 && !em_last_error() : r.n == 1 && r.t[0]) {
    __atomic_add_fetch(&table.fused_calls, 1, __ATOMIC_RELAXED);
    *out = update ? in[0] : r.t[0];
    return true;
  }
  /* out of memory is the call's failure, as it would be op by op (and may pass): report it */
  if (!had_error && em_last_error() && strstr(em_last_error(), "out of memory")) {
    *out = NULL;
    return true;
  }
  /* else the compiled path failed (the arguments were checked, so it is the compiler's failure):
   * run op by op, now and from now on, and keep the user's error state as it was */
  fe_log(FE_LOG_FUSION, "em_%s at %s:%d: the fused kernel failed (%s); running op by op from now on", op_names[op],
         site.file, site.line, em_last_error() ? em_last_error() : "no message");
  if (!had_error) em_clear_error();
  /* the op-by-op run draws the mask again: from where this call found the generator */
  if (draws_random(op)) em_rng_set_state(seed, offset);
  __atomic_store_n(&s->state, BROKEN, __ATOMIC_RELEASE);
  __atomic_add_fetch(&table.fallbacks, 1, __ATOMIC_RELAXED);
  return false;
}

void em_eager_fusion_wait(void) {
  if (compile_thread) return; /* a compile thread ending (its thread-end hook) waits for no one */
  for (int i = 0;; i++) {
    pthread_mutex_lock(&table.lock);
    fuse_slot *s = i < table.n ? table.slots[i] : NULL;
    pthread_mutex_unlock(&table.lock);
    if (!s) return;
    if (__atomic_exchange_n(&s->joinable, 0, __ATOMIC_ACQ_REL)) pthread_join(s->thread, NULL);
    while (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == COMPILING) /* another thread joins it */
      nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
}

/* The hook is defined here, initialized, not set by a constructor: the runtime's composites
 * reference it, so a static link (libember.a) always takes this file; an object nothing
 * referenced was dropped with its constructor, and programs linked statically (bench/peers_ember,
 * bench/compiled) ran every composite op by op. */
rt_fuse_fn rt_fuse_hook = fuse;

/* A fork waits for the running compile threads and holds off new ones (see `gate`), and holds
 * the table's lock so that the child finds the table whole. A compile thread ends after it
 * marks its slot, so none is COMPILING then but one whose thread was not created yet (its
 * caller between the slot's mark and gate_enter): in the child, whose thread that would never
 * be, such a signature runs op by op. */
static void fork_prepare(void) {
  pthread_mutex_lock(&gate.mu);
  gate.forking = true;
  while (gate.running) pthread_cond_wait(&gate.cv, &gate.mu);
  pthread_mutex_lock(&table.lock);
}
static void fork_parent(void) {
  pthread_mutex_unlock(&table.lock);
  gate.forking = false;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
}
static void fork_child(void) {
  for (int i = 0; i < table.n; i++) {
    fuse_slot *s = table.slots[i];
    s->joinable = 0;
    if (s->state == COMPILING) s->state = BROKEN;
  }
  pthread_mutex_unlock(&table.lock);
  gate.forking = false, gate.running = 0;
  pthread_mutex_unlock(&gate.mu);
}

/* The thread that loads Ember (the main thread) gets its thread-end hook now: returning from
 * main is how most programs exit. Threads that offer fusable calls get theirs then. */
__attribute__((constructor)) static void start(void) {
  hook_thread();
  if (pthread_atfork(fork_prepare, fork_parent, fork_child)) { /* out of memory: children may wait */
  }
}
/* The last resort (dlclose of the shared library; an atexit handler ran already at exit). */
__attribute__((destructor)) static void finish(void) { em_eager_fusion_wait(); }

void em_eager_fusion_config(int enabled, int64_t min_numel_) {
  __atomic_store_n(&enabled_override, enabled < 0 ? -1 : enabled != 0, __ATOMIC_RELAXED);
  __atomic_store_n(&min_numel_override, min_numel_ < 0 ? -1 : min_numel_, __ATOMIC_RELAXED);
}

em_eager_fusion_stats em_eager_fusion_info(void) {
  em_eager_fusion_stats st = {0};
  pthread_mutex_lock(&table.lock);
  st.fused_calls = table.fused_calls, st.fallbacks = table.fallbacks, st.warmup_calls = table.warmup_calls;
  st.functions = table.n;
  for (int i = 0; i < table.n; i++) {
    em_compile_stats c = em_compiled_stats(table.slots[i]->c);
    st.graphs_compiled += c.graphs_compiled;
    st.kernel_runs += c.kernel_runs;
    st.traces += c.traces + c.probe_traces;
    st.op_by_op_graphs += c.dynamic_op_by_op;
  }
  st.enabled = fusion_on();
  st.min_numel = min_numel();
  pthread_mutex_unlock(&table.lock);
  return st;
}
