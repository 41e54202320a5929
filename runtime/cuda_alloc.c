/* runtime/cuda_alloc.c: the CUDA caching allocator.
 *
 * cudaMalloc and cudaFree synchronise the device and cost tens of microseconds to milliseconds,
 * and a training step frees and reallocates the same sizes every iteration, so, like PyTorch
 * (Paszke et al. 2019, "PyTorch: An Imperative Style, High-Performance Deep Learning Library",
 * sec. 5.3), freed device memory is kept and handed out again:
 *  - requests round up to 512 bytes and go to one of two pools: small (at most 1 MiB, carved
 *    from 2 MiB segments) and large (20 MiB segments below 10 MiB, else the request rounded up
 *    to 2 MiB), so small tensors do not fragment the large segments;
 *  - a request takes the best-fitting free block of its pool that was freed on the same stream
 *    (work queued on that stream is ordered after the previous user's, so no event is needed),
 *    split when the remainder is worth keeping (see cuda.h); a freed block merges with its free
 *    neighbours in the segment;
 *  - when the device says out of memory, every segment with nothing allocated is given back and
 *    the request is tried once more; then it fails, quoting the request and what is held.
 * Free lists are address-ordered linked lists searched for the best fit: the pools of a
 * training loop hold tens of blocks, not thousands. One mutex guards an allocator. */
#include "cuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cu_allocator {
  pthread_mutex_t lock;
  cu_backend be;
  char device[32];
  cu_block *free_small, *free_large; /* free lists */
  em_cuda_memory_stats st;
};

cu_allocator *cu_allocator_new(cu_backend backend, const char *device_name) {
  cu_allocator *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  pthread_mutex_init(&a->lock, NULL);
  a->be = backend;
  snprintf(a->device, sizeof a->device, "%s", device_name ? device_name : "cuda");
  return a;
}

static cu_block **pool_of(cu_allocator *a, bool small) { return small ? &a->free_small : &a->free_large; }

static void unlink_free(cu_allocator *a, cu_block *b) {
  cu_block **head = pool_of(a, b->small);
  if (b->free_prev) b->free_prev->free_next = b->free_next;
  else *head = b->free_next;
  if (b->free_next) b->free_next->free_prev = b->free_prev;
  b->free_prev = b->free_next = NULL;
}

static void link_free(cu_allocator *a, cu_block *b) {
  cu_block **head = pool_of(a, b->small);
  b->free_prev = NULL, b->free_next = *head;
  if (*head) (*head)->free_prev = b;
  *head = b;
}

static size_t round_size(size_t n) { return n < CU_MIN_BLOCK ? CU_MIN_BLOCK : (n + CU_MIN_BLOCK - 1) / CU_MIN_BLOCK * CU_MIN_BLOCK; }

static size_t segment_size(size_t n) {
  if (n <= CU_SMALL_SIZE) return CU_SMALL_SEGMENT;
  if (n < CU_MIN_LARGE_ALLOC) return CU_LARGE_SEGMENT;
  return (n + CU_ROUND_LARGE - 1) / CU_ROUND_LARGE * CU_ROUND_LARGE;
}

static cu_block *best_fit(cu_allocator *a, bool small, size_t size, uintptr_t stream) {
  cu_block *best = NULL;
  for (cu_block *b = *pool_of(a, small); b; b = b->free_next)
    if (b->stream == stream && b->size >= size && (!best || b->size < best->size || (b->size == best->size && b->ptr < best->ptr)))
      best = b;
  return best;
}

/* Gives back every segment whose one block is free (lock held). */
static void release_cached(cu_allocator *a) {
  for (int p = 0; p < 2; p++) {
    cu_block *b = *pool_of(a, p == 0), *next;
    for (; b; b = next) {
      next = b->free_next;
      if (b->prev || b->next) continue; /* part of a segment in use */
      unlink_free(a, b);
      a->be.free(a->be.ctx, b->ptr);
      a->st.reserved_bytes -= (int64_t)b->size;
      a->st.segments--;
      a->st.device_frees++;
      free(b);
    }
  }
}

cu_block *cu_alloc(cu_allocator *a, size_t bytes, uintptr_t stream, char *err, size_t cap) {
  size_t size = round_size(bytes);
  bool small = size <= CU_SMALL_SIZE;
  pthread_mutex_lock(&a->lock);
  cu_block *b = best_fit(a, small, size, stream);
  if (b) {
    unlink_free(a, b);
  } else {
    size_t seg = segment_size(size);
    cu_block *nb = calloc(1, sizeof *nb);
    char why[160] = "";
    int rc = nb ? a->be.alloc(a->be.ctx, seg, &nb->ptr, why, sizeof why) : 2;
    if (rc == 1) { /* out of memory: give back the cache, try once more */
      a->st.oom_retries++;
      release_cached(a);
      rc = a->be.alloc(a->be.ctx, seg, &nb->ptr, why, sizeof why);
    }
    if (rc != 0) {
      if (rc == 1)
        snprintf(err, cap,
                 "%s out of memory: tried to allocate %zu bytes (a %zu-byte segment); %lld bytes allocated to tensors, "
                 "%lld reserved by the cache after it was emptied%s%s",
                 a->device, bytes, seg, (long long)a->st.allocated_bytes, (long long)a->st.reserved_bytes, *why ? ": " : "", why);
      else snprintf(err, cap, "%s: allocating a %zu-byte segment failed: %s", a->device, seg, nb ? why : "out of host memory");
      pthread_mutex_unlock(&a->lock);
      free(nb);
      return NULL;
    }
    nb->size = seg, nb->stream = stream, nb->small = small;
    a->st.reserved_bytes += (int64_t)seg;
    a->st.segments++;
    a->st.device_allocs++;
    if (a->st.reserved_bytes > a->st.peak_reserved_bytes) a->st.peak_reserved_bytes = a->st.reserved_bytes;
    b = nb;
  }
  size_t rest = b->size - size;
  if (small ? rest >= CU_MIN_BLOCK : rest > CU_SMALL_SIZE) {
    cu_block *r = calloc(1, sizeof *r);
    if (r) { /* without it the block stays whole: wasteful, not wrong */
      *r = (cu_block){.ptr = b->ptr + size, .size = rest, .stream = stream, .small = small, .prev = b, .next = b->next};
      if (b->next) b->next->prev = r;
      b->next = r;
      b->size = size;
      link_free(a, r);
    }
  }
  b->allocated = true;
  b->owner = a;
  b->requested = bytes;
  a->st.allocated_bytes += (int64_t)b->size;
  a->st.requested_bytes += (int64_t)bytes;
  a->st.allocations++;
  if (a->st.allocated_bytes > a->st.peak_allocated_bytes) a->st.peak_allocated_bytes = a->st.allocated_bytes;
  pthread_mutex_unlock(&a->lock);
  return b;
}

/* Merges n, which follows b in their segment and is on no free list, into b. */
static void absorb(cu_block *b, cu_block *n) {
  b->size += n->size;
  b->next = n->next;
  if (n->next) n->next->prev = b;
  free(n);
}

void cu_release(cu_allocator *a, cu_block *b) {
  if (!b) return;
  pthread_mutex_lock(&a->lock);
  b->allocated = false;
  a->st.allocated_bytes -= (int64_t)b->size;
  a->st.requested_bytes -= (int64_t)b->requested;
  b->requested = 0;
  if (b->next && !b->next->allocated) {
    cu_block *n = b->next;
    unlink_free(a, n);
    absorb(b, n);
  }
  if (b->prev && !b->prev->allocated) {
    cu_block *p = b->prev;
    unlink_free(a, p);
    absorb(p, b);
    b = p;
  }
  link_free(a, b);
  pthread_mutex_unlock(&a->lock);
}

void cu_empty_cache(cu_allocator *a) {
  pthread_mutex_lock(&a->lock);
  release_cached(a);
  pthread_mutex_unlock(&a->lock);
}

em_cuda_memory_stats cu_stats(cu_allocator *a) {
  pthread_mutex_lock(&a->lock);
  em_cuda_memory_stats s = a->st;
  pthread_mutex_unlock(&a->lock);
  return s;
}

void cu_reset_peaks(cu_allocator *a) {
  pthread_mutex_lock(&a->lock);
  a->st.peak_allocated_bytes = a->st.allocated_bytes, a->st.peak_reserved_bytes = a->st.reserved_bytes;
  pthread_mutex_unlock(&a->lock);
}

int cu_free_blocks(cu_allocator *a, bool small) {
  pthread_mutex_lock(&a->lock);
  int n = 0;
  for (cu_block *b = *pool_of(a, small); b; b = b->free_next) n++;
  pthread_mutex_unlock(&a->lock);
  return n;
}

int cu_allocator_free(cu_allocator *a) {
  if (!a) return 0;
  cu_empty_cache(a);
  int held = (int)a->st.segments; /* segments with live blocks: they leak with their blocks */
  pthread_mutex_destroy(&a->lock);
  free(a);
  return held;
}
