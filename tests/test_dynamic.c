/* tests/test_dynamic.c: dynamic shapes (issue 18): automatic dynamic after a size change,
 * em_mark_dynamic / em_mark_static, EM_DYNAMIC_ALWAYS / NEVER, 0/1 specialization, duck sizing
 * and its guard, formulas through reshapes (B * T), slices, arange and a mean's divisor, whole
 * training steps, and the cases that must stay specialized (a branch on a size, a division, a
 * square) with results still eager's. Backend "eager" is compared bit for bit with eager
 * execution; aot_eager and inductor within the inductor suite's tolerances. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <unistd.h>

static const char *const BACKENDS[] = {"eager", "aot_eager", "inductor"};

/* Largest |a - b| over all elements (both the same shape). */
static double max_diff(em_tensor *a, em_tensor *b) {
  cr_assert_not_null(a, "%s", em_last_error() ? em_last_error() : "");
  cr_assert_not_null(b);
  cr_assert_eq(em_ndim(a), em_ndim(b));
  for (int d = 0; d < em_ndim(a); d++) cr_assert_eq(em_size(a, d), em_size(b, d), "size %d", d);
  if (em_numel(a) == 0) return 0;
  int64_t axes[EM_MAX_DIMS];
  for (int d = 0; d < em_ndim(a); d++) axes[d] = d;
  em_tensor *m = em_amax(em_abs(em_sub(em_cast(a, EM_F64), em_cast(b, EM_F64))), em_ndim(a), axes, false);
  return em_item(m);
}

/* Backend eager must be bit-exact; the others within 1e-4 (f32 GEMM order). */
static void expect_close(em_tensor *got, em_tensor *want, const char *backend, const char *what) {
  double d = max_diff(got, want);
  double tol = strcmp(backend, "eager") ? 1e-4 : 0;
  cr_assert(d <= tol, "%s (%s): differs from eager by %g", what, backend, d);
}

/* ---- an MLP over a batch ---- */

typedef struct mlp {
  em_linear_layer l1, l2;
} mlp;

static em_outputs mlp_forward(void *ctx, em_tensor *const *in, int n) {
  mlp *m = ctx;
  em_tensor *h = em_relu(em_linear(in[0], m->l1.weight, m->l1.bias));
  em_tensor *logits = em_linear(h, m->l2.weight, m->l2.bias);
  em_tensor *loss = em_cross_entropy(logits, in[1], EM_CROSS_ENTROPY_DEFAULT);
  /* a mean: its divisor is the batch size times 5, a formula in the graph */
  em_tensor *reg = em_mean(em_mul(logits, logits), EM_AXES(0, 1), false);
  return EM_OUTPUTS(em_add(loss, em_mul_scalar(reg, 0.01)), logits);
}

static void mlp_init(mlp *m) {
  cr_assert(em_linear_layer_init(&m->l1, 20, 16, true) && em_linear_layer_init(&m->l2, 16, 5, true));
}

/* Batch sizes 2..40 in a shuffled order: one specialized entry (the first size), then one
 * dynamic entry for every other size; every result is eager's. A size's first calls run op by
 * op (each size comes once here); batch_sweep_compiled_kernels compiles every size at once. */
static void batch_sweep(void) {
  for (int bi = 0; bi < 3; bi++) {
    em_manual_seed(1);
    mlp m;
    mlp_init(&m);
    em_compiled *c = em_compile(mlp_forward, &(em_compile_options){.backend = BACKENDS[bi], .name = "mlp"});
    int order[39];
    for (int i = 0; i < 39; i++) order[i] = 2 + (i * 17) % 39; /* 17 is coprime to 39: a permutation */
    for (int i = 0; i < 39; i++) {
      em_scope_begin();
      int64_t b = order[i];
      em_tensor *x = em_randn(EM_F32, EM_SHAPE(b, 20)), *y = em_randint(0, 5, EM_SHAPE(b));
      em_outputs e = mlp_forward(&m, (em_tensor *[]){x, y}, 2);
      em_outputs o = em_call(c, &m, x, y);
      cr_assert_eq(o.n, 2, "%s", em_last_error() ? em_last_error() : "");
      expect_close(o.t[0], e.t[0], BACKENDS[bi], "loss");
      expect_close(o.t[1], e.t[1], BACKENDS[bi], "logits");
      em_scope_end();
    }
    em_compile_stats s = em_compiled_stats(c);
    cr_assert_eq(s.entries, 2, "%s: %lld entries", BACKENDS[bi], (long long)s.entries);
    cr_assert_eq(s.traces, 2, "%s: %lld traces", BACKENDS[bi], (long long)s.traces);
    cr_assert_eq(s.dynamic_entries, 1);
    cr_assert_eq(s.eager_calls, 0);
    cr_assert_eq(s.probe_traces, 4, "one corner and three checks for one symbol, got %lld", (long long)s.probe_traces);
    cr_assert_eq(s.replays + s.checks + s.traces, 39);
    bool compiled_at_once = getenv("EMBER_DYNAMIC_COMPILE_AFTER") != NULL;
    /* every size after the two traced ones is new: its call traces fn again and compares with
     * the template (a check), its graph run op by op, or compiled at once */
    cr_assert_eq(s.checks, 37, "%lld checks", (long long)s.checks);
    cr_assert_eq(s.dynamic_op_by_op, compiled_at_once ? 0 : 37, "%lld", (long long)s.dynamic_op_by_op);
    cr_assert_eq(s.dynamic_misses, 0);
    em_compiled_free(c);
  }
}

ETEST(dynamic, batch_sweep_compiles_twice_and_matches_eager) { batch_sweep(); }

ETEST(dynamic, batch_sweep_compiled_kernels) {
  setenv("EMBER_DYNAMIC_COMPILE_AFTER", "1", 1); /* read once per process: each test has its own */
  batch_sweep();
}

/* em_mark_dynamic: symbolic from the first trace; sizes 0 and 1 still specialize; a size outside
 * the marked range recompiles. */
ETEST(dynamic, mark_dynamic_symbolic_from_the_first_trace) {
  em_manual_seed(2);
  mlp m;
  mlp_init(&m);
  em_compiled *c = em_compile(mlp_forward, &(em_compile_options){.backend = "eager"});
  int64_t sizes[] = {6, 9, 30, 1, 31, 2};
  for (int i = 0; i < 6; i++) {
    em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(sizes[i], 20)), *y = em_randint(0, 5, EM_SHAPE(sizes[i]));
    em_mark_dynamic_range(x, 0, 2, 30); /* both: as in PyTorch, a marked dim equal to an unmarked one fails */
    em_mark_dynamic_range(y, 0, 2, 30);
    em_outputs e = mlp_forward(&m, (em_tensor *[]){x, y}, 2);
    em_outputs o = em_call(c, &m, x, y);
    expect_close(o.t[0], e.t[0], "eager", "loss");
    em_scope_end();
  }
  em_compile_stats s = em_compiled_stats(c);
  /* 6 (dynamic, 2..30, serving 9, 30 and 2), 1 (size 1 specializes), 31 (outside the range) */
  cr_assert_eq(s.traces, 3, "%lld traces", (long long)s.traces);
  cr_assert_eq(s.dynamic_entries, 1);
  em_compiled_free(c);
}

ETEST(dynamic, mark_errors) {
  em_tensor *x = em_zeros(EM_F32, EM_SHAPE(4, 3));
  em_mark_dynamic(x, 2);
  cr_assert(strstr(em_last_error(), "dim 2 out of range"), "%s", em_last_error());
  em_clear_error();
  em_mark_dynamic_range(x, 0, 1, 8);
  cr_assert(strstr(em_last_error(), "min >= 2"), "%s", em_last_error());
  em_clear_error();
  em_mark_static(x, 1);
  em_mark_dynamic(x, 1);
  cr_assert(strstr(em_last_error(), "marked static"), "%s", em_last_error());
  em_clear_error();
  cr_assert_null(em_compile(mlp_forward, &(em_compile_options){.dynamic = (em_dynamic)7}));
  cr_assert(strstr(em_last_error(), "unknown dynamic setting"), "%s", em_last_error());
  em_clear_error();
}

/* EM_DYNAMIC_NEVER: one entry per size (the old behaviour); em_mark_static keeps a dim fixed
 * under EM_DYNAMIC_ALWAYS. */
ETEST(dynamic, never_and_mark_static) {
  em_manual_seed(3);
  mlp m;
  mlp_init(&m);
  em_compiled *never = em_compile(mlp_forward, &(em_compile_options){.backend = "eager", .dynamic = EM_DYNAMIC_NEVER});
  em_compiled *always = em_compile(mlp_forward, &(em_compile_options){.backend = "eager", .dynamic = EM_DYNAMIC_ALWAYS});
  for (int64_t b = 3; b < 7; b++) {
    em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(b, 20)), *y = em_randint(0, 5, EM_SHAPE(b));
    em_mark_static(y, 0);
    em_outputs e = mlp_forward(&m, (em_tensor *[]){x, y}, 2);
    expect_close(em_call(never, &m, x, y).t[0], e.t[0], "eager", "never");
    expect_close(em_call(always, &m, x, y).t[0], e.t[0], "eager", "always");
    em_scope_end();
  }
  cr_assert_eq(em_compiled_stats(never).traces, 4);
  cr_assert_eq(em_compiled_stats(never).dynamic_entries, 0);
  /* x's batch dim is symbolic, y's is fixed: the shared size cannot vary, every size retraces */
  cr_assert_eq(em_compiled_stats(always).traces, 4);
  em_compiled_free(never);
  em_compiled_free(always);
}

/* ---- a causal self-attention LM over [B, T] token ids: B * T reshapes, slices, arange inside
 * the attention composite; trained with AdamW inside fn ---- */

enum { C = 16, NH = 2, V = 11 };
typedef struct lm {
  em_tensor *wqkv, *emb;
  em_optimizer *opt;
} lm;

static em_outputs lm_step(void *ctx, em_tensor *const *in, int n) {
  lm *a = ctx;
  int64_t B = em_size(in[0], 0), T = em_size(in[0], 1);
  em_tensor *x = em_embedding(in[0], a->emb);
  em_tensor *qkv = em_matmul(x, a->wqkv);
  em_tensor *h[3];
  for (int i = 0; i < 3; i++)
    h[i] = em_permute(em_reshape(em_slice(qkv, 2, i * C, (i + 1) * C, 1), EM_SHAPE(B, T, NH, C / NH)), EM_AXES(0, 2, 1, 3));
  em_tensor *y = em_scaled_dot_product_attention(h[0], h[1], h[2], true, 0.0, 0.0);
  y = em_reshape(em_permute(y, EM_AXES(0, 2, 1, 3)), EM_SHAPE(B, T, C));
  em_tensor *logits = em_matmul(em_add(y, x), em_transpose(a->emb, 0, 1));
  em_tensor *loss = em_cross_entropy(em_reshape(logits, EM_SHAPE(B * T, V)), em_reshape(in[1], EM_SHAPE(B * T)),
                                     EM_CROSS_ENTROPY_DEFAULT);
  /* the last position's logits: a slice whose bounds are T - 1 and T */
  em_tensor *last = em_slice(logits, 1, T - 1, T, 1);
  if (a->opt) {
    em_optimizer_zero_grad(a->opt);
    em_backward(loss, NULL);
    em_optimizer_step(a->opt);
  }
  return EM_OUTPUTS(loss, last);
}

static void lm_init(lm *a, bool train) {
  em_manual_seed(4);
  a->wqkv = em_retain(em_requires_grad_(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(C, 3 * C)), 0.2), true));
  a->emb = em_retain(em_requires_grad_(em_randn(EM_F32, EM_SHAPE(V, C)), true));
  em_tensor *p[2] = {a->wqkv, a->emb};
  a->opt = train ? em_adamw_new(2, p, EM_ADAMW_DEFAULT(0.01)) : NULL;
}

static void lm_free(lm *a) {
  em_optimizer_free(a->opt);
  em_release(a->wqkv);
  em_release(a->emb);
}

/* Batch and sequence length both vary (two symbols, B * T among the formulas); training steps
 * keep the parameters equal to eager training's. */
static void transformer_sweep(void) {
  /* the reference is op by op: eager fusion's kernels round otherwise than backend eager */
  em_eager_fusion_config(0, -1);
  for (int bi = 0; bi < 3; bi++)
    for (int train = 0; train < 2; train++) {
      lm a[2];
      em_scope_begin();
      lm_init(&a[0], train), lm_init(&a[1], train);
      em_scope_end();
      em_compiled *c = em_compile(lm_step, &(em_compile_options){.backend = BACKENDS[bi], .name = "lm"});
      int ts[] = {8, 12, 5, 33, 2, 17, 40, 3, 12, 64, 7};
      for (int i = 0; i < 11; i++) {
        em_scope_begin();
        int64_t b = 2 + i % 3, t = ts[i];
        em_tensor *x = em_randint(0, V, EM_SHAPE(b, t)), *y = em_randint(0, V, EM_SHAPE(b, t));
        em_outputs e = lm_step(&a[0], (em_tensor *[]){x, y}, 2);
        em_outputs o = em_call(c, &a[1], x, y);
        cr_assert_eq(o.n, 2, "%s", em_last_error() ? em_last_error() : "");
        expect_close(o.t[0], e.t[0], BACKENDS[bi], "loss");
        expect_close(o.t[1], e.t[1], BACKENDS[bi], "last logits");
        em_scope_end();
      }
      expect_close(a[1].wqkv, a[0].wqkv, BACKENDS[bi], "trained weights");
      em_compile_stats s = em_compiled_stats(c);
      /* training: the first step makes AdamW's state (not cached), then one specialized entry
       * and one dynamic entry in two symbols */
      cr_assert_eq(s.entries, 2, "%s train=%d: %lld entries", BACKENDS[bi], train, (long long)s.entries);
      cr_assert_eq(s.traces, 2 + train, "%s train=%d: %lld traces", BACKENDS[bi], train, (long long)s.traces);
      cr_assert_eq(s.dynamic_entries, 1);
      em_compiled_free(c);
      lm_free(&a[0]), lm_free(&a[1]);
    }
}

ETEST(dynamic, transformer_batch_and_length_sweep_with_training) { transformer_sweep(); }

ETEST(dynamic, transformer_sweep_compiled_kernels) {
  setenv("EMBER_DYNAMIC_COMPILE_AFTER", "1", 1);
  transformer_sweep();
}

/* ---- what stays specialized, and stays right ---- */

static em_outputs branchy(void *ctx, em_tensor *const *in, int n) {
  int64_t T = em_size(in[0], 0);
  if (T > 20) return EM_OUTPUTS(em_mul_scalar(in[0], 2)); /* a branch on a size */
  return EM_OUTPUTS(em_neg(in[0]));
}

static em_outputs halves(void *ctx, em_tensor *const *in, int n) {
  int64_t T = em_size(in[0], 0);
  return EM_OUTPUTS(em_sum(em_reshape(in[0], EM_SHAPE(2, T / 2)), EM_AXES(0), false)); /* a division */
}

static em_outputs square(void *ctx, em_tensor *const *in, int n) {
  int64_t T = em_size(in[0], 0);
  return EM_OUTPUTS(em_add_scalar(in[0], (double)(T * T))); /* a square, as a scalar */
}

static em_outputs scaled(void *ctx, em_tensor *const *in, int n) {
  int64_t T = em_size(in[0], 0);
  return EM_OUTPUTS(em_mul_scalar(in[0], 1.0 / (double)T)); /* a fraction of a size */
}

static em_outputs growing(void *ctx, em_tensor *const *in, int n) {
  /* a KV-cache step: the cache [T, 4] grows by the new row; T + 1 rows come out */
  em_tensor *parts[2] = {in[0], in[1]};
  em_tensor *cache = em_cat(2, parts, 0);
  em_tensor *w = em_softmax(em_sum(em_mul(cache, in[1]), EM_AXES(1), false), 0);
  return EM_OUTPUTS(cache, em_sum(em_mul(em_unsqueeze(w, 1), cache), EM_AXES(0), false));
}

ETEST(dynamic, size_dependent_programs_stay_specialized_and_right) {
  struct {
    em_model_fn fn;
    const char *why;
  } cases[] = {{branchy, "differs at other sizes"}, {halves, "not a polynomial"}, {square, "follows no formula"},
               {scaled, "fraction"}};
  for (int k = 0; k < 4; k++) {
    em_compiled *c = em_compile(cases[k].fn, &(em_compile_options){.backend = "eager"});
    int64_t ts[] = {8, 12, 40, 30, 14, 8};
    for (int i = 0; i < 6; i++) {
      em_scope_begin();
      em_tensor *x = em_randn(EM_F32, EM_SHAPE(ts[i]));
      expect_close(em_call(c, NULL, x).t[0], cases[k].fn(NULL, (em_tensor *[]){x}, 1).t[0], "eager", cases[k].why);
      em_scope_end();
    }
    em_compile_stats s = em_compiled_stats(c);
    if (k == 0) { /* the branch: 12 gets an entry for 2..20, where the program is one (above 20 it grows a node,
                   * the probes narrow to the sizes that trace alike); 40 and 30 specialize */
      cr_assert_eq(s.dynamic_entries, 1, "case 0: %lld dynamic entries", (long long)s.dynamic_entries);
      cr_assert_eq(s.traces, 4, "case 0: %lld traces", (long long)s.traces);
      em_compiled_free(c);
      continue;
    }
    cr_assert_eq(s.dynamic_entries, 0, "case %d made a dynamic entry", k);
    cr_assert_eq(s.traces, 5, "case %d: one entry per size, %lld traces", k, (long long)s.traces);
    em_compiled_free(c);
  }
}

/* A decoding step whose cache grows one row a call: one dynamic entry serves every length. */
ETEST(dynamic, growing_cache_reuses_one_entry) {
  em_compiled *c = em_compile(growing, &(em_compile_options){.backend = "inductor"});
  em_manual_seed(5);
  em_tensor *cache = em_retain(em_randn(EM_F32, EM_SHAPE(2, 4)));
  for (int step = 0; step < 30; step++) {
    em_scope_begin();
    em_tensor *row = em_randn(EM_F32, EM_SHAPE(1, 4));
    em_outputs e = growing(NULL, (em_tensor *[]){cache, row}, 2);
    em_outputs o = em_call(c, NULL, cache, row);
    expect_close(o.t[0], e.t[0], "inductor", "cache");
    expect_close(o.t[1], e.t[1], "inductor", "attention");
    em_release(cache);
    cache = em_retain(o.t[0]);
    em_scope_end();
  }
  em_release(cache);
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.traces, 2, "%lld traces", (long long)s.traces);
  cr_assert_eq(s.dynamic_entries, 1);
  em_compiled_free(c);
}

/* Duck sizing: x [B, 20] and y [B] share s0, and the entry guards that they stay equal. */
ETEST(dynamic, shared_symbol_guards_equality) {
  em_compiled *c = em_compile(mlp_forward, &(em_compile_options){.backend = "eager", .dynamic = EM_DYNAMIC_ALWAYS});
  mlp m;
  em_manual_seed(6);
  mlp_init(&m);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(6, 20)), *y = em_randint(0, 5, EM_SHAPE(6));
  cr_assert_not_null(em_call(c, &m, x, y).t[0]);
  /* y shorter than x: the guard fails and the new trace raises eager's error */
  em_outputs o = em_call(c, &m, em_randn(EM_F32, EM_SHAPE(7, 20)), y);
  cr_assert_null(o.t[0]);
  cr_assert(em_last_error() != NULL);
  em_clear_error();
  cr_assert_eq(em_compiled_stats(c).dynamic_entries, 1);
  em_compiled_free(c);
}

/* The guards of a dynamic entry, as EMBER_LOGS=guards prints them, name the symbols. */
ETEST(dynamic, guards_are_relations) {
  setenv("EMBER_LOGS", "guards,dynamic", 1);
  void fe_log_reload(void);
  fe_log_reload();
  char path[] = "/tmp/ember_dyn_XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  em_compiled *c = em_compile(mlp_forward, &(em_compile_options){.backend = "eager"});
  mlp m;
  mlp_init(&m);
  for (int64_t b = 4; b < 7; b++) {
    em_scope_begin();
    em_call(c, &m, em_randn(EM_F32, EM_SHAPE(b, 20)), em_randint(0, 5, EM_SHAPE(b)));
    em_scope_end();
  }
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  unsetenv("EMBER_LOGS");
  fe_log_reload();
  FILE *f = fdopen(fd, "r");
  fseek(f, 0, SEEK_SET);
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  unlink(path);
  cr_assert(strstr(text, "inputs[0]: f32[s0,20] contiguous"), "%s", text);
  cr_assert(strstr(text, "inputs[1]: i64[s0] contiguous"), "%s", text);
  cr_assert(strstr(text, "2 <= s0 <= 65536"), "%s", text);
  cr_assert(strstr(text, "shape[0] = s0"), "the formulas are logged: %s", text);
  em_compiled_free(c);
}

/* em_explain with a dim marked dynamic shows the symbolic guards and the formulas with the
 * user's lines; a size-dependent program says why its sizes stay specialized. */
ETEST(dynamic, explain_shows_symbols_and_refusals) {
  mlp m;
  em_manual_seed(7);
  mlp_init(&m);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(6, 20)), *y = em_randint(0, 5, EM_SHAPE(6));
  em_mark_dynamic(x, 0), em_mark_dynamic(y, 0);
  em_explanation *ex = em_explain(mlp_forward, &m, x, y);
  cr_assert_not_null(ex, "%s", em_last_error() ? em_last_error() : "");
  cr_assert(strstr(ex->text, "inputs[0]: f32[s0,20] contiguous"), "%s", ex->text);
  cr_assert(strstr(ex->text, "symbolic sizes"), "%s", ex->text);
  cr_assert(strstr(ex->text, "test_dynamic.c:"), "formulas name the user's lines: %s", ex->text);
  em_explanation_free(ex);
  em_tensor *z = em_randn(EM_F32, EM_SHAPE(12));
  em_mark_dynamic(z, 0);
  ex = em_explain(halves, NULL, z);
  cr_assert_not_null(ex);
  cr_assert(strstr(ex->text, "sizes stay specialized"), "%s", ex->text);
  em_explanation_free(ex);
}

/* Tiers: at a size new to a dynamic entry the first two calls run op by op, the third compiles
 * it, and later calls replay the compiled graph; a size that alternates with another keeps its
 * graph. */
ETEST(dynamic, a_recurring_size_is_compiled_at_its_third_call) {
  em_manual_seed(8);
  mlp m;
  mlp_init(&m);
  em_compiled *c = em_compile(mlp_forward, &(em_compile_options){.backend = "inductor"});
  int64_t sizes[] = {4, 5, 9, 9, 9, 9, 11, 9, 11, 11, 9};
  for (int i = 0; i < 11; i++) {
    em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(sizes[i], 20)), *y = em_randint(0, 5, EM_SHAPE(sizes[i]));
    em_outputs e = mlp_forward(&m, (em_tensor *[]){x, y}, 2);
    expect_close(em_call(c, &m, x, y).t[0], e.t[0], "inductor", "loss");
    em_scope_end();
  }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.traces, 2);
  /* 9: its first call is the entry's validating call (traced again, compiled), its next two run
   * op by op (one graph), the third finds the compiled graph; 11: op by op twice, compiled at
   * its third call */
  cr_assert_eq(s.dynamic_op_by_op, 2, "%lld op-by-op graphs", (long long)s.dynamic_op_by_op);
  cr_assert_eq(s.graphs_compiled, 4, "4 and 5 (the traces) and 9 and 11: %lld", (long long)s.graphs_compiled);
  em_compiled_free(c);
}

/* More sizes than the graph cache holds (64), each called twice: graphs are evicted and their
 * memory reused for graphs of other sizes; a size's remembered graph must not be taken for
 * another's (a pointer to an evicted graph came back as a graph of another size: the bench's
 * sweep failed an input check; the check is the graph's unique id). */
ETEST(dynamic, sizes_beyond_the_graph_cache_keep_their_own_graphs) {
  em_manual_seed(9);
  mlp m;
  mlp_init(&m);
  em_compiled *c = em_compile(mlp_forward, &(em_compile_options){.backend = "eager"});
  for (int pass = 0; pass < 2; pass++)
    for (int64_t b = 2; b < 102; b++) {
      em_scope_begin();
      int64_t n = 2 + (b * 37) % 100;
      em_tensor *x = em_randn(EM_F32, EM_SHAPE(n, 20)), *y = em_randint(0, 5, EM_SHAPE(n));
      em_outputs e = mlp_forward(&m, (em_tensor *[]){x, y}, 2);
      em_outputs o = em_call(c, &m, x, y);
      cr_assert_not_null(o.t[0], "size %lld: %s", (long long)n, em_last_error() ? em_last_error() : "");
      expect_close(o.t[1], e.t[1], "eager", "logits");
      em_scope_end();
    }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.traces, 2);
  cr_assert(s.graph_cache_evictions > 0, "the cache must have evicted graphs for this test to mean anything");
  em_compiled_free(c);
}

/* A function that only runs up to a size (a position table of 16 rows sliced at T): the probes
 * fit below the first size it fails at, the range ends there, and the guard says why with the
 * user's line. */
static em_outputs positional(void *ctx, em_tensor *const *in, int n) {
  int64_t T = em_size(in[0], 0);
  return EM_OUTPUTS(em_add(in[0], em_slice((em_tensor *)ctx, 0, 0, T, 1)));
}

ETEST(dynamic, a_bounded_function_gets_a_fitted_range) {
  em_tensor *table = em_randn(EM_F32, EM_SHAPE(16, 4));
  em_compiled *c = em_compile(positional, &(em_compile_options){.backend = "eager"});
  int64_t ts[] = {5, 6, 9, 16, 2, 12};
  for (int i = 0; i < 6; i++) {
    em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(ts[i], 4));
    expect_close(em_call(c, table, x).t[0], positional(table, (em_tensor *[]){x}, 1).t[0], "eager", "positional");
    em_scope_end();
  }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.traces, 2, "%lld traces", (long long)s.traces);
  cr_assert_eq(s.dynamic_entries, 1);
  /* 17 is past the table: eager's error, through a recompile whose log names the fitted range */
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(17, 4));
  cr_assert_null(em_call(c, table, x).t[0]);
  cr_assert(em_last_error() != NULL);
  em_clear_error();
  em_explanation *ex = NULL;
  em_tensor *y = em_randn(EM_F32, EM_SHAPE(6, 4));
  em_mark_dynamic(y, 0);
  ex = em_explain(positional, table, y);
  cr_assert_not_null(ex);
  cr_assert(strstr(ex->text, "<= s0 <= 16 (fn fails at 17: ") && strstr(ex->text, "test_dynamic.c:"), "%s", ex->text);
  em_explanation_free(ex);
  em_compiled_free(c);
}

/* Kernels of a dynamic entry read their sizes from a table at run time: the graph compiled at
 * other sizes is the same LLVM IR, found in the kernel cache instead of compiled again. Rows of
 * softmax and a layer norm (row kernels) and pointwise ops over [s0, 40]. */
static em_outputs rows_fn(void *ctx, em_tensor *const *in, int n) {
  em_tensor *h = em_softmax(em_mul_scalar(in[0], 0.5), 1);
  h = em_layer_norm(em_add(h, em_tanh(in[0])), 1, EM_NONE, EM_NONE, 1e-5);
  return EM_OUTPUTS(em_sum(em_mul(h, in[0]), EM_AXES(1), false));
}

ETEST(dynamic, sizes_as_kernel_arguments_share_one_module) {
  setenv("EMBER_DYNAMIC_COMPILE_AFTER", "1", 1);
  em_compiled *c = em_compile(rows_fn, &(em_compile_options){.backend = "inductor"});
  int64_t sizes[] = {37, 50, 41, 77, 123, 64, 90, 200};
  int64_t modules = 0;
  for (int i = 0; i < 8; i++) {
    em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(sizes[i], 40));
    expect_close(em_call(c, NULL, x).t[0], rows_fn(NULL, (em_tensor *[]){x}, 1).t[0], "inductor", "rows");
    em_scope_end();
    if (i == 3) modules = em_kernel_cache_info().modules; /* the trace, the check, two sizes as arguments */
  }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.dynamic_entries, 1);
  cr_assert_eq(s.graphs_compiled, 8, "every size compiled (EMBER_DYNAMIC_COMPILE_AFTER=1): %lld", (long long)s.graphs_compiled);
  cr_assert_eq(em_kernel_cache_info().modules, modules, "four more sizes loaded %lld new kernel modules",
               (long long)(em_kernel_cache_info().modules - modules));
  em_compiled_free(c);
}

/* What no probe can see (a branch taken at one size only): the first call at every new size
 * traces fn for real and compares, so the miss is found there, with that call's results right;
 * the entry is dropped and the function specializes from then on. */
static em_outputs nine(void *ctx, em_tensor *const *in, int n) {
  int64_t T = em_size(in[0], 0);
  return EM_OUTPUTS(T == 9 ? em_neg(in[0]) : em_mul_scalar(in[0], 3));
}

ETEST(dynamic, a_branch_the_probes_miss_is_caught_at_its_size) {
  em_compiled *c = em_compile(nine, &(em_compile_options){.backend = "eager"});
  int64_t ts[] = {4, 5, 6, 9, 7, 9, 12};
  for (int i = 0; i < 7; i++) {
    em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(ts[i]));
    em_outputs o = em_call(c, NULL, x);
    cr_assert_not_null(o.t[0], "size %lld: %s", (long long)ts[i], em_last_error() ? em_last_error() : "");
    expect_close(o.t[0], nine(NULL, (em_tensor *[]){x}, 1).t[0], "eager", "nine");
    em_scope_end();
  }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.dynamic_entries, 1);
  cr_assert_eq(s.dynamic_misses, 1, "%lld misses", (long long)s.dynamic_misses);
  em_compiled_free(c);
}
