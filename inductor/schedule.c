/* inductor/schedule.c: lowering and fusion (which nodes form which kernel, in what order),
 * memory planning (liveness, the arena, in-place updates), and the printed schedule. See
 * inductor.h for the rules. */
#include "internal.h"
#include "../runtime/cuda.h"

#include <stdio.h>

/* ---- the schedule ---- */





/* Views and scalar constants only make headers: they may run before a kernel that does not feed
 * them, so they do not split a run of pointwise nodes. */
static bool hoistable(const ir_graph *g, const ir_node *n, const bool *in_group) {
  if (!(prim_get(n->op)->flags & P_VIEW) && !(n->op == EM_PRIM_FULL && n->attrs.shape.ndim == 0)) return false;
  for (int k = 0; k < n->n_in; k++)
    if (in_group[ir_operands(g, n)[k]]) return false;
  return true;
}



/* Whether dims [split, ndim) of a buffer with these strides (over sizes) coalesce into one. */
static bool inner_coalesces(int ndim, const int64_t *sizes, const int64_t *strides, int split) {
  int prev = -1;
  for (int d = split; d < ndim; d++) {
    if (sizes[d] == 1) continue;
    if (prev >= 0 && strides[prev] != strides[d] * sizes[d]) return false;
    prev = d;
  }
  return true;
}

bool ind_row_buffer(const ir_graph *g, const prim_meta *meta, const signed char *kind, const kernel *k, int bi,
                    int64_t *outer, int64_t *inner) {
  const ir_type *S = &k->shape;
  int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
  *inner = 0;
  if (kind[v] ? kind[v] != K_FULL : !same_shape(&g->values[v].type, S)) return false;
  int64_t st[EM_MAX_DIMS];
  if (bi < k->n_out) ir_contiguous_strides(S->ndim, S->sizes, st);
  else memcpy(st, meta[v].strides, sizeof(int64_t) * (size_t)S->ndim);
  for (int d = 0; d < k->split; d++) outer[d] = st[d];
  for (int d = S->ndim - 1; d >= k->split; d--)
    if (S->sizes[d] != 1) {
      *inner = st[d];
      break;
    }
  if (bi < k->n_out && numel_of(S) > 0) *inner = 1;
  return true;
}

/* The group being built: nodes fused so far and the iteration space they share. */
enum { G_EMPTY, G_PW, G_ROW };
typedef struct group {
  int n, *nodes;
  int mode;
  bool has_col;
  ir_type shape;
  int split;
  int64_t rows;
} group;

typedef struct builder {
  ind_program *p;
  const prim_meta *meta;
  bool *in_group;
  int *tmat;  /* [n_nodes] see step.tmat */
  bool *alias; /* [n_nodes] see step.alias */
  bool *skip; /* [n_nodes] a matmul or transpose folded into a later node's tmat, or into a GEMM epilogue */
  int *epi;   /* [n_nodes] > 0: the node is the result of GEMM epilogue p->epis[epi - 1] */
  group gr;
  int cap_steps, cap_kernels;
  int *last_use;   /* [n_values] the last node reading the value (n_nodes for a graph output), or -1 */
  int *seen, stamp; /* [n_values] fits_buffers' marks */
} builder;

static bool push_step(builder *b, step s) {
  if (b->p->n_steps == b->cap_steps) {
    int c = b->cap_steps ? 2 * b->cap_steps : 64;
    step *n = realloc(b->p->steps, sizeof(step) * (size_t)c);
    if (!n) return false;
    b->p->steps = n, b->cap_steps = c;
  }
  s.n_release = 0, s.release = NULL;
  b->p->steps[b->p->n_steps++] = s;
  return true;
}

/* Whether external operand v can be read by a node of kind `kind` in the group. */
static bool external_ok(const builder *b, int v, int kind) {
  const prim_meta *m = &b->meta[v];
  if (kind == K_ROW || b->gr.mode != G_ROW) return true; /* row r: linear index r, any strides */
  return inner_coalesces(m->ndim, m->sizes, m->strides, b->gr.split);
}

static bool operands_ok(const builder *b, const ir_node *n, int kind) {
  const ir_graph *g = b->p->g;
  for (int k = 0; k < n->n_in; k++) {
    int v = ir_operands(g, n)[k];
    if (!b->in_group[v] && !external_ok(b, v, kind)) return false;
  }
  return true;
}

/* Every external operand of the group's nodes is still readable if the group's nodes took the
 * given kind (FULL under a new split, or ROW). */
static bool group_operands_ok(const builder *b, int kind) {
  for (int i = 0; i < b->gr.n; i++)
    if (!operands_ok(b, &b->p->g->nodes[b->gr.nodes[i]], kind)) return false;
  return true;
}

static void set_kind_all(builder *b, int kind) {
  for (int i = 0; i < b->gr.n; i++) b->p->kind[b->p->g->nodes[b->gr.nodes[i]].out] = (signed char)kind;
}

static void add(builder *b, int node, int kind) {
  b->gr.nodes[b->gr.n++] = node;
  b->in_group[b->p->g->nodes[node].out] = true;
  b->p->kind[b->p->g->nodes[node].out] = (signed char)kind;
}


static bool contains(const int *a, int n, int v);

/* ---- random nodes (issue 20) ----
 *
 * A Philox uniform or normal on the CPU in f32 or f64 joins a pointwise kernel over its own shape
 * as a FULL value: the kernel computes element i from its counter (codegen.c: emit_philox), so
 * dropout's uniform, mask and scale fuse with their neighbours instead of being written by the
 * eager kernel and read back. Its counters are reserved at run time (ind_program.rand). Row
 * kernels do not take them (their passes would need the element index too); a random node there
 * closes the row kernel and opens a pointwise one. */
static bool random_renders(const ind_program *p, const ir_node *n) {
  if (!(prim_get(n->op)->flags & P_RANDOM) || p->device != EM_CPU) return false;
  const ir_type *t = &p->g->values[n->out].type;
  return t->device == EM_CPU && (t->dtype == EM_F32 || t->dtype == EM_F64) && ir_type_concrete(t);
}

static bool group_has_random(const builder *b) {
  for (int i = 0; i < b->gr.n; i++)
    if (prim_get(b->p->g->nodes[b->gr.nodes[i]].op)->flags & P_RANDOM) return true;
  return false;
}

/* The program's counter table: its random nodes in graph order. A CPU random node nothing reads
 * is skipped (its counters are still reserved, so later draws are eager's). */
static bool random_table(builder *b) {
  ind_program *p = b->p;
  const ir_graph *g = p->g;
  p->rand = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
  p->rand_of = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
  if (!p->rand || !p->rand_of) return false;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    p->rand_of[i] = -1;
    if (!(prim_get(n->op)->flags & P_RANDOM)) continue;
    p->rand_of[i] = p->n_rand, p->rand[p->n_rand++] = i;
    bool used = false;
    for (int o = 0; o < g->n_outputs && !used; o++) used = g->outputs[o] == n->out;
    for (int j = i + 1; j < g->n_nodes && !used; j++) used = contains(ir_operands(g, &g->nodes[j]), g->nodes[j].n_in, n->out);
    if (!used && random_renders(p, n)) b->skip[i] = true;
  }
  return true;
}

/* Kernel k's random nodes' entries in the counter table, in node order. */
static bool kernel_random(const ind_program *p, kernel *k) {
  k->n_rng = 0;
  for (int i = 0; i < k->n_nodes; i++) k->n_rng += p->rand_of[k->nodes[i]] >= 0;
  if (!k->n_rng) return true;
  if (!(k->rng = malloc(sizeof(int) * (size_t)k->n_rng))) return false;
  k->n_rng = 0;
  for (int i = 0; i < k->n_nodes; i++)
    if (p->rand_of[k->nodes[i]] >= 0) k->rng[k->n_rng++] = p->rand_of[k->nodes[i]];
  return true;
}

/* The most buffers a generated kernel takes (codegen.c). */
enum { KERNEL_MAX_BUFFERS = 128 };

/* Whether the open group with node i added still takes at most KERNEL_MAX_BUFFERS buffers: the
 * values it reads from outside, and those read after i or returned (at most what it stores).
 * Scalar work scheduled first (rewrite.c) makes one-element chains of any length, which once made
 * a kernel of 150 buffers that the code generator refused, and the graph ran op by op. */
static bool fits_buffers(builder *b, int i) {
  const ir_graph *g = b->p->g;
  int stamp = ++b->stamp, nb = 0;
  for (int q = 0; q <= b->gr.n; q++) {
    const ir_node *x = &g->nodes[q < b->gr.n ? b->gr.nodes[q] : i];
    for (int a = 0; a < x->n_in; a++) {
      int v = ir_operands(g, x)[a];
      if (!b->in_group[v] && b->seen[v] != stamp) b->seen[v] = stamp, nb++;
    }
    nb += b->last_use[x->out] > i;
  }
  return nb <= KERNEL_MAX_BUFFERS;
}

/* Adds node i to the open group when it fits its iteration space; false when it does not. */
static bool try_add(builder *b, int i) {
  const ir_graph *g = b->p->g;
  const ir_node *n = &g->nodes[i];
  const ir_type *t = &g->values[n->out].type;
  group *gr = &b->gr;
  signed char *kind = b->p->kind;
  if (gr->n && !fits_buffers(b, i)) return false;
  for (int a = 0; a < n->n_in; a++) /* a column reduction is complete only when its kernel ends */
    if (b->in_group[ir_operands(g, n)[a]] && kind[ir_operands(g, n)[a]] == K_COL) return false;
  /* column reductions accumulate across the CPU kernel's threads; on the GPU they run eagerly */
  if (leading_reduction(g, n) >= 0 && gr->mode != G_ROW && b->p->rend->column_reductions) {
    int u = ir_operands(g, n)[0];
    const ir_type *ut = &g->values[u].type;
    if (gr->mode == G_EMPTY) gr->mode = G_PW, gr->shape = *ut, gr->split = ut->ndim, gr->rows = numel_of(ut);
    else if (!same_shape(ut, &gr->shape)) return false;
    gr->has_col = true;
    return add(b, i, K_COL), true;
  }
  bool rnd = random_renders(b->p, n);
  if (rnd && gr->mode == G_ROW) return false;
  if (rnd || b->p->rend->renders(g, n)) {
    if (gr->mode == G_EMPTY) {
      if (!operands_ok(b, n, K_FULL)) return false;
      gr->mode = G_PW, gr->shape = *t, gr->split = t->ndim, gr->rows = numel_of(t);
      return add(b, i, K_FULL), true;
    }
    if (same_shape(t, &gr->shape)) return operands_ok(b, n, K_FULL) ? (add(b, i, K_FULL), true) : false;
    if (gr->mode == G_ROW && numel_of(t) == gr->rows && operands_ok(b, n, K_ROW)) return add(b, i, K_ROW), true;
    return false;
  }
  int k = trailing_reduction(g, n);
  if (!b->p->rend->row_f64 && g->values[n->out].type.dtype != EM_F32) k = -1; /* CUDA rows accumulate f32 */
  if (k >= 0) {
    int u = ir_operands(g, n)[0];
    const ir_type *ut = &g->values[u].type;
    if (b->in_group[u] && kind[u] != K_FULL) return false;
    if (gr->mode == G_EMPTY) {
      gr->mode = G_ROW, gr->shape = *ut, gr->split = k, gr->rows = prefix_numel(ut, k);
      if (!operands_ok(b, n, K_FULL)) return gr->mode = G_EMPTY, false;
      return add(b, i, K_ROW), true;
    }
    if (!same_shape(ut, &gr->shape)) return false;
    if (gr->mode == G_ROW) return k == gr->split && operands_ok(b, n, K_FULL) ? (add(b, i, K_ROW), true) : false;
    /* a pointwise group over S becomes a row kernel */
    if (gr->has_col || group_has_random(b)) return false;
    group saved = *gr;
    gr->mode = G_ROW, gr->split = k, gr->rows = prefix_numel(ut, k);
    if (!group_operands_ok(b, K_FULL) || !operands_ok(b, n, K_FULL)) return *gr = saved, false;
    return add(b, i, K_ROW), true;
  }
  if (!(prim_get(n->op)->flags & P_VIEW) || n->n_in != 1) return false;
  int u = ir_operands(g, n)[0];
  if (!b->in_group[u]) return false;
  const ir_type *ut = &g->values[u].type;
  if (n->op == EM_PRIM_DETACH) return add(b, i, kind[u]), true;
  if (kind[u] == K_ROW && (n->op == EM_PRIM_RESHAPE || n->op == EM_PRIM_SQUEEZE || n->op == EM_PRIM_UNSQUEEZE))
    return add(b, i, K_ROW), true;
  if (n->op != EM_PRIM_EXPAND || ut->ndim != t->ndim) return false;
  /* a broadcast of per-row values over the trailing dims */
  k = ut->ndim;
  while (k > 0 && ut->sizes[k - 1] == 1) k--;
  for (int d = 0; d < k; d++)
    if (ut->sizes[d] != t->sizes[d]) return false;
  if (k == t->ndim) return false;
  if (gr->mode == G_ROW) {
    if (kind[u] != K_ROW || !same_shape(t, &gr->shape) || prefix_numel(t, k) != gr->rows) return false;
    return add(b, i, K_FULL), true;
  }
  /* a pointwise group over per-row values becomes a row kernel over t */
  if (gr->mode != G_PW || gr->has_col || numel_of(&gr->shape) != prefix_numel(t, k) || group_has_random(b)) return false;
  group saved = *gr;
  gr->mode = G_ROW, gr->shape = *t, gr->split = k, gr->rows = prefix_numel(t, k);
  if (!group_operands_ok(b, K_ROW)) return *gr = saved, false;
  set_kind_all(b, K_ROW);
  return add(b, i, K_FULL), true;
}

static bool contains(const int *a, int n, int v) {
  for (int i = 0; i < n; i++)
    if (a[i] == v) return true;
  return false;
}

/* Closes the open group into a kernel step. In-group broadcasts that later steps read are
 * made again after the kernel, as views of their operand (which the kernel then stores). */
static bool close_group(builder *b) {
  group *gr = &b->gr;
  int n = gr->n;
  if (!n) return gr->mode = G_EMPTY, gr->has_col = false, true;
  ind_program *p = b->p;
  const ir_graph *g = p->g;
  if (p->n_kernels == b->cap_kernels) {
    int c = b->cap_kernels ? 2 * b->cap_kernels : 16;
    kernel *k = realloc(p->kernels, sizeof(kernel) * (size_t)c);
    if (!k) return false;
    p->kernels = k, b->cap_kernels = c;
  }
  kernel *k = &p->kernels[p->n_kernels];
  memset(k, 0, sizeof *k);
  k->nodes = malloc(sizeof(int) * (size_t)n);
  k->in = malloc(sizeof(int) * (size_t)(n * 3 + 1));
  k->out = malloc(sizeof(int) * (size_t)(2 * n + 1));
  int *redo = malloc(sizeof(int) * (size_t)(n + 1)), n_redo = 0;
  if (!k->nodes || !k->in || !k->out || !redo) {
    free(k->nodes), free(k->in), free(k->out), free(redo);
    return false;
  }
  memcpy(k->nodes, gr->nodes, sizeof(int) * (size_t)n);
  k->n_nodes = n;
  k->row = gr->mode == G_ROW;
  k->has_col = gr->has_col;
  k->shape = gr->shape;
  k->split = k->row ? gr->split : gr->shape.ndim;
  for (int i = 0; i < n; i++) {
    const ir_node *x = &g->nodes[gr->nodes[i]];
    for (int a = 0; a < x->n_in; a++) {
      int v = ir_operands(g, x)[a];
      if (!b->in_group[v] && !contains(k->in, k->n_in, v)) k->in[k->n_in++] = v;
    }
  }
  /* outputs: results read after the kernel or returned (hoisted views between the group's
   * nodes cannot read a group value: see hoistable) */
  int last = gr->nodes[n - 1];
  for (int i = n - 1; i >= 0; i--) {
    const ir_node *x = &g->nodes[gr->nodes[i]];
    int v = x->out;
    if (contains(k->out, k->n_out, v)) continue; /* already: the operand of a broadcast made again */
    bool used = false;
    for (int o = 0; o < g->n_outputs && !used; o++) used = g->outputs[o] == v;
    for (int j = last + 1; j < g->n_nodes && !used; j++)
      used = contains(ir_operands(g, &g->nodes[j]), g->nodes[j].n_in, v);
    if (!used) continue;
    if (x->op == EM_PRIM_EXPAND) { /* stored, it would not have the view's layout */
      redo[n_redo++] = gr->nodes[i];
      int u = ir_operands(g, x)[0];
      if (!contains(k->out, k->n_out, u)) k->out[k->n_out++] = u;
    } else {
      k->out[k->n_out++] = v;
    }
  }
  /* in graph order, so a later output of the same group is after the values it reads */
  for (int i = 0; i < k->n_out; i++)
    for (int j = i + 1; j < k->n_out; j++)
      if (k->out[j] < k->out[i]) {
        int t = k->out[i];
        k->out[i] = k->out[j], k->out[j] = t;
      }
  if (!kernel_random(p, k)) {
    free(k->nodes), free(k->in), free(k->out), free(redo);
    return false;
  }
  snprintf(k->name, sizeof k->name, "k%d", p->n_kernels); /* renamed after the module's key */
  for (int i = 0; i < n; i++) b->in_group[g->nodes[gr->nodes[i]].out] = false;
  p->n_kernels++;
  bool ok = push_step(b, (step){-1, p->n_kernels - 1, -1, false, 0, NULL});
  for (int i = n_redo - 1; ok && i >= 0; i--) ok = push_step(b, (step){redo[i], -1, -1, false, 0, NULL});
  free(redo);
  gr->n = 0, gr->mode = G_EMPTY, gr->has_col = false;
  return ok;
}

/* A contiguous copy of a transposed product, clone(permute(matmul(a, b))) with the last two dims
 * swapped (the gradient of a weight, as the autograd engine accumulates it), is the product
 * b^T a^T, which the GEMM library writes contiguous directly: no transposing copy. The rounding
 * may differ from eager's (the library may sum in another order). */
static void find_transposed_products(builder *b) {
  const ir_graph *g = b->p->g;
  int *uses = malloc(sizeof(int) * (size_t)(g->n_values + 1));
  int *def = malloc(sizeof(int) * (size_t)(g->n_values + 1));
  if (!uses || !def) {
    free(uses), free(def);
    return; /* an optimisation: without it the copies run */
  }
  ir_count_uses(g, uses);
  for (int v = 0; v < g->n_values; v++) def[v] = -1;
  for (int i = 0; i < g->n_nodes; i++) def[g->nodes[i].out] = i;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *c = &g->nodes[i];
    if (c->op != EM_PRIM_CLONE) continue;
    int v = ir_operands(g, c)[0];
    if (def[v] < 0 || uses[v] != 1 || g->nodes[def[v]].op != EM_PRIM_PERMUTE) continue;
    const ir_node *t = &g->nodes[def[v]];
    int nd = t->attrs.n_axes;
    bool swap = nd >= 2 && t->attrs.axes[nd - 1] == nd - 2 && t->attrs.axes[nd - 2] == nd - 1;
    for (int d = 0; swap && d < nd - 2; d++) swap = t->attrs.axes[d] == d;
    int m = ir_operands(g, t)[0];
    if (!swap || def[m] < 0 || uses[m] != 1 || g->nodes[def[m]].op != EM_PRIM_MATMUL) continue;
    const ir_node *mm = &g->nodes[def[m]];
    const ir_type *ta = &g->values[ir_operands(g, mm)[0]].type, *tb = &g->values[ir_operands(g, mm)[1]].type;
    if (ta->ndim < 2 || tb->ndim < 2 || ta->dtype != EM_F32 || tb->dtype != EM_F32) continue;
    b->tmat[i] = def[m];
    b->skip[def[m]] = b->skip[def[v]] = true;
  }
  /* A clone (the autograd engine's copy of a gradient it keeps) of a value made inside the graph
   * that nothing else can observe copies nothing: the clone is that tensor. Observing means
   * reading the value, or any value in its chain of views down to the storage's maker, or
   * returning one of them; the maker must not be a graph input (its storage is the caller's). */
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *c = &g->nodes[i];
    if (c->op != EM_PRIM_CLONE || b->tmat[i] >= 0) continue;
    bool alone = true;
    int v = ir_operands(g, c)[0];
    for (;;) {
      for (int o = 0; o < g->n_outputs; o++) alone = alone && g->outputs[o] != v;
      alone = alone && def[v] >= 0 && uses[v] == 1;
      if (!alone || !(prim_get(g->nodes[def[v]].op)->flags & P_VIEW)) break;
      v = ir_operands(g, &g->nodes[def[v]])[0];
    }
    b->alias[i] = alone;
  }
  free(uses), free(def);
}

/* ---- GEMM epilogues: cuBLASLt (CUDA), the GEMM's tiles (CPU) ----
 *
 * matmul -> add(bias broadcast over the rows) [-> relu | tanh GELU] becomes one cublasLtMatmul
 * with the BIAS, RELU_BIAS or GELU_BIAS epilogue when nothing else reads the product or the sums
 * the epilogue swallows (a reshape of the product, as em_linear makes for a 3-D input, may sit
 * between). The activation is matched on the graph the composite traces, as a pattern below.
 * Otherwise the GEMM runs alone and a generated kernel is its epilogue, as before.
 * Numerics: cuBLASLt applies the bias and the activation to the f32 accumulator and rounds once
 * (eager rounds an f16/bf16 product before adding); its ReLU is max(x, 0), which takes a NaN to
 * 0 where eager's where(x <= 0, 0, x) keeps it.
 * On the CPU the same chains (f32, erf GELU too, the bias optional) run as one extern step,
 * prim_gemm_epilogue: the oneDNN sgemm tiles, each followed by the bias and activation while it
 * is in cache, with the generated kernel's bits (prims/extern.c), instead of that kernel reading
 * the product back from memory. The product may have other readers there (a training forward
 * saves it for the backward): the step then stores it too, when they all come after the chain. */

/* The activations cuBLASLt applies after the bias, as patterns over the pre-activation h: what
 * em_relu and em_gelu(x, tanh_approx=true) trace (runtime/composite.c). add and mul match either
 * way round; a number matches a scalar constant (a 0-dim full, or an expand of one) that rounds
 * to the same f32. cuBLASLt's GELU is the tanh form only: erf GELU is no match. */
static const struct {
  int act, cpu; /* the cu_epilogue (-1: none on CUDA), the prim_activation (CPU) */
  const char *name, *pattern;
} activations[] = {
    {CU_EPI_BIAS_RELU, PRIM_ACT_RELU, "bias+relu", "where(le(h, 0), 0, h)"},
    {CU_EPI_BIAS_GELU_TANH, PRIM_ACT_GELU_TANH, "bias+gelu_tanh",
     "mul(mul(h, 0.5), add(tanh(mul(add(h, mul(mul(mul(h, h), h), 0.044715)), 0.7978845608028654)), 1))"},
    {-1, PRIM_ACT_GELU_ERF, "bias+gelu_erf", "mul(mul(h, 0.5), add(erf(mul(h, 0.7071067811865476)), 1))"},
};

/* act: a cu_epilogue in a CUDA program, a prim_activation in a CPU one (ind_epilogue.act). */
static const char *epilogue_name(bool cuda, int act) {
  for (size_t i = 0; i < sizeof activations / sizeof activations[0]; i++)
    if ((cuda ? activations[i].act : activations[i].cpu) == act) return activations[i].name;
  return "bias";
}

/* A parsed pattern: kind 'h' (the pre-activation), 'c' (a constant) or 'o' (prim op of n args). */
typedef struct pat {
  char kind;
  em_prim op;
  double value;
  int n, arg[3];
} pat;
typedef struct pats {
  pat p[32];
  int n;
} pats;

static int pat_parse(pats *ps, const char **s) {
  while (**s == ' ') (*s)++;
  if (ps->n == 32) return -1;
  int me = ps->n++;
  pat *p = &ps->p[me];
  memset(p, 0, sizeof *p);
  if (**s >= '0' && **s <= '9') {
    char *end;
    p->kind = 'c', p->value = strtod(*s, &end), *s = end;
    return me;
  }
  const char *name = *s;
  while ((**s >= 'a' && **s <= 'z') || **s == '_') (*s)++;
  size_t len = (size_t)(*s - name);
  if (len == 1 && *name == 'h') return p->kind = 'h', me;
  p->kind = 'o', p->op = EM_PRIM_COUNT;
  for (int i = 0; i < EM_PRIM_COUNT; i++)
    if (strlen(prim_get((em_prim)i)->name) == len && !strncmp(prim_get((em_prim)i)->name, name, len))
      p->op = (em_prim)i;
  if (p->op == EM_PRIM_COUNT || *(*s)++ != '(') return -1;
  for (;;) {
    int a = pat_parse(ps, s);
    if (a < 0 || ps->p[me].n == 3) return -1;
    ps->p[me].arg[ps->p[me].n++] = a;
    while (**s == ' ') (*s)++;
    if (**s == ')') return (*s)++, me;
    if (*(*s)++ != ',') return -1;
  }
}

typedef struct matcher {
  const ir_graph *g;
  const int *def; /* value -> its node, -1 for inputs */
  int h;
  int nodes[64], n; /* matched op nodes */
  int consts[64], nc; /* matched constant nodes (full, expand) */
} matcher;

static bool match_const(matcher *m, int v, double c) {
  int d = m->def[v];
  if (d < 0) return false;
  const ir_node *n = &m->g->nodes[d];
  int e = -1;
  if (n->op == EM_PRIM_EXPAND) {
    e = d, d = m->def[ir_operands(m->g, n)[0]];
    if (d < 0) return false;
    n = &m->g->nodes[d];
  }
  if (n->op != EM_PRIM_FULL || n->attrs.shape.ndim != 0 || (float)n->attrs.value != (float)c || m->nc > 62)
    return false;
  if (e >= 0) m->consts[m->nc++] = e;
  m->consts[m->nc++] = d;
  return true;
}

static bool match(matcher *m, const pats *ps, int pi, int v) {
  const pat *p = &ps->p[pi];
  if (p->kind == 'h') return v == m->h;
  if (p->kind == 'c') return match_const(m, v, p->value);
  int d = m->def[v];
  if (d < 0 || m->n == 64) return false;
  const ir_node *n = &m->g->nodes[d];
  if (n->op != p->op || n->n_in != p->n) return false;
  int mark = m->n, cmark = m->nc;
  m->nodes[m->n++] = d;
  const int *o = ir_operands(m->g, n);
  bool ok = true;
  for (int a = 0; a < p->n && ok; a++) ok = match(m, ps, p->arg[a], o[a]);
  if (!ok && p->n == 2 && (p->op == EM_PRIM_ADD || p->op == EM_PRIM_MUL)) { /* the other way round */
    m->n = mark + 1, m->nc = cmark;
    ok = match(m, ps, p->arg[0], o[1]) && match(m, ps, p->arg[1], o[0]);
  }
  if (!ok) m->n = mark, m->nc = cmark;
  return ok;
}

/* Whether every use of value v is an operand of one of nodes[0..n) (counted with repeats). */
static bool used_only_by(const ir_graph *g, const int *uses, int v, const int *nodes, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    for (int a = 0; a < g->nodes[nodes[i]].n_in; a++) k += ir_operands(g, &g->nodes[nodes[i]])[a] == v;
  return uses[v] == k;
}

/* The product, reshape and bias feeding add node i: the chain's first nodes (matmul, reshape,
 * the bias's expand) into m->nodes and the bias value into *bias; false when i is no bias add of
 * a GEMM this schedule may fuse. On the CPU the product (or its reshape) may have other readers:
 * the epilogue step then stores it too (ind_epilogue.keep). */
static bool bias_add(const builder *b, const int *def, const int *uses, int i, matcher *m, int *bias) {
  const ir_graph *g = b->p->g;
  const ir_node *add = &g->nodes[i];
  const ir_type *t = &g->values[add->out].type;
  bool cuda = b->p->device == EM_CUDA; /* the CPU's epilogue is on oneDNN's sgemm: f32 only */
  if (add->op != EM_PRIM_ADD || (t->dtype != EM_F32 && (!cuda || (t->dtype != EM_F16 && t->dtype != EM_BF16))) ||
      t->ndim < 1)
    return false;
  for (int side = 0; side < 2; side++) {
    int x = ir_operands(g, add)[side], e = ir_operands(g, add)[1 - side], rs = -1, ex = -1;
    if (def[x] >= 0 && g->nodes[def[x]].op == EM_PRIM_RESHAPE && (uses[x] == 1 || !cuda))
      rs = def[x], x = ir_operands(g, &g->nodes[rs])[0];
    if (def[x] < 0 || (cuda && uses[x] != 1)) continue;
    const ir_node *mm = &g->nodes[def[x]];
    const ir_type *mt = &g->values[x].type;
    if (mm->op != EM_PRIM_MATMUL || mt->dtype != t->dtype || mt->ndim < 2 ||
        mt->sizes[mt->ndim - 1] != t->sizes[t->ndim - 1])
      continue;
    int64_t N = t->sizes[t->ndim - 1];
    if (def[e] >= 0 && g->nodes[def[e]].op == EM_PRIM_EXPAND) ex = def[e], e = ir_operands(g, &g->nodes[ex])[0];
    /* the GEMM applies the bias to its tiles: a bias made after the product (the product itself
     * in add(mm, mm), fuzz program 2065) does not exist yet */
    if (def[e] >= def[x]) continue;
    const ir_type *bt = &g->values[e].type;
    bool row = bt->device == b->p->device && bt->dtype == t->dtype && bt->ndim >= 1 && bt->sizes[bt->ndim - 1] == N;
    for (int d = 0; row && d < bt->ndim - 1; d++) row = bt->sizes[d] == 1;
    if (!row) continue;
    m->n = 0;
    m->nodes[m->n++] = def[x];
    if (rs >= 0) m->nodes[m->n++] = rs;
    if (ex >= 0 && uses[g->nodes[ex].out] == 1) m->nodes[m->n++] = ex;
    m->nodes[m->n++] = i;
    for (int k = 0; k < m->n; k++)
      if (b->skip[m->nodes[k]] || b->tmat[m->nodes[k]] >= 0 || b->alias[m->nodes[k]] || b->epi[m->nodes[k]])
        return false;
    *bias = e;
    return true;
  }
  return false;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Records the epilogue of the chain in m (its nodes, and the constants only it reads) and marks
 * its nodes skipped but for the last, which runs it. */
static bool add_epilogue(builder *b, const int *uses, matcher *m, int bias, int act, bool keep) {
  ind_program *p = b->p;
  const ir_graph *g = p->g;
  int all[128], n = 0;
  for (int k = 0; k < m->n; k++)
    if (!contains(all, n, m->nodes[k])) all[n++] = m->nodes[k];
  for (int k = 0; k < m->nc; k++) /* constants (expands first) that nothing outside the chain reads */
    if (!contains(all, n, m->consts[k]) && g->nodes[m->consts[k]].op == EM_PRIM_EXPAND &&
        used_only_by(g, uses, g->nodes[m->consts[k]].out, all, n))
      all[n++] = m->consts[k];
  for (int k = 0; k < m->nc; k++)
    if (!contains(all, n, m->consts[k]) && g->nodes[m->consts[k]].op == EM_PRIM_FULL &&
        used_only_by(g, uses, g->nodes[m->consts[k]].out, all, n))
      all[n++] = m->consts[k];
  qsort(all, (size_t)n, sizeof all[0], cmp_int);
  int reads[128], nr = 0;
  for (int k = 0; k < n; k++) {
    const ir_node *x = &g->nodes[all[k]];
    for (int a = 0; a < x->n_in; a++) {
      int v = ir_operands(g, x)[a];
      bool inside = false;
      for (int q = 0; q < k && !inside; q++) inside = g->nodes[all[q]].out == v;
      if (!inside && !contains(reads, nr, v) && nr < 128) reads[nr++] = v;
    }
  }
  ind_epilogue *ne = realloc(p->epis, sizeof *ne * (size_t)(p->n_epis + 1));
  if (!ne) return false;
  p->epis = ne;
  ind_epilogue *e = &p->epis[p->n_epis];
  *e = (ind_epilogue){.mm = m->nodes[0], .bias = bias, .act = act, .keep = keep, .n_nodes = n, .n_reads = nr};
  e->nodes = malloc(sizeof(int) * (size_t)n), e->reads = malloc(sizeof(int) * (size_t)(nr + 1));
  if (!e->nodes || !e->reads) return free(e->nodes), free(e->reads), false;
  memcpy(e->nodes, all, sizeof(int) * (size_t)n), memcpy(e->reads, reads, sizeof(int) * (size_t)nr);
  p->n_epis++;
  for (int k = 0; k < n - 1; k++) b->skip[all[k]] = true;
  b->epi[all[n - 1]] = p->n_epis;
  return true;
}

/* The activation (a pattern above) whose root reads h after node `after`: its nodes appended to
 * m->nodes from base, its code returned (cuBLASLt's or prim_gemm_epilogue's); none when no
 * pattern matches with its interior values read inside it only, and with h read by it only
 * unless h_shared (h is then stored too). */
static int find_activation(const builder *b, const int *uses, matcher *m, int h, int after, bool h_shared, int none) {
  const ir_graph *g = b->p->g;
  bool cuda = b->p->device == EM_CUDA;
  int base = m->n;
  for (size_t a = 0; a < sizeof activations / sizeof activations[0]; a++) {
    if (cuda && activations[a].act < 0) continue;
    /* the activation's root: a reader of h, the last node of its pattern */
    pats ps = {.n = 0};
    const char *src = activations[a].pattern;
    int top = pat_parse(&ps, &src);
    EM_ASSERT(top == 0 && !*src);
    for (int r = after + 1; r < g->n_nodes; r++) {
      m->h = h, m->n = base, m->nc = 0;
      if (!match(m, &ps, 0, g->nodes[r].out)) continue;
      bool only = h_shared || used_only_by(g, uses, h, m->nodes + base, m->n - base);
      for (int k = base + 1; only && k < m->n; k++) /* interior values: read inside the pattern only */
        only = used_only_by(g, uses, g->nodes[m->nodes[k]].out, m->nodes + base, m->n - base);
      for (int k = base; only && k < m->n; k++)
        only = !b->skip[m->nodes[k]] && b->tmat[m->nodes[k]] < 0 && !b->alias[m->nodes[k]] && !b->epi[m->nodes[k]];
      if (only) return cuda ? activations[a].act : activations[a].cpu;
    }
  }
  m->n = base, m->nc = 0;
  return none;
}

/* CPU, a chain in m (the matmul first, then perhaps its reshape) whose product or reshape other
 * nodes read too (*keep): whether all those readers come after the chain's last node, where the
 * step that stores them runs. */
static bool kept_in_time(const ir_graph *g, const int *uses, const matcher *m, bool *keep) {
  int last = 0, vals[2] = {g->nodes[m->nodes[0]].out, -1};
  for (int k = 0; k < m->n; k++) last = m->nodes[k] > last ? m->nodes[k] : last;
  if (m->n > 1 && g->nodes[m->nodes[1]].op == EM_PRIM_RESHAPE) vals[1] = g->nodes[m->nodes[1]].out;
  *keep = false;
  for (int q = 0; q < 2 && vals[q] >= 0; q++) {
    if (used_only_by(g, uses, vals[q], m->nodes, m->n)) continue;
    *keep = true;
    for (int j = 0; j <= last; j++) {
      bool inside = false;
      for (int k = 0; k < m->n && !inside; k++) inside = m->nodes[k] == j;
      for (int a = 0; !inside && a < g->nodes[j].n_in; a++)
        if (ir_operands(g, &g->nodes[j])[a] == vals[q]) return false;
    }
  }
  return true;
}

/* CPU: matmul [-> reshape] -> activation, no bias (the transformer's MLP): the chain into m. */
static int bare_activation(const builder *b, const int *def, const int *uses, int i, matcher *m) {
  const ir_graph *g = b->p->g;
  const ir_node *mm = &g->nodes[i];
  const ir_type *t = &g->values[mm->out].type;
  if (mm->op != EM_PRIM_MATMUL || t->dtype != EM_F32 || t->ndim < 2 || b->skip[i] || b->tmat[i] >= 0 || b->epi[i])
    return PRIM_ACT_NONE;
  for (int r = i; r < g->n_nodes; r++) { /* h: the product, or a reshape of it */
    const ir_node *x = &g->nodes[r];
    if (r > i && (x->op != EM_PRIM_RESHAPE || ir_operands(g, x)[0] != mm->out || b->skip[r] || b->epi[r])) continue;
    m->n = m->nc = 0;
    m->nodes[m->n++] = i;
    if (r > i) m->nodes[m->n++] = r;
    int act = find_activation(b, uses, m, x->out, r, true, PRIM_ACT_NONE);
    if (act != PRIM_ACT_NONE) return act;
  }
  (void)def;
  return PRIM_ACT_NONE;
}

static bool find_gemm_epilogues(builder *b) {
  const ir_graph *g = b->p->g;
  char why[256];
  bool available = false, asked = false, cuda = b->p->device == EM_CUDA;
  int *uses = malloc(sizeof(int) * (size_t)(g->n_values + 1)), *def = malloc(sizeof(int) * (size_t)(g->n_values + 1));
  bool ok = uses && def;
  if (ok) ir_count_uses(g, uses);
  for (int v = 0; ok && v < g->n_values; v++) def[v] = -1;
  for (int i = 0; ok && i < g->n_nodes; i++) def[g->nodes[i].out] = i;
  for (int i = 0; ok && i < g->n_nodes; i++) {
    matcher m = {.g = g, .def = def};
    int bias;
    bool keep = false;
    if (!cuda) {
      int act = bare_activation(b, def, uses, i, &m);
      if (act != PRIM_ACT_NONE && kept_in_time(g, uses, &m, &keep)) {
        ok = add_epilogue(b, uses, &m, -1, act, keep);
        continue;
      }
      m = (matcher){.g = g, .def = def};
    }
    if (!bias_add(b, def, uses, i, &m, &bias)) continue;
    if (!asked) asked = true, available = !cuda || cu_lt_available(why, sizeof why);
    if (!available) break;
    const int none = cuda ? CU_EPI_BIAS : PRIM_ACT_NONE;
    int h = g->nodes[i].out, act = none, base = m.n;
    bool free_h = true; /* no graph output is h, nor (below) any other reader than the activation */
    for (int o = 0; o < g->n_outputs; o++) free_h = free_h && g->outputs[o] != h;
    if (free_h) act = find_activation(b, uses, &m, h, i, false, none);
    if (!cuda && !kept_in_time(g, uses, &m, &keep)) { /* a reader of the product before the activation's end */
      m.n = base, m.nc = 0, act = none;
      if (!kept_in_time(g, uses, &m, &keep)) continue;
    }
    ok = add_epilogue(b, uses, &m, bias, act, keep);
  }
  free(uses), free(def);
  return ok;
}

/* EMBER_INDUCTOR_EPILOGUE=0 turns GEMM epilogues off (to measure what they gain). */
static bool epilogues_enabled(void) {
  const char *e = getenv("EMBER_INDUCTOR_EPILOGUE");
  return !e || strcmp(e, "0") != 0;
}

static bool schedule(builder *b) {
  const ir_graph *g = b->p->g;
  b->gr.nodes = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
  b->in_group = calloc((size_t)(g->n_values + 1), 1);
  b->tmat = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
  b->skip = calloc((size_t)g->n_nodes + 1, 1);
  b->alias = calloc((size_t)g->n_nodes + 1, 1);
  b->epi = calloc((size_t)g->n_nodes + 1, sizeof(int));
  b->last_use = malloc(sizeof(int) * (size_t)(g->n_values + 1));
  b->seen = calloc((size_t)g->n_values + 1, sizeof(int));
  bool ok = b->gr.nodes && b->in_group && b->tmat && b->skip && b->alias && b->epi && b->last_use && b->seen;
  for (int v = 0; ok && v < g->n_values; v++) b->last_use[v] = -1;
  for (int i = 0; ok && i < g->n_nodes; i++)
    for (int a = 0; a < g->nodes[i].n_in; a++) b->last_use[ir_operands(g, &g->nodes[i])[a]] = i;
  for (int o = 0; ok && o < g->n_outputs; o++) b->last_use[g->outputs[o]] = g->n_nodes;
  for (int i = 0; ok && i < g->n_nodes; i++) b->tmat[i] = -1;
  if (ok) ok = random_table(b);
  if (ok) find_transposed_products(b);
  if (ok && b->p->rend->gemm_epilogues && epilogues_enabled()) ok = find_gemm_epilogues(b);
  for (int i = 0; ok && i < g->n_nodes; i++) {
    const ir_node *x = &g->nodes[i];
    if (b->skip[i]) continue;
    bool plain = b->tmat[i] < 0 && !b->alias[i] && !b->epi[i];
    if (plain && try_add(b, i)) continue;
    step st = {i, -1, b->tmat[i], b->alias[i], 0, NULL, b->epi[i]};
    if (b->gr.n && !b->epi[i] && hoistable(g, x, b->in_group)) {
      ok = push_step(b, st);
      continue;
    }
    ok = close_group(b) && ((plain && try_add(b, i)) || push_step(b, st));
  }
  ok = ok && close_group(b);
  free(b->gr.nodes), free(b->in_group), free(b->tmat), free(b->skip), free(b->alias), free(b->epi);
  free(b->last_use), free(b->seen);
  return ok;
}

/* ---- combo kernels (issue 20) ----
 *
 * Horizontal fusion, as TorchInductor's combo kernels and PyTorch's foreach/fused optimizers: a
 * run of pointwise kernels the schedule made one after another, each independent of the others
 * (none reads a value another computes, directly or through a view made between them), becomes
 * one step that runs them all in one parallel region over their index spaces laid end to end
 * (run.c: run_combo). Each part keeps its own code, sizes and buffers; the threads take blocks of
 * rows or columns of the parts, a large part split as a kernel alone is, small ones batched, so
 * one big part does not serialize the rest. A compiled optimizer step then runs its updates of
 * every parameter as one kernel instead of a parallel region per parameter.
 * Views and scalar constants between two parts run before the combo when they read nothing it
 * computes, after it otherwise (then no later part may read them). Row kernels and kernels with
 * column reductions are not parts (their splits keep a row or column on one thread), nor is a
 * kernel after COMBO_MAX_PARTS. Two parts never share bytes: the memory plan sees them all read
 * and write at one step, and an output stored into an input in place (ind_donatable) needs that
 * no other part reads the input. The parts' dtypes may differ: each keeps its vector width.
 * Values are the kernels' own, bit for bit: pointwise code does not depend on the split.
 * EMBER_INDUCTOR_COMBO=0 turns it off; EMBER_LOGS=schedule shows each combo and why a kernel
 * started a new one. */
enum { COMBO_MAX_PARTS = 64 };

static bool combo_enabled(void) {
  const char *e = getenv("EMBER_INDUCTOR_COMBO");
  return !e || strcmp(e, "0") != 0;
}

/* A node step that may run before or after the kernels around it: a view or a scalar constant. */
static bool combo_movable(const ir_graph *g, const step *st) {
  if (st->node < 0 || st->epi || st->tmat >= 0 || st->alias) return false;
  const ir_node *n = &g->nodes[st->node];
  return (prim_get(n->op)->flags & P_VIEW) || (n->op == EM_PRIM_FULL && n->n_in == 0 && n->attrs.shape.ndim == 0);
}

typedef struct combiner {
  ind_program *p;
  step *out;
  int n_out;
  int *cur, n_cur;       /* the open combo's kernels */
  int *later, n_later;   /* steps between its parts that read what it computes: run after it */
  int *mark, stamp;      /* mark[v] == stamp: v is computed by the open combo or a step in later */
  bool oom;
} combiner;

/* Records why kernel k did not join the open combo of n kernels (ind_combo_note). */
static void combo_note(combiner *c, int k, int why, int n) {
  ind_combo_note *t = realloc(c->p->combo_notes, sizeof *t * (size_t)(c->p->n_combo_notes + 1));
  if (!t) return; /* a log line, not a result */
  c->p->combo_notes = t;
  t[c->p->n_combo_notes++] = (ind_combo_note){k, why, n};
}

static void combo_close(combiner *c) {
  const ind_program *p = c->p;
  if (c->n_cur == 1) c->out[c->n_out++] = (step){-1, c->cur[0], -1, false, 0, NULL, 0, 0, NULL};
  if (c->n_cur > 1) {
    int *parts = malloc(sizeof(int) * (size_t)c->n_cur);
    if (!parts) c->oom = true;
    else memcpy(parts, c->cur, sizeof(int) * (size_t)c->n_cur);
    c->out[c->n_out++] = (step){-1, c->cur[0], -1, false, 0, NULL, 0, parts ? c->n_cur : 0, parts};
  }
  for (int i = 0; i < c->n_later; i++) c->out[c->n_out++] = p->steps[c->later[i]];
  c->n_cur = c->n_later = 0;
  c->stamp++;
}

/* The value among k's inputs that the open combo computes, or -1. */
static int combo_reads(const combiner *c, const kernel *k) {
  for (int i = 0; i < k->n_in; i++)
    if (c->mark[k->in[i]] == c->stamp) return k->in[i];
  return -1;
}

static bool combine_kernels(ind_program *p) {
  if (!p->rend->combo_kernels || !combo_enabled() || p->n_kernels < 2) return true;
  const ir_graph *g = p->g;
  int ns = p->n_steps;
  combiner c = {.p = p, .stamp = 1};
  c.out = malloc(sizeof(step) * (size_t)(ns + 1));
  c.cur = malloc(sizeof(int) * (size_t)(ns + 1)), c.later = malloc(sizeof(int) * (size_t)(ns + 1));
  c.mark = calloc((size_t)g->n_values + 1, sizeof(int));
  if (!c.out || !c.cur || !c.later || !c.mark) {
    free(c.out), free(c.cur), free(c.later), free(c.mark);
    return false;
  }
  for (int s = 0; s < ns; s++) {
    const step *st = &p->steps[s];
    if (st->kernel >= 0) {
      const kernel *k = &p->kernels[st->kernel];
      bool part = !k->row && !k->has_col;
      if (c.n_cur > 1 && !part) combo_note(&c, st->kernel, k->row ? -2 : -3, c.n_cur);
      if (c.n_cur && part) {
        int v = combo_reads(&c, k);
        if (v < 0 && c.n_cur < COMBO_MAX_PARTS) {
          c.cur[c.n_cur++] = st->kernel;
          for (int o = 0; o < k->n_out; o++) c.mark[k->out[o]] = c.stamp;
          continue;
        }
        combo_note(&c, st->kernel, v, c.n_cur);
      }
      combo_close(&c);
      if (!part) {
        c.out[c.n_out++] = *st;
        continue;
      }
      c.cur[c.n_cur++] = st->kernel;
      for (int o = 0; o < k->n_out; o++) c.mark[k->out[o]] = c.stamp;
      continue;
    }
    if (c.n_cur && combo_movable(g, st)) {
      const ir_node *n = &g->nodes[st->node];
      bool reads = false;
      for (int a = 0; a < n->n_in; a++) reads = reads || c.mark[ir_operands(g, n)[a]] == c.stamp;
      if (reads) {
        c.later[c.n_later++] = s;
        c.mark[n->out] = c.stamp;
      } else {
        c.out[c.n_out++] = *st;
      }
      continue;
    }
    combo_close(&c);
    c.out[c.n_out++] = *st;
  }
  combo_close(&c);
  free(p->steps);
  p->steps = c.out, p->n_steps = c.n_out;
  free(c.cur), free(c.later), free(c.mark);
  for (int s = 0; s < p->n_steps; s++)
    if (p->steps[s].n_parts) p->stats.combo_kernels++, p->stats.combo_parts += p->steps[s].n_parts;
  return !c.oom;
}

/* Memory planning over the schedule. Each value gets the last step that reads it; a view shares
 * its base's storage (its alias root), so a root's storage lives until the last read of any of
 * its views. Then:
 *  - each step releases the tensors whose last reader it is (graph outputs are kept);
 *  - the intermediates that kernels store (not graph outputs, nor viewed by one) get fixed
 *    byte offsets in one arena per run, placed greedily by size so that two whose lifetimes
 *    overlap never share bytes (the order TFLite's planner uses);
 *  - for in-place updates, each input's last reader and each output's producing kernel. */
static bool plan_memory(ind_program *p) {
  const ir_graph *g = p->g;
  int nv = g->n_values, ns = p->n_steps;
  int *last = malloc(sizeof(int) * (size_t)(nv + 1)), *root = malloc(sizeof(int) * (size_t)(nv + 1));
  int *prod = malloc(sizeof(int) * (size_t)(nv + 1)), *end = malloc(sizeof(int) * (size_t)(nv + 1));
  int *count = calloc((size_t)ns + 1, sizeof(int));
  bool *pinned = calloc((size_t)nv + 1, 1), *stored = calloc((size_t)nv + 1, 1);
  p->arena_off = malloc(sizeof(int64_t) * (size_t)(nv + 1));
  p->out_step = malloc(sizeof(int) * (size_t)(g->n_outputs + 1));
  p->in_last_read = malloc(sizeof(int) * (size_t)(g->n_inputs + 1));
  p->in_view_read = malloc(sizeof(int) * (size_t)(g->n_inputs + 1));
  p->in_returned = calloc((size_t)g->n_inputs + 1, 1);
  bool ok = last && root && prod && end && count && pinned && stored && p->arena_off && p->out_step && p->in_last_read &&
            p->in_view_read && p->in_returned;
  for (int v = 0; ok && v < nv; v++) last[v] = prod[v] = -1, root[v] = v, p->arena_off[v] = -1;
  for (int s = 0; ok && s < ns; s++) {
    const step *st = &p->steps[s];
    if (st->node >= 0) {
      const ir_node *n = &g->nodes[st->node];
      const ir_node *r = st->tmat >= 0 ? &g->nodes[st->tmat] : n; /* a lowered clone reads the product's operands */
      const ind_epilogue *e = st->epi ? &p->epis[st->epi - 1] : NULL; /* an epilogue reads what its nodes read */
      for (int a = 0; a < (e ? e->n_reads : r->n_in); a++) last[e ? e->reads[a] : ir_operands(g, r)[a]] = s;
      prod[n->out] = s;
      for (int i = 0; e && e->keep && i < e->n_nodes; i++) { /* a kept product and its reshape: made here too */
        const ir_node *x = &g->nodes[e->nodes[i]];
        if (x->op == EM_PRIM_MATMUL) prod[x->out] = s;
        if (x->op == EM_PRIM_RESHAPE && ir_operands(g, x)[0] == g->nodes[e->mm].out)
          prod[x->out] = s, root[x->out] = root[g->nodes[e->mm].out];
      }
      if (((prim_get(n->op)->flags & P_VIEW) || st->alias) && st->tmat < 0) root[n->out] = root[ir_operands(g, n)[0]];
    } else {
      int nk;
      const int *ks = step_kernels(st, &nk);
      for (int q = 0; q < nk; q++) {
        const kernel *k = &p->kernels[ks[q]];
        for (int i = 0; i < k->n_in; i++) last[k->in[i]] = s;
        for (int i = 0; i < k->n_out; i++) prod[k->out[i]] = s, stored[k->out[i]] = true;
      }
    }
  }
  for (int v = 0; ok && v < nv; v++) end[v] = prod[v];
  for (int v = 0; ok && v < nv; v++)
    if (last[v] > end[root[v]]) end[root[v]] = last[v];
  for (int o = 0; ok && o < g->n_outputs; o++) pinned[root[g->outputs[o]]] = true;
  /* releases: a header at its own last read (its storage lives on in its views) */
  for (int v = 0; ok && v < nv; v++) {
    int at = last[v] > prod[v] ? last[v] : prod[v];
    if (at < 0) continue;
    bool output = false;
    for (int o = 0; o < g->n_outputs && !output; o++) output = g->outputs[o] == v;
    if (!output) count[at]++;
  }
  for (int s = 0; ok && s < ns; s++)
    if (count[s]) ok = (p->steps[s].release = malloc(sizeof(int) * (size_t)count[s])) != NULL;
  for (int v = 0; ok && v < nv; v++) {
    int at = last[v] > prod[v] ? last[v] : prod[v];
    bool output = false;
    for (int o = 0; o < g->n_outputs && !output; o++) output = g->outputs[o] == v;
    if (at >= 0 && !output) p->steps[at].release[p->steps[at].n_release++] = v;
  }
  /* the arena: greedy by size, first offset clear of every placed value live at the same time */
  int n_cand = 0;
  int *cand = ok ? malloc(sizeof(int) * (size_t)(nv + 1)) : NULL;
  ok = ok && cand;
  for (int v = 0; ok && v < nv; v++)
    if (stored[v] && !pinned[v] && numel_of(&g->values[v].type) > 0) cand[n_cand++] = v;
  for (int i = 0; ok && i < n_cand; i++) /* by size, largest first */
    for (int j = i + 1; j < n_cand; j++) {
      const ir_type *ti = &g->values[cand[i]].type, *tj = &g->values[cand[j]].type;
      if (numel_of(tj) * (int64_t)em_dtype_size(tj->dtype) > numel_of(ti) * (int64_t)em_dtype_size(ti->dtype)) {
        int t = cand[i];
        cand[i] = cand[j], cand[j] = t;
      }
    }
  p->arena_bytes = 0;
  for (int i = 0; ok && i < n_cand; i++) {
    int v = cand[i];
    const ir_type *t = &g->values[v].type;
    int64_t size = (numel_of(t) * (int64_t)em_dtype_size(t->dtype) + 63) / 64 * 64, off = 0;
    for (bool moved = true; moved;) {
      moved = false;
      for (int j = 0; j < i; j++) {
        int u = cand[j];
        const ir_type *tu = &g->values[u].type;
        int64_t us = (numel_of(tu) * (int64_t)em_dtype_size(tu->dtype) + 63) / 64 * 64;
        bool overlap_time = !(end[u] < prod[v] || end[v] < prod[u]);
        if (overlap_time && off < p->arena_off[u] + us && p->arena_off[u] < off + size) off = p->arena_off[u] + us, moved = true;
      }
    }
    p->arena_off[v] = off;
    if (off + size > p->arena_bytes) p->arena_bytes = off + size;
  }
  /* the peak of stored bytes live at once, arena and outputs together */
  p->planned_peak = 0;
  for (int s = 0; ok && s < ns; s++) {
    int64_t live = 0;
    for (int v = 0; v < nv; v++)
      if (stored[v] && prod[v] <= s && (pinned[v] || end[v] >= s))
        live += numel_of(&g->values[v].type) * (int64_t)em_dtype_size(g->values[v].type.dtype);
    if (live > p->planned_peak) p->planned_peak = live;
  }
  /* in-place updates */
  for (int o = 0; ok && o < g->n_outputs; o++) {
    int v = g->outputs[o], s = prod[v];
    p->out_step[o] = s >= 0 && p->steps[s].kernel >= 0 && !p->kernels[p->steps[s].kernel].row ? s : -1;
  }
  for (int i = 0; ok && i < g->n_inputs; i++) {
    int x = g->inputs[i];
    p->in_last_read[i] = end[x];
    p->in_view_read[i] = -1;
    p->in_returned[i] = pinned[x];
    for (int v = 0; v < nv; v++)
      if (v != x && root[v] == x && last[v] > p->in_view_read[i]) p->in_view_read[i] = last[v];
  }
  free(last), free(root), free(prod), free(end), free(count), free(pinned), free(stored), free(cand);
  return ok;
}

#ifndef NDEBUG
/* The memory plan checked against value lifetimes, recomputed here from the steps alone (debug
 * builds: every test run). At each step, every arena value that has been produced and is still
 * read later (itself or through a view of it) must own its bytes: no other such value overlaps
 * it, and each lies inside the arena. A release must come after the value's last read. A plan
 * that breaks either gives wrong numbers silently, so it aborts with the offending values. */
static void check_plan(const ind_program *p) {
  const ir_graph *g = p->g;
  int nv = g->n_values, ns = p->n_steps;
  int *born = malloc(sizeof(int) * (size_t)(nv + 1)), *dies = malloc(sizeof(int) * (size_t)(nv + 1));
  int *base = malloc(sizeof(int) * (size_t)(nv + 1)), *freed = malloc(sizeof(int) * (size_t)(nv + 1));
  if (!born || !dies || !base || !freed) goto out; /* a check, not a result: skip it under OOM */
  for (int v = 0; v < nv; v++) born[v] = dies[v] = freed[v] = -1, base[v] = v;
  for (int s = 0; s < ns; s++) {
    const step *st = &p->steps[s];
    int n_rd = 0, n_wr = 0, nk = 0;
    const int *rd = NULL, *wr = NULL, *ks = step_kernels(st, &nk);
    if (st->n_parts) { /* a combo: every part's reads, then every part's writes, at this step */
      for (int q = 0; q < nk; q++) {
        const kernel *k = &p->kernels[ks[q]];
        for (int i = 0; i < k->n_in; i++) {
          EM_ASSERT(freed[k->in[i]] < 0 || freed[k->in[i]] >= s);
          if (dies[base[k->in[i]]] < s) dies[base[k->in[i]]] = s;
        }
      }
      for (int q = 0; q < nk; q++) {
        const kernel *k = &p->kernels[ks[q]];
        for (int i = 0; i < k->n_out; i++) born[k->out[i]] = s, dies[k->out[i]] = dies[k->out[i]] > s ? dies[k->out[i]] : s;
      }
      for (int i = 0; i < st->n_release; i++) freed[st->release[i]] = s;
      continue;
    }
    if (st->node >= 0) {
      const ir_node *n = &g->nodes[st->tmat >= 0 ? st->tmat : st->node];
      rd = ir_operands(g, n), n_rd = n->n_in, wr = &g->nodes[st->node].out, n_wr = 1;
      if (st->epi) rd = p->epis[st->epi - 1].reads, n_rd = p->epis[st->epi - 1].n_reads;
      const ir_node *m = &g->nodes[st->node];
      if (((prim_get(m->op)->flags & P_VIEW) || st->alias) && st->tmat < 0) base[m->out] = base[ir_operands(g, m)[0]];
    } else {
      const kernel *k = &p->kernels[st->kernel];
      rd = k->in, n_rd = k->n_in, wr = k->out, n_wr = k->n_out;
    }
    for (int i = 0; i < n_rd; i++) {
      EM_ASSERT(freed[rd[i]] < 0 || freed[rd[i]] >= s); /* read after its release */
      if (dies[base[rd[i]]] < s) dies[base[rd[i]]] = s;
    }
    for (int i = 0; i < n_wr; i++) born[wr[i]] = s, dies[wr[i]] = dies[wr[i]] > s ? dies[wr[i]] : s;
    for (int i = 0; i < st->n_release; i++) freed[st->release[i]] = s;
  }
  for (int v = 0; v < nv; v++) {
    if (p->arena_off[v] < 0) continue;
    const ir_type *t = &g->values[v].type;
    int64_t vb = numel_of(t) * (int64_t)em_dtype_size(t->dtype);
    EM_ASSERT(born[v] >= 0 && p->arena_off[v] + vb <= p->arena_bytes);
    for (int u = 0; u < v; u++) {
      if (p->arena_off[u] < 0) continue;
      const ir_type *tu = &g->values[u].type;
      int64_t ub = numel_of(tu) * (int64_t)em_dtype_size(tu->dtype);
      bool together = !(dies[u] < born[v] || dies[v] < born[u]);
      bool share = p->arena_off[u] < p->arena_off[v] + vb && p->arena_off[v] < p->arena_off[u] + ub;
      if (together && share) {
        fprintf(stderr, "ember: memory plan: %%%d (steps %d-%d, bytes %lld+%lld) overlaps %%%d (steps %d-%d, bytes %lld+%lld)\n",
                v, born[v], dies[v], (long long)p->arena_off[v], (long long)vb, u, born[u], dies[u],
                (long long)p->arena_off[u], (long long)ub);
        EM_ASSERT(!"two arena values alive at once share bytes");
      }
    }
  }
out:
  free(born), free(dies), free(base), free(freed);
}
#endif

/* Whether output o may be stored straight into input i (an in-place update the caller would
 * otherwise copy back): a pointwise kernel stores it, after every other read of i and of its
 * views, reading i (if at all) at the element it writes; i is not returned and has o's layout. */
bool ind_donatable(const ind_program *p, int o, int i) {
  const ir_graph *g = p->g;
  int s = p->out_step[o];
  if (s < 0 || p->in_last_read[i] > s || p->in_view_read[i] >= s || p->in_returned[i]) return false;
  const ir_type *t = &g->values[g->outputs[o]].type;
  const prim_meta *m = &p->in_meta[i];
  if (m->dtype != t->dtype || m->ndim != t->ndim || memcmp(m->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim) ||
      !ir_is_contiguous(m->ndim, m->sizes, m->strides))
    return false;
  for (int q = 0; q < g->n_outputs; q++) /* one value, one buffer */
    if (q != o && g->outputs[q] == g->outputs[o]) return false;
  /* in a combo, the other parts run at the same time: none of them may read the input */
  const step *st = &p->steps[s];
  for (int q = 0; q < st->n_parts; q++) {
    const kernel *k = &p->kernels[st->parts[q]];
    bool writes = false;
    for (int w = 0; w < k->n_out && !writes; w++) writes = k->out[w] == g->outputs[o];
    for (int r = 0; r < k->n_in && !writes; r++)
      if (k->in[r] == g->inputs[i]) return false;
  }
  return true;
}

/* The dtype that keeps a node op by op: its result's or an operand's, the first that is not f32,
 * f64 or bool (f16 values, an integer sum), else its result's (a float to integer conversion). */
static em_dtype blocking_dtype(const ir_graph *g, const ir_node *n) {
  em_dtype d = g->values[n->out].type.dtype;
  for (int k = -1; k < n->n_in; k++) {
    em_dtype x = k < 0 ? d : g->values[ir_operands(g, n)[k]].type.dtype;
    if (x != EM_F32 && x != EM_F64 && x != EM_BOOL) return x;
  }
  return d;
}

/* t (len bytes used, cap allocated) with n bytes of s appended and a NUL after; NULL (t freed)
 * when out of memory. */
static char *text_append(char *t, size_t *len, size_t *cap, const char *s, int n) {
  if (n < 0) n = 0;
  if (*len + (size_t)n + 1 > *cap) {
    while (*len + (size_t)n + 1 > *cap) *cap *= 2;
    char *nt = realloc(t, *cap);
    if (!nt) return free(t), NULL;
    t = nt;
  }
  memcpy(t + *len, s, (size_t)n), *len += (size_t)n;
  t[*len] = 0;
  return t;
}

/* Kernel k's line of the schedule (step s; part q of a combo, or -1), its bytes set. */
static int kernel_line(const ind_program *p, kernel *k, int s, int q, char *line, size_t cap) {
  const ir_graph *g = p->g;
  int64_t bytes = 0;
  for (int i = 0; i < k->n_in; i++) bytes += numel_of(&g->values[k->in[i]].type) * (int64_t)em_dtype_size(g->values[k->in[i]].type.dtype);
  for (int i = 0; i < k->n_out; i++) bytes += numel_of(&g->values[k->out[i]].type) * (int64_t)em_dtype_size(g->values[k->out[i]].type.dtype);
  k->bytes = bytes;
  int n = q < 0 ? snprintf(line, cap, "  step %d: %s, %s kernel over [", s, k->name,
                           k->row ? "row" : k->has_col ? "pointwise + column reduction" : "pointwise")
                : snprintf(line, cap, "    part %d: %s, pointwise kernel over [", q, k->name);
  for (int d = 0; d < k->shape.ndim && n < 400; d++)
    n += snprintf(line + n, cap - (size_t)n, "%s%lld%s", d ? "," : "", (long long)k->shape.sizes[d],
                  k->row && d == k->split - 1 ? " |" : "");
  n += snprintf(line + n, cap - (size_t)n, "], %d nodes (", k->n_nodes);
  for (int i = 0; i < k->n_nodes && n < 440; i++)
    n += snprintf(line + n, cap - (size_t)n, "%s%s", i ? " " : "", prim_get(g->nodes[k->nodes[i]].op)->name);
  if (n >= 440) n = 440 + snprintf(line + 440, cap - 440, " ...");
  n += snprintf(line + n, cap - (size_t)n, "), %d in, %d out, %lld bytes\n", k->n_in, k->n_out, (long long)bytes);
  if (n > (int)cap - 1) n = (int)cap - 1;
  return n;
}

/* EMBER_LOGS=schedule: each kernel's nodes, iteration space and bytes moved; then, once for the
 * graph, the nodes that run op by op because the CPU renderer has no code for their dtypes. */
void ind_describe_schedule(ind_program *p) {
  const ir_graph *g = p->g;
  size_t cap = 256, len = 0;
  char *t = malloc(cap);
  char why[400];
  int nw = 0;
  why[0] = 0;
  p->stats.dtype_eager_nodes = 0;
  for (int s = 0; s < p->n_steps; s++) {
    const step *st = &p->steps[s];
    if (!p->rend->dtype_eager || st->node < 0 || st->epi || st->tmat >= 0) continue;
    const ir_node *x = &g->nodes[st->node];
    if (!p->rend->dtype_eager(g, x)) continue;
    p->stats.dtype_eager_nodes++;
    if (nw < 320)
      nw += snprintf(why + nw, sizeof why - (size_t)nw, "%s%s %s", nw ? ", " : "", em_dtype_name(blocking_dtype(g, x)),
                     prim_get(x->op)->name);
    else if (nw < (int)sizeof why - 8)
      nw += snprintf(why + nw, sizeof why - (size_t)nw, ", ...");
  }
  for (int s = 0; t && s < p->n_steps; s++) {
    char line[512];
    int n = 0;
    if (p->steps[s].node >= 0) {
      const ir_node *x = &g->nodes[p->steps[s].node];
      const step *st = &p->steps[s];
      if (st->epi) {
        const ind_epilogue *e = &p->epis[st->epi - 1];
        const int *o = ir_operands(g, &g->nodes[e->mm]);
        bool cuda = p->device == EM_CUDA;
        const char *name = epilogue_name(cuda, e->act), *act = strchr(name, '+');
        char plus[32] = "";
        if (e->bias >= 0) snprintf(plus, sizeof plus, " + %%%d", e->bias);
        n = snprintf(line, sizeof line, "  step %d: %%%d = matmul(%%%d, %%%d)%s%s%s (%s %s, %d nodes%s)\n", s, x->out,
                     o[0], o[1], plus, act ? ", " : "", act ? act + 1 : "",
                     cuda ? "cublasLt epilogue" : "GEMM tile epilogue",
                     e->bias >= 0 || !act ? name : act + 1, e->n_nodes, e->keep ? "; the product stored too" : "");
      } else if (st->tmat >= 0)
        n = snprintf(line, sizeof line, "  step %d: %%%d = matmul(%%%d^T, %%%d^T) (GEMM library; the clone of a transposed product)\n", s,
                     x->out, ir_operands(g, &g->nodes[st->tmat])[1], ir_operands(g, &g->nodes[st->tmat])[0]);
      else if (st->alias)
        n = snprintf(line, sizeof line, "  step %d: %%%d = clone(%%%d): the same tensor (nothing else reads it)\n", s, x->out,
                     ir_operands(g, x)[0]);
      else {
        bool timed = x->op == EM_PRIM_MATMUL && p->device == EM_CUDA && p->opts.autotune;
        unsigned fl = prim_get(x->op)->flags;
        bool dt = p->rend->dtype_eager && p->rend->dtype_eager(g, x);
        n = snprintf(line, sizeof line, "  step %d: %%%d = %s (%s%s%s)\n", s, x->out, prim_get(x->op)->name,
                     timed ? "library: cublasLt, algorithms timed"
                     : fl & P_EXTERN ? "library" : fl & P_VIEW ? "view" : "eager kernel",
                     dt ? ": no generated code for " : "", dt ? em_dtype_name(blocking_dtype(g, x)) : "");
      }
    } else {
      int nk;
      const int *ks = step_kernels(&p->steps[s], &nk);
      if (p->steps[s].n_parts) {
        int64_t elems = 0;
        for (int q = 0; q < nk; q++) elems += numel_of(&p->kernels[ks[q]].shape);
        n = snprintf(line, sizeof line, "  step %d: combo kernel of %d pointwise kernels, one parallel region over %lld "
                     "elements:\n", s, nk, (long long)elems);
        if (!(t = text_append(t, &len, &cap, line, n))) break;
      }
      for (int q = 0; q < nk && t; q++) {
        kernel *k = &p->kernels[ks[q]];
        n = kernel_line(p, k, s, nk > 1 ? q : -1, line, sizeof line);
        t = text_append(t, &len, &cap, line, n);
        if (t && k->loop_ir) t = text_append(t, &len, &cap, k->loop_ir, (int)strlen(k->loop_ir));
      }
      if (!t) break;
      continue;
    }
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    t = text_append(t, &len, &cap, line, n);
  }
  for (int i = 0; t && i < p->n_combo_notes; i++) { /* why kernels were not combined */
    const ind_combo_note *c = &p->combo_notes[i];
    char line[256];
    int n = c->why >= 0 ? snprintf(line, sizeof line, "  combo: %s not combined with the %d kernels before it: it reads "
                                   "%%%d, which they compute\n", p->kernels[c->kernel].name, c->n, c->why)
            : c->why == -1 ? snprintf(line, sizeof line, "  combo: %s starts a new combo kernel: %d parts is the most\n",
                                      p->kernels[c->kernel].name, c->n)
                           : snprintf(line, sizeof line, "  combo: %s ends a run of %d combinable kernels: a %s kernel\n",
                                      p->kernels[c->kernel].name, c->n, c->why == -2 ? "row" : "column-reduction");
    t = text_append(t, &len, &cap, line, n < (int)sizeof line ? n : (int)sizeof line - 1);
  }
  if (t && p->stats.dtype_eager_nodes) {
    char line[512];
    int n = snprintf(line, sizeof line, "  %d nodes run op by op for their dtypes (%s)\n", p->stats.dtype_eager_nodes,
                     why);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    char *nt = realloc(t, len + (size_t)n + 1);
    if (!nt) free(t);
    else memcpy(nt + len, line, (size_t)n + 1);
    t = nt;
  }
  p->schedule_text = t;
}


bool ind_schedule_program(ind_program *p, const prim_meta *meta) {
  builder b = {p, meta};
  if (!schedule(&b) || !combine_kernels(p) || !plan_memory(p)) return false;
  p->stats.gemm_epilogues = p->n_epis;
  if (p->device == EM_CUDA && !(p->gemm = calloc((size_t)p->n_steps + 1, sizeof *p->gemm))) return false;
#ifndef NDEBUG
  check_plan(p);
#endif
  return true;
}
