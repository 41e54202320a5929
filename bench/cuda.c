/* bench/cuda.c: the CUDA runtime's figures: host-device copy bandwidth through em_to (pinned
 * staging), device bandwidth of an eager pointwise op, eager dispatch cost per CUDA op, and the
 * MLP training step (784-512-512-10, batch 128, SGD with momentum) on the device against the CPU
 * in the same run, with the caching allocator's counters over the steps. Medians of repeated
 * runs. Under EMBER_CUDA_EMULATE=1 the "device" is the host emulator and the figures say
 * nothing about a GPU; they are printed with that note. */
#include <ember.h>
#include <math.h>

#include "bench.h"
#include "models.h"

static void check(bool ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "bench/cuda: %s: %s\n", what, em_last_error() ? em_last_error() : "failed");
    exit(1);
  }
}

static double copy_gbps(int64_t n, em_device to, int reps) {
  double t[32];
  em_tensor *src = em_to(em_ones(EM_F32, 1, &n), to == EM_CUDA ? EM_CPU : EM_CUDA);
  check(src != NULL, "making the source");
  for (int r = 0; r < reps; r++) {
    em_scope_begin();
    check(em_cuda_synchronize(), "synchronize");
    double t0 = bench_now();
    check(em_to(src, to) != NULL, "em_to");
    check(em_cuda_synchronize(), "synchronize");
    t[r] = bench_now() - t0;
    em_scope_end();
  }
  return (double)n * 4 / bench_median(t, reps) / 1e9;
}

/* ms per MLP training step on dev (eager), steps timed after 3 warm-up steps. */
static double mlp_step_ms(em_device dev, int steps, em_cuda_memory_stats *stats) {
  em_scope_begin();
  em_manual_seed(0);
  net m = {0};
  models_mlp(&m, 784, 512, 512, 10);
  for (int i = 0; i < m.n_params; i++) m.params[i] = em_requires_grad_(em_detach(em_to(m.params[i], dev)), true);
  for (int i = 0; i < 3; i++) m.fc[i].weight = m.params[2 * i], m.fc[i].bias = m.params[2 * i + 1];
  em_tensor *x = em_to(em_rand(EM_F32, EM_SHAPE(128, 784)), dev), *y = em_to(em_randint(0, 10, EM_SHAPE(128)), dev);
  em_optimizer *o = em_sgd_new(m.n_params, m.params, ((em_sgd_opts){0.01, 0.9, 0, 0, false}));
  check(o && x && y, "setting up the MLP");
  double t[64], t0 = 0;
  for (int s = -3; s < steps; s++) {
    em_scope_begin();
    if (dev == EM_CUDA) check(em_cuda_synchronize(), "synchronize");
    t0 = bench_now();
    em_optimizer_zero_grad(o);
    em_tensor *loss = mlp_fn(&m, (em_tensor *[]){x, y}, 2).t[0];
    check(loss && em_backward(loss, NULL) && em_optimizer_step(o), "a training step");
    check(!isnan(em_item(loss)), "reading the loss"); /* waits for the step, as a training loop does */
    if (s >= 0) t[s] = bench_now() - t0;
    em_scope_end();
  }
  if (stats) *stats = em_cuda_memory_stats_get();
  em_optimizer_free(o);
  em_scope_end();
  return 1e3 * bench_median(t, steps);
}

int main(int argc, char **argv) {
  bench_init("cuda", argc, argv);
  em_scope_begin();
  if (!em_cuda_is_available()) {
    em_to(em_scalar(EM_F32, 0), EM_CUDA);
    printf("bench/cuda: no CUDA device: %s\n", em_last_error());
    return 0;
  }
  em_cuda_device_properties p;
  check(em_cuda_get_device_properties(0, &p), "device properties");
  const char *emu = getenv("EMBER_CUDA_EMULATE");
  const char *note = emu && *emu && strcmp(emu, "0") ? "(emulated on the host: not a GPU figure)" : p.name;
  if (!bench_json) printf("device: %s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor, p.multiprocessors, p.total_memory / 1073741824.0);

  em_cuda_memory_stats st;
  double cpu = mlp_step_ms(EM_CPU, 20, NULL), gpu = mlp_step_ms(EM_CUDA, 20, &st);
  bench_report("mlp_step_cpu", cpu, "ms", "eager, this host");
  bench_report("mlp_step_cuda", gpu, "ms", note);
  bench_report("mlp_cuda_speedup", cpu / gpu, "x", note);
  bench_report("alloc_peak_allocated", st.peak_allocated_bytes / 1048576.0, "MiB", "caching allocator after the MLP steps (process start to here)");
  bench_report("alloc_reserved", st.reserved_bytes / 1048576.0, "MiB", NULL);
  bench_report("alloc_requests", (double)st.allocations, "count", NULL);
  bench_report("alloc_cuMemAlloc_calls", (double)st.device_allocs, "count", NULL);

  for (int64_t mib = 1; mib <= 256; mib *= 16) {
    char name[64];
    int64_t n = mib << 18; /* f32 elements */
    snprintf(name, sizeof name, "h2d_%lldMiB", (long long)mib);
    bench_report(name, copy_gbps(n, EM_CUDA, 10), "GB/s", note);
    snprintf(name, sizeof name, "d2h_%lldMiB", (long long)mib);
    bench_report(name, copy_gbps(n, EM_CPU, 10), "GB/s", note);
  }

  /* device bandwidth: a 16M-element add reads 128 MB and writes 64 MB, timed with events */
  {
    int64_t n = 16 << 20;
    em_tensor *a = em_to(em_ones(EM_F32, 1, &n), EM_CUDA), *b = em_to(em_ones(EM_F32, 1, &n), EM_CUDA);
    double t[20];
    for (int r = 0; r < 20; r++) {
      em_scope_begin();
      em_cuda_event *e0 = em_cuda_event_record();
      check(em_add(a, b) != NULL, "add");
      em_cuda_event *e1 = em_cuda_event_record();
      t[r] = em_cuda_event_elapsed_ms(e0, e1);
      em_cuda_event_free(e0), em_cuda_event_free(e1);
      em_scope_end();
    }
    bench_report("add_f32_16M", 3.0 * n * 4 / (bench_median(t, 20) * 1e-3) / 1e9, "GB/s", note);
    /* dispatch: 1-element adds queued back to back, host time per op */
    em_tensor *s = em_to(em_scalar(EM_F32, 1), EM_CUDA);
    check(em_cuda_synchronize(), "synchronize");
    double t0 = bench_now();
    em_scope_begin();
    for (int i = 0; i < 1000; i++) check(em_add(s, s) != NULL, "add");
    em_scope_end();
    bench_report("add_1_elem_dispatch", (bench_now() - t0) / 1000 * 1e6, "us", note);
  }

  em_scope_end();
  em_thread_cleanup();
  return 0;
}
