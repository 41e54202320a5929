/* runtime/trace.c: the tracer's state, proxies, lifting, graph breaks and weak references.
 *
 * The design follows TorchDynamo's division of labour, in C: the runtime knows how to record
 * (dispatch.c calls rt_trace_dispatch) and where a break must happen (every op that needs
 * data calls rt_break_begin); what a break *does* (run the graph so far, cache it by its
 * structure, materialize the proxies) belongs to the frontend, which passes it in as on_break.
 *
 * Proxies are ordinary em_tensor headers with exact metadata and no data. The trace keeps a
 * weak list of them so a break can find every live one and turn it, in place, into the real
 * tensor the graph computed: the user's pointers stay valid across a break. */
#include "rt.h"
#include "../ir/graph.h"

#include <pthread.h>
#include <string.h>

static _Thread_local rt_trace *active;
static uint32_t trace_ids;

rt_trace *rt_tracing(void) { return active && !active->suspended ? active : NULL; }

void rt_trace_suspend(void) {
  if (active) active->suspended++;
}
void rt_trace_resume(void) {
  if (active) active->suspended--;
}

bool rt_trace_begin(rt_trace *tr, const char *name, rt_break_fn on_break, void *ctx, em_site site) {
  memset(tr, 0, sizeof *tr);
  tr->g = ir_graph_new(name);
  if (!tr->g) return rt_error(site, "em_compile", "out of memory starting a trace"), false;
  tr->id = __atomic_add_fetch(&trace_ids, 1, __ATOMIC_RELAXED);
  tr->serial_start = rt_serial_now();
  tr->on_break = on_break;
  tr->break_ctx = ctx;
  tr->prev = active;
  active = tr;
  return true;
}

static void drop_lifted(rt_trace *tr) {
  for (int i = 0; i < tr->n_lifted; i++) em_release(tr->lifted[i]);
  tr->n_lifted = 0;
}

void rt_trace_end(rt_trace *tr) {
  if (active == tr) active = tr->prev;
  for (int i = 0; i < tr->n_proxies; i++)
    if (tr->proxies[i]) tr->proxies[i]->proxy_slot = -1;
  rt_free(tr->proxies);
  drop_lifted(tr);
  rt_free(tr->lifted);
  ir_graph_free(tr->g);
  tr->g = NULL;
  tr->proxies = NULL, tr->lifted = NULL;
  tr->n_proxies = tr->cap_proxies = tr->live_proxies = tr->cap_lifted = 0;
}

bool rt_trace_reset(rt_trace *tr, const char *name) {
  ir_graph *g = ir_graph_new(name);
  if (!g) return false;
  ir_graph_free(tr->g);
  tr->g = g;
  drop_lifted(tr);
  /* compact the proxy list: every survivor was materialized, so nothing is live */
  int k = 0;
  for (int i = 0; i < tr->n_proxies; i++)
    if (tr->proxies[i]) tr->proxies[k] = tr->proxies[i], tr->proxies[k]->proxy_slot = k, k++;
  tr->n_proxies = k;
  return true;
}

static bool push(void ***items, int *n, int *cap, void *x) {
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 64;
    void **p = rt_alloc(sizeof(void *) * (size_t)c, 16);
    if (!p) return false;
    if (*n) memcpy(p, *items, sizeof(void *) * (size_t)*n);
    rt_free(*items);
    *items = p, *cap = c;
  }
  (*items)[(*n)++] = x;
  return true;
}

bool rt_trace_register(rt_trace *tr, em_tensor *p) {
  if (!push((void ***)&tr->proxies, &tr->n_proxies, &tr->cap_proxies, p)) return false;
  p->proxy_slot = tr->n_proxies - 1;
  tr->live_proxies++;
  return true;
}

bool rt_trace_adopt(em_tensor *view, const em_tensor *base) {
  view->proxy = base->proxy;
  view->proxy_trace = base->proxy_trace;
  view->proxy_slot = -1;
  rt_trace *tr = active;
  while (tr && tr->id != base->proxy_trace) tr = tr->prev;
  if (!tr) return true; /* a stale proxy stays one, unregistered */
  return rt_trace_register(tr, view);
}

void rt_trace_forget(em_tensor *t) {
  rt_trace *tr = active;
  while (tr && tr->id != t->proxy_trace) tr = tr->prev;
  if (!tr || tr->id != t->proxy_trace || t->proxy_slot < 0 || t->proxy_slot >= tr->n_proxies ||
      tr->proxies[t->proxy_slot] != t)
    return;
  tr->proxies[t->proxy_slot] = NULL;
  tr->live_proxies--;
}

int rt_trace_value_of(const rt_trace *tr, const em_tensor *t) {
  return t->proxy && t->proxy_trace == tr->id ? t->proxy - 1 : -1;
}

int rt_trace_operand(rt_trace *tr, em_tensor *t, const char *name, em_site site) {
  if (t->proxy) {
    if (t->proxy_trace == tr->id) return t->proxy - 1;
    char b[128];
    rt_error(site, name, "%s is a proxy of a finished trace: a tensor escaped its compiled function (through "
             "ctx or a static?); return it from the function instead", rt_fmt(b, sizeof b, t));
    return -1;
  }
  for (int i = 0; i < tr->n_lifted; i++)
    if (tr->lifted[i] == t) return tr->g->inputs[i];
  ir_type ty = {.dtype = t->dtype, .device = t->storage->device, .ndim = t->ndim};
  for (int i = 0; i < t->ndim; i++) ty.sizes[i] = t->sizes[i];
  int v = ir_add_input(tr->g, &ty);
  if (v < 0 || !push((void ***)&tr->lifted, &tr->n_lifted, &tr->cap_lifted, t)) {
    rt_error(site, name, "out of memory lifting a tensor into the graph");
    return -1;
  }
  em_retain(t);
  return v;
}

em_tensor *rt_trace_new_input(rt_trace *tr, const ir_type *t, em_site site) {
  int v = ir_add_input(tr->g, t);
  if (v < 0) return rt_error(site, "em_compile", "out of memory adding a graph input");
  prim_meta m = ir_meta_of_type(t);
  return rt_new_proxy(NULL, &m, v, tr, "em_compile", site);
}

bool rt_trace_output_live(rt_trace *tr) {
  ir_graph *g = tr->g;
  bool *seen = rt_alloc((size_t)(g->n_values ? g->n_values : 1), 16);
  if (!seen) return false;
  memset(seen, 0, (size_t)g->n_values);
  bool ok = true;
  for (int i = 0; i < tr->n_proxies && ok; i++) {
    em_tensor *p = tr->proxies[i];
    if (!p) continue;
    int v = p->proxy - 1;
    if (!seen[v]) seen[v] = true, ok = ir_add_output(g, v);
  }
  rt_free(seen);
  return ok;
}

void rt_trace_materialize(rt_trace *tr, em_tensor *const *outs) {
  ir_graph *g = tr->g;
  for (int i = 0; i < tr->n_proxies; i++) {
    em_tensor *p = tr->proxies[i];
    if (!p) continue;
    int v = p->proxy - 1, k = -1;
    for (int j = 0; j < g->n_outputs && k < 0; j++)
      if (g->outputs[j] == v) k = j;
    EM_ASSERT(k >= 0);
    tr->proxies[i] = NULL;
    tr->live_proxies--;
    em_retain(p);            /* p's old autograd node may hold the last other reference */
    rt_tensor_become(p, outs[k]);
    em_release(p);
  }
}

int rt_break_begin(const char *op, const char *reason, em_site site) {
  rt_trace *tr = rt_tracing();
  if (!tr) return 0;
  if (!tr->on_break(tr, op, reason, site, tr->break_ctx)) return -1;
  tr->suspended++;
  return 1;
}

void rt_break_end(int token) {
  if (token == 1 && active) active->suspended--;
}

/* ---- weak references ---- */

typedef struct watch {
  em_tensor *t;
  void (*dead)(void *ctx, const em_tensor *t);
  void *ctx;
} watch;

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static watch *watches;
static int n_watches, cap_watches;

bool rt_watch(em_tensor *t, void (*dead)(void *ctx, const em_tensor *t), void *ctx) {
  pthread_mutex_lock(&watch_lock);
  bool ok = true;
  if (n_watches == cap_watches) {
    int c = cap_watches ? 2 * cap_watches : 64;
    watch *w = rt_alloc(sizeof(watch) * (size_t)c, 16);
    if (w) {
      if (n_watches) memcpy(w, watches, sizeof(watch) * (size_t)n_watches);
      rt_free(watches);
      watches = w, cap_watches = c;
    } else {
      ok = false;
    }
  }
  if (ok) {
    watches[n_watches++] = (watch){t, dead, ctx};
    t->watched = true;
  }
  pthread_mutex_unlock(&watch_lock);
  return ok;
}

void rt_unwatch_all(void *ctx) {
  pthread_mutex_lock(&watch_lock);
  int k = 0;
  for (int i = 0; i < n_watches; i++)
    if (watches[i].ctx != ctx) watches[k++] = watches[i];
  n_watches = k;
  if (!n_watches) {
    rt_free(watches);
    watches = NULL;
    cap_watches = 0;
  }
  pthread_mutex_unlock(&watch_lock);
}

void rt_watch_notify(em_tensor *t) {
  /* Callbacks run outside the lock (they may unwatch); collect them first. */
  enum { MAX = 32 };
  watch fired[MAX];
  int n;
  do {
    n = 0;
    pthread_mutex_lock(&watch_lock);
    int k = 0;
    for (int i = 0; i < n_watches; i++) {
      if (watches[i].t == t && n < MAX) fired[n++] = watches[i];
      else watches[k++] = watches[i];
    }
    n_watches = k;
    pthread_mutex_unlock(&watch_lock);
    for (int i = 0; i < n; i++) fired[i].dead(fired[i].ctx, t);
  } while (n == MAX);
}
