/* runtime/nn.c: parameter initialisation, layers and optimizers as torch.nn and torch.optim
 * define them.
 *
 * Everything here is written on top of the public op API, so it needs no kernels of its own and
 * every allocation goes through the runtime's allocator. Initialisers and optimizer steps write
 * parameters in place, so they run under no-grad (in grad mode the autograd engine refuses
 * in-place writes to leaves that require grad), each inside a private scope so that every
 * temporary of a call is freed when it returns. An optimizer holds its parameters and its state
 * tensors by reference (em_retain), not through any scope, because it outlives the scopes of the
 * training loop that drives it. */
#include "rt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- initialisation ---- */

em_tensor *em_init_uniform__at(em_tensor *t, double lo, double hi, em_site site) {
  static const char name[] = "em_init_uniform_";
  if (!t) return NULL;
  char b[128];
  if (!ir_is_float(t->dtype)) return rt_error(site, name, "needs a floating tensor, got %s", rt_fmt(b, sizeof b, t));
  /* As Tensor.uniform_, which refuses from > to; the finiteness check also keeps NaN and
   * infinite bounds from filling a parameter with NaN. */
  if (!(isfinite(lo) && isfinite(hi) && lo <= hi && isfinite(hi - lo)))
    return rt_error(site, name, "needs finite bounds with lo <= hi, got [%g, %g)", lo, hi);
  if (!em_scope_begin_at(site)) return NULL;
  em_no_grad_begin();
  /* The generator draws f32 or f64 only; half-precision parameters take f32 draws, rounded by
   * the copy. */
  em_dtype draw = t->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *u = em_add_scalar_at(em_mul_scalar_at(em_rand_at(draw, t->ndim, t->sizes, site), hi - lo, site), lo, site);
  em_tensor *r = u ? em_copy__at(t, u, site) : NULL;
  em_no_grad_end();
  em_scope_end_at(site);
  return r;
}

/* torch.nn.init._calculate_fan_in_and_fan_out: input feature maps times the receptive field. */
static int64_t fan_in(const em_tensor *t) {
  int64_t f = t->sizes[1];
  for (int i = 2; i < t->ndim; i++) f *= t->sizes[i];
  return f;
}

em_tensor *em_init_kaiming_uniform__at(em_tensor *t, double a, em_site site) {
  if (!t) return NULL;
  char b[128];
  if (t->ndim < 2)
    return rt_error(site, "em_init_kaiming_uniform_", "needs at least 2 dims to find fan_in, got %s",
                    rt_fmt(b, sizeof b, t));
  /* gain = sqrt(2 / (1 + a^2)) (leaky_relu), bound = gain * sqrt(3 / fan_in). A tensor with no
   * elements has fan_in 0 and nothing to fill; bound 0 keeps the arithmetic finite. */
  int64_t f = fan_in(t);
  double bound = f > 0 ? sqrt(6.0 / ((1 + a * a) * (double)f)) : 0;
  return em_init_uniform__at(t, -bound, bound, site);
}

/* ---- layers ---- */

/* An f32 parameter of the given shape, kaiming-uniform with a = sqrt(5) (what nn.Linear and
 * nn.Conv2d do in reset_parameters) or U(-bound, bound), marked as requiring grad. Owned by the
 * current scope. */
static em_tensor *param(int ndim, const int64_t *sizes, bool kaiming, double bound, em_site site) {
  em_tensor *t = em_empty_at(EM_F32, ndim, sizes, site);
  t = kaiming ? em_init_kaiming_uniform__at(t, sqrt(5.0), site) : em_init_uniform__at(t, -bound, bound, site);
  return em_requires_grad__at(t, true, site);
}

/* Makes a layer's weight and bias in a private scope and hands them to the caller's scope only
 * when both exist, so a failure (out of memory, say) frees the half-built layer at once. Should
 * the bias's hand-over itself fail, the weight already handed over goes when the caller's scope
 * ends, like any other result. */
static bool make_layer(const char *name, em_tensor **weight, em_tensor **bias, int ndim, const int64_t *wsizes,
                       int64_t out, bool has_bias, em_site site) {
  *weight = *bias = NULL;
  int64_t f = 1; /* fan_in; a weight whose element count does not fit fails in em_empty below */
  for (int i = 1; i < ndim; i++)
    if (!ir_mul_ok(f, wsizes[i], &f)) f = INT64_MAX;
  if (!rt_scope_begin_op(name, site)) return false;
  /* nn.Linear / nn.Conv2d: bias bound 1 / sqrt(fan_in), 0 when fan_in is 0. */
  em_tensor *w = param(ndim, wsizes, true, 0, site);
  em_tensor *b = !w ? NULL : has_bias ? param(1, &out, false, f > 0 ? 1 / sqrt((double)f) : 0, site) : EM_NONE;
  bool ok = b && em_keep_at(w, site) && (b == EM_NONE || em_keep_at(b, site));
  em_scope_end_at(site);
  if (ok) *weight = w, *bias = b;
  return ok;
}

bool em_linear_layer_init_at(em_linear_layer *l, int64_t in, int64_t out, bool has_bias, em_site site) {
  static const char name[] = "em_linear_layer_init";
  if (!l) return rt_error(site, name, "layer is NULL"), false;
  l->weight = l->bias = NULL;
  /* nn.Linear accepts zero features (an empty weight); only negative sizes are meaningless. */
  if (in < 0 || out < 0)
    return rt_error(site, name, "sizes must be >= 0, got in %lld, out %lld", (long long)in, (long long)out), false;
  return make_layer(name, &l->weight, &l->bias, 2, (int64_t[]){out, in}, out, has_bias, site);
}

bool em_conv2d_layer_init_at(em_conv2d_layer *l, int64_t in, int64_t out, int64_t kh, int64_t kw, em_conv2d_params p,
                             bool has_bias, em_site site) {
  static const char name[] = "em_conv2d_layer_init";
  if (!l) return rt_error(site, name, "layer is NULL"), false;
  l->weight = l->bias = NULL;
  l->params = p;
  if (p.groups < 1 || in < 0 || out < 0 || in % p.groups || out % p.groups)
    return rt_error(site, name, "groups (%lld) must be >= 1 and divide both channel counts (%lld -> %lld)",
                    (long long)p.groups, (long long)in, (long long)out), false;
  /* Checked here as well as by em_conv2d, so a bad layer is reported where it is built. */
  if (kh < 1 || kw < 1 || p.stride[0] < 1 || p.stride[1] < 1 || p.padding[0] < 0 || p.padding[1] < 0 ||
      p.dilation[0] < 1 || p.dilation[1] < 1)
    return rt_error(site, name,
                    "bad kernel or params: kernel %lldx%lld (>= 1), stride (%lld, %lld) (>= 1), padding (%lld, %lld) "
                    "(>= 0), dilation (%lld, %lld) (>= 1)",
                    (long long)kh, (long long)kw, (long long)p.stride[0], (long long)p.stride[1],
                    (long long)p.padding[0], (long long)p.padding[1], (long long)p.dilation[0],
                    (long long)p.dilation[1]), false;
  if (p.padding_mode != EM_CONV_PAD_EXPLICIT && p.padding_mode != EM_CONV_PAD_SAME && p.padding_mode != EM_CONV_PAD_VALID)
    return rt_error(site, name, "unknown padding_mode %d", (int)p.padding_mode), false;
  if (p.padding_mode == EM_CONV_PAD_SAME && (p.stride[0] != 1 || p.stride[1] != 1))
    return rt_error(site, name, "padding 'same' needs stride 1, got (%lld, %lld) (as torch)", (long long)p.stride[0],
                    (long long)p.stride[1]), false;
  return make_layer(name, &l->weight, &l->bias, 4, (int64_t[]){out, in / p.groups, kh, kw}, out, has_bias, site);
}

/* ---- optimizers ---- */

typedef enum { SGD, ADAMW } opt_kind;

/* One allocation: the header, then per parameter its reference, three state slots and a step
 * count. State slots stay NULL until a parameter's first step, as PyTorch creates state lazily
 * (SGD's momentum buffer starts as a copy of the first gradient, not as zeros).
 *
 * The learning rate and the step counts are 0-dim f64 tensors on the CPU, as in PyTorch's
 * capturable optimizers: a step traced by em_compile reads them as graph inputs and advances
 * the counts in place, so a new lr (any schedule, every step) or the next step count changes an
 * input, never the graph, and AdamW's step is no graph break. The scalar arithmetic is done in
 * f64 exactly as the host formulas were, then rounded to the parameter's dtype, so results keep
 * their bits. */
struct em_optimizer {
  opt_kind kind;
  em_sgd_opts sgd;      /* lr: the host copy em_optimizer_get_lr reads */
  em_adamw_opts adamw;
  em_tensor *lr;        /* 0-dim f64 */
  int n;
  em_tensor **params;
  em_tensor **state[3]; /* SGD: momentum buffer; AdamW: exp_avg, exp_avg_sq, max_exp_avg_sq */
  em_tensor **steps;    /* AdamW: 0-dim f64 count of the updates made to each parameter */
};

void em_optimizer_free(em_optimizer *o) {
  if (!o) return;
  for (int i = 0; i < o->n; i++) {
    em_release(o->params[i]);
    for (int k = 0; k < 3; k++) em_release(o->state[k][i]);
    em_release(o->steps[i]);
  }
  em_release(o->lr);
  rt_free(o);
}

/* A 0-dim f64 hyperparameter on the CPU, owned by the caller (the optimizer). */
static em_tensor *host_scalar(double v, em_site site) {
  em_device prev = em_set_default_device(EM_CPU);
  em_tensor *t = em_retain(em_scalar_at(EM_F64, v, site));
  em_set_default_device(prev);
  return t;
}

static em_optimizer *new_optimizer(opt_kind kind, int n, em_tensor *const *params, const char *name, em_site site) {
  char b[128];
  if (n < 1 || !params) return rt_error(site, name, "needs at least one parameter, got %d", n);
  for (int i = 0; i < n; i++) {
    if (!params[i]) return NULL; /* the op that should have made it recorded why */
    if (!params[i]->requires_grad || params[i]->grad_fn || !ir_is_float(params[i]->dtype))
      return rt_error(site, name, "parameter %d (%s) is not a floating leaf that requires grad", i,
                      rt_fmt(b, sizeof b, params[i]));
  }
  size_t k = (size_t)n;
  size_t bytes = sizeof(em_optimizer) + k * 5 * sizeof(em_tensor *);
  em_optimizer *o = rt_alloc(bytes, 16);
  if (!o) return rt_error(site, name, "out of memory allocating an optimizer over %d parameters", n);
  memset(o, 0, bytes);
  char *p = (char *)(o + 1);
  o->params = (em_tensor **)p, p += k * sizeof(em_tensor *);
  for (int s = 0; s < 3; s++) o->state[s] = (em_tensor **)p, p += k * sizeof(em_tensor *);
  o->steps = (em_tensor **)p;
  o->kind = kind;
  o->n = n;
  for (int i = 0; i < n; i++) o->params[i] = em_retain(params[i]);
  return o;
}

/* Validation as torch.optim.SGD.__init__ (NaN fails the comparisons, so it is refused too). */
em_optimizer *em_sgd_new_at(int n, em_tensor *const *params, em_sgd_opts opts, em_site site) {
  static const char name[] = "em_sgd_new";
  if (!(opts.lr >= 0 && opts.momentum >= 0 && opts.weight_decay >= 0))
    return rt_error(site, name, "lr, momentum and weight_decay must be >= 0, got %g, %g, %g", opts.lr, opts.momentum,
                    opts.weight_decay);
  if (opts.nesterov && (opts.momentum <= 0 || opts.dampening != 0))
    return rt_error(site, name, "nesterov momentum requires a momentum and zero dampening, got %g and %g",
                    opts.momentum, opts.dampening);
  em_optimizer *o = new_optimizer(SGD, n, params, name, site);
  if (o) o->sgd = opts;
  if (o && !(o->lr = host_scalar(opts.lr, site))) em_optimizer_free(o), o = NULL;
  return o;
}

/* Validation as torch.optim.AdamW.__init__. */
em_optimizer *em_adamw_new_at(int n, em_tensor *const *params, em_adamw_opts opts, em_site site) {
  static const char name[] = "em_adamw_new";
  if (!(opts.lr >= 0 && opts.eps >= 0 && opts.weight_decay >= 0))
    return rt_error(site, name, "lr, eps and weight_decay must be >= 0, got %g, %g, %g", opts.lr, opts.eps,
                    opts.weight_decay);
  if (!(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1))
    return rt_error(site, name, "betas must be in [0, 1), got (%g, %g)", opts.beta1, opts.beta2);
  em_optimizer *o = new_optimizer(ADAMW, n, params, name, site);
  if (o) o->adamw = opts;
  if (o && !(o->lr = host_scalar(opts.lr, site))) em_optimizer_free(o), o = NULL;
  return o;
}

void em_optimizer_zero_grad(em_optimizer *o) {
  if (!o) return;
  for (int i = 0; i < o->n; i++) em_zero_grad(o->params[i]);
}

/* Writes the lr tensor in place: compiled steps read it as an input, so nothing recompiles.
 * Inside a traced function the write is traced like any in-place op. */
void em_optimizer_set_lr(em_optimizer *o, double lr) {
  if (!o) return;
  em_no_grad_begin();
  em_fill__at(o->lr, lr, EM_HERE);
  em_no_grad_end();
  if (o->kind == SGD) o->sgd.lr = lr;
  else o->adamw.lr = lr;
}

/* The lr as a 0-dim tensor of dtype dt: f64 arithmetic rounded once, as a double scalar
 * argument is (em_mul_scalar(x, lr) converts lr to x's dtype). */
static em_tensor *as_dtype(em_tensor *x, em_dtype dt, em_site site) { return em_cast_at(x, dt, site); }

double em_optimizer_get_lr(const em_optimizer *o) { return !o ? NAN : o->kind == SGD ? o->sgd.lr : o->adamw.lr; }

/* torch.optim.SGD, per parameter: g = grad + wd p; buf = g (first step) or
 * momentum buf + (1 - dampening) g; g = nesterov ? g + momentum buf : buf; p -= lr g. */
static bool sgd_step(em_optimizer *o, int i, em_tensor *p, em_tensor *g, em_site site) {
  const em_sgd_opts *s = &o->sgd;
  em_tensor **buf = &o->state[0][i];
  if (s->momentum != 0 && !*buf) { /* the first step makes the buffer, outside any fused update */
    if (s->weight_decay != 0) g = em_add_at(g, em_mul_scalar_at(p, s->weight_decay, site), site);
    /* A copy, not g itself: g may be the parameter's .grad, which backward accumulates into.
     * The optimizer's reference keeps it alive past the step's scope. */
    if (!(*buf = em_retain(em_clone_at(g, site)))) return false;
    g = s->nesterov ? em_add_at(g, em_mul_scalar_at(*buf, s->momentum, site), site) : *buf;
    return em_sub__at(p, em_mul_at(g, as_dtype(o->lr, p->dtype, site), site), site) != NULL;
  }
  return rt_sgd_update(p, g, s->momentum != 0 ? *buf : NULL, o->lr, s->weight_decay, s->momentum, s->dampening,
                       s->nesterov, site);
}

bool rt_sgd_update(em_tensor *p, em_tensor *g, em_tensor *buf, em_tensor *lr, double weight_decay, double momentum,
                   double dampening, bool nesterov, em_site site) {
  em_tensor *fused;
  if (rt_fused(RT_FUSE_SGD, (double[]){weight_decay, momentum, dampening, nesterov}, 4,
               (em_tensor *[]){p, g, buf ? buf : EM_NONE, lr}, 4, &fused, site))
    return fused != NULL;
  if (weight_decay != 0) g = em_add_at(g, em_mul_scalar_at(p, weight_decay, site), site);
  if (buf) {
    if (!em_mul_scalar__at(buf, momentum, site) || !em_add__at(buf, em_mul_scalar_at(g, 1 - dampening, site), site))
      return false;
    g = nesterov ? em_add_at(g, em_mul_scalar_at(buf, momentum, site), site) : buf;
  }
  return em_sub__at(p, em_mul_at(g, as_dtype(lr, p->dtype, site), site), site) != NULL;
}

/* torch.optim.AdamW, per parameter at step t: p *= 1 - lr wd; m = b1 m + (1 - b1) g;
 * v = b2 v + (1 - b2) g^2; vmax = max(vmax, v) with amsgrad;
 * p -= lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps), grouped as PyTorch's
 * single-tensor implementation groups it, so results agree to rounding. */
static bool adamw_step(em_optimizer *o, int i, em_tensor *p, em_tensor *g, em_site site) {
  const em_adamw_opts *a = &o->adamw;
  /* State made here lives past the step's scope through the optimizer's reference. */
  for (int k = 0; k < (a->amsgrad ? 3 : 2); k++)
    if (!o->state[k][i]) {
      em_device prev = em_set_default_device(p->storage->device);
      o->state[k][i] = em_retain(em_zeros_at(p->dtype, p->ndim, p->sizes, site));
      em_set_default_device(prev);
      if (!o->state[k][i]) return false;
    }
  if (!o->steps[i] && !(o->steps[i] = host_scalar(0, site))) return false;
  return rt_adamw_update(p, g, o->state[0][i], o->state[1][i], o->state[2][i], o->steps[i], o->lr, a, site);
}

bool rt_adamw_update(em_tensor *p, em_tensor *g, em_tensor *m, em_tensor *v, em_tensor *vmax, em_tensor *t,
                     em_tensor *lr, const em_adamw_opts *a, em_site site) {
  em_tensor *fused;
  if (rt_fused(RT_FUSE_ADAMW, (double[]){a->beta1, a->beta2, a->eps, a->weight_decay, a->amsgrad}, 5,
               (em_tensor *[]){p, g, m, v, vmax ? vmax : EM_NONE, t, lr}, 7, &fused, site))
    return fused != NULL;
  if (!em_add_scalar__at(t, 1, site)) return false;
  em_dtype dt = p->dtype;
  /* p *= 1 - lr wd, with 1 - lr wd formed in f64 */
  if (a->weight_decay != 0 &&
      !em_mul__at(p, as_dtype(em_add_scalar_at(em_neg_at(em_mul_scalar_at(lr, a->weight_decay, site), site), 1, site), dt, site), site))
    return false;
  if (!em_mul_scalar__at(m, a->beta1, site) || !em_add__at(m, em_mul_scalar_at(g, 1 - a->beta1, site), site) ||
      !em_mul_scalar__at(v, a->beta2, site) ||
      !em_add__at(v, em_mul_scalar_at(em_mul_at(g, g, site), 1 - a->beta2, site), site))
    return false;
  if (a->amsgrad && !em_copy__at(vmax, em_maximum_at(vmax, v, site), site)) return false;
  /* bias corrections 1 - beta^t in f64 from the step count tensor */
  em_tensor *bc1 = em_add_scalar_at(em_neg_at(em_pow_at(em_scalar_at(EM_F64, a->beta1, site), t, site), site), 1, site);
  em_tensor *bc2 = em_add_scalar_at(em_neg_at(em_pow_at(em_scalar_at(EM_F64, a->beta2, site), t, site), site), 1, site);
  em_tensor *denom = em_add_scalar_at(em_div_at(em_sqrt_at(a->amsgrad ? vmax : v, site), as_dtype(em_sqrt_at(bc2, site), dt, site), site),
                                      a->eps, site);
  em_tensor *upd = em_mul_at(em_div_at(m, denom, site), as_dtype(em_div_at(lr, bc1, site), dt, site), site);
  return em_sub__at(p, upd, site) != NULL;
}

bool em_optimizer_step_at(em_optimizer *o, em_site site) {
  if (!o) return rt_error(site, "em_optimizer_step", "optimizer is NULL"), false;
  /* Under em_compile the updates are functionalized (see trace.c); the lr and AdamW's step
   * counts are tensors (see em_optimizer), so the whole step traces into the graph. */
  em_no_grad_begin();
  bool ok = true;
  for (int i = 0; ok && i < o->n; i++) {
    em_tensor *p = o->params[i], *g = em_get_grad(p);
    if (!g) continue; /* as PyTorch: a parameter that took no part in the loss is left alone */
    /* One scope per parameter bounds the temporaries alive at once to one parameter's worth. */
    if (!em_scope_begin_at(site)) {
      ok = false;
      break;
    }
    ok = o->kind == SGD ? sgd_step(o, i, p, g, site) : adamw_step(o, i, p, g, site);
    em_scope_end_at(site);
  }
  em_no_grad_end();
  return ok;
}

/* ---- checkpoints: parameters, optimizer state and the generator in one safetensors file ---- */

/* torch.optim's names for the state slots, per kind; slot 3 is AdamW's step count. */
static const char *slot_name(opt_kind kind, int k) {
  static const char *const sgd[4] = {"momentum_buffer", NULL, NULL, NULL};
  static const char *const adamw[4] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"};
  return kind == SGD ? sgd[k] : adamw[k];
}
static em_tensor **slot(em_optimizer *o, int k, int i) { return k < 3 ? &o->state[k][i] : &o->steps[i]; }

#define SLOT_NAME 48 /* "optimizer.<i>.max_exp_avg_sq" */

bool em_checkpoint_save_at(const char *path, int n, em_tensor *const *params, const char *const *names,
                           em_optimizer *o, em_site site) {
  static const char op[] = "em_checkpoint_save";
  if (n < 0 || (n && (!params || !names))) return rt_error(site, op, "bad arguments: %d parameters", n), false;
  int cap = n + (o ? 1 + 4 * o->n : 0);
  em_tensor **ts = rt_alloc(sizeof(em_tensor *) * (size_t)(cap ? cap : 1), 16);
  const char **nm = rt_alloc(sizeof(char *) * (size_t)(cap ? cap : 1), 16);
  char *buf = rt_alloc((size_t)(cap ? cap : 1) * SLOT_NAME, 16);
  if (!ts || !nm || !buf) {
    rt_free(ts), rt_free(nm), rt_free(buf);
    return rt_error(site, op, "out of memory writing %s", path ? path : "(NULL)"), false;
  }
  int m = 0;
  for (int i = 0; i < n; i++) ts[m] = params[i], nm[m++] = names[i];
  char count[24] = "", rng[48];
  uint64_t seed, offset;
  em_rng_get_state(&seed, &offset);
  snprintf(rng, sizeof rng, "%llu %llu", (unsigned long long)seed, (unsigned long long)offset);
  if (o) {
    ts[m] = o->lr, nm[m++] = "optimizer.lr";
    for (int i = 0; i < o->n; i++)
      for (int k = 0; k < 4; k++)
        if (slot_name(o->kind, k) && *slot(o, k, i)) {
          char *name = buf + (size_t)m * SLOT_NAME;
          snprintf(name, SLOT_NAME, "optimizer.%d.%s", i, slot_name(o->kind, k));
          ts[m] = *slot(o, k, i), nm[m++] = name;
        }
    snprintf(count, sizeof count, "%d", o->n);
  }
  const char *md[] = {"ember.rng", rng, o ? "ember.optimizer" : NULL, o && o->kind == SGD ? "sgd" : "adamw",
                      "ember.optimizer.params", count, NULL};
  int tok = rt_break_begin(op, "writes tensors' data to a file", site);
  bool ok = tok >= 0 && rt_save_safetensors(path, m, ts, nm, md, op, site);
  if (tok >= 0) rt_break_end(tok);
  rt_free(ts), rt_free(nm), rt_free(buf);
  return ok;
}

/* Whether the file holds name as a tensor of t's dtype and shape (dt, nd, sz: what it holds);
 * an error when it holds something else, or when it is missing and required. */
static bool check_entry(em_safetensors *f, const char *path, const char *name, em_dtype dt, int ndim,
                        const int64_t *sizes, bool required, bool *present, const char *op, em_site site) {
  em_dtype fdt;
  int fnd;
  int64_t fsz[EM_MAX_DIMS];
  char b0[128], b1[128];
  *present = rt_safetensors_find(f, name, &fdt, &fnd, fsz);
  if (!*present)
    return required ? rt_error(site, op, "%s has no tensor named '%s' (of an Ember dtype)", path, name), false : true;
  if (fdt != dt || fnd != ndim || (ndim && memcmp(fsz, sizes, sizeof(int64_t) * (size_t)ndim)))
    return rt_error(site, op, "%s: tensor '%s' is %s in the file but %s here", path, name,
                    ir_fmt_type(b0, sizeof b0, fdt, fnd, fsz), ir_fmt_type(b1, sizeof b1, dt, ndim, sizes)), false;
  return true;
}

/* Copies the file's tensor name into *dst, made first (on dev, dtype and shape of like) when
 * NULL; caller-owned reference kept in *dst. */
static bool restore_into(em_safetensors *f, const char *name, em_tensor **dst, const em_tensor *like, em_device dev,
                         const char *op, em_site site) {
  em_tensor *src = rt_safetensors_cpu(f, name, op, site);
  if (!src) return false;
  if (!*dst) *dst = rt_new_device(like->dtype, like->ndim, like->sizes, dev, op, site);
  em_no_grad_begin();
  bool ok = *dst && em_copy__at(*dst, src, site) != NULL;
  em_no_grad_end();
  em_release(src);
  return ok;
}

bool em_checkpoint_load_at(const char *path, int n, em_tensor *const *params, const char *const *names,
                           em_optimizer *o, em_site site) {
  static const char op[] = "em_checkpoint_load";
  if (n < 0 || (n && (!params || !names))) return rt_error(site, op, "bad arguments: %d parameters", n), false;
  for (int i = 0; i < n; i++) {
    if (!params[i]) return false;
    if (params[i] == EM_NONE || !names[i]) return rt_error(site, op, "parameter %d or its name is missing", i), false;
  }
  em_safetensors *f = rt_safetensors_open(path, op, site);
  if (!f) return false;
  bool ok = false, present;
  char name[SLOT_NAME];
  unsigned long long seed = 0, offset = 0;
  const char *rng = em_safetensors_metadata(f, "ember.rng");
  /* Pass 1: everything checked, nothing written. */
  if (!rng || sscanf(rng, "%llu %llu", &seed, &offset) != 2) {
    rt_error(site, op, "%s is not an Ember checkpoint (no \"ember.rng\" metadata)", path);
    goto out;
  }
  for (int i = 0; i < n; i++)
    if (!check_entry(f, path, names[i], params[i]->dtype, params[i]->ndim, params[i]->sizes, true, &present, op, site))
      goto out;
  if (o) {
    const char *kind = em_safetensors_metadata(f, "ember.optimizer"), *want = o->kind == SGD ? "sgd" : "adamw";
    const char *count = em_safetensors_metadata(f, "ember.optimizer.params");
    if (!kind || strcmp(kind, want) || !count || atoi(count) != o->n) {
      rt_error(site, op, "%s holds the state of %s%s optimizer over %s parameters; this one is %s over %d", path,
               kind ? "an " : "no", kind ? kind : "", count ? count : "no", want, o->n);
      goto out;
    }
    if (!check_entry(f, path, "optimizer.lr", EM_F64, 0, NULL, true, &present, op, site)) goto out;
    for (int i = 0; i < o->n; i++)
      for (int k = 0; k < 4; k++) {
        if (!slot_name(o->kind, k)) continue;
        em_tensor *p = o->params[i];
        snprintf(name, sizeof name, "optimizer.%d.%s", i, slot_name(o->kind, k));
        if (k == 3 ? !check_entry(f, path, name, EM_F64, 0, NULL, false, &present, op, site)
                   : !check_entry(f, path, name, p->dtype, p->ndim, p->sizes, false, &present, op, site))
          goto out;
      }
  }
  /* Pass 2: the copies (only allocation failure can stop them now). */
  for (int i = 0; i < n; i++) {
    em_tensor *dst = params[i];
    if (!restore_into(f, names[i], &dst, params[i], params[i]->storage->device, op, site)) goto out;
  }
  if (o) {
    if (!restore_into(f, "optimizer.lr", &o->lr, o->lr, EM_CPU, op, site)) goto out;
    double lr = *(const double *)rt_data(o->lr);
    if (o->kind == SGD) o->sgd.lr = lr;
    else o->adamw.lr = lr;
    for (int i = 0; i < o->n; i++)
      for (int k = 0; k < 4; k++) {
        if (!slot_name(o->kind, k)) continue;
        em_tensor *p = o->params[i], *like = k == 3 ? o->lr : p, **dst = slot(o, k, i);
        snprintf(name, sizeof name, "optimizer.%d.%s", i, slot_name(o->kind, k));
        em_dtype dt;
        int nd;
        int64_t sz[EM_MAX_DIMS];
        if (!rt_safetensors_find(f, name, &dt, &nd, sz)) {
          em_release(*dst); /* state this parameter did not have yet */
          *dst = NULL;
        } else if (!restore_into(f, name, dst, like, k == 3 ? EM_CPU : p->storage->device, op, site)) {
          goto out;
        }
      }
  }
  em_rng_set_state(seed, offset);
  ok = true;
out:
  em_safetensors_close(f);
  return ok;
}
