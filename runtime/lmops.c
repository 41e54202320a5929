/* runtime/lmops.c: the ops a language-model user reaches for: cumulative sums and products,
 * sorting (argsort, sort, topk), sampling (multinomial), splitting into views (split, chunk),
 * triangular masks (tril, triu) and gradient clipping (clip_grad_norm_).
 *
 * Two prims carry the work no decomposition does well (prims/scan.c says why): the scans
 * (CUMSUM, CUMPROD) and ARGSORT. Everything else here is a decomposition into prims through the
 * op API, so it runs eagerly, traces into compiled graphs and differentiates like any op:
 *  - sort and topk are argsort followed by gather, so the values' gradient is gather's rule
 *    (the gradient scattered back to the sorted positions) and the indices carry none; a TOPK
 *    prim would save the full sort only when k is small, not worth a second sort kernel per
 *    device;
 *  - multinomial is torch's own algorithm in prims: without replacement (or for one sample) the
 *    exponential race, topk of p / E; with replacement an inverse-CDF search, done as one stable
 *    argsort of the uniforms merged with the CDF (O((C + S) log(C + S)) per row, where comparing
 *    every draw with every category would be O(C S));
 *  - split and chunk are slices (views);
 *  - tril and triu are where() over a mask built from two iotas, which broadcasts over the batch;
 *  - clip_grad_norm_ is reductions and one in-place multiply per gradient, with the clip
 *    coefficient kept a 0-dim tensor: no value comes back to the host, so a compiled training
 *    step keeps it in its graph. */
#include "rt.h"

#include <math.h>
#include <string.h>

/* Each op opens a scope named after it (rt_scope_begin_op(__func__), so errors from the ops
 * inside name the op called) and closes it keeping only its result: */
static em_tensor *end_op(em_tensor *r, em_site site) {
  em_tensor *kept = em_keep_at(r, site);
  em_scope_end_at(site);
  return kept;
}

/* The axis of x (a 0-dim x takes 0 or -1) in [0, max(ndim, 1)), or -1 with an error. */
static int axis_arg(const em_tensor *x, int axis, const char *name, em_site site) {
  int a = ir_norm_axis(axis, x->ndim ? x->ndim : 1);
  if (a < 0) {
    char b[128];
    rt_error(site, name, "axis %d out of range for %s", axis, rt_fmt(b, sizeof b, x));
  }
  return a;
}

static int64_t size_along(const em_tensor *x, int a) { return x->ndim ? x->sizes[a] : 1; }

/* ---- scans and sorting ----------------------------------------------------------------------- */

static em_tensor *along(em_prim op, const char *name, em_tensor *x, int axis, bool descending, em_site site) {
  if (!x) return NULL;
  prim_attrs at = {.n_axes = 1, .axes = {axis}, .descending = descending};
  return rt_scope_add(rt_dispatch(name, op, &x, 1, &at, site), name, site);
}

em_tensor *em_cumsum_at(em_tensor *x, int axis, em_site site) { return along(EM_PRIM_CUMSUM, "em_cumsum", x, axis, false, site); }

em_tensor *em_cumprod_at(em_tensor *x, int axis, em_site site) {
  return along(EM_PRIM_CUMPROD, "em_cumprod", x, axis, false, site);
}

em_tensor *em_argsort_at(em_tensor *x, int axis, bool descending, em_site site) {
  return along(EM_PRIM_ARGSORT, "em_argsort", x, axis, descending, site);
}

/* The values of x at idx along axis, and idx, both kept in the enclosing scope (the caller's
 * rt_scope_begin_op opened the current one, which this closes). */
static em_tensor *values_at(em_tensor *x, int axis, em_tensor *idx, em_tensor **indices, em_site site) {
  em_tensor *v = idx ? em_gather_at(x, axis, idx, site) : NULL;
  if (v && indices) {
    *indices = em_keep_at(idx, site);
    if (!*indices) v = NULL;
  }
  em_tensor *kept = v ? em_keep_at(v, site) : NULL;
  em_scope_end_at(site);
  if (!kept && indices) *indices = NULL; /* released with the scope */
  return kept;
}

em_tensor *em_sort_at(em_tensor *x, int axis, bool descending, em_tensor **indices, em_site site) {
  if (indices) *indices = NULL;
  if (!x || !rt_tensor_arg(x, "em_sort", site)) return NULL;
  if (!rt_scope_begin_op(__func__, site)) return NULL;
  return values_at(x, axis, em_argsort_at(x, axis, descending, site), indices, site);
}

em_tensor *em_topk_at(em_tensor *x, int64_t k, int axis, bool largest, bool sorted, em_tensor **indices,
                      em_site site) {
  (void)sorted; /* always sorted: an order torch's sorted=False allows too */
  if (indices) *indices = NULL;
  if (!x || !rt_tensor_arg(x, "em_topk", site)) return NULL;
  int a = axis_arg(x, axis, "em_topk", site);
  if (a < 0) return NULL;
  if (k < 0 || k > size_along(x, a) || (x->ndim == 0 && k != 1)) {
    char b[128];
    return rt_error(site, "em_topk", "k = %lld is out of range for axis %d of %s (size %lld)", (long long)k, axis,
                    rt_fmt(b, sizeof b, x), (long long)size_along(x, a));
  }
  if (!rt_scope_begin_op(__func__, site)) return NULL;
  /* the first k of the sorted order, made contiguous so the result does not keep the whole sort */
  em_tensor *order = em_argsort_at(x, a, largest, site);
  em_tensor *idx = x->ndim ? em_contiguous_at(em_slice_at(order, a, 0, k, 1, site), site) : order;
  return values_at(x, a, idx, indices, site);
}

/* ---- multinomial ----------------------------------------------------------------------------- */

/* torch.multinomial's checks on the values, read back in one transfer: elements that are
 * negative, infinite or NaN; rows summing to 0; without replacement, rows with fewer than
 * num_samples non-zero categories. p is [N, C]. */
static bool probs_ok(em_tensor *p, int64_t num_samples, bool replacement, em_site site) {
  static const char name[] = "em_multinomial";
  int64_t one = 1, last = -1;
  em_tensor *finite_nonneg = em_logical_and_at(em_ge_scalar_at(p, 0, site), em_lt_scalar_at(p, INFINITY, site), site);
  em_tensor *n_bad = em_sum_at(em_logical_not_at(finite_nonneg, site), 0, NULL, false, site);
  em_tensor *n_zero_rows = em_sum_at(em_eq_scalar_at(em_sum_at(p, 1, &last, false, site), 0, site), 0, NULL, false, site);
  em_tensor *n_short_rows = replacement ? em_scalar_at(EM_I64, 0, site)
                                        : em_sum_at(em_lt_scalar_at(em_sum_at(em_gt_scalar_at(p, 0, site), 1, &last,
                                                                              false, site),
                                                                    (double)num_samples, site),
                                                    0, NULL, false, site);
  em_tensor *parts[3] = {em_reshape_at(n_bad, 1, &one, site), em_reshape_at(n_zero_rows, 1, &one, site),
                         em_reshape_at(n_short_rows, 1, &one, site)};
  double counts[3];
  em_tensor *all = parts[0] && parts[1] && parts[2] ? em_cat_at(3, parts, 0, site) : NULL;
  if (!all || !em_to_buffer_at(all, EM_F64, counts, sizeof counts, site)) return false;
  if (counts[0] > 0) return rt_error(site, name, "probability tensor contains either inf, nan or element < 0"), false;
  if (counts[1] > 0) return rt_error(site, name, "invalid multinomial distribution (sum of probabilities <= 0)"), false;
  if (counts[2] > 0)
    return rt_error(site, name, "invalid multinomial distribution (with replacement=False, not enough non-negative "
                    "category to sample): a row has fewer than %lld non-zero probabilities", (long long)num_samples),
           false;
  return true;
}

/* Without replacement, or one sample: the num_samples largest of p / E, E ~ Exp(1) drawn as
 * -log(1 - u), u uniform in [0, 1) (Efraimidis & Spirakis 2006; torch's "exponential race"). A
 * zero category scores -1, below every positive one (p / E >= 0, +inf when E is 0), so it is never
 * drawn. p is [N, C] f64. */
static em_tensor *draw_race(em_tensor *p, int64_t num_samples, em_site site) {
  em_tensor *u = em_rand_at(EM_F64, p->ndim, p->sizes, site);
  em_tensor *e = em_neg_at(em_log1p_at(em_neg_at(u, site), site), site);
  em_tensor *score = em_where_at(em_gt_scalar_at(p, 0, site), em_div_at(p, e, site), em_scalar_at(EM_F64, -1, site), site);
  if (num_samples == 1) return em_argmax_at(score, 1, true, site);
  em_tensor *idx = NULL;
  return em_topk_at(score, num_samples, 1, true, true, &idx, site) ? idx : NULL;
}

/* With replacement: draw s is the first category whose CDF reaches u_s, u_s uniform in (0, 1],
 * i.e. the number of CDF values below u_s (torch's binary search). The CDF is normalised by its
 * last value, so it ends at exactly 1 and zero categories repeat the value before them: a draw
 * never lands on them. All draws of a row are placed at once: a stable ascending argsort of
 * [u, cdf] (the draws first, so a CDF value equal to a draw sorts after it) puts draw s at a
 * position whose count of CDF values before it is its category; that count is a cumsum over the
 * sorted order, scattered back to the draws' places. p is [N, C] f64. */
static em_tensor *draw_search(em_tensor *p, int64_t num_samples, em_site site) {
  int64_t n = p->sizes[0], c = p->sizes[1], s = num_samples;
  em_tensor *sums = em_cumsum_at(p, 1, site);
  em_tensor *cdf = em_div_at(sums, em_slice_at(sums, 1, c - 1, c, 1, site), site);
  em_tensor *u = em_add_scalar_at(em_neg_at(em_rand_at(EM_F64, 2, (int64_t[]){n, s}, site), site), 1, site);
  em_tensor *order = em_argsort_at(em_cat_at(2, (em_tensor *[]){u, cdf}, 1, site), 1, false, site);
  em_tensor *cdf_before = em_cumsum_at(em_ge_scalar_at(order, (double)s, site), 1, site);
  em_tensor *at_draws = em_scatter_add_at(em_zeros_at(EM_I64, 2, (int64_t[]){n, s + c}, site), 1, order, cdf_before, site);
  return em_slice_at(at_draws, 1, 0, s, 1, site);
}

em_tensor *em_multinomial_at(em_tensor *probs, int64_t num_samples, bool replacement, em_site site) {
  static const char name[] = "em_multinomial";
  if (!probs || !rt_tensor_arg(probs, name, site)) return NULL;
  char b[128];
  if (probs->ndim != 1 && probs->ndim != 2)
    return rt_error(site, name, "probs must be 1-D or 2-D, got %s", rt_fmt(b, sizeof b, probs));
  if (!ir_is_float(probs->dtype)) return rt_error(site, name, "probs must be floating, got %s", rt_fmt(b, sizeof b, probs));
  int64_t c = probs->sizes[probs->ndim - 1];
  if (c == 0) return rt_error(site, name, "probs %s has no categories", rt_fmt(b, sizeof b, probs));
  if (num_samples < 1) return rt_error(site, name, "cannot draw %lld samples (needs >= 1)", (long long)num_samples);
  if (!replacement && num_samples > c)
    return rt_error(site, name, "cannot draw %lld samples without replacement from %lld categories (probs %s)",
                    (long long)num_samples, (long long)c, rt_fmt(b, sizeof b, probs));
  /* the draws sort beside the categories ([N, s + c]): that must be a shape at all (s near
   * INT64_MAX overflowed s + c: found by UBSan on the bad-argument table) */
  int64_t rows = probs->ndim == 2 ? probs->sizes[0] : 1, width;
  if (!ir_add_ok(num_samples, c, &width) || !ir_shape_fits(2, (int64_t[]){rows, width}))
    return rt_error(site, name, "cannot draw %lld samples from probs %s: too many to hold", (long long)num_samples,
                    rt_fmt(b, sizeof b, probs));
  if (!rt_scope_begin_op(__func__, site)) return NULL;
  em_tensor *p = em_cast_at(probs->ndim == 1 ? em_unsqueeze_at(probs, 0, site) : probs, EM_F64, site);
  if (!p || !probs_ok(p, num_samples, replacement, site)) return end_op(NULL, site);
  em_device prev = em_set_default_device(probs->storage->device); /* the draws are made where probs live */
  em_tensor *r = !replacement || num_samples == 1 ? draw_race(p, num_samples, site) : draw_search(p, num_samples, site);
  em_set_default_device(prev);
  if (r && probs->ndim == 1) r = em_squeeze_at(r, 1, (int64_t[]){0}, site);
  return end_op(em_contiguous_at(r, site), site);
}

/* ---- split and chunk ------------------------------------------------------------------------- */

/* Writes the slices of x along a of the n given lengths into out; returns n or -1 (out NULLed). */
static int slices(em_tensor *x, int a, int n, const int64_t *len, int64_t each, em_tensor **out, em_site site) {
  int64_t start = 0, size = x->sizes[a];
  for (int i = 0; i < n; i++) {
    int64_t l = len ? len[i] : (size - start < each ? size - start : each);
    out[i] = em_slice_at(x, a, start, start + l, 1, site);
    start += l;
    if (!out[i]) {
      for (int j = 0; j < i; j++) out[j] = NULL; /* the scope still owns them: nothing leaks */
      return -1;
    }
  }
  return n;
}

/* Checks shared by split and chunk: x has dims, axis is one of them, out can hold count pieces
 * (out NULL with max_out 0: a query). Returns the axis, or -1 with an error. */
static int pieces_arg(em_tensor *x, int axis, int64_t count, em_tensor **out, int max_out, const char *name, em_site site) {
  char b[128];
  if (x->ndim == 0) return rt_error(site, name, "needs at least one dim, got %s", rt_fmt(b, sizeof b, x)), -1;
  int a = axis_arg(x, axis, name, site);
  if (a < 0 || (!out && max_out == 0)) return a;
  if (!out || count > max_out)
    return rt_error(site, name, "splitting %s along axis %d makes %lld pieces; out has room for %d", rt_fmt(b, sizeof b, x),
                    axis, (long long)count, out ? max_out : 0),
           -1;
  return a;
}

int em_split_at(em_tensor *x, int64_t split_size, int axis, em_tensor **out, int max_out, em_site site) {
  static const char name[] = "em_split";
  if (!x || !rt_tensor_arg(x, name, site)) return -1;
  int a = axis_arg(x, axis, name, site);
  if (a < 0) return -1;
  int64_t size = size_along(x, a);
  if (split_size < 0 || (split_size == 0 && size > 0)) {
    char b[128];
    return rt_error(site, name, "split_size must be >= 1 (0 only for an axis of size 0), got %lld for axis %d of %s",
                    (long long)split_size, axis, rt_fmt(b, sizeof b, x)),
           -1;
  }
  int64_t count = size == 0 ? 1 : size / split_size + (size % split_size != 0);
  if (pieces_arg(x, axis, count, out, max_out, name, site) < 0) return -1;
  if (!out) return (int)count;
  return slices(x, a, (int)count, NULL, split_size, out, site);
}

int em_split_sizes_at(em_tensor *x, int n_sizes, const int64_t *sizes, int axis, em_tensor **out, em_site site) {
  static const char name[] = "em_split_sizes";
  if (!x || !rt_tensor_arg(x, name, site)) return -1;
  char b[128];
  if (n_sizes < 1 || !sizes || !out)
    return rt_error(site, name, "needs n_sizes >= 1, sizes and out, got %d sizes%s%s", n_sizes, sizes ? "" : ", sizes NULL",
                    out ? "" : ", out NULL"),
           -1;
  int a = pieces_arg(x, axis, n_sizes, out, n_sizes, name, site);
  if (a < 0) return -1;
  int64_t total = 0;
  for (int i = 0; i < n_sizes; i++)
    if (sizes[i] < 0 || !ir_add_ok(total, sizes[i], &total))
      return rt_error(site, name, "size %d is %lld: sizes must be >= 0 and add up to %lld", i, (long long)sizes[i],
                      (long long)x->sizes[a]),
             -1;
  if (total != x->sizes[a])
    return rt_error(site, name, "sizes add up to %lld, but axis %d of %s has size %lld", (long long)total, axis,
                    rt_fmt(b, sizeof b, x), (long long)x->sizes[a]),
           -1;
  return slices(x, a, n_sizes, sizes, 0, out, site);
}

int em_chunk_at(em_tensor *x, int chunks, int axis, em_tensor **out, int max_out, em_site site) {
  static const char name[] = "em_chunk";
  if (!x || !rt_tensor_arg(x, name, site)) return -1;
  if (chunks < 1) return rt_error(site, name, "chunks must be >= 1, got %d", chunks), -1;
  int a = x->ndim ? axis_arg(x, axis, name, site) : 0;
  if (a < 0) return -1;
  int64_t size = size_along(x, a), each = size / chunks + (size % chunks != 0);
  /* as torch.chunk: pieces of ceil(size / chunks), so fewer pieces when they run out; an empty
   * axis gives `chunks` empty pieces */
  int64_t count = size == 0 ? chunks : size / each + (size % each != 0);
  if (pieces_arg(x, axis, count, out, max_out, name, site) < 0) return -1;
  if (!out) return (int)count;
  return slices(x, a, (int)count, NULL, each, out, site);
}

/* ---- tril and triu ------------------------------------------------------------------------- */

static em_tensor *triangle(em_tensor *x, int64_t diagonal, bool lower, const char *name, em_site site) {
  if (!x || !rt_tensor_arg(x, name, site)) return NULL;
  char b[128];
  if (x->ndim < 2) return rt_error(site, name, "needs at least 2 dims, got %s", rt_fmt(b, sizeof b, x));
  int64_t m = x->sizes[x->ndim - 2], n = x->sizes[x->ndim - 1];
  /* j - i lies in [-(m - 1), n - 1]: a diagonal beyond that keeps all or nothing, and clamped
   * it stays exact as the double a scalar comparison takes */
  double d = (double)(diagonal < -m ? -m : diagonal > n ? n : diagonal);
  if (!rt_scope_begin_op(name, site)) return NULL;
  em_device prev = em_set_default_device(x->storage->device);
  em_tensor *i = em_reshape_at(em_arange_at(EM_I64, 0, (double)m, 1, site), 2, (int64_t[]){m, 1}, site);
  em_tensor *j = em_reshape_at(em_arange_at(EM_I64, 0, (double)n, 1, site), 2, (int64_t[]){1, n}, site);
  em_tensor *zero = em_scalar_at(x->dtype, 0, site);
  em_set_default_device(prev);
  em_tensor *offset = em_sub_at(j, i, site); /* [m, n]: j - i */
  em_tensor *keep = lower ? em_le_scalar_at(offset, d, site) : em_ge_scalar_at(offset, d, site);
  return end_op(em_where_at(keep, x, zero, site), site);
}

em_tensor *em_tril_at(em_tensor *x, int64_t diagonal, em_site site) { return triangle(x, diagonal, true, "em_tril", site); }
em_tensor *em_triu_at(em_tensor *x, int64_t diagonal, em_site site) { return triangle(x, diagonal, false, "em_triu", site); }

/* ---- clip_grad_norm_ ------------------------------------------------------------------------ */

/* The norm_type-norm of t (f32 or f64) as a 0-dim tensor of dtype dt. */
static em_tensor *norm_of(em_tensor *t, double p, em_dtype dt, em_site site) {
  t = em_cast_at(t, dt, site);
  if (isinf(p)) return em_amax_at(em_abs_at(t, site), 0, NULL, false, site);
  if (p == 2) return em_sqrt_at(em_sum_at(em_mul_at(t, t, site), 0, NULL, false, site), site);
  if (p == 1) return em_sum_at(em_abs_at(t, site), 0, NULL, false, site);
  return em_pow_scalar_at(em_sum_at(em_pow_scalar_at(em_abs_at(t, site), p, site), 0, NULL, false, site), 1 / p, site);
}

em_tensor *em_clip_grad_norm__at(int n, em_tensor *const *params, double max_norm, double norm_type, em_site site) {
  static const char name[] = "em_clip_grad_norm_";
  if (n < 0 || (n > 0 && !params)) return rt_error(site, name, "needs n >= 0 parameters and the array, got n = %d%s", n,
                                                   params ? "" : " and params NULL");
  if (!(max_norm >= 0)) return rt_error(site, name, "max_norm must be >= 0, got %g", max_norm);
  if (!(norm_type > 0)) return rt_error(site, name, "norm_type must be > 0 (or INFINITY), got %g", norm_type);
  em_dtype dt = EM_F32;
  int with_grad = 0;
  for (int i = 0; i < n; i++) {
    if (!params[i] || !rt_tensor_arg(params[i], name, site)) return NULL;
    em_tensor *g = em_get_grad(params[i]);
    if (!g) continue;
    with_grad++;
    if (g->dtype == EM_F64) dt = EM_F64;
  }
  if (!rt_scope_begin_op(__func__, site)) return NULL;
  if (!with_grad) return end_op(em_scalar_at(EM_F32, 0, site), site);
  em_no_grad_begin();
  /* each gradient's norm, then the norm of those norms, as torch does (the same rounding) */
  em_tensor **norms = rt_alloc(sizeof(em_tensor *) * (size_t)with_grad, 16);
  em_tensor *total = NULL;
  if (!norms) rt_error(site, name, "out of memory");
  int k = 0;
  for (int i = 0; norms && i < n; i++) {
    em_tensor *g = em_get_grad(params[i]);
    if (!g || (isinf(norm_type) && g->numel == 0)) continue; /* an empty gradient's inf-norm is its identity, 0 */
    norms[k++] = em_reshape_at(norm_of(g, norm_type, dt, site), 1, (int64_t[]){1}, site);
  }
  if (norms && k) total = norm_of(em_cat_at(k, norms, 0, site), norm_type, dt, site);
  else if (norms) total = em_scalar_at(dt, 0, site); /* only empty gradients, inf-norm */
  rt_free(norms);
  /* min(1, max_norm / (total + 1e-6)), a 0-dim tensor multiplied into every gradient in place */
  em_tensor *coef = total ? em_minimum_scalar_at(em_div_at(em_scalar_at(dt, max_norm, site), em_add_scalar_at(total, 1e-6, site),
                                                           site), 1, site)
                          : NULL;
  for (int i = 0; coef && i < n; i++) {
    em_tensor *g = em_get_grad(params[i]);
    if (g && !em_mul__at(g, em_cast_at(coef, g->dtype, site), site)) coef = NULL;
  }
  em_no_grad_end();
  return end_op(coef ? total : NULL, site);
}
