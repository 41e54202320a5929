/* inductor/inductor.c: scheduling, LLVM code generation and execution of fused pointwise
 * kernels (see inductor.h). Sections: the JIT (one ORC LLJIT per process), the schedule, code
 * generation, running a program. */
#define _POSIX_C_SOURCE 200809L /* strdup, clock_gettime */
#include "inductor.h"

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { LANES = 8 }; /* f32 lanes in a ymm register: the width of the eager SLEEF loops */

/* ---- the JIT ---- */

static pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;
static LLVMOrcLLJITRef jit;
static char *host_cpu, *host_features;
static char jit_error[256];
static bool jit_tried;
static int kernel_serial;

static bool jit_get(char *err, size_t cap) {
  pthread_mutex_lock(&jit_lock);
  if (!jit_tried) {
    jit_tried = true;
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    LLVMErrorRef e = LLVMOrcCreateLLJIT(&jit, NULL);
    if (e) {
      char *m = LLVMGetErrorMessage(e);
      snprintf(jit_error, sizeof jit_error, "creating the LLJIT: %s", m);
      LLVMDisposeErrorMessage(m);
      jit = NULL;
    } else {
      /* kernels call SLEEF and libm, which the process has loaded */
      LLVMOrcDefinitionGeneratorRef gen;
      e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL);
      if (e) {
        char *m = LLVMGetErrorMessage(e);
        snprintf(jit_error, sizeof jit_error, "process symbol generator: %s", m);
        LLVMDisposeErrorMessage(m);
        LLVMOrcDisposeLLJIT(jit);
        jit = NULL;
      } else {
        LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), gen);
        host_cpu = LLVMGetHostCPUName();
        host_features = LLVMGetHostCPUFeatures();
      }
    }
  }
  bool ok = jit != NULL;
  if (!ok) snprintf(err, cap, "%s", jit_error);
  pthread_mutex_unlock(&jit_lock);
  return ok;
}

/* ---- programs ---- */

/* A kernel covers rows [r0, r1) and columns [j0, j1) of its coalesced iteration space, so the
 * runtime can split it across threads either way. */
typedef void (*kernel_fn)(char **bufs, int64_t r0, int64_t r1, int64_t j0, int64_t j1);

typedef struct kernel {
  int n_nodes, *nodes;    /* graph node indices, in order */
  int n_in, *in;          /* values read from outside */
  int n_out, *out;        /* values other steps or the graph's outputs read */
  char name[32];
  kernel_fn fn;
  int64_t rows, cols; /* the coalesced iteration space */
} kernel;

typedef struct step {
  int node;   /* >= 0: run this node with the eager kernels */
  int kernel; /* >= 0: run this kernel */
} step;

struct ind_program {
  ir_graph *g;
  prim_meta *in_meta; /* the input layouts the kernels are specialised to */
  step *steps;
  int n_steps;
  kernel *kernels;
  int n_kernels;
  char *ir_text;
};

const char *ind_kernel_ir(const ind_program *p) { return p->ir_text; }

void ind_free(ind_program *p) {
  if (!p) return;
  for (int k = 0; k < p->n_kernels; k++) free(p->kernels[k].nodes), free(p->kernels[k].in), free(p->kernels[k].out);
  free(p->kernels), free(p->steps), free(p->in_meta), free(p->ir_text);
  ir_graph_free(p->g);
  free(p);
}


/* ---- the schedule ---- */

static bool is_f32_or_bool(em_dtype dt) { return dt == EM_F32 || dt == EM_BOOL; }

/* Pointwise prims the code generator implements, for the operand and result dtypes given. */
static bool fusible(const ir_graph *g, const ir_node *n) {
  if (!(prim_get(n->op)->flags & P_POINTWISE)) return false;
  em_dtype out = g->values[n->out].type.dtype;
  if (!is_f32_or_bool(out) || !ir_type_concrete(&g->values[n->out].type)) return false;
  bool all_f32 = out == EM_F32 || n->op == EM_PRIM_CONVERT || (prim_get(n->op)->flags & P_BOOL_OUT);
  for (int k = 0; k < n->n_in; k++) {
    em_dtype d = g->values[ir_operands(g, n)[k]].type.dtype;
    if (!is_f32_or_bool(d)) return false;
    if (!(n->op == EM_PRIM_WHERE && k == 0) && d != EM_F32) all_f32 = false;
  }
  switch (n->op) {
  case EM_PRIM_NEG: case EM_PRIM_ABS: case EM_PRIM_EXP: case EM_PRIM_LOG: case EM_PRIM_LOG1P: case EM_PRIM_EXPM1:
  case EM_PRIM_SQRT: case EM_PRIM_RSQRT: case EM_PRIM_SIN: case EM_PRIM_COS: case EM_PRIM_TANH: case EM_PRIM_ERF:
  case EM_PRIM_RECIPROCAL: case EM_PRIM_ADD: case EM_PRIM_SUB: case EM_PRIM_MUL: case EM_PRIM_DIV:
  case EM_PRIM_MAXIMUM: case EM_PRIM_MINIMUM:
    return out == EM_F32 && all_f32;
  case EM_PRIM_EQ: case EM_PRIM_NE: case EM_PRIM_LT: case EM_PRIM_LE: case EM_PRIM_GT: case EM_PRIM_GE:
  case EM_PRIM_WHERE: case EM_PRIM_CONVERT: case EM_PRIM_LOGICAL_NOT:
    return true;
  case EM_PRIM_LOGICAL_AND: case EM_PRIM_LOGICAL_OR:
    return g->values[ir_operands(g, n)[0]].type.dtype == EM_BOOL;
  default:
    return false;
  }
}

/* Views and scalar constants only make headers: they may run before a kernel that does not feed
 * them, so they do not split a run of pointwise nodes. */
static bool hoistable(const ir_graph *g, const ir_node *n, const bool *in_group) {
  if (!(prim_get(n->op)->flags & P_VIEW) && !(n->op == EM_PRIM_FULL && n->attrs.shape.ndim == 0)) return false;
  for (int k = 0; k < n->n_in; k++)
    if (in_group[ir_operands(g, n)[k]]) return false;
  return true;
}

static bool same_shape(const ir_type *a, const ir_type *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return false;
  return true;
}

typedef struct builder {
  ind_program *p;
  int cap_steps, cap_kernels;
} builder;

static bool push_step(builder *b, step s) {
  if (b->p->n_steps == b->cap_steps) {
    int c = b->cap_steps ? 2 * b->cap_steps : 64;
    step *n = realloc(b->p->steps, sizeof(step) * (size_t)c);
    if (!n) return false;
    b->p->steps = n, b->cap_steps = c;
  }
  b->p->steps[b->p->n_steps++] = s;
  return true;
}

/* Closes the open group (nodes grp[0..n)) into a kernel step. */
static bool close_group(builder *b, const int *grp, int n, bool *in_group) {
  if (!n) return true;
  ind_program *p = b->p;
  const ir_graph *g = p->g;
  if (p->n_kernels == b->cap_kernels) {
    int c = b->cap_kernels ? 2 * b->cap_kernels : 16;
    kernel *k = realloc(p->kernels, sizeof(kernel) * (size_t)c);
    if (!k) return false;
    p->kernels = k, b->cap_kernels = c;
  }
  kernel *k = &p->kernels[p->n_kernels];
  memset(k, 0, sizeof *k);
  k->nodes = malloc(sizeof(int) * (size_t)n);
  k->in = malloc(sizeof(int) * (size_t)(n * 3 + 1));
  k->out = malloc(sizeof(int) * (size_t)(n + 1));
  if (!k->nodes || !k->in || !k->out) {
    free(k->nodes), free(k->in), free(k->out);
    return false;
  }
  memcpy(k->nodes, grp, sizeof(int) * (size_t)n);
  k->n_nodes = n;
  /* inputs: operands made outside; outputs: results read after the kernel or returned */
  int last = grp[n - 1];
  for (int i = 0; i < n; i++) {
    const ir_node *x = &g->nodes[grp[i]];
    for (int a = 0; a < x->n_in; a++) {
      int v = ir_operands(g, x)[a];
      if (in_group[v]) continue;
      bool seen = false;
      for (int j = 0; j < k->n_in && !seen; j++) seen = k->in[j] == v;
      if (!seen) k->in[k->n_in++] = v;
    }
  }
  for (int i = 0; i < n; i++) {
    int v = g->nodes[grp[i]].out;
    bool used = false;
    for (int o = 0; o < g->n_outputs && !used; o++) used = g->outputs[o] == v;
    for (int j = last + 1; j < g->n_nodes && !used; j++)
      for (int a = 0; a < g->nodes[j].n_in && !used; a++) used = ir_operands(g, &g->nodes[j])[a] == v;
    /* hoisted views between the group's nodes may also read a group value: they cannot (see
     * hoistable), so only later nodes and outputs count */
    if (used) k->out[k->n_out++] = v;
  }
  snprintf(k->name, sizeof k->name, "ember_k%d", __atomic_add_fetch(&kernel_serial, 1, __ATOMIC_RELAXED));
  for (int i = 0; i < n; i++) in_group[g->nodes[grp[i]].out] = false;
  p->n_kernels++;
  return push_step(b, (step){-1, p->n_kernels - 1});
}

static bool schedule(builder *b) {
  const ir_graph *g = b->p->g;
  int *grp = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
  bool *in_group = calloc((size_t)(g->n_values + 1), 1);
  if (!grp || !in_group) {
    free(grp), free(in_group);
    return false;
  }
  int n = 0;
  const ir_type *shape = NULL;
  bool ok = true;
  for (int i = 0; ok && i < g->n_nodes; i++) {
    const ir_node *x = &g->nodes[i];
    const ir_type *t = &g->values[x->out].type;
    if (fusible(g, x)) {
      if (n && !same_shape(shape, t)) ok = close_group(b, grp, n, in_group), n = 0;
      if (!n) shape = t;
      grp[n++] = i;
      in_group[x->out] = true;
    } else if (n && hoistable(g, x, in_group)) {
      ok = push_step(b, (step){i, -1});
    } else {
      ok = close_group(b, grp, n, in_group) && push_step(b, (step){i, -1});
      n = 0;
    }
  }
  ok = ok && close_group(b, grp, n, in_group);
  free(grp), free(in_group);
  return ok;
}

/* ---- code generation ---- */

typedef struct cg {
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMTypeRef f32, i1, i8, i64, ptr, vf32, vi8;
} cg;

static LLVMValueRef splat(cg *c, LLVMValueRef s, int w) {
  if (w == 1) return s;
  LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(s), (unsigned)w);
  LLVMValueRef v = LLVMBuildInsertElement(c->b, LLVMGetUndef(vt), s, LLVMConstInt(c->i64, 0, 0), "");
  LLVMValueRef zero_mask = LLVMConstNull(LLVMVectorType(LLVMInt32TypeInContext(c->ctx), (unsigned)w));
  return LLVMBuildShuffleVector(c->b, v, LLVMGetUndef(vt), zero_mask, "splat");
}

static LLVMValueRef fconst(cg *c, double v, int w) { return splat(c, LLVMConstReal(c->f32, v), w); }

static LLVMValueRef call_fn(cg *c, const char *name, LLVMTypeRef ret, LLVMValueRef *args, int n) {
  LLVMTypeRef at[3];
  for (int i = 0; i < n; i++) at[i] = LLVMTypeOf(args[i]);
  LLVMTypeRef ft = LLVMFunctionType(ret, at, (unsigned)n, 0);
  LLVMValueRef f = LLVMGetNamedFunction(c->mod, name);
  if (!f) f = LLVMAddFunction(c->mod, name, ft);
  return LLVMBuildCall2(c->b, ft, f, args, (unsigned)n, "");
}

static LLVMValueRef intrinsic(cg *c, const char *name, LLVMValueRef x) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef f = LLVMGetIntrinsicDeclaration(c->mod, id, &t, 1);
  return LLVMBuildCall2(c->b, LLVMIntrinsicGetType(c->ctx, id, &t, 1), f, &x, 1, "");
}

/* exp, log, ...: SLEEF's 8-lane u10 functions in the vector body, libm in the scalar tail: the
 * functions the eager kernels call. */
static LLVMValueRef transcendental(cg *c, em_prim op, LLVMValueRef x, int w) {
  const char *base = NULL;
  switch (op) {
  case EM_PRIM_EXP: base = "exp"; break;
  case EM_PRIM_LOG: base = "log"; break;
  case EM_PRIM_LOG1P: base = "log1p"; break;
  case EM_PRIM_EXPM1: base = "expm1"; break;
  case EM_PRIM_SIN: base = "sin"; break;
  case EM_PRIM_COS: base = "cos"; break;
  case EM_PRIM_TANH: base = "tanh"; break;
  case EM_PRIM_ERF: base = "erf"; break;
  default: return NULL;
  }
  char name[64];
  if (w == 1) {
    snprintf(name, sizeof name, "%sf", base);
    return call_fn(c, name, c->f32, &x, 1);
  }
#ifdef EMBER_HAVE_SLEEF
  snprintf(name, sizeof name, "Sleef_%sf8_u10", base);
  return call_fn(c, name, c->vf32, &x, 1);
#else
  LLVMValueRef r = LLVMGetUndef(c->vf32);
  snprintf(name, sizeof name, "%sf", base);
  for (int l = 0; l < w; l++) {
    LLVMValueRef lane = LLVMBuildExtractElement(c->b, x, LLVMConstInt(c->i64, (unsigned)l, 0), "");
    r = LLVMBuildInsertElement(c->b, r, call_fn(c, name, c->f32, &lane, 1), LLVMConstInt(c->i64, (unsigned)l, 0), "");
  }
  return r;
#endif
}

/* One node's value from its operands' (f32 as float, bool as i1), w lanes. */
static LLVMValueRef emit_node(cg *c, const ir_graph *g, const ir_node *n, LLVMValueRef *v, int w) {
  LLVMBuilderRef b = c->b;
  const int *o = ir_operands(g, n);
  LLVMValueRef x = v[o[0]], y = n->n_in > 1 ? v[o[1]] : NULL;
  em_dtype xd = g->values[o[0]].type.dtype;
  switch (n->op) {
  case EM_PRIM_NEG: return LLVMBuildFNeg(b, x, "");
  case EM_PRIM_ABS: return intrinsic(c, "llvm.fabs", x);
  case EM_PRIM_SQRT: return intrinsic(c, "llvm.sqrt", x);
  case EM_PRIM_RSQRT: return LLVMBuildFDiv(b, fconst(c, 1, w), intrinsic(c, "llvm.sqrt", x), "");
  case EM_PRIM_RECIPROCAL: return LLVMBuildFDiv(b, fconst(c, 1, w), x, "");
  case EM_PRIM_ADD: return LLVMBuildFAdd(b, x, y, "");
  case EM_PRIM_SUB: return LLVMBuildFSub(b, x, y, "");
  case EM_PRIM_MUL: return LLVMBuildFMul(b, x, y, "");
  case EM_PRIM_DIV: return LLVMBuildFDiv(b, x, y, "");
  case EM_PRIM_MAXIMUM: case EM_PRIM_MINIMUM: { /* NaN propagates, as torch.maximum */
    LLVMValueRef xn = LLVMBuildFCmp(b, LLVMRealUNO, x, x, ""), yn = LLVMBuildFCmp(b, LLVMRealUNO, y, y, "");
    LLVMValueRef gt = LLVMBuildFCmp(b, n->op == EM_PRIM_MAXIMUM ? LLVMRealOGT : LLVMRealOLT, x, y, "");
    LLVMValueRef pick = LLVMBuildSelect(b, gt, x, y, "");
    return LLVMBuildSelect(b, xn, x, LLVMBuildSelect(b, yn, y, pick, ""), "");
  }
  case EM_PRIM_EQ: case EM_PRIM_NE: case EM_PRIM_LT: case EM_PRIM_LE: case EM_PRIM_GT: case EM_PRIM_GE: {
    if (xd == EM_F32) {
      static const LLVMRealPredicate rp[] = {LLVMRealOEQ, LLVMRealUNE, LLVMRealOLT, LLVMRealOLE, LLVMRealOGT, LLVMRealOGE};
      return LLVMBuildFCmp(b, rp[n->op - EM_PRIM_EQ], x, y, "");
    }
    static const LLVMIntPredicate ip[] = {LLVMIntEQ, LLVMIntNE, LLVMIntULT, LLVMIntULE, LLVMIntUGT, LLVMIntUGE};
    return LLVMBuildICmp(b, ip[n->op - EM_PRIM_EQ], x, y, "");
  }
  case EM_PRIM_LOGICAL_AND: return LLVMBuildAnd(b, x, y, "");
  case EM_PRIM_LOGICAL_OR: return LLVMBuildOr(b, x, y, "");
  case EM_PRIM_LOGICAL_NOT:
    if (xd == EM_F32) return LLVMBuildFCmp(b, LLVMRealOEQ, x, fconst(c, 0, w), "");
    return LLVMBuildNot(b, x, "");
  case EM_PRIM_WHERE: return LLVMBuildSelect(b, x, y, v[o[2]], "");
  case EM_PRIM_CONVERT: {
    em_dtype to = n->attrs.dtype;
    if (to == xd) return x;
    if (to == EM_BOOL) return LLVMBuildFCmp(b, LLVMRealUNE, x, fconst(c, 0, w), ""); /* (bool)x: x != 0 */
    return LLVMBuildUIToFP(b, x, w == 1 ? c->f32 : c->vf32, "");
  }
  default:
    return transcendental(c, n->op, x, w);
  }
}

/* Layout of one buffer of a kernel in the coalesced iteration space. */
typedef struct access {
  int64_t strides[EM_MAX_DIMS];
  em_dtype dtype;
} access;

/* Emits the loads, the node computations and the stores of one iteration: lanes w, buffers at
 * element offsets off[] (outputs first). */
static void emit_body(cg *c, const ir_graph *g, const kernel *k, LLVMValueRef *base, LLVMValueRef *off,
                      const access *acc, int inner, int w, LLVMValueRef *vals) {
  LLVMBuilderRef b = c->b;
  for (int i = 0; i < k->n_in; i++) {
    const access *a = &acc[k->n_out + i];
    bool is_bool = a->dtype == EM_BOOL;
    LLVMTypeRef et = is_bool ? c->i8 : c->f32;
    LLVMValueRef p = LLVMBuildGEP2(b, et, base[k->n_out + i], &off[k->n_out + i], 1, "");
    LLVMValueRef x;
    if (w > 1 && a->strides[inner] == 1) {
      LLVMTypeRef vt = is_bool ? c->vi8 : c->vf32;
      x = LLVMBuildLoad2(b, vt, p, "");
      LLVMSetAlignment(x, is_bool ? 1 : 4);
    } else {
      x = LLVMBuildLoad2(b, et, p, "");
      LLVMSetAlignment(x, is_bool ? 1 : 4);
      x = splat(c, x, w);
    }
    if (is_bool) x = LLVMBuildICmp(b, LLVMIntNE, x, LLVMConstNull(w == 1 ? c->i8 : c->vi8), "");
    vals[k->in[i]] = x;
  }
  for (int j = 0; j < k->n_nodes; j++) {
    const ir_node *n = &g->nodes[k->nodes[j]];
    vals[n->out] = emit_node(c, g, n, vals, w);
  }
  for (int i = 0; i < k->n_out; i++) {
    bool is_bool = acc[i].dtype == EM_BOOL;
    LLVMValueRef x = vals[k->out[i]];
    if (is_bool) x = LLVMBuildZExt(b, x, w == 1 ? c->i8 : c->vi8, "");
    LLVMValueRef p = LLVMBuildGEP2(b, is_bool ? c->i8 : c->f32, base[i], &off[i], 1, "");
    LLVMValueRef st = LLVMBuildStore(b, x, p);
    LLVMSetAlignment(st, is_bool ? 1 : 4);
  }
}

/* Element offsets of every buffer at column j of the current row. */
static void column_offsets(cg *c, const access *acc, int nb, int inner, LLVMValueRef *row, LLVMValueRef j,
                           LLVMValueRef *off) {
  for (int bi = 0; bi < nb; bi++)
    off[bi] = acc[bi].strides[inner]
                  ? LLVMBuildAdd(c->b, row[bi],
                                 LLVMBuildMul(c->b, j, LLVMConstInt(c->i64, (unsigned long long)acc[bi].strides[inner], 0), ""), "")
                  : row[bi];
}

/* Emits kernel k as `void name(char **bufs, r0, r1, j0, j1)`: outer loops over the coalesced leading dims, the
 * innermost dim vectorized when every buffer's innermost stride is 0 or 1, a scalar tail. */
static bool emit_kernel(cg *c, const ir_graph *g, const prim_meta *meta, kernel *k, char *err, size_t cap) {
  const ir_type *t = &g->values[g->nodes[k->nodes[0]].out].type;
  int nb = k->n_out + k->n_in;
  access acc[128];
  if (nb > 128) return ir_fail(err, cap, "kernel with %d buffers", nb);
  /* coalesce dims: merge i into i+1 where every buffer's strides allow it */
  int64_t sizes[EM_MAX_DIMS];
  int nd = 0;
  int64_t cont[EM_MAX_DIMS];
  ir_contiguous_strides(t->ndim, t->sizes, cont);
  for (int bi = 0; bi < nb; bi++) {
    int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
    acc[bi].dtype = g->values[v].type.dtype;
  }
  int64_t st[128][EM_MAX_DIMS];
  for (int bi = 0; bi < nb; bi++) {
    int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
    for (int d = 0; d < t->ndim; d++) st[bi][d] = bi < k->n_out ? cont[d] : meta[v].strides[d];
  }
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 1) continue; /* size-1 dims contribute nothing */
    bool merge = nd > 0;
    for (int bi = 0; merge && bi < nb; bi++) merge = acc[bi].strides[nd - 1] == st[bi][d] * t->sizes[d];
    if (merge) {
      sizes[nd - 1] *= t->sizes[d];
      for (int bi = 0; bi < nb; bi++) acc[bi].strides[nd - 1] = st[bi][d];
    } else {
      sizes[nd] = t->sizes[d];
      for (int bi = 0; bi < nb; bi++) acc[bi].strides[nd] = st[bi][d];
      nd++;
    }
  }
  if (nd == 0) { /* a single element */
    sizes[0] = 1;
    for (int bi = 0; bi < nb; bi++) acc[bi].strides[0] = 0;
    nd = 1;
  }
  int inner = nd - 1;
  bool vec = true;
  for (int bi = 0; bi < nb; bi++) vec = vec && (acc[bi].strides[inner] == 0 || acc[bi].strides[inner] == 1);
  int64_t outer = 1;
  for (int d = 0; d < inner; d++) outer *= sizes[d];
  int64_t cols = sizes[inner];

  k->rows = outer, k->cols = cols;
  LLVMBuilderRef b = c->b;
  LLVMTypeRef params[5] = {c->ptr, c->i64, c->i64, c->i64, c->i64};
  LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(c->ctx), params, 5, 0);
  LLVMValueRef fn = LLVMAddFunction(c->mod, k->name, ft);
  LLVMAddTargetDependentFunctionAttr(fn, "target-cpu", host_cpu);
  LLVMAddTargetDependentFunctionAttr(fn, "target-features", host_features);
  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"),
                    ohdr = LLVMAppendBasicBlockInContext(c->ctx, fn, "outer"),
                    obody = LLVMAppendBasicBlockInContext(c->ctx, fn, "row"),
                    vhdr = LLVMAppendBasicBlockInContext(c->ctx, fn, "vhdr"),
                    vbody = LLVMAppendBasicBlockInContext(c->ctx, fn, "vbody"),
                    thdr = LLVMAppendBasicBlockInContext(c->ctx, fn, "thdr"),
                    tbody = LLVMAppendBasicBlockInContext(c->ctx, fn, "tbody"),
                    olatch = LLVMAppendBasicBlockInContext(c->ctx, fn, "olatch"),
                    exitb = LLVMAppendBasicBlockInContext(c->ctx, fn, "exit");
  LLVMPositionBuilderAtEnd(b, entry);
  LLVMValueRef bufs = LLVMGetParam(fn, 0), base[128];
  LLVMValueRef r0 = LLVMGetParam(fn, 1), r1 = LLVMGetParam(fn, 2), j0 = LLVMGetParam(fn, 3), j1 = LLVMGetParam(fn, 4);
  for (int bi = 0; bi < nb; bi++) {
    LLVMValueRef idx = LLVMConstInt(c->i64, (unsigned long long)bi, 0);
    LLVMValueRef pp = LLVMBuildGEP2(b, c->ptr, bufs, &idx, 1, "");
    base[bi] = LLVMBuildLoad2(b, c->ptr, pp, "");
  }
  LLVMBuildBr(b, ohdr);
  LLVMValueRef zero = LLVMConstInt(c->i64, 0, 0), one = LLVMConstInt(c->i64, 1, 0);
  /* outer: r in [0, outer) */
  LLVMPositionBuilderAtEnd(b, ohdr);
  LLVMValueRef r = LLVMBuildPhi(b, c->i64, "r");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, r, r1, ""), obody, exitb);
  LLVMPositionBuilderAtEnd(b, obody);
  LLVMValueRef row[128];
  for (int bi = 0; bi < nb; bi++) row[bi] = zero;
  LLVMValueRef rem = r;
  for (int d = inner - 1; d >= 0; d--) { /* r's index in each leading dim (sizes are constants) */
    LLVMValueRef sz = LLVMConstInt(c->i64, (unsigned long long)sizes[d], 0);
    LLVMValueRef id = d > 0 ? LLVMBuildURem(b, rem, sz, "") : rem;
    if (d > 0) rem = LLVMBuildUDiv(b, rem, sz, "");
    for (int bi = 0; bi < nb; bi++)
      if (acc[bi].strides[d])
        row[bi] = LLVMBuildAdd(b, row[bi], LLVMBuildMul(b, id, LLVMConstInt(c->i64, (unsigned long long)acc[bi].strides[d], 0), ""), "");
  }
  LLVMBuildBr(b, vhdr);
  /* vector loop: j in steps of LANES while j + LANES <= cols */
  LLVMPositionBuilderAtEnd(b, vhdr);
  LLVMValueRef j = LLVMBuildPhi(b, c->i64, "j");
  LLVMValueRef lanes = LLVMConstInt(c->i64, LANES, 0), ncols = j1;
  LLVMValueRef vcond = vec ? LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildAdd(b, j, lanes, ""), ncols, "")
                           : LLVMConstInt(c->i1, 0, 0);
  LLVMBuildCondBr(b, vcond, vbody, thdr);
  LLVMValueRef *vals = calloc((size_t)g->n_values + 1, sizeof(LLVMValueRef));
  if (!vals) return ir_fail(err, cap, "out of memory");
  LLVMPositionBuilderAtEnd(b, vbody);
  LLVMValueRef off[128];
  column_offsets(c, acc, nb, inner, row, j, off);
  if (vec) emit_body(c, g, k, base, off, acc, inner, LANES, vals);
  LLVMValueRef jn = LLVMBuildAdd(b, j, lanes, "");
  LLVMBuildBr(b, vhdr);
  LLVMValueRef jin[2] = {j0, jn};
  LLVMBasicBlockRef jbb[2] = {obody, vbody};
  LLVMAddIncoming(j, jin, jbb, 2);
  /* scalar tail */
  LLVMPositionBuilderAtEnd(b, thdr);
  LLVMValueRef t2 = LLVMBuildPhi(b, c->i64, "t");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, t2, ncols, ""), tbody, olatch);
  LLVMPositionBuilderAtEnd(b, tbody);
  column_offsets(c, acc, nb, inner, row, t2, off);
  emit_body(c, g, k, base, off, acc, inner, 1, vals);
  LLVMValueRef tn = LLVMBuildAdd(b, t2, one, "");
  LLVMBuildBr(b, thdr);
  LLVMValueRef tin[2] = {j, tn};
  LLVMBasicBlockRef tbb[2] = {vhdr, tbody};
  LLVMAddIncoming(t2, tin, tbb, 2);
  /* next row */
  LLVMPositionBuilderAtEnd(b, olatch);
  LLVMValueRef rn = LLVMBuildAdd(b, r, one, "");
  LLVMBuildBr(b, ohdr);
  LLVMValueRef rin[2] = {r0, rn};
  LLVMBasicBlockRef rbb[2] = {entry, olatch};
  LLVMAddIncoming(r, rin, rbb, 2);
  LLVMPositionBuilderAtEnd(b, exitb);
  LLVMBuildRetVoid(b);
  free(vals);
  return true;
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

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

ind_program *ind_compile(const ir_graph *graph, em_tensor *const *inputs, ind_stats *stats, char *err, size_t cap) {
  double t0 = now_ms();
  if (stats) memset(stats, 0, sizeof *stats);
  if (!jit_get(err, cap)) return NULL;
  ind_program *p = calloc(1, sizeof *p);
  prim_meta *meta = p ? calloc((size_t)graph->n_values + 1, sizeof(prim_meta)) : NULL;
  if (!p || !meta || !(p->g = ir_graph_clone(graph))) {
    free(meta), free(p);
    ir_fail(err, cap, "out of memory");
    return NULL;
  }
  const ir_graph *g = p->g;
  bool ok = true;
  p->in_meta = malloc(sizeof(prim_meta) * (size_t)(g->n_inputs + 1));
  if (!p->in_meta) ok = ir_fail(err, cap, "out of memory");
  for (int i = 0; ok && i < g->n_inputs; i++) p->in_meta[i] = rt_meta(inputs[i]);
  for (int i = 0; ok && i < g->n_nodes; i++)
    if (!ir_type_concrete(&g->values[g->nodes[i].out].type)) ok = ir_fail(err, cap, "symbolic sizes");
  if (ok && !value_metas(g, p->in_meta, meta)) ok = ir_fail(err, cap, "the graph's layouts do not follow from its inputs");
  builder bld = {p};
  if (ok && !schedule(&bld)) ok = ir_fail(err, cap, "out of memory scheduling");
  if (ok && p->n_kernels) {
    cg c = {0};
    LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
    c.ctx = LLVMOrcThreadSafeContextGetContext(tsc);
    c.mod = LLVMModuleCreateWithNameInContext("ember_kernels", c.ctx);
    LLVMSetTarget(c.mod, LLVMOrcLLJITGetTripleString(jit));
    LLVMSetDataLayout(c.mod, LLVMOrcLLJITGetDataLayoutStr(jit));
    c.b = LLVMCreateBuilderInContext(c.ctx);
    c.f32 = LLVMFloatTypeInContext(c.ctx), c.i1 = LLVMInt1TypeInContext(c.ctx), c.i8 = LLVMInt8TypeInContext(c.ctx);
    c.i64 = LLVMInt64TypeInContext(c.ctx), c.ptr = LLVMPointerTypeInContext(c.ctx, 0);
    c.vf32 = LLVMVectorType(c.f32, LANES), c.vi8 = LLVMVectorType(c.i8, LANES);
    for (int k = 0; ok && k < p->n_kernels; k++) ok = emit_kernel(&c, g, meta, &p->kernels[k], err, cap);
    LLVMDisposeBuilder(c.b);
    if (ok) { /* O3 over explicit vectors: the vectorizers have little left; inlining and GVN matter */
      LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
      LLVMErrorRef e = LLVMRunPasses(c.mod, "default<O3>", NULL, po);
      LLVMDisposePassBuilderOptions(po);
      if (e) {
        char *m = LLVMGetErrorMessage(e);
        ok = ir_fail(err, cap, "LLVM passes: %s", m);
        LLVMDisposeErrorMessage(m);
      }
    }
    if (ok) {
      char *text = LLVMPrintModuleToString(c.mod);
      p->ir_text = text ? strdup(text) : NULL;
      LLVMDisposeMessage(text);
      LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(c.mod, tsc);
      pthread_mutex_lock(&jit_lock);
      LLVMErrorRef e = LLVMOrcLLJITAddLLVMIRModule(jit, LLVMOrcLLJITGetMainJITDylib(jit), tsm);
      for (int k = 0; !e && k < p->n_kernels; k++) {
        LLVMOrcExecutorAddress addr;
        e = LLVMOrcLLJITLookup(jit, &addr, p->kernels[k].name);
        if (!e) p->kernels[k].fn = (kernel_fn)(uintptr_t)addr;
      }
      pthread_mutex_unlock(&jit_lock);
      if (e) {
        char *m = LLVMGetErrorMessage(e);
        ok = ir_fail(err, cap, "LLJIT: %s", m);
        LLVMDisposeErrorMessage(m);
      }
    } else {
      LLVMDisposeModule(c.mod);
    }
    LLVMOrcDisposeThreadSafeContext(tsc);
  }
  free(meta);
  if (!ok) {
    ind_free(p);
    return NULL;
  }
  if (stats) {
    stats->kernels = p->n_kernels;
    for (int k = 0; k < p->n_kernels; k++) stats->fused_nodes += p->kernels[k].n_nodes;
    for (int s = 0; s < p->n_steps; s++) stats->fallback_nodes += p->steps[s].node >= 0;
    stats->compile_ms = now_ms() - t0;
  }
  return p;
}

/* ---- running ---- */

static _Thread_local int64_t kernel_runs;

/* Runs k over its whole iteration space, split across the OpenMP threads when it is large
 * (rows when there are enough of them, else column blocks that are multiples of the vector
 * width), with the eager loops' grain so small kernels stay on the calling thread. */
static void run_kernel(const kernel *k, char **bufs) {
  int64_t n = k->rows * k->cols;
  int nt = omp_get_max_threads();
  if (nt < 2 || n < 2 * PRIM_PARALLEL_GRAIN) {
    k->fn(bufs, 0, k->rows, 0, k->cols);
    return;
  }
  if (k->rows >= nt) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < nt; t++) {
      int64_t a = k->rows * t / nt, z = k->rows * (t + 1) / nt;
      if (a < z) k->fn(bufs, a, z, 0, k->cols);
    }
  } else {
    int64_t block = (k->cols / nt + LANES - 1) / LANES * LANES;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < nt; t++) {
      int64_t a = block * t, z = t == nt - 1 ? k->cols : block * (t + 1);
      if (z > k->cols) z = k->cols;
      if (a < z) k->fn(bufs, 0, k->rows, a, z);
    }
  }
}
int64_t ind_kernel_runs(void) { return kernel_runs; }

bool ind_accepts(const ind_program *p, em_tensor *const *in, int n_in) {
  if (n_in != p->g->n_inputs) return false;
  for (int i = 0; i < n_in; i++) {
    prim_meta m = rt_meta(in[i]);
    const prim_meta *w = &p->in_meta[i];
    if (m.dtype != w->dtype || m.ndim != w->ndim || memcmp(m.sizes, w->sizes, sizeof(int64_t) * (size_t)m.ndim) ||
        memcmp(m.strides, w->strides, sizeof(int64_t) * (size_t)m.ndim))
      return false;
  }
  return true;
}

bool ind_run(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, em_site site) {
  const ir_graph *g = p->g;
  for (int i = 0; i < g->n_outputs; i++) out[i] = NULL;
  if (!ind_accepts(p, in, n_in))
    return rt_error(site, "em_call", "the inputs do not have the layouts the kernels were compiled for"), false;
  int nv = g->n_values;
  em_tensor **vals = rt_alloc(sizeof(em_tensor *) * (size_t)(nv + 1), 16);
  int *uses = rt_alloc(sizeof(int) * (size_t)(nv + 1), 16);
  if (!vals || !uses) {
    rt_free(vals), rt_free(uses);
    return rt_error(site, "em_call", "out of memory"), false;
  }
  memset(vals, 0, sizeof(em_tensor *) * (size_t)nv);
  ir_count_uses(g, uses);
  for (int i = 0; i < n_in; i++) vals[g->inputs[i]] = em_retain(in[i]);
  bool ok = true;
  rt_trace_suspend();
  for (int s = 0; ok && s < p->n_steps; s++) {
    const step *st = &p->steps[s];
    if (st->node >= 0) {
      const ir_node *n = &g->nodes[st->node];
      em_tensor *small[4], **ops = n->n_in <= 4 ? small : rt_alloc(sizeof(em_tensor *) * (size_t)n->n_in, 16);
      if (!ops) {
        ok = (rt_error(n->site, n->opname, "out of memory"), false);
        break;
      }
      for (int k = 0; k < n->n_in; k++) ops[k] = vals[ir_operands(g, n)[k]];
      prim_attrs at = n->attrs;
      if (prim_get(n->op)->flags & P_RANDOM)
        rt_rng_reserve(prim_philox_calls(n->op, at.dtype, ir_numel(at.shape.ndim, at.shape.sizes)), &at.seed, &at.offset);
      em_tensor *r = n->op == EM_PRIM_RESHAPE ? rt_reshape(ops[0], at.shape.ndim, at.shape.sizes, n->opname, n->site)
                                              : rt_dispatch(n->opname, n->op, ops, n->n_in, &at, n->site);
      if (ops != small) rt_free(ops);
      vals[n->out] = r;
      ok = r != NULL;
      for (int k = 0; ok && k < n->n_in; k++) {
        int v = ir_operands(g, n)[k];
        if (--uses[v] == 0) em_release(vals[v]), vals[v] = NULL;
      }
      continue;
    }
    const kernel *k = &p->kernels[st->kernel];
    char *small[32], **bufs = k->n_out + k->n_in <= 32 ? small : rt_alloc(sizeof(char *) * (size_t)(k->n_out + k->n_in), 16);
    if (!bufs) {
      ok = (rt_error(site, "em_call", "out of memory"), false);
      break;
    }
    for (int o = 0; ok && o < k->n_out; o++) {
      const ir_type *t = &g->values[k->out[o]].type;
      int64_t sz[EM_MAX_DIMS];
      for (int d = 0; d < t->ndim; d++) sz[d] = t->sizes[d];
      vals[k->out[o]] = rt_new(t->dtype, t->ndim, sz, "em_call", site);
      ok = vals[k->out[o]] != NULL;
      if (ok) bufs[o] = rt_data(vals[k->out[o]]);
    }
    for (int i = 0; ok && i < k->n_in; i++) bufs[k->n_out + i] = rt_data(vals[k->in[i]]);
    if (ok) {
      run_kernel(k, bufs);
      kernel_runs++;
    }
    if (bufs != small) rt_free(bufs);
    for (int j = 0; ok && j < k->n_nodes; j++) { /* operands consumed inside the kernel */
      const ir_node *n = &g->nodes[k->nodes[j]];
      for (int a = 0; a < n->n_in; a++) {
        int v = ir_operands(g, n)[a];
        if (--uses[v] == 0) em_release(vals[v]), vals[v] = NULL;
      }
    }
  }
  rt_trace_resume();
  if (ok)
    for (int i = 0; i < g->n_outputs; i++) out[i] = em_retain(vals[g->outputs[i]]);
  for (int v = 0; v < nv; v++) em_release(vals[v]);
  rt_free(vals), rt_free(uses);
  return ok;
}
