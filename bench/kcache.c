/* bench/kcache.c: memory over a long stream of distinct compiled graphs, with the in-memory
 * kernel cache bounded (the default, 256 modules) and, for comparison in the same process,
 * unbounded.
 *
 * Each call compiles a new function whose graph no earlier call had (17 ops, each tanh or sin
 * by the bits of the call's number: a new kernel module every call), runs it once and frees it,
 * as a program whose constants or structure change every call would. Figures: resident memory
 * (MB, /proc/self/statm) after the first 500 calls and after all of them, the modules the JIT
 * keeps, evictions, and ms per call. The disk cache is off (EMBER_CACHE=0), so every module is
 * compiled by LLVM and nothing is written to the user's cache.
 *   ./build/bench/kcache [--calls N] [--json]   (N per phase, default 3000) */
#include "bench.h"
#include "../inductor/inductor.h"

#include <ember.h>
#include <unistd.h>

static double rss_mb(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

static em_outputs pattern(void *ctx, em_tensor *const *in, int n) {
  unsigned bits = *(const unsigned *)ctx;
  em_tensor *x = in[0];
  for (int k = 0; k < 17; k++) x = (bits >> k) & 1 ? em_tanh(x) : em_sin(x);
  return EM_OUTPUTS(x);
}

static void phase(const char *label, unsigned first, int calls, em_tensor *x) {
  double t0 = bench_now(), at500 = 0;
  int64_t ev0 = em_kernel_cache_info().evictions;
  for (int i = 0; i < calls; i++) {
    unsigned bits = first + (unsigned)i;
    em_scope_begin();
    em_compiled *c = em_compile(pattern, NULL);
    em_outputs o = em_call(c, &bits, x);
    if (!o.t[0] || em_compiled_stats(c).kernel_runs < 1) {
      fprintf(stderr, "kcache: call %d failed: %s\n", i, em_last_error() ? em_last_error() : "no kernel ran");
      exit(1);
    }
    em_compiled_free(c);
    em_scope_end();
    if (i + 1 == 500) at500 = rss_mb();
  }
  double ms = 1e3 * (bench_now() - t0) / calls, end = rss_mb();
  em_kernel_cache_stats s = em_kernel_cache_info();
  char name[64], note[96];
  snprintf(name, sizeof name, "%s_rss_mb_at_500", label);
  bench_report(name, at500, "MB", NULL);
  snprintf(name, sizeof name, "%s_rss_mb_at_%d", label, calls);
  snprintf(note, sizeof note, "+%.1f MB since call 500", end - at500);
  bench_report(name, end, "MB", note);
  snprintf(name, sizeof name, "%s_modules", label);
  snprintf(note, sizeof note, "limit %lld, %lld evicted in this phase", (long long)s.limit, (long long)(s.evictions - ev0));
  bench_report(name, (double)s.modules, "", note);
  snprintf(name, sizeof name, "%s_ms_per_call", label);
  bench_report(name, ms, "ms", "compile (trace, inductor, LLVM) + run + free");
}

int main(int argc, char **argv) {
  bench_init("kcache", argc, argv);
  int calls = 3000;
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--calls")) calls = atoi(argv[i + 1]);
  if (calls < 500) calls = 500;
  setenv("EMBER_CACHE", "0", 1);
  em_scope_begin();
  em_manual_seed(0);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(64, 64));
  phase("bounded", 0, calls, x);
  ind_set_kernel_cache_limit(1 << 30);
  phase("unbounded", 1u << 16, calls, x);
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
