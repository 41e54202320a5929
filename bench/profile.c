/* bench/profile.c: what the Chrome-trace profiler costs on the cheapest op, a 1-element eager
 * add (the dispatch path, where its hook sits): ns per op with the profiler off and on,
 * alternating in one process, medians of 11 repetitions of 20,000 adds each (each event takes about 220 bytes, kept until exit). The off figure
 * is to be compared with an Ember without the hook (README: 240-370 ns before it). */
#include <ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
static int cmp(const void *a, const void *b) { return *(const double *)a < *(const double *)b ? -1 : 1; }

int main(void) {
  enum { REPS = 11, N = 20000 };
  double off[REPS], on[REPS];
  em_tensor *a = em_retain(em_ones(EM_F32, EM_SHAPE(1)));
  for (int r = 0; r < REPS; r++)
    for (int mode = 0; mode < 2; mode++) {
      if (mode) em_profiler_start();
      double t0 = now_ns();
      for (int i = 0; i < N; i++) {
        em_scope_begin();
        em_add(a, a);
        em_scope_end();
      }
      double ns = (now_ns() - t0) / N;
      if (mode) em_profiler_stop("/dev/null");
      (mode ? on : off)[r] = ns;
    }
  qsort(off, REPS, sizeof off[0], cmp), qsort(on, REPS, sizeof on[0], cmp);
  printf("1-element add, ns per op (median of %d x %d): profiler off %.1f, on %.1f (%.2fx; includes writing no file)\n",
         REPS, N, off[REPS / 2], on[REPS / 2], on[REPS / 2] / off[REPS / 2]);
  em_release(a);
  em_thread_cleanup();
  return 0;
}
