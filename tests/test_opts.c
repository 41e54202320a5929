/* tests/test_opts.c: torch's keyword options of existing ops (issue 21).
 *
 * Each option is held to PyTorch's semantics with values worked out by hand (or by Python's own
 * integer and float arithmetic, quoted in the comments), its gradient checked by finite
 * differences in f64, and its compiled forms (backends eager, aot_eager, inductor; the second
 * call a replay) checked against eager, values and gradients. The suite also runs on CUDA
 * (EMBER_TEST_DEVICE=cuda: the GPU, or the host emulator). */
#include "common.h"
#include "gradcheck.h"

#define F EM_F32
#define D EM_F64

/* ---- helpers ---- */

/* An i64 tensor from exact 64-bit values (T goes through double, which holds 53 bits). */
static em_tensor *i64s(int n, const int64_t *v) { return em_from_data(v, EM_I64, 1, (int64_t[]){n}); }
#define I64S(...) i64s((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__})

static void expect_i64(em_tensor *t, int n, const int64_t *want, const char *file, int line) {
  cr_assert_not_null(t, "%s:%d: %s", file, line, em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_dtype_of(t), EM_I64, "%s:%d: dtype %s", file, line, em_dtype_name(em_dtype_of(t)));
  cr_assert_eq(em_numel(t), n, "%s:%d: %lld elements", file, line, (long long)em_numel(t));
  int64_t got[64];
  cr_assert(n <= 64 && em_to_buffer(t, EM_I64, got, sizeof(int64_t) * (size_t)n));
  for (int i = 0; i < n; i++)
    cr_assert_eq(got[i], want[i], "%s:%d: element %d is %lld, expected %lld", file, line, i, (long long)got[i],
                 (long long)want[i]);
}
#define EXPECT_I64(t, ...) expect_i64((t), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
                                      (const int64_t[]){__VA_ARGS__}, __FILE__, __LINE__)

/* Whether element i of t has its sign bit set (-0.0 and 0.0 compare equal). */
static bool negative_bit(em_tensor *t, int64_t i) { return signbit(etest_at(t, i)); }

/* a and b agree: same dtype and shape, values within tol (0: the same bits). */
static void expect_close(em_tensor *a, em_tensor *b, double tol, const char *what) {
  if (tol == 0) {
    EXPECT_SAME_BITS(a, b, what);
    return;
  }
  cr_assert(a && b, "%s: NULL: %s", what, em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_dtype_of(a), em_dtype_of(b), "%s: dtypes differ", what);
  cr_assert_eq(em_numel(a), em_numel(b), "%s: sizes differ", what);
  int64_t n = em_numel(a);
  double *x = malloc(sizeof(double) * (size_t)(n ? n : 1)), *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
  cr_assert(em_to_buffer(a, EM_F64, x, sizeof(double) * (size_t)n) && em_to_buffer(b, EM_F64, y, sizeof(double) * (size_t)n));
  for (int64_t i = 0; i < n; i++) {
    bool ok = (isnan(x[i]) && isnan(y[i])) || fabs(x[i] - y[i]) <= tol * (1 + fabs(y[i]));
    if (!ok) {
      double u = x[i], v = y[i];
      free(x), free(y);
      cr_assert_fail("%s: element %lld: %.17g against eager's %.17g", what, (long long)i, u, v);
    }
  }
  free(x), free(y);
}

/* The op under test, as a model function for em_compile. */
typedef em_tensor *(*op_fn)(em_tensor *const *in);
typedef struct {
  op_fn f;
} op_ctx;
static em_outputs run_op(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  return EM_OUTPUTS(((op_ctx *)ctx)->f(in));
}

/* A cotangent for y: 1, -2, 3, -4, ... (float y only). */
static em_tensor *cotangent(em_tensor *y) {
  em_device prev = em_set_default_device(em_device_of(y));
  em_tensor *i = em_arange(EM_F64, 1, (double)em_numel(y) + 1, 1);
  em_tensor *s = em_sub_scalar(em_mul_scalar(em_remainder_scalar(i, 2), 2), 1); /* +1, -1, ... */
  em_set_default_device(prev);
  return em_cast(em_reshape(em_mul(i, s), em_ndim(y), em_sizes(y)), em_dtype_of(y));
}

/* f on inputs in, eagerly, and compiled by each backend, called twice (the second call a replay
 * when replay is set: f makes no graph break): values within tol (0: the same bits), and, for
 * the first n_grad inputs (float leaves requiring grad), the gradients of <v, f> likewise. */
static void agree(const char *what, op_fn f, int n, em_tensor *const *in, int n_grad, double tol, bool replay) {
  static const char *backends[] = {"eager", "aot_eager", "inductor"};
  em_tensor *y = f(in);
  cr_assert_not_null(y, "%s: eager: %s", what, em_last_error() ? em_last_error() : "");
  em_tensor *v = NULL, *g[4];
  if (n_grad) {
    v = cotangent(y);
    cr_assert(em_grad(1, &y, &v, n_grad, in, g, false, false), "%s: %s", what, em_last_error());
  }
  for (int b = 0; b < 3; b++) {
    op_ctx ctx = {f};
    em_compiled *c = em_compile(run_op, &(em_compile_options){.backend = backends[b], .check_every = -1});
    for (int call = 0; call < 2; call++) {
      char msg[160];
      snprintf(msg, sizeof msg, "%s: %s, call %d", what, backends[b], call);
      em_outputs o = em_call_n(c, &ctx, n, in);
      cr_assert(o.n == 1 && o.t[0], "%s: %s", msg, em_last_error() ? em_last_error() : "");
      expect_close(o.t[0], y, tol, msg);
      if (n_grad) {
        em_tensor *cg[4];
        cr_assert(em_grad(1, &o.t[0], &v, n_grad, in, cg, false, false), "%s: %s", msg, em_last_error());
        for (int i = 0; i < n_grad; i++) expect_close(cg[i], g[i], tol, msg);
      }
    }
    em_compile_stats st = em_compiled_stats(c);
    if (replay) cr_assert_eq(st.replays, 1, "%s: %s: %lld replays", what, backends[b], (long long)st.replays);
    em_compiled_free(c);
  }
}

/* ---- 1. alpha on add and sub ---- */

ETEST(opts, add_sub_alpha) {
  em_tensor *a = T(F, SHAPE(3), 1, 2, 3), *b = T(F, SHAPE(3), 10, 20, 30);
  EXPECT(em_add_alpha(a, b, 0.5), F, SHAPE(3), 0, 6, 12, 18);
  EXPECT(em_sub_alpha(a, b, 0.5), F, SHAPE(3), 0, -4, -8, -12);
  EXPECT(em_sub_alpha(a, b, -2), F, SHAPE(3), 0, 21, 42, 63);
  /* broadcasting [2, 1] with [3] */
  EXPECT(em_add_alpha(T(F, SHAPE(2, 1), 1, 2), b, 2), F, SHAPE(2, 3), 0, 21, 41, 61, 22, 42, 62);
  /* integers keep their dtype with an integer alpha */
  em_tensor *ia = T(EM_I64, SHAPE(2), 1, 2), *ib = T(EM_I64, SHAPE(2), 3, 4);
  EXPECT(em_add_alpha(ia, ib, 3), EM_I64, SHAPE(2), 0, 10, 14);
  EXPECT(em_sub_alpha(ia, ib, 3), EM_I64, SHAPE(2), 0, -8, -10);
  EXPECT(em_add_alpha(T(EM_I32, SHAPE(2), 1, 2), T(EM_I32, SHAPE(2), 3, 4), -1), EM_I32, SHAPE(2), 0, -2, -2);
  /* an integer b joining a float a: f32, scaled in f32 (2^62 * 4 would overflow i64) */
  EXPECT(em_add_alpha(T(F, SHAPE(1), 1), T(EM_I64, SHAPE(1), 0x1p62), 4), F, SHAPE(1), 0, 0x1p64);
  EXPECT(em_add_alpha(ia, T(F, SHAPE(2), 1, 1), 0.25), F, SHAPE(2), 0, 1.25, 2.25);
  /* alpha 1 is em_add, bit for bit */
  em_tensor *x = em_randn(F, EM_SHAPE(5)), *y = em_randn(F, EM_SHAPE(5));
  EXPECT_SAME_BITS(em_add_alpha(x, y, 1), em_add(x, y), "alpha 1");
  EXPECT_SAME_BITS(em_sub_alpha(x, y, 1), em_sub(x, y), "alpha 1");
  EXPECT(em_add_alpha(T(EM_BOOL, SHAPE(2), 1, 0), T(EM_BOOL, SHAPE(2), 0, 0), 1), EM_BOOL, SHAPE(2), 0, 1, 0);
  /* as torch: a fractional alpha has no integer result */
  EXPECT_ERROR(em_add_alpha(ia, ib, 0.5), "alpha 0.5 must be an integer");
  EXPECT_ERROR(em_sub_alpha(ia, ib, NAN), "must be an integer");
  EXPECT_ERROR(em_sub_alpha(ia, ib, 1e300), "alpha 1e+300 does not fit the result dtype i64");
  EXPECT_ERROR(em_add_alpha(T(EM_U8, SHAPE(1), 1), T(EM_U8, SHAPE(1), 1), 256), "alpha 256 does not fit the result dtype u8");
  EXPECT_ERROR(em_add_alpha(T(EM_BOOL, SHAPE(1), 1), T(EM_BOOL, SHAPE(1), 1), 2), "alpha 1 only");
  EXPECT_ERROR(em_add_alpha(a, T(F, SHAPE(2), 1, 2), 2), "broadcast");
  EXPECT_ERROR(em_add_alpha(a, EM_NONE, 2), "EM_NONE");
  cr_assert_null(em_sub_alpha(NULL, a, 2));
  cr_assert_null(em_last_error());
}

static em_tensor *add_alpha_fn(em_tensor *const *x, void *ctx) {
  (void)ctx;
  return em_add_alpha(x[0], em_expand(x[1], 2, (int64_t[]){2, 3}), -1.5);
}
static em_tensor *sub_alpha_fn(em_tensor *const *x, void *ctx) {
  (void)ctx;
  return em_sub_alpha(em_transpose(x[0], 0, 1), x[1], 2.5);
}

ETEST(opts, add_sub_alpha_gradient) {
  em_tensor *x[2] = {gc_leaf(-1, 1, 2, (int64_t[]){2, 3}), gc_leaf(-1, 1, 1, (int64_t[]){3})};
  gradcheck("add alpha", add_alpha_fn, NULL, 2, x);
  em_tensor *z[2] = {gc_leaf(-1, 1, 2, (int64_t[]){3, 2}), gc_leaf(-1, 1, 2, (int64_t[]){2, 3})};
  gradcheck("sub alpha", sub_alpha_fn, NULL, 2, z);
  /* exactly: the gradient of b is -alpha g */
  em_tensor *a = em_requires_grad_(T(D, SHAPE(2), 1, 2), true), *b = em_requires_grad_(T(D, SHAPE(2), 3, 4), true);
  em_tensor *g[2], *ins[2] = {a, b}, *out = em_sub_alpha(a, b, 2.5), *v = T(D, SHAPE(2), 1, -2);
  cr_assert(em_grad(1, &out, &v, 2, ins, g, false, false));
  EXPECT(g[0], D, SHAPE(2), 0, 1, -2);
  EXPECT(g[1], D, SHAPE(2), 0, -2.5, 5);
}

static em_tensor *alpha_f32(em_tensor *const *in) { return em_sub_alpha(in[0], in[1], 0.75); }
static em_tensor *alpha_i64(em_tensor *const *in) { return em_add_alpha(in[0], in[1], -3); }

ETEST(opts, add_sub_alpha_compiled) {
  em_tensor *in[2] = {em_requires_grad_(em_randn(F, EM_SHAPE(4, 3)), true), em_requires_grad_(em_randn(F, EM_SHAPE(3)), true)};
  agree("sub alpha f32", alpha_f32, 2, in, 2, 0, true);
  em_tensor *ii[2] = {T(EM_I64, SHAPE(3), 5, -6, 7), T(EM_I64, SHAPE(3), 1, 2, -3)};
  agree("add alpha i64", alpha_i64, 2, ii, 0, 0, true);
}

/* ---- 2. div with a rounding mode ---- */

ETEST(opts, div_mode_integers) {
  em_tensor *a = T(EM_I64, SHAPE(6), 7, -7, 7, -7, 0, 6), *b = T(EM_I64, SHAPE(6), 2, 2, -2, -2, 3, 3);
  /* Python: 7 // 2, -7 // 2, 7 // -2, -7 // -2, 0 // 3, 6 // 3 */
  EXPECT(em_div_mode(a, b, EM_ROUND_FLOOR), EM_I64, SHAPE(6), 0, 3, -4, -4, 3, 0, 2);
  EXPECT(em_div_mode(a, b, EM_ROUND_TRUNC), EM_I64, SHAPE(6), 0, 3, -3, -3, 3, 0, 2);
  /* no rounding mode: true division, integers to f32 */
  EXPECT(em_div_mode(a, b, EM_ROUND_NONE), F, SHAPE(6), 0, 3.5, -3.5, -3.5, 3.5, 0, 2);
  EXPECT(em_div_mode(T(EM_I32, SHAPE(3), -9, 9, 2147483647), T(EM_I32, SHAPE(3), 4, -4, 2), EM_ROUND_FLOOR), EM_I32,
         SHAPE(3), 0, -3, -3, 1073741823);
  EXPECT(em_div_mode(T(EM_I32, SHAPE(2), -9, 9), T(EM_I32, SHAPE(1), -4), EM_ROUND_TRUNC), EM_I32, SHAPE(2), 0, 2, -2);
  EXPECT(em_div_mode(T(EM_U8, SHAPE(2), 7, 200), T(EM_U8, SHAPE(2), 2, 3), EM_ROUND_FLOOR), EM_U8, SHAPE(2), 0, 3, 66);
  /* every bit of i64: the quotients are Python's a // b (wrapped to 64 bits where it overflows),
   * and for trunc int(abs(a) // abs(b)) with the sign of a * b */
  const int64_t M = INT64_MAX, m = INT64_MIN;
  em_tensor *ba = I64S(M, m, M, -(1ll << 62) - 1, (1ll << 53) + 1, m, M, 1, -1, m, -(1ll << 60) - 7, (1ll << 62) + 12345);
  em_tensor *bb = I64S(7, 3, -2, 1000000000000ll, 3, -1, m, m, m, m, 3, -7);
  EXPECT_I64(em_div_mode(ba, bb, EM_ROUND_FLOOR), 1317624576693539401ll, -3074457345618258603ll, -4611686018427387904ll,
             -4611687, 3002399751580331ll, m, -1, -1, 0, 1, -384307168202282328ll, -658812288346771465ll);
  EXPECT_I64(em_div_mode(ba, bb, EM_ROUND_TRUNC), 1317624576693539401ll, -3074457345618258602ll, -4611686018427387903ll,
             -4611686, 3002399751580331ll, m, 0, 0, 0, 1, -384307168202282327ll, -658812288346771464ll);
  /* INT64_MIN % -1 overflows in C: the CUDA kernel trapped on the emulator (SIGFPE) where the CPU's
   * special-cases it */
  EXPECT_I64(em_remainder(I64S(m, m, 7), I64S(-1, 1, -1)), 0, 0, 0);
  /* as torch on the CPU: an integer division by zero is an error */
  EXPECT_ERROR(em_div_mode(a, T(EM_I64, SHAPE(6), 1, 1, 0, 1, 1, 1), EM_ROUND_FLOOR), "by zero");
  EXPECT_ERROR(em_div_mode(a, T(EM_I64, SHAPE(1), 0), EM_ROUND_TRUNC), "by zero");
  EXPECT_ERROR(em_div_mode(T(EM_BOOL, SHAPE(1), 1), T(EM_BOOL, SHAPE(1), 1), EM_ROUND_FLOOR), "numeric operands");
  EXPECT_ERROR(em_div_mode(a, b, (em_rounding_mode)7), "unknown rounding mode 7");
  EXPECT_ERROR(em_div_mode(a, T(EM_I64, SHAPE(4), 1, 1, 1, 1), EM_ROUND_FLOOR), "broadcast");
  EXPECT_ERROR(em_div_mode(EM_NONE, b, EM_ROUND_FLOOR), "EM_NONE");
}

ETEST(opts, div_mode_floats) {
  /* Python's float //, the algorithm torch's floor mode shares: 1 // 0.1 is 9.0 (fmod(1, 0.1) is
   * 0.09999999999999995) where floor(1 / 0.1) is 10; -1 // 0.1 is -10.0; 7.5 // 2 is 3.0,
   * -7.5 // 2 and 7.5 // -2 are -4.0; 5 // inf is 0.0 and -5 // inf is -1.0 */
  em_tensor *a = T(D, SHAPE(8), 1, -1, 7.5, -7.5, 7.5, 5, -5, INFINITY);
  em_tensor *b = T(D, SHAPE(8), 0.1, 0.1, 2, 2, -2, INFINITY, INFINITY, 2);
  EXPECT(em_div_mode(a, b, EM_ROUND_FLOOR), D, SHAPE(8), 0, 9, -10, 3, -4, -4, 0, -1, NAN);
  EXPECT(em_div_mode(a, b, EM_ROUND_TRUNC), D, SHAPE(8), 0, 10, -10, 3, -3, -3, 0, -0.0, INFINITY);
  /* division by zero is IEEE's a / b in both modes; zero quotients keep the sign of a / b */
  em_tensor *z = T(D, SHAPE(5), 5, -5, 0, 0, -0.0), *zb = T(D, SHAPE(5), 0, 0, 0, -3, 3);
  em_tensor *fz = em_div_mode(z, zb, EM_ROUND_FLOOR), *tz = em_div_mode(z, zb, EM_ROUND_TRUNC);
  EXPECT(fz, D, SHAPE(5), 0, INFINITY, -INFINITY, NAN, 0, 0);
  EXPECT(tz, D, SHAPE(5), 0, INFINITY, -INFINITY, NAN, 0, 0);
  cr_assert(negative_bit(fz, 3) && negative_bit(fz, 4) && negative_bit(tz, 3) && negative_bit(tz, 4), "-0.0 expected");
  cr_assert(!negative_bit(em_div_mode(T(D, SHAPE(1), 0), T(D, SHAPE(1), 3), EM_ROUND_FLOOR), 0));
  /* trunc of a negative quotient below 1 is -0.0, as trunc(-0.25) */
  cr_assert(negative_bit(em_div_mode(T(D, SHAPE(1), -1), T(D, SHAPE(1), 4), EM_ROUND_TRUNC), 0));
  /* f32 and mixed dtypes: an integer joining a float gives the float */
  EXPECT(em_div_mode(T(F, SHAPE(3), 7, -7, 2.5), T(EM_I64, SHAPE(3), 2, 2, 1), EM_ROUND_FLOOR), F, SHAPE(3), 0, 3, -4, 2);
  EXPECT(em_div_mode(T(EM_I32, SHAPE(2), 7, -7), T(F, SHAPE(1), 2), EM_ROUND_TRUNC), F, SHAPE(2), 0, 3, -3);
  EXPECT(em_div_mode(T(F, SHAPE(2), 1, 3), T(F, SHAPE(2), 4, 2), EM_ROUND_NONE), F, SHAPE(2), 0, 0.25, 1.5);
}

static em_tensor *div_floor_fn(em_tensor *const *x, void *ctx) {
  return em_div_mode(x[0], x[1], *(em_rounding_mode *)ctx);
}

ETEST(opts, div_mode_gradient_is_zero) {
  for (int mode = EM_ROUND_TRUNC; mode <= EM_ROUND_FLOOR; mode++) {
    em_tensor *a = em_requires_grad_(T(D, SHAPE(3), 7.5, -3, 2), true), *b = em_requires_grad_(T(D, SHAPE(1), 2), true);
    em_tensor *y = em_div_mode(a, b, (em_rounding_mode)mode), *g[2], *ins[2] = {a, b}, *v = T(D, SHAPE(3), 1, 2, 3);
    cr_assert(em_requires_grad(y), "the result requires grad, as torch's");
    cr_assert(em_grad(1, &y, &v, 2, ins, g, false, false), "%s", em_last_error());
    EXPECT(g[0], D, SHAPE(3), 0, 0, 0, 0);
    EXPECT(g[1], D, SHAPE(1), 0, 0);
    /* finite differences agree away from the jumps */
    em_tensor *x[2] = {gc_leaf(0.1, 0.9, 1, (int64_t[]){4}), gc_leaf(2, 3, 1, (int64_t[]){4})};
    em_rounding_mode md = (em_rounding_mode)mode;
    gradcheck("div mode", div_floor_fn, &md, 2, x);
  }
  /* zero where b = 0 too (floor mode's result there is a / b, whose own gradient is not) */
  em_tensor *a = em_requires_grad_(T(D, SHAPE(2), 1, -2), true), *b = em_requires_grad_(T(D, SHAPE(2), 0, 0), true);
  em_tensor *g[2], *ins[2] = {a, b}, *v = T(D, SHAPE(2), 1, 1);
  for (int mode = EM_ROUND_TRUNC; mode <= EM_ROUND_FLOOR; mode++) {
    em_tensor *y = em_div_mode(a, b, (em_rounding_mode)mode);
    EXPECT(y, D, SHAPE(2), 0, INFINITY, -INFINITY);
    cr_assert(em_grad(1, &y, &v, 2, ins, g, false, false), "%s", em_last_error());
    EXPECT(g[0], D, SHAPE(2), 0, 0, 0);
    EXPECT(g[1], D, SHAPE(2), 0, 0, 0);
  }
  /* 0-dim operands promote as the binary ops do: f32[2] // f64[] is f32 */
  EXPECT(em_div_mode(T(F, SHAPE(2), 7, -7), T(D, SCALAR_SHAPE, 2), EM_ROUND_FLOOR), F, SHAPE(2), 0, 3, -4);
  EXPECT(em_div_mode(T(EM_I32, SHAPE(2), 7, -7), T(EM_I64, SCALAR_SHAPE, 2), EM_ROUND_TRUNC), EM_I32, SHAPE(2), 0, 3, -3);
  EXPECT(em_sub_alpha(T(EM_I32, SHAPE(2), 7, -7), T(EM_I64, SCALAR_SHAPE, 2), 2), EM_I32, SHAPE(2), 0, 3, -11);
  /* no grad wanted, none made */
  cr_assert(!em_requires_grad(em_div_mode(T(D, SHAPE(1), 1), T(D, SHAPE(1), 2), EM_ROUND_FLOOR)));
}

static em_tensor *floor_f32(em_tensor *const *in) { return em_div_mode(in[0], in[1], EM_ROUND_FLOOR); }
static em_tensor *trunc_f32(em_tensor *const *in) { return em_div_mode(in[0], in[1], EM_ROUND_TRUNC); }

ETEST(opts, div_mode_compiled) {
  em_tensor *in[2] = {em_requires_grad_(em_mul_scalar(em_randn(F, EM_SHAPE(4, 5)), 10), true),
                      em_requires_grad_(T(F, SHAPE(5), 0.1, -3, 7, 0, -0.5), true)};
  agree("floor f32", floor_f32, 2, in, 2, 0, true);
  agree("trunc f32", trunc_f32, 2, in, 2, 0, true);
  em_tensor *ii[2] = {T(EM_I64, SHAPE(2, 3), 7, -7, 100, -100, 5, 0), T(EM_I64, SHAPE(3), 2, -3, 7)};
  agree("floor i64", floor_f32, 2, ii, 0, 0, true);
  agree("trunc i64", trunc_f32, 2, ii, 0, 0, true);
}

/* ---- 3. negative padding crops ---- */

ETEST(opts, pad_negative_crops) {
  em_tensor *x = T(F, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
  EXPECT(em_pad(x, 2, (int64_t[]){-1, 2}, 9), F, SHAPE(2, 4), 0, 2, 3, 9, 9, 5, 6, 9, 9);
  EXPECT(em_pad(x, 2, (int64_t[]){-1, -1}, 9), F, SHAPE(2, 1), 0, 2, 5);
  /* (left 1, right -2) of the last dim, (top -1, bottom 0) of the first */
  EXPECT(em_pad(x, 4, (int64_t[]){1, -2, -1, 0}, 7), F, SHAPE(1, 2), 0, 7, 4);
  EXPECT(em_pad(x, 4, (int64_t[]){0, 0, 1, -2}, 0), F, SHAPE(1, 3), 0, 0, 0, 0);
  /* cropping everything leaves an empty dim */
  EXPECT(em_pad(x, 2, (int64_t[]){-3, 0}, 0), F, SHAPE(2, 0), 0);
  EXPECT(em_pad(x, 2, (int64_t[]){-1, -2}, 0), F, SHAPE(2, 0), 0);
  EXPECT(em_pad(T(EM_I64, SHAPE(4), 1, 2, 3, 4), 2, (int64_t[]){-2, 1}, -1), EM_I64, SHAPE(3), 0, 3, 4, -1);
  /* the result is a copy, not a view of x */
  em_tensor *c = em_pad(x, 2, (int64_t[]){-1, 0}, 0);
  em_fill_(c, 0);
  EXPECT(x, F, SHAPE(2, 3), 0, 1, 2, 3, 4, 5, 6);
  EXPECT_ERROR(em_pad(x, 2, (int64_t[]){-2, -2}, 0), "crop more than the 3 elements of axis 1");
  EXPECT_ERROR(em_pad(x, 2, (int64_t[]){-4, 5}, 0), "crop more than");
  EXPECT_ERROR(em_pad(x, 4, (int64_t[]){0, 0, INT64_MIN, 0}, 0), "crop more than the 2 elements of axis 0");
  EXPECT_ERROR(em_pad(x, 3, (int64_t[]){-1, 0, 0}, 0), "even number of pads");
  EXPECT_ERROR(em_pad(x, 6, (int64_t[]){-1, 0, 0, 0, 0, 0}, 0), "at most 2 per dim");
}

static em_tensor *pad_fn(em_tensor *const *x, void *ctx) {
  (void)ctx;
  return em_pad(x[0], 4, (int64_t[]){-1, 2, 1, -2}, 0.5);
}
static em_tensor *pad_op(em_tensor *const *in) { return em_pad(in[0], 4, (int64_t[]){2, -1, -1, 1}, -3); }

ETEST(opts, pad_negative_gradient_and_compiled) {
  em_tensor *x[1] = {gc_leaf(-1, 1, 2, (int64_t[]){4, 3})};
  gradcheck("pad crop", pad_fn, NULL, 1, x);
  /* exactly: the cropped elements get 0, the others the gradient at their place */
  em_tensor *a = em_requires_grad_(T(D, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), true), *g;
  em_tensor *y = em_pad(a, 2, (int64_t[]){-1, 1}, 0), *v = T(D, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
  cr_assert(em_grad(1, &y, &v, 1, &a, &g, false, false));
  EXPECT(g, D, SHAPE(2, 3), 0, 0, 1, 2, 0, 4, 5);
  em_tensor *in[1] = {em_requires_grad_(em_randn(F, EM_SHAPE(3, 5)), true)};
  agree("pad crop", pad_op, 1, in, 1, 0, true);
}

/* ---- 4. squeezing an axis whose size is not 1 is a no-op ---- */

ETEST(opts, squeeze_non_unit_axis_is_a_no_op) {
  em_tensor *x = T(F, SHAPE(2, 1, 3), 1, 2, 3, 4, 5, 6);
  EXPECT(em_squeeze(x, EM_AXES(0)), F, SHAPE(2, 1, 3), 0, 1, 2, 3, 4, 5, 6);
  EXPECT(em_squeeze(x, EM_AXES(0, 1)), F, SHAPE(2, 3), 0, 1, 2, 3, 4, 5, 6);
  EXPECT(em_squeeze(x, EM_AXES(-1, -2, 0)), F, SHAPE(2, 3), 0, 1, 2, 3, 4, 5, 6);
  EXPECT(em_squeeze(em_transpose(x, 0, 2), EM_AXES(0)), F, SHAPE(3, 1, 2), 0, 1, 4, 2, 5, 3, 6);
  EXPECT(em_squeeze(T(F, SCALAR_SHAPE, 7), EM_AXES(0)), F, SCALAR_SHAPE, 0, 7);
  /* still a view: a write through it reaches x */
  em_tensor *v = em_squeeze(x, EM_AXES(2));
  em_fill_(em_slice(v, 0, 0, 1, 1), -1);
  EXPECT(x, F, SHAPE(2, 1, 3), 0, -1, -1, -1, 4, 5, 6);
  EXPECT_ERROR(em_squeeze(x, EM_AXES(3)), "axis 3 out of range");
  EXPECT_ERROR(em_squeeze(x, EM_AXES(0, -3)), "axis 0 repeated");
}

static em_tensor *squeeze_fn(em_tensor *const *x, void *ctx) {
  (void)ctx;
  return em_mul(em_squeeze(x[0], EM_AXES(0, 2)), em_reshape(em_squeeze(x[0], EM_AXES(1)), EM_SHAPE(3, 2)));
}
static em_tensor *squeeze_op(em_tensor *const *in) { return em_exp(em_squeeze(in[0], EM_AXES(0, 1))); }

ETEST(opts, squeeze_no_op_gradient_and_compiled) {
  em_tensor *x[1] = {gc_leaf(-1, 1, 3, (int64_t[]){3, 2, 1})};
  gradcheck("squeeze", squeeze_fn, NULL, 1, x);
  em_tensor *in[1] = {em_requires_grad_(em_randn(F, EM_SHAPE(4, 1, 2)), true)};
  agree("squeeze", squeeze_op, 1, in, 1, 0, true);
}

/* ---- 5. scatter_add with a src larger than index ---- */

ETEST(opts, scatter_add_uses_the_index_shaped_block_of_src) {
  em_tensor *x = em_zeros(F, EM_SHAPE(3));
  EXPECT(em_scatter_add(x, 0, T(EM_I64, SHAPE(2), 0, 2), T(F, SHAPE(4), 1, 2, 3, 4)), F, SHAPE(3), 0, 1, 0, 2);
  /* 2-D, axis 1: index [2, 2] reads src[:2, :2] of a [3, 4] src */
  em_tensor *src = T(F, SHAPE(3, 4), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
  em_tensor *idx = T(EM_I64, SHAPE(2, 2), 2, 2, 0, 1);
  EXPECT(em_scatter_add(em_ones(F, EM_SHAPE(2, 3)), 1, idx, src), F, SHAPE(2, 3), 0, 1, 1, 4, 6, 7, 1);
  /* axis 0, src larger along the scattered axis and off it */
  EXPECT(em_scatter_add(em_zeros(F, EM_SHAPE(2, 2)), 0, T(EM_I64, SHAPE(1, 2), 1, 0), src), F, SHAPE(2, 2), 0, 0, 2, 1, 0);
  /* a non-contiguous src: its transpose [4, 3] */
  EXPECT(em_scatter_add(em_zeros(F, EM_SHAPE(2, 3)), 1, idx, em_transpose(src, 0, 1)), F, SHAPE(2, 3), 0, 0, 0, 6, 2, 6, 0);
  EXPECT_ERROR(em_scatter_add(x, 0, T(EM_I64, SHAPE(2), 0, 1), T(F, SHAPE(1), 1)), "larger than src");
}

static em_tensor *scatter_fn(em_tensor *const *x, void *ctx) {
  (void)ctx;
  em_tensor *idx = T(EM_I64, SHAPE(2, 2), 2, 2, 0, 1);
  return em_scatter_add(x[0], 1, idx, x[1]);
}
static em_tensor *scatter_op(em_tensor *const *in) { return em_scatter_add(in[0], 1, in[2], in[1]); }

ETEST(opts, scatter_add_large_src_gradient_and_compiled) {
  em_tensor *x[2] = {gc_leaf(-1, 1, 2, (int64_t[]){2, 3}), gc_leaf(-1, 1, 2, (int64_t[]){3, 4})};
  gradcheck("scatter_add", scatter_fn, NULL, 2, x);
  /* exactly: src's gradient is g at the index inside the block, 0 outside it */
  em_tensor *s = em_requires_grad_(em_zeros(D, EM_SHAPE(2, 3)), true), *g;
  em_tensor *y = scatter_fn((em_tensor *[]){em_zeros(D, EM_SHAPE(2, 3)), s}, NULL), *v = T(D, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
  cr_assert(em_grad(1, &y, &v, 1, &s, &g, false, false), "%s", em_last_error());
  EXPECT(g, D, SHAPE(2, 3), 0, 3, 3, 0, 4, 5, 0);
  em_tensor *in[3] = {em_requires_grad_(em_randn(F, EM_SHAPE(2, 3)), true), em_requires_grad_(em_randn(F, EM_SHAPE(3, 5)), true),
                      T(EM_I64, SHAPE(2, 2), 2, 2, 0, 1)};
  agree("scatter_add", scatter_op, 3, in, 2, 0, true);
}

/* ---- 6. embedding's padding_idx ---- */

ETEST(opts, embedding_padding_idx) {
  em_tensor *w = em_requires_grad_(T(D, SHAPE(4, 2), 1, 2, 3, 4, 5, 6, 7, 8), true);
  em_tensor *idx = T(EM_I64, SHAPE(2, 2), 0, 2, 2, 3);
  for (int k = 0; k < 2; k++) {
    /* row 2, or -2 counted from the end: forward unchanged, row 2's gradient zero */
    em_tensor *y = em_embedding_ex(idx, w, ((em_embedding_opts){true, k ? -2 : 2})), *g;
    EXPECT(y, D, SHAPE(2, 2, 2), 0, 1, 2, 5, 6, 5, 6, 7, 8);
    em_tensor *v = T(D, SHAPE(2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8);
    cr_assert(em_grad(1, &y, &v, 1, &w, &g, false, false), "%s", em_last_error());
    EXPECT(g, D, SHAPE(4, 2), 0, 1, 2, 0, 0, 0, 0, 7, 8);
  }
  /* without padding_idx, as em_embedding: row 2 gathers both of its positions */
  em_tensor *y = em_embedding_ex(T(EM_I32, SHAPE(3), 0, 2, 2), w, EM_EMBEDDING_DEFAULT), *g;
  em_tensor *v = T(D, SHAPE(3, 2), 1, 2, 3, 4, 5, 6);
  cr_assert(em_grad(1, &y, &v, 1, &w, &g, false, false));
  EXPECT(g, D, SHAPE(4, 2), 0, 1, 2, 0, 0, 8, 10, 0, 0);
  EXPECT_SAME_BITS(em_embedding(idx, w), em_embedding_ex(idx, w, ((em_embedding_opts){true, 0})), "forward unchanged");
  EXPECT_ERROR(em_embedding_ex(idx, w, ((em_embedding_opts){true, 4})), "em_embedding_ex: padding_idx 4 is outside the 4 rows");
  EXPECT_ERROR(em_embedding_ex(idx, w, ((em_embedding_opts){true, -5})), "padding_idx -5");
  EXPECT_ERROR(em_embedding_ex(idx, T(D, SHAPE(2), 1, 2), EM_EMBEDDING_DEFAULT), "em_embedding_ex: weight must be [V, D]");
}

static em_tensor *embedding_op(em_tensor *const *in) {
  return em_embedding_ex(in[1], in[0], ((em_embedding_opts){true, 1}));
}

ETEST(opts, embedding_padding_idx_compiled) {
  em_tensor *in[2] = {em_requires_grad_(em_randn(F, EM_SHAPE(5, 3)), true), T(EM_I64, SHAPE(2, 3), 1, 0, 1, 4, 1, 2)};
  agree("embedding padding_idx", embedding_op, 2, in, 1, 0, true);
  /* and the compiled gradient is zero at row 1 */
  em_compiled *c = em_compile(run_op, &(em_compile_options){.backend = "inductor"});
  em_outputs o = em_call_n(c, &(op_ctx){embedding_op}, 2, in);
  cr_assert(em_backward(em_sum(o.t[0], 0, NULL, false), NULL), "%s", em_last_error());
  EXPECT(em_get_grad(in[0]), F, SHAPE(5, 3), 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1);
  em_compiled_free(c);
}

/* ---- 7. one_hot infers the class count from -1 ---- */

ETEST(opts, one_hot_infers_the_class_count) {
  EXPECT(em_one_hot(T(EM_I64, SHAPE(3), 0, 2, 1), -1), EM_I64, SHAPE(3, 3), 0, 1, 0, 0, 0, 0, 1, 0, 1, 0);
  EXPECT(em_one_hot(T(EM_I32, SHAPE(2, 1), 3, 1), -1), EM_I64, SHAPE(2, 1, 4), 0, 0, 0, 0, 1, 0, 1, 0, 0);
  EXPECT(em_one_hot(T(EM_I64, SCALAR_SHAPE, 0), -1), EM_I64, SHAPE(1), 0, 1);
  /* an explicit count is unchanged */
  EXPECT(em_one_hot(T(EM_I64, SHAPE(2), 0, 1), 3), EM_I64, SHAPE(2, 3), 0, 1, 0, 0, 0, 1, 0);
  EXPECT_ERROR(em_one_hot(em_zeros(EM_I64, EM_SHAPE(0)), -1), "cannot infer the number of classes from empty indices i64[0]");
  EXPECT_ERROR(em_one_hot(T(EM_I64, SHAPE(2), 2, -1), -1), "an index is outside [0, 3)");
  EXPECT_ERROR(em_one_hot(T(EM_I64, SHAPE(2), -2, -1), -1), "an index is outside [0, 0)");
  EXPECT_ERROR(em_one_hot(I64S(INT64_MAX), -1), "leaves no class count");
  EXPECT_ERROR(em_one_hot(T(EM_I64, SHAPE(1), 0), -2), "needs at least one class (or -1), got -2");
  EXPECT_ERROR(em_one_hot(T(F, SHAPE(1), 0), -1), "indices must be i64 or i32");
}

static em_tensor *one_hot_op(em_tensor *const *in) { return em_one_hot(in[0], -1); }

ETEST(opts, one_hot_infers_compiled) {
  /* the host read is a graph break: every call runs fn, and still agrees */
  em_tensor *in[1] = {T(EM_I64, SHAPE(2, 2), 4, 0, 2, 1)};
  agree("one_hot -1", one_hot_op, 1, in, 0, 0, false);
}

/* ---- 8. conv2d padding 'same' and 'valid' ---- */

static em_conv2d_params conv_mode(em_conv_padding mode, int64_t dh, int64_t dw) {
  em_conv2d_params p = EM_CONV2D_DEFAULT;
  p.padding_mode = mode;
  p.dilation[0] = dh, p.dilation[1] = dw;
  return p;
}

ETEST(opts, conv2d_same_and_valid) {
  em_tensor *x = em_reshape(em_arange(D, 1, 17, 1), EM_SHAPE(1, 1, 4, 4)), *w = em_ones(D, EM_SHAPE(1, 1, 2, 2));
  /* an even kernel: torch pads the extra zero on the right and bottom, so out[i][j] sums
   * x[i..i+1][j..j+1] */
  EXPECT(em_conv2d(x, w, EM_NONE, conv_mode(EM_CONV_PAD_SAME, 1, 1)), D, SHAPE(1, 1, 4, 4), 0,
         14, 18, 22, 12, 30, 34, 38, 20, 46, 50, 54, 28, 27, 29, 31, 16);
  /* 'valid' ignores the padding amounts */
  em_conv2d_params v = conv_mode(EM_CONV_PAD_VALID, 1, 1);
  v.padding[0] = v.padding[1] = 5;
  EXPECT(em_conv2d(x, w, EM_NONE, v), D, SHAPE(1, 1, 3, 3), 0, 14, 18, 22, 30, 34, 38, 46, 50, 54);
  /* an odd kernel is symmetric: explicit padding 1, bit for bit; bias and channels too */
  em_tensor *x2 = em_randn(F, EM_SHAPE(2, 3, 5, 6)), *w3 = em_randn(F, EM_SHAPE(4, 3, 3, 3)), *b = em_randn(F, EM_SHAPE(4));
  em_conv2d_params one = EM_CONV2D_DEFAULT;
  one.padding[0] = one.padding[1] = 1;
  EXPECT_SAME_BITS(em_conv2d(x2, w3, b, conv_mode(EM_CONV_PAD_SAME, 1, 1)), em_conv2d(x2, w3, b, one), "odd kernel");
  /* dilated: kernel (2, 3) with dilation (3, 1) pads 3 rows (1 top, 2 bottom) and 2 columns */
  em_tensor *w23 = em_randn(F, EM_SHAPE(4, 3, 2, 3));
  em_tensor *same = em_conv2d(x2, w23, b, conv_mode(EM_CONV_PAD_SAME, 3, 1));
  cr_assert(em_size(same, 2) == 5 && em_size(same, 3) == 6, "%s", em_last_error() ? em_last_error() : "");
  em_conv2d_params d31 = conv_mode(EM_CONV_PAD_EXPLICIT, 3, 1);
  expect_close(same, em_conv2d(em_pad(x2, 4, (int64_t[]){1, 1, 1, 2}, 0), w23, b, d31), 1e-6, "dilated same");
  em_conv2d_params s2 = conv_mode(EM_CONV_PAD_SAME, 1, 1);
  s2.stride[1] = 2;
  EXPECT_ERROR(em_conv2d(x, w, EM_NONE, s2), "padding 'same' needs stride 1, got (1, 2)");
  EXPECT_ERROR(em_conv2d(x, w, EM_NONE, conv_mode((em_conv_padding)9, 1, 1)), "unknown padding_mode 9");
  em_conv2d_layer l;
  cr_assert(!em_conv2d_layer_init(&l, 1, 1, 2, 2, s2, true));
  cr_assert(strstr(em_last_error(), "needs stride 1"));
  em_clear_error();
  cr_assert(em_conv2d_layer_init(&l, 3, 4, 2, 2, conv_mode(EM_CONV_PAD_SAME, 1, 1), true));
  expect_close(em_conv2d(x2, l.weight, l.bias, l.params),
               em_conv2d(em_pad(x2, 4, (int64_t[]){0, 1, 0, 1}, 0), l.weight, l.bias, EM_CONV2D_DEFAULT), 1e-6, "layer");
  EXPECT_ERROR(em_conv2d_backward_input(em_ones(D, EM_SHAPE(1, 1, 4, 4)), w, ((int64_t[]){4, 4}),
                                        conv_mode(EM_CONV_PAD_SAME, 1, 1)), "explicit padding only");
}

static em_tensor *conv_same_fn(em_tensor *const *x, void *ctx) {
  return em_conv2d(x[0], x[1], x[2], *(em_conv2d_params *)ctx);
}
static em_tensor *conv_same_op(em_tensor *const *in) {
  return em_conv2d(in[0], in[1], in[2], conv_mode(EM_CONV_PAD_SAME, 1, 2));
}

ETEST(opts, conv2d_same_gradient_and_compiled) {
  em_tensor *x[3] = {gc_leaf(-1, 1, 4, (int64_t[]){1, 2, 4, 5}), gc_leaf(-1, 1, 4, (int64_t[]){2, 2, 2, 3}),
                     gc_leaf(-1, 1, 1, (int64_t[]){2})};
  em_conv2d_params p = conv_mode(EM_CONV_PAD_SAME, 2, 1);
  gradcheck("conv2d same", conv_same_fn, &p, 3, x);
  em_tensor *in[3] = {em_requires_grad_(em_randn(F, EM_SHAPE(2, 3, 6, 7)), true),
                      em_requires_grad_(em_randn(F, EM_SHAPE(4, 3, 2, 2)), true), em_requires_grad_(em_randn(F, EM_SHAPE(4)), true)};
  agree("conv2d same", conv_same_op, 3, in, 3, 1e-5, true);
}

/* ---- 9. pooling options: ceil_mode, dilation, count_include_pad, divisor_override ---- */

/* x [1, 1, h, w] holding 1, 2, 3, ... row by row */
static em_tensor *grid(int64_t h, int64_t w) { return em_reshape(em_arange(D, 1, (double)(h * w + 1), 1), EM_SHAPE(1, 1, h, w)); }

static em_pool2d_opts popts(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                            bool ceil_mode, bool include_pad, int64_t divisor) {
  em_pool2d_opts o = EM_POOL2D_DEFAULT(kh, kw);
  o.stride[0] = sh, o.stride[1] = sw, o.padding[0] = ph, o.padding[1] = pw, o.dilation[0] = dh, o.dilation[1] = dw;
  o.ceil_mode = ceil_mode, o.count_include_pad = include_pad, o.divisor_override = divisor;
  return o;
}

/* The expected values come from torch's CPU loops transcribed into Python (pooling_output_shape,
 * the max_pool2d and avg_pool2d kernels: window by window, clipped as they clip), not from
 * Ember's decomposition. */
ETEST(opts, pool2d_options) {
  em_tensor *x5 = grid(5, 5), *x6 = grid(6, 6), *x57 = grid(5, 7);
  /* ceil_mode: a third, partial window of one row and column */
  EXPECT(em_max_pool2d_ex(x5, popts(2, 2, 2, 2, 0, 0, 1, 1, true, true, 0)), D, SHAPE(1, 1, 3, 3), 0,
         7, 9, 10, 17, 19, 20, 22, 24, 25);
  EXPECT(em_avg_pool2d_ex(x5, popts(2, 2, 2, 2, 0, 0, 1, 1, true, true, 0)), D, SHAPE(1, 1, 3, 3), 1e-15,
         4, 6, 7.5, 14, 16, 17.5, 21.5, 23.5, 25);
  EXPECT(em_avg_pool2d_ex(x5, popts(2, 2, 2, 2, 0, 0, 1, 1, true, true, 2)), D, SHAPE(1, 1, 3, 3), 1e-15,
         8, 12, 7.5, 28, 32, 17.5, 21.5, 23.5, 12.5);
  /* count_include_pad=False divides by the input elements of each window */
  EXPECT(em_avg_pool2d_ex(x5, popts(3, 3, 2, 2, 1, 1, 1, 1, false, false, 0)), D, SHAPE(1, 1, 3, 3), 1e-15,
         4, 5.5, 7, 11.5, 13, 14.5, 19, 20.5, 22);
  /* dilation */
  EXPECT(em_max_pool2d_ex(x5, popts(2, 2, 1, 1, 0, 0, 2, 2, false, true, 0)), D, SHAPE(1, 1, 3, 3), 0,
         13, 14, 15, 18, 19, 20, 23, 24, 25);
  EXPECT(em_max_pool2d_ex(x6, popts(2, 2, 2, 2, 0, 0, 2, 2, true, true, 0)), D, SHAPE(1, 1, 3, 3), 0,
         15, 17, 17, 27, 29, 29, 27, 29, 29);
  EXPECT(em_max_pool2d_ex(x6, popts(2, 2, 2, 2, 0, 0, 2, 2, false, true, 0)), D, SHAPE(1, 1, 2, 2), 0, 15, 17, 27, 29);
  /* the last window must start inside the input or its left padding: 3 windows, not 4 */
  EXPECT(em_max_pool2d_ex(x5, popts(2, 2, 2, 2, 1, 1, 1, 1, true, true, 0)), D, SHAPE(1, 1, 3, 3), 0,
         1, 3, 5, 11, 13, 15, 21, 23, 25);
  /* a ceil_mode window past the padding: counted up to the padding's end, or the input's */
  EXPECT(em_avg_pool2d_ex(x6, popts(3, 3, 2, 2, 1, 1, 1, 1, true, true, 0)), D, SHAPE(1, 1, 4, 4), 1e-15,
         2, 4, 5.333333333333333, 3, 9, 15, 17, 9, 17, 27, 29, 15, 10.5, 16.5, 17.5, 9);
  EXPECT(em_avg_pool2d_ex(x6, popts(3, 3, 2, 2, 1, 1, 1, 1, true, false, 0)), D, SHAPE(1, 1, 4, 4), 1e-15,
         4.5, 6, 8, 9, 13.5, 15, 17, 18, 25.5, 27, 29, 30, 31.5, 33, 35, 36);
  /* unequal axes */
  EXPECT(em_max_pool2d_ex(x57, popts(3, 2, 2, 3, 1, 1, 1, 2, true, true, 0)), D, SHAPE(1, 1, 3, 3), 0,
         9, 12, 13, 23, 26, 27, 30, 33, 34);
  EXPECT(em_avg_pool2d_ex(x57, popts(2, 3, 3, 2, 1, 1, 1, 1, true, false, 0)), D, SHAPE(1, 1, 2, 4), 1e-15,
         1.5, 3, 5, 6.5, 19, 20.5, 22.5, 24);
  /* a ceil_mode window longer than the whole input */
  EXPECT(em_max_pool2d_ex(grid(3, 3), popts(4, 4, 2, 2, 0, 0, 1, 1, true, true, 0)), D, SHAPE(1, 1, 1, 1), 0, 9);
  EXPECT(em_avg_pool2d_ex(grid(3, 3), popts(4, 4, 3, 3, 0, 0, 1, 1, true, true, 0)), D, SHAPE(1, 1, 1, 1), 0, 5);
  EXPECT(em_max_pool2d_ex(grid(3, 3), popts(INT64_MAX / 4, 3, INT64_MAX, 3, 0, 0, 1, 1, true, true, 0)), D,
         SHAPE(1, 1, 1, 1), 0, 9);
  /* the defaults are the old functions, bit for bit */
  em_tensor *r = em_randn(F, EM_SHAPE(2, 3, 7, 6));
  EXPECT_SAME_BITS(em_max_pool2d_ex(r, popts(3, 2, 2, 1, 1, 1, 1, 1, false, true, 0)), em_max_pool2d(r, 3, 2, 2, 1, 1, 1), "max");
  EXPECT_SAME_BITS(em_avg_pool2d_ex(r, popts(3, 3, 0, 0, 1, 0, 1, 1, false, true, 0)), em_avg_pool2d(r, 3, 3, 0, 0, 1, 0), "avg");
  EXPECT_SAME_BITS(em_avg_pool2d_ex(r, EM_POOL2D_DEFAULT(2, 2)), em_avg_pool2d(r, 2, 2, 0, 0, 0, 0), "tiling");
  EXPECT_ERROR(em_max_pool2d_ex(x5, ((em_pool2d_opts){.kernel = {2, 2}})), "em_max_pool2d_ex: bad window");
  EXPECT_ERROR(em_avg_pool2d_ex(x5, popts(2, 2, 2, 2, 0, 0, 2, 1, false, true, 0)), "average pooling has no dilation");
  EXPECT_ERROR(em_max_pool2d_ex(x5, popts(3, 3, 1, 1, 0, 0, 3, 3, false, true, 0)), "(dilated) is larger than the padded input");
  EXPECT_ERROR(em_max_pool2d_ex(grid(3, 3), popts(4, 4, 2, 2, 0, 0, 1, 1, false, true, 0)), "larger than the padded input");
  EXPECT_ERROR(em_max_pool2d_ex(x5, popts(2, 2, 1, 1, 2, 0, 1, 1, false, true, 0)), "padding at most half the kernel");
}

typedef struct {
  bool is_max;
  em_pool2d_opts o;
} pool_case;
static em_tensor *pool_fn(em_tensor *const *x, void *ctx) {
  pool_case *c = ctx;
  return c->is_max ? em_max_pool2d_ex(x[0], c->o) : em_avg_pool2d_ex(x[0], c->o);
}
static em_tensor *pool_max_op(em_tensor *const *in) {
  return em_max_pool2d_ex(in[0], popts(3, 2, 2, 2, 1, 1, 2, 1, true, true, 0));
}
static em_tensor *pool_avg_op(em_tensor *const *in) {
  return em_avg_pool2d_ex(in[0], popts(3, 3, 2, 2, 1, 1, 1, 1, true, false, 0));
}

ETEST(opts, pool2d_options_gradient_and_compiled) {
  pool_case cases[] = {
      {true, popts(2, 2, 2, 2, 0, 0, 1, 1, true, true, 0)},  {true, popts(2, 3, 2, 1, 1, 1, 2, 2, true, true, 0)},
      {false, popts(2, 2, 2, 2, 0, 0, 1, 1, true, true, 0)}, {false, popts(3, 3, 2, 2, 1, 1, 1, 1, true, false, 0)},
      {false, popts(3, 2, 2, 2, 1, 1, 1, 1, true, true, 5)}, {false, popts(3, 3, 2, 1, 1, 0, 1, 1, false, false, 0)},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    em_tensor *x[1] = {gc_leaf(-1, 1, 4, (int64_t[]){1, 2, 6, 5})};
    gradcheck(cases[i].is_max ? "max_pool2d_ex" : "avg_pool2d_ex", pool_fn, &cases[i], 1, x);
  }
  em_tensor *in[1] = {em_requires_grad_(em_randn(F, EM_SHAPE(2, 3, 7, 6)), true)};
  agree("max_pool2d_ex", pool_max_op, 1, in, 1, 0, true);
  agree("avg_pool2d_ex", pool_avg_op, 1, in, 1, 1e-6, true);
}

/* ---- 10. class weights in nll_loss and cross_entropy ---- */

ETEST(opts, nll_loss_class_weights) {
  em_tensor *logp = T(D, SHAPE(3, 3), -1, -2, -3, -0.5, -1.5, -2.5, -4, -0.1, -2), *t = T(EM_I64, SHAPE(3), 0, 2, 1);
  em_tensor *w = T(D, SHAPE(3), 1, 2, 0.5);
  em_nll_loss_opts o = {-100, EM_REDUCE_NONE, w};
  /* -w[t] logp[t]: 1 * 1, 0.5 * 2.5, 2 * 0.1 */
  EXPECT(em_nll_loss_ex(logp, t, o), D, SHAPE(3), 1e-15, 1, 1.25, 0.2);
  o.reduction = EM_REDUCE_SUM;
  EXPECT(em_nll_loss_ex(logp, t, o), D, SCALAR_SHAPE, 1e-15, 2.45);
  /* the mean divides by the weights of the targets: 2.45 / (1 + 0.5 + 2) */
  o.reduction = EM_REDUCE_MEAN;
  EXPECT(em_nll_loss_ex(logp, t, o), D, SCALAR_SHAPE, 1e-15, 0.7);
  /* ignoring class 2 drops its term and its weight: 1.2 / 3 */
  o.ignore_index = 2;
  EXPECT(em_nll_loss_ex(logp, t, o), D, SCALAR_SHAPE, 1e-15, 0.4);
  o.reduction = EM_REDUCE_NONE;
  EXPECT(em_nll_loss_ex(logp, t, o), D, SHAPE(3), 1e-15, 1, 0, 0.2);
  /* no weight counted: 0 / 0, as torch */
  EXPECT(em_nll_loss_ex(logp, t, ((em_nll_loss_opts){-100, EM_REDUCE_MEAN, em_zeros(D, EM_SHAPE(3))})), D, SCALAR_SHAPE, 0, NAN);
  /* no weights (NULL or EM_NONE) is em_nll_loss */
  EXPECT_SAME_BITS(em_nll_loss_ex(logp, t, EM_NLL_LOSS_DEFAULT), em_nll_loss(logp, t, -100, EM_REDUCE_MEAN), "default");
  EXPECT_SAME_BITS(em_nll_loss_ex(logp, t, ((em_nll_loss_opts){1, EM_REDUCE_SUM, EM_NONE})), em_nll_loss(logp, t, 1, EM_REDUCE_SUM),
                   "EM_NONE");
  /* [N, C, d] with [N, d] targets */
  em_tensor *lp3 = em_reshape(em_transpose(em_reshape(logp, EM_SHAPE(1, 3, 3)), 1, 2), EM_SHAPE(1, 3, 3));
  EXPECT(em_nll_loss_ex(lp3, T(EM_I64, SHAPE(1, 3), 0, 2, 1), ((em_nll_loss_opts){-100, EM_REDUCE_NONE, w})), D, SHAPE(1, 3),
         1e-15, 1, 1.25, 0.2);
  EXPECT_ERROR(em_nll_loss_ex(logp, t, ((em_nll_loss_opts){-100, EM_REDUCE_MEAN, T(D, SHAPE(2), 1, 1)})),
               "em_nll_loss_ex: weight f64[2] must be f64[C] for input f64[3,3]");
  EXPECT_ERROR(em_nll_loss_ex(logp, t, ((em_nll_loss_opts){-100, EM_REDUCE_MEAN, T(F, SHAPE(3), 1, 1, 1)})), "must be f64[C]");
  EXPECT_ERROR(em_nll_loss_ex(logp, t, ((em_nll_loss_opts){-100, (em_reduction)5, w})), "unknown reduction 5");
}

/* torch's cross_entropy with class weights, written out example by example: index targets t
 * (ignore: -1) or probabilities q [n, c] (t NULL); returns the reduced loss. */
static double ce_reference(const double *z, int n, int c, const int64_t *t, const double *q, const double *w, double eps,
                           em_reduction red, double *each) {
  double total = 0, wsum = 0;
  for (int i = 0; i < n; i++) {
    double m = z[i * c], s = 0, lp[8];
    for (int k = 1; k < c; k++) m = fmax(m, z[i * c + k]);
    for (int k = 0; k < c; k++) s += exp(z[i * c + k] - m);
    for (int k = 0; k < c; k++) lp[k] = z[i * c + k] - m - log(s);
    double l = 0;
    if (!t) {
      for (int k = 0; k < c; k++) l -= w[k] * (q[i * c + k] * (1 - eps) + eps / c) * lp[k];
    } else if (t[i] >= 0) {
      double smooth = 0;
      for (int k = 0; k < c; k++) smooth -= w[k] * lp[k];
      l = (1 - eps) * w[t[i]] * -lp[t[i]] + eps / c * smooth;
      wsum += w[t[i]];
    }
    each[i] = l;
    total += l;
  }
  return red == EM_REDUCE_SUM ? total : !t ? total / n : total / wsum;
}

ETEST(opts, cross_entropy_class_weights) {
  const double z[12] = {0.5, -1, 2, 0.1, 1.5, 0.3, -0.7, 0.2, -2, 1, 0, 0.4}, w[3] = {0.5, 2, 1.5};
  const double q[12] = {0.2, 0.3, 0.5, 1, 0, 0, 0.1, 0.1, 0.8, 0.3, 0.3, 0.4};
  const int64_t t[4] = {2, 0, -1, 1};
  em_tensor *logits = em_from_data(z, D, 2, (int64_t[]){4, 3}), *wt = em_from_data(w, D, 1, (int64_t[]){3});
  em_tensor *target = I64S(2, 0, -1, 1), *probs = em_from_data(q, D, 2, (int64_t[]){4, 3});
  const double ones[3] = {1, 1, 1};
  for (int s = 0; s < 3; s++) {
    double eps = s * 0.2, each[4];
    for (int r = 0; r < 3; r++) {
      em_reduction red = (em_reduction)r;
      em_cross_entropy_opts o = {-1, eps, red, wt};
      double want = ce_reference(z, 4, 3, t, NULL, w, eps, red, each);
      if (red == EM_REDUCE_NONE) EXPECT(em_cross_entropy(logits, target, o), D, SHAPE(4), 1e-14, each[0], each[1], each[2], each[3]);
      else EXPECT(em_cross_entropy(logits, target, o), D, SCALAR_SHAPE, 1e-14, want);
      want = ce_reference(z, 4, 3, NULL, q, w, eps, red, each);
      if (red == EM_REDUCE_NONE) EXPECT(em_cross_entropy(logits, probs, o), D, SHAPE(4), 1e-14, each[0], each[1], each[2], each[3]);
      else EXPECT(em_cross_entropy(logits, probs, o), D, SCALAR_SHAPE, 1e-14, want);
      /* without weights the same formulas with w = 1 */
      o.weight = NULL;
      want = ce_reference(z, 4, 3, t, NULL, ones, eps, red, each);
      if (red == EM_REDUCE_NONE) EXPECT(em_cross_entropy(logits, target, o), D, SHAPE(4), 1e-14, each[0], each[1], each[2], each[3]);
      else EXPECT(em_cross_entropy(logits, target, o), D, SCALAR_SHAPE, 1e-14, want);
    }
  }
  EXPECT_ERROR(em_cross_entropy(logits, target, ((em_cross_entropy_opts){-100, 0, EM_REDUCE_MEAN, T(D, SHAPE(4), 1, 1, 1, 1)})),
               "em_cross_entropy: weight f64[4] must be f64[C]");
  EXPECT_ERROR(em_cross_entropy(logits, target, ((em_cross_entropy_opts){-100, 0, EM_REDUCE_MEAN, em_ones(D, EM_SHAPE(1, 3))})),
               "must be f64[C]");
}

typedef struct {
  em_tensor *target, *weight;
  double eps;
  em_reduction red;
} ce_case;
static em_tensor *ce_fn(em_tensor *const *x, void *ctx) {
  ce_case *c = ctx;
  return em_cross_entropy(x[0], c->target, ((em_cross_entropy_opts){1, c->eps, c->red, c->weight}));
}
static em_tensor *nll_fn(em_tensor *const *x, void *ctx) {
  ce_case *c = ctx;
  return em_nll_loss_ex(x[0], c->target, ((em_nll_loss_opts){1, c->red, c->weight}));
}
static em_tensor *ce_op(em_tensor *const *in) {
  return em_cross_entropy(in[0], in[1], ((em_cross_entropy_opts){2, 0.1, EM_REDUCE_MEAN, in[2]}));
}
static em_tensor *nll_op(em_tensor *const *in) {
  return em_nll_loss_ex(in[0], in[1], ((em_nll_loss_opts){-100, EM_REDUCE_MEAN, in[2]}));
}

ETEST(opts, class_weights_gradient_and_compiled) {
  em_tensor *w = T(D, SHAPE(3), 0.5, 2, 1.5);
  em_tensor *targets[2] = {T(EM_I64, SHAPE(4, 2), 0, 1, 2, 1, 2, 0, 1, 1), gc_leaf(0, 1, 3, (int64_t[]){4, 3, 2})};
  for (int k = 0; k < 2; k++)
    for (int r = 0; r < 3; r++) {
      ce_case c = {targets[k], w, 0.3, (em_reduction)r};
      em_tensor *x[1] = {gc_leaf(-2, 2, 3, (int64_t[]){4, 3, 2})};
      gradcheck("cross_entropy weight", ce_fn, &c, 1, x);
      c.eps = 0;
      gradcheck("cross_entropy weight", ce_fn, &c, 1, x);
      if (k == 0) gradcheck("nll_loss weight", nll_fn, &c, 1, x);
    }
  em_tensor *in[3] = {em_requires_grad_(em_randn(F, EM_SHAPE(6, 4)), true), T(EM_I64, SHAPE(6), 0, 2, 3, 1, 2, 3),
                      T(F, SHAPE(4), 0.5, 1, 2, 0.25)};
  agree("cross_entropy weight", ce_op, 3, in, 1, 1e-6, true);
  agree("nll_loss weight", nll_op, 3, in, 1, 1e-6, true);
}
