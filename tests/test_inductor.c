/* tests/test_inductor.c: the CPU code generator against eager execution: fused pointwise
 * kernels on odd shapes (0, 1, primes, not multiples of the 8 vector lanes), on transposed,
 * sliced and expanded inputs, fusion counts, and the random-program generator on 1000 programs.
 *
 * Tolerances: add, sub, mul, div, sqrt, comparisons, where and conversions are bit-identical to
 * eager; exp, log, tanh, sin, cos, erf, log1p and expm1 run SLEEF's u10 functions (1 ULP) where
 * eager may run libm on the same element, so f32 results agree within 1e-5 relative + 1e-6
 * absolute after chains of them. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include "random_program.h"
#include "../runtime/rt.h"
#include "../ir/graph.h"
#include "../inductor/inductor.h"

static bool refuse_break(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) {
  return false;
}

typedef int (*builder_fn)(em_tensor *const *in, em_tensor **out, void *ctx);

/* Traces build on in, compiles the graph with the inductor, runs it; compares every output with
 * the eager run of build. Returns the number of outputs that were bit-identical. */
static int check(builder_fn build, em_tensor *const *in, void *ctx, ind_stats *st, const char *what) {
  em_scope_begin();
  em_tensor *want[64], *got[64], *gin[16];
  int n = build(in, want, ctx);
  cr_assert_gt(n, 0, "%s: %s", what, em_last_error() ? em_last_error() : "");
  rt_trace tr;
  cr_assert(rt_trace_begin(&tr, "t", refuse_break, NULL, EM_HERE));
  em_scope_begin();
  em_tensor *outs[64];
  cr_assert_eq(build(in, outs, ctx), n);
  for (int i = 0; i < n; i++) cr_assert(ir_add_output(tr.g, rt_trace_value_of(&tr, outs[i])));
  ir_graph *g = ir_graph_clone(tr.g);
  for (int i = 0; i < tr.n_lifted; i++) gin[i] = tr.lifted[i];
  int n_in = tr.n_lifted;
  em_scope_end();
  rt_trace_end(&tr);
  cr_assert(ir_graph_compact(g, NULL, NULL));
  char err[512];
  ind_program *p = ind_compile(g, gin, st, err, sizeof err);
  cr_assert_not_null(p, "%s: %s", what, err);
  cr_assert(ind_run(p, gin, n_in, got, NULL, EM_HERE), "%s: %s", what, em_last_error() ? em_last_error() : "");
  int exact = 0;
  for (int i = 0; i < n; i++) {
    em_tensor *w = want[i], *o = rt_scope_add(got[i], "test", EM_HERE);
    cr_assert_eq(em_numel(o), em_numel(w), "%s: output %d size", what, i);
    int64_t m = em_numel(w);
    double *x = malloc(sizeof(double) * (size_t)(m + 1)), *y = malloc(sizeof(double) * (size_t)(m + 1));
    cr_assert(em_to_buffer(o, EM_F64, x, sizeof(double) * (size_t)m) && em_to_buffer(w, EM_F64, y, sizeof(double) * (size_t)m));
    bool same = true;
    for (int64_t e = 0; e < m; e++) {
      bool ok = (isnan(x[e]) && isnan(y[e])) || x[e] == y[e] || fabs(x[e] - y[e]) <= 1e-6 + 1e-5 * fabs(y[e]);
      same = same && ((isnan(x[e]) && isnan(y[e])) || x[e] == y[e]);
      if (!ok) {
        double xe = x[e], ye = y[e];
        free(x), free(y);
        char *t = ir_print(g, false);
        cr_assert_fail("%s: output %d element %lld is %.9g, eager %.9g\n%s", what, i, (long long)e, xe, ye, t);
      }
    }
    exact += same;
    free(x), free(y);
  }
  ind_free(p);
  ir_graph_free(g);
  em_scope_end();
  return exact;
}

/* A chain of pointwise ops over x (any layout) and a broadcast row b. */
static int chain(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0], *b = in[1];
  em_tensor *h = em_add(em_mul_scalar(x, 1.5), b);       /* broadcast row */
  h = em_where(em_gt_scalar(h, 0), em_exp(em_neg(h)), em_tanh(h));
  h = em_maximum(em_sqrt(em_abs(h)), em_div(h, em_add_scalar(em_abs(b), 1)));
  out[0] = h;
  out[1] = em_lt(h, b);                                   /* a bool output */
  return 2;
}

ETEST(inductor, odd_shapes_and_layouts) {
  int64_t rows[] = {0, 1, 3, 7, 13}, cols[] = {0, 1, 5, 8, 13, 67};
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
      for (int layout = 0; layout < 3; layout++) {
        em_scope_begin();
        em_manual_seed(r * 100 + c);
        int64_t R = rows[r], C = cols[c];
        em_tensor *x;
        if (layout == 0) x = em_randn(EM_F32, EM_SHAPE(R, C));
        else if (layout == 1) x = em_transpose(em_randn(EM_F32, EM_SHAPE(C, R)), 0, 1);   /* strided */
        else x = em_slice(em_randn(EM_F32, EM_SHAPE(R, C + 3)), 1, 2, C + 2, 1);          /* sliced rows */
        em_tensor *b = em_randn(EM_F32, EM_SHAPE(C));
        char what[64];
        snprintf(what, sizeof what, "[%lld,%lld] layout %d", (long long)R, (long long)C, layout);
        ind_stats st;
        check(chain, (em_tensor *[]){x, b}, NULL, &st, what);
        /* runs of same-shape pointwise nodes fuse: [R,C] ops, then the [C] abs(b)+1, then [R,C] again */
        cr_assert_eq(st.kernels, 3, "%s: %d kernels", what, st.kernels);
        cr_assert_geq(st.fused_nodes, 14, "%s", what);
        em_scope_end();
      }
}

static int arithmetic(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0], *y = in[1];
  out[0] = em_sub(em_mul(em_add(x, y), em_div(x, em_add_scalar(em_abs(y), 0.5))), em_sqrt(em_abs(x)));
  out[1] = em_where(em_logical_and(em_ge(x, y), em_ne(x, em_neg(y))), em_minimum(x, y), em_maximum(x, y));
  out[2] = em_cast(em_cast(em_le(x, y), EM_F32), EM_F32);
  return 3;
}

ETEST(inductor, large_kernels_split_across_threads) {
  int64_t shapes[3][2] = {{1, 100003}, {5, 30011}, {70001, 1}};
  for (int i = 0; i < 3; i++) {
    em_scope_begin();
    em_manual_seed(70 + i);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(shapes[i][0], shapes[i][1]));
    em_tensor *b = em_randn(EM_F32, EM_SHAPE(shapes[i][1]));
    ind_stats st;
    check(chain, (em_tensor *[]){x, b}, NULL, &st, "large");
    check(arithmetic, (em_tensor *[]){x, em_neg(x)}, NULL, &st, "large arithmetic");
    em_scope_end();
  }
}

ETEST(inductor, exact_ops_are_bit_identical) {
  em_manual_seed(3);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(37, 29)), *y = em_randn(EM_F32, EM_SHAPE(37, 29));
  ind_stats st;
  int exact = check(arithmetic, (em_tensor *[]){x, y}, NULL, &st, "arithmetic");
  cr_assert_eq(exact, 3, "add, mul, div, sqrt, max, min, where, comparisons and conversions match eager bit for bit");
}

static int softmax_and_norm(em_tensor *const *in, em_tensor **out, void *ctx) {
  out[0] = em_softmax(in[0], -1);
  out[1] = em_layer_norm(in[0], 1, in[1], EM_NONE, 1e-5);
  out[2] = em_gelu(in[0], false);
  return 3;
}

ETEST(inductor, composites_with_reductions) {
  em_manual_seed(4);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(33, 70)), *w = em_randn(EM_F32, EM_SHAPE(70));
  ind_stats st;
  check(softmax_and_norm, (em_tensor *[]){x, w}, NULL, &st, "softmax, layer_norm, gelu");
  cr_log_info("softmax + layer_norm + gelu: %d kernels holding %d nodes, %d nodes eager", st.kernels, st.fused_nodes,
              st.fallback_nodes);
  cr_assert_gt(st.kernels, 0);
}

ETEST(inductor, random_programs) {
  const char *env = getenv("EMBER_RANDOM_PROGRAMS");
  long n = env ? atol(env) : 1000, exact = 0, outputs = 0, kernels = 0, fused = 0;
  for (long i = 0; i < n; i++) {
    em_scope_begin();
    rng r = {(uint64_t)i * 7919 + 1};
    int64_t a = 1 + pick(&r, 9), b = 1 + pick(&r, 19);
    em_manual_seed((uint64_t)i);
    em_tensor *in[3] = {em_randn(EM_F32, EM_SHAPE(a, b)), em_randn(EM_F32, EM_SHAPE(a, b)),
                        pick(&r, 2) ? em_randn(EM_F32, 0, NULL) : em_randn(EM_F32, EM_SHAPE(b))};
    program p = {(uint64_t)i, 6 + (int)(i % 19)};
    ind_stats st;
    char what[32];
    snprintf(what, sizeof what, "program %ld", i);
    exact += check(random_program, in, &p, &st, what);
    outputs += 3;
    kernels += st.kernels, fused += st.fused_nodes;
    em_scope_end();
  }
  cr_log_info("%ld programs: %ld kernels holding %ld nodes; %ld of %ld outputs bit-identical to eager", n, kernels, fused,
              exact, outputs);
  cr_assert_gt(kernels, n / 2, "the programs exercise the code generator");
}

/* ---- backend "inductor" in em_compile: forward and backward graphs as generated kernels ---- */

#include "../bench/models.h"

ETEST(inductor, backend_trains_like_eager) {
  em_manual_seed(9);
  net m = {0};
  models_gelu_ln_mlp(&m, 40, 32, 24, 10);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(16, 40)), *y = em_randint(0, 10, EM_SHAPE(16));
  em_tensor *le = gelu_ln_mlp_fn(&m, (em_tensor *[]){x, y}, 2).t[0], *ge[16], *gc[16];
  cr_assert(em_grad(1, &le, NULL, m.n_params, m.params, ge, false, false));
  em_compiled *c = em_compile(gelu_ln_mlp_fn, &(em_compile_options){.backend = "inductor", .name = "ind"});
  int64_t runs0 = ind_kernel_runs();
  for (int call = 0; call < 2; call++) {
    em_tensor *lc = em_call(c, &m, x, y).t[0];
    cr_assert(lc && em_grad(1, &lc, NULL, m.n_params, m.params, gc, false, false), "%s", em_last_error());
    cr_assert(fabs(em_item(lc) - em_item(le)) <= 1e-5 * fabs(em_item(le)), "loss %.9g, eager %.9g", em_item(lc), em_item(le));
    for (int i = 0; i < m.n_params; i++) {
      double d = em_item(em_amax(em_abs(em_sub(gc[i], ge[i])), 0, NULL, false));
      double s = em_item(em_amax(em_abs(ge[i]), 0, NULL, false));
      cr_assert_leq(d, 1e-5 * s + 1e-6, "parameter %d: gradient differs by %g (scale %g)", i, d, s);
    }
  }
  cr_assert_eq(em_compiled_stats(c).aot_graphs, 1);
  cr_assert_gt(ind_kernel_runs() - runs0, 10, "the forward and backward graphs ran as generated kernels");
  em_compiled_free(c);
}
