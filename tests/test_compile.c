/* tests/test_compile.c: em_compile end to end: capture, replay, guards and recompiles, lifted
 * parameters, graph breaks of every kind with their sites, fullgraph, em_explain, logs and
 * dumps; backend "eager" equal to eager execution bit for bit, on composites and on training
 * steps; the tracer's handling of autograd (em_grad traced, outputs differentiable). */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp, dup */
#include "common.h"

/* Tests that compare with eager bit for bit use backend "eager" (the traced graph, run by the
 * eager kernels); the default backend, inductor, is compared within tolerances in
 * test_inductor. */
static const em_compile_options EXACT = {.backend = "eager"};

#include <unistd.h>

void fe_log_reload(void); /* frontend/log.c: re-reads EMBER_LOGS */


/* ---- an MLP: loss and logits ---- */

typedef struct mlp {
  em_linear_layer l1, l2;
} mlp;

static em_outputs mlp_forward(void *ctx, em_tensor *const *in, int n) {
  mlp *m = ctx;
  em_tensor *h = em_relu(em_linear(in[0], m->l1.weight, m->l1.bias));
  em_tensor *logits = em_linear(h, m->l2.weight, m->l2.bias);
  em_tensor *loss = em_cross_entropy(logits, in[1], EM_CROSS_ENTROPY_DEFAULT);
  return EM_OUTPUTS(loss, logits);
}

static void mlp_init(mlp *m, int in, int hidden, int out) {
  cr_assert(em_linear_layer_init(&m->l1, in, hidden, true) && em_linear_layer_init(&m->l2, hidden, out, true));
}

ETEST(compile, replay_equals_eager_and_skips_fn) {
  em_manual_seed(1);
  mlp m;
  mlp_init(&m, 20, 16, 5);
  em_compiled *c = em_compile(mlp_forward, &(em_compile_options){.backend = EXACT.backend, .name = "mlp"});
  cr_assert_not_null(c);
  for (int i = 0; i < 5; i++) {
    em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(8, 20));
    em_tensor *y = em_randint(0, 5, EM_SHAPE(8));
    em_outputs e = mlp_forward(&m, (em_tensor *[]){x, y}, 2);
    em_outputs o = em_call(c, &m, x, y);
    cr_assert_eq(o.n, 2);
    EXPECT_SAME_BITS(o.t[0], e.t[0], "loss");
    EXPECT_SAME_BITS(o.t[1], e.t[1], "logits");
    em_scope_end();
  }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.calls, 5);
  cr_assert_eq(s.traces, 1, "traced %lld times", (long long)s.traces);
  cr_assert_eq(s.checks, 1, "the second call validated the entry (traced again and compared)");
  cr_assert_eq(s.replays, 3);
  cr_assert_eq(s.entries, 1);
  cr_assert_eq(s.recompiles, 0);
  em_compiled_free(c);
}

ETEST(compile, outputs_are_differentiable) {
  em_manual_seed(2);
  mlp m;
  mlp_init(&m, 6, 5, 3);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(4, 6));
  em_tensor *y = em_randint(0, 3, EM_SHAPE(4));
  em_tensor *params[4] = {m.l1.weight, m.l1.bias, m.l2.weight, m.l2.bias};
  em_tensor *eager[4];
  cr_assert(em_backward(mlp_forward(&m, (em_tensor *[]){x, y}, 2).t[0], NULL));
  for (int i = 0; i < 4; i++) eager[i] = em_clone(em_get_grad(params[i])), em_zero_grad(params[i]);
  em_compiled *c = em_compile(mlp_forward, &EXACT);
  for (int call = 0; call < 2; call++) { /* trace, then replay */
    em_outputs o = em_call(c, &m, x, y);
    cr_assert(em_backward(o.t[0], NULL), "%s", em_last_error() ? em_last_error() : "");
    for (int i = 0; i < 4; i++) EXPECT_SAME_BITS(em_get_grad(params[i]), eager[i], "grad"), em_zero_grad(params[i]);
  }
  em_compiled_free(c);
}

/* ---- guards ---- */

static em_outputs double_it(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_mul_scalar(in[0], 2));
}

ETEST(compile, guards_recompile_on_each_kind_of_change) {
  /* sizes specialized here; symbolic sizes are test_dynamic's */
  em_compiled *c = em_compile(double_it, &(em_compile_options){.dynamic = EM_DYNAMIC_NEVER});
  em_tensor *a = em_ones(EM_F32, EM_SHAPE(3, 4));
  em_call(c, NULL, a);
  em_call(c, NULL, em_ones(EM_F32, EM_SHAPE(3, 4))); /* another tensor, same guards: a hit */
  cr_assert_eq(em_compiled_stats(c).traces, 1);
  em_call(c, NULL, em_ones(EM_F32, EM_SHAPE(5, 4))); /* sizes */
  em_call(c, NULL, em_ones(EM_F64, EM_SHAPE(3, 4))); /* dtype */
  em_call(c, NULL, em_transpose(em_ones(EM_F32, EM_SHAPE(4, 3)), 0, 1)); /* strides */
  em_call(c, NULL, em_requires_grad_(em_ones(EM_F32, EM_SHAPE(3, 4)), true)); /* requires_grad */
  em_no_grad_begin();
  em_call(c, NULL, a); /* grad mode */
  em_no_grad_end();
  em_call(c, (void *)c, a); /* ctx */
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.traces, 7, "traces %lld", (long long)s.traces);
  cr_assert_eq(s.recompiles, 6);
  cr_assert_eq(s.entries, 7);
  /* every entry is still reachable */
  em_call(c, NULL, em_ones(EM_F32, EM_SHAPE(5, 4)));
  cr_assert_eq(em_compiled_stats(c).traces, 7);
  em_compiled_free(c);
}

ETEST(compile, recompile_limit_falls_back_to_eager) {
  em_compiled *c = em_compile(double_it, &(em_compile_options){.recompile_limit = 2, .dynamic = EM_DYNAMIC_NEVER});
  for (int n = 1; n <= 5; n++) {
    em_outputs o = em_call(c, NULL, em_ones(EM_F32, EM_SHAPE(n)));
    EXPECT_ALL(o.t[0], EM_F32, SHAPE(n), 0, 2);
  }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.entries, 2);
  cr_assert_eq(s.traces, 2);
  cr_assert_eq(s.eager_calls, 3);
  em_compiled_free(c);
}

static em_outputs use_param(void *ctx, em_tensor *const *in, int n) {
  em_tensor **w = ctx;
  return EM_OUTPUTS(em_mul(in[0], *w));
}

/* A tensor owned by the caller alone (no scope), as a model's parameters usually are. */
static em_tensor *owned_full(double v) {
  em_scope_begin();
  em_tensor *t = em_retain(em_full(EM_F32, EM_SHAPE(3), v));
  em_scope_end();
  return t;
}

ETEST(compile, lifted_parameter_identity_guard) {
  em_tensor *w = owned_full(2.0);
  em_compiled *c = em_compile(use_param, NULL);
  em_tensor *x = em_ones(EM_F32, EM_SHAPE(3));
  EXPECT_ALL(em_call(c, &w, x).t[0], EM_F32, SHAPE(3), 0, 2);
  /* the parameter's data changes in place: the entry reads it at replay */
  em_fill_(w, 3.0);
  EXPECT_ALL(em_call(c, &w, x).t[0], EM_F32, SHAPE(3), 0, 3);
  cr_assert_eq(em_compiled_stats(c).traces, 1);
  /* the parameter is replaced: freeing the old one kills the entry; the new one is traced */
  em_release(w);
  w = owned_full(5.0);
  EXPECT_ALL(em_call(c, &w, x).t[0], EM_F32, SHAPE(3), 0, 5);
  cr_assert_eq(em_compiled_stats(c).traces, 2);
  cr_assert_eq(em_compiled_stats(c).entries, 1, "the dead entry was dropped");
  /* requires_grad of a lifted parameter is guarded */
  em_requires_grad_(w, true);
  em_outputs o = em_call(c, &w, x);
  cr_assert(em_requires_grad(o.t[0]));
  cr_assert_eq(em_compiled_stats(c).traces, 3);
  em_release(w);
  em_compiled_free(c);
}

/* ---- graph breaks ---- */

static int break_line;
static int break_kind;
static em_tensor *break_part; /* a slice of a real tensor, for the in-place break */

static em_outputs opaque_double(void *ctx, em_tensor *const *in, int n) {
  float *p = em_data_ptr(in[0]); /* real data here */
  em_tensor *r = em_clone(in[0]);
  if (!r) return EM_OUTPUTS(NULL);
  float *q = em_data_ptr(r);
  for (int64_t i = 0; i < em_numel(r); i++) q[i] = 2 * p[i];
  return EM_OUTPUTS(r);
}

/* One break of the chosen kind between two pieces of graph. */
static em_outputs with_break(void *ctx, em_tensor *const *in, int n) {
  em_tensor *a = em_exp(em_mul_scalar(in[0], 0.5));
  em_tensor *b = NULL;
  switch (break_kind) {
  case 0:
    break_line = __LINE__ + 1;
    b = em_item(em_sum(a, 0, NULL, false)) > 0 ? em_neg(a) : a; /* data-dependent control flow */
    break;
  case 1: {
    break_line = __LINE__ + 1;
    float *p = em_data_ptr(a);
    b = p[0] > 0 ? em_neg(a) : a;
    break;
  }
  case 2:
    break_line = __LINE__ + 1;
    b = em_cast(em_sum(em_nonzero(em_gt_scalar(a, 1.0)), 0, NULL, false), EM_F32);
    break;
  case 3:
    break_line = __LINE__ + 1;
    b = em_masked_select(a, em_gt_scalar(a, 1.0));
    break;
  case 4:
    break_line = __LINE__ + 1;
    b = em_call_opaque(opaque_double, NULL, a).t[0];
    break;
  case 5:
    break_line = __LINE__ + 1;
    em_graph_break();
    b = a;
    break;
  case 6: /* a write into a real tensor that is part of a bigger storage: not functionalized */
    break_line = __LINE__ + 1;
    em_add_scalar_(break_part, 1.0);
    b = a;
    break;
  }
  return EM_OUTPUTS(em_tanh(em_mul_scalar(b, 0.25)));
}

static const char *const break_ops[] = {"em_item", "em_data_ptr", "em_nonzero", "em_masked_select",
                                        "em_call_opaque", "em_graph_break", "em_add_scalar_"};
#define N_BREAK_KINDS 7

ETEST(compile, every_break_is_explained_with_its_site) {
  em_tensor *x = em_arange(EM_F32, -2, 2, 0.5);
  break_part = em_slice(em_zeros(EM_F32, EM_SHAPE(6)), 0, 1, 3, 1);
  for (break_kind = 0; break_kind < N_BREAK_KINDS; break_kind++) {
    em_explanation *e = em_explain(with_break, NULL, x);
    cr_assert_not_null(e, "kind %d: %s", break_kind, em_last_error() ? em_last_error() : "");
    cr_assert_eq(e->n_breaks, 1, "kind %d: %d breaks", break_kind, e->n_breaks);
    cr_assert_eq(e->n_graphs, 2, "kind %d: %d graphs", break_kind, e->n_graphs);
    cr_assert_str_eq(e->breaks[0].op, break_ops[break_kind]);
    cr_assert(strstr(e->breaks[0].file, "test_compile.c"), "file %s", e->breaks[0].file);
    cr_assert_eq(e->breaks[0].line, break_line, "kind %d: line %d, expected %d", break_kind, e->breaks[0].line,
                 break_line);
    cr_assert_str_eq(e->breaks[0].func, "with_break");
    cr_assert_gt(e->ops_per_graph[0], 0);
    cr_assert_gt(e->ops_per_graph[1], 0);
    char want[64];
    snprintf(want, sizeof want, "test_compile.c:%d in with_break", break_line);
    cr_assert(strstr(e->text, want), "text lacks '%s':\n%s", want, e->text);
    cr_assert(e->n_guards >= 4 && strstr(e->text, "inputs[0]: f32[8]"), "%s", e->text);
    em_explanation_free(e);
  }
}

ETEST(compile, breaks_equal_eager_and_compile_each_graph_once) {
  em_tensor *x = em_arange(EM_F32, -2, 2, 0.25);
  break_part = em_slice(em_zeros(EM_F32, EM_SHAPE(6)), 0, 1, 3, 1);
  for (break_kind = 0; break_kind < N_BREAK_KINDS; break_kind++) {
    em_compiled *c = em_compile(with_break, &EXACT);
    for (int i = 0; i < 10; i++) {
      em_scope_begin();
      em_tensor *xi = em_add_scalar(x, 0.1 + 0.01 * i); /* no element crosses 0: the data-dependent shapes stay put */
      em_tensor *want = with_break(NULL, &xi, 1).t[0];
      em_outputs o = em_call(c, NULL, xi);
      EXPECT_SAME_BITS(o.t[0], want, break_ops[break_kind]);
      em_scope_end();
    }
    em_compile_stats s = em_compiled_stats(c);
    cr_assert_eq(s.breaks, 10, "%s: %lld breaks", break_ops[break_kind], (long long)s.breaks);
    cr_assert_eq(s.graphs_compiled, 2, "%s: %lld graphs compiled over 10 calls", break_ops[break_kind],
                 (long long)s.graphs_compiled);
    cr_assert_eq(s.graph_cache_hits, 18);
    cr_assert_eq(s.replays, 0, "an entry with breaks re-runs fn");
    em_compiled_free(c);
  }
}

ETEST(compile, fullgraph_turns_a_break_into_an_error) {
  em_compiled *c = em_compile(with_break, &(em_compile_options){.fullgraph = true, .name = "strict"});
  break_kind = 0;
  em_clear_error();
  em_outputs o = em_call(c, NULL, em_ones(EM_F32, EM_SHAPE(4)));
  cr_assert_null(o.t[0]);
  const char *e = em_last_error();
  cr_assert_not_null(e);
  char want[64];
  snprintf(want, sizeof want, "test_compile.c:%d: em_item: graph break in strict", break_line);
  cr_assert(strstr(e, want), "error '%s' lacks '%s'", e, want);
  cr_assert(strstr(e, "fullgraph"), "%s", e);
  em_clear_error();
  cr_assert_eq(em_compiled_stats(c).entries, 0);
  em_compiled_free(c);
}

/* ---- composites: backend eager equals eager exactly ---- */

#include "composites.h"

ETEST(compile, every_composite_equals_eager_bit_for_bit) {
  em_manual_seed(3);
  em_tensor *x = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(5, 6)), true);
  em_tensor *w = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(6)), true);
  em_tensor *t = em_randint(0, 6, EM_SHAPE(5));
  for (composite = 0; composite < N_COMPOSITES; composite++) {
    em_scope_begin();
    em_compiled *c = em_compile(apply_composite, &EXACT);
    em_tensor *in[3] = {x, w, t};
    em_tensor *want = apply_composite(NULL, in, 3).t[0];
    for (int call = 0; call < 2; call++) {
      em_tensor *got = em_call_n(c, NULL, 3, in).t[0];
      cr_assert_not_null(got, "composite %d: %s", composite, em_last_error() ? em_last_error() : "");
      EXPECT_SAME_BITS(got, want, "composite");
      if (!em_requires_grad(want)) continue;
      /* and its gradient, through the interpreted graph's autograd history */
      em_tensor *seed = em_ones(EM_F32, em_ndim(want), em_sizes(want));
      em_tensor *ge[2], *gc[2];
      cr_assert(em_grad(1, &want, &seed, 2, ((em_tensor *[]){x, w}), ge, true, false));
      cr_assert(em_grad(1, &got, &seed, 2, ((em_tensor *[]){x, w}), gc, false, false));
      EXPECT_SAME_BITS(gc[0], ge[0], "grad x");
      EXPECT_SAME_BITS(gc[1], ge[1], "grad w");
    }
    /* one_hot reads its indices back to reject out-of-range ones: a graph break, so its entry
     * re-runs fn on the second call; every other composite replays */
    cr_assert_eq(em_compiled_stats(c).traces, composite == 19 ? 2 : 1, "composite %d", composite);
    cr_assert_eq(em_compiled_stats(c).breaks, composite == 19 ? 2 : 0, "composite %d", composite);
    em_compiled_free(c);
    em_scope_end();
  }
}

/* em_grad inside the function is traced, not a break. */
static em_outputs value_and_grad(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0];
  em_tensor *y = em_sum(em_mul(em_tanh(x), x), 0, NULL, false);
  em_tensor *g;
  em_grad(1, &y, NULL, 1, &x, &g, false, false);
  return EM_OUTPUTS(y, g);
}

ETEST(compile, em_grad_inside_is_traced) {
  em_tensor *x = em_requires_grad_(em_arange(EM_F32, -1, 1, 0.25), true);
  em_outputs want = value_and_grad(NULL, &x, 1);
  em_explanation *e = em_explain(value_and_grad, NULL, x);
  cr_assert_not_null(e);
  cr_assert_eq(e->n_breaks, 0);
  cr_assert_eq(e->n_graphs, 1);
  em_explanation_free(e);
  em_compiled *c = em_compile(value_and_grad, &EXACT);
  for (int i = 0; i < 3; i++) {
    em_outputs o = em_call(c, NULL, x);
    EXPECT_SAME_BITS(o.t[0], want.t[0], "value");
    EXPECT_SAME_BITS(o.t[1], want.t[1], "grad");
  }
  cr_assert_eq(em_compiled_stats(c).replays, 1);
  cr_assert_eq(em_compiled_stats(c).checks, 1);
  em_compiled_free(c);
}

/* Random ops draw the same numbers as eager, call after call. */
static em_outputs noisy(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_add(em_dropout(in[0], 0.5, true), em_randn(EM_F32, EM_SHAPE(16))));
}

ETEST(compile, random_ops_follow_the_generator) {
  em_tensor *x = em_ones(EM_F32, EM_SHAPE(16));
  em_compiled *c = em_compile(noisy, NULL);
  for (int i = 0; i < 3; i++) {
    em_manual_seed(40 + i);
    em_tensor *want = noisy(NULL, &x, 1).t[0];
    uint64_t s0, o0, s1, o1;
    em_rng_get_state(&s0, &o0);
    em_manual_seed(40 + i);
    em_tensor *got = em_call(c, NULL, x).t[0];
    em_rng_get_state(&s1, &o1);
    EXPECT_SAME_BITS(got, want, "random");
    cr_assert_eq(o1, o0, "the generator advanced by %llu, eager by %llu", (unsigned long long)o1, (unsigned long long)o0);
  }
  em_compiled_free(c);
}

/* A training step: compiled forward and loss, eager backward and SGD, as torch.compile on a
 * model would. The losses and parameters stay bit-identical to eager over 5 steps. */
ETEST(compile, training_steps_match_eager_bit_for_bit) {
  mlp m[2];
  em_optimizer *opt[2];
  for (int k = 0; k < 2; k++) {
    em_manual_seed(7);
    mlp_init(&m[k], 12, 10, 4);
    em_tensor *p[4] = {m[k].l1.weight, m[k].l1.bias, m[k].l2.weight, m[k].l2.bias};
    opt[k] = em_sgd_new(4, p, ((em_sgd_opts){0.1, 0.9, 0, 0, false}));
  }
  em_compiled *c = em_compile(mlp_forward, &EXACT);
  for (int step = 0; step < 5; step++) {
    em_scope_begin();
    em_manual_seed(100 + step);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(6, 12)), *y = em_randint(0, 4, EM_SHAPE(6));
    em_tensor *loss[2];
    loss[0] = mlp_forward(&m[0], (em_tensor *[]){x, y}, 2).t[0];
    loss[1] = em_call(c, &m[1], x, y).t[0];
    for (int k = 0; k < 2; k++) {
      em_optimizer_zero_grad(opt[k]);
      cr_assert(em_backward(loss[k], NULL) && em_optimizer_step(opt[k]), "%s", em_last_error());
    }
    EXPECT_SAME_BITS(loss[1], loss[0], "loss");
    em_scope_end();
  }
  EXPECT_SAME_BITS(m[1].l1.weight, m[0].l1.weight, "weight after 5 steps");
  cr_assert_eq(em_compiled_stats(c).traces, 1);
  for (int k = 0; k < 2; k++) em_optimizer_free(opt[k]);
  em_compiled_free(c);
}

/* A whole training step inside fn: forward, em_backward and the SGD update are one graph; the
 * parameter updates are functionalized and written back, .grad is rebound on replay. */
typedef struct step_ctx {
  mlp m;
  em_optimizer *opt;
} step_ctx;

static em_outputs whole_step(void *ctx, em_tensor *const *in, int n) {
  step_ctx *s = ctx;
  em_outputs o = mlp_forward(&s->m, in, n);
  em_optimizer_zero_grad(s->opt);
  em_backward(o.t[0], NULL);
  em_optimizer_step(s->opt);
  return EM_OUTPUTS(o.t[0]);
}

ETEST(compile, whole_training_step_is_one_graph) {
  step_ctx s[2];
  for (int k = 0; k < 2; k++) {
    em_manual_seed(8);
    mlp_init(&s[k].m, 12, 10, 4);
    em_tensor *p[4] = {s[k].m.l1.weight, s[k].m.l1.bias, s[k].m.l2.weight, s[k].m.l2.bias};
    s[k].opt = em_sgd_new(4, p, EM_SGD_DEFAULT(0.05));
  }
  em_compiled *c = em_compile(whole_step, &EXACT);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(6, 12)), *y = em_randint(0, 4, EM_SHAPE(6));
  for (int step = 0; step < 4; step++) {
    em_scope_begin();
    em_tensor *l0 = whole_step(&s[0], (em_tensor *[]){x, y}, 2).t[0];
    em_tensor *l1 = em_call(c, &s[1], x, y).t[0];
    EXPECT_SAME_BITS(l1, l0, "loss");
    em_scope_end();
  }
  EXPECT_SAME_BITS(s[1].m.l2.weight, s[0].m.l2.weight, "weights");
  em_compile_stats st = em_compiled_stats(c);
  cr_assert_eq(st.breaks, 0, "%lld breaks", (long long)st.breaks);
  cr_assert_eq(st.graphs_compiled, 1);
  cr_assert_eq(st.traces, 1);
  cr_assert_eq(st.replays + st.checks, 3);
  em_tensor *p0[4] = {s[0].m.l1.weight, s[0].m.l1.bias, s[0].m.l2.weight, s[0].m.l2.bias};
  em_tensor *p1[4] = {s[1].m.l1.weight, s[1].m.l1.bias, s[1].m.l2.weight, s[1].m.l2.bias};
  for (int k = 0; k < 4; k++) { /* the .grad bindings were replayed too */
    EXPECT_SAME_BITS(p1[k], p0[k], "parameter after the steps");
    EXPECT_SAME_BITS(em_get_grad(p1[k]), em_get_grad(p0[k]), "grad after the steps");
  }
  em_explanation *ex = em_explain(whole_step, &s[1], x, y); /* (it runs one more step on s[1]) */
  cr_assert(ex && ex->n_graphs == 1 && ex->n_breaks == 0, "forward, backward and update: one graph");
  em_explanation_free(ex);
  for (int k = 0; k < 2; k++) em_optimizer_free(s[k].opt);
  em_compiled_free(c);
}

/* ---- misuse ---- */

static em_tensor *escaped;
static em_outputs leaky(void *ctx, em_tensor *const *in, int n) {
  escaped = em_retain(em_neg(in[0]));
  return EM_OUTPUTS(em_neg(in[0]));
}

ETEST(compile, a_tensor_stored_outside_is_made_real_and_the_trace_not_cached) {
  em_compiled *c = em_compile(leaky, NULL);
  for (int i = 0; i < 2; i++) {
    em_call(c, NULL, em_full(EM_F32, EM_SHAPE(2), 3.0));
    /* the tensor fn stored in a static became real when the graph ran */
    EXPECT_ALL(em_add(escaped, escaped), EM_F32, SHAPE(2), 0, -6);
    em_release(escaped);
  }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.entries, 0, "a function that leaves new tensors outside is not replayed (its next call must rerun it)");
  cr_assert_eq(s.traces, 2);
  em_compiled_free(c);
  EXPECT_ERROR(em_compile(leaky, &(em_compile_options){.backend = "tvm"}), "unknown backend \"tvm\"");
}

static em_compiled *inner;
static em_outputs outer_fn(void *ctx, em_tensor *const *in, int n) {
  em_tensor *a = em_call(inner, NULL, in[0]).t[0];
  return EM_OUTPUTS(em_add_scalar(a, 1));
}

ETEST(compile, a_nested_compiled_call_is_inlined) {
  inner = em_compile(double_it, NULL);
  em_compiled *outer = em_compile(outer_fn, NULL);
  em_tensor *x = em_ones(EM_F32, EM_SHAPE(3));
  for (int i = 0; i < 2; i++) EXPECT_ALL(em_call(outer, NULL, x).t[0], EM_F32, SHAPE(3), 0, 3);
  cr_assert_eq(em_compiled_stats(inner).traces, 0);
  em_explanation *e = em_explain(outer_fn, NULL, x);
  cr_assert_eq(e->n_graphs, 1);
  em_explanation_free(e);
  em_compiled_free(outer);
  em_compiled_free(inner);
}

/* ---- data-dependent ops, eagerly ---- */

ETEST(compile, nonzero_and_masked_select) {
  em_tensor *x = T(EM_F32, SHAPE(2, 3), 0, 1, 0, 2, 0, 3);
  EXPECT(em_nonzero(x), EM_I64, SHAPE(3, 2), 0, 0, 1, 1, 0, 1, 2);
  em_tensor *w = em_requires_grad_(T(EM_F32, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), true);
  em_tensor *s = em_masked_select(w, em_gt_scalar(x, 0));
  EXPECT(s, EM_F32, SHAPE(3), 0, 2, 4, 6);
  cr_assert(em_backward(em_sum(s, 0, NULL, false), NULL));
  EXPECT(em_get_grad(w), EM_F32, SHAPE(2, 3), 0, 0, 1, 0, 1, 0, 1);
  EXPECT(em_masked_select(w, T(EM_BOOL, SHAPE(3), 1, 0, 1)), EM_F32, SHAPE(4), 0, 1, 3, 4, 6);
  EXPECT_ERROR(em_masked_select(w, x), "mask must be bool");
  EXPECT_ERROR(em_masked_select(w, em_ones(EM_BOOL, EM_SHAPE(4))), "do not broadcast");
}

/* ---- logs and dumps ---- */

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = calloc((size_t)n + 1, 1);
  if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
  fclose(f);
  return s;
}

ETEST(compile, logs_and_dumps) {
  char dir[] = "/tmp/ember-dump-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char logpath[256];
  snprintf(logpath, sizeof logpath, "%s/stderr.txt", dir);
  setenv("EMBER_LOGS", "graph,guards,recompiles,graph_breaks", 1);
  setenv("EMBER_DUMP_DIR", dir, 1);
  fe_log_reload();
  fflush(stderr);
  int saved = dup(2);
  cr_assert(freopen(logpath, "w", stderr));
  em_compiled *c = em_compile(with_break, &(em_compile_options){.name = "logged"});
  break_kind = 5;
  em_call(c, NULL, em_ones(EM_F32, EM_SHAPE(4)));
  em_call(c, NULL, em_ones(EM_F32, EM_SHAPE(6)));
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  unsetenv("EMBER_LOGS");
  unsetenv("EMBER_DUMP_DIR");
  fe_log_reload();
  char *log = read_file(logpath);
  cr_assert_not_null(log);
  char want[128];
  snprintf(want, sizeof want, "[ember:graph_breaks] graph break in logged at %s:%d in with_break: em_graph_break", __FILE__, break_line);
  cr_assert(strstr(log, want), "log lacks '%s':\n%s", want, log);
  cr_assert(strstr(log, "[ember:graph] graph 0 of logged"), "%s", log);
  cr_assert(strstr(log, "[ember:graph]   %3 : f32[4] = mul(%0, %2)"), "%s", log);
  cr_assert(strstr(log, "[ember:guards]   inputs[0]: f32[4] strides [1]"), "%s", log);
  cr_assert(strstr(log, "[ember:recompiles] Recompiling logged") && strstr(log, "inputs[0].sizes: expected [4], got [6]"),
            "%s", log);
  free(log);
  char path[512];
  snprintf(path, sizeof path, "%s/logged_0.txt", dir);
  char *txt = read_file(path);
  snprintf(path, sizeof path, "%s/logged_0.dot", dir);
  char *dot = read_file(path);
  cr_assert(txt && strstr(txt, "graph logged(%0 : f32[4])"), "%s", txt ? txt : "no text dump");
  cr_assert(dot && strstr(dot, "digraph") && strstr(dot, "exp\\nf32[4]"), "%s", dot ? dot : "no dot dump");
  free(txt), free(dot);
  em_compiled_free(c);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

/* ---- every allocation of a compiled call can fail, without a crash or a leak ---- */

static em_tensor *compiled_with_break(void) {
  em_compiled *c = em_compile(with_break, NULL);
  break_kind = 4; /* an opaque call: breaks, materializes, runs eagerly, resumes */
  em_tensor *x = em_arange(EM_F32, -1, 1, 0.5);
  em_tensor *r = em_call(c, NULL, x).t[0];
  if (r) r = em_call(c, NULL, x).t[0]; /* the entry with breaks re-runs fn; graphs come from the cache */
  em_compiled_free(c);
  return r;
}

static em_tensor *compiled_replay(void) {
  em_compiled *c = em_compile(value_and_grad, NULL);
  em_tensor *x = em_requires_grad_(em_arange(EM_F32, -1, 1, 0.5), true);
  em_tensor *r = em_call(c, NULL, x).t[1];
  if (r) r = em_call(c, NULL, x).t[1]; /* replay */
  em_compiled_free(c);
  return r;
}

ETEST(compile, every_allocation_can_fail) {
  struct {
    const char *name;
    em_tensor *(*f)(void);
  } ops[] = {{"with_break", compiled_with_break}, {"replay", compiled_replay}};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    int failures = etest_fail_each_allocation(ops[k].name, ops[k].f, 2000);
    cr_assert_gt(failures, 20, "%s: exercised %d failure points", ops[k].name, failures);
  }
}

/* ---- what an entry holds: constants made while tracing, outputs that are inputs ---- */

static em_outputs with_constant(void *ctx, em_tensor *const *in, int n) {
  em_tensor **w = ctx;
  static const float k[3] = {1, 10, 100};
  em_tensor *c = em_from_data(k, EM_F32, EM_SHAPE(3)); /* host data: a constant of the trace */
  return EM_OUTPUTS(em_mul(in[0], c), in[0], *w, em_transpose(in[1], 0, 1));
}

ETEST(compile, constants_passthrough_outputs_and_views) {
  em_tensor *w = owned_full(4.0);
  em_compiled *c = em_compile(with_constant, NULL);
  for (int i = 0; i < 3; i++) {
    em_tensor *x = em_full(EM_F32, EM_SHAPE(3), i + 1.0);
    em_tensor *m = em_ones(EM_F32, EM_SHAPE(2, 3));
    em_outputs o = em_call(c, &w, x, m);
    cr_assert_eq(o.n, 4);
    EXPECT(o.t[0], EM_F32, SHAPE(3), 0, i + 1.0, 10 * (i + 1.0), 100 * (i + 1.0));
    cr_assert_eq(o.t[1], x, "an input returned as is comes back as the same tensor");
    cr_assert_eq(o.t[2], w, "so does a parameter");
    cr_assert(em_shares_storage(o.t[3], m), "a view of an input stays a view, as in eager");
    EXPECT_ALL(o.t[3], EM_F32, SHAPE(3, 2), 0, 1);
  }
  cr_assert_eq(em_compiled_stats(c).traces, 1);
  cr_assert_eq(em_compiled_stats(c).replays + em_compiled_stats(c).checks, 2);
  em_compiled_free(c);
  em_release(w);
}

ETEST(compile, zero_inputs_and_bad_arguments) {
  em_compiled *c = em_compile(with_constant, NULL);
  em_clear_error();
  em_outputs o = em_call_n(c, NULL, 1, ((em_tensor *[]){NULL}));
  cr_assert_eq(o.n, 0);
  cr_assert_null(em_last_error(), "a NULL input propagates an earlier error silently");
  o = em_call_n(c, NULL, -1, NULL);
  cr_assert(o.n == 0 && em_last_error() && strstr(em_last_error(), "bad inputs"));
  em_clear_error();
  o = em_call_n((em_compiled *)NULL, NULL, 0, NULL);
  cr_assert(em_last_error() && strstr(em_last_error(), "the compiled function is NULL"));
  em_clear_error();
  EXPECT_ERROR(em_compile(NULL, NULL), "fn is NULL");
  em_compiled_free(c);
}

/* Issue 16 regression: two outputs that are distinct tensors in eager stay distinct when the
 * optimizer makes them one value (CSE of two equal expressions, x * 1 folded to x). Before,
 * both were one tensor (or the input itself), so an in-place write to one changed the other:
 * AdamW's per-parameter step counts, made by one em_scalar each, became one tensor. */
static em_outputs equal_outputs(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0];
  return EM_OUTPUTS(em_exp(x), em_exp(x), em_mul_scalar(x, 1), em_add_scalar(em_scalar(EM_F32, 0), 1),
                    em_add_scalar(em_scalar(EM_F32, 0), 1));
}

ETEST(compile, outputs_never_alias_where_eager_does_not) {
  static const char *backends[] = {"eager", "aot_eager", "inductor"};
  for (int b = 0; b < 3; b++) {
    em_compiled *c = em_compile(equal_outputs, &(em_compile_options){.backend = backends[b]});
    for (int call = 0; call < 2; call++) {
      em_tensor *x = T(EM_F32, SHAPE(3), 1, 2, 3);
      em_outputs o = em_call(c, NULL, x);
      cr_assert_eq(o.n, 5, "%s: %s", backends[b], em_last_error() ? em_last_error() : "");
      cr_assert(em_add_scalar_(o.t[0], 100) && em_add_scalar_(o.t[2], 100) && em_add_scalar_(o.t[3], 100));
      EXPECT(o.t[1], EM_F32, SHAPE(3), 1e-6, exp(1.0), exp(2.0), exp(3.0));
      EXPECT(x, EM_F32, SHAPE(3), 0, 1, 2, 3);
      EXPECT(o.t[4], EM_F32, SHAPE(), 0, 1);
    }
    em_compiled_free(c);
  }
}

/* Issue 16, finding 1: an RNN cell that stores its new hidden state into ctx and returns it.
 * Replaying would never update ctx (outputs 1, 1, 1, ... where eager counts 1, 2, 3, ...): such
 * a trace is not cached, so every call runs fn and sees the state the last call left. */
typedef struct rnn {
  em_tensor *h;
} rnn;
static em_outputs rnn_cell(void *ctx, em_tensor *const *in, int n) {
  rnn *r = ctx;
  em_tensor *h = em_add(r->h, in[0]);
  em_release(r->h);
  r->h = em_retain(h);
  return EM_OUTPUTS(h);
}

ETEST(compile, state_stored_into_ctx_is_never_replayed_stale) {
  static const char *backends[] = {"eager", "aot_eager", "inductor"};
  for (int b = 0; b < 3; b++) {
    rnn r = {em_retain(em_zeros(EM_F32, EM_SHAPE(2)))};
    em_compiled *c = em_compile(rnn_cell, &(em_compile_options){.backend = backends[b]});
    em_tensor *one = em_ones(EM_F32, EM_SHAPE(2));
    for (int step = 1; step <= 5; step++) {
      em_outputs o = em_call(c, &r, one);
      cr_assert_eq(o.n, 1, "%s", em_last_error() ? em_last_error() : "");
      EXPECT_ALL(o.t[0], EM_F32, SHAPE(2), 0, step);
      EXPECT_ALL(r.h, EM_F32, SHAPE(2), 0, step);
    }
    em_compile_stats st = em_compiled_stats(c);
    cr_assert_eq(st.replays, 0, "%s", backends[b]);
    cr_assert_eq(st.uncached_traces, 5, "%s: counted", backends[b]);
    em_release(r.h);
    em_compiled_free(c);
  }
}

/* Issue 16, finding 2: traced with two disjoint inputs, called with two overlapping slices of one
 * buffer; fn writes one in place and reads the other. The replay assumed no aliasing and
 * returned the values from before the write ([0 0 0 0] against eager's [2 2 0 0]); the storage
 * sharing pattern is now guarded, so the call recompiles and matches eager. */
static em_outputs write_then_read(void *ctx, em_tensor *const *in, int n) {
  em_add_scalar_(in[0], 2);
  return EM_OUTPUTS(em_mul_scalar(in[1], 1));
}

ETEST(compile, inputs_that_share_storage_are_guarded) {
  static const char *backends[] = {"eager", "aot_eager", "inductor"};
  for (int b = 0; b < 3; b++) {
    em_compiled *c = em_compile(write_then_read, &(em_compile_options){.backend = backends[b]});
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(4)), *y = em_zeros(EM_F32, EM_SHAPE(4));
    EXPECT(em_call(c, NULL, x, y).t[0], EM_F32, SHAPE(4), 0, 0, 0, 0, 0);
    em_tensor *buf = em_zeros(EM_F32, EM_SHAPE(6));
    em_tensor *a = em_slice(buf, 0, 2, 6, 1), *v = em_slice(buf, 0, 0, 4, 1); /* v[2:4] is a[0:2] */
    em_outputs o = em_call(c, NULL, a, v);
    cr_assert_not_null(o.t[0], "%s", em_last_error());
    EXPECT(o.t[0], EM_F32, SHAPE(4), 0, 0, 0, 2, 2);
    em_compile_stats st = em_compiled_stats(c);
    cr_assert_eq(st.recompiles, 1, "%s: the new aliasing pattern recompiles", backends[b]);
    /* and the disjoint pattern still replays its own entry */
    em_call(c, NULL, x, y);
    cr_assert_eq(em_compiled_stats(c).replays + em_compiled_stats(c).checks, st.replays + st.checks + 1, "%s", backends[b]);
    em_compiled_free(c);
  }
}

/* Found by the fuzzer (program 971031): called with x and a slice of x, a function whose
 * output is a view of x got a copy instead (the outputs' aliasing check took the slice's storage
 * for sharing eager does not have). A write through that output no longer reached x, and with a
 * graph break after the view, its gradient went through the copy's node, which changed the
 * order the backward added x's gradients in (1 ulp off eager's under backend "eager"). */
static em_outputs view_of_an_aliased_input(void *ctx, em_tensor *const *in, int n) {
  em_tensor *v = em_slice(in[0], 0, 0, 4, 1);
  em_tensor *s = em_silu(v); /* v is read four times: the order of their gradients matters */
  em_tensor *var = em_var(in[1], 0, NULL, 0, true);
  /* a graph break: v is an output of the graph before it, which reads both inputs */
  double m = em_item(em_mean(em_tanh(s), 0, NULL, false));
  return EM_OUTPUTS(v, em_sub(v, s), em_add_scalar(var, m), in[1], in[0]);
}

ETEST(compile, a_view_of_an_input_that_aliases_another_stays_a_view) {
  static const char *backends[] = {"eager", "aot_eager", "inductor"};
  for (int b = 0; b < 3; b++) {
    em_compiled *c = em_compile(view_of_an_aliased_input, &(em_compile_options){.backend = backends[b]});
    em_manual_seed(5);
    for (int call = 0; call < 40; call++) {
      em_tensor *x0 = em_randn(EM_F32, EM_SHAPE(5)), *w[5], *g[2];
      for (int k = 0; k < 5; k++) w[k] = em_randn(EM_F32, EM_SHAPE(k == 2 ? 1 : k == 3 ? 4 : k == 4 ? 5 : 4));
      for (int run = 0; run < 2; run++) { /* eager, then compiled */
        em_tensor *x = em_requires_grad_(em_clone(x0), true), *in[2] = {x, em_slice(x, 0, 1, 5, 1)};
        em_outputs o = run ? em_call_n(c, NULL, 2, in) : view_of_an_aliased_input(NULL, in, 2);
        cr_assert_eq(o.n, 5, "%s: %s", backends[b], em_last_error() ? em_last_error() : "");
        cr_assert(em_grad(5, o.t, w, 1, &x, &g[run], false, false), "%s", em_last_error());
        cr_assert_eq(em_data_ptr(o.t[0]), em_data_ptr(x), "%s, call %d: output 0 is a view of x", backends[b], call);
      }
      if (!strcmp(backends[b], "eager")) /* the same kernels in the same order: the same bits */
        cr_assert(!memcmp(em_data_ptr(g[0]), em_data_ptr(g[1]), 5 * sizeof(float)), "call %d: x's gradient differs from eager's", call);
      else
        for (int i = 0; i < 5; i++)
          cr_assert_float_eq(etest_at(g[1], i), etest_at(g[0], i), 1e-5, "%s, call %d: gradient element %d", backends[b], call, i);
    }
    em_compiled_free(c);
  }
}

/* Issue 16, finding 7: an op that fails on a path whose result fn does not use. The error was
 * raised on the tracing call only, and replays dropped it; now every call raises it, as eager. */
static em_outputs unused_failure(void *ctx, em_tensor *const *in, int n) {
  em_tensor *bad = em_matmul(in[0], in[0]); /* [2, 3] @ [2, 3]: inner dimensions differ */
  (void)bad;
  return EM_OUTPUTS(em_neg(in[0]));
}

ETEST(compile, an_error_while_tracing_is_raised_on_every_call) {
  em_compiled *c = em_compile(unused_failure, NULL);
  em_tensor *x = em_ones(EM_F32, EM_SHAPE(2, 3));
  for (int call = 0; call < 3; call++) {
    em_outputs o = em_call(c, NULL, x);
    cr_assert_not_null(o.t[0], "the unused failure does not stop the other outputs");
    EXPECT_ALL(o.t[0], EM_F32, SHAPE(2, 3), 0, -1);
    cr_assert(em_last_error() && strstr(em_last_error(), "em_matmul"), "call %d: %s", call,
              em_last_error() ? em_last_error() : "no error");
    em_clear_error();
  }
  cr_assert_eq(em_compiled_stats(c).replays, 0);
  em_compiled_free(c);
}

/* Issue 16, finding 8: two threads calling one compiled function raced on its entry cache (13
 * entries recorded for 12 shapes). Calls are now serialized: each distinct shape makes exactly
 * one entry, and every result is right. */
#include <pthread.h>
static em_compiled *shared_fn;
static void *call_many(void *arg) {
  long id = (long)arg;
  bool ok = true;
  for (int i = 0; i < 60 && ok; i++) {
    em_scope_begin();
    int64_t n = 1 + (i + id) % 6;
    em_tensor *x = em_full(EM_F32, EM_SHAPE(n), (double)i);
    em_tensor *y = em_call(shared_fn, NULL, x).t[0];
    ok = y && em_numel(y) == n && em_item(em_sum(y, 0, NULL, false)) == 2.0 * i * (double)n;
    em_scope_end();
  }
  em_thread_cleanup();
  return (void *)(intptr_t)ok;
}

ETEST(compile, calls_from_several_threads_are_serialized) {
  shared_fn = em_compile(double_it, &(em_compile_options){.dynamic = EM_DYNAMIC_NEVER});
  pthread_t th[4];
  for (long t = 0; t < 4; t++) cr_assert_eq(pthread_create(&th[t], NULL, call_many, (void *)t), 0);
  for (int t = 0; t < 4; t++) {
    void *ok;
    pthread_join(th[t], &ok);
    cr_assert(ok, "thread %d got a wrong result", t);
  }
  em_compile_stats st = em_compiled_stats(shared_fn);
  cr_assert_eq(st.entries, 6, "one entry per shape, got %lld", (long long)st.entries);
  cr_assert_eq(st.calls, 240);
  cr_assert_eq(st.traces, 6);
  em_compiled_free(shared_fn);
}

/* Issue 16, finding 3: host values fn reads (a training flag, a float field of ctx) were baked
 * into the replay silently. Declared with em_guard_value, they are guards: a change recompiles
 * (logged with the user's line and both values), a change back finds the first entry again. */
typedef struct cfg {
  int training;
  float scale;
} cfg;
static int guard_line;
static em_outputs configured(void *ctx, em_tensor *const *in, int n) {
  cfg *k = ctx;
  em_guard_value(&k->training, sizeof k->training), guard_line = __LINE__;
  em_guard_value(&k->scale, sizeof k->scale);
  em_tensor *y = em_mul_scalar(in[0], k->scale);
  return EM_OUTPUTS(k->training ? em_relu(y) : y);
}

ETEST(compile, guarded_host_values_recompile_when_they_change) {
  cfg k = {1, 2.0f};
  em_compiled *c = em_compile(configured, &(em_compile_options){.name = "configured"});
  em_tensor *x = T(EM_F32, SHAPE(2), -1, 3);
  char dir[] = "/tmp/ember-guard-XXXXXX", logpath[256];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(logpath, sizeof logpath, "%s/stderr.txt", dir);
  setenv("EMBER_LOGS", "recompiles", 1);
  fe_log_reload();
  fflush(stderr);
  int saved = dup(2);
  cr_assert(freopen(logpath, "w", stderr));
  EXPECT(em_call(c, &k, x).t[0], EM_F32, SHAPE(2), 0, 0, 6);
  EXPECT(em_call(c, &k, x).t[0], EM_F32, SHAPE(2), 0, 0, 6);
  k.training = 0;
  EXPECT(em_call(c, &k, x).t[0], EM_F32, SHAPE(2), 0, -2, 6);
  k.scale = 0.5f;
  EXPECT(em_call(c, &k, x).t[0], EM_F32, SHAPE(2), 0, -0.5, 1.5);
  k.training = 1, k.scale = 2.0f;
  EXPECT(em_call(c, &k, x).t[0], EM_F32, SHAPE(2), 0, 0, 6);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  unsetenv("EMBER_LOGS");
  fe_log_reload();
  em_compile_stats st = em_compiled_stats(c);
  cr_assert_eq(st.traces, 3, "one trace per distinct (training, scale), got %lld", (long long)st.traces);
  cr_assert_eq(st.replays + st.checks, 2);
  char *log = read_file(logpath);
  char want[160];
  snprintf(want, sizeof want, "guard failed: %s:%d &k->training changed (1 = 1.4013e-45 as float -> 0 = 0 as float)", __FILE__,
           guard_line);
  cr_assert(log && strstr(log, want), "log lacks '%s':\n%s", want, log ? log : "");
  cr_assert(strstr(log, "&k->scale changed (1073741824 = 2 as float -> 1056964608 = 0.5 as float)"), "%s", log);
  free(log);
  em_compiled_free(c);
  /* em_explain lists them; a bad size is a located error */
  em_explanation *e = em_explain(configured, &k, x);
  cr_assert(e && strstr(e->text, "&k->training == 1 = 1.4013e-45 as float (em_guard_value at"), "%s", e ? e->text : "");
  em_explanation_free(e);
  em_guard_value(&k, 0); /* outside a trace: nothing */
  cr_assert_null(em_last_error());
}

/* Issue 16, finding 5: a value read with em_item and fed to a later op was a constant of the
 * next graph, so every call made and compiled a new graph (201 graphs for 200 calls) and the
 * cache grew without bound. It now enters the graph as a 0-dim input: one graph serves every
 * value. A constant the host computes from such a value still changes the graph; the cache
 * then keeps the 64 most recently used graphs. */
static em_outputs centered(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_sub_scalar(in[0], em_item(em_mean(in[0], 0, NULL, false))));
}
static em_outputs host_computed(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_mul_scalar(in[0], 1 + 0.5 * em_item(em_amax(in[0], 0, NULL, false))));
}

ETEST(compile, item_values_are_graph_inputs_and_the_graph_cache_is_bounded) {
  em_compiled *c = em_compile(centered, NULL), *h = em_compile(host_computed, NULL);
  for (int call = 0; call < 200; call++) {
    em_scope_begin();
    em_tensor *x = T(EM_F32, SHAPE(3), call, 2 * call, 3 * call + 3);
    EXPECT(em_call(c, NULL, x).t[0], EM_F32, SHAPE(3), 1e-4, -call - 1, -1, call + 2);
    double m = 3 * call + 3;
    EXPECT(em_call(h, NULL, x).t[0], EM_F32, SHAPE(3), 1e-6 * m * m, call * (1 + 0.5 * m), 2 * call * (1 + 0.5 * m),
           m * (1 + 0.5 * m));
    em_scope_end();
  }
  em_compile_stats st = em_compiled_stats(c);
  cr_assert_eq(st.graphs_compiled, 2, "one graph before the break, one after: %lld", (long long)st.graphs_compiled);
  cr_assert_eq(st.graph_cache_hits, 398);
  st = em_compiled_stats(h);
  cr_assert_leq(st.graphs_cached, 64, "%lld graphs kept", (long long)st.graphs_cached);
  cr_assert_eq(st.graph_cache_evictions, st.graphs_compiled - st.graphs_cached);
  cr_assert_gt(st.graph_cache_evictions, 100);
  em_compiled_free(c), em_compiled_free(h);
}

/* Replay validation: a host value fn reads without declaring it is baked into the trace. The
 * entry's second call traces fn again and compares: the changed constant is an error naming it
 * and the user's line, the stale entry is dropped, and the next call traces anew. With
 * check_every = N, every Nth call of an entry is checked too. */
static double host_lr = 0.01;
static int host_line;
static em_outputs reads_a_global(void *ctx, em_tensor *const *in, int n) {
  em_tensor *y = em_mul_scalar(in[0], host_lr * 1.25); host_line = __LINE__;
  return EM_OUTPUTS(y);
}

ETEST(compile, replay_validation_finds_a_baked_host_value) {
  em_tensor *x = em_ones(EM_F32, EM_SHAPE(2));
  host_lr = 0.01;
  em_compiled *c = em_compile(reads_a_global, NULL);
  EXPECT_ALL(em_call(c, NULL, x).t[0], EM_F32, SHAPE(2), 1e-9, 0.0125);
  host_lr = 0.02;
  em_outputs o = em_call(c, NULL, x);
  cr_assert_null(o.t[0], "a stale replay is refused");
  char want[256];
  snprintf(want, sizeof want, "%s:%d: the trace of this call differs from the cached one: a constant 0.025000000000000001 was 0.012500000000000001",
           __FILE__, host_line);
  cr_assert(em_last_error() && strstr(em_last_error(), want), "'%s' lacks '%s'", em_last_error() ? em_last_error() : "", want);
  em_clear_error();
  EXPECT_ALL(em_call(c, NULL, x).t[0], EM_F32, SHAPE(2), 1e-9, 0.025); /* traced anew */
  em_compiled_free(c);

  /* every 3rd call: a change between checks is caught at the next check */
  host_lr = 0.01;
  c = em_compile(reads_a_global, &(em_compile_options){.check_every = 3});
  int refused = 0;
  for (int call = 1; call <= 7; call++) {
    if (call == 4) host_lr = 0.04; /* after the checks of calls 2 and 3 */
    em_outputs r = em_call(c, NULL, x);
    if (!r.t[0]) refused = call, em_clear_error();
  }
  cr_assert_eq(refused, 4, "the check of call 4 (the entry's 3rd hit) refuses, got %d", refused);
  cr_assert_eq(em_compiled_stats(c).checks, 3);
  em_compiled_free(c);

  /* off */
  c = em_compile(reads_a_global, &(em_compile_options){.check_every = -1});
  em_call(c, NULL, x), em_call(c, NULL, x);
  cr_assert_eq(em_compiled_stats(c).checks, 0);
  cr_assert_eq(em_compiled_stats(c).replays, 1);
  em_compiled_free(c);
}

/* Issue 16: a randomized check of replays. Between calls the host flag (declared with
 * em_guard_value), the learning rate, the optimizer's state, and whether the two inputs are
 * slices of one buffer change at random; every call of the compiled training step is compared
 * with an eager twin: bit for bit on the eager and aot_eager backends, within 1e-5 on the
 * inductor's kernels. */
typedef struct rstep {
  em_tensor *w, *b;
  em_optimizer *opt;
  int use_tanh;
} rstep;

static em_outputs random_step(void *ctx, em_tensor *const *in, int n) {
  rstep *s = ctx;
  em_guard_value(&s->use_tanh, sizeof s->use_tanh);
  em_tensor *h = em_add(em_matmul(in[0], s->w), s->b);
  h = s->use_tanh ? em_tanh(h) : em_relu(h);
  em_tensor *loss = em_mean(em_mul(h, em_add_scalar(em_slice(in[1], 1, 0, 3, 1), 0.5)), 0, NULL, false);
  em_optimizer_zero_grad(s->opt);
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(s->opt)) return EM_OUTPUTS(NULL);
  em_add_scalar_(in[0], 0.125); /* an in-place write to an input that may alias the other */
  return EM_OUTPUTS(loss, em_sum(in[1], 0, NULL, false));
}

#define EXPECT_CLOSE(a, b, tol) expect_near((a), (b), (tol), __LINE__)
static void expect_near(em_tensor *a, em_tensor *b, double tol, int line) {
  cr_assert(a && b && em_numel(a) == em_numel(b), "line %d: %s", line, em_last_error() ? em_last_error() : "shapes differ");
  double d = em_item(em_amax(em_abs(em_sub(em_cast(a, EM_F64), em_cast(b, EM_F64))), 0, NULL, false));
  double m = em_item(em_amax(em_abs(em_cast(b, EM_F64)), 0, NULL, false));
  cr_assert(d <= tol * (1 + m), "line %d: differs by %g (scale %g)", line, d, m);
}

ETEST(compile, random_host_values_lr_and_aliasing_replay_like_eager) {
  static const char *backends[] = {"eager", "aot_eager", "inductor"};
  for (int b = 0; b < 3; b++) {
    for (int adam = 0; adam < 2; adam++) {
      rstep s[2];
      for (int k = 0; k < 2; k++) {
        em_manual_seed(77);
        s[k].w = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(4, 3)), true);
        s[k].b = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(3)), true);
        em_tensor *p[2] = {s[k].w, s[k].b};
        s[k].opt = adam ? em_adamw_new(2, p, EM_ADAMW_DEFAULT(0.05)) : em_sgd_new(2, p, ((em_sgd_opts){0.1, 0.9, 0, 0.01, false}));
        s[k].use_tanh = 1;
      }
      em_compiled *c = em_compile(random_step, &(em_compile_options){.backend = backends[b], .recompile_limit = 16});
      uint64_t r = 12345 + (uint64_t)b * 7 + (uint64_t)adam;
      for (int call = 0; call < 24; call++) {
        em_scope_begin();
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        unsigned bits = (unsigned)(r >> 40);
        if (bits & 1) s[0].use_tanh = s[1].use_tanh = !s[0].use_tanh;
        if (bits & 2) {
          double lr = 0.01 + 0.01 * (bits >> 4 & 7);
          em_optimizer_set_lr(s[0].opt, lr), em_optimizer_set_lr(s[1].opt, lr);
        }
        bool alias = bits & 4;
        em_tensor *in[2][2];
        for (int k = 0; k < 2; k++) {
          em_manual_seed(1000 + (uint64_t)call);
          em_tensor *buf = em_randn(EM_F32, EM_SHAPE(2, 8));
          in[k][0] = alias ? em_slice(buf, 1, 0, 4, 1) : em_clone(em_slice(buf, 1, 0, 4, 1)); /* [2, 4] */
          in[k][1] = alias ? em_slice(buf, 1, 2, 6, 1) : em_clone(em_slice(buf, 1, 2, 6, 1)); /* overlaps in[0] */
        }
        em_outputs e = random_step(&s[0], in[0], 2);
        em_outputs o = em_call(c, &s[1], in[1][0], in[1][1]);
        cr_assert_eq(o.n, 2, "%s call %d: %s", backends[b], call, em_last_error() ? em_last_error() : "");
        for (int i = 0; i < 2; i++) {
          if (b < 2) EXPECT_SAME_BITS(o.t[i], e.t[i], "output");
          else EXPECT_CLOSE(o.t[i], e.t[i], 1e-5);
        }
        if (b < 2) EXPECT_SAME_BITS(s[1].w, s[0].w, "w"), EXPECT_SAME_BITS(s[1].b, s[0].b, "b");
        else EXPECT_CLOSE(s[1].w, s[0].w, 1e-5), EXPECT_CLOSE(s[1].b, s[0].b, 1e-5);
        em_scope_end();
      }
      em_compile_stats st = em_compiled_stats(c);
      cr_assert_gt(st.replays, 0, "%s: some calls replayed", backends[b]);
      cr_assert_eq(st.eager_calls, 0);
      em_compiled_free(c);
      for (int k = 0; k < 2; k++) em_optimizer_free(s[k].opt);
    }
  }
}

/* Found by the fuzzer: a proxy whose value is an input (x reshaped to its own shape) became the
 * input's own tensor at a graph break: a second leaf, which took x's gradient away (0 for
 * eager's 1). It now becomes a view of x with a grad_fn into x, as in eager. The f64 output
 * makes AOT fall back to eager autograd on this graph, the path that materialized it so. */
static em_outputs reshaped_input_across_a_break(void *ctx, em_tensor *const *in, int n) {
  em_tensor *v = em_reshape(in[0], EM_SHAPE(-1));
  em_tensor *d = em_cast(em_tanh(in[0]), EM_F64);
  em_graph_break();
  return EM_OUTPUTS(em_mul_scalar(v, 3), d);
}

ETEST(compile, a_proxy_that_is_an_input_keeps_its_gradient_across_a_break) {
  static const char *backends[] = {"eager", "aot_eager", "inductor"};
  for (int b = 0; b < 3; b++) {
    em_compiled *c = em_compile(reshaped_input_across_a_break, &(em_compile_options){.backend = backends[b]});
    em_tensor *x = em_requires_grad_(em_ones(EM_F32, EM_SHAPE(3)), true);
    em_tensor *o = em_call(c, NULL, x).t[0], *g;
    cr_assert_not_null(o, "%s", em_last_error() ? em_last_error() : "");
    cr_assert(em_grad(1, &o, (em_tensor *[]){em_ones(EM_F32, EM_SHAPE(3))}, 1, &x, &g, false, false));
    EXPECT_ALL(g, EM_F32, SHAPE(3), 0, 3);
    em_compiled_free(c);
  }
}

/* Issue 17: EM_NONE as an input of em_call or em_explain, and an opaque function returning more
 * than EM_MAX_OUTPUTS outputs, are clear errors (they crashed, or were accepted). */
static em_outputs too_many(void *ctx, em_tensor *const *in, int n) {
  em_outputs o = {.n = EM_MAX_OUTPUTS + 5};
  return o;
}

ETEST(compile, em_none_inputs_and_too_many_opaque_outputs_are_errors) {
  em_compiled *c = em_compile(double_it, NULL);
  em_outputs o = em_call(c, NULL, EM_NONE);
  cr_assert_null(o.t[0]);
  cr_assert(em_last_error() && strstr(em_last_error(), "em_call: input 0 is EM_NONE"), "%s", em_last_error());
  em_clear_error();
  cr_assert_null(em_explain(double_it, NULL, EM_NONE));
  cr_assert(em_last_error() && strstr(em_last_error(), "em_explain: input 0 is EM_NONE"), "%s", em_last_error());
  em_clear_error();
  o = em_call_opaque(too_many, NULL, em_ones(EM_F32, EM_SHAPE(2)));
  cr_assert_eq(o.n, 0);
  cr_assert(em_last_error() && strstr(em_last_error(), "em_call_opaque: fn returned 21 outputs (0 to 16 allowed)"), "%s",
            em_last_error());
  em_clear_error();
  em_compiled_free(c);
}
