/* prims/extern.c: the extern prims, GEMM and 2-D convolution (forward and its two backward
 * convolutions), handed to tuned libraries, with plain-loop references kept as their oracle.
 *
 * These are the prims where a hand-written loop is an order of magnitude slower than a tuned
 * library, so each goes where it is done best on this machine: f32 GEMM to oneDNN's dnnl_sgemm,
 * f32 convolutions to oneDNN's convolution primitives (cached per problem, run on oneDNN's own
 * blocked layouts with reorders from and to Ember's nchw/oihw; the section says why), f64 GEMM
 * to OpenBLAS (oneDNN has no f64 GEMM), and integer GEMM and f64 convolutions to the reference
 * loops (f64 serves gradient checks, not speed). Operands arrive with any strides: GEMM takes a
 * transposed view as it is (transa/transb) and copies only matrices that neither layout fits;
 * convolutions copy non-contiguous operands. GEMMs run as tiles on Ember's thread pool, each
 * tile a single-threaded library call (the section on tiles says why); convolutions are threaded
 * by oneDNN itself, on OpenMP (Debian's libdnnl is built on libgomp). Without
 * oneDNN or OpenBLAS (meson options onednn, blas) the reference loops run instead, so the
 * library always builds. */
#include "prims.h"
#include "fast_f32.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef EMBER_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "dnnl_guard.h"
#endif
#ifdef EMBER_HAVE_BLAS
#include <cblas.h>
#endif
#ifdef EMBER_HAVE_SLEEF
#include <immintrin.h>
#include <sleef.h>
#endif

/* Multiply-adds below which a loop is not worth starting threads for. */
#define PAR_WORK ((int64_t)1 << 16)

/* ---- shared helpers ------------------------------------------------------------------------ */

static size_t esize(em_dtype dt) { return ir_dtype(dt)->size; }

static int64_t batch_count(const prim_buf *b) { return ir_numel(b->ndim - 2, b->sizes); }

/* Element offset of flat batch index i (row-major over the dims before the last two) in b;
 * broadcast batch dims have stride 0 and so land on the same matrix. */
static int64_t batch_offset(const prim_buf *b, int64_t i) {
  int64_t off = 0;
  for (int d = b->ndim - 3; d >= 0; d--) {
    off += (i % b->sizes[d]) * b->strides[d];
    i /= b->sizes[d];
  }
  return off;
}

static void zero(const prim_buf *out) {
  memset(out->data, 0, (size_t)ir_numel(out->ndim, out->sizes) * esize(out->dtype));
}

/* p[0] out, p[1] in; ctx points at the element size (the extern dtypes are 4 or 8 bytes). */
static void copy_loop(char **p, const int64_t *s, int64_t n, const void *ctx) {
  if (*(const size_t *)ctx == 4)
    for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], p[1] + i * s[1], 4);
  else
    for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], p[1] + i * s[1], 8);
}

/* A row-major copy of src in *dst (data malloc'd into *owned, which the caller frees), or src
 * itself when it already is row-major (*owned NULL). Dims before keep_from that src broadcasts
 * (stride 0) stay broadcast in the copy, so GEMM copies each distinct matrix of an expanded
 * batch once instead of materialising the expansion. */
static bool compact(const prim_buf *src, int keep_from, prim_buf *dst, void **owned, char *err, size_t cap) {
  *owned = NULL;
  *dst = *src;
  if (ir_is_contiguous(src->ndim, src->sizes, src->strides)) return true;
  prim_buf from = *src, to = *src;
  int64_t n = 1;
  for (int d = src->ndim - 1; d >= 0; d--) {
    if (d < keep_from && (src->strides[d] == 0 || src->sizes[d] == 1)) {
      dst->strides[d] = 0;
      from.sizes[d] = to.sizes[d] = 1; /* copy one slice; the stride-0 view repeats it */
    } else {
      dst->strides[d] = n;
      n *= src->sizes[d];
    }
  }
  size_t es = esize(src->dtype), bytes = (size_t)n * es;
  if (!(*owned = malloc(bytes ? bytes : 1))) return snprintf(err, cap, "out of memory"), false;
  dst->data = to.data = *owned;
  memcpy(to.strides, dst->strides, sizeof to.strides);
  prim_buf bufs[2] = {to, from};
  prim_foreach(2, bufs, copy_loop, &es);
  return true;
}

/* Leading dimensions that are multiples of 2 or 4 KiB. oneDNN's sgemm reads some operands whose
 * rows (or, transposed, whose columns) lie a multiple of 4 KiB apart at a fraction of its speed: the
 * lines it packs together fall into the same L1 sets. Measured one thread, CPU time, Zen 5, in ms,
 * the operand as it is / copied into rows padded by 64 bytes (the copy included), M x K x N:
 *
 *                                            AVX2 kernels   AVX-512 kernels
 *   b [256,1024] as it is, 2048x256x1024     14.6 / 8.4     4.75 / 4.53
 *   b [2048,1024] as it is, 256x2048x1024    17.1 / 9.5     5.44 / 5.45
 *   b [256,1024] transposed, 2048x1024x256    9.0 / 10.0    6.68 / 5.32
 *   a [2048,1024] transposed, 1024x2048x256  13.1 / 9.7     5.07 / 5.09
 *   b [512,512] (2 KiB rows), 128x512x512     0.61 / 0.64   0.28 / 0.39
 *   b [128,512] (2 KiB rows), 512x128x512     0.80 / 0.74   0.27 / 0.29
 *   b [512,512] transposed, 128x512x512       0.55 / 0.67   0.35 / 0.43
 *
 * So such an operand is copied first, once per product (one pass over it, parallel), where that
 * paid: with the AVX2 kernels b read as it is and a read transposed, rows a multiple of 2 KiB
 * apart, when the product's other side has 64 or more rows or columns (the compiled MLP step,
 * 784-512-512-10 at batch 128, 2.50 against 2.65 ms); with the AVX-512 kernels b either way,
 * rows a multiple of 4 KiB apart, its product 256 rows or more (copying 2 KiB rows made that
 * MLP step 1.5 ms against 1.05). The transformer's MLP operands (d_model 256, 1024 wide) cost a
 * third of its GEMM time on AVX2 unpadded. The copy has
 * the operand's bits, and the library's blocking depends on m, n and k only, so the product
 * has the bits of the unpadded call. Out of memory for the copy: the product runs unpadded. */
static bool aliasing_ld(int64_t ld, em_dtype dt, int64_t apart) { return ld > 0 && (ld * (int64_t)esize(dt)) % apart == 0; }

/* A copy of src (a GEMM operand laid out 'N' or 'T' with leading dimension ld) whose leading
 * dimension is padded, batches contiguous (broadcast batch dims stay stride 0, one slice
 * copied); its new leading dimension in *ld. False (dst untouched) when the copy is not made. */
static bool pad_operand(const prim_buf *src, char layout, int64_t *ld, prim_buf *dst, void **owned) {
  int nd = src->ndim, inner = layout == 'N' ? nd - 1 : nd - 2, outer = layout == 'N' ? nd - 2 : nd - 1;
  int64_t width = (src->sizes[inner] + 15) / 16 * 16 + 16; /* a multiple of 64 bytes, not of 2 KiB */
  if (aliasing_ld(width, src->dtype, 2048)) width += 16;
  prim_buf from = *src, to = *src;
  to.strides[inner] = 1;
  to.strides[outer] = width;
  int64_t n = width * src->sizes[outer];
  for (int d = nd - 3; d >= 0; d--) {
    if (src->strides[d] == 0 || src->sizes[d] == 1) {
      to.strides[d] = 0;
      from.sizes[d] = 1;
    } else {
      to.strides[d] = n;
      n *= src->sizes[d];
    }
  }
  size_t es = esize(src->dtype);
  if (!(*owned = malloc((size_t)n * es))) return false;
  to.data = *owned;
  prim_buf copy = to;
  memcpy(copy.sizes, from.sizes, sizeof copy.sizes);
  if (layout == 'T') /* the copy walks memory in order: its stride-1 dim last */
    for (prim_buf *b = &copy; b; b = b == &copy ? &from : NULL) {
      int64_t z = b->sizes[nd - 1], t = b->strides[nd - 1];
      b->sizes[nd - 1] = b->sizes[nd - 2], b->strides[nd - 1] = b->strides[nd - 2];
      b->sizes[nd - 2] = z, b->strides[nd - 2] = t;
    }
  prim_buf bufs[2] = {copy, from};
  prim_foreach(2, bufs, copy_loop, &es);
  *dst = to;
  *ld = width;
  return true;
}

/* ---- GEMM reference ------------------------------------------------------------------------ */

typedef struct {
  const prim_buf *out, *a, *b;
  int64_t m, n, k;
} matmul_ref_job;

/* Output rows [r0, r1) of all batches' rows. Each output element is one dot product in a fixed
 * order, so threads change no result. */
static void matmul_ref_rows(void *ctx, int64_t r0, int64_t r1) {
  const matmul_ref_job *j = ctx;
  const prim_buf *out = j->out, *a = j->a, *b = j->b;
  int nd = out->ndim;
  int64_t m = j->m, n = j->n, k = j->k;
  int64_t as0 = a->strides[nd - 2], as1 = a->strides[nd - 1], bs0 = b->strides[nd - 2], bs1 = b->strides[nd - 1];
  int64_t os0 = out->strides[nd - 2], os1 = out->strides[nd - 1];
  em_dtype dt = out->dtype;
  int64_t es = (int64_t)esize(dt);
  for (int64_t r = r0; r < r1; r++) {
    int64_t bi = r / m, i = r % m;
    const char *pa = a->data + (batch_offset(a, bi) + i * as0) * es;
    const char *pb = b->data + batch_offset(b, bi) * es;
    char *po = out->data + (batch_offset(out, bi) + i * os0) * es;
    for (int64_t jj = 0; jj < n; jj++) {
      double accf = 0;
      uint64_t acci = 0; /* unsigned: integer GEMM wraps, as torch's does, without UB */
      for (int64_t p = 0; p < k; p++) {
        const char *x = pa + p * as1 * es, *y = pb + (p * bs0 + jj * bs1) * es;
        switch (dt) {
        case EM_F32: accf += (double)*(const float *)x * *(const float *)y; break;
        case EM_F64: accf += *(const double *)x * *(const double *)y; break;
        case EM_I32: acci += (uint64_t)(int64_t)*(const int32_t *)x * (uint64_t)(int64_t)*(const int32_t *)y; break;
        default: acci += (uint64_t)*(const int64_t *)x * (uint64_t)*(const int64_t *)y; break;
        }
      }
      char *o = po + jj * os1 * es;
      if (dt == EM_F32) *(float *)o = (float)accf;
      else if (dt == EM_F64) *(double *)o = accf;
      else if (dt == EM_I32) *(int32_t *)o = (int32_t)(uint32_t)acci;
      else *(int64_t *)o = (int64_t)acci;
    }
  }
}

void prim_matmul_ref(const prim_buf *out, const prim_buf *a, const prim_buf *b) {
  int nd = out->ndim;
  matmul_ref_job j = {out, a, b, out->sizes[nd - 2], out->sizes[nd - 1], a->sizes[nd - 1]};
  int64_t rows = batch_count(out) * j.m;
  if (rows == 0 || j.n == 0) return;
  prim_parallel_for(rows > 1 && rows * j.n * j.k >= PAR_WORK, rows, matmul_ref_rows, &j);
}

/* ---- convolution reference ----------------------------------------------------------------- */

/* The forward problem behind any of the three prims: x [N,C,H,W], w [O,C/g,kh,kw] and
 * y [N,O,Ho,Wo], each with the buffer that holds it (the result is one of them). */
typedef struct {
  int64_t x[4], w[4], y[4];
  const prim_buf *bx, *bw, *by;
} conv_problem;

static conv_problem conv_of(em_prim op, const prim_buf *out, const prim_buf *a, const prim_buf *b) {
  conv_problem c;
  c.bx = op == EM_PRIM_CONV2D_BWD_INPUT ? out : a;
  c.bw = op == EM_PRIM_CONV2D_BWD_WEIGHT ? out : b;
  c.by = op == EM_PRIM_CONV2D ? out : op == EM_PRIM_CONV2D_BWD_INPUT ? a : b;
  memcpy(c.x, c.bx->sizes, sizeof c.x);
  memcpy(c.w, c.bw->sizes, sizeof c.w);
  memcpy(c.y, c.by->sizes, sizeof c.y);
  return c;
}

static double at4(const prim_buf *b, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  int64_t off = i0 * b->strides[0] + i1 * b->strides[1] + i2 * b->strides[2] + i3 * b->strides[3];
  return b->dtype == EM_F32 ? ((const float *)b->data)[off] : ((const double *)b->data)[off];
}

typedef struct {
  em_prim op;
  const em_conv2d_params *p;
  conv_problem c;
  const prim_buf *out, *a, *b;
} conv_ref_job;

/* Each result element is computed on its own, as a sum over the forward loop nest restricted
 * to the terms that touch it (a gather), so the loop parallelises without atomics and gives
 * the same bits whatever the thread count. Elements [e0, e1) of the result, flat. */
static void conv_ref_elems(void *ctx, int64_t e0, int64_t e1) {
  const conv_ref_job *jb = ctx;
  const prim_buf *out = jb->out, *a = jb->a, *b = jb->b;
  em_prim op = jb->op;
  const int64_t *x = jb->c.x, *w = jb->c.w, *y = jb->c.y;
  int64_t cg = w[1], og = w[0] / jb->p->groups;
  const int64_t sh = jb->p->stride[0], sw = jb->p->stride[1], ph = jb->p->padding[0], pw = jb->p->padding[1];
  const int64_t dh = jb->p->dilation[0], dw = jb->p->dilation[1];
  for (int64_t e = e0; e < e1; e++) {
    int64_t i3 = e % out->sizes[3], i2 = e / out->sizes[3] % out->sizes[2];
    int64_t i1 = e / (out->sizes[3] * out->sizes[2]) % out->sizes[1];
    int64_t i0 = e / (out->sizes[3] * out->sizes[2] * out->sizes[1]);
    double acc = 0;
    if (op == EM_PRIM_CONV2D) { /* y[n,o,oh,ow] */
      int64_t n = i0, o = i1, grp = o / og;
      for (int64_t ci = 0; ci < cg; ci++)
        for (int64_t i = 0; i < w[2]; i++) {
          int64_t ih = i2 * sh - ph + i * dh;
          if (ih < 0 || ih >= x[2]) continue;
          for (int64_t j = 0; j < w[3]; j++) {
            int64_t iw = i3 * sw - pw + j * dw;
            if (iw >= 0 && iw < x[3]) acc += at4(a, n, grp * cg + ci, ih, iw) * at4(b, o, ci, i, j);
          }
        }
    } else if (op == EM_PRIM_CONV2D_BWD_INPUT) { /* dx[n,ic,ih,iw]: the (o,oh,ow) that read it */
      int64_t n = i0, grp = i1 / cg, ci = i1 % cg;
      for (int64_t o = grp * og; o < (grp + 1) * og; o++)
        for (int64_t i = 0; i < w[2]; i++) {
          int64_t th = i2 + ph - i * dh;
          if (th < 0 || th % sh || th / sh >= y[2]) continue;
          for (int64_t j = 0; j < w[3]; j++) {
            int64_t tw = i3 + pw - j * dw;
            if (tw >= 0 && tw % sw == 0 && tw / sw < y[3]) acc += at4(a, n, o, th / sh, tw / sw) * at4(b, o, ci, i, j);
          }
        }
    } else { /* dw[o,ci,i,j]: every output position times the input under tap (i,j) */
      int64_t o = i0, ci = i1, ic = o / og * cg + ci;
      for (int64_t n = 0; n < y[0]; n++)
        for (int64_t oh = 0; oh < y[2]; oh++) {
          int64_t ih = oh * sh - ph + i2 * dh;
          if (ih < 0 || ih >= x[2]) continue;
          for (int64_t ow = 0; ow < y[3]; ow++) {
            int64_t iw = ow * sw - pw + i3 * dw;
            if (iw >= 0 && iw < x[3]) acc += at4(b, n, o, oh, ow) * at4(a, n, ic, ih, iw);
          }
        }
    }
    int64_t off = i0 * out->strides[0] + i1 * out->strides[1] + i2 * out->strides[2] + i3 * out->strides[3];
    if (out->dtype == EM_F32) ((float *)out->data)[off] = (float)acc;
    else ((double *)out->data)[off] = acc;
  }
}

void prim_conv2d_ref(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *a, const prim_buf *b) {
  conv_ref_job j = {op, &at->conv, conv_of(op, out, a, b), out, a, b};
  const int64_t *w = j.c.w, *y = j.c.y;
  int64_t total = ir_numel(4, out->sizes);
  int64_t per = op == EM_PRIM_CONV2D ? w[1] * w[2] * w[3]
              : op == EM_PRIM_CONV2D_BWD_INPUT ? w[0] / at->conv.groups * w[2] * w[3]
                                                : y[0] * y[2] * y[3];
  prim_parallel_for(total > 1 && total * per >= PAR_WORK, total, conv_ref_elems, &j);
}

/* ---- GEMM through the libraries ------------------------------------------------------------ */

/* How a [rows, cols] matrix (the last two dims of b) can be handed to a row-major GEMM: 'N'
 * (row-major, leading dimension *ld), 'T' (column-major: the transpose of a row-major
 * [cols, rows] matrix), or 0 (neither: it needs a copy). The stride of a size-1 dim is never
 * used, so it does not count against either layout. */
static char gemm_layout(const prim_buf *b, int64_t rows, int64_t cols, int64_t *ld) {
  int64_t s0 = b->strides[b->ndim - 2], s1 = b->strides[b->ndim - 1];
  int64_t mr = rows > 1 ? rows : 1, mc = cols > 1 ? cols : 1;
  if ((cols <= 1 || s1 == 1) && (rows <= 1 || s0 >= mc)) return *ld = rows <= 1 ? mc : s0, 'N';
  if ((rows <= 1 || s0 == 1) && (cols <= 1 || s1 >= mr)) return *ld = cols <= 1 ? mr : s1, 'T';
  return 0;
}

/* One batched product, its operands in a layout a row-major GEMM takes: op(a) [m, k] and op(b)
 * [k, n] per batch, op given by ta/tb ('N' or 'T') with leading dimensions lda/ldb; out is
 * contiguous (the meta function's strides), so batch i starts at i*m*n and ldc = n. */
typedef struct {
  int64_t m, n, k, batches;
  prim_buf a, b;
  char ta, tb;
  int64_t lda, ldb;
  const prim_buf *out;
  bool epi;           /* an epilogue (f32 only): act(product + bias) into epi_out */
  const float *bias;  /* n floats, or NULL */
  prim_activation act;
  float *epi_out;     /* laid out as out (out->data itself: in place) */
} gemm_job;

/* Tiles. Every product is cut into tiles (batch, block of rows, block of columns) and the tiles
 * run on Ember's pool, each one a single-threaded library call. The cut depends only on the
 * shapes, so a result has the same bits whatever the thread count; a library that threads one
 * call itself changes them with the count (oneDNN's sgemm gives other bits for other column
 * widths of the same product: measured for 128x512x784 with b transposed). And no library thread
 * pool runs beside Ember's: oneDNN here is built on OpenMP, whose idle threads spin at barriers
 * and starve a busy machine (prims/pool.c), and OpenBLAS is a pthreads build that would
 * oversubscribe the cores when called from several threads.
 *
 * Sizes, measured one thread against one uncut call (oneDNN, this machine): cutting rows costs
 * 0-10% while blocks keep 64 rows, cutting columns 0-3% in blocks of 256 but up to 30% in
 * blocks of 64 or of widths off a multiple of 16 (with b transposed: the forward of
 * em_linear), and cutting 128x512x784 into 24 small tiles took twice as long. So a tile has
 * about TILE_WORK multiply-adds (about 50 us on one core), rows are cut first, in blocks of
 * at least TILE_ROWS (multiples of 16), then columns in blocks of at least TILE_COLS
 * (multiples of 64), into at most MAX_TILES per product. */
#define TILE_WORK ((double)(1 << 22))
enum { TILE_ROWS = 64, TILE_COLS = 256, MAX_TILES = 64 };

typedef struct {
  const gemm_job *g;
  int64_t mb, nb;           /* row and column blocks per product */
  _Atomic int bad;          /* the first failed library status, 0 when none */
} gemm_tiles;

static void plan_tiles(const gemm_job *g, gemm_tiles *t) {
  double want = (double)g->m * (double)g->n * (double)g->k / TILE_WORK;
  int64_t tiles = want >= MAX_TILES ? MAX_TILES : want >= 1 ? (int64_t)want : 1;
  int64_t rmax = g->m / TILE_ROWS > 1 ? g->m / TILE_ROWS : 1, cmax = g->n / TILE_COLS > 1 ? g->n / TILE_COLS : 1;
  t->mb = tiles < rmax ? tiles : rmax;
  t->nb = tiles / t->mb < cmax ? tiles / t->mb : cmax;
}

/* Where block j of nb starts along a dim of n, in units of unit (the last block ends at n). */
static int64_t block_start(int64_t n, int64_t j, int64_t nb, int64_t unit) {
  int64_t b = (n + unit - 1) / unit * j / nb * unit;
  return b < n ? b : n;
}

/* Tile q: its product, its rows [r0, r1) and columns [c0, c1), and the operands' first elements
 * there (a row block of op(a) starts r0 rows down ('N') or r0 columns across ('T'); a column
 * block of op(b) starts c0 columns across ('N') or c0 rows down ('T')). */
typedef struct {
  int64_t rows, cols, aoff, boff, coff, c0;
} tile;

static tile tile_of(const gemm_tiles *t, int64_t q) {
  const gemm_job *g = t->g;
  int64_t per = t->mb * t->nb, i = q / per, rb = q % per / t->nb, cb = q % t->nb;
  int64_t r0 = block_start(g->m, rb, t->mb, 16), r1 = block_start(g->m, rb + 1, t->mb, 16);
  int64_t c0 = block_start(g->n, cb, t->nb, 64), c1 = block_start(g->n, cb + 1, t->nb, 64);
  return (tile){r1 - r0, c1 - c0, batch_offset(&g->a, i) + (g->ta == 'N' ? r0 * g->lda : r0),
                batch_offset(&g->b, i) + (g->tb == 'N' ? c0 : c0 * g->ldb), i * g->m * g->n + r0 * g->n + c0, c0};
}

/* ---- GEMM epilogues ----------------------------------------------------------------------
 *
 * act(y [+ bias]) on a block of the product y (rows x cols, leading dimension ld) into the same
 * block of dst (y itself, or another buffer when the product is kept too), with eager's f32
 * operations in eager's order (runtime/composite.c: em_relu, em_gelu) and the tanh and erf of the
 * generated kernels (prims/fast_f32.h: the same rational functions, the same fused multiply-adds;
 * SLEEF's tanh u10, eager's, made the epilogue slower than the kernel it replaces: the
 * transformer's inference step took 49.8 ms of CPU time against 45.7 unfused). A row's tail is
 * padded into a vector, so an element's bits do not depend on its column: the results are those
 * of the generated kernel the epilogue stands for (and eager's for the bias and ReLU). The bias is added to the rounded product, as eager's add does (no fused
 * multiply-add: C11 mode compiles with -ffp-contract=off). It runs on each tile of a GEMM right
 * after the library wrote it: the tile (about TILE_WORK / k floats, at most a few hundred KiB)
 * is still in cache, so the epilogue makes no pass over the product in memory, where a separate
 * kernel reads the product back and writes its result.
 *
 * Why this (issue 20's option b) and not oneDNN's matmul primitive with bias and eltwise
 * post-ops (option a). Measured with one thread, CPU time, medians of 21, on the benchmarks'
 * shapes (M x K x N, weights transposed as em_linear has them): the primitive (brgemm,
 * avx512_core) computes the product itself as fast or faster than these sgemm tiles (128x784x512
 * 0.47 against 0.50 ms, 128x512x512 0.31 against 0.42, 2048x256x1024 5.36 against 5.18,
 * 2048x1024x256 4.86 against 6.62) and its GELU post-op costs next to nothing, where the epilogue
 * here adds 0.01 ms to the ReLU products and about 1.1 ms to the 2048x1024 GELU ones. But the
 * primitive writes only the activated result, and every epilogue of the benchmarks' training
 * steps must store the product too (the backward reads it: ind_epilogue.keep); its post-ops add
 * the bias to the accumulator and apply oneDNN's own tanh and erf, so compiled results would
 * leave both eager's bits and the unfused program's; and each tile shape needs a primitive made
 * (0.5-37 ms) and cached, run one thread a tile as here to keep results independent of the
 * thread count. The faster GEMM core is a case for moving every f32 GEMM to the primitive, a
 * change of its own (it changes eager's bits too), after which this epilogue runs on its tiles
 * as it runs on sgemm's. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* One row loop per vector width, from one body: LANES lanes of type V, the tail padded. */
#define EPI_BLOCK(NAME, V, LANES, LOAD, STORE, SET1, ADD, MUL, RELU, TANH, ERF)                                  \
  static V NAME##_act(V h, prim_activation act) {                                                              \
    switch (act) {                                                                                             \
    case PRIM_ACT_RELU: return RELU(h);                                                                        \
    case PRIM_ACT_GELU_TANH: {                                                                                 \
      V cube = MUL(MUL(h, h), h);                                                                              \
      V u = MUL(ADD(h, MUL(cube, SET1((float)0.044715))), SET1((float)0.7978845608028654));                    \
      return MUL(MUL(h, SET1(0.5f)), ADD(TANH(u), SET1(1.0f)));                                                \
    }                                                                                                          \
    case PRIM_ACT_GELU_ERF:                                                                                    \
      return MUL(MUL(h, SET1(0.5f)), ADD(ERF(MUL(h, SET1((float)0.7071067811865476))), SET1(1.0f)));          \
    default: return h;                                                                                         \
    }                                                                                                          \
  }                                                                                                            \
  static void NAME(const float *y, float *dst, int64_t ld, int64_t rows, int64_t cols, const float *bias,       \
                   prim_activation act) {                                                                      \
    float lanes[LANES];                                                                                        \
    for (int64_t r = 0; r < rows; r++) {                                                                       \
      const float *src = y + r * ld;                                                                           \
      float *d = dst + r * ld;                                                                                 \
      int64_t j = 0;                                                                                           \
      for (; j + LANES <= cols; j += LANES) {                                                                  \
        V h = LOAD(src + j);                                                                                   \
        if (bias) h = ADD(h, LOAD(bias + j));                                                                  \
        STORE(d + j, NAME##_act(h, act));                                                                      \
      }                                                                                                        \
      if (j == cols) continue;                                                                                 \
      for (int64_t k = 0; k < LANES; k++)                                                                      \
        lanes[k] = j + k >= cols ? 0.0f : bias ? src[j + k] + bias[j + k] : src[j + k];                        \
      STORE(lanes, NAME##_act(LOAD(lanes), act));                                                              \
      for (int64_t k = 0; j + k < cols; k++) d[j + k] = lanes[k];                                              \
    }                                                                                                          \
  }

/* where(h <= 0, 0, h): NaN stays */
static __m256 relu8(__m256 h) { return _mm256_andnot_ps(_mm256_cmp_ps(h, _mm256_setzero_ps(), _CMP_LE_OQ), h); }

/* The generated kernels' tanh and erf (inductor/codegen.c: fast_tanh_f32, fast_erf_f32), the
 * same instructions in the same order, so the same bits: a clamp that lets NaN through, Horner's
 * rule in fused multiply-adds, one division. */
#define FAST_F32(NAME, V, SET1, MUL, DIV, FMA, SEL, GT, LT, ABS)                                                \
  static V NAME##_horner(V t, const float *k, int n) {                                                         \
    V p = SET1(k[0]);                                                                                          \
    for (int i = 1; i < n; i++) p = FMA(p, t, SET1(k[i]));                                                     \
    return p;                                                                                                  \
  }                                                                                                            \
  static V NAME##_clamp(V a, float lim) {                                                                      \
    V x = SEL(GT(a, SET1(lim)), SET1(lim), a);                                                                 \
    return SEL(LT(x, SET1(-lim)), SET1(-lim), x);                                                              \
  }                                                                                                            \
  static V NAME##_tanh(V a) {                                                                                  \
    V x = NAME##_clamp(a, FAST_TANH_LIM), x2 = MUL(x, x);                                                      \
    V q = DIV(NAME##_horner(x2, fast_tanh_num, 7), NAME##_horner(x2, fast_tanh_den, 4));                       \
    V abs = ABS(a), sign1 = SEL(GT(a, SET1(0.0f)), SET1(1.0f), SET1(-1.0f));                                   \
    V r = SEL(GT(abs, SET1(FAST_TANH_LIM)), sign1, MUL(x, q));                                                 \
    return SEL(LT(abs, SET1(FAST_TANH_TINY)), a, r);                                                           \
  }                                                                                                            \
  static V NAME##_erf(V a) {                                                                                   \
    V x = NAME##_clamp(a, FAST_ERF_LIM), x2 = MUL(x, x);                                                       \
    return MUL(x, DIV(NAME##_horner(x2, fast_erf_num, 7), NAME##_horner(x2, fast_erf_den, 5)));                \
  }

/* SEL(m, a, b): a where m, else b */
#define SEL8(m, a, b) _mm256_blendv_ps((b), (a), (m))
#define GT8(a, b) _mm256_cmp_ps((a), (b), _CMP_GT_OQ)
#define LT8(a, b) _mm256_cmp_ps((a), (b), _CMP_LT_OQ)
#define ABS8(a) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), (a))
FAST_F32(fast8, __m256, _mm256_set1_ps, _mm256_mul_ps, _mm256_div_ps, _mm256_fmadd_ps, SEL8, GT8, LT8, ABS8)
EPI_BLOCK(epilogue_block8, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_mul_ps,
          relu8, fast8_tanh, fast8_erf)

/* 16 lanes where the build and EMBER_CPU_ISA allow AVX-512 (em_cpu_isa): every lane computes the
 * same instructions, so the 16-lane functions give the 8-lane ones' bits at about half the cost,
 * and the tanh is most of a GELU epilogue's work. */
#ifdef __AVX512F__
static __m512 relu16(__m512 h) {
  return _mm512_mask_mov_ps(h, _mm512_cmp_ps_mask(h, _mm512_setzero_ps(), _CMP_LE_OQ), _mm512_setzero_ps());
}
#define SEL16(m, a, b) _mm512_mask_mov_ps((b), (m), (a))
#define GT16(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_GT_OQ)
#define LT16(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ)
#define ABS16(a) _mm512_abs_ps(a)
FAST_F32(fast16, __m512, _mm512_set1_ps, _mm512_mul_ps, _mm512_div_ps, _mm512_fmadd_ps, SEL16, GT16, LT16, ABS16)
EPI_BLOCK(epilogue_block16, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_add_ps, _mm512_mul_ps,
          relu16, fast16_tanh, fast16_erf)
#endif

static void epilogue_block(const float *y, float *dst, int64_t ld, int64_t rows, int64_t cols, const float *bias,
                           prim_activation act) {
#ifdef __AVX512F__
  if (!strcmp(em_cpu_isa(), "avx512")) {
    epilogue_block16(y, dst, ld, rows, cols, bias, act);
    return;
  }
#endif
  epilogue_block8(y, dst, ld, rows, cols, bias, act);
}
#else
/* one lane of FAST_F32 above, fmaf rounding once as the vector FMAs do */
static float fast1_horner(float t, const float *k, int n) {
  float p = k[0];
  for (int i = 1; i < n; i++) p = fmaf(p, t, k[i]);
  return p;
}
static float fast1_clamp(float a, float lim) { return a < -lim ? -lim : a > lim ? lim : a; }
static float fast1_tanh(float a) {
  float x = fast1_clamp(a, FAST_TANH_LIM), x2 = x * x, abs = fabsf(a);
  float q = fast1_horner(x2, fast_tanh_num, 7) / fast1_horner(x2, fast_tanh_den, 4);
  float r = abs > FAST_TANH_LIM ? (a > 0 ? 1.0f : -1.0f) : x * q;
  return abs < FAST_TANH_TINY ? a : r;
}
static float fast1_erf(float a) {
  float x = fast1_clamp(a, FAST_ERF_LIM), x2 = x * x;
  return x * (fast1_horner(x2, fast_erf_num, 7) / fast1_horner(x2, fast_erf_den, 5));
}

static float epi_one(float h, prim_activation act) {
  switch (act) {
  case PRIM_ACT_RELU: return h <= 0 ? 0.0f : h;
  case PRIM_ACT_GELU_TANH: {
    float u = (h + h * h * h * (float)0.044715) * (float)0.7978845608028654;
    return h * 0.5f * (fast1_tanh(u) + 1.0f);
  }
  case PRIM_ACT_GELU_ERF: return h * 0.5f * (fast1_erf(h * (float)0.7071067811865476) + 1.0f);
  default: return h;
  }
}

static void epilogue_block(const float *y, float *dst, int64_t ld, int64_t rows, int64_t cols, const float *bias,
                           prim_activation act) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) dst[r * ld + j] = epi_one(bias ? y[r * ld + j] + bias[j] : y[r * ld + j], act);
}
#endif

/* One tile's epilogue: the block at element offset off, its columns from c0. */
static void epilogue_tile(const gemm_job *g, int64_t off, int64_t rows, int64_t cols, int64_t c0) {
  epilogue_block((const float *)g->out->data + off, g->epi_out + off, g->n, rows, cols, g->bias ? g->bias + c0 : NULL,
                 g->act);
}

typedef struct {
  const gemm_job *g;
} epilogue_job;

/* Rows [r0, r1) of all the products' rows (out is contiguous), for the paths without tiles. */
static void epilogue_rows(void *ctx, int64_t r0, int64_t r1) {
  const gemm_job *g = ((const epilogue_job *)ctx)->g;
  epilogue_tile(g, r0 * g->n, r1 - r0, g->n, 0);
}

static void epilogue_all(const gemm_job *g) {
  epilogue_job j = {g};
  int64_t rows = g->batches * g->m;
  prim_parallel_for(rows > 1 && rows * g->n >= PAR_WORK, rows, epilogue_rows, &j);
}

#ifdef EMBER_HAVE_DNNL
/* A failed oneDNN status as Ember's error: out of memory in the words every allocation failure
 * uses; returns false. */
static bool dnnl_fail(char *err, size_t cap, const char *what, dnnl_status_t st) {
  if (st == dnnl_out_of_memory) snprintf(err, cap, "out of memory in oneDNN %s", what);
  else snprintf(err, cap, "oneDNN %s failed: %s", what, dnnl_status2str(st));
  return false;
}

/* oneDNN's OpenMP build threads a call (and sizes a primitive when it makes one) over
 * omp_get_max_threads() of the calling thread, unless that thread is inside an active parallel
 * region. Ember's threads are no OpenMP threads, so every oneDNN call is bracketed by these two:
 * the calling thread's OpenMP thread count is 1 during the call (a per-thread setting, put back
 * after; OMP_NUM_THREADS and the user's other threads are untouched), and oneDNN runs the call on
 * that thread without opening a parallel region, so libgomp starts no threads at all. */
static int dnnl_one_thread(void) {
  int nt = omp_get_max_threads();
  if (nt != 1) omp_set_num_threads(1);
  return nt;
}
static void dnnl_threads_back(int nt) {
  if (nt != 1) omp_set_num_threads(nt);
}

/* EMBER_CPU_ISA=avx2 (em_cpu_isa, runtime/isa.c) holds oneDNN's JIT to AVX2 kernels as well. It
 * must be said before oneDNN makes its first kernel (later it is refused), so every entry into
 * oneDNN (the GEMM tiles and the convolutions' engine) passes here first. */
static bool dnnl_avx512; /* oneDNN runs its AVX-512 kernels (set once, by dnnl_isa) */
static void dnnl_isa_init(void) {
  if (!strcmp(em_cpu_isa(), "avx2")) dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
  dnnl_avx512 = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}
static void dnnl_isa(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, dnnl_isa_init);
}

/* Records the first failed status of a job's tasks. */
static void note_failure(_Atomic int *bad, dnnl_status_t st) {
  int none = dnnl_success;
  if (st != dnnl_success) atomic_compare_exchange_strong(bad, &none, (int)st);
}

static void sgemm_tile(void *ctx, int64_t q) {
  gemm_tiles *t = ctx;
  const gemm_job *g = t->g;
  tile x = tile_of(t, q);
  if (!x.rows || !x.cols) return;
  int nt = dnnl_one_thread();
  dnnl_status_t st = prim_dnnl_sgemm(g->ta, g->tb, x.rows, x.cols, g->k, 1.0f, (const float *)g->a.data + x.aoff,
                                     g->lda, (const float *)g->b.data + x.boff, g->ldb, 0.0f,
                                     (float *)g->out->data + x.coff, g->n);
  dnnl_threads_back(nt);
  note_failure(&t->bad, st);
  if (g->epi && st == dnnl_success) epilogue_tile(g, x.coff, x.rows, x.cols, x.c0);
}
#endif

#ifdef EMBER_HAVE_BLAS
/* OpenBLAS runs every call on its calling thread (see Tiles). */
static void blas_init(void) { openblas_set_num_threads(1); }

static void dgemm_tile(void *ctx, int64_t q) {
  gemm_tiles *t = ctx;
  const gemm_job *g = t->g;
  tile x = tile_of(t, q);
  if (!x.rows || !x.cols) return;
  cblas_dgemm(CblasRowMajor, g->ta == 'T' ? CblasTrans : CblasNoTrans, g->tb == 'T' ? CblasTrans : CblasNoTrans,
              (int)x.rows, (int)x.cols, (int)g->k, 1.0, (const double *)g->a.data + x.aoff, (int)g->lda,
              (const double *)g->b.data + x.boff, (int)g->ldb, 0.0, (double *)g->out->data + x.coff, (int)g->n);
}
#endif

/* The product through the library for its dtype, tile by tile. */
static bool gemm_lib(const gemm_job *g, char *err, size_t cap) {
  gemm_tiles t = {.g = g};
  plan_tiles(g, &t);
  atomic_init(&t.bad, 0);
  int64_t n = g->batches * t.mb * t.nb;
#ifdef EMBER_HAVE_DNNL
  if (g->out->dtype == EM_F32) {
    dnnl_isa();
    prim_parallel(n, sgemm_tile, &t);
    int bad = atomic_load(&t.bad);
    return bad == dnnl_success || dnnl_fail(err, cap, "sgemm", (dnnl_status_t)bad);
  }
#endif
#ifdef EMBER_HAVE_BLAS
  if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX || g->lda > INT_MAX || g->ldb > INT_MAX) {
    prim_matmul_ref(g->out, &g->a, &g->b); /* beyond a 32-bit BLAS interface */
    return true;
  }
  static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
  pthread_once(&blas_once, blas_init);
  prim_parallel(n, dgemm_tile, &t);
#endif
  (void)err, (void)cap, (void)n;
  return true;
}

/* The product into out, and with epi (f32) its epilogue (gemm_job) into epi_out. */
static bool gemm(const prim_buf *out, const prim_buf *a_in, const prim_buf *b_in, bool epi, const float *bias,
                 prim_activation act, float *epi_out, char *err, size_t cap) {
  int nd = out->ndim;
  gemm_job g = {.m = out->sizes[nd - 2], .n = out->sizes[nd - 1], .k = a_in->sizes[nd - 1], .batches = batch_count(out),
                .a = *a_in, .b = *b_in, .out = out, .epi = epi, .bias = bias, .act = act, .epi_out = epi_out};
  if (g.batches == 0 || g.m == 0 || g.n == 0) return true;
  if (g.k == 0) {
    zero(out);
    if (epi) epilogue_all(&g);
    return true;
  }
  bool lib = false;
#ifdef EMBER_HAVE_DNNL
  lib |= out->dtype == EM_F32;
#endif
#ifdef EMBER_HAVE_BLAS
  lib |= out->dtype == EM_F64;
#endif
  if (!lib) {
    prim_matmul_ref(out, a_in, b_in);
    if (epi) epilogue_all(&g);
    return true;
  }
  void *ca = NULL, *cb = NULL;
  g.ta = gemm_layout(a_in, g.m, g.k, &g.lda);
  g.tb = gemm_layout(b_in, g.k, g.n, &g.ldb);
  if (!g.ta) {
    if (!compact(a_in, nd - 2, &g.a, &ca, err, cap)) return false;
    g.ta = 'N', g.lda = g.k;
  }
  if (!g.tb) {
    if (!compact(b_in, nd - 2, &g.b, &cb, err, cap)) return free(ca), false;
    g.tb = 'N', g.ldb = g.n;
  }
  void *pa = NULL, *pb = NULL;
#ifdef EMBER_HAVE_DNNL
  if (out->dtype == EM_F32 && (double)g.m * (double)g.n * (double)g.k >= TILE_WORK) {
    dnnl_isa();
    if (dnnl_avx512 ? aliasing_ld(g.ldb, EM_F32, 4096) && g.m >= 256
                    : g.tb == 'N' && aliasing_ld(g.ldb, EM_F32, 2048) && g.m >= 64)
      pad_operand(&g.b, g.tb, &g.ldb, &g.b, &pb);
    if (!dnnl_avx512 && g.ta == 'T' && aliasing_ld(g.lda, EM_F32, 2048) && g.n >= 64)
      pad_operand(&g.a, g.ta, &g.lda, &g.a, &pa);
  }
#endif
  bool ok = gemm_lib(&g, err, cap);
  free(pa);
  free(pb);
  free(ca);
  free(cb);
  return ok;
}

/* ---- convolution through oneDNN ------------------------------------------------------------ */

#ifdef EMBER_HAVE_DNNL

/* Layout. Ember's tensors are plain nchw/oihw, on which oneDNN only offers its im2col + GEMM
 * convolution. Letting it choose (format "any") gets its direct JIT kernels on channel-blocked
 * layouts (nChw16c and the like) instead, and reordering operands in and the result out costs
 * little beside them: measured at two threads on LeNet's two layers and six other 3x3, 5x5
 * and 7x7 layers, 1.3-9x faster, reorders included (on a par for 1x1). The exception is the
 * input gradient when a group has under 4 input channels (a first layer): the blocked result
 * pads those channels to 16 and the plain GEMM path is 1.5-3.5x faster, so that one stays
 * plain. The choice depends only on the problem, never on a timing, so results are
 * reproducible from run to run.
 *
 * Threads. A convolution runs on Ember's pool as chunks of the batch, each chunk one
 * single-threaded oneDNN call (dnnl_one_thread; the GEMM tiles' section says why no OpenMP
 * thread runs). The chunks depend only on the problem (about CONV_WORK multiply-adds each, at
 * most MAX_CONV_CHUNKS), so results have the same bits for any thread count: the forward and
 * the input gradient compute each image on its own, and the weight gradient, a sum over the
 * batch, sums each chunk's partial gradient into the result in chunk order. (oneDNN threading
 * one call itself splits that sum by its thread count, so its bits changed with it.)
 *
 * Caching. One CPU engine and the primitives made on it, keyed by problem (a chunk's batch, at
 * most two sizes per convolution). Making a primitive (choosing and
 * JIT-compiling a kernel) costs far more than running a small convolution, and training runs
 * the same few problems every step. Entries live as long as the process, so none is destroyed
 * under a thread still running it; they stay reachable from these statics, so leak checkers
 * stay quiet, and a model has a handful of problems. Once the table is full, further problems
 * get primitives made for the call.
 *
 * Scratch. Every primitive runs on memory Ember hands it (oneDNN's user scratchpad mode): the
 * library-managed scratchpad may not serve a primitive from a thread other than the one that
 * made it, and concurrent calls crash there, while with scratch per call one primitive can run
 * on any thread, from several at once. One buffer per call holds the convolution's
 * scratchpad, the reordered copies of its arguments and the reorders' scratchpads; an entry
 * keeps SCRATCH_SLOTS such buffers, each lent to one call at a time (the chunks of a
 * convolution run on several threads at once), and a call that finds them all lent allocates
 * its own. */
#define CONV_WORK ((double)(1 << 22))
enum { MAX_CONV_CHUNKS = 64, SCRATCH_SLOTS = 8 };

/* A piece of the call's scratch buffer: its layout and byte offset (size 0: not used). */
typedef struct {
  dnnl_memory_desc_t md;
  size_t at;
} region;

/* One argument of the convolution: Ember's layout, and when the primitive wants another, the
 * reorder into it (operands) or out of it (the result) and where the reordered copy lives. */
typedef struct {
  dnnl_memory_desc_t user;
  dnnl_primitive_t reorder;
  region inner, reorder_scratch;
} conv_arg;

typedef struct {
  em_prim op;
  int64_t x[4], w[4], y[4];
  em_conv2d_params p;
  dnnl_primitive_t prim;
  conv_arg arg[3]; /* x, w, y */
  region scratch_pad;
  size_t scratch_bytes;
  void *scratch[SCRATCH_SLOTS]; /* each allocated on first use; lent to one call at a time (busy) */
  bool busy[SCRATCH_SLOTS];
} conv_entry;

enum { CONV_CACHE = 64 };
static dnnl_engine_t engine;
static conv_entry conv_cache[CONV_CACHE];
static int conv_cached;
static pthread_mutex_t conv_lock = PTHREAD_MUTEX_INITIALIZER; /* the engine, the table, busy */

/* The argument a prim writes: y, x or w. */
static int result_arg(em_prim op) { return op == EM_PRIM_CONV2D ? 2 : op == EM_PRIM_CONV2D_BWD_INPUT ? 0 : 1; }

/* x or y as nchw, or w as oihw; grouped weights [O, C/g, kh, kw] are, byte for byte, goihw
 * [g, O/g, C/g, kh, kw]. With any set, the same dims with the layout left to oneDNN. */
static dnnl_status_t conv_desc(dnnl_memory_desc_t *md, int which, const int64_t *s, int64_t groups, bool any) {
  if (which == 1 && groups > 1) {
    dnnl_dims_t d = {groups, s[0] / groups, s[1], s[2], s[3]};
    return dnnl_memory_desc_init_by_tag(md, 5, d, dnnl_f32, any ? dnnl_format_tag_any : dnnl_goihw);
  }
  dnnl_dims_t d = {s[0], s[1], s[2], s[3]};
  return dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw);
}

/* md NULL: the query that produced it failed. */
static dnnl_status_t place(region *r, const dnnl_memory_desc_t *md, size_t *total) {
  if (!md) return dnnl_runtime_error;
  r->md = *md;
  r->at = *total;
  *total += (dnnl_memory_desc_get_size(md) + 63) / 64 * 64; /* 64-byte aligned, for vector access */
  return dnnl_success;
}

static void conv_entry_destroy(conv_entry *e) {
  if (e->prim) dnnl_primitive_destroy(e->prim);
  for (int i = 0; i < 3; i++)
    if (e->arg[i].reorder) dnnl_primitive_destroy(e->arg[i].reorder);
}

/* Makes e's primitive, its reorders and the plan of its scratch buffer for e's problem. */
static dnnl_status_t make_conv(conv_entry *e) {
  const em_conv2d_params *p = &e->p;
  const int64_t *dims[3] = {e->x, e->w, e->y};
  bool blocked = !(e->op == EM_PRIM_CONV2D_BWD_INPUT && e->w[1] < 4);
  dnnl_memory_desc_t md[3];
  dnnl_status_t st = dnnl_success;
  for (int i = 0; i < 3 && st == dnnl_success; i++) {
    st = conv_desc(&e->arg[i].user, i, dims[i], p->groups, false);
    if (st == dnnl_success) st = conv_desc(&md[i], i, dims[i], p->groups, blocked);
  }
  /* oneDNN counts dilation from 0 (no gaps). Padding is symmetric as in torch: the output size
   * (floor division) already drops the rows a larger right pad would reach. */
  dnnl_dims_t strides = {p->stride[0], p->stride[1]}, dil = {p->dilation[0] - 1, p->dilation[1] - 1};
  dnnl_dims_t pad = {p->padding[0], p->padding[1]};
  dnnl_convolution_desc_t fd, bd;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_primitive_desc_t fpd = NULL, pd = NULL, rpd = NULL;
  if (st == dnnl_success) st = prim_dnnl_primitive_attr_create(&attr);
  if (st == dnnl_success) st = prim_dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (st == dnnl_success)
    st = prim_dnnl_conv_forward_desc_init(&fd, &md[0], &md[1], &md[2], strides, dil, pad);
  if (st == dnnl_success) st = prim_dnnl_primitive_desc_create(&fpd, &fd, attr, engine, NULL);
  if (st == dnnl_success && e->op == EM_PRIM_CONV2D) {
    pd = fpd, fpd = NULL;
  } else if (st == dnnl_success) {
    /* The backward primitives take the forward one as a hint of the layouts it chose. */
    if (e->op == EM_PRIM_CONV2D_BWD_INPUT)
      st = prim_dnnl_conv_backward_data_desc_init(&bd, &md[0], &md[1], &md[2], strides, dil, pad);
    else
      st = prim_dnnl_conv_backward_weights_desc_init(&bd, &md[0], &md[1], &md[2], strides, dil, pad);
    if (st == dnnl_success) st = prim_dnnl_primitive_desc_create(&pd, &bd, attr, engine, fpd);
  }
  size_t total = 0;
  if (st == dnnl_success) {
    st = place(&e->scratch_pad, dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0), &total);
    if (st == dnnl_success) st = prim_dnnl_primitive_create(&e->prim, pd);
  }
  const dnnl_query_t query[3] = {e->op == EM_PRIM_CONV2D_BWD_INPUT ? dnnl_query_diff_src_md : dnnl_query_src_md,
                                 e->op == EM_PRIM_CONV2D_BWD_WEIGHT ? dnnl_query_diff_weights_md : dnnl_query_weights_md,
                                 e->op == EM_PRIM_CONV2D ? dnnl_query_dst_md : dnnl_query_diff_dst_md};
  for (int i = 0; i < 3 && st == dnnl_success; i++) {
    conv_arg *a = &e->arg[i];
    const dnnl_memory_desc_t *inner = dnnl_primitive_desc_query_md(pd, query[i], 0);
    if (inner && dnnl_memory_desc_equal(inner, &a->user)) continue;
    if ((st = place(&a->inner, inner, &total)) != dnnl_success) break;
    bool out = i == result_arg(e->op);
    const dnnl_memory_desc_t *from = out ? inner : &a->user, *to = out ? &a->user : inner;
    st = prim_dnnl_reorder_primitive_desc_create(&rpd, from, engine, to, engine, attr);
    if (st == dnnl_success) {
      st = place(&a->reorder_scratch, dnnl_primitive_desc_query_md(rpd, dnnl_query_scratchpad_md, 0), &total);
      if (st == dnnl_success) st = prim_dnnl_primitive_create(&a->reorder, rpd);
    }
    if (rpd) dnnl_primitive_desc_destroy(rpd), rpd = NULL;
  }
  e->scratch_bytes = total;
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (fpd) dnnl_primitive_desc_destroy(fpd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (st != dnnl_success) conv_entry_destroy(e);
  return st;
}

static bool same_problem(const conv_entry *e, const conv_entry *k) {
  return e->op == k->op && !memcmp(e->x, k->x, sizeof e->x) &&
         !memcmp(e->w, k->w, sizeof e->w) && !memcmp(e->y, k->y, sizeof e->y) &&
         !memcmp(e->p.stride, k->p.stride, sizeof e->p.stride) &&
         !memcmp(e->p.padding, k->p.padding, sizeof e->p.padding) &&
         !memcmp(e->p.dilation, k->p.dilation, sizeof e->p.dilation) && e->p.groups == k->p.groups;
}

/* What one call runs with: an entry, from the table or made for this call only (own, when the
 * table is full), and a scratch buffer, the entry's (borrowed: handed back after the call) or
 * allocated for this call. */
typedef struct {
  conv_entry *e;
  void *scratch;
  int slot; /* the entry's scratch buffer borrowed, or -1 */
  bool own;
} conv_lease;

static void *scratch_alloc(size_t bytes) { return aligned_alloc(64, bytes); /* a multiple of 64 */ }

/* Lookup, creation and the claim on an entry's scratch happen in one critical section, so two
 * threads never make the same primitive or share scratch. An entry is not written after it is
 * made, except for scratch and busy, which only change in here. */
static dnnl_status_t conv_acquire(const conv_entry *key, conv_lease *l) {
  dnnl_status_t st = dnnl_success;
  conv_entry *e = NULL;
  *l = (conv_lease){.slot = -1};
  dnnl_isa();
  pthread_mutex_lock(&conv_lock);
  if (!engine) st = prim_dnnl_engine_create(&engine, dnnl_cpu, 0);
  for (int i = 0; st == dnnl_success && i < conv_cached && !e; i++)
    if (same_problem(&conv_cache[i], key)) e = &conv_cache[i];
  if (st == dnnl_success && !e) {
    bool table = conv_cached < CONV_CACHE;
    if (!(e = table ? &conv_cache[conv_cached] : malloc(sizeof *e))) {
      st = dnnl_out_of_memory;
    } else {
      *e = *key;
      if ((st = make_conv(e)) != dnnl_success) {
        if (!table) free(e);
      } else if (table) {
        conv_cached++;
      } else {
        l->own = true;
      }
    }
  }
  for (int i = 0; st == dnnl_success && !l->own && e->scratch_bytes && l->slot < 0 && i < SCRATCH_SLOTS; i++)
    if (!e->busy[i] && (e->scratch[i] || (e->scratch[i] = scratch_alloc(e->scratch_bytes)))) {
      e->busy[i] = true;
      l->slot = i;
      l->scratch = e->scratch[i];
    }
  pthread_mutex_unlock(&conv_lock);
  if (st != dnnl_success) return st;
  l->e = e;
  /* No scratch yet: the entry's are in use by concurrent calls, or the entry is the call's. */
  if (e->scratch_bytes && !l->scratch && !(l->scratch = scratch_alloc(e->scratch_bytes))) return dnnl_out_of_memory;
  return dnnl_success;
}

static void conv_release(const conv_lease *l) {
  if (l->slot >= 0) {
    pthread_mutex_lock(&conv_lock);
    l->e->busy[l->slot] = false;
    pthread_mutex_unlock(&conv_lock);
  } else {
    free(l->scratch);
  }
  if (l->own) {
    conv_entry_destroy(l->e);
    free(l->e);
  }
}

/* A memory object of layout md over Ember's buffer or a region of the scratch buffer. */
static dnnl_status_t wrap(dnnl_memory_t *m, const dnnl_memory_desc_t *md, void *ptr) {
  return prim_dnnl_memory_create(m, md, engine, ptr);
}

static dnnl_status_t run_conv(const conv_entry *e, char *scratch, char *data[3]) {
  dnnl_memory_t user[3] = {NULL}, inner[3] = {NULL}, rscratch[3] = {NULL}, pad = NULL;
  dnnl_stream_t stream = NULL;
  dnnl_status_t st = prim_dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
  for (int i = 0; i < 3 && st == dnnl_success; i++) {
    const conv_arg *a = &e->arg[i];
    if ((st = wrap(&user[i], &a->user, data[i])) != dnnl_success) break;
    if (!a->reorder) continue;
    if ((st = wrap(&inner[i], &a->inner.md, scratch + a->inner.at)) == dnnl_success &&
        dnnl_memory_desc_get_size(&a->reorder_scratch.md))
      st = wrap(&rscratch[i], &a->reorder_scratch.md, scratch + a->reorder_scratch.at);
  }
  if (st == dnnl_success && dnnl_memory_desc_get_size(&e->scratch_pad.md))
    st = wrap(&pad, &e->scratch_pad.md, scratch + e->scratch_pad.at);
  int out = result_arg(e->op);
  /* Operands into the primitive's layouts, the convolution, the result back into Ember's. A
   * CPU stream runs in order, so one wait at the end covers all. */
  for (int i = 0; i < 3 && st == dnnl_success; i++)
    if (i != out && e->arg[i].reorder) {
      dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, user[i]}, {DNNL_ARG_TO, inner[i]}, {DNNL_ARG_SCRATCHPAD, rscratch[i]}};
      st = prim_dnnl_primitive_execute(e->arg[i].reorder, stream, rscratch[i] ? 3 : 2, args);
    }
  if (st == dnnl_success) {
    dnnl_memory_t m[3];
    for (int i = 0; i < 3; i++) m[i] = inner[i] ? inner[i] : user[i];
    dnnl_exec_arg_t args[4] = {{e->op == EM_PRIM_CONV2D_BWD_INPUT ? DNNL_ARG_DIFF_SRC : DNNL_ARG_SRC, m[0]},
                               {e->op == EM_PRIM_CONV2D_BWD_WEIGHT ? DNNL_ARG_DIFF_WEIGHTS : DNNL_ARG_WEIGHTS, m[1]},
                               {e->op == EM_PRIM_CONV2D ? DNNL_ARG_DST : DNNL_ARG_DIFF_DST, m[2]},
                               {DNNL_ARG_SCRATCHPAD, pad}};
    st = prim_dnnl_primitive_execute(e->prim, stream, pad ? 4 : 3, args);
  }
  if (st == dnnl_success && e->arg[out].reorder) {
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_FROM, inner[out]}, {DNNL_ARG_TO, user[out]}, {DNNL_ARG_SCRATCHPAD, rscratch[out]}};
    st = prim_dnnl_primitive_execute(e->arg[out].reorder, stream, rscratch[out] ? 3 : 2, args);
  }
  if (st == dnnl_success) st = prim_dnnl_stream_wait(stream);
  for (int i = 0; i < 3; i++) {
    if (user[i]) dnnl_memory_destroy(user[i]);
    if (inner[i]) dnnl_memory_destroy(inner[i]);
    if (rscratch[i]) dnnl_memory_destroy(rscratch[i]);
  }
  if (pad) dnnl_memory_destroy(pad);
  if (stream) dnnl_stream_destroy(stream);
  return st;
}

/* One convolution cut into batch chunks (see Threads): the chunk key, the operands and the
 * result (data[0..2]: x, w, y as in conv_problem), the weight gradient's running sum. */
typedef struct {
  conv_entry key;      /* the whole problem; each chunk sets its batch */
  char *data[3];
  int64_t per_image[3]; /* floats of one image of x, w (0: not batched), y */
  int64_t chunk, n;    /* images per chunk (the last may have fewer), images in all */
  float *wsum;         /* BWD_WEIGHT: the result, summed into in chunk order */
  int64_t wnumel;
  _Atomic int64_t turn;
  _Atomic int bad;
} conv_job;

static void conv_chunk(void *ctx, int64_t q) {
  conv_job *j = ctx;
  int64_t n0 = q * j->chunk, n1 = n0 + j->chunk < j->n ? n0 + j->chunk : j->n;
  conv_entry key = j->key;
  key.x[0] = key.y[0] = n1 - n0;
  char *data[3];
  for (int i = 0; i < 3; i++) data[i] = j->data[i] + n0 * j->per_image[i] * (int64_t)sizeof(float);
  bool wgrad = key.op == EM_PRIM_CONV2D_BWD_WEIGHT;
  /* the weight gradient: the first chunk writes the result, the others a partial sum */
  float *part = NULL;
  dnnl_status_t st = dnnl_success;
  if (wgrad && q > 0 && !(part = scratch_alloc((size_t)(j->wnumel * 4 + 63) / 64 * 64))) st = dnnl_out_of_memory;
  if (part) data[1] = (char *)part;
  conv_lease l = {.slot = -1};
  int nt = dnnl_one_thread();
  if (st == dnnl_success) st = conv_acquire(&key, &l);
  if (st == dnnl_success) st = run_conv(l.e, l.scratch, data);
  dnnl_threads_back(nt);
  if (l.e) conv_release(&l);
  note_failure(&j->bad, st);
  if (wgrad) { /* every chunk takes its turn, a failed one too, or the later ones would wait for ever */
    prim_turn_wait(&j->turn, q);
    if (part && st == dnnl_success)
      for (int64_t i = 0; i < j->wnumel; i++) j->wsum[i] += part[i];
    prim_turn_pass(&j->turn, q);
  }
  free(part);
}

static bool conv_dnnl(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *a_in,
                      const prim_buf *b_in, char *err, size_t cap) {
  prim_buf a, b;
  void *ca = NULL, *cb = NULL;
  if (!compact(a_in, 0, &a, &ca, err, cap)) return false;
  if (!compact(b_in, 0, &b, &cb, err, cap)) return free(ca), false;
  conv_problem c = conv_of(op, out, &a, &b);
  conv_job j = {.key = {.op = op, .p = at->conv}, .data = {c.bx->data, c.bw->data, c.by->data}};
  /* A stride or dilation that makes no difference is made small: oneDNN refuses a stride of
   * INT64_MAX even where the output has one position (issue 17). With one output position any
   * stride above the padded extent left by the kernel gives the same window; a 1-wide kernel
   * has no taps to dilate. */
  for (int d = 0; d < 2; d++) {
    if (c.w[2 + d] == 1) j.key.p.dilation[d] = 1;
    int64_t span = (c.w[2 + d] - 1) * j.key.p.dilation[d] + 1, room = c.x[2 + d] + 2 * j.key.p.padding[d] - span;
    if (c.y[2 + d] == 1 && room >= 0 && j.key.p.stride[d] > room + 1) j.key.p.stride[d] = room + 1;
  }
  memcpy(j.key.x, c.x, sizeof j.key.x), memcpy(j.key.w, c.w, sizeof j.key.w), memcpy(j.key.y, c.y, sizeof j.key.y);
  j.per_image[0] = c.x[1] * c.x[2] * c.x[3], j.per_image[2] = c.y[1] * c.y[2] * c.y[3];
  j.n = c.x[0];
  double work = (double)ir_numel(4, c.y) * (double)(c.w[1] * c.w[2] * c.w[3]);
  int64_t chunks = work >= CONV_WORK * MAX_CONV_CHUNKS ? MAX_CONV_CHUNKS
                   : work >= CONV_WORK                ? (int64_t)(work / CONV_WORK)
                                                      : 1;
  if (chunks > j.n) chunks = j.n;
  j.chunk = (j.n + chunks - 1) / chunks;
  chunks = (j.n + j.chunk - 1) / j.chunk;
  j.wsum = (float *)c.bw->data;
  j.wnumel = ir_numel(4, c.w);
  atomic_init(&j.turn, 0);
  atomic_init(&j.bad, dnnl_success);
  prim_parallel_ordered(chunks, conv_chunk, &j); /* the weight gradient's chunks take turns */
  free(ca);
  free(cb);
  int bad = atomic_load(&j.bad);
  return bad == dnnl_success || dnnl_fail(err, cap, "convolution", (dnnl_status_t)bad);
}
#endif

static bool conv(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in, char *err, size_t cap) {
  if (ir_numel(4, out->sizes) == 0) return true;
  /* An empty operand (no batch, no channels) makes every sum empty; oneDNN would skip the
   * call and leave the result unwritten. */
  if (ir_numel(4, in[0].sizes) == 0 || ir_numel(4, in[1].sizes) == 0) return zero(out), true;
#ifdef EMBER_HAVE_DNNL
  if (out->dtype == EM_F32) return conv_dnnl(op, at, out, &in[0], &in[1], err, cap);
#else
  (void)err, (void)cap; /* only a library call can fail */
#endif
  prim_conv2d_ref(op, at, out, &in[0], &in[1]);
  return true;
}

bool prim_run_extern(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in, char *err, size_t cap) {
  switch (op) {
  case EM_PRIM_MATMUL: return gemm(out, &in[0], &in[1], false, NULL, PRIM_ACT_NONE, NULL, err, cap);
  case EM_PRIM_CONV2D:
  case EM_PRIM_CONV2D_BWD_INPUT:
  case EM_PRIM_CONV2D_BWD_WEIGHT: return conv(op, at, out, in, err, cap);
  default: return snprintf(err, cap, "is not an extern prim"), false;
  }
}

bool prim_gemm_epilogue(const prim_buf *out, const prim_buf *prod, const prim_buf *a, const prim_buf *b,
                        const prim_buf *bias, prim_activation act, char *err, size_t cap) {
  int64_t n = out->sizes[out->ndim - 1];
  bool ok = out->dtype == EM_F32 && a->dtype == EM_F32 && b->dtype == EM_F32 && out->ndim >= 2 &&
            ir_is_contiguous(out->ndim, out->sizes, out->strides);
  if (prod)
    ok = ok && prod->dtype == EM_F32 && prod->ndim == out->ndim &&
         !memcmp(prod->sizes, out->sizes, sizeof(int64_t) * (size_t)out->ndim) &&
         ir_is_contiguous(prod->ndim, prod->sizes, prod->strides);
  if (bias) ok = ok && bias->dtype == EM_F32 && bias->ndim >= 1 && bias->sizes[bias->ndim - 1] == n;
  if (!ok)
    return snprintf(err, cap, "a GEMM epilogue takes f32 operands, contiguous results and a bias of their last dim"),
           false;
  const float *data = bias ? (const float *)bias->data : NULL;
  float *copy = NULL;
  int64_t s = bias && n > 1 ? bias->strides[bias->ndim - 1] : 1;
  if (s != 1) { /* a strided bias: its n floats in a row, once (the tiles read it many times) */
    if (!(copy = malloc(sizeof(float) * (size_t)n))) return snprintf(err, cap, "out of memory"), false;
    for (int64_t j = 0; j < n; j++) copy[j] = data[j * s];
    data = copy;
  }
  ok = gemm(prod ? prod : out, a, b, true, data, act, (float *)out->data, err, cap);
  free(copy);
  return ok;
}
