/* bench/peers_ember.c: Ember's side of bench/peers (issue 8): one workload, one mode, one
 * process, the same protocol as bench/peers/peers.py so the driver treats every system alike.
 *
 *   peers_ember --init DIR
 *       writes each workload's initial parameters and inputs (Ember's own init, seed 0) as .npy
 *       files under DIR/<workload>/, with params.txt naming them in order. Every system loads
 *       these: same weights, same data.
 *   peers_ember --workload W --mode eager|compiled --dir DIR [--steps N] [--seconds S] [--warmup K]
 *       loads DIR/W, runs K warm-up calls (default 5: the first compiles, the second SGD step
 *       compiles again for its momentum buffers; the first two losses are the math check), then
 *       timed calls until there are N (default 5) and they took S seconds (default 0), and prints
 *       one JSON object: ms_per_step (median of the timed calls), first_call_ms, warmup_ms (time
 *       to steady state: the K warm-up calls less K medians), steady_after (calls before the
 *       first within twice the median), loss1, loss2, peak_rss_mb, cpu_isa (em_cpu_isa).
 *
 * Workloads: mlp (784-512-512-10 ReLU, batch 128, SGD lr 0.01 momentum 0.9), lenet (LeNet-5 on
 * [128,1,28,28], the same SGD), transformer (bench/compiled's: 2 layers, d_model 256, 4 heads,
 * context 128, batch 16, byte vocabulary; AdamW lr 1e-3, betas 0.9/0.999, eps 1e-8, weight
 * decay 1e-2), softmax and layer_norm over [4096,1024] (the "loss" is the sum of the output),
 * add (one-element add: per-op dispatch overhead). Training steps are forward, backward and the
 * optimizer step, compiled as one function. */
#define _POSIX_C_SOURCE 200809L
#define MODELS_FULL_SIZE
#include "bench.h"
#include "models.h"

#include <errno.h>
#include <math.h>
#include <sys/resource.h>
#include <sys/stat.h>

static void die(const char *what) {
  fprintf(stderr, "peers_ember: %s: %s\n", what, em_last_error() ? em_last_error() : strerror(errno));
  exit(1);
}

/* A workload: its parameters (named, in order), inputs, loss function and optimizer. */
typedef struct workload {
  const char *name;
  net m;
  const char *pname[32];
  em_tensor *in[3];
  int n_in;
  em_model_fn fn;
  em_optimizer *opt;
  int ops_per_call; /* add: times are per op (eager) or per call (compiled) */
} workload;

static em_outputs mlp_loss(void *ctx, em_tensor *const *in, int n) { return EM_OUTPUTS(mlp_fn(ctx, in, n).t[0]); }
static em_outputs lenet_loss(void *ctx, em_tensor *const *in, int n) { return lenet_fn(ctx, in, n); }
static em_outputs transformer_loss(void *ctx, em_tensor *const *in, int n) { return transformer_fn(ctx, in, n); }
static em_outputs softmax_sum(void *ctx, em_tensor *const *in, int n) { return EM_OUTPUTS(em_sum(em_softmax(in[0], 1), 0, NULL, false)); }
static em_outputs layer_norm_sum(void *ctx, em_tensor *const *in, int n) {
  net *m = ctx;
  return EM_OUTPUTS(em_sum(em_layer_norm(in[0], 1, m->ln_w[0], m->ln_b[0], 1e-5), 0, NULL, false));
}
/* add: eager runs 100 dependent adds a step (the per-op figure is a step / 100); compiled runs one
 * add a call (the per-call overhead of a compiled function). */
static int adds_per_step = 100;
static em_outputs adds(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0];
  for (int i = 0; i < adds_per_step; i++) x = em_add(x, in[1]);
  return EM_OUTPUTS(x);
}

static void name_params(workload *w) {
  static char names[32][16];
  const char *ln[] = {"ln0", "ln1", "ln2", "ln3", "ln4", "ln5"};
  int k = 0;
  if (!strcmp(w->name, "transformer")) w->pname[k++] = "tok", w->pname[k++] = "pos";
  if (!strcmp(w->name, "lenet"))
    for (int i = 0; i < 4; i++) snprintf(names[k], 16, "conv%d.%c", i / 2, i % 2 ? 'b' : 'w'), w->pname[k] = names[k], k++;
  int fcs = !strcmp(w->name, "transformer") || !strcmp(w->name, "lenet") || !strcmp(w->name, "mlp");
  int n_fc = !strcmp(w->name, "transformer") ? 4 : 3;
  for (int i = 0; fcs && i < 2 * n_fc; i++) snprintf(names[k], 16, "fc%d.%c", i / 2, i % 2 ? 'b' : 'w'), w->pname[k] = names[k], k++;
  int n_ln = !strcmp(w->name, "transformer") ? 5 : !strcmp(w->name, "layer_norm") ? 1 : 0;
  for (int i = 0; i < 2 * n_ln; i++) snprintf(names[k], 16, "%s.%c", ln[i / 2], i % 2 ? 'b' : 'w'), w->pname[k] = names[k], k++;
  if (k != w->m.n_params) die("parameter names out of step with the model");
}

/* Builds workload name with fresh parameters and inputs (seed 0). */
static bool setup(workload *w, const char *name) {
  memset(w, 0, sizeof *w);
  w->name = name;
  em_manual_seed(0);
  net *m = &w->m;
  if (!strcmp(name, "mlp")) {
    models_mlp(m, 784, 512, 512, 10);
    w->in[0] = em_randn(EM_F32, EM_SHAPE(128, 784)), w->in[1] = em_randint(0, 10, EM_SHAPE(128)), w->n_in = 2;
    w->fn = mlp_loss;
  } else if (!strcmp(name, "lenet")) {
    if (!models_lenet(m)) die("lenet");
    w->in[0] = em_randn(EM_F32, EM_SHAPE(128, 1, 28, 28)), w->in[1] = em_randint(0, 10, EM_SHAPE(128)), w->n_in = 2;
    w->fn = lenet_loss;
  } else if (!strcmp(name, "transformer")) {
    models_transformer(m);
    w->in[0] = em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)), w->in[1] = em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)), w->n_in = 2;
    w->fn = transformer_loss;
  } else if (!strcmp(name, "softmax")) {
    w->in[0] = em_randn(EM_F32, EM_SHAPE(4096, 1024)), w->n_in = 1;
    w->fn = softmax_sum;
  } else if (!strcmp(name, "layer_norm")) {
    m->ln_w[0] = em_add_scalar(em_rand(EM_F32, EM_SHAPE(1024)), 0.5), m->ln_b[0] = em_randn(EM_F32, EM_SHAPE(1024));
    m->params[m->n_params++] = m->ln_w[0], m->params[m->n_params++] = m->ln_b[0];
    w->in[0] = em_randn(EM_F32, EM_SHAPE(4096, 1024)), w->n_in = 1;
    w->fn = layer_norm_sum;
  } else if (!strcmp(name, "add")) {
    w->in[0] = em_randn(EM_F32, EM_SHAPE(1)), w->in[1] = em_randn(EM_F32, EM_SHAPE(1)), w->n_in = 2;
    w->fn = adds, w->ops_per_call = 1;
  } else {
    return false;
  }
  name_params(w);
  for (int i = 0; i < w->n_in; i++)
    if (!w->in[i]) die("inputs");
  return true;
}

static const char *workloads[] = {"mlp", "lenet", "transformer", "softmax", "layer_norm", "add"};

static void path(char *buf, size_t cap, const char *dir, const char *w, const char *file) {
  snprintf(buf, cap, "%s/%s/%s", dir, w, file);
}

static void init_all(const char *dir) {
  char p[1024];
  mkdir(dir, 0755);
  for (size_t k = 0; k < sizeof workloads / sizeof workloads[0]; k++) {
    em_scope_begin();
    workload w;
    setup(&w, workloads[k]);
    snprintf(p, sizeof p, "%s/%s", dir, w.name);
    mkdir(p, 0755);
    path(p, sizeof p, dir, w.name, "params.txt");
    FILE *f = fopen(p, "w");
    if (!f) die(p);
    for (int i = 0; i < w.m.n_params; i++) {
      char file[64];
      snprintf(file, sizeof file, "%s.npy", w.pname[i]);
      path(p, sizeof p, dir, w.name, file);
      if (!em_save_npy(p, w.m.params[i])) die(p);
      fprintf(f, "%s\n", w.pname[i]);
    }
    fclose(f);
    for (int i = 0; i < w.n_in; i++) {
      char file[32];
      snprintf(file, sizeof file, "in%d.npy", i);
      path(p, sizeof p, dir, w.name, file);
      if (!em_save_npy(p, w.in[i])) die(p);
    }
    em_scope_end();
  }
}

/* Replaces the parameters' and inputs' values with those in DIR/W (another system may have
 * written them; normally this process's own init). */
static void load(workload *w, const char *dir) {
  char p[1024];
  em_no_grad_begin();
  for (int i = 0; i < w->m.n_params; i++) {
    char file[64];
    snprintf(file, sizeof file, "%s.npy", w->pname[i]);
    path(p, sizeof p, dir, w->name, file);
    em_tensor *t = em_load_npy(p);
    if (!t || !em_copy_(w->m.params[i], t)) die(p);
  }
  for (int i = 0; i < w->n_in; i++) {
    char file[32];
    snprintf(file, sizeof file, "in%d.npy", i);
    path(p, sizeof p, dir, w->name, file);
    em_tensor *t = em_load_npy(p);
    if (!t || !em_copy_(w->in[i], t)) die(p);
  }
  em_no_grad_end();
}

static em_outputs train_step(void *ctx, em_tensor *const *in, int n) {
  workload *w = ctx;
  em_tensor *loss = w->fn(&w->m, in, n).t[0];
  if (!w->opt) return EM_OUTPUTS(loss);
  em_optimizer_zero_grad(w->opt);
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(w->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

/* One step; returns ms, its loss in *loss. */
static double step(em_compiled *c, workload *w, double *loss) {
  em_scope_begin();
  double t0 = bench_now();
  em_tensor *r = c ? em_call_n(c, w, w->n_in, w->in).t[0] : train_step(w, w->in, w->n_in).t[0];
  if (!r) die("step");
  double v = em_item(r);
  double dt = bench_now() - t0;
  if (loss) *loss = v;
  em_scope_end();
  return 1e3 * dt;
}

int main(int argc, char **argv) {
  const char *dir = NULL, *name = NULL, *mode = "eager";
  int steps = 5, warmup = 5;
  double seconds = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--init") && i + 1 < argc) init_all(argv[++i]), exit(0);
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--workload") && i + 1 < argc) name = argv[++i];
    else if (!strcmp(argv[i], "--mode") && i + 1 < argc) mode = argv[++i];
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) /* cuda: every tensor made on the device */
      em_set_default_device(strcmp(argv[++i], "cuda") ? EM_CPU : EM_CUDA);
    else {
      fprintf(stderr, "usage: %s --init DIR | --workload W --mode eager|compiled --dir DIR [--steps N] [--seconds S] "
                      "[--warmup K] [--device cpu|cuda]\n",
              argv[0]);
      return 2;
    }
  }
  workload w;
  if (!dir || !name || !setup(&w, name)) {
    fprintf(stderr, "peers_ember: --dir and --workload (mlp lenet transformer softmax layer_norm add) are needed\n");
    return 2;
  }
  load(&w, dir);
  if (!strcmp(name, "mlp") || !strcmp(name, "lenet"))
    w.opt = em_sgd_new(w.m.n_params, w.m.params, ((em_sgd_opts){0.01, 0.9, 0, 0, false}));
  else if (!strcmp(name, "transformer"))
    w.opt = em_adamw_new(w.m.n_params, w.m.params, ((em_adamw_opts){1e-3, 0.9, 0.999, 1e-8, 1e-2, false}));
  em_compiled *c = NULL;
  if (!strcmp(mode, "compiled")) c = em_compile(train_step, &(em_compile_options){.name = name}), adds_per_step = 1;
  else if (strcmp(mode, "eager")) return fprintf(stderr, "peers_ember: mode %s: eager or compiled\n", mode), 2;
  /* The first `warmup` calls compile (and compile again: the second SGD step's momentum buffers);
   * then at least `steps` timed calls lasting at least `seconds`. */
  if (warmup < 2) warmup = 2; /* the two losses */
  if (steps < 1) steps = 1;
  double loss1 = NAN, loss2 = NAN, timed = 0;
  int cap = 64, n = 0;
  double *t = malloc(sizeof(double) * (size_t)cap);
  while (n < warmup + steps || timed < 1e3 * seconds) {
    if (n == cap && !(t = realloc(t, sizeof(double) * (size_t)(cap *= 2)))) die("realloc");
    t[n] = step(c, &w, n == 0 ? &loss1 : n == 1 ? &loss2 : NULL);
    if (n >= warmup) timed += t[n];
    n++;
  }
  double first = t[0], head = 0;
  for (int i = 0; i < warmup; i++) head += t[i];
  double *sorted = malloc(sizeof(double) * (size_t)(n - warmup));
  if (!sorted) die("malloc");
  memcpy(sorted, t + warmup, sizeof(double) * (size_t)(n - warmup));
  double ms = bench_median(sorted, n - warmup);
  free(sorted);
  double to_steady = head - warmup * ms; /* time to steady state, less the steps it ran */
  int steady_after = 0;
  while (t[steady_after] > 2 * ms) steady_after++;
  if (w.ops_per_call) ms /= adds_per_step, first /= adds_per_step, to_steady /= adds_per_step;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("{\"system\": \"ember\", \"workload\": \"%s\", \"mode\": \"%s\", \"ms_per_step\": %.6g, \"first_call_ms\": %.6g, "
         "\"warmup_ms\": %.6g, \"steady_after\": %d, \"loss1\": %.9g, \"loss2\": %.9g, \"peak_rss_mb\": %.1f, "
         "\"steps\": %d, \"cpu_isa\": \"%s\"%s}\n",
         name, mode, ms, first, to_steady, steady_after, loss1, loss2, ru.ru_maxrss / 1024.0, n - warmup, em_cpu_isa(),
         w.ops_per_call ? (c ? ", \"per\": \"call\"" : ", \"per\": \"op\"") : "");
  free(t);
  if (c) em_compiled_free(c);
  em_optimizer_free(w.opt);
  return 0;
}
