/* tests/test_tensor.c: creation, metadata, views, lifetime (scopes, keep, retain/release), the
 * random generator, printing and the pluggable allocator. */
#include "common.h"

#include "../prims/prims.h"

#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define F EM_F32
#define D EM_F64

ETEST(create, factories) {
  EXPECT(em_zeros(F, EM_SHAPE(2, 2)), F, SHAPE(2, 2), 0, 0, 0, 0, 0);
  EXPECT(em_ones(EM_I32, EM_SHAPE(3)), EM_I32, SHAPE(3), 0, 1, 1, 1);
  EXPECT(em_full(D, EM_SHAPE(1, 2), -2.5), D, SHAPE(1, 2), 0, -2.5, -2.5);
  EXPECT(em_full(EM_BOOL, EM_SHAPE(2), 3), EM_BOOL, SHAPE(2), 0, 1, 1);
  EXPECT(em_scalar(EM_I64, 7), EM_I64, SCALAR_SHAPE, 0, 7);
  EXPECT(em_arange(F, 0, 5, 1), F, SHAPE(5), 0, 0, 1, 2, 3, 4);
  EXPECT(em_arange(D, 1, 0, -0.25), D, SHAPE(4), 0, 1, 0.75, 0.5, 0.25);
  EXPECT(em_arange(EM_I64, 0, 10, 3), EM_I64, SHAPE(4), 0, 0, 3, 6, 9);
  EXPECT(em_eye(F, 2, 3), F, SHAPE(2, 3), 0, 1, 0, 0, 0, 1, 0);
  float data[6] = {1, 2, 3, 4, 5, 6};
  em_tensor *t = em_from_data(data, F, EM_SHAPE(3, 2));
  data[0] = 100; /* copied, not borrowed */
  EXPECT(t, F, SHAPE(3, 2), 0, 1, 2, 3, 4, 5, 6);
  em_tensor *e = em_empty(EM_U8, EM_SHAPE(0, 4));
  cr_assert_eq(em_numel(e), 0);
  cr_assert_eq(em_ndim(e), 2);
}

ETEST(create, metadata) {
  CPU_ONLY("checks CPU placement and layout");
  em_tensor *t = em_zeros(D, EM_SHAPE(2, 3, 4));
  cr_assert_eq(em_ndim(t), 3);
  cr_assert_eq(em_size(t, -1), 4);
  cr_assert_eq(em_size(t, 3), -1);
  cr_assert_eq(em_strides(t)[0], 12);
  cr_assert_eq(em_strides(t)[1], 4);
  cr_assert_eq(em_numel(t), 24);
  cr_assert_eq(em_dtype_of(t), D);
  cr_assert_eq(em_device_of(t), EM_CPU);
  cr_assert(em_is_contiguous(t));
  cr_assert_eq(((uintptr_t)em_data_ptr(t)) % 64, 0, "data is 64-byte aligned");
  cr_assert_str_eq(em_dtype_name(EM_BF16), "bf16");
  cr_assert_eq(em_dtype_size(EM_I64), 8);
  cr_assert_eq(em_dtype_size((em_dtype)99), 0);
}

ETEST(create, bad_sizes) {
  CPU_ONLY("the CPU allocator's size limits and messages");
  EXPECT_ERROR(em_zeros(F, EM_SHAPE(2, -1)), "size -1 of dim 1 is negative");
  EXPECT_ERROR(em_empty(F, EM_SHAPE(-3)), "negative");
  EXPECT_ERROR(em_ones(F, 9, (int64_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}), "0 to 8");
  EXPECT_ERROR(em_arange(F, 0, 1, 0), "nonzero step");
  EXPECT_ERROR(em_arange(F, 0, 1, -1), "sign of step");
  EXPECT_ERROR(em_eye(F, -1, 2), "sizes must be >= 0");
  EXPECT_ERROR(em_from_data(NULL, F, EM_SHAPE(2)), "data is NULL");
  EXPECT_ERROR(em_rand(EM_I32, EM_SHAPE(2)), "f32 or f64");
  EXPECT_ERROR(em_randint(5, 5, EM_SHAPE(2)), "low < high");
  EXPECT_ERROR(em_empty(F, EM_SHAPE(1LL << 40, 1LL << 40)), "too large");
  EXPECT_ERROR(em_empty(F, EM_SHAPE(1LL << 45)), "out of memory allocating f32[35184372088832]");
}

ETEST(rng, reproducible_and_in_range) {
  em_manual_seed(123);
  em_tensor *a = em_rand(F, EM_SHAPE(1000));
  uint64_t seed, off;
  em_rng_get_state(&seed, &off);
  cr_assert_eq(seed, 123);
  cr_assert_eq(off, 250, "1000 f32 values use 250 Philox calls");
  em_tensor *b = em_rand(F, EM_SHAPE(1000));
  em_manual_seed(123);
  em_tensor *a2 = em_rand(F, EM_SHAPE(1000));
  EXPECT(em_sum(em_ne(a, a2), 0, NULL, false), EM_I64, SCALAR_SHAPE, 0, 0);
  cr_assert_gt(em_item(em_sum(em_ne(a, b), 0, NULL, false)), 990);
  cr_assert_geq(em_item(em_amin(a, 0, NULL, false)), 0);
  cr_assert_lt(em_item(em_amax(a, 0, NULL, false)), 1);
  em_rng_set_state(123, 250);
  em_tensor *b2 = em_rand(F, EM_SHAPE(1000));
  EXPECT(em_sum(em_ne(b, b2), 0, NULL, false), EM_I64, SCALAR_SHAPE, 0, 0);
}

ETEST(rng, distributions) {
  em_manual_seed(7);
  int64_t n = 200000;
  em_tensor *u = em_rand(D, EM_SHAPE(n));
  double mean = em_item(em_sum(u, 0, NULL, false)) / (double)n;
  cr_assert(fabs(mean - 0.5) < 0.005, "uniform mean %g", mean);
  em_tensor *z = em_randn(F, EM_SHAPE(n));
  double zm = em_item(em_sum(z, 0, NULL, false)) / (double)n;
  double zv = em_item(em_sum(em_mul(z, z), 0, NULL, false)) / (double)n;
  cr_assert(fabs(zm) < 0.01, "normal mean %g", zm);
  cr_assert(fabs(zv - 1) < 0.02, "normal variance %g", zv);
  em_tensor *k = em_randint(-3, 4, EM_SHAPE(n));
  cr_assert_eq(em_dtype_of(k), EM_I64);
  cr_assert_eq(em_item(em_amin(k, 0, NULL, false)), -3);
  cr_assert_eq(em_item(em_amax(k, 0, NULL, false)), 3);
  double km = em_item(em_sum(k, 0, NULL, false)) / (double)n;
  cr_assert(fabs(km) < 0.03, "randint mean %g", km);
}

ETEST(views, share_storage) {
  em_tensor *x = em_arange(F, 0, 12, 1);
  em_tensor *m = em_reshape(x, EM_SHAPE(3, -1));
  cr_assert_eq(em_size(m, 1), 4);
  cr_assert(em_shares_storage(x, m), "reshape of a contiguous tensor is a view");
  em_tensor *t = em_transpose(m, 0, 1);
  cr_assert(em_shares_storage(x, t));
  em_tensor *flat = em_reshape(t, EM_SHAPE(12));
  cr_assert(!em_shares_storage(x, flat), "reshape of a transpose copies");
  EXPECT(flat, F, SHAPE(12), 0, 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11);
  em_tensor *s = em_slice(m, 1, 1, 3, 1);
  cr_assert_eq(em_storage_offset(s), 1);
  em_fill_(s, -1);
  EXPECT(x, F, SHAPE(12), 0, 0, -1, -1, 3, 4, -1, -1, 7, 8, -1, -1, 11);
}

ETEST(lifetime, scopes_release_and_keep) {
  int64_t before = em_debug_live_tensors();
  em_tensor *kept;
  em_scope_begin();
  em_tensor *a = em_ones(F, EM_SHAPE(4));
  em_tensor *b = em_add(a, a);
  kept = em_keep(b);
  cr_assert_eq(kept, b);
  em_scope_end();
  cr_assert_eq(em_debug_live_tensors(), before + 1, "only the kept tensor survives");
  EXPECT(kept, F, SHAPE(4), 0, 2, 2, 2, 2);
}

ETEST(lifetime, retain_release) {
  CPU_ONLY("the CPU storage counters");
  em_tensor *r;
  em_scope_begin();
  r = em_retain(em_zeros(F, EM_SHAPE(8)));
  em_scope_end();
  cr_assert_eq(em_numel(r), 8);
  em_tensor *v;
  em_scope_begin();
  v = em_retain(em_slice(r, 0, 2, 4, 1));
  em_scope_end();
  em_release(r); /* the view keeps the storage alive */
  cr_assert_eq(em_debug_live_bytes(), 32);
  cr_assert_eq(em_numel(v), 2);
  em_release(v);
  cr_assert_eq(em_debug_live_bytes(), 0);
  em_release(NULL);
  cr_assert_null(em_retain(NULL));
}

ETEST(lifetime, scope_end_without_begin) {
  em_scope_end(); /* closes the test's own scope */
  em_clear_error();
  em_scope_end();
  cr_assert_not_null(em_last_error());
  cr_assert(strstr(em_last_error(), "no scope is open"));
  cr_assert(strstr(em_last_error(), "test_tensor.c:"), "error names the caller: %s", em_last_error());
  em_clear_error();
  em_scope_begin();
}

ETEST(lifetime, peak_bytes) {
  CPU_ONLY("the CPU storage counters");
  em_debug_reset_peak();
  int64_t base = em_debug_peak_bytes();
  em_scope_begin();
  em_zeros(F, EM_SHAPE(1000));
  em_scope_end();
  cr_assert_eq(em_debug_peak_bytes(), base + 4000);
}

ETEST(values, item_and_buffers) {
  cr_assert_eq(em_item(T(EM_I32, SHAPE(1, 1), -4)), -4);
  cr_assert_eq(em_item(em_scalar(EM_BOOL, 1)), 1);
  em_clear_error();
  cr_assert(isnan(em_item(T(F, SHAPE(2), 1, 2))));
  cr_assert(strstr(em_last_error(), "em_item: needs a tensor with one element, got f32[2]"));
  em_clear_error();
  int32_t out[4];
  em_tensor *t = em_transpose(T(D, SHAPE(2, 2), 1.5, 2.5, 3.5, 4.5), 0, 1);
  cr_assert(em_to_buffer(t, EM_I32, out, sizeof out));
  cr_assert(out[0] == 1 && out[1] == 3 && out[2] == 2 && out[3] == 4);
  cr_assert(!em_to_buffer(t, EM_I32, out, 8));
  cr_assert(strstr(em_last_error(), "needs 16 bytes"));
  em_clear_error();
}

static void expect_format(em_tensor *t, const char *want) {
  char *s = em_format(t);
  cr_assert_not_null(s);
  cr_assert_str_eq(s, want);
  free(s);
}

ETEST(print, like_pytorch) {
  CPU_ONLY("the CPU tensor's text; CUDA's adds device='cuda:0' (tests/test_cuda_eager.c)");
  expect_format(T(F, SHAPE(2, 2), 1, 2, 3, 4), "tensor([[1., 2.],\n        [3., 4.]])");
  expect_format(T(F, SHAPE(3), 0.5, -1.25, 2), "tensor([ 0.5000, -1.2500,  2.0000])");
  expect_format(T(D, SHAPE(2), 1e-5, 1), "tensor([1.0000e-05, 1.0000e+00], dtype=f64)");
  expect_format(T(EM_I64, SHAPE(3), 1, -20, 300), "tensor([  1, -20, 300])");
  expect_format(T(EM_I32, SHAPE(1), 5), "tensor([5], dtype=i32)");
  expect_format(T(EM_BOOL, SHAPE(2), 1, 0), "tensor([ True, False])");
  expect_format(em_scalar(F, 3.5), "tensor(3.5000)");
  expect_format(em_zeros(F, EM_SHAPE(0, 3)), "tensor([], size=(0, 3))");
  expect_format(T(F, SHAPE(2), NAN, INFINITY), "tensor([nan, inf])");
  expect_format(em_reshape(em_arange(F, 0, 8, 1), EM_SHAPE(2, 2, 2)),
                "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]])");
  expect_format(em_arange(EM_I64, 0, 2000, 1), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
}

ETEST(print, summarises_rows) {
  char *s = em_format(em_zeros(F, EM_SHAPE(100, 100)));
  cr_assert(strstr(s, "...,\n"), "rows summarised: %s", s);
  cr_assert_lt(strlen(s), 400u);
  free(s);
}

/* A counting allocator, to show every allocation goes through the pluggable one. */
static int64_t counted_allocs, counted_frees;
static void *counting_alloc(void *ctx, size_t bytes, size_t align) {
  (void)ctx;
  counted_allocs++;
  size_t n = (bytes + align - 1) / align * align;
  return aligned_alloc(align < 16 ? 16 : align, n ? n : align);
}
static void counting_free(void *ctx, void *p) {
  (void)ctx;
  counted_frees++;
  free(p);
}

Test(alloc, pluggable_allocator) {
  em_thread_cleanup();
  em_allocator a = {counting_alloc, counting_free, NULL};
  em_set_allocator(&a);
  em_scope_begin();
  em_tensor *x = em_ones(F, EM_SHAPE(16));
  em_tensor *y = em_add(x, x);
  cr_assert_eq(em_item(em_sum(y, 0, NULL, false)), 32);
  em_scope_end();
  em_thread_cleanup();
  em_set_allocator(NULL);
  cr_assert_gt(counted_allocs, 4);
  cr_assert_eq(counted_allocs, counted_frees, "%lld allocations, %lld frees", (long long)counted_allocs,
               (long long)counted_frees);
  cr_assert_eq(em_debug_live_tensors(), 0);
}

ETEST(threads, set_and_get) {
  em_set_num_threads(1);
  cr_assert_eq(em_get_num_threads(), 1);
  em_tensor *x = em_arange(D, 0, 1 << 17, 1);
  double s1 = em_item(em_sum(x, 0, NULL, false));
  em_set_num_threads(0);
  cr_assert_geq(em_get_num_threads(), 1);
  double s2 = em_item(em_sum(x, 0, NULL, false));
  cr_assert_eq(s1, s2);
}

/* ---- same bits for any thread count (issue 23) ------------------------------------------ */

#include "../bench/models.h"

typedef struct {
  net *m;
  em_optimizer *opt;
} same_bits_step;

static em_outputs same_bits_train(void *ctx, em_tensor *const *in, int n) {
  same_bits_step *s = ctx;
  em_tensor *loss = mlp_fn(s->m, in, n).t[0];
  em_optimizer_zero_grad(s->opt);
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(s->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

enum { SAME_BITS_MAX = 48 };

/* Every kind of loop Ember splits across threads, each large enough to be split: random and
 * iota fills, strided pointwise ops, contiguous copies, reductions split by outputs and within
 * one output (row and column mode), GEMM tiles (f32 oneDNN, f64 OpenBLAS, integer reference),
 * batched and transposed products, convolutions and their gradients (oneDNN f32, reference
 * f64), row gathers, scatter_add, softmax, cumsum and argsort, and a compiled MLP training
 * step (the inductor's kernels) after an eager one. Returns the results, kept. */
static int same_bits_results(em_tensor **r) {
  int n = 0;
#define KEEP(t) (r[n++] = em_keep(em_contiguous(t)))
  em_manual_seed(23);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(512, 384)), *y = em_randn(EM_F32, EM_SHAPE(384, 512));
  em_tensor *xd = em_randn(EM_F64, EM_SHAPE(300, 300)), *v = em_rand(EM_F32, EM_SHAPE(1 << 20));
  KEEP(x), KEEP(xd), KEEP(v);
  KEEP(em_arange(EM_F32, 0, 100000, 0.5)), KEEP(em_arange(EM_I64, 0, 1 << 18, 3));
  KEEP(em_add(x, em_transpose(y, 0, 1))), KEEP(em_exp(x)), KEEP(em_clone(v));
  KEEP(em_sum(v, 0, NULL, false)), KEEP(em_amax(v, 0, NULL, false)), KEEP(em_argmax(v, 0, false));
  KEEP(em_sum(x, 1, (int64_t[]){1}, false));
  em_tensor *tall = em_reshape(v, EM_SHAPE(16384, 64)), *wide = em_reshape(v, EM_SHAPE(128, 8192));
  KEEP(em_sum(tall, 1, (int64_t[]){0}, false)), KEEP(em_sum(wide, 1, (int64_t[]){0}, false));
  KEEP(em_argmax(tall, 0, false)), KEEP(em_softmax(x, 1));
  KEEP(em_cumsum(x, 1)), KEEP(em_argsort(x, 1, false));
  KEEP(em_matmul(x, y)), KEEP(em_matmul(em_transpose(y, 0, 1), em_transpose(x, 0, 1)));
  KEEP(em_matmul(em_reshape(x, EM_SHAPE(8, 64, 384)), em_reshape(y, EM_SHAPE(8, 384, 64))));
  KEEP(em_matmul(xd, xd));
  em_tensor *xi = em_randint(-50, 50, EM_SHAPE(128, 128));
  KEEP(em_matmul(xi, xi));
  em_tensor *img = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(48, 3, 32, 32)), true);
  em_tensor *ker = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(16, 3, 3, 3)), true);
  em_tensor *conv = em_conv2d(img, ker, EM_NONE, EM_CONV2D_DEFAULT);
  KEEP(conv);
  cr_assert(em_backward(em_sum(em_mul(conv, conv), 0, NULL, false), NULL), "%s", em_last_error());
  KEEP(em_get_grad(img)), KEEP(em_get_grad(ker));
  KEEP(em_conv2d(em_cast(img, EM_F64), em_cast(ker, EM_F64), EM_NONE, EM_CONV2D_DEFAULT));
  em_tensor *rows = em_randint(0, 1000, EM_SHAPE(512));
  KEEP(em_index_select(em_reshape(em_slice(v, 0, 0, 256000, 1), EM_SHAPE(1000, 256)), 0, rows));
  em_tensor *into = em_randint(0, 512, EM_SHAPE(1024, 256));
  em_tensor *src = em_reshape(em_slice(v, 0, 0, 262144, 1), EM_SHAPE(1024, 256));
  KEEP(em_scatter_add(em_zeros(EM_F32, EM_SHAPE(512, 256)), 0, into, src));

  net m = {0};
  models_mlp(&m, 784, 512, 512, 10);
  same_bits_step s = {&m, em_sgd_new(m.n_params, m.params, ((em_sgd_opts){0.01, 0.9, 0, 0, false}))};
  em_tensor *in[2] = {em_rand(EM_F32, EM_SHAPE(128, 784)), em_randint(0, 10, EM_SHAPE(128))};
  KEEP(same_bits_train(&s, in, 2).t[0]);
  em_compiled *c = em_compile(same_bits_train, &(em_compile_options){.backend = "inductor"});
  cr_assert_not_null(c, "%s", em_last_error());
  for (int i = 0; i < 3; i++) KEEP(em_call_n(c, &s, 2, in).t[0]);
  for (int i = 0; i < m.n_params; i++) KEEP(m.params[i]);
  em_compiled_free(c);
  em_optimizer_free(s.opt);
#undef KEEP
  cr_assert_leq(n, SAME_BITS_MAX);
  return n;
}

/* Which index each thread of a loop runs first. A thread's first task waits until every thread
 * has run one (at most 10 s), so no thread can take another's share before that one starts:
 * the first indices show where each thread starts claiming. */
enum { HOME_N = 24, HOME_THREADS = 3 };
typedef struct {
  int threads;
  _Atomic int started;                 /* threads that have run a task */
  _Atomic int64_t first[HOME_THREADS]; /* by rank: the first index run, -1 before */
  _Atomic int ranks_bad;
} home_job;

static void home_task(void *ctx, int64_t i) {
  home_job *h = ctx;
  int r = prim_rank();
  if (r < 0 || r >= h->threads) {
    atomic_store(&h->ranks_bad, 1);
    return;
  }
  int64_t none = -1;
  if (!atomic_compare_exchange_strong(&h->first[r], &none, i)) return;
  atomic_fetch_add(&h->started, 1);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while (atomic_load(&h->started) < h->threads && t.tv_sec - t0.tv_sec < 10);
}

static home_job home_run(int threads, bool ordered) {
  home_job h = {.threads = threads};
  for (int r = 0; r < HOME_THREADS; r++) atomic_init(&h.first[r], -1);
  em_set_num_threads(threads);
  (ordered ? prim_parallel_ordered : prim_parallel)(HOME_N, home_task, &h);
  em_set_num_threads(0);
  cr_assert_eq(atomic_load(&h.ranks_bad), 0, "prim_rank() outside [0, %d) in a task", threads);
  cr_assert_eq(atomic_load(&h.started), threads, "with %d threads, only %d ran a task in 10 s", threads,
               atomic_load(&h.started));
  return h;
}

/* Each thread of a loop starts on its own contiguous share (the caller, rank 0, on the first),
 * so successive loops over the same tensor keep each part on one core's cache; with one shared
 * counter (the pool's first design) the threads started at indices 0, 1, 2. Tasks that take
 * turns (prim_parallel_ordered) still claim the lowest indices first. */
ETEST(threads, each_thread_starts_on_its_own_share) {
  CPU_ONLY("the CPU's thread pool");
  for (int threads = 2; threads <= HOME_THREADS; threads++) {
    home_job h = home_run(threads, false);
    for (int r = 0; r < threads; r++)
      cr_assert_eq(atomic_load(&h.first[r]), (int64_t)HOME_N * r / threads,
                   "with %d threads, rank %d started at index %lld, not its share's first (%d)", threads, r,
                   (long long)atomic_load(&h.first[r]), HOME_N * r / threads);
  }
  home_job h = home_run(HOME_THREADS, true);
  int64_t seen = 0;
  for (int r = 0; r < HOME_THREADS; r++) seen |= (int64_t)1 << atomic_load(&h.first[r]);
  cr_assert_eq(seen, (1 << HOME_THREADS) - 1, "an ordered loop's threads start at the lowest indices");
}

ETEST(threads, same_bits_for_any_thread_count) {
  CPU_ONLY("the CPU's thread pool");
  /* eager fusion off: its tiers change a composite's bits from the op-by-op ones to the fused
   * kernel's after a few calls (the rounds below call each one once), whatever the thread count;
   * the fused kernels are the inductor's, whose bits the compiled step below checks */
  em_eager_fusion_config(0, -1);
  em_tensor *ref[SAME_BITS_MAX], *got[SAME_BITS_MAX];
  int counts[] = {1, 2, 3, 5}, n = 0;
  for (int c = 0; c < 4; c++) {
    em_set_num_threads(counts[c]);
    cr_assert_eq(em_get_num_threads(), counts[c]);
    em_scope_begin();
    int k = same_bits_results(c ? got : ref);
    cr_assert_null(em_last_error(), "%s", em_last_error());
    if (!c) n = k;
    for (int i = 0; c && i < n; i++) {
      size_t bytes = (size_t)em_numel(ref[i]) * em_dtype_size(em_dtype_of(ref[i]));
      cr_assert(!memcmp(em_data_ptr(ref[i]), em_data_ptr(got[i]), bytes), "result %d differs between 1 and %d threads",
                i, counts[c]);
    }
    em_scope_end(); /* what the round kept (em_keep) lives on in the test's scope */
  }
  em_eager_fusion_config(-1, -1);
  em_set_num_threads(0);
}
