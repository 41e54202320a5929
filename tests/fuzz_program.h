/* tests/fuzz_program.h: the differential fuzzer's program generator and checker, shared by the
 * CI slice (tests/test_fuzz.c) and the long run (bench/fuzz.c).
 *
 * A program is a seed. From it come the inputs (rank 0 to 3, sizes 0 to 7, f32 or f64, laid out
 * contiguous, transposed, strided or expanded, each the view of a leaf, most of which require
 * grad; sometimes an input is a view overlapping the previous one's storage) and a
 * random DAG of 4 to 30 public ops over them: pointwise ops and their scalar forms, comparisons
 * and where, casts through f64, i32 and bool, clamp, every reduction with several, negative,
 * unsorted or no axes and keepdim either way, argmax, softmax, log_softmax, logsumexp, var,
 * layer_norm, views with negative dims (transpose, permute, reshape, slice with steps, expand,
 * unsqueeze, squeeze, flip), cat, pad, matmul, in-place writes into clones and into views of
 * them, dropout (Philox, reseeded per run), a graph break, and a value read with em_item and fed
 * back as a scalar. It returns 1 to 4 outputs: the last value, others from the pool, sometimes an
 * input or a view of one, sometimes the same value twice. Every choice is made from shapes and
 * the seed only, so the eager run, each traced run and the f64 run make the same choices.
 *
 * fz_check runs a program eagerly (the oracle) and under each compiled configuration (backends
 * eager, aot_eager with both partitioners, inductor with both partitioners and without
 * rematerialization), three calls each with new data (the trace, the validating second call, a
 * replay), with and without backward (gradients of a random weighting of the float outputs with
 * respect to the leaves that require grad), and compares every output and gradient:
 *   - backend eager: bit for bit (it promises eager's bits);
 *   - the others: |got - eager| <= 1e-5 (|eager| + scale) + 1e-6 for f32 (1e-12 and 1e-13 for
 *     f64), scale being the output's largest finite magnitude: exp, log, tanh, erf run SLEEF's
 *     1 to 3.5 ULP functions in generated code, and sums run in another order, whose rounding
 *     grows with the terms' magnitudes, not the result's. An element outside that still passes
 *     when its error against the same program run in f64 is at most 4 times eager's worst error
 *     in that tensor, plus atol, plus rtol times the largest magnitude the program produced:
 *     chains of reductions and differences lose digits in eager too, and a result that cancels
 *     (the gradient of sum(layer_norm(x)), zero in exact arithmetic) carries rounding of the
 *     size of its terms, not of itself; no fixed tolerance separates that from a miscompile,
 *     but "no worse than eager, at the program's scale" does, while a miscompile's error is of
 *     the order of the values.
 * A failure is reported with the seed, the configuration, the call, the output or gradient,
 * the element, both values and the program text. */
#ifndef EMBER_TEST_FUZZ_PROGRAM_H
#define EMBER_TEST_FUZZ_PROGRAM_H

#include <ember.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FZ_POOL = 96, FZ_MAX_IN = 3, FZ_MAX_OUT = 4 };

/* Discontinuous ops (sign, floor, ceil, comparisons, casts to integers and bool) get operands
 * shifted by this: a value that cancels to zero in exact arithmetic (the mean of a layer_norm)
 * is rounding noise of either sign, which flips such an op in eager and compiled code alike at
 * random; a shift by a constant no program produces moves the discontinuity away from it. */
#define FZ_SHIFT 0.3183098861837907

typedef struct fz_rng {
  uint64_t s;
} fz_rng;
static inline uint32_t fz_next(fz_rng *r) {
  r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(r->s >> 33);
}
static inline int fz_pick(fz_rng *r, int n) { return n > 0 ? (int)(fz_next(r) % (uint32_t)n) : 0; }

/* One program: its seed and what running it needs. */
typedef struct fz_program {
  uint64_t seed;
  int n_ops;
  bool truth;       /* run in f64 (the f64 reference of a float program) */
  char *text;       /* when not NULL: the ops are appended here as they are made */
  size_t len, cap;
  int data;         /* which data set fills the inputs (0: the first call's, 1, 2: new data) */
  bool cuda;        /* inputs, and what the program creates, on the GPU (a compiled configuration) */
  bool dense;
  bool measure;      /* (eager runs) record the largest finite magnitude of any value the program made */
  double magnitude;
  int grow;         /* dynamic shapes (fz_check_dynamic): every input size >= 2 grows by this much, and */
                    /* inputs are contiguous and unshared (no transposed, strided or expanded views) */
} fz_program;

static void fz_log(fz_program *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fz_log(fz_program *p, const char *fmt, ...) {
  if (!p->text && !p->cap) return;
  va_list ap;
  va_start(ap, fmt);
  char line[256];
  int k = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  if ((size_t)k >= sizeof line) k = sizeof line - 1;
  if (p->len + (size_t)k + 2 > p->cap) {
    size_t cap = (p->cap ? p->cap * 2 : 1024) + (size_t)k;
    char *t = realloc(p->text, cap);
    if (!t) return;
    p->text = t, p->cap = cap;
  }
  memcpy(p->text + p->len, line, (size_t)k);
  p->len += (size_t)k;
  p->text[p->len++] = '\n';
  p->text[p->len] = 0;
}

static void fz_fmt_shape(char *b, size_t cap, em_tensor *t) {
  size_t k = (size_t)snprintf(b, cap, "%s[", em_dtype_name(em_dtype_of(t)));
  for (int d = 0; d < em_ndim(t) && k < cap; d++) k += (size_t)snprintf(b + k, cap - k, d ? ",%lld" : "%lld", (long long)em_size(t, d));
  if (k < cap) snprintf(b + k, cap - k, "]");
}

/* The program's float dtype (f32 or f64) and whether it runs backward: from the seed alone. */
static inline em_dtype fz_dtype(uint64_t seed) {
  fz_rng r = {seed * 2654435761u + 17};
  return fz_pick(&r, 5) == 0 ? EM_F64 : EM_F32;
}
static inline bool fz_backward(uint64_t seed) {
  fz_rng r = {seed * 40503u + 99};
  return fz_pick(&r, 3) != 0;
}

/* An axis index as the user may write it: d or d - ndim. */
static inline int64_t fz_axis(fz_rng *r, int d, int nd) { return fz_pick(r, 2) ? d - nd : d; }

static inline bool fz_same_shape(em_tensor *a, em_tensor *b) {
  if (em_ndim(a) != em_ndim(b)) return false;
  for (int i = 0; i < em_ndim(a); i++)
    if (em_size(a, i) != em_size(b, i)) return false;
  return true;
}

/* Whether b broadcasts against a into a's shape (b's dims match a's trailing dims or are 1). */
static inline bool fz_broadcasts_into(em_tensor *a, em_tensor *b) {
  if (em_ndim(b) > em_ndim(a)) return false;
  for (int i = 1; i <= em_ndim(b); i++) {
    int64_t x = em_size(a, em_ndim(a) - i), y = em_size(b, em_ndim(b) - i);
    if (y != x && y != 1) return false;
  }
  return true;
}

static inline bool fz_no_empty_dim(em_tensor *t) {
  for (int d = 0; d < em_ndim(t); d++)
    if (em_size(t, d) == 0) return false;
  return true;
}

/* The model function: a random DAG over in (see the file comment). Returns the number of
 * outputs, or -1 when an op failed (the generator made an invalid program: a generator bug, or
 * eager rejected what it should accept). */
static int fz_build(em_tensor *const *in, int n_in, em_tensor **out, fz_program *p) {
  fz_rng r = {p->seed * 7919 + 3};
  em_dtype fdt = p->truth ? EM_F64 : fz_dtype(p->seed);
  em_tensor *pool[FZ_POOL];
  int n = 0, broke = 0;
  char b0[64];
  for (int i = 0; i < n_in; i++) {
    pool[n++] = in[i];
    fz_fmt_shape(b0, sizeof b0, in[i]);
    fz_log(p, "v%d = input %d : %s", n - 1, i, b0);
  }
  for (int step = 0; step < p->n_ops && n < FZ_POOL; step++) {
    int ia = n - 1 - fz_pick(&r, n < 6 ? n : 6); /* favour recent values: deeper DAGs */
    em_tensor *a = pool[ia];
    int ib = ia; /* a partner that broadcasts into a */
    for (int tries = 0; tries < 6; tries++) {
      int c = fz_pick(&r, n);
      if (fz_broadcasts_into(a, pool[c])) {
        ib = c;
        break;
      }
    }
    em_tensor *b = pool[ib];
    int nd = em_ndim(a), d0 = nd ? fz_pick(&r, nd) : 0, d1 = nd ? fz_pick(&r, nd) : 0;
    int64_t ax0 = fz_axis(&r, d0, nd), ax1 = fz_axis(&r, d1, nd);
    double k = (double)(fz_pick(&r, 9) - 4) * 0.5; /* a scalar constant */
    bool keep = fz_pick(&r, 2);
    bool full = fz_no_empty_dim(a);
    em_tensor *x = NULL;
    char what[160];
    int op = fz_pick(&r, 44);
    switch (op) {
    case 0: x = em_neg(a), snprintf(what, sizeof what, "neg(v%d)", ia); break;
    case 1: x = em_abs(a), snprintf(what, sizeof what, "abs(v%d)", ia); break;
    case 2: x = em_exp(em_tanh(a)), snprintf(what, sizeof what, "exp(tanh(v%d))", ia); break;
    case 3: x = em_log(em_add_scalar(em_abs(a), 1)), snprintf(what, sizeof what, "log(abs(v%d) + 1)", ia); break;
    case 4: x = em_sqrt(em_add_scalar(em_abs(a), 1)), snprintf(what, sizeof what, "sqrt(abs(v%d) + 1)", ia); break;
    case 5: x = fz_pick(&r, 2) ? em_sin(a) : em_cos(a), snprintf(what, sizeof what, "sin or cos(v%d)", ia); break;
    case 6: x = em_sigmoid(a), snprintf(what, sizeof what, "sigmoid(v%d)", ia); break;
    case 7: x = em_relu(a), snprintf(what, sizeof what, "relu(v%d)", ia); break;
    case 8: {
      bool t = fz_pick(&r, 2);
      x = em_gelu(a, t), snprintf(what, sizeof what, "gelu(v%d, tanh=%d)", ia, t);
      break;
    }
    case 9: x = fz_pick(&r, 2) ? em_silu(a) : em_erf(a), snprintf(what, sizeof what, "silu or erf(v%d)", ia); break;
    case 10: { /* discontinuous: shifted off the points where rounding noise flips them (below) */
      static const char *const names[] = {"floor", "ceil", "sign", "round", "trunc", "frac"};
      int w = fz_pick(&r, 6);
      em_tensor *sa = em_add_scalar(a, FZ_SHIFT);
      x = w == 0 ? em_floor(sa) : w == 1 ? em_ceil(sa) : w == 2 ? em_sign(sa) : w == 3 ? em_round(sa)
        : w == 4 ? em_trunc(sa) : em_frac(sa);
      snprintf(what, sizeof what, "%s(v%d + %g)", names[w], ia, FZ_SHIFT);
      break;
    }
    case 11: x = em_add(a, b), snprintf(what, sizeof what, "add(v%d, v%d)", ia, ib); break;
    case 12: x = em_sub(a, b), snprintf(what, sizeof what, "sub(v%d, v%d)", ia, ib); break;
    case 13: x = em_mul(a, b), snprintf(what, sizeof what, "mul(v%d, v%d)", ia, ib); break;
    case 14: /* b kept off 0: atan2 turns at the origin, division blows up */
      if (fz_pick(&r, 2)) x = em_div(a, em_add_scalar(em_abs(b), 1)), snprintf(what, sizeof what, "div(v%d, abs(v%d) + 1)", ia, ib);
      else x = em_atan2(a, em_add_scalar(em_abs(b), 0.5)), snprintf(what, sizeof what, "atan2(v%d, abs(v%d) + 0.5)", ia, ib);
      break;
    case 15: {
      bool mx = fz_pick(&r, 2);
      x = mx ? em_maximum(a, b) : em_minimum(a, b), snprintf(what, sizeof what, "%s(v%d, v%d)", mx ? "maximum" : "minimum", ia, ib);
      break;
    }
    case 16: x = em_where(em_gt(a, em_add_scalar(b, FZ_SHIFT)), a, em_mul_scalar(b, 0.5)), snprintf(what, sizeof what, "where(v%d > v%d + %g, v%d, v%d * 0.5)", ia, ib, FZ_SHIFT, ia, ib); break;
    case 17: x = em_cast(em_lt(a, em_add_scalar(b, FZ_SHIFT)), fdt), snprintf(what, sizeof what, "cast(v%d < v%d + %g)", ia, ib, FZ_SHIFT); break;
    case 18: x = em_pow_scalar(em_add_scalar(em_abs(a), 0.5), k == 0 ? 2 : fabs(k)), snprintf(what, sizeof what, "pow(abs(v%d) + 0.5, %g)", ia, k == 0 ? 2 : fabs(k)); break;
    case 19: x = em_add_scalar(em_mul_scalar(a, k), -k), snprintf(what, sizeof what, "v%d * %g - %g", ia, k, k); break;
    case 20: x = em_clamp(a, -0.5, 0.75), snprintf(what, sizeof what, "clamp(v%d, -0.5, 0.75)", ia); break;
    case 21: { /* casts: through f64, or through an integer or bool (no gradient) */
      int w = fz_pick(&r, 3);
      em_dtype mid = w == 0 ? (fdt == EM_F64 ? EM_F32 : EM_F64) : w == 1 ? EM_I32 : EM_BOOL;
      x = em_cast(em_cast(em_add_scalar(em_mul_scalar(a, 3), FZ_SHIFT), mid), fdt);
      snprintf(what, sizeof what, "cast(cast(v%d * 3 + %g, %s), %s)", ia, FZ_SHIFT, em_dtype_name(mid), em_dtype_name(fdt));
      break;
    }
    case 22: case 23: case 24: { /* reductions over a random axis list, written as a user might */
      int64_t axes[EM_MAX_DIMS];
      int na = 0;
      for (int d = 0; d < nd; d++)
        if (fz_pick(&r, 2)) axes[na++] = fz_axis(&r, d, nd);
      for (int i = na - 1; i > 0; i--) { /* any order */
        int j = fz_pick(&r, i + 1);
        int64_t t = axes[i];
        axes[i] = axes[j], axes[j] = t;
      }
      int w = fz_pick(&r, 7);
      bool empty_ok = w == 0 || w == 1 || w == 4; /* sum, mean... of nothing: 0, nan, 1 */
      if (!full && !empty_ok) w = 0;
      static const char *names[] = {"sum", "mean", "amax(+ramp)", "amin(+ramp)", "prod", "logsumexp", "var"};
      if (w == 0) x = em_sum(a, na, axes, keep);
      else if (w == 1) x = em_mean(a, na, axes, keep);
      else if (w == 2 || w == 3) { /* a ramp of 1e-3 over the elements breaks near-ties, as for argmax: the
                                     * gradient goes to the maximum, and one decided by the last ulp
                                     * went elsewhere in eager and compiled (program 33960: pad's 0.5
                                     * against 0.5 - ((l - v) + v) / 2, gradients 0.6% apart) */
        em_tensor *rp = em_reshape_at(em_mul_scalar(em_arange(fdt, 0, (double)em_numel(a), 1), 1e-3), nd,
                                      em_sizes(a), EM_HERE);
        x = w == 2 ? em_amax(em_add(a, rp), na, axes, keep) : em_amin(em_add(a, rp), na, axes, keep);
      }
      else if (w == 4) x = em_prod(em_add_scalar(em_mul_scalar(em_tanh(a), 0.25), 1), na, axes, keep);
      else if (w == 5) x = em_logsumexp(a, na, axes, keep);
      else x = em_var(a, na, axes, 0, keep);
      size_t k2 = (size_t)snprintf(what, sizeof what, "%s(v%d, axes=[", names[w], ia);
      for (int i = 0; i < na && k2 < sizeof what; i++) k2 += (size_t)snprintf(what + k2, sizeof what - k2, i ? ",%lld" : "%lld", (long long)axes[i]);
      if (k2 < sizeof what) snprintf(what + k2, sizeof what - k2, "], keepdim=%d)", keep);
      break;
    }
    case 25:
      if (!nd || !full) goto fallback;
    { /* a ramp of 1e-3 along the axis breaks near-ties: values equal up to rounding (x + (1 - x))
       * made argmax pick by the last ulp, which eager's tanh and the generated one's decide apart
       * (program 17191: an index of 0 against 2); NaN and infinities keep their meaning */
      int d = (int)(ax0 < 0 ? ax0 + nd : ax0);
      int64_t rs[EM_MAX_DIMS];
      for (int i = 0; i < nd; i++) rs[i] = i == d ? em_size(a, i) : 1;
      em_tensor *ramp = em_reshape_at(em_mul_scalar(em_arange(fdt, 0, (double)em_size(a, d), 1), 1e-3), nd, rs, EM_HERE);
      x = em_cast(em_argmax(em_add(a, ramp), (int)ax0, keep), fdt);
      snprintf(what, sizeof what, "cast(argmax(v%d + 1e-3 * ramp, %lld, keepdim=%d))", ia, (long long)ax0, keep);
      break;
    }
    case 26: {
      if (!nd || !full) goto fallback;
      bool lg = fz_pick(&r, 2);
      x = lg ? em_log_softmax(a, (int)ax0) : em_softmax(a, (int)ax0);
      snprintf(what, sizeof what, "%s(v%d, %lld)", lg ? "log_softmax" : "softmax", ia, (long long)ax0);
      break;
    }
    case 27:
      if (!nd || !full) goto fallback;
      /* a ramp keeps rows from being constant: on a constant row layer_norm returns rounding
       * noise of the mean amplified by 1/sqrt(eps) (any value within that is right), which no
       * elementwise tolerance can judge */
      x = em_layer_norm(em_add(a, em_mul_scalar(em_arange(fdt, 0, (double)em_size(a, nd - 1), 1), 0.25)), 1, EM_NONE,
                        EM_NONE, 1e-5);
      snprintf(what, sizeof what, "layer_norm(v%d + 0.25 * arange(last dim), last dim)", ia);
      break;
    case 28:
      if (nd < 2) goto fallback;
      x = em_transpose(a, (int)ax0, (int)ax1), snprintf(what, sizeof what, "transpose(v%d, %lld, %lld)", ia, (long long)ax0, (long long)ax1);
      break;
    case 29: {
      if (nd < 2) goto fallback;
      int64_t perm[EM_MAX_DIMS];
      for (int d = 0; d < nd; d++) perm[d] = d;
      for (int i = nd - 1; i > 0; i--) {
        int j = fz_pick(&r, i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
      }
      for (int d = 0; d < nd; d++) perm[d] = fz_axis(&r, (int)perm[d], nd);
      x = em_permute(a, nd, perm);
      snprintf(what, sizeof what, "permute(v%d, [%lld, %lld, ...])", ia, (long long)perm[0], (long long)perm[1]);
      break;
    }
    case 30: {
      int64_t n0 = em_numel(a);
      if (n0 > 0 && n0 % 2 == 0 && fz_pick(&r, 2)) x = em_reshape(a, EM_SHAPE(2, -1)), snprintf(what, sizeof what, "reshape(v%d, [2, -1])", ia);
      else x = em_reshape(a, EM_SHAPE(-1)), snprintf(what, sizeof what, "reshape(v%d, [-1])", ia);
      break;
    }
    case 31: {
      if (!nd) goto fallback;
      int64_t s = em_size(a, d0), st = 1 + fz_pick(&r, 2), lo = s > 1 ? fz_pick(&r, 2) : 0;
      int64_t hi = fz_pick(&r, 2) ? s : s - (s > 1);
      x = em_slice(a, (int)ax0, lo, hi, st), snprintf(what, sizeof what, "slice(v%d, %lld, %lld:%lld:%lld)", ia, (long long)ax0, (long long)lo, (long long)hi, (long long)st);
      break;
    }
    case 32: {
      if (nd >= 3) goto fallback;
      int64_t sz[EM_MAX_DIMS] = {2 + fz_pick(&r, 2)};
      for (int d = 0; d < nd; d++) sz[d + 1] = em_size(a, d);
      x = em_expand(em_unsqueeze(a, 0), nd + 1, sz), snprintf(what, sizeof what, "expand(unsqueeze(v%d, 0), %lld x)", ia, (long long)sz[0]);
      break;
    }
    case 33: {
      if (nd >= 3) goto fallback;
      int u = fz_pick(&r, nd + 1);
      int64_t ua = fz_pick(&r, 2) ? u : u - nd - 1;
      x = em_unsqueeze(a, (int)ua), snprintf(what, sizeof what, "unsqueeze(v%d, %lld)", ia, (long long)ua);
      break;
    }
    case 34: {
      int64_t axes[EM_MAX_DIMS];
      int na = 0;
      for (int d = 0; d < nd; d++)
        if (em_size(a, d) == 1 && fz_pick(&r, 2)) axes[na++] = fz_axis(&r, d, nd);
      if (!na) goto fallback;
      x = em_squeeze(a, na, axes), snprintf(what, sizeof what, "squeeze(v%d, %d axes, first %lld)", ia, na, (long long)axes[0]);
      break;
    }
    case 35: {
      if (!nd) goto fallback;
      int64_t axes[2] = {ax0, ax1};
      int na = d0 == d1 ? 1 : 2;
      x = em_flip(em_mul_scalar(a, 1.5), na, axes), snprintf(what, sizeof what, "flip(v%d * 1.5, [%lld%s])", ia, (long long)ax0, na == 2 ? ", ..." : "");
      break;
    }
    case 36: {
      if (!nd) goto fallback;
      em_tensor *parts[2] = {a, em_sin(a)};
      x = em_cat(2, parts, (int)ax0), snprintf(what, sizeof what, "cat([v%d, sin(v%d)], %lld)", ia, ia, (long long)ax0);
      break;
    }
    case 37: {
      if (!nd) goto fallback;
      int64_t pads[2] = {fz_pick(&r, 3), fz_pick(&r, 2)};
      x = em_pad(a, 2, pads, k), snprintf(what, sizeof what, "pad(v%d, [%lld, %lld], %g)", ia, (long long)pads[0], (long long)pads[1], k);
      break;
    }
    case 38: {
      if (nd == 2) x = em_matmul(a, em_transpose(em_mul_scalar(a, 0.5), 0, 1)), snprintf(what, sizeof what, "matmul(v%d, v%d^T * 0.5)", ia, ia);
      else if (nd == 3) x = em_matmul(em_transpose(a, 1, 2), a), snprintf(what, sizeof what, "matmul(v%d^T, v%d) batched", ia, ia);
      else goto fallback;
      break;
    }
    case 39: { /* in place on a clone, then a read (autograd records no in-place ops: detached) */
      em_tensor *h = em_clone(em_detach(a));
      if (!h || !em_mul_(h, em_add_scalar(em_tanh(em_detach(b)), 1))) return -1;
      x = em_add_scalar(h, 0.25), snprintf(what, sizeof what, "h = clone(detach(v%d)); h *= tanh(detach(v%d)) + 1; h + 0.25", ia, ib);
      break;
    }
    case 40: { /* in place into a view of a clone */
      if (!nd || em_size(a, d0) < 2) goto fallback;
      em_tensor *h = em_clone(em_detach(a));
      em_tensor *v = em_slice(h, (int)ax0, 0, 1, 1);
      if (!h || !v || !em_add_scalar_(v, k)) return -1;
      x = h, snprintf(what, sizeof what, "h = clone(detach(v%d)); h[%lld: 0:1] += %g", ia, (long long)ax0, k);
      break;
    }
    case 41: {
      double pr = 0.25 * (1 + fz_pick(&r, 2));
      x = em_dropout(a, pr, true), snprintf(what, sizeof what, "dropout(v%d, %g)", ia, pr);
      break;
    }
    case 42: /* an explicit graph break, at most two a program */
      if (broke++ >= 2) goto fallback;
      em_graph_break();
      x = em_mul_scalar(a, 2), snprintf(what, sizeof what, "graph_break(); v%d * 2", ia);
      break;
    case 43: { /* a value read back from data and used as a scalar */
      if (broke++ >= 2) goto fallback;
      double v = em_item(em_mean(em_tanh(a), 0, NULL, false));
      if (isnan(v)) v = 0; /* the mean of nothing */
      x = em_add_scalar(b, v), snprintf(what, sizeof what, "v%d + item(mean(tanh(v%d)))", ib, ia);
      break;
    }
    default:
    fallback:
      x = em_mul_scalar(em_tanh(a), 1.25), snprintf(what, sizeof what, "tanh(v%d) * 1.25", ia);
      break;
    }
    if (!x) return -1;
    if (em_numel(x) > 2048) continue; /* keep programs small and fast */
    if (p->measure && em_numel(x) > 0 && em_dtype_of(x) != EM_BOOL) { /* eager run: the largest finite magnitude */
      em_tensor *fx = em_cast(x, EM_F64);
      em_tensor *finite = em_eq_scalar(em_sub(fx, fx), 0); /* inf - inf and NaN - NaN are NaN */
      int64_t all[EM_MAX_DIMS];
      for (int i = 0; i < em_ndim(fx); i++) all[i] = i;
      em_tensor *m = em_amax(em_where(finite, em_abs(fx), em_zeros(EM_F64, em_ndim(fx), em_sizes(fx))), em_ndim(fx), all, false);
      double v = m ? em_item(m) : 0;
      if (v > p->magnitude) p->magnitude = v;
    }
    pool[n++] = x;
    fz_fmt_shape(b0, sizeof b0, x);
    fz_log(p, "v%d = %s : %s", n - 1, what, b0);
  }
  /* outputs: the last value, and up to 3 others: pool values, an input, a view of one, a repeat */
  int n_out = 1 + fz_pick(&r, FZ_MAX_OUT);
  out[0] = pool[n - 1];
  fz_log(p, "return v%d", n - 1);
  for (int i = 1; i < n_out; i++) {
    int w = fz_pick(&r, 6), j = fz_pick(&r, n);
    if (w == 0) out[i] = in[fz_pick(&r, n_in)], fz_log(p, "return an input");
    else if (w == 1 && em_ndim(in[0]) >= 2) out[i] = em_transpose(in[0], 0, -1), fz_log(p, "return transpose(input 0)");
    else if (w == 2) out[i] = out[0], fz_log(p, "return v%d again", n - 1);
    else out[i] = pool[j], fz_log(p, "return v%d", j);
    if (!out[i]) return -1;
  }
  return n_out;
}

/* ---- inputs ---- */

typedef struct fz_inputs {
  int n;
  em_tensor *leaf[FZ_MAX_IN]; /* what gradients are taken against (require grad when floats) */
  em_tensor *in[FZ_MAX_IN];   /* views of the leaves: what the program gets */
} fz_inputs;

/* The program's inputs for data set `data`: shapes and layouts from the seed, values from the
 * seed and the data set. Owned by the current scope. truth: cast to f64. */
static bool fz_make_inputs(uint64_t seed, int data, bool truth, bool cuda, int grow, bool dense, fz_inputs *x) {
  fz_rng r = {seed * 104729 + 11};
  em_dtype dt = truth ? EM_F64 : fz_dtype(seed);
  x->n = 1 + fz_pick(&r, FZ_MAX_IN);
  static const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 0};
  for (int i = 0; i < x->n; i++) {
    int nd = fz_pick(&r, 4);
    int64_t s[EM_MAX_DIMS];
    for (int d = 0; d < nd; d++) s[d] = sizes[fz_pick(&r, fz_pick(&r, 12) ? 6 : 7)]; /* size 0: rarely */
    for (int d = 0; d < nd; d++) s[d] += s[d] >= 2 ? grow : 0;
    int layout = fz_pick(&r, 5); /* 0, 1: contiguous; 2: transposed; 3: strided; 4: expanded */
    if (dense) layout = 0;
    if (nd < 2 && layout == 2) layout = 0;
    if (nd < 1 && layout >= 3) layout = 0;
    em_manual_seed(seed * 31 + (uint64_t)data * 1000003 + (uint64_t)i);
    int64_t base[EM_MAX_DIMS];
    memcpy(base, s, sizeof(int64_t) * (size_t)nd);
    if (layout == 2) base[0] = s[1], base[1] = s[0];
    if (layout == 3) base[nd - 1] = 2 * s[nd - 1];
    if (layout == 4) base[nd - 1] = 1;
    em_tensor *leaf = em_randn(EM_F32, nd, base);
    if (!leaf) return false;
    leaf = em_cast(leaf, dt); /* the same values for the f32 program and its f64 truth */
    if (leaf && cuda) leaf = em_to(leaf, EM_CUDA); /* the same values on the device */
    bool rg = fz_pick(&r, 4) != 0; /* most inputs require grad, not all */
    if (!leaf || !em_requires_grad_(leaf, rg)) return false;
    em_tensor *v = leaf;
    if (i > 0 && fz_pick(&r, 5) == 0 && !dense) { /* a view overlapping an earlier input's storage */
      em_tensor *o = x->leaf[i - 1];
      x->leaf[i] = o;
      x->in[i] = em_ndim(o) >= 2 ? em_transpose(o, 0, 1) : em_ndim(o) == 1 && em_size(o, 0) > 1 ? em_slice(o, 0, 1, em_size(o, 0), 1) : o;
      if (!x->in[i]) return false;
      continue;
    }
    if (layout == 2) v = em_transpose(leaf, 0, 1);
    if (layout == 3) v = em_slice(leaf, nd - 1, 0, base[nd - 1], 2);
    if (layout == 4) v = em_expand(leaf, nd, s);
    if (!v) return false;
    x->leaf[i] = leaf, x->in[i] = v;
  }
  return true;
}

/* ---- the check ---- */

static em_outputs fz_model(void *ctx, em_tensor *const *in, int n_in) {
  em_outputs o = {0};
  int n = fz_build(in, n_in, o.t, ctx);
  o.n = n < 0 ? 0 : n;
  if (n < 0) o.n = 1, o.t[0] = NULL; /* an op failed: its error is recorded */
  return o;
}

/* A compiled configuration: backend, partitioner, and EMBER_INDUCTOR_REMAT=0 or not. */
typedef struct fz_config {
  const char *name, *backend, *partitioner;
  bool no_remat;
  bool cuda; /* inputs on the GPU; runs only with EMBER_FUZZ_CUDA=1 and a device (or the emulator) */
} fz_config;
static const fz_config fz_configs[] = {
    {"eager", "eager", NULL, false},
    {"aot_eager", "aot_eager", "default", false},
    {"aot_eager+min_cut", "aot_eager", "min_cut", false},
    {"inductor", "inductor", "min_cut", false},
    {"inductor+default", "inductor", "default", false},
    {"inductor+no_remat", "inductor", "min_cut", true},
    {"inductor@cuda", "inductor", "min_cut", false, true},
};
enum { FZ_CONFIGS = sizeof fz_configs / sizeof fz_configs[0] };
static int fz_cuda_checks; /* programs checked on the device (the CUDA configuration ran) */

/* What one run of a program produced: its outputs and the leaves' gradients, as f64 arrays. */
typedef struct fz_result {
  int n_out;
  int64_t numel[FZ_MAX_OUT + FZ_MAX_IN];
  double *v[FZ_MAX_OUT + FZ_MAX_IN]; /* outputs, then gradients (NULL: none) */
  bool exact_dtype64;                /* the program is f64 */
  double magnitude;                  /* eager runs: the largest finite magnitude of any value made */
} fz_result;

static void fz_result_free(fz_result *r) {
  for (int i = 0; i < FZ_MAX_OUT + FZ_MAX_IN; i++) free(r->v[i]), r->v[i] = NULL;
}

static bool fz_grab(em_tensor *t, fz_result *r, int slot) {
  int64_t n = em_numel(t);
  r->numel[slot] = n;
  r->v[slot] = malloc(sizeof(double) * (size_t)(n + 1));
  return r->v[slot] && em_to_buffer(t, EM_F64, r->v[slot], sizeof(double) * (size_t)n);
}

/* Runs program p on data set `data`, eagerly (c NULL) or through c; with backward, the gradients
 * of sum_i sum(out_i * w_i) (w_i from the seed) with respect to the leaves. err: why it failed. */
static bool fz_run(fz_program *p, em_compiled *c, int data, bool backward, fz_result *res, char *err, size_t cap) {
  memset(res, 0, sizeof *res);
  em_scope_begin();
  if (p->cuda) em_set_default_device(EM_CUDA); /* the program's own tensors too */
  fz_inputs x;
  bool ok = fz_make_inputs(p->seed, data, p->truth, p->cuda, p->grow, p->dense, &x);
  em_outputs o = {0};
  if (ok) {
    em_manual_seed(p->seed + 7); /* the program's random ops draw the same numbers every run */
    p->measure = !c, p->magnitude = 0;
    o = c ? em_call_n(c, p, x.n, x.in) : fz_model(p, x.in, x.n);
    p->measure = false;
    res->magnitude = p->magnitude;
    ok = o.n > 0;
    for (int i = 0; ok && i < o.n; i++) ok = o.t[i] != NULL;
  }
  res->n_out = o.n;
  for (int i = 0; ok && i < o.n; i++) ok = fz_grab(o.t[i], res, i);
  if (ok && backward) {
    em_tensor *ys[FZ_MAX_OUT], *ws[FZ_MAX_OUT], *gs[FZ_MAX_IN];
    int m = 0;
    for (int i = 0; i < o.n; i++) {
      if (!em_requires_grad(o.t[i])) continue;
      em_manual_seed(p->seed * 13 + (uint64_t)i);
      ys[m] = o.t[i];
      ws[m++] = em_cast(em_randn(EM_F32, em_ndim(o.t[i]), em_sizes(o.t[i])), em_dtype_of(o.t[i]));
    }
    em_tensor *leaves[FZ_MAX_IN];
    int nl = 0;
    for (int i = 0; i < x.n; i++) /* the leaves that require grad, once each */
      if (em_requires_grad(x.leaf[i]) && (i == 0 || x.leaf[i] != x.leaf[i - 1])) leaves[nl++] = x.leaf[i];
    if (m && nl) {
      ok = em_grad(m, ys, ws, nl, leaves, gs, false, false);
      for (int i = 0; ok && i < nl; i++) ok = fz_grab(gs[i], res, FZ_MAX_OUT + i);
    }
  }
  em_set_default_device(EM_CPU);
  if (!ok) snprintf(err, cap, "%s", em_last_error() ? em_last_error() : "failed without a message");
  em_clear_error();
  em_scope_end();
  return ok;
}

/* The first element of got that differs from want beyond tolerance (see the file comment), or
 * -1. truth (may be NULL): the f64 run's values. exact: bit for bit. */
static int64_t fz_first_difference(const double *got, const double *want, const double *truth, int64_t n, bool f64,
                                   bool exact, double global) {
  double scale = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(want[i]) && fabs(want[i]) > scale) scale = fabs(want[i]);
  double rtol = f64 ? 1e-12 : 1e-5, atol = f64 ? 1e-13 : 1e-6;
  double eager_err = 0; /* eager's worst error against the f64 run, over the whole tensor */
  for (int64_t i = 0; truth && i < n; i++)
    if (isfinite(truth[i]) && isfinite(want[i]) && fabs(want[i] - truth[i]) > eager_err) eager_err = fabs(want[i] - truth[i]);
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], w = want[i];
    if ((isnan(g) && isnan(w)) || g == w) continue;
    if (exact) return i;
    if (fabs(g - w) <= atol + rtol * (fabs(w) + scale)) continue;
    if (truth && isfinite(truth[i]) && isfinite(g) && fabs(g - truth[i]) <= 4 * eager_err + atol + rtol * global) continue;
    return i;
  }
  return -1;
}

/* Checks program `seed` under the configurations in mask (bit i: fz_configs[i]). Returns the
 * number of failures; each is described on out (NULL: silent). skipped: set when eager itself
 * rejected the program (counted apart: the generator's fault, or eager's, not the compiler's). */
static int fz_check(uint64_t seed, unsigned mask, FILE *out, bool *skipped) {
  const char *plant = getenv("EMBER_FUZZ_CRASH_SEED"); /* tests the harness: this program segfaults */
  if (plant && strtoull(plant, NULL, 10) == seed) raise(SIGSEGV);
  fz_program p = {.seed = seed, .n_ops = 4 + (int)(seed % 27)};
  bool backward = fz_backward(seed);
  char err[512];
  fz_result want[3];
  *skipped = false;
  for (int d = 0; d < 3; d++)
    if (!fz_run(&p, NULL, d, backward, &want[d], err, sizeof err)) {
      for (int e = 0; e <= d; e++) fz_result_free(&want[e]);
      if (out) fprintf(out, "program %llu: eager failed: %s\n", (unsigned long long)seed, err);
      *skipped = true;
      return 0;
    }
  fz_result truth[3] = {{0}};
  bool have_truth[3] = {0};
  bool f64 = fz_dtype(seed) == EM_F64;
  int failures = 0;
  for (int ci = 0; ci < FZ_CONFIGS; ci++) {
    if (!(mask & (1u << ci))) continue;
    const fz_config *cf = &fz_configs[ci];
    if (cf->cuda && !(getenv("EMBER_FUZZ_CUDA") && atoi(getenv("EMBER_FUZZ_CUDA")) && em_cuda_is_available())) continue;
    p.cuda = cf->cuda;
    fz_cuda_checks += cf->cuda;
    if (cf->no_remat) setenv("EMBER_INDUCTOR_REMAT", "0", 1);
    em_compiled *c = em_compile(fz_model, &(em_compile_options){.backend = cf->backend, .partitioner = cf->partitioner,
                                                               .name = "fuzz", .recompile_limit = 16});
    for (int d = 0; d < 3 && c; d++) { /* the trace, the validating second call, a replay */
      fz_result got;
      const char *bad = NULL;
      char where[160] = "";
      if (!fz_run(&p, c, d, backward, &got, err, sizeof err)) {
        bad = err;
      } else if (got.n_out != want[d].n_out) {
        bad = "a different number of outputs";
      } else {
        for (int s = 0; s < FZ_MAX_OUT + FZ_MAX_IN && !bad; s++) {
          if (!want[d].v[s] && !got.v[s]) continue;
          if (!want[d].v[s] || !got.v[s] || want[d].numel[s] != got.numel[s]) {
            bad = "a different shape or a missing gradient";
            snprintf(where, sizeof where, "%s %d", s < FZ_MAX_OUT ? "output" : "gradient", s < FZ_MAX_OUT ? s : s - FZ_MAX_OUT);
            break;
          }
          bool exact = !strcmp(cf->backend, "eager");
          /* the largest magnitude eager produced: outputs, gradients, and every value on the way
           * (a sum of a layer_norm's outputs cancels to ~0 and carries rounding of its terms) */
          double global = want[d].magnitude;
          for (int u = 0; u < FZ_MAX_OUT + FZ_MAX_IN; u++)
            for (int64_t i = 0; want[d].v[u] && i < want[d].numel[u]; i++)
              if (isfinite(want[d].v[u][i]) && fabs(want[d].v[u][i]) > global) global = fabs(want[d].v[u][i]);
          int64_t e = fz_first_difference(got.v[s], want[d].v[s], NULL, got.numel[s], f64, exact, global);
          if (e >= 0 && !exact && !f64) { /* conditioning: judge against the f64 run */
            if (!have_truth[d]) {
              fz_program t = p;
              t.truth = true, t.cuda = false;
              have_truth[d] = fz_run(&t, NULL, d, backward, &truth[d], err, sizeof err);
            }
            if (have_truth[d] && truth[d].v[s] && truth[d].numel[s] == got.numel[s])
              e = fz_first_difference(got.v[s], want[d].v[s], truth[d].v[s], got.numel[s], f64, false, global);
          }
          if (e >= 0) {
            bad = "values differ";
            snprintf(where, sizeof where, "%s %d element %lld: %.9g, eager %.9g%s", s < FZ_MAX_OUT ? "output" : "gradient",
                     s < FZ_MAX_OUT ? s : s - FZ_MAX_OUT, (long long)e, got.v[s][e], want[d].v[s][e],
                     have_truth[d] && truth[d].v[s] ? "" : "");
          }
        }
      }
      fz_result_free(&got);
      if (bad) {
        failures++;
        if (out) {
          fz_program t = {.seed = seed, .n_ops = p.n_ops, .cap = 1};
          em_scope_begin();
          fz_inputs x;
          if (fz_make_inputs(seed, 0, false, false, 0, false, &x)) fz_model(&t, x.in, x.n);
          em_clear_error();
          em_scope_end();
          fprintf(out, "program %llu, %s, call %d%s: %s%s%s\n%s", (unsigned long long)seed, cf->name, d + 1,
                  backward ? " (with backward)" : "", bad, where[0] ? ": " : "", where, t.text ? t.text : "");
          free(t.text);
        }
        break;
      }
    }
    em_compiled_free(c);
    p.cuda = false;
    if (cf->no_remat) unsetenv("EMBER_INDUCTOR_REMAT");
  }
  for (int d = 0; d < 3; d++) fz_result_free(&want[d]), fz_result_free(&truth[d]);
  return failures;
}

/* Dynamic shapes: program `seed` called through one compiled function at its sizes, then with
 * every input size >= 2 grown by 3, by 5, by 3 again (a replay) and back, with new data each
 * call: under the eager backend with EM_DYNAMIC_ALWAYS (symbolic from the first call, bit for
 * bit) and under the inductor with EM_DYNAMIC_AUTO (a static entry, then a dynamic one, within
 * tolerance). The program's op choices follow the sizes, so where they change with them the
 * probes must notice and specialize; either way every result must be eager's at that size.
 * Returns the number of failures, described on out. */
static int64_t fz_dynamic_entries; /* dynamic entries fz_check_dynamic's compiled functions made */
__attribute__((unused)) static int fz_check_dynamic(uint64_t seed, FILE *out, bool *skipped) {
  static const int grows[] = {0, 3, 5, 3, 0};
  enum { NG = sizeof grows / sizeof grows[0] };
  fz_program p = {.seed = seed, .n_ops = 4 + (int)(seed % 27), .dense = true};
  bool backward = fz_backward(seed), f64 = fz_dtype(seed) == EM_F64;
  char err[512];
  fz_result want[NG];
  *skipped = false;
  for (int d = 0; d < NG; d++) {
    p.grow = grows[d];
    if (!fz_run(&p, NULL, d % 3, backward, &want[d], err, sizeof err)) {
      for (int e = 0; e < d; e++) fz_result_free(&want[e]);
      if (out) fprintf(out, "program %llu (sizes +%d): eager failed: %s\n", (unsigned long long)seed, grows[d], err);
      *skipped = true;
      return 0;
    }
  }
  int failures = 0;
  for (int ci = 0; ci < 2; ci++) {
    const char *backend = ci ? "inductor" : "eager";
    em_compiled *c = em_compile(fz_model, &(em_compile_options){.backend = backend, .name = "fuzz_dyn", .recompile_limit = 16,
                                                               .dynamic = ci ? EM_DYNAMIC_AUTO : EM_DYNAMIC_ALWAYS});
    for (int d = 0; d < NG && c; d++) {
      p.grow = grows[d];
      fz_result got;
      const char *bad = NULL;
      char where[160] = "";
      if (!fz_run(&p, c, d % 3, backward, &got, err, sizeof err)) bad = err;
      else if (got.n_out != want[d].n_out) bad = "a different number of outputs";
      for (int s = 0; s < FZ_MAX_OUT + FZ_MAX_IN && !bad; s++) {
        if (!want[d].v[s] && !got.v[s]) continue;
        if (!want[d].v[s] || !got.v[s] || want[d].numel[s] != got.numel[s]) {
          bad = "a different shape or a missing gradient";
          break;
        }
        double global = want[d].magnitude; /* as fz_check */
        for (int u = 0; u < FZ_MAX_OUT + FZ_MAX_IN; u++)
          for (int64_t i = 0; want[d].v[u] && i < want[d].numel[u]; i++)
            if (isfinite(want[d].v[u][i]) && fabs(want[d].v[u][i]) > global) global = fabs(want[d].v[u][i]);
        int64_t e = fz_first_difference(got.v[s], want[d].v[s], NULL, got.numel[s], f64, !ci, global);
        if (e >= 0 && ci && !f64) { /* conditioning: judge against the f64 run */
          fz_program t = p;
          t.truth = true;
          fz_result tr;
          if (fz_run(&t, NULL, d % 3, backward, &tr, err, sizeof err) && tr.v[s] && tr.numel[s] == got.numel[s])
            e = fz_first_difference(got.v[s], want[d].v[s], tr.v[s], got.numel[s], f64, false, global);
          fz_result_free(&tr);
        }
        if (e >= 0) {
          bad = "values differ";
          snprintf(where, sizeof where, "%s %d element %lld: %.9g, eager %.9g", s < FZ_MAX_OUT ? "output" : "gradient",
                   s < FZ_MAX_OUT ? s : s - FZ_MAX_OUT, (long long)e, got.v[s][e], want[d].v[s][e]);
        }
      }
      fz_result_free(&got);
      if (bad) {
        failures++;
        if (out) {
          fz_program t = {.seed = seed, .n_ops = p.n_ops, .cap = 1, .grow = grows[d]};
          em_scope_begin();
          fz_inputs x;
          if (fz_make_inputs(seed, 0, false, false, grows[d], true, &x)) fz_model(&t, x.in, x.n);
          em_clear_error();
          em_scope_end();
          fprintf(out, "program %llu, %s with dynamic shapes, call %d (sizes +%d)%s: %s%s%s\n%s", (unsigned long long)seed,
                  backend, d + 1, grows[d], backward ? " (with backward)" : "", bad, where[0] ? ": " : "", where,
                  t.text ? t.text : "");
          free(t.text);
        }
        break;
      }
    }
    if (c) fz_dynamic_entries += em_compiled_stats(c).dynamic_entries;
    em_compiled_free(c);
  }
  for (int d = 0; d < NG; d++) fz_result_free(&want[d]);
  return failures;
}

#endif
