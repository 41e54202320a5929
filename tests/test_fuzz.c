/* tests/test_fuzz.c: the CI slice of the differential fuzzer (tests/fuzz_program.h): a fixed
 * range of program seeds, each run eagerly and under every compiled configuration, three calls
 * each, outputs and gradients compared. Any failure fails the test and prints the program.
 * EMBER_FUZZ_PROGRAMS=N runs N programs (default 400, about 25 s; 60 under the sanitizers, about
 * ten times slower); bench/fuzz runs the long campaigns, each program in its own process. */
#include "common.h"
#include "fuzz_program.h"

#if defined(__SANITIZE_ADDRESS__)
#define FZ_DEFAULT_PROGRAMS 60
#else
#define FZ_DEFAULT_PROGRAMS 400
#endif

ETEST(fuzz, random_programs_agree_with_eager_on_every_backend, .timeout = 600) {
  const char *e = getenv("EMBER_FUZZ_PROGRAMS");
  long n = e ? atol(e) : FZ_DEFAULT_PROGRAMS;
  int failures = 0, skipped = 0;
  for (long i = 0; i < n; i++) {
    bool skip;
    failures += fz_check((uint64_t)i, ~0u, stderr, &skip);
    skipped += skip;
  }
  cr_log_info("%ld programs, %d failures, %d rejected by eager", n, failures, skipped);
  cr_assert_eq(failures, 0, "%d of %ld programs differ from eager (printed on stderr)", failures, n);
  cr_assert_eq(skipped, 0, "%d programs were rejected by eager (printed on stderr): fix the generator", skipped);
}

/* Programs the long campaigns found, replayed on every run. 3979, 4163, 4286 (and 12 more from
 * the same campaign): a prod over every element of a 1-D tensor; the eager backend's graph
 * writes its one axis out where eager left it implicit, and prod's gradient took torch's
 * one-axis rule there and the full rule in eager: gradients 1 ulp apart where the eager
 * backend promises eager's bits. */
ETEST(fuzz, programs_the_long_campaigns_found) {
  static const uint64_t seeds[] = {3979, 4163, 4286, 5335, 9231};
  int failures = 0;
  for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
    bool skip;
    failures += fz_check(seeds[i], ~0u, stderr, &skip);
    cr_assert(!skip, "program %llu was rejected by eager", (unsigned long long)seeds[i]);
  }
  cr_assert_eq(failures, 0, "%d found programs differ from eager again (printed on stderr)", failures);
}

/* Dynamic shapes: each program called at growing and shrinking sizes through one compiled
 * function (fz_check_dynamic). EMBER_FUZZ_DYNAMIC_PROGRAMS=N (default 150; 22 under the
 * sanitizers). */
ETEST(fuzz, random_programs_at_changing_sizes_agree_with_eager, .timeout = 600) {
  /* every size compiled at its first call: the generated kernels at each size, not the eager
   * kernels a dynamic entry runs at a size's first calls by default */
  setenv("EMBER_DYNAMIC_COMPILE_AFTER", "1", 0); /* (unless set: =3 checks the op-by-op tier) */
  const char *e = getenv("EMBER_FUZZ_DYNAMIC_PROGRAMS");
  long n = e ? atol(e) : FZ_DEFAULT_PROGRAMS * 3 / 8;
  int failures = 0, skipped = 0;
  for (long i = 0; i < n; i++) {
    bool skip;
    failures += fz_check_dynamic((uint64_t)i, stderr, &skip);
    skipped += skip;
  }
  cr_log_info("%ld programs at changing sizes, %d failures, %d rejected by eager, %lld dynamic entries", n, failures,
              skipped, (long long)fz_dynamic_entries);
  /* most programs' op choices do not depend on their sizes (60% of 1500 made dynamic entries;
   * fewer among the first few dozen seeds): the probes must find formulas for at least a
   * quarter, or this test would only exercise the specializing fallback */
  cr_assert_geq(fz_dynamic_entries, n / 4, "only %lld dynamic entries over %ld programs", (long long)fz_dynamic_entries, n);
  cr_assert_eq(failures, 0, "%d of %ld programs differ from eager at changing sizes (printed on stderr)", failures, n);
  cr_assert_eq(skipped, 0, "%d programs were rejected by eager (printed on stderr)", skipped);
}
