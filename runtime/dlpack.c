/* runtime/dlpack.c: em_to_dlpack / em_from_dlpack, zero-copy exchange with NumPy, PyTorch, JAX,
 * CuPy and anything else that speaks DLPack (runtime/dlpack_abi.h).
 *
 * Export hands out a DLManagedTensorVersioned (or the pre-1.0 DLManagedTensor) that points at
 * the tensor's own memory and holds one reference to it; the consumer's call of the deleter
 * drops that reference and frees the struct, so the memory lives exactly as long as both sides
 * need it. Import wraps the producer's memory in external storage (rt_new_external) whose
 * release calls the producer's deleter once, when Ember's last view of it goes. */
#include "rt.h"
#include "dlpack_abi.h"

#include <string.h>

static const struct {
  em_dtype dt;
  uint8_t code, bits;
} dtype_map[] = {
    {EM_F32, kDLFloat, 32}, {EM_F64, kDLFloat, 64}, {EM_I32, kDLInt, 32}, {EM_I64, kDLInt, 64},
    {EM_BOOL, kDLBool, 8},  {EM_U8, kDLUInt, 8},    {EM_F16, kDLFloat, 16}, {EM_BF16, kDLBfloat, 16},
};
#define N_MAP (int)(sizeof dtype_map / sizeof dtype_map[0])

/* ---- export ---- */

/* Fills dl for x (a real tensor), with shape and strides stored at dims[0..2*ndim). */
static void describe(em_tensor *x, DLTensor *dl, int64_t *dims) {
  memset(dl, 0, sizeof *dl);
  dl->data = rt_data(x);
  dl->device = x->storage->device == EM_CUDA ? (DLDevice){kDLCUDA, 0} : (DLDevice){kDLCPU, 0};
  dl->ndim = x->ndim;
  for (int i = 0; i < N_MAP; i++)
    if (dtype_map[i].dt == x->dtype) dl->dtype = (DLDataType){dtype_map[i].code, dtype_map[i].bits, 1};
  memcpy(dims, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
  memcpy(dims + x->ndim, x->strides, sizeof(int64_t) * (size_t)x->ndim);
  dl->shape = dims;
  dl->strides = dims + x->ndim;
}

/* The tensor to export: real (a proxy inside em_compile is materialized by em_data_ptr, a graph
 * break) and its device work finished, as the consumer reads it at once. Caller-owned. */
static em_tensor *exportable(em_tensor *x, const char *op, em_site site) {
  if (!rt_tensor_arg(x, op, site)) return NULL;
  if (!em_data_ptr_at(x, site) && x->numel) return NULL;
  if (x->storage->device == EM_CUDA && !em_cuda_synchronize_at(site)) return NULL;
  return em_retain(x);
}

/* The export's struct (head bytes, then room for shape and strides), with *x exportable and
 * retained; NULL with an error (nothing retained). */
static void *export_alloc(em_tensor **x, size_t head, const char *op, em_site site) {
  if (!(*x = exportable(*x, op, site))) return NULL;
  void *m = rt_alloc(head + sizeof(int64_t) * 2 * (size_t)(*x)->ndim, 16);
  if (!m) return em_release(*x), rt_error(site, op, "out of memory");
  memset(m, 0, head);
  return m;
}

static void versioned_deleter(DLManagedTensorVersioned *m) {
  em_release(m->manager_ctx);
  rt_free(m);
}

struct DLManagedTensorVersioned *em_to_dlpack_at(em_tensor *x, em_site site) {
  DLManagedTensorVersioned *m = export_alloc(&x, sizeof *m, "em_to_dlpack", site);
  if (!m) return NULL;
  describe(x, &m->dl_tensor, (int64_t *)(m + 1));
  *m = (DLManagedTensorVersioned){.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}, .manager_ctx = x,
                                  .deleter = versioned_deleter, .flags = 0, /* writable, shared: not a copy */
                                  .dl_tensor = m->dl_tensor};
  return m;
}

static void unversioned_deleter(DLManagedTensor *m) {
  em_release(m->manager_ctx);
  rt_free(m);
}

struct DLManagedTensor *em_to_dlpack_unversioned_at(em_tensor *x, em_site site) {
  DLManagedTensor *m = export_alloc(&x, sizeof *m, "em_to_dlpack_unversioned", site);
  if (!m) return NULL;
  describe(x, &m->dl_tensor, (int64_t *)(m + 1));
  m->manager_ctx = x;
  m->deleter = unversioned_deleter;
  return m;
}

/* ---- import ---- */

static void release_versioned(void *ctx) {
  DLManagedTensorVersioned *m = ctx;
  if (m->deleter) m->deleter(m);
}
static void release_unversioned(void *ctx) {
  DLManagedTensor *m = ctx;
  if (m->deleter) m->deleter(m);
}

/* A tensor over dl's memory; release(ctx) when it goes. On failure release(ctx) has run: the
 * consumer owns what it was given either way. Caller-owned. */
static em_tensor *wrap(const DLTensor *dl, bool read_only, void (*release)(void *), void *ctx, const char *op,
                       em_site site) {
  char what[96];
  em_device dev;
  em_tensor *t = NULL;
  int dt = -1;
  int64_t span = 1; /* elements from the first to one past the last addressed */
  if (dl->device.device_type == kDLCPU || dl->device.device_type == kDLCUDAHost) dev = EM_CPU;
  else if (dl->device.device_type == kDLCUDA && dl->device.device_id == 0) dev = EM_CUDA;
  else {
    rt_error(site, op, "device type %d, id %d: Ember has the CPU and CUDA device 0", (int)dl->device.device_type,
             (int)dl->device.device_id);
    goto fail;
  }
  for (int i = 0; i < N_MAP; i++)
    if (dtype_map[i].code == dl->dtype.code && dtype_map[i].bits == dl->dtype.bits && dl->dtype.lanes == 1)
      dt = (int)dtype_map[i].dt;
  if (dt < 0) {
    rt_error(site, op, "dtype code %u, %u bits, %u lanes has no Ember dtype", dl->dtype.code, dl->dtype.bits,
             dl->dtype.lanes);
    goto fail;
  }
  if (dl->ndim < 0 || dl->ndim > EM_MAX_DIMS || (dl->ndim && !dl->shape)) {
    rt_error(site, op, "%d dims (shape %s); Ember tensors have 0 to %d", (int)dl->ndim, dl->shape ? "given" : "NULL",
             EM_MAX_DIMS);
    goto fail;
  }
  int64_t strides[EM_MAX_DIMS];
  if (dl->strides) memcpy(strides, dl->strides, sizeof(int64_t) * (size_t)dl->ndim);
  else if (ir_shape_fits(dl->ndim, dl->shape)) ir_contiguous_strides(dl->ndim, dl->shape, strides);
  bool empty = false;
  for (int d = 0; d < dl->ndim; d++) {
    int64_t ext;
    if (dl->shape[d] < 0 || strides[d] < 0 || !ir_mul_ok(dl->shape[d] ? dl->shape[d] - 1 : 0, strides[d], &ext) ||
        !ir_add_ok(span, ext, &span)) {
      snprintf(what, sizeof what, "dim %d: size %lld, stride %lld", d, (long long)dl->shape[d], (long long)strides[d]);
      rt_error(site, op, "%s: Ember needs sizes >= 0, strides >= 0 and an extent that fits in 64 bits", what);
      goto fail;
    }
    empty |= dl->shape[d] == 0;
  }
  size_t esize = ir_dtype((em_dtype)dt)->size, bytes;
  if (__builtin_mul_overflow((size_t)(empty ? 0 : span), esize, &bytes)) bytes = SIZE_MAX;
  char *data = (char *)dl->data + dl->byte_offset;
  t = rt_new_external((em_dtype)dt, dl->ndim, dl->shape, strides, 0, dev, data, bytes, release, ctx, op, site);
  if (!t) goto fail;
  if (read_only) { /* Ember has no read-only tensors: the consumer gets its own copy */
    em_tensor *c = em_retain(em_clone_at(t, site));
    em_release(t); /* runs release */
    return c;
  }
  return t;
fail:
  release(ctx);
  return NULL;
}

em_tensor *em_from_dlpack_at(struct DLManagedTensorVersioned *m, em_site site) {
  static const char op[] = "em_from_dlpack";
  if (!m) return rt_error(site, op, "the managed tensor is NULL");
  if (m->version.major != DLPACK_MAJOR_VERSION) {
    /* only version and deleter are known to be where 1.0 put them */
    uint32_t major = m->version.major, minor = m->version.minor;
    if (m->deleter) m->deleter(m);
    return rt_error(site, op, "DLPack version %u.%u; Ember reads major version %d", major, minor, DLPACK_MAJOR_VERSION);
  }
  bool ro = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
  return rt_scope_add(wrap(&m->dl_tensor, ro, release_versioned, m, op, site), op, site);
}

em_tensor *em_from_dlpack_unversioned_at(struct DLManagedTensor *m, em_site site) {
  static const char op[] = "em_from_dlpack_unversioned";
  if (!m) return rt_error(site, op, "the managed tensor is NULL");
  return rt_scope_add(wrap(&m->dl_tensor, false, release_unversioned, m, op, site), op, site);
}
