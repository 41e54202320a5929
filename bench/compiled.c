/* bench/compiled.c: em_compile's default backend (inductor) against Ember eager on the
 * workloads of issue 6:
 *   - training steps (forward, backward, SGD with momentum 0.9; the whole step compiled as one
 *     function) of the Fashion-MNIST MLP (784-512-512-10) and LeNet-5 at batch 128, and of a
 *     decoder-only transformer (2 layers, d_model 256, 4 heads, context 128, batch 16, byte
 *     vocabulary);
 *   - softmax and layer_norm over [4096, 1024] rows, against memcpy of the same bytes;
 *   - dropout: three residual blocks x + dropout(relu(h), 0.1) over [4096, 1024] (issue 20: the
 *     uniforms computed inside the kernel), against memcpy of x and the result.
 * Figures per workload: ms per step eager and compiled (medians of alternated runs in one
 * process) and their ratio, generated kernels run per step, cold compile ms (first call:
 * trace, AOT, lowering, LLVM, JIT, and that first run; also less a compiled step's time), warm
 * compile ms (the same in a new process, kernels loaded from the disk cache this run wrote),
 * peak bytes of live tensor storage during a step, compiled and eager.
 * --json: one JSON object per figure. --only NAME runs one workload (for profiling).
 * softmax and layer_norm also report memcpy of the same bytes, alternated with their runs.
 * --device cuda: everything on the GPU (each timed call ends with em_cuda_synchronize; the
 * copy baseline is a device-to-device clone of the same bytes; peaks are the device allocator's).
 * --mode M: em_compile's mode (default, reduce-overhead, max-autotune). On the host emulator
 * (no GPU) the figures time the emulator, not a GPU: the output says so. */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#define MODELS_FULL_SIZE
#include "bench.h"
#include "models.h"

enum { REPS = 15 };

static const char *only, *self, *mode;
static bool cuda; /* --device cuda */
static bool probe; /* --warm-probe: only time the first compiled call (a child run, disk cache warm) */

static void fail(const char *what) {
  fprintf(stderr, "bench compiled: %s: %s\n", what, em_last_error() ? em_last_error() : "?");
  exit(1);
}

/* On the device: a clone of x (bytes read and written once); returns ms. */
static double device_copy_ms(em_tensor *x) {
  em_scope_begin();
  double t0 = bench_now();
  if (!em_clone(x) || !em_cuda_synchronize()) fail("device copy");
  double dt = bench_now() - t0;
  em_scope_end();
  return 1e3 * dt;
}

/* One memcpy of `bytes` between buffers kept for the process; returns ms. */
static double memcpy_ms(size_t bytes) {
  static char *a, *b;
  static size_t have;
  if (bytes > have) {
    free(a), free(b);
    a = malloc(bytes), b = malloc(bytes);
    if (!a || !b) fail("malloc");
    memset(a, 1, bytes), memset(b, 2, bytes);
    have = bytes;
  }
  double t0 = bench_now();
  memcpy(b, a, bytes);
  double dt = bench_now() - t0;
  a[0] = b[bytes - 1];
  return 1e3 * dt;
}

/* One call, eager (c NULL) or compiled; returns ms. */
static double once(em_compiled *c, em_model_fn fn, void *ctx, em_tensor *const *in, int n) {
  em_scope_begin();
  double t0 = bench_now();
  em_tensor *r = c ? em_call_n(c, ctx, n, in).t[0] : fn(ctx, in, n).t[0];
  if (!r) fail("step");
  if (cuda && !em_cuda_synchronize()) fail("synchronize");
  double dt = bench_now() - t0;
  em_scope_end();
  return 1e3 * dt;
}

static em_compiled *compile(em_model_fn fn, const char *name) {
  em_compiled *c = em_compile(fn, &(em_compile_options){.backend = "inductor", .name = name, .mode = mode});
  if (!c) fail("em_compile");
  return c;
}

/* The first call of a fresh em_compiled in a new process that finds the kernels in the disk
 * cache this process filled: ms, or -1. */
static double warm_in_child(const char *name) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' --only %s --warm-probe%s%s%s", self, name, cuda ? " --device cuda" : "", mode ? " --mode " : "",
           mode ? mode : "");
  FILE *f = popen(cmd, "r");
  double ms = -1;
  if (f) {
    if (fscanf(f, "warm %lf", &ms) != 1) ms = -1;
    pclose(f);
  }
  return ms;
}

/* Eager against compiled on fn(ctx, in), with the figures listed above. */
static void run(const char *name, em_model_fn fn, void *ctx, em_tensor *const *in, int n, double bytes_moved) {
  if (only && strcmp(only, name)) return;
  char key[96];
  once(NULL, fn, ctx, in, n); /* optimizer state exists, as in every step but the first */
  em_compiled *c = compile(fn, name);
  double cold = once(c, fn, ctx, in, n);
  if (probe) {
    printf("warm %.6f\n", cold);
    em_compiled_free(c);
    return;
  }
  double warm = warm_in_child(name);
  double t[3][REPS];
  int64_t k0 = em_compiled_stats(c).kernel_runs, g0 = em_compiled_stats(c).cuda_graph_replays;
  for (int r = -1; r < REPS; r++)
    for (int k = 0; k < 3; k++) {
      if (k == 2 && bytes_moved <= 0) continue;
      double ms = k == 2 ? (cuda ? device_copy_ms(in[0]) : memcpy_ms((size_t)(bytes_moved / 2))) : once(k ? c : NULL, fn, ctx, in, n);
      if (r >= 0) t[k][r] = ms;
    }
  int64_t kernels = (em_compiled_stats(c).kernel_runs - k0) / (REPS + 1);
  int64_t graphs = (em_compiled_stats(c).cuda_graph_replays - g0) / (REPS + 1);
  int64_t peak[2];
  for (int k = 0; k < 2; k++) { /* compiled, then eager */
    em_debug_reset_peak();
    if (cuda) em_cuda_reset_peak_memory_stats();
    int64_t base = cuda ? em_cuda_memory_stats_get().allocated_bytes : em_debug_live_bytes();
    once(k ? NULL : c, fn, ctx, in, n);
    peak[k] = (cuda ? em_cuda_memory_stats_get().peak_allocated_bytes : em_debug_peak_bytes()) - base;
  }
  int64_t peak_c = peak[0], peak_e = peak[1];
  double e = bench_median(t[0], REPS), ms = bench_median(t[1], REPS);
  snprintf(key, sizeof key, "%s_eager_ms", name);
  bench_report(key, e, "ms", "per step");
  snprintf(key, sizeof key, "%s_compiled_ms", name);
  bench_report(key, ms, "ms", "per step, em_compile default backend");
  snprintf(key, sizeof key, "%s_speedup", name);
  bench_report(key, e / ms, "x", "eager ms / compiled ms");
  if (bytes_moved > 0) {
    double mc = bench_median(t[2], REPS);
    snprintf(key, sizeof key, "%s_memcpy_GBps", name);
    bench_report(key, bytes_moved / (mc * 1e6), "GB/s",
                 cuda ? "device clone of the input (read + write), alternated with the runs"
                      : "memcpy of the same bytes (read + write), alternated with the runs");
    snprintf(key, sizeof key, "%s_compiled_GBps", name);
    bench_report(key, bytes_moved / (ms * 1e6), "GB/s", "bytes read + written once / compiled time");
    snprintf(key, sizeof key, "%s_of_memcpy", name);
    bench_report(key, mc / ms, "x", "compiled bandwidth / memcpy bandwidth");
  }
  snprintf(key, sizeof key, "%s_kernels_per_step", name);
  bench_report(key, (double)kernels, "", "generated kernels launched one by one (not inside CUDA graphs)");
  if (cuda) {
    snprintf(key, sizeof key, "%s_cuda_graphs_per_step", name);
    bench_report(key, (double)graphs, "", "CUDA graph launches inside em_call (--mode reduce-overhead / max-autotune)");
  }
  snprintf(key, sizeof key, "%s_cold_first_call_ms", name);
  bench_report(key, cold, "ms", "first call, empty caches: trace, lowering, LLVM, and one run");
  snprintf(key, sizeof key, "%s_cold_compile_ms", name);
  bench_report(key, cold - ms, "ms", "first call minus a compiled step");
  snprintf(key, sizeof key, "%s_warm_first_call_ms", name);
  bench_report(key, warm, "ms", "first call in a new process, kernels from the disk cache");
  snprintf(key, sizeof key, "%s_warm_compile_ms", name);
  bench_report(key, warm - ms, "ms", "the same minus a compiled step");
  snprintf(key, sizeof key, "%s_peak_bytes_compiled", name);
  bench_report(key, (double)peak_c, "bytes", "peak live tensor storage during a step, beyond what was live before");
  snprintf(key, sizeof key, "%s_peak_bytes_eager", name);
  bench_report(key, (double)peak_e, "bytes", NULL);
  em_compiled_free(c);
}

static void train(const char *name, em_model_fn loss_fn, net *m, em_tensor *x, em_tensor *y) {
  if (only && strcmp(only, name)) return;
  model_step_ctx s = {loss_fn, m, em_sgd_new(m->n_params, m->params, ((em_sgd_opts){0.01, 0.9, 0, 0, false}))};
  if (!s.opt) fail("optimizer");
  run(name, model_train_step, &s, (em_tensor *[]){x, y}, 2, 0);
  em_optimizer_free(s.opt);
}

static em_outputs softmax_fn(void *ctx, em_tensor *const *in, int n) { return EM_OUTPUTS(em_softmax(in[0], 1)); }
static em_outputs layer_norm_fn(void *ctx, em_tensor *const *in, int n) {
  em_tensor **wb = ctx;
  return EM_OUTPUTS(em_layer_norm(in[0], 1, wb[0], wb[1], 1e-5));
}
static em_outputs transformer_loss(void *ctx, em_tensor *const *in, int n) { return transformer_fn(ctx, in, n); }
/* Three residual blocks of dropout(relu(h), 0.1) (issue 20): uniform, mask and scale each time. */
static em_outputs dropout_fn(void *ctx, em_tensor *const *in, int n) {
  em_tensor *h = in[0];
  for (int i = 0; i < 3; i++) h = em_add(in[0], em_dropout(em_relu(h), 0.1, true));
  return EM_OUTPUTS(h);
}

int main(int argc, char **argv) {
  bench_init("compiled", argc, argv);
  self = argv[0];
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[i + 1];
    if (!strcmp(argv[i], "--warm-probe")) probe = true;
    if (!strcmp(argv[i], "--mode") && i + 1 < argc) mode = argv[i + 1];
    if (!strcmp(argv[i], "--device") && i + 1 < argc) cuda = !strcmp(argv[i + 1], "cuda");
  }
  if (cuda) {
    if (!em_cuda_is_available()) fail("--device cuda: no CUDA device (EMBER_CUDA_EMULATE=1 runs the host emulator)");
    em_cuda_device_properties pr;
    if (em_cuda_get_device_properties(0, &pr) && !probe) fprintf(stderr, "bench compiled: device %s%s\n", pr.name, strstr(pr.name, "emulator") ? " (these figures time the host emulator, not a GPU)" : "");
    em_set_default_device(EM_CUDA); /* the models' parameters, the inputs, everything */
  }
  if (probe) bench_json = false;
  else /* what the figures were measured with (issue 20): the JIT's and oneDNN's ceiling, and the C code's target */
    fprintf(bench_json ? stderr : stdout, "bench compiled: CPU ISA %s (EMBER_CPU_ISA; eager C code: %s)\n",
            em_cpu_isa(),
#ifdef EMBER_CPU_ISA_DEFAULT
            "x86-64-v3, -Dcpu_isa=avx2"
#else
            "-march=native unless -Dnative=false"
#endif
    );
  /* cold compiles start from an empty disk cache, which this run fills for the warm probes */
  char dir[] = "/tmp/ember-bench-cacheXXXXXX";
  bool own_dir = !probe && mkdtemp(dir);
  if (own_dir) setenv("EMBER_CACHE_DIR", dir, 1);
  em_scope_begin();
  em_manual_seed(0);
  {
    net m = {0};
    models_mlp(&m, 784, 512, 512, 10);
    train("mlp", mlp_fn, &m, em_rand(EM_F32, EM_SHAPE(128, 784)), em_randint(0, 10, EM_SHAPE(128)));
  }
  {
    net m = {0};
    if (!models_lenet(&m)) fail("lenet");
    train("lenet", lenet_fn, &m, em_rand(EM_F32, EM_SHAPE(128, 1, 28, 28)), em_randint(0, 10, EM_SHAPE(128)));
  }
  {
    net m = {0};
    models_transformer(&m);
    train("transformer", transformer_loss, &m, em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)),
          em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)));
  }
  {
    em_no_grad_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(4096, 1024));
    em_tensor *wb[2] = {em_rand(EM_F32, EM_SHAPE(1024)), em_randn(EM_F32, EM_SHAPE(1024))};
    double bytes = 2.0 * 4096 * 1024 * 4;
    run("softmax", softmax_fn, NULL, &x, 1, bytes);
    run("layer_norm", layer_norm_fn, wb, &x, 1, bytes);
    run("dropout", dropout_fn, NULL, &x, 1, bytes);
    em_no_grad_end();
  }
  em_scope_end();
  em_thread_cleanup();
  if (own_dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "bench compiled: could not remove %s\n", dir);
  }
  return 0;
}
