/* bench/compiled.c: em_compile's default backend (inductor) against Ember eager on the
 * workloads of issue 6:
 *   - training steps (forward, backward, SGD with momentum 0.9; the whole step compiled as one
 *     function) of the Fashion-MNIST MLP (784-512-512-10) and LeNet-5 at batch 128, and of a
 *     decoder-only transformer (2 layers, d_model 256, 4 heads, context 128, batch 16, byte
 *     vocabulary);
 *   - softmax and layer_norm over [4096, 1024] rows (CPU; [32768, 1024] on CUDA), against memcpy
 *     of the same bytes;
 *   - on CUDA, a GPT-2-small-shaped training step (12 layers, d_model 768, 12 heads, context
 *     1024, batch 8, GPT-2's vocabulary of 50257, tied embeddings, AdamW) with its forward under
 *     bf16 autocast (em_autocast_begin), as the mission's issue 19 asks; --gpt2-layers,
 *     --gpt2-d, --gpt2-heads, --gpt2-ctx, --gpt2-batch and --gpt2-vocab shrink it (the host
 *     emulator cannot run the full size in reasonable time), --rows the row kernels' rows.
 *   - GELU (tanh and erf forms) over [2048, 1024], forward alone and forward plus backward
 *     (issue 20), against memcpy of the bytes they must read and write.
 *   - dropout: three residual blocks x + dropout(relu(h), 0.1) over [4096, 1024] (issue 20: the
 *     uniforms computed inside the kernel), against memcpy of x and the result.
 * Figures per workload: ms per step eager and compiled (medians of alternated runs in one
 * process) and their ratio, generated kernels run per step, cold compile ms (first call:
 * trace, AOT, lowering, LLVM, JIT, and that first run; also less a compiled step's time), warm
 * compile ms (the same in a new process, kernels loaded from the disk cache this run wrote),
 * peak bytes of live tensor storage during a step, compiled and eager.
 * --json: one JSON object per figure. --only NAME runs one workload (for profiling).
 * softmax, layer_norm and the GELUs also report memcpy of the same bytes, alternated with their runs.
 * --device cuda: everything on the GPU (each timed call ends with em_cuda_synchronize; the
 * copy baseline is a device-to-device clone of the same bytes; peaks are the device allocator's).
 * On CUDA the row kernels' GB/s is also given as a fraction of the target, 85% of the
 * device copy's bandwidth (>= 1 meets it).
 * --combo-ab: each workload compiled twice, with combo kernels (EMBER_INDUCTOR_COMBO=1) and without
 * (=0; the variable set around each call of that function), alternated in the timed loop, their
 * figures named <workload>_compiled_combo_on_... and _combo_off_...; combo_kernels_per_step counts
 * the combo kernels among kernels_per_step (issue 20).
 * --mode M: em_compile's mode (default, reduce-overhead, max-autotune); --modes all: the three in
 * one run, each compiled separately and alternated with eager in the timed loop, their figures
 * named <workload>_compiled_<mode>_... (a mode after the first finds the kernels they share in
 * the caches: its cold figures are not cold). On the host emulator (no GPU) the figures time the
 * emulator, not a GPU: the output says so. */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#define MODELS_FULL_SIZE
#include "bench.h"
#include "models.h"

#include <math.h>

enum { REPS = 15 };

static const char *only, *self;
static const char *modes[3] = {NULL}; /* --mode, or --modes all: em_compile's modes, NULL the default */
static int n_modes = 1;
static bool combo_ab; /* --combo-ab: slot 0 with combo kernels, slot 1 without (EMBER_INDUCTOR_COMBO) */
static char child_args[512];           /* the options a warm probe's child needs to build the same workload */
static bool cuda; /* --device cuda */
static bool probe; /* --warm-probe: only time the first compiled call (a child run, disk cache warm) */
static int64_t rows; /* --rows: the row kernels' rows (0: 4096 on the CPU, 32768 on CUDA) */

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

/* --combo-ab: the combo switch for slot m's calls (their compiles read it). */
static void combo_slot(int m) {
  if (combo_ab) setenv("EMBER_INDUCTOR_COMBO", m ? "0" : "1", 1);
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

static em_compiled *compile(em_model_fn fn, const char *name, const char *mode) {
  em_compiled *c = em_compile(fn, &(em_compile_options){.backend = "inductor", .name = name, .mode = mode});
  if (!c) fail("em_compile");
  return c;
}

/* The first call of a fresh em_compiled in a new process that finds the kernels in the disk
 * cache this process filled: ms, or -1. */
static double warm_in_child(const char *name, const char *mode) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' --only %s --warm-probe%s%s%s%s", self, name, cuda ? " --device cuda" : "",
           mode ? " --mode " : "", mode ? mode : "", child_args);
  FILE *f = popen(cmd, "r");
  double ms = -1;
  if (f) {
    if (fscanf(f, "warm %lf", &ms) != 1) ms = -1;
    pclose(f);
  }
  return ms;
}

/* A figure's name: workload, then (with several modes) the mode, then what it is. */
static const char *figure(char *key, size_t cap, const char *name, int m, const char *what) {
  char tag[32] = "";
  if (combo_ab) snprintf(tag, sizeof tag, "_combo_%s", m ? "off" : "on");
  else if (n_modes > 1) { /* "reduce-overhead" -> "_reduce_overhead" */
    snprintf(tag, sizeof tag, "_%s", modes[m] ? modes[m] : "default");
    for (char *c = tag; *c; c++) *c = *c == '-' ? '_' : *c;
  }
  snprintf(key, cap, "%s_compiled%s_%s", name, tag, what);
  return key;
}

/* Eager against compiled (each of the modes) on fn(ctx, in), with the figures listed above. */
static void run(const char *name, em_model_fn fn, void *ctx, em_tensor *const *in, int n, double bytes_moved) {
  if (only && strcmp(only, name)) return;
  char key[128];
  once(NULL, fn, ctx, in, n); /* optimizer state exists, as in every step but the first */
  em_compiled *c[3];
  double cold[3], warm[3];
  for (int m = 0; m < n_modes; m++) {
    c[m] = compile(fn, name, modes[m]);
    combo_slot(m);
    cold[m] = once(c[m], fn, ctx, in, n);
    if (probe) {
      printf("warm %.6f\n", cold[m]);
      em_compiled_free(c[m]);
      return;
    }
  }
  for (int m = 0; m < n_modes; m++) combo_slot(m), warm[m] = warm_in_child(name, modes[m]);
  /* t[0]: eager, t[1 + m]: mode m compiled, t[1 + n_modes]: the copy baseline */
  /* eager's steady state: the composites' fused kernels (eager fusion) compile in the background
   * from a signature's third call; the timed calls must not run op by op meanwhile */
  for (int i = 0; i < 3; i++) once(NULL, fn, ctx, in, n);
  em_eager_fusion_wait();
  double t[5][REPS];
  int copy = 1 + n_modes;
  int64_t k0[3], g0[3], x0[3];
  for (int m = 0; m < n_modes; m++)
    k0[m] = em_compiled_stats(c[m]).kernel_runs, g0[m] = em_compiled_stats(c[m]).cuda_graph_replays,
    x0[m] = em_compiled_stats(c[m]).combo_kernel_runs;
  for (int r = -1; r < REPS; r++)
    for (int k = 0; k <= copy; k++) {
      if (k == copy && bytes_moved <= 0) continue;
      if (k > 0 && k < copy) combo_slot(k - 1);
      double ms = k == copy ? (cuda ? device_copy_ms(in[0]) : bench_memcpy_ms((size_t)(bytes_moved / 2)))
                            : once(k ? c[k - 1] : NULL, fn, ctx, in, n);
      if (r >= 0) t[k][r] = ms;
    }
  double e = bench_median(t[0], REPS), mc = bytes_moved > 0 ? bench_median(t[copy], REPS) : 0;
  snprintf(key, sizeof key, "%s_eager_ms", name);
  bench_report(key, e, "ms", "per step");
  int64_t peak_e = -1;
  for (int m = 0; m < n_modes; m++) {
    int64_t kernels = (em_compiled_stats(c[m]).kernel_runs - k0[m]) / (REPS + 1);
    int64_t graphs = (em_compiled_stats(c[m]).cuda_graph_replays - g0[m]) / (REPS + 1);
    int64_t combos = (em_compiled_stats(c[m]).combo_kernel_runs - x0[m]) / (REPS + 1);
    int64_t peak[2];
    for (int k = 0; k < 2; k++) { /* compiled, then eager */
      combo_slot(m);
      em_debug_reset_peak();
      if (cuda) em_cuda_reset_peak_memory_stats();
      int64_t base = cuda ? em_cuda_memory_stats_get().allocated_bytes : em_debug_live_bytes();
      once(k ? NULL : c[m], fn, ctx, in, n);
      peak[k] = (cuda ? em_cuda_memory_stats_get().peak_allocated_bytes : em_debug_peak_bytes()) - base;
    }
    peak_e = peak[1];
    double ms = bench_median(t[1 + m], REPS);
    char note[96];
    snprintf(note, sizeof note, "per step, em_compile default backend, mode %s", modes[m] ? modes[m] : "default");
    bench_report(figure(key, sizeof key, name, m, "ms"), ms, "ms", note);
    bench_report(figure(key, sizeof key, name, m, "speedup"), e / ms, "x", "eager ms / compiled ms");
    if (bytes_moved > 0) {
      bench_report(figure(key, sizeof key, name, m, "GBps"), bytes_moved / (ms * 1e6), "GB/s",
                   "bytes read + written once / compiled time");
      bench_report(figure(key, sizeof key, name, m, "of_memcpy"), mc / ms, "x",
                   "compiled bandwidth / memcpy bandwidth");
      if (cuda)
        bench_report(figure(key, sizeof key, name, m, "of_85pct_target"), mc / ms / 0.85, "x",
                     "compiled bandwidth / (0.85 x device copy bandwidth): issue 19's target is >= 1");
    }
    bench_report(figure(key, sizeof key, name, m, "kernels_per_step"), (double)kernels, "",
                 "generated kernels launched one by one (not inside CUDA graphs)");
    bench_report(figure(key, sizeof key, name, m, "combo_kernels_per_step"), (double)combos, "",
                 "of those, combo kernels (independent pointwise kernels run as one)");
    if (cuda)
      bench_report(figure(key, sizeof key, name, m, "cuda_graphs_per_step"), (double)graphs, "",
                   "CUDA graph launches inside em_call (--mode reduce-overhead / max-autotune)");
    bench_report(figure(key, sizeof key, name, m, "cold_first_call_ms"), cold[m], "ms",
                 "first call, empty caches: trace, lowering, LLVM, and one run");
    bench_report(figure(key, sizeof key, name, m, "cold_compile_ms"), cold[m] - ms, "ms",
                 "first call minus a compiled step");
    bench_report(figure(key, sizeof key, name, m, "warm_first_call_ms"), warm[m], "ms",
                 "first call in a new process, kernels from the disk cache");
    bench_report(figure(key, sizeof key, name, m, "warm_compile_ms"), warm[m] - ms, "ms",
                 "the same minus a compiled step");
    bench_report(figure(key, sizeof key, name, m, "peak_bytes"), (double)peak[0], "bytes",
                 "peak live tensor storage during a step, beyond what was live before");
    em_compiled_free(c[m]);
  }
  if (bytes_moved > 0) {
    snprintf(key, sizeof key, "%s_memcpy_GBps", name);
    bench_report(key, bytes_moved / (mc * 1e6), "GB/s",
                 cuda ? "device clone of the input (read + write), alternated with the runs"
                      : "memcpy of the same bytes (read + write), alternated with the runs");
  }
  snprintf(key, sizeof key, "%s_peak_bytes_eager", name);
  bench_report(key, (double)peak_e, "bytes", NULL);
}

static void train(const char *name, em_model_fn loss_fn, net *m, em_tensor *x, em_tensor *y) {
  if (only && strcmp(only, name)) return;
  model_step_ctx s = {loss_fn, m, em_sgd_new(m->n_params, m->params, ((em_sgd_opts){0.01, 0.9, 0, 0, false}))};
  if (!s.opt) fail("optimizer");
  run(name, model_train_step, &s, (em_tensor *[]){x, y}, 2, 0);
  em_optimizer_free(s.opt);
}

/* GELU alone (forward) and forward plus backward (the gradient of y against an upstream g), the
 * pointwise kernels of a transformer's MLP (issue 20): both forms, f32 [2048, 1024]. */
static char tanh_form; /* its address as ctx: the tanh form */
static em_outputs gelu_fn(void *ctx, em_tensor *const *in, int n) { return EM_OUTPUTS(em_gelu(in[0], ctx != NULL)); }
static em_outputs gelu_grad_fn(void *ctx, em_tensor *const *in, int n) {
  em_tensor *y = em_gelu(in[0], ctx != NULL), *gx = NULL;
  if (!y || !em_grad(1, &y, &in[1], 1, &in[0], &gx, false, false)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(y, gx);
}
static em_outputs transformer_loss(void *ctx, em_tensor *const *in, int n) { return transformer_fn(ctx, in, n); }
/* Three residual blocks of dropout(relu(h), 0.1) (issue 20): uniform, mask and scale each time. */
static em_outputs dropout_fn(void *ctx, em_tensor *const *in, int n) {
  em_tensor *h = in[0];
  for (int i = 0; i < 3; i++) h = em_add(in[0], em_dropout(em_relu(h), 0.1, true));
  return EM_OUTPUTS(h);
}

/* ---- a GPT-2-small-shaped training step (CUDA) ----
 * GPT-2's layout, as examples/gpt_model.c (whose model stops at 7 layers, the decoding step's
 * outputs): pre-norm blocks of causal self-attention and a tanh-GELU MLP 4 d wide, learned
 * positions, the output layer tied to the token embedding, GPT-2's init (std 0.02, residual
 * projections / sqrt(2 layers)). One step: the forward under bf16 autocast (GEMMs in bf16, f32
 * accumulation; softmax, layer_norm, the loss in f32, as torch.autocast), backward, the update.
 * Ember's em_gelu and em_scaled_dot_product_attention take f32 or f64 only (torch runs them in
 * bf16 under autocast), so their inputs are cast to f32 here: the attention's GEMMs still run in
 * bf16 (em_matmul autocasts), and compiled, the casts fuse into the neighbouring kernels. */
static struct { int64_t layers, d, heads, ctx, batch, vocab; } g2 = {12, 768, 12, 1024, 8, 50257};
enum { G2_PER_LAYER = 12 };

typedef struct gpt2 {
  em_tensor **p; /* tok [V, d], pos [ctx, d], per layer G2_PER_LAYER (as below), ln_f w, b */
  int n;
  em_optimizer *opt;
} gpt2;

static em_tensor *g2_param(em_tensor *t) { return em_retain(em_requires_grad_(t, true)); }

static bool gpt2_init(gpt2 *g) {
  int64_t D = g2.d;
  g->p = calloc((size_t)(4 + G2_PER_LAYER * g2.layers), sizeof *g->p);
  if (!g->p) return false;
  double std = 0.02, proj = 0.02 / sqrt(2.0 * (double)g2.layers);
  em_scope_begin();
  g->p[g->n++] = g2_param(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(g2.vocab, D)), std));
  g->p[g->n++] = g2_param(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(g2.ctx, D)), std));
  for (int64_t l = 0; l < g2.layers; l++) {
    int64_t outs[4] = {3 * D, D, 4 * D, D}, ins[4] = {D, D, D, 4 * D};
    g->p[g->n++] = g2_param(em_ones(EM_F32, EM_SHAPE(D))), g->p[g->n++] = g2_param(em_zeros(EM_F32, EM_SHAPE(D)));
    for (int j = 0; j < 4; j++) { /* qkv, attention projection, MLP in, MLP out: weight, bias */
      g->p[g->n++] = g2_param(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(outs[j], ins[j])), j % 2 ? proj : std));
      g->p[g->n++] = g2_param(em_zeros(EM_F32, EM_SHAPE(outs[j])));
      if (j == 1) /* ln2 after the attention's projection */
        g->p[g->n++] = g2_param(em_ones(EM_F32, EM_SHAPE(D))), g->p[g->n++] = g2_param(em_zeros(EM_F32, EM_SHAPE(D)));
    }
  }
  g->p[g->n++] = g2_param(em_ones(EM_F32, EM_SHAPE(D))), g->p[g->n++] = g2_param(em_zeros(EM_F32, EM_SHAPE(D)));
  em_scope_end();
  for (int i = 0; i < g->n; i++)
    if (!g->p[i]) return false;
  g->opt = em_adamw_new(g->n, g->p, ((em_adamw_opts){3e-4, 0.9, 0.95, 1e-8, 0.1, false})); /* nanoGPT's */
  return g->opt != NULL;
}

static void gpt2_free(gpt2 *g) {
  em_optimizer_free(g->opt);
  for (int i = 0; i < g->n; i++) em_release(g->p[i]);
  free(g->p);
}

static em_tensor *gpt2_loss(gpt2 *g, em_tensor *idx, em_tensor *tgt) {
  int64_t B = g2.batch, T = g2.ctx, D = g2.d, H = g2.heads;
  em_tensor **p = g->p;
  em_tensor *x = em_add(em_embedding(idx, p[0]), p[1]); /* [B, T, D] */
  for (int64_t l = 0; l < g2.layers; l++) {
    em_tensor **L = &p[2 + G2_PER_LAYER * l]; /* ln1 w b, qkv w b, proj w b, ln2 w b, fc w b, out w b */
    em_tensor *qkv = em_linear(em_layer_norm(x, 1, L[0], L[1], 1e-5), L[2], L[3]);
    em_tensor *qs[3];
    for (int j = 0; j < 3; j++) {
      em_tensor *part = em_cast(em_slice(qkv, 2, j * D, (j + 1) * D, 1), EM_F32);
      qs[j] = em_transpose(em_reshape(part, EM_SHAPE(B, T, H, D / H)), 1, 2);
    }
    em_tensor *a = em_scaled_dot_product_attention(qs[0], qs[1], qs[2], true, 0, 0);
    x = em_add(x, em_linear(em_reshape(em_transpose(a, 1, 2), EM_SHAPE(B, T, D)), L[4], L[5]));
    em_tensor *h = em_gelu(em_cast(em_linear(em_layer_norm(x, 1, L[6], L[7], 1e-5), L[8], L[9]), EM_F32), true);
    x = em_add(x, em_linear(h, L[10], L[11]));
  }
  em_tensor *logits = em_linear(em_layer_norm(x, 1, p[g->n - 2], p[g->n - 1], 1e-5), p[0], EM_NONE);
  return em_cross_entropy(em_reshape(logits, EM_SHAPE(B * T, g2.vocab)), em_reshape(tgt, EM_SHAPE(B * T)),
                          EM_CROSS_ENTROPY_DEFAULT);
}

static em_outputs gpt2_step(void *ctx, em_tensor *const *in, int n) {
  gpt2 *g = ctx;
  if (!em_autocast_begin(EM_BF16)) return EM_OUTPUTS(NULL);
  em_tensor *loss = gpt2_loss(g, in[0], in[1]);
  em_autocast_end(); /* backward and the update outside the region, as with torch.autocast */
  em_optimizer_zero_grad(g->opt);
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(g->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

int main(int argc, char **argv) {
  bench_init("compiled", argc, argv);
  self = argv[0];
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[i + 1];
    if (!strcmp(argv[i], "--warm-probe")) probe = true;
    if (!strcmp(argv[i], "--mode") && i + 1 < argc) modes[0] = argv[i + 1], n_modes = 1;
    if (!strcmp(argv[i], "--modes") && i + 1 < argc) {
      if (strcmp(argv[i + 1], "all")) fail("--modes takes 'all' (default, reduce-overhead and max-autotune)");
      modes[0] = NULL, modes[1] = "reduce-overhead", modes[2] = "max-autotune", n_modes = 3;
    }
    if (!strcmp(argv[i], "--device") && i + 1 < argc) cuda = !strcmp(argv[i + 1], "cuda");
    combo_ab = combo_ab || !strcmp(argv[i], "--combo-ab");
    static const char *const g2_flags[] = {"--gpt2-layers", "--gpt2-d", "--gpt2-heads", "--gpt2-ctx", "--gpt2-batch",
                                           "--gpt2-vocab", "--rows"};
    int64_t *g2_vals[] = {&g2.layers, &g2.d, &g2.heads, &g2.ctx, &g2.batch, &g2.vocab, &rows};
    for (int f = 0; f < 7; f++)
      if (!strcmp(argv[i], g2_flags[f]) && i + 1 < argc) {
        *g2_vals[f] = atoll(argv[i + 1]);
        if (*g2_vals[f] < 1) fail(g2_flags[f]);
        size_t used = strlen(child_args);
        snprintf(child_args + used, sizeof child_args - used, " %s %s", argv[i], argv[i + 1]);
      }
  }
  if (combo_ab && n_modes > 1) fail("--combo-ab takes one mode");
  if (combo_ab) modes[1] = modes[0], n_modes = 2;
  if (g2.d % g2.heads) fail("--gpt2-heads must divide --gpt2-d");
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
  if (cuda && (!only || !strcmp(only, "gpt2"))) {
    gpt2 g = {0};
    if (!gpt2_init(&g)) fail("gpt2");
    if (!probe)
      fprintf(stderr, "bench compiled: gpt2: %lld layers, d %lld, %lld heads, context %lld, batch %lld, vocab %lld\n",
              (long long)g2.layers, (long long)g2.d, (long long)g2.heads, (long long)g2.ctx, (long long)g2.batch,
              (long long)g2.vocab);
    run("gpt2", gpt2_step, &g, (em_tensor *[]){em_randint(0, g2.vocab, EM_SHAPE(g2.batch, g2.ctx)),
                                              em_randint(0, g2.vocab, EM_SHAPE(g2.batch, g2.ctx))}, 2, 0);
    gpt2_free(&g);
  }
  models_rows(run, rows ? rows : cuda ? 32768 : 4096);
  {
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(2048, 1024)), *g = em_randn(EM_F32, EM_SHAPE(2048, 1024));
    double bytes = 2.0 * 2048 * 1024 * 4; /* x read, y written */
    em_no_grad_begin();
    run("gelu_tanh", gelu_fn, &tanh_form, &x, 1, bytes);
    run("gelu_erf", gelu_fn, NULL, &x, 1, bytes);
    em_no_grad_end();
    em_requires_grad_(x, true);
    /* x and g read, y and the gradient written: the least a fused forward and backward moves */
    run("gelu_tanh_grad", gelu_grad_fn, &tanh_form, (em_tensor *[]){x, g}, 2, 2 * bytes);
    run("gelu_erf_grad", gelu_grad_fn, NULL, (em_tensor *[]){x, g}, 2, 2 * bytes);
  }
  {
    em_no_grad_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(4096, 1024));
    run("dropout", dropout_fn, NULL, &x, 1, 2.0 * 4096 * 1024 * 4);
    em_no_grad_end();
  }
  em_scope_end();
  em_thread_cleanup();
  if (own_dir) bench_remove_dir(dir);
  return 0;
}
