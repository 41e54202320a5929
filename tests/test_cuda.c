/* tests/test_cuda.c: the CUDA device runtime. The caching allocator's bookkeeping runs over a
 * fake device (address arithmetic under a byte limit) on every machine; the driver tests need
 * a GPU and skip loudly without one. */
#include "common.h"

#include "../runtime/cuda.h"

#include <string.h>
#include <time.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* A fake device: hands out addresses from a counter, fails with "out of memory" past limit. */
typedef struct fake_device {
  uint64_t next;
  size_t limit, held;
  int allocs, frees;
  struct { uint64_t ptr; size_t size; } seg[64];
  int n;
} fake_device;

static int fake_alloc(void *ctx, size_t bytes, uint64_t *ptr, char *why, size_t cap) {
  fake_device *d = ctx;
  if (d->held + bytes > d->limit || d->n == 64) return snprintf(why, cap, "fake device full"), 1;
  *ptr = d->next;
  d->seg[d->n].ptr = d->next, d->seg[d->n++].size = bytes;
  d->next += bytes + (1u << 20); /* a gap: segments are never adjacent */
  d->held += bytes;
  d->allocs++;
  return 0;
}

static void fake_free(void *ctx, uint64_t ptr) {
  fake_device *d = ctx;
  for (int i = 0; i < d->n; i++)
    if (d->seg[i].ptr == ptr) {
      d->held -= d->seg[i].size;
      d->seg[i] = d->seg[--d->n];
      d->frees++;
      return;
    }
  cr_assert_fail("freed an address the fake device never gave: %llx", (unsigned long long)ptr);
}

static cu_allocator *fake_allocator(fake_device *d, size_t limit) {
  *d = (fake_device){.next = 1ull << 32, .limit = limit};
  cu_allocator *a = cu_allocator_new((cu_backend){d, fake_alloc, fake_free}, "fake:0");
  cr_assert_not_null(a);
  return a;
}

#define MiB ((size_t)1 << 20)

static cu_block *get(cu_allocator *a, size_t n, uintptr_t stream) {
  char err[256];
  cu_block *b = cu_alloc(a, n, stream, err, sizeof err);
  cr_assert_not_null(b, "%zu bytes: %s", n, err);
  return b;
}

ETEST(cuda, small_requests_round_to_512_and_share_a_2_MiB_segment) {
  fake_device d;
  cu_allocator *a = fake_allocator(&d, 64 * MiB);
  cu_block *x = get(a, 1, 0), *y = get(a, 1000, 0), *z = get(a, 0, 0);
  cr_assert_eq(x->size, 512);
  cr_assert_eq(y->size, 1024);
  cr_assert_eq(z->size, 512);
  cr_assert_eq(y->ptr, x->ptr + 512, "best fit carves the segment in address order");
  em_cuda_memory_stats s = cu_stats(a);
  cr_assert_eq(s.device_allocs, 1);
  cr_assert_eq(s.reserved_bytes, (int64_t)CU_SMALL_SEGMENT);
  cr_assert_eq(s.allocated_bytes, 2048);
  cr_assert_eq(s.requested_bytes, 1001);
  cu_release(a, y);
  cu_block *w = get(a, 700, 0);
  cr_assert_eq(w->ptr, y->ptr, "a freed block is handed out again");
  cr_assert_eq(cu_stats(a).device_allocs, 1);
  cu_release(a, x), cu_release(a, z), cu_release(a, w);
  cr_assert_eq(cu_free_blocks(a, true), 1, "freed neighbours merge back into one block");
  cr_assert_eq(cu_stats(a).allocated_bytes, 0);
  cr_assert_eq(cu_stats(a).peak_allocated_bytes, 2048);
  cu_empty_cache(a);
  s = cu_stats(a);
  cr_assert_eq(s.reserved_bytes, 0);
  cr_assert_eq(s.device_frees, 1);
  cr_assert_eq(d.held, 0);
  cr_assert_eq(cu_allocator_free(a), 0);
}

ETEST(cuda, merging_in_any_order_restores_the_segment) {
  fake_device d;
  cu_allocator *a = fake_allocator(&d, 64 * MiB);
  int orders[3][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}};
  for (int o = 0; o < 3; o++) {
    cu_block *b[4];
    for (int i = 0; i < 4; i++) b[i] = get(a, 4096 * (size_t)(i + 1), 0);
    for (int i = 0; i < 4; i++) cu_release(a, b[orders[o][i]]);
    cr_assert_eq(cu_free_blocks(a, true), 1, "order %d", o);
  }
  cr_assert_eq(cu_stats(a).device_allocs, 1, "one segment served all three rounds");
  cr_assert_eq(cu_allocator_free(a), 0);
  cr_assert_eq(d.held, 0);
}

ETEST(cuda, a_block_is_reused_only_on_its_stream) {
  fake_device d;
  cu_allocator *a = fake_allocator(&d, 64 * MiB);
  cu_block *x = get(a, 3 * MiB, 1);
  uint64_t p = x->ptr;
  cu_release(a, x);
  cu_block *y = get(a, 3 * MiB, 2);
  cr_assert_neq(y->ptr, p, "stream 2 must not take stream 1's block");
  cr_assert_eq(cu_stats(a).device_allocs, 2);
  cu_block *z = get(a, 3 * MiB, 1);
  cr_assert_eq(z->ptr, p);
  cu_release(a, y), cu_release(a, z);
  cr_assert_eq(cu_allocator_free(a), 0);
}

ETEST(cuda, large_requests_split_20_MiB_segments_or_round_to_2_MiB) {
  fake_device d;
  cu_allocator *a = fake_allocator(&d, 256 * MiB);
  cu_block *x = get(a, 3 * MiB, 0);
  cr_assert_eq(cu_stats(a).reserved_bytes, (int64_t)(20 * MiB));
  cr_assert_eq(cu_free_blocks(a, false), 1, "17 MiB left over is split off");
  cu_block *y = get(a, 16 * MiB + 1, 0); /* takes the 17 MiB rest whole */
  cr_assert_eq(y->ptr, x->ptr + 3 * MiB);
  cr_assert_eq(cu_free_blocks(a, false), 0, "a rest of 1 MiB - 512 is not worth a block in the large pool");
  cu_block *z = get(a, 12 * MiB + 5, 0);
  cr_assert_eq(cu_stats(a).reserved_bytes, (int64_t)(20 * MiB + 14 * MiB), "12 MiB + 5 rounds to a 14 MiB segment");
  cr_assert_eq(z->size, 12 * MiB + 512);
  cu_release(a, x), cu_release(a, y), cu_release(a, z);
  cr_assert_eq(cu_free_blocks(a, false), 2);
  cr_assert_eq(cu_allocator_free(a), 0);
  cr_assert_eq(d.frees, 2);
}

ETEST(cuda, out_of_memory_empties_the_cache_retries_once_then_says_what_is_held) {
  fake_device d;
  cu_allocator *a = fake_allocator(&d, 30 * MiB);
  cu_release(a, get(a, 12 * MiB, 0)); /* cached: a 12 MiB segment nothing uses */
  cu_block *big = get(a, 20 * MiB, 0);  /* 12 + 20 > 30: the cache goes, the retry succeeds */
  em_cuda_memory_stats s = cu_stats(a);
  cr_assert_eq(s.oom_retries, 1);
  cr_assert_eq(s.device_frees, 1);
  cr_assert_eq(s.reserved_bytes, (int64_t)(20 * MiB));
  char err[512];
  cr_assert_null(cu_alloc(a, 20 * MiB, 0, err, sizeof err));
  cr_assert(strstr(err, "fake:0 out of memory: tried to allocate 20971520 bytes"), "%s", err);
  cr_assert(strstr(err, "20971520 bytes allocated to tensors"), "%s", err);
  cr_assert(strstr(err, "fake device full"), "%s", err);
  cr_assert_eq(cu_stats(a).oom_retries, 2);
  cr_assert_eq(cu_stats(a).allocated_bytes, (int64_t)(20 * MiB), "a failed request changes nothing held");
  cu_release(a, big);
  cr_assert_eq(cu_allocator_free(a), 0);
  cr_assert_eq(d.held, 0);
}

/* A churn of random sizes and streams against a model of what must hold: blocks never overlap,
 * allocated bytes match, everything merges back. */
ETEST(cuda, random_churn_keeps_the_books) {
  fake_device d;
  cu_allocator *a = fake_allocator(&d, 8192 * MiB); /* fragmentation: each live large block can pin a 20 MiB segment */
  cu_block *live[64] = {0};
  uint64_t s = 12345;
  int64_t want = 0;
  for (int it = 0; it < 4000; it++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int i = (int)((s >> 33) % 64);
    if (live[i]) {
      want -= (int64_t)live[i]->size;
      cu_release(a, live[i]);
      live[i] = NULL;
      continue;
    }
    size_t n = (s >> 40) % 3 == 0 ? (size_t)((s >> 20) % (24 * MiB)) : (size_t)((s >> 20) % 65536);
    live[i] = get(a, n, (uintptr_t)((s >> 50) % 2));
    cr_assert_geq(live[i]->size, n);
    want += (int64_t)live[i]->size;
    for (int j = 0; j < 64; j++)
      if (j != i && live[j])
        cr_assert(live[j]->ptr + live[j]->size <= live[i]->ptr || live[i]->ptr + live[i]->size <= live[j]->ptr,
                  "blocks overlap at iteration %d", it);
    cr_assert_eq(cu_stats(a).allocated_bytes, want);
  }
  for (int i = 0; i < 64; i++) cu_release(a, live[i]);
  em_cuda_memory_stats st = cu_stats(a);
  cr_assert_eq(st.allocated_bytes, 0);
  cr_assert_eq(st.requested_bytes, 0);
  cr_log_info("churn: %lld device allocations for 4000 operations, peak %lld allocated / %lld reserved",
              (long long)st.device_allocs, (long long)st.peak_allocated_bytes, (long long)st.peak_reserved_bytes);
  cr_assert_eq(cu_free_blocks(a, true) + cu_free_blocks(a, false), (int)st.segments, "every segment merged back whole");
  cr_assert_eq(cu_allocator_free(a), 0);
  cr_assert_eq(d.held, 0);
}

ETEST(cuda, device_discovery) {
  em_cuda_device_properties p;
  if (!em_cuda_is_available()) {
    cr_assert_eq(em_cuda_device_count(), 0);
    cr_assert_not(em_cuda_get_device_properties(0, &p));
    cr_assert(strstr(em_last_error(), "test_cuda.c") && strstr(em_last_error(), "em_cuda_get_device_properties"), "%s",
              em_last_error());
    em_clear_error();
    em_cuda_memory_stats s = em_cuda_memory_stats_get();
    cr_assert_eq(s.reserved_bytes, 0);
    em_cuda_empty_cache(); /* harmless without a device */
    fprintf(stderr, "test_cuda: NO GPU on this machine: the CUDA device tests are SKIPPED (the allocator's tests ran over a "
                    "fake device)\n");
    cr_skip_test("NO GPU: CUDA device tests skipped on this machine (the allocator ran over a fake device above)");
  }
  int n = em_cuda_device_count();
  cr_assert_gt(n, 0);
  cr_assert(em_cuda_get_device_properties(0, &p), "%s", em_last_error());
  cr_log_info("cuda:0 %s sm_%d%d, %d SMs, %lld bytes", p.name, p.major, p.minor, p.multiprocessors, (long long)p.total_memory);
  cr_assert_gt(strlen(p.name), 0);
  cr_assert_geq(p.major, 5);
  cr_assert_gt(p.multiprocessors, 0);
  cr_assert_gt(p.total_memory, 0);
  cr_assert_not(em_cuda_get_device_properties(n, &p));
  cr_assert(strstr(em_last_error(), "out of range"), "%s", em_last_error());
  em_clear_error();
  cu_allocator *a = cu_device_allocator();
  cr_assert_not_null(a);
  cu_block *b = get(a, 100 * MiB, 0);
  cr_assert_geq(em_cuda_memory_stats_get().reserved_bytes, (int64_t)(100 * MiB));
  cu_release(a, b);
  em_cuda_empty_cache();
  cr_assert_eq(em_cuda_memory_stats_get().reserved_bytes, 0);
}

/* Every eager CUDA kernel (all prims x dtypes x layout kinds) compiles cleanly with NVRTC for
 * sm_90, on every machine: batches of kernels, each in its own namespace, share one program so
 * the toolkit headers are parsed once a batch; a few also compile alone, as the runtime does. */
ETEST(cuda, every_eager_kernel_compiles_with_nvrtc_for_sm_90) {
  if (!cu_nvrtc_available()) {
    fprintf(stderr, "test_cuda: this build has NO NVRTC (CUDA toolkit not found): kernels NOT compiled\n");
    cr_skip_test("no NVRTC in this build");
  }
  int n = cu_kernel_keys(NULL, 0);
  cu_kernel_key *keys = malloc(sizeof *keys * (size_t)n);
  cr_assert_eq(cu_kernel_keys(keys, n), n);
  cr_assert_gt(n, 500, "the set covers prims x dtypes x layouts (%d kernels)", n);
  int families[CU_SORT + 1] = {0};
  enum { BATCH = 96 };
  size_t cubin_bytes = 0;
  double t0 = now_ms();
  for (int s = 0; s < n; s += BATCH) {
    size_t cap = 1 << 16, len = 0;
    char *src = malloc(cap);
    len += (size_t)snprintf(src, cap, "%s", cu_kernel_prelude());
    for (int i = s; i < n && i < s + BATCH; i++) {
      char *body, name[96];
      cr_assert(cu_kernel_body(&keys[i], &body, name, sizeof name), "kernel %d (prim %s) has no source", i,
                prim_get(keys[i].op)->name);
      families[keys[i].family]++;
      size_t need = len + strlen(body) + 64;
      if (need > cap) src = realloc(src, cap = need * 2);
      len += (size_t)snprintf(src + len, cap - len, "namespace k%d {\n%s}\n", i, body);
      free(body);
    }
    char *cubin, *log;
    size_t size;
    bool ok = cu_nvrtc_compile(src, "batch.cu", "sm_90", &cubin, &size, &log);
    cr_assert(ok, "kernels %d-%d do not compile:\n%s", s, s + BATCH - 1, log ? log : "?");
    cr_assert(!log || !strstr(log, "warning"), "kernels %d-%d compile with warnings:\n%s", s, s + BATCH - 1, log);
    cubin_bytes += size;
    free(cubin), free(log), free(src);
  }
  double batched = now_ms() - t0;
  /* alone, as the runtime compiles them: a pointwise f16 add, a bf16 reduction, Philox normal */
  int alone = 0;
  for (int i = 0; i < n; i++) {
    cu_kernel_key *k = &keys[i];
    bool pick = (k->family == CU_POINTWISE && k->op == EM_PRIM_ADD && k->in == EM_F16 && k->layout == CU_STRIDED) ||
                (k->family == CU_REDUCE && k->op == EM_PRIM_SUM && k->in == EM_BF16 && k->layout == CU_STRIDED) ||
                (k->family == CU_PHILOX && k->op == EM_PRIM_PHILOX_NORMAL && k->out == EM_F32);
    if (!pick) continue;
    char *body, name[96], *cubin, *log;
    size_t size;
    cr_assert(cu_kernel_body(k, &body, name, sizeof name));
    char *src = malloc(strlen(cu_kernel_prelude()) + strlen(body) + 1);
    strcpy(src, cu_kernel_prelude()), strcat(src, body);
    cr_assert(cu_nvrtc_compile(src, name, "sm_90", &cubin, &size, &log), "%s:\n%s", name, log ? log : "?");
    cr_assert_gt(size, 0);
    alone++;
    free(cubin), free(log), free(src), free(body);
  }
  cr_assert_eq(alone, 3);
  cr_log_info("NVRTC sm_90: %d kernels (pointwise %d, reductions %d, copies %d, fills %d, iota %d, philox %d, indexing %d, "
              "im2col %d, scans %d, sorts %d) in %.0f ms, %zu bytes of cubin",
              n, families[CU_POINTWISE], families[CU_REDUCE], families[CU_COPY], families[CU_FILL], families[CU_IOTA],
              families[CU_PHILOX], families[CU_INDEX], families[CU_IM2COL], families[CU_SCAN], families[CU_SORT], batched,
              cubin_bytes);
  free(keys);
}
