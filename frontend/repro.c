/* frontend/repro.c: when a compiled result is wrong. The accuracy checker, the repro directories
 * and the planted bugs that test both (after PyTorch's accuracy minifier and repro dumps, which
 * are fragile: these work on the graph the frontend already holds, not on a re-trace).
 *
 * Accuracy checker (EMBER_COMPILE_ACCURACY=1 or em_compile_options.accuracy): every compiled
 * graph run inside em_call is run first by the reference, the graph as traced interpreted on
 * the eager kernels (the RNG state restored, so random nodes draw what the compiled run
 * draws), and the outputs are compared: bit for bit on backend eager, else within 1e-5 of each
 * element plus 1e-5 of the output's largest magnitude, plus 1e-6 (1e-12 and 1e-13 in f64; the
 * generated code's math functions are 1 to 3.5 ULP and its sums run in another order). The
 * first difference is localized: the graph is cut after each node in turn, compiled by the
 * inductor and run, until a node's value differs from the reference's; the error names it, its
 * IR text and the user's line that made it. The call fails with that error.
 *
 * Repro directories (EMBER_REPRO_DIR=dir): on an accuracy failure, a graph the inductor could
 * not compile, or a crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) while a compiled graph
 * runs, dir/<fn>_<n>/ receives graph.ir (the traced graph, parseable by ir_parse), in<i>.npy
 * (its inputs), options.txt (backend, partitioner, remat, CPU, the failure), and repro.c, a
 * program that replays it through em_debug_check_repro. The crash handler writes only what was
 * prepared before the graph ran: the directory is written before every compiled run while the
 * option is on (costly: meant for chasing a crash), and the handler appends the signal to
 * options.txt with write(2) and re-raises.
 *
 * EMBER_DEBUG_PLANT_BUG=add_to_sub|crash (tests only) corrupts what the inductor is given: the
 * first add of each graph becomes a sub, or running a graph segfaults. */
#define _POSIX_C_SOURCE 200809L /* strdup, mkdtemp, sigaction */
#include "frontend.h"
#include "../inductor/inductor.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- planted bugs ---- */

int fe_planted_bug(void) {
  const char *e = getenv("EMBER_DEBUG_PLANT_BUG");
  if (!e || !*e) return FE_PLANT_NONE;
  if (!strcmp(e, "add_to_sub")) return FE_PLANT_ADD_TO_SUB;
  if (!strcmp(e, "crash")) return FE_PLANT_CRASH;
  return FE_PLANT_NONE;
}

void fe_plant(ir_graph *g) {
  if (fe_planted_bug() != FE_PLANT_ADD_TO_SUB) return;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == EM_PRIM_ADD) {
      g->nodes[i].op = EM_PRIM_SUB;
      return;
    }
}

/* ---- comparing ---- */

/* The first element of got outside the tolerance around want (see the file comment), or -1. */
static int64_t first_difference(em_tensor *got, em_tensor *want, bool exact, double *gv, double *wv) {
  int64_t n = em_numel(want);
  if (em_numel(got) != n) return 0;
  double *g = malloc(sizeof(double) * (size_t)(n + 1)), *w = malloc(sizeof(double) * (size_t)(n + 1));
  int64_t bad = -1;
  if (!g || !w || !em_to_buffer(got, EM_F64, g, sizeof(double) * (size_t)n) ||
      !em_to_buffer(want, EM_F64, w, sizeof(double) * (size_t)n)) {
    free(g), free(w);
    em_clear_error();
    return -1; /* a check, not a result: out of memory skips it */
  }
  bool f64 = em_dtype_of(want) == EM_F64;
  double scale = 0, rtol = f64 ? 1e-12 : 1e-5, atol = f64 ? 1e-13 : 1e-6;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(w[i]) && fabs(w[i]) > scale) scale = fabs(w[i]);
  for (int64_t i = 0; i < n && bad < 0; i++) {
    if ((isnan(g[i]) && isnan(w[i])) || g[i] == w[i]) continue;
    if (!exact && fabs(g[i] - w[i]) <= atol + rtol * (fabs(w[i]) + scale)) continue;
    bad = i, *gv = g[i], *wv = w[i];
  }
  free(g), free(w);
  return bad;
}

bool fe_reference(const ir_graph *traced, em_tensor *const *in, int n_in, em_tensor **ref, em_site site) {
  uint64_t seed, offset;
  em_rng_get_state(&seed, &offset);
  rt_trace_suspend();
  bool prev = em_set_grad_enabled(false);
  bool ok = rt_interpret(traced, in, n_in, ref, &(rt_interp_opts){.fresh_rng = true}, site);
  em_set_grad_enabled(prev);
  rt_trace_resume();
  em_rng_set_state(seed, offset);
  return ok;
}

/* Localizes a difference: the first node whose value, computed by the inductor on the graph cut
 * after it, differs from the reference interpreter's. Returns its index, or -1. */
static int localize(const ir_graph *traced, em_tensor *const *in, int n_in) {
  int found = -1;
  for (int i = 0; i < traced->n_nodes && i < 400 && found < 0; i++) {
    const ir_node *n = &traced->nodes[i];
    if (prim_get(n->op)->flags & (P_VIEW | P_RANDOM)) continue;
    ir_graph *cut = ir_graph_clone(traced);
    if (!cut) break;
    cut->n_outputs = 0;
    bool ok = ir_add_output(cut, n->out) && ir_pass_dce(cut) >= 0;
    em_tensor *want = NULL, *got = NULL;
    ok = ok && fe_reference(cut, in, n_in, &want, (em_site){0});
    fe_plant(cut);
    char err[256];
    ind_program *p = ok ? ind_compile(cut, in, NULL, err, sizeof err) : NULL;
    rt_trace_suspend();
    bool prev = em_set_grad_enabled(false);
    if (p && ind_run(p, in, n_in, &got, NULL, (em_site){0})) {
      double gv, wv;
      if (first_difference(got, want, false, &gv, &wv) >= 0) found = i;
    }
    em_set_grad_enabled(prev);
    rt_trace_resume();
    em_release(want), em_release(got);
    ind_free(p);
    ir_graph_free(cut);
    em_clear_error();
  }
  return found;
}

static char *check_accuracy(const char *graph_name, const ir_graph *traced, bool exact, bool inductor, em_tensor *const *in,
                             int n_in, em_tensor *const *got, em_tensor *const *ref);

char *fe_check_accuracy(const char *graph_name, const ir_graph *traced, bool exact, bool inductor, em_tensor *const *in,
                        int n_in, em_tensor *const *got, em_tensor *const *ref) {
  rt_trace_suspend(); /* the frontend checks graphs while its trace is open: reading data must not break it */
  char *r = check_accuracy(graph_name, traced, exact, inductor, in, n_in, got, ref);
  rt_trace_resume();
  return r;
}

static char *check_accuracy(const char *graph_name, const ir_graph *traced, bool exact, bool inductor, em_tensor *const *in,
                             int n_in, em_tensor *const *got, em_tensor *const *ref) {
  for (int k = 0; k < traced->n_outputs; k++) {
    double gv = 0, wv = 0;
    int64_t e = first_difference(got[k], ref[k], exact, &gv, &wv);
    if (e < 0) continue;
    char msg[1024];
    int len = snprintf(msg, sizeof msg, "accuracy check failed in graph %s: output %d element %lld is %.9g, the reference (the "
                       "traced graph on the eager kernels) gives %.9g", graph_name, k, (long long)e, gv, wv);
    int at = inductor ? localize(traced, in, n_in) : -1;
    if (at >= 0) {
      const ir_node *n = &traced->nodes[at];
      char *text = ir_print(traced, false), *line = NULL;
      char want[32];
      snprintf(want, sizeof want, "%%%d :", n->out);
      if (text && (line = strstr(text, want))) {
        char *end = strchr(line, '\n');
        if (end) *end = 0;
      }
      snprintf(msg + len, sizeof msg - (size_t)len, "; the first node whose value differs: %s, made at %s:%d in %s (%s)",
               line ? line : n->opname, n->site.file ? n->site.file : "?", n->site.line, n->site.func ? n->site.func : "?",
               n->opname);
      free(text);
    }
    return strdup(msg);
  }
  return NULL;
}

/* ---- repro directories ---- */

static char repro_dir[4096];       /* the directory prepared for the graph running now */
static char repro_options[4096 + 32];
static volatile sig_atomic_t handler_on;

static void on_crash(int sig) {
  if (repro_dir[0]) {
    int fd = open(repro_options, O_WRONLY | O_APPEND);
    if (fd >= 0) {
      static const char msg[] = "failure: crash (a signal) while the compiled graph ran\n";
      ssize_t w = write(fd, msg, sizeof msg - 1);
      (void)w;
      close(fd);
    }
    static const char say[] = "[ember] crash in compiled code: repro written to ";
    ssize_t w = write(2, say, sizeof say - 1);
    w = write(2, repro_dir, strlen(repro_dir));
    w = write(2, "\n", 1);
    (void)w;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void install_handler(void) {
  if (handler_on) return;
  handler_on = 1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}

const char *fe_repro_root(void) {
  const char *d = getenv("EMBER_REPRO_DIR");
  return d && *d ? d : NULL;
}

static bool write_text(const char *dir, const char *name, const char *text) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) return false;
  bool ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok;
}

static const char repro_c[] =
    "/* repro.c: replays this directory's graph through the backend it failed on and compares it\n"
    " * with the reference (the graph on the eager kernels). Build and run from this directory:\n"
    " *   cc repro.c -I<ember>/include -L<ember>/build -lember -Wl,-rpath,<ember>/build -o repro && ./repro\n"
    " * Shrink it with: <ember>/build/ember_minify . */\n"
    "#include <ember.h>\n#include <stdio.h>\n\n"
    "int main(int argc, char **argv) {\n"
    "  char report[2048];\n"
    "  int r = em_debug_check_repro(argc > 1 ? argv[1] : \".\", report, sizeof report);\n"
    "  printf(\"%s\\n\", report);\n"
    "  return r;\n"
    "}\n";

char *fe_write_repro(const char *name, const ir_graph *traced, em_tensor *const *in, int n_in, const char *backend,
                     const char *partitioner, const char *failure, bool for_crash) {
  const char *root = fe_repro_root();
  if (!root) return NULL;
  mkdir(root, 0777);
  static int serial;
  char dir[4096];
  for (int tries = 0; tries < 1000; tries++) {
    snprintf(dir, sizeof dir, "%s/%s_%d_%d", root, name, (int)getpid(), __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED));
    if (!mkdir(dir, 0777)) break;
    if (errno != EEXIST) return NULL;
  }
  char *text = ir_print(traced, true);
  bool ok = text && write_text(dir, "graph.ir", text);
  free(text);
  rt_trace_suspend();
  for (int i = 0; ok && i < n_in; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/in%d.npy", dir, i);
    bool dense = em_is_contiguous(in[i]); /* .npy holds row-major data: a caller-owned copy otherwise */
    em_tensor *c = dense ? in[i] : rt_dispatch("em_call", EM_PRIM_CLONE, &in[i], 1, NULL, (em_site){0});
    ok = c && em_save_npy_at(path, c, (em_site){0});
    if (!dense) em_release(c);
  }
  rt_trace_resume();
  char opts[1024];
  const char *remat = getenv("EMBER_INDUCTOR_REMAT");
  snprintf(opts, sizeof opts, "backend: %s\npartitioner: %s\nremat: %s\ninputs: %d\ncpu: %s\n%s%s%s", backend,
           partitioner ? partitioner : "default", remat && !strcmp(remat, "0") ? "off" : "on", n_in,
           ind_cpu_name() ? ind_cpu_name() : "?", failure ? "failure: " : "", failure ? failure : "", failure ? "\n" : "");
  ok = ok && write_text(dir, "options.txt", opts) && write_text(dir, "repro.c", repro_c);
  em_clear_error();
  if (!ok) return NULL;
  if (for_crash) {
    install_handler();
    snprintf(repro_dir, sizeof repro_dir, "%s", dir);
    snprintf(repro_options, sizeof repro_options, "%s/options.txt", dir);
  } else {
    fprintf(stderr, "[ember] %s: repro written to %s\n", name, dir);
  }
  return strdup(dir);
}

void fe_repro_done(const char *dir) {
  if (!dir) return;
  repro_dir[0] = 0; /* the graph ran: nothing to report */
  char path[4200];
  const char *files[] = {"graph.ir", "options.txt", "repro.c"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) snprintf(path, sizeof path, "%s/%s", dir, files[i]), unlink(path);
  for (int i = 0; i < 256; i++) {
    snprintf(path, sizeof path, "%s/in%d.npy", dir, i);
    if (unlink(path)) break;
  }
  rmdir(dir);
}

/* ---- replaying a repro ---- */

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *s = malloc(cap);
  for (size_t k; s && (k = fread(s + n, 1, cap - n - 1, f)) > 0;) {
    n += k;
    if (n + 1 == cap) {
      char *t = realloc(s, cap *= 2);
      if (!t) free(s);
      s = t;
    }
  }
  fclose(f);
  if (s) s[n] = 0;
  return s;
}

static const char *option(const char *opts, const char *key, char *buf, size_t cap) {
  const char *p = strstr(opts, key);
  if (!p) return NULL;
  p += strlen(key);
  size_t k = 0;
  while (*p && *p != '\n' && k + 1 < cap) buf[k++] = *p++;
  buf[k] = 0;
  return buf;
}

int fe_check_graph(const ir_graph *g, em_tensor *const *in, int n_in, const char *backend, char *report, size_t cap) {
  em_tensor *small_r[16], *small_o[16];
  em_tensor **ref = g->n_outputs <= 16 ? small_r : calloc((size_t)g->n_outputs, sizeof(em_tensor *));
  em_tensor **got = g->n_outputs <= 16 ? small_o : calloc((size_t)g->n_outputs, sizeof(em_tensor *));
  if (!ref || !got) return snprintf(report, cap, "out of memory"), -1;
  int r = -1;
  char err[512];
  if (!fe_reference(g, in, n_in, ref, (em_site){0})) {
    snprintf(report, cap, "the reference failed: %s", em_last_error() ? em_last_error() : "?");
    goto out;
  }
  ir_graph *h = ir_graph_clone(g);
  if (!h || ir_pass_dce(h) < 0) {
    ir_graph_free(h);
    snprintf(report, cap, "out of memory");
    goto out;
  }
  bool exact = !strcmp(backend, "eager"), inductor = !strcmp(backend, "inductor");
  if (strcmp(backend, "eager")) ir_optimize(h, NULL);
  bool ok;
  if (inductor) {
    fe_plant(h);
    ind_program *p = ind_compile(h, in, NULL, err, sizeof err);
    if (!p) {
      snprintf(report, cap, "the inductor could not compile the graph: %s", err);
      ir_graph_free(h);
      r = 1;
      goto out;
    }
    if (fe_planted_bug() == FE_PLANT_CRASH) raise(SIGSEGV);
    ok = ind_run(p, in, n_in, got, NULL, (em_site){0});
    ind_free(p);
  } else {
    ok = rt_interpret(h, in, n_in, got, &(rt_interp_opts){.fresh_rng = true}, (em_site){0});
  }
  ir_graph_free(h);
  if (!ok) {
    snprintf(report, cap, "the %s backend failed: %s", backend, em_last_error() ? em_last_error() : "?");
    r = 1;
    goto out;
  }
  char *diff = fe_check_accuracy("repro", g, exact, inductor, in, n_in, got, ref);
  r = diff != NULL;
  snprintf(report, cap, "%s", diff ? diff : "the backend agrees with the reference");
  free(diff);
out:
  for (int k = 0; k < g->n_outputs; k++) em_release(ref[k]), em_release(got[k]);
  if (ref != small_r) free(ref);
  if (got != small_o) free(got);
  em_clear_error();
  return r;
}

int em_debug_check_repro(const char *dir, char *report, size_t cap) {
  char path[4200], backend[64];
  snprintf(path, sizeof path, "%s/options.txt", dir ? dir : ".");
  char *opts = read_all(path);
  snprintf(path, sizeof path, "%s/graph.ir", dir ? dir : ".");
  char *text = read_all(path);
  char err[512];
  ir_graph *g = text ? ir_parse(text, err, sizeof err) : NULL;
  /* graph.ir is untrusted text: a graph whose declared types are not what its prims give would
   * size its buffers wrongly when run (fuzz/fuzz_ir found a slice declared f32[4,3] that gives
   * f32[4,1]; the parser checks syntax, the verifier meaning) */
  char why[400];
  if (g && !ir_verify(g, 0, why, sizeof why)) {
    snprintf(err, sizeof err, "the graph does not verify: %s", why);
    ir_graph_free(g);
    g = NULL;
  }
  int r = -1;
  if (!opts || !text) {
    snprintf(report, cap, "%s: no graph.ir or options.txt", dir ? dir : ".");
  } else if (!g) {
    snprintf(report, cap, "%s/graph.ir: %s", dir, err);
  } else if (!option(opts, "backend: ", backend, sizeof backend)) {
    snprintf(report, cap, "%s/options.txt names no backend", dir);
  } else {
    em_scope_begin();
    em_tensor *in[256];
    bool ok = g->n_inputs <= 256;
    for (int i = 0; ok && i < g->n_inputs; i++) {
      snprintf(path, sizeof path, "%s/in%d.npy", dir, i);
      ok = (in[i] = em_load_npy_at(path, (em_site){__FILE__, __LINE__, __func__})) != NULL;
    }
    if (!ok) snprintf(report, cap, "the inputs: %s", em_last_error() ? em_last_error() : "more than 256");
    else r = fe_check_graph(g, in, g->n_inputs, backend, report, cap);
    em_scope_end();
    em_clear_error();
  }
  ir_graph_free(g);
  free(opts), free(text);
  return r;
}
