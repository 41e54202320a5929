/* prims/dnnl_guard.cpp: the C++ boundary in front of oneDNN.
 *
 * oneDNN's C API is a thin layer over C++ that does not catch what it throws: when operator new
 * fails inside dnnl_sgemm or dnnl_primitive_desc_create, std::bad_alloc comes out of the C
 * function, crosses Ember's C frames (they have unwind tables, so it does not stop there) and,
 * with no handler anywhere, std::terminate aborts the process. Every oneDNN call Ember makes that
 * can allocate goes through one of these wrappers instead, which turn an exception into a status
 * (dnnl_out_of_memory for bad_alloc, dnnl_runtime_error for anything else) on the thread that
 * made the call, before it can unwind through a C frame: Ember's C code holds locks (the OpenMP
 * critical section of the convolution cache) and owns buffers that an unwinding frame would
 * never release, and an exception must not leave an OpenMP parallel region.
 *
 * What these cannot reach: an exception thrown on one of oneDNN's own OpenMP worker threads
 * (inside the library's parallel loops) ends that thread's outlined region without a handler,
 * and the C++ runtime terminates the process before any caller sees it. */
#include <new>
#include <oneapi/dnnl/dnnl.h>

#include "dnnl_guard.h"

#define GUARD(call)                      \
  try {                                  \
    return call;                         \
  } catch (const std::bad_alloc &) {     \
    return dnnl_out_of_memory;           \
  } catch (...) {                        \
    return dnnl_runtime_error;           \
  }

extern "C" {

dnnl_status_t prim_dnnl_sgemm(char ta, char tb, dnnl_dim_t m, dnnl_dim_t n, dnnl_dim_t k, float alpha, const float *a,
                              dnnl_dim_t lda, const float *b, dnnl_dim_t ldb, float beta, float *c, dnnl_dim_t ldc) {
  GUARD(dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
}

dnnl_status_t prim_dnnl_engine_create(dnnl_engine_t *engine, dnnl_engine_kind_t kind, size_t index) {
  GUARD(dnnl_engine_create(engine, kind, index))
}

dnnl_status_t prim_dnnl_primitive_attr_create(dnnl_primitive_attr_t *attr) { GUARD(dnnl_primitive_attr_create(attr)) }

dnnl_status_t prim_dnnl_primitive_attr_set_scratchpad_mode(dnnl_primitive_attr_t attr, dnnl_scratchpad_mode_t mode) {
  GUARD(dnnl_primitive_attr_set_scratchpad_mode(attr, mode))
}

dnnl_status_t prim_dnnl_conv_forward_desc_init(dnnl_convolution_desc_t *d, const dnnl_memory_desc_t *src,
                                               const dnnl_memory_desc_t *w, const dnnl_memory_desc_t *dst,
                                               const dnnl_dim_t *strides, const dnnl_dim_t *dil,
                                               const dnnl_dim_t *pad) {
  GUARD(dnnl_dilated_convolution_forward_desc_init(d, dnnl_forward_training, dnnl_convolution_direct, src, w, NULL,
                                                   dst, strides, dil, pad, pad))
}

dnnl_status_t prim_dnnl_conv_backward_data_desc_init(dnnl_convolution_desc_t *d, const dnnl_memory_desc_t *dsrc,
                                                     const dnnl_memory_desc_t *w, const dnnl_memory_desc_t *ddst,
                                                     const dnnl_dim_t *strides, const dnnl_dim_t *dil,
                                                     const dnnl_dim_t *pad) {
  GUARD(dnnl_dilated_convolution_backward_data_desc_init(d, dnnl_convolution_direct, dsrc, w, ddst, strides, dil, pad,
                                                         pad))
}

dnnl_status_t prim_dnnl_conv_backward_weights_desc_init(dnnl_convolution_desc_t *d, const dnnl_memory_desc_t *src,
                                                        const dnnl_memory_desc_t *dw, const dnnl_memory_desc_t *ddst,
                                                        const dnnl_dim_t *strides, const dnnl_dim_t *dil,
                                                        const dnnl_dim_t *pad) {
  GUARD(dnnl_dilated_convolution_backward_weights_desc_init(d, dnnl_convolution_direct, src, dw, NULL, ddst, strides,
                                                            dil, pad, pad))
}

dnnl_status_t prim_dnnl_primitive_desc_create(dnnl_primitive_desc_t *pd, const_dnnl_op_desc_t op,
                                              const_dnnl_primitive_attr_t attr, dnnl_engine_t engine,
                                              const_dnnl_primitive_desc_t hint) {
  GUARD(dnnl_primitive_desc_create(pd, op, attr, engine, hint))
}

dnnl_status_t prim_dnnl_reorder_primitive_desc_create(dnnl_primitive_desc_t *pd, const dnnl_memory_desc_t *from,
                                                      dnnl_engine_t from_engine, const dnnl_memory_desc_t *to,
                                                      dnnl_engine_t to_engine, const_dnnl_primitive_attr_t attr) {
  GUARD(dnnl_reorder_primitive_desc_create(pd, from, from_engine, to, to_engine, attr))
}

dnnl_status_t prim_dnnl_primitive_create(dnnl_primitive_t *p, const_dnnl_primitive_desc_t pd) {
  GUARD(dnnl_primitive_create(p, pd))
}

dnnl_status_t prim_dnnl_memory_create(dnnl_memory_t *m, const dnnl_memory_desc_t *md, dnnl_engine_t engine, void *ptr) {
  GUARD(dnnl_memory_create(m, md, engine, ptr))
}

dnnl_status_t prim_dnnl_stream_create(dnnl_stream_t *s, dnnl_engine_t engine, unsigned flags) {
  GUARD(dnnl_stream_create(s, engine, flags))
}

dnnl_status_t prim_dnnl_primitive_execute(const_dnnl_primitive_t p, dnnl_stream_t s, int nargs,
                                          const dnnl_exec_arg_t *args) {
  GUARD(dnnl_primitive_execute(p, s, nargs, args))
}

dnnl_status_t prim_dnnl_stream_wait(dnnl_stream_t s) { GUARD(dnnl_stream_wait(s)) }

} /* extern "C" */
