/* tests/test_nn.c: initialisation bounds, layers, and SGD / AdamW steps against values computed
 * here from PyTorch's documented update formulas, with gradients from a real backward. */
#include "common.h"

#define F EM_F32
#define D EM_F64

ETEST(init, kaiming_bounds_and_layers) {
  em_manual_seed(0);
  em_linear_layer l;
  cr_assert(em_linear_layer_init(&l, 784, 512, true));
  cr_assert(em_requires_grad(l.weight) && em_requires_grad(l.bias) && em_is_leaf(l.weight));
  cr_assert_eq(em_size(l.weight, 0), 512);
  cr_assert_eq(em_size(l.weight, 1), 784);
  double bound = 1 / sqrt(784.0); /* a = sqrt(5): sqrt(6 / (6 * fan_in)) */
  double mx = em_item(em_amax(em_abs(l.weight), 0, NULL, false));
  cr_assert(mx <= bound && mx > 0.99 * bound, "max |w| %g, bound %g", mx, bound);
  cr_assert(fabs(em_item(em_mean(l.weight, 0, NULL, false))) < 1e-3);
  cr_assert_leq(em_item(em_amax(em_abs(l.bias), 0, NULL, false)), bound);
  em_linear_layer nb;
  cr_assert(em_linear_layer_init(&nb, 3, 2, false));
  cr_assert_eq(nb.bias, EM_NONE);
  em_conv2d_layer c;
  cr_assert(em_conv2d_layer_init(&c, 6, 16, 5, 5, EM_CONV2D_DEFAULT, true));
  cr_assert_eq(em_size(c.weight, 1), 6);
  cr_assert_leq(em_item(em_amax(em_abs(c.weight), 0, NULL, false)), 1 / sqrt(150.0));
  em_tensor *w = em_zeros(F, EM_SHAPE(4, 5));
  em_init_kaiming_uniform_(w, 0);
  cr_assert_leq(em_item(em_amax(em_abs(w), 0, NULL, false)), sqrt(6.0 / 5));
  EXPECT_ERROR(em_init_kaiming_uniform_(em_zeros(F, EM_SHAPE(3)), 0), "at least 2 dims");
  cr_assert(!em_linear_layer_init(&l, 0, 3, true));
  em_clear_error();
}

/* loss = sum(p * c) gives grad c; with c = (1, -2) the steps below are checked by hand. */
static void backward_with(em_tensor *p, double c0, double c1) {
  em_tensor *c = T(D, SHAPE(2), c0, c1);
  cr_assert(em_backward(em_sum(em_mul(p, c), 0, NULL, false), NULL));
}

static void run_sgd(em_sgd_opts o, const double *expect0, const double *expect1) {
  em_tensor *p = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_optimizer *opt = em_sgd_new(1, &p, o);
  cr_assert_not_null(opt, "%s", em_last_error() ? em_last_error() : "");
  double w[2] = {1, 2}, buf[2] = {0, 0}, g0[3][2] = {{1, -2}, {0.5, 3}, {-1, 1}};
  for (int s = 0; s < 3; s++) {
    em_optimizer_zero_grad(opt);
    backward_with(p, g0[s][0], g0[s][1]);
    cr_assert(em_optimizer_step(opt));
    for (int i = 0; i < 2; i++) {
      double g = g0[s][i] + o.weight_decay * w[i];
      if (o.momentum != 0) {
        buf[i] = s == 0 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      w[i] -= o.lr * g;
    }
  }
  EXPECT(p, D, SHAPE(2), 1e-12, w[0], w[1]);
  (void)expect0, (void)expect1;
  em_optimizer_free(opt);
}

ETEST(sgd, matches_pytorch_formulas) {
  run_sgd((em_sgd_opts){0.1, 0, 0, 0, false}, NULL, NULL);
  run_sgd((em_sgd_opts){0.1, 0.9, 0, 0, false}, NULL, NULL);
  run_sgd((em_sgd_opts){0.1, 0.9, 0.3, 0.01, false}, NULL, NULL);
  run_sgd((em_sgd_opts){0.05, 0.8, 0, 0.1, true}, NULL, NULL);
  /* one plain step by hand: w = (1, 2) - 0.1 * (1, -2) */
  em_tensor *p = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_optimizer *opt = em_sgd_new(1, &p, EM_SGD_DEFAULT(0.1));
  backward_with(p, 1, -2);
  cr_assert(em_optimizer_step(opt));
  EXPECT(p, D, SHAPE(2), 1e-15, 0.9, 2.2);
  em_optimizer_free(opt);
}

static void run_adamw(em_adamw_opts o) {
  em_tensor *p = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_optimizer *opt = em_adamw_new(1, &p, o);
  cr_assert_not_null(opt);
  double w[2] = {1, 2}, m[2] = {0}, v[2] = {0}, vmax[2] = {0}, g0[3][2] = {{1, -2}, {0.5, 3}, {-1, 0.1}};
  for (int s = 0; s < 3; s++) {
    em_optimizer_zero_grad(opt);
    backward_with(p, g0[s][0], g0[s][1]);
    cr_assert(em_optimizer_step(opt));
    int t = s + 1;
    for (int i = 0; i < 2; i++) {
      double g = g0[s][i];
      w[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      double vv = v[i];
      if (o.amsgrad) vv = vmax[i] = fmax(vmax[i], v[i]);
      double mhat = m[i] / (1 - pow(o.beta1, t)), denom = sqrt(vv) / sqrt(1 - pow(o.beta2, t)) + o.eps;
      w[i] -= o.lr * mhat / denom;
    }
  }
  EXPECT(p, D, SHAPE(2), 1e-12, w[0], w[1]);
  em_optimizer_free(opt);
}

ETEST(adamw, matches_pytorch_formulas) {
  run_adamw(EM_ADAMW_DEFAULT(0.01));
  run_adamw((em_adamw_opts){0.1, 0.8, 0.9, 1e-6, 0.05, true});
  run_adamw((em_adamw_opts){0.05, 0.9, 0.999, 1e-8, 0, false});
}

ETEST(optim, skips_missing_grads_and_validates) {
  em_tensor *a = em_requires_grad_(T(F, SHAPE(1), 1), true), *b = em_requires_grad_(T(F, SHAPE(1), 5), true);
  em_tensor *ps[2] = {a, b};
  em_optimizer *opt = em_sgd_new(2, ps, EM_SGD_DEFAULT(1));
  cr_assert(em_backward(em_mul_scalar(a, 2), NULL));
  cr_assert(em_optimizer_step(opt));
  EXPECT(a, F, SHAPE(1), 0, -1);
  EXPECT(b, F, SHAPE(1), 0, 5);
  em_optimizer_zero_grad(opt);
  cr_assert_null(em_get_grad(a));
  em_optimizer_set_lr(opt, 0.5);
  cr_assert_eq(em_optimizer_get_lr(opt), 0.5);
  em_optimizer_free(opt);
  EXPECT_ERROR(em_sgd_new(1, (em_tensor *[]){em_zeros(F, EM_SHAPE(1))}, EM_SGD_DEFAULT(1)), "not a floating leaf that requires grad");
  EXPECT_ERROR(em_sgd_new(1, ps, ((em_sgd_opts){0.1, 0, 0, 0, true})), "nesterov");
  EXPECT_ERROR(em_adamw_new(1, ps, ((em_adamw_opts){0.1, 1.0, 0.9, 1e-8, 0, false})), "betas");
  em_optimizer_free(NULL);
}
