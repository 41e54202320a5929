/* inductor/run.c: running a program: eager steps and kernels in order, kernels split across
 * the pool's threads, intermediates in the planned arena, in-place updates where the plan allows,
 * releases at last use; and EMBER_INDUCTOR_PROFILE. */
#include "internal.h"
#include "../runtime/cuda.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

static int profile_on = -1; /* EMBER_INDUCTOR_PROFILE, read at the first run */

/* ---- running ---- */

static _Thread_local int64_t kernel_runs;

typedef struct {
  const kernel *k;
  char **bufs;
  float *scratch;
  int64_t per, block; /* scratch floats per thread; columns per task (column split) */
  int nt;
  int64_t chunks; /* row split: pieces of rows */
} kernel_job;

/* Pieces of rows per thread in a row split. The pool runs each thread's own pieces first (the
 * same rows on the same core as in the kernels before and after), then lets it take what the
 * others have not started, so a thread that runs slower (its core shared with another process,
 * or with a neighbouring VM's) does fewer of them instead of the whole kernel waiting for its
 * share. */
enum { ROW_PIECES = 8 };

/* Piece c of a row split: rows [rows*c/chunks, rows*(c+1)/chunks), with the scratch slot of the
 * thread running it. Which thread runs a row never changes its result. */
static void kernel_rows(void *ctx, int64_t c) {
  const kernel_job *j = ctx;
  int64_t a = j->k->rows * c / j->chunks, z = j->k->rows * (c + 1) / j->chunks;
  if (a < z) j->k->fn(j->bufs, a, z, 0, j->k->cols, j->scratch + j->per * prim_rank());
}

/* Task t of a column split: a block of columns, a multiple of the vector width. */
static void kernel_cols(void *ctx, int64_t t) {
  const kernel_job *j = ctx;
  int64_t a = j->block * t, z = t == j->nt - 1 ? j->k->cols : j->block * (t + 1);
  if (z > j->k->cols) z = j->k->cols;
  if (a < z) j->k->fn(j->bufs, 0, j->k->rows, a, z, j->scratch);
}

/* Runs k over its whole iteration space, split across the pool's threads when it is large
 * (rows when there are enough of them, else column blocks that are multiples of the vector
 * width; row kernels only by rows), with the eager loops' grain so small kernels stay on the
 * calling thread. scratch: k->n_spill * k->cols floats for each of slots threads. A split never
 * changes a result: each row, and each column of a kernel that accumulates along columns,
 * stays on one thread. */
static void run_kernel(const kernel *k, char **bufs, float *scratch, int slots) {
  int64_t n = k->rows * k->cols;
  kernel_job j = {k, bufs, scratch, k->n_spill * k->cols, 0, prim_threads(), 0};
  if (j.nt > slots) j.nt = slots;
  if (j.nt < 2 || n < 2 * PRIM_PARALLEL_GRAIN || (k->row && k->rows < 2)) {
    k->fn(bufs, 0, k->rows, 0, k->cols, scratch);
    return;
  }
  if (k->has_col && k->cols < 2 * LANES * j.nt) { /* each column's accumulation stays on one thread */
    k->fn(bufs, 0, k->rows, 0, k->cols, scratch);
  } else if (!k->has_col && (k->rows >= j.nt || k->row)) {
    if (j.nt > k->rows) j.nt = (int)k->rows;
    j.chunks = k->rows < (int64_t)j.nt * ROW_PIECES ? k->rows : (int64_t)j.nt * ROW_PIECES;
    prim_parallel_upto(j.chunks, j.nt, kernel_rows, &j); /* ranks below j.nt <= slots */
  } else {
    j.block = (k->cols / j.nt + LANES - 1) / LANES * LANES;
    prim_parallel(j.nt, kernel_cols, &j);
  }
}
int64_t ind_kernel_runs(void) { return kernel_runs; }
static _Thread_local int64_t vector_runs, combo_runs;
int64_t ind_combo_kernel_runs(void) { return combo_runs; }
int64_t ind_vector_kernel_runs(void) { return vector_runs; }

/* EMBER_INDUCTOR_PROFILE=1: time spent per kind of step (each eager prim, pointwise kernels, row
 * kernels) over the process, printed at exit: where a compiled step's time goes. */

/* slots: each prim, then pointwise kernels, row kernels, combo kernels */
static double profile_ms[EM_PRIM_COUNT + 3];
static int64_t profile_n[EM_PRIM_COUNT + 3], profile_bytes[EM_PRIM_COUNT + 3];
static pthread_mutex_t profile_lock = PTHREAD_MUTEX_INITIALIZER;

/* GEMM time by operand shapes. */
static struct { char key[96]; double ms; int64_t n; } profile_gemm[64];

static void profile_gemm_key(const em_tensor *a, const em_tensor *b, char key[96]) {
  int n = 0;
  for (int q = 0; q < 2; q++) {
    const em_tensor *t = q ? b : a;
    n += snprintf(key + n, 96 - (size_t)n, "%s[", q ? " x " : "");
    for (int d = 0; d < t->ndim && n < 80; d++) n += snprintf(key + n, 96 - (size_t)n, "%s%lld", d ? "," : "", (long long)t->sizes[d]);
    n += snprintf(key + n, 96 - (size_t)n, "]%s", t->ndim >= 2 && t->strides[t->ndim - 2] == 1 && t->sizes[t->ndim - 1] > 1 ? "T" : "");
  }
}

static void profile_gemm_time(const char *key, double ms) {
  pthread_mutex_lock(&profile_lock);
  for (int i = 0; i < 64; i++)
    if (!profile_gemm[i].n || !strcmp(profile_gemm[i].key, key)) {
      snprintf(profile_gemm[i].key, sizeof profile_gemm[i].key, "%s", key);
      profile_gemm[i].ms += ms, profile_gemm[i].n++;
      break;
    }
  pthread_mutex_unlock(&profile_lock);
}

static void profile_gemm_add(const em_tensor *a, const em_tensor *b, double ms) {
  char key[96];
  profile_gemm_key(a, b, key);
  profile_gemm_time(key, ms);
}

static void profile_print(void) {
  double total = 0;
  for (int i = 0; i < EM_PRIM_COUNT + 3; i++) total += profile_ms[i];
  fprintf(stderr, "[ember] inductor profile: %.1f ms in compiled graphs\n", total);
  for (;;) {
    int best = -1;
    for (int i = 0; i < EM_PRIM_COUNT + 3; i++)
      if (profile_n[i] && (best < 0 || profile_ms[i] > profile_ms[best])) best = i;
    if (best < 0) break;
    const char *name = best == EM_PRIM_COUNT       ? "pointwise kernels"
                       : best == EM_PRIM_COUNT + 1 ? "row kernels"
                       : best == EM_PRIM_COUNT + 2 ? "combo kernels"
                                                   : prim_get((em_prim)best)->name;
    fprintf(stderr, "  %-20s %9.1f ms %5.1f%% %8lld runs", name, profile_ms[best], 100 * profile_ms[best] / (total > 0 ? total : 1),
            (long long)profile_n[best]);
    if (best >= EM_PRIM_COUNT) fprintf(stderr, " %6.1f GB/s", (double)profile_bytes[best] / (profile_ms[best] * 1e6));
    fprintf(stderr, "\n");
    profile_n[best] = 0;
  }
  fprintf(stderr, "  GEMMs by shape (T: transposed operand):\n");
  for (;;) {
    int best = -1;
    for (int i = 0; i < 64; i++)
      if (profile_gemm[i].n && (best < 0 || profile_gemm[i].ms > profile_gemm[best].ms)) best = i;
    if (best < 0) break;
    fprintf(stderr, "    %9.1f ms %6lld runs  %s\n", profile_gemm[best].ms, (long long)profile_gemm[best].n, profile_gemm[best].key);
    profile_gemm[best].n = 0;
  }
}

/* The program's slowest kernels, when it is freed: ten, or N with EMBER_INDUCTOR_PROFILE=N. */
static int profile_kernels = 10;
void ind_profile_kernels(const ind_program *p) {
  if (profile_on != 1 || !p->n_kernels || !p->schedule_text) return;
  bool *done = calloc((size_t)p->n_kernels, 1);
  fprintf(stderr, "[ember] inductor profile of %s: slowest kernels%s\n", p->g->name,
          p->device == EM_CUDA ? " (device time, CUDA events)" : "");
  for (int r = 0; done && r < profile_kernels && r < p->n_kernels; r++) {
    int best = -1;
    for (int k = 0; k < p->n_kernels; k++)
      if (!done[k] && (best < 0 || p->kernels[k].prof_ms > p->kernels[best].prof_ms)) best = k;
    done[best] = true;
    const kernel *k = &p->kernels[best];
    if (!k->prof_runs) break;
    const char *line = strstr(p->schedule_text, k->name), *eol = line ? strchr(line, '\n') : NULL;
    bool dev = p->device == EM_CUDA; /* device kernels take microseconds */
    fprintf(stderr, dev ? "  %8.2f us/run %6.1f GB/s  %.*s\n" : "  %8.3f ms/run %6.1f GB/s  %.*s\n",
            k->prof_ms / (double)k->prof_runs * (dev ? 1e3 : 1),
            (double)k->bytes * (double)k->prof_runs / (k->prof_ms * 1e6), line ? (int)(eol ? eol - line : (long)strlen(line)) : 0,
            line ? line : "");
  }
  free(done);
}

static bool profiling(void) {
  if (profile_on < 0) {
    const char *e = getenv("EMBER_INDUCTOR_PROFILE");
    profile_on = e && *e && strcmp(e, "0");
    if (profile_on && atoi(e) > 1) profile_kernels = atoi(e);
    if (profile_on) atexit(profile_print);
  }
  return profile_on;
}

static void profile_add(int slot, double ms, int64_t bytes) {
  pthread_mutex_lock(&profile_lock);
  profile_ms[slot] += ms, profile_n[slot]++, profile_bytes[slot] += bytes;
  pthread_mutex_unlock(&profile_lock);
}

/* The device times of a run's kernels (kev: a start and an end event for each, NULL where not
 * launched), added to the kernels' and the process's profile; the events destroyed. */
static void profile_device_times(const ind_program *p, cu_event *kev) {
  const cu_driver *d = cu_drv();
  cu_enter();
  for (int ki = 0; ki < p->n_kernels; ki++) {
    cu_event *ev = &kev[2 * ki];
    float ms = 0;
    if (ev[0] && ev[1] && !d->event_sync(ev[1]) && !d->event_elapsed(&ms, ev[0], ev[1])) {
      kernel *k = (kernel *)&p->kernels[ki];
      profile_add(EM_PRIM_COUNT + k->row, ms, k->bytes);
      pthread_mutex_lock(&profile_lock);
      k->prof_ms += ms, k->prof_runs++;
      pthread_mutex_unlock(&profile_lock);
    }
    for (int e = 0; e < 2; e++)
      if (ev[e]) d->event_destroy(ev[e]);
  }
  rt_free(kev);
}

/* EMBER_INDUCTOR_PROFILE on the device: an eager step (a GEMM, a convolution, any prim that is
 * not a generated kernel) between two CUDA events, as the kernels are: the host clock would see
 * only its asynchronous launch. slot: profile_ms's; gemm: the operands' key for a GEMM, else "". */
typedef struct step_timing {
  cu_event ev[2];
  bool begun, ended; /* both events recorded: timed (else left out of the profile) */
  int slot;
  char gemm[96];
} step_timing;

static void step_timing_begin(step_timing *t) {
  const cu_driver *d = cu_drv();
  t->begun = !d->event_create(&t->ev[0], 0) && !d->event_create(&t->ev[1], 0) &&
             !d->event_record(t->ev[0], cu_current_stream());
}

static void step_timing_end(step_timing *t, int slot, const em_tensor *a, const em_tensor *b) {
  if (!t->begun || t->ended) return;
  t->ended = !cu_drv()->event_record(t->ev[1], cu_current_stream());
  t->slot = slot;
  if (a && b) profile_gemm_key(a, b, t->gemm);
}

/* The device times of a run's eager steps, added to the profile; the events destroyed. */
static void profile_step_times(const ind_program *p, step_timing *st) {
  const cu_driver *d = cu_drv();
  cu_enter();
  for (int s = 0; s < p->n_steps; s++) {
    step_timing *t = &st[s];
    float ms = 0;
    if (t->ended && !d->event_sync(t->ev[1]) && !d->event_elapsed(&ms, t->ev[0], t->ev[1])) {
      profile_add(t->slot, ms, 0);
      if (t->gemm[0]) profile_gemm_time(t->gemm, ms);
    }
    for (int e = 0; e < 2; e++)
      if (t->ev[e]) d->event_destroy(t->ev[e]);
  }
  rt_free(st);
}

bool ind_accepts(const ind_program *p, em_tensor *const *in, int n_in) {
  if (n_in != p->g->n_inputs) return false;
  for (int i = 0; i < n_in; i++) {
    if (em_device_of(in[i]) != p->in_device[i]) return false;
    prim_meta m = rt_meta(in[i]);
    const prim_meta *w = &p->in_meta[i];
    if (m.dtype != w->dtype || m.ndim != w->ndim || memcmp(m.sizes, w->sizes, sizeof(int64_t) * (size_t)m.ndim) ||
        memcmp(m.strides, w->strides, sizeof(int64_t) * (size_t)m.ndim))
      return false;
  }
  return true;
}

/* Debug builds put a guard zone after the arena and the scratch and check it after every
 * kernel: a kernel that writes past its buffers (issue 15's negative axes wrote past the end of
 * an output) stops there, naming the kernel, instead of corrupting the heap unseen. */
enum { GUARD = 64, GUARD_BYTE = 0xA5 };
#ifndef NDEBUG
static void guard_set(char *end) {
  if (end) memset(end, GUARD_BYTE, GUARD);
}
static void guard_check(const char *end, const kernel *k, const char *what) {
  for (int i = 0; end && i < GUARD; i++)
    if ((unsigned char)end[i] != GUARD_BYTE) {
      fprintf(stderr, "ember: kernel %s wrote past the end of the %s (guard byte %d)\n", k->name, what, i);
      EM_ASSERT(!"a generated kernel wrote out of bounds");
    }
}
#else
static void guard_set(char *end) { (void)end; }
static void guard_check(const char *end, const kernel *k, const char *what) { (void)end, (void)k, (void)what; }
#endif

/* A matmul step's product: on the device under max-autotune, through cuBLASLt with a timed
 * algorithm; else (or when cuBLASLt cannot take it) the eager matmul. */
static em_tensor *matmul_step(const ind_program *p, int s, const ir_node *m, em_tensor *a, em_tensor *b) {
  if (p->device == EM_CUDA && p->opts.autotune) {
    bool fallback;
    em_tensor *r = ind_cuda_gemm(p, s, a, b, NULL, CU_EPI_NONE, &fallback, m->site);
    if (r || !fallback) return r;
  }
  return rt_dispatch(m->opname, EM_PRIM_MATMUL, (em_tensor *[]){a, b}, 2, &m->attrs, m->site);
}

/* A CPU GEMM epilogue: act(a @ b [+ bias]) from prim_gemm_epilogue, the product's shape, and with
 * prod the product itself in *prod; NULL with the error recorded. */
static em_tensor *cpu_gemm_epilogue(const ir_node *mm, em_tensor *a, em_tensor *b, em_tensor *bias, int act,
                                    em_tensor **prod, em_site site) {
  prim_meta in[2] = {rt_meta(a), rt_meta(b)}, om;
  char err[256];
  if (!prim_meta_fn(EM_PRIM_MATMUL, &mm->attrs, in, 2, &om, err, sizeof err))
    return rt_error(site, mm->opname, "%s", err);
  em_tensor *r = rt_new(om.dtype, om.ndim, om.sizes, mm->opname, site);
  if (prod && r && !(*prod = rt_new(om.dtype, om.ndim, om.sizes, mm->opname, site))) em_release(r), r = NULL;
  if (!r) return NULL;
  prim_buf ob = rt_buf(r), ab = rt_buf(a), bb = rt_buf(b);
  prim_buf cb = bias ? rt_buf(bias) : ob, pb = prod ? rt_buf(*prod) : ob;
  if (!prim_gemm_epilogue(&ob, prod ? &pb : NULL, &ab, &bb, bias ? &cb : NULL, (prim_activation)act, err, sizeof err)) {
    em_release(r);
    if (prod) em_release(*prod), *prod = NULL;
    return rt_error(site, mm->opname, "%s", err);
  }
  return r;
}

/* A GEMM epilogue step (schedule.c): one cuBLASLt call (CUDA) or the GEMM with its epilogue on
 * each tile (CPU), its result reshaped as the chain's last node's; a kept product (CPU) goes into
 * vals with its reshape. When cuBLASLt cannot take the GEMM, the chain's nodes run eagerly, their
 * intermediates dropped after. */
static em_tensor *epilogue_step(const ind_program *p, int s, const ind_epilogue *e, em_tensor **vals) {
  const ir_graph *g = p->g;
  const ir_node *mm = &g->nodes[e->mm], *last = &g->nodes[e->nodes[e->n_nodes - 1]];
  const ir_type *t = &g->values[last->out].type;
  bool fallback = false;
  em_tensor *a = vals[ir_operands(g, mm)[0]], *b = vals[ir_operands(g, mm)[1]], *prod = NULL;
  em_tensor *r = p->device == EM_CUDA
                     ? ind_cuda_gemm(p, s, a, b, vals[e->bias], e->act, &fallback, last->site)
                     : cpu_gemm_epilogue(mm, a, b, e->bias >= 0 ? vals[e->bias] : NULL, e->act, e->keep ? &prod : NULL,
                                         last->site);
  if (r && prod) {
    vals[mm->out] = prod;
    for (int i = 0; i < e->n_nodes; i++) { /* the reshape of the product in the chain */
      const ir_node *n = &g->nodes[e->nodes[i]];
      if (n->op != EM_PRIM_RESHAPE || ir_operands(g, n)[0] != mm->out) continue;
      if (!(vals[n->out] = rt_reshape(prod, n->attrs.shape.ndim, n->attrs.shape.sizes, n->opname, n->site)))
        return em_release(r), NULL;
    }
  }
  if (r) {
    em_tensor *v = r->ndim == t->ndim && !memcmp(r->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim)
                       ? em_retain(r) : rt_reshape(r, t->ndim, t->sizes, last->opname, last->site);
    em_release(r);
    return v;
  }
  if (!fallback) return NULL;
  bool ok = true;
  for (int i = 0; ok && i < e->n_nodes; i++) {
    const ir_node *n = &g->nodes[e->nodes[i]];
    em_tensor *ops[3];
    if (n->n_in > 3) return rt_error(n->site, n->opname, "an epilogue node with %d operands", n->n_in);
    for (int k = 0; k < n->n_in; k++) ops[k] = vals[ir_operands(g, n)[k]];
    vals[n->out] = n->op == EM_PRIM_RESHAPE
                       ? rt_reshape(ops[0], n->attrs.shape.ndim, n->attrs.shape.sizes, n->opname, n->site)
                       : rt_dispatch(n->opname, n->op, ops, n->n_in, &n->attrs, n->site);
    ok = vals[n->out] != NULL;
  }
  r = ok ? em_retain(vals[last->out]) : NULL;
  for (int i = 0; i < e->n_nodes; i++) {
    int v = g->nodes[e->nodes[i]].out;
    em_release(vals[v]), vals[v] = NULL;
  }
  return r;
}

bool ind_run(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate, em_site site) {
  for (int i = 0; i < p->g->n_outputs; i++) out[i] = NULL;
  if (!ind_accepts(p, in, n_in))
    return rt_error(site, "em_call", "the inputs do not have the layouts the kernels were compiled for"), false;
  return p->cgraph ? ind_cgraph_run(p, in, n_in, out, donate, site) : ind_run_steps(p, in, n_in, out, donate, NULL, site);
}

bool ind_run_rng(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate,
                 const rt_interp_opts *rng, em_site site) {
  if (!p->n_rand) return ind_run(p, in, n_in, out, donate, site);
  for (int i = 0; i < p->g->n_outputs; i++) out[i] = NULL;
  if (!ind_accepts(p, in, n_in))
    return rt_error(site, "em_call", "the inputs do not have the layouts the kernels were compiled for"), false;
  return ind_run_steps(p, in, n_in, out, donate, rng, site); /* never a CUDA graph: see ind_takes_random */
}

bool ind_takes_random(const ir_graph *g) {
  for (int i = 0; i < g->n_nodes; i++)
    if ((prim_get(g->nodes[i].op)->flags & P_RANDOM) && g->values[g->nodes[i].out].type.device != EM_CPU) return false;
  return true;
}

/* The Philox counters of p's random nodes for this run, in graph order, as rt_interpret draws
 * them: from the node's rng slot when the forward filled it (a backward replaying its mask),
 * else reserved now (and the slot filled). ctr[r] = {seed, offset}. */
static void reserve_random(const ind_program *p, const rt_interp_opts *rng, uint64_t (*ctr)[2]) {
  for (int r = 0; r < p->n_rand; r++) {
    const ir_node *n = &p->g->nodes[p->rand[r]];
    rt_rng_slot *slot = rng && n->rng_slot >= 0 && n->rng_slot < rng->n_slots ? &rng->slots[n->rng_slot] : NULL;
    if (slot && slot->filled) {
      ctr[r][0] = slot->seed, ctr[r][1] = slot->offset;
      continue;
    }
    rt_rng_reserve(prim_philox_calls(n->op, n->attrs.dtype, ir_numel(n->attrs.shape.ndim, n->attrs.shape.sizes)),
                   &ctr[r][0], &ctr[r][1]);
    if (slot) *slot = (rt_rng_slot){ctr[r][0], ctr[r][1], true};
  }
}

/* Kernel k's buffers for this run into bufs (k->n_out + k->n_in + 1 + k->n_rng entries): its
 * outputs made (stored into an input in place, a view of the arena at the planned offset, or
 * new; column reductions set to their identity), its inputs (a CPU scalar copied to the device
 * for a CUDA kernel), its table of sizes (sizes_as_args; codegen.c) and each random node's
 * {seed, offset} (codegen.c: emit_philox). False with an error recorded. */
static bool kernel_buffers(const ind_program *p, const kernel *k, em_tensor **vals, em_tensor *const *into,
                           em_tensor *arena, uint64_t (*ctr)[2], char **bufs, em_site site) {
  const ir_graph *g = p->g;
  bool ok = true, cuda = p->device == EM_CUDA;
  bufs[k->n_out + k->n_in] = (char *)k->table;
  for (int r = 0; r < k->n_rng; r++) bufs[k->n_out + k->n_in + 1 + r] = (char *)ctr[k->rng[r]];
  for (int o = 0; ok && o < k->n_out; o++) {
    int v = k->out[o];
    const ir_type *t = &g->values[v].type;
    int64_t sz[EM_MAX_DIMS], st_[EM_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) sz[d] = t->sizes[d];
    if (into && into[v]) {
      vals[v] = em_retain(into[v]);
      rt_bump_version(into[v], "em_call", site);
    } else if (p->arena_off[v] >= 0 && arena) { /* a view of the arena at the planned offset */
      ir_contiguous_strides(t->ndim, sz, st_);
      vals[v] = rt_new_view(arena, t->ndim, sz, st_, 0, "em_call", site);
      if (vals[v]) vals[v]->dtype = t->dtype, vals[v]->offset = p->arena_off[v] / (int64_t)em_dtype_size(t->dtype);
    } else {
      vals[v] = rt_new_device(t->dtype, t->ndim, sz, p->device, "em_call", site);
    }
    ok = vals[v] != NULL;
    if (ok) bufs[o] = rt_data(vals[v]);
  }
  for (int o = 0; ok && o < k->n_out; o++) /* column reductions accumulate from their identity */
    if (p->kind[k->out[o]] == K_COL) {
      double init = 0;
      for (int i = 0; i < k->n_nodes; i++)
        if (g->nodes[k->nodes[i]].out == k->out[o]) init = reduce_init(g->nodes[k->nodes[i]].op);
      int64_t n = vals[k->out[o]]->numel;
      if (vals[k->out[o]]->dtype == EM_F64)
        for (int64_t e = 0; e < n; e++) ((double *)bufs[o])[e] = init;
      else
        for (int64_t e = 0; e < n; e++) ((float *)bufs[o])[e] = (float)init;
    }
  for (int i = 0; ok && i < k->n_in; i++) {
    em_tensor *x = vals[k->in[i]];
    if (cuda && x->storage->device != EM_CUDA) { /* a CPU scalar (ir_verify allows them) */
      em_tensor *d = cu_scalar_to_device(x, "em_call", site);
      ok = d != NULL;
      em_release(vals[k->in[i]]);
      vals[k->in[i]] = x = d;
    }
    if (ok) bufs[k->n_out + i] = rt_data(x);
  }
  return ok;
}

/* ---- combo kernels (schedule.c: combine_kernels) ----
 * The parts' index spaces laid end to end and cut into pieces: a part of n elements makes
 * ceil(n / grain) pieces, blocks of its rows when it has that many, else blocks of its columns
 * (multiples of the vector width), as run_kernel splits a kernel alone; consecutive pieces
 * smaller than half a grain are batched into one task. The grain is the eager loops' (or a quarter
 * of each thread's share, when larger), so one large part is split across every thread and
 * many small ones do not cost a task each. The threads take tasks in order (prim_parallel).
 * A combo too small to split runs its parts on the calling thread. */
typedef struct combo_piece {
  const kernel *k;
  char **bufs;
  int64_t r0, r1, j0, j1;
} combo_piece;

typedef struct combo_job {
  const combo_piece *pc;
  const int *task_at; /* task t runs pieces [task_at[t], task_at[t + 1]) */
  float *scratch;
} combo_job;

static void combo_task(void *ctx, int64_t t) {
  const combo_job *j = ctx;
  for (int q = j->task_at[t]; q < j->task_at[t + 1]; q++) {
    const combo_piece *c = &j->pc[q];
    c->k->fn(c->bufs, c->r0, c->r1, c->j0, c->j1, j->scratch);
  }
}

static bool run_combo(const ind_program *p, const step *st, em_tensor **vals, em_tensor *const *into, em_tensor *arena,
                      uint64_t (*ctr)[2], float *scratch, int slots, em_site site) {
  int np = st->n_parts, nbuf = 0;
  for (int q = 0; q < np; q++) {
    const kernel *k = &p->kernels[st->parts[q]];
    nbuf += k->n_out + k->n_in + 1 + k->n_rng;
  }
  int nt = prim_threads() < slots ? prim_threads() : slots;
  int64_t total = 0;
  for (int q = 0; q < np; q++) total += p->kernels[st->parts[q]].rows * p->kernels[st->parts[q]].cols;
  int64_t grain = total / (4 * (int64_t)(nt > 0 ? nt : 1));
  if (grain < PRIM_PARALLEL_GRAIN) grain = PRIM_PARALLEL_GRAIN;
  int max_pieces = (int)(total / grain) + 2 * np + 1;
  char **all = rt_alloc(sizeof(char *) * (size_t)(nbuf + 1), 16), ***bufs = rt_alloc(sizeof(char **) * (size_t)np, 16);
  combo_piece *pc = rt_alloc(sizeof(combo_piece) * (size_t)max_pieces, 16);
  int *task_at = rt_alloc(sizeof(int) * (size_t)(max_pieces + 1), 16);
  bool ok = all && bufs && pc && task_at;
  if (!ok) rt_error(site, "em_call", "out of memory");
  for (int q = 0, at = 0; ok && q < np; q++) {
    const kernel *k = &p->kernels[st->parts[q]];
    bufs[q] = all + at, at += k->n_out + k->n_in + 1 + k->n_rng;
    ok = kernel_buffers(p, k, vals, into, arena, ctr, bufs[q], site);
  }
  if (ok && (nt < 2 || total < 2 * PRIM_PARALLEL_GRAIN)) {
    for (int q = 0; q < np; q++) {
      const kernel *k = &p->kernels[st->parts[q]];
      k->fn(bufs[q], 0, k->rows, 0, k->cols, scratch);
    }
  } else if (ok) {
    int n = 0, tasks = 0;
    for (int q = 0; q < np; q++) {
      const kernel *k = &p->kernels[st->parts[q]];
      int64_t e = k->rows * k->cols, c = (e + grain - 1) / grain;
      if (e <= 0) continue;
      if (c <= 1) {
        pc[n++] = (combo_piece){k, bufs[q], 0, k->rows, 0, k->cols};
      } else if (k->rows >= c) {
        for (int64_t i = 0; i < c; i++) pc[n++] = (combo_piece){k, bufs[q], k->rows * i / c, k->rows * (i + 1) / c, 0, k->cols};
      } else {
        int64_t block = (k->cols / c + LANES - 1) / LANES * LANES;
        if (block < LANES) block = LANES;
        for (int64_t j = 0; j < k->cols; j += block)
          pc[n++] = (combo_piece){k, bufs[q], 0, k->rows, j, j + block < k->cols ? j + block : k->cols};
      }
    }
    int64_t acc = 0;
    for (int i = 0; i < n; i++) { /* a task closes at half a grain: a split part's pieces (each more) stay alone */
      if (!acc) task_at[tasks++] = i;
      acc += (pc[i].r1 - pc[i].r0) * (pc[i].j1 - pc[i].j0);
      if (2 * acc >= grain) acc = 0;
    }
    task_at[tasks] = n;
    combo_job j = {pc, task_at, scratch};
    prim_parallel(tasks, combo_task, &j);
  }
  rt_free(all), rt_free(bufs), rt_free(pc), rt_free(task_at);
  return ok;
}

bool ind_run_steps(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate,
                   const rt_interp_opts *rng, em_site site) {
  const ir_graph *g = p->g;
  for (int i = 0; i < g->n_outputs; i++) out[i] = NULL;
  uint64_t (*ctr)[2] = p->n_rand ? rt_alloc(sizeof *ctr * (size_t)p->n_rand, 16) : NULL;
  if (p->n_rand && !ctr) return rt_error(site, "em_call", "out of memory"), false;
  int nv = g->n_values;
  em_tensor **vals = rt_alloc(sizeof(em_tensor *) * (size_t)(nv + 1), 16);
  if (!vals) return rt_error(site, "em_call", "out of memory"), false;
  memset(vals, 0, sizeof(em_tensor *) * (size_t)nv);
  for (int i = 0; i < n_in; i++) vals[g->inputs[i]] = em_retain(in[i]);
  bool ok = true;
  /* the row kernels' spill rows, for every thread: the most any kernel of p needs */
  size_t scratch_bytes = 0;
  int slots = prim_max_threads(); /* fixed for this run, whatever em_set_num_threads does meanwhile */
  for (int k = 0; k < p->n_kernels; k++) {
    size_t need = sizeof(float) * (size_t)(p->kernels[k].n_spill * p->kernels[k].cols) * (size_t)slots;
    if (need > scratch_bytes) scratch_bytes = need;
  }
  float *scratch = scratch_bytes ? rt_alloc(scratch_bytes + GUARD, 64) : NULL;
  char *scratch_end = scratch ? (char *)scratch + scratch_bytes : NULL;
  guard_set(scratch_end);
  if (scratch_bytes && !scratch) ok = (rt_error(site, "em_call", "out of memory for %zu bytes of kernel scratch", scratch_bytes), false);
  /* in-place updates the caller asked for and the plan allows: output value -> input tensor */
  em_tensor **into = NULL;
  if (donate) {
    into = rt_alloc(sizeof(em_tensor *) * (size_t)(nv + 1), 16);
    if (!into) ok = (rt_error(site, "em_call", "out of memory"), false);
    else memset(into, 0, sizeof(em_tensor *) * (size_t)(nv + 1));
    for (int o = 0; ok && o < g->n_outputs; o++) {
      int i = donate[o];
      if (i < 0 || i >= n_in || !ind_donatable(p, o, i)) continue;
      bool shared = false;
      for (int j = 0; j < n_in && !shared; j++) shared = j != i && in[j]->storage == in[i]->storage;
      for (int q = 0; q < g->n_outputs && !shared; q++) shared = q != o && donate[q] == i;
      if (!shared) into[g->outputs[o]] = in[i];
    }
  }
  em_tensor *arena = NULL;
  bool cuda = p->device == EM_CUDA;
  if (ok && p->arena_bytes > 0) {
    arena = rt_new_device(EM_F32, 1, (int64_t[]){(p->arena_bytes + GUARD) / 4}, p->device, "em_call", site);
    ok = arena != NULL;
  }
  char *arena_end = arena && !cuda ? (char *)rt_data(arena) + p->arena_bytes : NULL; /* no guard on the device */
  guard_set(arena_end);
  bool prof = profiling();
  /* EMBER_INDUCTOR_PROFILE on the device: each kernel's launch between two CUDA events, their
   * device time read after the run (one wait, not one a kernel); not while capturing a graph */
  cu_event *kev = NULL;
  if (prof && cuda && !cu_capturing() && p->n_kernels) {
    kev = rt_alloc(sizeof(cu_event) * 2 * (size_t)p->n_kernels, 16);
    if (kev) memset(kev, 0, sizeof(cu_event) * 2 * (size_t)p->n_kernels);
  }
  step_timing *sev = NULL; /* the eager steps' events, likewise */
  if (prof && cuda && !cu_capturing() && (sev = rt_alloc(sizeof(step_timing) * (size_t)p->n_steps, 16)))
    memset(sev, 0, sizeof(step_timing) * (size_t)p->n_steps);
  rt_trace_suspend();
  if (ctr) reserve_random(p, rng, ctr); /* untraced, as rt_interpret draws them */
  for (int s = 0; ok && s < p->n_steps; s++) {
    const step *st = &p->steps[s];
    double t0 = prof ? now_ms() : 0;
    uint64_t t0_ = RT_PROF_ON() ? rt_prof_now() : 0;
    if (st->node >= 0) {
      const ir_node *n = &g->nodes[st->node];
      em_tensor *small[4], **ops = n->n_in <= 4 ? small : rt_alloc(sizeof(em_tensor *) * (size_t)n->n_in, 16);
      if (!ops) {
        ok = (rt_error(n->site, n->opname, "out of memory"), false);
        break;
      }
      for (int k = 0; k < n->n_in; k++) ops[k] = vals[ir_operands(g, n)[k]];
      prim_attrs at = n->attrs;
      step_timing *tm = sev ? &sev[s] : NULL;
      if (tm) step_timing_begin(tm);
      if (p->rand_of[st->node] >= 0) at.seed = ctr[p->rand_of[st->node]][0], at.offset = ctr[p->rand_of[st->node]][1];
      em_tensor *r;
      if (st->epi) {
        r = epilogue_step(p, s, &p->epis[st->epi - 1], vals);
      } else if (st->tmat >= 0) { /* (a b)^T as b^T a^T */
        const ir_node *m = &g->nodes[st->tmat];
        em_tensor *ab[2];
        for (int q = 0; q < 2; q++) {
          em_tensor *x = vals[ir_operands(g, m)[q]];
          prim_attrs pa = {.n_axes = x->ndim};
          for (int d = 0; d < x->ndim; d++) pa.axes[d] = d;
          pa.axes[x->ndim - 1] = x->ndim - 2, pa.axes[x->ndim - 2] = x->ndim - 1;
          ab[1 - q] = rt_dispatch(m->opname, EM_PRIM_PERMUTE, &x, 1, &pa, m->site);
        }
        r = ab[0] && ab[1] ? matmul_step(p, s, m, ab[0], ab[1]) : NULL;
        if (tm && r) step_timing_end(tm, EM_PRIM_MATMUL, ab[0], ab[1]);
        else if (prof && r) profile_gemm_add(ab[0], ab[1], now_ms() - t0);
        em_release(ab[0]), em_release(ab[1]);
      } else if (st->alias && ir_is_contiguous(ops[0]->ndim, ops[0]->sizes, ops[0]->strides)) {
        r = em_retain(ops[0]);
      } else {
        /* a creation node is made on the device the graph recorded (see rt_interpret) */
        em_device prev = n->n_in ? EM_CPU : em_set_default_device(g->values[n->out].type.device);
        r = n->op == EM_PRIM_RESHAPE ? rt_reshape(ops[0], at.shape.ndim, at.shape.sizes, n->opname, n->site)
            : n->op == EM_PRIM_MATMUL ? matmul_step(p, s, n, ops[0], ops[1])
                                      : rt_dispatch(n->opname, n->op, ops, n->n_in, &at, n->site);
        if (!n->n_in) em_set_default_device(prev);
        bool mm = r && n->op == EM_PRIM_MATMUL;
        if (tm && r) step_timing_end(tm, n->op, mm ? ops[0] : NULL, mm ? ops[1] : NULL);
        else if (prof && mm) profile_gemm_add(ops[0], ops[1], now_ms() - t0);
      }
      if (ops != small) rt_free(ops);
      vals[n->out] = r;
      ok = r != NULL;
      if (tm && r) step_timing_end(tm, st->tmat >= 0 || st->epi ? EM_PRIM_MATMUL : n->op, NULL, NULL); /* if not yet */
      if (prof && !tm) profile_add(st->tmat >= 0 || st->epi ? EM_PRIM_MATMUL : n->op, now_ms() - t0, 0);
      if (t0_ && r) {
        char b0[96], b1[96];
        bool gemm = st->tmat >= 0 || n->op == EM_PRIM_MATMUL;
        const char *what = gemm ? "gemm" : st->epi ? "gemm+epilogue" : n->opname;
        rt_prof_complete(gemm || st->epi ? "gemm" : "op", what, t0_, "%s",
                         gemm && n->n_in == 2 ?
                         (snprintf(b1, sizeof b1, "%s @ %s", rt_fmt(b0, sizeof b0, vals[ir_operands(g, n)[0]]),
                                   ir_fmt_type((char[96]){0}, 96, r->dtype, r->ndim, r->sizes)), b1) : "");
      }
    } else if (st->n_parts) { /* a combo kernel: its parts in one parallel region */
      int64_t bytes = 0;
      ok = run_combo(p, st, vals, into, arena, ctr, scratch, slots, site);
      guard_check(scratch_end, &p->kernels[st->parts[0]], "kernel scratch");
      guard_check(arena_end, &p->kernels[st->parts[0]], "arena");
      for (int q = 0; q < st->n_parts; q++) bytes += p->kernels[st->parts[q]].bytes;
      if (ok && t0_) rt_prof_complete("kernel", "combo", t0_, "%d kernels, %lld bytes", st->n_parts, (long long)bytes);
      if (ok) kernel_runs++, combo_runs++; /* one kernel run: one parallel region */
      if (prof && ok) {
        double dt = now_ms() - t0;
        profile_add(EM_PRIM_COUNT + 2, dt, bytes);
        int64_t all = 0; /* each part's share of the time, by its elements */
        for (int q = 0; q < st->n_parts; q++) all += p->kernels[st->parts[q]].rows * p->kernels[st->parts[q]].cols;
        pthread_mutex_lock(&profile_lock);
        for (int q = 0; q < st->n_parts; q++) {
          kernel *k = (kernel *)&p->kernels[st->parts[q]];
          k->prof_ms += all ? dt * (double)(k->rows * k->cols) / (double)all : 0, k->prof_runs++;
        }
        pthread_mutex_unlock(&profile_lock);
      }
    } else {
      const kernel *k = &p->kernels[st->kernel];
      /* the buffers, the table, then each random node's {seed, offset} (codegen.c: emit_philox) */
      int nbuf = k->n_out + k->n_in + 1 + k->n_rng;
      char *small[33], **bufs = nbuf <= 33 ? small : rt_alloc(sizeof(char *) * (size_t)nbuf, 16);
      if (!bufs) {
        ok = (rt_error(site, "em_call", "out of memory"), false);
        break;
      }
      ok = kernel_buffers(p, k, vals, into, arena, ctr, bufs, site);
      if (ok && cuda) {
        uint64_t ptr[130];
        void *params[132];
        int nb = k->n_out + k->n_in;
        if (nb > 130) {
          ok = (rt_error(site, "em_call", "CUDA kernel %s with %d buffers", k->name, nb), false);
        } else {
          for (int q = 0; q < nb; q++) ptr[q] = (uint64_t)(uintptr_t)bufs[q], params[q] = &ptr[q];
          int64_t n = k->n_elems;
          params[nb] = &n;
          char why[256];
          if (k->tune && !ind_cuda_autotune((kernel *)k, g, bufs, site)) ok = false, nb = 0;
          /* the vector variant where every buffer is 16-byte aligned (a slice's may not be) */
          bool vec = k->cu_vec != NULL;
          for (int q = 0; vec && q < nb; q++) vec = ptr[q] % 16 == 0;
          if (vec) n /= k->vec, vector_runs++;
          /* sizes_as_args: the variant's table of sizes, by value after n (cuda_codegen.c: ktab) */
          if (vec ? k->n_table > k->vtab : k->vtab > 0) params[nb + 1] = vec ? k->table + k->vtab : k->table;
          em_tensor *part = NULL; /* a split row kernel's partial results (cuda_codegen.c: split_parts) */
          if (ok && k->parts) {
            int64_t e = n * k->parts * k->n_out;
            ok = (part = rt_new_device(EM_F32, 1, &e, EM_CUDA, "em_call", site)) != NULL;
            for (int o = 0; ok && o < k->n_out; o++) ptr[o] = (uint64_t)(uintptr_t)((float *)rt_data(part) + o * n * k->parts);
          }
          cu_event *ev = kev ? &kev[2 * st->kernel] : NULL;
          const cu_driver *drv = ev ? cu_drv() : NULL;
          if (ev && (drv->event_create(&ev[0], 0) || drv->event_create(&ev[1], 0) || drv->event_record(ev[0], cu_current_stream())))
            ev = NULL; /* untimed: this kernel is left out of the profile */
          if (ok)
            ok = cu_launch_named(vec ? k->cu_vec : k->cu_fn, k->name, k->row ? n * k->block * (k->parts ? k->parts : 1) : n,
                                 k->block, params, why, sizeof why);
          if (ok && part) { /* the fold of the parts, timed with its row kernel */
            uint64_t cptr[129];
            void *cparams[129];
            for (int o = 0; o < k->n_out; o++) {
              cptr[o] = (uint64_t)(uintptr_t)bufs[o], cptr[k->n_out + o] = ptr[o];
              cparams[o] = &cptr[o], cparams[k->n_out + o] = &cptr[k->n_out + o];
            }
            cparams[2 * k->n_out] = &n;
            ok = cu_launch_named(k->cu_combine, k->combine_name, n, 128, cparams, why, sizeof why);
          }
          if (ev && drv->event_record(ev[1], cu_current_stream())) drv->event_destroy(ev[1]), ev[1] = NULL;
          em_release(part);
          if (ok && t0_) rt_prof_complete("kernel", k->name, t0_, "CUDA launch (asynchronous), %lld elements", (long long)n);
          if (!ok && nb) rt_error(site, "em_call", "%s: %s", k->name, why);
          kernel_runs++;
          if (prof && !kev) profile_add(EM_PRIM_COUNT + k->row, now_ms() - t0, k->bytes); /* launch time: asynchronous */
        }
      } else if (ok) {
        run_kernel(k, bufs, scratch, slots);
        if (t0_) rt_prof_complete("kernel", k->name, t0_, "%d nodes, %lld bytes", k->n_nodes, (long long)k->bytes);
        guard_check(scratch_end, k, "kernel scratch");
        guard_check(arena_end, k, "arena");
        kernel_runs++;
        if (prof) {
          double dt = now_ms() - t0;
          profile_add(EM_PRIM_COUNT + k->row, dt, k->bytes);
          ((kernel *)k)->prof_ms += dt, ((kernel *)k)->prof_runs++;
        }
      }
      if (bufs != small) rt_free(bufs);
    }
    for (int i = 0; ok && i < st->n_release; i++) em_release(vals[st->release[i]]), vals[st->release[i]] = NULL;
  }
  rt_trace_resume();
  if (kev) profile_device_times(p, kev);
  if (sev) profile_step_times(p, sev);
  rt_free(scratch), rt_free(into), rt_free(ctr);
  em_release(arena);
  if (ok)
    for (int i = 0; i < g->n_outputs; i++) out[i] = em_retain(vals[g->outputs[i]]);
  for (int v = 0; v < nv; v++) em_release(vals[v]);
  rt_free(vals);
  return ok;
}

int64_t ind_arena_bytes(const ind_program *p) { return p->arena_bytes; }
int64_t ind_planned_peak(const ind_program *p) { return p->planned_peak; }
