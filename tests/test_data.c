/* tests/test_data.c: IDX and .npy readers, the Fashion-MNIST loader on the real files, the
 * batch iterator, and em_save / em_load round trips. */
#define _XOPEN_SOURCE 700
#include "common.h"

#include <stdio.h>
#include <unistd.h>
#include <zlib.h>

static char dir[64];
static void make_dir(void) {
  strcpy(dir, "/tmp/ember-test-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
static const char *path_in(const char *name) {
  static char p[128];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}

static void write_file(const char *path, const void *data, size_t n, bool gz) {
  if (gz) {
    gzFile f = gzopen(path, "wb");
    cr_assert(f && gzwrite(f, data, (unsigned)n) == (int)n && gzclose(f) == Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(data, 1, n, f) == n && fclose(f) == 0);
  }
}

ETEST(idx, u8_raw_and_gzip) {
  make_dir();
  unsigned char file[] = {0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 250, 5, 6};
  write_file(path_in("a.idx"), file, sizeof file, false);
  write_file(path_in("a.idx.gz"), file, sizeof file, true);
  EXPECT(em_load_idx(path_in("a.idx")), EM_U8, SHAPE(2, 3), 0, 1, 2, 3, 250, 5, 6);
  EXPECT(em_load_idx(path_in("a.idx.gz")), EM_U8, SHAPE(2, 3), 0, 1, 2, 3, 250, 5, 6);
}

ETEST(idx, big_endian_types_and_errors) {
  make_dir();
  unsigned char i32[] = {0, 0, 0x0C, 1, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xfe, 0, 0, 1, 0};
  write_file(path_in("i.idx"), i32, sizeof i32, false);
  EXPECT(em_load_idx(path_in("i.idx")), EM_I32, SHAPE(2), 0, -2, 256);
  unsigned char f32[] = {0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3f, 0xc0, 0, 0}; /* 1.5 */
  write_file(path_in("f.idx"), f32, sizeof f32, true);
  EXPECT(em_load_idx(path_in("f.idx")), EM_F32, SHAPE(1), 0, 1.5);
  unsigned char i8[] = {0, 0, 0x09, 1, 0, 0, 0, 2, 0xff, 7};
  write_file(path_in("b.idx"), i8, sizeof i8, false);
  EXPECT(em_load_idx(path_in("b.idx")), EM_I32, SHAPE(2), 0, -1, 7);
  unsigned char bad[] = {1, 2, 3, 4};
  write_file(path_in("bad.idx"), bad, sizeof bad, false);
  EXPECT_ERROR(em_load_idx(path_in("bad.idx")), "not an IDX file");
  unsigned char trunc[] = {0, 0, 0x08, 1, 0, 0, 0, 9, 1, 2};
  write_file(path_in("t.idx"), trunc, sizeof trunc, false);
  EXPECT_ERROR(em_load_idx(path_in("t.idx")), "truncated");
  EXPECT_ERROR(em_load_idx("/nonexistent/x.idx"), "cannot open /nonexistent/x.idx");
}

ETEST(npy, round_trips_every_dtype) {
  make_dir();
  em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    em_tensor *t = em_transpose(T(dts[i], SHAPE(2, 3), 1, 0, 3, 4, 5, 0), 0, 1);
    cr_assert(em_save_npy(path_in("x.npy"), t));
    em_tensor *r = em_load_npy(path_in("x.npy"));
    cr_assert_not_null(r, "%s", em_last_error() ? em_last_error() : "");
    cr_assert_eq(em_dtype_of(r), dts[i]);
    cr_assert(em_ndim(r) == 2 && em_size(r, 0) == 3 && em_size(r, 1) == 2);
    cr_assert_eq(em_item(em_sum(em_ne(r, t), 0, NULL, false)), 0, "%s round trip", em_dtype_name(dts[i]));
  }
  cr_assert(em_save_npy(path_in("s.npy"), em_scalar(EM_F64, 2.5)));
  EXPECT(em_load_npy(path_in("s.npy")), EM_F64, SCALAR_SHAPE, 0, 2.5);
}

ETEST(npy, headers_written_by_others) {
  make_dir();
  /* a version 2 header with extra spaces, as other writers produce */
  const char *h = "{'descr':'<i8',  'fortran_order' : False, 'shape': ( 2 , ) }";
  size_t hl = strlen(h), total = 12 + hl + 1;
  unsigned char buf[256] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, (unsigned char)(hl + 1), 0, 0, 0};
  memcpy(buf + 12, h, hl);
  buf[12 + hl] = '\n';
  int64_t v[2] = {7, -9};
  memcpy(buf + total, v, sizeof v);
  write_file(path_in("v2.npy"), buf, total + sizeof v, false);
  EXPECT(em_load_npy(path_in("v2.npy")), EM_I64, SHAPE(2), 0, 7, -9);
  const char *fo = "{'descr': '<f8', 'fortran_order': True, 'shape': (1,), }";
  unsigned char b2[256] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(strlen(fo) + 1), 0};
  memcpy(b2 + 10, fo, strlen(fo));
  b2[10 + strlen(fo)] = '\n';
  write_file(path_in("fo.npy"), b2, 10 + strlen(fo) + 1 + 8, false);
  EXPECT_ERROR(em_load_npy(path_in("fo.npy")), "Fortran-order");
}

ETEST(fashion_mnist, real_files) {
  em_fashion_mnist d;
  cr_assert(em_fashion_mnist_load(&d, NULL), "%s", em_last_error() ? em_last_error() : "");
  cr_assert(em_ndim(d.train_images) == 3 && em_size(d.train_images, 0) == 60000 && em_size(d.train_images, 1) == 28 &&
            em_size(d.train_images, 2) == 28);
  cr_assert(em_ndim(d.train_labels) == 1 && em_size(d.train_labels, 0) == 60000);
  cr_assert(em_size(d.test_images, 0) == 10000 && em_size(d.test_labels, 0) == 10000);
  cr_assert_eq(em_dtype_of(d.train_images), EM_U8);
  cr_assert_eq(em_item(em_amax(d.train_labels, 0, NULL, false)), 9);
  cr_assert_eq(em_item(em_amin(d.test_labels, 0, NULL, false)), 0);
  /* checksums computed independently from the Debian files */
  cr_assert_eq(em_item(em_sum(em_slice(d.train_labels, 0, 0, 100, 1), 0, NULL, false)), 412);
  cr_assert_eq(em_item(em_sum(em_slice(d.test_images, 0, 0, 1, 1), 0, NULL, false)), 33456);
}

ETEST(fashion_mnist, missing_directory) {
  em_fashion_mnist d;
  em_clear_error();
  cr_assert(!em_fashion_mnist_load(&d, "/nonexistent-dir"));
  cr_assert(strstr(em_last_error(), "dataset-fashion-mnist"), "%s", em_last_error());
  cr_assert_null(d.train_images);
  em_clear_error();
}

ETEST(batches, permutations_per_epoch) {
  em_batch_iter *it = em_batch_iter_new(10, 4, true, 7, false);
  cr_assert_eq(em_batch_iter_len(it), 3);
  int64_t first[10] = {0}, second[10] = {0};
  for (int e = 0; e < 2; e++) {
    int seen[10] = {0}, k = 0;
    em_tensor *b;
    while ((b = em_batch_iter_next(it))) {
      for (int64_t i = 0; i < em_numel(b); i++) {
        int64_t v = (int64_t)etest_at(b, i);
        cr_assert(v >= 0 && v < 10);
        seen[v]++;
        (e ? second : first)[k++] = v;
      }
    }
    cr_assert_eq(k, 10);
    for (int i = 0; i < 10; i++) cr_assert_eq(seen[i], 1, "epoch %d: index %d seen %d times", e, i, seen[i]);
  }
  cr_assert(memcmp(first, second, sizeof first), "epochs are shuffled differently");
  em_batch_iter_free(it);
  em_batch_iter *same = em_batch_iter_new(10, 4, true, 7, false);
  em_tensor *b = em_batch_iter_next(same);
  for (int i = 0; i < 4; i++) cr_assert_eq((int64_t)etest_at(b, i), first[i], "reproducible per seed");
  em_batch_iter_free(same);
  em_batch_iter *drop = em_batch_iter_new(10, 4, false, 0, true);
  cr_assert_eq(em_batch_iter_len(drop), 2);
  EXPECT(em_batch_iter_next(drop), EM_I64, SHAPE(4), 0, 0, 1, 2, 3);
  cr_assert_not_null(em_batch_iter_next(drop));
  cr_assert_null(em_batch_iter_next(drop));
  em_batch_iter_free(drop);
}

ETEST(serialize, save_and_load) {
  make_dir();
  em_tensor *a = T(EM_F32, SHAPE(2, 2), 1, 2, 3, 4), *b = T(EM_I64, SHAPE(3), 7, 8, 9);
  const char *names[2] = {"layer.weight", "steps"};
  cr_assert(em_save(path_in("m.embr"), 2, ((em_tensor *[]){em_transpose(a, 0, 1), b}), names));
  em_tensor *a2 = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(2, 2)), true), *b2 = em_zeros(EM_I64, EM_SHAPE(3));
  const char *rev[2] = {"steps", "layer.weight"};
  cr_assert(em_load(path_in("m.embr"), 2, ((em_tensor *[]){b2, a2}), rev), "%s", em_last_error() ? em_last_error() : "");
  EXPECT(a2, EM_F32, SHAPE(2, 2), 0, 1, 3, 2, 4);
  EXPECT(b2, EM_I64, SHAPE(3), 0, 7, 8, 9);
  em_clear_error();
  cr_assert(!em_load(path_in("m.embr"), 1, ((em_tensor *[]){em_zeros(EM_F32, EM_SHAPE(3))}), names));
  cr_assert(strstr(em_last_error(), "'layer.weight' is f32[2,2] in the file but f32[3] here"), "%s", em_last_error());
  em_clear_error();
  const char *missing[1] = {"nope"};
  cr_assert(!em_load(path_in("m.embr"), 1, &b2, missing));
  cr_assert(strstr(em_last_error(), "no tensor named 'nope'"));
  em_clear_error();
}
