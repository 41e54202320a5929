/* prims/pointwise.c: reference kernels of the pointwise prims.
 *
 * Each prim has one 1-D inner loop per compute dtype, generated from one expression by the LOOP
 * macros below; prim_foreach (loop.c) walks the outer dimensions. Every loop has a contiguous
 * branch written over plain arrays so GCC vectorises it, and a strided branch. Transcendental
 * f32 functions on contiguous data go through SLEEF's vector routines (1.0-ULP variants), which
 * is where the eager exp/tanh throughput comes from. <tgmath.h> picks expf for float and exp for
 * double from one expression. */
#include "prims.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <tgmath.h>

#ifdef EMBER_HAVE_SLEEF
#include <immintrin.h>
#include <sleef.h>
#endif

typedef uint8_t bool8; /* bool elements are one byte, 0 or 1 */

#define LOOP1(NAME, TO, TI, EXPR)                                                        \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {             \
    (void)ctx;                                                                           \
    if (s[0] == sizeof(TO) && s[1] == sizeof(TI)) {                                      \
      TO *o = (TO *)p[0];                                                                \
      const TI *a = (const TI *)p[1];                                                    \
      for (int64_t i = 0; i < n; i++) {                                                  \
        TI x = a[i];                                                                     \
        o[i] = (TO)(EXPR);                                                               \
      }                                                                                  \
    } else {                                                                             \
      for (int64_t i = 0; i < n; i++) {                                                  \
        TI x = *(const TI *)(p[1] + i * s[1]);                                           \
        *(TO *)(p[0] + i * s[0]) = (TO)(EXPR);                                           \
      }                                                                                  \
    }                                                                                    \
  }

#define LOOP2(NAME, TO, TI, EXPR)                                                        \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {             \
    (void)ctx;                                                                           \
    if (s[0] == sizeof(TO) && s[1] == sizeof(TI) && s[2] == sizeof(TI)) {                \
      TO *o = (TO *)p[0];                                                                \
      const TI *a = (const TI *)p[1], *b = (const TI *)p[2];                             \
      for (int64_t i = 0; i < n; i++) {                                                  \
        TI x = a[i], y = b[i];                                                           \
        o[i] = (TO)(EXPR);                                                               \
      }                                                                                  \
    } else if (s[0] == sizeof(TO) && s[1] == sizeof(TI) && s[2] == 0) {                  \
      TO *o = (TO *)p[0];                                                                \
      const TI *a = (const TI *)p[1];                                                    \
      const TI y = *(const TI *)p[2];                                                    \
      for (int64_t i = 0; i < n; i++) {                                                  \
        TI x = a[i];                                                                     \
        o[i] = (TO)(EXPR);                                                               \
      }                                                                                  \
    } else {                                                                             \
      for (int64_t i = 0; i < n; i++) {                                                  \
        TI x = *(const TI *)(p[1] + i * s[1]), y = *(const TI *)(p[2] + i * s[2]);       \
        *(TO *)(p[0] + i * s[0]) = (TO)(EXPR);                                           \
      }                                                                                  \
    }                                                                                    \
  }

/* One loop per compute dtype. F: expression for floats; I: for integers (i32 i64 u8);
 * B: for bool. A NULL entry means the meta function already rejected that dtype. */
#define UN_F(OP, EXPR)                          \
  LOOP1(OP##_f32, float, float, EXPR)           \
  LOOP1(OP##_f64, double, double, EXPR)
#define UN_I(OP, EXPR)                          \
  LOOP1(OP##_i32, int32_t, int32_t, EXPR)       \
  LOOP1(OP##_i64, int64_t, int64_t, EXPR)       \
  LOOP1(OP##_u8, uint8_t, uint8_t, EXPR)
#define BIN_F(OP, TO_F32, TO_F64, EXPR)         \
  LOOP2(OP##_f32, TO_F32, float, EXPR)          \
  LOOP2(OP##_f64, TO_F64, double, EXPR)
#define BIN_I(OP, TO_I32, TO_I64, TO_U8, EXPR)  \
  LOOP2(OP##_i32, TO_I32, int32_t, EXPR)        \
  LOOP2(OP##_i64, TO_I64, int64_t, EXPR)        \
  LOOP2(OP##_u8, TO_U8, uint8_t, EXPR)

/* ---- unary ---- */
UN_F(neg, -x)
/* wrapping, as two's complement and PyTorch: -INT64_MIN is INT64_MIN, not undefined behaviour */
LOOP1(neg_i32, int32_t, int32_t, (int32_t)(0u - (uint32_t)x))
LOOP1(neg_i64, int64_t, int64_t, (int64_t)(0ull - (uint64_t)x))
LOOP1(neg_u8, uint8_t, uint8_t, (uint8_t)(0u - x))
UN_F(abs, fabs(x))
LOOP1(abs_i32, int32_t, int32_t, x < 0 ? -(uint32_t)x : (uint32_t)x)
LOOP1(abs_i64, int64_t, int64_t, x < 0 ? -(uint64_t)x : (uint64_t)x)
LOOP1(abs_u8, uint8_t, uint8_t, x)
LOOP1(abs_bool, bool8, bool8, x)
UN_F(exp, exp(x))
UN_F(log, log(x))
UN_F(log1p, log1p(x))
UN_F(expm1, expm1(x))
UN_F(sqrt, sqrt(x))
UN_F(rsqrt, 1 / sqrt(x))
UN_F(sin, sin(x))
UN_F(cos, cos(x))
UN_F(tanh, tanh(x))
UN_F(erf, erf(x))
UN_F(sign, (x > 0) - (x < 0)) /* NaN gives 0, as torch.sign */
LOOP1(sign_i32, int32_t, int32_t, (x > 0) - (x < 0))
LOOP1(sign_i64, int64_t, int64_t, (x > 0) - (x < 0))
LOOP1(sign_u8, uint8_t, uint8_t, x > 0)
LOOP1(sign_bool, bool8, bool8, x)
UN_F(floor, floor(x))
UN_I(floor, x)
LOOP1(floor_bool, bool8, bool8, x)
UN_F(ceil, ceil(x))
UN_I(ceil, x)
LOOP1(ceil_bool, bool8, bool8, x)
UN_F(reciprocal, 1 / x)
LOOP1(lnot_f32, bool8, float, x == 0)
LOOP1(lnot_f64, bool8, double, x == 0)
LOOP1(lnot_i32, bool8, int32_t, x == 0)
LOOP1(lnot_i64, bool8, int64_t, x == 0)
LOOP1(lnot_u8, bool8, uint8_t, x == 0)
LOOP1(lnot_bool, bool8, bool8, x == 0)

/* ---- binary ---- */
/* Integer add/sub/mul wrap, as in torch; computed unsigned so the wrap is defined in C. */
BIN_F(add, float, double, x + y)
LOOP2(add_i32, int32_t, int32_t, (uint32_t)x + (uint32_t)y)
LOOP2(add_i64, int64_t, int64_t, (uint64_t)x + (uint64_t)y)
LOOP2(add_u8, uint8_t, uint8_t, x + y)
LOOP2(add_bool, bool8, bool8, x | y)
BIN_F(sub, float, double, x - y)
LOOP2(sub_i32, int32_t, int32_t, (uint32_t)x - (uint32_t)y)
LOOP2(sub_i64, int64_t, int64_t, (uint64_t)x - (uint64_t)y)
LOOP2(sub_u8, uint8_t, uint8_t, x - y)
BIN_F(mul, float, double, x * y)
LOOP2(mul_i32, int32_t, int32_t, (uint32_t)x * (uint32_t)y)
LOOP2(mul_i64, int64_t, int64_t, (uint64_t)x * (uint64_t)y)
LOOP2(mul_u8, uint8_t, uint8_t, x * y)
LOOP2(mul_bool, bool8, bool8, x & y)
BIN_F(div, float, double, x / y)
BIN_F(pow, float, double, pow(x, y))
/* Integer powers by squaring; y >= 0 is checked before the loop runs. */
static inline uint64_t ipow(uint64_t b, int64_t e) {
  uint64_t r = 1;
  while (e > 0) {
    if (e & 1) r *= b;
    b *= b;
    e >>= 1;
  }
  return r;
}
BIN_I(pow, int32_t, int64_t, uint8_t, ipow((uint64_t)x, (int64_t)y))
/* maximum/minimum propagate NaN, as torch.maximum does. */
BIN_F(max, float, double, x != x ? x : (y != y ? y : (x > y ? x : y)))
BIN_I(max, int32_t, int64_t, uint8_t, x > y ? x : y)
LOOP2(max_bool, bool8, bool8, x | y)
BIN_F(min, float, double, x != x ? x : (y != y ? y : (x < y ? x : y)))
BIN_I(min, int32_t, int64_t, uint8_t, x < y ? x : y)
LOOP2(min_bool, bool8, bool8, x & y)
/* Python's modulo: the result takes the divisor's sign. y != 0 is checked for integers. */
static inline double fmod_py(double x, double y) {
  double r = fmod(x, y);
  return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}
static inline int64_t imod_py(int64_t x, int64_t y) {
  if (y == -1) return 0; /* INT64_MIN % -1 overflows in C */
  int64_t r = x % y;
  return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}
LOOP2(rem_f32, float, float, (float)fmod_py(x, y))
LOOP2(rem_f64, double, double, fmod_py(x, y))
BIN_I(rem, int32_t, int64_t, uint8_t, imod_py(x, y))
BIN_F(atan2, float, double, atan2(x, y))

#define CMP(OP, EXPR)                      \
  BIN_F(OP, bool8, bool8, EXPR)            \
  BIN_I(OP, bool8, bool8, bool8, EXPR)     \
  LOOP2(OP##_bool, bool8, bool8, EXPR)
CMP(eq, x == y)
CMP(ne, x != y)
CMP(lt, x < y)
CMP(le, x <= y)
CMP(gt, x > y)
CMP(ge, x >= y)
CMP(land, x != 0 && y != 0)
CMP(lor, x != 0 || y != 0)

#define ROW6(OP) {[EM_F32] = OP##_f32, [EM_F64] = OP##_f64, [EM_I32] = OP##_i32, \
                  [EM_I64] = OP##_i64, [EM_U8] = OP##_u8, [EM_BOOL] = OP##_bool}
#define ROW5(OP) {[EM_F32] = OP##_f32, [EM_F64] = OP##_f64, [EM_I32] = OP##_i32, \
                  [EM_I64] = OP##_i64, [EM_U8] = OP##_u8}
#define ROWF(OP) {[EM_F32] = OP##_f32, [EM_F64] = OP##_f64}

static const prim_loop1d loops[EM_PRIM_COUNT][EM_DTYPE_COUNT] = {
    [EM_PRIM_NEG] = ROW5(neg),         [EM_PRIM_ABS] = ROW6(abs),
    [EM_PRIM_EXP] = ROWF(exp),         [EM_PRIM_LOG] = ROWF(log),
    [EM_PRIM_LOG1P] = ROWF(log1p),     [EM_PRIM_EXPM1] = ROWF(expm1),
    [EM_PRIM_SQRT] = ROWF(sqrt),       [EM_PRIM_RSQRT] = ROWF(rsqrt),
    [EM_PRIM_SIN] = ROWF(sin),         [EM_PRIM_COS] = ROWF(cos),
    [EM_PRIM_TANH] = ROWF(tanh),       [EM_PRIM_ERF] = ROWF(erf),
    [EM_PRIM_SIGN] = ROW6(sign),       [EM_PRIM_FLOOR] = ROW6(floor),
    [EM_PRIM_CEIL] = ROW6(ceil),       [EM_PRIM_RECIPROCAL] = ROWF(reciprocal),
    [EM_PRIM_LOGICAL_NOT] = ROW6(lnot),
    [EM_PRIM_ADD] = ROW6(add),         [EM_PRIM_SUB] = ROW5(sub),
    [EM_PRIM_MUL] = ROW6(mul),         [EM_PRIM_DIV] = ROWF(div),
    [EM_PRIM_POW] = ROW5(pow),         [EM_PRIM_MAXIMUM] = ROW6(max),
    [EM_PRIM_MINIMUM] = ROW6(min),     [EM_PRIM_REMAINDER] = ROW5(rem),
    [EM_PRIM_ATAN2] = ROWF(atan2),
    [EM_PRIM_EQ] = ROW6(eq),           [EM_PRIM_NE] = ROW6(ne),
    [EM_PRIM_LT] = ROW6(lt),           [EM_PRIM_LE] = ROW6(le),
    [EM_PRIM_GT] = ROW6(gt),           [EM_PRIM_GE] = ROW6(ge),
    [EM_PRIM_LOGICAL_AND] = ROW6(land), [EM_PRIM_LOGICAL_OR] = ROW6(lor),
};

/* ---- SLEEF vector loops for f32 ----
 * Every element goes through the same vector routine, whatever the layout: a row's tail and
 * strided rows are gathered into a vector's worth of lanes. With libm for those (as before), an
 * element's bits depended on its operand's strides and on its position in a row, so the same op
 * on the same values gave eager one result and a replayed graph, whose operand was laid out
 * otherwise, another (the fuzzer: exp(tanh(x)) 2 ULP apart under the eager backend, which
 * promises eager's bits). */
#ifdef EMBER_HAVE_SLEEF
#define SLEEF_LOOP(OP, VFN)                                                                   \
  static void OP##_f32_vec(char **p, const int64_t *s, int64_t n, const void *ctx) {          \
    (void)ctx;                                                                                \
    float lanes[8];                                                                           \
    for (int64_t i = 0; i < n; i += 8) {                                                      \
      int64_t m = n - i < 8 ? n - i : 8;                                                      \
      if (m == 8 && s[0] == 4 && s[1] == 4) {                                                 \
        _mm256_storeu_ps((float *)p[0] + i, VFN(_mm256_loadu_ps((const float *)p[1] + i)));   \
        continue;                                                                             \
      }                                                                                       \
      for (int64_t k = 0; k < 8; k++) lanes[k] = k < m ? *(const float *)(p[1] + (i + k) * s[1]) : 0.0f; \
      _mm256_storeu_ps(lanes, VFN(_mm256_loadu_ps(lanes)));                                   \
      for (int64_t k = 0; k < m; k++) *(float *)(p[0] + (i + k) * s[0]) = lanes[k];          \
    }                                                                                         \
  }
SLEEF_LOOP(exp, Sleef_expf8_u10)
SLEEF_LOOP(log, Sleef_logf8_u10)
SLEEF_LOOP(log1p, Sleef_log1pf8_u10)
SLEEF_LOOP(expm1, Sleef_expm1f8_u10)
SLEEF_LOOP(sin, Sleef_sinf8_u10)
SLEEF_LOOP(cos, Sleef_cosf8_u10)
SLEEF_LOOP(tanh, Sleef_tanhf8_u10)
SLEEF_LOOP(erf, Sleef_erff8_u10)
static prim_loop1d vec_loop(em_prim op) {
  switch (op) {
  case EM_PRIM_EXP: return exp_f32_vec;
  case EM_PRIM_LOG: return log_f32_vec;
  case EM_PRIM_LOG1P: return log1p_f32_vec;
  case EM_PRIM_EXPM1: return expm1_f32_vec;
  case EM_PRIM_SIN: return sin_f32_vec;
  case EM_PRIM_COS: return cos_f32_vec;
  case EM_PRIM_TANH: return tanh_f32_vec;
  case EM_PRIM_ERF: return erf_f32_vec;
  default: return NULL;
  }
}
#else
static prim_loop1d vec_loop(em_prim op) { (void)op; return NULL; }
#endif

/* ---- where ---- */
/* A select by mask, not a branch: the condition is data (a ReLU's sign is a coin flip), and a
 * mispredicted branch per element made where() 14x slower than an add. */
/* Dense operands (each either contiguous or one broadcast value) get loops the compiler
 * vectorises: IA, IB index a and b (i or 0). */
#define WHERE_DENSE(T, IA, IB)                                                       \
  for (int64_t i = 0; i < n; i++) {                                                  \
    T m = (T)0 - (T)(c[i] != 0);                                                     \
    o[i] = (T)((a[IA] & m) | (b[IB] & (T)~m));                                       \
  }
#define WHERE_LOOP(NAME, T)                                                          \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {         \
    (void)ctx;                                                                       \
    if (s[0] == sizeof(T) && s[1] == 1 && (s[2] == sizeof(T) || s[2] == 0) &&        \
        (s[3] == sizeof(T) || s[3] == 0)) {                                          \
      T *restrict o = (T *)p[0];                                                     \
      const bool8 *restrict c = (const bool8 *)p[1];                                 \
      const T *restrict a = (const T *)p[2], *restrict b = (const T *)p[3];          \
      if (s[2] && s[3]) WHERE_DENSE(T, i, i)                                         \
      else if (s[2]) WHERE_DENSE(T, i, 0)                                            \
      else if (s[3]) WHERE_DENSE(T, 0, i)                                            \
      else WHERE_DENSE(T, 0, 0)                                                      \
      return;                                                                        \
    }                                                                                \
    for (int64_t i = 0; i < n; i++) {                                                \
      T m = (T)0 - (T)(*(const bool8 *)(p[1] + i * s[1]) != 0);                      \
      T a = *(const T *)(p[2] + i * s[2]), b = *(const T *)(p[3] + i * s[3]);        \
      *(T *)(p[0] + i * s[0]) = (T)((a & m) | (b & (T)~m));                          \
    }                                                                                \
  }
WHERE_LOOP(where_1, uint8_t)
WHERE_LOOP(where_2, uint16_t)
WHERE_LOOP(where_4, uint32_t)
WHERE_LOOP(where_8, uint64_t)

/* ---- convert ---- */
#define CONV_LOOP(NAME, TO, TI, EXPR) LOOP1(NAME, TO, TI, EXPR)
/* Float to integer: C leaves NaN and out-of-range values undefined. Defined here as prim_store
 * defines them (INT64_MIN, what x86's cvttsd2si gives, then the low bits for narrower types), so
 * every path that converts agrees. */
static inline int64_t f2i(double v) { return v >= -0x1p63 && v < 0x1p63 ? (int64_t)v : INT64_MIN; }
#define CONV_FROM(FN, TI)                                      \
  CONV_LOOP(FN##_to_f32, float, TI, x)                         \
  CONV_LOOP(FN##_to_f64, double, TI, x)                        \
  CONV_LOOP(FN##_to_i32, int32_t, TI, x)                       \
  CONV_LOOP(FN##_to_i64, int64_t, TI, x)                       \
  CONV_LOOP(FN##_to_u8, uint8_t, TI, x)                        \
  CONV_LOOP(FN##_to_bool, bool8, TI, x != 0)
#define CONV_FROM_FLOAT(FN, TI)                                \
  CONV_LOOP(FN##_to_f32, float, TI, x)                         \
  CONV_LOOP(FN##_to_f64, double, TI, x)                        \
  CONV_LOOP(FN##_to_i32, int32_t, TI, (uint32_t)(uint64_t)f2i(x)) \
  CONV_LOOP(FN##_to_i64, int64_t, TI, f2i(x))                  \
  CONV_LOOP(FN##_to_u8, uint8_t, TI, (uint8_t)(uint64_t)f2i(x)) \
  CONV_LOOP(FN##_to_bool, bool8, TI, x != 0)
CONV_FROM_FLOAT(f32, float)
CONV_FROM_FLOAT(f64, double)
CONV_FROM(i32, int32_t)
CONV_FROM(i64, int64_t)
CONV_FROM(u8, uint8_t)
CONV_FROM(bool, bool8)
#define CONV_ROW(FN) {[EM_F32] = FN##_to_f32, [EM_F64] = FN##_to_f64, [EM_I32] = FN##_to_i32, \
                      [EM_I64] = FN##_to_i64, [EM_U8] = FN##_to_u8, [EM_BOOL] = FN##_to_bool}
static const prim_loop1d conv_loops[EM_DTYPE_COUNT][EM_DTYPE_COUNT] = {
    [EM_F32] = CONV_ROW(f32), [EM_F64] = CONV_ROW(f64), [EM_I32] = CONV_ROW(i32),
    [EM_I64] = CONV_ROW(i64), [EM_U8] = CONV_ROW(u8),   [EM_BOOL] = CONV_ROW(bool),
};
/* Any pair involving f16/bf16 goes through double. */
typedef struct { em_dtype from, to; } conv_ctx;
static void conv_slow(char **p, const int64_t *s, int64_t n, const void *ctx) {
  const conv_ctx *c = ctx;
  for (int64_t i = 0; i < n; i++) prim_store(p[0] + i * s[0], c->to, prim_load(p[1] + i * s[1], c->from));
}

/* ---- checks that must precede a loop: integer remainder by zero, negative integer powers ---- */
typedef struct { em_dtype dt; int bad; double bad_value; } check_ctx;
static void check_zero(char **p, const int64_t *s, int64_t n, const void *ctx) {
  check_ctx *c = (check_ctx *)ctx;
  for (int64_t i = 0; i < n && !c->bad; i++)
    if (prim_load(p[0] + i * s[0], c->dt) == 0) c->bad = 1;
}
static void check_negative(char **p, const int64_t *s, int64_t n, const void *ctx) {
  check_ctx *c = (check_ctx *)ctx;
  for (int64_t i = 0; i < n && !c->bad; i++) {
    double v = prim_load(p[0] + i * s[0], c->dt);
    if (v < 0) c->bad = 1, c->bad_value = v;
  }
}

bool prim_run_pointwise(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in,
                        char *err, size_t cap) {
  prim_buf b[4];
  b[0] = *out;
  int arity = prim_get(op)->arity;
  for (int i = 0; i < arity; i++) b[i + 1] = in[i];
  if (op == EM_PRIM_CONVERT) {
    em_dtype from = in[0].dtype, to = at->dtype;
    prim_loop1d fn = conv_loops[from][to];
    conv_ctx c = {from, to};
    prim_foreach(2, b, fn ? fn : conv_slow, &c);
    return true;
  }
  if (op == EM_PRIM_WHERE) {
    static const prim_loop1d by_size[9] = {[1] = where_1, [2] = where_2, [4] = where_4, [8] = where_8};
    prim_foreach(4, b, by_size[ir_dtype(out->dtype)->size], NULL);
    return true;
  }
  em_dtype dt = in[0].dtype;
  if (!ir_is_float(dt) && (op == EM_PRIM_REMAINDER || op == EM_PRIM_POW)) {
    check_ctx c = {dt, 0, 0};
    prim_foreach_serial(1, &in[1], op == EM_PRIM_REMAINDER ? check_zero : check_negative, &c);
    if (c.bad && op == EM_PRIM_REMAINDER) return snprintf(err, cap, "integer remainder by zero"), false;
    if (c.bad) return snprintf(err, cap, "integers to negative integer powers are not allowed (exponent %g)", c.bad_value), false;
  }
  prim_loop1d fn = loops[op][dt];
  if (dt == EM_F32 && vec_loop(op)) fn = vec_loop(op);
  if (!fn) return snprintf(err, cap, "has no CPU kernel for %s", em_dtype_name(dt)), false;
  prim_foreach(arity + 1, b, fn, NULL);
  return true;
}
