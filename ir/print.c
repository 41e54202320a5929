/* ir/print.c: the text form of a graph and its Graphviz DOT export (see graph.h). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "graph.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void ir_sb_printf(ir_sbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = true;
      return;
    }
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->n + (size_t)k + 1) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->s = p, b->cap = cap;
  }
}

char *ir_sb_finish(ir_sbuf *b) {
  if (b->oom) {
    free(b->s);
    return NULL;
  }
  if (!b->s) return strdup("");
  return b->s;
}

static void put_dim(ir_sbuf *b, const ir_graph *g, ir_dim d) {
  if (!IR_DIM_IS_SYM(d)) {
    ir_sb_printf(b, "%lld", (long long)d);
    return;
  }
  int k = IR_SYM_INDEX(d);
  if (k >= g->n_sexprs) {
    ir_sb_printf(b, "?");
    return;
  }
  const ir_sexpr *e = &g->sexprs[k];
  if (e->kind == IR_SEXPR_SYM) {
    ir_sb_printf(b, "s%d", e->sym);
    return;
  }
  ir_sb_printf(b, "(");
  put_dim(b, g, e->a);
  ir_sb_printf(b, "%s", e->kind == IR_SEXPR_ADD ? "+" : e->kind == IR_SEXPR_MUL ? "*" : "//");
  put_dim(b, g, e->b);
  ir_sb_printf(b, ")");
}

static void put_type(ir_sbuf *b, const ir_graph *g, const ir_type *t) {
  ir_sb_printf(b, "%s[", ir_dtype_valid(t->dtype) ? ir_dtype(t->dtype)->name : "?");
  for (int i = 0; i < t->ndim; i++) {
    if (i) ir_sb_printf(b, ",");
    put_dim(b, g, t->sizes[i]);
  }
  ir_sb_printf(b, "]%s", t->device == EM_CUDA ? "@cuda" : "");
}

char *ir_fmt_ir_type(const ir_graph *g, const ir_type *t, char *buf, size_t cap) {
  ir_sbuf b = {0};
  put_type(&b, g, t);
  snprintf(buf, cap, "%s", b.oom || !b.s ? "?" : b.s);
  free(b.s);
  return buf;
}

static void put_list(ir_sbuf *b, const int64_t *v, int n) {
  ir_sb_printf(b, "[");
  for (int i = 0; i < n; i++) ir_sb_printf(b, "%s%lld", i ? "," : "", (long long)v[i]);
  ir_sb_printf(b, "]");
}

static void put_double(ir_sbuf *b, double v) {
  /* %.17g round-trips every double through strtod; inf and nan print as strtod reads them. */
  char t[40];
  snprintf(t, sizeof t, "%.17g", v);
  ir_sb_printf(b, "%s", t);
}

/* Attributes in schema order, ", name=value" each. */
static void put_attrs(ir_sbuf *b, em_prim op, const prim_attrs *a) {
  const char *s = prim_get(op)->attrs;
  while (*s) {
    while (*s == ' ') s++;
    const char *e = s;
    while (*e && *e != ' ') e++;
    size_t n = (size_t)(e - s);
    if (!n) break;
#define IS(name) (n == strlen(name) && !strncmp(s, name, n))
    if (IS("axes")) ir_sb_printf(b, ", axes="), put_list(b, a->axes, a->n_axes);
    else if (IS("keepdim")) ir_sb_printf(b, ", keepdim=%s", a->keepdim ? "true" : "false");
    else if (IS("descending")) ir_sb_printf(b, ", descending=%s", a->descending ? "true" : "false");
    else if (IS("shape")) ir_sb_printf(b, ", shape="), put_list(b, a->shape.sizes, a->shape.ndim);
    else if (IS("dtype")) ir_sb_printf(b, ", dtype=%s", ir_dtype_valid(a->dtype) ? ir_dtype(a->dtype)->name : "?");
    else if (IS("start")) ir_sb_printf(b, ", start=%lld", (long long)a->start);
    else if (IS("stop")) ir_sb_printf(b, ", stop=%lld", (long long)a->stop);
    else if (IS("step")) ir_sb_printf(b, ", step=%lld", (long long)a->step);
    else if (IS("pads")) ir_sb_printf(b, ", pads="), put_list(b, a->pads, a->n_pads);
    else if (IS("value")) ir_sb_printf(b, ", value="), put_double(b, a->value);
    else if (IS("value2")) ir_sb_printf(b, ", value2="), put_double(b, a->value2);
    else if (IS("seed")) ir_sb_printf(b, ", seed=%llu", (unsigned long long)a->seed);
    else if (IS("offset")) ir_sb_printf(b, ", offset=%llu", (unsigned long long)a->offset);
    else if (IS("conv")) {
      const em_conv2d_params *c = &a->conv;
      ir_sb_printf(b, ", stride=[%lld,%lld], padding=[%lld,%lld], dilation=[%lld,%lld], groups=%lld",
                (long long)c->stride[0], (long long)c->stride[1], (long long)c->padding[0], (long long)c->padding[1],
                (long long)c->dilation[0], (long long)c->dilation[1], (long long)c->groups);
    }
#undef IS
    s = e;
  }
}

static void put_node(ir_sbuf *b, const ir_graph *g, const ir_node *n, bool with_sites) {
  ir_sb_printf(b, "  %%%d : ", n->out);
  put_type(b, g, &g->values[n->out].type);
  ir_sb_printf(b, " = %s(", prim_get(n->op)->name);
  for (int j = 0; j < n->n_in; j++) ir_sb_printf(b, "%s%%%d", j ? ", " : "", ir_operands(g, n)[j]);
  if (n->n_in == 0) {
    /* creation prims: attributes only; drop put_attrs' leading ", " */
    ir_sbuf a = {0};
    put_attrs(&a, n->op, &n->attrs);
    if (a.oom) b->oom = true;
    else if (a.s) ir_sb_printf(b, "%s", a.s + 2);
    free(a.s);
  } else {
    put_attrs(b, n->op, &n->attrs);
  }
  ir_sb_printf(b, ")");
  if (with_sites && n->site.file) {
    ir_sb_printf(b, "  # %s:%d", n->site.file, n->site.line);
    if (n->site.func) ir_sb_printf(b, " %s", n->site.func);
  }
  ir_sb_printf(b, "\n");
}

char *ir_print(const ir_graph *g, bool with_sites) {
  ir_sbuf b = {0};
  ir_sb_printf(&b, "graph %s(", g->name);
  for (int i = 0; i < g->n_inputs; i++) {
    ir_sb_printf(&b, "%s%%%d : ", i ? ", " : "", g->inputs[i]);
    put_type(&b, g, &g->values[g->inputs[i]].type);
  }
  ir_sb_printf(&b, ") {\n");
  for (int i = 0; i < g->n_nodes; i++) put_node(&b, g, &g->nodes[i], with_sites);
  ir_sb_printf(&b, "  return");
  for (int i = 0; i < g->n_outputs; i++) ir_sb_printf(&b, "%s %%%d", i ? "," : "", g->outputs[i]);
  ir_sb_printf(&b, "\n}\n");
  return ir_sb_finish(&b);
}

bool ir_print_file(const ir_graph *g, FILE *f) {
  char *s = ir_print(g, true);
  if (!s) return false;
  bool ok = fputs(s, f) >= 0;
  free(s);
  return ok;
}

static const char *family_colour(em_prim op) {
  unsigned f = prim_get(op)->flags;
  if (f & (P_EXTERN | P_SCAN)) return "#f4a582";
  if (f & P_REDUCTION) return "#92c5de";
  if (f & P_VIEW) return "#e0e0e0";
  if (f & (P_MOVEMENT | P_INDEXING)) return "#d9f0d3";
  if (f & P_CREATION) return "#fee08b";
  return "#ffffff"; /* pointwise */
}

char *ir_to_dot(const ir_graph *g) {
  ir_sbuf b = {0};
  ir_sb_printf(&b, "digraph \"%s\" {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n", g->name);
  for (int i = 0; i < g->n_inputs; i++) {
    int v = g->inputs[i];
    ir_sb_printf(&b, "  v%d [shape=ellipse, label=\"input %d\\n%%%d : ", v, i, v);
    put_type(&b, g, &g->values[v].type);
    ir_sb_printf(&b, "\"];\n");
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    ir_sb_printf(&b, "  v%d [shape=box, style=filled, fillcolor=\"%s\", label=\"%%%d = %s\\n", n->out,
              family_colour(n->op), n->out, prim_get(n->op)->name);
    put_type(&b, g, &g->values[n->out].type);
    if (n->site.file) {
      const char *base = strrchr(n->site.file, '/');
      ir_sb_printf(&b, "\\n%s:%d", base ? base + 1 : n->site.file, n->site.line);
    }
    ir_sb_printf(&b, "\"];\n");
    for (int j = 0; j < n->n_in; j++) ir_sb_printf(&b, "  v%d -> v%d;\n", ir_operands(g, n)[j], n->out);
  }
  for (int i = 0; i < g->n_outputs; i++) {
    ir_sb_printf(&b, "  out%d [shape=ellipse, style=bold, label=\"output %d\"];\n", i, i);
    ir_sb_printf(&b, "  v%d -> out%d;\n", g->outputs[i], i);
  }
  ir_sb_printf(&b, "}\n");
  return ir_sb_finish(&b);
}
