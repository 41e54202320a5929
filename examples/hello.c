/* examples/hello.c: a first taste of Ember's eager API (the README's run command, until the
 * Fashion-MNIST trainer arrives). */
#include <ember.h>
#include <stdio.h>

int main(void) {
  em_manual_seed(42);
  em_scope_begin();
  em_tensor *a = em_arange(EM_F32, 0, 6, 1);
  em_tensor *m = em_reshape(a, EM_SHAPE(2, 3));
  em_tensor *w = em_randn(EM_F32, EM_SHAPE(3, 4));
  em_tensor *y = em_add(em_matmul(m, w), em_ones(EM_F32, EM_SHAPE(4)));
  em_tensor *s = em_sum(em_exp(em_mul_scalar(y, 0.1)), EM_AXES(1), false);
  printf("m = ");
  em_print(m);
  printf("y = m @ w + 1 = ");
  em_print(y);
  printf("sum(exp(0.1 y), dim=1) = ");
  em_print(s);
  em_tensor *bad = em_matmul(w, m); /* [3,4] @ [2,3]: inner dims differ */
  if (!bad) printf("error, as expected:\n  %s\n", em_last_error());
  em_clear_error();
  em_scope_end();
  em_thread_cleanup();
  return em_debug_live_tensors() == 0 ? 0 : 1;
}
