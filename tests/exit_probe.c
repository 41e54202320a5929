/* tests/exit_probe.c: a process that ends while eager fusion's background compiles run, for
 * test_eager_fusion's exit test (frontend/eager_fusion.c, "Exit"). It calls four composites on
 * new signatures three times each, so each starts its compile on a background thread, and
 * ends at once, the compiles still running (the disk kernel cache should be off or empty:
 * EMBER_CACHE=0). How it ends is argv[1]:
 *   return: returns from main;
 *   exit: calls exit(0);
 *   thread: a second thread, which has made a fusable call of its own, calls exit(0) while this
 *           one goes on calling fused composites;
 *   fork: forks; the child (none of the compile threads in it) calls the composites again and
 *         exits, the parent waits for it and returns its status.
 * Exit status 0, and no signal, is the test's expectation; 2 for a bad argument or a failed call. */
#include <ember.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static em_tensor *x, *w, *b;
static bool forked_child;

/* LeakSanitizer's own switch, read at exit: a forked child holds what the parent's compile
 * threads had allocated, with no thread left to reach it (what fork does to any thread). */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return forked_child; }

/* Three calls of each composite: the third starts its signature's compile. */
static bool start_compiles(void) {
  bool ok = true;
  for (int i = 0; i < 3; i++) {
    em_scope_begin();
    ok = ok && em_softmax(x, 1) && em_layer_norm(x, 1, w, b, 1e-5) && em_gelu(x, false) && em_log_softmax(x, 0);
    em_scope_end();
  }
  return ok;
}

static void *exit_soon(void *arg) {
  (void)arg;
  em_scope_begin();
  if (!em_sigmoid(x)) _exit(2);
  exit(0);
}

int main(int argc, char **argv) {
  const char *how = argc > 1 ? argv[1] : "";
  if (strcmp(how, "return") && strcmp(how, "exit") && strcmp(how, "thread") && strcmp(how, "fork")) {
    fprintf(stderr, "usage: exit_probe return|exit|thread|fork\n");
    return 2;
  }
  em_manual_seed(5);
  x = em_randn(EM_F32, EM_SHAPE(256, 1024));
  w = em_randn(EM_F32, EM_SHAPE(1024));
  b = em_randn(EM_F32, EM_SHAPE(1024));
  if (!start_compiles()) {
    fprintf(stderr, "exit_probe: %s\n", em_last_error() ? em_last_error() : "a call failed");
    return 2;
  }
  if (!strcmp(how, "exit")) exit(0);
  if (!strcmp(how, "fork")) {
    pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
      forked_child = true;
      exit(start_compiles() ? 0 : 2);
    }
    int st;
    if (waitpid(child, &st, 0) != child) return 2;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 3;
  }
  if (!strcmp(how, "thread")) {
    pthread_t t;
    if (pthread_create(&t, NULL, exit_soon, NULL)) return 2;
    for (;;) { /* ends in the other thread's exit */
      em_scope_begin();
      if (!em_softmax(x, 1) || !em_gelu(x, false)) return 2;
      em_scope_end();
    }
  }
  return 0;
}
