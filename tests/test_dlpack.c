/* tests/test_dlpack.c: em_to_dlpack / em_from_dlpack (DLPack 1.0 and the pre-1.0 struct):
 * zero-copy round trips, the deleter contract (called once, when the last user goes), version
 * and read-only rules, and the errors. The exchange with NumPy is tests/dlpack_numpy.py. */
#include "common.h"

#include "../runtime/dlpack_abi.h"

/* A producer outside Ember: a malloc'd buffer and a counter of deleter calls. */
static int deleted;
static void foreign_deleter(DLManagedTensorVersioned *m) {
  deleted++;
  free(m->dl_tensor.data);
  free(m);
}
static DLManagedTensorVersioned *foreign(DLDataType dt, int ndim, const int64_t *shape, const int64_t *strides,
                                         size_t bytes) {
  DLManagedTensorVersioned *m = calloc(1, sizeof *m + 2 * EM_MAX_DIMS * sizeof(int64_t));
  int64_t *dims = (int64_t *)(m + 1);
  memcpy(dims, shape, sizeof(int64_t) * (size_t)ndim);
  if (strides) memcpy(dims + EM_MAX_DIMS, strides, sizeof(int64_t) * (size_t)ndim);
  m->version = (DLPackVersion){1, 0};
  m->deleter = foreign_deleter;
  m->dl_tensor = (DLTensor){.data = calloc(1, bytes ? bytes : 1), .device = {kDLCPU, 0}, .ndim = ndim, .dtype = dt,
                            .shape = dims, .strides = strides ? dims + EM_MAX_DIMS : NULL};
  return m;
}

ETEST(dlpack, export_shares_memory_and_holds_a_reference) {
  em_tensor *x = em_transpose(T(EM_F32, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), 0, 1); /* [3,2], strides [1,3] */
  struct DLManagedTensorVersioned *m = em_to_dlpack(x);
  cr_assert_not_null(m, "%s", em_last_error());
  cr_assert_eq(m->version.major, 1);
  cr_assert_eq(m->flags, 0);
  cr_assert_eq(m->dl_tensor.ndim, 2);
  cr_assert(m->dl_tensor.shape[0] == 3 && m->dl_tensor.shape[1] == 2 && m->dl_tensor.strides[0] == 1 &&
            m->dl_tensor.strides[1] == 3);
  cr_assert(m->dl_tensor.dtype.code == kDLFloat && m->dl_tensor.dtype.bits == 32 && m->dl_tensor.dtype.lanes == 1);
  cr_assert_eq(m->dl_tensor.device.device_type, em_device_of(x) == EM_CUDA ? kDLCUDA : kDLCPU);
  em_tensor *y = em_from_dlpack(m); /* Ember to Ember: the same memory */
  EXPECT(y, EM_F32, SHAPE(3, 2), 0, 1, 4, 2, 5, 3, 6);
  em_fill_(x, 7);
  EXPECT_ALL(y, EM_F32, SHAPE(3, 2), 0, 7);
  /* the export's reference keeps the memory after every other owner let go */
  int64_t live = em_debug_live_tensors();
  em_scope_begin();
  struct DLManagedTensor *u = em_to_dlpack_unversioned(em_ones(EM_I64, EM_SHAPE(4)));
  cr_assert_not_null(u);
  em_scope_end();
  cr_assert_eq(em_debug_live_tensors(), live + 1, "the export holds the tensor past its scope");
  cr_assert(u->dl_tensor.device.device_type == kDLCUDA || ((int64_t *)u->dl_tensor.data)[3] == 1);
  u->deleter(u);
  cr_assert_eq(em_debug_live_tensors(), live, "the deleter released it");
}

ETEST(dlpack, import_calls_the_deleter_once_when_the_last_view_goes) {
  CPU_ONLY("a host producer");
  deleted = 0;
  DLManagedTensorVersioned *m = foreign((DLDataType){kDLInt, 64, 1}, 2, (int64_t[]){2, 2}, (int64_t[]){1, 2}, 32);
  int64_t *d = m->dl_tensor.data;
  d[0] = 1, d[1] = 2, d[2] = 3, d[3] = 4;
  em_scope_begin();
  em_tensor *t = em_from_dlpack(m);
  EXPECT(t, EM_I64, SHAPE(2, 2), 0, 1, 3, 2, 4); /* column-major strides honoured */
  em_tensor *v = em_keep(em_reshape(em_transpose(t, 0, 1), EM_SHAPE(4))); /* a view outliving the scope */
  em_scope_end();
  cr_assert_eq(deleted, 0, "a view still uses the memory");
  EXPECT(v, EM_I64, SHAPE(4), 0, 1, 2, 3, 4);
  d[0] = 10;
  cr_assert_eq(etest_at(v, 0), 10, "no copy");
  em_scope_end(); /* the test's scope, then a fresh one for etest_end */
  cr_assert_eq(deleted, 1);
  em_scope_begin();
}

ETEST(dlpack, version_read_only_and_errors) {
  CPU_ONLY("a host producer");
  deleted = 0;
  DLManagedTensorVersioned *m = foreign((DLDataType){kDLFloat, 64, 1}, 1, (int64_t[]){3}, NULL, 24);
  m->version.major = 2;
  EXPECT_ERROR(em_from_dlpack(m), "DLPack version 2.0; Ember reads major version 1");
  cr_assert_eq(deleted, 1, "refused, and released as the spec says");
  m = foreign((DLDataType){kDLFloat, 64, 1}, 1, (int64_t[]){3}, NULL, 24);
  m->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  ((double *)m->dl_tensor.data)[1] = 2.5;
  em_tensor *c = em_from_dlpack(m);
  cr_assert_eq(deleted, 2, "a read-only tensor is copied and released at once");
  EXPECT(c, EM_F64, SHAPE(3), 0, 0, 2.5, 0);
  m = foreign((DLDataType){kDLComplex, 64, 1}, 1, (int64_t[]){3}, NULL, 24);
  EXPECT_ERROR(em_from_dlpack(m), "dtype code 5, 64 bits, 1 lanes has no Ember dtype");
  m = foreign((DLDataType){kDLFloat, 32, 4}, 1, (int64_t[]){3}, NULL, 48);
  EXPECT_ERROR(em_from_dlpack(m), "4 lanes");
  m = foreign((DLDataType){kDLFloat, 32, 1}, 1, (int64_t[]){3}, (int64_t[]){-1}, 12);
  EXPECT_ERROR(em_from_dlpack(m), "dim 0: size 3, stride -1");
  m = foreign((DLDataType){kDLFloat, 32, 1}, 1, (int64_t[]){3}, NULL, 12);
  m->dl_tensor.device = (DLDevice){kDLCUDA, 1};
  EXPECT_ERROR(em_from_dlpack(m), "device type 2, id 1");
  cr_assert_eq(deleted, 6, "every refused tensor was released");
  EXPECT_ERROR(em_from_dlpack(NULL), "the managed tensor is NULL");
  EXPECT_ERROR(em_to_dlpack(EM_NONE), "EM_NONE");
  cr_assert_null(em_to_dlpack(NULL));
}

static em_tensor *export_import(void) {
  em_tensor *x = em_ones(EM_F32, EM_SHAPE(2, 3));
  struct DLManagedTensorVersioned *m = em_to_dlpack(x);
  return m ? em_from_dlpack(m) : NULL;
}

ETEST(dlpack, allocation_failures) {
  cr_assert_gt(etest_fail_each_allocation("dlpack", export_import, 100), 0);
}
