/* ir/verify.c: the graph verifier (see graph.h).
 *
 * Each node is checked against the prim's own meta function, so the verifier and eager
 * execution cannot disagree about what a well-typed node is. View prims are checked with
 * contiguous operand strides: in the IR a view is a value (RESHAPE of a value that cannot be
 * viewed means a copy), so layout never makes a node ill-typed. */
#include "graph.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>


/* "%3 = add(%1, %2)" for messages. */
static const char *describe(const ir_graph *g, const ir_node *n, char *buf, size_t cap) {
  int k = snprintf(buf, cap, "%%%d = %s(", n->out, prim_get(n->op)->name);
  for (int j = 0; j < n->n_in && k > 0 && (size_t)k < cap; j++)
    k += snprintf(buf + k, cap - (size_t)k, "%s%%%d", j ? ", " : "", ir_operands(g, n)[j]);
  if (k > 0 && (size_t)k < cap) snprintf(buf + k, cap - (size_t)k, ")");
  if (n->site.file && k > 0 && (size_t)k < cap) {
    size_t l = strlen(buf);
    snprintf(buf + l, cap - l, " at %s:%d", n->site.file, n->site.line);
  }
  return buf;
}

/* A CPU value holding one element, or a broadcast (expand) of one, or a CPU graph input (whose
 * layout only the run shows: a partitioned backward receives the forward's broadcast scalars):
 * it may join device operands, as in eager mode and PyTorch. The runtime copies it to the
 * device, and refuses, as eager does, a CPU tensor that is not one element broadcast. */
static bool cpu_scalar(const ir_graph *g, int v) {
  for (int depth = 0; depth < 8 && v >= 0; depth++) {
    const ir_type *t = &g->values[v].type;
    if (t->device != EM_CPU || !ir_type_concrete(t)) return false;
    if (ir_numel(t->ndim, t->sizes) == 1) return true;
    int d = g->values[v].def;
    if (d < 0) return true;
    if (g->nodes[d].op != EM_PRIM_EXPAND) return false;
    v = ir_operands(g, &g->nodes[d])[0];
  }
  return false;
}

bool ir_verify(const ir_graph *g, unsigned flags, char *err, size_t cap) {
  char d[256], t0[96], t1[96];
  if (g->oom) return ir_fail(err, cap, "the graph ran out of memory while it was built");
  /* defined_at[v]: index of the node defining v, -1 for inputs, INT32_MAX when not defined */
  int *defined = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
  int *uses = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
  if (!defined || !uses) {
    free(defined), free(uses);
    return ir_fail(err, cap, "out of memory");
  }
  bool ok = false;
  for (int v = 0; v < g->n_values; v++) defined[v] = INT32_MAX;
  for (int i = 0; i < g->n_inputs; i++) {
    int v = g->inputs[i];
    if (v < 0 || v >= g->n_values) {
      ir_fail(err, cap, "input %d names value %%%d, which does not exist", i, v);
      goto out;
    }
    if (defined[v] != INT32_MAX) {
      ir_fail(err, cap, "value %%%d is listed as an input twice", v);
      goto out;
    }
    defined[v] = -1;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if ((int)n->op < 0 || n->op >= EM_PRIM_COUNT) {
      ir_fail(err, cap, "node %d has an invalid prim number %d", i, (int)n->op);
      goto out;
    }
    const prim_info *pi = prim_get(n->op);
    if (n->out < 0 || n->out >= g->n_values || g->values[n->out].def != i) {
      ir_fail(err, cap, "node %d (%s) defines value %%%d, which does not record it as its definition", i, pi->name, n->out);
      goto out;
    }
    if (defined[n->out] != INT32_MAX) {
      ir_fail(err, cap, "%s: value %%%d is defined twice", describe(g, n, d, sizeof d), n->out);
      goto out;
    }
    if ((pi->arity >= 0 && n->n_in != pi->arity) || (pi->arity < 0 && n->n_in < 1)) {
      ir_fail(err, cap, "%s: %s takes %d operand%s, got %d", describe(g, n, d, sizeof d), pi->name, pi->arity,
           pi->arity == 1 ? "" : "s", n->n_in);
      goto out;
    }
    prim_meta small[4], *metas = small;
    if (n->n_in > 4 && !(metas = malloc(sizeof(prim_meta) * (size_t)n->n_in))) {
      ir_fail(err, cap, "out of memory");
      goto out;
    }
    bool concrete = true, node_ok = true;
    const ir_type *ty = &g->values[n->out].type;
    for (int j = 0; j < n->n_in && node_ok; j++) {
      int v = ir_operands(g, n)[j];
      if (v < 0 || v >= g->n_values) {
        node_ok = ir_fail(err, cap, "%s: operand %d is %%%d, which does not exist (dangling)", describe(g, n, d, sizeof d), j, v);
      } else if (defined[v] == INT32_MAX) {
        node_ok = ir_fail(err, cap, "%s: operand %d (%%%d) is used before it is defined", describe(g, n, d, sizeof d), j, v);
      } else {
        const ir_type *ot = &g->values[v].type;
        if (ot->device != ty->device && !cpu_scalar(g, v))
          node_ok = ir_fail(err, cap, "%s: operand %%%d is on another device than the result", describe(g, n, d, sizeof d), v);
        concrete = concrete && ir_type_concrete(ot);
        metas[j] = ir_meta_of_type(ot);
      }
    }
    if (node_ok && n->n_in && !prim_attrs_canonical(n->op, &n->attrs, g->values[ir_operands(g, n)[0]].type.ndim))
      node_ok = ir_fail(err, cap, "%s: axis attributes are not canonical (negative or unsorted)", describe(g, n, d, sizeof d));
    if (node_ok && !ir_dtype_valid(ty->dtype)) node_ok = ir_fail(err, cap, "%s: invalid result dtype", describe(g, n, d, sizeof d));
    if (node_ok && concrete && ir_type_concrete(ty)) {
      prim_meta m;
      char why[256];
      if (!prim_meta_fn(n->op, &n->attrs, metas, n->n_in, &m, why, sizeof why)) {
        node_ok = ir_fail(err, cap, "%s: %s", describe(g, n, d, sizeof d), why);
      } else {
        ir_type expect = ir_type_of_meta(&m, ty->device);
        if (!ir_type_equal(&expect, ty))
          node_ok = ir_fail(err, cap, "%s: the result is declared %s but %s gives %s", describe(g, n, d, sizeof d),
                         ir_fmt_ir_type(g, ty, t0, sizeof t0), pi->name, ir_fmt_ir_type(g, &expect, t1, sizeof t1));
      }
    }
    if (metas != small) free(metas);
    if (!node_ok) goto out;
    defined[n->out] = i;
  }
  for (int i = 0; i < g->n_outputs; i++) {
    int v = g->outputs[i];
    if (v < 0 || v >= g->n_values || defined[v] == INT32_MAX) {
      ir_fail(err, cap, "output %d names %%%d, which is not defined", i, v);
      goto out;
    }
  }
  if (flags & IR_VERIFY_NO_DEAD) {
    ir_count_uses(g, uses);
    for (int i = 0; i < g->n_nodes; i++)
      if (!uses[g->nodes[i].out] && !(prim_get(g->nodes[i].op)->flags & P_RANDOM)) { /* random: consumes counters */
        ir_fail(err, cap, "%s: the result is never used (dead code)", describe(g, &g->nodes[i], d, sizeof d));
        goto out;
      }
  }
  ok = true;
out:
  free(defined), free(uses);
  return ok;
}
