/* inductor/cudagraph.c: mode "reduce-overhead": a CUDA program's calls replayed as one CUDA
 * graph, as torch.compile's CUDA graph trees do.
 *
 * The first call runs the program as usual (it loads every kernel and warms cuBLAS up). The
 * second is captured (runtime/cuda.c: cu_capture_begin): the program's launches, GEMMs and copies
 * are recorded into a graph, not run, with every device allocation they make coming from a
 * memory pool of the graph's own, so the addresses the graph bakes in stay its own: the arena,
 * the intermediates of eager steps, the outputs. The graph is then launched for that call and
 * every later one: one launch instead of one per kernel, the host's per-op work gone.
 *
 * What the graph reads. An input whose address was the same at the first two calls (parameters,
 * optimizer state: they are updated in place) is read where it is; the graph keeps a reference to
 * it so its memory cannot be reused while the graph may read it, and a later call that passes a
 * tensor at another address makes that input copied from then on and the graph captured again.
 * Other inputs (a new batch each call, CPU scalars such as a learning rate) are copied before
 * each launch into buffers of their own, of the same layout, that the graph reads.
 *
 * What the caller gets. The graph writes the same output buffers every launch, so each call
 * returns copies of them: a tensor a caller keeps is never overwritten by a later call (PyTorch
 * instead invalidates the previous call's outputs); an output that is a view of an input (AOT's
 * forward returns the inputs its backward saves) is the same view of this call's input. Index
 * bounds checks are read after each launch, so a bad index is reported as in eager mode (after
 * the whole graph ran).
 *
 * When capture fails (an op that must wait for the device, such as an integer remainder's
 * divide-by-zero check, or no graph API in the driver), the program runs without a graph from
 * then on, and says why once on stderr. Random ops never reach here (such graphs run with the
 * interpreter). */
#include "internal.h"
#include "../runtime/cuda.h"

#include <stdio.h>

struct ind_cgraph {
  int64_t calls;
  int n_in, n_out;
  uint64_t *first;   /* [n_in] each input's address at the first call */
  bool *copied;      /* [n_in] copied into an input buffer of the graph before each launch */
  em_tensor **in;    /* [n_in] what the graph reads: the input (retained) or the buffer it is copied into */
  em_tensor **out;   /* [n_out] what the graph writes */
  cu_allocator *pool;
  void *graph, *exec;
  cu_check *checks;
  int n_checks, captures;
  bool failed;
};

static _Thread_local int64_t replays;
int64_t ind_cuda_graph_replays(void) { return replays; }

static uint64_t address(const em_tensor *x) { return (uint64_t)(uintptr_t)rt_data((em_tensor *)x); }

/* Elements from x's first to its last (strides are not negative). */
static int64_t extent(const em_tensor *x) {
  if (x->numel == 0) return 0;
  int64_t e = 1;
  for (int d = 0; d < x->ndim; d++) e += (x->sizes[d] - 1) * x->strides[d];
  return e;
}

/* Drops what the capture made (graph, outputs, checks, pool) and the inputs it read. */
static void drop(ind_cgraph *cgr) {
  cu_graph_free(cgr->graph, cgr->exec);
  cgr->graph = cgr->exec = NULL;
  for (int o = 0; o < cgr->n_out; o++) em_release(cgr->out[o]), cgr->out[o] = NULL;
  for (int i = 0; i < cgr->n_checks; i++) cu_release(cgr->checks[i].word->owner, cgr->checks[i].word);
  free(cgr->checks), cgr->checks = NULL, cgr->n_checks = 0;
  if (cgr->pool && cu_allocator_free(cgr->pool))
    fprintf(stderr, "[ember] reduce-overhead: a graph's memory pool still had allocated blocks\n");
  cgr->pool = NULL;
  for (int i = 0; i < cgr->n_in; i++) em_release(cgr->in[i]), cgr->in[i] = NULL;
}

void ind_cgraph_free(ind_cgraph *cgr) {
  if (!cgr) return;
  drop(cgr);
  free(cgr->first), free(cgr->copied), free(cgr->in), free(cgr->out);
  free(cgr);
}

/* Copies input x into the input buffer the graph reads (same layout). */
static bool copy_in(em_tensor *ph, em_tensor *x, em_site site) {
  size_t bytes = (size_t)extent(x) * em_dtype_size(x->dtype);
  if (!bytes) return true;
  if (x->storage->device != EM_CUDA) return cu_copy_to_device(address(ph), rt_data(x), bytes, "em_call", site);
  cu_enter();
  int r = cu_drv()->memcpy_dtod(address(ph), address(x), bytes, cu_current_stream());
  if (r) return rt_error(site, "em_call", "copying an input for the CUDA graph: %s", cu_drv()->error_string(r)), false;
  return true;
}

/* A copy of output s with its layout (sizes, strides: what the default mode returns, so later
 * graphs see the same layouts). A CPU output is a constant the capture computed on the host. */
static em_tensor *copy_out(em_tensor *s, em_site site) {
  int64_t n = extent(s) ? extent(s) : 1;
  size_t bytes = (size_t)extent(s) * em_dtype_size(s->dtype);
  em_tensor *base = rt_new_device(s->dtype, 1, &n, s->storage->device, "em_call", site);
  em_tensor *t = base ? rt_new_view(base, s->ndim, s->sizes, s->strides, 0, "em_call", site) : NULL;
  em_release(base);
  if (!t || !bytes) return t;
  if (s->storage->device != EM_CUDA) return memcpy(rt_data(t), rt_data(s), bytes), t;
  int r = cu_drv()->memcpy_dtod(address(t), address(s), bytes, cu_current_stream());
  if (r) em_release(t), t = rt_error(site, "em_call", "copying an output of the CUDA graph: %s", cu_drv()->error_string(r));
  return t;
}

/* Captures p's run over the inputs into cgr's graph. false with the reason in why. */
static bool capture(const ind_program *p, ind_cgraph *cgr, em_tensor *const *in, em_site site, char *why, size_t cap) {
  bool ok = true;
  for (int i = 0; ok && i < cgr->n_in; i++) {
    em_tensor *x = in[i];
    cgr->copied[i] = cgr->copied[i] || x->storage->device != EM_CUDA || address(x) != cgr->first[i];
    if (!cgr->copied[i]) {
      cgr->in[i] = em_retain(x);
      continue;
    }
    int64_t n = extent(x) ? extent(x) : 1;
    em_tensor *base = rt_new_device(x->dtype, 1, &n, EM_CUDA, "em_call", site);
    cgr->in[i] = base ? rt_new_view(base, x->ndim, x->sizes, x->strides, 0, "em_call", site) : NULL;
    em_release(base);
    ok = cgr->in[i] && copy_in(cgr->in[i], x, site);
  }
  if (ok && !(cgr->pool = cu_pool_new())) ok = (snprintf(why, cap, "out of memory for the graph's pool"), false);
  if (ok && !cu_capture_begin(cgr->pool, why, cap)) ok = false;
  else if (ok) {
    bool ran = ind_run_steps(p, cgr->in, cgr->n_in, cgr->out, NULL, NULL, site);
    char ended_why[256] = "";
    bool ended = cu_capture_end(ran, &cgr->graph, &cgr->exec, &cgr->checks, &cgr->n_checks, ended_why, sizeof ended_why);
    if (!ran) snprintf(why, cap, "%s", em_last_error() ? em_last_error() : "the captured run failed");
    else if (!ended) snprintf(why, cap, "%s", ended_why);
    ok = ran && ended;
  }
  cgr->captures++;
  if (!ok) drop(cgr);
  return ok;
}

static bool cgraph_run(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate,
                       em_site site);

bool ind_cgraph_run(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate,
                    em_site site) {
  rt_trace_suspend(); /* the copies and views made here are no ops of a graph being traced */
  bool ok = cgraph_run(p, in, n_in, out, donate, site);
  rt_trace_resume();
  return ok;
}

static bool cgraph_run(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate,
                       em_site site) {
  ind_cgraph *cgr = p->cgraph;
  const ir_graph *g = p->g;
  cgr->calls++;
  if (cgr->failed) return ind_run_steps(p, in, n_in, out, donate, NULL, site);
  if (cgr->calls == 1) { /* the first call runs as usual */
    for (int i = 0; i < n_in; i++) cgr->first[i] = address(in[i]);
    return ind_run_steps(p, in, n_in, out, donate, NULL, site);
  }
  char why[256] = "";
  bool recapture = false;
  for (int i = 0; cgr->exec && i < n_in; i++)
    if (!cgr->copied[i] && address(in[i]) != address(cgr->in[i])) cgr->copied[i] = recapture = true;
  if (recapture) drop(cgr);
  if (!cgr->exec && (cgr->captures > n_in || !capture(p, cgr, in, site, why, sizeof why))) {
    if (!why[0]) snprintf(why, sizeof why, "the inputs' addresses kept changing (%d captures)", cgr->captures);
    fprintf(stderr, "[ember] reduce-overhead: graph %s runs without a CUDA graph: %s\n", g->name, why);
    em_clear_error();
    cgr->failed = true;
    return ind_run_steps(p, in, n_in, out, donate, NULL, site);
  }
  for (int i = 0; i < n_in; i++)
    if (cgr->copied[i] && !copy_in(cgr->in[i], in[i], site)) return false;
  static const uint64_t zero[2] = {0, 0};
  cu_enter();
  for (int c = 0; c < cgr->n_checks; c++)
    if (cu_drv()->memcpy_htod(cgr->checks[c].word->ptr, zero, sizeof zero, cu_current_stream()))
      return rt_error(site, "em_call", "clearing a bounds check of the CUDA graph"), false;
  if (!cu_graph_launch(cgr->exec, why, sizeof why)) return rt_error(site, "em_call", "%s", why), false;
  replays++;
  for (int c = 0; c < cgr->n_checks; c++) {
    uint64_t bad[2];
    if (!cu_copy_to_host(bad, cgr->checks[c].word->ptr, sizeof bad, "em_call", site)) return false;
    if (bad[0])
      return rt_error(site, prim_get(cgr->checks[c].op)->name, "index %lld is out of bounds for axis %d with size %lld",
                      (long long)(int64_t)bad[1], cgr->checks[c].axis, (long long)cgr->checks[c].limit),
             false;
  }
  bool ok = true;
  for (int o = 0; ok && o < g->n_outputs; o++) {
    em_tensor *s = cgr->out[o];
    int i = 0;
    while (i < n_in && cgr->in[i]->storage != s->storage) i++;
    if (i < n_in) /* a view of input i (AOT's forward returns what its backward saves): of this call's */
      out[o] = rt_new_view(in[i], s->ndim, s->sizes, s->strides, in[i]->offset + s->offset - cgr->in[i]->offset, "em_call", site);
    else
      out[o] = copy_out(s, site);
    ok = out[o] != NULL;
  }
  if (!ok)
    for (int o = 0; o < g->n_outputs; o++) em_release(out[o]), out[o] = NULL;
  return ok;
}

bool ind_cgraph_attach(ind_program *p) {
  const ir_graph *g = p->g;
  if (p->device != EM_CUDA) return true;
  ind_cgraph *cgr = calloc(1, sizeof *cgr);
  if (!cgr) return false;
  cgr->n_in = g->n_inputs, cgr->n_out = g->n_outputs;
  cgr->first = calloc((size_t)cgr->n_in + 1, sizeof(uint64_t));
  cgr->copied = calloc((size_t)cgr->n_in + 1, sizeof(bool));
  cgr->in = calloc((size_t)cgr->n_in + 1, sizeof(em_tensor *));
  cgr->out = calloc((size_t)cgr->n_out + 1, sizeof(em_tensor *));
  if (!cgr->first || !cgr->copied || !cgr->in || !cgr->out) return ind_cgraph_free(cgr), false;
  p->cgraph = cgr;
  return true;
}
