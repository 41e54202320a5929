/* tests/test_autograd.c: the autograd engine. Finite-difference checks in f64 of every prim's
 * rule through the public ops (with broadcasting and non-contiguous operands), and the engine's
 * behaviour: accumulation, no_grad, detach, double backward, retain_graph, the version-counter
 * error, em_grad, and the graph being freed. */
#include "gradcheck.h"

#define D EM_F64

/* ---- one function per op under test; x are leaves ---- */
#define UNARY_FN(name, expr)                                     \
  static em_tensor *name(em_tensor *const *x, void *c) {          \
    (void)c;                                                      \
    return expr;                                                  \
  }
UNARY_FN(f_neg, em_neg(x[0]))
UNARY_FN(f_abs, em_abs(x[0]))
UNARY_FN(f_exp, em_exp(x[0]))
UNARY_FN(f_log, em_log(x[0]))
UNARY_FN(f_log1p, em_log1p(x[0]))
UNARY_FN(f_expm1, em_expm1(x[0]))
UNARY_FN(f_sqrt, em_sqrt(x[0]))
UNARY_FN(f_rsqrt, em_rsqrt(x[0]))
UNARY_FN(f_sin, em_sin(x[0]))
UNARY_FN(f_cos, em_cos(x[0]))
UNARY_FN(f_tanh, em_tanh(x[0]))
UNARY_FN(f_erf, em_erf(x[0]))
UNARY_FN(f_recip, em_reciprocal(x[0]))
/* binary ops with a broadcast second operand and a transposed first one */
UNARY_FN(f_add, em_add(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_sub, em_sub(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_mul, em_mul(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_div, em_div(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_pow, em_pow(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_max, em_maximum(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_min, em_minimum(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_rem, em_remainder(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_atan2, em_atan2(em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_where, em_where(em_gt_scalar(x[1], 0.5), em_transpose(x[0], 0, 1), x[1]))
UNARY_FN(f_scalar_ops, em_div_scalar(em_pow_scalar(em_add_scalar(em_mul_scalar(x[0], 3), 1), 2), 7))
UNARY_FN(f_cast, em_cast(em_mul(em_cast(x[0], EM_F32), em_cast(x[0], EM_F32)), D))

ETEST(gradcheck, unary) {
  em_manual_seed(1);
  struct { const char *name; gc_fn f; double lo, hi; } cases[] = {
      {"neg", f_neg, -2, 2},  {"abs", f_abs, 0.1, 2}, {"exp", f_exp, -2, 2},     {"log", f_log, 0.5, 3},
      {"log1p", f_log1p, 0, 2}, {"expm1", f_expm1, -1, 1}, {"sqrt", f_sqrt, 0.5, 3}, {"rsqrt", f_rsqrt, 0.5, 3},
      {"sin", f_sin, -3, 3}, {"cos", f_cos, -3, 3}, {"tanh", f_tanh, -2, 2}, {"erf", f_erf, -2, 2},
      {"reciprocal", f_recip, 0.5, 2}, {"scalar ops", f_scalar_ops, -1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    em_tensor *x = gc_leaf(cases[i].lo, cases[i].hi, EM_SHAPE(2, 3));
    gradcheck(cases[i].name, cases[i].f, NULL, 1, &x);
  }
  /* through f32 central differences are too coarse; the rule (cast back) is checked exactly */
  em_tensor *x = em_requires_grad_(T(D, SHAPE(3), -1, 0.5, 2), true);
  cr_assert(em_backward(em_sum(f_cast(&x, NULL), 0, NULL, false), NULL));
  EXPECT(em_get_grad(x), D, SHAPE(3), 0, -2, 1, 4);
}

ETEST(gradcheck, binary_broadcast_strided) {
  em_manual_seed(2);
  struct { const char *name; gc_fn f; double lo, hi; } cases[] = {
      {"add", f_add, -1, 1}, {"sub", f_sub, -1, 1}, {"mul", f_mul, -1, 1}, {"div", f_div, 0.5, 2},
      {"pow", f_pow, 0.5, 2}, {"maximum", f_max, -1, 1}, {"minimum", f_min, -1, 1},
      {"remainder", f_rem, 0.3, 3}, {"atan2", f_atan2, -1, 1}, {"where", f_where, -1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    em_tensor *x[2] = {gc_leaf(cases[i].lo, cases[i].hi, EM_SHAPE(4, 3)), gc_leaf(cases[i].lo, cases[i].hi, EM_SHAPE(4))};
    gradcheck(cases[i].name, cases[i].f, NULL, 2, x);
  }
}

UNARY_FN(f_sum, em_sum(x[0], EM_AXES(0, 2), false))
UNARY_FN(f_sum_all, em_sum(em_transpose(x[0], 0, 2), 0, NULL, true))
UNARY_FN(f_prod, em_prod(x[0], EM_AXES(1), true))
UNARY_FN(f_amax, em_amax(x[0], EM_AXES(-1), false))
UNARY_FN(f_amin, em_amin(x[0], 0, NULL, false))

ETEST(gradcheck, reductions) {
  em_manual_seed(3);
  struct { const char *name; gc_fn f; } cases[] = {
      {"sum", f_sum}, {"sum all", f_sum_all}, {"prod", f_prod}, {"amax", f_amax}, {"amin", f_amin}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    em_tensor *x = gc_leaf(0.5, 2, EM_SHAPE(2, 3, 4));
    gradcheck(cases[i].name, cases[i].f, NULL, 1, &x);
  }
  /* amax with ties shares the gradient evenly, as torch does */
  em_tensor *t = em_requires_grad_(T(D, SHAPE(3), 1, 5, 5), true);
  cr_assert(em_backward(em_amax(t, 0, NULL, false), NULL));
  EXPECT(em_get_grad(t), D, SHAPE(3), 0, 0, 0.5, 0.5);
}

UNARY_FN(f_reshape, em_mul(em_reshape(em_transpose(x[0], 0, 1), EM_SHAPE(2, 6)), em_reshape(x[0], EM_SHAPE(2, 6))))
UNARY_FN(f_permute, em_permute(em_unsqueeze(x[0], 1), EM_AXES(2, 0, 1)))
UNARY_FN(f_expand, em_expand(em_unsqueeze(x[0], 0), EM_SHAPE(2, 3, 4, 3)))
UNARY_FN(f_slice, em_slice(em_slice(x[0], 1, 1, 4, 2), 0, -2, 3, 1))
UNARY_FN(f_slice3, em_slice(x[0], 0, 0, 4, 3))
UNARY_FN(f_squeeze, em_squeeze(em_unsqueeze(x[0], -1), EM_AXES(-1)))
UNARY_FN(f_flip, em_mul(em_flip(x[0], EM_AXES(0, 1)), x[0]))
UNARY_FN(f_pad, em_pad(x[0], 4, (int64_t[]){1, 2, 0, 1}, 3))
UNARY_FN(f_clone, em_clone(em_transpose(x[0], 0, 1)))
static em_tensor *f_slice_scatter(em_tensor *const *x, void *c) {
  (void)c;
  em_tensor *src = em_mul(em_slice(x[0], 0, 1, 4, 2), em_slice(x[0], 0, 0, 2, 1));
  return em_slice_scatter(x[0], src, 0, 1, 4, 2);
}
static em_tensor *f_cat(em_tensor *const *x, void *c) {
  (void)c;
  em_tensor *parts[3] = {x[0], em_mul(x[0], x[0]), em_slice(x[0], 0, 0, 2, 1)};
  return em_cat(3, parts, 0);
}

ETEST(gradcheck, movement) {
  em_manual_seed(4);
  struct { const char *name; gc_fn f; } cases[] = {
      {"reshape", f_reshape}, {"permute", f_permute}, {"expand", f_expand}, {"slice", f_slice},
      {"slice step 3", f_slice3}, {"squeeze", f_squeeze}, {"flip", f_flip}, {"pad", f_pad},
      {"clone", f_clone}, {"cat", f_cat}, {"slice_scatter", f_slice_scatter},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    em_tensor *x = gc_leaf(-1, 1, EM_SHAPE(4, 3));
    gradcheck(cases[i].name, cases[i].f, NULL, 1, &x);
  }
}

static em_tensor *f_gather(em_tensor *const *x, void *c) {
  (void)c;
  return em_gather(x[0], 1, T(EM_I64, SHAPE(2, 3), 0, 2, 2, 1, 1, 0));
}
static em_tensor *f_index_select(em_tensor *const *x, void *c) {
  (void)c;
  return em_index_select(x[0], 0, T(EM_I64, SHAPE(4), 1, 0, 1, 1));
}
static em_tensor *f_scatter(em_tensor *const *x, void *c) {
  (void)c;
  return em_scatter_add(x[0], 1, T(EM_I64, SHAPE(2, 2), 2, 2, 0, 1), x[1]);
}

ETEST(gradcheck, indexing) {
  em_manual_seed(5);
  em_tensor *x = gc_leaf(-1, 1, EM_SHAPE(2, 3));
  gradcheck("gather", f_gather, NULL, 1, &x);
  gradcheck("index_select", f_index_select, NULL, 1, &x);
  em_tensor *xs[2] = {x, gc_leaf(-1, 1, EM_SHAPE(2, 3))};
  gradcheck("scatter_add", f_scatter, NULL, 2, xs);
}

UNARY_FN(f_matmul, em_matmul(x[0], em_transpose(x[1], -1, -2)))
UNARY_FN(f_matvec, em_matmul(x[0], x[1]))
static em_tensor *f_conv(em_tensor *const *x, void *c) {
  return em_conv2d(x[0], x[1], x[2], *(em_conv2d_params *)c);
}
static em_tensor *f_conv_bwd(em_tensor *const *x, void *c) {
  /* the backward convolutions are prims with rules of their own (double backward) */
  em_conv2d_params p = *(em_conv2d_params *)c;
  em_tensor *gi = em_conv2d_backward_input(x[0], x[1], ((int64_t[]){5, 5}), p);
  em_tensor *gw = em_conv2d_backward_weight(gi, x[0], ((int64_t[]){3, 3}), p);
  return em_add(em_sum(gi, 0, NULL, false), em_sum(em_mul(gw, gw), 0, NULL, false));
}

ETEST(gradcheck, extern_ops) {
  em_manual_seed(6);
  em_tensor *ab[2] = {gc_leaf(-1, 1, EM_SHAPE(2, 3, 4)), gc_leaf(-1, 1, EM_SHAPE(5, 4))};
  gradcheck("matmul batched, broadcast, transposed", f_matmul, NULL, 2, ab);
  em_tensor *mv[2] = {gc_leaf(-1, 1, EM_SHAPE(3, 4)), gc_leaf(-1, 1, EM_SHAPE(4))};
  gradcheck("matrix @ vector", f_matvec, NULL, 2, mv);
  em_conv2d_params p = {{2, 1}, {1, 0}, {1, 2}, 2};
  em_tensor *cx[3] = {gc_leaf(-1, 1, EM_SHAPE(2, 4, 5, 6)), gc_leaf(-1, 1, EM_SHAPE(4, 2, 3, 2)),
                      gc_leaf(-1, 1, EM_SHAPE(4))};
  gradcheck("conv2d", f_conv, &p, 3, cx);
  em_conv2d_params q = {{1, 1}, {1, 1}, {1, 1}, 1};
  em_tensor *bx[2] = {gc_leaf(-1, 1, EM_SHAPE(1, 2, 5, 5)), gc_leaf(-1, 1, EM_SHAPE(2, 3, 3, 3))};
  gradcheck("conv2d backward prims", f_conv_bwd, &q, 2, bx);
}

/* ---- engine behaviour ---- */

ETEST(engine, accumulates_over_backwards) {
  em_tensor *w = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_tensor *c = T(D, SHAPE(2), 3, 4);
  cr_assert(em_backward(em_sum(em_mul(w, c), 0, NULL, false), NULL));
  cr_assert(em_backward(em_sum(em_mul(w, c), 0, NULL, false), NULL));
  EXPECT(em_get_grad(w), D, SHAPE(2), 0, 6, 8);
  em_zero_grad(w);
  cr_assert_null(em_get_grad(w));
  /* a leaf used twice gets both contributions */
  cr_assert(em_backward(em_sum(em_mul(w, w), 0, NULL, false), NULL));
  EXPECT(em_get_grad(w), D, SHAPE(2), 0, 2, 4);
  cr_assert(!em_requires_grad(c));
  cr_assert_null(em_get_grad(c));
}

/* A leaf's first gradient, made by the backward pass and held by nothing else, becomes its
 * .grad as it is (no copy), and no two leaves or a user's tensor end up sharing one. */
static em_tensor *linear_loss(em_tensor *x, em_tensor *w, em_tensor *b) {
  return em_sum(em_mul(em_linear(x, w, b), em_linear(x, w, b)), 0, NULL, false);
}
ETEST(engine, first_gradient_is_taken_not_copied) {
  em_manual_seed(3);
  em_tensor *w = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(4, 3)), true);
  em_tensor *b = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(4)), true), *x = em_randn(EM_F32, EM_SHAPE(5, 3));
  em_tensor *l1 = linear_loss(x, w, b), *l2 = linear_loss(x, w, b);
  int64_t n0 = em_debug_alloc_count();
  cr_assert(em_backward(l1, NULL));
  int64_t first = em_debug_alloc_count() - n0; /* the gradients taken: no allocation for .grad */
  em_tensor *gw = em_clone(em_get_grad(w)), *gb = em_clone(em_get_grad(b));
  cr_assert(em_is_contiguous(em_get_grad(w)), "a linear weight's gradient is row-major like the weight");
  n0 = em_debug_alloc_count();
  cr_assert(em_backward(l2, NULL));
  int64_t second = em_debug_alloc_count() - n0; /* added in place: none either */
  cr_assert_leq(first, second, "the first backward allocated %lld times, the second %lld: a gradient was copied",
                (long long)first, (long long)second);
  EXPECT_SAME_BITS(em_get_grad(w), em_mul_scalar(gw, 2), "w.grad after two passes");
  EXPECT_SAME_BITS(em_get_grad(b), em_mul_scalar(gb, 2), "b.grad after two passes");

  /* add's rule hands one tensor to both operands, and each reshape's rule makes its own view of
   * it: one leaf may take that storage, the other copies it, so accumulating into one leaves the
   * other alone */
  em_tensor *p = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(3)), true), *q = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(3)), true);
  em_tensor *c = T(EM_F32, SHAPE(3), 1, 2, 3);
  em_tensor *pq = em_add(em_reshape(p, EM_SHAPE(1, 3)), em_reshape(q, EM_SHAPE(1, 3)));
  cr_assert(em_backward(em_sum(em_mul(pq, c), 0, NULL, false), NULL));
  cr_assert(em_backward(em_sum(em_mul(p, c), 0, NULL, false), NULL));
  EXPECT(em_get_grad(p), EM_F32, SHAPE(3), 0, 2, 4, 6);
  EXPECT(em_get_grad(q), EM_F32, SHAPE(3), 0, 1, 2, 3);

  /* a user's seed that reaches a leaf as it is (add's rule passes it through) is copied */
  em_tensor *r = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(3)), true), *seed = T(EM_F32, SHAPE(3), 1, 1, 1);
  cr_assert(em_backward(em_add(r, c), seed));
  cr_assert(em_add_(seed, c));
  EXPECT(em_get_grad(r), EM_F32, SHAPE(3), 0, 1, 1, 1);
}

ETEST(engine, seed_gradient_and_errors) {
  em_tensor *x = em_requires_grad_(T(EM_F32, SHAPE(3), 1, 2, 3), true);
  em_tensor *y = em_mul_scalar(x, 2);
  cr_assert(em_backward(y, T(EM_F32, SHAPE(3), 1, 0, -1)));
  EXPECT(em_get_grad(x), EM_F32, SHAPE(3), 0, 2, 0, -2);
  em_clear_error();
  cr_assert(!em_backward(em_mul_scalar(x, 2), NULL));
  cr_assert(strstr(em_last_error(), "one-element outputs"), "%s", em_last_error());
  em_clear_error();
  cr_assert(!em_backward(em_sum(T(EM_F32, SHAPE(2), 1, 2), 0, NULL, false), NULL));
  cr_assert(strstr(em_last_error(), "does not require grad"));
  em_clear_error();
  cr_assert(!em_backward(em_mul_scalar(x, 2), T(EM_F32, SHAPE(2), 1, 1)));
  cr_assert(strstr(em_last_error(), "does not match output f32[3]"), "%s", em_last_error());
  em_clear_error();
  /* issue 17: an i64 gradient for an f32 output was accepted */
  cr_assert(!em_backward(em_mul_scalar(x, 2), em_ones(EM_I64, EM_SHAPE(3))));
  cr_assert(strstr(em_last_error(), "grad i64[3] does not match output f32[3] (the same shape and dtype)"), "%s", em_last_error());
  em_clear_error();
  cr_assert_null(em_requires_grad_(em_ones(EM_I64, EM_SHAPE(1)), true));
  cr_assert(strstr(em_last_error(), "only floating tensors"));
  em_clear_error();
  cr_assert_null(em_requires_grad_(y, false));
  cr_assert(strstr(em_last_error(), "not a leaf (it was made by em_mul_scalar)"), "%s", em_last_error());
  em_clear_error();
}

ETEST(engine, no_grad_and_detach) {
  em_tensor *x = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_no_grad_begin();
  em_tensor *y = em_exp(x);
  em_no_grad_begin();
  em_no_grad_end();
  cr_assert(!em_is_grad_enabled());
  em_no_grad_end();
  cr_assert(em_is_grad_enabled());
  cr_assert(!em_requires_grad(y));
  cr_assert(em_is_leaf(y));
  em_tensor *z = em_exp(x);
  cr_assert(em_requires_grad(z));
  cr_assert_str_eq(em_grad_fn_name(z), "em_exp");
  em_tensor *d = em_detach(z);
  cr_assert(!em_requires_grad(d) && em_is_leaf(d) && em_shares_storage(d, z));
  cr_assert(em_backward(em_sum(em_mul(z, d), 0, NULL, false), NULL));
  EXPECT(em_get_grad(x), D, SHAPE(2), 1e-12, exp(2), exp(4)); /* d treated as a constant */
  cr_assert(em_set_grad_enabled(true), "grad mode was on");
}

static em_tensor *tanh_grad(em_tensor *x) {
  em_tensor *y = em_tanh(x), *g, *seed = em_ones(D, em_ndim(x), em_sizes(x));
  cr_assert(em_grad(1, &y, &seed, 1, &x, &g, false, true));
  return g;
}

ETEST(engine, double_backward_of_tanh) {
  em_tensor *x = em_requires_grad_(T(D, SHAPE(3), -1, 0.2, 1.5), true);
  em_tensor *g = tanh_grad(x); /* 1 - tanh^2, differentiable */
  cr_assert(em_requires_grad(g));
  em_tensor *gg, *seed = em_ones(D, EM_SHAPE(3));
  cr_assert(em_grad(1, &g, &seed, 1, &x, &gg, false, false), "%s",
            em_last_error() ? em_last_error() : "");
  double v[3] = {-1, 0.2, 1.5};
  for (int i = 0; i < 3; i++) {
    double t = tanh(v[i]);
    cr_assert(fabs(etest_at(gg, i) - (-2 * t * (1 - t * t))) < 1e-12, "d2/dx2 tanh at %g", v[i]);
  }
}

ETEST(engine, retain_graph_and_freed_graph) {
  em_tensor *x = em_requires_grad_(T(D, SHAPE(1), 2), true);
  em_tensor *y = em_mul(x, x);
  cr_assert(em_backward_ex(y, NULL, true, false));
  cr_assert(em_backward(y, NULL));
  EXPECT(em_get_grad(x), D, SHAPE(1), 0, 8);
  em_clear_error();
  cr_assert(!em_backward(y, NULL));
  cr_assert(strstr(em_last_error(), "backward through the graph a second time"), "%s", em_last_error());
  em_clear_error();
}

ETEST(engine, version_counter_error_names_both_ops) {
  em_tensor *x = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_tensor *c = T(D, SHAPE(2), 3, 4);
  int line_mul = __LINE__ + 1;
  em_tensor *y = em_mul(x, c);
  int line_add = __LINE__ + 1;
  em_add_(c, em_ones(D, EM_SHAPE(2)));
  em_clear_error();
  cr_assert(!em_backward(em_sum(y, 0, NULL, false), NULL));
  char want_mul[64], want_add[64];
  snprintf(want_mul, sizeof want_mul, "saved by em_mul at %s:%d", __FILE__, line_mul);
  snprintf(want_add, sizeof want_add, "modified in place by em_add_ at %s:%d", __FILE__, line_add);
  cr_assert(strstr(em_last_error(), want_mul), "%s", em_last_error());
  cr_assert(strstr(em_last_error(), want_add), "%s", em_last_error());
  em_clear_error();
}

ETEST(engine, inplace_rules) {
  em_tensor *w = em_requires_grad_(T(EM_F32, SHAPE(2), 1, 2), true);
  EXPECT_ERROR(em_mul_scalar_(w, 2), "leaf tensor f32[2] that requires grad is used in an in-place operation");
  em_no_grad_begin();
  cr_assert_not_null(em_mul_scalar_(w, 2));
  em_no_grad_end();
  EXPECT(w, EM_F32, SHAPE(2), 0, 2, 4);
  EXPECT_ERROR(em_add_(em_zeros(EM_F32, EM_SHAPE(2)), w), "operand that requires grad");
}

ETEST(engine, em_grad_on_intermediates_and_unused) {
  em_tensor *x = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_tensor *u = em_requires_grad_(T(D, SHAPE(1), 5), true);
  em_tensor *h = em_mul_scalar(x, 3);
  em_tensor *y = em_sum(em_mul(h, h), 0, NULL, false);
  em_tensor *g[3], *ins[3] = {x, h, u};
  cr_assert(em_grad(1, &y, NULL, 3, ins, g, false, false));
  EXPECT(g[0], D, SHAPE(2), 0, 18, 36);
  EXPECT(g[1], D, SHAPE(2), 0, 6, 12);
  EXPECT(g[2], D, SHAPE(1), 0, 0);
  cr_assert_null(em_get_grad(x), "em_grad does not accumulate");
}

ETEST(engine, graph_is_freed) {
  int64_t before = em_debug_live_tensors();
  em_scope_begin();
  em_tensor *w = em_retain(em_requires_grad_(em_ones(EM_F32, EM_SHAPE(64, 64)), true));
  em_scope_end();
  em_scope_begin();
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(8, 64));
  em_tensor *loss = em_sum(em_tanh(em_matmul(x, w)), 0, NULL, false);
  cr_assert(em_backward(loss, NULL));
  em_scope_end();
  /* only w and its grad remain: the graph went with the scope's tensors */
  cr_assert_eq(em_debug_live_tensors(), before + 2);
  em_release(w);
  cr_assert_eq(em_debug_live_tensors(), before);
}

ETEST(engine, deep_chain_releases_iteratively) {
  em_tensor *x = em_requires_grad_(T(EM_F32, SHAPE(1), 1), true);
  em_tensor *y;
  em_scope_begin();
  y = x;
  for (int i = 0; i < 20000; i++) {
    em_tensor *next = em_add_scalar(y, 0);
    em_keep(next);
    y = next;
  }
  em_scope_end();
  /* 20000 nodes chained; the kept tensors are released with the outer scope */
  cr_assert(em_backward(y, NULL));
  EXPECT(em_get_grad(x), EM_F32, SHAPE(1), 0, 1);
}
