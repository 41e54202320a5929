/* examples/gpt.c: trains a small character-level GPT (examples/gpt_model.h) on the fortune
 * cookies of Debian's `fortunes` package, then writes text with it.
 *
 *   gpt [--steps N] [--batch-size B] [--block T] [--n-layer L] [--n-head H] [--d-model D]
 *       [--lr LR] [--min-lr LR] [--warmup N] [--weight-decay WD] [--clip C] [--seed S]
 *       [--eval-every N] [--eval-batches N] [--threads T] [--data DIR] [--device cpu|cuda]
 *       [--compile | --no-compile] [--backend inductor|aot_eager|eager]
 *       [--compile-decode | --no-compile-decode] [--prompt TEXT] [--gen-chars N]
 *       [--temperature T] [--top-k K] [--json FILE] [--loss-log FILE]
 *
 * Corpus: every regular file of --data (default /usr/share/games/fortunes) in sorted order,
 * concatenated, except the .dat indexes strfile writes (the .u8 names are symbolic links to the
 * same text and are skipped with every other link). Tokens are the distinct bytes of the corpus.
 * The first 90% trains, the last 10% validates. The unigram entropy of the bytes (the loss of a
 * model that knows only their frequencies) is printed as the baseline to beat.
 *
 * Training: AdamW (betas 0.9, 0.95; weight decay on matrices and embeddings only), global
 * gradient-norm clipping, and a learning rate warmed up linearly then decayed along a cosine.
 * With --compile (the default) the whole step, forward, em_backward, clipping and both AdamW
 * updates, is one em_compile'd function; the learning rate is a 0-dim tensor the optimizers own,
 * so the step is traced once and replayed while the rate changes. --no-compile runs the same
 * function eagerly. --loss-log writes each step's loss as a hexadecimal float, to compare runs.
 *
 * Generation: after training, --gen-chars characters follow --prompt, sampled with temperature
 * and top-k. The prompt runs through the full forward once and fills a KV cache; then each new
 * token is one decoding step (gpt_decode_fn) that appends its keys and values to the cache. With
 * --compile-decode (the default) the step goes through em_compile. Each cache length is a new
 * shape, so today every step traces anew until the recompile limit, after which em_compile runs
 * it eagerly (dynamic shapes will make it one graph). When the cache reaches --block tokens,
 * it is refilled from the last block/2 (the position embedding has block rows).
 *
 * A progress bar goes to stderr on a terminal; validation losses, the samples and a summary go
 * to stdout; --json FILE writes the configuration, the loss curve, the validation losses, the
 * timings and the sample as one JSON object. */
#define _POSIX_C_SOURCE 200809L
#include "gpt_model.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  int64_t steps, batch, block, n_layer, n_head, d_model, warmup, eval_every, eval_batches, gen_chars, top_k;
  double lr, min_lr, weight_decay, clip, temperature;
  uint64_t seed;
  int threads;
  bool compile, compile_decode;
  const char *data, *device, *backend, *prompt, *json, *loss_log;
} options;

static double now(void) {
  struct timespec ts;
  return clock_gettime(CLOCK_MONOTONIC, &ts) ? 0 : (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Mean of v[skip..n): the steady state, past the steps that trace and compile. */
static double mean_from(const double *v, int64_t skip, int64_t n) {
  double s = 0;
  if (skip >= n) skip = 0;
  for (int64_t i = skip; i < n; i++) s += v[i];
  return n > skip ? s / (double)(n - skip) : 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: gpt [--steps N] [--batch-size B] [--block T] [--n-layer L] [--n-head H] [--d-model D]\n"
             "           [--lr LR] [--min-lr LR] [--warmup N] [--weight-decay WD] [--clip C] [--seed S]\n"
             "           [--eval-every N] [--eval-batches N] [--threads T] [--data DIR] [--device cpu|cuda]\n"
             "           [--compile | --no-compile] [--backend inductor|aot_eager|eager]\n"
             "           [--compile-decode | --no-compile-decode] [--prompt TEXT] [--gen-chars N]\n"
             "           [--temperature T] [--top-k K] [--json FILE] [--loss-log FILE]\n");
}

static bool parse(int argc, char **argv, options *o) {
  *o = (options){.steps = 2000, .batch = 32, .block = 64, .n_layer = 4, .n_head = 4, .d_model = 128, .warmup = 100,
                 .eval_every = 250, .eval_batches = 8, .gen_chars = 200, .top_k = 10, .lr = 6e-3, .min_lr = NAN,
                 .weight_decay = 0.1, .clip = 1.0, .temperature = 0.8, .seed = 0, .threads = 0, .compile = true,
                 .compile_decode = true, .data = "/usr/share/games/fortunes", .device = "cpu", .backend = "inductor",
                 .prompt = "The meaning of life is ", .json = NULL, .loss_log = NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool *flag = !strcmp(a, "--compile") || !strcmp(a, "--no-compile")               ? &o->compile
                 : !strcmp(a, "--compile-decode") || !strcmp(a, "--no-compile-decode") ? &o->compile_decode
                                                                                       : NULL;
    if (!strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    } else if (flag) {
      *flag = strncmp(a, "--no-", 5) != 0;
      continue;
    }
    if (!v) {
      fprintf(stderr, "gpt: %s needs a value\n", a);
      return false;
    }
    i++;
    if (!strcmp(a, "--steps")) o->steps = atoll(v);
    else if (!strcmp(a, "--batch-size")) o->batch = atoll(v);
    else if (!strcmp(a, "--block")) o->block = atoll(v);
    else if (!strcmp(a, "--n-layer")) o->n_layer = atoll(v);
    else if (!strcmp(a, "--n-head")) o->n_head = atoll(v);
    else if (!strcmp(a, "--d-model")) o->d_model = atoll(v);
    else if (!strcmp(a, "--lr")) o->lr = atof(v);
    else if (!strcmp(a, "--min-lr")) o->min_lr = atof(v);
    else if (!strcmp(a, "--warmup")) o->warmup = atoll(v);
    else if (!strcmp(a, "--weight-decay")) o->weight_decay = atof(v);
    else if (!strcmp(a, "--clip")) o->clip = atof(v);
    else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--eval-every")) o->eval_every = atoll(v);
    else if (!strcmp(a, "--eval-batches")) o->eval_batches = atoll(v);
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--data")) o->data = v;
    else if (!strcmp(a, "--device")) o->device = v;
    else if (!strcmp(a, "--backend")) o->backend = v;
    else if (!strcmp(a, "--prompt")) o->prompt = v;
    else if (!strcmp(a, "--gen-chars")) o->gen_chars = atoll(v);
    else if (!strcmp(a, "--temperature")) o->temperature = atof(v);
    else if (!strcmp(a, "--top-k")) o->top_k = atoll(v);
    else if (!strcmp(a, "--json")) o->json = v;
    else if (!strcmp(a, "--loss-log")) o->loss_log = v;
    else {
      fprintf(stderr, "gpt: unknown option %s\n", a);
      usage(stderr);
      return false;
    }
  }
  if (isnan(o->min_lr)) o->min_lr = o->lr / 10;
  if (o->steps < 1 || o->batch < 1 || o->block < 2 || o->warmup < 1 || o->eval_every < 1 || o->eval_batches < 1 ||
      o->gen_chars < 0 || o->top_k < 1 || !(o->lr > 0) || !(o->min_lr >= 0) || !(o->temperature > 0) ||
      !(o->clip > 0) || !o->prompt[0] || (strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))) {
    fprintf(stderr, "gpt: bad option value\n");
    usage(stderr);
    return false;
  }
  return true;
}

static void fail(const char *what) {
  fprintf(stderr, "gpt: %s: %s\n", what, em_last_error() ? em_last_error() : "failed");
  exit(1);
}

/* ---- the corpus ---- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of dir but *.dat, in sorted order, concatenated; NULL with a message. */
static unsigned char *read_corpus(const char *dir, int64_t *len, int *n_files) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "gpt: cannot open %s (Debian's fortunes package installs it: apt-get install fortunes)\n", dir);
    return NULL;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    if (e->d_name[0] == '.' || (l > 4 && !strcmp(e->d_name + l - 4, ".dat"))) continue;
    if (n == cap && !(names = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names))) exit(1);
    if (!(names[n++] = strdup(e->d_name))) exit(1);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_str);
  unsigned char *buf = NULL;
  size_t size = 0;
  *n_files = 0;
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    free(names[i]);
    if (lstat(path, &st) || !S_ISREG(st.st_mode)) continue; /* *.u8 -> the same text */
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    if (!(buf = realloc(buf, size + (size_t)st.st_size + 1))) exit(1);
    size += fread(buf + size, 1, (size_t)st.st_size, f);
    fclose(f);
    (*n_files)++;
  }
  free(names);
  *len = (int64_t)size;
  if (!size) fprintf(stderr, "gpt: no text in %s\n", dir);
  return size ? buf : (free(buf), NULL);
}

/* ---- batches: windows of block + 1 tokens at offsets from a seeded generator on the host, so
 * eager and compiled runs see the same batches ---- */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* x, y i64 [B, T] from the windows at offsets[0..B) of ids, on dev (owned by the current scope) */
static void batch(const int64_t *ids, const int64_t *offsets, int64_t B, int64_t T, em_device dev, int64_t *scratch,
                  em_tensor **x, em_tensor **y) {
  for (int64_t b = 0; b < B; b++) {
    memcpy(scratch + b * T, ids + offsets[b], sizeof *scratch * (size_t)T);
    memcpy(scratch + (B + b) * T, ids + offsets[b] + 1, sizeof *scratch * (size_t)T);
  }
  *x = em_from_data(scratch, EM_I64, EM_SHAPE(B, T));
  *y = em_from_data(scratch + B * T, EM_I64, EM_SHAPE(B, T));
  if (dev != EM_CPU) *x = em_to(*x, dev), *y = em_to(*y, dev);
}

/* ---- JSON output ---- */

static void json_string(FILE *f, const char *s, int64_t n) {
  fputc('"', f);
  for (int64_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '\n') fputs("\\n", f);
    else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* ---- generation ---- */

typedef struct {
  gpt_model *m;
  em_compiled *decode; /* NULL: eager */
  em_tensor *k[GPT_MAX_LAYERS], *v[GPT_MAX_LAYERS], *logits; /* retained by us */
  em_device dev;
} decoder;

static void decoder_set(decoder *d, em_tensor *logits, em_tensor *const *k, em_tensor *const *v) {
  em_release(d->logits), d->logits = em_retain(logits);
  for (int64_t l = 0; l < d->m->cfg.n_layer; l++) {
    em_release(d->k[l]), d->k[l] = em_retain(k[l]);
    em_release(d->v[l]), d->v[l] = em_retain(v[l]);
  }
}

/* Fills the cache from the full forward over ids[0..n) and keeps the last position's logits. */
static bool prefill(decoder *d, const int64_t *ids, int64_t n) {
  em_scope_begin();
  em_tensor *k[GPT_MAX_LAYERS], *v[GPT_MAX_LAYERS];
  em_tensor *idx = em_from_data(ids, EM_I64, EM_SHAPE(1, n));
  if (idx && d->dev != EM_CPU) idx = em_to(idx, d->dev);
  em_tensor *logits = gpt_forward(d->m, idx, k, v);
  if (logits) decoder_set(d, em_reshape(em_slice(logits, 1, n - 1, n, 1), EM_SHAPE(1, d->m->cfg.vocab)), k, v);
  em_scope_end();
  return logits != NULL;
}

/* Appends token to the cache (one decoding step). */
static bool decode(decoder *d, int64_t token) {
  em_scope_begin();
  int64_t L = d->m->cfg.n_layer;
  em_tensor *in[1 + 2 * GPT_MAX_LAYERS];
  in[0] = em_from_data(&token, EM_I64, EM_SHAPE(1, 1));
  if (in[0] && d->dev != EM_CPU) in[0] = em_to(in[0], d->dev);
  for (int64_t l = 0; l < L; l++) in[1 + l] = d->k[l], in[1 + L + l] = d->v[l];
  em_outputs o = d->decode ? em_call_n(d->decode, d->m, (int)(1 + 2 * L), in) : gpt_decode_fn(d->m, in, (int)(1 + 2 * L));
  bool ok = o.n == 1 + 2 * L;
  for (int i = 0; ok && i < o.n; i++) ok = o.t[i] != NULL;
  if (ok) decoder_set(d, o.t[0], o.t + 1, o.t + 1 + L);
  em_scope_end();
  return ok;
}

/* A token drawn from softmax(logits / temperature) over the top_k largest logits. */
static int64_t sample(em_tensor *logits, double temperature, int64_t top_k) {
  em_scope_begin();
  int64_t k = top_k < em_size(logits, 1) ? top_k : em_size(logits, 1);
  em_tensor *idx = NULL;
  em_tensor *top = em_topk(em_div_scalar(logits, temperature), k, 1, true, true, &idx);
  em_tensor *pick = em_gather(idx, 1, em_multinomial(em_softmax(top, 1), 1, true));
  int64_t t = pick ? (int64_t)em_item(pick) : -1;
  em_scope_end();
  return t;
}

int main(int argc, char **argv) {
  options o;
  if (!parse(argc, argv, &o)) return 2;
  if (o.threads > 0) em_set_num_threads(o.threads);
  em_device dev = strcmp(o.device, "cuda") ? EM_CPU : EM_CUDA;
  em_scope_begin();

  /* corpus, vocabulary, unigram entropy */
  int64_t len;
  int n_files;
  unsigned char *text = read_corpus(o.data, &len, &n_files);
  if (!text) return 1;
  int64_t count[256] = {0}, id_of[256], vocab = 0;
  unsigned char byte_of[256];
  for (int64_t i = 0; i < len; i++) count[text[i]]++;
  double entropy = 0;
  for (int c = 0; c < 256; c++) {
    id_of[c] = -1;
    if (!count[c]) continue;
    double p = (double)count[c] / (double)len;
    entropy -= p * log(p);
    byte_of[vocab] = (unsigned char)c, id_of[c] = vocab++;
  }
  int64_t *ids = malloc(sizeof *ids * (size_t)len);
  if (!ids) fail("out of memory");
  for (int64_t i = 0; i < len; i++) ids[i] = id_of[text[i]];
  int64_t n_train = len - len / 10, n_val = len / 10, T = o.block, B = o.batch;
  if (n_val < T + 2) {
    fprintf(stderr, "gpt: the corpus (%lld bytes) is too small for block %lld\n", (long long)len, (long long)T);
    return 1;
  }
  int64_t n_prompt = (int64_t)strlen(o.prompt), *gen = malloc(sizeof *gen * (size_t)(n_prompt + o.gen_chars));
  if (!gen) fail("out of memory");
  for (int64_t i = 0; i < n_prompt; i++)
    if ((gen[i] = id_of[(unsigned char)o.prompt[i]]) < 0) {
      fprintf(stderr, "gpt: the prompt's byte 0x%02x is not in the corpus\n", (unsigned char)o.prompt[i]);
      return 1;
    }

  gpt_config cfg = {vocab, T, o.n_layer, o.n_head, o.d_model};
  const char *bad = gpt_config_check(cfg);
  if (bad) {
    fprintf(stderr, "gpt: %s\n", bad);
    return 2;
  }
  em_manual_seed(o.seed);
  gpt_model m;
  gpt_trainer tr;
  if (!gpt_init(&m, cfg, dev)) fail("initialising the model");
  if (!gpt_trainer_init(&tr, &m, o.lr, o.weight_decay, o.clip)) fail("creating the optimizers");
  em_compile_options copts = {.backend = o.backend, .name = "gpt_step"};
  em_compiled *step_c = o.compile ? em_compile(gpt_step_fn, &copts) : NULL;
  copts.name = "gpt_val_loss";
  em_compiled *val_c = o.compile ? em_compile(gpt_loss_fn, &copts) : NULL;
  copts.name = "gpt_decode";
  em_compiled *decode_c = o.compile_decode ? em_compile(gpt_decode_fn, &copts) : NULL;
  if ((o.compile && (!step_c || !val_c)) || (o.compile_decode && !decode_c)) fail("em_compile");
  printf("gpt: corpus %s: %d files, %lld bytes, %lld distinct (the vocabulary); unigram entropy %.4f nats/char\n",
         o.data, n_files, (long long)len, (long long)vocab, entropy);
  printf("gpt: %lld layers, d_model %lld, %lld heads, block %lld, %lld parameters; batch %lld, %lld steps, AdamW lr "
         "%g -> %g (warmup %lld, cosine), %s, %s, %d threads\n",
         (long long)o.n_layer, (long long)o.d_model, (long long)o.n_head, (long long)T, (long long)gpt_param_count(&m),
         (long long)B, (long long)o.steps, o.lr, o.min_lr, (long long)o.warmup, o.device,
         o.compile ? "whole step em_compile'd" : "eager", em_get_num_threads());
  fflush(stdout);

  FILE *loss_log = o.loss_log ? fopen(o.loss_log, "w") : NULL;
  if (o.loss_log && !loss_log) fail("opening --loss-log");
  double *loss = malloc(sizeof(double) * (size_t)o.steps), *ms = malloc(sizeof(double) * (size_t)o.steps);
  int64_t n_evals = o.steps / o.eval_every + 2, evals = 0, *eval_step = malloc(sizeof(int64_t) * (size_t)n_evals);
  double *eval_loss = malloc(sizeof(double) * (size_t)n_evals);
  int64_t *offsets = malloc(sizeof(int64_t) * (size_t)B), *scratch = malloc(sizeof(int64_t) * (size_t)(2 * B * T));
  if (!loss || !ms || !eval_step || !eval_loss || !offsets || !scratch) fail("out of memory");
  uint64_t rng = o.seed;
  bool tty = isatty(STDERR_FILENO);
  double t_train = now(), t_eval = 0;

  for (int64_t step = 0; step <= o.steps; step++) {
    /* validation: the same eval_batches batches every time, evenly spread over the held-out 10% */
    if (step % o.eval_every == 0 || step == o.steps) {
      double t0 = now(), sum = 0;
      em_no_grad_begin();
      for (int64_t e = 0; e < o.eval_batches; e++) {
        em_scope_begin();
        for (int64_t b = 0; b < B; b++)
          offsets[b] = n_train + (n_val - T - 1) * (e * B + b) / (o.eval_batches * B - 1 > 0 ? o.eval_batches * B - 1 : 1);
        em_tensor *x, *y;
        batch(ids, offsets, B, T, dev, scratch, &x, &y);
        em_tensor *l = val_c ? em_call(val_c, &m, x, y).t[0] : gpt_loss(&m, x, y);
        if (!l) fail("validation loss");
        sum += em_item(l);
        em_scope_end();
      }
      em_no_grad_end();
      eval_step[evals] = step, eval_loss[evals++] = sum / (double)o.eval_batches;
      t_eval += now() - t0;
      if (tty) fprintf(stderr, "\r%*s\r", 100, "");
      printf("step %5lld: val loss %.4f (%.3f of the unigram entropy)%s", (long long)step, eval_loss[evals - 1],
             eval_loss[evals - 1] / entropy, step ? "" : "\n");
      if (step) printf(", train loss %.4f, lr %.2e, %.1f ms/step\n", loss[step - 1], gpt_lr_at(step - 1, o.warmup, o.steps, o.lr, o.min_lr), ms[step - 1]);
      fflush(stdout);
    }
    if (step == o.steps) break;
    double t0 = now();
    em_scope_begin();
    for (int64_t b = 0; b < B; b++) offsets[b] = (int64_t)(splitmix64(&rng) % (uint64_t)(n_train - T - 1));
    em_tensor *x, *y;
    batch(ids, offsets, B, T, dev, scratch, &x, &y);
    gpt_trainer_set_lr(&tr, gpt_lr_at(step, o.warmup, o.steps, o.lr, o.min_lr));
    em_outputs out = step_c ? em_call(step_c, &tr, x, y) : gpt_step_fn(&tr, (em_tensor *[]){x, y}, 2);
    if (!out.t[0]) fail("training step");
    loss[step] = em_item(out.t[0]);
    em_scope_end();
    ms[step] = 1e3 * (now() - t0);
    if (loss_log) fprintf(loss_log, "%a\n", loss[step]);
    if (tty) {
      int64_t done = step + 1, width = 30, bar = width * done / o.steps;
      double el = now() - t_train - t_eval, rate = (double)done / el;
      fprintf(stderr, "\rstep %lld/%lld [%.*s%*s] loss %.4f %.1f steps/s ETA %.0fs ", (long long)done, (long long)o.steps,
              (int)bar, "##############################", (int)(width - bar), "", loss[step], rate,
              (double)(o.steps - done) / rate);
    }
  }
  double train_s = now() - t_train - t_eval;
  if (loss_log) fclose(loss_log);
  double med = mean_from(ms, 10, o.steps), tok_s = (double)(B * T) / (med / 1e3);
  double train_mean_last = 0;
  int64_t last = o.steps < 50 ? o.steps : 50;
  for (int64_t i = o.steps - last; i < o.steps; i++) train_mean_last += loss[i] / (double)last;
  printf("gpt: trained %lld steps in %.1f s (validation %.1f s more); %.1f ms/step (mean past step 10), %.0f tokens/s; first step "
         "%.0f ms; train loss (mean of the last %lld steps) %.4f, val loss %.4f = %.3f of the unigram entropy %.4f\n",
         (long long)o.steps, train_s, t_eval, med, tok_s, ms[0], (long long)last, train_mean_last, eval_loss[evals - 1],
         eval_loss[evals - 1] / entropy, entropy);
  if (step_c) {
    em_compile_stats s = em_compiled_stats(step_c);
    printf("em_compile(gpt_step): %lld calls, %lld traced, %lld replayed, %lld graphs compiled, %lld graph breaks, "
           "%lld eager fallbacks\n",
           (long long)s.calls, (long long)s.traces, (long long)s.replays, (long long)s.graphs_compiled,
           (long long)s.breaks, (long long)s.eager_calls);
  }

  /* generation */
  em_manual_seed(o.seed);
  decoder d = {.m = &m, .decode = decode_c, .dev = dev};
  int64_t n = n_prompt;
  double t_gen = now();
  em_no_grad_begin();
  int64_t start = n > T ? n - T : 0;
  if (!prefill(&d, gen + start, n - start)) fail("prefill");
  for (int64_t i = 0; i < o.gen_chars; i++) {
    int64_t t = sample(d.logits, o.temperature, o.top_k);
    if (t < 0) fail("sampling");
    gen[n++] = t;
    if (i + 1 == o.gen_chars) break;
    bool ok = em_size(d.k[0], 2) < T ? decode(&d, t) : prefill(&d, gen + n - T / 2, T / 2);
    if (!ok) fail("decoding");
  }
  em_no_grad_end();
  t_gen = now() - t_gen;
  char *sample_text = malloc((size_t)n + 1);
  if (!sample_text) fail("out of memory");
  for (int64_t i = 0; i < n; i++) sample_text[i] = (char)byte_of[gen[i]];
  sample_text[n] = 0;
  printf("gpt: sample (temperature %g, top-k %lld, %lld characters in %.2f s, decoding step %s):\n%s\n", o.temperature,
         (long long)o.top_k, (long long)o.gen_chars, t_gen, decode_c ? "em_compile'd" : "eager", sample_text);
  if (decode_c) {
    em_compile_stats s = em_compiled_stats(decode_c);
    printf("em_compile(gpt_decode): %lld calls, %lld traced, %lld replayed, %lld eager after the recompile limit\n",
           (long long)s.calls, (long long)s.traces, (long long)s.replays, (long long)s.eager_calls);
  }

  if (o.json) {
    FILE *f = fopen(o.json, "w");
    if (!f) fail("opening --json");
    fprintf(f, "{\"config\": {\"steps\": %lld, \"batch_size\": %lld, \"block\": %lld, \"n_layer\": %lld, \"n_head\": %lld, "
               "\"d_model\": %lld, \"vocab\": %lld, \"params\": %lld, \"lr\": %g, \"min_lr\": %g, \"warmup\": %lld, "
               "\"weight_decay\": %g, \"clip\": %g, \"seed\": %llu, \"threads\": %d, \"device\": \"%s\", "
               "\"compile\": %s, \"compile_decode\": %s, \"backend\": \"%s\"},\n",
            (long long)o.steps, (long long)B, (long long)T, (long long)o.n_layer, (long long)o.n_head,
            (long long)o.d_model, (long long)vocab, (long long)gpt_param_count(&m), o.lr, o.min_lr, (long long)o.warmup,
            o.weight_decay, o.clip, (unsigned long long)o.seed, em_get_num_threads(), o.device,
            o.compile ? "true" : "false", o.compile_decode ? "true" : "false", o.backend);
    fprintf(f, " \"corpus\": {\"dir\": ");
    json_string(f, o.data, (int64_t)strlen(o.data));
    fprintf(f, ", \"files\": %d, \"bytes\": %lld, \"train_bytes\": %lld, \"val_bytes\": %lld, "
               "\"unigram_entropy_nats\": %.6f},\n",
            n_files, (long long)len, (long long)n_train, (long long)n_val, entropy);
    fprintf(f, " \"train_loss\": [");
    for (int64_t i = 0; i < o.steps; i++) fprintf(f, "%s%.6f", i ? ", " : "", loss[i]);
    fprintf(f, "],\n \"step_ms\": [");
    for (int64_t i = 0; i < o.steps; i++) fprintf(f, "%s%.3f", i ? ", " : "", ms[i]);
    fprintf(f, "],\n \"val\": [");
    for (int64_t i = 0; i < evals; i++)
      fprintf(f, "%s{\"step\": %lld, \"loss\": %.6f}", i ? ", " : "", (long long)eval_step[i], eval_loss[i]);
    fprintf(f, "],\n \"timings\": {\"train_s\": %.3f, \"val_s\": %.3f, \"step_ms_mean_after_10\": %.3f, \"first_step_ms\": %.3f, "
               "\"tokens_per_s\": %.1f, \"generate_s\": %.3f},\n \"sample\": ",
            train_s, t_eval, med, ms[0], tok_s, t_gen);
    json_string(f, sample_text, n);
    fprintf(f, "}\n");
    fclose(f);
  }

  for (int64_t l = 0; l < m.cfg.n_layer; l++) em_release(d.k[l]), em_release(d.v[l]);
  em_release(d.logits);
  em_compiled_free(step_c), em_compiled_free(val_c), em_compiled_free(decode_c);
  gpt_trainer_free(&tr);
  gpt_free(&m);
  free(text), free(ids), free(gen), free(loss), free(ms), free(eval_step), free(eval_loss), free(offsets), free(scratch);
  free(sample_text);
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
