/* prims/reduce.c: reference kernels of the reduction prims (SUM, PROD, AMAX, AMIN, ARGMAX,
 * ARGMIN).
 *
 * A reduction is planned once per call: the input's dims are split into kept dims (the output's,
 * in output order) and reduced dims, size-1 dims are dropped, and dims that step through memory
 * as one block are merged, so a contiguous full reduction is one flat run and a [N, C] tensor
 * reduced over N is one row of C columns repeated N times. Two loop shapes then cover the
 * common layouts at memory speed:
 *
 *  - row mode, when the innermost reduced dim is contiguous and not short (sum over the last
 *    axis, full reductions): each output reduces its own runs with a vectorised kernel;
 *  - column mode otherwise, when some kept dim has at least MIN_TILE outputs (sum over axis 0
 *    of [N, C], or over the last axis of [N, 4]): a tile of up to TILE outputs along that dim
 *    advances together, folding one reduction row at a time into an array of accumulators,
 *    which vectorises across outputs instead of striding once per output. Rows are taken four
 *    at a time, so a wide matrix is read four pages at once.
 *
 * Anything else (a few outputs over strided runs) is row mode over strided runs.
 *
 * f32 sums add into 32 f32 lanes over blocks of BLOCK elements and each block's total into a
 * double, which keeps the error near double's for any practical length at f32 lane speed; in
 * column mode each output's sum is a double. Integer sums and products wrap in 64 bits (through
 * uint64, so the wrap is defined). The extremes propagate NaN; the arg reductions take the first
 * extreme, a NaN counting as both the maximum and the minimum.
 *
 * Parallelism is over outputs when there are enough; otherwise each output's reduction is cut
 * into chunks whose partial results are combined in chunk order. Every decision depends only on
 * the shapes, never on the thread count, so results are the same bit for bit on any number of
 * threads. Scratch lives on the stack (at most about 48 KiB), never the heap: kernels must not
 * bypass Ember's allocator. */
#include "prims.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

enum {
  LANES = 32,          /* f32 partial sums per block: two AVX-512 or four AVX2 registers */
  BLOCK = 4096,        /* elements per f32 block before its total goes into a double */
  ARG_LANES = 16,      /* running (extreme, index) pairs of a contiguous arg reduction */
  TILE = 1024,         /* outputs a column-mode unit advances together: 4 KiB of f32 per row,
                        * a whole page, which the hardware prefetchers stream far better */
  MIN_TILE = 8,        /* fewest outputs along a dim worth running column mode over */
  SHORT_RUN = 16,      /* contiguous reduced runs shorter than this go to column mode */
  SPLIT = 1 << 16,     /* least elements per chunk when one output's reduction is split */
  GROUP = 1 << 14,     /* input elements per task of short row-mode reductions */
  MAX_CHUNKS = 256,    /* most chunks one row-mode output is split into */
  MAX_COL_CHUNKS = 64, /* the same in column mode, where each chunk is a whole tile */
  FEW_OUTPUTS = 64,    /* row mode splits reductions only when there are fewer outputs */
  FEW_UNITS = 16,      /* column mode splits only when there are fewer tiles of work */
};

/* The running state of one output: f for floating inputs, i for integer ones (sums and
 * products, or the extreme so far); idx is the arg index, or for AMAX/AMIN 0 once an element was
 * seen and -1 before, so the partial state of an empty chunk combines correctly. */
typedef struct acc {
  union {
    double f;
    int64_t i;
  };
  int64_t idx;
} acc;

static acc acc_init(em_prim op, bool flt) {
  acc a = {.idx = -1};
  if (flt) a.f = op == EM_PRIM_PROD;
  else a.i = op == EM_PRIM_PROD;
  return a;
}

/* Folds b, the state of elements that come after a's, into a. Ties keep a's index, and a NaN
 * beats everything, the earliest NaN first: torch's argmax rules, and amax's NaN propagation. */
static void combine(em_prim op, bool flt, acc *a, const acc *b) {
  if (op == EM_PRIM_SUM) {
    if (flt) a->f += b->f;
    else a->i = (int64_t)((uint64_t)a->i + (uint64_t)b->i);
    return;
  }
  if (op == EM_PRIM_PROD) {
    if (flt) a->f *= b->f;
    else a->i = (int64_t)((uint64_t)a->i * (uint64_t)b->i);
    return;
  }
  if (b->idx < 0) return;
  if (a->idx < 0) {
    *a = *b;
    return;
  }
  bool mx = op == EM_PRIM_AMAX || op == EM_PRIM_ARGMAX, better;
  if (flt) {
    if (a->f != a->f) return;
    better = b->f != b->f || (mx ? b->f > a->f : b->f < a->f);
  } else {
    better = mx ? b->i > a->i : b->i < a->i;
  }
  if (better) *a = *b;
}

/* combine over n adjacent outputs, with the sums' loops free of the per-element dispatch. */
static void combine_n(em_prim op, bool flt, acc *a, const acc *b, int64_t n) {
  if (op == EM_PRIM_SUM && flt) {
    for (int64_t t = 0; t < n; t++) a[t].f += b[t].f;
  } else if (op == EM_PRIM_SUM) {
    for (int64_t t = 0; t < n; t++) a[t].i = (int64_t)((uint64_t)a[t].i + (uint64_t)b[t].i);
  } else {
    for (int64_t t = 0; t < n; t++) combine(op, flt, &a[t], &b[t]);
  }
}

/* ---- element updates shared by the kernels -------------------------------------------- */

/* Extreme updates: a NaN, once in m, stays, since neither x > NaN nor x < NaN holds. */
#define MAX_UPD(M, X) ((X) > (M) || (X) != (X) ? (X) : (M))
#define MIN_UPD(M, X) ((X) < (M) || (X) != (X) ? (X) : (M))
/* Arg update of the running (V, VI) by element X at index J: take X unless it is no better
 * (X NOT_BETTER V), and never replace a NaN, so a NaN wins and the first NaN stays. NOT_BETTER
 * is <= for argmax and >= for argmin; a NaN X fails it, so it is taken. */
#define ARG_UPD(V, VI, X, J, NOT_BETTER)                                                 \
  do {                                                                                   \
    bool take = !((X)NOT_BETTER(V)) && (V) == (V);                                       \
    V = take ? (X) : (V);                                                                \
    VI = take ? (J) : (VI);                                                              \
  } while (0)

/* ---- row kernels: one run of n elements, byte stride s, flat reduction index j0 ---------- */

/* Adds the LANES partial sums in double as a fixed tree: short dependency chains, and
 * straight-line code the compiler keeps in registers. */
_Static_assert(LANES == 32, "lanes_total adds exactly 32 lanes, sum_f32 holds them as 4 x 8");
typedef float f32x8 __attribute__((vector_size(32)));
typedef double f64x4 __attribute__((vector_size(32)));
static double lanes_total(const float *lane) {
  double d[8];
  for (int k = 0; k < 8; k++)
    d[k] = ((double)lane[k] + lane[k + 8]) + ((double)lane[k + 16] + lane[k + 24]);
  return ((d[0] + d[4]) + (d[1] + d[5])) + ((d[2] + d[6]) + (d[3] + d[7]));
}

/* Short f32 runs and block tails: four double chains, no lane setup. */
static double sum_short_f32(const float *x, int64_t n) {
  double t[4] = {0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; k++) t[k] += x[i + k];
  for (; i < n; i++) t[0] += x[i];
  return (t[0] + t[1]) + (t[2] + t[3]);
}

static double sum_f32(const char *p, int64_t s, int64_t n) {
  if (s != sizeof(float)) {
    double t[4] = {0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; k++) t[k] += *(const float *)(p + (i + k) * s);
    for (; i < n; i++) t[0] += *(const float *)(p + i * s);
    return (t[0] + t[1]) + (t[2] + t[3]);
  }
  const float *x = (const float *)p;
  if (n < 2 * LANES) return sum_short_f32(x, n);
  double total = 0;
  for (int64_t b = 0; b < n; b += BLOCK) {
    int64_t e = n - b < BLOCK ? n : b + BLOCK, i = b;
    /* lane k adds elements k, k + LANES, ... of the block: four vectors of 8 held in registers
     * (the same sums as a float[LANES] array, which GCC kept in memory, so each add waited for
     * the previous one's store: 80 GB/s where the loads reach 170 from L3) */
    f32x8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, v0, v1, v2, v3;
    for (; i + LANES <= e; i += LANES) {
      memcpy(&v0, x + i, sizeof v0), memcpy(&v1, x + i + 8, sizeof v1);
      memcpy(&v2, x + i + 16, sizeof v2), memcpy(&v3, x + i + 24, sizeof v3);
      a0 += v0, a1 += v1, a2 += v2, a3 += v3;
    }
    float lane[LANES];
    memcpy(lane, &a0, sizeof a0), memcpy(lane + 8, &a1, sizeof a1);
    memcpy(lane + 16, &a2, sizeof a2), memcpy(lane + 24, &a3, sizeof a3);
    total += lanes_total(lane) + sum_short_f32(x + i, e - i);
  }
  return total;
}

static double sum_f64(const char *p, int64_t s, int64_t n) {
  double t[4] = {0};
  int64_t i = 0;
  if (s == sizeof(double) && n >= 32) {
    const double *x = (const double *)p;
    /* lane k adds elements k, k + 16, ...: four vectors of 4 in registers (see sum_f32) */
    f64x4 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, v0, v1, v2, v3;
    for (; i + 16 <= n; i += 16) {
      memcpy(&v0, x + i, sizeof v0), memcpy(&v1, x + i + 4, sizeof v1);
      memcpy(&v2, x + i + 8, sizeof v2), memcpy(&v3, x + i + 12, sizeof v3);
      a0 += v0, a1 += v1, a2 += v2, a3 += v3;
    }
    for (int k = 0; k < 4; k++) t[k] = (a0[k] + a1[k]) + (a2[k] + a3[k]);
  }
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; k++) t[k] += *(const double *)(p + (i + k) * s);
  for (; i < n; i++) t[0] += *(const double *)(p + i * s);
  return (t[0] + t[1]) + (t[2] + t[3]);
}

/* The block loops of the contiguous float extremes and arg extremes, in vector registers: lane k
 * takes elements k, k + ARG_LANES, ... of the run. Each fills the lanes (lv; li the indices) up
 * to the returned position, and the row kernel does the tail and the lane merge. The updates
 * ("take x if it is NaN or strictly beyond m"; the arg one keeps its first NaN) are associative
 * on a lane's sequence (the result is its last NaN, or first NaN, else its first extreme), so
 * four blocks are folded together before they meet the running lanes: one dependent update per
 * four blocks, with the same bits as one block at a time. The generic loop below holds the lanes
 * in arrays whose stores each update waits on: amax over 16 MiB took 0.32-0.34 ms there,
 * against the sum's 0.09 (0.11 here; argmax by rows 0.44 -> 0.32; Zen 5, AVX-512). */
#define EXTREME_LANES(SUF, T, IT)                                                           \
  typedef T SUF##_lanes __attribute__((vector_size(sizeof(T) * ARG_LANES)));               \
  typedef IT SUF##_mask __attribute__((vector_size(sizeof(T) * ARG_LANES)));               \
  static inline SUF##_lanes SUF##_pick(SUF##_mask t, SUF##_lanes x, SUF##_lanes m) {       \
    return (SUF##_lanes)(((SUF##_mask)x & t) | ((SUF##_mask)m & ~t));                       \
  }                                                                                        \
  static inline SUF##_lanes SUF##_upd(SUF##_lanes m, SUF##_lanes x, bool mx) {             \
    return SUF##_pick((mx ? x > m : x < m) | (x != x), x, m);                              \
  }                                                                                        \
  static inline int64_t ext_##SUF(const char *p, int64_t n, bool mx, T *lv) {             \
    const T *x = (const T *)p;                                                             \
    SUF##_lanes m, v0, v1, v2, v3;                                                         \
    memcpy(&m, x, sizeof m);                                                               \
    int64_t i = ARG_LANES;                                                                 \
    for (; i + 4 * ARG_LANES <= n; i += 4 * ARG_LANES) {                                   \
      memcpy(&v0, x + i, sizeof v0), memcpy(&v1, x + i + ARG_LANES, sizeof v1);            \
      memcpy(&v2, x + i + 2 * ARG_LANES, sizeof v2), memcpy(&v3, x + i + 3 * ARG_LANES, sizeof v3); \
      m = SUF##_upd(m, SUF##_upd(SUF##_upd(v0, v1, mx), SUF##_upd(v2, v3, mx), mx), mx);   \
    }                                                                                      \
    for (; i + ARG_LANES <= n; i += ARG_LANES) {                                           \
      memcpy(&v0, x + i, sizeof v0);                                                       \
      m = SUF##_upd(m, v0, mx);                                                            \
    }                                                                                      \
    memcpy(lv, &m, sizeof m);                                                              \
    return i;                                                                              \
  }                                                                                        \
  /* (m, mi) takes (x, xi) where x is beyond m, or NaN while m is not */                   \
  static inline void SUF##_arg_upd(SUF##_lanes *m, i64_lanes *mi, SUF##_lanes x, i64_lanes xi, bool mx) { \
    SUF##_mask t = ((mx ? x > *m : x < *m) | (x != x)) & (*m == *m);                       \
    *m = SUF##_pick(t, x, *m);                                                             \
    i64_lanes t64 = __builtin_convertvector(t, i64_lanes);                                 \
    *mi = (xi & t64) | (*mi & ~t64);                                                       \
  }                                                                                        \
  static inline int64_t arg_ext_##SUF(const char *p, int64_t n, bool mx, T *lv, int64_t *li) { \
    const T *x = (const T *)p;                                                             \
    SUF##_lanes m, v0, v1, v2, v3;                                                         \
    i64_lanes mi, i0, i1, i2, i3, lane;                                                    \
    for (int k = 0; k < ARG_LANES; k++) lane[k] = k;                                       \
    memcpy(&m, x, sizeof m);                                                               \
    mi = lane;                                                                             \
    int64_t i = ARG_LANES;                                                                 \
    for (; i + 4 * ARG_LANES <= n; i += 4 * ARG_LANES) {                                   \
      memcpy(&v0, x + i, sizeof v0), memcpy(&v1, x + i + ARG_LANES, sizeof v1);            \
      memcpy(&v2, x + i + 2 * ARG_LANES, sizeof v2), memcpy(&v3, x + i + 3 * ARG_LANES, sizeof v3); \
      i0 = lane + i, i1 = i0 + ARG_LANES, i2 = i1 + ARG_LANES, i3 = i2 + ARG_LANES;         \
      SUF##_arg_upd(&v0, &i0, v1, i1, mx);                                                 \
      SUF##_arg_upd(&v2, &i2, v3, i3, mx);                                                 \
      SUF##_arg_upd(&v0, &i0, v2, i2, mx);                                                 \
      SUF##_arg_upd(&m, &mi, v0, i0, mx);                                                  \
    }                                                                                      \
    for (; i + ARG_LANES <= n; i += ARG_LANES) {                                           \
      memcpy(&v0, x + i, sizeof v0);                                                       \
      SUF##_arg_upd(&m, &mi, v0, lane + i, mx);                                            \
    }                                                                                      \
    memcpy(lv, &m, sizeof m), memcpy(li, &mi, sizeof mi);                                   \
    return i;                                                                              \
  }
/* The other dtypes, and builds without AVX-512: the generic loops (0: nothing done). 16 lanes
 * are one AVX-512 register; GCC splits such vectors for AVX2 badly (amax over 16 MiB 2.3 ms,
 * the generic loop 0.2), so an AVX2 build keeps the generic loops. */
#define ext_none(p, n, mx, lv) 0
#define arg_ext_none(p, n, mx, lv, li) 0
#if defined(__AVX512F__)
typedef int64_t i64_lanes __attribute__((vector_size(sizeof(int64_t) * ARG_LANES)));
EXTREME_LANES(f32, float, int32_t)
EXTREME_LANES(f64, double, int64_t)
#else
#define ext_f32 ext_none
#define ext_f64 ext_none
#define arg_ext_f32 arg_ext_none
#define arg_ext_f64 arg_ext_none
#endif

#define ISUM(SUF, T)                                                 \
  static uint64_t isum_##SUF(const char *p, int64_t s, int64_t n) {  \
    uint64_t t = 0;                                                  \
    if (s == sizeof(T)) {                                            \
      const T *x = (const T *)p;                                     \
      _Pragma("omp simd reduction(+ : t)")                           \
      for (int64_t i = 0; i < n; i++) t += (uint64_t)x[i];           \
    } else {                                                         \
      for (int64_t i = 0; i < n; i++) t += (uint64_t)*(const T *)(p + i * s); \
    }                                                                \
    return t;                                                        \
  }
ISUM(i32, int32_t)
ISUM(i64, int64_t)
ISUM(u8, uint8_t)

/* One row kernel per dtype. T: element type; F: the acc field (f or i); A: the type products
 * accumulate in (double, or uint64 for wrapping integers); SUMFN: the run's sum; EXT, AEXT: the
 * vector block loops of the extremes and arg extremes (ext_f32 ...), or ext_none. For integer T
 * the NaN tests (v != v) are constant false and compile away. */
#define ROW_KERNEL(SUF, T, F, A, SUMFN, EXT, AEXT)                                         \
  static void row_##SUF(em_prim op, const char *p, int64_t s, int64_t n, int64_t j0, acc *a) { \
    bool flt = (T)0.5 != 0;                                                                \
    switch (op) {                                                                          \
    case EM_PRIM_SUM: a->F = (A)a->F + (A)SUMFN(p, s, n); return;                          \
    case EM_PRIM_PROD: {                                                                   \
      A m = (A)a->F;                                                                       \
      for (int64_t i = 0; i < n; i++) m *= (A)*(const T *)(p + i * s);                   \
      a->F = m;                                                                            \
      return;                                                                              \
    }                                                                                      \
    case EM_PRIM_AMAX:                                                                     \
    case EM_PRIM_AMIN: {                                                                   \
      bool mx = op == EM_PRIM_AMAX;                                                        \
      T m = *(const T *)p;                                                                 \
      if (s == sizeof(T) && n >= 2 * ARG_LANES) {                                          \
        /* Independent lanes rather than a reduction clause: the NaN-keeping update is not \
         * an associative max the compilers would vectorise as a reduction. */             \
        const T *x = (const T *)p;                                                         \
        T lv[ARG_LANES];                                                                   \
        int64_t i = EXT(p, n, mx, lv); /* the float dtypes' vector loops, else 0 */        \
        if (!i) {                                                                          \
          for (int k = 0; k < ARG_LANES; k++) lv[k] = x[k];                                \
          for (i = ARG_LANES; i + ARG_LANES <= n; i += ARG_LANES) {                        \
            if (mx) {                                                                      \
              _Pragma("omp simd")                                                          \
              for (int k = 0; k < ARG_LANES; k++) lv[k] = MAX_UPD(lv[k], x[i + k]);        \
            } else {                                                                       \
              _Pragma("omp simd")                                                          \
              for (int k = 0; k < ARG_LANES; k++) lv[k] = MIN_UPD(lv[k], x[i + k]);        \
            }                                                                              \
          }                                                                                \
        }                                                                                  \
        for (int k = 0; i < n; i++, k++) lv[k] = mx ? MAX_UPD(lv[k], x[i]) : MIN_UPD(lv[k], x[i]); \
        m = lv[0];                                                                         \
        for (int k = 1; k < ARG_LANES; k++) m = mx ? MAX_UPD(m, lv[k]) : MIN_UPD(m, lv[k]); \
      } else {                                                                             \
        for (int64_t i = 1; i < n; i++) {                                                  \
          T v = *(const T *)(p + i * s);                                                   \
          m = mx ? MAX_UPD(m, v) : MIN_UPD(m, v);                                          \
        }                                                                                  \
      }                                                                                    \
      acc r = {.idx = 0};                                                                  \
      r.F = m;                                                                             \
      combine(op, flt, a, &r);                                                             \
      return;                                                                              \
    }                                                                                      \
    case EM_PRIM_ARGMAX:                                                                   \
    case EM_PRIM_ARGMIN: {                                                                 \
      bool mx = op == EM_PRIM_ARGMAX;                                                      \
      T m = *(const T *)p;                                                                 \
      int64_t mi = 0;                                                                      \
      if (s == sizeof(T) && n >= 2 * ARG_LANES) {                                          \
        /* Lane k keeps the first extreme among elements k, k + ARG_LANES, ...; the lanes  \
         * are then merged preferring the smaller index, which restores "first wins". */   \
        const T *x = (const T *)p;                                                         \
        T lv[ARG_LANES];                                                                   \
        int64_t li[ARG_LANES], i = AEXT(p, n, mx, lv, li); /* as EXT above */             \
        if (!i) {                                                                          \
          for (int k = 0; k < ARG_LANES; k++) lv[k] = x[k], li[k] = k;                     \
          for (i = ARG_LANES; i + ARG_LANES <= n; i += ARG_LANES) {                        \
            if (mx) {                                                                      \
              _Pragma("omp simd")                                                          \
              for (int k = 0; k < ARG_LANES; k++) ARG_UPD(lv[k], li[k], x[i + k], i + k, <=); \
            } else {                                                                       \
              _Pragma("omp simd")                                                          \
              for (int k = 0; k < ARG_LANES; k++) ARG_UPD(lv[k], li[k], x[i + k], i + k, >=); \
            }                                                                              \
          }                                                                                \
        }                                                                                  \
        for (int k = 0; i < n; i++, k++) {                                                 \
          if (mx) ARG_UPD(lv[k], li[k], x[i], i, <=);                                      \
          else ARG_UPD(lv[k], li[k], x[i], i, >=);                                         \
        }                                                                                  \
        m = lv[0], mi = li[0];                                                             \
        for (int k = 1; k < ARG_LANES; k++) {                                              \
          T v = lv[k];                                                                     \
          bool take = m != m ? v != v && li[k] < mi                                        \
                             : v != v || (mx ? v > m : v < m) || (v == m && li[k] < mi);   \
          if (take) m = v, mi = li[k];                                                     \
        }                                                                                  \
      } else {                                                                             \
        for (int64_t i = 1; i < n && m == m; i++) {                                        \
          T v = *(const T *)(p + i * s);                                                   \
          if (v != v || (mx ? v > m : v < m)) m = v, mi = i;                               \
        }                                                                                  \
      }                                                                                    \
      acc r = {.idx = j0 + mi};                                                            \
      r.F = m;                                                                             \
      combine(op, flt, a, &r);                                                             \
      return;                                                                              \
    }                                                                                      \
    default: return;                                                                       \
    }                                                                                      \
  }
ROW_KERNEL(f32, float, f, double, sum_f32, ext_f32, arg_ext_f32)
ROW_KERNEL(f64, double, f, double, sum_f64, ext_f64, arg_ext_f64)
ROW_KERNEL(i32, int32_t, i, uint64_t, isum_i32, ext_none, arg_ext_none)
ROW_KERNEL(i64, int64_t, i, uint64_t, isum_i64, ext_none, arg_ext_none)
ROW_KERNEL(u8, uint8_t, i, uint64_t, isum_u8, ext_none, arg_ext_none)

/* ---- the plan --------------------------------------------------------------------------- */

/* Dims with sizes, input byte strides and (kept dims only) output byte strides. */
typedef struct dims {
  int n;
  int64_t size[EM_MAX_DIMS];
  int64_t in[EM_MAX_DIMS];
  int64_t out[EM_MAX_DIMS];
} dims;

struct plan;
typedef void (*row_fn)(em_prim op, const char *p, int64_t s, int64_t n, int64_t j0, acc *a);
typedef void (*col_fn)(const struct plan *pl, const char *p, int64_t vs, int64_t w, int64_t j0,
                       int64_t j1, acc *st);

typedef struct plan {
  em_prim op;
  bool flt;     /* the input dtype is floating */
  em_dtype odt; /* output dtype */
  const char *in;
  char *out;
  dims k, r;    /* kept dims (output order) and reduced dims */
  int64_t nout, nred;
  row_fn row;
  col_fn col;
} plan;

/* Merges dim x-1 into x wherever both strides step over x-1 as one block of x. Order is kept, so
 * a flat index over the merged dims is the same row-major index as before. */
static void coalesce(dims *d) {
  int n = 0;
  for (int x = 0; x < d->n; x++) {
    if (n > 0 && d->in[n - 1] == d->in[x] * d->size[x] && d->out[n - 1] == d->out[x] * d->size[x]) {
      d->size[n - 1] *= d->size[x];
      d->in[n - 1] = d->in[x];
      d->out[n - 1] = d->out[x];
      continue;
    }
    d->size[n] = d->size[x], d->in[n] = d->in[x], d->out[n] = d->out[x];
    n++;
  }
  d->n = n;
  if (n == 0) d->n = 1, d->size[0] = 1, d->in[0] = 0, d->out[0] = 0;
}

static int64_t numel(const dims *d) {
  int64_t n = 1;
  for (int x = 0; x < d->n; x++) n *= d->size[x];
  return n;
}

/* Input and output byte offsets of flat index j over d, and its multi-index. */
static void seek(const dims *d, int64_t j, int64_t *idx, int64_t *in_off, int64_t *out_off) {
  int64_t a = 0, b = 0;
  for (int x = d->n - 1; x >= 0; x--) {
    idx[x] = j % d->size[x];
    j /= d->size[x];
    a += idx[x] * d->in[x];
    b += idx[x] * d->out[x];
  }
  *in_off = a;
  *out_off = b;
}

/* Advances a multi-index over d by one element; returns the new input offset. */
static inline int64_t step(const dims *d, int64_t *idx, int64_t off) {
  for (int x = d->n - 1; x >= 0; x--) {
    off += d->in[x];
    if (++idx[x] < d->size[x]) return off;
    off -= idx[x] * d->in[x];
    idx[x] = 0;
  }
  return off;
}

/* The same advancing both offsets. */
static inline void step2(const dims *d, int64_t *idx, int64_t *in_off, int64_t *out_off) {
  for (int x = d->n - 1; x >= 0; x--) {
    *in_off += d->in[x];
    *out_off += d->out[x];
    if (++idx[x] < d->size[x]) return;
    *in_off -= idx[x] * d->in[x];
    *out_off -= idx[x] * d->out[x];
    idx[x] = 0;
  }
}

/* Sort key of a dim's stride: larger is further out in memory (stride 0 reads one element, so
 * it counts as outermost). */
static uint64_t mem_order_key(int64_t stride) {
  if (stride == 0) return UINT64_MAX;
  return stride < 0 ? -(uint64_t)stride : (uint64_t)stride;
}

static void build(plan *pl, const prim_attrs *at, const prim_buf *out, const prim_buf *in) {
  bool red[EM_MAX_DIMS] = {0};
  for (int d = 0; d < in->ndim; d++) red[d] = at->n_axes == 0;
  for (int i = 0; i < at->n_axes; i++) {
    int a = ir_norm_axis(at->axes[i], in->ndim);
    if (a >= 0) red[a] = true; /* a 0-dim input's axis 0 / -1 reduces nothing */
  }
  int64_t esz = (int64_t)ir_dtype(in->dtype)->size, osz = (int64_t)ir_dtype(out->dtype)->size;
  dims *k = &pl->k, *r = &pl->r;
  k->n = r->n = 0;
  for (int d = 0; d < in->ndim; d++) {
    dims *t = red[d] ? r : k;
    t->size[t->n] = in->sizes[d];
    t->in[t->n] = in->strides[d] * esz;
    t->out[t->n++] = 0;
  }
  /* The output is contiguous over the kept sizes (keepdim's extra 1s change no stride). */
  for (int x = k->n - 1; x >= 0; x--) {
    k->out[x] = osz;
    osz *= k->size[x];
  }
  /* Drop size-1 dims; they neither move a pointer nor change a row-major index. */
  for (int pass = 0; pass < 2; pass++) {
    dims *t = pass ? r : k;
    int n = 0;
    for (int x = 0; x < t->n; x++)
      if (t->size[x] != 1) t->size[n] = t->size[x], t->in[n] = t->in[x], t->out[n++] = t->out[x];
    t->n = n;
  }
  /* Order-free reductions walk the reduced dims in memory order (largest stride outermost,
   * expanded stride-0 dims outside all), so a transposed, permuted or broadcast input still
   * reduces in long contiguous runs. The arg reductions keep the logical order, since their
   * result is a row-major index. */
  bool arg = pl->op == EM_PRIM_ARGMAX || pl->op == EM_PRIM_ARGMIN;
  for (int x = 1; x < r->n && !arg; x++) {
    for (int y = x; y > 0; y--) {
      if (mem_order_key(r->in[y - 1]) >= mem_order_key(r->in[y])) break;
      int64_t ts = r->size[y], ti = r->in[y];
      r->size[y] = r->size[y - 1], r->in[y] = r->in[y - 1];
      r->size[y - 1] = ts, r->in[y - 1] = ti;
    }
  }
  coalesce(k);
  coalesce(r);
  pl->nout = numel(k);
  pl->nred = numel(r);
}

/* Writes a finished state as the output dtype. */
static void finish(const plan *pl, char *o, const acc *a) {
  if (pl->op == EM_PRIM_ARGMAX || pl->op == EM_PRIM_ARGMIN) {
    memcpy(o, &a->idx, sizeof a->idx);
    return;
  }
  switch (pl->odt) {
  case EM_F32: { float v = (float)a->f; memcpy(o, &v, sizeof v); break; }
  case EM_F64: memcpy(o, &a->f, sizeof a->f); break;
  case EM_I64: memcpy(o, &a->i, sizeof a->i); break;
  case EM_I32: { int32_t v = (int32_t)a->i; memcpy(o, &v, sizeof v); break; }
  default: *(uint8_t *)o = (uint8_t)a->i; break; /* u8, bool */
  }
}

/* ---- row mode --------------------------------------------------------------------------- */

/* Reduces flat reduction indices [j0, j1) of the output whose input starts at base into a, in
 * runs along the innermost reduced dim. */
static void row_range(const plan *pl, const char *base, int64_t j0, int64_t j1, acc *a) {
  const dims *r = &pl->r;
  int nd = r->n;
  int64_t inner = r->size[nd - 1], s = r->in[nd - 1];
  if (nd == 1) {
    pl->row(pl->op, base + j0 * s, s, j1 - j0, j0, a);
    return;
  }
  int64_t idx[EM_MAX_DIMS], off = 0, rest = j0 / inner, col = j0 % inner;
  for (int x = nd - 2; x >= 0; x--) {
    idx[x] = rest % r->size[x];
    rest /= r->size[x];
    off += idx[x] * r->in[x];
  }
  for (int64_t pos = j0; pos < j1;) {
    int64_t n = inner - col < j1 - pos ? inner - col : j1 - pos;
    pl->row(pl->op, base + off + col * s, s, n, pos, a);
    pos += n;
    col = 0;
    for (int x = nd - 2; x >= 0; x--) {
      off += r->in[x];
      if (++idx[x] < r->size[x]) break;
      off -= idx[x] * r->in[x];
      idx[x] = 0;
    }
  }
}

/* Row mode's tasks. Unsplit: group g of outputs, each reduced whole. Split: chunk c of one
 * output's reduction into part[c], folded into the total in chunk order after the loop, which
 * keeps the result that of a serial run. */
typedef struct {
  const plan *pl;
  int64_t group, len, nch, ioff;
  acc *part;
} rows_job;

static void rows_group(void *ctx, int64_t g0, int64_t g1) {
  const rows_job *j = ctx;
  const plan *pl = j->pl;
  for (int64_t g = g0; g < g1; g++) {
    int64_t idx[EM_MAX_DIMS], ioff, ooff, o1 = (g + 1) * j->group < pl->nout ? (g + 1) * j->group : pl->nout;
    seek(&pl->k, g * j->group, idx, &ioff, &ooff);
    for (int64_t o = g * j->group; o < o1; o++) {
      acc a = acc_init(pl->op, pl->flt);
      row_range(pl, pl->in + ioff, 0, pl->nred, &a);
      finish(pl, pl->out + ooff, &a);
      step2(&pl->k, idx, &ioff, &ooff);
    }
  }
}

static void rows_chunk(void *ctx, int64_t c) {
  const rows_job *j = ctx;
  const plan *pl = j->pl;
  j->part[c] = acc_init(pl->op, pl->flt);
  row_range(pl, pl->in + j->ioff, c * j->len, c + 1 == j->nch ? pl->nred : (c + 1) * j->len, &j->part[c]);
}

static void run_rows(const plan *pl) {
  int64_t nout = pl->nout, nred = pl->nred;
  int64_t nch = nout < FEW_OUTPUTS ? nred / SPLIT : 1;
  if (nch > MAX_CHUNKS) nch = MAX_CHUNKS;
  rows_job j = {.pl = pl};
  if (nch < 2) {
    /* Outputs go in groups of about GROUP input elements, each group seeking its first
     * output once and stepping from there, so short reductions pay no divisions. */
    j.group = nred >= GROUP ? 1 : GROUP / nred;
    int64_t ngroups = (nout + j.group - 1) / j.group;
    prim_parallel_for(ngroups > 1 && nred >= 2 * PRIM_PARALLEL_GRAIN / nout, ngroups, rows_group, &j);
    return;
  }
  /* Chunks are whole f32 blocks, so chunking never changes how a block is summed. */
  j.len = ((nred + nch - 1) / nch + BLOCK - 1) / BLOCK * BLOCK;
  j.nch = (nred + j.len - 1) / j.len;
  acc part[MAX_CHUNKS];
  j.part = part;
  for (int64_t o = 0; o < nout; o++) {
    int64_t idx[EM_MAX_DIMS], ooff;
    seek(&pl->k, o, idx, &j.ioff, &ooff);
    acc total = acc_init(pl->op, pl->flt);
    prim_parallel(j.nch, rows_chunk, &j);
    for (int64_t c = 0; c < j.nch; c++) combine(pl->op, pl->flt, &total, &part[c]);
    finish(pl, pl->out + ooff, &total);
  }
}

/* ---- column mode ------------------------------------------------------------------------ */

/* The loop over a tile's w outputs for one reduction row at p + off, BODY seeing output t's
 * element as x: once for contiguous outputs (which vectorises), once for outputs vs bytes
 * apart. */
#define OVER_TILE(T, BODY)                                        \
  if (vs == sizeof(T)) {                                          \
    const T *row = (const T *)(p + off);                          \
    _Pragma("omp simd")                                           \
    for (int64_t t = 0; t < w; t++) {                             \
      T x = row[t];                                               \
      BODY;                                                       \
    }                                                             \
  } else {                                                        \
    for (int64_t t = 0; t < w; t++) {                             \
      T x = *(const T *)(p + off + t * vs);                       \
      BODY;                                                       \
    }                                                             \
  }

/* The same over four rows at p + o[0..3], seen as x0..x3. Reading four rows (four pages of a
 * wide matrix) at once keeps more misses in flight than walking one row at a time, which
 * doubles column-mode bandwidth once rows are wider than a tile. */
#define OVER_TILE4(T, BODY)                                                              \
  if (vs == sizeof(T)) {                                                                 \
    const T *r0 = (const T *)(p + o[0]), *r1 = (const T *)(p + o[1]);                    \
    const T *r2 = (const T *)(p + o[2]), *r3 = (const T *)(p + o[3]);                    \
    _Pragma("omp simd")                                                                  \
    for (int64_t t = 0; t < w; t++) {                                                    \
      T x0 = r0[t], x1 = r1[t], x2 = r2[t], x3 = r3[t];                                  \
      BODY;                                                                              \
    }                                                                                    \
  } else {                                                                               \
    for (int64_t t = 0; t < w; t++) {                                                    \
      T x0 = *(const T *)(p + o[0] + t * vs), x1 = *(const T *)(p + o[1] + t * vs);      \
      T x2 = *(const T *)(p + o[2] + t * vs), x3 = *(const T *)(p + o[3] + t * vs);      \
      BODY;                                                                              \
    }                                                                                    \
  }

/* Runs reduction rows [j, j1) through BODY4 four at a time (j, j+1, j+2, j+3 in order), then
 * the rest through BODY1; off and idx track the current row. */
#define OVER_ROWS(T, BODY1, BODY4)                                                       \
  for (; j + 4 <= j1; j += 4) {                                                          \
    int64_t o[4];                                                                        \
    for (int q = 0; q < 4; q++) o[q] = off, off = step(r, idx, off);                     \
    OVER_TILE4(T, BODY4)                                                                 \
  }                                                                                      \
  for (; j < j1; j++, off = step(r, idx, off)) {                                         \
    OVER_TILE(T, BODY1)                                                                  \
  }

#define ARG_ROWS(T, NB)                                                                  \
  OVER_ROWS(T, ARG_UPD(m[t], mi[t], x, j, NB), T v = m[t]; int64_t vi = mi[t];           \
            ARG_UPD(v, vi, x0, j, NB); ARG_UPD(v, vi, x1, j + 1, NB);                    \
            ARG_UPD(v, vi, x2, j + 2, NB); ARG_UPD(v, vi, x3, j + 3, NB); m[t] = v; mi[t] = vi)

/* Reduces reduction rows [j0, j1) of w outputs whose inputs, in a row, are vs bytes apart from
 * p (row j's at p + its offset), into st[0..w). T, F, A as for ROW_KERNEL. Sums accumulate in A
 * (double for floats): a row adds one value per output, so f32 lanes would gain nothing. */
#define COL_KERNEL(SUF, T, F, A)                                                           \
  static void col_##SUF(const plan *pl, const char *p, int64_t vs, int64_t w, int64_t j0,  \
                        int64_t j1, acc *st) {                                             \
    em_prim op = pl->op;                                                                   \
    const dims *r = &pl->r;                                                                \
    int64_t idx[EM_MAX_DIMS], off, unused, j = j0;                                         \
    seek(r, j0, idx, &off, &unused);                                                       \
    union {                                                                                \
      A s[TILE];                                                                           \
      struct {                                                                             \
        T m[TILE];                                                                         \
        int64_t mi[TILE];                                                                  \
      } e;                                                                                 \
    } u;                                                                                   \
    A *s = u.s;                                                                            \
    T *m = u.e.m;                                                                          \
    int64_t *mi = u.e.mi;                                                                  \
    bool mx = op == EM_PRIM_AMAX || op == EM_PRIM_ARGMAX;                                  \
    switch (op) {                                                                          \
    case EM_PRIM_SUM:                                                                      \
      for (int64_t t = 0; t < w; t++) s[t] = 0;                                            \
      OVER_ROWS(T, s[t] += (A)x, s[t] += ((A)x0 + (A)x1) + ((A)x2 + (A)x3))                \
      for (int64_t t = 0; t < w; t++) st[t].F = s[t], st[t].idx = 0;                       \
      return;                                                                              \
    case EM_PRIM_PROD:                                                                     \
      for (int64_t t = 0; t < w; t++) s[t] = 1;                                            \
      for (; j < j1; j++, off = step(r, idx, off)) {                                       \
        OVER_TILE(T, s[t] *= (A)x)                                                         \
      }                                                                                    \
      for (int64_t t = 0; t < w; t++) st[t].F = s[t], st[t].idx = 0;                       \
      return;                                                                              \
    case EM_PRIM_AMAX:                                                                     \
    case EM_PRIM_AMIN:                                                                     \
      OVER_TILE(T, m[t] = x)                                                               \
      off = step(r, idx, off), j++;                                                        \
      if (mx) {                                                                            \
        OVER_ROWS(T, m[t] = MAX_UPD(m[t], x), T v = m[t]; v = MAX_UPD(v, x0);              \
                  v = MAX_UPD(v, x1); v = MAX_UPD(v, x2); m[t] = MAX_UPD(v, x3))           \
      } else {                                                                             \
        OVER_ROWS(T, m[t] = MIN_UPD(m[t], x), T v = m[t]; v = MIN_UPD(v, x0);              \
                  v = MIN_UPD(v, x1); v = MIN_UPD(v, x2); m[t] = MIN_UPD(v, x3))           \
      }                                                                                    \
      for (int64_t t = 0; t < w; t++) st[t].F = m[t], st[t].idx = 0;                       \
      return;                                                                              \
    case EM_PRIM_ARGMAX:                                                                   \
    case EM_PRIM_ARGMIN:                                                                   \
      OVER_TILE(T, (m[t] = x, mi[t] = j0))                                                 \
      off = step(r, idx, off), j++;                                                        \
      if (mx) {                                                                            \
        ARG_ROWS(T, <=)                                                                    \
      } else {                                                                             \
        ARG_ROWS(T, >=)                                                                    \
      }                                                                                    \
      for (int64_t t = 0; t < w; t++) st[t].F = m[t], st[t].idx = mi[t];                   \
      return;                                                                              \
    default: return;                                                                       \
    }                                                                                      \
  }
COL_KERNEL(f32, float, f, double)
COL_KERNEL(f64, double, f, double)
COL_KERNEL(i32, int32_t, i, uint64_t)
COL_KERNEL(i64, int64_t, i, uint64_t)
COL_KERNEL(u8, uint8_t, i, uint64_t)

/* Column mode over kept dim v: the other kept dims are walked as outer units, each split into
 * tiles of TILE outputs along v. */
typedef struct {
  const plan *pl;
  const dims *outer;
  int64_t cols, vs, ostep, ntiles, len, nch;
  /* the split mode's one unit: its input, its width, its totals */
  const char *in;
  int64_t w;
  acc *total;
  _Atomic int64_t turn;
} cols_job;

static void cols_units(void *ctx, int64_t u0, int64_t u1) {
  const cols_job *j = ctx;
  const plan *pl = j->pl;
  for (int64_t u = u0; u < u1; u++) {
    int64_t idx[EM_MAX_DIMS], ioff, ooff, t0 = u % j->ntiles * TILE;
    int64_t w = j->cols - t0 < TILE ? j->cols - t0 : TILE;
    seek(j->outer, u / j->ntiles, idx, &ioff, &ooff);
    acc st[TILE];
    pl->col(pl, pl->in + ioff + t0 * j->vs, j->vs, w, 0, pl->nred, st);
    for (int64_t t = 0; t < w; t++) finish(pl, pl->out + ooff + (t0 + t) * j->ostep, &st[t]);
  }
}

static void cols_chunk(void *ctx, int64_t c) {
  cols_job *j = ctx;
  const plan *pl = j->pl;
  acc part[TILE];
  int64_t j1 = c + 1 == j->nch ? pl->nred : (c + 1) * j->len;
  pl->col(pl, j->in, j->vs, j->w, c * j->len, j1, part);
  prim_turn_wait(&j->turn, c);
  combine_n(pl->op, pl->flt, j->total, part, j->w);
  prim_turn_pass(&j->turn, c);
}

/* Column mode over kept dim v: the other kept dims are walked as outer units, each split into
 * tiles of TILE outputs along v. A unit's reduction is split into chunks when there are few
 * units, folded into its totals in chunk order as in row mode. */
static void run_cols(const plan *pl, int v) {
  dims outer = {0};
  for (int x = 0; x < pl->k.n; x++) {
    if (x == v) continue;
    outer.size[outer.n] = pl->k.size[x];
    outer.in[outer.n] = pl->k.in[x];
    outer.out[outer.n++] = pl->k.out[x];
  }
  if (outer.n == 0) outer.n = 1, outer.size[0] = 1;
  cols_job j = {.pl = pl, .outer = &outer, .cols = pl->k.size[v], .vs = pl->k.in[v], .ostep = pl->k.out[v]};
  int64_t nred = pl->nred;
  j.ntiles = (j.cols + TILE - 1) / TILE;
  int64_t units = numel(&outer) * j.ntiles;
  int64_t per_unit = (j.cols < TILE ? j.cols : TILE) * nred;
  int64_t nch = units < FEW_UNITS ? per_unit / SPLIT : 1;
  if (nch > MAX_COL_CHUNKS) nch = MAX_COL_CHUNKS;
  if (nch > nred) nch = nred;
  if (nch < 2) {
    prim_parallel_for(units > 1 && per_unit >= 2 * PRIM_PARALLEL_GRAIN / units, units, cols_units, &j);
    return;
  }
  j.len = (nred + nch - 1) / nch;
  j.nch = (nred + j.len - 1) / j.len;
  for (int64_t u = 0; u < units; u++) {
    int64_t idx[EM_MAX_DIMS], ioff, ooff, t0 = u % j.ntiles * TILE;
    j.w = j.cols - t0 < TILE ? j.cols - t0 : TILE;
    seek(&outer, u / j.ntiles, idx, &ioff, &ooff);
    j.in = pl->in + ioff + t0 * j.vs;
    acc total[TILE];
    for (int64_t t = 0; t < j.w; t++) total[t] = acc_init(pl->op, pl->flt);
    j.total = total;
    atomic_init(&j.turn, 0);
    prim_parallel_ordered(j.nch, cols_chunk, &j);
    for (int64_t t = 0; t < j.w; t++) finish(pl, pl->out + ooff + (t0 + t) * j.ostep, &total[t]);
  }
}

/* ---- entry ------------------------------------------------------------------------------ */

/* Row mode is best when the innermost reduced dim gives long contiguous runs. Otherwise (the
 * reduced dims are strided, or their contiguous runs are short) column mode is, when some kept
 * dim is wide enough to vectorise across: the one with the smallest stride, so a tile's inputs
 * lie close together. Returns that dim, or -1 for row mode. */
static int column_dim(const plan *pl, int64_t esz) {
  const dims *r = &pl->r;
  if (r->in[r->n - 1] == esz && r->size[r->n - 1] >= SHORT_RUN) return -1;
  int v = -1;
  for (int x = 0; x < pl->k.n; x++) {
    uint64_t a = mem_order_key(pl->k.in[x]);
    if (pl->k.size[x] >= MIN_TILE && (v < 0 || a <= mem_order_key(pl->k.in[v]))) v = x;
  }
  return v;
}

bool prim_run_reduce(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in,
                     char *err, size_t cap) {
  static const row_fn rows[EM_DTYPE_COUNT] = {[EM_F32] = row_f32, [EM_F64] = row_f64,
                                              [EM_I32] = row_i32, [EM_I64] = row_i64,
                                              [EM_U8] = row_u8,   [EM_BOOL] = row_u8};
  static const col_fn cols[EM_DTYPE_COUNT] = {[EM_F32] = col_f32, [EM_F64] = col_f64,
                                              [EM_I32] = col_i32, [EM_I64] = col_i64,
                                              [EM_U8] = col_u8,   [EM_BOOL] = col_u8};
  if (!(prim_get(op)->flags & P_REDUCTION)) return snprintf(err, cap, "is not a reduction"), false;
  em_dtype dt = in->dtype;
  if (!rows[dt]) return snprintf(err, cap, "has no CPU kernel for %s", em_dtype_name(dt)), false;
  plan pl = {.op = op, .flt = ir_is_float(dt), .odt = out->dtype, .in = in->data, .out = out->data,
             .row = rows[dt], .col = cols[dt]};
  build(&pl, at, out, in);
  if (pl.nout == 0) return true;
  if (pl.nred == 0) {
    /* Only SUM and PROD get here (the meta function rejects empty extremes): the identity. */
    acc a = acc_init(op, pl.flt);
    size_t osz = ir_dtype(out->dtype)->size;
    for (int64_t o = 0; o < pl.nout; o++) finish(&pl, out->data + (size_t)o * osz, &a);
    return true;
  }
  int v = column_dim(&pl, (int64_t)ir_dtype(dt)->size);
  if (v >= 0) run_cols(&pl, v);
  else run_rows(&pl);
  return true;
}
