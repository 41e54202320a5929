/* inductor/inductor.c: a program's life: ind_compile (the graph's layouts, the schedule and the
 * memory plan, the kernels built and loaded), the hooks the frontend logs through, accessors and
 * ind_free. The other files: see internal.h. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <stdio.h>

const char *ind_kernel_ir(const ind_program *p) { return p->ir_text; }
const char *ind_schedule(const ind_program *p) { return p->schedule_text; }


void ind_free(ind_program *p) {
  if (!p) return;
  ind_profile_kernels(p);
  ind_cgraph_free(p->cgraph);
  ind_release_kernels(p);
  for (int k = 0; k < p->n_kernels; k++) ind_cuda_tune_free(&p->kernels[k]);
  for (int k = 0; k < p->n_kernels; k++)
    free(p->kernels[k].nodes), free(p->kernels[k].in), free(p->kernels[k].out), free(p->kernels[k].loop_ir), free(p->kernels[k].table),
        free(p->kernels[k].rng);
  for (int s = 0; s < p->n_steps; s++) free(p->steps[s].release), free(p->steps[s].parts);
  for (int e = 0; e < p->n_epis; e++) free(p->epis[e].nodes), free(p->epis[e].reads);
  free(p->epis), free(p->gemm);
  free(p->kernels), free(p->steps), free(p->in_meta), free(p->in_device), free(p->ir_text), free(p->schedule_text), free(p->kind);
  free(p->combo_notes);
  free(p->arena_off), free(p->out_step), free(p->in_last_read), free(p->in_view_read), free(p->in_returned);
  free(p->rand), free(p->rand_of);
  ir_graph_free(p->g);
  free(p);
}


/* Layouts of every value, as the eager execution of g on inputs with metas in_meta gives them:
 * views carry their strides, everything else is contiguous (a RESHAPE that cannot be a view
 * copies). */
static bool value_metas(const ir_graph *g, const prim_meta *in_meta, prim_meta *meta) {
  for (int i = 0; i < g->n_inputs; i++) meta[g->inputs[i]] = in_meta[i];
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    prim_meta ms[64];
    if (n->n_in > 64) return false;
    for (int k = 0; k < n->n_in; k++) ms[k] = meta[ir_operands(g, n)[k]];
    char why[128];
    if (!prim_meta_fn(n->op, &n->attrs, ms, n->n_in, &meta[n->out], why, sizeof why)) {
      if (n->op != EM_PRIM_RESHAPE) return false;
      meta[n->out] = ir_meta_of_type(&g->values[n->out].type);
    }
    if (!(prim_get(n->op)->flags & P_VIEW)) {
      ir_contiguous_strides(meta[n->out].ndim, meta[n->out].sizes, meta[n->out].strides);
      meta[n->out].offset = 0;
    }
  }
  return true;
}

static ind_failure_hook failure_hook;
static ind_compiled_hook compiled_hook;
void ind_set_compiled_hook(ind_compiled_hook hook) { compiled_hook = hook; }
static const char *injected_failure;
static _Thread_local int64_t failures;

void ind_set_failure_hook(ind_failure_hook hook) { failure_hook = hook; }
void ind_debug_fail(const char *reason) { injected_failure = reason; }
int64_t ind_failures(void) { return failures; }

static ind_program *compile(const ir_graph *graph, em_tensor *const *inputs, const ind_options *opts, ind_stats *stats,
                            char *err, size_t cap);

ind_program *ind_compile(const ir_graph *graph, em_tensor *const *inputs, ind_stats *stats, char *err, size_t cap) {
  return ind_compile_opts(graph, inputs, NULL, stats, err, cap);
}

static ind_program *ind_compile_impl(const ir_graph *graph, em_tensor *const *inputs, const ind_options *opts,
                                     ind_stats *stats, char *err, size_t cap);

ind_program *ind_compile_opts(const ir_graph *graph, em_tensor *const *inputs, const ind_options *opts, ind_stats *stats,
                              char *err, size_t cap) {
  if (!RT_PROF_ON()) return ind_compile_impl(graph, inputs, opts, stats, err, cap);
  uint64_t t0_ = rt_prof_now();
  ind_program *r_ = ind_compile_impl(graph, inputs, opts, stats, err, cap);
  rt_prof_complete("phase", "inductor compile", t0_, "%d nodes", graph->n_nodes);
  return r_;
}

static ind_program *ind_compile_impl(const ir_graph *graph, em_tensor *const *inputs, const ind_options *opts,
                                     ind_stats *stats, char *err, size_t cap) {
  ind_program *p =
      injected_failure ? (ir_fail(err, cap, "%s", injected_failure), NULL) : compile(graph, inputs, opts, stats, err, cap);
  if (!p) {
    failures++;
    if (failure_hook) failure_hook(graph->name, err);
  } else if (compiled_hook) {
    compiled_hook(graph->name, p);
  }
  return p;
}

/* EMBER_INDUCTOR_REMAT=0 turns rematerialization off (to measure what it gains). */
static bool remat_enabled(void) {
  const char *e = getenv("EMBER_INDUCTOR_REMAT");
  return !e || strcmp(e, "0") != 0;
}

static ind_program *compile(const ir_graph *graph, em_tensor *const *inputs, const ind_options *opts, ind_stats *stats,
                            char *err, size_t cap) {
  double t0 = now_ms();
  if (stats) memset(stats, 0, sizeof *stats);
  /* a CUDA program when an input is on the GPU; CPU inputs then hold one element, possibly
   * broadcast (scalars such as an optimizer's learning rate, copied to the device where a
   * kernel reads them) */
  em_device device = EM_CPU;
  for (int i = 0; i < graph->n_inputs; i++)
    if (em_device_of(inputs[i]) == EM_CUDA) device = EM_CUDA;
  for (int i = 0; device == EM_CUDA && i < graph->n_inputs; i++) {
    const em_tensor *x = inputs[i];
    bool scalar = true;
    for (int d = 0; d < x->ndim; d++) scalar &= x->sizes[d] <= 1 || x->strides[d] == 0;
    if (x->storage->device == EM_CPU && !scalar)
      return ir_fail(err, cap, "input %d has %lld elements on the cpu, others are on cuda", i, (long long)x->numel), NULL;
  }
  if (device == EM_CPU && !ind_jit_get(err, cap)) return NULL;
  bool concrete = true;
  for (int i = 0; i < graph->n_nodes; i++) concrete = concrete && ir_type_concrete(&graph->values[graph->nodes[i].out].type);
  if (!concrete) return ir_fail(err, cap, "symbolic sizes"), NULL;
  ind_program *p = calloc(1, sizeof *p);
  const ind_renderer *rend = opts && opts->renderer ? opts->renderer : ind_renderer_for(device);
  if (p) p->device = device, p->rend = rend, p->opts = opts ? *opts : (ind_options){0};
  if (p) p->g = ind_rewrite(graph, rend, remat_enabled(), &p->stats);
  prim_meta *meta = p && p->g ? calloc((size_t)p->g->n_values + 1, sizeof(prim_meta)) : NULL;
  if (!meta) {
    if (p) ir_graph_free(p->g);
    free(p);
    ir_fail(err, cap, "out of memory");
    return NULL;
  }
  const ir_graph *g = p->g;
  bool ok = true;
  p->in_meta = malloc(sizeof(prim_meta) * (size_t)(g->n_inputs + 1));
  if (!p->in_meta) ok = ir_fail(err, cap, "out of memory");
  p->in_device = malloc(sizeof(em_device) * (size_t)(g->n_inputs + 1));
  if (!p->in_device) ok = ir_fail(err, cap, "out of memory");
  for (int i = 0; ok && i < g->n_inputs; i++) p->in_meta[i] = rt_meta(inputs[i]), p->in_device[i] = em_device_of(inputs[i]);
  if (ok && !value_metas(g, p->in_meta, meta)) ok = ir_fail(err, cap, "the graph's layouts do not follow from its inputs");
  p->kind = calloc((size_t)g->n_values + 1, 1);
  if (ok && !p->kind) ok = ir_fail(err, cap, "out of memory");
  if (ok && !ind_schedule_program(p, meta)) ok = ir_fail(err, cap, "out of memory scheduling");
  if (ok && p->n_kernels)
    ok = rend->build(p, meta, err, cap);
  if (ok) ind_describe_schedule(p);
  if (ok && p->opts.cuda_graphs && !p->n_rand && !ind_cgraph_attach(p)) ok = ir_fail(err, cap, "out of memory");
  free(meta);
  if (!ok) {
    ind_free(p);
    return NULL;
  }
  p->stats.kernels = p->n_kernels;
  for (int k = 0; k < p->n_kernels; k++) p->stats.fused_nodes += p->kernels[k].n_nodes;
  for (int s = 0; s < p->n_steps; s++) p->stats.fallback_nodes += p->steps[s].node >= 0;
  p->stats.compile_ms = now_ms() - t0;
  if (stats) *stats = p->stats;
  return p;
}

ind_stats ind_program_stats(const ind_program *p) { return p->stats; }

ind_program *ind_variant(ind_variants *v, const ir_graph *g, em_tensor *const *in, int n_in) {
  for (int i = 0; i < v->n; i++)
    if (ind_accepts(v->p[i], in, n_in)) return v->p[i];
  if (v->failed || v->n == IND_MAX_VARIANTS) return NULL;
  char err[256]; /* reported through the failure hook */
  ind_program *p = ind_compile_opts(g, in, &v->opts, NULL, err, sizeof err);
  if (!p) return v->failed = true, NULL;
  return v->p[v->n++] = p;
}

void ind_variants_free(ind_variants *v) {
  for (int i = 0; i < v->n; i++) ind_free(v->p[i]);
  v->n = 0;
}
