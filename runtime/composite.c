/* runtime/composite.c: composite ops, each written once as a decomposition into prims through
 * the public op API.
 *
 * Composites have no autograd code: their gradients come from the prims' rules, and the same
 * code will trace into graphs. Each opens a scope for its intermediates and keeps only the
 * result, passing the caller's site to every op so errors name the user's line. Numerically
 * stable forms throughout: softmax and logsumexp subtract the (detached) maximum, sigmoid never
 * exponentiates a positive number, softplus is linear above its threshold.
 *
 * Arguments are checked before the scope opens, so a bad call fails with a message naming the
 * composite and the shapes it was given rather than some prim deep inside it. A NULL input is an
 * earlier failure (already recorded) and returns NULL silently; a NULL from any op inside is
 * carried through to the result, never papered over. */
#include "rt.h"

#include <math.h>
#include <string.h>

/* The composite's scope carries its public name (em_mean_at -> "em_mean"), so errors from the
 * ops inside name the op the user called first. */
#define BEGIN(site) \
  if (!rt_scope_begin_op(__func__, site)) return NULL
#define END(r, site)                          \
  do {                                        \
    em_tensor *kept_ = em_keep_at((r), site); \
    em_scope_end_at(site);                    \
    return kept_;                             \
  } while (0)

/* Eager fusion (see rt_fused in rt.h): after the argument checks, so a bad call fails with the
 * composite's own message; returns the fused result when the hook ran the composite. */
#define FUSED(op, site, n_args, args, ...)                                                       \
  do {                                                                                            \
    em_tensor *fused_, *const fused_in_[] = {__VA_ARGS__};                                        \
    if (rt_fused((op), (args), (n_args), fused_in_, (int)(sizeof fused_in_ / sizeof *fused_in_), &fused_, (site))) \
      return fused_;                                                                              \
  } while (0)

bool rt_fused(rt_fuse_op op, const double *args, int n_args, em_tensor *const *in, int n_in, em_tensor **out,
              em_site site) {
  /* inside a trace (em_compile's, or the fused kernel's own) the composite is its prims */
  return rt_fuse_hook && !rt_tracing() && rt_fuse_hook(op, args, n_args, in, n_in, out, site);
}

/* A number operand: a CPU scalar whatever the default device (it joins operands on any device). */
static em_tensor *num(em_dtype dt, double v, em_site site) { return rt_scope_add(rt_scalar(dt, v, "scalar", site), "scalar", site); }

static bool float_arg(em_tensor *x, const char *name, em_site site) {
  char b[128];
  if (!rt_tensor_arg(x, name, site)) return false;
  if (!ir_is_float(x->dtype) || !ir_dtype(x->dtype)->cpu_compute)
    return rt_error(site, name, "needs f32 or f64, got %s", rt_fmt(b, sizeof b, x)), false;
  return true;
}

/* where(x <= 0, 0, x) rather than maximum(x, 0): NaN passes through as in torch.relu, the
 * gradient at 0 is 0 as in PyTorch's threshold_backward, and the backward is one select instead
 * of maximum's tie-splitting rule. */
em_tensor *em_relu_at(em_tensor *x, em_site site) {
  if (!x) return NULL;
  FUSED(RT_FUSE_RELU, site, 0, NULL, x);
  BEGIN(site);
  END(em_where_at(em_le_scalar_at(x, 0, site), num(x->dtype, 0, site), x, site), site);
}

em_tensor *em_leaky_relu_at(em_tensor *x, double slope, em_site site) {
  if (!x) return NULL;
  BEGIN(site);
  END(em_where_at(em_gt_scalar_at(x, 0, site), x, em_mul_scalar_at(x, slope, site), site), site);
}

em_tensor *em_gelu_at(em_tensor *x, bool tanh_approx, em_site site) {
  if (!x || !float_arg(x, "em_gelu", site)) return NULL;
  FUSED(RT_FUSE_GELU, site, 1, ((double[]){tanh_approx}), x);
  BEGIN(site);
  em_tensor *inner;
  if (tanh_approx) {
    em_tensor *cube = em_mul_at(em_mul_at(x, x, site), x, site);
    em_tensor *u = em_mul_scalar_at(em_add_at(x, em_mul_scalar_at(cube, 0.044715, site), site), 0.7978845608028654, site);
    inner = em_tanh_at(u, site);
  } else {
    inner = em_erf_at(em_mul_scalar_at(x, 0.7071067811865476, site), site);
  }
  END(em_mul_at(em_mul_scalar_at(x, 0.5, site), em_add_scalar_at(inner, 1, site), site), site);
}

em_tensor *em_sigmoid_at(em_tensor *x, em_site site) {
  if (!x || !float_arg(x, "em_sigmoid", site)) return NULL;
  FUSED(RT_FUSE_SIGMOID, site, 0, NULL, x);
  BEGIN(site);
  /* e = exp(-|x|) <= 1: x >= 0 gives 1 / (1 + e), x < 0 gives e / (1 + e). -|x| is written as
   * a select, not neg(abs(x)): abs's gradient at 0 is 0 (torch's sign(0)), which made sigmoid's
   * gradient at x = 0 zero instead of 1/4 (found by the PyTorch reference suite). */
  em_tensor *pos = em_ge_scalar_at(x, 0, site);
  em_tensor *e = em_exp_at(em_where_at(pos, em_neg_at(x, site), x, site), site);
  em_tensor *d = em_add_scalar_at(e, 1, site);
  END(em_where_at(pos, em_reciprocal_at(d, site), em_div_at(e, d, site), site), site);
}

em_tensor *em_silu_at(em_tensor *x, em_site site) {
  if (!x || !float_arg(x, "em_silu", site)) return NULL;
  FUSED(RT_FUSE_SILU, site, 0, NULL, x);
  BEGIN(site);
  END(em_mul_at(x, em_sigmoid_at(x, site), site), site);
}

em_tensor *em_softplus_at(em_tensor *x, double beta, double threshold, em_site site) {
  if (!x || !float_arg(x, "em_softplus", site)) return NULL;
  if (beta <= 0) return rt_error(site, "em_softplus", "beta must be > 0, got %g", beta);
  BEGIN(site);
  /* log1p(exp(bx)) / b computed as max(bx, 0) + log1p(exp(-|bx|)), linear above threshold.
   * Both halves take bx >= 0's branch at 0 (selects, not relu and abs, whose gradients at 0 are
   * 0), so the gradient there is 1 - 1/2 = sigmoid(0), as torch's (it was 0). */
  em_tensor *bx = em_mul_scalar_at(x, beta, site);
  em_tensor *pos = em_ge_scalar_at(bx, 0, site);
  em_tensor *lin = em_where_at(pos, bx, num(x->dtype, 0, site), site);
  em_tensor *soft = em_add_at(lin, em_log1p_at(em_exp_at(em_where_at(pos, em_neg_at(bx, site), bx, site), site), site), site);
  em_tensor *r = em_where_at(em_gt_scalar_at(bx, threshold, site), x, em_div_scalar_at(soft, beta, site), site);
  END(r, site);
}

static bool axis_arg(em_tensor *x, int axis, const char *name, em_site site, int *out) {
  char b[128];
  *out = ir_norm_axis(axis, x->ndim);
  if (*out < 0) return rt_error(site, name, "axis %d out of range for %s", axis, rt_fmt(b, sizeof b, x)), false;
  return true;
}

/* x - max(x) along the axes, keepdim, with the max detached (it only shifts, never changes,
 * the result, so it needs no gradient). */
static em_tensor *shifted(em_tensor *x, int n, const int64_t *axes, em_site site) {
  em_tensor *m = em_detach_at(em_amax_at(x, n, axes, true, site), site);
  /* an all -inf slice would give inf - inf; shift by 0 there */
  m = m ? em_where_at(em_eq_scalar_at(m, -INFINITY, site), num(x->dtype, 0, site), m, site) : NULL;
  return em_sub_at(x, m, site);
}

em_tensor *em_softmax_at(em_tensor *x, int axis, em_site site) {
  int a;
  if (!x || !(x = rt_autocast_f32(x, site)) || !float_arg(x, "em_softmax", site) ||
      !axis_arg(x, axis, "em_softmax", site, &a))
    return NULL;
  FUSED(RT_FUSE_SOFTMAX, site, 1, ((double[]){a}), x);
  BEGIN(site);
  int64_t ax = a;
  em_tensor *e = em_exp_at(shifted(x, 1, &ax, site), site);
  END(em_div_at(e, em_sum_at(e, 1, &ax, true, site), site), site);
}

/* Number of elements reduced over (n_axes = 0: all). */
static int64_t reduced_count(em_tensor *x, int n, const int64_t *axes) {
  if (n == 0) return x->numel;
  int64_t c = 1;
  for (int i = 0; i < n; i++) {
    int a = ir_norm_axis(axes[i], x->ndim);
    if (a >= 0) c *= x->sizes[a];
  }
  return c;
}

em_tensor *em_logsumexp_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site) {
  if (!x || !float_arg(x, "em_logsumexp", site) || !rt_axes_arg(x, n_axes, axes, "em_logsumexp", site)) return NULL;
  BEGIN(site);
  em_tensor *r;
  if (reduced_count(x, n_axes, axes) == 0) { /* log of an empty sum: -inf, as torch (amax has no identity) */
    r = em_log_at(em_sum_at(x, n_axes, axes, true, site), site);
  } else {
    em_tensor *m = em_detach_at(em_amax_at(x, n_axes, axes, true, site), site);
    m = m ? em_where_at(em_eq_scalar_at(em_abs_at(m, site), INFINITY, site), num(x->dtype, 0, site), m, site) : NULL;
    em_tensor *s = em_log_at(em_sum_at(em_exp_at(em_sub_at(x, m, site), site), n_axes, axes, true, site), site);
    r = em_add_at(s, m, site);
  }
  if (r && !keepdim) r = em_squeeze_at(r, n_axes, axes, site);
  if (r && !keepdim && n_axes == 0) r = em_reshape_at(r, 0, NULL, site);
  END(r, site);
}

em_tensor *em_log_softmax_at(em_tensor *x, int axis, em_site site) {
  int a;
  if (!x || !(x = rt_autocast_f32(x, site)) || !float_arg(x, "em_log_softmax", site) ||
      !axis_arg(x, axis, "em_log_softmax", site, &a))
    return NULL;
  FUSED(RT_FUSE_LOG_SOFTMAX, site, 1, ((double[]){a}), x);
  BEGIN(site);
  int64_t ax = a;
  em_tensor *z = shifted(x, 1, &ax, site);
  END(em_sub_at(z, em_log_at(em_sum_at(em_exp_at(z, site), 1, &ax, true, site), site), site), site);
}

em_tensor *em_mean_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site) {
  if (!x || !rt_tensor_arg(x, "em_mean", site) || !rt_axes_arg(x, n_axes, axes, "em_mean", site)) return NULL;
  BEGIN(site);
  em_tensor *xf = ir_is_float(x->dtype) ? x : em_cast_at(x, EM_F32, site);
  em_tensor *s = em_sum_at(xf, n_axes, axes, keepdim, site);
  END(em_div_scalar_at(s, (double)reduced_count(x, n_axes, axes), site), site);
}

em_tensor *em_var_at(em_tensor *x, int n_axes, const int64_t *axes, int64_t correction, bool keepdim, em_site site) {
  if (!x || !rt_tensor_arg(x, "em_var", site) || !rt_axes_arg(x, n_axes, axes, "em_var", site)) return NULL;
  BEGIN(site);
  em_tensor *xf = ir_is_float(x->dtype) ? x : em_cast_at(x, EM_F32, site);
  em_tensor *d = em_sub_at(xf, em_mean_at(xf, n_axes, axes, true, site), site);
  em_tensor *ss = em_sum_at(em_mul_at(d, d, site), n_axes, axes, keepdim, site);
  double dof = (double)reduced_count(x, n_axes, axes) - (double)correction;
  END(em_div_scalar_at(ss, dof > 0 ? dof : 0, site), site);
}

em_tensor *em_std_at(em_tensor *x, int n_axes, const int64_t *axes, int64_t correction, bool keepdim, em_site site) {
  if (!x || !rt_tensor_arg(x, "em_std", site) || !rt_axes_arg(x, n_axes, axes, "em_std", site)) return NULL;
  BEGIN(site);
  /* torch's std_backward masks the gradient where the result is 0 (sqrt's derivative there is
   * infinite, and a constant slice gave NaN): the sqrt reads 1 there, and a select makes it 0 */
  em_tensor *v = em_var_at(x, n_axes, axes, correction, keepdim, site);
  em_tensor *z = em_eq_scalar_at(v, 0, site);
  END(em_where_at(z, num(v ? v->dtype : EM_F32, 0, site), em_sqrt_at(em_where_at(z, num(v ? v->dtype : EM_F32, 1, site), v, site), site), site), site);
}

static bool norm_dims(em_tensor *x, int n_norm, const char *name, em_site site, int64_t *axes) {
  char b[128];
  if (n_norm < 1 || n_norm > x->ndim)
    return rt_error(site, name, "cannot normalise over the last %d dims of %s", n_norm, rt_fmt(b, sizeof b, x)), false;
  for (int i = 0; i < n_norm; i++) axes[i] = x->ndim - n_norm + i;
  return true;
}

static bool affine_arg(em_tensor *t, em_tensor *x, int n_norm, const char *what, const char *name, em_site site) {
  if (t == EM_NONE) return true;
  char b0[128], b1[128];
  bool ok = t->ndim == n_norm && t->dtype == x->dtype;
  for (int i = 0; ok && i < n_norm; i++) ok = t->sizes[i] == x->sizes[x->ndim - n_norm + i];
  if (!ok)
    return rt_error(site, name, "%s %s does not match the normalised dims of %s", what, rt_fmt(b0, sizeof b0, t),
                    rt_fmt(b1, sizeof b1, x)), false;
  return true;
}

em_tensor *em_layer_norm_at(em_tensor *x, int n_norm, em_tensor *w, em_tensor *b, double eps, em_site site) {
  static const char name[] = "em_layer_norm";
  int64_t axes[EM_MAX_DIMS];
  if (!x || !w || !b || !(x = rt_autocast_f32(x, site)) || !(w = rt_autocast_f32(w, site)) ||
      !(b = rt_autocast_f32(b, site)))
    return NULL;
  if (!float_arg(x, name, site) || !norm_dims(x, n_norm, name, site, axes) ||
      !affine_arg(w, x, n_norm, "weight", name, site) || !affine_arg(b, x, n_norm, "bias", name, site))
    return NULL;
  FUSED(RT_FUSE_LAYER_NORM, site, 2, ((double[]){n_norm, eps}), x, w, b);
  BEGIN(site);
  em_tensor *d = em_sub_at(x, em_mean_at(x, n_norm, axes, true, site), site);
  em_tensor *var = em_mean_at(em_mul_at(d, d, site), n_norm, axes, true, site);
  em_tensor *y = em_mul_at(d, em_rsqrt_at(em_add_scalar_at(var, eps, site), site), site);
  if (w != EM_NONE) y = em_mul_at(y, w, site);
  if (b != EM_NONE) y = em_add_at(y, b, site);
  END(y, site);
}

em_tensor *em_rms_norm_at(em_tensor *x, int n_norm, em_tensor *w, double eps, em_site site) {
  static const char name[] = "em_rms_norm";
  int64_t axes[EM_MAX_DIMS];
  if (!x || !w) return NULL;
  if (!float_arg(x, name, site) || !norm_dims(x, n_norm, name, site, axes) || !affine_arg(w, x, n_norm, "weight", name, site))
    return NULL;
  FUSED(RT_FUSE_RMS_NORM, site, 2, ((double[]){n_norm, eps}), x, w);
  BEGIN(site);
  em_tensor *ms = em_mean_at(em_mul_at(x, x, site), n_norm, axes, true, site);
  em_tensor *y = em_mul_at(x, em_rsqrt_at(em_add_scalar_at(ms, eps, site), site), site);
  if (w != EM_NONE) y = em_mul_at(y, w, site);
  END(y, site);
}

em_tensor *em_batch_norm_at(em_tensor *x, em_tensor *rm, em_tensor *rv, em_tensor *w, em_tensor *b, bool training,
                            double momentum, double eps, em_site site) {
  static const char name[] = "em_batch_norm";
  if (!x || !rm || !rv || !w || !b) return NULL;
  char s0[128], s1[128];
  if (!float_arg(x, name, site)) return NULL;
  if (x->ndim < 2) return rt_error(site, name, "needs x [N, C, ...], got %s", rt_fmt(s0, sizeof s0, x));
  int64_t c = x->sizes[1];
  em_tensor *per_channel[4] = {rm, rv, w, b};
  static const char *const what[4] = {"running_mean", "running_var", "weight", "bias"};
  for (int i = 0; i < 4; i++) {
    em_tensor *t = per_channel[i];
    if (t != EM_NONE && (t->ndim != 1 || t->sizes[0] != c || t->dtype != x->dtype))
      return rt_error(site, name, "%s must be %s[%lld] for x %s, got %s", what[i], em_dtype_name(x->dtype), (long long)c,
                      rt_fmt(s1, sizeof s1, x), rt_fmt(s0, sizeof s0, t));
  }
  if (!training && (rm == EM_NONE || rv == EM_NONE))
    return rt_error(site, name, "evaluation needs running_mean and running_var");
  /* as PyTorch: one value per channel has no batch variance to normalise by */
  if (training && c > 0 && x->numel / c == 1)
    return rt_error(site, name, "expected more than 1 value per channel when training, got %s", rt_fmt(s0, sizeof s0, x));
  FUSED(RT_FUSE_BATCH_NORM, site, 3, ((double[]){training, momentum, eps}), x, rm, rv, w, b);
  BEGIN(site);
  int64_t shape[EM_MAX_DIMS], axes[EM_MAX_DIMS];
  int na = 0;
  for (int i = 0; i < x->ndim; i++) {
    shape[i] = i == 1 ? c : 1;
    if (i != 1) axes[na++] = i;
  }
  em_tensor *mean, *var;
  if (training) {
    mean = em_mean_at(x, na, axes, true, site);
    em_tensor *d = em_sub_at(x, mean, site);
    var = em_mean_at(em_mul_at(d, d, site), na, axes, true, site);
    if ((rm != EM_NONE || rv != EM_NONE) && mean && var) {
      /* The running statistics are buffers, not part of the graph: update them with grad off
       * (the in-place ops would otherwise refuse to write data derived from x's history). */
      double n = (double)(x->numel / (c ? c : 1));
      em_no_grad_begin();
      bool ok = true;
      if (rm != EM_NONE)
        ok = em_mul_scalar__at(rm, 1 - momentum, site) &&
             em_add__at(rm, em_mul_scalar_at(em_reshape_at(mean, 1, &c, site), momentum, site), site);
      if (ok && rv != EM_NONE) /* the running variance is the unbiased one, as PyTorch keeps it */
        ok = em_mul_scalar__at(rv, 1 - momentum, site) &&
             em_add__at(rv, em_mul_scalar_at(em_reshape_at(var, 1, &c, site), momentum * n / (n - 1), site), site);
      em_no_grad_end();
      if (!ok) mean = NULL;
    }
  } else {
    mean = em_reshape_at(rm, x->ndim, shape, site);
    var = em_reshape_at(rv, x->ndim, shape, site);
  }
  em_tensor *y = em_mul_at(em_sub_at(x, mean, site), em_rsqrt_at(em_add_scalar_at(var, eps, site), site), site);
  if (w != EM_NONE) y = em_mul_at(y, em_reshape_at(w, x->ndim, shape, site), site);
  if (b != EM_NONE) y = em_add_at(y, em_reshape_at(b, x->ndim, shape, site), site);
  END(y, site);
}

em_tensor *em_linear_at(em_tensor *x, em_tensor *w, em_tensor *b, em_site site) {
  RT_ARG(x, "em_linear", site);
  RT_ARG(w, "em_linear", site);
  if (!x || !w || !b) return NULL;
  char s0[128], s1[128];
  if (w->ndim != 2) return rt_error(site, "em_linear", "weight must be [out, in], got %s", rt_fmt(s0, sizeof s0, w));
  if (x->ndim < 1 || x->sizes[x->ndim - 1] != w->sizes[1])
    return rt_error(site, "em_linear", "x %s does not end in weight %s's in-features", rt_fmt(s0, sizeof s0, x),
                    rt_fmt(s1, sizeof s1, w));
  if (b != EM_NONE && (b->ndim != 1 || b->sizes[0] != w->sizes[0]))
    return rt_error(site, "em_linear", "bias %s does not match weight %s", rt_fmt(s0, sizeof s0, b), rt_fmt(s1, sizeof s1, w));
  /* autocast: the bias too, so the sum stays in the low dtype (F.linear is one op in torch's list) */
  if (!(x = rt_autocast_low(x, "em_linear", site)) || !(w = rt_autocast_low(w, "em_linear", site)) ||
      !(b = rt_autocast_low(b, "em_linear", site)))
    return NULL;
  BEGIN(site);
  em_tensor *y = em_matmul_at(x, em_transpose_at(w, 0, 1, site), site);
  if (b != EM_NONE) y = em_add_at(y, b, site);
  END(y, site);
}

em_tensor *em_dropout_at(em_tensor *x, double p, bool training, em_site site) {
  RT_ARG(x, "em_dropout", site);
  if (!x) return NULL;
  if (!(p >= 0 && p <= 1)) return rt_error(site, "em_dropout", "p must be in [0, 1], got %g", p);
  if (!training || p == 0) return rt_scope_add(em_retain(x), "em_dropout", site);
  if (!float_arg(x, "em_dropout", site)) return NULL;
  if (p < 1) FUSED(RT_FUSE_DROPOUT, site, 1, ((double[]){p}), x);
  BEGIN(site);
  if (p == 1) END(em_mul_scalar_at(x, 0, site), site);
  /* keep where u >= p, u uniform from the Philox stream: one mask for forward and backward */
  em_device prev = em_set_default_device(x->storage->device);
  em_tensor *keep = em_ge_scalar_at(em_rand_at(x->dtype, x->ndim, x->sizes, site), p, site);
  em_set_default_device(prev);
  END(em_mul_at(x, em_mul_scalar_at(em_cast_at(keep, x->dtype, site), 1 / (1 - p), site), site), site);
}

/* ---- losses ---- */

static bool reduction_arg(em_reduction r, const char *name, em_site site) {
  if (r == EM_REDUCE_NONE || r == EM_REDUCE_MEAN || r == EM_REDUCE_SUM) return true;
  return rt_error(site, name, "unknown reduction %d", (int)r), false;
}

/* Reduces the per-element loss l. The mean divides by the number of counted elements: the sum of
 * the mask `valid` (ignore_index), or every element when valid is EM_NONE. A NULL l or valid is
 * an earlier failure and gives NULL (never a mean over the wrong count). */
static em_tensor *reduce_loss(em_tensor *l, em_reduction r, em_tensor *valid, em_site site) {
  if (!l || !valid) return NULL;
  if (r == EM_REDUCE_NONE) return l;
  em_tensor *s = em_sum_at(l, 0, NULL, false, site);
  if (r == EM_REDUCE_SUM) return s;
  if (valid == EM_NONE) return em_div_scalar_at(s, (double)l->numel, site);
  return em_div_at(s, em_sum_at(valid, 0, NULL, false, site), site);
}

static em_tensor *index_target(em_tensor *t, const char *what, const char *name, em_site site) {
  char b[128];
  if (t->dtype == EM_I64) return t;
  if (t->dtype == EM_I32) return em_cast_at(t, EM_I64, site);
  return rt_error(site, name, "%s must be i64 or i32, got %s", what, rt_fmt(b, sizeof b, t));
}

/* The class weights: NULL or EM_NONE (none), else [C] of logp's dtype. *w is set to NULL for
 * none. */
static bool weight_arg(em_tensor *weight, em_tensor *logp, em_tensor **w, const char *name, em_site site) {
  char b0[128], b1[128];
  *w = weight == EM_NONE ? NULL : weight;
  if (!*w) return true;
  if (weight->ndim != 1 || logp->ndim < 2 || weight->sizes[0] != logp->sizes[1] || weight->dtype != logp->dtype)
    return rt_error(site, name, "weight %s must be %s[C] for input %s (one weight a class)", rt_fmt(b0, sizeof b0, weight),
                    em_dtype_name(logp->dtype), rt_fmt(b1, sizeof b1, logp)), false;
  return true;
}

/* -w[target] logp[target] per example with ignore_index masked out; logp [N, C, d...], target
 * [N, d...], weight [C] or NULL (all 1). Returns the per-example loss [N, d...], and sets *keep
 * to the mask of counted targets and *wt to their weights (the divisor of torch's mean: the sum
 * of the weights of the counted targets), both as logp's dtype. */
static em_tensor *nll_terms(em_tensor *logp, em_tensor *target, int64_t ignore, em_tensor *weight, em_tensor **keep,
                            em_tensor **wt, const char *name, em_site site) {
  char b0[128], b1[128];
  if (!logp || !target) return NULL; /* an earlier op failed (its error is recorded) */
  bool ok = logp->ndim >= 2 && target->ndim == logp->ndim - 1 && target->sizes[0] == logp->sizes[0];
  for (int i = 1; ok && i < target->ndim; i++) ok = target->sizes[i] == logp->sizes[i + 1];
  if (!ok)
    return rt_error(site, name, "target %s does not match input %s (want [N, d...] for [N, C, d...])",
                    rt_fmt(b0, sizeof b0, target), rt_fmt(b1, sizeof b1, logp));
  em_tensor *k = em_ne_scalar_at(target, (double)ignore, site);
  /* ignored targets are redirected to class 0 so the gather stays in bounds */
  em_tensor *safe = em_where_at(k, target, num(EM_I64, 0, site), site);
  em_tensor *picked = em_squeeze_at(em_gather_at(logp, 1, em_unsqueeze_at(safe, 1, site), site), 1, (int64_t[]){1}, site);
  *keep = *wt = em_cast_at(k, logp->dtype, site);
  em_tensor *l = em_neg_at(picked, site);
  if (weight && safe) {
    int64_t flat = -1;
    em_tensor *w = em_index_select_at(weight, 0, em_reshape_at(safe, 1, &flat, site), site);
    em_tensor *wr = em_reshape_at(w, target->ndim, target->sizes, site);
    *wt = em_mul_at(wr, *keep, site);
    l = em_mul_at(l, wr, site);
  }
  /* a select, not a product with the mask: with every target ignored the mean divides 0 by 0,
   * and its infinite gradient times a 0 mask gave NaN where torch gives 0 */
  return em_where_at(k, l, num(logp->dtype, 0, site), site);
}

em_tensor *em_nll_loss_at(em_tensor *logp, em_tensor *target, int64_t ignore_index, em_reduction reduction, em_site site) {
  if (!logp || !target) return NULL;
  if (!float_arg(logp, "em_nll_loss", site) || !reduction_arg(reduction, "em_nll_loss", site)) return NULL;
  BEGIN(site);
  em_tensor *t = index_target(target, "class-index targets", "em_nll_loss", site), *keep = NULL, *wt = NULL;
  em_tensor *l = t ? nll_terms(logp, t, ignore_index, NULL, &keep, &wt, "em_nll_loss", site) : NULL;
  END(reduce_loss(l, reduction, wt, site), site);
}

em_tensor *em_nll_loss_ex_at(em_tensor *logp, em_tensor *target, em_nll_loss_opts o, em_site site) {
  static const char name[] = "em_nll_loss_ex";
  RT_ARG(logp, name, site);
  RT_ARG(target, name, site);
  em_tensor *w;
  if (!float_arg(logp, name, site) || !reduction_arg(o.reduction, name, site) || !weight_arg(o.weight, logp, &w, name, site))
    return NULL;
  BEGIN(site);
  em_tensor *t = index_target(target, "class-index targets", name, site), *keep = NULL, *wt = NULL;
  em_tensor *l = t ? nll_terms(logp, t, o.ignore_index, w, &keep, &wt, name, site) : NULL;
  END(reduce_loss(l, o.reduction, wt, site), site);
}

em_tensor *em_cross_entropy_at(em_tensor *logits, em_tensor *target, em_cross_entropy_opts o, em_site site) {
  RT_ARG(logits, "em_cross_entropy", site);
  RT_ARG(target, "em_cross_entropy", site);
  static const char name[] = "em_cross_entropy";
  if (!logits || !target || !(logits = rt_autocast_f32(logits, site)) || !(target = rt_autocast_f32(target, site)))
    return NULL;
  char b0[128], b1[128];
  em_tensor *w;
  if (!float_arg(logits, name, site) || !reduction_arg(o.reduction, name, site)) return NULL;
  if (logits->ndim < 2) return rt_error(site, name, "logits must be [N, C, ...], got %s", rt_fmt(b0, sizeof b0, logits));
  if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1))
    return rt_error(site, name, "label_smoothing must be in [0, 1], got %g", o.label_smoothing);
  if (!weight_arg(o.weight, logits, &w, name, site)) return NULL;
  bool soft = ir_is_float(target->dtype); /* class probabilities rather than indices */
  if (soft && (target->ndim != logits->ndim || memcmp(target->sizes, logits->sizes, sizeof(int64_t) * (size_t)logits->ndim)))
    return rt_error(site, name, "probability targets %s must have the logits' shape %s", rt_fmt(b0, sizeof b0, target),
                    rt_fmt(b1, sizeof b1, logits));
  double eps = o.label_smoothing, c = (double)logits->sizes[1];
  FUSED(RT_FUSE_CROSS_ENTROPY, site, 3, ((double[]){(double)o.ignore_index, o.label_smoothing, o.reduction}), logits,
        target, w ? w : EM_NONE);
  BEGIN(site);
  em_tensor *logp = em_log_softmax_at(logits, 1, site), *l = NULL, *valid = EM_NONE;
  /* the weights as [1, C, 1...], to scale logp's class axis */
  int64_t wshape[EM_MAX_DIMS];
  for (int i = 0; i < logits->ndim; i++) wshape[i] = i == 1 ? logits->sizes[1] : 1;
  em_tensor *wb = w ? em_reshape_at(w, logits->ndim, wshape, site) : NULL;
  if (soft) {
    /* torch: -(logp * p * weight).sum(1), the mean over the examples whatever the weights */
    em_tensor *p = eps > 0 ? em_add_scalar_at(em_mul_scalar_at(target, 1 - eps, site), eps / c, site) : target;
    em_tensor *terms = em_mul_at(p, logp, site);
    if (w) terms = em_mul_at(terms, wb, site);
    l = em_neg_at(em_sum_at(terms, 1, (int64_t[]){1}, false, site), site);
  } else {
    em_tensor *t = index_target(target, "class-index targets", name, site), *keep = NULL;
    valid = NULL;
    l = t ? nll_terms(logp, t, o.ignore_index, w, &keep, &valid, name, site) : NULL;
    if (l && eps > 0) {
      /* torch's smoothing term: -sum_c w_c logp_c / C for each counted target (the mean over
       * classes without weights), masked by the ignore mask (not weighted by the target's
       * weight); the mean reduction then divides both terms by the targets' weights. A select,
       * not a product with the mask, for the all-ignored case (see nll_terms). */
      em_tensor *smooth = w ? em_div_scalar_at(em_sum_at(em_mul_at(logp, wb, site), 1, (int64_t[]){1}, false, site), c, site)
                            : em_mean_at(logp, 1, (int64_t[]){1}, false, site);
      em_tensor *counted = keep ? em_ne_scalar_at(keep, 0, site) : NULL;
      smooth = em_where_at(counted, em_neg_at(smooth, site), num(logits->dtype, 0, site), site);
      l = em_add_at(em_mul_scalar_at(l, 1 - eps, site), em_mul_scalar_at(smooth, eps, site), site);
    }
  }
  END(reduce_loss(l, o.reduction, valid, site), site);
}

em_tensor *em_mse_loss_at(em_tensor *x, em_tensor *y, em_reduction reduction, em_site site) {
  if (!x || !y) return NULL;
  if (!float_arg(x, "em_mse_loss", site) || !float_arg(y, "em_mse_loss", site) ||
      !reduction_arg(reduction, "em_mse_loss", site))
    return NULL;
  FUSED(RT_FUSE_MSE_LOSS, site, 1, ((double[]){reduction}), x, y);
  BEGIN(site);
  em_tensor *d = em_sub_at(x, y, site);
  END(reduce_loss(em_mul_at(d, d, site), reduction, EM_NONE, site), site);
}

/* Both public forms: the scope is named for the one called (BEGIN would name this helper). */
static em_tensor *embedding_at(em_tensor *idx, em_tensor *w, em_embedding_opts o, const char *name, em_site site) {
  RT_ARG(idx, name, site);
  RT_ARG(w, name, site);
  char b[128];
  if (w->ndim != 2) return rt_error(site, name, "weight must be [V, D], got %s", rt_fmt(b, sizeof b, w));
  if (idx->dtype != EM_I64 && idx->dtype != EM_I32)
    return rt_error(site, name, "indices must be i64 or i32, got %s", rt_fmt(b, sizeof b, idx));
  if (idx->ndim + 1 > EM_MAX_DIMS) return rt_error(site, name, "indices have too many dims");
  int64_t v = w->sizes[0], pad = o.padding_idx;
  if (o.has_padding_idx && (pad >= v || pad < -v))
    return rt_error(site, name, "padding_idx %lld is outside the %lld rows of weight %s", (long long)pad, (long long)v,
                    rt_fmt(b, sizeof b, w));
  if (pad < 0) pad += v;
  if (!rt_scope_begin_op(name, site)) return NULL;
  int64_t flat = -1, shape[EM_MAX_DIMS];
  memcpy(shape, idx->sizes, sizeof(int64_t) * (size_t)idx->ndim);
  shape[idx->ndim] = w->sizes[1];
  em_tensor *fi = em_reshape_at(idx, 1, &flat, site);
  em_tensor *rows = em_index_select_at(w, 0, fi, site);
  /* torch's padding_idx: the row is read as any other, but the positions that read it pass no
   * gradient to it (a detached copy of the rows there) */
  if (o.has_padding_idx && rows && rows->requires_grad)
    rows = em_where_at(em_unsqueeze_at(em_eq_scalar_at(fi, (double)pad, site), 1, site), em_detach_at(rows, site), rows,
                       site);
  END(em_reshape_at(rows, idx->ndim + 1, shape, site), site);
}

em_tensor *em_embedding_at(em_tensor *idx, em_tensor *w, em_site site) {
  return embedding_at(idx, w, EM_EMBEDDING_DEFAULT, "em_embedding", site);
}

em_tensor *em_embedding_ex_at(em_tensor *idx, em_tensor *w, em_embedding_opts opts, em_site site) {
  return embedding_at(idx, w, opts, "em_embedding_ex", site);
}

/* ---- pooling ---- */

/* One axis of a pooling window, in the coordinates of the input padded on the left by pad:
 * window o covers [o * stride, o * stride + ext), ext = dilation (kernel - 1) + 1. */
typedef struct {
  int64_t k, s, p, d, ext;
  int64_t out;   /* number of windows */
  int64_t used;  /* kernel taps that can reach the padded input at all (fewer than k only when a
                  * ceil_mode window is longer than the padded input): the rest add nothing */
  int64_t right; /* padding the windows' used taps need on the right (may exceed p in ceil mode) */
  bool full;     /* every window lies inside the padded input (not so in ceil mode, maybe) */
} pool_axis;

/* torch's pooling_output_shape: (size + 2 pad - ext) / stride + 1, rounded down or (ceil_mode)
 * up, less the last window in ceil mode when it would start past the input and its left
 * padding. False (error recorded) when no window fits or the sizes overflow. */
static bool pool_axis_size(pool_axis *a, int64_t size, bool ceil_mode, const char *name, em_site site) {
  int64_t span, padded;
  if (!ir_mul_ok(a->d, a->k - 1, &span) || !ir_add_ok(span, 1, &a->ext) || !ir_add_ok(size, 2 * a->p, &padded))
    return rt_error(site, name, "window or padding does not fit in 64 bits"), false;
  int64_t r = padded - a->ext, q = r / a->s, m = r % a->s; /* no overflow: padded >= 0, ext >= 1 */
  a->out = (ceil_mode ? q + (m > 0) : q - (m < 0)) + 1;
  if (ceil_mode && a->out > 1 && (a->out - 1) * a->s >= size + a->p) a->out--;
  if (a->out < 1) return false;
  /* (out - 1) s < size + p by the rule above (or <= size + p - ext without ceil_mode) */
  a->used = padded > 0 && (padded - 1) / a->d + 1 < a->k ? (padded - 1) / a->d + 1 : a->k;
  int64_t covered;
  if (!ir_add_ok((a->out - 1) * a->s, (a->used - 1) * a->d + 1, &covered))
    return rt_error(site, name, "window does not fit in 64 bits"), false;
  a->right = covered - size - a->p;
  int64_t end;
  a->full = ir_add_ok((a->out - 1) * a->s, a->ext, &end) && end <= padded;
  return true;
}

/* Per-window divisor of average pooling along one axis, [out] in dt: as torch's avg_pool2d, the
 * window clipped to the padded input (count_include_pad) or to the input itself. */
static em_tensor *pool_counts(const pool_axis *a, int64_t size, bool include_pad, em_dtype dt, em_site site) {
  em_tensor *start = em_sub_scalar_at(em_mul_scalar_at(em_arange_at(dt, 0, (double)a->out, 1, site), (double)a->s, site),
                                      (double)a->p, site);
  em_tensor *end = em_minimum_scalar_at(em_add_scalar_at(start, (double)a->k, site), (double)(size + a->p), site);
  if (include_pad) return em_sub_at(end, start, site);
  return em_sub_at(em_minimum_scalar_at(end, (double)size, site), em_maximum_scalar_at(start, 0, site), site);
}

static em_tensor *pool(bool is_max, em_tensor *x, em_pool2d_opts o, const char *name, em_site site) {
  if (!x || !float_arg(x, name, site)) return NULL;
  char b[128];
  if (x->ndim != 4) return rt_error(site, name, "needs x [N, C, H, W], got %s", rt_fmt(b, sizeof b, x));
  pool_axis ax[2];
  for (int i = 0; i < 2; i++)
    ax[i] = (pool_axis){o.kernel[i], o.stride[i] ? o.stride[i] : o.kernel[i], o.padding[i], o.dilation[i], 0, 0, 0, 0, false};
  /* ph > kh / 2, not 2 * ph > kh: a padding of INT64_MAX overflowed that product, passed, and
   * made a pad that wrote out of bounds (issue 17) */
  if (ax[0].k < 1 || ax[1].k < 1 || ax[0].s < 1 || ax[1].s < 1 || ax[0].p < 0 || ax[1].p < 0 || ax[0].p > ax[0].k / 2 ||
      ax[1].p > ax[1].k / 2 || ax[0].d < 1 || ax[1].d < 1)
    return rt_error(site, name, "bad window: kernel %lldx%lld, stride %lldx%lld, padding %lldx%lld (padding at most half "
                    "the kernel), dilation %lldx%lld", (long long)ax[0].k, (long long)ax[1].k, (long long)ax[0].s,
                    (long long)ax[1].s, (long long)ax[0].p, (long long)ax[1].p, (long long)ax[0].d, (long long)ax[1].d);
  if (!is_max && (ax[0].d != 1 || ax[1].d != 1))
    return rt_error(site, name, "average pooling has no dilation (as torch), got %lldx%lld", (long long)ax[0].d,
                    (long long)ax[1].d);
  for (int i = 0; i < 2; i++)
    if (!pool_axis_size(&ax[i], x->sizes[2 + i], o.ceil_mode, name, site)) {
      if (!rt_has_error())
        rt_error(site, name, "kernel %lldx%lld%s is larger than the padded input %s", (long long)ax[0].k,
                 (long long)ax[1].k, ax[0].d != 1 || ax[1].d != 1 ? " (dilated)" : "", rt_fmt(b, sizeof b, x));
      return NULL;
    }
  int64_t kh = ax[0].k, kw = ax[1].k, ho = ax[0].out, wo = ax[1].out;
  double div = !is_max && o.divisor_override ? (double)o.divisor_override : (double)kh * (double)kw;
  /* every window holds kh kw elements of the input or its padding, none past the padding */
  bool full = ax[0].full && ax[1].full;
  bool uniform = is_max || o.divisor_override || (full && (o.count_include_pad || (ax[0].p == 0 && ax[1].p == 0)));
  FUSED(is_max ? RT_FUSE_MAX_POOL2D : RT_FUSE_AVG_POOL2D, site, 11,
        ((double[]){(double)o.kernel[0], (double)o.kernel[1], (double)o.stride[0], (double)o.stride[1],
                    (double)o.padding[0], (double)o.padding[1], (double)o.dilation[0], (double)o.dilation[1],
                    o.ceil_mode, o.count_include_pad, (double)o.divisor_override}),
        x);
  if (!rt_scope_begin_op(name, site)) return NULL; /* named for the public op, not this helper */
  if (!is_max && ax[0].s == kh && ax[1].s == kw && ax[0].p == 0 && ax[1].p == 0 && ax[0].d == 1 && ax[1].d == 1 && full) {
    /* Windows tile the input: view it as [N, C, Ho, kh, Wo, kw] (after dropping the rows and
     * columns no window covers) and reduce over the two window axes in one pass. */
    em_tensor *c = em_slice_at(em_slice_at(x, 2, 0, ho * kh, 1, site), 3, 0, wo * kw, 1, site);
    em_tensor *w = em_reshape_at(c, 6, (int64_t[]){x->sizes[0], x->sizes[1], ho, kh, wo, kw}, site);
    END(em_div_scalar_at(em_sum_at(w, 2, (int64_t[]){3, 5}, false, site), div, site), site);
  }
  /* padded on the left by the padding, on the right by what the windows reach (more than the
   * padding in ceil mode; the max ignores it as -inf, the average neither adds nor counts it) */
  int64_t pr[2] = {ax[0].right > 0 ? ax[0].right : 0, ax[1].right > 0 ? ax[1].right : 0};
  em_tensor *p = ax[0].p || ax[1].p || pr[0] || pr[1]
                     ? em_pad_at(x, 4, (int64_t[]){ax[1].p, pr[1], ax[0].p, pr[0]}, is_max ? -INFINITY : 0, site)
                     : x;
  em_tensor *acc = NULL;
  for (int64_t i = 0; i < ax[0].used; i++)
    for (int64_t j = 0; j < ax[1].used; j++) {
      int64_t r0 = i * ax[0].d, c0 = j * ax[1].d;
      em_tensor *win = em_slice_at(em_slice_at(p, 2, r0, r0 + ax[0].s * (ho - 1) + 1, ax[0].s, site), 3, c0,
                                   c0 + ax[1].s * (wo - 1) + 1, ax[1].s, site);
      /* by position, not by acc == NULL: a failed step must stay NULL, not restart the sum */
      if (i == 0 && j == 0) acc = win;
      else if (!is_max) acc = em_add_at(acc, win, site);
      else /* torch's max_pool2d scan: a later element wins when it is larger or NaN, so a tie
            * keeps the first maximum and a NaN window the last NaN; a select rather than
            * maximum (or amax), whose gradients split ties, gives it all the gradient */
        acc = em_where_at(em_logical_or_at(em_gt_at(win, acc, site), em_ne_at(win, win, site), site), win, acc, site);
    }
  if (!is_max && uniform) {
    acc = em_div_scalar_at(acc, div, site);
  } else if (!is_max) {
    em_device prev = em_set_default_device(x->storage->device);
    em_tensor *ch = pool_counts(&ax[0], x->sizes[2], o.count_include_pad, x->dtype, site);
    em_tensor *cw = pool_counts(&ax[1], x->sizes[3], o.count_include_pad, x->dtype, site);
    em_set_default_device(prev);
    acc = em_div_at(acc, em_mul_at(em_unsqueeze_at(ch, 1, site), cw, site), site);
  } else if (acc && ax[0].used * ax[1].used == 1) {
    acc = em_clone_at(acc, site);
  }
  END(acc, site);
}

static em_pool2d_opts pool_opts(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  em_pool2d_opts o = EM_POOL2D_DEFAULT(kh, kw);
  o.stride[0] = sh, o.stride[1] = sw, o.padding[0] = ph, o.padding[1] = pw;
  return o;
}

em_tensor *em_max_pool2d_at(em_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, em_site site) {
  return pool(true, x, pool_opts(kh, kw, sh, sw, ph, pw), "em_max_pool2d", site);
}

em_tensor *em_avg_pool2d_at(em_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, em_site site) {
  return pool(false, x, pool_opts(kh, kw, sh, sw, ph, pw), "em_avg_pool2d", site);
}

em_tensor *em_max_pool2d_ex_at(em_tensor *x, em_pool2d_opts opts, em_site site) {
  return pool(true, x, opts, "em_max_pool2d_ex", site);
}

em_tensor *em_avg_pool2d_ex_at(em_tensor *x, em_pool2d_opts opts, em_site site) {
  return pool(false, x, opts, "em_avg_pool2d_ex", site);
}

/* ---- attention and small helpers ---- */

em_tensor *em_scaled_dot_product_attention_at(em_tensor *q, em_tensor *k, em_tensor *v, bool causal, double dropout_p,
                                              double scale, em_site site) {
  static const char name[] = "em_scaled_dot_product_attention";
  if (!q || !k || !v) return NULL;
  char b0[128], b1[128];
  if (q->ndim < 2 || k->ndim < 2 || v->ndim < 2 || q->sizes[q->ndim - 1] != k->sizes[k->ndim - 1] ||
      k->sizes[k->ndim - 2] != v->sizes[v->ndim - 2])
    return rt_error(site, name, "needs q [..., L, E], k [..., S, E], v [..., S, Ev]; got q %s, k %s", rt_fmt(b0, sizeof b0, q),
                    rt_fmt(b1, sizeof b1, k));
  if (!float_arg(q, name, site)) return NULL;
  if (!(dropout_p >= 0 && dropout_p <= 1)) return rt_error(site, name, "dropout_p must be in [0, 1], got %g", dropout_p);
  if (scale <= 0) scale = 1 / sqrt((double)q->sizes[q->ndim - 1]);
  BEGIN(site);
  em_tensor *s = em_mul_scalar_at(em_matmul_at(q, em_transpose_at(k, -1, -2, site), site), scale, site);
  if (causal) {
    int64_t L = q->sizes[q->ndim - 2], S = k->sizes[k->ndim - 2];
    em_device prev = em_set_default_device(q->storage->device);
    em_tensor *i = em_reshape_at(em_arange_at(EM_I64, 0, (double)L, 1, site), 2, (int64_t[]){L, 1}, site);
    em_tensor *j = em_reshape_at(em_arange_at(EM_I64, 0, (double)S, 1, site), 2, (int64_t[]){1, S}, site);
    em_set_default_device(prev);
    s = em_masked_fill_at(s, em_gt_at(j, i, site), -INFINITY, site);
  }
  em_tensor *a = em_softmax_at(s, -1, site);
  if (dropout_p > 0) a = em_dropout_at(a, dropout_p, true, site);
  END(em_matmul_at(a, v, site), site);
}

/* torch.clamp over tensor bounds (EM_NONE: no bound). The value is min(max(x, lo), hi): lo > hi
 * gives hi everywhere, and a NaN in x or a bound gives NaN, as maximum and minimum propagate it.
 * Their tie rule would hand x half the gradient at a bound, where torch's clamp_backward passes
 * all of it, so when a gradient is wanted the same value is rebuilt as selects that route g as
 * torch's clamp_backward_min_max does: to hi where x > hi or lo > hi, to lo where x < lo < hi,
 * to x elsewhere (lo <= x <= hi). The NaN cases keep the detached min/max value. */
static em_tensor *clamp(em_tensor *x, em_tensor *lo, em_tensor *hi, em_site site) {
  em_tensor *v = x;
  if (lo != EM_NONE) v = em_maximum_at(v, lo, site);
  if (hi != EM_NONE) v = em_minimum_at(v, hi, site);
  bool grad = rt_grad_enabled() && (x->requires_grad || (lo != EM_NONE && lo->requires_grad) ||
                                    (hi != EM_NONE && hi->requires_grad));
  if (!v || !grad || !ir_is_float(v->dtype)) return v;
  em_tensor *r = x;
  if (lo != EM_NONE && hi != EM_NONE) {
    em_tensor *to_hi = em_logical_or_at(em_gt_at(x, hi, site), em_gt_at(lo, hi, site), site);
    em_tensor *to_lo = em_logical_and_at(em_lt_at(x, lo, site), em_lt_at(lo, hi, site), site);
    r = em_where_at(to_hi, hi, em_where_at(to_lo, lo, x, site), site);
  } else if (lo != EM_NONE) {
    r = em_where_at(em_lt_at(x, lo, site), lo, x, site);
  } else {
    r = em_where_at(em_gt_at(x, hi, site), hi, x, site);
  }
  /* promote r to v's dtype, and broadcast it (x may have been the smaller operand) */
  return em_where_at(em_ne_at(v, v, site), em_detach_at(v, site), em_cast_at(r, v->dtype, site), site);
}

em_tensor *em_clamp_at(em_tensor *x, double lo, double hi, em_site site) {
  if (!x) return NULL;
  BEGIN(site);
  /* number bounds as CPU scalars of the dtype torch.result_type gives them (an integer x with a
   * fractional bound is f32), so they join x on any device */
  em_tensor *l = lo == -INFINITY ? EM_NONE : num(ir_promote_scalar(x->dtype, lo != trunc(lo)), lo, site);
  em_tensor *h = hi == INFINITY ? EM_NONE : num(ir_promote_scalar(x->dtype, hi != trunc(hi)), hi, site);
  em_tensor *r = !l || !h ? NULL : l == EM_NONE && h == EM_NONE ? em_clone_at(x, site) : clamp(x, l, h, site);
  END(r, site);
}

em_tensor *em_clamp_tensor_at(em_tensor *x, em_tensor *lo, em_tensor *hi, em_site site) {
  if (!x || !lo || !hi) return NULL;
  if (!rt_tensor_arg(x, "em_clamp_tensor", site)) return NULL;
  if (lo == EM_NONE && hi == EM_NONE)
    return rt_error(site, "em_clamp_tensor", "needs at least one of lo and hi (both are EM_NONE)");
  if ((lo != EM_NONE && !rt_tensor_arg(lo, "em_clamp_tensor", site)) ||
      (hi != EM_NONE && !rt_tensor_arg(hi, "em_clamp_tensor", site)))
    return NULL;
  BEGIN(site);
  END(clamp(x, lo, hi, site), site);
}

/* torch.round: to nearest, halves to even. From floor: d = x - floor(x) is exact, so the tie
 * test is exact too (no x + 0.5, which rounds for |x| near 2^23 in f32). Integral x (any size)
 * has d = 0 and stays; NaN and inf come out of the last select unchanged (f + 1 is still NaN
 * or inf). A zero result takes x's sign (-0.4 rounds to -0.0, as torch) through x * 0. */
em_tensor *em_round_at(em_tensor *x, em_site site) {
  if (!x || !rt_tensor_arg(x, "em_round", site)) return NULL;
  BEGIN(site);
  if (!ir_is_float(x->dtype)) END(em_clone_at(x, site), site);
  em_tensor *f = em_floor_at(x, site), *d = em_sub_at(x, f, site), *up = em_add_scalar_at(f, 1, site);
  em_tensor *even = em_eq_scalar_at(em_remainder_scalar_at(f, 2, site), 0, site);
  em_tensor *tie = em_where_at(even, f, up, site);
  em_tensor *r = em_where_at(em_gt_scalar_at(d, 0.5, site), up, em_where_at(em_lt_scalar_at(d, 0.5, site), f, tie, site), site);
  END(em_where_at(em_eq_scalar_at(r, 0, site), em_mul_scalar_at(x, 0, site), r, site), site);
}

/* torch.trunc: towards zero (ceil of a negative keeps -0.0 for -0.5, as torch). */
em_tensor *em_trunc_at(em_tensor *x, em_site site) {
  if (!x || !rt_tensor_arg(x, "em_trunc", site)) return NULL;
  BEGIN(site);
  if (!ir_is_float(x->dtype)) END(em_clone_at(x, site), site);
  END(em_where_at(em_lt_scalar_at(x, 0, site), em_ceil_at(x, site), em_floor_at(x, site), site), site);
}

/* torch.frac: x - trunc(x). torch has no integer kernel for it, and neither does Ember. */
em_tensor *em_frac_at(em_tensor *x, em_site site) {
  if (!x || !float_arg(x, "em_frac", site)) return NULL;
  BEGIN(site);
  END(em_sub_at(x, em_trunc_at(x, site), site), site);
}

em_tensor *em_one_hot_at(em_tensor *idx, int64_t n, em_site site) {
  if (!idx) return NULL;
  char b[128];
  if (n < 1 && n != -1) return rt_error(site, "em_one_hot", "needs at least one class (or -1), got %lld", (long long)n);
  if (n == -1 && idx != EM_NONE && idx->numel == 0) /* torch's message, near enough */
    return rt_error(site, "em_one_hot", "cannot infer the number of classes from empty indices %s", rt_fmt(b, sizeof b, idx));
  BEGIN(site);
  em_tensor *t = index_target(idx, "indices", "em_one_hot", site);
  if (t && n == -1) {
    /* torch's num_classes=-1: the largest index + 1, read back to the host (a sync, and a graph
     * break when traced: the result's shape depends on it) */
    int64_t top = 0;
    if (!em_to_buffer_at(em_amax_at(t, 0, NULL, false, site), EM_I64, &top, sizeof top, site)) t = NULL;
    else if (top == INT64_MAX) t = rt_error(site, "em_one_hot", "index %lld leaves no class count", (long long)top);
    else n = top + 1; /* a negative largest index makes n < 1: refused below as out of range */
  }
  /* A count rather than a max, so that empty indices (which have no max) pass. Reading the count
   * back is a sync point, worth it: an out-of-range index would otherwise give a silent zero row. */
  em_tensor *bad = t ? em_logical_or_at(em_lt_scalar_at(t, 0, site), em_ge_scalar_at(t, (double)n, site), site) : NULL;
  double n_bad = bad ? em_item_at(em_sum_at(bad, 0, NULL, false, site), site) : NAN;
  if (n_bad > 0 || (t && n < 1)) {
    em_scope_end_at(site);
    return rt_error(site, "em_one_hot", "an index is outside [0, %lld)", (long long)(n > 0 ? n : 0));
  }
  em_device prev = em_set_default_device(t ? t->storage->device : EM_CPU);
  em_tensor *r = n_bad == 0 ? em_cast_at(em_eq_at(em_unsqueeze_at(t, -1, site), em_arange_at(EM_I64, 0, (double)n, 1, site),
                                                  site), EM_I64, site)
                            : NULL;
  em_set_default_device(prev);
  END(r, site);
}

em_tensor *em_masked_fill_at(em_tensor *x, em_tensor *mask, double value, em_site site) {
  if (!x || !mask || !rt_tensor_arg(x, "em_masked_fill", site) || !rt_tensor_arg(mask, "em_masked_fill", site))
    return NULL;
  char b0[128], b1[128];
  if (mask->dtype != EM_BOOL)
    return rt_error(site, "em_masked_fill", "mask must be bool, got %s", rt_fmt(b0, sizeof b0, mask));
  /* the mask broadcasts to x, never x to the mask: the result has x's shape */
  bool ok = mask->ndim <= x->ndim;
  for (int i = 1; ok && i <= mask->ndim; i++) {
    int64_t m = mask->sizes[mask->ndim - i];
    ok = m == 1 || m == x->sizes[x->ndim - i];
  }
  if (!ok)
    return rt_error(site, "em_masked_fill", "mask %s does not broadcast to x %s", rt_fmt(b0, sizeof b0, mask),
                    rt_fmt(b1, sizeof b1, x));
  /* as torch: an infinite, NaN or out-of-range value has no integer to become */
  if (!ir_value_fits(x->dtype, value))
    return rt_error(site, "em_masked_fill", "value %g cannot fill x %s without overflow", value, rt_fmt(b0, sizeof b0, x));
  BEGIN(site);
  END(em_where_at(mask, num(x->dtype, value, site), x, site), site);
}

/* ---- torch's keyword options (issue 21): alpha, rounding_mode ---- */

/* torch refuses a fractional alpha where the result is an integer ("For integral input tensors,
 * argument alpha must not be a floating point number"); a bool result takes alpha 1 only here
 * (torch would cast alpha to bool, which is rarely what was meant). */
static em_tensor *alpha_op(bool sub, em_tensor *a, em_tensor *b, double alpha, em_site site) {
  const char *name = sub ? "em_sub_alpha" : "em_add_alpha";
  RT_ARG(a, name, site);
  RT_ARG(b, name, site);
  char b0[128], b1[128];
  em_dtype dt = rt_result_type(a, b);
  if (!ir_is_float(dt) && !(isfinite(alpha) && alpha == trunc(alpha)))
    return rt_error(site, name, "alpha %g must be an integer for integer operands: a is %s, b is %s", alpha,
                    rt_fmt(b0, sizeof b0, a), rt_fmt(b1, sizeof b1, b));
  if (dt == EM_BOOL && alpha != 1)
    return rt_error(site, name, "bool operands take alpha 1 only, got %g", alpha);
  if (!ir_is_float(dt) && !ir_value_fits(dt, alpha)) /* as torch: an alpha the result dtype cannot hold */
    return rt_error(site, name, "alpha %g does not fit the result dtype %s", alpha, em_dtype_name(dt));
  if (!rt_scope_begin_op(name, site)) return NULL; /* named for the public op, not this helper */
  em_tensor *s = b;
  if (alpha != 1) {
    /* an integer b joining a float a is scaled in a's dtype, as torch computes in the result's
     * dtype (an integer product could overflow where torch's does not) */
    if (ir_is_float(a->dtype) && !ir_is_float(b->dtype)) s = em_cast_at(b, a->dtype, site);
    s = em_mul_scalar_at(s, alpha, site);
  }
  END(sub ? em_sub_at(a, s, site) : em_add_at(a, s, site), site);
}

em_tensor *em_add_alpha_at(em_tensor *a, em_tensor *b, double alpha, em_site site) {
  return alpha_op(false, a, b, alpha, site);
}

em_tensor *em_sub_alpha_at(em_tensor *a, em_tensor *b, double alpha, em_site site) {
  return alpha_op(true, a, b, alpha, site);
}

/* floor(a / b) of integers, exact for all of i64: the remainder r (the divisor's sign, exact,
 * and the check that refuses a zero divisor) makes a - r a multiple of b; a quotient q0 from f64
 * is off by at most a few thousand for |a| near 2^63, so e = a - r - q0 b, computed with
 * wrapping integer arithmetic, is that small multiple of b exactly, and f64 gives e / b exactly.
 * Returns the floor quotient and, through *rem, r. All i64. */
static em_tensor *int_floor_div(em_tensor *a, em_tensor *b, em_tensor **rem, em_site site) {
  em_tensor *r = em_remainder_at(a, b, site);
  em_tensor *af = em_cast_at(a, EM_F64, site), *bf = em_cast_at(b, EM_F64, site);
  em_tensor *q0 = em_cast_at(em_floor_at(em_div_at(af, bf, site), site), EM_I64, site);
  em_tensor *e = em_sub_at(em_sub_at(a, r, site), em_mul_at(q0, b, site), site);
  em_tensor *k = em_floor_at(em_add_scalar_at(em_div_at(em_cast_at(e, EM_F64, site), bf, site), 0.5, site), site);
  *rem = r;
  return em_add_at(q0, em_cast_at(k, EM_I64, site), site);
}

/* torch's div_floor_floating: mod = fmod(a, b), (a - mod) / b, less 1 where mod's sign is not
 * b's, rounded to the nearest integer from its floor; a zero quotient keeps the sign of a / b,
 * and b = 0 gives a / b. fmod is the remainder taken with a divisor of a's sign (exact: no
 * correction is needed then). */
static em_tensor *float_floor_div(em_tensor *a, em_tensor *b, em_site site) {
  em_dtype dt = a->dtype;
  em_tensor *q = em_div_at(a, b, site);
  em_tensor *ab = em_abs_at(b, site);
  em_tensor *mod = em_remainder_at(a, em_where_at(em_lt_scalar_at(a, 0, site), em_neg_at(ab, site), ab, site), site);
  em_tensor *d = em_div_at(em_sub_at(a, mod, site), b, site);
  em_tensor *off = em_logical_and_at(em_ne_scalar_at(mod, 0, site),
                                     em_ne_at(em_lt_scalar_at(b, 0, site), em_lt_scalar_at(mod, 0, site), site), site);
  d = em_where_at(off, em_sub_scalar_at(d, 1, site), d, site);
  em_tensor *fl = em_floor_at(d, site);
  fl = em_where_at(em_gt_scalar_at(em_sub_at(d, fl, site), 0.5, site), em_add_scalar_at(fl, 1, site), fl, site);
  /* copysign(0, q): q's sign bit, -0 included (1 / -0 is -inf) */
  em_tensor *neg = em_logical_or_at(em_lt_scalar_at(q, 0, site),
                                    em_logical_and_at(em_eq_scalar_at(q, 0, site),
                                                      em_lt_scalar_at(em_reciprocal_at(q, site), 0, site), site), site);
  em_tensor *zero = em_where_at(neg, num(dt, -0.0, site), num(dt, 0.0, site), site);
  fl = em_where_at(em_eq_scalar_at(d, 0, site), zero, fl, site);
  return em_where_at(em_eq_scalar_at(b, 0, site), q, fl, site);
}

em_tensor *em_div_mode_at(em_tensor *a, em_tensor *b, em_rounding_mode mode, em_site site) {
  static const char name[] = "em_div_mode";
  RT_ARG(a, name, site);
  RT_ARG(b, name, site);
  char b0[128], b1[128];
  if (mode != EM_ROUND_NONE && mode != EM_ROUND_TRUNC && mode != EM_ROUND_FLOOR)
    return rt_error(site, name, "unknown rounding mode %d", (int)mode);
  if (mode == EM_ROUND_NONE) {
    BEGIN(site);
    END(em_div_at(a, b, site), site);
  }
  em_dtype dt = rt_result_type(a, b);
  if (dt == EM_BOOL) /* torch has no rounding division of bools either */
    return rt_error(site, name, "needs numeric operands, got a %s and b %s", rt_fmt(b0, sizeof b0, a), rt_fmt(b1, sizeof b1, b));
  BEGIN(site);
  em_tensor *ac = a->dtype == dt ? a : em_cast_at(a, dt, site), *bc = b->dtype == dt ? b : em_cast_at(b, dt, site);
  em_tensor *r = NULL;
  if (ac && bc && !ir_is_float(dt)) {
    em_tensor *ai = em_cast_at(ac, EM_I64, site), *bi = em_cast_at(bc, EM_I64, site), *rem = NULL;
    r = int_floor_div(ai, bi, &rem, site);
    if (r && mode == EM_ROUND_TRUNC) { /* floor + 1 where the division was inexact and the signs differ */
      em_tensor *up = em_logical_and_at(em_ne_scalar_at(rem, 0, site),
                                        em_ne_at(em_lt_scalar_at(ai, 0, site), em_lt_scalar_at(bi, 0, site), site), site);
      r = em_add_at(r, em_cast_at(up, EM_I64, site), site);
    }
    if (r && dt != EM_I64) r = em_cast_at(r, dt, site);
  } else if (ac && bc && mode == EM_ROUND_TRUNC) { /* torch's div_trunc: trunc(a / b) */
    r = em_trunc_at(em_div_at(ac, bc, site), site);
  } else if (ac && bc) {
    r = float_floor_div(ac, bc, site);
  }
  /* The gradient is zero for both operands, as torch's (grad * 0), b = 0 included (where the
   * floor mode's a / b would pass one): the result is detached, then joined to a + b by a
   * select that never picks it, which passes zeros and makes the result require grad. */
  if (r && (em_requires_grad(ac) || em_requires_grad(bc)))
    r = em_where_at(num(EM_BOOL, 0, site), em_add_at(ac, bc, site), em_detach_at(r, site), site);
  END(r, site);
}
