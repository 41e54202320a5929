/* ir/ir.h: the private header of the ir/ layer.
 *
 * ir/ is pure data: no tensors, no execution. This first part holds the types every layer above
 * shares: dtype properties (one X-macro table), shapes and their arithmetic (numel, contiguous
 * strides, broadcasting), type promotion, and the "f32[3,4]" form used in every error message.
 * The graph of values and nodes (graph.h) builds on these. */
#ifndef EMBER_IR_H
#define EMBER_IR_H

#include "ember.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- ir/types.c ---------------------------------------------------------------------------- */

/* Promotion categories, ordered: a higher category wins in torch.result_type. */
typedef enum { IR_CAT_BOOL, IR_CAT_INT, IR_CAT_FLOAT } ir_category;

typedef struct ir_dtype_info {
  const char *name;   /* "f32", ... as printed in shapes and IR */
  size_t size;        /* bytes per element */
  ir_category cat;    /* promotion category */
  int rank;           /* order within the category (wider is higher) */
  bool cpu_compute;   /* CPU kernels exist (f16/bf16 are storage-only on the CPU) */
} ir_dtype_info;

/* Properties of a dtype; dt must be valid (see ir_dtype_valid). */
const ir_dtype_info *ir_dtype(em_dtype dt);
bool ir_dtype_valid(em_dtype dt);
static inline bool ir_is_float(em_dtype dt) { return ir_dtype(dt)->cat == IR_CAT_FLOAT; }
static inline bool ir_is_int(em_dtype dt) { return ir_dtype(dt)->cat == IR_CAT_INT; }

/* torch.result_type of two tensor dtypes. */
em_dtype ir_promote(em_dtype a, em_dtype b);
/* Result of combining a tensor of dtype t with a Python-style scalar (double if is_float, else
 * an integer): the tensor's dtype unless the scalar's category is higher, then f32 or i64. */
em_dtype ir_promote_scalar(em_dtype t, bool is_float);

/* A concrete shape. Symbolic sizes come with the graph IR. */
typedef struct ir_shape {
  int ndim;
  int64_t sizes[EM_MAX_DIMS];
} ir_shape;

/* ---- checked shape arithmetic (issue 17) ----
 * Every size, stride, element count and byte count computed from a caller's numbers goes
 * through these, so none overflows (signed overflow is undefined behaviour; a wrapped size wrote
 * out of bounds, a saturated count summed to 0). Each returns false where the exact result does
 * not fit; the caller reports an error naming its op. Tensors that exist have shapes that passed
 * ir_shape_fits, so arithmetic on their own sizes and strides within their extent is safe. */
static inline bool ir_add_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool ir_sub_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_sub_overflow(a, b, r); }
static inline bool ir_mul_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }
/* Whether a shape can exist: sizes >= 0 and the product of its sizes, counting 0 as 1 (the
 * extent contiguous strides reach, which bounds every element offset), fits in int64. */
bool ir_shape_fits(int ndim, const int64_t *sizes);
/* The bytes of a dense dt tensor of this shape (false when they do not fit in size_t less
 * `reserve` bytes for headers). */
bool ir_nbytes(em_dtype dt, int ndim, const int64_t *sizes, size_t reserve, size_t *bytes);
/* Product of sizes (1 for ndim 0). Saturates at INT64_MAX on overflow (which ir_shape_fits
 * rules out for every tensor that exists). */
int64_t ir_numel(int ndim, const int64_t *sizes);
/* Whether the number v can be stored in dt without overflow, as PyTorch's checked conversion of
 * a fill value (torch.full, Tensor.fill_): integers take finite values in their range (u8 also
 * takes -128..-1, wrapping as in torch.tensor(-1, dtype=torch.uint8)), floats any value that is
 * NaN, infinite or within the type's finite range; bool anything. */
bool ir_value_fits(em_dtype dt, double v);
/* Row-major strides (elements) for sizes into strides. */
void ir_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides);
/* Whether (sizes, strides) is row-major contiguous (size-1 dims' strides do not matter). */
bool ir_is_contiguous(int ndim, const int64_t *sizes, const int64_t *strides);
/* Broadcast a and b into out (NumPy rules). Returns false if they do not broadcast. */
bool ir_broadcast(const ir_shape *a, const ir_shape *b, ir_shape *out);
/* Normalises axis (negative counts from the end) against ndim; -1 when out of range. */
int ir_norm_axis(int64_t axis, int ndim);

/* Writes "f32[3,4]" into buf (always NUL-terminated, truncated to cap). Returns buf. */
char *ir_fmt_type(char *buf, size_t cap, em_dtype dt, int ndim, const int64_t *sizes);

#endif /* EMBER_IR_H */
