/* inductor/inductor.h: the code generator: lowering, fusion, memory planning, LLVM JIT for the
 * CPU, CUDA C through NVRTC for the GPU.
 *
 * Lowering. Each prim node of a graph becomes part of a generated kernel or a step run by the
 * eager kernels (extern GEMM and convolutions, indexing, copies, other dtypes). Views and scalar
 * constants only make headers: they run as steps between the nodes of a kernel. A contiguous
 * copy of a transposed product (clone(transpose(matmul(a, b))), the weight gradients the
 * autograd engine accumulates) is lowered to the product b^T a^T, which the GEMM writes
 * contiguous: no transposing copy.
 *
 * Fusion (the schedule). Nodes are taken in graph order into the open kernel while they fit its
 * iteration space:
 *  - pointwise kernels: pointwise prims over one shape whose scalar expression (prims.def) the
 *    LLVM renderer renders for their dtypes (f32 and f64 arithmetic and transcendentals, i32/i64/u8
 *    add, sub, mul, neg, abs, comparisons, bool logic, conversions; not f16 values, pow or
 *    remainder: those run op by op, counted in ind_stats.dtype_eager_nodes and named
 *    in the schedule), vertical chains and horizontal
 *    neighbours alike; a sum/amax/amin over leading dims (a bias gradient) joins as a column
 *    reduction, accumulated in its output (one thread per column block);
 *  - row kernels: an f32 or f64 sum/amax/amin over trailing dims makes the kernel a loop over rows; the
 *    pointwise prologue (the reduction's operand chain), per-row arithmetic on the reduced
 *    values, their broadcasts back over the row and the pointwise epilogue all join, so
 *    softmax, log_softmax, layer_norm, rms_norm and cross entropy's log-softmax are one kernel.
 *    Each value is computed once per row, in the pass over the row where its inputs are ready;
 *    one a later pass reads is kept in a per-thread scratch row (the row is in cache).
 *  - random values (issue 20): a Philox uniform or normal in f32 or f64 on the CPU joins a
 *    pointwise kernel over its shape, which computes each element from its Philox counter as the
 *    eager kernel does (the same bits: dropout's uniform, mask and scale fuse with their
 *    neighbours); each call reserves the counters in graph order and passes seed and offset to
 *    the kernel (ind_run_rng), so the code never changes. Row kernels and CUDA programs do not
 *    take them (CUDA graphs with random nodes run op by op).
 * Scalar work first (rewrite.c: hoist_scalars): nodes of at most one element whose operands are
 * all of at most one element (an optimizer's lr casts and AdamW's bias corrections) move to the
 * front of the graph, so they no longer split the pointwise chains they sit between
 * (EMBER_INDUCTOR_SCALAR_HOIST=0: off).
 * Combo kernels (schedule.c: combine_kernels; issue 20): adjacent pointwise kernels that are
 * independent (none reads what another computes) run as one step, one parallel region over their
 * index spaces laid end to end, each part its own code and buffers, large parts split in blocks
 * (run.c: run_combo): a compiled optimizer step updates every parameter in one kernel, as
 * PyTorch's foreach/fused optimizers and TorchInductor's combo kernels do. At most 64 parts; not
 * row kernels or column reductions; CPU only (ind_renderer.combo_kernels). Counted in
 * ind_stats.combo_kernels and em_compile_stats.combo_kernel_runs; EMBER_INDUCTOR_COMBO=0: off.
 * A node that fits neither closes the kernel. The consumers of a GEMM's output (bias,
 * activation, residual) are the first nodes of the kernel after it: the GEMM's epilogue; but an
 * f32 bias add over the rows and a ReLU or GELU after it (em_linear's pattern) run inside the
 * GEMM, on each of its tiles while in cache (schedule.c, prim_gemm_epilogue).
 * EMBER_LOGS=schedule prints every step: kernel, iteration space, nodes, bytes moved.
 *
 * Memory planning. Liveness over the schedule, alias-aware (a view keeps its base alive). The
 * intermediates kernels store get fixed byte offsets in one arena per run, reused as values die;
 * graph outputs are ordinary tensors. Outputs the caller writes back into inputs (optimizer
 * updates) are stored straight into those inputs when the plan shows it safe (ind_run).
 *
 * Code generation. Each kernel is LLVM IR built through the C API: loops over rows and columns,
 * the innermost dimension vectorized 16 lanes wide with AVX-512 (8 with AVX2; half that in a
 * kernel holding f64 or i64 values; f64 transcendentals are SLEEF's f64 u10 functions) plus a scalar
 * tail, every input read through its own strides (0 for broadcast); reductions keep four
 * independent vector accumulators; exp, log, tanh, erf, ... are SLEEF's u10 vector functions
 * (1 ULP), in the scalar tail too (on a broadcast), so no result depends on its lane. A short pass pipeline (SROA, early CSE,
 * instcombine, LICM, GVN) and the host's target machine produce object code, loaded into ORC's
 * LLJIT. Kernels take row and column ranges, so the runtime splits them across OpenMP threads.
 *
 * CUDA (inductor/cuda_codegen.c). A graph whose inputs are on the GPU is scheduled by the same
 * rules, except that column reductions run eagerly (the GPU has no cheap cross-block order), and
 * its kernels are rendered as CUDA C from the same scalar expressions as the eager CUDA kernels:
 * pointwise kernels as grid-stride loops, row kernels as a block per row. What fuses there is
 * what the CUDA renderer renders (ind_cuda_renders): f32, f64, f16, bf16 and bool values (f16
 * and bf16 computed in f32 and rounded to their dtype after each op, as eager stores them, so
 * fused half chains give eager's bits); integer arithmetic stays with the eager kernels. A row kernel makes the
 * same passes as on the CPU; each thread accumulates its columns, the block combines them with
 * warp shuffles (butterfly, so every lane holds the same bits) and the warps in a fixed order
 * through shared memory, so results do not depend on timing. When the row fits in registers (up
 * to 8 columns a thread) the kernel keeps the values a later pass reads in them and reads each
 * input once (a persistent row kernel, as Triton's persistent reductions); otherwise each pass
 * recomputes them from the inputs, which the L1/L2 caches hold, rather than spilling them to
 * global memory.
 *
 * Kernel cache: in memory (the JIT's symbol table) and on disk (see inductor.c), keyed by the
 * BLAKE3 hash of a module's IR, the host CPU and the LLVM version.
 *
 * Numerics: pointwise arithmetic, comparisons, where, floor, ceil, sign and conversions are
 * eager's bits; exp, log, sin, ... are the SLEEF u10 functions eager runs too, tanh SLEEF's u35
 * (3.5 ULP), atan2 SLEEF's u10 against eager's double atan2 rounded to f32; reductions sum in another order than the
 * eager kernels (vector lanes, then lanes in order), within 1e-5 relative in the tests.
 *
 * Programs are specialised to the dtypes, sizes and strides of their inputs (ind_accepts); a
 * graph keeps one per input layout met (ind_variant). */
#ifndef EMBER_INDUCTOR_H
#define EMBER_INDUCTOR_H

#include "../runtime/rt.h"
#include "../ir/graph.h"

typedef struct ind_program ind_program;

typedef struct ind_stats {
  int kernels;        /* generated kernels */
  int fused_nodes;    /* graph nodes inside them */
  int fallback_nodes; /* nodes run by the eager kernels */
  int dtype_eager_nodes; /* of those, the ones that run op by op only for their dtypes (CPU programs): pointwise
                          * nodes the LLVM renderer renders in f32 but not in theirs (f16 and bf16 values),
                          * and sums, amax and amin not in f32 or f64 (ind_dtype_eager) */
  int recomputed_nodes; /* nodes emitted again where a later kernel reads their value (rewrite.c) */
  int scatter_sums;     /* sums of slice scatters made one cat (rewrite.c) */
  int window_reductions; /* amax / amin over a small non-trailing window made pointwise (rewrite.c) */
  int gemm_epilogues;    /* GEMMs whose bias and activation cuBLASLt (CUDA) or the GEMM's tiles (CPU) apply */
  int combo_kernels;     /* steps that run several independent pointwise kernels in one parallel region */
  int combo_parts;       /* the kernels (of `kernels`) inside them */
  double compile_ms;  /* lowering, LLVM optimisation and JIT */
} ind_stats;

/* How programs run: em_compile_options.mode (all false: "default"). */
/* A code generator target, as QBE's Target and tinygrad's Renderer: the facts the scheduler
 * asks of it and the entry that turns a schedule's kernels into code. One schedule (schedule.c)
 * is walked by either renderer: the LLVM one for the CPU (codegen.c, jit.c) and the CUDA C one
 * (cuda_codegen.c). Both render each pointwise node from its prim's scalar expression in the
 * prim table (prims.def, prim_scalar_expr), so a prim's math is written once; what differs per
 * target is in this table. The two do not share a per-node walker: the LLVM renderer builds SSA
 * vectors of LANES lanes with masked tails and row passes over a thread's rows, the CUDA one
 * writes scalar C per thread with grid-stride loops and block reductions; a common walker would
 * force one model on the other, and both already share the schedule (which nodes make which
 * kernel, its iteration shape, its passes, its inputs and outputs) and the expressions. */
typedef struct ind_renderer {
  const char *name;  /* "llvm" or "cuda" */
  em_device device;  /* where its kernels run */
  /* whether pointwise node n's value can be computed inside its kernels (its scalar expression
   * instantiated for the node's dtypes uses only ops the renderer has for them) */
  bool (*renders)(const ir_graph *g, const ir_node *n);
  /* whether n runs op by op only because of its dtypes (counted in ind_stats.dtype_eager_nodes);
   * NULL: not counted */
  bool (*dtype_eager)(const ir_graph *g, const ir_node *n);
  bool column_reductions;  /* reductions over leading dims accumulate in its pointwise kernels */
  bool row_f64;            /* its row kernels accumulate f64 as well as f32 */
  bool gemm_epilogues;     /* matmul + bias [+ ReLU | tanh GELU] run as one library call */
  bool combo_kernels;      /* adjacent independent pointwise kernels may run as one combo kernel (one
                            * parallel region over their index spaces; schedule.c: combine_kernels) */
  /* renders p's scheduled kernels and makes them callable (p->kernels[k].fn or .cu_fn) */
  bool (*build)(ind_program *p, const prim_meta *meta, char *err, size_t cap);
} ind_renderer;

/* renderer.c: the CPU's and the GPU's renderers, and the one for a device. */
extern const ind_renderer ind_llvm_renderer, ind_cuda_renderer;
const ind_renderer *ind_renderer_for(em_device device);

typedef struct ind_options {
  bool cuda_graphs; /* "reduce-overhead": a CUDA program's calls replay one CUDA graph (cudagraph.c) */
  bool autotune;    /* "max-autotune": CUDA kernels' launch configurations and GEMMs' cuBLASLt algorithms
                     * timed, the fastest kept */
  bool sizes_as_args; /* CPU kernels read every size, stride and scalar constant of the graph from a
                     * table passed at run time instead of having them as immediates: the same
                     * graph at another size (a dynamic entry) emits the same LLVM IR, so its
                     * module is found in the kernel cache instead of compiled again */
  const ind_renderer *renderer; /* the renderer to compile with; NULL: the one for the inputs'
                     * device (tests hand one that renders less, to check the scheduler asks it) */
} ind_options;

/* Compiles g for inputs with these layouts. NULL with a reason in err when something is not
 * supported or LLVM fails (the caller falls back to the interpreter). opts may be NULL. */
ind_program *ind_compile(const ir_graph *g, em_tensor *const *inputs, ind_stats *stats, char *err, size_t cap);
ind_program *ind_compile_opts(const ir_graph *g, em_tensor *const *inputs, const ind_options *opts, ind_stats *stats,
                              char *err, size_t cap);
/* CUDA graph launches so far on the calling thread (reduce-overhead). */
int64_t ind_cuda_graph_replays(void);
/* max-autotune on the calling thread: kernels timed, and kernels whose choice came from the
 * disk cache. */
typedef struct ind_autotune_stats {
  int64_t tuned, cached;
  int64_t gemms_tuned, gemms_cached; /* GEMMs whose cuBLASLt algorithm was timed, or found on disk */
  int64_t candidates; /* kernel configurations timed (block sizes, scalar and vector variants) */
} ind_autotune_stats;
ind_autotune_stats ind_autotune_stats_get(void);
/* Tests: a nonzero salt keys every later autotuning choice apart from earlier runs' (0: none). */
void ind_autotune_salt(unsigned long long salt);
/* Called with the graph's name and the reason whenever ind_compile fails (the caller then runs
 * the graph with the interpreter): the frontend logs it. */
typedef void (*ind_failure_hook)(const char *graph, const char *why);
void ind_set_failure_hook(ind_failure_hook hook);
/* Called after every successful ind_compile (the frontend logs the schedule and the code). */
typedef void (*ind_compiled_hook)(const char *graph, const ind_program *p);
void ind_set_compiled_hook(ind_compiled_hook hook);
/* What ind_compile made of a graph. */
ind_stats ind_program_stats(const ind_program *p);
/* Failed compiles on the calling thread (for em_compiled_stats). */
int64_t ind_failures(void);
/* The host CPU the code generator targets (LLVM's name), or NULL before the JIT started. */
const char *ind_cpu_name(void);
/* Tests: with a reason, every ind_compile fails with it; NULL restores normal compiles. */
void ind_debug_fail(const char *reason);
/* The programs of one graph, one per input layout met (strides differ between calls when an
 * input is sometimes a transposed or sliced view): at most IND_MAX_VARIANTS, then the graph
 * runs op by op for new layouts. Zero-initialise. */
enum { IND_MAX_VARIANTS = 4 };
typedef struct ind_variants {
  ind_options opts; /* set by the owner before the first ind_variant */
  ind_program *p[IND_MAX_VARIANTS];
  int n;
  bool failed; /* a compile failed: do not try again (the reason was reported) */
} ind_variants;
/* The program for these inputs' layouts, compiled now if new; NULL: run g op by op. */
ind_program *ind_variant(ind_variants *v, const ir_graph *g, em_tensor *const *inputs, int n_inputs);
void ind_variants_free(ind_variants *v);
/* Whether inputs have the dtypes, sizes and strides p was compiled for. */
bool ind_accepts(const ind_program *p, em_tensor *const *inputs, int n_inputs);
/* Runs p: outputs receive caller-owned references, as rt_interpret's. donate (NULL, or one entry
 * per graph output: an input index or -1) names inputs the caller will overwrite with an
 * output's value afterwards (functionalized in-place updates); where the memory plan allows
 * (see donatable in inductor.c) the kernel stores that output straight into the input, whose
 * version is bumped, and outputs[o] is the input itself. */
bool ind_run(const ind_program *p, em_tensor *const *inputs, int n_inputs, em_tensor **outputs, const int *donate,
             em_site site);
/* ind_run for a graph with random nodes: their Philox counters come from the rng slots of
 * rng (NULL: none) as rt_interpret takes them (a slot the forward filled is replayed, an empty
 * one filled), else are reserved at the call, in graph order; CPU kernels compute the values in
 * their loops (issue 20). */
bool ind_run_rng(const ind_program *p, em_tensor *const *inputs, int n_inputs, em_tensor **outputs, const int *donate,
                 const rt_interp_opts *rng, em_site site);
/* Whether the code generator takes g's random nodes: every one on the CPU (CUDA graphs with
 * random nodes run op by op). */
bool ind_takes_random(const ir_graph *g);
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
  int64_t bad_entries; /* disk entries that passed their checksum but lacked the kernels: replaced */
} ind_cache_stats;
ind_cache_stats ind_cache_counters(void);
/* Sets the in-memory kernel cache's limit in modules (tests; users set
 * EMBER_KERNEL_CACHE_MODULES); 0 restores the default. */
void ind_set_kernel_cache_limit(int modules);
/* Generated kernels the calling thread has run, for em_compiled_stats, tests and benchmarks. */
int64_t ind_kernel_runs(void);
/* Combo kernels the calling thread has run (each also counts once in ind_kernel_runs). */
int64_t ind_combo_kernel_runs(void);
/* CUDA pointwise kernels launched as their vector variant (16-byte loads and stores), on the
 * calling thread. */
int64_t ind_vector_kernel_runs(void);
/* The LLVM IR of p's kernels (EMBER_LOGS=output_code), or NULL. Borrowed. */
const char *ind_kernel_ir(const ind_program *p);
/* The schedule: one line per step (eager node or kernel: its iteration space, nodes, bytes
 * read and written), for EMBER_LOGS=schedule. Borrowed; NULL when out of memory. */
const char *ind_schedule(const ind_program *p);

#endif /* EMBER_INDUCTOR_H */
