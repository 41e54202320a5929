/* runtime/cuda.h: the CUDA device runtime's private interface: the driver API loaded at run time
 * (cuda.c) and the caching allocator (cuda_alloc.c), which works over any device backend so its
 * bookkeeping is tested without a GPU.
 *
 * The driver is dlopen'ed (libcuda.so.1), never linked: one build runs on machines with no GPU
 * or driver, and em_cuda_is_available() says false there. The types below are the driver ABI's
 * (cuda.h: CUresult is an int enum, CUdevice an int, CUdeviceptr an unsigned 64-bit integer,
 * contexts and streams opaque pointers); they are spelled here so the build does not need the
 * toolkit's headers. */
#ifndef EMBER_RUNTIME_CUDA_H
#define EMBER_RUNTIME_CUDA_H

#include <ember.h>

#include "../prims/prims.h"
#include "../ir/graph.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the caching allocator (cuda_alloc.c) ---- */

/* Where segments come from: cuMemAlloc on a device, host memory with a limit in tests.
 * alloc returns 0 on success, 1 when the device is out of memory, 2 on any other failure (with
 * a reason in why). */
typedef struct cu_backend {
  void *ctx;
  int (*alloc)(void *ctx, size_t bytes, uint64_t *ptr, char *why, size_t cap);
  void (*free)(void *ctx, uint64_t ptr);
} cu_backend;

/* A block: a piece of a segment, handed out whole to one tensor or free in its pool. Blocks of
 * a segment form a list by address (prev, next); a free block is also on its pool's free list. */
typedef struct cu_block {
  uint64_t ptr;
  size_t size;            /* rounded */
  size_t requested;       /* what the caller asked for (allocated blocks) */
  uintptr_t stream;       /* the stream it was allocated on: reused only there */
  bool allocated, small;  /* small: from the small pool (requests of at most 1 MiB) */
  struct cu_allocator *owner; /* the allocator that handed it out (the device's, or a graph's pool) */
  struct cu_block *prev, *next;
  struct cu_block *free_prev, *free_next;
} cu_block;

typedef struct cu_allocator cu_allocator;

/* Rounding and pools, as PyTorch's CUDA caching allocator does them (PyTorch paper, sec. 5.3;
 * c10/cuda/CUDACachingAllocator): requests round up to 512 bytes; requests of at most 1 MiB
 * come from 2 MiB segments (the small pool), larger ones from 20 MiB segments below 10 MiB and
 * from segments rounded up to 2 MiB above. A free block is split when what is left over is at
 * least 512 bytes (small pool) or more than 1 MiB (large pool). */
#define CU_MIN_BLOCK ((size_t)512)
#define CU_SMALL_SIZE ((size_t)1 << 20)
#define CU_SMALL_SEGMENT ((size_t)2 << 20)
#define CU_LARGE_SEGMENT ((size_t)20 << 20)
#define CU_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define CU_ROUND_LARGE ((size_t)2 << 20)

cu_allocator *cu_allocator_new(cu_backend backend, const char *device_name);
/* Frees the allocator and every cached segment; returns the number of segments still holding
 * allocated blocks (0 unless blocks leaked; those segments are not freed). */
int cu_allocator_free(cu_allocator *a);
/* A block of at least bytes (0 gives a block of 512) for use on stream; NULL with a reason in
 * err when the device has no memory left even after the cache was emptied and the request
 * retried once, or when the backend fails. */
cu_block *cu_alloc(cu_allocator *a, size_t bytes, uintptr_t stream, char *err, size_t cap);
/* Returns b to its pool, merged with free neighbours of its segment. NULL is ignored. */
void cu_release(cu_allocator *a, cu_block *b);
/* Gives every segment with no allocated block back to the backend. */
void cu_empty_cache(cu_allocator *a);
em_cuda_memory_stats cu_stats(cu_allocator *a);
/* Peaks start again from the current values. */
void cu_reset_peaks(cu_allocator *a);
/* Free blocks cached in the two pools (for tests). */
int cu_free_blocks(cu_allocator *a, bool small);

/* ---- the eager kernels (cuda_kernels.c) ---- */

/* Layout kinds a kernel is specialised to (see cuda_kernels.c). */
typedef enum cu_layout { CU_CONTIG, CU_BROADCAST, CU_STRIDED } cu_layout;
typedef enum cu_family { CU_POINTWISE, CU_REDUCE, CU_COPY, CU_FILL, CU_IOTA, CU_PHILOX, CU_INDEX, CU_IM2COL, CU_SCAN, CU_SORT } cu_family;
/* One kernel: its family, prim, operand and result dtypes, index dtype (indexing), layout kind.
 * CU_IM2COL: CU_CONTIG is im2col, CU_STRIDED col2im. scatter_add has no bool or u8 kernel (CUDA
 * has no byte atomicAdd): those run through i32. */
typedef struct cu_kernel_key {
  cu_family family;
  em_prim op;
  em_dtype in, out, idx;
  cu_layout layout;
} cu_kernel_key;

/* Every kernel eager CUDA execution can ask for: all prims x dtypes (as their meta functions
 * allow) x layout kinds. Writes at most cap keys (keys may be NULL); returns how many there are. */
int cu_kernel_keys(cu_kernel_key *keys, int cap);
/* The text every kernel's translation unit starts with. */
const char *cu_kernel_prelude(void);
/* k's CUDA C (after the prelude) in *src (the caller frees it) and its extern "C" name; false
 * for a key outside the set. */
bool cu_kernel_body(const cu_kernel_key *k, char **src, char *name, size_t ncap);
/* Compiles src with NVRTC for arch ("sm_90"): the cubin (caller frees) and its size; NVRTC's
 * log, if any, in *log (caller frees). False when compilation fails or the build has no NVRTC. */
bool cu_nvrtc_compile(const char *src, const char *name, const char *arch, char **cubin, size_t *size, char **log);
bool cu_nvrtc_available(void);
/* NVRTC's version (nvrtcVersion); false (0.0) when the build has no NVRTC. */
bool cu_nvrtc_version(int *major, int *minor);
/* What decides a cubin besides its source and arch, for the kernel disk cache's key: "nvrtc
 * cubin <major>.<minor>", so a new NVRTC (whose code may differ, or whose cubin an older driver
 * may reject) never reads images another version compiled. */
void cu_nvrtc_cache_salt(char *buf, size_t cap);
/* src as PTX for a virtual arch ("compute_90"; caller frees *ptx and *log), for tests that look
 * at the instructions a kernel gets. False as cu_nvrtc_compile. */
bool cu_nvrtc_ptx(const char *src, const char *name, const char *arch, char **ptx, char **log);

/* ---- cuBLASLt's ABI, as Ember calls it ----
 *
 * cuBLASLt (libcublasLt, dlopen'ed beside cuBLAS) runs GEMMs with fused epilogues (bias, ReLU,
 * GELU) and lets a caller pick among its algorithms. Its entry points are spelled here with plain
 * C types (handles and descriptors as opaque pointers, enums as int, which is how the ABI passes
 * them), and the enum values Ember uses are copied from cublasLt.h, cublas_api.h and
 * library_types.h; runtime/cuda_abi.c checks every value and struct layout below against those
 * headers at compile time when the toolkit is present (cu_lt_abi_checked says whether it was). */
enum {
  CU_R_32F = 0, CU_R_64F = 1, CU_R_16F = 2, CU_R_16BF = 14,               /* cudaDataType_t */
  CU_COMPUTE_32F = 68, CU_COMPUTE_32F_FAST_TF32 = 77, CU_COMPUTE_64F = 70, /* cublasComputeType_t */
  CU_OP_N = 0, CU_OP_T = 1,                                                /* cublasOperation_t */
  CU_BLAS_SUCCESS = 0, CU_BLAS_INVALID_VALUE = 7, CU_BLAS_NOT_SUPPORTED = 15, /* cublasStatus_t */
  /* cublasLtMatmulDescAttributes_t: TRANSA/TRANSB int32, EPILOGUE uint32, BIAS_POINTER a pointer,
   * BIAS_BATCH_STRIDE int64, BIAS_DATA_TYPE int32 */
  CU_LT_DESC_TRANSA = 3, CU_LT_DESC_TRANSB = 4, CU_LT_DESC_EPILOGUE = 7, CU_LT_DESC_BIAS_POINTER = 8,
  CU_LT_DESC_BIAS_BATCH_STRIDE = 10, CU_LT_DESC_BIAS_DATA_TYPE = 26,
  /* cublasLtMatrixLayoutAttribute_t: BATCH_COUNT int32, STRIDED_BATCH_OFFSET int64 */
  CU_LT_LAYOUT_BATCH_COUNT = 5, CU_LT_LAYOUT_STRIDED_BATCH_OFFSET = 6,
  /* cublasLtMatmulPreferenceAttributes_t: MAX_WORKSPACE_BYTES uint64, MIN_ALIGNMENT_* uint32 */
  CU_LT_PREF_MAX_WORKSPACE_BYTES = 1, CU_LT_PREF_MIN_ALIGNMENT_A = 5, CU_LT_PREF_MIN_ALIGNMENT_B = 6,
  CU_LT_PREF_MIN_ALIGNMENT_C = 7, CU_LT_PREF_MIN_ALIGNMENT_D = 8,
  /* cublasLtEpilogue_t. GELU is the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  CU_LT_EPILOGUE_DEFAULT = 1, CU_LT_EPILOGUE_RELU = 2, CU_LT_EPILOGUE_BIAS = 4, CU_LT_EPILOGUE_RELU_BIAS = 6,
  CU_LT_EPILOGUE_GELU = 32, CU_LT_EPILOGUE_GELU_BIAS = 36,
};
/* cublasLtMatmulAlgo_t: semi-opaque; "can be trivially serialized and later restored for use
 * with the same version of cuBLAS" (cublasLt.h), which the autotuner's disk cache relies on. */
typedef struct cu_lt_algo { uint64_t data[8]; } cu_lt_algo;
/* cublasLtMatmulHeuristicResult_t */
typedef struct cu_lt_heuristic {
  cu_lt_algo algo;
  size_t workspace_size;
  int state;   /* cublasStatus_t: the other fields are valid when 0 */
  float waves;
  int reserved[4];
} cu_lt_heuristic;
/* The entry points, in cuBLASLt's argument order (handle, descriptors and layouts opaque). */
typedef struct cu_lt_api {
  int (*create)(void **handle);
  int (*desc_create)(void **desc, int compute_type, int scale_type);
  int (*desc_destroy)(void *desc);
  int (*desc_set)(void *desc, int attr, const void *buf, size_t size);
  int (*layout_create)(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld);
  int (*layout_destroy)(void *layout);
  int (*layout_set)(void *layout, int attr, const void *buf, size_t size);
  int (*pref_create)(void **pref);
  int (*pref_destroy)(void *pref);
  int (*pref_set)(void *pref, int attr, const void *buf, size_t size);
  int (*heuristic)(void *handle, void *desc, void *a, void *b, void *c, void *d, void *pref, int requested,
                   cu_lt_heuristic *results, int *returned);
  int (*matmul)(void *handle, void *desc, const void *alpha, const void *a, void *adesc, const void *b, void *bdesc,
                const void *beta, const void *c, void *cdesc, void *d, void *ddesc, const cu_lt_algo *algo,
                void *workspace, size_t workspace_size, void *stream);
  size_t (*version)(void);
} cu_lt_api;
/* runtime/cuda_abi.c: whether the values above were checked against the toolkit's headers. */
bool cu_lt_abi_checked(void);

/* ---- cuDNN's ABI, as Ember calls it ----
 *
 * Convolutions on CUDA go through cuDNN's legacy convolution API (libcudnn, dlopen'ed beside
 * cuBLAS): tensor, filter and convolution descriptors, the _v7 heuristics that rank the
 * algorithms, and cudnnConvolutionForward / BackwardData / BackwardFilter, as PyTorch's
 * aten/src/ATen/native/cudnn/Conv_v7.cpp drives them. Spelled here with plain C types as
 * cuBLASLt's are above (descriptors and handles opaque pointers, enums int); runtime/cuda_abi.c
 * checks the values and the perf struct against cudnn.h when the toolkit has it. */
enum {
  CU_DNN_DATA_FLOAT = 0, CU_DNN_DATA_DOUBLE = 1, CU_DNN_DATA_HALF = 2, CU_DNN_DATA_BFLOAT16 = 9, /* cudnnDataType_t */
  CU_DNN_TENSOR_NCHW = 0,                                                                 /* cudnnTensorFormat_t */
  CU_DNN_CROSS_CORRELATION = 1,                                                       /* cudnnConvolutionMode_t */
  CU_DNN_DEFAULT_MATH = 0, CU_DNN_TENSOR_OP_MATH = 1, CU_DNN_FMA_MATH = 3,                 /* cudnnMathType_t */
  CU_DNN_STATUS_SUCCESS = 0, CU_DNN_STATUS_BAD_PARAM = 2000, CU_DNN_STATUS_NOT_SUPPORTED = 3000, /* cudnnStatus_t */
};
/* cudnnConvolutionFwdAlgoPerf_t, and BwdData's and BwdFilter's, which have the same fields (algo
 * is each direction's own enum) */
typedef struct cu_dnn_perf {
  int algo, status; /* status 0: the other fields are valid */
  float time;       /* -1 from the heuristics (nothing was timed) */
  size_t memory;    /* workspace bytes */
  int determinism, math_type;
  int reserved[3];
} cu_dnn_perf;
/* The entry points, in cuDNN's argument order. */
typedef struct cu_dnn_api {
  size_t (*version)(void);
  const char *(*error_string)(int status);
  int (*create)(void **handle);
  int (*set_stream)(void *handle, void *stream);
  int (*tensor_create)(void **desc);
  int (*tensor_destroy)(void *desc);
  /* cudnnSetTensor4dDescriptorEx: sizes, then strides in elements */
  int (*tensor_set)(void *desc, int type, int n, int c, int h, int w, int ns, int cs, int hs, int ws);
  int (*filter_create)(void **desc);
  int (*filter_destroy)(void *desc);
  int (*filter_set)(void *desc, int type, int format, int k, int c, int h, int w);
  int (*conv_create)(void **desc);
  int (*conv_destroy)(void *desc);
  int (*conv_set)(void *desc, int pad_h, int pad_w, int u, int v, int dil_h, int dil_w, int mode, int compute_type);
  int (*conv_groups)(void *desc, int groups);
  int (*conv_math)(void *desc, int math_type);
  /* the _v7 heuristics: x, w, conv, y descriptors (forward); w, dy, conv, dx (data); x, dy, conv, dw (filter) */
  int (*fwd_algos)(void *h, void *xd, void *wd, void *cd, void *yd, int want, int *got, cu_dnn_perf *perf);
  int (*bwd_data_algos)(void *h, void *wd, void *dyd, void *cd, void *dxd, int want, int *got, cu_dnn_perf *perf);
  int (*bwd_filter_algos)(void *h, void *xd, void *dyd, void *cd, void *dwd, int want, int *got, cu_dnn_perf *perf);
  int (*fwd)(void *h, const void *alpha, void *xd, const void *x, void *wd, const void *w, void *cd, int algo, void *ws,
             size_t ws_size, const void *beta, void *yd, void *y);
  int (*bwd_data)(void *h, const void *alpha, void *wd, const void *w, void *dyd, const void *dy, void *cd, int algo,
                  void *ws, size_t ws_size, const void *beta, void *dxd, void *dx);
  int (*bwd_filter)(void *h, const void *alpha, void *xd, const void *x, void *dyd, const void *dy, void *cd, int algo,
                    void *ws, size_t ws_size, const void *beta, void *dwd, void *dw);
} cu_dnn_api;
/* runtime/cuda_abi.c: whether the values above were checked against cudnn.h. */
bool cu_dnn_abi_checked(void);

/* ---- the driver (cuda.c) and its emulator (cuda_emu.c) ----
 *
 * Everything the runtime asks of a device goes through this table: the CUDA driver API's
 * functions (dlsym'd; the signatures are the driver's, return values CUresult, 0 on success),
 * kernel compilation and cuBLAS. The emulator implements the same table on the host (device
 * memory is host memory, kernels are the same CUDA C compiled by the host C++ compiler, GEMM
 * through a CPU BLAS), so the device runtime's host side (allocation, copies, streams, events,
 * launches, every eager CUDA op and autograd through them) is tested on machines without a GPU:
 * EMBER_CUDA_EMULATE=1 makes the emulator device 0. */
typedef void *cu_stream;   /* CUstream; NULL is the legacy default stream */
typedef void *cu_event;    /* CUevent */
typedef void *cu_function; /* CUfunction */

typedef struct cu_driver {
  const char *name;      /* "CUDA driver" or "CUDA emulator (host)" */
  const char *cache_salt; /* what else than the source decides a kernel's image (the disk cache's key) */
  bool emulated;
  int (*mem_alloc)(uint64_t *p, size_t bytes);
  int (*mem_free)(uint64_t p);
  int (*host_alloc)(void **p, size_t bytes, unsigned flags); /* pinned host memory */
  int (*host_free)(void *p);
  int (*memcpy_htod)(uint64_t dst, const void *src, size_t n, cu_stream s);
  int (*memcpy_dtoh)(void *dst, uint64_t src, size_t n, cu_stream s);
  int (*memcpy_dtod)(uint64_t dst, uint64_t src, size_t n, cu_stream s);
  int (*stream_create)(cu_stream *s, unsigned flags);
  int (*stream_destroy)(cu_stream s);
  int (*stream_sync)(cu_stream s);
  int (*stream_wait_event)(cu_stream s, cu_event e, unsigned flags);
  int (*event_create)(cu_event *e, unsigned flags);
  int (*event_destroy)(cu_event e);
  int (*event_record)(cu_event e, cu_stream s);
  int (*event_sync)(cu_event e);
  int (*event_elapsed)(float *ms, cu_event start, cu_event end);
  int (*module_load)(void **m, const void *image);
  int (*module_get_function)(cu_function *f, void *m, const char *name);
  int (*launch)(cu_function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shmem, cu_stream s, void **params, void **extra);
  int (*ctx_sync)(void);
  /* CUDA graphs (NULL when the driver lacks them): capture what is queued on a stream (mode 2:
   * relaxed, so allocation may happen while capturing) into a graph, instantiate it, and launch
   * the instance on a stream; a stream sync or a download while capturing invalidates the
   * capture (CUDA_ERROR_STREAM_CAPTURE_*). */
  int (*stream_begin_capture)(cu_stream s, int mode);
  int (*stream_end_capture)(cu_stream s, void **graph);
  int (*graph_instantiate)(void **exec, void *graph, unsigned long long flags);
  int (*graph_launch)(void *exec, cu_stream s);
  int (*graph_exec_destroy)(void *exec);
  int (*graph_destroy)(void *graph);
  const char *(*error_string)(int r);
  /* Compiles one kernel's CUDA C for this device: an image module_load accepts (caller frees),
   * or false with a reason in *log (caller frees). */
  bool (*compile)(const char *src, const char *name, char **image, size_t *size, char **log);
  /* C[b] = op(A[b]) op(B[b]) (+ C[b] when accumulate) for b < batch, column-major as BLAS,
   * A, B and C of dtype dt (f32, f64, f16, bf16; f32 accumulation for the half types); tf32
   * lets f32 GEMMs use TF32 tensor cores. 0 on success, else a reason in why. */
  int (*gemm)(cu_stream s, bool ta, bool tb, int m, int n, int k, em_dtype dt, uint64_t a, int lda, int64_t sa,
              uint64_t b, int ldb, int64_t sb, uint64_t c, int ldc, int64_t sc, int batch, bool accumulate, bool tf32,
              char *why, size_t cap);
  /* cuBLASLt's entry points (loaded at the first call), or NULL with the reason in why. */
  const cu_lt_api *(*lt)(char *why, size_t cap);
  /* cuDNN's entry points (loaded at the first convolution), or NULL with the reason in why. */
  const cu_dnn_api *(*dnn)(char *why, size_t cap);
} cu_driver;

/* ---- GEMMs through cuBLASLt: fused epilogues, a choice of algorithm (cuda.c, cuda_ops.c) ----
 *
 * The compiled CUDA schedule runs matmul -> add(bias over rows) [-> relu | tanh GELU] as one
 * cublasLtMatmul with an epilogue, and under max-autotune times cuBLASLt's algorithms for each
 * GEMM (inductor/schedule.c, run.c, cuda_codegen.c). */
typedef enum cu_epilogue { CU_EPI_NONE, CU_EPI_BIAS, CU_EPI_BIAS_RELU, CU_EPI_BIAS_GELU_TANH } cu_epilogue;

/* One GEMM as cuBLASLt sees it (column-major): D[i] = act(op(A[i]) op(B[i]) + bias) for i <
 * batch, bias of m elements added to every column. For a row-major out = a @ b this is
 * out^T = b^T a^T: A is b, B is a, m = N, n = M (cu_gemm_prepare). */
typedef struct cu_lt_problem {
  em_dtype dt;       /* of A, B, D and the bias: f32, f16 or bf16 (f32 accumulation), or f64 */
  bool ta, tb, tf32; /* tf32: f32 GEMMs may use TF32 tensor cores (em_cuda_set_allow_tf32) */
  int m, n, k, lda, ldb, ldd, batch;
  int64_t sa, sb, sd; /* batch strides in elements */
  uint64_t a, b, d, bias; /* device addresses; bias 0 with CU_EPI_NONE */
  cu_epilogue epi;
} cu_lt_problem;

/* How cu_lt_matmul picks its algorithm. */
typedef struct cu_lt_choice {
  bool given;      /* in: run algo, a choice made before for this very problem (cu_lt_describe) */
  bool tune;       /* in, when not given: time up to 8 of the heuristic's candidates and run the fastest */
  cu_lt_algo algo; /* in (given) and out: the algorithm that runs */
  size_t workspace; /* in (given) and out: the workspace bytes it needs (the heuristic says) */
  int timed;       /* out: candidates compared (when tuning; 1 when the heuristic offered only one) */
} cu_lt_choice;

/* Whether cuBLASLt loads (the emulator's always does); false with the reason in why. */
bool cu_lt_available(char *why, size_t cap);
/* Runs pr on the current stream: 0 on success; 1 when cuBLASLt has no algorithm for it (the
 * caller runs it another way); 2 on an error. why says what happened for 1 and 2. A workspace
 * (at most 32 MiB) comes from the caching allocator; tuning waits for the device, so it is
 * refused while capturing a CUDA graph (the heuristic's first choice runs instead). */
int cu_lt_matmul(const cu_lt_problem *pr, cu_lt_choice *choice, char *why, size_t cap);
/* The text that identifies pr for an algorithm choice: sizes, transposes, leading dimensions,
 * batch strides, dtype, epilogue, the pointers' alignments (the heuristic's candidates depend on
 * them) and the cuBLASLt version (an algorithm is valid for the version that chose it). */
void cu_lt_describe(const cu_lt_problem *pr, char *buf, size_t cap);
/* The emulator's record of its cuBLASLt calls, for tests: matmuls run, candidates the heuristic
 * returned, and the algorithm of the last matmul (its data[0] numbers it among the candidates). */
typedef struct cu_emu_lt_stats {
  int64_t matmuls, heuristics;
  cu_lt_algo last_algo;
  int last_epilogue;
} cu_emu_lt_stats;
cu_emu_lt_stats cu_emu_lt_stats_get(void);

/* cuda_ops.c: out = act(a @ b + bias) as a cuBLASLt problem. a: [..., M, K], b: [..., K, N]
 * (the matmul prim's operands, batch dims alike), bias: N elements (any shape, or NULL with
 * CU_EPI_NONE), all on the device and of one dtype. Allocates out ([..., M, N], contiguous);
 * operands cuBLASLt cannot read in place are copied into keep. Returns 0 when g is ready, 1 when
 * the GEMM is not for cuBLASLt (a size is 0, or exceeds 32 bits: the caller computes it another
 * way; nothing is held), 2 with an error recorded. */
typedef struct cu_gemm {
  cu_lt_problem pr;
  em_tensor *out;     /* caller-owned once prepared */
  em_tensor *keep[3]; /* copies the problem reads: cu_gemm_release */
} cu_gemm;
int cu_gemm_prepare(cu_gemm *g, em_tensor *a, em_tensor *b, em_tensor *bias, cu_epilogue epi, const char *op,
                    em_site site);
/* Releases the copies g reads (after cu_lt_matmul has queued its work: the stream orders reuse). */
void cu_gemm_release(cu_gemm *g);

/* ---- convolutions through cuDNN (cuda.c, cuda_ops.c) ---- */

/* One of the three convolution prims as cuDNN sees it: x [N, C, H, W], w [O, C/groups, kh, kw]
 * (dense: cuDNN's filters are packed), y [N, O, OH, OW]; x and y with any strides (elements).
 * The prim writes one of them (op: CONV2D y, CONV2D_BWD_INPUT x, CONV2D_BWD_WEIGHT w) from the
 * other two. */
typedef struct cu_dnn_problem {
  em_prim op;
  em_dtype dt; /* f32, f64, f16 or bf16 (f32 compute for the half types) */
  bool tf32;   /* f32 may use TF32 tensor cores (em_cuda_set_allow_tf32) */
  int x[4], w[4], y[4], xs[4], ys[4];
  int pad[2], stride[2], dilation[2], groups;
  uint64_t xp, wp, yp;
} cu_dnn_problem;
/* Runs p on the current stream: 0 on success; 1 when cuDNN is not there or takes no algorithm for
 * p (the caller runs it another way); 2 on an error. why says which for 1 and 2. The workspace
 * comes from the caching allocator (stream-ordered, as cuBLASLt's). */
int cu_dnn_conv(const cu_dnn_problem *p, char *why, size_t cap);
/* Convolutions cuDNN has run in this process (on a GPU or the emulator), for tests. */
int64_t cu_dnn_convs(void);
/* Whether cuDNN loads; false with the reason in why. */
bool cu_dnn_available(char *why, size_t cap);
/* The emulator's record of its cuDNN calls, for tests: convolutions run per direction (forward,
 * data, filter), heuristic calls, the last algorithm and math type run. */
typedef struct cu_emu_dnn_stats {
  int64_t runs[3], heuristics;
  int last_algo, last_math;
} cu_emu_dnn_stats;
cu_emu_dnn_stats cu_emu_dnn_stats_get(void);

/* cuda_ops.c: runs prim op into out (allocated on the device by the dispatcher, or an in-place
 * destination) from in (all on the device); false with a reason in err. */
bool cu_run_prim(em_prim op, const prim_attrs *at, em_tensor *out, em_tensor *const *in, int n_in, char *err, size_t cap);

/* cuda_ops.c: a CPU tensor holding one element (possibly expanded) as a CUDA tensor of the same
 * sizes (zero strides), filled asynchronously; caller-owned, or NULL with an error recorded. */
em_tensor *cu_scalar_to_device(em_tensor *x, const char *name, em_site site);

/* The emulator's table (cuda_emu.c). */
const cu_driver *cu_emu_driver(void);

/* The device (cuda.c): NULL without a usable device (em_cuda_is_available() false). */
const cu_driver *cu_drv(void);
/* The process's allocator for device 0, NULL without a usable device. */
cu_allocator *cu_device_allocator(void);
/* The calling thread's current stream (em_cuda_set_stream; NULL: the default stream). */
cu_stream cu_current_stream(void);
/* Makes the device's context current on the calling thread (the driver's state is per thread). */
void cu_enter(void);
/* "sm_90" for the device's compute capability. */
const char *cu_arch(void);
/* The kernel for key k, compiled (through the memory and disk caches) and loaded; NULL with a
 * reason in err. */
cu_function cu_kernel(const cu_kernel_key *k, char *err, size_t cap);
/* The CUDA C renderer of the prim table's scalar expressions (cuda_kernels.c), shared by the
 * eager kernels and the fused kernels of compiled graphs. cu_render_expr writes e as statements
 * `const T <prefix>t<i> = ...;`, one per instruction, reading operand k as operands[k], and the
 * name of the result's value into result; false for an op it lacks for the dtype.
 * cu_render_helpers writes the device functions e calls (Python remainder, integer pow) that
 * *done (a bit set, 0 to start) says are not written yet. */
bool cu_render_expr(ir_sbuf *b, const prim_sexpr *e, const char *const *operands, const char *prefix,
                    const char *indent, char *result, size_t cap);
void cu_render_helpers(ir_sbuf *b, const prim_sexpr *e, uint32_t *done);
/* The C type of a dtype's elements in CUDA C ("float", "__half", ...), and the dtype its
 * arithmetic runs in (f16 and bf16: f32). */
const char *cu_ctype(em_dtype dt);
em_dtype cu_compute_dtype(em_dtype dt);

/* The kernel `name` defined by body (CUDA C after the prelude): a generated kernel of a compiled
 * graph (inductor/cuda_codegen.c). Cached like cu_kernel's: in memory by name (which must
 * identify the source: the inductor names kernels after a hash of it) and on disk by source. */
cu_function cu_source_kernel(const char *body, const char *name, char *err, size_t cap);
/* The kernels names[0..n) (n <= 8) that body defines, one module: cu_source_kernel's caches,
 * the functions into fs[]; false with a reason in err. */
bool cu_source_kernels(const char *body, const char *const *names, int n, cu_function *fs, char *err, size_t cap);
/* Several such modules at once (a compiled graph's kernels): those neither cache holds compile
 * on up to min(4, cores) threads, then all load in order, each req's functions into its fns.
 * False when any fails, err naming the first failing kernel and how many others failed. */
typedef struct cu_module_req {
  const char *body;
  const char *names[2];
  int n_names;
  cu_function fns[2];
} cu_module_req;
bool cu_source_modules(cu_module_req *req, int n, char *err, size_t cap);
/* Compile threads for cu_source_modules (tests; 0: min(4, cores)), and on the calling thread,
 * kernels it compiled and the most threads one batch used. */
void cu_set_compile_threads(int n);
typedef struct cu_compile_stats { int64_t compiled; int max_threads; } cu_compile_stats;
cu_compile_stats cu_compile_stats_get(void);
/* For tests: forgets the kernels looked up so far, eager and generated (their modules stay
 * loaded), so the next lookup reads the disk cache again; *replaced (if given): disk entries found bad and replaced. */
void cu_kernel_cache_forget(int64_t *replaced);
/* Launches f on the current stream over n elements (grid-stride kernels: any grid works).
 * cu_launch_named: while the profiler runs, the kernel's device time is recorded under name
 * (two events around it) and written with the trace (cu_prof_collect). */
bool cu_launch(cu_function f, int64_t n, unsigned block, void **params, char *err, size_t cap);
bool cu_launch_named(cu_function f, const char *name, int64_t n, unsigned block, void **params, char *err, size_t cap);
/* Waits for the profiled launches' events and hands their device times to the profiler
 * (rt_prof_device); called when a trace is written. */
void cu_prof_collect(void);
/* ---- capture into CUDA graphs (cuda.c; the inductor's reduce-overhead mode) ----
 *
 * Between cu_capture_begin and cu_capture_end, the calling thread's device work is recorded,
 * not run: its current stream is a fresh capturing stream, and its device allocations come from
 * pool (a caching allocator of the graph's own, cu_pool_new), so the addresses the graph bakes in
 * stay the graph's while it lives. Index bounds checks, which read a device word back after
 * their kernel in eager mode, register the word instead (cu_check): the graph's owner zeroes
 * them before each replay and reads them after. */
typedef struct cu_check {
  cu_block *word;  /* {flag, the first bad index}, 16 bytes */
  em_prim op;
  int axis;
  int64_t limit;
} cu_check;
/* A pool for one graph over the device's memory; free with cu_allocator_free. NULL without a
 * device or memory. */
cu_allocator *cu_pool_new(void);
/* Whether the driver has CUDA graphs; false with the reason in why. */
bool cu_graphs_available(char *why, size_t cap);
/* Waits for the current stream, then starts capturing the thread's work into a graph. */
bool cu_capture_begin(cu_allocator *pool, char *err, size_t cap);
/* Whether the calling thread is capturing. */
bool cu_capturing(void);
/* Records a bounds-check word (ownership passes to the capture). */
bool cu_capture_check(cu_check c);
/* Stops capturing (the thread's stream and allocator are restored in any case) and, when
 * capturing went well and ok, instantiates the graph: *graph and *exec (free with
 * cu_graph_free), the checks registered (*checks, caller frees the array and the words). False
 * with a reason in err otherwise (what the capture made is freed, its checks' words released). */
bool cu_capture_end(bool ok, void **graph, void **exec, cu_check **checks, int *n_checks, char *err, size_t cap);
void cu_graph_free(void *graph, void *exec);
/* Launches exec on the current stream. */
bool cu_graph_launch(void *exec, char *err, size_t cap);

/* Device storage for bytes on the current stream, or NULL with an error recorded. */
cu_block *cu_storage_alloc(size_t bytes, const char *op, em_site site);
/* Blocks until the current stream's work is done; false with an error recorded (asynchronous
 * kernel faults surface here). */
bool cu_sync(const char *op, em_site site);
/* Copies between host and device memory on the current stream, through pinned staging buffers;
 * both directions wait for the copy (the host buffer is the caller's). */
bool cu_copy_to_device(uint64_t dst, const void *src, size_t bytes, const char *op, em_site site);
bool cu_copy_to_host(void *dst, uint64_t src, size_t bytes, const char *op, em_site site);

#endif
