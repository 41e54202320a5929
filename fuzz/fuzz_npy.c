/* fuzz/fuzz_npy.c: the .npy loader (em_load_npy) on arbitrary bytes: a tensor or a clean error,
 * never a crash, an over-allocation (ASan's allocation limit) or a leak. A bool tensor's
 * elements are the bytes 0 and 1 (see fuzz_embr.c). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  em_scope_begin();
  em_tensor *t = em_load_npy(fz_file(data, size));
  if (!t && !em_last_error()) abort(); /* a failure always says why */
  if (t && em_dtype_of(t) == EM_BOOL && em_numel(t) <= 64) {
    uint8_t bytes[64];
    if (em_to_buffer(t, EM_BOOL, bytes, (size_t)em_numel(t)))
      for (int64_t i = 0; i < em_numel(t); i++)
        if (bytes[i] > 1) fprintf(stderr, "fuzz: loaded bool byte %d\n", bytes[i]), abort();
  }
  em_scope_end();
  fz_end();
  return 0;
}
