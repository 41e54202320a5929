/* runtime/autocast.c: mixed precision as torch.autocast does it (em_autocast_begin / _end).
 *
 * Inside a region, the ops of torch's lower-precision list that Ember has (matmul, linear,
 * conv2d) cast their f32 (and other half-type) operands to the region's dtype, f16 or bf16, and
 * return that dtype: the GEMMs then run on tensor cores with f32 accumulation (cuBLAS's
 * CUBLAS_COMPUTE_32F). The ops of its f32 list that Ember has (softmax, log_softmax, layer_norm,
 * cross_entropy, sum, prod) cast f16 / bf16 operands to f32 and return f32. f64 and integer
 * operands are left as they are (torch casts only "eligible" floating types). The casts are
 * ordinary em_cast calls, so autograd differentiates through them (an f32 parameter gets an f32
 * gradient) and the tracer records them into compiled graphs; em_compile guards on the region's
 * dtype. The autograd engine runs its vector-Jacobian rules outside autocast (they compute in the
 * dtypes the forward chose), as torch's backward does.
 *
 * Ember's CPU kernels compute in f32, f64 and the integer types: a lower-precision op under
 * autocast on CPU tensors fails with an error saying so (the f32 list works there).
 *
 * Thread-local state: the stack of open regions and the engine's suspension count. */
#include "rt.h"

enum { MAX_DEPTH = 16 };
static _Thread_local struct {
  em_dtype stack[MAX_DEPTH];
  int depth, suspended;
} ac;

bool em_autocast_begin_at(em_dtype dt, em_site site) {
  if (dt != EM_F16 && dt != EM_BF16)
    return rt_error(site, "em_autocast_begin", "autocasts to f16 or bf16, got %s",
                    ir_dtype_valid(dt) ? em_dtype_name(dt) : "an invalid dtype"), false;
  if (ac.depth == MAX_DEPTH)
    return rt_error(site, "em_autocast_begin", "regions nest at most %d deep", MAX_DEPTH), false;
  ac.stack[ac.depth++] = dt;
  return true;
}

void em_autocast_end(void) {
  if (ac.depth) ac.depth--;
}

bool em_is_autocast_enabled(void) { return ac.depth > 0 && !ac.suspended; }
em_dtype em_get_autocast_dtype(void) { return em_is_autocast_enabled() ? ac.stack[ac.depth - 1] : EM_F32; }

void rt_autocast_suspend(void) { ac.suspended++; }
void rt_autocast_resume(void) { ac.suspended--; }

static bool half(em_dtype dt) { return dt == EM_F16 || dt == EM_BF16; }

em_tensor *rt_autocast_low(em_tensor *x, const char *op, em_site site) {
  if (!x || x == EM_NONE || !em_is_autocast_enabled()) return x;
  em_dtype dt = ac.stack[ac.depth - 1];
  if (x->dtype == dt || (x->dtype != EM_F32 && !half(x->dtype))) return x;
  if (em_device_of(x) == EM_CPU && !ir_dtype(dt)->cpu_compute) {
    char b[128];
    return rt_error(site, op,
                    "autocast to %s: Ember's cpu kernels do not compute in %s, and %s is on the cpu (autocast cuda "
                    "tensors, or end the region around this op)",
                    em_dtype_name(dt), em_dtype_name(dt), rt_fmt(b, sizeof b, x));
  }
  return em_cast_at(x, dt, site);
}

em_tensor *rt_autocast_f32(em_tensor *x, em_site site) {
  if (!x || x == EM_NONE || !em_is_autocast_enabled() || !half(x->dtype)) return x;
  return em_cast_at(x, EM_F32, site);
}
