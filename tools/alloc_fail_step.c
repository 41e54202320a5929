/* tools/alloc_fail_step.c: one MLP training step with one allocation made to fail, and a
 * verdict on what Ember made of it. scripts/alloc_fail.sh runs it once per failure point.
 *
 *   alloc_fail_step MODE WHICH N
 *     MODE   eager     warm-up steps, then an eager step
 *            compiled  warm-up calls of the compiled step (trace, check, replay), then a replay
 *            first     one eager warm-up step, then the compiled step's first call: trace,
 *                      aot_autograd, inductor, LLVM (EMBER_CACHE=0) or the disk cache
 *     WHICH  ember     the n-th allocation through Ember's allocator fails (em_debug_fail_alloc)
 *            malloc    the n-th heap allocation of the process fails (needs tools/failmalloc.c
 *                      preloaded: LD_PRELOAD=.../libfailmalloc.so)
 *     N      0: nothing fails; the step's allocations are counted ("allocs <k>" on stdout)
 *
 * The step is a 784-128-10 MLP on a random batch of 64 with SGD (momentum), forward, backward
 * and update in one function, as tests/test_train.c and bench/compiled.c train. After the
 * armed step, three more steps must succeed (the library is still usable), and once every
 * tensor, the optimizer and the compiled function are freed no tensor or storage byte may be
 * left alive. Exit status:
 *   0  the step finished (the failure was absorbed: a fallback, a cache that did without)
 *   3  contained: the step failed with a non-empty Ember error, the next steps work, no leak
 *   4  the step failed without an error message       5  an error, yet the step returned a loss
 *   6  a step after the failure failed                  7  tensors or storage left alive
 *   8  setup failed (before the failure was armed)
 * Anything else (a signal; exit(1) from a library) is a process killed below Ember: a handler
 * prints the signal and a backtrace, an atexit handler the backtrace of an unexpected exit(). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <ember.h>
#include <execinfo.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct model {
  em_linear_layer l1, l2;
  em_optimizer *opt;
} model;

static em_outputs train_step(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  model *m = ctx;
  em_tensor *h = em_relu(em_linear(in[0], m->l1.weight, m->l1.bias));
  em_tensor *loss = em_cross_entropy(em_linear(h, m->l2.weight, m->l2.bias), in[1], EM_CROSS_ENTROPY_DEFAULT);
  em_optimizer_zero_grad(m->opt);
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(m->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

/* One step, eager (c NULL) or compiled; returns the loss, NAN when it failed. */
static double step(model *m, em_compiled *c, em_tensor *x, em_tensor *y) {
  if (!em_scope_begin()) return NAN;
  em_tensor *loss = c ? em_call(c, m, x, y).t[0] : train_step(m, (em_tensor *[]){x, y}, 2).t[0];
  double v = loss ? em_item(loss) : NAN;
  em_scope_end();
  return v;
}

static volatile sig_atomic_t finished; /* main is returning: exit() is ours */

static void say(const char *s) {
  if (write(2, s, strlen(s)) < 0) return;
}

static void backtrace_here(void) {
  void *frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
}

static void on_signal(int sig) {
  char line[96];
  snprintf(line, sizeof line, "alloc_fail_step: killed by signal %d (%s)\n", sig, strsignal(sig));
  say(line);
  backtrace_here();
  say("alloc_fail_step: end of backtrace\n");
  signal(sig, SIG_DFL);
  raise(sig);
}

static void on_exit_call(void) {
  if (finished) return;
  say("alloc_fail_step: exit() called below Ember, from:\n");
  backtrace_here();
  say("alloc_fail_step: end of backtrace\n");
}

static int done(int code) {
  finished = 1;
  return code;
}

int main(int argc, char **argv) {
  if (argc != 4 || (strcmp(argv[1], "eager") && strcmp(argv[1], "compiled") && strcmp(argv[1], "first")) ||
      (strcmp(argv[2], "ember") && strcmp(argv[2], "malloc"))) {
    fprintf(stderr, "usage: alloc_fail_step eager|compiled|first ember|malloc N\n");
    return done(2);
  }
  /* eager fusion off: a fused call's first calls start a background compile that holds tensors of
   * its own (inputs shaped as the call's), which this program's count of live tensors would take for leaks; the eager step
   * here is the op-by-op one (eager fusion's own failures are the compiler's, tested through
   * em_compile's steps below) */
  em_eager_fusion_config(0, -1);
  const char *mode = argv[1];
  bool use_malloc = !strcmp(argv[2], "malloc");
  long long n = atoll(argv[3]);
  int64_t (*arm)(int64_t) = NULL, (*count)(void) = NULL;
  if (use_malloc) {
    arm = (int64_t(*)(int64_t))dlsym(RTLD_DEFAULT, "failmalloc_arm");
    count = (int64_t(*)(void))dlsym(RTLD_DEFAULT, "failmalloc_count");
    if (!arm || !count) {
      fprintf(stderr, "alloc_fail_step: malloc needs LD_PRELOAD=libfailmalloc.so\n");
      return done(2);
    }
  }
  void *frame[1];
  backtrace(frame, 1); /* loads libgcc_s now, not while handling a signal */
  const int sigs[] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], on_signal);
  atexit(on_exit_call);

  em_manual_seed(1);
  model m = {0};
  em_compiled *c = NULL;
  if (!em_linear_layer_init(&m.l1, 784, 128, true) || !em_linear_layer_init(&m.l2, 128, 10, true)) goto setup_failed;
  m.opt = em_sgd_new(4, ((em_tensor *[]){m.l1.weight, m.l1.bias, m.l2.weight, m.l2.bias}),
                     ((em_sgd_opts){0.05, 0.9, 0, 0, false}));
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(64, 784)), *y = em_randint(0, 10, EM_SHAPE(64));
  if (!m.opt || !x || !y) goto setup_failed;
  if (strcmp(mode, "eager")) c = em_compile(train_step, &(em_compile_options){.name = "mlp_step"});
  if (strcmp(mode, "eager") && !c) goto setup_failed;
  /* warm-up: eager steps, or the compiled step until it replays */
  int warm = !strcmp(mode, "compiled") ? 3 : !strcmp(mode, "eager") ? 2 : 1;
  for (int i = 0; i < warm; i++)
    if (!isfinite(step(&m, strcmp(mode, "compiled") ? NULL : c, x, y))) goto setup_failed;
  int64_t fallbacks0 = em_compiled_stats(c).inductor_fallbacks;

  int64_t before = use_malloc ? arm(n) : em_debug_alloc_count();
  if (!use_malloc) em_debug_fail_alloc(n);
  double loss = step(&m, c, x, y);
  int64_t after = use_malloc ? count() : em_debug_alloc_count();
  if (use_malloc) arm(0);
  else em_debug_fail_alloc(0);
  printf("allocs %lld\n", (long long)(after - before));
  if (em_compiled_stats(c).inductor_fallbacks > fallbacks0) printf("fallback op by op\n");

  int code = 0;
  const char *err = em_last_error();
  if (!isfinite(loss)) {
    if (!err || !*err) {
      printf("verdict: failed without an error message\n");
      return done(4);
    }
    printf("error: %s\n", err);
    code = 3;
  } else if (err) {
    printf("verdict: error \"%s\", yet the step returned a loss\n", err);
    return done(5);
  }
  em_clear_error();
  for (int i = 0; i < 3; i++)
    if (!isfinite(step(&m, c, x, y))) {
      printf("verdict: step %d after the failure failed: %s\n", i + 1, em_last_error() ? em_last_error() : "(no error)");
      return done(6);
    }
  em_compiled_free(c);
  em_optimizer_free(m.opt);
  em_thread_cleanup();
  if (em_debug_live_tensors() || em_debug_live_bytes()) {
    printf("verdict: %lld tensors, %lld bytes left alive\n", (long long)em_debug_live_tensors(),
           (long long)em_debug_live_bytes());
    return done(7);
  }
  printf("verdict: %s\n", code ? "contained" : "ok");
  fflush(stdout);
  return done(code);

setup_failed:
  fprintf(stderr, "alloc_fail_step: setup failed: %s\n", em_last_error() ? em_last_error() : "?");
  return done(8);
}
