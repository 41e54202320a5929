/* inductor/rewrite.c: graph rewrites before scheduling: rematerialization, sums of gradient
 * slices turned into one concatenation, small window reductions (max-pooling) turned into
 * pointwise maxima (small_window), and sums over every dim split in two (split_full_sum).
 *
 * Rematerialization: a cheap pointwise value that a later kernel reads is recomputed there from
 * what is stored anyway instead of being stored for it.
 *
 * Why. A whole training step captured as one graph holds its backward beside its forward with
 * no partitioner between them, and the scheduler stores every value a later kernel reads. The
 * tanh GELU's forward kernel then stored five [B, T, 4D] intermediates (x^2, tanh, 1 + tanh,
 * x/2, the result) for the backward kernel: 40 MB written and read again per layer of the
 * benchmark transformer, where the backward needs only x, which the GEMM wrote anyway. This is
 * the choice PyTorch's min-cut partitioner makes for pointwise ops (and Inductor's scheduler
 * when it inlines a pointwise node into each consumer): save the inputs of a pointwise chain,
 * recompute the chain.
 *
 * The rule, for a value v computed by a fusible pointwise node (or a view) and read by node u:
 *  - u is *far* from v: a barrier (a node no kernel holds: a GEMM, an indexing op, a copy)
 *    lies between them in graph order, so v would be stored for u;
 *  - v is not *anchored*: it is not a graph output and nothing that needs it in memory (a GEMM,
 *    an eager node; through views) reads it. An anchored value is stored anyway, so reading it
 *    is as cheap as reading what it came from;
 *  - v's cone (its producers, back to anchored values, graph inputs and values no kernel
 *    computes; views and scalar constants included) has at most MAX_CONE nodes and at most one
 *    *large* leaf (more than an eighth of v's elements). Then u's kernel reads at most one large
 *    tensor in place of v, and v's own store goes away: bytes never grow, and an anchored leaf's
 *    life is stretched only in place of v's. Small leaves (per-row statistics, weights,
 *    scalars) are free.
 * A recomputed cone is shared by every far reader in the same stretch between two barriers.
 * The recomputation runs the same ops on the same values, so it gives the same bits. Random
 * prims are never fusible, so never recomputed.
 *
 * Sums of slice scatters. The gradient of a weight used through disjoint slices (the Q, K and
 * V rows of one projection matrix, one block per layer) is, as the autograd engine builds it,
 * slice_scatter(zeros, g_i) for each slice, summed: each term writes the whole weight and each
 * add reads two of them. When the slices are disjoint and cover the weight along one axis, the
 * sum is cat(g_i in slice order): one copy. Equal values; a -0.0 in a g_i stays -0.0 where
 * the sum with zeros would make it +0.0. Two more shapes of the same sum:
 *  - strided slices (max_pool2d's window elements: x[..., j::2, :] for j = 0, 1) that interleave
 *    along the axis: a cat on a new axis after it, the two axes then merged (a view);
 *  - several terms on the same slice (each window element of a 2x2 pool is scattered along H
 *    and then along W, so two terms share each H slice): they add up first, in the sum's own
 *    association (the bits of the sum with zeros), or as a cat when they tile another axis.
 * LeNet-5's pooling gradients were 8 slice_scatters (each filling a whole tensor) and 3 adds a
 * pool, 1.1 ms of a 4.9 ms compiled step (AVX-512); they are 3 cats, 2 of them of half size. */
#include "internal.h"

#define MAX_CONE 32

typedef struct rewriter {
  const ir_graph *g;
  const ind_renderer *rend; /* the target's renderer: what its kernels compute */
  ir_graph *ng;
  int *def;       /* [n_values] defining node, -1 for inputs */
  int *seg;       /* [n_nodes] barriers before node i */
  signed char *anchored; /* [n_values] -1 unknown, 0, 1 */
  signed char *cheap;    /* [n_values] -1 unknown, 0, 1: v may be recomputed at a far reader */
  int *map;       /* [n_values] old value -> new value (the original computation) */
  int *rec, *rec_seg; /* [n_values] recomputed copy in stretch rec_seg, or -1 */
  int *user_at, *users; /* readers of value v: nodes users[user_at[v] .. user_at[v + 1]) */
  int *seen, stamp; /* [n_values] the cone walk that last reached a value */
  bool remat;     /* rematerialize (EMBER_INDUCTOR_REMAT) */
  bool *cat_sum;  /* [n_values] a sum scatter_sum rewrote (for counting: an outer sum may take it in) */
  int recomputed, scatter_sums, windows;
} rewriter;

static bool is_view(const ir_node *n) { return (prim_get(n->op)->flags & P_VIEW) != 0; }
static bool scalar_full(const ir_node *n) { return n->op == EM_PRIM_FULL && n->attrs.shape.ndim == 0; }

/* Nodes a kernel can hold, or that only make headers: everything else ends a kernel. */
static bool barrier(const ind_renderer *rend, const ir_graph *g, const ir_node *n) {
  return !(rend->renders(g, n) || is_view(n) || scalar_full(n) || trailing_reduction(g, n) >= 0 || leading_reduction(g, n) >= 0);
}

static bool anchored(rewriter *r, int v) {
  if (r->anchored[v] >= 0) return r->anchored[v];
  const ir_graph *g = r->g;
  bool a = r->def[v] < 0;
  for (int o = 0; o < g->n_outputs && !a; o++) a = g->outputs[o] == v;
  for (int k = r->user_at[v]; k < r->user_at[v + 1] && !a; k++) {
    const ir_node *u = &g->nodes[r->users[k]];
    if (is_view(u)) a = anchored(r, u->out);
    else a = barrier(r->rend, g, u);
  }
  return (r->anchored[v] = a) != 0;
}

static int64_t numel_of_value(const ir_graph *g, int v) { return ir_numel(g->values[v].type.ndim, g->values[v].type.sizes); }

/* Whether v can be recomputed inside a cone (it is not a leaf). */
static bool recomputable(rewriter *r, int v) {
  int d = r->def[v];
  if (d < 0) return false;
  const ir_node *n = &r->g->nodes[d];
  if (scalar_full(n)) return true;
  if (is_view(n)) return true;
  return r->rend->renders(r->g, n) && !anchored(r, v);
}

/* Walks v's cone (marking values with this walk's stamp): counts its nodes and remembers its one
 * large leaf; false when it grows past the limits. */
static bool walk_cone(rewriter *r, int v, int stamp, int *n_nodes, int *leaf, int64_t big) {
  if (r->seen[v] == stamp) return true;
  r->seen[v] = stamp;
  if (!recomputable(r, v)) {
    if (numel_of_value(r->g, v) * 8 <= big || *leaf == v) return true;
    if (*leaf >= 0) return false; /* a second large leaf */
    *leaf = v;
    return true;
  }
  if (++*n_nodes > MAX_CONE) return false;
  const ir_node *n = &r->g->nodes[r->def[v]];
  for (int k = 0; k < n->n_in; k++)
    if (!walk_cone(r, ir_operands(r->g, n)[k], stamp, n_nodes, leaf, big)) return false;
  return true;
}

static bool cheap(rewriter *r, int v) {
  if (r->cheap[v] >= 0) return r->cheap[v];
  bool ok = false;
  int d = r->def[v];
  if (d >= 0 && (r->rend->renders(r->g, &r->g->nodes[d]) || is_view(&r->g->nodes[d])) && !anchored(r, v)) {
    int n = 0, leaf = -1;
    ok = walk_cone(r, v, ++r->stamp, &n, &leaf, numel_of_value(r->g, v));
  }
  return (r->cheap[v] = ok) != 0;
}

static int emit(rewriter *r, const ir_node *n, const int *in) {
  int v = ir_add_node(r->ng, n->op, in, n->n_in, &n->attrs, &r->g->values[n->out].type, n->site, n->opname);
  if (v >= 0) r->ng->nodes[r->ng->n_nodes - 1].rng_slot = n->rng_slot;
  return v;
}

/* The new value computing old value v in stretch s: v's cone emitted again (once per stretch),
 * its leaves read from the original computation. */
static int recompute(rewriter *r, int v, int s) {
  if (!recomputable(r, v)) return r->map[v];
  if (r->rec[v] >= 0 && r->rec_seg[v] == s) return r->rec[v];
  const ir_node *n = &r->g->nodes[r->def[v]];
  int small[8], *in = n->n_in <= 8 ? small : malloc(sizeof(int) * (size_t)n->n_in);
  if (!in) return -1;
  int out = 0;
  for (int k = 0; k < n->n_in && out >= 0; k++) out = in[k] = recompute(r, ir_operands(r->g, n)[k], s);
  if (out >= 0) out = emit(r, n, in);
  if (in != small) free(in);
  if (out >= 0) r->rec[v] = out, r->rec_seg[v] = s, r->recomputed++;
  return out;
}

/* ---- sums of slice scatters ---- */

/* Whether v is a zero: full(0), through expands. */
static bool is_zero(const rewriter *r, int v) {
  for (;;) {
    int d = r->def[v];
    if (d < 0) return false;
    const ir_node *n = &r->g->nodes[d];
    if (n->op == EM_PRIM_FULL) return n->attrs.value == 0;
    if (n->op != EM_PRIM_EXPAND) return false;
    v = ir_operands(r->g, n)[0];
  }
}

typedef struct piece {
  int64_t start, stop, step;
  int src, leaf; /* the scattered value; the slice_scatter's own value */
} piece;

/* Collects the slice_scatter(zeros, src) terms of the sum of v (adds of same-shape values,
 * clones and detaches, each inner term read only by its sum); false when v is anything else. */
static bool collect(const rewriter *r, int v, bool root, int *axis, piece *ps, int *n, int cap) {
  int d = r->def[v];
  if (d < 0 || (!root && r->user_at[v + 1] - r->user_at[v] != 1)) return false;
  const ir_graph *g = r->g;
  const ir_node *x = &g->nodes[d];
  const int *o = ir_operands(g, x);
  if (x->op == EM_PRIM_SLICE_SCATTER) {
    int a = ir_norm_axis(x->attrs.axes[0], g->values[v].type.ndim);
    if (x->attrs.step < 1 || !is_zero(r, o[0]) || (*axis >= 0 && *axis != a) || *n == cap) return false;
    if (*n > 0 && ps[0].step != x->attrs.step) return false;
    *axis = a;
    ps[(*n)++] = (piece){x->attrs.start, x->attrs.stop, x->attrs.step, o[1], v};
    return true;
  }
  if (x->op == EM_PRIM_CLONE || x->op == EM_PRIM_DETACH) /* the engine's copy of the first gradient */
    return collect(r, o[0], false, axis, ps, n, cap);
  if (x->op != EM_PRIM_ADD || g->values[v].type.dtype != EM_F32) return false;
  for (int k = 0; k < 2; k++)
    if (!ir_type_equal(&g->values[o[k]].type, &g->values[v].type) || !collect(r, o[k], false, axis, ps, n, cap)) return false;
  return true;
}

/* The sum of v's add tree with only the slice_scatter leaves whose piece starts at `start` kept,
 * each as its src (new-graph values of type t), in the tree's own association: a + (a dropped
 * leaf) is a, as a + 0 is. -1: no leaf kept; -2: out of memory. */
static int restricted_sum(rewriter *r, int v, const piece *ps, int n, int64_t start, const ir_type *t,
                          const ir_node *x) {
  const ir_node *d = &r->g->nodes[r->def[v]];
  const int *o = ir_operands(r->g, d);
  if (d->op == EM_PRIM_SLICE_SCATTER) {
    for (int k = 0; k < n; k++)
      if (ps[k].leaf == v) return ps[k].start == start ? r->map[ps[k].src] : -1;
    return -1;
  }
  if (d->op != EM_PRIM_ADD) return restricted_sum(r, o[0], ps, n, start, t, x); /* clone, detach */
  int a = restricted_sum(r, o[0], ps, n, start, t, x), b = restricted_sum(r, o[1], ps, n, start, t, x);
  if (a == -2 || b == -2) return -2;
  if (a < 0 || b < 0) return a < 0 ? b : a;
  int s = ir_add_node(r->ng, EM_PRIM_ADD, (int[]){a, b}, 2, &(prim_attrs){0}, t, x->site, x->opname);
  return s < 0 ? -2 : s;
}

static int pieces_cat(rewriter *r, piece *ps, int n, int axis, int root, const ir_type *t, const ir_node *x);

/* The sums inside v's sum (not v itself when root) that scatter_sum rewrote, unmarked. */
static int uncount(rewriter *r, int v, bool root) {
  const ir_node *d = &r->g->nodes[r->def[v]];
  if (d->op == EM_PRIM_SLICE_SCATTER) return 0;
  int n = !root && r->cat_sum[v];
  r->cat_sum[v] = false;
  if (d->op == EM_PRIM_ADD) n += uncount(r, ir_operands(r->g, d)[1], false);
  return n + uncount(r, ir_operands(r->g, d)[0], false);
}

/* The sum of the pieces ps[0..m) of root's sum, which all cover the same slice: a cat when their
 * srcs are in turn slice scatters tiling another axis (max-pooling's window elements, scattered
 * along both window dims), else their srcs added in the sum's association. */
static int group_sum(rewriter *r, const piece *ps, int m, const piece *all, int n, int root, const ir_node *x) {
  if (m == 1) return r->map[ps[0].src];
  const ir_type *t = &r->g->values[ps[0].src].type;
  piece in[64];
  int k = 0, axis = -1;
  bool all_scatters = true;
  for (int q = 0; q < m && all_scatters; q++) all_scatters = collect(r, ps[q].src, false, &axis, in, &k, 64);
  if (all_scatters) {
    int v = pieces_cat(r, in, k, axis, -1, t, x);
    if (v != -1) return v;
  }
  return restricted_sum(r, root, all, n, ps[0].start, t, x);
}

/* cat along axis of the pieces ps[0..n) (sorted here by start), a group of pieces covering the
 * same slice counting as their sum (group_sum; root: the sum they came from, or -1 when no group
 * may have two pieces), when the slices tile the axis of type t: contiguous slices one after the
 * other, or slices of step k starting at 0, 1, ..., k-1 with size/k elements each (a pooling
 * window's strided slices), which interleave: cat([.., size/k, 1, ..] each, axis + 1) seen as
 * [.., size, ..]. The new value, -1 when they do not tile it, -2 when out of memory. */
static int pieces_cat(rewriter *r, piece *ps, int n, int axis, int root, const ir_type *t, const ir_node *x) {
  for (int a = 1; a < n; a++) /* insertion sort by start, stable: a group keeps the sum's order */
    for (int b = a; b > 0 && ps[b].start < ps[b - 1].start; b--) {
      piece s = ps[b];
      ps[b] = ps[b - 1], ps[b - 1] = s;
    }
  int64_t at = 0, stride = ps[0].step, size = t->sizes[axis];
  int groups = 0;
  for (int k = 0; k < n;) {
    int e = k + 1;
    while (e < n && ps[e].start == ps[k].start) e++;
    for (int q = k; q < e; q++)
      if (ps[q].stop != ps[k].stop) return -1; /* slices that overlap without coinciding */
    if (ps[k].start != at || (e - k > 1 && root < 0)) return -1; /* a gap or an overlap */
    if (stride > 1 && (size % stride || (ps[k].stop - ps[k].start + stride - 1) / stride != size / stride)) return -1;
    at = stride > 1 ? at + 1 : ps[k].stop, groups++, k = e;
  }
  if (at != (stride > 1 ? stride : size) || groups < 2 || (stride > 1 && t->ndim == EM_MAX_DIMS)) return -1;
  int in[64], g = 0;
  for (int k = 0; k < n;) {
    int e = k + 1;
    while (e < n && ps[e].start == ps[k].start) e++;
    if ((in[g++] = group_sum(r, ps + k, e - k, ps, n, root, x)) == -2) return -2;
    k = e;
  }
  int v;
  if (stride == 1) {
    prim_attrs at_ = {.n_axes = 1, .axes = {axis}};
    v = ir_add_node(r->ng, EM_PRIM_CAT, in, g, &at_, t, x->site, x->opname);
  } else { /* interleave: each piece [.., size/k, 1, ..], cat on the new dim, merge the two */
    ir_type pt = *t, ct;
    for (int d = t->ndim; d > axis + 1; d--) pt.sizes[d] = t->sizes[d - 1];
    pt.ndim++, pt.sizes[axis] = size / stride, pt.sizes[axis + 1] = 1;
    ct = pt, ct.sizes[axis + 1] = stride;
    prim_attrs rs = {.shape = {.ndim = pt.ndim}};
    for (int d = 0; d < pt.ndim; d++) rs.shape.sizes[d] = pt.sizes[d];
    for (int k = 0; k < g; k++)
      if ((in[k] = ir_add_node(r->ng, EM_PRIM_RESHAPE, &in[k], 1, &rs, &pt, x->site, x->opname)) < 0) return -2;
    prim_attrs at_ = {.n_axes = 1, .axes = {axis + 1}};
    v = ir_add_node(r->ng, EM_PRIM_CAT, in, g, &at_, &ct, x->site, x->opname);
    prim_attrs back = {.shape = {.ndim = t->ndim}};
    for (int d = 0; d < t->ndim; d++) back.shape.sizes[d] = t->sizes[d];
    if (v >= 0) v = ir_add_node(r->ng, EM_PRIM_RESHAPE, &v, 1, &back, t, x->site, x->opname);
  }
  return v < 0 ? -2 : v;
}

/* Emits cat(pieces) for node i when it sums slice scatters that tile its value along one axis;
 * returns the new value, -1 when the rule does not apply, -2 when out of memory. */
static int scatter_sum(rewriter *r, int i) {
  const ir_node *x = &r->g->nodes[i];
  if (x->op != EM_PRIM_ADD) return -1;
  piece ps[64];
  int n = 0, axis = -1;
  if (!collect(r, x->out, true, &axis, ps, &n, 64) || n < 2) return -1;
  int v = pieces_cat(r, ps, n, axis, x->out, &r->g->values[x->out].type, x);
  if (v >= 0) { /* one rewrite: the sums inside this one that were rewritten first are dead now */
    r->scatter_sums += 1 - uncount(r, x->out, true);
    r->cat_sum[x->out] = true;
  }
  return v;
}

/* ---- small window reductions ---- */

/* amax / amin over a few elements on dims that are not trailing (max-pooling: the window dims
 * 3 and 5 of [N, C, H/2, 2, W/2, 2]) is no row reduction; the eager kernel took 1.6 ms a pool in
 * LeNet-5's step. As maximum (minimum) of the window's K <= MAX_WINDOW strided slices it is one
 * pointwise kernel. Exact: max and min do not round, and maximum propagates NaN as amax does. */
#define MAX_WINDOW 16

static int small_window(rewriter *r, int i) {
  const ir_graph *g = r->g;
  const ir_node *x = &g->nodes[i];
  if ((x->op != EM_PRIM_AMAX && x->op != EM_PRIM_AMIN) || trailing_reduction(g, x) >= 0 || leading_reduction(g, x) >= 0)
    return -1;
  int src = ir_operands(g, x)[0];
  const ir_type *t = &g->values[src].type, *ot = &g->values[x->out].type;
  if (t->dtype != EM_F32 || ot->dtype != EM_F32 || !ir_type_concrete(t)) return -1;
  bool red[EM_MAX_DIMS] = {0};
  int64_t k = 1;
  for (int a = 0; a < x->attrs.n_axes; a++) {
    int d = ir_norm_axis(x->attrs.axes[a], t->ndim);
    if (d < 0 || red[d]) return -1;
    red[d] = true, k *= t->sizes[d];
  }
  if (k < 2 || k > MAX_WINDOW) return -1;
  em_prim comb = x->op == EM_PRIM_AMAX ? EM_PRIM_MAXIMUM : EM_PRIM_MINIMUM;
  int acc = -1;
  for (int64_t c = 0; c < k; c++) {
    int v = r->map[src];
    ir_type vt = *t;
    int64_t q = c;
    for (int d = t->ndim - 1; d >= 0; d--) { /* this window element's index on each reduced dim */
      if (!red[d]) continue;
      int64_t j = q % t->sizes[d];
      q /= t->sizes[d];
      prim_attrs sl = {.n_axes = 1, .axes = {d}, .start = j, .stop = j + 1, .step = 1};
      vt.sizes[d] = 1;
      if ((v = ir_add_node(r->ng, EM_PRIM_SLICE, &v, 1, &sl, &vt, x->site, x->opname)) < 0) return -2;
    }
    if (!x->attrs.keepdim) {
      prim_attrs rs = {.shape = {.ndim = ot->ndim}};
      for (int d = 0; d < ot->ndim; d++) rs.shape.sizes[d] = ot->sizes[d];
      if ((v = ir_add_node(r->ng, EM_PRIM_RESHAPE, &v, 1, &rs, ot, x->site, x->opname)) < 0) return -2;
    }
    if (acc >= 0 && (v = ir_add_node(r->ng, comb, (int[]){acc, v}, 2, &(prim_attrs){0}, ot, x->site, x->opname)) < 0) return -2;
    acc = v;
  }
  r->windows++;
  return acc;
}

/* ---- sums of everything ---- */

/* A sum over every dim of a large tensor (a loss, a checksum) is no row reduction, so it ran as
 * the eager kernel, reading its operand again after the kernel that made it. As a sum over the
 * trailing dims (at least 256 elements a row) and then a sum of the row sums, as PyTorch's
 * reductions split too, the first stage joins the row kernel that makes the operand (softmax,
 * layer_norm: 0.15 of 0.9 ms over [4096, 1024]). The order of the additions changes: the
 * result agrees with eager's within rounding, not bit for bit. */
static int split_full_sum(rewriter *r, int i) {
  const ir_graph *g = r->g;
  const ir_node *x = &g->nodes[i];
  if (x->op != EM_PRIM_SUM) return -1;
  int src = ir_operands(g, x)[0];
  const ir_type *t = &g->values[src].type, *ot = &g->values[x->out].type;
  bool all = x->attrs.n_axes == t->ndim || (x->attrs.n_axes == 0 && ir_numel(ot->ndim, ot->sizes) == 1); /* axes=[]: all */
  if (t->dtype != EM_F32 || ot->dtype != EM_F32 || t->ndim < 2 || !all || !ir_type_concrete(t) ||
      ir_numel(t->ndim, t->sizes) < ((int64_t)1 << 16))
    return -1;
  int k = t->ndim - 1;
  int64_t row = t->sizes[k];
  while (k > 1 && row < 256) row *= t->sizes[--k];
  prim_attrs a1 = {.n_axes = t->ndim - k, .keepdim = false};
  for (int d = k; d < t->ndim; d++) a1.axes[d - k] = d;
  ir_type t1 = *t;
  t1.ndim = k;
  int v = r->map[src];
  if ((v = ir_add_node(r->ng, EM_PRIM_SUM, &v, 1, &a1, &t1, x->site, x->opname)) < 0) return -2;
  prim_attrs a2 = {.n_axes = k, .keepdim = false};
  for (int d = 0; d < k; d++) a2.axes[d] = d;
  ir_type t2 = *t;
  t2.ndim = 0;
  if ((v = ir_add_node(r->ng, EM_PRIM_SUM, &v, 1, &a2, &t2, x->site, x->opname)) < 0) return -2;
  if (x->attrs.keepdim) {
    prim_attrs rs = {.shape = {.ndim = ot->ndim}};
    for (int d = 0; d < ot->ndim; d++) rs.shape.sizes[d] = ot->sizes[d];
    if ((v = ir_add_node(r->ng, EM_PRIM_RESHAPE, &v, 1, &rs, ot, x->site, x->opname)) < 0) return -2;
  }
  return v;
}

static bool build(rewriter *r) {
  const ir_graph *g = r->g;
  for (int i = 0; i < g->n_inputs; i++) {
    int v = ir_add_input(r->ng, &g->values[g->inputs[i]].type);
    if (v < 0) return false;
    r->map[g->inputs[i]] = v;
  }
  bool ok = true;
  int small[8];
  for (int i = 0; ok && i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    int done = scatter_sum(r, i);
    if (done == -1) done = small_window(r, i);
    if (done == -1) done = split_full_sum(r, i);
    if (done != -1) {
      ok = (r->map[n->out] = done) >= 0;
      continue;
    }
    int *in = n->n_in <= 8 ? small : malloc(sizeof(int) * (size_t)n->n_in);
    if (!in) {
      ok = false;
      break;
    }
    for (int k = 0; k < n->n_in && ok; k++) {
      int a = ir_operands(g, n)[k], d = r->def[a];
      bool far = r->remat && d >= 0 && r->seg[i] > r->seg[d];
      in[k] = far && cheap(r, a) ? recompute(r, a, r->seg[i]) : r->map[a];
      ok = in[k] >= 0;
    }
    if (ok) ok = (r->map[n->out] = emit(r, n, in)) >= 0;
    if (in != small) free(in);
  }
  for (int o = 0; ok && o < g->n_outputs; o++) ok = ir_add_output(r->ng, r->map[g->outputs[o]]);
  return ok && !r->ng->oom;
}

/* ---- scalar work first (issue 20: combo kernels) ----
 *
 * An optimizer step computes, per parameter, a few one-element values from the step count and
 * the learning rate (AdamW's bias corrections 1 - beta^t, lr / bc1, the lr cast to the
 * parameter's dtype) between the parameter's pointwise ops. Each of them closes the open
 * pointwise kernel (another iteration space), and a pow among them runs eagerly, so one
 * parameter's update was four kernels and the parameters' kernels were never adjacent. A node
 * of at most one element whose operands are all of at most one element, each a graph input or
 * such a node, depends on nothing else: all of them move to the front of the graph, in their
 * order. Random nodes stay where they are (their counters are drawn in graph order), and so do
 * the nodes after them in their cone. Values are unchanged; only the order of independent
 * nodes is. EMBER_INDUCTOR_SCALAR_HOIST=0 turns it off. */
static bool scalar_hoist_enabled(void) {
  const char *e = getenv("EMBER_INDUCTOR_SCALAR_HOIST");
  return !e || strcmp(e, "0") != 0;
}

/* g with its scalar work first; g itself (unchanged) when there is nothing to move, NULL when
 * out of memory. */
static ir_graph *hoist_scalars(ir_graph *g) {
  size_t nv = (size_t)g->n_values + 1;
  bool *small = calloc(nv, 1), *first = calloc((size_t)g->n_nodes + 1, 1);
  int *map = malloc(sizeof(int) * nv);
  ir_graph *ng = NULL;
  bool ok = small && first && map, moves = false;
  for (int i = 0; ok && i < g->n_inputs; i++) small[g->inputs[i]] = numel_of(&g->values[g->inputs[i]].type) <= 1;
  int n_first = 0;
  for (int i = 0; ok && i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    bool s = numel_of(&g->values[n->out].type) <= 1 && !(prim_get(n->op)->flags & P_RANDOM);
    for (int k = 0; s && k < n->n_in; k++) s = small[ir_operands(g, n)[k]];
    small[n->out] = first[i] = s;
    moves = moves || (s && n_first < i); /* a node before it stays behind */
    n_first += s;
  }
  if (ok && !moves) {
    free(small), free(first), free(map);
    return g;
  }
  if (ok) ok = (ng = ir_graph_new(g->name)) != NULL;
  for (int i = 0; ok && i < g->n_inputs; i++) ok = (map[g->inputs[i]] = ir_add_input(ng, &g->values[g->inputs[i]].type)) >= 0;
  for (int pass = 0; ok && pass < 2; pass++)
    for (int i = 0; ok && i < g->n_nodes; i++) {
      if (first[i] != (pass == 0)) continue;
      const ir_node *n = &g->nodes[i];
      int in8[8], *in = n->n_in <= 8 ? in8 : malloc(sizeof(int) * (size_t)n->n_in);
      if (!(ok = in != NULL)) break;
      for (int k = 0; k < n->n_in; k++) in[k] = map[ir_operands(g, n)[k]];
      int v = ir_add_node(ng, n->op, in, n->n_in, &n->attrs, &g->values[n->out].type, n->site, n->opname);
      if (v >= 0) ng->nodes[ng->n_nodes - 1].rng_slot = n->rng_slot;
      ok = (map[n->out] = v) >= 0;
      if (in != in8) free(in);
    }
  for (int o = 0; ok && o < g->n_outputs; o++) ok = ir_add_output(ng, map[g->outputs[o]]);
  ok = ok && !ng->oom;
  free(small), free(first), free(map);
  ir_graph_free(g);
  if (!ok) ir_graph_free(ng), ng = NULL;
  return ng;
}

ir_graph *ind_rewrite(const ir_graph *g, const ind_renderer *rend, bool rematerialize, ind_stats *st) {
  size_t nv = (size_t)g->n_values + 1, nn = (size_t)g->n_nodes + 1;
  rewriter r = {.g = g, .rend = rend, .remat = rematerialize};
  r.def = malloc(sizeof(int) * nv), r.seg = malloc(sizeof(int) * nn);
  r.anchored = malloc(nv), r.cheap = malloc(nv);
  r.map = malloc(sizeof(int) * nv), r.rec = malloc(sizeof(int) * nv), r.rec_seg = malloc(sizeof(int) * nv);
  r.user_at = calloc(nv + 1, sizeof(int)), r.seen = calloc(nv, sizeof(int)), r.cat_sum = calloc(nv, sizeof(bool));
  int *fill = calloc(nv, sizeof(int));
  bool ok = r.def && r.seg && r.anchored && r.cheap && r.map && r.rec && r.rec_seg && r.user_at && r.seen && r.cat_sum && fill;
  if (ok) {
    memset(r.anchored, -1, nv), memset(r.cheap, -1, nv);
    for (size_t v = 0; v < nv; v++) r.def[v] = -1, r.map[v] = -1, r.rec[v] = -1;
    int s = 0;
    for (int i = 0; i < g->n_nodes; i++) {
      const ir_node *n = &g->nodes[i];
      r.def[n->out] = i;
      r.seg[i] = s;
      s += barrier(rend, g, n);
      for (int k = 0; k < n->n_in; k++) r.user_at[ir_operands(g, n)[k] + 1]++;
    }
    for (size_t v = 0; v < nv; v++) r.user_at[v + 1] += r.user_at[v];
    ok = (r.users = malloc(sizeof(int) * (size_t)(r.user_at[nv] + 1))) != NULL;
    for (int i = 0; ok && i < g->n_nodes; i++)
      for (int k = 0; k < g->nodes[i].n_in; k++) {
        int v = ir_operands(g, &g->nodes[i])[k];
        r.users[r.user_at[v] + fill[v]++] = i;
      }
  }
  ir_graph *out = ok ? ir_graph_new(g->name) : NULL;
  r.ng = out;
  if (out && !(build(&r) && ir_pass_dce(out) >= 0)) ir_graph_free(out), out = NULL;
  if (out && scalar_hoist_enabled()) out = hoist_scalars(out);
  if (out) st->recomputed_nodes = r.recomputed, st->scatter_sums = r.scatter_sums, st->window_reductions = r.windows;
  free(r.def), free(r.seg), free(r.anchored), free(r.cheap), free(r.map), free(r.rec), free(r.rec_seg);
  free(r.user_at), free(r.users), free(r.seen), free(r.cat_sum), free(fill);
  return out;
}
