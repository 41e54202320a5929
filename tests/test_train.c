/* tests/test_train.c: a short deterministic training run on real data: an MLP trained with SGD
 * (momentum) for 300 steps on the first 4096 Fashion-MNIST training images must bring the
 * average loss of its last 50 steps below a stated bound, and classify held-out test images
 * far better than chance. Exercises the loader, the batch iterator, composites, autograd and the
 * optimizer together. */
#include "common.h"

ETEST(train, mlp_loss_falls) {
  em_manual_seed(0);
  em_fashion_mnist d;
  cr_assert(em_fashion_mnist_load(&d, NULL), "%s", em_last_error() ? em_last_error() : "");
  em_tensor *x = em_div_scalar(em_cast(em_reshape(em_slice(d.train_images, 0, 0, 4096, 1), EM_SHAPE(-1, 784)), EM_F32), 255);
  em_tensor *y = em_cast(em_slice(d.train_labels, 0, 0, 4096, 1), EM_I64);
  em_linear_layer l1, l2;
  cr_assert(em_linear_layer_init(&l1, 784, 128, true) && em_linear_layer_init(&l2, 128, 10, true));
  em_tensor *params[4] = {l1.weight, l1.bias, l2.weight, l2.bias};
  em_optimizer *opt = em_sgd_new(4, params, ((em_sgd_opts){0.1, 0.9, 0, 0, false}));
  em_batch_iter *it = em_batch_iter_new(4096, 64, true, 0, true);
  cr_assert(opt && it);
  double first = 0, last = 0;
  for (int step = 0; step < 300; step++) {
    em_scope_begin();
    em_tensor *idx = em_batch_iter_next(it);
    if (!idx) idx = em_batch_iter_next(it); /* next epoch */
    em_tensor *logits = em_linear(em_relu(em_linear(em_index_select(x, 0, idx), l1.weight, l1.bias)), l2.weight, l2.bias);
    em_tensor *loss = em_cross_entropy(logits, em_index_select(y, 0, idx), EM_CROSS_ENTROPY_DEFAULT);
    em_optimizer_zero_grad(opt);
    cr_assert(loss && em_backward(loss, NULL) && em_optimizer_step(opt), "%s", em_last_error() ? em_last_error() : "");
    double l = em_item(loss);
    if (step < 10) first += l / 10;
    if (step >= 250) last += l / 50;
    em_scope_end();
  }
  cr_log_info("loss: first 10 steps %.4f, last 50 steps %.4f", first, last);
  cr_assert_gt(first, 1.5, "an untrained 10-class model starts near ln 10 = 2.30, got %.4f", first);
  cr_assert_lt(last, 0.55, "loss of the last 50 steps %.4f is not below 0.55", last);
  /* held-out accuracy on 2000 test images */
  em_no_grad_begin();
  em_tensor *tx = em_div_scalar(em_cast(em_reshape(em_slice(d.test_images, 0, 0, 2000, 1), EM_SHAPE(-1, 784)), EM_F32), 255);
  em_tensor *pred = em_argmax(em_linear(em_relu(em_linear(tx, l1.weight, l1.bias)), l2.weight, l2.bias), 1, false);
  double acc = em_item(em_sum(em_eq(pred, em_cast(em_slice(d.test_labels, 0, 0, 2000, 1), EM_I64)), 0, NULL, false)) / 2000;
  em_no_grad_end();
  cr_log_info("test accuracy %.3f", acc);
  cr_assert_gt(acc, 0.75, "test accuracy %.3f", acc);
  em_batch_iter_free(it);
  em_optimizer_free(opt);
}
