/* prims/creation.c: element access, half-precision conversions, and the creation prims (FULL,
 * IOTA, PHILOX_UNIFORM, PHILOX_NORMAL).
 *
 * prim_load and prim_store are the one place that says how a double maps to and from each
 * dtype's bytes; the printer, item() and every slow path go through them, so their rounding and
 * overflow rules are documented once, here. f16 and bf16 are converted with integer bit
 * manipulation rather than the compiler's _Float16, so results do not depend on the target's
 * half support or on the floating-point environment.
 *
 * The random prims are counter-based: every output element is a pure function of (seed,
 * offset, flat index), so the kernels split work across OpenMP threads freely and the values
 * never depend on the thread count; the CUDA backend implements the same stream (below). */
#include "prims.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- half and bfloat16 ----------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float prim_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000 | (m << 13)); /* Inf, NaN (payload kept) */
  if (e != 0) return bits_f32(sign | ((e + 112) << 23) | (m << 13)); /* rebias 15 -> 127 */
  if (m == 0) return bits_f32(sign);
  /* Subnormal m * 2^-24: normalise so the leading one becomes the implicit bit. */
  uint32_t fe = 113;
  while (!(m & 0x400)) {
    m <<= 1;
    fe--;
  }
  return bits_f32(sign | (fe << 23) | ((m & 0x3ff) << 13));
}

uint16_t prim_float_to_half(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffff;
  /* NaN stays NaN: set the quiet bit so a payload living only in the dropped low bits cannot
   * turn it into Inf. */
  if (a > 0x7f800000) return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x1ff);
  if (a >= 0x47800000) return sign | 0x7c00; /* |f| >= 2^16 (or Inf): overflows */
  if (a >= 0x38800000) {
    /* Normal half range: rebias the exponent in place, then round the 13 dropped mantissa bits
     * to nearest even. A carry out of the mantissa correctly bumps the exponent, up to Inf for
     * values >= 65520. */
    uint32_t m = a - (112u << 23);
    return sign | (uint16_t)((m + 0xfff + ((m >> 13) & 1)) >> 13);
  }
  if (a < 0x33000000) return sign; /* below half the smallest subnormal (2^-25): rounds to 0 */
  /* Subnormal result: count units of 2^-24 and round to nearest even. A result of 0x400 is the
   * smallest normal, which is also the right encoding. */
  uint32_t mant = (a & 0x7fffff) | 0x800000;
  int shift = 126 - (int)(a >> 23); /* 14..24 */
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1))) q++;
  return sign | (uint16_t)q;
}

float prim_bf16_to_float(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t prim_float_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  /* Round to nearest even on the dropped 16 bits; overflow rounds to Inf, as IEEE requires. */
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* ---- element access ---------------------------------------------------------------------- */

/* Float to integer: truncation toward zero, as a C cast. Values outside int64 and NaN give
 * INT64_MIN (what x86's cvttsd2si returns, so it matches compiled casts there); narrower
 * integers take the low bits of the int64 (300.0 -> u8 44, -1.0 -> u8 255, as torch does). */
static int64_t to_i64(double v) {
  if (!(v >= -0x1p63 && v < 0x1p63)) return INT64_MIN;
  return (int64_t)v;
}

/* Double to float rounding to odd (an inexact result gets its last bit set). Rounding that to
 * half or bfloat16 to nearest even then gives the correctly rounded result, which converting
 * through an ordinary (nearest-even) float would not for doubles just off a half-way point. */
static float to_f32_odd(double v) {
  float f = (float)v;
  if ((double)f == v || f != f || isinf(f)) return f;
  uint32_t u = f32_bits(f);
  if (!(u & 1)) u = fabs((double)f) < fabs(v) ? u + 1 : u - 1; /* toward v; the sign bit stays */
  return bits_f32(u);
}

double prim_load(const char *p, em_dtype dt) {
  switch (dt) {
  case EM_F32: { float v; memcpy(&v, p, sizeof v); return v; }
  case EM_F64: { double v; memcpy(&v, p, sizeof v); return v; }
  case EM_I32: { int32_t v; memcpy(&v, p, sizeof v); return v; }
  case EM_I64: { int64_t v; memcpy(&v, p, sizeof v); return (double)v; }
  case EM_BOOL: return *(const uint8_t *)p != 0;
  case EM_U8: return *(const uint8_t *)p;
  case EM_F16: { uint16_t v; memcpy(&v, p, sizeof v); return prim_half_to_float(v); }
  case EM_BF16: { uint16_t v; memcpy(&v, p, sizeof v); return prim_bf16_to_float(v); }
  default: return NAN;
  }
}

void prim_store(char *p, em_dtype dt, double v) {
  switch (dt) {
  case EM_F32: { float x = (float)v; memcpy(p, &x, sizeof x); break; }
  case EM_F64: memcpy(p, &v, sizeof v); break;
  case EM_I32: {
    int32_t x = (int32_t)(uint32_t)(uint64_t)to_i64(v);
    memcpy(p, &x, sizeof x);
    break;
  }
  case EM_I64: { int64_t x = to_i64(v); memcpy(p, &x, sizeof x); break; }
  case EM_BOOL: *(uint8_t *)p = v != 0; break; /* NaN != 0: true, as in C and torch */
  case EM_U8: *(uint8_t *)p = (uint8_t)(uint64_t)to_i64(v); break;
  case EM_F16: { uint16_t x = prim_float_to_half(to_f32_odd(v)); memcpy(p, &x, sizeof x); break; }
  case EM_BF16: { uint16_t x = prim_float_to_bf16(to_f32_odd(v)); memcpy(p, &x, sizeof x); break; }
  default: break;
  }
}

/* ---- Philox4x32-10 ---------------------------------------------------------------------- */

#define PHILOX_M0 0xD2511F53u /* round multipliers */
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* key schedule: golden ratio, sqrt(3) - 1 */
#define PHILOX_W1 0xBB67AE85u

/* Inline so the fill loops below keep the 10 rounds in registers. */
static inline void philox(uint64_t ctr_lo, uint64_t ctr_hi, uint64_t key, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32);
  uint32_t c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++) {
    /* The key schedule bumps before every round but the first (Random123's philox4x32_R). */
    if (r) k0 += PHILOX_W0, k1 += PHILOX_W1;
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

void prim_philox(uint64_t ctr_lo, uint64_t ctr_hi, uint64_t key, uint32_t out[4]) {
  philox(ctr_lo, ctr_hi, key, out);
}

/* The random stream. Key = seed; call q of an op uses the 128-bit counter offset + q (the carry
 * out of the low 64 bits goes into the high word), and returns words w0..w3. For element i of
 * the flattened (row-major) result:
 *
 *   uniform f32: call i/4, word w = w[i%4]; u = (w >> 8) * 2^-24, in [0, 1) (24 bits, exact).
 *   uniform f64: call i/2, r = i%2; b = ((w[2r+1] << 32 | w[2r]) >> 11), the top 53 bits of the
 *                64-bit value with w[2r+1] as the high word; u = b * 2^-53, in [0, 1) (exact).
 *   normal f32:  call i/4, pair j = (i%4)/2: u1 = (w[2j] + 1) * 2^-32, u2 = (w[2j+1] + 1) * 2^-32,
 *                both in (0, 1] so the logarithm never sees 0; Box-Muller
 *                  z0 = sqrt(-2 ln u1) cos(2 pi u2),  z1 = sqrt(-2 ln u1) sin(2 pi u2),
 *                element i takes z0 when i is even, z1 when odd.
 *   normal f64:  call i/2: u1 = (b01 + 1) * 2^-53, u2 = (b23 + 1) * 2^-53 in (0, 1], where b01 is
 *                the 53-bit b above built from (w0, w1) and b23 from (w2, w3); z0, z1 as for f32,
 *                element i takes z0 when i is even, z1 when odd.
 *
 * So an f32 op uses ceil(n/4) calls and an f64 op ceil(n/2) (prim_philox_calls); the runtime
 * advances the generator's offset by that much. The uniforms are exact; the normals are defined
 * by the formulas in real arithmetic. This kernel evaluates them in double (and rounds f32 once
 * at the end), so a device evaluating them in float agrees to a few ulp, not bit for bit. */

uint64_t prim_philox_calls(em_prim op, em_dtype dt, int64_t numel) {
  if (!(prim_get(op)->flags & P_RANDOM) || numel <= 0) return 0;
  if (dt == EM_F32) return ((uint64_t)numel + 3) / 4;
  if (dt == EM_F64) return ((uint64_t)numel + 1) / 2;
  return 0;
}

static inline void philox_call(uint64_t seed, uint64_t offset, uint64_t q, uint32_t w[4]) {
  uint64_t lo = offset + q;
  philox(lo, lo < offset, seed, w);
}

static inline double bits53(uint32_t lo, uint32_t hi) {
  return (double)((((uint64_t)hi << 32) | lo) >> 11);
}

/* Box-Muller on two uniforms in (0, 1], in double. */
static inline void box_muller(double u1, double u2, double *z0, double *z1) {
  const double two_pi = 6.28318530717958647692528676655900577;
  double r = sqrt(-2.0 * log(u1)), t = two_pi * u2;
  *z0 = r * cos(t);
  *z1 = r * sin(t);
}

/* Calls below this count stay on one thread (a call is 4 or 2 elements). */
#define PHILOX_GRAIN (PRIM_PARALLEL_GRAIN / 4)

typedef struct {
  bool normal;
  uint64_t seed, offset;
  char *data;
  int64_t n;
} philox_job;

/* Philox calls [q0, q1): each writes 4 floats or 2 doubles from its own counter, so any split
 * gives the same values. */
static void philox_f32(void *ctx, int64_t q0, int64_t q1) {
  const philox_job *p = ctx;
  float *o = (float *)p->data;
  for (int64_t q = q0; q < q1; q++) {
    uint32_t w[4];
    float v[4];
    philox_call(p->seed, p->offset, (uint64_t)q, w);
    if (p->normal) {
      for (int j = 0; j < 2; j++) {
        double z0, z1;
        double u1 = ((double)w[2 * j] + 1) * 0x1p-32, u2 = ((double)w[2 * j + 1] + 1) * 0x1p-32;
        box_muller(u1, u2, &z0, &z1);
        v[2 * j] = (float)z0, v[2 * j + 1] = (float)z1;
      }
    } else {
      for (int j = 0; j < 4; j++) v[j] = (float)(w[j] >> 8) * 0x1p-24f;
    }
    int64_t i = 4 * q, m = p->n - i < 4 ? p->n - i : 4;
    for (int64_t j = 0; j < m; j++) o[i + j] = v[j];
  }
}

static void philox_f64(void *ctx, int64_t q0, int64_t q1) {
  const philox_job *p = ctx;
  double *o = (double *)p->data;
  for (int64_t q = q0; q < q1; q++) {
    uint32_t w[4];
    double v[2];
    philox_call(p->seed, p->offset, (uint64_t)q, w);
    if (p->normal) {
      double u1 = (bits53(w[0], w[1]) + 1) * 0x1p-53, u2 = (bits53(w[2], w[3]) + 1) * 0x1p-53;
      box_muller(u1, u2, &v[0], &v[1]);
    } else {
      v[0] = bits53(w[0], w[1]) * 0x1p-53;
      v[1] = bits53(w[2], w[3]) * 0x1p-53;
    }
    int64_t i = 2 * q;
    o[i] = v[0];
    if (i + 1 < p->n) o[i + 1] = v[1];
  }
}

static void fill_philox(em_prim op, em_dtype dt, uint64_t seed, uint64_t offset, char *data,
                        int64_t n) {
  int64_t calls = (int64_t)prim_philox_calls(op, dt, n);
  philox_job p = {op == EM_PRIM_PHILOX_NORMAL, seed, offset, data, n};
  prim_parallel_for(calls >= 2 * PHILOX_GRAIN, calls, dt == EM_F32 ? philox_f32 : philox_f64, &p);
}

/* ---- full and iota ----------------------------------------------------------------------- */

/* FULL writes one precomputed element pattern; prim_foreach supplies strides and threads. */
#define FILL_LOOP(NAME, T)                                                \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) { \
    T v;                                                                  \
    memcpy(&v, ctx, sizeof v);                                            \
    if (s[0] == sizeof(T)) {                                              \
      T *o = (T *)p[0];                                                   \
      for (int64_t i = 0; i < n; i++) o[i] = v;                           \
    } else {                                                              \
      for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], &v, sizeof v); \
    }                                                                     \
  }
FILL_LOOP(fill_1, uint8_t)
FILL_LOOP(fill_2, uint16_t)
FILL_LOOP(fill_4, uint32_t)
FILL_LOOP(fill_8, uint64_t)

static bool is_int64_valued(double v) { return v == floor(v) && v >= -0x1p63 && v < 0x1p63; }

typedef struct {
  em_dtype dt;
  char *d;
  uint64_t a, b;   /* integer iota: a + i * b, wrapping */
  double v0, dv;   /* float iota: v0 + i * dv */
} iota_job;

static void iota_int(void *ctx, int64_t i0, int64_t i1) {
  const iota_job *t = ctx;
  for (int64_t i = i0; i < i1; i++) {
    uint64_t x = t->a + (uint64_t)i * t->b;
    switch (t->dt) {
    case EM_I64: ((int64_t *)t->d)[i] = (int64_t)x; break;
    case EM_I32: ((int32_t *)t->d)[i] = (int32_t)(uint32_t)x; break;
    case EM_U8: ((uint8_t *)t->d)[i] = (uint8_t)x; break;
    default: ((uint8_t *)t->d)[i] = x != 0; break; /* bool */
    }
  }
}

/* start + i * step in double, then one rounding to the dtype, as torch.arange does. The
 * product is its own statement so that no compiler fuses it into an FMA (C allows that only
 * within one expression), keeping the values the same whatever the contraction setting. */
static void iota_f32(void *ctx, int64_t i0, int64_t i1) {
  const iota_job *t = ctx;
  for (int64_t i = i0; i < i1; i++) {
    double di = (double)i * t->dv;
    ((float *)t->d)[i] = (float)(t->v0 + di);
  }
}

static void iota_f64(void *ctx, int64_t i0, int64_t i1) {
  const iota_job *t = ctx;
  for (int64_t i = i0; i < i1; i++) {
    double di = (double)i * t->dv;
    ((double *)t->d)[i] = t->v0 + di;
  }
}

static void iota_other(void *ctx, int64_t i0, int64_t i1) {
  const iota_job *t = ctx;
  size_t sz = ir_dtype(t->dt)->size;
  for (int64_t i = i0; i < i1; i++) {
    double di = (double)i * t->dv;
    prim_store(t->d + (size_t)i * sz, t->dt, t->v0 + di);
  }
}

static void fill_iota(const prim_attrs *at, const prim_buf *out, int64_t n) {
  iota_job t = {.dt = out->dtype, .d = out->data, .v0 = at->value, .dv = at->value2};
  bool par = n >= 2 * PRIM_PARALLEL_GRAIN;
  prim_range_task fn;
  if (!ir_is_float(t.dt) && is_int64_valued(t.v0) && is_int64_valued(t.dv)) {
    /* Exact integer arithmetic, wrapping (through uint64) rather than overflowing. */
    t.a = (uint64_t)(int64_t)t.v0, t.b = (uint64_t)(int64_t)t.dv;
    fn = iota_int;
  } else {
    fn = t.dt == EM_F32 ? iota_f32 : t.dt == EM_F64 ? iota_f64 : iota_other;
  }
  prim_parallel_for(par, n, fn, &t);
}

bool prim_run_creation(em_prim op, const prim_attrs *at, const prim_buf *out, char *err,
                       size_t cap) {
  int64_t n = ir_numel(out->ndim, out->sizes);
  if (op == EM_PRIM_FULL) {
    static const prim_loop1d by_size[9] = {[1] = fill_1, [2] = fill_2, [4] = fill_4, [8] = fill_8};
    unsigned char pattern[8] = {0};
    prim_store((char *)pattern, out->dtype, at->value);
    prim_foreach(1, out, by_size[ir_dtype(out->dtype)->size], pattern);
    return true;
  }
  if (op != EM_PRIM_IOTA && op != EM_PRIM_PHILOX_UNIFORM && op != EM_PRIM_PHILOX_NORMAL)
    return snprintf(err, cap, "is not a creation prim"), false;
  /* IOTA and the random prims number elements by their flat index in a contiguous result. */
  if (!ir_is_contiguous(out->ndim, out->sizes, out->strides))
    return snprintf(err, cap, "needs a contiguous result"), false;
  if (n == 0) return true;
  if (op == EM_PRIM_IOTA) {
    fill_iota(at, out, n);
    return true;
  }
  if (out->dtype != EM_F32 && out->dtype != EM_F64)
    return snprintf(err, cap, "needs dtype f32 or f64, got %s", em_dtype_name(out->dtype)), false;
  fill_philox(op, out->dtype, at->seed, at->offset, out->data, n);
  return true;
}
