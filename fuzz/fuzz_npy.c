/* fuzz/fuzz_npy.c: the .npy loader (em_load_npy) on arbitrary bytes: a tensor or a clean error,
 * never a crash, an over-allocation (ASan's allocation limit) or a leak. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  em_scope_begin();
  em_tensor *t = em_load_npy(fz_file(data, size));
  if (!t && !em_last_error()) abort(); /* a failure always says why */
  em_scope_end();
  fz_end();
  return 0;
}
