/* tests/test_repro.c: when a compiled result is wrong (frontend/repro.c, tools/minify.c). With a
 * miscompile planted (EMBER_DEBUG_PLANT_BUG=add_to_sub turns the first add the inductor is
 * given into a sub): the accuracy checker fails the call naming the node and the user's line; a
 * repro directory is written that replays the failure with the bug and agrees without it; the
 * minifier shrinks a 20-node program to the few nodes around the bad one. A planted crash
 * (EMBER_DEBUG_PLANT_BUG=crash) in a child process writes its repro from the signal handler. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

static int add_line;
/* 20 nodes: a chain of pointwise ops with one add in the middle. */
static em_outputs chain20(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0], *y = in[1];
  em_tensor *h = em_mul_scalar(em_tanh(x), 0.5);
  h = em_exp(em_neg(em_abs(h)));
  h = em_mul(h, em_tanh(y));
  em_tensor *s = em_add(h, y); add_line = __LINE__;
  s = em_sqrt(em_add_scalar(em_abs(s), 1));
  s = em_mul_scalar(em_sin(s), 2);
  s = em_maximum(s, em_cos(x));
  return EM_OUTPUTS(em_sum(s, 1, (int64_t[]){-1}, false), em_relu(h));
}

static char *make_tmpdir(void) {
  char tmpl[] = "/tmp/ember-repro-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  return strdup(tmpl);
}

/* The single directory dir holds (the repro), or NULL. */
static char *only_entry(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  char *found = NULL;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') {
      cr_assert_null(found, "more than one repro in %s", dir);
      found = malloc(strlen(dir) + strlen(e->d_name) + 2);
      sprintf(found, "%s/%s", dir, e->d_name);
    }
  closedir(d);
  return found;
}

static void remove_tree(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

ETEST(repro, accuracy_checker_names_the_bad_node_and_writes_a_repro_the_minifier_shrinks) {
  char *root = make_tmpdir();
  setenv("EMBER_REPRO_DIR", root, 1);
  setenv("EMBER_DEBUG_PLANT_BUG", "add_to_sub", 1);
  em_manual_seed(2);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(3, 5)), *y = em_randn(EM_F32, EM_SHAPE(3, 5));
  em_compiled *c = em_compile(chain20, &(em_compile_options){.accuracy = true, .name = "chain"});
  em_outputs o = em_call(c, NULL, x, y);
  cr_assert_null(o.t[0], "the planted miscompile fails the call");
  const char *e = em_last_error();
  char want[160];
  snprintf(want, sizeof want, "= add(%%");
  cr_assert(e && strstr(e, "accuracy check failed in graph chain_0") && strstr(e, want), "%s", e ? e : "no error");
  snprintf(want, sizeof want, "made at %s:%d in chain20 (em_add)", __FILE__, add_line);
  cr_assert(strstr(e, want), "'%s' lacks '%s'", e, want);
  cr_assert(strstr(e, "repro in "), "%s", e);
  em_clear_error();
  em_compiled_free(c);

  /* the repro replays the failure with the planted bug, and agrees without it */
  char *dir = only_entry(root), report[2048];
  cr_assert_not_null(dir);
  cr_assert_eq(em_debug_check_repro(dir, report, sizeof report), 1, "%s", report);
  cr_assert(strstr(report, "= add("), "%s", report);
  unsetenv("EMBER_DEBUG_PLANT_BUG");
  cr_assert_eq(em_debug_check_repro(dir, report, sizeof report), 0, "%s", report);

  /* the minifier shrinks it to the nodes around the bad add */
  setenv("EMBER_DEBUG_PLANT_BUG", "add_to_sub", 1);
  const char *minify = getenv("EMBER_MINIFY");
  cr_assert_not_null(minify, "EMBER_MINIFY names build/ember_minify (meson sets it)");
  char cmd[1200], line[512] = "";
  snprintf(cmd, sizeof cmd, "'%s' '%s'", minify, dir);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  cr_assert_not_null(fgets(line, sizeof line, p));
  cr_assert_eq(pclose(p), 0, "%s", line);
  int before, after;
  cr_assert_eq(sscanf(line, "ember_minify: %d nodes -> %d nodes", &before, &after), 2, "%s", line);
  cr_assert_geq(before, 20, "%s", line);
  cr_assert_leq(after, 3, "%s", line);
  cr_log_info("%s", line);
  char mdir[600];
  snprintf(mdir, sizeof mdir, "%s/minified", dir);
  cr_assert_eq(em_debug_check_repro(mdir, report, sizeof report), 1, "the minified repro still fails: %s", report);
  cr_assert(strstr(report, "= add("), "%s", report);
  unsetenv("EMBER_DEBUG_PLANT_BUG");
  cr_assert_eq(em_debug_check_repro(mdir, report, sizeof report), 0, "%s", report);
  unsetenv("EMBER_REPRO_DIR");
  remove_tree(root);
  free(dir), free(root);
}

ETEST(repro, the_checker_passes_correct_code_and_costs_one_reference_run) {
  unsetenv("EMBER_DEBUG_PLANT_BUG");
  em_manual_seed(3);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(3, 5)), *y = em_randn(EM_F32, EM_SHAPE(3, 5));
  static const char *backends[] = {"eager", "aot_eager", "inductor"};
  for (int b = 0; b < 3; b++) {
    em_compiled *c = em_compile(chain20, &(em_compile_options){.backend = backends[b], .accuracy = true});
    for (int call = 0; call < 3; call++) {
      em_outputs o = em_call(c, NULL, x, y), e = chain20(NULL, (em_tensor *[]){x, y}, 2);
      cr_assert_not_null(o.t[0], "%s: %s", backends[b], em_last_error() ? em_last_error() : "");
      EXPECT_ALL(em_abs(em_sub(o.t[0], e.t[0])), EM_F32, SHAPE(3), 1e-5, 0);
    }
    em_compiled_free(c);
  }
}

ETEST(repro, a_crash_in_compiled_code_leaves_a_repro) {
  char *root = make_tmpdir();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("EMBER_REPRO_DIR", root, 1);
    setenv("EMBER_DEBUG_PLANT_BUG", "crash", 1);
    em_scope_begin();
    em_compiled *c = em_compile(chain20, NULL);
    em_call(c, NULL, em_ones(EM_F32, EM_SHAPE(2, 3)), em_ones(EM_F32, EM_SHAPE(2, 3)));
    _exit(0); /* not reached: the planted crash */
  }
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "the child crashed (status %d)", st);
  char *dir = only_entry(root), path[700];
  cr_assert_not_null(dir, "the handler left a repro");
  snprintf(path, sizeof path, "%s/options.txt", dir);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char opts[1024] = "";
  size_t k = fread(opts, 1, sizeof opts - 1, f);
  opts[k] = 0;
  fclose(f);
  cr_assert(strstr(opts, "backend: inductor") && strstr(opts, "failure: crash"), "%s", opts);
  char report[1024];
  cr_assert_eq(em_debug_check_repro(dir, report, sizeof report), 0, "without the planted crash it runs: %s", report);
  remove_tree(root);
  free(dir), free(root);
}

/* Issue 17, found by fuzz/fuzz_ir: graph.ir is untrusted text, and the parser checks only its
 * syntax. A graph whose declared types are not what its prims give (a slice declared f32[4,3]
 * that gives f32[4,1]) would have run with wrongly sized buffers; the replay refuses it. */
ETEST(repro, a_graph_that_does_not_verify_is_refused) {
  char *root = make_tmpdir(), path[700];
  snprintf(path, sizeof path, "%s/graph.ir", root);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("graph g(%0 : f32[4,6]) {\n  %1 : f32[4,3] = slice(%0, axes=[1], start=5, stop=6, step=2)\n  return %1\n}\n", f);
  fclose(f);
  snprintf(path, sizeof path, "%s/options.txt", root);
  f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("backend: inductor\n", f);
  fclose(f);
  char report[1024];
  cr_assert_neq(em_debug_check_repro(root, report, sizeof report), 0);
  cr_assert(strstr(report, "does not verify") && strstr(report, "f32[4,1]"), "%s", report);
  remove_tree(root);
  free(root);
}
