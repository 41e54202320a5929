/* fuzz/fuzz_embr.c: the checkpoint loader (em_load: safetensors, or the former EMBR format; the
 * corpus has both) on arbitrary bytes, loading into two
 * tensors as a checkpoint restore would ("w" f32[4,3], "step" i64[]), then, from the same file,
 * a bool mask ("mask" bool[2,2]): true or a clean error, never a crash or a leak. What loads
 * must be a value Ember can compute with: a bool element is the byte 0 or 1 (the kernels take
 * and/or on them bitwise, so a 2 would read as true alone but false in a logical and). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fz_file(data, size);
  em_scope_begin();
  em_tensor *t[2] = {em_zeros(EM_F32, EM_SHAPE(4, 3)), em_scalar(EM_I64, 0)};
  const char *names[2] = {"w", "step"};
  bool ok = em_load(path, 2, t, names);
  if (!ok && !em_last_error()) abort();
  em_clear_error();
  em_tensor *mask = em_zeros(EM_BOOL, EM_SHAPE(2, 2));
  ok = em_load(path, 1, &mask, (const char *[]){"mask"});
  if (!ok && !em_last_error()) abort();
  uint8_t bytes[4];
  if (ok && em_to_buffer(mask, EM_BOOL, bytes, sizeof bytes))
    for (int i = 0; i < 4; i++)
      if (bytes[i] > 1) fprintf(stderr, "fuzz: loaded bool byte %d\n", bytes[i]), abort();
  em_scope_end();
  fz_end();
  return 0;
}
