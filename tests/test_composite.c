/* tests/test_composite.c: forward values of the composite ops against hand-computed or plain-C
 * double-precision references, numerical stability at extreme inputs, argument errors, NULL
 * propagation, and freedom from leaks when any allocation inside a composite fails. (Their
 * gradients are checked in test_composite_grad.c.) The reference loops are written from the
 * PyTorch formulas directly, not from the decompositions, so they check the decompositions. */
#include "common.h"

#define F EM_F32
#define D EM_F64

/* The elements of t, row-major, as doubles (n of them). */
static void values(em_tensor *t, double *out, int64_t n) {
  cr_assert_not_null(t, "%s", em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_numel(t), n, "%lld elements, expected %lld", (long long)em_numel(t), (long long)n);
  cr_assert(em_to_buffer(t, D, out, sizeof(double) * (size_t)n), "%s", em_last_error());
}

/* Asserts t holds want[0..n) within a relative tolerance. */
static void expect_values(em_tensor *t, const double *want, int64_t n, double tol, const char *what) {
  double *got = malloc(sizeof(double) * (size_t)n);
  values(t, got, n);
  for (int64_t i = 0; i < n; i++) {
    double g = got[i];
    if (!(fabs(g - want[i]) <= tol * (1 + fabs(want[i])))) {
      free(got);
      cr_assert_fail("%s: element %lld is %.17g, expected %.17g", what, (long long)i, g, want[i]);
    }
  }
  free(got);
}

ETEST(activations, values) {
  em_tensor *x = T(D, SHAPE(4), -2, -0.5, 0, 1.5);
  EXPECT(em_relu(x), D, SHAPE(4), 0, 0, 0, 0, 1.5);
  EXPECT(em_leaky_relu(x, 0.1), D, SHAPE(4), 1e-15, -0.2, -0.05, 0, 1.5);
  EXPECT(em_sigmoid(x), D, SHAPE(4), 1e-15, 1 / (1 + exp(2)), 1 / (1 + exp(0.5)), 0.5, 1 / (1 + exp(-1.5)));
  EXPECT(em_silu(x), D, SHAPE(4), 1e-15, -2 / (1 + exp(2)), -0.5 / (1 + exp(0.5)), 0, 1.5 / (1 + exp(-1.5)));
  EXPECT(em_gelu(x, false), D, SHAPE(4), 1e-15, -2 * 0.5 * (1 + erf(-2 / sqrt(2))), -0.5 * 0.5 * (1 + erf(-0.5 / sqrt(2))), 0,
         1.5 * 0.5 * (1 + erf(1.5 / sqrt(2))));
  double t = 1.5 * 0.5 * (1 + tanh(sqrt(2 / 3.141592653589793) * (1.5 + 0.044715 * 1.5 * 1.5 * 1.5)));
  cr_assert(fabs(etest_at(em_gelu(x, true), 3) - t) < 1e-15);
  EXPECT(em_softplus(x, 1, 20), D, SHAPE(4), 1e-15, log1p(exp(-2)), log1p(exp(-0.5)), log(2), log1p(exp(1.5)));
  EXPECT(em_softplus(T(D, SHAPE(1), 30), 1, 20), D, SHAPE(1), 0, 30);
  /* stable at extremes */
  EXPECT(em_sigmoid(T(F, SHAPE(2), -100, 100)), F, SHAPE(2), 1e-30, 1 / (1 + exp(100)), 1);
  EXPECT(em_clamp(x, -1, 1), D, SHAPE(4), 0, -1, -0.5, 0, 1);
  EXPECT(em_clamp(x, -INFINITY, 0), D, SHAPE(4), 0, -2, -0.5, 0, 0);
}

ETEST(softmax, values_and_stability) {
  em_tensor *x = T(D, SHAPE(2, 3), 1, 2, 3, 1000, 1000, 1000);
  double z = exp(1) + exp(2) + exp(3);
  EXPECT(em_softmax(x, 1), D, SHAPE(2, 3), 1e-15, exp(1) / z, exp(2) / z, exp(3) / z, 1.0 / 3, 1.0 / 3, 1.0 / 3);
  EXPECT(em_log_softmax(x, -1), D, SHAPE(2, 3), 1e-13, 1 - log(z), 2 - log(z), 3 - log(z), -log(3), -log(3), -log(3));
  EXPECT(em_logsumexp(T(D, SHAPE(2), 1000, 1000), 0, NULL, false), D, SCALAR_SHAPE, 1e-15, 1000 + log(2));
  EXPECT(em_logsumexp(x, EM_AXES(1), true), D, SHAPE(2, 1), 1e-13, log(z), 1000 + log(3));
  EXPECT(em_softmax(T(F, SHAPE(2), -INFINITY, 0), 0), F, SHAPE(2), 0, 0, 1);
  EXPECT_ERROR(em_softmax(x, 2), "axis 2 out of range");
}

ETEST(statistics, mean_var_std) {
  em_tensor *x = T(D, SHAPE(2, 3), 1, 2, 3, 4, 6, 8);
  EXPECT(em_mean(x, EM_AXES(1), false), D, SHAPE(2), 0, 2, 6);
  EXPECT(em_var(x, EM_AXES(1), 1, false), D, SHAPE(2), 1e-15, 1, 4);
  EXPECT(em_var(x, EM_AXES(1), 0, true), D, SHAPE(2, 1), 1e-15, 2.0 / 3, 8.0 / 3);
  /* all six values: mean 4, squared deviations 9 + 4 + 1 + 0 + 4 + 16 = 34 */
  EXPECT(em_std(x, 0, NULL, 1, false), D, SCALAR_SHAPE, 1e-15, sqrt(34.0 / 5));
  EXPECT(em_mean(T(EM_I64, SHAPE(2), 1, 2), 0, NULL, false), F, SCALAR_SHAPE, 0, 1.5);
}

ETEST(normalisation, layer_rms_batch) {
  em_tensor *x = T(D, SHAPE(2, 2), 1, 3, 2, 6);
  double e = 1e-5;
  EXPECT(em_layer_norm(x, 1, EM_NONE, EM_NONE, e), D, SHAPE(2, 2), 1e-12, -1 / sqrt(1 + e), 1 / sqrt(1 + e),
         -2 / sqrt(4 + e), 2 / sqrt(4 + e));
  EXPECT(em_layer_norm(x, 1, T(D, SHAPE(2), 2, 1), T(D, SHAPE(2), 0, 10), e), D, SHAPE(2, 2), 1e-12, -2 / sqrt(1 + e),
         10 + 1 / sqrt(1 + e), -4 / sqrt(4 + e), 10 + 2 / sqrt(4 + e));
  EXPECT(em_rms_norm(x, 1, EM_NONE, 0), D, SHAPE(2, 2), 1e-12, 1 / sqrt(5), 3 / sqrt(5), 2 / sqrt(20), 6 / sqrt(20));
  /* batch norm over [N=2, C=2]: channel 0 has (1, 2), channel 1 has (3, 6) */
  em_tensor *rm = em_zeros(D, EM_SHAPE(2)), *rv = em_ones(D, EM_SHAPE(2));
  EXPECT(em_batch_norm(x, rm, rv, EM_NONE, EM_NONE, true, 0.1, 0), D, SHAPE(2, 2), 1e-12, -1, -1, 1, 1);
  EXPECT(rm, D, SHAPE(2), 1e-15, 0.1 * 1.5, 0.1 * 4.5);
  EXPECT(rv, D, SHAPE(2), 1e-15, 0.9 + 0.1 * 0.5, 0.9 + 0.1 * 4.5); /* unbiased: n/(n-1) */
  EXPECT(em_batch_norm(x, rm, rv, EM_NONE, EM_NONE, false, 0.1, 0), D, SHAPE(2, 2), 1e-12, (1 - 0.15) / sqrt(0.95),
         (3 - 0.45) / sqrt(1.35), (2 - 0.15) / sqrt(0.95), (6 - 0.45) / sqrt(1.35));
  EXPECT_ERROR(em_layer_norm(x, 1, T(D, SHAPE(3), 1, 1, 1), EM_NONE, e), "weight f64[3] does not match");
}

ETEST(losses, cross_entropy_by_hand) {
  em_tensor *logits = T(D, SHAPE(2, 3), 1, 2, 3, 0, 0, 0);
  double z = log(exp(1) + exp(2) + exp(3));
  double l0 = z - 3, l1 = log(3);
  em_tensor *y = T(EM_I64, SHAPE(2), 2, 1);
  EXPECT(em_cross_entropy(logits, y, EM_CROSS_ENTROPY_DEFAULT), D, SCALAR_SHAPE, 1e-15, (l0 + l1) / 2);
  EXPECT(em_cross_entropy(logits, y, ((em_cross_entropy_opts){-100, 0, EM_REDUCE_NONE})), D, SHAPE(2), 1e-15, l0, l1);
  EXPECT(em_cross_entropy(logits, y, ((em_cross_entropy_opts){-100, 0, EM_REDUCE_SUM})), D, SCALAR_SHAPE, 1e-15, l0 + l1);
  /* ignore_index: only example 0 counts, and the mean divides by 1 */
  EXPECT(em_cross_entropy(logits, T(EM_I64, SHAPE(2), 2, -100), EM_CROSS_ENTROPY_DEFAULT), D, SCALAR_SHAPE, 1e-15, l0);
  /* label smoothing 0.3: (1 - 0.3) nll + 0.3 mean_c(-log p) */
  double s0 = (3 * z - 6) / 3, s1 = log(3);
  EXPECT(em_cross_entropy(logits, y, ((em_cross_entropy_opts){-100, 0.3, EM_REDUCE_MEAN})), D, SCALAR_SHAPE, 1e-14,
         (0.7 * l0 + 0.3 * s0 + 0.7 * l1 + 0.3 * s1) / 2);
  EXPECT(em_cross_entropy(logits, T(EM_I32, SHAPE(2), 2, 1), ((em_cross_entropy_opts){1, 0.3, EM_REDUCE_MEAN})), D,
         SCALAR_SHAPE, 1e-14, 0.7 * l0 + 0.3 * s0);
  /* probability targets equal to one-hot give the index loss */
  em_tensor *p = em_cast(em_one_hot(y, 3), D);
  EXPECT(em_cross_entropy(logits, p, EM_CROSS_ENTROPY_DEFAULT), D, SCALAR_SHAPE, 1e-15, (l0 + l1) / 2);
  EXPECT(em_nll_loss(em_log_softmax(logits, 1), y, -100, EM_REDUCE_SUM), D, SCALAR_SHAPE, 1e-15, l0 + l1);
  EXPECT(em_mse_loss(T(D, SHAPE(2), 1, 2), T(D, SHAPE(2), 3, 2), EM_REDUCE_MEAN), D, SCALAR_SHAPE, 0, 2);
  EXPECT_ERROR(em_cross_entropy(logits, T(EM_I64, SHAPE(3), 0, 0, 0), EM_CROSS_ENTROPY_DEFAULT), "does not match input");
  EXPECT_ERROR(em_cross_entropy(logits, y, ((em_cross_entropy_opts){-100, 2, EM_REDUCE_MEAN})), "label_smoothing");
}

ETEST(pooling, by_hand) {
  em_tensor *x = em_reshape(em_arange(D, 0, 16, 1), EM_SHAPE(1, 1, 4, 4));
  EXPECT(em_max_pool2d(x, 2, 2, 0, 0, 0, 0), D, SHAPE(1, 1, 2, 2), 0, 5, 7, 13, 15);
  EXPECT(em_avg_pool2d(x, 2, 2, 2, 2, 0, 0), D, SHAPE(1, 1, 2, 2), 0, 2.5, 4.5, 10.5, 12.5);
  EXPECT(em_max_pool2d(x, 3, 3, 2, 2, 1, 1), D, SHAPE(1, 1, 2, 2), 0, 5, 7, 13, 15);
  EXPECT(em_max_pool2d(em_neg(x), 3, 3, 2, 2, 1, 1), D, SHAPE(1, 1, 2, 2), 0, 0, -1, -4, -5); /* -inf padding */
  EXPECT(em_avg_pool2d(x, 3, 3, 3, 3, 1, 1), D, SHAPE(1, 1, 2, 2), 1e-15, 10.0 / 9, 18.0 / 9, 42.0 / 9, 50.0 / 9);
  EXPECT_ERROR(em_max_pool2d(x, 5, 5, 1, 1, 0, 0), "larger than the padded input");
}

ETEST(attention, sdpa_reference) {
  em_manual_seed(4);
  em_tensor *q = em_randn(D, EM_SHAPE(3, 2)), *k = em_randn(D, EM_SHAPE(3, 2)), *v = em_randn(D, EM_SHAPE(3, 2));
  em_tensor *out = em_scaled_dot_product_attention(q, k, v, true, 0, 0);
  double Q[6], K[6], V[6];
  em_to_buffer(q, D, Q, sizeof Q), em_to_buffer(k, D, K, sizeof K), em_to_buffer(v, D, V, sizeof V);
  for (int i = 0; i < 3; i++) {
    double w[3], s = 0, m = -INFINITY;
    for (int j = 0; j <= i; j++) w[j] = (Q[2 * i] * K[2 * j] + Q[2 * i + 1] * K[2 * j + 1]) / sqrt(2), m = fmax(m, w[j]);
    for (int j = 0; j <= i; j++) s += (w[j] = exp(w[j] - m));
    for (int c = 0; c < 2; c++) {
      double o = 0;
      for (int j = 0; j <= i; j++) o += w[j] / s * V[2 * j + c];
      cr_assert(fabs(etest_at(out, 2 * i + c) - o) < 1e-12, "row %d col %d", i, c);
    }
  }
}

ETEST(misc, dropout_one_hot_masked_fill_embedding_linear) {
  em_manual_seed(1);
  em_tensor *x = em_ones(F, EM_SHAPE(100000));
  em_tensor *d = em_dropout(x, 0.25, true);
  double zeros = em_item(em_sum(em_eq_scalar(d, 0), 0, NULL, false)) / 1e5;
  cr_assert(fabs(zeros - 0.25) < 0.01, "dropped fraction %g", zeros);
  cr_assert(fabs(em_item(em_amax(d, 0, NULL, false)) - 1 / 0.75) < 1e-6);
  EXPECT_ALL(em_dropout(x, 0.5, false), F, SHAPE(100000), 0, 1);
  EXPECT_ALL(em_dropout(x, 1, true), F, SHAPE(100000), 0, 0);
  EXPECT_ERROR(em_dropout(x, 1.5, true), "p must be in [0, 1]");
  EXPECT(em_one_hot(T(EM_I64, SHAPE(2), 2, 0), 3), EM_I64, SHAPE(2, 3), 0, 0, 0, 1, 1, 0, 0);
  EXPECT_ERROR(em_one_hot(T(EM_I64, SHAPE(1), 3), 3), "outside [0, 3)");
  EXPECT(em_masked_fill(T(F, SHAPE(2, 2), 1, 2, 3, 4), T(EM_BOOL, SHAPE(2), 1, 0), -1), F, SHAPE(2, 2), 0, -1, 2, -1, 4);
  EXPECT(em_embedding(T(EM_I64, SHAPE(2, 2), 1, 0, 1, 1), T(F, SHAPE(2, 2), 1, 2, 3, 4)), F, SHAPE(2, 2, 2), 0, 3, 4, 1, 2,
         3, 4, 3, 4);
  EXPECT(em_linear(T(F, SHAPE(1, 2), 1, 2), T(F, SHAPE(3, 2), 1, 0, 0, 1, 1, 1), T(F, SHAPE(3), 0, 0, 10)), F,
         SHAPE(1, 3), 0, 1, 2, 13);
  EXPECT(em_linear(T(F, SHAPE(2), 1, 2), T(F, SHAPE(1, 2), 3, 4), EM_NONE), F, SHAPE(1), 0, 11);
  EXPECT_ERROR(em_linear(T(F, SHAPE(2), 1, 2), T(F, SHAPE(1, 2), 3, 4), T(F, SHAPE(2), 0, 0)), "bias f32[2] does not match");
}

/* ---- against plain-C references ---- */

ETEST(softmax, against_reference_on_every_axis) {
  em_manual_seed(11);
  const int64_t sz[3] = {3, 4, 5};
  em_tensor *x = em_mul_scalar(em_randn(D, EM_SHAPE(3, 4, 5)), 4);
  double X[60], sm[60], lsm[60];
  values(x, X, 60);
  for (int axis = 0; axis < 3; axis++) {
    int64_t st[3] = {20, 5, 1}, n = sz[axis];
    for (int64_t i = 0; i < 60; i++) {
      /* the first element of i's line along axis */
      int64_t base = i - (i / st[axis] % n) * st[axis];
      double m = -INFINITY, z = 0;
      for (int64_t k = 0; k < n; k++) m = fmax(m, X[base + k * st[axis]]);
      for (int64_t k = 0; k < n; k++) z += exp(X[base + k * st[axis]] - m);
      sm[i] = exp(X[i] - m) / z;
      lsm[i] = X[i] - m - log(z);
    }
    expect_values(em_softmax(x, axis), sm, 60, 1e-14, "softmax");
    expect_values(em_log_softmax(x, axis - 3), lsm, 60, 1e-14, "log_softmax");
  }
  /* logsumexp over axes 0 and 2 -> [4] */
  double lse[4];
  for (int j = 0; j < 4; j++) {
    double m = -INFINITY, z = 0;
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 5; k++) m = fmax(m, X[i * 20 + j * 5 + k]);
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 5; k++) z += exp(X[i * 20 + j * 5 + k] - m);
    lse[j] = m + log(z);
  }
  em_tensor *l = em_logsumexp(x, EM_AXES(0, -1), false);
  cr_assert_eq(em_ndim(l), 1);
  expect_values(l, lse, 4, 1e-14, "logsumexp");
  cr_assert_eq(em_ndim(em_logsumexp(x, EM_AXES(0, -1), true)), 3);
  /* f32 at large magnitudes: no overflow, rows still sum to 1 */
  em_tensor *big = T(F, SHAPE(2, 2), 1e4, 1e4 - 1, -1e4, -1e4);
  EXPECT(em_softmax(big, 1), F, SHAPE(2, 2), 1e-6, 1 / (1 + exp(-1)), exp(-1) / (1 + exp(-1)), 0.5, 0.5);
  EXPECT(em_logsumexp(T(F, SHAPE(2), -INFINITY, -INFINITY), 0, NULL, false), F, SCALAR_SHAPE, 0, -INFINITY);
  EXPECT(em_logsumexp(T(F, SHAPE(2), INFINITY, 0), 0, NULL, false), F, SCALAR_SHAPE, 0, INFINITY);
}

ETEST(normalisation, layer_and_rms_norm_against_reference) {
  em_manual_seed(12);
  em_tensor *x = em_add_scalar(em_mul_scalar(em_randn(D, EM_SHAPE(2, 3, 4)), 3), 5);
  em_tensor *w = em_randn(D, EM_SHAPE(3, 4)), *b = em_randn(D, EM_SHAPE(3, 4));
  double X[24], W[12], B[12], ln[24], rms[24], eps = 1e-5;
  values(x, X, 24), values(w, W, 12), values(b, B, 12);
  for (int r = 0; r < 2; r++) {
    double mean = 0, var = 0, ms = 0;
    for (int i = 0; i < 12; i++) mean += X[r * 12 + i] / 12, ms += X[r * 12 + i] * X[r * 12 + i] / 12;
    for (int i = 0; i < 12; i++) var += (X[r * 12 + i] - mean) * (X[r * 12 + i] - mean) / 12;
    for (int i = 0; i < 12; i++) {
      ln[r * 12 + i] = (X[r * 12 + i] - mean) / sqrt(var + eps) * W[i] + B[i];
      rms[r * 12 + i] = X[r * 12 + i] / sqrt(ms + eps) * W[i];
    }
  }
  expect_values(em_layer_norm(x, 2, w, b, eps), ln, 24, 1e-12, "layer_norm");
  expect_values(em_rms_norm(x, 2, w, eps), rms, 24, 1e-12, "rms_norm");
  /* f32 keeps its dtype */
  em_tensor *y = em_layer_norm(em_cast(x, F), 2, em_cast(w, F), em_cast(b, F), eps);
  cr_assert_eq(em_dtype_of(y), F);
  expect_values(y, ln, 24, 1e-5, "layer_norm f32");
}

ETEST(normalisation, batch_norm_against_reference) {
  em_manual_seed(13);
  enum { N = 3, C = 2, HW = 4 };
  em_tensor *x = em_add_scalar(em_randn(D, EM_SHAPE(N, C, 2, 2)), 2);
  em_tensor *w = T(D, SHAPE(C), 1.5, -0.5), *b = T(D, SHAPE(C), 0.25, 3);
  em_tensor *rm = T(D, SHAPE(C), 0.5, -1), *rv = T(D, SHAPE(C), 2, 0.5);
  double X[N * C * HW], y[N * C * HW], RM[C] = {0.5, -1}, RV[C] = {2, 0.5}, Wt[C] = {1.5, -0.5}, Bs[C] = {0.25, 3};
  double m = 0.2, eps = 1e-5, n = N * HW;
  values(x, X, N * C * HW);
  for (int c = 0; c < C; c++) {
    double mean = 0, var = 0;
    for (int i = 0; i < N; i++)
      for (int k = 0; k < HW; k++) mean += X[(i * C + c) * HW + k] / n;
    for (int i = 0; i < N; i++)
      for (int k = 0; k < HW; k++) var += pow(X[(i * C + c) * HW + k] - mean, 2) / n;
    for (int i = 0; i < N; i++)
      for (int k = 0; k < HW; k++) y[(i * C + c) * HW + k] = (X[(i * C + c) * HW + k] - mean) / sqrt(var + eps) * Wt[c] + Bs[c];
    RM[c] = (1 - m) * RM[c] + m * mean;
    RV[c] = (1 - m) * RV[c] + m * var * n / (n - 1);
  }
  int64_t v0 = em_version(rm);
  expect_values(em_batch_norm(x, rm, rv, w, b, true, m, eps), y, N * C * HW, 1e-12, "batch_norm train");
  expect_values(rm, RM, C, 1e-14, "running_mean");
  expect_values(rv, RV, C, 1e-14, "running_var");
  cr_assert_gt(em_version(rm), v0, "running_mean updated in place");
  /* evaluation normalises with the running statistics and leaves them alone */
  for (int i = 0; i < N * C * HW; i++) {
    int c = i / HW % C;
    y[i] = (X[i] - RM[c]) / sqrt(RV[c] + eps) * Wt[c] + Bs[c];
  }
  expect_values(em_batch_norm(x, rm, rv, w, b, false, m, eps), y, N * C * HW, 1e-12, "batch_norm eval");
  expect_values(rm, RM, C, 1e-14, "running_mean after eval");
  /* training without running statistics, or with only one of them */
  cr_assert_not_null(em_batch_norm(x, EM_NONE, EM_NONE, EM_NONE, EM_NONE, true, m, eps));
  em_tensor *rm2 = em_zeros(D, EM_SHAPE(C));
  cr_assert_not_null(em_batch_norm(x, rm2, EM_NONE, EM_NONE, EM_NONE, true, 1, eps));
  double mean0 = 0;
  for (int i = 0; i < N; i++)
    for (int k = 0; k < HW; k++) mean0 += X[i * C * HW + k] / n;
  cr_assert(fabs(etest_at(rm2, 0) - mean0) < 1e-14);
  /* a model that requires grad: the running statistics still update, and never require grad */
  em_tensor *xg = em_requires_grad_(em_clone(x), true);
  em_tensor *rm3 = em_zeros(D, EM_SHAPE(C)), *rv3 = em_ones(D, EM_SHAPE(C));
  em_tensor *yg = em_batch_norm(xg, rm3, rv3, EM_NONE, EM_NONE, true, 0.5, eps);
  cr_assert(yg && em_requires_grad(yg));
  cr_assert(!em_requires_grad(rm3) && !em_requires_grad(rv3));
  cr_assert(fabs(etest_at(rm3, 0) - 0.5 * mean0) < 1e-14);
}

/* Cross entropy by definition: logits [N, C, P] (P positions), index targets [N, P]. */
static void ce_reference(const double *x, const int64_t *t, int N, int C, int P, int64_t ignore, double eps, double *per,
                         double *sum, double *count) {
  *sum = 0, *count = 0;
  for (int i = 0; i < N; i++)
    for (int p = 0; p < P; p++) {
      double m = -INFINITY, z = 0, all = 0;
      for (int c = 0; c < C; c++) m = fmax(m, x[(i * C + c) * P + p]);
      for (int c = 0; c < C; c++) z += exp(x[(i * C + c) * P + p] - m);
      double lse = m + log(z);
      for (int c = 0; c < C; c++) all += lse - x[(i * C + c) * P + p];
      int64_t k = t[i * P + p];
      double l = k == ignore ? 0 : (1 - eps) * (lse - x[(i * C + k) * P + p]) + eps * all / C;
      per[i * P + p] = l;
      *sum += l;
      *count += k != ignore;
    }
}

ETEST(losses, cross_entropy_against_reference) {
  em_manual_seed(14);
  enum { N = 3, C = 4, P = 2 };
  em_tensor *x = em_mul_scalar(em_randn(D, EM_SHAPE(N, C, P)), 2);
  double X[N * C * P], per[N * P], sum, count;
  values(x, X, N * C * P);
  /* -1 is ignored; as a class index it would be out of bounds, so it must never be gathered */
  int64_t t[N * P] = {3, -1, 0, 2, -1, 1};
  em_tensor *ti64 = em_from_data(t, EM_I64, EM_SHAPE(N, P)), *ti32 = em_cast(ti64, EM_I32);
  const double smoothing[3] = {0, 0.1, 0.6};
  for (int s = 0; s < 3; s++) {
    ce_reference(X, t, N, C, P, -1, smoothing[s], per, &sum, &count);
    em_cross_entropy_opts o = {-1, smoothing[s], EM_REDUCE_NONE};
    em_tensor *l = em_cross_entropy(x, ti64, o);
    cr_assert_eq(em_ndim(l), 2);
    expect_values(l, per, N * P, 1e-13, "cross_entropy none");
    o.reduction = EM_REDUCE_SUM;
    expect_values(em_cross_entropy(x, ti32, o), &sum, 1, 1e-13, "cross_entropy sum");
    o.reduction = EM_REDUCE_MEAN;
    double mean = sum / count;
    expect_values(em_cross_entropy(x, ti32, o), &mean, 1, 1e-13, "cross_entropy mean");
  }
  /* probability targets with smoothing: -sum_c ((1 - e) p_c + e / C) log_softmax_c, mean over N*P */
  em_tensor *pt = em_softmax(em_randn(D, EM_SHAPE(N, C, P)), 1);
  double PT[N * C * P], want = 0, e = 0.2;
  values(pt, PT, N * C * P);
  for (int i = 0; i < N; i++)
    for (int p = 0; p < P; p++) {
      double m = -INFINITY, z = 0;
      for (int c = 0; c < C; c++) m = fmax(m, X[(i * C + c) * P + p]);
      for (int c = 0; c < C; c++) z += exp(X[(i * C + c) * P + p] - m);
      for (int c = 0; c < C; c++)
        want -= ((1 - e) * PT[(i * C + c) * P + p] + e / C) * (X[(i * C + c) * P + p] - m - log(z)) / (N * P);
    }
  expect_values(em_cross_entropy(x, pt, ((em_cross_entropy_opts){-1, e, EM_REDUCE_MEAN})), &want, 1, 1e-13, "soft targets");
  /* every target ignored: the mean over no targets is NaN, as in PyTorch */
  EXPECT(em_cross_entropy(x, em_full(EM_I64, EM_SHAPE(N, P), -100), EM_CROSS_ENTROPY_DEFAULT), D, SCALAR_SHAPE, 0, NAN);
}

ETEST(losses, nll_and_mse) {
  em_tensor *lp = em_log(T(D, SHAPE(3, 2), 0.25, 0.75, 0.5, 0.5, 0.9, 0.1));
  em_tensor *y = T(EM_I32, SHAPE(3), 1, 7, 0);
  /* 7 is the ignore index: out of range for 2 classes, masked before the gather */
  EXPECT(em_nll_loss(lp, y, 7, EM_REDUCE_NONE), D, SHAPE(3), 1e-15, -log(0.75), 0, -log(0.9));
  EXPECT(em_nll_loss(lp, y, 7, EM_REDUCE_MEAN), D, SCALAR_SHAPE, 1e-15, (-log(0.75) - log(0.9)) / 2);
  EXPECT(em_nll_loss(lp, y, 7, EM_REDUCE_SUM), D, SCALAR_SHAPE, 1e-15, -log(0.75) - log(0.9));
  EXPECT_ERROR(em_nll_loss(lp, T(EM_I64, SHAPE(3), 1, 2, 0), -100, EM_REDUCE_MEAN), "em_gather");
  /* mse broadcasts y: [2, 2] against [2] */
  em_tensor *a = T(F, SHAPE(2, 2), 1, 2, 3, 5), *b = T(F, SHAPE(2), 1, 4);
  EXPECT(em_mse_loss(a, b, EM_REDUCE_NONE), F, SHAPE(2, 2), 0, 0, 4, 4, 1);
  EXPECT(em_mse_loss(a, b, EM_REDUCE_SUM), F, SCALAR_SHAPE, 0, 9);
  EXPECT(em_mse_loss(a, b, EM_REDUCE_MEAN), F, SCALAR_SHAPE, 0, 2.25);
}

/* Pooling by definition, with padding as -inf (max) or 0 counted in the average (avg). */
static void pool_reference(bool is_max, const double *x, int64_t N, int64_t H, int64_t W, int64_t kh, int64_t kw,
                           int64_t sh, int64_t sw, int64_t ph, int64_t pw, double *out, int64_t *ho, int64_t *wo) {
  *ho = (H + 2 * ph - kh) / sh + 1, *wo = (W + 2 * pw - kw) / sw + 1;
  for (int64_t n = 0; n < N; n++)
    for (int64_t i = 0; i < *ho; i++)
      for (int64_t j = 0; j < *wo; j++) {
        double acc = is_max ? -INFINITY : 0;
        for (int64_t a = 0; a < kh; a++)
          for (int64_t b = 0; b < kw; b++) {
            int64_t r = i * sh + a - ph, c = j * sw + b - pw;
            bool in = r >= 0 && r < H && c >= 0 && c < W;
            double v = in ? x[(n * H + r) * W + c] : is_max ? -INFINITY : 0;
            acc = is_max ? fmax(acc, v) : acc + v;
          }
        out[(n * *ho + i) * *wo + j] = is_max ? acc : acc / (double)(kh * kw);
      }
}

ETEST(pooling, against_reference) {
  em_manual_seed(15);
  enum { NC = 6, H = 7, W = 6 };
  em_tensor *x = em_randn(D, EM_SHAPE(2, 3, H, W));
  double X[NC * H * W], want[NC * H * W];
  values(x, X, NC * H * W);
  /* kh kw sh sw ph pw: tiled (with leftover rows), overlapping, padded, asymmetric, 1x1 strided */
  static const int64_t cfg[][6] = {{2, 2, 0, 0, 0, 0}, {3, 3, 2, 2, 1, 1}, {3, 2, 1, 2, 1, 0},
                                   {2, 3, 3, 1, 0, 1}, {1, 1, 2, 2, 0, 0}, {7, 6, 1, 1, 0, 0}};
  for (int k = 0; k < 6; k++)
    for (int is_max = 0; is_max < 2; is_max++) {
      const int64_t *c = cfg[k];
      int64_t ho, wo;
      pool_reference(is_max, X, NC, H, W, c[0], c[1], c[2] ? c[2] : c[0], c[3] ? c[3] : c[1], c[4], c[5], want, &ho, &wo);
      em_tensor *y = is_max ? em_max_pool2d(x, c[0], c[1], c[2], c[3], c[4], c[5])
                            : em_avg_pool2d(x, c[0], c[1], c[2], c[3], c[4], c[5]);
      cr_assert(y && em_size(y, 2) == ho && em_size(y, 3) == wo, "config %d: %s", k, em_last_error() ? em_last_error() : "");
      char what[64];
      snprintf(what, sizeof what, "%s config %d", is_max ? "max" : "avg", k);
      expect_values(y, want, NC * ho * wo, 1e-14, what);
    }
  cr_assert_eq(em_dtype_of(em_max_pool2d(em_cast(x, F), 2, 2, 0, 0, 0, 0)), F);
}

ETEST(attention, sdpa_batched_against_reference) {
  em_manual_seed(16);
  enum { B = 2, L = 3, S = 5, E = 4, EV = 2 };
  em_tensor *q = em_randn(D, EM_SHAPE(B, L, E)), *k = em_randn(D, EM_SHAPE(B, S, E)), *v = em_randn(D, EM_SHAPE(B, S, EV));
  double Q[B * L * E], K[B * S * E], V[B * S * EV], want[B * L * EV];
  values(q, Q, B * L * E), values(k, K, B * S * E), values(v, V, B * S * EV);
  for (int causal = 0; causal < 2; causal++)
    for (int si = 0; si < 2; si++) {
      double scale = si ? 0.7 : 1 / sqrt(E);
      for (int b = 0; b < B; b++)
        for (int i = 0; i < L; i++) {
          double w[S], m = -INFINITY, z = 0;
          int n = causal ? i + 1 : S; /* causal: key j is visible to query i when j <= i */
          for (int j = 0; j < n; j++) {
            w[j] = 0;
            for (int e = 0; e < E; e++) w[j] += Q[(b * L + i) * E + e] * K[(b * S + j) * E + e] * scale;
            m = fmax(m, w[j]);
          }
          for (int j = 0; j < n; j++) z += (w[j] = exp(w[j] - m));
          for (int c = 0; c < EV; c++) {
            double o = 0;
            for (int j = 0; j < n; j++) o += w[j] / z * V[(b * S + j) * EV + c];
            want[(b * L + i) * EV + c] = o;
          }
        }
      em_tensor *out = em_scaled_dot_product_attention(q, k, v, causal, 0, si ? 0.7 : 0);
      cr_assert(out && em_ndim(out) == 3 && em_size(out, 1) == L && em_size(out, 2) == EV);
      expect_values(out, want, B * L * EV, 1e-13, causal ? "causal sdpa" : "sdpa");
    }
  EXPECT_ERROR(em_scaled_dot_product_attention(q, k, v, false, 1.5, 0), "dropout_p must be in [0, 1]");
  EXPECT_ERROR(em_scaled_dot_product_attention(q, v, v, false, 0, 0), "needs q [..., L, E]");
  EXPECT_ERROR(em_scaled_dot_product_attention(em_cast(q, EM_I64), k, v, false, 0, 0), "needs f32 or f64");
}

/* ---- activations and small ops at their edges ---- */

ETEST(activations, extremes_and_both_gelu_forms) {
  double xs[7] = {-100, -20, -3, -0.25, 0.5, 4, 100};
  em_tensor *x = em_from_data(xs, D, EM_SHAPE(7));
  double g[7], gt[7], sg[7], si[7], sp[7], sp2[7];
  for (int i = 0; i < 7; i++) {
    double v = xs[i];
    g[i] = 0.5 * v * (1 + erf(v / sqrt(2)));
    gt[i] = 0.5 * v * (1 + tanh(sqrt(2 / 3.141592653589793) * (v + 0.044715 * v * v * v)));
    sg[i] = v >= 0 ? 1 / (1 + exp(-v)) : exp(v) / (1 + exp(v));
    si[i] = v * sg[i];
    sp[i] = v > 20 ? v : log1p(exp(v));
    sp2[i] = 2 * v > 5 ? v : log1p(exp(2 * v)) / 2; /* beta 2, threshold 5 */
  }
  expect_values(em_gelu(x, false), g, 7, 1e-15, "gelu");
  expect_values(em_gelu(x, true), gt, 7, 1e-15, "gelu tanh");
  expect_values(em_sigmoid(x), sg, 7, 1e-15, "sigmoid");
  expect_values(em_silu(x), si, 7, 1e-15, "silu");
  expect_values(em_softplus(x, 1, 20), sp, 7, 1e-15, "softplus");
  expect_values(em_softplus(x, 2, 5), sp2, 7, 1e-15, "softplus beta 2");
  /* f32 at +-100 and beyond: no NaN, no overflow */
  em_tensor *xf = T(F, SHAPE(4), -1000, -100, 100, 1000);
  EXPECT(em_sigmoid(xf), F, SHAPE(4), 1e-6, 0, 1 / (1 + exp(100)), 1, 1);
  EXPECT(em_silu(xf), F, SHAPE(4), 1e-6, 0, -100 / (1 + exp(100)), 100, 1000);
  EXPECT(em_softplus(xf, 1, 1e30), F, SHAPE(4), 1e-6, 0, log1p(exp(-100)), 100, 1000);
  EXPECT(em_relu(T(F, SHAPE(3), NAN, -1, 2)), F, SHAPE(3), 0, NAN, 0, 2);
  EXPECT(em_relu(T(EM_I64, SHAPE(2), -3, 3)), EM_I64, SHAPE(2), 0, 0, 3);
  EXPECT_ERROR(em_gelu(T(EM_I64, SHAPE(1), 1), false), "em_gelu: needs f32 or f64");
  EXPECT_ERROR(em_silu(T(EM_I64, SHAPE(1), 1)), "em_silu: needs f32 or f64");
  EXPECT_ERROR(em_softplus(x, 0, 20), "beta must be > 0");
}

ETEST(small_ops, clamp_one_hot_masked_fill_embedding) {
  em_tensor *x = T(D, SHAPE(4), -2, NAN, 0.5, 3);
  EXPECT(em_clamp(x, -1, 1), D, SHAPE(4), 0, -1, NAN, 0.5, 1);
  EXPECT(em_clamp(x, 0, INFINITY), D, SHAPE(4), 0, 0, NAN, 0.5, 3);
  EXPECT(em_clamp(x, 2, 1), D, SHAPE(4), 0, 1, NAN, 1, 1); /* lo > hi: hi, as torch.clamp */
  em_tensor *c = em_clamp(x, -INFINITY, INFINITY);
  cr_assert(c != x && !em_shares_storage(c, x), "an unbounded clamp still returns a new tensor");
  EXPECT(em_clamp(T(EM_I64, SHAPE(3), -5, 1, 9), 0, 4), EM_I64, SHAPE(3), 0, 0, 1, 4);

  EXPECT(em_one_hot(T(EM_I32, SHAPE(2, 1), 1, 0), 2), EM_I64, SHAPE(2, 1, 2), 0, 0, 1, 1, 0);
  EXPECT(em_one_hot(em_zeros(EM_I64, EM_SHAPE(0)), 3), EM_I64, SHAPE(0, 3), 0);
  EXPECT(em_one_hot(em_scalar(EM_I64, 2), 4), EM_I64, SHAPE(4), 0, 0, 0, 1, 0);
  EXPECT_ERROR(em_one_hot(T(EM_I64, SHAPE(2), 0, -1), 3), "outside [0, 3)");
  EXPECT_ERROR(em_one_hot(T(F, SHAPE(1), 0), 3), "indices must be i64 or i32, got f32[1]");
  EXPECT_ERROR(em_one_hot(T(EM_I64, SHAPE(1), 0), 0), "needs at least one class");

  em_tensor *m = T(EM_BOOL, SHAPE(2, 1), 0, 1);
  EXPECT(em_masked_fill(T(F, SHAPE(2, 2), 1, 2, 3, 4), m, -INFINITY), F, SHAPE(2, 2), 0, 1, 2, -INFINITY, -INFINITY);
  EXPECT(em_masked_fill(T(EM_I64, SHAPE(2), 5, 6), T(EM_BOOL, SHAPE(2), 1, 0), -7), EM_I64, SHAPE(2), 0, -7, 6);
  EXPECT_ERROR(em_masked_fill(T(F, SHAPE(2), 1, 2), T(EM_BOOL, SHAPE(2, 2), 1, 0, 0, 1), 0),
               "mask bool[2,2] does not broadcast to x f32[2]");
  EXPECT_ERROR(em_masked_fill(T(F, SHAPE(2), 1, 2), T(EM_I64, SHAPE(2), 1, 0), 0), "mask must be bool, got i64[2]");
  EXPECT_ERROR(em_masked_fill(T(EM_I64, SHAPE(2), 1, 2), T(EM_BOOL, SHAPE(2), 1, 0), -INFINITY), "without overflow");

  em_tensor *w = T(F, SHAPE(3, 2), 0, 1, 10, 11, 20, 21);
  EXPECT(em_embedding(T(EM_I32, SHAPE(3), 2, 2, 0), w), F, SHAPE(3, 2), 0, 20, 21, 20, 21, 0, 1);
  EXPECT(em_embedding(em_scalar(EM_I64, 1), w), F, SHAPE(2), 0, 10, 11);
  EXPECT(em_embedding(em_zeros(EM_I64, EM_SHAPE(2, 0)), w), F, SHAPE(2, 0, 2), 0);
  EXPECT_ERROR(em_embedding(T(EM_I64, SHAPE(1), 3), w), "em_index_select");
  EXPECT_ERROR(em_embedding(T(F, SHAPE(1), 0), w), "indices must be i64 or i32");
  EXPECT_ERROR(em_embedding(T(EM_I64, SHAPE(1), 0), T(F, SHAPE(2), 1, 2)), "weight must be [V, D], got f32[2]");
}

ETEST(statistics, against_reference) {
  em_manual_seed(17);
  em_tensor *x = em_randn(D, EM_SHAPE(3, 4));
  double X[12];
  values(x, X, 12);
  for (int corr = 0; corr < 3; corr++) {
    double mean[4], var[4], sd[4];
    for (int j = 0; j < 4; j++) {
      mean[j] = (X[j] + X[4 + j] + X[8 + j]) / 3;
      double ss = 0;
      for (int i = 0; i < 3; i++) ss += pow(X[i * 4 + j] - mean[j], 2);
      var[j] = ss / (3 - corr), sd[j] = sqrt(var[j]);
    }
    expect_values(em_mean(x, EM_AXES(0), false), mean, 4, 1e-15, "mean");
    expect_values(em_var(x, EM_AXES(-2), corr, false), var, 4, 1e-14, "var");
    em_tensor *s = em_std(x, EM_AXES(0), corr, true);
    cr_assert(em_ndim(s) == 2 && em_size(s, 0) == 1);
    expect_values(s, sd, 4, 1e-14, "std");
  }
  /* over both axes, and integer input (f32 result) */
  double all = 0, ss = 0;
  for (int i = 0; i < 12; i++) all += X[i] / 12;
  for (int i = 0; i < 12; i++) ss += pow(X[i] - all, 2);
  EXPECT(em_var(x, EM_AXES(0, 1), 1, false), D, SCALAR_SHAPE, 1e-14, ss / 11);
  EXPECT(em_var(T(EM_I32, SHAPE(4), 1, 2, 3, 4), 0, NULL, 1, false), F, SCALAR_SHAPE, 1e-7, 5.0 / 3);
  /* correction as large as the count: the division by zero gives inf, as torch.var */
  EXPECT(em_var(T(D, SHAPE(2), 1, 2), 0, NULL, 2, false), D, SCALAR_SHAPE, 0, INFINITY);
}

ETEST(misc, dropout_statistics_and_identities) {
  em_manual_seed(18);
  em_tensor *x = em_add_scalar(em_randn(D, EM_SHAPE(100000)), 10); /* no element is 0 by chance */
  const double ps[3] = {0.1, 0.5, 0.9};
  for (int k = 0; k < 3; k++) {
    double p = ps[k];
    em_tensor *d = em_dropout(x, p, true);
    em_tensor *kept = em_ne_scalar(d, 0);
    double frac = 1 - em_item(em_sum(kept, 0, NULL, false)) / 1e5;
    cr_assert(fabs(frac - p) < 0.01, "p %g: dropped %g", p, frac);
    /* survivors are exactly x / (1 - p) */
    em_tensor *err = em_abs(em_sub(d, em_where(kept, em_div_scalar(x, 1 - p), em_scalar(D, 0))));
    cr_assert(em_item(em_amax(err, 0, NULL, false)) < 1e-12, "p %g: survivors not scaled", p);
  }
  /* a fresh mask per call */
  cr_assert(em_item(em_sum(em_ne(em_dropout(x, 0.5, true), em_dropout(x, 0.5, true)), 0, NULL, false)) > 1000);
  EXPECT_ALL(em_sub(em_dropout(x, 0, true), x), D, SHAPE(100000), 0, 0);
  EXPECT_ALL(em_sub(em_dropout(x, 0.3, false), x), D, SHAPE(100000), 0, 0);
  EXPECT_ALL(em_dropout(x, 1, true), D, SHAPE(100000), 0, 0);
  EXPECT_ERROR(em_dropout(x, -0.1, true), "p must be in [0, 1], got -0.1");
  EXPECT_ERROR(em_dropout(x, NAN, false), "p must be in [0, 1]");
}

/* ---- errors, NULL inputs, allocation failures ---- */

ETEST(errors, arguments) {
  em_tensor *x = T(F, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), *xi = T(EM_I64, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
  EXPECT_ERROR(em_softmax(xi, 0), "em_softmax: needs f32 or f64, got i64[2,3]");
  EXPECT_ERROR(em_log_softmax(x, -3), "axis -3 out of range for f32[2,3]");
  EXPECT_ERROR(em_logsumexp(x, EM_AXES(2), false), "em_logsumexp: axis 2 out of range");
  EXPECT_ERROR(em_cross_entropy(x, T(EM_I64, SHAPE(2), 0, 3), EM_CROSS_ENTROPY_DEFAULT), "em_cross_entropy: em_gather: index 3 is out of bounds");
  EXPECT_ERROR(em_layer_norm(x, 3, EM_NONE, EM_NONE, 1e-5), "cannot normalise over the last 3 dims of f32[2,3]");
  EXPECT_ERROR(em_rms_norm(x, 1, T(D, SHAPE(3), 1, 1, 1), 1e-5), "weight f64[3] does not match the normalised dims of f32[2,3]");
  EXPECT_ERROR(em_layer_norm(x, 1, EM_NONE, T(F, SHAPE(2), 1, 1), 1e-5), "bias f32[2] does not match");
  em_tensor *c2 = em_zeros(F, EM_SHAPE(3));
  EXPECT_ERROR(em_batch_norm(T(F, SHAPE(3), 1, 2, 3), c2, c2, EM_NONE, EM_NONE, true, 0.1, 1e-5), "needs x [N, C, ...], got f32[3]");
  EXPECT_ERROR(em_batch_norm(x, em_zeros(F, EM_SHAPE(2)), EM_NONE, EM_NONE, EM_NONE, true, 0.1, 1e-5),
               "running_mean must be f32[3] for x f32[2,3], got f32[2]");
  EXPECT_ERROR(em_batch_norm(x, c2, em_zeros(D, EM_SHAPE(3)), EM_NONE, EM_NONE, true, 0.1, 1e-5), "running_var must be f32[3]");
  EXPECT_ERROR(em_batch_norm(x, EM_NONE, EM_NONE, EM_NONE, EM_NONE, false, 0.1, 1e-5), "evaluation needs running_mean");
  EXPECT_ERROR(em_batch_norm(T(F, SHAPE(1, 3), 1, 2, 3), EM_NONE, EM_NONE, EM_NONE, EM_NONE, true, 0.1, 1e-5),
               "more than 1 value per channel");
  EXPECT_ERROR(em_linear(x, T(F, SHAPE(2, 2), 1, 2, 3, 4), EM_NONE), "x f32[2,3] does not end in weight f32[2,2]");
  EXPECT_ERROR(em_linear(x, T(F, SHAPE(3), 1, 2, 3), EM_NONE), "weight must be [out, in], got f32[3]");
  EXPECT_ERROR(em_cross_entropy(x, T(F, SHAPE(2, 2), 1, 0, 0, 1), EM_CROSS_ENTROPY_DEFAULT),
               "probability targets f32[2,2] must have the logits' shape f32[2,3]");
  EXPECT_ERROR(em_cross_entropy(x, T(EM_U8, SHAPE(2), 1, 0), EM_CROSS_ENTROPY_DEFAULT),
               "class-index targets must be i64 or i32, got u8[2]");
  EXPECT_ERROR(em_cross_entropy(T(F, SHAPE(3), 1, 2, 3), T(EM_I64, SHAPE(1), 0), EM_CROSS_ENTROPY_DEFAULT),
               "logits must be [N, C, ...], got f32[3]");
  EXPECT_ERROR(em_cross_entropy(x, T(EM_I64, SHAPE(2), 0, 1), ((em_cross_entropy_opts){-100, 0, (em_reduction)9})),
               "unknown reduction 9");
  EXPECT_ERROR(em_cross_entropy(x, T(EM_I64, SHAPE(2), 0, 3), EM_CROSS_ENTROPY_DEFAULT), "em_gather");
  EXPECT_ERROR(em_nll_loss(xi, T(EM_I64, SHAPE(2), 0, 1), -100, EM_REDUCE_MEAN), "em_nll_loss: needs f32 or f64");
  EXPECT_ERROR(em_mse_loss(x, T(F, SHAPE(2), 1, 2), EM_REDUCE_MEAN), "em_sub");
  EXPECT_ERROR(em_mse_loss(xi, xi, EM_REDUCE_MEAN), "em_mse_loss: needs f32 or f64");
  em_tensor *img = em_zeros(F, EM_SHAPE(1, 1, 4, 4));
  EXPECT_ERROR(em_max_pool2d(x, 2, 2, 0, 0, 0, 0), "needs x [N, C, H, W], got f32[2,3]");
  EXPECT_ERROR(em_avg_pool2d(img, 2, 2, 1, 1, 2, 0), "padding at most half the kernel");
  EXPECT_ERROR(em_avg_pool2d(img, 0, 2, 1, 1, 0, 0), "bad window");
  EXPECT_ERROR(em_max_pool2d(img, 2, 2, -1, 1, 0, 0), "bad window");
  EXPECT_ERROR(em_max_pool2d(em_zeros(EM_I64, EM_SHAPE(1, 1, 4, 4)), 2, 2, 0, 0, 1, 1), "needs f32 or f64");
}

ETEST(errors, null_inputs_return_null_silently) {
  em_tensor *x = T(F, SHAPE(2, 2), 1, 2, 3, 4), *i = T(EM_I64, SHAPE(2), 0, 1), *c = em_zeros(F, EM_SHAPE(2));
  em_tensor *m = T(EM_BOOL, SHAPE(2), 1, 0);
  em_clear_error();
  const void *r[] = {
      em_relu(NULL), em_leaky_relu(NULL, 0.1), em_gelu(NULL, true), em_silu(NULL), em_sigmoid(NULL),
      em_softplus(NULL, 1, 20), em_softmax(NULL, 0), em_log_softmax(NULL, 0), em_logsumexp(NULL, 0, NULL, false),
      em_mean(NULL, 0, NULL, false), em_var(NULL, 0, NULL, 1, false), em_std(NULL, 0, NULL, 1, false),
      em_layer_norm(NULL, 1, EM_NONE, EM_NONE, 1e-5), em_layer_norm(x, 1, NULL, EM_NONE, 1e-5),
      em_rms_norm(x, 1, NULL, 1e-5), em_batch_norm(x, NULL, c, EM_NONE, EM_NONE, true, 0.1, 1e-5),
      em_batch_norm(x, c, c, EM_NONE, NULL, true, 0.1, 1e-5), em_linear(x, x, NULL), em_linear(NULL, x, EM_NONE),
      em_dropout(NULL, 0.5, true), em_cross_entropy(x, NULL, EM_CROSS_ENTROPY_DEFAULT),
      em_cross_entropy(NULL, i, EM_CROSS_ENTROPY_DEFAULT), em_nll_loss(NULL, i, -100, EM_REDUCE_MEAN),
      em_mse_loss(x, NULL, EM_REDUCE_SUM), em_embedding(NULL, x), em_embedding(i, NULL),
      em_max_pool2d(NULL, 2, 2, 0, 0, 0, 0), em_avg_pool2d(NULL, 2, 2, 0, 0, 0, 0),
      em_scaled_dot_product_attention(x, NULL, x, true, 0, 0), em_clamp(NULL, 0, 1), em_one_hot(NULL, 2),
      em_masked_fill(NULL, m, 0), em_masked_fill(x, NULL, 0)};
  for (size_t k = 0; k < sizeof r / sizeof r[0]; k++) cr_assert_null(r[k], "call %zu returned a tensor", k);
  cr_assert_null(em_last_error(), "a NULL input recorded: %s", em_last_error());
}

/* Every composite, with each of its allocations failing in turn: it returns NULL with an
 * out-of-memory error and leaves nothing behind. */
static em_tensor *g_x, *g_img, *g_i, *g_w, *g_rm, *g_rv;
static em_tensor *f_softmax(void) { return em_log_softmax(g_x, 1); }
static em_tensor *f_logsumexp(void) { return em_logsumexp(g_x, EM_AXES(1), false); }
static em_tensor *f_acts(void) { return em_softplus(em_gelu(em_silu(g_x), true), 2, 5); }
static em_tensor *f_layer_norm(void) { return em_layer_norm(g_x, 1, g_w, g_w, 1e-5); }
static em_tensor *f_batch_norm(void) { return em_batch_norm(g_img, g_rm, g_rv, g_rm, g_rv, true, 0.1, 1e-5); }
static em_tensor *f_var(void) { return em_std(g_x, EM_AXES(0), 1, false); }
static em_tensor *f_ce(void) { return em_cross_entropy(g_x, g_i, ((em_cross_entropy_opts){1, 0.2, EM_REDUCE_MEAN})); }
static em_tensor *f_pool(void) { return em_add(em_max_pool2d(g_img, 3, 3, 2, 2, 1, 1), em_avg_pool2d(g_img, 3, 3, 2, 2, 1, 1)); }
static em_tensor *f_sdpa(void) { return em_scaled_dot_product_attention(g_x, g_x, g_x, true, 0.5, 0); }
static em_tensor *f_one_hot(void) { return em_one_hot(g_i, 4); }
static em_tensor *f_embedding(void) { return em_embedding(g_i, g_x); }
static em_tensor *f_linear(void) { return em_linear(g_x, g_x, g_w); }
static em_tensor *f_misc(void) {
  em_tensor *a = em_clamp(em_leaky_relu(g_x, 0.1), -1, 1);
  em_tensor *b = em_masked_fill(em_rms_norm(g_x, 1, g_w, 1e-5), em_gt_scalar(g_w, 2), 0);
  return em_mse_loss(em_relu(a), em_var(b, EM_AXES(1), 0, true), EM_REDUCE_MEAN);
}
static em_tensor *f_nll(void) { return em_nll_loss(em_dropout(g_x, 0.5, true), g_i, 1, EM_REDUCE_MEAN); }
static em_tensor *f_soft_ce(void) {
  return em_cross_entropy(g_x, em_softmax(g_x, 0), ((em_cross_entropy_opts){-100, 0.1, EM_REDUCE_SUM}));
}

ETEST(errors, allocation_failures_leak_nothing) {
  g_x = T(F, SHAPE(4, 4), 1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, 0.5, 0, 9, 1);
  g_img = em_randn(F, EM_SHAPE(2, 4, 5, 5));
  g_i = T(EM_I64, SHAPE(4), 0, 1, 3, 2);
  g_w = T(F, SHAPE(4), 1, 2, 3, 4);
  g_rm = em_zeros(F, EM_SHAPE(4)), g_rv = em_ones(F, EM_SHAPE(4));
  struct {
    const char *name;
    em_tensor *(*f)(void);
  } ops[] = {{"log_softmax", f_softmax}, {"logsumexp", f_logsumexp}, {"activations", f_acts},
             {"layer_norm", f_layer_norm}, {"batch_norm", f_batch_norm}, {"std", f_var}, {"cross_entropy", f_ce},
             {"pooling", f_pool}, {"sdpa", f_sdpa}, {"one_hot", f_one_hot}, {"embedding", f_embedding},
             {"linear", f_linear}, {"misc", f_misc}, {"nll", f_nll}, {"soft cross_entropy", f_soft_ce}};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    int failures = etest_fail_each_allocation(ops[k].name, ops[k].f, 2000);
    cr_assert_gt(failures, 5, "%s: too few allocations exercised", ops[k].name);
  }
}
