/* tests/gradcheck.h: finite-difference gradient checks in f64.
 *
 * gradcheck(f, ctx, n, inputs) compares em_grad's vector-Jacobian product of f against central
 * differences: with a random cotangent v of f's output shape, the analytic d<v, f>/d inputs[i]
 * must match (<v, f(x + h e_j)> - <v, f(x - h e_j)>) / 2h for every element j of every input.
 * Inputs must be contiguous f64 leaves requiring grad; non-contiguous and broadcast operands are
 * made inside f from them. */
#ifndef EMBER_TEST_GRADCHECK_H
#define EMBER_TEST_GRADCHECK_H

#include "common.h"

typedef em_tensor *(*gc_fn)(em_tensor *const *x, void *ctx);

static inline double gc_dot(em_tensor *a, em_tensor *b) {
  return em_item(em_sum(em_mul(em_cast(a, EM_F64), b), 0, NULL, false));
}

static inline void gradcheck_tol(const char *what, gc_fn f, void *ctx, int n, em_tensor *const *x, double atol,
                                 double rtol) {
  em_scope_begin();
  em_tensor *y = f(x, ctx);
  cr_assert_not_null(y, "%s: forward failed: %s", what, em_last_error() ? em_last_error() : "");
  cr_assert(em_requires_grad(y), "%s: output does not require grad", what);
  em_tensor *v = em_randn(EM_F64, em_ndim(y), em_sizes(y));
  if (em_dtype_of(y) != EM_F64) v = em_cast(v, em_dtype_of(y));
  em_tensor *g[8];
  cr_assert(em_grad(1, &y, &v, n, x, g, false, false), "%s: %s", what, em_last_error() ? em_last_error() : "");
  em_tensor *vd = em_cast(v, EM_F64);
  for (int i = 0; i < n; i++) {
    cr_assert_eq(em_ndim(g[i]), em_ndim(x[i]), "%s: grad %d has the wrong rank", what, i);
    /* element j of x[i], written through a one-element view (works on any device) */
    em_tensor *flat = em_reshape(x[i], 1, (int64_t[]){em_numel(x[i])});
    for (int64_t j = 0; j < em_numel(x[i]); j++) {
      const double h = 1e-6;
      em_no_grad_begin();
      em_tensor *e = em_slice(flat, 0, j, j + 1, 1);
      double keep = em_item(e);
      em_fill_(e, keep + h);
      double up = gc_dot(f(x, ctx), vd);
      em_fill_(e, keep - h);
      double down = gc_dot(f(x, ctx), vd);
      em_fill_(e, keep);
      em_no_grad_end();
      double num = (up - down) / (2 * h);
      double ana = etest_at(g[i], j);
      cr_assert(fabs(num - ana) <= atol + rtol * fabs(num), "%s: d/dx%d[%lld]: analytic %.10g, numeric %.10g", what,
                i, (long long)j, ana, num);
    }
  }
  em_scope_end();
}
#define gradcheck(what, f, ctx, n, x) gradcheck_tol((what), (f), (ctx), (n), (x), 1e-6, 1e-5)

/* A leaf f64 tensor with values in [lo, hi), requiring grad. */
static inline em_tensor *gc_leaf(double lo, double hi, int ndim, const int64_t *sizes) {
  em_tensor *t = em_add_scalar(em_mul_scalar(em_rand(EM_F64, ndim, sizes), hi - lo), lo);
  return em_requires_grad_(t, true);
}

#endif
