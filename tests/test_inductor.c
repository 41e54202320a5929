/* tests/test_inductor.c: the CPU code generator against eager execution: fused pointwise and
 * reduction kernels on odd shapes (0, 1, primes, not multiples of the vector lanes), on
 * transposed, sliced and expanded inputs, fusion counts, the random-program generator on 1000
 * programs; then the default backend end to end (composites and gradients, whole training steps
 * updated in place, fallback, layouts, the arena, the disk cache across processes).
 *
 * Tolerances: add, sub, mul, div, sqrt, comparisons, where and conversions are bit-identical to
 * eager (f32 exp too: SLEEF's algorithm inline); log, sin, cos, log1p and expm1 run SLEEF's u10
 * functions (1 ULP) where eager may run libm on the same element, f32 tanh and erf inline rational
 * functions (7 ULP, 4.2e-7 of eager at most); reductions sum in another order. So an output agrees
 * within 1e-5 of each element plus 1e-5 of the output's largest magnitude (a sum's rounding
 * scales with its terms, not with its result: 6000 random programs found one sum of
 * log-softmax values at 1.05e-5 relative), plus 1e-6. Random programs chain reductions and
 * differences whose conditioning no fixed tolerance covers (20,000 found a log-softmax of sums
 * where eager f32 is off by 1.1e-5 and the kernels by 1.9e-5 of an f64 run's 0.144): there an
 * element also passes when its error against the program run in f64 is at most 4x eager's. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

/* <elf.h> defines EM_NONE and EM_CUDA (machine numbers 0 and 190) over ember.h's; only its
 * Elf64 types are used here, so its two macros go and ember.h's EM_NONE comes back. */
#include <elf.h>
#include <float.h>
#undef EM_NONE
#undef EM_CUDA
#define EM_NONE (&em_none_sentinel)
#ifdef EMBER_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#include <llvm-c/Core.h>
#include <llvm-c/Disassembler.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/blake3.h>

#include "random_program.h"
#include "composites.h"
#include "../runtime/rt.h"
#include "../ir/graph.h"
#include "../inductor/inductor.h"

static bool refuse_break(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) {
  return false;
}

typedef int (*builder_fn)(em_tensor *const *in, em_tensor **out, void *ctx);

/* build(in, ctx) traced into a compacted graph (the caller frees it) whose outputs are build's;
 * the graph's inputs (the tracer's lifted tensors, at most 16) in gin, their count in *n_in. */
static ir_graph *trace_graph(builder_fn build, em_tensor *const *in, void *ctx, em_tensor **gin, int *n_in) {
  rt_trace tr;
  cr_assert(rt_trace_begin(&tr, "t", refuse_break, NULL, EM_HERE));
  em_scope_begin();
  em_tensor *o[64];
  int n = build(in, o, ctx);
  cr_assert_gt(n, 0, "%s", em_last_error() ? em_last_error() : "no outputs");
  for (int i = 0; i < n; i++) cr_assert(ir_add_output(tr.g, rt_trace_value_of(&tr, o[i])));
  ir_graph *g = ir_graph_clone(tr.g);
  cr_assert_leq(tr.n_lifted, 16);
  *n_in = tr.n_lifted;
  for (int i = 0; i < tr.n_lifted; i++) gin[i] = tr.lifted[i];
  em_scope_end();
  rt_trace_end(&tr);
  cr_assert(ir_graph_compact(g, NULL, NULL));
  return g;
}

/* Traces build on in, compiles the graph with the inductor, runs it; compares every output with
 * the eager run of build. Returns the number of outputs that were bit-identical. */
static int check_against(builder_fn build, em_tensor *const *in, void *ctx, ind_stats *st, const char *what, bool f64_truth);
/* The same with outputs held to eager within rel of each element plus rel / 1000 of the output's
 * largest magnitude (f64 programs: 1e-12); rel 0 takes check_against's f32 tolerance. */
static int check_within(builder_fn build, em_tensor *const *in, void *ctx, ind_stats *st, const char *what,
                        bool f64_truth, double rel);

/* The options check_within compiles with (NULL: the defaults). */
static const ind_options *check_opts;

static int check(builder_fn build, em_tensor *const *in, void *ctx, ind_stats *st, const char *what) {
  return check_against(build, in, ctx, st, what, false);
}

/* With f64_truth, build also runs on the inputs cast to f64, and an output element passes when
 * the generated code's error against that is at most 4 times eager's (+ 1e-6): ill-conditioned
 * chains (sums then differences) lose digits in both. */
static int check_against(builder_fn build, em_tensor *const *in, void *ctx, ind_stats *st, const char *what, bool f64_truth) {
  return check_within(build, in, ctx, st, what, f64_truth, 0);
}

static int check_within(builder_fn build, em_tensor *const *in, void *ctx, ind_stats *st, const char *what,
                        bool f64_truth, double rel) {
  em_scope_begin();
  em_tensor *want[64], *got[64], *gin[16], *truth[64] = {0};
  int n = build(in, want, ctx);
  if (f64_truth) {
    em_tensor *in64[16];
    for (int i = 0; i < 3; i++) in64[i] = em_dtype_of(in[i]) == EM_F32 ? em_cast(in[i], EM_F64) : in[i];
    cr_assert_eq(build(in64, truth, ctx), n);
  }
  cr_assert_gt(n, 0, "%s: %s", what, em_last_error() ? em_last_error() : "");
  int n_in;
  ir_graph *g = trace_graph(build, in, ctx, gin, &n_in);
  cr_assert_eq((int)g->n_outputs, n);
  char err[512];
  ind_program *p = ind_compile_opts(g, gin, check_opts, st, err, sizeof err);
  cr_assert_not_null(p, "%s: %s", what, err);
  cr_assert(ind_run(p, gin, n_in, got, NULL, EM_HERE), "%s: %s", what, em_last_error() ? em_last_error() : "");
  int exact = 0;
  for (int i = 0; i < n; i++) {
    em_tensor *w = want[i], *o = rt_scope_add(got[i], "test", EM_HERE);
    cr_assert_eq(em_numel(o), em_numel(w), "%s: output %d size", what, i);
    int64_t m = em_numel(w);
    double *x = malloc(sizeof(double) * (size_t)(m + 1)), *y = malloc(sizeof(double) * (size_t)(m + 1));
    cr_assert(em_to_buffer(o, EM_F64, x, sizeof(double) * (size_t)m) && em_to_buffer(w, EM_F64, y, sizeof(double) * (size_t)m));
    double *t = truth[i] ? malloc(sizeof(double) * (size_t)(m + 1)) : NULL;
    if (t) cr_assert(em_to_buffer(truth[i], EM_F64, t, sizeof(double) * (size_t)m));
    bool same = true;
    double scale = 0;
    for (int64_t e = 0; e < m; e++)
      if (isfinite(y[e]) && fabs(y[e]) > scale) scale = fabs(y[e]);
    for (int64_t e = 0; e < m; e++) {
      bool ok = (isnan(x[e]) && isnan(y[e])) || x[e] == y[e] ||
                (rel > 0 ? fabs(x[e] - y[e]) <= rel * (fabs(y[e]) + 1e-3 * scale)
                         : fabs(x[e] - y[e]) <= 1e-6 + 1e-5 * (fabs(y[e]) + scale));
      if (!ok && t && isfinite(t[e])) ok = fabs(x[e] - t[e]) <= 4 * fabs(y[e] - t[e]) + 1e-6;
      same = same && ((isnan(x[e]) && isnan(y[e])) || x[e] == y[e]);
      if (!ok) {
        double xe = x[e], ye = y[e];
        free(x), free(y);
        double te = t ? t[e] : NAN;
        free(t);
        char *text = ir_print(g, false);
        cr_assert_fail("%s: output %d element %lld is %.9g, eager %.9g (f64 %.9g)\n%s\nschedule:\n%s", what, i, (long long)e, xe, ye,
                       te, text, ind_schedule(p) ? ind_schedule(p) : "");
      }
    }
    exact += same;
    free(x), free(y), free(t);
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

/* An [R, C] input of dtype dt laid out one of four ways: contiguous, transposed, a slice of
 * wider rows, a column expanded across the rows. */
static em_tensor *laid_out(em_dtype dt, int64_t R, int64_t C, int layout) {
  if (layout == 0) return em_randn(dt, EM_SHAPE(R, C));
  if (layout == 1) return em_transpose(em_randn(dt, EM_SHAPE(C, R)), 0, 1);
  if (layout == 2) return em_slice(em_randn(dt, EM_SHAPE(R, C + 3)), 1, 2, C + 2, 1);
  return em_expand(em_randn(dt, EM_SHAPE(R, 1)), 2, (int64_t[]){R, C});
}

ETEST(inductor, odd_shapes_and_layouts) {
  int64_t rows[] = {0, 1, 3, 7, 13}, cols[] = {0, 1, 5, 8, 13, 67};
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
      for (int layout = 0; layout < 3; layout++) {
        em_scope_begin();
        em_manual_seed(r * 100 + c);
        int64_t R = rows[r], C = cols[c];
        em_tensor *x = laid_out(EM_F32, R, C, layout); /* contiguous, strided, sliced rows */
        em_tensor *b = em_randn(EM_F32, EM_SHAPE(C));
        char what[64];
        snprintf(what, sizeof what, "[%lld,%lld] layout %d", (long long)R, (long long)C, layout);
        ind_stats st;
        check(chain, (em_tensor *[]){x, b}, NULL, &st, what);
        /* runs of same-shape pointwise nodes fuse: [R,C] ops, then the [C] abs(b)+1, then [R,C] again;
         * a [1] abs(b)+1 is scalar work, scheduled first (rewrite.c: hoist_scalars): one [R,C] kernel
         * (when the [R,C] values have more than one element, else all of it is scalar work) */
        cr_assert_eq(st.kernels, C == 1 && R > 1 ? 2 : 3, "%s: %d kernels", what, st.kernels);
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

/* One composite per ctx value, as the kernels a model's forward and backward need. */
static int one_composite(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0], *w = in[1];
  switch (*(int *)ctx) {
  case 0: out[0] = em_softmax(x, -1); break;
  case 1: out[0] = em_log_softmax(x, -1); break;
  case 2: out[0] = em_layer_norm(x, 1, w, in[3], 1e-5); break;
  case 3: out[0] = em_cross_entropy(x, in[2], EM_CROSS_ENTROPY_DEFAULT); break;
  case 4: out[0] = em_sum(em_mul(x, x), 1, (int64_t[]){0}, false); break;       /* a column reduction */
  default: out[0] = em_amax(em_exp(x), 1, (int64_t[]){0}, true); break;
  }
  return 1;
}

/* A renderer that is the LLVM one without tanh and without column reductions. */
static bool renders_no_tanh(const ir_graph *g, const ir_node *n) {
  return n->op != EM_PRIM_TANH && ind_llvm_renderer.renders(g, n);
}

/* The scheduler and the rewriter reach the target only through its ind_renderer (renderer.c):
 * a renderer that lacks tanh gets tanh as an op-by-op step between two kernels, and one without
 * column reductions gets the column sum as a step, with eager's results either way. */
ETEST(inductor, the_schedule_follows_the_renderer) {
  em_manual_seed(11);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(13, 67)), *b = em_randn(EM_F32, EM_SHAPE(67)), *w = em_randn(EM_F32, EM_SHAPE(67));
  ind_stats full, less;
  check(chain, (em_tensor *[]){x, b}, NULL, &full, "llvm renderer");
  ind_renderer r = ind_llvm_renderer;
  r.renders = renders_no_tanh;
  r.column_reductions = false;
  ind_options o = {.renderer = &r};
  check_opts = &o;
  check(chain, (em_tensor *[]){x, b}, NULL, &less, "renderer without tanh");
  int col = 4;
  ind_stats cfull, cless;
  check(one_composite, (em_tensor *[]){x, w, NULL, NULL}, &col, &cless, "renderer without column reductions");
  check_opts = NULL;
  check(one_composite, (em_tensor *[]){x, w, NULL, NULL}, &col, &cfull, "column reduction");
  cr_assert_eq(less.fallback_nodes, full.fallback_nodes + 1, "tanh alone runs op by op: %d steps against %d",
               less.fallback_nodes, full.fallback_nodes);
  cr_assert_eq(less.fused_nodes, full.fused_nodes - 1);
  cr_assert_eq(cless.fallback_nodes, cfull.fallback_nodes + 1, "the column sum runs op by op: %d steps against %d",
               cless.fallback_nodes, cfull.fallback_nodes);
  cr_assert_str_eq(ind_renderer_for(EM_CPU)->name, "llvm");
  cr_assert_str_eq(ind_renderer_for(EM_CUDA)->name, "cuda");
}

/* Row reductions fuse with their prologue and epilogue into one kernel over rows (softmax,
 * log_softmax, layer_norm), column reductions into the pointwise kernel that feeds them; odd
 * sizes, strided and sliced inputs. Sums run in another order than eager's: 1e-5 relative. */
ETEST(inductor, fused_reductions_on_odd_shapes_and_layouts) {
  int64_t rows[] = {1, 3, 13, 64}, cols[] = {1, 5, 17, 67, 1024};
  static const char *names[] = {"softmax", "log_softmax", "layer_norm", "cross_entropy", "sum(x*x, 0)", "amax(exp(x), 0)"};
  for (int which = 0; which < 6; which++)
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
      for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
        for (int layout = 0; layout < 3; layout++) {
          em_scope_begin();
          em_manual_seed(r * 100 + c);
          int64_t R = rows[r], C = cols[c];
          em_tensor *x = laid_out(EM_F32, R, C, layout);
          em_tensor *in[4] = {x, em_randn(EM_F32, EM_SHAPE(C)), em_randint(0, C, EM_SHAPE(R)), em_randn(EM_F32, EM_SHAPE(C))};
          char what[96];
          snprintf(what, sizeof what, "%s of [%lld,%lld] layout %d", names[which], (long long)R, (long long)C, layout);
          ind_stats st;
          check(one_composite, in, &which, &st, what);
          if (layout == 0 && which != 3 && C > 1)
            cr_assert_eq(st.kernels, 1, "%s: %d kernels (%d nodes eager)", what, st.kernels, st.fallback_nodes);
          em_scope_end();
        }
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
    em_tensor *in[3];
    program p = random_program_setup(i, in);
    ind_stats st;
    char what[32];
    snprintf(what, sizeof what, "program %ld", i);
    exact += check_against(random_program, in, &p, &st, what, true);
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

/* ---- the default backend end to end: in-place updates, fallback, the kernel cache ---- */

/* max |a - b| <= tol * max |b| + tol, elementwise over the whole tensors */
static void expect_close(em_tensor *got, em_tensor *want, double tol, const char *what, int which) {
  double d = em_item(em_amax(em_abs(em_sub(em_cast(got, EM_F64), em_cast(want, EM_F64))), 0, NULL, false));
  double s = em_item(em_amax(em_abs(em_cast(want, EM_F64)), 0, NULL, false));
  cr_assert_leq(d, tol * s + tol, "%s %d: differs from eager by %g (scale %g)", what, which, d, s);
}

/* Every composite through the default backend, forward and gradient (AOT forward and backward
 * graphs as generated kernels), against eager within 1e-5. */
ETEST(inductor, every_composite_and_its_gradient_within_tolerance) {
  em_manual_seed(3);
  em_tensor *x = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(5, 6)), true);
  em_tensor *w = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(6)), true);
  em_tensor *t = em_randint(0, 6, EM_SHAPE(5));
  int64_t runs = 0;
  for (composite = 0; composite < N_COMPOSITES; composite++) {
    em_scope_begin();
    em_compiled *c = em_compile(apply_composite, NULL);
    em_tensor *in[3] = {x, w, t};
    em_tensor *want = apply_composite(NULL, in, 3).t[0];
    for (int call = 0; call < 2; call++) {
      em_tensor *got = em_call_n(c, NULL, 3, in).t[0];
      cr_assert_not_null(got, "composite %d: %s", composite, em_last_error() ? em_last_error() : "");
      expect_close(got, want, 1e-5, "composite", composite);
      if (!em_requires_grad(want)) continue;
      em_tensor *seed = em_ones(EM_F32, em_ndim(want), em_sizes(want));
      em_tensor *ge[2], *gc[2];
      cr_assert(em_grad(1, &want, &seed, 2, ((em_tensor *[]){x, w}), ge, true, false));
      cr_assert(em_grad(1, &got, &seed, 2, ((em_tensor *[]){x, w}), gc, false, false), "%s", em_last_error());
      for (int i = 0; i < 2; i++)
        if (ge[i]) expect_close(gc[i], ge[i], 1e-5, "gradient of composite", composite);
    }
    cr_assert_eq(em_compiled_stats(c).inductor_fallbacks, 0, "composite %d", composite);
    runs += em_compiled_stats(c).kernel_runs;
    em_compiled_free(c);
    em_scope_end();
  }
  cr_assert_gt(runs, N_COMPOSITES, "the composites ran as generated kernels");
}

typedef struct trainer {
  em_model_fn loss_fn;
  net m;
  em_optimizer *opt;
} trainer;

/* A whole training step: loss, backward, SGD update. */
static em_outputs train_step(void *ctx, em_tensor *const *in, int n) {
  trainer *t = ctx;
  em_tensor *loss = t->loss_fn(&t->m, in, n).t[0];
  em_optimizer_zero_grad(t->opt);
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(t->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

/* Trains two copies of a model made by setup (same seed), one eagerly and one with its whole
 * step compiled by the default backend (SGD with momentum: the parameters and momentum buffers
 * updated in place by the kernels); every step's loss and, at the end, every parameter agree
 * within 1e-4 of their scale. */
static void compiled_training_matches_eager(em_model_fn loss_fn, void (*setup)(net *), em_tensor *x, em_tensor *y,
                                            int steps, uint64_t seed) {
  trainer t[2];
  for (int k = 0; k < 2; k++) {
    em_manual_seed(seed);
    memset(&t[k], 0, sizeof t[k]);
    t[k].loss_fn = loss_fn;
    setup(&t[k].m);
    t[k].opt = em_sgd_new(t[k].m.n_params, t[k].m.params, ((em_sgd_opts){0.05, 0.9, 0, 0, false}));
  }
  em_compiled *c = em_compile(train_step, &(em_compile_options){.name = "train_step"});
  for (int step = 0; step < steps; step++) {
    em_scope_begin();
    double le = em_item(train_step(&t[0], (em_tensor *[]){x, y}, 2).t[0]);
    em_tensor *lc = em_call(c, &t[1], x, y).t[0];
    cr_assert(lc, "%s", em_last_error());
    cr_assert(fabs(em_item(lc) - le) <= 1e-4 * fabs(le), "step %d: loss %.9g, eager %.9g", step, em_item(lc), le);
    em_scope_end();
  }
  for (int i = 0; i < t[0].m.n_params; i++) expect_close(t[1].m.params[i], t[0].m.params[i], 1e-4, "parameter", i);
  em_compile_stats st = em_compiled_stats(c);
  cr_assert_gt(st.replays + st.checks, steps - 3, "the step replays");
  cr_assert_gt(st.kernel_runs, 10);
  cr_assert_eq(st.inductor_fallbacks, 0);
  em_compiled_free(c);
  for (int k = 0; k < 2; k++) em_optimizer_free(t[k].opt);
}

static void small_gelu_ln_mlp(net *m) { models_gelu_ln_mlp(m, 40, 32, 24, 10); }

ETEST(inductor, whole_training_step_updates_in_place_like_eager) {
  compiled_training_matches_eager(gelu_ln_mlp_fn, small_gelu_ln_mlp, em_randn(EM_F32, EM_SHAPE(16, 40)),
                                  em_randint(0, 10, EM_SHAPE(16)), 6, 21);
}

static em_outputs transformer_loss(void *ctx, em_tensor *const *in, int n) { return transformer_fn(ctx, in, n); }

/* The decoder-only transformer (small sizes): tied embeddings (a parameter read as an embedding
 * table and, transposed, as the LM head), sliced weights, attention, layer norms, GELU. */
ETEST(inductor, transformer_training_step_like_eager) {
  compiled_training_matches_eager(transformer_loss, models_transformer, em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)),
                                  em_randint(0, VOCAB, EM_SHAPE(BATCH, CTX)), 4, 31);
}

/* Writes the caller makes after reading: an input updated in place whose old value is read
 * after the update, a view of it returned, a second input aliasing nothing. Values as eager. */
static em_outputs update_and_read(void *ctx, em_tensor *const *in, int n) {
  em_tensor **w = ctx;
  em_tensor *before = em_mul_scalar(w[0], 3);         /* reads w before the update */
  em_sub_(w[0], em_mul_scalar(in[0], 0.5));            /* w -= x / 2, in place */
  em_add_(w[1], in[0]);                                /* a second buffer */
  em_tensor *after = em_add(w[0], before);             /* reads w after the update */
  return EM_OUTPUTS(after, em_transpose(w[1], 0, 1));  /* a view of an updated tensor */
}

ETEST(inductor, in_place_updates_keep_eager_semantics) {
  em_manual_seed(5);
  em_tensor *w[2][2], *x = em_randn(EM_F32, EM_SHAPE(37, 19));
  for (int k = 0; k < 2; k++) {
    em_manual_seed(6);
    w[k][0] = em_keep(em_randn(EM_F32, EM_SHAPE(37, 19)));
    w[k][1] = em_keep(em_randn(EM_F32, EM_SHAPE(37, 19)));
  }
  em_compiled *c = em_compile(update_and_read, NULL);
  for (int call = 0; call < 3; call++) {
    em_scope_begin();
    em_outputs e = update_and_read(w[0], &x, 1), o = em_call(c, w[1], x);
    cr_assert(o.t[0] && o.t[1], "%s", em_last_error());
    for (int i = 0; i < 2; i++) EXPECT_SAME_BITS(o.t[i], e.t[i], "an output");
    for (int i = 0; i < 2; i++) EXPECT_SAME_BITS(w[1][i], w[0][i], "an updated input");
    em_scope_end();
  }
  cr_assert_gt(em_compiled_stats(c).kernel_runs, 0);
  em_compiled_free(c);
}

/* A graph the inductor cannot compile runs op by op: the results are eager's, and the fallback
 * is counted (and logged). */
ETEST(inductor, a_failed_compile_falls_back_op_by_op) {
  em_manual_seed(8);
  net m = {0};
  models_gelu_ln_mlp(&m, 12, 10, 8, 4);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(6, 12)), *y = em_randint(0, 4, EM_SHAPE(6));
  ind_debug_fail("injected failure");
  em_no_grad_begin();
  em_compiled *c = em_compile(gelu_ln_mlp_fn, NULL);
  em_tensor *want = gelu_ln_mlp_fn(&m, (em_tensor *[]){x, y}, 2).t[0], *got = em_call(c, &m, x, y).t[0];
  em_no_grad_end();
  ind_debug_fail(NULL);
  cr_assert(got, "%s", em_last_error());
  EXPECT_SAME_BITS(got, want, "fallback");
  cr_assert_eq(em_compiled_stats(c).inductor_fallbacks, 1);
  cr_assert_eq(em_compiled_stats(c).kernel_runs, 0);
  em_compiled_free(c);
}

/* A chain of pointwise kernels separated by products: each intermediate dies two steps after it
 * is made, so the arena reuses its bytes. */
static int chain_of_products(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *h = in[0];
  for (int i = 0; i < 8; i++) h = em_matmul(em_tanh(em_mul_scalar(h, 0.5)), in[1]);
  out[0] = h;
  return 1;
}

ETEST(inductor, the_arena_reuses_dead_intermediates) {
  em_manual_seed(13);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(64, 64)), *w = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(64, 64)), 0.1);
  ind_stats st;
  check(chain_of_products, (em_tensor *[]){x, w}, NULL, &st, "chain of products");
  /* trace again to look at the plan itself */
  em_tensor *gin[16];
  int n_in;
  ir_graph *g = trace_graph(chain_of_products, (em_tensor *[]){x, w}, NULL, gin, &n_in);
  char err[256];
  ind_program *p = ind_compile(g, gin, &st, err, sizeof err);
  cr_assert_not_null(p, "%s", err);
  int64_t one = 64 * 64 * 4;
  cr_assert_eq(st.kernels, 8, "one kernel per pointwise pair");
  cr_assert_leq(ind_arena_bytes(p), 2 * one, "8 intermediates of %lld bytes share an arena of %lld", (long long)one,
                (long long)ind_arena_bytes(p));
  cr_assert_geq(ind_arena_bytes(p), one);
  cr_assert_leq(ind_planned_peak(p), 3 * one);
  ind_free(p);
  ir_graph_free(g);
}

/* t = tanh(h / 2) of a GEMM's output h is read again after a second GEMM: with one large leaf
 * (h, in memory anyway) it is recomputed there. With two (h + x), it is stored. */
static int read_after_gemm(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *h = em_matmul(in[0], in[1]);
  em_tensor *t = ctx ? em_add(h, in[0]) : em_tanh(em_mul_scalar(h, 0.5));
  em_tensor *a = em_matmul(em_mul(t, h), in[1]);
  out[0] = em_add(a, t);
  return 1;
}

static ind_program *compile_traced(builder_fn build, em_tensor *const *in, int n_in, void *ctx, ind_stats *st, ir_graph **g) {
  em_tensor *gin[16];
  int lifted;
  *g = trace_graph(build, in, ctx, gin, &lifted);
  cr_assert_eq(lifted, n_in);
  char err[256];
  ind_program *p = ind_compile(*g, gin, st, err, sizeof err);
  cr_assert_not_null(p, "%s", err);
  return p;
}

/* The printed schedule of build's program (the caller frees it). */
static char *traced_schedule(builder_fn build, em_tensor *const *in, int n_in) {
  ind_stats st;
  ir_graph *g;
  ind_program *p = compile_traced(build, in, n_in, NULL, &st, &g);
  char *text = strdup(ind_schedule(p));
  ind_free(p);
  ir_graph_free(g);
  return text;
}

ETEST(inductor, cheap_values_read_after_a_gemm_are_recomputed) {
  em_manual_seed(17);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(64, 48)), *w = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(48, 48)), 0.2);
  ind_stats st;
  check(read_after_gemm, (em_tensor *[]){x, w}, NULL, &st, "tanh read after a GEMM");
  cr_assert_geq(st.recomputed_nodes, 2, "mul and tanh recomputed after the second GEMM (%d nodes)", st.recomputed_nodes);
  ir_graph *g;
  ind_program *p = compile_traced(read_after_gemm, (em_tensor *[]){x, w}, 2, NULL, &st, &g);
  const char *sched = ind_schedule(p);
  const char *k0 = strstr(sched, "pointwise kernel");
  cr_assert_not_null(k0, "%s", sched);
  const char *eol = strchr(k0, '\n');
  cr_assert(strstr(k0, " 1 out") && strstr(k0, " 1 out") < eol, "the kernel before the second GEMM stores t*h only:\n%s", sched);
  int64_t peak = ind_planned_peak(p);
  ind_free(p);
  ir_graph_free(g);
  setenv("EMBER_INDUCTOR_REMAT", "0", 1);
  p = compile_traced(read_after_gemm, (em_tensor *[]){x, w}, 2, NULL, &st, &g);
  unsetenv("EMBER_INDUCTOR_REMAT");
  cr_assert_eq(st.recomputed_nodes, 0);
  cr_assert_eq(ind_planned_peak(p), peak + 64 * 48 * 4, "storing t costs its bytes: %lld against %lld",
               (long long)ind_planned_peak(p), (long long)peak);
  ind_free(p);
  ir_graph_free(g);
  check(read_after_gemm, (em_tensor *[]){x, w}, "two leaves", &st, "h + x read after a GEMM");
  cr_assert_eq(st.recomputed_nodes, 0, "h + x has two large leaves: stored, not recomputed");
}

/* A weight used through disjoint row slices (Q, K, V of one matrix): its gradient, as the
 * engine sums slice_scatter(zeros, g_i), becomes one cat; with a row left unused (a gap), the
 * sum stays. */
static int sliced_weight_grad(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *w = in[1];
  int64_t rows = em_size(w, 0), cut = ctx ? rows - 1 : rows;
  em_tensor *loss = NULL;
  for (int64_t at = 0; at < cut; at += 3) {
    int64_t stop = at + 3 < cut ? at + 3 : cut;
    em_tensor *y = em_tanh(em_matmul(in[0], em_transpose(em_slice(w, 0, at, stop, 1), 0, 1)));
    em_tensor *s = em_sum(em_mul_scalar(y, (double)(at + 1)), 0, NULL, false);
    loss = loss ? em_add(loss, s) : s;
  }
  em_grad(1, &loss, NULL, 1, &w, &out[0], false, false);
  return 1;
}

static int twice_sliced_weight_grad(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *w = in[1], *loss = NULL;
  const int64_t from[] = {0, 3, 0}, to[] = {3, 9, 3};
  for (int k = 0; k < 3; k++) {
    em_tensor *y = em_tanh(em_matmul(in[0], em_transpose(em_slice(w, 0, from[k], to[k], 1), 0, 1)));
    em_tensor *s = em_sum(em_mul_scalar(y, k + 1.5), 0, NULL, false);
    loss = loss ? em_add(loss, s) : s;
  }
  em_grad(1, &loss, NULL, 1, &w, &out[0], false, false);
  return 1;
}

ETEST(inductor, sums_of_slice_scatters_become_one_cat) {
  em_manual_seed(19);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(16, 8)), *w = em_requires_grad_(em_randn(EM_F32, EM_SHAPE(9, 8)), true);
  ind_stats st;
  check(sliced_weight_grad, (em_tensor *[]){x, w}, NULL, &st, "three slices tiling the weight");
  cr_assert_eq(st.scatter_sums, 1, "one sum of slice scatters made a cat (%d)", st.scatter_sums);
  char *sched = traced_schedule(sliced_weight_grad, (em_tensor *[]){x, w}, 2);
  cr_assert(strstr(sched, "= cat") && !strstr(sched, "slice_scatter"), "%s", sched);
  free(sched);
  check(sliced_weight_grad, (em_tensor *[]){x, w}, "gap", &st, "slices leaving the last row out");
  cr_assert_eq(st.scatter_sums, 0, "a gap keeps the sum");
  /* rows [0, 3) used through two slices, [3, 9) through one: the two terms of the same rows add
   * (in the sum's association) and the groups concatenate */
  check(twice_sliced_weight_grad, (em_tensor *[]){x, w}, NULL, &st, "two slices of the same rows");
  cr_assert_eq(st.scatter_sums, 1, "one sum of slice scatters made a cat (%d)", st.scatter_sums);
}

/* Max-pooling and its gradient: max_pool2d is a select chain over strided slices (torch's
 * routing of the gradient to the first maximum), fused into pointwise kernels. A window amax
 * written as one (a reshape to [N, C, H/2, 2, W/2, 2] and an amax over the window axes) becomes
 * pointwise maxima of strided slices, and its backward's kernels gather their broadcast
 * operands instead of running 2-lane vectors. */
static int pool_and_grad(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0];
  out[0] = em_max_pool2d(x, 2, 2, 2, 2, 0, 0);
  em_tensor *loss = em_sum(em_mul(out[0], in[1]), 0, NULL, false);
  em_grad(1, &loss, NULL, 1, &x, &out[1], false, false);
  return 2;
}

static int window_amax_and_grad(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0];
  int64_t n = em_size(x, 0), c = em_size(x, 1), h = em_size(x, 2) / 2, w = em_size(x, 3) / 2;
  out[0] = em_amax(em_reshape(x, 6, (int64_t[]){n, c, h, 2, w, 2}), 2, (int64_t[]){3, 5}, false);
  em_tensor *loss = em_sum(em_mul(out[0], in[1]), 0, NULL, false);
  em_grad(1, &loss, NULL, 1, &x, &out[1], false, false);
  return 2;
}

ETEST(inductor, max_pooling_becomes_pointwise_and_its_gradient_gathers) {
  em_manual_seed(23);
  /* ties: rounded values make equal maxima inside windows, which share the gradient */
  em_tensor *x = em_requires_grad_(em_floor(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(5, 3, 14, 18)), 2)), true);
  em_tensor *w = em_randn(EM_F32, EM_SHAPE(5, 3, 7, 9));
  ind_stats st;
  int exact = check(pool_and_grad, (em_tensor *[]){x, w}, NULL, &st, "max_pool2d and its gradient");
  cr_assert_geq(exact, 2, "the pooled values are exact maxima, the gradient exact sums");
  /* the gradient's four strided slice scatters (one per window element) interleave as cats */
  cr_assert_geq(st.scatter_sums, 1, "the window's slice scatters became cats (%d)", st.scatter_sums);
  char *sched = traced_schedule(pool_and_grad, (em_tensor *[]){x, w}, 2);
  cr_assert(strstr(sched, "where") && !strstr(sched, "= amax"), "%s", sched);
  cr_assert(!strstr(sched, "slice_scatter") && strstr(sched, "= cat"), "%s", sched);
  free(sched);
  /* odd sizes: the strided slices leave the last row and column out, so they do not tile */
  em_tensor *xo = em_requires_grad_(em_floor(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(2, 3, 15, 9)), 2)), true);
  check(pool_and_grad, (em_tensor *[]){xo, em_randn(EM_F32, EM_SHAPE(2, 3, 7, 4))}, NULL, &st, "odd-sized max_pool2d");
  cr_assert_eq(st.scatter_sums, 0, "strided slices that leave elements out stay slice scatters");
  exact = check(window_amax_and_grad, (em_tensor *[]){x, w}, NULL, &st, "a window amax and its gradient");
  cr_assert_geq(exact, 1, "the window maxima are exact");
  cr_assert_geq(st.window_reductions, 1, "the window amax became pointwise (%d)", st.window_reductions);
  sched = traced_schedule(window_amax_and_grad, (em_tensor *[]){x, w}, 2);
  cr_assert(strstr(sched, "maximum") && !strstr(sched, "= amax"), "%s", sched);
  cr_assert(strstr(sched, "= gather in"), "a backward kernel gathers:\n%s", sched);
  free(sched);
}

/* A sum over every dim (a loss, a checksum) splits into row sums, which join the row kernel
 * that makes their operand, and a sum of those: no eager pass over the softmax's output. */
static int softmax_total(em_tensor *const *in, em_tensor **out, void *ctx) {
  out[0] = em_sum(em_softmax(in[0], 1), 0, NULL, false);
  out[1] = em_sum(em_exp(in[0]), 0, NULL, true);
  return 2;
}

ETEST(inductor, a_sum_of_everything_joins_the_row_kernel) {
  em_manual_seed(29);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(300, 257));
  ind_stats st;
  check(softmax_total, (em_tensor *[]){x}, NULL, &st, "sum of a softmax, sum of exp");
  char *sched = traced_schedule(softmax_total, (em_tensor *[]){x}, 1);
  cr_assert(!strstr(sched, "= sum (eager kernel)"), "no eager sum left:\n%s", sched);
  cr_assert(strstr(sched, "div sum)"), "the row sums join the softmax kernel:\n%s", sched);
  free(sched);
}

/* x / x.sum(1) per row: a row kernel whose division has the same divisor at every column. */
static int over_row_sum(em_tensor *const *in, em_tensor **out, void *ctx) {
  out[0] = em_div(in[0], em_sum(in[0], 1, (int64_t[]){1}, true));
  return 1;
}

/* The row kernel multiplies by the divisor's reciprocal only in rows where that is a normal
 * number; rows whose sums are subnormal (1/s overflows to inf), huge (1/s is subnormal and loses
 * bits), zero, infinite or NaN divide as eager does, bit for bit. Without the per-row branch the
 * subnormal row gives inf and the huge rows differ from eager in their last bits. 37 columns:
 * vector body and scalar tail. */
ETEST(inductor, division_by_a_row_sum_multiplies_only_where_the_reciprocal_is_normal) {
  enum { C = 37 };
  char *sched = traced_schedule(over_row_sum, (em_tensor *[]){em_ones(EM_F32, EM_SHAPE(2, C))}, 1);
  cr_assert(strstr(sched, "where normal)"), "the division multiplies by a per-row reciprocal:\n%s", sched);
  free(sched);
  ind_stats st;
  em_manual_seed(31);
  check(over_row_sum, (em_tensor *[]){em_add_scalar(em_rand(EM_F32, EM_SHAPE(64, C)), 0.5)}, NULL, &st, "normal sums");
  for (int dt = 0; dt < 2; dt++) {
    bool f64 = dt == 1;
    /* per row: element scale, and whether one element is replaced by z */
    /* powers of two times small integers: every sum is exact in any order, so eager's divisor is
     * the kernel's; the sums: 143 tiny (subnormal), 143 huge (past 2^126, 2^1022), 286 huge (inf) */
    const double tiny = f64 ? 0x1p-1070 : 0x1p-145, huge = f64 ? 0x1p1016 : 0x1p120;
    const double scale[] = {tiny, tiny * 3, huge, huge * 2, 0, 1, 1, 1};
    const double z[] = {0, 0, 0, 0, 0, INFINITY, -INFINITY, NAN};
    enum { R = sizeof scale / sizeof *scale };
    double v[R][C];
    for (int r = 0; r < R; r++)
      for (int c = 0; c < C; c++) v[r][c] = r >= 5 && c == 3 ? z[r] : scale[r] * (1 + c % 7);
    em_tensor *x = em_cast(em_from_data(v, EM_F64, 2, (int64_t[]){R, C}), f64 ? EM_F64 : EM_F32);
    cr_assert_eq(check(over_row_sum, (em_tensor *[]){x}, NULL, &st, f64 ? "f64 rows that divide" : "f32 rows that divide"), 1,
                 "%s: rows whose reciprocal is not normal divide, bit for bit", f64 ? "f64" : "f32");
  }
}

static em_outputs scaled_softmax(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_softmax(em_mul_scalar(in[0], 0.5), 1));
}

/* The same graph met with another input layout (a transposed view) gets its own program. */
ETEST(inductor, each_input_layout_gets_its_own_program) {
  em_manual_seed(12);
  em_tensor *a = em_randn(EM_F32, EM_SHAPE(33, 40)), *b = em_transpose(em_randn(EM_F32, EM_SHAPE(40, 33)), 0, 1);
  em_no_grad_begin();
  em_compiled *c = em_compile(scaled_softmax, NULL);
  for (int call = 0; call < 4; call++) {
    em_tensor *x = call % 2 ? b : a;
    int64_t runs = em_compiled_stats(c).kernel_runs;
    em_tensor *got = em_call(c, NULL, x).t[0];
    cr_assert(got, "%s", em_last_error());
    expect_close(got, scaled_softmax(NULL, &x, 1).t[0], 1e-5, "call", call);
    cr_assert_gt(em_compiled_stats(c).kernel_runs, runs, "call %d ran generated kernels", call);
  }
  cr_assert_eq(em_compiled_stats(c).inductor_fallbacks, 0);
  em_no_grad_end();
  em_compiled_free(c);
}

/* Runs the cache probe n times at once with EMBER_CACHE_DIR=dir; each prints its counters. */
static void probe(const char *dir, int n, long counts[][4]) {
  const char *exe = getenv("EMBER_CACHE_PROBE");
  cr_assert(exe, "EMBER_CACHE_PROBE names tests/cache_probe (meson sets it)");
  FILE *f[8];
  for (int i = 0; i < n; i++) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "EMBER_CACHE_DIR='%s' '%s'", dir, exe);
    cr_assert((f[i] = popen(cmd, "r")));
  }
  for (int i = 0; i < n; i++) {
    int got = fscanf(f[i], "%ld %ld %ld %ld", &counts[i][0], &counts[i][1], &counts[i][2], &counts[i][3]);
    cr_assert_eq(pclose(f[i]), 0, "probe %d failed", i);
    cr_assert_eq(got, 4);
    cr_assert_eq(counts[i][3], 1, "probe %d: result differs from eager", i);
  }
}

/* The one file in dir ending in .o other than `not` (NULL: any); path into out. */
static void cache_file(const char *dir, const char *not, char *out, size_t cap) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "ls '%s'/*.o", dir);
  FILE *f = popen(cmd, "r");
  cr_assert(f);
  out[0] = 0;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (!not || strcmp(line, not)) snprintf(out, cap, "%s", line);
  }
  pclose(f);
  cr_assert(out[0], "a cache file in %s", dir);
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  cr_assert(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  rewind(f);
  char *b = malloc(*n);
  cr_assert(b && fread(b, 1, *n, f) == *n);
  fclose(f);
  return b;
}

/* Issue 17: a cache entry whose checksum is right but whose object is another module's (its
 * header and key kept, the object and its BLAKE3 sum taken from a second entry) loaded, lacked
 * the kernels, and the graph ran op by op on every call. It must be refused, compiled again and
 * replaced. The header is 56 bytes: magic, format, reserved, size, key, sum. */
static void forge_entry(const char *victim, const char *donor) {
  size_t nv, nd;
  char *v = slurp(victim, &nv), *d = slurp(donor, &nd);
  enum { HEAD = 56 };
  cr_assert(nv > HEAD && nd > HEAD);
  uint64_t size = nd - HEAD;
  memcpy(v + 16, &size, 8);
  llvm_blake3_hasher h;
  llvm_blake3_hasher_init(&h);
  llvm_blake3_hasher_update(&h, d + HEAD, size);
  llvm_blake3_hasher_finalize(&h, (uint8_t *)v + 40, 16);
  FILE *f = fopen(victim, "wb");
  cr_assert(f && fwrite(v, 1, HEAD, f) == HEAD && fwrite(d + HEAD, 1, size, f) == size);
  fclose(f);
  free(v), free(d);
}

/* The entry's checksum made right again for its (damaged) object. */
static void rehash_entry(char *e, size_t n) {
  llvm_blake3_hasher h;
  llvm_blake3_hasher_init(&h);
  llvm_blake3_hasher_update(&h, e + 56, n - 56);
  llvm_blake3_hasher_finalize(&h, (uint8_t *)e + 40, 16);
}

/* Issue 17 (fuzz/fuzz_kcache): an object under a valid checksum whose last symbol's name lies
 * past the end of the string table; LLVM's object reader ended the process ("LLVM ERROR:
 * st_name ... is past the end of the string table"). */
static void damage_symbol_name(const char *path) {
  size_t n;
  char *e = slurp(path, &n), *obj = e + 56;
  Elf64_Ehdr eh;
  Elf64_Shdr sh;
  cr_assert(n > 56 + sizeof eh);
  memcpy(&eh, obj, sizeof eh);
  int found = 0;
  for (int i = 0; i < eh.e_shnum; i++) {
    memcpy(&sh, obj + eh.e_shoff + (size_t)i * sizeof sh, sizeof sh);
    if (sh.sh_type != SHT_SYMTAB) continue;
    Elf64_Word bad = 0x248458fc;
    memcpy(obj + sh.sh_offset + sh.sh_size - sizeof(Elf64_Sym) + offsetof(Elf64_Sym, st_name), &bad, sizeof bad);
    found = 1;
  }
  cr_assert(found, "the object has a symbol table");
  rehash_entry(e, n);
  FILE *f = fopen(path, "wb");
  cr_assert(f && fwrite(e, 1, n, f) == n);
  fclose(f);
  free(e);
}

static int count_files(const char *dir, const char *suffix) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "ls '%s' | grep -c -- '%s$'", dir, suffix);
  FILE *f = popen(cmd, "r");
  int n = -1;
  cr_assert(f && fscanf(f, "%d", &n) == 1);
  pclose(f);
  return n;
}

/* The disk cache: a second process loads the object code instead of compiling; a truncated or
 * corrupted file is detected and compiled again; four processes writing at once leave one
 * whole file and no temporaries. */
ETEST(inductor, disk_cache_second_process_corruption_and_concurrent_writers) {
  char dir[] = "/tmp/ember-cache-testXXXXXX";
  cr_assert(mkdtemp(dir));
  long c[8][4];
  probe(dir, 1, c);
  cr_assert(c[0][2] == 1 && c[0][1] == 0, "first process compiles (misses %ld)", c[0][2]);
  probe(dir, 1, c);
  cr_assert(c[0][1] == 1 && c[0][2] == 0, "second process loads from disk (disk hits %ld, misses %ld)", c[0][1], c[0][2]);
  cr_assert_eq(count_files(dir, ".o"), 1);
  char cmd[1200];
  for (int damage = 0; damage < 4; damage++) {
    if (damage == 0) snprintf(cmd, sizeof cmd, "for f in '%s'/*.o; do truncate -s 100 \"$f\"; done", dir);
    else if (damage == 1) snprintf(cmd, sizeof cmd, "for f in '%s'/*.o; do printf 'XXXX' | dd of=\"$f\" bs=1 seek=200 conv=notrunc 2>/dev/null; done", dir);
    /* issue 17: a FIFO in the file's place hung the reader; a header claiming more bytes than the
     * file has must be refused before anything is allocated */
    else if (damage == 2) snprintf(cmd, sizeof cmd, "for f in '%s'/*.o; do rm \"$f\"; mkfifo \"$f\"; done", dir);
    else snprintf(cmd, sizeof cmd, "for f in '%s'/*.o; do printf '\\377\\377\\377\\377\\377\\377\\377\\177' | dd of=\"$f\" bs=1 seek=16 conv=notrunc 2>/dev/null; done", dir);
    cr_assert_eq(system(cmd), 0);
    probe(dir, 1, c);
    cr_assert(c[0][2] == 1 && c[0][1] == 0, "damage %d: the damaged file is compiled again", damage);
    probe(dir, 1, c);
    cr_assert_eq(c[0][1], 1, "damage %d: and the rewritten file loads", damage);
  }
  /* damage 4: a valid checksum over the wrong object */
  char victim[1024], donor[1024];
  cache_file(dir, NULL, victim, sizeof victim);
  setenv("EMBER_CACHE_PROBE_VARIANT", "1", 1);
  probe(dir, 1, c);
  unsetenv("EMBER_CACHE_PROBE_VARIANT");
  cache_file(dir, victim, donor, sizeof donor);
  forge_entry(victim, donor);
  probe(dir, 1, c);
  cr_assert(c[0][2] == 1 && c[0][1] == 0, "a wrong object under a valid checksum is compiled again (misses %ld)", c[0][2]);
  probe(dir, 1, c);
  cr_assert_eq(c[0][1], 1, "and the replaced entry loads");
  /* damage 5: a valid checksum over an object whose symbol names lie outside its string table;
   * probe fails the test if the process dies */
  damage_symbol_name(victim);
  probe(dir, 1, c);
  cr_assert(c[0][2] == 1 && c[0][1] == 0, "a malformed object under a valid checksum is compiled again");
  probe(dir, 1, c);
  cr_assert_eq(c[0][1], 1, "and the replaced entry loads");
  snprintf(cmd, sizeof cmd, "rm -f '%s'/*", dir);
  cr_assert_eq(system(cmd), 0);
  probe(dir, 4, c);
  cr_assert_eq(count_files(dir, ".o"), 1, "concurrent writers leave one file");
  cr_assert_eq(count_files(dir, "tmp.*"), 0, "and no temporaries");
  probe(dir, 1, c);
  cr_assert_eq(c[0][1], 1, "which loads");
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}


/* ---- EMBER_CPU_ISA=avx2 (issues 20 and 23) ---------------------------------------------- */

/* Whether an instruction (AT&T syntax) needs AVX-512: a zmm register, an EVEX-only register
 * (xmm16-31, ymm16-31), a mask register or an embedded broadcast. */
static bool needs_avx512(const char *insn) {
  if (strstr(insn, "zmm") || strstr(insn, "{1to") || strstr(insn, "{%k")) return true;
  for (const char *p = insn; (p = strstr(p, "mm")); p += 2)
    if (p > insn && (p[-1] == 'x' || p[-1] == 'y') && p[2] >= '1' && p[2] <= '3' && p[3] >= '0' && p[3] <= '9' &&
        (p[2] - '0') * 10 + (p[3] - '0') >= 16)
      return true;
  return false;
}

/* Disassembles the executable sections of the cache entry at path (a 56-byte header, then an
 * ELF object); counts instructions that need AVX-512 and those on ymm registers; appends the
 * object's SLEEF symbol names, space-separated, to sleef. */
static void scan_entry(const char *path, int *avx512, int *ymm, char *sleef, size_t cap) {
  size_t n;
  char *e = slurp(path, &n), *obj = e + 56;
  Elf64_Ehdr eh;
  cr_assert(n > 56 + sizeof eh);
  memcpy(&eh, obj, sizeof eh);
  LLVMInitializeNativeTarget();
  LLVMInitializeNativeDisassembler();
  char *triple = LLVMGetDefaultTargetTriple();
  LLVMDisasmContextRef dc = LLVMCreateDisasm(triple, NULL, 0, NULL, NULL);
  LLVMDisposeMessage(triple);
  cr_assert(dc, "an LLVM disassembler for the host");
  for (int i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh;
    memcpy(&sh, obj + eh.e_shoff + (size_t)i * sizeof sh, sizeof sh);
    if (sh.sh_type == SHT_STRTAB)
      for (size_t o = 0; o < sh.sh_size; o += strlen(obj + sh.sh_offset + o) + 1) {
        const char *name = obj + sh.sh_offset + o;
        if (!strncmp(name, "Sleef_", 6)) snprintf(sleef + strlen(sleef), cap - strlen(sleef), "%s ", name);
      }
    if (sh.sh_type != SHT_PROGBITS || !(sh.sh_flags & SHF_EXECINSTR)) continue;
    uint8_t *code = (uint8_t *)obj + sh.sh_offset;
    for (uint64_t pc = 0; pc < sh.sh_size;) {
      char text[256];
      size_t len = LLVMDisasmInstruction(dc, code + pc, sh.sh_size - pc, pc, text, sizeof text);
      if (!len) { /* padding or data: step over a byte */
        pc++;
        continue;
      }
      *avx512 += needs_avx512(text);
      *ymm += strstr(text, "ymm") != NULL;
      pc += len;
    }
  }
  LLVMDisasmDispose(dc);
  free(e);
}

/* EMBER_CPU_ISA=avx2 holds the generated code to AVX2 on an AVX-512 host: cache_probe's softmax
 * and tanh(sin) (SLEEF's sin) kernels, compiled in a process under the switch, match eager there, and their
 * object code has no AVX-512 instruction (zmm, EVEX-only registers, masks) but ymm vectors, and
 * calls SLEEF's 8-lane AVX2 functions. The same graph compiled natively is another cache entry
 * (the key holds the effective features), and on an AVX-512 host its code does use zmm: the
 * check that would fail if the switch did nothing. */
ETEST(inductor, cpu_isa_avx2_holds_generated_code_to_avx2) {
  char dir[] = "/tmp/ember-isa-testXXXXXX";
  cr_assert(mkdtemp(dir));
  long c[1][4];
  setenv("EMBER_CPU_ISA", "avx2", 1);
  probe(dir, 1, c); /* fails unless the result matches eager */
  cr_assert(c[0][2] == 1, "compiled under avx2 (misses %ld)", c[0][2]);
  char held[1024], native[1024];
  cache_file(dir, NULL, held, sizeof held);
  unsetenv("EMBER_CPU_ISA");
  setenv("EMBER_NO_AVX512", "1", 1); /* the older switch: an alias, the same kernels */
  probe(dir, 1, c);
  unsetenv("EMBER_NO_AVX512");
  cr_assert(c[0][1] == 1 && c[0][2] == 0, "EMBER_NO_AVX512 finds the avx2 entry (misses %ld)", c[0][2]);
  setenv("EMBER_CPU_ISA", "native", 1);
  probe(dir, 1, c);
  unsetenv("EMBER_CPU_ISA");
  bool host512 = __builtin_cpu_supports("avx512f");
  int avx512 = 0, ymm = 0;
  char sleef[1024] = "";
  scan_entry(held, &avx512, &ymm, sleef, sizeof sleef);
  cr_assert_eq(avx512, 0, "%d instructions of the avx2 kernels need AVX-512", avx512);
  cr_assert_gt(ymm, 0, "the avx2 kernels run on ymm vectors");
#ifdef EMBER_HAVE_SLEEF
  cr_assert(strstr(sleef, "f8_") && !strstr(sleef, "f16_"), "SLEEF's AVX2 functions, not: %s", sleef);
#endif
  if (!host512) { /* nothing to hold: the same features, the same entry */
    cr_assert(c[0][1] == 1 && c[0][2] == 0, "no AVX-512 here: native finds the avx2 entry");
    fprintf(stderr, "[inductor] this host has no AVX-512: avx2 and native generate the same code\n");
  } else {
    cr_assert(c[0][2] == 1 && c[0][1] == 0, "native is another cache entry (disk hits %ld)", c[0][1]);
    cache_file(dir, held, native, sizeof native);
    int native512 = 0, native_ymm = 0;
    char native_sleef[1024] = "";
    scan_entry(native, &native512, &native_ymm, native_sleef, sizeof native_sleef);
    cr_assert_gt(native512, 0, "the native kernels of this AVX-512 host use it");
#ifdef EMBER_HAVE_SLEEF
    cr_assert(strstr(native_sleef, "f16_"), "native calls SLEEF's 16-lane functions: %s", native_sleef);
#endif
  }
  char cmd[1100];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

#ifdef EMBER_HAVE_DNNL
/* And oneDNN: a convolution (and a GEMM) in this process under EMBER_CPU_ISA=avx2 runs AVX2
 * kernels. Each test is a process of its own, so the switch is read here for the first time. */
ETEST(inductor, cpu_isa_avx2_holds_onednn) {
  setenv("EMBER_CPU_ISA", "avx2", 1);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(2, 3, 9, 9)), *w = em_randn(EM_F32, EM_SHAPE(4, 3, 3, 3));
  em_tensor *y = em_conv2d(x, w, EM_NONE, EM_CONV2D_DEFAULT);
  em_tensor *m = em_matmul(em_randn(EM_F32, EM_SHAPE(33, 65)), em_randn(EM_F32, EM_SHAPE(65, 17)));
  unsetenv("EMBER_CPU_ISA");
  cr_assert(y && m, "%s", em_last_error() ? em_last_error() : "");
  cr_assert_str_eq(em_cpu_isa(), __builtin_cpu_supports("avx2") ? "avx2" : "baseline");
  if (__builtin_cpu_supports("avx2"))
    cr_assert_eq(dnnl_get_effective_cpu_isa(), dnnl_cpu_isa_avx2, "oneDNN's ISA is %#x",
                 (unsigned)dnnl_get_effective_cpu_isa());
}
#endif

/* ---- issue 15 regressions: each failed on the default backend before its fix ------------- */

/* Reductions and axis-taking views with negative and unsorted axes. Root cause: graph nodes kept
 * the user's axes as given, and the inductor indexed per-dimension arrays by them (red[-2]:
 * a write before the array, and EM_AXES(-2, 2) reduced only axis 2). Nodes now carry canonical
 * axes (prim_canonical_attrs in ir_add_node; the verifier rejects others). */
static em_outputs negative_axes(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0];
  return EM_OUTPUTS(em_sum(x, EM_AXES(-2, 2), false), em_sum(x, EM_AXES(-1, 0), false),
                    em_amax(x, EM_AXES(-1), true), em_mean(x, EM_AXES(2, -3), true),
                    em_flip(em_sin(x), EM_AXES(-1, 0)), em_permute(em_neg(x), EM_AXES(-1, 0, -2)),
                    em_softmax(x, -1), em_squeeze(em_amin(x, EM_AXES(-2), true), EM_AXES(-2)));
}

ETEST(inductor, negative_and_unsorted_axes_match_eager) {
  em_tensor *x = em_reshape(em_arange(EM_F32, 0, 105, 1), EM_SHAPE(3, 5, 7));
  em_outputs want = negative_axes(NULL, &x, 1);
  em_compiled *c = em_compile(negative_axes, NULL);
  for (int call = 0; call < 2; call++) {
    em_outputs got = em_call(c, NULL, x);
    cr_assert_eq(got.n, want.n, "%s", em_last_error() ? em_last_error() : "");
    for (int i = 0; i < want.n; i++) {
      cr_assert_not_null(got.t[i], "%s", em_last_error());
      expect_close(got.t[i], want.t[i], 1e-6, "output", i);
    }
  }
  em_compiled_free(c);
}

/* y = maximum(x, mean(x)); loss = sum(y * mean(y)): its backward kernel spills two comparisons
 * (bool) and a float to the row kernel's scratch. Root cause: a scratch row was indexed in the
 * spilled value's own element type, so the bool rows (bytes) overlapped the float row before
 * them and corrupted it: gradient [3.85, 0.96, 6.74] for eager's [3.85, 3.85, 9.63]. */
static em_outputs max_of_mean(void *ctx, em_tensor *const *in, int n) {
  em_tensor *x = in[0];
  em_tensor *y = em_maximum(x, em_mean(x, EM_AXES(0), true));
  return EM_OUTPUTS(em_sum(em_mul(y, em_mean(y, EM_AXES(0), true)), EM_AXES(0), false));
}

ETEST(inductor, spilled_comparisons_do_not_corrupt_the_scratch) {
  em_tensor *x = em_requires_grad_(em_from_data((float[]){1, 2, 4}, EM_F32, EM_SHAPE(3)), true);
  em_tensor *want, *got, *gw, *gg;
  want = max_of_mean(NULL, &x, 1).t[0];
  cr_assert(em_grad(1, &want, NULL, 1, &x, &gw, false, false));
  em_compiled *c = em_compile(max_of_mean, NULL);
  got = em_call(c, NULL, x).t[0];
  cr_assert_not_null(got, "%s", em_last_error());
  cr_assert(em_grad(1, &got, NULL, 1, &x, &gg, false, false), "%s", em_last_error());
  expect_close(got, want, 1e-6, "loss", 0);
  expect_close(gg, gw, 1e-6, "gradient", 0);
  em_compiled_free(c);
}

/* Found by the fuzzer: a reduction over all axes (n_axes 0) of a tensor whose last dim has size
 * 1. The inductor's reduction matcher marked only listed axes, saw none, and took the size-1 dim
 * for the reduced one: mean(tanh(x)) over [4, 3, 1] gave 0.048 for eager's 0.400. Nodes now
 * list every axis of an all-axes reduction. */
static em_outputs mean_of_all(void *ctx, em_tensor *const *in, int n) {
  return EM_OUTPUTS(em_mean(em_tanh(in[0]), 0, NULL, false), em_amax(in[0], 0, NULL, true), em_sum(in[0], 0, NULL, false));
}

ETEST(inductor, all_axes_reductions_over_trailing_size_one_dims) {
  em_manual_seed(5);
  em_tensor *xs[3] = {em_randn(EM_F32, EM_SHAPE(4, 3, 1)), em_randn(EM_F32, EM_SHAPE(5, 1, 1)), em_randn(EM_F32, EM_SHAPE(1, 7, 1))};
  for (int i = 0; i < 3; i++) {
    em_compiled *c = em_compile(mean_of_all, NULL);
    em_outputs want = mean_of_all(NULL, &xs[i], 1), got = em_call(c, NULL, xs[i]);
    for (int k = 0; k < 3; k++) expect_close(got.t[k], want.t[k], 1e-6, "output", k);
    em_compiled_free(c);
  }
}

/* ---- the prim table's scalar expressions, rendered by LLVM ---- */

/* Every pointwise prim has an expression, and it instantiates for every dtype as a well-typed
 * list: operands before their users, each op's operands of the dtypes its typing rule names,
 * the result of the dtype asked for. */
ETEST(inductor, every_pointwise_prim_has_a_well_typed_expression) {
  const em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL};
  int pointwise = 0;
  for (int op = 0; op < EM_PRIM_COUNT; op++) {
    const prim_info *pi = prim_get((em_prim)op);
    if (!(pi->flags & P_POINTWISE)) {
      prim_sexpr e;
      cr_assert_not(prim_scalar_expr((em_prim)op, (em_dtype[]){EM_F32, EM_F32, EM_F32}, EM_F32, EM_F32, &e), "%s", pi->name);
      continue;
    }
    pointwise++;
    cr_assert(pi->expr && *pi->expr, "%s has no expression in prims.def", pi->name);
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
      em_dtype C = dts[d], out = pi->flags & P_BOOL_OUT ? EM_BOOL : op == EM_PRIM_CONVERT ? EM_I64 : C;
      em_dtype args[3] = {op == EM_PRIM_WHERE ? EM_BOOL : C, C, C};
      prim_sexpr e;
      cr_assert(prim_scalar_expr((em_prim)op, args, C, out, &e), "%s over %s: the expression does not parse", pi->name, em_dtype_name(C));
      cr_assert_eq(e.ins[e.n - 1].dtype, out, "%s over %s: result dtype", pi->name, em_dtype_name(C));
      for (int i = 0; i < e.n; i++) {
        const prim_sinst *in = &e.ins[i];
        if (in->op == SOP_ARG) cr_assert(in->arg < pi->arity && in->dtype == args[in->arg], "%s: operand %d", pi->name, in->arg);
        for (int k = 0; k < in->n_in; k++) {
          cr_assert_lt(in->in[k], i, "%s: instruction %d reads a later one", pi->name, i);
          em_dtype got = e.ins[in->in[k]].dtype;
          bool logic = in->op == SOP_AND || in->op == SOP_OR || in->op == SOP_NOT || (in->op == SOP_SELECT && k == 0);
          if (in->op != SOP_CAST) cr_assert_eq(got, logic ? EM_BOOL : C, "%s: %s operand %d", pi->name, prim_sop_name(in->op), k);
        }
      }
    }
  }
  cr_assert_geq(pointwise, 35);
}

/* Inputs with the values where implementations differ: NaN, infinities, signed zeros, halves,
 * huge and tiny magnitudes. */
static const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 0.5f, -0.5f, 1.5f, -1.5f, 2.5f,
                                 -2.5f, 1.0f, -1.0f, 3.0f, 1e30f, -1e30f, 1e-30f, 7.25f, -0.75f, 0.1f};
#define N_SPECIAL (int)(sizeof specials / sizeof specials[0])

typedef struct one_prim {
  em_prim op;
  em_dtype dtype;
} one_prim;

/* The prim applied through its public op to x and y (in[0], in[1]: f32; in[3], in[4]: bool),
 * in[2] the mask of where. */
static int apply_prim(em_tensor *const *in, em_tensor **out, void *ctx) {
  const one_prim *p = ctx;
  bool b = p->dtype == EM_BOOL;
  em_tensor *x = in[b ? 3 : 0], *y = in[b ? 4 : 1], *m = in[2];
  switch (p->op) {
  case EM_PRIM_NEG: out[0] = em_neg(x); break;
  case EM_PRIM_ABS: out[0] = em_abs(x); break;
  case EM_PRIM_EXP: out[0] = em_exp(x); break;
  case EM_PRIM_LOG: out[0] = em_log(x); break;
  case EM_PRIM_LOG1P: out[0] = em_log1p(x); break;
  case EM_PRIM_EXPM1: out[0] = em_expm1(x); break;
  case EM_PRIM_SQRT: out[0] = em_sqrt(x); break;
  case EM_PRIM_RSQRT: out[0] = em_rsqrt(x); break;
  case EM_PRIM_SIN: out[0] = em_sin(x); break;
  case EM_PRIM_COS: out[0] = em_cos(x); break;
  case EM_PRIM_TANH: out[0] = em_tanh(x); break;
  case EM_PRIM_ERF: out[0] = em_erf(x); break;
  case EM_PRIM_SIGN: out[0] = em_sign(x); break;
  case EM_PRIM_FLOOR: out[0] = em_floor(x); break;
  case EM_PRIM_CEIL: out[0] = em_ceil(x); break;
  case EM_PRIM_RECIPROCAL: out[0] = em_reciprocal(x); break;
  case EM_PRIM_LOGICAL_NOT: out[0] = em_logical_not(x); break;
  case EM_PRIM_ADD: out[0] = em_add(x, y); break;
  case EM_PRIM_SUB: out[0] = em_sub(x, y); break;
  case EM_PRIM_MUL: out[0] = em_mul(x, y); break;
  case EM_PRIM_DIV: out[0] = em_div(x, y); break;
  case EM_PRIM_POW: out[0] = em_pow(x, y); break;
  case EM_PRIM_MAXIMUM: out[0] = em_maximum(x, y); break;
  case EM_PRIM_MINIMUM: out[0] = em_minimum(x, y); break;
  case EM_PRIM_REMAINDER: out[0] = em_remainder(x, y); break;
  case EM_PRIM_ATAN2: out[0] = em_atan2(x, y); break;
  case EM_PRIM_EQ: out[0] = em_eq(x, y); break;
  case EM_PRIM_NE: out[0] = em_ne(x, y); break;
  case EM_PRIM_LT: out[0] = em_lt(x, y); break;
  case EM_PRIM_LE: out[0] = em_le(x, y); break;
  case EM_PRIM_GT: out[0] = em_gt(x, y); break;
  case EM_PRIM_GE: out[0] = em_ge(x, y); break;
  case EM_PRIM_LOGICAL_AND: out[0] = em_logical_and(x, y); break;
  case EM_PRIM_LOGICAL_OR: out[0] = em_logical_or(x, y); break;
  case EM_PRIM_WHERE: out[0] = em_where(m, x, y); break;
  case EM_PRIM_CONVERT: out[0] = em_cast(x, p->dtype == EM_BOOL ? EM_F32 : EM_BOOL); break;
  default: return 0;
  }
  return 1;
}

/* Every pointwise prim over f32 and bool, on every pair of special values: the ones the LLVM
 * renderer renders are fused, and match eager bit for bit, except the transcendentals, which
 * run SLEEF functions or inline approximations of up to 7 ULP (within the suite's tolerance);
 * the rest run as eager kernels. */
ETEST(inductor, every_pointwise_prim_from_the_table_matches_eager) {
  float xs[N_SPECIAL * N_SPECIAL], ys[N_SPECIAL * N_SPECIAL];
  bool ms[N_SPECIAL * N_SPECIAL];
  for (int i = 0; i < N_SPECIAL; i++)
    for (int j = 0; j < N_SPECIAL; j++) xs[i * N_SPECIAL + j] = specials[i], ys[i * N_SPECIAL + j] = specials[j], ms[i * N_SPECIAL + j] = (i + j) % 3 == 0;
  em_tensor *x = em_from_data(xs, EM_F32, EM_SHAPE(N_SPECIAL, N_SPECIAL));
  em_tensor *y = em_from_data(ys, EM_F32, EM_SHAPE(N_SPECIAL, N_SPECIAL));
  em_tensor *m = em_from_data(ms, EM_BOOL, EM_SHAPE(N_SPECIAL, N_SPECIAL));
  em_tensor *xb = em_gt_scalar(x, 0.5), *yb = em_gt_scalar(y, 0.5);
  int fused = 0;
  for (int op = 0; op < EM_PRIM_COUNT; op++) {
    if (!(prim_get((em_prim)op)->flags & P_POINTWISE)) continue;
    for (int b = 0; b < 2; b++) {
      one_prim p = {(em_prim)op, b ? EM_BOOL : EM_F32};
      unsigned fl = prim_get((em_prim)op)->flags;
      if (b && (fl & (P_FLOAT_ONLY | P_NO_BOOL))) continue;
      em_tensor *probe[1];
      em_scope_begin();
      cr_assert_eq(apply_prim((em_tensor *[]){x, y, m, xb, yb}, probe, &p), 1, "%s has no case in apply_prim", prim_get((em_prim)op)->name);
      em_scope_end();
      char what[64];
      snprintf(what, sizeof what, "%s over %s", prim_get((em_prim)op)->name, em_dtype_name(p.dtype));
      ind_stats st;
      int exact = check(apply_prim, (em_tensor *[]){x, y, m, xb, yb}, &p, &st, what);
      bool transcendental = op == EM_PRIM_EXP || op == EM_PRIM_LOG || op == EM_PRIM_LOG1P || op == EM_PRIM_EXPM1 ||
                            op == EM_PRIM_SIN || op == EM_PRIM_COS || op == EM_PRIM_TANH || op == EM_PRIM_ERF ||
                            op == EM_PRIM_ATAN2;
      if (!transcendental) cr_assert_eq(exact, 1, "%s: not bit-identical to eager", what);
      bool f32_arith = !b && op != EM_PRIM_POW && op != EM_PRIM_REMAINDER;
      bool bool_logic = b && (fl & P_BOOL_OUT); /* comparisons, logic and not over bools */
      if (f32_arith || bool_logic || (b && (op == EM_PRIM_WHERE || op == EM_PRIM_CONVERT || op == EM_PRIM_MAXIMUM || op == EM_PRIM_MINIMUM)))
      {
        cr_assert_geq(st.fused_nodes, 1, "%s: not fused (%d kernels)", what, st.kernels);
        fused++;
      }
      if (op == EM_PRIM_POW || op == EM_PRIM_REMAINDER || (b && (op == EM_PRIM_ADD || op == EM_PRIM_MUL)))
        cr_assert_eq(st.kernels, 0, "%s: the renderer has no %s", what, b ? "bool arithmetic" : prim_get((em_prim)op)->name);
    }
  }
  cr_assert_geq(fused, 40);
}

/* ---- the in-memory kernel cache is bounded ---- */

/* n steps of x * 1.5 - 0.5 (neg between them), one module per n: the kernel's code grows with n
 * (pointwise kernels take their sizes as arguments, so shapes share a module). */
static int chain_of(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0];
  for (int k = 0; k < *(const int *)ctx; k++) x = em_neg(em_add_scalar(em_mul_scalar(x, 1.5), -0.5));
  out[0] = x;
  return 1;
}

static ind_program *compile_chain(em_tensor *x, int n) {
  em_tensor *gin[16];
  int n_in;
  ir_graph *g = trace_graph(chain_of, &x, &n, gin, &n_in);
  char err[256];
  ind_program *p = ind_compile(g, gin, NULL, err, sizeof err);
  cr_assert_not_null(p, "%s", err);
  ir_graph_free(g);
  return p;
}

/* Past the limit, modules no program uses are evicted, least recently used first; those in use
 * never are, and a graph whose module was evicted compiles (or loads from disk) again and gives
 * the same results. */
ETEST(inductor, the_kernel_cache_in_memory_is_bounded) {
  ind_set_kernel_cache_limit(4);
  em_manual_seed(9);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(3, 5));
  em_kernel_cache_stats s0 = em_kernel_cache_info();
  ind_stats st;
  for (int n = 1; n <= 40; n++) {
    check(chain_of, &x, &n, &st, "chain");
    em_kernel_cache_stats s = em_kernel_cache_info();
    cr_assert_leq(s.modules, 4, "after %d graphs: %lld modules", n, (long long)s.modules);
    cr_assert_eq(s.in_use, 0);
  }
  em_kernel_cache_stats s1 = em_kernel_cache_info();
  cr_assert_geq(s1.evictions - s0.evictions, 36, "%lld evictions", (long long)(s1.evictions - s0.evictions));
  /* six live programs: their modules stay although the limit is 4 */
  ind_program *live[6];
  for (int i = 0; i < 6; i++) live[i] = compile_chain(x, 41 + i);
  em_kernel_cache_stats s2 = em_kernel_cache_info();
  cr_assert_geq(s2.modules, 6);
  cr_assert_eq(s2.in_use, 6);
  for (int n = 47; n < 57; n++) check(chain_of, &x, &n, &st, "churn"); /* the live modules survive it */
  em_scope_begin();
  for (int i = 0; i < 6; i++) {
    em_tensor *got[1], *want[1];
    int n = 41 + i;
    cr_assert(ind_run(live[i], &x, 1, got, NULL, EM_HERE), "%s", em_last_error());
    chain_of(&x, want, &n);
    expect_close(rt_scope_add(got[0], "test", EM_HERE), want[0], 0, "live program", i);
    ind_free(live[i]);
  }
  em_scope_end();
  int n = 1; /* evicted long ago */
  check(chain_of, &x, &n, &st, "again");
  cr_assert_leq(em_kernel_cache_info().modules, 4);
  ind_set_kernel_cache_limit(0);
}

/* ---- f64 graphs compile (issue 23) ---- */

/* A pointwise f64 chain over x (any layout) and a broadcast row b: add, mul, exp, log, tanh, a
 * sigmoid, a comparison whose bool the where consumes, a bool output, and a round trip through
 * f32 (an f32 value in a kernel of f64 lanes) by exact f32 ops. */
static int f64_chain(em_tensor *const *in, em_tensor **out, void *ctx) {
  (void)ctx;
  em_tensor *x = in[0], *b = in[1];
  em_tensor *h = em_add(em_mul_scalar(x, 1.5), b);
  em_tensor *pos = em_gt_scalar(h, 0.25);
  h = em_where(pos, em_log(em_add_scalar(em_exp(em_neg(h)), 1)), em_tanh(h));
  h = em_add(em_mul(em_sigmoid(h), em_exp(em_mul_scalar(h, 0.5))), em_log(em_add_scalar(em_abs(b), 1)));
  out[0] = h;
  out[1] = em_lt(h, b);
  out[2] = em_sub(em_cast(em_mul_scalar(em_cast(h, EM_F32), 3), EM_F64), em_div(h, em_add_scalar(em_abs(x), 2)));
  return 3;
}

/* f32 transcendentals in a kernel of f64 lanes: the LANES-wide f32 functions, lanes widened. */
static int f32_in_f64_kernel(em_tensor *const *in, em_tensor **out, void *ctx) {
  (void)ctx;
  em_tensor *h = em_mul(in[0], in[0]);
  out[0] = em_add(em_cast(em_exp(em_tanh(em_cast(h, EM_F32))), EM_F64), h);
  return 1;
}

/* The chain on contiguous, transposed, sliced and expanded f64 inputs of odd sizes: every node in
 * kernels (none op by op for its dtype), outputs within 1e-12 of eager f64 (SLEEF's f64 u10
 * functions against libm). */
ETEST(inductor, f64_pointwise_chains_compile) {
  int64_t rows[] = {1, 3, 13}, cols[] = {1, 5, 7, 17, 67, 1024};
  for (int i = 0; i < 3 * 6 * 4; i++) { /* rows x cols x 4 layouts */
    int64_t R = rows[i / 24], C = cols[i / 4 % 6];
    int layout = i % 4;
    em_scope_begin();
    em_manual_seed((uint64_t)i);
    em_tensor *in[2] = {laid_out(EM_F64, R, C, layout), em_randn(EM_F64, EM_SHAPE(C))};
    char what[96];
    snprintf(what, sizeof what, "f64 chain over [%lld,%lld] layout %d", (long long)R, (long long)C, layout);
    ind_stats st;
    check_within(f64_chain, in, NULL, &st, what, false, 1e-12);
    cr_assert_gt(st.kernels, 0, "%s: no kernels", what);
    cr_assert_eq(st.dtype_eager_nodes, 0, "%s: %d nodes op by op for their dtype", what, st.dtype_eager_nodes);
    cr_log_info("%s: %d kernels holding %d nodes, %d nodes eager", what, st.kernels, st.fused_nodes,
                st.fallback_nodes);
    check(f32_in_f64_kernel, in, NULL, &st, what); /* f32's tolerance: compiled f32 tanh is SLEEF's u35 */
    cr_assert_eq(st.kernels, 1, "%s: f32 in f64: %d kernels", what, st.kernels);
    em_scope_end();
  }
}

/* Row kernels in f64: softmax, log_softmax, layer_norm, a column sum and a column amax (the
 * composites one_composite makes) over f64 inputs of odd sizes and layouts, each one kernel,
 * within 1e-12 of eager f64 (sums run in another order). */
ETEST(inductor, f64_reductions_compile) {
  int64_t rows[] = {1, 3, 13}, cols[] = {1, 5, 17, 67, 1024};
  static const int which[] = {0, 1, 2, 4, 5};
  for (int i = 0; i < 5 * 3 * 5 * 3; i++) { /* composites x rows x cols x 3 layouts */
    int w = which[i / 45], layout = i % 3;
    int64_t R = rows[i / 15 % 3], C = cols[i / 3 % 5];
    em_scope_begin();
    em_manual_seed((uint64_t)i);
    em_tensor *in[4] = {laid_out(EM_F64, R, C, layout), em_randn(EM_F64, EM_SHAPE(C)), NULL,
                        em_randn(EM_F64, EM_SHAPE(C))};
    char what[96];
    snprintf(what, sizeof what, "f64 composite %d of [%lld,%lld] layout %d", w, (long long)R, (long long)C, layout);
    ind_stats st;
    check_within(one_composite, in, &w, &st, what, false, 1e-12);
    cr_assert_eq(st.dtype_eager_nodes, 0, "%s: %d nodes op by op for their dtype", what, st.dtype_eager_nodes);
    if (layout == 0 && C > 1)
      cr_assert_eq(st.kernels, 1, "%s: %d kernels (%d nodes eager)", what, st.kernels, st.fallback_nodes);
    em_scope_end();
  }
}

/* A normalisation whose row kernel keeps f64 values in scratch rows between its three passes
 * (tanh(x), then the centred values) and ends with an amax. */
static int f64_spills(em_tensor *const *in, em_tensor **out, void *ctx) {
  (void)ctx;
  int64_t C = em_size(in[0], 1);
  em_tensor *h = em_tanh(em_mul_scalar(in[0], 0.7));
  em_tensor *d = em_sub(h, em_mul_scalar(em_sum(h, 1, (int64_t[]){1}, true), 1.0 / (double)C));
  em_tensor *y = em_div(d, em_sqrt(em_add_scalar(em_sum(em_mul(d, d), 1, (int64_t[]){1}, true), 1e-5)));
  out[0] = em_add(y, em_exp(y));
  out[1] = em_amax(y, 1, (int64_t[]){1}, false);
  return 2;
}

ETEST(inductor, f64_row_kernel_spills) {
  int64_t cols[] = {1, 7, 37, 300};
  for (int i = 0; i < 4 * 2; i++) {
    em_scope_begin();
    em_manual_seed((uint64_t)i);
    em_tensor *x = laid_out(EM_F64, 5, cols[i / 2], i % 2);
    char what[64];
    snprintf(what, sizeof what, "f64 spills over [5,%lld] layout %d", (long long)cols[i / 2], i % 2);
    ind_stats st;
    check_within(f64_spills, &x, NULL, &st, what, false, 1e-12);
    if (i % 2 == 0 && cols[i / 2] > 1) cr_assert_eq(st.kernels, 1, "%s: %d kernels", what, st.kernels);
    em_scope_end();
  }
}

/* Integer pointwise kernels: i64 and i32 arithmetic (wrapping), abs, neg, comparisons (signed),
 * where, maximum, sign, conversions among integers, bool and floats, with a broadcast row and
 * transposed, sliced and expanded inputs: eager's values exactly. */
static int int_chain(em_tensor *const *in, em_tensor **out, void *ctx) {
  (void)ctx;
  em_tensor *x = in[0], *b = in[1];
  em_tensor *h = em_add(em_mul(x, x), em_mul_scalar(b, 3));
  em_tensor *n = em_neg(em_abs(em_sub(h, x)));
  out[0] = em_where(em_lt(n, b), em_maximum(n, x), em_sign(h));
  em_tensor *s = em_cast(em_add(em_cast(h, EM_I32), em_cast(em_ge(x, b), EM_I32)), EM_I32);
  out[1] = em_cast(s, EM_I64);
  out[2] = em_add(em_cast(x, EM_F64), em_mul_scalar(em_cast(s, EM_F32), 0.5)); /* promoted to f64 */
  /* float to integer: truncated; NaN (0 / 0), infinities and values past 2^63 give INT64_MIN, then its low bits */
  em_tensor *q = em_mul_scalar(em_div(em_cast(x, EM_F64), em_cast(em_sub(b, x), EM_F64)), 1e14);
  em_tensor *x64 = em_cast(x, EM_F64), *z64 = em_cast(em_mul_scalar(x, 0), EM_F64);
  out[3] = em_cast(em_add(q, em_div(em_mul_scalar(x64, 1e15), em_add_scalar(z64, 1))), EM_I64); /* |x| * 1e15 > 2^63 */
  out[4] = em_cast(em_cast(em_where(em_gt(x, b), em_div(x64, z64), em_div(z64, z64)), EM_F32), EM_I32);
  return 5;
}

ETEST(inductor, integer_pointwise_kernels) {
  for (int i = 0; i < 4 * 4; i++) {
    int64_t R = i / 4 == 0 ? 1 : 3 + 10 * (i / 4), C = 5 + 31 * (i / 4);
    int layout = i % 4;
    em_scope_begin();
    em_manual_seed((uint64_t)i);
    em_tensor *x = em_cast(em_mul_scalar(laid_out(EM_F32, R, C, layout), 1e4), EM_I64);
    if (layout == 1) x = em_transpose(em_cast(em_randint(-99999, 99999, EM_SHAPE(C, R)), EM_I64), 0, 1);
    em_tensor *in[2] = {x, em_randint(-3000000000ll, 3000000000ll, EM_SHAPE(C))};
    char what[80];
    snprintf(what, sizeof what, "int chain over [%lld,%lld] layout %d", (long long)R, (long long)C, layout);
    ind_stats st;
    cr_assert_eq(check_within(int_chain, in, NULL, &st, what, false, 1e-300), 5, "%s: not eager's values", what);
    cr_assert_eq(st.dtype_eager_nodes, 0, "%s: %d nodes op by op for their dtype", what, st.dtype_eager_nodes);
    cr_assert_gt(st.kernels, 0, "%s", what);
    em_scope_end();
  }
}

/* Graphs the renderer has no code for (an i64 sum, f16 values) still run, op by op, and say so:
 * ind_stats.dtype_eager_nodes counts them and the schedule names them once. */
static int int_and_sum(em_tensor *const *in, em_tensor **out, void *ctx) {
  (void)ctx;
  out[0] = em_sum(em_add(em_mul(in[0], in[0]), in[0]), 1, (int64_t[]){1}, false); /* i64 kernel, i64 sum */
  out[1] = em_sum(em_exp(in[1]), 1, (int64_t[]){1}, false);                       /* one f64 row kernel */
  out[2] = em_cast(em_cast(in[1], EM_F16), EM_F64); /* f16 is a storage type on the CPU */
  return 3;
}

ETEST(inductor, dtypes_without_kernels_are_counted) {
  em_manual_seed(5);
  em_tensor *in[2] = {em_randint(-9, 9, EM_SHAPE(4, 33)), em_randn(EM_F64, EM_SHAPE(4, 33))};
  ind_stats st;
  check_within(int_and_sum, in, NULL, &st, "i64 and an f64 sum", false, 1e-12);
  cr_assert_eq(st.dtype_eager_nodes, 3, "%d nodes op by op for their dtype", st.dtype_eager_nodes);
  cr_assert_eq(st.kernels, 2, "the i64 arithmetic, the f64 exp and sum compile: %d kernels", st.kernels);
  /* the schedule's reason line */
  em_tensor *gin[16];
  int n_in;
  ir_graph *g = trace_graph(int_and_sum, in, NULL, gin, &n_in);
  char err[256];
  ind_program *p = ind_compile(g, gin, NULL, err, sizeof err);
  cr_assert_not_null(p, "%s", err);
  const char *text = ind_schedule(p);
  cr_assert(text && strstr(text, "3 nodes run op by op for their dtypes (i64 sum, f16 convert, f16 convert)"), "%s",
            text);
  cr_assert(strstr(text, "sum (eager kernel: no generated code for i64)"), "%s", text);
  ind_free(p);
  ir_graph_free(g);
}

/* ---- GEMM epilogues on the CPU (schedule.c, prim_gemm_epilogue) ----
 * matmul [-> add(bias over the rows)] [-> relu | gelu] runs as one GEMM step whose tiles get the
 * bias and activation right after the library writes them, in eager's f32 operations: the
 * results are the unfused program's bits, and no generated kernel reads the product back. */

enum { EPI_BIAS, EPI_RELU, EPI_GELU_TANH, EPI_GELU_ERF };
static const char *const epi_names[] = {"bias", "bias+relu", "bias+gelu_tanh", "bias+gelu_erf"};

static em_tensor *activate(em_tensor *h, int kind) {
  return kind == EPI_RELU        ? em_relu(h)
         : kind == EPI_GELU_TANH ? em_gelu(h, true)
         : kind == EPI_GELU_ERF  ? em_gelu(h, false)
                                 : h;
}

/* ctx: the activation (EPI_*). */
static int linear_act(em_tensor *const *in, em_tensor **out, void *ctx) {
  out[0] = activate(em_linear(in[0], in[1], in[2]), *(const int *)ctx);
  return 1;
}

/* build traced and compiled as check compiles it (with EMBER_INDUCTOR_EPILOGUE=0 unless
 * epilogues); its graph in *g, its inputs in gin. */
static ind_program *traced_program(builder_fn build, em_tensor *const *in, void *ctx, bool epilogues, ir_graph **g,
                                   em_tensor **gin, int *n_in) {
  *g = trace_graph(build, in, ctx, gin, n_in);
  char err[256];
  ind_stats st;
  if (!epilogues) setenv("EMBER_INDUCTOR_EPILOGUE", "0", 1);
  ind_program *p = ind_compile(*g, gin, &st, err, sizeof err);
  unsetenv("EMBER_INDUCTOR_EPILOGUE");
  cr_assert_not_null(p, "%s", err);
  return p;
}

/* The schedule line of the GEMM epilogue step in build's program ("" when there is none), in buf. */
static const char *epilogue_line(builder_fn build, em_tensor *const *in, void *ctx, char *buf, size_t cap) {
  ir_graph *g;
  em_tensor *gin[16];
  int n_in;
  ind_program *p = traced_program(build, in, ctx, true, &g, gin, &n_in);
  const char *s = ind_schedule(p), *at = s ? strstr(s, "GEMM tile epilogue") : NULL;
  buf[0] = 0;
  if (at) {
    const char *eol = strchr(at, '\n');
    snprintf(buf, cap, "%.*s", (int)(eol ? eol - at : (ptrdiff_t)strlen(at)), at);
  }
  ind_free(p);
  ir_graph_free(g);
  return buf;
}

/* Whether build's program gives the same bits with its GEMM epilogues as without them (the
 * generated kernels then run what the epilogues ran). */
static bool same_bits_unfused(builder_fn build, em_tensor *const *in, void *ctx, const char *what) {
  em_tensor *got[2][8];
  int n = 0;
  for (int pass = 0; pass < 2; pass++) {
    ir_graph *g;
    em_tensor *gin[16];
    int n_in;
    ind_program *p = traced_program(build, in, ctx, pass == 0, &g, gin, &n_in);
    n = g->n_outputs;
    cr_assert(ind_run(p, gin, n_in, got[pass], NULL, EM_HERE), "%s: %s", what, em_last_error());
    for (int i = 0; i < n; i++) got[pass][i] = rt_scope_add(got[pass][i], "test", EM_HERE);
    ind_free(p);
    ir_graph_free(g);
  }
  for (int i = 0; i < n; i++) {
    int64_t m = em_numel(got[0][i]);
    float *x = malloc(sizeof(float) * (size_t)(m + 1)), *y = malloc(sizeof(float) * (size_t)(m + 1));
    cr_assert(em_to_buffer(got[0][i], EM_F32, x, sizeof(float) * (size_t)m) &&
              em_to_buffer(got[1][i], EM_F32, y, sizeof(float) * (size_t)m));
    bool same = !memcmp(x, y, sizeof(float) * (size_t)m);
    free(x), free(y);
    if (!same) return false;
  }
  return true;
}

/* The results are eager's bits, but for the tanh GELU, whose tanh is the generated kernels' (u35,
 * codegen.c): they are the unfused program's bits then. */
ETEST(inductor, linear_bias_activation_is_one_gemm_step_with_the_unfused_bits) {
  /* odd sizes (tails of 8 lanes), a 3-D input (a reshape between the GEMM and the add), and a
   * product cut into several row and column tiles (the bias read from each tile's first column) */
  static const int64_t shapes[][4] = {{0, 7, 12, 9},      {0, 37, 19, 70},   {2, 5, 12, 9},
                                      {0, 300, 256, 600}, {3, 100, 64, 520}};
  for (int kind = EPI_BIAS; kind <= EPI_GELU_ERF; kind++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      em_scope_begin();
      em_manual_seed(40 + kind * 10 + (int)s);
      const int64_t *d = shapes[s];
      em_tensor *x = d[0] ? em_randn(EM_F32, EM_SHAPE(d[0], d[1], d[2])) : em_randn(EM_F32, EM_SHAPE(d[1], d[2]));
      em_tensor *in[3] = {x, em_mul_scalar(em_randn(EM_F32, EM_SHAPE(d[3], d[2])), 0.3),
                          em_randn(EM_F32, EM_SHAPE(d[3]))};
      char what[128];
      snprintf(what, sizeof what, "%s, x %s%lldx%lld, %lld out", epi_names[kind], d[0] ? "3-D " : "", (long long)d[1],
               (long long)d[2], (long long)d[3]);
      ind_stats st;
      /* the bias and ReLU are eager's bits; the GELUs the generated kernels' tanh and erf (prims/fast_f32.h) */
      cr_assert_geq(check(linear_act, in, &kind, &st, what), kind <= EPI_RELU, "%s: not eager's bits", what);
      cr_assert(same_bits_unfused(linear_act, in, &kind, what), "%s: not the unfused program's bits", what);
      cr_assert_eq(st.gemm_epilogues, 1, "%s: %d GEMM epilogues", what, st.gemm_epilogues);
      cr_assert_eq(st.kernels, 0, "%s: a generated kernel beside the epilogue (%d)", what, st.kernels);
      char line[256], want[64];
      snprintf(want, sizeof want, "GEMM tile epilogue %s,", epi_names[kind]);
      cr_assert(strstr(epilogue_line(linear_act, in, &kind, line, sizeof line), want),
                "%s: the schedule lacks '%s': '%s'", what, want, line);
      em_scope_end();
    }
}

/* An empty inner dimension: the product is zeros, the epilogue still runs (relu(bias)). */
ETEST(inductor, gemm_epilogue_with_an_empty_inner_dimension) {
  int kind = EPI_RELU;
  em_tensor *in[3] = {em_zeros(EM_F32, EM_SHAPE(3, 0)), em_zeros(EM_F32, EM_SHAPE(4, 0)),
                      em_randn(EM_F32, EM_SHAPE(4))};
  ind_stats st;
  cr_assert_eq(check(linear_act, in, &kind, &st, "k = 0"), 1);
  cr_assert_eq(st.gemm_epilogues, 1);
}

/* ctx: which of the chains below. x [12, 10], w [12, 10], b [12], r [12, 12] or [10, 12]. */
static int epilogue_cases(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0], *w = in[1], *b = in[2], *r = in[3];
  em_tensor *mm = em_matmul(x, em_transpose(w, 0, 1));
  switch (*(const int *)ctx) {
  case 0: { /* the pre-activation is an output */
    em_tensor *h = em_add(mm, b);
    out[0] = em_relu(h), out[1] = h;
    return 2;
  }
  case 1: { /* the pre-activation read beside the relu */
    em_tensor *h = em_add(mm, b);
    out[0] = em_mul(em_relu(h), h);
    return 1;
  }
  case 2: out[0] = em_relu(em_add(mm, b)), out[1] = em_sum(mm, 0, NULL, false); return 2; /* the product read after */
  case 3: out[0] = em_relu(em_add(mm, r)); return 1;                       /* a residual [M, N], not a bias */
  case 4: out[0] = em_relu(em_add(mm, em_slice(r, 1, 0, 1, 1))); return 1; /* [M, 1]: over the columns */
  case 5: out[0] = em_relu(em_add(em_transpose(mm, 0, 1), b)); return 1;   /* the product transposed */
  case 6: out[0] = em_relu(em_add(mm, b)), out[1] = em_mul_scalar(b, 2); return 2; /* the bias read elsewhere */
  case 7: /* x given transposed (a slice of wider rows), w as [in, out]: other layouts for the GEMM */
    out[0] = em_gelu(em_add(em_matmul(em_transpose(r, 0, 1), em_transpose(w, 0, 1)), b), true);
    return 1;
  case 8: out[0] = em_gelu(mm, true); return 1; /* no bias */
  case 9: { /* no bias, the product read before the activation ends */
    em_tensor *s = em_sum(mm, 1, (int64_t[]){1}, true);
    out[0] = em_gelu(mm, true), out[1] = s;
    return 2;
  }
  default: { /* no bias, a 3-D input, the reshaped product returned as a training forward saves it */
    em_tensor *h = em_linear(em_reshape(r, EM_SHAPE(2, 5, 12)), em_slice(r, 0, 2, 10, 1), EM_NONE);
    out[0] = em_gelu(h, false), out[1] = h;
    return 2;
  }
  }
}

/* What must not swallow the activation or the add falls back to the GEMM and a generated kernel,
 * with eager's results; the schedule line says which epilogue ran. */
ETEST(inductor, gemm_epilogue_only_where_nothing_else_reads_what_it_swallows) {
  em_manual_seed(61);
  em_tensor *in[4] = {em_randn(EM_F32, EM_SHAPE(12, 10)), em_randn(EM_F32, EM_SHAPE(12, 10)),
                      em_randn(EM_F32, EM_SHAPE(12)), em_slice(em_randn(EM_F32, EM_SHAPE(10, 14)), 1, 1, 13, 1)};
  static const char *const what[] = {"pre-activation returned", "pre-activation read twice", "product read after",
                                     "residual add", "bias over the columns", "transposed product",
                                     "bias read elsewhere", "transposed x", "no bias", "product read before",
                                     "3-D, no bias, product returned"};
  static const char *const line[] = {"epilogue bias,", "epilogue bias,", "epilogue bias+relu,", NULL, NULL, NULL,
                                     "epilogue bias+relu,", "epilogue bias+gelu_tanh,", "epilogue gelu_tanh,", NULL,
                                     "epilogue gelu_erf,"};
  for (int c = 0; c < 11; c++) {
    em_scope_begin();
    em_tensor *ops[4] = {in[0], in[1], in[2], c == 3 || c == 4 ? em_randn(EM_F32, EM_SHAPE(12, 12)) : in[3]};
    if (c == 10) ops[3] = em_randn(EM_F32, EM_SHAPE(10, 12));
    ind_stats st;
    /* outputs that must be eager's bits: those the epilogue makes, and bias adds and ReLUs */
    static const int exact[] = {2, 1, 1, 0, 0, 0, 2, 0, 0, 0, 1}; /* not the GELUs (prims/fast_f32.h) */
    cr_assert_geq(check(epilogue_cases, ops, &c, &st, what[c]), exact[c], "%s: not eager's bits", what[c]);
    cr_assert_eq(st.gemm_epilogues, line[c] != NULL, "%s: %d GEMM epilogues", what[c], st.gemm_epilogues);
    char buf[256];
    epilogue_line(epilogue_cases, ops, &c, buf, sizeof buf);
    if (line[c]) cr_assert(strstr(buf, line[c]), "%s: the schedule lacks '%s': '%s'", what[c], line[c], buf);
    else cr_assert_eq(buf[0], 0, "%s: an epilogue matched: '%s'", what[c], buf);
    bool kept = c == 2 || c == 10;
    cr_assert(same_bits_unfused(epilogue_cases, ops, &c, what[c]), "%s: not the unfused program's bits", what[c]);
    cr_assert_eq(strstr(buf, "the product stored too") != NULL, kept, "%s: '%s'", what[c], buf);
    em_scope_end();
  }
  /* f64: oneDNN's sgemm is f32 only, so no epilogue */
  int kind = EPI_RELU;
  em_tensor *d[3] = {em_cast(in[0], EM_F64), em_cast(in[1], EM_F64), em_cast(in[2], EM_F64)};
  ind_stats st;
  check(linear_act, d, &kind, &st, "f64");
  cr_assert_eq(st.gemm_epilogues, 0);
}

/* ctx: the activation. loss = mean(act(linear(x, w, b))^2) and its gradients in one graph: the
 * backward reads the pre-activation, so only the bias joins the forward's GEMM. */
static int linear_loss_grads(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *h = activate(em_linear(in[0], in[1], in[2]), *(const int *)ctx);
  out[0] = em_mean(em_mul(h, h), 0, NULL, false);
  em_tensor *wrt[3] = {in[0], in[1], in[2]};
  em_grad(1, &out[0], NULL, 3, wrt, &out[1], false, false);
  return 4;
}

ETEST(inductor, gemm_epilogue_in_a_graph_with_its_backward) {
  for (int kind = EPI_BIAS; kind <= EPI_GELU_ERF; kind++) {
    em_scope_begin();
    em_manual_seed(70 + kind);
    em_tensor *in[3] = {em_requires_grad_(em_randn(EM_F32, EM_SHAPE(2, 33, 40)), true),
                        em_requires_grad_(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(24, 40)), 0.2), true),
                        em_requires_grad_(em_randn(EM_F32, EM_SHAPE(24)), true)};
    ind_stats st;
    check(linear_loss_grads, in, &kind, &st, epi_names[kind]);
    cr_assert_eq(st.gemm_epilogues, 1, "%s: %d GEMM epilogues", epi_names[kind], st.gemm_epilogues);
    em_scope_end();
  }
}

/* ---- f32 tanh and erf inline (issue 20) ----
 * The generated code's tanh and erf are rational functions (inductor/codegen.c), not eager's
 * SLEEF u10 functions: over a dense sweep of f32 bit patterns (every 1021st, both signs, all
 * exponents: 4.2 million values) and the edge values, each result is within 5e-7 of eager's
 * (measured over all 2^32 inputs: tanh 3.0e-7 and 5 ULP, erf 4.2e-7 and 7 ULP), within
 * torch.testing's f32 tolerance (atol 1e-5, rtol 1.3e-6) by a factor 20, and within 8 ULP of
 * eager where eager's result is a normal number; NaN gives NaN, +-inf gives +-1, signed zeros and tiny tanh
 * arguments come back exactly; tanh is odd bit for bit. The sweep's odd length puts elements in
 * the vector body and the scalar tail, which must agree: element i of a shifted copy equals
 * element i + 1 of the original. exp, SLEEF's algorithm inline, gives eager's bits. */
static int tanh_and_erf(em_tensor *const *in, em_tensor **out, void *ctx) {
  out[0] = em_tanh(in[0]);
  out[1] = em_erf(in[0]);
  out[2] = em_exp(in[0]);
  return 3;
}

static double ulp_of(float v) {
  int e;
  frexpf(v, &e);
  return fabsf(v) < 0x1p-126f ? 0x1p-149 : ldexp(1.0, e - 24);
}

ETEST(inductor, inline_tanh_and_erf_within_their_bound_of_eager_exp_bit_identical) {
  enum { STEP = 1021 };
  static const float edges[] = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, 1e-30f, -1e-30f, 0.0004f, -0.0004f,
                                0.00039999f, 1e-3f, 0.5f, 1.0f, -1.0f, 3.9f, 4.0f, -4.0f, 4.0001f, 7.9f, 7.90531f,
                                8.0f, -8.0f, 9.0f, 88.0f, 1e30f, -1e30f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN};
  int n_edges = (int)(sizeof edges / sizeof edges[0]);
  int64_t n = (int64_t)((1ull << 32) / STEP) + 1 + n_edges;
  float *xs = malloc(sizeof(float) * (size_t)n);
  cr_assert_not_null(xs);
  int64_t m = 0;
  for (uint64_t b = 0; b < (1ull << 32); b += STEP) {
    uint32_t u = (uint32_t)b;
    memcpy(&xs[m++], &u, sizeof u);
  }
  for (int i = 0; i < n_edges; i++) xs[m++] = edges[i];
  em_tensor *x = em_from_data(xs, EM_F32, EM_SHAPE(m));
  em_tensor *shifted = em_from_data(xs + 1, EM_F32, EM_SHAPE(m - 1));
  free(xs);
  ind_stats st;
  ir_graph *g;
  em_tensor *got[3], *gots[3];
  ind_program *p = compile_traced(tanh_and_erf, (em_tensor *[]){x}, 1, NULL, &st, &g);
  cr_assert(ind_run(p, (em_tensor *[]){x}, 1, got, NULL, EM_HERE), "%s", em_last_error());
  ind_free(p), ir_graph_free(g);
  p = compile_traced(tanh_and_erf, (em_tensor *[]){shifted}, 1, NULL, &st, &g);
  cr_assert(ind_run(p, (em_tensor *[]){shifted}, 1, gots, NULL, EM_HERE), "%s", em_last_error());
  ind_free(p), ir_graph_free(g);
  em_tensor *want[3] = {em_tanh(x), em_erf(x), em_exp(x)};
  size_t bytes = sizeof(float) * (size_t)m;
  float *in = malloc(bytes), *a = malloc(bytes), *e = malloc(bytes), *s = malloc(bytes);
  cr_assert(in && a && e && s);
  cr_assert(em_to_buffer(x, EM_F32, in, bytes));
  static const char *const names[] = {"tanh", "erf", "exp"};
  for (int f = 0; f < 3; f++) {
    rt_scope_add(got[f], "test", EM_HERE), rt_scope_add(gots[f], "test", EM_HERE);
    cr_assert(em_to_buffer(got[f], EM_F32, a, bytes));
    cr_assert(em_to_buffer(want[f], EM_F32, e, bytes));
    cr_assert(em_to_buffer(gots[f], EM_F32, s, sizeof(float) * (size_t)(m - 1)));
    double max_abs = 0, max_ulp = 0, max_tol = 0;
    for (int64_t i = 0; i < m; i++) {
      if (i + 1 < m) cr_assert(memcmp(&s[i], &a[i + 1], sizeof(float)) == 0, "%s(%a): %a in one place, %a in another",
                               names[f], (double)in[i + 1], (double)s[i], (double)a[i + 1]);
      if (isnan(in[i])) {
        cr_assert(isnan(a[i]), "%s(nan) is %g", names[f], (double)a[i]);
        continue;
      }
      cr_assert(!isnan(a[i]), "%s(%a) is nan", names[f], (double)in[i]);
      if (f == 2) {
        cr_assert(memcmp(&a[i], &e[i], sizeof(float)) == 0, "exp(%a) is %a, eager %a", (double)in[i], (double)a[i],
                  (double)e[i]);
        continue;
      }
      double d = fabs((double)a[i] - e[i]);
      if (d > max_abs) max_abs = d;
      if (fabsf(e[i]) >= 0x1p-126f && d / ulp_of(e[i]) > max_ulp) max_ulp = d / ulp_of(e[i]);
      if (d / (1e-5 + 1.3e-6 * fabs(e[i])) > max_tol) max_tol = d / (1e-5 + 1.3e-6 * fabs(e[i]));
      cr_assert(d <= 5e-7, "%s(%a) is %.9g, eager %.9g", names[f], (double)in[i], (double)a[i], (double)e[i]);
      if (isinf(in[i]))
        cr_assert(a[i] == (in[i] > 0 ? 1.0f : -1.0f), "%s(%g) is %g", names[f], (double)in[i], (double)a[i]);
      if (in[i] == 0 || (f == 0 && fabsf(in[i]) < 0.0004f))
        cr_assert(memcmp(&a[i], &in[i], sizeof(float)) == 0, "%s(%a) is %a", names[f], (double)in[i], (double)a[i]);
    }
    cr_assert_leq(max_ulp, 8, "%s: %.2f ULP from eager", names[f], max_ulp);
    cr_assert_lt(max_tol, 0.05, "%s: %.4f of torch's tolerance", names[f], max_tol);
    cr_log_info("%s: %.3g absolute, %.2f ULP, %.4f of torch's tolerance from eager", names[f], max_abs, max_ulp,
                max_tol);
  }
  /* odd: f(-x) is -f(x) bit for bit */
  em_tensor *nx = em_neg(x), *gotn[3];
  p = compile_traced(tanh_and_erf, (em_tensor *[]){nx}, 1, NULL, &st, &g);
  cr_assert(ind_run(p, (em_tensor *[]){nx}, 1, gotn, NULL, EM_HERE), "%s", em_last_error());
  ind_free(p), ir_graph_free(g);
  for (int f = 0; f < 3; f++) {
    rt_scope_add(gotn[f], "test", EM_HERE);
    if (f == 2) continue; /* exp is not odd */
    cr_assert(em_to_buffer(got[f], EM_F32, a, bytes));
    cr_assert(em_to_buffer(gotn[f], EM_F32, s, bytes));
    for (int64_t i = 0; i < m; i++)
      cr_assert(isnan(in[i]) || a[i] == -s[i], "%s(%a) is %a, of its negation %a", names[f], (double)in[i], (double)a[i],
                (double)s[i]);
  }
  free(in), free(a), free(e), free(s);
}

/* ---- softmax's row kernel on rows eager handles specially ----
 * Rows with -inf entries, all -inf (0/0: NaN in both), a NaN, +inf (NaN), very large and very
 * small values, rows longer than a vector and shorter, both lanes' widths' tails: the row
 * kernel (max, exp(x - max) summed, divided) against eager's softmax and log_softmax. */
static int softmax_rows(em_tensor *const *in, em_tensor **out, void *ctx) {
  out[0] = em_softmax(in[0], 1);
  out[1] = em_log_softmax(in[0], 1);
  return 2;
}

ETEST(inductor, softmax_rows_with_infinities_nan_and_large_values) {
  static const int64_t cols[] = {1, 7, 16, 67, 1000};
  for (int ci = 0; ci < 5; ci++) {
    int64_t C = cols[ci], R = 9;
    float *v = malloc(sizeof(float) * (size_t)(R * C));
    cr_assert_not_null(v);
    for (int64_t r = 0; r < R; r++)
      for (int64_t j = 0; j < C; j++) {
        float x = (float)sin((double)(r * C + j)) * 4;
        switch (r) {
        case 1: x = j % 3 == 0 ? -INFINITY : x; break;        /* some -inf */
        case 2: x = -INFINITY; break;                          /* all -inf */
        case 3: x = j == C / 2 ? NAN : x; break;               /* a NaN */
        case 4: x = j == C - 1 ? INFINITY : x; break;          /* +inf */
        case 5: x = x * 1e37f; break;                          /* huge, both signs */
        case 6: x = 80 + x; break;                             /* exp(x) alone would overflow */
        case 7: x = -1e30f + x; break;                         /* very negative, exp underflows */
        case 8: x = j == 0 ? 100 : -100; break;                /* one dominant entry */
        default: break;
        }
        v[r * C + j] = x;
      }
    em_tensor *x = em_from_data(v, EM_F32, EM_SHAPE(R, C));
    free(v);
    char what[64];
    snprintf(what, sizeof what, "softmax over rows of %lld", (long long)C);
    ind_stats st;
    check(softmax_rows, (em_tensor *[]){x}, NULL, &st, what);
    cr_assert_geq(st.kernels, 1, "%s: compiled", what);
  }
}

/* ---- random values inside generated kernels (issue 20) ---- */

typedef struct rand_case {
  em_dtype dt;
  bool normal;
  int ndim;
  int64_t sizes[3];
} rand_case;

/* A random tensor of x's shape fused with arithmetic on x and a broadcast row b (which keeps the
 * kernel's rows apart, so vectors start at every flat index modulo 4), and dropout of x
 * (uniform, mask, scale) beside it. */
static int random_chain(em_tensor *const *in, em_tensor **out, void *ctx) {
  const rand_case *rc = ctx;
  em_tensor *x = in[0];
  em_tensor *r = rc->normal ? em_randn(rc->dt, rc->ndim, rc->sizes) : em_rand(rc->dt, rc->ndim, rc->sizes);
  out[0] = em_add(em_add(em_mul_scalar(x, 2), r), in[1]);
  out[1] = em_dropout(em_neg(x), 0.3, true);
  return 2;
}

/* Traces random_chain on in (x, b) into a graph compiled by the inductor. */
static ind_program *compile_random_chain(em_tensor **in, rand_case *rc, ir_graph **gp, em_tensor **gin) {
  int n_in;
  ir_graph *g = trace_graph(random_chain, in, rc, gin, &n_in);
  cr_assert_eq(n_in, 2);
  char err[256];
  ind_program *p = ind_compile(g, gin, NULL, err, sizeof err);
  cr_assert_not_null(p, "%s", err);
  *gp = g;
  return p;
}

/* Uniform and normal, f32 and f64, over sizes that are not multiples of the vector lanes (one
 * element, a tail only, primes, a 3-d shape, 90,300 elements split across threads), x read
 * contiguous or through a transpose (a gathered flat kernel): the values computed inside the
 * kernels are eager's bits, the generator advances as eager's, the next call draws others. */
ETEST(inductor, random_values_inside_kernels_are_eagers_bits) {
  static const int64_t shapes[][3] = {{1}, {7}, {37, 29}, {3, 5, 17}, {300, 301}};
  static const int ndims[] = {1, 1, 2, 3, 2};
  for (int s = 0; s < 5; s++)
    for (int m = 0; m < 4; m++) {
      em_scope_begin();
      rand_case rc = {m & 1 ? EM_F64 : EM_F32, m >= 2, ndims[s], {shapes[s][0], shapes[s][1], shapes[s][2]}};
      int nd = rc.ndim;
      int64_t rev[3];
      for (int d = 0; d < nd; d++) rev[d] = rc.sizes[nd - 1 - d];
      bool transposed = (s + m) % 2;
      em_tensor *x = transposed ? em_randn(rc.dt, nd, rev) : em_randn(rc.dt, nd, rc.sizes);
      if (transposed && nd == 3) x = em_permute(x, 3, (int64_t[]){2, 1, 0});
      else if (transposed && nd == 2) x = em_transpose(x, 0, 1);
      em_tensor *in[2] = {x, em_randn(rc.dt, 1, &rc.sizes[nd - 1])}, *gin[16];
      ir_graph *g;
      ind_program *p = compile_random_chain(in, &rc, &g, gin);
      const char *text = ind_schedule(p);
      cr_assert(text && !strstr(text, "philox_uniform (eager") && !strstr(text, "philox_normal (eager"),
                "the random nodes run inside kernels:\n%s", text);
      ind_stats st = ind_program_stats(p);
      cr_assert_eq(st.kernels, 1, "case %d/%d: one kernel holds both chains:\n%s", s, m, text);
      em_tensor *want[2], *got[2], *again[2];
      uint64_t s0, o0, s1, o1;
      em_manual_seed(90 + s);
      random_chain(in, want, &rc);
      em_rng_get_state(&s0, &o0);
      em_manual_seed(90 + s);
      cr_assert(ind_run_rng(p, gin, 2, got, NULL, NULL, EM_HERE), "%s", em_last_error());
      em_rng_get_state(&s1, &o1);
      cr_assert_eq(o1, o0, "the generator advanced by %llu, eager by %llu", (unsigned long long)o1, (unsigned long long)o0);
      for (int i = 0; i < 2; i++) {
        rt_scope_add(got[i], "test", EM_HERE);
        EXPECT_SAME_BITS(got[i], want[i], i ? "dropout" : "random values");
      }
      cr_assert(ind_run_rng(p, gin, 2, again, NULL, NULL, EM_HERE), "%s", em_last_error());
      for (int i = 0; i < 2; i++) rt_scope_add(again[i], "test", EM_HERE);
      int64_t n = em_numel(want[0]);
      if (n > 1) {
        double d = em_item(em_amax(em_abs(em_sub(got[0], again[0])), 0, NULL, false));
        cr_assert_gt(d, 0, "case %d/%d: the second call drew the same values", s, m);
      }
      /* the counters are arguments, not code: the same graph compiled again is a cache hit */
      ind_cache_stats c0 = ind_cache_counters();
      char err[256];
      ind_program *p2 = ind_compile(g, gin, NULL, err, sizeof err);
      cr_assert_not_null(p2, "%s", err);
      ind_cache_stats c1 = ind_cache_counters();
      cr_assert(c1.misses == c0.misses && c1.memory_hits == c0.memory_hits + 1, "the kernels came from the cache");
      ind_free(p2);
      ind_free(p);
      ir_graph_free(g);
      em_scope_end();
    }
}

/* An MLP with dropout on its hidden layer (params w1, b1, w2, b2): the loss and the dropped
 * activations. */
static em_outputs drop_mlp_loss(void *ctx, em_tensor *const *in, int n) {
  em_tensor **p = ((net *)ctx)->params;
  em_tensor *h = em_dropout(em_relu(em_linear(in[0], p[0], p[1])), 0.4, true);
  em_tensor *l = em_cross_entropy(em_linear(h, p[2], p[3]), in[1], EM_CROSS_ENTROPY_DEFAULT);
  return EM_OUTPUTS(l, h);
}

/* The MLP's parameters (the same for the same generator state), kept beyond the scope. */
static void drop_mlp_init(net *m) {
  memset(m, 0, sizeof *m);
  m->params[0] = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(40, 20)), 0.3);
  m->params[1] = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(40)), 0.1);
  m->params[2] = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(6, 40)), 0.3);
  m->params[3] = em_zeros(EM_F32, EM_SHAPE(6));
  for (int i = 0; i < 4; i++) m->params[i] = em_keep(em_requires_grad_(m->params[i], true));
  m->n_params = 4;
}

static int random_kernels, random_eager;
/* Counts compiled programs whose schedule holds a random node inside a kernel, or on its own. */
static void count_random_kernels(const char *graph, const ind_program *p) {
  const char *s = ind_schedule(p);
  for (const char *l = s; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    const char *e = strchr(l, '\n') ? strchr(l, '\n') : l + strlen(l);
    const char *k = strstr(l, "kernel over"), *r = strstr(l, "philox_");
    if (r && r < e) {
      if (k && k < r) random_kernels++;
      else if (strstr(l, "(eager kernel") && strstr(l, "(eager kernel") < e) random_eager++;
    }
  }
}

/* A few training steps of the MLP with dropout, forward compiled by the default backend (AOT:
 * forward and backward graphs as generated kernels, the backward replaying the forward's mask
 * through its rng slot), SGD eager, against the same steps run eagerly with the same seed each
 * step: the first step's dropped activations are eager's bits, every later step's masks are
 * eager's (the parameters differ in the last bits: kernels sum bias gradients in another order),
 * losses and parameters agree within 1e-5; the dropout ran inside the forward's kernel; two
 * calls without reseeding draw different masks. */
ETEST(inductor, dropout_training_steps_match_eager) {
  net m[2];
  em_optimizer *opt[2];
  em_manual_seed(17);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(24, 20)), *y = em_randint(0, 6, EM_SHAPE(24));
  for (int k = 0; k < 2; k++) {
    em_manual_seed(18);
    drop_mlp_init(&m[k]);
    opt[k] = em_sgd_new(4, m[k].params, ((em_sgd_opts){0.1, 0.9, 0, 0, false}));
  }
  em_compiled *c = em_compile(drop_mlp_loss, &(em_compile_options){.name = "dropout_mlp"});
  cr_assert_not_null(c, "%s", em_last_error());
  ind_set_compiled_hook(count_random_kernels); /* em_compile installed the frontend's; ours until the next */
  random_kernels = random_eager = 0;
  for (int step = 0; step < 4; step++) {
    em_scope_begin();
    em_tensor *h[2];
    double l[2];
    for (int k = 0; k < 2; k++) {
      em_manual_seed(700 + step);
      em_outputs o = k ? em_call(c, &m[k], x, y) : drop_mlp_loss(&m[k], (em_tensor *[]){x, y}, 2);
      cr_assert_not_null(o.t[0], "%s", em_last_error());
      l[k] = em_item(o.t[0]), h[k] = o.t[1];
      em_optimizer_zero_grad(opt[k]);
      cr_assert(em_backward(o.t[0], NULL), "%s", em_last_error());
      cr_assert(em_optimizer_step(opt[k]), "%s", em_last_error());
    }
    if (step == 0) EXPECT_SAME_BITS(h[1], h[0], "dropped activations");
    EXPECT_SAME_BITS(em_eq_scalar(h[1], 0), em_eq_scalar(h[0], 0), "dropout mask");
    expect_close(h[1], h[0], 1e-5, "dropped activations at step", step);
    cr_assert(fabs(l[1] - l[0]) <= 1e-5 * fabs(l[0]), "step %d: loss %.9g, eager %.9g", step, l[1], l[0]);
    em_scope_end();
  }
  for (int i = 0; i < 4; i++) expect_close(m[1].params[i], m[0].params[i], 1e-5, "parameter", i);
  em_compile_stats st = em_compiled_stats(c);
  cr_assert_eq(st.inductor_fallbacks, 0);
  cr_assert_gt(st.kernel_runs, 4, "the forward and backward ran as generated kernels");
  cr_assert_gt(random_kernels, 0, "the dropout's uniform ran inside a generated kernel");
  cr_assert_eq(random_eager, 0, "no random node ran op by op");
  /* two calls, one generator: other masks */
  em_scope_begin();
  em_tensor *a = em_call(c, &m[1], x, y).t[1], *b = em_call(c, &m[1], x, y).t[1];
  cr_assert_gt(em_item(em_sum(em_ne(em_eq_scalar(a, 0), em_eq_scalar(b, 0)), 0, NULL, false)), 0, "the masks differ");
  em_scope_end();
  em_compiled_free(c);
  for (int k = 0; k < 2; k++) em_optimizer_free(opt[k]);
}

/* The same steps compiled whole (train_step: the mask's uniform in the graph beside its use in
 * the backward, parameters updated in place by the kernels): losses and parameters within 1e-5
 * of eager's (another mask would move the loss by far more). */
ETEST(inductor, whole_dropout_training_step_matches_eager) {
  trainer t[2];
  em_manual_seed(17);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(24, 20)), *y = em_randint(0, 6, EM_SHAPE(24));
  for (int k = 0; k < 2; k++) {
    em_manual_seed(18);
    t[k].loss_fn = drop_mlp_loss;
    drop_mlp_init(&t[k].m);
    t[k].opt = em_sgd_new(4, t[k].m.params, ((em_sgd_opts){0.1, 0.9, 0, 0, false}));
  }
  em_compiled *c = em_compile(train_step, &(em_compile_options){.name = "dropout_step"});
  for (int step = 0; step < 5; step++) {
    em_scope_begin();
    double l[2];
    for (int k = 0; k < 2; k++) {
      em_manual_seed(900 + step);
      em_tensor *o = k ? em_call(c, &t[k], x, y).t[0] : train_step(&t[k], (em_tensor *[]){x, y}, 2).t[0];
      cr_assert_not_null(o, "%s", em_last_error());
      l[k] = em_item(o);
    }
    cr_assert(fabs(l[1] - l[0]) <= 1e-5 * fabs(l[0]), "step %d: loss %.9g, eager %.9g", step, l[1], l[0]);
    em_scope_end();
  }
  for (int i = 0; i < 4; i++) expect_close(t[1].m.params[i], t[0].m.params[i], 1e-5, "parameter", i);
  em_compile_stats st = em_compiled_stats(c);
  cr_assert(st.kernel_runs > 5 && st.inductor_fallbacks == 0, "compiled: %lld kernel runs", (long long)st.kernel_runs);
  em_compiled_free(c);
  for (int k = 0; k < 2; k++) em_optimizer_free(t[k].opt);
}

/* A draw nothing reads, then dropout: no kernel computes the unused values, but their counters
 * are still taken, so the dropout's mask and the generator's offset are eager's. */
static em_outputs unused_draw(void *ctx, em_tensor *const *in, int n) {
  em_rand(EM_F32, EM_SHAPE(100));
  return EM_OUTPUTS(em_dropout(in[0], 0.5, true));
}

ETEST(inductor, unused_random_values_still_take_their_counters) {
  em_tensor *x = em_ones(EM_F32, EM_SHAPE(40));
  em_compiled *c = em_compile(unused_draw, NULL);
  for (int i = 0; i < 3; i++) {
    em_scope_begin();
    uint64_t s0, o0, s1, o1;
    em_manual_seed(60 + i);
    em_tensor *want = unused_draw(NULL, &x, 1).t[0];
    em_rng_get_state(&s0, &o0);
    em_manual_seed(60 + i);
    em_tensor *got = em_call(c, NULL, x).t[0];
    em_rng_get_state(&s1, &o1);
    cr_assert_not_null(got, "%s", em_last_error());
    EXPECT_SAME_BITS(got, want, "dropout after an unused draw");
    cr_assert_eq(o1, o0, "the generator advanced by %llu, eager by %llu", (unsigned long long)o1, (unsigned long long)o0);
    em_scope_end();
  }
  em_compile_stats st = em_compiled_stats(c);
  cr_assert(st.kernel_runs > 0 && st.inductor_fallbacks == 0, "compiled");
  em_compiled_free(c);
}

/* Fuzz program 2065, reached once graphs with dropout compiled: add(mm, mm) where the product
 * is a row ([1, 1, N]) took the product as its own epilogue bias, before it existed. */
static em_outputs product_twice(void *ctx, em_tensor *const *in, int n) {
  em_tensor *v = em_sigmoid(in[0]);
  em_tensor *mm = em_matmul(em_transpose(v, 1, 2), v);
  return EM_OUTPUTS(em_add(mm, mm));
}

ETEST(inductor, a_product_added_to_itself_is_no_bias_epilogue) {
  em_manual_seed(1);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(1, 4, 1));
  em_compiled *c = em_compile(product_twice, NULL);
  em_tensor *got = em_call(c, NULL, x).t[0];
  cr_assert_not_null(got, "%s", em_last_error());
  EXPECT_SAME_BITS(got, product_twice(NULL, &x, 1).t[0], "2 (a b)");
  em_compiled_free(c);
}

/* ---- combo kernels (issue 20): independent pointwise kernels run as one ---- */

/* Two runs of independent pointwise kernels over different shapes, the second reading the
 * first's output through a broadcast view: A (x [4,8]) and B (v [5,3]) combine; C (over [2,4,8],
 * reading y through the view) depends on A and starts a new combo with D (v again). */
static int combo_pairs(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0], *v = in[1], *w = in[2];
  out[0] = em_mul_scalar(em_exp(x), 2);                                              /* A */
  out[1] = em_add_scalar(em_sqrt(em_abs(v)), 1);                                     /* B */
  out[2] = em_add(em_expand(em_unsqueeze(out[0], 0), 3, (int64_t[]){2, 4, 8}), w);    /* C reads A's y */
  out[3] = em_mul_scalar(em_neg(v), 3);                                              /* D */
  return 4;
}

ETEST(inductor, dependent_kernels_are_not_combined) {
  em_manual_seed(71);
  em_tensor *in[3] = {em_randn(EM_F32, EM_SHAPE(4, 8)), em_randn(EM_F32, EM_SHAPE(5, 3)), em_randn(EM_F32, EM_SHAPE(2, 4, 8))};
  ind_stats st;
  check(combo_pairs, in, NULL, &st, "combo pairs");
  cr_assert_eq(st.kernels, 4, "%d kernels", st.kernels);
  cr_assert_eq(st.combo_kernels, 2, "A + B and C + D, not one of all four: %d combo kernels", st.combo_kernels);
  cr_assert_eq(st.combo_parts, 4, "%d parts", st.combo_parts);
  setenv("EMBER_INDUCTOR_COMBO", "0", 1);
  check(combo_pairs, in, NULL, &st, "combo pairs, EMBER_INDUCTOR_COMBO=0");
  unsetenv("EMBER_INDUCTOR_COMBO");
  cr_assert_eq(st.kernels, 4, "%d kernels", st.kernels);
  cr_assert_eq(st.combo_kernels, 0, "EMBER_INDUCTOR_COMBO=0: %d combo kernels", st.combo_kernels);
}

/* Parameters of four shapes, each with its own loss term. */
typedef struct combo_trainer {
  em_tensor *p[4];
  em_optimizer *opt;
} combo_trainer;

static em_outputs combo_train_step(void *ctx, em_tensor *const *in, int n) {
  combo_trainer *t = ctx;
  em_tensor *loss = NULL;
  em_optimizer_zero_grad(t->opt);
  for (int i = 0; i < 4; i++) {
    em_tensor *l = em_sum(em_mul(em_tanh(t->p[i]), in[i]), 0, NULL, false);
    loss = loss ? em_add(loss, l) : l;
  }
  if (!loss || !em_backward(loss, NULL) || !em_optimizer_step(t->opt)) return EM_OUTPUTS(NULL);
  return EM_OUTPUTS(loss);
}

/* A compiled training step updating four parameters of different shapes with opt_kind's
 * optimizer (0 SGD with momentum, 1 AdamW): the updates run as one combo kernel a step (the
 * optimizer's scalar work, such as AdamW's bias corrections, scheduled first), the parameters
 * equal eager's after every step, and with EMBER_INDUCTOR_COMBO=0 each update is its own kernel
 * again: three kernel runs more a step. */
static void compiled_updates_combine(int opt_kind) {
  static const int64_t shapes[4][2] = {{64, 33}, {33, 1}, {7, 5}, {128, 17}};
  em_tensor *x[4];
  em_manual_seed(72);
  for (int i = 0; i < 4; i++) x[i] = em_randn(EM_F32, 2, shapes[i]);
  int64_t runs[2] = {0}, combos[2] = {0};
  for (int off = 0; off < 2; off++) {
    if (off) setenv("EMBER_INDUCTOR_COMBO", "0", 1);
    combo_trainer t[2];
    for (int k = 0; k < 2; k++) {
      em_manual_seed(73);
      for (int i = 0; i < 4; i++) t[k].p[i] = em_requires_grad_(em_randn(EM_F32, 2, shapes[i]), true);
      t[k].opt = opt_kind ? em_adamw_new(4, t[k].p, EM_ADAMW_DEFAULT(1e-2))
                          : em_sgd_new(4, t[k].p, ((em_sgd_opts){0.05, 0.9, 0, 0, false}));
    }
    em_compiled *c = em_compile(combo_train_step, &(em_compile_options){.name = "combo_step"});
    for (int step = 0; step < 5; step++) {
      em_scope_begin();
      em_compile_stats s0 = em_compiled_stats(c);
      em_tensor *le = combo_train_step(&t[0], x, 4).t[0], *lc = em_call_n(c, &t[1], 4, x).t[0];
      cr_assert(le && lc, "%s", em_last_error());
      em_compile_stats s1 = em_compiled_stats(c);
      if (step == 4) runs[off] = s1.kernel_runs - s0.kernel_runs, combos[off] = s1.combo_kernel_runs - s0.combo_kernel_runs;
      for (int i = 0; i < 4; i++) expect_close(t[1].p[i], t[0].p[i], 1e-5, "parameter", i);
      em_scope_end();
    }
    cr_assert_eq(em_compiled_stats(c).inductor_fallbacks, 0);
    em_compiled_free(c);
    for (int k = 0; k < 2; k++) em_optimizer_free(t[k].opt);
  }
  unsetenv("EMBER_INDUCTOR_COMBO");
  cr_assert_eq(combos[0], 1, "%s: the four updates run as %lld combo kernels a step", opt_kind ? "AdamW" : "SGD",
               (long long)combos[0]);
  cr_assert_eq(combos[1], 0, "EMBER_INDUCTOR_COMBO=0: %lld combo kernels", (long long)combos[1]);
  cr_assert_eq(runs[1], runs[0] + 3, "%s: %lld kernel runs a step without combo kernels, %lld with",
               opt_kind ? "AdamW" : "SGD", (long long)runs[1], (long long)runs[0]);
}

ETEST(inductor, compiled_sgd_updates_run_as_one_combo_kernel) { compiled_updates_combine(0); }
ETEST(inductor, compiled_adamw_updates_run_as_one_combo_kernel) { compiled_updates_combine(1); }

/* Parts large enough to split across threads: one long row (split by columns, odd length), a
 * transposed input (split by rows), and a small part batched with the pieces around it. */
static int combo_large(em_tensor *const *in, em_tensor **out, void *ctx) {
  out[0] = em_mul_scalar(em_exp(in[0]), 2);
  out[1] = em_add_scalar(em_sqrt(em_abs(in[1])), 1);
  out[2] = em_mul_scalar(em_neg(in[2]), 3);
  return 3;
}

ETEST(inductor, combo_kernels_split_large_parts_like_eager) {
  em_manual_seed(74);
  em_tensor *in[3] = {em_randn(EM_F32, EM_SHAPE(3, 70001)), em_transpose(em_randn(EM_F32, EM_SHAPE(257, 300)), 0, 1),
                      em_randn(EM_F32, EM_SHAPE(5, 3))};
  int threads = em_get_num_threads();
  for (int nt = 1; nt <= 4; nt *= 2) { /* one thread: the parts in turn; more: pieces across them */
    em_set_num_threads(nt);
    ind_stats st;
    char what[64];
    snprintf(what, sizeof what, "combo of large parts, %d threads", nt);
    cr_assert_eq(check(combo_large, in, NULL, &st, what), 3, "%s: bit-identical to eager", what);
    cr_assert_eq(st.combo_kernels, 1, "%s: %d combo kernels", what, st.combo_kernels);
    cr_assert_eq(st.combo_parts, 3, "%s: %d parts", what, st.combo_parts);
  }
  em_set_num_threads(threads);
}

/* Sixty one-element results of twelve one-element inputs, each with its own constant: one
 * iteration space, but more buffers than a kernel takes (a compiled AdamW step over the
 * transformer's 30 parameters, its scalar work scheduled first, made a kernel of 150 buffers
 * that the code generator refused: the whole step ran op by op). The group closes in time. */
static int many_scalars(em_tensor *const *in, em_tensor **out, void *ctx) {
  for (int k = 0; k < 60; k++) out[k] = em_add(em_mul_scalar(in[k % 12], 1.0 + k / 64.0), in[(k + 5) % 12]);
  return 60;
}

ETEST(inductor, kernels_stay_within_their_buffers) {
  em_manual_seed(75);
  em_tensor *in[12];
  for (int i = 0; i < 12; i++) in[i] = em_randn(EM_F32, EM_SHAPE(1));
  ind_stats st;
  check(many_scalars, in, NULL, &st, "sixty scalar results");
  cr_assert_geq(st.kernels, 2, "%d kernels", st.kernels);
}
