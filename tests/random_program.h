/* tests/random_program.h: the seeded random-program generator of the differential tests: a
 * random DAG of public ops over f32 values, chosen from metadata only, so an eager run and a
 * traced run of the same seed make the same choices. */
#ifndef EMBER_TEST_RANDOM_PROGRAM_H
#define EMBER_TEST_RANDOM_PROGRAM_H

#include <ember.h>


typedef struct rng {
  uint64_t s;
} rng;
static uint32_t next(rng *r) {
  r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(r->s >> 33);
}
static int pick(rng *r, int n) { return (int)(next(r) % (uint32_t)n); }

typedef struct program {
  uint64_t seed;
  int n_ops;
} program;

static bool same_shape(em_tensor *a, em_tensor *b) {
  if (em_ndim(a) != em_ndim(b)) return false;
  for (int i = 0; i < em_ndim(a); i++)
    if (em_size(a, i) != em_size(b, i)) return false;
  return true;
}

/* A random DAG of ops over a pool of f32 values, chosen from metadata only, so the eager run
 * and the traced run make the same choices. Returns the number of outputs (the last 3). */
static int random_program(em_tensor *const *in, em_tensor **out, void *ctx) {
  const program *p = ctx;
  rng r = {p->seed};
  em_tensor *pool[96];
  int n = 0;
  for (int i = 0; i < 3; i++) pool[n++] = in[i];
  for (int step = 0; step < p->n_ops && n < 96; step++) {
    em_tensor *a = pool[n - 1 - pick(&r, n < 6 ? n : 6)]; /* favour recent values: deeper DAGs */
    em_tensor *b = a;
    for (int tries = 0; tries < 4; tries++) { /* a partner that broadcasts with a */
      em_tensor *c = pool[pick(&r, n)];
      if (same_shape(c, a) || em_ndim(c) == 0) {
        b = c;
        break;
      }
    }
    int nd = em_ndim(a);
    int ax = nd ? pick(&r, nd) : 0;
    em_tensor *x = NULL;
    switch (pick(&r, 26)) {
    case 0: x = em_neg(a); break;
    case 1: x = em_exp(em_tanh(a)); break;
    case 2: x = em_log(em_abs(a)); break;
    case 3: x = em_sqrt(em_abs(a)); break;
    case 4: x = em_sin(a); break;
    case 5: x = em_add(a, b); break;
    case 6: x = em_sub(a, b); break;
    case 7: x = em_mul(a, b); break;
    case 8: x = em_div(a, em_add_scalar(em_abs(b), 1)); break;
    case 9: x = em_maximum(a, b); break;
    case 10: x = em_where(em_gt(a, b), a, em_mul_scalar(b, 0.5)); break;
    case 11: x = nd ? em_sum(a, 1, (int64_t[]){ax}, pick(&r, 2)) : em_neg(a); break;
    case 12: x = nd ? em_amax(a, 1, (int64_t[]){ax}, true) : em_exp(a); break;
    case 13: x = nd ? em_softmax(a, ax) : em_sigmoid(a); break;
    case 14: x = nd >= 2 ? em_transpose(a, 0, nd - 1) : em_unsqueeze(a, 0); break;
    case 15: x = em_reshape(a, 1, (int64_t[]){em_numel(a)}); break;
    case 16: x = nd && em_size(a, ax) > 1 ? em_slice(a, ax, 1, em_size(a, ax), 1) : em_relu(a); break;
    case 17: x = nd ? em_cat(2, ((em_tensor *[]){a, a}), ax) : em_add_scalar(a, 1); break;
    case 18: x = nd == 2 ? em_matmul(a, em_transpose(a, 0, 1)) : em_gelu(a, false); break;
    case 19: x = nd ? em_flip(a, 1, (int64_t[]){ax}) : em_cos(a); break;
    case 20: x = em_cast(em_cast(a, EM_F64), EM_F32); break;
    case 21: x = nd ? em_log_softmax(a, ax) : em_erf(a); break;
    case 22: x = em_mul_scalar(em_add_scalar(a, 1), 1.0); break;
    case 23: {
      if (nd >= 4) {
        x = em_neg(a);
        break;
      }
      int64_t sz[EM_MAX_DIMS] = {2};
      for (int d = 0; d < nd; d++) sz[d + 1] = em_size(a, d);
      x = em_expand(em_unsqueeze(a, 0), nd + 1, sz);
      break;
    }
    case 24: x = nd && em_numel(a) > 0 ? em_mean(a, 1, (int64_t[]){ax}, false) : em_abs(a); break;
    case 25: x = nd ? em_pad(a, 2, (int64_t[]){1, 0}, 0.0) : em_neg(a); break;
    }
    if (!x) return -1;
    if (em_numel(x) > 4096) continue; /* keep programs small and fast */
    pool[n++] = x;
  }
  for (int i = 0; i < 3; i++) out[i] = pool[n - 3 + i];
  return 3;
}

/* Program i of a run: its inputs (seeded f32: two [a, b] and a [b] or a scalar) and its size. */
static inline program random_program_setup(long i, em_tensor **in) {
  rng r = {(uint64_t)i * 7919 + 1};
  int64_t a = 1 + pick(&r, 9), b = 1 + pick(&r, 19);
  em_manual_seed((uint64_t)i);
  in[0] = em_randn(EM_F32, EM_SHAPE(a, b)), in[1] = em_randn(EM_F32, EM_SHAPE(a, b));
  in[2] = pick(&r, 2) ? em_randn(EM_F32, 0, NULL) : em_randn(EM_F32, EM_SHAPE(b));
  return (program){(uint64_t)i, 6 + (int)(i % 19)};
}

#endif
