/* prims/extern.c: the extern prims: GEMM and 2-D convolution (forward and its two backward
 * convolutions), through well-kept libraries, with plain-loop references kept as the oracle.
 *
 * f32 GEMM goes to oneDNN's dnnl_sgemm (measured here 2-4x faster than OpenBLAS, which this
 * environment pins to its AVX2 kernels) and f32 convolutions to oneDNN's convolution primitives
 * on plain nchw/oihw layouts, so no reorders are needed; f64 GEMM goes to OpenBLAS (oneDNN has
 * no f64 GEMM) and f64 convolutions to the reference loops (they serve gradient checks, not
 * speed). Integer GEMM is a plain loop. oneDNN runs on OpenMP, Ember's one threading runtime;
 * OpenBLAS is asked for one thread so its own pthread pool never competes with OpenMP's. */
#include "prims.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef EMBER_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef EMBER_HAVE_BLAS
#include <cblas.h>
#endif

/* ---- references ---------------------------------------------------------------------------- */

static int64_t batch_count(const prim_buf *b) { return ir_numel(b->ndim - 2, b->sizes); }

/* Byte offset of batch index i (flat, row-major over the batch dims) in b. */
static int64_t batch_offset(const prim_buf *b, int64_t i) {
  int64_t off = 0;
  for (int d = b->ndim - 3; d >= 0; d--) {
    off += (i % b->sizes[d]) * b->strides[d];
    i /= b->sizes[d];
  }
  return off * (int64_t)ir_dtype(b->dtype)->size;
}

void prim_matmul_ref(const prim_buf *out, const prim_buf *a, const prim_buf *b) {
  int n_d = out->ndim;
  int64_t m = out->sizes[n_d - 2], n = out->sizes[n_d - 1], k = a->sizes[n_d - 1];
  int64_t as0 = a->strides[n_d - 2], as1 = a->strides[n_d - 1], bs0 = b->strides[n_d - 2], bs1 = b->strides[n_d - 1];
  int64_t os0 = out->strides[n_d - 2], os1 = out->strides[n_d - 1];
  bool fl = ir_is_float(out->dtype);
  for (int64_t bi = 0; bi < batch_count(out); bi++) {
    const char *pa = a->data + batch_offset(a, bi), *pb = b->data + batch_offset(b, bi);
    char *po = out->data + batch_offset(out, bi);
    size_t es = ir_dtype(out->dtype)->size;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double accf = 0;
        uint64_t acci = 0;
        for (int64_t p = 0; p < k; p++) {
          double x = prim_load(pa + (i * as0 + p * as1) * (int64_t)es, a->dtype);
          double y = prim_load(pb + (p * bs0 + j * bs1) * (int64_t)es, b->dtype);
          if (fl) accf += x * y;
          else acci += (uint64_t)((int64_t)x * (int64_t)y);
        }
        char *o = po + (i * os0 + j * os1) * (int64_t)es;
        if (fl) prim_store(o, out->dtype, accf);
        else if (out->dtype == EM_I64) *(int64_t *)o = (int64_t)acci;
        else *(int32_t *)o = (int32_t)(uint32_t)acci;
      }
  }
}

static double at4(const prim_buf *b, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  int64_t off = i0 * b->strides[0] + i1 * b->strides[1] + i2 * b->strides[2] + i3 * b->strides[3];
  return prim_load(b->data + off * (int64_t)ir_dtype(b->dtype)->size, b->dtype);
}

/* All three convolutions walk the forward loop nest; each accumulates into a double array
 * shaped like its result and stores it at the end. */
void prim_conv2d_ref(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *a, const prim_buf *b) {
  const em_conv2d_params *p = &at->conv;
  int64_t x[4], w[4], y[4];
  if (op == EM_PRIM_CONV2D) {
    memcpy(x, a->sizes, sizeof x), memcpy(w, b->sizes, sizeof w), memcpy(y, out->sizes, sizeof y);
  } else if (op == EM_PRIM_CONV2D_BWD_INPUT) {
    memcpy(x, out->sizes, sizeof x), memcpy(w, b->sizes, sizeof w), memcpy(y, a->sizes, sizeof y);
  } else {
    memcpy(x, a->sizes, sizeof x), memcpy(w, out->sizes, sizeof w), memcpy(y, b->sizes, sizeof y);
  }
  int64_t g = p->groups, cg = x[1] / g, og = w[0] / g;
  int64_t total = ir_numel(4, out->sizes);
  double *acc = calloc((size_t)(total ? total : 1), sizeof(double));
  if (!acc) return; /* reference only: callers are tests with small problems */
  int64_t ost[4];
  ir_contiguous_strides(4, out->sizes, ost);
  for (int64_t n = 0; n < y[0]; n++)
    for (int64_t o = 0; o < y[1]; o++)
      for (int64_t oh = 0; oh < y[2]; oh++)
        for (int64_t ow = 0; ow < y[3]; ow++) {
          int64_t grp = o / og;
          double fwd = 0, gy = op == EM_PRIM_CONV2D ? 0 : at4(op == EM_PRIM_CONV2D_BWD_INPUT ? a : b, n, o, oh, ow);
          for (int64_t c = 0; c < cg; c++)
            for (int64_t i = 0; i < w[2]; i++)
              for (int64_t j = 0; j < w[3]; j++) {
                int64_t ih = oh * p->stride[0] - p->padding[0] + i * p->dilation[0];
                int64_t iw = ow * p->stride[1] - p->padding[1] + j * p->dilation[1];
                if (ih < 0 || ih >= x[2] || iw < 0 || iw >= x[3]) continue;
                int64_t ic = grp * cg + c;
                if (op == EM_PRIM_CONV2D)
                  fwd += at4(a, n, ic, ih, iw) * at4(b, o, c, i, j);
                else if (op == EM_PRIM_CONV2D_BWD_INPUT)
                  acc[n * ost[0] + ic * ost[1] + ih * ost[2] + iw] += gy * at4(b, o, c, i, j);
                else
                  acc[o * ost[0] + c * ost[1] + i * ost[2] + j] += gy * at4(a, n, ic, ih, iw);
              }
          if (op == EM_PRIM_CONV2D) acc[n * ost[0] + o * ost[1] + oh * ost[2] + ow] = fwd;
        }
  size_t es = ir_dtype(out->dtype)->size;
  for (int64_t i0 = 0; i0 < out->sizes[0]; i0++)
    for (int64_t i1 = 0; i1 < out->sizes[1]; i1++)
      for (int64_t i2 = 0; i2 < out->sizes[2]; i2++)
        for (int64_t i3 = 0; i3 < out->sizes[3]; i3++) {
          int64_t off = i0 * out->strides[0] + i1 * out->strides[1] + i2 * out->strides[2] + i3 * out->strides[3];
          prim_store(out->data + off * (int64_t)es, out->dtype,
                     acc[i0 * ost[0] + i1 * ost[1] + i2 * ost[2] + i3 * ost[3]]);
        }
  free(acc);
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* A contiguous copy of src in *dst (malloc'd data the caller frees), or src itself when it is
 * already contiguous (then *owned is NULL). */
static bool contiguous(const prim_buf *src, prim_buf *dst, void **owned, char *err, size_t cap) {
  *owned = NULL;
  *dst = *src;
  if (ir_is_contiguous(src->ndim, src->sizes, src->strides)) return true;
  size_t bytes = (size_t)ir_numel(src->ndim, src->sizes) * ir_dtype(src->dtype)->size;
  *owned = malloc(bytes ? bytes : 1);
  if (!*owned) return snprintf(err, cap, "out of memory copying an operand (%zu bytes)", bytes), false;
  dst->data = *owned;
  ir_contiguous_strides(src->ndim, src->sizes, dst->strides);
  return prim_run_movement(EM_PRIM_CLONE, NULL, dst, src, 1, err, cap);
}

/* How a matrix operand (last two dims) can be handed to a row-major GEMM: 'N' with leading
 * dimension ld, 'T' (it is the transpose of a row-major matrix), or 0 (needs a copy). */
static char gemm_layout(const prim_buf *b, int64_t rows, int64_t cols, int64_t *ld) {
  int64_t s0 = b->strides[b->ndim - 2], s1 = b->strides[b->ndim - 1];
  if ((s1 == 1 || cols <= 1) && s0 >= (cols > 1 ? cols : 1)) return *ld = s0 > 0 ? s0 : 1, 'N';
  if ((s0 == 1 || rows <= 1) && s1 >= (rows > 1 ? rows : 1)) return *ld = s1 > 0 ? s1 : 1, 'T';
  return 0;
}

static void zero(const prim_buf *out) {
  memset(out->data, 0, (size_t)ir_numel(out->ndim, out->sizes) * ir_dtype(out->dtype)->size);
}

#ifdef EMBER_HAVE_BLAS
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_init(void) { openblas_set_num_threads(1); }
#endif

static bool gemm(const prim_buf *out, const prim_buf *a_in, const prim_buf *b_in, char *err, size_t cap) {
  int nd = out->ndim;
  int64_t m = out->sizes[nd - 2], n = out->sizes[nd - 1], k = a_in->sizes[nd - 1];
  if (m == 0 || n == 0) return true;
  if (k == 0) return zero(out), true;
  prim_buf a = *a_in, b = *b_in;
  void *ca = NULL, *cb = NULL;
  int64_t lda, ldb;
  char ta = gemm_layout(&a, m, k, &lda), tb = gemm_layout(&b, k, n, &ldb);
  if (!ta) {
    if (!contiguous(a_in, &a, &ca, err, cap)) return false;
    ta = 'N', lda = k;
  }
  if (!tb) {
    if (!contiguous(b_in, &b, &cb, err, cap)) return free(ca), false;
    tb = 'N', ldb = n;
  }
  int64_t batches = batch_count(out);
  bool ok = true;
  size_t es = ir_dtype(out->dtype)->size;
  if (out->dtype == EM_F32) {
#ifdef EMBER_HAVE_DNNL
    /* Many small products: one per thread; a few large ones: oneDNN threads each. */
    bool per_thread = batches > 1 && m * n * k < (int64_t)1 << 18;
#pragma omp parallel for if (per_thread) schedule(static)
    for (int64_t i = 0; i < batches; i++) {
      dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, 1.0f, (const float *)(a.data + batch_offset(&a, i)), lda,
                                    (const float *)(b.data + batch_offset(&b, i)), ldb, 0.0f,
                                    (float *)(out->data + (int64_t)((size_t)(i * m * n) * es)), n);
      if (st != dnnl_success) ok = false;
    }
    if (!ok) snprintf(err, cap, "oneDNN sgemm failed");
#else
    prim_matmul_ref(out, &a, &b);
#endif
  } else if (out->dtype == EM_F64) {
#ifdef EMBER_HAVE_BLAS
    pthread_once(&blas_once, blas_init);
#pragma omp parallel for if (batches > 1) schedule(static)
    for (int64_t i = 0; i < batches; i++)
      cblas_dgemm(CblasRowMajor, ta == 'T' ? CblasTrans : CblasNoTrans, tb == 'T' ? CblasTrans : CblasNoTrans,
                  (int)m, (int)n, (int)k, 1.0, (const double *)(a.data + batch_offset(&a, i)), (int)lda,
                  (const double *)(b.data + batch_offset(&b, i)), (int)ldb, 0.0,
                  (double *)(out->data + (int64_t)((size_t)(i * m * n) * es)), (int)n);
#else
    prim_matmul_ref(out, &a, &b);
#endif
  } else {
    prim_matmul_ref(out, &a, &b);
  }
  free(ca);
  free(cb);
  return ok;
}

/* ---- convolution through oneDNN ------------------------------------------------------------ */

#ifdef EMBER_HAVE_DNNL
static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static void engine_init(void) {
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) engine = NULL;
}

/* Created primitives, keyed by problem: making a primitive descriptor costs far more than a
 * small convolution, and training repeats the same few problems every step. */
typedef struct {
  em_prim op;
  int64_t x[4], w[4], y[4];
  em_conv2d_params p;
  dnnl_primitive_t prim;
} conv_entry;
enum { CONV_CACHE = 64 };
static conv_entry conv_cache[CONV_CACHE];
static int conv_cached, conv_next;
static pthread_mutex_t conv_lock = PTHREAD_MUTEX_INITIALIZER;

static void md4(dnnl_memory_desc_t *md, const int64_t *s) {
  dnnl_dims_t d = {s[0], s[1], s[2], s[3]};
  dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, dnnl_nchw);
}

static void md_weights(dnnl_memory_desc_t *md, const int64_t *w, int64_t groups) {
  if (groups == 1) {
    md4(md, w);
    return;
  }
  dnnl_dims_t d = {groups, w[0] / groups, w[1], w[2], w[3]};
  dnnl_memory_desc_init_by_tag(md, 5, d, dnnl_f32, dnnl_goihw);
}

static dnnl_status_t make_conv(em_prim op, const int64_t *x, const int64_t *w, const int64_t *y,
                               const em_conv2d_params *p, dnnl_primitive_t *out) {
  dnnl_memory_desc_t xm, wm, ym;
  md4(&xm, x), md_weights(&wm, w, p->groups), md4(&ym, y);
  dnnl_dims_t strides = {p->stride[0], p->stride[1]}, dil = {p->dilation[0] - 1, p->dilation[1] - 1};
  dnnl_dims_t pl = {p->padding[0], p->padding[1]}, pr;
  for (int i = 0; i < 2; i++) /* right padding that makes the output size come out exactly */
    pr[i] = (y[2 + i] - 1) * p->stride[i] + (w[2 + i] - 1) * p->dilation[i] + 1 - x[2 + i] - p->padding[i];
  dnnl_convolution_desc_t fd, cd;
  dnnl_status_t st = dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                                                &xm, &wm, NULL, &ym, strides, dil, pl, pr);
  if (st != dnnl_success) return st;
  dnnl_primitive_desc_t fpd = NULL, pd = NULL;
  if ((st = dnnl_primitive_desc_create(&fpd, &fd, NULL, engine, NULL)) != dnnl_success) return st;
  if (op == EM_PRIM_CONV2D) {
    pd = fpd, fpd = NULL;
  } else {
    if (op == EM_PRIM_CONV2D_BWD_INPUT)
      st = dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &xm, &wm, &ym, strides, dil, pl, pr);
    else
      st = dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &xm, &wm, NULL, &ym,
                                                               strides, dil, pl, pr);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &cd, NULL, engine, fpd);
    dnnl_primitive_desc_destroy(fpd);
    if (st != dnnl_success) return st;
  }
  st = dnnl_primitive_create(out, pd);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

static dnnl_status_t get_conv(em_prim op, const int64_t *x, const int64_t *w, const int64_t *y,
                              const em_conv2d_params *p, dnnl_primitive_t *out) {
  pthread_mutex_lock(&conv_lock);
  for (int i = 0; i < conv_cached; i++) {
    conv_entry *e = &conv_cache[i];
    if (e->op == op && !memcmp(e->x, x, sizeof e->x) && !memcmp(e->w, w, sizeof e->w) &&
        !memcmp(e->y, y, sizeof e->y) && !memcmp(&e->p, p, sizeof *p)) {
      *out = e->prim;
      pthread_mutex_unlock(&conv_lock);
      return dnnl_success;
    }
  }
  dnnl_status_t st = make_conv(op, x, w, y, p, out);
  if (st == dnnl_success) {
    conv_entry *e = &conv_cache[conv_next];
    if (conv_cached == CONV_CACHE) dnnl_primitive_destroy(e->prim);
    else conv_cached++;
    *e = (conv_entry){.op = op, .p = *p, .prim = *out};
    memcpy(e->x, x, sizeof e->x), memcpy(e->w, w, sizeof e->w), memcpy(e->y, y, sizeof e->y);
    conv_next = (conv_next + 1) % CONV_CACHE;
  }
  /* Execution stays under the lock: an evicted primitive must not be destroyed mid-run. */
  return st;
}

static bool conv_dnnl(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *a_in,
                      const prim_buf *b_in, char *err, size_t cap) {
  pthread_once(&engine_once, engine_init);
  if (!engine) return snprintf(err, cap, "oneDNN has no CPU engine"), false;
  prim_buf a, b;
  void *ca = NULL, *cb = NULL;
  if (!contiguous(a_in, &a, &ca, err, cap)) return false;
  if (!contiguous(b_in, &b, &cb, err, cap)) return free(ca), false;
  const int64_t *x, *w, *y;
  int ax, aw, ay;
  if (op == EM_PRIM_CONV2D) x = a.sizes, w = b.sizes, y = out->sizes, ax = DNNL_ARG_SRC, aw = DNNL_ARG_WEIGHTS, ay = DNNL_ARG_DST;
  else if (op == EM_PRIM_CONV2D_BWD_INPUT) x = out->sizes, w = b.sizes, y = a.sizes, ax = DNNL_ARG_DIFF_SRC, aw = DNNL_ARG_WEIGHTS, ay = DNNL_ARG_DIFF_DST;
  else x = a.sizes, w = out->sizes, y = b.sizes, ax = DNNL_ARG_SRC, aw = DNNL_ARG_DIFF_WEIGHTS, ay = DNNL_ARG_DIFF_DST;
  const prim_buf *bx = op == EM_PRIM_CONV2D_BWD_INPUT ? out : &a;
  const prim_buf *bw = op == EM_PRIM_CONV2D_BWD_WEIGHT ? out : &b;
  const prim_buf *by = op == EM_PRIM_CONV2D ? out : op == EM_PRIM_CONV2D_BWD_INPUT ? &a : &b;
  dnnl_primitive_t prim;
  dnnl_status_t st = get_conv(op, x, w, y, &at->conv, &prim); /* takes conv_lock */
  dnnl_memory_t mx = NULL, mw = NULL, my = NULL;
  dnnl_stream_t stream = NULL;
  if (st == dnnl_success) {
    dnnl_memory_desc_t xm, wm, ym;
    md4(&xm, x), md_weights(&wm, w, at->conv.groups), md4(&ym, y);
    if ((st = dnnl_memory_create(&mx, &xm, engine, bx->data)) == dnnl_success &&
        (st = dnnl_memory_create(&mw, &wm, engine, bw->data)) == dnnl_success &&
        (st = dnnl_memory_create(&my, &ym, engine, by->data)) == dnnl_success &&
        (st = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags)) == dnnl_success) {
      dnnl_exec_arg_t args[3] = {{ax, mx}, {aw, mw}, {ay, my}};
      st = dnnl_primitive_execute(prim, stream, 3, args);
      if (st == dnnl_success) st = dnnl_stream_wait(stream);
    }
  }
  pthread_mutex_unlock(&conv_lock);
  if (stream) dnnl_stream_destroy(stream);
  if (mx) dnnl_memory_destroy(mx);
  if (mw) dnnl_memory_destroy(mw);
  if (my) dnnl_memory_destroy(my);
  free(ca);
  free(cb);
  if (st != dnnl_success) return snprintf(err, cap, "oneDNN convolution failed (dnnl status %d)", (int)st), false;
  return true;
}
#endif

bool prim_run_extern(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in, char *err, size_t cap) {
  if (op == EM_PRIM_MATMUL) return gemm(out, &in[0], &in[1], err, cap);
  if (ir_numel(4, out->sizes) == 0) return true;
#ifdef EMBER_HAVE_DNNL
  if (out->dtype == EM_F32) return conv_dnnl(op, at, out, &in[0], &in[1], err, cap);
#endif
  prim_conv2d_ref(op, at, out, &in[0], &in[1]);
  return true;
}
