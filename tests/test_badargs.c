/* tests/test_badargs.c: the bad-argument table of issue 17. Every public op, called with each of
 * a list of bad inputs (NULL arrays and counts, out-of-range dtypes, axes and devices, shapes
 * whose sizes are negative or whose element counts do not fit in 64 bits, extreme parameters),
 * must return its failure value with one error that names the op and this file's line, and
 * leak nothing; a few extreme but valid calls must succeed; and every pointwise, scalar,
 * reduction, cast and copy-out op meets every dtype's extremes (INT64_MIN / -1, division by zero,
 * NaN, empty tensors), where it may succeed or refuse, but cleanly. Each call runs in a child process,
 * so a crash (or, under the sanitizer build, any undefined behaviour: it is built with
 * -fno-sanitize-recover) is counted and named instead of ending the suite.
 *
 * A case is X(op, variants, expect, call): `call` may use v (0 .. variants-1) to pick one of the
 * bad values below, and evaluates to an int, 1 when the op returned its failure value (NULL,
 * false, NaN), through the r_* wrappers. */
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

#define F EM_F32
enum { FAIL, OK, SILENT, ANY };
/* SILENT: a NULL handle from an earlier failure returns NULL, no new error. ANY: extreme values
 * and dtypes an op may accept or refuse: either a result without an error, or the failure value
 * with a clean error; never a crash or undefined behaviour. */

static int r_t(em_tensor *t) { return t == NULL; }
static int r_b(bool b) { return !b; }
static int r_p(const void *p) { return p == NULL; }
static int r_d(double d) { return isnan(d); }
static int r_i(int n) { return n < 0; } /* the counting functions (em_split): -1 */
static int r_o(em_outputs o) {
  for (int i = 0; i < o.n; i++)
    if (!o.t[i]) return 1;
  return o.n == 0;
}

/* ---- bad values ---- */
static const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
static const struct { int n; const int64_t *s; } SH[] = { /* bad shapes */
    {1, (const int64_t[]){-2}},
    {2, (const int64_t[]){INT64_MAX, 2}},
    {2, (const int64_t[]){(int64_t)1 << 40, (int64_t)1 << 40}},
    {1, (const int64_t[]){INT64_MIN}},
    {-1, (const int64_t[]){2}},
    {9, nine},
    {2, NULL},
};
#define N_SH 7
static const struct { int n; const int64_t *s; } AX[] = { /* bad axis lists for a 2-D operand */
    {1, (const int64_t[]){2}},
    {1, (const int64_t[]){-3}},
    {1, (const int64_t[]){INT64_MAX}},
    {1, (const int64_t[]){INT64_MIN}},
    {2, (const int64_t[]){0, -2}},
    {-1, (const int64_t[]){0}},
    {9, nine},
    {1, NULL},
};
#define N_AX 8
static const int A1[] = {2, -3, INT32_MAX, INT32_MIN + 1}; /* INT32_MIN is EM_ALL_AXES */ /* bad single axes for a 2-D operand */
#define N_A1 4
static const em_dtype DT[] = {(em_dtype)-1, (em_dtype)42, (em_dtype)INT32_MAX};
#define N_DT 3
static const int64_t BIG[] = {-1, INT64_MAX, INT64_MIN}; /* bad counts and window sizes */
#define N_BIG 3

static em_conv2d_params conv_bad(int v) {
  em_conv2d_params p = EM_CONV2D_DEFAULT;
  switch (v) {
  case 0: p.stride[0] = 0; break;
  case 1: p.stride[1] = -1; break;
  case 2: p.padding[0] = -1; break;
  case 3: p.padding[1] = INT64_MAX; break;
  case 4: p.dilation[0] = 0; break;
  case 5: p.dilation[1] = INT64_MAX; break;
  case 6: p.groups = 0; break;
  case 7: p.groups = 2; break; /* does not divide 3 input channels */
  case 8: p.groups = INT64_MIN; break;
  case 9: p.padding[0] = INT64_MIN; break;
  }
  return p;
}
#define N_CONV 10

static const int64_t *hw_bad(int v) { /* conv2d_backward_input's input size */
  static const int64_t h[][2] = {{-1, 6}, {INT64_MAX, 6}, {6, 99}, {0, 0}, {6, 6}};
  return v == 3 ? NULL : h[v];
}
static const int64_t *khw_bad(int v) { /* conv2d_backward_weight's kernel size */
  static const int64_t h[][2] = {{0, 3}, {INT64_MAX, 3}, {3, -7}, {0, 0}, {3, 3}};
  return v == 3 ? NULL : h[v];
}
static em_cross_entropy_opts ce_opts(double smoothing, em_reduction r) {
  em_cross_entropy_opts o = EM_CROSS_ENTROPY_DEFAULT;
  o.label_smoothing = smoothing, o.reduction = r;
  return o;
}
static em_sgd_opts sgd_momentum(double mom) {
  em_sgd_opts o = EM_SGD_DEFAULT(0.1);
  o.momentum = mom;
  return o;
}
/* Bad pooling options for img f32[1,3,6,6]; v = 5 is a good one at an extreme (a ceil_mode window
 * far longer than the input: one window). */
static em_pool2d_opts pool_bad(int v, bool is_max) {
  em_pool2d_opts o = EM_POOL2D_DEFAULT(2, 2);
  switch (v) {
  case 0: o = (em_pool2d_opts){.kernel = {2, 2}}; break; /* dilation 0 */
  case 1: o.dilation[1] = is_max ? INT64_MAX : 2; break;
  case 2: o.kernel[0] = INT64_MAX; break;
  case 3: o.padding[0] = INT64_MIN; o.ceil_mode = true; break;
  case 4: o.stride[1] = -1; break;
  default: o.kernel[0] = INT64_MAX, o.stride[0] = INT64_MAX, o.ceil_mode = true; break;
  }
  return o;
}
static em_adamw_opts adamw_bad(int v) {
  em_adamw_opts o = EM_ADAMW_DEFAULT(1e-3);
  switch (v) {
  case 0: o.lr = -1; break;
  case 1: o.beta1 = 1.0; break;
  case 2: o.beta2 = -0.1; break;
  case 3: o.eps = -1; break;
  default: o.weight_decay = NAN; break;
  }
  return o;
}

/* ---- operands, made fresh in each child ---- */
static em_tensor *m, *mi, *mb, *v3, *img, *wt, *leaf, *idx, *scal;
static char buf[4096];
static char tmpdir[64];

static void operands(void) {
  m = em_ones(F, EM_SHAPE(2, 3));                       /* f32[2,3] */
  mi = em_ones(EM_I64, EM_SHAPE(2, 3));                 /* i64[2,3] */
  mb = em_gt(m, em_zeros(F, EM_SHAPE(2, 3)));           /* bool[2,3] */
  v3 = em_ones(F, EM_SHAPE(3));                         /* f32[3] */
  img = em_ones(F, EM_SHAPE(1, 3, 6, 6));               /* f32[1,3,6,6] */
  wt = em_ones(F, EM_SHAPE(4, 3, 3, 3));                /* f32[4,3,3,3] */
  leaf = em_requires_grad_(em_ones(F, EM_SHAPE(2, 3)), true);
  idx = em_zeros(EM_I64, EM_SHAPE(2, 3));
  scal = em_scalar(F, 1);
}

static em_outputs identity_fn(void *ctx, em_tensor *const *in, int n) {
  (void)ctx;
  return EM_OUTPUTS(n ? in[0] : EM_NONE);
}
static em_outputs many_fn(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n, (void)in;
  return (em_outputs){.n = -3};
}

static int grad_twice(void) {
  em_tensor *y = em_sum(em_mul(leaf, leaf), 0, NULL, false);
  if (!em_backward(y, NULL)) return 0;
  return r_b(em_backward(y, NULL));
}

static int item_of_big(void) { return r_d(em_item(m)); }

/* The language-model ops that take a tensor and an axis, by number, on axis 1 (or 0). */
static const char *const LM[] = {"em_cumsum", "em_cumprod", "em_argsort", "em_sort", "em_topk", "em_tril", "em_triu"};
#define N_LM 7
static em_tensor *lm_op(int which, em_tensor *x) {
  em_tensor *i;
  switch (which) {
  case 0: return em_cumsum(x, 1);
  case 1: return em_cumprod(x, 0);
  case 2: return em_argsort(x, 1, true);
  case 3: return em_sort(x, 1, false, &i);
  case 4: return em_topk(x, 2, 1, true, true, &i);
  case 5: return em_tril(x, 0);
  default: return em_triu(x, 1);
  }
}

static int compiled_call(int v) {
  em_compiled *c = em_compile(identity_fn, NULL);
  if (!c) return 0;
  em_outputs o;
  switch (v) {
  case 0: o = em_call_n(c, NULL, -1, (em_tensor *[]){m}); break;
  default: o = em_call_n(c, NULL, 2, NULL); break;
  }
  em_compiled_free(c);
  return r_o(o);
}

static const char *path_of(const char *name) {
  static char p[128];
  snprintf(p, sizeof p, "%s/%s", tmpdir, name);
  return p;
}

static int write_file(const char *name, const void *data, size_t n) {
  FILE *f = fopen(path_of(name), "wb");
  if (!f) return 0;
  fwrite(data, 1, n, f);
  fclose(f);
  return 1;
}

static int bad_file(int loader, int v) {
  /* v: 0 missing, 1 a directory, 2 empty, 3 garbage, 4 NULL path */
  const char *p = v == 0 ? path_of("missing") : v == 1 ? tmpdir : v == 2 ? path_of("empty") : path_of("garbage");
  if (v == 2) write_file("empty", "", 0);
  if (v == 3) write_file("garbage", "\x93NUMPY\x01\x00\xff\xff{'descr': '<f4', 'shape': (9999999999999,", 44);
  if (v == 4) p = NULL;
  switch (loader) {
  case 0: return r_t(em_load_npy(p));
  case 1: return r_t(em_load_idx(p));
  case 2: return r_b(em_load(p, 1, (em_tensor *[]){m}, (const char *[]){"m"}));
  default: { /* a NULL dir is the default location: a NULL d instead */
    em_fashion_mnist d;
    return r_b(em_fashion_mnist_load(v == 4 ? NULL : &d, v == 4 ? tmpdir : p));
  }
  }
}


/* ---- extreme values in every dtype, for the ANY families ---- */
typedef em_tensor *(*unary_fn)(em_tensor *, em_site);
typedef em_tensor *(*binary_fn)(em_tensor *, em_tensor *, em_site);
typedef em_tensor *(*scalar_fn)(em_tensor *, double, em_site);
typedef em_tensor *(*reduce_fn)(em_tensor *, int, const int64_t *, bool, em_site);
static const struct { const char *name; unary_fn f; } UN[] = {
    {"em_neg", em_neg_at}, {"em_abs", em_abs_at}, {"em_exp", em_exp_at}, {"em_log", em_log_at},
    {"em_log1p", em_log1p_at}, {"em_expm1", em_expm1_at}, {"em_sqrt", em_sqrt_at}, {"em_rsqrt", em_rsqrt_at},
    {"em_sin", em_sin_at}, {"em_cos", em_cos_at}, {"em_tanh", em_tanh_at}, {"em_erf", em_erf_at},
    {"em_sign", em_sign_at}, {"em_floor", em_floor_at}, {"em_ceil", em_ceil_at}, {"em_reciprocal", em_reciprocal_at},
    {"em_logical_not", em_logical_not_at}, {"em_relu", em_relu_at}, {"em_sigmoid", em_sigmoid_at}, {"em_silu", em_silu_at},
    {"em_clone", em_clone_at}, {"em_contiguous", em_contiguous_at}, {"em_nonzero", em_nonzero_at},
    {"em_round", em_round_at}, {"em_trunc", em_trunc_at}, {"em_frac", em_frac_at},
};
#define N_UN 26
static const struct { const char *name; binary_fn f; } BIN[] = {
    {"em_add", em_add_at}, {"em_sub", em_sub_at}, {"em_mul", em_mul_at}, {"em_div", em_div_at},
    {"em_pow", em_pow_at}, {"em_maximum", em_maximum_at}, {"em_minimum", em_minimum_at}, {"em_remainder", em_remainder_at},
    {"em_atan2", em_atan2_at},
    {"em_eq", em_eq_at}, {"em_ne", em_ne_at}, {"em_lt", em_lt_at}, {"em_le", em_le_at}, {"em_gt", em_gt_at},
    {"em_ge", em_ge_at}, {"em_logical_and", em_logical_and_at}, {"em_logical_or", em_logical_or_at},
    {"em_matmul", em_matmul_at},
};
#define N_BIN 18
static const struct { const char *name; scalar_fn f; } SC[] = {
    {"em_add_scalar", em_add_scalar_at}, {"em_sub_scalar", em_sub_scalar_at}, {"em_mul_scalar", em_mul_scalar_at},
    {"em_div_scalar", em_div_scalar_at}, {"em_pow_scalar", em_pow_scalar_at}, {"em_maximum_scalar", em_maximum_scalar_at},
    {"em_minimum_scalar", em_minimum_scalar_at}, {"em_remainder_scalar", em_remainder_scalar_at},
    {"em_eq_scalar", em_eq_scalar_at}, {"em_lt_scalar", em_lt_scalar_at}, {"em_fill_", em_fill__at},
    {"em_add_scalar_", em_add_scalar__at}, {"em_mul_scalar_", em_mul_scalar__at},
};
#define N_SC 13
static const double SCV[] = {NAN, INFINITY, -1e300, -1, 0, 0.5};
#define N_SCV 6
static const struct { const char *name; reduce_fn f; } RED[] = {
    {"em_sum", em_sum_at}, {"em_prod", em_prod_at}, {"em_amax", em_amax_at}, {"em_amin", em_amin_at}, {"em_mean", em_mean_at},
    {"em_logsumexp", em_logsumexp_at},
};
#define N_RED 6
static const em_dtype DTS[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL, EM_U8, EM_F16, EM_BF16};
#define N_DTS 8
static const em_dtype MIX[] = {EM_F32, EM_I64, EM_BOOL, EM_U8, EM_I32};
#define N_MIX 5

/* A [2,4] tensor of dt holding that dtype's extremes (x) or partners that make the classic
 * traps with them (y: INT_MIN / -1, division and remainder by 0, negative integer powers). */
static em_tensor *extremes(em_dtype dt, bool partner) {
  static const double fx[8] = {NAN, INFINITY, -INFINITY, -0.0, 1e30, -3.5, 0, 2};
  static const double fy[8] = {-1, -1, 0, 0, 0, -1, 2, -3};
  static const int64_t i64x[8] = {INT64_MIN, -1, 0, 1, INT64_MAX, 7, -7, 3};
  static const int32_t i32x[8] = {INT32_MIN, -1, 0, 1, INT32_MAX, 7, -7, 3};
  static const uint8_t u8x[8] = {0, 255, 1, 128, 7, 3, 2, 254};
  static const int64_t i64y[8] = {-1, -1, 0, 0, 0, -1, 2, -3};
  static const int32_t i32y[8] = {-1, -1, 0, 0, 0, -1, 2, -3};
  static const uint8_t u8y[8] = {0, 0, 255, 0, 2, 1, 0, 3};
  static const bool bx[8] = {0, 1, 1, 0, 1, 0, 0, 1};
  switch (dt) {
  case EM_I64: return em_from_data(partner ? i64y : i64x, dt, EM_SHAPE(2, 4));
  case EM_I32: return em_from_data(partner ? i32y : i32x, dt, EM_SHAPE(2, 4));
  case EM_U8: return em_from_data(partner ? u8y : u8x, dt, EM_SHAPE(2, 4));
  case EM_BOOL: return em_from_data(bx, dt, EM_SHAPE(2, 4));
  case EM_F64: return em_from_data(partner ? fy : fx, dt, EM_SHAPE(2, 4));
  default: return em_cast(em_from_data(partner ? fy : fx, EM_F64, EM_SHAPE(2, 4)), dt);
  }
}
static em_tensor *empty_of(em_dtype dt) { return em_zeros(dt, EM_SHAPE(0, 3)); }
/* matmul needs [2,4] @ [4,2]: the partner transposed */
static em_tensor *partner_for(int op, em_dtype dt) {
  em_tensor *y = extremes(dt, true);
  return !strcmp(BIN[op].name, "em_matmul") ? em_transpose(y, 0, 1) : y;
}

#define BAD_CASES(X)                                                                                      \
  /* creation: shapes, dtypes, counts */                                                                  \
  X("em_empty", N_SH, FAIL, r_t(em_empty(F, SH[v].n, SH[v].s)))                                           \
  X("em_zeros", N_SH, FAIL, r_t(em_zeros(F, SH[v].n, SH[v].s)))                                           \
  X("em_ones", N_SH, FAIL, r_t(em_ones(EM_I32, SH[v].n, SH[v].s)))                                        \
  X("em_full", N_SH, FAIL, r_t(em_full(F, SH[v].n, SH[v].s, 2)))                                          \
  X("em_rand", N_SH, FAIL, r_t(em_rand(F, SH[v].n, SH[v].s)))                                             \
  X("em_randn", N_SH, FAIL, r_t(em_randn(EM_F64, SH[v].n, SH[v].s)))                                      \
  X("em_randint", N_SH, FAIL, r_t(em_randint(0, 5, SH[v].n, SH[v].s)))                                    \
  X("em_from_data", N_SH, FAIL, r_t(em_from_data(buf, F, SH[v].n, SH[v].s)))                              \
  X("em_empty", N_DT, FAIL, r_t(em_empty(DT[v], EM_SHAPE(2))))                                            \
  X("em_zeros", N_DT, FAIL, r_t(em_zeros(DT[v], EM_SHAPE(2))))                                            \
  X("em_ones", N_DT, FAIL, r_t(em_ones(DT[v], EM_SHAPE(2))))                                              \
  X("em_full", N_DT, FAIL, r_t(em_full(DT[v], EM_SHAPE(2), 1)))                                           \
  X("em_scalar", N_DT, FAIL, r_t(em_scalar(DT[v], 1)))                                                    \
  X("em_arange", N_DT, FAIL, r_t(em_arange(DT[v], 0, 3, 1)))                                              \
  X("em_eye", N_DT, FAIL, r_t(em_eye(DT[v], 2, 2)))                                                       \
  X("em_rand", N_DT, FAIL, r_t(em_rand(DT[v], EM_SHAPE(2))))                                              \
  X("em_randn", N_DT, FAIL, r_t(em_randn(DT[v], EM_SHAPE(2))))                                            \
  X("em_from_data", N_DT, FAIL, r_t(em_from_data(buf, DT[v], EM_SHAPE(2))))                               \
  X("em_cast", N_DT, FAIL, r_t(em_cast(m, DT[v])))                                                        \
  X("em_to_buffer", N_DT, FAIL, r_b(em_to_buffer(m, DT[v], buf, sizeof buf)))                             \
  X("em_from_data", 1, FAIL, r_t(em_from_data(NULL, F, EM_SHAPE(2))))                                     \
  X("em_rand", 2, FAIL, r_t(em_rand(v ? EM_I64 : EM_BOOL, EM_SHAPE(2))))                                  \
  X("em_randn", 1, FAIL, r_t(em_randn(EM_I32, EM_SHAPE(2))))                                              \
  X("em_arange", 6, FAIL,                                                                                 \
    r_t(em_arange(F, v == 1 ? NAN : 0, v == 2 ? INFINITY : v == 3 ? 1e30 : v == 4 ? -3 : 3,               \
                  v == 0 ? 0 : v == 5 ? NAN : 1)))                                                        \
  X("em_eye", 4, FAIL, r_t(em_eye(F, v == 1 ? 2 : v == 3 ? INT64_MAX : -1, v == 0 ? 2 : v == 3 ? INT64_MAX : -1))) \
  X("em_randint", 3, FAIL, r_t(em_randint(v ? 5 : 3, v == 2 ? INT64_MIN : 3, EM_SHAPE(2))))              \
  X("em_full", 3, FAIL, r_t(em_full(v == 2 ? EM_U8 : v ? EM_I64 : EM_I32, EM_SHAPE(2), v == 1 ? NAN : v == 2 ? 256 : 1e30))) \
  X("em_fill_", 2, FAIL, r_t(em_fill_(mi, v ? -INFINITY : NAN)))                                          \
  /* reductions and views taking axis lists */                                                            \
  X("em_sum", N_AX, FAIL, r_t(em_sum(m, AX[v].n, AX[v].s, false)))                                        \
  X("em_prod", N_AX, FAIL, r_t(em_prod(m, AX[v].n, AX[v].s, true)))                                       \
  X("em_amax", N_AX, FAIL, r_t(em_amax(m, AX[v].n, AX[v].s, false)))                                      \
  X("em_amin", N_AX, FAIL, r_t(em_amin(mi, AX[v].n, AX[v].s, false)))                                     \
  X("em_mean", N_AX, FAIL, r_t(em_mean(m, AX[v].n, AX[v].s, false)))                                      \
  X("em_logsumexp", N_AX, FAIL, r_t(em_logsumexp(m, AX[v].n, AX[v].s, false)))                            \
  X("em_var", N_AX, FAIL, r_t(em_var(m, AX[v].n, AX[v].s, 1, false)))                                     \
  X("em_std", N_AX, FAIL, r_t(em_std(m, AX[v].n, AX[v].s, 1, false)))                                     \
  X("em_squeeze", N_AX, FAIL, r_t(em_squeeze(m, AX[v].n, AX[v].s)))                                       \
  X("em_flip", N_AX, FAIL, r_t(em_flip(m, AX[v].n, AX[v].s)))                                             \
  X("em_permute", N_AX, FAIL, r_t(em_permute(m, AX[v].n, AX[v].s)))                                       \
  X("em_reshape", N_SH, FAIL, r_t(em_reshape(m, SH[v].n, SH[v].s)))                                       \
  X("em_expand", N_SH, FAIL, r_t(em_expand(scal, SH[v].n, SH[v].s)))                                      \
  /* ops taking one axis */                                                                               \
  X("em_argmax", N_A1, FAIL, r_t(em_argmax(m, A1[v], false)))                                             \
  X("em_argmin", N_A1, FAIL, r_t(em_argmin(m, A1[v], true)))                                              \
  X("em_softmax", N_A1, FAIL, r_t(em_softmax(m, A1[v])))                                                  \
  X("em_log_softmax", N_A1, FAIL, r_t(em_log_softmax(m, A1[v])))                                          \
  X("em_unsqueeze", N_A1, FAIL, r_t(em_unsqueeze(m, A1[v] == 2 ? 3 : A1[v] == -3 ? -4 : A1[v])))                             \
  X("em_transpose", N_A1, FAIL, r_t(em_transpose(m, A1[v], 0)))                                           \
  X("em_transpose", N_A1, FAIL, r_t(em_transpose(m, 1, A1[v])))                                           \
  X("em_slice", N_A1, FAIL, r_t(em_slice(m, A1[v], 0, 1, 1)))                                             \
  X("em_cat", N_A1, FAIL, r_t(em_cat(2, ((em_tensor *[]){m, m}), A1[v])))                                 \
  X("em_gather", N_A1, FAIL, r_t(em_gather(m, A1[v], idx)))                                               \
  X("em_index_select", N_A1, FAIL, r_t(em_index_select(m, A1[v], em_zeros(EM_I64, EM_SHAPE(1)))))         \
  X("em_scatter_add", N_A1, FAIL, r_t(em_scatter_add(m, A1[v], idx, m)))                                  \
  X("em_slice_scatter", N_A1, FAIL, r_t(em_slice_scatter(m, m, A1[v], 0, 2, 1)))                          \
  X("em_cumsum", N_A1, FAIL, r_t(em_cumsum(m, A1[v])))                                                   \
  X("em_cumprod", N_A1, FAIL, r_t(em_cumprod(mi, A1[v])))                                                 \
  X("em_argsort", N_A1, FAIL, r_t(em_argsort(m, A1[v], true)))                                            \
  X("em_sort", N_A1, FAIL, r_t(em_sort(m, A1[v], false, &(em_tensor *){NULL})))                           \
  X("em_topk", N_A1, FAIL, r_t(em_topk(m, 1, A1[v], true, true, NULL)))                                   \
  X("em_split", N_A1, FAIL, r_i(em_split(m, 1, A1[v], (em_tensor *[4]){0}, 4)))                           \
  X("em_chunk", N_A1, FAIL, r_i(em_chunk(m, 2, A1[v], (em_tensor *[4]){0}, 4)))                           \
  X("em_split_sizes", N_A1, FAIL, r_i(em_split_sizes(m, 2, ((const int64_t[]){1, 1}), A1[v], (em_tensor *[2]){0}))) \
  /* language-model ops: other bad arguments */                                                           \
  X("em_topk", N_BIG, FAIL, r_t(em_topk(m, BIG[v], 1, v == 1, true, &(em_tensor *){NULL})))              \
  X("em_topk", 1, FAIL, r_t(em_topk(scal, 2, 0, true, true, NULL)))                                       \
  X("em_multinomial", N_BIG, FAIL, r_t(em_multinomial(m, BIG[v], v == 1)))                               \
  X("em_multinomial", 6, FAIL,                                                                            \
    r_t(em_multinomial(v == 0 ? mi : v == 1 ? scal : v == 2 ? img : v == 3 ? em_zeros(F, EM_SHAPE(2, 0))    \
                       : v == 4 ? em_full(F, EM_SHAPE(3), -1) : em_full(F, EM_SHAPE(3), NAN), 1, v == 5)))  \
  X("em_split", N_BIG, FAIL, r_i(em_split(m, v == 0 ? 0 : BIG[v], 1, (em_tensor *[4]){0}, v == 1 ? INT32_MIN : 4))) \
  X("em_split", 2, FAIL, r_i(em_split(v ? scal : m, 1, 0, v ? (em_tensor *[4]){0} : NULL, v ? 4 : 1)))     \
  X("em_split_sizes", 5, FAIL,                                                                            \
    r_i(em_split_sizes(m, v == 0 ? -1 : v == 1 ? INT32_MAX : 2, (v == 2 ? NULL : v == 3 ? (const int64_t[]){INT64_MAX, INT64_MAX} \
                       : (const int64_t[]){4, -1}), 1, v == 1 ? NULL : (em_tensor *[2]){0})))             \
  X("em_chunk", 3, FAIL, r_i(em_chunk(m, v == 0 ? 0 : v == 1 ? INT32_MIN : 3, 1, (em_tensor *[1]){0}, v == 2 ? 1 : 4))) \
  X("em_tril", 2, FAIL, r_t(em_tril(v ? scal : v3, INT64_MAX)))                                           \
  X("em_triu", 2, FAIL, r_t(em_triu(v ? scal : v3, INT64_MIN)))                                           \
  X("em_clip_grad_norm_", 7, FAIL,                                                                        \
    r_t(em_clip_grad_norm_(v == 0 ? -1 : v == 1 ? INT32_MIN : 1, v == 2 ? NULL : (em_tensor *[]){leaf},    \
                           v == 3 ? -1 : v == 4 ? NAN : 1, v == 5 ? 0 : v == 6 ? -INFINITY : 2)))         \
  X("em_clip_grad_norm_", 1, FAIL, r_t(em_clip_grad_norm_(1, (em_tensor *[]){EM_NONE}, 1, 2)))          \
  /* movement ops: other bad arguments */                                                                 \
  X("em_slice", 3, FAIL, r_t(em_slice(m, 1, 0, 2, v == 0 ? 0 : v == 1 ? -1 : INT64_MIN)))                 \
  X("em_pad", 7, FAIL,                                                                                    \
    r_t(em_pad(m, v == 0 ? -1 : v == 1 ? 3 : v == 2 ? 18 : 2,                                             \
               v == 3 ? NULL : v == 4 ? (const int64_t[]){-5, 0} : v == 5 ? (const int64_t[]){INT64_MAX, INT64_MAX} \
                                                      : (const int64_t[]){INT64_MIN, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0))) \
  X("em_cat", 4, FAIL,                                                                                    \
    r_t(v == 0 ? em_cat(-1, ((em_tensor *[]){m}), 0) : v == 1 ? em_cat(2, NULL, 0)                        \
        : v == 2 ? em_cat(2, ((em_tensor *[]){m, v3}), 0) : em_cat(2, ((em_tensor *[]){scal, scal}), 0)))       \
  X("em_gather", 4, FAIL,                                                                                 \
    r_t(em_gather(m, 1, v == 0 ? em_full(EM_I64, EM_SHAPE(2, 1), INT64_MIN) : v == 1 ? em_zeros(F, EM_SHAPE(2, 1)) \
                        : v == 2 ? em_zeros(EM_I64, EM_SHAPE(2)) : em_full(EM_I32, EM_SHAPE(2, 1), -4))))  \
  X("em_index_select", 3, FAIL,                                                                           \
    r_t(em_index_select(m, 0, v == 0 ? em_full(EM_I64, EM_SHAPE(1), (double)((int64_t)1 << 62)) : v == 1 ? idx : em_ones(F, EM_SHAPE(1))))) \
  X("em_scatter_add", 2, FAIL,                                                                            \
    r_t(em_scatter_add(m, 1, v == 0 ? em_full(EM_I64, EM_SHAPE(2, 3), 3) : idx,                            \
                       v == 1 ? em_ones(F, EM_SHAPE(1, 1)) : v == 2 ? mi : m)))                           \
  X("em_slice_scatter", 3, FAIL,                                                                          \
    r_t(em_slice_scatter(m, v == 0 ? v3 : v == 1 ? mi : em_ones(F, EM_SHAPE(2, 1)), 1, 0, v == 2 ? 3 : 2, v == 2 ? 0 : 1))) \
  /* pointwise: dtypes and shapes */                                                                      \
  X("em_add", 2, FAIL, r_t(em_add(m, v ? em_ones(F, EM_SHAPE(3, 2)) : em_ones(F, EM_SHAPE(2, 3, 4)))))    \
  X("em_remainder", 1, FAIL, r_t(em_remainder(mi, em_zeros(EM_I64, EM_SHAPE(2, 3)))))                     \
  X("em_remainder_scalar", 1, FAIL, r_t(em_remainder_scalar(mi, 0)))                                      \
  X("em_neg", 1, FAIL, r_t(em_neg(mb)))                                                                   \
  X("em_sub", 1, FAIL, r_t(em_sub(mb, mb)))                                                               \
  X("em_masked_fill", 2, FAIL, r_t(em_masked_fill(m, v ? m : em_ones(EM_BOOL, EM_SHAPE(4)), 0)))          \
  X("em_masked_select", 2, FAIL, r_t(em_masked_select(m, v ? m : em_ones(EM_BOOL, EM_SHAPE(4)))))         \
  /* matmul and convolution */                                                                            \
  X("em_matmul", 4, FAIL,                                                                                 \
    r_t(v == 0 ? em_matmul(m, m) : v == 1 ? em_matmul(m, mi) : v == 2 ? em_matmul(scal, m) : em_matmul(mb, mb))) \
  X("em_conv2d", N_CONV, FAIL, r_t(em_conv2d(img, wt, EM_NONE, conv_bad(v))))                              \
  X("em_conv2d", 4, FAIL,                                                                                 \
    r_t(em_conv2d(v == 0 ? m : img, v == 1 ? m : v == 2 ? em_ones(EM_F64, EM_SHAPE(4, 3, 3, 3)) : wt,      \
                  v == 3 ? m : EM_NONE, EM_CONV2D_DEFAULT)))                                              \
  X("em_conv2d_backward_input", 5, FAIL,                                                                  \
    r_t(em_conv2d_backward_input(em_ones(F, EM_SHAPE(1, 4, 4, 4)), wt, hw_bad(v), v == 4 ? conv_bad(0) : EM_CONV2D_DEFAULT))) \
  X("em_conv2d_backward_weight", 5, FAIL,                                                                 \
    r_t(em_conv2d_backward_weight(img, em_ones(F, EM_SHAPE(1, 4, 4, 4)), khw_bad(v), v == 4 ? conv_bad(4) : EM_CONV2D_DEFAULT))) \
  /* in-place */                                                                                          \
  X("em_add_", 4, FAIL,                                                                                   \
    r_t(v == 0 ? em_add_(v3, m) : v == 1 ? em_add_(mi, m) : v == 2 ? em_add_(leaf, m) : em_add_(em_expand(v3, EM_SHAPE(2, 3)), m))) \
  X("em_mul_scalar_", 1, FAIL, r_t(em_mul_scalar_(mi, 0.5)))                                              \
  X("em_copy_", 2, FAIL, r_t(em_copy_(v ? v3 : m, v ? m : em_ones(F, EM_SHAPE(4)))))                      \
  X("em_requires_grad_", 2, FAIL, r_t(em_requires_grad_(v ? mb : mi, true)))                              \
  /* autograd */                                                                                          \
  X("em_backward", 4, FAIL,                                                                               \
    r_b(v == 0 ? em_backward(em_mul(leaf, leaf), NULL) : v == 1 ? em_backward(m, NULL)                    \
        : v == 2 ? em_backward(em_mul(leaf, leaf), v3) : em_backward(em_sum(leaf, 0, NULL, false), em_ones(EM_F64, EM_SHAPE(1))))) \
  X("em_backward", 1, FAIL, grad_twice())                                                                 \
  X("em_grad", 4, FAIL,                                                                                   \
    r_b(em_grad(v == 0 ? -1 : 1, (em_tensor *[]){em_sum(leaf, 0, NULL, false)}, NULL, v == 1 ? -1 : v == 2 ? 1 : 1, \
                v == 3 ? NULL : (em_tensor *[]){v == 2 ? m : leaf}, (em_tensor *[]){NULL}, false, false)))  \
  /* nn */                                                                                                \
  X("em_layer_norm", 5, FAIL,                                                                             \
    r_t(em_layer_norm(m, v == 0 ? 0 : v == 1 ? -1 : v == 2 ? 3 : 1, v == 3 ? m : EM_NONE, v == 4 ? m : EM_NONE, 1e-5))) \
  X("em_rms_norm", 3, FAIL, r_t(em_rms_norm(m, v == 0 ? 0 : v == 1 ? INT32_MAX : 1, v == 2 ? m : EM_NONE, 1e-5))) \
  X("em_batch_norm", 3, FAIL,                                                                             \
    r_t(em_batch_norm(v == 0 ? v3 : m, v == 1 ? em_zeros(F, EM_SHAPE(5)) : EM_NONE, EM_NONE, v == 2 ? em_ones(F, EM_SHAPE(5)) : EM_NONE, EM_NONE, true, 0.1, 1e-5))) \
  X("em_linear", 3, FAIL,                                                                                 \
    r_t(em_linear(m, v == 0 ? em_ones(F, EM_SHAPE(2, 4)) : em_ones(F, EM_SHAPE(4, 3)), v == 1 ? m : v == 2 ? em_ones(F, EM_SHAPE(5)) : EM_NONE))) \
  X("em_dropout", 4, FAIL, r_t(em_dropout(m, v == 0 ? -0.1 : v == 1 ? 1.5 : v == 2 ? NAN : INFINITY, true))) \
  X("em_cross_entropy", 5, FAIL,                                                                          \
    r_t(em_cross_entropy(v == 4 ? v3 : m,                                                                 \
                         v == 0 ? em_zeros(F, EM_SHAPE(2)) : v == 1 ? em_full(EM_I64, EM_SHAPE(2), 3)     \
                         : v == 2 ? em_zeros(EM_I64, EM_SHAPE(5)) : em_zeros(EM_I64, EM_SHAPE(2)),        \
                         ce_opts(v == 3 ? 1.5 : 0, EM_REDUCE_MEAN)))) \
  X("em_cross_entropy", 1, FAIL,                                                                          \
    r_t(em_cross_entropy(m, em_zeros(EM_I64, EM_SHAPE(2)), ce_opts(0, (em_reduction)42)))) \
  X("em_nll_loss", 3, FAIL,                                                                               \
    r_t(em_nll_loss(m, v == 0 ? em_full(EM_I64, EM_SHAPE(2), -5) : em_zeros(EM_I64, EM_SHAPE(2)), -100,    \
                    v == 1 ? (em_reduction)42 : v == 2 ? (em_reduction)-1 : EM_REDUCE_MEAN)))             \
  X("em_mse_loss", 2, FAIL, r_t(em_mse_loss(m, v ? m : em_ones(F, EM_SHAPE(4)), v ? (em_reduction)7 : EM_REDUCE_MEAN)))        \
  X("em_embedding", 4, FAIL,                                                                              \
    r_t(em_embedding(v == 0 ? em_zeros(F, EM_SHAPE(2)) : v == 1 ? em_full(EM_I64, EM_SHAPE(2), 2)         \
                     : v == 2 ? em_full(EM_I64, EM_SHAPE(2), INT64_MIN) : idx, v == 3 ? v3 : m)))         \
  X("em_max_pool2d", 7, FAIL,                                                                             \
    r_t(em_max_pool2d(v == 6 ? m : img, v == 0 ? 0 : v == 1 ? -1 : v == 2 ? INT64_MIN : 2, 2, v == 3 ? -1 : 2, 2, \
                      v == 4 ? 2 : v == 5 ? INT64_MIN : 0, 0)))                                           \
  X("em_avg_pool2d", 7, FAIL,                                                                             \
    r_t(em_avg_pool2d(v == 6 ? m : img, v == 0 ? 0 : v == 1 ? -1 : v == 2 ? INT64_MAX : 2, 2, v == 3 ? -2 : 2, 2, \
                      v == 4 ? 2 : v == 5 ? -1 : 0, 0)))                                                  \
  X("em_scaled_dot_product_attention", 4, FAIL,                                                           \
    r_t(em_scaled_dot_product_attention(em_ones(F, EM_SHAPE(1, 2, 4)), v == 0 ? em_ones(F, EM_SHAPE(1, 2, 5)) : em_ones(F, EM_SHAPE(1, 2, 4)), \
                                        v == 1 ? em_ones(F, EM_SHAPE(1, 3, 4)) : em_ones(F, EM_SHAPE(1, 2, 4)), false, \
                                        v == 2 ? 2.0 : v == 3 ? NAN : 0.0, 0)))                           \
  X("em_one_hot", 5, FAIL,                                                                                \
    r_t(em_one_hot(v == 3 ? em_zeros(F, EM_SHAPE(2)) : v == 4 ? em_full(EM_I64, EM_SHAPE(2), -1) : em_zeros(EM_I64, EM_SHAPE(2)), \
                   v == 0 ? -2 : v == 1 ? 0 : v == 2 ? INT64_MAX : 3)))                                   \
  /* torch's keyword options (issue 21) */                                                                \
  X("em_add_alpha", 5, FAIL,                                                                              \
    r_t(em_add_alpha(v == 3 ? m : mi, v == 3 ? em_ones(F, EM_SHAPE(4)) : v == 4 ? EM_NONE : mi, v == 0 ? 0.5 : v == 1 ? NAN : v == 2 ? 1e300 : 2))) \
  X("em_sub_alpha", 2, FAIL, r_t(em_sub_alpha(v ? mb : mi, v ? mb : mi, v ? 2 : -INFINITY)))              \
  X("em_div_mode", 4, FAIL,                                                                               \
    r_t(em_div_mode(v == 0 ? mb : v == 3 ? EM_NONE : mi, v == 0 ? mb : v == 2 ? em_zeros(EM_I64, EM_SHAPE(3)) : mi, \
                    v == 1 ? (em_rounding_mode)-1 : EM_ROUND_FLOOR)))                                     \
  X("em_embedding_ex", 4, FAIL,                                                                           \
    r_t(em_embedding_ex(idx, m, ((em_embedding_opts){true, v == 0 ? 2 : v == 1 ? -3 : v == 2 ? INT64_MAX : INT64_MIN})))) \
  X("em_max_pool2d_ex", 5, FAIL, r_t(em_max_pool2d_ex(img, pool_bad(v, true))))                           \
  X("em_avg_pool2d_ex", 5, FAIL, r_t(em_avg_pool2d_ex(img, pool_bad(v, false))))                          \
  X("em_max_pool2d_ex", 1, OK, r_t(em_max_pool2d_ex(img, pool_bad(5, true))))                             \
  X("em_nll_loss_ex", 3, FAIL,                                                                            \
    r_t(em_nll_loss_ex(m, idx, ((em_nll_loss_opts){-100, v == 2 ? (em_reduction)9 : EM_REDUCE_MEAN, v == 0 ? v3 : v == 1 ? mi : EM_NONE}))))  \
  X("em_cross_entropy", 2, FAIL,                                                                          \
    r_t(em_cross_entropy(m, em_zeros(EM_I64, EM_SHAPE(2)), ((em_cross_entropy_opts){-100, 0, EM_REDUCE_MEAN, v ? m : em_ones(EM_F64, EM_SHAPE(3))})))) \
  X("em_conv2d", 2, FAIL,                                                                                 \
    r_t(em_conv2d(img, wt, EM_NONE, ((em_conv2d_params){{v ? 2 : 1, 1}, {0, 0}, {1, 1}, 1, v ? EM_CONV_PAD_SAME : (em_conv_padding)-3})))) \
  X("em_init_uniform_", 3, FAIL, r_t(em_init_uniform_(v == 2 ? mi : m, v == 0 ? 2 : v == 1 ? NAN : 0, 1))) \
  X("em_init_kaiming_uniform_", 2, FAIL, r_t(em_init_kaiming_uniform_(v ? scal : v3, 0)))                 \
  X("em_linear_layer_init", N_BIG, FAIL, r_b(em_linear_layer_init(&(em_linear_layer){0}, 3, BIG[v], true))) \
  X("em_linear_layer_init", 1, FAIL, r_b(em_linear_layer_init(&(em_linear_layer){0}, INT64_MAX, INT64_MAX, true))) \
  X("em_conv2d_layer_init", 8, FAIL, /* not 3, 5: padding and dilation too big for an input */        \
    r_b(em_conv2d_layer_init(&(em_conv2d_layer){0}, 3, 4, 3, 3, conv_bad((int[]){0, 1, 2, 4, 6, 7, 8, 9}[v]), true)))                      \
  X("em_conv2d_layer_init", N_BIG, FAIL,                                                                  \
    r_b(em_conv2d_layer_init(&(em_conv2d_layer){0}, 3, 4, BIG[v], 3, EM_CONV2D_DEFAULT, true)))           \
  /* optimizers */                                                                                        \
  X("em_sgd_new", 6, FAIL,                                                                                \
    r_p(em_sgd_new(v == 0 ? -1 : 1, v == 1 ? NULL : (em_tensor *[]){v == 2 ? m : leaf},                   \
                   v == 3 ? EM_SGD_DEFAULT(-0.1) : v == 4 ? EM_SGD_DEFAULT(NAN)                            \
                   : v == 5 ? sgd_momentum(-1) : EM_SGD_DEFAULT(0.1))))                \
  X("em_adamw_new", 5, FAIL,                                                                              \
    r_p(em_adamw_new(1, ((em_tensor *[]){leaf}), adamw_bad(v))))                             \
  X("em_optimizer_step", 1, FAIL, r_b(em_optimizer_step(NULL)))                                           \
  /* files and data */                                                                                    \
  X("em_load_npy", 5, FAIL, bad_file(0, v))                                                               \
  X("em_load_idx", 5, FAIL, bad_file(1, v))                                                               \
  X("em_load", 5, FAIL, bad_file(2, v))                                                                   \
  X("em_fashion_mnist_load", 5, FAIL, bad_file(3, v))                                                     \
  X("em_load", 3, FAIL,                                                                                   \
    r_b(em_load(path_of("x"), v == 0 ? -1 : 1, v == 1 ? NULL : (em_tensor *[]){m}, v == 2 ? NULL : (const char *[]){"m"}))) \
  X("em_save", 5, FAIL,                                                                                   \
    r_b(em_save(v == 0 ? NULL : v == 1 ? "/nonexistent/dir/x.embr" : path_of("s"), v == 2 ? -1 : 1,       \
                v == 3 ? NULL : (em_tensor *[]){m}, v == 4 ? (const char *[]){NULL} : (const char *[]){"m"}))) \
  X("em_save_npy", 2, FAIL, r_b(em_save_npy(v ? "/nonexistent/dir/x.npy" : NULL, m)))                     \
  X("em_batch_iter_new", 4, FAIL,                                                                         \
    r_p(em_batch_iter_new(v == 0 ? -1 : v == 3 ? INT64_MAX : 10, v == 1 ? 0 : v == 2 ? -5 : 1, true, 1, false))) \
  X("em_batch_iter_next", 1, SILENT, r_t(em_batch_iter_next(NULL)))                                         \
  X("em_loader_new", 7, FAIL,                                                                             \
    r_p(em_loader_new(v == 0 ? -1 : 1, v == 1 ? NULL : ((em_tensor *[]){v == 2 ? NULL : v == 3 ? scal : m}), \
                      v == 4 ? NULL                                                                       \
                             : (&(em_loader_opts){.batch_size = v == 5 ? INT64_MIN : 1, .workers = v == 6 ? INT32_MAX : 1})))) \
  X("em_loader_next", 1, SILENT, r_p(em_loader_next(NULL)))                                               \
  X("em_item", 1, FAIL, item_of_big())                                                                    \
  X("em_to_buffer", 3, FAIL, r_b(em_to_buffer(m, F, v == 0 ? NULL : buf, v == 1 ? 4 : v == 2 ? 0 : sizeof buf))) \
  X("em_to", 2, FAIL, r_t(em_to(m, v ? (em_device)-1 : (em_device)42)))                                   \
  /* compiled functions */                                                                                \
  X("em_compile", 2, FAIL,                                                                                \
    r_p(em_compile(v ? identity_fn : NULL, v ? &(em_compile_options){.backend = "no-such-backend"} : NULL))) \
  X("em_call", 2, FAIL, compiled_call(v))                                                                 \
  X("em_call_opaque", 1, FAIL, r_o(em_call_opaque(many_fn, NULL, m)))                                     \
  X("em_explain", 1, FAIL, r_p(em_explain(NULL, NULL, m)))                                                \
  /* extreme values and every dtype: accepted or refused cleanly */                                   \
  X(UN[v / N_DTS].name, N_UN * N_DTS, ANY, r_t(UN[v / N_DTS].f(extremes(DTS[v % N_DTS], false), EM_HERE))) \
  X(UN[v / N_DTS].name, N_UN * N_DTS, ANY, r_t(UN[v / N_DTS].f(empty_of(DTS[v % N_DTS]), EM_HERE)))       \
  X(BIN[v / N_DTS].name, N_BIN * N_DTS, ANY,                                                              \
    r_t(BIN[v / N_DTS].f(extremes(DTS[v % N_DTS], false), partner_for(v / N_DTS, DTS[v % N_DTS]), EM_HERE))) \
  X(BIN[v / (N_MIX * N_MIX)].name, N_BIN * N_MIX * N_MIX, ANY,                                            \
    r_t(BIN[v / (N_MIX * N_MIX)].f(extremes(MIX[v % N_MIX], false), partner_for(v / (N_MIX * N_MIX), MIX[v / N_MIX % N_MIX]), EM_HERE))) \
  X(SC[v / (N_SCV * 3)].name, N_SC * N_SCV * 3, ANY,                                                      \
    r_t(SC[v / (N_SCV * 3)].f(extremes((em_dtype[]){EM_I64, EM_U8, EM_F32}[v / N_SCV % 3], false), SCV[v % N_SCV], EM_HERE))) \
  X(RED[v / (N_DTS * 2)].name, N_RED * N_DTS * 2, ANY,                                                    \
    r_t(RED[v / (N_DTS * 2)].f(v % 2 ? empty_of(DTS[v / 2 % N_DTS]) : extremes(DTS[v / 2 % N_DTS], false), \
                               v % 4 < 2 ? 0 : 1, (const int64_t[]){0}, v % 3 == 0, EM_HERE)))              \
  X((v % 2 ? "em_argmax" : "em_argmin"), N_DTS * 2, ANY,                                                  \
    r_t((v % 2 ? em_argmax_at : em_argmin_at)(extremes(DTS[v / 2], false), v % 4 < 2 ? EM_ALL_AXES : 1, false, EM_HERE))) \
  X("em_cast", N_DTS * N_DTS, ANY, r_t(em_cast(extremes(DTS[v / N_DTS], false), DTS[v % N_DTS])))           \
  X(LM[v / (N_DTS * 2)], N_LM * N_DTS * 2, ANY,                                                           \
    r_t(lm_op(v / (N_DTS * 2), v % 2 ? empty_of(DTS[v / 2 % N_DTS]) : extremes(DTS[v / 2 % N_DTS], false)))) \
  X("em_to_buffer", N_DTS * N_DTS, ANY,                                                                   \
    r_b(em_to_buffer(extremes(DTS[v / N_DTS], false), DTS[v % N_DTS], buf, sizeof buf)))                  \
  /* extreme but valid: these must succeed */                                                             \
  X("em_slice", 3, OK, r_t(em_slice(m, 1, v == 0 ? INT64_MIN : 1, v == 1 ? INT64_MIN : INT64_MAX, v == 2 ? INT64_MAX : 1))) \
  X("em_zeros", 2, OK, r_t(em_zeros(F, v ? 2 : 1, (const int64_t[]){0, INT64_MAX})))                     \
  X("em_expand", 1, OK, r_t(em_expand(em_zeros(F, EM_SHAPE(0, 1)), EM_SHAPE(0, INT64_MAX))))               \
  X("em_reshape", 1, OK, r_t(em_reshape(em_zeros(F, EM_SHAPE(0, 4)), EM_SHAPE(INT64_MAX, 0))))           \
  X("em_conv2d", 1, OK, r_t(em_conv2d(img, wt, EM_NONE, ((em_conv2d_params){{INT64_MAX, INT64_MAX}, {0, 0}, {1, 1}, 1})))) \
  X("em_max_pool2d", 1, OK, r_t(em_max_pool2d(img, 2, 2, INT64_MAX, INT64_MAX, 0, 0)))                  \
  X("em_clip_grad_norm_", 2, OK, r_t(em_clip_grad_norm_(v ? 1 : 0, v ? (em_tensor *[]){leaf} : NULL, INFINITY, v ? INFINITY : 1e300)))

#define COUNT(op, n, e, call) +(n)
enum { N_CASES = 0 BAD_CASES(COUNT) };

/* Runs case k; fills its op name, variant and expectation. */
static int run_case(int k, const char **op, int *variant, int *expect) {
  int base = 0;
#define RUN(OP, N, E, CALL)                   \
  if (k < base + (N)) {                       \
    int v = k - base;                         \
    *op = (OP), *variant = v, *expect = (E);  \
    return (CALL);                            \
  }                                           \
  base += (N);
  BAD_CASES(RUN)
#undef RUN
  return -1;
}

/* One case in a child: exit 0 clean, 10 wrong result or unclear error, 11 leak; anything else (a
 * signal, a sanitizer's exit status) is a crash. */
static int child(int k) {
  em_scope_begin();
  operands();
  em_clear_error();
  const char *op;
  int v, expect;
  int failed = run_case(k, &op, &v, &expect);
  const char *e = em_last_error();
  int status = 0;
  if (expect == FAIL) {
    if (failed != 1 || !e || !strstr(e, op) || !strstr(e, "test_badargs.c:")) {
      fprintf(stderr, "case %d (%s, variant %d): %s; error: %s\n", k, op, v,
              failed != 1 ? "returned a result" : "unclear error", e ? e : "(none)");
      status = 10;
    }
  } else if (expect == ANY) {
    bool clean = failed == 0 ? !e : failed == 1 && e && strstr(e, op) && strstr(e, "test_badargs.c:");
    if (!clean) {
      fprintf(stderr, "case %d (%s, variant %d): %s; error: %s\n", k, op, v,
              failed == 0 ? "a result with an error recorded" : "unclear error", e ? e : "(none)");
      status = 10;
    }
  } else if (expect == SILENT) {
    if (failed != 1 || e) {
      fprintf(stderr, "case %d (%s, variant %d): expected a silent failure; error: %s\n", k, op, v, e ? e : "(none)");
      status = 10;
    }
  } else if (failed != 0 || e) {
    fprintf(stderr, "case %d (%s, variant %d): a valid call failed: %s\n", k, op, v, e ? e : "(no error)");
    status = 10;
  }
  em_clear_error();
  em_scope_end();
  em_thread_cleanup();
  if (!status && em_debug_live_tensors() != 0) {
    fprintf(stderr, "case %d (%s, variant %d): %lld tensors leaked\n", k, op, v, (long long)em_debug_live_tensors());
    status = 11;
  }
  return status ? status : failed == 1 ? 20 : 0; /* 20: a clean refusal */
}

Test(badargs, every_op_times_bad_inputs, .timeout = 600) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/ember_badargs.XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
  int crashed = 0, wrong = 0, leaked = 0, refused = 0;
  char names[2048] = "";
  for (int k = 0; k < N_CASES; k++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(child(k));
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    int code = WIFSIGNALED(st) ? -1 : WEXITSTATUS(st);
    refused += code == 20;
    int bad = code == 0 || code == 20 ? 0 : code == 10 ? 1 : code == 11 ? 2 : 3;
    crashed += bad == 3, wrong += bad == 1, leaked += bad == 2;
    if (bad) {
      size_t l = strlen(names);
      static const char *what[] = {"", "wrong", "leak", "crash"};
      if (l < sizeof names - 64) snprintf(names + l, sizeof names - l, " %d(%s)", k, what[bad]);
    }
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  (void)!system(cmd);
  fprintf(stderr, "bad-argument table: %d calls, %d clean (%d refused with an error, %d accepted), %d crashed, %d wrong or "
          "unclear, %d leaked\n", N_CASES, N_CASES - crashed - wrong - leaked, refused, N_CASES - crashed - wrong - leaked - refused,
          crashed, wrong, leaked);
  cr_assert(crashed == 0 && wrong == 0 && leaked == 0, "cases:%s", names);
}
