/* tests/test_extern.c: matmul and the three convolutions. Hand-computed values for small cases;
 * the library paths (oneDNN f32, OpenBLAS f64) against the plain-loop references kept in
 * prims/extern.c for larger, strided and grouped/dilated cases. */
#include "common.h"

#include "../prims/prims.h"

#define F EM_F32
#define D EM_F64

ETEST(matmul, by_hand) {
  em_tensor *a = T(F, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), *b = T(F, SHAPE(3, 2), 7, 8, 9, 10, 11, 12);
  EXPECT(em_matmul(a, b), F, SHAPE(2, 2), 0, 58, 64, 139, 154);
  EXPECT(em_matmul(em_cast(a, D), em_cast(b, D)), D, SHAPE(2, 2), 0, 58, 64, 139, 154);
  if (etest_on_cuda()) { /* as in PyTorch, integer matmul is CPU only */
    EXPECT_ERROR(em_matmul(em_cast(a, EM_I64), em_cast(b, EM_I64)), "cuBLAS has no integer GEMM");
    return;
  }
  EXPECT(em_matmul(em_cast(a, EM_I64), em_cast(b, EM_I64)), EM_I64, SHAPE(2, 2), 0, 58, 64, 139, 154);
  EXPECT(em_matmul(em_cast(a, EM_I32), em_cast(b, EM_I32)), EM_I32, SHAPE(2, 2), 0, 58, 64, 139, 154);
}

ETEST(matmul, torch_matmul_rules) {
  em_tensor *v = T(F, SHAPE(3), 1, 0, -1), *m = T(F, SHAPE(3, 2), 1, 2, 3, 4, 5, 6);
  EXPECT(em_matmul(v, m), F, SHAPE(2), 0, -4, -4);             /* [3] @ [3,2] -> [2] */
  EXPECT(em_matmul(em_transpose(m, 0, 1), v), F, SHAPE(2), 0, -4, -4);
  EXPECT(em_matmul(v, v), F, SCALAR_SHAPE, 0, 2);              /* dot */
  em_tensor *batch = em_reshape(em_arange(F, 0, 12, 1), EM_SHAPE(2, 2, 3));
  EXPECT(em_matmul(batch, m), F, SHAPE(2, 2, 2), 0, 13, 16, 40, 52, 67, 88, 94, 124);
  EXPECT(em_matmul(batch, v), F, SHAPE(2, 2), 0, -2, -2, -2, -2);
  /* batch dims broadcast: [2,1,2,3] @ [3,3,2] -> [2,3,2,2] */
  em_tensor *b3 = em_expand(em_unsqueeze(m, 0), EM_SHAPE(3, 3, 2));
  em_tensor *r = em_matmul(em_unsqueeze(batch, 1), b3);
  cr_assert_eq(em_ndim(r), 4);
  cr_assert_eq(em_size(r, 1), 3);
  EXPECT(em_slice(em_slice(r, 0, 1, 2, 1), 1, 2, 3, 1), F, SHAPE(1, 1, 2, 2), 0, 67, 88, 94, 124);
  EXPECT_ALL(em_matmul(em_zeros(F, EM_SHAPE(2, 0)), em_zeros(F, EM_SHAPE(0, 3))), F, SHAPE(2, 3), 0, 0);
}

static void check_against_reference(em_tensor *got, em_tensor *a, em_tensor *b, double tol) {
  em_tensor *ref = em_empty(em_dtype_of(got), em_ndim(got), em_sizes(got));
  prim_buf o = {em_data_ptr(ref), em_dtype_of(ref), em_ndim(ref)}, pa = {em_data_ptr(a), em_dtype_of(a), em_ndim(a)},
           pb = {em_data_ptr(b), em_dtype_of(b), em_ndim(b)};
  for (int i = 0; i < em_ndim(ref); i++) o.sizes[i] = em_sizes(ref)[i], o.strides[i] = em_strides(ref)[i];
  for (int i = 0; i < em_ndim(a); i++) pa.sizes[i] = em_sizes(a)[i], pa.strides[i] = em_strides(a)[i];
  for (int i = 0; i < em_ndim(b); i++) pb.sizes[i] = em_sizes(b)[i], pb.strides[i] = em_strides(b)[i];
  prim_matmul_ref(&o, &pa, &pb);
  double err = em_item(em_amax(em_abs(em_sub(got, ref)), 0, NULL, false));
  double scale = em_item(em_amax(em_abs(ref), 0, NULL, false));
  cr_assert(err <= tol * (1 + scale), "max error %g (scale %g)", err, scale);
}

ETEST(matmul, library_matches_reference_on_strided_operands) {
  CPU_ONLY("runs the reference kernel on host pointers into the tensors");
  em_manual_seed(11);
  int64_t sizes[][3] = {{1, 1, 1}, {7, 33, 5}, {64, 17, 128}, {130, 70, 90}};
  for (size_t s = 0; s < 4; s++) {
    int64_t m = sizes[s][0], k = sizes[s][1], n = sizes[s][2];
    for (int dt = 0; dt < 2; dt++) {
      em_dtype t = dt ? D : F;
      em_tensor *a = em_randn(t, EM_SHAPE(m, k)), *b = em_randn(t, EM_SHAPE(k, n));
      check_against_reference(em_matmul(a, b), a, b, dt ? 1e-12 : 1e-5);
      em_tensor *at = em_transpose(em_randn(t, EM_SHAPE(k, m)), 0, 1); /* column-major a */
      em_tensor *bt = em_transpose(em_randn(t, EM_SHAPE(n, k)), 0, 1);
      check_against_reference(em_matmul(at, bt), at, bt, dt ? 1e-12 : 1e-5);
      em_tensor *as = em_slice(em_randn(t, EM_SHAPE(m, 2 * k)), 1, 0, 2 * k, 2); /* stepped: copied */
      check_against_reference(em_matmul(as, b), as, b, dt ? 1e-12 : 1e-5);
    }
  }
  /* batched with a broadcast (stride 0) batch */
  em_tensor *a = em_randn(F, EM_SHAPE(4, 9, 6));
  em_tensor *b = em_expand(em_randn(F, EM_SHAPE(1, 6, 5)), EM_SHAPE(4, 6, 5));
  check_against_reference(em_matmul(a, b), a, b, 1e-5);
}

/* An operand whose rows lie a multiple of 2 or 4 KiB apart is copied into padded rows first
 * (prims/extern.c: aliasing_ld), depending on the ISA: the product must have the bits of the
 * same operands read through views whose rows are 64 bytes further apart, and the reference's
 * values, batched and broadcast too. Each case has one operand with 1024-float rows, read as it
 * is or transposed. */
static em_tensor *operand(int64_t rows, int64_t cols, bool transposed, bool padded) {
  /* rows x cols as the product reads it; stored row-major, or transposed (cols x rows) */
  int64_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  em_tensor *wide = em_randn(F, EM_SHAPE(r, c + 16)), *v = em_slice(wide, 1, 0, c, 1);
  if (!padded) v = em_contiguous(v);
  return transposed ? em_transpose(v, 0, 1) : v;
}
ETEST(matmul, operands_with_aliasing_rows_keep_their_bits) {
  CPU_ONLY("runs the reference kernel on host pointers into the tensors");
  struct { int64_t m, k, n; bool ta, tb; } cases[] = {
      {256, 64, 1024, false, false},  /* b's rows 4 KiB apart */
      {1024, 128, 256, true, false},  /* a transposed, its columns 4 KiB apart */
      {256, 1024, 64, false, true},   /* b transposed */
      {96, 512, 512, false, false}};  /* b's rows 2 KiB apart: copied for the AVX2 kernels only */
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int64_t m = cases[c].m, k = cases[c].k, n = cases[c].n;
    for (int p = 0; p < 2; p++) { /* the same values: aliasing rows, then rows 64 bytes further apart */
      em_manual_seed(12 + (uint64_t)c);
      em_tensor *a = operand(m, k, cases[c].ta, p), *b = operand(k, n, cases[c].tb, p);
      em_tensor *got = em_matmul(a, b);
      check_against_reference(got, a, b, 1e-5);
      static em_tensor *first;
      if (!p) first = got;
      else EXPECT_SAME_BITS(got, first, "aliasing rows against unaliased rows");
    }
  }
  em_tensor *a = em_randn(F, EM_SHAPE(2, 256, 64));
  em_tensor *b = em_expand(em_randn(F, EM_SHAPE(1, 64, 1024)), EM_SHAPE(2, 64, 1024)); /* broadcast batch */
  check_against_reference(em_matmul(a, b), a, b, 1e-5);
}

static em_tensor *conv_ref(em_prim op, const ir_shape *out_shape, em_tensor *a, em_tensor *b, em_conv2d_params p) {
  em_tensor *ref = em_empty(em_dtype_of(a), out_shape->ndim, out_shape->sizes);
  prim_attrs at = {.conv = p, .shape = *out_shape};
  prim_buf o = {em_data_ptr(ref), em_dtype_of(ref), 4}, pa = {em_data_ptr(a), em_dtype_of(a), 4},
           pb = {em_data_ptr(b), em_dtype_of(b), 4};
  for (int i = 0; i < 4; i++) {
    o.sizes[i] = em_sizes(ref)[i], o.strides[i] = em_strides(ref)[i];
    pa.sizes[i] = em_sizes(a)[i], pa.strides[i] = em_strides(a)[i];
    pb.sizes[i] = em_sizes(b)[i], pb.strides[i] = em_strides(b)[i];
  }
  prim_conv2d_ref(op, &at, &o, &pa, &pb);
  return ref;
}

static void expect_close(em_tensor *got, em_tensor *ref, double tol, const char *what) {
  cr_assert_not_null(got, "%s: %s", what, em_last_error() ? em_last_error() : "");
  double err = em_item(em_amax(em_abs(em_sub(got, ref)), 0, NULL, false));
  double scale = em_item(em_amax(em_abs(ref), 0, NULL, false));
  cr_assert(err <= tol * (1 + scale), "%s: max error %g (scale %g)", what, err, scale);
}

ETEST(conv2d, by_hand) {
  /* 1x1x3x3 input, 2x2 kernel of ones: each output sums a 2x2 window. */
  em_tensor *x = T(F, SHAPE(1, 1, 3, 3), 1, 2, 3, 4, 5, 6, 7, 8, 9);
  em_tensor *w = em_ones(F, EM_SHAPE(1, 1, 2, 2));
  EXPECT(em_conv2d(x, w, EM_NONE, EM_CONV2D_DEFAULT), F, SHAPE(1, 1, 2, 2), 1e-6, 12, 16, 24, 28);
  EXPECT(em_conv2d(x, w, T(F, SHAPE(1), 0.5), EM_CONV2D_DEFAULT), F, SHAPE(1, 1, 2, 2), 1e-6, 12.5, 16.5, 24.5, 28.5);
  em_conv2d_params p = {{2, 2}, {1, 1}, {1, 1}, 1};
  EXPECT(em_conv2d(x, w, EM_NONE, p), F, SHAPE(1, 1, 2, 2), 1e-6, 1, 5, 11, 28);
  EXPECT(em_conv2d(em_cast(x, D), em_cast(w, D), EM_NONE, p), D, SHAPE(1, 1, 2, 2), 0, 1, 5, 11, 28);
  /* backward input of the unit-stride case: every input gathers the windows that cover it */
  em_tensor *g = em_ones(F, EM_SHAPE(1, 1, 2, 2));
  EXPECT(em_conv2d_backward_input(g, w, ((int64_t[]){3, 3}), EM_CONV2D_DEFAULT), F, SHAPE(1, 1, 3, 3), 1e-6,
         1, 2, 1, 2, 4, 2, 1, 2, 1);
  EXPECT(em_conv2d_backward_weight(x, g, ((int64_t[]){2, 2}), EM_CONV2D_DEFAULT), F, SHAPE(1, 1, 2, 2), 1e-6,
         12, 16, 24, 28);
}

ETEST(conv2d, library_matches_reference) {
  CPU_ONLY("runs the reference kernel on host pointers into the tensors");
  em_manual_seed(5);
  struct { int64_t n, c, h, w, o, kh, kw; em_conv2d_params p; } cases[] = {
      {2, 1, 28, 28, 6, 5, 5, {{1, 1}, {2, 2}, {1, 1}, 1}},   /* LeNet conv 1 */
      {2, 6, 14, 14, 16, 5, 5, {{1, 1}, {0, 0}, {1, 1}, 1}},  /* LeNet conv 2 */
      {1, 4, 9, 7, 6, 3, 3, {{2, 1}, {1, 0}, {1, 1}, 2}},     /* stride, asymmetric padding, groups */
      {1, 3, 11, 11, 4, 3, 3, {{1, 1}, {2, 2}, {2, 2}, 1}},   /* dilation */
      {3, 8, 5, 5, 8, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 8}},     /* depthwise 1x1 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    em_conv2d_params p = cases[i].p;
    for (int dt = 0; dt < 2; dt++) {
      em_dtype t = dt ? D : F;
      double tol = dt ? 1e-12 : 1e-5;
      em_tensor *x = em_randn(t, EM_SHAPE(cases[i].n, cases[i].c, cases[i].h, cases[i].w));
      em_tensor *w = em_randn(t, EM_SHAPE(cases[i].o, cases[i].c / p.groups, cases[i].kh, cases[i].kw));
      em_tensor *y = em_conv2d(x, w, EM_NONE, p);
      cr_assert_not_null(y, "%s", em_last_error());
      ir_shape ys = {4, {em_size(y, 0), em_size(y, 1), em_size(y, 2), em_size(y, 3)}};
      expect_close(y, conv_ref(EM_PRIM_CONV2D, &ys, x, w, p), tol, "forward");
      em_tensor *g = em_randn(t, 4, em_sizes(y));
      ir_shape xs = {4, {cases[i].n, cases[i].c, cases[i].h, cases[i].w}};
      expect_close(em_conv2d_backward_input(g, w, ((int64_t[]){cases[i].h, cases[i].w}), p),
                   conv_ref(EM_PRIM_CONV2D_BWD_INPUT, &xs, g, w, p), tol, "backward input");
      ir_shape ws = {4, {cases[i].o, cases[i].c / p.groups, cases[i].kh, cases[i].kw}};
      expect_close(em_conv2d_backward_weight(x, g, ((int64_t[]){cases[i].kh, cases[i].kw}), p),
                   conv_ref(EM_PRIM_CONV2D_BWD_WEIGHT, &ws, x, g, p), tol, "backward weight");
      /* a non-contiguous input gives the same result */
      em_tensor *xt = em_transpose(em_contiguous(em_transpose(x, 2, 3)), 2, 3);
      cr_assert(!em_is_contiguous(xt));
      expect_close(em_conv2d(xt, w, EM_NONE, p), y, tol, "strided input");
    }
  }
}

ETEST(conv2d, shape_checks) {
  em_tensor *g = em_zeros(F, EM_SHAPE(1, 2, 4, 4)), *w = em_zeros(F, EM_SHAPE(2, 3, 3, 3));
  EXPECT_ERROR(em_conv2d_backward_input(g, w, ((int64_t[]){9, 9}), EM_CONV2D_DEFAULT), "grad_out is f32[1,2,4,4] but the convolution gives f32[1,2,7,7]");
  EXPECT_ERROR(em_conv2d_backward_input(g, w, NULL, EM_CONV2D_DEFAULT), "input_hw is NULL");
  em_tensor *x = em_zeros(F, EM_SHAPE(1, 3, 6, 6));
  EXPECT_ERROR(em_conv2d_backward_weight(x, g, ((int64_t[]){2, 2}), EM_CONV2D_DEFAULT), "grad_out is f32[1,2,4,4] but the convolution gives f32[1,2,5,5]");
}
