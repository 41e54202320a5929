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
rt_trace *rt_trace_current(void) { return active; }

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

static void drop_grad_leaves(rt_trace *tr) {
  for (int i = 0; i < tr->n_grad_leaves; i++) em_release(tr->grad_leaves[i]);
  tr->n_grad_leaves = 0;
}

void rt_trace_end(rt_trace *tr) {
  if (active == tr) active = tr->prev;
  for (int i = 0; i < tr->n_proxies; i++)
    if (tr->proxies[i]) tr->proxies[i]->proxy_slot = -1;
  rt_free(tr->proxies);
  drop_lifted(tr);
  drop_grad_leaves(tr);
  rt_free(tr->lifted), rt_free(tr->lifted_value), rt_free(tr->lifted_mutated), rt_free(tr->grad_leaves);
  tr->lifted_value = NULL, tr->lifted_mutated = NULL, tr->grad_leaves = NULL, tr->cap_grad_leaves = 0;
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
  tr->graph_serial++;
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

/* Lifts real tensor t as a new graph input (three parallel arrays grow together). */
static int lift(rt_trace *tr, em_tensor *t, const char *name, em_site site) {
  if (tr->n_lifted == tr->cap_lifted) {
    int c = tr->cap_lifted ? 2 * tr->cap_lifted : 64;
    em_tensor **l = rt_alloc(sizeof(em_tensor *) * (size_t)c, 16);
    int *v = rt_alloc(sizeof(int) * (size_t)c, 16);
    bool *m = rt_alloc(sizeof(bool) * (size_t)c, 16);
    if (!l || !v || !m) {
      rt_free(l), rt_free(v), rt_free(m);
      rt_error(site, name, "out of memory lifting a tensor into the graph");
      return -1;
    }
    if (tr->n_lifted) {
      memcpy(l, tr->lifted, sizeof(em_tensor *) * (size_t)tr->n_lifted);
      memcpy(v, tr->lifted_value, sizeof(int) * (size_t)tr->n_lifted);
      memcpy(m, tr->lifted_mutated, sizeof(bool) * (size_t)tr->n_lifted);
    }
    rt_free(tr->lifted), rt_free(tr->lifted_value), rt_free(tr->lifted_mutated);
    tr->lifted = l, tr->lifted_value = v, tr->lifted_mutated = m, tr->cap_lifted = c;
  }
  ir_type ty = {.dtype = t->dtype, .device = t->storage->device, .ndim = t->ndim};
  for (int i = 0; i < t->ndim; i++) ty.sizes[i] = t->sizes[i];
  int v = ir_add_input(tr->g, &ty);
  if (v < 0) {
    rt_error(site, name, "out of memory lifting a tensor into the graph");
    return -1;
  }
  tr->lifted[tr->n_lifted] = em_retain(t);
  tr->lifted_value[tr->n_lifted] = v;
  tr->lifted_mutated[tr->n_lifted++] = false;
  return v;
}

int rt_trace_operand(rt_trace *tr, em_tensor *t, const char *name, em_site site) {
  if (t->proxy) {
    if (t->proxy_trace == tr->id) return t->proxy - 1;
    char b[128];
    rt_error(site, name, "%s is a proxy of a finished trace: a tensor escaped its compiled function (through "
             "ctx or a static?); return it from the function instead", rt_fmt(b, sizeof b, t));
    return -1;
  }
  int found = -1;
  bool hazard = false;
  for (int i = 0; i < tr->n_lifted; i++) {
    if (tr->lifted[i] == t) found = i;
    else if (tr->lifted_mutated[i] && tr->lifted[i]->storage == t->storage) hazard = true;
  }
  if (hazard && !(found >= 0 && tr->lifted_mutated[found])) return -2;
  if (found >= 0) return tr->lifted_value[found];
  return lift(tr, t, name, site);
}

/* ---- functionalization ----
 *
 * An in-place write under a trace becomes an out-of-place node whose value the written tensor
 * (and, through its view chain, its base) stands for from then on: a proxy is rebound to the new
 * value; a real tensor the graph lifted gets a new current value and is written back by the
 * graph's epilogue (frontend). A write into a view becomes a scatter of the new values into the
 * base (SLICE -> slice_scatter; reshape, squeeze, unsqueeze and permute invert exactly;
 * detach is the identity). What this cannot express (an expanded view; a storage that other
 * live tensors alias, which would go stale; a real tensor that is only part of its storage) is
 * left to a graph break, so results stay eager's. */

static bool chain_member(em_tensor *const *chain, int n, const em_tensor *t) {
  for (int i = 0; i < n; i++)
    if (chain[i] == t) return true;
  return false;
}

static bool invertible(em_prim op) {
  return op == EM_PRIM_SLICE || op == EM_PRIM_RESHAPE || op == EM_PRIM_SQUEEZE || op == EM_PRIM_UNSQUEEZE ||
         op == EM_PRIM_PERMUTE || op == EM_PRIM_DETACH;
}

/* base's new value after view node vn's result took value nv. */
static int inverse_view(rt_trace *tr, ir_node vn, int base_val, int nv, em_site site) {
  ir_type bt = tr->g->values[base_val].type;
  prim_attrs at = vn.attrs;
  switch (vn.op) {
  case EM_PRIM_DETACH:
    return nv;
  case EM_PRIM_SLICE:
    return ir_add_node(tr->g, EM_PRIM_SLICE_SCATTER, (int[]){base_val, nv}, 2, &at, &bt, site, "functionalize");
  case EM_PRIM_PERMUTE: {
    prim_attrs inv = {.n_axes = at.n_axes};
    for (int i = 0; i < at.n_axes; i++) inv.axes[at.axes[i] < 0 ? at.axes[i] + at.n_axes : at.axes[i]] = i;
    return ir_add_node(tr->g, EM_PRIM_PERMUTE, &nv, 1, &inv, &bt, site, "functionalize");
  }
  default: { /* reshape, squeeze, unsqueeze: the same elements in row-major order */
    prim_attrs r = {.shape = {.ndim = bt.ndim}};
    for (int i = 0; i < bt.ndim; i++) r.shape.sizes[i] = bt.sizes[i];
    return ir_add_node(tr->g, EM_PRIM_RESHAPE, &nv, 1, &r, &bt, site, "functionalize");
  }
  }
}

int rt_trace_write(rt_trace *tr, em_tensor *out, int v, em_site site) {
  /* dry run: the chain to the root, and whether it can be written functionally */
  em_tensor *chain[32];
  int n = 0;
  em_tensor *t = out;
  for (;;) {
    if (n == 32) return 0;
    chain[n++] = t;
    if (!t->proxy) break; /* a real root */
    if (t->proxy_trace != tr->id) return 0;
    if (!t->view_base || t->view_graph != tr->graph_serial) break; /* a proxy root */
    if (!invertible(tr->g->nodes[t->view_node].op)) return 0;
    t = t->view_base;
  }
  em_tensor *root = chain[n - 1];
  int li = -1;
  if (!root->proxy) {
    size_t es = ir_dtype(root->dtype)->size;
    if (root->offset != 0 || !ir_is_contiguous(root->ndim, root->sizes, root->strides) ||
        (size_t)root->numel * es != root->storage->bytes)
      return 0; /* part of a storage: other parts could be viewed elsewhere */
    for (int i = 0; i < tr->n_lifted; i++) {
      if (tr->lifted[i] == root) li = i;
      else if (tr->lifted[i]->storage == root->storage) return 0;
    }
  }
  /* live aliases outside the chain would go stale: each must be a view chain of the root made
   * in this graph, so it can be regenerated from the root's new value */
  for (int i = 0; i < tr->n_proxies; i++) {
    em_tensor *p = tr->proxies[i];
    if (!p || p->storage != root->storage || chain_member(chain, n, p)) continue;
    em_tensor *q = p;
    int depth = 0;
    while (q != root && q->proxy && q->view_base && q->view_graph == tr->graph_serial && depth < 32) q = q->view_base, depth++;
    if (q != root) return 0;
  }
  if (!root->proxy && li < 0 && lift(tr, root, "functionalize", site) < 0) return -1;
  /* apply: rebind each view, scattering into its base */
  int val = v;
  for (int k = 0; k < n - 1; k++) {
    em_tensor *view = chain[k], *base = chain[k + 1];
    int bv = base->proxy ? base->proxy - 1 : -1;
    if (!base->proxy)
      for (int i = 0; i < tr->n_lifted; i++)
        if (tr->lifted[i] == base) bv = tr->lifted_value[i];
    if (bv < 0) return 0; /* cannot happen after the dry run */
    int nb = inverse_view(tr, tr->g->nodes[view->view_node], bv, val, site);
    if (nb < 0) return rt_error(site, "functionalize", "out of memory"), -1;
    view->proxy = val + 1;
    val = nb;
  }
  if (root->proxy) {
    root->proxy = val + 1;
  } else {
    for (int i = 0; i < tr->n_lifted; i++)
      if (tr->lifted[i] == root) tr->lifted_value[i] = val, tr->lifted_mutated[i] = true;
  }
  /* regenerate the other aliases: replay each one's view chain on the root's new value */
  for (int i = 0; i < tr->n_proxies; i++) {
    em_tensor *p = tr->proxies[i];
    if (!p || p->storage != root->storage || chain_member(chain, n, p)) continue;
    em_tensor *links[32];
    int depth = 0;
    for (em_tensor *q = p; q != root; q = q->view_base) links[depth++] = q;
    int cur = val;
    for (int d = depth - 1; d >= 0; d--) {
      em_tensor *q = links[d];
      ir_node vn = tr->g->nodes[q->view_node];
      ir_type ty = {.dtype = q->dtype, .device = q->storage->device, .ndim = q->ndim};
      for (int k = 0; k < q->ndim; k++) ty.sizes[k] = q->sizes[k];
      cur = vn.op == EM_PRIM_DETACH ? cur : ir_add_node(tr->g, vn.op, &cur, 1, &vn.attrs, &ty, vn.site, vn.opname);
      if (cur < 0) return rt_error(site, "functionalize", "out of memory"), -1;
    }
    p->proxy = cur + 1;
  }
  return 1;
}

void rt_trace_note_grad(em_tensor *leaf) {
  rt_trace *tr = active;
  if (!tr || leaf->proxy) return;
  for (int i = 0; i < tr->n_grad_leaves; i++)
    if (tr->grad_leaves[i] == leaf) return;
  if (push((void ***)&tr->grad_leaves, &tr->n_grad_leaves, &tr->cap_grad_leaves, leaf)) em_retain(leaf);
}


em_tensor *rt_trace_new_input(rt_trace *tr, const ir_type *t, em_site site) {
  int v = ir_add_input(tr->g, t);
  if (v < 0) return rt_error(site, "em_compile", "out of memory adding a graph input");
  prim_meta m = ir_meta_of_type(t);
  return rt_new_proxy(NULL, &m, v, tr, "em_compile", site);
}

void rt_trace_drop_history(rt_trace *tr) {
  for (int i = 0; i < tr->n_proxies; i++) {
    em_tensor *p = tr->proxies[i];
    if (!p || !p->grad_fn) continue;
    em_retain(p);
    rt_node *n = p->grad_fn;
    p->grad_fn = NULL;
    rt_node_release(n); /* may free proxies only that history kept alive */
    em_release(p);
  }
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
    /* A proxy whose value is a lifted tensor (fn's em_reshape(x, x's shape) is x's value) is
     * another tensor than x in eager, with a grad_fn into x: becoming x itself made it a second
     * leaf that took x's gradients away (found by the fuzzer). It becomes a view of x instead. */
    em_tensor *real = outs[k], *view = NULL;
    bool lifted = false;
    for (int j = 0; j < tr->n_lifted && !lifted; j++) lifted = tr->lifted[j] == real;
    if (lifted && real->requires_grad && rt_grad_enabled()) {
      tr->suspended++;
      view = rt_reshape(real, real->ndim, real->sizes, "em_call", (em_site){__FILE__, __LINE__, __func__});
      tr->suspended--;
    }
    rt_tensor_become(p, view ? view : real);
    em_release(view);
    em_release(p);
  }
}

int rt_break_begin(const char *op, const char *reason, em_site site) {
  rt_trace *tr = rt_tracing();
  if (!tr) return 0;
  if (RT_PROF_ON()) rt_prof_instant("graph_break", op, "%s:%d: %s", site.file, site.line, reason);
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
