/* runtime/dlpack_abi.h: the DLPack 1.0 data-exchange ABI (https://dmlc.github.io/dlpack/latest/),
 * declared here from the specification: the structures, enumerators and flags Ember exchanges,
 * laid out as the standard's dlpack.h lays them out, under the standard's names, so a program
 * that includes dlpack.h passes the same objects. Debian 12 ships dlpack.h 0.6, which predates
 * DLManagedTensorVersioned; hence this declaration. */
#ifndef EMBER_DLPACK_ABI_H
#define EMBER_DLPACK_ABI_H

#include <stdint.h>

#ifndef DLPACK_MAJOR_VERSION
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0
#define DLPACK_FLAG_BITMASK_READ_ONLY (1ull << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1ull << 1)

typedef struct {
  uint32_t major, minor;
} DLPackVersion;

/* Device kinds Ember knows: host memory, CUDA device memory, CUDA pinned host memory. */
typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 } DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

/* Element type classes; bits is the element width, lanes 1 for scalars. */
typedef enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLOpaqueHandle = 3, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 } DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

/* A strided view: element i is at data + byte_offset + sum(index_d * strides[d]) * bits / 8;
 * strides in elements, NULL for row-major contiguous. */
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;

/* Before 1.0: no version, no flags. */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* 1.0: everything up to and including deleter keeps its place in every later major version. */
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

#endif
