/* tools/failmalloc.c: an LD_PRELOAD shim that makes one chosen heap allocation of the process
 * fail, to test what happens below Ember when memory runs out.
 *
 * em_debug_fail_alloc covers Ember's own allocator; the libraries under it (oneDNN, LLVM,
 * libgomp, libstdc++'s operator new) call malloc directly, and only a shim in front of malloc
 * reaches them. Every malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign, valloc
 * and pvalloc is counted (operator new is malloc underneath in libstdc++); the n-th one after
 * the arm point returns NULL (ENOMEM), once, and the shim writes the failing call's backtrace
 * to stderr so a driver can say which library received the NULL.
 *
 *   FAILMALLOC_N=n       fail the n-th allocation counted from process start (unless armed)
 *   failmalloc_arm(n)    found by the program with dlsym: fail the n-th allocation from now
 *                        (n = 0 disarms); returns the allocations counted so far
 *   failmalloc_count()   allocations counted since process start, all threads
 *   FAILMALLOC_QUIET=1   no backtrace on failure
 *   FAILMALLOC_CALLER=s  count (and fail) only allocations with a frame on the stack in a loaded
 *                        object whose path contains s (libdnnl, libLLVM): aims the failure at
 *                        one library, so a test can try each of its allocations in a step
 *
 * The real allocator is glibc's, through its exported __libc_* entry points (dlsym would itself
 * allocate). Built by meson as a shared module (tools/libfailmalloc.so). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <execinfo.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#define EXPORT __attribute__((visibility("default")))

static int64_t count, fail_at;
static bool quiet;
static const char *caller; /* FAILMALLOC_CALLER, or NULL */
static _Thread_local bool inside; /* the shim's own calls (backtrace) are not counted */

static void say_failure(int64_t k, const char *fn, size_t bytes) {
  if (quiet) return;
  char line[160];
  int n = snprintf(line, sizeof line, "failmalloc: failing allocation #%lld: %s(%zu)\n", (long long)k, fn, bytes);
  if (write(2, line, (size_t)n) < 0) return;
  void *frames[64];
  inside = true;
  int nf = backtrace(frames, 64);
  backtrace_symbols_fd(frames, nf, 2);
  inside = false;
  static const char end[] = "failmalloc: end of backtrace\n";
  if (write(2, end, sizeof end - 1) < 0) return;
}

/* Whether some frame of the calling thread's stack lies in an object whose path has `caller`. */
static bool called_from(void) {
  void *frames[48];
  inside = true;
  int n = backtrace(frames, 48);
  inside = false;
  for (int i = 2; i < n; i++) {
    /* _dl_find_object (glibc 2.35) finds the object without dladdr's search of its symbols */
    struct dl_find_object o;
    if (!_dl_find_object(frames[i], &o) && o.dlfo_link_map && strstr(o.dlfo_link_map->l_name, caller)) return true;
  }
  return false;
}

/* Whether this allocation is the one to fail. */
static bool should_fail(const char *fn, size_t bytes) {
  if (inside) return false;
  if (caller && !called_from()) return false;
  int64_t k = __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED);
  int64_t f = __atomic_load_n(&fail_at, __ATOMIC_RELAXED);
  if (!f || k != f) return false;
  say_failure(k, fn, bytes);
  return true;
}

EXPORT int64_t failmalloc_count(void) { return __atomic_load_n(&count, __ATOMIC_RELAXED); }

EXPORT int64_t failmalloc_arm(int64_t n) {
  /* backtrace() loads libgcc_s on its first call, which allocates: do that now, uncounted */
  void *frames[4];
  inside = true;
  backtrace(frames, 4);
  inside = false;
  int64_t now = failmalloc_count();
  __atomic_store_n(&fail_at, n > 0 ? now + n : 0, __ATOMIC_RELAXED);
  return now;
}

__attribute__((constructor)) static void init(void) {
  const char *q = getenv("FAILMALLOC_QUIET");
  quiet = q && *q && strcmp(q, "0");
  const char *c = getenv("FAILMALLOC_CALLER");
  caller = c && *c ? c : NULL;
  if (caller) { /* backtrace() loads libgcc_s on its first call, which allocates: now, uncounted */
    void *frames[4];
    inside = true;
    backtrace(frames, 4);
    inside = false;
  }
  const char *n = getenv("FAILMALLOC_N");
  if (n && atoll(n) > 0) fail_at = atoll(n);
}

static void *nomem(void) {
  errno = ENOMEM;
  return NULL;
}

EXPORT void *malloc(size_t n) { return should_fail("malloc", n) ? nomem() : __libc_malloc(n); }
EXPORT void *calloc(size_t a, size_t b) { return should_fail("calloc", a * b) ? nomem() : __libc_calloc(a, b); }
EXPORT void *realloc(void *p, size_t n) {
  /* realloc(p, 0) frees; that is not an allocation that can fail */
  return p && !n ? __libc_realloc(p, n) : should_fail("realloc", n) ? nomem() : __libc_realloc(p, n);
}
EXPORT void *memalign(size_t a, size_t n) { return should_fail("memalign", n) ? nomem() : __libc_memalign(a, n); }
EXPORT void *aligned_alloc(size_t a, size_t n) {
  return should_fail("aligned_alloc", n) ? nomem() : __libc_memalign(a, n);
}
EXPORT int posix_memalign(void **p, size_t a, size_t n) {
  if (a < sizeof(void *) || (a & (a - 1))) return EINVAL;
  if (should_fail("posix_memalign", n)) return ENOMEM;
  void *r = __libc_memalign(a, n);
  if (!r) return ENOMEM;
  *p = r;
  return 0;
}
EXPORT void *valloc(size_t n) { return should_fail("valloc", n) ? nomem() : __libc_valloc(n); }
EXPORT void *pvalloc(size_t n) { return should_fail("pvalloc", n) ? nomem() : __libc_pvalloc(n); }
