/* fuzz/fuzz_idx.c: the IDX loader (em_load_idx; raw or gzip, as MNIST ships) on arbitrary
 * bytes: a tensor or a clean error, never a crash, an over-allocation or a leak. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  em_scope_begin();
  em_tensor *t = em_load_idx(fz_file(data, size));
  if (!t && !em_last_error()) abort();
  em_scope_end();
  fz_end();
  return 0;
}
