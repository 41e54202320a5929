/* tests/test_pointwise.c: pointwise prims through the public API: values by hand, every dtype
 * each op accepts, type promotion, broadcasting, strided inputs, 0-size and size-1 dims,
 * scalar and in-place variants. */
#include "common.h"

#define F EM_F32
#define D EM_F64
static const double E = 2.718281828459045;

ETEST(unary, float_functions) {
  em_tensor *x = T(F, SHAPE(4), 0, 1, 2, -0.5);
  EXPECT(em_exp(x), F, SHAPE(4), 1e-6, 1, E, E * E, exp(-0.5));
  EXPECT(em_expm1(x), F, SHAPE(4), 1e-6, 0, E - 1, E * E - 1, expm1(-0.5));
  EXPECT(em_tanh(x), F, SHAPE(4), 1e-6, 0, tanh(1), tanh(2), tanh(-0.5));
  EXPECT(em_erf(x), F, SHAPE(4), 1e-6, 0, erf(1), erf(2), erf(-0.5));
  EXPECT(em_sin(x), F, SHAPE(4), 1e-6, 0, sin(1), sin(2), sin(-0.5));
  EXPECT(em_cos(x), F, SHAPE(4), 1e-6, 1, cos(1), cos(2), cos(-0.5));
  em_tensor *p = T(D, SHAPE(4), 1, 4, 0.25, 0);
  EXPECT(em_log(p), D, SHAPE(4), 1e-15, 0, log(4), log(0.25), -INFINITY);
  EXPECT(em_log1p(p), D, SHAPE(4), 1e-15, log(2), log(5), log(1.25), 0);
  EXPECT(em_sqrt(p), D, SHAPE(4), 1e-15, 1, 2, 0.5, 0);
  EXPECT(em_rsqrt(p), D, SHAPE(4), 1e-15, 1, 0.5, 2, INFINITY);
  EXPECT(em_reciprocal(p), D, SHAPE(4), 1e-15, 1, 0.25, 4, INFINITY);
  EXPECT(em_sqrt(T(F, SHAPE(1), -1)), F, SHAPE(1), 0, NAN);
}

ETEST(unary, long_rows_use_vector_paths) {
  /* 37 elements: the SLEEF 8-wide loop plus a scalar tail, checked against libm. */
  double v[37], e[37];
  for (int i = 0; i < 37; i++) v[i] = -3 + 0.17 * i, e[i] = exp(v[i]);
  em_tensor *x = em_cast(em_from_data(v, D, EM_SHAPE(37)), F);
  em_tensor *y = em_exp(x);
  for (int i = 0; i < 37; i++) cr_assert(fabs(etest_at(y, i) - e[i]) <= 2e-6 * e[i], "exp at %d", i);
  em_tensor *t = em_tanh(x);
  for (int i = 0; i < 37; i++) cr_assert(fabs(etest_at(t, i) - tanh(v[i])) <= 2e-6, "tanh at %d", i);
}

ETEST(unary, integer_inputs_promote_to_f32) {
  EXPECT(em_exp(T(EM_I64, SHAPE(2), 0, 1)), F, SHAPE(2), 1e-6, 1, E);
  EXPECT(em_sqrt(T(EM_BOOL, SHAPE(2), 0, 1)), F, SHAPE(2), 0, 0, 1);
  EXPECT(em_sin(T(EM_U8, SHAPE(1), 0)), F, SHAPE(1), 0, 0);
}

ETEST(unary, numeric_functions_keep_dtype) {
  EXPECT(em_neg(T(EM_I32, SHAPE(3), 1, -2, 0)), EM_I32, SHAPE(3), 0, -1, 2, 0);
  EXPECT(em_abs(T(EM_I64, SHAPE(3), 1, -2, 0)), EM_I64, SHAPE(3), 0, 1, 2, 0);
  EXPECT(em_abs(T(F, SHAPE(2), -1.5, 2)), F, SHAPE(2), 0, 1.5, 2);
  EXPECT(em_sign(T(F, SHAPE(4), -3, 0, 2, NAN)), F, SHAPE(4), 0, -1, 0, 1, 0); /* sign(NaN) = 0, as torch */
  EXPECT(em_sign(T(EM_I32, SHAPE(3), -3, 0, 2)), EM_I32, SHAPE(3), 0, -1, 0, 1);
  EXPECT(em_sign(T(EM_U8, SHAPE(2), 0, 7)), EM_U8, SHAPE(2), 0, 0, 1);
  EXPECT(em_floor(T(D, SHAPE(3), -1.5, 1.5, 2)), D, SHAPE(3), 0, -2, 1, 2);
  EXPECT(em_ceil(T(D, SHAPE(3), -1.5, 1.5, 2)), D, SHAPE(3), 0, -1, 2, 2);
  EXPECT(em_floor(T(EM_I64, SHAPE(1), 5)), EM_I64, SHAPE(1), 0, 5);
  EXPECT(em_neg(T(EM_U8, SHAPE(1), 1)), EM_U8, SHAPE(1), 0, 255);
  EXPECT(em_logical_not(T(F, SHAPE(3), 0, 2, -1)), EM_BOOL, SHAPE(3), 0, 1, 0, 0);
  EXPECT(em_logical_not(T(EM_BOOL, SHAPE(2), 0, 1)), EM_BOOL, SHAPE(2), 0, 1, 0);
  EXPECT(em_abs(T(EM_BOOL, SHAPE(2), 0, 1)), EM_BOOL, SHAPE(2), 0, 0, 1);
}

ETEST(binary, arithmetic_every_dtype) {
  em_dtype all[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_U8};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    em_dtype dt = all[i];
    em_tensor *a = T(dt, SHAPE(3), 6, 9, 4), *b = T(dt, SHAPE(3), 2, 3, 4);
    EXPECT(em_add(a, b), dt, SHAPE(3), 0, 8, 12, 8);
    EXPECT(em_sub(a, b), dt, SHAPE(3), 0, 4, 6, 0);
    EXPECT(em_mul(a, b), dt, SHAPE(3), 0, 12, 27, 16);
    EXPECT(em_maximum(a, b), dt, SHAPE(3), 0, 6, 9, 4);
    EXPECT(em_minimum(a, b), dt, SHAPE(3), 0, 2, 3, 4);
    EXPECT(em_pow(a, T(dt, SHAPE(3), 2, 1, 3)), dt, SHAPE(3), 1e-6, 36, 9, 64);
    EXPECT(em_remainder(a, T(dt, SHAPE(3), 4, 5, 3)), dt, SHAPE(3), 0, 2, 4, 1);
    EXPECT(em_div(a, b), (dt == EM_F32 || dt == EM_F64) ? dt : EM_F32, SHAPE(3), 1e-7, 3, 3, 1);
  }
}

ETEST(binary, bool_arithmetic) {
  em_tensor *a = T(EM_BOOL, SHAPE(4), 0, 0, 1, 1), *b = T(EM_BOOL, SHAPE(4), 0, 1, 0, 1);
  EXPECT(em_add(a, b), EM_BOOL, SHAPE(4), 0, 0, 1, 1, 1);
  EXPECT(em_mul(a, b), EM_BOOL, SHAPE(4), 0, 0, 0, 0, 1);
  EXPECT(em_maximum(a, b), EM_BOOL, SHAPE(4), 0, 0, 1, 1, 1);
  EXPECT(em_logical_and(a, b), EM_BOOL, SHAPE(4), 0, 0, 0, 0, 1);
  EXPECT(em_logical_or(a, b), EM_BOOL, SHAPE(4), 0, 0, 1, 1, 1);
  EXPECT_ERROR(em_sub(a, b), "bool");
}

ETEST(binary, python_remainder_and_division) {
  em_tensor *a = T(D, SHAPE(4), 5, -5, 5, -5), *b = T(D, SHAPE(4), 3, 3, -3, -3);
  EXPECT(em_remainder(a, b), D, SHAPE(4), 1e-15, 2, 1, -1, -2);
  EXPECT(em_remainder(em_cast(a, EM_I64), em_cast(b, EM_I64)), EM_I64, SHAPE(4), 0, 2, 1, -1, -2);
  EXPECT(em_div(T(EM_I64, SHAPE(2), 7, -7), T(EM_I64, SHAPE(2), 2, 2)), F, SHAPE(2), 0, 3.5, -3.5);
  EXPECT(em_div(T(F, SHAPE(2), 1, -1), T(F, SHAPE(2), 0, 0)), F, SHAPE(2), 0, INFINITY, -INFINITY);
}

/* C's atan2, quadrant by quadrant, on the axes and signed zeros (torch.atan2); integers promote
 * to f32. */
ETEST(binary, atan2_quadrants_axes_and_zeros) {
  const double pi = 3.14159265358979323846;
  em_tensor *y = T(D, SHAPE(8), 1, 1, -1, -1, 0, -0.0, 0, -0.0), *x = T(D, SHAPE(8), 1, -1, -1, 1, -1, -1, 1, 1);
  EXPECT(em_atan2(y, x), D, SHAPE(8), 1e-15, pi / 4, 3 * pi / 4, -3 * pi / 4, -pi / 4, pi, -pi, 0, -0.0);
  em_tensor *r = em_atan2(T(F, SHAPE(3), 1, 0, NAN), T(F, SHAPE(3), 0, 0, 1));
  EXPECT(r, F, SHAPE(3), 1e-7, pi / 2, 0, NAN);
  EXPECT(em_atan2(T(EM_I64, SHAPE(2), 1, -1), T(EM_I32, SHAPE(2), 1, 1)), F, SHAPE(2), 1e-7, pi / 4, -pi / 4);
  EXPECT(em_atan2(T(D, SHAPE(2, 1), 1, 2), T(D, SHAPE(2), 1, 2)), D, SHAPE(2, 2), 1e-15, atan2(1, 1), atan2(1, 2), atan2(2, 1), atan2(2, 2));
}

ETEST(binary, nan_propagates_through_maximum) {
  EXPECT(em_maximum(T(F, SHAPE(3), NAN, 1, 2), T(F, SHAPE(3), 0, NAN, 1)), F, SHAPE(3), 0, NAN, NAN, 2);
  EXPECT(em_minimum(T(D, SHAPE(2), NAN, 1), T(D, SHAPE(2), 0, -1)), D, SHAPE(2), 0, NAN, -1);
}

ETEST(binary, comparisons) {
  em_tensor *a = T(F, SHAPE(3), 1, 2, 3), *b = T(EM_I64, SHAPE(3), 2, 2, 2);
  EXPECT(em_eq(a, b), EM_BOOL, SHAPE(3), 0, 0, 1, 0);
  EXPECT(em_ne(a, b), EM_BOOL, SHAPE(3), 0, 1, 0, 1);
  EXPECT(em_lt(a, b), EM_BOOL, SHAPE(3), 0, 1, 0, 0);
  EXPECT(em_le(a, b), EM_BOOL, SHAPE(3), 0, 1, 1, 0);
  EXPECT(em_gt(a, b), EM_BOOL, SHAPE(3), 0, 0, 0, 1);
  EXPECT(em_ge(a, b), EM_BOOL, SHAPE(3), 0, 0, 1, 1);
  EXPECT(em_lt(T(EM_U8, SHAPE(2), 1, 200), T(EM_U8, SHAPE(2), 2, 100)), EM_BOOL, SHAPE(2), 0, 1, 0);
  /* compared in f32 after promotion: 2.5 is not 2 */
  EXPECT(em_eq_scalar(T(EM_I32, SHAPE(2), 2, 3), 2.5), EM_BOOL, SHAPE(2), 0, 0, 0);
  EXPECT(em_gt_scalar(T(EM_I32, SHAPE(2), 2, 3), 2.5), EM_BOOL, SHAPE(2), 0, 0, 1);
}

ETEST(promotion, result_type_table) {
  struct { em_dtype a, b, r; } cases[] = {
      {EM_F32, EM_F64, EM_F64}, {EM_I32, EM_F32, EM_F32}, {EM_I64, EM_F32, EM_F32},
      {EM_I32, EM_I64, EM_I64}, {EM_U8, EM_I32, EM_I32}, {EM_BOOL, EM_U8, EM_U8},
      {EM_BOOL, EM_I64, EM_I64}, {EM_BOOL, EM_F64, EM_F64}, {EM_U8, EM_F64, EM_F64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    em_tensor *a = T(cases[i].a, SHAPE(1), 1), *b = T(cases[i].b, SHAPE(1), 1);
    EXPECT(em_add(a, b), cases[i].r, SHAPE(1), 0, cases[i].a == EM_BOOL && cases[i].b == EM_BOOL ? 1 : 2);
    EXPECT(em_add(b, a), cases[i].r, SHAPE(1), 0, 2);
  }
}

ETEST(promotion, scalars_keep_the_tensor_dtype) {
  EXPECT(em_mul_scalar(T(EM_I32, SHAPE(2), 1, 2), 3), EM_I32, SHAPE(2), 0, 3, 6);
  EXPECT(em_mul_scalar(T(EM_I32, SHAPE(2), 1, 2), 0.5), F, SHAPE(2), 0, 0.5, 1);
  EXPECT(em_add_scalar(T(F, SHAPE(1), 1), 1e-3), F, SHAPE(1), 1e-7, 1.001);
  EXPECT(em_add_scalar(T(EM_BOOL, SHAPE(2), 0, 1), 1), EM_I64, SHAPE(2), 0, 1, 2);
  EXPECT(em_add_scalar(T(EM_U8, SHAPE(1), 250), 10), EM_U8, SHAPE(1), 0, 4);
  EXPECT(em_sub_scalar(T(D, SHAPE(1), 1), 0.25), D, SHAPE(1), 0, 0.75);
  EXPECT(em_div_scalar(T(EM_I64, SHAPE(1), 3), 2), F, SHAPE(1), 0, 1.5);
  EXPECT(em_pow_scalar(T(F, SHAPE(2), 2, 4), 0.5), F, SHAPE(2), 1e-7, sqrt(2), 2);
  EXPECT(em_maximum_scalar(T(F, SHAPE(3), -1, 0, 2), 0), F, SHAPE(3), 0, 0, 0, 2);
  EXPECT(em_minimum_scalar(T(EM_I64, SHAPE(2), -1, 5), 3), EM_I64, SHAPE(2), 0, -1, 3);
  EXPECT(em_remainder_scalar(T(EM_I64, SHAPE(2), -1, 5), 3), EM_I64, SHAPE(2), 0, 2, 2);
  EXPECT(em_ne_scalar(T(F, SHAPE(2), 0, 1), 0), EM_BOOL, SHAPE(2), 0, 0, 1);
  EXPECT(em_le_scalar(T(F, SHAPE(2), 0, 1), 0), EM_BOOL, SHAPE(2), 0, 1, 0);
  EXPECT(em_ge_scalar(T(F, SHAPE(2), 0, 1), 1), EM_BOOL, SHAPE(2), 0, 0, 1);
  EXPECT(em_lt_scalar(T(F, SHAPE(2), 0, 1), 1), EM_BOOL, SHAPE(2), 0, 1, 0);
}

ETEST(broadcast, shapes) {
  em_tensor *col = T(F, SHAPE(3, 1), 1, 2, 3), *row = T(F, SHAPE(4), 10, 20, 30, 40);
  EXPECT(em_add(col, row), F, SHAPE(3, 4), 0, 11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43);
  EXPECT(em_sub(row, col), F, SHAPE(3, 4), 0, 9, 19, 29, 39, 8, 18, 28, 38, 7, 17, 27, 37);
  em_tensor *s = em_scalar(F, 2);
  EXPECT(em_mul(s, col), F, SHAPE(3, 1), 0, 2, 4, 6);
  em_tensor *a = T(F, SHAPE(2, 1, 2), 1, 2, 3, 4), *b = T(F, SHAPE(3, 1), 10, 20, 30);
  EXPECT(em_add(a, b), F, SHAPE(2, 3, 2), 0, 11, 12, 21, 22, 31, 32, 13, 14, 23, 24, 33, 34);
  EXPECT_ERROR(em_add(T(F, SHAPE(3), 1, 2, 3), T(F, SHAPE(2), 1, 2)), "cannot broadcast: f32[3], f32[2]");
}

ETEST(strided, transposed_sliced_expanded_inputs) {
  em_tensor *m = em_reshape(em_arange(F, 0, 6, 1), EM_SHAPE(2, 3));
  em_tensor *t = em_transpose(m, 0, 1); /* [[0,3],[1,4],[2,5]] */
  cr_assert(!em_is_contiguous(t));
  EXPECT(em_add(t, t), F, SHAPE(3, 2), 0, 0, 6, 2, 8, 4, 10);
  em_tensor *odd = em_slice(em_arange(D, 0, 10, 1), 0, 1, 10, 3); /* 1, 4, 7 */
  EXPECT(em_mul(odd, odd), D, SHAPE(3), 0, 1, 16, 49);
  em_tensor *e = em_expand(T(F, SHAPE(3, 1), 1, 2, 3), EM_SHAPE(3, 2));
  EXPECT(em_mul(e, t), F, SHAPE(3, 2), 0, 0, 3, 2, 8, 6, 15);
  EXPECT(em_exp(em_slice(T(F, SHAPE(4), 0, 9, 1, 9), 0, 0, 4, 2)), F, SHAPE(2), 1e-6, 1, E);
}

ETEST(strided, large_parallel_loops_match_serial_expectation) {
  /* Big enough to be split across threads, with a non-contiguous operand. */
  int64_t n = 1 << 18;
  em_tensor *a = em_arange(D, 0, (double)(2 * n), 1);
  em_tensor *evens = em_slice(a, 0, 0, 2 * n, 2);
  em_tensor *s = em_sum(em_mul_scalar(evens, 0.5), 0, NULL, false);
  EXPECT(s, D, SCALAR_SHAPE, 0, (double)n * (double)(n - 1) / 2);
}

ETEST(sizes, zero_size_and_size_one) {
  em_tensor *z = em_zeros(F, EM_SHAPE(0, 3));
  EXPECT_ALL(em_add(z, z), F, SHAPE(0, 3), 0, 0);
  EXPECT_ALL(em_add(z, T(F, SHAPE(3), 1, 2, 3)), F, SHAPE(0, 3), 0, 0);
  EXPECT(em_exp(em_zeros(F, EM_SHAPE(1, 1, 1))), F, SHAPE(1, 1, 1), 0, 1);
  EXPECT(em_add(em_scalar(EM_I64, 2), em_scalar(EM_I64, 3)), EM_I64, SCALAR_SHAPE, 0, 5);
}

ETEST(where, selects_and_promotes) {
  em_tensor *c = T(EM_BOOL, SHAPE(3), 1, 0, 1);
  EXPECT(em_where(c, T(F, SHAPE(3), 1, 2, 3), T(F, SHAPE(3), -1, -2, -3)), F, SHAPE(3), 0, 1, -2, 3);
  EXPECT(em_where(T(F, SHAPE(2, 1), 0, 5), T(EM_I64, SHAPE(2), 1, 2), em_scalar(D, 9)), D, SHAPE(2, 2), 0, 9, 9, 1, 2);
  EXPECT(em_where(c, T(EM_U8, SHAPE(1), 7), T(EM_U8, SHAPE(1), 8)), EM_U8, SHAPE(3), 0, 7, 8, 7);
}

ETEST(cast, conversions) {
  EXPECT(em_cast(T(D, SHAPE(4), 1.9, -1.9, 0, 300), EM_I32), EM_I32, SHAPE(4), 0, 1, -1, 0, 300);
  EXPECT(em_cast(T(D, SHAPE(3), 0.5, 0, -2), EM_BOOL), EM_BOOL, SHAPE(3), 0, 1, 0, 1);
  EXPECT(em_cast(T(EM_BOOL, SHAPE(2), 1, 0), F), F, SHAPE(2), 0, 1, 0);
  EXPECT(em_cast(T(EM_I64, SHAPE(1), 255), EM_U8), EM_U8, SHAPE(1), 0, 255);
  /* out of range and NaN are defined: the low bits of the i64 value (INT64_MIN for NaN) */
  EXPECT(em_cast(T(D, SHAPE(3), 3e9, NAN, -1), EM_I32), EM_I32, SHAPE(3), 0, -1294967296, 0, -1);
  EXPECT(em_cast(T(D, SHAPE(2), 300, -1), EM_U8), EM_U8, SHAPE(2), 0, 44, 255);
  em_tensor *h = em_cast(T(F, SHAPE(4), 1, 0.1, 65504, -2.5), EM_F16);
  cr_assert_eq(em_dtype_of(h), EM_F16);
  EXPECT(em_cast(h, F), F, SHAPE(4), 0, 1, 0.0999755859375, 65504, -2.5);
  em_tensor *bf = em_cast(T(F, SHAPE(2), 1, 3.14159), EM_BF16);
  EXPECT(em_cast(bf, D), D, SHAPE(2), 0, 1, 3.140625);
  if (!etest_on_cuda()) EXPECT_ERROR(em_add(h, h), "f16[4] has no CPU kernels"); /* on CUDA it computes */
  em_tensor *x = T(F, SHAPE(2), 1, 2);
  em_tensor *y = em_cast(x, F);
  cr_assert_neq(x, y, "em_cast returns a new tensor");
}

ETEST(inplace, arithmetic_bumps_version) {
  em_tensor *x = T(F, SHAPE(2, 2), 1, 2, 3, 4);
  int64_t v0 = em_version(x);
  cr_assert_eq(em_add_(x, T(F, SHAPE(2), 10, 20)), x);
  EXPECT(x, F, SHAPE(2, 2), 0, 11, 22, 13, 24);
  em_sub_(x, em_scalar(F, 1));
  em_mul_(x, T(EM_I64, SHAPE(2, 1), 2, 3));
  EXPECT(x, F, SHAPE(2, 2), 0, 20, 42, 36, 69);
  em_div_(x, em_scalar(F, 2));
  em_add_scalar_(x, 0.5);
  em_mul_scalar_(x, 2);
  EXPECT(x, F, SHAPE(2, 2), 0, 21, 43, 37, 70);
  cr_assert_eq(em_version(x), v0 + 6);
}

ETEST(inplace, through_views_and_fill) {
  em_tensor *x = em_zeros(EM_I64, EM_SHAPE(3, 3));
  em_tensor *col = em_slice(x, 1, 1, 2, 1);
  em_fill_(col, 7);
  em_tensor *diag_src = T(EM_I64, SHAPE(3), 1, 2, 3);
  em_copy_(em_slice(x, 0, 0, 1, 1), diag_src);
  EXPECT(x, EM_I64, SHAPE(3, 3), 0, 1, 2, 3, 0, 7, 0, 0, 7, 0);
  cr_assert_eq(em_version(x), em_version(col), "views share the version counter");
  em_zero_(x);
  EXPECT(em_sum(x, 0, NULL, false), EM_I64, SCALAR_SHAPE, 0, 0);
  /* copy_ converts dtypes and broadcasts */
  em_tensor *f = em_empty(F, EM_SHAPE(2, 2));
  em_copy_(f, T(EM_I64, SHAPE(2), 5, 6));
  EXPECT(f, F, SHAPE(2, 2), 0, 5, 6, 5, 6);
}

ETEST(inplace, overlapping_source_is_read_first) {
  em_tensor *x = em_arange(F, 0, 5, 1);
  /* x[1:5] = x[0:4]: a naive forward loop would smear x[0] everywhere. */
  em_copy_(em_slice(x, 0, 1, 5, 1), em_slice(x, 0, 0, 4, 1));
  EXPECT(x, F, SHAPE(5), 0, 0, 0, 1, 2, 3);
  em_tensor *y = em_arange(F, 0, 4, 1);
  em_add_(em_slice(y, 0, 1, 4, 1), em_slice(y, 0, 0, 3, 1));
  EXPECT(y, F, SHAPE(4), 0, 0, 1, 3, 5);
}

ETEST(inplace, refuses_bad_destinations) {
  em_tensor *e = em_expand(T(F, SHAPE(1), 1), EM_SHAPE(4));
  EXPECT_ERROR(em_add_(e, T(F, SHAPE(4), 1, 2, 3, 4)), "expanded view");
  EXPECT_ERROR(em_add_(T(EM_I64, SHAPE(1), 1), T(F, SHAPE(1), 1)), "cannot be cast to the destination i64[1]");
  EXPECT_ERROR(em_div_(T(EM_I32, SHAPE(1), 1), T(EM_I32, SHAPE(1), 1)), "result type f32");
  EXPECT_ERROR(em_add_(T(F, SHAPE(1), 1), T(F, SHAPE(3), 1, 2, 3)), "does not broadcast to the destination f32[1]");
}

ETEST(errors, integer_domain_errors) {
  EXPECT_ERROR(em_remainder(T(EM_I64, SHAPE(2), 1, 2), T(EM_I64, SHAPE(2), 1, 0)), "integer remainder by zero");
  EXPECT_ERROR(em_pow(T(EM_I32, SHAPE(1), 2), T(EM_I32, SHAPE(1), -1)), "negative integer powers");
}

/* Found by the fuzzer (programs 15422 and 63185, the eager backend 1-2 ULP off eager): the f32
 * transcendentals ran SLEEF's vector routine on contiguous rows but libm on a row's tail and on
 * strided rows, so an element's bits depended on its operand's layout. Every layout now gives
 * the same bits. */
ETEST(pointwise, transcendental_bits_do_not_depend_on_layout) {
  CPU_ONLY("the CPU kernels' vector and strided paths");
  typedef em_tensor *(*fn)(em_tensor *, em_site);
  fn fns[] = {em_exp_at, em_log_at, em_log1p_at, em_expm1_at, em_sin_at, em_cos_at, em_tanh_at, em_erf_at};
  em_manual_seed(11);
  em_tensor *base = em_add_scalar(em_abs(em_randn(EM_F32, EM_SHAPE(13, 22))), 0.01); /* > 0 for log */
  em_tensor *strided = em_slice(base, 1, 0, 22, 2);                                   /* [13,11], strides (22,2) */
  em_tensor *dense = em_contiguous(strided);                                          /* rows of 11: a tail of 3 */
  em_tensor *flat = em_reshape(em_contiguous(em_transpose(strided, 0, 1)), EM_SHAPE(143)); /* other positions */
  for (size_t k = 0; k < sizeof fns / sizeof fns[0]; k++) {
    float a[143], b[143], c[143];
    cr_assert(em_to_buffer(fns[k](strided, EM_HERE), EM_F32, a, sizeof a));
    cr_assert(em_to_buffer(fns[k](dense, EM_HERE), EM_F32, b, sizeof b));
    cr_assert(em_to_buffer(em_transpose(em_reshape(fns[k](flat, EM_HERE), EM_SHAPE(11, 13)), 0, 1), EM_F32, c, sizeof c));
    for (int i = 0; i < 143; i++)
      cr_assert(a[i] == b[i] && b[i] == c[i], "op %zu element %d: strided %.9g, dense %.9g, other position %.9g", k, i, a[i],
                b[i], c[i]);
  }
}
