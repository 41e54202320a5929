/* runtime/dispatch.c: the one entry every op goes through.
 *
 * In eager mode a prim application is: operand checks, the prim's meta function (which also
 * produces the user-facing reason on bad input), then either a new view header or a freshly
 * allocated result filled by the reference kernel. Keeping this in one function is what will
 * let the tracer (record a node, return a proxy) and autograd (record a grad_fn) hook in at one
 * place later. */
#include "rt.h"
#include "cuda.h"
#include "../ir/graph.h"

#include <string.h>

/* Arithmetic kernels exist on the CPU only for the compute dtypes; f16/bf16 are storage types. */
static bool needs_compute(em_prim op) {
  unsigned f = prim_get(op)->flags;
  if (op == EM_PRIM_CONVERT) return false;
  return (f & (P_POINTWISE | P_REDUCTION | P_EXTERN | P_SCAN)) || op == EM_PRIM_SCATTER_ADD;
}

/* Device placement, as PyTorch's: operands must be on one device, except that a CPU tensor
 * holding one element (a scalar, possibly expanded) may join CUDA operands; it is copied to the
 * device (dev_in[i], a new reference, else NULL). The result's device is the operands' (for
 * creation prims, the default device). */
static bool place(const char *name, em_tensor *const *in, int n_in, em_tensor **dev_in, em_device *dev, bool force_cuda,
                  em_site site) {
  *dev = force_cuda ? EM_CUDA : n_in ? EM_CPU : rt_default_device();
  for (int i = 0; i < n_in; i++)
    if (in[i]->storage->device == EM_CUDA) *dev = EM_CUDA;
  for (int i = 0; i < n_in; i++) {
    dev_in[i] = NULL;
    if (*dev != EM_CUDA || in[i]->storage->device == EM_CUDA) continue;
    bool scalar = !in[i]->proxy;
    for (int d = 0; d < in[i]->ndim; d++) scalar &= in[i]->sizes[d] <= 1 || in[i]->strides[d] == 0;
    if (!scalar) {
      char b0[128], b1[128];
      int j = 0;
      while (j < n_in - 1 && in[j]->storage->device != EM_CUDA) j++;
      rt_error(site, name, "expected all operands on one device: operand %d is %s on cpu, operand %d is %s on cuda "
               "(move it with em_to)", i, rt_fmt(b0, sizeof b0, in[i]), j, rt_fmt(b1, sizeof b1, in[j]));
      goto fail;
    }
    if (!(dev_in[i] = cu_scalar_to_device(in[i], name, site))) goto fail;
  }
  return true;
fail:
  for (int i = 0; i < n_in; i++) em_release(dev_in[i]), dev_in[i] = NULL;
  return false;
}

static bool check_operands(const char *name, em_prim op, em_tensor *const *in, int n_in,
                           prim_meta *metas, em_site site) {
  bool cuda = false;
  for (int i = 0; i < n_in; i++) cuda |= in[i]->storage->device == EM_CUDA;
  for (int i = 0; i < n_in; i++) {
    metas[i] = rt_meta(in[i]);
    if (in[i]->proxy && !rt_tracing()) {
      char b[128];
      rt_error(site, name, "%s is a proxy of a finished trace: a tensor escaped its compiled function (through "
               "ctx or a static?); return it from the function instead", rt_fmt(b, sizeof b, in[i]));
      return false;
    }
    if (!cuda && needs_compute(op) && !ir_dtype(in[i]->dtype)->cpu_compute) {
      char b[128];
      rt_error(site, name, "%s has no CPU kernels (f16 and bf16 are storage types on the CPU; cast first)",
               rt_fmt(b, sizeof b, in[i]));
      return false;
    }
  }
  return true;
}

/* NULL operands (an earlier op failed: its error is recorded) and EM_NONE where a tensor is
 * required (its header has no storage: issue 17 found 74 ops that crashed on it) stop here, for
 * every op, before anything reads a header. */
static bool operands_present(const char *name, em_tensor *const *in, int n_in, em_site site) {
  for (int i = 0; i < n_in; i++) {
    if (!in[i]) return false;
    if (in[i] == EM_NONE || !in[i]->storage)
      return rt_error(site, name, "operand %d is EM_NONE, where a tensor is required", i), false;
  }
  return true;
}

static em_tensor *dispatch_eager(const char *name, em_prim op, em_tensor *const *in, int n_in,
                                 const prim_attrs *at, em_site site);

em_tensor *rt_dispatch(const char *name, em_prim op, em_tensor *const *in, int n_in,
                       const prim_attrs *at, em_site site) {
  if (!operands_present(name, in, n_in, site)) return NULL;
  rt_trace *tr = rt_tracing();
  if (tr) return rt_trace_dispatch(tr, name, op, in, n_in, at, site);
  if (!RT_PROF_ON()) return dispatch_eager(name, op, in, n_in, at, site);
  uint64_t t0 = rt_prof_now();
  em_tensor *r = dispatch_eager(name, op, in, n_in, at, site);
  rt_prof_op(name, in, n_in, t0);
  return r;
}

static em_tensor *dispatch_eager(const char *name, em_prim op, em_tensor *const *in, int n_in,
                                 const prim_attrs *at, em_site site) {
  enum { MAX_IN = 64 };
  prim_meta metas_small[4], *metas = metas_small, out_meta;
  if (n_in > 4) {
    if (n_in > MAX_IN) return rt_error(site, name, "takes at most %d operands, got %d", MAX_IN, n_in);
    metas = rt_alloc(sizeof(prim_meta) * (size_t)n_in, 16);
    if (!metas) return rt_error(site, name, "out of memory");
  }
  em_tensor *out = NULL;
  char err[512];
  if (!check_operands(name, op, in, n_in, metas, site)) goto done;
  if (!prim_meta_fn(op, at, metas, n_in, &out_meta, err, sizeof err)) {
    rt_error(site, name, "%s", err);
    goto done;
  }
  if (prim_get(op)->flags & P_VIEW) {
    out = rt_new_view(in[0], out_meta.ndim, out_meta.sizes, out_meta.strides, out_meta.offset, name, site);
    goto record;
  }
  em_device dev;
  em_tensor *dev_small[4] = {0}, **dev_in = n_in > 4 ? rt_alloc(sizeof(em_tensor *) * (size_t)n_in, 16) : dev_small;
  if (!dev_in) {
    rt_error(site, name, "out of memory");
    goto done;
  }
  bool placed = place(name, in, n_in, dev_in, &dev, false, site);
  if (placed && dev == EM_CUDA) {
    em_tensor *ops_small[4], **ops = n_in > 4 ? rt_alloc(sizeof(em_tensor *) * (size_t)n_in, 16) : ops_small;
    if (ops) {
      for (int i = 0; i < n_in; i++) ops[i] = dev_in[i] ? dev_in[i] : in[i];
      out = rt_new_device(out_meta.dtype, out_meta.ndim, out_meta.sizes, EM_CUDA, name, site);
      err[0] = 0;
      if (out && !cu_run_prim(op, at, out, ops, n_in, err, sizeof err)) { /* an error already recorded stays */
        em_release(out);
        out = rt_error(site, name, "%s", err[0] ? err : "failed on the device");
      }
      /* autograd saves the device copies of CPU scalars (so the rules compute on the device),
       * except those that require grad, which keep their edge */
      for (int i = 0; i < n_in; i++)
        if (in[i]->requires_grad) ops[i] = in[i];
      if (out && !rt_autograd_record(name, op, ops, n_in, at, out, site)) {
        em_release(out);
        out = NULL;
      }
      if (ops != ops_small) rt_free(ops);
    } else {
      rt_error(site, name, "out of memory");
    }
    for (int i = 0; i < n_in; i++) em_release(dev_in[i]);
    if (dev_in != dev_small) rt_free(dev_in);
    goto done;
  }
  if (dev_in != dev_small) rt_free(dev_in);
  if (!placed) goto done;
  out = rt_new(out_meta.dtype, out_meta.ndim, out_meta.sizes, name, site);
  if (!out) goto done;
  prim_buf bufs_small[4], *bufs = bufs_small;
  if (n_in > 4) {
    bufs = rt_alloc(sizeof(prim_buf) * (size_t)n_in, 16);
    if (!bufs) {
      em_release(out);
      out = rt_error(site, name, "out of memory");
      goto done;
    }
  }
  for (int i = 0; i < n_in; i++) bufs[i] = rt_buf(in[i]);
  prim_buf ob = rt_buf(out);
  if (!prim_run(op, at, &ob, bufs, n_in, err, sizeof err)) {
    em_release(out);
    out = rt_error(site, name, "%s", err);
  }
  if (bufs != bufs_small) rt_free(bufs);
record:
  if (out && !rt_autograd_record(name, op, in, n_in, at, out, site)) {
    em_release(out);
    out = NULL;
  }
done:
  if (metas != metas_small) rt_free(metas);
  return out;
}

/* Under a trace an in-place write is a graph break: the graph so far runs, the proxies become
 * real tensors, and the write happens eagerly. Functionalization (AOT autograd) will instead
 * turn it into an out-of-place node and a write-back. */
static bool dispatch_out(const char *name, em_prim op, em_tensor *const *in, int n_in,
                         const prim_attrs *at, em_tensor *out, em_site site);

bool rt_dispatch_out(const char *name, em_prim op, em_tensor *const *in, int n_in,
                     const prim_attrs *at, em_tensor *out, em_site site) {
  EM_ASSERT(prim_get(op)->flags & P_POINTWISE);
  EM_ASSERT(n_in <= 4);
  if (!operands_present(name, &out, 1, site) || !operands_present(name, in, n_in, site)) return false;
  rt_trace *tr = rt_tracing();
  if (tr) {
    int r = rt_trace_inplace(tr, name, op, in, n_in, at, out, site);
    if (r != 0) return r > 0;
  }
  int tok = rt_break_begin(name, "writes in place into a tensor whose aliases the graph cannot follow", site);
  if (tok < 0) return false;
  bool ok = dispatch_out(name, op, in, n_in, at, out, site);
  rt_break_end(tok);
  return ok;
}

int rt_trace_inplace(rt_trace *tr, const char *name, em_prim op, em_tensor *const *in, int n_in, const prim_attrs *at,
                     em_tensor *out, em_site site) {
  prim_meta metas[4], m;
  int ids[4];
  char err[512], b0[128], b1[128];
  if (!check_operands(name, op, in, n_in, metas, site)) return -1;
  if (!rt_autograd_check_inplace(name, out, in, n_in, site)) return -1;
  if (!prim_meta_fn(op, at, metas, n_in, &m, err, sizeof err)) return rt_error(site, name, "%s", err), -1;
  if (m.dtype != out->dtype || m.ndim != out->ndim || memcmp(m.sizes, out->sizes, sizeof(int64_t) * (size_t)m.ndim))
    return rt_error(site, name, "result %s does not fit the destination %s",
                    ir_fmt_type(b0, sizeof b0, m.dtype, m.ndim, m.sizes), rt_fmt(b1, sizeof b1, out)), -1;
  for (int i = 0; i < n_in; i++) {
    ids[i] = rt_trace_operand(tr, in[i], name, site);
    if (ids[i] == -2) return 0;
    if (ids[i] < 0) return -1;
  }
  ir_type ty = ir_type_of_meta(&m, out->storage->device);
  if (tr->max_nodes > 0 && tr->g->n_nodes >= tr->max_nodes)
    return rt_error(site, name, "the trace grew past %d nodes", tr->max_nodes), -1;
  int v = ir_add_node(tr->g, op, ids, n_in, at, &ty, site, name);
  if (v < 0) return rt_error(site, name, "out of memory recording a graph node"), -1;
  int w = rt_trace_write(tr, out, v, site);
  if (w <= 0) return w; /* 0: not expressible; the node stays unused (DCE drops it) and we break */
  tr->n_ops++;
  rt_bump_version(out, name, site);
  return 1;
}

static bool dispatch_out(const char *name, em_prim op, em_tensor *const *in, int n_in,
                         const prim_attrs *at, em_tensor *out, em_site site) {
  prim_meta metas[4], m;
  char err[512], b0[128], b1[128];
  if (!check_operands(name, op, in, n_in, metas, site)) return false;
  if (!rt_autograd_check_inplace(name, out, in, n_in, site)) return false;
  if (!prim_meta_fn(op, at, metas, n_in, &m, err, sizeof err)) return rt_error(site, name, "%s", err), false;
  if (m.dtype != out->dtype || m.ndim != out->ndim || memcmp(m.sizes, out->sizes, sizeof(int64_t) * (size_t)m.ndim))
    return rt_error(site, name, "result %s does not fit the destination %s",
                    ir_fmt_type(b0, sizeof b0, m.dtype, m.ndim, m.sizes), rt_fmt(b1, sizeof b1, out)), false;
  em_tensor *dev_in[4] = {0}, *ops[4];
  em_device dev = out->storage->device;
  for (int i = 0; i < n_in; i++)
    if (in[i]->storage->device == EM_CUDA) dev = EM_CUDA;
  if (dev == EM_CUDA) {
    if (out->storage->device != EM_CUDA) {
      char b[128];
      return rt_error(site, name, "writes into %s on cpu from operands on cuda", rt_fmt(b, sizeof b, out)), false;
    }
    if (!place(name, in, n_in, dev_in, &dev, true, site)) return false;
    for (int i = 0; i < n_in; i++) ops[i] = dev_in[i] ? dev_in[i] : in[i];
    err[0] = 0;
    bool ok = cu_run_prim(op, at, out, ops, n_in, err, sizeof err);
    for (int i = 0; i < n_in; i++) em_release(dev_in[i]);
    if (!ok) return rt_error(site, name, "%s", err[0] ? err : "failed on the device"), false;
    rt_bump_version(out, name, site);
    return true;
  }
  prim_buf bufs[4], ob = rt_buf(out);
  for (int i = 0; i < n_in; i++) bufs[i] = rt_buf(in[i]);
  if (!prim_run(op, at, &ob, bufs, n_in, err, sizeof err)) return rt_error(site, name, "%s", err), false;
  rt_bump_version(out, name, site);
  return true;
}

/* ---- tracing ---- */

/* Whether t is one element broadcast (every dim of size > 1 has stride 0). */
static bool broadcast_scalar(const em_tensor *t) {
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] > 1 && t->strides[d]) return false;
  return true;
}

/* A CPU scalar broadcast over a CUDA op's shape (a concrete tensor the trace meets, e.g. a
 * constant an interpreted graph expanded) enters the graph as its one element and an expand,
 * so the graph says it is a scalar (ir_verify lets those join device operands). */
static int lift_broadcast_scalar(rt_trace *tr, em_tensor *t, const char *name, em_site site) {
  int64_t ones[EM_MAX_DIMS], zeros[EM_MAX_DIMS];
  for (int d = 0; d < t->ndim; d++) ones[d] = 1, zeros[d] = 0;
  em_tensor *one = rt_new_view(t, t->ndim, ones, zeros, t->offset, name, site);
  if (!one) return -1;
  int b = rt_trace_operand(tr, one, name, site);
  em_release(one); /* the trace holds it while it is lifted */
  if (b < 0) return b;
  prim_attrs at = {.shape = {.ndim = t->ndim}};
  for (int d = 0; d < t->ndim; d++) at.shape.sizes[d] = t->sizes[d];
  prim_meta m = rt_meta(t);
  ir_type ty = ir_type_of_meta(&m, EM_CPU);
  int v = ir_add_node(tr->g, EM_PRIM_EXPAND, &b, 1, &at, &ty, site, name);
  if (v < 0) rt_error(site, name, "out of memory recording a graph node");
  return v;
}

em_tensor *rt_trace_dispatch(rt_trace *tr, const char *name, em_prim op, em_tensor *const *in, int n_in,
                             const prim_attrs *at, em_site site) {
  enum { MAX_IN = 64 };
  if (n_in > MAX_IN) return rt_error(site, name, "takes at most %d operands, got %d", MAX_IN, n_in);
  prim_meta metas[MAX_IN], out_meta;
  int ids[MAX_IN];
  char err[512];
  if (!check_operands(name, op, in, n_in, metas, site)) return NULL;
  bool cuda_op = false;
  for (int i = 0; i < n_in; i++) cuda_op |= in[i]->storage->device == EM_CUDA;
  for (int i = 0; i < n_in; i++) {
    if (cuda_op && !in[i]->proxy && in[i]->storage->device == EM_CPU && in[i]->numel > 1 && broadcast_scalar(in[i]))
      ids[i] = lift_broadcast_scalar(tr, in[i], name, site);
    else
      ids[i] = rt_trace_operand(tr, in[i], name, site);
    if (ids[i] == -2) { /* in[i] aliases a tensor the graph wrote: break, then run eagerly */
      int tok = rt_break_begin(name, "reads a tensor that aliases one written in place earlier in the graph", site);
      if (tok < 0) return NULL;
      em_tensor *r = rt_dispatch(name, op, in, n_in, at, site);
      rt_break_end(tok);
      return r;
    }
    if (ids[i] < 0) return NULL;
  }
  if (!prim_meta_fn(op, at, metas, n_in, &out_meta, err, sizeof err)) return rt_error(site, name, "%s", err);
  /* placed as eager places it (place): on the operands' device, a CPU one-element operand
   * joining CUDA ones; creation on the default device */
  em_device dev = n_in ? EM_CPU : rt_default_device();
  for (int i = 0; i < n_in; i++)
    if (in[i]->storage->device == EM_CUDA) dev = EM_CUDA;
  for (int i = 0; i < n_in && dev == EM_CUDA; i++) {
    if (in[i]->storage->device == EM_CUDA) continue;
    bool scalar = true;
    for (int d = 0; d < in[i]->ndim; d++) scalar &= in[i]->sizes[d] <= 1 || in[i]->strides[d] == 0;
    if (!scalar) {
      char b0[128], b1[128];
      int j = 0;
      while (j < n_in - 1 && in[j]->storage->device != EM_CUDA) j++;
      return rt_error(site, name, "expected all operands on one device: operand %d is %s on cpu, operand %d is %s on "
                      "cuda (move it with em_to)", i, rt_fmt(b0, sizeof b0, in[i]), j, rt_fmt(b1, sizeof b1, in[j]));
    }
  }
  ir_type ty = ir_type_of_meta(&out_meta, dev);
  if (tr->max_nodes > 0 && tr->g->n_nodes >= tr->max_nodes)
    return rt_error(site, name, "the trace grew past %d nodes", tr->max_nodes);
  int v = ir_add_node(tr->g, op, ids, n_in, at, &ty, site, name);
  if (v < 0) return rt_error(site, name, "out of memory recording a graph node");
  tr->n_ops++;
  bool view = prim_get(op)->flags & P_VIEW;
  em_tensor *out = rt_new_proxy(view ? in[0] : NULL, &out_meta, v, tr, name, site);
  if (out && view) { /* provenance, for writes into the view (functionalization) */
    out->view_base = em_retain(in[0]);
    out->view_node = tr->g->n_nodes - 1;
    out->view_graph = tr->graph_serial;
  }
  if (out && !rt_autograd_record(name, op, in, n_in, at, out, site)) {
    em_release(out);
    out = NULL;
  }
  return out;
}
