/* fuzz/make_corpus.c: writes the fuzzers' seed corpora into fuzz/corpus/<target>/ (run from the
 * repository root: build/fuzz_make_corpus). Valid files made by Ember itself, a few hand-made
 * header variants and malformed ones. The kernel-cache seeds are real cache entries: run
 * tests/cache_probe twice with EMBER_CACHE_DIR set (once with EMBER_CACHE_PROBE_VARIANT=1) and
 * copy the two .o files into fuzz/corpus/kcache. */
#include <ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../ir/graph.h"
#include "../runtime/rt.h"

static void put(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n) perror(path), exit(1);
  fclose(f);
}

static void npy_header(const char *path, int version, const char *dict, const void *body, size_t n) {
  char buf[512];
  size_t hl = strlen(dict), pre = version == 1 ? 10 : 12, pad = (64 - (pre + hl + 1) % 64) % 64;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (char)version, buf[7] = 0;
  size_t total = hl + pad + 1;
  if (version == 1) buf[8] = (char)(total & 0xff), buf[9] = (char)(total >> 8);
  else buf[8] = (char)(total & 0xff), buf[9] = (char)(total >> 8), buf[10] = buf[11] = 0;
  memcpy(buf + pre, dict, hl);
  memset(buf + pre + hl, ' ', pad);
  buf[pre + hl + pad] = '\n';
  FILE *f = fopen(path, "wb");
  fwrite(buf, 1, pre + total, f);
  if (n) fwrite(body, 1, n, f);
  fclose(f);
}

static void idx(const char *path, unsigned char type, int ndim, const unsigned *sizes, const void *body, size_t n, bool gz) {
  unsigned char h[4 + 4 * 4] = {0, 0, type, (unsigned char)ndim};
  for (int i = 0; i < ndim; i++)
    h[4 + 4 * i] = (unsigned char)(sizes[i] >> 24), h[5 + 4 * i] = (unsigned char)(sizes[i] >> 16),
              h[6 + 4 * i] = (unsigned char)(sizes[i] >> 8), h[7 + 4 * i] = (unsigned char)sizes[i];
  if (gz) {
    gzFile f = gzopen(path, "wb");
    gzwrite(f, h, (unsigned)(4 + 4 * ndim));
    gzwrite(f, body, (unsigned)n);
    gzclose(f);
  } else {
    FILE *f = fopen(path, "wb");
    fwrite(h, 1, (size_t)(4 + 4 * ndim), f);
    fwrite(body, 1, n, f);
    fclose(f);
  }
}

static bool refuse_break(rt_trace *tr, const char *op, const char *reason, em_site site, void *ctx) { return false; }

static void ir_seed(const char *path, int which) {
  em_manual_seed(1);
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(4, 6)), *w = em_randn(EM_F32, EM_SHAPE(5, 6));
  em_tensor *img = em_randn(EM_F32, EM_SHAPE(1, 2, 6, 6)), *k = em_randn(EM_F32, EM_SHAPE(3, 2, 3, 3));
  rt_trace tr;
  if (!rt_trace_begin(&tr, "seed", refuse_break, NULL, EM_HERE)) exit(1);
  em_scope_begin();
  em_tensor *y;
  switch (which) {
  case 0: y = em_log_softmax(em_relu(em_linear(x, w, EM_NONE)), -1); break;
  case 1: y = em_sum(em_where(em_gt_scalar(x, 0), em_exp(x), em_mul_scalar(x, 0.5)), EM_AXES(-1, 0), true); break;
  case 2: y = em_max_pool2d(em_conv2d(img, k, EM_NONE, EM_CONV2D_DEFAULT), 2, 2, 0, 0, 0, 0); break;
  default: y = em_cat(2, ((em_tensor *[]){em_transpose(em_slice(x, 1, 0, 6, 2), 0, 1), em_transpose(em_flip(em_slice(x, 1, 1, 6, 2), EM_AXES(0)), 0, 1)}), 0);
  }
  if (!y || !ir_add_output(tr.g, rt_trace_value_of(&tr, y))) fprintf(stderr, "%s\n", em_last_error()), exit(1);
  char *text = ir_print(tr.g, true);
  put(path, text, strlen(text));
  free(text);
  em_scope_end();
  rt_trace_end(&tr);
}

int main(void) {
  char p[256];
  /* npy: Ember's own files, then header variants and damage */
  em_save_npy("fuzz/corpus/npy/f32_2x3.npy", em_arange(EM_F32, 0, 6, 1) ? em_reshape(em_arange(EM_F32, 0, 6, 1), EM_SHAPE(2, 3)) : NULL);
  em_save_npy("fuzz/corpus/npy/i64_4.npy", em_arange(EM_I64, -2, 2, 1));
  em_save_npy("fuzz/corpus/npy/bool_2x2.npy", em_gt_scalar(em_randn(EM_F32, EM_SHAPE(2, 2)), 0));
  em_save_npy("fuzz/corpus/npy/u8_scalar.npy", em_scalar(EM_U8, 7));
  em_save_npy("fuzz/corpus/npy/f64_0x5.npy", em_zeros(EM_F64, EM_SHAPE(0, 5)));
  float f6[6] = {1, 2, 3, 4, 5, 6};
  npy_header("fuzz/corpus/npy/v2_fortran.npy", 2, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f6, sizeof f6);
  npy_header("fuzz/corpus/npy/v3_i32.npy", 3, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", f6, 12);
  npy_header("fuzz/corpus/npy/bad_shape.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", f6, sizeof f6);
  npy_header("fuzz/corpus/npy/truncated.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (99999, 99999), }", f6, 8);
  npy_header("fuzz/corpus/npy/big_endian.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", f6, sizeof f6);
  /* idx */
  unsigned char u8[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255};
  idx("fuzz/corpus/idx/u8_3x4.idx", 0x08, 2, (unsigned[]){3, 4}, u8, 12, false);
  idx("fuzz/corpus/idx/u8_3x4.idx.gz", 0x08, 2, (unsigned[]){3, 4}, u8, 12, true);
  idx("fuzz/corpus/idx/i32_2.idx", 0x0C, 1, (unsigned[]){2}, u8, 8, false);
  idx("fuzz/corpus/idx/i16_3.idx", 0x0B, 1, (unsigned[]){3}, u8, 6, false);
  idx("fuzz/corpus/idx/f32_2x2.idx", 0x0D, 2, (unsigned[]){2, 2}, f6, 16, false);
  idx("fuzz/corpus/idx/f64_1.idx", 0x0E, 1, (unsigned[]){1}, u8, 8, false);
  idx("fuzz/corpus/idx/truncated.idx", 0x08, 2, (unsigned[]){65535, 65535}, u8, 1, false);
  /* embr */
  em_tensor *t[2] = {em_randn(EM_F32, EM_SHAPE(4, 3)), em_scalar(EM_I64, 12)};
  const char *names[2] = {"w", "step"};
  em_tensor *wrong[2] = {em_randn(EM_F32, EM_SHAPE(3, 4)), t[1]};
  em_save("fuzz/corpus/embr/checkpoint.embr", 2, t, names);
  em_save("fuzz/corpus/embr/wrong_shape.embr", 2, wrong, names);
  em_save("fuzz/corpus/embr/one.embr", 1, t, names);
  /* fuzz_embr then loads a bool mask from the same file */
  em_tensor *all[3] = {t[0], t[1], em_gt_scalar(em_randn(EM_F32, EM_SHAPE(2, 2)), 0)};
  const char *all_names[3] = {"w", "step", "mask"};
  em_save("fuzz/corpus/embr/with_mask.embr", 3, all, all_names);
  /* ir */
  for (int i = 0; i < 4; i++) snprintf(p, sizeof p, "fuzz/corpus/ir/graph%d.ir", i), ir_seed(p, i);
  if (em_last_error()) fprintf(stderr, "%s\n", em_last_error());
  return 0;
}
