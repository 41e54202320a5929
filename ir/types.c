/* ir/types.c: dtype properties, promotion and shape arithmetic shared by every layer.
 *
 * The dtype table is the one place that says how wide a dtype is and how it promotes, so the
 * meta functions, the kernels and the printer cannot disagree. */
#include "ir.h"

#include <math.h>

#include <stdio.h>
#include <string.h>

#define DTYPES(X)                        \
  X(EM_F32, "f32", 4, IR_CAT_FLOAT, 1, true) \
  X(EM_F64, "f64", 8, IR_CAT_FLOAT, 2, true) \
  X(EM_I32, "i32", 4, IR_CAT_INT, 2, true)   \
  X(EM_I64, "i64", 8, IR_CAT_INT, 3, true)   \
  X(EM_BOOL, "bool", 1, IR_CAT_BOOL, 0, true) \
  X(EM_U8, "u8", 1, IR_CAT_INT, 1, true)     \
  X(EM_F16, "f16", 2, IR_CAT_FLOAT, 0, false) \
  X(EM_BF16, "bf16", 2, IR_CAT_FLOAT, 0, false)

static const ir_dtype_info dtype_table[EM_DTYPE_COUNT] = {
#define X(e, n, s, c, r, cpu) [e] = {n, s, c, r, cpu},
    DTYPES(X)
#undef X
};

bool ir_dtype_valid(em_dtype dt) { return (unsigned)dt < EM_DTYPE_COUNT; }

const ir_dtype_info *ir_dtype(em_dtype dt) { return &dtype_table[dt]; }

const char *em_dtype_name(em_dtype dt) { return ir_dtype_valid(dt) ? dtype_table[dt].name : "?"; }

size_t em_dtype_size(em_dtype dt) { return ir_dtype_valid(dt) ? dtype_table[dt].size : 0; }

em_dtype ir_promote(em_dtype a, em_dtype b) {
  if (a == b) return a;
  const ir_dtype_info *x = &dtype_table[a], *y = &dtype_table[b];
  if (x->cat != y->cat) return x->cat > y->cat ? a : b;
  /* f16 with bf16 promotes to f32, as in torch. */
  if ((a == EM_F16 && b == EM_BF16) || (a == EM_BF16 && b == EM_F16)) return EM_F32;
  return x->rank >= y->rank ? a : b;
}

em_dtype ir_promote_scalar(em_dtype t, bool is_float) {
  ir_category sc = is_float ? IR_CAT_FLOAT : IR_CAT_INT;
  if (dtype_table[t].cat >= sc) return t;
  return is_float ? EM_F32 : EM_I64;
}

int64_t ir_numel(int ndim, const int64_t *sizes) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (sizes[i] == 0) return 0;
  }
  for (int i = 0; i < ndim; i++) {
    if (sizes[i] > 0 && n > INT64_MAX / sizes[i]) return INT64_MAX;
    n *= sizes[i];
  }
  return n;
}

bool ir_value_fits(em_dtype dt, double v) {
  switch (dt) {
  case EM_BOOL: return true;
  case EM_U8: return v >= -128.0 && v <= 255.0;
  case EM_I32: return v >= -2147483648.0 && v <= 2147483647.0;
  case EM_I64: return v >= -9223372036854775808.0 && v < 9223372036854775808.0;
  case EM_F32: return isnan(v) || isinf(v) || fabs(v) <= 3.4028234663852886e38;
  case EM_F16: return isnan(v) || isinf(v) || fabs(v) <= 65504.0;
  case EM_BF16: return isnan(v) || isinf(v) || fabs(v) <= 3.3895313892515355e38;
  default: return true;
  }
}

bool ir_shape_fits(int ndim, const int64_t *sizes) {
  int64_t extent = 1;
  for (int i = 0; i < ndim; i++)
    if (sizes[i] < 0 || !ir_mul_ok(extent, sizes[i] > 1 ? sizes[i] : 1, &extent)) return false;
  return true;
}

bool ir_nbytes(em_dtype dt, int ndim, const int64_t *sizes, size_t reserve, size_t *bytes) {
  if (!ir_shape_fits(ndim, sizes)) return false;
  int64_t n = ir_numel(ndim, sizes);
  size_t esize = ir_dtype(dt)->size;
  if (reserve > SIZE_MAX || (uint64_t)n > (SIZE_MAX - reserve) / esize) return false;
  *bytes = (size_t)n * esize;
  return true;
}

/* Saturates rather than overflows for a shape that failed ir_shape_fits (a defensive branch:
 * such shapes are refused before strides are asked for). */
void ir_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = s;
    if (!ir_mul_ok(s, sizes[i] > 1 ? sizes[i] : 1, &s)) s = INT64_MAX;
  }
}

bool ir_is_contiguous(int ndim, const int64_t *sizes, const int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    if (sizes[i] == 0) return true;
    if (sizes[i] == 1) continue;
    if (strides[i] != s) return false;
    s *= sizes[i];
  }
  return true;
}

bool ir_broadcast(const ir_shape *a, const ir_shape *b, ir_shape *out) {
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  ir_shape r = {.ndim = n};
  for (int i = 0; i < n; i++) {
    int ia = a->ndim - n + i, ib = b->ndim - n + i;
    int64_t sa = ia >= 0 ? a->sizes[ia] : 1, sb = ib >= 0 ? b->sizes[ib] : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    r.sizes[i] = sa == 1 ? sb : sa;
  }
  *out = r;
  return true;
}

int ir_norm_axis(int64_t axis, int ndim) {
  if (axis < 0) axis += ndim;
  return axis >= 0 && axis < ndim ? (int)axis : -1;
}

char *ir_fmt_type(char *buf, size_t cap, em_dtype dt, int ndim, const int64_t *sizes) {
  size_t n = (size_t)snprintf(buf, cap, "%s[", em_dtype_name(dt));
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)sizes[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}
