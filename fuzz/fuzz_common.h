/* fuzz/fuzz_common.h: what the libFuzzer targets share. The loaders take paths, so each input
 * is written to one memfd per process and the loader reads it back as /proc/self/fd/N. Every
 * target clears Ember's sticky error after each input and checks that nothing leaked: a tensor
 * still alive after the input's scope ends is a crash (abort) the fuzzer reports. */
#ifndef EMBER_FUZZ_COMMON_H
#define EMBER_FUZZ_COMMON_H

#include <ember.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The input's bytes as a file; returns its path (valid until the next call). */
static const char *fz_file(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("ember_fuzz", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
  return path;
}

/* After each input: errors are cleared, and every tensor made while reading it is gone. */
static void fz_end(void) {
  em_clear_error();
  if (em_debug_live_tensors() != 0) {
    fprintf(stderr, "fuzz: %lld tensors leaked\n", (long long)em_debug_live_tensors());
    abort();
  }
}

#endif
