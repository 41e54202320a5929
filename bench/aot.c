/* bench/aot.c: AOT autograd on the three models of the issue at full size: the Fashion-MNIST
 * MLP (784-512-512-10) and LeNet-5 at batch 128, and a decoder-only transformer (2 layers,
 * d_model 256, 4 heads, context 128, batch 16, byte vocabulary of 256).
 *
 * Figures, per model: bytes the forward saves for the backward per step with the min-cut and
 * the default partitioner; first-call ms (trace, joint graph, partition); and ms per forward +
 * backward, eager against aot_eager (both partitioners) and against the inductor backend,
 * medians of repeated runs alternated in one process.
 * Pass --json for one JSON object per figure. */
#define MODELS_FULL_SIZE
#include "bench.h"
#include "models.h"

enum { REPS = 9 };

static void fail(const char *what) {
  fprintf(stderr, "bench aot: %s: %s\n", what, em_last_error() ? em_last_error() : "?");
  exit(1);
}

/* One forward + backward through c (or eagerly when c is NULL); returns ms. */
static double step(em_compiled *c, em_model_fn fn, net *m, em_tensor *x, em_tensor *y) {
  em_scope_begin();
  double t0 = bench_now();
  em_tensor *loss = c ? em_call(c, m, x, y).t[0] : fn(m, (em_tensor *[]){x, y}, 2).t[0];
  if (!loss || !em_backward(loss, NULL)) fail("step");
  double dt = bench_now() - t0;
  for (int i = 0; i < m->n_params; i++) em_zero_grad(m->params[i]);
  em_scope_end();
  return 1e3 * dt;
}

static void run(const char *name, em_model_fn fn, net *m, em_tensor *x, em_tensor *y) {
  char key[96];
  int64_t saved[2];
  const char *parts[2] = {"min_cut", "default"};
  em_compiled *c[2];
  for (int p = 0; p < 2; p++) {
    c[p] = em_compile(fn, &(em_compile_options){.backend = "aot_eager", .partitioner = parts[p], .name = name});
    double first = step(c[p], fn, m, x, y);
    saved[p] = em_compiled_stats(c[p]).aot_saved_bytes;
    if (em_compiled_stats(c[p]).aot_graphs != 1) fail("no AOT graph");
    snprintf(key, sizeof key, "%s_saved_bytes_%s", name, parts[p]);
    bench_report(key, (double)saved[p], "bytes", NULL);
    if (p == 0) {
      snprintf(key, sizeof key, "%s_first_call_ms", name);
      bench_report(key, first, "ms", "trace + joint graph + min-cut partition + run");
    }
  }
  snprintf(key, sizeof key, "%s_saved_ratio", name);
  bench_report(key, (double)saved[0] / (double)saved[1], "x", "min-cut / default");
  em_compiled *ci = em_compile(fn, &(em_compile_options){.backend = "inductor", .name = name});
  double t[4][REPS];
  for (int r = -1; r < REPS; r++)
    for (int k = 0; k < 4; k++) {
      double ms = step(k == 3 ? ci : k ? c[k - 1] : NULL, fn, m, x, y);
      if (r >= 0) t[k][r] = ms;
    }
  double e = bench_median(t[0], REPS), a = bench_median(t[1], REPS), d = bench_median(t[2], REPS),
         ind = bench_median(t[3], REPS);
  char note[64];
  snprintf(key, sizeof key, "%s_eager_ms", name);
  bench_report(key, e, "ms", "forward + backward");
  snprintf(key, sizeof key, "%s_aot_min_cut_ms", name);
  snprintf(note, sizeof note, "%.2fx eager", a / e);
  bench_report(key, a, "ms", note);
  snprintf(key, sizeof key, "%s_aot_default_ms", name);
  snprintf(note, sizeof note, "%.2fx eager", d / e);
  bench_report(key, d, "ms", note);
  snprintf(key, sizeof key, "%s_inductor_ms", name);
  snprintf(note, sizeof note, "%.2fx eager (generated kernels, min-cut)", ind / e);
  bench_report(key, ind, "ms", note);
  for (int p = 0; p < 2; p++) em_compiled_free(c[p]);
  em_compiled_free(ci);
}

static em_outputs transformer_loss(void *ctx, em_tensor *const *in, int n) { return transformer_fn(ctx, in, n); }

int main(int argc, char **argv) {
  bench_init("aot", argc, argv);
  em_scope_begin();
  em_manual_seed(0);
  {
    net m = {0};
    models_mlp(&m, 784, 512, 512, 10);
    run("mlp", mlp_fn, &m, em_rand(EM_F32, EM_SHAPE(128, 784)), em_randint(0, 10, EM_SHAPE(128)));
  }
  {
    net m = {0};
    if (!models_lenet(&m)) fail("lenet");
    run("lenet", lenet_fn, &m, em_rand(EM_F32, EM_SHAPE(128, 1, 28, 28)), em_randint(0, 10, EM_SHAPE(128)));
  }
  {
    net m = {0};
    models_transformer(&m);
    run("transformer", transformer_loss, &m, em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)),
        em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)));
  }
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
