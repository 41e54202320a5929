/* ir/parse.c: reads the text form printed by ir_print back into a graph.
 *
 * A hand-written recursive-descent parser over the grammar
 *   graph   := "graph" NAME "(" [input ("," input)*] ")" "{" node* "return" [val ("," val)*] "}"
 *   input   := val ":" type
 *   node    := val ":" type "=" PRIM "(" [arg ("," arg)*] ")" ["#" FILE ":" LINE [FUNC]]
 *   arg     := val | NAME "=" attr
 *   type    := DTYPE "[" [dim ("," dim)*] "]" ["@cuda"]
 *   dim     := INT | "s" INT | "(" dim ("+" | "*" | "//") dim ")"
 * Value numbers in the text are names: they are renumbered in order of definition. A comment
 * runs to the end of the line. Errors carry the line and column. */
#include "graph.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
  const char *s, *p, *line_start;
  int line;
  char *err;
  size_t cap;
  bool failed;
  ir_graph *g;
  int *names; /* text value number -> value id (-1 undefined) */
  int n_names;
  int *syms; /* text symbol number -> ir_dim */
  int n_syms;
} parser;

static bool fail(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(parser *ps, const char *fmt, ...) {
  if (ps->failed) return false;
  ps->failed = true;
  int n = snprintf(ps->err, ps->cap, "line %d, column %d: ", ps->line, (int)(ps->p - ps->line_start) + 1);
  if (n < 0 || (size_t)n >= ps->cap) return false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ps->err + n, ps->cap - (size_t)n, fmt, ap);
  va_end(ap);
  return false;
}

/* Skips blanks (not newlines) only. */
static void blanks(parser *ps) {
  while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r') ps->p++;
}

/* Skips all whitespace and newlines. */
static void space(parser *ps) {
  for (;;) {
    blanks(ps);
    if (*ps->p == '\n') {
      ps->p++;
      ps->line++;
      ps->line_start = ps->p;
    } else {
      return;
    }
  }
}

static bool eat(parser *ps, const char *tok) {
  blanks(ps);
  size_t n = strlen(tok);
  if (strncmp(ps->p, tok, n)) return false;
  ps->p += n;
  return true;
}

static bool expect(parser *ps, const char *tok) {
  if (eat(ps, tok)) return true;
  char near[16];
  snprintf(near, sizeof near, "%.10s", ps->p);
  for (char *c = near; *c; c++)
    if (*c == '\n') *c = 0;
  return fail(ps, "expected '%s' but found '%s'", tok, near);
}

static bool ident(parser *ps, char *out, size_t cap) {
  blanks(ps);
  size_t n = 0;
  while (isalnum((unsigned char)ps->p[n]) || ps->p[n] == '_') n++;
  if (!n) return fail(ps, "expected a name");
  if (n >= cap) return fail(ps, "name too long");
  memcpy(out, ps->p, n);
  out[n] = 0;
  ps->p += n;
  return true;
}

static bool integer(parser *ps, int64_t *v) {
  blanks(ps);
  char *end;
  errno = 0;
  long long x = strtoll(ps->p, &end, 10);
  if (end == ps->p || errno) return fail(ps, "expected an integer");
  ps->p = end;
  *v = x;
  return true;
}

static bool unsigned_integer(parser *ps, uint64_t *v) {
  blanks(ps);
  char *end;
  errno = 0;
  if (*ps->p == '-') return fail(ps, "expected an unsigned integer");
  unsigned long long x = strtoull(ps->p, &end, 10);
  if (end == ps->p || errno) return fail(ps, "expected an unsigned integer");
  ps->p = end;
  *v = x;
  return true;
}

static bool number(parser *ps, double *v) {
  blanks(ps);
  char *end;
  *v = strtod(ps->p, &end);
  if (end == ps->p) return fail(ps, "expected a number");
  ps->p = end;
  return true;
}

static bool int_list(parser *ps, int64_t *v, int *n, int max) {
  if (!expect(ps, "[")) return false;
  *n = 0;
  if (eat(ps, "]")) return true;
  do {
    if (*n == max) return fail(ps, "more than %d entries in a list", max);
    if (!integer(ps, &v[(*n)++])) return false;
  } while (eat(ps, ","));
  return expect(ps, "]");
}

static bool value_ref(parser *ps, bool define, int *text_id) {
  if (!expect(ps, "%")) return false;
  int64_t v;
  if (!integer(ps, &v)) return false;
  if (v < 0 || v > 100000000) return fail(ps, "value number %lld out of range", (long long)v);
  if (v >= ps->n_names) {
    int n = (int)v + 1 > 2 * ps->n_names ? (int)v + 1 : 2 * ps->n_names;
    int *p = realloc(ps->names, sizeof(int) * (size_t)n);
    if (!p) return fail(ps, "out of memory");
    for (int i = ps->n_names; i < n; i++) p[i] = -1;
    ps->names = p, ps->n_names = n;
  }
  if (define && ps->names[v] >= 0) return fail(ps, "%%%lld is defined twice", (long long)v);
  if (!define && ps->names[v] < 0) return fail(ps, "%%%lld is used before it is defined", (long long)v);
  *text_id = (int)v;
  return true;
}

static bool dim(parser *ps, ir_dim *d) {
  blanks(ps);
  if (*ps->p == 's') {
    ps->p++;
    int64_t k;
    if (!integer(ps, &k)) return false;
    if (k < 0 || k > 4096) return fail(ps, "symbol s%lld out of range", (long long)k);
    if (k >= ps->n_syms) {
      int n = (int)k + 1;
      int *p = realloc(ps->syms, sizeof(int) * (size_t)n);
      if (!p) return fail(ps, "out of memory");
      for (int i = ps->n_syms; i < n; i++) p[i] = 0;
      ps->syms = p, ps->n_syms = n;
    }
    if (!ps->syms[k]) { /* symbols are numbered in order of first appearance */
      ir_dim s = ir_new_symbol(ps->g);
      if (ps->g->oom) return fail(ps, "out of memory");
      ps->syms[k] = (int)s;
    }
    *d = ps->syms[k];
    return true;
  }
  if (*ps->p == '(') {
    ps->p++;
    ir_dim a, b;
    ir_sexpr_kind kind;
    if (!dim(ps, &a)) return false;
    if (eat(ps, "+")) kind = IR_SEXPR_ADD;
    else if (eat(ps, "*")) kind = IR_SEXPR_MUL;
    else if (eat(ps, "//")) kind = IR_SEXPR_FLOORDIV;
    else return fail(ps, "expected '+', '*' or '//' in a size expression");
    if (!dim(ps, &b) || !expect(ps, ")")) return false;
    *d = ir_sexpr_binary(ps->g, kind, a, b);
    if (ps->g->oom) return fail(ps, "out of memory");
    return true;
  }
  int64_t v;
  if (!integer(ps, &v)) return false;
  if (v < 0) return fail(ps, "negative size %lld", (long long)v);
  *d = v;
  return true;
}

static bool dtype_name(parser *ps, em_dtype *dt) {
  char name[16];
  blanks(ps);
  const char *start = ps->p;
  if (!ident(ps, name, sizeof name)) return false;
  for (int i = 0; i < EM_DTYPE_COUNT; i++)
    if (!strcmp(ir_dtype((em_dtype)i)->name, name)) {
      *dt = (em_dtype)i;
      return true;
    }
  ps->p = start; /* point at the name */
  return fail(ps, "unknown dtype '%s'", name);
}

static bool type(parser *ps, ir_type *t) {
  *t = (ir_type){0};
  if (!dtype_name(ps, &t->dtype) || !expect(ps, "[")) return false;
  if (!eat(ps, "]")) {
    do {
      if (t->ndim == EM_MAX_DIMS) return fail(ps, "more than %d dims", EM_MAX_DIMS);
      if (!dim(ps, &t->sizes[t->ndim++])) return false;
    } while (eat(ps, ","));
    if (!expect(ps, "]")) return false;
  }
  if (eat(ps, "@cuda")) t->device = EM_CUDA;
  return true;
}

static bool find_prim(parser *ps, const char *name, em_prim *op) {
  for (int i = 0; i < EM_PRIM_COUNT; i++)
    if (!strcmp(prim_get((em_prim)i)->name, name)) {
      *op = (em_prim)i;
      return true;
    }
  return fail(ps, "unknown prim '%s'", name);
}

static bool attr(parser *ps, const char *name, prim_attrs *a) {
  if (!strcmp(name, "axes")) return int_list(ps, a->axes, &a->n_axes, EM_MAX_DIMS);
  if (!strcmp(name, "keepdim") || !strcmp(name, "descending")) {
    bool *f = name[0] == 'k' ? &a->keepdim : &a->descending;
    if (eat(ps, "true")) *f = true;
    else if (eat(ps, "false")) *f = false;
    else return fail(ps, "%s takes true or false", name);
    return true;
  }
  if (!strcmp(name, "shape")) return int_list(ps, a->shape.sizes, &a->shape.ndim, EM_MAX_DIMS);
  if (!strcmp(name, "dtype")) return dtype_name(ps, &a->dtype);
  if (!strcmp(name, "start")) return integer(ps, &a->start);
  if (!strcmp(name, "stop")) return integer(ps, &a->stop);
  if (!strcmp(name, "step")) return integer(ps, &a->step);
  if (!strcmp(name, "pads")) return int_list(ps, a->pads, &a->n_pads, 2 * EM_MAX_DIMS);
  if (!strcmp(name, "value")) return number(ps, &a->value);
  if (!strcmp(name, "value2")) return number(ps, &a->value2);
  if (!strcmp(name, "seed")) return unsigned_integer(ps, &a->seed);
  if (!strcmp(name, "offset")) return unsigned_integer(ps, &a->offset);
  int n;
  if (!strcmp(name, "stride")) return int_list(ps, a->conv.stride, &n, 2) && (n == 2 || fail(ps, "stride takes 2 values"));
  if (!strcmp(name, "padding")) return int_list(ps, a->conv.padding, &n, 2) && (n == 2 || fail(ps, "padding takes 2 values"));
  if (!strcmp(name, "dilation")) return int_list(ps, a->conv.dilation, &n, 2) && (n == 2 || fail(ps, "dilation takes 2 values"));
  if (!strcmp(name, "groups")) return integer(ps, &a->conv.groups);
  return fail(ps, "unknown attribute '%s'", name);
}

/* "# file:line func" after a node, up to the end of the line. */
static bool site(parser *ps, em_site *s) {
  blanks(ps);
  if (*ps->p != '#') return true;
  ps->p++;
  blanks(ps);
  const char *start = ps->p, *end = ps->p;
  while (*end && *end != '\n') end++;
  /* file is everything up to the last ':' followed by a line number */
  const char *colon = NULL;
  for (const char *c = start; c < end; c++)
    if (*c == ':' && isdigit((unsigned char)c[1])) colon = c;
  if (!colon) {
    ps->p = end;
    return true; /* a plain comment */
  }
  char buf[512];
  size_t n = (size_t)(colon - start) < sizeof buf - 1 ? (size_t)(colon - start) : sizeof buf - 1;
  memcpy(buf, start, n);
  buf[n] = 0;
  s->file = ir_intern(buf);
  /* the line must fit an int: a longer one became -1, printed as ":-1", which read back as a
   * plain comment (fuzz/fuzz_ir's round trip) */
  errno = 0;
  long line = strtol(colon + 1, (char **)&ps->p, 10);
  if (errno || line > INT_MAX) return ps->p = colon + 1, fail(ps, "line number out of range");
  s->line = (int)line;
  blanks(ps);
  if (ps->p < end) {
    const char *f = ps->p, *fe = end;
    while (fe > f && (fe[-1] == ' ' || fe[-1] == '\r')) fe--;
    n = (size_t)(fe - f) < sizeof buf - 1 ? (size_t)(fe - f) : sizeof buf - 1;
    memcpy(buf, f, n);
    buf[n] = 0;
    s->func = ir_intern(buf);
  }
  ps->p = end;
  if (ps->g->oom) return fail(ps, "out of memory");
  return true;
}

static bool node(parser *ps, int text_id) {
  ir_type t;
  char name[32];
  em_prim op = EM_PRIM_COUNT;
  if (!expect(ps, ":") || !type(ps, &t) || !expect(ps, "=")) return false;
  blanks(ps);
  const char *start = ps->p;
  if (!ident(ps, name, sizeof name)) return false;
  if (!find_prim(ps, name, &op)) {
    ps->failed = false;
    ps->p = start; /* point at the name */
    return find_prim(ps, name, &op);
  }
  if (!expect(ps, "(")) return false;
  int in[64], n_in = 0;
  prim_attrs a = {0};
  if (!eat(ps, ")")) {
    do {
      blanks(ps);
      if (*ps->p == '%') {
        int id;
        if (!value_ref(ps, false, &id)) return false;
        if (n_in == 64) return fail(ps, "more than 64 operands");
        in[n_in++] = ps->names[id];
      } else {
        char an[32];
        if (!ident(ps, an, sizeof an) || !expect(ps, "=") || !attr(ps, an, &a)) return false;
      }
    } while (eat(ps, ","));
    if (!expect(ps, ")")) return false;
  }
  em_site s = {0};
  if (!site(ps, &s)) return false;
  int v = ir_add_node(ps->g, op, in, n_in, &a, &t, s, NULL);
  if (v < 0) return fail(ps, "out of memory");
  ps->names[text_id] = v;
  return true;
}

ir_graph *ir_parse(const char *text, char *err, size_t cap) {
  parser ps = {.s = text, .p = text, .line_start = text, .line = 1, .err = err, .cap = cap};
  if (cap) err[0] = 0;
  char name[64];
  space(&ps);
  if (!expect(&ps, "graph") || !ident(&ps, name, sizeof name)) return NULL;
  ps.g = ir_graph_new(name);
  if (!ps.g) {
    fail(&ps, "out of memory");
    return NULL;
  }
  if (!expect(&ps, "(")) goto bad;
  if (!eat(&ps, ")")) {
    do {
      int id;
      ir_type t;
      if (!value_ref(&ps, true, &id) || !expect(&ps, ":") || !type(&ps, &t)) goto bad;
      int v = ir_add_input(ps.g, &t);
      if (v < 0) {
        fail(&ps, "out of memory");
        goto bad;
      }
      ps.names[id] = v;
    } while (eat(&ps, ","));
    if (!expect(&ps, ")")) goto bad;
  }
  if (!expect(&ps, "{")) goto bad;
  for (;;) {
    space(&ps);
    if (*ps.p == '#') {
      site(&ps, &(em_site){0});
      continue;
    }
    if (eat(&ps, "return")) break;
    int id;
    if (!value_ref(&ps, true, &id) || !node(&ps, id)) goto bad;
  }
  blanks(&ps);
  if (*ps.p == '%') {
    do {
      int id;
      if (!value_ref(&ps, false, &id)) goto bad;
      if (!ir_add_output(ps.g, ps.names[id])) {
        fail(&ps, "out of memory");
        goto bad;
      }
    } while (eat(&ps, ","));
  }
  space(&ps);
  if (!expect(&ps, "}")) goto bad;
  space(&ps);
  if (*ps.p) {
    fail(&ps, "unexpected text after the graph");
    goto bad;
  }
  free(ps.names), free(ps.syms);
  return ps.g;
bad:
  free(ps.names), free(ps.syms);
  ir_graph_free(ps.g);
  return NULL;
}
