/* runtime/vjp.c: one vector-Jacobian rule per prim.
 *
 * Each rule maps the gradient g of a prim's output to the gradients of its inputs, written with
 * the public op API (so that under create_graph the engine records the backward itself, and so
 * that a later issue can trace it into a graph). Every op is called with the forward op's site,
 * so an error in backward names the user's line that recorded the node.
 *
 * Broadcasting never appears here: prims take operands of one shape, and the op layer
 * broadcasts with EXPAND, whose rule (sum over the stretched dims) is the one place where a
 * gradient is reduced back to a broadcast input's shape. Likewise type promotion is CONVERT,
 * whose rule casts back. Rules read saved inputs only; outputs are recomputed (autograd.c says
 * why). */
#include "rt.h"

#include <math.h>
#include <string.h>

bool rt_vjp_saves_inputs(em_prim op) { return prim_get(op)->flags & P_SAVES_INPUTS; }

/* The gradient g of a reduction's output, viewed with the reduced axes kept (size 1) and
 * expanded to the input's shape. */
static em_tensor *unreduce(rt_node *n, em_tensor *g, em_site s) {
  const prim_meta *x = &n->in_meta[0];
  bool red[EM_MAX_DIMS] = {0};
  if (n->attrs.n_axes == 0)
    for (int i = 0; i < x->ndim; i++) red[i] = true;
  for (int i = 0; i < n->attrs.n_axes; i++) {
    int a = ir_norm_axis(n->attrs.axes[i], x->ndim);
    if (a >= 0) red[a] = true;
  }
  int64_t kept[EM_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) kept[i] = red[i] ? 1 : x->sizes[i];
  em_tensor *k = em_reshape_at(g, x->ndim, kept, s);
  return em_expand_at(k, x->ndim, x->sizes, s);
}

static em_tensor *zeros_like_meta(const prim_meta *m, em_site s) { return em_zeros_at(m->dtype, m->ndim, m->sizes, s); }

/* The input's reduction recomputed with keepdim, expanded to the input's shape. */
static em_tensor *rereduce(rt_node *n, em_tensor *x, em_site s) {
  const prim_attrs *a = &n->attrs;
  em_tensor *r = n->op == EM_PRIM_PROD ? em_prod_at(x, a->n_axes, a->axes, true, s)
               : n->op == EM_PRIM_AMAX ? em_amax_at(x, a->n_axes, a->axes, true, s)
                                        : em_amin_at(x, a->n_axes, a->axes, true, s);
  return em_expand_at(r, x->ndim, x->sizes, s);
}

/* Gradient of a slice: g written into a zero tensor of the input's shape. */
static em_tensor *unslice(rt_node *n, em_tensor *g, em_site s) {
  const prim_meta *x = &n->in_meta[0];
  return em_slice_scatter_at(zeros_like_meta(x, s), g, (int)n->attrs.axes[0], n->attrs.start, n->attrs.stop,
                             n->attrs.step, s);
}

static em_tensor *scalar(em_dtype dt, double v, em_site s) { return em_scalar_at(dt, v, s); }

/* sum over k >= i of t_k along axis a */
static em_tensor *reverse_cumsum(em_tensor *t, int a, em_site s) {
  if (t && t->ndim == 0) return t; /* one element: itself (a 0-dim tensor has no axis to flip) */
  int64_t ax = a;
  return em_flip_at(em_cumsum_at(em_flip_at(t, 1, &ax, s), a, s), 1, &ax, s);
}

/* Gradient of y = cumprod(x) along a, correct where x has zeros (PyTorch's cumprod_backward,
 * in O(n) ops). dx_i = sum_{k >= i} g_k prod_{j <= k, j != i} x_j. Let z be the first zero of
 * the line: before it, prod_{j <= k, j != i} x_j = y_k / x_i (y_k = 0 from z on), so
 * dx_i = reverse_cumsum(g y)_i / x_i; at z, the products are those of x with x_z taken as 1,
 * dx_z = reverse_cumsum(g cumprod(x with x_z = 1))_z; after z every product holds x_z: 0. */
static em_tensor *cumprod_vjp(em_tensor *x, em_tensor *g, int a, em_site s) {
  em_dtype dt = g->dtype;
  em_tensor *zero = em_eq_scalar_at(x, 0, s);
  em_tensor *zeros_so_far = em_cumsum_at(zero, a, s); /* i64 */
  em_tensor *before = em_eq_scalar_at(zeros_so_far, 0, s);
  em_tensor *first = em_logical_and_at(zero, em_eq_scalar_at(zeros_so_far, 1, s), s);
  em_tensor *one = scalar(dt, 1, s);
  em_tensor *y = em_cumprod_at(x, a, s);
  em_tensor *d_before = em_div_at(reverse_cumsum(em_mul_at(g, y, s), a, s), em_where_at(before, x, one, s), s);
  em_tensor *y_skip = em_cumprod_at(em_where_at(first, one, x, s), a, s);
  em_tensor *d_first = reverse_cumsum(em_mul_at(g, y_skip, s), a, s);
  return em_where_at(before, d_before, em_where_at(first, d_first, scalar(dt, 0, s), s), s);
}

/* x with its elements shifted one place along axis a, value 1 shifted in at the start. */
static em_tensor *shift_in_one(em_tensor *x, int a, em_site s) {
  int64_t pads[2 * EM_MAX_DIMS] = {0};
  int np = 2 * (x->ndim - a);
  pads[np - 2] = 1; /* the left amount of axis a (pads run last dim first) */
  return em_slice_at(em_pad_at(x, np, pads, 1, s), a, 0, x->sizes[a], 1, s);
}

/* torch's prod_backward along one axis, g and prod already expanded to x's shape: with no zero
 * anywhere in x, g * (prod / x); otherwise the product of all other elements of the slice as the
 * exclusive cumulative products from both ends (prod_safe_zeros_backward), which is also what
 * a slice holding zeros beside NaN or inf gives in torch. The "anywhere" is torch's test (over
 * the whole tensor, not per slice), made a select so the rule never reads data back. */
static em_tensor *prod_axis_vjp(em_tensor *x, em_tensor *g, em_tensor *prod, int a, em_site s) {
  int64_t ax = a;
  em_tensor *any_zero = em_gt_scalar_at(em_sum_at(em_eq_scalar_at(x, 0, s), 0, NULL, false, s), 0, s);
  em_tensor *left = shift_in_one(em_cumprod_at(x, a, s), a, s);
  em_tensor *xr = em_flip_at(x, 1, &ax, s);
  em_tensor *right = em_flip_at(shift_in_one(em_cumprod_at(xr, a, s), a, s), 1, &ax, s);
  em_tensor *safe = em_mul_at(g, em_mul_at(left, right, s), s);
  return em_where_at(any_zero, safe, em_mul_at(g, em_div_at(prod, x, s), s), s);
}

/* Whether x is laid out column-major in its last two dims (a transposed row-major matrix). */
static bool col_major(const em_tensor *x) {
  int d = x ? x->ndim : 0;
  return d >= 2 && x->sizes[d - 2] > 1 && x->sizes[d - 1] > 1 && x->strides[d - 2] == 1 &&
         x->strides[d - 1] == x->sizes[d - 2];
}

bool rt_vjp(rt_node *n, em_tensor *g, em_tensor **grads) {
  if (n->custom) return n->custom->backward(n, g, grads); /* a compiled backward graph */
  em_site s = n->site;
  em_tensor **x = n->saved;
  const prim_attrs *at = &n->attrs;
  bool need[EM_MAX_DIMS * 8] = {0};
  int ni = n->n_in < (int)(sizeof need) ? n->n_in : (int)sizeof need;
  for (int i = 0; i < ni; i++) need[i] = n->next[i] || n->leaf[i];
  em_dtype dt = g->dtype;
  switch (n->op) {
  case EM_PRIM_NEG: grads[0] = em_neg_at(g, s); break;
  case EM_PRIM_ABS: grads[0] = em_mul_at(g, em_sign_at(x[0], s), s); break;
  case EM_PRIM_EXP: grads[0] = em_mul_at(g, em_exp_at(x[0], s), s); break;
  case EM_PRIM_LOG: grads[0] = em_div_at(g, x[0], s); break;
  case EM_PRIM_LOG1P: grads[0] = em_div_at(g, em_add_scalar_at(x[0], 1, s), s); break;
  case EM_PRIM_EXPM1: grads[0] = em_mul_at(g, em_exp_at(x[0], s), s); break;
  case EM_PRIM_SQRT: grads[0] = em_mul_at(g, em_mul_scalar_at(em_rsqrt_at(x[0], s), 0.5, s), s); break;
  case EM_PRIM_RSQRT: { /* d/dx x^-1/2 = -1/2 rsqrt(x)^3, torch's form (at x = -0: +inf, as torch) */
    em_tensor *r = em_rsqrt_at(x[0], s);
    grads[0] = em_mul_at(g, em_mul_scalar_at(em_mul_at(em_mul_at(r, r, s), r, s), -0.5, s), s);
    break;
  }
  case EM_PRIM_SIN: grads[0] = em_mul_at(g, em_cos_at(x[0], s), s); break;
  case EM_PRIM_COS: grads[0] = em_mul_at(g, em_neg_at(em_sin_at(x[0], s), s), s); break;
  case EM_PRIM_TANH: {
    em_tensor *t = em_tanh_at(x[0], s);
    grads[0] = em_mul_at(g, em_sub_at(scalar(dt, 1, s), em_mul_at(t, t, s), s), s);
    break;
  }
  case EM_PRIM_ERF: /* 2/sqrt(pi) exp(-x^2) */
    grads[0] = em_mul_at(g, em_mul_scalar_at(em_exp_at(em_neg_at(em_mul_at(x[0], x[0], s), s), s), 1.1283791670955126, s), s);
    break;
  case EM_PRIM_RECIPROCAL: grads[0] = em_neg_at(em_div_at(g, em_mul_at(x[0], x[0], s), s), s); break;
  case EM_PRIM_ADD:
    grads[0] = g, grads[1] = g;
    break;
  case EM_PRIM_SUB:
    grads[0] = g;
    if (need[1]) grads[1] = em_neg_at(g, s);
    break;
  case EM_PRIM_MUL:
    if (need[0]) grads[0] = em_mul_at(g, x[1], s);
    if (need[1]) grads[1] = em_mul_at(g, x[0], s);
    break;
  case EM_PRIM_DIV:
    if (need[0]) grads[0] = em_div_at(g, x[1], s);
    if (need[1]) grads[1] = em_neg_at(em_div_at(em_mul_at(g, x[0], s), em_mul_at(x[1], x[1], s), s), s);
    break;
  case EM_PRIM_POW:
    if (need[0]) /* b a^(b-1), taken as 0 where b == 0 (torch's pow_backward: 0^-1 would give NaN) */
      grads[0] = em_where_at(em_eq_scalar_at(x[1], 0, s), scalar(dt, 0, s),
                             em_mul_at(g, em_mul_at(x[1], em_pow_at(x[0], em_sub_scalar_at(x[1], 1, s), s), s), s), s);
    if (need[1]) { /* a^b log a, taken as 0 where a == 0 and b >= 0 (as torch) */
      em_tensor *v = em_mul_at(em_pow_at(x[0], x[1], s), em_log_at(x[0], s), s);
      em_tensor *zero_base = em_logical_and_at(em_eq_scalar_at(x[0], 0, s), em_ge_scalar_at(x[1], 0, s), s);
      grads[1] = em_mul_at(g, em_where_at(zero_base, scalar(dt, 0, s), v, s), s);
    }
    break;
  case EM_PRIM_MAXIMUM:
  case EM_PRIM_MINIMUM: { /* torch's rule: a tie splits g evenly, the losing input gets 0, and
                           * everything else gets all of g, so with a NaN both inputs get g */
    em_tensor *a_loses = n->op == EM_PRIM_MAXIMUM ? em_lt_at(x[0], x[1], s) : em_gt_at(x[0], x[1], s);
    em_tensor *b_loses = n->op == EM_PRIM_MAXIMUM ? em_gt_at(x[0], x[1], s) : em_lt_at(x[0], x[1], s);
    em_tensor *tie = em_eq_at(x[0], x[1], s);
    em_tensor *half = em_mul_scalar_at(g, 0.5, s), *zero = scalar(dt, 0, s);
    if (need[0]) grads[0] = em_where_at(tie, half, em_where_at(a_loses, zero, g, s), s);
    if (need[1]) grads[1] = em_where_at(tie, half, em_where_at(b_loses, zero, g, s), s);
    break;
  }
  case EM_PRIM_REMAINDER: /* a - b floor(a / b) */
    if (need[0]) grads[0] = g;
    /* torch's -g * a.div(b, rounding_mode="floor"): its floor division (from fmod) gives NaN
     * for an infinite a, where floor(a / b) gave an infinity */
    if (need[1]) grads[1] = em_neg_at(em_mul_at(g, em_div_mode_at(x[0], x[1], EM_ROUND_FLOOR, s), s), s);
    break;
  case EM_PRIM_ATAN2: { /* d/da atan2(a, b) = b / (a^2 + b^2), d/db = -a / (a^2 + b^2) */
    em_tensor *r2 = em_add_at(em_mul_at(x[0], x[0], s), em_mul_at(x[1], x[1], s), s);
    if (need[0]) grads[0] = em_div_at(em_mul_at(g, x[1], s), r2, s);
    if (need[1]) grads[1] = em_neg_at(em_div_at(em_mul_at(g, x[0], s), r2, s), s);
    break;
  }
  case EM_PRIM_WHERE: {
    em_tensor *zero = scalar(dt, 0, s);
    if (need[1]) grads[1] = em_where_at(x[0], g, zero, s);
    if (need[2]) grads[2] = em_where_at(x[0], zero, g, s);
    break;
  }
  case EM_PRIM_CONVERT: grads[0] = em_cast_at(g, n->in_meta[0].dtype, s); break;
  case EM_PRIM_SUM: grads[0] = unreduce(n, g, s); break;
  case EM_PRIM_PROD: { /* torch's prod_backward: finite with zeros in x */
    /* one axis that leaves some other dim of size > 1 standing: torch's prod(x, dim). A
     * reduction over everything takes the full rule below however its axes are written (the
     * eager backend's graph lists the one axis of a 1-D tensor that eager left implicit, and the
     * two rules round differently: the fuzzer found gradients 1 ulp apart) */
    bool all = true;
    for (int d = 0; d < x[0]->ndim; d++)
      all = all && (x[0]->sizes[d] == 1 || ir_norm_axis(at->axes[0], x[0]->ndim) == d);
    if (at->n_axes == 1 && !all) {
      grads[0] = prod_axis_vjp(x[0], unreduce(n, g, s), rereduce(n, x[0], s), ir_norm_axis(at->axes[0], x[0]->ndim), s);
      break;
    }
    /* Over several axes or all of them (torch's full prod_backward): per reduced slice, with p the product of its nonzero elements: no zero gives g p / x
     * (= g prod / x); exactly one zero gives that element g p and the others 0; two or more
     * zeros give 0 everywhere. Selects, not branches, so the rule traces into graphs. */
    em_tensor *z = em_eq_scalar_at(x[0], 0, s), *one = scalar(dt, 1, s), *zero = scalar(dt, 0, s);
    em_tensor *nz = em_expand_at(em_sum_at(z, at->n_axes, at->axes, true, s), x[0]->ndim, x[0]->sizes, s);
    em_tensor *safe = em_where_at(z, one, x[0], s);
    em_tensor *gp = em_mul_at(unreduce(n, g, s), rereduce(n, safe, s), s);
    em_tensor *lone = em_logical_and_at(z, em_eq_scalar_at(nz, 1, s), s);
    grads[0] = em_where_at(em_eq_scalar_at(nz, 0, s), em_div_at(gp, safe, s), em_where_at(lone, gp, zero, s), s);
    break;
  }
  case EM_PRIM_SIGN: /* piecewise constant: a zero gradient, as torch (the output still requires grad) */
  case EM_PRIM_FLOOR:
  case EM_PRIM_CEIL: grads[0] = zeros_like_meta(&n->in_meta[0], s); break;
  case EM_PRIM_AMAX:
  case EM_PRIM_AMIN: { /* g shared evenly among the extremal elements, as torch.amax */
    em_tensor *mask = em_eq_at(x[0], rereduce(n, x[0], s), s);
    em_tensor *count = em_sum_at(mask, at->n_axes, at->axes, true, s);
    em_tensor *share = em_div_at(unreduce(n, g, s), em_expand_at(em_cast_at(count, dt, s), x[0]->ndim, x[0]->sizes, s), s);
    /* a product with the mask, not a select, as torch's scale_grad_by_count: a slice whose
     * extreme is NaN has no element equal to it, and its gradient is g / 0 * 0 = NaN */
    grads[0] = em_mul_at(share, em_cast_at(mask, dt, s), s);
    break;
  }
  case EM_PRIM_RESHAPE:
  case EM_PRIM_SQUEEZE:
  case EM_PRIM_UNSQUEEZE:
    grads[0] = em_reshape_at(g, n->in_meta[0].ndim, n->in_meta[0].sizes, s);
    break;
  case EM_PRIM_PERMUTE: {
    int64_t inv[EM_MAX_DIMS];
    for (int i = 0; i < at->n_axes; i++) inv[ir_norm_axis(at->axes[i], at->n_axes)] = i;
    grads[0] = em_permute_at(g, at->n_axes, inv, s);
    break;
  }
  case EM_PRIM_EXPAND: { /* the one generic broadcast reduction */
    const prim_meta *in = &n->in_meta[0];
    int lead = g->ndim - in->ndim, k = 0;
    int64_t axes[EM_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++)
      if (i < lead || (in->sizes[i - lead] == 1 && g->sizes[i] != 1)) axes[k++] = i;
    em_tensor *r = k ? em_sum_at(g, k, axes, true, s) : g;
    grads[0] = em_reshape_at(r, in->ndim, in->sizes, s);
    break;
  }
  case EM_PRIM_SLICE: grads[0] = unslice(n, g, s); break;
  case EM_PRIM_SLICE_SCATTER: {
    const prim_attrs *a = at;
    if (need[0]) grads[0] = em_slice_scatter_at(g, zeros_like_meta(&n->in_meta[1], s), (int)a->axes[0], a->start, a->stop, a->step, s);
    if (need[1]) grads[1] = em_slice_at(g, (int)a->axes[0], a->start, a->stop, a->step, s);
    break;
  }
  case EM_PRIM_CLONE: grads[0] = g; break;
  case EM_PRIM_FLIP: grads[0] = em_flip_at(g, at->n_axes, at->axes, s); break;
  case EM_PRIM_PAD: {
    em_tensor *r = g;
    const prim_meta *in = &n->in_meta[0];
    for (int i = 0; i < at->n_pads && r; i += 2) {
      int d = in->ndim - 1 - i / 2;
      r = em_slice_at(r, d, at->pads[i], at->pads[i] + in->sizes[d], 1, s);
    }
    grads[0] = r;
    break;
  }
  case EM_PRIM_CAT: {
    int a = ir_norm_axis(at->axes[0], g->ndim);
    int64_t off = 0;
    for (int i = 0; i < n->n_in; i++) {
      int64_t len = n->in_meta[i].sizes[a];
      if (n->next[i] || n->leaf[i]) grads[i] = em_slice_at(g, a, off, off + len, 1, s);
      off += len;
    }
    break;
  }
  case EM_PRIM_GATHER:
    grads[0] = em_scatter_add_at(zeros_like_meta(&n->in_meta[0], s), (int)at->axes[0], x[1], g, s);
    break;
  case EM_PRIM_INDEX_SELECT: {
    const prim_meta *in = &n->in_meta[0];
    int a = ir_norm_axis(at->axes[0], in->ndim);
    int64_t shape[EM_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++) shape[i] = i == a ? g->sizes[i] : 1;
    em_tensor *idx = em_expand_at(em_reshape_at(x[1], g->ndim, shape, s), g->ndim, g->sizes, s);
    grads[0] = em_scatter_add_at(zeros_like_meta(in, s), a, idx, g, s);
    break;
  }
  case EM_PRIM_SCATTER_ADD: {
    if (need[0]) grads[0] = g;
    if (need[2]) {
      em_tensor *r = em_gather_at(g, (int)at->axes[0], x[1], s);
      const prim_meta *src = &n->in_meta[2];
      int64_t pads[2 * EM_MAX_DIMS] = {0};
      bool pad = false;
      for (int d = 0; d < src->ndim && r; d++) {
        pads[2 * (src->ndim - 1 - d) + 1] = src->sizes[d] - r->sizes[d];
        pad |= src->sizes[d] != r->sizes[d];
      }
      grads[2] = pad && r ? em_pad_at(r, 2 * src->ndim, pads, 0, s) : r;
    }
    break;
  }
  case EM_PRIM_CUMSUM: grads[0] = reverse_cumsum(g, (int)at->axes[0], s); break; /* x_i reaches every y_k, k >= i */
  case EM_PRIM_CUMPROD: grads[0] = cumprod_vjp(x[0], g, (int)at->axes[0], s); break;
  case EM_PRIM_MATMUL:
    /* An operand laid out transposed (column-major in its last two dims: a linear layer's
     * weight as em_linear passes it) gets its gradient computed transposed too, as the
     * transpose of the product of the transposes, the layout PyTorch's mm backward also picks:
     * through the transpose's own rule the weight's gradient is then row-major like the weight
     * (a GEMM's output, which accumulation takes as it is) instead of a transposed view that
     * it copies, an extra pass over every weight every step. */
    if (need[0])
      grads[0] = col_major(x[0]) ? em_transpose_at(em_matmul_at(x[1], em_transpose_at(g, -1, -2, s), s), -1, -2, s)
                                 : em_matmul_at(g, em_transpose_at(x[1], -1, -2, s), s);
    if (need[1])
      grads[1] = col_major(x[1]) ? em_transpose_at(em_matmul_at(em_transpose_at(g, -1, -2, s), x[0], s), -1, -2, s)
                                 : em_matmul_at(em_transpose_at(x[0], -1, -2, s), g, s);
    break;
  case EM_PRIM_CONV2D: {
    int64_t hw[2] = {n->in_meta[0].sizes[2], n->in_meta[0].sizes[3]};
    int64_t khw[2] = {n->in_meta[1].sizes[2], n->in_meta[1].sizes[3]};
    if (need[0]) grads[0] = em_conv2d_backward_input_at(g, x[1], hw, at->conv, s);
    if (need[1]) grads[1] = em_conv2d_backward_weight_at(x[0], g, khw, at->conv, s);
    break;
  }
  case EM_PRIM_CONV2D_BWD_INPUT: { /* in: grad_out, w; out: grad_in (linear in both) */
    int64_t khw[2] = {n->in_meta[1].sizes[2], n->in_meta[1].sizes[3]};
    if (need[0]) grads[0] = em_conv2d_at(g, x[1], EM_NONE, at->conv, s);
    if (need[1]) grads[1] = em_conv2d_backward_weight_at(g, x[0], khw, at->conv, s);
    break;
  }
  case EM_PRIM_CONV2D_BWD_WEIGHT: { /* in: x, grad_out; out: grad_w */
    int64_t hw[2] = {n->in_meta[0].sizes[2], n->in_meta[0].sizes[3]};
    if (need[0]) grads[0] = em_conv2d_backward_input_at(x[1], g, hw, at->conv, s);
    if (need[1]) grads[1] = em_conv2d_at(x[0], g, EM_NONE, at->conv, s);
    break;
  }
  default: {
    rt_error(s, n->name, "has no gradient rule for prim %s", prim_get(n->op)->name);
    return false;
  }
  }
  for (int i = 0; i < n->n_in; i++)
    if ((n->next[i] || n->leaf[i]) && !grads[i]) {
      if (!rt_has_error()) rt_error(s, n->name, "backward of %s produced no gradient", prim_get(n->op)->name);
      return false;
    }
  return true;
}
