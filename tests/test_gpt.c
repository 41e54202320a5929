/* tests/test_gpt.c: the GPT of examples/gpt_model.h on a tiny config and a short made-up text:
 * training lowers the loss, the em_compile'd whole step gives eager's losses and parameters
 * (one cache entry replayed while the learning rate changes every step: were the rate baked into
 * the graph, the parameters would part from eager's), and decoding with a KV cache gives
 * the logits of a full forward pass over the whole context, eagerly and through em_compile. */
#include "../examples/gpt_model.h"
#include "common.h"

static const char text[] = "the quick brown fox jumps over the lazy dog. a lazy dog sleeps; the fox runs off. ";

enum { VOCAB = 26 + 3, B = 4, T = 16 }; /* a-z, space, '.', ';' */

static int64_t token(char c) {
  return c == ' ' ? 26 : c == '.' ? 27 : c == ';' ? 28 : c - 'a';
}

static em_device test_device(void) {
  return etest_on_cuda() ? EM_CUDA : EM_CPU;
}

static gpt_config tiny(void) {
  return (gpt_config){VOCAB, T, 2, 2, 16};
}

/* x, y [B, T]: windows of the text at offsets 7 b + 3 step */
static void batch(int64_t step, em_tensor **x, em_tensor **y) {
  int64_t xs[B * T], ys[B * T], n = (int64_t)sizeof text - 1;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      int64_t at = (b * 7 + step * 3 + t) % (n - 1);
      xs[b * T + t] = token(text[at]), ys[b * T + t] = token(text[at + 1]);
    }
  *x = em_from_data(xs, EM_I64, EM_SHAPE(B, T));
  *y = em_from_data(ys, EM_I64, EM_SHAPE(B, T));
  if (etest_on_cuda()) *x = em_to(*x, EM_CUDA), *y = em_to(*y, EM_CUDA);
}

/* Trains m for n steps (compiled when c is not NULL) with the cosine schedule; losses[i] out. */
static void train(gpt_model *m, em_compiled *c, int n, double *losses) {
  gpt_trainer tr;
  cr_assert(gpt_trainer_init(&tr, m, 1e-2, 0.1, 1.0), "%s", em_last_error());
  for (int i = 0; i < n; i++) {
    em_scope_begin();
    em_tensor *x, *y;
    batch(i, &x, &y);
    gpt_trainer_set_lr(&tr, gpt_lr_at(i, 3, n, 1e-2, 1e-3));
    em_outputs o = c ? em_call(c, &tr, x, y) : gpt_step_fn(&tr, (em_tensor *[]){x, y}, 2);
    cr_assert_not_null(o.t[0], "step %d: %s", i, em_last_error());
    cr_assert_not_null(o.t[1], "step %d: no gradient norm", i);
    losses[i] = em_item(o.t[0]);
    em_scope_end();
  }
  gpt_trainer_free(&tr);
}

static double max_abs_diff(em_tensor *a, em_tensor *b) {
  return em_item(em_amax(em_abs(em_sub(a, b)), 0, NULL, false));
}

ETEST(gpt, bad_config_refused) {
  gpt_model m;
  gpt_config c = tiny();
  c.n_head = 3; /* does not divide 16 */
  cr_assert_not_null(gpt_config_check(c));
  cr_assert_not(gpt_init(&m, c, EM_CPU));
  c = tiny(), c.n_layer = GPT_MAX_LAYERS + 1;
  cr_assert_not_null(gpt_config_check(c));
  cr_assert_null(gpt_config_check(tiny()));
}

ETEST(gpt, lr_schedule_warms_up_then_follows_a_cosine) {
  cr_assert_float_eq(gpt_lr_at(0, 10, 110, 1.0, 0.1), 0.1, 1e-12);
  cr_assert_float_eq(gpt_lr_at(9, 10, 110, 1.0, 0.1), 1.0, 1e-12);
  cr_assert_float_eq(gpt_lr_at(60, 10, 110, 1.0, 0.1), 0.55, 1e-12); /* halfway down the cosine */
  cr_assert_float_eq(gpt_lr_at(110, 10, 110, 1.0, 0.1), 0.1, 1e-12);
  cr_assert(gpt_lr_at(30, 10, 110, 1.0, 0.1) > gpt_lr_at(31, 10, 110, 1.0, 0.1));
}

ETEST(gpt, training_lowers_the_loss) {
  em_manual_seed(1);
  gpt_model m;
  cr_assert(gpt_init(&m, tiny(), test_device()), "%s", em_last_error());
  double loss[100];
  train(&m, NULL, 100, loss);
  /* starts near log(VOCAB) = 3.4 (small initial weights), and this text is easy to predict */
  cr_assert(fabs(loss[0] - log(VOCAB)) < 0.1, "first loss %g, log(V) %g", loss[0], log(VOCAB));
  double last = (loss[97] + loss[98] + loss[99]) / 3;
  cr_assert(last < 0.5 * loss[0], "loss %g -> %g", loss[0], last);
  gpt_free(&m);
}

/* The compiled whole step (inductor: its reductions sum in another order, its exp / tanh are
 * SLEEF's) follows eager's losses and ends at eager's parameters, within float rounding. */
ETEST(gpt, compiled_step_matches_eager) {
  enum { STEPS = 8 };
  double eager[STEPS], compiled[STEPS];
  gpt_model a, b;
  em_manual_seed(2);
  cr_assert(gpt_init(&a, tiny(), test_device()), "%s", em_last_error());
  em_manual_seed(2);
  cr_assert(gpt_init(&b, tiny(), test_device()), "%s", em_last_error());
  train(&a, NULL, STEPS, eager);
  em_compiled *c = em_compile(gpt_step_fn, &(em_compile_options){.name = "gpt_step", .fullgraph = true});
  cr_assert_not_null(c);
  train(&b, c, STEPS, compiled);
  for (int i = 0; i < STEPS; i++)
    cr_assert(fabs(eager[i] - compiled[i]) <= 1e-4 * fabs(eager[i]), "step %d: eager %.9g, compiled %.9g", i, eager[i],
              compiled[i]);
  for (int i = 0; i < a.n_params; i++) {
    em_scope_begin();
    double d = max_abs_diff(a.params[i], b.params[i]);
    cr_assert(d < 1e-4, "parameter %d differs by %g after %d steps", i, d, STEPS);
    em_scope_end();
  }
  /* The learning rate changed every step, yet two traces served them all: the first call makes
   * AdamW's state (not cached: it leaves new tensors in the optimizers), the second is the entry,
   * every later call replays it (one of them traced again as replay validation, a check). lr is
   * an input of the graph, not a constant baked into it. */
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.breaks, 0);
  cr_assert_eq(s.entries, 1, "%lld entries", (long long)s.entries);
  cr_assert(s.traces == 2 && s.uncached_traces == 1 && s.replays + s.checks == STEPS - 2,
            "%lld calls, %lld traces (%lld uncached), %lld replays, %lld checks", (long long)s.calls,
            (long long)s.traces, (long long)s.uncached_traces, (long long)s.replays, (long long)s.checks);
  em_compiled_free(c);
  gpt_free(&a), gpt_free(&b);
}

/* Decoding with a KV cache, eagerly and compiled, gives the logits of gpt_forward over the whole
 * context at each new position. The weights are redrawn larger than GPT-2's initialisation
 * (std 0.02 gives almost uniform logits, which would agree whatever the cache held). */
static void kv_cache_matches_full_forward(bool compile) {
  enum { PROMPT = 5, NEW = 6, BATCH = 2 };
  em_manual_seed(3);
  gpt_model m;
  cr_assert(gpt_init(&m, tiny(), test_device()), "%s", em_last_error());
  em_no_grad_begin();
  for (int i = 0; i < m.n_params; i++) {
    em_scope_begin();
    em_tensor *p = m.params[i];
    em_copy_(p, em_add(p, em_mul_scalar(em_randn(EM_F32, em_ndim(p), em_sizes(p)), 0.3)));
    em_scope_end();
  }
  em_compiled *c = compile ? em_compile(gpt_decode_fn, &(em_compile_options){.name = "gpt_decode"}) : NULL;
  int64_t ids[BATCH * (PROMPT + NEW)];
  for (int64_t i = 0; i < BATCH * (PROMPT + NEW); i++) ids[i] = token(text[(i * 5) % (sizeof text - 1)]);
  em_scope_begin();
  em_tensor *all = em_from_data(ids, EM_I64, EM_SHAPE(BATCH, PROMPT + NEW));
  if (etest_on_cuda()) all = em_to(all, EM_CUDA);
  int64_t L = m.cfg.n_layer;
  em_tensor *in[1 + 2 * GPT_MAX_LAYERS];
  em_tensor *logits = gpt_forward(&m, em_slice(all, 1, 0, PROMPT, 1), in + 1, in + 1 + L);
  cr_assert_not_null(logits, "%s", em_last_error());
  for (int s = PROMPT; s < PROMPT + NEW; s++) {
    in[0] = em_slice(all, 1, s, s + 1, 1);
    em_outputs o = c ? em_call_n(c, &m, (int)(1 + 2 * L), in) : gpt_decode_fn(&m, in, (int)(1 + 2 * L));
    cr_assert_eq(o.n, 1 + 2 * L);
    cr_assert_not_null(o.t[0], "position %d: %s", s, em_last_error());
    cr_assert_eq(em_size(o.t[1], 2), s + 1, "the cache grows by one");
    em_tensor *full = gpt_forward(&m, em_slice(all, 1, 0, s + 1, 1), NULL, NULL);
    em_tensor *want = em_reshape(em_slice(full, 1, s, s + 1, 1), EM_SHAPE(BATCH, VOCAB));
    double spread = em_item(em_sub(em_amax(want, 0, NULL, false), em_amin(want, 0, NULL, false)));
    cr_assert(spread > 1, "position %d: logits spread only %g", s, spread);
    double d = max_abs_diff(o.t[0], want);
    cr_assert(d <= 1e-4, "position %d (%s): KV-cache logits differ from the full forward's by %g", s,
              compile ? "compiled" : "eager", d);
    for (int i = 1; i < o.n; i++) in[i] = o.t[i];
  }
  if (c) {
    em_compile_stats st = em_compiled_stats(c);
    cr_assert_eq(st.traces, NEW, "a trace per cache length (no dynamic shapes yet): %lld", (long long)st.traces);
    cr_assert_eq(st.eager_calls, 0);
  }
  em_scope_end();
  em_no_grad_end();
  em_compiled_free(c);
  gpt_free(&m);
}

ETEST(gpt, kv_cache_decoding_matches_full_forward) {
  kv_cache_matches_full_forward(false);
}

ETEST(gpt, compiled_kv_cache_decoding_matches_full_forward) {
  kv_cache_matches_full_forward(true);
}
