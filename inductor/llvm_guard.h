/* inductor/llvm_guard.h: LLVM work behind a C++ boundary (inductor/llvm_guard.cpp). */
#ifndef EMBER_LLVM_GUARD_H
#define EMBER_LLVM_GUARD_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  IND_LLVM_OK,   /* fn returned */
  IND_LLVM_THREW /* LLVM ran out of memory or hit a fatal error inside fn: err says which; what
                  * fn was working on may be half-updated (leak it, do not dispose of it) */
} ind_llvm_outcome;

/* Installs LLVM's fatal-error and bad-alloc handlers (once per process): inside a guard they
 * throw to it; outside one they print the reason and abort, as LLVM would. */
void ind_llvm_install_handlers(void);

/* Runs fn(arg), catching what LLVM throws or reports from inside it. fn must hold no lock and
 * keep what it allocates where its caller can find it: an exception skips the rest of fn. */
ind_llvm_outcome ind_llvm_guard(void (*fn)(void *), void *arg, char *err, size_t cap);

/* Runs fn() when the calling thread ends: when it returns or calls pthread_exit, and when it
 * calls exit() or returns from main, then before any static object's destructor, LLVM's
 * included (a C++ thread_local's destructor: [basic.start.term]). One fn per thread; NULL
 * clears it. Out of memory registering it, fn does not run. */
void ind_llvm_at_thread_end(void (*fn)(void));

#ifdef __cplusplus
}
#endif

#endif
