/* examples/gpt_model.h: a small decoder-only transformer (GPT-2's layout: pre-norm blocks of causal
 * self-attention and a GELU MLP, learned position embeddings, the output layer tied to the token
 * embedding) written with Ember's public ops, shared by the example examples/gpt.c and its test
 * tests/test_gpt.c.
 *
 * Three model functions in em_compile's form: a whole training step (forward, backward, gradient
 * clipping and two AdamW updates), the validation loss, and one decoding step with a KV cache.
 * The learning rate lives in each optimizer as a 0-dim tensor (em_optimizer_set_lr), so a
 * schedule that changes it every step changes an input of the compiled step, not its graph. */
#ifndef EMBER_EXAMPLES_GPT_MODEL_H
#define EMBER_EXAMPLES_GPT_MODEL_H

#include <ember.h>

/* A decoding step returns the logits and two cache tensors a layer: EM_MAX_OUTPUTS bounds them. */
#define GPT_MAX_LAYERS ((EM_MAX_OUTPUTS - 1) / 2)
#define GPT_PARAMS_PER_LAYER 12

typedef struct gpt_config {
  int64_t vocab;   /* tokens (here: the distinct bytes of the corpus) */
  int64_t block;   /* longest context, the rows of the position embedding */
  int64_t n_layer; /* blocks, at most GPT_MAX_LAYERS */
  int64_t n_head;  /* attention heads; divides d_model */
  int64_t d_model; /* width of the residual stream; the MLP is 4 times wider */
} gpt_config;

typedef struct gpt_layer {
  em_tensor *ln1_w, *ln1_b;   /* [D] */
  em_tensor *w_qkv, *b_qkv;   /* [3D, D], [3D]: queries, keys and values in one GEMM */
  em_tensor *w_proj, *b_proj; /* [D, D], [D] */
  em_tensor *ln2_w, *ln2_b;   /* [D] */
  em_tensor *w_fc, *b_fc;     /* [4D, D], [4D] */
  em_tensor *w_out, *b_out;   /* [D, 4D], [D] */
} gpt_layer;

typedef struct gpt_model {
  gpt_config cfg;
  em_tensor *tok_emb; /* [V, D], also the output layer (tied, as GPT-2) */
  em_tensor *pos_emb; /* [block, D] */
  em_tensor *lnf_w, *lnf_b;
  gpt_layer layer[GPT_MAX_LAYERS];
  /* every parameter (retained by the model), and the two AdamW groups: matrices and embeddings
   * get weight decay, biases and layer-norm gains do not (as nanoGPT and GPT-2) */
  em_tensor *params[4 + GPT_PARAMS_PER_LAYER * GPT_MAX_LAYERS];
  em_tensor *decay[2 + 4 * GPT_MAX_LAYERS], *no_decay[2 + 8 * GPT_MAX_LAYERS];
  int n_params, n_decay, n_no_decay;
} gpt_model;

/* NULL when c is usable, else what is wrong with it (a static string). */
const char *gpt_config_check(gpt_config c);
/* Initialises m with GPT-2's scheme (normal with std 0.02, the residual projections scaled by
 * 1/sqrt(2 n_layer), biases 0, layer-norm gains 1) from Ember's generator, on the CPU, then moves
 * the parameters to dev. Returns false for a config gpt_config_check refuses (no Ember error: the
 * public API has no way for user code to record one), or with an Ember error. */
bool gpt_init(gpt_model *m, gpt_config cfg, em_device dev);
/* Releases the parameters. NULL-safe, and safe after a failed gpt_init. */
void gpt_free(gpt_model *m);
/* Number of scalars in the parameters. */
int64_t gpt_param_count(const gpt_model *m);

/* idx: i64 [B, T] with T <= block -> logits f32 [B, T, V], owned by the current scope. With k and
 * v not NULL, k[l] and v[l] receive layer l's keys and values [B, H, T, D/H] (a KV cache for
 * gpt_decode_fn), owned by the current scope. */
em_tensor *gpt_forward(gpt_model *m, em_tensor *idx, em_tensor **k, em_tensor **v);
/* Mean cross entropy of the next-token predictions: x, y i64 [B, T]. */
em_tensor *gpt_loss(gpt_model *m, em_tensor *x, em_tensor *y);

/* Model functions for em_compile. */
/* ctx gpt_model; (x, y) -> (loss): the validation loss (call it under em_no_grad_begin). */
em_outputs gpt_loss_fn(void *ctx, em_tensor *const *in, int n);

typedef struct gpt_trainer {
  gpt_model *m;
  em_optimizer *decay, *no_decay; /* AdamW over m->decay and m->no_decay */
  double clip;                    /* max global gradient norm */
} gpt_trainer;
/* Creates the two AdamW optimizers of t (lr is set each step by the caller). */
bool gpt_trainer_init(gpt_trainer *t, gpt_model *m, double lr, double weight_decay, double clip);
void gpt_trainer_free(gpt_trainer *t);
/* Sets both optimizers' learning rate (a 0-dim tensor each: an input of a compiled step). */
void gpt_trainer_set_lr(gpt_trainer *t, double lr);
/* ctx gpt_trainer; (x, y) -> (loss, gradient norm before clipping): one whole training step,
 * forward, backward, clipping and the AdamW updates of the parameters in place. */
em_outputs gpt_step_fn(void *ctx, em_tensor *const *in, int n);

/* ctx gpt_model; (token i64 [B, 1], k[0..L), v[0..L)) -> (logits [B, V], k'[0..L), v'[0..L)): one
 * decoding step. The caches hold the keys and values of the S tokens before (S >= 1, S < block),
 * [B, H, S, D/H] each; the token is at position S, its query attends over all S + 1 keys, and the
 * new caches are the old ones with its keys and values appended ([B, H, S + 1, D/H]). The logits
 * equal gpt_forward's at position S over the whole context. */
em_outputs gpt_decode_fn(void *ctx, em_tensor *const *in, int n);

/* Cosine learning-rate schedule with linear warmup: lr_max * (step + 1) / warmup for step <
 * warmup, then from lr_max down to lr_min along half a cosine until total, lr_min after. */
double gpt_lr_at(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min);

#endif
