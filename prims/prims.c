/* prims/prims.c: the primitive table, the meta functions and the view rules.
 *
 * Meta functions are written per op family (flags), not per op, so a new pointwise prim needs a
 * row in prims.def and a kernel, nothing here. They only compute dtypes and shapes; they never
 * touch data, so the tracer can run them on proxies. */
#include "prims.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const prim_info prim_table[EM_PRIM_COUNT] = {
#define PRIM(name, arity, flags, attrs, expr) [EM_PRIM_##name] = {#name, arity, flags, attrs, expr},
#include "prims.def"
#undef PRIM
};

/* Lower-case names, made once from the table so they cannot drift from it. */
static char prim_names[EM_PRIM_COUNT][24];
static prim_info prim_lower[EM_PRIM_COUNT];

static void prim_init_names(void) {
  for (int i = 0; i < EM_PRIM_COUNT; i++) {
    size_t j = 0;
    for (; prim_table[i].name[j] && j < sizeof prim_names[i] - 1; j++) {
      char c = prim_table[i].name[j];
      prim_names[i][j] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    prim_names[i][j] = 0;
    prim_lower[i] = prim_table[i];
    prim_lower[i].name = prim_names[i];
  }
}

__attribute__((constructor)) static void prim_names_ctor(void) { prim_init_names(); }

const prim_info *prim_get(em_prim op) { return &prim_lower[op]; }

static bool fail(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return false;
}

static void set_shape(prim_meta *out, em_dtype dt, int ndim, const int64_t *sizes) {
  out->dtype = dt;
  out->ndim = ndim;
  for (int i = 0; i < ndim; i++) out->sizes[i] = sizes[i];
  ir_contiguous_strides(ndim, sizes, out->strides);
  out->offset = 0;
}

static bool same_shape(const prim_meta *a, const prim_meta *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return false;
  return true;
}

static char *fmt(char *buf, size_t cap, const prim_meta *m) {
  return ir_fmt_type(buf, cap, m->dtype, m->ndim, m->sizes);
}

static bool meta_pointwise(em_prim op, const prim_info *pi, const prim_attrs *at,
                           const prim_meta *in, int n, prim_meta *out, char *err, size_t cap) {
  char b0[96], b1[96];
  for (int i = 1; i < n; i++)
    if (!same_shape(&in[0], &in[i]))
      return fail(err, cap, "operands differ in shape: %s and %s", fmt(b0, 96, &in[0]),
                  fmt(b1, 96, &in[i]));
  em_dtype dt = in[0].dtype;
  if (op == EM_PRIM_WHERE) {
    if (in[0].dtype != EM_BOOL) return fail(err, cap, "condition must be bool, got %s", fmt(b0, 96, &in[0]));
    if (in[1].dtype != in[2].dtype)
      return fail(err, cap, "operands differ in dtype: %s and %s", fmt(b0, 96, &in[1]), fmt(b1, 96, &in[2]));
    set_shape(out, in[1].dtype, in[0].ndim, in[0].sizes);
    return true;
  }
  if (op == EM_PRIM_CONVERT) {
    if (!ir_dtype_valid(at->dtype)) return fail(err, cap, "invalid target dtype %d", (int)at->dtype);
    set_shape(out, at->dtype, in[0].ndim, in[0].sizes);
    return true;
  }
  for (int i = 1; i < n; i++)
    if (in[i].dtype != dt)
      return fail(err, cap, "operands differ in dtype: %s and %s", fmt(b0, 96, &in[0]), fmt(b1, 96, &in[i]));
  if ((pi->flags & P_FLOAT_ONLY) && !ir_is_float(dt))
    return fail(err, cap, "needs a floating dtype, got %s", fmt(b0, 96, &in[0]));
  if ((pi->flags & P_NO_BOOL) && dt == EM_BOOL)
    return fail(err, cap, "is not defined for bool, got %s", fmt(b0, 96, &in[0]));
  set_shape(out, (pi->flags & P_BOOL_OUT) ? EM_BOOL : dt, in[0].ndim, in[0].sizes);
  return true;
}

static bool meta_reduce(em_prim op, const prim_attrs *at, const prim_meta *x, prim_meta *out,
                        char *err, size_t cap) {
  bool red[EM_MAX_DIMS] = {0};
  char b0[96];
  if (at->n_axes == 0) {
    for (int i = 0; i < x->ndim; i++) red[i] = true;
  }
  for (int i = 0; i < at->n_axes; i++) {
    int a = ir_norm_axis(at->axes[i], x->ndim);
    if (a < 0 && !(x->ndim == 0 && (at->axes[i] == 0 || at->axes[i] == -1)))
      return fail(err, cap, "axis %lld out of range for %s", (long long)at->axes[i], fmt(b0, 96, x));
    if (a < 0) continue; /* a 0-dim tensor accepts axis 0 / -1, as torch does */
    if (red[a]) return fail(err, cap, "axis %d repeated", a);
    red[a] = true;
  }
  bool arg = op == EM_PRIM_ARGMAX || op == EM_PRIM_ARGMIN;
  if (arg && at->n_axes > 1) return fail(err, cap, "reduces over one axis or all, got %d axes", at->n_axes);
  if (op != EM_PRIM_SUM && op != EM_PRIM_PROD) {
    for (int i = 0; i < x->ndim; i++)
      if (red[i] && x->sizes[i] == 0)
        return fail(err, cap, "cannot reduce over axis %d of size 0 in %s (no identity)", i, fmt(b0, 96, x));
  }
  em_dtype dt = x->dtype;
  if (arg) dt = EM_I64;
  else if ((op == EM_PRIM_SUM || op == EM_PRIM_PROD) && !ir_is_float(dt)) dt = EM_I64;
  int64_t sizes[EM_MAX_DIMS];
  int n = 0;
  for (int i = 0; i < x->ndim; i++) {
    if (!red[i]) sizes[n++] = x->sizes[i];
    else if (at->keepdim) sizes[n++] = 1;
  }
  set_shape(out, dt, n, sizes);
  return true;
}

/* View rule for reshape, after PyTorch's computeStride: walks x's dims in chunks that are
 * contiguous among themselves and maps each chunk onto a run of new dims of equal numel. */
static bool reshape_strides(const prim_meta *x, const ir_shape *to, int64_t *strides) {
  int64_t numel = ir_numel(x->ndim, x->sizes);
  if (numel == 0 || x->ndim == 0) {
    ir_contiguous_strides(to->ndim, to->sizes, strides);
    return true;
  }
  int view_d = to->ndim - 1;
  int64_t chunk_base_stride = x->ndim ? x->strides[x->ndim - 1] : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    tensor_numel *= x->sizes[d];
    if (d == 0 || (x->sizes[d - 1] != 1 && x->strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || to->sizes[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= to->sizes[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = x->strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

static bool meta_view(em_prim op, const prim_attrs *at, const prim_meta *x, prim_meta *out,
                      char *err, size_t cap) {
  char b0[96];
  prim_meta r = {.dtype = x->dtype, .offset = x->offset};
  switch (op) {
  case EM_PRIM_RESHAPE: {
    if (ir_numel(at->shape.ndim, at->shape.sizes) != ir_numel(x->ndim, x->sizes)) {
      char b1[96];
      return fail(err, cap, "cannot reshape %s to %s (element counts differ)", fmt(b0, 96, x),
                  ir_fmt_type(b1, 96, x->dtype, at->shape.ndim, at->shape.sizes));
    }
    r.ndim = at->shape.ndim;
    memcpy(r.sizes, at->shape.sizes, sizeof(int64_t) * (size_t)r.ndim);
    if (!reshape_strides(x, &at->shape, r.strides)) return fail(err, cap, "no view");
    break;
  }
  case EM_PRIM_PERMUTE: {
    bool seen[EM_MAX_DIMS] = {0};
    if (at->n_axes != x->ndim)
      return fail(err, cap, "permutation has %d entries for %s", at->n_axes, fmt(b0, 96, x));
    r.ndim = x->ndim;
    for (int i = 0; i < x->ndim; i++) {
      int a = ir_norm_axis(at->axes[i], x->ndim);
      if (a < 0 || seen[a]) return fail(err, cap, "not a permutation of the %d axes of %s", x->ndim, fmt(b0, 96, x));
      seen[a] = true;
      r.sizes[i] = x->sizes[a];
      r.strides[i] = x->strides[a];
    }
    break;
  }
  case EM_PRIM_EXPAND: {
    int n = at->shape.ndim, lead = n - x->ndim;
    if (lead < 0) return fail(err, cap, "cannot expand %s to fewer dims (%d)", fmt(b0, 96, x), n);
    r.ndim = n;
    for (int i = 0; i < n; i++) {
      int64_t s = at->shape.sizes[i];
      if (i < lead) {
        if (s < 0) return fail(err, cap, "size %lld invalid for new leading dim", (long long)s);
        r.sizes[i] = s;
        r.strides[i] = 0;
        continue;
      }
      int64_t xs = x->sizes[i - lead];
      if (s == xs) {
        r.sizes[i] = s;
        r.strides[i] = x->strides[i - lead];
      } else if (xs == 1 && s >= 0) {
        r.sizes[i] = s;
        r.strides[i] = 0;
      } else {
        char b1[96];
        return fail(err, cap, "cannot expand %s to %s: dim %d has size %lld, not 1", fmt(b0, 96, x),
                    ir_fmt_type(b1, 96, x->dtype, n, at->shape.sizes), i - lead, (long long)xs);
      }
    }
    break;
  }
  case EM_PRIM_SLICE: {
    int a = ir_norm_axis(at->axes[0], x->ndim);
    if (a < 0) return fail(err, cap, "axis %lld out of range for %s", (long long)at->axes[0], fmt(b0, 96, x));
    if (at->step < 1) return fail(err, cap, "step must be >= 1, got %lld", (long long)at->step);
    if (at->start < 0 || at->stop < at->start || at->stop > x->sizes[a])
      return fail(err, cap, "bounds [%lld, %lld) invalid for axis %d of %s", (long long)at->start,
                  (long long)at->stop, a, fmt(b0, 96, x));
    r = *x;
    /* without overflow for any step (a step of INT64_MAX made a size of -1: issue 17) */
    r.sizes[a] = at->stop > at->start ? 1 + (at->stop - at->start - 1) / at->step : 0;
    r.strides[a] = r.sizes[a] > 1 ? x->strides[a] * at->step : x->strides[a]; /* <= the extent: no overflow */
    r.offset = x->offset + (r.sizes[a] ? at->start * x->strides[a] : 0);
    break;
  }
  case EM_PRIM_SQUEEZE: {
    bool drop[EM_MAX_DIMS] = {0};
    if (at->n_axes == 0)
      for (int i = 0; i < x->ndim; i++) drop[i] = x->sizes[i] == 1;
    for (int i = 0; i < at->n_axes; i++) {
      int a = ir_norm_axis(at->axes[i], x->ndim);
      if (a < 0) return fail(err, cap, "axis %lld out of range for %s", (long long)at->axes[i], fmt(b0, 96, x));
      if (x->sizes[a] != 1) return fail(err, cap, "axis %d of %s has size %lld, not 1", a, fmt(b0, 96, x), (long long)x->sizes[a]);
      drop[a] = true;
    }
    for (int i = 0; i < x->ndim; i++) {
      if (drop[i]) continue;
      r.sizes[r.ndim] = x->sizes[i];
      r.strides[r.ndim++] = x->strides[i];
    }
    break;
  }
  case EM_PRIM_DETACH:
    r = *x;
    break;
  case EM_PRIM_UNSQUEEZE: {
    int64_t a = at->axes[0];
    if (a < 0) a += x->ndim + 1;
    if (a < 0 || a > x->ndim || x->ndim >= EM_MAX_DIMS)
      return fail(err, cap, "axis %lld out of range for %s", (long long)at->axes[0], fmt(b0, 96, x));
    r.ndim = x->ndim + 1;
    for (int i = 0, j = 0; i < r.ndim; i++) {
      if (i == a) {
        r.sizes[i] = 1;
        r.strides[i] = a < x->ndim ? x->sizes[a] * x->strides[a] : 1;
      } else {
        r.sizes[i] = x->sizes[j];
        r.strides[i] = x->strides[j++];
      }
    }
    break;
  }
  default:
    return fail(err, cap, "not a view");
  }
  *out = r;
  return true;
}

static bool meta_conv(em_prim op, const prim_attrs *at, const prim_meta *in, prim_meta *out,
                      char *err, size_t cap) {
  char b0[96], b1[96];
  const em_conv2d_params *p = &at->conv;
  for (int i = 0; i < 2; i++)
    if (p->stride[i] < 1 || p->padding[i] < 0 || p->dilation[i] < 1)
      return fail(err, cap, "stride and dilation must be >= 1 and padding >= 0");
  if (p->groups < 1) return fail(err, cap, "groups must be >= 1, got %lld", (long long)p->groups);
  if (in[0].ndim != 4 || in[1].ndim != 4)
    return fail(err, cap, "needs 4-D operands, got %s and %s", fmt(b0, 96, &in[0]), fmt(b1, 96, &in[1]));
  if (in[0].dtype != in[1].dtype)
    return fail(err, cap, "operands differ in dtype: %s and %s", fmt(b0, 96, &in[0]), fmt(b1, 96, &in[1]));
  if (!ir_is_float(in[0].dtype)) return fail(err, cap, "needs f32 or f64, got %s", fmt(b0, 96, &in[0]));
  /* Recover the forward problem: x [N,C,H,W], w [O,C/g,kh,kw], y [N,O,Ho,Wo]. */
  int64_t x[4], w[4], y[4];
  if (op == EM_PRIM_CONV2D) {
    memcpy(x, in[0].sizes, sizeof x);
    memcpy(w, in[1].sizes, sizeof w);
  } else if (op == EM_PRIM_CONV2D_BWD_INPUT) {
    if (at->shape.ndim != 4) return fail(err, cap, "input shape must have 4 dims");
    memcpy(x, at->shape.sizes, sizeof x);
    memcpy(w, in[1].sizes, sizeof w);
    memcpy(y, in[0].sizes, sizeof y);
  } else {
    if (at->shape.ndim != 4) return fail(err, cap, "weight shape must have 4 dims");
    memcpy(x, in[0].sizes, sizeof x);
    memcpy(w, at->shape.sizes, sizeof w);
    memcpy(y, in[1].sizes, sizeof y);
  }
  if (w[2] < 1 || w[3] < 1) /* a 0x0 kernel was accepted (issue 17) */
    return fail(err, cap, "the kernel must be at least 1x1, got %lldx%lld", (long long)w[2], (long long)w[3]);
  if (x[1] % p->groups || w[0] % p->groups)
    return fail(err, cap, "groups %lld must divide input channels %lld and output channels %lld",
                (long long)p->groups, (long long)x[1], (long long)w[0]);
  int64_t wc;
  if (!ir_mul_ok(w[1], p->groups, &wc) || wc != x[1])
    return fail(err, cap, "input has %lld channels but weight expects %lld x %lld groups (x %s, w %s)", (long long)x[1],
                (long long)w[1], (long long)p->groups, ir_fmt_type(b0, 96, in[0].dtype, 4, x),
                ir_fmt_type(b1, 96, in[0].dtype, 4, w));
  int64_t ho[2];
  for (int i = 0; i < 2; i++) {
    /* span = dilation (k - 1) + 1, padded = x + 2 padding: both checked (issue 17) */
    int64_t span, padded, room;
    if (!ir_mul_ok(p->dilation[i], w[2 + i] - 1, &span) || !ir_add_ok(span, 1, &span) ||
        !ir_mul_ok(p->padding[i], 2, &padded) || !ir_add_ok(padded, x[2 + i], &padded))
      return fail(err, cap, "padding %lld or dilation %lld does not fit in 64 bits with input %s",
                  (long long)p->padding[i], (long long)p->dilation[i], ir_fmt_type(b0, 96, in[0].dtype, 4, x));
    if (!ir_sub_ok(padded, span, &room) || room < 0)
      return fail(err, cap, "kernel %lldx%lld (dilated) is larger than the padded input %s",
                  (long long)w[2], (long long)w[3], ir_fmt_type(b0, 96, in[0].dtype, 4, x));
    ho[i] = room / p->stride[i] + 1;
  }
  if (op == EM_PRIM_CONV2D) {
    int64_t s[4] = {x[0], w[0], ho[0], ho[1]};
    set_shape(out, in[0].dtype, 4, s);
    return true;
  }
  if (y[0] != x[0] || y[1] != w[0] || y[2] != ho[0] || y[3] != ho[1]) {
    int64_t e[4] = {x[0], w[0], ho[0], ho[1]};
    return fail(err, cap, "grad_out is %s but the convolution gives %s",
                ir_fmt_type(b0, 96, in[0].dtype, 4, y), ir_fmt_type(b1, 96, in[0].dtype, 4, e));
  }
  set_shape(out, in[0].dtype, 4, op == EM_PRIM_CONV2D_BWD_INPUT ? x : w);
  return true;
}

static bool meta_index(em_prim op, const prim_attrs *at, const prim_meta *in, int n, prim_meta *out,
                       char *err, size_t cap) {
  char b0[96], b1[96];
  const prim_meta *x = &in[0], *idx = &in[1];
  int a = ir_norm_axis(at->axes[0], x->ndim ? x->ndim : 1);
  if (a < 0) return fail(err, cap, "axis %lld out of range for %s", (long long)at->axes[0], fmt(b0, 96, x));
  if (idx->dtype != EM_I64) return fail(err, cap, "index must be i64, got %s", fmt(b0, 96, idx));
  if (op == EM_PRIM_INDEX_SELECT) {
    if (idx->ndim > 1) return fail(err, cap, "index must be 0-D or 1-D, got %s", fmt(b0, 96, idx));
    set_shape(out, x->dtype, x->ndim, x->sizes);
    if (x->ndim) out->sizes[a] = idx->ndim ? idx->sizes[0] : 1;
    ir_contiguous_strides(out->ndim, out->sizes, out->strides);
    return true;
  }
  if (idx->ndim != x->ndim)
    return fail(err, cap, "index %s must have as many dims as input %s", fmt(b0, 96, idx), fmt(b1, 96, x));
  for (int d = 0; d < x->ndim; d++)
    if (d != a && idx->sizes[d] > x->sizes[d])
      return fail(err, cap, "index %s is larger than input %s off axis %d", fmt(b0, 96, idx), fmt(b1, 96, x), a);
  if (op == EM_PRIM_SCATTER_ADD) {
    const prim_meta *src = &in[2];
    if (n < 3 || src->ndim != x->ndim)
      return fail(err, cap, "src must have as many dims as input %s", fmt(b0, 96, x));
    if (src->dtype != x->dtype)
      return fail(err, cap, "src %s and input %s differ in dtype", fmt(b0, 96, src), fmt(b1, 96, x));
    for (int d = 0; d < x->ndim; d++)
      if (idx->sizes[d] > src->sizes[d])
        return fail(err, cap, "index %s is larger than src %s", fmt(b0, 96, idx), fmt(b1, 96, src));
    set_shape(out, x->dtype, x->ndim, x->sizes);
    return true;
  }
  set_shape(out, x->dtype, idx->ndim, idx->sizes);
  return true;
}

/* Scans and argsort: one axis (a 0-dim operand takes 0 or -1, as torch.cumsum and torch.sort do);
 * the result has the operand's shape; scans of integers and bool give i64, argsort gives i64. */
static bool meta_scan(em_prim op, const prim_attrs *at, const prim_meta *x, prim_meta *out, char *err, size_t cap) {
  char b0[96];
  if (at->n_axes != 1) return fail(err, cap, "runs along one axis, got %d axes", at->n_axes);
  if (ir_norm_axis(at->axes[0], x->ndim ? x->ndim : 1) < 0)
    return fail(err, cap, "axis %lld out of range for %s", (long long)at->axes[0], fmt(b0, 96, x));
  em_dtype dt = op == EM_PRIM_ARGSORT || !ir_is_float(x->dtype) ? EM_I64 : x->dtype;
  set_shape(out, dt, x->ndim, x->sizes);
  return true;
}

/* ---- canonical attributes ------------------------------------------------------------- */

static void sort_axes(int64_t *a, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && a[j - 1] > a[j]; j--) {
      int64_t t = a[j];
      a[j] = a[j - 1], a[j - 1] = t;
    }
}

void prim_canonical_attrs(em_prim op, prim_attrs *at, int in_ndim) {
  if (!strstr(prim_get(op)->attrs, "axes") || at->n_axes < 0 || at->n_axes > EM_MAX_DIMS) return;
  int nd = in_ndim;
  bool ordered = op == EM_PRIM_PERMUTE; /* permute's order is its meaning; the others' is not */
  if (op == EM_PRIM_UNSQUEEZE) nd = in_ndim + 1;
  if (prim_get(op)->flags & (P_INDEXING | P_SCAN)) nd = in_ndim ? in_ndim : 1; /* a 0-dim operand takes axis 0/-1 */
  bool all_valid = true;
  for (int i = 0; i < at->n_axes; i++) {
    int64_t a = at->axes[i];
    if (a < 0 && a >= -(int64_t)nd) at->axes[i] = a + nd;
    all_valid = all_valid && at->axes[i] >= 0 && at->axes[i] < nd;
  }
  /* "all axes" spelled out (argmax/argmin's "all" flattens instead: kept as none): a pass that
   * marks the listed axes saw no axis reduced (issue 15: the inductor took mean(x) over
   * [4, 3, 1] for a reduction over the last, size-1 dim) */
  if ((prim_get(op)->flags & P_REDUCTION) && op != EM_PRIM_ARGMAX && op != EM_PRIM_ARGMIN && at->n_axes == 0) {
    for (int d = 0; d < in_ndim; d++) at->axes[d] = d;
    at->n_axes = in_ndim;
    return;
  }
  /* a 0-dim operand of a reduction accepts axis 0 / -1 and reduces nothing, as "all" does */
  if ((prim_get(op)->flags & P_REDUCTION) && in_ndim == 0) {
    int k = 0;
    for (int i = 0; i < at->n_axes; i++)
      if (at->axes[i] != 0 && at->axes[i] != -1) at->axes[k++] = at->axes[i];
    at->n_axes = k;
    return;
  }
  if (!ordered && all_valid && at->n_axes > 1 && !(prim_get(op)->flags & P_INDEXING) && op != EM_PRIM_SLICE &&
      op != EM_PRIM_SLICE_SCATTER && op != EM_PRIM_CAT && op != EM_PRIM_UNSQUEEZE)
    sort_axes(at->axes, at->n_axes);
}

bool prim_attrs_canonical(em_prim op, const prim_attrs *at, int in_ndim) {
  prim_attrs c = *at;
  prim_canonical_attrs(op, &c, in_ndim);
  return c.n_axes == at->n_axes && !memcmp(c.axes, at->axes, sizeof(int64_t) * (size_t)(c.n_axes > 0 ? c.n_axes : 0));
}

static bool meta_fn(em_prim op, const prim_attrs *at, const prim_meta *in, int n_in, prim_meta *out, char *err,
                    size_t cap);

/* Every result's element count must fit in 64 bits: an expand to [2^32, 2^32] made a view whose
 * count saturated (its sum was 0: issue 17). */
bool prim_meta_fn(em_prim op, const prim_attrs *at, const prim_meta *in, int n_in, prim_meta *out,
                  char *err, size_t cap) {
  if (!meta_fn(op, at, in, n_in, out, err, cap)) return false;
  for (int i = 0; i < out->ndim; i++)
    if (out->sizes[i] < 0) return fail(err, cap, "the result would have a negative size");
  if (!ir_shape_fits(out->ndim, out->sizes)) {
    char b[96];
    return fail(err, cap, "the result %s would have more elements than fit in 64 bits", fmt(b, 96, out));
  }
  return true;
}

static bool meta_fn(em_prim op, const prim_attrs *at, const prim_meta *in, int n_in, prim_meta *out, char *err,
                    size_t cap) {
  const prim_info *pi = prim_get(op);
  char b0[96], b1[96];
  if (pi->arity >= 0 && n_in != pi->arity)
    return fail(err, cap, "takes %d operands, got %d", pi->arity, n_in);
  if (pi->arity < 0 && n_in < 1) return fail(err, cap, "needs at least one operand");
  for (int i = 0; i < n_in; i++)
    if (!ir_dtype_valid(in[i].dtype)) return fail(err, cap, "operand %d has an invalid dtype", i);
  if (pi->flags & P_POINTWISE) return meta_pointwise(op, pi, at, in, n_in, out, err, cap);
  if (pi->flags & P_REDUCTION) return meta_reduce(op, at, &in[0], out, err, cap);
  if (pi->flags & P_VIEW) return meta_view(op, at, &in[0], out, err, cap);
  if (pi->flags & P_INDEXING) return meta_index(op, at, in, n_in, out, err, cap);
  if (pi->flags & P_SCAN) return meta_scan(op, at, &in[0], out, err, cap);
  switch (op) {
  case EM_PRIM_CLONE:
    set_shape(out, in[0].dtype, in[0].ndim, in[0].sizes);
    return true;
  case EM_PRIM_FLIP: {
    bool seen[EM_MAX_DIMS] = {0};
    for (int i = 0; i < at->n_axes; i++) {
      int a = ir_norm_axis(at->axes[i], in[0].ndim);
      if (a < 0) return fail(err, cap, "axis %lld out of range for %s", (long long)at->axes[i], fmt(b0, 96, &in[0]));
      if (seen[a]) return fail(err, cap, "axis %d repeated", a);
      seen[a] = true;
    }
    set_shape(out, in[0].dtype, in[0].ndim, in[0].sizes);
    return true;
  }
  case EM_PRIM_PAD: {
    const prim_meta *x = &in[0];
    if (at->n_pads % 2 || at->n_pads > 2 * x->ndim)
      return fail(err, cap, "needs an even number of pads, at most 2 per dim, got %d for %s", at->n_pads, fmt(b0, 96, x));
    set_shape(out, x->dtype, x->ndim, x->sizes);
    for (int i = 0; i < at->n_pads; i++) {
      if (at->pads[i] < 0) return fail(err, cap, "pad amounts must be >= 0, got %lld", (long long)at->pads[i]);
      int64_t *sz = &out->sizes[x->ndim - 1 - i / 2];
      if (!ir_add_ok(*sz, at->pads[i], sz)) /* padding INT64_MAX wrote out of bounds: issue 17 */
        return fail(err, cap, "padding %s by %lld does not fit in 64 bits", fmt(b0, 96, x), (long long)at->pads[i]);
    }
    ir_contiguous_strides(out->ndim, out->sizes, out->strides);
    return true;
  }
  case EM_PRIM_CAT: {
    const prim_meta *x = &in[0];
    int a = ir_norm_axis(at->axes[0], x->ndim);
    if (a < 0) return fail(err, cap, "axis %lld out of range for %s", (long long)at->axes[0], fmt(b0, 96, x));
    int64_t total = 0;
    for (int i = 0; i < n_in; i++) {
      if (in[i].dtype != x->dtype || in[i].ndim != x->ndim)
        return fail(err, cap, "operand %d is %s but operand 0 is %s", i, fmt(b0, 96, &in[i]), fmt(b1, 96, x));
      for (int d = 0; d < x->ndim; d++)
        if (d != a && in[i].sizes[d] != x->sizes[d])
          return fail(err, cap, "operand %d is %s but operand 0 is %s (sizes must match off axis %d)", i,
                      fmt(b0, 96, &in[i]), fmt(b1, 96, x), a);
      if (!ir_add_ok(total, in[i].sizes[a], &total))
        return fail(err, cap, "the result's size along axis %d does not fit in 64 bits", a);
    }
    set_shape(out, x->dtype, x->ndim, x->sizes);
    out->sizes[a] = total;
    ir_contiguous_strides(out->ndim, out->sizes, out->strides);
    return true;
  }
  case EM_PRIM_SLICE_SCATTER: {
    /* base with src written into base[..., start:stop:step, ...]: src has that slice's shape */
    prim_meta view;
    if (!meta_view(EM_PRIM_SLICE, at, &in[0], &view, err, cap)) return false;
    if (in[1].dtype != in[0].dtype || !same_shape(&view, &in[1]))
      return fail(err, cap, "src %s does not match the slice %s of %s", fmt(b0, 96, &in[1]),
                  ir_fmt_type(b1, 96, in[0].dtype, view.ndim, view.sizes), fmt(b1, 96, &in[0]));
    set_shape(out, in[0].dtype, in[0].ndim, in[0].sizes);
    return true;
  }
  case EM_PRIM_FULL:
  case EM_PRIM_IOTA:
  case EM_PRIM_PHILOX_UNIFORM:
  case EM_PRIM_PHILOX_NORMAL:
    if (!ir_dtype_valid(at->dtype)) return fail(err, cap, "invalid dtype %d", (int)at->dtype);
    if ((pi->flags & P_RANDOM) && at->dtype != EM_F32 && at->dtype != EM_F64)
      return fail(err, cap, "needs dtype f32 or f64, got %s", em_dtype_name(at->dtype));
    for (int i = 0; i < at->shape.ndim; i++)
      if (at->shape.sizes[i] < 0) return fail(err, cap, "size %lld is negative", (long long)at->shape.sizes[i]);
    set_shape(out, at->dtype, at->shape.ndim, at->shape.sizes);
    return true;
  case EM_PRIM_MATMUL: {
    const prim_meta *a = &in[0], *b = &in[1];
    if (a->ndim < 2 || a->ndim != b->ndim)
      return fail(err, cap, "needs operands of equal rank >= 2, got %s and %s", fmt(b0, 96, a), fmt(b1, 96, b));
    if (a->dtype != b->dtype)
      return fail(err, cap, "operands differ in dtype: %s and %s", fmt(b0, 96, a), fmt(b1, 96, b));
    if (a->dtype == EM_BOOL || a->dtype == EM_U8) /* f16 / bf16: on CUDA (the dispatcher refuses them on the CPU) */
      return fail(err, cap, "is not defined for %s", em_dtype_name(a->dtype));
    int n = a->ndim;
    if (a->sizes[n - 1] != b->sizes[n - 2])
      return fail(err, cap, "inner dimensions differ: a is %s, b is %s", fmt(b0, 96, a), fmt(b1, 96, b));
    for (int i = 0; i < n - 2; i++)
      if (a->sizes[i] != b->sizes[i])
        return fail(err, cap, "batch dims differ: a is %s, b is %s", fmt(b0, 96, a), fmt(b1, 96, b));
    set_shape(out, a->dtype, n, a->sizes);
    out->sizes[n - 1] = b->sizes[n - 1];
    ir_contiguous_strides(n, out->sizes, out->strides);
    return true;
  }
  case EM_PRIM_CONV2D:
  case EM_PRIM_CONV2D_BWD_INPUT:
  case EM_PRIM_CONV2D_BWD_WEIGHT:
    return meta_conv(op, at, in, out, err, cap);
  default:
    return fail(err, cap, "has no meta function");
  }
}

bool prim_run(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in, int n_in,
              char *err, size_t cap) {
  unsigned f = prim_get(op)->flags;
  if (f & P_POINTWISE) return prim_run_pointwise(op, at, out, in, err, cap);
  if (f & P_REDUCTION) return prim_run_reduce(op, at, out, in, err, cap);
  if (f & (P_MOVEMENT | P_INDEXING)) return prim_run_movement(op, at, out, in, n_in, err, cap);
  if (f & P_CREATION) return prim_run_creation(op, at, out, err, cap);
  if (f & P_EXTERN) return prim_run_extern(op, at, out, in, err, cap);
  if (f & P_SCAN) return prim_run_scan(op, at, out, in, err, cap);
  return fail(err, cap, "has no kernel (views are made by the runtime)");
}
