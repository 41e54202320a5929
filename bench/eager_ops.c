/* bench/eager_ops.c: eager dispatch overhead and memory-bound kernel throughput.
 *
 * Figures (medians of repeated runs):
 *  - dispatch: ns per em_add of two 1-element f32 tensors, including the result's allocation
 *    and its release at scope end (1000 calls per scope, 1000 scopes = 1e6 calls);
 *  - GB/s of 16M-element f32 add, maximum(x, 0), exp and a full sum, counting bytes read plus
 *    bytes written, against memcpy of the same bytes measured in the same run into an
 *    already-touched buffer; each ratio is printed beside its figure. */
#include "bench.h"

#include <ember.h>
#include <omp.h>

enum { N = 16 * 1024 * 1024, REPS = 15 };

static double time_memcpy(void *dst, const void *src, size_t bytes) {
  double t[REPS];
  for (int r = 0; r < REPS; r++) {
    double t0 = bench_now();
    /* memcpy split across the same threads Ember's kernels use, for a fair ceiling. */
#pragma omp parallel
    {
      int nt = omp_get_num_threads(), id = omp_get_thread_num();
      size_t chunk = bytes / (size_t)nt, b = chunk * (size_t)id, e = id == nt - 1 ? bytes : b + chunk;
      memcpy((char *)dst + b, (const char *)src + b, e - b);
    }
    t[r] = bench_now() - t0;
  }
  return bench_median(t, REPS);
}

typedef em_tensor *(*op_fn)(em_tensor *x, em_tensor *y);
static em_tensor *op_add(em_tensor *x, em_tensor *y) { return em_add(x, y); }
static em_tensor *op_relu(em_tensor *x, em_tensor *y) { (void)y; return em_maximum_scalar(x, 0); }
static em_tensor *op_exp(em_tensor *x, em_tensor *y) { (void)y; return em_exp(x); }
static em_tensor *op_sum(em_tensor *x, em_tensor *y) { (void)y; return em_sum(x, 0, NULL, false); }

static double time_op(op_fn f, em_tensor *x, em_tensor *y) {
  double t[REPS];
  for (int r = -2; r < REPS; r++) { /* two warm-up runs fill the allocator's cache */
    em_scope_begin();
    double t0 = bench_now();
    em_tensor *o = f(x, y);
    double dt = bench_now() - t0;
    if (!o) {
      fprintf(stderr, "eager_ops: %s\n", em_last_error());
      exit(1);
    }
    em_scope_end();
    if (r >= 0) t[r] = dt;
  }
  return bench_median(t, REPS);
}

int main(int argc, char **argv) {
  bench_init("eager_ops", argc, argv);
  em_scope_begin();
  if (!bench_json) printf("eager_ops: %d threads\n", em_get_num_threads());

  /* Dispatch overhead. */
  em_tensor *a = em_ones(EM_F32, EM_SHAPE(1)), *b = em_ones(EM_F32, EM_SHAPE(1));
  enum { CALLS = 1000, ROUNDS = 1000 };
  double per[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    em_scope_begin();
    double t0 = bench_now();
    for (int i = 0; i < CALLS; i++) em_add(a, b);
    em_scope_end();
    per[r] = (bench_now() - t0) / CALLS * 1e9;
  }
  bench_report("dispatch_add_1elem", bench_median(per, ROUNDS), "ns", "per op, incl. alloc + release");

  /* Bandwidth. */
  size_t bytes = (size_t)N * 4;
  char *src = malloc(bytes), *dst = malloc(bytes);
  memset(src, 1, bytes);
  memset(dst, 0, bytes);
  double tm = time_memcpy(dst, src, bytes);
  double memcpy_gbs = 2.0 * (double)bytes / tm / 1e9;
  bench_report("memcpy_64MiB", memcpy_gbs, "GB/s", "read + write, baseline");
  free(src);
  free(dst);

  em_manual_seed(0);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(N)), *y = em_randn(EM_F32, EM_SHAPE(N));
  struct {
    const char *name;
    op_fn f;
    double bytes_moved;
  } ops[] = {
      {"add_f32_16M", op_add, 3.0 * (double)bytes},
      {"relu_f32_16M", op_relu, 2.0 * (double)bytes},
      {"exp_f32_16M", op_exp, 2.0 * (double)bytes},
      {"sum_f32_16M", op_sum, 1.0 * (double)bytes},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    double t = time_op(ops[i].f, x, y);
    double gbs = ops[i].bytes_moved / t / 1e9;
    char note[64], ratio_name[64];
    snprintf(note, sizeof note, "%.0f%% of memcpy", 100 * gbs / memcpy_gbs);
    bench_report(ops[i].name, gbs, "GB/s", note);
    snprintf(ratio_name, sizeof ratio_name, "%s_vs_memcpy", ops[i].name);
    if (bench_json) bench_report(ratio_name, gbs / memcpy_gbs, "ratio", NULL);
  }
  em_scope_end();
  em_thread_cleanup();
  return em_debug_live_tensors() == 0 ? 0 : 1;
}
