/* prims/scan.c: reference kernels of the prims that run along one axis, each element depending
 * on the ones before it: the cumulative sum and product (scans) and the stable argsort.
 *
 * Why prims and not decompositions: a scan written with the other prims is a sum over a
 * triangular mask (quadratic in the axis's length, and its gradient too), and a sort has no
 * decomposition at all; here each line along the axis is one O(n) pass (scans) or one
 * O(n log n) merge sort. Lines are independent and split across threads; within a line the order
 * of operations is fixed, so results do not depend on the thread count.
 *
 * Scans accumulate as PyTorch's CPU kernels do: floats in double (each partial result rounded
 * once to the output dtype), integers and bool in 64 bits (wrapping, done in unsigned arithmetic
 * where wrapping is defined), giving i64. The CUDA kernels (runtime/cuda_kernels.c) use the
 * same accumulators in the same order, so both devices give the same bits.
 *
 * Argsort is a bottom-up merge sort of (key, index) pairs that takes from the right run only
 * when its key comes strictly first, so equal keys keep their order (stable, as
 * torch.sort(stable=True); a stable order is one torch's unstable sort may also give). NaN
 * orders above every number and equal to itself, as in torch.sort: last ascending, first
 * descending. -0.0 and 0.0 are equal. */
#include "prims.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The lines of a buffer along axis a: n elements apart by stride (elements); line l starts at
 * the offset of the l-th index (row-major) over the other dims. */
typedef struct {
  int ndim, axis;
  int64_t n, lines;
} lines_of;

static lines_of lines(const prim_buf *x, int a) {
  lines_of L = {x->ndim, a, x->ndim ? x->sizes[a] : 1, 1};
  for (int d = 0; d < x->ndim; d++)
    if (d != a) L.lines *= x->sizes[d];
  return L;
}

static int64_t line_start(const lines_of *L, const prim_buf *b, int64_t l) {
  int64_t off = 0;
  for (int d = L->ndim - 1; d >= 0; d--) {
    if (d == L->axis) continue;
    off += (l % b->sizes[d]) * b->strides[d];
    l /= b->sizes[d];
  }
  return off;
}

static int64_t axis_stride(const prim_buf *b, int a) { return b->ndim ? b->strides[a] : 1; }

/* ---- scans --------------------------------------------------------------------------------- */

#define SCAN_FLOAT(T)                                                                 \
  do {                                                                                \
    double acc = sum ? 0.0 : 1.0;                                                     \
    for (int64_t i = 0; i < n; i++) {                                                 \
      double v = (double)((const T *)x)[i * xs];                                      \
      acc = sum ? acc + v : acc * v;                                                  \
      ((T *)o)[i * os] = (T)acc;                                                      \
    }                                                                                 \
  } while (0)

#define SCAN_INT(T)                                                                   \
  do {                                                                                \
    uint64_t acc = sum ? 0 : 1;                                                       \
    for (int64_t i = 0; i < n; i++) {                                                 \
      uint64_t v = (uint64_t)(int64_t)((const T *)x)[i * xs];                         \
      acc = sum ? acc + v : acc * v;                                                  \
      ((int64_t *)o)[i * os] = (int64_t)acc;                                          \
    }                                                                                 \
  } while (0)

/* One line: x and o point at its first elements, xs and os are strides in elements. */
static void scan_line(bool sum, em_dtype dt, const char *x, int64_t xs, char *o, int64_t os, int64_t n) {
  switch (dt) {
  case EM_F32: SCAN_FLOAT(float); break;
  case EM_F64: SCAN_FLOAT(double); break;
  case EM_I32: SCAN_INT(int32_t); break;
  case EM_I64: SCAN_INT(int64_t); break;
  case EM_U8:
  case EM_BOOL: SCAN_INT(uint8_t); break;
  default: { /* f16 / bf16 have no CPU arithmetic (the dispatcher casts first); kept exact all the same */
    double acc = sum ? 0.0 : 1.0;
    size_t es = ir_dtype(dt)->size;
    for (int64_t i = 0; i < n; i++) {
      double v = prim_load(x + i * xs * (int64_t)es, dt);
      acc = sum ? acc + v : acc * v;
      prim_store(o + i * os * (int64_t)es, dt, acc);
    }
  }
  }
}

static void scan(bool sum, const prim_attrs *at, const prim_buf *out, const prim_buf *x) {
  int a = ir_norm_axis(at->axes[0], x->ndim ? x->ndim : 1);
  lines_of L = lines(x, a);
  if (L.n == 0 || L.lines == 0) return;
  int64_t xes = (int64_t)ir_dtype(x->dtype)->size, oes = (int64_t)ir_dtype(out->dtype)->size;
  int64_t xs = axis_stride(x, a), os = axis_stride(out, a);
  PRIM_PARALLEL_FOR(L.lines > 1 && L.lines * L.n >= PRIM_PARALLEL_GRAIN, l, L.lines, {
    scan_line(sum, x->dtype, x->data + line_start(&L, x, l) * xes, xs, out->data + line_start(&L, out, l) * oes, os,
              L.n);
  });
}

/* ---- argsort -------------------------------------------------------------------------------- */

/* Whether key a comes strictly before key b (ascending: a < b with NaN largest). */
#define LESS_FLOAT(a, b) (!isnan(a) && (isnan(b) || (a) < (b)))
#define LESS_PLAIN(a, b) ((a) < (b))

/* Sorts one line: keys copied into k (then scratch kt), indices into ix (scratch it); the
 * sorted indices are written to o with stride os. Bottom-up merges of runs of width w. */
#define SORT_LINE(NAME, T, LESS)                                                                       \
  static void NAME(const char *x, int64_t xs, int64_t *o, int64_t os, int64_t n, bool desc, void *scratch) {   \
    T *k = scratch, *kt = k + n;                                                                       \
    int64_t *ix = (int64_t *)(kt + n), *it = ix + n;                                                   \
    for (int64_t i = 0; i < n; i++) k[i] = ((const T *)x)[i * xs], ix[i] = i;                        \
    for (int64_t w = 1; w < n; w *= 2) {                                                               \
      for (int64_t s = 0; s < n; s += 2 * w) {                                                         \
        int64_t i = s, m = s + w < n ? s + w : n, j = m, e = s + 2 * w < n ? s + 2 * w : n, p = s;     \
        while (i < m && j < e) {                                                                       \
          bool right = desc ? LESS(k[i], k[j]) : LESS(k[j], k[i]);                                     \
          if (right) kt[p] = k[j], it[p++] = ix[j++];                                                  \
          else kt[p] = k[i], it[p++] = ix[i++];                                                        \
        }                                                                                              \
        while (i < m) kt[p] = k[i], it[p++] = ix[i++];                                                 \
        while (j < e) kt[p] = k[j], it[p++] = ix[j++];                                                 \
      }                                                                                                \
      T *tk = k; k = kt, kt = tk;                                                                      \
      int64_t *ti = ix; ix = it, it = ti;                                                              \
    }                                                                                                  \
    for (int64_t i = 0; i < n; i++) o[i * os] = ix[i];                                                 \
  }
SORT_LINE(sort_f32, float, LESS_FLOAT)
SORT_LINE(sort_f64, double, LESS_FLOAT)
SORT_LINE(sort_i32, int32_t, LESS_PLAIN)
SORT_LINE(sort_i64, int64_t, LESS_PLAIN)
SORT_LINE(sort_u8, uint8_t, LESS_PLAIN) /* u8 and bool (0 < 1) */

typedef void (*sort_fn)(const char *x, int64_t xs, int64_t *o, int64_t os, int64_t n, bool desc, void *scratch);

static bool argsort(const prim_attrs *at, const prim_buf *out, const prim_buf *x, char *err, size_t cap) {
  int a = ir_norm_axis(at->axes[0], x->ndim ? x->ndim : 1);
  lines_of L = lines(x, a);
  if (L.n == 0 || L.lines == 0) return true;
  sort_fn fn;
  switch (x->dtype) {
  case EM_F32: fn = sort_f32; break;
  case EM_F64: fn = sort_f64; break;
  case EM_I32: fn = sort_i32; break;
  case EM_I64: fn = sort_i64; break;
  case EM_U8:
  case EM_BOOL: fn = sort_u8; break;
  default: return snprintf(err, cap, "has no CPU kernel for %s (cast first)", em_dtype_name(x->dtype)), false;
  }
  int64_t es = (int64_t)ir_dtype(x->dtype)->size, xs = axis_stride(x, a), os = axis_stride(out, a);
  size_t per_line = (size_t)L.n * (2 * (size_t)es + 2 * sizeof(int64_t));
  /* one scratch block per thread, not per line (a line of a vocabulary's length needs about a
   * megabyte; every line at once would need several times the operand). The team is the full
   * one PRIM_PARALLEL_FOR uses (prims.h says why a team of another size is avoided). */
  int nt = omp_get_level() == 0 ? omp_get_max_threads() : 1;
  bool par = nt > 1 && L.lines > 1 && L.lines * L.n >= PRIM_PARALLEL_GRAIN / 8;
  if (!par) nt = 1;
  char *scratch = malloc(per_line * (size_t)nt);
  if (!scratch) return snprintf(err, cap, "out of memory for %zu bytes of sort scratch", per_line * (size_t)nt), false;
  if (par) {
#pragma omp parallel for schedule(static)
    for (int64_t l = 0; l < L.lines; l++)
      fn(x->data + line_start(&L, x, l) * es, xs, (int64_t *)out->data + line_start(&L, out, l), os, L.n, at->descending,
         scratch + per_line * (size_t)omp_get_thread_num());
  } else {
    for (int64_t l = 0; l < L.lines; l++)
      fn(x->data + line_start(&L, x, l) * es, xs, (int64_t *)out->data + line_start(&L, out, l), os, L.n, at->descending,
         scratch);
  }
  free(scratch);
  return true;
}

/* ---- entry -------------------------------------------------------------------------------- */

bool prim_run_scan(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in, char *err, size_t cap) {
  switch (op) {
  case EM_PRIM_CUMSUM:
  case EM_PRIM_CUMPROD:
    scan(op == EM_PRIM_CUMSUM, at, out, &in[0]);
    return true;
  case EM_PRIM_ARGSORT: return argsort(at, out, &in[0], err, cap);
  default: return snprintf(err, cap, "is not a scan prim"), false;
  }
}
