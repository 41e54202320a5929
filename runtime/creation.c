/* runtime/creation.c: tensor factories and the process-wide random generator.
 *
 * Factories are thin: they validate the shape and dispatch a creation prim (FULL, IOTA,
 * PHILOX_*), so that traced code records them like any other op. eye and randint are
 * decompositions into those prims. The generator is (seed, offset) as in PyTorch's Philox
 * generator for CUDA: each random op reserves a block of counters with one atomic add, so the
 * values depend only on the seed, the offset and the shape, never on threads. */
#include "rt.h"

#include <math.h>
#include <string.h>

static uint64_t rng_seed, rng_offset;
static _Thread_local em_device default_device;

em_device rt_default_device(void) { return default_device; }
em_device em_set_default_device(em_device dev) {
  em_device prev = default_device;
  default_device = dev == EM_CUDA ? EM_CUDA : EM_CPU;
  return prev;
}

void em_manual_seed(uint64_t seed) {
  __atomic_store_n(&rng_seed, seed, __ATOMIC_RELAXED);
  __atomic_store_n(&rng_offset, 0, __ATOMIC_RELAXED);
}

void em_rng_get_state(uint64_t *seed, uint64_t *offset) {
  if (seed) *seed = __atomic_load_n(&rng_seed, __ATOMIC_RELAXED);
  if (offset) *offset = __atomic_load_n(&rng_offset, __ATOMIC_RELAXED);
}

void em_rng_set_state(uint64_t seed, uint64_t offset) {
  __atomic_store_n(&rng_seed, seed, __ATOMIC_RELAXED);
  __atomic_store_n(&rng_offset, offset, __ATOMIC_RELAXED);
}

/* Under a trace the generator does not move: a random node takes its counters when the graph
 * runs (rt_interpret with fresh_rng), so a compiled call draws the same numbers eager would. */
void rt_rng_reserve(uint64_t calls, uint64_t *seed, uint64_t *offset) {
  if (rt_tracing()) {
    *seed = *offset = 0;
    return;
  }
  *seed = __atomic_load_n(&rng_seed, __ATOMIC_RELAXED);
  *offset = __atomic_fetch_add(&rng_offset, calls, __ATOMIC_RELAXED);
}

static bool shape_attr(prim_attrs *at, int ndim, const int64_t *sizes, const char *name, em_site site) {
  if (ndim < 0 || ndim > EM_MAX_DIMS)
    return rt_error(site, name, "%d dims requested; a tensor has 0 to %d", ndim, EM_MAX_DIMS), false;
  if (ndim > 0 && !sizes) return rt_error(site, name, "sizes is NULL for %d dims", ndim), false;
  at->shape.ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    if (sizes[i] < 0) return rt_error(site, name, "size %lld of dim %d is negative", (long long)sizes[i], i), false;
    at->shape.sizes[i] = sizes[i];
  }
  if (!ir_shape_fits(ndim, sizes)) {
    char b[128];
    return rt_error(site, name, "%s is too large to address", ir_fmt_type(b, sizeof b, at->dtype, ndim, sizes)), false;
  }
  return true;
}

static em_tensor *full(em_dtype dt, int ndim, const int64_t *sizes, double v, const char *name, em_site site) {
  prim_attrs at = {.dtype = dt, .value = v};
  if (!shape_attr(&at, ndim, sizes, name, site)) return NULL;
  if ((unsigned)dt < EM_DTYPE_COUNT && !ir_value_fits(dt, v))
    return rt_error(site, name, "value %g cannot be converted to %s without overflow", v, em_dtype_name(dt));
  return rt_scope_add(rt_dispatch(name, EM_PRIM_FULL, NULL, 0, &at, site), name, site);
}

em_tensor *em_empty_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site) {
  return rt_scope_add(rt_new_device(dt, ndim, sizes, default_device, "em_empty", site), "em_empty", site);
}
em_tensor *em_zeros_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site) {
  return full(dt, ndim, sizes, 0, "em_zeros", site);
}
em_tensor *em_ones_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site) {
  return full(dt, ndim, sizes, 1, "em_ones", site);
}
em_tensor *em_full_at(em_dtype dt, int ndim, const int64_t *sizes, double v, em_site site) {
  return full(dt, ndim, sizes, v, "em_full", site);
}
em_tensor *em_scalar_at(em_dtype dt, double v, em_site site) {
  return full(dt, 0, NULL, v, "em_scalar", site);
}

em_tensor *em_arange_at(em_dtype dt, double start, double end, double step, em_site site) {
  static const char name[] = "em_arange";
  if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step))
    return rt_error(site, name, "needs finite bounds and a nonzero step, got (%g, %g, %g)", start, end, step);
  double n = ceil((end - start) / step);
  if (n < 0) return rt_error(site, name, "the sign of step %g disagrees with end - start = %g", step, end - start);
  if (n > 9.0e15) return rt_error(site, name, "%g elements is too many", n);
  prim_attrs at = {.dtype = dt, .value = start, .value2 = step, .shape = {1, {(int64_t)n}}};
  return rt_scope_add(rt_dispatch(name, EM_PRIM_IOTA, NULL, 0, &at, site), name, site);
}

em_tensor *em_eye_at(em_dtype dt, int64_t n, int64_t m, em_site site) {
  static const char name[] = "em_eye";
  if (n < 0 || m < 0) return rt_error(site, name, "sizes must be >= 0, got (%lld, %lld)", (long long)n, (long long)m);
  /* eye = (iota[n, 1] == iota[1, m]), broadcast, converted to dt. */
  prim_attrs ar = {.dtype = EM_I64, .value = 0, .value2 = 1, .shape = {2, {n, 1}}};
  prim_attrs ac = {.dtype = EM_I64, .value = 0, .value2 = 1, .shape = {2, {1, m}}};
  int64_t nm[2] = {n, m};
  em_tensor *r = rt_dispatch(name, EM_PRIM_IOTA, NULL, 0, &ar, site);
  em_tensor *c = rt_dispatch(name, EM_PRIM_IOTA, NULL, 0, &ac, site);
  em_tensor *re = rt_expand(r, 2, nm, name, site), *ce = rt_expand(c, 2, nm, name, site);
  em_tensor *ops[2] = {re, ce};
  em_tensor *eq = re && ce ? rt_dispatch(name, EM_PRIM_EQ, ops, 2, NULL, site) : NULL;
  em_tensor *out = rt_cast(eq, dt, name, site);
  em_release(r), em_release(c), em_release(re), em_release(ce), em_release(eq);
  return rt_scope_add(out, name, site);
}

em_tensor *em_from_data_at(const void *data, em_dtype dt, int ndim, const int64_t *sizes, em_site site) {
  em_tensor *t = rt_new(dt, ndim, sizes, "em_from_data", site);
  if (!t) return NULL;
  size_t bytes = t->storage->bytes;
  if (bytes && !data) {
    long long n = (long long)t->numel;
    em_release(t);
    return rt_error(site, "em_from_data", "data is NULL for %lld elements", n);
  }
  if (bytes) memcpy(t->storage->data, data, bytes);
  if (default_device == EM_CUDA) { /* as torch.tensor under torch.set_default_device("cuda") */
    em_tensor *d = rt_to_device(t, EM_CUDA, "em_from_data", site);
    em_release(t);
    t = d;
  }
  return rt_scope_add(t, "em_from_data", site);
}

static em_tensor *philox_tensor(em_prim op, em_dtype dt, int ndim, const int64_t *sizes, const char *name, em_site site) {
  prim_attrs at = {.dtype = dt};
  if (!shape_attr(&at, ndim, sizes, name, site)) return NULL;
  if (dt != EM_F32 && dt != EM_F64) return rt_error(site, name, "needs dtype f32 or f64, got %s", em_dtype_name(dt));
  rt_rng_reserve(prim_philox_calls(op, dt, ir_numel(ndim, sizes)), &at.seed, &at.offset);
  return rt_dispatch(name, op, NULL, 0, &at, site);
}

em_tensor *em_rand_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site) {
  return rt_scope_add(philox_tensor(EM_PRIM_PHILOX_UNIFORM, dt, ndim, sizes, "em_rand", site), "em_rand", site);
}

em_tensor *em_randn_at(em_dtype dt, int ndim, const int64_t *sizes, em_site site) {
  return rt_scope_add(philox_tensor(EM_PRIM_PHILOX_NORMAL, dt, ndim, sizes, "em_randn", site), "em_randn", site);
}

em_tensor *em_randint_at(int64_t low, int64_t high, int ndim, const int64_t *sizes, em_site site) {
  static const char name[] = "em_randint";
  if (high <= low) return rt_error(site, name, "needs low < high, got [%lld, %lld)", (long long)low, (long long)high);
  double range = (double)high - (double)low;
  if (range > 9007199254740992.0) return rt_error(site, name, "range [%lld, %lld) exceeds 2^53", (long long)low, (long long)high);
  /* low + min(floor(u * range), range - 1) with u uniform f64 in [0, 1): 53 random bits. */
  em_tensor *u = philox_tensor(EM_PRIM_PHILOX_UNIFORM, EM_F64, ndim, sizes, name, site);
  em_tensor *k = rt_scalar(EM_F64, range, name, site), *m = rt_scalar(EM_F64, range - 1, name, site);
  em_tensor *r = NULL;
  if (u && k && m) {
    em_tensor *ke = rt_expand(k, u->ndim, u->sizes, name, site), *me = rt_expand(m, u->ndim, u->sizes, name, site);
    em_tensor *o1[2] = {u, ke};
    em_tensor *scaled = ke && me ? rt_dispatch(name, EM_PRIM_MUL, o1, 2, NULL, site) : NULL;
    em_tensor *fl = scaled ? rt_dispatch(name, EM_PRIM_FLOOR, &scaled, 1, NULL, site) : NULL;
    em_tensor *o2[2] = {fl, me};
    em_tensor *cl = fl ? rt_dispatch(name, EM_PRIM_MINIMUM, o2, 2, NULL, site) : NULL;
    em_tensor *ci = rt_cast(cl, EM_I64, name, site);
    if (ci && low != 0) {
      em_tensor *lo = rt_scalar(EM_I64, (double)low, name, site);
      em_tensor *le = rt_expand(lo, ci->ndim, ci->sizes, name, site);
      em_tensor *o3[2] = {ci, le};
      if (le && rt_dispatch_out(name, EM_PRIM_ADD, o3, 2, NULL, ci, site)) r = em_retain(ci);
      em_release(lo), em_release(le);
    } else {
      r = em_retain(ci);
    }
    em_release(ke), em_release(me), em_release(scaled), em_release(fl), em_release(cl), em_release(ci);
  }
  em_release(u), em_release(k), em_release(m);
  return rt_scope_add(r, name, site);
}
