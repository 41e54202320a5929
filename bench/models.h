/* bench/models.h: the models the AOT tests and benchmarks share, written with the public API as
 * a user would: an MLP, a GELU + LayerNorm MLP, LeNet-5 and a decoder-only transformer, each a
 * model function (em_model_fn) over a `net` of parameters. Include after ember.h; the sizes of
 * the transformer come from MODELS_VOCAB, MODELS_DM, MODELS_HEADS, MODELS_CTX, MODELS_BATCH
 * and MODELS_LAYERS (defaults are the tests' small ones; defining MODELS_FULL_SIZE sets the
 * benchmarks'). add_linear / add_ln make parameters that require grad and list them in
 * net.params. */
#ifndef EMBER_BENCH_MODELS_H
#define EMBER_BENCH_MODELS_H

#include <ember.h>

#ifdef MODELS_FULL_SIZE /* the benchmarks' transformer: 2 layers, d_model 256, 4 heads, context 128, batch 16, bytes */
#define MODELS_VOCAB 256
#define MODELS_DM 256
#define MODELS_HEADS 4
#define MODELS_CTX 128
#define MODELS_BATCH 16
#define MODELS_LAYERS 2
#endif
#ifndef MODELS_VOCAB
#define MODELS_VOCAB 16
#define MODELS_DM 32
#define MODELS_HEADS 4
#define MODELS_CTX 8
#define MODELS_BATCH 2
#define MODELS_LAYERS 2
#endif


typedef struct net {
  em_linear_layer fc[4];
  em_conv2d_layer conv[2];
  em_tensor *ln_w[6], *ln_b[6], *tok, *pos;
  em_tensor *params[32];
  int n_params;
} net;

static inline void add_linear(net *m, int i, int64_t a, int64_t b) {
  if (!em_linear_layer_init(&m->fc[i], a, b, true)) return;
  m->params[m->n_params++] = m->fc[i].weight, m->params[m->n_params++] = m->fc[i].bias;
}

static inline em_outputs mlp_fn(void *ctx, em_tensor *const *in, int n) {
  net *m = ctx;
  em_tensor *h = em_relu(em_linear(in[0], m->fc[0].weight, m->fc[0].bias));
  h = em_relu(em_linear(h, m->fc[1].weight, m->fc[1].bias));
  em_tensor *logits = em_linear(h, m->fc[2].weight, m->fc[2].bias);
  return EM_OUTPUTS(em_cross_entropy(logits, in[1], EM_CROSS_ENTROPY_DEFAULT), logits);
}

static inline em_outputs gelu_ln_mlp_fn(void *ctx, em_tensor *const *in, int n) {
  net *m = ctx;
  em_tensor *h = em_layer_norm(em_linear(in[0], m->fc[0].weight, m->fc[0].bias), 1, m->ln_w[0], m->ln_b[0], 1e-5);
  h = em_gelu(h, false);
  h = em_gelu(em_layer_norm(em_linear(h, m->fc[1].weight, m->fc[1].bias), 1, m->ln_w[1], m->ln_b[1], 1e-5), true);
  return EM_OUTPUTS(em_cross_entropy(em_linear(h, m->fc[2].weight, m->fc[2].bias), in[1], EM_CROSS_ENTROPY_DEFAULT));
}

static inline em_outputs lenet_fn(void *ctx, em_tensor *const *in, int n) {
  net *m = ctx;
  em_tensor *h = em_max_pool2d(em_relu(em_conv2d(in[0], m->conv[0].weight, m->conv[0].bias, m->conv[0].params)), 2, 2, 2, 2, 0, 0);
  h = em_max_pool2d(em_relu(em_conv2d(h, m->conv[1].weight, m->conv[1].bias, m->conv[1].params)), 2, 2, 2, 2, 0, 0);
  h = em_reshape(h, EM_SHAPE(-1, 400));
  h = em_relu(em_linear(h, m->fc[0].weight, m->fc[0].bias));
  h = em_relu(em_linear(h, m->fc[1].weight, m->fc[1].bias));
  return EM_OUTPUTS(em_cross_entropy(em_linear(h, m->fc[2].weight, m->fc[2].bias), in[1], EM_CROSS_ENTROPY_DEFAULT));
}

enum { VOCAB = MODELS_VOCAB, DM = MODELS_DM, HEADS = MODELS_HEADS, CTX = MODELS_CTX, BATCH = MODELS_BATCH,
       LAYERS = MODELS_LAYERS };

/* A decoder-only transformer (pre-norm GPT): token + position embeddings; per layer causal
 * self-attention and a GELU MLP, each behind a layer_norm and a residual; a final layer_norm;
 * the LM head; next-token cross entropy. */
static inline em_outputs transformer_fn(void *ctx, em_tensor *const *in, int n) {
  net *m = ctx;
  em_tensor *x = em_add(em_embedding(in[0], m->tok), m->pos); /* [B, T, D] */
  for (int l = 0; l < LAYERS; l++) {
    em_linear_layer *qkv = &m->fc[0], *proj = &m->fc[1];
    em_tensor *h = em_layer_norm(x, 1, m->ln_w[2 * l], m->ln_b[2 * l], 1e-5);
    em_tensor *q = em_linear(h, em_slice(qkv->weight, 0, l * 3 * DM, l * 3 * DM + DM, 1), EM_NONE);
    em_tensor *k = em_linear(h, em_slice(qkv->weight, 0, l * 3 * DM + DM, l * 3 * DM + 2 * DM, 1), EM_NONE);
    em_tensor *v = em_linear(h, em_slice(qkv->weight, 0, l * 3 * DM + 2 * DM, l * 3 * DM + 3 * DM, 1), EM_NONE);
    em_tensor *qs[3] = {q, k, v};
    for (int j = 0; j < 3; j++) qs[j] = em_transpose(em_reshape(qs[j], EM_SHAPE(BATCH, CTX, HEADS, DM / HEADS)), 1, 2);
    em_tensor *a = em_scaled_dot_product_attention(qs[0], qs[1], qs[2], true, 0, 0);
    a = em_reshape(em_transpose(a, 1, 2), EM_SHAPE(BATCH, CTX, DM));
    x = em_add(x, em_linear(a, em_slice(proj->weight, 0, l * DM, l * DM + DM, 1), EM_NONE));
    h = em_layer_norm(x, 1, m->ln_w[2 * l + 1], m->ln_b[2 * l + 1], 1e-5);
    h = em_gelu(em_linear(h, em_slice(m->fc[2].weight, 0, l * 4 * DM, (l + 1) * 4 * DM, 1), EM_NONE), true);
    x = em_add(x, em_linear(h, em_slice(m->fc[3].weight, 0, l * DM, (l + 1) * DM, 1), EM_NONE));
  }
  x = em_layer_norm(x, 1, m->ln_w[4], m->ln_b[4], 1e-5);
  em_tensor *logits = em_matmul(x, em_transpose(m->tok, 0, 1)); /* tied embeddings */
  em_tensor *loss = em_cross_entropy(em_reshape(logits, EM_SHAPE(BATCH * CTX, VOCAB)), em_reshape(in[1], EM_SHAPE(BATCH * CTX)),
                                     EM_CROSS_ENTROPY_DEFAULT);
  return EM_OUTPUTS(loss);
}

static inline void add_ln(net *m, int i, int64_t d) {
  m->ln_w[i] = em_requires_grad_(em_add_scalar(em_rand(EM_F32, EM_SHAPE(d)), 0.5), true);
  m->ln_b[i] = em_requires_grad_(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(d)), 0.1), true);
  m->params[m->n_params++] = m->ln_w[i], m->params[m->n_params++] = m->ln_b[i];
}


/* Parameter set-ups for each model. */
static inline void models_mlp(net *m, int64_t in, int64_t h1, int64_t h2, int64_t out) {
  add_linear(m, 0, in, h1), add_linear(m, 1, h1, h2), add_linear(m, 2, h2, out);
}
static inline void models_gelu_ln_mlp(net *m, int64_t in, int64_t h1, int64_t h2, int64_t out) {
  models_mlp(m, in, h1, h2, out);
  add_ln(m, 0, h1), add_ln(m, 1, h2);
}
static inline bool models_lenet(net *m) {
  em_conv2d_params pad2 = EM_CONV2D_DEFAULT;
  pad2.padding[0] = pad2.padding[1] = 2;
  if (!em_conv2d_layer_init(&m->conv[0], 1, 6, 5, 5, pad2, true) ||
      !em_conv2d_layer_init(&m->conv[1], 6, 16, 5, 5, EM_CONV2D_DEFAULT, true))
    return false;
  for (int i = 0; i < 2; i++) m->params[m->n_params++] = m->conv[i].weight, m->params[m->n_params++] = m->conv[i].bias;
  add_linear(m, 0, 400, 120), add_linear(m, 1, 120, 84), add_linear(m, 2, 84, 10);
  return true;
}
static inline void models_transformer(net *m) {
  m->tok = em_requires_grad_(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(VOCAB, DM)), 0.5), true);
  m->pos = em_requires_grad_(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(CTX, DM)), 0.1), true);
  m->params[m->n_params++] = m->tok, m->params[m->n_params++] = m->pos;
  add_linear(m, 0, DM, 3 * DM * LAYERS), add_linear(m, 1, DM, DM * LAYERS);
  add_linear(m, 2, DM, 4 * DM * LAYERS), add_linear(m, 3, 4 * DM, DM * LAYERS);
  for (int i = 0; i < 2 * LAYERS + 1; i++) add_ln(m, i, DM);
}

/* A whole training step of a model (loss, backward, optimizer update) as one model function,
 * to run eagerly or compile; returns the loss. Shared by the benches that time steps. */
typedef struct model_step_ctx {
  em_model_fn loss_fn;
  net *m;
  em_optimizer *opt;
} model_step_ctx;

static inline em_outputs model_train_step(void *ctx, em_tensor *const *in, int n) {
  model_step_ctx *s = ctx;
  em_tensor *loss = s->loss_fn(s->m, in, n).t[0];
  em_optimizer_zero_grad(s->opt);
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(s->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

/* The row-wise workload of bench/compiled and bench/eager_fusion: softmax and layer_norm over
 * [rows, 1024] f32 rows without grad, each handed to run(name, fn, ctx, inputs, n, bytes) with
 * the bytes a pass reads and writes once. */
typedef void (*models_run_fn)(const char *name, em_model_fn fn, void *ctx, em_tensor *const *in, int n, double bytes);
static inline em_outputs models_softmax_fn(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_softmax(in[0], 1));
}
static inline em_outputs models_layer_norm_fn(void *ctx, em_tensor *const *in, int n) {
  em_tensor **wb = ctx;
  (void)n;
  return EM_OUTPUTS(em_layer_norm(in[0], 1, wb[0], wb[1], 1e-5));
}
static inline void models_rows(models_run_fn run, int64_t rows) {
  em_no_grad_begin();
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(rows, 1024));
  em_tensor *wb[2] = {em_rand(EM_F32, EM_SHAPE(1024)), em_randn(EM_F32, EM_SHAPE(1024))};
  double bytes = 2.0 * (double)rows * 1024 * 4;
  run("softmax", models_softmax_fn, NULL, &x, 1, bytes);
  run("layer_norm", models_layer_norm_fn, wb, &x, 1, bytes);
  em_no_grad_end();
}

#endif
