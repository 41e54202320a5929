/* ember.h: the one public header of Ember, a deep-learning library in C11.
 *
 * This header is the documentation. Conventions that hold for every function below, unless its
 * own comment says otherwise:
 *
 *  - Ownership. Every function that returns a new em_tensor * returns it owned by the innermost
 *    open scope of the calling thread (em_scope_begin / em_scope_end): model code never releases
 *    results by hand. A thread that never opened a scope uses its base scope, which lives until
 *    em_thread_cleanup() or thread exit. em_keep() moves a tensor to the enclosing scope;
 *    em_retain() / em_release() manage a reference by hand.
 *  - Errors are sticky, in the style of cairo. A function that fails returns NULL (or a
 *    documented sentinel) and records one message naming the op, its operands' dtypes and shapes,
 *    and the caller's file:line, e.g.
 *        model.c:42: em_matmul: inner dimensions differ: a is f32[128,784], b is f32[512,784]
 *    The first message is kept until em_clear_error(); em_last_error() reads it. A function handed
 *    a NULL tensor returns NULL at once (the error that made it NULL is already recorded).
 *    Nothing aborts on bad input; nothing leaks on any error path, allocation failure included.
 *  - Call sites. Public ops are macros over `_at` functions that take an em_site, so errors (and,
 *    later, graph-break reports) name the user's own source line. Call the macros.
 *  - Shapes broadcast as in NumPy/PyTorch: sizes are aligned from the right; a dimension of size
 *    1 (or a missing one) stretches to match. "[..]" below means any shape.
 *  - Type promotion follows torch.result_type: bool < integer (u8 < i32 < i64) < floating
 *    (f32 < f64). A 0-dim tensor takes part only when its category is higher than the
 *    dimensioned operands' (f32[3] * f64[] is f32, i32[3] * f64[] is f64). A Python-style scalar
 *    argument (double) counts as an integer when its value is whole (2.0 is Python's 2) and as a
 *    float otherwise: it never widens a tensor's dtype within its category, and a fractional one
 *    makes an integer or bool tensor f32 (i64 * 2.0 stays i64; i64 * 0.5 is f32).
 *  - Dimensions (axes) may be negative, counting from the end as in PyTorch.
 *  - Views share storage with their base (reshape when possible, permute, transpose, expand,
 *    slice, squeeze, unsqueeze). In-place ops (suffix _) write into their first argument, bump its
 *    version counter, and return it (no new reference).
 *  - dtypes f16 and bf16 are storage types only on the CPU: em_cast converts to and from them;
 *    arithmetic on them is an error there. On CUDA they compute (in f32, rounded once per op;
 *    reductions and GEMMs accumulate in f32), as PyTorch's CUDA kernels do.
 *  - Devices. A tensor lives on the CPU or on CUDA device 0 (em_to moves it). An op's operands
 *    must be on one device, except that a one-element CPU tensor (a scalar) may join CUDA ones;
 *    the result is on the operands' device. Factories create on the default device
 *    (em_set_default_device). CUDA ops are asynchronous: they are queued on the thread's current
 *    stream and return; whatever reads values on the host (em_item, em_to_buffer, em_to to the
 *    CPU, em_format, em_nonzero, em_save) waits for them. See "CUDA devices" at the end.
 */
#ifndef EMBER_H
#define EMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Basic types                                                                                 */

/* Element types. Sizes in bytes: f32 4, f64 8, i32 4, i64 8, bool 1 (0 or 1), u8 1, f16 2,
 * bf16 2. */
typedef enum em_dtype {
  EM_F32,
  EM_F64,
  EM_I32,
  EM_I64,
  EM_BOOL,
  EM_U8,
  EM_F16,
  EM_BF16,
  EM_DTYPE_COUNT
} em_dtype;

/* Devices: the CPU and CUDA device 0 (torch.device("cpu"), torch.device("cuda:0")). */
typedef enum em_device { EM_CPU, EM_CUDA } em_device;

/* A user's source location, filled by EM_HERE at each public macro's call site. */
typedef struct em_site {
  const char *file;
  int line;
  const char *func;
} em_site;
#define EM_HERE ((em_site){__FILE__, __LINE__, __func__})

/* The most dimensions a tensor may have. */
#define EM_MAX_DIMS 8

/* A tensor: a strided view of reference-counted storage. Opaque; read it with the accessors. */
typedef struct em_tensor em_tensor;

/* Passed where a tensor argument is optional (a convolution's bias) to say "none". NULL is not
 * accepted there: NULL means an earlier op failed, and must not silently turn into "no bias". */
extern struct em_tensor em_none_sentinel;
#define EM_NONE (&em_none_sentinel)

/* Helpers to pass a literal shape or axis list: em_zeros(EM_F32, EM_SHAPE(3, 4)) expands to
 * em_zeros(EM_F32, 2, (int64_t[]){3, 4}). */
#define EM_SHAPE(...) \
  (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}
#define EM_AXES(...) EM_SHAPE(__VA_ARGS__)

/* ------------------------------------------------------------------------------------------ */
/* Scopes and lifetime                                                                         */

/* Opens a scope on the calling thread. Tensors returned by ops until the matching em_scope_end
 * belong to it. Returns false (and records an error) if the scope cannot be allocated. */
#define em_scope_begin() em_scope_begin_at(EM_HERE)
bool em_scope_begin_at(em_site site);

/* Closes the innermost scope, releasing the scope's reference to every tensor it owns. A tensor
 * that is still referenced elsewhere (em_keep, em_retain, a view's base) stays alive. Closing the
 * base scope (no scope open) is an error and does nothing. */
#define em_scope_end() em_scope_end_at(EM_HERE)
void em_scope_end_at(em_site site);

/* Gives the enclosing scope (the one around the innermost) a reference to t, so t outlives the
 * innermost scope. Returns t (borrowed, now owned by the enclosing scope too), or NULL if t is
 * NULL or the reference cannot be recorded. With no scope open, t stays in the base scope. */
#define em_keep(t) em_keep_at((t), EM_HERE)
em_tensor *em_keep_at(em_tensor *t, em_site site);

/* Adds one reference that the caller owns and must drop with em_release. Returns t. NULL-safe. */
em_tensor *em_retain(em_tensor *t);

/* Drops one reference taken with em_retain (or inherited from a scope via em_keep the caller
 * manages). The tensor and its storage are freed when the last reference goes. NULL-safe. */
void em_release(em_tensor *t);

/* Releases every scope of the calling thread, the base scope included. Call at thread end or
 * before checking leak counters in a test. */
void em_thread_cleanup(void);

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

/* The first error message recorded on this thread since the last em_clear_error, or NULL when
 * there is none. Borrowed; valid until the next em_clear_error. */
const char *em_last_error(void);

/* Forgets the recorded error, so the next failure is recorded. */
void em_clear_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Allocation, threads and debug counters                                                      */

/* A pluggable allocator for every allocation Ember makes (tensor data, tensor headers, scopes).
 * alloc returns memory aligned to `align` bytes (a power of two, at least 64 for tensor data) or
 * NULL; free releases it. ctx is passed through. */
typedef struct em_allocator {
  void *(*alloc)(void *ctx, size_t bytes, size_t align);
  void (*free)(void *ctx, void *ptr);
  void *ctx;
} em_allocator;

/* Installs an allocator for the whole process, or the default one (aligned_alloc) when a is NULL.
 * Only call it while no Ember allocation is alive. */
void em_set_allocator(const em_allocator *a);

/* Fault injection for tests: the n-th allocation from now (n >= 1) fails as if out of memory,
 * and so does nothing else. n = 0 disables it. Counts allocations of all threads. */
void em_debug_fail_alloc(int64_t n);

/* Allocation failure below Ember. The libraries Ember calls allocate with malloc and operator
 * new, not through the allocator above. When they run out of memory: oneDNN's failures (GEMM,
 * convolution) are errors of the op, "out of memory in oneDNN sgemm"; LLVM's (the inductor's
 * compile, the JIT) make the graph run op by op, as any failed compile does, and a failure
 * inside the JIT itself stops compiling for the rest of the process (kernels already compiled
 * keep working; what LLVM was building is leaked). libgomp (OpenMP) ends the process with
 * exit(1) when it cannot allocate a thread team or start a thread; Ember's loops allocate no
 * team after the first full-width parallel region, but a region of another width, or the first
 * one, still can. README.md, "Allocation failure", has the measurements. */

/* Number of allocations made through Ember's allocator since process start. */
int64_t em_debug_alloc_count(void);

/* Live tensor headers, live bytes of tensor storage, and the peak of live storage bytes since
 * process start (or the last em_debug_reset_peak). Tests check the first two are 0 at the end. */
int64_t em_debug_live_tensors(void);
int64_t em_debug_live_bytes(void);
int64_t em_debug_peak_bytes(void);
void em_debug_reset_peak(void);

/* Threads used by Ember's parallel loops, GEMMs and convolutions, process-wide (as
 * torch.set_num_threads): Ember's own thread pool, whose idle threads spin briefly and then
 * sleep, so a busy machine costs little. n <= 0 restores the default (OMP_NUM_THREADS, else the
 * CPUs the process may run on). Results are the same bits for any count. */
void em_set_num_threads(int n);
int em_get_num_threads(void);

/* ------------------------------------------------------------------------------------------ */
/* Random numbers: one process-wide Philox4x32-10 generator (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", SC 2011), addressed by (seed, offset) as PyTorch's CUDA
 * generator is. Each random op consumes a block of counters and advances the offset, so a
 * result depends only on the seed, the offset at the call and the shape. Default seed: 0.     */

/* Sets the seed and resets the offset to 0. */
void em_manual_seed(uint64_t seed);
/* Reads and restores the generator state. */
void em_rng_get_state(uint64_t *seed, uint64_t *offset);
void em_rng_set_state(uint64_t seed, uint64_t offset);

/* ------------------------------------------------------------------------------------------ */
/* Tensor metadata (borrowed reads; t must not be NULL, except where noted)                    */

int em_ndim(const em_tensor *t);
/* Size of dimension dim (negative counts from the end); -1 when dim is out of range. */
int64_t em_size(const em_tensor *t, int dim);
/* Arrays of em_ndim(t) sizes and strides (strides in elements, as in PyTorch). Borrowed; valid
 * while t lives. */
const int64_t *em_sizes(const em_tensor *t);
const int64_t *em_strides(const em_tensor *t);
int64_t em_numel(const em_tensor *t);
int64_t em_storage_offset(const em_tensor *t);
em_dtype em_dtype_of(const em_tensor *t);
em_device em_device_of(const em_tensor *t);
bool em_is_contiguous(const em_tensor *t);
/* Version counter of t's storage: bumped by every in-place op on t or on a view of it. */
int64_t em_version(const em_tensor *t);
/* Pointer to element 0 (storage offset applied); for a CUDA tensor, its device address (as
 * torch's data_ptr), not readable on the host. Borrowed; valid while t lives. Writing through
 * it does not bump the version counter. Inside a function being compiled this is a graph break
 * (the data must exist): the graph so far runs and t is real when the pointer is returned. */
#define em_data_ptr(t) em_data_ptr_at((t), EM_HERE)
void *em_data_ptr_at(em_tensor *t, em_site site);
/* Whether a and b share storage (one is a view of the other, or both of one base). */
bool em_shares_storage(const em_tensor *a, const em_tensor *b);

/* "f32", "f64", "i32", "i64", "bool", "u8", "f16", "bf16"; "?" for an invalid value. */
const char *em_dtype_name(em_dtype dt);
/* Bytes per element; 0 for an invalid value. */
size_t em_dtype_size(em_dtype dt);

/* ------------------------------------------------------------------------------------------ */
/* Creation. Sizes must be >= 0 (0-size dims are allowed); ndim in [0, EM_MAX_DIMS]. Results are
 * contiguous, on the CPU, owned by the current scope. Errors: negative size, too many dims,
 * invalid dtype, allocation failure.                                                          */

/* Uninitialised tensor of the given shape. Matches torch.empty. */
#define em_empty(...) em_empty_at(__VA_ARGS__, EM_HERE)
em_tensor *em_empty_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site);
/* Filled with 0, 1, or value (converted to dt). Match torch.zeros, torch.ones, torch.full. */
#define em_zeros(...) em_zeros_at(__VA_ARGS__, EM_HERE)
em_tensor *em_zeros_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site);
#define em_ones(...) em_ones_at(__VA_ARGS__, EM_HERE)
em_tensor *em_ones_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site);
#define em_full(...) em_full_at(__VA_ARGS__, EM_HERE)
em_tensor *em_full_at(em_dtype dt, int ndim, const int64_t *sizes, double value, em_site site);
/* 0-dim tensor holding value. Matches torch.tensor(value, dtype=dt). */
#define em_scalar(...) em_scalar_at(__VA_ARGS__, EM_HERE)
em_tensor *em_scalar_at(em_dtype dt, double value, em_site site);
/* 1-D [ceil((end - start) / step)] values start, start + step, ... Matches torch.arange.
 * Errors: step == 0, or the sign of step disagrees with end - start. */
#define em_arange(...) em_arange_at(__VA_ARGS__, EM_HERE)
em_tensor *em_arange_at(em_dtype dt, double start, double end, double step, em_site site);
/* [n, m] identity (ones on the main diagonal). Matches torch.eye(n, m). */
#define em_eye(...) em_eye_at(__VA_ARGS__, EM_HERE)
em_tensor *em_eye_at(em_dtype dt, int64_t n, int64_t m, em_site site);
/* Copies prod(sizes) elements of dtype dt from data (row-major, C order) into a new tensor.
 * data is borrowed for the call only. Matches torch.tensor(list). Errors: data NULL with a
 * non-empty shape. */
#define em_from_data(...) em_from_data_at(__VA_ARGS__, EM_HERE)
em_tensor *em_from_data_at(const void *data, em_dtype dt, int ndim, const int64_t *sizes,
                           em_site site);
/* Uniform in [0, 1) (em_rand), standard normal (em_randn, Box-Muller on Philox uniforms), or
 * uniform integers in [low, high) as i64 (em_randint). dt must be f32 or f64 for rand/randn.
 * Match torch.rand, torch.randn, torch.randint (values differ from PyTorch's CPU generator). */
#define em_rand(...) em_rand_at(__VA_ARGS__, EM_HERE)
em_tensor *em_rand_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site);
#define em_randn(...) em_randn_at(__VA_ARGS__, EM_HERE)
em_tensor *em_randn_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site);
#define em_randint(...) em_randint_at(__VA_ARGS__, EM_HERE)
em_tensor *em_randint_at(int64_t low, int64_t high, int ndim, const int64_t *sizes, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Pointwise ops. Inputs broadcast to a common shape; the result has that shape and is a new
 * contiguous tensor. dtypes as stated; integer/bool inputs to floating functions are promoted to
 * f32 (as torch does). Errors: NULL input, shapes that do not broadcast, unsupported dtype.    */

/* Unary, [..] -> [..]. Float functions (f32, f64; ints promote to f32): exp log log1p expm1 sqrt
 * rsqrt sin cos tanh erf reciprocal (torch.exp, ...; rsqrt = 1/sqrt). Any numeric dtype: neg
 * (not bool) abs sign floor ceil (identity on integers). logical_not: any dtype -> bool.
 * sign, floor and ceil are piecewise constant: their gradient is zero, and their output requires
 * grad when x does (as in PyTorch), so a backward through them gives zeros, not an error. */
#define em_neg(x) em_neg_at((x), EM_HERE)
em_tensor *em_neg_at(em_tensor *x, em_site site);
#define em_abs(x) em_abs_at((x), EM_HERE)
em_tensor *em_abs_at(em_tensor *x, em_site site);
#define em_exp(x) em_exp_at((x), EM_HERE)
em_tensor *em_exp_at(em_tensor *x, em_site site);
#define em_log(x) em_log_at((x), EM_HERE)
em_tensor *em_log_at(em_tensor *x, em_site site);
#define em_log1p(x) em_log1p_at((x), EM_HERE)
em_tensor *em_log1p_at(em_tensor *x, em_site site);
#define em_expm1(x) em_expm1_at((x), EM_HERE)
em_tensor *em_expm1_at(em_tensor *x, em_site site);
#define em_sqrt(x) em_sqrt_at((x), EM_HERE)
em_tensor *em_sqrt_at(em_tensor *x, em_site site);
#define em_rsqrt(x) em_rsqrt_at((x), EM_HERE)
em_tensor *em_rsqrt_at(em_tensor *x, em_site site);
#define em_sin(x) em_sin_at((x), EM_HERE)
em_tensor *em_sin_at(em_tensor *x, em_site site);
#define em_cos(x) em_cos_at((x), EM_HERE)
em_tensor *em_cos_at(em_tensor *x, em_site site);
#define em_tanh(x) em_tanh_at((x), EM_HERE)
em_tensor *em_tanh_at(em_tensor *x, em_site site);
#define em_erf(x) em_erf_at((x), EM_HERE)
em_tensor *em_erf_at(em_tensor *x, em_site site);
#define em_sign(x) em_sign_at((x), EM_HERE)
em_tensor *em_sign_at(em_tensor *x, em_site site);
#define em_floor(x) em_floor_at((x), EM_HERE)
em_tensor *em_floor_at(em_tensor *x, em_site site);
#define em_ceil(x) em_ceil_at((x), EM_HERE)
em_tensor *em_ceil_at(em_tensor *x, em_site site);
/* Rounding to an integral value, same dtype (identity on integers, as torch). round: to the
 * nearest, halves to even (torch.round; -0.4 gives -0.0); trunc: towards zero (torch.trunc);
 * frac: x - trunc(x) with x's sign (torch.frac; f32/f64 only, integers are refused as torch
 * does). NaN and inf pass through round and trunc; frac(inf) is NaN. Gradients are zero for
 * round and trunc, g for frac. The result is a new tensor owned by the current scope. */
#define em_round(x) em_round_at((x), EM_HERE)
em_tensor *em_round_at(em_tensor *x, em_site site);
#define em_trunc(x) em_trunc_at((x), EM_HERE)
em_tensor *em_trunc_at(em_tensor *x, em_site site);
#define em_frac(x) em_frac_at((x), EM_HERE)
em_tensor *em_frac_at(em_tensor *x, em_site site);
#define em_reciprocal(x) em_reciprocal_at((x), EM_HERE)
em_tensor *em_reciprocal_at(em_tensor *x, em_site site);
#define em_logical_not(x) em_logical_not_at((x), EM_HERE)
em_tensor *em_logical_not_at(em_tensor *x, em_site site);

/* Binary, a [..] and b [..] broadcast -> [..], dtype torch.result_type(a, b). add sub mul
 * maximum minimum: any numeric dtype (sub and neg reject bool, as torch does). div: true
 * division (integers promote to f32; torch.div). pow: torch.pow (integer pow integer stays
 * integer; negative integer exponents are an error for integer bases, as in torch). remainder:
 * torch.remainder (result has the sign of b; integer remainder by 0 is an error). Comparisons
 * eq ne lt le gt ge: compare in the promoted dtype, result bool. logical_and logical_or: nonzero
 * is true, result bool. */
#define em_add(a, b) em_add_at((a), (b), EM_HERE)
em_tensor *em_add_at(em_tensor *a, em_tensor *b, em_site site);
#define em_sub(a, b) em_sub_at((a), (b), EM_HERE)
em_tensor *em_sub_at(em_tensor *a, em_tensor *b, em_site site);
#define em_mul(a, b) em_mul_at((a), (b), EM_HERE)
em_tensor *em_mul_at(em_tensor *a, em_tensor *b, em_site site);
#define em_div(a, b) em_div_at((a), (b), EM_HERE)
em_tensor *em_div_at(em_tensor *a, em_tensor *b, em_site site);
#define em_pow(a, b) em_pow_at((a), (b), EM_HERE)
em_tensor *em_pow_at(em_tensor *a, em_tensor *b, em_site site);
#define em_maximum(a, b) em_maximum_at((a), (b), EM_HERE)
em_tensor *em_maximum_at(em_tensor *a, em_tensor *b, em_site site);
#define em_minimum(a, b) em_minimum_at((a), (b), EM_HERE)
em_tensor *em_minimum_at(em_tensor *a, em_tensor *b, em_site site);
#define em_remainder(a, b) em_remainder_at((a), (b), EM_HERE)
em_tensor *em_remainder_at(em_tensor *a, em_tensor *b, em_site site);
/* Element-wise arctangent of a / b taking the quadrant from both signs: the angle in radians, in
 * [-pi, pi], of the point (b, a); a [..] and b [..] broadcast, integers promote to f32, result
 * float. atan2(+-0, -0) is +-pi and atan2(+-0, +0) is +-0, as C's atan2. Gradient b / (a^2 + b^2)
 * for a and -a / (a^2 + b^2) for b (NaN at the origin). Matches torch.atan2. */
#define em_atan2(a, b) em_atan2_at((a), (b), EM_HERE)
em_tensor *em_atan2_at(em_tensor *a, em_tensor *b, em_site site);
#define em_eq(a, b) em_eq_at((a), (b), EM_HERE)
em_tensor *em_eq_at(em_tensor *a, em_tensor *b, em_site site);
#define em_ne(a, b) em_ne_at((a), (b), EM_HERE)
em_tensor *em_ne_at(em_tensor *a, em_tensor *b, em_site site);
#define em_lt(a, b) em_lt_at((a), (b), EM_HERE)
em_tensor *em_lt_at(em_tensor *a, em_tensor *b, em_site site);
#define em_le(a, b) em_le_at((a), (b), EM_HERE)
em_tensor *em_le_at(em_tensor *a, em_tensor *b, em_site site);
#define em_gt(a, b) em_gt_at((a), (b), EM_HERE)
em_tensor *em_gt_at(em_tensor *a, em_tensor *b, em_site site);
#define em_ge(a, b) em_ge_at((a), (b), EM_HERE)
em_tensor *em_ge_at(em_tensor *a, em_tensor *b, em_site site);
#define em_logical_and(a, b) em_logical_and_at((a), (b), EM_HERE)
em_tensor *em_logical_and_at(em_tensor *a, em_tensor *b, em_site site);
#define em_logical_or(a, b) em_logical_or_at((a), (b), EM_HERE)
em_tensor *em_logical_or_at(em_tensor *a, em_tensor *b, em_site site);

/* Scalar variants: the binary op with b a Python-style scalar (see type promotion above), e.g.
 * em_mul_scalar(x, 0.5) is torch's x * 0.5. Same shapes, dtypes and errors as the binary op. */
#define em_add_scalar(a, s) em_add_scalar_at((a), (s), EM_HERE)
em_tensor *em_add_scalar_at(em_tensor *a, double s, em_site site);
#define em_sub_scalar(a, s) em_sub_scalar_at((a), (s), EM_HERE)
em_tensor *em_sub_scalar_at(em_tensor *a, double s, em_site site);
#define em_mul_scalar(a, s) em_mul_scalar_at((a), (s), EM_HERE)
em_tensor *em_mul_scalar_at(em_tensor *a, double s, em_site site);
#define em_div_scalar(a, s) em_div_scalar_at((a), (s), EM_HERE)
em_tensor *em_div_scalar_at(em_tensor *a, double s, em_site site);
#define em_pow_scalar(a, s) em_pow_scalar_at((a), (s), EM_HERE)
em_tensor *em_pow_scalar_at(em_tensor *a, double s, em_site site);
#define em_maximum_scalar(a, s) em_maximum_scalar_at((a), (s), EM_HERE)
em_tensor *em_maximum_scalar_at(em_tensor *a, double s, em_site site);
#define em_minimum_scalar(a, s) em_minimum_scalar_at((a), (s), EM_HERE)
em_tensor *em_minimum_scalar_at(em_tensor *a, double s, em_site site);
#define em_remainder_scalar(a, s) em_remainder_scalar_at((a), (s), EM_HERE)
em_tensor *em_remainder_scalar_at(em_tensor *a, double s, em_site site);
#define em_eq_scalar(a, s) em_eq_scalar_at((a), (s), EM_HERE)
em_tensor *em_eq_scalar_at(em_tensor *a, double s, em_site site);
#define em_ne_scalar(a, s) em_ne_scalar_at((a), (s), EM_HERE)
em_tensor *em_ne_scalar_at(em_tensor *a, double s, em_site site);
#define em_lt_scalar(a, s) em_lt_scalar_at((a), (s), EM_HERE)
em_tensor *em_lt_scalar_at(em_tensor *a, double s, em_site site);
#define em_le_scalar(a, s) em_le_scalar_at((a), (s), EM_HERE)
em_tensor *em_le_scalar_at(em_tensor *a, double s, em_site site);
#define em_gt_scalar(a, s) em_gt_scalar_at((a), (s), EM_HERE)
em_tensor *em_gt_scalar_at(em_tensor *a, double s, em_site site);
#define em_ge_scalar(a, s) em_ge_scalar_at((a), (s), EM_HERE)
em_tensor *em_ge_scalar_at(em_tensor *a, double s, em_site site);

/* cond [..] (any dtype; nonzero is true), a [..], b [..] broadcast together -> [..] with dtype
 * result_type(a, b): a where cond, else b. Matches torch.where(cond, a, b). */
#define em_where(c, a, b) em_where_at((c), (a), (b), EM_HERE)
em_tensor *em_where_at(em_tensor *cond, em_tensor *a, em_tensor *b, em_site site);

/* x [..] converted to dtype dt (prims.convert_element_type; float -> int truncates toward zero,
 * -> bool is x != 0, f16/bf16 round to nearest even). Returns a new tensor even when the dtype
 * is unchanged. Matches x.to(dt). */
#define em_cast(x, dt) em_cast_at((x), (dt), EM_HERE)
em_tensor *em_cast_at(em_tensor *x, em_dtype dt, em_site site);

/* A contiguous copy of x (torch.clone), and x itself with a new reference in the current scope
 * when already contiguous, else a contiguous copy (Tensor.contiguous). */
#define em_clone(x) em_clone_at((x), EM_HERE)
em_tensor *em_clone_at(em_tensor *x, em_site site);
#define em_contiguous(x) em_contiguous_at((x), EM_HERE)
em_tensor *em_contiguous_at(em_tensor *x, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Reductions over a set of axes (n_axes entries of axes, each in range, no repeats); n_axes = 0
 * reduces over all axes, as torch.sum(x) does. keepdim keeps reduced axes with size 1.
 * Reducing a 0-size axis: sum 0, prod 1; amax/amin/argmax/argmin error, as in torch. Errors:
 * NULL input, axis out of range, repeated axis.                                              */

/* Sum and product. dtype: floats keep theirs; integers and bool give i64 (torch.sum,
 * torch.prod). f32 sums accumulate in blocks of f32 lanes combined in f64. */
#define em_sum(...) em_sum_at(__VA_ARGS__, EM_HERE)
em_tensor *em_sum_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site);
#define em_prod(...) em_prod_at(__VA_ARGS__, EM_HERE)
em_tensor *em_prod_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site);
/* Maximum and minimum, dtype kept; NaN propagates (torch.amax, torch.amin). */
#define em_amax(...) em_amax_at(__VA_ARGS__, EM_HERE)
em_tensor *em_amax_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site);
#define em_amin(...) em_amin_at(__VA_ARGS__, EM_HERE)
em_tensor *em_amin_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site);
/* Index (i64) of the first maximum / minimum along axis; axis = EM_ALL_AXES flattens x first and
 * returns a 0-dim index (keepdim then keeps all dims as 1). NaN counts as the maximum (and
 * minimum), as in torch.argmax / torch.argmin. Not differentiable. */
#define EM_ALL_AXES INT32_MIN
#define em_argmax(...) em_argmax_at(__VA_ARGS__, EM_HERE)
em_tensor *em_argmax_at(em_tensor *x, int axis, bool keepdim, em_site site);
#define em_argmin(...) em_argmin_at(__VA_ARGS__, EM_HERE)
em_tensor *em_argmin_at(em_tensor *x, int axis, bool keepdim, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Movement. Views where the strides allow (the result shares x's storage), copies otherwise.  */

/* x viewed (or copied, when no view exists) with the given shape; one size may be -1 and is
 * inferred. Errors: element count differs, more than one -1. Matches torch.reshape. */
#define em_reshape(...) em_reshape_at(__VA_ARGS__, EM_HERE)
em_tensor *em_reshape_at(em_tensor *x, int ndim, const int64_t *sizes, em_site site);
/* View with dimensions reordered: result dim i is x's dim perm[i]. Errors: perm is not a
 * permutation of 0..ndim-1. Matches torch.permute. */
#define em_permute(...) em_permute_at(__VA_ARGS__, EM_HERE)
em_tensor *em_permute_at(em_tensor *x, int ndim, const int64_t *perm, em_site site);
/* View with dims d0 and d1 swapped. Matches torch.transpose. */
#define em_transpose(x, d0, d1) em_transpose_at((x), (d0), (d1), EM_HERE)
em_tensor *em_transpose_at(em_tensor *x, int d0, int d1, em_site site);
/* View of x broadcast to sizes (stride 0 on stretched dims); -1 keeps a size; new leading dims
 * allowed. Errors: a non-1 size differs. Matches torch.expand. */
#define em_expand(...) em_expand_at(__VA_ARGS__, EM_HERE)
em_tensor *em_expand_at(em_tensor *x, int ndim, const int64_t *sizes, em_site site);
/* View of x[..., start:stop:step, ...] along axis, with Python's clamping of start and stop
 * (negative values count from the end). step >= 1. Matches torch.narrow / basic slicing. */
#define em_slice(x, axis, start, stop, step) em_slice_at((x), (axis), (start), (stop), (step), EM_HERE)
em_tensor *em_slice_at(em_tensor *x, int axis, int64_t start, int64_t stop, int64_t step,
                       em_site site);
/* View without the given axes of size 1 (n_axes = 0: all size-1 axes); a given axis whose size
 * is not 1 is left in place, as torch does (with none of size 1, the result is a view of x with
 * its shape). Errors: an axis out of range, a repeated axis. Matches torch.squeeze(x, dims). */
#define em_squeeze(...) em_squeeze_at(__VA_ARGS__, EM_HERE)
em_tensor *em_squeeze_at(em_tensor *x, int n_axes, const int64_t *axes, em_site site);
/* View with a size-1 axis inserted at position axis in [-(ndim+1), ndim]. torch.unsqueeze. */
#define em_unsqueeze(x, axis) em_unsqueeze_at((x), (axis), EM_HERE)
em_tensor *em_unsqueeze_at(em_tensor *x, int axis, em_site site);
/* Copy of x reversed along the given axes. Matches torch.flip. */
#define em_flip(...) em_flip_at(__VA_ARGS__, EM_HERE)
em_tensor *em_flip_at(em_tensor *x, int n_axes, const int64_t *axes, em_site site);
/* A copy of x with src written into x[..., start:stop:step, ...] along axis (bounds clamped as
 * em_slice does); src must have that slice's shape and x's dtype. Matches torch.slice_scatter.
 * It is the gradient of em_slice, and differentiable in both x and src. */
#define em_slice_scatter(x, src, axis, start, stop, step) \
  em_slice_scatter_at((x), (src), (axis), (start), (stop), (step), EM_HERE)
em_tensor *em_slice_scatter_at(em_tensor *x, em_tensor *src, int axis, int64_t start, int64_t stop, int64_t step,
                               em_site site);
/* Constant padding. pads holds n_pads (even, <= 2 * ndim) amounts, last dim first, as
 * torch.nn.functional.pad: (left, right) of the last dim, then (top, bottom) of the one before,
 * ... A negative amount crops that many elements from that side instead (torch's
 * constant_pad_nd narrows first, then pads), so the size becomes size + left + right; the crops
 * of one dim together may not exceed its size. The result is a new tensor filled with value
 * outside x; its gradient is the gradient's window over x (zero for the cropped elements).
 * Errors: an odd count or more than 2 per dim, crops larger than the size, a result size that
 * does not fit in 64 bits. Matches F.pad(x, pads, mode='constant', value=value). */
#define em_pad(...) em_pad_at(__VA_ARGS__, EM_HERE)
em_tensor *em_pad_at(em_tensor *x, int n_pads, const int64_t *pads, double value, em_site site);
/* Concatenation of n >= 1 tensors along axis; other sizes must agree; dtype result_type of
 * all. Matches torch.cat. */
#define em_cat(n, xs, axis) em_cat_at((n), (xs), (axis), EM_HERE)
em_tensor *em_cat_at(int n, em_tensor *const *xs, int axis, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Indexing. index tensors are i64 (i32 is accepted and widened); an index out of range is an
 * error naming the bad value.                                                                 */

/* out[i][j][k] = x[index[i][j][k]][j][k] for axis 0 (and likewise for other axes); index has
 * x's ndim and sizes <= x's on every other axis; result has index's shape. torch.gather. */
#define em_gather(x, axis, index) em_gather_at((x), (axis), (index), EM_HERE)
em_tensor *em_gather_at(em_tensor *x, int axis, em_tensor *index, em_site site);
/* x with axis replaced by the 1-D index's entries: out.size(axis) = index.numel().
 * torch.index_select. */
#define em_index_select(x, axis, index) em_index_select_at((x), (axis), (index), EM_HERE)
em_tensor *em_index_select_at(em_tensor *x, int axis, em_tensor *index, em_site site);
/* A copy of x with src added at index along axis: out[index[i][j]][j] += src[i][j] (axis 0).
 * index, src and x have one rank; index's sizes are <= x's off axis and <= src's on every axis:
 * only src's first index-shaped block is read (src[:i0, :i1, ...]), and the rest of src gets a
 * zero gradient, as in torch. src's dtype is converted to x's. Errors: ranks differ, index
 * larger than src or than x off axis, an index out of range. torch.scatter_add (out of place). */
#define em_scatter_add(x, axis, index, src) em_scatter_add_at((x), (axis), (index), (src), EM_HERE)
em_tensor *em_scatter_add_at(em_tensor *x, int axis, em_tensor *index, em_tensor *src,
                             em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Language-model ops: scans, sorting, sampling, splitting, triangular masks and gradient
 * clipping. axis counts from the end when negative; a 0-dim x takes axis 0 or -1 (as torch).
 * Results are owned by the current scope; dtypes as stated; errors (NULL, or -1 for the
 * counting functions, with a message naming the op and the shapes): NULL or EM_NONE input, axis
 * out of range, and the op's own below. Everything runs on the CPU and CUDA, traces into
 * compiled graphs and, where torch has a gradient, differentiates.                            */

/* Cumulative sum and product along axis: out[..., i, ...] = x[..., 0, ...] + ... + x[..., i, ...]
 * (product likewise). Same shape; floats keep their dtype (accumulated in f64 on both devices,
 * each partial rounded once, as torch's CPU kernel), integers and bool give i64 (wrapping).
 * Differentiable; cumprod's gradient is exact where x has zeros (torch's cumprod_backward).
 * Match torch.cumsum, torch.cumprod. */
#define em_cumsum(x, axis) em_cumsum_at((x), (axis), EM_HERE)
em_tensor *em_cumsum_at(em_tensor *x, int axis, em_site site);
#define em_cumprod(x, axis) em_cumprod_at((x), (axis), EM_HERE)
em_tensor *em_cumprod_at(em_tensor *x, int axis, em_site site);
/* The i64 indices that sort x along axis (ascending, or descending), x's shape. Stable: equal
 * elements keep their order (a valid result of torch's default unstable sort too). NaN is
 * larger than every number (last ascending, first descending); -0.0 equals 0.0. Any dtype but
 * f16/bf16 on the CPU. Not differentiable. Matches torch.argsort(x, dim, descending, stable=True). */
#define em_argsort(x, axis, descending) em_argsort_at((x), (axis), (descending), EM_HERE)
em_tensor *em_argsort_at(em_tensor *x, int axis, bool descending, em_site site);
/* Sorted values of x along axis (x's shape and dtype), ordered as em_argsort; *indices (if not
 * NULL) receives the i64 indices, owned by the current scope (NULL on error). The values are
 * differentiable (their gradient is scattered back to the sorted positions); the indices are
 * not. Matches torch.sort(x, dim, descending, stable=True) -> (values, indices). */
#define em_sort(x, axis, descending, indices) em_sort_at((x), (axis), (descending), (indices), EM_HERE)
em_tensor *em_sort_at(em_tensor *x, int axis, bool descending, em_tensor **indices, em_site site);
/* The k largest (or smallest) elements of x along axis, x's shape with axis of size k, always in
 * sorted order (largest first, or smallest first; among equal elements the first comes first)
 * whatever `sorted` says, an order torch.topk(sorted=False) may also give. *indices (if not
 * NULL) receives their i64 indices, owned by the current scope. Values differentiable, as
 * em_sort. Errors: k < 0 or k > x.size(axis). Matches torch.topk(x, k, dim, largest, sorted). */
#define em_topk(x, k, axis, largest, sorted, indices) em_topk_at((x), (k), (axis), (largest), (sorted), (indices), EM_HERE)
em_tensor *em_topk_at(em_tensor *x, int64_t k, int axis, bool largest, bool sorted, em_tensor **indices, em_site site);
/* num_samples category indices (i64) drawn from each row of probs [C] or [N, C] -> [num_samples]
 * or [N, num_samples]. probs are non-negative weights (f32 or f64; f16/bf16 on CUDA), not
 * necessarily summing to 1. With replacement each draw is independent (inverse CDF); without,
 * a category is drawn at most once per row (the exponential-race method torch uses: the
 * num_samples largest of p / E with E ~ Exp(1)). Draws come from Ember's Philox generator, so
 * em_manual_seed makes them reproducible, compiled or not (the values differ from PyTorch's).
 * The probabilities are checked as torch checks them, which reads a count back from the device
 * (a sync; inside a compiled function, a graph break). Errors: probs not 1-D or 2-D, not
 * floating, no categories, num_samples < 1, num_samples > C without replacement, an element
 * negative, infinite or NaN, a row summing to 0, or without replacement fewer than num_samples
 * non-zero categories in a row. Matches torch.multinomial(probs, num_samples, replacement). */
#define em_multinomial(probs, num_samples, replacement) em_multinomial_at((probs), (num_samples), (replacement), EM_HERE)
em_tensor *em_multinomial_at(em_tensor *probs, int64_t num_samples, bool replacement, em_site site);

/* Split x along axis into views: pieces of split_size (the last one shorter when split_size does
 * not divide the size; one empty piece when the size is 0), or of the n_sizes given sizes (>= 0,
 * summing to the size), or into at most `chunks` pieces of ceil(size / chunks) (fewer when
 * they run out; `chunks` empty pieces when the size is 0). The pieces are written to out[0..count)
 * and the count is returned; each piece is a view of x (it shares x's storage, and gradients
 * flow back to x) owned by the current scope like any op result, so the caller releases
 * nothing. With out NULL and max_out 0, em_split and em_chunk only return the count. Errors
 * (-1, out's entries NULL): x 0-dim, split_size < 1 (0 only for a size-0 axis), chunks < 1,
 * sizes that are negative or do not add up, more pieces than max_out. Match torch.split(x,
 * split_size, dim), torch.split(x, sizes, dim), torch.chunk(x, chunks, dim). */
#define em_split(x, split_size, axis, out, max_out) em_split_at((x), (split_size), (axis), (out), (max_out), EM_HERE)
int em_split_at(em_tensor *x, int64_t split_size, int axis, em_tensor **out, int max_out, em_site site);
#define em_split_sizes(x, n_sizes, sizes, axis, out) em_split_sizes_at((x), (n_sizes), (sizes), (axis), (out), EM_HERE)
int em_split_sizes_at(em_tensor *x, int n_sizes, const int64_t *sizes, int axis, em_tensor **out, em_site site);
#define em_chunk(x, chunks, axis, out, max_out) em_chunk_at((x), (chunks), (axis), (out), (max_out), EM_HERE)
int em_chunk_at(em_tensor *x, int chunks, int axis, em_tensor **out, int max_out, em_site site);

/* x [..., m, n] with the elements above (tril) or below (triu) the given diagonal set to zero:
 * tril keeps x[..., i, j] where j - i <= diagonal, triu where j - i >= diagonal (0: the main
 * diagonal, > 0 above it, < 0 below). Leading dims are a batch. Any dtype; differentiable (the
 * gradient is masked the same way). Errors: fewer than 2 dims. Match torch.tril, torch.triu. */
#define em_tril(x, diagonal) em_tril_at((x), (diagonal), EM_HERE)
em_tensor *em_tril_at(em_tensor *x, int64_t diagonal, em_site site);
#define em_triu(x, diagonal) em_triu_at((x), (diagonal), EM_HERE)
em_tensor *em_triu_at(em_tensor *x, int64_t diagonal, em_site site);

/* Clips the gradients of n parameters (borrowed for the call) by their total norm: with
 * total = the norm_type-norm of all their .grad together (2: Euclidean, INFINITY: largest
 * magnitude, any p > 0: (sum |g|^p)^(1/p)), every .grad is scaled in place, without grad, by
 * min(1, max_norm / (total + 1e-6)). Parameters without a .grad are skipped. Returns total as a
 * 0-dim tensor (f64 if any gradient is f64, else f32; an f32 0 when no parameter has a grad),
 * owned by the current scope. Nothing is read back to the host, so inside a compiled training
 * step it traces into the graph. Errors: n < 0, params NULL, max_norm negative or NaN,
 * norm_type not > 0 (NaN included). Matches torch.nn.utils.clip_grad_norm_(params, max_norm,
 * norm_type) (foreach=False, error_if_nonfinite=False). */
#define em_clip_grad_norm_(n, params, max_norm, norm_type) \
  em_clip_grad_norm__at((n), (params), (max_norm), (norm_type), EM_HERE)
em_tensor *em_clip_grad_norm__at(int n, em_tensor *const *params, double max_norm, double norm_type, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Extern kernels: GEMM and convolution through oneDNN (f32) and OpenBLAS (f64).               */

/* Matrix product with torch.matmul's rules: a [..., m, k] @ b [..., k, n] -> [..., m, n], batch
 * dims broadcast; a 1-D a is [1, k] (that dim removed after), a 1-D b is [k, 1] (likewise).
 * dtypes: f32, f64, i32, i64 (both alike; integers use a plain loop). A contiguous a of 3 or
 * more dims times a matrix b is computed as one product of a's rows (torch.matmul's folding).
 * Errors: k differs, dtypes differ, 0-dim input, batch dims that do not broadcast. */
#define em_matmul(a, b) em_matmul_at((a), (b), EM_HERE)
em_tensor *em_matmul_at(em_tensor *a, em_tensor *b, em_site site);

/* How em_conv2d pads: by the amounts in padding (the default), or as torch's padding='same'
 * (the output has the input's size: d (k - 1) zeros in all per dim, half on the left / top and
 * the extra one of an odd total on the right / bottom, as torch; stride must be 1) or
 * padding='valid' (no padding; padding[] is ignored). */
typedef enum em_conv_padding { EM_CONV_PAD_EXPLICIT, EM_CONV_PAD_SAME, EM_CONV_PAD_VALID } em_conv_padding;
/* Convolution parameters, (height, width) pairs: stride >= 1, padding >= 0 (zeros),
 * dilation >= 1, groups >= 1 dividing both channel counts; padding_mode (last, so initialisers
 * that stop at groups keep the explicit amounts). */
typedef struct em_conv2d_params {
  int64_t stride[2];
  int64_t padding[2];
  int64_t dilation[2];
  int64_t groups;
  em_conv_padding padding_mode;
} em_conv2d_params;
/* Default parameters: stride 1, padding 0, dilation 1, groups 1. */
#define EM_CONV2D_DEFAULT ((em_conv2d_params){{1, 1}, {0, 0}, {1, 1}, 1, EM_CONV_PAD_EXPLICIT})

/* 2-D cross-correlation, torch.nn.functional.conv2d. x [N, C, H, W], w [O, C/groups, kh, kw],
 * bias [O] or EM_NONE -> [N, O, Ho, Wo], Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1 (likewise Wo);
 * with EM_CONV_PAD_SAME, Ho = H and Wo = W (an odd total padding pads x's right / bottom edge
 * by one more zero first, as torch does); with EM_CONV_PAD_VALID, ph = pw = 0.
 * dtypes f32 (oneDNN) or f64 (reference loop), all alike. Errors: ranks, channel mismatch,
 * groups not dividing, bad params, output size < 1, 'same' with a stride other than 1, an
 * unknown padding_mode. */
#define em_conv2d(x, w, bias, p) em_conv2d_at((x), (w), (bias), (p), EM_HERE)
em_tensor *em_conv2d_at(em_tensor *x, em_tensor *w, em_tensor *bias, em_conv2d_params p,
                        em_site site);
/* Gradient of conv2d with respect to its input: grad_out [N, O, Ho, Wo], w [O, C/g, kh, kw] ->
 * [N, C, H, W] where input_hw = {H, W} (needed since several H give one Ho). Both gradients take
 * explicit padding only (padding_mode EM_CONV_PAD_EXPLICIT). torch.nn.grad.conv2d_input. */
#define em_conv2d_backward_input(g, w, hw, p) em_conv2d_backward_input_at((g), (w), (hw), (p), EM_HERE)
em_tensor *em_conv2d_backward_input_at(em_tensor *grad_out, em_tensor *w,
                                       const int64_t input_hw[2], em_conv2d_params p,
                                       em_site site);
/* Gradient of conv2d with respect to its weight: x [N, C, H, W], grad_out [N, O, Ho, Wo] ->
 * [O, C/g, kh, kw] where kernel_hw = {kh, kw}. torch.nn.grad.conv2d_weight. */
#define em_conv2d_backward_weight(x, g, khw, p) em_conv2d_backward_weight_at((x), (g), (khw), (p), EM_HERE)
em_tensor *em_conv2d_backward_weight_at(em_tensor *x, em_tensor *grad_out,
                                        const int64_t kernel_hw[2], em_conv2d_params p,
                                        em_site site);

/* ------------------------------------------------------------------------------------------ */
/* In-place ops: write into dst (which keeps its shape and dtype; the other operand broadcasts
 * to dst's shape and is converted to dst's dtype, which must be able to hold the result as
 * torch requires: an integer dst cannot take a float result). Each bumps dst's version counter
 * and returns dst (borrowed, no new reference). Errors: dst is an expanded view (several
 * elements share memory), shapes do not broadcast to dst, dtype cannot be cast. Match
 * Tensor.add_, sub_, mul_, div_, zero_, fill_, copy_.                                          */

#define em_add_(dst, b) em_add__at((dst), (b), EM_HERE)
em_tensor *em_add__at(em_tensor *dst, em_tensor *b, em_site site);
#define em_sub_(dst, b) em_sub__at((dst), (b), EM_HERE)
em_tensor *em_sub__at(em_tensor *dst, em_tensor *b, em_site site);
#define em_mul_(dst, b) em_mul__at((dst), (b), EM_HERE)
em_tensor *em_mul__at(em_tensor *dst, em_tensor *b, em_site site);
#define em_div_(dst, b) em_div__at((dst), (b), EM_HERE)
em_tensor *em_div__at(em_tensor *dst, em_tensor *b, em_site site);
/* dst += s and dst *= s for a scalar s. */
#define em_add_scalar_(dst, s) em_add_scalar__at((dst), (s), EM_HERE)
em_tensor *em_add_scalar__at(em_tensor *dst, double s, em_site site);
#define em_mul_scalar_(dst, s) em_mul_scalar__at((dst), (s), EM_HERE)
em_tensor *em_mul_scalar__at(em_tensor *dst, double s, em_site site);
#define em_zero_(dst) em_zero__at((dst), EM_HERE)
em_tensor *em_zero__at(em_tensor *dst, em_site site);
#define em_fill_(dst, v) em_fill__at((dst), (v), EM_HERE)
em_tensor *em_fill__at(em_tensor *dst, double value, em_site site);
/* Copies src (broadcast to dst's shape, converted to dst's dtype) into dst. Overlapping src and
 * dst are handled (src is read fully before dst is written). */
#define em_copy_(dst, src) em_copy__at((dst), (src), EM_HERE)
em_tensor *em_copy__at(em_tensor *dst, em_tensor *src, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Autograd (tape-less, as in PyTorch). Each result of a differentiable op whose inputs require
 * grad holds a node (grad_fn) with what its vector-Jacobian product needs: the inputs it saves,
 * with their version at save time. Gradients flow only through floating tensors. Grad mode is
 * per thread and on by default.                                                               */

/* Sets whether x (a leaf: made by a factory or em_detach, not by a differentiable op) requires
 * grad. Returns x (borrowed), or NULL with an error if x is not a leaf or not f32/f64. Matches
 * Tensor.requires_grad_. */
#define em_requires_grad_(x, flag) em_requires_grad__at((x), (flag), EM_HERE)
em_tensor *em_requires_grad__at(em_tensor *x, bool flag, em_site site);
/* Whether x requires grad (a leaf so marked, or a result of a differentiable op on one). */
bool em_requires_grad(const em_tensor *x);
/* Whether x is a leaf (has no grad_fn). */
bool em_is_leaf(const em_tensor *x);
/* The accumulated gradient of leaf x (same shape and dtype), or NULL if none yet. Borrowed:
 * owned by x, valid until x is freed or its grad is reset. Matches Tensor.grad. */
em_tensor *em_get_grad(const em_tensor *x);
/* Drops x's accumulated gradient (the next backward starts from nothing), as
 * Tensor.grad = None. */
void em_zero_grad(em_tensor *x);
/* A new tensor sharing x's storage, not requiring grad and with no grad_fn. Matches
 * Tensor.detach. */
#define em_detach(x) em_detach_at((x), EM_HERE)
em_tensor *em_detach_at(em_tensor *x, em_site site);
/* The name of the op that made x's grad_fn ("em_mul", ...), or NULL for a leaf. */
const char *em_grad_fn_name(const em_tensor *x);

/* Grad mode of the calling thread. em_set_grad_enabled returns the previous mode.
 * em_no_grad_begin / em_no_grad_end bracket a region with grad mode off (nestable), as
 * torch.no_grad(). */
bool em_set_grad_enabled(bool enabled);
bool em_is_grad_enabled(void);
void em_no_grad_begin(void);
void em_no_grad_end(void);

/* ---- autocast: mixed precision (torch.autocast) ----
 * em_autocast_begin(EM_BF16 or EM_F16) opens a region of the calling thread (regions nest, 16
 * deep; the innermost one's dtype applies) and em_autocast_end closes the innermost (a no-op
 * outside any). Inside, as torch.autocast(device_type, dtype):
 *  - em_matmul, em_linear and em_conv2d cast f32 (and the other half type's) operands, bias
 *    included, to the region's dtype and return that dtype; on CUDA the GEMMs accumulate in f32;
 *  - em_softmax, em_log_softmax, em_layer_norm, em_cross_entropy, em_sum and em_prod cast f16 /
 *    bf16 operands to f32 and return f32;
 *  - f64 and integer operands are never cast; other ops run on the dtypes they are given (mixed
 *    f16 / f32 operands promote to f32, as everywhere).
 * The casts are ordinary em_cast ops: gradients flow through them (an f32 parameter gets an f32
 * gradient; em_backward runs its rules outside autocast, in the dtypes the forward chose), and
 * em_compile records them in its graphs and guards on the region's dtype (a call under another
 * state traces again). Ember's CPU kernels do not compute in f16 / bf16: a lower-precision op on
 * CPU tensors inside a region fails with an error saying so (the f32 ops work).
 * em_autocast_begin errors (returns false, see em_last_error): a dtype other than f16 / bf16,
 * regions nested too deep. em_is_autocast_enabled: whether the calling thread is inside a
 * region; em_get_autocast_dtype: the innermost region's dtype, EM_F32 outside any.
 * Matches torch.autocast, torch.is_autocast_enabled, torch.get_autocast_dtype. */
#define em_autocast_begin(dtype) em_autocast_begin_at((dtype), EM_HERE)
bool em_autocast_begin_at(em_dtype dtype, em_site site);
void em_autocast_end(void);
bool em_is_autocast_enabled(void);
em_dtype em_get_autocast_dtype(void);

/* Backpropagates from out: accumulates d(out)/d(leaf) . grad into the .grad of every leaf that
 * requires grad and that out depends on. grad has out's shape (NULL: out must have one
 * element; the seed is 1). retain_graph keeps saved tensors for another backward; create_graph
 * records the backward itself so it can be differentiated again (implies retain_graph).
 * Returns false with an error on: out not requiring grad, a grad of the wrong shape, a saved
 * tensor modified in place since it was saved (naming both ops and their source lines), or a
 * second backward through a freed graph. Matches torch.autograd.backward. create_graph through
 * the output of a compiled function (em_call) works when the compiled backward reads only the
 * function's inputs (the min-cut partitioner often recomputes everything else from them) and is
 * refused with an error naming the function when it reads activations the compiled forward
 * saved (they carry no history); PyTorch refuses double backward through torch.compile always. */
#define em_backward(out, grad) em_backward_at((out), (grad), false, false, EM_HERE)
#define em_backward_ex(out, grad, retain_graph, create_graph) \
  em_backward_at((out), (grad), (retain_graph), (create_graph), EM_HERE)
bool em_backward_at(em_tensor *out, em_tensor *grad, bool retain_graph, bool create_graph, em_site site);

/* Gradients of the sum of outputs[i] . grad_outputs[i] with respect to inputs[i] (leaves or
 * intermediate results), without touching any .grad. grad_outputs may be NULL (every output then
 * has one element and seed 1). grads[i] receives a tensor owned by the current scope, zeros when
 * outputs do not depend on inputs[i]. Returns false with an error as em_backward.
 * Matches torch.autograd.grad(..., allow_unused=True, materialize_grads=True). */
#define em_grad(n_out, outs, grad_outs, n_in, ins, grads, retain_graph, create_graph) \
  em_grad_at((n_out), (outs), (grad_outs), (n_in), (ins), (grads), (retain_graph), (create_graph), EM_HERE)
bool em_grad_at(int n_outputs, em_tensor *const *outputs, em_tensor *const *grad_outputs, int n_inputs,
                em_tensor *const *inputs, em_tensor **grads, bool retain_graph, bool create_graph, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Composite ops: decompositions into prims through the op API (so they run eagerly, trace and
 * differentiate like any other op). Shapes, dtypes and formulas as the PyTorch op named. Float
 * inputs (f32, f64) unless stated. Results owned by the current scope; errors as usual.       */

/* max(x, 0), and x where x > 0 else slope * x. torch.relu, F.leaky_relu. */
#define em_relu(x) em_relu_at((x), EM_HERE)
em_tensor *em_relu_at(em_tensor *x, em_site site);
#define em_leaky_relu(x, slope) em_leaky_relu_at((x), (slope), EM_HERE)
em_tensor *em_leaky_relu_at(em_tensor *x, double slope, em_site site);
/* GELU (Hendrycks & Gimpel 2016): exact x/2 (1 + erf(x/sqrt 2)), or with tanh_approx
 * x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). F.gelu(approximate='none'|'tanh'). */
#define em_gelu(x, tanh_approx) em_gelu_at((x), (tanh_approx), EM_HERE)
em_tensor *em_gelu_at(em_tensor *x, bool tanh_approx, em_site site);
/* x * sigmoid(x) (F.silu); 1 / (1 + exp(-x)) (torch.sigmoid, computed stably for large |x|);
 * log(1 + exp(beta x)) / beta, linear above threshold (F.softplus). */
#define em_silu(x) em_silu_at((x), EM_HERE)
em_tensor *em_silu_at(em_tensor *x, em_site site);
#define em_sigmoid(x) em_sigmoid_at((x), EM_HERE)
em_tensor *em_sigmoid_at(em_tensor *x, em_site site);
#define em_softplus(x, beta, threshold) em_softplus_at((x), (beta), (threshold), EM_HERE)
em_tensor *em_softplus_at(em_tensor *x, double beta, double threshold, em_site site);
/* Along axis, max-subtracted for stability: exp(x - max) / sum, x - logsumexp(x), and
 * log(sum(exp(x))) (keepdim as stated). F.softmax, F.log_softmax, torch.logsumexp (over a
 * size-0 extent: -inf, as torch). */
#define em_softmax(x, axis) em_softmax_at((x), (axis), EM_HERE)
em_tensor *em_softmax_at(em_tensor *x, int axis, em_site site);
#define em_log_softmax(x, axis) em_log_softmax_at((x), (axis), EM_HERE)
em_tensor *em_log_softmax_at(em_tensor *x, int axis, em_site site);
#define em_logsumexp(...) em_logsumexp_at(__VA_ARGS__, EM_HERE)
em_tensor *em_logsumexp_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site);
/* Mean, and variance / standard deviation with Bessel's correction `correction` (1: unbiased),
 * over axes (n_axes = 0: all). Integer inputs give f32. torch.mean, torch.var, torch.std. */
#define em_mean(...) em_mean_at(__VA_ARGS__, EM_HERE)
em_tensor *em_mean_at(em_tensor *x, int n_axes, const int64_t *axes, bool keepdim, em_site site);
#define em_var(...) em_var_at(__VA_ARGS__, EM_HERE)
em_tensor *em_var_at(em_tensor *x, int n_axes, const int64_t *axes, int64_t correction, bool keepdim, em_site site);
#define em_std(...) em_std_at(__VA_ARGS__, EM_HERE)
em_tensor *em_std_at(em_tensor *x, int n_axes, const int64_t *axes, int64_t correction, bool keepdim, em_site site);
/* Normalisation over the last n_norm dims of x [..., *norm_shape] (Ba et al. 2016):
 * (x - mean) / sqrt(var + eps) * weight + bias; weight and bias [*norm_shape] or EM_NONE.
 * F.layer_norm (biased variance). */
#define em_layer_norm(x, n_norm, w, b, eps) em_layer_norm_at((x), (n_norm), (w), (b), (eps), EM_HERE)
em_tensor *em_layer_norm_at(em_tensor *x, int n_norm, em_tensor *weight, em_tensor *bias, double eps, em_site site);
/* x / sqrt(mean(x^2 over the last n_norm dims) + eps) * weight (Zhang & Sennrich 2019);
 * weight or EM_NONE. F.rms_norm. */
#define em_rms_norm(x, n_norm, w, eps) em_rms_norm_at((x), (n_norm), (w), (eps), EM_HERE)
em_tensor *em_rms_norm_at(em_tensor *x, int n_norm, em_tensor *weight, double eps, em_site site);
/* Batch normalisation (Ioffe & Szegedy 2015) of x [N, C, ...] over every dim but 1. training:
 * batch statistics (biased variance), and running_mean / running_var [C] (or EM_NONE) are
 * updated in place, without grad, as (1 - momentum) r + momentum stat (unbiased variance);
 * eval: the running statistics. weight, bias [C] or EM_NONE. F.batch_norm. */
#define em_batch_norm(x, rm, rv, w, b, training, momentum, eps) \
  em_batch_norm_at((x), (rm), (rv), (w), (b), (training), (momentum), (eps), EM_HERE)
em_tensor *em_batch_norm_at(em_tensor *x, em_tensor *running_mean, em_tensor *running_var, em_tensor *weight,
                            em_tensor *bias, bool training, double momentum, double eps, em_site site);
/* x [..., in] @ weight [out, in]^T + bias [out] (or EM_NONE) -> [..., out]. F.linear. */
#define em_linear(x, w, b) em_linear_at((x), (w), (b), EM_HERE)
em_tensor *em_linear_at(em_tensor *x, em_tensor *weight, em_tensor *bias, em_site site);
/* Zeroes each element with probability p (Philox mask) and scales the rest by 1 / (1 - p)
 * when training; x itself otherwise. F.dropout. Errors: p outside [0, 1]. */
#define em_dropout(x, p, training) em_dropout_at((x), (p), (training), EM_HERE)
em_tensor *em_dropout_at(em_tensor *x, double p, bool training, em_site site);

/* Loss reductions, as PyTorch's reduction='none' | 'mean' | 'sum'. */
typedef enum em_reduction { EM_REDUCE_NONE, EM_REDUCE_MEAN, EM_REDUCE_SUM } em_reduction;
/* Options of em_cross_entropy; EM_CROSS_ENTROPY_DEFAULT is PyTorch's default. */
typedef struct em_cross_entropy_opts {
  int64_t ignore_index;    /* class-index targets equal to it contribute nothing (-100) */
  double label_smoothing;  /* in [0, 1] (0) */
  em_reduction reduction;  /* (EM_REDUCE_MEAN: over non-ignored targets) */
  em_tensor *weight;       /* class weights [C] of the logits' dtype, borrowed; NULL (as an
                            * initialiser that stops at reduction leaves it) or EM_NONE: none */
} em_cross_entropy_opts;
#define EM_CROSS_ENTROPY_DEFAULT ((em_cross_entropy_opts){-100, 0.0, EM_REDUCE_MEAN, NULL})
/* Cross entropy of logits [N, C] (or [N, C, d...]) against class indices [N] (i64/i32;
 * [N, d...]) or class probabilities with the logits' shape and dtype; a scalar (mean, sum) or
 * [N, d...] (none), the logits' dtype, owned by the current scope. With class weights, as torch:
 * index targets give w[t] (-log p[t]) (1 - eps) + eps / C sum_c w_c (-log p_c), and the mean
 * divides by the sum of w[t] over the counted targets (NaN when it is 0); probability targets
 * give -sum_c w_c q_c log p_c and the mean divides by the number of examples. Errors: shapes,
 * dtypes, label_smoothing outside [0, 1], a weight that is not [C] of the logits' dtype, an
 * unknown reduction, a target out of range. F.cross_entropy(weight=, ignore_index=,
 * reduction=, label_smoothing=). */
#define em_cross_entropy(logits, target, opts) em_cross_entropy_at((logits), (target), (opts), EM_HERE)
em_tensor *em_cross_entropy_at(em_tensor *logits, em_tensor *target, em_cross_entropy_opts opts, em_site site);
/* Negative log likelihood of log-probabilities [N, C] at class indices [N]. F.nll_loss. */
#define em_nll_loss(logp, target, ignore_index, reduction) em_nll_loss_at((logp), (target), (ignore_index), (reduction), EM_HERE)
em_tensor *em_nll_loss_at(em_tensor *logp, em_tensor *target, int64_t ignore_index, em_reduction reduction, em_site site);
/* Options of em_nll_loss_ex; EM_NLL_LOSS_DEFAULT is PyTorch's default. */
typedef struct em_nll_loss_opts {
  int64_t ignore_index;    /* targets equal to it contribute nothing (-100) */
  em_reduction reduction;  /* (EM_REDUCE_MEAN) */
  em_tensor *weight;       /* class weights [C] of logp's dtype, borrowed; NULL or EM_NONE: none */
} em_nll_loss_opts;
#define EM_NLL_LOSS_DEFAULT ((em_nll_loss_opts){-100, EM_REDUCE_MEAN, NULL})
/* em_nll_loss with options: -w[t] logp[t] for log-probabilities [N, C] (or [N, C, d...]) at
 * class indices [N] (i64/i32; [N, d...]), 0 at ignored targets; reduced to a scalar (sum; mean:
 * divided by the sum of w[t] over the counted targets, NaN when it is 0) or [N, d...] (none).
 * logp's dtype, owned by the current scope. Errors: as em_nll_loss, and a weight that is not
 * [C] of logp's dtype. F.nll_loss(weight=, ignore_index=, reduction=). */
#define em_nll_loss_ex(logp, target, opts) em_nll_loss_ex_at((logp), (target), (opts), EM_HERE)
em_tensor *em_nll_loss_ex_at(em_tensor *logp, em_tensor *target, em_nll_loss_opts opts, em_site site);
/* (x - y)^2 with x, y broadcast, reduced. F.mse_loss. */
#define em_mse_loss(x, y, reduction) em_mse_loss_at((x), (y), (reduction), EM_HERE)
em_tensor *em_mse_loss_at(em_tensor *x, em_tensor *y, em_reduction reduction, em_site site);
/* Rows of weight [V, D] at indices [...] (i64/i32) -> [..., D]. F.embedding. */
#define em_embedding(idx, w) em_embedding_at((idx), (w), EM_HERE)
em_tensor *em_embedding_at(em_tensor *indices, em_tensor *weight, em_site site);
/* Options of em_embedding_ex; EM_EMBEDDING_DEFAULT is torch's (no padding_idx). */
typedef struct em_embedding_opts {
  bool has_padding_idx; /* whether padding_idx is set (false) */
  int64_t padding_idx;  /* a row in [-V, V) (negative counts from the end): the positions that
                         * read it give it no gradient; the forward is unchanged */
} em_embedding_opts;
#define EM_EMBEDDING_DEFAULT ((em_embedding_opts){false, 0})
/* em_embedding with options: rows of weight [V, D] at indices [...] (i64/i32) -> [..., D], dtype
 * weight's, owned by the current scope. With padding_idx set, weight's gradient at that row is
 * zero (the row itself is returned as stored). Errors: as em_embedding, and a padding_idx
 * outside [-V, V). Matches F.embedding(indices, weight, padding_idx=). */
#define em_embedding_ex(idx, w, opts) em_embedding_ex_at((idx), (w), (opts), EM_HERE)
em_tensor *em_embedding_ex_at(em_tensor *indices, em_tensor *weight, em_embedding_opts opts, em_site site);
/* 2-D max and average pooling of x [N, C, H, W] over kernel windows, stride (0: the kernel
 * size), zero padding (average pooling counts padding, as count_include_pad=True).
 * F.max_pool2d, F.avg_pool2d. */
#define em_max_pool2d(x, kh, kw, sh, sw, ph, pw) em_max_pool2d_at((x), (kh), (kw), (sh), (sw), (ph), (pw), EM_HERE)
em_tensor *em_max_pool2d_at(em_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                            em_site site);
#define em_avg_pool2d(x, kh, kw, sh, sw, ph, pw) em_avg_pool2d_at((x), (kh), (kw), (sh), (sw), (ph), (pw), EM_HERE)
em_tensor *em_avg_pool2d_at(em_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                            em_site site);
/* Options of em_max_pool2d_ex and em_avg_pool2d_ex, (height, width) pairs. Start from
 * EM_POOL2D_DEFAULT(kh, kw), torch's defaults (a zeroed struct has dilation 0, refused). */
typedef struct em_pool2d_opts {
  int64_t kernel[2];        /* >= 1 */
  int64_t stride[2];        /* >= 1; 0: the kernel size (torch's stride=None) */
  int64_t padding[2];       /* >= 0, at most half the kernel; max pooling pads -inf, average 0 */
  int64_t dilation[2];      /* >= 1 (1); max pooling only: average pooling has none */
  bool ceil_mode;           /* output size rounded up (false): the last window may hang past the
                             * padding, but must start inside the input or its left padding */
  bool count_include_pad;   /* average pooling divides by the window's size including the
                             * padding it covers, not past it (true), or by its input elements */
  int64_t divisor_override; /* average pooling: 0 (none) or every window's divisor */
} em_pool2d_opts;
#define EM_POOL2D_DEFAULT(kh, kw) ((em_pool2d_opts){{(kh), (kw)}, {0, 0}, {0, 0}, {1, 1}, false, true, 0})
/* 2-D max / average pooling of x [N, C, H, W] (f32 or f64) with torch's options ->
 * [N, C, Ho, Wo], x's dtype, owned by the current scope. Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1
 * rounded down, or up with ceil_mode, less one when that last window would start at or past
 * H + ph (likewise Wo). Gradients: all of it to the first maximum of each window in row-major
 * order (to its last NaN when it holds NaN), as torch's max_pool2d indices, or spread evenly over
 * the window by its divisor. Errors: x not 4-D or not floating, kernel / stride /
 * dilation < 1, padding < 0 or above half the kernel, dilation for average pooling, no window
 * fitting the padded input. Match F.max_pool2d(kernel_size, stride, padding, dilation,
 * ceil_mode) and F.avg_pool2d(kernel_size, stride, padding, ceil_mode, count_include_pad,
 * divisor_override). */
#define em_max_pool2d_ex(x, opts) em_max_pool2d_ex_at((x), (opts), EM_HERE)
em_tensor *em_max_pool2d_ex_at(em_tensor *x, em_pool2d_opts opts, em_site site);
#define em_avg_pool2d_ex(x, opts) em_avg_pool2d_ex_at((x), (opts), EM_HERE)
em_tensor *em_avg_pool2d_ex_at(em_tensor *x, em_pool2d_opts opts, em_site site);
/* softmax(q k^T * scale + mask) v (Vaswani et al. 2017) with q [..., L, E], k [..., S, E],
 * v [..., S, Ev] -> [..., L, Ev]; scale 1/sqrt(E) when scale <= 0; causal masks j > i; dropout
 * on the attention weights when dropout_p > 0. F.scaled_dot_product_attention. */
#define em_scaled_dot_product_attention(q, k, v, causal, dropout_p, scale) \
  em_scaled_dot_product_attention_at((q), (k), (v), (causal), (dropout_p), (scale), EM_HERE)
em_tensor *em_scaled_dot_product_attention_at(em_tensor *q, em_tensor *k, em_tensor *v, bool causal, double dropout_p,
                                              double scale, em_site site);
/* min(max(x, lo), hi), dtype torch.result_type(x, lo, hi) (an integer x with a fractional
 * bound gives f32); use -INFINITY / INFINITY for no bound. torch.clamp: lo > hi gives hi
 * everywhere, a NaN in x or a bound gives NaN. Gradient as torch's clamp_backward: x gets g
 * where lo <= x <= hi (the whole of g at a bound, not half), 0 elsewhere. */
#define em_clamp(x, lo, hi) em_clamp_at((x), (lo), (hi), EM_HERE)
em_tensor *em_clamp_at(em_tensor *x, double lo, double hi, em_site site);
/* clamp with tensor bounds (torch.clamp(x, min=lo, max=hi) with tensors): lo and hi broadcast
 * with x (either may be EM_NONE for no bound; NULL is an earlier failure and gives NULL); the
 * result has the broadcast shape and dtype torch.result_type of the three. Gradients (torch's
 * clamp_backward_min_max): x gets g where lo <= x <= hi; lo gets g where x < lo <= hi; hi gets
 * g where x > hi or hi < lo; each summed back to its own shape. Errors: shapes that do not
 * broadcast, both bounds EM_NONE. */
#define em_clamp_tensor(x, lo, hi) em_clamp_tensor_at((x), (lo), (hi), EM_HERE)
em_tensor *em_clamp_tensor_at(em_tensor *x, em_tensor *lo, em_tensor *hi, em_site site);
/* indices [...] (i64/i32, in [0, n)) -> i64 [..., n] with a 1 at each index, owned by the current
 * scope. n = -1 infers n as max(indices) + 1, as torch's num_classes=-1: that maximum is read
 * back to the host (a sync; under em_compile a graph break, as the shape depends on it). The
 * range check reads a count back too. Errors: n < 1 other than -1, an index outside [0, n),
 * n = -1 with empty indices (nothing to infer from), non-integer indices. F.one_hot. */
#define em_one_hot(idx, n) em_one_hot_at((idx), (n), EM_HERE)
em_tensor *em_one_hot_at(em_tensor *indices, int64_t n_classes, em_site site);
/* x with value where mask (bool, broadcast to x) is true. Tensor.masked_fill. */
#define em_masked_fill(x, mask, value) em_masked_fill_at((x), (mask), (value), EM_HERE)
em_tensor *em_masked_fill_at(em_tensor *x, em_tensor *mask, double value, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* torch's keyword options of the ops above (issue 21). Composites: they run eagerly on every
 * device, trace into compiled graphs and differentiate as the ops they are built from.        */

/* a + alpha * b and a - alpha * b, a [..] and b [..] broadcast -> [..], dtype as em_add /
 * em_sub (alpha 1 gives their very bits). alpha must be an integer when the result dtype is an
 * integer (as torch), and 1 when it is bool (torch would cast alpha to bool). An integer b
 * joining a float a is scaled in a's dtype. Gradient: g for a, +-alpha g for b. Returns a tensor
 * owned by the current scope; NULL with an error for a fractional alpha on integers (or one the
 * integer dtype cannot hold), shapes that do not broadcast, a NULL or EM_NONE operand. Match
 * torch.add(a, b, alpha=) / torch.sub. */
#define em_add_alpha(a, b, alpha) em_add_alpha_at((a), (b), (alpha), EM_HERE)
em_tensor *em_add_alpha_at(em_tensor *a, em_tensor *b, double alpha, em_site site);
#define em_sub_alpha(a, b, alpha) em_sub_alpha_at((a), (b), (alpha), EM_HERE)
em_tensor *em_sub_alpha_at(em_tensor *a, em_tensor *b, double alpha, em_site site);

/* torch.div's rounding_mode: None (true division, em_div), 'trunc', 'floor'. */
typedef enum em_rounding_mode { EM_ROUND_NONE, EM_ROUND_TRUNC, EM_ROUND_FLOOR } em_rounding_mode;
/* a / b rounded as mode says, a [..] and b [..] broadcast -> [..]. Dtype: EM_ROUND_NONE as
 * em_div (integers give f32); with a rounding mode, torch.result_type(a, b): integers give the
 * exact integer quotient in that dtype (all of i64, not through floating point; INT_MIN / -1
 * wraps), floats trunc(a / b) or torch's floor division (computed as Python's // is:
 * (a - fmod(a, b)) / b, corrected, which is not always floor(a / b); b = 0 gives a / b).
 * Integer division by zero is an error, as torch on the CPU: found by the remainder kernel,
 * which on CUDA reads one flag back (a wait, as em_remainder's). The gradient is zero for both
 * operands, as torch's. Returns a tensor owned by the current scope; NULL with an error for bool
 * operands (torch has no kernel either), an unknown mode, shapes that do not broadcast, integer
 * division by zero, a NULL or EM_NONE operand. Matches torch.div(a, b, rounding_mode=). */
#define em_div_mode(a, b, mode) em_div_mode_at((a), (b), (mode), EM_HERE)
em_tensor *em_div_mode_at(em_tensor *a, em_tensor *b, em_rounding_mode mode, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* nn: parameter initialisation and layers as torch.nn builds them by default                  */

/* Fill t in place, without grad, from U(lo, hi) / kaiming-uniform U(-bound, bound) with
 * bound = sqrt(6 / ((1 + a^2) fan_in)), fan_in = size(1) * prod(size(2:)) (He et al. 2015;
 * torch.nn.init.uniform_, kaiming_uniform_(a, mode='fan_in', nonlinearity='leaky_relu')).
 * Return t (borrowed); NULL with an error for a non-float t, bounds that are not finite or
 * have lo > hi, or (kaiming) fewer than 2 dims. f16/bf16 tensors take f32 draws, rounded. */
#define em_init_uniform_(t, lo, hi) em_init_uniform__at((t), (lo), (hi), EM_HERE)
em_tensor *em_init_uniform__at(em_tensor *t, double lo, double hi, em_site site);
#define em_init_kaiming_uniform_(t, a) em_init_kaiming_uniform__at((t), (a), EM_HERE)
em_tensor *em_init_kaiming_uniform__at(em_tensor *t, double a, em_site site);

/* nn.Linear(in, out): weight f32 [out, in] kaiming-uniform with a = sqrt(5), bias f32 [out]
 * U(-1/sqrt(in), 1/sqrt(in)) (or EM_NONE without bias); both require grad and belong to the
 * current scope. Apply with em_linear(x, l.weight, l.bias). Sizes may be 0 (as nn.Linear).
 * Returns false with an error (negative sizes, allocation failure), leaving both fields NULL. */
typedef struct em_linear_layer {
  em_tensor *weight, *bias;
} em_linear_layer;
#define em_linear_layer_init(l, in, out, has_bias) em_linear_layer_init_at((l), (in), (out), (has_bias), EM_HERE)
bool em_linear_layer_init_at(em_linear_layer *l, int64_t in, int64_t out, bool has_bias, em_site site);
/* nn.Conv2d(in, out, (kh, kw), ...): weight f32 [out, in/groups, kh, kw] kaiming-uniform with
 * a = sqrt(5), bias [out] U(-1/sqrt(fan_in), 1/sqrt(fan_in)) or EM_NONE. Apply with
 * em_conv2d(x, l.weight, l.bias, l.params). Errors (fields left NULL): groups not dividing the
 * channel counts, kernel < 1, stride or dilation < 1, padding < 0, an unknown padding_mode or
 * 'same' with a stride other than 1, allocation failure. */
typedef struct em_conv2d_layer {
  em_tensor *weight, *bias;
  em_conv2d_params params;
} em_conv2d_layer;
#define em_conv2d_layer_init(l, in, out, kh, kw, p, has_bias) \
  em_conv2d_layer_init_at((l), (in), (out), (kh), (kw), (p), (has_bias), EM_HERE)
bool em_conv2d_layer_init_at(em_conv2d_layer *l, int64_t in, int64_t out, int64_t kh, int64_t kw,
                             em_conv2d_params p, bool has_bias, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Optimizers. An optimizer holds references to its parameters (leaves requiring grad) and its
 * state; a step updates the parameters in place without grad, skipping parameters with no
 * grad. Formulas are PyTorch's (torch.optim.SGD, torch.optim.AdamW with bias correction).    */

typedef struct em_optimizer em_optimizer;
typedef struct em_sgd_opts {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
} em_sgd_opts;
#define EM_SGD_DEFAULT(lr) ((em_sgd_opts){(lr), 0.0, 0.0, 0.0, false})
typedef struct em_adamw_opts {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad;
} em_adamw_opts;
#define EM_ADAMW_DEFAULT(lr) ((em_adamw_opts){(lr), 0.9, 0.999, 1e-8, 1e-2, false})
/* New optimizers over n parameters (borrowed for the call; retained by the optimizer). Return
 * NULL with an error for a parameter that is not a float leaf requiring grad, or bad options
 * (negative lr, nesterov without momentum or with dampening, betas outside [0, 1)). */
#define em_sgd_new(n, params, opts) em_sgd_new_at((n), (params), (opts), EM_HERE)
em_optimizer *em_sgd_new_at(int n, em_tensor *const *params, em_sgd_opts opts, em_site site);
#define em_adamw_new(n, params, opts) em_adamw_new_at((n), (params), (opts), EM_HERE)
em_optimizer *em_adamw_new_at(int n, em_tensor *const *params, em_adamw_opts opts, em_site site);
/* One update of every parameter that has a grad. Returns false with an error. */
#define em_optimizer_step(opt) em_optimizer_step_at((opt), EM_HERE)
bool em_optimizer_step_at(em_optimizer *opt, em_site site);
/* Drops every parameter's grad (set_to_none=True, PyTorch's default). */
void em_optimizer_zero_grad(em_optimizer *opt);
/* Learning rate, for schedules. The optimizer keeps it in a 0-dim f64 tensor that compiled
 * steps read as an input (torch.optim's capturable mode), so setting it, even every step,
 * changes an input of a compiled training step, never its graph. Inside a traced function the
 * write is traced like any in-place op. */
void em_optimizer_set_lr(em_optimizer *opt, double lr);
double em_optimizer_get_lr(const em_optimizer *opt);
/* Releases the optimizer, its state and its references. NULL-safe. */
void em_optimizer_free(em_optimizer *opt);

/* ------------------------------------------------------------------------------------------ */
/* Saving and loading tensors: safetensors (https://huggingface.co/docs/safetensors), the format
 * of the `safetensors` Python package and the Hugging Face Hub. A file is an 8-byte
 * little-endian header size N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets"}},
 * optional "__metadata__" of strings), then the tensors' bytes, row-major, little-endian.
 * dtypes: F32 F64 I32 I64 BOOL U8 F16 BF16 map to Ember's; files holding I8, I16, U16, U32,
 * U64, F8_E4M3 or F8_E5M2 tensors load, but those tensors cannot be read. Ember writes files
 * the Python package reads (tensors ordered by decreasing element size, header padded to 8
 * bytes, so every tensor is aligned) and reads the files it writes.
 * Malformed files are errors naming the file and the fault, found before any tensor memory is
 * allocated: a header over 100,000,000 bytes (the reference implementation's limit) or past
 * the end of the file, JSON that is not an object, a tensor described twice, unknown dtypes,
 * shapes of more than 8 dims, byte ranges that do not match the shape, leave gaps, overlap, or
 * do not cover the data exactly, metadata that is not strings, bool bytes other than 0 and 1. */

/* Writes n named tensors (any device, strides or views; read as em_to_buffer reads them) and
 * metadata, a list of string pairs ended by NULL ((const char *[]){"format", "pt", NULL}) or
 * NULL, to path. The file is written under a temporary name in the same directory and renamed
 * over path when complete, so a failed save leaves any earlier file at path intact. Inside a
 * compiled function this is a graph break. Returns false with an error: NULL path or names,
 * duplicate names, the reserved name "__metadata__", a metadata key with no value, a tensor
 * the format cannot hold, an I/O failure (naming path and errno). Matches
 * safetensors.numpy.save_file / safetensors.torch.save_file. */
#define em_save_safetensors(path, n, tensors, names, metadata) \
  em_save_safetensors_at((path), (n), (tensors), (names), (metadata), EM_HERE)
bool em_save_safetensors_at(const char *path, int n, em_tensor *const *tensors, const char *const *names,
                            const char *const *metadata, em_site site);

/* A loaded safetensors file: an opaque handle over the mapped file (mmap, MAP_PRIVATE). */
typedef struct em_safetensors em_safetensors;
/* Maps and validates path (see the checks above); a new handle, owned by the caller
 * (em_safetensors_close), or NULL with an error. Matches safetensors.safe_open. */
#define em_load_safetensors(path) em_load_safetensors_at((path), EM_HERE)
em_safetensors *em_load_safetensors_at(const char *path, em_site site);
/* Tensors in the file, and the name of the i-th in file order (borrowed, valid until close;
 * NULL when i is out of range). f may be NULL (0 tensors). */
int em_safetensors_count(const em_safetensors *f);
const char *em_safetensors_name(const em_safetensors *f, int i);
/* The "__metadata__" value of key (borrowed, valid until close), or NULL when absent. */
const char *em_safetensors_metadata(const em_safetensors *f, const char *key);
/* The tensor stored under name, contiguous, owned by the current scope, on the default device.
 * On the CPU it is a view of the mapped file, no copy, when its bytes are aligned to its
 * element size (always so in files from Ember or the Python package); else a copy. Writes into
 * it change this process's pages, never the file. Each call returns the same tensor (made at
 * the first); it and its views keep the mapping alive past em_safetensors_close. Errors:
 * NULL f or name, no such name, a dtype Ember lacks, bool bytes other than 0/1, no device. */
#define em_safetensors_get(f, name) em_safetensors_get_at((f), (name), EM_HERE)
em_tensor *em_safetensors_get_at(em_safetensors *f, const char *name, em_site site);
/* Drops the handle's references (tensors handed out stay valid). NULL-safe. */
void em_safetensors_close(em_safetensors *f);

/* em_save: em_save_safetensors without metadata. (Ember's former "EMBR" format is no longer
 * written; em_load still reads it, see runtime/serialize.c.) */
#define em_save(path, n, tensors, names) em_save_at((path), (n), (tensors), (names), EM_HERE)
bool em_save_at(const char *path, int n, em_tensor *const *tensors, const char *const *names, em_site site);
/* Reads path (safetensors, or an old EMBR file, told apart by content) and copies the tensor
 * saved under names[i] into tensors[i] in place (without grad; any strides or device), which
 * must have the saved shape and dtype. All or nothing: every name, shape and dtype is checked
 * before any tensor is written. Returns false with an error naming the first mismatch or
 * missing name. Matches load_state_dict(strict=False) for the names given. */
#define em_load(path, n, tensors, names) em_load_at((path), (n), (tensors), (names), EM_HERE)
bool em_load_at(const char *path, int n, em_tensor *const *tensors, const char *const *names, em_site site);

/* Training checkpoints: n named parameters, the optimizer's state and the random generator, in
 * one safetensors file, so that training resumed from it continues bit for bit. Parameters are
 * stored under their names; the optimizer (may be NULL) under "optimizer.lr" and
 * "optimizer.<i>.<slot>" for parameter i, slots as torch.optim names them: momentum_buffer
 * (SGD), exp_avg, exp_avg_sq, max_exp_avg_sq and step (AdamW), only those that exist (state is
 * made at a parameter's first step); metadata "ember.optimizer" ("sgd", "adamw") and
 * "ember.rng" (the Philox seed and offset). Loading needs the same parameter names, shapes and
 * dtypes and an optimizer of the same kind over as many parameters (its hyperparameters other
 * than lr are the caller's); it replaces the optimizer's state (slots absent from the file are
 * dropped, as for a parameter that has not stepped), sets lr, and restores the generator.
 * All or nothing, as em_load. Returns false with an error. */
#define em_checkpoint_save(path, n, params, names, opt) \
  em_checkpoint_save_at((path), (n), (params), (names), (opt), EM_HERE)
bool em_checkpoint_save_at(const char *path, int n, em_tensor *const *params, const char *const *names,
                           em_optimizer *opt, em_site site);
#define em_checkpoint_load(path, n, params, names, opt) \
  em_checkpoint_load_at((path), (n), (params), (names), (opt), EM_HERE)
bool em_checkpoint_load_at(const char *path, int n, em_tensor *const *params, const char *const *names,
                           em_optimizer *opt, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* DLPack (https://dmlc.github.io/dlpack/latest/, version 1.0): zero-copy exchange of tensors
 * with NumPy (numpy.from_dlpack), PyTorch (torch.from_dlpack), JAX, CuPy. The structures are
 * the standard's dlpack.h ones; include <dlpack/dlpack.h> (1.0 or later) to read their fields.
 * Ember's dtypes map to (code, bits): f32 (kDLFloat, 32), f64 (kDLFloat, 64), f16 (kDLFloat,
 * 16), bf16 (kDLBfloat, 16), i32 (kDLInt, 32), i64 (kDLInt, 64), u8 (kDLUInt, 8), bool
 * (kDLBool, 8); devices to kDLCPU and (kDLCUDA, 0); strides are in elements, as DLPack's. */
struct DLManagedTensorVersioned;
struct DLManagedTensor;

/* Exports x without a copy: a new DLManagedTensorVersioned (version 1.0, flags 0: writable,
 * not a copy) whose dl_tensor points at x's element 0 with x's shape, strides and device, and
 * which holds a reference to x until the consumer calls its deleter (exactly once, from any
 * thread; the deleter frees the struct). Writes on either side are seen by the other. CUDA:
 * waits for the device's queued work first, so the consumer may read at once on any stream.
 * Inside a function being compiled this is a graph break (the data must exist). Errors (NULL):
 * NULL or EM_NONE x, out of memory. Matches torch.Tensor.__dlpack__(max_version=(1, 0)). */
#define em_to_dlpack(x) em_to_dlpack_at((x), EM_HERE)
struct DLManagedTensorVersioned *em_to_dlpack_at(em_tensor *x, em_site site);
/* The same as the pre-1.0 DLManagedTensor, for consumers that ask for no version (the legacy
 * "dltensor" capsule: NumPy before 2.1, PyTorch before 2.4). */
#define em_to_dlpack_unversioned(x) em_to_dlpack_unversioned_at((x), EM_HERE)
struct DLManagedTensor *em_to_dlpack_unversioned_at(em_tensor *x, em_site site);

/* Imports m, taking ownership of it in every case (success or error), as the spec has the
 * consumer do: a tensor owned by the current scope over m's memory, no copy, with m's dtype,
 * shape and strides on its device (kDLCPU and kDLCUDAHost: the CPU; kDLCUDA id 0: CUDA); m's
 * deleter runs when the tensor and all its views are gone. A tensor flagged read-only
 * (DLPACK_FLAG_BITMASK_READ_ONLY) is copied instead, since Ember tensors are writable, and m is
 * released at once. A major version other than 1 is refused after calling m's deleter (its
 * other fields may have moved). Errors (NULL): NULL m, that version, a device, dtype, lanes,
 * ndim (> 8) or negative stride Ember lacks. Matches torch.from_dlpack. */
#define em_from_dlpack(m) em_from_dlpack_at((m), EM_HERE)
em_tensor *em_from_dlpack_at(struct DLManagedTensorVersioned *m, em_site site);
/* The same for a pre-1.0 DLManagedTensor (no version, no flags). */
#define em_from_dlpack_unversioned(m) em_from_dlpack_unversioned_at((m), EM_HERE)
em_tensor *em_from_dlpack_unversioned_at(struct DLManagedTensor *m, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Profiler: a timeline in the Chrome Trace Event Format (the JSON that chrome://tracing and
 * https://ui.perfetto.dev open; "Trace Event Format", Google, 2016): {"traceEvents": [...]},
 * complete events ("ph": "X", "ts" and "dur" in microseconds from em_profiler_start) per
 * thread ("tid"; thread_name metadata events), instant events ("ph": "i") for graph breaks and
 * recompiles. Categories ("cat"): "op" (each eager op, args.detail: its operands' dtypes and
 * shapes; also each op a compiled graph runs eagerly), "compiled" (an em_call), "kernel" (each
 * generated CPU kernel; on CUDA the launch, as the kernels run asynchronously), "gemm" (GEMMs
 * inside compiled graphs, with shapes), "phase" (tracing, inductor compile, LLVM codegen + JIT,
 * NVRTC compile), "graph_break" (op, file:line, reason), "recompile" (the failed guard).
 * Events nest by time within a thread. Off (the default), the cost is one load and branch per
 * hook: bench/profile measures it. EMBER_PROFILE=trace.json profiles the whole process and
 * writes the file at exit. On CUDA, each kernel (eager and generated) is also bracketed by two
 * CUDA events on its stream, and its device time written on a track of its own ("CUDA (device
 * time)", category "cuda"), placed on the host's clock by a reference event recorded after a
 * sync at the first profiled launch (as PyTorch's profiler does with CUPTI, coarser). */

/* Starts recording (again: events before the call are dropped). Never fails; events that
 * cannot be stored (out of memory) are dropped. */
void em_profiler_start(void);
/* Stops recording and writes everything recorded since em_profiler_start to path. Returns
 * false with an error naming path and errno when it cannot be written. */
#define em_profiler_stop(path) em_profiler_stop_at((path), EM_HERE)
bool em_profiler_stop_at(const char *path, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Data                                                                                        */

/* An IDX file (LeCun's MNIST format; gzip-compressed or raw, told apart by content) as a tensor
 * of the file's element type (u8, i32, f32, f64; i8 and i16 widen to i32) and shape. Owned by
 * the current scope. Errors: unreadable file, bad magic, truncated data. */
#define em_load_idx(path) em_load_idx_at((path), EM_HERE)
em_tensor *em_load_idx_at(const char *path, em_site site);
/* NumPy .npy files (format versions 1-3, C order, little-endian: f32 f64 i32 i64 u8 bool).
 * em_load_npy creates on the default device (numpy.load, then em_to); em_save_npy reads any. */
#define em_load_npy(path) em_load_npy_at((path), EM_HERE)
em_tensor *em_load_npy_at(const char *path, em_site site);
#define em_save_npy(path, t) em_save_npy_at((path), (t), EM_HERE)
bool em_save_npy_at(const char *path, em_tensor *t, em_site site);

/* Fashion-MNIST (Xiao et al. 2017) as Debian's dataset-fashion-mnist installs it
 * (/usr/share/datasets/fashion-mnist, or dir when not NULL): images u8 [N, 28, 28], labels u8
 * [N]; 60000 training and 10000 test examples, on the default device. Tensors belong to the
 * current scope. Errors name the missing file and the Debian package. */
typedef struct em_fashion_mnist {
  em_tensor *train_images, *train_labels, *test_images, *test_labels;
} em_fashion_mnist;
#define em_fashion_mnist_load(d, dir) em_fashion_mnist_load_at((d), (dir), EM_HERE)
bool em_fashion_mnist_load_at(em_fashion_mnist *d, const char *dir, em_site site);

/* Mini-batches of indices into a data set of n examples: each epoch visits every index once,
 * in an order shuffled by a Philox stream keyed by (seed, epoch) when shuffle is set; the last
 * short batch is kept unless drop_last. */
typedef struct em_batch_iter em_batch_iter;
/* Returns a new iterator (free with em_batch_iter_free), or NULL with an error naming the
 * caller's line: n < 0, batch_size < 1, n too large to hold its order, out of memory. */
#define em_batch_iter_new(n, batch_size, shuffle, seed, drop_last) \
  em_batch_iter_new_at((n), (batch_size), (shuffle), (seed), (drop_last), EM_HERE)
em_batch_iter *em_batch_iter_new_at(int64_t n, int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last,
                                    em_site site);
/* The next batch's indices, i64 [b] on the default device, owned by the current scope; NULL at the end of the epoch
 * (then the iterator moves to the next epoch, reshuffled). */
#define em_batch_iter_next(it) em_batch_iter_next_at((it), EM_HERE)
em_tensor *em_batch_iter_next_at(em_batch_iter *it, em_site site);
/* Batches per epoch. */
int64_t em_batch_iter_len(const em_batch_iter *it);
void em_batch_iter_free(em_batch_iter *it);

/* A data loader (torch.utils.data.DataLoader with num_workers and prefetch_factor) over
 * in-memory tensors: n tensors sharing dim 0 (rows: examples). Each batch holds the rows of one
 * em_batch_iter batch with the same options and seed, in the same order, so a loop over the
 * loader computes exactly what a loop over em_batch_iter + em_index_select computes. Worker
 * threads copy rows into batch buffers ahead of the consumer; for EM_CUDA the rows go into
 * pinned host buffers and are copied to the device asynchronously on a side stream, which the
 * consumer's current stream waits for (an event), so the host never waits on the copy. */
typedef struct em_loader em_loader;
typedef struct em_loader_opts {
  int64_t batch_size; /* rows per batch, >= 1 */
  bool shuffle;       /* a new Philox permutation each epoch, keyed by (seed, epoch) */
  uint64_t seed;
  bool drop_last;     /* drop the last short batch */
  int workers;        /* threads assembling batches, 0..64; 0: em_loader_next assembles in the caller */
  int prefetch;       /* batches assembled ahead of the consumer (in all), 0..1024; 0: 2 per worker */
  em_device device;   /* where the batches are: EM_CPU (default) or EM_CUDA */
} em_loader_opts;
/* Returns a new loader (free with em_loader_free) holding references to the tensors (copies of
 * the non-contiguous ones), positioned at the start of epoch 0. tensors: n >= 1 CPU tensors,
 * each with at least one dimension, all with the same size along dim 0, any dtypes.
 * Errors (NULL, naming the caller's line): NULL array or tensor, n < 1, a tensor on CUDA or
 * 0-dim, sizes along dim 0 that differ, batch_size < 1, workers or prefetch out of range, a bad
 * device, EM_CUDA with no device, out of memory, a thread that cannot start. */
#define em_loader_new(n, tensors, opts) em_loader_new_at((n), (tensors), (opts), EM_HERE)
em_loader *em_loader_new_at(int n, em_tensor *const *tensors, const em_loader_opts *opts, em_site site);
/* The next batch: an array of the n tensors, tensors[i]'s rows for the batch, shape
 * [b, tensors[i]'s other sizes...], same dtype, on opts.device, owned by the current scope
 * (the array is the loader's, valid until the next call). NULL at the end of the epoch (then
 * the loader moves to the next epoch, reshuffled, and its workers start on it), or NULL with an
 * error recorded (out of memory: that batch is skipped). NULL loader: NULL. */
#define em_loader_next(l) em_loader_next_at((l), EM_HERE)
em_tensor **em_loader_next_at(em_loader *l, em_site site);
/* Abandons the rest of the current epoch and starts the next one (as the end of an epoch does). */
void em_loader_reset(em_loader *l);
/* Batches per epoch (em_batch_iter_len). */
int64_t em_loader_len(const em_loader *l);
/* Batches assembled or being assembled ahead of the consumer now, and the most there have been
 * (never more than prefetch; for tests and tuning). */
int em_loader_ahead(const em_loader *l, int *peak);
/* Stops the workers and frees the loader; the batches it returned stay valid. NULL-safe. */
void em_loader_free(em_loader *l);

/* ------------------------------------------------------------------------------------------ */
/* Compilation: em_compile() captures the tensor program a model function runs                */
/*
 * em_compile(fn, opts) wraps a model function; calling the result with em_call runs fn
 * compiled. As with torch.compile, the first call traces: fn runs once on proxy results (exact
 * metadata, no data) while every op it calls (prims, composites, the autograd engine's
 * backward under em_grad) is recorded into a graph of prims. Real tensors fn reaches other
 * than its inputs (parameters through ctx) are lifted into graph inputs. The captured graph is
 * handed to the backend and stored as a cache entry under guards:
 *   - each input's dtype, sizes, strides, device and requires_grad; the number of inputs;
 *   - the grad mode; the ctx pointer;
 *   - every lifted tensor's identity (a weak reference: if it is freed, the entry dies) and its
 *     dtype, sizes, strides and requires_grad.
 * A call whose guards all pass reuses the entry; a failure traces again (a recompile, logged
 * with the guard that failed under EMBER_LOGS=recompiles). After recompile_limit entries the
 * function runs eagerly from then on, and says so once on stderr.
 *
 * Jit semantics: what a replay depends on. An entry without graph breaks is replayed without
 * calling fn. What its result depends on is, for each thing fn reads:
 *   - an input of the graph: the call's tensors; tensors reached through ctx (by identity);
 *     the optimizers' learning rate and AdamW's step counts (0-dim tensors); a number em_item
 *     returned to fn and passed straight to a later op (a 0-dim graph input, so one graph
 *     serves every value, as torch.compile's unspecialized floats);
 *   - a guard, checked on every call (a failure recompiles): the inputs' metadata and which of
 *     them (and of the tensors reached through ctx) share storage; the grad mode; the ctx
 *     pointer; host values fn declares with em_guard_value (a `training` flag, a float field);
 *   - a constant of the trace: every other host value fn reads (a C global, a ctx field it did
 *     not declare, a number it computes on the host), as in jax.jit. Host side effects of fn
 *     (printing, counters) happen only while tracing.
 * A trace that no replay could reproduce is not cached (fn runs on every call, counted in
 * em_compile_stats.uncached_traces): one that stores a tensor it made into ctx or a static (an
 * RNN's hidden state), or in which an op failed.
 *
 * Replay validation. To catch a constant that should have been a guard, the second call of each
 * entry traces fn again instead of replaying and compares the trace with the entry's (its
 * structure and constants, the tensors it reads, state it leaves behind): a difference fails
 * the call with an error naming the node and the user's line ("model.c:57: the trace of this
 * call differs from the cached one: a constant 0.025 was 0.0125 (em_mul_scalar in step)"),
 * drops the entry, and the next call traces anew. opts.check_every = N (or
 * EMBER_COMPILE_CHECK=N) also checks every Nth call of an entry; < 0 (or 0 in the environment)
 * turns it off. A check costs one trace (no compile when the trace matches).
 *
 * Mutation. In-place writes inside fn (em_add_ and friends, em_copy_ into a view, SGD updates,
 * batch-norm running statistics) are functionalized: they become out-of-place nodes, and after
 * the graph runs an epilogue writes the new values back into the tensors fn wrote (a write into
 * a view is scattered into its base; other live views of it are regenerated); with the inductor
 * backend a kernel writes such a value straight into the tensor when nothing reads the old one
 * afterwards, so an error midway through a call (out of memory) can leave some of those tensors
 * updated, as an eager optimizer step failing midway would. em_backward is
 * traced like any op, and the .grad it sets is rebound on every replay, so a whole training step
 * (forward, em_backward, optimizer step) is one graph. A trace that leaves new tensors in state
 * outside fn (SGD momentum buffers made on the first step) is not cached: the next call traces
 * again. Scalars fn passes to ops are constants of the trace. The optimizers' learning rate and
 * AdamW's step counts are 0-dim tensors (as PyTorch's capturable optimizers keep them), read by
 * the graph as inputs: em_optimizer_set_lr on every step never recompiles. Outputs share storage
 * with each other or with inputs only where eager's would (a value the optimizer merged is
 * copied).
 *
 * Graph breaks. Where fn needs data or does something a graph cannot hold, the graph so far is
 * run, every live proxy becomes a real tensor in place (the pointers fn holds stay valid), the
 * operation runs eagerly, and tracing resumes in a new graph. Breaks happen at: em_item,
 * em_data_ptr, em_to_buffer, em_format / em_print, em_save, data-dependent shapes (em_nonzero,
 * em_masked_select), em_requires_grad_, em_call_opaque, em_graph_break, and in-place writes
 * functionalization cannot express (into a tensor
 * that is part of a larger storage it did not view through fn, or whose storage other inputs
 * share). An entry with breaks re-runs fn on every call; each graph between breaks is looked up
 * by its structure, so each compiles once. With opts.fullgraph a break is an error naming its
 * site.
 *
 * Backends: "eager" runs each captured graph with the graph interpreter on the eager kernels
 * (results are bit-identical to op-by-op eager execution, EMBER_EAGER_FUSION=0; autograd works on
 * the outputs as in eager).
 * "aot_eager" differentiates ahead of time (as AOTAutograd does): when grad mode is on and some
 * input requires grad, the graph's forward and the autograd engine's backward are traced into
 * one joint graph, optimised (CSE, folding, rewrites) and split into a forward and a backward
 * graph; a call runs the forward and gives the differentiable outputs a grad_fn that runs the
 * backward graph, so em_backward works on them. The partitioner decides what the forward saves:
 * "default" saves every value the backward reads; "min_cut" saves the fewest bytes from which
 * the backward can recompute the rest (cheap pointwise and view chains, and random values,
 * replayed from the same Philox counters, so dropout's mask is the forward's). As in PyTorch,
 * aot_eager defaults to "default": without fusion, recomputing costs extra passes over memory
 * (measured: the transformer of bench/aot's backward took twice as long); inductor defaults to
 * "min_cut", whose recomputed values fuse into the backward's kernels. "recompute" saves only
 * the function's inputs and recomputes the rest in the backward (activation checkpointing, as
 * torch.utils.checkpoint): the least memory, a second forward's work, and a backward that reads
 * nothing without autograd history, so double backward (create_graph) through it is exact.
 * Gradients equal eager's up to rounding (the summation order may differ). Differentiating a
 * compiled backward again (double backward) is not supported with the other partitioners, as in
 * torch.compile.
 * "inductor" (the default) is aot_eager whose graphs (forward, backward, or a whole traced
 * training step) run as generated CPU code where no autograd recording is needed: pointwise
 * chains, reductions with their prologues and epilogues (softmax, layer_norm, cross entropy:
 * one kernel each), bias gradients and optimizer updates fused into few LLVM-compiled,
 * vectorized, multithreaded kernels, between the GEMM and convolution library calls; cheap
 * pointwise values a later kernel needs recomputed there instead of stored (as PyTorch's
 * min-cut partitioner does; EMBER_INDUCTOR_REMAT=0 stores them); max-pooling windows as
 * pointwise maxima, reads that do not run along the vector dim as gathers; intermediates in one planned
 * arena; optimizer updates written in place. An f32 GEMM's bias add over its rows and a ReLU or
 * GELU after it (em_linear, em_relu, em_gelu; with or without the bias) run on each tile of the
 * GEMM as the library writes it, with the bits of the kernel it replaces, not as a kernel that
 * reads the product back (EMBER_LOGS=schedule: "GEMM tile epilogue bias+relu";
 * EMBER_INDUCTOR_EPILOGUE=0 turns GEMM epilogues off, on CUDA too). Compiled kernels are
 * cached in memory and on disk (EMBER_CACHE_DIR, default $XDG_CACHE_HOME/ember/kernels or
 * ~/.cache/ember/kernels; EMBER_CACHE=0 turns the disk cache off), so a second process skips
 * LLVM. Results agree with eager within rounding: exp, log, erf and the like within SLEEF's
 * 1 ULP, tanh within its 3.5 ULP (SLEEF's u35 function, 3x cheaper), sums in another order
 * (tests hold them to 1e-5 relative); use "eager" or "aot_eager"
 * for eager's bits. A graph the code generator cannot compile runs op by op instead, with the
 * reason on stderr once (every time under EMBER_LOGS=schedule) and counted in
 * em_compile_stats.inductor_fallbacks. EMBER_INDUCTOR_PROFILE=1 prints where compiled graphs
 * spend their time at exit (=N: with the N slowest kernels). With inputs on CUDA (CPU tensors of
 * one element, possibly broadcast, may join them, as in eager), pointwise chains (f32, f64, and
 * f16 / bf16 rounded after each op as eager rounds them: eager's bits) and trailing
 * sum / amax / amin reductions with their prologues and epilogues (softmax, layer_norm and
 * their backward: one block a row) run as generated CUDA C kernels (NVRTC, cached like the
 * eager CUDA kernels; output_code prints them), and reductions over leading dims, GEMMs and the
 * rest as the eager CUDA kernels and cuBLAS, in the same order. A GEMM (f32, f16, bf16) whose
 * product only feeds an add of a bias over its rows, itself feeding only em_relu or
 * em_gelu(x, true) (or nothing else), as em_linear makes it, runs as one cuBLASLt call with the
 * BIAS, RELU_BIAS or GELU_BIAS epilogue (EMBER_LOGS=schedule: "cublasLt epilogue bias+relu"):
 * the bias and activation applied to the f32 accumulator before its one rounding, and a NaN
 * pre-activation may come out of the ReLU as 0.
 *
 * Logs: EMBER_LOGS is a comma-separated list of graph, guards, recompiles, graph_breaks, aot,
 * schedule (each generated program's steps and loop IR), output_code (its LLVM IR as generated,
 * before optimisation), perf, all (as TORCH_LOGS); each line on stderr starts with
 * "[ember:<artifact>]". EMBER_DUMP_DIR names a directory where each compiled graph is written
 * as <name>_<n>.txt (the IR text) and <name>_<n>.dot (Graphviz).
 *
 * Threads: a compiled function may be called from several threads; its calls are serialized
 * (one lock per compiled function, held through the call), so its entries and caches stay
 * consistent. Run independent compiled functions (em_compile again) to run in parallel.
 */

/* The most outputs a model function returns. */
#define EM_MAX_OUTPUTS 16
/* What a model function returns: n tensors (NULL entries mean an op failed; the error is
 * recorded). Build it with EM_OUTPUTS(loss, logits). */
typedef struct em_outputs {
  int n;
  em_tensor *t[EM_MAX_OUTPUTS];
} em_outputs;
#define EM_OUTPUTS(...) \
  ((em_outputs){(int)(sizeof((em_tensor *[]){__VA_ARGS__}) / sizeof(em_tensor *)), {__VA_ARGS__}})

/* A model function: ctx is the user's (parameters, hyperparameters), inputs are the call's
 * tensors. It returns tensors owned by the current scope, as any op does. */
typedef em_outputs (*em_model_fn)(void *ctx, em_tensor *const *inputs, int n_inputs);

/* Dynamic shapes, as torch.compile's `dynamic` argument. A size that is symbolic in a compiled
 * entry is a run-time value of it: one entry serves every value in its range, where a specialized
 * size makes a new entry (a recompile) for each value. */
typedef enum em_dynamic {
  EM_DYNAMIC_AUTO = 0, /* the first trace specializes; when an entry's guards then fail only
                        * because input sizes changed, the recompile makes exactly those dims
                        * symbolic (automatic dynamic shapes), and dims marked with
                        * em_mark_dynamic are symbolic from the first trace */
  EM_DYNAMIC_ALWAYS,   /* every input dim of size >= 2 that is not marked static is symbolic */
  EM_DYNAMIC_NEVER,    /* every size is a constant of its entry; marks are ignored */
} em_dynamic;

typedef struct em_compile_options {
  const char *backend; /* "inductor" (default; NULL), "aot_eager" or "eager" */
  bool fullgraph;      /* a graph break is an error instead */
  const char *name;    /* used in logs and dumps; NULL: "fn" */
  int recompile_limit; /* entries before falling back to eager; <= 0: 8 (torch's default) */
  const char *partitioner; /* "default", "min_cut" or "recompute" (see below); NULL: min_cut for
                            * inductor, default for aot_eager */
  bool accuracy;       /* the accuracy checker: every compiled graph is also run by the
                        * reference and compared (see "When a compiled result is wrong" below);
                        * EMBER_COMPILE_ACCURACY=1 turns it on for every compiled function */
  int check_every;     /* replay validation (see "Replay validation" below): 0 (default): each
                        * entry's second call is traced again and compared with the entry;
                        * N > 1: that and every Nth call of an entry; < 0: never. The
                        * environment variable EMBER_COMPILE_CHECK=N overrides it (0: never). */
  const char *mode;    /* torch.compile's modes (inductor, graphs on CUDA; NULL: "default"):
                        * "default": heuristic launch configurations;
                        * "reduce-overhead": after a first ordinary call, each compiled CUDA
                        * graph is captured once into a CUDA graph and every later call launches
                        * it (one launch instead of one a kernel). Inputs at the same address on
                        * the first two calls (parameters, optimizer state) are read in place,
                        * the others copied into the graph's own buffers each call; outputs are
                        * copies, never overwritten by a later call. A graph that cannot be
                        * captured (an op that waits for the device) runs without one and says
                        * why on stderr. em_compile_stats.cuda_graph_replays counts launches;
                        * "max-autotune": also times candidate launch configurations of every
                        * generated CUDA kernel, and up to 8 of cuBLASLt's heuristic algorithms
                        * for every GEMM, on its first run, keeps the fastest and caches the
                        * choice on disk (with the kernel cache), then as "reduce-overhead";
                        * "max-autotune-no-cudagraphs": the timing only. On the CPU all modes
                        * run as "default". Errors: an unknown mode. */
  em_dynamic dynamic;  /* dynamic shapes (see "Dynamic shapes" below): EM_DYNAMIC_AUTO
                        * (default, torch.compile's dynamic=None), EM_DYNAMIC_ALWAYS
                        * (dynamic=True: every input dim of size >= 2 symbolic from the first
                        * trace) or EM_DYNAMIC_NEVER (dynamic=False: every size specialized) */
} em_compile_options;

typedef struct em_compiled em_compiled;

/* Wraps fn. opts may be NULL (defaults); it is copied. Returns a handle to free with
 * em_compiled_free, or NULL with an error (unknown backend, out of memory). Nothing is traced
 * until the first call. Matches torch.compile(fn, backend=..., fullgraph=...). */
#define em_compile(...) em_compile_at(__VA_ARGS__, EM_HERE)
em_compiled *em_compile_at(em_model_fn fn, const em_compile_options *opts, em_site site);

/* Calls the compiled function: em_call(c, ctx, x, y) passes inputs {x, y}; em_call_n takes an
 * array (n may be 0). Returns fn's outputs, owned by the current scope, computed as described
 * above; on error the entries are NULL (n as fn returned it, or 0) and the error names the op
 * and the user's line. Called while another compiled function is tracing, fn is inlined into
 * that trace. */
#define em_call(c, ctx, ...) \
  em_call_at((c), (ctx), (em_tensor *const[]){__VA_ARGS__}, \
             (int)(sizeof((em_tensor *[]){__VA_ARGS__}) / sizeof(em_tensor *)), EM_HERE)
#define em_call_n(c, ctx, n, inputs) em_call_at((c), (ctx), (inputs), (n), EM_HERE)
em_outputs em_call_at(em_compiled *c, void *ctx, em_tensor *const *inputs, int n_inputs, em_site site);

/* Counters of a compiled function since em_compile. */
typedef struct em_compile_stats {
  int64_t calls;           /* em_call calls */
  int64_t replays;         /* calls served by an entry without breaks, without calling fn */
  int64_t traces;          /* calls that ran fn under the tracer */
  int64_t entries;         /* cache entries alive */
  int64_t recompiles;      /* traces after the first because guards failed */
  int64_t graphs_compiled; /* graphs handed to the backend */
  int64_t graph_cache_hits;/* graphs between breaks found already compiled */
  int64_t breaks;          /* graph breaks, all calls */
  int64_t eager_calls;     /* calls run eagerly after the recompile limit */
  int64_t aot_graphs;      /* graphs split into forward and backward (backend aot_eager) */
  int64_t aot_saved_bytes; /* bytes the most recent of them saves for its backward per call
                            * (values other than inputs, which are alive anyway) */
  int64_t kernel_runs;     /* generated kernels run inside em_call (backend inductor) */
  int64_t inductor_fallbacks; /* graphs the inductor could not compile inside em_call, run op by
                            * op instead (the reason is logged) */
  int64_t graphs_cached;   /* compiled graphs kept (at most 64: least recently used evicted) */
  int64_t graph_cache_evictions; /* graphs evicted from that cache */
  int64_t checks;          /* calls traced again to validate an entry instead of replaying it */
  int64_t cuda_graph_replays; /* CUDA graph launches inside em_call (mode "reduce-overhead" or
                               * "max-autotune"; AOT backward graphs launch in em_backward) */
  int64_t uncached_traces; /* traces not cached because replaying them would differ from running
                            * fn: fn stored a tensor it made into state outside it (ctx, a
                            * static), or an op failed while tracing (its error must be raised
                            * on every call) */
  int64_t dynamic_entries; /* entries made with symbolic sizes */
  int64_t probe_traces;    /* traces of fn at probe sizes, made to find symbolic formulas */
  int64_t dynamic_misses;  /* dynamic entries dropped because fn, traced at a new size, differed
                            * from the formulas the probes found (the call's results are the
                            * trace's; later entries specialize) */
  int64_t dynamic_op_by_op; /* graphs of a dynamic entry run op by op at a size not yet called
                            * EMBER_DYNAMIC_COMPILE_AFTER times (default 3), not compiled */
  int64_t combo_kernel_runs; /* of kernel_runs, combo kernels: independent pointwise kernels (an
                            * optimizer's per-parameter updates) run as one (EMBER_INDUCTOR_COMBO=0: none) */
} em_compile_stats;
/* The counters of c (all zero for NULL). */
em_compile_stats em_compiled_stats(const em_compiled *c);

/* The process's in-memory cache of generated CPU kernels (backend inductor): one module per
 * compiled graph, kept for graphs compiled again. Bounded: past `limit` modules (the
 * EMBER_KERNEL_CACHE_MODULES environment variable, default 256), the least recently used module
 * no live compiled graph uses is removed, its code freed (a later compile of that graph reloads
 * it from the disk cache). Modules in use are never removed, so `modules` may exceed `limit`
 * while more graphs than that are alive. */
typedef struct em_kernel_cache_stats {
  int64_t modules;   /* modules loaded now */
  int64_t in_use;    /* of them, used by a live compiled graph */
  int64_t limit;     /* most modules kept, unless more are in use */
  int64_t evictions; /* modules removed since the process started */
} em_kernel_cache_stats;
em_kernel_cache_stats em_kernel_cache_info(void);

/* Frees the compiled function, its entries and graphs. NULL-safe. Outputs it returned stay
 * valid, and em_backward through them still works (their backward nodes hold what they need). */
void em_compiled_free(em_compiled *c);

/* Eager fusion (frontend/eager_fusion.c; issue 23). Outside em_compile, the hot composites
 * (em_softmax, em_log_softmax, em_layer_norm, em_rms_norm, em_gelu, em_silu, em_sigmoid,
 * em_relu, em_cross_entropy, em_mse_loss, em_dropout when training, em_max_pool2d, em_avg_pool2d
 * and their _ex forms, em_batch_norm) and em_optimizer_step's per-parameter updates (SGD after its first
 * step with momentum, AdamW; the writes into the parameter and the state happen in place, as
 * em_compile's functionalization writes them back)
 * run as kernels the inductor compiles from their own decomposition, instead of one pass over
 * memory per prim: each stays one definition for eager, tracing and autograd. A call is fused
 * when fusion is on, no trace is active (inside em_compile the composite records its prims as
 * before), its inputs are contiguous CPU tensors with every dim <= 65536, the first has at least
 * EMBER_EAGER_FUSION_MIN elements (default 4096), and its signature (composite, non-tensor
 * arguments, input dtypes and ranks, absent inputs, requires_grad of each, grad mode) has been
 * called twice before: the first two calls of a signature run op by op, and the third starts
 * its compile on a background thread (on inputs of the same shapes), calls running op by op until it
 * is done, so no call waits for LLVM; the process's exit (return from main, exit() from a thread
 * that made a fusable call) waits for compiles still running. EMBER_EAGER_FUSION_ASYNC=0
 * compiles on the calling thread instead, in the third call, which runs the kernel. Then one compiled
 * function per signature (em_compile with EM_DYNAMIC_ALWAYS, so one kernel module serves every
 * size) takes over, with its tiering at a size it has not seen: that size's first
 * EMBER_DYNAMIC_COMPILE_AFTER - 1 calls run the graph op by op, then it is specialized on the
 * calling thread (the kernel module is shared: no LLVM). Kernels are cached in memory and on disk.
 * Arguments are checked before fusion, so errors are the
 * composite's own. Gradients come from one autograd node whose backward is the compiled
 * backward, partitioned by "recompute" (only the composite's inputs saved, the rest recomputed
 * in the backward's kernels), so double backward through a fused composite is exact, as op by
 * op (under create_graph the backward graph runs recorded). Results agree with op by op within
 * the inductor's rounding (1e-5 relative in f32, 1e-12 in f64; see "inductor" above). Fused
 * dropout draws the op-by-op mask bit for bit and moves the generator as op by op does (its
 * backward replays the forward's Philox counters; it compiles on the calling thread, as a
 * background compile's calls would draw from the generator). Training batch_norm writes running_mean and
 * running_var back in place once per call (the batch statistics within the rounding above); it
 * runs op by op when they share storage with another input or require grad. A fused
 * call that fails inside the compiler runs op by op, then and from then on for its signature,
 * with a line under EMBER_LOGS=fusion. EMBER_EAGER_FUSION=0 turns it off (op by op, as before);
 * CUDA tensors always run op by op. */
typedef struct em_eager_fusion_stats {
  bool enabled;            /* fusion on (em_eager_fusion_config, else EMBER_EAGER_FUSION) */
  int64_t min_numel;       /* the smallest first input fused */
  int64_t functions;       /* signatures seen, one compiled function each */
  int64_t warmup_calls;    /* calls run op by op because their signature was new */
  int64_t fused_calls;     /* calls run through a compiled function */
  int64_t op_by_op_graphs; /* of them, graphs run op by op at a size's first calls */
  int64_t kernel_runs;     /* generated kernels those calls ran */
  int64_t traces;          /* traces of composites made for them (probes included) */
  int64_t graphs_compiled; /* graphs the compiled functions handed to the inductor */
  int64_t fallbacks;       /* fused calls that failed and ran op by op (signature dropped) */
} em_eager_fusion_stats;
/* The process's counters (all threads). */
em_eager_fusion_stats em_eager_fusion_info(void);
/* Waits for the background compiles running now (tests, benchmarks, before reading the live
 * tensor counters: a compile holds inputs shaped as those of the call that started it). The
 * process's exit waits for them by itself. */
void em_eager_fusion_wait(void);
/* Overrides the environment: enabled 1 on, 0 off (op by op), -1 EMBER_EAGER_FUSION again;
 * min_numel the smallest first input fused, -1 EMBER_EAGER_FUSION_MIN (or 4096) again.
 * For tests and benchmarks; takes effect at the next composite call. */
void em_eager_fusion_config(int enabled, int64_t min_numel);

/* One graph break as em_explain reports it: the op that broke, why, and the user's site. */
typedef struct em_graph_break_info {
  const char *op, *reason; /* static strings */
  const char *file, *func; /* the user's source, as EM_HERE recorded it */
  int line;
} em_graph_break_info;

/* What compiling fn for these inputs gives (torch._dynamo.explain): the number of graphs, the
 * prims in each, each break with its reason and site, and the guards the entry would carry. */
typedef struct em_explanation {
  int n_graphs;
  int *ops_per_graph;          /* [n_graphs] */
  int n_breaks;
  em_graph_break_info *breaks; /* [n_breaks] */
  int n_guards;
  char **guards;               /* [n_guards] one readable line each */
  char *text;                  /* all of the above, as printed */
} em_explanation;

/* Runs fn once under the tracer with the "eager" backend (so fn's side effects happen once),
 * prints the explanation to stderr and returns it; free it with em_explanation_free. NULL with
 * an error when fn fails. */
#define em_explain(fn, ctx, ...) \
  em_explain_at((fn), (ctx), (em_tensor *const[]){__VA_ARGS__}, \
                (int)(sizeof((em_tensor *[]){__VA_ARGS__}) / sizeof(em_tensor *)), EM_HERE)
em_explanation *em_explain_at(em_model_fn fn, void *ctx, em_tensor *const *inputs, int n_inputs, em_site site);
/* Frees an explanation and everything it points to. NULL-safe. */
void em_explanation_free(em_explanation *e);

/* An explicit graph break (torch._dynamo.graph_break). Does nothing outside a trace. */
#define em_graph_break() em_graph_break_at(EM_HERE)
void em_graph_break_at(em_site site);

/* Dynamic shapes (frontend/dynamic.c). A symbolic dimension of an input gets a symbol s0, s1,
 * ...; dims of equal size share one (duck sizing, as in PyTorch), so x [B, 784] and labels [B]
 * give one s0. Sizes 0 and 1 always specialize. The entry's guards become relations: each
 * symbolic dim equals its symbol, each symbol lies in its range (2..65536 unless marked
 * otherwise), dims that shared a symbol stay equal; EMBER_LOGS=guards and em_explain print them.
 *
 * How a C function's sizes become symbolic. C has no operator overloading, so an integer the
 * function computes from em_size (B * T for a reshape, T for a slice or an arange) cannot carry
 * its formula the way PyTorch's SymInt does. Ember recovers the formulas instead: after the real
 * trace it traces fn again, without data, at probe sizes (each symbol moved by a different
 * prime, alone and together), and solves for every size and every size-like attribute of the
 * graph (shapes, slice bounds, pads, integral scalars such as a mean's divisor) as a polynomial
 * in the symbols, linear in each (s0*s1*64 + s1 - 1). The formulas are then checked against
 * three more traces at unrelated sizes (2-4, about 90 and about 65500), so a size-dependent
 * branch in fn, a divisibility (T/2), or anything nonlinear (T*T) shows up as a mismatch and the
 * entry stays specialized, with the reason logged (EMBER_LOGS=dynamic) naming the user's line.
 * What it costs: 2^k + 2 extra traces of fn (k symbols, at most 3) at the recompile that makes
 * an entry dynamic, and fn's host side effects happen in each (as in any trace; a replay runs
 * none). Not made dynamic: functions with graph breaks, random ops, constants created from host
 * data inside fn, or non-contiguous inputs in a symbolic dim. Every call of a dynamic entry
 * binds the symbols from its inputs and specializes the graph to them; a size's first calls run
 * it op by op on the eager kernels, and the EMBER_DYNAMIC_COMPILE_AFTER-th call (default 3)
 * compiles it, into CPU kernels that read their sizes from a table at run time, so every size
 * whose schedule has the same shape shares one kernel module (no LLVM compile after the first).
 * em_compile_stats.dynamic_entries counts entries with symbols, .dynamic_op_by_op the graphs run
 * op by op. */

/* Marks dim of x symbolic for the next trace that receives x as an input
 * (torch._dynamo.mark_dynamic), with the range [min, max] its size may take in that entry (a
 * size outside it recompiles); em_mark_dynamic uses 2..65536. The mark lives on this tensor
 * (not its views). Errors: dim out of range for x, min < 2, max < min, a dim also marked
 * static. */
#define em_mark_dynamic(x, dim) em_mark_dynamic_at((x), (dim), 2, 65536, EM_HERE)
#define em_mark_dynamic_range(x, dim, min, max) em_mark_dynamic_at((x), (dim), (min), (max), EM_HERE)
void em_mark_dynamic_at(em_tensor *x, int dim, int64_t min, int64_t max, em_site site);
/* Marks dim of x as always specialized (torch._dynamo.mark_static), even under
 * EM_DYNAMIC_ALWAYS or after a size change. Errors: dim out of range, a dim marked dynamic. */
#define em_mark_static(x, dim) em_mark_static_at((x), (dim), EM_HERE)
void em_mark_static_at(em_tensor *x, int dim, em_site site);

/* When a compiled result is wrong (frontend/repro.c). EMBER_COMPILE_ACCURACY=1 (or
 * em_compile_options.accuracy) runs every compiled graph also on the reference (the graph as
 * traced, interpreted on the eager kernels) and compares: bit for bit on backend eager, else
 * within 1e-5 of each element plus 1e-5 of the output's largest magnitude plus 1e-6 (f32;
 * 1e-12, 1e-13 in f64). A difference fails the call with an error naming the graph, the output
 * and element, and (inductor) the first node whose value differs, its IR and the user's line:
 *   model.c:9: em_call: accuracy check failed in graph fn_0: output 0 element 2 is 1, the
 *   reference (the traced graph on the eager kernels) gives 5; the first node whose value
 *   differs: %3 : f32[4] = add(%1, %2), made at model.c:31 in forward (em_add)
 * It costs one reference run per call. EMBER_REPRO_DIR=dir writes dir/<fn>_<pid>_<n>/ on an
 * accuracy failure, a graph the inductor cannot compile, or a crash while a compiled graph runs
 * for the first time (prepared before that run; later runs are not covered): graph.ir (the
 * traced graph, for ir_parse), in<i>.npy (its inputs), options.txt (backend, partitioner, remat,
 * CPU, the failure) and repro.c, which calls em_debug_check_repro. build/ember_minify <dir>
 * shrinks such a directory by delta debugging into <dir>/minified.
 *
 * em_debug_check_repro replays a repro directory: the graph through the backend it names and
 * through the reference. Returns 0 when they agree, 1 when they differ or the backend fails, -1
 * when the directory cannot be read or the reference fails; report (cap bytes) says which. */
int em_debug_check_repro(const char *dir, char *report, size_t cap);

/* Declares that fn's trace depends on the size bytes at ptr (host state: a `training` flag, a
 * float field of ctx, a global): called inside fn, each cache entry then checks those bytes on
 * every call and recompiles when they changed, logged under EMBER_LOGS=recompiles as
 * "guard failed: model.c:31 cfg->training changed (1 -> 0)" (torch.compile guards on such
 * Python values by itself; C gives no way to see what fn reads, so fn says it). Does nothing
 * outside a trace. ptr must stay valid while the compiled function is used (as ctx must).
 * size: 1 to 64 bytes. Errors (recorded, the trace is not cached): NULL ptr, size out of range. */
#define em_guard_value(ptr, size) em_guard_value_at((ptr), (size), #ptr, EM_HERE)
void em_guard_value_at(const void *ptr, size_t size, const char *what, em_site site);

/* Calls a user function that the tracer must not look into (its own C loops over data, a call
 * into another library): a graph break, then fn(ctx, inputs, n) eagerly on real tensors.
 * Returns fn's outputs (owned by the current scope). Outside a trace it just calls fn. */
typedef em_outputs (*em_opaque_fn)(void *ctx, em_tensor *const *inputs, int n_inputs);
#define em_call_opaque(fn, ctx, ...) \
  em_call_opaque_at((fn), (ctx), (em_tensor *const[]){__VA_ARGS__}, \
                    (int)(sizeof((em_tensor *[]){__VA_ARGS__}) / sizeof(em_tensor *)), EM_HERE)
em_outputs em_call_opaque_at(em_opaque_fn fn, void *ctx, em_tensor *const *inputs, int n_inputs, em_site site);

/* Indices of the nonzero elements of x (any dtype, any shape [...] with d dims): i64 [n, d], in
 * row-major order. The shape depends on the data, so this is a graph break under em_compile.
 * torch.nonzero. Errors: NULL x, 0-dim x is treated as [1]. */
#define em_nonzero(x) em_nonzero_at((x), EM_HERE)
em_tensor *em_nonzero_at(em_tensor *x, em_site site);
/* The elements of x where mask (bool, broadcast with x) is true, as a 1-D tensor in row-major
 * order; differentiable in x (an index_select of the flattened x). A graph break under
 * em_compile (data-dependent shape). torch.masked_select. Errors: mask not bool, shapes that
 * do not broadcast. */
#define em_masked_select(x, mask) em_masked_select_at((x), (mask), EM_HERE)
em_tensor *em_masked_select_at(em_tensor *x, em_tensor *mask, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* Reading values and printing                                                                 */

/* The single value of a 1-element tensor, as a double. Errors (returns NaN): NULL input, numel
 * != 1. Matches Tensor.item. */
#define em_item(x) em_item_at((x), EM_HERE)
double em_item_at(em_tensor *x, em_site site);

/* Copies x's elements in row-major order, converted to dtype dt, into dst, which holds at least
 * dst_bytes bytes. Returns false (and records an error) if dst is too small. Works for any
 * strides. */
#define em_to_buffer(x, dt, dst, bytes) em_to_buffer_at((x), (dt), (dst), (bytes), EM_HERE)
bool em_to_buffer_at(em_tensor *x, em_dtype dt, void *dst, size_t dst_bytes, em_site site);

/* The tensor as PyTorch prints it, e.g. "tensor([[1., 2.],\n        [3., 4.]])", followed by
 * ", dtype=f64" when the dtype is not f32 (i64 for integer tensors, as PyTorch), with more than
 * 1000 elements summarised to 3 edge items per dimension ("..."). Returns a string the caller
 * frees with free(), or NULL (error recorded) for NULL input or allocation failure. */
#define em_format(x) em_format_at((x), EM_HERE)
char *em_format_at(em_tensor *x, em_site site);
/* Prints em_format(x) and a newline to stdout. */
#define em_print(x) em_print_at((x), EM_HERE)
void em_print_at(em_tensor *x, em_site site);

/* ------------------------------------------------------------------------------------------ */
/* CUDA devices                                                                                */
/* ------------------------------------------------------------------------------------------ */
/* The CUDA driver (libcuda.so.1) is loaded at run time, so every Ember build runs on machines
 * without a GPU or driver; there these report no device. Matches torch.cuda.is_available,
 * torch.cuda.device_count, torch.cuda.get_device_properties, torch.cuda.memory_stats.
 * One device is used: cuda:0 (its primary context, shared with cuBLAS). Eager kernels are CUDA
 * C generated per (prim, dtypes, layout kind: contiguous, one-element broadcast, strided),
 * compiled by NVRTC for the device's architecture at first use and cached in memory and on disk
 * (EMBER_CACHE_DIR/cuda, else ~/.cache/ember/kernels/cuda; EMBER_CACHE=0 turns it off).
 * EMBER_CUDA_EMULATE=1 (read at the first call here) makes cuda:0 a host emulator instead: host
 * memory, the same kernels built by the host C++ compiler ($CXX, else c++); it exists to test
 * the device runtime without a GPU and is slow. */

/* Whether the driver loads, initialises and reports at least one device. The first call loads
 * the driver (later calls are free); never fails, never records an error. */
bool em_cuda_is_available(void);
/* Devices the driver reports; 0 without a driver. */
int em_cuda_device_count(void);

typedef struct em_cuda_device_properties {
  char name[256];          /* "NVIDIA H100 80GB HBM3" */
  int major, minor;        /* compute capability: 9.0 is sm_90 (H100, H200) */
  int multiprocessors;     /* SM count */
  int64_t total_memory;    /* bytes */
  int64_t l2_cache_bytes;
  int clock_khz, memory_clock_khz, memory_bus_bits;
} em_cuda_device_properties;

/* Fills *p for device index dev in [0, em_cuda_device_count()). Returns false and records an
 * error naming the index and the count (or why the driver is missing) otherwise. */
#define em_cuda_get_device_properties(dev, p) em_cuda_get_device_properties_at((dev), (p), EM_HERE)
bool em_cuda_get_device_properties_at(int dev, em_cuda_device_properties *p, em_site site);

/* The caching allocator's counters for device 0 (all zero without a device). Bytes are device
 * bytes; allocated counts blocks as handed out (requests rounded up to 512 bytes), reserved
 * what was obtained from the driver (cuMemAlloc), in use or cached. */
typedef struct em_cuda_memory_stats {
  int64_t allocated_bytes;      /* held by live tensors, rounded block sizes */
  int64_t requested_bytes;      /* what those tensors asked for */
  int64_t reserved_bytes;       /* segments from the driver, in use or cached */
  int64_t peak_allocated_bytes, peak_reserved_bytes;
  int64_t allocations;          /* successful requests since start */
  int64_t device_allocs;        /* cuMemAlloc calls (cudaMalloc in PyTorch's counters) */
  int64_t device_frees;         /* cuMemFree calls */
  int64_t segments;             /* segments held now */
  int64_t oom_retries;          /* requests retried after the cache was emptied on out-of-memory */
} em_cuda_memory_stats;
/* The counters now, by value (torch.cuda.memory_stats); all zero without a device. Never fails. */
em_cuda_memory_stats em_cuda_memory_stats_get(void);
/* Restarts the two peaks from the current allocated and reserved bytes (torch.cuda.
 * reset_peak_memory_stats), to measure a phase such as one epoch. No-op without a device. */
void em_cuda_reset_peak_memory_stats(void);
/* Gives every cached device segment with no live tensor back to the driver (torch.cuda.
 * empty_cache). Tensors are untouched. */
void em_cuda_empty_cache(void);

/* A copy of x on dev, contiguous, with x's dtype and shape; x itself (a new scope reference)
 * when it is there already (torch.Tensor.to(device)). Differentiable: the gradient is copied
 * back to x's device. To the CPU it waits for x's value; to CUDA it is queued on the current
 * stream from a pinned staging buffer (the host memory is free to reuse on return). Inside a
 * function being compiled it is a graph break. Errors: no CUDA device (the message says why),
 * device out of memory. Owned by the current scope. */
#define em_to(x, dev) em_to_at((x), (dev), EM_HERE)
em_tensor *em_to_at(em_tensor *x, em_device dev, em_site site);

/* Sets the device the factories (em_zeros, em_full, em_scalar, em_arange, em_eye, em_rand,
 * em_randn, em_randint, em_empty, em_from_data, em_load_npy, em_fashion_mnist_load,
 * em_batch_iter_next, and the layers' parameters) create on, for the calling thread; returns the
 * previous one. Default EM_CPU (torch.set_default_device). Creating on EM_CUDA without a
 * device is an error at the factory. */
em_device em_set_default_device(em_device dev);

/* Streams (torch.cuda.Stream): queues of device work. Each thread has a current stream, the
 * default stream unless set. Ops queue on the current stream; work on different streams may
 * run concurrently. A tensor's memory is reused only by work on the stream that allocated it,
 * so a tensor made on one stream and used on another must be ordered by the caller (an event,
 * em_cuda_stream_wait_event), as with PyTorch's record_stream. */
typedef struct em_cuda_stream em_cuda_stream;
/* A new non-blocking stream, owned by the caller (em_cuda_stream_free). NULL with an error
 * when there is no device. */
#define em_cuda_stream_new() em_cuda_stream_new_at(EM_HERE)
em_cuda_stream *em_cuda_stream_new_at(em_site site);
/* Waits for s's work, then destroys it (the thread's current stream reverts to the default
 * when it was s). NULL-safe. */
void em_cuda_stream_free(em_cuda_stream *s);
/* Makes s (NULL: the default stream) the calling thread's current stream. */
void em_cuda_set_stream(em_cuda_stream *s);
/* Waits until all work queued on the device, on every stream, is done (torch.cuda.
 * synchronize). Errors (false): no device, or a fault in earlier asynchronous work. */
#define em_cuda_synchronize() em_cuda_synchronize_at(EM_HERE)
bool em_cuda_synchronize_at(em_site site);

/* Events (torch.cuda.Event with timing): a marker recorded on the current stream when made. */
typedef struct em_cuda_event em_cuda_event;
/* Records a new event on the current stream; caller-owned (em_cuda_event_free). */
#define em_cuda_event_record() em_cuda_event_record_at(EM_HERE)
em_cuda_event *em_cuda_event_record_at(em_site site);
/* Waits on the host until the work before e is done. */
#define em_cuda_event_synchronize(e) em_cuda_event_synchronize_at((e), EM_HERE)
bool em_cuda_event_synchronize_at(em_cuda_event *e, em_site site);
/* Makes later work on s (NULL: the default stream) wait for e, without blocking the host. */
#define em_cuda_stream_wait_event(s, e) em_cuda_stream_wait_event_at((s), (e), EM_HERE)
bool em_cuda_stream_wait_event_at(em_cuda_stream *s, em_cuda_event *e, em_site site);
/* Milliseconds of device time between start and end (waits for end); -1 with an error. */
#define em_cuda_event_elapsed_ms(start, end) em_cuda_event_elapsed_ms_at((start), (end), EM_HERE)
double em_cuda_event_elapsed_ms_at(em_cuda_event *start, em_cuda_event *end, em_site site);
/* Destroys e (work it marks is unaffected). NULL-safe. */
void em_cuda_event_free(em_cuda_event *e);

/* Whether f32 GEMMs on CUDA (matmul, convolutions) may use TF32 tensor cores (10-bit mantissa
 * products, f32 accumulation). Off by default, as torch.backends.cuda.matmul.allow_tf32. */
void em_cuda_set_allow_tf32(bool allow);
bool em_cuda_allow_tf32(void);

/* Whether convolutions on CUDA go through cuDNN when it loads (on by default), as
 * torch.backends.cudnn.enabled; off, or when cuDNN is missing or refuses a problem, they run as
 * im2col + cuBLAS GEMMs (EMBER_LOGS=perf says why). */
void em_cuda_set_cudnn_enabled(bool enabled);
bool em_cuda_cudnn_enabled(void);

/* ---- CPU instruction set (issues 20 and 23) ----
 *
 * The widest x86 vector ISA Ember's CPU code uses in this process: "avx512", "avx2", "baseline"
 * (a host without AVX2), or "native" off x86. The environment variable EMBER_CPU_ISA, read once
 * (at the first call here, or the first compilation or oneDNN call), sets a ceiling:
 *   native (default) or avx512: what the host has (AVX-512 on Zen 4 and 5);
 *   avx2: no AVX-512 even where the host has it, as on Zen 3: the LLVM code generator runs with
 *         every AVX-512 feature off, tuned for znver3 (x86-64-v3 on other vendors), 8-lane f32
 *         vectors and SLEEF's AVX2 functions, its kernels cached apart from the native ones;
 *         oneDNN (f32 GEMM, convolutions) is held by dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2).
 * EMBER_NO_AVX512 (any value) is an older alias for EMBER_CPU_ISA=avx2. The eager C kernels are
 * compiled ahead of time: for AVX2-only code there too, configure a build with -Dcpu_isa=avx2
 * (x86-64-v3, tuned for znver3), which also makes avx2 this variable's default. OpenBLAS (f64
 * GEMM) picks its kernels when loaded: OPENBLAS_CORETYPE=Haswell holds it. An unknown value is
 * reported on stderr once and taken as native. Never fails. */
const char *em_cpu_isa(void);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_H */
