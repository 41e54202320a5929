/* fuzz/fuzz_embr.c: the EMBR tensor-file loader (em_load) on arbitrary bytes, loading into two
 * tensors as a checkpoint restore would ("w" f32[4,3], "step" i64[]): true or a clean error,
 * never a crash or a leak. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  em_scope_begin();
  em_tensor *t[2] = {em_zeros(EM_F32, EM_SHAPE(4, 3)), em_scalar(EM_I64, 0)};
  const char *names[2] = {"w", "step"};
  bool ok = em_load(fz_file(data, size), 2, t, names);
  if (!ok && !em_last_error()) abort();
  em_scope_end();
  fz_end();
  return 0;
}
