/* runtime/ops.c: the public eager op API.
 *
 * Public ops do what PyTorch's reference implementations do on top of prims: type promotion
 * (inserting CONVERT), broadcasting (inserting EXPAND views), argument normalisation (negative
 * axes, Python slice clamping, -1 sizes), then one dispatch of a strict prim. Internal rt_*
 * helpers return caller-owned references so temporaries die as soon as an op is done with them;
 * only what the user receives is handed to the current scope. */
#include "rt.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define SCOPED(name, expr) rt_scope_add((expr), (name), site)

/* ---- building blocks --------------------------------------------------------------------- */

em_tensor *rt_cast(em_tensor *x, em_dtype dt, const char *name, em_site site) {
  if (!x) return NULL;
  if (x->dtype == dt) return em_retain(x);
  prim_attrs at = {.dtype = dt};
  return rt_dispatch(name, EM_PRIM_CONVERT, &x, 1, &at, site);
}

em_tensor *rt_expand(em_tensor *x, int ndim, const int64_t *sizes, const char *name, em_site site) {
  if (!x) return NULL;
  if (x->ndim == ndim && !memcmp(x->sizes, sizes, sizeof(int64_t) * (size_t)ndim)) return em_retain(x);
  prim_attrs at = {.shape.ndim = ndim};
  memcpy(at.shape.sizes, sizes, sizeof(int64_t) * (size_t)ndim);
  return rt_dispatch(name, EM_PRIM_EXPAND, &x, 1, &at, site);
}

/* A number argument as a tensor: on the CPU whatever the default device, since a CPU scalar
 * joins operands on any device (and a device scalar would not join CPU ones). */
/* Whether v is a value em_item returned to the traced function (bitwise, so 0.0 and -0.0 and
 * NaNs stay apart). */
static bool item_value(const rt_trace *tr, double v) {
  int n = tr->n_item_values < 16 ? tr->n_item_values : 16;
  for (int i = 0; i < n; i++)
    if (!memcmp(&tr->item_values[i], &v, sizeof v)) return true;
  return false;
}

em_tensor *rt_scalar(em_dtype dt, double v, const char *name, em_site site) {
  prim_attrs at = {.dtype = dt, .value = v};
  em_device prev = em_set_default_device(EM_CPU);
  rt_trace *tr = rt_tracing();
  /* a value read with em_item: a real tensor, which the trace lifts into a graph input, so the
   * graph does not change (and compile again) with the value on every call (issue 16) */
  bool lift = tr && item_value(tr, v);
  if (lift) rt_trace_suspend();
  em_tensor *t = rt_dispatch(name, EM_PRIM_FULL, NULL, 0, &at, site);
  if (lift) rt_trace_resume();
  em_set_default_device(prev);
  return t;
}

/* Casts each of n operands to dt and expands it to their common shape: out[i] are caller-owned.
 * On failure nothing is left owned and an error naming every operand is recorded. */
static bool prepare(const char *name, em_tensor *const *x, int n, em_dtype dt, em_tensor **out,
                    em_site site) {
  ir_shape s = {0};
  for (int i = 0; i < n; i++) {
    ir_shape xi = {.ndim = x[i]->ndim};
    memcpy(xi.sizes, x[i]->sizes, sizeof xi.sizes);
    if (!ir_broadcast(&s, &xi, &s)) {
      char msg[512], b[128];
      size_t k = 0;
      for (int j = 0; j < n; j++)
        k += (size_t)snprintf(msg + k, sizeof msg - k, "%s%s", j ? ", " : "", rt_fmt(b, sizeof b, x[j]));
      rt_error(site, name, "shapes cannot broadcast: %s", msg);
      return false;
    }
  }
  for (int i = 0; i < n; i++) {
    em_tensor *c = rt_cast(x[i], dt, name, site);
    out[i] = rt_expand(c, s.ndim, s.sizes, name, site);
    em_release(c);
    if (!out[i]) {
      for (int j = 0; j < i; j++) em_release(out[j]);
      return false;
    }
  }
  return true;
}

static em_tensor *rt_unary(em_prim op, const char *name, em_tensor *x, em_site site) {
  if (!x) return NULL;
  em_dtype dt = x->dtype;
  if ((prim_get(op)->flags & P_FLOAT_ONLY) && !ir_is_float(dt) && ir_dtype(dt)->cpu_compute) dt = EM_F32;
  em_tensor *c = rt_cast(x, dt, name, site);
  if (!c) return NULL;
  em_tensor *r = rt_dispatch(name, op, &c, 1, NULL, site);
  em_release(c);
  return r;
}

static em_dtype compute_dtype(em_prim op, em_dtype dt) {
  if ((prim_get(op)->flags & P_FLOAT_ONLY) && !ir_is_float(dt)) return EM_F32;
  return dt;
}

/* torch.result_type of two tensors: a 0-dim tensor takes part only when its category (bool <
 * integer < floating) is higher than the dimensioned operand's, so f32[3] * f64[] is f32 and
 * i32[3] + i64[] is i32, while i32[3] * f64[] is f64. Number operands (the _scalar ops) reach
 * here as 0-dim tensors already of the dtype ir_promote_scalar chose, which this keeps. */
static em_dtype result_type(const em_tensor *a, const em_tensor *b) {
  if ((a->ndim == 0) == (b->ndim == 0)) return ir_promote(a->dtype, b->dtype);
  const em_tensor *dim = a->ndim ? a : b, *zero = a->ndim ? b : a;
  return ir_dtype(zero->dtype)->cat > ir_dtype(dim->dtype)->cat ? zero->dtype : dim->dtype;
}

em_dtype rt_result_type(const em_tensor *a, const em_tensor *b) { return result_type(a, b); }

static em_tensor *rt_binary(em_prim op, const char *name, em_tensor *a, em_tensor *b, em_site site) {
  if (!a || !b) return NULL;
  em_tensor *in[2] = {a, b}, *p[2];
  if (!prepare(name, in, 2, compute_dtype(op, result_type(a, b)), p, site)) return NULL;
  em_tensor *r = rt_dispatch(name, op, p, 2, NULL, site);
  em_release(p[0]);
  em_release(p[1]);
  return r;
}

/* A double scalar counts as an integer when it has an integral value, as 2 and 2.0 differ in
 * Python; that keeps int_tensor * 2 an integer tensor and makes int_tensor * 0.5 f32. */
static em_tensor *rt_binary_scalar(em_prim op, const char *name, em_tensor *a, double s, em_site site) {
  if (!a) return NULL;
  bool is_float = !(isfinite(s) && s == trunc(s));
  em_tensor *b = rt_scalar(ir_promote_scalar(a->dtype, is_float), s, name, site);
  em_tensor *r = rt_binary(op, name, a, b, site);
  em_release(b);
  return r;
}

/* ---- unary ------------------------------------------------------------------------------- */

#define UNARY(fn, OP) \
  em_tensor *em_##fn##_at(em_tensor *x, em_site site) { return SCOPED("em_" #fn, rt_unary(EM_PRIM_##OP, "em_" #fn, x, site)); }
UNARY(neg, NEG)
UNARY(abs, ABS)
UNARY(exp, EXP)
UNARY(log, LOG)
UNARY(log1p, LOG1P)
UNARY(expm1, EXPM1)
UNARY(sqrt, SQRT)
UNARY(rsqrt, RSQRT)
UNARY(sin, SIN)
UNARY(cos, COS)
UNARY(tanh, TANH)
UNARY(erf, ERF)
UNARY(sign, SIGN)
UNARY(floor, FLOOR)
UNARY(ceil, CEIL)
UNARY(reciprocal, RECIPROCAL)
UNARY(logical_not, LOGICAL_NOT)

/* ---- binary and scalar variants ---------------------------------------------------------- */

#define BINARY(fn, OP)                                                                  \
  em_tensor *em_##fn##_at(em_tensor *a, em_tensor *b, em_site site) {                   \
    return SCOPED("em_" #fn, rt_binary(EM_PRIM_##OP, "em_" #fn, a, b, site));           \
  }
#define BINARY_S(fn, OP)                                                                \
  BINARY(fn, OP)                                                                        \
  em_tensor *em_##fn##_scalar_at(em_tensor *a, double s, em_site site) {                \
    return SCOPED("em_" #fn "_scalar", rt_binary_scalar(EM_PRIM_##OP, "em_" #fn "_scalar", a, s, site)); \
  }
BINARY_S(add, ADD)
BINARY_S(sub, SUB)
BINARY_S(mul, MUL)
BINARY_S(div, DIV)
BINARY_S(pow, POW)
BINARY_S(maximum, MAXIMUM)
BINARY_S(minimum, MINIMUM)
BINARY_S(remainder, REMAINDER)
BINARY_S(eq, EQ)
BINARY_S(ne, NE)
BINARY_S(lt, LT)
BINARY_S(le, LE)
BINARY_S(gt, GT)
BINARY_S(ge, GE)
BINARY(atan2, ATAN2)
BINARY(logical_and, LOGICAL_AND)
BINARY(logical_or, LOGICAL_OR)

em_tensor *em_where_at(em_tensor *cond, em_tensor *a, em_tensor *b, em_site site) {
  static const char name[] = "em_where";
  if (!cond || !a || !b) return NULL;
  em_tensor *c = rt_cast(cond, EM_BOOL, name, site);
  if (!c) return NULL;
  em_tensor *in[3] = {c, a, b}, *p[3];
  em_dtype dt = result_type(a, b);
  /* prepare casts every operand to one dtype; the condition keeps bool, so do it in two steps. */
  em_tensor *r = NULL;
  if (prepare(name, in, 3, dt, p, site)) {
    em_release(p[0]);
    em_tensor *cc[1] = {c}, *pc;
    ir_shape s = {.ndim = p[1]->ndim};
    memcpy(s.sizes, p[1]->sizes, sizeof s.sizes);
    pc = rt_expand(cc[0], s.ndim, s.sizes, name, site);
    em_tensor *ops[3] = {pc, p[1], p[2]};
    r = pc ? rt_dispatch(name, EM_PRIM_WHERE, ops, 3, NULL, site) : NULL;
    em_release(pc);
    em_release(p[1]);
    em_release(p[2]);
  }
  em_release(c);
  return SCOPED(name, r);
}

em_tensor *em_cast_at(em_tensor *x, em_dtype dt, em_site site) {
  if (!x) return NULL;
  if (!ir_dtype_valid(dt)) return rt_error(site, "em_cast", "invalid dtype %d", (int)dt);
  prim_attrs at = {.dtype = dt};
  return SCOPED("em_cast", rt_dispatch("em_cast", EM_PRIM_CONVERT, &x, 1, &at, site));
}

em_tensor *em_clone_at(em_tensor *x, em_site site) {
  return SCOPED("em_clone", rt_dispatch("em_clone", EM_PRIM_CLONE, &x, 1, NULL, site));
}

em_tensor *em_contiguous_at(em_tensor *x, em_site site) {
  RT_ARG(x, "em_contiguous", site);
  if (!x) return NULL;
  if (em_is_contiguous(x)) return SCOPED("em_contiguous", em_retain(x));
  return SCOPED("em_contiguous", rt_dispatch("em_contiguous", EM_PRIM_CLONE, &x, 1, NULL, site));
}

/* ---- reductions -------------------------------------------------------------------------- */

bool rt_axes_arg(const em_tensor *x, int n_axes, const int64_t *axes, const char *name, em_site site) {
  char b[128];
  if (n_axes < 0 || n_axes > EM_MAX_DIMS || (n_axes > 0 && !axes))
    return rt_error(site, name, "invalid axis list (%d axes%s)", n_axes, n_axes > 0 && !axes ? ", NULL" : ""), false;
  bool seen[EM_MAX_DIMS] = {0};
  for (int i = 0; i < n_axes; i++) {
    int a = ir_norm_axis(axes[i], x->ndim);
    if (a < 0)
      return rt_error(site, name, "axis %lld out of range for %s", (long long)axes[i], rt_fmt(b, sizeof b, x)), false;
    if (seen[a]) return rt_error(site, name, "axis %d repeated", a), false;
    seen[a] = true;
  }
  return true;
}

static em_tensor *reduce(em_prim op, const char *name, em_tensor *x, int n_axes, const int64_t *axes,
                         bool keepdim, em_site site) {
  if (!x) return NULL;
  if (n_axes < 0 || n_axes > EM_MAX_DIMS || (n_axes > 0 && !axes))
    return rt_error(site, name, "invalid axis list (%d axes)", n_axes);
  prim_attrs at = {.n_axes = n_axes, .keepdim = keepdim};
  if (n_axes) memcpy(at.axes, axes, sizeof(int64_t) * (size_t)n_axes);
  if ((op == EM_PRIM_SUM || op == EM_PRIM_PROD) && !(x = rt_autocast_f32(x, site)))
    return NULL; /* autocast's f32 list */
  return SCOPED(name, rt_dispatch(name, op, &x, 1, &at, site));
}

#define REDUCE(fn, OP)                                                                          \
  em_tensor *em_##fn##_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site) { \
    return reduce(EM_PRIM_##OP, "em_" #fn, x, n_axes, axes, keepdim, site);                     \
  }
REDUCE(sum, SUM)
REDUCE(prod, PROD)
REDUCE(amax, AMAX)
REDUCE(amin, AMIN)

em_tensor *em_argmax_at(em_tensor *x, int axis, bool keepdim, em_site site) {
  int64_t a = axis;
  return reduce(EM_PRIM_ARGMAX, "em_argmax", x, axis == EM_ALL_AXES ? 0 : 1, &a, keepdim, site);
}

em_tensor *em_argmin_at(em_tensor *x, int axis, bool keepdim, em_site site) {
  int64_t a = axis;
  return reduce(EM_PRIM_ARGMIN, "em_argmin", x, axis == EM_ALL_AXES ? 0 : 1, &a, keepdim, site);
}

/* ---- movement ---------------------------------------------------------------------------- */

static bool shape_arg(const char *name, int ndim, const int64_t *sizes, em_site site) {
  if (ndim < 0 || ndim > EM_MAX_DIMS) return rt_error(site, name, "%d dims given; a tensor has 0 to %d", ndim, EM_MAX_DIMS), false;
  if (ndim > 0 && !sizes) return rt_error(site, name, "sizes is NULL for %d dims", ndim), false;
  return true;
}

em_tensor *rt_reshape(em_tensor *x, int ndim, const int64_t *sizes, const char *name, em_site site) {
  if (!x) return NULL;
  if (!shape_arg(name, ndim, sizes, site)) return NULL;
  prim_attrs at = {.shape.ndim = ndim};
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    at.shape.sizes[i] = sizes[i];
    if (sizes[i] == -1) {
      if (infer >= 0) return rt_error(site, name, "only one size may be -1");
      infer = i;
    } else if (sizes[i] < 0) {
      return rt_error(site, name, "size %lld of dim %d is invalid", (long long)sizes[i], i);
    } else if (!ir_mul_ok(known, sizes[i], &known)) {
      char b[128];
      return rt_error(site, name, "cannot reshape %s: the sizes' product does not fit in 64 bits", rt_fmt(b, sizeof b, x));
    }
  }
  if (infer >= 0) {
    char b[128];
    if (known == 0 || x->numel % known)
      return rt_error(site, name, "cannot infer the -1 size reshaping %s", rt_fmt(b, sizeof b, x));
    at.shape.sizes[infer] = x->numel / known;
  }
  prim_meta m = rt_meta(x), out;
  char err[256];
  if (!prim_meta_fn(EM_PRIM_RESHAPE, &at, &m, 1, &out, err, sizeof err) && !strcmp(err, "no view")) {
    em_tensor *c = rt_dispatch(name, EM_PRIM_CLONE, &x, 1, NULL, site);
    em_tensor *r = c ? rt_dispatch(name, EM_PRIM_RESHAPE, &c, 1, &at, site) : NULL;
    em_release(c);
    return r;
  }
  return rt_dispatch(name, EM_PRIM_RESHAPE, &x, 1, &at, site);
}

em_tensor *em_reshape_at(em_tensor *x, int ndim, const int64_t *sizes, em_site site) {
  RT_ARG(x, "em_reshape", site);
  return SCOPED("em_reshape", rt_reshape(x, ndim, sizes, "em_reshape", site));
}

em_tensor *em_permute_at(em_tensor *x, int ndim, const int64_t *perm, em_site site) {
  RT_ARG(x, "em_permute", site);
  if (!x) return NULL;
  if (!shape_arg("em_permute", ndim, perm, site)) return NULL;
  prim_attrs at = {.n_axes = ndim};
  if (ndim) memcpy(at.axes, perm, sizeof(int64_t) * (size_t)ndim);
  return SCOPED("em_permute", rt_dispatch("em_permute", EM_PRIM_PERMUTE, &x, 1, &at, site));
}

em_tensor *em_transpose_at(em_tensor *x, int d0, int d1, em_site site) {
  RT_ARG(x, "em_transpose", site);
  if (!x) return NULL;
  int a = ir_norm_axis(d0, x->ndim), b = ir_norm_axis(d1, x->ndim);
  char s[128];
  if (a < 0 || b < 0)
    return rt_error(site, "em_transpose", "dims (%d, %d) out of range for %s", d0, d1, rt_fmt(s, sizeof s, x));
  prim_attrs at = {.n_axes = x->ndim};
  for (int i = 0; i < x->ndim; i++) at.axes[i] = i;
  at.axes[a] = b;
  at.axes[b] = a;
  return SCOPED("em_transpose", rt_dispatch("em_transpose", EM_PRIM_PERMUTE, &x, 1, &at, site));
}

em_tensor *em_expand_at(em_tensor *x, int ndim, const int64_t *sizes, em_site site) {
  if (!x) return NULL;
  if (!shape_arg("em_expand", ndim, sizes, site)) return NULL;
  int64_t s[EM_MAX_DIMS];
  int lead = ndim - x->ndim;
  for (int i = 0; i < ndim; i++) s[i] = (sizes[i] == -1 && i >= lead) ? x->sizes[i - lead] : sizes[i];
  em_tensor *r = rt_expand(x, ndim, s, "em_expand", site);
  return SCOPED("em_expand", r);
}

/* Slice attributes with Python's clamping of start and stop (negative values count from the
 * end), shared by slice and slice_scatter. False (error recorded) for a bad axis. */
static bool slice_attrs(em_tensor *x, int axis, int64_t start, int64_t stop, int64_t step, prim_attrs *at,
                        const char *name, em_site site) {
  int a = ir_norm_axis(axis, x->ndim);
  char b[128];
  if (a < 0) return rt_error(site, name, "axis %d out of range for %s", axis, rt_fmt(b, sizeof b, x)), false;
  int64_t n = x->sizes[a];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = start < 0 ? 0 : start > n ? n : start;
  stop = stop < start ? start : stop > n ? n : stop;
  *at = (prim_attrs){.n_axes = 1, .axes = {a}, .start = start, .stop = stop, .step = step};
  return true;
}

em_tensor *em_slice_at(em_tensor *x, int axis, int64_t start, int64_t stop, int64_t step, em_site site) {
  RT_ARG(x, "em_slice", site);
  prim_attrs at;
  if (!x || !slice_attrs(x, axis, start, stop, step, &at, "em_slice", site)) return NULL;
  return SCOPED("em_slice", rt_dispatch("em_slice", EM_PRIM_SLICE, &x, 1, &at, site));
}

em_tensor *em_slice_scatter_at(em_tensor *x, em_tensor *src, int axis, int64_t start, int64_t stop, int64_t step,
                               em_site site) {
  prim_attrs at;
  if (!x || !src || !slice_attrs(x, axis, start, stop, step, &at, "em_slice_scatter", site)) return NULL;
  em_tensor *ops[2] = {x, src};
  return SCOPED("em_slice_scatter", rt_dispatch("em_slice_scatter", EM_PRIM_SLICE_SCATTER, ops, 2, &at, site));
}

/* As torch.squeeze, a named axis whose size is not 1 is left alone (the SQUEEZE prim stays
 * strict: it is handed the size-1 axes only); when none is left, the result is a view of x with
 * its own shape. */
em_tensor *em_squeeze_at(em_tensor *x, int n_axes, const int64_t *axes, em_site site) {
  if (!x) return NULL;
  if (!shape_arg("em_squeeze", n_axes, axes, site)) return NULL;
  prim_attrs at = {.n_axes = 0};
  bool seen[EM_MAX_DIMS] = {0};
  char b[128];
  for (int i = 0; i < n_axes; i++) {
    int a = ir_norm_axis(axes[i], x->ndim ? x->ndim : 1); /* a 0-dim x takes axis 0 or -1, as torch */
    if (a < 0) return rt_error(site, "em_squeeze", "axis %lld out of range for %s", (long long)axes[i], rt_fmt(b, sizeof b, x));
    if (seen[a]) return rt_error(site, "em_squeeze", "axis %d repeated", a);
    seen[a] = true;
    if (x->ndim && x->sizes[a] == 1) at.axes[at.n_axes++] = a;
  }
  if (n_axes && !at.n_axes) return SCOPED("em_squeeze", rt_reshape(x, x->ndim, x->sizes, "em_squeeze", site));
  return SCOPED("em_squeeze", rt_dispatch("em_squeeze", EM_PRIM_SQUEEZE, &x, 1, &at, site));
}

em_tensor *em_unsqueeze_at(em_tensor *x, int axis, em_site site) {
  if (!x) return NULL;
  prim_attrs at = {.n_axes = 1, .axes = {axis}};
  return SCOPED("em_unsqueeze", rt_dispatch("em_unsqueeze", EM_PRIM_UNSQUEEZE, &x, 1, &at, site));
}

em_tensor *em_flip_at(em_tensor *x, int n_axes, const int64_t *axes, em_site site) {
  if (!x) return NULL;
  if (!shape_arg("em_flip", n_axes, axes, site)) return NULL;
  prim_attrs at = {.n_axes = n_axes};
  if (n_axes) memcpy(at.axes, axes, sizeof(int64_t) * (size_t)n_axes);
  return SCOPED("em_flip", rt_dispatch("em_flip", EM_PRIM_FLIP, &x, 1, &at, site));
}

/* Negative amounts crop, as torch's constant_pad_nd: x is narrowed first (a view), then padded
 * by the positive amounts (the PAD prim keeps amounts >= 0). */
em_tensor *em_pad_at(em_tensor *x, int n_pads, const int64_t *pads, double value, em_site site) {
  if (!x) return NULL;
  if (n_pads < 0 || n_pads > 2 * EM_MAX_DIMS || (n_pads && !pads))
    return rt_error(site, "em_pad", "invalid pad list (%d amounts)", n_pads);
  prim_attrs at = {.n_pads = n_pads, .value = value};
  bool crop = false;
  for (int i = 0; i < n_pads; i++) {
    at.pads[i] = pads[i] > 0 ? pads[i] : 0;
    crop |= pads[i] < 0;
  }
  em_tensor *c = em_retain(x);
  char b[128];
  if (crop && (n_pads % 2 || n_pads > 2 * x->ndim)) {
    em_release(c);
    return rt_error(site, "em_pad", "needs an even number of pads, at most 2 per dim, got %d for %s", n_pads,
                    rt_fmt(b, sizeof b, x));
  }
  for (int i = 0; crop && c && i < n_pads / 2; i++) {
    int axis = x->ndim - 1 - i;
    int64_t lo = pads[2 * i], hi = pads[2 * i + 1], n = x->sizes[axis];
    if (lo >= 0 && hi >= 0) continue;
    /* compared as lo < -n, never -lo > n: -INT64_MIN overflows */
    int64_t cut_lo = lo < 0 ? (lo < -n ? n + 1 : -lo) : 0, cut_hi = hi < 0 ? (hi < -n ? n + 1 : -hi) : 0;
    if (cut_lo + cut_hi > n) {
      em_release(c);
      return rt_error(site, "em_pad", "negative pads %lld and %lld crop more than the %lld elements of axis %d of %s",
                      (long long)lo, (long long)hi, (long long)n, axis, rt_fmt(b, sizeof b, x));
    }
    prim_attrs sl = {.n_axes = 1, .axes = {axis}, .start = cut_lo, .stop = n - cut_hi, .step = 1};
    em_tensor *v = rt_dispatch("em_pad", EM_PRIM_SLICE, &c, 1, &sl, site);
    em_release(c);
    c = v;
  }
  em_tensor *r = c ? rt_dispatch("em_pad", EM_PRIM_PAD, &c, 1, &at, site) : NULL;
  em_release(c);
  return SCOPED("em_pad", r);
}

em_tensor *em_cat_at(int n, em_tensor *const *xs, int axis, em_site site) {
  static const char name[] = "em_cat";
  if (n < 1 || !xs) return rt_error(site, name, "needs at least one tensor, got %d", n);
  for (int i = 0; i < n; i++)
    if (!xs[i]) return NULL;
  em_dtype dt = xs[0]->dtype;
  for (int i = 1; i < n; i++) dt = ir_promote(dt, xs[i]->dtype);
  em_tensor **c = rt_alloc(sizeof(em_tensor *) * (size_t)n, 16);
  if (!c) return rt_error(site, name, "out of memory");
  int made = 0;
  em_tensor *r = NULL;
  for (; made < n; made++)
    if (!(c[made] = rt_cast(xs[made], dt, name, site))) break;
  if (made == n) {
    prim_attrs at = {.n_axes = 1, .axes = {axis}};
    r = rt_dispatch(name, EM_PRIM_CAT, c, n, &at, site);
  }
  for (int i = 0; i < made; i++) em_release(c[i]);
  rt_free(c);
  return SCOPED(name, r);
}

/* ---- indexing ---------------------------------------------------------------------------- */

static em_tensor *index_arg(em_tensor *index, const char *name, em_site site) {
  if (!index) return NULL;
  if (index->dtype == EM_I64) return em_retain(index);
  if (index->dtype == EM_I32) return rt_cast(index, EM_I64, name, site);
  char b[128];
  return rt_error(site, name, "index must be i64 or i32, got %s", rt_fmt(b, sizeof b, index));
}

static em_tensor *indexing(em_prim op, const char *name, em_tensor *x, int axis, em_tensor *index,
                           em_tensor *src, em_site site) {
  if (!x || !index || (op == EM_PRIM_SCATTER_ADD && !src)) return NULL;
  em_tensor *in[3] = {x, index_arg(index, name, site), NULL};
  if (!in[1]) return NULL;
  int n = 2;
  if (op == EM_PRIM_SCATTER_ADD) {
    in[2] = rt_cast(src, x->dtype, name, site);
    n = 3;
  }
  prim_attrs at = {.n_axes = 1, .axes = {axis}};
  em_tensor *r = (n == 2 || in[2]) ? rt_dispatch(name, op, in, n, &at, site) : NULL;
  em_release(in[1]);
  em_release(in[2]);
  return SCOPED(name, r);
}

em_tensor *em_gather_at(em_tensor *x, int axis, em_tensor *index, em_site site) {
  RT_ARG(x, "em_gather", site);
  RT_ARG(index, "em_gather", site);
  return indexing(EM_PRIM_GATHER, "em_gather", x, axis, index, NULL, site);
}
em_tensor *em_index_select_at(em_tensor *x, int axis, em_tensor *index, em_site site) {
  RT_ARG(x, "em_index_select", site);
  RT_ARG(index, "em_index_select", site);
  return indexing(EM_PRIM_INDEX_SELECT, "em_index_select", x, axis, index, NULL, site);
}
em_tensor *em_scatter_add_at(em_tensor *x, int axis, em_tensor *index, em_tensor *src, em_site site) {
  RT_ARG(x, "em_scatter_add", site);
  RT_ARG(index, "em_scatter_add", site);
  RT_ARG(src, "em_scatter_add", site);
  return indexing(EM_PRIM_SCATTER_ADD, "em_scatter_add", x, axis, index, src, site);
}

/* ---- extern ------------------------------------------------------------------------------ */

em_tensor *em_matmul_at(em_tensor *a, em_tensor *b, em_site site) {
  RT_ARG(a, "em_matmul", site);
  RT_ARG(b, "em_matmul", site);
  static const char name[] = "em_matmul";
  if (!a || !b) return NULL;
  if (!(a = rt_autocast_low(a, name, site)) || !(b = rt_autocast_low(b, name, site))) return NULL;
  char s0[128], s1[128];
  if (a->ndim == 0 || b->ndim == 0)
    return rt_error(site, name, "both operands need at least 1 dim: a is %s, b is %s", rt_fmt(s0, 128, a), rt_fmt(s1, 128, b));
  if (a->dtype != b->dtype)
    return rt_error(site, name, "operands differ in dtype: a is %s, b is %s", rt_fmt(s0, 128, a), rt_fmt(s1, 128, b));
  int64_t k_a = a->sizes[a->ndim - 1], k_b = b->ndim == 1 ? b->sizes[0] : b->sizes[b->ndim - 2];
  if (k_a != k_b)
    return rt_error(site, name, "inner dimensions differ: a is %s, b is %s", rt_fmt(s0, 128, a), rt_fmt(s1, 128, b));
  /* a [..., m, k] @ b [k, n] folds a's batch dims into its rows, as torch.matmul does: one
   * [B*m, k] x [k, n] product instead of B products against one broadcast matrix, and the
   * gradient of b becomes one product too (not B products summed over the batch). */
  if (a->ndim > 2 && b->ndim == 2 && ir_is_contiguous(a->ndim, a->sizes, a->strides)) {
    int64_t rows = a->numel / k_a, fs[EM_MAX_DIMS];
    em_tensor *a2 = rt_reshape(a, 2, (int64_t[]){rows, k_a}, name, site);
    em_tensor *ops[2] = {a2, b};
    em_tensor *r2 = a2 ? rt_dispatch(name, EM_PRIM_MATMUL, ops, 2, NULL, site) : NULL;
    memcpy(fs, a->sizes, sizeof(int64_t) * (size_t)a->ndim);
    fs[a->ndim - 1] = b->sizes[1];
    em_tensor *r = r2 ? rt_reshape(r2, a->ndim, fs, name, site) : NULL;
    em_release(a2), em_release(r2);
    return SCOPED(name, r);
  }
  /* Lift 1-D operands to matrices and broadcast the batch dims. */
  ir_shape sa = {.ndim = a->ndim == 1 ? 2 : a->ndim}, sb = {.ndim = b->ndim == 1 ? 2 : b->ndim};
  if (a->ndim == 1) sa.sizes[0] = 1, sa.sizes[1] = a->sizes[0];
  else memcpy(sa.sizes, a->sizes, sizeof sa.sizes);
  if (b->ndim == 1) sb.sizes[0] = b->sizes[0], sb.sizes[1] = 1;
  else memcpy(sb.sizes, b->sizes, sizeof sb.sizes);
  ir_shape ba = {.ndim = sa.ndim - 2}, bb = {.ndim = sb.ndim - 2}, bs;
  memcpy(ba.sizes, sa.sizes, sizeof(int64_t) * (size_t)ba.ndim);
  memcpy(bb.sizes, sb.sizes, sizeof(int64_t) * (size_t)bb.ndim);
  if (!ir_broadcast(&ba, &bb, &bs) || bs.ndim + 2 > EM_MAX_DIMS)
    return rt_error(site, name, "batch dims do not broadcast: a is %s, b is %s", rt_fmt(s0, 128, a), rt_fmt(s1, 128, b));
  int64_t ea[EM_MAX_DIMS], eb[EM_MAX_DIMS];
  memcpy(ea, bs.sizes, sizeof(int64_t) * (size_t)bs.ndim);
  memcpy(eb, bs.sizes, sizeof(int64_t) * (size_t)bs.ndim);
  ea[bs.ndim] = sa.sizes[sa.ndim - 2], ea[bs.ndim + 1] = sa.sizes[sa.ndim - 1];
  eb[bs.ndim] = sb.sizes[sb.ndim - 2], eb[bs.ndim + 1] = sb.sizes[sb.ndim - 1];
  em_tensor *ra = rt_reshape(a, sa.ndim, sa.sizes, name, site);
  em_tensor *rb = rt_reshape(b, sb.ndim, sb.sizes, name, site);
  em_tensor *xa = rt_expand(ra, bs.ndim + 2, ea, name, site);
  em_tensor *xb = rt_expand(rb, bs.ndim + 2, eb, name, site);
  em_tensor *ops[2] = {xa, xb};
  em_tensor *r = xa && xb ? rt_dispatch(name, EM_PRIM_MATMUL, ops, 2, NULL, site) : NULL;
  em_release(ra), em_release(rb), em_release(xa), em_release(xb);
  if (r && (a->ndim == 1 || b->ndim == 1)) {
    int64_t os[EM_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < bs.ndim; i++) os[n++] = bs.sizes[i];
    if (a->ndim != 1) os[n++] = ea[bs.ndim];
    if (b->ndim != 1) os[n++] = eb[bs.ndim + 1];
    em_tensor *v = rt_reshape(r, n, os, name, site);
    em_release(r);
    r = v;
  }
  return SCOPED(name, r);
}

static em_tensor *conv(em_prim op, const char *name, em_tensor *a, em_tensor *b, em_tensor *bias,
                       const ir_shape *shape, em_conv2d_params p, em_site site) {
  if (!a || !b) return NULL;
  prim_attrs at = {.conv = p};
  if (shape) at.shape = *shape;
  em_tensor *ops[2] = {a, b};
  em_tensor *r = rt_dispatch(name, op, ops, 2, &at, site);
  if (r && bias) {
    char s0[128], s1[128];
    if (bias->ndim != 1 || bias->sizes[0] != r->sizes[1] || bias->dtype != r->dtype) {
      rt_error(site, name, "bias must be %s[%lld] for output %s, got %s", em_dtype_name(r->dtype),
               (long long)r->sizes[1], rt_fmt(s0, 128, r), rt_fmt(s1, 128, bias));
      em_release(r);
      return NULL;
    }
    /* Out of place, so autograd records the bias as an operand. */
    int64_t bs[4] = {1, r->sizes[1], 1, 1};
    em_tensor *v = rt_reshape(bias, 4, bs, name, site);
    em_tensor *e = rt_expand(v, 4, r->sizes, name, site);
    em_tensor *add[2] = {r, e};
    em_tensor *sum = e ? rt_dispatch(name, EM_PRIM_ADD, add, 2, NULL, site) : NULL;
    em_release(v), em_release(e), em_release(r);
    r = sum;
  }
  return r;
}

/* padding_mode resolved to amounts, as torch's _convolution_mode: 'same' pads d (k - 1) in all,
 * the smaller half on both sides by the convolution and the odd one on the right / bottom by an
 * explicit pad of x first (*extra: {0, right, 0, bottom}, F.pad's order). The prims see explicit
 * padding only. */
static bool resolve_padding(em_conv2d_params *p, const em_tensor *w, int64_t extra[4], const char *name, em_site site) {
  memset(extra, 0, 4 * sizeof(int64_t));
  em_conv_padding mode = p->padding_mode;
  p->padding_mode = EM_CONV_PAD_EXPLICIT;
  if (mode == EM_CONV_PAD_EXPLICIT) return true;
  if (mode == EM_CONV_PAD_VALID) {
    p->padding[0] = p->padding[1] = 0;
    return true;
  }
  if (mode != EM_CONV_PAD_SAME) return rt_error(site, name, "unknown padding_mode %d", (int)mode), false;
  char b[128];
  if (p->stride[0] != 1 || p->stride[1] != 1)
    return rt_error(site, name, "padding 'same' needs stride 1, got (%lld, %lld) (as torch)", (long long)p->stride[0],
                    (long long)p->stride[1]), false;
  if (w->ndim != 4) return rt_error(site, name, "weight must be [O, C/groups, kh, kw], got %s", rt_fmt(b, sizeof b, w)), false;
  for (int i = 0; i < 2; i++) {
    int64_t total;
    if (p->dilation[i] < 1 || !ir_mul_ok(p->dilation[i], w->sizes[2 + i] - 1, &total))
      return rt_error(site, name, "bad dilation (%lld, %lld) for weight %s", (long long)p->dilation[0],
                      (long long)p->dilation[1], rt_fmt(b, sizeof b, w)), false;
    p->padding[i] = total / 2;
    extra[3 - 2 * i] = total - total / 2 - total / 2; /* i = 0 (height): F.pad's bottom; 1 (width): right */
  }
  return true;
}

em_tensor *em_conv2d_at(em_tensor *x, em_tensor *w, em_tensor *bias, em_conv2d_params p, em_site site) {
  if (!bias || !x || !w) return NULL;
  if (!(x = rt_autocast_low(x, "em_conv2d", site)) || !(w = rt_autocast_low(w, "em_conv2d", site)) ||
      !(bias = rt_autocast_low(bias, "em_conv2d", site)))
    return NULL;
  RT_ARG(w, "em_conv2d", site);
  int64_t extra[4];
  if (!resolve_padding(&p, w, extra, "em_conv2d", site)) return NULL;
  em_tensor *xp = x;
  if (extra[1] || extra[3]) {
    prim_attrs pa = {.n_pads = 4, .pads = {extra[0], extra[1], extra[2], extra[3]}, .value = 0};
    if (!(xp = rt_dispatch("em_conv2d", EM_PRIM_PAD, &x, 1, &pa, site))) return NULL;
  }
  em_tensor *r = conv(EM_PRIM_CONV2D, "em_conv2d", xp, w, bias == EM_NONE ? NULL : bias, NULL, p, site);
  if (xp != x) em_release(xp);
  return SCOPED("em_conv2d", r);
}

em_tensor *em_conv2d_backward_input_at(em_tensor *g, em_tensor *w, const int64_t hw[2],
                                       em_conv2d_params p, em_site site) {
  static const char name[] = "em_conv2d_backward_input";
  if (!g || !w) return NULL;
  if (!hw) return rt_error(site, name, "input_hw is NULL");
  if (p.padding_mode != EM_CONV_PAD_EXPLICIT) return rt_error(site, name, "takes explicit padding only");
  if (g->ndim != 4 || w->ndim != 4) {
    char s0[128], s1[128];
    return rt_error(site, name, "needs 4-D grad_out and weight, got %s and %s", rt_fmt(s0, 128, g), rt_fmt(s1, 128, w));
  }
  ir_shape s = {4, {g->sizes[0], 0, hw[0], hw[1]}};
  if (!ir_mul_ok(w->sizes[1], p.groups, &s.sizes[1]))
    return rt_error(site, name, "groups %lld times weight channels %lld does not fit in 64 bits", (long long)p.groups,
                    (long long)w->sizes[1]);
  return SCOPED(name, conv(EM_PRIM_CONV2D_BWD_INPUT, name, g, w, NULL, &s, p, site));
}

em_tensor *em_conv2d_backward_weight_at(em_tensor *x, em_tensor *g, const int64_t khw[2],
                                        em_conv2d_params p, em_site site) {
  static const char name[] = "em_conv2d_backward_weight";
  if (!x || !g) return NULL;
  if (!khw) return rt_error(site, name, "kernel_hw is NULL");
  if (p.padding_mode != EM_CONV_PAD_EXPLICIT) return rt_error(site, name, "takes explicit padding only");
  if (p.groups < 1) return rt_error(site, name, "groups must be >= 1, got %lld", (long long)p.groups);
  if (g->ndim != 4 || x->ndim != 4) {
    char s0[128], s1[128];
    return rt_error(site, name, "needs 4-D input and grad_out, got %s and %s", rt_fmt(s0, 128, x), rt_fmt(s1, 128, g));
  }
  ir_shape s = {4, {g->sizes[1], x->sizes[1] / p.groups, khw[0], khw[1]}};
  return SCOPED(name, conv(EM_PRIM_CONV2D_BWD_WEIGHT, name, x, g, NULL, &s, p, site));
}

/* ---- in-place ---------------------------------------------------------------------------- */

static bool writable(em_tensor *dst, const char *name, em_site site) {
  for (int i = 0; i < dst->ndim; i++)
    if (dst->strides[i] == 0 && dst->sizes[i] > 1) {
      char b[128];
      rt_error(site, name, "cannot write in place into %s: it is an expanded view (dim %d has stride 0), "
               "so several elements share one memory location; clone it first", rt_fmt(b, sizeof b, dst), i);
      return false;
    }
  return true;
}

/* src converted to dst's dtype and broadcast to dst's shape, and copied first if it overlaps dst
 * in another layout (so the kernel never reads what it has already written). Caller-owned. */
static em_tensor *source_for(em_tensor *dst, em_tensor *src, const char *name, em_site site) {
  ir_shape d = {.ndim = dst->ndim}, s = {.ndim = src->ndim}, r;
  memcpy(d.sizes, dst->sizes, sizeof d.sizes);
  memcpy(s.sizes, src->sizes, sizeof s.sizes);
  char b0[128], b1[128];
  if (!ir_broadcast(&d, &s, &r) || r.ndim != d.ndim || memcmp(r.sizes, d.sizes, sizeof(int64_t) * (size_t)d.ndim))
    return rt_error(site, name, "%s does not broadcast to the destination %s", rt_fmt(b0, 128, src), rt_fmt(b1, 128, dst));
  em_tensor *c = rt_cast(src, dst->dtype, name, site);
  em_tensor *e = rt_expand(c, d.ndim, d.sizes, name, site);
  em_release(c);
  if (e && e->storage == dst->storage &&
      (e->offset != dst->offset || memcmp(e->strides, dst->strides, sizeof(int64_t) * (size_t)d.ndim))) {
    em_tensor *copy = rt_dispatch(name, EM_PRIM_CLONE, &e, 1, NULL, site);
    em_release(e);
    e = copy;
  }
  return e;
}

static em_tensor *inplace(em_prim op, const char *name, em_tensor *dst, em_tensor *b, em_site site) {
  RT_ARG(dst, name, site);
  RT_ARG(b, name, site);
  if (!writable(dst, name, site)) return NULL;
  em_dtype res = compute_dtype(op, result_type(dst, b));
  if (ir_dtype(res)->cat > ir_dtype(dst->dtype)->cat) {
    char b0[128], b1[128];
    return rt_error(site, name, "result type %s cannot be cast to the destination %s (operand %s)",
                    em_dtype_name(res), rt_fmt(b0, 128, dst), rt_fmt(b1, 128, b));
  }
  em_tensor *s = source_for(dst, b, name, site);
  if (!s) return NULL;
  em_tensor *ops[2] = {dst, s};
  bool ok = rt_dispatch_out(name, op, ops, 2, NULL, dst, site);
  em_release(s);
  return ok ? dst : NULL;
}

em_tensor *em_add__at(em_tensor *dst, em_tensor *b, em_site site) { return inplace(EM_PRIM_ADD, "em_add_", dst, b, site); }
em_tensor *em_sub__at(em_tensor *dst, em_tensor *b, em_site site) { return inplace(EM_PRIM_SUB, "em_sub_", dst, b, site); }
em_tensor *em_mul__at(em_tensor *dst, em_tensor *b, em_site site) { return inplace(EM_PRIM_MUL, "em_mul_", dst, b, site); }
em_tensor *em_div__at(em_tensor *dst, em_tensor *b, em_site site) { return inplace(EM_PRIM_DIV, "em_div_", dst, b, site); }

static em_tensor *inplace_scalar(em_prim op, const char *name, em_tensor *dst, double v, em_site site) {
  RT_ARG(dst, name, site);
  bool is_float = !(isfinite(v) && v == trunc(v));
  em_tensor *s = rt_scalar(ir_promote_scalar(dst->dtype, is_float), v, name, site);
  em_tensor *r = inplace(op, name, dst, s, site);
  em_release(s);
  return r;
}

em_tensor *em_add_scalar__at(em_tensor *dst, double s, em_site site) { return inplace_scalar(EM_PRIM_ADD, "em_add_scalar_", dst, s, site); }
em_tensor *em_mul_scalar__at(em_tensor *dst, double s, em_site site) { return inplace_scalar(EM_PRIM_MUL, "em_mul_scalar_", dst, s, site); }

em_tensor *em_copy__at(em_tensor *dst, em_tensor *src, em_site site) {
  RT_ARG(dst, "em_copy_", site);
  RT_ARG(src, "em_copy_", site);
  static const char name[] = "em_copy_";
  if (!dst || !src) return NULL;
  if (!writable(dst, name, site)) return NULL;
  em_tensor *moved = NULL;
  if (src->storage->device != dst->storage->device && src->numel != 1) { /* a copy between devices */
    int tok = rt_break_begin(name, "copies between devices", site);
    if (tok < 0) return NULL;
    moved = rt_to_device(src, dst->storage->device, name, site);
    rt_break_end(tok);
    if (!(src = moved)) return NULL;
  }
  em_tensor *s = source_for(dst, src, name, site);
  em_release(moved);
  if (!s) return NULL;
  prim_attrs at = {.dtype = dst->dtype};
  bool ok = rt_dispatch_out(name, EM_PRIM_CONVERT, &s, 1, &at, dst, site);
  em_release(s);
  return ok ? dst : NULL;
}

em_tensor *em_fill__at(em_tensor *dst, double value, em_site site) {
  RT_ARG(dst, "em_fill_", site);
  if (!ir_value_fits(dst->dtype, value))
    return rt_error(site, "em_fill_", "value %g cannot be converted to %s without overflow", value, em_dtype_name(dst->dtype));
  em_tensor *s = rt_scalar(dst->dtype, value, "em_fill_", site);
  em_tensor *r = s ? em_copy__at(dst, s, site) : NULL;
  em_release(s);
  return r;
}

em_tensor *em_zero__at(em_tensor *dst, em_site site) { return em_fill__at(dst, 0, site); }

/* ---- reading values ---------------------------------------------------------------------- */

static double item(em_tensor *x, em_site site) {
  if (!x) return NAN;
  if (x->storage->device == EM_CUDA && x->numel == 1) { /* waits for the value */
    em_tensor *h = rt_to_device(x, EM_CPU, "em_item", site);
    double v = h ? item(h, site) : NAN;
    em_release(h);
    return v;
  }
  if (x->numel != 1) {
    char b[128];
    rt_error(site, "em_item", "needs a tensor with one element, got %s", rt_fmt(b, sizeof b, x));
    return NAN;
  }
  return prim_load(rt_data(x), x->dtype);
}

static bool to_buffer(em_tensor *x, em_dtype dt, void *dst, size_t dst_bytes, em_site site) {
  if (!x) return false;
  if (x->storage->device == EM_CUDA) {
    em_tensor *h = rt_to_device(x, EM_CPU, "em_to_buffer", site);
    bool ok = h && to_buffer(h, dt, dst, dst_bytes, site);
    em_release(h);
    return ok;
  }
  char b[128], err[256];
  if (!ir_dtype_valid(dt)) return rt_error(site, "em_to_buffer", "invalid dtype %d", (int)dt), false;
  size_t need = (size_t)x->numel * ir_dtype(dt)->size;
  if (need > dst_bytes || (need && !dst))
    return rt_error(site, "em_to_buffer", "%s as %s needs %zu bytes, the buffer has %zu", rt_fmt(b, sizeof b, x),
                    em_dtype_name(dt), need, dst_bytes), false;
  prim_buf out = {.data = dst, .dtype = dt, .ndim = x->ndim}, in = rt_buf(x);
  memcpy(out.sizes, x->sizes, sizeof out.sizes);
  ir_contiguous_strides(x->ndim, x->sizes, out.strides);
  prim_attrs at = {.dtype = dt};
  if (!prim_run(EM_PRIM_CONVERT, &at, &out, &in, 1, err, sizeof err))
    return rt_error(site, "em_to_buffer", "%s", err), false;
  return true;
}

/* Under em_compile both read data: graph breaks (see rt.h, trace.c). */
double em_item_at(em_tensor *x, em_site site) {
  if (!x) return NAN;
  int tok = rt_break_begin("em_item", "reads a tensor's value (the result depends on data)", site);
  if (tok < 0) return NAN;
  double v = item(x, site);
  rt_break_end(tok);
  rt_trace *tr = rt_trace_current();
  if (tok == 1 && tr) tr->item_values[tr->n_item_values++ % 16] = v;
  return v;
}

bool em_to_buffer_at(em_tensor *x, em_dtype dt, void *dst, size_t dst_bytes, em_site site) {
  if (!x) return false;
  int tok = rt_break_begin("em_to_buffer", "copies a tensor's data out", site);
  if (tok < 0) return false;
  bool ok = to_buffer(x, dt, dst, dst_bytes, site);
  rt_break_end(tok);
  return ok;
}

/* ---- data-dependent shapes: graph breaks under em_compile ----------------------------------- */

static em_tensor *nonzero(em_tensor *x, em_site site) {
  static const char name[] = "em_nonzero";
  if (x->storage->device == EM_CUDA) { /* on the host, then back: the count needs the data */
    em_tensor *h = rt_to_device(x, EM_CPU, name, site), *r = h ? nonzero(h, site) : NULL;
    em_tensor *d = r ? rt_to_device(r, EM_CUDA, name, site) : NULL;
    em_release(h), em_release(r);
    return d;
  }
  if (!ir_dtype(x->dtype)->cpu_compute && x->dtype != EM_BOOL) {
    char b[128];
    return rt_error(site, name, "%s has no CPU kernels (cast first)", rt_fmt(b, sizeof b, x));
  }
  size_t es = ir_dtype(x->dtype)->size;
  int64_t n = 0, idx[EM_MAX_DIMS] = {0};
  /* two passes of an odometer over x's strides: count, then write the indices */
  em_tensor *out = NULL;
  for (int pass = 0; pass < 2; pass++) {
    int64_t *o = out ? (int64_t *)rt_data(out) : NULL, k = 0;
    memset(idx, 0, sizeof idx);
    for (int64_t i = 0; i < x->numel; i++) {
      int64_t off = 0;
      for (int d = 0; d < x->ndim; d++) off += idx[d] * x->strides[d];
      if (prim_load(rt_data(x) + off * (int64_t)es, x->dtype) != 0) {
        if (o)
          for (int d = 0; d < x->ndim; d++) o[k * x->ndim + d] = idx[d];
        k++;
      }
      for (int d = x->ndim - 1; d >= 0 && ++idx[d] == x->sizes[d]; d--) idx[d] = 0;
    }
    if (pass == 0) {
      n = k;
      if (!(out = rt_new(EM_I64, 2, (int64_t[]){n, x->ndim}, name, site))) return NULL;
    }
  }
  return out;
}

em_tensor *em_nonzero_at(em_tensor *x, em_site site) {
  if (!x) return NULL;
  int tok = rt_break_begin("em_nonzero", "has an output shape that depends on data", site);
  if (tok < 0) return NULL;
  em_tensor *r = SCOPED("em_nonzero", nonzero(x, site));
  rt_break_end(tok);
  return r;
}

em_tensor *em_masked_select_at(em_tensor *x, em_tensor *mask, em_site site) {
  static const char name[] = "em_masked_select";
  if (!x || !mask) return NULL;
  char b0[128], b1[128];
  if (mask->dtype != EM_BOOL)
    return rt_error(site, name, "mask must be bool, got %s", rt_fmt(b0, sizeof b0, mask));
  ir_shape sx = {x->ndim}, sm = {mask->ndim}, s;
  memcpy(sx.sizes, x->sizes, sizeof sx.sizes), memcpy(sm.sizes, mask->sizes, sizeof sm.sizes);
  if (!ir_broadcast(&sx, &sm, &s))
    return rt_error(site, name, "x %s and mask %s do not broadcast", rt_fmt(b0, sizeof b0, x), rt_fmt(b1, sizeof b1, mask));
  int tok = rt_break_begin(name, "has an output shape that depends on data", site);
  if (tok < 0) return NULL;
  em_tensor *r = NULL;
  if (em_scope_begin_at(site)) {
    int64_t numel = ir_numel(s.ndim, s.sizes);
    em_tensor *xf = em_reshape_at(em_expand_at(x, s.ndim, s.sizes, site), 1, &numel, site);
    em_tensor *mf = em_reshape_at(em_expand_at(mask, s.ndim, s.sizes, site), 1, &numel, site);
    em_tensor *nz = mf ? SCOPED(name, nonzero(mf, site)) : NULL;
    em_tensor *idx = nz ? em_reshape_at(nz, 1, &nz->sizes[0], site) : NULL;
    r = em_keep_at(em_index_select_at(xf, 0, idx, site), site);
    em_scope_end_at(site);
  }
  rt_break_end(tok);
  return r;
}
