/* bench/compile.c: what em_compile costs on top of eager execution.
 *
 * Figures (medians of repeated runs, all in one process):
 *  - trace_ns_per_op: tracing the Fashion-MNIST MLP training forward (784-512-512-10, batch 128,
 *    cross entropy) under the tracer, per recorded prim (nodes, proxies, autograd records);
 *  - first_call_ms: the first em_call of a fresh compiled function (trace + backend + run);
 *  - eager_ms / replay_ms: one forward+loss call, eager and replayed from the cache, and the
 *    replay's overhead per call (replay - eager) in microseconds, at batch 128 and at batch 1
 *    (where the kernels are tiny and the overhead shows);
 *  - break_rerun_ms: a call of an entry with one graph break (fn re-traced, graphs from cache).
 * Pass --json for one JSON object per figure. */
#include "bench.h"
#include "../runtime/rt.h"
#include "../ir/graph.h"

#include <ember.h>

enum { REPS = 101 };

typedef struct mlp {
  em_linear_layer l[3];
} mlp;

static em_tensor *logits(mlp *m, em_tensor *x) {
  em_tensor *h = em_relu(em_linear(x, m->l[0].weight, m->l[0].bias));
  h = em_relu(em_linear(h, m->l[1].weight, m->l[1].bias));
  return em_linear(h, m->l[2].weight, m->l[2].bias);
}

static em_outputs loss_fn(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_cross_entropy(logits(ctx, in[0]), in[1], EM_CROSS_ENTROPY_DEFAULT));
}

static em_outputs loss_with_break(void *ctx, em_tensor *const *in, int n) {
  em_tensor *z = logits(ctx, in[0]);
  em_graph_break();
  return EM_OUTPUTS(em_cross_entropy(z, in[1], EM_CROSS_ENTROPY_DEFAULT));
}

static bool no_break(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) { return false; }

static void fail(const char *what) {
  fprintf(stderr, "bench compile: %s: %s\n", what, em_last_error() ? em_last_error() : "?");
  exit(1);
}

typedef em_outputs (*model_fn)(void *, em_tensor *const *, int);

/* Median ms of one call of f eagerly and through c, alternating the two every repetition so
 * that drift (allocator cache, frequency) hits both alike. */
static void time_calls(em_compiled *c, model_fn f, mlp *m, em_tensor *x, em_tensor *y, double *eager_ms,
                       double *compiled_ms) {
  double t[2][REPS];
  for (int r = -3; r < REPS; r++)
    for (int k = 0; k < 2; k++) {
      em_scope_begin();
      double t0 = bench_now();
      em_tensor *l = k ? em_call(c, m, x, y).t[0] : f(m, (em_tensor *[]){x, y}, 2).t[0];
      double dt = bench_now() - t0;
      if (!l) fail("call");
      em_scope_end();
      if (r >= 0) t[k][r] = 1e3 * dt;
    }
  *eager_ms = bench_median(t[0], REPS);
  *compiled_ms = bench_median(t[1], REPS);
}

int main(int argc, char **argv) {
  bench_init("compile", argc, argv);
  em_scope_begin();
  em_manual_seed(0);
  mlp m;
  if (!em_linear_layer_init(&m.l[0], 784, 512, true) || !em_linear_layer_init(&m.l[1], 512, 512, true) ||
      !em_linear_layer_init(&m.l[2], 512, 10, true))
    fail("init");

  for (int bi = 0; bi < 2; bi++) {
    int64_t b = bi == 0 ? 128 : 1;
    em_scope_begin();
    em_tensor *x = em_rand(EM_F32, EM_SHAPE(b, 784)), *y = em_randint(0, 10, EM_SHAPE(b));
    char name[64];

    if (b == 128) { /* tracing cost per op */
      double t[REPS];
      int ops = 0;
      for (int r = 0; r < REPS; r++) {
        rt_trace tr;
        double t0 = bench_now();
        if (!rt_trace_begin(&tr, "bench", no_break, NULL, EM_HERE)) fail("trace");
        em_scope_begin();
        if (!loss_fn(&m, (em_tensor *[]){x, y}, 2).t[0]) fail("traced fn");
        em_scope_end();
        ops = tr.n_ops;
        rt_trace_end(&tr);
        t[r] = (bench_now() - t0) * 1e9 / ops;
      }
      bench_report("trace_ns_per_op", bench_median(t, REPS), "ns", NULL);
      bench_report("traced_ops", ops, "prims", "MLP forward + cross entropy");
      for (int r = 0; r < REPS; r++) {
        em_compiled *c = em_compile(loss_fn, NULL);
        em_scope_begin();
        double t0 = bench_now();
        if (!em_call(c, &m, x, y).t[0]) fail("first call");
        t[r] = 1e3 * (bench_now() - t0);
        em_scope_end();
        em_compiled_free(c);
      }
      bench_report("first_call_ms", bench_median(t, REPS), "ms", "trace + backend + run");
    }

    em_compiled *c = em_compile(loss_fn, NULL);
    double eager, replay;
    time_calls(c, loss_fn, &m, x, y, &eager, &replay);
    if (em_compiled_stats(c).traces != 1) fail("the entry was not replayed");
    snprintf(name, sizeof name, "eager_ms_b%lld", (long long)b);
    bench_report(name, eager, "ms", NULL);
    snprintf(name, sizeof name, "replay_ms_b%lld", (long long)b);
    bench_report(name, replay, "ms", NULL);
    snprintf(name, sizeof name, "replay_overhead_us_b%lld", (long long)b);
    char note[64];
    snprintf(note, sizeof note, "%.1f%% of eager", 100 * (replay - eager) / eager);
    bench_report(name, 1e3 * (replay - eager), "us", note);
    em_compiled_free(c);

    c = em_compile(loss_with_break, NULL);
    double rerun, eager_b;
    time_calls(c, loss_with_break, &m, x, y, &eager_b, &rerun);
    snprintf(name, sizeof name, "break_rerun_ms_b%lld", (long long)b);
    snprintf(note, sizeof note, "eager %.3f ms", eager_b);
    bench_report(name, rerun, "ms", note);
    em_compiled_free(c);
    em_scope_end();
  }
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
