/* tests/test_aot.c: AOT autograd (backend aot_eager): gradients equal eager autograd on every
 * composite and on an MLP, LeNet-5 and a 2-layer decoder-only transformer, with both
 * partitioners; min-cut saves no more bytes than the default partitioner (strictly fewer on a
 * GELU + LayerNorm MLP); dropout's mask is replayed in the backward; several differentiable
 * outputs; outputs that are inputs; retain_graph and in-place errors.
 *
 * Tolerances: f32 values and gradients agree within 1e-4 relative + 1e-5 absolute (the joint
 * graph is optimised, so sums may associate differently); f64 within 1e-10. */
#include "common.h"
#include "composites.h"

static const char *const partitioners[2] = {"min_cut", "default"};

static void expect_close(em_tensor *a, em_tensor *b, const char *what, int which) {
  cr_assert(a && b, "%s %d: NULL: %s", what, which, em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_numel(a), em_numel(b), "%s %d: sizes differ (%lld vs eager %lld)", what, which, (long long)em_numel(a),
               (long long)em_numel(b));
  int64_t n = em_numel(a);
  double *x = malloc(sizeof(double) * (size_t)(n + 1)), *y = malloc(sizeof(double) * (size_t)(n + 1));
  cr_assert(em_to_buffer(a, EM_F64, x, sizeof(double) * (size_t)n) && em_to_buffer(b, EM_F64, y, sizeof(double) * (size_t)n));
  double tol_rel = em_dtype_of(a) == EM_F64 ? 1e-10 : 1e-4, tol_abs = em_dtype_of(a) == EM_F64 ? 1e-12 : 1e-5;
  for (int64_t i = 0; i < n; i++) {
    bool ok = (isnan(x[i]) && isnan(y[i])) || fabs(x[i] - y[i]) <= tol_abs + tol_rel * fabs(y[i]);
    if (!ok) {
      double xi = x[i], yi = y[i];
      free(x), free(y);
      cr_assert_fail("%s %d: element %lld is %.9g, eager %.9g", what, which, (long long)i, xi, yi);
    }
  }
  free(x), free(y);
}

/* Runs fn eagerly and compiled with aot_eager (each partitioner, two calls: trace and replay),
 * compares output 0 and the gradients of sum(output 0 * seed) with respect to params. Returns
 * the saved bytes of each partitioner. */
static void check_grads(em_model_fn fn, void *ctx, int n_in, em_tensor *const *in, int n_params, em_tensor *const *params,
                        int64_t saved[2]) {
  em_scope_begin();
  em_tensor *want = fn(ctx, in, n_in).t[0];
  cr_assert_not_null(want, "%s", em_last_error() ? em_last_error() : "");
  em_tensor *seed = em_add_scalar(em_rand(em_dtype_of(want), em_ndim(want), em_sizes(want)), 0.5);
  em_tensor *ge[32], *gc[32];
  cr_assert(em_grad(1, &want, &seed, n_params, params, ge, false, false), "%s", em_last_error());
  for (int p = 0; p < 2; p++) {
    em_compiled *c = em_compile(fn, &(em_compile_options){.backend = "aot_eager", .partitioner = partitioners[p], .name = "aot"});
    for (int call = 0; call < 2; call++) {
      em_tensor *got = em_call_n(c, ctx, n_in, in).t[0];
      cr_assert_not_null(got, "%s", em_last_error() ? em_last_error() : "");
      expect_close(got, want, "output", call);
      if (!em_requires_grad(want)) continue;
      cr_assert_str_eq(em_grad_fn_name(got), "aot", "the output's grad_fn runs the compiled backward");
      cr_assert(em_grad(1, &got, &seed, n_params, params, gc, false, false), "%s", em_last_error());
      for (int i = 0; i < n_params; i++) expect_close(gc[i], ge[i], "gradient of parameter", i);
    }
    em_compile_stats s = em_compiled_stats(c);
    cr_assert_eq(s.traces, 1);
    cr_assert_eq(s.aot_graphs, em_requires_grad(want) ? 1 : 0, "aot graphs %lld", (long long)s.aot_graphs);
    if (saved) saved[p] = s.aot_saved_bytes;
    em_compiled_free(c);
  }
  em_scope_end();
}

ETEST(aot, every_composite_gradient_equals_eager) {
  em_manual_seed(11);
  em_tensor *x = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(5, 6)), true);
  em_tensor *w = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(6)), true);
  em_tensor *t = em_randint(0, 6, EM_SHAPE(5));
  for (composite = 0; composite < N_COMPOSITES; composite++) {
    if (composite == 19) continue; /* one_hot: integer output, and a graph break */
    int64_t saved[2];
    check_grads(apply_composite, NULL, 3, (em_tensor *[]){x, w, t}, 2, (em_tensor *[]){x, w}, saved);
    cr_assert_leq(saved[0], saved[1], "composite %d: min-cut saves %lld bytes, default %lld", composite,
                  (long long)saved[0], (long long)saved[1]);
  }
}

ETEST(aot, f64_gradients) {
  em_manual_seed(12);
  em_tensor *x = em_requires_grad_(em_randn(EM_F64, EM_SHAPE(5, 6)), true);
  em_tensor *w = em_requires_grad_(em_randn(EM_F64, EM_SHAPE(6)), true);
  em_tensor *t = em_randint(0, 6, EM_SHAPE(5));
  for (composite = 0; composite < 14; composite++) check_grads(apply_composite, NULL, 3, (em_tensor *[]){x, w, t}, 2, (em_tensor *[]){x, w}, NULL);
}

#include "../bench/models.h"

ETEST(aot, mlp_lenet_transformer_gradients_and_saved_bytes) {
  int64_t saved[4][2];
  const char *names[4] = {"MLP", "GELU+LayerNorm MLP", "LeNet-5", "transformer"};
  { /* MLP */
    em_manual_seed(20);
    net m = {0};
    models_mlp(&m, 64, 48, 32, 10);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(16, 64)), *y = em_randint(0, 10, EM_SHAPE(16));
    check_grads(mlp_fn, &m, 2, (em_tensor *[]){x, y}, m.n_params, m.params, saved[0]);
  }
  { /* GELU + LayerNorm MLP */
    em_manual_seed(21);
    net m = {0};
    models_gelu_ln_mlp(&m, 64, 48, 32, 10);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(16, 64)), *y = em_randint(0, 10, EM_SHAPE(16));
    check_grads(gelu_ln_mlp_fn, &m, 2, (em_tensor *[]){x, y}, m.n_params, m.params, saved[1]);
  }
  { /* LeNet-5 */
    em_manual_seed(22);
    net m = {0};
    cr_assert(models_lenet(&m));
    em_tensor *x = em_rand(EM_F32, EM_SHAPE(4, 1, 28, 28)), *y = em_randint(0, 10, EM_SHAPE(4));
    check_grads(lenet_fn, &m, 2, (em_tensor *[]){x, y}, m.n_params, m.params, saved[2]);
  }
  { /* transformer */
    em_manual_seed(23);
    net m = {0};
    models_transformer(&m);
    em_tensor *tokens = em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)), *next = em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX));
    check_grads(transformer_fn, &m, 2, (em_tensor *[]){tokens, next}, m.n_params, m.params, saved[3]);
  }
  for (int k = 0; k < 4; k++) {
    cr_log_info("%s: min-cut saves %lld bytes, default %lld", names[k], (long long)saved[k][0], (long long)saved[k][1]);
    cr_assert_leq(saved[k][0], saved[k][1], "%s: min-cut saves more than the default partitioner", names[k]);
  }
  cr_assert_lt(saved[1][0], saved[1][1], "GELU + LayerNorm MLP: min-cut must save strictly fewer bytes");
}

/* ---- dropout, outputs, errors ---- */

static em_outputs dropout_fn(void *ctx, em_tensor *const *in, int n) {
  em_tensor *h = em_dropout(em_tanh(em_mul(in[0], in[1])), 0.5, true);
  return EM_OUTPUTS(em_sum(em_mul(h, h), 0, NULL, false));
}

/* Under both partitioners and both backends: with the inductor the forward's kernel computes the
 * uniform, and under the default partitioner the backward's kernel computes it again from the
 * counters the forward drew (its rng slot; issue 20). */
ETEST(aot, dropout_mask_is_replayed_in_the_backward) {
  em_tensor *x = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(64)), true);
  em_tensor *w = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(64)), true);
  for (int p = 0; p < 4; p++) {
    const char *backend = p < 2 ? "aot_eager" : "inductor";
    em_compiled *c = em_compile(dropout_fn, &(em_compile_options){.backend = backend, .partitioner = partitioners[p % 2]});
    for (int i = 0; i < 3; i++) {
      em_scope_begin();
      em_manual_seed(100 + i);
      em_tensor *want = dropout_fn(NULL, (em_tensor *[]){x, w}, 2).t[0], *ge[2], *gc[2];
      cr_assert(em_grad(1, &want, NULL, 2, ((em_tensor *[]){x, w}), ge, false, false));
      em_manual_seed(100 + i);
      em_tensor *got = em_call(c, NULL, x, w).t[0];
      /* something else draws between forward and backward: the backward must not redraw */
      em_rand(EM_F32, EM_SHAPE(8));
      cr_assert(em_grad(1, &got, NULL, 2, ((em_tensor *[]){x, w}), gc, false, false), "%s", em_last_error());
      expect_close(got, want, "loss", i);
      expect_close(gc[0], ge[0], "grad x", i);
      expect_close(gc[1], ge[1], "grad w", i);
      em_scope_end();
    }
    em_compile_stats st = em_compiled_stats(c);
    if (p >= 2) cr_assert(st.kernel_runs > 0 && st.inductor_fallbacks == 0, "%s: compiled", partitioners[p % 2]);
    em_compiled_free(c);
  }
}

static em_outputs two_outputs(void *ctx, em_tensor *const *in, int n) {
  em_tensor *h = em_exp(em_mul_scalar(in[0], 0.3));
  return EM_OUTPUTS(em_sum(h, 0, NULL, false), em_sin(h), in[0], em_argmax(h, 0, false), em_reshape(in[0], EM_SHAPE(7, 1)));
}

ETEST(aot, several_outputs_and_outputs_that_are_inputs) {
  em_tensor *x = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(7)), true);
  em_outputs e = two_outputs(NULL, &x, 1);
  em_tensor *le = em_add(em_add(e.t[0], em_sum(em_mul(e.t[1], e.t[1]), 0, NULL, false)), em_sum(e.t[2], 0, NULL, false));
  em_tensor *ge;
  cr_assert(em_grad(1, &le, NULL, 1, &x, &ge, false, false));
  em_compiled *c = em_compile(two_outputs, &(em_compile_options){.backend = "aot_eager"});
  for (int i = 0; i < 2; i++) {
    em_outputs o = em_call(c, NULL, x);
    cr_assert(em_is_leaf(x), "the input stays a leaf");
    cr_assert(em_shares_storage(o.t[2], x), "an output that is an input is not copied");
    cr_assert_not(em_requires_grad(o.t[3]));
    cr_assert(em_shares_storage(o.t[4], x) && em_requires_grad(o.t[4]), "a view of an input stays a view, with grad");
    em_tensor *lc = em_add(em_add(o.t[0], em_sum(em_mul(o.t[1], o.t[1]), 0, NULL, false)), em_sum(o.t[2], 0, NULL, false));
    em_tensor *gc;
    cr_assert(em_grad(1, &lc, NULL, 1, &x, &gc, false, false), "%s", em_last_error());
    expect_close(gc, ge, "grad through three outputs", i);
    /* only one output used: the others' gradients are zero */
    em_tensor *g1, *g1e;
    em_outputs o2 = em_call(c, NULL, x);
    cr_assert(em_grad(1, &o2.t[1], &(em_tensor *){em_ones(EM_F32, EM_SHAPE(7))}, 1, &x, &g1, false, false));
    em_outputs e2 = two_outputs(NULL, &x, 1);
    cr_assert(em_grad(1, &e2.t[1], &(em_tensor *){em_ones(EM_F32, EM_SHAPE(7))}, 1, &x, &g1e, false, false));
    expect_close(g1, g1e, "grad through one output", i);
  }
  em_compiled_free(c);
}

static em_outputs uses_one(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_sum(em_exp(in[0]), 0, NULL, false));
}

ETEST(aot, backward_semantics_match_eager) {
  em_tensor *x = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(5)), true);
  em_tensor *unused = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(5)), true);
  em_compiled *c = em_compile(uses_one, &(em_compile_options){.backend = "aot_eager", .name = "f"});
  /* .grad accumulates through em_backward; an input the output does not use keeps no grad */
  em_tensor *l = em_call(c, NULL, x, unused).t[0];
  cr_assert(em_backward(l, NULL), "%s", em_last_error());
  EXPECT_SAME_BITS(em_get_grad(x), em_exp(em_detach(x)), "grad of sum(exp(x))");
  cr_assert_null(em_get_grad(unused));
  /* a second backward without retain_graph is an error, as in eager */
  em_clear_error();
  cr_assert_not(em_backward(l, NULL));
  cr_assert(strstr(em_last_error(), "a second time"), "%s", em_last_error());
  em_clear_error();
  /* retain_graph allows it */
  em_tensor *l2 = em_call(c, NULL, x, unused).t[0];
  cr_assert(em_backward_ex(l2, NULL, true, false) && em_backward(l2, NULL), "%s", em_last_error());
  /* modifying a saved input in place before the backward is an error, as in eager (min-cut saves
   * y itself and recomputes exp(y); the default partitioner saves exp(y), which stays valid) */
  em_compiled_free(c);
  c = em_compile(uses_one, &(em_compile_options){.backend = "aot_eager", .name = "f", .partitioner = "min_cut"});
  em_tensor *y = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(5)), true);
  em_tensor *l3 = em_call(c, NULL, y, unused).t[0];
  em_no_grad_begin();
  em_add_scalar_(y, 1.0);
  em_no_grad_end();
  em_clear_error();
  cr_assert_not(em_backward(l3, NULL));
  cr_assert(strstr(em_last_error(), "modified in place"), "%s", em_last_error());
  em_clear_error();
  em_compiled_free(c);
}

/* ---- functionalization: mutations inside compiled functions equal eager ---- */

static int mutation;

static em_outputs mutate(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0], *y = in[1];
  switch (mutation) {
  case 0: /* in place on an input, then read it */
    em_add_scalar_(x, 1.0);
    return EM_OUTPUTS(em_mul_scalar(x, 2.0));
  case 1: /* in place on a view of an input */
    em_mul_scalar_(em_slice(x, 0, 1, 3, 1), 10.0);
    return EM_OUTPUTS(em_sum(x, 0, NULL, false));
  case 2: /* copy_ into a view of an input (through a reshape and a slice) */
    em_copy_(em_slice(em_reshape(x, EM_SHAPE(-1)), 0, 2, 6, 1), em_reshape(em_slice(y, 0, 0, 1, 1), EM_SHAPE(4)));
    return EM_OUTPUTS(em_exp(x));
  case 3: { /* an output that aliases a mutated input: a view, as in eager */
    em_tensor *t = em_transpose(x, 0, 1);
    em_sub_(x, y);
    return EM_OUTPUTS(t, em_neg(t));
  }
  case 4: { /* a mutated intermediate and views of it */
    em_tensor *h = em_clone(x);
    em_tensor *row = em_slice(h, 0, 0, 1, 1);
    em_mul_(row, em_slice(y, 0, 1, 2, 1));
    return EM_OUTPUTS(em_add(h, y));
  }
  default: { /* batch-norm running statistics (buffers reached through ctx) */
    em_tensor **stats = ctx;
    return EM_OUTPUTS(em_batch_norm(em_reshape(x, EM_SHAPE(3, 4, 1, 1)), stats[0], stats[1], EM_NONE, EM_NONE, true, 0.1, 1e-5));
  }
  }
}
#define N_MUTATIONS 6

ETEST(aot, mutations_equal_eager) {
  for (mutation = 0; mutation < N_MUTATIONS; mutation++)
    for (int b = 0; b < 2; b++) {
      em_scope_begin();
      em_compiled *c = em_compile(mutate, &(em_compile_options){.backend = b ? "aot_eager" : "eager"});
      em_manual_seed(30);
      em_tensor *x0 = em_randn(EM_F32, EM_SHAPE(3, 4)), *y = em_randn(EM_F32, EM_SHAPE(3, 4));
      em_tensor *stats_e[2] = {em_zeros(EM_F32, EM_SHAPE(4)), em_ones(EM_F32, EM_SHAPE(4))};
      em_tensor *stats_c[2] = {em_zeros(EM_F32, EM_SHAPE(4)), em_ones(EM_F32, EM_SHAPE(4))};
      em_tensor *xe = em_clone(x0), *xc = em_clone(x0);
      for (int call = 0; call < 3; call++) {
        em_outputs e = mutate(stats_e, (em_tensor *[]){xe, y}, 2);
        em_outputs o = em_call(c, stats_c, xc, y);
        cr_assert_eq(o.n, e.n);
        char what[64];
        for (int i = 0; i < e.n; i++) {
          snprintf(what, sizeof what, "mutation %d output %d call %d", mutation, i, call);
          EXPECT_SAME_BITS(o.t[i], e.t[i], what);
          cr_assert_eq(em_shares_storage(o.t[i], xc), em_shares_storage(e.t[i], xe), "%s: aliasing differs from eager", what);
        }
        snprintf(what, sizeof what, "mutation %d: the input after call %d", mutation, call);
        EXPECT_SAME_BITS(xc, xe, what);
        EXPECT_SAME_BITS(stats_c[0], stats_e[0], "running mean");
        EXPECT_SAME_BITS(stats_c[1], stats_e[1], "running var");
      }
      em_compile_stats s = em_compiled_stats(c);
      cr_assert_eq(s.breaks, 0, "mutation %d: %lld graph breaks", mutation, (long long)s.breaks);
      cr_assert_eq(s.replays + s.checks, 2, "mutation %d: %lld replays", mutation, (long long)s.replays);
      em_compiled_free(c);
      em_scope_end();
    }
}

/* A whole training step with SGD momentum: the optimizer's state is made on the first step (that
 * trace is not cached), then lives across calls as mutated inputs. */
typedef struct step_ctx {
  net m;
  em_optimizer *opt;
} step_ctx;

static em_outputs train_step(void *ctx, em_tensor *const *in, int n) {
  step_ctx *s = ctx;
  em_tensor *loss = mlp_fn(&s->m, in, n).t[0];
  em_optimizer_zero_grad(s->opt);
  em_backward(loss, NULL);
  em_optimizer_step(s->opt);
  return EM_OUTPUTS(loss);
}

ETEST(aot, training_step_with_optimizer_state_equals_eager) {
  step_ctx s[2];
  for (int k = 0; k < 2; k++) {
    em_manual_seed(40);
    memset(&s[k].m, 0, sizeof s[k].m);
    models_mlp(&s[k].m, 20, 16, 12, 5);
    s[k].opt = em_sgd_new(s[k].m.n_params, s[k].m.params, ((em_sgd_opts){0.1, 0.9, 0, 1e-4, true}));
  }
  em_compiled *c = em_compile(train_step, &(em_compile_options){.backend = "aot_eager", .name = "step"});
  for (int step = 0; step < 6; step++) {
    em_scope_begin();
    em_manual_seed(50 + step);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(8, 20)), *y = em_randint(0, 5, EM_SHAPE(8));
    em_tensor *le = train_step(&s[0], (em_tensor *[]){x, y}, 2).t[0];
    em_tensor *lc = em_call(c, &s[1], x, y).t[0];
    EXPECT_SAME_BITS(lc, le, "loss");
    for (int i = 0; i < s[0].m.n_params; i++) {
      EXPECT_SAME_BITS(s[1].m.params[i], s[0].m.params[i], "parameter");
      EXPECT_SAME_BITS(em_get_grad(s[1].m.params[i]), em_get_grad(s[0].m.params[i]), "grad");
    }
    em_scope_end();
  }
  em_compile_stats st = em_compiled_stats(c);
  cr_log_info("step: %lld traces, %lld replays, %lld graphs, %lld breaks", (long long)st.traces, (long long)st.replays,
              (long long)st.graphs_compiled, (long long)st.breaks);
  cr_assert_eq(st.breaks, 0);
  cr_assert_eq(st.traces, 2, "the first step makes the momentum buffers (not cached); the second is");
  cr_assert_eq(st.replays + st.checks, 4);
  for (int k = 0; k < 2; k++) em_optimizer_free(s[k].opt);
  em_compiled_free(c);
}

/* Issue 16: the lr and AdamW's step counts are 0-dim tensors the traced step reads as inputs,
 * so an lr schedule that changes every step never recompiles, AdamW's step is no graph break,
 * and every step equals eager's (bits on aot_eager; 1e-5 on the inductor's kernels). */
static void lr_schedule_never_recompiles(bool adamw, const char *backend) {
  step_ctx s[2];
  for (int k = 0; k < 2; k++) {
    em_manual_seed(41);
    memset(&s[k].m, 0, sizeof s[k].m);
    models_mlp(&s[k].m, 20, 16, 12, 5);
    s[k].opt = adamw ? em_adamw_new(s[k].m.n_params, s[k].m.params, ((em_adamw_opts){0.01, 0.9, 0.99, 1e-8, 0.01, true}))
                     : em_sgd_new(s[k].m.n_params, s[k].m.params, ((em_sgd_opts){0.1, 0.9, 0, 1e-4, false}));
  }
  em_compiled *c = em_compile(train_step, &(em_compile_options){.backend = backend, .name = "step"});
  bool exact = !strcmp(backend, "aot_eager");
  for (int step = 0; step < 8; step++) {
    em_scope_begin();
    double lr = (adamw ? 0.01 : 0.1) / (1 + step); /* a new rate every step */
    for (int k = 0; k < 2; k++) em_optimizer_set_lr(s[k].opt, lr);
    cr_assert_eq(em_optimizer_get_lr(s[1].opt), lr);
    em_manual_seed(60 + step);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(8, 20)), *y = em_randint(0, 5, EM_SHAPE(8));
    cr_assert_not_null(train_step(&s[0], (em_tensor *[]){x, y}, 2).t[0]);
    em_tensor *lc = em_call(c, &s[1], x, y).t[0];
    cr_assert_not_null(lc, "%s", em_last_error());
    for (int i = 0; i < s[0].m.n_params; i++) {
      if (exact) EXPECT_SAME_BITS(s[1].m.params[i], s[0].m.params[i], "parameter");
      else expect_close(s[1].m.params[i], s[0].m.params[i], "parameter", i);
    }
    em_scope_end();
  }
  em_compile_stats st = em_compiled_stats(c);
  cr_assert_eq(st.breaks, 0, "the optimizer step is part of the graph");
  cr_assert_eq(st.traces, 2, "the first step makes the optimizer state (not cached); then no recompile: %lld traces",
               (long long)st.traces);
  cr_assert_eq(st.replays + st.checks, 6);
  cr_assert_eq(st.checks, 1, "the second call of the entry validated it");
  for (int k = 0; k < 2; k++) em_optimizer_free(s[k].opt);
  em_compiled_free(c);
}

ETEST(aot, a_per_step_lr_schedule_never_recompiles) {
  lr_schedule_never_recompiles(false, "aot_eager");
  lr_schedule_never_recompiles(true, "aot_eager");
  lr_schedule_never_recompiles(false, "inductor");
  lr_schedule_never_recompiles(true, "inductor");
}

/* Found by the fuzzer: a value the forward saves for its backward that is also a differentiable
 * output (exp's result) was saved as the output's own header, so the output's grad_fn owned a
 * context that owned the output: a cycle, leaked whenever no backward ran (here: a graph break
 * after the op makes the value an output of the first graph). ETEST checks nothing is left. */
static em_outputs exp_then_break(void *ctx, em_tensor *const *in, int n) {
  em_tensor *e = em_exp(in[0]);
  em_tensor *d = em_div(in[0], em_add_scalar(em_abs(in[0]), 1));
  em_graph_break();
  return EM_OUTPUTS(em_add(e, d));
}

ETEST(aot, saved_outputs_do_not_leak) {
  for (int p = 0; p < 2; p++) {
    em_compiled *c = em_compile(exp_then_break, &(em_compile_options){.backend = "aot_eager", .partitioner = partitioners[p]});
    for (int call = 0; call < 3; call++) {
      em_scope_begin();
      em_tensor *x = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(3)), true);
      em_outputs o = em_call(c, NULL, x);
      cr_assert_not_null(o.t[0], "%s", em_last_error() ? em_last_error() : "");
      em_scope_end();
    }
    em_compiled_free(c);
  }
}

/* Found by the fuzzer (program 52750): a graph with two differentiable outputs, of which only
 * the first reaches the loss. Eager gives the second no gradient at all; the compiled backward
 * took a zero tangent for it, and 0 times the NaN it is scaled by (a mean over an empty tensor)
 * made x's gradient NaN. Absent tangents are symbolic zeros now, for every backend. */
static em_outputs nan_side_output(void *ctx, em_tensor *const *in, int n) {
  em_tensor *nan = em_mean(em_zeros(EM_F32, EM_SHAPE(0)), 0, NULL, false); /* 0 / 0 */
  return EM_OUTPUTS(em_mul_scalar(in[0], 2), em_mul(in[0], nan));
}

ETEST(aot, an_output_without_a_gradient_does_not_poison_the_others) {
  const char *backends[3] = {"eager", "aot_eager", "inductor"};
  for (int b = 0; b < 3; b++)
    for (int call = 0; call < 2; call++) {
      em_tensor *x = em_requires_grad_(em_ones(EM_F32, EM_SHAPE(3)), true);
      em_compiled *c = em_compile(nan_side_output, &(em_compile_options){.backend = backends[b]});
      em_outputs o = em_call(c, NULL, x);
      if (call) o = em_call(c, NULL, x); /* the replay too */
      cr_assert(o.n == 2 && o.t[0] && o.t[1], "%s", em_last_error() ? em_last_error() : "");
      cr_assert(em_backward(em_sum(o.t[0], 0, NULL, false), NULL), "%s", em_last_error() ? em_last_error() : "");
      float g[3];
      cr_assert(em_to_buffer(em_get_grad(x), EM_F32, g, sizeof g));
      for (int i = 0; i < 3; i++) cr_assert_eq(g[i], 2.0f, "%s call %d: x.grad[%d] = %g, eager 2", backends[b], call, i, g[i]);
      em_compiled_free(c);
    }
}
