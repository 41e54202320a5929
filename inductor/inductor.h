/* inductor/inductor.h: the CPU code generator (first stage).
 *
 * A graph is scheduled into steps. Runs of pointwise prims over one iteration space (f32 and
 * bool values; views and scalar constants between them run first, as they only make headers)
 * are fused into one kernel: a loop nest over the output shape, the innermost dimension
 * vectorized 8 lanes wide (AVX2 ymm, the width the eager kernels and their SLEEF calls use)
 * with a scalar tail, every input read through its own strides (0 for broadcast). Each kernel
 * is emitted as LLVM IR through the C API, optimised with LLVMRunPasses (default<O3>) and
 * compiled by ORC's LLJIT. Everything else (reductions, extern GEMM and convolutions,
 * indexing, other dtypes) runs through the eager kernels for now.
 *
 * Kernels compute what the eager kernels compute, op for op, with the same SLEEF vector
 * functions in the vector body and libm in the tail, so results are bit-identical to eager
 * except where eager itself takes another path (eager runs SLEEF only on contiguous operands;
 * a kernel uses it whenever the innermost stride is 0 or 1): then within the functions' 1 ULP.
 *
 * Programs are specialised to the strides of their inputs (the frontend guards on them). Not
 * yet here (issue 6): reductions and GEMM epilogues in generated code, memory planning, OpenMP
 * threading of kernels, the disk cache. */
#ifndef EMBER_INDUCTOR_H
#define EMBER_INDUCTOR_H

#include "../runtime/rt.h"
#include "../ir/graph.h"

typedef struct ind_program ind_program;

typedef struct ind_stats {
  int kernels;        /* generated kernels */
  int fused_nodes;    /* graph nodes inside them */
  int fallback_nodes; /* nodes run by the eager kernels */
  double compile_ms;  /* lowering, LLVM optimisation and JIT */
} ind_stats;

/* Compiles g for inputs with these layouts. NULL with a reason in err when something is not
 * supported or LLVM fails (the caller falls back to the interpreter). */
ind_program *ind_compile(const ir_graph *g, em_tensor *const *inputs, ind_stats *stats, char *err, size_t cap);
/* Called with the graph's name and the reason whenever ind_compile fails (the caller then runs
 * the graph with the interpreter): the frontend logs it. */
typedef void (*ind_failure_hook)(const char *graph, const char *why);
void ind_set_failure_hook(ind_failure_hook hook);
/* Failed compiles on the calling thread (for em_compiled_stats). */
int64_t ind_failures(void);
/* Tests: with a reason, every ind_compile fails with it; NULL restores normal compiles. */
void ind_debug_fail(const char *reason);
/* Whether inputs have the dtypes, sizes and strides p was compiled for. */
bool ind_accepts(const ind_program *p, em_tensor *const *inputs, int n_inputs);
/* Runs p: outputs receive caller-owned references, as rt_interpret's. donate (NULL, or one entry
 * per graph output: an input index or -1) names inputs the caller will overwrite with an
 * output's value afterwards (functionalized in-place updates); where the memory plan allows
 * (see donatable in inductor.c) the kernel stores that output straight into the input, whose
 * version is bumped, and outputs[o] is the input itself. */
bool ind_run(const ind_program *p, em_tensor *const *inputs, int n_inputs, em_tensor **outputs, const int *donate,
             em_site site);
/* Bytes of the arena a run of p allocates for its intermediates, and the planned peak of the
 * bytes its kernels store (arena and outputs). */
int64_t ind_arena_bytes(const ind_program *p);
int64_t ind_planned_peak(const ind_program *p);
void ind_free(ind_program *p);
/* The disk cache of compiled kernels (see inductor.c), or NULL when off or unusable. */
const char *ind_cache_dir(void);
/* Where the calling thread's compiled modules came from. */
typedef struct ind_cache_stats {
  int64_t memory_hits; /* already in this process's JIT */
  int64_t disk_hits;   /* object code loaded from the disk cache */
  int64_t misses;      /* optimised and compiled by LLVM (and written to the disk cache) */
} ind_cache_stats;
ind_cache_stats ind_cache_counters(void);
/* Generated kernels the calling thread has run, for em_compiled_stats, tests and benchmarks. */
int64_t ind_kernel_runs(void);
/* The LLVM IR of p's kernels (EMBER_LOGS=output_code), or NULL. Borrowed. */
const char *ind_kernel_ir(const ind_program *p);
/* The schedule: one line per step (eager node or kernel: its iteration space, nodes, bytes
 * read and written), for EMBER_LOGS=schedule. Borrowed; NULL when out of memory. */
const char *ind_schedule(const ind_program *p);

#endif /* EMBER_INDUCTOR_H */
