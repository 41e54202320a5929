/* inductor/internal.h: what the files of inductor/ share: the program and kernel structures,
 * the small predicates the schedule and the code generator both ask, and the functions one file
 * calls in another. inductor.h is the interface; this header is private to inductor/.
 *   inductor.c  programs: compile (orchestration), hooks, accessors
 *   schedule.c  lowering and fusion into kernels, memory planning, the printed schedule
 *   codegen.c   LLVM IR for pointwise and row kernels, their loop IR text
 *   jit.c       the ORC LLJIT, the kernel cache (memory and disk), building a program's module
 *   elf.c       the kernel cache's objects checked, bytes first, before LLVM reads them
 *   run.c       running a program: threads, arena, in-place updates, the profile
 *   rewrite.c   graph rewrites before scheduling: rematerialization, sums of slice scatters
 *   cuda_codegen.c  the CUDA C renderer of a schedule's kernels
 *   renderer.c  the renderers' tables (ind_renderer): what each target renders, its build entry
 *   cudagraph.c reduce-overhead: a CUDA program's calls replayed as one CUDA graph */
#ifndef EMBER_INDUCTOR_INTERNAL_H
#define EMBER_INDUCTOR_INTERNAL_H

#include "inductor.h"
#include "../runtime/cuda.h"

#include <llvm-c/Core.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* f32 lanes of the vector loops: 16 (a zmm register) where the host has AVX-512F, else 8 (ymm,
 * the width of the eager SLEEF loops). SLEEF's f16 and f8 u10 functions share their algorithm
 * and error bound (1 ULP). Set when the JIT starts (jit.c). */
extern int ind_lanes;
#define LANES ind_lanes
/* The host CPU's name and features, for every kernel's target attributes (jit.c). */
extern char *ind_host_cpu, *ind_host_features;


/* A kernel covers rows [r0, r1) and columns [j0, j1) of its iteration space, so the runtime can
 * split it across threads either way (row kernels only by rows); scratch holds the row kernel's
 * spilled values: n_spill rows of cols floats for the calling thread. */
typedef void (*kernel_fn)(char **bufs, int64_t r0, int64_t r1, int64_t j0, int64_t j1, float *scratch);

/* Kinds of the values a kernel computes or reads. A pointwise kernel's values are all FULL:
 * one element per point of its iteration shape. A row kernel's iteration shape S splits into
 * rows (dims [0, split)) and the reduced columns (dims [split, ndim)); its FULL values have
 * shape S, its ROW values one element per row (any shape of that many elements, row r at
 * linear index r): reductions over the columns, and pointwise ops and views on them. */
enum { K_NONE = 0, K_FULL = 1, K_ROW = 2, K_COL = 3 };
/* K_COL: a pointwise kernel's reduction over the leading dims of its iteration shape (a bias
 * gradient): accumulated in its output buffer, one column per element, so it is an output only,
 * never read inside its kernel. */

typedef struct kernel {
  int n_nodes, *nodes;    /* graph node indices, in order */
  int n_in, *in;          /* values read from outside */
  int n_out, *out;        /* values other steps or the graph's outputs read */
  char name[32];
  kernel_fn fn;
  void *cu_fn;            /* a CUDA program's kernel (cu_function) */
  void *cu_vec;           /* its vector variant (cuda_codegen.c: vector_width), NULL for none */
  int vec;                /* the vector variant's elements a thread */
  int64_t n_elems;        /* its size parameter: elements (pointwise), rows (row kernels: a block each) */
  unsigned block;         /* its threads a block */
  struct ind_tune *tune;  /* max-autotune: candidate configurations still to time (cuda_codegen.c) */
  bool row;               /* a row kernel (holds reductions) */
  bool has_col;           /* a pointwise kernel with K_COL reductions: split across threads by columns only */
  ir_type shape;          /* iteration shape S */
  int split;              /* row kernel: dims [split, ndim) are reduced */
  int n_spill;            /* row kernel: FULL values kept in scratch between passes over a row */
  int parts;              /* CUDA row kernel split over its columns (a few long rows, cuda_codegen.c): it writes
                           * parts partial results a row, cu_combine folds them in order; 0: not split */
  void *cu_combine;
  char combine_name[32];
  int64_t rows, cols;     /* the iteration space as the generated loops see it */
  int64_t bytes;          /* bytes read and written, for EMBER_LOGS=schedule */
  char *loop_ir;          /* the loop-level form, printed under EMBER_LOGS=schedule */
  int64_t *table;         /* sizes_as_args: the numbers its code reads at run time (CPU: bufs[n_out + n_in];
                           * CUDA: a by-value parameter after n, the scalar variant's entries then the
                           * vector variant's) */
  int n_table;
  int vtab;               /* CUDA: the scalar variant's entries, table[0, vtab); the vector's follow */
  double prof_ms;         /* EMBER_INDUCTOR_PROFILE: time in this kernel, all runs */
  int64_t prof_runs;
  int n_rng, *rng;        /* its random nodes' entries in the program's counter table (ind_program.rand),
                           * in node order: the code reads entry rng[r]'s {seed, offset} at
                           * bufs[n_out + n_in + 1 + r] (codegen.c: emit_philox) */
} kernel;

/* A GEMM whose epilogue is fused (schedule.c): the value act(matmul(a, b) [reshaped] + bias), act
 * a cu_epilogue (runtime/cuda.h) run by cuBLASLt in CUDA programs, a prim_activation (prims.h)
 * run on each GEMM tile in CPU ones (there the bias is optional). */
typedef struct ind_epilogue {
  int mm;              /* the matmul node */
  int bias;            /* the bias value: N elements, N the product's last dim (CPU: -1 for none) */
  int act;             /* CUDA: CU_EPI_BIAS, CU_EPI_BIAS_RELU or CU_EPI_BIAS_GELU_TANH; CPU: a prim_activation */
  bool keep;           /* CPU: the product (and its reshape in the chain) has other readers: stored too */
  int n_nodes, *nodes; /* the nodes it stands for, in graph order, the last one its result: run eagerly
                        * when cuBLASLt cannot take the GEMM at run time */
  int n_reads, *reads; /* the values those nodes read from outside them */
} ind_epilogue;

/* A GEMM step's cuBLASLt algorithm under max-autotune (cuda_codegen.c). */
typedef struct ind_gemm_choice {
  char key[40];        /* the autotune cache's key of the problem it was chosen for ("": none yet) */
  bool held;
  cu_lt_algo algo;
  size_t workspace;
} ind_gemm_choice;

typedef struct step {
  int node;   /* >= 0: run this node with the eager kernels */
  int kernel; /* >= 0: run this kernel */
  int tmat;   /* >= 0: node is clone(transpose(matmul(a, b))), run as matmul(b^T, a^T): this matmul */
  bool alias; /* node is a clone of a value nothing else reads: the same tensor when contiguous */
  int n_release, *release; /* values whose last reader is this step */
  int epi;    /* > 0: node is the result of p->epis[epi - 1], run as one GEMM with its epilogue */
  int n_parts, *parts; /* >= 2: a combo kernel (schedule.c: combine_kernels): the independent pointwise
                        * kernels parts[] (kernel is parts[0]) run in one parallel region over their
                        * index spaces laid end to end; 0: kernel alone */
} step;

/* The kernels step st runs: its combo kernel's parts, or its one kernel (none for a node step). */
static inline const int *step_kernels(const step *st, int *n) {
  *n = st->n_parts ? st->n_parts : st->kernel >= 0;
  return st->n_parts ? st->parts : &st->kernel;
}

/* Why kernel `kernel` did not join the combo of the n kernels before it (schedule.c): why >= 0,
 * it reads value why, which they compute; -1, they are COMBO_MAX_PARTS; -2, it is a row kernel;
 * -3, it accumulates column reductions. */
typedef struct ind_combo_note {
  int kernel, why, n;
} ind_combo_note;

struct ind_program {
  ir_graph *g;
  prim_meta *in_meta; /* the input layouts the kernels are specialised to */
  em_device *in_device; /* and their devices */
  step *steps;
  int n_steps;
  kernel *kernels;
  int n_kernels;
  ind_epilogue *epis;      /* GEMMs with fused epilogues */
  int n_epis;
  ind_gemm_choice *gemm;   /* [n_steps] CUDA programs: each GEMM step's algorithm (max-autotune) */
  signed char *kind;  /* [n_values] K_FULL / K_ROW for values computed inside kernels */
  /* memory planning */
  int64_t *arena_off;      /* [n_values] byte offset in the arena of a kernel output, or -1 */
  int64_t arena_bytes;
  int64_t planned_peak;    /* most bytes of kernel outputs live at once (arena and outputs) */
  int *out_step;           /* [n_outputs] the pointwise kernel step that stores output o, or -1 */
  int *in_last_read;       /* [n_inputs] last step that reads input i or a view of it */
  int *in_view_read;       /* [n_inputs] last step that reads a view of input i (not i itself) */
  bool *in_returned;       /* [n_inputs] input i or a view of it is a graph output */
  char *ir_text;
  char *schedule_text;
  struct ind_combo_note *combo_notes; /* why adjacent pointwise kernels were not combined (EMBER_LOGS=schedule) */
  int n_combo_notes;
  ind_stats stats;
  em_device device;       /* EM_CUDA: inputs on the GPU, kernels in CUDA C (cuda_codegen.c) */
  const ind_renderer *rend; /* the renderer of device's kernels */
  struct ind_cgraph *cgraph; /* reduce-overhead: its calls replay a CUDA graph (cudagraph.c) */
  ind_options opts;
  uint8_t module_key[16]; /* the JIT module holding its kernels, while has_module (jit.c) */
  bool has_module;
  /* random nodes, in graph order: each run reserves their Philox counters in this order before
   * any step runs (as the interpreter does node by node), so kernels and eager steps see eager's
   * counters whatever the schedule's order; rand_of[node] is the node's entry or -1 */
  int n_rand, *rand, *rand_of;
};

/* g rewritten for scheduling (rewrite.c): with rematerialize, each cheap pointwise value that a
 * later kernel would read recomputed there instead; sums of slice scatters that tile a value made
 * one cat. Counts both in st. NULL when out of memory. */
ir_graph *ind_rewrite(const ir_graph *g, const ind_renderer *rend, bool rematerialize, ind_stats *st);

/* codegen.c: whether the LLVM renderer renders pointwise node n: its prim's scalar expression
 * (prims.def), instantiated for the node's dtypes, uses only scalar ops the renderer has for them
 * (f32 and f64 arithmetic and transcendentals; i32, i64 and u8 add, sub, mul, neg, abs; comparisons,
 * bool logic, select; conversions among these dtypes). f16/bf16 values, pow, remainder and
 * arithmetic on bools run op by op. */
bool ind_renders(const ir_graph *g, const ir_node *n);

/* codegen.c: whether pointwise node n runs op by op only for its dtypes: the renderer lacks some
 * of its scalar ops for the dtypes at hand but has every one of them for f32 (a conversion to
 * f16; not a pow, which it renders for no dtype). ind_stats.dtype_eager_nodes counts them. */
bool ind_dtype_blocks(const ir_graph *g, const ir_node *n);

/* cuda_codegen.c: whether the CUDA renderer renders pointwise node n (floating-point and bool
 * values, the prim table's scalar expression for their compute dtypes). */
bool ind_cuda_renders(const ir_graph *g, const ir_node *n);


/* A sum, amax or amin in f32 or f64 (operand and result of one dtype) that the generated kernels
 * accumulate (CUDA schedules take f32 ones only). */
static inline bool kernel_reduction(const ir_graph *g, const ir_node *n) {
  if (n->op != EM_PRIM_SUM && n->op != EM_PRIM_AMAX && n->op != EM_PRIM_AMIN) return false;
  const ir_type *u = &g->values[ir_operands(g, n)[0]].type;
  return (u->dtype == EM_F32 || u->dtype == EM_F64) && g->values[n->out].type.dtype == u->dtype && ir_type_concrete(u);
}

/* A kernel_reduction over the trailing dims of its operand: the first reduced dim, or -1. */
static inline int trailing_reduction(const ir_graph *g, const ir_node *n) {
  if (!kernel_reduction(g, n)) return -1;
  const ir_type *u = &g->values[ir_operands(g, n)[0]].type;
  bool red[EM_MAX_DIMS] = {0};
  for (int a = 0; a < n->attrs.n_axes; a++) red[n->attrs.axes[a]] = true;
  int k = u->ndim;
  while (k > 0 && (red[k - 1] || u->sizes[k - 1] == 1)) k--;
  for (int d = 0; d < k; d++)
    if (red[d] && u->sizes[d] != 1) return -1;
  if (k == u->ndim) return -1; /* reduces nothing of size > 1: leave it to the eager kernel */
  return k;
}

/* A kernel_reduction over leading dims of its operand that keeps a trailing dim of size > 1: the
 * number of leading dims, or -1. */
static inline int leading_reduction(const ir_graph *g, const ir_node *n) {
  if (!kernel_reduction(g, n)) return -1;
  const ir_type *u = &g->values[ir_operands(g, n)[0]].type;
  bool red[EM_MAX_DIMS] = {0};
  for (int a = 0; a < n->attrs.n_axes; a++) red[n->attrs.axes[a]] = true;
  int k = 0;
  while (k < u->ndim && (red[k] || u->sizes[k] == 1)) k++;
  bool kept = false, reduces = false;
  for (int d = 0; d < k; d++) reduces |= red[d] && u->sizes[d] > 1;
  for (int d = k; d < u->ndim; d++) {
    if (red[d] && u->sizes[d] > 1) return -1;
    kept |= u->sizes[d] > 1;
  }
  return kept && reduces ? k : -1;
}

/* Whether node n runs op by op on the CPU only for its dtypes: ind_dtype_blocks, or a sum,
 * amax or amin that is no kernel_reduction (an integer or f16 one; not one over no dim). */
static inline bool ind_dtype_eager(const ir_graph *g, const ir_node *n) {
  if (n->op == EM_PRIM_SUM || n->op == EM_PRIM_AMAX || n->op == EM_PRIM_AMIN)
    return !kernel_reduction(g, n) && ir_type_concrete(&g->values[n->out].type);
  return ind_dtype_blocks(g, n);
}

static inline bool same_shape(const ir_type *a, const ir_type *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return false;
  return true;
}

static inline int64_t numel_of(const ir_type *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
  return n;
}

static inline int64_t prefix_numel(const ir_type *t, int k) {
  int64_t n = 1;
  for (int d = 0; d < k; d++) n *= t->sizes[d];
  return n;
}

static inline double reduce_init(em_prim op) { return op == EM_PRIM_SUM ? 0.0 : op == EM_PRIM_AMAX ? -INFINITY : INFINITY; }

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The LLVM state of one module being built (codegen.c). */
typedef struct cg {
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMTypeRef f32, i1, i8, i64, ptr, vf32, vi8, f64;
  /* sizes_as_args: the kernel being emitted reads its numbers from a table (bufs[n_buffers]) */
  bool args;
  LLVMValueRef tab;        /* the table's address, loaded in the kernel's entry block */
  int64_t *table;          /* its values, in the order the code reads them */
  int n_table, cap_table;
  bool oom;
} cg;

/* elf.c */
/* Whether the size bytes at obj are a well-formed relocatable object for this host (ELF64: header,
 * sections, symbols, relocations all in range) that defines each of the n names as a function
 * with a size. Reads nothing outside [obj, obj + size); calls no LLVM. */
bool ind_elf_defines(const void *obj, size_t size, int n, const char *const *names);

/* jit.c */
bool ind_jit_get(char *err, size_t cap);
/* p's kernels will not run again (ind_free): their module may be evicted from the JIT. */
void ind_release_kernels(ind_program *p);
/* Emits every kernel of p into one module and loads its object code (JIT, disk cache, or LLVM). */
bool ind_build_kernels(ind_program *p, const prim_meta *meta, char *err, size_t cap);

/* schedule.c */
/* Schedules p->g (steps and kernels) for values with layouts meta, then plans its memory. */
bool ind_schedule_program(ind_program *p, const prim_meta *meta);
/* How row kernel k reads or writes its buffer bi (outputs, then inputs): FULL, over its iteration
 * shape S (true: at the row's offset, the sum of its coordinates times outer[d] over the row dims,
 * plus column j times *inner; outputs contiguous), or one element per row (false). kind: the
 * kinds of the kernel's values (0 outside it). */
bool ind_row_buffer(const ir_graph *g, const prim_meta *meta, const signed char *kind, const kernel *k, int bi,
                    int64_t *outer, int64_t *inner);
/* Whether output o may be stored straight into input i (see run.c). */
bool ind_donatable(const ind_program *p, int o, int i);
/* p->schedule_text (EMBER_LOGS=schedule), each kernel's bytes, and p->stats.dtype_eager_nodes (named
 * in one line of the text when there are any). */
void ind_describe_schedule(ind_program *p);

/* codegen.c */
bool ind_emit_kernel(cg *c, const ir_graph *g, const prim_meta *meta, const signed char *kind, kernel *k, char *err,
                     size_t cap);
bool ind_emit_row_kernel(cg *c, const ir_graph *g, const prim_meta *meta, const signed char *kind, kernel *k,
                         char *err, size_t cap);

/* cuda_codegen.c */
/* Renders every kernel of CUDA program p as CUDA C and loads it (NVRTC, or the emulator); with
 * p->opts.autotune, also each kernel's candidate configurations (or the one cached on disk). */
bool ind_cuda_build_kernels(ind_program *p, const prim_meta *meta, char *err, size_t cap);
/* max-autotune: times k's candidates on its buffers (outputs into scratch), keeps the fastest
 * and caches the choice; false with an error recorded. */
bool ind_cuda_autotune(kernel *k, const ir_graph *g, char **bufs, em_site site);
void ind_cuda_tune_free(kernel *k);

/* A GEMM step of CUDA program p (step s): act(a @ b + bias) through cuBLASLt (bias NULL and epi
 * CU_EPI_NONE for a plain product), under max-autotune with the algorithm timed at its first run
 * or found in the autotune cache. Returns a new reference; NULL with *fallback set when cuBLASLt
 * cannot take it (the caller computes it another way), NULL with an error recorded otherwise. */
em_tensor *ind_cuda_gemm(const ind_program *p, int s, em_tensor *a, em_tensor *b, em_tensor *bias, int epi,
                         bool *fallback, em_site site);

/* run.c: runs p's steps (ind_run has checked the inputs' layouts). */
bool ind_run_steps(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate,
                   const rt_interp_opts *rng, em_site site);

/* cudagraph.c: reduce-overhead. ind_cgraph_attach gives CUDA program p a CUDA graph (not when an
 * output aliases an input); false when out of memory. ind_cgraph_run runs p's call through it. */
typedef struct ind_cgraph ind_cgraph;
bool ind_cgraph_attach(ind_program *p);
bool ind_cgraph_run(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate,
                    em_site site);
void ind_cgraph_free(ind_cgraph *cg);

/* run.c */
/* EMBER_INDUCTOR_PROFILE: p's slowest kernels, printed when it is freed. */
void ind_profile_kernels(const ind_program *p);

/* The kernel-cache reader, whole, for the fuzzer (fuzz/fuzz_kcache.c): whether the entry at
 * path is well formed for key (header, size, checksum) and its object defines every one of the
 * n kernel names. */
bool ind_cache_entry_ok(const char *path, const uint8_t key[16], int n, const char *const *names);

#endif /* EMBER_INDUCTOR_INTERNAL_H */
