/* aot_autograd/partition.c: splitting a joint graph into forward and backward graphs.
 *
 * Vocabulary (as in PyTorch's partitioners): a value is tangent-dependent when it depends on a
 * tangent (it can only be computed in the backward); the backward *requires* every
 * tangent-independent value that a needed backward node reads.
 *
 * Default partitioner: save every required value; the forward computes them all.
 *
 * Min-cut rematerialization (after PyTorch's min_cut_rematerialization_partition): choose the
 * set of values to save with the fewest bytes such that the backward can recompute everything
 * else it requires from them. As a flow network over the tangent-independent values: each
 * value v is an edge v_in -> v_out whose capacity is the bytes of saving v (0 for primals,
 * which are alive anyway); each use u -> v is an edge u_out -> v_in of infinite capacity;
 * the source feeds the primals and every value that must not be recomputed (extern kernels:
 * matmul and convolution; reductions; indexing), so those end up computed in the forward; every
 * required value feeds the sink. A minimum cut is a cheapest saved set; the backward graph
 * recomputes the sink side (cheap pointwise, view and creation chains, and random values,
 * which are replayed from the forward's Philox counters through rng slots instead of saved).
 * Max flow is Dinic's algorithm (O(V^2 E), a few milliseconds for graphs of thousands of
 * nodes); capacities are int64 bytes.
 *
 * Recompute (activation checkpointing): the same network with every value but the primals
 * unsaveable (infinite capacity) and nothing forced into the forward, so the cut is the primals:
 * the backward recomputes everything else from them (random values from the forward's counters,
 * as above). Eager fusion uses it (frontend/eager_fusion.c): a composite's backward then reads
 * only values that carry autograd history, and double backward through it stays exact. */
#include "aot.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define INF_CAP ((int64_t)1 << 60)

/* ---- max flow (Dinic) ---- */

typedef struct flow_edge {
  int to;
  int64_t cap;
} flow_edge;

typedef struct flow_net {
  int n;
  flow_edge *e; /* edges in pairs: e[i ^ 1] is e[i]'s reverse */
  int n_e, cap_e;
  int *head, *next; /* adjacency lists over edge indices */
  int *level, *it, *queue;
} flow_net;

static bool net_init(flow_net *f, int n) {
  memset(f, 0, sizeof *f);
  f->n = n;
  f->head = malloc(sizeof(int) * (size_t)n);
  f->level = malloc(sizeof(int) * (size_t)n);
  f->it = malloc(sizeof(int) * (size_t)n);
  f->queue = malloc(sizeof(int) * (size_t)n);
  if (!f->head || !f->level || !f->it || !f->queue) return false;
  for (int i = 0; i < n; i++) f->head[i] = -1;
  return true;
}

static void net_free(flow_net *f) { free(f->e), free(f->next), free(f->head), free(f->level), free(f->it), free(f->queue); }

static bool net_edge(flow_net *f, int a, int b, int64_t cap) {
  if (f->n_e + 2 > f->cap_e) {
    int c = f->cap_e ? 2 * f->cap_e : 256;
    flow_edge *e = realloc(f->e, sizeof(flow_edge) * (size_t)c);
    if (!e) return false;
    f->e = e;
    int *nx = realloc(f->next, sizeof(int) * (size_t)c);
    if (!nx) return false;
    f->next = nx;
    f->cap_e = c;
  }
  f->e[f->n_e] = (flow_edge){b, cap};
  f->next[f->n_e] = f->head[a], f->head[a] = f->n_e++;
  f->e[f->n_e] = (flow_edge){a, 0};
  f->next[f->n_e] = f->head[b], f->head[b] = f->n_e++;
  return true;
}

static bool bfs(flow_net *f, int s, int t) {
  for (int i = 0; i < f->n; i++) f->level[i] = -1;
  int qh = 0, qt = 0;
  f->queue[qt++] = s;
  f->level[s] = 0;
  while (qh < qt) {
    int u = f->queue[qh++];
    for (int i = f->head[u]; i >= 0; i = f->next[i])
      if (f->e[i].cap > 0 && f->level[f->e[i].to] < 0) {
        f->level[f->e[i].to] = f->level[u] + 1;
        f->queue[qt++] = f->e[i].to;
      }
  }
  return f->level[t] >= 0;
}

/* One blocking-flow augmentation along level-increasing edges, iteratively (graphs can be deep). */
static int64_t augment(flow_net *f, int s, int t) {
  int *path = f->queue; /* reused: edge indices along the current path */
  int depth = 0, u = s;
  int64_t total = 0;
  for (;;) {
    if (u == t) {
      int64_t push = INF_CAP;
      for (int d = 0; d < depth; d++)
        if (f->e[path[d]].cap < push) push = f->e[path[d]].cap;
      for (int d = 0; d < depth; d++) f->e[path[d]].cap -= push, f->e[path[d] ^ 1].cap += push;
      total += push;
      depth = 0, u = s; /* restart from the source */
      continue;
    }
    int i = f->it[u];
    while (i >= 0 && !(f->e[i].cap > 0 && f->level[f->e[i].to] == f->level[u] + 1)) i = f->next[i];
    f->it[u] = i;
    if (i >= 0) {
      path[depth++] = i;
      u = f->e[i].to;
    } else { /* dead end: retreat */
      if (depth == 0) return total;
      f->level[u] = -1;
      u = f->e[path[--depth] ^ 1].to;
      f->it[u] = f->next[f->it[u]];
    }
  }
}

static int64_t max_flow(flow_net *f, int s, int t) {
  int64_t flow = 0;
  while (bfs(f, s, t)) {
    for (int i = 0; i < f->n; i++) f->it[i] = f->head[i];
    int64_t pushed = augment(f, s, t);
    if (!pushed) break;
    flow += pushed;
    if (flow >= INF_CAP) break;
  }
  return flow;
}

/* ---- the partition ---- */


static int64_t value_bytes(const ir_graph *g, int v) {
  const ir_type *t = &g->values[v].type;
  int d = g->values[v].def;
  if (d >= 0 && g->nodes[d].op == EM_PRIM_EXPAND) /* an expanded view keeps only its operand */
    return value_bytes(g, ir_operands(g, &g->nodes[d])[0]);
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->sizes[i] < 0 ? 1 : t->sizes[i];
  return n * (int64_t)ir_dtype(t->dtype)->size;
}

/* Values the backward must not recompute: they are computed in the forward. */
static bool banned(em_prim op) {
  unsigned f = prim_get(op)->flags;
  return (f & (P_EXTERN | P_REDUCTION | P_INDEXING | P_SCAN)) != 0;
}

/* Copies the nodes of j whose results are marked in take into dst, in order; map holds the
 * joint -> dst value ids of everything already in dst (inputs) and receives the new ones. */
static bool copy_nodes(const ir_graph *j, ir_graph *dst, const bool *take, int *map) {
  int small[64];
  for (int i = 0; i < j->n_nodes; i++) {
    const ir_node *n = &j->nodes[i];
    if (!take[n->out] || map[n->out] >= 0) continue;
    int *in = n->n_in <= 64 ? small : malloc(sizeof(int) * (size_t)n->n_in);
    if (!in) return false;
    for (int k = 0; k < n->n_in; k++) in[k] = map[ir_operands(j, n)[k]];
    int v = ir_add_node(dst, n->op, in, n->n_in, &n->attrs, &j->values[n->out].type, n->site, n->opname);
    if (in != small) free(in);
    if (v < 0) return false;
    if (prim_get(n->op)->flags & P_RANDOM) dst->nodes[dst->n_nodes - 1].rng_slot = i;
    map[n->out] = v;
  }
  return true;
}

/* Like copy_nodes for the backward graph, but each recomputed (tangent-independent) node is
 * emitted just before its first consumer instead of in joint order, where every recomputation
 * would come first and stay alive through the whole backward. Iterative DFS over operands. */
static bool copy_nodes_by_need(const ir_graph *j, ir_graph *dst, const bool *take, const bool *td, int *map) {
  int n = j->n_nodes;
  int *stack = malloc(sizeof(int) * (size_t)(2 * n + 2));
  if (!stack) return false;
  bool ok = true;
  for (int i = 0; ok && i < n; i++) {
    const ir_node *root = &j->nodes[i];
    if (!take[root->out] || map[root->out] >= 0 || !td[root->out]) continue;
    int sp = 0;
    stack[sp++] = i;
    while (ok && sp > 0) {
      const ir_node *x = &j->nodes[stack[sp - 1]];
      if (map[x->out] >= 0) {
        sp--;
        continue;
      }
      bool ready = true;
      for (int k = 0; k < x->n_in; k++) {
        int v = ir_operands(j, x)[k];
        if (map[v] < 0 && j->values[v].def >= 0) {
          if (sp >= 2 * n + 2) {
            ok = false;
            break;
          }
          stack[sp++] = j->values[v].def;
          ready = false;
        }
      }
      if (!ready || !ok) continue;
      int small[64], *in = x->n_in <= 64 ? small : malloc(sizeof(int) * (size_t)x->n_in);
      if (!in) {
        ok = false;
        break;
      }
      for (int k = 0; k < x->n_in; k++) in[k] = map[ir_operands(j, x)[k]];
      int v = ir_add_node(dst, x->op, in, x->n_in, &x->attrs, &j->values[x->out].type, x->site, x->opname);
      if (in != small) free(in);
      if (v < 0) {
        ok = false;
        break;
      }
      if (prim_get(x->op)->flags & P_RANDOM) dst->nodes[dst->n_nodes - 1].rng_slot = (int)(x - j->nodes);
      map[x->out] = v;
      sp--;
    }
  }
  free(stack);
  return ok && copy_nodes(j, dst, take, map); /* whatever no tangent-dependent node reached */
}

/* Marks in mark every value the values already marked depend on, not crossing stop. */
static void close_upward(const ir_graph *j, bool *mark, const bool *stop) {
  for (int i = j->n_nodes - 1; i >= 0; i--) {
    const ir_node *n = &j->nodes[i];
    if (!mark[n->out] || (stop && stop[n->out])) continue;
    for (int k = 0; k < n->n_in; k++) mark[ir_operands(j, n)[k]] = true;
  }
}

void aot_split_free(aot_split *s) {
  ir_graph_free(s->fwd), ir_graph_free(s->bwd);
  free(s->saved);
  memset(s, 0, sizeof *s);
}

bool aot_partition(const ir_graph *j, const aot_joint_info *info, aot_partitioner p, aot_split *out, char *err,
                   size_t cap) {
  memset(out, 0, sizeof *out);
  int nv = j->n_values, np = info->n_primals;
  size_t bytes = sizeof(bool) * (size_t)(nv ? nv : 1);
  bool *td = calloc(1, bytes), *req = calloc(1, bytes), *need_b = calloc(1, bytes), *save = calloc(1, bytes),
       *fwd_take = calloc(1, bytes), *bwd_take = calloc(1, bytes), *is_primal = calloc(1, bytes);
  int *map = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
  flow_net f = {0};
  bool ok = false;
  if (!td || !req || !need_b || !save || !fwd_take || !bwd_take || !is_primal || !map) {
    ir_fail(err, cap, "out of memory partitioning");
    goto done;
  }
  for (int i = 0; i < j->n_inputs; i++) {
    if (i >= np) td[j->inputs[i]] = true;
    else is_primal[j->inputs[i]] = true;
  }
  for (int i = 0; i < j->n_nodes; i++) {
    const ir_node *n = &j->nodes[i];
    for (int k = 0; k < n->n_in; k++) td[n->out] |= td[ir_operands(j, n)[k]];
  }
  /* what the backward needs, and which tangent-independent values it reads */
  for (int o = info->n_fwd_outputs; o < j->n_outputs; o++) need_b[j->outputs[o]] = true;
  close_upward(j, need_b, NULL);
  for (int i = 0; i < j->n_nodes; i++) {
    const ir_node *n = &j->nodes[i];
    if (!need_b[n->out] || !td[n->out]) continue;
    for (int k = 0; k < n->n_in; k++)
      if (!td[ir_operands(j, n)[k]]) req[ir_operands(j, n)[k]] = true;
  }
  for (int o = info->n_fwd_outputs; o < j->n_outputs; o++)
    if (!td[j->outputs[o]]) req[j->outputs[o]] = true;

  if (p == AOT_PARTITION_DEFAULT) {
    /* every required value, except those made from constants alone (fills, iotas, random
     * draws, and views and pointwise ops of them): the backward makes those itself */
    bool *cd = calloc(1, bytes);
    if (!cd) {
      ir_fail(err, cap, "out of memory partitioning");
      goto done;
    }
    for (int i = 0; i < j->n_nodes; i++) {
      const ir_node *n = &j->nodes[i];
      bool c = !banned(n->op);
      for (int k = 0; c && k < n->n_in; k++) c = cd[ir_operands(j, n)[k]];
      cd[n->out] = c;
    }
    for (int v = 0; v < nv; v++) save[v] = req[v] && !cd[v];
    free(cd);
  } else {
    int S = 2 * nv, T = 2 * nv + 1;
    if (!net_init(&f, 2 * nv + 2)) {
      ir_fail(err, cap, "out of memory partitioning");
      goto done;
    }
    /* Operands of comparisons are computed in the forward, never recomputed: a comparison is
     * discontinuous, so the backward must see the forward's exact bits. amin's gradient tests
     * x == amin(x); recomputing x in the backward with other code (the forward ran in the
     * interpreter because of a dropout, the backward as generated kernels with other math
     * functions) found no element equal and dropped the gradient (found by the fuzzer). The cut
     * then saves the operand, or the comparison's bool result when that is cheaper. */
    bool *compared = calloc(1, bytes);
    if (!compared) {
      ir_fail(err, cap, "out of memory partitioning");
      goto done;
    }
    for (int i = 0; i < j->n_nodes; i++) {
      const ir_node *n = &j->nodes[i];
      if ((prim_get(n->op)->flags & P_BOOL_OUT) && n->n_in == 2 && n->op != EM_PRIM_LOGICAL_AND && n->op != EM_PRIM_LOGICAL_OR)
        for (int k = 0; k < 2; k++) compared[ir_operands(j, n)[k]] = true;
    }
    bool e = true;
    for (int v = 0; v < nv && e; v++) {
      if (td[v]) continue;
      int d = j->values[v].def;
      if (d < 0) {
        e = net_edge(&f, S, 2 * v, INF_CAP) && net_edge(&f, 2 * v, 2 * v + 1, 0);
      } else {
        const ir_node *n = &j->nodes[d];
        bool recompute = p == AOT_PARTITION_RECOMPUTE;
        e = net_edge(&f, 2 * v, 2 * v + 1, recompute ? INF_CAP : value_bytes(j, v));
        if (e && !recompute && (banned(n->op) || compared[v])) e = net_edge(&f, S, 2 * v, INF_CAP);
        for (int k = 0; e && k < n->n_in; k++) e = net_edge(&f, 2 * ir_operands(j, n)[k] + 1, 2 * v, INF_CAP);
      }
      if (e && req[v]) e = net_edge(&f, 2 * v + 1, T, INF_CAP);
    }
    free(compared);
    if (!e) {
      ir_fail(err, cap, "out of memory partitioning");
      goto done;
    }
    int64_t flow = max_flow(&f, S, T);
    if (flow >= INF_CAP) {
      ir_fail(err, cap, "min-cut partition found no finite cut (internal error)");
      goto done;
    }
    bfs(&f, S, T); /* level >= 0: reachable from the source in the residual network */
    for (int v = 0; v < nv; v++)
      if (!td[v] && f.level[2 * v] >= 0 && f.level[2 * v + 1] < 0) save[v] = true;
  }

  /* Only what the backward reads is saved. The cut marks every tangent-independent input it can
   * reach (saving an input costs nothing) whether or not the backward reads it; an input the
   * function mutates (a batch norm's running statistics, updated under no-grad) then failed the
   * backward's check that its saved values are unmodified, under inductor only (issue 21: the
   * PyTorch reference suite). The backward's closure stops at saved values, so it never needs
   * one it does not reach. */
  for (int o = info->n_fwd_outputs; o < j->n_outputs; o++) bwd_take[j->outputs[o]] = true;
  close_upward(j, bwd_take, save);
  for (int v = 0; v < nv; v++) save[v] = save[v] && bwd_take[v];

  /* forward graph: primals in; forward outputs and saved values out */
  out->fwd = ir_graph_new(j->name);
  out->bwd = ir_graph_new(j->name);
  if (!out->fwd || !out->bwd) {
    ir_fail(err, cap, "out of memory partitioning");
    goto done;
  }
  for (int v = 0; v < nv; v++) map[v] = -1;
  for (int o = 0; o < info->n_fwd_outputs; o++) fwd_take[j->outputs[o]] = true;
  for (int v = 0; v < nv; v++) fwd_take[v] |= save[v];
  /* every random node runs in the forward, used or not: each consumes its block of the
   * generator, so dropping an unused one shifted the masks of the later ones away from eager's
   * (found by the fuzzer: two dropouts, the first one's result unused) */
  for (int i = 0; i < j->n_nodes; i++)
    if ((prim_get(j->nodes[i].op)->flags & P_RANDOM) && !td[j->nodes[i].out]) fwd_take[j->nodes[i].out] = true;
  close_upward(j, fwd_take, NULL);
  for (int i = 0; i < np; i++) map[j->inputs[i]] = ir_add_input(out->fwd, &j->values[j->inputs[i]].type);
  if (!copy_nodes(j, out->fwd, fwd_take, map)) {
    ir_fail(err, cap, "out of memory partitioning");
    goto done;
  }
  for (int o = 0; o < info->n_fwd_outputs; o++) ir_add_output(out->fwd, map[j->outputs[o]]);
  out->saved = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
  if (!out->saved) {
    ir_fail(err, cap, "out of memory partitioning");
    goto done;
  }
  for (int v = 0; v < nv; v++) {
    if (!save[v]) continue;
    if (map[v] < 0) {
      ir_fail(err, cap, "saved value %%%d is not computed by the forward graph (internal error)", v);
      goto done;
    }
    out->saved[out->n_saved++] = v;
    ir_add_output(out->fwd, map[v]);
    if (!is_primal[v]) out->saved_bytes += value_bytes(j, v);
  }

  /* backward graph: saved values and tangents in; gradients out */
  for (int v = 0; v < nv; v++) map[v] = -1;
  for (int k = 0; k < out->n_saved; k++) map[out->saved[k]] = ir_add_input(out->bwd, &j->values[out->saved[k]].type);
  for (int i = np; i < j->n_inputs; i++) map[j->inputs[i]] = ir_add_input(out->bwd, &j->values[j->inputs[i]].type);
  for (int o = info->n_fwd_outputs; o < j->n_outputs; o++) bwd_take[j->outputs[o]] = true;
  close_upward(j, bwd_take, save);
  for (int v = 0; v < nv; v++) {
    if (!bwd_take[v] || map[v] >= 0) continue;
    if (j->values[v].def < 0) {
      ir_fail(err, cap, "the backward reads primal %%%d, which was not saved (internal error)", v);
      goto done;
    }
    if (!td[v]) out->n_recomputed++;
  }
  if (!copy_nodes_by_need(j, out->bwd, bwd_take, td, map)) {
    ir_fail(err, cap, "out of memory partitioning");
    goto done;
  }
  for (int o = info->n_fwd_outputs; o < j->n_outputs; o++) ir_add_output(out->bwd, map[j->outputs[o]]);
  if (out->fwd->oom || out->bwd->oom) {
    ir_fail(err, cap, "out of memory partitioning");
    goto done;
  }
  if (!ir_verify(out->fwd, 0, err, cap) || !ir_verify(out->bwd, 0, err, cap)) goto done;
  ok = true;
done:
  if (!ok) aot_split_free(out);
  net_free(&f);
  free(td), free(req), free(need_b), free(save), free(fwd_take), free(bwd_take), free(is_primal), free(map);
  return ok;
}
