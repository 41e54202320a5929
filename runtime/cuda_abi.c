/* runtime/cuda_abi.c: cuda.h spells the parts of cuBLASLt's ABI that Ember uses (enum values,
 * the algorithm and heuristic-result structs) so the build needs no CUDA headers and the library
 * is dlopen'ed. A wrong value there would pass every test on the emulator, which reads cuda.h's
 * values too, and fail only on a GPU; so where the toolkit's headers are present (the build
 * found NVRTC's), this file checks each value and layout against cublasLt.h, cublas_api.h and
 * library_types.h at compile time. tests/test_cuda_lt.c asserts that the check was compiled. */
#include "cuda.h"

#include <stddef.h>

#if defined(EMBER_HAVE_NVRTC) && defined(__has_include)
#if __has_include(<cublasLt.h>)
#define EMBER_LT_HEADERS 1
#endif
#endif

#ifdef EMBER_LT_HEADERS
#include <cublasLt.h>

#define SAME(ours, theirs) _Static_assert((long long)(ours) == (long long)(theirs), #ours " differs from " #theirs)
SAME(CU_R_32F, CUDA_R_32F);
SAME(CU_R_64F, CUDA_R_64F);
SAME(CU_R_16F, CUDA_R_16F);
SAME(CU_R_16BF, CUDA_R_16BF);
SAME(CU_COMPUTE_32F, CUBLAS_COMPUTE_32F);
SAME(CU_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F_FAST_TF32);
SAME(CU_COMPUTE_64F, CUBLAS_COMPUTE_64F);
SAME(CU_OP_N, CUBLAS_OP_N);
SAME(CU_OP_T, CUBLAS_OP_T);
SAME(CU_BLAS_SUCCESS, CUBLAS_STATUS_SUCCESS);
SAME(CU_BLAS_INVALID_VALUE, CUBLAS_STATUS_INVALID_VALUE);
SAME(CU_BLAS_NOT_SUPPORTED, CUBLAS_STATUS_NOT_SUPPORTED);
SAME(CU_LT_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSA);
SAME(CU_LT_DESC_TRANSB, CUBLASLT_MATMUL_DESC_TRANSB);
SAME(CU_LT_DESC_EPILOGUE, CUBLASLT_MATMUL_DESC_EPILOGUE);
SAME(CU_LT_DESC_BIAS_POINTER, CUBLASLT_MATMUL_DESC_BIAS_POINTER);
SAME(CU_LT_DESC_BIAS_BATCH_STRIDE, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE);
SAME(CU_LT_DESC_BIAS_DATA_TYPE, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
SAME(CU_LT_LAYOUT_BATCH_COUNT, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
SAME(CU_LT_LAYOUT_STRIDED_BATCH_OFFSET, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
SAME(CU_LT_PREF_MAX_WORKSPACE_BYTES, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
SAME(CU_LT_PREF_MIN_ALIGNMENT_A, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES);
SAME(CU_LT_PREF_MIN_ALIGNMENT_B, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES);
SAME(CU_LT_PREF_MIN_ALIGNMENT_C, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES);
SAME(CU_LT_PREF_MIN_ALIGNMENT_D, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
SAME(CU_LT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_DEFAULT);
SAME(CU_LT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU);
SAME(CU_LT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_BIAS);
SAME(CU_LT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_RELU_BIAS);
SAME(CU_LT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU);
SAME(CU_LT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_BIAS);
#undef SAME

/* the structs, field by field */
#define LAYOUT(ours, theirs, field_o, field_t)                                                   \
  _Static_assert(offsetof(ours, field_o) == offsetof(theirs, field_t), #ours "." #field_o " is misplaced")
_Static_assert(sizeof(cu_lt_algo) == sizeof(cublasLtMatmulAlgo_t), "cu_lt_algo's size");
_Static_assert(sizeof(cu_lt_heuristic) == sizeof(cublasLtMatmulHeuristicResult_t), "cu_lt_heuristic's size");
LAYOUT(cu_lt_heuristic, cublasLtMatmulHeuristicResult_t, algo, algo);
LAYOUT(cu_lt_heuristic, cublasLtMatmulHeuristicResult_t, workspace_size, workspaceSize);
LAYOUT(cu_lt_heuristic, cublasLtMatmulHeuristicResult_t, state, state);
LAYOUT(cu_lt_heuristic, cublasLtMatmulHeuristicResult_t, waves, wavesCount);
#undef LAYOUT
/* cu_lt_api passes enums as int and handles as void *: the ABI must agree */
_Static_assert(sizeof(cublasStatus_t) == sizeof(int) && sizeof(cudaDataType) == sizeof(int) &&
               sizeof(cublasComputeType_t) == sizeof(int) && sizeof(cublasLtMatmulDescAttributes_t) == sizeof(int) &&
               sizeof(cublasLtMatrixLayoutAttribute_t) == sizeof(int) &&
               sizeof(cublasLtMatmulPreferenceAttributes_t) == sizeof(int),
               "a cuBLASLt enum is not int-sized");
_Static_assert(sizeof(cublasLtHandle_t) == sizeof(void *) && sizeof(cudaStream_t) == sizeof(void *),
               "handles are pointers");
/* the attribute values' sizes cuda.c passes (cublasLt.h documents each attribute's type) */
_Static_assert(sizeof(cublasOperation_t) == sizeof(int32_t) && sizeof(cublasLtEpilogue_t) == sizeof(uint32_t),
               "TRANSA/EPILOGUE are 32-bit");

bool cu_lt_abi_checked(void) { return true; }
#else
bool cu_lt_abi_checked(void) { return false; }
#endif

/* cuDNN's legacy convolution API (cuda.h's CU_DNN_* and cu_dnn_perf), against cudnn.h. The
 * functions are deprecated in cuDNN 9 but still there (PyTorch calls them); cudnn.h warns of
 * that only under CUDNN_WARN_DEPRECATED. */
#if defined(EMBER_HAVE_NVRTC) && defined(__has_include)
#if __has_include(<cudnn.h>)
#define EMBER_DNN_HEADERS 1
#endif
#endif

#ifdef EMBER_DNN_HEADERS
#include <cudnn.h>

#define SAME(ours, theirs) _Static_assert((long long)(ours) == (long long)(theirs), #ours " differs from " #theirs)
SAME(CU_DNN_DATA_FLOAT, CUDNN_DATA_FLOAT);
SAME(CU_DNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE);
SAME(CU_DNN_DATA_HALF, CUDNN_DATA_HALF);
SAME(CU_DNN_DATA_BFLOAT16, CUDNN_DATA_BFLOAT16);
SAME(CU_DNN_TENSOR_NCHW, CUDNN_TENSOR_NCHW);
SAME(CU_DNN_CROSS_CORRELATION, CUDNN_CROSS_CORRELATION);
SAME(CU_DNN_DEFAULT_MATH, CUDNN_DEFAULT_MATH);
SAME(CU_DNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH);
SAME(CU_DNN_FMA_MATH, CUDNN_FMA_MATH);
SAME(CU_DNN_STATUS_SUCCESS, CUDNN_STATUS_SUCCESS);
SAME(CU_DNN_STATUS_BAD_PARAM, CUDNN_STATUS_BAD_PARAM);
SAME(CU_DNN_STATUS_NOT_SUPPORTED, CUDNN_STATUS_NOT_SUPPORTED);
#undef SAME
/* the three perf structs, field by field (cu_dnn_perf stands for each) */
#define PERF(theirs)                                                                                             \
  _Static_assert(sizeof(cu_dnn_perf) == sizeof(theirs), #theirs "'s size");                                      \
  _Static_assert(offsetof(cu_dnn_perf, algo) == offsetof(theirs, algo), #theirs ".algo");                        \
  _Static_assert(offsetof(cu_dnn_perf, status) == offsetof(theirs, status), #theirs ".status");                  \
  _Static_assert(offsetof(cu_dnn_perf, time) == offsetof(theirs, time), #theirs ".time");                        \
  _Static_assert(offsetof(cu_dnn_perf, memory) == offsetof(theirs, memory), #theirs ".memory");                  \
  _Static_assert(offsetof(cu_dnn_perf, determinism) == offsetof(theirs, determinism), #theirs ".determinism");   \
  _Static_assert(offsetof(cu_dnn_perf, math_type) == offsetof(theirs, mathType), #theirs ".mathType")
PERF(cudnnConvolutionFwdAlgoPerf_t);
PERF(cudnnConvolutionBwdDataAlgoPerf_t);
PERF(cudnnConvolutionBwdFilterAlgoPerf_t);
#undef PERF
/* cu_dnn_api passes enums as int, handles and descriptors as void *, scaling factors by pointer */
_Static_assert(sizeof(cudnnStatus_t) == sizeof(int) && sizeof(cudnnDataType_t) == sizeof(int) &&
               sizeof(cudnnTensorFormat_t) == sizeof(int) && sizeof(cudnnConvolutionMode_t) == sizeof(int) &&
               sizeof(cudnnMathType_t) == sizeof(int) && sizeof(cudnnConvolutionFwdAlgo_t) == sizeof(int) &&
               sizeof(cudnnConvolutionBwdDataAlgo_t) == sizeof(int) &&
               sizeof(cudnnConvolutionBwdFilterAlgo_t) == sizeof(int),
               "a cuDNN enum is not int-sized");
_Static_assert(sizeof(cudnnHandle_t) == sizeof(void *) && sizeof(cudnnTensorDescriptor_t) == sizeof(void *) &&
               sizeof(cudnnFilterDescriptor_t) == sizeof(void *) &&
               sizeof(cudnnConvolutionDescriptor_t) == sizeof(void *),
               "cuDNN handles are pointers");
/* the version the emulator reports is the header's (cuDNN 9: the ABI cuda.c's loader accepts) */
_Static_assert(CUDNN_MAJOR == 9, "cuda.c speaks cuDNN 9's ABI");

bool cu_dnn_abi_checked(void) { return true; }
#else
bool cu_dnn_abi_checked(void) { return false; }
#endif
