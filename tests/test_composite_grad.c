/* tests/test_composite_grad.c: finite-difference gradient checks in f64 of every composite op.
 * Composites have no autograd code of their own; these checks prove their decompositions
 * differentiate correctly through the prims' rules, with broadcast and non-contiguous inputs. */
#include "gradcheck.h"

#define D EM_F64
#define FN(name, expr)                                   \
  static em_tensor *name(em_tensor *const *x, void *c) { \
    (void)c;                                             \
    return expr;                                         \
  }

FN(f_relu, em_relu(em_transpose(x[0], 0, 1)))
FN(f_leaky, em_leaky_relu(x[0], 0.1))
FN(f_gelu, em_gelu(x[0], false))
FN(f_gelu_tanh, em_gelu(x[0], true))
FN(f_silu, em_silu(x[0]))
FN(f_sigmoid, em_sigmoid(x[0]))
FN(f_softplus, em_softplus(x[0], 2, 20))
FN(f_softmax, em_softmax(em_transpose(x[0], 0, 1), 1))
FN(f_log_softmax, em_log_softmax(x[0], 0))
FN(f_logsumexp, em_logsumexp(x[0], EM_AXES(1), true))
FN(f_mean, em_mean(x[0], EM_AXES(0), false))
FN(f_var, em_var(x[0], EM_AXES(1), 1, true))
FN(f_std, em_std(x[0], 0, NULL, 0, false))
FN(f_clamp, em_clamp(x[0], -0.5, 0.5))
FN(f_masked_fill, em_masked_fill(x[0], em_gt_scalar(em_slice(x[0], 0, 0, 1, 1), 0), 2.0))
FN(f_mse, em_mse_loss(x[0], em_transpose(x[1], 0, 1), EM_REDUCE_MEAN))

ETEST(composite_grad, activations_and_reductions) {
  em_manual_seed(21);
  struct { const char *name; gc_fn f; } cases[] = {
      {"relu", f_relu}, {"leaky_relu", f_leaky}, {"gelu", f_gelu}, {"gelu tanh", f_gelu_tanh},
      {"silu", f_silu}, {"sigmoid", f_sigmoid}, {"softplus", f_softplus}, {"softmax", f_softmax},
      {"log_softmax", f_log_softmax}, {"logsumexp", f_logsumexp}, {"mean", f_mean}, {"var", f_var},
      {"std", f_std}, {"clamp", f_clamp}, {"masked_fill", f_masked_fill},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    em_tensor *x = gc_leaf(-2, 2, EM_SHAPE(3, 4));
    gradcheck(cases[i].name, cases[i].f, NULL, 1, &x);
  }
  em_tensor *xy[2] = {gc_leaf(-1, 1, EM_SHAPE(3, 4)), gc_leaf(-1, 1, EM_SHAPE(4, 3))};
  gradcheck("mse_loss", f_mse, NULL, 2, xy);
}

FN(f_layer_norm, em_layer_norm(x[0], 1, x[1], x[2], 1e-5))
FN(f_layer_norm2, em_layer_norm(em_transpose(x[0], 0, 1), 2, EM_NONE, EM_NONE, 1e-5))
FN(f_rms_norm, em_rms_norm(x[0], 1, x[1], 1e-6))
static em_tensor *f_batch_norm(em_tensor *const *x, void *c) {
  (void)c;
  em_tensor *rm = em_zeros(D, EM_SHAPE(3)), *rv = em_ones(D, EM_SHAPE(3));
  return em_batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5);
}
FN(f_linear, em_linear(x[0], x[1], x[2]))

ETEST(composite_grad, normalisation_and_linear) {
  em_manual_seed(22);
  em_tensor *ln[3] = {gc_leaf(-2, 2, EM_SHAPE(2, 5)), gc_leaf(0.5, 1.5, EM_SHAPE(5)), gc_leaf(-1, 1, EM_SHAPE(5))};
  gradcheck("layer_norm", f_layer_norm, NULL, 3, ln);
  em_tensor *ln2 = gc_leaf(-2, 2, EM_SHAPE(4, 3));
  gradcheck("layer_norm over 2 dims, strided", f_layer_norm2, NULL, 1, &ln2);
  em_tensor *rms[2] = {gc_leaf(-2, 2, EM_SHAPE(2, 5)), gc_leaf(0.5, 1.5, EM_SHAPE(5))};
  gradcheck("rms_norm", f_rms_norm, NULL, 2, rms);
  em_tensor *bn[3] = {gc_leaf(-2, 2, EM_SHAPE(4, 3, 2, 2)), gc_leaf(0.5, 1.5, EM_SHAPE(3)), gc_leaf(-1, 1, EM_SHAPE(3))};
  gradcheck("batch_norm training", f_batch_norm, NULL, 3, bn);
  em_tensor *lin[3] = {gc_leaf(-1, 1, EM_SHAPE(2, 3, 4)), gc_leaf(-1, 1, EM_SHAPE(5, 4)), gc_leaf(-1, 1, EM_SHAPE(5))};
  gradcheck("linear", f_linear, NULL, 3, lin);
}

static em_tensor *f_cross_entropy(em_tensor *const *x, void *c) {
  em_cross_entropy_opts o = *(em_cross_entropy_opts *)c;
  return em_cross_entropy(x[0], T(EM_I64, SHAPE(4), 2, 0, 4, 1), o);
}
static em_tensor *f_cross_entropy_probs(em_tensor *const *x, void *c) {
  (void)c;
  return em_cross_entropy(x[0], em_softmax(em_detach(x[1]), 1), EM_CROSS_ENTROPY_DEFAULT);
}
static em_tensor *f_nll(em_tensor *const *x, void *c) {
  (void)c;
  return em_nll_loss(em_log_softmax(x[0], 1), T(EM_I64, SHAPE(4), 2, 0, 4, 1), 0, EM_REDUCE_SUM);
}
static em_tensor *f_embedding(em_tensor *const *x, void *c) {
  (void)c;
  return em_embedding(T(EM_I64, SHAPE(2, 3), 1, 0, 1, 3, 3, 2), x[0]);
}

ETEST(composite_grad, losses_and_embedding) {
  em_manual_seed(23);
  em_tensor *logits = gc_leaf(-2, 2, EM_SHAPE(4, 5));
  em_cross_entropy_opts plain = EM_CROSS_ENTROPY_DEFAULT, smooth = {4, 0.2, EM_REDUCE_MEAN},
                        sum = {-100, 0.1, EM_REDUCE_SUM};
  gradcheck("cross_entropy", f_cross_entropy, &plain, 1, &logits);
  gradcheck("cross_entropy ignore_index + label_smoothing", f_cross_entropy, &smooth, 1, &logits);
  gradcheck("cross_entropy sum", f_cross_entropy, &sum, 1, &logits);
  em_tensor *pr[2] = {logits, gc_leaf(-1, 1, EM_SHAPE(4, 5))};
  gradcheck("cross_entropy probabilities", f_cross_entropy_probs, NULL, 1, pr);
  gradcheck("nll_loss ignore 0", f_nll, NULL, 1, &logits);
  em_tensor *w = gc_leaf(-1, 1, EM_SHAPE(4, 3));
  gradcheck("embedding", f_embedding, NULL, 1, &w);
}

FN(f_max_pool, em_max_pool2d(x[0], 2, 2, 2, 2, 0, 0))
FN(f_max_pool_pad, em_max_pool2d(x[0], 3, 3, 2, 2, 1, 1))
FN(f_avg_pool, em_avg_pool2d(x[0], 2, 3, 1, 2, 1, 0))
static em_tensor *f_sdpa(em_tensor *const *x, void *c) {
  return em_scaled_dot_product_attention(x[0], x[1], x[2], *(bool *)c, 0, 0);
}

ETEST(composite_grad, pooling_and_attention) {
  em_manual_seed(24);
  /* distinct values, so max pooling has no ties within a window */
  em_tensor *x = em_requires_grad_(em_add(em_reshape(em_mul_scalar(em_arange(D, 0, 50, 1), 0.1), EM_SHAPE(1, 2, 5, 5)),
                                           em_mul_scalar(em_rand(D, EM_SHAPE(1, 2, 5, 5)), 0.01)), true);
  x = em_requires_grad_(em_contiguous(em_detach(x)), true);
  gradcheck("max_pool2d", f_max_pool, NULL, 1, &x);
  gradcheck("max_pool2d padded", f_max_pool_pad, NULL, 1, &x);
  gradcheck("avg_pool2d", f_avg_pool, NULL, 1, &x);
  em_tensor *qkv[3] = {gc_leaf(-1, 1, EM_SHAPE(2, 3, 4)), gc_leaf(-1, 1, EM_SHAPE(2, 5, 4)),
                       gc_leaf(-1, 1, EM_SHAPE(2, 5, 2))};
  bool causal = false;
  gradcheck("sdpa", f_sdpa, &causal, 3, qkv);
  em_tensor *self[3] = {gc_leaf(-1, 1, EM_SHAPE(3, 4)), gc_leaf(-1, 1, EM_SHAPE(3, 4)), gc_leaf(-1, 1, EM_SHAPE(3, 4))};
  causal = true;
  gradcheck("sdpa causal", f_sdpa, &causal, 3, self);
}

static em_tensor *f_dropout(em_tensor *const *x, void *c) {
  (void)c;
  em_manual_seed(99); /* the same mask on every evaluation */
  return em_dropout(x[0], 0.3, true);
}

ETEST(composite_grad, dropout_same_mask) {
  em_tensor *x = gc_leaf(-1, 1, EM_SHAPE(4, 4));
  gradcheck("dropout", f_dropout, NULL, 1, &x);
}
