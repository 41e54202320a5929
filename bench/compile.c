/* bench/compile.c: what em_compile costs on top of eager execution.
 *
 * Figures (medians of repeated runs, all in one process):
 *  - trace_ns_per_op: tracing the Fashion-MNIST MLP training forward (784-512-512-10, batch 128,
 *    cross entropy) under the tracer, per recorded prim (nodes, proxies, autograd records);
 *  - first_call_ms: the first em_call of a fresh compiled function (trace + backend + run);
 *  - eager_ms / replay_ms: one forward+loss call, eager and replayed from the cache, and the
 *    replay's overhead per call (replay - eager) in microseconds, at batch 128 and at batch 1
 *    (where the kernels are tiny and the overhead shows);
 *  - break_rerun_ms: a call of an entry with one graph break (fn re-traced, graphs from cache);
 *  - replay_one_add_us: a replayed call of a function that adds two f32[4] (all overhead), and
 *    eager's add; host_guard_ns: what each em_guard_value adds to a replay (16 guards);
 *  - check_ms_b128: the first hit of an entry, traced again and compared (replay validation),
 *    against a replay of the same call;
 *  - transformer_adamw_*: the benchmarks' transformer (bench/models.h) trained with AdamW and a
 *    learning rate that changes every step, the whole step compiled: ms per step compiled and
 *    eager, and the traces and graph breaks it took (2 and 0 when nothing recompiles).
 * Pass --json for one JSON object per figure. */
#define MODELS_FULL_SIZE
#include "bench.h"
#include "models.h"
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

static em_outputs add2(void *ctx, em_tensor *const *in, int n) { return EM_OUTPUTS(em_add(in[0], in[1])); }

static int guard_words[16];
static em_outputs add2_guarded(void *ctx, em_tensor *const *in, int n) {
  for (int i = 0; i < 16; i++) em_guard_value(&guard_words[i], sizeof guard_words[i]);
  return EM_OUTPUTS(em_add(in[0], in[1]));
}

/* Median microseconds of a call of f (k = 0, eager) or c, alternated. */
static double time_us(em_compiled *c, model_fn f, em_tensor *x, em_tensor *y, int k) {
  double t[REPS];
  for (int r = -3; r < REPS; r++) {
    em_scope_begin();
    double t0 = bench_now();
    for (int i = 0; i < 100; i++)
      if (!(k ? em_call(c, NULL, x, y).t[0] : f(NULL, (em_tensor *[]){x, y}, 2).t[0])) fail("call");
    double dt = (bench_now() - t0) / 100;
    em_scope_end();
    if (r >= 0) t[r] = 1e6 * dt;
  }
  return bench_median(t, REPS);
}

typedef struct adamw_step {
  net m;
  em_optimizer *opt;
} adamw_step;

static em_outputs adamw_train(void *ctx, em_tensor *const *in, int n) {
  adamw_step *s = ctx;
  em_tensor *loss = transformer_fn(&s->m, in, n).t[0];
  em_optimizer_zero_grad(s->opt);
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(s->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

/* The transformer with AdamW and a new learning rate every step: eager and compiled copies
 * alternate steps. */
static void transformer_adamw(void) {
  enum { STEPS = 15 };
  adamw_step s[2];
  for (int k = 0; k < 2; k++) {
    em_manual_seed(3);
    s[k].m = (net){0};
    models_transformer(&s[k].m);
    s[k].opt = em_adamw_new(s[k].m.n_params, s[k].m.params, ((em_adamw_opts){1e-3, 0.9, 0.999, 1e-8, 1e-2, false}));
    if (!s[k].opt) fail("adamw");
  }
  em_tensor *x = em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)), *y = em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX));
  em_compiled *c = em_compile(adamw_train, &(em_compile_options){.name = "adamw_step"});
  double t[2][STEPS];
  for (int r = -3; r < STEPS; r++)
    for (int k = 0; k < 2; k++) {
      em_optimizer_set_lr(s[k].opt, 1e-3 / (1 + 0.1 * (r + 3))); /* a schedule: every step a new rate */
      em_scope_begin();
      double t0 = bench_now();
      em_tensor *l = k ? em_call(c, &s[1], x, y).t[0] : adamw_train(&s[0], (em_tensor *[]){x, y}, 2).t[0];
      if (!l) fail("transformer step");
      double dt = bench_now() - t0;
      em_scope_end();
      if (r >= 0) t[k][r] = 1e3 * dt;
    }
  em_compile_stats st = em_compiled_stats(c);
  double e = bench_median(t[0], STEPS), cm = bench_median(t[1], STEPS);
  char note[96];
  snprintf(note, sizeof note, "%.2fx eager's time", cm / e);
  bench_report("transformer_adamw_compiled_ms", cm, "ms", note);
  bench_report("transformer_adamw_eager_ms", e, "ms", NULL);
  bench_report("transformer_adamw_traces", (double)st.traces, "traces", "per-step lr: 2 means no recompile");
  bench_report("transformer_adamw_breaks", (double)st.breaks, "breaks", NULL);
  em_compiled_free(c);
  for (int k = 0; k < 2; k++) em_optimizer_free(s[k].opt);
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
    if (b == 128) { /* replay validation: the first hit traces again and compares */
      double t[REPS];
      for (int r = 0; r < 21; r++) {
        em_compiled *v = em_compile(loss_fn, NULL);
        em_scope_begin();
        if (!em_call(v, &m, x, y).t[0]) fail("first call");
        double t0 = bench_now();
        if (!em_call(v, &m, x, y).t[0]) fail("checked call");
        t[r] = 1e3 * (bench_now() - t0);
        em_scope_end();
        if (em_compiled_stats(v).checks != 1) fail("no check");
        em_compiled_free(v);
      }
      char note[64];
      snprintf(note, sizeof note, "a replay: %.3f ms; once per entry", replay);
      bench_report("check_ms_b128", bench_median(t, 21), "ms", note);
    }
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
  { /* replay overhead on a function that does almost nothing, and host guards */
    em_scope_begin();
    em_tensor *a = em_rand(EM_F32, EM_SHAPE(4)), *b = em_rand(EM_F32, EM_SHAPE(4));
    em_compiled *c = em_compile(add2, NULL), *g = em_compile(add2_guarded, NULL);
    double eager = time_us(NULL, add2, a, b, 0), rep = time_us(c, add2, a, b, 1), grep = time_us(g, add2_guarded, a, b, 1);
    char note[64];
    snprintf(note, sizeof note, "eager add %.3f us", eager);
    bench_report("replay_one_add_us", rep, "us", note);
    bench_report("host_guard_ns", 1e3 * (grep - rep) / 16, "ns", "per em_guard_value, per replay");
    em_compiled_free(c), em_compiled_free(g);
    em_scope_end();
  }
  transformer_adamw();
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
