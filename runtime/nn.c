/* runtime/nn.c: parameter initialisation, layers and optimizers as torch.nn and torch.optim
 * define them.
 *
 * Initialisers and optimizer steps write parameters in place, so they run under no-grad (the
 * autograd engine refuses in-place writes to leaves that require grad otherwise), inside a
 * private scope so every temporary of a step is freed with it. Optimizer state tensors are held
 * by reference from the optimizer, outside any user scope. */
#include "rt.h"

#include <math.h>
#include <string.h>

em_tensor *em_init_uniform__at(em_tensor *t, double lo, double hi, em_site site) {
  if (!t) return NULL;
  char b[128];
  if (!ir_is_float(t->dtype)) return rt_error(site, "em_init_uniform_", "needs a floating tensor, got %s", rt_fmt(b, sizeof b, t));
  if (!em_scope_begin_at(site)) return NULL;
  em_no_grad_begin();
  em_tensor *u = em_add_scalar_at(em_mul_scalar_at(em_rand_at(t->dtype, t->ndim, t->sizes, site), hi - lo, site), lo, site);
  em_tensor *r = u ? em_copy__at(t, u, site) : NULL;
  em_no_grad_end();
  em_scope_end_at(site);
  return r;
}

static int64_t fan_in(const em_tensor *t) {
  int64_t f = t->sizes[1];
  for (int i = 2; i < t->ndim; i++) f *= t->sizes[i];
  return f;
}

em_tensor *em_init_kaiming_uniform__at(em_tensor *t, double a, em_site site) {
  if (!t) return NULL;
  char b[128];
  if (t->ndim < 2) return rt_error(site, "em_init_kaiming_uniform_", "needs at least 2 dims, got %s", rt_fmt(b, sizeof b, t));
  int64_t f = fan_in(t);
  double bound = f > 0 ? sqrt(6.0 / ((1 + a * a) * (double)f)) : 0;
  return em_init_uniform__at(t, -bound, bound, site);
}

static em_tensor *param(int ndim, const int64_t *sizes, double bound, bool kaiming, em_site site) {
  em_tensor *t = em_empty_at(EM_F32, ndim, sizes, site);
  t = kaiming ? em_init_kaiming_uniform__at(t, sqrt(5.0), site) : em_init_uniform__at(t, -bound, bound, site);
  return em_requires_grad__at(t, true, site);
}

bool em_linear_layer_init_at(em_linear_layer *l, int64_t in, int64_t out, bool has_bias, em_site site) {
  if (!l) return rt_error(site, "em_linear_layer_init", "layer is NULL"), false;
  l->weight = l->bias = NULL;
  if (in < 1 || out < 1)
    return rt_error(site, "em_linear_layer_init", "sizes must be >= 1, got (%lld, %lld)", (long long)in, (long long)out), false;
  em_tensor *w = param(2, (int64_t[]){out, in}, 0, true, site);
  em_tensor *b = has_bias ? param(1, &out, 1 / sqrt((double)in), false, site) : EM_NONE;
  if (!w || !b) return false;
  l->weight = w, l->bias = b;
  return true;
}

bool em_conv2d_layer_init_at(em_conv2d_layer *l, int64_t in, int64_t out, int64_t kh, int64_t kw, em_conv2d_params p,
                             bool has_bias, em_site site) {
  if (!l) return rt_error(site, "em_conv2d_layer_init", "layer is NULL"), false;
  l->weight = l->bias = NULL;
  l->params = p;
  if (in < 1 || out < 1 || kh < 1 || kw < 1 || p.groups < 1 || in % p.groups || out % p.groups)
    return rt_error(site, "em_conv2d_layer_init", "bad sizes: %lld -> %lld channels, kernel %lldx%lld, groups %lld",
                    (long long)in, (long long)out, (long long)kh, (long long)kw, (long long)p.groups), false;
  em_tensor *w = param(4, (int64_t[]){out, in / p.groups, kh, kw}, 0, true, site);
  em_tensor *b = has_bias ? param(1, &out, 1 / sqrt((double)(in / p.groups * kh * kw)), false, site) : EM_NONE;
  if (!w || !b) return false;
  l->weight = w, l->bias = b;
  return true;
}

/* ---- optimizers ---- */

typedef enum { SGD, ADAMW } opt_kind;

struct em_optimizer {
  opt_kind kind;
  em_sgd_opts sgd;
  em_adamw_opts adamw;
  int n;
  em_tensor **params;
  em_tensor **state[3]; /* SGD: momentum buffer; AdamW: exp_avg, exp_avg_sq, max_exp_avg_sq */
  int64_t *steps;
};

void em_optimizer_free(em_optimizer *o) {
  if (!o) return;
  for (int i = 0; i < o->n; i++) {
    em_release(o->params[i]);
    for (int k = 0; k < 3; k++) em_release(o->state[k][i]);
  }
  rt_free(o);
}

static em_optimizer *new_optimizer(opt_kind kind, int n, em_tensor *const *params, const char *name, em_site site) {
  char b[128];
  if (n < 1 || !params) return rt_error(site, name, "needs at least one parameter, got %d", n);
  for (int i = 0; i < n; i++) {
    if (!params[i]) return NULL;
    if (!params[i]->requires_grad || params[i]->grad_fn || !ir_is_float(params[i]->dtype))
      return rt_error(site, name, "parameter %d (%s) is not a floating leaf that requires grad", i,
                      rt_fmt(b, sizeof b, params[i]));
  }
  size_t k = (size_t)n;
  size_t bytes = sizeof(em_optimizer) + k * (4 * sizeof(em_tensor *) + sizeof(int64_t));
  em_optimizer *o = rt_alloc(bytes, 16);
  if (!o) return rt_error(site, name, "out of memory");
  memset(o, 0, bytes);
  char *p = (char *)(o + 1);
  o->params = (em_tensor **)p, p += k * sizeof(em_tensor *);
  for (int s = 0; s < 3; s++) o->state[s] = (em_tensor **)p, p += k * sizeof(em_tensor *);
  o->steps = (int64_t *)p;
  o->kind = kind;
  o->n = n;
  for (int i = 0; i < n; i++) o->params[i] = em_retain(params[i]);
  return o;
}

em_optimizer *em_sgd_new_at(int n, em_tensor *const *params, em_sgd_opts opts, em_site site) {
  if (!(opts.lr >= 0) || opts.momentum < 0 || opts.weight_decay < 0)
    return rt_error(site, "em_sgd_new", "lr, momentum and weight_decay must be >= 0");
  if (opts.nesterov && (opts.momentum <= 0 || opts.dampening != 0))
    return rt_error(site, "em_sgd_new", "nesterov momentum requires a momentum and zero dampening");
  em_optimizer *o = new_optimizer(SGD, n, params, "em_sgd_new", site);
  if (o) o->sgd = opts;
  return o;
}

em_optimizer *em_adamw_new_at(int n, em_tensor *const *params, em_adamw_opts opts, em_site site) {
  if (!(opts.lr >= 0) || !(opts.eps >= 0) || opts.weight_decay < 0)
    return rt_error(site, "em_adamw_new", "lr, eps and weight_decay must be >= 0");
  if (!(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1))
    return rt_error(site, "em_adamw_new", "betas must be in [0, 1), got (%g, %g)", opts.beta1, opts.beta2);
  em_optimizer *o = new_optimizer(ADAMW, n, params, "em_adamw_new", site);
  if (o) o->adamw = opts;
  return o;
}

void em_optimizer_zero_grad(em_optimizer *o) {
  if (!o) return;
  for (int i = 0; i < o->n; i++) em_zero_grad(o->params[i]);
}

void em_optimizer_set_lr(em_optimizer *o, double lr) {
  if (!o) return;
  if (o->kind == SGD) o->sgd.lr = lr;
  else o->adamw.lr = lr;
}

double em_optimizer_get_lr(const em_optimizer *o) { return !o ? NAN : o->kind == SGD ? o->sgd.lr : o->adamw.lr; }

/* A zero state tensor like p, held by the optimizer (made outside the step's scope). */
static em_tensor *state_like(em_tensor *p, em_site site) {
  em_tensor *z = em_zeros_at(p->dtype, p->ndim, p->sizes, site);
  return em_retain(z);
}

static bool sgd_step(em_optimizer *o, int i, em_tensor *p, em_tensor *g, em_site site) {
  const em_sgd_opts *s = &o->sgd;
  if (s->weight_decay != 0) g = em_add_at(g, em_mul_scalar_at(p, s->weight_decay, site), site);
  if (s->momentum != 0) {
    if (!o->state[0][i]) {
      if (!(o->state[0][i] = em_retain(em_detach_at(em_clone_at(g, site), site)))) return false;
    } else if (!em_mul_scalar__at(o->state[0][i], s->momentum, site) ||
               !em_add__at(o->state[0][i], em_mul_scalar_at(g, 1 - s->dampening, site), site)) {
      return false;
    }
    em_tensor *buf = o->state[0][i];
    g = s->nesterov ? em_add_at(g, em_mul_scalar_at(buf, s->momentum, site), site) : buf;
  }
  return em_sub__at(p, em_mul_scalar_at(g, s->lr, site), site) != NULL;
}

static bool adamw_step(em_optimizer *o, int i, em_tensor *p, em_tensor *g, em_site site) {
  const em_adamw_opts *a = &o->adamw;
  for (int k = 0; k < (a->amsgrad ? 3 : 2); k++)
    if (!o->state[k][i] && !(o->state[k][i] = state_like(p, site))) return false;
  em_tensor *m = o->state[0][i], *v = o->state[1][i];
  int64_t t = ++o->steps[i];
  if (a->weight_decay != 0 && !em_mul_scalar__at(p, 1 - a->lr * a->weight_decay, site)) return false;
  if (!em_mul_scalar__at(m, a->beta1, site) || !em_add__at(m, em_mul_scalar_at(g, 1 - a->beta1, site), site) ||
      !em_mul_scalar__at(v, a->beta2, site) || !em_add__at(v, em_mul_scalar_at(em_mul_at(g, g, site), 1 - a->beta2, site), site))
    return false;
  em_tensor *vv = v;
  if (a->amsgrad) {
    if (!em_copy__at(o->state[2][i], em_maximum_at(o->state[2][i], v, site), site)) return false;
    vv = o->state[2][i];
  }
  double bc1 = 1 - pow(a->beta1, (double)t), bc2 = 1 - pow(a->beta2, (double)t);
  em_tensor *denom = em_add_scalar_at(em_div_scalar_at(em_sqrt_at(vv, site), sqrt(bc2), site), a->eps, site);
  em_tensor *upd = em_mul_scalar_at(em_div_at(m, denom, site), a->lr / bc1, site);
  return em_sub__at(p, upd, site) != NULL;
}

bool em_optimizer_step_at(em_optimizer *o, em_site site) {
  if (!o) return rt_error(site, "em_optimizer_step", "optimizer is NULL"), false;
  em_no_grad_begin();
  bool ok = true;
  for (int i = 0; ok && i < o->n; i++) {
    em_tensor *p = o->params[i], *g = p->grad;
    if (!g) continue;
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
