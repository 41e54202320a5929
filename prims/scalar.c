/* prims/scalar.c: the scalar expressions of pointwise prims (the expr column of prims.def).
 *
 * Each expression is parsed once, on first use, into a small tree; prim_scalar_expr
 * instantiates it for concrete dtypes as a list of typed instructions (operands before their
 * users, conversions explicit), which is what every renderer walks. A renderer so implements
 * scalar ops per dtype, never prims: the LLVM renderer (inductor/codegen.c) and the CUDA C one
 * (runtime/cuda_kernels.c) read the same rows. An expression that does not parse leaves its
 * prim with none, which no renderer can render; tests/test_pointwise.c checks that every
 * pointwise prim has one. */
#include "prims.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name;
  int arity;
} sops[SOP_COUNT] = {
    [SOP_ARG] = {"arg", 0},     [SOP_CONST] = {"const", 0}, [SOP_CAST] = {"cast", 1},
    [SOP_NEG] = {"neg", 1},     [SOP_ABS] = {"abs", 1},     [SOP_EXP] = {"exp", 1},
    [SOP_LOG] = {"log", 1},     [SOP_LOG1P] = {"log1p", 1}, [SOP_EXPM1] = {"expm1", 1},
    [SOP_SQRT] = {"sqrt", 1},   [SOP_SIN] = {"sin", 1},     [SOP_COS] = {"cos", 1},
    [SOP_TANH] = {"tanh", 1},   [SOP_ERF] = {"erf", 1},     [SOP_FLOOR] = {"floor", 1},
    [SOP_CEIL] = {"ceil", 1},   [SOP_ADD] = {"add", 2},     [SOP_SUB] = {"sub", 2},
    [SOP_MUL] = {"mul", 2},     [SOP_DIV] = {"div", 2},     [SOP_POW] = {"pow", 2},
    [SOP_REM] = {"rem", 2},     [SOP_ATAN2] = {"atan2", 2},     [SOP_EQ] = {"eq", 2},       [SOP_NE] = {"ne", 2},
    [SOP_LT] = {"lt", 2},       [SOP_LE] = {"le", 2},       [SOP_GT] = {"gt", 2},
    [SOP_GE] = {"ge", 2},       [SOP_ISNAN] = {"isnan", 1}, [SOP_AND] = {"and", 2},
    [SOP_OR] = {"or", 2},       [SOP_NOT] = {"not", 1},     [SOP_SELECT] = {"select", 3},
};

const char *prim_sop_name(prim_sop op) { return op >= 0 && op < SOP_COUNT ? sops[op].name : "?"; }

/* A parsed expression: nodes in postorder, the root last. */
typedef struct snode {
  prim_sop op;
  int n_kid, kid[3];
  int arg;
  double value;
} snode;

typedef struct stree {
  int n; /* 0: none (not pointwise, or did not parse) */
  snode node[PRIM_SEXPR_MAX];
} stree;

static stree trees[EM_PRIM_COUNT];

typedef struct parser {
  const char *s;
  stree *t;
  int arity;
} parser;

static void skip_space(parser *p) {
  while (*p->s == ' ') p->s++;
}

/* One expression at p->s: its node's index, or -1. */
static int parse(parser *p) {
  skip_space(p);
  if (p->t->n >= PRIM_SEXPR_MAX) return -1;
  snode nd = {0};
  if (*p->s == '(') {
    p->s++;
    size_t len = strcspn(p->s, " ()");
    int op = -1;
    for (int i = SOP_CAST + 1; i < SOP_COUNT; i++)
      if (strlen(sops[i].name) == len && !strncmp(p->s, sops[i].name, len)) op = i;
    if (op < 0) return -1;
    p->s += len;
    nd.op = (prim_sop)op;
    for (int k = 0; k < sops[op].arity; k++)
      if ((nd.kid[nd.n_kid++] = parse(p)) < 0) return -1;
    skip_space(p);
    if (*p->s++ != ')') return -1;
  } else if (*p->s >= 'a' && *p->s <= 'c') {
    nd.op = SOP_ARG;
    nd.arg = *p->s++ - 'a';
    if (nd.arg >= p->arity) return -1;
  } else {
    char *end;
    nd.op = SOP_CONST;
    nd.value = strtod(p->s, &end);
    if (end == p->s) return -1;
    p->s = end;
  }
  p->t->node[p->t->n] = nd;
  return p->t->n++;
}

static void parse_table(void) {
  for (int op = 0; op < EM_PRIM_COUNT; op++) {
    const prim_info *pi = prim_get((em_prim)op);
    if (!(pi->flags & P_POINTWISE) || !pi->expr || !*pi->expr) continue;
    parser p = {pi->expr, &trees[op], pi->arity};
    int root = parse(&p);
    skip_space(&p);
    if (root < 0 || *p.s) trees[op].n = 0;
  }
}

typedef struct inst_ctx {
  const stree *t;
  const em_dtype *args;
  em_dtype compute;
  prim_sexpr *e;
} inst_ctx;

static int push(inst_ctx *c, prim_sinst in) {
  if (c->e->n >= PRIM_SEXPR_MAX) return -1;
  c->e->ins[c->e->n] = in;
  return c->e->n++;
}

/* Instruction i as dtype to: itself, or a conversion of it. */
static int coerce(inst_ctx *c, int i, em_dtype to) {
  if (i < 0 || c->e->ins[i].dtype == to) return i;
  return push(c, (prim_sinst){.op = SOP_CAST, .dtype = to, .n_in = 1, .in = {i}});
}

static bool is_float_dtype(em_dtype dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16; }

/* Instruction i's constant value, when it is one. */
static bool constant(const inst_ctx *c, int i, double *v) {
  if (c->e->ins[i].op != SOP_CONST) return false;
  *v = c->e->ins[i].value;
  return true;
}

/* Pushes in, or what it folds to when an operand's dtype decides it: isnan of a non-float is
 * false, an unsigned value (u8, bool) is never below 0 and always at least 0, and a decided
 * condition picks its branch. Renderers so never see a comparison that is always true or
 * false (which NVRTC warns about), and an integer kernel carries no NaN test. */
static int fold(inst_ctx *c, prim_sinst in) {
  em_dtype xd = in.n_in ? c->e->ins[in.in[0]].dtype : in.dtype;
  double v;
  bool uns = xd == EM_U8 || xd == EM_BOOL;
  if (in.op == SOP_ISNAN && !is_float_dtype(xd)) return push(c, (prim_sinst){.op = SOP_CONST, .dtype = EM_BOOL, .value = 0});
  if ((in.op == SOP_LT || in.op == SOP_GE) && uns && constant(c, in.in[1], &v) && v == 0)
    return push(c, (prim_sinst){.op = SOP_CONST, .dtype = EM_BOOL, .value = in.op == SOP_GE});
  if (in.op == SOP_OR || in.op == SOP_AND) {
    bool absorbing = in.op == SOP_OR; /* x or true, x and false */
    for (int k = 0; k < 2; k++)
      if (constant(c, in.in[k], &v)) return (v != 0) == absorbing ? in.in[k] : in.in[1 - k];
  }
  if (in.op == SOP_SELECT && constant(c, in.in[0], &v)) return v != 0 ? in.in[1] : in.in[2];
  return push(c, in);
}

static int lower(inst_ctx *c, int node) {
  const snode *nd = &c->t->node[node];
  em_dtype C = c->compute, B = EM_BOOL;
  switch (nd->op) {
  case SOP_ARG: return push(c, (prim_sinst){.op = SOP_ARG, .dtype = c->args[nd->arg], .arg = nd->arg});
  case SOP_CONST: return push(c, (prim_sinst){.op = SOP_CONST, .dtype = C, .value = nd->value});
  default: break;
  }
  em_dtype want, res;
  switch (nd->op) {
  case SOP_EQ: case SOP_NE: case SOP_LT: case SOP_LE: case SOP_GT: case SOP_GE: case SOP_ISNAN:
    want = C, res = B;
    break;
  case SOP_AND: case SOP_OR: case SOP_NOT:
    want = B, res = B;
    break;
  default:
    want = C, res = C;
    break;
  }
  prim_sinst in = {.op = nd->op, .dtype = res, .n_in = nd->n_kid};
  for (int k = 0; k < nd->n_kid; k++) {
    em_dtype w = nd->op == SOP_SELECT && k == 0 ? B : want;
    if ((in.in[k] = coerce(c, lower(c, nd->kid[k]), w)) < 0) return -1;
  }
  return fold(c, in);
}

bool prim_scalar_expr(em_prim op, const em_dtype *args, em_dtype compute, em_dtype out, prim_sexpr *e) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, parse_table);
  e->n = 0;
  if (op < 0 || op >= EM_PRIM_COUNT || !trees[op].n) return false;
  inst_ctx c = {&trees[op], args, compute, e};
  int r = coerce(&c, lower(&c, trees[op].n - 1), out);
  if (r < 0) return false;
  /* keep what the result reads (folding leaves instructions behind), in order, the result last */
  bool live[PRIM_SEXPR_MAX] = {false};
  live[r] = true;
  for (int i = r; i >= 0; i--)
    for (int k = 0; live[i] && k < e->ins[i].n_in; k++) live[e->ins[i].in[k]] = true;
  int map[PRIM_SEXPR_MAX], n = 0;
  for (int i = 0; i <= r; i++) {
    if (!live[i]) continue;
    prim_sinst in = e->ins[i];
    for (int k = 0; k < in.n_in; k++) in.in[k] = map[in.in[k]];
    map[i] = n;
    e->ins[n++] = in;
  }
  e->n = n;
  return true;
}
