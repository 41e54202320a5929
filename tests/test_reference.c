/* tests/test_reference.c: the reference suite, every op held to PyTorch's results.
 *
 * tests/reference/generate.py ran PyTorch over the ops of ember.h and stored, per case, the
 * inputs, the outputs, an upstream gradient and the input gradients (.npy), and a manifest
 * (tests/reference/manifest.json; EMBER_REFERENCE names the directory) saying which op, with
 * which arguments, how to view each stored input (a transposed view, a slice with a step, an
 * expanded tensor), and the tolerances. Each test here replays every case in one mode: eager,
 * or compiled with the backend aot_eager or inductor, where the function is called twice, the
 * first time on other values (the float inputs halved), and the second call, a replay of the
 * cached entry, is the one checked, forward and backward. Under EMBER_TEST_DEVICE=cuda the
 * inputs live on CUDA (the GPU, or the emulator).
 *
 * Each test prints its pass counts and fails naming every failing case, its op, the mode and
 * the largest error. A case with expect_error must be refused with an error (Ember knowingly
 * differs there; the manifest says why; expect_error_device limits it to one device); if Ember
 * starts accepting it, the case fails until the generator drops the mark.
 * EMBER_REFERENCE_FILTER=text runs only the cases whose id contains text. */
#include "common.h"

#include <cjson/cJSON.h>
#include <time.h>

#define MAX_IN 8
#define MAX_OUT EM_MAX_OUTPUTS

typedef struct rcase rcase;
typedef em_outputs (*op_fn)(const rcase *c, em_tensor *const *in);
/* One row of the op table: the manifest's op name, the function that calls Ember, and for
 * families of ops with one signature (unary, binary, ...), the em_*_at function itself. */
typedef struct rop {
  const char *name;
  op_fn fn;
  void (*f)(void);
} rop;

struct rcase {
  const char *id, *op_name, *expect_error;
  const rop *op;
  cJSON *args;
  int n_in, n_out;
  const char *in_name[MAX_IN], *in_file[MAX_IN], *grad_file[MAX_IN];
  cJSON *in_view[MAX_IN];
  bool in_grad[MAX_IN];
  const char *out_file[MAX_OUT], *gout_file[MAX_OUT];
  double tol_out[2], tol_grad[2];
};

/* ---- arguments ---- */

static cJSON *arg(const rcase *c, const char *key) {
  cJSON *a = cJSON_GetObjectItemCaseSensitive(c->args, key);
  cr_assert_not_null(a, "case %s: argument %s missing from the manifest", c->id, key);
  return a;
}
static double arg_num(const rcase *c, const char *key) {
  cJSON *a = arg(c, key);
  if (cJSON_IsString(a)) { /* JSON has no inf or nan: the generator writes them as strings */
    const char *s = a->valuestring;
    cr_assert(!strcmp(s, "inf") || !strcmp(s, "-inf") || !strcmp(s, "nan"), "case %s: %s = %s", c->id, key, s);
    return !strcmp(s, "nan") ? NAN : s[0] == '-' ? -INFINITY : INFINITY;
  }
  cr_assert(cJSON_IsNumber(a), "case %s: argument %s is not a number", c->id, key);
  return a->valuedouble;
}
/* Whether the case gives the optional argument key (absent: PyTorch's default). */
static bool has_arg(const rcase *c, const char *key) { return cJSON_GetObjectItemCaseSensitive(c->args, key); }
static int64_t arg_int(const rcase *c, const char *key) { return (int64_t)arg_num(c, key); }
static bool arg_bool(const rcase *c, const char *key) {
  cJSON *a = arg(c, key);
  cr_assert(cJSON_IsBool(a), "case %s: argument %s is not a bool", c->id, key);
  return cJSON_IsTrue(a);
}
static const char *arg_str(const rcase *c, const char *key) {
  cJSON *a = arg(c, key);
  cr_assert(cJSON_IsString(a), "case %s: argument %s is not a string", c->id, key);
  return a->valuestring;
}
/* An integer list into out[EM_MAX_DIMS]; returns its length. */
static int arg_list(const rcase *c, const char *key, int64_t *out) {
  cJSON *a = arg(c, key), *e;
  cr_assert(cJSON_IsArray(a) && cJSON_GetArraySize(a) <= 2 * EM_MAX_DIMS, "case %s: %s is not a list", c->id, key);
  int n = 0;
  cJSON_ArrayForEach(e, a) out[n++] = (int64_t)e->valuedouble;
  return n;
}
static em_dtype dtype_named(const char *s) {
  for (int d = 0; d < EM_DTYPE_COUNT; d++)
    if (!strcmp(em_dtype_name((em_dtype)d), s)) return (em_dtype)d;
  cr_assert_fail("unknown dtype %s in the manifest", s);
  return EM_F32;
}
static em_reduction reduction_named(const rcase *c) {
  const char *s = arg_str(c, "reduction");
  return !strcmp(s, "none") ? EM_REDUCE_NONE : !strcmp(s, "sum") ? EM_REDUCE_SUM : EM_REDUCE_MEAN;
}
/* The input with the given role, or EM_NONE when the case leaves that optional input out. */
static em_tensor *IN(const rcase *c, em_tensor *const *in, const char *role) {
  for (int k = 0; k < c->n_in; k++)
    if (!strcmp(c->in_name[k], role)) return in[k];
  return EM_NONE;
}
static em_outputs one(em_tensor *t) { return EM_OUTPUTS(t); }

/* ---- the op table: how each manifest op calls Ember ---- */

#define FN(f) ((void (*)(void))(f))
typedef em_tensor *(*unary_at)(em_tensor *, em_site);
typedef em_tensor *(*binary_at)(em_tensor *, em_tensor *, em_site);
typedef em_tensor *(*scalar_at)(em_tensor *, double, em_site);
typedef em_tensor *(*reduce_at)(em_tensor *, int, const int64_t *, bool, em_site);
typedef em_tensor *(*arg_reduce_at)(em_tensor *, int, bool, em_site);
typedef em_tensor *(*var_at)(em_tensor *, int, const int64_t *, int64_t, bool, em_site);
typedef em_tensor *(*axis_at)(em_tensor *, int, em_site);
typedef em_tensor *(*pool_at)(em_tensor *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, em_site);

static em_outputs op_unary(const rcase *c, em_tensor *const *in) {
  return one(((unary_at)c->op->f)(in[0], EM_HERE));
}
static em_outputs op_binary(const rcase *c, em_tensor *const *in) {
  return one(((binary_at)c->op->f)(in[0], in[1], EM_HERE));
}
static em_outputs op_scalar(const rcase *c, em_tensor *const *in) {
  return one(((scalar_at)c->op->f)(in[0], arg_num(c, "s"), EM_HERE));
}
static em_outputs op_reduce(const rcase *c, em_tensor *const *in) {
  int64_t axes[2 * EM_MAX_DIMS];
  int n = arg_list(c, "axes", axes);
  return one(((reduce_at)c->op->f)(in[0], n, axes, arg_bool(c, "keepdim"), EM_HERE));
}
static em_outputs op_arg_reduce(const rcase *c, em_tensor *const *in) {
  int axis = cJSON_IsNull(arg(c, "axis")) ? EM_ALL_AXES : (int)arg_int(c, "axis");
  return one(((arg_reduce_at)c->op->f)(in[0], axis, arg_bool(c, "keepdim"), EM_HERE));
}
static em_outputs op_var(const rcase *c, em_tensor *const *in) {
  int64_t axes[2 * EM_MAX_DIMS];
  int n = arg_list(c, "axes", axes);
  return one(((var_at)c->op->f)(in[0], n, axes, arg_int(c, "correction"), arg_bool(c, "keepdim"), EM_HERE));
}
static em_outputs op_axis(const rcase *c, em_tensor *const *in) {
  return one(((axis_at)c->op->f)(in[0], (int)arg_int(c, "axis"), EM_HERE));
}
/* In-place ops act on a copy of x, as the generator's x.clone().add_(b) does. */
static em_outputs op_inplace_binary(const rcase *c, em_tensor *const *in) {
  return one(((binary_at)c->op->f)(em_clone(in[0]), in[1], EM_HERE));
}
static em_outputs op_inplace_scalar(const rcase *c, em_tensor *const *in) {
  return one(((scalar_at)c->op->f)(em_clone(in[0]), arg_num(c, "s"), EM_HERE));
}
static em_outputs op_pool(const rcase *c, em_tensor *const *in) {
  return one(((pool_at)c->op->f)(in[0], arg_int(c, "kh"), arg_int(c, "kw"), arg_int(c, "sh"), arg_int(c, "sw"),
                                 arg_int(c, "ph"), arg_int(c, "pw"), EM_HERE));
}

static em_outputs op_gelu(const rcase *c, em_tensor *const *in) {
  return one(em_gelu(in[0], arg_bool(c, "tanh_approx")));
}
static em_outputs op_leaky_relu(const rcase *c, em_tensor *const *in) {
  return one(em_leaky_relu(in[0], arg_num(c, "slope")));
}
static em_outputs op_softplus(const rcase *c, em_tensor *const *in) {
  return one(em_softplus(in[0], arg_num(c, "beta"), arg_num(c, "threshold")));
}
static em_outputs op_where(const rcase *c, em_tensor *const *in) {
  return one(em_where(IN(c, in, "cond"), IN(c, in, "a"), IN(c, in, "b")));
}
static em_outputs op_cast(const rcase *c, em_tensor *const *in) {
  return one(em_cast(in[0], dtype_named(arg_str(c, "dtype"))));
}
static em_outputs op_reshape(const rcase *c, em_tensor *const *in) {
  int64_t s[2 * EM_MAX_DIMS];
  int n = arg_list(c, "shape", s);
  return one(em_reshape(in[0], n, s));
}
static em_outputs op_permute(const rcase *c, em_tensor *const *in) {
  int64_t p[2 * EM_MAX_DIMS];
  int n = arg_list(c, "perm", p);
  return one(em_permute(in[0], n, p));
}
static em_outputs op_transpose(const rcase *c, em_tensor *const *in) {
  return one(em_transpose(in[0], (int)arg_int(c, "d0"), (int)arg_int(c, "d1")));
}
static em_outputs op_expand(const rcase *c, em_tensor *const *in) {
  int64_t s[2 * EM_MAX_DIMS];
  int n = arg_list(c, "sizes", s);
  return one(em_expand(in[0], n, s));
}
static em_outputs op_slice(const rcase *c, em_tensor *const *in) {
  return one(em_slice(in[0], (int)arg_int(c, "axis"), arg_int(c, "start"), arg_int(c, "stop"), arg_int(c, "step")));
}
static em_outputs op_squeeze(const rcase *c, em_tensor *const *in) {
  int64_t a[2 * EM_MAX_DIMS];
  int n = arg_list(c, "axes", a);
  return one(em_squeeze(in[0], n, a));
}
static em_outputs op_unsqueeze(const rcase *c, em_tensor *const *in) {
  return one(em_unsqueeze(in[0], (int)arg_int(c, "axis")));
}
static em_outputs op_flip(const rcase *c, em_tensor *const *in) {
  int64_t a[2 * EM_MAX_DIMS];
  int n = arg_list(c, "axes", a);
  return one(em_flip(in[0], n, a));
}
static em_outputs op_slice_scatter(const rcase *c, em_tensor *const *in) {
  return one(em_slice_scatter(in[0], in[1], (int)arg_int(c, "axis"), arg_int(c, "start"), arg_int(c, "stop"),
                              arg_int(c, "step")));
}
static em_outputs op_pad(const rcase *c, em_tensor *const *in) {
  int64_t p[2 * EM_MAX_DIMS];
  int n = arg_list(c, "pads", p);
  return one(em_pad(in[0], n, p, arg_num(c, "value")));
}
static em_outputs op_cat(const rcase *c, em_tensor *const *in) {
  return one(em_cat(c->n_in, in, (int)arg_int(c, "axis")));
}
static em_outputs op_gather(const rcase *c, em_tensor *const *in) {
  return one(em_gather(IN(c, in, "x"), (int)arg_int(c, "axis"), IN(c, in, "index")));
}
static em_outputs op_index_select(const rcase *c, em_tensor *const *in) {
  return one(em_index_select(IN(c, in, "x"), (int)arg_int(c, "axis"), IN(c, in, "index")));
}
static em_outputs op_scatter_add(const rcase *c, em_tensor *const *in) {
  return one(em_scatter_add(IN(c, in, "x"), (int)arg_int(c, "axis"), IN(c, in, "index"), IN(c, in, "src")));
}
static em_outputs op_zero_(const rcase *c, em_tensor *const *in) {
  (void)c;
  return one(em_zero_(em_clone(in[0])));
}
static em_outputs op_fill_(const rcase *c, em_tensor *const *in) {
  return one(em_fill_(em_clone(in[0]), arg_num(c, "value")));
}
static em_conv2d_params conv_params(const rcase *c) {
  int64_t s[2 * EM_MAX_DIMS], p[2 * EM_MAX_DIMS], d[2 * EM_MAX_DIMS];
  arg_list(c, "stride", s);
  arg_list(c, "padding", p);
  arg_list(c, "dilation", d);
  return (em_conv2d_params){{s[0], s[1]}, {p[0], p[1]}, {d[0], d[1]}, arg_int(c, "groups")};
}
static em_outputs op_conv2d(const rcase *c, em_tensor *const *in) {
  return one(em_conv2d(IN(c, in, "x"), IN(c, in, "weight"), IN(c, in, "bias"), conv_params(c)));
}
static em_outputs op_conv2d_backward_input(const rcase *c, em_tensor *const *in) {
  int64_t hw[2 * EM_MAX_DIMS];
  arg_list(c, "input_hw", hw);
  return one(em_conv2d_backward_input(IN(c, in, "grad_out"), IN(c, in, "weight"), hw, conv_params(c)));
}
static em_outputs op_conv2d_backward_weight(const rcase *c, em_tensor *const *in) {
  int64_t khw[2 * EM_MAX_DIMS];
  arg_list(c, "kernel_hw", khw);
  return one(em_conv2d_backward_weight(IN(c, in, "x"), IN(c, in, "grad_out"), khw, conv_params(c)));
}
static em_outputs op_layer_norm(const rcase *c, em_tensor *const *in) {
  return one(em_layer_norm(IN(c, in, "x"), (int)arg_int(c, "n_norm"), IN(c, in, "weight"), IN(c, in, "bias"),
                           arg_num(c, "eps")));
}
static em_outputs op_rms_norm(const rcase *c, em_tensor *const *in) {
  return one(em_rms_norm(IN(c, in, "x"), (int)arg_int(c, "n_norm"), IN(c, in, "weight"), arg_num(c, "eps")));
}
/* The outputs are y and the running statistics after the call (updated in place when training). */
static em_outputs op_batch_norm(const rcase *c, em_tensor *const *in) {
  em_tensor *rm = IN(c, in, "running_mean"), *rv = IN(c, in, "running_var");
  em_tensor *y = em_batch_norm(IN(c, in, "x"), rm, rv, IN(c, in, "weight"), IN(c, in, "bias"),
                               arg_bool(c, "training"), arg_num(c, "momentum"), arg_num(c, "eps"));
  em_outputs o = EM_OUTPUTS(y);
  if (rm != EM_NONE) o.t[o.n++] = rm;
  if (rv != EM_NONE) o.t[o.n++] = rv;
  return o;
}
static em_outputs op_linear(const rcase *c, em_tensor *const *in) {
  return one(em_linear(IN(c, in, "x"), IN(c, in, "weight"), IN(c, in, "bias")));
}
static em_outputs op_dropout(const rcase *c, em_tensor *const *in) {
  return one(em_dropout(in[0], arg_num(c, "p"), arg_bool(c, "training")));
}
static em_outputs op_cross_entropy(const rcase *c, em_tensor *const *in) {
  em_cross_entropy_opts o = {arg_int(c, "ignore_index"), arg_num(c, "label_smoothing"), reduction_named(c),
                             IN(c, in, "weight")};
  return one(em_cross_entropy(IN(c, in, "logits"), IN(c, in, "target"), o));
}
static em_outputs op_nll_loss(const rcase *c, em_tensor *const *in) {
  em_tensor *w = IN(c, in, "weight");
  if (w == EM_NONE)
    return one(em_nll_loss(IN(c, in, "logp"), IN(c, in, "target"), arg_int(c, "ignore_index"), reduction_named(c)));
  em_nll_loss_opts o = {arg_int(c, "ignore_index"), reduction_named(c), w};
  return one(em_nll_loss_ex(IN(c, in, "logp"), IN(c, in, "target"), o));
}
static em_outputs op_mse_loss(const rcase *c, em_tensor *const *in) {
  return one(em_mse_loss(IN(c, in, "x"), IN(c, in, "y"), reduction_named(c)));
}
static em_outputs op_embedding(const rcase *c, em_tensor *const *in) {
  if (!has_arg(c, "padding_idx")) return one(em_embedding(IN(c, in, "indices"), IN(c, in, "weight")));
  em_embedding_opts o = {true, arg_int(c, "padding_idx")};
  return one(em_embedding_ex(IN(c, in, "indices"), IN(c, in, "weight"), o));
}
static em_outputs op_sdpa(const rcase *c, em_tensor *const *in) {
  return one(em_scaled_dot_product_attention(IN(c, in, "q"), IN(c, in, "k"), IN(c, in, "v"), arg_bool(c, "causal"),
                                             0.0, arg_num(c, "scale")));
}
static em_outputs op_clamp(const rcase *c, em_tensor *const *in) {
  return one(em_clamp(in[0], arg_num(c, "lo"), arg_num(c, "hi")));
}
static em_outputs op_clamp_tensor(const rcase *c, em_tensor *const *in) {
  return one(em_clamp_tensor(IN(c, in, "x"), IN(c, in, "lo"), IN(c, in, "hi")));
}
static em_outputs op_one_hot(const rcase *c, em_tensor *const *in) {
  return one(em_one_hot(in[0], arg_int(c, "n_classes")));
}
static em_outputs op_masked_fill(const rcase *c, em_tensor *const *in) {
  return one(em_masked_fill(IN(c, in, "x"), IN(c, in, "mask"), arg_num(c, "value")));
}
static em_outputs op_arange(const rcase *c, em_tensor *const *in) {
  (void)in;
  return one(em_arange(dtype_named(arg_str(c, "dtype")), arg_num(c, "start"), arg_num(c, "end"), arg_num(c, "step")));
}
static em_outputs op_eye(const rcase *c, em_tensor *const *in) {
  (void)in;
  return one(em_eye(dtype_named(arg_str(c, "dtype")), arg_int(c, "n"), arg_int(c, "m")));
}
static em_outputs op_full(const rcase *c, em_tensor *const *in) {
  (void)in;
  int64_t s[2 * EM_MAX_DIMS];
  int n = arg_list(c, "shape", s);
  return one(em_full(dtype_named(arg_str(c, "dtype")), n, s, arg_num(c, "value")));
}

/* The parameter (a leaf copy of "param") after one optimizer step per row of "grads"; each step
 * backpropagates sum(param * row), whose gradient is the row. */
static em_outputs optimizer_steps(const rcase *c, em_tensor *const *in, bool adamw) {
  em_tensor *p = em_requires_grad_(em_detach(em_clone(IN(c, in, "param"))), true), *grads = IN(c, in, "grads");
  if (!p || !grads) return one(NULL);
  em_optimizer *o =
      adamw ? em_adamw_new(1, &p, ((em_adamw_opts){arg_num(c, "lr"), arg_num(c, "beta1"), arg_num(c, "beta2"),
                                                  arg_num(c, "eps"), arg_num(c, "weight_decay"),
                                                  arg_bool(c, "amsgrad")}))
            : em_sgd_new(1, &p, ((em_sgd_opts){arg_num(c, "lr"), arg_num(c, "momentum"), arg_num(c, "dampening"),
                                               arg_num(c, "weight_decay"), arg_bool(c, "nesterov")}));
  bool ok = o != NULL;
  for (int64_t t = 0; ok && t < em_size(grads, 0); t++) {
    em_tensor *g = em_squeeze(em_slice(grads, 0, t, t + 1, 1), EM_AXES(0));
    ok = em_backward(em_sum(em_mul(p, g), 0, NULL, false), NULL) && em_optimizer_step(o);
    em_optimizer_zero_grad(o);
  }
  em_optimizer_free(o);
  return one(ok ? em_detach(p) : NULL);
}
static em_outputs op_sgd(const rcase *c, em_tensor *const *in) { return optimizer_steps(c, in, false); }
static em_outputs op_adamw(const rcase *c, em_tensor *const *in) { return optimizer_steps(c, in, true); }

/* ---- torch's keyword options and the LM ops (issue 21) ---- */

typedef em_tensor *(*alpha_at)(em_tensor *, em_tensor *, double, em_site);
typedef em_tensor *(*diagonal_at)(em_tensor *, int64_t, em_site);

static em_outputs op_alpha(const rcase *c, em_tensor *const *in) {
  return one(((alpha_at)c->op->f)(in[0], in[1], arg_num(c, "alpha"), EM_HERE));
}
static em_outputs op_div_mode(const rcase *c, em_tensor *const *in) {
  const char *s = arg_str(c, "rounding_mode");
  em_rounding_mode mode = !strcmp(s, "trunc") ? EM_ROUND_TRUNC : !strcmp(s, "floor") ? EM_ROUND_FLOOR : EM_ROUND_NONE;
  cr_assert(mode != EM_ROUND_NONE, "case %s: rounding_mode %s", c->id, s);
  return one(em_div_mode(in[0], in[1], mode));
}
static em_outputs op_diagonal(const rcase *c, em_tensor *const *in) {
  return one(((diagonal_at)c->op->f)(in[0], arg_int(c, "diagonal"), EM_HERE));
}
static em_outputs op_sort(const rcase *c, em_tensor *const *in) {
  em_tensor *idx = NULL, *v = em_sort(in[0], (int)arg_int(c, "axis"), arg_bool(c, "descending"), &idx);
  return EM_OUTPUTS(v, idx);
}
static em_outputs op_argsort(const rcase *c, em_tensor *const *in) {
  return one(em_argsort(in[0], (int)arg_int(c, "axis"), arg_bool(c, "descending")));
}
static em_outputs op_topk(const rcase *c, em_tensor *const *in) {
  em_tensor *idx = NULL;
  em_tensor *v = em_topk(in[0], arg_int(c, "k"), (int)arg_int(c, "axis"), arg_bool(c, "largest"), true, &idx);
  return EM_OUTPUTS(v, idx);
}
/* The pieces, in order (no output at all when Ember refuses: run_once then reads the error). */
static em_outputs pieces(int n, em_tensor *const *p) {
  em_outputs o = {0};
  for (int k = 0; k < n; k++) o.t[o.n++] = p[k];
  return o;
}
static em_outputs op_split(const rcase *c, em_tensor *const *in) {
  em_tensor *p[MAX_OUT];
  return pieces(em_split(in[0], arg_int(c, "size"), (int)arg_int(c, "axis"), p, MAX_OUT), p);
}
static em_outputs op_chunk(const rcase *c, em_tensor *const *in) {
  em_tensor *p[MAX_OUT];
  return pieces(em_chunk(in[0], (int)arg_int(c, "chunks"), (int)arg_int(c, "axis"), p, MAX_OUT), p);
}
static em_outputs op_multinomial(const rcase *c, em_tensor *const *in) {
  return one(em_multinomial(in[0], arg_int(c, "num_samples"), arg_bool(c, "replacement")));
}
/* Properties of random draws, which PyTorch's generator and Ember's do not share: the draws
 * (checked here to be i64 [..., num_samples]) gathered from probs are all > 0 (indices in range,
 * zero-probability classes never drawn) and, without replacement, the most often drawn class
 * per row was drawn once (the draws are distinct). */
static em_outputs op_multinomial_properties(const rcase *c, em_tensor *const *in) {
  em_tensor *probs = in[0], *d = em_multinomial(probs, arg_int(c, "num_samples"), arg_bool(c, "replacement"));
  if (!d) return one(NULL);
  cr_assert_eq(em_dtype_of(d), EM_I64, "case %s: multinomial gives %s, not i64", c->id, em_dtype_name(em_dtype_of(d)));
  cr_assert(em_ndim(d) == em_ndim(probs) && em_size(d, -1) == arg_int(c, "num_samples"),
            "case %s: multinomial's draws have the wrong shape", c->id);
  em_outputs o = EM_OUTPUTS(em_gt_scalar(em_gather(probs, -1, d), 0));
  if (!arg_bool(c, "replacement")) {
    int64_t classes = em_size(probs, -1);
    o.t[o.n++] = em_amax(em_sum(em_one_hot(d, classes), EM_AXES(-2), false), EM_AXES(-1), false);
  }
  return o;
}
/* The inputs are the gradients: each becomes the .grad of a zero parameter of its shape (by a
 * backward of sum(p * g)); the outputs are the total norm and the clipped gradients. */
static em_outputs op_clip_grad_norm_(const rcase *c, em_tensor *const *in) {
  em_tensor *p[MAX_IN];
  for (int k = 0; k < c->n_in; k++) {
    p[k] = em_requires_grad_(em_detach(em_clone(in[k])), true); /* its value does not matter */
    if (!p[k] || !em_backward(em_sum(em_mul(p[k], in[k]), 0, NULL, false), NULL)) return one(NULL);
  }
  em_outputs o = EM_OUTPUTS(em_clip_grad_norm_(c->n_in, p, arg_num(c, "max_norm"), arg_num(c, "norm_type")));
  for (int k = 0; k < c->n_in; k++) o.t[o.n++] = em_clone(em_get_grad(p[k]));
  return o;
}
/* torch's pool keywords: absent ones take PyTorch's defaults; without any, the plain op. */
static em_outputs op_pool_ex(const rcase *c, em_tensor *const *in) {
  if (!has_arg(c, "dilation") && !has_arg(c, "ceil_mode") && !has_arg(c, "count_include_pad") &&
      !has_arg(c, "divisor_override"))
    return op_pool(c, in);
  em_pool2d_opts o = EM_POOL2D_DEFAULT(arg_int(c, "kh"), arg_int(c, "kw"));
  o.stride[0] = arg_int(c, "sh"), o.stride[1] = arg_int(c, "sw");
  o.padding[0] = arg_int(c, "ph"), o.padding[1] = arg_int(c, "pw");
  if (has_arg(c, "dilation")) o.dilation[0] = o.dilation[1] = arg_int(c, "dilation");
  if (has_arg(c, "ceil_mode")) o.ceil_mode = arg_bool(c, "ceil_mode");
  if (has_arg(c, "count_include_pad")) o.count_include_pad = arg_bool(c, "count_include_pad");
  if (has_arg(c, "divisor_override")) o.divisor_override = arg_int(c, "divisor_override");
  bool max = c->op->f == FN(em_max_pool2d_at);
  return one(max ? em_max_pool2d_ex(in[0], o) : em_avg_pool2d_ex(in[0], o));
}

#define UNARY(n) {#n, op_unary, FN(em_##n##_at)}
#define BINARY(n) {#n, op_binary, FN(em_##n##_at)}
#define SCALAR(n) {#n "_scalar", op_scalar, FN(em_##n##_scalar_at)}
#define REDUCE(n) {#n, op_reduce, FN(em_##n##_at)}
static const rop ops[] = {
    UNARY(neg), UNARY(abs), UNARY(exp), UNARY(log), UNARY(log1p), UNARY(expm1), UNARY(sqrt), UNARY(rsqrt),
    UNARY(sin), UNARY(cos), UNARY(tanh), UNARY(erf), UNARY(sign), UNARY(floor), UNARY(ceil), UNARY(reciprocal),
    UNARY(logical_not), UNARY(relu), UNARY(silu), UNARY(sigmoid), UNARY(clone), UNARY(contiguous),
    UNARY(round), UNARY(trunc), UNARY(frac),
    BINARY(add), BINARY(sub), BINARY(mul), BINARY(div), BINARY(pow), BINARY(maximum), BINARY(minimum),
    BINARY(remainder), BINARY(atan2), BINARY(eq), BINARY(ne), BINARY(lt), BINARY(le), BINARY(gt), BINARY(ge),
    BINARY(logical_and), BINARY(logical_or), BINARY(matmul),
    SCALAR(add), SCALAR(sub), SCALAR(mul), SCALAR(div), SCALAR(pow), SCALAR(maximum), SCALAR(minimum),
    SCALAR(remainder), SCALAR(eq), SCALAR(ne), SCALAR(lt), SCALAR(le), SCALAR(gt), SCALAR(ge),
    REDUCE(sum), REDUCE(prod), REDUCE(amax), REDUCE(amin), REDUCE(mean), REDUCE(logsumexp),
    {"argmax", op_arg_reduce, FN(em_argmax_at)}, {"argmin", op_arg_reduce, FN(em_argmin_at)},
    {"var", op_var, FN(em_var_at)}, {"std", op_var, FN(em_std_at)},
    {"softmax", op_axis, FN(em_softmax_at)}, {"log_softmax", op_axis, FN(em_log_softmax_at)},
    {"gelu", op_gelu, NULL}, {"leaky_relu", op_leaky_relu, NULL}, {"softplus", op_softplus, NULL},
    {"where", op_where, NULL}, {"cast", op_cast, NULL},
    {"reshape", op_reshape, NULL}, {"permute", op_permute, NULL}, {"transpose", op_transpose, NULL},
    {"expand", op_expand, NULL}, {"slice", op_slice, NULL}, {"squeeze", op_squeeze, NULL},
    {"unsqueeze", op_unsqueeze, NULL}, {"flip", op_flip, NULL}, {"slice_scatter", op_slice_scatter, NULL},
    {"pad", op_pad, NULL}, {"cat", op_cat, NULL}, {"gather", op_gather, NULL},
    {"index_select", op_index_select, NULL}, {"scatter_add", op_scatter_add, NULL},
    {"nonzero", op_unary, FN(em_nonzero_at)}, {"masked_select", op_binary, FN(em_masked_select_at)},
    {"add_", op_inplace_binary, FN(em_add__at)}, {"sub_", op_inplace_binary, FN(em_sub__at)},
    {"mul_", op_inplace_binary, FN(em_mul__at)}, {"div_", op_inplace_binary, FN(em_div__at)},
    {"copy_", op_inplace_binary, FN(em_copy__at)},
    {"add_scalar_", op_inplace_scalar, FN(em_add_scalar__at)},
    {"mul_scalar_", op_inplace_scalar, FN(em_mul_scalar__at)},
    {"zero_", op_zero_, NULL}, {"fill_", op_fill_, NULL},
    {"conv2d", op_conv2d, NULL}, {"conv2d_backward_input", op_conv2d_backward_input, NULL},
    {"conv2d_backward_weight", op_conv2d_backward_weight, NULL},
    {"layer_norm", op_layer_norm, NULL}, {"rms_norm", op_rms_norm, NULL}, {"batch_norm", op_batch_norm, NULL},
    {"linear", op_linear, NULL}, {"dropout", op_dropout, NULL}, {"cross_entropy", op_cross_entropy, NULL},
    {"nll_loss", op_nll_loss, NULL}, {"mse_loss", op_mse_loss, NULL}, {"embedding", op_embedding, NULL},
    {"max_pool2d", op_pool_ex, FN(em_max_pool2d_at)}, {"avg_pool2d", op_pool_ex, FN(em_avg_pool2d_at)},
    {"scaled_dot_product_attention", op_sdpa, NULL}, {"clamp", op_clamp, NULL},
    {"clamp_tensor", op_clamp_tensor, NULL}, {"one_hot", op_one_hot, NULL},
    {"masked_fill", op_masked_fill, NULL},
    {"arange", op_arange, NULL}, {"eye", op_eye, NULL}, {"full", op_full, NULL},
    {"sgd", op_sgd, NULL}, {"adamw", op_adamw, NULL},
    {"add_alpha", op_alpha, FN(em_add_alpha_at)}, {"sub_alpha", op_alpha, FN(em_sub_alpha_at)},
    {"div_mode", op_div_mode, NULL}, {"cumsum", op_axis, FN(em_cumsum_at)}, {"cumprod", op_axis, FN(em_cumprod_at)},
    {"sort", op_sort, NULL}, {"argsort", op_argsort, NULL}, {"topk", op_topk, NULL}, {"tril", op_diagonal, FN(em_tril_at)},
    {"triu", op_diagonal, FN(em_triu_at)}, {"split", op_split, NULL}, {"chunk", op_chunk, NULL},
    {"multinomial", op_multinomial, NULL}, {"multinomial_properties", op_multinomial_properties, NULL},
    {"clip_grad_norm_", op_clip_grad_norm_, NULL},
};

/* ---- the manifest ---- */

typedef struct manifest {
  cJSON *root;
  char dir[512];
  int n;
  rcase *cases;
} manifest;

static const char *str_item(cJSON *o, const char *key) {
  cJSON *s = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(s) ? s->valuestring : NULL;
}
static void read_tol(cJSON *tol, const char *key, double out[2]) {
  cJSON *t = cJSON_GetObjectItemCaseSensitive(tol, key);
  cr_assert(cJSON_GetArraySize(t) == 2, "tolerance %s is not [rtol, atol]", key);
  out[0] = cJSON_GetArrayItem(t, 0)->valuedouble;
  out[1] = cJSON_GetArrayItem(t, 1)->valuedouble;
}

static void manifest_load(manifest *m) {
  const char *d = getenv("EMBER_REFERENCE");
  snprintf(m->dir, sizeof m->dir, "%s", d ? d : "tests/reference");
  char path[600];
  snprintf(path, sizeof path, "%s/manifest.json", m->dir);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s (EMBER_REFERENCE names the directory)", path);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)size + 1);
  cr_assert(text && fread(text, 1, (size_t)size, f) == (size_t)size);
  text[size] = 0;
  fclose(f);
  m->root = cJSON_Parse(text);
  free(text);
  cr_assert_not_null(m->root, "%s is not JSON", path);
  cJSON *cases = cJSON_GetObjectItemCaseSensitive(m->root, "cases"), *jc;
  m->n = cJSON_GetArraySize(cases);
  m->cases = calloc((size_t)m->n + 1, sizeof(rcase));
  int i = 0;
  cJSON_ArrayForEach(jc, cases) {
    rcase *c = &m->cases[i++];
    c->id = str_item(jc, "id");
    c->op_name = str_item(jc, "op");
    c->expect_error = str_item(jc, "expect_error");
    const char *on = str_item(jc, "expect_error_device"); /* refused on that device only */
    if (on && strcmp(on, etest_on_cuda() ? "cuda" : "cpu")) c->expect_error = NULL;
    c->args = cJSON_GetObjectItemCaseSensitive(jc, "args");
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
      if (!strcmp(ops[k].name, c->op_name)) c->op = &ops[k];
    cJSON *e, *ins = cJSON_GetObjectItemCaseSensitive(jc, "inputs");
    cr_assert(cJSON_GetArraySize(ins) <= MAX_IN, "case %s: too many inputs", c->id);
    cJSON_ArrayForEach(e, ins) {
      c->in_name[c->n_in] = str_item(e, "name");
      c->in_file[c->n_in] = str_item(e, "file");
      c->in_view[c->n_in] = cJSON_GetObjectItemCaseSensitive(e, "view");
      c->in_grad[c->n_in] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "grad"));
      c->n_in++;
    }
    cJSON *outs = cJSON_GetObjectItemCaseSensitive(jc, "outputs");
    cr_assert(cJSON_GetArraySize(outs) <= MAX_OUT, "case %s: too many outputs", c->id);
    cJSON_ArrayForEach(e, outs) {
      c->out_file[c->n_out] = str_item(e, "file");
      c->gout_file[c->n_out] = str_item(e, "grad_out");
      c->n_out++;
    }
    int k = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(jc, "grads")) {
      cr_assert(k < c->n_in, "case %s: more gradients than inputs", c->id);
      c->grad_file[k++] = cJSON_IsString(e) ? e->valuestring : NULL;
    }
    cJSON *tol = cJSON_GetObjectItemCaseSensitive(jc, "tol");
    read_tol(tol, "out", c->tol_out);
    read_tol(tol, "grad", c->tol_grad);
  }
}

static void manifest_free(manifest *m) {
  cJSON_Delete(m->root);
  free(m->cases);
}

/* ---- one case ---- */

typedef enum { MODE_EAGER, MODE_AOT_EAGER, MODE_INDUCTOR, MODE_COUNT } run_mode;
static const char *const mode_names[MODE_COUNT] = {"eager", "aot_eager", "inductor"};

static em_tensor *load(const manifest *m, const char *file, em_device dev) {
  char path[1024];
  snprintf(path, sizeof path, "%s/data/%s", m->dir, file);
  em_device prev = em_set_default_device(dev);
  em_tensor *t = em_load_npy(path);
  em_set_default_device(prev);
  return t;
}

static bool is_float(em_dtype dt) { return dt == EM_F32 || dt == EM_F64; }

/* The op's inputs for one call, from the stored bases: a fresh copy (scaled when scale != 1, for
 * float bases), the view steps, and for inputs that take a gradient, a leaf of that view. */
static bool make_inputs(const rcase *c, em_tensor *const *bases, double scale, em_tensor **in) {
  for (int k = 0; k < c->n_in; k++) {
    em_tensor *t = bases[k];
    t = is_float(em_dtype_of(t)) && scale != 1 ? em_mul_scalar(t, scale) : em_clone(t);
    cJSON *step;
    cJSON_ArrayForEach(step, c->in_view[k]) {
      const char *kind = cJSON_GetArrayItem(step, 0)->valuestring;
      int64_t v[2 * EM_MAX_DIMS];
      int n = 0;
      if (!strcmp(kind, "transpose")) {
        t = em_transpose(t, cJSON_GetArrayItem(step, 1)->valueint, cJSON_GetArrayItem(step, 2)->valueint);
      } else if (!strcmp(kind, "slice")) {
        for (int j = 1; j < 5; j++) v[j] = (int64_t)cJSON_GetArrayItem(step, j)->valuedouble;
        t = em_slice(t, (int)v[1], v[2], v[3], v[4]);
      } else if (!strcmp(kind, "expand") || !strcmp(kind, "permute")) {
        cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetArrayItem(step, 1)) v[n++] = (int64_t)e->valuedouble;
        t = kind[0] == 'e' ? em_expand(t, n, v) : em_permute(t, n, v);
      } else {
        cr_assert_fail("case %s: unknown view step %s", c->id, kind);
      }
    }
    if (c->in_grad[k]) t = em_requires_grad_(em_detach(t), true);
    if (!t) return false;
    in[k] = t;
  }
  return true;
}

static em_outputs model(void *ctx, em_tensor *const *in, int n) {
  (void)n;
  const rcase *c = ctx;
  return c->op->fn(c, in);
}

/* Runs the op (and em_grad when the case has gradients) on in. Returns false with an error
 * recorded when Ember fails. */
static bool run_once(const rcase *c, em_compiled *compiled, em_tensor **in, const em_tensor *const *gout,
                     em_outputs *out, em_tensor **grads) {
  em_tensor *none[1] = {NULL};
  *out = compiled ? em_call_n(compiled, (void *)c, c->n_in, c->n_in ? in : none) : c->op->fn(c, in);
  for (int j = 0; j < out->n; j++)
    if (!out->t[j]) return false;
  if (out->n == 0 || em_last_error()) return false;
  em_tensor *douts[MAX_OUT], *seeds[MAX_OUT], *gin[MAX_IN];
  int nd = 0, ng = 0;
  for (int j = 0; j < c->n_out && j < out->n; j++)
    if (gout[j]) douts[nd] = out->t[j], seeds[nd++] = (em_tensor *)gout[j];
  for (int k = 0; k < c->n_in; k++)
    if (c->grad_file[k]) gin[ng++] = in[k];
  if (!nd || !ng) return true;
  em_tensor *g[MAX_IN];
  if (!em_grad(nd, douts, seeds, ng, gin, g, false, false)) return false;
  for (int k = 0, i = 0; k < c->n_in; k++) grads[k] = c->grad_file[k] ? g[i++] : NULL;
  return true;
}

/* Compares got with the stored want: dtype, shape, then values within tol (integers and bool
 * exactly; NaN matches NaN, an infinity only itself). On a difference writes why into msg. */
static bool compare(const char *what, em_tensor *got, em_tensor *want, const double tol[2], char *msg, size_t cap) {
  if (!got) return snprintf(msg, cap, "%s is missing", what), false;
  if (em_dtype_of(got) != em_dtype_of(want))
    return snprintf(msg, cap, "%s has dtype %s, PyTorch's %s", what, em_dtype_name(em_dtype_of(got)),
                    em_dtype_name(em_dtype_of(want))),
           false;
  bool same = em_ndim(got) == em_ndim(want);
  for (int d = 0; same && d < em_ndim(got); d++) same = em_size(got, d) == em_size(want, d);
  if (!same) {
    char gs[128] = "", ws[128] = "";
    for (int d = 0; d < em_ndim(got); d++)
      snprintf(gs + strlen(gs), sizeof gs - strlen(gs), "%s%lld", d ? "," : "", (long long)em_size(got, d));
    for (int d = 0; d < em_ndim(want); d++)
      snprintf(ws + strlen(ws), sizeof ws - strlen(ws), "%s%lld", d ? "," : "", (long long)em_size(want, d));
    return snprintf(msg, cap, "%s has shape [%s], PyTorch's [%s]", what, gs, ws), false;
  }
  int64_t n = em_numel(want);
  bool exact = !is_float(em_dtype_of(want));
  /* integers are read as i64, so that values past 2^53 compare exactly too */
  em_dtype as = exact ? EM_I64 : EM_F64;
  size_t bytes = 8 * (size_t)n;
  void *gb = malloc(bytes ? bytes : 1), *wb = malloc(bytes ? bytes : 1);
  bool ok = em_to_buffer(got, as, gb, bytes) && em_to_buffer(want, as, wb, bytes);
  if (!ok) {
    snprintf(msg, cap, "%s cannot be read: %s", what, em_last_error() ? em_last_error() : "");
    em_clear_error();
  }
  int64_t worst = -1, bad = 0;
  double max_err = 0, gw = 0, ww = 0;
  for (int64_t i = 0; ok && i < n; i++) {
    double g = exact ? (double)((int64_t *)gb)[i] : ((double *)gb)[i];
    double w = exact ? (double)((int64_t *)wb)[i] : ((double *)wb)[i];
    if (exact ? ((int64_t *)gb)[i] == ((int64_t *)wb)[i] : (isnan(g) && isnan(w)) || g == w) continue;
    double err = fabs(g - w);
    bool fine = !exact && !isnan(err) && !isinf(w) && err <= tol[1] + tol[0] * fabs(w);
    if (isnan(err)) err = INFINITY;
    if (!fine) bad++;
    if (!fine && (worst < 0 || err > max_err)) worst = i, max_err = err, gw = g, ww = w;
  }
  if (ok && bad) {
    snprintf(msg, cap, "%s: %lld of %lld elements differ, max error %.3g at element %lld: %.9g, PyTorch %.9g "
             "(rtol %g, atol %g)", what, (long long)bad, (long long)n, max_err, (long long)worst, gw, ww, tol[0],
             tol[1]);
    ok = false;
  }
  free(gb);
  free(wb);
  return ok;
}

/* What the compiled modes did, over all cases: cases whose calls ran generated kernels, graphs
the inductor could not compile (run op by op), and graph breaks. */
static struct {
  int with_kernels;
  int64_t fallbacks, breaks;
} tally;

/* Runs one case in one mode. Returns 1 when it passes, 2 when it is refused as expected, 0 when
 * it fails (msg says why). */
static int run_case(const manifest *m, const rcase *c, run_mode mode, char *msg, size_t cap) {
  if (!c->op) return snprintf(msg, cap, "no op %s in the op table of test_reference.c", c->op_name), 0;
  em_scope_begin();
  em_device dev = etest_on_cuda() ? EM_CUDA : EM_CPU;
  em_tensor *bases[MAX_IN], *in[MAX_IN], *gout[MAX_OUT] = {0}, *grads[MAX_IN] = {0};
  em_compiled *compiled = NULL;
  em_outputs out = {0};
  bool ran;
  int result = 0;
  for (int k = 0; k < c->n_in; k++) bases[k] = load(m, c->in_file[k], dev);
  for (int j = 0; j < c->n_out; j++) gout[j] = c->gout_file[j] ? load(m, c->gout_file[j], dev) : NULL;
  if (em_last_error()) {
    snprintf(msg, cap, "cannot load its data: %s", em_last_error());
    em_clear_error();
    goto done;
  }
  if (mode == MODE_EAGER) {
    ran = make_inputs(c, bases, 1, in) && run_once(c, NULL, in, (const em_tensor *const *)gout, &out, grads);
  } else {
    /* check_every -1: the second call is a replay of the cached entry, not a validation trace */
    em_compile_options o = {.backend = mode_names[mode], .name = c->op_name, .check_every = -1};
    compiled = em_compile(model, &o);
    em_tensor *in1[MAX_IN], *g1[MAX_IN];
    em_outputs o1;
    ran = make_inputs(c, bases, 0.5, in1) && run_once(c, compiled, in1, (const em_tensor *const *)gout, &o1, g1);
    if (ran || c->expect_error) {
      em_clear_error();
      ran = make_inputs(c, bases, 1, in) && run_once(c, compiled, in, (const em_tensor *const *)gout, &out, grads);
    }
  }
  if (c->expect_error) {
    if (ran) snprintf(msg, cap, "Ember accepts it now, expected an error (%s): drop expect_error", c->expect_error);
    else if (!em_last_error()) snprintf(msg, cap, "failed without an error message");
    else result = 2;
    em_clear_error();
    goto done;
  }
  if (!ran) {
    snprintf(msg, cap, "Ember fails: %s", em_last_error() ? em_last_error() : "(no error message)");
    em_clear_error();
    goto done;
  }
  if (out.n != c->n_out) {
    snprintf(msg, cap, "%d outputs, PyTorch %d", out.n, c->n_out);
    goto done;
  }
  result = 1;
  char what[64];
  for (int j = 0; result && j < c->n_out; j++) {
    snprintf(what, sizeof what, "output %d", j);
    result = compare(what, out.t[j], load(m, c->out_file[j], EM_CPU), c->tol_out, msg, cap);
  }
  for (int k = 0; result && k < c->n_in; k++) {
    if (!c->grad_file[k]) continue;
    snprintf(what, sizeof what, "gradient of %s", c->in_name[k]);
    result = compare(what, grads[k], load(m, c->grad_file[k], EM_CPU), c->tol_grad, msg, cap);
  }
  if (compiled) {
    em_compile_stats st = em_compiled_stats(compiled);
    tally.with_kernels += st.kernel_runs > 0;
    tally.fallbacks += st.inductor_fallbacks;
    tally.breaks += st.breaks;
    if (result && !st.replays && !st.breaks) {
      snprintf(msg, cap, "the second call was not a replay (traces %lld)", (long long)st.traces);
      result = 0;
    }
  }
done:
  em_compiled_free(compiled);
  em_scope_end();
  return result;
}

/* On the CUDA emulator each kernel, eager or generated, is built by the host C++ compiler (about
 * a second each, cached on disk after): every case in every mode took five minutes on a cold
 * cache (a fresh CI machine), twice that under the sanitizers. There each mode replays a sample:
 * each op's first case, its first case on a view, and (eager and aot_eager) its NaN/inf cases
 * ("special" in the name). EMBER_REFERENCE_ALL=1 replays every case; a GPU replays every case. */
static bool sampled(const manifest *m, int i, run_mode mode) {
  const char *emu = getenv("EMBER_CUDA_EMULATE"), *all = getenv("EMBER_REFERENCE_ALL");
  if (!etest_on_cuda() || !emu || strcmp(emu, "1") || (all && !strcmp(all, "1"))) return true;
  const rcase *c = &m->cases[i];
  if (mode != MODE_INDUCTOR && strstr(c->id, "special")) return true;
  bool view = false;
  for (int k = 0; k < c->n_in; k++) view |= cJSON_GetArraySize(c->in_view[k]) > 0;
  bool first = true, first_view = view;
  for (int j = 0; j < i; j++) {
    const rcase *o = &m->cases[j];
    if (strcmp(o->op_name, c->op_name)) continue;
    first = false;
    for (int k = 0; first_view && k < o->n_in; k++) first_view = cJSON_GetArraySize(o->in_view[k]) == 0;
  }
  return first || first_view;
}

static void run_all(run_mode mode) {
  manifest m;
  manifest_load(&m);
  const char *filter = getenv("EMBER_REFERENCE_FILTER"), *verbose = getenv("EMBER_REFERENCE_VERBOSE");
  int pass = 0, refused = 0, fail = 0, total = 0, skipped = 0;
  char msg[1024], first[4096] = "";
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < m.n; i++) {
    const rcase *c = &m.cases[i];
    if (filter && !strstr(c->id, filter)) continue;
    if (!sampled(&m, i, mode)) {
      skipped++;
      continue;
    }
    total++;
    msg[0] = 0;
    if (verbose && !strcmp(verbose, "1")) /* names the case a crash happened in */
      fprintf(stderr, "[reference] %s: %s\n", mode_names[mode], c->id), fflush(stderr);
    int r = run_case(&m, c, mode, msg, sizeof msg);
    if (r == 1) pass++;
    if (r == 2) refused++;
    if (r) continue;
    fail++;
    fprintf(stderr, "[reference] FAIL %s (op %s, mode %s%s): %s\n", c->id, c->op_name, mode_names[mode],
            etest_on_cuda() ? ", cuda" : "", msg);
    if (strlen(first) < sizeof first - 200)
      snprintf(first + strlen(first), sizeof first - strlen(first), "\n  %s (op %s): %.150s", c->id, c->op_name, msg);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  /* on stderr: stdout carries Criterion's TAP */
  fprintf(stderr, "[reference] %s%s: %d of %d cases pass (%d match PyTorch, %d refused as the manifest expects), "
          "%d fail, %.1f s\n", mode_names[mode], etest_on_cuda() ? " on cuda" : "", pass + refused, total, pass,
          refused, fail, secs);
  if (skipped)
    fprintf(stderr, "[reference] %s on the CUDA emulator: a sample of %d cases, each op's first and its first on a "
            "view (and its NaN/inf cases but under inductor); %d more with EMBER_REFERENCE_ALL=1\n", mode_names[mode], total,
            skipped);
  if (mode != MODE_EAGER)
    fprintf(stderr, "[reference] %s: %d cases ran generated kernels, %lld graphs fell back to op by op, %lld graph "
            "breaks\n", mode_names[mode], tally.with_kernels, (long long)tally.fallbacks, (long long)tally.breaks);
  manifest_free(&m);
  cr_expect_eq(fail, 0, "%s: %d of %d reference cases fail:%s", mode_names[mode], fail, total, first);
}

ETEST(reference, eager) { run_all(MODE_EAGER); }
ETEST(reference, aot_eager) { run_all(MODE_AOT_EAGER); }
ETEST(reference, inductor) { run_all(MODE_INDUCTOR); }
