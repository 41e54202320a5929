/* tests/test_lmops.c: the language-model ops of issue 21 (cumsum, cumprod, argsort, sort, topk,
 * multinomial, split, chunk, tril, triu, clip_grad_norm_): values against hand-computed results
 * or against an independent computation in the test (brute-force ranks, loops over the data),
 * gradients against finite differences (gradcheck.h), errors, and compiled functions (backends
 * eager, aot_eager, inductor; called until a replay) against eager execution. The suite also
 * runs on CUDA (EMBER_TEST_DEVICE=cuda: the device's kernels, or the host emulator). */
#include "common.h"
#include "gradcheck.h"

/* Every element of t as doubles (caller frees). */
static double *values(em_tensor *t) {
  int64_t n = em_numel(t);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  cr_assert(em_to_buffer(t, EM_F64, v, sizeof(double) * (size_t)n), "%s", em_last_error() ? em_last_error() : "");
  return v;
}

/* ---- cumsum, cumprod ---- */

ETEST(lmops, cumsum_and_cumprod_values) {
  em_tensor *x = T(EM_F32, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
  EXPECT(em_cumsum(x, 1), EM_F32, SHAPE(2, 3), 0, 1, 3, 6, 4, 9, 15);
  EXPECT(em_cumsum(x, 0), EM_F32, SHAPE(2, 3), 0, 1, 2, 3, 5, 7, 9);
  EXPECT(em_cumsum(x, -1), EM_F32, SHAPE(2, 3), 0, 1, 3, 6, 4, 9, 15);
  EXPECT(em_cumprod(x, 1), EM_F32, SHAPE(2, 3), 0, 1, 2, 6, 4, 20, 120);
  EXPECT(em_cumprod(x, 0), EM_F32, SHAPE(2, 3), 0, 1, 2, 3, 4, 10, 18);
  /* a transposed (strided) operand */
  EXPECT(em_cumsum(em_transpose(x, 0, 1), 1), EM_F32, SHAPE(3, 2), 0, 1, 5, 2, 7, 3, 9);
  /* integers and bool accumulate in i64, as torch */
  EXPECT(em_cumsum(T(EM_I32, SHAPE(4), 2147483647, 1, -5, 3), 0), EM_I64, SHAPE(4), 0, 2147483647, 2147483648.0,
         2147483643, 2147483646);
  EXPECT(em_cumsum(T(EM_BOOL, SHAPE(5), 1, 0, 1, 1, 0), 0), EM_I64, SHAPE(5), 0, 1, 1, 2, 3, 3);
  EXPECT(em_cumprod(T(EM_U8, SHAPE(4), 200, 2, 3, 0), 0), EM_I64, SHAPE(4), 0, 200, 400, 1200, 0);
  EXPECT(em_cumprod(T(EM_F64, SHAPE(4), 2, 0, 3, NAN), 0), EM_F64, SHAPE(4), 0, 2, 0, 0, NAN);
  /* 0-dim (axis 0 or -1) and empty */
  EXPECT(em_cumsum(em_scalar(EM_F32, 2.5), -1), EM_F32, SCALAR_SHAPE, 0, 2.5);
  EXPECT_ALL(em_cumsum(em_zeros(EM_F32, EM_SHAPE(2, 0)), 1), EM_F32, SHAPE(2, 0), 0, 0);
}

/* f32 partial sums are formed in double and rounded once each, as torch's CPU kernel does: the
 * last of 1 + 1e-8 * k is 1 + 1e-8 * n rounded, not 1 (which f32 accumulation would give). */
ETEST(lmops, cumsum_accumulates_f32_in_double) {
  int n = 1000;
  em_tensor *x = em_full(EM_F32, EM_SHAPE(n), 1e-8f);
  em_tensor *first = em_ones(EM_F32, EM_SHAPE(1));
  em_tensor *c = em_cumsum(em_cat(2, ((em_tensor *[]){first, x}), 0), 0);
  double last = etest_at(c, n);
  cr_assert_eq((float)last, (float)(1.0 + (double)n * (double)1e-8f), "got %.9g", last);
  cr_assert_neq((float)last, 1.0f);
}

/* Long rows against a loop in the test (several lines, an axis in the middle). */
ETEST(lmops, cumsum_matches_a_loop_on_long_rows) {
  em_manual_seed(4);
  em_tensor *x = em_randn(EM_F64, EM_SHAPE(3, 700, 2));
  double *v = values(x), *got = values(em_cumsum(x, 1));
  for (int a = 0; a < 3; a++)
    for (int c = 0; c < 2; c++) {
      double acc = 0;
      for (int i = 0; i < 700; i++) {
        int64_t k = (a * 700 + i) * 2 + c;
        acc += v[k];
        cr_assert_eq(got[k], acc, "element %lld", (long long)k);
      }
    }
  free(v), free(got);
}

static em_tensor *f_cumsum(em_tensor *const *x, void *ctx) { return em_cumsum(x[0], *(int *)ctx); }
static em_tensor *f_cumprod(em_tensor *const *x, void *ctx) { return em_cumprod(x[0], *(int *)ctx); }

ETEST(lmops, cumsum_and_cumprod_gradients) {
  em_manual_seed(7);
  for (int axis = -2; axis < 2; axis++) {
    em_tensor *x = gc_leaf(-2, 2, 2, (int64_t[]){3, 4});
    gradcheck("cumsum", f_cumsum, &axis, 1, &x);
    gradcheck("cumprod", f_cumprod, &axis, 1, &x);
  }
  em_tensor *s = gc_leaf(0.5, 2, 0, NULL);
  int zero = 0;
  gradcheck("cumprod of a 0-dim tensor", f_cumprod, &zero, 1, &s);
}

/* Zeros in the input (one, several, first, last): torch's cumprod_backward, not y / x. */
ETEST(lmops, cumprod_gradient_with_zeros) {
  const double rows[][5] = {{1.5, 0, 2, -1, 3}, {0, 2, 0, 1.5, -2}, {2, -1, 1.5, 3, 0}, {0, 0, 0, 2, 1}, {1, 2, 3, 4, 5}};
  for (int r = 0; r < 5; r++) {
    em_tensor *x = em_requires_grad_(em_from_data(rows[r], EM_F64, EM_SHAPE(5)), true);
    int axis = 0;
    gradcheck("cumprod with zeros", f_cumprod, &axis, 1, &x);
    /* and by hand for the first row with seed ones: dx_i = sum_{k >= i} prod_{j <= k, j != i} x_j */
    if (r == 0) {
      em_tensor *g;
      em_tensor *y = em_cumprod(x, 0);
      cr_assert(em_grad(1, &y, (em_tensor *[]){em_ones(EM_F64, EM_SHAPE(5))}, 1, &x, &g, false, false));
      /* x = 1.5 0 2 -1 3: dx0 = 1 + 0...; dx1 = 1.5 + 1.5*2 + 1.5*2*-1 + 1.5*2*-1*3 = -7.5; others 0 */
      EXPECT(g, EM_F64, SHAPE(5), 1e-12, 1, -7.5, 0, 0, 0);
    }
  }
}

/* ---- argsort, sort, topk ---- */

ETEST(lmops, argsort_is_stable_and_puts_nan_last) {
  em_tensor *x = T(EM_F32, SHAPE(8), 3, 1, NAN, 2, 1, -INFINITY, 3, 0);
  EXPECT(em_argsort(x, 0, false), EM_I64, SHAPE(8), 0, 5, 7, 1, 4, 3, 0, 6, 2);
  EXPECT(em_argsort(x, 0, true), EM_I64, SHAPE(8), 0, 2, 0, 6, 3, 1, 4, 7, 5);
  em_tensor *idx;
  EXPECT(em_sort(x, 0, true, &idx), EM_F32, SHAPE(8), 0, NAN, 3, 3, 2, 1, 1, 0, -INFINITY);
  EXPECT(idx, EM_I64, SHAPE(8), 0, 2, 0, 6, 3, 1, 4, 7, 5);
  /* -0.0 equals 0.0: they keep their order */
  EXPECT(em_argsort(T(EM_F64, SHAPE(3), 0.0, -0.0, 0.0), 0, false), EM_I64, SHAPE(3), 0, 0, 1, 2);
  /* along axis 0 of a matrix, and a strided view */
  em_tensor *m = T(EM_I64, SHAPE(3, 2), 5, -1, 2, 7, 5, 0);
  EXPECT(em_argsort(m, 0, false), EM_I64, SHAPE(3, 2), 0, 1, 0, 0, 2, 2, 1);
  EXPECT(em_argsort(em_transpose(m, 0, 1), 1, true), EM_I64, SHAPE(2, 3), 0, 0, 2, 1, 1, 2, 0);
  EXPECT(em_argsort(T(EM_BOOL, SHAPE(4), 1, 0, 1, 0), 0, false), EM_I64, SHAPE(4), 0, 1, 3, 0, 2);
  EXPECT(em_argsort(em_scalar(EM_F32, 4), 0, false), EM_I64, SCALAR_SHAPE, 0, 0);
}

/* Rows long enough for many merge passes, with many ties, in every dtype the CPU sorts, against
 * brute-force ranks: the stable position of x_i is #{j : x_j before x_i} + #{j < i : x_j == x_i}. */
ETEST(lmops, argsort_matches_brute_force_ranks) {
  em_manual_seed(11);
  const em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL};
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (int desc = 0; desc < 2; desc++) {
      int64_t rows = 3, n = 300 + 37 * (int64_t)d;
      em_tensor *x = em_cast(em_randint(0, dts[d] == EM_BOOL ? 2 : 20, EM_SHAPE(rows, n)), dts[d]);
      if (dts[d] == EM_F32) x = em_where(em_eq_scalar(x, 3), em_full(EM_F32, EM_SHAPE(1), NAN), x);
      double *v = values(x), *got = values(em_argsort(x, 1, desc));
      for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
          double xi = v[r * n + i];
          int64_t pos = 0;
          for (int64_t j = 0; j < n; j++) {
            double xj = v[r * n + j];
            bool eq = xj == xi || (isnan(xj) && isnan(xi));
            bool less = !isnan(xj) && (isnan(xi) || xj < xi), more = !isnan(xi) && (isnan(xj) || xj > xi);
            pos += (desc ? more : less) || (eq && j < i);
          }
          cr_assert_eq(got[r * n + pos], (double)i, "%s desc=%d: row %lld: element %lld belongs at %lld",
                       em_dtype_name(dts[d]), desc, (long long)r, (long long)i, (long long)pos);
        }
      free(v), free(got);
    }
}

ETEST(lmops, topk_values_and_indices) {
  em_tensor *x = T(EM_F32, SHAPE(2, 5), 1, 9, 3, 9, -2, 0, -1, 4, 2, 4);
  em_tensor *idx;
  EXPECT(em_topk(x, 3, 1, true, true, &idx), EM_F32, SHAPE(2, 3), 0, 9, 9, 3, 4, 4, 2);
  EXPECT(idx, EM_I64, SHAPE(2, 3), 0, 1, 3, 2, 2, 4, 3);
  EXPECT(em_topk(x, 2, -1, false, true, &idx), EM_F32, SHAPE(2, 2), 0, -2, 1, -1, 0);
  EXPECT(idx, EM_I64, SHAPE(2, 2), 0, 4, 0, 1, 0);
  EXPECT(em_topk(x, 1, 0, true, false, NULL), EM_F32, SHAPE(1, 5), 0, 1, 9, 4, 9, 4);
  EXPECT_ALL(em_topk(x, 0, 1, true, true, &idx), EM_F32, SHAPE(2, 0), 0, 0);
  cr_assert_eq(em_size(idx, 1), 0);
  EXPECT(em_topk(x, 5, 1, true, true, NULL), EM_F32, SHAPE(2, 5), 0, 9, 9, 3, 1, -2, 4, 4, 2, 0, -1);
  /* NaN is the largest */
  EXPECT(em_topk(T(EM_F64, SHAPE(3), 1, NAN, 2), 1, 0, true, true, NULL), EM_F64, SHAPE(1), 0, NAN);
}

static em_tensor *f_sort(em_tensor *const *x, void *ctx) { return em_sort(x[0], *(int *)ctx, true, NULL); }
static em_tensor *f_topk(em_tensor *const *x, void *ctx) { return em_topk(x[0], 2, *(int *)ctx, false, true, NULL); }

ETEST(lmops, sort_and_topk_gradients_flow_through_the_values) {
  em_manual_seed(8);
  for (int axis = 0; axis < 2; axis++) {
    em_tensor *x = gc_leaf(-3, 3, 2, (int64_t[]){3, 4});
    gradcheck("sort", f_sort, &axis, 1, &x);
    gradcheck("topk", f_topk, &axis, 1, &x);
  }
  /* by hand: the gradient of the largest two lands on their positions; indices carry none */
  em_tensor *x = em_requires_grad_(T(EM_F64, SHAPE(4), 0.5, 3, -1, 2), true);
  em_tensor *idx, *g;
  em_tensor *v = em_topk(x, 2, 0, true, true, &idx);
  cr_assert_not(em_requires_grad(idx));
  cr_assert(em_grad(1, &v, (em_tensor *[]){T(EM_F64, SHAPE(2), 10, 20)}, 1, &x, &g, false, false));
  EXPECT(g, EM_F64, SHAPE(4), 0, 0, 10, 0, 20);
}

ETEST(lmops, sort_errors) {
  em_tensor *m = em_ones(EM_F32, EM_SHAPE(2, 3));
  EXPECT_ERROR(em_argsort(m, 2, false), "em_argsort: axis 2 out of range for f32[2,3]");
  EXPECT_ERROR(em_cumsum(m, -3), "em_cumsum: axis -3 out of range");
  EXPECT_ERROR(em_cumprod(em_scalar(EM_F32, 1), 1), "em_cumprod: axis 1 out of range");
  em_tensor *idx = m;
  EXPECT_ERROR(em_sort(m, 5, false, &idx), "em_sort");
  cr_assert_null(idx, "indices are NULL on error");
  EXPECT_ERROR(em_topk(m, 4, 1, true, true, NULL), "em_topk: k = 4 is out of range for axis 1 of f32[2,3] (size 3)");
  EXPECT_ERROR(em_topk(m, -1, 1, true, true, NULL), "k = -1");
  EXPECT_ERROR(em_topk(m, 1, 2, true, true, NULL), "em_topk: axis 2 out of range");
  em_clear_error();
  cr_assert_null(em_cumsum(NULL, 0));
  cr_assert_null(em_last_error(), "NULL input: an earlier failure, no new error");
}

/* ---- multinomial ---- */

/* Counts of each category among the draws in t (i64), checked against n * p within 6 standard
 * deviations (a generous bound: a false failure has probability below 1e-8 per category). */
static void expect_frequencies(em_tensor *t, const double *p, int c) {
  double *v = values(t);
  int64_t n = em_numel(t);
  int64_t *count = calloc((size_t)c, sizeof(int64_t));
  for (int64_t i = 0; i < n; i++) {
    cr_assert(v[i] >= 0 && v[i] < c && v[i] == floor(v[i]), "draw %lld is %g", (long long)i, v[i]);
    count[(int)v[i]]++;
  }
  for (int k = 0; k < c; k++) {
    double mean = (double)n * p[k], sd = sqrt((double)n * p[k] * (1 - p[k]));
    if (p[k] == 0) cr_assert_eq(count[k], 0, "category %d has probability 0 but was drawn %lld times", k, (long long)count[k]);
    else cr_assert(fabs((double)count[k] - mean) <= 6 * sd + 1, "category %d: %lld draws, expected %.1f (sd %.1f)", k,
                   (long long)count[k], mean, sd);
  }
  free(v), free(count);
}

ETEST(lmops, multinomial_with_replacement_follows_the_distribution) {
  em_manual_seed(21);
  /* unnormalised weights with zeros inside and at both ends */
  double w[6] = {0, 1, 2, 0, 3, 0}, p[6];
  for (int k = 0; k < 6; k++) p[k] = w[k] / 6;
  em_tensor *probs = em_from_data(w, EM_F64, EM_SHAPE(6));
  em_tensor *s = em_multinomial(probs, 20000, true);
  cr_assert_eq(em_ndim(s), 1);
  cr_assert_eq(em_size(s, 0), 20000);
  cr_assert_eq(em_dtype_of(s), EM_I64);
  expect_frequencies(s, p, 6);
  /* 2-D, f32: every row draws from its own distribution */
  double rows[2][3] = {{0.7, 0.2, 0.1}, {0, 0, 5}};
  em_tensor *s2 = em_multinomial(em_cast(em_from_data(rows, EM_F64, EM_SHAPE(2, 3)), EM_F32), 10000, true);
  cr_assert_eq(em_size(s2, 0), 2);
  cr_assert_eq(em_size(s2, 1), 10000);
  double p0[3] = {0.7, 0.2, 0.1}, p1[3] = {0, 0, 1};
  expect_frequencies(em_slice(s2, 0, 0, 1, 1), p0, 3);
  expect_frequencies(em_slice(s2, 0, 1, 2, 1), p1, 3);
}

/* Without replacement: distinct categories, never a zero one; the first draw of each row
 * follows p, and the second, given the first, p renormalised without it (here: P(second = 2 |
 * first = 0) = 0.3 / 0.5). One draw per row over many identical rows. */
ETEST(lmops, multinomial_without_replacement) {
  em_manual_seed(22);
  double p[4] = {0.5, 0, 0.3, 0.2};
  int64_t rows = 20000;
  em_tensor *probs = em_expand(em_from_data(p, EM_F64, EM_SHAPE(1, 4)), EM_SHAPE(rows, 4));
  em_tensor *s = em_multinomial(probs, 3, false);
  cr_assert_eq(em_size(s, 1), 3);
  double *v = values(s);
  int64_t first0 = 0, then2 = 0;
  for (int64_t r = 0; r < rows; r++) {
    double a = v[3 * r], b = v[3 * r + 1], c = v[3 * r + 2];
    cr_assert(a != b && b != c && a != c, "row %lld repeats a category: %g %g %g", (long long)r, a, b, c);
    cr_assert(a != 1 && b != 1 && c != 1, "row %lld drew the zero category", (long long)r);
    if (a == 0) first0++, then2 += b == 2;
  }
  free(v);
  expect_frequencies(em_contiguous(em_slice(s, 1, 0, 1, 1)), p, 4);
  double q = 0.6, sd = sqrt((double)first0 * q * (1 - q));
  cr_assert(fabs((double)then2 - first0 * q) <= 6 * sd, "P(second = 2 | first = 0): %lld of %lld", (long long)then2,
            (long long)first0);
  /* all categories: a permutation of the non-zero ones first */
  em_tensor *all = em_multinomial(em_from_data((double[]){1, 2, 3}, EM_F64, EM_SHAPE(3)), 3, false);
  double *w = values(all);
  cr_assert(w[0] + w[1] + w[2] == 3 && w[0] != w[1] && w[1] != w[2] && w[0] != w[2]);
  free(w);
  /* one sample: the same race, shape [N, 1] */
  em_tensor *one = em_multinomial(em_from_data((double[]){0, 1, 0, 0}, EM_F64, EM_SHAPE(1, 4)), 1, true);
  EXPECT(one, EM_I64, SHAPE(1, 1), 0, 1);
}

ETEST(lmops, multinomial_is_reproducible_with_a_seed) {
  em_tensor *probs = em_from_data((double[]){0.1, 0.4, 0.2, 0.3}, EM_F64, EM_SHAPE(4));
  for (int repl = 0; repl < 2; repl++) {
    em_manual_seed(5);
    em_tensor *a = em_multinomial(probs, 4, repl);
    em_manual_seed(5);
    em_tensor *b = em_multinomial(probs, 4, repl);
    EXPECT_SAME_BITS(a, b, "same seed, same draws");
  }
}

ETEST(lmops, multinomial_errors) {
  em_tensor *p = em_from_data((double[]){0.5, 0, 0.5}, EM_F64, EM_SHAPE(3));
  EXPECT_ERROR(em_multinomial(p, 3, false), "not enough non-negative category");
  EXPECT_ERROR(em_multinomial(p, 4, false), "cannot draw 4 samples without replacement from 3 categories");
  EXPECT_ERROR(em_multinomial(p, 0, true), "cannot draw 0 samples");
  EXPECT_ERROR(em_multinomial(em_from_data((double[]){0.5, -0.1}, EM_F64, EM_SHAPE(2)), 1, true), "element < 0");
  EXPECT_ERROR(em_multinomial(em_from_data((double[]){0.5, NAN}, EM_F64, EM_SHAPE(2)), 2, true), "inf, nan");
  EXPECT_ERROR(em_multinomial(em_from_data((double[]){INFINITY, 1}, EM_F64, EM_SHAPE(2)), 1, false), "inf, nan");
  EXPECT_ERROR(em_multinomial(em_zeros(EM_F32, EM_SHAPE(2, 3)), 1, true), "sum of probabilities <= 0");
  EXPECT_ERROR(em_multinomial(em_ones(EM_I64, EM_SHAPE(3)), 1, true), "em_multinomial: probs must be floating, got i64[3]");
  EXPECT_ERROR(em_multinomial(em_ones(EM_F32, EM_SHAPE(2, 2, 2)), 1, true), "must be 1-D or 2-D, got f32[2,2,2]");
  EXPECT_ERROR(em_multinomial(em_ones(EM_F32, EM_SHAPE(2, 0)), 1, true), "has no categories");
}

/* ---- split, chunk ---- */

ETEST(lmops, split_and_chunk_make_views) {
  em_tensor *x = em_reshape(em_arange(EM_F32, 0, 10, 1), EM_SHAPE(5, 2));
  em_tensor *out[8];
  cr_assert_eq(em_split(x, 2, 0, NULL, 0), 3, "a query returns the count");
  cr_assert_eq(em_split(x, 2, 0, out, 8), 3);
  EXPECT(out[0], EM_F32, SHAPE(2, 2), 0, 0, 1, 2, 3);
  EXPECT(out[1], EM_F32, SHAPE(2, 2), 0, 4, 5, 6, 7);
  EXPECT(out[2], EM_F32, SHAPE(1, 2), 0, 8, 9);
  cr_assert_eq(em_split(x, 1, -1, out, 2), 2);
  EXPECT(out[1], EM_F32, SHAPE(5, 1), 0, 1, 3, 5, 7, 9);
  /* views: a write into x shows through the pieces */
  cr_assert_eq(em_split_sizes(x, 3, ((int64_t[]){1, 0, 4}), 0, out), 3);
  EXPECT(out[0], EM_F32, SHAPE(1, 2), 0, 0, 1);
  cr_assert_eq(em_size(out[1], 0), 0);
  em_fill_(x, 7);
  EXPECT_ALL(out[2], EM_F32, SHAPE(4, 2), 0, 7);
  /* chunk: ceil(size / chunks) each, fewer pieces when they run out, as torch.chunk */
  em_tensor *y = em_arange(EM_F32, 0, 6, 1);
  cr_assert_eq(em_chunk(y, 4, 0, out, 4), 3);
  EXPECT(out[2], EM_F32, SHAPE(2), 0, 4, 5);
  cr_assert_eq(em_chunk(y, 6, 0, NULL, 0), 6);
  cr_assert_eq(em_chunk(em_zeros(EM_F32, EM_SHAPE(0, 3)), 2, 0, out, 2), 2, "an empty axis gives `chunks` empty pieces");
  cr_assert_eq(em_split(em_zeros(EM_F32, EM_SHAPE(0)), 0, 0, out, 1), 1, "torch: split_size 0 on an empty axis");
  cr_assert_eq(em_size(out[0], 0), 0);
}

ETEST(lmops, split_gradient_reaches_the_base) {
  em_tensor *x = em_requires_grad_(em_arange(EM_F64, 0, 6, 1), true);
  em_tensor *out[3], *g;
  cr_assert_eq(em_chunk(x, 3, 0, out, 3), 3);
  em_tensor *y = em_add(em_mul_scalar(em_sum(out[0], 0, NULL, false), 2), em_sum(em_mul(out[2], out[2]), 0, NULL, false));
  cr_assert(em_grad(1, &y, NULL, 1, &x, &g, false, false));
  EXPECT(g, EM_F64, SHAPE(6), 0, 2, 2, 0, 0, 8, 10);
}

ETEST(lmops, split_errors) {
  em_tensor *x = em_ones(EM_F32, EM_SHAPE(4, 3));
  em_tensor *out[4] = {x, x, x, x};
  cr_assert_eq(em_split(x, 0, 0, out, 4), -1);
  cr_assert(strstr(em_last_error(), "em_split: split_size must be >= 1"), "%s", em_last_error());
  em_clear_error();
  cr_assert_eq(em_split(x, 1, 0, out, 3), -1);
  cr_assert(strstr(em_last_error(), "makes 4 pieces; out has room for 3"), "%s", em_last_error());
  em_clear_error();
  cr_assert_eq(em_split(x, 1, 2, out, 4), -1);
  cr_assert(strstr(em_last_error(), "axis 2 out of range for f32[4,3]"), "%s", em_last_error());
  em_clear_error();
  cr_assert_eq(em_split_sizes(x, 2, ((int64_t[]){1, 2}), 0, out), -1);
  cr_assert(strstr(em_last_error(), "sizes add up to 3, but axis 0 of f32[4,3] has size 4"), "%s", em_last_error());
  em_clear_error();
  cr_assert_eq(em_split_sizes(x, 2, ((int64_t[]){5, -1}), 0, out), -1);
  em_clear_error();
  cr_assert_eq(em_chunk(x, 0, 0, out, 4), -1);
  cr_assert(strstr(em_last_error(), "chunks must be >= 1"), "%s", em_last_error());
  em_clear_error();
  cr_assert_eq(em_split(em_scalar(EM_F32, 1), 1, 0, out, 4), -1);
  cr_assert(strstr(em_last_error(), "needs at least one dim"), "%s", em_last_error());
  em_clear_error();
  cr_assert_eq(em_split(NULL, 1, 0, out, 4), -1);
  cr_assert_null(em_last_error(), "NULL input: an earlier failure, no new error");
}

/* ---- tril, triu ---- */

ETEST(lmops, tril_and_triu_values) {
  em_tensor *x = em_add_scalar(em_reshape(em_arange(EM_F32, 0, 12, 1), EM_SHAPE(3, 4)), 1);
  EXPECT(em_tril(x, 0), EM_F32, SHAPE(3, 4), 0, 1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0);
  EXPECT(em_tril(x, 1), EM_F32, SHAPE(3, 4), 0, 1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12);
  EXPECT(em_tril(x, -1), EM_F32, SHAPE(3, 4), 0, 0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0);
  EXPECT(em_triu(x, 0), EM_F32, SHAPE(3, 4), 0, 1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12);
  EXPECT(em_triu(x, 2), EM_F32, SHAPE(3, 4), 0, 0, 0, 3, 4, 0, 0, 0, 8, 0, 0, 0, 0);
  EXPECT(em_triu(x, -1), EM_F32, SHAPE(3, 4), 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12);
  EXPECT_ALL(em_tril(x, INT64_MIN), EM_F32, SHAPE(3, 4), 0, 0);
  EXPECT(em_triu(x, INT64_MIN), EM_F32, SHAPE(3, 4), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
  EXPECT_ALL(em_triu(x, INT64_MAX), EM_F32, SHAPE(3, 4), 0, 0);
  /* batched, integer and bool */
  em_tensor *b = em_ones(EM_I64, EM_SHAPE(2, 2, 2));
  EXPECT(em_tril(b, 0), EM_I64, SHAPE(2, 2, 2), 0, 1, 0, 1, 1, 1, 0, 1, 1);
  EXPECT(em_triu(em_ones(EM_BOOL, EM_SHAPE(2, 2)), 1), EM_BOOL, SHAPE(2, 2), 0, 0, 1, 0, 0);
  EXPECT_ERROR(em_tril(em_ones(EM_F32, EM_SHAPE(3)), 0), "em_tril: needs at least 2 dims, got f32[3]");
}

static em_tensor *f_tril(em_tensor *const *x, void *ctx) { return em_tril(x[0], *(int64_t *)ctx); }
static em_tensor *f_triu(em_tensor *const *x, void *ctx) { return em_triu(x[0], *(int64_t *)ctx); }

ETEST(lmops, tril_and_triu_gradients) {
  em_manual_seed(9);
  for (int64_t d = -1; d <= 1; d++) {
    em_tensor *x = gc_leaf(-1, 1, 3, (int64_t[]){2, 3, 3});
    gradcheck("tril", f_tril, &d, 1, &x);
    gradcheck("triu", f_triu, &d, 1, &x);
  }
}

/* ---- clip_grad_norm_ ---- */

/* Two parameters with gradients [3, 4] and [12] (total 2-norm 13, inf-norm 12) and one without. */
static void three_params(em_tensor **p) {
  p[0] = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(2)), true);
  p[1] = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(1)), true);
  p[2] = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(3)), true);
  em_tensor *loss = em_add(em_sum(em_mul(p[0], T(EM_F32, SHAPE(2), 3, 4)), 0, NULL, false),
                           em_sum(em_mul_scalar(p[1], -12), 0, NULL, false));
  cr_assert(em_backward(loss, NULL), "%s", em_last_error());
}

ETEST(lmops, clip_grad_norm_scales_gradients) {
  em_tensor *p[3];
  three_params(p);
  em_tensor *total = em_clip_grad_norm_(3, p, 6.5, 2);
  EXPECT(total, EM_F32, SCALAR_SHAPE, 1e-7, 13);
  double c = 6.5 / (13 + 1e-6);
  EXPECT(em_get_grad(p[0]), EM_F32, SHAPE(2), 1e-6, 3 * c, 4 * c);
  EXPECT(em_get_grad(p[1]), EM_F32, SHAPE(1), 1e-6, -12 * c);
  cr_assert_null(em_get_grad(p[2]), "a parameter without grad is skipped");
  /* inf-norm, and a max_norm above the total leaves the gradients alone */
  three_params(p);
  EXPECT(em_clip_grad_norm_(3, p, 100, INFINITY), EM_F32, SCALAR_SHAPE, 0, 12);
  EXPECT(em_get_grad(p[0]), EM_F32, SHAPE(2), 0, 3, 4);
  three_params(p);
  EXPECT(em_clip_grad_norm_(2, p, 6, INFINITY), EM_F32, SCALAR_SHAPE, 0, 12);
  EXPECT(em_get_grad(p[1]), EM_F32, SHAPE(1), 1e-6, -12 * 6 / (12 + 1e-6));
  /* p = 1: |3| + |4| + |12| */
  three_params(p);
  EXPECT(em_clip_grad_norm_(3, p, 1e9, 1), EM_F32, SCALAR_SHAPE, 1e-7, 19);
  /* no gradients at all: 0 */
  em_tensor *q = em_requires_grad_(em_ones(EM_F64, EM_SHAPE(2)), true);
  EXPECT(em_clip_grad_norm_(1, &q, 1, 2), EM_F32, SCALAR_SHAPE, 0, 0);
  EXPECT_ERROR(em_clip_grad_norm_(-1, p, 1, 2), "em_clip_grad_norm_: needs n >= 0");
  EXPECT_ERROR(em_clip_grad_norm_(1, p, -1, 2), "max_norm must be >= 0");
  EXPECT_ERROR(em_clip_grad_norm_(1, p, 1, 0), "norm_type must be > 0");
  EXPECT_ERROR(em_clip_grad_norm_(1, p, 1, NAN), "norm_type must be > 0");
  EXPECT_ERROR(em_clip_grad_norm_(1, NULL, 1, 2), "params NULL");
}

/* ---- compiled ---- */

static const char *const BACKENDS[] = {"eager", "aot_eager", "inductor"};

/* Every op of the suite in one function, with its gradient taken inside (traced too). */
static em_outputs lm_program(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0];
  em_tensor *idx, *pieces[3];
  em_tensor *sorted = em_sort(x, 1, true, &idx);
  em_tensor *top = em_topk(x, 2, 0, false, true, NULL);
  em_chunk(em_tril(x, 1), 3, 1, pieces, 3);
  em_tensor *y = em_add(em_mul(em_cumsum(x, 1), em_cumprod(em_triu(x, -1), 0)), em_mul_scalar(sorted, 0.5));
  em_tensor *loss = em_add(em_sum(em_mul(y, y), 0, NULL, false),
                           em_add(em_sum(top, 0, NULL, false), em_sum(em_mul(pieces[1], pieces[2]), 0, NULL, false)));
  em_tensor *g;
  em_grad(1, &loss, NULL, 1, &x, &g, false, false);
  return EM_OUTPUTS(loss, g, idx, em_argsort(em_cumsum(em_cast(x, EM_I32), 0), 0, false));
}

ETEST(lmops, compiled_agrees_with_eager_on_every_backend) {
  em_manual_seed(30);
  em_tensor *x = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(4, 6)), true);
  x = em_requires_grad_(em_where(em_lt_scalar(em_abs(x), 0.2), em_zeros(EM_F32, EM_SHAPE(1)), em_detach(x)), true); /* zeros for cumprod */
  em_outputs want = lm_program(NULL, &x, 1);
  for (int b = 0; b < 3; b++) {
    em_compiled *c = em_compile(lm_program, &(em_compile_options){.backend = BACKENDS[b]});
    for (int call = 0; call < 3; call++) {
      em_scope_begin();
      em_outputs got = em_call(c, NULL, x);
      cr_assert_eq(got.n, 4, "%s: %s", BACKENDS[b], em_last_error() ? em_last_error() : "");
      for (int o = 0; o < 4; o++) {
        cr_assert_not_null(got.t[o], "%s call %d output %d: %s", BACKENDS[b], call, o, em_last_error() ? em_last_error() : "");
        if (b == 0 || o >= 2) { /* the eager backend runs the eager kernels; indices are exact everywhere */
          EXPECT_SAME_BITS(got.t[o], want.t[o], BACKENDS[b]);
          continue;
        }
        double *u = values(got.t[o]), *v = values(want.t[o]);
        for (int64_t i = 0; i < em_numel(want.t[o]); i++)
          cr_assert(fabs(u[i] - v[i]) <= 1e-4 * (1 + fabs(v[i])), "%s call %d output %d[%lld]: %g vs %g", BACKENDS[b],
                    call, o, (long long)i, u[i], v[i]);
        free(u), free(v);
      }
      em_scope_end();
    }
    em_compile_stats st = em_compiled_stats(c);
    cr_assert_eq(st.breaks, 0, "%s: no graph break", BACKENDS[b]);
    cr_assert_eq(st.traces, 1, "%s", BACKENDS[b]);
    cr_assert_geq(st.replays, 1, "%s: the third call replays", BACKENDS[b]);
    em_compiled_free(c);
  }
}

/* Multinomial draws the same numbers compiled as eager from the same seed (its check reads a
 * count back: a graph break, then the draws trace into the next graph). */
static em_outputs draw(void *ctx, em_tensor *const *in, int n) {
  em_tensor *p = em_softmax(in[0], 1);
  return EM_OUTPUTS(em_multinomial(p, 5, true), em_multinomial(p, 3, false), em_multinomial(p, 1, true));
}

ETEST(lmops, compiled_multinomial_draws_as_eager) {
  em_manual_seed(31);
  em_tensor *logits = em_randn(EM_F32, EM_SHAPE(3, 7));
  for (int b = 0; b < 3; b++) {
    em_compiled *c = em_compile(draw, &(em_compile_options){.backend = BACKENDS[b]});
    for (int call = 0; call < 2; call++) {
      em_scope_begin();
      em_manual_seed(100 + (uint64_t)call);
      em_outputs want = draw(NULL, &logits, 1);
      em_manual_seed(100 + (uint64_t)call);
      em_outputs got = em_call(c, NULL, logits);
      cr_assert_eq(got.n, 3, "%s: %s", BACKENDS[b], em_last_error() ? em_last_error() : "");
      for (int o = 0; o < 3; o++) EXPECT_SAME_BITS(got.t[o], want.t[o], BACKENDS[b]);
      em_scope_end();
    }
    cr_assert_geq(em_compiled_stats(c).breaks, 3, "%s: each check is a break", BACKENDS[b]);
    em_compiled_free(c);
  }
}

/* A training step with clipping: forward, backward, clip_grad_norm_, SGD, compiled in one graph
 * (no break), and the parameters after three steps equal (or, inductor, close to) eager's. */
typedef struct step_ctx {
  em_tensor *w, *b;
  em_optimizer *opt;
} step_ctx;

static em_outputs train_step(void *ctx, em_tensor *const *in, int n) {
  step_ctx *s = ctx;
  em_tensor *pred = em_add(em_matmul(in[0], s->w), s->b);
  em_tensor *loss = em_mse_loss(pred, in[1], EM_REDUCE_SUM);
  em_optimizer_zero_grad(s->opt);
  em_backward(loss, NULL);
  em_tensor *norm = em_clip_grad_norm_(2, ((em_tensor *[]){s->w, s->b}), 0.5, 2);
  em_optimizer_step(s->opt);
  return EM_OUTPUTS(loss, norm);
}

static void step_init(step_ctx *s) {
  em_manual_seed(32);
  s->w = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(5, 2)), true);
  s->b = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(2)), true);
  s->opt = em_sgd_new(2, ((em_tensor *[]){s->w, s->b}), EM_SGD_DEFAULT(0.1));
}

ETEST(lmops, clip_grad_norm_traces_into_a_compiled_training_step) {
  em_manual_seed(33);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(8, 5)), *y = em_randn(EM_F32, EM_SHAPE(8, 2));
  step_ctx ref;
  step_init(&ref);
  double norms[3];
  for (int i = 0; i < 3; i++) {
    em_scope_begin();
    em_outputs o = train_step(&ref, (em_tensor *[]){x, y}, 2);
    norms[i] = em_item(o.t[1]);
    em_scope_end();
  }
  cr_assert_gt(norms[0], 0.5, "the first step is clipped (norm %g)", norms[0]);
  for (int b = 0; b < 3; b++) {
    step_ctx s;
    step_init(&s);
    em_compiled *c = em_compile(train_step, &(em_compile_options){.backend = BACKENDS[b]});
    for (int i = 0; i < 3; i++) {
      em_scope_begin();
      em_outputs o = em_call(c, &s, x, y);
      cr_assert_eq(o.n, 2, "%s: %s", BACKENDS[b], em_last_error() ? em_last_error() : "");
      double got = em_item(o.t[1]);
      cr_assert(fabs(got - norms[i]) <= 1e-5 * norms[i], "%s step %d: norm %.9g, eager %.9g", BACKENDS[b], i, got, norms[i]);
      em_scope_end();
    }
    if (b == 0) EXPECT_SAME_BITS(s.w, ref.w, "weights after three steps");
    else EXPECT(em_sub(s.w, ref.w), EM_F32, SHAPE(5, 2), 1e-5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    em_compile_stats st = em_compiled_stats(c);
    cr_assert_eq(st.breaks, 0, "%s: the step is one graph", BACKENDS[b]);
    cr_assert_geq(st.replays, 1, "%s", BACKENDS[b]);
    em_compiled_free(c);
    em_optimizer_free(s.opt);
  }
  em_optimizer_free(ref.opt);
}

/* tril's mask is made from iotas on x's device: compiled, a creation node runs on the device
 * the graph recorded, not the default one (it came out on the CPU under a CPU default, and the
 * CUDA kernels read it as device memory). */
static em_outputs masked(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_sum(em_tril(in[0], 0), 0, NULL, false), em_triu(in[0], 1));
}

ETEST(lmops, compiled_creation_runs_on_the_recorded_device) {
  etest_pick_cuda(); /* the GPU, or the emulator */
  em_device prev = em_set_default_device(EM_CPU);
  em_tensor *x = em_to(em_reshape(em_arange(EM_F32, 1, 10, 1), EM_SHAPE(3, 3)), EM_CUDA);
  for (int b = 0; b < 3; b++) {
    em_compiled *c = em_compile(masked, &(em_compile_options){.backend = BACKENDS[b]});
    for (int call = 0; call < 3; call++) {
      em_outputs o = em_call(c, NULL, x);
      cr_assert_eq(o.n, 2, "%s: %s", BACKENDS[b], em_last_error() ? em_last_error() : "");
      EXPECT(o.t[0], EM_F32, SCALAR_SHAPE, 0, 1 + 4 + 5 + 7 + 8 + 9);
      EXPECT(o.t[1], EM_F32, SHAPE(3, 3), 0, 0, 2, 3, 0, 0, 6, 0, 0, 0);
      cr_assert_eq(em_device_of(o.t[1]), EM_CUDA);
    }
    em_compiled_free(c);
  }
  em_set_default_device(prev);
}
