/* runtime/interp.c: runs a graph node by node with the eager kernels (the "eager" backend, and
 * the oracle the compiled backends are tested against).
 *
 * Each node goes through rt_dispatch, exactly as the eager op did when it was traced, so results
 * are bit-identical to eager execution and autograd records the same history. Intermediates
 * are released after their last use. RESHAPE has value semantics here: when a view is not
 * possible for the operand's layout it copies, as em_reshape does. */
#include "rt.h"
#include "../ir/graph.h"

#include <string.h>

bool rt_interpret(const ir_graph *g, em_tensor *const *inputs, int n_inputs, em_tensor **outputs,
                  const rt_interp_opts *opts, em_site site) {
  rt_interp_opts none = {0};
  if (!opts) opts = &none;
  char b0[128], b1[128];
  for (int i = 0; i < g->n_outputs; i++) outputs[i] = NULL;
  if (n_inputs != g->n_inputs)
    return rt_error(site, "em_interpret", "graph %s takes %d inputs, got %d", g->name, g->n_inputs, n_inputs), false;
  for (int i = 0; i < n_inputs; i++)
    if (!inputs[i]) return false;
  int nv = g->n_values;
  em_tensor **vals = rt_alloc(sizeof(em_tensor *) * (size_t)(nv ? nv : 1), 16);
  int *uses = rt_alloc(sizeof(int) * (size_t)(nv ? nv : 1), 16);
  int64_t syms[64];
  if (!vals || !uses || g->n_symbols > 64) {
    rt_free(vals), rt_free(uses);
    return rt_error(site, "em_interpret", "out of memory (or more than 64 size symbols)"), false;
  }
  for (int i = 0; i < 64; i++) syms[i] = -1;
  memset(vals, 0, sizeof(em_tensor *) * (size_t)nv);
  ir_count_uses(g, uses);
  bool ok = false;
  if (!opts->trace_through) rt_trace_suspend();

  /* Inputs: check types, binding symbols on first sight. */
  for (int i = 0; i < n_inputs; i++) {
    const ir_type *t = &g->values[g->inputs[i]].type;
    em_tensor *x = inputs[i];
    bool match = x->dtype == t->dtype && x->ndim == t->ndim && x->storage->device == t->device;
    for (int d = 0; match && d < t->ndim; d++) {
      ir_dim s = t->sizes[d];
      if (IR_DIM_IS_SYM(s) && g->sexprs[IR_SYM_INDEX(s)].kind == IR_SEXPR_SYM) {
        int k = g->sexprs[IR_SYM_INDEX(s)].sym;
        if (syms[k] < 0) syms[k] = x->sizes[d];
      }
      match = ir_dim_eval(g, s, syms) == x->sizes[d];
    }
    if (!match) {
      rt_error(site, "em_interpret", "input %d of graph %s is %s, the graph takes %s", i, g->name,
               rt_fmt(b0, sizeof b0, x), ir_fmt_ir_type(g, t, b1, sizeof b1));
      goto out;
    }
    vals[g->inputs[i]] = em_retain(x);
  }

  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    const int *o = ir_operands(g, n);
    em_tensor *small[4], **in = small;
    if (n->n_in > 4 && !(in = rt_alloc(sizeof(em_tensor *) * (size_t)n->n_in, 16))) {
      rt_error(n->site, n->opname, "out of memory");
      goto out;
    }
    for (int j = 0; j < n->n_in; j++) in[j] = vals[o[j]];
    prim_attrs at = n->attrs;
    em_tensor *r;
    if (opts->fresh_rng && (prim_get(n->op)->flags & P_RANDOM)) {
      rt_rng_slot *slot = n->rng_slot >= 0 && n->rng_slot < opts->n_slots ? &opts->slots[n->rng_slot] : NULL;
      if (slot && slot->filled) {
        at.seed = slot->seed, at.offset = slot->offset;
      } else {
        rt_rng_reserve(prim_philox_calls(n->op, at.dtype, ir_numel(at.shape.ndim, at.shape.sizes)), &at.seed, &at.offset);
        if (slot) *slot = (rt_rng_slot){at.seed, at.offset, true};
      }
    }
    /* a node without operands (full, iota, random) is made on the device the graph recorded,
     * not on whatever device is the default when the graph runs (issue 21: tril's mask of a CUDA
     * tensor came out on the CPU under a CPU default) */
    em_device prev = n->n_in ? EM_CPU : em_set_default_device(g->values[n->out].type.device);
    if (n->op == EM_PRIM_RESHAPE)
      r = rt_reshape(in[0], at.shape.ndim, at.shape.sizes, n->opname, n->site);
    else
      r = rt_dispatch(n->opname, n->op, in, n->n_in, &at, n->site);
    if (!n->n_in) em_set_default_device(prev);
    if (in != small) rt_free(in);
    if (!r) goto out;
    const ir_type *t = &g->values[n->out].type;
    bool match = r->dtype == t->dtype && r->ndim == t->ndim;
    for (int d = 0; match && d < t->ndim; d++) match = ir_dim_eval(g, t->sizes[d], syms) == r->sizes[d];
    if (!match) {
      rt_error(n->site, n->opname, "graph %s: %%%d = %s gave %s where the graph says %s", g->name, n->out,
               prim_get(n->op)->name, rt_fmt(b0, sizeof b0, r), ir_fmt_ir_type(g, t, b1, sizeof b1));
      em_release(r);
      goto out;
    }
    vals[n->out] = r;
    for (int j = 0; j < n->n_in; j++)
      if (--uses[o[j]] == 0) {
        em_release(vals[o[j]]);
        vals[o[j]] = NULL;
      }
  }
  for (int i = 0; i < g->n_outputs; i++) outputs[i] = em_retain(vals[g->outputs[i]]);
  ok = true;
out:
  if (!opts->trace_through) rt_trace_resume();
  for (int v = 0; v < nv; v++) em_release(vals[v]);
  rt_free(vals), rt_free(uses);
  return ok;
}
