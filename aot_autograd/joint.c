/* aot_autograd/joint.c: the joint forward/backward graph, by tracing (see aot.h). */
#include "aot.h"

#include <stdlib.h>
#include <string.h>

void aot_joint_info_free(aot_joint_info *info) {
  free(info->tangent_of_output), free(info->grad_of_primal);
  memset(info, 0, sizeof *info);
}

static bool no_breaks(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) {
  return rt_error(site, op, "AOT autograd: %s inside a captured graph (internal error)", reason), false;
}

ir_graph *aot_joint_graph(const ir_graph *fwd, const bool *in_rg, aot_joint_info *info, em_site site) {
  memset(info, 0, sizeof *info);
  int np = fwd->n_inputs, no = fwd->n_outputs;
  info->n_primals = np;
  info->n_fwd_outputs = no;
  info->tangent_of_output = malloc(sizeof(int) * (size_t)(no ? no : 1));
  info->grad_of_primal = malloc(sizeof(int) * (size_t)(np ? np : 1));
  em_tensor **prim = calloc((size_t)(np ? np : 1), sizeof(em_tensor *));
  em_tensor **outs = calloc((size_t)(no ? no : 1), sizeof(em_tensor *));
  em_tensor **diff = calloc((size_t)(no ? no : 1), sizeof(em_tensor *));
  em_tensor **tang = calloc((size_t)(no ? no : 1), sizeof(em_tensor *));
  em_tensor **rg = calloc((size_t)(np ? np : 1), sizeof(em_tensor *));
  em_tensor **grads = calloc((size_t)(np ? np : 1), sizeof(em_tensor *));
  int *rg_index = calloc((size_t)(np ? np : 1), sizeof(int));
  ir_graph *joint = NULL;
  if (!info->tangent_of_output || !info->grad_of_primal || !prim || !outs || !diff || !tang || !rg || !grads || !rg_index) {
    rt_error(site, "em_compile", "out of memory building the joint graph");
    goto done;
  }
  rt_trace tr;
  if (!rt_trace_begin(&tr, fwd->name, no_breaks, NULL, site)) goto done;
  bool prev = em_set_grad_enabled(true);
  bool scoped = em_scope_begin_at(site), ok = scoped;
  int n_rg = 0, n_diff = 0;
  for (int i = 0; ok && i < np; i++) {
    info->grad_of_primal[i] = -1;
    ir_type ty = fwd->values[fwd->inputs[i]].type;
    prim[i] = rt_scope_add(rt_trace_new_input(&tr, &ty, site), "em_compile", site);
    ok = prim[i] != NULL;
    if (ok && in_rg[i] && ir_is_float(prim[i]->dtype)) {
      prim[i]->requires_grad = true; /* a leaf of the traced autograd graph */
      rg_index[n_rg] = i;
      rg[n_rg++] = prim[i];
    }
  }
  ok = ok && rt_interpret(fwd, prim, np, outs, &(rt_interp_opts){.trace_through = true}, site);
  for (int k = 0; ok && k < no; k++) {
    info->tangent_of_output[k] = -1;
    if (!outs[k]->requires_grad) continue;
    ir_type ty = tr.g->values[outs[k]->proxy - 1].type; /* a copy: adding an input may move the array */
    tang[n_diff] = rt_scope_add(rt_trace_new_input(&tr, &ty, site), "em_compile", site);
    ok = tang[n_diff] != NULL;
    info->tangent_of_output[k] = n_diff;
    diff[n_diff++] = outs[k];
  }
  info->n_tangents = n_diff;
  if (ok && n_diff > 0 && n_rg > 0)
    ok = rt_grad(n_diff, diff, tang, n_rg, rg, grads, false, false, true, site);
  for (int k = 0; ok && k < no; k++) ok = ir_add_output(tr.g, rt_trace_value_of(&tr, outs[k]));
  for (int j = 0; ok && j < n_rg; j++) {
    if (!grads[j]) continue;
    info->grad_of_primal[rg_index[j]] = tr.g->n_outputs;
    ok = ir_add_output(tr.g, rt_trace_value_of(&tr, grads[j]));
  }
  if (ok) {
    joint = ir_graph_clone(tr.g);
    if (!joint || !ir_graph_compact(joint, NULL, NULL)) {
      ir_graph_free(joint);
      joint = NULL;
      rt_error(site, "em_compile", "out of memory building the joint graph");
    }
  }
  for (int k = 0; k < no; k++) em_release(outs[k]);
  if (scoped) em_scope_end_at(site);
  rt_trace_end(&tr);
  em_set_grad_enabled(prev);
done:
  free(prim), free(outs), free(diff), free(tang), free(rg), free(grads), free(rg_index);
  if (!joint) aot_joint_info_free(info);
  return joint;
}
