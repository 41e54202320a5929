/* tests/test_cuda_eager.c: eager CUDA execution against the CPU reference.
 *
 * Every test computes the same thing from the same inputs on the CPU and on CUDA and compares.
 * On a machine with a GPU this runs on it; without one it runs on the host emulator
 * (runtime/cuda_emu.c: the same generated CUDA C, built by the host C++ compiler, run one
 * thread per block), and says so loudly: what it then checks is the device runtime's host side
 * and the kernels' indexing and arithmetic, not the GPU itself. EMBER_TEST_CUDA=emulate forces
 * the emulator on a GPU machine. */
#include "common.h"
#include "../runtime/cuda.h"
#include <time.h>

static void setup(void) {
  etest_pick_cuda();
  cr_assert(em_cuda_is_available(), "no CUDA device and no emulator");
}

static void dev_end(void) {
  em_cuda_memory_stats s = em_cuda_memory_stats_get();
  cr_assert_eq(s.allocated_bytes, 0, "%lld device bytes still allocated", (long long)s.allocated_bytes);
}

TestSuite(cuda_eager, .init = setup, .fini = dev_end);

#define F EM_F32
#define D EM_F64
#define C(x) em_to((x), EM_CUDA)

/* a (CPU) and b (CUDA, or CPU) agree in dtype, shape and values within tol * (1 + |a|). */
static void same(em_tensor *a, em_tensor *b, double tol, em_device want, const char *what, int line) {
  cr_assert(a && b, "line %d, %s: %s", line, what, em_last_error() ? em_last_error() : "NULL");
  cr_assert_eq(em_device_of(a), EM_CPU, "line %d: the reference is not on the CPU", line);
  cr_assert_eq(em_device_of(b), want, "line %d, %s: result on the wrong device", line, what);
  cr_assert_eq(em_dtype_of(a), em_dtype_of(b), "line %d, %s: dtype %s vs %s", line, what, em_dtype_name(em_dtype_of(a)),
               em_dtype_name(em_dtype_of(b)));
  cr_assert_eq(em_ndim(a), em_ndim(b), "line %d, %s: rank", line, what);
  for (int d = 0; d < em_ndim(a); d++) cr_assert_eq(em_size(a, d), em_size(b, d), "line %d, %s: size of dim %d", line, what, d);
  int64_t n = em_numel(a);
  double *va = malloc(sizeof(double) * (size_t)(n + 1)), *vb = malloc(sizeof(double) * (size_t)(n + 1));
  cr_assert(em_to_buffer(a, D, va, sizeof(double) * (size_t)n) && em_to_buffer(b, D, vb, sizeof(double) * (size_t)n),
            "line %d: %s", line, em_last_error());
  for (int64_t i = 0; i < n; i++) {
    bool ok = (isnan(va[i]) && isnan(vb[i])) || va[i] == vb[i] || fabs(va[i] - vb[i]) <= tol * (1 + fabs(va[i]));
    if (!ok) {
      double x = va[i], y = vb[i];
      free(va), free(vb);
      cr_assert_fail("line %d, %s: element %lld: cpu %.9g, cuda %.9g", line, what, (long long)i, x, y);
    }
  }
  free(va), free(vb);
}
#define SAME(a, b, tol) same((a), (b), (tol), EM_CUDA, #b, __LINE__)
#define SAME_CPU(a, b, tol) same((a), (b), (tol), EM_CPU, #b, __LINE__)

static em_tensor *rnd(em_dtype dt, int ndim, const int64_t *sizes) { return em_cast(em_randn(F, ndim, sizes), dt); }

typedef em_tensor *(*unary)(em_tensor *);
typedef em_tensor *(*binary)(em_tensor *, em_tensor *);
#define U(name, expr) static em_tensor *name(em_tensor *a) { return expr; }
#define B(name, expr) static em_tensor *name(em_tensor *a, em_tensor *b) { return expr; }
U(u_neg, em_neg(a)) U(u_abs, em_abs(a)) U(u_exp, em_exp(a)) U(u_log, em_log(em_abs(a))) U(u_log1p, em_log1p(em_abs(a)))
U(u_expm1, em_expm1(a)) U(u_sqrt, em_sqrt(em_abs(a))) U(u_rsqrt, em_rsqrt(em_abs(a))) U(u_sin, em_sin(a)) U(u_cos, em_cos(a))
U(u_tanh, em_tanh(a)) U(u_erf, em_erf(a)) U(u_sign, em_sign(a)) U(u_floor, em_floor(a)) U(u_ceil, em_ceil(a))
U(u_recip, em_reciprocal(a)) U(u_not, em_logical_not(a)) U(u_relu, em_relu(a)) U(u_sigmoid, em_sigmoid(a))
B(b_add, em_add(a, b)) B(b_sub, em_sub(a, b)) B(b_mul, em_mul(a, b)) B(b_div, em_div(a, b)) B(b_max, em_maximum(a, b))
B(b_min, em_minimum(a, b)) B(b_rem, em_remainder(a, b)) B(b_atan2, em_atan2(a, b)) B(b_pow, em_pow(em_abs(a), b)) B(b_eq, em_eq(a, b)) B(b_ne, em_ne(a, b))
B(b_lt, em_lt(a, b)) B(b_le, em_le(a, b)) B(b_gt, em_gt(a, b)) B(b_ge, em_ge(a, b)) B(b_and, em_logical_and(a, b))
B(b_or, em_logical_or(a, b)) B(b_where, em_where(em_gt(a, b), a, b))

static const unary unaries[] = {u_neg, u_abs, u_exp, u_log, u_log1p, u_expm1, u_sqrt, u_rsqrt, u_sin, u_cos,
                                u_tanh, u_erf, u_sign, u_floor, u_ceil, u_recip, u_not, u_relu, u_sigmoid};
static const binary binaries[] = {b_add, b_sub, b_mul, b_div, b_max, b_min, b_rem, b_atan2, b_pow, b_eq,
                                  b_ne, b_lt, b_le, b_gt, b_ge, b_and, b_or, b_where};

ETEST(cuda_eager, pointwise_contiguous_broadcast_strided) {
  em_manual_seed(1);
  em_tensor *x = rnd(F, EM_SHAPE(5, 7)), *y = rnd(F, EM_SHAPE(5, 7)), *xt = em_transpose(rnd(F, EM_SHAPE(7, 5)), 0, 1);
  em_tensor *row = rnd(F, EM_SHAPE(1, 7)), *s = em_scalar(F, 0.75);
  em_tensor *dx = C(x), *dy = C(y), *dxt = em_transpose(C(em_contiguous(em_transpose(xt, 0, 1))), 0, 1), *drow = C(row);
  cr_assert(!em_is_contiguous(dxt));
  for (size_t i = 0; i < sizeof unaries / sizeof unaries[0]; i++) {
    em_scope_begin();
    SAME(unaries[i](x), unaries[i](dx), 2e-6);
    SAME(unaries[i](xt), unaries[i](dxt), 2e-6);
    em_scope_end();
  }
  for (size_t i = 0; i < sizeof binaries / sizeof binaries[0]; i++) {
    em_scope_begin();
    SAME(binaries[i](x, y), binaries[i](dx, dy), 2e-6);
    SAME(binaries[i](xt, row), binaries[i](dxt, drow), 2e-6); /* strided and broadcast operands */
    SAME(binaries[i](x, s), binaries[i](dx, s), 2e-6);        /* a CPU scalar joins CUDA operands */
    em_scope_end();
  }
}

ETEST(cuda_eager, dtypes_and_conversions) {
  em_manual_seed(2);
  const em_dtype dts[] = {D, EM_I32, EM_I64, EM_U8, EM_BOOL};
  em_tensor *base = em_mul_scalar(em_randn(D, EM_SHAPE(4, 6)), 5);
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    em_scope_begin();
    em_tensor *x = em_cast(em_abs(base), dts[i]), *y = em_cast(em_add_scalar(em_abs(em_flip(base, EM_AXES(1))), 1), dts[i]);
    em_tensor *dx = C(x), *dy = C(y);
    SAME(em_add(x, y), em_add(dx, dy), 1e-12);
    SAME(em_mul(x, y), em_mul(dx, dy), 1e-12);
    SAME(em_maximum(x, y), em_maximum(dx, dy), 0);
    SAME(em_lt(x, y), em_lt(dx, dy), 0);
    if (dts[i] != EM_BOOL) SAME(em_remainder(x, y), em_remainder(dx, dy), 1e-12);
    for (size_t j = 0; j < sizeof dts / sizeof dts[0]; j++) SAME(em_cast(x, dts[j]), em_cast(dx, dts[j]), 0);
    SAME(em_sum(x, EM_AXES(1), false), em_sum(dx, EM_AXES(1), false), 1e-12);
    em_scope_end();
  }
}

/* f16 and bf16 compute on the device in f32, rounded once per op; on the CPU the reference is
 * the f32 computation of the same (rounded) inputs, rounded to the type. */
ETEST(cuda_eager, half_types_compute_in_f32) {
  em_manual_seed(3);
  const em_dtype hs[] = {EM_F16, EM_BF16};
  for (int k = 0; k < 2; k++) {
    em_scope_begin();
    em_tensor *x = em_cast(em_randn(F, EM_SHAPE(8, 33)), hs[k]), *y = em_cast(em_randn(F, EM_SHAPE(8, 33)), hs[k]);
    em_tensor *xf = em_cast(x, F), *yf = em_cast(y, F), *dx = C(x), *dy = C(y);
    double ulp = hs[k] == EM_F16 ? 1e-3 : 8e-3;
    SAME(em_cast(em_add(xf, yf), hs[k]), em_add(dx, dy), ulp);
    SAME(em_cast(em_exp(xf), hs[k]), em_exp(dx), ulp);
    SAME(em_cast(em_mul(xf, yf), hs[k]), em_mul(dx, dy), ulp);
    /* the sum accumulates in f32: exact to the output's rounding */
    SAME(em_cast(em_sum(xf, EM_AXES(1), false), hs[k]), em_sum(dx, EM_AXES(1), false), 2 * ulp);
    /* GEMM: f32 accumulation */
    em_tensor *w = em_cast(em_randn(F, EM_SHAPE(33, 5)), hs[k]);
    SAME(em_cast(em_matmul(xf, em_cast(w, F)), hs[k]), em_matmul(dx, C(w)), 4 * ulp);
    EXPECT_ERROR(em_add(x, y), "has no CPU kernels");
    em_scope_end();
  }
}

ETEST(cuda_eager, reductions_over_any_axes) {
  em_manual_seed(4);
  em_tensor *x = rnd(F, EM_SHAPE(3, 4, 5)), *xp = em_permute(rnd(F, EM_SHAPE(5, 3, 4)), EM_AXES(1, 2, 0));
  em_tensor *dx = C(x), *dxp = em_permute(C(em_contiguous(em_permute(xp, EM_AXES(2, 0, 1)))), EM_AXES(1, 2, 0));
  const int64_t axes_sets[][3] = {{2}, {0}, {1}, {0, 2}, {0, 1, 2}};
  const int n_axes[] = {1, 1, 1, 2, 3};
  for (int i = 0; i < 5; i++)
    for (int keep = 0; keep < 2; keep++) {
      em_scope_begin();
      SAME(em_sum(x, n_axes[i], axes_sets[i], keep), em_sum(dx, n_axes[i], axes_sets[i], keep), 1e-5);
      SAME(em_sum(xp, n_axes[i], axes_sets[i], keep), em_sum(dxp, n_axes[i], axes_sets[i], keep), 1e-5);
      SAME(em_prod(x, n_axes[i], axes_sets[i], keep), em_prod(dx, n_axes[i], axes_sets[i], keep), 1e-5);
      SAME(em_amax(xp, n_axes[i], axes_sets[i], keep), em_amax(dxp, n_axes[i], axes_sets[i], keep), 0);
      SAME(em_amin(x, n_axes[i], axes_sets[i], keep), em_amin(dx, n_axes[i], axes_sets[i], keep), 0);
      em_scope_end();
    }
  for (int a = 0; a < 3; a++) {
    SAME(em_argmax(xp, a, false), em_argmax(dxp, a, false), 0);
    SAME(em_argmin(x, a, true), em_argmin(dx, a, true), 0);
  }
  /* rows longer than a block: each thread folds several elements before the tree */
  em_tensor *wide = em_floor(em_mul_scalar(rnd(F, EM_SHAPE(3, 1000)), 4)); /* many ties */
  SAME(em_sum(wide, EM_AXES(1), false), em_sum(C(wide), EM_AXES(1), false), 1e-5);
  SAME(em_argmax(wide, 1, false), em_argmax(C(wide), 1, false), 0);
  SAME(em_amin(wide, EM_AXES(0, 1), false), em_amin(C(wide), EM_AXES(0, 1), false), 0);
  /* few long rows reduce in two passes (partials per piece of a row, then those) */
  em_tensor *lng = em_floor(em_mul_scalar(rnd(F, EM_SHAPE(3, 1 << 17)), 8));
  SAME(em_sum(lng, EM_AXES(1), false), em_sum(C(lng), EM_AXES(1), false), 1e-6);
  SAME(em_sum(lng, 0, NULL, false), em_sum(C(lng), 0, NULL, false), 1e-6);
  SAME(em_amax(lng, EM_AXES(1), true), em_amax(C(lng), EM_AXES(1), true), 0);
  SAME(em_sum(em_cast(lng, EM_I32), 0, NULL, false), em_sum(C(em_cast(lng, EM_I32)), 0, NULL, false), 0);
  SAME(em_argmin(lng, 1, false), em_argmin(C(lng), 1, false), 0); /* one pass: indices */
  em_tensor *odd = rnd(D, EM_SHAPE(65537 * 2));                      /* no piece count divides it */
  SAME(em_sum(odd, 0, NULL, false), em_sum(C(odd), 0, NULL, false), 1e-12);
  /* ties go to the first index; NaN wins */
  em_tensor *t = T(F, SHAPE(2, 4), 1, 3, 3, 0, 2, NAN, 5, NAN);
  SAME(em_argmax(t, 1, false), em_argmax(C(t), 1, false), 0);
  SAME(em_amax(t, EM_AXES(1), false), em_amax(C(t), EM_AXES(1), false), 0);
  SAME(em_sum(em_cast(x, EM_I32), EM_AXES(1), false), em_sum(em_cast(dx, EM_I32), EM_AXES(1), false), 0);
}

ETEST(cuda_eager, movement_and_indexing) {
  em_manual_seed(5);
  em_tensor *x = rnd(F, EM_SHAPE(4, 6)), *dx = C(x);
  SAME(em_contiguous(em_transpose(x, 0, 1)), em_contiguous(em_transpose(dx, 0, 1)), 0);
  SAME(em_flip(x, EM_AXES(0, 1)), em_flip(dx, EM_AXES(0, 1)), 0);
  SAME(em_pad(x, 4, (int64_t[]){1, 2, 0, 3}, -1.5), em_pad(dx, 4, (int64_t[]){1, 2, 0, 3}, -1.5), 0);
  em_tensor *parts[3] = {x, em_slice(x, 1, 0, 2, 1), em_mul_scalar(x, 2)}, *dparts[3] = {dx, em_slice(dx, 1, 0, 2, 1), em_mul_scalar(dx, 2)};
  SAME(em_cat(3, parts, 1), em_cat(3, dparts, 1), 0);
  em_tensor *src = rnd(F, EM_SHAPE(4, 2));
  SAME(em_slice_scatter(x, src, 1, 1, 5, 2), em_slice_scatter(dx, C(src), 1, 1, 5, 2), 0);
  em_tensor *idx = T(EM_I64, SHAPE(4, 2), 0, 5, 3, 3, 1, 0, 5, 2), *didx = C(idx);
  SAME(em_gather(x, 1, idx), em_gather(dx, 1, didx), 0);
  em_tensor *sel = T(EM_I64, SHAPE(3), 2, 0, 2);
  SAME(em_index_select(x, 0, sel), em_index_select(dx, 0, C(sel)), 0);
  SAME(em_index_select(em_transpose(x, 0, 1), 1, sel), em_index_select(em_transpose(dx, 0, 1), 1, C(sel)), 0);
  em_tensor *add = rnd(F, EM_SHAPE(4, 2));
  SAME(em_scatter_add(x, 1, idx, add), em_scatter_add(dx, 1, didx, C(add)), 1e-6);
  EXPECT_ERROR(em_gather(dx, 1, C(T(EM_I64, SHAPE(4, 1), 0, 6, 0, 0))), "index 6 is out of bounds for axis 1 with size 6");
  em_tensor *emb = rnd(F, EM_SHAPE(10, 3)), *tok = T(EM_I64, SHAPE(2, 2), 9, 0, 4, 4);
  SAME(em_embedding(tok, emb), em_embedding(C(tok), C(emb)), 0);
}

ETEST(cuda_eager, creation_and_rng_match_the_cpu) {
  em_device prev = em_set_default_device(EM_CUDA);
  em_tensor *z = em_zeros(F, EM_SHAPE(3, 2)), *f = em_full(EM_I64, EM_SHAPE(4), 7), *a = em_arange(D, 1, 2, 0.25);
  em_tensor *e = em_eye(F, 3, 4), *s = em_scalar(EM_BOOL, 1);
  em_manual_seed(42);
  em_tensor *r = em_rand(F, EM_SHAPE(5, 3)), *n = em_randn(D, EM_SHAPE(7)), *n32 = em_randn(F, EM_SHAPE(9));
  em_tensor *ri = em_randint(-3, 10, EM_SHAPE(6));
  em_set_default_device(EM_CPU);
  cr_assert_eq(em_device_of(z), EM_CUDA);
  SAME(em_zeros(F, EM_SHAPE(3, 2)), z, 0);
  SAME(em_full(EM_I64, EM_SHAPE(4), 7), f, 0);
  SAME(em_arange(D, 1, 2, 0.25), a, 0);
  SAME(em_eye(F, 3, 4), e, 0);
  SAME(em_scalar(EM_BOOL, 1), s, 0);
  em_manual_seed(42); /* the same seed and offsets give the same numbers on both devices */
  SAME(em_rand(F, EM_SHAPE(5, 3)), r, 0);
  SAME(em_randn(D, EM_SHAPE(7)), n, 1e-15);
  SAME(em_randn(F, EM_SHAPE(9)), n32, 0);
  SAME(em_randint(-3, 10, EM_SHAPE(6)), ri, 0);
  em_set_default_device(prev);
}

ETEST(cuda_eager, matmul_layouts_and_batches) {
  em_manual_seed(6);
  em_tensor *a = rnd(F, EM_SHAPE(2, 5, 3)), *b = rnd(F, EM_SHAPE(2, 3, 4));
  em_tensor *da = C(a), *db = C(b);
  SAME(em_matmul(a, b), em_matmul(da, db), 1e-5);
  /* transposed operands go to cuBLAS as such; other layouts are copied first */
  em_tensor *at = em_transpose(em_contiguous(em_transpose(a, 1, 2)), 1, 2), *dat = C(em_contiguous(em_transpose(a, 1, 2)));
  dat = em_transpose(dat, 1, 2);
  SAME(em_matmul(at, b), em_matmul(dat, db), 1e-5);
  SAME(em_matmul(em_transpose(b, 1, 2), em_transpose(a, 1, 2)), em_matmul(em_transpose(db, 1, 2), em_transpose(da, 1, 2)), 1e-5);
  SAME(em_matmul(a, em_expand(em_slice(b, 0, 0, 1, 1), EM_SHAPE(2, 3, 4))),
       em_matmul(da, em_expand(em_slice(db, 0, 0, 1, 1), EM_SHAPE(2, 3, 4))), 1e-5);
  em_tensor *a2 = rnd(D, EM_SHAPE(6, 0)), *b2 = rnd(D, EM_SHAPE(0, 2));
  SAME(em_matmul(a2, b2), em_matmul(C(a2), C(b2)), 0);
  em_tensor *x = rnd(D, EM_SHAPE(7, 9)), *w = rnd(D, EM_SHAPE(4, 9)), *bias = rnd(D, EM_SHAPE(4));
  SAME(em_linear(x, w, bias), em_linear(C(x), C(w), C(bias)), 1e-12);
}

ETEST(cuda_eager, convolutions_and_pooling) {
  em_manual_seed(7);
  em_conv2d_params ps[] = {EM_CONV2D_DEFAULT, {{2, 1}, {1, 2}, {1, 2}, 1}, {{1, 1}, {1, 1}, {1, 1}, 2}};
  for (int i = 0; i < 3; i++) {
    em_scope_begin();
    int64_t g = ps[i].groups;
    em_tensor *x = rnd(F, EM_SHAPE(2, 4, 7, 6)), *w = rnd(F, EM_SHAPE(6, 4 / g, 3, 2)), *b = rnd(F, EM_SHAPE(6));
    em_requires_grad_(x, true), em_requires_grad_(w, true), em_requires_grad_(b, true);
    em_tensor *dx = em_detach(C(x)), *dw = em_detach(C(w)), *db = em_detach(C(b));
    em_requires_grad_(dx, true), em_requires_grad_(dw, true), em_requires_grad_(db, true);
    em_tensor *y = em_conv2d(x, w, b, ps[i]), *dy = em_conv2d(dx, dw, db, ps[i]);
    SAME(y, dy, 1e-5);
    em_tensor *up = rnd(F, em_ndim(y), em_sizes(y));
    em_backward(em_sum(em_mul(y, up), 0, NULL, false), NULL);
    em_backward(em_sum(em_mul(dy, C(up)), 0, NULL, false), NULL);
    SAME(em_get_grad(x), em_get_grad(dx), 1e-5);
    SAME(em_get_grad(w), em_get_grad(dw), 1e-5);
    SAME(em_get_grad(b), em_get_grad(db), 1e-5);
    em_scope_end();
  }
  em_tensor *x = rnd(F, EM_SHAPE(2, 3, 8, 8));
  SAME(em_max_pool2d(x, 2, 2, 2, 2, 0, 0), em_max_pool2d(C(x), 2, 2, 2, 2, 0, 0), 0);
}

ETEST(cuda_eager, autograd_through_composites) {
  em_manual_seed(8);
  em_tensor *x = rnd(F, EM_SHAPE(6, 10)), *w = rnd(F, EM_SHAPE(10)), *b = rnd(F, EM_SHAPE(10));
  em_tensor *tgt = T(EM_I64, SHAPE(6), 1, 9, 0, 3, 3, 7);
  em_tensor *ps[3] = {x, w, b}, *dps[3];
  for (int i = 0; i < 3; i++) {
    em_requires_grad_(ps[i], true);
    dps[i] = em_to(ps[i], EM_CUDA); /* non-leaves: gradients flow back through em_to */
  }
  em_tensor *losses[2];
  for (int k = 0; k < 2; k++) {
    em_tensor *const *p = k ? dps : ps;
    em_tensor *t = k ? C(tgt) : tgt;
    em_tensor *h = em_gelu(em_layer_norm(p[0], 1, p[1], p[2], 1e-5), true);
    em_tensor *l = em_add(em_cross_entropy(h, t, EM_CROSS_ENTROPY_DEFAULT),
                          em_mean(em_mul(em_softmax(h, 0), em_log_softmax(h, 1)), 0, NULL, false));
    losses[k] = l;
  }
  SAME(losses[0], losses[1], 1e-5);
  cr_assert_eq(em_device_of(losses[1]), EM_CUDA);
  em_tensor *g_cpu[3], *g_dev[3];
  cr_assert(em_grad(1, &losses[0], NULL, 3, ps, g_cpu, false, false));
  cr_assert(em_grad(1, &losses[1], NULL, 3, ps, g_dev, false, false));
  for (int i = 0; i < 3; i++) {
    SAME_CPU(g_cpu[i], g_dev[i], 1e-4); /* the gradient came back through em_to */
  }
}

ETEST(cuda_eager, sgd_training_matches_the_cpu) {
  em_manual_seed(9);
  em_tensor *w1 = em_mul_scalar(em_randn(F, EM_SHAPE(16, 8)), 0.3), *w2 = em_mul_scalar(em_randn(F, EM_SHAPE(3, 16)), 0.3);
  em_tensor *x = em_randn(F, EM_SHAPE(32, 8)), *y = em_randint(0, 3, EM_SHAPE(32));
  double loss[2][5];
  for (int k = 0; k < 2; k++) {
    em_scope_begin();
    em_tensor *p[2] = {em_keep(em_clone(k ? C(w1) : w1)), em_keep(em_clone(k ? C(w2) : w2))};
    em_tensor *xx = k ? C(x) : x, *yy = k ? C(y) : y;
    for (int i = 0; i < 2; i++) em_requires_grad_(p[i], true);
    em_optimizer *o = em_sgd_new(2, p, ((em_sgd_opts){0.1, 0.9, 0, 0, false}));
    for (int s = 0; s < 5; s++) {
      em_scope_begin();
      em_optimizer_zero_grad(o);
      em_tensor *l = em_cross_entropy(em_linear(em_relu(em_linear(xx, p[0], EM_NONE)), p[1], EM_NONE), yy,
                                      EM_CROSS_ENTROPY_DEFAULT);
      em_backward(l, NULL);
      cr_assert(em_optimizer_step(o), "%s", em_last_error());
      loss[k][s] = em_item(l);
      em_scope_end();
    }
    em_optimizer_free(o);
    em_scope_end();
  }
  for (int s = 0; s < 5; s++) cr_assert(fabs(loss[0][s] - loss[1][s]) < 1e-5, "step %d: %g vs %g", s, loss[0][s], loss[1][s]);
  cr_assert(loss[1][4] < loss[1][0]);
}

ETEST(cuda_eager, devices_copies_and_errors) {
  em_tensor *x = em_arange(F, 0, 12, 1), *dx = C(x);
  cr_assert_eq(em_device_of(dx), EM_CUDA);
  cr_assert_eq(em_to(dx, EM_CUDA), dx, "already there: the same tensor");
  SAME(x, dx, 0);
  em_tensor *back = em_to(em_transpose(em_reshape(dx, EM_SHAPE(3, 4)), 0, 1), EM_CPU);
  SAME(em_contiguous(em_transpose(em_reshape(x, EM_SHAPE(3, 4)), 0, 1)), C(back), 0);
  cr_assert_float_eq(em_item(em_sum(dx, 0, NULL, false)), 66.0, 0);
  char *s = em_format(em_slice(dx, 0, 0, 3, 1));
  cr_assert_str_eq(s, "tensor([0., 1., 2.], device='cuda:0')");
  free(s);
  EXPECT_ERROR(em_add(dx, x), "expected all operands on one device: operand 1 is f32[12] on cpu, operand 0 is f32[12] on cuda");
  /* in-place and copies across devices */
  em_tensor *h = em_zeros(F, EM_SHAPE(12));
  cr_assert(em_copy_(h, dx));
  SAME(x, C(h), 0);
  cr_assert(em_add_(dx, em_scalar(F, 1)));
  cr_assert(em_copy_(dx, x));
  SAME(x, dx, 0);
  EXPECT_ERROR(em_add_(h, dx), "writes into f32[12] on cpu from operands on cuda");
  em_tensor *im = C(em_ones(EM_I64, EM_SHAPE(2, 2)));
  EXPECT_ERROR(em_matmul(im, im), "em_matmul: has no CUDA kernel for integer operands");
  /* a large copy goes through the staging buffers in pieces */
  em_tensor *big = em_randn(F, EM_SHAPE(3 << 20)), *dbig = C(big);
  SAME(big, dbig, 0);
  SAME(em_mul_scalar(big, 2), em_mul_scalar(dbig, 2), 0);
}

ETEST(cuda_eager, streams_events_and_allocator) {
  em_cuda_empty_cache();
  em_cuda_memory_stats s0 = em_cuda_memory_stats_get();
  em_cuda_stream *st = em_cuda_stream_new();
  cr_assert_not_null(st);
  em_cuda_set_stream(st);
  em_cuda_event *e0 = em_cuda_event_record();
  em_tensor *x = em_to(em_ones(F, EM_SHAPE(1000)), EM_CUDA);
  em_tensor *y = em_mul_scalar(x, 3);
  em_cuda_event *e1 = em_cuda_event_record();
  cr_assert(em_cuda_event_synchronize(e1));
  cr_assert_geq(em_cuda_event_elapsed_ms(e0, e1), 0);
  cr_assert(em_cuda_stream_wait_event(NULL, e1));
  em_cuda_set_stream(NULL);
  cr_assert_float_eq(em_item(em_sum(y, 0, NULL, false)), 3000.0, 0);
  cr_assert(em_cuda_synchronize());
  em_cuda_memory_stats s1 = em_cuda_memory_stats_get();
  cr_assert_gt(s1.allocated_bytes, 0);
  cr_assert_gt(s1.reserved_bytes, s0.reserved_bytes);
  em_tensor *big = em_to(em_zeros(F, EM_SHAPE(1 << 20)), EM_CUDA);
  em_release(em_retain(big));
  cr_assert_geq(em_cuda_memory_stats_get().peak_allocated_bytes, s1.allocated_bytes + (4 << 20));
  em_cuda_reset_peak_memory_stats();
  em_cuda_memory_stats s2 = em_cuda_memory_stats_get();
  cr_assert_eq(s2.peak_allocated_bytes, s2.allocated_bytes, "the peak restarts from what is allocated now");
  cr_assert_eq(s2.peak_reserved_bytes, s2.reserved_bytes);
  em_release(em_retain(y));
  em_cuda_event_free(e0), em_cuda_event_free(e1);
  em_cuda_stream_free(st);
}

/* A compiled function over CUDA tensors: its graphs run with generated CUDA kernels for the
 * pointwise parts (inductor/cuda_codegen.c) and the eager CUDA kernels and cuBLAS for the rest;
 * parameters reach it through ctx as on the CPU. */
static em_outputs mlp(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_sum(em_tanh(em_matmul(in[0], in[1])), 0, NULL, false));
}

static em_outputs through_ctx(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  return EM_OUTPUTS(em_relu(em_add_scalar(em_matmul(in[0], ctx), 0.5)));
}

ETEST(cuda_eager, compiled_functions_run_on_the_device) {
  em_manual_seed(10);
  em_tensor *a = em_randn(F, EM_SHAPE(4, 5)), *b = em_randn(F, EM_SHAPE(5, 3));
  em_compiled *c = em_compile(mlp, NULL);
  for (int call = 0; call < 3; call++) {
    em_outputs o = em_call(c, NULL, C(a), C(b));
    cr_assert(o.n == 1 && o.t[0], "%s", em_last_error());
    SAME(mlp(NULL, (em_tensor *[]){a, b}, 2).t[0], o.t[0], 1e-5);
  }
  em_compile_stats st = em_compiled_stats(c);
  cr_assert_eq(st.traces, 1, "%lld traces", (long long)st.traces);
  cr_assert_eq(st.eager_calls, 0);
  cr_assert_geq(st.kernel_runs, 3, "the generated tanh kernel ran on every call (%lld runs)", (long long)st.kernel_runs);
  em_compiled_free(c);
  /* a CUDA parameter through ctx is lifted into the graph, as a CPU one is */
  em_compiled *c2 = em_compile(through_ctx, NULL);
  em_tensor *db = C(b);
  for (int call = 0; call < 2; call++) {
    em_outputs o = em_call(c2, db, C(a));
    cr_assert(o.n == 1 && o.t[0], "%s", em_last_error());
    SAME(through_ctx(b, &a, 1).t[0], o.t[0], 1e-5);
  }
  cr_assert_geq(em_compiled_stats(c2).kernel_runs, 2);
  /* a CPU input meeting a CUDA parameter: eager's error, naming both */
  EXPECT_ERROR(em_call(c2, db, a).t[0], "expected all operands on one device: operand 0 is f32[4,5] on cpu");
  em_compiled_free(c2);
}

/* The random programs of the compiler's differential tests (tests/random_program.h), run
 * eagerly on the device: broadcasting, views, reductions and strided layouts in combinations
 * nobody wrote by hand. */
#include "random_program.h"

ETEST(cuda_eager, random_programs) {
  const char *env = getenv("EMBER_RANDOM_PROGRAMS");
  long n = env ? atol(env) : 200;
  for (long i = 0; i < n; i++) {
    em_scope_begin();
    em_tensor *in[3], *want[3], *got[3];
    program p = random_program_setup(i, in);
    em_tensor *din[3] = {C(in[0]), C(in[1]), C(in[2])};
    cr_assert_eq(random_program(in, want, &p), 3, "program %ld on the cpu: %s", i, em_last_error());
    cr_assert_eq(random_program(din, got, &p), 3, "program %ld on cuda: %s", i, em_last_error());
    for (int k = 0; k < 3; k++) same(want[k], got[k], 1e-4, EM_CUDA, "a random program's output", (int)i);
    em_scope_end();
  }
}

/* Rewrites the CUDA cache entry at victim to hold donor's image under victim's header, with
 * the image's size and FNV-1a hash made to match (header: magic, src_len, src_hash, image_size,
 * image_hash; 40 bytes). */
static void forge_cuda_entry(const char *victim, const char *donor) {
  char *f[2] = {NULL, NULL};
  size_t n[2];
  const char *paths[2] = {victim, donor};
  for (int i = 0; i < 2; i++) {
    FILE *fp = fopen(paths[i], "rb");
    cr_assert(fp);
    fseek(fp, 0, SEEK_END);
    n[i] = (size_t)ftell(fp);
    rewind(fp);
    f[i] = malloc(n[i]);
    cr_assert(f[i] && fread(f[i], 1, n[i], fp) == n[i]);
    fclose(fp);
  }
  uint64_t size = n[1] - 40, h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; i++) h = (h ^ (unsigned char)f[1][40 + i]) * 0x100000001b3ull;
  memcpy(f[0] + 24, &size, 8), memcpy(f[0] + 32, &h, 8);
  FILE *fp = fopen(victim, "wb");
  cr_assert(fp && fwrite(f[0], 1, 40, fp) == 40 && fwrite(f[1] + 40, 1, size, fp) == size);
  fclose(fp);
  free(f[0]), free(f[1]);
}

/* Kernels are compiled once per (prim, dtypes, layout kind) and kept on disk: a second process
 * loads them (cubins on a GPU, shared objects on the emulator). */
ETEST(cuda_eager, kernels_are_cached_on_disk) {
  char dir[] = "/tmp/ember_cuda_cache_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  setenv("EMBER_CACHE_DIR", dir, 1); /* read at this process's first kernel */
  em_tensor *x = C(em_arange(EM_F64, 0, 5, 1));
  SAME(em_exp(em_arange(EM_F64, 0, 5, 1)), em_exp(x), 1e-15);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "test $(ls %s/cuda/*.bin | wc -l) -eq 1", dir);
  cr_assert_eq(system(cmd), 0, "the exp kernel is in %s/cuda", dir);
  /* Issue 17: an entry with valid checksums over another kernel's image (neg's, under exp's
   * name and source hash) loaded without the function and failed the op on every call; it is
   * compiled again and replaced. */
  char exp_bin[512], neg_bin[512];
  FILE *ls = popen("ls -t $EMBER_CACHE_DIR/cuda/*.bin", "r");
  cr_assert(ls && fgets(exp_bin, sizeof exp_bin, ls));
  pclose(ls);
  exp_bin[strcspn(exp_bin, "\n")] = 0;
  SAME(em_neg(em_arange(EM_F64, 0, 5, 1)), em_neg(x), 0);
  ls = popen("ls -t $EMBER_CACHE_DIR/cuda/*.bin", "r");
  cr_assert(ls && fgets(neg_bin, sizeof neg_bin, ls));
  pclose(ls);
  neg_bin[strcspn(neg_bin, "\n")] = 0;
  cr_assert(strcmp(exp_bin, neg_bin), "a second entry for neg");
  forge_cuda_entry(exp_bin, neg_bin);
  cu_kernel_cache_forget(NULL);
  SAME(em_exp(em_arange(EM_F64, 0, 5, 1)), em_exp(x), 1e-15);
  int64_t replaced;
  cu_kernel_cache_forget(&replaced);
  cr_assert_eq(replaced, 1, "the forged entry was found and replaced");
  SAME(em_exp(em_arange(EM_F64, 0, 5, 1)), em_exp(x), 1e-15);
  cu_kernel_cache_forget(&replaced);
  cr_assert_eq(replaced, 1, "and the replacement loads");
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

/* ---- generated CUDA kernels of compiled graphs (inductor/cuda_codegen.c) ---- */
#include "../runtime/rt.h"
#include "../inductor/inductor.h"

static bool no_break(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) { return false; }

typedef int (*build_fn)(em_tensor *const *in, em_tensor **out, void *ctx);

/* Traces build on the (CUDA) inputs, compiles the graph with the inductor, runs it, and compares
 * every output with build run eagerly on the CPU copies of the inputs. */
static bool only_constants_eager; /* compile_on_device checks the schedule has no other eager step */
static bool ref_on_device;        /* compile_on_device's reference is eager on the device, not the CPU */
static char *last_kernel_ir;      /* the output_code of compile_on_device's last program */
static ind_stats compile_on_device(build_fn build, void *ctx, em_tensor *const *cpu, int n_in, bool nvrtc, double tol,
                                   const char *what) {
  em_scope_begin();
  em_tensor *dev[8], *want[16], *outs[16], *got[16], *gin[8];
  for (int i = 0; i < n_in; i++) dev[i] = C(cpu[i]);
  int n = build(ref_on_device ? dev : cpu, want, ctx);
  for (int i = 0; ref_on_device && i < n; i++) want[i] = em_to(want[i], EM_CPU); /* the device's eager results */
  rt_trace tr;
  cr_assert(rt_trace_begin(&tr, "t", no_break, NULL, EM_HERE));
  em_scope_begin();
  em_tensor *proxy[8];
  for (int i = 0; i < n_in; i++) { /* the device inputs as graph inputs, as the frontend makes them */
    prim_meta m = rt_meta(dev[i]);
    ir_type t = ir_type_of_meta(&m, EM_CUDA);
    proxy[i] = rt_scope_add(rt_trace_new_input(&tr, &t, EM_HERE), "test", EM_HERE);
    gin[i] = dev[i];
  }
  cr_assert_eq(build(proxy, outs, ctx), n);
  for (int i = 0; i < n; i++) {
    cr_assert_not_null(outs[i], "%s: tracing on the device: %s", what, em_last_error());
    cr_assert(ir_add_output(tr.g, rt_trace_value_of(&tr, outs[i])));
  }
  ir_graph *g = ir_graph_clone(tr.g);
  int ng = n_in;
  cr_assert_eq(tr.n_lifted, 0, "%s: the builder lifted a tensor", what);
  em_scope_end();
  rt_trace_end(&tr);
  cr_assert(ir_graph_compact(g, NULL, NULL));
  char err[512];
  ind_stats st;
  ind_program *p = ind_compile(g, gin, &st, err, sizeof err);
  cr_assert_not_null(p, "%s: %s", what, err);
  if (getenv("EMBER_TEST_SCHEDULE")) fprintf(stderr, "%s\n", ind_schedule(p));
  if (only_constants_eager) { /* every eager step makes a scalar constant (views are free) */
    const char *sc = ind_schedule(p), *e = sc;
    while ((e = strstr(e, "(eager kernel)"))) {
      const char *line = e;
      while (line > sc && line[-1] != '\n') line--;
      cr_assert(strstr(line, "= full (eager kernel)") == e - strlen("= full "), "%s: an eager step:\n%s", what, sc);
      e++;
    }
  }
  /* the same kernels compile with NVRTC for the H100's sm_90, warning-free, on every machine */
  if (nvrtc && st.kernels) {
    cr_assert(cu_nvrtc_available(), "this build has no NVRTC: the generated kernels cannot be checked");
    const char *pre = cu_kernel_prelude(), *text = ind_kernel_ir(p);
    cr_assert_not_null(text);
    char *src = malloc(strlen(pre) + strlen(text) + 1), *cubin = NULL, *log = NULL;
    size_t size = 0;
    strcpy(src, pre), strcat(src, text);
    bool compiled = cu_nvrtc_compile(src, "compiled_graph.cu", "sm_90", &cubin, &size, &log);
    cr_assert(compiled && (!log || !strstr(log, "warning")), "%s: NVRTC:\n%s\n%s", what, log ? log : "?", text);
    free(src), free(cubin), free(log);
  }
  for (int r = 0; r < 2; r++) { /* a second run reuses the loaded kernels */
    cr_assert(ind_run(p, gin, ng, got, NULL, EM_HERE), "%s: %s", what, em_last_error());
    for (int i = 0; i < n; i++) {
      em_tensor *o = rt_scope_add(got[i], "test", EM_HERE);
      same(want[i], o, tol, EM_CUDA, what, __LINE__);
    }
  }
  free(last_kernel_ir);
  last_kernel_ir = ind_kernel_ir(p) ? strdup(ind_kernel_ir(p)) : NULL;
  ind_free(p);
  ir_graph_free(g);
  em_scope_end();
  return st;
}

/* Pointwise chains over a transposed input and a broadcast row, where, comparisons and a bool
 * output, around a reduction and a matmul (eager steps between the kernels). */
static int device_chain(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = em_transpose(in[0], 0, 1), *b = in[1], *w = in[2];
  em_tensor *h = em_add(em_mul_scalar(x, 1.5), b);
  h = em_where(em_gt_scalar(h, 0), em_exp(em_neg(h)), em_tanh(h));
  h = em_maximum(em_sqrt(em_abs(h)), em_div(h, em_add_scalar(em_abs(b), 1)));
  out[0] = h;
  out[1] = em_lt(h, b);
  em_tensor *s = em_sum(h, 1, (int64_t[]){1}, true);                  /* an eager step */
  em_tensor *y = em_sigmoid(em_sub(h, s));
  out[2] = em_relu(em_add_scalar(em_matmul(y, w), -0.25));           /* matmul, then its epilogue */
  out[3] = em_atan2(out[2], em_add_scalar(em_abs(em_sign(out[2])), 0.5));
  return 4;
}

ETEST(cuda_eager, compiled_graphs_run_generated_kernels) {
  em_manual_seed(12);
  int64_t shapes[][2] = {{5, 7}, {1, 1}, {33, 65}, {300, 129}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    em_scope_begin();
    int64_t R = shapes[i][0], K = shapes[i][1];
    em_tensor *in[3] = {em_randn(F, EM_SHAPE(K, R)), em_randn(F, EM_SHAPE(K)), em_randn(F, EM_SHAPE(K, 4))};
    char what[64];
    snprintf(what, sizeof what, "chain over [%lld, %lld]", (long long)R, (long long)K);
    ind_stats st = compile_on_device(device_chain, NULL, in, 3, true, 1e-5, what);
    cr_assert_geq(st.kernels, 3, "%s: %d kernels", what, st.kernels);
    cr_assert_geq(st.fused_nodes, 15, "%s: %d fused nodes", what, st.fused_nodes);
    cr_assert_geq(st.fallback_nodes, 2, "%s: the sum and the matmul run eagerly", what);
    em_scope_end();
  }
}

/* The compiler's random programs (tests/random_program.h: broadcasting, views, reductions,
 * strided layouts) compiled for the device; every fourth one's kernels also through NVRTC
 * (EMBER_RANDOM_PROGRAMS=N for more). */
ETEST(cuda_eager, compiled_random_programs) {
  const char *env = getenv("EMBER_RANDOM_PROGRAMS");
  long n = env ? atol(env) : 8; /* each new kernel is a host C++ compile on the emulator */
  int kernels = 0;
  for (long i = 0; i < n; i++) {
    em_scope_begin();
    em_tensor *in[3];
    program p = random_program_setup(i, in);
    char what[64];
    snprintf(what, sizeof what, "random program %ld", i);
    kernels += compile_on_device(random_program, &p, in, 3, i % 4 == 0, 1e-4, what).kernels;
    em_scope_end();
  }
  cr_assert_geq(kernels, n, "%d kernels over %ld programs", kernels, n);
}

/* The differential fuzzer's programs (tests/fuzz_program.h: the whole op set, views, aliasing
 * inputs, in-place ops, backward through AOT autograd, three calls) compiled with the inductor
 * on the device and compared with CPU eager. Each new kernel is a host C++ compile on the
 * emulator, so a few programs here; EMBER_FUZZ_CUDA_PROGRAMS=N for more. */
#define rng fz_rng_unused /* random_program.h above has its own */
#include "fuzz_program.h"
#undef rng

ETEST(cuda_eager, fuzz_programs_compiled_on_the_device) {
  setenv("EMBER_FUZZ_CUDA", "1", 1);
  const char *env = getenv("EMBER_FUZZ_CUDA_PROGRAMS");
  long n = env ? atol(env) : 4;
  int failures = 0, skipped = 0;
  for (long i = 0; i < n; i++) {
    bool skip = false;
    failures += fz_check((uint64_t)(1000 + i), 1u << (FZ_CONFIGS - 1), stderr, &skip);
    skipped += skip;
  }
  cr_assert_eq(failures, 0, "%d of %ld programs differ from CPU eager on the device (above)", failures, n);
  cr_assert_lt(skipped, n, "every program was rejected by eager");
  cr_assert_eq(fz_cuda_checks, n - skipped, "the device configuration ran %d times", fz_cuda_checks);
}

/* ---- row kernels on the device: a reduction with its prologue and epilogue in one kernel ---- */

/* softmax, log_softmax, layer_norm with weight and bias, an RMS norm, and the row max with its
 * mask (amax, a comparison, bool and per-row outputs) over the last dim of in[0] (in[1], in[2]
 * the norm's weight and bias over it). */
static int row_ops(em_tensor *const *in, em_tensor **out, void *ctx) {
  (void)ctx;
  em_tensor *x = in[0];
  int64_t last = em_ndim(x) - 1;
  out[0] = em_softmax(x, (int)last);
  out[1] = em_log_softmax(em_mul_scalar(x, 3), (int)last);
  out[2] = em_layer_norm(x, 1, in[1], in[2], 1e-5);
  em_tensor *ms = em_mean(em_mul(x, x), 1, &last, true);
  out[3] = em_mul(em_mul(x, em_rsqrt(em_add_scalar(ms, 1e-6))), in[1]);
  em_tensor *m = em_amax(x, 1, &last, true);
  out[4] = em_eq(x, m);
  out[5] = em_sub(em_neg(m), em_amin(x, 1, &last, true));
  return 6;
}

/* The schedule fuses each of them into row kernels (no eager step at all), and the kernels agree
 * with CPU eager: rows shorter than a warp, a few warps, the persistent limit (2048) and past it,
 * many rows (the emulator's blocks then shrink below a warp: the shared-memory tree), a
 * transposed input (rows strided), and with EMBER_CUDA_EMULATE_THREADS=256 whole blocks of 8
 * warps (shuffles, then the warps combined in shared memory). Scalar constants still run as
 * eager steps (their kernels read them from memory). */
ETEST(cuda_eager, compiled_row_kernels) {
  em_manual_seed(13);
  int64_t shapes[][3] = {{3, 5, 0}, {4, 40, 0}, {2, 1000, 256}, {2, 2048, 256}, {2, 3000, 256}, {300, 64, 0}, {5, 33, 1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    em_scope_begin();
    int64_t R = shapes[i][0], K = shapes[i][1];
    if (shapes[i][2] > 1) {
      char t[24];
      snprintf(t, sizeof t, "%lld", (long long)shapes[i][2]);
      setenv("EMBER_CUDA_EMULATE_THREADS", t, 1);
    }
    em_tensor *x = shapes[i][2] == 1 ? em_transpose(em_randn(F, EM_SHAPE(K, R)), 0, 1) : em_randn(F, EM_SHAPE(R, K));
    em_tensor *in[3] = {x, em_randn(F, EM_SHAPE(K)), em_randn(F, EM_SHAPE(K))};
    char what[64];
    snprintf(what, sizeof what, "row ops over [%lld, %lld]%s", (long long)R, (long long)K, shapes[i][2] == 1 ? " transposed" : "");
    only_constants_eager = true;
    ind_stats st = compile_on_device(row_ops, NULL, in, 3, i < 2, 1e-5, what);
    only_constants_eager = false;
    unsetenv("EMBER_CUDA_EMULATE_THREADS");
    cr_assert_leq(st.kernels, 6, "%s: %d kernels", what, st.kernels);
    em_scope_end();
  }
}

/* A layer_norm -> linear -> cross_entropy loss compiled whole (forward and backward through AOT
 * autograd): the backward's row kernels (softmax's and layer_norm's gradients) on the device
 * agree with CPU eager's gradients. */
static em_outputs ln_loss(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *h = em_layer_norm(in[0], 1, in[1], in[2], 1e-5);
  return EM_OUTPUTS(em_cross_entropy(em_matmul(h, in[3]), in[4], EM_CROSS_ENTROPY_DEFAULT));
}

ETEST(cuda_eager, compiled_row_kernels_backward) {
  em_manual_seed(14);
  int64_t B = 24, K = 48, V = 40;
  em_tensor *cpu[5] = {em_randn(F, EM_SHAPE(B, K)), em_randn(F, EM_SHAPE(K)), em_randn(F, EM_SHAPE(K)),
                       em_mul_scalar(em_randn(F, EM_SHAPE(K, V)), 0.2),
                       em_cast(em_mul_scalar(em_rand(F, EM_SHAPE(B)), (double)V - 0.01), EM_I64)};
  em_tensor *dev[5];
  for (int i = 0; i < 5; i++) {
    dev[i] = C(cpu[i]);
    if (i < 4) em_requires_grad_(cpu[i], true), em_requires_grad_(dev[i], true);
  }
  em_outputs want = ln_loss(NULL, cpu, 5);
  cr_assert(em_backward(want.t[0], NULL), "%s", em_last_error());
  em_compiled *c = em_compile(ln_loss, &(em_compile_options){.name = "ln_loss"});
  for (int call = 0; call < 2; call++) {
    for (int i = 0; i < 4; i++) em_zero_grad(dev[i]);
    em_outputs got = em_call_n(c, NULL, 5, dev);
    cr_assert(got.n == 1 && got.t[0], "%s", em_last_error());
    SAME(want.t[0], got.t[0], 1e-5);
    cr_assert(em_backward(got.t[0], NULL), "%s", em_last_error());
    for (int i = 0; i < 4; i++) same(em_get_grad(cpu[i]), em_get_grad(dev[i]), 1e-4, EM_CUDA, "a gradient", i);
  }
  em_compile_stats st = em_compiled_stats(c);
  cr_assert_eq(st.eager_calls, 0);
  cr_assert_geq(st.kernel_runs, 4, "%lld kernel runs", (long long)st.kernel_runs);
  em_compiled_free(c);
}

/* ---- mode "reduce-overhead": compiled CUDA graphs replayed as CUDA graphs ---- */

/* An MLP's loss: relu(x W1 + b1) W2 -> cross_entropy (its gather's bounds check is read back
 * after each replay). in: x, y, W1, b1, W2. */
static em_outputs mlp_loss(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *h = em_relu(em_add(em_matmul(in[0], in[2]), in[3]));
  return EM_OUTPUTS(em_cross_entropy(em_matmul(h, in[4]), in[1], EM_CROSS_ENTROPY_DEFAULT));
}

/* Trains the MLP for `steps` SGD steps with the compiled loss (forward and backward graphs),
 * a new batch tensor each step (about the same data: the loss falls); the losses in loss[], the final parameters in params[]. */
static em_compile_stats train_mlp(const char *mode, int steps, double *loss, em_tensor **params) {
  em_manual_seed(21);
  int64_t B = 16, Din = 24, H = 32, V = 10;
  em_tensor *w[3] = {C(em_mul_scalar(em_randn(F, EM_SHAPE(Din, H)), 0.2)), C(em_zeros(F, EM_SHAPE(H))),
                     C(em_mul_scalar(em_randn(F, EM_SHAPE(H, V)), 0.2))};
  for (int i = 0; i < 3; i++) em_requires_grad_(w[i], true);
  em_tensor *x0 = em_randn(F, EM_SHAPE(B, Din)), *y0 = em_cast(em_mul_scalar(em_rand(F, EM_SHAPE(B)), (double)V - 0.01), EM_I64);
  em_compiled *c = em_compile(mlp_loss, &(em_compile_options){.name = "mlp_loss", .mode = mode});
  cr_assert_not_null(c, "%s", em_last_error());
  for (int s = 0; s < steps; s++) {
    em_scope_begin();
    em_tensor *x = C(em_add_scalar(x0, 0.01 * s)), *y = C(y0); /* a new batch tensor each step */
    em_outputs o = em_call(c, NULL, x, y, w[0], w[1], w[2]);
    cr_assert(o.n == 1 && o.t[0], "%s, step %d: %s", mode, s, em_last_error());
    loss[s] = em_item(o.t[0]);
    cr_assert(em_backward(o.t[0], NULL), "%s", em_last_error());
    em_no_grad_begin();
    for (int i = 0; i < 3; i++) {
      cr_assert(em_sub_(w[i], em_mul_scalar(em_get_grad(w[i]), 0.5)), "%s", em_last_error());
      em_zero_grad(w[i]);
    }
    em_no_grad_end();
    em_scope_end();
  }
  em_compile_stats st = em_compiled_stats(c);
  em_compiled_free(c);
  for (int i = 0; i < 3; i++) params[i] = em_to(w[i], EM_CPU);
  return st;
}

/* The same training under "default" and "reduce-overhead" (and "max-autotune", which also
 * captures): every loss and final parameter bit for bit the same (the graph replays the very
 * kernels the default mode launches), the forward and backward graphs replayed as CUDA graphs
 * from the second step on, every batch (a new tensor each step: copied into the graph's inputs)
 * seen. */
ETEST(cuda_eager, reduce_overhead_replays_cuda_graphs) {
  enum { STEPS = 5 };
  double want[STEPS], got[STEPS];
  em_tensor *pw[3], *pg[3];
  em_compile_stats sd = train_mlp("default", STEPS, want, pw);
  cr_assert_eq(sd.cuda_graph_replays, 0);
  int64_t launches = ind_cuda_graph_replays();
  em_compile_stats sr = train_mlp("reduce-overhead", STEPS, got, pg);
  launches = ind_cuda_graph_replays() - launches; /* forward (in em_call) and backward (in em_backward) */
  for (int s = 0; s < STEPS; s++) cr_assert_eq(want[s], got[s], "step %d: loss %.9g against default's %.9g", s, got[s], want[s]);
  for (int i = 0; i < 3; i++) SAME_CPU(pw[i], pg[i], 0);
  cr_assert_eq(sr.cuda_graph_replays, STEPS - 1, "%lld forward launches", (long long)sr.cuda_graph_replays);
  cr_assert_eq(launches, 2 * (STEPS - 1), "%lld CUDA graph launches", (long long)launches);
  cr_assert_lt(want[STEPS - 1], want[0], "the loss went down (%g -> %g)", want[0], want[STEPS - 1]);
}

/* Outputs are the caller's: a later replay does not overwrite them. A parameter passed at a new
 * address is read from there (the graph is captured again); a bad index inside a replayed graph
 * is the eager error. */
static em_outputs gather_rows(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_exp(em_gather(em_mul(in[0], in[1]), 0, in[2])));
}

ETEST(cuda_eager, reduce_overhead_outputs_inputs_and_errors) {
  em_manual_seed(22);
  em_tensor *x = em_randn(F, EM_SHAPE(6, 4)), *scale = em_randn(F, EM_SHAPE(6, 4)), *dscale = C(scale);
  em_tensor *idx = em_cast(em_mul_scalar(em_rand(F, EM_SHAPE(3, 4)), 5.99), EM_I64);
  em_compiled *c = em_compile(gather_rows, &(em_compile_options){.name = "gather_rows", .mode = "reduce-overhead"});
  em_tensor *kept[4];
  for (int call = 0; call < 4; call++) {
    em_tensor *xi = em_add_scalar(x, call);
    em_outputs o = em_call(c, NULL, C(xi), dscale, C(idx));
    cr_assert(o.n == 1 && o.t[0], "call %d: %s", call, em_last_error());
    kept[call] = o.t[0];
    for (int k = 0; k <= call; k++) /* every earlier output still holds its own call's values */
      SAME(gather_rows(NULL, (em_tensor *[]){em_add_scalar(x, k), scale, idx}, 3).t[0], kept[k], 1e-6);
  }
  cr_assert_geq(em_compiled_stats(c).cuda_graph_replays, 3);
  em_tensor *scale2 = em_mul_scalar(scale, -1); /* the parameter at another address */
  em_outputs o = em_call(c, NULL, C(x), C(scale2), C(idx));
  cr_assert(o.n == 1 && o.t[0], "%s", em_last_error());
  SAME(gather_rows(NULL, (em_tensor *[]){x, scale2, idx}, 3).t[0], o.t[0], 1e-6);
  em_tensor *bad = em_cast(em_full(F, EM_SHAPE(3, 4), 2), EM_I64);
  EXPECT_ERROR(em_call(c, NULL, C(x), dscale, C(em_add_scalar(bad, 7))).t[0], "index 9 is out of bounds for axis 0 with size 6");
  int64_t before = em_compiled_stats(c).cuda_graph_replays;
  o = em_call(c, NULL, C(x), dscale, C(idx));
  cr_assert(o.n == 1 && o.t[0], "after the error: %s", em_last_error());
  SAME(gather_rows(NULL, (em_tensor *[]){x, scale, idx}, 3).t[0], o.t[0], 1e-6);
  cr_assert_gt(em_compiled_stats(c).cuda_graph_replays, before, "still replayed after the error");
  em_compiled_free(c);
}

/* The bounds check's word of a captured gather must not share memory with the graph's other
 * values: here the two products' blocks are free when the gather runs, and a word carved from
 * them was overwritten by the GEMMs at the next replay (a false "index ... out of bounds" in
 * fashion_mnist --mode reduce-overhead, found while writing this mode). */
static em_outputs gather_after_gemms(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  em_tensor *t = em_add(em_exp(em_matmul(in[0], in[1])), em_matmul(in[0], in[2])); /* two f32[8,16]: 512 bytes */
  return EM_OUTPUTS(em_gather(t, 0, in[3]));
}

ETEST(cuda_eager, reduce_overhead_bounds_check_word_is_its_own) {
  em_manual_seed(23);
  em_tensor *in[4] = {em_randn(F, EM_SHAPE(8, 4)), em_randn(F, EM_SHAPE(4, 16)), em_randn(F, EM_SHAPE(4, 16)),
                      em_cast(em_mul_scalar(em_rand(F, EM_SHAPE(3, 16)), 7.99), EM_I64)};
  em_compiled *c = em_compile(gather_after_gemms, &(em_compile_options){.name = "gather_after_gemms", .mode = "reduce-overhead"});
  for (int call = 0; call < 4; call++) {
    em_outputs o = em_call(c, NULL, C(in[0]), C(in[1]), C(in[2]), C(in[3]));
    cr_assert(o.n == 1 && o.t[0], "call %d: %s", call, em_last_error());
    SAME(gather_after_gemms(NULL, in, 4).t[0], o.t[0], 1e-5);
  }
  cr_assert_geq(em_compiled_stats(c).cuda_graph_replays, 2);
  em_compiled_free(c);
}

/* A graph that cannot be captured (integer remainder checks its divisor on the host) runs
 * without a CUDA graph, with the default mode's results. */
static em_outputs int_rem(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_add(em_remainder(in[0], in[1]), in[0]));
}

ETEST(cuda_eager, reduce_overhead_falls_back_when_capture_fails) {
  em_tensor *a = em_cast(em_arange(F, 0, 12, 1), EM_I64), *b = em_cast(em_full(F, EM_SHAPE(12), 5), EM_I64);
  em_compiled *c = em_compile(int_rem, &(em_compile_options){.name = "int_rem", .mode = "reduce-overhead"});
  for (int call = 0; call < 3; call++) {
    em_outputs o = em_call(c, NULL, C(a), C(b));
    cr_assert(o.n == 1 && o.t[0], "call %d: %s", call, em_last_error());
    SAME(int_rem(NULL, (em_tensor *[]){a, b}, 2).t[0], o.t[0], 0);
  }
  cr_assert_eq(em_compiled_stats(c).cuda_graph_replays, 0);
  em_compiled_free(c);
  EXPECT_ERROR(em_compile(int_rem, &(em_compile_options){.mode = "fast"}), "unknown mode \"fast\"");
}

/* ---- mode "max-autotune": launch configurations timed, the choice cached on disk ---- */
static em_outputs softmax_relu(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  /* a row kernel (the softmax with its prologue), then a pointwise one over [40,40] (the GEMM
   * between), which has a vector variant */
  em_tensor *s = em_softmax(em_relu(em_add(in[0], in[1])), 1);
  return EM_OUTPUTS(s, em_tanh(em_mul_scalar(em_matmul(em_transpose(s, 0, 1), in[1]), 0.5)));
}

/* The first compile times each kernel's candidates (pointwise and row) and gives eager's
 * results; a second compile of the same function (a new em_compile) takes every choice from
 * the disk cache without timing (a salt from the clock keys this run's entries apart from earlier
 * runs'). "max-autotune" also replays CUDA graphs, as torch.compile's does. */
ETEST(cuda_eager, max_autotune_times_and_caches_choices) {
  em_manual_seed(24);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ind_autotune_salt((unsigned long long)ts.tv_sec * 1000000007ull + (unsigned long long)ts.tv_nsec * 31 + (unsigned long long)getpid());
  int64_t R = 6, K = 40;
  em_tensor *in[2] = {em_randn(F, EM_SHAPE(R, K)), em_randn(F, EM_SHAPE(R, K))};
  em_outputs want = softmax_relu(NULL, in, 2);
  ind_autotune_stats s0 = ind_autotune_stats_get();
  for (int round = 0; round < 2; round++) {
    em_compiled *c = em_compile(softmax_relu, &(em_compile_options){.name = "softmax_relu", .mode = "max-autotune-no-cudagraphs"});
    for (int call = 0; call < 2; call++) {
      em_outputs o = em_call(c, NULL, C(in[0]), C(in[1]));
      cr_assert(o.n == 2 && o.t[0] && o.t[1], "round %d call %d: %s", round, call, em_last_error());
      SAME(want.t[0], o.t[0], 1e-5);
      SAME(want.t[1], o.t[1], 1e-5);
    }
    cr_assert_eq(em_compiled_stats(c).cuda_graph_replays, 0);
    em_compiled_free(c);
    ind_autotune_stats s1 = ind_autotune_stats_get();
    if (round == 0) {
      cr_assert_geq(s1.tuned - s0.tuned, 2, "%lld kernels timed", (long long)(s1.tuned - s0.tuned));
      /* the pointwise kernel ([40,40]: 4-wide chunks) times 4 blocks with each variant, the
       * softmax's row kernel at least 2 blocks */
      cr_assert_geq(s1.candidates - s0.candidates, 10, "%lld configurations timed", (long long)(s1.candidates - s0.candidates));
    } else if (ind_cache_dir()) {
      cr_assert_eq(s1.tuned - s0.tuned, 0, "a second compile timed %lld kernels again", (long long)(s1.tuned - s0.tuned));
      cr_assert_geq(s1.cached - s0.cached, 2, "%lld choices from the cache", (long long)(s1.cached - s0.cached));
    } else {
      fprintf(stderr, "[cache] NO KERNEL CACHE DIRECTORY: the cached autotuning choices are not checked\n");
    }
    s0 = s1;
  }
  em_compiled *c = em_compile(softmax_relu, &(em_compile_options){.name = "softmax_relu", .mode = "max-autotune"});
  for (int call = 0; call < 3; call++) {
    em_outputs o = em_call(c, NULL, C(in[0]), C(in[1]));
    cr_assert(o.n == 2 && o.t[0] && o.t[1], "call %d: %s", call, em_last_error());
    SAME(want.t[0], o.t[0], 1e-5);
  }
  cr_assert_eq(em_compiled_stats(c).cuda_graph_replays, 2);
  em_compiled_free(c);
  ind_autotune_salt(0);
}

/* ---- f16, bf16 and f64 chains fused on the device ---- */
static int half_ops(em_tensor *const *in, em_tensor **out, void *ctx) {
  (void)ctx;
  em_tensor *x = in[0], *y = in[1];
  em_tensor *hb = em_cast(x, EM_BF16), *yb = em_cast(y, EM_BF16);
  em_tensor *b = em_where(em_gt(hb, yb), em_exp(em_mul(hb, yb)), em_tanh(em_sub(hb, yb)));
  out[0] = em_add(em_mul_scalar(b, 0.5), yb);                       /* bf16 */
  em_tensor *hf = em_cast(x, EM_F16);
  out[1] = em_div(em_exp(em_neg(em_mul(hf, hf))), em_add_scalar(em_abs(hf), 1)); /* f16 */
  em_tensor *d = em_cast(y, EM_F64);
  out[2] = em_remainder(em_pow(em_abs(d), em_cast(x, EM_F64)), em_add_scalar(em_abs(d), 0.5)); /* f64: pow, remainder */
  out[3] = em_cast(out[0], EM_F32);
  return 4;
}

/* Half-precision chains fuse into generated kernels that compute in f32 and round each op's
 * result to its dtype, as the eager CUDA kernels do: eager's bits exactly (the CPU has no f16 or
 * bf16 arithmetic, so the reference is eager on the device); f64 chains compute in f64. */
ETEST(cuda_eager, compiled_half_and_double_chains) {
  em_manual_seed(25);
  int64_t shapes[][2] = {{4, 9}, {33, 65}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    em_scope_begin();
    em_tensor *in[2] = {em_randn(F, EM_SHAPE(shapes[i][0], shapes[i][1])), em_randn(F, EM_SHAPE(shapes[i][0], shapes[i][1]))};
    char what[64];
    snprintf(what, sizeof what, "half chains over [%lld, %lld]", (long long)shapes[i][0], (long long)shapes[i][1]);
    only_constants_eager = ref_on_device = true; /* the CPU has no f16 / bf16 arithmetic */
    ind_stats st = compile_on_device(half_ops, NULL, in, 2, i == 0, 0, what);
    only_constants_eager = ref_on_device = false;
    cr_assert_geq(st.fused_nodes, 20, "%s: %d nodes fused", what, st.fused_nodes);
    em_scope_end();
  }
}

/* ---- vectorized pointwise kernels (inductor/cuda_codegen.c: vector_width) ---- */
/* Over a [R, K] input x, a per-row column r ([R, 1]) and a per-column row c ([K]): every operand
 * moves along the innermost dim with stride 1 or 0, so the kernel has a vector variant when K
 * is a multiple of the width. */
static int vec_ops(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_dtype dt = *(em_dtype *)ctx;
  em_tensor *x = em_cast(in[0], dt), *r = em_cast(in[1], dt), *c = em_cast(in[2], dt);
  em_tensor *h = em_add(em_mul(em_tanh(x), c), r);
  out[0] = em_where(em_gt_scalar(h, 0), em_exp(em_neg(h)), em_mul_scalar(h, 0.5));
  out[1] = em_gt(h, c); /* bool: its own width, one store of 4 or 8 bytes */
  return 2;
}

static em_outputs vec_fn(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  em_tensor *out[2];
  vec_ops(in, out, ctx);
  return EM_OUTPUTS(out[0], out[1]);
}

/* A device copy of x whose data starts one element past a 16-byte boundary (a slice). */
static em_tensor *misaligned(em_tensor *x) {
  int64_t n = em_numel(x);
  em_tensor *base = C(em_randn(F, EM_SHAPE(n + 1)));
  em_tensor *s = em_slice(base, 0, 1, n + 1, 1);
  em_tensor *d = em_reshape(s, em_ndim(x), em_sizes(x));
  em_copy_(d, C(x));
  cr_assert_neq((uintptr_t)rt_data(d) % 16, 0);
  return d;
}

/* Pointwise kernels read and store 16-byte chunks (4 f32, 8 f16 / bf16) when every operand is
 * contiguous or broadcast along the innermost dim and its extent is a multiple of the width; the
 * launcher takes that variant for 16-byte aligned buffers and the scalar one otherwise (a slice
 * one element in). Both give eager's results within a rounding, and compile with NVRTC. */
ETEST(cuda_eager, compiled_pointwise_vector_variants) {
  em_manual_seed(31);
  em_dtype dts[] = {EM_F32, EM_F16, EM_BF16};
  int64_t shapes[][2] = {{6, 16}, {3, 12}, {5, 7}, {1, 40}};
  for (size_t di = 0; di < 3; di++) {
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      em_scope_begin();
      int64_t R = shapes[si][0], K = shapes[si][1];
      int w = dts[di] == EM_F32 ? 4 : 8;
      bool vectorizes = K % w == 0;
      em_tensor *in[3] = {em_randn(F, EM_SHAPE(R, K)), em_randn(F, EM_SHAPE(R, 1)), em_randn(F, EM_SHAPE(K))};
      char what[96], want_name[16];
      snprintf(what, sizeof what, "%s over [%lld, %lld]", em_dtype_name(dts[di]), (long long)R, (long long)K);
      int64_t v0 = ind_vector_kernel_runs();
      only_constants_eager = ref_on_device = true; /* the CPU has no f16 / bf16 arithmetic */
      ind_stats st = compile_on_device(vec_ops, &dts[di], in, 3, si < 2, 0, what);
      only_constants_eager = ref_on_device = false;
      cr_assert_geq(st.kernels, 1, "%s", what);
      /* two runs, each of its kernels: vector variants exactly where the shape allows */
      int64_t runs = ind_vector_kernel_runs() - v0;
      if (vectorizes) cr_assert_geq(runs, 2, "%s: %lld vector launches", what, (long long)runs);
      else cr_assert_eq(runs, 0, "%s: %lld vector launches", what, (long long)runs);
      /* through em_compile: aligned inputs, then the same inputs one element past alignment */
      em_compiled *c = em_compile(vec_fn, &(em_compile_options){.name = "vec_fn"});
      int64_t aligned_launches = 0;
      for (int call = 0; call < 2; call++) {
        em_tensor *d[3];
        for (int i = 0; i < 3; i++) d[i] = call ? misaligned(in[i]) : C(in[i]);
        em_tensor *ref[2];
        vec_ops(d, ref, &dts[di]);
        int64_t before = ind_vector_kernel_runs();
        em_outputs o = em_call(c, &dts[di], d[0], d[1], d[2]);
        cr_assert(o.n == 2 && o.t[0] && o.t[1], "%s: %s", what, em_last_error());
        int64_t launched = ind_vector_kernel_runs() - before;
        /* misaligned: the kernels reading the sliced inputs fall back (a kernel past an eager cast
         * reads fresh, aligned buffers) */
        if (!vectorizes) cr_assert_eq(launched, 0, "%s, call %d: %lld vector launches", what, call, (long long)launched);
        else if (!call) cr_assert_geq(aligned_launches = launched, 1, "%s: no vector launch", what);
        else cr_assert_lt(launched, aligned_launches, "%s: %lld vector launches on misaligned inputs", what, (long long)launched);
        /* within a rounding of eager: on a GPU, NVRTC contracts the fused kernel's a * b + c
         * into FMAs, which eager's one-op kernels cannot (1 ulp apart in f32 on an H200) */
        double tol = dts[di] == EM_F32 ? 1e-6 : dts[di] == EM_F16 ? 1e-3 : 8e-3;
        for (int i = 0; i < 2; i++) {
          em_tensor *want = em_to(ref[i], EM_CPU), *got = em_to(o.t[i], EM_CPU);
          same(want, got, tol, EM_CPU, what, __LINE__);
        }
      }
      cr_assert_eq(em_compiled_stats(c).traces, 1, "%s: the misaligned call reuses the program", what);
      em_compiled_free(c);
      /* EMBER_LOGS=output_code shows the vector variant beside the scalar one */
      snprintf(want_name, sizeof want_name, "_v%d(", w);
      cr_assert_not_null(last_kernel_ir);
      cr_assert_eq(strstr(last_kernel_ir, want_name) != NULL, vectorizes, "%s:\n%s", what, last_kernel_ir);
      cr_assert_eq(strstr(last_kernel_ir, "em_vec<") != NULL, vectorizes, "%s", what);
      if (vectorizes && si == 0) { /* NVRTC makes its chunks 128-bit loads and stores */
        cr_assert(cu_nvrtc_available(), "this build has no NVRTC");
        char *src = malloc(strlen(cu_kernel_prelude()) + strlen(last_kernel_ir) + 1), *ptx, *log;
        strcpy(src, cu_kernel_prelude()), strcat(src, last_kernel_ir);
        cr_assert(cu_nvrtc_ptx(src, "vec.cu", "compute_90", &ptx, &log), "%s: %s", what, log ? log : "?");
        const char *v = strstr(ptx, want_name); /* the vector variant's entry, after the scalar one's */
        cr_assert(v && strstr(v, "ld.global.nc.v4.") && strstr(v, "st.global.v4."), "%s: no 128-bit accesses:\n%s", what, ptx);
        free(src), free(ptx), free(log);
      }
      em_scope_end();
    }
  }
}

/* ---- compiling a graph's kernels on several threads (runtime/cuda.c: cu_source_modules) ---- */
/* Eight pointwise stages, each a different op (a different kernel), each ending in a matmul
 * (an eager GEMM between the kernels). */
static int many_kernels(em_tensor *const *in, em_tensor **out, void *ctx) {
  (void)ctx;
  em_tensor *h = in[0];
  for (int s = 0; s < 8; s++) {
    em_tensor *f = s == 0 ? em_tanh(h) : s == 1 ? em_sigmoid(h) : s == 2 ? em_sin(h) : s == 3 ? em_cos(h)
                 : s == 4 ? em_exp(em_neg(em_abs(h))) : s == 5 ? em_sqrt(em_abs(h)) : s == 6 ? em_relu(h) : em_tanh(em_mul_scalar(h, 2));
    h = em_matmul(em_add_scalar(f, 0.25), in[1]);
  }
  out[0] = h;
  return 1;
}

/* The files of dir (name and bytes), sorted by name, as one string. */
static char *cache_listing(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "cd %s && for f in $(ls | sort); do echo $f $(md5sum < $f); done", dir);
  FILE *ls = popen(cmd, "r");
  cr_assert_not_null(ls);
  size_t cap = 1 << 16, n = 0;
  char *s = malloc(cap);
  for (size_t r; (r = fread(s + n, 1, cap - n - 1, ls)) > 0;) n += r;
  s[n] = 0;
  pclose(ls);
  return s;
}

/* A graph with many kernels that no cache holds compiles them on several threads; its results,
 * output_code and disk cache entries are those of compiling them one at a time. */
ETEST(cuda_eager, kernels_compile_in_parallel_deterministically) {
  char dir[] = "/tmp/ember_cuda_par_XXXXXX", sub[64], cmd[128];
  cr_assert_not_null(mkdtemp(dir));
  setenv("EMBER_CACHE_DIR", dir, 1); /* read at this process's first kernel */
  snprintf(sub, sizeof sub, "%s/cuda", dir);
  em_manual_seed(41);
  em_tensor *in[2] = {em_randn(F, EM_SHAPE(4, 16)), em_mul_scalar(em_randn(F, EM_SHAPE(16, 16)), 0.25)};
  char *listing[2], *ir[2];
  int kernels = 0;
  for (int run = 0; run < 2; run++) {
    cu_set_compile_threads(run ? 4 : 1);
    cu_compile_stats before = cu_compile_stats_get();
    kernels = compile_on_device(many_kernels, NULL, in, 2, run == 0, 1e-4, run ? "4 threads" : "1 thread").kernels;
    cu_compile_stats after = cu_compile_stats_get();
    cr_assert_geq(kernels, 8, "%d kernels", kernels);
    cr_assert_geq(after.compiled - before.compiled, kernels, "every generated kernel compiled (run %d)", run);
    if (run) cr_assert_geq(after.max_threads, 2, "compiled on %d threads", after.max_threads);
    listing[run] = cache_listing(sub);
    ir[run] = strdup(last_kernel_ir);
    /* an empty cache for the second run: every kernel compiles again */
    snprintf(cmd, sizeof cmd, "rm -f %s/*", sub);
    cr_assert_eq(system(cmd), 0);
    cu_kernel_cache_forget(NULL);
  }
  cu_set_compile_threads(0);
  int entries = 0;
  for (const char *c = listing[0]; *c; c++) entries += *c == '\n';
  cr_assert_geq(entries, kernels, "%d cache entries for %d kernels", entries, kernels);
  cr_assert_str_eq(listing[0], listing[1], "the disk cache differs");
  cr_assert_str_eq(ir[0], ir[1], "the output code differs");
  free(listing[0]), free(listing[1]), free(ir[0]), free(ir[1]);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

/* A batch's compile errors: each failing kernel fails alone (the others load), and the error
 * names the first in the batch's order and counts the rest. */
ETEST(cuda_eager, parallel_compile_reports_errors_per_kernel) {
  char dir[] = "/tmp/ember_cuda_err_XXXXXX", cmd[64];
  cr_assert_not_null(mkdtemp(dir));
  setenv("EMBER_CACHE_DIR", dir, 1); /* an empty cache: every source compiles */
  cu_set_compile_threads(3);
  static const char good[] = "extern \"C\" __global__ void em_par_good(float *o, i64 n) { EM_GRID_LOOP(i, n) o[i] = 1.0f; }\n";
  static const char bad1[] = "extern \"C\" __global__ void em_par_bad1(float *o, i64 n) { o[0] = undeclared_one; }\n";
  static const char bad2[] = "extern \"C\" __global__ void em_par_bad2(float *o, i64 n) { o[0] = undeclared_two; }\n";
  cu_module_req req[4] = {{bad1, {"em_par_bad1"}, 1, {0}}, {good, {"em_par_good"}, 1, {0}}, {bad2, {"em_par_bad2"}, 1, {0}},
                          {good, {"em_par_good"}, 1, {0}}};
  char err[2048] = "";
  int64_t compiled = cu_compile_stats_get().compiled;
  cr_assert_not(cu_source_modules(req, 4, err, sizeof err));
  cr_assert(strstr(err, "em_par_bad1") && strstr(err, "undeclared_one"), "%s", err);
  cr_assert(strstr(err, "and 1 more of the 4 kernels failed"), "%s", err);
  cr_assert_not_null(req[1].fns[0], "the good kernel loaded");
  cr_assert_null(req[0].fns[0]);
  cr_assert_eq(req[3].fns[0], req[1].fns[0], "a batch's identical kernels load once");
  cr_assert_eq(cu_compile_stats_get().compiled - compiled, 3, "three distinct sources compiled");
  cu_set_compile_threads(0);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

/* ---- EMBER_INDUCTOR_PROFILE on the device (inductor/run.c) ---- */
/* Each generated kernel's launch is timed with CUDA events, and a program prints its slowest
 * kernels by device time when freed: a header naming the program and the clock, then a line a
 * kernel, "  <us> us/run <GB/s> GB/s  <its schedule line>", slowest first. */
ETEST(cuda_eager, inductor_profile_prints_device_time_per_kernel) {
  setenv("EMBER_INDUCTOR_PROFILE", "1", 1); /* read at this process's first run */
  em_manual_seed(43);
  em_tensor *in[2] = {em_randn(F, EM_SHAPE(4, 16)), em_mul_scalar(em_randn(F, EM_SHAPE(16, 16)), 0.25)};
  char path[] = "/tmp/ember_profile_XXXXXX";
  int fd = mkstemp(path), saved = dup(2);
  cr_assert(fd >= 0 && saved >= 0);
  fflush(stderr);
  dup2(fd, 2);
  int kernels = compile_on_device(many_kernels, NULL, in, 2, false, 1e-4, "profiled").kernels;
  fflush(stderr);
  dup2(saved, 2), close(saved), close(fd);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char line[1024];
  int header = 0, rows = 0;
  double last = 1e30;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "[ember] inductor profile of t: slowest kernels (device time, CUDA events)")) header++;
    double us, gbs;
    char name[64];
    if (!header || sscanf(line, " %lf us/run %lf GB/s %63[^,]", &us, &gbs, name) != 3) continue;
    cr_assert(!strncmp(name, "em_ind_", 7) && strstr(last_kernel_ir, name), "a kernel of the program: %s", line);
    cr_assert(us >= 0 && us <= last && (rows || us > 0), "device times, slowest first: %s", line);
    cr_assert_geq(gbs, 0, "%s", line);
    last = us, rows++;
  }
  fclose(f);
  unlink(path);
  cr_assert_eq(header, 1, "one header");
  cr_assert_eq(rows, kernels < 10 ? kernels : 10, "%d lines for %d kernels", rows, kernels);
}

/* ---- a dynamic entry's kernels on the device: sizes as arguments ---- */

/* Pointwise over [s0, 24], one operand read through a transpose (index arithmetic over s0). */
static em_outputs transposed_sum(void *ctx, em_tensor *const *in, int n) {
  (void)ctx, (void)n;
  return EM_OUTPUTS(em_tanh(em_add(em_mul_scalar(in[0], 2), em_transpose(in[1], 0, 1))));
}

static char *dyn_source; /* the last program's CUDA C */
static void dyn_kernels_made(const char *graph, const ind_program *p) {
  (void)graph;
  free(dyn_source);
  dyn_source = ind_kernel_ir(p) ? strdup(ind_kernel_ir(p)) : NULL;
}

/* A dynamic entry compiles its CUDA kernels with the sizes and strides in a table passed by
 * value (cuda_codegen.c: ktab), so the graph at a new size renders the same source and nothing
 * is compiled again; results stay eager's, through the scalar and the vector variants; the
 * source compiles with NVRTC for sm_90. */
ETEST(cuda_eager, dynamic_sizes_are_kernel_arguments) {
  setenv("EMBER_DYNAMIC_COMPILE_AFTER", "1", 1); /* read once per process: each test has its own */
  em_compiled *c = em_compile(transposed_sum, &(em_compile_options){.name = "transposed_sum", .dynamic = EM_DYNAMIC_ALWAYS});
  ind_set_compiled_hook(dyn_kernels_made); /* em_compile installed the frontend's */
  int64_t sizes[] = {37, 50, 41, 77, 123, 64};
  int64_t compiled = 0;
  for (int i = 0; i < 6; i++) {
    em_scope_begin();
    em_manual_seed(40 + i);
    em_tensor *x = em_randn(F, EM_SHAPE(sizes[i], 24)), *y = em_randn(F, EM_SHAPE(24, sizes[i]));
    em_outputs want = transposed_sum(NULL, (em_tensor *[]){x, y}, 2);
    em_outputs got = em_call(c, NULL, C(x), C(y));
    cr_assert(got.n == 1 && got.t[0], "size %lld: %s", (long long)sizes[i], em_last_error());
    SAME(want.t[0], got.t[0], 1e-6);
    em_scope_end();
    if (i == 2) compiled = cu_compile_stats_get().compiled; /* the trace, the check, a size as arguments */
  }
  em_compile_stats s = em_compiled_stats(c);
  cr_assert_eq(s.dynamic_entries, 1);
  cr_assert_geq(s.graphs_compiled, 6, "every size compiled: %lld", (long long)s.graphs_compiled);
  cr_assert_eq(cu_compile_stats_get().compiled, compiled, "three more sizes compiled %lld CUDA sources",
               (long long)(cu_compile_stats_get().compiled - compiled));
  em_compiled_free(c);
  cr_assert(dyn_source && strstr(dyn_source, "em_ktab<"), "the kernels take a table of sizes:\n%s", dyn_source ? dyn_source : "");
  if (cu_nvrtc_available()) {
    const char *pre = cu_kernel_prelude();
    char *src = malloc(strlen(pre) + strlen(dyn_source) + 1), *cubin = NULL, *log = NULL;
    size_t size = 0;
    strcpy(src, pre), strcat(src, dyn_source);
    bool ok = cu_nvrtc_compile(src, "dynamic.cu", "sm_90", &cubin, &size, &log);
    cr_assert(ok && size > 0 && (!log || !strstr(log, "warning")), "NVRTC:\n%s\n%s", log ? log : "?", dyn_source);
    free(src), free(cubin), free(log);
  } else {
    fprintf(stderr, "test_cuda_eager: this build has NO NVRTC: the dynamic kernels were NOT compiled for sm_90\n");
  }
  free(dyn_source), dyn_source = NULL;
}
