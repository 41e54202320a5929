/* inductor/codegen.c: LLVM IR through the C API for the two kinds of kernel: pointwise (a loop
 * nest over the coalesced iteration space, the innermost dim vectorized, a scalar tail; column
 * reductions accumulated in their outputs) and row kernels (passes over each row with vector
 * accumulators, per-row values between passes, spills to scratch). Each kernel also gets its
 * loop IR as text, for EMBER_LOGS=schedule. */
#include "internal.h"
#include "../prims/fast_f32.h"

#include <stdarg.h>
#include <stdio.h>

/* ---- loop IR text ---- */

/* Appends to a growing string (*s, *len); on out of memory the text is dropped (NULL). */
static void sappend(char **s, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sappend(char **s, size_t *len, const char *fmt, ...) {
  if (!*s && *len) return; /* dropped earlier */
  va_list ap;
  va_start(ap, fmt);
  char tmp[512];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n >= (int)sizeof tmp) n = (int)sizeof tmp - 1;
  char *t = realloc(*s, *len + (size_t)n + 1);
  if (!t) {
    free(*s), *s = NULL, *len = 1;
    return;
  }
  memcpy(t + *len, tmp, (size_t)n + 1);
  *s = t, *len += (size_t)n;
}

/* "%v = op(%a, %b)" */
static void node_text(char **s, size_t *len, const ir_graph *g, const ir_node *n) {
  sappend(s, len, "%%%d = %s(", n->out, prim_get(n->op)->name);
  for (int a = 0; a < n->n_in; a++) sappend(s, len, "%s%%%d", a ? ", " : "", ir_operands(g, n)[a]);
  sappend(s, len, ")");
}

/* A buffer's index expression: sum of loop indices times strides. */
static void index_text(char **s, size_t *len, int nd, const int64_t *sizes, const int64_t *strides, const char *const *names) {
  bool any = false;
  for (int d = 0; d < nd; d++) {
    if (!strides[d] || sizes[d] == 1) continue;
    if (strides[d] == 1) sappend(s, len, "%s%s", any ? " + " : "", names[d]);
    else sappend(s, len, "%s%s*%lld", any ? " + " : "", names[d], (long long)strides[d]);
    any = true;
  }
  if (!any) sappend(s, len, "0");
}

/* ---- code generation ---- */


static LLVMValueRef splat(cg *c, LLVMValueRef s, int w) {
  if (w == 1) return s;
  LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(s), (unsigned)w);
  LLVMValueRef v = LLVMBuildInsertElement(c->b, LLVMGetUndef(vt), s, LLVMConstInt(c->i64, 0, 0), "");
  LLVMValueRef zero_mask = LLVMConstNull(LLVMVectorType(LLVMInt32TypeInContext(c->ctx), (unsigned)w));
  return LLVMBuildShuffleVector(c->b, v, LLVMGetUndef(vt), zero_mask, "splat");
}

/* f32 and f64 kernels: the value types by dtype (bool buffers hold bytes), w lanes. A kernel that
 * holds an f64 value runs LANES / 2 lanes (one register of doubles); an f32-only kernel LANES. */
static bool is_float(em_dtype d) { return d == EM_F32 || d == EM_F64; }
/* i32, i64 and u8 values: two's complement, wrapping as eager's integer kernels */
static bool is_int(em_dtype d) { return d == EM_I32 || d == EM_I64 || d == EM_U8; }
static LLVMTypeRef elem_type(cg *c, em_dtype d) {
  switch (d) {
  case EM_BOOL: case EM_U8: return c->i8;
  case EM_F64: return c->f64;
  case EM_I64: return c->i64;
  case EM_I32: return LLVMInt32TypeInContext(c->ctx);
  default: return c->f32;
  }
}
static LLVMTypeRef lanes_of(LLVMTypeRef t, int w) { return w == 1 ? t : LLVMVectorType(t, (unsigned)w); }
static unsigned elem_align(em_dtype d) { return d == EM_BOOL || d == EM_U8 ? 1 : d == EM_F64 || d == EM_I64 ? 8 : 4; }
static bool wide(em_dtype d) { return d == EM_F64 || d == EM_I64; }
static int kernel_lanes(const ir_graph *g, const kernel *k) {
  for (int i = 0; i < k->n_in; i++)
    if (wide(g->values[k->in[i]].type.dtype)) return LANES / 2;
  for (int i = 0; i < k->n_nodes; i++) /* its outputs among them */
    if (wide(g->values[g->nodes[k->nodes[i]].out].type.dtype)) return LANES / 2;
  return LANES;
}
static LLVMValueRef dconst(cg *c, em_dtype d, double v, int w) {
  return splat(c, LLVMConstReal(d == EM_F64 ? c->f64 : c->f32, v), w);
}

/* A number the kernel's loops and offsets use that comes from the graph's sizes: an immediate,
 * or with sizes_as_args (cg.args) the next entry of the kernel's table, read at run time, so the
 * same kernel at other sizes is the same code. 0 and 1 stay immediates: the code's shape
 * depends on them (a broadcast, a contiguous row), so a value that is 0 or 1 at one size and not
 * at another gives other code, never wrong code. */
static LLVMValueRef kint(cg *c, int64_t v) {
  if (!c->args || v == 0 || v == 1) return LLVMConstInt(c->i64, (unsigned long long)v, 0);
  if (c->n_table == c->cap_table) {
    int cap = c->cap_table ? 2 * c->cap_table : 32;
    int64_t *t = realloc(c->table, sizeof(int64_t) * (size_t)cap);
    if (!t) {
      c->oom = true;
      return LLVMConstInt(c->i64, (unsigned long long)v, 0);
    }
    c->table = t, c->cap_table = cap;
  }
  c->table[c->n_table] = v;
  LLVMValueRef idx = LLVMConstInt(c->i64, (unsigned long long)c->n_table++, 0);
  LLVMValueRef x = LLVMBuildLoad2(c->b, c->i64, LLVMBuildGEP2(c->b, c->i64, c->tab, &idx, 1, ""), "");
  LLVMSetAlignment(x, 8);
  return x;
}

/* The same as a 32-bit integer (the gathers' lane offsets). */
static LLVMValueRef kint32(cg *c, int64_t v) {
  LLVMTypeRef i32 = LLVMInt32TypeInContext(c->ctx);
  if (!c->args || v == 0 || v == 1) return LLVMConstInt(i32, (unsigned long long)v, 0);
  return LLVMBuildTrunc(c->b, kint(c, v), i32, "");
}

/* Starts a kernel's table: its address, bufs[nb], loaded in the entry block. */
static void table_begin(cg *c, LLVMValueRef bufs, int nb) {
  c->n_table = 0;
  c->tab = NULL;
  if (!c->args) return;
  LLVMValueRef idx = LLVMConstInt(c->i64, (unsigned long long)nb, 0);
  c->tab = LLVMBuildLoad2(c->b, c->ptr, LLVMBuildGEP2(c->b, c->ptr, bufs, &idx, 1, ""), "table");
}

/* Hands the table's values to kernel k (run.c passes them as bufs[n_out + n_in]). */
static bool table_end(cg *c, kernel *k, char *err, size_t cap) {
  free(k->table);
  k->table = NULL, k->n_table = 0;
  if (c->oom) return ir_fail(err, cap, "out of memory");
  if (!c->args || !c->n_table) return true;
  if (!(k->table = malloc(sizeof(int64_t) * (size_t)c->n_table))) return ir_fail(err, cap, "out of memory");
  memcpy(k->table, c->table, sizeof(int64_t) * (size_t)c->n_table);
  k->n_table = c->n_table;
  return true;
}

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

/* ---- the LLVM renderer of pointwise expressions ----
 * A fused kernel computes in f32 and f64 (floats), i32, i64 and i8 (integers: i32, i64, u8) and
 * i1 (bools), w lanes at a time. Each pointwise node is its prim's scalar expression from the prim
 * table (prims.def), instantiated for the node's dtypes (prim_scalar_expr) and rendered
 * instruction by instruction; a node whose expression uses a scalar op this renderer lacks for
 * its dtypes (pow, remainder, f16 values, arithmetic on bools) is not fusible and runs as an
 * eager kernel. */

/* ---- f32 tanh and erf inline (issue 20; coefficients in prims/fast_f32.h) ----
 * SLEEF's f32 tanh (u35: 0.28 ns an element on one Zen 5 core) and erf (u10, the only class it
 * has: 1.4 ns) made GELU kernels compute-bound at a fraction of memory bandwidth. Both are odd
 * rational functions of x clamped to where the function rounds to +-1, as Eigen's and XLA's
 * fast f32 tanh and erf (the same coefficients), rendered as LLVM instructions: about 15
 * multiply-adds and one division a vector, no call. Each lane computes the same instructions at
 * any width, so an element's bits do not depend on the vector body or the tail. Measured over
 * every f32 (the 2^32 bit patterns; tests/test_inductor.c's inline_tanh_and_erf test sweeps them
 * densely against eager): tanh within 4.95 ULP and 2.95e-7 of the exact value, erf within 7.5
 * ULP and 4.5e-7 (erf(x) ~ 1.128 x is computed as x times the quotient, so tiny and subnormal x
 * keep their precision); from eager's SLEEF u10 results tanh 5 ULP and 3.0e-7, erf 7 ULP and
 * 4.2e-7: under 1/25 of the f32 tolerance of torch.testing (atol 1e-5, rtol 1.3e-6) and under
 * the fuzzer's atol 1e-6. NaN stays NaN,
 * +-inf gives +-1, +-0 gives +-0. f64 keeps SLEEF's u10 functions (eager f64 runs libm). */
/* a b + d, one rounding (as the exhaustive measurements and SLEEF's FMA builds) */
static LLVMValueRef fmuladd(cg *c, LLVMValueRef a, LLVMValueRef b, LLVMValueRef d) {
  const char *nm = "llvm.fma";
  unsigned id = LLVMLookupIntrinsicID(nm, strlen(nm));
  LLVMTypeRef t = LLVMTypeOf(a);
  LLVMValueRef f = LLVMGetIntrinsicDeclaration(c->mod, id, &t, 1), args[3] = {a, b, d};
  return LLVMBuildCall2(c->b, LLVMIntrinsicGetType(c->ctx, id, &t, 1), f, args, 3, "");
}

/* k[0] t^(n-1) + ... + k[n-1] by Horner's rule, w lanes of f32 */
static LLVMValueRef horner_f32(cg *c, LLVMValueRef t, const float *k, int n, int w) {
  LLVMValueRef p = dconst(c, EM_F32, k[0], w);
  for (int i = 1; i < n; i++) p = fmuladd(c, p, t, dconst(c, EM_F32, k[i], w));
  return p;
}

/* a clamped to [-lim, lim] (NaN passes: both compares are false) */
static LLVMValueRef clamp_f32(cg *c, LLVMValueRef a, float lim, int w) {
  LLVMBuilderRef b = c->b;
  LLVMValueRef hi = dconst(c, EM_F32, lim, w), lo = dconst(c, EM_F32, -lim, w);
  LLVMValueRef x = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, a, hi, ""), hi, a, "");
  return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, x, lo, ""), lo, x, "");
}

static LLVMValueRef fast_tanh_f32(cg *c, LLVMValueRef a, int w) {
  LLVMBuilderRef b = c->b;
  const float lim = FAST_TANH_LIM; /* the end of the fit; beyond it +-1 (4.5 ULP at most) */
  LLVMValueRef x = clamp_f32(c, a, lim, w), x2 = LLVMBuildFMul(b, x, x, "");
  LLVMValueRef q =
      LLVMBuildFDiv(b, horner_f32(c, x2, fast_tanh_num, 7, w), horner_f32(c, x2, fast_tanh_den, 4, w), "");
  LLVMValueRef abs = intrinsic(c, "llvm.fabs", a);
  LLVMValueRef sign1 = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, a, dconst(c, EM_F32, 0, w), ""),
                                       dconst(c, EM_F32, 1, w), dconst(c, EM_F32, -1, w), "");
  LLVMValueRef r = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, abs, dconst(c, EM_F32, lim, w), ""), sign1,
                                   LLVMBuildFMul(b, x, q, ""), "");
  /* below 0.0004, tanh(x) rounds to x (keeps -0 and the subnormals exact) */
  LLVMValueRef tiny = LLVMBuildFCmp(b, LLVMRealOLT, abs, dconst(c, EM_F32, FAST_TANH_TINY, w), "");
  return LLVMBuildSelect(b, tiny, a, r, "");
}

/* f32 exp: SLEEF's expf u10 algorithm (the function eager calls) instruction for instruction,
 * inline: q = rint(x / ln 2), s = x - q ln 2 in two FMAs, a degree-6 polynomial, times 2^q as
 * two powers of two (subnormal results), 0 below -104 and inf above 100. Over all 2^32 f32
 * inputs it gives eager's Sleef_expf16_u10 bits (NaN for NaN): the call cost a GELU's
 * backward as much as the rest of its kernel on 8 lanes. */
static LLVMValueRef fast_exp_f32(cg *c, LLVMValueRef d, int w) {
  static const float poly[] = {0.000198527617612853646278381f, 0.00139304355252534151077271f,
                               0.00833336077630519866943359f, 0.0416664853692054748535156f,
                               0.166666671633720397949219f, 0.5f};
  LLVMBuilderRef b = c->b;
  LLVMTypeRef i32 = lanes_of(LLVMInt32TypeInContext(c->ctx), w), f32 = lanes_of(c->f32, w);
  LLVMValueRef t = LLVMBuildFMul(b, d, dconst(c, EM_F32, 1.442695040888963407359924681001892137426645954152985934135449f, w), "");
  LLVMValueRef lo = dconst(c, EM_F32, -200, w), hi = dconst(c, EM_F32, 200, w);
  t = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, t, lo, ""), t, lo, ""); /* NaN too: q is defined */
  t = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, t, hi, ""), hi, t, "");
  LLVMValueRef qf = intrinsic(c, "llvm.rint", t), q = LLVMBuildFPToSI(b, qf, i32, "");
  LLVMValueRef s = fmuladd(c, qf, dconst(c, EM_F32, -0.693145751953125f, w), d);
  s = fmuladd(c, qf, dconst(c, EM_F32, -1.428606765330187045e-06f, w), s);
  LLVMValueRef u = horner_f32(c, s, poly, 6, w);
  u = LLVMBuildFAdd(b, dconst(c, EM_F32, 1, w), fmuladd(c, LLVMBuildFMul(b, s, s, ""), u, s), "");
  LLVMValueRef q1 = LLVMBuildAShr(b, q, splat(c, LLVMConstInt(LLVMInt32TypeInContext(c->ctx), 1, 0), w), "");
  LLVMValueRef qs[2] = {q1, LLVMBuildSub(b, q, q1, "")};
  for (int k = 0; k < 2; k++) { /* u * 2^qs[k]: the exponent field of a float */
    LLVMValueRef e = LLVMBuildAdd(b, qs[k], splat(c, LLVMConstInt(LLVMInt32TypeInContext(c->ctx), 0x7f, 0), w), "");
    e = LLVMBuildShl(b, e, splat(c, LLVMConstInt(LLVMInt32TypeInContext(c->ctx), 23, 0), w), "");
    u = LLVMBuildFMul(b, u, LLVMBuildBitCast(b, e, f32, ""), "");
  }
  LLVMValueRef under = LLVMBuildFCmp(b, LLVMRealOLT, d, dconst(c, EM_F32, -104, w), "");
  LLVMValueRef over = LLVMBuildFCmp(b, LLVMRealOLT, dconst(c, EM_F32, 100, w), d, "");
  u = LLVMBuildSelect(b, under, dconst(c, EM_F32, 0, w), u, "");
  return LLVMBuildSelect(b, over, dconst(c, EM_F32, INFINITY, w), u, "");
}

static LLVMValueRef fast_erf_f32(cg *c, LLVMValueRef a, int w) {
  LLVMBuilderRef b = c->b;
  /* beyond 4, erf rounds to +-1 in f32 */
  LLVMValueRef x = clamp_f32(c, a, FAST_ERF_LIM, w), x2 = LLVMBuildFMul(b, x, x, "");
  LLVMValueRef q =
      LLVMBuildFDiv(b, horner_f32(c, x2, fast_erf_num, 7, w), horner_f32(c, x2, fast_erf_den, 5, w), "");
  return LLVMBuildFMul(b, x, q, "");
}

/* exp, log, ...: SLEEF's u10 vector functions (1.0 ULP; the ones the eager kernels call), in the
 * vector body and, on a broadcast, in the scalar tail; libm without SLEEF. f32 tanh and erf are
 * inline rational functions instead, f32 exp SLEEF's own algorithm inline (above).
 * f64 (dt): SLEEF's f64 u10 functions over LANES / 2 lanes, tanh included: eager f64 runs glibc's
 * libm (under 1 ULP), and u10 is the class that matches it. An f32 value in a kernel of f64
 * lanes (w below LANES) goes through the same LANES-wide f32 function, its lanes widened and
 * then narrowed again, so its bits are those of an f32 kernel. */
static LLVMValueRef transcendental(cg *c, prim_sop op, LLVMValueRef *x, int n, int w, em_dtype dt) {
  const char *base = prim_sop_name(op);
  char name[64];
  LLVMValueRef r;
  bool f64 = dt == EM_F64;
  LLVMTypeRef et = f64 ? c->f64 : c->f32;
  if (!f64 && op == SOP_TANH) return fast_tanh_f32(c, x[0], w);
  if (!f64 && op == SOP_ERF) return fast_erf_f32(c, x[0], w);
  if (!f64 && op == SOP_EXP) return fast_exp_f32(c, x[0], w);
#ifdef EMBER_HAVE_SLEEF
  /* the scalar tail calls the same vector function on a broadcast and takes lane 0, so an
   * element's result does not depend on whether it fell in the vector body or the tail (with
   * libm in the tail, 1-ULP differences between neighbours of one row turned a comparison
   * of equal values around: found by the random programs) */
  int vw = f64 ? LANES / 2 : LANES;
  if (f64) snprintf(name, sizeof name, "Sleef_%sd%d_u10", base, vw);
  else snprintf(name, sizeof name, "Sleef_%sf%d_u10", base, LANES);
  LLVMValueRef args[2];
  if (w == 1 || w == vw) {
    for (int k = 0; k < n; k++) args[k] = w == 1 ? splat(c, x[k], vw) : x[k];
    r = call_fn(c, name, lanes_of(et, vw), args, n);
    if (w == 1) r = LLVMBuildExtractElement(c->b, r, LLVMConstInt(c->i64, 0, 0), "");
    return r;
  }
  /* w lanes, 1 < w < vw: widened (lane l of the wide vector is lane l % w), then narrowed */
  LLVMTypeRef i32 = LLVMInt32TypeInContext(c->ctx);
  LLVMValueRef wide[64], narrow[64];
  for (int l = 0; l < vw; l++) wide[l] = LLVMConstInt(i32, (unsigned)(l % w), 0);
  for (int l = 0; l < w; l++) narrow[l] = LLVMConstInt(i32, (unsigned)l, 0);
  for (int k = 0; k < n; k++)
    args[k] = LLVMBuildShuffleVector(c->b, x[k], LLVMGetUndef(LLVMTypeOf(x[k])), LLVMConstVector(wide, (unsigned)vw),
                                     "");
  r = call_fn(c, name, lanes_of(et, vw), args, n);
  return LLVMBuildShuffleVector(c->b, r, LLVMGetUndef(LLVMTypeOf(r)), LLVMConstVector(narrow, (unsigned)w), "");
#else
  snprintf(name, sizeof name, f64 ? "%s" : "%sf", base);
  if (w == 1) return call_fn(c, name, et, x, n);
  r = LLVMGetUndef(lanes_of(et, w));
  for (int l = 0; l < w; l++) {
    LLVMValueRef lanes[2], at = LLVMConstInt(c->i64, (unsigned)l, 0);
    for (int k = 0; k < n; k++) lanes[k] = LLVMBuildExtractElement(c->b, x[k], at, "");
    r = LLVMBuildInsertElement(c->b, r, call_fn(c, name, et, lanes, n), at, "");
  }
  return r;
#endif
}

/* x (w lanes of dtype from) as dtype to, where one of them is an integer: to bool x != 0, from
 * bool 0 or 1, between integers the low bits (sign- or zero-extended by from), to a float the
 * nearest value (C's conversions, as eager's); from a float as prims/pointwise.c's f2i: truncated
 * to i64, INT64_MIN for NaN and values out of its range, then the low bits. */
static LLVMValueRef int_cast(cg *c, LLVMValueRef x, em_dtype from, em_dtype to, int w) {
  LLVMBuilderRef b = c->b;
  LLVMTypeRef t = lanes_of(elem_type(c, to), w);
  if (is_float(from)) {
    LLVMTypeRef i64s = lanes_of(c->i64, w);
    LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOGE, x, dconst(c, from, -0x1p63, w), ""),
                                   LLVMBuildFCmp(b, LLVMRealOLT, x, dconst(c, from, 0x1p63, w), ""), "");
    LLVMValueRef v = LLVMBuildSelect(b, in, LLVMBuildFPToSI(b, x, i64s, ""),
                                     splat(c, LLVMConstInt(c->i64, 1ull << 63, 0), w), "");
    return to == EM_I64 ? v : LLVMBuildTrunc(b, v, t, "");
  }
  bool sgn = from == EM_I32 || from == EM_I64;
  if (to == EM_BOOL) return LLVMBuildICmp(b, LLVMIntNE, x, LLVMConstNull(LLVMTypeOf(x)), "");
  if (is_float(to)) return sgn ? LLVMBuildSIToFP(b, x, t, "") : LLVMBuildUIToFP(b, x, t, "");
  LLVMTypeRef xt = w == 1 ? LLVMTypeOf(x) : LLVMGetElementType(LLVMTypeOf(x));
  unsigned fb = LLVMGetIntTypeWidth(xt);
  unsigned tb = LLVMGetIntTypeWidth(elem_type(c, to));
  if (fb == tb) return x;
  if (fb > tb) return LLVMBuildTrunc(b, x, t, "");
  return sgn ? LLVMBuildSExt(b, x, t, "") : LLVMBuildZExt(b, x, t, "");
}

/* Whether the renderer has scalar op in (of expression e) for its dtypes. */
static bool llvm_renders(const prim_sexpr *e, const prim_sinst *in) {
  em_dtype d = in->dtype, x = in->n_in ? e->ins[in->in[0]].dtype : d;
  bool fl = is_float(d);
  switch (in->op) {
  case SOP_ARG: case SOP_CONST: return fl || is_int(d) || d == EM_BOOL;
  case SOP_CAST:
    return (fl || is_int(d) || d == EM_BOOL) && (is_float(x) || is_int(x) || x == EM_BOOL);
  case SOP_NEG: case SOP_ABS: case SOP_FLOOR: case SOP_CEIL: case SOP_ADD: case SOP_SUB: case SOP_MUL:
    return fl || is_int(d);
  case SOP_EXP: case SOP_LOG: case SOP_LOG1P: case SOP_EXPM1: case SOP_SQRT:
  case SOP_SIN: case SOP_COS: case SOP_TANH: case SOP_ERF: case SOP_DIV: case SOP_ATAN2:
    return fl;
  case SOP_EQ: case SOP_NE: case SOP_LT: case SOP_LE: case SOP_GT: case SOP_GE: case SOP_ISNAN:
  case SOP_AND: case SOP_OR: case SOP_NOT: case SOP_SELECT:
    return true;
  default: /* pow, rem */
    return false;
  }
}

/* Node n's expression instantiated for its dtypes (see prim_scalar_expr): computing in the dtype
 * of its first value operand. */
static bool node_expr(const ir_graph *g, const ir_node *n, prim_sexpr *e) {
  em_dtype args[3];
  const int *o = ir_operands(g, n);
  if (n->n_in > 3) return false;
  for (int k = 0; k < n->n_in; k++) args[k] = g->values[o[k]].type.dtype;
  em_dtype compute = args[n->op == EM_PRIM_WHERE ? 1 : 0];
  return prim_scalar_expr(n->op, args, compute, g->values[n->out].type.dtype, e);
}

bool ind_renders(const ir_graph *g, const ir_node *n) {
  if (!(prim_get(n->op)->flags & P_POINTWISE) || !ir_type_concrete(&g->values[n->out].type)) return false;
  prim_sexpr e;
  if (!node_expr(g, n, &e)) return false;
  for (int i = 0; i < e.n; i++)
    if (!llvm_renders(&e, &e.ins[i])) return false;
  return true;
}

bool ind_dtype_blocks(const ir_graph *g, const ir_node *n) {
  if (!(prim_get(n->op)->flags & P_POINTWISE) || !ir_type_concrete(&g->values[n->out].type)) return false;
  prim_sexpr e;
  if (!node_expr(g, n, &e)) return false;
  bool blocked = false;
  for (int i = 0; i < e.n; i++) {
    if (llvm_renders(&e, &e.ins[i])) continue;
    if (e.ins[i].op == SOP_POW || e.ins[i].op == SOP_REM) return false; /* not rendered for f32 either */
    blocked = true;
  }
  return blocked;
}

/* One node's value from its operands' (f32 as float, f64 as double, bool as i1), w lanes. */
static LLVMValueRef emit_node(cg *c, const ir_graph *g, const ir_node *n, LLVMValueRef *v, int w) {
  LLVMBuilderRef b = c->b;
  const int *o = ir_operands(g, n);
  switch (n->op) {
  case EM_PRIM_DETACH: case EM_PRIM_RESHAPE: case EM_PRIM_SQUEEZE: case EM_PRIM_UNSQUEEZE: return v[o[0]];
  default: break;
  }
  prim_sexpr e;
  if (!node_expr(g, n, &e)) return NULL;
  LLVMValueRef r[PRIM_SEXPR_MAX];
  for (int i = 0; i < e.n; i++) {
    const prim_sinst *in = &e.ins[i];
    LLVMValueRef x = in->n_in > 0 ? r[in->in[0]] : NULL, y = in->n_in > 1 ? r[in->in[1]] : NULL;
    em_dtype xd = in->n_in > 0 ? e.ins[in->in[0]].dtype : in->dtype;
    bool xf = in->n_in > 0 && is_float(xd);
    switch (in->op) {
    case SOP_ARG: r[i] = v[o[in->arg]]; break;
    case SOP_CONST:
      if (is_int(in->dtype))
        r[i] = splat(c, LLVMConstInt(elem_type(c, in->dtype), (unsigned long long)(long long)in->value, 1), w);
      else
        r[i] = in->dtype == EM_BOOL ? splat(c, LLVMConstInt(c->i1, in->value != 0, 0), w)
                                     : dconst(c, in->dtype, in->value, w);
      break;
    case SOP_CAST: /* float <-> bool: (bool)x is x != 0; f32 <-> f64 rounds to nearest, as C's casts */
      if (is_int(in->dtype) || is_int(xd)) {
        r[i] = int_cast(c, x, xd, in->dtype, w);
        break;
      }
      if (in->dtype == EM_BOOL) r[i] = LLVMBuildFCmp(b, LLVMRealUNE, x, dconst(c, xd, 0, w), "");
      else if (xd == EM_BOOL) r[i] = LLVMBuildUIToFP(b, x, lanes_of(elem_type(c, in->dtype), w), "");
      else if (in->dtype == EM_F64) r[i] = LLVMBuildFPExt(b, x, lanes_of(c->f64, w), "");
      else r[i] = LLVMBuildFPTrunc(b, x, lanes_of(c->f32, w), "");
      break;
    case SOP_NEG: r[i] = xf ? LLVMBuildFNeg(b, x, "") : LLVMBuildNeg(b, x, ""); break;
    case SOP_ABS:
      if (xf) r[i] = intrinsic(c, "llvm.fabs", x);
      else if (xd == EM_U8) r[i] = x;
      else /* wrapping: abs(INT_MIN) is INT_MIN, as eager */
        r[i] = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, x, LLVMConstNull(LLVMTypeOf(x)), ""),
                               LLVMBuildNeg(b, x, ""), x, "");
      break;
    case SOP_SQRT: r[i] = intrinsic(c, "llvm.sqrt", x); break;
    case SOP_FLOOR: r[i] = xf ? intrinsic(c, "llvm.floor", x) : x; break;
    case SOP_CEIL: r[i] = xf ? intrinsic(c, "llvm.ceil", x) : x; break;
    case SOP_EXP: case SOP_LOG: case SOP_LOG1P: case SOP_EXPM1: case SOP_SIN: case SOP_COS: case SOP_TANH:
    case SOP_ERF: case SOP_ATAN2:
      r[i] = transcendental(c, in->op, (LLVMValueRef[]){x, y}, in->n_in, w, in->dtype);
      break;
    case SOP_ADD: r[i] = xf ? LLVMBuildFAdd(b, x, y, "") : LLVMBuildAdd(b, x, y, ""); break;
    case SOP_SUB: r[i] = xf ? LLVMBuildFSub(b, x, y, "") : LLVMBuildSub(b, x, y, ""); break;
    case SOP_MUL: r[i] = xf ? LLVMBuildFMul(b, x, y, "") : LLVMBuildMul(b, x, y, ""); break;
    case SOP_DIV: r[i] = LLVMBuildFDiv(b, x, y, ""); break;
    case SOP_EQ: case SOP_NE: case SOP_LT: case SOP_LE: case SOP_GT: case SOP_GE: {
      static const LLVMRealPredicate rp[] = {LLVMRealOEQ, LLVMRealUNE, LLVMRealOLT, LLVMRealOLE, LLVMRealOGT, LLVMRealOGE};
      static const LLVMIntPredicate ip[] = {LLVMIntEQ, LLVMIntNE, LLVMIntULT, LLVMIntULE, LLVMIntUGT, LLVMIntUGE};
      static const LLVMIntPredicate sp[] = {LLVMIntEQ, LLVMIntNE, LLVMIntSLT, LLVMIntSLE, LLVMIntSGT, LLVMIntSGE};
      bool sgn = xd == EM_I32 || xd == EM_I64; /* bool and u8 compare unsigned */
      r[i] = xf ? LLVMBuildFCmp(b, rp[in->op - SOP_EQ], x, y, "")
                : LLVMBuildICmp(b, (sgn ? sp : ip)[in->op - SOP_EQ], x, y, "");
      break;
    }
    case SOP_ISNAN:
      r[i] = xf ? LLVMBuildFCmp(b, LLVMRealUNO, x, x, "") : splat(c, LLVMConstInt(c->i1, 0, 0), w);
      break;
    case SOP_AND: r[i] = LLVMBuildAnd(b, x, y, ""); break;
    case SOP_OR: r[i] = LLVMBuildOr(b, x, y, ""); break;
    case SOP_NOT: r[i] = LLVMBuildNot(b, x, ""); break;
    case SOP_SELECT: r[i] = LLVMBuildSelect(b, x, y, r[in->in[2]], ""); break;
    default: return NULL; /* not reached: ind_renders checked every instruction */
    }
  }
  return r[e.n - 1];
}

/* ---- random values (issue 20) ----
 *
 * A Philox uniform or normal inside a pointwise kernel: element i of its flattened result is made
 * from Philox call q = i/4 (f32) or i/2 (f64) with counter offset + q and key seed, exactly as the
 * eager kernel (prims/creation.c) makes it, so fused dropout masks are eager's bits. Each lane
 * runs the ten rounds for its own element's call (four lanes share a call for f32 and compute it
 * each: vector multiplies cost less than shuffling one call's words out to four lanes). seed and
 * offset are read at run time from bufs[n_out + n_in + 1 + r] (run.c reserves them per call), so
 * the code is the same every call and the kernel cache hits. The normals take eager's libm log,
 * cos and sin in double per lane (Box-Muller; SLEEF's would differ in the last bit), then round
 * to f32 once as eager does. */
typedef struct philox_ctr {
  LLVMValueRef seed, offset; /* i64, loaded in the kernel's entry block */
} philox_ctr;

static LLVMValueRef vconst32(cg *c, uint32_t v, int w) {
  return splat(c, LLVMConstInt(LLVMInt32TypeInContext(c->ctx), v, 0), w);
}

/* The four words of Philox4x32-10 for counters (lo, hi) (i64 lanes) and key (i64 scalar). */
static void philox_rounds(cg *c, LLVMValueRef lo, LLVMValueRef hi, LLVMValueRef key, int w, LLVMValueRef x[4]) {
  LLVMBuilderRef b = c->b;
  LLVMTypeRef i32 = LLVMInt32TypeInContext(c->ctx), v32 = lanes_of(i32, w), v64 = lanes_of(c->i64, w);
  LLVMValueRef s32 = splat(c, LLVMConstInt(c->i64, 32, 0), w);
  x[0] = LLVMBuildTrunc(b, lo, v32, ""), x[1] = LLVMBuildTrunc(b, LLVMBuildLShr(b, lo, s32, ""), v32, "");
  x[2] = LLVMBuildTrunc(b, hi, v32, ""), x[3] = LLVMBuildTrunc(b, LLVMBuildLShr(b, hi, s32, ""), v32, "");
  LLVMValueRef k0 = splat(c, LLVMBuildTrunc(b, key, i32, ""), w);
  LLVMValueRef k1 = splat(c, LLVMBuildTrunc(b, LLVMBuildLShr(b, key, LLVMConstInt(c->i64, 32, 0), ""), i32, ""), w);
  LLVMValueRef m0 = splat(c, LLVMConstInt(c->i64, 0xD2511F53u, 0), w), m1 = splat(c, LLVMConstInt(c->i64, 0xCD9E8D57u, 0), w);
  for (int r = 0; r < 10; r++) {
    if (r) k0 = LLVMBuildAdd(b, k0, vconst32(c, 0x9E3779B9u, w), ""), k1 = LLVMBuildAdd(b, k1, vconst32(c, 0xBB67AE85u, w), "");
    LLVMValueRef p0 = LLVMBuildMul(b, LLVMBuildZExt(b, x[0], v64, ""), m0, "");
    LLVMValueRef p1 = LLVMBuildMul(b, LLVMBuildZExt(b, x[2], v64, ""), m1, "");
    LLVMValueRef n0 = LLVMBuildXor(b, LLVMBuildXor(b, LLVMBuildTrunc(b, LLVMBuildLShr(b, p1, s32, ""), v32, ""), x[1], ""), k0, "");
    LLVMValueRef n2 = LLVMBuildXor(b, LLVMBuildXor(b, LLVMBuildTrunc(b, LLVMBuildLShr(b, p0, s32, ""), v32, ""), x[3], ""), k1, "");
    x[1] = LLVMBuildTrunc(b, p1, v32, ""), x[3] = LLVMBuildTrunc(b, p0, v32, "");
    x[0] = n0, x[2] = n2;
  }
}

/* Word sel (i32 lanes, values 0..n-1) of the n words x. */
static LLVMValueRef pick(cg *c, LLVMValueRef sel, LLVMValueRef *x, int n, int w) {
  LLVMValueRef r = x[n - 1];
  for (int q = n - 2; q >= 0; q--)
    r = LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, LLVMIntEQ, sel, vconst32(c, (uint32_t)q, w), ""), x[q], r, "");
  return r;
}

/* The 53-bit integer (hi << 32 | lo) >> 11 as a double (exact). */
static LLVMValueRef bits53(cg *c, LLVMValueRef lo, LLVMValueRef hi, int w) {
  LLVMBuilderRef b = c->b;
  LLVMTypeRef v64 = lanes_of(c->i64, w);
  LLVMValueRef h = LLVMBuildShl(b, LLVMBuildZExt(b, hi, v64, ""), splat(c, LLVMConstInt(c->i64, 32, 0), w), "");
  LLVMValueRef u = LLVMBuildOr(b, h, LLVMBuildZExt(b, lo, v64, ""), "");
  return LLVMBuildUIToFP(b, LLVMBuildLShr(b, u, splat(c, LLVMConstInt(c->i64, 11, 0), w), ""), lanes_of(c->f64, w), "");
}

/* Box-Muller's z0 (even elements) or z1 (odd) per lane, in double through libm, as eager. */
static LLVMValueRef box_muller(cg *c, LLVMValueRef u1, LLVMValueRef u2, LLVMValueRef odd, int w) {
  LLVMBuilderRef b = c->b;
  LLVMValueRef out = LLVMGetUndef(lanes_of(c->f64, w));
  for (int l = 0; l < w; l++) {
    LLVMValueRef li = LLVMConstInt(c->i64, (unsigned long long)l, 0);
    LLVMValueRef a = w == 1 ? u1 : LLVMBuildExtractElement(b, u1, li, "");
    LLVMValueRef t = w == 1 ? u2 : LLVMBuildExtractElement(b, u2, li, "");
    LLVMValueRef o = w == 1 ? odd : LLVMBuildExtractElement(b, odd, li, "");
    LLVMValueRef lg = call_fn(c, "log", c->f64, &a, 1);
    LLVMValueRef rad = intrinsic(c, "llvm.sqrt", LLVMBuildFMul(b, LLVMConstReal(c->f64, -2.0), lg, ""));
    LLVMValueRef th = LLVMBuildFMul(b, LLVMConstReal(c->f64, 6.28318530717958647692528676655900577), t, "");
    LLVMValueRef cs = call_fn(c, "cos", c->f64, &th, 1), sn = call_fn(c, "sin", c->f64, &th, 1);
    LLVMValueRef z = LLVMBuildFMul(b, rad, LLVMBuildSelect(b, o, sn, cs, ""), "");
    out = w == 1 ? z : LLVMBuildInsertElement(b, out, z, li, "");
  }
  return out;
}

/* f32 uniforms over w >= 4 lanes from flat index i0: the lanes need calls i0/4 .. (i0+w-1)/4, at
 * most w/4 + 1 of them, so w/2 lanes of rounds make each once (not once a lane: half the work of
 * the general path, which dominates a dropout kernel); each lane's word comes through one of four
 * shuffles, the one for s = i0 % 4 (the same for every lane). Bits as the general path. */
static LLVMValueRef philox_uniform_f32(cg *c, const philox_ctr *ctr, LLVMValueRef idx, int w) {
  LLVMBuilderRef b = c->b;
  int cw = w / 2;
  LLVMTypeRef i32 = LLVMInt32TypeInContext(c->ctx);
  LLVMValueRef lane[64];
  for (int l = 0; l < cw; l++) lane[l] = LLVMConstInt(c->i64, (unsigned long long)l, 0);
  LLVMValueRef q = LLVMBuildAdd(b, splat(c, LLVMBuildLShr(b, idx, LLVMConstInt(c->i64, 2, 0), ""), cw),
                                LLVMConstVector(lane, (unsigned)cw), "");
  LLVMValueRef off = splat(c, ctr->offset, cw), lo = LLVMBuildAdd(b, off, q, "");
  LLVMValueRef hi = LLVMBuildZExt(b, LLVMBuildICmp(b, LLVMIntULT, lo, off, ""), lanes_of(c->i64, cw), "");
  LLVMValueRef x[4];
  philox_rounds(c, lo, hi, ctr->seed, cw, x);
  LLVMValueRef cat[64];
  for (int l = 0; l < 2 * cw; l++) cat[l] = LLVMConstInt(i32, (unsigned long long)l, 0);
  LLVMValueRef both = LLVMConstVector(cat, (unsigned)(2 * cw));
  LLVMValueRef a = LLVMBuildShuffleVector(b, x[0], x[1], both, ""), bb = LLVMBuildShuffleVector(b, x[2], x[3], both, "");
  LLVMValueRef s = LLVMBuildTrunc(b, LLVMBuildAnd(b, idx, LLVMConstInt(c->i64, 3, 0), ""), i32, ""), r = NULL;
  for (int sv = 3; sv >= 0; sv--) { /* lane e: word (sv + e) % 4 of call (sv + e) / 4; a holds words 0, 1, bb 2, 3 */
    LLVMValueRef m[64];
    for (int e = 0; e < w; e++) {
      int f = sv + e, l = f >> 2, wd = f & 3;
      m[e] = LLVMConstInt(i32, (unsigned long long)(wd * cw + l), 0);
    }
    LLVMValueRef sh = LLVMBuildShuffleVector(b, a, bb, LLVMConstVector(m, (unsigned)w), "");
    r = r ? LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, s, LLVMConstInt(i32, (unsigned long long)sv, 0), ""), sh, r, "")
          : sh;
  }
  LLVMValueRef u = LLVMBuildLShr(b, r, vconst32(c, 8, w), "");
  return LLVMBuildFMul(b, LLVMBuildUIToFP(b, u, lanes_of(c->f32, w), ""), dconst(c, EM_F32, 0x1p-24, w), "");
}

/* Node n's w lanes at flat element index idx (i64 scalar: the first lane's). */
static LLVMValueRef emit_philox(cg *c, const ir_graph *g, const ir_node *n, const philox_ctr *ctr, LLVMValueRef idx,
                                int w) {
  LLVMBuilderRef b = c->b;
  bool f32 = g->values[n->out].type.dtype == EM_F32, normal = n->op == EM_PRIM_PHILOX_NORMAL;
  if (f32 && !normal && w >= 4) return philox_uniform_f32(c, ctr, idx, w);
  LLVMTypeRef i32 = LLVMInt32TypeInContext(c->ctx), v32 = lanes_of(i32, w), v64 = lanes_of(c->i64, w);
  LLVMValueRef i = splat(c, idx, w);
  if (w > 1) {
    LLVMValueRef lane[64];
    for (int l = 0; l < w; l++) lane[l] = LLVMConstInt(c->i64, (unsigned long long)l, 0);
    i = LLVMBuildAdd(b, i, LLVMConstVector(lane, (unsigned)w), "");
  }
  LLVMValueRef q = LLVMBuildLShr(b, i, splat(c, LLVMConstInt(c->i64, f32 ? 2 : 1, 0), w), "");
  LLVMValueRef off = splat(c, ctr->offset, w), lo = LLVMBuildAdd(b, off, q, "");
  LLVMValueRef hi = LLVMBuildZExt(b, LLVMBuildICmp(b, LLVMIntULT, lo, off, ""), v64, ""); /* the carry */
  LLVMValueRef x[4];
  philox_rounds(c, lo, hi, ctr->seed, w, x);
  LLVMValueRef word = LLVMBuildTrunc(b, LLVMBuildAnd(b, i, splat(c, LLVMConstInt(c->i64, f32 ? 3 : 1, 0), w), ""), v32, "");
  LLVMValueRef odd = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildAnd(b, word, vconst32(c, 1, w), ""), vconst32(c, 0, w), "");
  LLVMValueRef lo2[2] = {x[0], x[2]}, hi2[2] = {x[1], x[3]};
  if (!normal && f32) { /* (w >> 8) * 2^-24 */
    LLVMValueRef u = LLVMBuildLShr(b, pick(c, word, x, 4, w), vconst32(c, 8, w), "");
    return LLVMBuildFMul(b, LLVMBuildUIToFP(b, u, lanes_of(c->f32, w), ""), dconst(c, EM_F32, 0x1p-24, w), "");
  }
  if (!normal) /* word pair r: ((w[2r+1] << 32 | w[2r]) >> 11) * 2^-53 */
    return LLVMBuildFMul(b, bits53(c, pick(c, word, lo2, 2, w), pick(c, word, hi2, 2, w), w), dconst(c, EM_F64, 0x1p-53, w), "");
  LLVMValueRef u1, u2;
  if (f32) { /* pair j = (i % 4) / 2: u = (w + 1) * 2^-32 from words 2j, 2j + 1 */
    LLVMValueRef j = LLVMBuildLShr(b, word, vconst32(c, 1, w), "");
    LLVMValueRef one = dconst(c, EM_F64, 1, w), scale = dconst(c, EM_F64, 0x1p-32, w);
    u1 = LLVMBuildFMul(b, LLVMBuildFAdd(b, LLVMBuildUIToFP(b, pick(c, j, lo2, 2, w), lanes_of(c->f64, w), ""), one, ""), scale, "");
    u2 = LLVMBuildFMul(b, LLVMBuildFAdd(b, LLVMBuildUIToFP(b, pick(c, j, hi2, 2, w), lanes_of(c->f64, w), ""), one, ""), scale, "");
  } else { /* u = (b + 1) * 2^-53 from words (0, 1) and (2, 3) */
    LLVMValueRef one = dconst(c, EM_F64, 1, w), scale = dconst(c, EM_F64, 0x1p-53, w);
    u1 = LLVMBuildFMul(b, LLVMBuildFAdd(b, bits53(c, x[0], x[1], w), one, ""), scale, "");
    u2 = LLVMBuildFMul(b, LLVMBuildFAdd(b, bits53(c, x[2], x[3], w), one, ""), scale, "");
  }
  LLVMValueRef z = box_muller(c, u1, u2, odd, w);
  return f32 ? LLVMBuildFPTrunc(b, z, lanes_of(c->f32, w), "") : z;
}

/* Layout of one buffer of a kernel in the coalesced iteration space. A gathered input (flat
 * kernels, see ind_emit_kernel) reads element j of the flat column block at
 * sum_d ((j / div[d]) % size[d]) * stride[d] past its row offset. */
typedef struct buf_access {
  int64_t strides[EM_MAX_DIMS];
  em_dtype dtype;
  em_prim col; /* an output accumulating a column reduction (SUM, AMAX, AMIN), else -1 */
  int gather;  /* dims of the flat block it is gathered over; 0: not gathered */
  int64_t gsize[EM_MAX_DIMS], gstride[EM_MAX_DIMS], gdiv[EM_MAX_DIMS];
} buf_access;

/* The element offset (past the row's) of lanes j .. j+w-1 of gathered buffer a: i32 lanes (a
 * flat block's offsets fit, see ind_emit_kernel), so constant divisions stay vector code. */
static LLVMValueRef gather_offsets(cg *c, const buf_access *a, LLVMValueRef j, int w) {
  LLVMBuilderRef b = c->b;
  LLVMTypeRef i32 = LLVMInt32TypeInContext(c->ctx), vt = w == 1 ? i32 : LLVMVectorType(i32, (unsigned)w);
  LLVMValueRef f = LLVMBuildTrunc(b, j, i32, "");
  if (w > 1) {
    LLVMValueRef lane[64];
    for (int l = 0; l < w; l++) lane[l] = LLVMConstInt(i32, (unsigned long long)l, 0);
    f = LLVMBuildAdd(b, splat(c, f, w), LLVMConstVector(lane, (unsigned)w), "");
  }
  LLVMValueRef off = LLVMConstNull(vt);
  for (int d = 0; d < a->gather; d++) {
    if (a->gstride[d] == 0 || a->gsize[d] == 1) continue;
    LLVMValueRef q = a->gdiv[d] == 1 ? f : LLVMBuildUDiv(b, f, splat(c, kint32(c, a->gdiv[d]), w), "");
    if (d > 0) q = LLVMBuildURem(b, q, splat(c, kint32(c, a->gsize[d]), w), "");
    off = LLVMBuildAdd(b, off, LLVMBuildMul(b, q, splat(c, kint32(c, a->gstride[d]), w), ""), "");
  }
  return LLVMBuildZExt(b, off, w == 1 ? c->i64 : LLVMVectorType(c->i64, (unsigned)w), "");
}

/* w lanes of gathered buffer a at row offset rowoff, columns j..: one llvm.masked.gather. */
static LLVMValueRef gather_load(cg *c, LLVMValueRef base, LLVMValueRef rowoff, const buf_access *a, LLVMValueRef j, int w) {
  LLVMBuilderRef b = c->b;
  bool is_bool = a->dtype == EM_BOOL;
  LLVMTypeRef et = elem_type(c, a->dtype);
  LLVMValueRef off = LLVMBuildAdd(b, gather_offsets(c, a, j, w), splat(c, rowoff, w), "");
  LLVMValueRef x;
  if (w == 1) {
    x = LLVMBuildLoad2(b, et, LLVMBuildGEP2(b, et, base, &off, 1, ""), "");
    LLVMSetAlignment(x, elem_align(a->dtype));
  } else {
    LLVMValueRef ptrs = LLVMBuildGEP2(b, et, base, &off, 1, "");
    LLVMTypeRef vt = lanes_of(et, w), tys[2] = {vt, LLVMTypeOf(ptrs)};
    const char *nm = "llvm.masked.gather";
    unsigned id = LLVMLookupIntrinsicID(nm, strlen(nm));
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(c->mod, id, tys, 2);
    LLVMValueRef ones[64];
    for (int l = 0; l < w; l++) ones[l] = LLVMConstInt(c->i1, 1, 0);
    LLVMValueRef args[4] = {ptrs, LLVMConstInt(LLVMInt32TypeInContext(c->ctx), elem_align(a->dtype), 0),
                            LLVMConstVector(ones, (unsigned)w), LLVMGetUndef(vt)};
    x = LLVMBuildCall2(b, LLVMIntrinsicGetType(c->ctx, id, tys, 2), fn, args, 4, "");
  }
  if (is_bool) x = LLVMBuildICmp(b, LLVMIntNE, x, LLVMConstNull(lanes_of(c->i8, w)), "");
  return x;
}

/* Emits the loads, the node computations and the stores of one iteration: lanes w, buffers at
 * element offsets off[] (outputs first). */
static LLVMValueRef combine(cg *c, em_prim op, LLVMValueRef a, LLVMValueRef x);

/* One element (w == 1) or w lanes of a buffer at element offset off: a vector load when the
 * lanes are contiguous, else one load broadcast; bool buffers hold bytes, values are i1. */
static LLVMValueRef load_elem(cg *c, LLVMValueRef base, LLVMValueRef off, em_dtype dt, int w, bool contiguous) {
  LLVMBuilderRef b = c->b;
  bool is_bool = dt == EM_BOOL;
  LLVMTypeRef et = elem_type(c, dt);
  LLVMValueRef p = LLVMBuildGEP2(b, et, base, &off, 1, "");
  LLVMValueRef x;
  if (w > 1 && contiguous) {
    x = LLVMBuildLoad2(b, lanes_of(et, w), p, "");
    LLVMSetAlignment(x, elem_align(dt));
  } else {
    x = LLVMBuildLoad2(b, et, p, "");
    LLVMSetAlignment(x, elem_align(dt));
    x = splat(c, x, w);
  }
  if (is_bool) x = LLVMBuildICmp(b, LLVMIntNE, x, LLVMConstNull(lanes_of(c->i8, w)), "");
  return x;
}

/* Stores x (w lanes, contiguous) at element offset off. */
static void store_elem(cg *c, LLVMValueRef base, LLVMValueRef off, em_dtype dt, LLVMValueRef x, int w) {
  bool is_bool = dt == EM_BOOL;
  if (is_bool) x = LLVMBuildZExt(c->b, x, lanes_of(c->i8, w), "");
  LLVMValueRef p = LLVMBuildGEP2(c->b, elem_type(c, dt), base, &off, 1, "");
  LLVMSetAlignment(LLVMBuildStore(c->b, x, p), elem_align(dt));
}

/* `void name(char **bufs, i64 r0, i64 r1, i64 j0, i64 j1, float *scratch)` for the host CPU. */
static LLVMValueRef kernel_function(cg *c, const char *name) {
  LLVMTypeRef params[6] = {c->ptr, c->i64, c->i64, c->i64, c->i64, c->ptr};
  LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(c->ctx), params, 6, 0);
  LLVMValueRef fn = LLVMAddFunction(c->mod, name, ft);
  LLVMAddTargetDependentFunctionAttr(fn, "target-cpu", ind_host_cpu);
  LLVMAddTargetDependentFunctionAttr(fn, "target-features", ind_host_features);
  return fn;
}

static void emit_body(cg *c, const ir_graph *g, const kernel *k, LLVMValueRef *base, LLVMValueRef *off,
                      const buf_access *acc, int inner, int w, LLVMValueRef *vals, LLVMValueRef j, const philox_ctr *ctr) {
  int r = 0; /* random nodes so far: off[n_out + n_in] is their flat element index */
  for (int i = 0; i < k->n_in; i++) {
    const buf_access *a = &acc[k->n_out + i];
    vals[k->in[i]] = a->gather ? gather_load(c, base[k->n_out + i], off[k->n_out + i], a, j, w)
                               : load_elem(c, base[k->n_out + i], off[k->n_out + i], a->dtype, w, a->strides[inner] == 1);
  }
  for (int e = 0; e < k->n_nodes; e++) {
    const ir_node *n = &g->nodes[k->nodes[e]];
    bool col = false;
    for (int i = 0; i < k->n_out && !col; i++) col = k->out[i] == n->out && acc[i].col != (em_prim)-1;
    if (prim_get(n->op)->flags & P_RANDOM) vals[n->out] = emit_philox(c, g, n, &ctr[r++], off[k->n_out + k->n_in], w);
    else vals[n->out] = col ? vals[ir_operands(g, n)[0]] : emit_node(c, g, n, vals, w);
  }
  for (int i = 0; i < k->n_out; i++) {
    LLVMValueRef x = vals[k->out[i]];
    if (acc[i].col != (em_prim)-1) /* out[column] = out[column] op x */
      x = combine(c, acc[i].col, load_elem(c, base[i], off[i], acc[i].dtype, w, true), x);
    store_elem(c, base[i], off[i], acc[i].dtype, x, w);
  }
}

/* Element offsets of every buffer at column j of the current row. */
static void column_offsets(cg *c, const buf_access *acc, int nb, int inner, LLVMValueRef *row, LLVMValueRef j,
                           LLVMValueRef *off) {
  for (int bi = 0; bi < nb; bi++)
    off[bi] = acc[bi].strides[inner]
                  ? LLVMBuildAdd(c->b, row[bi],
                                 LLVMBuildMul(c->b, j, kint(c, acc[bi].strides[inner]), ""), "")
                  : row[bi];
}

/* Flat kernels. When the innermost coalesced dim is shorter than a vector, or some input does
 * not run along it with stride 0 or 1 (a transposed or window-strided read), the innermost
 * dims form one flat column block instead, as long as the outputs (contiguous) allow: the
 * vector loop runs over it, an input dense or broadcast across the block is loaded as usual,
 * any other is gathered (gather_load). Max-pooling's backward over [N, C, H/2, 2, W/2, 2] ran
 * 2-lane vectors at 7 GB/s before. Blocks stop growing at 64 vectors; their offsets must fit
 * in 31 bits. Column-reduction outputs keep the plain loops. */
static void flatten(buf_access *acc, int nb, int n_out, int64_t *sizes, int *nd_io, int lanes) {
  int nd = *nd_io, inner = nd - 1;
  bool vec = true;
  for (int bi = 0; bi < nb; bi++) vec = vec && (acc[bi].strides[inner] == 0 || acc[bi].strides[inner] == 1);
  if (vec && sizes[inner] >= lanes) return;
  for (int bi = 0; bi < n_out; bi++)
    if (acc[bi].col != (em_prim)-1) return;
  int s = inner;
  int64_t block = sizes[inner];
  while (s > 0 && block < 64 * lanes && block * sizes[s - 1] < ((int64_t)1 << 30)) block *= sizes[--s];
  if (block < lanes) return;
  for (int bi = 0; bi < nb; bi++) { /* every offset inside the block fits in 31 bits */
    int64_t span = 0;
    for (int d = s; d < nd; d++) {
      if (acc[bi].strides[d] < 0) return;
      span += (sizes[d] - 1) * acc[bi].strides[d];
    }
    if (span >= ((int64_t)1 << 31)) return;
  }
  for (int bi = 0; bi < nb; bi++) {
    buf_access *a = &acc[bi];
    bool dense = true, bcast = true;
    int64_t run = 1;
    for (int d = nd - 1; d >= s; d--) {
      dense = dense && (sizes[d] == 1 || a->strides[d] == run);
      bcast = bcast && (sizes[d] == 1 || a->strides[d] == 0);
      run *= sizes[d];
    }
    if (dense || bcast) {
      a->strides[s] = dense ? 1 : 0;
      continue;
    }
    a->gather = nd - s;
    int64_t div = 1;
    for (int d = nd - 1; d >= s; d--) {
      a->gsize[d - s] = sizes[d], a->gstride[d - s] = a->strides[d], a->gdiv[d - s] = div;
      div *= sizes[d];
    }
    a->strides[s] = 0; /* the gather adds the column part */
  }
  sizes[s] = block;
  *nd_io = s + 1;
}

/* Emits pointwise kernel k as `void name(char **bufs, r0, r1, j0, j1, scratch)`: outer loops over the coalesced leading dims, the
 * innermost dim vectorized when every buffer's innermost stride is 0 or 1, a scalar tail. Its
 * vectors have LANES lanes, LANES / 2 when it holds an f64 value (read, computed or stored). */
bool ind_emit_kernel(cg *c, const ir_graph *g, const prim_meta *meta, const signed char *kind, kernel *k, char *err,
                     size_t cap) {
  const ir_type *t = &k->shape;
  int nb = k->n_out + k->n_in;
  /* with random nodes, acc[nb] is no buffer but their flat element index: contiguous strides
   * over S, coalesced and flattened like an output, its offset the index */
  int nx = nb + (k->n_rng > 0);
  buf_access acc[129];
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
  int64_t st[129][EM_MAX_DIMS];
  if (nx > nb) {
    acc[nb].dtype = EM_I64, acc[nb].col = (em_prim)-1;
    for (int d = 0; d < t->ndim; d++) st[nb][d] = cont[d];
  }
  for (int bi = 0; bi < nb; bi++) {
    int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
    acc[bi].col = bi < k->n_out && kind[v] == K_COL ? EM_PRIM_SUM : (em_prim)-1;
    if (acc[bi].col != (em_prim)-1) { /* a column reduction: its element for the kept dims, 0 across the reduced */
      const ir_node *rn = NULL;
      for (int i = 0; i < k->n_nodes && !rn; i++)
        if (g->nodes[k->nodes[i]].out == v) rn = &g->nodes[k->nodes[i]];
      acc[bi].col = rn->op;
      int lead = leading_reduction(g, rn);
      int64_t run = 1;
      for (int d = t->ndim - 1; d >= 0; d--) {
        st[bi][d] = d < lead ? 0 : run;
        if (d >= lead) run *= t->sizes[d];
      }
      continue;
    }
    for (int d = 0; d < t->ndim; d++) st[bi][d] = bi < k->n_out ? cont[d] : meta[v].strides[d];
  }
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 1) continue; /* size-1 dims contribute nothing */
    bool merge = nd > 0;
    for (int bi = 0; merge && bi < nx; bi++) merge = acc[bi].strides[nd - 1] == st[bi][d] * t->sizes[d];
    if (merge) {
      sizes[nd - 1] *= t->sizes[d];
      for (int bi = 0; bi < nx; bi++) acc[bi].strides[nd - 1] = st[bi][d];
    } else {
      sizes[nd] = t->sizes[d];
      for (int bi = 0; bi < nx; bi++) acc[bi].strides[nd] = st[bi][d];
      nd++;
    }
  }
  if (nd == 0) { /* a single element */
    sizes[0] = 1;
    for (int bi = 0; bi < nx; bi++) acc[bi].strides[0] = 0;
    nd = 1;
  }
  int W = kernel_lanes(g, k);
  for (int bi = 0; bi < nx; bi++) acc[bi].gather = 0;
  flatten(acc, nx, k->n_out, sizes, &nd, W);
  int inner = nd - 1;
  bool vec = true;
  for (int bi = 0; bi < nx; bi++) vec = vec && (acc[bi].gather || acc[bi].strides[inner] == 0 || acc[bi].strides[inner] == 1);
  int64_t outer = 1;
  for (int d = 0; d < inner; d++) outer *= sizes[d];
  int64_t cols = sizes[inner];

  k->rows = outer, k->cols = cols;
  { /* loop IR: for i0..: for j (vectorized): loads, node expressions, stores */
    char *txt = NULL;
    size_t len = 0;
    static const char *const names[] = {"i0", "i1", "i2", "i3", "i4", "i5", "i6", "i7"};
    const char *nm[EM_MAX_DIMS];
    for (int d = 0; d < nd; d++) nm[d] = d == inner ? "j" : names[d < 8 ? d : 7];
    sappend(&txt, &len, "    for");
    for (int d = 0; d < nd; d++) sappend(&txt, &len, " %s in [0,%lld)%s", nm[d], (long long)sizes[d], d + 1 < nd ? "," : "");
    sappend(&txt, &len, "%s:\n", vec ? " (j vectorized)" : "");
    for (int i = 0; i < k->n_in; i++) {
      const buf_access *a = &acc[k->n_out + i];
      sappend(&txt, &len, "      %%%d = %s in%d[", k->in[i], a->gather ? "gather" : "load", i);
      index_text(&txt, &len, nd, sizes, a->strides, nm);
      if (a->gather) { /* j split over the block's dims: (size, stride) from the outermost */
        sappend(&txt, &len, " + j over");
        for (int d = 0; d < a->gather; d++) sappend(&txt, &len, " (%lld, %lld)", (long long)a->gsize[d], (long long)a->gstride[d]);
      }
      sappend(&txt, &len, "]\n");
    }
    for (int i = 0; i < k->n_nodes; i++) {
      sappend(&txt, &len, "      ");
      node_text(&txt, &len, g, &g->nodes[k->nodes[i]]);
      if (prim_get(g->nodes[k->nodes[i]].op)->flags & P_RANDOM) { /* its element: the flat index */
        sappend(&txt, &len, " at element ");
        index_text(&txt, &len, nd, sizes, acc[nb].strides, nm);
      }
      sappend(&txt, &len, "\n");
    }
    for (int o = 0; o < k->n_out; o++) {
      sappend(&txt, &len, "      %s out%d[", acc[o].col != (em_prim)-1 ? "accumulate" : "store", o);
      index_text(&txt, &len, nd, sizes, acc[o].strides, nm);
      sappend(&txt, &len, "] = %%%d\n", k->out[o]);
    }
    k->loop_ir = txt;
  }
  LLVMBuilderRef b = c->b;
  LLVMValueRef fn = kernel_function(c, k->name);
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
  table_begin(c, bufs, nb);
  philox_ctr ctr[64];
  if (k->n_rng > 64) return ir_fail(err, cap, "kernel with %d random nodes", k->n_rng);
  for (int r = 0; r < k->n_rng; r++) { /* {seed, offset} of random node r, after the table's slot */
    LLVMValueRef idx = LLVMConstInt(c->i64, (unsigned long long)(nb + 1 + r), 0);
    LLVMValueRef pc = LLVMBuildLoad2(b, c->ptr, LLVMBuildGEP2(b, c->ptr, bufs, &idx, 1, ""), "");
    LLVMValueRef one_ = LLVMConstInt(c->i64, 1, 0);
    ctr[r].seed = LLVMBuildLoad2(b, c->i64, pc, "seed");
    ctr[r].offset = LLVMBuildLoad2(b, c->i64, LLVMBuildGEP2(b, c->i64, pc, &one_, 1, ""), "offset");
  }
  LLVMBuildBr(b, ohdr);
  LLVMValueRef zero = LLVMConstInt(c->i64, 0, 0), one = LLVMConstInt(c->i64, 1, 0);
  /* outer: r in [0, outer) */
  LLVMPositionBuilderAtEnd(b, ohdr);
  LLVMValueRef r = LLVMBuildPhi(b, c->i64, "r");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, r, r1, ""), obody, exitb);
  LLVMPositionBuilderAtEnd(b, obody);
  LLVMValueRef row[129];
  for (int bi = 0; bi < nx; bi++) row[bi] = zero;
  LLVMValueRef rem = r;
  for (int d = inner - 1; d >= 0; d--) { /* r's index in each leading dim (sizes are constants) */
    LLVMValueRef sz = d > 0 ? kint(c, sizes[d]) : NULL;
    LLVMValueRef id = d > 0 ? LLVMBuildURem(b, rem, sz, "") : rem;
    if (d > 0) rem = LLVMBuildUDiv(b, rem, sz, "");
    for (int bi = 0; bi < nx; bi++)
      if (acc[bi].strides[d]) row[bi] = LLVMBuildAdd(b, row[bi], LLVMBuildMul(b, id, kint(c, acc[bi].strides[d]), ""), "");
  }
  LLVMBuildBr(b, vhdr);
  /* vector loop: j in steps of W while j + W <= cols */
  LLVMPositionBuilderAtEnd(b, vhdr);
  LLVMValueRef j = LLVMBuildPhi(b, c->i64, "j");
  LLVMValueRef lanes = LLVMConstInt(c->i64, (unsigned long long)W, 0), ncols = j1;
  LLVMValueRef vcond = vec ? LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildAdd(b, j, lanes, ""), ncols, "")
                           : LLVMConstInt(c->i1, 0, 0);
  LLVMBuildCondBr(b, vcond, vbody, thdr);
  LLVMValueRef *vals = calloc((size_t)g->n_values + 1, sizeof(LLVMValueRef));
  if (!vals) return ir_fail(err, cap, "out of memory");
  LLVMPositionBuilderAtEnd(b, vbody);
  LLVMValueRef off[129];
  column_offsets(c, acc, nx, inner, row, j, off);
  if (vec) emit_body(c, g, k, base, off, acc, inner, W, vals, j, ctr);
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
  column_offsets(c, acc, nx, inner, row, t2, off);
  emit_body(c, g, k, base, off, acc, inner, 1, vals, t2, ctr);
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
  return table_end(c, k, err, cap);
}

/* ---- row kernels ----
 *
 * Per row: the loads of per-row inputs, then passes over the row's columns. Pass p computes the
 * FULL values whose inputs are ready at p (avail), accumulates the reductions whose operand is
 * one of them, stores the FULL outputs made in it and spills to scratch the values a later pass
 * reads; between passes the finished reductions become per-row scalars and the ROW values that
 * depend on them are computed. Each value is computed once per row; several passes over a row
 * run in cache. Vector body (LANES lanes; LANES / 2 in a kernel with f64 values, whose
 * reductions accumulate in f64 and whose f64 spills take two scratch rows) plus scalar tail,
 * accumulators in stack slots that mem2reg turns into registers. */

enum { UNROLL = 4 }; /* vectors per step of a pass that reduces: independent accumulator chains */

typedef struct rowgen {
  cg *c;
  const ir_graph *g;
  const kernel *k;
  const signed char *kind; /* of the kernel's own values; 0 for what it reads from outside */
  int *avail;           /* [n_values] pass at which a value is ready (externals 0) */
  int *red_pass;        /* [n_values] pass a reduction's result accumulates in, or -1 */
  int *spill;           /* [n_values] scratch row of a spilled value, or -1 */
  int *buf;             /* [n_values] buffer index of a kernel input or output, or -1 */
  bool *is_full_buf;    /* [buffers] */
  int64_t *inner;       /* [buffers] FULL buffers: stride of the coalesced columns */
  LLVMValueRef *base, *rowoff, *rowval, *vals, scratch, acc_v[64][4], acc_s[64];
  LLVMValueRef *rcp;    /* [n_values] a division's per-row reciprocal of its divisor, or NULL */
  bool use_rcp;         /* the pass being emitted multiplies by rcp instead of dividing */
  int n_acc, acc_of[64];
  int W; /* vector lanes: LANES, LANES / 2 when the kernel holds an f64 value */
} rowgen;

/* a op x for the accumulator a: a NaN in x or in a stays (torch.amax propagates NaN); the chain
 * through a is one compare and one select. */
static LLVMValueRef combine(cg *c, em_prim op, LLVMValueRef a, LLVMValueRef x) {
  LLVMBuilderRef b = c->b;
  if (op == EM_PRIM_SUM) return LLVMBuildFAdd(b, a, x, "");
  LLVMValueRef better = LLVMBuildFCmp(b, op == EM_PRIM_AMAX ? LLVMRealOGT : LLVMRealOLT, x, a, "");
  return LLVMBuildSelect(b, LLVMBuildOr(b, better, LLVMBuildFCmp(b, LLVMRealUNO, x, x, ""), ""), x, a, "");
}




/* The start of v's scratch row. Rows are cols floats apart whatever v's dtype: indexing the
 * scratch in v's own element type (bytes for bool) made a bool row overlap the float rows
 * before it (issue 15: a comparison spilled beside a float corrupted that float's row). */
static LLVMValueRef scratch_row(rowgen *r, int v) {
  LLVMValueRef off = kint(r->c, (int64_t)r->spill[v] * r->k->cols);
  return LLVMBuildGEP2(r->c->b, r->c->f32, r->scratch, &off, 1, "");
}

/* The node of kernel k that computes value v, or NULL (an input of the kernel). */
static const ir_node *kernel_node(const ir_graph *g, const kernel *k, int v) {
  for (int i = 0; i < k->n_nodes; i++)
    if (g->nodes[k->nodes[i]].out == v) return &g->nodes[k->nodes[i]];
  return NULL;
}

/* The per-row value (its rowval) that value u equals at every column of a row, or -1: a per-row
 * value of the kernel, a per-row input, or an in-kernel expand (through detaches) of one. */
static int row_invariant(const rowgen *r, int u) {
  int bi = r->buf[u];
  if (r->kind[u] == K_ROW || (bi >= 0 && !r->is_full_buf[bi] && !r->kind[u])) return u;
  const ir_node *n = r->kind[u] == K_FULL ? kernel_node(r->g, r->k, u) : NULL;
  if (n && n->op == EM_PRIM_EXPAND) return ir_operands(r->g, n)[0];
  if (n && n->op == EM_PRIM_DETACH) return row_invariant(r, ir_operands(r->g, n)[0]);
  return -1;
}

/* The value of v at column j of the current row in pass `pass`, w lanes. */
static LLVMValueRef row_get(rowgen *r, int v, int pass, LLVMValueRef j, int w) {
  if (r->vals[v]) return r->vals[v];
  cg *c = r->c;
  const ir_graph *g = r->g;
  LLVMValueRef x;
  int bi = r->buf[v], ri = row_invariant(r, v);
  if (ri >= 0) { /* a per-row value, or an expand of one */
    x = splat(c, r->rowval[ri], w);
  } else if (!r->kind[v]) { /* an external FULL input */
    LLVMValueRef off = r->inner[bi] ? LLVMBuildAdd(c->b, r->rowoff[bi], LLVMBuildMul(c->b, j, kint(c, r->inner[bi]), ""), "")
                                    : r->rowoff[bi];
    x = load_elem(c, r->base[bi], off, g->values[v].type.dtype, w, r->inner[bi] == 1);
  } else {
    const ir_node *n = kernel_node(g, r->k, v);
    if (n->op == EM_PRIM_DETACH) {
      x = row_get(r, ir_operands(g, n)[0], pass, j, w);
    } else if (bi >= 0) { /* made in an earlier pass and stored: read it back */
      LLVMValueRef off = LLVMBuildAdd(c->b, r->rowoff[bi], j, "");
      x = load_elem(c, r->base[bi], off, g->values[v].type.dtype, w, true);
    } else {
      EM_ASSERT(r->spill[v] >= 0);
      x = load_elem(c, scratch_row(r, v), j, g->values[v].type.dtype, w, true);
    }
  }
  return r->vals[v] = x;
}

/* One column step of pass `pass` at column j, w lanes, accumulating into accumulator set u. */
static void row_body(rowgen *r, int pass, LLVMValueRef j, int w, int u) {
  cg *c = r->c;
  const ir_graph *g = r->g;
  const kernel *k = r->k;
  for (int v = 0; v < g->n_values; v++) r->vals[v] = NULL;
  for (int i = 0; i < k->n_nodes; i++) {
    const ir_node *n = &g->nodes[k->nodes[i]];
    if (r->red_pass[n->out] == pass) {
      int a = 0;
      while (r->acc_of[a] != n->out) a++;
      LLVMValueRef slot = w > 1 ? r->acc_v[a][u] : r->acc_s[a];
      LLVMValueRef acc = LLVMBuildLoad2(c->b, lanes_of(elem_type(c, g->values[n->out].type.dtype), w), slot, "");
      LLVMBuildStore(c->b, combine(c, n->op, acc, row_get(r, ir_operands(g, n)[0], pass, j, w)), slot);
      continue;
    }
    if (r->kind[n->out] != K_FULL || r->avail[n->out] != pass) continue;
    if (n->op == EM_PRIM_EXPAND || n->op == EM_PRIM_DETACH) {
      row_get(r, n->out, pass, j, w);
      continue;
    }
    for (int a = 0; a < n->n_in; a++) row_get(r, ir_operands(g, n)[a], pass, j, w);
    if (r->use_rcp && r->rcp[n->out])
      r->vals[n->out] = LLVMBuildFMul(c->b, r->vals[ir_operands(g, n)[0]], splat(c, r->rcp[n->out], w), "");
    else r->vals[n->out] = emit_node(c, g, n, r->vals, w);
  }
  for (int i = 0; i < k->n_nodes; i++) {
    int v = g->nodes[k->nodes[i]].out;
    if (r->kind[v] != K_FULL || r->avail[v] != pass) continue;
    int bi = r->buf[v];
    if (bi >= 0) store_elem(c, r->base[bi], LLVMBuildAdd(c->b, r->rowoff[bi], j, ""), g->values[v].type.dtype, row_get(r, v, pass, j, w), w);
    if (r->spill[v] >= 0) store_elem(c, scratch_row(r, v), j, g->values[v].type.dtype, row_get(r, v, pass, j, w), w);
  }
}

/* Per-row values with avail == pass, in order. */
static void row_scalars(rowgen *r, int pass) {
  const ir_graph *g = r->g;
  for (int i = 0; i < r->k->n_nodes; i++) {
    const ir_node *n = &g->nodes[r->k->nodes[i]];
    if (r->kind[n->out] != K_ROW || r->avail[n->out] != pass || r->red_pass[n->out] >= 0) continue;
    if (prim_get(n->op)->flags & P_VIEW) r->rowval[n->out] = r->rowval[ir_operands(g, n)[0]];
    else r->rowval[n->out] = emit_node(r->c, g, n, r->rowval, 1);
  }
}

/* The divisor's per-row value when node n is a float division by a row-invariant divisor, else -1. */
static int divides_per_row(const rowgen *r, const ir_node *n) {
  if (n->op != EM_PRIM_DIV || r->kind[n->out] != K_FULL) return -1;
  em_dtype dt = r->g->values[n->out].type.dtype;
  const int *o = ir_operands(r->g, n);
  if (!is_float(dt) || r->g->values[o[0]].type.dtype != dt || r->g->values[o[1]].type.dtype != dt) return -1;
  return row_invariant(r, o[1]);
}

/* Divisions in pass `pass` whose divisor is the same at every column of a row (softmax's
 * exp / sum, a normalization's x / norm) multiply by the divisor's reciprocal, computed once a
 * row, as PyTorch's softmax kernels do: a division costs 4-10 times a multiply and was a fifth of
 * the softmax row kernel's cycles (llvm-mca, Zen 4). x * (1/s) rounds twice: its relative error
 * is at most 2u + u^2 (u = 2^-24 for f32, 2^-53 for f64; 1.2e-7 in f32) where the quotient's is
 * u, so it is not always eager's bits, but within the f32 tolerance by three orders of magnitude;
 * that holds only where 1/s is a normal number (no overflow, no subnormal precision loss).
 * Returns the per-row condition for it (every such divisor's magnitude in
 * [2^-126, 2^126], f64 [2^-1022, 2^1022]), on which the caller branches between the pass that
 * multiplies and the pass that divides (rows with subnormal, huge, zero, infinite or NaN divisors
 * divide); NULL when the pass has no such division. */
static LLVMValueRef pass_reciprocals(rowgen *r, int pass) {
  cg *c = r->c;
  const ir_graph *g = r->g;
  LLVMBuilderRef b = c->b;
  LLVMValueRef safe = NULL;
  for (int i = 0; i < r->k->n_nodes; i++) {
    const ir_node *n = &g->nodes[r->k->nodes[i]];
    r->rcp[n->out] = NULL;
    int d = r->avail[n->out] == pass ? divides_per_row(r, n) : -1;
    LLVMValueRef s = d >= 0 ? r->rowval[d] : NULL;
    if (!s) continue;
    em_dtype dt = g->values[n->out].type.dtype;
    double lim = dt == EM_F64 ? 0x1p1022 : 0x1p126;
    LLVMValueRef mag = intrinsic(c, "llvm.fabs", s);
    LLVMValueRef ok = LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOGE, mag, dconst(c, dt, 1 / lim, 1), ""),
                                   LLVMBuildFCmp(b, LLVMRealOLE, mag, dconst(c, dt, lim, 1), ""), "");
    r->rcp[n->out] = LLVMBuildFDiv(b, dconst(c, dt, 1, 1), s, "");
    safe = safe ? LLVMBuildAnd(b, safe, ok, "") : ok;
  }
  return safe;
}

/* The column loops of pass `pass` (the unrolled vector loop where it reduces, the vector loop, the
 * scalar tail), from the builder's block; leaves the builder after them. */
static void pass_loops(rowgen *r, int pass, LLVMValueRef fn, LLVMValueRef jslot, LLVMValueRef ncols, bool vec,
                       bool reduces) {
  cg *c = r->c;
  LLVMBuilderRef b = c->b;
  const int W = r->W;
  LLVMValueRef lanes = LLVMConstInt(c->i64, (unsigned long long)W, 0);
  LLVMValueRef zero = LLVMConstInt(c->i64, 0, 0), one = LLVMConstInt(c->i64, 1, 0);
    LLVMBasicBlockRef vh = LLVMAppendBasicBlockInContext(c->ctx, fn, "vhdr"), vb = LLVMAppendBasicBlockInContext(c->ctx, fn, "vbody"),
                      th = LLVMAppendBasicBlockInContext(c->ctx, fn, "thdr"), tb = LLVMAppendBasicBlockInContext(c->ctx, fn, "tbody"),
                      done_bb = LLVMAppendBasicBlockInContext(c->ctx, fn, "pass_end");
    LLVMBuildStore(b, zero, jslot);
    if (vec && reduces) { /* UNROLL vectors a step, each into its own accumulators */
      LLVMBasicBlockRef uh = LLVMAppendBasicBlockInContext(c->ctx, fn, "uhdr"), ub = LLVMAppendBasicBlockInContext(c->ctx, fn, "ubody");
      LLVMBuildBr(b, uh);
      LLVMPositionBuilderAtEnd(b, uh);
      LLVMValueRef j = LLVMBuildLoad2(b, c->i64, jslot, "");
      LLVMValueRef ustep = LLVMConstInt(c->i64, (unsigned long long)(UNROLL * W), 0);
      LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildAdd(b, j, ustep, ""), ncols, ""), ub, vh);
      LLVMPositionBuilderAtEnd(b, ub);
      for (int u = 0; u < UNROLL; u++)
        row_body(r, pass, LLVMBuildAdd(b, j, LLVMConstInt(c->i64, (unsigned long long)(u * W), 0), ""), W, u);
      LLVMBuildStore(b, LLVMBuildAdd(b, j, ustep, ""), jslot);
      LLVMBuildBr(b, uh);
    } else {
      LLVMBuildBr(b, vec ? vh : th);
    }
    if (vec) {
      LLVMPositionBuilderAtEnd(b, vh);
      LLVMValueRef j = LLVMBuildLoad2(b, c->i64, jslot, "");
      LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildAdd(b, j, lanes, ""), ncols, ""), vb, th);
      LLVMPositionBuilderAtEnd(b, vb);
      row_body(r, pass, j, W, 0);
      LLVMBuildStore(b, LLVMBuildAdd(b, j, lanes, ""), jslot);
      LLVMBuildBr(b, vh);
    } else {
      LLVMPositionBuilderAtEnd(b, vh);
      LLVMBuildUnreachable(b);
      LLVMPositionBuilderAtEnd(b, vb);
      LLVMBuildUnreachable(b);
    }
    LLVMPositionBuilderAtEnd(b, th);
    LLVMValueRef t = LLVMBuildLoad2(b, c->i64, jslot, "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, t, ncols, ""), tb, done_bb);
    LLVMPositionBuilderAtEnd(b, tb);
    row_body(r, pass, t, 1, 0);
    LLVMBuildStore(b, LLVMBuildAdd(b, t, one, ""), jslot);
    LLVMBuildBr(b, th);
    LLVMPositionBuilderAtEnd(b, done_bb);
}

bool ind_emit_row_kernel(cg *c, const ir_graph *g, const prim_meta *meta, const signed char *kind, kernel *k,
                         char *err, size_t cap) {
  const ir_type *S = &k->shape;
  int nb = k->n_out + k->n_in, nv = g->n_values;
  k->rows = prefix_numel(S, k->split), k->cols = numel_of(S) / (k->rows ? k->rows : 1);
  if (k->rows == 0) k->cols = 0;
  signed char *mine = calloc((size_t)nv + 1, 1);
  if (mine)
    for (int i = 0; i < k->n_nodes; i++) mine[g->nodes[k->nodes[i]].out] = kind[g->nodes[k->nodes[i]].out];
  kind = mine;
  rowgen r = {c, g, k, kind};
  r.W = kernel_lanes(g, k);
  r.avail = calloc((size_t)nv + 1, sizeof(int));
  r.red_pass = malloc(sizeof(int) * ((size_t)nv + 1));
  r.spill = malloc(sizeof(int) * ((size_t)nv + 1));
  r.buf = malloc(sizeof(int) * ((size_t)nv + 1));
  r.is_full_buf = calloc((size_t)nb + 1, sizeof(bool));
  r.inner = calloc((size_t)nb + 1, sizeof(int64_t));
  int64_t (*outer)[EM_MAX_DIMS] = calloc((size_t)nb + 1, sizeof *outer);
  r.base = calloc((size_t)nb + 1, sizeof(LLVMValueRef));
  r.rowoff = calloc((size_t)nb + 1, sizeof(LLVMValueRef));
  r.rowval = calloc((size_t)nv + 1, sizeof(LLVMValueRef));
  r.vals = calloc((size_t)nv + 1, sizeof(LLVMValueRef));
  r.rcp = calloc((size_t)nv + 1, sizeof(LLVMValueRef));
  bool ok = r.rcp && mine && r.avail && r.red_pass && r.spill && r.buf && r.is_full_buf && r.inner && outer && r.base &&
            r.rowoff && r.rowval && r.vals;
  if (!ok) ir_fail(err, cap, "out of memory");
  int passes = 0;
  for (int v = 0; ok && v < nv; v++) r.red_pass[v] = r.spill[v] = r.buf[v] = -1;
  /* passes */
  for (int i = 0; ok && i < k->n_nodes; i++) {
    const ir_node *n = &g->nodes[k->nodes[i]];
    int a = 0;
    for (int o = 0; o < n->n_in; o++) {
      int u = ir_operands(g, n)[o];
      if (r.avail[u] > a) a = r.avail[u];
    }
    if (trailing_reduction(g, n) >= 0) {
      if (r.n_acc == 64) ok = ir_fail(err, cap, "more than 64 reductions in one kernel");
      else r.acc_of[r.n_acc++] = n->out;
      r.red_pass[n->out] = a, r.avail[n->out] = a + 1;
      if (a + 1 > passes) passes = a + 1;
    } else {
      r.avail[n->out] = a;
      if (kind[n->out] == K_FULL && a + 1 > passes) passes = a + 1;
    }
  }
  /* buffers */
  for (int bi = 0; ok && bi < nb; bi++) {
    int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
    r.buf[v] = bi;
    r.is_full_buf[bi] = ind_row_buffer(g, meta, kind, k, bi, outer[bi], &r.inner[bi]);
  }
  /* spills: FULL values a later pass reads that are neither stored nor remade for free */
  for (int i = 0; ok && i < k->n_nodes; i++) {
    const ir_node *n = &g->nodes[k->nodes[i]];
    for (int o = 0; o < n->n_in; o++) {
      int u = ir_operands(g, n)[o];
      if (kind[u] != K_FULL || r.buf[u] >= 0 || r.spill[u] >= 0) continue;
      int use_pass = r.red_pass[n->out] >= 0 ? r.red_pass[n->out] : r.avail[n->out];
      if (kind[n->out] != K_FULL && r.red_pass[n->out] < 0) continue;
      if (use_pass <= r.avail[u]) continue;
      int w = u;
      for (;;) { /* through in-kernel detaches to the value that is computed */
        const ir_node *pn = kernel_node(g, k, w);
        if (pn->op == EM_PRIM_EXPAND) { w = -1; break; }
        if (pn->op != EM_PRIM_DETACH) break;
        w = ir_operands(g, pn)[0];
        if (kind[w] != K_FULL || r.buf[w] >= 0) { w = -1; break; }
      }
      if (w >= 0 && r.spill[w] < 0) {
        /* a scratch row holds cols floats (run.c sizes it so): an f64 value takes two rows, from
         * an even one (8-byte aligned) */
        size_t size = em_dtype_size(g->values[w].type.dtype);
        EM_ASSERT(size <= 2 * sizeof(float));
        if (size > sizeof(float)) k->n_spill += k->n_spill % 2;
        r.spill[w] = k->n_spill;
        k->n_spill += size > sizeof(float) ? 2 : 1;
      }
    }
  }
  if (!ok) goto done;
  { /* loop IR: for r: row values; per pass, for j (vectorized): computes, accumulates, stores */
    char *t = NULL;
    size_t len = 0;
    sappend(&t, &len, "    for r in [0,%lld): (rows split across threads)\n", (long long)k->rows);
    bool rvec = true;
    for (int bi = 0; bi < nb; bi++) rvec = rvec && (!r.is_full_buf[bi] || r.inner[bi] == 0 || r.inner[bi] == 1);
    for (int bi = 0; bi < nb; bi++) {
      int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
      const char *role = bi < k->n_out ? "out" : "in";
      int idx = bi < k->n_out ? bi : bi - k->n_out;
      if (!r.is_full_buf[bi]) sappend(&t, &len, "      %s%d[r] is %%%d (per row)\n", role, idx, v);
      else {
        sappend(&t, &len, "      %s%d[", role, idx);
        static const char *const names[] = {"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"};
        index_text(&t, &len, k->split, S->sizes, outer[bi], names);
        sappend(&t, &len, " + j*%lld] is %%%d\n", (long long)r.inner[bi], v);
      }
    }
    for (int pass = 0; pass <= passes; pass++) {
      for (int i = 0; i < k->n_nodes; i++) { /* per-row values ready at this pass */
        const ir_node *n = &g->nodes[k->nodes[i]];
        if (kind[n->out] != K_ROW || r.avail[n->out] != pass || r.red_pass[n->out] >= 0) continue;
        sappend(&t, &len, "      ");
        node_text(&t, &len, g, n);
        sappend(&t, &len, "\n");
      }
      if (pass == passes) break;
      bool reduces = false;
      for (int a = 0; a < r.n_acc; a++) reduces |= r.red_pass[r.acc_of[a]] == pass;
      sappend(&t, &len, "      pass %d: for j in [0,%lld)%s:\n", pass, (long long)k->cols,
              !rvec ? "" : reduces ? " (vectorized, 4 accumulators a reduction)" : " (vectorized)");
      for (int i = 0; i < k->n_nodes; i++) {
        const ir_node *n = &g->nodes[k->nodes[i]];
        bool here = r.red_pass[n->out] == pass || (kind[n->out] == K_FULL && r.avail[n->out] == pass);
        if (!here) continue;
        sappend(&t, &len, "        ");
        node_text(&t, &len, g, n);
        if (r.red_pass[n->out] >= 0) sappend(&t, &len, " (accumulated over j)");
        if (divides_per_row(&r, n) >= 0) sappend(&t, &len, " (times 1/%%%d where normal)", divides_per_row(&r, n));
        if (r.spill[n->out] >= 0) sappend(&t, &len, " -> scratch%d[j]", r.spill[n->out]);
        if (r.buf[n->out] >= 0 && r.buf[n->out] < k->n_out && kind[n->out] == K_FULL) sappend(&t, &len, " -> out%d", r.buf[n->out]);
        sappend(&t, &len, "\n");
      }
    }
    k->loop_ir = t;
  }
  /* the function */
  LLVMBuilderRef b = c->b;
  LLVMValueRef fn = kernel_function(c, k->name);
  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"),
                    ohdr = LLVMAppendBasicBlockInContext(c->ctx, fn, "row_hdr"),
                    obody = LLVMAppendBasicBlockInContext(c->ctx, fn, "row"),
                    exitb = LLVMAppendBasicBlockInContext(c->ctx, fn, "exit");
  LLVMPositionBuilderAtEnd(b, entry);
  LLVMValueRef bufs = LLVMGetParam(fn, 0), r0 = LLVMGetParam(fn, 1), r1 = LLVMGetParam(fn, 2);
  r.scratch = LLVMGetParam(fn, 5);
  for (int bi = 0; bi < nb; bi++) {
    LLVMValueRef idx = LLVMConstInt(c->i64, (unsigned long long)bi, 0);
    r.base[bi] = LLVMBuildLoad2(b, c->ptr, LLVMBuildGEP2(b, c->ptr, bufs, &idx, 1, ""), "");
  }
  table_begin(c, bufs, nb);
  const int W = r.W;
  for (int a = 0; a < r.n_acc; a++) {
    LLVMTypeRef et = elem_type(c, g->values[r.acc_of[a]].type.dtype);
    for (int u = 0; u < UNROLL; u++) r.acc_v[a][u] = LLVMBuildAlloca(b, lanes_of(et, W), "accv");
    r.acc_s[a] = LLVMBuildAlloca(b, et, "accs");
  }
  LLVMValueRef jslot = LLVMBuildAlloca(b, c->i64, "j");
  LLVMValueRef ncols = kint(c, k->cols); /* in the entry block */
  LLVMBuildBr(b, ohdr);
  LLVMValueRef zero = LLVMConstInt(c->i64, 0, 0), one = LLVMConstInt(c->i64, 1, 0);
  LLVMPositionBuilderAtEnd(b, ohdr);
  LLVMValueRef row = LLVMBuildPhi(b, c->i64, "r");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, row, r1, ""), obody, exitb);
  LLVMPositionBuilderAtEnd(b, obody);
  /* row offsets */
  for (int bi = 0; bi < nb; bi++) r.rowoff[bi] = r.is_full_buf[bi] ? zero : row;
  LLVMValueRef rem = row;
  for (int d = k->split - 1; d >= 0; d--) {
    if (S->sizes[d] == 1) continue;
    LLVMValueRef sz = d > 0 ? kint(c, S->sizes[d]) : NULL;
    LLVMValueRef id = d > 0 ? LLVMBuildURem(b, rem, sz, "") : rem;
    if (d > 0) rem = LLVMBuildUDiv(b, rem, sz, "");
    for (int bi = 0; bi < nb; bi++)
      if (r.is_full_buf[bi] && outer[bi][d])
        r.rowoff[bi] = LLVMBuildAdd(b, r.rowoff[bi], LLVMBuildMul(b, id, kint(c, outer[bi][d]), ""), "");
  }
  for (int i = 0; i < k->n_in; i++) { /* per-row inputs: row r is element r in row-major order */
    int bi = k->n_out + i, v = k->in[i];
    if (r.is_full_buf[bi]) continue;
    const prim_meta *m = &meta[v];
    LLVMValueRef off = zero, q = row;
    for (int d = m->ndim - 1; d >= 0; d--) {
      if (m->sizes[d] == 1) continue;
      LLVMValueRef sz = kint(c, m->sizes[d]);
      if (m->strides[d]) off = LLVMBuildAdd(b, off, LLVMBuildMul(b, LLVMBuildURem(b, q, sz, ""), kint(c, m->strides[d]), ""), "");
      q = LLVMBuildUDiv(b, q, sz, "");
    }
    r.rowval[v] = load_elem(c, r.base[bi], off, g->values[v].type.dtype, 1, false);
  }
  bool vec = true;
  for (int bi = 0; bi < nb; bi++) vec = vec && (!r.is_full_buf[bi] || r.inner[bi] == 0 || r.inner[bi] == 1);
  for (int pass = 0; pass < passes; pass++) {
    row_scalars(&r, pass);
    for (int a = 0; a < r.n_acc; a++)
      if (r.red_pass[r.acc_of[a]] == pass) {
        em_prim op = EM_PRIM_SUM;
        for (int i = 0; i < k->n_nodes; i++)
          if (g->nodes[k->nodes[i]].out == r.acc_of[a]) op = g->nodes[k->nodes[i]].op;
        em_dtype dt = g->values[r.acc_of[a]].type.dtype;
        for (int u = 0; u < UNROLL; u++) LLVMBuildStore(b, dconst(c, dt, reduce_init(op), W), r.acc_v[a][u]);
        LLVMBuildStore(b, dconst(c, dt, reduce_init(op), 1), r.acc_s[a]);
      }
    bool reduces = false;
    for (int a = 0; a < r.n_acc; a++) reduces |= r.red_pass[r.acc_of[a]] == pass;
    LLVMValueRef safe = pass_reciprocals(&r, pass);
    if (safe) { /* rows whose divisors have normal reciprocals multiply; the others divide */
      LLVMBasicBlockRef mulb = LLVMAppendBasicBlockInContext(c->ctx, fn, "by_reciprocal"),
                        divb = LLVMAppendBasicBlockInContext(c->ctx, fn, "by_division"),
                        join = LLVMAppendBasicBlockInContext(c->ctx, fn, "pass_join");
      LLVMBuildCondBr(b, safe, mulb, divb);
      LLVMPositionBuilderAtEnd(b, mulb);
      r.use_rcp = true;
      pass_loops(&r, pass, fn, jslot, ncols, vec, reduces);
      LLVMBuildBr(b, join);
      LLVMPositionBuilderAtEnd(b, divb);
      r.use_rcp = false;
      pass_loops(&r, pass, fn, jslot, ncols, vec, reduces);
      LLVMBuildBr(b, join);
      LLVMPositionBuilderAtEnd(b, join);
    } else {
      pass_loops(&r, pass, fn, jslot, ncols, vec, reduces);
    }
    for (int a = 0; a < r.n_acc; a++) { /* finished reductions: lanes in order, then the tail */
      int v = r.acc_of[a];
      if (r.red_pass[v] != pass) continue;
      em_prim op = EM_PRIM_SUM;
      for (int i = 0; i < k->n_nodes; i++)
        if (g->nodes[k->nodes[i]].out == v) op = g->nodes[k->nodes[i]].op;
      LLVMTypeRef et = elem_type(c, g->values[v].type.dtype), vt = lanes_of(et, W);
      LLVMValueRef av = LLVMBuildLoad2(b, vt, r.acc_v[a][0], ""), x = LLVMConstReal(et, reduce_init(op));
      for (int u = 1; u < UNROLL; u++) av = combine(c, op, av, LLVMBuildLoad2(b, vt, r.acc_v[a][u], ""));
      for (int l = 0; l < W; l++)
        x = combine(c, op, x, LLVMBuildExtractElement(b, av, LLVMConstInt(c->i64, (unsigned)l, 0), ""));
      r.rowval[v] = combine(c, op, x, LLVMBuildLoad2(b, et, r.acc_s[a], ""));
    }
  }
  row_scalars(&r, passes);
  for (int o = 0; o < k->n_out; o++) /* per-row outputs */
    if (!r.is_full_buf[o]) store_elem(c, r.base[o], row, g->values[k->out[o]].type.dtype, r.rowval[k->out[o]], 1);
  LLVMValueRef rn = LLVMBuildAdd(b, row, one, "");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, ohdr);
  LLVMValueRef rin[2] = {r0, rn};
  LLVMBasicBlockRef rbb[2] = {entry, latch};
  LLVMAddIncoming(row, rin, rbb, 2);
  LLVMPositionBuilderAtEnd(b, exitb);
  LLVMBuildRetVoid(b);
  ok = table_end(c, k, err, cap);
done:
  free(r.avail), free(r.red_pass), free(r.spill), free(r.buf), free(r.is_full_buf), free(r.inner), free(outer);
  free(r.base), free(r.rowoff), free(r.rowval), free(r.vals), free(r.rcp), free(mine);
  return ok;
}
