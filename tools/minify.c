/* tools/minify.c: shrinks a repro directory (see EMBER_REPRO_DIR in ember.h) by delta debugging.
 *
 *   build/ember_minify <repro_dir>
 *
 * The failure is what em_debug_check_repro sees: the backend differs from the reference, fails,
 * or crashes. A candidate keeps a subset of the graph's nodes; every value a kept node reads
 * from a dropped one becomes a new graph input, fed with the value the reference computed for
 * it on the original inputs, so the kept nodes see exactly the data they saw before; every kept
 * node that no kept node reads is an output, so a failure need not travel to the old outputs. ddmin (Zeller and Hildebrandt 2002) removes chunks of nodes while
 * the same kind of failure persists, halving the chunks when none can go; outputs are first cut
 * to the one that fails. Crashes are tested in a child process each (and the whole tool runs
 * with one OpenMP thread, so forking is safe). The smallest failing graph goes to
 * <repro_dir>/minified/ as a repro directory of its own; the summary line reads
 *   ember_minify: 23 nodes -> 2 nodes (failure: differs), in dir/minified */
#define _POSIX_C_SOURCE 200809L
#include "../frontend/frontend.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum { AGREES = 0, DIFFERS = 1, CRASHES = 2, BROKEN = 3 };
static const char *kind_name[] = {"agrees", "differs", "crashes", "no reference"};

static const ir_graph *orig;
static em_tensor **orig_in;  /* the repro's inputs */
static em_tensor **value_of; /* [orig values] the reference's value of each node result */
static char backend[64];
static int tests;

/* The graph of the nodes in keep (by node index) and the outputs in keep_out, with the inputs it
 * needs; *inputs receives them (borrowed). NULL when it would have no output. */
static ir_graph *candidate(const bool *keep, const bool *keep_out, em_tensor **inputs, int *n_inputs) {
  int nv = orig->n_values;
  int *map = malloc(sizeof(int) * (size_t)(nv + 1));
  ir_graph *g = ir_graph_new(orig->name);
  if (!map || !g) {
    free(map), ir_graph_free(g);
    return NULL;
  }
  for (int v = 0; v < nv; v++) map[v] = -1;
  int n = 0;
  /* the original inputs some kept node reads, in order, then values from dropped nodes */
  bool *needed = calloc((size_t)nv + 1, 1);
  for (int i = 0; i < orig->n_nodes; i++)
    if (keep[i])
      for (int k = 0; k < orig->nodes[i].n_in; k++) needed[ir_operands(orig, &orig->nodes[i])[k]] = true;
  for (int k = 0; k < orig->n_outputs; k++)
    if (keep_out[k] && orig->values[orig->outputs[k]].def < 0) needed[orig->outputs[k]] = true;
  for (int i = 0; i < orig->n_inputs; i++) {
    int v = orig->inputs[i];
    if (!needed[v]) continue;
    map[v] = ir_add_input(g, &orig->values[v].type);
    inputs[n++] = orig_in[i];
  }
  for (int i = 0; i < orig->n_nodes; i++) {
    if (!keep[i]) continue;
    const ir_node *nd = &orig->nodes[i];
    int ops[64];
    for (int k = 0; k < nd->n_in && k < 64; k++) {
      int u = ir_operands(orig, nd)[k];
      if (map[u] < 0) { /* made by a dropped node: an input holding the reference's value */
        map[u] = ir_add_input(g, &orig->values[u].type);
        inputs[n++] = value_of[u];
      }
      ops[k] = map[u];
    }
    map[nd->out] = ir_add_node(g, nd->op, ops, nd->n_in, &nd->attrs, &orig->values[nd->out].type, nd->site, nd->opname);
  }
  /* outputs: the kept graph outputs, and every kept node no kept node reads (a dropped
   * consumer would otherwise hide the failure of what it read) */
  int n_out = 0;
  bool *read = calloc((size_t)nv + 1, 1);
  for (int i = 0; read && i < orig->n_nodes; i++)
    if (keep[i])
      for (int k = 0; k < orig->nodes[i].n_in; k++) read[ir_operands(orig, &orig->nodes[i])[k]] = true;
  for (int k = 0; k < orig->n_outputs; k++)
    if (keep_out[k] && map[orig->outputs[k]] >= 0) ir_add_output(g, map[orig->outputs[k]]), n_out++;
  for (int i = 0; read && i < orig->n_nodes; i++) {
    int v = orig->nodes[i].out;
    bool is_out = false;
    for (int k = 0; k < orig->n_outputs; k++) is_out |= keep_out[k] && orig->outputs[k] == v;
    if (keep[i] && !read[v] && !is_out) ir_add_output(g, map[v]), n_out++;
  }
  free(read);
  free(map), free(needed);
  *n_inputs = n;
  if (!n_out || g->oom) {
    ir_graph_free(g);
    return NULL;
  }
  return g;
}

/* The failure kind of g on in: checked in a child process when crashes are the failure, since
 * the check may crash; in this process otherwise. */
static int failure_of(const ir_graph *g, em_tensor *const *in, int n_in, bool in_child) {
  tests++;
  char report[1024];
  if (!in_child) {
    int r = fe_check_graph(g, in, n_in, backend, report, sizeof report);
    return r < 0 ? BROKEN : r ? DIFFERS : AGREES;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int r = fe_check_graph(g, in, n_in, backend, report, sizeof report);
    _exit(r < 0 ? BROKEN : r ? DIFFERS : AGREES);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return BROKEN;
  return WIFSIGNALED(st) ? CRASHES : WEXITSTATUS(st);
}

static int test(const bool *keep, const bool *keep_out, bool in_child) {
  em_tensor *in[1024];
  int n_in = 0;
  if (orig->n_values > 1000) return BROKEN;
  ir_graph *g = candidate(keep, keep_out, in, &n_in);
  if (!g) return BROKEN;
  char err[256];
  int r = ir_verify(g, 0, err, sizeof err) ? failure_of(g, in, n_in, in_child) : BROKEN;
  ir_graph_free(g);
  return r;
}

static int count(const bool *b, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) k += b[i];
  return k;
}

/* ddmin over the kept nodes: drop chunks while the failure stays the same. */
static void ddmin(bool *keep, const bool *keep_out, int want, bool in_child) {
  int nn = orig->n_nodes;
  int chunks = 2;
  bool *trial = malloc((size_t)nn + 1);
  int *idx = malloc(sizeof(int) * (size_t)(nn + 1));
  while (trial && idx) {
    int m = 0;
    for (int i = 0; i < nn; i++)
      if (keep[i]) idx[m++] = i;
    if (m <= 1) break;
    if (chunks > m) chunks = m;
    bool progress = false;
    for (int c = 0; c < chunks && !progress; c++) {
      int lo = (int)((int64_t)m * c / chunks), hi = (int)((int64_t)m * (c + 1) / chunks);
      memcpy(trial, keep, (size_t)nn);
      for (int k = lo; k < hi; k++) trial[idx[k]] = false;
      if (test(trial, keep_out, in_child) == want) {
        memcpy(keep, trial, (size_t)nn);
        progress = true;
        chunks = chunks > 2 ? chunks - 1 : 2;
      }
    }
    if (!progress) {
      if (chunks >= m) break;
      chunks = chunks * 2 < m ? chunks * 2 : m;
    }
  }
  free(trial), free(idx);
}

static bool write_dir(const char *dir, const bool *keep, const bool *keep_out, const char *failure) {
  if (strlen(dir) > 4000) return false;
  em_tensor *in[1024];
  int n_in = 0;
  ir_graph *g = candidate(keep, keep_out, in, &n_in);
  if (!g) return false;
  mkdir(dir, 0777);
  char path[8192];
  snprintf(path, sizeof path, "%s/graph.ir", dir);
  char *text = ir_print(g, true);
  FILE *f = fopen(path, "w");
  bool ok = f && text && fputs(text, f) >= 0;
  if (f) ok = fclose(f) == 0 && ok;
  free(text);
  for (int i = 0; ok && i < n_in; i++) {
    snprintf(path, sizeof path, "%s/in%d.npy", dir, i);
    em_tensor *c = em_contiguous(in[i]);
    ok = c && em_save_npy(path, c);
  }
  snprintf(path, sizeof path, "%s/options.txt", dir);
  f = ok ? fopen(path, "w") : NULL;
  ok = f && fprintf(f, "backend: %s\ninputs: %d\nfailure: %s (minified from %d nodes)\n", backend, n_in, failure,
                    orig->n_nodes) > 0;
  if (f) ok = fclose(f) == 0 && ok;
  ir_graph_free(g);
  return ok;
}

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) free(s), s = NULL;
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ember_minify <repro_dir>\n");
    return 2;
  }
  const char *omp = getenv("OMP_NUM_THREADS");
  if (!omp || strcmp(omp, "1")) { /* one OpenMP thread, set before libgomp starts: forking is then safe */
    setenv("OMP_NUM_THREADS", "1", 1);
    execvp(argv[0], argv);
  }
  const char *dir = argv[1];
  char path[4200], err[512];
  snprintf(path, sizeof path, "%s/options.txt", dir);
  char *opts = read_all(path);
  snprintf(path, sizeof path, "%s/graph.ir", dir);
  char *text = read_all(path);
  ir_graph *g = text ? ir_parse(text, err, sizeof err) : NULL;
  char why[400];
  if (g && !ir_verify(g, 0, why, sizeof why)) { /* untrusted text: see em_debug_check_repro */
    snprintf(err, sizeof err, "the graph does not verify: %s", why);
    ir_graph_free(g);
    g = NULL;
  }
  const char *b = opts ? strstr(opts, "backend: ") : NULL;
  if (!g || !b) {
    fprintf(stderr, "ember_minify: %s: %s\n", dir, !text || !opts ? "no graph.ir or options.txt" : !g ? err : "no backend in options.txt");
    return 2;
  }
  sscanf(b + 9, "%63s", backend);
  orig = g;
  em_scope_begin();
  orig_in = calloc((size_t)g->n_inputs + 1, sizeof(em_tensor *));
  value_of = calloc((size_t)g->n_values + 1, sizeof(em_tensor *));
  for (int i = 0; i < g->n_inputs; i++) {
    snprintf(path, sizeof path, "%s/in%d.npy", dir, i);
    if (!(orig_in[i] = em_load_npy(path))) {
      fprintf(stderr, "ember_minify: %s\n", em_last_error());
      return 2;
    }
    value_of[g->inputs[i]] = orig_in[i];
  }
  /* the reference's value of every node result, to feed the nodes a candidate keeps */
  ir_graph *all = ir_graph_clone(g);
  all->n_outputs = 0;
  for (int i = 0; i < all->n_nodes; i++) ir_add_output(all, all->nodes[i].out);
  em_tensor **vals = calloc((size_t)all->n_outputs + 1, sizeof(em_tensor *));
  if (!fe_reference(all, orig_in, g->n_inputs, vals, (em_site){__FILE__, __LINE__, __func__})) {
    fprintf(stderr, "ember_minify: the reference fails on this graph: %s\n", em_last_error());
    return 2;
  }
  for (int i = 0; i < all->n_nodes; i++) value_of[g->nodes[i].out] = rt_scope_add(vals[i], "ember_minify", (em_site){0});
  bool *keep = malloc((size_t)g->n_nodes + 1), *keep_out = malloc((size_t)g->n_outputs + 1);
  for (int i = 0; i < g->n_nodes; i++) keep[i] = true;
  for (int k = 0; k < g->n_outputs; k++) keep_out[k] = true;
  int want = test(keep, keep_out, true);
  bool in_child = want == CRASHES;
  if (want == AGREES || want == BROKEN) {
    printf("ember_minify: %s: the backend %s (nothing to minify)\n", dir, kind_name[want]);
    em_scope_end();
    em_thread_cleanup();
    free(keep), free(keep_out), free(vals), free(orig_in), free(value_of), free(opts), free(text);
    ir_graph_free(all), ir_graph_free(g);
    return 1;
  }
  for (int k = 0; k < g->n_outputs && g->n_outputs > 1; k++) { /* one failing output is enough */
    bool *only = calloc((size_t)g->n_outputs + 1, 1);
    only[k] = true;
    if (test(keep, only, in_child) == want) {
      memcpy(keep_out, only, (size_t)g->n_outputs);
      free(only);
      break;
    }
    free(only);
  }
  ddmin(keep, keep_out, want, in_child);
  snprintf(path, sizeof path, "%s/minified", dir);
  if (!write_dir(path, keep, keep_out, kind_name[want])) {
    fprintf(stderr, "ember_minify: could not write %s\n", path);
    return 2;
  }
  printf("ember_minify: %d nodes -> %d nodes (failure: %s; %d tests), in %s\n", g->n_nodes, count(keep, g->n_nodes),
         kind_name[want], tests, path);
  em_scope_end();
  em_thread_cleanup();
  free(keep), free(keep_out), free(vals), free(orig_in), free(value_of), free(opts), free(text);
  ir_graph_free(all), ir_graph_free(g);
  return 0;
}
