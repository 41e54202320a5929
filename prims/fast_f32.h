/* prims/fast_f32.h: the f32 tanh and erf of the generated CPU kernels (inductor/codegen.c:
 * fast_tanh_f32, fast_erf_f32) and of the GEMM epilogues that stand for them (prims/extern.c),
 * in one place so the two compute the same bits. Odd rational functions of x clamped to where
 * the function rounds to +-1, with Eigen's and XLA's coefficients for their fast f32 tanh and
 * erf; Horner's rule with fused multiply-adds (one rounding each), then one division. Errors,
 * measured over every f32: tanh 4.95 ULP and 2.95e-7 from the exact value, erf 7.5 ULP and
 * 4.5e-7 (codegen.c says more). */
#ifndef EMBER_PRIMS_FAST_F32_H
#define EMBER_PRIMS_FAST_F32_H

/* tanh(x) = x num(x^2) / den(x^2) for |x| <= LIM; +-1 beyond; x itself below TINY (keeps -0 and
 * the subnormals) */
static const float fast_tanh_num[7] = {-2.76076847742355e-16f, 2.00018790482477e-13f, -8.60467152213735e-11f,
                                       5.12229709037114e-08f,  1.48572235717979e-05f, 6.37261928875436e-04f,
                                       4.89352455891786e-03f};
static const float fast_tanh_den[4] = {1.19825839466702e-06f, 1.18534705686654e-04f, 2.26843463243900e-03f,
                                       4.89352518554385e-03f};
#define FAST_TANH_LIM 7.90531110763549805f
#define FAST_TANH_TINY 0.0004f

/* erf(x) = x num(x^2) / den(x^2) with x clamped to [-LIM, LIM] (beyond 4, erf rounds to +-1) */
static const float fast_erf_num[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f,
                                      -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                                      -1.60960333262415e-02f};
static const float fast_erf_den[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                                      -7.37332916720468e-03f, -1.42647390514189e-02f};
#define FAST_ERF_LIM 4.0f

#endif
