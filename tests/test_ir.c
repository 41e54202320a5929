/* tests/test_ir.c: the graph IR: text round trip for every prim, parser errors, the verifier's
 * rejections, each rewrite rule, DCE / CSE / folding, DOT export, symbolic sizes, and the
 * random-program differential test: trace -> print -> parse -> interpret (and optimise ->
 * interpret) equals eager, bit for bit, on 1000 seeded programs (EMBER_RANDOM_PROGRAMS=N for
 * more). */
#define _POSIX_C_SOURCE 200809L /* getenv */
#include "common.h"
#include "../runtime/rt.h"
#include "../ir/graph.h"

static bool refuse_break(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) {
  cr_assert_fail("unexpected graph break: %s %s at %s:%d", op, reason, site.file, site.line);
  return false;
}

/* Traces build(in, out) on real inputs; returns a copy of the graph with outs as its outputs.
 * gin receives the graph's inputs: the real tensors in the order the trace lifted them. */
typedef int (*builder)(em_tensor *const *in, em_tensor **out, void *ctx);
static ir_graph *trace(builder build, em_tensor *const *in, void *ctx, em_tensor **gin) {
  rt_trace tr;
  cr_assert(rt_trace_begin(&tr, "traced", refuse_break, NULL, EM_HERE));
  em_scope_begin();
  em_tensor *out[64];
  int n = build(in, out, ctx);
  for (int i = 0; i < n; i++) {
    cr_assert_not_null(out[i], "output %d: %s", i, em_last_error() ? em_last_error() : "");
    int v = rt_trace_value_of(&tr, out[i]);
    cr_assert_geq(v, 0, "output %d is not a proxy", i);
    cr_assert(ir_add_output(tr.g, v));
  }
  ir_graph *g = ir_graph_clone(tr.g);
  for (int i = 0; i < tr.n_lifted; i++) gin[i] = tr.lifted[i];
  em_scope_end();
  rt_trace_end(&tr);
  cr_assert_not_null(g);
  cr_assert(ir_graph_compact(g, NULL, NULL));
  return g;
}


/* Runs g on inputs and hands the outputs to the current scope. */
static void run(const ir_graph *g, em_tensor *const *in, int n_in, em_tensor **out) {
  cr_assert(rt_interpret(g, in, n_in, out, NULL, EM_HERE), "%s", em_last_error() ? em_last_error() : "");
  for (int i = 0; i < g->n_outputs; i++) out[i] = rt_scope_add(out[i], "test", EM_HERE);
}

static ir_graph *parse_ok(const char *text) {
  char err[256];
  ir_graph *g = ir_parse(text, err, sizeof err);
  cr_assert_not_null(g, "parse failed: %s\n%s", err, text);
  return g;
}

/* ---- every prim ---- */

static int every_prim(em_tensor *const *in, em_tensor **out, void *ctx) {
  em_tensor *x = in[0], *y = in[1], *img = in[2], *w = in[3], *idx = in[4];
  int n = 0;
  em_tensor *(*un[])(em_tensor *, em_site) = {em_neg_at, em_abs_at, em_exp_at, em_log_at, em_log1p_at, em_expm1_at,
                                               em_sqrt_at, em_rsqrt_at, em_sin_at, em_cos_at, em_tanh_at, em_erf_at,
                                               em_sign_at, em_floor_at, em_ceil_at, em_reciprocal_at};
  for (size_t i = 0; i < sizeof un / sizeof un[0]; i++) out[n++] = un[i](x, EM_HERE);
  em_tensor *(*bin[])(em_tensor *, em_tensor *, em_site) = {em_add_at, em_sub_at, em_mul_at, em_div_at, em_pow_at,
                                                              em_maximum_at, em_minimum_at, em_remainder_at, em_atan2_at};
  for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++) out[n++] = bin[i](x, y, EM_HERE);
  em_tensor *c = em_gt(x, y);
  out[n++] = em_logical_or(em_logical_and(c, em_le(x, y)), em_logical_not(em_eq(x, y)));
  out[n++] = em_logical_and(em_ne(x, y), em_logical_or(em_lt(x, y), em_ge(x, y)));
  out[n++] = em_where(c, x, y);
  out[n++] = em_cast(x, EM_F64);
  out[n++] = em_sum(x, EM_AXES(1), true);
  out[n++] = em_prod(x, EM_AXES(0), false);
  out[n++] = em_amax(x, EM_AXES(1), false);
  out[n++] = em_amin(x, EM_AXES(0, 1), false);
  out[n++] = em_argmax(x, 1, false);
  out[n++] = em_argmin(x, 0, true);
  out[n++] = em_reshape(em_transpose(x, 0, 1), EM_SHAPE(12)); /* permute, clone, reshape */
  out[n++] = em_expand(em_slice(x, 1, 1, 4, 2), EM_SHAPE(2, 3, 2));
  out[n++] = em_squeeze(em_unsqueeze(x, 1), EM_AXES(1));
  out[n++] = em_detach(x);
  out[n++] = em_flip(x, EM_AXES(0, 1));
  out[n++] = em_pad(x, EM_AXES(1, 2, 0, 1), -1.5);
  out[n++] = em_cat(2, ((em_tensor *[]){x, y}), 0);
  out[n++] = em_slice_scatter(x, em_slice(y, 0, 0, 1, 1), 0, 1, 2, 1);
  out[n++] = em_gather(x, 1, em_slice(idx, 1, 0, 2, 1));
  out[n++] = em_index_select(x, 1, em_reshape(em_slice(idx, 0, 0, 1, 1), EM_SHAPE(4)));
  out[n++] = em_scatter_add(x, 1, idx, y);
  out[n++] = em_full(EM_I32, EM_SHAPE(2, 2), 7);
  out[n++] = em_arange(EM_F32, 0.5, 3, 0.5);
  out[n++] = em_rand(EM_F32, EM_SHAPE(5));
  out[n++] = em_randn(EM_F64, EM_SHAPE(3));
  out[n++] = em_matmul(x, em_transpose(y, 0, 1));
  out[n++] = em_cumsum(x, 1);
  out[n++] = em_cumprod(idx, 0);
  out[n++] = em_argsort(x, -1, true);
  em_conv2d_params p = {{2, 1}, {1, 0}, {1, 2}, 1};
  em_tensor *conv = em_conv2d(img, w, EM_NONE, p);
  out[n++] = conv;
  out[n++] = em_conv2d_backward_input(conv, w, ((int64_t[]){5, 6}), p);
  out[n++] = em_conv2d_backward_weight(img, conv, ((int64_t[]){3, 2}), p);
  return n;
}

static void every_prim_inputs(em_tensor **in) {
  em_manual_seed(5);
  in[0] = em_randn(EM_F32, EM_SHAPE(3, 4));
  in[1] = em_randn(EM_F32, EM_SHAPE(3, 4));
  in[2] = em_randn(EM_F32, EM_SHAPE(2, 3, 5, 6));
  in[3] = em_randn(EM_F32, EM_SHAPE(4, 3, 3, 2));
  in[4] = em_randint(0, 4, EM_SHAPE(3, 4));
}

ETEST(ir, every_prim_round_trips_through_text) {
  em_tensor *in[5];
  every_prim_inputs(in);
  em_tensor *gin[8];
  ir_graph *g = trace(every_prim, in, NULL, gin);
  bool seen[EM_PRIM_COUNT] = {0};
  for (int i = 0; i < g->n_nodes; i++) seen[g->nodes[i].op] = true;
  for (int p = 0; p < EM_PRIM_COUNT; p++) cr_assert(seen[p], "the test does not cover prim %s", prim_get(p)->name);
  char err[512];
  cr_assert(ir_verify(g, 0, err, sizeof err), "%s", err);
  char *text = ir_print(g, true);
  ir_graph *h = parse_ok(text);
  cr_assert(ir_graph_same_structure(g, h), "parsed graph differs from the printed one:\n%s", text);
  char *again = ir_print(h, true);
  cr_assert_str_eq(again, text);
  cr_assert(strstr(text, "test_ir.c:"), "sites are printed");
  cr_assert_eq(h->nodes[0].site.line, g->nodes[0].site.line);
  cr_assert_str_eq(h->nodes[0].site.func, "every_prim");
  /* the parsed graph computes what the traced one does, bit for bit */
  em_tensor *a[64], *b[64];
  run(g, gin, g->n_inputs, a);
  run(h, gin, h->n_inputs, b);
  for (int i = 0; i < g->n_outputs; i++) EXPECT_SAME_BITS(a[i], b[i], "parsed vs traced");
  free(text), free(again);
  ir_graph_free(g), ir_graph_free(h);
}

ETEST(ir, dot_export_shows_kinds_and_shapes) {
  em_tensor *in[5];
  every_prim_inputs(in);
  em_tensor *gin[8];
  ir_graph *g = trace(every_prim, in, NULL, gin);
  char *dot = ir_to_dot(g);
  cr_assert(strstr(dot, "digraph \"traced\""));
  cr_assert(strstr(dot, "= matmul\\nf32[3,3]"), "%s", dot);
  cr_assert(strstr(dot, "fillcolor=\"#f4a582\""), "extern kernels are coloured");
  cr_assert(strstr(dot, "input 0\\n%0 : f32[3,4]"), "%s", dot);
  cr_assert(strstr(dot, "-> out0"));
  free(dot);
  ir_graph_free(g);
}

/* ---- parser errors ---- */

ETEST(ir, parse_errors_name_line_and_column) {
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"graph g(%0 : f32[3]) {\n  %1 : f32[3] = frobnicate(%0)\n  return %1\n}", "line 2, column 17: unknown prim 'frobnicate'"},
      {"graph g(%0 : f32[3]) {\n  %1 : f32[3] = neg(%7)\n  return %1\n}", "line 2, column 23: %7 is used before it is defined"},
      {"graph g(%0 : q8[3]) {\n  return %0\n}", "line 1, column 14: unknown dtype 'q8'"},
      {"graph g(%0 : f32[3]) {\n  %0 : f32[3] = neg(%0)\n  return %0\n}", "line 2, column 5: %0 is defined twice"},
      {"graph g(%0 : f32[3]) {\n  %1 : f32[3] = sum(%0, colour=red)\n  return %1\n}", "unknown attribute 'colour'"},
      {"graph g(%0 : f32[3]) {\n  return %0\n", "expected '}'"},
      {"graph g(%0 : f32[-3]) {\n  return %0\n}", "negative size -3"},
      {"graph g(%0 : f32[(s0^2)]) {\n  return %0\n}", "expected '+', '*' or '//'"},
      /* fuzz/fuzz_ir: a site's line past INT_MAX became -1, printed as ":-1", read back as a comment */
      {"graph g(%0 : f32[3]) {\n  %1 : f32[3] = neg(%0)  # a.c:66444444444444 f\n  return %1\n}",
       "line 2, column 32: line number out of range"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char err[256];
    ir_graph *g = ir_parse(cases[i].text, err, sizeof err);
    cr_assert_null(g, "case %zu parsed", i);
    cr_assert(strstr(err, cases[i].want), "case %zu: '%s' lacks '%s'", i, err, cases[i].want);
  }
}

/* ---- verifier ---- */

ETEST(ir, verifier_rejects_malformed_graphs) {
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"graph g(%0 : f32[3], %1 : f32[4]) {\n  %2 : f32[3] = add(%0, %1)\n  return %2\n}",
       "%2 = add(%0, %1): operands differ in shape"},
      {"graph g(%0 : f32[3]) {\n  %1 : f64[3] = neg(%0)\n  return %1\n}",
       "%1 = neg(%0): the result is declared f64[3] but neg gives f32[3]"},
      {"graph g(%0 : f32[3]) {\n  %1 : f32[3] = neg(%0, %0)\n  return %1\n}", "neg takes 1 operand, got 2"},
      {"graph g(%0 : f32[3,4]) {\n  %1 : f32[3] = sum(%0, axes=[5], keepdim=false)\n  return %1\n}", "%1 = sum(%0)"},
      {"graph g(%0 : i64[3]) {\n  %1 : i64[3] = exp(%0)\n  return %1\n}", "%1 = exp(%0)"},
      {"graph g(%0 : f32[3]) {\n  %1 : f32[3] = neg(%0)\n  %2 : f32[3] = exp(%0)\n  return %2\n}",
       "%1 = neg(%0): the result is never used (dead code)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ir_graph *g = parse_ok(cases[i].text);
    char err[512];
    cr_assert_not(ir_verify(g, IR_VERIFY_NO_DEAD, err, sizeof err), "case %zu verified", i);
    cr_assert(strstr(err, cases[i].want), "case %zu: '%s' lacks '%s'", i, err, cases[i].want);
    ir_graph_free(g);
  }
  /* structural damage the parser cannot produce: a dangling operand, use before definition,
   * an output that names nothing */
  ir_graph *g = parse_ok("graph g(%0 : f32[3]) {\n  %1 : f32[3] = neg(%0)\n  %2 : f32[3] = exp(%1)\n  return %2\n}");
  char err[512];
  cr_assert(ir_verify(g, IR_VERIFY_NO_DEAD, err, sizeof err), "%s", err);
  g->operands[g->nodes[1].in_at] = 9;
  cr_assert_not(ir_verify(g, 0, err, sizeof err));
  cr_assert(strstr(err, "operand 0 is %9, which does not exist (dangling)"), "%s", err);
  g->operands[g->nodes[1].in_at] = 1;
  g->operands[g->nodes[0].in_at] = 2;
  cr_assert_not(ir_verify(g, 0, err, sizeof err));
  cr_assert(strstr(err, "%1 = neg(%2): operand 0 (%2) is used before it is defined"), "%s", err);
  g->operands[g->nodes[0].in_at] = 0;
  g->outputs[0] = 7;
  cr_assert_not(ir_verify(g, 0, err, sizeof err));
  cr_assert(strstr(err, "output 0 names %7, which is not defined"), "%s", err);
  ir_graph_free(g);
}

/* Nodes carry canonical axes whatever their builder wrote (the inductor indexes arrays by them:
 * issue 15's negative-axis miscompile), and the verifier rejects a node whose axes were damaged
 * after it was added. */
ETEST(ir, nodes_carry_canonical_axes) {
  ir_graph *g = parse_ok("graph g(%0 : f32[3,4,5]) {\n  %1 : f32[3] = sum(%0, axes=[-1,1], keepdim=false)\n"
               "  %2 : f32[3,4,5] = flip(%0, axes=[2,-3])\n  %3 : f32[5,3,4] = permute(%0, axes=[-1,0,-2])\n"
               "  %4 : f32[3,4,5,1] = unsqueeze(%0, axes=[-1])\n  return %1, %2, %3, %4\n}");
  char err[512];
  cr_assert(ir_verify(g, 0, err, sizeof err), "%s", err);
  char *text = ir_print(g, false);
  cr_assert(strstr(text, "sum(%0, axes=[1,2]"), "%s", text);
  cr_assert(strstr(text, "flip(%0, axes=[0,2]"), "%s", text);
  cr_assert(strstr(text, "permute(%0, axes=[2,0,1]"), "%s", text);
  cr_assert(strstr(text, "unsqueeze(%0, axes=[3]"), "%s", text);
  free(text);
  g->nodes[0].attrs.axes[0] = -1;
  cr_assert_not(ir_verify(g, 0, err, sizeof err));
  cr_assert(strstr(err, "axis attributes are not canonical"), "%s", err);
  ir_graph_free(g);
}

/* ---- passes ---- */

/* Parses before, optimises, and expects the printed body (without sites) to equal after. */
static void expect_optimized(const char *before, const char *after) {
  ir_graph *g = parse_ok(before);
  char err[512];
  cr_assert(ir_verify(g, 0, err, sizeof err), "%s", err);
  ir_pass_stats st;
  cr_assert(ir_optimize(g, &st));
  cr_assert(ir_verify(g, IR_VERIFY_NO_DEAD, err, sizeof err), "%s", err);
  char *text = ir_print(g, false);
  cr_assert_str_eq(text, after, "optimising\n%s\ngave\n%s", before, text);
  free(text);
  ir_graph_free(g);
}

#define ONE_F32 "  %1 : f32[] = full(shape=[], dtype=f32, value=1)\n  %2 : f32[3] = expand(%1, shape=[3])\n"

ETEST(ir, each_rewrite_rule) {
  /* mul_one */
  expect_optimized("graph g(%0 : f32[3]) {\n" ONE_F32 "  %3 : f32[3] = mul(%2, %0)\n  return %3\n}",
                   "graph g(%0 : f32[3]) {\n  return %0\n}\n");
  /* div_one */
  expect_optimized("graph g(%0 : f32[3]) {\n" ONE_F32 "  %3 : f32[3] = div(%0, %2)\n  return %3\n}",
                   "graph g(%0 : f32[3]) {\n  return %0\n}\n");
  /* add_zero: -0.0 for floats is an identity; +0.0 is not (it turns -0.0 into +0.0) */
  expect_optimized("graph g(%0 : f32[3]) {\n  %1 : f32[3] = full(shape=[3], dtype=f32, value=-0)\n"
                   "  %2 : f32[3] = add(%0, %1)\n  return %2\n}",
                   "graph g(%0 : f32[3]) {\n  return %0\n}\n");
  expect_optimized("graph g(%0 : f32[3]) {\n  %1 : f32[3] = full(shape=[3], dtype=f32, value=0)\n"
                   "  %2 : f32[3] = add(%0, %1)\n  return %2\n}",
                   "graph g(%0 : f32[3]) {\n  %1 : f32[] = full(shape=[], dtype=f32, value=0)\n"
                   "  %2 : f32[3] = expand(%1, shape=[3])\n  %3 : f32[3] = add(%0, %2)\n  return %3\n}\n");
  expect_optimized("graph g(%0 : i64[3]) {\n  %1 : i64[3] = full(shape=[3], dtype=i64, value=0)\n"
                   "  %2 : i64[3] = add(%1, %0)\n  return %2\n}",
                   "graph g(%0 : i64[3]) {\n  return %0\n}\n");
  /* sub_zero */
  expect_optimized("graph g(%0 : f32[3]) {\n  %1 : f32[3] = full(shape=[3], dtype=f32, value=0)\n"
                   "  %2 : f32[3] = sub(%0, %1)\n  return %2\n}",
                   "graph g(%0 : f32[3]) {\n  return %0\n}\n");
  /* neg_neg */
  expect_optimized("graph g(%0 : f32[3]) {\n  %1 : f32[3] = neg(%0)\n  %2 : f32[3] = neg(%1)\n  return %2\n}",
                   "graph g(%0 : f32[3]) {\n  return %0\n}\n");
  /* convert_same_dtype */
  expect_optimized("graph g(%0 : f32[3]) {\n  %1 : f32[3] = convert(%0, dtype=f32)\n  return %1\n}",
                   "graph g(%0 : f32[3]) {\n  return %0\n}\n");
  /* identity_view: reshape to the same shape, identity permute, full slice */
  expect_optimized("graph g(%0 : f32[2,3]) {\n  %1 : f32[2,3] = reshape(%0, shape=[2,3])\n"
                   "  %2 : f32[2,3] = permute(%1, axes=[0,1])\n  %3 : f32[2,3] = slice(%2, axes=[1], start=0, stop=3, step=1)\n"
                   "  return %3\n}",
                   "graph g(%0 : f32[2,3]) {\n  return %0\n}\n");
  /* permute_permute (and then identity_view) */
  expect_optimized("graph g(%0 : f32[2,3,4]) {\n  %1 : f32[3,4,2] = permute(%0, axes=[1,2,0])\n"
                   "  %2 : f32[4,3,2] = permute(%1, axes=[1,0,2])\n  return %2\n}",
                   "graph g(%0 : f32[2,3,4]) {\n  %1 : f32[4,3,2] = permute(%0, axes=[2,1,0])\n  return %1\n}\n");
  expect_optimized("graph g(%0 : f32[2,3]) {\n  %1 : f32[3,2] = permute(%0, axes=[1,0])\n"
                   "  %2 : f32[2,3] = permute(%1, axes=[1,0])\n  return %2\n}",
                   "graph g(%0 : f32[2,3]) {\n  return %0\n}\n");
  /* reshape_reshape */
  expect_optimized("graph g(%0 : f32[2,3]) {\n  %1 : f32[6] = reshape(%0, shape=[6])\n"
                   "  %2 : f32[3,2] = reshape(%1, shape=[3,2])\n  return %2\n}",
                   "graph g(%0 : f32[2,3]) {\n  %1 : f32[3,2] = reshape(%0, shape=[3,2])\n  return %1\n}\n");
  /* constants become expanded scalars (ir_pass_scalar_constants) */
  expect_optimized("graph g() {\n  %0 : f32[4,2] = full(shape=[4,2], dtype=f32, value=2.5)\n  return %0\n}",
                   "graph g() {\n  %0 : f32[] = full(shape=[], dtype=f32, value=2.5)\n"
                   "  %1 : f32[4,2] = expand(%0, shape=[4,2])\n  return %1\n}\n");
  /* expand_expand */
  expect_optimized("graph g(%0 : f32[3]) {\n  %1 : f32[2,3] = expand(%0, shape=[2,3])\n"
                   "  %2 : f32[4,2,3] = expand(%1, shape=[4,2,3])\n  return %2\n}",
                   "graph g(%0 : f32[3]) {\n  %1 : f32[4,2,3] = expand(%0, shape=[4,2,3])\n  return %1\n}\n");
  /* where_same */
  expect_optimized("graph g(%0 : bool[3], %1 : f32[3]) {\n  %2 : f32[3] = where(%0, %1, %1)\n  return %2\n}",
                   "graph g(%0 : bool[3], %1 : f32[3]) {\n  return %1\n}\n");
  int n = 0;
  while (ir_rewrite_rule_names[n]) n++;
  cr_assert_eq(n, 11, "a new rule needs a case above");
}

ETEST(ir, dce_cse_and_folding) {
  /* CSE merges the two exps; DCE drops the unused neg; random prims are never removed */
  expect_optimized("graph g(%0 : f32[3]) {\n  %1 : f32[3] = exp(%0)\n  %2 : f32[3] = exp(%0)\n"
                   "  %3 : f32[3] = neg(%0)\n  %4 : f32[3] = philox_uniform(shape=[3], dtype=f32, seed=0, offset=0)\n"
                   "  %5 : f32[3] = add(%1, %2)\n  return %5\n}",
                   "graph g(%0 : f32[3]) {\n  %1 : f32[3] = exp(%0)\n"
                   "  %2 : f32[3] = philox_uniform(shape=[3], dtype=f32, seed=0, offset=0)\n"
                   "  %3 : f32[3] = add(%1, %1)\n  return %3\n}\n");
  /* folding runs the kernels: exp(2) * 3, converted to f64, is one constant of the same bits */
  ir_graph *g = parse_ok("graph g() {\n  %0 : f32[] = full(shape=[], dtype=f32, value=2)\n"
                         "  %1 : f32[5] = expand(%0, shape=[5])\n  %2 : f32[5] = exp(%1)\n"
                         "  %3 : f32[5] = full(shape=[5], dtype=f32, value=3)\n  %4 : f32[5] = mul(%2, %3)\n"
                         "  %5 : f64[5] = convert(%4, dtype=f64)\n  return %5\n}");
  em_tensor *want;
  run(g, NULL, 0, &want);
  ir_pass_stats st;
  cr_assert(ir_optimize(g, &st));
  cr_assert_eq(g->n_nodes, 2, "one scalar constant, expanded");
  cr_assert_eq(g->nodes[0].op, EM_PRIM_FULL);
  cr_assert_eq(g->nodes[1].op, EM_PRIM_EXPAND);
  cr_assert_gt(st.folded, 0);
  em_tensor *got;
  run(g, NULL, 0, &got);
  EXPECT_SAME_BITS(got, want, "folded");
  ir_graph_free(g);
}

ETEST(ir, symbolic_sizes_print_parse_and_bind) {
  const char *text = "graph g(%0 : f32[s0,4], %1 : f32[4]) {\n"
                     "  %2 : f32[s0,4] = expand(%1, shape=[2,4])\n"
                     "  return %2\n}\n";
  /* the verifier checks dtypes only where sizes are symbolic */
  ir_graph *g = parse_ok(text);
  char err[256];
  cr_assert(ir_verify(g, 0, err, sizeof err), "%s", err);
  char *again = ir_print(g, false);
  cr_assert_str_eq(again, text);
  free(again);
  cr_assert_eq(g->n_symbols, 1);
  /* bound from the input, and checked against the results */
  em_tensor *out;
  run(g, (em_tensor *[]){em_zeros(EM_F32, EM_SHAPE(2, 4)), em_ones(EM_F32, EM_SHAPE(4))}, 2, &out);
  EXPECT_ALL(out, EM_F32, SHAPE(2, 4), 0, 1);
  em_tensor *bad[2] = {em_zeros(EM_F32, EM_SHAPE(3, 4)), em_ones(EM_F32, EM_SHAPE(4))};
  em_tensor *o2;
  em_clear_error();
  cr_assert_not(rt_interpret(g, bad, 2, &o2, NULL, EM_HERE));
  cr_assert(strstr(em_last_error(), "gave f32[2,4] where the graph says f32[s0,4]"), "%s", em_last_error());
  em_clear_error();
  ir_graph_free(g);
  /* expressions */
  g = parse_ok("graph g(%0 : f32[s0,(s1*2)], %1 : f32[(s0+1)]) {\n  return %0, %1\n}\n");
  int64_t syms[2] = {5, 3};
  cr_assert_eq(ir_dim_eval(g, g->values[0].type.sizes[1], syms), 6);
  cr_assert_eq(ir_dim_eval(g, g->values[1].type.sizes[0], syms), 6);
  char *t = ir_print(g, false);
  cr_assert(strstr(t, "f32[s0,(s1*2)], %1 : f32[(s0+1)]"), "%s", t);
  free(t);
  ir_graph_free(g);
}

#include "random_program.h"

static long total_nodes, total_rewritten;

static void check_program(uint64_t seed) {
  em_scope_begin();
  rng r = {seed * 7919 + 1};
  int64_t a = 1 + pick(&r, 6), b = 1 + pick(&r, 6);
  em_manual_seed(seed);
  em_tensor *in[3] = {em_randn(EM_F32, EM_SHAPE(a, b)), em_randn(EM_F32, EM_SHAPE(a, b)),
                      pick(&r, 2) ? em_randn(EM_F32, 0, NULL) : em_randn(EM_F32, EM_SHAPE(b))};
  program p = {seed, 6 + (int)(seed % 19)};
  em_tensor *want[3], *got[3], *opt[3], *gin[8];
  cr_assert_eq(random_program(in, want, &p), 3, "program %llu: %s", (unsigned long long)seed, em_last_error());
  ir_graph *g = trace(random_program, in, &p, gin);
  char err[512];
  cr_assert(ir_verify(g, 0, err, sizeof err), "program %llu: %s", (unsigned long long)seed, err);
  char *text = ir_print(g, true);
  ir_graph *h = parse_ok(text);
  run(h, gin, h->n_inputs, got);
  for (int i = 0; i < 3; i++) EXPECT_SAME_BITS(got[i], want[i], "parsed program vs eager");
  ir_pass_stats st;
  total_nodes += h->n_nodes;
  cr_assert(ir_optimize(h, &st));
  total_rewritten += st.cse + st.simplified + st.folded + st.dce;
  cr_assert(ir_verify(h, IR_VERIFY_NO_DEAD, err, sizeof err), "program %llu after passes: %s", (unsigned long long)seed, err);
  run(h, gin, h->n_inputs, opt);
  for (int i = 0; i < 3; i++) EXPECT_SAME_BITS(opt[i], want[i], "optimised program vs eager");
  free(text);
  ir_graph_free(g), ir_graph_free(h);
  em_scope_end();
}

ETEST(ir, random_programs_trace_print_parse_interpret_equal_eager) {
  const char *env = getenv("EMBER_RANDOM_PROGRAMS");
  long n = env ? atol(env) : 1000;
  for (long i = 0; i < n; i++) check_program((uint64_t)i);
  cr_log_info("%ld random programs, %ld nodes traced, %ld removed or rewritten by the passes", n, total_nodes,
              total_rewritten);
  /* not vacuous: programs are real and the passes had work to do */
  cr_assert_gt(total_nodes, 10 * n);
  cr_assert_gt(total_rewritten, n);
}

/* Devices: a node's operands are on its device, except a CPU scalar joining device operands
 * (one element, an expand of one, or a CPU graph input whose layout the runtime checks), as in
 * eager mode. */
ETEST(ir, device_placement_of_operands) {
  static const struct {
    const char *text;
    bool ok;
  } cases[] = {
      {"graph g(%0 : f32[3]@cuda, %1 : f32[]) {\n  %2 : f32[3] = expand(%1, shape=[3])\n"
       "  %3 : f32[3]@cuda = add(%0, %2)\n  return %3\n}", true},
      {"graph g(%0 : f32[3]@cuda, %1 : f32[3]) {\n  %2 : f32[3]@cuda = mul(%0, %1)\n  return %2\n}", true},
      {"graph g(%0 : f32[3]@cuda, %1 : f32[3]) {\n  %2 : f32[3] = neg(%1)\n  %3 : f32[3]@cuda = add(%0, %2)\n"
       "  return %3\n}", false},
      {"graph g(%0 : f32[3]@cuda) {\n  %1 : f32[3] = neg(%0)\n  return %1\n}", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ir_graph *g = parse_ok(cases[i].text);
    char err[512] = "";
    bool ok = ir_verify(g, 0, err, sizeof err);
    cr_assert_eq(ok, cases[i].ok, "case %zu: %s", i, err);
    if (!ok) cr_assert(strstr(err, "is on another device than the result"), "case %zu: %s", i, err);
    ir_graph_free(g);
  }
}
