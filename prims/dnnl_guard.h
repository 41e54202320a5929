/* prims/dnnl_guard.h: oneDNN calls behind a C++ boundary (prims/dnnl_guard.cpp). Each wrapper
 * calls the oneDNN function of the same name and returns its status, or dnnl_out_of_memory when
 * it threw std::bad_alloc, dnnl_runtime_error when it threw anything else, so no C++ exception
 * reaches Ember's C frames. The convolution descriptors are the dilated ones, direct algorithm,
 * symmetric padding, no bias (what prims/extern.c makes). */
#ifndef EMBER_DNNL_GUARD_H
#define EMBER_DNNL_GUARD_H

#include <oneapi/dnnl/dnnl.h>

#ifdef __cplusplus
extern "C" {
#endif

dnnl_status_t prim_dnnl_sgemm(char ta, char tb, dnnl_dim_t m, dnnl_dim_t n, dnnl_dim_t k, float alpha, const float *a,
                              dnnl_dim_t lda, const float *b, dnnl_dim_t ldb, float beta, float *c, dnnl_dim_t ldc);
dnnl_status_t prim_dnnl_engine_create(dnnl_engine_t *engine, dnnl_engine_kind_t kind, size_t index);
dnnl_status_t prim_dnnl_primitive_attr_create(dnnl_primitive_attr_t *attr);
dnnl_status_t prim_dnnl_primitive_attr_set_scratchpad_mode(dnnl_primitive_attr_t attr, dnnl_scratchpad_mode_t mode);
dnnl_status_t prim_dnnl_conv_forward_desc_init(dnnl_convolution_desc_t *d, const dnnl_memory_desc_t *src,
                                               const dnnl_memory_desc_t *w, const dnnl_memory_desc_t *dst,
                                               const dnnl_dim_t *strides, const dnnl_dim_t *dil,
                                               const dnnl_dim_t *pad);
dnnl_status_t prim_dnnl_conv_backward_data_desc_init(dnnl_convolution_desc_t *d, const dnnl_memory_desc_t *dsrc,
                                                     const dnnl_memory_desc_t *w, const dnnl_memory_desc_t *ddst,
                                                     const dnnl_dim_t *strides, const dnnl_dim_t *dil,
                                                     const dnnl_dim_t *pad);
dnnl_status_t prim_dnnl_conv_backward_weights_desc_init(dnnl_convolution_desc_t *d, const dnnl_memory_desc_t *src,
                                                        const dnnl_memory_desc_t *dw, const dnnl_memory_desc_t *ddst,
                                                        const dnnl_dim_t *strides, const dnnl_dim_t *dil,
                                                        const dnnl_dim_t *pad);
dnnl_status_t prim_dnnl_primitive_desc_create(dnnl_primitive_desc_t *pd, const_dnnl_op_desc_t op,
                                              const_dnnl_primitive_attr_t attr, dnnl_engine_t engine,
                                              const_dnnl_primitive_desc_t hint);
dnnl_status_t prim_dnnl_reorder_primitive_desc_create(dnnl_primitive_desc_t *pd, const dnnl_memory_desc_t *from,
                                                      dnnl_engine_t from_engine, const dnnl_memory_desc_t *to,
                                                      dnnl_engine_t to_engine, const_dnnl_primitive_attr_t attr);
dnnl_status_t prim_dnnl_primitive_create(dnnl_primitive_t *p, const_dnnl_primitive_desc_t pd);
dnnl_status_t prim_dnnl_memory_create(dnnl_memory_t *m, const dnnl_memory_desc_t *md, dnnl_engine_t engine, void *ptr);
dnnl_status_t prim_dnnl_stream_create(dnnl_stream_t *s, dnnl_engine_t engine, unsigned flags);
dnnl_status_t prim_dnnl_primitive_execute(const_dnnl_primitive_t p, dnnl_stream_t s, int nargs,
                                          const dnnl_exec_arg_t *args);
dnnl_status_t prim_dnnl_stream_wait(dnnl_stream_t s);

#ifdef __cplusplus
}
#endif

#endif
