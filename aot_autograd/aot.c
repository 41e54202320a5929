/* aot_autograd/aot.c: compiled forward/backward pairs at run time.
 *
 * A call runs the forward graph without grad and attaches to the differentiable outputs one
 * custom autograd node whose backward runs the backward graph on the saved values and the
 * output gradients, so em_backward on a compiled output works as on an eager one (as
 * torch.compile's CompiledFunction does). With several differentiable outputs, the node's
 * "output" is their flat concatenation: each output gets a small unpacking node that scatters
 * its gradient into that flat vector, and the engine's ordinary accumulation sums them, so the
 * engine needs no notion of multi-output nodes.
 *
 * An output that receives no gradient (nothing downstream of it reaches the loss) has no
 * tangent in eager autograd, while the backward graph takes one for each output. A zero there
 * is not the same: the backward multiplies tangents by saved values, and 0 * inf or 0 / NaN is
 * NaN, so one output's absent gradient poisoned the others' (the fuzzer: a mean over an empty
 * tensor, then a graph break, gave NaN gradients where eager gave -0.043). The unpacking nodes
 * record which outputs received a gradient, and the backward runs a variant of the graph in
 * which the absent tangents are symbolic zeros (zero_tangent_graph), as eager would.
 *
 * Random nodes draw their Philox counters in the forward run into a table of rng slots that
 * the node keeps; a backward graph that recomputes a random value (min-cut) reads the same
 * slot, so dropout's mask is replayed, not saved. */
#include "aot.h"
#include "../inductor/inductor.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct aot_compiled {
  int64_t refcount;
  char name[64];
  aot_joint_info info;
  aot_split split;
  int n_slots;
  int n_diff;           /* differentiable outputs (one tangent each) */
  int *diff_output;     /* [n_diff] forward output index */
  int *grad_primal;     /* [bwd outputs] primal the gradient belongs to */
  bool use_inductor;
  ind_options ind_opts; /* the mode, for every variant */
  ind_variants ind[2]; /* forward, backward: compiled at the first run with each layout */
  /* backward variants for calls where some outputs received no gradient (bit d: output d's
   * tangent absent), made at first need */
  pthread_mutex_t zlock;
  struct {
    uint64_t absent;
    ir_graph *g;
    ind_variants ind;
  } zv[8];
  int n_zv;
};

void aot_set_inductor(aot_compiled *a, bool use_inductor, const ind_options *opts) {
  a->use_inductor = use_inductor;
  a->ind[0].opts = a->ind[1].opts = a->ind_opts = opts ? *opts : (ind_options){0};
}

/* Runs g with generated kernels (variants v) when enabled and possible, else with the
 * interpreter. */
static bool run_graph(aot_compiled *a, const ir_graph *g, ind_variants *v, em_tensor *const *in, int n_in,
                      em_tensor **out, const rt_interp_opts *opts, em_site site) {
  /* random nodes: the program draws or replays their counters through the rng slots, as the
   * interpreter does (issue 20) */
  ind_program *p = a->use_inductor && ind_takes_random(g) && !rt_grad_enabled() ? ind_variant(v, g, in, n_in) : NULL;
  if (p) return ind_run_rng(p, in, n_in, out, NULL, opts, site); /* else the interpreter runs it */
  return rt_interpret(g, in, n_in, out, opts, site);
}

/* ---- symbolic zero tangents ---- */

enum { ZERO = -2 }; /* a value known to be zero because it is linear in absent tangents only */

static int zero_of(ir_graph *g, const ir_type *t, const ir_node *n) {
  prim_meta m = ir_meta_of_type(t);
  prim_attrs at = {.dtype = t->dtype, .value = 0, .shape = {m.ndim, {0}}};
  memcpy(at.shape.sizes, m.sizes, sizeof(int64_t) * (size_t)m.ndim);
  return ir_add_node(g, EM_PRIM_FULL, NULL, 0, &at, t, n ? n->site : (em_site){0}, "zeros");
}

/* What node n gives when the operands flagged z are zero: ZERO, the id of an operand it equals,
 * or -1 when it must be computed (with real zeros for the flagged operands). Backward graphs
 * are linear in the tangents, so a product with a tangent-derived zero is zero whatever the
 * other factor (0 * inf included: that is the point), as are sums, copies and views of zeros. */
static int zero_rule(const ir_graph *b, const ir_node *n, const bool *z, const int *map) {
  const int *ops = ir_operands(b, n);
  int nz = 0;
  for (int i = 0; i < n->n_in; i++) nz += z[i];
  const ir_type *t = &b->values[n->out].type;
  switch (n->op) {
  case EM_PRIM_MUL: case EM_PRIM_MATMUL: case EM_PRIM_CONV2D: case EM_PRIM_CONV2D_BWD_INPUT:
  case EM_PRIM_CONV2D_BWD_WEIGHT:
    return ZERO;
  case EM_PRIM_DIV: case EM_PRIM_NEG: case EM_PRIM_SUM: case EM_PRIM_RESHAPE: case EM_PRIM_PERMUTE:
  case EM_PRIM_EXPAND: case EM_PRIM_SLICE: case EM_PRIM_SQUEEZE: case EM_PRIM_UNSQUEEZE: case EM_PRIM_CLONE:
  case EM_PRIM_FLIP: case EM_PRIM_CONVERT: case EM_PRIM_GATHER: case EM_PRIM_INDEX_SELECT: case EM_PRIM_DETACH:
    return z[0] ? ZERO : -1;
  case EM_PRIM_PAD: return z[0] && n->attrs.value == 0 ? ZERO : -1;
  case EM_PRIM_WHERE: return z[1] && z[2] ? ZERO : -1;
  case EM_PRIM_SCATTER_ADD: return z[0] && z[2] ? ZERO : -1;
  case EM_PRIM_ADD: case EM_PRIM_SUB: case EM_PRIM_CAT: case EM_PRIM_SLICE_SCATTER:
    if (nz == n->n_in) return ZERO;
    if (n->op == EM_PRIM_ADD || (n->op == EM_PRIM_SUB && z[1]))
      for (int i = 0; i < n->n_in; i++)
        if (!z[i] && ir_type_equal(&b->values[ops[i]].type, t)) return map[ops[i]]; /* x + 0, x - 0 */
    return -1;
  default: return -1;
  }
}

/* b with the tangent inputs flagged in `absent` (bit d: input first + d) taken as zeros and
 * propagated: the same inputs (the absent ones unused), outputs that are zero made by FULL.
 * NULL when out of memory. */
static ir_graph *zero_tangent_graph(const ir_graph *b, int first, uint64_t absent) {
  ir_graph *g = ir_graph_new(b->name);
  int *map = malloc(sizeof(int) * (size_t)(b->n_values + 1));
  bool ok = g && map;
  for (int i = 0; ok && i < b->n_inputs; i++) {
    int v = ir_add_input(g, &b->values[b->inputs[i]].type);
    ok = v >= 0;
    map[b->inputs[i]] = i >= first && i - first < 64 && (absent >> (i - first) & 1) ? ZERO : v;
  }
  for (int k = 0; ok && k < b->n_nodes; k++) {
    const ir_node *n = &b->nodes[k];
    const int *ops = ir_operands(b, n);
    bool z[EM_MAX_DIMS * 8] = {0}, any = false;
    for (int i = 0; i < n->n_in && i < (int)(sizeof z); i++) any |= z[i] = map[ops[i]] == ZERO;
    int r = any ? zero_rule(b, n, z, map) : -1;
    if (r != -1) {
      map[n->out] = r;
      continue;
    }
    int in[64];
    for (int i = 0; ok && i < n->n_in && i < 64; i++)
      ok = (in[i] = z[i] ? zero_of(g, &b->values[ops[i]].type, n) : map[ops[i]]) >= 0;
    int v = ok ? ir_add_node(g, n->op, in, n->n_in, &n->attrs, &b->values[n->out].type, n->site, n->opname) : -1;
    if ((ok = v >= 0)) g->nodes[g->n_nodes - 1].rng_slot = n->rng_slot;
    map[n->out] = v;
  }
  for (int i = 0; ok && i < b->n_outputs; i++) {
    int v = map[b->outputs[i]];
    if (v == ZERO) v = zero_of(g, &b->values[b->outputs[i]].type, NULL);
    ok = v >= 0 && ir_add_output(g, v);
  }
  /* what only fed a product with a zero is dead now */
  int *uses = ok ? calloc((size_t)g->n_values + 1, sizeof(int)) : NULL;
  bool *keep = ok ? malloc((size_t)g->n_nodes + 1) : NULL;
  ok = ok && uses && keep;
  if (ok) {
    for (int i = 0; i < g->n_outputs; i++) uses[g->outputs[i]]++;
    for (int k = g->n_nodes - 1; k >= 0; k--) {
      const ir_node *n = &g->nodes[k];
      keep[k] = uses[n->out] > 0;
      if (keep[k])
        for (int i = 0; i < n->n_in; i++) uses[ir_operands(g, n)[i]]++;
    }
    ok = ir_graph_compact(g, keep, NULL);
  }
  free(uses), free(keep), free(map);
  if (!ok) ir_graph_free(g), g = NULL;
  return g;
}

/* The backward graph (and its compiled variants) for this set of absent tangents. */
static bool backward_variant(aot_compiled *a, uint64_t absent, const ir_graph **g, ind_variants **v) {
  if (!absent) return *g = a->split.bwd, *v = &a->ind[1], true;
  pthread_mutex_lock(&a->zlock);
  int i = 0;
  while (i < a->n_zv && a->zv[i].absent != absent) i++;
  if (i == a->n_zv && i < 8) {
    ir_graph *z = zero_tangent_graph(a->split.bwd, a->split.bwd->n_inputs - a->n_diff, absent);
    if (z) a->zv[i].absent = absent, a->zv[i].g = z, a->zv[i].ind = (ind_variants){.opts = a->ind_opts}, a->n_zv++;
  }
  bool ok = i < a->n_zv;
  if (ok) *g = a->zv[i].g, *v = &a->zv[i].ind;
  pthread_mutex_unlock(&a->zlock);
  return ok;
}

const aot_split *aot_get_split(const aot_compiled *a) { return &a->split; }

void aot_release(aot_compiled *a) {
  if (!a || __atomic_sub_fetch(&a->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
  aot_joint_info_free(&a->info);
  aot_split_free(&a->split);
  ind_variants_free(&a->ind[0]), ind_variants_free(&a->ind[1]);
  for (int i = 0; i < a->n_zv; i++) ir_graph_free(a->zv[i].g), ind_variants_free(&a->zv[i].ind);
  pthread_mutex_destroy(&a->zlock);
  free(a->diff_output), free(a->grad_primal);
  free(a);
}

aot_compiled *aot_compile(const ir_graph *fwd, const bool *in_rg, aot_partitioner p, const char *name, em_site site) {
  aot_compiled *a = calloc(1, sizeof *a);
  if (!a) return rt_error(site, "em_compile", "out of memory");
  a->refcount = 1;
  pthread_mutex_init(&a->zlock, NULL);
  snprintf(a->name, sizeof a->name, "%s", name);
  ir_graph *joint = aot_joint_graph(fwd, in_rg, &a->info, site);
  if (!joint) {
    free(a);
    return NULL;
  }
  char err[512];
  ir_pass_stats st;
  bool ok = ir_optimize(joint, &st);
  if (!ok) rt_error(site, "em_compile", "out of memory optimising the joint graph of %s", name);
  if (ok && !aot_partition(joint, &a->info, p, &a->split, err, sizeof err)) {
    rt_error(site, "em_compile", "partitioning the joint graph of %s: %s", name, err);
    ok = false;
  }
  a->n_slots = joint->n_nodes;
  a->diff_output = malloc(sizeof(int) * (size_t)(a->info.n_fwd_outputs + 1));
  a->grad_primal = malloc(sizeof(int) * (size_t)(a->info.n_primals + 1));
  if (ok && (!a->diff_output || !a->grad_primal)) ok = (rt_error(site, "em_compile", "out of memory"), false);
  for (int k = 0; ok && k < a->info.n_fwd_outputs; k++)
    if (a->info.tangent_of_output[k] >= 0) a->diff_output[a->n_diff++] = k;
  /* the flat concatenation of several differentiable outputs needs one dtype */
  for (int d = 1; ok && d < a->n_diff; d++)
    if (fwd->values[fwd->outputs[a->diff_output[d]]].type.dtype != fwd->values[fwd->outputs[a->diff_output[0]]].type.dtype)
      ok = (rt_error(site, "em_compile", "%s: differentiable outputs of different dtypes are not supported by AOT "
                     "autograd yet", name), false);
  int k = 0;
  for (int i = 0; ok && i < a->info.n_primals; i++)
    if (a->info.grad_of_primal[i] >= 0) a->grad_primal[k++] = i;
  ir_graph_free(joint);
  if (!ok) {
    aot_release(a);
    return NULL;
  }
  return a;
}

/* ---- the backward node ---- */

typedef struct aot_ctx {
  aot_compiled *a;
  em_tensor **saved;
  int64_t *saved_version;
  int n_saved;
  rt_rng_slot *slots;
  prim_meta *diff_meta; /* [n_diff] */
  int64_t *diff_offset; /* [n_diff + 1] offsets in the flat vector */
  uint64_t received;    /* bit d: output d's gradient arrived in this backward (its unpacking ran) */
  int n_activations;    /* saved values that are not primal inputs: they carry no autograd history */
  bool released;
} aot_ctx;

static void ctx_free_saved(void *p) {
  aot_ctx *c = p;
  for (int i = 0; i < c->n_saved; i++) em_release(c->saved[i]), c->saved[i] = NULL;
  c->released = true;
}

static void ctx_destroy(void *p) {
  aot_ctx *c = p;
  ctx_free_saved(c);
  aot_release(c->a);
  rt_free(c->saved), rt_free(c->saved_version), rt_free(c->slots), rt_free(c->diff_meta), rt_free(c->diff_offset);
  rt_free(c);
}

static bool aot_backward(rt_node *n, em_tensor *g, em_tensor **grads) {
  aot_ctx *c = n->custom_ctx;
  aot_compiled *a = c->a;
  em_site s = n->site;
  if (c->released)
    return rt_error(s, n->name, "trying to backward through the compiled graph a second time (its saved tensors were "
                    "freed); pass retain_graph to the first backward"), false;
  /* create_graph (grad mode on in backward): the backward graph runs in the interpreter, whose
   * ops are recorded, so the gradient it returns is differentiable again. That is exact only when
   * every value it reads carries its history: primal inputs do, but activations the compiled
   * forward computed and saved do not, and a gradient of this gradient would silently miss every
   * path through them. PyTorch refuses double backward through torch.compile altogether. */
  if (rt_grad_enabled() && c->n_activations > 0)
    return rt_error(s, n->name, "double backward (create_graph) through a compiled function is not supported: its "
                    "backward reads %d activation%s that the compiled forward saved without autograd history, so the "
                    "gradient of this gradient would be wrong (PyTorch refuses double backward through torch.compile "
                    "too); run the function uncompiled for higher-order gradients", c->n_activations,
                    c->n_activations == 1 ? "" : "s"), false;
  for (int i = 0; i < c->n_saved; i++)
    if (em_version(c->saved[i]) != c->saved_version[i]) {
      char b[128];
      return rt_error(s, n->name, "%s, saved by the compiled forward for the backward pass, was modified in place "
                      "(version %lld, expected %lld); clone it before modifying it", rt_fmt(b, sizeof b, c->saved[i]),
                      (long long)em_version(c->saved[i]), (long long)c->saved_version[i]), false;
    }
  const ir_graph *bwd = a->split.bwd;
  int n_in = c->n_saved + a->n_diff, n_out = bwd->n_outputs;
  em_tensor **in = rt_alloc(sizeof(em_tensor *) * (size_t)(n_in + n_out + 1), 16);
  if (!in) return rt_error(s, n->name, "out of memory"), false;
  em_tensor **out = in + n_in;
  for (int i = 0; i < c->n_saved; i++) in[i] = c->saved[i];
  bool ok = true;
  for (int d = 0; d < a->n_diff && ok; d++) {
    em_tensor *t = g;
    if (a->n_diff > 1) {
      const prim_meta *m = &c->diff_meta[d];
      t = em_reshape_at(em_slice_at(g, 0, c->diff_offset[d], c->diff_offset[d + 1], 1, s), m->ndim, m->sizes, s);
    }
    in[c->n_saved + d] = t;
    ok = t != NULL;
  }
  /* outputs whose gradient did not arrive have no tangent (with one output, it arrived) */
  uint64_t got = __atomic_exchange_n(&c->received, 0, __ATOMIC_ACQ_REL);
  uint64_t absent = a->n_diff > 1 && a->n_diff <= 64 ? ~got & (a->n_diff == 64 ? ~0ull : (1ull << a->n_diff) - 1) : 0;
  const ir_graph *bg;
  ind_variants *bv;
  if (ok && !backward_variant(a, absent, &bg, &bv)) ok = (rt_error(s, n->name, "out of memory"), false);
  ok = ok && run_graph(a, bg, bv, in, n_in, out, &(rt_interp_opts){.fresh_rng = true, .slots = c->slots, .n_slots = a->n_slots}, s);
  for (int k = 0; ok && k < n_out; k++) {
    int i = a->grad_primal[k];
    grads[i] = rt_scope_add(out[k], n->name, s);
    out[k] = NULL;
    ok = grads[i] != NULL;
  }
  if (!ok)
    for (int k = 0; k < n_out; k++) em_release(out[k]);
  rt_free(in);
  return ok;
}

static const rt_custom_ops aot_ops = {aot_backward, ctx_free_saved, ctx_destroy};

/* The unpacking node of differentiable output d: its gradient, scattered into the flat vector. */
typedef struct unpack_ctx {
  int64_t start, stop, total;
  em_dtype dtype;
  aot_ctx *owner; /* the compiled node's context, alive while this node is (it holds that node) */
  int d;          /* which differentiable output */
} unpack_ctx;

static bool unpack_backward(rt_node *n, em_tensor *g, em_tensor **grads) {
  unpack_ctx *u = n->custom_ctx;
  em_site s = n->site;
  if (u->d < 64) __atomic_fetch_or(&u->owner->received, 1ull << u->d, __ATOMIC_ACQ_REL);
  int64_t len = u->stop - u->start;
  em_tensor *flat = em_reshape_at(g, 1, &len, s);
  grads[0] = em_slice_scatter_at(em_zeros_at(u->dtype, 1, &u->total, s), flat, 0, u->start, u->stop, 1, s);
  return grads[0] != NULL;
}

static void unpack_destroy(void *p) { rt_free(p); }
static const rt_custom_ops unpack_ops = {unpack_backward, NULL, unpack_destroy};

bool aot_run(aot_compiled *a, em_tensor *const *in, int n_in, em_tensor **outs, em_site site) {
  const ir_graph *fwd = a->split.fwd;
  int n_fo = a->info.n_fwd_outputs, n_all = fwd->n_outputs, n_saved = n_all - n_fo;
  for (int k = 0; k < n_fo; k++) outs[k] = NULL;
  em_tensor **all = rt_alloc(sizeof(em_tensor *) * (size_t)(n_all + 1), 16);
  aot_ctx *c = rt_alloc(sizeof *c, 16);
  if (c) memset(c, 0, sizeof *c);
  bool ok = all && c;
  if (ok) {
    c->saved = rt_alloc(sizeof(em_tensor *) * (size_t)(n_saved + 1), 16);
    c->saved_version = rt_alloc(sizeof(int64_t) * (size_t)(n_saved + 1), 16);
    c->slots = rt_alloc(sizeof(rt_rng_slot) * (size_t)(a->n_slots + 1), 16);
    c->diff_meta = rt_alloc(sizeof(prim_meta) * (size_t)(a->n_diff + 1), 16);
    c->diff_offset = rt_alloc(sizeof(int64_t) * (size_t)(a->n_diff + 2), 16);
    ok = c->saved && c->saved_version && c->slots && c->diff_meta && c->diff_offset;
    if (ok) memset(c->slots, 0, sizeof(rt_rng_slot) * (size_t)(a->n_slots + 1));
  }
  if (!ok) {
    if (c) rt_free(c->saved), rt_free(c->saved_version), rt_free(c->slots), rt_free(c->diff_meta), rt_free(c->diff_offset);
    rt_free(c), rt_free(all);
    return rt_error(site, "em_call", "out of memory"), false;
  }
  bool prev = em_set_grad_enabled(false);
  ok = run_graph(a, a->split.fwd, &a->ind[0], in, n_in, all,
                 &(rt_interp_opts){.fresh_rng = true, .slots = c->slots, .n_slots = a->n_slots}, site);
  em_set_grad_enabled(prev);
  if (ok) {
    for (int k = 0; k < n_fo; k++) outs[k] = all[k];
    for (int i = 0; i < n_saved; i++) {
      c->saved[i] = all[n_fo + i], c->saved_version[i] = em_version(all[n_fo + i]);
      bool primal = false;
      for (int j = 0; j < n_in && !primal; j++) primal = all[n_fo + i] == in[j];
      c->n_activations += !primal;
    }
  }
  c->n_saved = ok ? n_saved : 0;
  c->a = a;
  __atomic_add_fetch(&a->refcount, 1, __ATOMIC_RELAXED);
  bool any_rg = false;
  for (int i = 0; i < n_in; i++) any_rg |= in[i]->requires_grad && a->info.grad_of_primal[i] >= 0;
  if (!ok || !prev || !any_rg || a->n_diff == 0) { /* nothing to differentiate */
    rt_free(all);
    ctx_destroy(c);
    if (!ok)
      for (int k = 0; k < n_fo; k++) em_release(outs[k]), outs[k] = NULL;
    return ok;
  }
  rt_free(all);
  /* a saved value that is also a differentiable output (exp's result, saved for its backward)
   * is saved as its own header over the same storage: the output's grad_fn will own this
   * context, and the context owning the output itself would be a reference cycle that is never
   * freed when no backward runs (found by the fuzzer: a graph break after such an op leaked) */
  for (int i = 0; i < c->n_saved; i++)
    for (int d = 0; d < a->n_diff; d++) {
      em_tensor *o = outs[a->diff_output[d]];
      if (c->saved[i] != o) continue;
      em_tensor *v = rt_new_view(o, o->ndim, o->sizes, o->strides, o->offset, "em_call", site);
      if (!v) {
        ctx_destroy(c);
        goto fail;
      }
      em_release(c->saved[i]);
      c->saved[i] = v;
      break;
    }
  /* an output that is an input itself gets its own header (a view), so that attaching a grad_fn
   * does not turn the user's leaf into a non-leaf */
  for (int d = 0; d < a->n_diff; d++) {
    em_tensor *o = outs[a->diff_output[d]];
    bool is_input = false;
    for (int i = 0; i < n_in; i++) is_input |= o == in[i];
    if (!is_input) continue;
    em_tensor *v = rt_new_view(o, o->ndim, o->sizes, o->strides, o->offset, "em_call", site);
    if (!v) {
      ctx_destroy(c);
      goto fail;
    }
    em_release(o);
    outs[a->diff_output[d]] = v;
  }
  int64_t total = 0;
  c->diff_offset[0] = 0;
  for (int d = 0; d < a->n_diff; d++) {
    c->diff_meta[d] = rt_meta(outs[a->diff_output[d]]);
    total += outs[a->diff_output[d]]->numel;
    c->diff_offset[d + 1] = total;
  }
  prim_meta flat = {.dtype = outs[a->diff_output[0]]->dtype, .ndim = 1, .sizes = {total}, .strides = {1}};
  const prim_meta *om = a->n_diff == 1 ? &c->diff_meta[0] : &flat;
  rt_node *node = rt_custom_node(a->name, &aot_ops, c, in, n_in, om, site);
  if (!node) {
    ctx_destroy(c);
    goto fail;
  }
  if (a->n_diff == 1) {
    rt_set_grad_fn(outs[a->diff_output[0]], node);
  } else {
    for (int d = 0; d < a->n_diff && ok; d++) {
      unpack_ctx *u = rt_alloc(sizeof *u, 16);
      rt_node *un = u ? rt_custom_node(a->name, &unpack_ops, u, NULL, 1, &c->diff_meta[d], site) : NULL;
      if (!un) {
        rt_free(u);
        ok = (rt_error(site, "em_call", "out of memory"), false);
        break;
      }
      *u = (unpack_ctx){c->diff_offset[d], c->diff_offset[d + 1], total, flat.dtype, c, d};
      un->next[0] = node;
      __atomic_add_fetch(&node->refcount, 1, __ATOMIC_RELAXED);
      un->in_meta[0] = flat;
      rt_set_grad_fn(outs[a->diff_output[d]], un);
      rt_node_release(un);
    }
  }
  rt_node_release(node);
  if (ok) return true;
fail:
  for (int k = 0; k < n_fo; k++) em_release(outs[k]), outs[k] = NULL;
  return false;
}
