/* examples/fashion_mnist.c: trains an MLP or LeNet-5 on Fashion-MNIST with Ember's eager
 * autograd, the main job of the README.
 *
 *   fashion_mnist [--model mlp|lenet] [--epochs N] [--batch-size B] [--lr LR]
 *                 [--optimizer sgd|adamw] [--momentum M] [--weight-decay WD] [--seed S]
 *                 [--threads T] [--train-limit N] [--data DIR] [--json]
 *                 [--compile] [--backend inductor|aot_eager|eager] [--mode MODE] [--whole-step] [--loss-log FILE]
 *                 [--device cpu|cuda] [--workers N] [--prefetch P]
 *
 * With --compile, the forward pass and loss of each step (and the test-set predictions) run
 * through em_compile(), as with torch.compile applied to a model: with the default backend,
 * inductor, the forward and an ahead-of-time backward run as generated kernels, and the
 * optimizer step stays eager (--backend eager runs the captured graph on the eager kernels,
 * aot_eager adds the ahead-of-time backward). With --whole-step, the whole training step
 * (forward, backward, optimizer update) is one compiled function: one graph, the parameters
 * updated in place. --loss-log writes every step's loss as a hexadecimal float, so two runs can
 * be compared bit for bit. Batches come from an em_loader: --workers threads gather each batch's
 * rows ahead of the step (--prefetch batches in all), for --device cuda into pinned buffers
 * copied to the device on a side stream; --workers 0 gathers them in the step's thread, and
 * --workers -1 uses the index iterator and em_index_select instead (the whole data set on the
 * device for cuda). All give the same batches, so the same losses bit for bit.
 *
 * On a terminal it draws a progress bar (step, loss, steps/s, ETA); otherwise it prints plain
 * lines. After each epoch: test accuracy, epoch time and ms per step; with --json, one JSON
 * object per epoch instead. Inputs are scaled to [0, 1]; the loss is cross entropy. */
#define _POSIX_C_SOURCE 200809L
#include <ember.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  const char *model, *optimizer, *data;
  int epochs, threads, workers, prefetch;
  int64_t batch, train_limit;
  double lr, momentum, weight_decay;
  uint64_t seed;
  bool json, compile, whole_step;
  const char *backend, *loss_log, *device, *mode;
} options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: fashion_mnist [options]\n"
          "  --model mlp|lenet      MLP 784-512-512-10 (ReLU) or LeNet-5 (default mlp)\n"
          "  --epochs N             passes over the training set (default 1)\n"
          "  --batch-size B         examples per step (default 128)\n"
          "  --lr LR                learning rate (default: sgd 0.1 for mlp, 0.05 for lenet; adamw 0.001)\n"
          "  --optimizer sgd|adamw  (default sgd)\n"
          "  --momentum M           SGD momentum (default 0.9)\n"
          "  --weight-decay WD      (default 0 for sgd, 0.01 for adamw)\n"
          "  --seed S               parameter init and shuffling (default 0)\n"
          "  --threads T            CPU threads (default: all cores)\n"
          "  --train-limit N        train on the first N examples only\n"
          "  --data DIR             Fashion-MNIST files (default /usr/share/datasets/fashion-mnist)\n"
          "  --json                 one JSON object per epoch instead of the progress display\n"
          "  --compile              run forward and loss through em_compile()\n"
          "  --backend NAME         em_compile backend: inductor (default), aot_eager or eager\n"
          "  --mode MODE            em_compile mode: default, reduce-overhead (CUDA graphs), max-autotune\n"
          "  --whole-step           with --compile: compile forward, backward and update as one function\n"
          "  --loss-log FILE        write each step's loss as a hex float (bit-exact comparisons)\n"
          "  --device cpu|cuda      where the model, the data and the training run (default cpu)\n"
          "  --workers N            threads assembling batches ahead of the step (default 2); 0: in the\n"
          "                         step's thread; -1: no loader (index iterator + em_index_select)\n"
          "  --prefetch P           batches assembled ahead, in all (default 2 per worker)\n"
          "  --help                 this text\n");
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n), reordering v. */
static double median(double *v, int64_t n) {
  if (n == 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static bool parse(int argc, char **argv, options *o) {
  *o = (options){"mlp", "sgd", NULL, 1, 0, 2, 0, 128, 0, NAN, 0.9, NAN, 0, false, false, false, "inductor", NULL, "cpu"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    } else if (!strcmp(a, "--json")) {
      o->json = true;
      continue;
    } else if (!strcmp(a, "--compile")) {
      o->compile = true;
      continue;
    } else if (!strcmp(a, "--whole-step")) {
      o->whole_step = true;
      continue;
    }
    if (!v) {
      fprintf(stderr, "fashion_mnist: %s needs a value\n", a);
      return false;
    }
    i++;
    if (!strcmp(a, "--model")) o->model = v;
    else if (!strcmp(a, "--optimizer")) o->optimizer = v;
    else if (!strcmp(a, "--data")) o->data = v;
    else if (!strcmp(a, "--epochs")) o->epochs = atoi(v);
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--batch-size")) o->batch = atoll(v);
    else if (!strcmp(a, "--train-limit")) o->train_limit = atoll(v);
    else if (!strcmp(a, "--lr")) o->lr = atof(v);
    else if (!strcmp(a, "--momentum")) o->momentum = atof(v);
    else if (!strcmp(a, "--weight-decay")) o->weight_decay = atof(v);
    else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--backend")) o->backend = v;
    else if (!strcmp(a, "--mode")) o->mode = v;
    else if (!strcmp(a, "--loss-log")) o->loss_log = v;
    else if (!strcmp(a, "--device")) o->device = v;
    else if (!strcmp(a, "--workers")) o->workers = atoi(v);
    else if (!strcmp(a, "--prefetch")) o->prefetch = atoi(v);
    else {
      fprintf(stderr, "fashion_mnist: unknown option %s\n", a);
      usage(stderr);
      return false;
    }
  }
  bool adamw = !strcmp(o->optimizer, "adamw");
  if (isnan(o->lr)) o->lr = adamw ? 1e-3 : !strcmp(o->model, "lenet") ? 0.05 : 0.1;
  if (isnan(o->weight_decay)) o->weight_decay = adamw ? 1e-2 : 0;
  if ((strcmp(o->model, "mlp") && strcmp(o->model, "lenet")) || (strcmp(o->optimizer, "sgd") && !adamw) ||
      o->epochs < 1 || o->batch < 1 || (strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))) {
    fprintf(stderr, "fashion_mnist: bad option value\n");
    usage(stderr);
    return false;
  }
  return true;
}

/* ---- models ---- */

typedef struct {
  bool lenet;
  em_linear_layer fc[3];
  em_conv2d_layer conv[2];
  em_tensor *params[10];
  int n_params;
} model;

static bool model_init(model *m, bool lenet, em_device dev) {
  memset(m, 0, sizeof *m);
  m->lenet = lenet;
  bool ok = true;
  if (!lenet) {
    ok = em_linear_layer_init(&m->fc[0], 784, 512, true) && em_linear_layer_init(&m->fc[1], 512, 512, true) &&
         em_linear_layer_init(&m->fc[2], 512, 10, true);
  } else {
    em_conv2d_params pad2 = EM_CONV2D_DEFAULT;
    pad2.padding[0] = pad2.padding[1] = 2;
    ok = em_conv2d_layer_init(&m->conv[0], 1, 6, 5, 5, pad2, true) &&
         em_conv2d_layer_init(&m->conv[1], 6, 16, 5, 5, EM_CONV2D_DEFAULT, true) &&
         em_linear_layer_init(&m->fc[0], 400, 120, true) && em_linear_layer_init(&m->fc[1], 120, 84, true) &&
         em_linear_layer_init(&m->fc[2], 84, 10, true);
    for (int i = 0; ok && i < 2; i++) m->params[m->n_params++] = m->conv[i].weight, m->params[m->n_params++] = m->conv[i].bias;
  }
  for (int i = 0; ok && i < 3; i++) m->params[m->n_params++] = m->fc[i].weight, m->params[m->n_params++] = m->fc[i].bias;
  /* initialised on the CPU (the same numbers on every device), then moved: new leaves */
  em_tensor **slots[10];
  int k = 0;
  for (int i = 0; lenet && i < 2; i++) slots[k++] = &m->conv[i].weight, slots[k++] = &m->conv[i].bias;
  for (int i = 0; i < 3; i++) slots[k++] = &m->fc[i].weight, slots[k++] = &m->fc[i].bias;
  for (int i = 0; ok && dev != EM_CPU && i < k; i++) {
    em_tensor *p = em_requires_grad_(em_detach(em_to(*slots[i], dev)), true);
    ok = p != NULL;
    *slots[i] = m->params[i] = p;
  }
  return ok;
}

/* x: f32 [B, 784] -> logits [B, 10] */
static em_tensor *forward(model *m, em_tensor *x) {
  if (!m->lenet) {
    em_tensor *h = em_relu(em_linear(x, m->fc[0].weight, m->fc[0].bias));
    h = em_relu(em_linear(h, m->fc[1].weight, m->fc[1].bias));
    return em_linear(h, m->fc[2].weight, m->fc[2].bias);
  }
  em_tensor *h = em_reshape(x, EM_SHAPE(-1, 1, 28, 28));
  h = em_max_pool2d(em_relu(em_conv2d(h, m->conv[0].weight, m->conv[0].bias, m->conv[0].params)), 2, 2, 2, 2, 0, 0);
  h = em_max_pool2d(em_relu(em_conv2d(h, m->conv[1].weight, m->conv[1].bias, m->conv[1].params)), 2, 2, 2, 2, 0, 0);
  h = em_reshape(h, EM_SHAPE(-1, 400));
  h = em_relu(em_linear(h, m->fc[0].weight, m->fc[0].bias));
  h = em_relu(em_linear(h, m->fc[1].weight, m->fc[1].bias));
  return em_linear(h, m->fc[2].weight, m->fc[2].bias);
}

/* The model functions em_compile captures: (x, y) -> loss, and x -> predicted classes. */
static em_outputs loss_fn(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_cross_entropy(forward(ctx, in[0]), in[1], EM_CROSS_ENTROPY_DEFAULT));
}
typedef struct step_ctx {
  model *m;
  em_optimizer *opt;
} step_ctx;

/* A whole training step: loss, backward, update. */
static em_outputs step_fn(void *ctx, em_tensor *const *in, int n) {
  step_ctx *s = ctx;
  em_tensor *loss = loss_fn(s->m, in, n).t[0];
  em_optimizer_zero_grad(s->opt);
  if (!em_backward(loss, NULL) || !em_optimizer_step(s->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

static em_outputs predict_fn(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_argmax(forward(ctx, in[0]), 1, false));
}

static double accuracy(model *m, em_compiled *predict, em_tensor *images, em_tensor *labels) {
  int64_t n = em_size(images, 0), correct = 0;
  em_no_grad_begin();
  for (int64_t s = 0; s < n; s += 1000) {
    em_scope_begin();
    int64_t e = s + 1000 < n ? s + 1000 : n;
    em_tensor *x = em_slice(images, 0, s, e, 1);
    em_tensor *pred = predict ? em_call(predict, m, x).t[0] : predict_fn(m, &x, 1).t[0];
    correct += (int64_t)em_item(em_sum(em_eq(pred, em_slice(labels, 0, s, e, 1)), 0, NULL, false));
    em_scope_end();
  }
  em_no_grad_end();
  return (double)correct / (double)n;
}

static void fail(const char *what) {
  fprintf(stderr, "fashion_mnist: %s: %s\n", what, em_last_error() ? em_last_error() : "failed");
  exit(1);
}

int main(int argc, char **argv) {
  options o;
  if (!parse(argc, argv, &o)) return 2;
  if (o.threads > 0) em_set_num_threads(o.threads);
  bool tty = !o.json && isatty(STDOUT_FILENO);
  em_scope_begin();

  em_fashion_mnist d;
  if (!em_fashion_mnist_load(&d, o.data)) fail("loading the data");
  /* u8 [N, 28, 28] -> f32 [N, 784] in [0, 1]; labels -> i64 */
  em_tensor *train_x = em_div_scalar(em_cast(em_reshape(d.train_images, EM_SHAPE(-1, 784)), EM_F32), 255.0);
  em_tensor *train_y = em_cast(d.train_labels, EM_I64);
  em_tensor *test_x = em_div_scalar(em_cast(em_reshape(d.test_images, EM_SHAPE(-1, 784)), EM_F32), 255.0);
  em_tensor *test_y = em_cast(d.test_labels, EM_I64);
  if (!train_x || !train_y || !test_x || !test_y) fail("preparing the data");
  em_device dev = strcmp(o.device, "cuda") ? EM_CPU : EM_CUDA;
  bool loader = o.workers >= 0;
  if (dev == EM_CUDA) { /* the test set lives on the device; the training set too without a loader: a step moves
                         * only its indices; with one, the loader copies each batch */
    if (!loader) train_x = em_to(train_x, dev), train_y = em_to(train_y, dev);
    test_x = em_to(test_x, dev), test_y = em_to(test_y, dev);
    if (!train_x || !train_y || !test_x || !test_y) fail("moving the data to the device");
  }
  if (o.train_limit > 0 && o.train_limit < em_size(train_x, 0)) {
    train_x = em_slice(train_x, 0, 0, o.train_limit, 1);
    train_y = em_slice(train_y, 0, 0, o.train_limit, 1);
  }
  int64_t n_train = em_size(train_x, 0);

  em_manual_seed(o.seed);
  model m;
  if (!model_init(&m, !strcmp(o.model, "lenet"), dev)) fail("initialising the model");
  em_optimizer *opt = !strcmp(o.optimizer, "sgd")
                          ? em_sgd_new(m.n_params, m.params, ((em_sgd_opts){o.lr, o.momentum, 0, o.weight_decay, false}))
                          : em_adamw_new(m.n_params, m.params, ((em_adamw_opts){o.lr, 0.9, 0.999, 1e-8, o.weight_decay, false}));
  if (!opt) fail("creating the optimizer");
  em_compiled *step_c = NULL, *predict_c = NULL;
  if (o.compile) {
    step_c = o.whole_step ? em_compile(step_fn, &(em_compile_options){.backend = o.backend, .name = "step_fn", .mode = o.mode})
                          : em_compile(loss_fn, &(em_compile_options){.backend = o.backend, .name = "loss_fn", .mode = o.mode});
    predict_c = em_compile(predict_fn, &(em_compile_options){.backend = o.backend, .name = "predict_fn", .mode = o.mode});
    if (!step_c || !predict_c) fail("em_compile");
  }
  step_ctx sc = {&m, opt};
  FILE *loss_log = o.loss_log ? fopen(o.loss_log, "w") : NULL;
  if (o.loss_log && !loss_log) {
    fprintf(stderr, "fashion_mnist: cannot write %s\n", o.loss_log);
    return 1;
  }
  em_batch_iter *it = loader ? NULL : em_batch_iter_new(n_train, o.batch, true, o.seed, false);
  em_loader *ld = !loader ? NULL
                          : em_loader_new(2, ((em_tensor *[]){train_x, train_y}),
                                          &((em_loader_opts){.batch_size = o.batch, .shuffle = true, .seed = o.seed,
                                                             .workers = o.workers, .prefetch = o.prefetch,
                                                             .device = dev}));
  if (!it && !ld) fail("creating the batch iterator");
  int64_t steps = loader ? em_loader_len(ld) : em_batch_iter_len(it);
  if (!o.json)
    printf("fashion_mnist: %s, %s lr %g, batch %lld, %lld training examples, %s, %d threads, %s%s%s\n", o.model, o.optimizer,
           o.lr, (long long)o.batch, (long long)n_train, o.device, em_get_num_threads(),
           !loader ? "index iterator" : o.workers ? "loader" : "loader without workers",
           o.compile ? ", em_compile backend " : "", o.compile ? o.backend : "");
  em_debug_reset_peak();
  if (dev == EM_CUDA) em_cuda_reset_peak_memory_stats(); /* the statistics below are the training's, not the data's */

  /* per step: the whole step, and the part spent getting its batch */
  double *step_ms = malloc(sizeof(double) * (size_t)(steps + 1)), *batch_ms = malloc(sizeof(double) * (size_t)(steps + 1));
  if (!step_ms || !batch_ms) fail("out of memory");
  for (int epoch = 1; epoch <= o.epochs; epoch++) {
    double t0 = now(), loss_sum = 0;
    int64_t step = 0;
    for (;;) {
      double ts = now();
      em_scope_begin();
      em_tensor *x, *y;
      if (loader) {
        em_tensor **b = em_loader_next(ld);
        if (!b && em_last_error()) fail("loading a batch");
        if (!b) {
          em_scope_end();
          break;
        }
        x = b[0], y = b[1];
      } else {
        em_tensor *idx = em_batch_iter_next(it);
        if (!idx) {
          em_scope_end();
          break;
        }
        if (dev != EM_CPU && !(idx = em_to(idx, dev))) fail("moving a batch's indices");
        x = em_index_select(train_x, 0, idx), y = em_index_select(train_y, 0, idx);
      }
      double tb = now();
      em_tensor *loss;
      if (o.whole_step && step_c) {
        if (!(loss = em_call(step_c, &sc, x, y).t[0])) fail("training step");
      } else {
        loss = step_c ? em_call(step_c, &m, x, y).t[0] : loss_fn(&m, (em_tensor *[]){x, y}, 2).t[0];
        em_optimizer_zero_grad(opt);
        if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(opt)) fail("training step");
      }
      double l = em_item(loss);
      if (loss_log) fprintf(loss_log, "%a\n", l);
      em_scope_end();
      batch_ms[step] = 1e3 * (tb - ts), step_ms[step] = 1e3 * (now() - ts);
      loss_sum += l;
      step++;
      double el = now() - t0, rate = step / el;
      if (tty && (step % 5 == 0 || step == steps)) {
        int width = 30, done = (int)(width * step / steps);
        printf("\repoch %d [%.*s%*s] %lld/%lld loss %.4f %.0f steps/s ETA %.0fs ", epoch, done,
               "##############################", width - done, "", (long long)step, (long long)steps, l, rate,
               (steps - step) / rate);
        fflush(stdout);
      } else if (!tty && !o.json && (step % 100 == 0 || step == steps)) {
        printf("epoch %d step %lld/%lld loss %.4f %.0f steps/s\n", epoch, (long long)step, (long long)steps, l, rate);
        fflush(stdout);
      }
    }
    double epoch_s = now() - t0;
    double acc = accuracy(&m, predict_c, test_x, test_y);
    double train_loss = loss_sum / (double)(step ? step : 1), ms = 1e3 * epoch_s / (double)(step ? step : 1);
    double med = median(step_ms, step), batch_med = median(batch_ms, step);
    if (o.json) {
      printf("{\"epoch\": %d, \"train_loss\": %.6f, \"test_accuracy\": %.4f, \"epoch_s\": %.3f, \"ms_per_step\": %.3f, "
             "\"ms_per_step_median\": %.3f, \"batch_ms_median\": %.3f}\n",
             epoch, train_loss, acc, epoch_s, ms, med, batch_med);
    } else {
      if (tty) printf("\n");
      printf("epoch %d: train loss %.4f, test accuracy %.2f%%, %.1f s, %.2f ms/step (median %.2f, of which getting "
             "the batch %.3f)\n",
             epoch, train_loss, 100 * acc, epoch_s, ms, med, batch_med);
    }
    fflush(stdout);
  }
  if (!o.json && dev == EM_CPU) printf("peak live tensor memory: %.1f MiB\n", (double)em_debug_peak_bytes() / (1 << 20));
  if (!o.json && dev == EM_CUDA) {
    em_cuda_memory_stats s = em_cuda_memory_stats_get();
    printf("CUDA caching allocator: %.1f MiB allocated now, training peak %.1f MiB allocated, %.1f MiB reserved (peak "
           "%.1f), %lld allocations served by %lld cuMemAlloc calls since start\n",
           s.allocated_bytes / 1048576.0, s.peak_allocated_bytes / 1048576.0, s.reserved_bytes / 1048576.0,
           s.peak_reserved_bytes / 1048576.0, (long long)s.allocations, (long long)s.device_allocs);
  }
  if (step_c && !o.json) {
    em_compile_stats s = em_compiled_stats(step_c);
    printf("em_compile(%s): %lld calls, %lld traced, %lld replayed, %lld entries, %lld graphs compiled, %lld graph breaks",
           o.whole_step ? "step_fn" : "loss_fn", (long long)s.calls, (long long)s.traces, (long long)s.replays,
           (long long)s.entries, (long long)s.graphs_compiled, (long long)s.breaks);
    if (s.aot_graphs) printf(", %lld bytes saved for the backward per step", (long long)s.aot_saved_bytes);
    printf("\n");
  }
  if (loss_log) fclose(loss_log);
  em_compiled_free(step_c);
  em_compiled_free(predict_c);
  em_batch_iter_free(it);
  em_loader_free(ld);
  free(step_ms), free(batch_ms);
  em_optimizer_free(opt);
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
