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
/* Free blocks cached in the two pools (for tests). */
int cu_free_blocks(cu_allocator *a, bool small);

/* ---- the driver (cuda.c) ---- */

/* The process's allocator for device 0, NULL without a usable device. */
cu_allocator *cu_device_allocator(void);

#endif
