/* fuzz/fuzz_kcache.c: the CPU kernel-cache reader (header, key, size and checksum checks, then the
 * object file's sections, symbols and relocations, inductor/elf.c) on arbitrary bytes. The key is taken from
 * the input's own header, so real cache entries are valid seeds; the kernels looked for are the
 * names a module with that key has (em_<first 16 hex digits>_<k>, k < 4).
 *
 * A checksum (BLAKE3 of the object bytes) guards the object, and no mutation finds a matching one,
 * so for about half the inputs (the last byte's high bit set) the fuzzer writes the right
 * checksum into the header itself: those inputs reach the object reader with damaged objects,
 * as a file written whole by a broken writer would. */
#include "fuzz_common.h"

#include <llvm-c/blake3.h>
#include <string.h>

#include "../inductor/internal.h"

/* The header (jit.c's cache_header): magic[8], format u32, reserved u32, size u64, key[16], sum[16]. */
enum { KEY_AT = 24, SUM_AT = 40, HEADER = 56 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t key[16] = {0};
  if (size >= KEY_AT + 16) memcpy(key, data + KEY_AT, 16);
  char hex[33], names[4][48];
  for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  const char *list[4];
  for (int k = 0; k < 4; k++) snprintf(names[k], sizeof names[k], "em_%.16s_%d", hex, k), list[k] = names[k];
  int n = size ? 1 + data[size - 1] % 4 : 1;
  const uint8_t *entry = data;
  uint8_t *fixed = NULL;
  if (size > HEADER && (data[size - 1] & 0x80) && (fixed = malloc(size))) {
    memcpy(fixed, data, size);
    llvm_blake3_hasher h;
    llvm_blake3_hasher_init(&h);
    llvm_blake3_hasher_update(&h, fixed + HEADER, size - HEADER);
    llvm_blake3_hasher_finalize(&h, fixed + SUM_AT, 16);
    entry = fixed;
  }
  ind_cache_entry_ok(fz_file(entry, size), key, n, list);
  free(fixed);
  fz_end();
  return 0;
}
