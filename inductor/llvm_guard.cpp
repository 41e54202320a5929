/* inductor/llvm_guard.cpp: the C++ boundary in front of LLVM.
 *
 * LLVM reports running out of memory in three ways, none of which returns to its caller:
 * operator new throws std::bad_alloc; its own allocators (safe_malloc, BumpPtrAllocator) call
 * report_bad_alloc_error, which without a handler prints "LLVM ERROR: out of memory" and
 * aborts; other failures call report_fatal_error, which runs the fatal-error handler and then
 * exits the process (a handler must not return). So the inductor runs every piece of LLVM work
 * inside ind_llvm_guard, and the handlers installed here turn both reports into a C++ exception
 * while a guard is open on the calling thread; the guard catches it and returns an error, and
 * the inductor runs the graph op by op instead.
 *
 * Why that is sound, and what it costs. Debian's LLVM is built with -fno-exceptions but with
 * unwind tables (llvm-config --cxxflags: -fno-exceptions -funwind-tables), and Ember's C code has
 * them too (gcc's default on x86-64, asked for explicitly in meson.build), so an exception
 * unwinds from the handler through LLVM's frames and Ember's to the guard. No destructor runs in
 * LLVM's frames on the way (they have no cleanup code) and none of Ember's frees in between
 * either: what the interrupted work was building (an LLVMContext, a module, a target machine)
 * may be half-updated, so the caller does not dispose of it but leaks it, and a lock LLVM held
 * stays held, so after a failure inside the JIT itself (ORC's session lock) the inductor stops
 * using the JIT for good (kernels already loaded keep working). Outside a guard (another
 * thread's LLVM use, if any) the handlers do what LLVM would: print the reason and abort. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <llvm-c/ErrorHandling.h>
#include <llvm/Support/ErrorHandling.h>

#include "llvm_guard.h"

namespace {

thread_local int depth; /* guards open on this thread */

struct fatal_error {
  char reason[200];
};

[[noreturn]] void fatal(const char *reason) {
  if (depth > 0) {
    fatal_error e;
    std::snprintf(e.reason, sizeof e.reason, "%s", reason ? reason : "?");
    throw e;
  }
  std::fprintf(stderr, "LLVM ERROR: %s\n", reason ? reason : "?");
  std::abort();
}

void on_fatal(const char *reason) { fatal(reason); }

void on_bad_alloc(void *, const char *reason, bool) {
  if (depth > 0) throw std::bad_alloc();
  fatal(reason);
}

/* A thread's ind_llvm_at_thread_end hook. C++ destroys the thread_local objects of the thread
 * that calls exit() (or returns from main) before it destroys any object of static storage
 * duration ([basic.start.term]p1; glibc's exit() calls __call_tls_dtors before the atexit
 * handlers), whenever the latter were constructed: LLVM makes some of its statics lazily,
 * inside a compile, so an atexit handler registered before that compile runs after their
 * destructors. This destructor does not. */
struct thread_end_hook {
  void (*fn)(void) = nullptr;
  ~thread_end_hook() {
    if (fn) fn();
  }
};

thread_local thread_end_hook thread_end;

} // namespace

/* The first use on a thread registers the destructor (__cxa_thread_atexit: out of memory, it
 * is not registered and fn does not run). */
extern "C" void ind_llvm_at_thread_end(void (*fn)(void)) { thread_end.fn = fn; }

extern "C" void ind_llvm_install_handlers(void) {
  static bool done;
  if (done) return;
  done = true;
  LLVMInstallFatalErrorHandler(on_fatal);
  llvm::install_bad_alloc_error_handler(on_bad_alloc, nullptr);
}

extern "C" ind_llvm_outcome ind_llvm_guard(void (*fn)(void *), void *arg, char *err, size_t cap) {
  depth++;
  try {
    fn(arg);
    depth--;
    return IND_LLVM_OK;
  } catch (const std::bad_alloc &) {
    depth--;
    std::snprintf(err, cap, "out of memory in LLVM");
    return IND_LLVM_THREW;
  } catch (const fatal_error &e) {
    depth--;
    std::snprintf(err, cap, "LLVM: %s", std::strstr(e.reason, "out of memory") ? "out of memory" : e.reason);
    return IND_LLVM_THREW;
  } catch (...) {
    depth--;
    std::snprintf(err, cap, "LLVM threw an exception");
    return IND_LLVM_THREW;
  }
}
