/* bench/bench.h: what every bench program shares: a monotonic clock, medians of repeated runs,
 * and output as text or, with --json, one JSON object per line per figure:
 *   {"bench": "eager_ops", "name": "add_f32_16M", "value": 41.2, "unit": "GB/s"} */
#ifndef EMBER_BENCH_H
#define EMBER_BENCH_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool bench_json;
static const char *bench_name;

static inline void bench_init(const char *name, int argc, char **argv) {
  bench_name = name;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--json")) bench_json = true;
}

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One memcpy of `bytes` between buffers kept for the process; returns ms (the bandwidth
 * ceiling memory-bound kernels are compared with). Exits when the buffers cannot be had. */
static inline double bench_memcpy_ms(size_t bytes) {
  static char *a, *b;
  static size_t have;
  if (bytes > have) {
    free(a), free(b);
    a = malloc(bytes), b = malloc(bytes);
    if (!a || !b) {
      fprintf(stderr, "bench: out of memory for memcpy's %zu bytes\n", bytes);
      exit(1);
    }
    memset(a, 1, bytes), memset(b, 2, bytes);
    have = bytes;
  }
  double t0 = bench_now();
  memcpy(b, a, bytes);
  double dt = bench_now() - t0;
  a[0] = b[bytes - 1];
  return 1e3 * dt;
}

/* Removes the directory bench_fresh_cache made (and what the run wrote in it). */
static inline void bench_remove_dir(const char *dir) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "bench: could not remove %s\n", dir);
}

static inline void bench_report(const char *name, double value, const char *unit, const char *note) {
  if (bench_json)
    printf("{\"bench\": \"%s\", \"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\"}\n", bench_name, name, value, unit);
  else
    printf("%-28s %12.3f %-6s %s\n", name, value, unit, note ? note : "");
  fflush(stdout);
}

#endif
