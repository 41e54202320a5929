/* fuzz/fuzz_kcache.c: the CPU kernel-cache reader (header, key, size and checksum checks, then the
 * object file's symbols, through LLVM's object reader) on arbitrary bytes. The key is taken from
 * the input's own header, so real cache entries are valid seeds; the kernels looked for are the
 * names a module with that key has (em_<first 16 hex digits>_<k>, k < 4). */
#include "fuzz_common.h"

#include <string.h>

#include "../inductor/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t key[16] = {0};
  if (size >= 32) memcpy(key, data + 16, 16);
  char hex[33], names[4][48];
  for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  const char *list[4];
  for (int k = 0; k < 4; k++) snprintf(names[k], sizeof names[k], "em_%.16s_%d", hex, k), list[k] = names[k];
  int n = size ? 1 + data[size - 1] % 4 : 1;
  ind_cache_entry_ok(fz_file(data, size), key, n, list);
  fz_end();
  return 0;
}
