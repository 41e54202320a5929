/* tests/test_cuda_diff.c: compiled-vs-eager differential tests on CUDA (issue 19). Every prim
 * (a table of public ops, checked to reach every entry of prims/prims.def), every composite of
 * the public header, LeNet-5 and a small transformer trained for three steps: each compiled with
 * the inductor for the device, run, differentiated through AOT autograd, and compared with the
 * same code run eagerly on the device. Every generated kernel of those programs also compiles
 * with NVRTC for sm_90, warning-free. Then split reductions: a long reduction over few rows is
 * split over the SMs, its partial sums combined in a fixed order by a second kernel.
 *
 * The suite picks the device itself: the GPU when a driver loads, else the host emulator (each
 * new kernel is a host C++ compile, cached on disk after); with neither it is skipped loudly. */
#include "common.h"

#include "../inductor/inductor.h"
#include "../prims/prims.h"
#include "../runtime/cuda.h"
#include "../bench/models.h"

#define F EM_F32

/* ---- the device, and the generated kernels of every program compiled in this process ---- */

static void on_device(void) {
  etest_pick_cuda();
  if (!em_cuda_is_available()) {
    fprintf(stderr, "test_cuda_diff: NEITHER a GPU NOR the CUDA emulator is usable: the compiled-vs-eager CUDA tests "
                    "are SKIPPED\n");
    em_clear_error();
    cr_skip_test("no CUDA device and no emulator");
  }
  em_set_default_device(EM_CUDA);
}

enum { MAX_PROGRAMS = 512 };
static char *programs[MAX_PROGRAMS]; /* kernel source of each program the inductor made (ind_kernel_ir) */
static int n_programs;

static void kernels_made(const char *graph, const ind_program *p) {
  (void)graph;
  const char *text = ind_kernel_ir(p);
  if (!text || !*text) return;
  for (int i = 0; i < n_programs; i++)
    if (!strcmp(programs[i], text)) return;
  cr_assert_lt(n_programs, MAX_PROGRAMS);
  programs[n_programs++] = strdup(text);
}

/* em_compile installs the frontend's logging hook; ours replaces it until the next em_compile. */
static em_compiled *compile_mode(em_model_fn fn, const char *name, const char *mode) {
  em_compiled *c = em_compile(fn, &(em_compile_options){.name = name, .mode = mode});
  cr_assert_not_null(c, "%s: %s", name, em_last_error());
  ind_set_compiled_hook(kernels_made);
  return c;
}
static em_compiled *compile(em_model_fn fn, const char *name) { return compile_mode(fn, name, NULL); }

/* Every program's kernels compile with NVRTC for the H100's sm_90 without warnings; each alone,
 * as the runtime compiles them (their extern "C" names may repeat across programs). */
static void nvrtc_check(const char *what, int min_programs) {
  cr_assert_geq(n_programs, min_programs, "%s: %d programs with generated kernels", what, n_programs);
  if (!cu_nvrtc_available()) {
    fprintf(stderr, "test_cuda_diff: this build has NO NVRTC (CUDA toolkit not found): %d generated programs of %s NOT "
                    "compiled for sm_90\n", n_programs, what);
  }
  const char *pre = cu_kernel_prelude();
  for (int i = 0; i < n_programs; i++) {
    if (cu_nvrtc_available()) {
      char *src = malloc(strlen(pre) + strlen(programs[i]) + 1), *cubin = NULL, *log = NULL;
      size_t size = 0;
      strcpy(src, pre), strcat(src, programs[i]);
      bool ok = cu_nvrtc_compile(src, "compiled_graph.cu", "sm_90", &cubin, &size, &log);
      cr_assert(ok && size > 0 && (!log || !strstr(log, "warning")), "%s: program %d under NVRTC:\n%s\n%s", what, i,
                log ? log : "?", programs[i]);
      free(src), free(cubin), free(log);
    }
    free(programs[i]);
  }
  cr_log_info("%s: %d generated programs%s", what, n_programs, cu_nvrtc_available() ? " compiled with NVRTC for sm_90" : "");
  n_programs = 0;
}

/* got agrees with want (both on the device) in dtype, shape and values within tol * (1 + |want|). */
static void same(em_tensor *want, em_tensor *got, double tol, const char *what, const char *part) {
  cr_assert(want && got, "%s %s: %s", what, part, em_last_error() ? em_last_error() : "NULL");
  cr_assert_eq(em_device_of(got), EM_CUDA, "%s %s: off the device", what, part);
  cr_assert_eq(em_dtype_of(want), em_dtype_of(got), "%s %s: dtype %s, eager %s", what, part,
               em_dtype_name(em_dtype_of(got)), em_dtype_name(em_dtype_of(want)));
  cr_assert_eq(em_ndim(want), em_ndim(got), "%s %s: rank", what, part);
  for (int d = 0; d < em_ndim(want); d++)
    cr_assert_eq(em_size(want, d), em_size(got, d), "%s %s: size of dim %d", what, part, d);
  int64_t n = em_numel(want);
  double *a = malloc(sizeof(double) * (size_t)(n + 1)), *b = malloc(sizeof(double) * (size_t)(n + 1));
  cr_assert(em_to_buffer(want, EM_F64, a, sizeof(double) * (size_t)n) &&
                em_to_buffer(got, EM_F64, b, sizeof(double) * (size_t)n),
            "%s %s: %s", what, part, em_last_error());
  for (int64_t i = 0; i < n; i++)
    if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])) || fabs(a[i] - b[i]) <= tol * (1 + fabs(a[i])))) {
      double x = a[i], y = b[i];
      free(a), free(b);
      cr_assert_fail("%s %s: element %lld: eager %.9g, compiled %.9g", what, part, (long long)i, x, y);
    }
  free(a), free(b);
}

/* ---- (a) every prim, (b) every composite: a tiny graph, forward and backward ---- */

/* Inputs of every case: x [4, 8] ~ N(0, 1) and y [4, 8] in [0.5, 1.5) requiring grad; ix [4, 8]
 * in [0, 8) for gathers along dim 1; iv [4] in [0, 4) for rows; tg [4] in [0, 8) as class targets. */
typedef em_tensor *(*case_fn)(em_tensor *x, em_tensor *y, em_tensor *ix, em_tensor *iv, em_tensor *tg);
typedef struct op_case {
  const char *name;
  int prim; /* the prim it reaches (EM_PRIM_COUNT: a composite) */
  case_fn fn;
  double tol;
  bool reads_back; /* reads a value back to the host (one_hot's bounds check): a graph break there */
} op_case;

#define SH(...) EM_SHAPE(__VA_ARGS__)
#define CASE(id, expr)                                                                              \
  static em_tensor *case_##id(em_tensor *x, em_tensor *y, em_tensor *ix, em_tensor *iv, em_tensor *tg) { \
    (void)x, (void)y, (void)ix, (void)iv, (void)tg;                                                 \
    return (expr);                                                                                  \
  }
static em_tensor *row(em_tensor *y) { return em_reshape(em_slice(y, 0, 1, 2, 1), SH(8)); } /* y[1], [8] */
static em_tensor *img(em_tensor *x) { return em_reshape(x, SH(2, 1, 4, 4)); }

/* prims */
CASE(neg, em_neg(x))
CASE(abs, em_abs(x))
CASE(exp, em_exp(x))
CASE(log, em_log(y))
CASE(log1p, em_log1p(y))
CASE(expm1, em_expm1(x))
CASE(sqrt, em_sqrt(y))
CASE(rsqrt, em_rsqrt(y))
CASE(sin, em_sin(x))
CASE(cos, em_cos(x))
CASE(tanh, em_tanh(x))
CASE(erf, em_erf(x))
CASE(sign, em_mul(em_sign(x), y))
CASE(floor, em_add(em_floor(em_mul_scalar(x, 3)), y))
CASE(ceil, em_add(em_ceil(em_mul_scalar(x, 3)), y))
CASE(reciprocal, em_reciprocal(y))
CASE(logical_not, em_logical_not(em_gt_scalar(x, 0)))
CASE(add, em_add(x, y))
CASE(sub, em_sub(x, row(y)))
CASE(mul, em_mul(x, y))
CASE(div, em_div(x, y))
CASE(pow, em_pow(y, x))
CASE(maximum, em_maximum(x, em_sub_scalar(y, 1)))
CASE(minimum, em_minimum(x, em_sub_scalar(y, 1)))
CASE(remainder, em_remainder(em_mul_scalar(x, 3), y))
CASE(atan2, em_atan2(x, em_sub_scalar(y, 1)))
CASE(eq, em_eq(em_floor(x), em_floor(em_sub_scalar(y, 1))))
CASE(ne, em_ne(em_floor(x), em_floor(em_sub_scalar(y, 1))))
CASE(lt, em_lt(x, y))
CASE(le, em_le(x, row(y)))
CASE(gt, em_gt(x, y))
CASE(ge, em_ge(x, y))
CASE(logical_and, em_logical_and(em_gt_scalar(x, 0), em_gt_scalar(y, 1)))
CASE(logical_or, em_logical_or(em_gt_scalar(x, 0), em_gt_scalar(y, 1)))
CASE(where, em_where(em_gt_scalar(x, 0), x, em_mul(x, y)))
CASE(convert, em_cast(em_mul(em_cast(x, EM_F64), em_cast(y, EM_F16)), F))
CASE(sum, em_sum(em_mul(x, y), 1, (int64_t[]){1}, false))
CASE(prod, em_prod(y, 1, (int64_t[]){0}, true))
CASE(amax, em_amax(em_mul(x, y), 1, (int64_t[]){1}, false))
CASE(amin, em_amin(x, 1, (int64_t[]){0}, false))
CASE(argmax, em_argmax(em_mul(x, y), 1, false))
CASE(argmin, em_argmin(x, 0, true))
CASE(reshape, em_reshape(em_exp(x), SH(2, 16)))
CASE(permute, em_exp(em_permute(em_reshape(x, SH(2, 2, 8)), 3, (int64_t[]){2, 0, 1})))
CASE(expand, em_mul(em_expand(em_reshape(em_slice(y, 1, 0, 1, 1), SH(4, 1)), SH(4, 8)), x))
CASE(slice, em_mul(em_slice(x, 1, 1, 8, 2), em_slice(y, 1, 0, 8, 2)))
CASE(squeeze, em_squeeze(em_sum(x, 1, (int64_t[]){1}, true), 1, (int64_t[]){1}))
CASE(unsqueeze, em_mul(em_unsqueeze(x, 0), em_unsqueeze(y, 1)))
CASE(detach, em_mul(x, em_detach(y)))
CASE(clone, em_clone(em_mul(x, y)))
CASE(flip, em_mul(em_flip(x, 1, (int64_t[]){1}), y))
CASE(pad, em_pad(em_mul(x, y), 4, (int64_t[]){1, 2, 0, 1}, 0.5))
static em_tensor *cat2(em_tensor *a, em_tensor *b) { return em_cat(2, ((em_tensor *[]){a, b}), 0); }
CASE(cat, cat2(x, em_mul(x, y)))
CASE(slice_scatter, em_slice_scatter(x, em_mul(em_slice(x, 1, 0, 8, 2), em_slice(y, 1, 1, 8, 2)), 1, 0, 8, 2))
CASE(gather, em_gather(em_mul(x, y), 1, ix))
CASE(index_select, em_index_select(em_mul(x, y), 0, iv))
CASE(scatter_add, em_scatter_add(x, 1, ix, y))
CASE(full, em_add(x, em_full(F, SH(4, 8), 2.5)))
CASE(iota, em_mul(x, em_arange(F, 0, 8, 1)))
CASE(philox_uniform, em_mul(x, em_rand(F, SH(4, 8))))
CASE(philox_normal, em_add(x, em_randn(F, SH(4, 8))))
CASE(cumsum, em_cumsum(em_mul(x, y), 1))
CASE(cumprod, em_cumprod(y, 1))
CASE(argsort, em_argsort(x, 1, true))
CASE(matmul, em_matmul(x, em_transpose(y, 0, 1)))
CASE(conv2d, em_conv2d(img(x), em_reshape(y, SH(8, 1, 2, 2)), EM_NONE, EM_CONV2D_DEFAULT))

/* composites */
CASE(relu, em_relu(x))
CASE(leaky_relu, em_leaky_relu(x, 0.1))
CASE(gelu, em_gelu(x, false))
CASE(gelu_tanh, em_gelu(x, true))
CASE(silu, em_silu(x))
CASE(sigmoid, em_sigmoid(x))
CASE(softplus, em_softplus(x, 2, 20))
CASE(softmax, em_softmax(em_mul(x, y), 1))
CASE(log_softmax, em_log_softmax(x, 0))
CASE(logsumexp, em_logsumexp(em_mul(x, y), 1, (int64_t[]){1}, false))
CASE(mean, em_mean(x, 1, (int64_t[]){0}, false))
CASE(var, em_var(em_mul(x, y), 1, (int64_t[]){1}, 1, true))
CASE(std, em_std(x, 1, (int64_t[]){1}, 0, false))
CASE(layer_norm, em_layer_norm(x, 1, row(y), em_sub_scalar(row(y), 1), 1e-5))
CASE(rms_norm, em_rms_norm(x, 1, row(y), 1e-6))
CASE(batch_norm, em_batch_norm(em_reshape(x, SH(2, 4, 2, 2)), EM_NONE, EM_NONE, em_slice(row(y), 0, 0, 4, 1),
                               em_slice(row(y), 0, 4, 8, 1), true, 0.1, 1e-5))
CASE(linear, em_linear(x, y, em_slice(row(y), 0, 2, 6, 1)))
CASE(dropout, em_dropout(em_mul(x, y), 0.3, true))
CASE(cross_entropy, em_cross_entropy(em_mul(x, y), tg, EM_CROSS_ENTROPY_DEFAULT))
CASE(cross_entropy_smooth, em_cross_entropy(x, tg, ((em_cross_entropy_opts){2, 0.1, EM_REDUCE_SUM})))
CASE(nll_loss, em_nll_loss(em_log_softmax(x, 1), tg, -100, EM_REDUCE_MEAN))
CASE(mse_loss, em_mse_loss(x, y, EM_REDUCE_MEAN))
CASE(embedding, em_embedding(em_reshape(ix, SH(32)), em_reshape(em_mul(x, y), SH(8, 4))))
CASE(max_pool2d, em_max_pool2d(img(em_mul(x, y)), 2, 2, 2, 2, 0, 0))
CASE(max_pool2d_pad, em_max_pool2d(img(x), 3, 3, 1, 1, 1, 1))
CASE(avg_pool2d, em_avg_pool2d(img(em_mul(x, y)), 2, 2, 1, 1, 0, 0))
CASE(sdpa_causal, em_scaled_dot_product_attention(em_reshape(x, SH(2, 4, 4)), em_reshape(y, SH(2, 4, 4)),
                                                  em_reshape(em_mul(x, y), SH(2, 4, 4)), true, 0, 0))
CASE(clamp, em_clamp(x, -0.5, 0.7))
CASE(clamp_tensor, em_clamp_tensor(x, em_neg(y), row(y)))
CASE(sort, em_sort(em_mul(x, y), 1, false, NULL))
CASE(topk, em_topk(em_mul(x, y), 3, 1, true, true, NULL))
CASE(tril, em_tril(em_mul(x, y), 1))
CASE(triu, em_triu(x, -1))
CASE(masked_fill, em_masked_fill(em_mul(x, y), em_gt_scalar(x, 0.5), -2))
CASE(one_hot, em_one_hot(tg, 8))
CASE(round_trunc_frac, em_add(em_add(em_round(em_mul_scalar(x, 3)), em_trunc(em_mul_scalar(x, 3))), em_frac(em_mul(x, y))))
CASE(conv2d_stride_pad, em_conv2d(img(x), em_reshape(y, SH(8, 1, 2, 2)), row(y),
                                  ((em_conv2d_params){{2, 2}, {1, 1}, {1, 1}, 1})))

#define P_AS(id, prim) {#id, EM_PRIM_##prim, case_##id, 1e-5}
#define COMP(id) {#id, EM_PRIM_COUNT, case_##id, 1e-5}
static const op_case prim_cases[] = {
  P_AS(neg, NEG), P_AS(abs, ABS), P_AS(exp, EXP), P_AS(log, LOG), P_AS(log1p, LOG1P), P_AS(expm1, EXPM1),
  P_AS(sqrt, SQRT), P_AS(rsqrt, RSQRT), P_AS(sin, SIN), P_AS(cos, COS), P_AS(tanh, TANH), P_AS(erf, ERF),
  P_AS(sign, SIGN), P_AS(floor, FLOOR), P_AS(ceil, CEIL), P_AS(reciprocal, RECIPROCAL), P_AS(logical_not, LOGICAL_NOT),
  P_AS(add, ADD), P_AS(sub, SUB), P_AS(mul, MUL), P_AS(div, DIV), P_AS(pow, POW), P_AS(maximum, MAXIMUM),
  P_AS(minimum, MINIMUM), P_AS(remainder, REMAINDER), P_AS(atan2, ATAN2), P_AS(eq, EQ), P_AS(ne, NE), P_AS(lt, LT),
  P_AS(le, LE), P_AS(gt, GT), P_AS(ge, GE), P_AS(logical_and, LOGICAL_AND), P_AS(logical_or, LOGICAL_OR),
  P_AS(where, WHERE), P_AS(convert, CONVERT), P_AS(sum, SUM), P_AS(prod, PROD), P_AS(amax, AMAX), P_AS(amin, AMIN),
  P_AS(argmax, ARGMAX), P_AS(argmin, ARGMIN), P_AS(reshape, RESHAPE), P_AS(permute, PERMUTE), P_AS(expand, EXPAND),
  P_AS(slice, SLICE), P_AS(squeeze, SQUEEZE), P_AS(unsqueeze, UNSQUEEZE), P_AS(detach, DETACH), P_AS(clone, CLONE),
  P_AS(flip, FLIP), P_AS(pad, PAD), P_AS(cat, CAT), P_AS(slice_scatter, SLICE_SCATTER), P_AS(gather, GATHER),
  P_AS(index_select, INDEX_SELECT), P_AS(scatter_add, SCATTER_ADD), P_AS(full, FULL), P_AS(iota, IOTA),
  {"philox_uniform", EM_PRIM_PHILOX_UNIFORM, case_philox_uniform, 0},
  {"philox_normal", EM_PRIM_PHILOX_NORMAL, case_philox_normal, 0}, P_AS(cumsum, CUMSUM),
  P_AS(cumprod, CUMPROD), P_AS(argsort, ARGSORT), P_AS(matmul, MATMUL), P_AS(conv2d, CONV2D),
  /* conv2d's backward reaches CONV2D_BWD_INPUT and CONV2D_BWD_WEIGHT */
  P_AS(conv2d_stride_pad, CONV2D_BWD_INPUT), P_AS(conv2d_stride_pad, CONV2D_BWD_WEIGHT),
};
static const op_case composite_cases[] = {
  COMP(relu), COMP(leaky_relu), COMP(gelu), COMP(gelu_tanh), COMP(silu), COMP(sigmoid), COMP(softplus),
  COMP(softmax), COMP(log_softmax), COMP(logsumexp), COMP(mean), COMP(var), COMP(std), COMP(layer_norm),
  COMP(rms_norm), COMP(batch_norm), COMP(linear), {"dropout", EM_PRIM_COUNT, case_dropout, 0}, /* the same seed: bit for bit */
  COMP(cross_entropy), COMP(cross_entropy_smooth),
  COMP(nll_loss), COMP(mse_loss), COMP(embedding), COMP(max_pool2d), COMP(max_pool2d_pad), COMP(avg_pool2d),
  COMP(sdpa_causal), COMP(clamp), COMP(clamp_tensor), COMP(sort), COMP(topk), COMP(tril), COMP(triu),
  COMP(masked_fill), {"one_hot", EM_PRIM_COUNT, case_one_hot, 1e-5, true}, COMP(round_trunc_frac),
};

static em_outputs run_case(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  const op_case *c = ctx;
  return EM_OUTPUTS(c->fn(in[0], in[1], in[2], in[3], in[4]));
}

/* One case: eager on the device, then compiled (twice: the second call replays), each from the
 * same seed (random ops agree bit for bit); a float result is differentiated with the same
 * upstream gradient and x's and y's gradients compared. */
static void check_case(const op_case *c) {
  em_scope_begin();
  em_manual_seed(19);
  em_tensor *x = em_requires_grad_(em_randn(F, SH(4, 8)), true);
  em_tensor *y = em_requires_grad_(em_add_scalar(em_rand(F, SH(4, 8)), 0.5), true);
  em_tensor *ix = em_randint(0, 8, SH(4, 8)), *iv = em_randint(0, 4, SH(4)), *tg = em_randint(0, 8, SH(4));
  cr_assert_eq(em_device_of(x), EM_CUDA);
  em_tensor *in[5] = {x, y, ix, iv, tg}, *leaf[2] = {x, y};
  em_manual_seed(7);
  em_tensor *want = run_case((void *)c, in, 5).t[0];
  cr_assert_not_null(want, "%s eager: %s", c->name, em_last_error());
  bool diff = em_dtype_of(want) == F && em_requires_grad(want);
  em_tensor *g = NULL, *want_grad[2] = {0};
  if (diff) {
    int64_t sz[EM_MAX_DIMS];
    for (int d = 0; d < em_ndim(want); d++) sz[d] = em_size(want, d);
    g = em_randn(F, em_ndim(want), sz);
    cr_assert(em_backward(want, g), "%s eager backward: %s", c->name, em_last_error());
    for (int i = 0; i < 2; i++) {
      em_tensor *gr = em_get_grad(leaf[i]);
      want_grad[i] = gr ? em_clone(gr) : NULL;
      em_zero_grad(leaf[i]);
    }
  }
  em_compiled *comp = compile(run_case, c->name);
  for (int call = 0; call < 2; call++) {
    em_manual_seed(7);
    em_outputs o = em_call(comp, (void *)c, x, y, ix, iv, tg);
    cr_assert(o.n == 1 && o.t[0], "%s compiled, call %d: %s", c->name, call, em_last_error());
    same(want, o.t[0], c->tol, c->name, "forward");
    if (!diff) continue;
    cr_assert(em_requires_grad(o.t[0]), "%s: the compiled result does not require grad", c->name);
    cr_assert(em_backward(o.t[0], g), "%s compiled backward: %s", c->name, em_last_error());
    for (int i = 0; i < 2; i++) {
      em_tensor *gr = em_get_grad(leaf[i]);
      cr_assert_eq(!gr, !want_grad[i], "%s: grad of %s present in one mode only", c->name, i ? "y" : "x");
      if (gr) same(want_grad[i], gr, c->tol, c->name, i ? "grad y" : "grad x");
      em_zero_grad(leaf[i]);
    }
  }
  em_compile_stats st = em_compiled_stats(comp);
  cr_assert_eq(st.inductor_fallbacks, 0, "%s: the inductor fell back to op-by-op", c->name);
  if (c->reads_back) cr_assert_gt(st.breaks, 0, "%s: no graph break at the value read back", c->name);
  else cr_assert_eq(st.breaks, 0, "%s: a graph break", c->name);
  em_compiled_free(comp);
  em_scope_end();
}

TestSuite(cuda_diff);

ETEST(cuda_diff, every_prim_compiled_matches_eager) {
  on_device();
  bool reached[EM_PRIM_COUNT] = {0};
  int n = (int)(sizeof prim_cases / sizeof prim_cases[0]);
  for (int i = 0; i < n; i++) reached[prim_cases[i].prim] = true;
  for (int p = 0; p < EM_PRIM_COUNT; p++)
    cr_assert(reached[p], "prim %s (prims/prims.def) has no case in this suite's table", prim_get(p)->name);
  for (int i = 0; i < n; i++)
    if (i == 0 || prim_cases[i].fn != prim_cases[i - 1].fn) check_case(&prim_cases[i]);
  nvrtc_check("every prim", 20);
}

ETEST(cuda_diff, every_composite_compiled_matches_eager) {
  on_device();
  for (size_t i = 0; i < sizeof composite_cases / sizeof composite_cases[0]; i++) check_case(&composite_cases[i]);
  nvrtc_check("every composite", 20);
}

/* ---- (c) LeNet-5 and a transformer: three SGD steps compiled vs eager ---- */

/* Builds the model's parameters from seed (on the device), then runs `steps` SGD steps of
 * model on the batch (in[0], in[1]), compiled with the inductor or eagerly; the loss of each
 * step in loss[], the final parameters (clones) in params[]. */
static int train(em_model_fn model, bool (*init)(net *), em_tensor *const *batch, bool compiled, int steps, double lr,
                 double *loss, uint64_t *with_grad, em_tensor **params, const char *what) {
  net m = {0};
  em_manual_seed(3);
  cr_assert(init(&m), "%s: %s", what, em_last_error());
  cr_assert_eq(em_device_of(m.params[0]), EM_CUDA, "%s: parameters off the device", what);
  em_compiled *c = compiled ? compile(model, what) : NULL;
  for (int s = 0; s < steps; s++) {
    em_scope_begin();
    em_outputs o = compiled ? em_call(c, &m, batch[0], batch[1]) : model(&m, batch, 2);
    cr_assert(o.n >= 1 && o.t[0], "%s, %s step %d: %s", what, compiled ? "compiled" : "eager", s, em_last_error());
    loss[s] = em_item(o.t[0]);
    with_grad[s] = 0;
    cr_assert(em_backward(o.t[0], NULL), "%s: %s", what, em_last_error());
    em_no_grad_begin();
    for (int i = 0; i < m.n_params; i++) {
      em_tensor *g = em_get_grad(m.params[i]); /* NULL: unused (the transformer's linear biases) */
      if (!g) continue;
      with_grad[s] |= 1ull << i;
      cr_assert(em_sub_(m.params[i], em_mul_scalar(g, lr)), "%s", em_last_error());
      em_zero_grad(m.params[i]);
    }
    em_no_grad_end();
    em_scope_end();
  }
  if (c) {
    em_compile_stats st = em_compiled_stats(c);
    cr_assert_eq(st.inductor_fallbacks, 0, "%s: the inductor fell back to op-by-op", what);
    cr_assert_gt(st.kernel_runs, 0, "%s: no generated kernel ran", what);
    em_compiled_free(c);
  }
  for (int i = 0; i < m.n_params; i++) params[i] = em_clone(em_detach(m.params[i]));
  return m.n_params;
}

static void train_both(em_model_fn model, bool (*init)(net *), em_tensor *const *batch, double lr, double tol,
                       const char *what) {
  enum { STEPS = 3 };
  double want[STEPS], got[STEPS];
  uint64_t gw[STEPS], gg[STEPS]; /* which parameters had a gradient, each step */
  em_tensor *pw[32], *pg[32];
  int n = train(model, init, batch, false, STEPS, lr, want, gw, pw, what);
  cr_assert_eq(train(model, init, batch, true, STEPS, lr, got, gg, pg, what), n);
  for (int s = 0; s < STEPS; s++) {
    cr_assert_eq(gw[s], gg[s], "%s step %d: parameters with a gradient, eager %llx, compiled %llx", what, s,
                 (unsigned long long)gw[s], (unsigned long long)gg[s]);
    cr_assert_geq(__builtin_popcountll(gw[s]), n / 2, "%s: most parameters train", what);
    cr_log_info("%s step %d: loss eager %.7f, compiled %.7f", what, s, want[s], got[s]);
    cr_assert(fabs(want[s] - got[s]) <= tol * (1 + fabs(want[s])), "%s step %d: loss eager %.9g, compiled %.9g", what,
              s, want[s], got[s]);
  }
  cr_assert_lt(want[STEPS - 1], want[0], "%s: the loss falls", what);
  for (int i = 0; i < n; i++) {
    char part[32];
    snprintf(part, sizeof part, "parameter %d", i);
    same(pw[i], pg[i], tol, what, part);
  }
}

static bool mlp_init(net *m) {
  models_mlp(m, 24, 32, 16, 10);
  return !em_last_error();
}
static bool gelu_ln_mlp_init(net *m) {
  models_gelu_ln_mlp(m, 24, 32, 16, 10);
  return !em_last_error();
}
static bool lenet_init(net *m) { return models_lenet(m); }

ETEST(cuda_diff, mlp_training_compiled_matches_eager) {
  on_device();
  em_manual_seed(10);
  em_tensor *batch[2] = {em_randn(F, SH(16, 24)), em_randint(0, 10, SH(16))};
  train_both(mlp_fn, mlp_init, batch, 0.2, 1e-4, "mlp");
  train_both(gelu_ln_mlp_fn, gelu_ln_mlp_init, batch, 0.2, 1e-4, "gelu_ln_mlp");
  nvrtc_check("mlp training", 4);
}
static bool transformer_init(net *m) {
  models_transformer(m);
  return !em_last_error();
}

ETEST(cuda_diff, lenet_training_compiled_matches_eager) {
  on_device();
  em_manual_seed(11);
  em_tensor *batch[2] = {em_randn(F, SH(4, 1, 28, 28)), em_randint(0, 10, SH(4))};
  train_both(lenet_fn, lenet_init, batch, 0.05, 1e-4, "lenet");
  nvrtc_check("lenet training", 2);
}

ETEST(cuda_diff, transformer_training_compiled_matches_eager) {
  on_device();
  em_manual_seed(12);
  em_tensor *batch[2] = {em_randint(0, VOCAB, SH(BATCH, CTX)), em_randint(0, VOCAB, SH(BATCH, CTX))};
  train_both(transformer_fn, transformer_init, batch, 0.1, 1e-4, "transformer");
  nvrtc_check("transformer training", 2);
}

/* ---- split reductions ---- */

static em_outputs long_rows(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *x = in[0], *sq = em_mul(x, x);
  return EM_OUTPUTS(em_sum(sq, 1, (int64_t[]){1}, false), em_amax(em_sub(x, in[1]), 1, (int64_t[]){1}, true));
}

/* Few long rows (fewer than the SMs, 8192 columns or more) are reduced in parts by one kernel and
 * folded in order by a second (cuda_codegen.c: split_parts): the results agree with eager within
 * rounding and are bit for bit the same on every call; many rows, or short ones, are not split. */
ETEST(cuda_diff, long_reductions_over_few_rows_split_deterministically) {
  on_device();
  const int64_t shapes[][2] = {{4, 65536}, {1, 8192}, {3, 50001}, {256, 8192}, {4, 4096}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    em_scope_begin();
    int64_t R = shapes[s][0], C = shapes[s][1];
    char what[64];
    snprintf(what, sizeof what, "[%lld, %lld]", (long long)R, (long long)C);
    em_manual_seed(40 + s);
    em_tensor *x = em_randn(F, SH(R, C)), *b = em_randn(F, SH(R, 1));
    em_outputs want = long_rows(NULL, (em_tensor *[]){x, b}, 2);
    em_compiled *c = compile(long_rows, "long_rows");
    em_tensor *first[2] = {NULL, NULL};
    for (int call = 0; call < 3; call++) {
      em_outputs o = em_call(c, NULL, x, b);
      cr_assert(o.n == 2 && o.t[0] && o.t[1], "%s: %s", what, em_last_error());
      same(want.t[0], o.t[0], 1e-5, what, "sum of squares");
      same(want.t[1], o.t[1], 0, what, "amax");
      if (call == 0) first[0] = o.t[0], first[1] = o.t[1];
      else
        for (int i = 0; i < 2; i++) same(first[i], o.t[i], 0, what, "a later call (bit for bit)");
    }
    em_compiled_free(c);
    if (s == 0) { /* replayed as a CUDA graph: the partial results' scratch comes from the graph's pool */
      c = compile_mode(long_rows, "long_rows", "reduce-overhead");
      for (int call = 0; call < 3; call++) {
        em_outputs o = em_call(c, NULL, x, b);
        cr_assert(o.n == 2 && o.t[0] && o.t[1], "%s reduce-overhead: %s", what, em_last_error());
        for (int i = 0; i < 2; i++) same(first[i], o.t[i], 0, what, "reduce-overhead (bit for bit)");
      }
      cr_assert_geq(em_compiled_stats(c).cuda_graph_replays, 2, "%s: CUDA graph replays", what);
      em_compiled_free(c);
    }
    cr_assert_eq(n_programs, 1, "%s: %d programs", what, n_programs);
    bool split = strstr(programs[0], "em_ind_c") != NULL, want_split = R < 132 && C >= 8192;
    cr_assert_eq(split, want_split, "%s: %s, expected %s:\n%s", what, split ? "split" : "not split",
                 want_split ? "a split" : "none", programs[0]);
    nvrtc_check(what, 1);
    em_scope_end();
  }
}
