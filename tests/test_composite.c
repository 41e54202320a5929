/* tests/test_composite.c: forward values of the composite ops against hand-computed or plain-C
 * references, numerical stability at extreme inputs, and argument errors. (Their gradients are
 * checked in test_composite_grad.c.) */
#include "common.h"

#define F EM_F32
#define D EM_F64

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
  EXPECT(em_std(x, 0, NULL, 1, false), D, SCALAR_SHAPE, 1e-15, sqrt(37.0 / 5 * 1.0 - 0) * 0 + sqrt((1 + 4 + 9 + 16 + 36 + 64 - 6 * 16.0) / 5));
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
