/* tests/test_eager_fusion.c: eager composites run as compiled kernels of their own
 * decomposition (frontend/eager_fusion.c, issue 23).
 *
 * Every fused composite is checked against its op-by-op run (fusion off) for values and
 * gradients. Tolerances: 1e-5 relative (plus 1e-6 absolute) in f32 and 1e-11 in f64, the
 * inductor's rounding (SLEEF's exp / erf within 1 ULP, tanh within 3.5 ULP, sums in another
 * order); results are not bit for bit. The counters of em_eager_fusion_info prove the kernel ran
 * (a test whose comparison passed because nothing was fused fails). */
#include "common.h"

#include <pthread.h>
#include <sys/wait.h>

/* Small inputs fuse in these tests (the threshold is about speed, not correctness), so the
 * suite stays fast; each Criterion test runs in its own process, so the counters start at 0. */
static void fusion_on(void) { em_eager_fusion_config(1, 1); }
static void fusion_off(void) { em_eager_fusion_config(0, 1); }

static em_tensor *randn(em_dtype dt, int64_t r, int64_t c) { return em_randn(dt, 2, (int64_t[]){r, c}); }

/* Asserts a and b have one shape and agree within tol relative (plus tol / 10 absolute). */
static void expect_close(em_tensor *a, em_tensor *b, double tol, const char *what) {
  cr_assert_not_null(a, "%s: fused result NULL: %s", what, em_last_error() ? em_last_error() : "");
  cr_assert_not_null(b, "%s: op-by-op result NULL: %s", what, em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_ndim(a), em_ndim(b), "%s: ranks differ", what);
  for (int i = 0; i < em_ndim(a); i++) cr_assert_eq(em_size(a, i), em_size(b, i), "%s: dim %d differs", what, i);
  cr_assert_eq(em_dtype_of(a), em_dtype_of(b), "%s: dtypes differ", what);
  int64_t n = em_numel(a);
  double *x = malloc(sizeof(double) * (size_t)(n ? n : 1)), *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
  cr_assert(em_to_buffer(a, EM_F64, x, sizeof(double) * (size_t)n));
  cr_assert(em_to_buffer(b, EM_F64, y, sizeof(double) * (size_t)n));
  for (int64_t i = 0; i < n; i++)
    cr_assert(fabs(x[i] - y[i]) <= tol * fabs(y[i]) + tol / 10, "%s: element %lld: fused %.17g, op by op %.17g", what,
              (long long)i, x[i], y[i]);
  free(x), free(y);
}

typedef em_tensor *(*composite_fn)(em_tensor *const *in);

static em_tensor *softmax_fn(em_tensor *const *in) { return em_softmax(in[0], -1); }
static em_tensor *softmax0_fn(em_tensor *const *in) { return em_softmax(in[0], 0); }
static em_tensor *log_softmax_fn(em_tensor *const *in) { return em_log_softmax(in[0], 1); }
static em_tensor *layer_norm_fn(em_tensor *const *in) { return em_layer_norm(in[0], 1, in[1], in[2], 1e-5); }
static em_tensor *layer_norm_plain_fn(em_tensor *const *in) { return em_layer_norm(in[0], 1, EM_NONE, EM_NONE, 1e-5); }
static em_tensor *rms_norm_fn(em_tensor *const *in) { return em_rms_norm(in[0], 1, in[1], 1e-6); }
static em_tensor *gelu_fn(em_tensor *const *in) { return em_gelu(in[0], false); }
static em_tensor *gelu_tanh_fn(em_tensor *const *in) { return em_gelu(in[0], true); }
static em_tensor *silu_fn(em_tensor *const *in) { return em_silu(in[0]); }
/* mse_loss's target: 0.5 x + weight, a contiguous [r, c] through which gradients flow into both */
static em_tensor *mse_target(em_tensor *const *in) { return em_add(em_mul_scalar(in[0], 0.5), in[1]); }
static em_tensor *mse_fn(em_tensor *const *in) { return em_mse_loss(in[0], mse_target(in), EM_REDUCE_MEAN); }
static em_tensor *mse_none_fn(em_tensor *const *in) { return em_mse_loss(in[0], mse_target(in), EM_REDUCE_NONE); }
static em_tensor *relu_fn(em_tensor *const *in) { return em_relu(in[0]); }
static em_tensor *sigmoid_fn(em_tensor *const *in) { return em_sigmoid(in[0]); }
static em_tensor *cross_entropy_fn(em_tensor *const *in) {
  return em_cross_entropy(in[0], in[3], EM_CROSS_ENTROPY_DEFAULT);
}
static em_tensor *cross_entropy_ex_fn(em_tensor *const *in) {
  em_cross_entropy_opts o = {.ignore_index = 2, .label_smoothing = 0.1, .reduction = EM_REDUCE_SUM, .weight = in[4]};
  return em_cross_entropy(in[0], in[3], o);
}
/* Pooling of a 4-D x (issue 23): the window scans the decomposition makes (a slice and a select
 * or add per tap) become one kernel. */
static em_tensor *max_pool_fn(em_tensor *const *in) { return em_max_pool2d(in[0], 2, 2, 0, 0, 0, 0); }
static em_tensor *max_pool_stem_fn(em_tensor *const *in) { return em_max_pool2d(in[0], 3, 3, 2, 2, 1, 1); }
static em_tensor *max_pool_dilated_fn(em_tensor *const *in) {
  em_pool2d_opts o = EM_POOL2D_DEFAULT(3, 2);
  o.stride[0] = 2, o.dilation[0] = 2, o.padding[1] = 1, o.ceil_mode = true;
  return em_max_pool2d_ex(in[0], o);
}
static em_tensor *avg_pool_fn(em_tensor *const *in) { return em_avg_pool2d(in[0], 2, 2, 0, 0, 0, 0); }
static em_tensor *avg_pool_exclude_fn(em_tensor *const *in) {
  em_pool2d_opts o = EM_POOL2D_DEFAULT(3, 3);
  o.stride[0] = o.stride[1] = 1, o.padding[0] = o.padding[1] = 1, o.count_include_pad = false;
  return em_avg_pool2d_ex(in[0], o);
}
static em_tensor *avg_pool_divisor_fn(em_tensor *const *in) {
  em_pool2d_opts o = EM_POOL2D_DEFAULT(3, 3);
  o.stride[0] = o.stride[1] = 2, o.padding[1] = 1, o.ceil_mode = true, o.divisor_override = 5;
  return em_avg_pool2d_ex(in[0], o);
}
/* batch_norm: training updates running_mean in[5] and running_var in[6] in place (the values are
 * compared by running_stats_match below); eval normalises by them */
static em_tensor *bn_train_fn(em_tensor *const *in) {
  return em_batch_norm(in[0], in[5], in[6], in[1], in[2], true, 0.1, 1e-5);
}
static em_tensor *bn_train_plain_fn(em_tensor *const *in) {
  return em_batch_norm(in[0], EM_NONE, EM_NONE, EM_NONE, EM_NONE, true, 0.1, 1e-5);
}
static em_tensor *bn_eval_fn(em_tensor *const *in) {
  return em_batch_norm(in[0], in[5], in[6], in[1], in[2], false, 0.1, 1e-5);
}

/* Inputs for a [r, c] case (or [r, c, h, h] when h > 0): x, weight [c], bias [c], class targets
 * [r] in [0, c), class weights [c], running_mean [c], running_var [c] (in [0.5, 1.5)). */
enum { N_INPUTS = 7 };
static void make_inputs4(em_dtype dt, int64_t r, int64_t c, int64_t h, bool grad, em_tensor **in) {
  in[0] = h ? em_randn(dt, 4, (int64_t[]){r, c, h, h}) : randn(dt, r, c);
  in[1] = em_add_scalar(em_randn(dt, 1, (int64_t[]){c}), 1);
  in[2] = em_randn(dt, 1, (int64_t[]){c});
  in[3] = em_randint(0, c, 1, (int64_t[]){r});
  in[4] = em_rand(dt, 1, (int64_t[]){c});
  in[5] = em_randn(dt, 1, (int64_t[]){c});
  in[6] = em_add_scalar(em_rand(dt, 1, (int64_t[]){c}), 0.5);
  for (int i = 0; grad && i < 3; i++) em_requires_grad_(in[i], true);
}

static void make_inputs(em_dtype dt, int64_t r, int64_t c, bool grad, em_tensor **in) {
  make_inputs4(dt, r, c, 0, grad, in);
}

/* Runs f fused (enough calls that the kernel runs at this size) and op by op, and compares the
 * values and, with grad, the gradients of sum(f * g) for a random g with respect to x, weight,
 * bias. */
static void check(composite_fn f, const char *what, em_dtype dt, int64_t r, int64_t c, int64_t h, bool grad) {
  double tol = dt == EM_F64 ? 1e-11 : 1e-5;
  em_tensor *in[N_INPUTS];
  make_inputs4(dt, r, c, h, grad, in);
  fusion_off();
  em_tensor *ref = f(in), *ref_g[3] = {0};
  em_tensor *g = em_randn(dt, em_ndim(ref), em_sizes(ref));
  if (grad)
    cr_assert(em_grad(1, (em_tensor *[]){ref}, (em_tensor *[]){g}, 3, in, ref_g, false, false), "%s", em_last_error());
  fusion_on();
  em_eager_fusion_stats s0 = em_eager_fusion_info();
  for (int call = 0; call < 6; call++) {
    em_tensor *y = f(in);
    em_eager_fusion_wait(); /* a background compile the call started: later calls use it */
    char w[96];
    snprintf(w, sizeof w, "%s %s [%lld, %lld, h %lld] call %d", what, em_dtype_name(dt), (long long)r, (long long)c,
             (long long)h, call);
    expect_close(y, ref, tol, w);
    if (grad) {
      em_tensor *gr[3];
      cr_assert(em_grad(1, (em_tensor *[]){y}, (em_tensor *[]){g}, 3, in, gr, false, false), "%s", em_last_error());
      for (int i = 0; i < 3; i++) {
        char wg[128];
        snprintf(wg, sizeof wg, "%s: gradient of input %d", w, i);
        expect_close(gr[i], ref_g[i], tol, wg);
      }
    }
  }
  em_eager_fusion_stats s1 = em_eager_fusion_info();
  cr_assert_gt(s1.fused_calls, s0.fused_calls, "%s: no call was fused", what);
  cr_assert_gt(s1.kernel_runs, s0.kernel_runs, "%s: no generated kernel ran", what);
  cr_assert_eq(s1.fallbacks, 0, "%s: a fused call fell back to op by op", what);
}

/* The cases: each composite fused, against op by op, values alone and with gradients, f32 and f64. */
typedef struct fused_case {
  const char *group, *what;
  composite_fn f;
  em_dtype dt;
  int64_t r, c;
  bool grad;
  int64_t h; /* > 0: x is [r, c, h, h] */
} fused_case;
static const fused_case cases[] = {
    {"softmax", "softmax", softmax_fn, EM_F32, 16, 40, false},
    {"softmax", "softmax axis 0", softmax0_fn, EM_F32, 24, 12, false},
    {"softmax", "log_softmax", log_softmax_fn, EM_F32, 16, 40, false},
    {"softmax", "softmax", softmax_fn, EM_F32, 16, 40, true},
    {"softmax", "log_softmax", log_softmax_fn, EM_F32, 16, 40, true},
    {"softmax", "softmax", softmax_fn, EM_F64, 8, 20, true},
    {"norm", "layer_norm", layer_norm_fn, EM_F32, 16, 64, false},
    {"norm", "layer_norm", layer_norm_fn, EM_F32, 16, 64, true},
    {"norm", "layer_norm without affine", layer_norm_plain_fn, EM_F32, 16, 64, true},
    {"norm", "layer_norm", layer_norm_fn, EM_F64, 8, 32, true},
    {"norm", "rms_norm", rms_norm_fn, EM_F32, 16, 64, true},
    {"pointwise", "gelu", gelu_fn, EM_F32, 16, 64, true},
    {"pointwise", "gelu tanh", gelu_tanh_fn, EM_F32, 16, 64, true},
    {"pointwise", "silu", silu_fn, EM_F32, 16, 64, true},
    {"pointwise", "gelu", gelu_fn, EM_F64, 8, 32, true},
    {"pointwise", "relu", relu_fn, EM_F32, 16, 64, true},
    {"pointwise", "sigmoid", sigmoid_fn, EM_F32, 16, 64, true},
    {"pointwise", "sigmoid", sigmoid_fn, EM_F64, 8, 32, true},
    {"loss", "cross_entropy", cross_entropy_fn, EM_F32, 32, 10, false},
    {"loss", "cross_entropy", cross_entropy_fn, EM_F32, 32, 10, true},
    {"loss", "cross_entropy weighted, smoothed, ignore_index", cross_entropy_ex_fn, EM_F32, 32, 10, true},
    {"loss", "cross_entropy", cross_entropy_fn, EM_F64, 16, 6, true},
    {"loss", "mse_loss", mse_fn, EM_F32, 16, 64, true},
    {"loss", "mse_loss reduction none", mse_none_fn, EM_F32, 16, 64, true},
    {"loss", "mse_loss", mse_fn, EM_F64, 8, 32, true},
    {"pool", "max_pool2d 2x2", max_pool_fn, EM_F32, 2, 3, false, 16},
    {"pool", "max_pool2d 2x2", max_pool_fn, EM_F32, 2, 3, true, 16},
    {"pool", "max_pool2d 3x3 stride 2 pad 1", max_pool_stem_fn, EM_F32, 2, 4, true, 15},
    {"pool", "max_pool2d dilated, ceil_mode", max_pool_dilated_fn, EM_F32, 2, 3, true, 14},
    {"pool", "max_pool2d 3x3 stride 2 pad 1", max_pool_stem_fn, EM_F64, 2, 3, true, 11},
    {"pool", "avg_pool2d 2x2", avg_pool_fn, EM_F32, 2, 3, true, 16},
    {"pool", "avg_pool2d 3x3 pad 1, count_include_pad off", avg_pool_exclude_fn, EM_F32, 2, 3, true, 13},
    {"pool", "avg_pool2d ceil_mode, divisor_override", avg_pool_divisor_fn, EM_F32, 2, 3, true, 13},
    {"pool", "avg_pool2d 3x3 pad 1, count_include_pad off", avg_pool_exclude_fn, EM_F64, 2, 3, true, 9},
    {"batch_norm", "batch_norm training [N, C, H, W]", bn_train_fn, EM_F32, 4, 3, true, 8},
    {"batch_norm", "batch_norm training [N, C]", bn_train_fn, EM_F32, 32, 16, true, 0},
    {"batch_norm", "batch_norm training, no running stats or affine", bn_train_plain_fn, EM_F32, 4, 3, true, 8},
    {"batch_norm", "batch_norm eval", bn_eval_fn, EM_F32, 4, 3, true, 8},
    {"batch_norm", "batch_norm eval, no grad", bn_eval_fn, EM_F32, 4, 3, false, 8},
    {"batch_norm", "batch_norm training", bn_train_fn, EM_F64, 4, 3, true, 6},
    {"batch_norm", "batch_norm eval", bn_eval_fn, EM_F64, 4, 3, true, 6},
};

static void check_group(const char *group) {
  int n = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    if (!strcmp(cases[i].group, group)) {
      check(cases[i].f, cases[i].what, cases[i].dt, cases[i].r, cases[i].c, cases[i].h, cases[i].grad);
      n++;
    }
  cr_assert_gt(n, 0, "no case in group %s", group);
}

ETEST(eager_fusion, softmax) { check_group("softmax"); }
ETEST(eager_fusion, norm) { check_group("norm"); }
ETEST(eager_fusion, pointwise) { check_group("pointwise"); }
ETEST(eager_fusion, loss) { check_group("loss"); }
ETEST(eager_fusion, pool) { check_group("pool"); }
ETEST(eager_fusion, batch_norm) { check_group("batch_norm"); }

/* Training batch_norm fused writes running_mean and running_var in place as op by op does: the
 * same tensors, updated once per call from the batch statistics (momentum 0.1, unbiased running
 * variance), at sizes the first compile did not see as well (the unbiased factor n / (n - 1)
 * is a number the sizes flow into). Within the suite's tolerance: the batch statistics are
 * sums in another order. */
static void bn_stats_round(double momentum) {
  const int64_t shapes[][4] = {{4, 3, 8, 8}, {6, 3, 10, 10}, {5, 3, 7, 9}, {32, 16, 0, 0}, {48, 16, 0, 0}};
  for (int d = 0; d < 2; d++) {
    em_dtype dt = d ? EM_F64 : EM_F32;
    double tol = d ? 1e-11 : 1e-5;
    em_tensor *rm[2], *rv[2], *w = em_rand(dt, 1, (int64_t[]){3}), *b = em_randn(dt, 1, (int64_t[]){3});
    em_tensor *w16 = em_rand(dt, 1, (int64_t[]){16}), *b16 = em_randn(dt, 1, (int64_t[]){16});
    em_eager_fusion_stats s0 = em_eager_fusion_info();
    for (int k = 0; k < 5; k++) {
      int64_t c = shapes[k][1];
      int nd = shapes[k][2] ? 4 : 2;
      for (int on = 0; on < 2; on++) {
        rm[on] = em_randn(dt, 1, (int64_t[]){c});
        rv[on] = em_add_scalar(em_rand(dt, 1, (int64_t[]){c}), 0.5);
      }
      cr_assert(em_copy_(rm[1], rm[0]) && em_copy_(rv[1], rv[0]));
      for (int call = 0; call < 6; call++) {
        em_tensor *x = em_requires_grad_(em_randn(dt, nd, shapes[k]), true), *y[2];
        for (int on = 0; on < 2; on++) {
          em_eager_fusion_config(on, 1);
          y[on] = em_batch_norm(x, rm[on], rv[on], c == 3 ? w : w16, c == 3 ? b : b16, true, momentum, 1e-5);
          em_eager_fusion_wait();
        }
        char what[128];
        snprintf(what, sizeof what, "batch_norm %s shape %d call %d", em_dtype_name(dt), k, call);
        expect_close(y[1], y[0], tol, what);
        char wm[160];
        snprintf(wm, sizeof wm, "%s: running_mean", what);
        expect_close(rm[1], rm[0], tol, wm);
        snprintf(wm, sizeof wm, "%s: running_var", what);
        expect_close(rv[1], rv[0], tol, wm);
      }
    }
    em_eager_fusion_stats s1 = em_eager_fusion_info();
    cr_assert_gt(s1.fused_calls, s0.fused_calls + 5, "%s: batch_norm was not fused", em_dtype_name(dt));
    cr_assert_eq(s1.fallbacks, 0);
  }
}

ETEST(eager_fusion, batch_norm_running_stats) {
  /* by default a background compile runs on statistics of its own: the user's are written once
   * per call still; then compiled on the calling thread (a new signature: another momentum) */
  bn_stats_round(0.1);
  setenv("EMBER_EAGER_FUSION_ASYNC", "0", 1);
  bn_stats_round(0.2);
  unsetenv("EMBER_EAGER_FUSION_ASYNC");
}

/* Running statistics that alias another input, or that require grad, stay op by op (the
 * compiled function's write-back after its run is not the op-by-op sequence of writes then). */
ETEST(eager_fusion, batch_norm_aliased_stats_op_by_op) {
  fusion_on();
  em_tensor *x = em_randn(EM_F32, 4, (int64_t[]){4, 3, 8, 8}), *s = em_ones(EM_F32, 1, (int64_t[]){3});
  em_tensor *g = em_requires_grad_(em_ones(EM_F32, 1, (int64_t[]){3}), true), *v = em_ones(EM_F32, 1, (int64_t[]){3});
  for (int i = 0; i < 6; i++) {
    cr_assert_not_null(em_batch_norm(x, s, s, EM_NONE, EM_NONE, true, 0.1, 1e-5), "%s", em_last_error());
    cr_assert_not_null(em_batch_norm(x, g, v, EM_NONE, EM_NONE, true, 0.1, 1e-5), "%s", em_last_error());
  }
  em_eager_fusion_stats st = em_eager_fusion_info();
  cr_assert_eq(st.functions + st.fused_calls, 0);
}

/* Dropout fused draws the op-by-op mask bit for bit from the same generator state, and moves the
 * generator's offset as op by op does (forward: one block of Philox counters; backward: none,
 * it replays the forward's), so the random numbers drawn after it are unchanged: at each call,
 * including the warm-up, compile and new-size calls, in f32 and f64, with and without grad, on
 * sizes that are not a multiple of a Philox call's 4 (f32) or 2 (f64) values. */
static void dropout_round(double p0, double p1) {
  const int64_t shapes[][2] = {{16, 64}, {17, 63}, {9, 31}};
  for (int d = 0; d < 2; d++)
    for (int grad = 0; grad < 2; grad++) {
      em_dtype dt = d ? EM_F64 : EM_F32;
      em_eager_fusion_stats s0 = em_eager_fusion_info();
      for (int k = 0; k < 3; k++) {
        em_tensor *x = randn(dt, shapes[k][0], shapes[k][1]);
        if (grad) em_requires_grad_(x, true);
        em_tensor *gy = randn(dt, shapes[k][0], shapes[k][1]);
        for (int call = 0; call < 8; call++) { /* p alternates: two signatures, each past its warm-up */
          em_tensor *y[2], *gx[2] = {0}, *after[2];
          uint64_t seed[2], off[2], off_fwd[2];
          for (int on = 0; on < 2; on++) {
            em_eager_fusion_config(on, 1);
            em_rng_set_state(11 + (uint64_t)call, 1000 * (uint64_t)call + 3);
            y[on] = em_dropout(x, call % 2 ? p1 : p0, true);
            cr_assert_not_null(y[on], "%s", em_last_error());
            em_eager_fusion_wait();
            em_rng_get_state(&seed[on], &off_fwd[on]);
            if (grad)
              cr_assert(em_grad(1, (em_tensor *[]){y[on]}, (em_tensor *[]){gy}, 1, &x, &gx[on], false, false), "%s",
                        em_last_error());
            em_rng_get_state(&seed[on], &off[on]);
            after[on] = em_rand(dt, 1, (int64_t[]){5});
          }
          char what[128];
          snprintf(what, sizeof what, "dropout %s%s shape %d call %d", em_dtype_name(dt), grad ? " grad" : "", k, call);
          EXPECT_SAME_BITS(y[1], y[0], what);
          if (grad) EXPECT_SAME_BITS(gx[1], gx[0], what);
          cr_assert_eq(seed[1], seed[0], "%s: seed", what);
          cr_assert_eq(off_fwd[1], off_fwd[0], "%s: offset after the forward, fused %llu, op by op %llu", what,
                       (unsigned long long)off_fwd[1], (unsigned long long)off_fwd[0]);
          cr_assert_eq(off[1], off[0], "%s: offset after the backward", what);
          EXPECT_SAME_BITS(after[1], after[0], what);
        }
      }
      em_eager_fusion_stats s1 = em_eager_fusion_info();
      cr_assert_gt(s1.fused_calls, s0.fused_calls + 3, "dropout %s was not fused", em_dtype_name(dt));
      cr_assert_eq(s1.fallbacks, 0);
    }
}

ETEST(eager_fusion, dropout_matches_generator) {
  /* with background compiles on (the default), dropout still compiles on the calling thread:
   * the background thread's calls would draw from the generator; and with them off (new
   * signatures: other p) */
  dropout_round(0.3, 0.5);
  setenv("EMBER_EAGER_FUSION_ASYNC", "0", 1);
  dropout_round(0.25, 0.45);
  unsetenv("EMBER_EAGER_FUSION_ASYNC");
}

/* Pooling at sizes the first compile did not see: the output size is a floor division of the
 * input's, which the compiled function must get right at each (or specialize). */
ETEST(eager_fusion, pool_new_sizes) {
  const int64_t hw[][2] = {{16, 16}, {15, 13}, {20, 11}, {9, 17}, {33, 8}};
  composite_fn fs[] = {max_pool_stem_fn, avg_pool_exclude_fn, avg_pool_divisor_fn, max_pool_dilated_fn};
  em_eager_fusion_stats s0 = em_eager_fusion_info();
  for (int f = 0; f < 4; f++)
    for (int k = 0; k < 5; k++) {
      em_tensor *x = em_randn(EM_F32, 4, (int64_t[]){2, 3, hw[k][0], hw[k][1]});
      fusion_off();
      em_tensor *ref = fs[f](&x);
      fusion_on();
      for (int call = 0; call < 4; call++) {
        char what[64];
        snprintf(what, sizeof what, "pool %d at %lldx%lld call %d", f, (long long)hw[k][0], (long long)hw[k][1], call);
        expect_close(fs[f](&x), ref, 1e-5, what);
        em_eager_fusion_wait();
      }
    }
  em_eager_fusion_stats s1 = em_eager_fusion_info();
  cr_assert_gt(s1.fused_calls, s0.fused_calls + 20, "pooling was not fused at new sizes");
  cr_assert_eq(s1.fallbacks, 0);
}

/* One compiled function serves every size: once two sizes ran (the first size's graph is
 * compiled with its sizes as constants, the second's with sizes read at run time), new sizes add
 * no signature and no LLVM module. */
ETEST(eager_fusion, sizes_share_one_kernel) {
  fusion_on();
  em_tensor *x = randn(EM_F32, 16, 40), *x2 = randn(EM_F32, 20, 48);
  for (int i = 0; i < 6; i++) {
    cr_assert_not_null(em_softmax(x, -1), "%s", em_last_error());
    em_eager_fusion_wait();
  }
  for (int i = 0; i < 6; i++) cr_assert_not_null(em_softmax(x2, -1), "%s", em_last_error());
  em_eager_fusion_stats s0 = em_eager_fusion_info();
  em_kernel_cache_stats k0 = em_kernel_cache_info();
  cr_assert_eq(s0.functions, 1);
  cr_assert_gt(s0.kernel_runs, 0, "the first size never ran its kernel");
  const int64_t sizes[][2] = {{24, 56}, {40, 72}, {9, 130}};
  for (int k = 0; k < 3; k++) {
    em_tensor *y = randn(EM_F32, sizes[k][0], sizes[k][1]);
    fusion_off();
    em_tensor *ref = em_softmax(y, -1);
    fusion_on();
    int64_t runs = em_eager_fusion_info().kernel_runs;
    for (int i = 0; i < 4; i++) expect_close(em_softmax(y, -1), ref, 1e-5, "softmax at a new size");
    cr_assert_gt(em_eager_fusion_info().kernel_runs, runs, "size %lld x %lld never ran the kernel",
                 (long long)sizes[k][0],
                 (long long)sizes[k][1]);
  }
  em_eager_fusion_stats s1 = em_eager_fusion_info();
  cr_assert_eq(s1.functions, 1, "a new size made a new signature");
  cr_assert_eq(em_kernel_cache_info().modules, k0.modules, "a new size compiled a new LLVM module");
}

/* A signature's first calls run op by op (no trace): a composite called once costs what it did. */
ETEST(eager_fusion, first_calls_op_by_op) {
  fusion_on();
  em_tensor *x = randn(EM_F32, 16, 40);
  cr_assert_not_null(em_layer_norm(x, 1, EM_NONE, EM_NONE, 1e-5));
  cr_assert_not_null(em_layer_norm(x, 1, EM_NONE, EM_NONE, 1e-5));
  em_eager_fusion_stats s = em_eager_fusion_info();
  cr_assert_eq(s.warmup_calls, 2);
  cr_assert_eq(s.fused_calls, 0);
  cr_assert_eq(s.traces, 0, "a new signature's first call traced");
}

/* Inside em_compile the composite is its prims: the user's graph holds them, not a fused call. */
static em_outputs user_fn(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_mul_scalar(em_softmax(in[0], 1), 2));
}

ETEST(eager_fusion, traced_inside_compile) {
  fusion_on();
  em_tensor *x = randn(EM_F32, 16, 40);
  fusion_off();
  em_tensor *ref = em_mul_scalar(em_softmax(x, 1), 2);
  fusion_on();
  em_explanation *e = em_explain(user_fn, NULL, x);
  cr_assert_not_null(e, "%s", em_last_error());
  cr_assert_eq(e->n_graphs, 1);
  cr_assert_geq(e->ops_per_graph[0], 5, "softmax did not trace into prims (%d ops)", e->ops_per_graph[0]);
  em_explanation_free(e);
  em_compiled *c = em_compile(user_fn, NULL);
  for (int i = 0; i < 4; i++) {
    em_outputs o = em_call(c, NULL, x);
    expect_close(o.t[0], ref, 1e-5, "compiled user function");
  }
  em_eager_fusion_stats s = em_eager_fusion_info();
  cr_assert_eq(s.functions, 0, "softmax inside em_compile went to eager fusion");
  cr_assert_eq(s.fused_calls, 0);
  cr_assert_gt(em_compiled_stats(c).kernel_runs, 0);
  em_compiled_free(c);
}

/* Bad arguments fail with the composite's own message and the caller's line, fused or not. */
ETEST(eager_fusion, errors_unchanged) {
  em_tensor *x = randn(EM_F32, 16, 40), *w = em_randn(EM_F32, 1, (int64_t[]){39});
  em_tensor *t = em_randint(0, 40, 1, (int64_t[]){16});
  enum { N_MSG = 6 };
  char msg[2][N_MSG][512];
  for (int on = 0; on < 2; on++) {
    em_eager_fusion_config(on, 1);
    for (int i = 0; i < 4; i++) { /* a warm signature */
      cr_assert_not_null(em_softmax(x, 1));
      em_eager_fusion_wait();
    }
    em_clear_error();
    int line = __LINE__ + 1;
    cr_assert_null(em_softmax(x, 2));
    snprintf(msg[on][0], sizeof msg[on][0], "%s", em_last_error());
    cr_assert(strstr(msg[on][0], "em_softmax") && strstr(msg[on][0], "axis 2 out of range"), "%s", msg[on][0]);
    char at[64];
    snprintf(at, sizeof at, "test_eager_fusion.c:%d", line);
    cr_assert(strstr(msg[on][0], at), "'%s' does not name %s", msg[on][0], at);
    em_clear_error();
    cr_assert_null(em_layer_norm(x, 1, w, EM_NONE, 1e-5));
    snprintf(msg[on][1], sizeof msg[on][1], "%s", em_last_error());
    em_clear_error();
    /* a target out of range is found by the gather at run time: it must still be found */
    em_tensor *bad = em_add_scalar(t, 40);
    cr_assert_null(em_cross_entropy(x, bad, EM_CROSS_ENTROPY_DEFAULT));
    cr_assert_not_null(em_last_error());
    snprintf(msg[on][2], sizeof msg[on][2], "%s", em_last_error());
    em_clear_error();
    /* dropout, pooling and batch_norm, warm, then called wrong */
    em_tensor *x4 = em_reshape(x, 4, (int64_t[]){2, 4, 8, 10}), *s5 = em_ones(EM_F32, 1, (int64_t[]){5});
    for (int i = 0; i < 4; i++) {
      cr_assert_not_null(em_dropout(x, 0.5, true));
      cr_assert_not_null(em_max_pool2d(x4, 2, 2, 0, 0, 0, 0));
      cr_assert_not_null(em_batch_norm(x4, EM_NONE, EM_NONE, EM_NONE, EM_NONE, true, 0.1, 1e-5));
      em_eager_fusion_wait();
    }
    cr_assert_null(em_dropout(x, 1.5, true));
    snprintf(msg[on][3], sizeof msg[on][3], "%s", em_last_error());
    em_clear_error();
    cr_assert_null(em_max_pool2d(x4, 2, 2, 0, 0, 2, 0));
    snprintf(msg[on][4], sizeof msg[on][4], "%s", em_last_error());
    em_clear_error();
    cr_assert_null(em_batch_norm(x4, s5, EM_NONE, EM_NONE, EM_NONE, true, 0.1, 1e-5));
    snprintf(msg[on][5], sizeof msg[on][5], "%s", em_last_error());
    em_clear_error();
  }
  for (int k = 0; k < N_MSG; k++) cr_assert_str_eq(msg[0][k], msg[1][k]);
  cr_assert_eq(em_eager_fusion_info().fallbacks, 0);
}

/* The switch: off (or EMBER_EAGER_FUSION=0) runs op by op, bit for bit as before. */
ETEST(eager_fusion, disable_switch) {
  em_tensor *x = randn(EM_F32, 16, 40);
  fusion_off();
  em_tensor *ref = em_gelu(x, false);
  for (int i = 0; i < 6; i++) EXPECT_SAME_BITS(em_gelu(x, false), ref, "gelu with fusion off");
  em_eager_fusion_stats s = em_eager_fusion_info();
  cr_assert_eq(s.fused_calls + s.warmup_calls + s.functions, 0);
  cr_assert(!s.enabled);
  setenv("EMBER_EAGER_FUSION", "0", 1);
  em_eager_fusion_config(-1, 1);
  for (int i = 0; i < 6; i++) EXPECT_SAME_BITS(em_gelu(x, false), ref, "gelu with EMBER_EAGER_FUSION=0");
  cr_assert(!em_eager_fusion_info().enabled);
  cr_assert_eq(em_eager_fusion_info().fused_calls, 0);
  setenv("EMBER_EAGER_FUSION", "1", 1);
  for (int i = 0; i < 6; i++) {
    cr_assert_not_null(em_gelu(x, false));
    em_eager_fusion_wait();
  }
  cr_assert_gt(em_eager_fusion_info().fused_calls, 0);
}

/* Below the size threshold, and for non-contiguous inputs, composites run op by op. */
ETEST(eager_fusion, small_and_strided_run_op_by_op) {
  em_eager_fusion_config(1, 1000);
  em_tensor *small = randn(EM_F32, 8, 8), *big = randn(EM_F32, 40, 30);
  em_tensor *strided = em_transpose(big, 0, 1);
  for (int i = 0; i < 6; i++) {
    cr_assert_not_null(em_softmax(small, 1));
    cr_assert_not_null(em_softmax(strided, 1));
  }
  em_eager_fusion_stats s = em_eager_fusion_info();
  cr_assert_eq(s.functions + s.fused_calls, 0);
  for (int i = 0; i < 6; i++) {
    cr_assert_not_null(em_softmax(big, 1));
    em_eager_fusion_wait();
  }
  cr_assert_gt(em_eager_fusion_info().fused_calls, 0);
}

/* Optimizer updates: SGD steps (momentum, dampening, weight decay, nesterov) and AdamW steps
 * (weight decay, amsgrad) fused against op by op from the same parameters; the writes into the
 * parameter and the optimizer's state are the result. */
static const em_sgd_opts sgd_opts[] = {{0.1, 0.9, 0, 0, false}, {0.05, 0.8, 0.1, 0.01, false},
                                       {0.1, 0.9, 0, 0.02, true},
                                       {0.1, 0, 0, 0.01, false}};
static const em_adamw_opts adamw_opts[] = {{0.01, 0.9, 0.999, 1e-8, 0.01, false}, {0.02, 0.8, 0.99, 1e-6, 0, true}};
enum { N_SGD = sizeof sgd_opts / sizeof *sgd_opts, N_OPTS = N_SGD + sizeof adamw_opts / sizeof *adamw_opts };

static em_tensor *optimizer_run(bool fused, em_tensor *init, em_tensor *k, int which, int steps) {
  em_eager_fusion_config(fused, 1);
  em_tensor *p = em_requires_grad_(em_clone(em_detach(init)), true);
  em_optimizer *opt =
      which < N_SGD ? em_sgd_new(1, &p, sgd_opts[which]) : em_adamw_new(1, &p, adamw_opts[which - N_SGD]);
  cr_assert_not_null(opt, "%s", em_last_error());
  for (int i = 0; i < steps; i++) {
    em_optimizer_zero_grad(opt);
    em_tensor *loss = em_sum(em_mul(em_mul(p, p), k), 0, NULL, false);
    cr_assert(em_backward(loss, NULL), "%s", em_last_error());
    cr_assert(em_optimizer_step(opt), "step %d: %s", i, em_last_error());
    em_eager_fusion_wait();
  }
  em_optimizer_free(opt);
  return p;
}

ETEST(eager_fusion, optimizers) {
  for (int d = 0; d < 2; d++) {
    em_dtype dt = d ? EM_F64 : EM_F32;
    em_tensor *init = randn(dt, 16, 64), *k = em_rand(dt, 2, (int64_t[]){16, 64});
    for (int i = 0; i < N_OPTS; i++) {
      em_eager_fusion_stats s0 = em_eager_fusion_info();
      em_tensor *fused = optimizer_run(true, init, k, i, 8);
      em_eager_fusion_stats s1 = em_eager_fusion_info();
      em_tensor *ref = optimizer_run(false, init, k, i, 8);
      char w[64];
      snprintf(w, sizeof w, "%s options %d %s", i < N_SGD ? "sgd" : "adamw", i < N_SGD ? i : i - N_SGD,
               em_dtype_name(dt));
      expect_close(fused, ref, dt == EM_F64 ? 1e-11 : 1e-5, w);
      cr_assert_gt(s1.kernel_runs, s0.kernel_runs, "%s: no kernel ran", w);
      cr_assert_eq(s1.fallbacks, 0, "%s: fell back", w);
    }
  }
}

/* The compile is tiered: a signature's third call starts it on a background thread (the
 * default) and runs op by op itself; calls while it compiles run op by op; once it is done,
 * calls run its kernels at once. With EMBER_EAGER_FUSION_ASYNC=0 the third call compiles and
 * runs the kernel itself. */
ETEST(eager_fusion, background_compile) {
  unsetenv("EMBER_EAGER_FUSION_ASYNC");
  fusion_on();
  em_tensor *x = randn(EM_F32, 16, 40);
  fusion_off();
  em_tensor *ref = em_log_softmax(x, 1);
  fusion_on();
  for (int i = 0; i < 3; i++) expect_close(em_log_softmax(x, 1), ref, 1e-5, "calls before the kernel");
  em_eager_fusion_stats s = em_eager_fusion_info();
  cr_assert_eq(s.fused_calls, 0, "the call that started the compile did not run op by op");
  cr_assert_eq(s.warmup_calls, 3);
  em_eager_fusion_wait();
  int64_t runs = em_eager_fusion_info().kernel_runs;
  cr_assert_gt(runs, 0, "the background compile ran no kernel");
  expect_close(em_log_softmax(x, 1), ref, 1e-5, "the first call after the compile");
  s = em_eager_fusion_info();
  cr_assert_eq(s.fused_calls, 1);
  cr_assert_eq(s.kernel_runs, runs + 1, "the first call after the compile did not run the kernel");

  setenv("EMBER_EAGER_FUSION_ASYNC", "0", 1);
  em_tensor *y = randn(EM_F32, 12, 36);
  for (int i = 0; i < 3; i++) cr_assert_not_null(em_softmax(y, 0));
  cr_assert_eq(em_eager_fusion_info().fused_calls, 2, "with EMBER_EAGER_FUSION_ASYNC=0 the third call is fused");
  setenv("EMBER_EAGER_FUSION_ASYNC", "1", 1);
  em_tensor *z = randn(EM_F32, 10, 44);
  for (int i = 0; i < 3; i++) cr_assert_not_null(em_log_softmax(z, 0));
  cr_assert_eq(em_eager_fusion_info().fused_calls, 2, "EMBER_EAGER_FUSION_ASYNC=1, the default: the third call is not");
  unsetenv("EMBER_EAGER_FUSION_ASYNC");
}

/* A process that ends while background compiles run exits cleanly: tests/exit_probe starts four
 * (kernel cache off: each compiles) and returns from main, calls exit, has another thread call
 * exit while it runs fused calls, or forks a child that calls them and exits (the child has
 * none of the compile threads: it must not wait for them). While exit waited for the compiles only after LLVM's
 * static destructors, this test failed 3 times in 3 (a probe segfaulting in LLVM's SelectionDAG
 * type tables, 1 to 2 runs in 20); runs go two at a time, as under load. */
ETEST(eager_fusion, exit_while_compiling, .timeout = 240) { /* a child that waits for the parent's threads hangs */
  const char *exe = getenv("EMBER_EXIT_PROBE");
  cr_assert(exe, "EMBER_EXIT_PROBE names tests/exit_probe (meson sets it)");
  setenv("EMBER_CACHE", "0", 1);
  unsetenv("EMBER_EAGER_FUSION_ASYNC");
  const char *modes[] = {"return", "exit", "thread", "fork"};
  enum { RUNS = 8, AT_ONCE = 2 };
  for (int m = 0; m < 4; m++)
    for (int r = 0; r < RUNS; r += AT_ONCE) {
      FILE *f[AT_ONCE];
      for (int k = 0; k < AT_ONCE; k++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "'%s' %s", exe, modes[m]);
        cr_assert((f[k] = popen(cmd, "r")));
      }
      for (int k = 0; k < AT_ONCE; k++) {
        int st = pclose(f[k]);
        cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit_probe %s, run %d: %s %d", modes[m], r + k,
                  st != -1 && WIFSIGNALED(st) ? "killed by signal" : "exit status",
                  st == -1 ? -1 : WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      }
    }
  unsetenv("EMBER_CACHE");
}

/* Threads: callers of one signature share its compiled function (one starts the compile, the
 * others run op by op meanwhile, then all run the kernel); each result matches op by op. */
typedef struct thread_case {
  em_tensor *x, *ref;
  double max_err;
  bool failed;
} thread_case;

static void *thread_body(void *arg) {
  thread_case *t = arg;
  em_scope_begin();
  for (int i = 0; i < 12; i++) {
    em_scope_begin();
    em_tensor *y = em_softmax(t->x, 1);
    if (!y) t->failed = true;
    else t->max_err = fmax(t->max_err, em_item(em_amax(em_abs(em_sub(y, t->ref)), 0, NULL, false)));
    em_scope_end();
    if (i == 5) em_eager_fusion_wait(); /* the compile one of the threads started */
  }
  em_thread_cleanup();
  return NULL;
}

ETEST(eager_fusion, threads) {
  enum { N = 4 };
  thread_case tc[N] = {{0}};
  fusion_off();
  for (int i = 0; i < N; i++) {
    tc[i].x = randn(EM_F32, 16 + 4 * i, 40);
    tc[i].ref = em_softmax(tc[i].x, 1);
  }
  fusion_on();
  pthread_t th[N];
  for (int i = 0; i < N; i++) cr_assert_eq(pthread_create(&th[i], NULL, thread_body, &tc[i]), 0);
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  em_eager_fusion_wait();
  for (int i = 0; i < N; i++) {
    cr_assert(!tc[i].failed, "thread %d: a call failed", i);
    cr_assert_leq(tc[i].max_err, 1e-6, "thread %d: differs from op by op by %g", i, tc[i].max_err);
  }
  em_eager_fusion_stats s = em_eager_fusion_info();
  cr_assert_eq(s.functions, 1);
  cr_assert_gt(s.fused_calls, 0);
  cr_assert_eq(s.fallbacks, 0);
}

/* Double backward through a fused call: its backward graph (the recompute partitioner) reads only
 * the composite's inputs, so under create_graph it runs recorded and the gradient of the gradient
 * is the op-by-op one (f64, softmax, layer_norm, the erf GELU and training batch_norm). */
ETEST(eager_fusion, double_backward_matches_op_by_op) {
  composite_fn fs[] = {softmax_fn, layer_norm_fn, gelu_fn, bn_train_fn};
  const char *names[] = {"softmax", "layer_norm", "gelu", "batch_norm training"};
  for (int k = 0; k < 4; k++) {
    em_tensor *in[N_INPUTS];
    make_inputs(EM_F64, 8, 32, true, in);
    em_tensor *g = em_randn(EM_F64, 2, (int64_t[]){8, 32}), *v = em_randn(EM_F64, 2, (int64_t[]){8, 32});
    em_tensor *want = NULL, *got = NULL;
    for (int on = 0; on < 2; on++) {
      on ? fusion_on() : fusion_off();
      em_eager_fusion_stats s0 = em_eager_fusion_info();
      for (int call = 0; call < (on ? 5 : 1); call++) { /* past the tiers: the last calls run the kernel */
        em_tensor *y = fs[k](in), *gx = NULL, *hx = NULL;
        em_eager_fusion_wait();
        cr_assert(em_grad(1, (em_tensor *[]){y}, (em_tensor *[]){g}, 1, in, &gx, false, true), "%s: %s", names[k],
                  em_last_error());
        cr_assert(em_grad(1, (em_tensor *[]){gx}, (em_tensor *[]){v}, 1, in, &hx, false, false), "%s double: %s",
                  names[k], em_last_error());
        if (on) got = hx;
        else want = hx;
      }
      if (on) cr_assert_gt(em_eager_fusion_info().kernel_runs, s0.kernel_runs, "%s: the kernel never ran", names[k]);
    }
    char w[64];
    snprintf(w, sizeof w, "%s: gradient of the gradient", names[k]);
    expect_close(got, want, 1e-10, w);
  }
  fusion_on();
}
