/* runtime/isa.c: the instruction set Ember's CPU code may use (issues 20 and 23).
 *
 * The project's machines are x86 with AVX2 only (Zen 3) or with AVX-512 (Zen 4 and 5). To measure
 * both from one AVX-512 machine, EMBER_CPU_ISA=avx2 holds the process to AVX2: the LLVM code
 * generator (inductor/jit.c: every AVX-512 feature off, 8-lane f32 vectors, SLEEF's AVX2
 * functions, a kernel cache key of its own) and oneDNN (prims/extern.c: dnnl_set_max_cpu_isa).
 * The eager C kernels are compiled ahead of time: a build configured with -Dcpu_isa=avx2
 * compiles them for x86-64-v3 (AVX2, FMA) tuned for Zen 3 and makes avx2 the default here. */
#include <ember.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef EMBER_CPU_ISA_DEFAULT
#define EMBER_CPU_ISA_DEFAULT "native"
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const char *isa = "native";

/* The host's widest vector ISA that Ember uses: "avx512" (AVX-512 F, which LLVM's 16-lane
 * kernels need), "avx2" (with FMA: x86-64-v3's vector part), else "baseline". */
static const char *host_isa(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512"; /* libgcc checks the OS saves the state */
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  return "baseline";
#else
  return "native";
#endif
}

static void init(void) {
  const char *want = getenv("EMBER_CPU_ISA"), *no512 = getenv("EMBER_NO_AVX512");
  if (!want || !*want) want = no512 ? "avx2" : EMBER_CPU_ISA_DEFAULT; /* the older switch, an alias */
  const char *host = host_isa();
  isa = host;
  if (!strcmp(want, "avx2")) {
    if (!strcmp(host, "avx512")) isa = "avx2"; /* a ceiling: a host without AVX2 keeps what it has */
  } else if (strcmp(want, "native") && strcmp(want, "avx512")) {
    fprintf(stderr, "[ember] EMBER_CPU_ISA: unknown value '%s' (known: native, avx2, avx512); using native\n", want);
  }
}

const char *em_cpu_isa(void) {
  pthread_once(&once, init);
  return isa;
}

