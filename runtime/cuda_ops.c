/* runtime/cuda_ops.c: eager execution of prims on CUDA tensors, and moving tensors between
 * devices (em_to).
 *
 * The dispatcher (dispatch.c) runs the meta function and allocates the result on the device as
 * for the CPU, then calls cu_run_prim, which picks the generated kernel (cuda_kernels.c) for the
 * prim, dtypes and layout kind, fills its parameters from the operands' sizes and strides and
 * enqueues it on the current stream. Views never reach here (they are new headers over the same
 * storage). Matmul and the convolutions' GEMMs go to cuBLAS (strided batched, so batch dims and
 * conv groups are one call); convolutions are im2col + GEMM (backward: GEMM + col2im, and GEMM
 * against the columns), the lowering of Chellapilla et al. 2006 ("High Performance Convolutional
 * Neural Networks for Document Processing") that cuDNN's IMPLICIT_GEMM algorithm fuses. */
#include "cuda.h"
#include "rt.h"
#include "../ir/graph.h"
#include "../frontend/frontend.h" /* EMBER_LOGS=perf: why a convolution skips cuDNN */

#include <math.h>
#include <string.h>

/* The layouts kernels take (cuda_kernels.c's prelude spells the same structs). */
typedef struct { int ndim, fits32; int64_t size[EM_MAX_DIMS]; int64_t stride[4][EM_MAX_DIMS]; } k_layout;
typedef struct { int ndim; int64_t size[EM_MAX_DIMS]; int64_t stride[EM_MAX_DIMS]; } k_red;
typedef struct { int64_t n, c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw; } k_conv;

static bool allow_tf32;
void em_cuda_set_allow_tf32(bool allow) { allow_tf32 = allow; }
bool em_cuda_allow_tf32(void) { return allow_tf32; }

static uint64_t dptr(const em_tensor *t) { return (uint64_t)(uintptr_t)rt_data(t); }

static bool fail(char *err, size_t cap, const char *m) { return snprintf(err, cap, "%s", m), false; }

/* Marks L when all its linear indices are below 2^31 (the kernels then index in 32 bits). */
static k_layout *fit(k_layout *L) {
  int64_t n = 1;
  for (int d = 0; d < L->ndim && n < ((int64_t)1 << 31); d++) n *= L->size[d];
  L->fits32 = n < ((int64_t)1 << 31);
  return L;
}

/* Runs the kernel for key k over n elements (threads) with params. */
static bool run(cu_kernel_key k, int64_t n, unsigned block, void **params, char *err, size_t cap) {
  if (n <= 0) return true;
  cu_function f = cu_kernel(&k, err, cap);
  return f && cu_launch_named(f, prim_get(k.op)->name, n, block, params, err, cap);
}

static bool dense(const em_tensor *t) { return ir_is_contiguous(t->ndim, t->sizes, t->strides); }
static bool all_zero_strides(const em_tensor *t) {
  for (int d = 0; d < t->ndim; d++)
    if (t->strides[d] && t->sizes[d] > 1) return false;
  return true;
}

/* A layout over out's shape with operand k's strides in stride[k]. */
static k_layout layout_of(const em_tensor *out, em_tensor *const *ops, int n_ops) {
  k_layout L = {.ndim = out->ndim};
  for (int d = 0; d < out->ndim; d++) {
    L.size[d] = out->sizes[d];
    L.stride[0][d] = out->strides[d];
    for (int k = 0; k < n_ops; k++) L.stride[1 + k][d] = ops[k]->strides[d];
  }
  return *fit(&L);
}

/* A strided copy of x into out (same shape; dtypes may differ: a conversion). */
static bool copy_into(em_tensor *out, em_tensor *x, char *err, size_t cap) {
  if (out->numel == 0) return true;
  if (out->dtype == x->dtype && dense(out) && dense(x)) {
    cu_enter();
    int r = cu_drv()->memcpy_dtod(dptr(out), dptr(x), (size_t)out->numel * ir_dtype(x->dtype)->size, cu_current_stream());
    if (r) return snprintf(err, cap, "device copy: %s", cu_drv()->error_string(r)), false;
    return true;
  }
  cu_layout lk = dense(out) && dense(x) ? CU_CONTIG : dense(out) && all_zero_strides(x) ? CU_BROADCAST : CU_STRIDED;
  k_layout L = layout_of(out, &x, 1);
  uint64_t o = dptr(out), s = dptr(x);
  int64_t n = out->numel;
  void *p[] = {&o, &s, &n, &L};
  return run((cu_kernel_key){CU_COPY, EM_PRIM_CLONE, x->dtype, out->dtype, EM_I64, lk}, n, 256, p, err, cap);
}

/* Fills out with the value whose bytes (of out's dtype) are at val. */
static bool fill_bytes(em_tensor *out, const void *bytes, char *err, size_t cap) {
  if (out->numel == 0) return true;
  char val[8] = {0};
  memcpy(val, bytes, ir_dtype(out->dtype)->size);
  k_layout L = layout_of(out, NULL, 0);
  uint64_t o = dptr(out);
  int64_t n = out->numel;
  void *p[] = {&o, val, &n, &L};
  return run((cu_kernel_key){CU_FILL, EM_PRIM_FULL, out->dtype, out->dtype, EM_I64, dense(out) ? CU_CONTIG : CU_STRIDED},
             n, 256, p, err, cap);
}

static bool fill(em_tensor *out, double v, char *err, size_t cap) {
  char val[8] = {0};
  prim_store(val, out->dtype, v);
  return fill_bytes(out, val, err, cap);
}

/* A CPU scalar (one element, possibly expanded) joining CUDA operands: a device tensor with its
 * sizes and zero strides, made by a fill kernel that takes the value as a launch parameter, so
 * the host never waits (a copy through the staging buffers would wait for their reuse). */
em_tensor *cu_scalar_to_device(em_tensor *x, const char *name, em_site site) {
  int64_t zeros[EM_MAX_DIMS] = {0};
  em_tensor *one = rt_new_device(x->dtype, 0, zeros, EM_CUDA, name, site);
  char err[256] = "failed on the device";
  if (one && !fill_bytes(one, rt_data(x), err, sizeof err)) {
    em_release(one);
    return rt_error(site, name, "%s", err); /* an error already recorded stays */
  }
  em_tensor *v = one ? rt_new_view(one, x->ndim, x->sizes, zeros, 0, name, site) : NULL;
  em_release(one);
  return v;
}

/* A header viewing t's storage (caller releases). */
static em_tensor *view(em_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset) {
  return rt_new_view(t, ndim, sizes, strides, offset, "cuda", (em_site){__FILE__, __LINE__, __func__});
}

/* The CPU refuses integer remainder by zero and negative integer powers (prims/pointwise.c); so
 * does the device, at the cost of reading a flag back (a wait, for these two ops only). */
static bool integer_domain(em_prim op, em_tensor *b, char *err, size_t cap) {
  if (b->numel == 0) return true;
  static const char name[] = "cuda integer check";
  em_site here = {__FILE__, __LINE__, __func__};
  em_tensor *zero = rt_scalar(b->dtype, 0, name, here), *ze = rt_expand(zero, b->ndim, b->sizes, name, here);
  em_tensor *ops[2] = {b, ze};
  em_tensor *mask = ze ? rt_dispatch(name, op == EM_PRIM_REMAINDER ? EM_PRIM_EQ : EM_PRIM_LT, ops, 2, NULL, here) : NULL;
  em_tensor *any = mask ? rt_dispatch(name, EM_PRIM_AMAX, &mask, 1, &(prim_attrs){0}, here) : NULL;
  em_tensor *low = any && op == EM_PRIM_POW ? rt_dispatch(name, EM_PRIM_AMIN, &b, 1, &(prim_attrs){0}, here) : NULL;
  bool flag = false, ok = any && (op != EM_PRIM_POW || low);
  int64_t lowest = 0;
  if (ok) ok = cu_copy_to_host(&flag, dptr(any), 1, name, here);
  if (ok && low) ok = cu_copy_to_host(&lowest, dptr(low), ir_dtype(b->dtype)->size, name, here);
  em_release(zero), em_release(ze), em_release(mask), em_release(any), em_release(low);
  if (!ok) return snprintf(err, cap, "%s", em_last_error() ? em_last_error() : "out of memory"), false;
  if (!flag) return true;
  if (op == EM_PRIM_REMAINDER) return snprintf(err, cap, "integer remainder by zero"), false;
  double e = prim_load((const char *)&lowest, b->dtype);
  return snprintf(err, cap, "integers to negative integer powers are not allowed (exponent %g)", e), false;
}

static bool pointwise(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *const *in, int n_in, char *err,
                      size_t cap) {
  if ((op == EM_PRIM_REMAINDER || op == EM_PRIM_POW) && !ir_is_float(in[0]->dtype) && !integer_domain(op, in[1], err, cap))
    return false;
  bool contig = dense(out), bcast = dense(out);
  for (int i = 0; i < n_in; i++) {
    bool same = dense(in[i]) && in[i]->numel == out->numel;
    contig &= same;
    bcast &= same || all_zero_strides(in[i]);
  }
  cu_layout lk = contig ? CU_CONTIG : bcast ? CU_BROADCAST : CU_STRIDED;
  k_layout L = layout_of(out, in, n_in);
  if (lk == CU_BROADCAST)
    for (int i = 0; i < n_in; i++) L.stride[1 + i][0] = dense(in[i]) && in[i]->numel == out->numel ? 1 : 0;
  em_dtype dt = op == EM_PRIM_WHERE ? in[1]->dtype : in[0]->dtype;
  uint64_t ptrs[4] = {dptr(out)};
  for (int i = 0; i < n_in; i++) ptrs[1 + i] = dptr(in[i]);
  int64_t n = out->numel;
  void *p[6];
  int np = 0;
  for (int i = 0; i <= n_in; i++) p[np++] = &ptrs[i];
  p[np++] = &n, p[np++] = &L;
  (void)at; /* convert's dtype is out's */
  return run((cu_kernel_key){CU_POINTWISE, op, dt, out->dtype, EM_I64, lk}, n, 256, p, err, cap);
}

static bool reduce(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *x, char *err, size_t cap);

/* Few long rows (a loss over a whole tensor, say) would run on as few blocks, a handful of the
 * device's SMs: each row is split into c pieces, reduced into partials [n_out, c], then those.
 * Sums, products and extrema of types that accumulate in themselves (f32, f64, and integers,
 * whose sums are i64 already); argmax needs indices, and f16/bf16 would round the partials. */
static bool reduce_in_two(em_prim op, em_tensor *out, em_tensor *x, int64_t n_out, int64_t n_red, char *err, size_t cap) {
  bool self = x->dtype == EM_F32 || x->dtype == EM_F64 || out->dtype == EM_I64 ||
              (op != EM_PRIM_SUM && op != EM_PRIM_PROD && x->dtype != EM_F16 && x->dtype != EM_BF16);
  int64_t c = 1024;
  while (c > 1 && n_red % c) c /= 2; /* a power of two dividing n_red, at most 1024 */
  prim_attrs one = {.n_axes = 1, .axes = {1}};
  if (!self || c < 16 || op == EM_PRIM_ARGMAX || op == EM_PRIM_ARGMIN) { /* one pass after all */
    k_layout L = {.ndim = 1, .size = {n_out}, .stride = {{1}, {n_red}}};
    fit(&L);
    k_red R = {.ndim = 1, .size = {n_red}, .stride = {1}};
    uint64_t o = dptr(out), s = dptr(x);
    void *p[] = {&o, &s, &n_out, &n_red, &L, &R};
    return run((cu_kernel_key){CU_REDUCE, op, x->dtype, out->dtype, EM_I64, CU_CONTIG}, n_out * 256, 256, p, err, cap);
  }
  em_site here = {__FILE__, __LINE__, __func__};
  em_tensor *rows = view(x, 3, (int64_t[]){n_out, c, n_red / c}, (int64_t[]){n_red, n_red / c, 1}, x->offset);
  em_tensor *part = rt_new_device(out->dtype, 2, (int64_t[]){n_out, c}, EM_CUDA, "cuda reduction", here);
  em_tensor *flat = view(out, 1, (int64_t[]){n_out}, (int64_t[]){1}, out->offset);
  prim_attrs last = {.n_axes = 1, .axes = {2}};
  bool ok = rows && part && flat && reduce(op, &last, part, rows, err, cap);
  /* the second pass combines partials: a sum of sums, product of products, max of maxima */
  if (ok) ok = reduce(op, &one, flat, part, err, cap);
  if (!rows || !part || !flat) ok = ok && fail(err, cap, "out of memory");
  em_release(rows), em_release(part), em_release(flat);
  return ok;
}

static bool reduce(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *x, char *err, size_t cap) {
  bool red[EM_MAX_DIMS] = {0};
  for (int i = 0; i < at->n_axes; i++) { /* a 0-dim operand takes axis 0 or -1 and has nothing to reduce */
    int a = ir_norm_axis(at->axes[i], x->ndim);
    if (a >= 0) red[a] = true;
  }
  if (at->n_axes == 0) /* no axes: every dim */
    for (int d = 0; d < x->ndim; d++) red[d] = true;
  k_layout L = {0};
  k_red R = {0};
  int64_t n_out = 1, n_red = 1;
  bool trailing = true, seen_red = false;
  for (int d = 0, od = 0; d < x->ndim; d++) {
    if (red[d]) {
      R.size[R.ndim] = x->sizes[d], R.stride[R.ndim++] = x->strides[d], n_red *= x->sizes[d], seen_red = true;
      if (at->keepdim) od++;
    } else {
      if (seen_red) trailing = false;
      L.size[L.ndim] = x->sizes[d], L.stride[0][L.ndim] = out->strides[od], L.stride[1][L.ndim++] = x->strides[d];
      n_out *= x->sizes[d], od++;
    }
  }
  if (n_out == 0) return true;
  fit(&L);
  cu_layout lk = dense(x) && dense(out) && trailing ? CU_CONTIG : CU_STRIDED;
  if (lk == CU_CONTIG && n_out < 64 && n_red >= (1 << 16)) return reduce_in_two(op, out, x, n_out, n_red, err, cap);
  uint64_t o = dptr(out), s = dptr(x);
  void *p[] = {&o, &s, &n_out, &n_red, &L, &R};
  /* one block per output element, as wide as its reduction needs: a power of two (the tree
   * halves it) from a warp up to the shared arrays' 256 */
  unsigned block = 32;
  while (block < 256 && block < n_red) block *= 2;
  return run((cu_kernel_key){CU_REDUCE, op, x->dtype, out->dtype, EM_I64, lk}, n_out * block, block, p, err, cap);
}

/* out's slice along axis a from start with step, as a view (caller releases). */
static em_tensor *slice_view(em_tensor *out, int a, int64_t start, int64_t len, int64_t step) {
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  memcpy(sizes, out->sizes, sizeof sizes), memcpy(strides, out->strides, sizeof strides);
  sizes[a] = len, strides[a] *= step;
  return view(out, out->ndim, sizes, strides, out->offset + start * out->strides[a]);
}

static bool movement(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *const *in, int n_in, char *err,
                     size_t cap) {
  em_tensor *x = in[0];
  switch (op) {
  case EM_PRIM_CLONE: return copy_into(out, x, err, cap);
  case EM_PRIM_FLIP: { /* a view of x with the flipped axes' strides negated */
    int64_t strides[EM_MAX_DIMS], off = x->offset;
    memcpy(strides, x->strides, sizeof strides);
    for (int i = 0; i < at->n_axes; i++) {
      int a = ir_norm_axis(at->axes[i], x->ndim);
      if (x->sizes[a] > 0) off += (x->sizes[a] - 1) * strides[a];
      strides[a] = -strides[a];
    }
    em_tensor *v = view(x, x->ndim, x->sizes, strides, off);
    bool ok = v && copy_into(out, v, err, cap);
    em_release(v);
    return ok || (!v && fail(err, cap, "out of memory"));
  }
  case EM_PRIM_PAD: {
    if (!fill(out, at->value, err, cap)) return false;
    int64_t sizes[EM_MAX_DIMS], off = out->offset;
    memcpy(sizes, x->sizes, sizeof sizes);
    for (int i = 0; i < at->n_pads; i += 2) off += at->pads[i] * out->strides[x->ndim - 1 - i / 2];
    em_tensor *v = view(out, x->ndim, sizes, out->strides, off);
    bool ok = v && copy_into(v, x, err, cap);
    em_release(v);
    return ok || (!v && fail(err, cap, "out of memory"));
  }
  case EM_PRIM_CAT: {
    int a = ir_norm_axis(at->axes[0], x->ndim);
    int64_t start = 0;
    for (int i = 0; i < n_in; i++) {
      em_tensor *v = slice_view(out, a, start, in[i]->sizes[a], 1);
      bool ok = v && copy_into(v, in[i], err, cap);
      em_release(v);
      if (!ok) return v ? false : fail(err, cap, "out of memory");
      start += in[i]->sizes[a];
    }
    return true;
  }
  case EM_PRIM_SLICE_SCATTER: {
    if (!copy_into(out, x, err, cap)) return false;
    int a = ir_norm_axis(at->axes[0], x->ndim);
    int64_t len = at->stop > at->start ? (at->stop - at->start + at->step - 1) / at->step : 0;
    em_tensor *v = slice_view(out, a, at->start, len, at->step);
    bool ok = v && copy_into(v, in[1], err, cap);
    em_release(v);
    return ok || (!v && fail(err, cap, "out of memory"));
  }
  default: return fail(err, cap, "has no CUDA kernel");
  }
}

/* gather, index_select, scatter_add: the kernel writes the first bad index into a device word,
 * read back after the launch (PyTorch raises a device-side assert; this names the index). */
static bool indexing(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *const *in, char *err, size_t cap) {
  em_tensor *x = in[0], *idx = in[1];
  int a = x->ndim ? ir_norm_axis(at->axes[0], x->ndim) : 0;
  int64_t limit = x->ndim ? x->sizes[a] : 1;
  /* captured into a CUDA graph: the graph's owner zeroes the word before each replay and reads
   * it after (a copy from this stack frame would be replayed from a dead frame); the word comes
   * from the device's allocator, not the graph's pool, so no other value of the graph reuses it */
  bool captured = cu_capturing();
  char aerr[256];
  cu_block *eb = captured ? cu_alloc(cu_device_allocator(), 16, (uintptr_t)cu_current_stream(), aerr, sizeof aerr)
                          : cu_storage_alloc(16, "cuda", (em_site){__FILE__, __LINE__, __func__});
  if (!eb) return fail(err, cap, "out of memory");
  uint64_t errw = eb->ptr, zero[2] = {0, 0}; /* {flag, the first bad index} */
  cu_enter();
  int r = captured ? 0 : cu_drv()->memcpy_htod(errw, zero, 16, cu_current_stream());
  k_layout L = {0};
  int64_t n, axis_stride;
  uint64_t o = dptr(out);
  bool ok = !r;
  if (op == EM_PRIM_SCATTER_ADD) {
    ok = ok && copy_into(out, x, err, cap);
    em_tensor *src = in[2];
    L.ndim = idx->ndim, n = idx->numel, axis_stride = out->strides[a];
    for (int d = 0; d < idx->ndim; d++)
      L.size[d] = idx->sizes[d], L.stride[0][d] = d == a ? 0 : out->strides[d], L.stride[1][d] = src->strides[d],
      L.stride[2][d] = idx->strides[d];
    uint64_t ix = dptr(idx), s = dptr(src);
    void *p[] = {&o, &ix, &s, &n, &limit, &axis_stride, &L, &errw};
    em_dtype dt = x->dtype == EM_BOOL || x->dtype == EM_U8 ? EM_I32 : x->dtype;
    if (dt != x->dtype) ok = ok && fail(err, cap, "scatter_add on the device needs a numeric dtype other than bool and u8");
    fit(&L);
    ok = ok && run((cu_kernel_key){CU_INDEX, op, dt, dt, idx->dtype, CU_STRIDED}, n, 256, p, err, cap);
  } else {
    L.ndim = out->ndim, n = out->numel, axis_stride = x->ndim ? x->strides[a] : 0;
    for (int d = 0; d < out->ndim; d++) {
      L.size[d] = out->sizes[d], L.stride[0][d] = out->strides[d], L.stride[1][d] = d == a ? 0 : x->strides[d];
      L.stride[2][d] = op == EM_PRIM_GATHER ? idx->strides[d] : d == a && idx->ndim ? idx->strides[0] : 0;
    }
    uint64_t s = dptr(x), ix = dptr(idx);
    void *p[] = {&o, &s, &ix, &n, &limit, &axis_stride, &L, &errw};
    fit(&L);
    ok = ok && run((cu_kernel_key){CU_INDEX, op, x->dtype, out->dtype, idx->dtype, CU_STRIDED}, n, 256, p, err, cap);
  }
  uint64_t bad[2] = {0, 0};
  if (captured) {
    if (ok && cu_capture_check((cu_check){eb, op, a, limit})) return true;
    cu_release(eb->owner, eb);
    return ok ? fail(err, cap, "out of memory") : false;
  }
  if (ok) ok = cu_copy_to_host(bad, errw, 16, prim_get(op)->name, (em_site){__FILE__, __LINE__, __func__});
  if (!ok && r) snprintf(err, cap, "device copy: %s", cu_drv()->error_string(r));
  cu_release(eb->owner, eb);
  if (ok && bad[0])
    return snprintf(err, cap, "index %lld is out of bounds for axis %d with size %lld", (long long)(int64_t)bad[1], a,
                    (long long)limit),
           false;
  return ok;
}

static bool creation(em_prim op, const prim_attrs *at, em_tensor *out, char *err, size_t cap) {
  int64_t n = out->numel;
  uint64_t o = dptr(out);
  if (op == EM_PRIM_FULL) return fill(out, at->value, err, cap);
  if (op == EM_PRIM_IOTA) {
    double start = at->value, step = at->value2;
    void *p[] = {&o, &start, &step, &n};
    return run((cu_kernel_key){CU_IOTA, op, out->dtype, out->dtype, EM_I64, CU_CONTIG}, n, 256, p, err, cap);
  }
  uint64_t seed = at->seed, offset = at->offset;
  int64_t calls = (int64_t)prim_philox_calls(op, out->dtype, n);
  void *p[] = {&o, &seed, &offset, &n, &calls};
  return run((cu_kernel_key){CU_PHILOX, op, out->dtype, out->dtype, EM_I64, CU_CONTIG}, calls, 256, p, err, cap);
}

/* ---- scans and argsort along one axis ---- */

/* The layout over x's lines along axis a (its other dims), with out's (stride[0]) and x's
 * (stride[1]) strides: line l starts at em_off(L, k, l). */
static k_layout lines_layout(const em_tensor *out, const em_tensor *x, int a) {
  k_layout L = {0};
  for (int d = 0; d < x->ndim; d++) {
    if (d == a) continue;
    L.size[L.ndim] = x->sizes[d], L.stride[0][L.ndim] = out->strides[d], L.stride[1][L.ndim++] = x->strides[d];
  }
  return *fit(&L);
}

static bool scan(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *x, char *err, size_t cap) {
  int a = ir_norm_axis(at->axes[0], x->ndim ? x->ndim : 1);
  int64_t n = x->ndim ? x->sizes[a] : 1, lines = n ? x->numel / n : 0;
  int64_t os = x->ndim ? out->strides[a] : 1, xs = x->ndim ? x->strides[a] : 1;
  k_layout L = lines_layout(out, x, a);
  uint64_t o = dptr(out), s = dptr(x);
  void *p[] = {&o, &s, &lines, &n, &os, &xs, &L};
  return run((cu_kernel_key){CU_SCAN, op, x->dtype, out->dtype, EM_I64, CU_STRIDED}, lines, 128, p, err, cap);
}

/* A view of t with axis a moved last (sizes and strides permuted). */
static em_tensor *axis_last(em_tensor *t, int a) {
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < t->ndim; d++)
    if (d != a) sizes[k] = t->sizes[d], strides[k++] = t->strides[d];
  if (t->ndim) sizes[k] = t->sizes[a], strides[k] = t->strides[a];
  return view(t, t->ndim, sizes, strides, t->offset);
}

/* Stable argsort: x's rows (axis moved last) copied into a contiguous key buffer, then
 * ceil(log2 n) merge passes (cuda_kernels.c, gen_sort) between two (key, index) buffer pairs,
 * the last pass's indices copied into out. */
static bool argsort(const prim_attrs *at, em_tensor *out, em_tensor *x, char *err, size_t cap) {
  int a = ir_norm_axis(at->axes[0], x->ndim ? x->ndim : 1);
  int64_t n = x->ndim ? x->sizes[a] : 1, total = x->numel;
  if (total == 0) return true;
  if (n == 1) return fill(out, 0, err, cap);
  em_site here = {__FILE__, __LINE__, __func__};
  em_tensor *xv = axis_last(x, a), *ov = axis_last(out, a), *k[2] = {0}, *ix[2] = {0};
  bool ok = xv && ov;
  for (int i = 0; ok && i < 2; i++) {
    k[i] = rt_new_device(x->dtype, xv->ndim, xv->sizes, EM_CUDA, "cuda argsort", here);
    ix[i] = rt_new_device(EM_I64, xv->ndim, xv->sizes, EM_CUDA, "cuda argsort", here);
    ok = k[i] && ix[i];
  }
  if (!ok) snprintf(err, cap, "out of memory");
  ok = ok && copy_into(k[0], xv, err, cap);
  int cur = 0, desc = at->descending;
  uint64_t none = 0;
  for (int64_t w = 1; ok && w < n; w *= 2) {
    uint64_t kin = dptr(k[cur]), iin = w == 1 ? none : dptr(ix[cur]), kout = dptr(k[cur ^ 1]), iout = dptr(ix[cur ^ 1]);
    void *p[] = {&kin, &iin, &kout, &iout, &total, &n, &w, &desc};
    ok = run((cu_kernel_key){CU_SORT, EM_PRIM_ARGSORT, x->dtype, EM_I64, EM_I64, CU_STRIDED}, total, 256, p, err, cap);
    cur ^= 1;
  }
  ok = ok && copy_into(ov, ix[cur], err, cap);
  em_release(xv), em_release(ov);
  for (int i = 0; i < 2; i++) em_release(k[i]), em_release(ix[i]);
  return ok;
}

/* ---- GEMM ---- */

/* A row-major matrix operand of a GEMM as cuBLAS (column-major) sees it, for C^T = B^T A^T. */
typedef struct { bool trans; int ld; int64_t batch_stride; } gemm_operand;

/* Whether t's last two dims are row- or column-major and its batch dims collapse to one stride. */
static bool as_operand(const em_tensor *t, gemm_operand *g) {
  int n = t->ndim;
  int64_t R = t->sizes[n - 2], C = t->sizes[n - 1], s0 = t->strides[n - 2], s1 = t->strides[n - 1];
  if ((s1 == 1 || C == 1) && (R == 1 || s0 >= (C > 1 ? C : 1))) g->trans = false, g->ld = (int)(R == 1 ? (C > 1 ? C : 1) : s0);
  else if ((s0 == 1 || R == 1) && (C == 1 || s1 >= (R > 1 ? R : 1))) g->trans = true, g->ld = (int)(C == 1 ? (R > 1 ? R : 1) : s1);
  else return false;
  /* batch dims: one stride, size-1 dims ignored */
  int64_t stride = -1, expect = -1;
  for (int d = n - 3; d >= 0; d--) {
    if (t->sizes[d] == 1) continue;
    if (stride < 0) stride = t->strides[d], expect = stride * t->sizes[d];
    else if (t->strides[d] != expect) return false;
    else expect *= t->sizes[d];
  }
  g->batch_stride = stride < 0 ? 0 : stride;
  return true;
}

static em_tensor *contiguous_copy(em_tensor *t, char *err, size_t cap) {
  em_tensor *c = rt_new_device(t->dtype, t->ndim, t->sizes, EM_CUDA, "cuda", (em_site){__FILE__, __LINE__, __func__});
  if (c && !copy_into(c, t, err, cap)) em_release(c), c = NULL;
  return c;
}

/* out[b] = a[b] @ b[b] (+ out[b] when acc), row-major, out contiguous. */
static bool gemm_rowmajor(em_tensor *out, em_tensor *a, em_tensor *b, int64_t batch, bool acc, char *err, size_t cap) {
  int n = a->ndim;
  int64_t M = a->sizes[n - 2], K = a->sizes[n - 1], N = b->sizes[n - 1];
  if (M == 0 || N == 0) return true;
  if (K == 0) return acc || fill(out, 0, err, cap);
  gemm_operand ga, gb;
  em_tensor *ac = NULL, *bc = NULL;
  if (!as_operand(a, &ga)) {
    if (!(a = ac = contiguous_copy(a, err, cap))) return false;
    as_operand(a, &ga);
  }
  if (!as_operand(b, &gb)) {
    if (!(b = bc = contiguous_copy(b, err, cap))) return em_release(ac), false;
    as_operand(b, &gb);
  }
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX) {
    em_release(ac), em_release(bc);
    return fail(err, cap, "a dimension exceeds cuBLAS's 32-bit sizes");
  }
  int r = cu_drv()->gemm(cu_current_stream(), gb.trans, ga.trans, (int)N, (int)M, (int)K, a->dtype, dptr(b), gb.ld,
                         gb.batch_stride, dptr(a), ga.ld, ga.batch_stride, dptr(out), (int)N, M * N, (int)batch, acc,
                         allow_tf32, err, cap);
  em_release(ac), em_release(bc);
  return r == 0;
}

static bool matmul(em_tensor *out, em_tensor *a, em_tensor *b, char *err, size_t cap) {
  if (!ir_is_float(a->dtype)) return fail(err, cap, "has no CUDA kernel for integer operands (cuBLAS has no integer GEMM)");
  int64_t batch = 1;
  for (int d = 0; d < a->ndim - 2; d++) batch *= a->sizes[d];
  if (batch == 0) return true;
  return gemm_rowmajor(out, a, b, batch, false, err, cap);
}

/* ---- GEMMs for cuBLASLt (fused epilogues, autotuned algorithms) ---- */

int cu_gemm_prepare(cu_gemm *g, em_tensor *a, em_tensor *b, em_tensor *bias, cu_epilogue epi, const char *op,
                    em_site site) {
  memset(g, 0, sizeof *g);
  char err[256];
  int n = a->ndim;
  int64_t M = a->sizes[n - 2], K = a->sizes[n - 1], N = b->sizes[n - 1], batch = 1;
  for (int d = 0; d < n - 2; d++) batch *= a->sizes[d];
  em_dtype dt = a->dtype;
  if (b->dtype != dt || (bias && (bias->dtype != dt || bias->numel != N)) || (epi != CU_EPI_NONE) != (bias != NULL))
    return rt_error(site, op, "a cuBLASLt GEMM over mismatched operands"), 2;
  /* f64 stays with cuBLAS; cuBLASLt takes 32-bit sizes; an empty product is no GEMM */
  if ((dt != EM_F32 && dt != EM_F16 && dt != EM_BF16) || !M || !N || !K || !batch || M > INT32_MAX || N > INT32_MAX ||
      K > INT32_MAX || batch > INT32_MAX)
    return 1;
  gemm_operand ga, gb;
  int nk = 0;
  if (!as_operand(a, &ga)) {
    if (!(a = g->keep[nk++] = contiguous_copy(a, err, sizeof err))) goto fail;
    as_operand(a, &ga);
  }
  if (!as_operand(b, &gb)) {
    if (!(b = g->keep[nk++] = contiguous_copy(b, err, sizeof err))) goto fail;
    as_operand(b, &gb);
  }
  if (bias) { /* N elements one after another, 16-byte aligned (cuBLASLt reads the vector in wide loads) */
    bool dense = true;
    for (int d = 0; d < bias->ndim; d++) dense &= bias->sizes[d] == 1 || bias->strides[d] == 1;
    if ((!dense || dptr(bias) % 16) && !(bias = g->keep[nk++] = contiguous_copy(bias, err, sizeof err))) goto fail;
  }
  int64_t sizes[EM_MAX_DIMS];
  memcpy(sizes, a->sizes, sizeof(int64_t) * (size_t)n);
  sizes[n - 1] = N;
  if (!(g->out = rt_new_device(dt, n, sizes, EM_CUDA, op, site))) return cu_gemm_release(g), 2;
  /* out^T = b^T a^T, column-major: cuBLASLt's A is b, its B is a */
  g->pr = (cu_lt_problem){.dt = dt, .ta = gb.trans, .tb = ga.trans, .tf32 = allow_tf32, .m = (int)N, .n = (int)M,
                          .k = (int)K, .lda = gb.ld, .ldb = ga.ld, .ldd = (int)N, .batch = (int)batch,
                          .sa = gb.batch_stride, .sb = ga.batch_stride, .sd = M * N, .a = dptr(b), .b = dptr(a),
                          .d = dptr(g->out), .bias = bias ? dptr(bias) : 0, .epi = epi};
  return 0;
fail:
  cu_gemm_release(g);
  return rt_error(site, op, "%s", err), 2;
}

void cu_gemm_release(cu_gemm *g) {
  for (int i = 0; i < 3; i++) em_release(g->keep[i]), g->keep[i] = NULL;
}

/* A 3-D view [g, r, c] of contiguous memory at ptr's tensor t (offset in elements). */
static em_tensor *mat3(em_tensor *t, int64_t g, int64_t r, int64_t c, bool transposed) {
  int64_t sizes[3] = {g, transposed ? c : r, transposed ? r : c};
  int64_t strides[3] = {r * c, transposed ? 1 : c, transposed ? c : 1};
  return view(t, 3, sizes, strides, t->offset);
}

static k_conv conv_params(const em_conv2d_params *cp, const int64_t *x, const int64_t *w, const int64_t *o) {
  return (k_conv){x[0], x[1], x[2], x[3], w[2], w[3], o[2], o[3], cp->stride[0], cp->stride[1], cp->padding[0],
                  cp->padding[1], cp->dilation[0], cp->dilation[1]};
}

/* ---- convolutions through cuDNN ---- */

static bool cudnn_enabled = true;
void em_cuda_set_cudnn_enabled(bool enabled) { cudnn_enabled = enabled; }
bool em_cuda_cudnn_enabled(void) { return cudnn_enabled; }

static bool fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }

/* t's sizes and packed NCHW strides for a cuDNN descriptor (t dense: cuDNN's algorithms are
 * written for packed NCHW or NHWC, so other layouts are copied first, as PyTorch does); false
 * when one does not fit in an int. */
static bool dnn_dims(const em_tensor *t, int *sizes, int *strides) {
  int64_t packed = 1;
  for (int d = 3; d >= 0; d--) {
    if (!fits_int(t->sizes[d]) || !fits_int(packed)) return false;
    sizes[d] = (int)t->sizes[d], strides[d] = (int)packed;
    packed *= t->sizes[d];
  }
  return fits_int(packed);
}

/* Logs under EMBER_LOGS=perf why a convolution runs as im2col + GEMM instead of through cuDNN,
 * once for each new reason (a training loop would repeat it every step). */
static void log_fallback(const char *op, const char *why) {
  static _Thread_local char last[256];
  if (!fe_log_on(FE_LOG_PERF) || !strcmp(last, why)) return;
  snprintf(last, sizeof last, "%s", why);
  fe_log(FE_LOG_PERF, "%s on CUDA runs as im2col + GEMM: %s", op, why);
}

/* The convolution through cuDNN: 0 when it ran, 1 when cuDNN is off, missing or takes no
 * algorithm for it (why says which: the caller runs im2col + GEMM), 2 on an error (in err). */
static int conv_cudnn(em_prim op, const em_conv2d_params *cp, em_tensor *x, em_tensor *w, em_tensor *y, char *why,
                      size_t wcap, char *err, size_t cap) {
  if (!cudnn_enabled) return snprintf(why, wcap, "cuDNN is disabled (em_cuda_set_cudnn_enabled)"), 1;
  em_dtype dt = x->dtype;
  if (dt != EM_F32 && dt != EM_F64 && dt != EM_F16 && dt != EM_BF16)
    return snprintf(why, wcap, "cuDNN has no %s convolution", em_dtype_name(dt)), 1;
  em_tensor *xc = NULL, *wc = NULL, *yc = NULL;
  cu_dnn_problem p = {.op = op, .dt = dt, .tf32 = allow_tf32, .groups = (int)cp->groups};
  int rc = 1;
  /* the result is dense (the dispatcher allocates it); operands in another layout are copied */
  if (op != EM_PRIM_CONV2D_BWD_INPUT && !dense(x) && !(x = xc = contiguous_copy(x, err, cap))) goto fail;
  if (op != EM_PRIM_CONV2D && !dense(y) && !(y = yc = contiguous_copy(y, err, cap))) goto fail;
  if (op != EM_PRIM_CONV2D_BWD_WEIGHT && !dense(w) && !(w = wc = contiguous_copy(w, err, cap))) goto fail;
  int ws[4];
  bool fit = dense(x) && dense(y) && dense(w) && dnn_dims(x, p.x, p.xs) && dnn_dims(y, p.y, p.ys) &&
             dnn_dims(w, p.w, ws) && fits_int(cp->groups);
  for (int i = 0; i < 2; i++) {
    fit &= fits_int(cp->padding[i]) && fits_int(cp->stride[i]) && fits_int(cp->dilation[i]);
    if (fit) p.pad[i] = (int)cp->padding[i], p.stride[i] = (int)cp->stride[i], p.dilation[i] = (int)cp->dilation[i];
  }
  if (!fit) {
    snprintf(why, wcap, "a size, stride or parameter exceeds cuDNN's 32-bit ints");
  } else {
    p.xp = dptr(x), p.wp = dptr(w), p.yp = dptr(y);
    char msg[256] = "";
    rc = cu_dnn_conv(&p, msg, sizeof msg);
    if (rc == 1) snprintf(why, wcap, "%s", msg);
    else if (rc == 2) snprintf(err, cap, "%s", msg);
  }
  em_release(xc), em_release(wc), em_release(yc);
  return rc;
fail:
  em_release(xc), em_release(wc), em_release(yc);
  return 2;
}

/* Convolutions: x [N, C, H, W], w [O, C/g, kh, kw], y [N, O, OH, OW]; the columns are
 * [C * kh * kw, N * OH * OW] (rows (c, i, j)), so group q's rows are one block. */
static bool conv(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *const *in, char *err, size_t cap) {
  const em_conv2d_params *cp = &at->conv;
  em_site here = {__FILE__, __LINE__, __func__};
  em_tensor *x, *w, *y; /* the three tensors whatever the direction */
  em_tensor *xc = NULL, *wc = NULL, *col = NULL, *ym = NULL;
  bool ok = false;
  if (op == EM_PRIM_CONV2D) x = in[0], w = in[1], y = out;
  else if (op == EM_PRIM_CONV2D_BWD_INPUT) y = in[0], w = in[1], x = out;
  else x = in[0], y = in[1], w = out; /* in: x, grad_out */
  char why[256];
  int dnn = conv_cudnn(op, cp, x, w, y, why, sizeof why, err, cap);
  if (dnn != 1) return dnn == 0;
  log_fallback(prim_get(op)->name, why);
  /* x and w contiguous (im2col and the GEMMs assume it); a y operand may have any layout, it is
   * copied into the GEMMs' layout anyway */
  if (op != EM_PRIM_CONV2D_BWD_INPUT && !dense(x) && !(x = xc = contiguous_copy(x, err, cap))) goto done;
  if (op != EM_PRIM_CONV2D_BWD_WEIGHT && !dense(w) && !(w = wc = contiguous_copy(w, err, cap))) goto done;
  k_conv p = conv_params(cp, x->sizes, w->sizes, y->sizes);
  int64_t G = cp->groups, O = w->sizes[0], Og = O / G, CKK = p.c * p.kh * p.kw, CgKK = CKK / G, L = p.n * p.oh * p.ow;
  col = rt_new_device(x->dtype, 2, (int64_t[]){CKK, L}, EM_CUDA, "em_conv2d", here);
  /* y as [O, N*OH*OW] (the GEMMs' layout); the result is permuted to / from NCHW by a copy */
  ym = rt_new_device(x->dtype, 2, (int64_t[]){O, L}, EM_CUDA, "em_conv2d", here);
  if (!col || !ym) goto oom;
  uint64_t cptr = dptr(col);
  /* ym viewed as [N, O, OH, OW] */
  int64_t ysz[4] = {p.n, O, p.oh, p.ow}, yst[4] = {p.oh * p.ow, L, p.ow, 1};
  em_tensor *yv = view(ym, 4, ysz, yst, 0);
  if (!yv) goto oom;
  em_tensor *Wg = mat3(w, G, Og, CgKK, false), *Wt = mat3(w, G, Og, CgKK, true);
  em_tensor *Cg = mat3(col, G, CgKK, L, false), *Ct = mat3(col, G, CgKK, L, true), *Yg = mat3(ym, G, Og, L, false);
  if (Wg && Wt && Cg && Ct && Yg) {
    uint64_t xp = dptr(x);
    void *to_cols[] = {&cptr, &xp, &p}, *from_cols[] = {&xp, &cptr, &p};
    /* forward and weight gradient need x's columns; the input gradient makes columns instead */
    bool cols = op == EM_PRIM_CONV2D_BWD_INPUT ||
                run((cu_kernel_key){CU_IM2COL, EM_PRIM_CONV2D, x->dtype, x->dtype, EM_I64, CU_CONTIG}, CKK * L, 256, to_cols, err, cap);
    if (op == EM_PRIM_CONV2D) /* y = W cols */
      ok = cols && gemm_rowmajor(Yg, Wg, Cg, G, false, err, cap) && copy_into(y, yv, err, cap);
    else if (op == EM_PRIM_CONV2D_BWD_INPUT) /* cols = W^T dy, then summed back into dx */
      ok = copy_into(yv, y, err, cap) && gemm_rowmajor(Cg, Wt, Yg, G, false, err, cap) &&
           run((cu_kernel_key){CU_IM2COL, EM_PRIM_CONV2D_BWD_INPUT, x->dtype, x->dtype, EM_I64, CU_STRIDED}, x->numel, 256,
               from_cols, err, cap);
    else /* dW (= out, which w is here) = dy cols^T */
      ok = cols && copy_into(yv, y, err, cap) && gemm_rowmajor(Wg, Yg, Ct, G, false, err, cap);
  } else {
    snprintf(err, cap, "out of memory");
  }
  em_release(Wg), em_release(Wt), em_release(Cg), em_release(Ct), em_release(Yg), em_release(yv);
  goto done;
oom:
  snprintf(err, cap, "out of memory on the device");
done:
  em_release(xc), em_release(wc), em_release(col), em_release(ym);
  return ok;
}

bool cu_run_prim(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *const *in, int n_in, char *err, size_t cap) {
  unsigned f = prim_get(op)->flags;
  if (f & P_POINTWISE) return pointwise(op, at, out, in, n_in, err, cap);
  if (f & P_REDUCTION) return reduce(op, at, out, in[0], err, cap);
  if (f & P_MOVEMENT) return movement(op, at, out, in, n_in, err, cap);
  if (f & P_INDEXING) return indexing(op, at, out, in, err, cap);
  if (f & P_CREATION) return creation(op, at, out, err, cap);
  if (f & P_SCAN) return op == EM_PRIM_ARGSORT ? argsort(at, out, in[0], err, cap) : scan(op, at, out, in[0], err, cap);
  if (op == EM_PRIM_MATMUL) return matmul(out, in[0], in[1], err, cap);
  if (op == EM_PRIM_CONV2D || op == EM_PRIM_CONV2D_BWD_INPUT || op == EM_PRIM_CONV2D_BWD_WEIGHT)
    return conv(op, at, out, in, err, cap);
  return fail(err, cap, "has no CUDA kernel");
}

/* ---- moving tensors between devices ---- */

em_tensor *rt_to_device(em_tensor *x, em_device dev, const char *name, em_site site) {
  if (!x) return NULL;
  if (x->storage->device == dev) return em_retain(x);
  if (dev == EM_CUDA && !em_cuda_is_available()) {
    cu_storage_alloc(0, name, site); /* records why there is no device */
    return NULL;
  }
  em_tensor *src = x, *tmp = NULL;
  if (!dense(x)) { /* the copy moves one dense block: make it on the side that has x */
    em_tensor *ops[1] = {x};
    if (x->storage->device == EM_CUDA) {
      char err[256] = "failed on the device";
      if (!(src = tmp = contiguous_copy(x, err, sizeof err))) return rt_error(site, name, "%s", err);
    } else {
      if (!(src = tmp = rt_dispatch(name, EM_PRIM_CLONE, ops, 1, NULL, site))) return NULL;
    }
  }
  em_tensor *out = rt_new_device(x->dtype, x->ndim, x->sizes, dev, name, site);
  size_t bytes = (size_t)x->numel * ir_dtype(x->dtype)->size;
  bool ok = out != NULL;
  if (ok && dev == EM_CUDA) ok = cu_copy_to_device(dptr(out), rt_data(src), bytes, name, site);
  else if (ok) ok = cu_copy_to_host(rt_data(out), dptr(src), bytes, name, site);
  em_release(tmp);
  if (!ok) em_release(out), out = NULL;
  return out;
}

/* em_to's autograd node: the gradient goes back to the source device. */
static bool to_backward(rt_node *n, em_tensor *g, em_tensor **grads) {
  em_device src = (em_device)(uintptr_t)n->custom_ctx;
  grads[0] = rt_scope_add(rt_to_device(g, src, "em_to (backward)", n->site), "em_to (backward)", n->site);
  return grads[0] != NULL;
}
static const rt_custom_ops to_ops = {to_backward, NULL, NULL};

em_tensor *em_to_at(em_tensor *x, em_device dev, em_site site) {
  RT_ARG(x, "em_to", site);
  static const char name[] = "em_to";
  if (!x) return NULL;
  if (dev != EM_CPU && dev != EM_CUDA) return rt_error(site, name, "invalid device %d", (int)dev);
  if (x->storage->device == dev) return rt_scope_add(em_retain(x), name, site);
  int tok = rt_break_begin(name, "copies between devices", site);
  if (tok < 0) return NULL;
  em_tensor *out = rt_to_device(x, dev, name, site);
  rt_break_end(tok);
  if (out && x->requires_grad && rt_grad_enabled()) {
    prim_meta m = rt_meta(out);
    rt_node *n = rt_custom_node(name, &to_ops, (void *)(uintptr_t)x->storage->device, &x, 1, &m, site);
    if (!n) return em_release(out), NULL;
    rt_set_grad_fn(out, n);
    rt_node_release(n);
  }
  return rt_scope_add(out, name, site);
}
