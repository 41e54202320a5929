/* prims/prims.h: the private header of the prims/ layer.
 *
 * A primitive is defined once: its row in prims.def (name, arity, flags, attribute schema), its
 * meta function (output dtype and shape from input dtypes and shapes, or a message saying why
 * not) and its reference CPU kernel over raw strided buffers. The reference kernels are the
 * oracle every compiled kernel is tested against, and what eager mode runs.
 *
 * Sections: prims.c (table, meta functions, view rules), loop.c (the strided N-d iterator),
 * pointwise.c, reduce.c, movement.c (copies, indexing), creation.c (full, iota, Philox),
 * extern.c (GEMM and convolution through oneDNN / OpenBLAS, with plain-loop references), scan.c
 * (cumulative sum and product, argsort), pool.c (the threads every parallel loop runs on). */
#ifndef EMBER_PRIMS_H
#define EMBER_PRIMS_H

#include "../ir/ir.h"

typedef enum em_prim {
#define PRIM(name, arity, flags, attrs, expr) EM_PRIM_##name,
#include "prims.def"
#undef PRIM
  EM_PRIM_COUNT
} em_prim;

enum {
  P_POINTWISE = 1 << 0,
  P_REDUCTION = 1 << 1,
  P_VIEW = 1 << 2,
  P_MOVEMENT = 1 << 3,
  P_INDEXING = 1 << 4,
  P_CREATION = 1 << 5,
  P_EXTERN = 1 << 6,
  P_FLOAT_ONLY = 1 << 7,
  P_BOOL_OUT = 1 << 8,
  P_NO_BOOL = 1 << 9,
  P_NONDIFF = 1 << 10,
  P_RANDOM = 1 << 11,
  P_COMMUTATIVE = 1 << 12,
  P_SAVES_INPUTS = 1 << 13,
  P_SCAN = 1 << 14,
};

typedef struct prim_info {
  const char *name;  /* lower case, as in IR text: "add" */
  int arity;         /* tensor operands; -1 variadic */
  unsigned flags;
  const char *attrs; /* attribute schema: names of the prim_attrs fields read */
  const char *expr;  /* pointwise prims: the scalar expression (prims.def); "" otherwise */
} prim_info;

const prim_info *prim_get(em_prim op);

/* Attributes of one prim application. Each prim reads only the fields its schema names. */
typedef struct prim_attrs {
  int n_axes;                   /* axes: reductions, permute, squeeze, flip; one axis for */
  int64_t axes[EM_MAX_DIMS];    /*   slice, unsqueeze, cat, gather, index_select, scatter_add */
  bool keepdim;                 /* reductions */
  bool descending;              /* argsort */
  ir_shape shape;               /* reshape, expand, creation; conv backward: result shape */
  em_dtype dtype;               /* convert, creation */
  int64_t start, stop, step;    /* slice (normalised: 0 <= start <= stop <= size, step >= 1) */
  int n_pads;                   /* pad: torch.nn.functional.pad order, last dim first */
  int64_t pads[2 * EM_MAX_DIMS];
  double value, value2;         /* full: value; pad: fill; iota: start, step */
  uint64_t seed, offset;        /* philox: key and first counter */
  em_conv2d_params conv;        /* convolutions */
} prim_attrs;

/* Dtype and shape of an operand or result, and for views, its strides and storage offset. */
typedef struct prim_meta {
  em_dtype dtype;
  int ndim;
  int64_t sizes[EM_MAX_DIMS];
  int64_t strides[EM_MAX_DIMS];
  int64_t offset;
} prim_meta;

/* Meta function: fills out's dtype, ndim and sizes from the operands', or writes a reason (no
 * op name, no location: the caller adds those) into err and returns false. For P_VIEW prims it
 * also fills out's strides and offset from the operand's (prim_meta of the operand must then
 * carry strides and offset); RESHAPE fails with err "no view" when no view exists. */
bool prim_meta_fn(em_prim op, const prim_attrs *at, const prim_meta *in, int n_in, prim_meta *out,
                  char *err, size_t cap);

/* Rewrites the axis attributes of op applied to an operand of in_ndim dims into their canonical
 * form: every axis in [0, ndim) (in [0, ndim] for UNSQUEEZE), sorted ascending where order does
 * not matter (reduction axes, squeeze, flip), and a reduction over all axes (sum, prod, amax,
 * amin) listing them all. Axes out of range are left as they are, for
 * the meta function to reject. Graph nodes always carry canonical attributes (ir_add_node calls
 * this and the verifier checks it), so passes and code generators may index arrays by an axis
 * without normalizing it again. Eager kernels accept both forms. */
void prim_canonical_attrs(em_prim op, prim_attrs *at, int in_ndim);
/* Whether at is already canonical for op over in_ndim dims (see prim_canonical_attrs). */
bool prim_attrs_canonical(em_prim op, const prim_attrs *at, int in_ndim);

/* ---- scalar.c: the scalar expressions of pointwise prims ---------------------------------
 * A renderer (the LLVM code generator, the CUDA C generators) turns a pointwise prim into code by
 * walking its expression, instantiated for concrete dtypes: a list of typed instructions in
 * which every conversion is explicit, so a renderer implements each scalar op for the dtypes it
 * supports and nothing per prim. */

typedef enum prim_sop {
  SOP_ARG,   /* operand `arg` */
  SOP_CONST, /* `value`, in the instruction's dtype */
  SOP_CAST,  /* in[0] converted to the instruction's dtype: to bool x != 0; from a float to an
              * integer, as prims/pointwise.c (INT64_MIN for NaN and out of range, then the low bits) */
  SOP_NEG, SOP_ABS, SOP_EXP, SOP_LOG, SOP_LOG1P, SOP_EXPM1, SOP_SQRT, SOP_SIN, SOP_COS, SOP_TANH,
  SOP_ERF, SOP_FLOOR, SOP_CEIL, /* unary, in the compute dtype (floor and ceil of an integer: itself) */
  SOP_ADD, SOP_SUB, SOP_MUL, SOP_DIV,
  SOP_POW, /* integers: repeated squaring; a negative exponent gives 0 except for bases 1 and -1 */
  SOP_REM, /* Python's remainder: the sign of the divisor; integer remainder by 0 gives 0 */
  SOP_ATAN2, /* atan2(a, b): the angle of the point (b, a), in (-pi, pi] */
  SOP_EQ, SOP_NE, SOP_LT, SOP_LE, SOP_GT, SOP_GE, /* compare in the compute dtype; bool result */
  SOP_ISNAN,                                      /* false for every non-float dtype */
  SOP_AND, SOP_OR, SOP_NOT,                       /* bool */
  SOP_SELECT,                                     /* in[0] ? in[1] : in[2] */
  SOP_COUNT
} prim_sop;

#define PRIM_SEXPR_MAX 32

typedef struct prim_sinst {
  prim_sop op;
  em_dtype dtype; /* the value's dtype */
  int n_in;
  int in[3];      /* earlier instructions */
  int arg;        /* SOP_ARG: the operand */
  double value;   /* SOP_CONST */
} prim_sinst;

/* An instantiated expression: ins[n - 1] is the result. */
typedef struct prim_sexpr {
  int n;
  prim_sinst ins[PRIM_SEXPR_MAX];
} prim_sexpr;

/* Instantiates pointwise prim op's expression for operands of dtypes args[0 .. arity) computing
 * in dtype compute, with result dtype out. Typing: numbers are constants in compute; every
 * arithmetic op, floor, ceil and the two branches of select take and give compute; comparisons
 * and isnan take compute and give bool; and, or, not and select's condition take and give bool;
 * an operand of another dtype is converted by an explicit SOP_CAST, and so is the result when
 * its dtype is not out. False when op has no expression (not pointwise). */
bool prim_scalar_expr(em_prim op, const em_dtype *args, em_dtype compute, em_dtype out, prim_sexpr *e);

/* The scalar op's name as written in prims.def ("add"); "arg", "const" and "cast" for the rest. */
const char *prim_sop_name(prim_sop op);

/* ---- loop.c ------------------------------------------------------------------------------ */

/* A raw strided buffer: data points at element 0; strides are in elements. */
typedef struct prim_buf {
  char *data;
  em_dtype dtype;
  int ndim;
  int64_t sizes[EM_MAX_DIMS];
  int64_t strides[EM_MAX_DIMS];
} prim_buf;

/* A 1-D inner loop over n elements: p[i] points at operand i's first element, s[i] is its
 * stride in bytes. Operand 0 is the output. */
typedef void (*prim_loop1d)(char **p, const int64_t *s, int64_t n, const void *ctx);

/* Runs fn over every element of nops buffers that all have bufs[0]'s sizes, coalescing
 * dimensions and splitting the index space across the pool's threads when large. */
void prim_foreach(int nops, const prim_buf *bufs, prim_loop1d fn, const void *ctx);

/* The same on the calling thread only, for loops whose ctx is written (checks, reductions). */
void prim_foreach_serial(int nops, const prim_buf *bufs, prim_loop1d fn, const void *ctx);

/* Elements per thread below which loops stay serial. */
#define PRIM_PARALLEL_GRAIN 32768

/* ---- thread pool (pool.c) ---------------------------------------------------------------- */

/* Ember's own threads: every parallel loop of Ember runs on them (pool.c says why not on
 * OpenMP's). A split decided by shapes gives the same bits whatever the thread count. */
typedef void (*prim_task)(void *ctx, int64_t i);
typedef void (*prim_range_task)(void *ctx, int64_t begin, int64_t end);

/* Runs fn(ctx, i) for every i in [0, n) on the calling thread and the pool's workers, each i
 * once; returns when all have run. With P threads, the thread of rank p runs the p-th contiguous
 * P-th of [0, n) first, in order (so successive loops over the same data keep each part on one
 * core), then takes what the others have not started. Inside a task, or while another thread's
 * loop has the pool, every i runs on the calling thread, in order. */
void prim_parallel(int64_t n, prim_task fn, void *ctx);

/* The same on at most threads threads (ranks below threads): for per-thread scratch sized
 * before the loop. */
void prim_parallel_upto(int64_t n, int threads, prim_task fn, void *ctx);

/* The same, but every thread claims the lowest index not yet claimed: for tasks that wait on
 * the one before them (prim_turn_wait). */
void prim_parallel_ordered(int64_t n, prim_task fn, void *ctx);

/* Inside a task: the rank of the thread running it, in [0, P) where P <= prim_threads() at the
 * loop's start (0 is the thread that started the loop); no two threads running tasks of one loop
 * share one. A loop nested in a task runs on the task's thread with the task's rank; 0 outside
 * tasks. For per-thread scratch. */
int prim_rank(void);

/* fn over [0, n) in contiguous ranges, one per thread, when par (and n > 1 and there are
 * threads); else fn(ctx, 0, n) on the calling thread (nothing when n <= 0). */
void prim_parallel_for(bool par, int64_t n, prim_range_task fn, void *ctx);

/* An ordered section inside the tasks of prim_parallel_ordered: task c waits until *turn is c
 * (the tasks before it passed theirs), does its part, then passes the turn to c + 1. Tasks are
 * claimed in index order, so every task waited for is running; results come out in the order
 * of a serial run. */
void prim_turn_wait(_Atomic int64_t *turn, int64_t c);
void prim_turn_pass(_Atomic int64_t *turn, int64_t c);

/* Threads a loop started here may use: the pool's size, or 1 inside a task. */
int prim_threads(void);
/* The pool's size (em_set_num_threads), for sizing per-thread scratch. */
int prim_max_threads(void);
/* n <= 0: the default (OMP_NUM_THREADS, else the CPUs this process may run on). */
void prim_set_threads(int n);
/* From now on the calling thread's loops run on it alone and never take the pool, which stays
 * free for the other threads' loops (a background compile thread: eager fusion's). */
void prim_serial_thread(void);

/* ---- kernels ----------------------------------------------------------------------------- */

/* Runs op's reference kernel: out is allocated with the meta function's dtype and sizes and is
 * contiguous, except for pointwise prims, whose out may have any non-overlapping strides (the
 * in-place ops write through it); in are the operands, with any strides (0 for expanded dims). Returns false with a reason in err on a data-dependent error
 * (index out of range, integer division by zero) or a failure inside an extern library. */
bool prim_run(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in, int n_in,
              char *err, size_t cap);

bool prim_run_pointwise(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in,
                        char *err, size_t cap);
bool prim_run_reduce(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in,
                     char *err, size_t cap);
bool prim_run_movement(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in,
                       int n_in, char *err, size_t cap);
bool prim_run_creation(em_prim op, const prim_attrs *at, const prim_buf *out, char *err,
                       size_t cap);
bool prim_run_extern(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in,
                     char *err, size_t cap);
bool prim_run_scan(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *in, char *err,
                   size_t cap);

/* A GEMM's epilogue on the CPU (inductor/schedule.c fuses matmul [-> add(bias)] [-> activation]
 * into one step): the activation after the bias, in eager's f32 operations. */
typedef enum {
  PRIM_ACT_NONE,
  PRIM_ACT_RELU,      /* where(h <= 0, 0, h): em_relu */
  PRIM_ACT_GELU_TANH, /* (h * 0.5) * (tanh((h + h*h*h * 0.044715) * sqrt(2/pi)) + 1): em_gelu(x, true) */
  PRIM_ACT_GELU_ERF,  /* (h * 0.5) * (erf(h * sqrt(1/2)) + 1): em_gelu(x, false) */
} prim_activation;

/* out = act(a @ b + bias): f32 matmul (a: [..., m, k], b: [..., k, n], any strides, as
 * prim_run_extern's MATMUL) into out (contiguous, the product's shape); bias NULL or n elements
 * (its dims before the last of size 1, any stride). prod NULL: the epilogue works in place in
 * out; else the product itself is stored in prod (contiguous, the product's shape) and the
 * epilogue reads it from there. The epilogue runs on each tile of the product right after the
 * tile is computed, while it is in cache, and gives the bits eager's matmul, add and activation
 * ops give one after another. False with a reason in err when the library fails. */
bool prim_gemm_epilogue(const prim_buf *out, const prim_buf *prod, const prim_buf *a, const prim_buf *b,
                        const prim_buf *bias, prim_activation act, char *err, size_t cap);

/* Plain-loop references for the extern prims, kept as the oracle for the library paths. */
void prim_matmul_ref(const prim_buf *out, const prim_buf *a, const prim_buf *b);
void prim_conv2d_ref(em_prim op, const prim_attrs *at, const prim_buf *out, const prim_buf *a,
                     const prim_buf *b);

/* Element access as double, for printing, item() and the slow paths. */
double prim_load(const char *p, em_dtype dt);
void prim_store(char *p, em_dtype dt, double v);

/* Philox4x32-10: four 32-bit outputs for counter ctr (128 bits) and key (64 bits). */
void prim_philox(uint64_t ctr_lo, uint64_t ctr_hi, uint64_t key, uint32_t out[4]);
/* Philox calls (counters) a PHILOX_UNIFORM / PHILOX_NORMAL result of numel elements of dtype
 * dt consumes: ceil(numel/4) for f32, ceil(numel/2) for f64, 0 for other prims and dtypes. The
 * runtime advances the generator's offset by this after each random op (creation.c documents
 * the stream). */
uint64_t prim_philox_calls(em_prim op, em_dtype dt, int64_t numel);

/* IEEE half and bfloat16 conversions (round to nearest even). */
float prim_half_to_float(uint16_t h);
uint16_t prim_float_to_half(float f);
float prim_bf16_to_float(uint16_t h);
uint16_t prim_float_to_bf16(float f);

#endif /* EMBER_PRIMS_H */
