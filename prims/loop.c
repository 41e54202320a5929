/* prims/loop.c: the strided N-d iterator every elementwise kernel runs on.
 *
 * Kernels are written as 1-D inner loops over (pointer, byte stride) pairs, as NumPy's ufunc
 * loops are; this file walks the outer dimensions. It first coalesces dimensions that are
 * contiguous with respect to each other in every operand (so a contiguous tensor of any rank is
 * one inner loop of numel elements, which the compiler vectorises), drops size-1 dimensions, and
 * splits the flat index space into one range per pool thread when the work is large. */
#include "prims.h"

#include <string.h>

typedef struct {
  int nops, ndim;
  int64_t sizes[EM_MAX_DIMS];
  int64_t strides[4][EM_MAX_DIMS]; /* bytes */
  char *data[4];
} iter;

static void iter_init(iter *it, int nops, const prim_buf *b) {
  it->nops = nops;
  it->ndim = 0;
  for (int k = 0; k < nops; k++) it->data[k] = b[k].data;
  /* Keep non-trivial dims, outermost first. */
  for (int d = 0; d < b[0].ndim; d++) {
    if (b[0].sizes[d] == 1) continue;
    int n = it->ndim++;
    it->sizes[n] = b[0].sizes[d];
    for (int k = 0; k < nops; k++)
      it->strides[k][n] = b[k].strides[d] * (int64_t)ir_dtype(b[k].dtype)->size;
  }
  /* Merge dim d-1 into d when every operand steps over d-1 as one block of d. */
  int n = 0;
  for (int d = 0; d < it->ndim; d++) {
    if (n > 0) {
      bool ok = true;
      for (int k = 0; k < nops && ok; k++)
        ok = it->strides[k][n - 1] == it->strides[k][d] * it->sizes[d];
      if (ok) {
        it->sizes[n - 1] *= it->sizes[d];
        for (int k = 0; k < nops; k++) it->strides[k][n - 1] = it->strides[k][d];
        continue;
      }
    }
    it->sizes[n] = it->sizes[d];
    for (int k = 0; k < nops; k++) it->strides[k][n] = it->strides[k][d];
    n++;
  }
  it->ndim = n;
}

/* Runs elements [begin, end) of the flat index space. */
static void iter_range(const iter *it, int64_t begin, int64_t end, prim_loop1d fn, const void *ctx) {
  int nd = it->ndim;
  if (nd == 0) {
    char *p[4];
    int64_t s[4] = {0};
    for (int k = 0; k < it->nops; k++) p[k] = it->data[k];
    if (begin < end) fn(p, s, 1, ctx);
    return;
  }
  int64_t inner = it->sizes[nd - 1];
  int64_t idx[EM_MAX_DIMS];
  int64_t rest = begin / inner;
  for (int d = nd - 2; d >= 0; d--) {
    idx[d] = rest % it->sizes[d];
    rest /= it->sizes[d];
  }
  int64_t col = begin % inner;
  int64_t s[4];
  for (int k = 0; k < it->nops; k++) s[k] = it->strides[k][nd - 1];
  int64_t pos = begin;
  while (pos < end) {
    char *p[4];
    for (int k = 0; k < it->nops; k++) {
      char *q = it->data[k] + col * it->strides[k][nd - 1];
      for (int d = 0; d < nd - 1; d++) q += idx[d] * it->strides[k][d];
      p[k] = q;
    }
    int64_t n = inner - col;
    if (n > end - pos) n = end - pos;
    fn(p, s, n, ctx);
    pos += n;
    col = 0;
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[d] < it->sizes[d]) break;
      idx[d] = 0;
    }
  }
}

typedef struct {
  const iter *it;
  int64_t total, chunks;
  prim_loop1d fn;
  const void *ctx;
} foreach_job;

static void foreach_chunk(void *ctx, int64_t c) {
  const foreach_job *j = ctx;
  /* Split on 64-element boundaries so threads never share a cache line of the output. */
  int64_t b = (j->total * c / j->chunks) & ~(int64_t)63;
  int64_t e = c + 1 == j->chunks ? j->total : (j->total * (c + 1) / j->chunks) & ~(int64_t)63;
  iter_range(j->it, b, e, j->fn, j->ctx);
}

void prim_foreach(int nops, const prim_buf *bufs, prim_loop1d fn, const void *ctx) {
  int64_t total = ir_numel(bufs[0].ndim, bufs[0].sizes);
  if (total == 0) return;
  iter it;
  iter_init(&it, nops, bufs);
  int nt = prim_threads();
  if (nt < 2 || total < 2 * PRIM_PARALLEL_GRAIN) {
    iter_range(&it, 0, total, fn, ctx);
    return;
  }
  int64_t chunks = total / PRIM_PARALLEL_GRAIN;
  if (chunks > nt) chunks = nt;
  foreach_job j = {&it, total, chunks, fn, ctx};
  prim_parallel(chunks, foreach_chunk, &j);
}

void prim_foreach_serial(int nops, const prim_buf *bufs, prim_loop1d fn, const void *ctx) {
  if (ir_numel(bufs[0].ndim, bufs[0].sizes) == 0) return;
  iter it;
  iter_init(&it, nops, bufs);
  iter_range(&it, 0, ir_numel(bufs[0].ndim, bufs[0].sizes), fn, ctx);
}
