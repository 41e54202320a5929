/* runtime/autograd.c: the autograd engine, tape-less as in PyTorch.
 *
 * Recording: the dispatcher calls rt_autograd_record for every prim application; when grad mode
 * is on and an input requires grad, the result gets a node holding the prim, its attributes,
 * its inputs' metadata, edges to the inputs' nodes (or to the leaves to accumulate into) and,
 * when its rule needs them, the inputs themselves with their version counters. Rules save
 * inputs only, never outputs (rules that need an output recompute it from the inputs): a saved
 * output would be a reference cycle, and recomputing keeps double backward exact.
 *
 * Backward: a depth-first walk counts, for every node reachable from the roots, how many edges
 * point at it; nodes then run in Kahn order (a node runs once every consumer has added its
 * gradient), each through its vector-Jacobian rule in vjp.c, which is written with the public
 * op API and so is itself recorded when create_graph asks for it. Temporaries live in one scope
 * opened for the backward. */
#include "rt.h"

#include <string.h>

static _Thread_local bool grad_disabled; /* stored inverted so the default (zero) means on */
static _Thread_local int no_grad_depth;
static _Thread_local bool no_grad_saved[64];
static uint64_t epoch_counter;

bool rt_grad_enabled(void) { return !grad_disabled; }
bool em_is_grad_enabled(void) { return !grad_disabled; }

bool em_set_grad_enabled(bool enabled) {
  bool prev = !grad_disabled;
  grad_disabled = !enabled;
  return prev;
}

void em_no_grad_begin(void) {
  if (no_grad_depth < 64) no_grad_saved[no_grad_depth] = !grad_disabled;
  no_grad_depth++;
  grad_disabled = true;
}

void em_no_grad_end(void) {
  if (no_grad_depth == 0) return;
  no_grad_depth--;
  if (no_grad_depth < 64) grad_disabled = !no_grad_saved[no_grad_depth];
}

/* ---- nodes ---- */

static void node_free_saved(rt_node *n) {
  if (n->custom && n->custom->free_saved) n->custom->free_saved(n->custom_ctx);
  for (int i = 0; i < n->n_in; i++) {
    em_release(n->saved[i]);
    n->saved[i] = NULL;
  }
}

void rt_node_release(rt_node *root) {
  if (!root || __atomic_sub_fetch(&root->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
  /* Iterative, so releasing a long chain (an unrolled loop) cannot overflow the C stack. */
  rt_node *small[64], **stack = small;
  int64_t n = 0, cap = 64;
  stack[n++] = root;
  while (n > 0) {
    rt_node *x = stack[--n];
    node_free_saved(x);
    for (int i = 0; i < x->n_in; i++) {
      em_release(x->leaf[i]);
      rt_node *c = x->next[i];
      if (!c || __atomic_sub_fetch(&c->refcount, 1, __ATOMIC_ACQ_REL) != 0) continue;
      if (n == cap) {
        rt_node **bigger = rt_alloc(sizeof(rt_node *) * (size_t)cap * 2, 16);
        if (!bigger) { /* cannot grow: free this subtree recursively instead */
          c->refcount = 1;
          rt_node_release(c);
          continue;
        }
        memcpy(bigger, stack, sizeof(rt_node *) * (size_t)n);
        if (stack != small) rt_free(stack);
        stack = bigger;
        cap *= 2;
      }
      stack[n++] = c;
    }
    em_release(x->acc);
    if (x->custom && x->custom->destroy) x->custom->destroy(x->custom_ctx);
    rt_free(x);
  }
  if (stack != small) rt_free(stack);
}

static rt_node *node_alloc(int n_in) {
  size_t k = (size_t)n_in;
  size_t bytes = sizeof(rt_node) + k * (sizeof(rt_node *) + 2 * sizeof(em_tensor *) + sizeof(int64_t) + sizeof(prim_meta));
  rt_node *n = rt_alloc(bytes, 16);
  if (!n) return NULL;
  memset(n, 0, bytes);
  char *p = (char *)(n + 1);
  n->in_meta = (prim_meta *)p, p += k * sizeof(prim_meta);
  n->saved_version = (int64_t *)p, p += k * sizeof(int64_t);
  n->next = (rt_node **)p, p += k * sizeof(rt_node *);
  n->leaf = (em_tensor **)p, p += k * sizeof(em_tensor *);
  n->saved = (em_tensor **)p;
  n->refcount = 1;
  n->n_in = n_in;
  return n;
}

/* Edges of n to the inputs that require grad: their grad_fn, or the leaf itself. */
static void node_link(rt_node *n, em_tensor *const *in) {
  for (int i = 0; i < n->n_in; i++) {
    n->in_meta[i] = rt_meta(in[i]);
    if (!in[i]->requires_grad) continue;
    if (in[i]->grad_fn) {
      n->next[i] = in[i]->grad_fn;
      __atomic_add_fetch(&in[i]->grad_fn->refcount, 1, __ATOMIC_RELAXED);
    } else {
      n->leaf[i] = em_retain(in[i]);
    }
  }
}

rt_node *rt_custom_node(const char *name, const rt_custom_ops *ops, void *ctx, em_tensor *const *in, int n_in,
                        const prim_meta *out_meta, em_site site) {
  rt_node *n = node_alloc(n_in);
  if (!n) return rt_error(site, name, "out of memory recording a compiled backward node");
  n->custom = ops;
  n->custom_ctx = ctx;
  n->op = EM_PRIM_COUNT;
  n->name = name;
  n->site = site;
  n->out_meta = *out_meta;
  if (in) node_link(n, in); /* else the caller links n->next itself */
  return n;
}

void rt_set_grad_fn(em_tensor *out, rt_node *n) {
  __atomic_add_fetch(&n->refcount, 1, __ATOMIC_RELAXED);
  rt_node_release(out->grad_fn);
  out->grad_fn = n;
  out->requires_grad = true;
}

bool rt_autograd_record(const char *name, em_prim op, em_tensor *const *in, int n_in, const prim_attrs *at,
                        em_tensor *out, em_site site) {
  if (grad_disabled) return true;
  bool any = false;
  for (int i = 0; i < n_in; i++) any |= in[i]->requires_grad;
  if (!any || (prim_get(op)->flags & P_NONDIFF) || !ir_is_float(out->dtype)) return true;
  rt_node *n = node_alloc(n_in);
  if (!n) {
    char b[128];
    rt_error(site, name, "out of memory recording the autograd node of %s", rt_fmt(b, sizeof b, out));
    return false;
  }
  n->op = op;
  if (at) n->attrs = *at;
  n->name = name;
  n->site = site;
  n->out_meta = rt_meta(out);
  node_link(n, in);
  bool save = rt_vjp_saves_inputs(op);
  for (int i = 0; i < n_in; i++) {
    if (save) {
      n->saved[i] = em_retain(in[i]);
      n->saved_version[i] = em_version(in[i]);
    }
  }
  out->grad_fn = n;
  out->requires_grad = true;
  return true;
}

bool rt_autograd_check_inplace(const char *name, em_tensor *out, em_tensor *const *in, int n_in, em_site site) {
  if (grad_disabled) return true;
  char b[128];
  if (out->requires_grad && !out->grad_fn)
    return rt_error(site, name, "a leaf tensor %s that requires grad is used in an in-place operation; "
                    "wrap the update in em_no_grad_begin/em_no_grad_end", rt_fmt(b, sizeof b, out)), false;
  bool any = out->requires_grad;
  for (int i = 0; i < n_in; i++) any |= in[i]->requires_grad;
  if (any)
    return rt_error(site, name, "in-place operation on %s with an operand that requires grad; autograd records "
                    "out-of-place ops only: use the out-of-place op", rt_fmt(b, sizeof b, out)), false;
  return true;
}

/* ---- public tensor-level API ---- */

static em_tensor *requires_grad_(em_tensor *x, bool flag, em_site site) {
  char b[128];
  if (x->grad_fn)
    return rt_error(site, "em_requires_grad_", "%s is not a leaf (it was made by %s); only leaves can be marked",
                    rt_fmt(b, sizeof b, x), x->grad_fn->name);
  if (flag && !ir_is_float(x->dtype))
    return rt_error(site, "em_requires_grad_", "only floating tensors can require grad, got %s", rt_fmt(b, sizeof b, x));
  x->requires_grad = flag;
  return x;
}

/* Under em_compile, marking a tensor is a mutation of the user's state: a graph break. */
em_tensor *em_requires_grad__at(em_tensor *x, bool flag, em_site site) {
  if (!x) return NULL;
  int tok = rt_break_begin("em_requires_grad_", "changes a tensor's requires_grad", site);
  if (tok < 0) return NULL;
  em_tensor *r = requires_grad_(x, flag, site);
  rt_break_end(tok);
  return r;
}

bool em_requires_grad(const em_tensor *x) { return x && x->requires_grad; }
bool em_is_leaf(const em_tensor *x) { return x && !x->grad_fn; }
em_tensor *em_get_grad(const em_tensor *x) { return x ? x->grad : NULL; }
const char *em_grad_fn_name(const em_tensor *x) { return x && x->grad_fn ? x->grad_fn->name : NULL; }

void em_zero_grad(em_tensor *x) {
  if (!x) return;
  if (x->grad) rt_trace_note_grad(x);
  em_release(x->grad);
  x->grad = NULL;
}

em_tensor *em_detach_at(em_tensor *x, em_site site) {
  if (!x) return NULL;
  /* a prim, so a trace records where the history is cut */
  return rt_scope_add(rt_dispatch("em_detach", EM_PRIM_DETACH, &x, 1, &(prim_attrs){0}, site), "em_detach", site);
}

/* ---- the engine ---- */

typedef struct {
  rt_node **items;
  int64_t n, cap;
} node_list;

static bool list_push(node_list *l, rt_node *n) {
  if (l->n == l->cap) {
    int64_t cap = l->cap ? l->cap * 2 : 64;
    rt_node **items = rt_alloc(sizeof(rt_node *) * (size_t)cap, 16);
    if (!items) return false;
    if (l->n) memcpy(items, l->items, sizeof(rt_node *) * (size_t)l->n);
    rt_free(l->items);
    l->items = items;
    l->cap = cap;
  }
  l->items[l->n++] = n;
  return true;
}

/* acc <- acc + g (both caller-owned references, or acc NULL). Returns the new acc, owned. */
static em_tensor *accumulate(em_tensor *acc, em_tensor *g, em_site site) {
  if (!acc) return em_retain(g);
  em_tensor *s = em_retain(em_add_at(acc, g, site));
  em_release(acc);
  return s;
}

typedef struct {
  int n;
  em_tensor *const *targets; /* em_grad's inputs, or NULL for em_backward */
  em_tensor **found;         /* owned references */
} capture;

static int capture_index(const capture *c, const em_tensor *leaf, const rt_node *node) {
  for (int i = 0; i < c->n; i++) {
    const em_tensor *t = c->targets[i];
    if ((leaf && t == leaf) || (node && t->grad_fn == node)) return i;
  }
  return -1;
}

/* Whether leaf's first gradient g may become leaf->grad itself instead of a copy, as PyTorch's
 * AccumulateGrad steals a gradient no user-visible tensor references:
 *  - g's storage was allocated by this backward pass (its serial is after `fresh_after`), so every
 *    tensor over it is one of the pass's temporaries, held by its scope and gone when it ends
 *    (the pass records no graph: create_graph copies or adds instead; no hook sees gradients).
 *    A storage taken gets serial 0, so no other leaf takes it too (add's rule hands one tensor
 *    to both operands, and each reshape's rule makes its own view of it);
 *  - g itself has one reference (the scope's: no node's pending gradient, no capture);
 *  - g has the leaf's shape, dtype and device, contiguous from offset 0, filling its storage (no
 *    larger buffer kept alive), and no history;
 *  - not while tracing: a traced gradient is a proxy the trace must see made.
 * Copying cost 0.46 ms of a 3.9 ms eager MLP step (six parameters, every step), more than its
 * GEMMs' share of a pass over memory: weight gradients came transposed (see the matmul rule). */
static bool can_steal(const em_tensor *leaf, const em_tensor *g, uint64_t fresh_after) {
  if (!fresh_after || g->refcount != 1 || g->storage->serial <= fresh_after) return false;
  if (g->grad_fn || g->requires_grad || g->proxy || g->watched || g->marks || g->offset || rt_tracing()) return false;
  return g->dtype == leaf->dtype && g->ndim == leaf->ndim && g->storage->device == leaf->storage->device &&
         ir_is_contiguous(g->ndim, g->sizes, g->strides) && g->storage->bytes == (size_t)g->numel * em_dtype_size(g->dtype) &&
         !memcmp(g->sizes, leaf->sizes, sizeof(int64_t) * (size_t)g->ndim);
}

/* Leaf gradient accumulation: the first gradient is copied (it may alias a user tensor or
 * another leaf's gradient) unless can_steal (fresh_after 0: never); later ones are added in
 * place, or out of place under create_graph so the sum stays differentiable. */
static bool accumulate_leaf(em_tensor *leaf, em_tensor *g, bool create_graph, uint64_t fresh_after, em_site site) {
  em_tensor *ng;
  if (!leaf->grad) {
    if (create_graph) {
      ng = em_retain(g);
    } else if (can_steal(leaf, g, fresh_after)) {
      g->storage->serial = 0; /* taken: by no other leaf */
      ng = em_retain(g);
    } else {
      ng = em_retain(em_detach_at(em_clone_at(g, site), site));
    }
  } else if (create_graph) {
    ng = em_retain(em_add_at(leaf->grad, g, site));
  } else {
    bool prev = em_set_grad_enabled(false);
    ng = em_add__at(leaf->grad, g, site) ? em_retain(leaf->grad) : NULL;
    em_set_grad_enabled(prev);
  }
  if (!ng) return false;
  rt_trace_note_grad(leaf);
  em_release(leaf->grad);
  leaf->grad = ng;
  return true;
}

static bool check_saved(rt_node *n, em_site site) {
  for (int i = 0; i < n->n_in; i++) {
    em_tensor *s = n->saved[i];
    if (!s || em_version(s) == n->saved_version[i]) continue;
    char b[128];
    const rt_storage *st = s->storage;
    rt_error(site, "em_backward",
             "%s, saved by %s at %s:%d for the backward pass, was modified in place by %s at %s:%d "
             "(its version is %lld, expected %lld); clone it before modifying it",
             rt_fmt(b, sizeof b, s), n->name, n->site.file, n->site.line, st->writer ? st->writer : "an in-place op",
             st->writer_site.file ? st->writer_site.file : "?", st->writer_site.line, (long long)em_version(s),
             (long long)n->saved_version[i]);
    return false;
  }
  return true;
}

static bool run_backward(const char *name, int n_roots, em_tensor *const *roots, em_tensor *const *seeds,
                         bool retain, bool create, capture *cap, em_site site) {
  char b0[128], b1[128];
  for (int i = 0; i < n_roots; i++) {
    if (!roots[i]) return false;
    if (!roots[i]->requires_grad)
      return rt_error(site, name, "output %d (%s) does not require grad: nothing it was computed from requires grad",
                      i, rt_fmt(b0, sizeof b0, roots[i])), false;
    em_tensor *s = seeds ? seeds[i] : NULL;
    if (seeds && !s) return false;
    if (!s && roots[i]->numel != 1)
      return rt_error(site, name, "a gradient can be implied only for one-element outputs; output %d is %s",
                      i, rt_fmt(b0, sizeof b0, roots[i])), false;
    if (s && (s == EM_NONE || s->dtype != roots[i]->dtype || s->ndim != roots[i]->ndim ||
              memcmp(s->sizes, roots[i]->sizes, sizeof(int64_t) * (size_t)s->ndim)))
      return rt_error(site, name, "grad %s does not match output %s (the same shape and dtype)",
                      s == EM_NONE ? "EM_NONE" : rt_fmt(b0, sizeof b0, s), rt_fmt(b1, sizeof b1, roots[i])), false;
  }
  bool ok = false;
  rt_trace *tr = rt_tracing();
  if (tr) tr->has_backward = true;
  bool prev_mode = em_set_grad_enabled(create);
  rt_autocast_suspend(); /* the rules compute in the dtypes the forward chose */
  if (!em_scope_begin_at(site)) {
    em_set_grad_enabled(prev_mode);
    rt_autocast_resume();
    return false;
  }
  node_list all = {0}, ready = {0};
  uint64_t epoch = __atomic_add_fetch(&epoch_counter, 1, __ATOMIC_RELAXED), fresh_after = rt_serial_now();

  /* 1. Reachable nodes and their dependency counts. */
  node_list stack = {0};
  for (int i = 0; i < n_roots; i++) {
    rt_node *r = roots[i]->grad_fn;
    if (r && r->epoch != epoch) {
      r->epoch = epoch, r->deps = 0;
      if (!list_push(&all, r) || !list_push(&stack, r)) goto oom;
    }
  }
  while (stack.n > 0) {
    rt_node *x = stack.items[--stack.n];
    if (x->released) {
      rt_error(site, name, "trying to backward through the graph a second time (%s at %s:%d already freed its "
               "saved tensors); pass retain_graph to the first backward", x->name, x->site.file, x->site.line);
      goto out;
    }
    for (int i = 0; i < x->n_in; i++) {
      rt_node *c = x->next[i];
      if (!c) continue;
      if (c->epoch != epoch) {
        c->epoch = epoch, c->deps = 0;
        if (!list_push(&all, c) || !list_push(&stack, c)) goto oom;
      }
      c->deps++;
    }
  }

  /* 2. Seed the roots. */
  for (int i = 0; i < n_roots; i++) {
    em_tensor *r = roots[i];
    em_device prev = em_set_default_device(r->storage->device);
    em_tensor *s = seeds ? seeds[i] : em_ones_at(r->dtype, r->ndim, r->sizes, site);
    em_set_default_device(prev);
    if (!s) goto out;
    if (s->dtype != r->dtype && !(s = em_cast_at(s, r->dtype, site))) goto out;
    if (r->grad_fn) {
      r->grad_fn->acc = accumulate(r->grad_fn->acc, s, site);
      if (!r->grad_fn->acc) goto out;
    } else {
      int j = cap ? capture_index(cap, r, NULL) : -1;
      if (j >= 0) {
        if (!(cap->found[j] = accumulate(cap->found[j], s, site))) goto out;
      } else if (!cap && !accumulate_leaf(r, s, create, 0, site)) {
        goto out;
      }
    }
  }
  for (int i = 0; i < all.n; i++)
    if (all.items[i]->deps == 0 && !list_push(&ready, all.items[i])) goto oom;

  /* 3. Run the nodes in dependency order. */
  while (ready.n > 0) {
    rt_node *x = ready.items[--ready.n];
    em_tensor *g = x->acc;
    x->acc = NULL;
    if (g) {
      int j = cap ? capture_index(cap, NULL, x) : -1;
      if (j >= 0 && !(cap->found[j] = accumulate(cap->found[j], g, site))) {
        em_release(g);
        goto out;
      }
      em_tensor *small[4] = {0}, **grads = small;
      if (x->n_in > 4 && !(grads = rt_alloc(sizeof(em_tensor *) * (size_t)x->n_in, 16))) {
        em_release(g);
        goto oom;
      }
      memset(grads, 0, sizeof(em_tensor *) * (size_t)x->n_in);
      em_device prev = em_set_default_device(g->storage->device); /* the rules' zeros and scalars */
      bool vok = check_saved(x, site) && rt_vjp(x, g, grads);
      em_set_default_device(prev);
      em_release(g);
      for (int i = 0; vok && i < x->n_in; i++) {
        if (!grads[i]) continue;
        if (x->next[i]) {
          x->next[i]->acc = accumulate(x->next[i]->acc, grads[i], site);
          vok = x->next[i]->acc != NULL;
        } else if (x->leaf[i]) {
          int k = cap ? capture_index(cap, x->leaf[i], NULL) : -1;
          if (k >= 0) vok = (cap->found[k] = accumulate(cap->found[k], grads[i], site)) != NULL;
          else if (!cap) vok = accumulate_leaf(x->leaf[i], grads[i], create, fresh_after, site);
        }
      }
      if (grads != small) rt_free(grads);
      if (!vok) goto out;
    }
    if (!retain && !create && (x->custom || rt_vjp_saves_inputs(x->op))) {
      node_free_saved(x);
      x->released = true;
    }
    for (int i = 0; i < x->n_in; i++) {
      rt_node *c = x->next[i];
      if (c && --c->deps == 0 && !list_push(&ready, c)) goto oom;
    }
  }
  ok = true;
  goto out;
oom:
  rt_error(site, name, "out of memory running the backward pass");
out:
  for (int i = 0; i < all.n; i++) {
    em_release(all.items[i]->acc);
    all.items[i]->acc = NULL;
  }
  rt_free(all.items), rt_free(ready.items), rt_free(stack.items);
  em_scope_end_at(site);
  em_set_grad_enabled(prev_mode);
  rt_autocast_resume();
  return ok;
}

/* Under em_compile the backward is traced like any other ops; the accumulation into .grad is
 * a functionalized in-place add or a new binding of .grad, which the compiled entry replays. */
bool em_backward_at(em_tensor *out, em_tensor *grad, bool retain_graph, bool create_graph, em_site site) {
  if (!out) return false;
  return run_backward("em_backward", 1, &out, grad ? &grad : NULL, retain_graph, create_graph, NULL, site);
}

bool rt_grad(int n_outputs, em_tensor *const *outputs, em_tensor *const *grad_outputs, int n_inputs,
             em_tensor *const *inputs, em_tensor **grads, bool retain_graph, bool create_graph, bool allow_unused,
             em_site site) {
  if (n_outputs < 1 || !outputs || n_inputs < 1 || !inputs || !grads)
    return rt_error(site, "em_grad", "needs at least one output and one input (got %d and %d)", n_outputs, n_inputs), false;
  for (int i = 0; i < n_outputs; i++)
    if (!outputs[i] || (grad_outputs && !grad_outputs[i])) return false;
  for (int i = 0; i < n_inputs; i++) {
    grads[i] = NULL;
    if (!inputs[i]) return false;
    if (!inputs[i]->requires_grad) {
      char b[128];
      return rt_error(site, "em_grad", "input %d (%s) does not require grad", i, rt_fmt(b, sizeof b, inputs[i])), false;
    }
  }
  em_tensor **found = rt_alloc(sizeof(em_tensor *) * (size_t)n_inputs, 16);
  if (!found) return rt_error(site, "em_grad", "out of memory"), false;
  memset(found, 0, sizeof(em_tensor *) * (size_t)n_inputs);
  capture cap = {n_inputs, inputs, found};
  bool ok = run_backward("em_grad", n_outputs, outputs, grad_outputs, retain_graph, create_graph, &cap, site);
  for (int i = 0; i < n_inputs; i++) {
    if (ok) {
      if (!found[i] && allow_unused) continue;
      em_device prev = em_set_default_device(inputs[i]->storage->device);
      em_tensor *g = found[i] ? found[i] : em_retain(em_zeros_at(inputs[i]->dtype, inputs[i]->ndim, inputs[i]->sizes, site));
      em_set_default_device(prev);
      grads[i] = rt_scope_add(g, "em_grad", site);
      ok = grads[i] != NULL;
    } else {
      em_release(found[i]);
    }
  }
  if (!ok)
    for (int i = 0; i < n_inputs; i++) grads[i] = NULL;
  rt_free(found);
  return ok;
}

bool em_grad_at(int n_outputs, em_tensor *const *outputs, em_tensor *const *grad_outputs, int n_inputs,
                em_tensor *const *inputs, em_tensor **grads, bool retain_graph, bool create_graph, em_site site) {
  return rt_grad(n_outputs, outputs, grad_outputs, n_inputs, inputs, grads, retain_graph, create_graph, false, site);
}
