/* tests/composites.h: every composite op applied to (x [5,6] f32, w [6] f32, t [5] i64 in [0,6)),
 * chosen by `composite`, as a model function, for the compile and AOT suites. */
#ifndef EMBER_TEST_COMPOSITES_H
#define EMBER_TEST_COMPOSITES_H

#include <ember.h>

static int composite;
#define N_COMPOSITES 22

static em_outputs apply_composite(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0], *w = in[1], *t = in[2];
  em_tensor *r = NULL;
  switch (composite) {
  case 0: r = em_relu(x); break;
  case 1: r = em_leaky_relu(x, 0.1); break;
  case 2: r = em_gelu(x, false); break;
  case 3: r = em_gelu(x, true); break;
  case 4: r = em_silu(x); break;
  case 5: r = em_sigmoid(x); break;
  case 6: r = em_softplus(x, 1.0, 20.0); break;
  case 7: r = em_softmax(x, -1); break;
  case 8: r = em_log_softmax(x, 0); break;
  case 9: r = em_logsumexp(x, EM_AXES(1), false); break;
  case 10: r = em_var(x, EM_AXES(0), 1, true); break;
  case 11: r = em_std(x, EM_AXES(1), 0, false); break;
  case 12: r = em_layer_norm(x, 1, w, EM_NONE, 1e-5); break;
  case 13: r = em_rms_norm(x, 1, w, 1e-6); break;
  case 14: r = em_linear(x, em_reshape(em_cat(2, ((em_tensor *[]){w, w}), 0), EM_SHAPE(2, 6)), EM_NONE); break;
  case 15: r = em_cross_entropy(x, t, EM_CROSS_ENTROPY_DEFAULT); break;
  case 16: r = em_mse_loss(x, em_flip(x, EM_AXES(0)), EM_REDUCE_MEAN); break;
  case 17: r = em_clamp(x, -0.5, 0.5); break;
  case 18: r = em_masked_fill(x, em_gt_scalar(x, 0), -1.0); break;
  case 19: r = em_one_hot(t, 6); break;
  case 20: r = em_scaled_dot_product_attention(em_unsqueeze(x, 0), em_unsqueeze(x, 0), em_unsqueeze(x, 0), true, 0, 0); break;
  case 21: r = em_mean(x, EM_AXES(0, 1), false); break;
  }
  return EM_OUTPUTS(r);
}

#endif
