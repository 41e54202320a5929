/* tests/test_nn.c: parameter initialisation, layers, and the SGD and AdamW optimizers.
 *
 * Initialisers are checked statistically (every value inside its bound, the extremes close to
 * it, the mean near zero) on tensors large enough that a wrong bound cannot pass by chance.
 * Optimizer steps are checked against the same updates computed here in plain C doubles from
 * PyTorch's documented formulas (torch.optim.SGD, torch.optim.AdamW), plus a few values worked
 * out by hand, with gradients from a real backward so the optimizer reads what autograd left in
 * .grad. Each step of the training-loop tests runs in its own scope, as a real loop does, so
 * optimizer state must outlive the scopes it was created in. Allocation failures are injected
 * into layer construction and optimizer steps to check that nothing leaks on those paths. */
#include "common.h"

#define F EM_F32
#define D EM_F64

static double max_abs(em_tensor *t) { return em_item(em_amax(em_abs(t), 0, NULL, false)); }
static double min_of(em_tensor *t) { return em_item(em_amin(t, 0, NULL, false)); }
static double max_of(em_tensor *t) { return em_item(em_amax(t, 0, NULL, false)); }
static double mean_of(em_tensor *t) { return em_item(em_mean(t, 0, NULL, false)); }

/* ---- initialisation ---- */

ETEST(init, uniform_fills_in_place) {
  em_manual_seed(1);
  em_tensor *p = em_requires_grad_(em_zeros(F, EM_SHAPE(4000)), true);
  cr_assert_eq(em_init_uniform_(p, 2, 3), p, "returns t itself");
  cr_assert(em_is_grad_enabled(), "grad mode restored");
  cr_assert(em_requires_grad(p) && em_is_leaf(p), "still a leaf requiring grad");
  cr_assert_geq(min_of(p), 2);
  cr_assert_leq(max_of(p), 3);
  cr_assert_lt(min_of(p), 2.01);
  cr_assert_gt(max_of(p), 2.99);
  cr_assert_lt(fabs(mean_of(p) - 2.5), 0.02, "mean %g", mean_of(p));

  /* a non-contiguous view is written through to its base */
  em_tensor *base = em_zeros(D, EM_SHAPE(40, 60));
  cr_assert(em_init_uniform_(em_transpose(base, 0, 1), -1, -0.5));
  cr_assert_geq(min_of(base), -1);
  cr_assert_leq(max_of(base), -0.5);

  /* half precision takes f32 draws, rounded by the copy */
  em_tensor *h = em_zeros(EM_F16, EM_SHAPE(1000));
  cr_assert(em_init_uniform_(h, -4, 4), "%s", em_last_error() ? em_last_error() : "");
  em_tensor *hf = em_cast(h, F);
  cr_assert(min_of(hf) >= -4 && max_of(hf) <= 4 && max_of(hf) > 3.9 && min_of(hf) < -3.9);

  /* the global generator drives it: same seed, same values */
  em_tensor *a = em_empty(F, EM_SHAPE(64)), *b = em_empty(F, EM_SHAPE(64));
  em_manual_seed(42);
  em_init_uniform_(a, -1, 1);
  em_manual_seed(42);
  em_init_uniform_(b, -1, 1);
  EXPECT(em_sum(em_ne(a, b), 0, NULL, false), EM_I64, SCALAR_SHAPE, 0, 0);

  EXPECT_ERROR(em_init_uniform_(em_zeros(EM_I32, EM_SHAPE(3)), 0, 1), "needs a floating tensor");
  EXPECT_ERROR(em_init_uniform_(em_zeros(F, EM_SHAPE(3)), 1, 0), "lo <= hi");
  EXPECT_ERROR(em_init_uniform_(em_zeros(F, EM_SHAPE(3)), 0, NAN), "finite");
  cr_assert_null(em_init_uniform_(NULL, 0, 1));
  cr_assert_null(em_last_error(), "NULL in, NULL out, silently");
}

ETEST(init, kaiming_bounds) {
  em_manual_seed(0);
  /* nn.Linear(784, 512)'s weight: a = sqrt(5) gives gain sqrt(1/3), bound 1/sqrt(fan_in) */
  em_tensor *w = em_requires_grad_(em_empty(F, EM_SHAPE(512, 784)), true);
  cr_assert_eq(em_init_kaiming_uniform_(w, sqrt(5.0)), w);
  double bound = sqrt(6.0 / ((1 + 5.0) * 784));
  cr_assert_float_eq(bound, 1 / sqrt(784.0), 1e-15);
  double mx = max_abs(w);
  cr_assert(mx <= bound && mx > 0.999 * bound, "max |w| %g, bound %g", mx, bound);
  /* 401408 draws: the mean's standard deviation is bound / sqrt(3 n) = 3.3e-5 */
  cr_assert_lt(fabs(mean_of(w)), 2e-4, "mean %g", mean_of(w));
  double sd = em_item(em_std(w, 0, NULL, 1, false));
  cr_assert_lt(fabs(sd / (bound / sqrt(3.0)) - 1), 0.01, "std %g", sd);

  /* a = 0 (ReLU gain sqrt 2) on a 4-D weight: fan_in = 6 * 5 * 5 */
  em_tensor *c = em_zeros(D, EM_SHAPE(16, 6, 5, 5));
  cr_assert(em_init_kaiming_uniform_(c, 0));
  double cb = sqrt(6.0 / 150);
  cr_assert(max_abs(c) <= cb && max_abs(c) > 0.99 * cb, "max %g, bound %g", max_abs(c), cb);

  /* leaky slope a = 1: bound sqrt(3 / fan_in) */
  em_tensor *s = em_zeros(F, EM_SHAPE(200, 3));
  cr_assert(em_init_kaiming_uniform_(s, 1));
  cr_assert(max_abs(s) <= 1 && max_abs(s) > 0.98, "max %g", max_abs(s));

  /* nothing to fill, fan_in 0: no error, no NaN */
  cr_assert(em_init_kaiming_uniform_(em_zeros(F, EM_SHAPE(3, 0)), 0));

  EXPECT_ERROR(em_init_kaiming_uniform_(em_zeros(F, EM_SHAPE(3)), 0), "at least 2 dims");
  EXPECT_ERROR(em_init_kaiming_uniform_(em_zeros(EM_I64, EM_SHAPE(3, 3)), 0), "needs a floating tensor");
}

/* ---- layers ---- */

static void expect_param(em_tensor *t, etest_shape s) {
  cr_assert_not_null(t);
  cr_assert_neq(t, EM_NONE);
  cr_assert_eq(em_dtype_of(t), F);
  cr_assert_eq(em_ndim(t), s.ndim);
  for (int i = 0; i < s.ndim; i++) cr_assert_eq(em_size(t, i), s.sizes[i], "size %d", i);
  cr_assert(em_requires_grad(t) && em_is_leaf(t) && !em_get_grad(t));
}

ETEST(layers, linear) {
  em_manual_seed(3);
  em_linear_layer l;
  cr_assert(em_linear_layer_init(&l, 784, 512, true), "%s", em_last_error() ? em_last_error() : "");
  expect_param(l.weight, SHAPE(512, 784));
  expect_param(l.bias, SHAPE(512));
  double bound = 1 / sqrt(784.0);
  cr_assert(max_abs(l.weight) <= bound && max_abs(l.weight) > 0.999 * bound);
  cr_assert(max_abs(l.bias) <= bound && max_abs(l.bias) > 0.95 * bound, "bias max %g", max_abs(l.bias));
  cr_assert(em_is_grad_enabled());
  em_tensor *y = em_linear(em_ones(F, EM_SHAPE(2, 784)), l.weight, l.bias);
  cr_assert(y && em_size(y, 0) == 2 && em_size(y, 1) == 512 && em_requires_grad(y));

  em_linear_layer nb;
  cr_assert(em_linear_layer_init(&nb, 3, 2, false));
  expect_param(nb.weight, SHAPE(2, 3));
  cr_assert_eq(nb.bias, EM_NONE);

  /* zero input features, as nn.Linear(0, 3): an empty weight, a zero bias */
  em_linear_layer z;
  cr_assert(em_linear_layer_init(&z, 0, 3, true));
  expect_param(z.weight, SHAPE(3, 0));
  EXPECT(z.bias, F, SHAPE(3), 0, 0, 0, 0);

  l.weight = l.bias = EM_NONE;
  EXPECT_ERROR((em_linear_layer_init(&l, -1, 3, true) ? (void *)1 : NULL), "sizes must be >= 0");
  cr_assert(l.weight == NULL && l.bias == NULL, "fields cleared on error");
  EXPECT_ERROR((em_linear_layer_init(NULL, 1, 1, true) ? (void *)1 : NULL), "layer is NULL");
}

ETEST(layers, conv2d) {
  em_manual_seed(4);
  em_conv2d_layer c;
  em_conv2d_params p = EM_CONV2D_DEFAULT;
  p.stride[0] = p.stride[1] = 2;
  cr_assert(em_conv2d_layer_init(&c, 6, 16, 5, 5, p, true), "%s", em_last_error() ? em_last_error() : "");
  expect_param(c.weight, SHAPE(16, 6, 5, 5));
  expect_param(c.bias, SHAPE(16));
  cr_assert_eq(c.params.stride[1], 2);
  double bound = 1 / sqrt(150.0);
  cr_assert(max_abs(c.weight) <= bound && max_abs(c.weight) > 0.99 * bound);
  cr_assert_leq(max_abs(c.bias), bound);
  em_tensor *y = em_conv2d(em_ones(F, EM_SHAPE(1, 6, 13, 13)), c.weight, c.bias, c.params);
  cr_assert(y && em_size(y, 1) == 16 && em_size(y, 2) == 5 && em_size(y, 3) == 5, "%s",
            em_last_error() ? em_last_error() : "");

  /* groups: weight [out, in / groups, kh, kw], fan_in (in / groups) kh kw */
  em_conv2d_layer g;
  em_conv2d_params pg = EM_CONV2D_DEFAULT;
  pg.groups = 2;
  cr_assert(em_conv2d_layer_init(&g, 4, 8, 3, 2, pg, false));
  expect_param(g.weight, SHAPE(8, 2, 3, 2));
  cr_assert_eq(g.bias, EM_NONE);
  cr_assert_leq(max_abs(g.weight), 1 / sqrt(12.0));

  EXPECT_ERROR((em_conv2d_layer_init(&g, 3, 8, 3, 3, pg, true) ? (void *)1 : NULL), "divide both channel counts");
  cr_assert(g.weight == NULL && g.bias == NULL);
  EXPECT_ERROR((em_conv2d_layer_init(&g, 4, 8, 0, 3, EM_CONV2D_DEFAULT, true) ? (void *)1 : NULL), "kernel 0x3");
  em_conv2d_params bad = EM_CONV2D_DEFAULT;
  bad.stride[1] = 0;
  EXPECT_ERROR((em_conv2d_layer_init(&g, 4, 8, 3, 3, bad, true) ? (void *)1 : NULL), "stride (1, 0)");
}

/* Every allocation of a layer's construction failing in turn: the call reports it, leaves the
 * fields NULL and frees whatever it had built. */
ETEST(layers, allocation_failures_leak_nothing) {
  int failures = 0;
  for (int64_t n = 1; n < 200; n++) {
    int64_t tensors = em_debug_live_tensors(), bytes = em_debug_live_bytes();
    cr_assert(em_scope_begin());
    em_conv2d_layer c;
    int64_t start = em_debug_alloc_count();
    em_debug_fail_alloc(n);
    bool ok = em_conv2d_layer_init(&c, 2, 4, 3, 3, EM_CONV2D_DEFAULT, true);
    em_debug_fail_alloc(0);
    bool reached = em_debug_alloc_count() - start >= n;
    if (reached) {
      failures++;
      cr_assert(!ok, "allocation %lld failed but the init succeeded", (long long)n);
      cr_assert(c.weight == NULL && c.bias == NULL);
      cr_assert(em_last_error() && strstr(em_last_error(), "out of memory"), "%s",
                em_last_error() ? em_last_error() : "no error");
      cr_assert_eq(em_debug_live_tensors(), tensors + 0, "allocation %lld: the failed init left tensors alive",
                   (long long)n);
    } else {
      cr_assert(ok, "%s", em_last_error() ? em_last_error() : "");
    }
    em_clear_error();
    em_scope_end();
    cr_assert_eq(em_debug_live_tensors(), tensors);
    cr_assert_eq(em_debug_live_bytes(), bytes);
    if (!reached) break;
  }
  cr_assert_gt(failures, 5);
}

/* ---- optimizers ---- */

/* loss = sum(p * c) has gradient c. */
static void backward_with(em_tensor *p, const double *c) {
  em_tensor *ct = em_cast(em_from_data(c, D, EM_SHAPE(2)), em_dtype_of(p));
  cr_assert(em_backward(em_sum(em_mul(p, ct), 0, NULL, false), NULL), "%s", em_last_error() ? em_last_error() : "");
}

static const double grads[3][2] = {{1, -2}, {0.5, 3}, {-1, 0.1}};

/* Three SGD steps, each in its own scope as a training loop runs them, against the update
 * computed here. Optimizer state is created at the first step, so the number of live tensors
 * must not grow after it. */
static void check_sgd(em_sgd_opts o) {
  em_tensor *p = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_optimizer *opt = em_sgd_new(1, &p, o);
  cr_assert_not_null(opt, "%s", em_last_error() ? em_last_error() : "");
  double w[2] = {1, 2}, buf[2] = {0, 0};
  int64_t live = 0;
  for (int s = 0; s < 3; s++) {
    cr_assert(em_scope_begin());
    em_optimizer_zero_grad(opt);
    backward_with(p, grads[s]);
    cr_assert(em_optimizer_step(opt), "%s", em_last_error() ? em_last_error() : "");
    em_scope_end();
    if (s == 1) live = em_debug_live_tensors();
    if (s == 2) cr_assert_eq(em_debug_live_tensors(), live, "a step leaves tensors behind");
    for (int i = 0; i < 2; i++) {
      double g = grads[s][i] + o.weight_decay * w[i];
      if (o.momentum != 0) {
        buf[i] = s == 0 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      w[i] -= o.lr * g;
    }
    EXPECT(p, D, SHAPE(2), 1e-14, w[0], w[1]);
  }
  cr_assert(em_requires_grad(p) && em_is_leaf(p));
  em_optimizer_free(opt);
}

ETEST(sgd, matches_pytorch_formulas) {
  check_sgd(EM_SGD_DEFAULT(0.1));                          /* plain */
  check_sgd((em_sgd_opts){0.1, 0, 0, 0.05, false});        /* weight decay */
  check_sgd((em_sgd_opts){0.1, 0.9, 0, 0, false});         /* momentum */
  check_sgd((em_sgd_opts){0.1, 0.9, 0.3, 0, false});       /* dampening */
  check_sgd((em_sgd_opts){0.05, 0.8, 0, 0, true});         /* nesterov */
  check_sgd((em_sgd_opts){0.2, 0.7, 0.1, 0.01, false});    /* all but nesterov */
  check_sgd((em_sgd_opts){0.05, 0.8, 0, 0.1, true});       /* nesterov with weight decay */
}

ETEST(sgd, by_hand) {
  /* momentum 0.9, lr 0.1 from w = (1, 2): buf = g = (1, -2), w = (0.9, 2.2) */
  em_tensor *p = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_optimizer *opt = em_sgd_new(1, &p, ((em_sgd_opts){0.1, 0.9, 0, 0, false}));
  backward_with(p, grads[0]);
  cr_assert(em_optimizer_step(opt));
  EXPECT(p, D, SHAPE(2), 1e-15, 0.9, 2.2);
  /* no zero_grad: backward accumulates into .grad in place, to (1.5, 1), which must not move
   * the momentum buffer (a copy of the first gradient): buf = 0.9 (1, -2) + (1.5, 1) =
   * (2.4, -0.8), w = (0.66, 2.28) */
  backward_with(p, grads[1]);
  cr_assert(em_optimizer_step(opt));
  EXPECT(p, D, SHAPE(2), 1e-15, 0.66, 2.28);
  EXPECT(em_get_grad(p), D, SHAPE(2), 0, 1.5, 1);
  /* a new learning rate applies to the next step: g = (1, -2), buf = 0.9 (2.4, -0.8) + g =
   * (3.16, -2.72), w -= 0.5 buf */
  em_optimizer_zero_grad(opt);
  em_optimizer_set_lr(opt, 0.5);
  cr_assert_eq(em_optimizer_get_lr(opt), 0.5);
  backward_with(p, grads[0]);
  cr_assert(em_optimizer_step(opt));
  EXPECT(p, D, SHAPE(2), 1e-14, -0.92, 3.64);
  em_optimizer_free(opt);
}

static void check_adamw(em_adamw_opts o, em_dtype dt, double tol) {
  em_tensor *p = em_requires_grad_(T(dt, SHAPE(2), 1, 2), true);
  em_optimizer *opt = em_adamw_new(1, &p, o);
  cr_assert_not_null(opt, "%s", em_last_error() ? em_last_error() : "");
  double w[2] = {1, 2}, m[2] = {0}, v[2] = {0}, vmax[2] = {0};
  int64_t live = 0;
  for (int s = 0; s < 3; s++) {
    cr_assert(em_scope_begin());
    em_optimizer_zero_grad(opt);
    backward_with(p, grads[s]);
    cr_assert(em_optimizer_step(opt), "%s", em_last_error() ? em_last_error() : "");
    em_scope_end();
    if (s == 1) live = em_debug_live_tensors();
    if (s == 2) cr_assert_eq(em_debug_live_tensors(), live, "a step leaves tensors behind");
    int t = s + 1;
    for (int i = 0; i < 2; i++) {
      double g = grads[s][i];
      w[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      vmax[i] = fmax(vmax[i], v[i]);
      double m_hat = m[i] / (1 - pow(o.beta1, t));
      double v_hat = (o.amsgrad ? vmax[i] : v[i]) / (1 - pow(o.beta2, t));
      w[i] -= o.lr * m_hat / (sqrt(v_hat) + o.eps);
    }
    EXPECT(p, dt, SHAPE(2), tol, w[0], w[1]);
  }
  em_optimizer_free(opt);
}

ETEST(adamw, matches_pytorch_formulas) {
  check_adamw(EM_ADAMW_DEFAULT(0.01), D, 1e-13);
  check_adamw((em_adamw_opts){0.05, 0.9, 0.999, 1e-8, 0, false}, D, 1e-13);
  /* with beta2 0.9 the second coordinate's v falls at step 3 (g = 0.1 after 3), so vmax and v
   * differ there and amsgrad changes the result */
  check_adamw((em_adamw_opts){0.1, 0.8, 0.9, 1e-6, 0.05, true}, D, 1e-13);
  check_adamw((em_adamw_opts){0.1, 0.8, 0.9, 1e-6, 0.05, false}, D, 1e-13);
  check_adamw((em_adamw_opts){0.1, 0.8, 0.9, 1e-6, 0.05, true}, F, 2e-6);
}

ETEST(adamw, by_hand) {
  /* first step: m_hat = g, v_hat = g^2, so the update is lr g / (|g| + eps), about lr sign(g);
   * with weight decay 0.01 and lr 0.1 the parameter first shrinks by 0.1%.  */
  em_tensor *p = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
  em_optimizer *opt = em_adamw_new(1, &p, EM_ADAMW_DEFAULT(0.1));
  backward_with(p, grads[0]);
  cr_assert(em_optimizer_step(opt));
  EXPECT(p, D, SHAPE(2), 1e-14, 0.999 - 0.1 / (1 + 1e-8), 1.998 + 0.2 / (2 + 1e-8));
  em_optimizer_free(opt);

  /* amsgrad with beta1 0, beta2 0.5, lr 1, eps 0, no decay; g = (1, 4) then (1, 0):
   * step 1: v = (0.5, 8), v_hat = v / 0.5 = (1, 16): update (1, 1);
   * step 2: v = (0.75, 4), vmax = (0.75, 8), v_hat = vmax / 0.75 = (1, 32/3), m = (1, 0):
   * update (1, 0) */
  em_tensor *q = em_requires_grad_(T(D, SHAPE(2), 0, 0), true);
  em_optimizer *o2 = em_adamw_new(1, &q, ((em_adamw_opts){1, 0, 0.5, 0, 0, true}));
  backward_with(q, (const double[]){1, 4});
  cr_assert(em_optimizer_step(o2));
  EXPECT(q, D, SHAPE(2), 1e-15, -1, -1);
  em_optimizer_zero_grad(o2);
  backward_with(q, (const double[]){1, 0});
  cr_assert(em_optimizer_step(o2));
  EXPECT(q, D, SHAPE(2), 1e-15, -2, -1);
  em_optimizer_free(o2);
}

ETEST(optim, skips_parameters_without_grad) {
  em_tensor *a = em_requires_grad_(T(F, SHAPE(1), 1), true), *b = em_requires_grad_(T(F, SHAPE(1), 5), true);
  em_tensor *ps[2] = {a, b};
  em_optimizer *sgd = em_sgd_new(2, ps, ((em_sgd_opts){1, 0.5, 0, 0.1, false}));
  cr_assert(em_backward(em_mul_scalar(a, 2), NULL));
  cr_assert(em_optimizer_step(sgd));
  EXPECT(a, F, SHAPE(1), 1e-7, 1 - (2 + 0.1));
  EXPECT(b, F, SHAPE(1), 0, 5); /* no grad: even weight decay leaves it alone */
  em_optimizer_zero_grad(sgd);
  cr_assert(em_get_grad(a) == NULL && em_get_grad(b) == NULL);
  cr_assert(em_optimizer_step(sgd), "a step with no grads at all does nothing");
  EXPECT(a, F, SHAPE(1), 1e-7, -1.1);
  em_optimizer_free(sgd);

  /* AdamW counts steps per parameter: b's first update, one step after a's, is bias-corrected
   * as a first step (about lr in size), as PyTorch's per-parameter state does */
  em_tensor *c = em_requires_grad_(T(D, SHAPE(1), 0), true), *d = em_requires_grad_(T(D, SHAPE(1), 0), true);
  em_tensor *cd[2] = {c, d};
  em_optimizer *adam = em_adamw_new(2, cd, ((em_adamw_opts){0.1, 0.9, 0.999, 0, 0, false}));
  cr_assert(em_backward(em_mul_scalar(c, 3), NULL));
  cr_assert(em_optimizer_step(adam));
  EXPECT(c, D, SHAPE(1), 1e-14, -0.1);
  EXPECT(d, D, SHAPE(1), 0, 0);
  em_optimizer_zero_grad(adam);
  cr_assert(em_backward(em_add(em_mul_scalar(c, 3), em_mul_scalar(d, -7)), NULL));
  cr_assert(em_optimizer_step(adam));
  EXPECT(c, D, SHAPE(1), 1e-14, -0.2);
  EXPECT(d, D, SHAPE(1), 1e-14, 0.1);
  em_optimizer_free(adam);
}

ETEST(optim, validates_options_and_parameters) {
  em_tensor *a = em_requires_grad_(T(F, SHAPE(1), 1), true);
  em_tensor *ps[1] = {a};
  EXPECT_ERROR(em_sgd_new(0, ps, EM_SGD_DEFAULT(1)), "at least one parameter");
  EXPECT_ERROR(em_sgd_new(1, NULL, EM_SGD_DEFAULT(1)), "at least one parameter");
  EXPECT_ERROR(em_sgd_new(1, (em_tensor *[]){em_zeros(F, EM_SHAPE(1))}, EM_SGD_DEFAULT(1)),
               "parameter 0 (f32[1]) is not a floating leaf that requires grad");
  EXPECT_ERROR(em_adamw_new(2, ((em_tensor *[]){a, em_mul_scalar(a, 2)}), EM_ADAMW_DEFAULT(1)),
               "parameter 1");
  EXPECT_ERROR(em_sgd_new(1, ps, EM_SGD_DEFAULT(-0.1)), "lr, momentum and weight_decay must be >= 0");
  EXPECT_ERROR(em_sgd_new(1, ps, EM_SGD_DEFAULT(NAN)), ">= 0");
  EXPECT_ERROR(em_sgd_new(1, ps, ((em_sgd_opts){0.1, -0.9, 0, 0, false})), ">= 0");
  EXPECT_ERROR(em_sgd_new(1, ps, ((em_sgd_opts){0.1, 0, 0, -1, false})), ">= 0");
  EXPECT_ERROR(em_sgd_new(1, ps, ((em_sgd_opts){0.1, 0, 0, 0, true})), "nesterov momentum requires");
  EXPECT_ERROR(em_sgd_new(1, ps, ((em_sgd_opts){0.1, 0.9, 0.1, 0, true})), "zero dampening");
  EXPECT_ERROR(em_adamw_new(1, ps, ((em_adamw_opts){0.1, 1.0, 0.9, 1e-8, 0, false})), "betas must be in [0, 1)");
  EXPECT_ERROR(em_adamw_new(1, ps, ((em_adamw_opts){0.1, 0.9, -0.1, 1e-8, 0, false})), "betas");
  EXPECT_ERROR(em_adamw_new(1, ps, ((em_adamw_opts){-1, 0.9, 0.999, 1e-8, 0, false})), ">= 0");
  EXPECT_ERROR(em_adamw_new(1, ps, ((em_adamw_opts){0.1, 0.9, 0.999, -1e-8, 0, false})), "eps");
  EXPECT_ERROR(em_adamw_new(1, ps, ((em_adamw_opts){0.1, 0.9, 0.999, 1e-8, -0.01, false})), "weight_decay");
  /* a NULL parameter is the trace of an earlier failure, already reported */
  cr_assert_null(em_sgd_new(1, (em_tensor *[]){NULL}, EM_SGD_DEFAULT(1)));
  cr_assert_null(em_last_error());

  cr_assert(!em_optimizer_step(NULL));
  cr_assert(em_last_error() && strstr(em_last_error(), "optimizer is NULL"));
  em_clear_error();
  em_optimizer_zero_grad(NULL);
  em_optimizer_set_lr(NULL, 1);
  cr_assert(isnan(em_optimizer_get_lr(NULL)));
  em_optimizer_free(NULL);
  /* the optimizer's references keep a parameter alive past the scope that made it */
  cr_assert(em_scope_begin());
  em_tensor *inner = em_requires_grad_(T(D, SHAPE(1), 4), true);
  em_optimizer *opt = em_sgd_new(1, &inner, EM_SGD_DEFAULT(1));
  em_scope_end();
  cr_assert_eq(em_optimizer_get_lr(opt), 1);
  cr_assert(em_optimizer_step(opt), "no grad: nothing to do, nothing touched");
  em_optimizer_free(opt);
}

/* Every allocation of an optimizer's construction and first steps failing in turn: reported as
 * out of memory, and freeing the optimizer afterwards leaves nothing behind. */
static void inject_into_steps(bool adamw) {
  int failures = 0;
  for (int64_t n = 1; n < 400; n++) {
    int64_t tensors = em_debug_live_tensors(), bytes = em_debug_live_bytes();
    cr_assert(em_scope_begin());
    em_tensor *p = em_requires_grad_(T(D, SHAPE(2), 1, 2), true);
    backward_with(p, grads[0]);
    int64_t start = em_debug_alloc_count();
    em_debug_fail_alloc(n);
    em_optimizer *o = adamw ? em_adamw_new(1, &p, ((em_adamw_opts){0.1, 0.9, 0.99, 1e-8, 0.01, true}))
                            : em_sgd_new(1, &p, ((em_sgd_opts){0.1, 0.9, 0, 0.01, true}));
    bool ok = o && em_optimizer_step(o) && em_optimizer_step(o);
    em_debug_fail_alloc(0);
    bool reached = em_debug_alloc_count() - start >= n;
    if (reached) {
      failures++;
      cr_assert(!ok, "allocation %lld failed but every step succeeded", (long long)n);
      cr_assert(em_last_error() && strstr(em_last_error(), "out of memory"), "%s",
                em_last_error() ? em_last_error() : "no error");
    } else {
      cr_assert(ok, "%s", em_last_error() ? em_last_error() : "");
    }
    em_clear_error();
    em_optimizer_free(o);
    em_scope_end();
    cr_assert_eq(em_debug_live_tensors(), tensors, "allocation %lld failing leaked tensors", (long long)n);
    cr_assert_eq(em_debug_live_bytes(), bytes);
    if (!reached) break;
  }
  cr_assert_gt(failures, 10);
}

ETEST(optim, allocation_failures_leak_nothing) {
  inject_into_steps(false);
  inject_into_steps(true);
}
