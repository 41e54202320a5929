/* tests/cache_probe.c: a separate process for the kernel cache tests of test_inductor. It
 * compiles one fixed graph (a softmax and a pointwise chain with a SLEEF sin, over [37, 300]) with the inductor,
 * runs it, checks the result against eager execution, and prints where the kernels came from:
 *   "memory_hits disk_hits misses ok"
 * The cache directory comes from EMBER_CACHE_DIR, as for any process. Exit status 0 when the
 * result matched eager, 1 otherwise. */
#include <ember.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../inductor/inductor.h"
#include "../runtime/rt.h"

static bool refuse_break(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) { return false; }

/* EMBER_CACHE_PROBE_VARIANT=1 takes a sigmoid for the tanh of the sin: another module, another entry. */
static em_tensor *program(em_tensor *x) {
  bool variant = getenv("EMBER_CACHE_PROBE_VARIANT") != NULL;
  em_tensor *h = em_mul_scalar(x, 0.5);
  return em_add(em_softmax(x, 1), variant ? em_sigmoid(h) : em_tanh(em_sin(h)));
}

int main(void) {
  em_manual_seed(3);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(37, 300));
  em_tensor *want = program(x);
  rt_trace tr;
  if (!rt_trace_begin(&tr, "probe", refuse_break, NULL, EM_HERE)) return 1;
  em_scope_begin();
  em_tensor *y = program(x);
  bool ok = y && ir_add_output(tr.g, rt_trace_value_of(&tr, y));
  ir_graph *g = ok ? ir_graph_clone(tr.g) : NULL;
  em_tensor *gin[4];
  int n_in = tr.n_lifted;
  for (int i = 0; i < n_in && i < 4; i++) gin[i] = tr.lifted[i];
  em_scope_end();
  rt_trace_end(&tr);
  ok = ok && g && n_in <= 4 && ir_graph_compact(g, NULL, NULL);
  char err[512] = "";
  ind_program *p = ok ? ind_compile(g, gin, NULL, err, sizeof err) : NULL;
  em_tensor *got = NULL;
  ok = p && ind_run(p, gin, n_in, &got, NULL, EM_HERE);
  double worst = ok ? em_item(em_amax(em_abs(em_sub(rt_scope_add(got, "probe", EM_HERE), want)), 0, NULL, false)) : INFINITY;
  ok = ok && worst <= 1e-5;
  ind_cache_stats s = ind_cache_counters();
  printf("%lld %lld %lld %d\n", (long long)s.memory_hits, (long long)s.disk_hits, (long long)s.misses, ok);
  if (!ok) fprintf(stderr, "cache_probe: %s %s (worst difference %g)\n", err, em_last_error() ? em_last_error() : "", worst);
  ind_free(p);
  ir_graph_free(g);
  em_thread_cleanup();
  return ok ? 0 : 1;
}
