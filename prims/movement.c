/* prims/movement.c: reference kernels of the copying movement prims (clone, flip, pad, cat,
 * slice_scatter) and of the indexing prims (gather, index_select, scatter_add).
 *
 * Almost everything here is a strided copy on prim_foreach, obtained by restriding buffers
 * rather than by index arithmetic per element: flip copies from a buffer whose strides along
 * the flipped axes are negated and whose data points at the last element there; pad, cat and
 * slice_scatter copy into sub-views of the output; gather and index_select read the operand
 * through a view whose stride along the indexed axis is 0 and add index * stride in the inner
 * loop. The copy loops only move bytes, so one loop per element size (1, 2, 4, 8) serves every
 * dtype, f16 and bf16 included. Four cases get their own path because they dominate real
 * programs: a contiguous copy is one memcpy, split across threads when large; the copy of a
 * transposed or permuted tensor runs in tiles so that each input cache line is read once;
 * index_select of whole contiguous rows (an embedding lookup) is one memcpy per row; pad
 * writes each interior row as fill, copy, fill so that no output element is written twice.
 * Indices are checked before anything is written, so a bad index leaves no partial result,
 * and scatter_add adds into each output element in one fixed order whatever the thread count,
 * so it is deterministic. */
#include "prims.h"

#include <stdio.h>
#include <string.h>

/* ---- copy and fill loops ------------------------------------------------------------------ */

/* p[0] out, p[1] in. Runs that are contiguous on both sides are one memcpy; a broadcast input
 * (stride 0, from expand) is read once and stored as a plain array fill, which vectorises;
 * anything else (transposes, steps, negated strides from flip) is the strided loop. */
#define COPY_LOOP(NAME, T)                                                         \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    (void)ctx;                                                                     \
    if (s[0] == (int64_t)sizeof(T)) {                                              \
      if (s[1] == (int64_t)sizeof(T)) {                                            \
        memcpy(p[0], p[1], (size_t)n * sizeof(T));                                 \
        return;                                                                    \
      }                                                                            \
      if (s[1] == 0) {                                                             \
        T *o = (T *)p[0];                                                          \
        const T v = *(const T *)p[1];                                              \
        for (int64_t i = 0; i < n; i++) o[i] = v;                                  \
        return;                                                                    \
      }                                                                            \
    }                                                                              \
    for (int64_t i = 0; i < n; i++) *(T *)(p[0] + i * s[0]) = *(const T *)(p[1] + i * s[1]); \
  }
COPY_LOOP(copy_1, uint8_t)
COPY_LOOP(copy_2, uint16_t)
COPY_LOOP(copy_4, uint32_t)
COPY_LOOP(copy_8, uint64_t)

/* p[0] out; ctx points at one element's bytes. A contiguous run of an element whose bytes
 * are all equal (zero padding, the usual case) is a memset. */
#define FILL_LOOP(NAME, T)                                                         \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    T v;                                                                           \
    memcpy(&v, ctx, sizeof v);                                                     \
    if (s[0] == (int64_t)sizeof(T)) {                                              \
      T *o = (T *)p[0];                                                            \
      const unsigned char *b = (const unsigned char *)ctx;                         \
      if (memcmp(b, b + 1, sizeof(T) - 1) == 0) {                                  \
        memset(o, b[0], (size_t)n * sizeof(T));                                    \
        return;                                                                    \
      }                                                                            \
      for (int64_t i = 0; i < n; i++) o[i] = v;                                    \
      return;                                                                      \
    }                                                                              \
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

/* Bytes per thread below which a memcpy stays on one thread: smaller copies finish before a
 * thread team would have started, and one core already saturates the caches. */
#define MEMCPY_GRAIN ((size_t)256 * 1024)

typedef struct {
  char *dst;
  const char *src;
  size_t bytes, chunks;
} memcpy_job;

static void memcpy_chunk(void *ctx, int64_t c) {
  const memcpy_job *j = ctx;
  /* Split on cache lines so no two threads write the same one. */
  size_t b = (j->bytes / j->chunks * (size_t)c) & ~(size_t)63;
  size_t e = (size_t)c + 1 == j->chunks ? j->bytes : (j->bytes / j->chunks * ((size_t)c + 1)) & ~(size_t)63;
  memcpy(j->dst + b, j->src + b, e - b);
}

static void par_memcpy(char *dst, const char *src, size_t bytes) {
  size_t chunks = bytes / MEMCPY_GRAIN;
  int nt = prim_threads();
  if (chunks > (size_t)nt) chunks = (size_t)nt;
  if (chunks < 2) {
    memcpy(dst, src, bytes);
    return;
  }
  memcpy_job j = {dst, src, bytes, chunks};
  prim_parallel((int64_t)chunks, memcpy_chunk, &j);
}

/* Output elements per tile row of a transposing copy: enough to fill whole cache lines of the
 * output, few enough that the input lines of one tile stay in L1. */
#define TILE 64

/* A copy whose output rows cut across the input's rows (a transpose, the contiguous() of a
 * permuted tensor) read in output order touches a new input cache line and usually a new page
 * per element. When some other dim k is the input's unit-stride dim, the same copy is run in
 * tile order instead: the output's last dim is split into blocks of TILE, and for each block
 * dim k runs just outside it, so each input line fetched is used for all its elements while
 * it is still cached. This is only a different order of the same element copies, written as a
 * re-strided view for prim_foreach. Returns false when the copy does not have that shape. */
static bool copy_tiled(const prim_buf *dst, const prim_buf *src, size_t es) {
  int nd = dst->ndim, last = nd - 1, k = -1;
  if (nd < 2 || nd == EM_MAX_DIMS || dst->strides[last] != 1 || dst->sizes[last] < 2) return false;
  int64_t step = src->strides[last];
  if (step >= -1 && step <= 1) return false; /* already streams (or broadcasts) the input */
  for (int d = 0; d < last; d++)
    if (dst->sizes[d] > 1 && (src->strides[d] == 1 || src->strides[d] == -1)) k = d;
  if (k < 0) return false;
  /* Dims other than k and the last, in order; then the block index, k, and the block. */
  prim_buf b[2] = {*dst, *src};
  const prim_buf *from[2] = {dst, src};
  int n = 0;
  for (int d = 0; d < last; d++) {
    if (d == k) continue;
    for (int i = 0; i < 2; i++) {
      b[i].sizes[n] = dst->sizes[d];
      b[i].strides[n] = from[i]->strides[d];
    }
    n++;
  }
  int64_t width = dst->sizes[last], blocks = width / TILE, rest = width % TILE;
  for (int i = 0; i < 2; i++) {
    b[i].ndim = n + 3;
    b[i].sizes[n] = blocks;
    b[i].strides[n] = TILE * from[i]->strides[last];
    b[i].sizes[n + 1] = dst->sizes[k];
    b[i].strides[n + 1] = from[i]->strides[k];
    b[i].sizes[n + 2] = TILE;
    b[i].strides[n + 2] = from[i]->strides[last];
  }
  if (blocks > 0) prim_foreach(2, b, copy_loop(es), NULL);
  if (rest > 0) {
    /* The last, partial block. */
    for (int i = 0; i < 2; i++) {
      b[i].data += blocks * TILE * from[i]->strides[last] * (int64_t)es;
      b[i].sizes[n] = 1;
      b[i].sizes[n + 2] = rest;
    }
    prim_foreach(2, b, copy_loop(es), NULL);
  }
  return true;
}

/* dst <- src element-wise (same sizes and dtype, any strides, src strides may be 0 or
 * negative; dst must not overlap itself or src). */
static void copy(const prim_buf *dst, const prim_buf *src) {
  size_t es = ir_dtype(dst->dtype)->size;
  int64_t n = ir_numel(dst->ndim, dst->sizes);
  if (n == 0) return;
  if (ir_is_contiguous(dst->ndim, dst->sizes, dst->strides) &&
      ir_is_contiguous(src->ndim, src->sizes, src->strides)) {
    par_memcpy(dst->data, src->data, (size_t)n * es);
    return;
  }
  if (copy_tiled(dst, src, es)) return;
  prim_buf b[2] = {*dst, *src};
  prim_foreach(2, b, copy_loop(es), NULL);
}

static void fill(const prim_buf *dst, const char *element) {
  if (ir_numel(dst->ndim, dst->sizes) == 0) return;
  prim_foreach(1, dst, fill_loop(ir_dtype(dst->dtype)->size), element);
}

/* The view of buf covering [start[d], start[d] + sizes[d]) on every dim d. */
static prim_buf sub_view(const prim_buf *buf, const int64_t *start, const int64_t *sizes) {
  prim_buf v = *buf;
  int64_t es = (int64_t)ir_dtype(buf->dtype)->size;
  for (int d = 0; d < buf->ndim; d++) {
    v.sizes[d] = sizes[d];
    if (sizes[d] > 0) v.data += start[d] * buf->strides[d] * es;
  }
  return v;
}

/* ---- flip --------------------------------------------------------------------------------- */

static void flip(const prim_attrs *at, const prim_buf *out, const prim_buf *x) {
  if (ir_numel(out->ndim, out->sizes) == 0) return;
  int64_t es = (int64_t)ir_dtype(x->dtype)->size;
  prim_buf src = *x;
  for (int i = 0; i < at->n_axes; i++) {
    int a = ir_norm_axis(at->axes[i], src.ndim);
    /* Start at the last element along a and walk backwards; the iterator only compares
     * strides for equality when coalescing, so negative strides merge like positive ones. */
    src.data += (src.sizes[a] - 1) * src.strides[a] * es;
    src.strides[a] = -src.strides[a];
  }
  copy(out, &src);
}

/* ---- pad ---------------------------------------------------------------------------------- */

typedef struct {
  int64_t left, width, right; /* elements of each interior row: fill, copied, fill */
  int64_t in_step;            /* input stride along the row, bytes */
  unsigned char value[8];     /* the fill element */
} pad_rows;

/* One call per run of interior rows: p[0] is the output row's first (left fill) element, p[1]
 * the input row's first element; s[] step between rows. */
#define PAD_ROWS_LOOP(NAME, T)                                                     \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    const pad_rows *c = (const pad_rows *)ctx;                                     \
    T v;                                                                           \
    memcpy(&v, c->value, sizeof v);                                                \
    for (int64_t r = 0; r < n; r++) {                                              \
      T *o = (T *)(p[0] + r * s[0]);                                               \
      const char *a = p[1] + r * s[1];                                             \
      for (int64_t i = 0; i < c->left; i++) o[i] = v;                              \
      o += c->left;                                                                \
      if (c->in_step == (int64_t)sizeof(T)) {                                      \
        memcpy(o, a, (size_t)c->width * sizeof(T));                                \
      } else {                                                                     \
        for (int64_t i = 0; i < c->width; i++) o[i] = *(const T *)(a + i * c->in_step); \
      }                                                                            \
      o += c->width;                                                               \
      for (int64_t i = 0; i < c->right; i++) o[i] = v;                             \
    }                                                                              \
  }
PAD_ROWS_LOOP(pad_rows_1, uint8_t)
PAD_ROWS_LOOP(pad_rows_2, uint16_t)
PAD_ROWS_LOOP(pad_rows_4, uint32_t)
PAD_ROWS_LOOP(pad_rows_8, uint64_t)

static prim_loop1d pad_rows_loop(size_t size) {
  switch (size) {
  case 1: return pad_rows_1;
  case 2: return pad_rows_2;
  case 4: return pad_rows_4;
  default: return pad_rows_8;
  }
}

/* Every output element is written once: the border slabs of the outer dims are filled (each is
 * a run of whole contiguous blocks), narrowing the region to the interior dim by dim, and the
 * remaining interior rows are written fill / copy / fill by one row loop. */
static void pad(const prim_attrs *at, const prim_buf *out, const prim_buf *x) {
  int nd = out->ndim;
  if (ir_numel(nd, out->sizes) == 0) return;
  size_t es = ir_dtype(out->dtype)->size;
  int64_t left[EM_MAX_DIMS] = {0}, right[EM_MAX_DIMS] = {0};
  for (int i = 0; i + 1 < at->n_pads; i += 2) {
    left[nd - 1 - i / 2] = at->pads[i];
    right[nd - 1 - i / 2] = at->pads[i + 1];
  }
  pad_rows c = {0};
  prim_store((char *)c.value, out->dtype, at->value);
  int64_t lo[EM_MAX_DIMS], sz[EM_MAX_DIMS];
  for (int d = 0; d < nd; d++) lo[d] = 0, sz[d] = out->sizes[d];
  for (int d = 0; d + 1 < nd; d++) {
    if (left[d] > 0) {
      sz[d] = left[d];
      prim_buf v = sub_view(out, lo, sz);
      fill(&v, (const char *)c.value);
    }
    if (right[d] > 0) {
      lo[d] = left[d] + x->sizes[d];
      sz[d] = right[d];
      prim_buf v = sub_view(out, lo, sz);
      fill(&v, (const char *)c.value);
    }
    lo[d] = left[d];
    sz[d] = x->sizes[d];
  }
  if (nd == 0 || (left[nd - 1] == 0 && right[nd - 1] == 0)) {
    prim_buf v = sub_view(out, lo, x->sizes);
    copy(&v, x);
    return;
  }
  /* The interior rows, seen without their last dim: one loop element per row. */
  prim_buf rows[2] = {sub_view(out, lo, sz), *x};
  rows[0].ndim = rows[1].ndim = nd - 1;
  c.left = left[nd - 1];
  c.width = x->sizes[nd - 1];
  c.right = right[nd - 1];
  c.in_step = x->strides[nd - 1] * (int64_t)es;
  if (ir_numel(nd - 1, rows[0].sizes) == 0) return;
  prim_foreach(2, rows, pad_rows_loop(es), &c);
}

/* ---- cat and slice_scatter ---------------------------------------------------------------- */

static void cat(const prim_attrs *at, const prim_buf *out, const prim_buf *in, int n_in) {
  int a = ir_norm_axis(at->axes[0], out->ndim);
  int64_t start[EM_MAX_DIMS] = {0};
  for (int i = 0; i < n_in; i++) {
    prim_buf slab = sub_view(out, start, in[i].sizes);
    copy(&slab, &in[i]);
    start[a] += in[i].sizes[a];
  }
}

/* out = base with src written over base[..., start:stop:step, ...] along the axis. */
static void slice_scatter(const prim_attrs *at, const prim_buf *out, const prim_buf *base,
                          const prim_buf *src) {
  int a = ir_norm_axis(at->axes[0], out->ndim);
  copy(out, base);
  if (ir_numel(src->ndim, src->sizes) == 0) return;
  prim_buf v = *out;
  v.data += at->start * out->strides[a] * (int64_t)ir_dtype(out->dtype)->size;
  v.sizes[a] = src->sizes[a];
  v.strides[a] = out->strides[a] * at->step;
  copy(&v, src);
}

/* ---- indexing ----------------------------------------------------------------------------- */

typedef struct {
  int64_t limit; /* valid indices are [0, limit) */
  int64_t bad;   /* the first bad index met */
  bool found;
} bounds_ctx;

static void check_bounds(char **p, const int64_t *s, int64_t n, const void *ctx) {
  bounds_ctx *c = (bounds_ctx *)ctx;
  if (c->found) return;
  /* One unsigned comparison rejects negatives too: they are errors, never wrapped. */
  uint64_t limit = (uint64_t)c->limit;
  for (int64_t i = 0; i < n; i++) {
    int64_t v = *(const int64_t *)(p[0] + i * s[0]);
    if ((uint64_t)v >= limit) {
      c->bad = v;
      c->found = true;
      return;
    }
  }
}

static bool indices_in_range(const prim_buf *index, int64_t limit, int axis, char *err,
                             size_t cap) {
  bounds_ctx c = {limit, 0, false};
  prim_foreach_serial(1, index, check_bounds, &c);
  if (c.found)
    snprintf(err, cap, "index %lld is out of bounds for axis %d with size %lld", (long long)c.bad,
             axis, (long long)limit);
  return !c.found;
}

/* p[0] out, p[1] index (i64), p[2] the source with stride 0 along the indexed axis; ctx holds
 * that axis's real stride in bytes. */
#define GATHER_LOOP(NAME, T)                                                       \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    const int64_t axis_stride = *(const int64_t *)ctx;                             \
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

/* out[p] = x[p with the axis coordinate replaced by index_view[p]], where index_view has out's
 * sizes (any strides). Off the axis, out's coordinates are x's, so x is read through its own
 * strides with the axis stride moved into the loop. */
static void gather_via(const prim_buf *out, const prim_buf *index_view, const prim_buf *x,
                       int axis) {
  size_t es = ir_dtype(x->dtype)->size;
  prim_buf xv = *x;
  int64_t axis_stride = 0;
  if (x->ndim) {
    axis_stride = x->strides[axis] * (int64_t)es;
    xv.strides[axis] = 0;
  }
  prim_buf b[3] = {*out, *index_view, xv};
  prim_foreach(3, b, gather_loop(es), &axis_stride);
}

/* index_select when the dims after the axis form one contiguous block of x: every output row
 * (one outer position, one index entry) is a single memcpy of that block. out is contiguous, so
 * its rows are consecutive; rows are split across threads in contiguous ranges. */
typedef struct {
  const prim_buf *out, *x;
  const int64_t *idx;
  int axis;
  size_t es, row_bytes;
  int64_t n, rows, chunks, idx_step, axis_step;
} select_job;

static void select_chunk(void *ctx, int64_t c) {
  const select_job *s = ctx;
  int64_t n = s->n, r = s->rows * c / s->chunks, end = s->rows * (c + 1) / s->chunks;
  int64_t o = r / n, j = r % n;
  while (r < end) {
    /* x's offset of outer position o: unravelled once per outer step, not per row. */
    const char *base = s->x->data;
    for (int64_t d = s->axis - 1, rest = o; d >= 0; d--) {
      base += (rest % s->x->sizes[d]) * s->x->strides[d] * (int64_t)s->es;
      rest /= s->x->sizes[d];
    }
    for (; j < n && r < end; j++, r++)
      memcpy(s->out->data + (size_t)r * s->row_bytes, base + s->idx[j * s->idx_step] * s->axis_step, s->row_bytes);
    j = 0;
    o++;
  }
}

static void select_rows(const prim_buf *out, const prim_buf *x, const prim_buf *index, int axis,
                        int64_t row_elems) {
  select_job s = {.out = out, .x = x, .idx = (const int64_t *)index->data, .axis = axis};
  s.es = ir_dtype(x->dtype)->size;
  s.row_bytes = (size_t)row_elems * s.es;
  s.n = out->sizes[axis];
  s.rows = ir_numel(axis, out->sizes) * s.n;
  s.idx_step = index->ndim ? index->strides[0] : 0;
  s.axis_step = x->strides[axis] * (int64_t)s.es;
  int nt = prim_threads();
  s.chunks = s.rows * row_elems / PRIM_PARALLEL_GRAIN;
  if (s.chunks > nt) s.chunks = nt;
  if (s.chunks > s.rows) s.chunks = s.rows;
  if (s.chunks < 1) s.chunks = 1;
  prim_parallel(s.chunks, select_chunk, &s);
}

static void index_select(const prim_buf *out, const prim_buf *x, const prim_buf *index, int axis) {
  if (ir_numel(out->ndim, out->sizes) == 0) return;
  size_t es = ir_dtype(x->dtype)->size;
  if (x->ndim) {
    int inner_nd = x->ndim - axis - 1;
    int64_t row_elems = ir_numel(inner_nd, x->sizes + axis + 1);
    /* For rows shorter than about 32 bytes the call to memcpy costs more than the element loop. */
    if (row_elems * (int64_t)es >= 32 && ir_is_contiguous(out->ndim, out->sizes, out->strides) &&
        ir_is_contiguous(inner_nd, x->sizes + axis + 1, x->strides + axis + 1)) {
      select_rows(out, x, index, axis, row_elems);
      return;
    }
  }
  /* The 1-D (or 0-D) index seen with out's shape: it moves along the axis only. */
  prim_buf iv = {.data = index->data, .dtype = EM_I64, .ndim = out->ndim};
  for (int d = 0; d < out->ndim; d++) {
    iv.sizes[d] = out->sizes[d];
    iv.strides[d] = d == axis && index->ndim ? index->strides[0] : 0;
  }
  gather_via(out, &iv, x, axis);
}

typedef struct {
  int64_t axis_stride; /* out's stride along the axis, bytes */
  em_dtype dtype;      /* for the slow path */
} scatter_ctx;

/* p[0] out (stride 0 along the axis), p[1] index, p[2] src. Integers wrap as in torch (done in
 * unsigned arithmetic, where wrapping is defined); bool adds as logical or. */
#define SCATTER_ADD_LOOP(NAME, T, EXPR)                                            \
  static void NAME(char **p, const int64_t *s, int64_t n, const void *ctx) {       \
    const int64_t axis_stride = ((const scatter_ctx *)ctx)->axis_stride;           \
    for (int64_t i = 0; i < n; i++) {                                              \
      int64_t k = *(const int64_t *)(p[1] + i * s[1]);                             \
      T *o = (T *)(p[0] + i * s[0] + k * axis_stride);                             \
      T v = *(const T *)(p[2] + i * s[2]);                                         \
      *o = EXPR;                                                                   \
    }                                                                              \
  }
SCATTER_ADD_LOOP(scatter_f32, float, *o + v)
SCATTER_ADD_LOOP(scatter_f64, double, *o + v)
SCATTER_ADD_LOOP(scatter_i32, int32_t, (int32_t)((uint32_t)*o + (uint32_t)v))
SCATTER_ADD_LOOP(scatter_i64, int64_t, (int64_t)((uint64_t)*o + (uint64_t)v))
SCATTER_ADD_LOOP(scatter_u8, uint8_t, (uint8_t)(*o + v))
SCATTER_ADD_LOOP(scatter_bool, uint8_t, (uint8_t)(*o | v))

/* f16 and bf16 have no CPU arithmetic (the runtime casts first); should a caller still come
 * here, each sum is formed in double and rounded once to the storage type. */
static void scatter_slow(char **p, const int64_t *s, int64_t n, const void *ctx) {
  const scatter_ctx *c = (const scatter_ctx *)ctx;
  for (int64_t i = 0; i < n; i++) {
    int64_t k = *(const int64_t *)(p[1] + i * s[1]);
    char *o = p[0] + i * s[0] + k * c->axis_stride;
    prim_store(o, c->dtype, prim_load(o, c->dtype) + prim_load(p[2] + i * s[2], c->dtype));
  }
}

static prim_loop1d scatter_loop(em_dtype dt) {
  switch (dt) {
  case EM_F32: return scatter_f32;
  case EM_F64: return scatter_f64;
  case EM_I32: return scatter_i32;
  case EM_I64: return scatter_i64;
  case EM_U8: return scatter_u8;
  case EM_BOOL: return scatter_bool;
  default: return scatter_slow;
  }
}

typedef struct {
  const prim_buf *b; /* out (stride 0 on the axis), index, src */
  const scatter_ctx *c;
  prim_loop1d fn;
  int split;
  int64_t parts;
} scatter_job;

static void scatter_part(void *ctx, int64_t t) {
  const scatter_job *j = ctx;
  int64_t len = j->b[1].sizes[j->split], lo = len * t / j->parts, hi = len * (t + 1) / j->parts;
  prim_buf part[3] = {j->b[0], j->b[1], j->b[2]};
  for (int k = 0; k < 3; k++) {
    part[k].data += lo * part[k].strides[j->split] * (int64_t)ir_dtype(part[k].dtype)->size;
    part[k].sizes[j->split] = hi - lo;
  }
  prim_foreach_serial(3, part, j->fn, j->c);
}

/* Two index positions that differ off the axis write different output elements, so the work
 * is split across threads along the longest non-axis dim; within each part the positions run in
 * the serial order. Every output element therefore receives its additions in the same order
 * whatever the thread count, and the result is bitwise that of a serial run. */
static void scatter_add(const prim_buf *out, const prim_buf *x, const prim_buf *index,
                        const prim_buf *src, int axis) {
  size_t es = ir_dtype(out->dtype)->size;
  copy(out, x);
  int64_t total = ir_numel(index->ndim, index->sizes);
  if (total == 0) return;
  scatter_ctx c = {out->ndim ? out->strides[axis] * (int64_t)es : 0, out->dtype};
  prim_buf b[3] = {*out, *index, *src};
  for (int d = 0; d < index->ndim; d++) b[0].sizes[d] = b[2].sizes[d] = index->sizes[d];
  if (out->ndim) b[0].strides[axis] = 0;
  prim_loop1d fn = scatter_loop(out->dtype);

  int split = -1;
  for (int d = 0; d < index->ndim; d++)
    if (d != axis && (split < 0 || index->sizes[d] > index->sizes[split])) split = d;
  int nt = prim_threads();
  int64_t parts = total / PRIM_PARALLEL_GRAIN;
  if (parts > nt) parts = nt;
  if (split >= 0 && parts > index->sizes[split]) parts = index->sizes[split];
  if (split < 0 || parts < 2) {
    prim_foreach_serial(3, b, fn, &c);
    return;
  }
  scatter_job j = {b, &c, fn, split, parts};
  prim_parallel(parts, scatter_part, &j);
}

/* ---- entry -------------------------------------------------------------------------------- */

bool prim_run_movement(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in,
                       int n_in, char *err, size_t cap) {
  switch (op) {
  case EM_PRIM_CLONE:
    copy(out, &in[0]);
    return true;
  case EM_PRIM_FLIP:
    flip(at, out, &in[0]);
    return true;
  case EM_PRIM_PAD:
    pad(at, out, &in[0]);
    return true;
  case EM_PRIM_CAT:
    cat(at, out, in, n_in);
    return true;
  case EM_PRIM_SLICE_SCATTER:
    slice_scatter(at, out, &in[0], &in[1]);
    return true;
  case EM_PRIM_GATHER:
  case EM_PRIM_INDEX_SELECT:
  case EM_PRIM_SCATTER_ADD: {
    /* A 0-D x is indexed as if it had one dim of size 1, as torch does. */
    const prim_buf *x = &in[0];
    int a = ir_norm_axis(at->axes[0], x->ndim ? x->ndim : 1);
    if (!indices_in_range(&in[1], x->ndim ? x->sizes[a] : 1, a, err, cap)) return false;
    if (op == EM_PRIM_GATHER) gather_via(out, &in[1], x, a);
    else if (op == EM_PRIM_INDEX_SELECT) index_select(out, x, &in[1], a);
    else scatter_add(out, x, &in[1], &in[2], a);
    return true;
  }
  default:
    snprintf(err, cap, "is not a movement prim");
    return false;
  }
}
