/* tests/test_movement.c: views (reshape, permute, transpose, expand, slice, squeeze,
 * unsqueeze) and copies (clone, contiguous, flip, pad, cat), and indexing (gather,
 * index_select, scatter_add), on contiguous and strided inputs of several dtypes. */
#include "common.h"

#define F EM_F32
#define D EM_F64

ETEST(views, permute_expand_squeeze) {
  em_tensor *x = em_reshape(em_arange(F, 0, 6, 1), EM_SHAPE(1, 2, 3));
  em_tensor *p = em_permute(x, EM_AXES(2, 0, 1));
  EXPECT(em_contiguous(p), F, SHAPE(3, 1, 2), 0, 0, 3, 1, 4, 2, 5);
  cr_assert(em_shares_storage(x, p));
  EXPECT(em_squeeze(x, 0, NULL), F, SHAPE(2, 3), 0, 0, 1, 2, 3, 4, 5);
  EXPECT(em_squeeze(x, EM_AXES(-3)), F, SHAPE(2, 3), 0, 0, 1, 2, 3, 4, 5);
  EXPECT(em_unsqueeze(em_squeeze(x, 0, NULL), -1), F, SHAPE(2, 3, 1), 0, 0, 1, 2, 3, 4, 5);
  EXPECT(em_unsqueeze(em_squeeze(x, 0, NULL), 1), F, SHAPE(2, 1, 3), 0, 0, 1, 2, 3, 4, 5);
  em_tensor *e = em_expand(T(EM_I32, SHAPE(2, 1), 7, 8), EM_SHAPE(2, -1, 3));
  cr_assert_eq(em_strides(e)[0], 0);
  cr_assert_eq(em_strides(e)[2], 0);
  EXPECT(e, EM_I32, SHAPE(2, 2, 3), 0, 7, 7, 7, 8, 8, 8, 7, 7, 7, 8, 8, 8);
  EXPECT(em_permute(em_scalar(F, 1), 0, NULL), F, SCALAR_SHAPE, 0, 1);
}

ETEST(views, slicing_like_python) {
  em_tensor *x = em_arange(EM_I64, 0, 10, 1);
  EXPECT(em_slice(x, 0, 2, 5, 1), EM_I64, SHAPE(3), 0, 2, 3, 4);
  EXPECT(em_slice(x, 0, -3, 100, 1), EM_I64, SHAPE(3), 0, 7, 8, 9);
  EXPECT(em_slice(x, 0, 0, 10, 4), EM_I64, SHAPE(3), 0, 0, 4, 8);
  EXPECT_ALL(em_slice(x, 0, 8, 2, 1), EM_I64, SHAPE(0), 0, 0);
  EXPECT(em_slice(x, -1, -100, -8, 1), EM_I64, SHAPE(2), 0, 0, 1);
  em_tensor *m = em_reshape(x, EM_SHAPE(2, 5));
  em_tensor *s = em_slice(em_slice(m, 1, 1, 5, 2), 0, 1, 2, 1);
  EXPECT(s, EM_I64, SHAPE(1, 2), 0, 6, 8);
  /* a reshape of a strided slice that still has a view */
  em_tensor *r = em_reshape(em_slice(m, 0, 0, 2, 1), EM_SHAPE(10));
  cr_assert(em_shares_storage(r, x));
}

ETEST(views, reshape_views_when_possible) {
  em_tensor *x = em_zeros(F, EM_SHAPE(4, 6));
  em_tensor *t = em_transpose(em_reshape(x, EM_SHAPE(2, 2, 6)), 0, 1); /* [2,2,6], dims 0,1 swapped */
  em_tensor *v = em_reshape(t, EM_SHAPE(2, 2, 2, 3));                 /* splits the last dim: a view */
  cr_assert(em_shares_storage(v, x));
  em_tensor *c = em_reshape(t, EM_SHAPE(4, 6)); /* merges swapped dims: a copy */
  cr_assert(!em_shares_storage(c, x));
  /* as in torch: with 0 elements the -1 could be anything */
  EXPECT_ERROR(em_reshape(em_zeros(F, EM_SHAPE(0, 4)), EM_SHAPE(2, 0, -1)), "cannot infer the -1 size");
  EXPECT_ALL(em_reshape(em_zeros(F, EM_SHAPE(0, 4)), EM_SHAPE(2, 0, 5)), F, SHAPE(2, 0, 5), 0, 0);
}

ETEST(copies, clone_and_contiguous) {
  em_tensor *x = em_transpose(T(D, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), 0, 1);
  em_tensor *c = em_clone(x);
  cr_assert(em_is_contiguous(c));
  EXPECT(c, D, SHAPE(3, 2), 0, 1, 4, 2, 5, 3, 6);
  em_tensor *y = em_ones(F, EM_SHAPE(3));
  cr_assert_eq(em_contiguous(y), y, "contiguous of a contiguous tensor is itself");
  em_tensor *c2 = em_clone(y);
  cr_assert(!em_shares_storage(c2, y));
  em_tensor *h = em_cast(T(F, SHAPE(2, 2), 1, 2, 3, 4), EM_F16);
  EXPECT(em_cast(em_clone(em_transpose(h, 0, 1)), F), F, SHAPE(2, 2), 0, 1, 3, 2, 4);
}

ETEST(copies, flip) {
  em_tensor *x = em_reshape(em_arange(EM_I32, 0, 6, 1), EM_SHAPE(2, 3));
  EXPECT(em_flip(x, EM_AXES(1)), EM_I32, SHAPE(2, 3), 0, 2, 1, 0, 5, 4, 3);
  EXPECT(em_flip(x, EM_AXES(0, -1)), EM_I32, SHAPE(2, 3), 0, 5, 4, 3, 2, 1, 0);
  EXPECT(em_flip(em_transpose(x, 0, 1), EM_AXES(0)), EM_I32, SHAPE(3, 2), 0, 2, 5, 1, 4, 0, 3);
  EXPECT(em_flip(x, 0, NULL), EM_I32, SHAPE(2, 3), 0, 0, 1, 2, 3, 4, 5);
}

ETEST(copies, pad) {
  em_tensor *x = T(F, SHAPE(2, 2), 1, 2, 3, 4);
  EXPECT(em_pad(x, 2, (int64_t[]){1, 0}, 0), F, SHAPE(2, 3), 0, 0, 1, 2, 0, 3, 4);
  EXPECT(em_pad(x, 4, (int64_t[]){0, 1, 1, 0}, -1), F, SHAPE(3, 3), 0, -1, -1, -1, 1, 2, -1, 3, 4, -1);
  EXPECT(em_pad(em_transpose(x, 0, 1), 2, (int64_t[]){1, 1}, 9), F, SHAPE(2, 4), 0, 9, 1, 3, 9, 9, 2, 4, 9);
  EXPECT(em_pad(T(EM_U8, SHAPE(1), 5), 2, (int64_t[]){2, 0}, 7), EM_U8, SHAPE(3), 0, 7, 7, 5);
  EXPECT(em_pad(x, 0, NULL, 0), F, SHAPE(2, 2), 0, 1, 2, 3, 4);
}

ETEST(copies, cat) {
  em_tensor *a = T(F, SHAPE(1, 2), 1, 2), *b = T(F, SHAPE(2, 2), 3, 4, 5, 6);
  EXPECT(em_cat(2, ((em_tensor *[]){a, b}), 0), F, SHAPE(3, 2), 0, 1, 2, 3, 4, 5, 6);
  EXPECT(em_cat(2, ((em_tensor *[]){em_transpose(b, 0, 1), b}), -1), F, SHAPE(2, 4), 0, 3, 5, 3, 4, 4, 6, 5, 6);
  EXPECT(em_cat(2, ((em_tensor *[]){T(EM_I64, SHAPE(1), 1), T(D, SHAPE(2), 0.5, 2)}), 0), D, SHAPE(3), 0, 1, 0.5, 2);
  EXPECT(em_cat(2, ((em_tensor *[]){em_zeros(F, EM_SHAPE(0, 2)), a}), 0), F, SHAPE(1, 2), 0, 1, 2);
  EXPECT(em_cat(1, ((em_tensor *[]){a}), 1), F, SHAPE(1, 2), 0, 1, 2);
}

ETEST(indexing, gather) {
  em_tensor *x = T(F, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
  em_tensor *i = T(EM_I64, SHAPE(2, 2), 2, 0, 1, 1);
  EXPECT(em_gather(x, 1, i), F, SHAPE(2, 2), 0, 3, 1, 5, 5);
  em_tensor *j = T(EM_I32, SHAPE(1, 3), 1, 0, 1);
  EXPECT(em_gather(x, 0, j), F, SHAPE(1, 3), 0, 4, 2, 6);
  EXPECT(em_gather(em_transpose(x, 0, 1), 0, T(EM_I64, SHAPE(1, 2), 2, 1)), F, SHAPE(1, 2), 0, 3, 5);
}

ETEST(indexing, index_select) {
  em_tensor *x = em_reshape(em_arange(D, 0, 12, 1), EM_SHAPE(4, 3));
  EXPECT(em_index_select(x, 0, T(EM_I64, SHAPE(3), 3, 0, 3)), D, SHAPE(3, 3), 0, 9, 10, 11, 0, 1, 2, 9, 10, 11);
  EXPECT(em_index_select(x, 1, T(EM_I32, SHAPE(2), 2, 0)), D, SHAPE(4, 2), 0, 2, 0, 5, 3, 8, 6, 11, 9);
  EXPECT(em_index_select(em_transpose(x, 0, 1), 0, T(EM_I64, SHAPE(1), 1)), D, SHAPE(1, 4), 0, 1, 4, 7, 10);
  EXPECT_ALL(em_index_select(x, 0, em_zeros(EM_I64, EM_SHAPE(0))), D, SHAPE(0, 3), 0, 0);
}

ETEST(indexing, scatter_add) {
  em_tensor *x = em_zeros(F, EM_SHAPE(3));
  EXPECT(em_scatter_add(x, 0, T(EM_I64, SHAPE(4), 0, 2, 0, 0), T(F, SHAPE(4), 1, 2, 3, 4)), F, SHAPE(3), 0, 8, 0, 2);
  EXPECT(x, F, SHAPE(3), 0, 0, 0, 0); /* out of place */
  em_tensor *m = em_ones(EM_I64, EM_SHAPE(2, 3));
  em_tensor *idx = T(EM_I64, SHAPE(2, 2), 2, 2, 0, 1);
  EXPECT(em_scatter_add(m, 1, idx, T(EM_I64, SHAPE(2, 3), 5, 6, 100, 7, 8, 100)), EM_I64, SHAPE(2, 3), 0, 1, 1, 12,
         8, 9, 1);
  /* src converted to x's dtype */
  EXPECT(em_scatter_add(em_zeros(D, EM_SHAPE(2)), 0, T(EM_I32, SHAPE(2), 1, 1), T(F, SHAPE(2), 0.5, 0.25)), D,
         SHAPE(2), 0, 0, 0.75);
}

ETEST(copies, slice_scatter) {
  em_tensor *x = em_zeros(EM_I64, EM_SHAPE(2, 5));
  EXPECT(em_slice_scatter(x, T(EM_I64, SHAPE(2, 2), 1, 2, 3, 4), 1, 1, 5, 2), EM_I64, SHAPE(2, 5), 0, 0, 1, 0, 2, 0, 0, 3,
         0, 4, 0);
  EXPECT(x, EM_I64, SHAPE(2, 5), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0); /* out of place */
  EXPECT(em_slice_scatter(em_transpose(T(F, SHAPE(2, 2), 1, 2, 3, 4), 0, 1), T(F, SHAPE(1, 2), 9, 9), 0, -1, 2, 1), F,
         SHAPE(2, 2), 0, 1, 3, 9, 9);
  EXPECT_ERROR(em_slice_scatter(x, T(EM_I64, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), 1, 1, 5, 2), "does not match the slice");
}
