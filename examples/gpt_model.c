/* examples/gpt_model.c: the GPT of examples/gpt_model.h, written with Ember's public ops only.
 *
 * Every op here is a composite or a prim of the public API, so the same code runs eagerly, traces
 * into one compiled training step (em_backward and the optimizer updates included), and runs one
 * decoding step against a KV cache. */
#include "gpt_model.h"

#include <math.h>
#include <string.h>

#define LN_EPS 1e-5

static em_tensor *param(em_tensor *t) {
  return em_retain(em_requires_grad_(t, true));
}

static em_tensor *normal(int64_t rows, int64_t cols, double std) {
  return param(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(rows, cols)), std));
}

const char *gpt_config_check(gpt_config c) {
  if (c.vocab < 1 || c.block < 1 || c.d_model < 1) return "vocab, block and d_model must be at least 1";
  if (c.n_layer < 1 || c.n_layer > GPT_MAX_LAYERS) return "n_layer must be in [1, GPT_MAX_LAYERS]";
  if (c.n_head < 1 || c.d_model % c.n_head) return "n_head must divide d_model";
  return NULL;
}

/* Where each parameter lives in m, in the order of m->params; *decay says which AdamW group. */
static int slots(gpt_model *m, em_tensor ***out, bool *decay) {
  int n = 0;
#define SLOT(field, d) (out[n] = &(field), decay[n++] = (d))
  SLOT(m->tok_emb, true), SLOT(m->pos_emb, true);
  for (int64_t l = 0; l < m->cfg.n_layer; l++) {
    gpt_layer *L = &m->layer[l];
    SLOT(L->ln1_w, false), SLOT(L->ln1_b, false), SLOT(L->w_qkv, true), SLOT(L->b_qkv, false);
    SLOT(L->w_proj, true), SLOT(L->b_proj, false), SLOT(L->ln2_w, false), SLOT(L->ln2_b, false);
    SLOT(L->w_fc, true), SLOT(L->b_fc, false), SLOT(L->w_out, true), SLOT(L->b_out, false);
  }
  SLOT(m->lnf_w, false), SLOT(m->lnf_b, false);
#undef SLOT
  return n;
}

bool gpt_init(gpt_model *m, gpt_config c, em_device dev) {
  memset(m, 0, sizeof *m);
  m->cfg = c;
  if (gpt_config_check(c)) return false;
  int64_t D = c.d_model;
  double std = 0.02, proj_std = 0.02 / sqrt(2.0 * (double)c.n_layer);
  em_scope_begin();
  m->tok_emb = normal(c.vocab, D, std);
  m->pos_emb = normal(c.block, D, std);
  for (int64_t l = 0; l < c.n_layer; l++) {
    gpt_layer *L = &m->layer[l];
    L->ln1_w = param(em_ones(EM_F32, EM_SHAPE(D))), L->ln1_b = param(em_zeros(EM_F32, EM_SHAPE(D)));
    L->w_qkv = normal(3 * D, D, std), L->b_qkv = param(em_zeros(EM_F32, EM_SHAPE(3 * D)));
    L->w_proj = normal(D, D, proj_std), L->b_proj = param(em_zeros(EM_F32, EM_SHAPE(D)));
    L->ln2_w = param(em_ones(EM_F32, EM_SHAPE(D))), L->ln2_b = param(em_zeros(EM_F32, EM_SHAPE(D)));
    L->w_fc = normal(4 * D, D, std), L->b_fc = param(em_zeros(EM_F32, EM_SHAPE(4 * D)));
    L->w_out = normal(D, 4 * D, proj_std), L->b_out = param(em_zeros(EM_F32, EM_SHAPE(D)));
  }
  m->lnf_w = param(em_ones(EM_F32, EM_SHAPE(D))), m->lnf_b = param(em_zeros(EM_F32, EM_SHAPE(D)));
  em_tensor **slot[4 + GPT_PARAMS_PER_LAYER * GPT_MAX_LAYERS];
  bool decay[4 + GPT_PARAMS_PER_LAYER * GPT_MAX_LAYERS];
  int n = slots(m, slot, decay);
  bool ok = true;
  for (int i = 0; i < n; i++) ok = ok && *slot[i];
  /* initialised on the CPU (the same numbers on every device), then moved: new leaves */
  for (int i = 0; ok && dev != EM_CPU && i < n; i++) {
    em_tensor *p = param(em_detach(em_to(*slot[i], dev)));
    em_release(*slot[i]);
    *slot[i] = p;
    ok = p != NULL;
  }
  em_scope_end();
  for (int i = 0; i < n; i++) {
    m->params[m->n_params++] = *slot[i];
    if (decay[i]) m->decay[m->n_decay++] = *slot[i];
    else m->no_decay[m->n_no_decay++] = *slot[i];
  }
  if (!ok) gpt_free(m);
  return ok;
}

void gpt_free(gpt_model *m) {
  if (!m) return;
  for (int i = 0; i < m->n_params; i++) em_release(m->params[i]);
  memset(m, 0, sizeof *m);
}

int64_t gpt_param_count(const gpt_model *m) {
  int64_t n = 0;
  for (int i = 0; i < m->n_params; i++) n += m->params[i] ? em_numel(m->params[i]) : 0;
  return n;
}

/* [B, T, D] columns [c0, c0 + D) of qkv -> [B, H, T, D/H] */
static em_tensor *heads(gpt_config c, em_tensor *qkv, int64_t c0) {
  int64_t B = em_size(qkv, 0), T = em_size(qkv, 1), D = c.d_model;
  em_tensor *x = em_slice(qkv, 2, c0, c0 + D, 1);
  return em_transpose(em_reshape(x, EM_SHAPE(B, T, c.n_head, D / c.n_head)), 1, 2);
}

/* One pre-norm block on x [B, T, D]. The attention's keys and values are past_k / past_v (when
 * not NULL: [B, H, S, D/H]) followed by this block's own; with a past, the T queries (T = 1 in
 * decoding) attend over every key (causal masking would align the mask's corner with key 0, as
 * torch's is_causal does, and hide the past). */
static em_tensor *block(gpt_config c, gpt_layer *L, em_tensor *x, em_tensor *past_k, em_tensor *past_v,
                        em_tensor **k_out, em_tensor **v_out) {
  if (!x) return NULL;
  int64_t B = em_size(x, 0), T = em_size(x, 1), D = c.d_model;
  em_tensor *qkv = em_linear(em_layer_norm(x, 1, L->ln1_w, L->ln1_b, LN_EPS), L->w_qkv, L->b_qkv);
  if (!qkv) return NULL;
  em_tensor *q = heads(c, qkv, 0), *k = heads(c, qkv, D), *v = heads(c, qkv, 2 * D);
  if (past_k) {
    k = em_cat(2, ((em_tensor *[]){past_k, k}), 2);
    v = em_cat(2, ((em_tensor *[]){past_v, v}), 2);
  }
  if (k_out) *k_out = k, *v_out = v;
  em_tensor *y = em_scaled_dot_product_attention(q, k, v, past_k == NULL, 0.0, 0.0);
  y = em_reshape(em_transpose(y, 1, 2), EM_SHAPE(B, T, D));
  x = em_add(x, em_linear(y, L->w_proj, L->b_proj));
  em_tensor *h = em_gelu(em_linear(em_layer_norm(x, 1, L->ln2_w, L->ln2_b, LN_EPS), L->w_fc, L->b_fc), true);
  return em_add(x, em_linear(h, L->w_out, L->b_out));
}

/* Token and position embeddings of idx [B, T] at positions [start, start + T). */
static em_tensor *embed(gpt_model *m, em_tensor *idx, int64_t start) {
  int64_t T = em_size(idx, 1);
  return em_add(em_embedding(idx, m->tok_emb), em_slice(m->pos_emb, 0, start, start + T, 1));
}

static em_tensor *head(gpt_model *m, em_tensor *x) {
  return em_linear(em_layer_norm(x, 1, m->lnf_w, m->lnf_b, LN_EPS), m->tok_emb, EM_NONE);
}

em_tensor *gpt_forward(gpt_model *m, em_tensor *idx, em_tensor **k, em_tensor **v) {
  if (!idx) return NULL;
  em_tensor *x = embed(m, idx, 0);
  for (int64_t l = 0; l < m->cfg.n_layer; l++)
    x = block(m->cfg, &m->layer[l], x, NULL, NULL, k ? &k[l] : NULL, v ? &v[l] : NULL);
  return x ? head(m, x) : NULL;
}

em_tensor *gpt_loss(gpt_model *m, em_tensor *x, em_tensor *y) {
  em_tensor *logits = gpt_forward(m, x, NULL, NULL);
  if (!logits || !y) return NULL;
  return em_cross_entropy(em_reshape(logits, EM_SHAPE(-1, m->cfg.vocab)), em_reshape(y, EM_SHAPE(-1)),
                          EM_CROSS_ENTROPY_DEFAULT);
}

em_outputs gpt_loss_fn(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  return EM_OUTPUTS(gpt_loss(ctx, in[0], in[1]));
}

bool gpt_trainer_init(gpt_trainer *t, gpt_model *m, double lr, double weight_decay, double clip) {
  t->m = m, t->clip = clip;
  t->decay = em_adamw_new(m->n_decay, m->decay, ((em_adamw_opts){lr, 0.9, 0.95, 1e-8, weight_decay, false}));
  t->no_decay = em_adamw_new(m->n_no_decay, m->no_decay, ((em_adamw_opts){lr, 0.9, 0.95, 1e-8, 0.0, false}));
  if (t->decay && t->no_decay) return true;
  gpt_trainer_free(t);
  return false;
}

void gpt_trainer_free(gpt_trainer *t) {
  em_optimizer_free(t->decay), em_optimizer_free(t->no_decay);
  t->decay = t->no_decay = NULL;
}

void gpt_trainer_set_lr(gpt_trainer *t, double lr) {
  em_optimizer_set_lr(t->decay, lr), em_optimizer_set_lr(t->no_decay, lr);
}

em_outputs gpt_step_fn(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  gpt_trainer *t = ctx;
  em_tensor *loss = gpt_loss(t->m, in[0], in[1]);
  em_optimizer_zero_grad(t->decay), em_optimizer_zero_grad(t->no_decay);
  if (!loss || !em_backward(loss, NULL)) return EM_OUTPUTS(NULL, NULL);
  em_tensor *norm = em_clip_grad_norm_(t->m->n_params, t->m->params, t->clip, 2.0);
  if (!norm || !em_optimizer_step(t->decay) || !em_optimizer_step(t->no_decay)) return EM_OUTPUTS(NULL, NULL);
  return EM_OUTPUTS(loss, norm);
}

em_outputs gpt_decode_fn(void *ctx, em_tensor *const *in, int n) {
  gpt_model *m = ctx;
  int64_t L = m->cfg.n_layer;
  em_outputs out = {(int)(1 + 2 * L), {NULL}};
  if (n != 1 + 2 * L || !in[0] || !in[1]) return out;
  int64_t S = em_size(in[1], 2);
  em_tensor *x = embed(m, in[0], S);
  for (int64_t l = 0; l < L; l++)
    x = block(m->cfg, &m->layer[l], x, in[1 + l], in[1 + L + l], &out.t[1 + l], &out.t[1 + L + l]);
  out.t[0] = x ? em_reshape(head(m, x), EM_SHAPE(em_size(x, 0), m->cfg.vocab)) : NULL;
  return out;
}

double gpt_lr_at(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min) {
  if (step < warmup) return lr_max * (double)(step + 1) / (double)warmup;
  if (step >= total) return lr_min;
  double progress = (double)(step - warmup) / (double)(total - warmup > 0 ? total - warmup : 1);
  return lr_min + 0.5 * (lr_max - lr_min) * (1 + cos(3.14159265358979323846 * progress));
}
