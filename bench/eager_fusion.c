/* bench/eager_fusion.c: eager composites fused into compiled kernels (issue 23) against op by op
 * (fusion off, EMBER_EAGER_FUSION=0), in one process, runs alternated:
 *   - softmax and layer_norm over [4096, 1024] f32 rows (no grad): ms per call fused and op by
 *     op, GB/s (bytes read + written once) against memcpy of the same bytes in the same run;
 *   - their first calls: a new signature's first call (op by op by design) against an op-by-op
 *     call (and their ratio), the third (which starts the background compile;
 *     EMBER_EAGER_FUSION_ASYNC=0: which compiles on the calling thread), the slowest
 *     call until the first fused one, and the number of calls until then (a training step has
 *     several signatures: the steady state below waits for all their compiles);
 *   - dropout (p 0.1, training) over the same rows, max_pool2d 3x3 stride 2 pad 1 and avg_pool2d
 *     2x2 over [16, 64, 56, 56] f32 (a ResNet stem's), batch_norm over that input, training
 *     (batch statistics, running statistics updated in place) and eval: as softmax's rows, GB/s
 *     counting x read and y written once (batch_norm training must read x twice); then forward
 *     and backward (the gradient of x) of max_pool2d, training batch_norm and dropout;
 *   - eager training steps (forward, backward, SGD momentum 0.9) of the Fashion-MNIST MLP
 *     (784-512-512-10, batch 128) and the transformer of bench/compiled (2 layers, d_model 256,
 *     context 128, batch 16): ms per step fused and op by op.
 * The disk kernel cache starts empty (a fresh EMBER_CACHE_DIR), so first calls include LLVM.
 * --json: one JSON object per figure. */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#define MODELS_FULL_SIZE
#include "bench.h"
#include "models.h"

enum { REPS = 15 };

static void fail(const char *what) {
  fprintf(stderr, "bench eager_fusion: %s: %s\n", what, em_last_error() ? em_last_error() : "?");
  exit(1);
}


/* One call of fn with fusion on or off; returns ms. */
static double once(bool fused, em_model_fn fn, void *ctx, em_tensor *const *in, int n) {
  em_eager_fusion_config(fused, -1);
  em_scope_begin();
  double t0 = bench_now();
  if (!fn(ctx, in, n).t[0]) fail("call");
  double dt = bench_now() - t0;
  em_scope_end();
  return 1e3 * dt;
}

static void report(const char *name, const char *what, double v, const char *unit, const char *note) {
  char key[96];
  snprintf(key, sizeof key, "%s_%s", name, what);
  bench_report(key, v, unit, note);
}

/* Fused against op by op on fn(ctx, in): first calls, then steady state. */
static void run(const char *name, em_model_fn fn, void *ctx, em_tensor *const *in, int n, double bytes) {
  double off1 = once(false, fn, ctx, in, n); /* also the op-by-op warm-up */
  off1 = once(false, fn, ctx, in, n);
  em_eager_fusion_stats s0 = em_eager_fusion_info();
  double first = once(true, fn, ctx, in, n), slowest = first, third = 0;
  int calls = 1;
  while (em_eager_fusion_info().fused_calls == s0.fused_calls && calls < 200) {
    double ms = once(true, fn, ctx, in, n);
    slowest = ms > slowest ? ms : slowest;
    if (++calls == 3) third = ms;
  }
  report(name, "first_call_ms", first, "ms", "a new signature's first call, fusion on (op by op by design)");
  report(name, "op_by_op_call_ms", off1, "ms", "a warm op-by-op call, for comparison");
  report(name, "first_call_of_op_by_op", first / off1, "x", "first call of a new signature / op-by-op call");
  report(name, "third_call_ms", third, "ms",
         "the call that starts the background compile (EMBER_EAGER_FUSION_ASYNC=0: that compiles)");
  report(name, "third_call_of_op_by_op", third / off1, "x", "third call / op-by-op call");
  report(name, "slowest_warmup_call_ms", slowest, "ms", "the slowest call until the first fused one");
  report(name, "calls_until_fused", calls, "", "calls with fusion on until the first fused call (itself included)");
  em_eager_fusion_wait(); /* steady state: every signature's compile done (a step has several) */
  double t[3][REPS];
  int64_t k0 = em_eager_fusion_info().kernel_runs;
  for (int r = -1; r < REPS; r++)
    for (int k = 0; k < 3; k++) {
      if (k == 2 && bytes <= 0) continue;
      double ms = k == 2 ? bench_memcpy_ms((size_t)(bytes / 2)) : once(k == 1, fn, ctx, in, n);
      if (r >= 0) t[k][r] = ms;
    }
  double off = bench_median(t[0], REPS), on = bench_median(t[1], REPS);
  report(name, "op_by_op_ms", off, "ms", "per call, EMBER_EAGER_FUSION=0");
  report(name, "fused_ms", on, "ms", "per call, eager fusion");
  report(name, "speedup", off / on, "x", "op by op / fused");
  report(name, "kernels_per_call", (double)(em_eager_fusion_info().kernel_runs - k0) / (REPS + 1), "",
         "generated kernels run per fused call");
  if (bytes > 0) {
    double mc = bench_median(t[2], REPS);
    report(name, "memcpy_GBps", bytes / (mc * 1e6), "GB/s", "memcpy of the same bytes (read + write), alternated");
    report(name, "fused_GBps", bytes / (on * 1e6), "GB/s", "bytes read + written once / fused time");
    report(name, "op_by_op_GBps", bytes / (off * 1e6), "GB/s", NULL);
    report(name, "fused_of_memcpy", mc / on, "x", "fused bandwidth / memcpy bandwidth");
  }
}


static em_outputs dropout_fn(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_dropout(in[0], 0.1, true));
}
static em_outputs max_pool_fn(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_max_pool2d(in[0], 3, 3, 2, 2, 1, 1));
}
static em_outputs avg_pool_fn(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_avg_pool2d(in[0], 2, 2, 0, 0, 0, 0));
}
/* ctx: running_mean, running_var, weight, bias [C] */
static em_outputs bn_train_fn(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  em_tensor **p = ctx;
  return EM_OUTPUTS(em_batch_norm(in[0], p[0], p[1], p[2], p[3], true, 0.1, 1e-5));
}
static em_outputs bn_eval_fn(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  em_tensor **p = ctx;
  return EM_OUTPUTS(em_batch_norm(in[0], p[0], p[1], p[2], p[3], false, 0.1, 1e-5));
}

/* Forward and backward: in[0] requires grad, in[1] is the output's gradient; the result is x's
 * gradient. ctx: the forward (one of the above) and its ctx. */
typedef struct fwd_bwd_ctx {
  em_model_fn fn;
  void *ctx;
} fwd_bwd_ctx;
static em_outputs fwd_bwd_fn(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  fwd_bwd_ctx *c = ctx;
  em_tensor *y = c->fn(c->ctx, in, 1).t[0], *gx = NULL;
  if (!y || !em_grad(1, &y, &in[1], 1, in, &gx, false, false)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(gx);
}

/* The issue 23 extension: dropout, pooling and batch_norm, no grad (as models_rows), then
 * forward and backward of max_pool2d, dropout and training batch_norm. */
static void more_ops(void) {
  em_no_grad_begin();
  em_tensor *rows = em_randn(EM_F32, EM_SHAPE(4096, 1024));
  run("dropout", dropout_fn, NULL, &rows, 1, 2.0 * 4096 * 1024 * 4);
  int64_t n = 16, c = 64, h = 56;
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(n, c, h, h));
  double xb = (double)(n * c * h * h) * 4;
  run("max_pool2d", max_pool_fn, NULL, &x, 1, xb + xb / 4);
  run("avg_pool2d", avg_pool_fn, NULL, &x, 1, xb + xb / 4);
  em_tensor *stats[4] = {em_zeros(EM_F32, EM_SHAPE(c)), em_ones(EM_F32, EM_SHAPE(c)), em_rand(EM_F32, EM_SHAPE(c)),
                         em_randn(EM_F32, EM_SHAPE(c))};
  run("batch_norm_train", bn_train_fn, stats, &x, 1, 2 * xb);
  run("batch_norm_eval", bn_eval_fn, stats, &x, 1, 2 * xb);
  em_no_grad_end();
  em_tensor *xg[2] = {em_requires_grad_(em_clone(x), true), em_randn(EM_F32, EM_SHAPE(n, c, h / 2, h / 2))};
  run("max_pool2d_fwd_bwd", fwd_bwd_fn, &(fwd_bwd_ctx){max_pool_fn, NULL}, xg, 2, 0);
  xg[1] = em_randn(EM_F32, EM_SHAPE(n, c, h, h));
  run("batch_norm_train_fwd_bwd", fwd_bwd_fn, &(fwd_bwd_ctx){bn_train_fn, stats}, xg, 2, 0);
  em_tensor *rg[2] = {em_requires_grad_(em_clone(rows), true), em_randn(EM_F32, EM_SHAPE(4096, 1024))};
  run("dropout_fwd_bwd", fwd_bwd_fn, &(fwd_bwd_ctx){dropout_fn, NULL}, rg, 2, 0);
}

static void train(const char *name, em_model_fn loss_fn, net *m, em_tensor *x, em_tensor *y) {
  model_step_ctx s = {loss_fn, m, em_sgd_new(m->n_params, m->params, ((em_sgd_opts){0.01, 0.9, 0, 0, false}))};
  if (!s.opt) fail("optimizer");
  run(name, model_train_step, &s, (em_tensor *[]){x, y}, 2, 0);
  em_optimizer_free(s.opt);
}

int main(int argc, char **argv) {
  bench_init("eager_fusion", argc, argv);
  char dir[] = "/tmp/ember-bench-cacheXXXXXX";
  bool own_dir = mkdtemp(dir);
  if (own_dir) setenv("EMBER_CACHE_DIR", dir, 1);
  em_scope_begin();
  em_manual_seed(0);
  models_rows(run, 4096);
  more_ops();
  {
    net m = {0};
    models_mlp(&m, 784, 512, 512, 10);
    train("mlp", mlp_fn, &m, em_rand(EM_F32, EM_SHAPE(128, 784)), em_randint(0, 10, EM_SHAPE(128)));
  }
  {
    net m = {0};
    models_transformer(&m);
    train("transformer", transformer_fn, &m, em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)),
          em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)));
  }
  em_eager_fusion_stats s = em_eager_fusion_info();
  report("all", "signatures", (double)s.functions, "", "compiled functions made (one per signature)");
  report("all", "graphs_compiled", (double)s.graphs_compiled, "", NULL);
  report("all", "fallbacks", (double)s.fallbacks, "", "fused calls that failed and ran op by op");
  em_scope_end();
  em_thread_cleanup();
  if (own_dir) bench_remove_dir(dir);
  return 0;
}
