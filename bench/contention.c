/* bench/contention.c: how Ember's parallel loops hold up on a machine other processes keep busy
 * (issue 23, "threads that survive a busy machine").
 *
 * Workloads: the compiled MLP training step of bench/compiled.c (784-512-512-10, batch 128,
 * cross entropy, SGD with momentum 0.9; forward, backward and update compiled as one function),
 * an eager softmax over [4096, 1024] rows, and the compiled LeNet-5 training step of
 * bench/compiled.c (batch 128, the same SGD), whose convolutions go to oneDNN. Each runs alone,
 * then beside 1 and then 2 busy processes: children this program forks that spin on the CPU
 * until it kills them. A thread
 * runtime whose idle threads spin at barriers loses badly here, since the thread it waits for
 * may sit behind a busy process for a whole scheduler time slice.
 *
 * Rounds (--rounds R, default 5) repeat the three conditions in an order that rotates from round
 * to round, so a neighbour's build on a shared machine does not land on one condition only.
 * Each condition times --steps S steps (default 20) after one untimed step. Figures per workload
 * and condition: the median ms of every timed step of every round, the lowest and highest of
 * the per-round medians, and the slowdown (median against the median alone).
 *
 * When `python3 -c 'import torch'` works, PyTorch eager's MLP step (bench/contention_torch.py,
 * the same math, torch.set_num_threads(em_get_num_threads())) runs in each condition of each
 * round too (unless --no-torch); otherwise the output says it was left out. --json: one JSON
 * object per figure. */
#define _POSIX_C_SOURCE 200809L /* kill */
#include "bench.h"
#include "models.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_ROUNDS = 64, MAX_STEPS = 200, CONDITIONS = 3 };

static void fail(const char *what) {
  fprintf(stderr, "bench contention: %s: %s\n", what, em_last_error() ? em_last_error() : "?");
  exit(1);
}

/* ---- the busy neighbours -------------------------------------------------------------------- */

/* A child that spins until killed. It touches nothing of Ember's: after fork only this thread
 * exists in it, and a loop on a volatile counter needs nothing else. */
static pid_t start_busy(void) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    for (volatile unsigned long i = 0;; i++) {
    }
  }
  if (pid < 0) fail("fork");
  return pid;
}

static void stop_busy(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* ---- workloads ------------------------------------------------------------------------------ */

/* A model's compiled training step and what it runs on. */
typedef struct {
  em_compiled *c;
  model_step_ctx s;
  em_tensor *in[2];
} model;

typedef struct {
  model mlp, lenet;
  em_tensor *x;
} workloads;

static double step_once(model *m) {
  em_scope_begin();
  double t0 = bench_now();
  if (!em_call_n(m->c, &m->s, 2, m->in).t[0]) fail("compiled training step");
  double dt = bench_now() - t0;
  em_scope_end();
  return 1e3 * dt;
}

static double mlp_once(workloads *w) { return step_once(&w->mlp); }
static double lenet_once(workloads *w) { return step_once(&w->lenet); }

/* Parameters in m's net, SGD, the step compiled and run once (optimizer state exists, as in
 * every step but the first). */
static void model_init(model *m, const char *name, em_model_fn loss_fn, net *params, em_tensor *x, em_tensor *y) {
  em_sgd_opts sgd = {0.01, 0.9, 0, 0, false};
  m->s = (model_step_ctx){loss_fn, params, em_sgd_new(params->n_params, params->params, sgd)};
  m->in[0] = x, m->in[1] = y;
  if (!m->s.opt || !x || !y) fail("setup");
  m->c = em_compile(model_train_step, &(em_compile_options){.backend = "inductor", .name = name});
  if (!m->c) fail("em_compile");
  model_train_step(&m->s, m->in, 2);
}

static void model_free(model *m) {
  em_compiled_free(m->c);
  em_optimizer_free(m->s.opt);
}

static double softmax_once(workloads *w) {
  em_scope_begin();
  em_no_grad_begin();
  double t0 = bench_now();
  if (!em_softmax(w->x, 1)) fail("softmax");
  double dt = bench_now() - t0;
  em_no_grad_end();
  em_scope_end();
  return 1e3 * dt;
}

/* ---- PyTorch, when installed ---------------------------------------------------------------- */

static bool have_torch(void) { return system("python3 -c 'import torch' >/dev/null 2>&1") == 0; }

/* The torch script: beside this program's source, else under the current directory (a copy of
 * the tree run elsewhere). */
static const char *torch_script(void) {
  static const char *in_source = BENCH_SOURCE_DIR "/contention_torch.py";
  return access(in_source, R_OK) == 0 ? in_source : "bench/contention_torch.py";
}

/* Runs the torch script for `steps` timed steps (in the condition the caller set up): every
 * step's ms into t, or false. */
static bool torch_steps(int steps, double *t) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "python3 '%s' --steps %d --threads %d", torch_script(), steps, em_get_num_threads());
  FILE *f = popen(cmd, "r");
  if (!f) return false;
  int got = 0;
  while (got < steps && fscanf(f, "%lf", &t[got]) == 1) got++;
  return pclose(f) == 0 && got == steps;
}

/* ---- the run -------------------------------------------------------------------------------- */

typedef struct {
  const char *name;
  double (*once)(workloads *);
  bool torch;
  double t[CONDITIONS][MAX_ROUNDS * MAX_STEPS];
  double round_median[CONDITIONS][MAX_ROUNDS];
} series;

static const char *cond_name[CONDITIONS] = {"alone", "busy1", "busy2"};

static void report(const series *s, int rounds, int steps) {
  char key[96], note[160];
  double alone = 0;
  for (int c = 0; c < CONDITIONS; c++) {
    double all[MAX_ROUNDS * MAX_STEPS], rm[MAX_ROUNDS];
    memcpy(all, s->t[c], sizeof(double) * (size_t)(rounds * steps));
    memcpy(rm, s->round_median[c], sizeof(double) * (size_t)rounds);
    double med = bench_median(all, rounds * steps);
    bench_median(rm, rounds); /* sorts */
    if (c == 0) alone = med;
    snprintf(key, sizeof key, "%s_%s_ms", s->name, cond_name[c]);
    snprintf(note, sizeof note, "median of %d steps; round medians %.2f-%.2f", rounds * steps, rm[0], rm[rounds - 1]);
    bench_report(key, med, "ms", note);
    if (c) {
      snprintf(key, sizeof key, "%s_%s_slowdown", s->name, cond_name[c]);
      snprintf(note, sizeof note, "%s median / alone median", cond_name[c]);
      bench_report(key, med / alone, "x", note);
    }
  }
}

int main(int argc, char **argv) {
  bench_init("contention", argc, argv);
  int rounds = 5, steps = 20;
  for (int i = 1; i + 1 < argc; i++) {
    if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
  }
  if (rounds < 1 || rounds > MAX_ROUNDS || steps < 1 || steps > MAX_STEPS) {
    fprintf(stderr, "bench contention: --rounds 1..%d, --steps 1..%d\n", MAX_ROUNDS, MAX_STEPS);
    return 2;
  }
  bool torch = true;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--no-torch")) torch = false;
  torch = torch && have_torch();
  if (!bench_json)
    printf("threads %d; %s\n", em_get_num_threads(),
           torch ? "PyTorch eager's MLP step runs beside Ember's"
                 : "PyTorch left out (--no-torch, or python3 -c 'import torch' failed)");

  em_scope_begin();
  em_manual_seed(0);
  net mlp = {0}, lenet = {0};
  models_mlp(&mlp, 784, 512, 512, 10);
  if (!models_lenet(&lenet)) fail("lenet");
  workloads w = {.x = em_randn(EM_F32, EM_SHAPE(4096, 1024))};
  if (!w.x) fail("setup");
  model_init(&w.mlp, "mlp", mlp_fn, &mlp, em_rand(EM_F32, EM_SHAPE(128, 784)), em_randint(0, 10, EM_SHAPE(128)));
  model_init(&w.lenet, "lenet", lenet_fn, &lenet, em_rand(EM_F32, EM_SHAPE(128, 1, 28, 28)),
             em_randint(0, 10, EM_SHAPE(128)));

  static series s[4] = {{"mlp_compiled", mlp_once, false},
                        {"softmax_eager", softmax_once, false},
                        {"lenet_compiled", lenet_once, false},
                        {"mlp_torch_eager", NULL, true}};
  int n_series = torch ? 4 : 3;
  for (int i = 0; i < 3; i++) softmax_once(&w); /* eager softmax's fused kernel: compiled before any timing */
  em_eager_fusion_wait();
  for (int r = 0; r < rounds; r++)
    for (int k = 0; k < CONDITIONS; k++) {
      int c = (r + k) % CONDITIONS;
      pid_t busy[2];
      for (int b = 0; b < c; b++) busy[b] = start_busy();
      for (int q = 0; q < n_series; q++) {
        double *t = s[q].t[c] + r * steps;
        if (s[q].torch) {
          if (!torch_steps(steps, t)) fail("PyTorch's MLP step (bench/contention_torch.py)");
        } else {
          s[q].once(&w); /* untimed: caches warm in this condition */
          for (int i = 0; i < steps; i++) t[i] = s[q].once(&w);
        }
        double tmp[MAX_STEPS];
        memcpy(tmp, t, sizeof(double) * (size_t)steps);
        s[q].round_median[c][r] = bench_median(tmp, steps);
      }
      for (int b = 0; b < c; b++) stop_busy(busy[b]);
    }
  for (int q = 0; q < n_series; q++) report(&s[q], rounds, steps);
  model_free(&w.mlp);
  model_free(&w.lenet);
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
