/* examples/explain.c: em_compile on a function with a data-dependent branch, and what
 * em_explain says about it (the README quotes its output).
 *
 * The model normalises its input, then branches on a value read back with em_item: that read
 * needs data, so it is a graph break. em_explain reports both graphs, the break with its
 * reason and this file's line, and the guards a cache entry would carry. */
#include <ember.h>

#include <stdio.h>

typedef struct model {
  em_linear_layer fc;
} model;

static em_outputs forward(void *ctx, em_tensor *const *in, int n) {
  model *m = ctx;
  em_tensor *h = em_layer_norm(in[0], 1, EM_NONE, EM_NONE, 1e-5);
  em_tensor *z = em_linear(h, m->fc.weight, m->fc.bias);
  if (em_item(em_amax(z, 0, NULL, false)) > 3.0) /* data-dependent control flow: a graph break */
    z = em_mul_scalar(z, 0.5);
  return EM_OUTPUTS(em_softmax(z, -1));
}

int main(void) {
  em_scope_begin();
  em_manual_seed(0);
  model m;
  if (!em_linear_layer_init(&m.fc, 16, 4, true)) return 1;
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(8, 16));
  em_explanation *e = em_explain(forward, &m, x);
  if (!e) {
    fprintf(stderr, "%s\n", em_last_error());
    return 1;
  }
  em_explanation_free(e);

  em_compiled *c = em_compile(forward, &(em_compile_options){.name = "forward"});
  for (int i = 0; i < 3; i++) em_call(c, &m, x);
  em_compile_stats s = em_compiled_stats(c);
  printf("3 calls: %lld traced, %lld graphs compiled, %lld found in the graph cache, %lld breaks\n",
         (long long)s.traces, (long long)s.graphs_compiled, (long long)s.graph_cache_hits, (long long)s.breaks);
  em_compiled_free(c);
  em_scope_end();
  em_thread_cleanup();
  return 0;
}
