/* tests/test_reduce.c: sum, prod, amax, amin, argmax, argmin over axis sets, keepdim, every
 * dtype, strided and expanded inputs, empty reductions, and f32 sum accuracy. */
#include "common.h"

#define F EM_F32
#define D EM_F64

ETEST(reduce, axes_and_keepdim) {
  em_tensor *x = em_reshape(em_arange(F, 0, 24, 1), EM_SHAPE(2, 3, 4));
  EXPECT(em_sum(x, 0, NULL, false), F, SCALAR_SHAPE, 0, 276);
  EXPECT(em_sum(x, EM_AXES(0), false), F, SHAPE(3, 4), 0, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34);
  EXPECT(em_sum(x, EM_AXES(-1), true), F, SHAPE(2, 3, 1), 0, 6, 22, 38, 54, 70, 86);
  EXPECT(em_sum(x, EM_AXES(0, 2), false), F, SHAPE(3), 0, 60, 92, 124);
  EXPECT(em_sum(x, EM_AXES(2, 0), true), F, SHAPE(1, 3, 1), 0, 60, 92, 124);
  EXPECT(em_sum(x, 0, NULL, true), F, SHAPE(1, 1, 1), 0, 276);
  EXPECT(em_amax(x, EM_AXES(1), false), F, SHAPE(2, 4), 0, 8, 9, 10, 11, 20, 21, 22, 23);
  EXPECT(em_amin(x, EM_AXES(0, 1), false), F, SHAPE(4), 0, 0, 1, 2, 3);
  EXPECT(em_prod(T(D, SHAPE(2, 2), 1, 2, 3, 4), EM_AXES(1), false), D, SHAPE(2), 0, 2, 12);
}

ETEST(reduce, dtypes) {
  EXPECT(em_sum(T(EM_I32, SHAPE(3), 1, 2, 3), 0, NULL, false), EM_I64, SCALAR_SHAPE, 0, 6);
  EXPECT(em_sum(T(EM_BOOL, SHAPE(4), 1, 0, 1, 1), 0, NULL, false), EM_I64, SCALAR_SHAPE, 0, 3);
  EXPECT(em_sum(T(EM_U8, SHAPE(2), 200, 200), 0, NULL, false), EM_I64, SCALAR_SHAPE, 0, 400);
  EXPECT(em_prod(T(EM_I64, SHAPE(3), -2, 3, 4), 0, NULL, false), EM_I64, SCALAR_SHAPE, 0, -24);
  EXPECT(em_amax(T(EM_U8, SHAPE(3), 5, 250, 7), 0, NULL, false), EM_U8, SCALAR_SHAPE, 0, 250);
  EXPECT(em_amin(T(EM_I32, SHAPE(3), 5, -250, 7), 0, NULL, false), EM_I32, SCALAR_SHAPE, 0, -250);
  EXPECT(em_amax(T(EM_BOOL, SHAPE(2), 0, 1), 0, NULL, false), EM_BOOL, SCALAR_SHAPE, 0, 1);
  EXPECT(em_sum(T(D, SHAPE(2), 0.1, 0.2), 0, NULL, false), D, SCALAR_SHAPE, 0, 0.1 + 0.2);
}

ETEST(reduce, arg_reductions) {
  em_tensor *x = T(F, SHAPE(2, 3), 1, 5, 5, 7, -1, 7);
  EXPECT(em_argmax(x, 1, false), EM_I64, SHAPE(2), 0, 1, 0);
  EXPECT(em_argmin(x, 1, false), EM_I64, SHAPE(2), 0, 0, 1);
  EXPECT(em_argmax(x, 0, true), EM_I64, SHAPE(1, 3), 0, 1, 0, 1);
  EXPECT(em_argmax(x, EM_ALL_AXES, false), EM_I64, SCALAR_SHAPE, 0, 3);
  EXPECT(em_argmin(x, EM_ALL_AXES, true), EM_I64, SHAPE(1, 1), 0, 4);
  EXPECT(em_argmax(T(F, SHAPE(3), 1, NAN, 9), 0, false), EM_I64, SCALAR_SHAPE, 0, 1);
  EXPECT(em_argmax(T(EM_I64, SHAPE(3), 2, 9, 9), -1, false), EM_I64, SCALAR_SHAPE, 0, 1);
}

ETEST(reduce, nan_propagates) {
  EXPECT(em_amax(T(F, SHAPE(3), 1, NAN, 3), 0, NULL, false), F, SCALAR_SHAPE, 0, NAN);
  EXPECT(em_amin(T(D, SHAPE(2, 2), 1, NAN, 3, 4), EM_AXES(1), false), D, SHAPE(2), 0, NAN, 3);
  EXPECT(em_sum(T(F, SHAPE(2), 1, NAN), 0, NULL, false), F, SCALAR_SHAPE, 0, NAN);
}

/* Contiguous f32 and f64 rows long enough for the vector lanes of the extremes and arg extremes
 * (prims/reduce.c, ext_f32, arg_ext_f32: four blocks of 16 folded at a time, single blocks, a
 * tail): the extreme of distinct values and its index, a NaN at every third position,
 * infinities, a tie with the maximum (the first index wins). */
ETEST(reduce, extremes_of_long_rows) {
  for (int dt = 0; dt < 2; dt++) {
    em_dtype d = dt ? D : F;
    for (int64_t n = 32; n <= 200; n += 7) {
      em_scope_begin();
      em_tensor *x = em_contiguous(em_cast(em_randn(F, EM_SHAPE(n)), d));
      double hi = -INFINITY, lo = INFINITY;
      int64_t ihi = 0, ilo = 0;
      for (int64_t i = 0; i < n; i++) {
        double v = etest_at(x, i);
        if (v > hi) hi = v, ihi = i;
        if (v < lo) lo = v, ilo = i;
      }
      EXPECT(em_amax(x, 0, NULL, false), d, SCALAR_SHAPE, 0, hi);
      EXPECT(em_amin(x, 0, NULL, false), d, SCALAR_SHAPE, 0, lo);
      EXPECT(em_argmax(x, 0, false), EM_I64, SCALAR_SHAPE, 0, ihi);
      EXPECT(em_argmin(x, 0, false), EM_I64, SCALAR_SHAPE, 0, ilo);
      for (int64_t p = 0; p < n; p += 3) {
        em_tensor *y = em_clone(x);
        em_tensor *at = em_slice(y, 0, p, p + 1, 1);
        cr_assert(em_fill_(at, NAN));
        cr_assert(isnan(etest_at(em_amax(y, 0, NULL, false), 0)), "n %lld: NaN at %lld dropped by amax", (long long)n, (long long)p);
        cr_assert(isnan(etest_at(em_amin(y, 0, NULL, false), 0)), "n %lld: NaN at %lld dropped by amin", (long long)n, (long long)p);
        EXPECT(em_argmax(y, 0, false), EM_I64, SCALAR_SHAPE, 0, p); /* a NaN is the extreme */
        EXPECT(em_argmin(y, 0, false), EM_I64, SCALAR_SHAPE, 0, p);
        cr_assert(em_fill_(at, INFINITY));
        EXPECT(em_amax(y, 0, NULL, false), d, SCALAR_SHAPE, 0, INFINITY);
        cr_assert(em_fill_(at, hi)); /* a tie with the maximum: the first index wins */
        EXPECT(em_argmax(y, 0, false), EM_I64, SCALAR_SHAPE, 0, p < ihi ? p : ihi);
        cr_assert(em_fill_(at, -INFINITY));
        EXPECT(em_amin(y, 0, NULL, false), d, SCALAR_SHAPE, 0, -INFINITY);
      }
      em_scope_end();
    }
  }
}

ETEST(reduce, strided_and_expanded) {
  em_tensor *m = em_reshape(em_arange(D, 0, 6, 1), EM_SHAPE(2, 3));
  em_tensor *t = em_transpose(m, 0, 1); /* [[0,3],[1,4],[2,5]] */
  EXPECT(em_sum(t, EM_AXES(1), false), D, SHAPE(3), 0, 3, 5, 7);
  EXPECT(em_sum(t, EM_AXES(0), false), D, SHAPE(2), 0, 3, 12);
  EXPECT(em_argmax(t, 0, false), EM_I64, SHAPE(2), 0, 2, 2);
  em_tensor *e = em_expand(T(F, SHAPE(3, 1), 1, 2, 3), EM_SHAPE(3, 1000));
  EXPECT(em_sum(e, EM_AXES(1), false), F, SHAPE(3), 0, 1000, 2000, 3000);
  EXPECT_ALL(em_sum(e, EM_AXES(0), false), F, SHAPE(1000), 0, 6);
  em_tensor *s = em_slice(em_arange(F, 0, 10, 1), 0, 1, 10, 4); /* 1, 5, 9 */
  EXPECT(em_prod(s, 0, NULL, false), F, SCALAR_SHAPE, 0, 45);
}

ETEST(reduce, empty_and_zero_dim) {
  em_tensor *z = em_zeros(F, EM_SHAPE(0, 3));
  EXPECT(em_sum(z, EM_AXES(0), false), F, SHAPE(3), 0, 0, 0, 0);
  EXPECT(em_prod(z, EM_AXES(0), false), F, SHAPE(3), 0, 1, 1, 1);
  EXPECT_ALL(em_sum(z, EM_AXES(1), false), F, SHAPE(0), 0, 0);
  EXPECT(em_sum(em_scalar(F, 4), 0, NULL, false), F, SCALAR_SHAPE, 0, 4);
  EXPECT(em_sum(em_scalar(F, 4), EM_AXES(0), false), F, SCALAR_SHAPE, 0, 4);
  EXPECT(em_amax(em_scalar(EM_I32, -2), EM_AXES(-1), true), EM_I32, SCALAR_SHAPE, 0, -2);
  EXPECT_ERROR(em_argmax(em_zeros(F, EM_SHAPE(0)), 0, false), "size 0");
}

ETEST(reduce, f32_sum_accuracy) {
  /* 1.5 * 2^24 ones (exact in f32): a naive f32 accumulator stops at 2^24 = 16777216. */
  int64_t n = 3 << 23;
  EXPECT(em_sum(em_ones(F, EM_SHAPE(n)), 0, NULL, false), F, SCALAR_SHAPE, 0, (double)n);
  em_manual_seed(3);
  em_tensor *x = em_rand(F, EM_SHAPE(1 << 20));
  double ref = em_item(em_sum(em_cast(x, D), 0, NULL, false));
  double got = em_item(em_sum(x, 0, NULL, false));
  cr_assert(fabs(got - ref) <= 1e-6 * ref, "f32 sum %.9g vs f64 %.9g", got, ref);
}

ETEST(reduce, large_rows_and_columns) {
  /* Parallel paths: many rows reduced along the last axis, and a column reduction. */
  em_tensor *x = em_reshape(em_arange(D, 0, 512 * 300, 1), EM_SHAPE(512, 300));
  em_tensor *rows = em_sum(x, EM_AXES(1), false);
  for (int i = 0; i < 512; i += 97)
    cr_assert_eq(etest_at(rows, i), 300.0 * 300 * i + 299.0 * 300 / 2, "row %d", i);
  em_tensor *cols = em_sum(x, EM_AXES(0), false);
  for (int j = 0; j < 300; j += 61)
    cr_assert_eq(etest_at(cols, j), 300.0 * 511 * 512 / 2 + 512.0 * j, "col %d", j);
  em_tensor *am = em_argmax(em_neg(x), 1, false);
  cr_assert_eq(etest_at(am, 200), 0);
}
