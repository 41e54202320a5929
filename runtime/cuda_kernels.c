/* runtime/cuda_kernels.c: the eager CUDA kernels, generated as CUDA C per (prim, dtypes, layout
 * kind) and compiled by NVRTC for the device's architecture.
 *
 * One generator, not hand-written kernels per dtype: each kernel is a short text whose op is an
 * expression in the compute type (f16 and bf16 load to float, compute and store back; reductions
 * accumulate f16/bf16 in float and integers in 64 bits, as PyTorch does), whose addressing comes
 * from its layout kind:
 *   contiguous  every operand dense and of the output's shape: element i at i;
 *   broadcast   dense operands, some of them one element (a scalar operand): i or 0;
 *   strided     any sizes and strides (up to 8 dims, in elements): the output's linear index
 *               is decomposed into coordinates and each operand's offset summed from them.
 * Families: pointwise (every P_POINTWISE prim, where and convert), reductions over any set of
 * axes (one block per output element, a shared-memory tree), strided copy and fill (clone, flip,
 * pad, cat and slice_scatter are copies between strided views), gather / index_select /
 * scatter_add (indices bound-checked into an error word; scatter_add with atomicAdd, so float
 * sums are not in a fixed order, as in PyTorch), full, iota, Philox uniform and normal (the CPU
 * stream's formulas, prims/creation.c: same counters, same words; normals in double, rounded
 * once, as the CPU does), im2col / col2im for convolutions through cuBLAS, cumulative sums and
 * products (a thread per line, the CPU's accumulators in the CPU's order: the same bits), and
 * the passes of a stable merge sort (argsort).
 * Matmul goes to cuBLAS and is not generated. */
#include "cuda.h"
#include "../ir/graph.h"
#include "../prims/prims.h"
#include "rt.h" /* the profiler hooks */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef EMBER_HAVE_NVRTC
#include <nvrtc.h>
#endif

static const char *ctype(em_dtype dt) {
  switch (dt) {
  case EM_F32: return "float";
  case EM_F64: return "double";
  case EM_I32: return "int";
  case EM_I64: return "long long";
  case EM_BOOL: return "bool";
  case EM_U8: return "unsigned char";
  case EM_F16: return "__half";
  case EM_BF16: return "__nv_bfloat16";
  default: return NULL;
  }
}

/* The type arithmetic runs in. */
static const char *computetype(em_dtype dt) { return dt == EM_F16 || dt == EM_BF16 ? "float" : ctype(dt); }
static bool is_float(em_dtype dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16; }
static const char *layout_name(cu_layout l) { return l == CU_CONTIG ? "contig" : l == CU_BROADCAST ? "bcast" : "strided"; }

/* Shared by every kernel: types, conversions, the strided index map, Philox4x32-10. */
static const char prelude[] =
    "#include <cuda_fp16.h>\n"
    "#include <cuda_bf16.h>\n"
    "typedef long long i64;\n"
    "#define EM_MAX_DIMS 8\n"
    "/* fits32: every index of the layout is below 2^31 (32-bit division is several times cheaper) */\n"
    "struct em_layout { int ndim, fits32; i64 size[EM_MAX_DIMS]; i64 stride[4][EM_MAX_DIMS]; };\n"
    "__device__ __forceinline__ float em_ld(__half x) { return __half2float(x); }\n"
    "__device__ __forceinline__ float em_ld(__nv_bfloat16 x) { return __bfloat162float(x); }\n"
    "template <typename T> __device__ __forceinline__ T em_ld(T x) { return x; }\n"
    "/* float -> integer: INT64_MIN for NaN and out of range, then the low bits (prims/pointwise.c) */\n"
    "__device__ __forceinline__ long long em_f2i(double v) { return v >= -0x1p63 && v < 0x1p63 ? (long long)v : (long long)(1ull << 63); }\n"
    "template <typename T> struct em_int_t { static const bool v = false; };\n"
    "template <> struct em_int_t<int> { static const bool v = true; };\n"
    "template <> struct em_int_t<long long> { static const bool v = true; };\n"
    "template <> struct em_int_t<unsigned char> { static const bool v = true; };\n"
    "template <typename T> struct em_flt_t { static const bool v = false; };\n"
    "template <> struct em_flt_t<float> { static const bool v = true; };\n"
    "template <> struct em_flt_t<double> { static const bool v = true; };\n"
    "template <typename T, typename U> __device__ __forceinline__ T em_to(U x) {\n"
    "  if constexpr (em_int_t<T>::v && em_flt_t<U>::v) return (T)em_f2i((double)x); else return (T)x;\n"
    "}\n"
    "template <> __device__ __forceinline__ __half em_to<__half, float>(float x) { return __float2half_rn(x); }\n"
    "template <> __device__ __forceinline__ __half em_to<__half, double>(double x) { return __double2half(x); }\n"
    "template <> __device__ __forceinline__ __nv_bfloat16 em_to<__nv_bfloat16, float>(float x) { return __float2bfloat16_rn(x); }\n"
    "template <> __device__ __forceinline__ __nv_bfloat16 em_to<__nv_bfloat16, double>(double x) { return __double2bfloat16(x); }\n"
    "template <typename U> __device__ __forceinline__ bool em_to_bool(U x) { return x != (U)0; }\n"
    "/* offset of operand k at the output's linear index i */\n"
    "__device__ __forceinline__ i64 em_off(const em_layout &L, int k, i64 i) {\n"
    "  i64 o = 0;\n"
    "  if (L.fits32) {\n"
    "    unsigned u = (unsigned)i;\n"
    "    for (int d = L.ndim - 1; d >= 0; d--) { unsigned s = (unsigned)L.size[d], c = u % s; u /= s; o += (i64)c * L.stride[k][d]; }\n"
    "    return o;\n"
    "  }\n"
    "  for (int d = L.ndim - 1; d >= 0; d--) { i64 c = i % L.size[d]; i /= L.size[d]; o += c * L.stride[k][d]; }\n"
    "  return o;\n"
    "}\n"
    "__device__ __forceinline__ void em_philox(unsigned long long lo, unsigned long long hi, unsigned long long key, unsigned w[4]) {\n"
    "  unsigned c0 = (unsigned)lo, c1 = (unsigned)(lo >> 32), c2 = (unsigned)hi, c3 = (unsigned)(hi >> 32);\n"
    "  unsigned k0 = (unsigned)key, k1 = (unsigned)(key >> 32);\n"
    "  for (int r = 0; r < 10; r++) {\n"
    "    if (r) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;\n"
    "    unsigned long long p0 = (unsigned long long)0xD2511F53u * c0, p1 = (unsigned long long)0xCD9E8D57u * c2;\n"
    "    unsigned n0 = (unsigned)(p1 >> 32) ^ c1 ^ k0, n1 = (unsigned)p1, n2 = (unsigned)(p0 >> 32) ^ c3 ^ k1, n3 = (unsigned)p0;\n"
    "    c0 = n0, c1 = n1, c2 = n2, c3 = n3;\n"
    "  }\n"
    "  w[0] = c0, w[1] = c1, w[2] = c2, w[3] = c3;\n"
    "}\n"
    "#define EM_GRID_LOOP(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)\n";

/* ---- the CUDA C renderer of pointwise expressions ----
 * A kernel computes in the compute type of its input dtype (f16 and bf16 in float) and renders
 * its prim's scalar expression from the prim table (prims.def) as one typed temporary per
 * instruction; the fused kernels of compiled graphs render from the same rows. */

em_dtype cu_compute_dtype(em_dtype dt) { return dt == EM_F16 || dt == EM_BF16 ? EM_F32 : dt; }
const char *cu_ctype(em_dtype dt) { return ctype(dt); }

void cu_render_helpers(ir_sbuf *b, const prim_sexpr *e, uint32_t *done) {
  for (int i = 0; i < e->n; i++) {
    const prim_sinst *in = &e->ins[i];
    if (in->op != SOP_REM && in->op != SOP_POW) continue;
    uint32_t bit = 1u << (2 * (int)in->dtype + (in->op == SOP_POW));
    if (*done & bit) continue;
    *done |= bit;
    em_dtype dt = in->dtype;
    const char *C = ctype(dt);
    bool uns = dt == EM_U8;
    if (in->op == SOP_REM && is_float(dt)) {
      const char *fm = dt == EM_F64 ? "fmod" : "fmodf";
      ir_sb_printf(b, "__device__ __forceinline__ %s em_fmod_py(%s a, %s b) { %s r = %s(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }\n",
          C, C, C, C, fm);
    } else if (in->op == SOP_REM && uns) {
      ir_sb_printf(b, "__device__ __forceinline__ %s em_imod_py(%s a, %s b) { return b == 0 ? 0 : a %% b; }\n", C, C, C);
    } else if (in->op == SOP_REM) {
      /* b == -1 as the CPU's imod_py: INT_MIN % -1 overflows (the emulator's host code traps on it) */
      ir_sb_printf(b, "__device__ __forceinline__ %s em_imod_py(%s a, %s b) { if (b == 0 || b == -1) return 0; %s r = a %% b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }\n",
          C, C, C, C);
    } else if (!is_float(dt)) {
      ir_sb_printf(b, "__device__ __forceinline__ %s em_ipow(%s a, %s b) { %s %s r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }\n",
          C, C, C, uns ? "" : "if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);", C);
    }
  }
}

/* The name of instruction i's value: its operand's, or its temporary (prefix, "t", index). */
static const char *value_name(const prim_sexpr *e, int i, const char *const *operands, const char *prefix, char *buf,
                              size_t cap) {
  if (e->ins[i].op == SOP_ARG) return operands[e->ins[i].arg];
  snprintf(buf, cap, "%st%d", prefix, i);
  return buf;
}

bool cu_render_expr(ir_sbuf *b, const prim_sexpr *e, const char *const *operands, const char *prefix,
                    const char *indent, char *result, size_t rcap) {
  for (int i = 0; i < e->n; i++) {
    const prim_sinst *in = &e->ins[i];
    if (in->op == SOP_ARG) continue;
    char nb[3][48], tb[48];
    const char *x = in->n_in > 0 ? value_name(e, in->in[0], operands, prefix, nb[0], sizeof nb[0]) : NULL;
    const char *y = in->n_in > 1 ? value_name(e, in->in[1], operands, prefix, nb[1], sizeof nb[1]) : NULL;
    const char *z = in->n_in > 2 ? value_name(e, in->in[2], operands, prefix, nb[2], sizeof nb[2]) : NULL;
    em_dtype dt = in->dtype, xd = in->n_in ? e->ins[in->in[0]].dtype : dt;
    const char *T = ctype(dt), *t = value_name(e, i, operands, prefix, tb, sizeof tb);
    bool f = is_float(dt), dbl = dt == EM_F64;
    const char *sfx = dbl ? "" : "f"; /* expf / exp */
    static const char *const cmp[] = {"==", "!=", "<", "<=", ">", ">="};
    static const char *const arith[] = {"+", "-", "*", "/"};
    ir_sb_printf(b, "%sconst %s %s = ", indent, T, t);
    switch (in->op) {
    case SOP_CONST: ir_sb_printf(b, "(%s)%.17g", T, in->value); break;
    case SOP_CAST:
      if (dt == EM_BOOL) ir_sb_printf(b, "em_to_bool(%s)", x);
      else ir_sb_printf(b, "em_to<%s>(%s)", T, x);
      break;
    case SOP_NEG: ir_sb_printf(b, "(%s)(-%s)", T, x); break;
    case SOP_ABS:
      if (dt == EM_BOOL || dt == EM_U8) ir_sb_printf(b, "%s", x);
      else if (f) ir_sb_printf(b, "%s(%s)", dbl ? "fabs" : "fabsf", x);
      else ir_sb_printf(b, "(%s < 0 ? (%s)-%s : %s)", x, T, x, x);
      break;
    case SOP_FLOOR: case SOP_CEIL:
      if (f) ir_sb_printf(b, "%s%s(%s)", prim_sop_name(in->op), sfx, x);
      else ir_sb_printf(b, "%s", x);
      break;
    case SOP_EXP: case SOP_LOG: case SOP_LOG1P: case SOP_EXPM1: case SOP_SQRT: case SOP_SIN: case SOP_COS:
    case SOP_TANH: case SOP_ERF:
      if (!f) return false;
      ir_sb_printf(b, "%s%s(%s)", prim_sop_name(in->op), sfx, x);
      break;
    case SOP_ADD: case SOP_SUB: case SOP_MUL: case SOP_DIV:
      ir_sb_printf(b, "(%s)(%s %s %s)", T, x, arith[in->op - SOP_ADD], y);
      break;
    case SOP_POW:
      if (f) ir_sb_printf(b, "pow%s(%s, %s)", sfx, x, y);
      else ir_sb_printf(b, "em_ipow(%s, %s)", x, y);
      break;
    case SOP_REM: ir_sb_printf(b, "%s(%s, %s)", f ? "em_fmod_py" : "em_imod_py", x, y); break;
    case SOP_ATAN2:
      if (!f) return false;
      ir_sb_printf(b, "atan2%s(%s, %s)", sfx, x, y);
      break;
    case SOP_EQ: case SOP_NE: case SOP_LT: case SOP_LE: case SOP_GT: case SOP_GE:
      ir_sb_printf(b, "%s %s %s", x, cmp[in->op - SOP_EQ], y);
      break;
    case SOP_ISNAN: ir_sb_printf(b, is_float(xd) ? "%s != %s" : "false", x, x); break;
    case SOP_AND: ir_sb_printf(b, "%s && %s", x, y); break;
    case SOP_OR: ir_sb_printf(b, "%s || %s", x, y); break;
    case SOP_NOT: ir_sb_printf(b, "!%s", x); break;
    case SOP_SELECT: ir_sb_printf(b, "%s ? %s : %s", x, y, z); break;
    default: return false;
    }
    ir_sb_printf(b, ";\n");
  }
  char rb[48];
  snprintf(result, rcap, "%s", value_name(e, e->n - 1, operands, prefix, rb, sizeof rb));
  return true;
}

/* Pointwise: out[i] = the prim's expression of operands[i] (prims.def); WHERE's first operand is
 * the bool condition, CONVERT reads dtype `in` and writes `out`. */
static bool gen_pointwise(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  const prim_info *pi = prim_get(k->op);
  int arity = pi->arity;
  em_dtype in = k->in, out = k->out, C = cu_compute_dtype(in);
  bool where = k->op == EM_PRIM_WHERE;
  em_dtype args[3] = {where ? EM_BOOL : C, C, C};
  prim_sexpr e;
  if (arity < 1 || arity > 3 || !prim_scalar_expr(k->op, args, C, out, &e)) return false;
  const char *I = ctype(in), *O = ctype(out);
  snprintf(name, ncap, "em_%s_%s_%s_%s", pi->name, em_dtype_name(in), em_dtype_name(out), layout_name(k->layout));
  uint32_t helpers = 0;
  cu_render_helpers(b, &e, &helpers);
  ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out", name, O);
  for (int a = 0; a < arity; a++) ir_sb_printf(b, ", const %s *__restrict__ x%d", where && a == 0 ? "bool" : I, a);
  /* broadcast: L.stride[1 + a][0] is 1 for a dense operand, 0 for a one-element one */
  ir_sb_printf(b, ", i64 n, em_layout L) {\n  EM_GRID_LOOP(i, n) {\n");
  for (int a = 0; a < arity; a++) {
    char ix[16] = "i";
    if (k->layout == CU_BROADCAST) snprintf(ix, sizeof ix, "o%d", a), ir_sb_printf(b, "    i64 o%d = L.stride[%d][0] ? i : 0;\n", a, a + 1);
    else if (k->layout == CU_STRIDED) snprintf(ix, sizeof ix, "o%d", a), ir_sb_printf(b, "    i64 o%d = em_off(L, %d, i);\n", a, a + 1);
    if (where && a == 0) ir_sb_printf(b, "    const bool a = x0[%s];\n", ix);
    else ir_sb_printf(b, "    const %s %c = (%s)em_ld(x%d[%s]);\n", ctype(C), 'a' + a, ctype(C), a, ix);
  }
  static const char *const operands[] = {"a", "b", "c"};
  char r[48];
  if (!cu_render_expr(b, &e, operands, "", "    ", r, sizeof r)) return false;
  ir_sb_printf(b, "    out[%s] = %s;\n", k->layout == CU_STRIDED ? "em_off(L, 0, i)" : "i", r);
  ir_sb_printf(b, "  }\n}\n");
  return true;
}

/* Reduction over the reduced dims of each output element: one block of 256 threads (a power of
 * two: the tree below halves it) per output element. L maps the output's linear index over the
 * kept dims to the output (stride[0]) and the input (stride[1]); R lists the reduced dims with
 * the input's strides. Contiguous: the reduced elements of output o are x[o * n_red + r]. */
static bool gen_reduce(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  em_prim op = k->op;
  em_dtype in = k->in, out = k->out;
  const char *I = ctype(in), *O = ctype(out);
  bool arg = op == EM_PRIM_ARGMAX || op == EM_PRIM_ARGMIN;
  /* the accumulator: float for f16 / bf16 / f32, 64-bit for integer sums and products;
   * comparisons (amax, argmax, ...) keep the compute type */
  bool cmp_op = arg || op == EM_PRIM_AMAX || op == EM_PRIM_AMIN;
  const char *A = cmp_op ? computetype(in) : is_float(in) ? computetype(in) : "long long";
  snprintf(name, ncap, "em_%s_%s_%s_%s", prim_get(op)->name, em_dtype_name(in), em_dtype_name(out), layout_name(k->layout));
  const char *init = op == EM_PRIM_SUM ? "0" : op == EM_PRIM_PROD ? "1" : NULL;
  ir_sb_printf(b, "typedef %s A;\n", A);
  ir_sb_printf(b, "struct em_red { int ndim; i64 size[EM_MAX_DIMS]; i64 stride[EM_MAX_DIMS]; };\n");
  ir_sb_printf(b, "__device__ __forceinline__ bool em_better(A x, i64 ix, A y, i64 iy) {\n");
  bool max = op == EM_PRIM_AMAX || op == EM_PRIM_ARGMAX;
  if (is_float(in)) /* NaN wins; ties go to the first index, as torch.argmax */
    ir_sb_printf(b, "  if (x != x) return y == y || ix < iy; if (y != y) return false; return x %s y || (x == y && ix < iy);\n}\n", max ? ">" : "<");
  else ir_sb_printf(b, "  return x %s y || (x == y && ix < iy);\n}\n", max ? ">" : "<");
  ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out, const %s *__restrict__ x, i64 n_out, i64 n_red, em_layout L, em_red R) {\n",
      name, O, I);
  bool cmp = !init; /* amax, amin, argmax, argmin: values and their indices */
  ir_sb_printf(b, "  __shared__ A acc[256];\n");
  if (cmp) ir_sb_printf(b, "  __shared__ i64 at[256];\n");
  ir_sb_printf(b, "  for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {\n");
  ir_sb_printf(b, "    i64 base = %s;\n", k->layout == CU_CONTIG ? "o * n_red" : "em_off(L, 1, o)");
  if (init) ir_sb_printf(b, "    A v = (A)%s;\n", init);
  else ir_sb_printf(b, "    A v = (A)0; i64 vi = -1;\n");
  ir_sb_printf(b, "    for (i64 r = threadIdx.x; r < n_red; r += blockDim.x) {\n");
  if (k->layout == CU_CONTIG) ir_sb_printf(b, "      i64 off = base + r;\n");
  else
    ir_sb_printf(b, "      i64 off = base, q = r;\n"
           "      for (int d = R.ndim - 1; d >= 0; d--) { off += (q %% R.size[d]) * R.stride[d]; q /= R.size[d]; }\n");
  ir_sb_printf(b, "      A e = (A)em_ld(x[off]);\n");
  if (op == EM_PRIM_SUM) ir_sb_printf(b, "      v += e;\n");
  else if (op == EM_PRIM_PROD) ir_sb_printf(b, "      v *= e;\n");
  else ir_sb_printf(b, "      if (vi < 0 || em_better(e, r, v, vi)) v = e, vi = r;\n");
  ir_sb_printf(b, "    }\n    acc[threadIdx.x] = v;%s\n    __syncthreads();\n", cmp ? " at[threadIdx.x] = vi;" : "");
  ir_sb_printf(b, "    for (int s = blockDim.x / 2; s > 0; s >>= 1) {\n      if (threadIdx.x < s) {\n");
  ir_sb_printf(b, "        A w = acc[threadIdx.x + s];\n");
  if (op == EM_PRIM_SUM) ir_sb_printf(b, "        acc[threadIdx.x] += w;\n");
  else if (op == EM_PRIM_PROD) ir_sb_printf(b, "        acc[threadIdx.x] *= w;\n");
  else ir_sb_printf(b, "        i64 wi = at[threadIdx.x + s];\n");
  if (op != EM_PRIM_SUM && op != EM_PRIM_PROD)
    ir_sb_printf(b, "        if (wi >= 0 && (at[threadIdx.x] < 0 || em_better(w, wi, acc[threadIdx.x], at[threadIdx.x]))) acc[threadIdx.x] = w, at[threadIdx.x] = wi;\n");
  ir_sb_printf(b, "      }\n      __syncthreads();\n    }\n");
  const char *oo = k->layout == CU_CONTIG ? "o" : "em_off(L, 0, o)";
  if (arg) ir_sb_printf(b, "    if (threadIdx.x == 0) out[%s] = (%s)at[0];\n", oo, O);
  else if (out == EM_BOOL) ir_sb_printf(b, "    if (threadIdx.x == 0) out[%s] = acc[0] != 0;\n", oo);
  else ir_sb_printf(b, "    if (threadIdx.x == 0) out[%s] = em_to<%s>(acc[0]);\n", oo, O);
  ir_sb_printf(b, "    __syncthreads();\n  }\n}\n");
  return true;
}

/* Copy between strided views (clone, flip, pad's interior, cat's pieces, slice_scatter), with a
 * conversion when the dtypes differ; fill for pad's border, full and a view's constant. */
static bool gen_copy(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  const char *I = ctype(k->in), *O = ctype(k->out);
  snprintf(name, ncap, "em_copy_%s_%s_%s", em_dtype_name(k->in), em_dtype_name(k->out), layout_name(k->layout));
  ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out, const %s *__restrict__ x, i64 n, em_layout L) {\n", name, O, I);
  if (k->layout == CU_STRIDED) ir_sb_printf(b, "  EM_GRID_LOOP(i, n) { i64 o = em_off(L, 0, i), s = em_off(L, 1, i);\n");
  else if (k->layout == CU_BROADCAST) ir_sb_printf(b, "  EM_GRID_LOOP(i, n) { i64 o = i, s = 0;\n");
  else ir_sb_printf(b, "  EM_GRID_LOOP(i, n) { i64 o = i, s = i;\n");
  if (k->out == EM_BOOL) ir_sb_printf(b, "    out[o] = em_to_bool(em_ld(x[s])); }\n}\n");
  else ir_sb_printf(b, "    out[o] = em_to<%s>(em_ld(x[s])); }\n}\n", O);
  return true;
}

static bool gen_fill(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  const char *O = ctype(k->out);
  snprintf(name, ncap, "em_fill_%s_%s", em_dtype_name(k->out), layout_name(k->layout));
  ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out, %s v, i64 n, em_layout L) {\n", name, O, O);
  ir_sb_printf(b, "  EM_GRID_LOOP(i, n) out[%s] = v;\n}\n", k->layout == CU_STRIDED ? "em_off(L, 0, i)" : "i");
  return true;
}

/* iota: start + i * step in double, converted once (the CPU kernel's formula). */
static bool gen_iota(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  const char *O = ctype(k->out);
  snprintf(name, ncap, "em_iota_%s", em_dtype_name(k->out));
  ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out, double start, double step, i64 n) {\n", name, O);
  if (k->out == EM_BOOL) ir_sb_printf(b, "  EM_GRID_LOOP(i, n) out[i] = (start + (double)i * step) != 0.0;\n}\n");
  else ir_sb_printf(b, "  EM_GRID_LOOP(i, n) out[i] = em_to<%s>(start + (double)i * step);\n}\n", O);
  return true;
}

/* Philox uniform / normal, f32 and f64: thread q makes call q's elements (prims/creation.c). */
static bool gen_philox(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  bool normal = k->op == EM_PRIM_PHILOX_NORMAL, f32 = k->out == EM_F32;
  snprintf(name, ncap, "em_philox_%s_%s", normal ? "normal" : "uniform", em_dtype_name(k->out));
  ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out, unsigned long long seed, unsigned long long offset, i64 n, i64 calls) {\n",
      name, f32 ? "float" : "double");
  ir_sb_printf(b, "  EM_GRID_LOOP(q, calls) {\n    unsigned w[4];\n    unsigned long long lo = offset + (unsigned long long)q;\n");
  ir_sb_printf(b, "    em_philox(lo, lo < offset, seed, w);\n");
  if (normal) ir_sb_printf(b, "    const double two_pi = 6.28318530717958647692528676655900577;\n");
  if (f32) {
    ir_sb_printf(b, "    float v[4];\n");
    if (normal)
      ir_sb_printf(b, "    for (int j = 0; j < 2; j++) {\n"
             "      double u1 = ((double)w[2 * j] + 1) * 0x1p-32, u2 = ((double)w[2 * j + 1] + 1) * 0x1p-32;\n"
             "      double r = sqrt(-2.0 * log(u1)), t = two_pi * u2;\n"
             "      v[2 * j] = (float)(r * cos(t)), v[2 * j + 1] = (float)(r * sin(t));\n    }\n");
    else ir_sb_printf(b, "    for (int j = 0; j < 4; j++) v[j] = (float)(w[j] >> 8) * 0x1p-24f;\n");
    ir_sb_printf(b, "    for (i64 j = 0; j < 4 && 4 * q + j < n; j++) out[4 * q + j] = v[j];\n");
  } else {
    ir_sb_printf(b, "    double b01 = (double)((((unsigned long long)w[1] << 32) | w[0]) >> 11);\n");
    ir_sb_printf(b, "    double b23 = (double)((((unsigned long long)w[3] << 32) | w[2]) >> 11);\n    double v[2];\n");
    if (normal)
      ir_sb_printf(b, "    double u1 = (b01 + 1) * 0x1p-53, u2 = (b23 + 1) * 0x1p-53, r = sqrt(-2.0 * log(u1)), t = two_pi * u2;\n"
             "    v[0] = r * cos(t), v[1] = r * sin(t);\n");
    else ir_sb_printf(b, "    v[0] = b01 * 0x1p-53, v[1] = b23 * 0x1p-53;\n");
    ir_sb_printf(b, "    out[2 * q] = v[0];\n    if (2 * q + 1 < n) out[2 * q + 1] = v[1];\n");
  }
  ir_sb_printf(b, "  }\n}\n");
  return true;
}

/* gather / index_select / scatter_add along axis L.stride[3][0]: the layout maps the output's
 * (gather, index_select) or src's (scatter_add) linear index to each operand's offset, with
 * the indexed axis's stride of x zeroed; the index replaces that coordinate. A bad index is
 * stored in err[1] by the thread that first sets the flag err[0] (the first one met wins), and
 * the element is left alone. The flag has its own word: folding it into the index's top bit
 * lost that bit, and INT64_MIN was reported as index 0 (issue 17). */
static bool gen_index(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  const char *T = ctype(k->in), *X = ctype(k->idx);
  snprintf(name, ncap, "em_%s_%s_%s", prim_get(k->op)->name, em_dtype_name(k->in), em_dtype_name(k->idx));
  if (k->op == EM_PRIM_SCATTER_ADD) {
    ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out, const %s *__restrict__ index, const %s *__restrict__ src, i64 n, i64 limit, i64 axis_stride, em_layout L, unsigned long long *err) {\n",
        name, T, X, T);
    ir_sb_printf(b, "  EM_GRID_LOOP(i, n) {\n    i64 j = (i64)index[em_off(L, 2, i)];\n");
    ir_sb_printf(b, "    if (j < 0 || j >= limit) { if (atomicCAS(err, 0ull, 1ull) == 0ull) err[1] = (unsigned long long)j; continue; }\n");
    if (k->in == EM_I64) ir_sb_printf(b, "    atomicAdd((unsigned long long *)&out[em_off(L, 0, i) + j * axis_stride], (unsigned long long)src[em_off(L, 1, i)]);\n");
    else if (k->in == EM_I32 || k->in == EM_F32 || k->in == EM_F64 || k->in == EM_F16 || k->in == EM_BF16)
      ir_sb_printf(b, "    atomicAdd(&out[em_off(L, 0, i) + j * axis_stride], src[em_off(L, 1, i)]);\n");
    else return false;
    ir_sb_printf(b, "  }\n}\n");
    return true;
  }
  /* gather: index has the output's shape (stride[2] its strides); index_select: index is 1-D
   * (stride[2] is 1 on the axis, 0 elsewhere). Either way x's offset has the axis's stride zeroed. */
  ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out, const %s *__restrict__ x, const %s *__restrict__ index, i64 n, i64 limit, i64 axis_stride, em_layout L, unsigned long long *err) {\n",
      name, T, T, X);
  ir_sb_printf(b, "  EM_GRID_LOOP(i, n) {\n");
  ir_sb_printf(b, "    i64 j = (i64)index[em_off(L, 2, i)];\n");
  ir_sb_printf(b, "    if (j < 0 || j >= limit) { if (atomicCAS(err, 0ull, 1ull) == 0ull) err[1] = (unsigned long long)j; continue; }\n");
  ir_sb_printf(b, "    out[em_off(L, 0, i)] = x[em_off(L, 1, i) + j * axis_stride];\n  }\n}\n");
  return true;
}

/* im2col / col2im for a convolution through cuBLAS, NCHW: column row (c, kh, kw), column
 * (n, oh, ow). col2im gathers every contribution to an input pixel (no atomics: deterministic). */
static bool gen_im2col(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  const char *T = ctype(k->in);
  bool back = k->layout == CU_STRIDED; /* strided: col2im */
  snprintf(name, ncap, "em_%s_%s", back ? "col2im" : "im2col", em_dtype_name(k->in));
  ir_sb_printf(b, "struct em_conv { i64 n, c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw; };\n");
  if (!back) {
    ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ col, const %s *__restrict__ x, em_conv p) {\n", name, T, T);
    ir_sb_printf(b, "  i64 total = p.c * p.kh * p.kw * p.n * p.oh * p.ow;\n  EM_GRID_LOOP(i, total) {\n");
    ir_sb_printf(b, "    i64 q = i; i64 ow = q %% p.ow; q /= p.ow; i64 oh = q %% p.oh; q /= p.oh; i64 n = q %% p.n; q /= p.n;\n");
    ir_sb_printf(b, "    i64 kw = q %% p.kw; q /= p.kw; i64 kh = q %% p.kh; i64 c = q / p.kh;\n");
    ir_sb_printf(b, "    i64 ih = oh * p.sh - p.ph + kh * p.dh, iw = ow * p.sw - p.pw + kw * p.dw;\n");
    ir_sb_printf(b, "    col[i] = (ih >= 0 && ih < p.h && iw >= 0 && iw < p.w) ? x[((n * p.c + c) * p.h + ih) * p.w + iw] : em_to<%s>(0.0f);\n  }\n}\n", T);
  } else {
    ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ x, const %s *__restrict__ col, em_conv p) {\n", name, T, T);
    ir_sb_printf(b, "  i64 total = p.n * p.c * p.h * p.w;\n  EM_GRID_LOOP(i, total) {\n");
    ir_sb_printf(b, "    i64 q = i; i64 iw = q %% p.w; q /= p.w; i64 ih = q %% p.h; q /= p.h; i64 c = q %% p.c; i64 n = q / p.c;\n");
    ir_sb_printf(b, "    %s acc = 0;\n    for (i64 kh = 0; kh < p.kh; kh++) for (i64 kw = 0; kw < p.kw; kw++) {\n", computetype(k->in));
    ir_sb_printf(b, "      i64 th = ih + p.ph - kh * p.dh, tw = iw + p.pw - kw * p.dw;\n");
    ir_sb_printf(b, "      if (th < 0 || tw < 0 || th %% p.sh || tw %% p.sw) continue;\n");
    ir_sb_printf(b, "      i64 oh = th / p.sh, ow = tw / p.sw;\n      if (oh >= p.oh || ow >= p.ow) continue;\n");
    ir_sb_printf(b, "      acc += em_ld(col[(((c * p.kh + kh) * p.kw + kw) * p.n + n) * p.oh * p.ow + oh * p.ow + ow]);\n    }\n");
    ir_sb_printf(b, "    x[i] = em_to<%s>(acc);\n  }\n}\n", T);
  }
  return true;
}

/* cumsum / cumprod: a thread per line along the axis, sequential within it, accumulating as
 * prims/scan.c does (floats in double, integers and bool in wrapping 64 bits), so both devices
 * give the same bits. L maps a line's index over the other dims to its first element in out
 * (stride[0]) and x (stride[1]); os and xs are the strides along the axis. A line of a vocabulary
 * is some 50k steps of one thread: a block-wide scan would be faster for few long lines, but
 * this is the order the CPU's results are defined by. */
static bool gen_scan(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  bool sum = k->op == EM_PRIM_CUMSUM, flt = is_float(k->in);
  const char *I = ctype(k->in), *O = ctype(k->out);
  snprintf(name, ncap, "em_%s_%s_%s", prim_get(k->op)->name, em_dtype_name(k->in), em_dtype_name(k->out));
  ir_sb_printf(b, "extern \"C\" __global__ void %s(%s *__restrict__ out, const %s *__restrict__ x, i64 lines, i64 n, i64 os, i64 xs, em_layout L) {\n",
               name, O, I);
  ir_sb_printf(b, "  EM_GRID_LOOP(l, lines) {\n    i64 o = em_off(L, 0, l), s = em_off(L, 1, l);\n");
  ir_sb_printf(b, "    %s acc = %s;\n", flt ? "double" : "unsigned long long", sum ? "0" : "1");
  ir_sb_printf(b, "    for (i64 i = 0; i < n; i++) {\n      acc %s= (%s)em_ld(x[s + i * xs]);\n", sum ? "+" : "*",
               flt ? "double" : "unsigned long long");
  if (flt) ir_sb_printf(b, "      out[o + i * os] = em_to<%s>(acc);\n", O);
  else ir_sb_printf(b, "      out[o + i * os] = (long long)acc;\n");
  ir_sb_printf(b, "    }\n  }\n}\n");
  return true;
}

/* One pass of a stable bottom-up merge sort of rows of n (key, index) pairs, contiguous, runs of
 * width w merged into runs of 2w: each element finds its place in the merged run by a binary
 * search of the sibling run (the rank of the merge-path formulation), counting the sibling's
 * elements that come strictly before it (from the left run) or not after it (from the right
 * run), so equal keys keep their order. The first pass reads no index array (iin NULL: the
 * position in the row). NaN is the largest key and equal to itself (prims/scan.c). log2(n)
 * passes of n log(w) work, every element in parallel. */
static bool gen_sort(ir_sbuf *b, const cu_kernel_key *k, char *name, size_t ncap) {
  const char *T = ctype(k->in);
  snprintf(name, ncap, "em_argsort_pass_%s", em_dtype_name(k->in));
  ir_sb_printf(b, "__device__ __forceinline__ bool em_before(%s a, %s b, int desc) {\n", T, T);
  ir_sb_printf(b, "  auto x = em_ld(desc ? b : a), y = em_ld(desc ? a : b);\n");
  if (is_float(k->in)) ir_sb_printf(b, "  return x == x && (y != y || x < y);\n}\n");
  else ir_sb_printf(b, "  return x < y;\n}\n");
  ir_sb_printf(b, "extern \"C\" __global__ void %s(const %s *__restrict__ kin, const i64 *__restrict__ iin, %s *__restrict__ kout, "
               "i64 *__restrict__ iout, i64 total, i64 n, i64 w, int desc) {\n", name, T, T);
  ir_sb_printf(b, "  EM_GRID_LOOP(e, total) {\n"
               "    i64 p = e %% n, base = e - p, s = p / (2 * w) * (2 * w);\n"
               "    %s key = kin[e];\n    i64 id = iin ? iin[e] : p;\n"
               "    bool left = p - s < w;\n"
               "    i64 b0 = left ? s + w : s, b1 = left ? s + 2 * w : s + w;\n"
               "    if (b1 > n) b1 = n;\n    if (b0 > b1) b0 = b1;\n"
               "    i64 lo = b0, hi = b1;\n"
               "    while (lo < hi) {\n      i64 mid = lo + (hi - lo) / 2;\n"
               "      bool go = left ? em_before(kin[base + mid], key, desc) : !em_before(key, kin[base + mid], desc);\n"
               "      if (go) lo = mid + 1; else hi = mid;\n    }\n"
               "    i64 pos = s + (left ? p - s : p - s - w) + (lo - b0);\n"
               "    kout[base + pos] = key;\n    iout[base + pos] = id;\n  }\n}\n", T);
  return true;
}

const char *cu_kernel_prelude(void) { return prelude; }

bool cu_kernel_body(const cu_kernel_key *k, char **src, char *name, size_t ncap) {
  ir_sbuf b = {0};
  if (!ctype(k->in) || !ctype(k->out)) return false;
  bool ok;
  switch (k->family) {
  case CU_POINTWISE: ok = gen_pointwise(&b, k, name, ncap); break;
  case CU_REDUCE: ok = gen_reduce(&b, k, name, ncap); break;
  case CU_COPY: ok = gen_copy(&b, k, name, ncap); break;
  case CU_FILL: ok = gen_fill(&b, k, name, ncap); break;
  case CU_IOTA: ok = gen_iota(&b, k, name, ncap); break;
  case CU_PHILOX: ok = (k->out == EM_F32 || k->out == EM_F64) && gen_philox(&b, k, name, ncap); break;
  case CU_INDEX: ok = ctype(k->idx) && gen_index(&b, k, name, ncap); break;
  case CU_IM2COL: ok = is_float(k->in) && gen_im2col(&b, k, name, ncap); break;
  case CU_SCAN: ok = gen_scan(&b, k, name, ncap); break;
  case CU_SORT: ok = gen_sort(&b, k, name, ncap); break;
  default: ok = false;
  }
  if (!ok) return free(b.s), false;
  return (*src = ir_sb_finish(&b)) != NULL;
}

static bool nvrtc_build(const char *src, const char *name, const char *arch, bool ptx, char **cubin, size_t *size, char **log);

bool cu_nvrtc_compile(const char *src, const char *name, const char *arch, char **cubin, size_t *size, char **log) {
  if (!RT_PROF_ON()) return nvrtc_build(src, name, arch, false, cubin, size, log);
  uint64_t t0_ = rt_prof_now();
  bool r_ = nvrtc_build(src, name, arch, false, cubin, size, log);
  rt_prof_complete("phase", "NVRTC compile", t0_, "%s for %s", name, arch);
  return r_;
}

/* src compiled for arch: a cubin, or (ptx) the PTX text. */
static bool nvrtc_build(const char *src, const char *name, const char *arch, bool ptx, char **cubin, size_t *size, char **log) {
  *cubin = NULL, *size = 0, *log = NULL;
#ifdef EMBER_HAVE_NVRTC
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL) != NVRTC_SUCCESS) return (*log = strdup("nvrtcCreateProgram failed")), false;
  char archopt[64];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  const char *opts[] = {archopt, "--std=c++17", "-I" EMBER_CUDA_INCLUDE, "--use_fast_math=false"};
  nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  size_t ls = 0;
  if (nvrtcGetProgramLogSize(prog, &ls) == NVRTC_SUCCESS && ls > 1 && (*log = malloc(ls))) nvrtcGetProgramLog(prog, *log);
  if (r == NVRTC_SUCCESS && (ptx ? nvrtcGetPTXSize(prog, size) : nvrtcGetCUBINSize(prog, size)) == NVRTC_SUCCESS &&
      (*cubin = malloc(*size ? *size : 1))) {
    if ((ptx ? nvrtcGetPTX(prog, *cubin) : nvrtcGetCUBIN(prog, *cubin)) != NVRTC_SUCCESS) free(*cubin), *cubin = NULL;
  }
  nvrtcDestroyProgram(&prog);
  if (!*cubin && !*log) *log = strdup(nvrtcGetErrorString(r));
  return *cubin != NULL;
#else
  (void)src, (void)name, (void)arch, (void)ptx;
  *log = strdup("this build has no NVRTC (the CUDA toolkit was not found at configure time)");
  return false;
#endif
}

bool cu_nvrtc_ptx(const char *src, const char *name, const char *arch, char **ptx, char **log) {
  size_t size;
  return nvrtc_build(src, name, arch, true, ptx, &size, log);
}

bool cu_nvrtc_version(int *major, int *minor) {
  *major = *minor = 0;
#ifdef EMBER_HAVE_NVRTC
  return nvrtcVersion(major, minor) == NVRTC_SUCCESS;
#else
  return false;
#endif
}

void cu_nvrtc_cache_salt(char *buf, size_t cap) {
  int major, minor;
  if (cu_nvrtc_version(&major, &minor)) snprintf(buf, cap, "nvrtc cubin %d.%d", major, minor);
  else snprintf(buf, cap, "nvrtc cubin (no version)");
}

bool cu_nvrtc_available(void) {
#ifdef EMBER_HAVE_NVRTC
  return true;
#else
  return false;
#endif
}

/* ---- the kernel set ---- */

static const em_dtype all_dtypes[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL, EM_U8, EM_F16, EM_BF16};
enum { N_DTYPES = sizeof all_dtypes / sizeof all_dtypes[0] };

static prim_meta meta_of(em_dtype dt, int ndim) {
  prim_meta m = {.dtype = dt, .ndim = ndim};
  for (int d = 0; d < ndim; d++) m.sizes[d] = 4;
  ir_contiguous_strides(ndim, m.sizes, m.strides);
  return m;
}

/* The result dtype of op on operands of these dtypes, from the prim's meta function; false when
 * the prim refuses them (so the set holds exactly the kernels eager execution can ask for). */
static bool result_dtype(em_prim op, const prim_attrs *at, const em_dtype *in, int n, int ndim, em_dtype *out) {
  prim_meta ms[3], o;
  for (int i = 0; i < n; i++) ms[i] = meta_of(in[i], ndim);
  char why[128];
  if (!prim_meta_fn(op, at, ms, n, &o, why, sizeof why)) return false;
  *out = o.dtype;
  return true;
}

static int add_key(cu_kernel_key *keys, int cap, int n, cu_kernel_key k) {
  if (keys && n < cap) keys[n] = k;
  return n + 1;
}

int cu_kernel_keys(cu_kernel_key *keys, int cap) {
  int n = 0;
  const cu_layout layouts[] = {CU_CONTIG, CU_BROADCAST, CU_STRIDED};
  for (int op = 0; op < EM_PRIM_COUNT; op++) {
    unsigned fl = prim_get((em_prim)op)->flags;
    for (int i = 0; i < N_DTYPES; i++) {
      em_dtype dt = all_dtypes[i], out;
      if (fl & P_POINTWISE) {
        if (op == EM_PRIM_CONVERT) {
          for (int j = 0; j < N_DTYPES; j++)
            for (int l = 0; l < 3; l++)
              n = add_key(keys, cap, n, (cu_kernel_key){CU_POINTWISE, op, dt, all_dtypes[j], EM_I64, layouts[l]});
          continue;
        }
        int arity = prim_get((em_prim)op)->arity;
        em_dtype ins[3] = {dt, dt, dt};
        if (op == EM_PRIM_WHERE) ins[0] = EM_BOOL;
        if (!result_dtype((em_prim)op, &(prim_attrs){0}, ins, arity, 1, &out)) continue;
        for (int l = 0; l < 3; l++) n = add_key(keys, cap, n, (cu_kernel_key){CU_POINTWISE, op, dt, out, EM_I64, layouts[l]});
      } else if (fl & P_REDUCTION) {
        prim_attrs at = {.n_axes = 1, .axes = {1}};
        if (!result_dtype((em_prim)op, &at, &dt, 1, 2, &out)) continue;
        n = add_key(keys, cap, n, (cu_kernel_key){CU_REDUCE, op, dt, out, EM_I64, CU_CONTIG});
        n = add_key(keys, cap, n, (cu_kernel_key){CU_REDUCE, op, dt, out, EM_I64, CU_STRIDED});
      } else if (fl & P_INDEXING) {
        for (int x = 0; x < 2; x++) {
          em_dtype ix = x ? EM_I64 : EM_I32;
          em_dtype ins[3] = {dt, ix, dt};
          prim_attrs at = {.n_axes = 1, .axes = {0}};
          if (!result_dtype((em_prim)op, &at, ins, op == EM_PRIM_SCATTER_ADD ? 3 : 2, 2, &out)) continue;
          if (op == EM_PRIM_SCATTER_ADD && (dt == EM_BOOL || dt == EM_U8)) continue; /* no atomicAdd: see cuda.h */
          n = add_key(keys, cap, n, (cu_kernel_key){CU_INDEX, op, dt, out, ix, CU_STRIDED});
        }
      } else if (op == EM_PRIM_PHILOX_UNIFORM || op == EM_PRIM_PHILOX_NORMAL) {
        if (dt == EM_F32 || dt == EM_F64) n = add_key(keys, cap, n, (cu_kernel_key){CU_PHILOX, op, dt, dt, EM_I64, CU_CONTIG});
      } else if (fl & P_SCAN) {
        prim_attrs at = {.n_axes = 1, .axes = {1}};
        if (!result_dtype((em_prim)op, &at, &dt, 1, 2, &out)) continue;
        n = add_key(keys, cap, n, (cu_kernel_key){op == EM_PRIM_ARGSORT ? CU_SORT : CU_SCAN, op, dt, out, EM_I64, CU_STRIDED});
      } else if (op == EM_PRIM_IOTA) {
        n = add_key(keys, cap, n, (cu_kernel_key){CU_IOTA, op, dt, dt, EM_I64, CU_CONTIG});
      }
    }
  }
  for (int i = 0; i < N_DTYPES; i++) { /* movement and full: copies and fills */
    em_dtype dt = all_dtypes[i];
    for (int l = 0; l < 3; l++) n = add_key(keys, cap, n, (cu_kernel_key){CU_COPY, EM_PRIM_CLONE, dt, dt, EM_I64, layouts[l]});
    n = add_key(keys, cap, n, (cu_kernel_key){CU_FILL, EM_PRIM_FULL, dt, dt, EM_I64, CU_CONTIG});
    n = add_key(keys, cap, n, (cu_kernel_key){CU_FILL, EM_PRIM_FULL, dt, dt, EM_I64, CU_STRIDED});
    if (is_float(dt)) { /* convolution through cuBLAS */
      n = add_key(keys, cap, n, (cu_kernel_key){CU_IM2COL, EM_PRIM_CONV2D, dt, dt, EM_I64, CU_CONTIG});
      n = add_key(keys, cap, n, (cu_kernel_key){CU_IM2COL, EM_PRIM_CONV2D_BWD_INPUT, dt, dt, EM_I64, CU_STRIDED});
    }
  }
  return n;
}
