/* tests/common.h: what every Ember test file shares.
 *
 * ETEST wraps Criterion's Test so that every test runs inside a scope and ends by checking that
 * no tensor and no byte of storage is left alive and that no error is left unread: a test that
 * leaks fails, whatever it asserted before. Helpers build tensors from literals and compare
 * values with a tolerance. */
#ifndef EMBER_TEST_COMMON_H
#define EMBER_TEST_COMMON_H

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <ember.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* EMBER_TEST_DEVICE=cuda runs a suite with CUDA as the factories' default device, so its eager
 * tests run on the device: the GPU when a CUDA driver loads (EMBER_TEST_CUDA=emulate forces the
 * emulator), else the host emulator (EMBER_CUDA_EMULATE=1), said on stderr. */
static inline bool etest_on_cuda(void) {
  const char *dev = getenv("EMBER_TEST_DEVICE");
  return dev && !strcmp(dev, "cuda");
}

/* Chooses the GPU or the emulator before the first device call of the process. */
static inline void etest_pick_cuda(void) {
  const char *force = getenv("EMBER_TEST_CUDA");
  void *lib = force && !strcmp(force, "emulate") ? NULL : dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    dlclose(lib);
    return;
  }
  setenv("EMBER_CUDA_EMULATE", "1", 1);
  static bool said;
  if (!said)
    fprintf(stderr, "[cuda] NO GPU: these tests run on the host CUDA emulator (the generated kernels built by the host "
                    "C++ compiler; a block's threads run as fibers in kernels that synchronize); a GPU run is still "
                    "needed to check the device\n");
  said = true;
}

/* A test that only makes sense on the CPU (host pointers into tensor data, CPU-only dtypes)
 * says so and is skipped when the suite runs on CUDA. */
#define CPU_ONLY(why)                                                 \
  do {                                                                \
    if (etest_on_cuda()) cr_skip_test("CPU only (%s)", (why));        \
  } while (0)

static inline void etest_begin(void) {
  em_clear_error();
  em_debug_fail_alloc(0);
  if (etest_on_cuda()) {
    etest_pick_cuda();
    em_set_default_device(EM_CUDA);
  }
  cr_assert(em_scope_begin(), "could not open a scope");
}

static inline void etest_end(void) {
  em_scope_end();
  em_thread_cleanup();
  em_eager_fusion_wait(); /* a background compile holds copies of its inputs until it ends */
  if (etest_on_cuda()) {
    em_cuda_memory_stats s = em_cuda_memory_stats_get();
    cr_assert_eq(s.allocated_bytes, 0, "%lld device bytes leaked", (long long)s.allocated_bytes);
  }
  cr_assert_eq(em_debug_live_tensors(), 0, "%lld tensors leaked", (long long)em_debug_live_tensors());
  cr_assert_eq(em_debug_live_bytes(), 0, "%lld bytes leaked", (long long)em_debug_live_bytes());
  const char *e = em_last_error();
  cr_assert_null(e, "unexpected error left recorded: %s", e ? e : "");
}

#define ETEST(suite, name, ...)                    \
  static void suite##_##name##_body(void);         \
  Test(suite, name, ##__VA_ARGS__) {               \
    etest_begin();                                 \
    suite##_##name##_body();                       \
    etest_end();                                   \
  }                                                \
  static void suite##_##name##_body(void)

/* A tensor from a literal list of doubles, converted to dt. */
#define T(dt, shape, ...) etest_tensor((dt), (shape), (const double[]){__VA_ARGS__}, \
  (int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)))
#define SHAPE(...) ((etest_shape){(int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}})
#define SCALAR_SHAPE ((etest_shape){0, {0}})
typedef struct {
  int ndim;
  int64_t sizes[EM_MAX_DIMS];
} etest_shape;

static inline em_tensor *etest_tensor(em_dtype dt, etest_shape s, const double *v, int n) {
  em_tensor *d = em_from_data(v, EM_F64, s.ndim, s.sizes);
  cr_assert_not_null(d, "%s", em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_numel(d), n, "literal has %d values for %lld elements", n, (long long)em_numel(d));
  return dt == EM_F64 ? d : em_cast(d, dt);
}

/* Element i (row-major) of any tensor, as double. */
static inline double etest_at(em_tensor *t, int64_t i) {
  int64_t n = em_numel(t);
  cr_assert(i < n);
  double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
  cr_assert(em_to_buffer(t, EM_F64, buf, sizeof(double) * (size_t)n), "%s", em_last_error());
  double v = buf[i];
  free(buf);
  return v;
}

/* Asserts t has dtype dt, the given shape and values (within tol; NaN matches NaN). */
static inline void etest_expect(em_tensor *t, em_dtype dt, etest_shape s, const double *v, int n, double tol,
                                const char *file, int line) {
  cr_assert_not_null(t, "%s:%d: result is NULL: %s", file, line, em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_dtype_of(t), dt, "%s:%d: dtype %s, expected %s", file, line, em_dtype_name(em_dtype_of(t)),
               em_dtype_name(dt));
  cr_assert_eq(em_ndim(t), s.ndim, "%s:%d: ndim %d, expected %d", file, line, em_ndim(t), s.ndim);
  for (int i = 0; i < s.ndim; i++)
    cr_assert_eq(em_size(t, i), s.sizes[i], "%s:%d: size %d is %lld, expected %lld", file, line, i,
                 (long long)em_size(t, i), (long long)s.sizes[i]);
  cr_assert_eq(em_numel(t), n, "%s:%d: %lld elements, expected %d", file, line, (long long)em_numel(t), n);
  double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
  cr_assert(em_to_buffer(t, EM_F64, buf, sizeof(double) * (size_t)n));
  for (int i = 0; i < n; i++) {
    bool ok = (isnan(v[i]) && isnan(buf[i])) || buf[i] == v[i] ||
              fabs(buf[i] - v[i]) <= tol * (1 + fabs(v[i]));
    if (!ok) {
      double got = buf[i];
      free(buf);
      cr_assert_fail("%s:%d: element %d is %.17g, expected %.17g", file, line, i, got, v[i]);
    }
  }
  free(buf);
}
#define EXPECT(t, dt, shape, tol, ...) etest_expect((t), (dt), (shape), (const double[]){__VA_ARGS__}, \
  (int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)), (tol), __FILE__, __LINE__)

/* Asserts t has dtype dt and the given shape (any number of elements, 0 included), and that every
 * element equals v within tol. */
static inline void etest_expect_all(em_tensor *t, em_dtype dt, etest_shape s, double v, double tol, const char *file,
                                    int line) {
  cr_assert_not_null(t, "%s:%d: result is NULL: %s", file, line, em_last_error() ? em_last_error() : "");
  int64_t n = 1;
  for (int i = 0; i < s.ndim; i++) n *= s.sizes[i];
  double *want = calloc((size_t)(n ? n : 1), sizeof(double));
  for (int64_t i = 0; i < n; i++) want[i] = v;
  etest_expect(t, dt, s, want, (int)n, tol, file, line);
  free(want);
}
#define EXPECT_ALL(t, dt, shape, tol, v) etest_expect_all((t), (dt), (shape), (v), (tol), __FILE__, __LINE__)

/* Asserts that expr returned NULL and recorded an error containing `needle`, then clears it. */
#define EXPECT_ERROR(expr, needle)                                                            \
  do {                                                                                        \
    em_clear_error();                                                                         \
    const void *r_ = (const void *)(expr);                                                    \
    const char *e_ = em_last_error();                                                         \
    cr_assert_null(r_, "%s:%d: expected an error", __FILE__, __LINE__);                       \
    cr_assert_not_null(e_, "%s:%d: no error recorded", __FILE__, __LINE__);                   \
    cr_assert(strstr(e_, (needle)) != NULL, "%s:%d: error '%s' lacks '%s'", __FILE__, __LINE__, e_, (needle)); \
    em_clear_error();                                                                         \
  } while (0)

/* Fault injection: runs f with its n-th allocation failing, for n = 1, 2, ... until f makes
 * fewer than n allocations. Each failing run must return NULL with an "out of memory" error
 * and leak nothing; the final run must succeed. Returns the number of failure points
 * exercised, which the caller checks is not trivially small. */
static inline int etest_fail_each_allocation(const char *name, em_tensor *(*f)(void), int64_t max_n) {
  int failures = 0;
  for (int64_t n = 1; n < max_n; n++) {
    int64_t tensors = em_debug_live_tensors(), bytes = em_debug_live_bytes();
    em_clear_error();
    cr_assert(em_scope_begin());
    int64_t start = em_debug_alloc_count();
    em_debug_fail_alloc(n);
    em_tensor *r = f();
    em_debug_fail_alloc(0);
    bool reached = em_debug_alloc_count() - start >= n;
    if (reached) {
      failures++;
      cr_assert_null(r, "%s: allocation %lld failed but a tensor came back (error: %s)", name, (long long)n,
                     em_last_error() ? em_last_error() : "none");
      cr_assert(em_last_error() && strstr(em_last_error(), "out of memory"), "%s: allocation %lld: %s", name,
                (long long)n, em_last_error() ? em_last_error() : "failed silently");
    } else {
      cr_assert_not_null(r, "%s: %s", name, em_last_error() ? em_last_error() : "");
    }
    em_scope_end();
    em_clear_error();
    cr_assert_eq(em_debug_live_tensors(), tensors, "%s: allocation %lld failing leaked %lld tensors", name,
                 (long long)n, (long long)(em_debug_live_tensors() - tensors));
    cr_assert_eq(em_debug_live_bytes(), bytes, "%s: allocation %lld failing leaked bytes", name, (long long)n);
    if (!reached) break;
  }
  return failures;
}

/* Asserts a and b have the same dtype, shape and bytes (compiled vs eager must agree exactly). */
static inline void etest_expect_same_bits(em_tensor *a, em_tensor *b, const char *what, const char *file, int line) {
  cr_assert(a && b, "%s:%d: %s: NULL: %s", file, line, what, em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_dtype_of(a), em_dtype_of(b), "%s:%d: %s: dtypes differ", file, line, what);
  cr_assert_eq(em_ndim(a), em_ndim(b), "%s:%d: %s: ranks differ", file, line, what);
  for (int i = 0; i < em_ndim(a); i++)
    cr_assert_eq(em_size(a, i), em_size(b, i), "%s:%d: %s: size %d differs", file, line, what, i);
  size_t n = (size_t)em_numel(a) * em_dtype_size(em_dtype_of(a));
  char *x = malloc(n + 1), *y = malloc(n + 1);
  cr_assert(em_to_buffer(a, em_dtype_of(a), x, n) && em_to_buffer(b, em_dtype_of(b), y, n));
  int d = memcmp(x, y, n);
  free(x), free(y);
  if (d) { /* name the first element that differs, with both values */
    size_t es = em_dtype_size(em_dtype_of(a)), k = 0;
    double *u = malloc(sizeof(double) * (size_t)em_numel(a)), *v = malloc(sizeof(double) * (size_t)em_numel(a));
    cr_assert(em_to_buffer(a, EM_F64, u, sizeof(double) * (size_t)em_numel(a)) &&
              em_to_buffer(b, EM_F64, v, sizeof(double) * (size_t)em_numel(a)));
    while ((int64_t)k + 1 < em_numel(a) && (u[k] == v[k] || (isnan(u[k]) && isnan(v[k])))) k++;
    double uk = u[k], vk = v[k];
    free(u), free(v);
    cr_assert_fail("%s:%d: %s: values differ (%zu-byte elements; first at %zu: %.17g vs %.17g)", file, line, what, es, k,
                   uk, vk);
  }
}
#define EXPECT_SAME_BITS(a, b, what) etest_expect_same_bits((a), (b), (what), __FILE__, __LINE__)

#endif
