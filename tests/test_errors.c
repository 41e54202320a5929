/* tests/test_errors.c: bad input gives one clear, located error and leaks nothing; NULL operands
 * propagate silently; every allocation of an op can fail without leaking (the fault-injection
 * loop of libuv and SQLite). */
#include "common.h"

#define F EM_F32

ETEST(errors, located_messages) {
  em_tensor *a = em_zeros(F, EM_SHAPE(128, 784)), *b = em_zeros(F, EM_SHAPE(512, 784));
  em_clear_error();
  int line = __LINE__ + 1;
  em_tensor *r = em_matmul(a, b);
  cr_assert_null(r);
  char want[256];
  snprintf(want, sizeof want, "test_errors.c:%d: em_matmul: inner dimensions differ: a is f32[128,784], b is f32[512,784]", line);
  cr_assert(strstr(em_last_error(), want), "got '%s'", em_last_error());
  em_clear_error();
}

ETEST(errors, first_error_is_kept) {
  em_tensor *x = em_zeros(F, EM_SHAPE(2));
  em_clear_error();
  em_reshape(x, EM_SHAPE(3));
  em_transpose(x, 0, 5);
  cr_assert(strstr(em_last_error(), "em_reshape"), "sticky: the first error stays, got %s", em_last_error());
  em_clear_error();
  cr_assert_null(em_last_error());
}

ETEST(errors, null_operands_return_null_silently) {
  em_tensor *x = em_ones(F, EM_SHAPE(2));
  cr_assert_null(em_add(NULL, x));
  cr_assert_null(em_exp(NULL));
  cr_assert_null(em_sum(NULL, 0, NULL, false));
  cr_assert_null(em_reshape(NULL, EM_SHAPE(2)));
  cr_assert_null(em_matmul(x, NULL));
  cr_assert_null(em_where(NULL, x, x));
  cr_assert_null(em_cat(2, ((em_tensor *[]){x, NULL}), 0));
  cr_assert_null(em_gather(x, 0, NULL));
  cr_assert_null(em_conv2d(NULL, x, EM_NONE, EM_CONV2D_DEFAULT));
  cr_assert_null(em_conv2d(x, x, NULL, EM_CONV2D_DEFAULT)); /* a failed bias is not "no bias" */
  cr_assert_null(em_add_(NULL, x));
  cr_assert_null(em_copy_(x, NULL));
  cr_assert_null(em_format(NULL));
  cr_assert(isnan(em_item(NULL)));
  cr_assert_null(em_last_error(), "a NULL operand records nothing new");
  /* a chain stops at the first failure and reports it */
  em_tensor *y = em_exp(em_add(em_reshape(x, EM_SHAPE(3)), x));
  cr_assert_null(y);
  cr_assert(strstr(em_last_error(), "em_reshape: cannot reshape f32[2] to f32[3]"), "%s", em_last_error());
  em_clear_error();
}

ETEST(errors, bad_input_catalogue) {
  em_tensor *m = em_zeros(F, EM_SHAPE(2, 3)), *v = em_zeros(F, EM_SHAPE(4));
  em_tensor *i64 = em_zeros(EM_I64, EM_SHAPE(2, 3));
  EXPECT_ERROR(em_add(m, v), "em_add: shapes cannot broadcast: f32[2,3], f32[4]");
  EXPECT_ERROR(em_where(em_ones(EM_BOOL, EM_SHAPE(5)), m, m), "em_where: shapes cannot broadcast");
  EXPECT_ERROR(em_sum(m, EM_AXES(2), false), "em_sum: axis 2 out of range for f32[2,3]");
  EXPECT_ERROR(em_sum(m, EM_AXES(0, -2), false), "axis 0 repeated");
  EXPECT_ERROR(em_argmax(m, 3, false), "em_argmax: axis 3 out of range");
  EXPECT_ERROR(em_amax(em_zeros(F, EM_SHAPE(0, 2)), EM_AXES(0), false), "size 0");
  EXPECT_ERROR(em_reshape(m, EM_SHAPE(4, -1)), "cannot infer the -1 size");
  EXPECT_ERROR(em_reshape(m, EM_SHAPE(-1, -1)), "only one size may be -1");
  EXPECT_ERROR(em_permute(m, EM_AXES(0, 0)), "not a permutation");
  EXPECT_ERROR(em_transpose(m, 0, 2), "em_transpose: dims (0, 2) out of range for f32[2,3]");
  EXPECT_ERROR(em_expand(m, EM_SHAPE(4, 3)), "em_expand: cannot expand f32[2,3] to f32[4,3]");
  EXPECT_ERROR(em_slice(m, 1, 0, 2, 0), "step must be >= 1");
  EXPECT_ERROR(em_slice(m, 4, 0, 2, 1), "axis 4 out of range");
  EXPECT_ERROR(em_squeeze(m, EM_AXES(2)), "em_squeeze: axis 2 out of range for f32[2,3]");
  EXPECT_ERROR(em_squeeze(m, EM_AXES(1, -1)), "axis 1 repeated");
  EXPECT_ERROR(em_unsqueeze(m, 4), "axis 4 out of range");
  EXPECT_ERROR(em_flip(m, EM_AXES(1, 1)), "repeated");
  EXPECT_ERROR(em_pad(m, 3, (int64_t[]){1, 1, 1}, 0), "even number of pads");
  EXPECT_ERROR(em_pad(m, 2, (int64_t[]){-2, -2}, 0), "negative pads -2 and -2 crop more than the 3 elements of axis 1");
  EXPECT_ERROR(em_pad(m, 2, (int64_t[]){INT64_MIN, 1}, 0), "crop more than");
  EXPECT_ERROR(em_cat(2, ((em_tensor *[]){m, v}), 0), "em_cat: operand 1 is f32[4] but operand 0 is f32[2,3]");
  EXPECT_ERROR(em_cat(0, NULL, 0), "at least one tensor");
  EXPECT_ERROR(em_gather(m, 0, em_zeros(F, EM_SHAPE(2, 3))), "index must be i64 or i32, got f32[2,3]");
  EXPECT_ERROR(em_gather(m, 1, em_full(EM_I64, EM_SHAPE(2, 1), 3)), "out of bounds");
  EXPECT_ERROR(em_index_select(m, 0, em_full(EM_I64, EM_SHAPE(1), -1)), "out of bounds");
  EXPECT_ERROR(em_matmul(m, i64), "em_matmul: operands differ in dtype: a is f32[2,3], b is i64[2,3]");
  EXPECT_ERROR(em_matmul(em_scalar(F, 1), m), "at least 1 dim");
  EXPECT_ERROR(em_matmul(em_zeros(F, EM_SHAPE(2, 2, 3)), em_zeros(F, EM_SHAPE(3, 3, 4))), "batch dims do not broadcast");
  EXPECT_ERROR(em_conv2d(m, m, EM_NONE, EM_CONV2D_DEFAULT), "em_conv2d: needs 4-D operands");
  em_tensor *x = em_zeros(F, EM_SHAPE(1, 3, 8, 8)), *w = em_zeros(F, EM_SHAPE(4, 2, 3, 3));
  EXPECT_ERROR(em_conv2d(x, w, EM_NONE, EM_CONV2D_DEFAULT), "input has 3 channels but weight expects 2");
  em_conv2d_params p = EM_CONV2D_DEFAULT;
  p.stride[0] = 0;
  EXPECT_ERROR(em_conv2d(x, em_zeros(F, EM_SHAPE(4, 3, 3, 3)), EM_NONE, p), "stride and dilation must be >= 1");
  EXPECT_ERROR(em_conv2d(x, em_zeros(F, EM_SHAPE(4, 3, 9, 9)), EM_NONE, EM_CONV2D_DEFAULT), "larger than the padded input");
  EXPECT_ERROR(em_conv2d(x, em_zeros(F, EM_SHAPE(4, 3, 0, 0)), EM_NONE, EM_CONV2D_DEFAULT), "the kernel must be at least 1x1, got 0x0");
  EXPECT_ERROR(em_conv2d(x, em_zeros(F, EM_SHAPE(4, 3, 3, 3)), em_zeros(F, EM_SHAPE(5)), EM_CONV2D_DEFAULT),
               "bias must be f32[4]");
  if (!etest_on_cuda()) EXPECT_ERROR(em_exp(em_zeros(EM_BF16, EM_SHAPE(2))), "bf16[2] has no CPU kernels");
  EXPECT_ERROR(em_cast(m, (em_dtype)42), "invalid dtype");
  EXPECT_ERROR(em_neg(em_ones(EM_BOOL, EM_SHAPE(1))), "em_neg: is not defined for bool");
}

ETEST(errors, nothing_computed_is_lost) {
  em_tensor *good = em_add(em_ones(F, EM_SHAPE(3)), em_ones(F, EM_SHAPE(3)));
  em_clear_error();
  cr_assert_null(em_matmul(good, em_zeros(F, EM_SHAPE(2, 2))));
  em_clear_error();
  EXPECT(good, F, SHAPE(3), 0, 2, 2, 2);
}

/* ---- fault injection ---- */

typedef em_tensor *(*op_fn)(void);
static em_tensor *op_promote_broadcast(void) {
  return em_add(em_ones(EM_I32, EM_SHAPE(3, 1)), em_ones(F, EM_SHAPE(4)));
}
static em_tensor *op_matmul(void) {
  return em_matmul(em_ones(F, EM_SHAPE(2, 3, 4)), em_ones(F, EM_SHAPE(4)));
}
static em_tensor *op_reshape_copy(void) {
  return em_reshape(em_transpose(em_ones(F, EM_SHAPE(3, 4)), 0, 1), EM_SHAPE(12));
}
static em_tensor *op_cat(void) {
  em_tensor *xs[3] = {em_ones(F, EM_SHAPE(2)), em_ones(EM_I64, EM_SHAPE(3)), em_ones(EM_F64, EM_SHAPE(1))};
  return em_cat(3, xs, 0);
}
static em_tensor *op_conv(void) {
  return em_conv2d(em_ones(F, EM_SHAPE(1, 2, 6, 6)), em_ones(F, EM_SHAPE(3, 2, 3, 3)),
                   em_ones(F, EM_SHAPE(3)), EM_CONV2D_DEFAULT);
}
static em_tensor *op_reduce(void) { return em_sum(em_ones(EM_I32, EM_SHAPE(4, 5)), EM_AXES(1), true); }
static em_tensor *op_where(void) {
  return em_where(em_ones(EM_U8, EM_SHAPE(2, 1)), em_ones(F, EM_SHAPE(3)), em_scalar(EM_F64, 2));
}
static em_tensor *op_randint(void) { return em_randint(2, 9, EM_SHAPE(10)); }
static em_tensor *op_eye(void) { return em_eye(EM_F64, 3, 4); }
static em_tensor *op_scatter(void) {
  return em_scatter_add(em_zeros(F, EM_SHAPE(3)), 0, em_zeros(EM_I32, EM_SHAPE(2)), em_ones(EM_I64, EM_SHAPE(2)));
}
static em_tensor *op_inplace(void) {
  em_tensor *x = em_ones(F, EM_SHAPE(4));
  return em_mul_(em_slice(x, 0, 1, 4, 1), em_slice(x, 0, 0, 3, 1));
}
static em_tensor *op_backward(void) {
  em_tensor *x = em_requires_grad_(em_ones(F, EM_SHAPE(3, 2)), true);
  em_tensor *w = em_requires_grad_(em_ones(F, EM_SHAPE(2)), true);
  em_tensor *y = em_sum(em_exp(em_mul(x, w)), 0, NULL, false);
  if (!em_backward(y, NULL)) return NULL;
  return em_get_grad(w);
}
static em_tensor *op_keep(void) {
  em_tensor *k = NULL;
  if (!em_scope_begin()) return NULL;
  k = em_keep(em_exp(em_ones(F, EM_SHAPE(2))));
  em_scope_end();
  return k;
}

ETEST(fault_injection, every_allocation_of_an_op_can_fail) {
  struct { const char *name; op_fn f; } ops[] = {
      {"promote_broadcast", op_promote_broadcast}, {"matmul", op_matmul}, {"reshape_copy", op_reshape_copy},
      {"cat", op_cat}, {"conv", op_conv}, {"reduce", op_reduce}, {"where", op_where},
      {"randint", op_randint}, {"eye", op_eye}, {"scatter", op_scatter}, {"inplace", op_inplace},
      {"keep", op_keep}, {"backward", op_backward},
  };
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    int failures = etest_fail_each_allocation(ops[k].name, ops[k].f, 200);
    cr_assert_gt(failures, 2, "%s: exercised %d failure points", ops[k].name, failures);
  }
}

/* Errors are sticky (the first message stays until cleared), but they do not stop later ops
 * given good operands: on either device. */
ETEST(errors, later_ops_run_after_an_error) {
  cr_assert_null(em_reshape(em_zeros(EM_F32, EM_SHAPE(2, 3)), EM_SHAPE(7)));
  const char *first = em_last_error();
  cr_assert_not_null(first);
  EXPECT(em_add(T(EM_F32, SHAPE(2), 1, 2), T(EM_F32, SHAPE(2), 3, 4)), EM_F32, SHAPE(2), 0, 4, 6);
  EXPECT(em_mul_scalar(T(EM_F32, SHAPE(2), 1, 2), 2), EM_F32, SHAPE(2), 0, 2, 4);
  cr_assert_str_eq(em_last_error(), first, "the first message stays");
  em_clear_error();
}

/* Issue 17: EM_NONE where a tensor is required crashed 74 of 84 ops (a header without storage).
 * Every op here, given EM_NONE for each tensor operand in turn, returns its failure value with
 * an error naming the op, and leaks nothing; each call runs in a child process, so a crash is
 * counted (and named) rather than ending the suite. */
#include <sys/wait.h>
#include <unistd.h>

#define N_NONE_CASES 64
static em_tensor *none_case(int k, em_tensor *a, em_tensor *b, bool *is_null_ok) {
  em_tensor *N = EM_NONE;
  *is_null_ok = true;
  switch (k) {
  case 0: return em_neg(N);
  case 1: return em_exp(N);
  case 2: return em_abs(N);
  case 3: return em_add(N, a);
  case 4: return em_add(a, N);
  case 5: return em_mul(N, b);
  case 6: return em_sub(a, N);
  case 7: return em_div(N, a);
  case 8: return em_maximum(a, N);
  case 9: return em_pow(N, a);
  case 10: return em_where(N, a, a);
  case 11: return em_where(em_gt(a, a), N, a);
  case 12: return em_where(em_gt(a, a), a, N);
  case 13: return em_sum(N, 0, NULL, false);
  case 14: return em_mean(N, 1, (int64_t[]){0}, true);
  case 15: return em_amax(N, 0, NULL, false);
  case 16: return em_argmax(N, 0, false);
  case 17: return em_reshape(N, EM_SHAPE(-1));
  case 18: return em_transpose(N, 0, 1);
  case 19: return em_permute(N, EM_SHAPE(1, 0));
  case 20: return em_expand(N, EM_SHAPE(2, 3));
  case 21: return em_slice(N, 0, 0, 1, 1);
  case 22: return em_unsqueeze(N, 0);
  case 23: return em_squeeze(N, 0, NULL);
  case 24: return em_flip(N, EM_AXES(0));
  case 25: return em_cat(2, ((em_tensor *[]){a, N}), 0);
  case 26: return em_pad(N, 2, (int64_t[]){1, 1}, 0);
  case 27: return em_matmul(N, b);
  case 28: return em_matmul(a, N);
  case 29: return em_cast(N, EM_F64);
  case 30: return em_clone(N);
  case 31: return em_contiguous(N);
  case 32: return em_softmax(N, -1);
  case 33: return em_log_softmax(N, 1);
  case 34: return em_layer_norm(N, 1, EM_NONE, EM_NONE, 1e-5);
  case 35: return em_relu(N);
  case 36: return em_gelu(N, false);
  case 37: return em_sigmoid(N);
  case 38: return em_tanh(N);
  case 39: return em_clamp(N, 0, 1);
  case 40: return em_var(N, 0, NULL, 1, false);
  case 41: return em_logsumexp(N, 0, NULL, false);
  case 42: return em_linear(N, b, EM_NONE);
  case 43: return em_linear(a, N, EM_NONE);
  case 44: return em_dropout(N, 0.5, true);
  case 45: return em_gather(a, 1, N);
  case 46: return em_gather(N, 1, em_zeros(EM_I64, EM_SHAPE(2, 3)));
  case 47: return em_index_select(N, 0, em_zeros(EM_I64, EM_SHAPE(1)));
  case 48: return em_index_select(a, 0, N);
  case 49: return em_add_(N, a);
  case 50: return em_add_(em_clone(a), N);
  case 51: return em_copy_(N, a);
  case 52: return em_copy_(em_clone(a), N);
  case 53: return em_mul_scalar(N, 2);
  case 54: return em_add_scalar_(N, 1);
  case 55: return em_detach(N);
  case 56: return em_eq(N, a);
  case 57: return em_logical_not(N);
  case 58: return em_cross_entropy(N, em_zeros(EM_I64, EM_SHAPE(2)), EM_CROSS_ENTROPY_DEFAULT);
  case 59: return em_cross_entropy(a, N, EM_CROSS_ENTROPY_DEFAULT);
  case 60: return em_mse_loss(N, a, 1);
  case 61: return em_embedding(N, b);
  case 62: return em_sqrt(N);
  case 63: return em_to(N, EM_CPU);
  }
  return NULL;
}

ETEST(errors, em_none_where_a_tensor_is_required) {
  int crashed = 0, unclear = 0;
  char names[512] = "";
  for (int k = 0; k < N_NONE_CASES; k++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      em_scope_begin();
      em_tensor *a = em_ones(F, EM_SHAPE(2, 3)), *b = em_ones(F, EM_SHAPE(3, 2));
      bool null_ok;
      em_clear_error();
      em_tensor *r = none_case(k, a, b, &null_ok);
      const char *e = em_last_error();
      bool clean = !r && e && strstr(e, "EM_NONE") && strstr(e, "test_errors.c:");
      em_clear_error();
      em_scope_end();
      em_thread_cleanup();
      _exit(clean && em_debug_live_tensors() == 0 ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st)) crashed++;
    else if (WEXITSTATUS(st)) unclear++;
    if (WIFSIGNALED(st) || WEXITSTATUS(st)) {
      size_t l = strlen(names);
      snprintf(names + l, sizeof names - l, " %d%s", k, WIFSIGNALED(st) ? "(crash)" : "");
    }
  }
  cr_log_info("%d EM_NONE calls: %d crashed, %d without a clear error", N_NONE_CASES, crashed, unclear);
  cr_assert(crashed == 0 && unclear == 0, "cases:%s", names);
}

/* Issue 17: shape arithmetic that overflowed. A slice with step INT64_MAX has one element (it
 * made a size of -1); an expand to [2^32, 2^32] and padding a pooling window by INT64_MAX are
 * errors (the first's element count saturated, the second wrote out of bounds). */
ETEST(errors, shape_arithmetic_that_overflowed) {
  em_tensor *x = em_ones(F, EM_SHAPE(5));
  em_tensor *s = em_slice(x, 0, 0, 5, INT64_MAX);
  cr_assert_not_null(s, "%s", em_last_error() ? em_last_error() : "");
  cr_assert_eq(em_size(s, 0), 1);
  EXPECT_ERROR(em_expand(em_ones(F, EM_SHAPE(1, 1)), EM_SHAPE((int64_t)1 << 32, (int64_t)1 << 32)),
               "would have more elements than fit in 64 bits");
  em_tensor *img = em_ones(F, EM_SHAPE(1, 1, 4, 4));
  EXPECT_ERROR(em_max_pool2d(img, 2, 2, 1, 1, INT64_MAX, 0), "bad window");
  EXPECT_ERROR(em_avg_pool2d(img, INT64_MAX, 2, 1, 1, INT64_MAX / 2, 0), "does not fit in 64 bits");
  EXPECT_ERROR(em_pad(x, 2, (int64_t[]){INT64_MAX, 1}, 0), "does not fit in 64 bits");
  /* negating the most negative integer wraps (it was undefined behaviour, fatal under UBSan) */
  int64_t mn[2] = {INT64_MIN, 5};
  em_tensor *n = em_neg(em_from_data(mn, EM_I64, EM_SHAPE(2)));
  int64_t got[2];
  cr_assert(n && em_to_buffer(n, EM_I64, got, sizeof got));
  cr_assert(got[0] == INT64_MIN && got[1] == -5);
}

/* Issue 17: the CUDA indexing kernels folded a "found" flag into the bad index's top bit, so
 * INT64_MIN was reported as index 0 and 2^62 with the wrong sign. Both devices name the index. */
ETEST(errors, a_bad_index_is_named_exactly) {
  em_tensor *m = em_zeros(F, EM_SHAPE(2, 3));
  int64_t lo[2] = {INT64_MIN, 0}, hi[2] = {0, (int64_t)1 << 62};
  EXPECT_ERROR(em_gather(m, 1, em_from_data(lo, EM_I64, EM_SHAPE(2, 1))),
               "index -9223372036854775808 is out of bounds for axis 1 with size 3");
  EXPECT_ERROR(em_index_select(m, 0, em_from_data(hi, EM_I64, EM_SHAPE(2))),
               "index 4611686018427387904 is out of bounds for axis 0 with size 2");
}
