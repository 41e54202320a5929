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
 * timings and the sample as one JSON object (the sample's bytes above 0x7e as \u00XX escapes, one a
 * byte, since a sampled UTF-8 sequence may be cut). */
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
    else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c); /* a byte: a UTF-8 sequence may be cut */
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
  for (int64_t l = 0; logits && l < d->m->cfg.n_layer; l++) /* the heads' views made contiguous, as the */
    k[l] = em_contiguous(k[l]), v[l] = em_contiguous(v[l]); /* decoding step's caches are (one dynamic entry) */
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
  int n = (int)(1 + 2 * L);
  em_outputs o = d->decode ? em_call_n(d->decode, d->m, n, in) : gpt_decode_fn(d->m, in, n);
  bool ok = o.n == n;
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

/* ---- the run: corpus, model, training, generation ---- */

typedef struct {
  options o;
  em_device dev;
  /* corpus: bytes, their token ids, the vocabulary both ways, the split */
  unsigned char *text;
  int64_t len, *ids, id_of[256], vocab, n_train, n_val;
  unsigned char byte_of[256];
  int n_files;
  double entropy; /* of the corpus's byte frequencies, nats */
  gpt_model m;
  gpt_trainer tr;
  em_compiled *step_c, *val_c, *decode_c;
  /* per step, per validation; batch buffers */
  double *loss, *ms, *val_loss, train_s, val_s, step_ms, tok_s, gen_s;
  int64_t *val_step, n_val_done, *offsets, *scratch;
  /* the prompt then the generated tokens */
  int64_t *gen, n_gen;
} run;

static bool load_corpus(run *r) {
  if (!(r->text = read_corpus(r->o.data, &r->len, &r->n_files))) return false;
  int64_t count[256] = {0};
  for (int64_t i = 0; i < r->len; i++) count[r->text[i]]++;
  for (int c = 0; c < 256; c++) {
    r->id_of[c] = -1;
    if (!count[c]) continue;
    double p = (double)count[c] / (double)r->len;
    r->entropy -= p * log(p);
    r->byte_of[r->vocab] = (unsigned char)c, r->id_of[c] = r->vocab++;
  }
  if (!(r->ids = malloc(sizeof *r->ids * (size_t)r->len))) fail("out of memory");
  for (int64_t i = 0; i < r->len; i++) r->ids[i] = r->id_of[r->text[i]];
  r->n_val = r->len / 10, r->n_train = r->len - r->n_val;
  if (r->n_val < r->o.block + 2) {
    fprintf(stderr, "gpt: the corpus (%lld bytes) is too small for block %lld\n", (long long)r->len,
            (long long)r->o.block);
    return false;
  }
  return true;
}

/* Mean loss over the same eval_batches batches every time, evenly spread over the held-out 10%. */
static double validate(run *r) {
  int64_t B = r->o.batch, T = r->o.block, n = r->o.eval_batches * B;
  double sum = 0;
  em_no_grad_begin();
  for (int64_t e = 0; e < r->o.eval_batches; e++) {
    em_scope_begin();
    for (int64_t b = 0; b < B; b++) r->offsets[b] = r->n_train + (r->n_val - T - 1) * (e * B + b) / (n > 1 ? n - 1 : 1);
    em_tensor *x, *y;
    batch(r->ids, r->offsets, B, T, r->dev, r->scratch, &x, &y);
    em_tensor *l = r->val_c ? em_call(r->val_c, &r->m, x, y).t[0] : gpt_loss(&r->m, x, y);
    if (!l) fail("validation loss");
    sum += em_item(l);
    em_scope_end();
  }
  em_no_grad_end();
  return sum / (double)r->o.eval_batches;
}

static void progress(run *r, int64_t done, double elapsed) {
  int64_t width = 30, bar = width * done / r->o.steps;
  double rate = (double)done / elapsed;
  fprintf(stderr, "\rstep %lld/%lld [%.*s%*s] loss %.4f %.1f steps/s ETA %.0fs ", (long long)done,
          (long long)r->o.steps, (int)bar, "##############################", (int)(width - bar), "", r->loss[done - 1],
          rate, (double)(r->o.steps - done) / rate);
}

static void train(run *r) {
  const options *o = &r->o;
  int64_t B = o->batch, T = o->block;
  FILE *loss_log = o->loss_log ? fopen(o->loss_log, "w") : NULL;
  if (o->loss_log && !loss_log) fail("opening --loss-log");
  uint64_t rng = o->seed;
  bool tty = isatty(STDERR_FILENO);
  double t_train = now();
  for (int64_t step = 0; step <= o->steps; step++) {
    if (step % o->eval_every == 0 || step == o->steps) {
      double t0 = now(), v = validate(r);
      r->val_step[r->n_val_done] = step, r->val_loss[r->n_val_done++] = v;
      r->val_s += now() - t0;
      if (tty) fprintf(stderr, "\r%*s\r", 100, "");
      printf("step %5lld: val loss %.4f (%.3f of the unigram entropy)", (long long)step, v, v / r->entropy);
      if (step)
        printf(", train loss %.4f, lr %.2e, %.1f ms/step", r->loss[step - 1],
               gpt_lr_at(step - 1, o->warmup, o->steps, o->lr, o->min_lr), r->ms[step - 1]);
      printf("\n");
      fflush(stdout);
    }
    if (step == o->steps) break;
    double t0 = now();
    em_scope_begin();
    for (int64_t b = 0; b < B; b++) r->offsets[b] = (int64_t)(splitmix64(&rng) % (uint64_t)(r->n_train - T - 1));
    em_tensor *x, *y;
    batch(r->ids, r->offsets, B, T, r->dev, r->scratch, &x, &y);
    gpt_trainer_set_lr(&r->tr, gpt_lr_at(step, o->warmup, o->steps, o->lr, o->min_lr));
    em_outputs out = r->step_c ? em_call(r->step_c, &r->tr, x, y) : gpt_step_fn(&r->tr, (em_tensor *[]){x, y}, 2);
    if (!out.t[0]) fail("training step");
    r->loss[step] = em_item(out.t[0]);
    em_scope_end();
    r->ms[step] = 1e3 * (now() - t0);
    if (loss_log) fprintf(loss_log, "%a\n", r->loss[step]);
    if (tty) progress(r, step + 1, now() - t_train - r->val_s);
  }
  r->train_s = now() - t_train - r->val_s;
  if (loss_log) fclose(loss_log);
  r->step_ms = mean_from(r->ms, 10, o->steps), r->tok_s = (double)(B * T) / (r->step_ms / 1e3);
}

/* gen_chars tokens after the prompt (r->gen[0..n_gen) holds the prompt) */
static void generate(run *r) {
  int64_t T = r->o.block;
  em_manual_seed(r->o.seed);
  decoder d = {.m = &r->m, .decode = r->decode_c, .dev = r->dev};
  double t0 = now();
  em_no_grad_begin();
  int64_t start = r->n_gen > T ? r->n_gen - T : 0;
  if (!prefill(&d, r->gen + start, r->n_gen - start)) fail("prefill");
  for (int64_t i = 0; i < r->o.gen_chars; i++) {
    int64_t t = sample(d.logits, r->o.temperature, r->o.top_k);
    if (t < 0) fail("sampling");
    r->gen[r->n_gen++] = t;
    if (i + 1 == r->o.gen_chars) break;
    bool ok = em_size(d.k[0], 2) < T ? decode(&d, t) : prefill(&d, r->gen + r->n_gen - T / 2, T / 2);
    if (!ok) fail("decoding");
  }
  em_no_grad_end();
  r->gen_s = now() - t0;
  for (int64_t l = 0; l < r->m.cfg.n_layer; l++) em_release(d.k[l]), em_release(d.v[l]);
  em_release(d.logits);
}

static void write_json(run *r, const char *sample_text) {
  const options *o = &r->o;
  FILE *f = fopen(o->json, "w");
  if (!f) fail("opening --json");
  fprintf(f, "{\"config\": {\"steps\": %lld, \"batch_size\": %lld, \"block\": %lld, \"n_layer\": %lld, "
             "\"n_head\": %lld, \"d_model\": %lld, \"vocab\": %lld, \"params\": %lld, \"lr\": %g, \"min_lr\": %g, "
             "\"warmup\": %lld, \"weight_decay\": %g, \"clip\": %g, \"seed\": %llu, \"threads\": %d, "
             "\"device\": \"%s\", \"compile\": %s, \"compile_decode\": %s, \"backend\": \"%s\"},\n",
          (long long)o->steps, (long long)o->batch, (long long)o->block, (long long)o->n_layer, (long long)o->n_head,
          (long long)o->d_model, (long long)r->vocab, (long long)gpt_param_count(&r->m), o->lr, o->min_lr,
          (long long)o->warmup, o->weight_decay, o->clip, (unsigned long long)o->seed, em_get_num_threads(),
          o->device, o->compile ? "true" : "false", o->compile_decode ? "true" : "false", o->backend);
  fprintf(f, " \"corpus\": {\"dir\": ");
  json_string(f, o->data, (int64_t)strlen(o->data));
  fprintf(f, ", \"files\": %d, \"bytes\": %lld, \"train_bytes\": %lld, \"val_bytes\": %lld, "
             "\"unigram_entropy_nats\": %.6f},\n \"train_loss\": [",
          r->n_files, (long long)r->len, (long long)r->n_train, (long long)r->n_val, r->entropy);
  for (int64_t i = 0; i < o->steps; i++) fprintf(f, "%s%.6f", i ? ", " : "", r->loss[i]);
  fprintf(f, "],\n \"step_ms\": [");
  for (int64_t i = 0; i < o->steps; i++) fprintf(f, "%s%.3f", i ? ", " : "", r->ms[i]);
  fprintf(f, "],\n \"val\": [");
  for (int64_t i = 0; i < r->n_val_done; i++)
    fprintf(f, "%s{\"step\": %lld, \"loss\": %.6f}", i ? ", " : "", (long long)r->val_step[i], r->val_loss[i]);
  fprintf(f, "],\n \"timings\": {\"train_s\": %.3f, \"val_s\": %.3f, \"step_ms_mean_after_10\": %.3f, "
             "\"first_step_ms\": %.3f, \"tokens_per_s\": %.1f, \"generate_s\": %.3f},\n \"sample\": ",
          r->train_s, r->val_s, r->step_ms, r->ms[0], r->tok_s, r->gen_s);
  json_string(f, sample_text, r->n_gen);
  fprintf(f, "}\n");
  fclose(f);
}

static void print_stats(const char *name, em_compiled *c) {
  em_compile_stats s = em_compiled_stats(c);
  printf("em_compile(%s): %lld calls, %lld traced, %lld replayed, %lld graphs compiled, %lld graph breaks, "
         "%lld run eagerly after the recompile limit\n",
         name, (long long)s.calls, (long long)s.traces, (long long)s.replays, (long long)s.graphs_compiled,
         (long long)s.breaks, (long long)s.eager_calls);
}

/* The model, its optimizers and the compiled functions. */
static void setup(run *r) {
  const options *o = &r->o;
  gpt_config cfg = {r->vocab, o->block, o->n_layer, o->n_head, o->d_model};
  const char *bad = gpt_config_check(cfg);
  if (bad) {
    fprintf(stderr, "gpt: %s\n", bad);
    exit(2);
  }
  em_manual_seed(o->seed);
  if (!gpt_init(&r->m, cfg, r->dev)) fail("initialising the model");
  if (!gpt_trainer_init(&r->tr, &r->m, o->lr, o->weight_decay, o->clip)) fail("creating the optimizers");
  em_compile_options copts = {.backend = o->backend, .name = "gpt_step"};
  if (o->compile && !(r->step_c = em_compile(gpt_step_fn, &copts))) fail("em_compile");
  copts.name = "gpt_val_loss";
  if (o->compile && !(r->val_c = em_compile(gpt_loss_fn, &copts))) fail("em_compile");
  copts.name = "gpt_decode";
  if (o->compile_decode && !(r->decode_c = em_compile(gpt_decode_fn, &copts))) fail("em_compile");
  int64_t n_evals = o->steps / o->eval_every + 2, n_prompt = (int64_t)strlen(o->prompt);
  r->loss = malloc(sizeof(double) * (size_t)o->steps), r->ms = malloc(sizeof(double) * (size_t)o->steps);
  r->val_step = malloc(sizeof(int64_t) * (size_t)n_evals), r->val_loss = malloc(sizeof(double) * (size_t)n_evals);
  r->offsets = malloc(sizeof(int64_t) * (size_t)o->batch);
  r->scratch = malloc(sizeof(int64_t) * (size_t)(2 * o->batch * o->block));
  r->gen = malloc(sizeof(int64_t) * (size_t)(n_prompt + o->gen_chars));
  if (!r->loss || !r->ms || !r->val_step || !r->val_loss || !r->offsets || !r->scratch || !r->gen)
    fail("out of memory");
  for (int64_t i = 0; i < n_prompt; i++)
    if ((r->gen[r->n_gen++] = r->id_of[(unsigned char)o->prompt[i]]) < 0) {
      fprintf(stderr, "gpt: the prompt's byte 0x%02x is not in the corpus\n", (unsigned char)o->prompt[i]);
      exit(1);
    }
}

int main(int argc, char **argv) {
  static run r; /* zeroed */
  if (!parse(argc, argv, &r.o)) return 2;
  const options *o = &r.o;
  if (o->threads > 0) em_set_num_threads(o->threads);
  r.dev = strcmp(o->device, "cuda") ? EM_CPU : EM_CUDA;
  em_scope_begin();
  if (!load_corpus(&r)) return 1;
  setup(&r);
  printf("gpt: corpus %s: %d files, %lld bytes, %lld distinct (the vocabulary); unigram entropy %.4f nats/char\n",
         o->data, r.n_files, (long long)r.len, (long long)r.vocab, r.entropy);
  printf("gpt: %lld layers, d_model %lld, %lld heads, block %lld, %lld parameters; batch %lld, %lld steps, AdamW lr "
         "%g -> %g (warmup %lld, cosine), %s, %s, %d threads\n",
         (long long)o->n_layer, (long long)o->d_model, (long long)o->n_head, (long long)o->block,
         (long long)gpt_param_count(&r.m), (long long)o->batch, (long long)o->steps, o->lr, o->min_lr,
         (long long)o->warmup, o->device, o->compile ? "whole step em_compile'd" : "eager", em_get_num_threads());
  fflush(stdout);

  train(&r);
  double train_last = 0, val = r.val_loss[r.n_val_done - 1];
  int64_t last = o->steps < 50 ? o->steps : 50;
  for (int64_t i = o->steps - last; i < o->steps; i++) train_last += r.loss[i] / (double)last;
  printf("gpt: trained %lld steps in %.1f s (validation %.1f s more); %.1f ms/step (mean past step 10), %.0f tokens/s; "
         "first step %.0f ms; train loss (mean of the last %lld steps) %.4f, val loss %.4f = %.3f of the unigram "
         "entropy %.4f\n",
         (long long)o->steps, r.train_s, r.val_s, r.step_ms, r.tok_s, r.ms[0], (long long)last, train_last, val,
         val / r.entropy, r.entropy);
  if (r.step_c) print_stats("gpt_step", r.step_c);

  generate(&r);
  char *sample_text = malloc((size_t)r.n_gen + 1);
  if (!sample_text) fail("out of memory");
  for (int64_t i = 0; i < r.n_gen; i++) sample_text[i] = (char)r.byte_of[r.gen[i]];
  sample_text[r.n_gen] = 0;
  printf("gpt: sample (temperature %g, top-k %lld, %lld characters in %.2f s, decoding step %s):\n%s\n",
         o->temperature, (long long)o->top_k, (long long)o->gen_chars, r.gen_s, r.decode_c ? "em_compile'd" : "eager",
         sample_text);
  if (r.decode_c) print_stats("gpt_decode", r.decode_c);
  if (o->json) write_json(&r, sample_text);

  em_compiled_free(r.step_c), em_compiled_free(r.val_c), em_compiled_free(r.decode_c);
  gpt_trainer_free(&r.tr);
  gpt_free(&r.m);
  free(r.text), free(r.ids), free(r.gen), free(r.loss), free(r.ms), free(r.val_step), free(r.val_loss);
  free(r.offsets), free(r.scratch), free(sample_text);
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
