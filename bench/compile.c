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
 *    eager, and the traces and graph breaks it took (2 and 0 when nothing recompiles);
 *  - dyn_*: dynamic shapes (issue 18). The MLP's whole training step (SGD) over batch sizes 1..256
 *    in a shuffled order, twice: traces, dynamic entries, graphs compiled (kernels are specialized
 *    per size, compiled at a size's third call; the first two run op by op on the eager kernels),
 *    the median ms of a call at a size not seen before and at one seen once, the whole sweep
 *    against EM_DYNAMIC_NEVER (which hits the recompile limit and runs eagerly); the step at batch
 *    128 through the dynamic entry (kernels that read their sizes from a table at run time)
 *    against a specialized entry (sizes as immediates); decoding 512 tokens with a KV cache that grows a row a call, compiled against eager,
 *    and the traces it took; the GPT example's whole training step (2 layers, d_model 128,
 *    batch 8) over context lengths 16..256 (every 16th, interleaved, each 5 times), compiled
 *    against eager: traces and ms per step, over all calls (a length's third call compiles it) and
 *    over the last pass, when every length is compiled; then at T = 128 the dynamic entry's
 *    kernels (sizes read at run time) against a specialized entry's.
 * Pass --json for one JSON object per figure. */
#define MODELS_FULL_SIZE
#include "bench.h"
#include "models.h"
#include "../runtime/rt.h"
#include "../ir/graph.h"
#include "../examples/gpt_model.h"

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


/* ---- dynamic shapes ---- */

static em_outputs decode_step(void *ctx, em_tensor *const *in, int n) {
  /* one head of attention for a new token over a cache [T, 64] that grows by its row */
  em_tensor **w = ctx;
  em_tensor *q = em_matmul(in[1], w[0]), *kv = em_matmul(in[1], w[1]);
  em_tensor *parts[2] = {in[0], kv};
  em_tensor *cache = em_cat(2, parts, 0);
  em_tensor *a = em_softmax(em_mul_scalar(em_matmul(q, em_transpose(cache, 0, 1)), 0.125), 1);
  return EM_OUTPUTS(cache, em_matmul(a, cache));
}

static void dynamic_shapes(void) {
  enum { NB = 256 };
  net m = {0};
  em_manual_seed(9);
  models_mlp(&m, 784, 512, 512, 10);
  em_optimizer *opt = em_sgd_new(m.n_params, m.params, EM_SGD_DEFAULT(1e-3));
  model_step_ctx sc = {mlp_fn, &m, opt};
  int order[NB];
  for (int i = 0; i < NB; i++) order[i] = i + 1;
  uint64_t r = 88172645463325252ull;
  for (int i = NB - 1; i > 0; i--) { /* a fixed shuffle (xorshift) */
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    int j = (int)(r % (uint64_t)(i + 1)), t = order[i];
    order[i] = order[j], order[j] = t;
  }
  em_tensor *xs = em_rand(EM_F32, EM_SHAPE(NB, 784)), *ys = em_randint(0, 10, EM_SHAPE(NB));
  double total[2] = {0};
  em_compile_stats st[2];
  double first[NB], again[NB];
  for (int mode = 0; mode < 2; mode++) {
    em_compiled *c = em_compile(model_train_step, &(em_compile_options){
                                                      .name = "dyn_mlp_step", .dynamic = mode ? EM_DYNAMIC_NEVER : EM_DYNAMIC_AUTO});
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < NB; i++) {
        em_scope_begin();
        em_tensor *x = em_slice(xs, 0, 0, order[i], 1), *y = em_slice(ys, 0, 0, order[i], 1);
        double t0 = bench_now();
        if (!em_call(c, &sc, x, y).t[0]) fail("dynamic sweep");
        double dt = 1e3 * (bench_now() - t0);
        em_scope_end();
        total[mode] += dt;
        if (mode == 0) (pass ? again : first)[i] = dt;
      }
    st[mode] = em_compiled_stats(c);
    em_compiled_free(c);
  }
  bench_report("dyn_mlp_sweep_traces", (double)st[0].traces, "traces", "batch 1..256 twice, shuffled");
  bench_report("dyn_mlp_sweep_dynamic_entries", (double)st[0].dynamic_entries, "entries", NULL);
  bench_report("dyn_mlp_sweep_graphs_compiled", (double)st[0].graphs_compiled, "graphs", "one per distinct size");
  bench_report("dyn_mlp_sweep_probe_traces", (double)st[0].probe_traces, "traces", NULL);
  bench_report("dyn_mlp_new_size_ms", bench_median(first, NB), "ms", "median call at a size not seen before");
  bench_report("dyn_mlp_seen_size_ms", bench_median(again, NB), "ms", "median call at a size seen once before");
  char note[96];
  snprintf(note, sizeof note, "EM_DYNAMIC_NEVER: %.0f ms, %lld traces, %lld calls eager", total[1], (long long)st[1].traces,
           (long long)st[1].eager_calls);
  bench_report("dyn_mlp_sweep_total_ms", total[0], "ms", note);

  /* batch 128 through a dynamic entry and through a specialized one */
  em_compiled *dyn = em_compile(model_train_step, &(em_compile_options){.name = "dyn128"});
  em_compiled *fix = em_compile(model_train_step, &(em_compile_options){.name = "fix128", .dynamic = EM_DYNAMIC_NEVER});
  em_tensor *x128 = em_slice(xs, 0, 0, 128, 1), *y128 = em_slice(ys, 0, 0, 128, 1);
  em_tensor *x64 = em_slice(xs, 0, 0, 64, 1), *y64 = em_slice(ys, 0, 0, 64, 1);
  em_tensor *x96 = em_slice(xs, 0, 0, 96, 1), *y96 = em_slice(ys, 0, 0, 96, 1);
  em_call(dyn, &sc, x64, y64), em_call(dyn, &sc, x96, y96); /* the second size makes it dynamic */
  em_call(dyn, &sc, x96, y96); /* its validating call */
  for (int k = 0; k < 3; k++) em_call(dyn, &sc, x128, y128); /* op by op twice, then compiled: sizes as arguments */
  double td[31], tf[31];
  for (int k = -3; k < 31; k++)
    for (int w = 0; w < 2; w++) {
      em_scope_begin();
      double t0 = bench_now();
      if (!em_call(w ? fix : dyn, &sc, x128, y128).t[0]) fail("b128");
      double dt = 1e3 * (bench_now() - t0);
      em_scope_end();
      if (k >= 0) (w ? tf : td)[k] = dt;
    }
  if (em_compiled_stats(dyn).dynamic_entries != 1) fail("no dynamic entry at batch 128");
  double a = bench_median(td, 31), b = bench_median(tf, 31);
  snprintf(note, sizeof note, "specialized entry %.3f ms: %.2fx", b, a / b);
  bench_report("dyn_mlp_b128_step_ms", a, "ms", note);
  em_compiled_free(dyn), em_compiled_free(fix);
  em_optimizer_free(opt);

  /* decoding 512 tokens, the cache growing a row a call */
  em_tensor *w[2] = {em_mul_scalar(em_randn(EM_F32, EM_SHAPE(64, 64)), 0.1), em_mul_scalar(em_randn(EM_F32, EM_SHAPE(64, 64)), 0.1)};
  double dec[2];
  em_compiled *dc = em_compile(decode_step, &(em_compile_options){.name = "decode"});
  for (int k = 0; k < 2; k++) {
    em_tensor *cache = em_retain(em_randn(EM_F32, EM_SHAPE(2, 64)));
    double t0 = bench_now();
    for (int step = 0; step < 512; step++) {
      em_scope_begin();
      em_tensor *tok = em_randn(EM_F32, EM_SHAPE(1, 64));
      em_outputs o = k ? em_call(dc, w, cache, tok) : decode_step(w, (em_tensor *[]){cache, tok}, 2);
      if (!o.t[0]) fail("decode");
      em_release(cache);
      cache = em_retain(o.t[0]);
      em_scope_end();
    }
    dec[k] = 1e3 * (bench_now() - t0);
    em_release(cache);
  }
  em_compile_stats ds = em_compiled_stats(dc);
  snprintf(note, sizeof note, "eager %.0f ms; %lld traces, %lld graphs compiled", dec[0], (long long)ds.traces,
           (long long)ds.graphs_compiled);
  bench_report("dyn_decode_512_ms", dec[1], "ms", note);
  em_compiled_free(dc);
}

/* The GPT example's training step over context lengths 16..256. */
static void dynamic_context(void) {
  enum { NT = 16, REP = 5 };
  gpt_model m[2];
  gpt_trainer t[2];
  for (int k = 0; k < 2; k++) {
    em_manual_seed(11);
    if (!gpt_init(&m[k], (gpt_config){.vocab = 96, .block = 256, .n_layer = 2, .n_head = 4, .d_model = 128}, EM_CPU) ||
        !gpt_trainer_init(&t[k], &m[k], 1e-3, 0.1, 1.0))
      fail("gpt init");
  }
  int order[NT * REP];
  for (int i = 0; i < NT * REP; i++) order[i] = 16 * (1 + (i * 7) % NT); /* each length REP times, interleaved */
  em_compiled *c = em_compile(gpt_step_fn, &(em_compile_options){.name = "gpt_step"});
  int64_t modules0 = em_kernel_cache_info().modules;
  double ms[2] = {0}, last[2] = {0}; /* all calls; the last pass over the lengths (all compiled by then) */
  for (int i = 0; i < NT * REP; i++)
    for (int k = 0; k < 2; k++) {
      em_scope_begin();
      em_manual_seed(100 + (uint64_t)i);
      em_tensor *x = em_randint(0, 96, EM_SHAPE(8, order[i])), *y = em_randint(0, 96, EM_SHAPE(8, order[i]));
      double t0 = bench_now();
      em_outputs o = k ? em_call(c, &t[1], x, y) : gpt_step_fn(&t[0], (em_tensor *[]){x, y}, 2);
      if (!o.t[0]) fail("gpt step");
      ms[k] += 1e3 * (bench_now() - t0);
      if (i >= NT * (REP - 1)) last[k] += 1e3 * (bench_now() - t0);
      em_scope_end();
    }
  em_compile_stats st = em_compiled_stats(c);
  char note[128];
  snprintf(note, sizeof note, "eager %.1f ms; %lld traces, %lld graphs compiled into %lld kernel modules, %lld op by op",
           ms[0] / (NT * REP), (long long)st.traces, (long long)st.graphs_compiled,
           (long long)(em_kernel_cache_info().modules - modules0), (long long)st.dynamic_op_by_op);
  bench_report("dyn_gpt_context_16_256_step_ms", ms[1] / (NT * REP), "ms", note);
  snprintf(note, sizeof note, "the 5th pass over the lengths, every length compiled: eager %.1f ms", last[0] / NT);
  bench_report("dyn_gpt_context_steady_step_ms", last[1] / NT, "ms", note);
  /* the same step at T = 128: the dynamic entry's kernels (sizes read from a table) against a
   * specialized entry's (sizes as immediates), alternating */
  em_compiled *fix = em_compile(gpt_step_fn, &(em_compile_options){.name = "gpt_fixed", .dynamic = EM_DYNAMIC_NEVER});
  double td[21], tf[21];
  for (int r = -4; r < 21; r++)
    for (int w = 0; w < 2; w++) {
      em_scope_begin();
      em_tensor *x = em_randint(0, 96, EM_SHAPE(8, 128)), *y = em_randint(0, 96, EM_SHAPE(8, 128));
      double t0 = bench_now();
      if (!em_call(w ? fix : c, &t[1], x, y).t[0]) fail("gpt step at 128");
      double dt = 1e3 * (bench_now() - t0);
      em_scope_end();
      if (r >= 0) (w ? tf : td)[r] = dt;
    }
  double a = bench_median(td, 21), b = bench_median(tf, 21);
  snprintf(note, sizeof note, "specialized entry %.2f ms: %.2fx", b, a / b);
  bench_report("dyn_gpt_t128_step_ms", a, "ms", note);
  em_compiled_free(fix);
  em_compiled_free(c);
  for (int k = 0; k < 2; k++) gpt_trainer_free(&t[k]), gpt_free(&m[k]);
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
  dynamic_shapes();
  dynamic_context();
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
