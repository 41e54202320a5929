/* tests/test_cuda_lt.c: GEMMs through cuBLASLt in compiled CUDA graphs: bias, ReLU and tanh GELU
 * epilogues fused into the GEMM (inductor/schedule.c finds them), what does not match falling
 * back to the GEMM and a generated kernel, and max-autotune timing cuBLASLt's algorithms with
 * the choice cached on disk. Then mixed precision (em_autocast_begin, runtime/autocast.c): the
 * GEMMs in f16 / bf16, torch's f32 list in f32, gradients, compiled graphs and their guard.
 *
 * Without a GPU this runs on the host emulator, whose cuBLASLt (runtime/cuda_emu.c) takes the very
 * calls runtime/cuda.c makes to the library: descriptors, attributes, the heuristic, the matmul;
 * it refuses what the library would (and more: attributes it does not model, misaligned
 * pointers). That the enum values and structs match the library's headers is checked at compile
 * time (runtime/cuda_abi.c); that the library computes what the emulator does needs a GPU. */
#include "common.h"
#include "../runtime/cuda.h"
#include "../inductor/inductor.h"

#include <time.h>
#include <unistd.h>

void fe_log_reload(void); /* frontend/log.c: re-reads EMBER_LOGS */

static void setup(void) {
  etest_pick_cuda();
  cr_assert(em_cuda_is_available(), "no CUDA device and no emulator");
}

TestSuite(cuda_lt, .init = setup);

#define F EM_F32
#define C(x) em_to((x), EM_CUDA)

/* got (CUDA) agrees with want (CUDA) in dtype, shape and values within tol * (1 + |want|). */
static void same(em_tensor *want, em_tensor *got, double tol, const char *what) {
  cr_assert(want && got, "%s: %s", what, em_last_error() ? em_last_error() : "NULL");
  cr_assert_eq(em_device_of(got), EM_CUDA, "%s: result off the device", what);
  cr_assert_eq(em_dtype_of(want), em_dtype_of(got), "%s: dtype", what);
  cr_assert_eq(em_ndim(want), em_ndim(got), "%s: rank", what);
  for (int d = 0; d < em_ndim(want); d++)
    cr_assert_eq(em_size(want, d), em_size(got, d), "%s: size of dim %d", what, d);
  int64_t n = em_numel(want);
  double *a = malloc(sizeof(double) * (size_t)(n + 1)), *b = malloc(sizeof(double) * (size_t)(n + 1));
  cr_assert(em_to_buffer(want, EM_F64, a, sizeof(double) * (size_t)n) &&
                em_to_buffer(got, EM_F64, b, sizeof(double) * (size_t)n),
            "%s: %s", what, em_last_error());
  for (int64_t i = 0; i < n; i++)
    if (!(a[i] == b[i] || fabs(a[i] - b[i]) <= tol * (1 + fabs(a[i])))) {
      double x = a[i], y = b[i];
      free(a), free(b);
      cr_assert_fail("%s: element %lld: eager %.9g, compiled %.9g", what, (long long)i, x, y);
    }
  free(a), free(b);
}

/* ---- the emulated library refuses what cuBLASLt refuses ---- */

ETEST(cuda_lt, abi_checked_against_the_toolkit_headers) {
  cr_assert(cu_lt_abi_checked(),
            "runtime/cuda_abi.c was built without cublasLt.h: cuda.h's cuBLASLt values are unchecked");
}

ETEST(cuda_lt, cudnn_abi_checked_against_the_toolkit_headers) {
  cr_assert(cu_dnn_abi_checked(), "runtime/cuda_abi.c was built without cudnn.h: cuda.h's cuDNN values are unchecked");
}

/* The kernel disk cache keys a cubin on NVRTC's version too (runtime/cuda.c, full_source): a new
 * NVRTC must not load images an older one compiled. */
ETEST(cuda_lt, nvrtc_version_is_in_the_kernel_cache_key) {
  char salt[64], want[64];
  int major, minor;
  cu_nvrtc_cache_salt(salt, sizeof salt);
  if (!cu_nvrtc_available()) {
    cr_assert_not(cu_nvrtc_version(&major, &minor));
    cr_assert_str_eq(salt, "nvrtc cubin (no version)");
    return;
  }
  cr_assert(cu_nvrtc_version(&major, &minor) && major >= 11, "NVRTC %d.%d", major, minor);
  snprintf(want, sizeof want, "nvrtc cubin %d.%d", major, minor);
  cr_assert_str_eq(salt, want);
  if (!cu_drv()->emulated) cr_assert_str_eq(cu_drv()->cache_salt, want, "the driver's cache salt");
}

/* The emulated cuDNN refuses what cuDNN would: descriptors of the wrong kind or not set, shapes
 * that do not make the described convolution, the wrong compute type, too small a workspace. */
ETEST(cuda_lt, emulated_cudnn_checks_its_arguments) {
  if (!cu_drv()->emulated) cr_skip_test("the emulator's own checks (a GPU runs the library)");
  char why[256];
  const cu_dnn_api *D = cu_drv()->dnn(why, sizeof why);
  cr_assert_not_null(D, "%s", why);
  cr_assert_eq(D->version() / 10000, 9);
  void *h, *xd, *yd, *wd, *cd;
  cr_assert_eq(D->create(&h), 0);
  cr_assert_eq(D->tensor_create(&xd) | D->tensor_create(&yd) | D->filter_create(&wd) | D->conv_create(&cd), 0);
  cu_dnn_perf perf[4];
  int n = -1;
  cr_assert_eq(D->fwd_algos(h, xd, wd, cd, yd, 4, &n, perf), CU_DNN_STATUS_BAD_PARAM, "descriptors never set");
  cr_assert_eq(D->tensor_set(xd, CU_DNN_DATA_FLOAT, 1, 4, 5, 5, 100, 25, 5, 1), 0);
  cr_assert_eq(D->tensor_set(yd, CU_DNN_DATA_FLOAT, 1, 6, 3, 3, 54, 9, 3, 1), 0);
  cr_assert_eq(D->filter_set(wd, CU_DNN_DATA_FLOAT, CU_DNN_TENSOR_NCHW, 6, 2, 3, 3), 0);
  cr_assert_eq(D->filter_set(xd, CU_DNN_DATA_FLOAT, CU_DNN_TENSOR_NCHW, 6, 2, 3, 3), CU_DNN_STATUS_BAD_PARAM,
               "a tensor descriptor is no filter descriptor");
  cr_assert_eq(D->conv_set(cd, 0, 0, 1, 1, 1, 1, CU_DNN_CROSS_CORRELATION, CU_DNN_DATA_FLOAT), 0);
  cr_assert_eq(D->fwd_algos(h, xd, wd, cd, yd, 4, &n, perf), CU_DNN_STATUS_BAD_PARAM, "4 channels, 2 a group, 1 group");
  cr_assert_eq(D->conv_groups(cd, 2), 0);
  cr_assert_eq(D->fwd_algos(h, xd, wd, cd, yd, 4, &n, perf), 0);
  cr_assert_eq(n, 2);
  cr_assert(perf[0].memory > 0 && perf[1].memory == 0 && perf[0].status == 0);
  cr_assert_eq(D->fwd_algos(h, yd, wd, cd, xd, 4, &n, perf), CU_DNN_STATUS_BAD_PARAM, "x and y swapped");
  cr_assert_eq(D->conv_set(cd, 0, 0, 1, 1, 1, 1, CU_DNN_CROSS_CORRELATION, CU_DNN_DATA_HALF), 0);
  cr_assert_eq(D->fwd_algos(h, xd, wd, cd, yd, 4, &n, perf), CU_DNN_STATUS_BAD_PARAM, "f32 data computes in f32");
  cr_assert_eq(D->conv_set(cd, 0, 0, 1, 1, 1, 1, 0 /* CUDNN_CONVOLUTION */, CU_DNN_DATA_FLOAT), 0);
  cr_assert_eq(D->fwd_algos(h, xd, wd, cd, yd, 4, &n, perf), CU_DNN_STATUS_NOT_SUPPORTED, "true convolution");
  cr_assert_eq(D->conv_set(cd, 0, 0, 1, 1, 1, 1, CU_DNN_CROSS_CORRELATION, CU_DNN_DATA_FLOAT), 0);
  float x[100] = {0}, y[54], w[108] = {0}, one = 1, zero = 0;
  char ws[8192];
  cr_assert_eq(D->fwd(h, &one, xd, x, wd, w, cd, 1, ws, 16, &zero, yd, y), CU_DNN_STATUS_BAD_PARAM, "small workspace");
  cr_assert_eq(D->fwd(h, &one, xd, x, wd, w, cd, 7, NULL, 0, &zero, yd, y), CU_DNN_STATUS_BAD_PARAM, "no such algo");
  x[0] = 2, w[0] = 3; /* y[0, 0, 0, 0] = x[0, 0, 0, 0] w[0, 0, 0, 0] */
  cr_assert_eq(D->fwd(h, &one, xd, x, wd, w, cd, 1, ws, sizeof ws, &zero, yd, y), 0);
  cr_assert_eq(y[0], 6.0f);
  cr_assert_eq(y[1], 0.0f);
  D->tensor_destroy(xd), D->tensor_destroy(yd), D->filter_destroy(wd), D->conv_destroy(cd);
  free(h);
}

ETEST(cuda_lt, emulated_library_checks_its_arguments) {
  if (!cu_drv()->emulated) cr_skip_test("the emulator's own checks (a GPU runs the library)");
  char why[256];
  const cu_lt_api *L = cu_drv()->lt(why, sizeof why);
  cr_assert_not_null(L, "%s", why);
  void *desc, *la, *lb, *ld, *pref;
  cr_assert_eq(L->desc_create(&desc, CU_COMPUTE_32F, CU_R_32F), 0);
  int32_t t = CU_OP_T;
  int64_t wide = 1;
  cr_assert_eq(L->desc_set(desc, CU_LT_DESC_TRANSA, &t, sizeof t), 0);
  cr_assert_eq(L->desc_set(desc, CU_LT_DESC_TRANSA, &wide, sizeof wide), CU_BLAS_INVALID_VALUE,
               "a value of the wrong size");
  cr_assert_eq(L->desc_set(desc, 99, &t, sizeof t), CU_BLAS_INVALID_VALUE, "an attribute the emulator does not model");
  /* D = A^T B: A stored 3x4 (k x m), B 3x5 (k x n), D 4x5 */
  cr_assert_eq(L->layout_create(&la, CU_R_32F, 3, 4, 3), 0);
  cr_assert_eq(L->layout_create(&lb, CU_R_32F, 3, 5, 3), 0);
  cr_assert_eq(L->layout_create(&ld, CU_R_32F, 4, 5, 4), 0);
  void *bad;
  cr_assert_eq(L->layout_create(&bad, CU_R_32F, 4, 5, 3), CU_BLAS_INVALID_VALUE, "a leading dimension under the rows");
  cr_assert_eq(L->pref_create(&pref), 0);
  cu_lt_heuristic res[8];
  int n = 0;
  cr_assert_eq(L->heuristic(NULL, desc, la, lb, ld, ld, pref, 8, res, &n), 0);
  cr_assert_eq(n, 1, "no workspace allowed: only the algorithm that needs none (got %d)", n);
  uint64_t ws = 1 << 20;
  cr_assert_eq(L->pref_set(pref, CU_LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), 0);
  cr_assert_eq(L->heuristic(NULL, desc, la, lb, ld, ld, pref, 8, res, &n), 0);
  cr_assert_eq(n, 3);
  cr_assert_eq(L->heuristic(NULL, desc, lb, la, ld, ld, pref, 8, res, &n), CU_BLAS_INVALID_VALUE, "A and B swapped");
  uint32_t epi = CU_LT_EPILOGUE_RELU_BIAS;
  cr_assert_eq(L->desc_set(desc, CU_LT_DESC_EPILOGUE, &epi, sizeof epi), 0);
  cr_assert_eq(L->heuristic(NULL, desc, la, lb, ld, ld, pref, 8, res, &n), CU_BLAS_INVALID_VALUE,
               "a bias epilogue, no bias");
  /* a matmul on pointers less aligned than its algorithm was chosen for */
  float *buf = aligned_alloc(256, 4096), one = 1, zero = 0;
  memset(buf, 0, 4096);
  epi = CU_LT_EPILOGUE_DEFAULT;
  cr_assert_eq(L->desc_set(desc, CU_LT_DESC_EPILOGUE, &epi, sizeof epi), 0);
  cr_assert_eq(L->heuristic(NULL, desc, la, lb, ld, ld, pref, 1, res, &n), 0);
  cr_assert_eq(L->matmul(NULL, desc, &one, buf, la, buf + 64, lb, &zero, buf + 128, ld, buf + 128, ld, &res[0].algo,
                         NULL, 0, NULL),
               0);
  cr_assert_eq(L->matmul(NULL, desc, &one, buf + 1, la, buf + 64, lb, &zero, buf + 128, ld, buf + 128, ld, &res[0].algo,
                         NULL, 0, NULL),
               CU_BLAS_INVALID_VALUE, "A 4 bytes past an algorithm's 256-byte alignment");
  free(buf);
  L->desc_destroy(desc), L->layout_destroy(la), L->layout_destroy(lb), L->layout_destroy(ld), L->pref_destroy(pref);
}

/* ---- epilogues in compiled graphs ---- */

static int act_kind; /* 0 bias only, 1 relu, 2 tanh GELU, 3 erf GELU */
static em_outputs linear_act(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *h = em_linear(in[0], in[1], in[2]);
  return EM_OUTPUTS(act_kind == 1   ? em_relu(h)
                    : act_kind == 2 ? em_gelu(h, true)
                    : act_kind == 3 ? em_gelu(h, false)
                                    : h);
}

/* EMBER_LOGS=schedule into a file between log_begin and log_end, which returns it (caller frees). */
static struct {
  char path[32];
  int saved;
} logcap;

static void log_begin(void) {
  snprintf(logcap.path, sizeof logcap.path, "/tmp/ember-lt-log-XXXXXX");
  int fd = mkstemp(logcap.path);
  cr_assert_geq(fd, 0);
  close(fd);
  setenv("EMBER_LOGS", "schedule", 1);
  fe_log_reload();
  fflush(stderr);
  logcap.saved = dup(2);
  cr_assert(freopen(logcap.path, "w", stderr));
}

static char *log_end(void) {
  fflush(stderr);
  dup2(logcap.saved, 2);
  close(logcap.saved);
  unsetenv("EMBER_LOGS");
  fe_log_reload();
  FILE *f = fopen(logcap.path, "r");
  cr_assert_not_null(f);
  char *log = calloc(1 << 16, 1);
  cr_assert_not_null(log);
  size_t len = fread(log, 1, (1 << 16) - 1, f);
  log[len] = 0;
  fclose(f);
  unlink(logcap.path);
  return log;
}

/* Calls fn compiled (mode) twice on in; compares each output with fn run eagerly on the device;
 * returns the schedule log (caller frees). */
static char *compiled_matches_eager(em_outputs (*fn)(void *, em_tensor *const *, int), const char *mode, em_tensor **in,
                                    int n_in, double tol, const char *what) {
  log_begin();
  em_compiled *c = em_compile(fn, &(em_compile_options){.name = "lt", .mode = mode});
  em_outputs got[2];
  for (int call = 0; call < 2; call++) got[call] = em_call_n(c, NULL, n_in, in);
  char *log = log_end();
  em_outputs want = fn(NULL, in, n_in);
  for (int call = 0; call < 2; call++) {
    cr_assert_eq(got[call].n, want.n, "%s: %s", what, em_last_error());
    for (int o = 0; o < want.n; o++) same(want.t[o], got[call].t[o], tol, what);
  }
  em_compiled_free(c);
  return log;
}

/* Linear layers with a bias and ReLU, tanh GELU or nothing after, in f32, f16 and bf16, over 2-D
 * and 3-D inputs (em_linear reshapes those to 2-D around the GEMM): one cuBLASLt call with the
 * epilogue, eager's results within rounding. */
ETEST(cuda_lt, linear_bias_activation_is_one_cublaslt_call) {
  em_manual_seed(31);
  static const char *const names[] = {"bias", "bias+relu", "bias+gelu_tanh"};
  static const int epilogues[] = {CU_LT_EPILOGUE_BIAS, CU_LT_EPILOGUE_RELU_BIAS, CU_LT_EPILOGUE_GELU_BIAS};
  const em_dtype dts[] = {EM_F32, EM_F16, EM_BF16};
  for (int kind = 0; kind < 3; kind++)
    for (int di = 0; di < 3; di++)
      for (int rank = 2; rank <= 3; rank++) {
        if (kind == 2 && dts[di] != EM_F32) continue; /* em_gelu takes f32 and f64 */
        em_scope_begin();
        em_dtype dt = dts[di];
        act_kind = kind;
        em_tensor *x = rank == 2 ? em_randn(F, EM_SHAPE(7, 12)) : em_randn(F, EM_SHAPE(2, 5, 12));
        em_tensor *in[3] = {C(em_cast(x, dt)), C(em_cast(em_mul_scalar(em_randn(F, EM_SHAPE(9, 12)), 0.3), dt)),
                            C(em_cast(em_randn(F, EM_SHAPE(9)), dt))};
        char what[96];
        snprintf(what, sizeof what, "%s, %s, %d-D input", names[kind], em_dtype_name(dt), rank);
        int64_t before = cu_drv()->emulated ? cu_emu_lt_stats_get().matmuls : 0;
        char *log = compiled_matches_eager(linear_act, "default", in, 3,
                                           dt == EM_F32   ? 1e-5
                                           : dt == EM_F16 ? 4e-3
                                                          : 3e-2,
                                           what);
        char want[64];
        snprintf(want, sizeof want, "(cublasLt epilogue %s,", names[kind]);
        cr_assert(strstr(log, want), "%s: the schedule lacks '%s':\n%s", what, want, log);
        cr_assert_null(strstr(log, "kernel over"), "%s: a generated kernel beside the epilogue:\n%s", what, log);
        free(log);
        if (cu_drv()->emulated) {
          cu_emu_lt_stats st = cu_emu_lt_stats_get();
          cr_assert_eq(st.matmuls - before, 2, "%s: %lld cuBLASLt matmuls for two calls", what,
                       (long long)(st.matmuls - before));
          cr_assert_eq(st.last_epilogue, epilogues[kind], "%s: epilogue %d", what, st.last_epilogue);
        }
        em_scope_end();
      }
}

static int fallback_kind;
static em_outputs not_fusable(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *x = in[0], *w = in[1], *b = in[2];
  em_tensor *mm = em_matmul(x, em_transpose(w, 0, 1)), *h = em_add(mm, b);
  switch (fallback_kind) {
  case 0:
    return EM_OUTPUTS(em_relu(h), h); /* the pre-activation is an output too */
  case 1:
    return EM_OUTPUTS(em_gelu(h, false)); /* erf GELU: no cuBLASLt epilogue */
  case 2:
    return EM_OUTPUTS(em_relu(h), em_sum(mm, 0, NULL, false)); /* the product is read elsewhere */
  case 3:
    return EM_OUTPUTS(em_relu(em_add(mm, in[3]))); /* a residual [M, N], not a bias */
  default:
    return EM_OUTPUTS(em_mul(em_relu(h), h)); /* h read beside the relu */
  }
}

/* What does not match falls back to the GEMM and a generated kernel (or to the bias epilogue
 * alone with the activation in a kernel), with eager's results. */
ETEST(cuda_lt, what_does_not_match_falls_back) {
  em_manual_seed(32);
  em_tensor *in[4] = {C(em_randn(F, EM_SHAPE(6, 10))), C(em_randn(F, EM_SHAPE(8, 10))), C(em_randn(F, EM_SHAPE(8))),
                      C(em_randn(F, EM_SHAPE(6, 8)))};
  static const char *const want[] = {"(cublasLt epilogue bias,", "(cublasLt epilogue bias,", NULL, NULL,
                                     "(cublasLt epilogue bias,"};
  static const char *const what[] = {"pre-activation returned", "erf GELU", "product read elsewhere", "residual add",
                                     "pre-activation read twice"};
  for (fallback_kind = 0; fallback_kind < 5; fallback_kind++) {
    em_scope_begin();
    char *log = compiled_matches_eager(not_fusable, "default", in, 4, 1e-5, what[fallback_kind]);
    if (want[fallback_kind])
      cr_assert(strstr(log, want[fallback_kind]), "%s:\n%s", what[fallback_kind], log);
    else
      cr_assert_null(strstr(log, "cublasLt"), "%s: an epilogue matched:\n%s", what[fallback_kind], log);
    cr_assert_null(strstr(log, "bias+"), "%s: an activation was fused:\n%s", what[fallback_kind], log);
    cr_assert(strstr(log, "kernel over"), "%s: the activation is no generated kernel:\n%s", what[fallback_kind], log);
    free(log);
    em_scope_end();
  }
  /* f64: cuBLASLt is not asked */
  act_kind = 1;
  em_tensor *d[3] = {em_cast(in[0], EM_F64), em_cast(in[1], EM_F64), em_cast(in[2], EM_F64)};
  char *log = compiled_matches_eager(linear_act, "default", d, 3, 1e-12, "f64");
  cr_assert_null(strstr(log, "cublasLt"), "f64:\n%s", log);
  free(log);
}

/* A GEMM cuBLASLt does not take (an empty inner dimension: the product is zeros) runs the
 * epilogue's nodes eagerly at run time. */
ETEST(cuda_lt, empty_inner_dimension_runs_the_nodes_eagerly) {
  act_kind = 1;
  em_tensor *in[3] = {C(em_zeros(F, EM_SHAPE(3, 0))), C(em_zeros(F, EM_SHAPE(4, 0))), C(em_randn(F, EM_SHAPE(4)))};
  char *log = compiled_matches_eager(linear_act, "default", in, 3, 0, "k = 0");
  cr_assert(strstr(log, "(cublasLt epilogue bias+relu,"), "%s", log);
  free(log);
}

/* Training through a compiled linear + bias + ReLU / tanh GELU: the loss and every gradient are
 * eager's. The backward needs the pre-activation, so the activation stays a kernel: with ReLU
 * the partitioner saves the pre-activation and the forward's GEMM takes the bias epilogue; with
 * GELU it saves the product itself (the bias add is recomputed in the backward), which leaves
 * the GEMM plain. The backward's GEMMs are plain. */
static em_outputs linear_loss(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *h = em_linear(in[0], in[1], in[2]);
  h = act_kind == 1 ? em_relu(h) : em_gelu(h, true);
  return EM_OUTPUTS(em_mean(em_mul(h, h), 0, NULL, false));
}

ETEST(cuda_lt, backward_through_epilogues) {
  em_manual_seed(33);
  for (act_kind = 1; act_kind <= 2; act_kind++) {
    em_scope_begin();
    em_tensor *x = em_randn(F, EM_SHAPE(2, 6, 16)), *w = em_mul_scalar(em_randn(F, EM_SHAPE(12, 16)), 0.25);
    em_tensor *b = em_randn(F, EM_SHAPE(12));
    em_tensor *p[2][3];
    for (int r = 0; r < 2; r++) {
      p[r][0] = C(x), p[r][1] = C(w), p[r][2] = C(b);
      for (int i = 0; i < 3; i++) em_requires_grad_(p[r][i], true);
    }
    em_compiled *c = em_compile(linear_loss, &(em_compile_options){.name = "linear_loss"});
    log_begin();
    em_outputs got = em_call(c, NULL, p[0][0], p[0][1], p[0][2]);
    bool ok = got.n == 1 && got.t[0] && em_backward(got.t[0], NULL);
    char *log = log_end();
    cr_assert(ok, "%s", em_last_error());
    /* the forward's schedule is logged at the call, the backward's at em_backward */
    const char *head = "[ember:schedule] linear_loss:", *fwd = strstr(log, head),
               *bwd = fwd ? strstr(fwd + 1, head) : NULL;
    cr_assert(fwd && bwd, "two schedules:\n%s", log);
    const char *epi = strstr(fwd, "cublasLt epilogue bias,");
    cr_assert(act_kind == 1 ? epi && epi < bwd : !epi, "the forward's epilogue:\n%s", log);
    cr_assert(!strstr(bwd, "cublasLt") && strstr(bwd, "matmul (library)"), "the backward's GEMMs:\n%s", log);
    free(log);
    em_outputs want = linear_loss(NULL, p[1], 3);
    cr_assert(em_backward(want.t[0], NULL), "%s", em_last_error());
    same(want.t[0], got.t[0], 1e-5, "loss");
    for (int i = 0; i < 3; i++)
      same(em_get_grad(p[1][i]), em_get_grad(p[0][i]), 1e-5, i == 0 ? "x.grad" : i == 1 ? "w.grad" : "b.grad");
    em_compiled_free(c);
    em_scope_end();
  }
}

/* reduce-overhead: the epilogue GEMM is captured into the CUDA graph and replayed. */
ETEST(cuda_lt, epilogues_replay_in_cuda_graphs) {
  em_manual_seed(34);
  act_kind = 1;
  em_tensor *in[3] = {C(em_randn(F, EM_SHAPE(5, 8))), C(em_randn(F, EM_SHAPE(4, 8))), C(em_randn(F, EM_SHAPE(4)))};
  em_outputs want = linear_act(NULL, in, 3);
  em_compiled *c = em_compile(linear_act, &(em_compile_options){.name = "lt_graph", .mode = "reduce-overhead"});
  for (int call = 0; call < 4; call++) {
    em_outputs o = em_call(c, NULL, in[0], in[1], in[2]);
    cr_assert(o.n == 1 && o.t[0], "call %d: %s", call, em_last_error());
    same(want.t[0], o.t[0], 1e-5, "replayed");
  }
  cr_assert_eq(em_compiled_stats(c).cuda_graph_replays, 3);
  em_compiled_free(c);
}

/* ---- max-autotune: cuBLASLt's algorithms timed for each GEMM, the choice cached on disk ---- */

#include <dirent.h>

static em_outputs two_gemms(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *h = em_relu(em_linear(in[0], in[1], in[2])); /* a GEMM with an epilogue */
  return EM_OUTPUTS(em_matmul(h, in[3])); /* and a plain one */
}

/* The autotune cache's GEMM entries of this run (their names end in the salt): how many, and
 * with text (when not NULL) each is overwritten. */
static int gemm_entries(unsigned long long salt, const char *text) {
  char dir[1100], suffix[32], path[1400];
  snprintf(dir, sizeof dir, "%s/cuda", ind_cache_dir());
  snprintf(suffix, sizeof suffix, "-%llx", salt);
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "no %s", dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t len = strlen(e->d_name), sl = strlen(suffix);
    if (strncmp(e->d_name, "tune-gemm_", 10) || len < sl || strcmp(e->d_name + len - sl, suffix)) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, text ? "w" : "r");
    cr_assert_not_null(f);
    char line[256] = "";
    if (text)
      fputs(text, f);
    else
      cr_assert(fgets(line, sizeof line, f) && !strncmp(line, "algo ", 5) && strstr(line, " workspace "), "%s: %s",
                path, line);
    fclose(f);
    n++;
  }
  closedir(d);
  return n;
}

/* The first compile times each GEMM's candidates on its first call (the emulator's heuristic
 * offers three: a warm-up and five timed runs each, then the chosen one) and writes the choice;
 * a second compile takes both choices from the disk cache: no heuristic, no timing. A choice
 * edited on disk is the one that runs. Results are eager's throughout. */
ETEST(cuda_lt, max_autotune_times_gemm_algorithms_and_caches_them) {
  if (!ind_cache_dir()) cr_skip_test("no kernel cache directory (EMBER_CACHE=0): nothing to cache the choices in");
  em_manual_seed(35);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long salt = (unsigned long long)ts.tv_sec * 1000000007ull + (unsigned long long)ts.tv_nsec * 31 +
                            (unsigned long long)getpid();
  ind_autotune_salt(salt);
  em_tensor *in[4] = {C(em_randn(F, EM_SHAPE(6, 10))), C(em_randn(F, EM_SHAPE(8, 10))), C(em_randn(F, EM_SHAPE(8))),
                      C(em_randn(F, EM_SHAPE(8, 5)))};
  em_outputs want = two_gemms(NULL, in, 4);
  bool emu = cu_drv()->emulated;
  /* round 2 edits the cached choices into the emulator's third algorithm, which a real GPU's
   * cuBLASLt does not have (it times the GEMMs again, rightly: found on an H200) */
  for (int round = 0; round < (emu ? 3 : 2); round++) {
    if (round == 2) /* every choice: the emulator's third algorithm, for pointers 4-byte aligned */
      cr_assert_eq(gemm_entries(salt, "algo 2 200 4 4 4 4 0 0 workspace 512\n"), 2);
    ind_autotune_stats s0 = ind_autotune_stats_get();
    cu_emu_lt_stats e0 = emu ? cu_emu_lt_stats_get() : (cu_emu_lt_stats){0};
    em_compiled *c =
        em_compile(two_gemms, &(em_compile_options){.name = "two_gemms", .mode = "max-autotune-no-cudagraphs"});
    for (int call = 0; call < 2; call++) {
      em_outputs o = em_call(c, NULL, in[0], in[1], in[2], in[3]);
      cr_assert(o.n == 1 && o.t[0], "round %d, call %d: %s", round, call, em_last_error());
      same(want.t[0], o.t[0], 1e-5, "autotuned GEMMs");
    }
    em_compiled_free(c);
    ind_autotune_stats s1 = ind_autotune_stats_get();
    int64_t tuned = s1.gemms_tuned - s0.gemms_tuned, cached = s1.gemms_cached - s0.gemms_cached;
    cr_assert_eq(tuned, round == 0 ? 2 : 0, "round %d: %lld GEMMs timed", round, (long long)tuned);
    cr_assert_eq(cached, round == 0 ? 0 : 2, "round %d: %lld choices from the cache", round, (long long)cached);
    if (round == 0) cr_assert_eq(gemm_entries(salt, NULL), 2, "a cache entry per GEMM");
    if (!emu) continue;
    cu_emu_lt_stats e1 = cu_emu_lt_stats_get();
    int64_t runs = e1.matmuls - e0.matmuls, heur = e1.heuristics - e0.heuristics;
    cr_assert_eq(runs, round == 0 ? 2 * (3 * 6 + 1) + 2 : 4, "round %d: %lld cuBLASLt matmuls", round, (long long)runs);
    cr_assert_eq(heur, round == 0 ? 2 : 0, "round %d: %lld heuristic queries", round, (long long)heur);
    if (round == 2) cr_assert_eq(e1.last_algo.data[0], 2, "the algorithm written on disk ran");
  }
  ind_autotune_salt(0);
}

/* ---- autocast (torch.autocast): GEMMs in f16 / bf16, the f32 list in f32 ---- */

#define EXPECT_DT(x, dt)                                                                                               \
  cr_assert((x) && em_dtype_of(x) == (dt), "%s: %s", #x, (x) ? em_dtype_name(em_dtype_of(x)) : em_last_error())

ETEST(cuda_lt, autocast_regions_nest_and_refuse_other_dtypes) {
  cr_assert(!em_is_autocast_enabled());
  cr_assert_eq(em_get_autocast_dtype(), EM_F32);
  cr_assert(!em_autocast_begin(EM_F32));
  cr_assert(strstr(em_last_error(), "em_autocast_begin: autocasts to f16 or bf16, got f32"), "%s", em_last_error());
  em_clear_error();
  cr_assert(em_autocast_begin(EM_BF16) && em_autocast_begin(EM_F16));
  cr_assert(em_is_autocast_enabled());
  cr_assert_eq(em_get_autocast_dtype(), EM_F16);
  em_autocast_end();
  cr_assert_eq(em_get_autocast_dtype(), EM_BF16);
  em_autocast_end();
  cr_assert(!em_is_autocast_enabled());
  em_autocast_end(); /* outside any region: nothing */
  cr_assert(!em_is_autocast_enabled());
}

/* Each op against the same op on explicitly cast operands, outside autocast: bit for bit. */
ETEST(cuda_lt, autocast_follows_torchs_op_lists_on_cuda) {
  em_manual_seed(36);
  em_tensor *x = C(em_randn(F, EM_SHAPE(4, 8))), *w = C(em_randn(F, EM_SHAPE(6, 8))), *b = C(em_randn(F, EM_SHAPE(6)));
  em_tensor *y = C(em_cast(em_mul_scalar(em_rand(F, EM_SHAPE(4)), 5.99), EM_I64));
  em_tensor *img = C(em_randn(F, EM_SHAPE(2, 3, 6, 6))), *k = C(em_randn(F, EM_SHAPE(4, 3, 3, 3))),
            *kb = C(em_randn(F, EM_SHAPE(4)));
  em_tensor *xd = em_cast(x, EM_F64), *wd = em_cast(w, EM_F64);
  em_dtype low[2] = {EM_BF16, EM_F16};
  for (int i = 0; i < 2; i++) {
    em_dtype L = low[i];
    em_tensor *xl = em_cast(x, L), *wl = em_cast(w, L), *bl = em_cast(b, L);
    em_tensor *ref_lin = em_linear(xl, wl, bl), *ref_mm = em_matmul(xl, em_transpose(wl, 0, 1));
    em_tensor *ref_conv = em_conv2d(em_cast(img, L), em_cast(k, L), em_cast(kb, L), EM_CONV2D_DEFAULT);
    em_tensor *ref_ce = em_cross_entropy(em_cast(ref_lin, F), y, EM_CROSS_ENTROPY_DEFAULT);
    cr_assert(em_autocast_begin(L));
    em_tensor *lin = em_linear(x, w, b), *mm = em_matmul(x, em_transpose(w, 0, 1));
    em_tensor *conv = em_conv2d(img, k, kb, EM_CONV2D_DEFAULT);
    em_tensor *sm = em_softmax(lin, 1), *lsm = em_log_softmax(lin, 1), *s = em_sum(lin, 0, NULL, false);
    em_tensor *ln = em_layer_norm(lin, 1, EM_NONE, EM_NONE, 1e-5),
              *ce = em_cross_entropy(lin, y, EM_CROSS_ENTROPY_DEFAULT);
    em_tensor *mixed = em_add(lin, b), *dbl = em_matmul(xd, em_transpose(wd, 0, 1));
    em_autocast_end();
    em_tensor *lows[] = {lin, mm, conv}, *f32s[] = {sm, lsm, s, ln, ce, mixed};
    for (int q = 0; q < 3; q++) EXPECT_DT(lows[q], L);
    for (int q = 0; q < 6; q++) EXPECT_DT(f32s[q], F);
    EXPECT_DT(dbl, EM_F64);
    same(ref_lin, lin, 0, "linear"), same(ref_mm, mm, 0, "matmul"), same(ref_conv, conv, 0, "conv2d");
    same(em_softmax(em_cast(ref_lin, F), 1), sm, 0, "softmax"),
        same(em_log_softmax(em_cast(ref_lin, F), 1), lsm, 0, "log_softmax");
    same(em_sum(em_cast(ref_lin, F), 0, NULL, false), s, 0, "sum");
    same(em_layer_norm(em_cast(ref_lin, F), 1, EM_NONE, EM_NONE, 1e-5), ln, 0, "layer_norm"),
        same(ref_ce, ce, 0, "cross_entropy");
    same(em_linear(x, w, b), em_cast(lin, F), L == EM_BF16 ? 3e-2 : 4e-3, "the low-precision linear near the f32 one");
  }
}

/* f32 parameters get f32 gradients through the casts, as with the casts written out. */
static em_outputs amp_loss(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *logits = em_linear(em_relu(em_linear(in[0], in[1], in[2])), in[3], in[4]);
  return EM_OUTPUTS(em_cross_entropy(logits, in[5], EM_CROSS_ENTROPY_DEFAULT), logits);
}

static em_outputs amp_loss_cast_by_hand(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_dtype L = *(const em_dtype *)ctx;
  em_tensor *h = em_linear(em_cast(in[0], L), em_cast(in[1], L), em_cast(in[2], L));
  em_tensor *logits = em_linear(em_relu(h), em_cast(in[3], L), em_cast(in[4], L));
  return EM_OUTPUTS(em_cross_entropy(em_cast(logits, F), in[5], EM_CROSS_ENTROPY_DEFAULT), logits);
}

static em_tensor **amp_inputs(em_tensor **p, bool grad) {
  em_manual_seed(37);
  p[0] = C(em_randn(F, EM_SHAPE(8, 12)));
  p[1] = C(em_mul_scalar(em_randn(F, EM_SHAPE(16, 12)), 0.3)), p[2] = C(em_randn(F, EM_SHAPE(16)));
  p[3] = C(em_mul_scalar(em_randn(F, EM_SHAPE(5, 16)), 0.3)), p[4] = C(em_randn(F, EM_SHAPE(5)));
  p[5] = C(em_cast(em_mul_scalar(em_rand(F, EM_SHAPE(8)), 4.99), EM_I64));
  for (int i = 1; grad && i < 5; i++) em_requires_grad_(p[i], true);
  return p;
}

ETEST(cuda_lt, autocast_gradients_reach_f32_parameters) {
  em_dtype L = EM_BF16;
  em_tensor *a[6], *h[6];
  amp_inputs(a, true), amp_inputs(h, true);
  cr_assert(em_autocast_begin(L));
  em_outputs got = amp_loss(NULL, a, 6);
  cr_assert(em_backward(got.t[0], NULL), "%s", em_last_error()); /* inside the region, as a training step does */
  em_autocast_end();
  em_outputs want = amp_loss_cast_by_hand(&L, h, 6);
  cr_assert(em_backward(want.t[0], NULL), "%s", em_last_error());
  EXPECT_DT(got.t[0], F);
  EXPECT_DT(got.t[1], L);
  same(want.t[0], got.t[0], 0, "loss");
  for (int i = 1; i < 5; i++) {
    EXPECT_DT(em_get_grad(a[i]), F);
    same(em_get_grad(h[i]), em_get_grad(a[i]), 0, "a parameter's gradient");
  }
}

/* em_compile records the casts (the logits come back in bf16) and guards on the region: a call
 * outside it traces again and gives the f32 results; back inside, the first entry replays. */
ETEST(cuda_lt, autocast_compiles_with_its_casts_and_a_guard) {
  em_dtype L = EM_BF16;
  em_tensor *in[6];
  amp_inputs(in, false);
  em_outputs want_amp = amp_loss_cast_by_hand(&L, in, 6), want_f32 = amp_loss(NULL, in, 6);
  em_compiled *c = em_compile(amp_loss, &(em_compile_options){.name = "amp"});
  log_begin();
  setenv("EMBER_LOGS", "recompiles", 1);
  fe_log_reload();
  em_outputs o[4];
  for (int call = 0; call < 4; call++) {
    bool amp = call != 2;
    if (amp) cr_assert(em_autocast_begin(L));
    o[call] = em_call_n(c, NULL, 6, in);
    if (amp) em_autocast_end();
  }
  char *log = log_end();
  for (int call = 0; call < 4; call++) {
    cr_assert(o[call].n == 2 && o[call].t[0] && o[call].t[1], "call %d: %s", call, em_last_error());
    const em_outputs *want = call == 2 ? &want_f32 : &want_amp;
    EXPECT_DT(o[call].t[1], call == 2 ? F : L);
    same(want->t[0], o[call].t[0], call == 2 ? 1e-5 : 1e-2, "loss");
    same(want->t[1], o[call].t[1], call == 2 ? 1e-5 : 2e-2, "logits");
  }
  cr_assert(strstr(log, "autocast: expected bf16, got off"), "the recompile's reason:\n%s", log);
  free(log);
  cr_assert_eq(em_compiled_stats(c).traces, 2, "%lld traces", (long long)em_compiled_stats(c).traces);
  em_compiled_free(c);
}

/* On the cpu: the f32 list works; the lower-precision ops say why they cannot. */
ETEST(cuda_lt, autocast_on_the_cpu) {
  em_tensor *x = em_randn(F, EM_SHAPE(3, 4)), *w = em_randn(F, EM_SHAPE(2, 4)), *b = em_randn(F, EM_SHAPE(2));
  cr_assert(em_autocast_begin(EM_BF16));
  em_tensor *sm = em_softmax(x, 1), *s = em_sum(em_cast(x, EM_BF16), 0, NULL, false);
  em_tensor *lin = em_linear(x, w, b);
  em_autocast_end();
  EXPECT_DT(sm, F);
  EXPECT_DT(s, F);
  cr_assert_null(lin);
  cr_assert(
      strstr(em_last_error(),
             "em_linear: autocast to bf16: Ember's cpu kernels do not compute in bf16, and f32[3,4] is on the cpu"),
      "%s", em_last_error());
  em_clear_error();
}
