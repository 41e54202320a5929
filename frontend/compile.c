/* frontend/compile.c: em_compile: capture, guards, the cache of entries, recompiles, graph
 * breaks and em_explain. The data flow is DESIGN.md's "one compiled call"; include/ember.h
 * states the user-visible semantics (jit replay, identity of lifted tensors, breaks).
 *
 * Structure:
 *  - An em_compiled holds a list of entries (one per distinct guard set) and a cache of
 *    compiled graphs keyed by graph structure (used by the graphs between breaks).
 *  - A call checks entries in order; a hit without breaks replays the entry's graph; a hit with
 *    breaks re-runs fn under the tracer (each graph is then a cache hit); a miss traces fn and
 *    adds an entry, until recompile_limit, after which fn runs eagerly.
 *  - The tracer (runtime/trace.c) calls on_break at each break; this file decides what a break
 *    does: fullgraph error, or run the graph so far and materialize the proxies. */
#define _POSIX_C_SOURCE 200809L /* strdup, clock_gettime */
#include "frontend.h"
#include "../aot_autograd/aot.h"
#include "../inductor/inductor.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct tguard { /* the metadata of a tensor a guard checks */
  em_dtype dtype;
  em_device device;
  int ndim;
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  bool requires_grad;
} tguard;

typedef enum { SRC_ARG, SRC_PARAM, SRC_CONST } src_kind;
typedef struct source { /* where a graph input (or a passed-through output) comes from at replay */
  src_kind kind;
  int arg;       /* SRC_ARG: index into the call's inputs */
  em_tensor *t;  /* SRC_PARAM: weak (watched); SRC_CONST: owned (created during the trace) */
  tguard guard;
} source;

/* One view prim of a chain that rebuilds an output as a view of a tensor the graph wrote. */
typedef struct view_link {
  em_prim op;
  prim_attrs attrs;
} view_link;

typedef struct outmap {
  bool from_graph; /* graph output index, or a source index */
  int index;
  int n_links;     /* > 0: the source viewed through links[n_links - 1], ..., links[0] (an output */
  view_link *links; /*   aliasing an input the graph wrote: a view of it, as in eager) */
} outmap;

/* What a backend made of a graph: the graph to interpret, and with "aot_eager" (when some input
 * requires grad) the compiled forward/backward pair that replaces it. */
typedef struct fe_graph {
  ir_graph *g;
  aot_compiled *aot;
  bool no_grad; /* the graph holds its own backward (em_backward traced): run it without autograd */
  bool inductor;          /* backend inductor: run g as generated kernels when no autograd is needed */
  ind_variants ind;       /* compiled at the first run with each input layout */
  int *out_root;          /* [outputs] the traced graph's alias root of each output: an input's
                           * index (< n_inputs), else n_inputs + its value (see unalias_outputs) */
  const ir_graph *traced; /* as traced (owned by the graph cache): the accuracy reference, repros */
  int serial;             /* graphs_compiled when it was made: its name in messages */
  bool ran;               /* has run once (the crash repro is prepared for the first run) */
  bool op_by_op;          /* a dynamic entry's graph at a size not compiled yet (dyn_graph) */
  uint64_t uid;           /* unique in the process: a pointer to an evicted graph may come back as another */
} fe_graph;

/* A host value fn declared with em_guard_value: its address, bytes at trace time, and where. */
enum { HOST_GUARD_MAX_BYTES = 64, HOST_GUARDS_MAX = 32 };
typedef struct host_guard {
  const void *ptr;
  size_t size;
  unsigned char bytes[HOST_GUARD_MAX_BYTES];
  const char *what; /* the expression, as the user wrote it */
  em_site site;
} host_guard;

typedef struct entry {
  bool dead;
  char dead_reason[256];
  void *ctx;
  bool grad_mode;
  em_dtype autocast;  /* em_get_autocast_dtype() at the trace: the casts it recorded (EM_F32: none) */
  int n_in;
  tguard *in;
  int *alias;        /* alias[k]: first j with inputs[j] == inputs[k] */
  int *stor;         /* stor[k]: the first input j <= k, else n_in + the first lifted source, whose
                      * storage inputs[k] shares (k itself when none): the aliasing pattern */
  bool has_breaks;
  const fe_graph *graph; /* no breaks: the compiled graph (owned by the graph cache) */
  source *src;       /* graph inputs first (graph->n_inputs), then passed-through outputs */
  int n_src;
  int n_out;
  outmap out[EM_MAX_OUTPUTS];
  int n_wb, n_gb;
  int (*wb)[2];      /* epilogue: copy graph output wb[i][1] into source wb[i][0] (a mutated tensor) */
  int (*gb)[2];      /* epilogue: source gb[i][0]'s .grad = graph output gb[i][1], or none when < 0 */
  int n_host;
  host_guard *host;  /* host values fn declared with em_guard_value */
  const ir_graph *traced; /* no breaks: the graph as traced (owned by the graph cache), for checks;
                          * NULL for a dynamic entry (its template holds the graph) */
  int64_t calls;     /* calls this entry served, for replay validation */
  bool has_backward; /* fn ran em_backward under the trace (the graph holds its own backward) */
  /* dynamic shapes (dynamic.c): the template the graph of each call is specialized from, the
   * symbol of each input dim (-1: a fixed size), each symbol's range, and the symbol values
   * e->graph was specialized for */
  fe_dyn *dyn;
  int n_syms;
  int8_t (*sym_of)[EM_MAX_DIMS];
  int64_t sym_min[FE_DYN_MAX_SYMS], sym_max[FE_DYN_MAX_SYMS];
  char range_why[256];  /* why the symbols' range ends below the default, with fn's line ("" if not) */
  int64_t graph_syms[FE_DYN_MAX_SYMS];
  struct {
    int64_t syms[FE_DYN_MAX_SYMS];
    int count;          /* calls at these sizes */
    const fe_graph *g;  /* the graph last used for them (owned by the graph cache; may be evicted) */
    uint64_t uid;       /* g's uid: g counts only while a cached graph has both */
  } *seen;              /* count_size */
  int n_seen, last_seen;
} entry;


typedef struct cached_graph {
  uint64_t hash;      /* structure, and the variant: grad mode and which inputs require grad */
  ir_graph *traced;   /* as traced, for the structural comparison */
  uint64_t variant;
  fe_graph *compiled; /* what the backend runs */
  uint64_t last_use;  /* for LRU eviction */
} cached_graph;

/* The most graphs a compiled function keeps: a function whose graphs change with every call
 * (a constant computed on the host from data) would otherwise grow without bound. The least
 * recently used graph that no entry replays is evicted (counted in graph_cache_evictions). */
enum { GRAPH_CACHE_MAX = 64 };

struct em_compiled {
  em_model_fn fn;
  char name[64];
  char backend[16];
  bool aot;                 /* backend aot_eager or inductor */
  bool inductor;            /* backend inductor */
  ind_options ind_opts;     /* the mode (inductor) */
  char mode[32];
  aot_partitioner partitioner;
  bool fullgraph;
  int limit;
  em_site site;
  entry **entries;
  int n_entries, cap_entries;
  cached_graph *graphs;
  int n_graphs, cap_graphs;
  uint64_t uses;            /* graph cache lookups, the LRU clock */
  bool limit_warned;
  em_compile_stats stats;
  pthread_mutex_t lock;     /* recursive: held through a call, which may call c again (inlined) */
  int check_every;          /* replay validation: 0 never; 1: each entry's second call; N > 1: that
                             * and every Nth call of an entry */
  bool accuracy;            /* each compiled graph run is checked against the reference (repro.c) */
  char partitioner_name[16];
  em_dynamic dynamic;       /* em_compile_options.dynamic */
  uint8_t *auto_dims;       /* [auto_n] automatic dynamic: per input, the dims whose size changed */
  int auto_n;
  char dyn_refused[384];    /* why probing found no formulas (then no later entry probes again) */
};

/* State of one traced run of fn, passed to on_break. */
typedef struct run_state {
  em_compiled *c;
  const entry *check;      /* replay validation: the entry this trace must reproduce */
  char check_diff[512];    /* how it did not: empty when it did */
  int n_host;
  host_guard host[HOST_GUARDS_MAX];
  int n_graphs;
  int ops[256];            /* prims per graph (the first 256 graphs) */
  int n_breaks;
  em_graph_break_info breaks[64];
  em_site site;
  bool refused;            /* a break under fullgraph: the call fails */
  const ir_graph *check_traced; /* replay validation: the graph the entry replays for this call */
  int tier;                /* how run_graph_so_far has its graphs made (TIER_*): a dynamic entry's
                            * validation at a new size runs them op by op */
  bool probe;              /* a probe trace (dynamic shapes): no graph runs, a break fails it */
} run_state;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static tguard guard_of(const em_tensor *t) {
  tguard g = {.dtype = t->dtype, .device = t->storage->device, .ndim = t->ndim, .requires_grad = t->requires_grad};
  memcpy(g.sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  memcpy(g.strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
  return g;
}

static void fmt_list(char *buf, size_t cap, const int64_t *v, int n) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, cap - k, "[");
  for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)v[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

static void fmt_guard(char *buf, size_t cap, const char *what, const tguard *g) {
  char s[160], st[160];
  fmt_list(s, sizeof s, g->sizes, g->ndim);
  fmt_list(st, sizeof st, g->strides, g->ndim);
  snprintf(buf, cap, "%s: %s%s strides %s on %s, requires_grad=%s", what, em_dtype_name(g->dtype), s, st,
           g->device == EM_CPU ? "cpu" : "cuda", g->requires_grad ? "true" : "false");
}

/* The first difference between guard g and tensor t, or false when they match. */
static bool guard_fails(const tguard *g, const em_tensor *t, const char *what, char *why, size_t cap) {
  char a[160], b[160];
  if (g->dtype != t->dtype)
    return snprintf(why, cap, "%s.dtype: expected %s, got %s", what, em_dtype_name(g->dtype), em_dtype_name(t->dtype)), true;
  if (g->device != t->storage->device) return snprintf(why, cap, "%s.device changed", what), true;
  if (g->ndim != t->ndim || memcmp(g->sizes, t->sizes, sizeof(int64_t) * (size_t)g->ndim)) {
    fmt_list(a, sizeof a, g->sizes, g->ndim), fmt_list(b, sizeof b, t->sizes, t->ndim);
    return snprintf(why, cap, "%s.sizes: expected %s, got %s", what, a, b), true;
  }
  if (memcmp(g->strides, t->strides, sizeof(int64_t) * (size_t)g->ndim)) {
    fmt_list(a, sizeof a, g->strides, g->ndim), fmt_list(b, sizeof b, t->strides, t->ndim);
    return snprintf(why, cap, "%s.strides: expected %s, got %s", what, a, b), true;
  }
  if (g->requires_grad != t->requires_grad)
    return snprintf(why, cap, "%s.requires_grad: expected %s, got %s", what, g->requires_grad ? "true" : "false",
                    t->requires_grad ? "true" : "false"), true;
  return false;
}

/* ---- entries ---- */

static void entry_free(entry *e) {
  if (!e) return;
  rt_unwatch_all(e);
  for (int i = 0; i < e->n_src; i++)
    if (e->src[i].kind == SRC_CONST) em_release(e->src[i].t);
  for (int i = 0; i < e->n_out; i++) free(e->out[i].links);
  free(e->src), free(e->in), free(e->alias), free(e->stor), free(e->wb), free(e->gb), free(e->host);
  fe_dyn_free(e->dyn);
  free(e->sym_of), free(e->seen);
  free(e);
}

/* Applies links (innermost last) to base eagerly: a view of base. Caller-owned, or NULL. */
static em_tensor *apply_links(em_tensor *base, const view_link *links, int n, em_site site) {
  em_tensor *r = em_retain(base);
  for (int k = n - 1; k >= 0 && r; k--) {
    const view_link *l = &links[k];
    em_tensor *nr = l->op == EM_PRIM_RESHAPE ? rt_reshape(r, l->attrs.shape.ndim, l->attrs.shape.sizes, "em_call", site)
                                             : rt_dispatch("em_call", l->op, &r, 1, &l->attrs, site);
    em_release(r);
    r = nr;
  }
  return r;
}

static void entry_tensor_died(void *ctx, const em_tensor *t) {
  entry *e = ctx;
  if (e->dead) return;
  char b[128];
  e->dead = true;
  snprintf(e->dead_reason, sizeof e->dead_reason, "a tensor the function reached through ctx (%s) was freed",
           rt_fmt(b, sizeof b, t));
}

/* Which earlier input, else lifted source of e, shares inputs[k]'s storage (see entry.stor). A
 * replay whose inputs alias in another pattern than the trace's would run a graph that assumed
 * they do not (an in-place write to one and a read of the other): they recompile instead. */
static int storage_class(const entry *e, em_tensor *const *in, int n_in, int k) {
  for (int j = 0; j < k; j++)
    if (in[j]->storage == in[k]->storage) return j;
  for (int i = 0; e->graph && i < e->n_src; i++)
    if (e->src[i].kind == SRC_PARAM && e->src[i].t->storage == in[k]->storage) return n_in + i;
  return k;
}

/* The bytes of a host guard as a reader would want them: an integer of 1, 2, 4 or 8 bytes (and
 * the float or double those bytes make), else hex. */
static void fmt_host(char *buf, size_t cap, const unsigned char *b, size_t n) {
  int64_t i = 0;
  if (n == 1) i = (int8_t)b[0];
  else if (n == 2) i = (int16_t)(b[0] | b[1] << 8);
  if (n == 4) {
    int32_t v;
    float f;
    memcpy(&v, b, 4), memcpy(&f, b, 4);
    snprintf(buf, cap, "%d = %g as float", v, (double)f);
  } else if (n == 8) {
    int64_t v;
    double d;
    memcpy(&v, b, 8), memcpy(&d, b, 8);
    snprintf(buf, cap, "%lld = %g as double", (long long)v, d);
  } else if (n <= 2) {
    snprintf(buf, cap, "%lld", (long long)i);
  } else {
    size_t k = (size_t)snprintf(buf, cap, "0x");
    for (size_t j = 0; j < n && k + 3 < cap; j++) k += (size_t)snprintf(buf + k, cap - k, "%02x", b[j]);
  }
}

static const char *autocast_name(em_dtype dt) { return dt == EM_F32 ? "off" : em_dtype_name(dt); }

/* A dynamic entry's guard on input k: dtype, device, rank and requires_grad as traced, every
 * fixed dim as traced, every symbolic dim binding its symbol (syms[j] < 0: unbound) or equal to
 * it, and contiguous strides (the entry was traced from contiguous inputs). */
static bool dyn_input_fails(const entry *e, int k, const em_tensor *t, int64_t *syms, char *why, size_t cap) {
  const tguard *g = &e->in[k];
  if (g->dtype != t->dtype || g->device != t->storage->device || g->ndim != t->ndim || g->requires_grad != t->requires_grad) {
    char what[32];
    snprintf(what, sizeof what, "inputs[%d]", k);
    tguard fixed = *g; /* report it as the static guard would */
    memcpy(fixed.sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    memcpy(fixed.strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
    return guard_fails(&fixed, t, what, why, cap);
  }
  for (int d = 0; d < g->ndim; d++) {
    int j = e->sym_of[k][d];
    if (j < 0) {
      if (t->sizes[d] != g->sizes[d])
        return snprintf(why, cap, "inputs[%d].sizes[%d]: expected %lld, got %lld", k, d, (long long)g->sizes[d],
                        (long long)t->sizes[d]), true;
    } else if (syms[j] < 0) {
      if (t->sizes[d] < e->sym_min[j] || t->sizes[d] > e->sym_max[j])
        return snprintf(why, cap, "inputs[%d].sizes[%d] = %lld: expected %lld <= s%d <= %lld%s%s%s", k, d,
                        (long long)t->sizes[d], (long long)e->sym_min[j], j, (long long)e->sym_max[j],
                        e->range_why[0] ? " (fn fails " : "", e->range_why, e->range_why[0] ? ")" : ""), true;
      syms[j] = t->sizes[d];
    } else if (t->sizes[d] != syms[j]) {
      return snprintf(why, cap, "inputs[%d].sizes[%d] = %lld: expected s%d = %lld (the dims shared a size when traced)",
                      k, d, (long long)t->sizes[d], j, (long long)syms[j]), true;
    }
  }
  if (!ir_is_contiguous(t->ndim, t->sizes, t->strides))
    return snprintf(why, cap, "inputs[%d] is not contiguous (a dynamic entry is traced from contiguous inputs)", k), true;
  return false;
}

/* Which guard of e fails for this call, into why; false when all pass. */
static bool entry_fails(const entry *e, void *ctx, em_tensor *const *in, int n_in, char *why, size_t cap) {
  if (e->dead) return snprintf(why, cap, "%s", e->dead_reason), true;
  if (ctx != e->ctx) return snprintf(why, cap, "ctx: expected %p, got %p", e->ctx, ctx), true;
  if (rt_grad_enabled() != e->grad_mode)
    return snprintf(why, cap, "grad_mode: expected %s, got %s", e->grad_mode ? "enabled" : "disabled",
                    e->grad_mode ? "disabled" : "enabled"), true;
  if (em_get_autocast_dtype() != e->autocast)
    return snprintf(why, cap, "autocast: expected %s, got %s", autocast_name(e->autocast),
                    autocast_name(em_get_autocast_dtype())), true;
  if (n_in != e->n_in) return snprintf(why, cap, "len(inputs): expected %d, got %d", e->n_in, n_in), true;
  for (int i = 0; i < e->n_host; i++) {
    const host_guard *h = &e->host[i];
    if (!memcmp(h->ptr, h->bytes, h->size)) continue;
    char was[160], now[160];
    fmt_host(was, sizeof was, h->bytes, h->size), fmt_host(now, sizeof now, h->ptr, h->size);
    return snprintf(why, cap, "%s:%d %s changed (%s -> %s)", h->site.file, h->site.line, h->what, was, now), true;
  }
  char what[32];
  int64_t syms[FE_DYN_MAX_SYMS] = {-1, -1, -1};
  for (int k = 0; k < n_in; k++) {
    snprintf(what, sizeof what, "inputs[%d]", k);
    if (e->dyn ? dyn_input_fails(e, k, in[k], syms, why, cap) : guard_fails(&e->in[k], in[k], what, why, cap)) return true;
    int j = 0;
    while (in[j] != in[k]) j++;
    if (j != e->alias[k])
      return snprintf(why, cap, "inputs[%d] %s inputs[%d]", k, j == k ? "no longer is" : "now is", e->alias[k] == k ? j : e->alias[k]), true;
    int sc = storage_class(e, in, n_in, k);
    if (sc != e->stor[k]) {
      int was = e->stor[k], now = sc;
      char a[48], b[48];
      snprintf(a, sizeof a, was < n_in ? "inputs[%d]" : "lifted[%d]", was < n_in ? was : was - n_in);
      snprintf(b, sizeof b, now < n_in ? "inputs[%d]" : "lifted[%d]", now < n_in ? now : now - n_in);
      return snprintf(why, cap, "inputs[%d] shares storage with %s, traced sharing it with %s", k, now == k ? "nothing" : b,
                      was == k ? "nothing" : a), true;
    }
  }
  for (int i = 0; i < e->n_src; i++) {
    if (e->src[i].kind != SRC_PARAM) continue;
    snprintf(what, sizeof what, "lifted[%d]", i);
    if (guard_fails(&e->src[i].guard, e->src[i].t, what, why, cap)) return true;
  }
  return false;
}

static int entry_guard_lines(const entry *e, char ***lines_out) {
  int n = 4 + e->n_in + e->n_src + e->n_host + FE_DYN_MAX_SYMS;
  char **lines = calloc((size_t)n, sizeof(char *));
  if (!lines) return 0;
  int k = 0;
  char buf[512];
  snprintf(buf, sizeof buf, "ctx == %p", e->ctx);
  lines[k++] = strdup(buf);
  snprintf(buf, sizeof buf, "grad_mode == %s", e->grad_mode ? "enabled" : "disabled");
  lines[k++] = strdup(buf);
  snprintf(buf, sizeof buf, "autocast == %s", autocast_name(e->autocast));
  lines[k++] = strdup(buf);
  snprintf(buf, sizeof buf, "len(inputs) == %d", e->n_in);
  lines[k++] = strdup(buf);
  for (int i = 0; i < e->n_host; i++) {
    char v[160];
    fmt_host(v, sizeof v, e->host[i].bytes, e->host[i].size);
    snprintf(buf, sizeof buf, "%s == %s (em_guard_value at %s:%d)", e->host[i].what, v, e->host[i].site.file,
             e->host[i].site.line);
    lines[k++] = strdup(buf);
  }
  for (int i = 0; i < e->n_in; i++) {
    char what[96];
    if (e->alias[i] != i) snprintf(what, sizeof what, "inputs[%d] (is inputs[%d])", i, e->alias[i]);
    else if (e->stor[i] != i)
      snprintf(what, sizeof what, "inputs[%d] (shares storage with %s[%d])", i, e->stor[i] < e->n_in ? "inputs" : "lifted",
               e->stor[i] < e->n_in ? e->stor[i] : e->stor[i] - e->n_in);
    else snprintf(what, sizeof what, "inputs[%d]", i);
    fmt_guard(buf, sizeof buf, what, &e->in[i]);
    if (e->dyn) { /* sizes as symbols, strides as "contiguous" */
      tguard g = e->in[i];
      char sz[200];
      size_t m = (size_t)snprintf(sz, sizeof sz, "[");
      for (int d = 0; d < g.ndim && m < sizeof sz; d++) {
        int j = e->sym_of[i][d];
        m += j < 0 ? (size_t)snprintf(sz + m, sizeof sz - m, "%s%lld", d ? "," : "", (long long)g.sizes[d])
                   : (size_t)snprintf(sz + m, sizeof sz - m, "%ss%d", d ? "," : "", j);
      }
      if (m < sizeof sz) snprintf(sz + m, sizeof sz - m, "]");
      snprintf(buf, sizeof buf, "%s: %s%s contiguous on %s, requires_grad=%s", what, em_dtype_name(g.dtype), sz,
               g.device == EM_CPU ? "cpu" : "cuda", g.requires_grad ? "true" : "false");
    }
    lines[k++] = strdup(buf);
  }
  for (int j = 0; e->dyn && j < e->n_syms; j++) {
    snprintf(buf, sizeof buf, "%lld <= s%d <= %lld%s%s%s", (long long)e->sym_min[j], j, (long long)e->sym_max[j],
             e->range_why[0] ? " (fn fails " : "", e->range_why, e->range_why[0] ? ")" : "");
    lines[k++] = strdup(buf);
  }
  for (int i = 0; i < e->n_src; i++) {
    if (e->src[i].kind != SRC_PARAM) continue;
    char what[96];
    snprintf(what, sizeof what, "lifted[%d] is tensor %p (weak reference)", i, (void *)e->src[i].t);
    fmt_guard(buf, sizeof buf, what, &e->src[i].guard);
    lines[k++] = strdup(buf);
  }
  for (int i = 0; i < k; i++)
    if (!lines[i]) {
      for (int j = 0; j < k; j++) free(lines[j]);
      free(lines);
      return 0;
    }
  *lines_out = lines;
  return k;
}

static void log_guards(const em_compiled *c, const entry *e) {
  if (!fe_log_on(FE_LOG_GUARDS)) return;
  char **lines = NULL;
  int n = entry_guard_lines(e, &lines);
  fe_log(FE_LOG_GUARDS, "guards of entry %d of %s (%s):", c->n_entries, c->name, e->has_breaks ? "with graph breaks, re-runs fn" : "replays without calling fn");
  for (int i = 0; i < n; i++) {
    fe_log(FE_LOG_GUARDS, "  %s", lines[i]);
    free(lines[i]);
  }
  free(lines);
}

/* ---- graphs ---- */

static void fe_graph_free(fe_graph *fg) {
  if (!fg) return;
  free(fg->out_root);
  ir_graph_free(fg->g);
  aot_release(fg->aot);
  ind_variants_free(&fg->ind);
  free(fg);
}

static void log_aot(em_compiled *c, const aot_compiled *a) {
  if (!fe_log_on(FE_LOG_AOT)) return;
  const aot_split *sp = aot_get_split(a);
  fe_log(FE_LOG_AOT, "%s: %s partition: forward %d nodes, backward %d nodes (%d recomputed), %d saved values, "
         "%lld bytes saved (not counting inputs)", c->name,
         c->partitioner == AOT_PARTITION_MIN_CUT ? "min-cut" : c->partitioner == AOT_PARTITION_RECOMPUTE ? "recompute" : "default",
         sp->fwd->n_nodes, sp->bwd->n_nodes, sp->n_recomputed, sp->n_saved, (long long)sp->saved_bytes);
  const ir_graph *f = sp->fwd;
  for (int k = 0; k < sp->n_saved; k++) {
    const ir_type *t = &f->values[f->outputs[f->n_outputs - sp->n_saved + k]].type;
    char b[96];
    int64_t n = ir_numel(t->ndim, t->sizes);
    fe_log(FE_LOG_AOT, "  saved %%%d : %s, %lld bytes%s", sp->saved[k], ir_fmt_ir_type(f, t, b, sizeof b),
           (long long)(n * (int64_t)ir_dtype(t->dtype)->size), f->values[f->outputs[f->n_outputs - sp->n_saved + k]].def < 0 ? " (an input)" : "");
  }
  if (fe_log_on(FE_LOG_GRAPH)) {
    char *ft = ir_print(sp->fwd, true), *bt = ir_print(sp->bwd, true);
    fe_log(FE_LOG_AOT, "forward graph of %s:\n%s", c->name, ft ? ft : "(out of memory)");
    fe_log(FE_LOG_AOT, "backward graph of %s:\n%s", c->name, bt ? bt : "(out of memory)");
    free(ft), free(bt);
  }
}

/* Per output of traced, the value whose storage it has in eager execution: views are followed
 * to their base; an input is named by its index, any other value by n_inputs + its number. */
static int *alias_roots(const ir_graph *traced) {
  int nv = traced->n_values;
  int *root = malloc(sizeof(int) * (size_t)(nv + 1)), *out = malloc(sizeof(int) * (size_t)(traced->n_outputs + 1));
  if (!root || !out) {
    free(root), free(out);
    return NULL;
  }
  for (int v = 0; v < nv; v++) root[v] = traced->n_inputs + v;
  for (int i = 0; i < traced->n_inputs; i++) root[traced->inputs[i]] = i;
  for (int i = 0; i < traced->n_nodes; i++) {
    const ir_node *n = &traced->nodes[i];
    if (prim_get(n->op)->flags & P_VIEW) root[n->out] = root[ir_operands(traced, n)[0]];
  }
  for (int k = 0; k < traced->n_outputs; k++) out[k] = root[traced->outputs[k]];
  free(root);
  return out;
}

/* Whether eager's values with roots a and b (fe_graph.out_root) share storage: one root, or two
 * inputs that share it (a view of x, called with x and a slice of x, shares the slice's storage
 * in eager too). */
static bool roots_share(em_tensor *const *in, int n_in, int a, int b) {
  return a == b || (a < n_in && b < n_in && in[a]->storage == in[b]->storage);
}

/* Outputs of a compiled graph share storage only where eager's would. Optimisation can make two
 * outputs one value (CSE: two em_scalar(0) + 1 folded to one constant) or an output an input (x * 1
 * -> x); handing out one tensor for both made them aliases that eager's are not, so a later
 * in-place write to one changed the other (issue 16: AdamW's per-parameter step counts). Such an
 * output is replaced by a copy. donate[k] >= 0: output k was written into that input on purpose.
 * Sharing that eager has stays: a view of input x when another input is a view of x's storage
 * (a copy there broke the view: a write to it no longer reached x, and its gradient went
 * through a clone node, which changed the order eager's backward adds x's gradients in: 1 ulp
 * apart, found by the fuzzer). */
static bool unalias_outputs(const fe_graph *fg, em_tensor *const *in, int n_in, em_tensor **out, const int *donate,
                            em_site site) {
  const ir_graph *g = fg->g;
  for (int k = 0; k < g->n_outputs; k++) {
    bool shared = false;
    for (int j = 0; j < k && !shared; j++)
      shared = out[j]->storage == out[k]->storage && !roots_share(in, n_in, fg->out_root[j], fg->out_root[k]);
    for (int i = 0; i < n_in && !shared && !(donate && donate[k] == i); i++)
      shared = in[i]->storage == out[k]->storage && !roots_share(in, n_in, fg->out_root[k], i);
    if (!shared) continue;
    rt_trace_suspend(); /* run_graph_so_far runs graphs while its trace is open */
    em_tensor *copy = rt_dispatch("em_call", EM_PRIM_CLONE, &out[k], 1, NULL, site);
    rt_trace_resume();
    if (!copy) return false;
    em_release(out[k]);
    out[k] = copy;
  }
  return true;
}

/* The backends. "eager" runs the graph as traced, minus dead code: passes that are exact in the
 * forward, CSE above all, can change how a backward sums gradients, and "eager" promises eager's
 * bits. "aot_eager" optimises the graph and, when grad mode is on and some input requires grad,
 * builds the joint graph and partitions it (aot_autograd/); a failure there falls back to the
 * plain graph with eager autograd, logged. */
/* How a graph is made: as the backend compiles it; op by op on the eager kernels (a dynamic
 * entry's first calls at a size); compiled with sizes as kernel arguments (a dynamic entry's
 * sizes: the kernels of every size are one module, found in the kernel cache). */
enum { TIER_STATIC, TIER_OP_BY_OP, TIER_DYNAMIC };

static fe_graph *backend_compile(em_compiled *c, const ir_graph *traced, const bool *in_rg, bool any_rg,
                                 bool has_backward, int tier, em_site site) {
  bool op_by_op = tier == TIER_OP_BY_OP;
  double t0 = now_ms();
  static uint64_t uids;
  fe_graph *fg = calloc(1, sizeof *fg);
  if (fg) fg->uid = __atomic_add_fetch(&uids, 1, __ATOMIC_RELAXED);
  ir_graph *g = fg ? ir_graph_clone(traced) : NULL;
  char err[512];
  bool aot = c->aot && !op_by_op;
  if (!g || ir_pass_dce(g) < 0 || !ir_graph_compact(g, NULL, NULL) || (aot && !ir_optimize(g, NULL))) {
    ir_graph_free(g), free(fg);
    return rt_error(site, "em_compile", "out of memory compiling a graph of %s", c->name);
  }
  fg->g = g;
  if (!(fg->out_root = alias_roots(traced))) {
    fe_graph_free(fg);
    return rt_error(site, "em_compile", "out of memory compiling a graph of %s", c->name);
  }
  if (!ir_verify(g, 0, err, sizeof err)) {
    fe_graph_free(fg);
    return rt_error(site, "em_compile", "internal error: the graph captured from %s does not verify: %s", c->name, err);
  }
  if (op_by_op) { /* a dynamic entry's first calls at a size: the graph on the eager kernels, as backend eager */
    fg->op_by_op = true;
    fg->no_grad = has_backward;
    fg->serial = (int)c->stats.graphs_compiled;
    c->stats.dynamic_op_by_op++;
    return fg;
  }
  c->stats.graphs_compiled++;
  if (fe_log_on(FE_LOG_GRAPH)) {
    char *text = ir_print(g, true);
    fe_log(FE_LOG_GRAPH, "graph %lld of %s (%d inputs, %d nodes, %d outputs):\n%s", (long long)c->stats.graphs_compiled - 1,
           c->name, g->n_inputs, g->n_nodes, g->n_outputs, text ? text : "(out of memory)");
    free(text);
  }
  fe_dump_graph(g);
  fg->no_grad = has_backward;
  fg->inductor = c->inductor;
  fg->ind.opts = c->ind_opts;
  fg->ind.opts.sizes_as_args = tier == TIER_DYNAMIC;
  fg->serial = (int)c->stats.graphs_compiled - 1;
  if (c->inductor) fe_plant(g); /* EMBER_DEBUG_PLANT_BUG: tests of the accuracy checker */
  if (c->aot && any_rg && rt_grad_enabled() && !has_backward) {
    char *saved_err = NULL;
    fg->aot = aot_compile(g, in_rg, c->partitioner, c->name, site);
    if (!fg->aot) { /* fall back to the plain graph, with eager autograd, and say why */
      const char *e = em_last_error();
      saved_err = e ? strdup(e) : NULL;
      em_clear_error();
      fe_log(FE_LOG_AOT, "%s: AOT autograd failed, running the graph with eager autograd: %s", c->name,
             saved_err ? saved_err : "?");
      fprintf(stderr, "[ember] %s: AOT autograd failed (%s); this graph runs with eager autograd\n", c->name,
              saved_err ? saved_err : "?");
      free(saved_err);
    } else {
      aot_set_inductor(fg->aot, c->inductor, &fg->ind.opts);
      c->stats.aot_graphs++;
      c->stats.aot_saved_bytes = aot_get_split(fg->aot)->saved_bytes;
      log_aot(c, fg->aot);
    }
  }
  fe_log(FE_LOG_PERF, "%s: compiled a graph of %d nodes with backend %s in %.3f ms", c->name, g->n_nodes, c->backend,
         now_ms() - t0);
  return fg;
}

/* Runs a compiled graph: the AOT pair when there is one, else the inductor's program for these
 * layouts, else the interpreter. donate: see ind_run (NULL: none). */
static bool fe_run_graph(const fe_graph *cfg, em_tensor *const *in, int n_in, em_tensor **out, const int *donate, em_site site);

/* Runs a compiled graph (fe_run_graph), then copies outputs that alias where eager's do not.
 * With the accuracy checker on, the reference runs first (before any in-place write) and the
 * outputs are compared; a difference fails the call naming the node and the user's line. With
 * EMBER_REPRO_DIR, a repro is prepared before a graph's first run (a crash writes it) and
 * written on an accuracy failure or when the inductor cannot compile the graph. */
static bool fe_run(const em_compiled *c, const fe_graph *fg, em_tensor *const *in, int n_in, em_tensor **out,
                   const int *donate, em_site site) {
  const ir_graph *g = fg->g;
  em_tensor *small[16], **ref = NULL;
  char name[96];
  snprintf(name, sizeof name, "%s_%d", c->name, fg->serial);
  if (c->accuracy && fg->traced) {
    ref = g->n_outputs <= 16 ? small : calloc((size_t)g->n_outputs, sizeof(em_tensor *));
    for (int k = 0; ref && k < g->n_outputs; k++) ref[k] = NULL;
    if (ref && !fe_reference(fg->traced, in, n_in, ref, site)) { /* no reference: nothing to check */
      for (int k = 0; k < g->n_outputs; k++) em_release(ref[k]);
      if (ref != small) free(ref);
      ref = NULL;
      em_clear_error();
    }
  }
  char *crash_dir = !fg->ran && fe_repro_root() && fg->traced
                        ? fe_write_repro(name, fg->traced, in, n_in, c->backend, c->partitioner_name, NULL, true)
                        : NULL;
  int64_t fails0 = ind_failures();
  bool ok = fe_run_graph(fg, in, n_in, out, donate, site);
  ((fe_graph *)fg)->ran = true;
  fe_repro_done(crash_dir);
  free(crash_dir);
  if (ind_failures() != fails0 && fe_repro_root() && fg->traced)
    free(fe_write_repro(name, fg->traced, in, n_in, c->backend, c->partitioner_name, "the inductor could not compile it", false));
  if (ok && !unalias_outputs(fg, in, n_in, out, donate, site)) ok = false;
  if (ok && ref) {
    char *diff = fe_check_accuracy(name, fg->traced, !strcmp(c->backend, "eager"), c->inductor, in, n_in, out, ref);
    if (diff) {
      char *dir = fe_write_repro(name, fg->traced, in, n_in, c->backend, c->partitioner_name, diff, false);
      rt_error(site, "em_call", "%s%s%s", diff, dir ? "; repro in " : "", dir ? dir : "");
      free(dir), free(diff);
      ok = false;
    }
  }
  if (ref) {
    for (int k = 0; k < g->n_outputs; k++) em_release(ref[k]);
    if (ref != small) free(ref);
  }
  if (!ok)
    for (int k = 0; k < g->n_outputs; k++) em_release(out[k]), out[k] = NULL;
  return ok;
}

static bool fe_run_graph(const fe_graph *cfg, em_tensor *const *in, int n_in, em_tensor **out, const int *donate, em_site site) {
  fe_graph *fg = (fe_graph *)cfg; /* the lazily compiled program is a cache */
  if (fg->aot) return aot_run(fg->aot, in, n_in, out, site);
  bool prev = fg->no_grad ? em_set_grad_enabled(false) : rt_grad_enabled();
  bool needs_autograd = false;
  for (int i = 0; i < n_in && !needs_autograd; i++) needs_autograd = rt_grad_enabled() && in[i]->requires_grad;
  bool takes = ind_takes_random(fg->g); /* CPU random nodes run inside the kernels (issue 20) */
  ind_program *prog = fg->inductor && !needs_autograd && takes ? ind_variant(&fg->ind, fg->g, in, n_in) : NULL;
  if (prog) { /* else the interpreter runs it */
    if (fe_planted_bug() == FE_PLANT_CRASH) raise(SIGSEGV); /* tests of the crash repro */
    bool ok = ind_run_rng(prog, in, n_in, out, donate, NULL, site);
    if (fg->no_grad) em_set_grad_enabled(prev);
    return ok;
  }
  bool ok = rt_interpret(fg->g, in, n_in, out, &(rt_interp_opts){.fresh_rng = true}, site);
  if (fg->no_grad) em_set_grad_enabled(prev);
  return ok;
}

/* Drops the least recently used graph no entry replays. Entries with breaks look their graphs
 * up again on every call, so only break-free entries pin one. */
static void evict_graph(em_compiled *c) {
  int victim = -1;
  for (int i = 0; i < c->n_graphs; i++) {
    bool pinned = false;
    for (int k = 0; k < c->n_entries && !pinned; k++) pinned = c->entries[k]->graph == c->graphs[i].compiled;
    if (!pinned && (victim < 0 || c->graphs[i].last_use < c->graphs[victim].last_use)) victim = i;
  }
  if (victim < 0) return;
  ir_graph_free(c->graphs[victim].traced);
  fe_graph_free(c->graphs[victim].compiled);
  c->graphs[victim] = c->graphs[--c->n_graphs];
  c->stats.graph_cache_evictions++;
}

/* The compiled graph for traced with these inputs, from the cache or newly compiled into it. */
static const fe_graph *lookup_or_compile(em_compiled *c, const ir_graph *traced, em_tensor *const *inputs,
                                         bool has_backward, int tier, em_site site) {
  bool op_by_op = tier == TIER_OP_BY_OP;
  uint64_t h = ir_graph_hash(traced);
  int n = traced->n_inputs;
  bool small[64], *in_rg = n <= 64 ? small : malloc(sizeof(bool) * (size_t)n), any_rg = false;
  if (!in_rg) return rt_error(site, "em_compile", "out of memory");
  uint64_t variant = (rt_grad_enabled() ? 0x9e3779b97f4a7c15ull : 0x51ed270b27ull) ^ (has_backward ? 0xb5ull : 0) ^
                     (op_by_op ? 0x6a09e667f3bcc909ull : 0);
  for (int i = 0; i < n; i++) {
    in_rg[i] = inputs[i]->requires_grad;
    any_rg |= in_rg[i];
    variant = (variant ^ (uint64_t)in_rg[i]) * 0x100000001b3ull;
  }
  const fe_graph *found = NULL;
  c->uses++;
  for (int i = 0; i < c->n_graphs && !found; i++)
    if (c->graphs[i].hash == h && c->graphs[i].variant == variant && ir_graph_same_structure(c->graphs[i].traced, traced)) {
      c->stats.graph_cache_hits++;
      c->graphs[i].last_use = c->uses;
      found = c->graphs[i].compiled;
    }
  if (!found && c->n_graphs >= GRAPH_CACHE_MAX) evict_graph(c);
  if (!found && c->n_graphs == c->cap_graphs) {
    int cap = c->cap_graphs ? 2 * c->cap_graphs : 8;
    cached_graph *p = realloc(c->graphs, sizeof(cached_graph) * (size_t)cap);
    if (p) c->graphs = p, c->cap_graphs = cap;
  }
  if (!found && c->n_graphs < c->cap_graphs) {
    ir_graph *copy = ir_graph_clone(traced);
    fe_graph *compiled = copy ? backend_compile(c, traced, in_rg, any_rg, has_backward, tier, site) : NULL;
    if (compiled) {
      compiled->traced = copy;
      c->graphs[c->n_graphs++] = (cached_graph){h, copy, variant, compiled, c->uses};
      found = compiled;
    } else {
      ir_graph_free(copy);
      if (!copy) rt_error(site, "em_compile", "out of memory");
    }
  } else if (!found) {
    rt_error(site, "em_compile", "out of memory");
  }
  if (in_rg != small) free(in_rg);
  return found;
}

/* Replay validation: where the graph traced now (b) differs from the cached entry's (a), into
 * out, naming the node and the user's line that made it: a constant first, as that is what a
 * host value baked into a trace looks like. */
static void describe_diff(const ir_graph *a, const ir_graph *b, char *out, size_t cap) {
  int n = a->n_nodes < b->n_nodes ? a->n_nodes : b->n_nodes;
  for (int i = 0; i < n; i++) {
    const ir_node *x = &a->nodes[i], *y = &b->nodes[i];
    bool same = x->op == y->op && x->n_in == y->n_in && !memcmp(ir_operands(a, x), ir_operands(b, y), sizeof(int) * (size_t)x->n_in) &&
                ir_attrs_equal(x->op, &x->attrs, &y->attrs) && ir_type_equal(&a->values[x->out].type, &b->values[y->out].type);
    if (same) continue;
    if (x->op == y->op && x->op == EM_PRIM_FULL && x->attrs.value != y->attrs.value)
      snprintf(out, cap, "%s:%d: the trace of this call differs from the cached one: a constant %.17g was %.17g (%s in %s)",
               y->site.file ? y->site.file : "?", y->site.line, y->attrs.value, x->attrs.value, y->opname,
               y->site.func ? y->site.func : "?");
    else
      snprintf(out, cap, "%s:%d: the trace of this call differs from the cached one: %s (node %d) was %s at %s:%d", y->site.file ? y->site.file : "?",
               y->site.line, y->opname, i, x->opname, x->site.file ? x->site.file : "?", x->site.line);
    return;
  }
  if (a->n_nodes != b->n_nodes || a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs)
    snprintf(out, cap, "the trace of this call differs from the cached one: %d nodes, %d inputs, %d outputs (cached: %d, %d, %d)",
             b->n_nodes, b->n_inputs, b->n_outputs, a->n_nodes, a->n_inputs, a->n_outputs);
  else
    snprintf(out, cap, "the trace of this call differs from the cached one in its inputs or outputs");
}

static void note_graph(run_state *rs, const ir_graph *g) {
  if (rs->n_graphs < (int)(sizeof rs->ops / sizeof rs->ops[0])) rs->ops[rs->n_graphs] = g->n_nodes;
  rs->n_graphs++;
}

/* What the last graph of a run did, for the entry that will replay it. */
typedef struct final_info {
  const fe_graph *cg;
  int n_wb;
  int *wb_lifted, *wb_out;   /* lifted tensor i was written: graph output k is its new value */
  em_tensor **materialized;  /* proxies made real (owned refs), to find what escaped the run */
  int n_mat;
  /* proxies that view a lifted tensor the graph wrote, rebuilt as views of it after the write-back */
  int n_alias;
  em_tensor **alias_t;       /* owned refs */
  int *alias_root;           /* lifted index */
  int *alias_n;
  view_link (*alias_links)[8];
} final_info;

static void final_info_free(final_info *fi) {
  for (int i = 0; i < fi->n_mat; i++) em_release(fi->materialized[i]);
  for (int i = 0; i < fi->n_alias; i++) em_release(fi->alias_t[i]);
  free(fi->alias_t), free(fi->alias_root), free(fi->alias_n), free(fi->alias_links);
  free(fi->materialized), free(fi->wb_lifted), free(fi->wb_out);
  memset(fi, 0, sizeof *fi);
}

/* A mutated input's new value (graph output src) into the input dst. A CPU tensor a CUDA graph
 * updated (an optimizer's step count: a 0-dim f64 on the CPU, as in PyTorch) comes back to the
 * CPU first: em_copy_ writes only from operands on its destination's device. */
static bool write_back(em_tensor *dst, em_tensor *src, em_site site) {
  bool across = src && dst && src->storage->device != dst->storage->device;
  em_tensor *moved = across ? rt_to_device(src, dst->storage->device, "em_call", site) : NULL;
  if (across && !moved) return false; /* the error is recorded */
  bool ok = em_copy__at(dst, moved ? moved : src, site) != NULL;
  em_release(moved);
  return ok;
}

/* Runs the trace's current graph on its lifted inputs, materializes the live proxies and writes
 * the new values of lifted tensors written in place back into them (functionalization's
 * epilogue). With fi, reports what it did. */
static bool run_graph_so_far(run_state *rs, rt_trace *tr, em_site site, final_info *fi) {
  rt_trace_drop_history(tr);
  if (!rt_trace_output_live(tr)) return rt_error(site, "em_compile", "out of memory"), false;
  ir_graph *g = tr->g;
  int *wbl = malloc(sizeof(int) * (size_t)(tr->n_lifted + 1)), *wbo = malloc(sizeof(int) * (size_t)(tr->n_lifted + 1));
  int n_wb = 0;
  bool ok = wbl && wbo;
  for (int i = 0; ok && i < tr->n_lifted; i++)
    if (tr->lifted_mutated[i]) {
      wbl[n_wb] = i, wbo[n_wb++] = g->n_outputs;
      ok = ir_add_output(g, tr->lifted_value[i]);
    }
  if (!ok) {
    free(wbl), free(wbo);
    return rt_error(site, "em_compile", "out of memory"), false;
  }
  if (g->n_nodes == 0) {
    free(wbl), free(wbo);
    return true;
  }
  const fe_graph *cg = lookup_or_compile(rs->c, g, tr->lifted, tr->has_backward, rs->tier, site);
  em_tensor **outs = cg ? calloc((size_t)(g->n_outputs ? g->n_outputs : 1), sizeof(em_tensor *)) : NULL;
  em_tensor **mat = fi && cg ? calloc((size_t)(tr->live_proxies + 1), sizeof(em_tensor *)) : NULL;
  if (!cg || !outs || (fi && !mat)) {
    free(wbl), free(wbo), free(outs), free(mat);
    return cg ? (rt_error(site, "em_compile", "out of memory"), false) : false;
  }
  note_graph(rs, cg->g);
  if (rs->check && !rs->check_diff[0] && rs->check_traced && !ir_graph_same_structure(rs->check_traced, g))
    describe_diff(rs->check_traced, g, rs->check_diff, sizeof rs->check_diff);
  /* live views of lifted tensors the graph writes: after the write-back they are rebuilt as
   * views of those tensors, so aliasing stays as in eager */
  final_info al = {0};
  if (n_wb) {
    al.alias_t = calloc((size_t)tr->live_proxies + 1, sizeof(em_tensor *));
    al.alias_root = calloc((size_t)tr->live_proxies + 1, sizeof(int));
    al.alias_n = calloc((size_t)tr->live_proxies + 1, sizeof(int));
    al.alias_links = calloc((size_t)tr->live_proxies + 1, sizeof *al.alias_links);
    if (!al.alias_t || !al.alias_root || !al.alias_n || !al.alias_links) {
      final_info_free(&al);
      free(wbl), free(wbo), free(outs), free(mat);
      return rt_error(site, "em_compile", "out of memory"), false;
    }
    for (int i = 0; i < tr->n_proxies; i++) {
      em_tensor *p = tr->proxies[i], *q = p;
      int nl = 0;
      if (!p) continue;
      view_link links[8];
      while (q->proxy && q->view_base && q->view_graph == tr->graph_serial && nl < 8) {
        links[nl++] = (view_link){g->nodes[q->view_node].op, g->nodes[q->view_node].attrs};
        q = q->view_base;
      }
      if (q->proxy || nl == 0) continue;
      for (int j = 0; j < n_wb; j++)
        if (tr->lifted[wbl[j]] == q) {
          al.alias_t[al.n_alias] = em_retain(p);
          al.alias_root[al.n_alias] = wbl[j];
          al.alias_n[al.n_alias] = nl;
          memcpy(al.alias_links[al.n_alias++], links, sizeof links);
        }
    }
  }
  ok = fe_run(rs->c, cg, tr->lifted, tr->n_lifted, outs, NULL, site);
  int n_mat = 0;
  if (ok && mat)
    for (int i = 0; i < tr->n_proxies; i++)
      if (tr->proxies[i]) mat[n_mat++] = em_retain(tr->proxies[i]);
  if (ok) rt_trace_materialize(tr, outs);
  if (ok && n_wb) {
    rt_trace_suspend();
    bool prev = em_set_grad_enabled(false);
    for (int j = 0; ok && j < n_wb; j++) ok = write_back(tr->lifted[wbl[j]], outs[wbo[j]], site);
    em_set_grad_enabled(prev);
    for (int a = 0; ok && a < al.n_alias; a++) {
      em_tensor *v = apply_links(tr->lifted[al.alias_root[a]], al.alias_links[a], al.alias_n[a], site);
      if (v) rt_tensor_become(al.alias_t[a], v);
      em_release(v);
      ok = v != NULL;
    }
    rt_trace_resume();
  }
  for (int i = 0; i < g->n_outputs; i++) em_release(outs[i]);
  free(outs);
  if (fi) {
    *fi = al;
    fi->cg = cg, fi->n_wb = n_wb, fi->wb_lifted = wbl, fi->wb_out = wbo, fi->materialized = mat, fi->n_mat = n_mat;
  } else {
    final_info_free(&al);
    free(wbl), free(wbo);
  }
  return ok;
}

static bool on_break(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) {
  run_state *rs = ctx;
  em_compiled *c = rs->c;
  if (rs->probe) return rt_error(site, op, "a graph break (%s)", reason), false;
  if (c->fullgraph)
    return rs->refused = true, rt_error(site, op, "graph break in %s compiled with fullgraph: %s (in %s)", c->name, reason,
                    site.func ? site.func : "?"), false;
  if (rs->n_breaks < (int)(sizeof rs->breaks / sizeof rs->breaks[0]))
    rs->breaks[rs->n_breaks] = (em_graph_break_info){op, reason, site.file, site.func, site.line};
  rs->n_breaks++;
  c->stats.breaks++;
  if (rs->check && !rs->check_diff[0])
    snprintf(rs->check_diff, sizeof rs->check_diff, "%s:%d: the trace of this call differs from the cached one: it breaks "
             "the graph here (%s %s)", site.file, site.line, op, reason);
  fe_log(FE_LOG_GRAPH_BREAKS, "graph break in %s at %s:%d in %s: %s %s", c->name, site.file, site.line,
         site.func ? site.func : "?", op, reason);
  if (!run_graph_so_far(rs, tr, site, NULL)) return false;
  return rt_trace_reset(tr, c->name) || (rt_error(site, "em_compile", "out of memory"), false);
}

/* ---- running fn under the tracer ---- */

static int find_source(const entry *e, const em_tensor *t) {
  for (int i = 0; i < e->n_src; i++)
    if (e->src[i].kind != SRC_ARG && e->src[i].t == t) return i;
  return -1;
}

static bool add_source(entry *e, const rt_trace *tr, em_tensor *t, em_tensor *const *in, int n_in) {
  source s = {.guard = guard_of(t), .arg = -1};
  for (int k = 0; k < n_in && s.arg < 0; k++)
    if (in[k] == t) s.kind = SRC_ARG, s.arg = k;
  if (s.arg < 0) {
    s.t = t;
    s.kind = t->serial > tr->serial_start ? SRC_CONST : SRC_PARAM;
    if (s.kind == SRC_CONST) em_retain(t);
    else if (!rt_watch(t, entry_tensor_died, e)) return false;
  }
  e->src[e->n_src++] = s;
  return true;
}

static int source_of(entry *e, const rt_trace *tr, em_tensor *t, em_tensor *const *in, int n_in) {
  for (int k = 0; k < n_in; k++)
    if (in[k] == t)
      for (int j = 0; j < e->n_src; j++)
        if (e->src[j].kind == SRC_ARG && e->src[j].arg == k) return j;
  int s = find_source(e, t);
  if (s >= 0) return s;
  return add_source(e, tr, t, in, n_in) ? e->n_src - 1 : -1;
}

/* A new entry. Without breaks it replays: its sources, output map, epilogue and guards. fo_val
 * are the graph values of fn's outputs (-1 for real tensors), gval those of the grad leaves'
 * .grad (-1 none, -2 a real tensor left as it was). */
static entry *make_entry(em_compiled *c, const rt_trace *tr, const final_info *fi, const run_state *rs, void *ctx,
                         em_tensor *const *in, int n_in, const em_outputs *o, const int *fo_val, const int *gval,
                         bool has_breaks) {
  entry *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  if (rs->n_host) {
    if (!(e->host = malloc(sizeof(host_guard) * (size_t)rs->n_host))) goto oom;
    memcpy(e->host, rs->host, sizeof(host_guard) * (size_t)rs->n_host);
    e->n_host = rs->n_host;
  }
  e->ctx = ctx;
  e->grad_mode = rt_grad_enabled();
  e->autocast = em_get_autocast_dtype();
  e->n_in = n_in;
  e->has_breaks = has_breaks;
  e->in = malloc(sizeof(tguard) * (size_t)(n_in ? n_in : 1));
  e->alias = malloc(sizeof(int) * (size_t)(n_in ? n_in : 1));
  e->stor = malloc(sizeof(int) * (size_t)(n_in ? n_in : 1));
  e->src = malloc(sizeof(source) * (size_t)(tr->n_lifted + o->n + tr->n_grad_leaves + 1));
  e->wb = malloc(sizeof *e->wb * (size_t)(fi->n_wb + 1));
  e->gb = malloc(sizeof *e->gb * (size_t)(tr->n_grad_leaves + 1));
  if (!e->in || !e->alias || !e->stor || !e->src || !e->wb || !e->gb) goto oom;
  for (int k = 0; k < n_in; k++) {
    e->in[k] = guard_of(in[k]);
    int j = 0;
    while (in[j] != in[k]) j++;
    e->alias[k] = j;
  }
  for (int k = 0; k < n_in; k++) e->stor[k] = storage_class(e, in, n_in, k);
  if (has_breaks) return e;
  e->has_backward = tr->has_backward;
  e->graph = fi->cg;
  for (int i = 0; i < c->n_graphs && !e->traced; i++)
    if (c->graphs[i].compiled == fi->cg) e->traced = c->graphs[i].traced;
  for (int i = 0; i < tr->n_lifted; i++)
    if (!add_source(e, tr, tr->lifted[i], in, n_in)) goto oom;
  for (int k = 0; k < n_in; k++) e->stor[k] = storage_class(e, in, n_in, k);
  const ir_graph *g = tr->g;
  e->n_out = o->n;
  for (int i = 0; i < o->n; i++) {
    int a = -1;
    for (int j = 0; j < fi->n_alias && a < 0; j++)
      if (fi->alias_t[j] == o->t[i]) a = j;
    if (a >= 0) {
      int s = source_of(e, tr, tr->lifted[fi->alias_root[a]], in, n_in);
      view_link *l = malloc(sizeof(view_link) * 8);
      if (s < 0 || !l) {
        free(l);
        goto oom;
      }
      memcpy(l, fi->alias_links[a], sizeof(view_link) * 8);
      e->out[i] = (outmap){false, s, fi->alias_n[a], l};
      continue;
    }
    int k = -1;
    for (int j = 0; fo_val[i] >= 0 && j < g->n_outputs && k < 0; j++)
      if (g->outputs[j] == fo_val[i]) k = j;
    if (k >= 0) {
      e->out[i] = (outmap){true, k, 0, NULL};
    } else {
      int s = source_of(e, tr, o->t[i], in, n_in);
      if (s < 0) goto oom;
      e->out[i] = (outmap){false, s, 0, NULL};
    }
  }
  for (int j = 0; j < fi->n_wb; j++) e->wb[e->n_wb][0] = fi->wb_lifted[j], e->wb[e->n_wb++][1] = fi->wb_out[j];
  for (int j = 0; j < tr->n_grad_leaves; j++) {
    if (gval[j] == -2) continue; /* a real .grad left in place (written back if it was updated) */
    int k = -1;
    for (int m = 0; gval[j] >= 0 && m < g->n_outputs && k < 0; m++)
      if (g->outputs[m] == gval[j]) k = m;
    int s = source_of(e, tr, tr->grad_leaves[j], in, n_in);
    if (s < 0) goto oom;
    e->gb[e->n_gb][0] = s, e->gb[e->n_gb++][1] = k;
  }
  return e;
oom:
  entry_free(e);
  return NULL;
}

static em_outputs failed_outputs(int n) {
  em_outputs r = {.n = n < 0 ? 0 : n > EM_MAX_OUTPUTS ? EM_MAX_OUTPUTS : n};
  return r;
}

/* Runs fn under a new trace. With want_entry, a run also yields a new entry (*made) unless it
 * is unstable (it left new tensors in state outside fn: retraced next call); an existing entry
 * with breaks passes want_entry false. Results are caller-owned references in res. */
static bool run_traced_impl(em_compiled *c, void *ctx, em_tensor *const *in, int n_in, run_state *rs, bool want_entry,
                       entry **made, em_outputs *res, em_site site);

static bool run_traced(em_compiled *c, void *ctx, em_tensor *const *in, int n_in, run_state *rs, bool want_entry,
                       entry **made, em_outputs *res, em_site site) {
  if (!RT_PROF_ON()) return run_traced_impl(c, ctx, in, n_in, rs, want_entry, made, res, site);
  uint64_t t0_ = rt_prof_now();
  bool r_ = run_traced_impl(c, ctx, in, n_in, rs, want_entry, made, res, site);
  rt_prof_complete("phase", "trace", t0_, "%s at %s:%d", c->name, site.file, site.line);
  return r_;
}

static bool run_traced_impl(em_compiled *c, void *ctx, em_tensor *const *in, int n_in, run_state *rs, bool want_entry,
                       entry **made, em_outputs *res, em_site site) {
  double t0 = now_ms();
  rt_trace tr;
  *res = failed_outputs(0);
  if (made) *made = NULL;
  if (!rt_trace_begin(&tr, c->name, on_break, rs, site)) return false;
  if (!em_scope_begin_at(site)) {
    rt_trace_end(&tr);
    return false;
  }
  if (!rs->check) c->stats.traces++; /* a validation trace counts as a check */
  bool error_before = rt_has_error();
  em_outputs o = c->fn(ctx, in, n_in);
  bool ok = !rs->refused;
  /* an op fn called failed but fn still returned tensors (the failed result went unused): a
   * replay would skip the op and drop the error, so the trace is not cached (issue 16) */
  bool raised = !error_before && rt_has_error();
  if (o.n < 0 || o.n > EM_MAX_OUTPUTS) {
    rt_error(site, "em_call", "%s returned %d outputs (0 to %d allowed)", c->name, o.n, EM_MAX_OUTPUTS);
    o.n = 0;
    ok = false;
  }
  for (int i = 0; ok && i < o.n; i++)
    if (!o.t[i]) {
      if (!rt_has_error()) rt_error(site, "em_call", "%s returned NULL as output %d", c->name, i);
      ok = false;
    }
  int fo_val[EM_MAX_OUTPUTS];
  bool retained = ok; /* then we hold a reference to each output */
  for (int i = 0; retained && i < o.n; i++) fo_val[i] = rt_trace_value_of(&tr, em_retain(o.t[i]));
  int *gval = malloc(sizeof(int) * (size_t)(tr.n_grad_leaves + 1));
  if (!gval) ok = (rt_error(site, "em_call", "out of memory"), false);
  for (int j = 0; ok && j < tr.n_grad_leaves; j++) {
    em_tensor *gr = tr.grad_leaves[j]->grad;
    gval[j] = !gr ? -1 : rt_trace_value_of(&tr, gr) >= 0 ? rt_trace_value_of(&tr, gr) : -2;
  }
  em_scope_end_at(site); /* what only fn held dies here, while the trace still knows its proxies */
  /* The last graph, run like the graph before a break: everything alive becomes real. */
  final_info fi = {0};
  if (ok) ok = run_graph_so_far(rs, &tr, site, &fi);
  bool stable = true;
  for (int m = 0; ok && m < fi.n_mat; m++) {
    /* The references a tensor made while tracing may have: ours, one per output slot and .grad
     * it fills, one per view of it we hold, ours as a view to rebuild. Any other is state that escaped fn (a tensor stored
     * into ctx or a static, an RNN's hidden state), which a replay would not update: it would
     * keep reading the first call's tensor (issue 16). Counting by identity alone missed a
     * tensor that is both returned and stored. */
    em_tensor *t = fi.materialized[m];
    int64_t known = 1;
    for (int i = 0; i < o.n; i++) known += t == o.t[i];
    for (int j = 0; j < tr.n_grad_leaves; j++) known += t == tr.grad_leaves[j]->grad;
    for (int k = 0; k < fi.n_mat; k++) known += fi.materialized[k]->view_base == t;
    for (int k = 0; k < fi.n_alias; k++) known += fi.alias_t[k] == t; /* views rebuilt after a write-back */
    bool expected = t->refcount <= known;
    if (!expected) {
      stable = false;
      if (fe_log_on(FE_LOG_RECOMPILES)) {
        char b[128];
        fe_log(FE_LOG_RECOMPILES, "%s: %s made while tracing is still referenced outside the function", c->name,
               rt_fmt(b, sizeof b, t));
      }
    }
  }
  if (ok && rs->check && !rs->check_diff[0]) { /* the tensors the graph reads are the entry's */
    const entry *e = rs->check;
    for (int i = 0; i < tr.n_lifted && i < e->n_src && !rs->check_diff[0]; i++) {
      const source *sr = &e->src[i];
      em_tensor *was = sr->kind == SRC_ARG ? in[sr->arg] : sr->t;
      if (sr->kind != SRC_CONST && was != tr.lifted[i]) {
        char b[128];
        snprintf(rs->check_diff, sizeof rs->check_diff, "the trace of this call differs from the cached one: graph input %d "
                 "is another tensor (%s) than the one the entry reads (ctx points at new tensors?)", i, rt_fmt(b, sizeof b, tr.lifted[i]));
      }
    }
    if (!rs->check_diff[0] && !stable)
      snprintf(rs->check_diff, sizeof rs->check_diff, "the trace of this call differs from the cached one: it leaves new "
               "tensors in state outside the function");
  }
  if (ok) {
    res->n = o.n;
    for (int i = 0; i < o.n; i++) res->t[i] = o.t[i]; /* our references; real now */
    if (want_entry && raised) {
      c->stats.uncached_traces++;
      fe_log(FE_LOG_RECOMPILES, "%s: not caching this trace: an op failed while tracing (%s); every call runs fn so the "
             "error is raised every time", c->name, em_last_error());
    } else if (want_entry && (stable || rs->n_breaks > 0)) {
      *made = make_entry(c, &tr, &fi, rs, ctx, in, n_in, &o, fo_val, gval, rs->n_breaks > 0);
      if (!*made) ok = (rt_error(site, "em_call", "out of memory recording a cache entry"), false);
    } else if (want_entry) {
      c->stats.uncached_traces++;
      fe_log(FE_LOG_RECOMPILES, "%s: not caching this trace: it left new tensors in state outside the function "
             "(optimizer state made on a first step, a hidden state stored into ctx?); the next call traces again", c->name);
    }
  }
  final_info_free(&fi);
  free(gval);
  rt_trace_end(&tr);
  if (!ok) {
    for (int i = 0; retained && i < o.n; i++) em_release(o.t[i]);
    *res = failed_outputs(o.n);
  }
  fe_log(FE_LOG_PERF, "%s: traced %d ops into %d graph(s) with %d break(s) in %.3f ms", c->name, tr.n_ops, rs->n_graphs,
         rs->n_breaks, now_ms() - t0);
  return ok;
}

/* ---- dynamic shapes (see ember.h, "Dynamic shapes", and dynamic.c) ---- */

/* Which dims of the inputs are symbolic in the entry traced now: marked dynamic, or changed
 * size since an earlier entry (automatic), or all (EM_DYNAMIC_ALWAYS); never a marked-static
 * dim or a size below 2. Dims of equal size share a symbol (duck sizing). Fills sym_of (-1:
 * fixed) and the symbols' sizes and ranges; returns the number of symbols, 0 for none, or -1
 * when there would be more than FE_DYN_MAX_SYMS (then the entry specializes). */
static int plan_symbols(const em_compiled *c, em_tensor *const *in, int n_in, int8_t (*sym_of)[EM_MAX_DIMS], int64_t *size,
                        int64_t *lo, int64_t *hi) {
  int n = 0;
  for (int k = 0; k < n_in; k++) {
    const em_tensor *t = in[k];
    const rt_dyn_marks *m = t->marks;
    for (int d = 0; d < EM_MAX_DIMS; d++) sym_of[k][d] = -1;
    if (c->dynamic == EM_DYNAMIC_NEVER) continue;
    for (int d = 0; d < t->ndim; d++) {
      bool marked = m && (m->dynamic >> d & 1), fixed = m && (m->fixed >> d & 1);
      bool want = marked || c->dynamic == EM_DYNAMIC_ALWAYS || (k < c->auto_n && (c->auto_dims[k] >> d & 1));
      int64_t mn = marked ? m->min[d] : 2, mx = marked ? m->max[d] : 65536;
      if (!want || fixed || t->sizes[d] < 2 || t->sizes[d] < mn || t->sizes[d] > mx) continue;
      int j = 0;
      while (j < n && size[j] != t->sizes[d]) j++;
      if (j == n) {
        if (n == FE_DYN_MAX_SYMS) return -1;
        size[n] = t->sizes[d], lo[n] = mn, hi[n] = mx, n++;
      } else { /* a shared symbol takes the tighter range */
        if (mn > lo[j]) lo[j] = mn;
        if (mx < hi[j]) hi[j] = mx;
      }
      sym_of[k][d] = (int8_t)j;
    }
  }
  return n;
}

/* The automatic half of EM_DYNAMIC_AUTO: entry e failed for this call; when it was made for the
 * same ctx, grad mode and input ranks and dtypes, the dims whose sizes differ become symbolic in
 * the next trace (torch's automatic_dynamic_shapes). */
static void note_changed_sizes(em_compiled *c, const entry *e, void *ctx, em_tensor *const *in, int n_in) {
  if (c->dynamic != EM_DYNAMIC_AUTO || e->dead || e->ctx != ctx || e->n_in != n_in || e->grad_mode != rt_grad_enabled() ||
      e->has_breaks)
    return;
  for (int k = 0; k < n_in; k++)
    if (e->in[k].ndim != in[k]->ndim || e->in[k].dtype != in[k]->dtype || e->in[k].device != in[k]->storage->device)
      return;
  if (c->auto_n < n_in) {
    uint8_t *p = realloc(c->auto_dims, (size_t)n_in);
    if (!p) return;
    memset(p + c->auto_n, 0, (size_t)(n_in - c->auto_n));
    c->auto_dims = p, c->auto_n = n_in;
  }
  for (int k = 0; k < n_in; k++)
    for (int d = 0; d < in[k]->ndim; d++) {
      bool fixed = !e->dyn || e->sym_of[k][d] < 0;
      if (fixed && e->in[k].sizes[d] != in[k]->sizes[d]) c->auto_dims[k] |= (uint8_t)(1u << d);
    }
}

/* Data-less stand-ins for the inputs at probe sizes: rt_new_external over no memory of its own
 * (a probe trace reads no data: a break fails it first). */
static unsigned char probe_bytes[64];
static void probe_release(void *ctx) { (void)ctx; } /* nothing to free; not Ember's bytes either */

/* Releases the stand-ins among pin[0..n) (an input passed twice has one). */
static void release_stand_ins(em_tensor **pin, em_tensor *const *in, int n) {
  for (int k = 0; k < n; k++) {
    bool first = pin[k] != in[k];
    for (int j = 0; j < k && first; j++) first = pin[j] != pin[k];
    if (first) em_release(pin[k]);
  }
}

/* What a traced tensor is, across traces: input k (through its stand-in) as -1 - k, else its
 * address (a parameter reached through ctx), as an integer. */
static intptr_t identity(const em_tensor *t, em_tensor *const *pin, int n_in) {
  for (int k = 0; k < n_in; k++)
    if (pin[k] == t) return -1 - (intptr_t)k;
  return (intptr_t)t;
}

/* Traces fn on stand-ins of the inputs with symbol j's dims at hints[j], without running
 * anything, and returns the graph as run_graph_so_far would hand it to the backend, or NULL
 * with the reason in why. The trace must read the same tensors, return the same outputs and set
 * the same gradients as the entry's trace; fn's effects on tensors are only recorded (an
 * in-place update is functionalized), and .grad fields it sets are restored. */
static _Thread_local bool probe_errored; /* the last probe failed because fn raised an error (a size it cannot take) */

static ir_graph *probe_trace(em_compiled *c, const entry *e, const ir_graph *base, void *ctx, em_tensor *const *in,
                             int n_in, const int64_t *hints, char *why, size_t cap, em_site site) {
  probe_errored = false;
  em_tensor *small_pin[16], **pin = n_in <= 16 ? small_pin : calloc((size_t)n_in, sizeof(em_tensor *));
  em_tensor *small_old[16], **old = e->n_gb <= 16 ? small_old : calloc((size_t)e->n_gb, sizeof(em_tensor *));
  if (!pin || !old) {
    if (pin != small_pin) free(pin);
    if (old != small_old) free(old);
    return snprintf(why, cap, "out of memory"), NULL;
  }
  ir_graph *out = NULL;
  rt_trace tr = {0};
  for (int k = 0; k < n_in; k++) {
    pin[k] = in[k];
    bool sym = false;
    int64_t sz[EM_MAX_DIMS];
    for (int d = 0; d < in[k]->ndim; d++) {
      sz[d] = e->sym_of[k][d] >= 0 ? hints[e->sym_of[k][d]] : in[k]->sizes[d];
      sym |= e->sym_of[k][d] >= 0;
    }
    for (int j = 0; j < k && sym; j++)
      if (in[j] == in[k]) pin[k] = pin[j], sym = false;
    if (!sym) continue;
    int64_t numel = 1;
    for (int d = 0; d < in[k]->ndim; d++) ir_mul_ok(numel, sz[d], &numel);
    pin[k] = rt_new_external(in[k]->dtype, in[k]->ndim, sz, NULL, 0, in[k]->storage->device, probe_bytes,
                             (size_t)numel * ir_dtype(in[k]->dtype)->size, probe_release, NULL, "em_call", site);
    if (!pin[k]) {
      pin[k] = in[k];
      release_stand_ins(pin, in, k);
      snprintf(why, cap, "%s", em_last_error() ? em_last_error() : "no stand-in");
      goto done;
    }
    pin[k]->requires_grad = in[k]->requires_grad;
  }
  /* the gradients fn's backward will set: the real ones, kept aside */
  for (int i = 0; i < e->n_gb; i++) {
    const source *sr = &e->src[e->gb[i][0]];
    em_tensor *leaf = sr->kind == SRC_ARG ? in[sr->arg] : sr->t;
    old[i] = em_retain(leaf->grad);
  }
  run_state rs = {.c = c, .site = site, .probe = true};
  if (!rt_trace_begin(&tr, c->name, on_break, &rs, site)) {
    snprintf(why, cap, "out of memory");
    goto restore;
  }
  tr.max_nodes = base->n_nodes + 1;
  c->stats.probe_traces++;
  em_scope_begin_at(site);
  em_outputs o = c->fn(ctx, pin, n_in);
  bool ok = !rt_has_error() && o.n == e->n_out;
  probe_errored = rt_has_error();
  if (!ok) snprintf(why, cap, "%s", rt_has_error() ? em_last_error() : "fn returned another number of outputs");
  int fo_val[EM_MAX_OUTPUTS];
  int n_kept = 0;
  for (int i = 0; ok && i < o.n; i++) {
    if (!o.t[i]) ok = (snprintf(why, cap, "fn returned NULL"), false);
    else fo_val[i] = rt_trace_value_of(&tr, em_retain(o.t[i])), n_kept = i + 1;
  }
  int gv[64];
  int n_gl = tr.n_grad_leaves;
  for (int j = 0; ok && j < n_gl && j < 64; j++) {
    em_tensor *gr = tr.grad_leaves[j]->grad;
    gv[j] = !gr ? -1 : rt_trace_value_of(&tr, gr) >= 0 ? rt_trace_value_of(&tr, gr) : -2;
  }
  if (ok && n_gl > 64) ok = (snprintf(why, cap, "more than 64 gradients"), false);
  em_scope_end_at(site);
  ir_graph *g = tr.g;
  if (ok) { /* the graph as run_graph_so_far completes it */
    rt_trace_drop_history(&tr);
    ok = rt_trace_output_live(&tr);
    for (int i = 0; ok && i < tr.n_lifted; i++)
      if (tr.lifted_mutated[i]) ok = ir_add_output(g, tr.lifted_value[i]);
    if (!ok) snprintf(why, cap, "out of memory");
  }
  /* the same tensors in, the same outputs and gradients out */
  if (ok && tr.n_lifted != base->n_inputs) ok = (snprintf(why, cap, "fn reads other tensors at other sizes"), false);
  for (int i = 0; ok && i < tr.n_lifted; i++) {
    const source *sr = &e->src[i];
    intptr_t want = sr->kind == SRC_ARG ? -1 - (intptr_t)sr->arg : (intptr_t)sr->t;
    if (identity(tr.lifted[i], pin, n_in) != want) ok = (snprintf(why, cap, "fn reads other tensors at other sizes"), false);
  }
  for (int i = 0; ok && i < o.n; i++) {
    const outmap *m = &e->out[i];
    bool same = m->from_graph ? m->index < g->n_outputs && g->outputs[m->index] == fo_val[i]
                              : fo_val[i] < 0 && identity(o.t[i], pin, n_in) == (e->src[m->index].kind == SRC_ARG
                                                                                    ? -1 - (intptr_t)e->src[m->index].arg
                                                                                    : (intptr_t)e->src[m->index].t);
    if (!same) ok = (snprintf(why, cap, "fn returns other tensors at other sizes (output %d)", i), false);
  }
  int n_set = 0;
  for (int j = 0; ok && j < n_gl; j++) {
    if (gv[j] == -2) continue;
    n_set++;
    int k = -1;
    for (int m = 0; gv[j] >= 0 && m < g->n_outputs && k < 0; m++)
      if (g->outputs[m] == gv[j]) k = m;
    bool found = false;
    for (int i = 0; i < e->n_gb && !found; i++) {
      const source *sr = &e->src[e->gb[i][0]];
      intptr_t want = sr->kind == SRC_ARG ? -1 - (intptr_t)sr->arg : (intptr_t)sr->t;
      found = identity(tr.grad_leaves[j], pin, n_in) == want && e->gb[i][1] == k;
    }
    if (!found) ok = (snprintf(why, cap, "fn sets other gradients at other sizes"), false);
  }
  if (ok && n_set != e->n_gb) ok = (snprintf(why, cap, "fn sets other gradients at other sizes"), false);
  if (ok && !(out = ir_graph_clone(g))) snprintf(why, cap, "out of memory");
  for (int i = 0; i < n_kept; i++) em_release(o.t[i]);
  em_clear_error(); /* make_dynamic probes only with no error recorded: this one is the probe's */
restore:
  for (int i = 0; i < e->n_gb; i++) { /* the real gradients back, before the trace ends */
    const source *sr = &e->src[e->gb[i][0]];
    em_tensor *leaf = sr->kind == SRC_ARG ? in[sr->arg] : sr->t;
    em_release(leaf->grad);
    leaf->grad = old[i];
  }
  if (tr.g) rt_trace_end(&tr);
  release_stand_ins(pin, in, n_in);
done:
  if (pin != small_pin) free(pin);
  if (old != small_old) free(old);
  return out;
}

/* One try at the formulas of the symbols in sym_of (k of them, of sizes size): the corners,
 * the interpolation, the three checks. e->sym_of is set to sym_of for the probes. Returns the
 * template, or NULL with why. */
static fe_dyn *try_symbols(em_compiled *c, entry *e, void *ctx, em_tensor *const *in, int n_in,
                           int8_t (*sym_of)[EM_MAX_DIMS], int k, const int64_t *size, const int64_t *delta,
                           const int64_t (*check)[FE_DYN_MAX_SYMS], bool *errored, int *n_probes, char *why, size_t cap,
                           em_site site) {
  const ir_graph *base = e->traced;
  *errored = false;
  ir_graph *g[1 << FE_DYN_MAX_SYMS] = {0};
  fe_dyn *d = NULL;
  int n = 1 << k;
  why[0] = 0;
  memcpy(e->sym_of, sym_of, sizeof *e->sym_of * (size_t)n_in);
  e->n_syms = k;
  g[0] = (ir_graph *)base;
  for (int m = 1; !why[0] && m < n; m++) {
    int64_t h[FE_DYN_MAX_SYMS];
    for (int j = 0; j < k; j++) h[j] = size[j] + (m >> j & 1 ? delta[j] : 0);
    g[m] = probe_trace(c, e, base, ctx, in, n_in, h, why, cap, site);
    *errored |= probe_errored;
    (*n_probes)++;
  }
  if (!why[0]) d = fe_dyn_decode((const ir_graph *const *)g, k, size, delta, why, cap);
  for (int p = 0; d && !why[0] && p < 3; p++) {
    int64_t h[FE_DYN_MAX_SYMS];
    for (int j = 0; j < k; j++) h[j] = check[p][j];
    ir_graph *v = probe_trace(c, e, base, ctx, in, n_in, h, why, cap, site);
    *errored |= probe_errored;
    (*n_probes)++;
    if (v && !fe_dyn_check(d, v, h, why, cap) && !why[0]) snprintf(why, cap, "a check failed");
    ir_graph_free(v);
  }
  for (int m = 1; m < n; m++) ir_graph_free(g[m]);
  if (why[0]) fe_dyn_free(d), d = NULL;
  return d;
}

/* Probes at the default sizes (corners 1009 past the real sizes, checks up to 65521) suit a
 * function that takes any size. One that cannot (a position table of 64 rows sliced at T) errors
 * there: then the corners move in only as far as fn still runs (the largest step D <= 1008 at
 * which a trace at size + D succeeds, by bisection), the checks lie inside [2, size + D], and
 * the symbols' range ends at size + D. Returns the template or NULL; *hi_out: the range's end. */
static _Thread_local char fitted_limit[256]; /* why the last fitted range ends where it does (fn's error one size above) */

static fe_dyn *try_fitted(em_compiled *c, entry *e, void *ctx, em_tensor *const *in, int n_in, int8_t (*sub)[EM_MAX_DIMS],
                          int k, const int64_t *size, const int64_t *hi, int64_t *hi_out, int *n_probes, char *why,
                          size_t cap, em_site site) {
  fitted_limit[0] = 0;
  static const int64_t delta[FE_DYN_MAX_SYMS] = {1009, 1013, 1019};
  /* sizes unrelated to the corners: small, middling, large (distinct primes where room) */
  static const int64_t check[3][FE_DYN_MAX_SYMS] = {{2, 3, 5}, {97, 89, 83}, {65521, 65519, 65497}};
  bool errored;
  for (int j = 0; j < k; j++) hi_out[j] = hi[j];
  bool fits = true;
  for (int j = 0; j < k; j++) fits &= size[j] + delta[j] <= hi[j] && check[2][j] <= hi[j];
  if (fits) {
    fe_dyn *d = try_symbols(c, e, ctx, in, n_in, sub, k, size, delta, check, &errored, n_probes, why, cap, site);
    if (d || !errored) return d;
  }
  memcpy(e->sym_of, sub, sizeof *e->sym_of * (size_t)n_in);
  e->n_syms = k;
  int64_t lo_d = 0, hi_d = 1009; /* fn runs at size + lo_d (0: the real trace), not at size + hi_d */
  for (int j = 0; j < k; j++)
    if (hi[j] - size[j] + 1 < hi_d) hi_d = hi[j] - size[j] + 1;
  while (hi_d - lo_d > 1) {
    int64_t mid = (lo_d + hi_d) / 2, h[FE_DYN_MAX_SYMS];
    for (int j = 0; j < k; j++) h[j] = size[j] + mid;
    char w[384];
    ir_graph *g = probe_trace(c, e, e->traced, ctx, in, n_in, h, w, sizeof w, site);
    (*n_probes)++;
    if (g) lo_d = mid;
    else hi_d = mid, snprintf(fitted_limit, sizeof fitted_limit, "at %lld: %.200s", (long long)(size[0] + mid), w);
    ir_graph_free(g);
  }
  if (lo_d == 0) {
    if (strncmp(why, "fn runs at no size", 18)) {
      char w[300];
      snprintf(w, sizeof w, "%s", why[0] ? why : "?");
      snprintf(why, cap, "fn runs at no size above the traced one: %.300s", w);
    }
    return NULL;
  }
  int64_t dl[FE_DYN_MAX_SYMS], ck[3][FE_DYN_MAX_SYMS];
  for (int j = 0; j < k; j++) {
    dl[j] = lo_d;
    hi_out[j] = size[j] + lo_d;
    ck[0][j] = 2 + j < hi_out[j] ? 2 + j : 2;
    ck[1][j] = (2 + size[j]) / 2 + j;
    ck[2][j] = size[j] + (lo_d + 1) / 2 - j > 2 ? size[j] + (lo_d + 1) / 2 - j : 2;
  }
  fe_dyn *d = try_symbols(c, e, ctx, in, n_in, sub, k, size, dl, (const int64_t(*)[FE_DYN_MAX_SYMS])ck, &errored, n_probes,
                          why, cap, site);
  if (d) fe_log(FE_LOG_DYNAMIC, "%s: fn errors at the default probe sizes; symbols range up to %lld", c->name,
                (long long)hi_out[0]);
  return d;
}

/* sym_of restricted to the symbols in mask, renumbered in order; returns how many. */
static int restrict_symbols(int8_t (*sym_of)[EM_MAX_DIMS], int n_in, int mask, int8_t (*out)[EM_MAX_DIMS],
                            const int64_t *size, const int64_t *lo, const int64_t *hi, int64_t *osize, int64_t *olo,
                            int64_t *ohi) {
  int map[FE_DYN_MAX_SYMS], k = 0;
  for (int j = 0; j < FE_DYN_MAX_SYMS; j++) {
    map[j] = mask >> j & 1 ? k : -1;
    if (map[j] >= 0) osize[k] = size[j], olo[k] = lo[j], ohi[k] = hi[j], k++;
  }
  for (int a = 0; a < n_in; a++)
    for (int d = 0; d < EM_MAX_DIMS; d++) out[a][d] = (int8_t)(sym_of[a][d] < 0 ? -1 : map[sym_of[a][d]]);
  return k;
}

/* Makes entry e (just traced, no breaks) dynamic in the symbols plan_symbols chose. When they
 * fail together, each is tried alone and the ones that work are kept (so EM_DYNAMIC_ALWAYS,
 * which also offers dims a weight's shape pins, ends with the symbols that can vary, as
 * PyTorch specializes a symbol a shape rule fixes). On failure e stays specialized and the
 * reason is logged (and kept: later entries do not probe again). */
static void make_dynamic(em_compiled *c, entry *e, void *ctx, em_tensor *const *in, int n_in, int8_t (*sym_of)[EM_MAX_DIMS],
                         int n_syms, const int64_t *size, const int64_t *lo, const int64_t *hi, em_site site) {
  char why[384] = "", w1[384];
  double t0 = now_ms();
  const ir_graph *base = e->traced;
  bool had_error = rt_has_error();
  fe_dyn *d = NULL;
  int n_probes = 0;
  if (!base) snprintf(why, sizeof why, "no graph");
  if (had_error) snprintf(why, sizeof why, "an error is recorded (%s)", em_last_error());
  for (int i = 0; !why[0] && i < e->n_src; i++)
    if (e->src[i].kind == SRC_CONST) snprintf(why, sizeof why, "fn makes a tensor from host data (a constant of the trace)");
  for (int i = 0; !why[0] && i < e->n_out; i++)
    if (e->out[i].n_links) snprintf(why, sizeof why, "an output is a view of an input fn writes in place");
  for (int k = 0; !why[0] && k < n_in; k++)
    for (int dd = 0; dd < in[k]->ndim && !why[0]; dd++)
      if (sym_of[k][dd] >= 0 && !ir_is_contiguous(in[k]->ndim, in[k]->sizes, in[k]->strides))
        snprintf(why, sizeof why, "inputs[%d] is not contiguous", k);
  int8_t (*sub)[EM_MAX_DIMS] = malloc(sizeof *sub * (size_t)(n_in > 0 ? n_in : 1));
  if (!why[0] && (!sub || !(e->sym_of = malloc(sizeof *e->sym_of * (size_t)(n_in > 0 ? n_in : 1)))))
    snprintf(why, sizeof why, "out of memory");
  int64_t ss[FE_DYN_MAX_SYMS], sl[FE_DYN_MAX_SYMS], sh[FE_DYN_MAX_SYMS], shi[FE_DYN_MAX_SYMS];
  int k = n_syms;
  if (!why[0]) {
    k = restrict_symbols(sym_of, n_in, (1 << n_syms) - 1, sub, size, lo, hi, ss, sl, sh);
    d = try_fitted(c, e, ctx, in, n_in, sub, k, ss, sh, shi, &n_probes, why, sizeof why, site);
  }
  if (!d && n_syms > 1 && e->sym_of) { /* which symbols can vary on their own? */
    int good = 0;
    for (int j = 0; j < n_syms; j++) {
      int kk = restrict_symbols(sym_of, n_in, 1 << j, sub, size, lo, hi, ss, sl, sh);
      w1[0] = 0;
      fe_dyn *dj = try_fitted(c, e, ctx, in, n_in, sub, kk, ss, sh, shi, &n_probes, w1, sizeof w1, site);
      if (dj) good |= 1 << j;
      else fe_log(FE_LOG_DYNAMIC, "%s: symbol %d alone: %s", c->name, j, w1);
      fe_dyn_free(dj);
    }
    if (good) {
      k = restrict_symbols(sym_of, n_in, good, sub, size, lo, hi, ss, sl, sh);
      w1[0] = 0;
      d = try_fitted(c, e, ctx, in, n_in, sub, k, ss, sh, shi, &n_probes, w1, sizeof w1, site);
      if (d) fe_log(FE_LOG_DYNAMIC, "%s: %d of %d symbols kept; the others specialize: %s", c->name, k, n_syms, why);
    }
  }
  if (!had_error && rt_has_error()) em_clear_error(); /* a probe's failure is not the call's */
  if (!d) {
    free(e->sym_of), free(sub);
    e->sym_of = NULL, e->n_syms = 0;
    snprintf(c->dyn_refused, sizeof c->dyn_refused, "%s", why);
    fe_log(FE_LOG_DYNAMIC, "%s: sizes stay specialized: %s", c->name, why);
    fe_log(FE_LOG_RECOMPILES, "%s: no dynamic shapes: %s", c->name, why);
    return;
  }
  memcpy(e->sym_of, sub, sizeof *sub * (size_t)n_in);
  free(sub);
  e->dyn = d;
  e->n_syms = k;
  for (int j = 0; j < k; j++) e->sym_min[j] = sl[j], e->sym_max[j] = shi[j], e->graph_syms[j] = ss[j];
  snprintf(e->range_why, sizeof e->range_why, "%s", shi[0] < sh[0] ? fitted_limit : "");
  e->traced = NULL; /* the template's base is the graph as traced */
  c->stats.dynamic_entries++;
  if (fe_log_on(FE_LOG_DYNAMIC)) {
    char *text = fe_dyn_describe(d, 40);
    fe_log(FE_LOG_DYNAMIC, "%s: %d symbol(s), %d formulas found from %d probe traces in %.1f ms:\n%s", c->name, k,
           fe_dyn_slots(d), n_probes, now_ms() - t0, text ? text : "");
    free(text);
  }
}

/* How many calls of e have had these symbol values (0: none it remembers). */
static int seen_count(const entry *e, const int64_t *syms) {
  for (int i = 0; i < e->n_seen; i++)
    if (!memcmp(e->seen[i].syms, syms, sizeof(int64_t) * (size_t)e->n_syms)) return e->seen[i].count;
  return 0;
}

/* The row of e's table of sizes (the latest 1024) for these symbol values, its count of calls
 * bumped (a size that fell out of the table counts from 1 again); -1 when out of memory. */
static int count_size(entry *e, const int64_t *syms) {
  size_t n = sizeof(int64_t) * (size_t)e->n_syms;
  if (e->last_seen < e->n_seen && !memcmp(e->seen[e->last_seen].syms, syms, n)) return e->seen[e->last_seen].count++, e->last_seen;
  for (int i = 0; i < e->n_seen; i++)
    if (!memcmp(e->seen[i].syms, syms, n)) return e->seen[i].count++, e->last_seen = i;
  if (!e->seen && !(e->seen = calloc(1024, sizeof *e->seen))) return -1;
  int slot = e->n_seen < 1024 ? e->n_seen++ : (int)(e->calls % 1024);
  memcpy(e->seen[slot].syms, syms, sizeof e->seen[slot].syms);
  e->seen[slot].count = 1, e->seen[slot].g = NULL;
  return e->last_seen = slot;
}

static int compile_after(void) {
  static int n = -1;
  if (n < 0) {
    const char *v = getenv("EMBER_DYNAMIC_COMPILE_AFTER");
    n = v && *v ? atoi(v) : 3;
    if (n < 1) n = 1;
  }
  return n;
}

/* The graph a dynamic entry runs for these inputs: specialized to their sizes and compiled
 * (cached), pinned as e->graph until another size comes. */
static bool dyn_graph(em_compiled *c, entry *e, em_tensor *const *in, int n_in, em_site site) {
  int64_t syms[FE_DYN_MAX_SYMS] = {-1, -1, -1};
  for (int k = 0; k < n_in; k++)
    for (int d = 0; d < in[k]->ndim; d++)
      if (e->sym_of[k][d] >= 0) syms[e->sym_of[k][d]] = in[k]->sizes[d];
  bool same = e->graph && !memcmp(syms, e->graph_syms, sizeof(int64_t) * (size_t)e->n_syms);
  if (same && !e->graph->op_by_op) return true;
  /* tiered: a size's first calls run the specialized graph op by op on the eager kernels (no
   * compile: a size seen once, a decoding step's cache length, costs what eager costs); the
   * call that sees it the EMBER_DYNAMIC_COMPILE_AFTER-th time (default 3) compiles it */
  int row = count_size(e, syms);
  bool compile = row < 0 || e->seen[row].count >= compile_after();
  const fe_graph *known = row >= 0 ? e->seen[row].g : NULL;
  for (int i = 0; known && i <= c->n_graphs; i++) /* still in the graph cache? */
    if (i == c->n_graphs) known = NULL;
    else if (c->graphs[i].compiled == known && known->uid == e->seen[row].uid) break;
  if (known && (!known->op_by_op || !compile)) {
    e->graph = known;
    memcpy(e->graph_syms, syms, sizeof syms);
    return true;
  }
  char why[384];
  ir_graph *spec = fe_dyn_specialize(e->dyn, syms, why, sizeof why);
  if (!spec) return rt_error(site, "em_call", "%s: %s", c->name, why), false;
  const ir_graph *base = spec;
  em_tensor *small[16] = {0}, **gin = base->n_inputs <= 16 ? small : malloc(sizeof(em_tensor *) * (size_t)base->n_inputs);
  if (!gin) {
    ir_graph_free(spec);
    return rt_error(site, "em_call", "out of memory"), false;
  }
  for (int i = 0; i < base->n_inputs; i++) gin[i] = e->src[i].kind == SRC_ARG ? in[e->src[i].arg] : e->src[i].t;
  const fe_graph *fg = lookup_or_compile(c, spec, gin, e->has_backward, compile ? TIER_DYNAMIC : TIER_OP_BY_OP, site);
  if (gin != small) free(gin);
  ir_graph_free(spec);
  if (!fg) return false;
  e->graph = fg;
  if (row >= 0) e->seen[row].g = fg, e->seen[row].uid = fg->uid;
  memcpy(e->graph_syms, syms, sizeof syms);
  return true;
}

/* The marks record of x for marking dim (normalized into *dim) with op's name, or NULL with
 * the error recorded: dim out of range, the dim carrying the other mark (static when marking it
 * dynamic, dynamic when marking it static), out of memory. */
static rt_dyn_marks *marks_for(em_tensor *x, int *dim, bool dynamic, const char *op, em_site site) {
  if (!rt_tensor_arg(x, op, site)) return NULL;
  char b[128];
  if (*dim < -x->ndim || *dim >= x->ndim)
    return rt_error(site, op, "dim %d out of range for %s", *dim, rt_fmt(b, sizeof b, x)), NULL;
  if (*dim < 0) *dim += x->ndim;
  if (x->marks && ((dynamic ? x->marks->fixed : x->marks->dynamic) >> *dim & 1))
    return rt_error(site, op, "dim %d of %s is marked %s", *dim, rt_fmt(b, sizeof b, x), dynamic ? "static" : "dynamic"),
           NULL;
  if (!x->marks && (x->marks = rt_alloc(sizeof *x->marks, 16))) memset(x->marks, 0, sizeof *x->marks);
  if (!x->marks) return rt_error(site, op, "out of memory"), NULL;
  return x->marks;
}

void em_mark_dynamic_at(em_tensor *x, int dim, int64_t min, int64_t max, em_site site) {
  if (x && x != EM_NONE && (min < 2 || max < min)) {
    char b[128];
    rt_error(site, "em_mark_dynamic", "range [%lld, %lld] of dim %d of %s: sizes 0 and 1 always specialize, so min >= 2 "
             "and max >= min", (long long)min, (long long)max, dim, rt_fmt(b, sizeof b, x));
    return;
  }
  rt_dyn_marks *m = marks_for(x, &dim, true, "em_mark_dynamic", site);
  if (!m) return;
  m->dynamic |= (uint8_t)(1u << dim);
  m->min[dim] = min, m->max[dim] = max;
}

void em_mark_static_at(em_tensor *x, int dim, em_site site) {
  rt_dyn_marks *m = marks_for(x, &dim, false, "em_mark_static", site);
  if (m) m->fixed |= (uint8_t)(1u << dim);
}

/* ---- replay ---- */

static bool replay(em_compiled *c, entry *e, em_tensor *const *in, int n_in, em_outputs *res, em_site site) {
  if (e->dyn && !dyn_graph(c, e, in, n_in, site)) return false;
  /* fn that made no node (it returns inputs or tensors it reaches through ctx) has no graph:
   * its outputs all come from sources (the fuzzer's first crash: its second call read NULL) */
  static const ir_graph no_graph;
  const ir_graph *g = e->graph ? e->graph->g : &no_graph;
  em_tensor *small_in[16], *small_out[16];
  em_tensor **gin = g->n_inputs <= 16 ? small_in : malloc(sizeof(em_tensor *) * (size_t)g->n_inputs);
  em_tensor **gout = g->n_outputs <= 16 ? small_out : malloc(sizeof(em_tensor *) * (size_t)g->n_outputs);
  bool ok = gin && gout;
  if (gout) memset(gout, 0, sizeof(em_tensor *) * (size_t)g->n_outputs);
  if (!ok) rt_error(site, "em_call", "out of memory");
  for (int i = 0; ok && i < g->n_inputs; i++) gin[i] = e->src[i].kind == SRC_ARG ? in[e->src[i].arg] : e->src[i].t;
  /* write-backs into graph inputs may be done by the kernels themselves (in place) */
  int small_don[16], *donate = NULL;
  if (ok && e->n_wb && e->graph && e->graph->inductor) {
    donate = g->n_outputs <= 16 ? small_don : malloc(sizeof(int) * (size_t)g->n_outputs);
    for (int o = 0; donate && o < g->n_outputs; o++) donate[o] = -1;
    for (int i = 0; donate && i < e->n_wb; i++)
      if (e->wb[i][0] < g->n_inputs) donate[e->wb[i][1]] = e->wb[i][0];
  }
  ok = ok && (!e->graph || fe_run(c, e->graph, gin, g->n_inputs, gout, donate, site));
  if (donate != small_don) free(donate);
  if (ok && (e->n_wb || e->n_gb)) { /* the epilogue: write-backs and .grad bindings */
    bool prev = em_set_grad_enabled(false);
    for (int i = 0; ok && i < e->n_wb; i++) {
      const source *s = &e->src[e->wb[i][0]];
      em_tensor *dst = s->kind == SRC_ARG ? in[s->arg] : s->t, *src = gout[e->wb[i][1]];
      if (src != dst) ok = write_back(dst, src, site); /* else written in place */
    }
    em_set_grad_enabled(prev);
    for (int i = 0; ok && i < e->n_gb; i++) {
      const source *s = &e->src[e->gb[i][0]];
      em_tensor *leaf = s->kind == SRC_ARG ? in[s->arg] : s->t;
      em_release(leaf->grad);
      leaf->grad = e->gb[i][1] >= 0 ? em_retain(gout[e->gb[i][1]]) : NULL;
    }
  }
  if (!ok && gout)
    for (int i = 0; i < g->n_outputs; i++) em_release(gout[i]), gout[i] = NULL;
  if (ok) {
    res->n = e->n_out;
    for (int i = 0; i < e->n_out; i++) {
      const outmap *m = &e->out[i];
      const source *s = m->from_graph ? NULL : &e->src[m->index];
      if (m->n_links) {
        res->t[i] = apply_links(s->kind == SRC_ARG ? in[s->arg] : s->t, m->links, m->n_links, site);
        if (!res->t[i]) {
          for (int j = 0; j < i; j++) em_release(res->t[j]), res->t[j] = NULL;
          ok = false;
          break;
        }
        continue;
      }
      res->t[i] = m->from_graph ? em_retain(gout[m->index]) : em_retain(s->kind == SRC_ARG ? in[s->arg] : s->t);
    }
    for (int i = 0; i < g->n_outputs; i++) em_release(gout[i]);
  }
  if (gin != small_in) free(gin);
  if (gout != small_out) free(gout);
  c->stats.replays++;
  return ok;
}

/* ---- public API ---- */

/* A graph the inductor could not compile runs with the interpreter (aot_eager's path): said
 * once per process on stderr, and every time under EMBER_LOGS=schedule. */
static void inductor_failed(const char *graph, const char *why) {
  static int said;
  if (fe_log_on(FE_LOG_SCHEDULE)) fe_log(FE_LOG_SCHEDULE, "%s: no generated kernels (%s); running it op by op", graph, why);
  else if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
    fprintf(stderr, "[ember] inductor: graph %s runs op by op without generated kernels: %s (EMBER_LOGS=schedule for more)\n",
            graph, why);
}

/* EMBER_LOGS=schedule and output_code for every program the inductor makes (plain graphs, and
 * the forward and backward graphs of AOT autograd). */
static void inductor_compiled(const char *graph, const ind_program *p) {
  if (fe_log_on(FE_LOG_SCHEDULE)) {
    ind_stats st = ind_program_stats(p);
    fe_log(FE_LOG_SCHEDULE, "%s: %d kernels holding %d nodes (%d recomputed for later kernels; %d of the kernels in %d combo "
           "kernels), %d nodes on the eager kernels (%d sums of slice scatters made one cat), arena %lld bytes, compiled in "
           "%.1f ms\n%s", graph, st.kernels, st.fused_nodes, st.recomputed_nodes, st.combo_parts, st.combo_kernels,
           st.fallback_nodes, st.scatter_sums, (long long)ind_arena_bytes(p), st.compile_ms, ind_schedule(p) ? ind_schedule(p) : "");
  }
  if (fe_log_on(FE_LOG_OUTPUT_CODE) && ind_kernel_ir(p)) fe_log(FE_LOG_OUTPUT_CODE, "%s", ind_kernel_ir(p));
}

em_compiled *em_compile_at(em_model_fn fn, const em_compile_options *opts, em_site site) {
  ind_set_failure_hook(inductor_failed);
  ind_set_compiled_hook(inductor_compiled);
  em_compile_options o = opts ? *opts : (em_compile_options){0};
  if (!fn) return rt_error(site, "em_compile", "fn is NULL");
  const char *backend = o.backend ? o.backend : "inductor";
  if (strcmp(backend, "eager") && strcmp(backend, "aot_eager") && strcmp(backend, "inductor"))
    return rt_error(site, "em_compile", "unknown backend \"%s\" (\"eager\", \"aot_eager\" or \"inductor\")", backend);
  /* as in PyTorch: recomputation pays off when the recomputed ops fuse into the backward's
   * kernels (inductor); run one op at a time (aot_eager), it only adds passes over memory */
  const char *part = o.partitioner ? o.partitioner : strcmp(backend, "inductor") ? "default" : "min_cut";
  if (strcmp(part, "min_cut") && strcmp(part, "default") && strcmp(part, "recompute"))
    return rt_error(site, "em_compile", "unknown partitioner \"%s\" (\"min_cut\", \"default\" or \"recompute\")", part);
  /* torch.compile's modes; "max-autotune" also captures CUDA graphs, as torch's does */
  const char *mode = o.mode ? o.mode : "default";
  ind_options io = {0};
  if (!strcmp(mode, "reduce-overhead")) io.cuda_graphs = true;
  else if (!strcmp(mode, "max-autotune")) io.cuda_graphs = io.autotune = true;
  else if (!strcmp(mode, "max-autotune-no-cudagraphs")) io.autotune = true;
  else if (strcmp(mode, "default"))
    return rt_error(site, "em_compile",
                    "unknown mode \"%s\" (\"default\", \"reduce-overhead\", \"max-autotune\" or "
                    "\"max-autotune-no-cudagraphs\")",
                    mode);
  em_compiled *c = calloc(1, sizeof *c);
  if (!c) return rt_error(site, "em_compile", "out of memory");
  c->ind_opts = io;
  snprintf(c->mode, sizeof c->mode, "%s", mode);
  c->fn = fn;
  snprintf(c->name, sizeof c->name, "%s", o.name && *o.name ? o.name : "fn");
  for (char *p = c->name; *p; p++) /* names go into IR text and file names */
    if (!(*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'))) *p = '_';
  snprintf(c->backend, sizeof c->backend, "%s", backend);
  c->aot = !strcmp(backend, "aot_eager") || !strcmp(backend, "inductor");
  c->inductor = !strcmp(backend, "inductor");
  c->partitioner = !strcmp(part, "default")     ? AOT_PARTITION_DEFAULT
                   : !strcmp(part, "recompute") ? AOT_PARTITION_RECOMPUTE
                                                : AOT_PARTITION_MIN_CUT;
  c->fullgraph = o.fullgraph;
  if ((unsigned)o.dynamic > EM_DYNAMIC_NEVER) {
    free(c);
    return rt_error(site, "em_compile", "unknown dynamic setting %d (EM_DYNAMIC_AUTO, _ALWAYS or _NEVER)", (int)o.dynamic);
  }
  c->dynamic = o.dynamic;
  c->limit = o.recompile_limit > 0 ? o.recompile_limit : 8;
  c->check_every = o.check_every < 0 ? 0 : o.check_every == 0 ? 1 : o.check_every;
  const char *acc = getenv("EMBER_COMPILE_ACCURACY");
  c->accuracy = o.accuracy || (acc && *acc && strcmp(acc, "0"));
  snprintf(c->partitioner_name, sizeof c->partitioner_name, "%s", part);
  const char *chk = getenv("EMBER_COMPILE_CHECK");
  if (chk && *chk) c->check_every = atoi(chk) < 0 ? 0 : atoi(chk);
  c->site = site;
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  int rc = pthread_mutex_init(&c->lock, &ma);
  pthread_mutexattr_destroy(&ma);
  if (rc) {
    free(c);
    return rt_error(site, "em_compile", "could not create the compiled function's lock");
  }
  return c;
}

void em_compiled_free(em_compiled *c) {
  if (!c) return;
  for (int i = 0; i < c->n_entries; i++) entry_free(c->entries[i]);
  for (int i = 0; i < c->n_graphs; i++) ir_graph_free(c->graphs[i].traced), fe_graph_free(c->graphs[i].compiled);
  free(c->entries), free(c->graphs), free(c->auto_dims);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

em_compile_stats em_compiled_stats(const em_compiled *c) {
  if (!c) return (em_compile_stats){0};
  pthread_mutex_lock((pthread_mutex_t *)&c->lock);
  em_compile_stats s = c->stats;
  s.entries = c->n_entries;
  s.graphs_cached = c->n_graphs;
  pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
  return s;
}

/* Hands caller-owned results to the current scope. */
static em_outputs to_scope(em_outputs r, em_site site) {
  for (int i = 0; i < r.n; i++)
    if (r.t[i] && !(r.t[i] = rt_scope_add(r.t[i], "em_call", site)))
      for (int j = 0; j < r.n; j++) r.t[j] = NULL;
  return r;
}

static void drop_dead_entries(em_compiled *c) {
  int k = 0;
  for (int i = 0; i < c->n_entries; i++) {
    if (c->entries[i]->dead) {
      fe_log(FE_LOG_RECOMPILES, "%s: dropping entry %d: %s", c->name, i, c->entries[i]->dead_reason);
      entry_free(c->entries[i]);
    } else {
      c->entries[k++] = c->entries[i];
    }
  }
  c->n_entries = k;
}

static em_outputs call(em_compiled *c, void *ctx, em_tensor *const *in, int n_in, em_site site);

/* Whether this hit of entry e (e->calls counts the calls it served after the one that traced
 * it) is traced again and compared with e rather than replayed: the first (the function's
 * second call), and with check_every N > 1 every Nth. */
static bool check_due(const em_compiled *c, const entry *e) {
  if (c->check_every <= 0 || (!e->traced && !e->dyn)) return false;
  return e->calls == 1 || (c->check_every > 1 && e->calls % c->check_every == 0);
}

em_outputs em_call_at(em_compiled *c, void *ctx, em_tensor *const *in, int n_in, em_site site) {
  uint64_t t0 = RT_PROF_ON() ? rt_prof_now() : 0;
  /* this thread's counters: a call compiles and runs its kernels on the calling thread */
  int64_t k0 = ind_kernel_runs(), f0 = ind_failures(), g0 = ind_cuda_graph_replays(), c0 = ind_combo_kernel_runs();
  /* one call at a time per compiled function: its entries, graph cache, lazily compiled
   * programs and counters are shared (issue 16: two threads recorded 13 entries for 12 shapes) */
  if (c) pthread_mutex_lock(&c->lock);
  em_outputs r = call(c, ctx, in, n_in, site);
  if (c)
    c->stats.kernel_runs += ind_kernel_runs() - k0, c->stats.inductor_fallbacks += ind_failures() - f0,
        c->stats.cuda_graph_replays += ind_cuda_graph_replays() - g0, c->stats.combo_kernel_runs += ind_combo_kernel_runs() - c0;
  if (c) pthread_mutex_unlock(&c->lock);
  if (t0) rt_prof_complete("compiled", c ? c->name : "em_call", t0, "called at %s:%d", site.file, site.line);
  return r;
}

static em_outputs call(em_compiled *c, void *ctx, em_tensor *const *in, int n_in, em_site site) {
  if (!c) return rt_error(site, "em_call", "the compiled function is NULL"), failed_outputs(0);
  if (n_in < 0 || (n_in > 0 && !in)) return rt_error(site, "em_call", "bad inputs (n = %d)", n_in), failed_outputs(0);
  for (int i = 0; i < n_in; i++) {
    if (!in[i]) return failed_outputs(0);
    if (in[i] == EM_NONE) return rt_error(site, "em_call", "input %d is EM_NONE, where a tensor is required", i), failed_outputs(0);
  }
  c->stats.calls++;
  if (rt_tracing()) return c->fn(ctx, in, n_in); /* inlined into the enclosing trace */

  char why[1024] = "";
  size_t why_len = 0;
  for (int i = 0; i < c->n_entries; i++) {
    entry *e = c->entries[i];
    char w[512];
    if (entry_fails(e, ctx, in, n_in, w, sizeof w)) { /* every entry's first failed guard, as torch logs them */
      if (why_len < sizeof why)
        why_len += (size_t)(i ? snprintf(why + why_len, sizeof why - why_len, "; entry %d: %s", i, w)
                              : snprintf(why + why_len, sizeof why - why_len, "%s", w));
      continue;
    }
    em_outputs r = failed_outputs(0);
    e->calls++;
    /* a dynamic entry at sizes it has not run at yet: the formulas were found from probes, so
     * the first call at every size traces fn for real (its graph run op by op) and compares
     * with the graph the template gives there, as replay validation does */
    int64_t syms[FE_DYN_MAX_SYMS] = {-1, -1, -1};
    bool new_size = false;
    if (e->dyn) {
      for (int k = 0; k < n_in; k++)
        for (int d = 0; d < in[k]->ndim; d++)
          if (e->sym_of[k][d] >= 0) syms[e->sym_of[k][d]] = in[k]->sizes[d];
      new_size = seen_count(e, syms) == 0;
    }
    if (!e->has_breaks && (new_size || check_due(c, e))) { /* replay validation: trace again, compare */
      run_state rs = {.c = c, .site = site, .check = e, .check_traced = e->traced};
      ir_graph *spec = NULL;
      if (e->dyn) { /* the graph the entry would replay at these sizes */
        char w2[384];
        if (!(spec = fe_dyn_specialize(e->dyn, syms, w2, sizeof w2))) return rt_error(site, "em_call", "%s: %s", c->name, w2), failed_outputs(0);
        rs.check_traced = spec;
        rs.tier = compile_after() <= 1 ? TIER_DYNAMIC : TIER_OP_BY_OP; /* this call is the size's first */
        count_size(e, syms);
      }
      c->stats.checks++;
      bool ok = run_traced(c, ctx, in, n_in, &rs, false, NULL, &r, site);
      ir_graph_free(spec);
      if (ok && rs.check_diff[0] && e->dyn) { /* the probes missed how the program depends on the sizes */
        e->dead = true;
        snprintf(e->dead_reason, sizeof e->dead_reason, "at new sizes the program differs from its formulas");
        snprintf(c->dyn_refused, sizeof c->dyn_refused, "at new sizes the program differed from the formulas the probes "
                 "found: %.300s", rs.check_diff);
        c->stats.dynamic_misses++;
        fe_log(FE_LOG_DYNAMIC, "%s: %s", c->name, c->dyn_refused);
        fe_log(FE_LOG_RECOMPILES, "%s: dropping a dynamic entry: %s", c->name, c->dyn_refused);
        return to_scope(r, site); /* this call's results are the real trace's: right */
      }
      if (ok && rs.check_diff[0]) {
        for (int j = 0; j < r.n; j++) em_release(r.t[j]), r.t[j] = NULL;
        e->dead = true;
        snprintf(e->dead_reason, sizeof e->dead_reason, "replay validation found it stale");
        fe_log(FE_LOG_RECOMPILES, "%s: %s", c->name, rs.check_diff);
        rt_error(site, "em_call", "%s: %s (a host value the trace baked in? declare it with em_guard_value)", c->name,
                 rs.check_diff);
        return failed_outputs(r.n);
      }
      return to_scope(r, site);
    }
    if (!e->has_breaks) {
      replay(c, e, in, n_in, &r, site);
    } else {
      run_state rs = {.c = c, .site = site};
      run_traced(c, ctx, in, n_in, &rs, false, NULL, &r, site);
    }
    return to_scope(r, site);
  }
  for (int i = 0; i < c->n_entries; i++) note_changed_sizes(c, c->entries[i], ctx, in, n_in);
  drop_dead_entries(c);
  if (c->n_entries >= c->limit) {
    if (!c->limit_warned) {
      fprintf(stderr, "[ember] %s (compiled at %s:%d) hit its recompile limit (%d entries); running it eagerly "
              "from now on. Last guard failure: %s\n", c->name, c->site.file, c->site.line, c->limit, why);
      c->limit_warned = true;
    }
    c->stats.eager_calls++;
    if (!em_scope_begin_at(site)) return failed_outputs(0);
    em_outputs o = c->fn(ctx, in, n_in);
    for (int i = 0; i < o.n && i < EM_MAX_OUTPUTS; i++) em_keep_at(o.t[i], site);
    em_scope_end_at(site);
    return o;
  }
  if (c->stats.traces > 0) {
    c->stats.recompiles++;
    if (RT_PROF_ON()) rt_prof_instant("recompile", c->name, "%s", why[0] ? why : "an entry was dropped");
    fe_log(FE_LOG_RECOMPILES, "Recompiling %s (compiled at %s:%d), called from %s:%d: guard failed: %s", c->name,
           c->site.file, c->site.line, site.file, site.line, why[0] ? why : "an entry was dropped");
  }
  int8_t small_sym[8][EM_MAX_DIMS], (*sym_of)[EM_MAX_DIMS] = n_in <= 8 ? small_sym : malloc(sizeof *sym_of * (size_t)(n_in > 0 ? n_in : 1));
  int64_t sym_size[FE_DYN_MAX_SYMS], sym_lo[FE_DYN_MAX_SYMS], sym_hi[FE_DYN_MAX_SYMS];
  int n_syms = sym_of ? plan_symbols(c, in, n_in, sym_of, sym_size, sym_lo, sym_hi) : 0;
  if (n_syms < 0) fe_log(FE_LOG_DYNAMIC, "%s: more than %d distinct symbolic sizes; sizes stay specialized", c->name, FE_DYN_MAX_SYMS);
  run_state rs = {.c = c, .site = site};
  entry *e = NULL;
  em_outputs r;
  if (!run_traced(c, ctx, in, n_in, &rs, true, &e, &r, site)) {
    if (sym_of != small_sym) free(sym_of);
    return r;
  }
  if (e && !e->has_breaks && n_syms > 0) {
    if (c->dyn_refused[0]) fe_log(FE_LOG_DYNAMIC, "%s: sizes stay specialized (found before: %s)", c->name, c->dyn_refused);
    else make_dynamic(c, e, ctx, in, n_in, sym_of, n_syms, sym_size, sym_lo, sym_hi, site);
  }
  if (sym_of != small_sym) free(sym_of);
  if (!e) return to_scope(r, site); /* an unstable trace: not cached */
  if (c->n_entries == c->cap_entries) {
    int cap = c->cap_entries ? 2 * c->cap_entries : 4;
    entry **p = realloc(c->entries, sizeof(entry *) * (size_t)cap);
    if (!p) {
      entry_free(e);
      for (int i = 0; i < r.n; i++) em_release(r.t[i]);
      return rt_error(site, "em_call", "out of memory"), failed_outputs(r.n);
    }
    c->entries = p, c->cap_entries = cap;
  }
  c->entries[c->n_entries++] = e;
  log_guards(c, e);
  return to_scope(r, site);
}

/* ---- explain ---- */

static char *append(char *s, size_t *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static char *append(char *s, size_t *n, const char *fmt, ...) {
  if (!s) return NULL;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = realloc(s, *n + (size_t)k + 1);
  if (!p) {
    free(s);
    return NULL;
  }
  va_start(ap, fmt);
  vsnprintf(p + *n, (size_t)k + 1, fmt, ap);
  va_end(ap);
  *n += (size_t)k;
  return p;
}

void em_explanation_free(em_explanation *e) {
  if (!e) return;
  for (int i = 0; i < e->n_guards; i++) free(e->guards[i]);
  free(e->guards), free(e->ops_per_graph), free(e->breaks), free(e->text);
  free(e);
}

em_explanation *em_explain_at(em_model_fn fn, void *ctx, em_tensor *const *in, int n_in, em_site site) {
  if (!fn) return rt_error(site, "em_explain", "fn is NULL");
  em_compiled *c = em_compile_at(fn, &(em_compile_options){.name = "explain"}, site);
  if (!c) return NULL;
  run_state *rs = calloc(1, sizeof *rs);
  em_explanation *x = calloc(1, sizeof *x);
  if (!rs || !x) {
    free(rs), free(x);
    em_compiled_free(c);
    return rt_error(site, "em_explain", "out of memory");
  }
  rs->c = c;
  rs->site = site;
  entry *e = NULL;
  em_outputs r;
  for (int i = 0; i < n_in; i++) {
    if (!in[i]) goto fail;
    if (in[i] == EM_NONE) {
      rt_error(site, "em_explain", "input %d is EM_NONE, where a tensor is required", i);
      goto fail;
    }
  }
  if (!run_traced(c, ctx, in, n_in, rs, true, &e, &r, site)) goto fail;
  for (int i = 0; i < r.n; i++) em_release(r.t[i]);
  if (!e) {
    rt_error(site, "em_explain", "the trace is not cacheable (see EMBER_LOGS=recompiles)");
    goto fail;
  }
  if (!e->has_breaks && n_in > 0) { /* dims marked dynamic: the formulas the entry would have */
    int8_t(*sym_of)[EM_MAX_DIMS] = malloc(sizeof *sym_of * (size_t)n_in);
    int64_t sz[FE_DYN_MAX_SYMS], lo[FE_DYN_MAX_SYMS], hi[FE_DYN_MAX_SYMS];
    int k = sym_of ? plan_symbols(c, in, n_in, sym_of, sz, lo, hi) : 0;
    if (k > 0) make_dynamic(c, e, ctx, in, n_in, sym_of, k, sz, lo, hi, site);
    free(sym_of);
  }
  x->n_graphs = rs->n_graphs;
  x->n_breaks = rs->n_breaks;
  int ng = rs->n_graphs < 256 ? rs->n_graphs : 256, nb = rs->n_breaks < 64 ? rs->n_breaks : 64;
  x->ops_per_graph = calloc((size_t)(ng ? ng : 1), sizeof(int));
  x->breaks = calloc((size_t)(nb ? nb : 1), sizeof(em_graph_break_info));
  if (!x->ops_per_graph || !x->breaks) goto oom;
  memcpy(x->ops_per_graph, rs->ops, sizeof(int) * (size_t)ng);
  memcpy(x->breaks, rs->breaks, sizeof(em_graph_break_info) * (size_t)nb);
  x->n_guards = entry_guard_lines(e, &x->guards);
  size_t n = 0;
  char *t = strdup("");
  int total = 0;
  for (int i = 0; i < ng; i++) total += x->ops_per_graph[i];
  t = append(t, &n, "em_explain (%s:%d): %d graph%s, %d graph break%s, %d ops\n", site.file, site.line, x->n_graphs,
             x->n_graphs == 1 ? "" : "s", x->n_breaks, x->n_breaks == 1 ? "" : "s", total);
  for (int i = 0; i < ng; i++) t = append(t, &n, "  graph %d: %d ops\n", i, x->ops_per_graph[i]);
  for (int i = 0; i < nb; i++)
    t = append(t, &n, "  break %d: %s:%d in %s: %s %s\n", i + 1, x->breaks[i].file, x->breaks[i].line,
               x->breaks[i].func ? x->breaks[i].func : "?", x->breaks[i].op, x->breaks[i].reason);
  t = append(t, &n, "  guards%s:\n", e->has_breaks ? " (an entry with breaks re-runs fn; lifted tensors are not guarded)" : "");
  for (int i = 0; i < x->n_guards; i++) t = append(t, &n, "    %s\n", x->guards[i]);
  if (e->dyn) {
    char *f = fe_dyn_describe(e->dyn, 30);
    t = append(t, &n, "  symbolic sizes (%d formulas):\n%s", fe_dyn_slots(e->dyn), f ? f : "");
    free(f);
  } else if (c->dyn_refused[0]) {
    t = append(t, &n, "  sizes stay specialized: %s\n", c->dyn_refused);
  }
  if (!t) goto oom;
  x->text = t;
  fputs(t, stderr);
  entry_free(e);
  free(rs);
  em_compiled_free(c);
  return x;
oom:
  rt_error(site, "em_explain", "out of memory");
fail:
  entry_free(e);
  free(rs);
  em_compiled_free(c);
  em_explanation_free(x);
  return NULL;
}

/* ---- host values ---- */

void em_guard_value_at(const void *ptr, size_t size, const char *what, em_site site) {
  rt_trace *tr = rt_tracing();
  if (!tr || tr->on_break != on_break) return; /* not tracing for em_compile: nothing to guard */
  run_state *rs = tr->break_ctx;
  if (!ptr || size < 1 || size > HOST_GUARD_MAX_BYTES) {
    rt_error(site, "em_guard_value", "%s: %s (size %zu; 1 to %d bytes)", what ? what : "?", !ptr ? "NULL pointer" : "bad size",
             size, HOST_GUARD_MAX_BYTES);
    return;
  }
  for (int i = 0; i < rs->n_host; i++)
    if (rs->host[i].ptr == ptr && rs->host[i].size == size) return;
  if (rs->n_host == HOST_GUARDS_MAX) {
    rt_error(site, "em_guard_value", "more than %d host values guarded in one trace", HOST_GUARDS_MAX);
    return;
  }
  host_guard *h = &rs->host[rs->n_host++];
  *h = (host_guard){.ptr = ptr, .size = size, .what = what ? what : "?", .site = site};
  memcpy(h->bytes, ptr, size);
}

/* ---- break points that belong to no other file ---- */

void em_graph_break_at(em_site site) {
  int tok = rt_break_begin("em_graph_break", "was called (an explicit graph break)", site);
  rt_break_end(tok);
}

em_outputs em_call_opaque_at(em_opaque_fn fn, void *ctx, em_tensor *const *in, int n_in, em_site site) {
  if (!fn) return rt_error(site, "em_call_opaque", "fn is NULL"), failed_outputs(0);
  for (int i = 0; i < n_in; i++)
    if (!in[i]) return failed_outputs(0);
  int tok = rt_break_begin("em_call_opaque", "calls an opaque user function", site);
  if (tok < 0) return failed_outputs(0);
  em_outputs o = fn(ctx, in, n_in);
  rt_break_end(tok);
  if (o.n < 0 || o.n > EM_MAX_OUTPUTS) /* its tensors are its scope's: nothing to release */
    return rt_error(site, "em_call_opaque", "fn returned %d outputs (0 to %d allowed)", o.n, EM_MAX_OUTPUTS), failed_outputs(0);
  return o;
}
