/* tests/test_profile.c: the Chrome-trace profiler. The file it writes must parse as JSON (by
 * cJSON), hold the event kinds ember.h lists, and its complete events must nest per thread
 * (each one inside the one enclosing it or after it, never straddling its end). */
#include "common.h"
#include "tmpdir.h"

#include <cjson/cJSON.h>

static em_outputs with_break(void *ctx, em_tensor *const *in, int n) {
  em_tensor *h = em_relu(em_matmul(in[0], in[1]));
  double s = em_item(em_sum(h, EM_AXES(0, 1), false)); /* a graph break */
  return EM_OUTPUTS(em_add_scalar(em_exp(h), s > 0 ? 1 : 0));
}

/* The trace written to trace.json, parsed (the caller deletes it). */
static cJSON *load_trace(void) {
  static char text[1 << 22];
  size_t len = read_file(path_in("trace.json"), (unsigned char *)text, sizeof text - 1);
  text[len] = 0;
  cJSON *root = cJSON_Parse(text);
  cr_assert_not_null(root, "the trace is not JSON");
  return root;
}

static int count(cJSON *events, const char *ph, const char *cat, const char *name) {
  int n = 0;
  cJSON *e;
  cJSON_ArrayForEach(e, events) {
    cJSON *p = cJSON_GetObjectItem(e, "ph"), *c = cJSON_GetObjectItem(e, "cat"), *nm = cJSON_GetObjectItem(e, "name");
    n += !strcmp(p->valuestring, ph) && (!cat || (c && !strcmp(c->valuestring, cat))) &&
         (!name || strstr(nm->valuestring, name));
  }
  return n;
}

ETEST(profile, trace_parses_and_events_nest) {
  CPU_ONLY("the compiled graph's kernels are CPU kernels here");
  make_dir();
  em_profiler_start();
  em_tensor *a = em_randn(EM_F32, EM_SHAPE(16, 32)), *b = em_randn(EM_F32, EM_SHAPE(32, 8));
  em_tensor *c = em_add(a, a);
  em_compiled *f = em_compile(with_break, &(em_compile_options){.name = "with_break"});
  for (int i = 0; i < 2; i++) cr_assert_not_null(em_call(f, NULL, c, b).t[0], "%s", em_last_error());
  em_tensor *a2 = em_randn(EM_F32, EM_SHAPE(4, 32)); /* a new shape: a recompile */
  cr_assert_not_null(em_call(f, NULL, a2, b).t[0], "%s", em_last_error());
  cr_assert(em_profiler_stop(path_in("trace.json")), "%s", em_last_error());
  em_compiled_free(f);
  /* nothing is recorded once stopped */
  em_add(a, a);
  cJSON *root = load_trace(), *events = cJSON_GetObjectItem(root, "traceEvents");
  cr_assert(cJSON_IsArray(events));
  cr_assert_geq(count(events, "M", NULL, "thread_name"), 1);
  cr_assert_geq(count(events, "X", "op", "em_add"), 1, "the eager add");
  cr_assert_eq(count(events, "X", "compiled", "with_break"), 3, "three em_call");
  cr_assert_geq(count(events, "X", "phase", "trace"), 2, "the first call and the recompile traced");
  cr_assert_geq(count(events, "X", "kernel", NULL) + count(events, "X", "gemm", NULL), 1, "compiled work");
  cr_assert_geq(count(events, "i", "graph_break", "em_item"), 1);
  cr_assert_eq(count(events, "i", "recompile", "with_break"), 1);
  /* the eager add carries its operands' shapes */
  bool shapes = false;
  cJSON *e;
  cJSON_ArrayForEach(e, events) {
    cJSON *args = cJSON_GetObjectItem(e, "args"), *d = args ? cJSON_GetObjectItem(args, "detail") : NULL;
    if (d && strstr(d->valuestring, "f32[16,32] f32[16,32]")) shapes = true;
  }
  cr_assert(shapes, "an op's detail names its operands");
  /* nesting, on one thread: a stack of open intervals over the events sorted by start */
  double open_end[256];
  int depth = 0, tid0 = -1, n_x = 0;
  cJSON_ArrayForEach(e, events) {
    if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X")) continue;
    if (tid0 < 0) tid0 = cJSON_GetObjectItem(e, "tid")->valueint;
    n_x++;
  }
  /* events are written in completion order (children first): check nesting on sorted copies */
  int n = 0;
  double (*iv)[2] = malloc(sizeof(double[2]) * (size_t)n_x);
  cJSON_ArrayForEach(e, events) {
    if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") || cJSON_GetObjectItem(e, "tid")->valueint != tid0)
      continue;
    iv[n][0] = cJSON_GetObjectItem(e, "ts")->valuedouble;
    iv[n][1] = iv[n][0] + cJSON_GetObjectItem(e, "dur")->valuedouble;
    n++;
  }
  for (int i = 0; i < n; i++) /* insertion sort by start, longer first on ties */
    for (int j = i; j > 0 && (iv[j][0] < iv[j - 1][0] || (iv[j][0] == iv[j - 1][0] && iv[j][1] > iv[j - 1][1])); j--) {
      double t0 = iv[j][0], t1 = iv[j][1];
      iv[j][0] = iv[j - 1][0], iv[j][1] = iv[j - 1][1], iv[j - 1][0] = t0, iv[j - 1][1] = t1;
    }
  depth = 0;
  int max_depth = 0;
  for (int i = 0; i < n; i++) {
    while (depth && open_end[depth - 1] <= iv[i][0]) depth--;
    if (depth) cr_assert_leq(iv[i][1], open_end[depth - 1] + 1e-3, "event [%g, %g] straddles its parent's end %g",
                             iv[i][0], iv[i][1], open_end[depth - 1]);
    cr_assert_lt(depth, 256);
    open_end[depth++] = iv[i][1];
    if (depth > max_depth) max_depth = depth;
  }
  cr_assert_geq(max_depth, 3, "em_call > trace > op at least");
  free(iv);
  cJSON_Delete(root);
  EXPECT_ERROR((void *)(intptr_t)em_profiler_stop("/nonexistent/dir/t.json"), "cannot write /nonexistent/dir/t.json");
  remove_dir();
}

/* On CUDA, kernels' device times are on their own track: eager kernels under their prim's
 * name, a compiled graph's generated kernels under theirs, each with a duration, after the
 * host-side launch that queued it. */
static em_outputs dev_fn(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_softmax(em_mul(in[0], in[0]), 1));
}

ETEST(profile, cuda_kernels_on_a_device_track) {
  make_dir();
  etest_pick_cuda(); /* the GPU, else the emulator (said loudly) */
  cr_assert(em_cuda_is_available(), "no CUDA device and no emulator");
  em_tensor *a = em_to(em_randn(EM_F32, EM_SHAPE(8, 32)), EM_CUDA);
  em_compiled *f = em_compile(dev_fn, &(em_compile_options){.name = "dev_fn"});
  cr_assert_not_null(em_call(f, NULL, a).t[0], "%s", em_last_error()); /* compiled before profiling */
  em_profiler_start();
  cr_assert_not_null(em_exp(em_add(a, a)), "%s", em_last_error());
  for (int i = 0; i < 2; i++) cr_assert_not_null(em_call(f, NULL, a).t[0], "%s", em_last_error());
  cr_assert(em_profiler_stop(path_in("trace.json")), "%s", em_last_error());
  em_compiled_free(f);
  cJSON *root = load_trace(), *events = cJSON_GetObjectItem(root, "traceEvents");
  cr_assert_geq(count(events, "M", NULL, "thread_name"), 2, "a host thread and the device track");
  cr_assert_geq(count(events, "X", "cuda", "add"), 1, "the eager add's kernel");
  cr_assert_geq(count(events, "X", "cuda", "exp"), 1, "the eager exp's kernel");
  cr_assert_geq(count(events, "X", "cuda", "em_ind_"), 2, "the compiled graph's generated kernel, twice");
  double first_launch = -1, first_device = -1;
  cJSON *e;
  cJSON_ArrayForEach(e, events) {
    cJSON *c = cJSON_GetObjectItem(e, "cat");
    if (!c || strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X")) continue;
    double ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
    cr_assert_geq(cJSON_GetObjectItem(e, "dur")->valuedouble, 0);
    if (!strcmp(c->valuestring, "op") && (first_launch < 0 || ts < first_launch)) first_launch = ts;
    if (!strcmp(c->valuestring, "cuda") && (first_device < 0 || ts < first_device)) first_device = ts;
  }
  cr_assert_geq(first_device, first_launch - 1, "the device ran the first kernel (%g us) before it was queued (%g us)",
                first_device, first_launch);
  cJSON_Delete(root);
  remove_dir();
}
