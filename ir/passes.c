/* ir/passes.c: dead-code elimination, common-subexpression elimination, constant folding and
 * algebraic simplification (a table of rewrite rules), run to a fixed point by ir_optimize.
 *
 * Every rewrite here is exact: the optimised graph computes the same bits as the original
 * (forward values; a gradient summed over two CSE'd uses may round differently, which is why
 * the "eager" backend runs DCE only). Hence two choices:
 *  - x + 0 -> x only when the constant is -0.0 or the dtype is integral: x + (+0.0) turns a
 *    -0.0 into +0.0, so it is not an identity in IEEE arithmetic (LLVM's fadd rule is the same);
 *  - constants are folded by running the prim's own reference kernel, so a folded exp(c) is the
 *    value eager execution would have produced.
 * Random prims (P_RANDOM) are never removed or merged: each consumes a block of the generator's
 * counters when it runs, so dropping one would shift every later random value. */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

static bool impure(em_prim op) { return prim_get(op)->flags & P_RANDOM; }

/* ---- DCE ---- */

int ir_pass_dce(ir_graph *g) {
  int *uses = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
  bool *keep = malloc(sizeof(bool) * (size_t)(g->n_nodes ? g->n_nodes : 1));
  if (!uses || !keep) {
    free(uses), free(keep);
    return -1;
  }
  ir_count_uses(g, uses);
  int removed = 0;
  for (int i = g->n_nodes - 1; i >= 0; i--) {
    const ir_node *n = &g->nodes[i];
    keep[i] = uses[n->out] > 0 || impure(n->op);
    if (keep[i]) continue;
    removed++;
    for (int j = 0; j < n->n_in; j++) uses[ir_operands(g, n)[j]]--;
  }
  bool ok = !removed || ir_graph_compact(g, keep, NULL);
  free(uses), free(keep);
  return ok ? removed : -1;
}

/* Replaces every use of a value by repl[value] (when repl[value] >= 0), following chains. */
static int resolve(const int *repl, int v) {
  while (repl[v] >= 0) v = repl[v];
  return v;
}
static void apply_repl(ir_graph *g, const int *repl) {
  for (int i = 0; i < g->n_operands; i++) g->operands[i] = resolve(repl, g->operands[i]);
  for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = resolve(repl, g->outputs[i]);
}

/* ---- CSE ---- */

static uint64_t node_hash(const ir_graph *g, const ir_node *n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n->op;
  for (int j = 0; j < n->n_in; j++) h = (h ^ (uint64_t)ir_operands(g, n)[j]) * 0x100000001b3ull;
  const ir_type *t = &g->values[n->out].type;
  h = (h ^ (uint64_t)t->dtype) * 0x100000001b3ull;
  for (int i = 0; i < t->ndim; i++) h = (h ^ (uint64_t)t->sizes[i]) * 0x100000001b3ull;
  return ir_attrs_hash(n->op, &n->attrs, h);
}

static bool same_node(const ir_graph *g, const ir_node *a, const ir_node *b) {
  return a->op == b->op && a->n_in == b->n_in &&
         !memcmp(ir_operands(g, a), ir_operands(g, b), sizeof(int) * (size_t)a->n_in) &&
         ir_type_equal(&g->values[a->out].type, &g->values[b->out].type) && ir_attrs_equal(a->op, &a->attrs, &b->attrs);
}

int ir_pass_cse(ir_graph *g) {
  int cap = 16;
  while (cap < 2 * g->n_nodes) cap *= 2;
  int *table = malloc(sizeof(int) * (size_t)cap);
  int *repl = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
  if (!table || !repl) {
    free(table), free(repl);
    return -1;
  }
  for (int i = 0; i < cap; i++) table[i] = -1;
  for (int i = 0; i < g->n_values; i++) repl[i] = -1;
  int merged = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    ir_node *n = &g->nodes[i];
    int *ops = g->operands + n->in_at;
    for (int j = 0; j < n->n_in; j++) ops[j] = resolve(repl, ops[j]);
    if (impure(n->op)) continue;
    uint64_t h = node_hash(g, n);
    for (int s = (int)(h & (uint64_t)(cap - 1));; s = (s + 1) & (cap - 1)) {
      if (table[s] < 0) {
        table[s] = i;
        break;
      }
      if (same_node(g, &g->nodes[table[s]], n)) {
        repl[n->out] = g->nodes[table[s]].out;
        merged++;
        break;
      }
    }
  }
  apply_repl(g, repl);
  free(table), free(repl);
  if (merged && ir_pass_dce(g) < 0) return -1;
  return merged;
}

/* ---- constants ---- */

/* The value of v when it is a constant: FULL, or a view or copy of one that keeps every element
 * equal (EXPAND, RESHAPE, PERMUTE, SQUEEZE, UNSQUEEZE, SLICE, CLONE, FLIP). */
static bool const_value(const ir_graph *g, int v, double *val) {
  for (;;) {
    int d = g->values[v].def;
    if (d < 0) return false;
    const ir_node *n = &g->nodes[d];
    switch (n->op) {
    case EM_PRIM_FULL:
      *val = n->attrs.value;
      return true;
    case EM_PRIM_EXPAND: case EM_PRIM_RESHAPE: case EM_PRIM_PERMUTE: case EM_PRIM_SQUEEZE:
    case EM_PRIM_UNSQUEEZE: case EM_PRIM_SLICE: case EM_PRIM_CLONE: case EM_PRIM_FLIP: case EM_PRIM_DETACH:
      v = ir_operands(g, n)[0];
      break;
    default:
      return false;
    }
  }
}

/* Turns node n into FULL of its own type with value val. */
static void make_full(ir_graph *g, ir_node *n, double val) {
  const ir_type *t = &g->values[n->out].type;
  n->op = EM_PRIM_FULL;
  n->n_in = 0;
  n->attrs = (prim_attrs){.dtype = t->dtype, .value = val, .shape = {.ndim = t->ndim}};
  for (int i = 0; i < t->ndim; i++) n->attrs.shape.sizes[i] = t->sizes[i];
}

/* Runs a pointwise prim on `lanes` copies of constant operands with its reference kernel and
 * returns element 0 of the result. False if the kernel refuses, or the result does not survive
 * the round trip through the double FULL stores. */
static bool eval_pointwise(em_prim op, const prim_attrs *at, const em_dtype *in_dt, const double *in_val, int n_in,
                           em_dtype out_dt, int64_t lanes, double *out) {
  enum { LANES = 64 };
  _Alignas(64) char bufs[4][LANES * 8];
  _Alignas(64) char obuf[LANES * 8];
  prim_buf in[3], ob = {.data = obuf, .dtype = out_dt, .ndim = 1, .sizes = {lanes}, .strides = {1}};
  for (int j = 0; j < n_in; j++) {
    in[j] = (prim_buf){.data = bufs[j], .dtype = in_dt[j], .ndim = 1, .sizes = {lanes}, .strides = {1}};
    prim_attrs fa = {.dtype = in_dt[j], .value = in_val[j], .shape = {1, {lanes}}};
    char err[64];
    if (!prim_run(EM_PRIM_FULL, &fa, &in[j], NULL, 0, err, sizeof err)) return false;
  }
  char err[128];
  if (!prim_run(op, at, &ob, in, n_in, err, sizeof err)) return false;
  *out = prim_load(obuf, out_dt);
  char check[8];
  prim_store(check, out_dt, *out);
  return !memcmp(check, obuf, ir_dtype(out_dt)->size);
}

int ir_pass_fold(ir_graph *g) {
  int folded = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    ir_node *n = &g->nodes[i];
    unsigned f = prim_get(n->op)->flags;
    if (n->op == EM_PRIM_FULL || n->n_in == 0 || n->n_in > 3) continue;
    const ir_type *t = &g->values[n->out].type;
    if (!ir_type_concrete(t)) continue;
    double vals[3];
    em_dtype dts[3];
    bool all = true;
    for (int j = 0; j < n->n_in && all; j++) {
      int v = ir_operands(g, n)[j];
      all = const_value(g, v, &vals[j]);
      dts[j] = g->values[v].type.dtype;
    }
    if (!all) continue;
    double r;
    if (n->op == EM_PRIM_CLONE || n->op == EM_PRIM_FLIP) { /* copies of a constant; views of one stay views */
      r = vals[0];
    } else if (f & P_POINTWISE) {
      if (!ir_dtype(t->dtype)->cpu_compute) continue;
      bool computable = true;
      for (int j = 0; j < n->n_in; j++) computable = computable && ir_dtype(dts[j])->cpu_compute;
      int64_t numel = ir_numel(t->ndim, t->sizes);
      int64_t lanes = numel < 1 ? 1 : numel < 64 ? numel : 64;
      if (!computable || !eval_pointwise(n->op, &n->attrs, dts, vals, n->n_in, t->dtype, lanes, &r)) continue;
    } else {
      continue;
    }
    make_full(g, n, r);
    folded++;
  }
  if (folded && ir_pass_dce(g) < 0) return -1;
  return folded;
}

/* ---- algebraic simplification ---- */

/* A rule looks at node n (operands already resolved) and either returns the value that replaces
 * n's result, or rewrites n in place and returns n->out, or returns -1 (no match). */
typedef int (*rewrite_fn)(ir_graph *g, ir_node *n);

static const ir_type *type_of(const ir_graph *g, int v) { return &g->values[v].type; }
static const ir_node *def_of(const ir_graph *g, int v) {
  int d = g->values[v].def;
  return d < 0 ? NULL : &g->nodes[d];
}
static bool is_const(const ir_graph *g, int v, double want) {
  double x;
  return const_value(g, v, &x) && x == want;
}
static bool is_neg_zero(const ir_graph *g, int v) {
  double x;
  return const_value(g, v, &x) && x == 0 && __builtin_signbit(x);
}
/* Operand k replaces n when it has n's type. */
static int same_as(const ir_graph *g, const ir_node *n, int k) {
  int v = ir_operands(g, n)[k];
  return ir_type_equal(type_of(g, v), type_of(g, n->out)) ? v : -1;
}

static int rule_mul_one(ir_graph *g, ir_node *n) { /* x * 1 -> x, 1 * x -> x */
  if (n->op != EM_PRIM_MUL) return -1;
  const int *o = ir_operands(g, n);
  if (is_const(g, o[1], 1)) return same_as(g, n, 0);
  if (is_const(g, o[0], 1)) return same_as(g, n, 1);
  return -1;
}

static int rule_add_zero(ir_graph *g, ir_node *n) { /* x + 0 -> x (see the top of the file) */
  if (n->op != EM_PRIM_ADD) return -1;
  const int *o = ir_operands(g, n);
  bool exact_zero_ok = !ir_is_float(type_of(g, n->out)->dtype);
  for (int k = 0; k < 2; k++)
    if (is_neg_zero(g, o[1 - k]) || (exact_zero_ok && is_const(g, o[1 - k], 0))) return same_as(g, n, k);
  return -1;
}

static int rule_sub_zero(ir_graph *g, ir_node *n) { /* x - (+0) -> x: exact, -0 - 0 = -0 */
  if (n->op != EM_PRIM_SUB) return -1;
  const int *o = ir_operands(g, n);
  double c;
  if (const_value(g, o[1], &c) && c == 0 && !__builtin_signbit(c)) return same_as(g, n, 0);
  return -1;
}

static int rule_div_one(ir_graph *g, ir_node *n) { /* x / 1 -> x */
  if (n->op != EM_PRIM_DIV || !is_const(g, ir_operands(g, n)[1], 1)) return -1;
  return same_as(g, n, 0);
}

static int rule_neg_neg(ir_graph *g, ir_node *n) { /* -(-x) -> x */
  if (n->op != EM_PRIM_NEG) return -1;
  const ir_node *d = def_of(g, ir_operands(g, n)[0]);
  if (!d || d->op != EM_PRIM_NEG) return -1;
  int x = ir_operands(g, d)[0];
  return ir_type_equal(type_of(g, x), type_of(g, n->out)) ? x : -1;
}

static int rule_convert_same(ir_graph *g, ir_node *n) { /* convert(x, dtype of x) -> x */
  if (n->op != EM_PRIM_CONVERT) return -1;
  return same_as(g, n, 0);
}

static int rule_identity_view(ir_graph *g, ir_node *n) {
  /* reshape, expand, permute, squeeze, unsqueeze to the same type and contents -> x */
  switch (n->op) {
  case EM_PRIM_RESHAPE: case EM_PRIM_EXPAND: case EM_PRIM_SQUEEZE:
    return same_as(g, n, 0);
  case EM_PRIM_PERMUTE:
    for (int i = 0; i < n->attrs.n_axes; i++)
      if (n->attrs.axes[i] != i) return -1;
    return same_as(g, n, 0);
  case EM_PRIM_SLICE: {
    int x = ir_operands(g, n)[0];
    if (n->attrs.step != 1 || n->attrs.start != 0) return -1;
    return same_as(g, n, 0) >= 0 ? x : -1;
  }
  default:
    return -1;
  }
}

static int rule_permute_permute(ir_graph *g, ir_node *n) { /* permute(permute(x, p), q) -> permute(x, p[q]) */
  if (n->op != EM_PRIM_PERMUTE) return -1;
  const ir_node *d = def_of(g, ir_operands(g, n)[0]);
  if (!d || d->op != EM_PRIM_PERMUTE || d->attrs.n_axes != n->attrs.n_axes) return -1;
  int64_t composed[EM_MAX_DIMS];
  for (int i = 0; i < n->attrs.n_axes; i++) composed[i] = d->attrs.axes[n->attrs.axes[i]];
  g->operands[n->in_at] = ir_operands(g, d)[0];
  memcpy(n->attrs.axes, composed, sizeof(int64_t) * (size_t)n->attrs.n_axes);
  return n->out;
}

static int rule_reshape_reshape(ir_graph *g, ir_node *n) { /* reshape(reshape(x)) -> reshape(x) */
  if (n->op != EM_PRIM_RESHAPE) return -1;
  const ir_node *d = def_of(g, ir_operands(g, n)[0]);
  if (!d || (d->op != EM_PRIM_RESHAPE && d->op != EM_PRIM_SQUEEZE && d->op != EM_PRIM_UNSQUEEZE)) return -1;
  g->operands[n->in_at] = ir_operands(g, d)[0];
  return n->out;
}

static int rule_expand_expand(ir_graph *g, ir_node *n) { /* expand(expand(x)) -> expand(x) */
  if (n->op != EM_PRIM_EXPAND) return -1;
  const ir_node *d = def_of(g, ir_operands(g, n)[0]);
  if (!d || d->op != EM_PRIM_EXPAND) return -1;
  g->operands[n->in_at] = ir_operands(g, d)[0];
  return n->out;
}

static int rule_where_same(ir_graph *g, ir_node *n) { /* where(c, x, x) -> x */
  if (n->op != EM_PRIM_WHERE) return -1;
  const int *o = ir_operands(g, n);
  return o[1] == o[2] ? same_as(g, n, 1) : -1;
}

static const struct {
  const char *name;
  rewrite_fn fn;
} rules[] = {
    {"mul_one", rule_mul_one},
    {"add_zero", rule_add_zero},
    {"sub_zero", rule_sub_zero},
    {"div_one", rule_div_one},
    {"neg_neg", rule_neg_neg},
    {"convert_same_dtype", rule_convert_same},
    {"identity_view", rule_identity_view},
    {"permute_permute", rule_permute_permute},
    {"reshape_reshape", rule_reshape_reshape},
    {"expand_expand", rule_expand_expand},
    {"where_same", rule_where_same},
};
#define N_RULES (int)(sizeof rules / sizeof rules[0])

const char *const ir_rewrite_rule_names[N_RULES + 1] = {
    "mul_one", "add_zero", "sub_zero", "div_one", "neg_neg", "convert_same_dtype", "identity_view",
    "permute_permute", "reshape_reshape", "expand_expand", "where_same", NULL};
_Static_assert(sizeof ir_rewrite_rule_names / sizeof ir_rewrite_rule_names[0] == N_RULES + 1, "rule names");

int ir_pass_simplify(ir_graph *g) {
  int *repl = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
  if (!repl) return -1;
  for (int i = 0; i < g->n_values; i++) repl[i] = -1;
  int changed = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    ir_node *n = &g->nodes[i];
    int *ops = g->operands + n->in_at;
    for (int j = 0; j < n->n_in; j++) ops[j] = resolve(repl, ops[j]);
    for (int r = 0; r < N_RULES; r++) {
      int v = rules[r].fn(g, n);
      if (v < 0) continue;
      changed++;
      if (v != n->out) {
        repl[n->out] = v;
        break;
      }
      /* rewritten in place: let the other rules look at the new form */
    }
  }
  apply_repl(g, repl);
  free(repl);
  if (changed && ir_pass_dce(g) < 0) return -1;
  return changed;
}

/* Constants as expanded scalars: full(shape=S, v) with more than one element becomes
 * expand(full([], v), S), a view of one element. An interpreter then fills one element instead
 * of S, the partitioner sees a cheap constant, and a code generator a broadcast. Rebuilds the
 * graph (the scalar must come before its expand). Returns the number rewritten, -1 on OOM. */
int ir_pass_scalar_constants(ir_graph *g) {
  int count = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == EM_PRIM_FULL && ir_type_concrete(&g->values[g->nodes[i].out].type) &&
        ir_numel(g->nodes[i].attrs.shape.ndim, g->nodes[i].attrs.shape.sizes) > 1)
      count++;
  if (!count) return 0;
  ir_graph *h = ir_graph_new(g->name);
  int *map = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
  bool ok = h && map;
  for (int i = 0; ok && i < g->n_inputs; i++) ok = (map[g->inputs[i]] = ir_add_input(h, &g->values[g->inputs[i]].type)) >= 0;
  int small[64];
  for (int i = 0; ok && i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    ir_type t = g->values[n->out].type;
    if (n->op == EM_PRIM_FULL && ir_type_concrete(&t) && ir_numel(n->attrs.shape.ndim, n->attrs.shape.sizes) > 1) {
      prim_attrs sa = n->attrs, ea = {.shape = {.ndim = t.ndim}};
      sa.shape.ndim = 0;
      for (int d = 0; d < t.ndim; d++) ea.shape.sizes[d] = t.sizes[d];
      ir_type st = {.dtype = t.dtype, .device = t.device, .ndim = 0};
      int sv = ir_add_node(h, EM_PRIM_FULL, NULL, 0, &sa, &st, n->site, n->opname);
      ok = sv >= 0 && (map[n->out] = ir_add_node(h, EM_PRIM_EXPAND, &sv, 1, &ea, &t, n->site, n->opname)) >= 0;
      continue;
    }
    int *in = n->n_in <= 64 ? small : malloc(sizeof(int) * (size_t)n->n_in);
    if (!in) {
      ok = false;
      break;
    }
    for (int k = 0; k < n->n_in; k++) in[k] = map[ir_operands(g, n)[k]];
    int v = ir_add_node(h, n->op, in, n->n_in, &n->attrs, &t, n->site, n->opname);
    if (in != small) free(in);
    ok = v >= 0;
    if (ok) map[n->out] = v, h->nodes[h->n_nodes - 1].rng_slot = n->rng_slot;
  }
  for (int i = 0; ok && i < g->n_outputs; i++) ok = ir_add_output(h, map[g->outputs[i]]);
  free(map);
  if (!ok) {
    ir_graph_free(h);
    return -1;
  }
  ir_graph tmp = *g; /* swap contents, keep g's address */
  *g = *h;
  *h = tmp;
  ir_graph_free(h);
  return count;
}

bool ir_optimize(ir_graph *g, ir_pass_stats *stats) {
  ir_pass_stats s = {0};
  for (;;) {
    s.rounds++;
    int a = ir_pass_simplify(g), b = a < 0 ? -1 : ir_pass_fold(g), c = b < 0 ? -1 : ir_pass_cse(g),
        d = c < 0 ? -1 : ir_pass_dce(g), e = d < 0 ? -1 : ir_pass_scalar_constants(g);
    if (a < 0 || b < 0 || c < 0 || d < 0 || e < 0) return false;
    a += e;
    s.simplified += a, s.folded += b, s.cse += c, s.dce += d;
    if ((a == 0 && b == 0 && c == 0 && d == 0) || s.rounds >= 32) break;
  }
  if (stats) *stats = s;
  return true;
}
