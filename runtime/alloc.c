/* runtime/alloc.c: the process-wide allocator, fault injection and debug counters.
 *
 * One pluggable allocator (Lua's lua_Alloc, SQLite's sqlite3_mem_methods) serves every
 * allocation: tensor data, tensor headers, scope arrays. Routing them all through rt_alloc is
 * what lets a test fail the n-th allocation and prove each error path releases what it took. */
#include "rt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* The default allocator puts a small header before each block (its kind, and for aligned
 * blocks its cacheable size) and caches large blocks. A fresh large block comes from mmap and costs a
 * page fault per 4 KiB on first touch, which on this kind of machine halves the throughput of a
 * 64 MiB elementwise op; deep-learning workloads free and reallocate the same sizes every step,
 * so, like PyTorch's CUDA caching allocator, we keep freed blocks of 64 KiB or more (up to
 * CACHE_LIMIT bytes in all) and hand them out again for the same rounded size. Under
 * AddressSanitizer the cache is off so use-after-free stays detectable. */
#define BLOCK_HEADER 64
#define LARGE_BLOCK (64u << 10)
#define CACHE_LIMIT ((size_t)1 << 30)
#define CACHE_SLOTS 512

#if defined(__SANITIZE_ADDRESS__)
#define CACHE_ENABLED 0
#else
#define CACHE_ENABLED 1
#endif

static struct {
  pthread_mutex_t lock;
  void *block[CACHE_SLOTS];
  size_t size[CACHE_SLOTS];
  int n;
  size_t bytes;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *default_alloc(void *ctx, size_t bytes, size_t align) {
  (void)ctx;
  if (align > BLOCK_HEADER) return NULL; /* Ember never asks for more */
  if (align <= 16) {
    char *p = malloc(bytes + 16);
    if (!p) return NULL;
    p[15] = 0; /* tag: small block, 16-byte header */
    return p + 16;
  }
  size_t n = (bytes + align - 1) / align * align;
  if (n < align) n = align;
  if (n < LARGE_BLOCK || !CACHE_ENABLED) {
    char *p = aligned_alloc(BLOCK_HEADER, n + BLOCK_HEADER);
    if (!p) return NULL;
    *(size_t *)p = 0; /* not cacheable */
    p[BLOCK_HEADER - 1] = 1;
    return p + BLOCK_HEADER;
  }
  /* round so nearby sizes share blocks: 4 KiB pages below 1 MiB, 64 KiB above */
  n = n < (1u << 20) ? (n + 4095) & ~(size_t)4095 : (n + 65535) & ~(size_t)65535;
  pthread_mutex_lock(&cache.lock);
  for (int i = cache.n - 1; i >= 0; i--) {
    if (cache.size[i] != n) continue;
    char *p = cache.block[i];
    cache.bytes -= n;
    cache.block[i] = cache.block[--cache.n];
    cache.size[i] = cache.size[cache.n];
    pthread_mutex_unlock(&cache.lock);
    return p;
  }
  pthread_mutex_unlock(&cache.lock);
  char *p = aligned_alloc(BLOCK_HEADER, n + BLOCK_HEADER);
  if (!p) return NULL;
  *(size_t *)p = n;
  p[BLOCK_HEADER - 1] = 1;
  return p + BLOCK_HEADER;
}

static void default_free(void *ctx, void *ptr) {
  (void)ctx;
  /* The byte before each block tells its kind: 0, small (16-byte header); 1, aligned. */
  if (((char *)ptr)[-1] == 0) {
    free((char *)ptr - 16);
    return;
  }
  char *base = (char *)ptr - BLOCK_HEADER;
  size_t n = *(size_t *)base;
  if (n) {
    pthread_mutex_lock(&cache.lock);
    if (cache.n < CACHE_SLOTS && cache.bytes + n <= CACHE_LIMIT) {
      cache.block[cache.n] = ptr;
      cache.size[cache.n++] = n;
      cache.bytes += n;
      pthread_mutex_unlock(&cache.lock);
      return;
    }
    pthread_mutex_unlock(&cache.lock);
  }
  free(base);
}

static em_allocator allocator = {default_alloc, default_free, NULL};
static int64_t alloc_count, fail_at, live_tensors, live_bytes, peak_bytes;

void em_set_allocator(const em_allocator *a) {
  allocator = a ? *a : (em_allocator){default_alloc, default_free, NULL};
}

void em_debug_fail_alloc(int64_t n) {
  __atomic_store_n(&fail_at, n > 0 ? __atomic_load_n(&alloc_count, __ATOMIC_RELAXED) + n : 0,
                   __ATOMIC_RELAXED);
}

int64_t em_debug_alloc_count(void) { return __atomic_load_n(&alloc_count, __ATOMIC_RELAXED); }

void *rt_alloc(size_t bytes, size_t align) {
  int64_t k = __atomic_add_fetch(&alloc_count, 1, __ATOMIC_RELAXED);
  int64_t f = __atomic_load_n(&fail_at, __ATOMIC_RELAXED);
  if (f && k == f) return NULL;
  return allocator.alloc(allocator.ctx, bytes, align);
}

void rt_free(void *p) {
  if (p) allocator.free(allocator.ctx, p);
}

void rt_count_storage(int64_t delta) {
  int64_t now = __atomic_add_fetch(&live_bytes, delta, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&peak_bytes, &peak, now, true,
                                                   __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

void rt_count_tensor(int delta) { __atomic_add_fetch(&live_tensors, delta, __ATOMIC_RELAXED); }

int64_t em_debug_live_tensors(void) { return __atomic_load_n(&live_tensors, __ATOMIC_RELAXED); }
int64_t em_debug_live_bytes(void) { return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED); }
int64_t em_debug_peak_bytes(void) { return __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED); }
void em_debug_reset_peak(void) {
  __atomic_store_n(&peak_bytes, __atomic_load_n(&live_bytes, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* Ember's pool (prims/pool.c) runs every parallel loop, GEMM tile and convolution chunk. */
void em_set_num_threads(int n) { prim_set_threads(n); }

int em_get_num_threads(void) { return prim_max_threads(); }

_Noreturn void rt_assert_fail(const char *what, const char *file, int line) {
  fprintf(stderr, "%s:%d: ember internal error: assertion failed: %s\n", file, line, what);
  abort();
}
