/* prims/movement.c: reference kernels of the copying movement prims (clone, flip, pad, cat)
 * and of the indexing prims (gather, index_select, scatter_add).
 *
 * Everything here is expressed as strided copies on prim_foreach, by restriding buffers rather
 * than by index arithmetic per element: flip is a copy from a buffer with negated strides; pad
 * and cat copy into a sub-view of the output; gather and index_select read the operand through
 * a view whose stride along the indexed axis is 0 and add index * stride in the inner loop. The
 * loops only move bytes, so one loop per element size serves every dtype. */
#include "prims.h"

#include <stdio.h>
#include <string.h>

#define COPY_LOOP(NAME, T)                                                         \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    (void)ctx;                                                                     \
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) {                                  \
      memcpy(p[0], p[1], (size_t)n * sizeof(T));                                   \
      return;                                                                      \
    }                                                                              \
    for (int64_t i = 0; i < n; i++) *(T *)(p[0] + i * s[0]) = *(const T *)(p[1] + i * s[1]); \
  }
COPY_LOOP(copy_1, uint8_t)
COPY_LOOP(copy_2, uint16_t)
COPY_LOOP(copy_4, uint32_t)
COPY_LOOP(copy_8, uint64_t)

#define FILL_LOOP(NAME, T)                                                         \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    T v;                                                                           \
    memcpy(&v, ctx, sizeof v);                                                     \
    for (int64_t i = 0; i < n; i++) *(T *)(p[0] + i * s[0]) = v;                   \
  }
FILL_LOOP(fill_1, uint8_t)
FILL_LOOP(fill_2, uint16_t)
FILL_LOOP(fill_4, uint32_t)
FILL_LOOP(fill_8, uint64_t)

static prim_loop1d copy_loop(size_t size) {
  switch (size) {
  case 1: return copy_1;
  case 2: return copy_2;
  case 4: return copy_4;
  default: return copy_8;
  }
}

static prim_loop1d fill_loop(size_t size) {
  switch (size) {
  case 1: return fill_1;
  case 2: return fill_2;
  case 4: return fill_4;
  default: return fill_8;
  }
}

/* dst <- src element-wise (same sizes and dtype, any strides). */
static void copy(const prim_buf *dst, const prim_buf *src) {
  size_t es = ir_dtype(dst->dtype)->size;
  int64_t n = ir_numel(dst->ndim, dst->sizes);
  if (ir_is_contiguous(dst->ndim, dst->sizes, dst->strides) &&
      ir_is_contiguous(src->ndim, src->sizes, src->strides)) {
    size_t bytes = (size_t)n * es;
    int chunks = n >= 2 * PRIM_PARALLEL_GRAIN ? 2 : 1;
    /* Two chunks are enough on this machine's 2 cores; more only adds scheduling. */
#pragma omp parallel for num_threads(chunks) if (chunks > 1)
    for (int c = 0; c < chunks; c++) {
      size_t b = bytes * (size_t)c / (size_t)chunks, e = bytes * (size_t)(c + 1) / (size_t)chunks;
      memcpy(dst->data + b, src->data + b, e - b);
    }
    return;
  }
  prim_buf b[2] = {*dst, *src};
  prim_foreach(2, b, copy_loop(es), NULL);
}

/* A view of out covering the region that starts at `start` (per dim) with sizes `sizes`. */
static prim_buf sub_view(const prim_buf *out, const int64_t *start, const int64_t *sizes) {
  prim_buf v = *out;
  size_t es = ir_dtype(out->dtype)->size;
  for (int d = 0; d < out->ndim; d++) {
    v.data += start[d] * out->strides[d] * (int64_t)es;
    v.sizes[d] = sizes[d];
  }
  return v;
}

static void fill(const prim_buf *out, double value) {
  char v[8];
  prim_store(v, out->dtype, value);
  prim_foreach(1, out, fill_loop(ir_dtype(out->dtype)->size), v);
}

/* ---- indexing ---- */

typedef struct {
  int64_t limit;   /* valid indices are [0, limit) */
  int64_t bad;     /* first bad index seen */
  bool found;
} bounds_ctx;

static void check_bounds(char **p, const int64_t *s, int64_t n, const void *ctx) {
  bounds_ctx *c = (bounds_ctx *)ctx;
  for (int64_t i = 0; i < n && !c->found; i++) {
    int64_t v = *(const int64_t *)(p[0] + i * s[0]);
    if (v < 0 || v >= c->limit) c->bad = v, c->found = true;
  }
}

static bool indices_in_range(const prim_buf *index, int64_t limit, int axis, char *err, size_t cap) {
  bounds_ctx c = {limit, 0, false};
  prim_foreach_serial(1, index, check_bounds, &c);
  if (c.found)
    snprintf(err, cap, "index %lld is out of bounds for axis %d with size %lld", (long long)c.bad, axis,
             (long long)limit);
  return !c.found;
}

/* p[0] out, p[1] index (i64), p[2] the source with stride 0 along the indexed axis; ctx holds
 * that axis's real stride in bytes. */
#define GATHER_LOOP(NAME, T)                                                       \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    int64_t axis_stride = *(const int64_t *)ctx;                                   \
    for (int64_t i = 0; i < n; i++) {                                              \
      int64_t k = *(const int64_t *)(p[1] + i * s[1]);                             \
      *(T *)(p[0] + i * s[0]) = *(const T *)(p[2] + i * s[2] + k * axis_stride);   \
    }                                                                              \
  }
GATHER_LOOP(gather_1, uint8_t)
GATHER_LOOP(gather_2, uint16_t)
GATHER_LOOP(gather_4, uint32_t)
GATHER_LOOP(gather_8, uint64_t)

static prim_loop1d gather_loop(size_t size) {
  switch (size) {
  case 1: return gather_1;
  case 2: return gather_2;
  case 4: return gather_4;
  default: return gather_8;
  }
}

/* Reads x at out's positions along every axis but `axis`, where the index buffer says. */
static void gather_via(const prim_buf *out, const prim_buf *index_view, const prim_buf *x, int axis) {
  size_t es = ir_dtype(x->dtype)->size;
  prim_buf xv = *x;
  xv.ndim = out->ndim;
  for (int d = 0; d < out->ndim; d++) xv.sizes[d] = out->sizes[d];
  int64_t axis_stride = x->ndim ? x->strides[axis] * (int64_t)es : 0;
  if (x->ndim) xv.strides[axis] = 0;
  prim_buf b[3] = {*out, *index_view, xv};
  prim_foreach(3, b, gather_loop(es), &axis_stride);
}

/* p[0] out (stride 0 along axis), p[1] index, p[2] src; serial, so repeated indices add in a
 * fixed order. */
#define SCATTER_ADD_LOOP(NAME, T, OP)                                              \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    int64_t axis_stride = *(const int64_t *)ctx;                                   \
    for (int64_t i = 0; i < n; i++) {                                              \
      int64_t k = *(const int64_t *)(p[1] + i * s[1]);                             \
      T *o = (T *)(p[0] + i * s[0] + k * axis_stride);                             \
      T v = *(const T *)(p[2] + i * s[2]);                                         \
      *o = OP;                                                                     \
    }                                                                              \
  }
SCATTER_ADD_LOOP(scatter_f32, float, *o + v)
SCATTER_ADD_LOOP(scatter_f64, double, *o + v)
SCATTER_ADD_LOOP(scatter_i32, int32_t, (int32_t)((uint32_t)*o + (uint32_t)v))
SCATTER_ADD_LOOP(scatter_i64, int64_t, (int64_t)((uint64_t)*o + (uint64_t)v))
SCATTER_ADD_LOOP(scatter_u8, uint8_t, (uint8_t)(*o + v))
SCATTER_ADD_LOOP(scatter_bool, uint8_t, *o | v)

static const prim_loop1d scatter_loops[EM_DTYPE_COUNT] = {
    [EM_F32] = scatter_f32, [EM_F64] = scatter_f64, [EM_I32] = scatter_i32,
    [EM_I64] = scatter_i64, [EM_U8] = scatter_u8,   [EM_BOOL] = scatter_bool,
};

bool prim_run_movement(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in, int n_in,
                       char *err, size_t cap) {
  size_t es = ir_dtype(out->dtype)->size;
  switch (op) {
  case EM_PRIM_CLONE:
    copy(out, &in[0]);
    return true;
  case EM_PRIM_FLIP: {
    prim_buf src = in[0];
    for (int i = 0; i < at->n_axes; i++) {
      int a = ir_norm_axis(at->axes[i], src.ndim);
      if (src.sizes[a] == 0) return true;
      src.data += (src.sizes[a] - 1) * src.strides[a] * (int64_t)es;
      src.strides[a] = -src.strides[a];
    }
    prim_buf b[2] = {*out, src};
    prim_foreach(2, b, copy_loop(es), NULL);
    return true;
  }
  case EM_PRIM_PAD: {
    int64_t start[EM_MAX_DIMS] = {0};
    for (int i = 0; i < at->n_pads; i += 2) start[out->ndim - 1 - i / 2] = at->pads[i];
    fill(out, at->value);
    prim_buf inner = sub_view(out, start, in[0].sizes);
    copy(&inner, &in[0]);
    return true;
  }
  case EM_PRIM_CAT: {
    int a = ir_norm_axis(at->axes[0], out->ndim);
    int64_t start[EM_MAX_DIMS] = {0};
    for (int i = 0; i < n_in; i++) {
      prim_buf slab = sub_view(out, start, in[i].sizes);
      copy(&slab, &in[i]);
      start[a] += in[i].sizes[a];
    }
    return true;
  }
  case EM_PRIM_SLICE_SCATTER: {
    int a = ir_norm_axis(at->axes[0], out->ndim);
    copy(out, &in[0]);
    prim_buf v = *out;
    v.data += at->start * out->strides[a] * (int64_t)es;
    v.sizes[a] = in[1].sizes[a];
    v.strides[a] = out->strides[a] * at->step;
    copy(&v, &in[1]);
    return true;
  }
  case EM_PRIM_GATHER: {
    int a = ir_norm_axis(at->axes[0], in[0].ndim ? in[0].ndim : 1);
    if (!indices_in_range(&in[1], in[0].ndim ? in[0].sizes[a] : 1, a, err, cap)) return false;
    gather_via(out, &in[1], &in[0], a);
    return true;
  }
  case EM_PRIM_INDEX_SELECT: {
    int a = ir_norm_axis(at->axes[0], in[0].ndim ? in[0].ndim : 1);
    if (!indices_in_range(&in[1], in[0].ndim ? in[0].sizes[a] : 1, a, err, cap)) return false;
    /* The 1-D index seen with out's shape: it moves along `axis` only. */
    prim_buf iv = {.data = in[1].data, .dtype = EM_I64, .ndim = out->ndim};
    for (int d = 0; d < out->ndim; d++) {
      iv.sizes[d] = out->sizes[d];
      iv.strides[d] = d == a && in[1].ndim ? in[1].strides[0] : 0;
    }
    gather_via(out, &iv, &in[0], a);
    return true;
  }
  case EM_PRIM_SCATTER_ADD: {
    int a = ir_norm_axis(at->axes[0], in[0].ndim ? in[0].ndim : 1);
    if (!indices_in_range(&in[1], in[0].ndim ? in[0].sizes[a] : 1, a, err, cap)) return false;
    copy(out, &in[0]);
    prim_buf ov = *out, sv = in[2];
    for (int d = 0; d < in[1].ndim; d++) ov.sizes[d] = sv.sizes[d] = in[1].sizes[d];
    int64_t axis_stride = out->ndim ? out->strides[a] * (int64_t)es : 0;
    if (out->ndim) ov.strides[a] = 0;
    prim_buf b[3] = {ov, in[1], sv};
    prim_foreach_serial(3, b, scatter_loops[out->dtype], &axis_stride);
    return true;
  }
  default:
    snprintf(err, cap, "is not a movement prim");
    return false;
  }
}
