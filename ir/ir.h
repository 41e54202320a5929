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

/* Product of sizes (1 for ndim 0). Saturates at INT64_MAX on overflow. */
int64_t ir_numel(int ndim, const int64_t *sizes);
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
