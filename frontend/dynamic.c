/* frontend/dynamic.c: symbolic sizes recovered from probe traces (frontend.h, ember.h's "Dynamic
 * shapes").
 *
 * Why probes and not symbolic integers. PyTorch makes x.size(0) a SymInt whose arithmetic
 * records a formula; a C function gets an int64_t from em_size and multiplies it with `*`, so
 * the formula is gone by the time a reshape receives B * T. What is left is the function
 * itself: run it again at other sizes and see how each number moves. A number that is a
 * polynomial in the symbols, linear in each one, is fixed by its values at the 2^k corners of a
 * box (multilinear interpolation), and the model code that feeds sizes into ops is made of
 * exactly those (B, B * T, T + 1, B * T * C, C / n_head where C is fixed). The formulas are then
 * tested against traces at unrelated sizes, which catches what interpolation cannot see:
 * branches on sizes, divisions, squares.
 *
 * The arithmetic: with u_k = (s_k - r_k) / delta_k, the corner values F(U) give
 * f = sum_T a_T prod_{k in T} u_k, a_T = sum_{U subset T} (-1)^{|T| - |U|} F(U) (Moebius). In the
 * symbols' own basis, c_S = sum_{T superset S} a_T / delta_T * prod_{k in T \ S} (-r_k), computed
 * over the common denominator prod_k delta_k in 128-bit integers and required to divide exactly. */
#include "frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NCOEF = 1 << FE_DYN_MAX_SYMS };
typedef struct poly {
  int64_t c[NCOEF]; /* c[S]: the coefficient of prod_{k in S} s_k (S a bit set; c[0] the constant) */
} poly;

typedef enum { SLOT_SIZE, SLOT_ATTR } slot_kind;
typedef struct slot {
  slot_kind kind;
  int index; /* SLOT_SIZE: value id; SLOT_ATTR: node index */
  int field; /* SLOT_SIZE: dim; SLOT_ATTR: position in ir_attr_sizes' list */
  poly p;
} slot;

struct fe_dyn {
  int n_syms;
  ir_graph *base;
  slot *slots;
  int n_slots, cap_slots;
};

void fe_dyn_free(fe_dyn *d) {
  if (!d) return;
  ir_graph_free(d->base);
  free(d->slots);
  free(d);
}

int fe_dyn_slots(const fe_dyn *d) { return d ? d->n_slots : 0; }

static const char *site_of(const ir_graph *g, int node, char *buf, size_t cap) {
  const ir_node *n = &g->nodes[node];
  snprintf(buf, cap, "%%%d = %s at %s:%d", n->out, prim_get(n->op)->name, n->site.file ? n->site.file : "?", n->site.line);
  return buf;
}

/* The node or input that defines value v, for messages. */
static const char *value_site(const ir_graph *g, int v, char *buf, size_t cap) {
  if (g->values[v].def < 0) {
    int k = 0;
    while (k < g->n_inputs && g->inputs[k] != v) k++;
    snprintf(buf, cap, "graph input %d", k);
    return buf;
  }
  return site_of(g, g->values[v].def, buf, cap);
}

/* Same nodes, operands, dtypes, ranks and structural attributes: only the numbers sizes flow
 * into may differ. */
static bool same_skeleton(const ir_graph *a, const ir_graph *b, char *why, size_t cap) {
  char s[256];
  if (a->n_inputs != b->n_inputs || a->n_nodes != b->n_nodes || a->n_values != b->n_values ||
      a->n_outputs != b->n_outputs) {
    int n = a->n_nodes < b->n_nodes ? a->n_nodes : b->n_nodes, i = 0;
    while (i < n && a->nodes[i].op == b->nodes[i].op) i++;
    if (i < n) return snprintf(why, cap, "the program differs at other sizes from %s on", site_of(a, i, s, sizeof s)), false;
    return snprintf(why, cap, "the program records %d nodes at one size and %d at another (a loop over a size?)",
                    a->n_nodes, b->n_nodes), false;
  }
  for (int i = 0; i < a->n_inputs; i++)
    if (a->inputs[i] != b->inputs[i]) return snprintf(why, cap, "graph inputs differ at other sizes"), false;
  for (int i = 0; i < a->n_outputs; i++)
    if (a->outputs[i] != b->outputs[i]) return snprintf(why, cap, "graph outputs differ at other sizes"), false;
  for (int v = 0; v < a->n_values; v++) {
    const ir_type *x = &a->values[v].type, *y = &b->values[v].type;
    if (x->dtype != y->dtype || x->device != y->device || x->ndim != y->ndim || a->values[v].def != b->values[v].def)
      return snprintf(why, cap, "the type of %s changes rank or dtype with the sizes", value_site(a, v, s, sizeof s)), false;
  }
  for (int i = 0; i < a->n_nodes; i++) {
    const ir_node *x = &a->nodes[i], *y = &b->nodes[i];
    if (x->op != y->op || x->n_in != y->n_in || x->out != y->out || x->rng_slot != y->rng_slot ||
        memcmp(ir_operands(a, x), ir_operands(b, y), sizeof(int) * (size_t)x->n_in))
      return snprintf(why, cap, "the program differs at other sizes from %s on", site_of(a, i, s, sizeof s)), false;
    prim_attrs ax = x->attrs, by = y->attrs;
    ir_attr_size fa[IR_ATTR_SIZES_MAX], fb[IR_ATTR_SIZES_MAX];
    int na = ir_attr_sizes(x->op, &ax, fa), nb = ir_attr_sizes(y->op, &by, fb);
    if (na != nb) return snprintf(why, cap, "%s changes rank with the sizes", site_of(a, i, s, sizeof s)), false;
    for (int f = 0; f < na; f++) { /* equal sized fields, then the rest must match as they are */
      if (fa[f].i) *fa[f].i = *fb[f].i;
      else *fa[f].d = *fb[f].d;
    }
    if (!ir_attrs_equal(x->op, &ax, &by))
      return snprintf(why, cap, "an attribute of %s other than a size changes with the sizes", site_of(a, i, s, sizeof s)),
             false;
  }
  return true;
}

static int popcount(int m) { return __builtin_popcount((unsigned)m); }

/* The polynomial through F[mask] at the corners, or false when its coefficients are not
 * integers (then the number is no such polynomial). */
static bool interpolate(const int64_t *F, int k, const int64_t *r, const int64_t *delta, poly *p) {
  int n = 1 << k;
  __int128 a[NCOEF];
  for (int T = 0; T < n; T++) {
    a[T] = 0;
    for (int U = T;; U = (U - 1) & T) { /* every subset U of T */
      a[T] += (popcount(T) - popcount(U)) % 2 ? -(__int128)F[U] : (__int128)F[U];
      if (!U) break;
    }
  }
  __int128 D = 1;
  for (int j = 0; j < k; j++) D *= delta[j];
  memset(p, 0, sizeof *p);
  for (int S = 0; S < n; S++) {
    __int128 num = 0;
    for (int T = 0; T < n; T++) {
      if ((T & S) != S) continue;
      __int128 t = a[T];
      for (int j = 0; j < k; j++) {
        if (!(T >> j & 1)) t *= delta[j]; /* over the common denominator */
        else if (!(S >> j & 1)) t *= -r[j];
      }
      num += t;
    }
    if (num % D) return false;
    __int128 c = num / D;
    if (c > INT64_MAX || c < INT64_MIN) return false;
    p->c[S] = (int64_t)c;
  }
  return true;
}

/* p at syms, or false when it leaves int64_t. */
static bool eval(const poly *p, int k, const int64_t *syms, int64_t *out) {
  __int128 v = 0;
  for (int S = 0; S < (1 << k); S++) {
    if (!p->c[S]) continue;
    __int128 t = p->c[S];
    for (int j = 0; j < k; j++)
      if (S >> j & 1) {
        t *= syms[j];
        if (t > ((__int128)1 << 100) || t < -((__int128)1 << 100)) return false;
      }
    v += t;
  }
  if (v > INT64_MAX || v < INT64_MIN) return false;
  *out = (int64_t)v;
  return true;
}

static void fmt_poly(char *buf, size_t cap, const poly *p, int k) {
  size_t n = 0;
  buf[0] = 0;
  for (int S = (1 << k) - 1; S >= 0; S--) {
    int64_t c = p->c[S];
    if (!c || n >= cap) continue;
    bool first = n == 0;
    if (!first) n += (size_t)snprintf(buf + n, cap - n, c < 0 ? " - " : " + ");
    else if (c < 0) n += (size_t)snprintf(buf + n, cap - n, "-");
    int64_t m = c < 0 ? -c : c;
    bool any = false;
    for (int j = 0; j < k && n < cap; j++)
      if (S >> j & 1) n += (size_t)snprintf(buf + n, cap - n, "%ss%d", any ? "*" : "", j), any = true;
    if (n < cap && (m != 1 || !any)) n += (size_t)snprintf(buf + n, cap - n, any ? "*%lld" : "%lld", (long long)m);
  }
  if (!buf[0]) snprintf(buf, cap, "0");
}

static bool add_slot(fe_dyn *d, slot s) {
  if (d->n_slots == d->cap_slots) {
    int c = d->cap_slots ? 2 * d->cap_slots : 64;
    slot *p = realloc(d->slots, sizeof(slot) * (size_t)c);
    if (!p) return false;
    d->slots = p, d->cap_slots = c;
  }
  d->slots[d->n_slots++] = s;
  return true;
}

/* The integer a double attribute holds at every corner, or false when one is not integral. */
static bool integral(double x, int64_t *out) {
  if (!(x >= -9007199254740992.0 && x <= 9007199254740992.0) || (double)(int64_t)x != x) return false;
  *out = (int64_t)x;
  return true;
}

fe_dyn *fe_dyn_decode(const ir_graph *const *g, int k, const int64_t *r, const int64_t *delta, char *why, size_t cap) {
  if (k < 1 || k > FE_DYN_MAX_SYMS) return snprintf(why, cap, "%d symbols (1 to %d supported)", k, FE_DYN_MAX_SYMS), NULL;
  int n = 1 << k;
  for (int m = 1; m < n; m++)
    if (!same_skeleton(g[0], g[m], why, cap)) return NULL;
  fe_dyn *d = calloc(1, sizeof *d);
  if (!d || !(d->base = ir_graph_clone(g[0]))) {
    free(d);
    return snprintf(why, cap, "out of memory"), NULL;
  }
  d->n_syms = k;
  char s[256], f[96];
  int64_t F[NCOEF];
  for (int v = 0; v < g[0]->n_values; v++)
    for (int dim = 0; dim < g[0]->values[v].type.ndim; dim++) {
      bool varies = false;
      for (int m = 0; m < n; m++) varies |= (F[m] = g[m]->values[v].type.sizes[dim]) != F[0];
      if (!varies) continue;
      slot sl = {SLOT_SIZE, v, dim, {{0}}};
      if (!interpolate(F, k, r, delta, &sl.p)) {
        snprintf(why, cap, "dim %d of the value of %s is not a polynomial in the sizes (a division or a size-dependent "
                 "branch?)", dim, value_site(g[0], v, s, sizeof s));
        goto fail;
      }
      if (!add_slot(d, sl)) goto oom;
    }
  for (int i = 0; i < g[0]->n_nodes; i++) {
    ir_attr_size fields[NCOEF][IR_ATTR_SIZES_MAX];
    prim_attrs at[NCOEF];
    int nf = 0;
    for (int m = 0; m < n; m++) at[m] = g[m]->nodes[i].attrs, nf = ir_attr_sizes(g[m]->nodes[i].op, &at[m], fields[m]);
    for (int fi = 0; fi < nf; fi++) {
      bool varies = false, whole = true;
      double D0 = fields[0][fi].d ? *fields[0][fi].d : 0;
      for (int m = 0; m < n; m++) {
        if (fields[m][fi].i) F[m] = *fields[m][fi].i;
        else whole &= integral(*fields[m][fi].d, &F[m]);
        varies |= fields[m][fi].i ? F[m] != F[0] : memcmp(fields[m][fi].d, &D0, sizeof D0) != 0;
      }
      if (!varies) continue;
      slot sl = {SLOT_ATTR, i, fi, {{0}}};
      if (!whole || !interpolate(F, k, r, delta, &sl.p)) {
        snprintf(f, sizeof f, "%s", whole ? "not a polynomial in the sizes (a division or a size-dependent branch?)"
                                          : "a fraction that changes with the sizes (a scalar computed from a size?)");
        snprintf(why, cap, "an attribute of %s is %s", site_of(g[0], i, s, sizeof s), f);
        goto fail;
      }
      if (!add_slot(d, sl)) goto oom;
    }
  }
  return d;
oom:
  snprintf(why, cap, "out of memory");
fail:
  fe_dyn_free(d);
  return NULL;
}

ir_graph *fe_dyn_specialize(const fe_dyn *d, const int64_t *syms, char *why, size_t cap) {
  ir_graph *g = ir_graph_clone(d->base);
  if (!g) return snprintf(why, cap, "out of memory"), NULL;
  char s[256];
  for (int i = 0; i < d->n_slots; i++) {
    const slot *sl = &d->slots[i];
    int64_t v;
    bool ok = eval(&sl->p, d->n_syms, syms, &v);
    if (sl->kind == SLOT_SIZE) {
      if (!ok || v < 0) {
        snprintf(why, cap, "dim %d of the value of %s would be %s at these sizes", sl->field,
                 value_site(g, sl->index, s, sizeof s), ok ? "negative" : "out of range");
        ir_graph_free(g);
        return NULL;
      }
      g->values[sl->index].type.sizes[sl->field] = v;
    } else {
      ir_attr_size f[IR_ATTR_SIZES_MAX];
      ir_node *nd = &g->nodes[sl->index];
      ir_attr_sizes(nd->op, &nd->attrs, f);
      if (!ok) {
        snprintf(why, cap, "an attribute of %s would be out of range at these sizes", site_of(g, sl->index, s, sizeof s));
        ir_graph_free(g);
        return NULL;
      }
      if (f[sl->field].i) *f[sl->field].i = v;
      else *f[sl->field].d = (double)v;
    }
  }
  return g;
}

bool fe_dyn_check(const fe_dyn *d, const ir_graph *g, const int64_t *syms, char *why, size_t cap) {
  if (!same_skeleton(d->base, g, why, cap)) return false;
  ir_graph *spec = fe_dyn_specialize(d, syms, why, cap);
  if (!spec) return false;
  char s[256];
  bool ok = true;
  for (int v = 0; ok && v < g->n_values; v++)
    if (memcmp(spec->values[v].type.sizes, g->values[v].type.sizes, sizeof(ir_dim) * (size_t)g->values[v].type.ndim)) {
      snprintf(why, cap, "the sizes of the value of %s follow no formula found at other sizes (a size-dependent branch, "
               "a division or a square?)", value_site(g, v, s, sizeof s));
      ok = false;
    }
  for (int i = 0; ok && i < g->n_nodes; i++)
    if (!ir_attrs_equal(g->nodes[i].op, &spec->nodes[i].attrs, &g->nodes[i].attrs)) {
      snprintf(why, cap, "an attribute of %s follows no formula found at other sizes (a size-dependent branch, a "
               "division or a square?)", site_of(g, i, s, sizeof s));
      ok = false;
    }
  ir_graph_free(spec);
  return ok;
}

char *fe_dyn_describe(const fe_dyn *d, int max) {
  ir_sbuf b = {0};
  char p[160], s[256];
  int shown = 0;
  for (int i = 0; i < d->n_slots; i++) {
    const slot *sl = &d->slots[i];
    if (sl->kind == SLOT_SIZE && d->base->values[sl->index].def >= 0) continue; /* results follow their operands */
    if (shown++ == max) {
      ir_sb_printf(&b, "  ... (%d formulas in all)\n", d->n_slots);
      break;
    }
    fmt_poly(p, sizeof p, &sl->p, d->n_syms);
    if (sl->kind == SLOT_SIZE) {
      ir_sb_printf(&b, "  %s: dim %d = %s\n", value_site(d->base, sl->index, s, sizeof s), sl->field, p);
    } else {
      prim_attrs at = d->base->nodes[sl->index].attrs;
      ir_attr_size f[IR_ATTR_SIZES_MAX];
      ir_attr_sizes(d->base->nodes[sl->index].op, &at, f);
      char nm[48];
      if (f[sl->field].at >= 0) snprintf(nm, sizeof nm, "%s[%d]", f[sl->field].name, f[sl->field].at);
      else snprintf(nm, sizeof nm, "%s", f[sl->field].name);
      ir_sb_printf(&b, "  %s: %s = %s\n", site_of(d->base, sl->index, s, sizeof s), nm, p);
    }
  }
  return ir_sb_finish(&b);
}
