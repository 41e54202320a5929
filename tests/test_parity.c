/* tests/test_parity.c: the places where Ember used to differ from PyTorch (issue 21, "semantic
 * differences"), each checked against values worked out by hand from PyTorch's definitions:
 * zero gradients of the piecewise-constant ops, round/trunc/frac, torch.result_type with 0-dim
 * tensors, prod's gradient with zeros, clamp's gradient at its bounds and with tensor bounds,
 * logsumexp over an empty extent. Then the same program compiled on every backend, replayed,
 * against eager. */
#include "common.h"
#include "gradcheck.h"

static em_tensor *leaf(em_tensor *t) { return em_requires_grad_(t, true); }

/* d sum(y) / dx */
static em_tensor *grad_of(em_tensor *y, em_tensor *x) {
  em_tensor *g = NULL;
  cr_assert_not_null(y, "%s", em_last_error() ? em_last_error() : "");
  em_tensor *seed = em_ones(em_dtype_of(y), em_ndim(y), em_sizes(y));
  cr_assert(em_grad(1, &y, &seed, 1, &x, &g, false, false), "%s", em_last_error() ? em_last_error() : "");
  return g;
}

ETEST(parity, piecewise_constant_ops_have_zero_gradients) {
  em_tensor *x = leaf(T(EM_F32, SHAPE(5), -1.5, -0.2, 0, 0.7, 2.5));
  em_tensor *(*ops[])(em_tensor *, em_site) = {em_sign_at, em_floor_at, em_ceil_at, em_round_at, em_trunc_at};
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    em_tensor *y = ops[i](x, EM_HERE);
    cr_assert(em_requires_grad(y), "op %zu: the output requires grad when the input does, as in torch", i);
    EXPECT_ALL(grad_of(y, x), EM_F32, SHAPE(5), 0, 0);
  }
  EXPECT_ALL(grad_of(em_frac(x), x), EM_F32, SHAPE(5), 0, 1);
  /* through a larger expression: d/dx (x * floor(x)) = floor(x) */
  EXPECT(grad_of(em_mul(x, em_floor(x)), x), EM_F32, SHAPE(5), 0, -2, -1, 0, 0, 2);
  /* integers never require grad, and the ops stay identities on them */
  EXPECT(em_floor(T(EM_I64, SHAPE(2), -3, 4)), EM_I64, SHAPE(2), 0, -3, 4);
}

ETEST(parity, round_trunc_frac_values) {
  for (int d = 0; d < 2; d++) {
    em_dtype dt = d ? EM_F64 : EM_F32;
    em_tensor *x = T(dt, SHAPE(12), -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.4, 0.6, 8388609, NAN, INFINITY, -INFINITY);
    EXPECT(em_round(x), dt, SHAPE(12), 0, -2, -2, -0.0, 0, 2, 2, -0.0, 1, 8388609, NAN, INFINITY, -INFINITY);
    EXPECT(em_trunc(x), dt, SHAPE(12), 0, -2, -1, -0.0, 0, 1, 2, -0.0, 0, 8388609, NAN, INFINITY, -INFINITY);
    EXPECT(em_frac(x), dt, SHAPE(12), 1e-6, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -0.4, 0.6, 0, NAN, NAN, NAN);
    /* a zero result takes x's sign, as torch: round(-0.4) and trunc(-0.5) are -0.0 */
    cr_assert(signbit(etest_at(em_round(x), 6)) && signbit(etest_at(em_round(x), 2)));
    cr_assert(signbit(etest_at(em_trunc(x), 2)) && !signbit(etest_at(em_trunc(x), 3)));
  }
  /* the largest f32 below 0.5 rounds down (x + 0.5 would round up to 1 in f32) */
  EXPECT(em_round(T(EM_F32, SHAPE(1), 0.49999997)), EM_F32, SHAPE(1), 0, 0);
  /* f64 halves beyond f32's range of exact integers */
  EXPECT(em_round(T(EM_F64, SHAPE(3), 4503599627370495.5, 1e300, 3.5)), EM_F64, SHAPE(3), 0, 4503599627370496.0, 1e300,
         4);
  EXPECT(em_round(T(EM_I32, SHAPE(2), -7, 9)), EM_I32, SHAPE(2), 0, -7, 9);
  EXPECT(em_trunc(T(EM_I64, SHAPE(2), -7, 9)), EM_I64, SHAPE(2), 0, -7, 9);
  EXPECT_ERROR(em_frac(T(EM_I64, SHAPE(2), -7, 9)), "em_frac");
}

ETEST(parity, zero_dim_tensors_promote_as_torch_result_type) {
  em_tensor *f32 = T(EM_F32, SHAPE(3), 1, 2, 3), *i32 = T(EM_I32, SHAPE(3), 1, 2, 3);
  em_tensor *b = T(EM_BOOL, SHAPE(3), 1, 0, 1);
  em_tensor *f64_0 = T(EM_F64, SCALAR_SHAPE, 0.5), *i64_0 = T(EM_I64, SCALAR_SHAPE, 2);
  em_tensor *f32_0 = T(EM_F32, SCALAR_SHAPE, 2), *i32_0 = T(EM_I32, SCALAR_SHAPE, 2);
  /* same category: the dimensioned operand decides */
  EXPECT(em_mul(f32, f64_0), EM_F32, SHAPE(3), 0, 0.5, 1, 1.5);
  EXPECT(em_mul(f64_0, f32), EM_F32, SHAPE(3), 0, 0.5, 1, 1.5);
  EXPECT(em_add(i32, i64_0), EM_I32, SHAPE(3), 0, 3, 4, 5);
  /* a higher category: the 0-dim operand's dtype */
  EXPECT(em_mul(i32, f64_0), EM_F64, SHAPE(3), 0, 0.5, 1, 1.5);
  EXPECT(em_add(b, i32_0), EM_I32, SHAPE(3), 0, 3, 2, 3);
  /* both 0-dim, or both dimensioned: ordinary promotion */
  EXPECT(em_mul(f32_0, f64_0), EM_F64, SCALAR_SHAPE, 0, 1);
  EXPECT(em_add(i32, em_cast(T(EM_I64, SHAPE(1), 2), EM_I64)), EM_I64, SHAPE(3), 0, 3, 4, 5);
  /* where and the comparisons follow the same rule */
  EXPECT(em_where(b, f32, f64_0), EM_F32, SHAPE(3), 0, 1, 0.5, 3);
  EXPECT(em_maximum(i32, i64_0), EM_I32, SHAPE(3), 0, 2, 2, 3);
  /* in place: f32 += 0-dim f64 is allowed (the result type is f32); i32 += 0-dim f64 is not */
  em_tensor *dst = em_clone(f32);
  cr_assert_not_null(em_add_(dst, f64_0), "%s", em_last_error() ? em_last_error() : "");
  EXPECT(dst, EM_F32, SHAPE(3), 0, 1.5, 2.5, 3.5);
  EXPECT_ERROR(em_add_(em_clone(i32), f64_0), "cannot be cast");
  /* number operands are unchanged: i32 * 0.5 is f32 */
  EXPECT(em_mul_scalar(i32, 0.5), EM_F32, SHAPE(3), 0, 0.5, 1, 1.5);
}

static em_tensor *prod_rows(em_tensor *const *x, void *ctx) {
  (void)ctx;
  return em_prod(x[0], 1, (int64_t[]){1}, false);
}

ETEST(parity, prod_gradient_with_zeros) {
  em_tensor *x = leaf(T(EM_F64, SHAPE(3, 3), 2, 0, 3, 0, 0, 4, 1, 2, 3));
  /* rows: one zero -> that element gets the product of the others; two zeros -> all 0; none ->
   * prod / x */
  em_tensor *g = grad_of(em_prod(x, 1, (int64_t[]){1}, false), x);
  EXPECT(g, EM_F64, SHAPE(3, 3), 0, 0, 6, 0, 0, 0, 0, 6, 3, 2);
  /* over everything: two zeros anywhere give zero */
  EXPECT_ALL(grad_of(em_prod(x, 0, NULL, false), x), EM_F64, SHAPE(3, 3), 0, 0);
  em_tensor *y = leaf(T(EM_F32, SHAPE(4), 0, 2, -3, 5));
  EXPECT(grad_of(em_prod(y, 0, NULL, true), y), EM_F32, SHAPE(4), 0, -30, 0, 0, 0);
  /* and the rule agrees with finite differences there */
  em_tensor *z = leaf(T(EM_F64, SHAPE(2, 3), 0, 1.5, -2, 0.5, 3, 0.25));
  gradcheck("prod over a zero", prod_rows, NULL, 1, &z);
}

ETEST(parity, clamp_passes_the_whole_gradient_at_its_bounds) {
  em_tensor *x = leaf(T(EM_F32, SHAPE(6), -1, 0, 0.5, 1, 2, NAN));
  em_tensor *y = em_clamp(x, 0, 1);
  EXPECT(y, EM_F32, SHAPE(6), 0, 0, 0, 0.5, 1, 1, NAN);
  /* NaN fails torch's mask lo <= x <= hi, so it gets no gradient */
  EXPECT(grad_of(y, x), EM_F32, SHAPE(6), 0, 0, 1, 1, 1, 0, 0);
  EXPECT(grad_of(em_clamp(x, 0, INFINITY), x), EM_F32, SHAPE(6), 0, 0, 1, 1, 1, 1, 0);
  EXPECT(grad_of(em_clamp(x, -INFINITY, 1), x), EM_F32, SHAPE(6), 0, 1, 1, 1, 1, 0, 0);
  /* lo > hi gives hi everywhere (torch.clamp), and no gradient to x */
  em_tensor *swapped = em_clamp(x, 1, 0);
  EXPECT(swapped, EM_F32, SHAPE(6), 0, 0, 0, 0, 0, 0, NAN);
  EXPECT_ALL(grad_of(swapped, x), EM_F32, SHAPE(6), 0, 0);
  /* a NaN bound gives NaN; an integer x with a fractional bound gives f32 */
  EXPECT_ALL(em_clamp(T(EM_F64, SHAPE(2), 1, 2), NAN, 3), EM_F64, SHAPE(2), 0, NAN);
  EXPECT(em_clamp(T(EM_I32, SHAPE(3), -4, 1, 9), -2.5, 3), EM_F32, SHAPE(3), 0, -2.5, 1, 3);
  EXPECT(em_clamp(T(EM_I64, SHAPE(3), -4, 1, 9), -2, 3), EM_I64, SHAPE(3), 0, -2, 1, 3);
}

static em_tensor *clamp_t(em_tensor *const *x, void *ctx) {
  (void)ctx;
  return em_clamp_tensor(x[0], x[1], x[2]);
}

ETEST(parity, clamp_with_tensor_bounds) {
  /* by element: x < lo < hi; x > hi; inside; lo > hi; x == lo == hi */
  em_tensor *x = leaf(T(EM_F64, SHAPE(5), 0, 5, 2, 3, 1));
  em_tensor *lo = leaf(T(EM_F64, SHAPE(5), 1, 1, 1, 4, 1));
  em_tensor *hi = leaf(T(EM_F64, SHAPE(5), 2, 4, 3, 2, 1));
  em_tensor *y = em_clamp_tensor(x, lo, hi);
  EXPECT(y, EM_F64, SHAPE(5), 0, 1, 4, 2, 2, 1);
  em_tensor *seed = em_ones(EM_F64, 1, (int64_t[]){5}), *g[3], *in[3] = {x, lo, hi};
  cr_assert(em_grad(1, &y, &seed, 3, in, g, false, false), "%s", em_last_error() ? em_last_error() : "");
  EXPECT(g[0], EM_F64, SHAPE(5), 0, 0, 0, 1, 0, 1);
  EXPECT(g[1], EM_F64, SHAPE(5), 0, 1, 0, 0, 0, 0);
  EXPECT(g[2], EM_F64, SHAPE(5), 0, 0, 1, 0, 1, 0);
  /* broadcast bounds: a 0-dim lo and a row hi, gradients summed back to their shapes */
  em_tensor *m = leaf(T(EM_F64, SHAPE(2, 3), -1, 0.5, 3, 0.2, -2, 0.7));
  em_tensor *l0 = leaf(T(EM_F64, SCALAR_SHAPE, 0));
  em_tensor *h1 = leaf(T(EM_F64, SHAPE(3), 1, 1, 0.5));
  em_tensor *z = em_clamp_tensor(m, l0, h1);
  EXPECT(z, EM_F64, SHAPE(2, 3), 0, 0, 0.5, 0.5, 0.2, 0, 0.5);
  em_tensor *seed2 = em_ones(EM_F64, 2, (int64_t[]){2, 3}), *g2[3], *in2[3] = {m, l0, h1};
  cr_assert(em_grad(1, &z, &seed2, 3, in2, g2, false, false), "%s", em_last_error() ? em_last_error() : "");
  EXPECT(g2[0], EM_F64, SHAPE(2, 3), 0, 0, 1, 0, 1, 0, 0);
  EXPECT(g2[1], EM_F64, SCALAR_SHAPE, 0, 2);
  EXPECT(g2[2], EM_F64, SHAPE(3), 0, 0, 0, 2);
  /* one bound only (EM_NONE for the other), and finite differences away from the kinks */
  EXPECT(em_clamp_tensor(T(EM_F32, SHAPE(3), -1, 0, 1), T(EM_F32, SHAPE(1), 0), EM_NONE), EM_F32, SHAPE(3), 0, 0, 0, 1);
  EXPECT(em_clamp_tensor(T(EM_F32, SHAPE(3), -1, 0, 1), EM_NONE, T(EM_F32, SHAPE(1), 0)), EM_F32, SHAPE(3), 0, -1, 0, 0);
  em_tensor *gx[3] = {leaf(T(EM_F64, SHAPE(4), -1, 0.5, 3, 0.25)), leaf(T(EM_F64, SHAPE(4), 0, 0, 0, 1)),
                      leaf(T(EM_F64, SHAPE(4), 1, 1, 1, 0.5))};
  gradcheck("clamp_tensor", clamp_t, NULL, 3, gx);
  EXPECT_ERROR(em_clamp_tensor(x, EM_NONE, EM_NONE), "em_clamp_tensor");
  EXPECT_ERROR(em_clamp_tensor(x, T(EM_F64, SHAPE(2), 0, 1), EM_NONE), "broadcast");
  em_clear_error();
  cr_assert_null(em_clamp_tensor(x, NULL, hi), "NULL is an earlier failure, not 'no bound'");
}

ETEST(parity, logsumexp_over_an_empty_extent_is_minus_infinity) {
  em_tensor *x = leaf(em_zeros(EM_F32, 2, (int64_t[]){2, 0}));
  em_tensor *y = em_logsumexp(x, 1, (int64_t[]){1}, false);
  EXPECT_ALL(y, EM_F32, SHAPE(2), 0, -INFINITY);
  EXPECT_ALL(em_logsumexp(x, 1, (int64_t[]){1}, true), EM_F32, SHAPE(2, 1), 0, -INFINITY);
  EXPECT_ALL(em_logsumexp(x, 0, NULL, false), EM_F32, SCALAR_SHAPE, 0, -INFINITY);
  EXPECT_ALL(em_logsumexp(x, 1, (int64_t[]){0}, false), EM_F32, SHAPE(0), 0, 0);
  EXPECT_ALL(grad_of(y, x), EM_F32, SHAPE(2, 0), 0, 0);
}

/* Everything above in one program, compiled: values and gradients must equal eager's on every
 * backend, on the tracing call and on the replay. */
static em_outputs program(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *x = in[0], *lo = in[1];
  em_tensor *a = em_add(em_mul(x, em_floor(x)), em_sign(x));
  em_tensor *b = em_add(em_round(em_mul_scalar(x, 2)), em_frac(x));
  em_tensor *c = em_clamp(x, -1, 1);
  em_tensor *d = em_clamp_tensor(x, lo, EM_NONE);
  em_tensor *p = em_prod(em_mul(x, em_trunc(x)), 1, (int64_t[]){1}, true);
  em_tensor *s = em_mul(em_add(em_add(a, b), em_add(c, d)), p);
  return EM_OUTPUTS(em_sum(s, 0, NULL, false), em_logsumexp(x, 1, (int64_t[]){1}, false));
}

ETEST(parity, compiled_programs_agree_with_eager) {
  /* exact halves, bounds and zeros: the cases where the old rules differed */
  em_tensor *x = leaf(T(EM_F32, SHAPE(3, 4), -1, 0, 0.5, 1, 1.25, -0.75, 2, 0.25, -1.5, 3, 1, -2));
  em_tensor *lo = leaf(T(EM_F32, SHAPE(4), 0, 0, 1, -2));
  em_tensor *in[2] = {x, lo}, *ge[2], *gc[2];
  em_outputs want = program(NULL, in, 2);
  em_tensor *seed = em_ones(EM_F32, 0, NULL);
  cr_assert(em_grad(1, &want.t[0], &seed, 2, in, ge, false, false), "%s", em_last_error() ? em_last_error() : "");
  static const char *const backends[] = {"eager", "aot_eager", "inductor"};
  for (int bk = 0; bk < 3; bk++) {
    em_compiled *c = em_compile(program, &(em_compile_options){.backend = backends[bk], .fullgraph = true});
    for (int call = 0; call < 2; call++) {
      em_outputs got = em_call_n(c, NULL, 2, in);
      cr_assert_not_null(got.t[0], "%s call %d: %s", backends[bk], call, em_last_error() ? em_last_error() : "");
      for (int o = 0; o < 2; o++)
        cr_assert(em_item(em_sum(em_abs(em_sub(got.t[o], want.t[o])), 0, NULL, false)) <= 1e-4,
                  "%s call %d: output %d differs from eager", backends[bk], call, o);
      cr_assert(em_grad(1, &got.t[0], &seed, 2, in, gc, false, false), "%s: %s", backends[bk],
                em_last_error() ? em_last_error() : "");
      for (int i = 0; i < 2; i++)
        cr_assert(em_item(em_amax(em_abs(em_sub(gc[i], ge[i])), 0, NULL, false)) <= 1e-3 * (1 + em_item(em_amax(em_abs(ge[i]), 0, NULL, false))),
                  "%s call %d: gradient %d differs from eager", backends[bk], call, i);
    }
    em_compiled_free(c);
  }
}

static em_outputs cube_sum(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_sum(em_mul(em_mul(in[0], in[0]), in[0]), 0, NULL, false));
}

/* Double backward through a compiled function: exact when its backward reads only primal inputs
 * (they carry their history; the min-cut partitioner recomputes x * x from x here), and refused
 * with a clear error when it reads saved activations (the default partitioner saves x * x, which
 * has no history: the old behaviour was a silently wrong second derivative, 8 instead of 12). */
ETEST(parity, double_backward_through_compiled_code_is_exact_or_refused) {
  em_tensor *x = leaf(T(EM_F32, SHAPE(3), 2, -1, 0.5));
  static const char *const partitioners[] = {"min_cut", "default"};
  for (int p = 0; p < 2; p++) {
    em_compiled *c = em_compile(cube_sum, &(em_compile_options){.backend = "aot_eager", .partitioner = partitioners[p]});
    for (int call = 0; call < 2; call++) {
      em_tensor *y = em_call(c, NULL, x).t[0], *g = NULL, *gg = NULL;
      cr_assert_not_null(y, "%s", em_last_error() ? em_last_error() : "");
      bool ok = em_grad(1, &y, NULL, 1, &x, &g, false, true);
      if (p == 1) {
        cr_assert(!ok && em_last_error() && strstr(em_last_error(), "double backward"), "%s: expected a refusal",
                  partitioners[p]);
        em_clear_error();
        continue;
      }
      cr_assert(ok, "%s: %s", partitioners[p], em_last_error() ? em_last_error() : "");
      EXPECT(g, EM_F32, SHAPE(3), 1e-6, 12, 3, 0.75); /* 3 x^2 */
      em_tensor *s = em_sum(g, 0, NULL, false);
      cr_assert(em_grad(1, &s, NULL, 1, &x, &gg, false, false), "%s", em_last_error() ? em_last_error() : "");
      EXPECT(gg, EM_F32, SHAPE(3), 1e-6, 12, -6, 3); /* 6 x */
    }
    em_compiled_free(c);
  }
}
