/* ir/graph.c: building, copying, compacting and hashing graphs (see graph.h). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "graph.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Grows *items (of elem bytes each) so it holds at least need; sets g->oom on failure. */
static bool grow(ir_graph *g, void **items, int *cap, int need, size_t elem) {
  if (need <= *cap) return true;
  int c = *cap ? *cap : 16;
  while (c < need) c *= 2;
  void *p = realloc(*items, (size_t)c * elem);
  if (!p) {
    g->oom = true;
    return false;
  }
  *items = p;
  *cap = c;
  return true;
}
#define GROW(g, arr, cap, need) grow((g), (void **)&(arr), &(cap), (need), sizeof *(arr))

bool ir_fail(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return false;
}

ir_graph *ir_graph_new(const char *name) {
  ir_graph *g = calloc(1, sizeof *g);
  if (g) snprintf(g->name, sizeof g->name, "%s", name && *name ? name : "graph");
  return g;
}

void ir_graph_free(ir_graph *g) {
  if (!g) return;
  free(g->values), free(g->nodes), free(g->operands), free(g->inputs), free(g->outputs),
      free(g->sexprs);
  free(g);
}

static void *dup_array(const void *p, size_t bytes, bool *ok) {
  if (!bytes) return NULL;
  void *q = malloc(bytes);
  if (!q) *ok = false;
  else memcpy(q, p, bytes);
  return q;
}

ir_graph *ir_graph_clone(const ir_graph *g) {
  ir_graph *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  bool ok = true;
  memcpy(c->name, g->name, sizeof c->name);
#define COPY(arr, n, cap)                                              \
  c->arr = dup_array(g->arr, sizeof *g->arr * (size_t)g->n, &ok);      \
  c->n = c->cap = g->n;
  COPY(values, n_values, cap_values)
  COPY(nodes, n_nodes, cap_nodes)
  COPY(operands, n_operands, cap_operands)
  COPY(inputs, n_inputs, cap_inputs)
  COPY(outputs, n_outputs, cap_outputs)
  COPY(sexprs, n_sexprs, cap_sexprs)
#undef COPY
  c->n_symbols = g->n_symbols;
  if (!ok) {
    ir_graph_free(c);
    return NULL;
  }
  return c;
}

/* The process-wide pool behind ir_intern: file and function names are few and live as long as
 * the autograd nodes and error messages that may point at them, so the pool is never freed. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static char **pool;
static int pool_n, pool_cap;

const char *ir_intern(const char *s) {
  if (!s) return NULL;
  const char *r = NULL;
  pthread_mutex_lock(&pool_lock);
  for (int i = 0; i < pool_n && !r; i++)
    if (!strcmp(pool[i], s)) r = pool[i];
  if (!r && pool_n == pool_cap) {
    int cap = pool_cap ? 2 * pool_cap : 64;
    char **p = realloc(pool, sizeof(char *) * (size_t)cap);
    if (p) pool = p, pool_cap = cap;
  }
  if (!r && pool_n < pool_cap && (r = strdup(s))) pool[pool_n++] = (char *)r;
  pthread_mutex_unlock(&pool_lock);
  return r;
}

static int new_value(ir_graph *g, const ir_type *t, int def) {
  if (!GROW(g, g->values, g->cap_values, g->n_values + 1)) return -1;
  g->values[g->n_values] = (ir_value){.type = *t, .def = def};
  return g->n_values++;
}

int ir_add_input(ir_graph *g, const ir_type *t) {
  if (g->oom || !GROW(g, g->inputs, g->cap_inputs, g->n_inputs + 1)) return -1;
  int v = new_value(g, t, -1);
  if (v >= 0) g->inputs[g->n_inputs++] = v;
  return v;
}

int ir_add_node(ir_graph *g, em_prim op, const int *in, int n_in, const prim_attrs *at, const ir_type *t,
                em_site site, const char *opname) {
  if (g->oom || !GROW(g, g->nodes, g->cap_nodes, g->n_nodes + 1) ||
      !GROW(g, g->operands, g->cap_operands, g->n_operands + n_in))
    return -1;
  int v = new_value(g, t, g->n_nodes);
  if (v < 0) return -1;
  ir_node *n = &g->nodes[g->n_nodes++];
  *n = (ir_node){.op = op, .n_in = n_in, .in_at = g->n_operands, .out = v,
                 .site = site, .opname = opname ? opname : prim_get(op)->name,
                 .rng_slot = -1};
  if (at) n->attrs = *at;
  if (n_in && in[0] >= 0 && in[0] < g->n_values) /* passes index by axis: see prim_canonical_attrs */
    prim_canonical_attrs(op, &n->attrs, g->values[in[0]].type.ndim);
  if (n_in) memcpy(g->operands + g->n_operands, in, sizeof(int) * (size_t)n_in);
  g->n_operands += n_in;
  return v;
}

bool ir_add_output(ir_graph *g, int value) {
  if (g->oom || !GROW(g, g->outputs, g->cap_outputs, g->n_outputs + 1)) return false;
  g->outputs[g->n_outputs++] = value;
  return true;
}

/* ---- symbolic sizes ---- */

static ir_dim add_sexpr(ir_graph *g, ir_sexpr e) {
  if (!GROW(g, g->sexprs, g->cap_sexprs, g->n_sexprs + 1)) return 0;
  g->sexprs[g->n_sexprs] = e;
  return IR_SYM_REF(g->n_sexprs++);
}

ir_dim ir_new_symbol(ir_graph *g) {
  return add_sexpr(g, (ir_sexpr){.kind = IR_SEXPR_SYM, .sym = g->n_symbols++});
}

ir_dim ir_sexpr_binary(ir_graph *g, ir_sexpr_kind kind, ir_dim a, ir_dim b) {
  if (!IR_DIM_IS_SYM(a) && !IR_DIM_IS_SYM(b)) {
    switch (kind) {
    case IR_SEXPR_ADD: return a + b;
    case IR_SEXPR_MUL: return a * b;
    case IR_SEXPR_FLOORDIV: return b ? a / b : 0;
    default: break;
    }
  }
  for (int i = 0; i < g->n_sexprs; i++) /* hash-consing keeps expressions comparable by id */
    if (g->sexprs[i].kind == kind && g->sexprs[i].a == a && g->sexprs[i].b == b) return IR_SYM_REF(i);
  return add_sexpr(g, (ir_sexpr){.kind = kind, .a = a, .b = b});
}

int64_t ir_dim_eval(const ir_graph *g, ir_dim d, const int64_t *syms) {
  if (!IR_DIM_IS_SYM(d)) return d;
  int k = IR_SYM_INDEX(d);
  if (k >= g->n_sexprs) return -1;
  const ir_sexpr *e = &g->sexprs[k];
  if (e->kind == IR_SEXPR_SYM) return syms ? syms[e->sym] : -1;
  int64_t a = ir_dim_eval(g, e->a, syms), b = ir_dim_eval(g, e->b, syms);
  if (a < 0 || b < 0) return -1;
  switch (e->kind) {
  case IR_SEXPR_ADD: return a + b;
  case IR_SEXPR_MUL: return a * b;
  case IR_SEXPR_FLOORDIV: return b ? a / b : -1;
  default: return -1;
  }
}

bool ir_type_concrete(const ir_type *t) {
  for (int i = 0; i < t->ndim; i++)
    if (IR_DIM_IS_SYM(t->sizes[i])) return false;
  return true;
}

ir_type ir_type_of_meta(const prim_meta *m, em_device dev) {
  ir_type t = {.dtype = m->dtype, .device = dev, .ndim = m->ndim};
  for (int i = 0; i < m->ndim; i++) t.sizes[i] = m->sizes[i];
  return t;
}

prim_meta ir_meta_of_type(const ir_type *t) {
  prim_meta m = {.dtype = t->dtype, .ndim = t->ndim};
  for (int i = 0; i < t->ndim; i++) m.sizes[i] = t->sizes[i];
  ir_contiguous_strides(m.ndim, m.sizes, m.strides);
  return m;
}

bool ir_type_equal(const ir_type *a, const ir_type *b) {
  if (a->dtype != b->dtype || a->device != b->device || a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return false;
  return true;
}

/* ---- attributes by schema ---- */

static bool has(em_prim op, const char *field) {
  const char *s = prim_get(op)->attrs;
  size_t n = strlen(field);
  for (const char *p = s; (p = strstr(p, field)); p += n)
    if ((p == s || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return true;
  return false;
}

static bool same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

bool ir_attrs_equal(em_prim op, const prim_attrs *a, const prim_attrs *b) {
  if (has(op, "axes") &&
      (a->n_axes != b->n_axes || memcmp(a->axes, b->axes, sizeof(int64_t) * (size_t)a->n_axes)))
    return false;
  if (has(op, "keepdim") && a->keepdim != b->keepdim) return false;
  if (has(op, "descending") && a->descending != b->descending) return false;
  if (has(op, "shape") && (a->shape.ndim != b->shape.ndim ||
                           memcmp(a->shape.sizes, b->shape.sizes, sizeof(int64_t) * (size_t)a->shape.ndim)))
    return false;
  if (has(op, "dtype") && a->dtype != b->dtype) return false;
  if (has(op, "start") && (a->start != b->start || a->stop != b->stop || a->step != b->step)) return false;
  if (has(op, "pads") &&
      (a->n_pads != b->n_pads || memcmp(a->pads, b->pads, sizeof(int64_t) * (size_t)a->n_pads)))
    return false;
  if (has(op, "value") && !same_double(a->value, b->value)) return false;
  if (has(op, "value2") && !same_double(a->value2, b->value2)) return false;
  if (has(op, "seed") && (a->seed != b->seed || a->offset != b->offset)) return false;
  if (has(op, "conv") && memcmp(&a->conv, &b->conv, sizeof a->conv)) return false;
  return true;
}

static uint64_t mix(uint64_t h, uint64_t v) { /* FNV-1a over the 8 bytes of v */
  for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  return h;
}
static uint64_t mix_double(uint64_t h, double d) {
  uint64_t v;
  memcpy(&v, &d, sizeof v);
  return mix(h, v);
}

int ir_attr_sizes(em_prim op, prim_attrs *a, ir_attr_size *out) {
  int n = 0;
  if (has(op, "shape"))
    for (int i = 0; i < a->shape.ndim && i < EM_MAX_DIMS; i++) out[n++] = (ir_attr_size){&a->shape.sizes[i], NULL, "shape", i};
  if (has(op, "start")) {
    out[n++] = (ir_attr_size){&a->start, NULL, "start", -1};
    out[n++] = (ir_attr_size){&a->stop, NULL, "stop", -1};
    out[n++] = (ir_attr_size){&a->step, NULL, "step", -1};
  }
  if (has(op, "pads"))
    for (int i = 0; i < a->n_pads && i < 2 * EM_MAX_DIMS; i++) out[n++] = (ir_attr_size){&a->pads[i], NULL, "pads", i};
  if (has(op, "value")) out[n++] = (ir_attr_size){NULL, &a->value, "value", -1};
  if (has(op, "value2")) out[n++] = (ir_attr_size){NULL, &a->value2, "value2", -1};
  return n;
}

uint64_t ir_attrs_hash(em_prim op, const prim_attrs *a, uint64_t h) {
  if (has(op, "axes")) {
    h = mix(h, (uint64_t)a->n_axes);
    for (int i = 0; i < a->n_axes; i++) h = mix(h, (uint64_t)a->axes[i]);
  }
  if (has(op, "keepdim")) h = mix(h, a->keepdim);
  if (has(op, "descending")) h = mix(h, a->descending);
  if (has(op, "shape")) {
    h = mix(h, (uint64_t)a->shape.ndim);
    for (int i = 0; i < a->shape.ndim; i++) h = mix(h, (uint64_t)a->shape.sizes[i]);
  }
  if (has(op, "dtype")) h = mix(h, (uint64_t)a->dtype);
  if (has(op, "start")) h = mix(mix(mix(h, (uint64_t)a->start), (uint64_t)a->stop), (uint64_t)a->step);
  if (has(op, "pads")) {
    h = mix(h, (uint64_t)a->n_pads);
    for (int i = 0; i < a->n_pads; i++) h = mix(h, (uint64_t)a->pads[i]);
  }
  if (has(op, "value")) h = mix_double(h, a->value);
  if (has(op, "value2")) h = mix_double(h, a->value2);
  if (has(op, "seed")) h = mix(mix(h, a->seed), a->offset);
  if (has(op, "conv")) {
    const em_conv2d_params *c = &a->conv;
    for (int i = 0; i < 2; i++) h = mix(mix(mix(h, (uint64_t)c->stride[i]), (uint64_t)c->padding[i]), (uint64_t)c->dilation[i]);
    h = mix(h, (uint64_t)c->groups);
  }
  return h;
}

static uint64_t hash_type(const ir_type *t, uint64_t h) {
  h = mix(mix(mix(h, (uint64_t)t->dtype), (uint64_t)t->device), (uint64_t)t->ndim);
  for (int i = 0; i < t->ndim; i++) h = mix(h, (uint64_t)t->sizes[i]);
  return h;
}

uint64_t ir_graph_hash(const ir_graph *g) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = mix(mix(h, (uint64_t)g->n_inputs), (uint64_t)g->n_nodes);
  for (int i = 0; i < g->n_inputs; i++) h = hash_type(&g->values[g->inputs[i]].type, h);
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    h = mix(mix(h, (uint64_t)n->op), (uint64_t)n->n_in);
    for (int j = 0; j < n->n_in; j++) h = mix(h, (uint64_t)ir_operands(g, n)[j]);
    h = ir_attrs_hash(n->op, &n->attrs, h);
    h = hash_type(&g->values[n->out].type, h);
  }
  h = mix(h, (uint64_t)g->n_outputs);
  for (int i = 0; i < g->n_outputs; i++) h = mix(h, (uint64_t)g->outputs[i]);
  return h;
}

bool ir_graph_same_structure(const ir_graph *a, const ir_graph *b) {
  if (a->n_inputs != b->n_inputs || a->n_nodes != b->n_nodes || a->n_outputs != b->n_outputs ||
      a->n_values != b->n_values || a->n_sexprs != b->n_sexprs)
    return false;
  for (int i = 0; i < a->n_values; i++)
    if (!ir_type_equal(&a->values[i].type, &b->values[i].type) || a->values[i].def != b->values[i].def) return false;
  if (memcmp(a->inputs, b->inputs, sizeof(int) * (size_t)a->n_inputs) ||
      memcmp(a->outputs, b->outputs, sizeof(int) * (size_t)a->n_outputs))
    return false;
  for (int i = 0; i < a->n_sexprs; i++)
    if (memcmp(&a->sexprs[i], &b->sexprs[i], sizeof(ir_sexpr))) return false;
  for (int i = 0; i < a->n_nodes; i++) {
    const ir_node *x = &a->nodes[i], *y = &b->nodes[i];
    if (x->op != y->op || x->n_in != y->n_in || x->out != y->out ||
        memcmp(ir_operands(a, x), ir_operands(b, y), sizeof(int) * (size_t)x->n_in) ||
        !ir_attrs_equal(x->op, &x->attrs, &y->attrs))
      return false;
  }
  return true;
}

void ir_count_uses(const ir_graph *g, int *uses) {
  memset(uses, 0, sizeof(int) * (size_t)g->n_values);
  for (int i = 0; i < g->n_nodes; i++) /* by node: a node rewritten in place may leave stale slots */
    for (int j = 0; j < g->nodes[i].n_in; j++) uses[ir_operands(g, &g->nodes[i])[j]]++;
  for (int i = 0; i < g->n_outputs; i++) uses[g->outputs[i]]++;
}

bool ir_graph_compact(ir_graph *g, const bool *keep, int *remap_out) {
  int nv = g->n_values;
  int *remap = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
  ir_value *values = malloc(sizeof(ir_value) * (size_t)(nv ? nv : 1));
  ir_node *nodes = malloc(sizeof(ir_node) * (size_t)(g->n_nodes ? g->n_nodes : 1));
  int *ops = malloc(sizeof(int) * (size_t)(g->n_operands ? g->n_operands : 1));
  if (!remap || !values || !nodes || !ops) {
    free(remap), free(values), free(nodes), free(ops);
    return false;
  }
  for (int i = 0; i < nv; i++) remap[i] = -1;
  int v = 0, k = 0, o = 0;
  for (int i = 0; i < g->n_inputs; i++) {
    remap[g->inputs[i]] = v;
    values[v] = g->values[g->inputs[i]];
    g->inputs[i] = v++;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    if (keep && !keep[i]) continue;
    ir_node n = g->nodes[i];
    const int *in = ir_operands(g, &g->nodes[i]);
    n.in_at = o;
    for (int j = 0; j < n.n_in; j++) ops[o++] = remap[in[j]];
    remap[n.out] = v;
    values[v] = g->values[n.out];
    values[v].def = k;
    n.out = v++;
    nodes[k++] = n;
  }
  for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = remap[g->outputs[i]];
  int old_nodes = g->n_nodes, old_ops = g->n_operands;
  free(g->values), free(g->nodes), free(g->operands);
  g->values = values, g->n_values = v, g->cap_values = nv ? nv : 1;
  g->nodes = nodes, g->n_nodes = k, g->cap_nodes = old_nodes ? old_nodes : 1;
  g->operands = ops, g->n_operands = o, g->cap_operands = old_ops ? old_ops : 1;
  if (remap_out) memcpy(remap_out, remap, sizeof(int) * (size_t)nv);
  free(remap);
  return true;
}
