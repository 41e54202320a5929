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
} cu_driver;

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
/* For tests: forgets the kernels looked up so far (their modules stay loaded), so the next
 * lookup reads the disk cache again; *replaced (if given): disk entries found bad and replaced. */
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
