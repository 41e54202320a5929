/* tests/test_data.c: IDX and .npy readers, the Fashion-MNIST loader on the real files, the
 * batch iterator, and em_save / em_load round trips (safetensors; more in test_checkpoint.c).
 *
 * Files are written byte by byte here (raw, or gzipped with zlib) rather than by the code under
 * test, so a reader and writer that agree on a wrong format cannot pass together. Each test
 * works in its own mkdtemp directory and removes it at the end. Fault-injection loops fail each
 * allocation in turn to show that no error path leaks; ETEST checks the leak counters. */
#define _XOPEN_SOURCE 700
#include "common.h"

#include "tmpdir.h"

#include <stdio.h>
#include <unistd.h>
#include <zlib.h>

static void write_file(const char *path, const void *data, size_t n, bool gz) {
  if (gz) {
    gzFile f = gzopen(path, "wb");
    cr_assert(f && gzwrite(f, data, (unsigned)n) == (int)n && gzclose(f) == Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(data, 1, n, f) == n && fclose(f) == 0);
  }
}

static const char *err(void) { return em_last_error() ? em_last_error() : ""; }


/* ---- IDX ---- */

ETEST(idx, u8_raw_and_gzip) {
  make_dir();
  unsigned char file[] = {0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 250, 5, 6};
  write_file(path_in("a.idx"), file, sizeof file, false);
  write_file(path_in("a.idx.gz"), file, sizeof file, true);
  EXPECT(em_load_idx(path_in("a.idx")), EM_U8, SHAPE(2, 3), 0, 1, 2, 3, 250, 5, 6);
  EXPECT(em_load_idx(path_in("a.idx.gz")), EM_U8, SHAPE(2, 3), 0, 1, 2, 3, 250, 5, 6);
  /* content decides, not the name: a raw file called .gz and a gzipped one without it */
  write_file(path_in("raw.gz"), file, sizeof file, false);
  write_file(path_in("zipped"), file, sizeof file, true);
  EXPECT(em_load_idx(path_in("raw.gz")), EM_U8, SHAPE(2, 3), 0, 1, 2, 3, 250, 5, 6);
  EXPECT(em_load_idx(path_in("zipped")), EM_U8, SHAPE(2, 3), 0, 1, 2, 3, 250, 5, 6);
  remove_dir();
}

ETEST(idx, big_endian_types) {
  make_dir();
  unsigned char i32[] = {0, 0, 0x0C, 1, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xfe, 0, 0, 1, 0, 0x7f, 0xff, 0xff, 0xff};
  write_file(path_in("i.idx"), i32, sizeof i32, false);
  EXPECT(em_load_idx(path_in("i.idx")), EM_I32, SHAPE(3), 0, -2, 256, 2147483647);
  unsigned char f32[] = {0, 0, 0x0D, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0x3f, 0xc0, 0, 0, 0xc1, 0x20, 0, 0}; /* 1.5, -10 */
  write_file(path_in("f.idx"), f32, sizeof f32, true);
  EXPECT(em_load_idx(path_in("f.idx")), EM_F32, SHAPE(1, 2), 0, 1.5, -10);
  unsigned char f64[] = {0, 0, 0x0E, 1, 0, 0, 0, 1, 0xbf, 0xd0, 0, 0, 0, 0, 0, 0}; /* -0.25 */
  write_file(path_in("d.idx"), f64, sizeof f64, false);
  EXPECT(em_load_idx(path_in("d.idx")), EM_F64, SHAPE(1), 0, -0.25);
  unsigned char i8[] = {0, 0, 0x09, 1, 0, 0, 0, 3, 0xff, 7, 0x80};
  write_file(path_in("b.idx"), i8, sizeof i8, false);
  EXPECT(em_load_idx(path_in("b.idx")), EM_I32, SHAPE(3), 0, -1, 7, -128);
  unsigned char i16[] = {0, 0, 0x0B, 1, 0, 0, 0, 3, 0xff, 0xfe, 0x01, 0x00, 0x80, 0x00};
  write_file(path_in("s.idx"), i16, sizeof i16, true);
  EXPECT(em_load_idx(path_in("s.idx")), EM_I32, SHAPE(3), 0, -2, 256, -32768);
  unsigned char empty[] = {0, 0, 0x08, 2, 0, 0, 0, 0, 0, 0, 0, 5};
  write_file(path_in("e.idx"), empty, sizeof empty, false);
  em_tensor *e = em_load_idx(path_in("e.idx"));
  cr_assert(e && em_ndim(e) == 2 && em_size(e, 0) == 0 && em_size(e, 1) == 5, "%s", err());
  remove_dir();
}

ETEST(idx, errors) {
  make_dir();
  unsigned char bad[] = {1, 2, 3, 4};
  write_file(path_in("bad.idx"), bad, sizeof bad, false);
  EXPECT_ERROR(em_load_idx(path_in("bad.idx")), "not an IDX file");
  unsigned char nodims[] = {0, 0, 0x08, 0};
  write_file(path_in("nodims.idx"), nodims, sizeof nodims, false);
  EXPECT_ERROR(em_load_idx(path_in("nodims.idx")), "bad magic");
  unsigned char type[] = {0, 0, 0x0A, 1, 0, 0, 0, 1, 0};
  write_file(path_in("type.idx"), type, sizeof type, false);
  EXPECT_ERROR(em_load_idx(path_in("type.idx")), "unknown IDX element type 0x0a");
  unsigned char head[] = {0, 0, 0x08, 3, 0, 0, 0, 9, 0, 0};
  write_file(path_in("h.idx"), head, sizeof head, false);
  EXPECT_ERROR(em_load_idx(path_in("h.idx")), "truncated in its header");
  unsigned char trunc[] = {0, 0, 0x08, 1, 0, 0, 0, 9, 1, 2};
  write_file(path_in("t.idx"), trunc, sizeof trunc, false);
  EXPECT_ERROR(em_load_idx(path_in("t.idx")), "truncated: its header promises 9 bytes of data, the file holds 2");
  /* issue 17: 13 bytes claiming [65535, 65535] u8 is refused before 4 GiB are allocated, plain and
   * gzipped (em_debug_live_bytes stays 0 at the end of the test either way; the message says so) */
  unsigned char huge[] = {0, 0, 0x08, 2, 0, 0, 0xff, 0xff, 0, 0, 0xff, 0xff, 7};
  write_file(path_in("huge.idx"), huge, sizeof huge, false);
  EXPECT_ERROR(em_load_idx(path_in("huge.idx")), "promises 4294836225 bytes of data, the file holds 1");
  write_file(path_in("huge.idx.gz"), huge, sizeof huge, true);
  EXPECT_ERROR(em_load_idx(path_in("huge.idx.gz")), "promises 4294836225 bytes of data, the stream holds 1");
  /* found by fuzz/fuzz_idx: a cut gzip stream (no ISIZE trailer; 17 bytes) claiming [65535, 65535]
   * skipped the check and allocated 4 GiB; a stream is now inflated into a growing buffer first */
  static const unsigned char cut[] = {0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x34, 0x00,
                                      0x13, 0x63, 0x60, 0xe0, 0x60, 0x62, 0x40, 0x40};
  write_file(path_in("cut.idx.gz"), cut, sizeof cut, false);
  em_debug_reset_peak();
  EXPECT_ERROR(em_load_idx(path_in("cut.idx.gz")), "the stream holds");
  cr_assert_lt(em_debug_peak_bytes(), 1 << 20, "no tensor was allocated for the claimed shape");
  write_file(path_in("t.idx.gz"), trunc, sizeof trunc, true);
  EXPECT_ERROR(em_load_idx(path_in("t.idx.gz")), "truncated");
  unsigned char f32[] = {0, 0, 0x0D, 1, 0, 0, 0, 2, 0x3f, 0xc0, 0, 0, 0x3f}; /* a partial element */
  write_file(path_in("p.idx"), f32, sizeof f32, false);
  EXPECT_ERROR(em_load_idx(path_in("p.idx")), "truncated");
  EXPECT_ERROR(em_load_idx("/nonexistent/x.idx"), "cannot open /nonexistent/x.idx: No such file");
  EXPECT_ERROR(em_load_idx(NULL), "path is NULL");
  /* the error is located at the caller's line */
  em_clear_error();
  int line = __LINE__ + 1;
  cr_assert_null(em_load_idx(path_in("bad.idx")));
  char where[64];
  snprintf(where, sizeof where, "test_data.c:%d: em_load_idx:", line);
  cr_assert(strstr(err(), where), "%s", err());
  em_clear_error();
  remove_dir();
}

static bool load_small_idx(void) { return em_load_idx(path_in("a.idx")) != NULL; }

ETEST(idx, allocation_failures) {
  make_dir();
  unsigned char file[] = {0, 0, 0x0B, 1, 0, 0, 0, 2, 0, 1, 0, 2};
  write_file(path_in("a.idx"), file, sizeof file, true);
  fail_each_alloc(load_small_idx);
  remove_dir();
}

/* ---- .npy ---- */

ETEST(npy, round_trips_every_dtype) {
  make_dir();
  em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    /* a transposed (non-contiguous) view: the file holds its row-major values */
    em_tensor *t = em_transpose(T(dts[i], SHAPE(2, 3), 1, 0, 3, 4, 5, 0), 0, 1);
    cr_assert(em_save_npy(path_in("x.npy"), t), "%s", err());
    em_tensor *r = em_load_npy(path_in("x.npy"));
    cr_assert_not_null(r, "%s", err());
    cr_assert_eq(em_dtype_of(r), dts[i]);
    cr_assert(em_ndim(r) == 2 && em_size(r, 0) == 3 && em_size(r, 1) == 2);
    cr_assert_eq(em_item(em_sum(em_ne(r, t), 0, NULL, false)), 0, "%s round trip", em_dtype_name(dts[i]));
  }
  EXPECT(em_load_npy(path_in("x.npy")), EM_BOOL, SHAPE(3, 2), 0, 1, 1, 0, 1, 1, 0);
  cr_assert(em_save_npy(path_in("s.npy"), em_scalar(EM_F64, 2.5)));
  EXPECT(em_load_npy(path_in("s.npy")), EM_F64, SCALAR_SHAPE, 0, 2.5);
  cr_assert(em_save_npy(path_in("z.npy"), em_zeros(EM_I64, EM_SHAPE(0, 4))));
  em_tensor *z = em_load_npy(path_in("z.npy"));
  cr_assert(z && em_ndim(z) == 2 && em_size(z, 0) == 0 && em_size(z, 1) == 4, "%s", err());
  em_tensor *big = em_arange(EM_F32, 0, 1000, 1);
  cr_assert(em_save_npy(path_in("big.npy"), em_reshape(big, EM_SHAPE(10, 10, 10))));
  em_tensor *rb = em_load_npy(path_in("big.npy"));
  cr_assert_not_null(rb, "%s", err());
  cr_assert_eq(em_item(em_sum(em_ne(em_reshape(rb, EM_SHAPE(1000)), big), 0, NULL, false)), 0);
  remove_dir();
}

ETEST(npy, writes_what_numpy_writes) {
  make_dir();
  cr_assert(em_save_npy(path_in("v.npy"), T(EM_F32, SHAPE(3), 1, 2, 3)));
  unsigned char b[256];
  size_t n = read_file(path_in("v.npy"), b, sizeof b);
  /* numpy.save(np.array([1, 2, 3], np.float32)): 128 bytes of header, then 12 of data */
  cr_assert_eq(n, 128 + 12);
  cr_assert(!memcmp(b, "\x93NUMPY\x01\x00\x76\x00", 10));
  const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  cr_assert(!memcmp(b + 10, h, strlen(h)), "%.118s", (char *)b + 10);
  for (size_t i = 10 + strlen(h); i < 127; i++) cr_assert_eq(b[i], ' ');
  cr_assert_eq(b[127], '\n');
  float v[3];
  memcpy(v, b + 128, 12);
  cr_assert(v[0] == 1 && v[1] == 2 && v[2] == 3);
  cr_assert(em_save_npy(path_in("m.npy"), em_zeros(EM_U8, EM_SHAPE(2, 3))));
  n = read_file(path_in("m.npy"), b, sizeof b);
  cr_assert_eq(n, 128 + 6);
  cr_assert(strstr((char *)b + 10, "'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }"));
  remove_dir();
}

/* Writes a .npy file of the given version with header h (padded with a newline) and data. */
static void write_npy(const char *path, int version, const char *h, const void *data, size_t n) {
  unsigned char buf[512] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)version, 0};
  size_t hl = strlen(h) + 1, pre = version == 1 ? 10 : 12;
  buf[8] = (unsigned char)hl;
  buf[9] = (unsigned char)(hl >> 8);
  memcpy(buf + pre, h, hl - 1);
  buf[pre + hl - 1] = '\n';
  if (n) memcpy(buf + pre + hl, data, n);
  write_file(path, buf, pre + hl + n, false);
}

ETEST(npy, headers_written_by_others) {
  make_dir();
  int64_t v[2] = {7, -9};
  /* version 2 with extra spaces, as other writers produce */
  write_npy(path_in("v2.npy"), 2, "{'descr':'<i8',  'fortran_order' : False, 'shape': ( 2 , ) }", v, sizeof v);
  EXPECT(em_load_npy(path_in("v2.npy")), EM_I64, SHAPE(2), 0, 7, -9);
  /* version 3, keys in another order, double quotes */
  write_npy(path_in("v3.npy"), 3, "{\"shape\": (2, 1), \"fortran_order\": False, \"descr\": \"<i8\"}", v, sizeof v);
  EXPECT(em_load_npy(path_in("v3.npy")), EM_I64, SHAPE(2, 1), 0, 7, -9);
  unsigned char bools[3] = {0, 1, 2};
  write_npy(path_in("b.npy"), 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", bools, 3);
  EXPECT(em_load_npy(path_in("b.npy")), EM_BOOL, SHAPE(3), 0, 0, 1, 1);
  double one = 1;
  write_npy(path_in("fo.npy"), 1, "{'descr': '<f8', 'fortran_order': True, 'shape': (1,), }", &one, 8);
  EXPECT_ERROR(em_load_npy(path_in("fo.npy")), "Fortran-order arrays are not supported");
  write_npy(path_in("be.npy"), 1, "{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }", &one, 8);
  EXPECT_ERROR(em_load_npy(path_in("be.npy")), "unsupported dtype '>f8'");
  write_npy(path_in("c.npy"), 1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", &one, 8);
  EXPECT_ERROR(em_load_npy(path_in("c.npy")), "unsupported dtype '<c8'");
  write_npy(path_in("t.npy"), 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", &one, 8);
  EXPECT_ERROR(em_load_npy(path_in("t.npy")), "is truncated");
  write_npy(path_in("ns.npy"), 1, "{'descr': '<f8', 'fortran_order': False}", &one, 8);
  EXPECT_ERROR(em_load_npy(path_in("ns.npy")), "header lacks");
  write_npy(path_in("neg.npy"), 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (-1,), }", &one, 8);
  EXPECT_ERROR(em_load_npy(path_in("neg.npy")), "bad shape");
  /* issue 17: shapes that are not Python tuples were read as (2, 3); a header promising more
   * data than the file holds is refused before the allocation */
  double six[6] = {0};
  write_npy(path_in("sp.npy"), 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2 3), }", six, sizeof six);
  EXPECT_ERROR(em_load_npy(path_in("sp.npy")), "bad shape in header");
  write_npy(path_in("cm.npy"), 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,,,3), }", six, sizeof six);
  EXPECT_ERROR(em_load_npy(path_in("cm.npy")), "bad shape in header");
  write_npy(path_in("ok.npy"), 1, "{'descr': '<f8', 'fortran_order': False, 'shape': ( 2 , 3 ), }", six, sizeof six);
  EXPECT(em_load_npy(path_in("ok.npy")), EM_F64, SHAPE(2, 3), 0, 0, 0, 0, 0, 0, 0);
  write_npy(path_in("big.npy"), 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (65535, 65535), }", six, 8);
  EXPECT_ERROR(em_load_npy(path_in("big.npy")), "is truncated");
  write_npy(path_in("v9.npy"), 9, "{}", NULL, 0);
  EXPECT_ERROR(em_load_npy(path_in("v9.npy")), "not a .npy file");
  write_file(path_in("short.npy"), "\x93NUMPY\x01\x00\x40\x00{'descr'", 17, false);
  EXPECT_ERROR(em_load_npy(path_in("short.npy")), "truncated");
  EXPECT_ERROR(em_load_npy(path_in("missing.npy")), "No such file");
  em_clear_error();
  cr_assert(!em_save_npy(path_in("h.npy"), em_zeros(EM_F16, EM_SHAPE(2))));
  cr_assert(strstr(err(), ".npy has no type for f16[2]"), "%s", err());
  em_clear_error();
  cr_assert(!em_save_npy("/nonexistent/dir/x.npy", em_zeros(EM_F32, EM_SHAPE(2))));
  cr_assert(strstr(err(), "cannot write /nonexistent/dir/x.npy: No such file"), "%s", err());
  em_clear_error();
  cr_assert(!em_save_npy(path_in("n.npy"), NULL));
  cr_assert_null(em_last_error(), "a NULL tensor adds no error of its own");
  remove_dir();
}

static bool npy_round_trip(void) {
  em_tensor *t = em_transpose(em_zeros(EM_F32, EM_SHAPE(2, 3)), 0, 1);
  return em_save_npy(path_in("f.npy"), t) && em_load_npy(path_in("f.npy")) != NULL;
}

ETEST(npy, allocation_failures) {
  make_dir();
  fail_each_alloc(npy_round_trip);
  remove_dir();
}

/* ---- Fashion-MNIST ---- */

ETEST(fashion_mnist, real_files) {
  em_fashion_mnist d;
  cr_assert(em_fashion_mnist_load(&d, NULL), "%s", err());
  cr_assert(em_ndim(d.train_images) == 3 && em_size(d.train_images, 0) == 60000 && em_size(d.train_images, 1) == 28 &&
            em_size(d.train_images, 2) == 28);
  cr_assert(em_ndim(d.train_labels) == 1 && em_size(d.train_labels, 0) == 60000);
  cr_assert(em_ndim(d.test_images) == 3 && em_size(d.test_images, 0) == 10000 && em_size(d.test_images, 1) == 28 &&
            em_size(d.test_images, 2) == 28);
  cr_assert(em_ndim(d.test_labels) == 1 && em_size(d.test_labels, 0) == 10000);
  em_tensor *all[4] = {d.train_images, d.train_labels, d.test_images, d.test_labels};
  for (int i = 0; i < 4; i++) cr_assert_eq(em_dtype_of(all[i]), EM_U8);
  cr_assert_eq(em_item(em_amax(d.train_labels, 0, NULL, false)), 9);
  cr_assert_eq(em_item(em_amin(d.train_labels, 0, NULL, false)), 0);
  cr_assert_eq(em_item(em_amax(d.test_labels, 0, NULL, false)), 9);
  cr_assert_eq(em_item(em_amin(d.test_labels, 0, NULL, false)), 0);
  /* Checksums computed independently from the Debian files with Python's gzip module. */
  cr_assert_eq(em_item(em_sum(em_slice(d.train_labels, 0, 0, 100, 1), 0, NULL, false)), 412);
  cr_assert_eq(em_item(em_sum(d.train_labels, 0, NULL, false)), 270000); /* 6000 of each class */
  cr_assert_eq(em_item(em_sum(d.test_labels, 0, NULL, false)), 45000);
  cr_assert_eq(em_item(em_sum(em_slice(d.test_images, 0, 0, 1, 1), 0, NULL, false)), 33456);
  cr_assert_eq(em_item(em_sum(em_slice(d.train_images, 0, 0, 10, 1), 0, NULL, false)), 589804);
  cr_assert_eq(em_item(em_sum(em_slice(d.train_images, 0, 59999, 60000, 1), 0, NULL, false)), 16684);
}

ETEST(fashion_mnist, missing_directory) {
  em_fashion_mnist d = {EM_NONE, EM_NONE, EM_NONE, EM_NONE};
  em_clear_error();
  cr_assert(!em_fashion_mnist_load(&d, "/nonexistent-dir"));
  cr_assert(strstr(err(), "cannot open /nonexistent-dir/train-images-idx3-ubyte.gz"), "%s", err());
  cr_assert(strstr(err(), "install Debian's dataset-fashion-mnist package"), "%s", err());
  cr_assert(!d.train_images && !d.train_labels && !d.test_images && !d.test_labels);
  em_clear_error();
}

/* Writes a tiny gzipped IDX file of n u8 elements with the given shape. */
static void write_idx_u8(const char *path, int ndim, const uint32_t *sizes) {
  unsigned char buf[4096] = {0, 0, 0x08, (unsigned char)ndim};
  size_t n = 1, k = 4;
  for (int i = 0; i < ndim; i++, k += 4) {
    for (int j = 0; j < 4; j++) buf[k + (size_t)j] = (unsigned char)(sizes[i] >> (24 - 8 * j));
    n *= sizes[i];
  }
  cr_assert_leq(k + n, sizeof buf);
  for (size_t i = 0; i < n; i++) buf[k + i] = (unsigned char)(i % 10);
  write_file(path, buf, k + n, true);
}

ETEST(fashion_mnist, failures_leave_nothing) {
  make_dir();
  write_idx_u8(path_in("train-images-idx3-ubyte.gz"), 3, (uint32_t[]){2, 28, 28});
  write_idx_u8(path_in("train-labels-idx1-ubyte.gz"), 1, (uint32_t[]){2});
  write_idx_u8(path_in("t10k-images-idx3-ubyte.gz"), 3, (uint32_t[]){1, 28, 28});
  int64_t live = em_debug_live_tensors();
  em_fashion_mnist d;
  /* the test labels are missing: what was loaded before is freed at once, not left in the scope */
  em_clear_error();
  cr_assert(!em_fashion_mnist_load(&d, dir));
  cr_assert(strstr(err(), "t10k-labels-idx1-ubyte.gz: No such file"), "%s", err());
  cr_assert(strstr(err(), "dataset-fashion-mnist"), "%s", err());
  cr_assert(!d.train_images && !d.train_labels && !d.test_images && !d.test_labels);
  cr_assert_eq(em_debug_live_tensors(), live);
  /* labels not matching their images */
  write_idx_u8(path_in("t10k-labels-idx1-ubyte.gz"), 1, (uint32_t[]){3});
  em_clear_error();
  cr_assert(!em_fashion_mnist_load(&d, dir));
  cr_assert(strstr(err(), "t10k-labels-idx1-ubyte.gz holds u8[3], expected u8[N] matching its images"), "%s", err());
  cr_assert(!d.train_images && !d.test_labels);
  cr_assert_eq(em_debug_live_tensors(), live);
  /* images of the wrong size */
  write_idx_u8(path_in("t10k-labels-idx1-ubyte.gz"), 1, (uint32_t[]){1});
  write_idx_u8(path_in("train-images-idx3-ubyte.gz"), 3, (uint32_t[]){2, 28, 27});
  em_clear_error();
  cr_assert(!em_fashion_mnist_load(&d, dir));
  cr_assert(strstr(err(), "holds u8[2,28,27], expected u8[N,28,28]"), "%s", err());
  cr_assert_eq(em_debug_live_tensors(), live);
  em_clear_error();
  /* and a good small set loads */
  write_idx_u8(path_in("train-images-idx3-ubyte.gz"), 3, (uint32_t[]){2, 28, 28});
  cr_assert(em_fashion_mnist_load(&d, dir), "%s", err());
  EXPECT(d.train_labels, EM_U8, SHAPE(2), 0, 0, 1);
  cr_assert_eq(em_size(d.test_images, 0), 1);
  remove_dir();
}

/* ---- mini-batches ---- */

/* Runs one epoch of it, appending the indices to order; returns the number of batches. */
static int epoch(em_batch_iter *it, int64_t *order, int64_t *count, int64_t *sizes) {
  em_tensor *b;
  int nb = 0;
  *count = 0;
  while ((b = em_batch_iter_next(it))) {
    cr_assert_eq(em_dtype_of(b), EM_I64);
    cr_assert_eq(em_ndim(b), 1);
    if (sizes) sizes[nb] = em_numel(b);
    nb++;
    for (int64_t i = 0; i < em_numel(b); i++) order[(*count)++] = (int64_t)etest_at(b, i);
  }
  cr_assert_null(em_last_error(), "the end of an epoch is no error: %s", err());
  return nb;
}

static void assert_permutation(const int64_t *order, int64_t n) {
  int seen[100] = {0};
  for (int64_t i = 0; i < n; i++) {
    cr_assert(order[i] >= 0 && order[i] < n, "index %lld out of range", (long long)order[i]);
    seen[order[i]]++;
  }
  for (int64_t i = 0; i < n; i++) cr_assert_eq(seen[i], 1, "index %lld seen %d times", (long long)i, seen[i]);
}

ETEST(batches, permutations_per_epoch) {
  enum { N = 37 };
  em_batch_iter *it = em_batch_iter_new(N, 8, true, 7, false);
  cr_assert_not_null(it);
  cr_assert_eq(em_batch_iter_len(it), 5);
  int64_t order[3][N], count, sizes[8];
  for (int e = 0; e < 3; e++) {
    cr_assert_eq(epoch(it, order[e], &count, sizes), 5);
    cr_assert_eq(count, N);
    cr_assert(sizes[0] == 8 && sizes[3] == 8 && sizes[4] == 5, "the last batch is short");
    assert_permutation(order[e], N);
  }
  cr_assert(memcmp(order[0], order[1], sizeof order[0]) && memcmp(order[1], order[2], sizeof order[0]),
            "each epoch is shuffled differently");
  int64_t identity[N];
  for (int i = 0; i < N; i++) identity[i] = i;
  cr_assert(memcmp(order[0], identity, sizeof identity), "shuffled");
  em_batch_iter_free(it);

  /* the same seed gives the same epochs; another seed, another order */
  int64_t again[N], other[N];
  em_batch_iter *same = em_batch_iter_new(N, 8, true, 7, false);
  for (int e = 0; e < 3; e++) {
    epoch(same, again, &count, NULL);
    cr_assert(!memcmp(again, order[e], sizeof again), "epoch %d reproducible per seed", e);
  }
  em_batch_iter_free(same);
  em_batch_iter *seed8 = em_batch_iter_new(N, 8, true, 8, false);
  epoch(seed8, other, &count, NULL);
  assert_permutation(other, N);
  cr_assert(memcmp(other, order[0], sizeof other), "another seed, another order");
  em_batch_iter_free(seed8);
}

ETEST(batches, drop_last_and_no_shuffle) {
  em_batch_iter *drop = em_batch_iter_new(10, 4, false, 0, true);
  cr_assert_eq(em_batch_iter_len(drop), 2);
  for (int e = 0; e < 2; e++) {
    EXPECT(em_batch_iter_next(drop), EM_I64, SHAPE(4), 0, 0, 1, 2, 3);
    EXPECT(em_batch_iter_next(drop), EM_I64, SHAPE(4), 0, 4, 5, 6, 7);
    cr_assert_null(em_batch_iter_next(drop));
  }
  em_batch_iter_free(drop);
  em_batch_iter *keep = em_batch_iter_new(10, 4, false, 0, false);
  cr_assert_eq(em_batch_iter_len(keep), 3);
  em_batch_iter_next(keep), em_batch_iter_next(keep);
  EXPECT(em_batch_iter_next(keep), EM_I64, SHAPE(2), 0, 8, 9);
  cr_assert_null(em_batch_iter_next(keep));
  em_batch_iter_free(keep);
  /* shuffled with drop_last: full batches only, all distinct */
  em_batch_iter *sd = em_batch_iter_new(10, 3, true, 1, true);
  int64_t order[10], count, sizes[4];
  cr_assert_eq(epoch(sd, order, &count, sizes), 3);
  cr_assert_eq(count, 9);
  for (int i = 0; i < 9; i++)
    for (int j = 0; j < i; j++) cr_assert_neq(order[i], order[j]);
  em_batch_iter_free(sd);
  /* exact multiple, batch larger than n, empty data set */
  em_batch_iter *exact = em_batch_iter_new(8, 4, true, 0, false);
  cr_assert_eq(em_batch_iter_len(exact), 2);
  em_batch_iter_free(exact);
  em_batch_iter *wide = em_batch_iter_new(3, 10, false, 0, false);
  cr_assert_eq(em_batch_iter_len(wide), 1);
  EXPECT(em_batch_iter_next(wide), EM_I64, SHAPE(3), 0, 0, 1, 2);
  cr_assert_null(em_batch_iter_next(wide));
  em_batch_iter_free(wide);
  em_batch_iter *wide_drop = em_batch_iter_new(3, 10, false, 0, true);
  cr_assert_eq(em_batch_iter_len(wide_drop), 0);
  cr_assert_null(em_batch_iter_next(wide_drop));
  em_batch_iter_free(wide_drop);
  em_batch_iter *none = em_batch_iter_new(0, 4, true, 0, false);
  cr_assert_not_null(none);
  cr_assert_eq(em_batch_iter_len(none), 0);
  cr_assert_null(em_batch_iter_next(none));
  em_batch_iter_free(none);
  /* bad arguments are located errors (issue 17: they were NULL without a word); a NULL iterator
   * is not an error */
  EXPECT_ERROR(em_batch_iter_new(-1, 4, false, 0, false), "em_batch_iter_new: needs n >= 0 and batch_size >= 1, got -1 and 4");
  EXPECT_ERROR(em_batch_iter_new(4, 0, false, 0, false), "needs n >= 0 and batch_size >= 1");
  EXPECT_ERROR(em_batch_iter_new((int64_t)1 << 62, 4, false, 0, false), "their order would not fit in memory");
  cr_assert_null(em_batch_iter_next(NULL));
  cr_assert_null(em_last_error());
  cr_assert_eq(em_batch_iter_len(NULL), 0);
  em_batch_iter_free(NULL);
}

ETEST(batches, shuffle_is_uniform_enough) {
  /* Over many epochs of 4 elements, each of the 24 orders appears about equally often: a
   * biased bounded-integer draw (or an off-by-one in Fisher-Yates) skews this at once. */
  em_batch_iter *it = em_batch_iter_new(4, 4, true, 123, false);
  int counts[256] = {0};
  enum { EPOCHS = 4800 };
  for (int e = 0; e < EPOCHS; e++) {
    em_scope_begin();
    em_tensor *b = em_batch_iter_next(it);
    int64_t v[4];
    cr_assert(em_to_buffer(b, EM_I64, v, sizeof v));
    counts[v[0] * 64 + v[1] * 16 + v[2] * 4 + v[3]]++;
    cr_assert_null(em_batch_iter_next(it));
    em_scope_end();
  }
  int distinct = 0;
  for (int i = 0; i < 256; i++)
    if (counts[i]) {
      distinct++;
      cr_assert(counts[i] > 120 && counts[i] < 280, "order %d seen %d times of 200 expected", i, counts[i]);
    }
  cr_assert_eq(distinct, 24);
  em_batch_iter_free(it);
}

static em_batch_iter *fault_it;
static bool next_batch(void) { return em_batch_iter_next(fault_it) != NULL; }

ETEST(batches, allocation_failures) {
  for (int64_t k = 1; k <= 2; k++) {
    em_debug_fail_alloc(k);
    cr_assert_null(em_batch_iter_new(10, 4, true, 0, false));
    em_debug_fail_alloc(0);
  }
  fault_it = em_batch_iter_new(10, 4, false, 0, false);
  fail_each_alloc(next_batch);
  /* a failed next does not skip a batch: the successful retry gave the first one, this the second */
  EXPECT(em_batch_iter_next(fault_it), EM_I64, SHAPE(4), 0, 4, 5, 6, 7);
  em_batch_iter_free(fault_it);
}

/* ---- em_save / em_load ---- */

ETEST(serialize, save_and_load) {
  make_dir();
  em_tensor *a = T(EM_F32, SHAPE(2, 2), 1, 2, 3, 4), *b = T(EM_I64, SHAPE(3), 7, 8, -9);
  em_tensor *c = T(EM_BOOL, SCALAR_SHAPE, 1), *e = em_zeros(EM_F64, EM_SHAPE(0, 3));
  const char *names[4] = {"layer.weight", "steps", "flag", "empty"};
  cr_assert(em_save(path_in("m.embr"), 4, ((em_tensor *[]){em_transpose(a, 0, 1), b, c, e}), names), "%s", err());
  em_tensor *a2 = em_requires_grad_(em_zeros(EM_F32, EM_SHAPE(2, 2)), true), *b2 = em_zeros(EM_I64, EM_SHAPE(3));
  int64_t va = em_version(a2);
  const char *rev[2] = {"steps", "layer.weight"};
  cr_assert(em_load(path_in("m.embr"), 2, ((em_tensor *[]){b2, a2}), rev), "%s", err());
  EXPECT(a2, EM_F32, SHAPE(2, 2), 0, 1, 3, 2, 4);
  EXPECT(b2, EM_I64, SHAPE(3), 0, 7, 8, -9);
  cr_assert(em_requires_grad(a2), "still a leaf requiring grad");
  cr_assert_gt(em_version(a2), va, "an in-place write");
  /* into a view: the values land in its base */
  em_tensor *base = em_zeros(EM_F32, EM_SHAPE(2, 2));
  cr_assert(em_load(path_in("m.embr"), 1, ((em_tensor *[]){em_transpose(base, 0, 1)}), names), "%s", err());
  EXPECT(base, EM_F32, SHAPE(2, 2), 0, 1, 2, 3, 4);
  em_tensor *c2 = em_zeros(EM_BOOL, 0, NULL), *e2 = em_ones(EM_F64, EM_SHAPE(0, 3));
  cr_assert(em_load(path_in("m.embr"), 2, ((em_tensor *[]){c2, e2}), names + 2), "%s", err());
  EXPECT(c2, EM_BOOL, SCALAR_SHAPE, 0, 1);
  cr_assert(em_load(path_in("m.embr"), 0, NULL, NULL), "%s", err());
  remove_dir();
}

/* em_save writes safetensors (test_checkpoint.c holds it to the Python package's files); the
 * layout of the smallest case, byte by byte: header size, JSON padded to 8 bytes, data. */
ETEST(serialize, file_layout) {
  make_dir();
  cr_assert(em_save(path_in("x.embr"), 1, ((em_tensor *[]){T(EM_I32, SHAPE(2), 1, -2)}), ((const char *[]){"ab"})));
  unsigned char b[128];
  size_t n = read_file(path_in("x.embr"), b, sizeof b);
  const char json[] = "{\"ab\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}} ";
  cr_assert_eq(n, 8 + 56 + 8);
  cr_assert(b[0] == 56 && !memcmp(b + 1, "\0\0\0\0\0\0\0", 7), "header size");
  cr_assert(!memcmp(b + 8, json, sizeof json - 1), "%.*s", 56, (const char *)b + 8);
  const unsigned char data[] = {1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff};
  cr_assert(!memcmp(b + 8 + 56, data, 8));
  remove_dir();
}

ETEST(serialize, errors_change_nothing) {
  make_dir();
  const char *names[2] = {"w", "b"};
  cr_assert(em_save(path_in("m.embr"), 2, ((em_tensor *[]){T(EM_F32, SHAPE(3), 1, 2, 3), T(EM_F32, SHAPE(1), 5)}),
                    names));
  em_tensor *w = em_zeros(EM_F32, EM_SHAPE(3));
  /* shape mismatch: both shapes named, and w (listed first, loaded fine) is left untouched */
  em_clear_error();
  cr_assert(!em_load(path_in("m.embr"), 2, ((em_tensor *[]){w, em_zeros(EM_F32, EM_SHAPE(2))}), names));
  cr_assert(strstr(err(), "m.embr: tensor 'b' is f32[1] in the file but f32[2] here"), "%s", err());
  EXPECT(w, EM_F32, SHAPE(3), 0, 0, 0, 0);
  em_clear_error();
  cr_assert(!em_load(path_in("m.embr"), 1, ((em_tensor *[]){em_zeros(EM_F64, EM_SHAPE(3))}), names));
  cr_assert(strstr(err(), "tensor 'w' is f32[3] in the file but f64[3] here"), "%s", err());
  em_clear_error();
  const char *missing[2] = {"w", "nope"};
  cr_assert(!em_load(path_in("m.embr"), 2, ((em_tensor *[]){w, em_zeros(EM_F32, EM_SHAPE(3))}), missing));
  cr_assert(strstr(err(), "has no tensor named 'nope'"), "%s", err());
  EXPECT(w, EM_F32, SHAPE(3), 0, 0, 0, 0);
  /* truncated: every shorter prefix of the file fails, and none changes w */
  unsigned char file[256];
  size_t n = read_file(path_in("m.embr"), file, sizeof file);
  for (size_t len = 0; len < n; len++) {
    write_file(path_in("t.embr"), file, len, false);
    em_clear_error();
    cr_assert(!em_load(path_in("t.embr"), 1, &w, names), "prefix of %zu bytes loaded", len);
    cr_assert(strstr(err(), "t.embr"), "%zu: %s", len, err());
    EXPECT(w, EM_F32, SHAPE(3), 0, 0, 0, 0);
  }
  em_clear_error();
  const unsigned char v2[] = {'E', 'M', 'B', 'R', 2, 0, 0, 0, 0, 0, 0, 0}; /* the former format, a later version */
  write_file(path_in("v2.embr"), v2, sizeof v2, false);
  cr_assert(!em_load(path_in("v2.embr"), 1, &w, names));
  cr_assert(strstr(err(), "EMBR version 2"), "%s", err());
  em_clear_error();
  cr_assert(!em_load(path_in("none.embr"), 1, &w, names));
  cr_assert(strstr(err(), "cannot open"), "%s", err());
  cr_assert(strstr(err(), "none.embr: No such file or directory"), "%s", err());
  em_clear_error();
  cr_assert(!em_save("/nonexistent/dir/m.embr", 1, &w, names));
  cr_assert(strstr(err(), "cannot write /nonexistent/dir/m.embr: No such file"), "%s", err());
  em_clear_error();
  cr_assert(!em_save(path_in("d.embr"), 2, ((em_tensor *[]){w, w}), ((const char *[]){"x", "x"})));
  cr_assert(strstr(err(), "name 'x' is given twice"), "%s", err());
  cr_assert(access(path_in("d.embr"), F_OK) != 0, "nothing written");
  em_clear_error();
  cr_assert(!em_save(path_in("n.embr"), 1, ((em_tensor *[]){NULL}), names));
  cr_assert_null(em_last_error(), "a NULL tensor adds no error of its own");
  /* the error is located at the caller's line */
  int line = __LINE__ + 1;
  cr_assert(!em_load(path_in("none.embr"), 1, &w, names));
  char where[64];
  snprintf(where, sizeof where, "test_data.c:%d: em_load:", line);
  cr_assert(strstr(err(), where), "%s", err());
  em_clear_error();
  remove_dir();
}

static bool save_and_load(void) {
  em_tensor *w = em_transpose(em_ones(EM_F32, EM_SHAPE(2, 3)), 0, 1);
  em_tensor *into = em_zeros(EM_F32, EM_SHAPE(3, 2));
  const char *names[1] = {"w"};
  return em_save(path_in("f.embr"), 1, &w, names) && em_load(path_in("f.embr"), 1, &into, names);
}

ETEST(serialize, allocation_failures) {
  make_dir();
  fail_each_alloc(save_and_load);
  remove_dir();
}

/* ---- the loader ---- */

/* A data set of n rows on the CPU (whatever the suite's default device): x f32 [n, 3] with
 * x[r][c] = 10 r + c, y i64 [n] = r, z u8 [n, 2, 2] = r + c. */
static void dataset(int64_t n, em_tensor **ts) {
  em_device was = em_set_default_device(EM_CPU);
  em_tensor *r = em_arange(EM_F64, 0, (double)n, 1);
  ts[0] = em_add(em_mul_scalar(em_reshape(r, EM_SHAPE(-1, 1)), 10), em_arange(EM_F64, 0, 3, 1));
  ts[0] = em_cast(ts[0], EM_F32);
  ts[1] = em_cast(r, EM_I64);
  ts[2] = em_cast(em_add(em_reshape(r, EM_SHAPE(-1, 1, 1)), em_reshape(em_arange(EM_F64, 0, 4, 1), EM_SHAPE(2, 2))),
                  EM_U8);
  em_set_default_device(was);
  cr_assert(ts[0] && ts[1] && ts[2], "%s", err());
}

/* Bytes of t (any device), into a malloc'd buffer of *bytes. */
static char *bytes_of(em_tensor *t, size_t *bytes) {
  *bytes = (size_t)em_numel(t) * (em_dtype_of(t) == EM_F32 ? 4 : em_dtype_of(t) == EM_I64 ? 8 : 1);
  char *p = malloc(*bytes + 1);
  cr_assert(em_to_buffer(t, em_dtype_of(t), p, *bytes), "%s", err());
  return p;
}

/* Runs `epochs` epochs of a loader with opts over ts and of em_batch_iter with the same options,
 * asserting the same batches: shapes, dtypes, devices and bytes (index_select of the iterator's
 * indices). */
static void same_as_iterator(em_tensor **ts, em_loader_opts o, int epochs) {
  em_loader *l = em_loader_new(3, ts, &o);
  cr_assert_not_null(l, "%s", err());
  em_batch_iter *it = em_batch_iter_new(em_size(ts[0], 0), o.batch_size, o.shuffle, o.seed, o.drop_last);
  cr_assert_eq(em_loader_len(l), em_batch_iter_len(it));
  em_device was = em_set_default_device(EM_CPU);
  for (int e = 0; e < epochs; e++) {
    int64_t nb = 0;
    for (;; nb++) {
      cr_assert(em_scope_begin());
      em_tensor **b = em_loader_next(l), *idx = em_batch_iter_next(it);
      cr_assert_eq(b == NULL, idx == NULL, "epoch %d batch %lld: both end together (%s)", e, (long long)nb, err());
      if (!b) {
        em_scope_end();
        break;
      }
      for (int i = 0; i < 3; i++) {
        em_tensor *want = em_index_select(ts[i], 0, idx);
        cr_assert_eq(em_device_of(b[i]), o.device);
        cr_assert_eq(em_dtype_of(b[i]), em_dtype_of(want));
        cr_assert_eq(em_ndim(b[i]), em_ndim(want));
        for (int d = 0; d < em_ndim(want); d++) cr_assert_eq(em_size(b[i], d), em_size(want, d));
        size_t n1, n2;
        char *got = bytes_of(b[i], &n1), *exp = bytes_of(want, &n2);
        cr_assert(n1 == n2 && !memcmp(got, exp, n1), "epoch %d batch %lld tensor %d differs", e, (long long)nb, i);
        free(got), free(exp);
      }
      em_scope_end();
    }
    cr_assert_eq(nb, em_loader_len(l));
  }
  em_set_default_device(was);
  cr_assert_null(em_last_error(), "%s", err());
  em_batch_iter_free(it);
  em_loader_free(l);
}

ETEST(loader, batches_equal_the_iterators) {
  em_tensor *ts[3];
  dataset(37, ts);
  for (int shuffle = 0; shuffle < 2; shuffle++)
    for (int drop = 0; drop < 2; drop++)
      for (int w = 0; w < 4; w += 1 + (w == 1)) /* workers 0, 1, 3 */
        same_as_iterator(ts, (em_loader_opts){.batch_size = 8, .shuffle = shuffle, .seed = 5, .drop_last = drop,
                                              .workers = w, .prefetch = w ? 2 : 0},
                         3);
  /* one batch bigger than the data set, a batch of 1, an empty data set */
  same_as_iterator(ts, (em_loader_opts){.batch_size = 100, .shuffle = true, .workers = 2}, 2);
  same_as_iterator(ts, (em_loader_opts){.batch_size = 1, .shuffle = true, .workers = 3, .prefetch = 5}, 1);
  em_tensor *none[3];
  dataset(0, none);
  same_as_iterator(none, (em_loader_opts){.batch_size = 4, .workers = 1}, 2);
}

ETEST(loader, non_contiguous_sources_and_reset) {
  em_tensor *ts[3];
  dataset(20, ts);
  em_device was = em_set_default_device(EM_CPU);
  em_tensor *cols = em_transpose(em_transpose(ts[0], 0, 1), 0, 1); /* a view: same values */
  em_tensor *odd = em_contiguous(em_slice(ts[0], 1, 1, 3, 1)); /* f32 [20, 2] */
  em_tensor *view = em_slice(ts[0], 1, 1, 3, 1);
  em_set_default_device(was);
  em_loader *l = em_loader_new(2, ((em_tensor *[]){view, cols}), &((em_loader_opts){.batch_size = 6, .workers = 2}));
  cr_assert_not_null(l, "%s", err());
  em_tensor **b = em_loader_next(l);
  cr_assert_not_null(b, "%s", err());
  size_t n1, n2;
  char *got = bytes_of(b[0], &n1), *exp = bytes_of(em_slice(odd, 0, 0, 6, 1), &n2);
  cr_assert(n1 == n2 && !memcmp(got, exp, n1), "a strided source is read as its values");
  free(got), free(exp);
  /* reset: the rest of epoch 0 is dropped, epoch 1 starts at batch 0 (no shuffle: rows 0..5) */
  em_loader_reset(l);
  b = em_loader_next(l);
  cr_assert(b && etest_at(b[1], 0) == 0 && etest_at(b[1], 3) == 10, "after reset: the first rows");
  for (int i = 1; i < 4; i++) cr_assert_not_null(em_loader_next(l), "%s", err());
  cr_assert_null(em_loader_next(l), "4 batches per epoch");
  em_loader_free(l);
}

ETEST(loader, prefetch_depth_is_respected) {
  em_tensor *ts[3];
  dataset(100, ts);
  em_loader *l = em_loader_new(3, ts, &((em_loader_opts){.batch_size = 4, .workers = 3, .prefetch = 4}));
  cr_assert_not_null(l, "%s", err());
  int peak = -1, ahead = 0;
  for (int i = 0; i < 2000 && (ahead = em_loader_ahead(l, &peak)) < 4; i++) usleep(1000);
  cr_assert_eq(ahead, 4, "the workers fill the prefetch queue and stop there");
  usleep(20000);
  cr_assert_eq(em_loader_ahead(l, &peak), 4);
  cr_assert_eq(peak, 4);
  for (int k = 0; k < 25; k++) cr_assert_not_null(em_loader_next(l), "%s", err());
  cr_assert_null(em_loader_next(l));
  em_loader_ahead(l, &peak);
  cr_assert_leq(peak, 4, "never more than prefetch batches ahead");
  /* batches the caller holds do not count: a whole epoch can be kept */
  cr_assert(em_scope_begin());
  em_tensor **b, *kept[25];
  int n = 0;
  while ((b = em_loader_next(l))) kept[n++] = b[1];
  cr_assert_eq(n, 25);
  cr_assert_eq(etest_at(kept[24], 3), 99);
  em_scope_end();
  em_loader_free(l);
  /* freeing a loader with batches in flight, and keeping a batch past the loader */
  l = em_loader_new(3, ts, &((em_loader_opts){.batch_size = 3, .workers = 2, .prefetch = 3}));
  b = em_loader_next(l);
  cr_assert_not_null(b, "%s", err());
  em_tensor *y = b[1];
  em_loader_free(l);
  cr_assert_eq(etest_at(y, 2), 2, "a batch outlives its loader");
}

ETEST(loader, cuda_batches_on_the_device) {
  etest_pick_cuda();
  em_tensor *ts[3];
  dataset(29, ts);
  for (int w = 0; w < 3; w++)
    same_as_iterator(ts, (em_loader_opts){.batch_size = 5, .shuffle = true, .seed = 3, .workers = w, .device = EM_CUDA},
                     2);
  /* a batch size past the data set's: the pinned buffers hold the rows there are */
  same_as_iterator(ts, (em_loader_opts){.batch_size = INT64_MAX, .workers = 1, .device = EM_CUDA}, 1);
  /* the consumer's stream waits for the side stream's copies: a kernel on a user stream reads them */
  em_cuda_stream *s = em_cuda_stream_new();
  cr_assert_not_null(s, "%s", err());
  em_cuda_set_stream(s);
  em_loader *l = em_loader_new(3, ts, &((em_loader_opts){.batch_size = 29, .workers = 1, .device = EM_CUDA}));
  em_tensor **b = em_loader_next(l);
  cr_assert_not_null(b, "%s", err());
  em_tensor *sum = em_sum(b[1], 0, NULL, false);
  em_cuda_set_stream(NULL);
  cr_assert_eq(em_item(sum), 29 * 28 / 2);
  em_loader_free(l);
  em_cuda_stream_free(s);
  /* a reset, and a free, with the next batch's copy queued ahead */
  l = em_loader_new(3, ts, &((em_loader_opts){.batch_size = 4, .workers = 2, .device = EM_CUDA}));
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 2000 && em_loader_ahead(l, NULL) < 4; i++) usleep(1000);
    b = em_loader_next(l);
    cr_assert(b && etest_at(b[1], 0) == 0 && etest_at(b[1], 3) == 3, "the first rows: %s", err());
    if (!round) em_loader_reset(l);
  }
  b = em_loader_next(l);
  cr_assert(b && etest_at(b[1], 0) == 4, "the second batch: %s", err());
  em_loader_free(l);
}

ETEST(loader, bad_arguments) {
  em_tensor *ts[3];
  dataset(10, ts);
  em_loader_opts o = {.batch_size = 4, .workers = 1};
  em_device was = em_set_default_device(EM_CPU);
  em_tensor *short_y = em_zeros(EM_F32, EM_SHAPE(9)), *scalar = em_scalar(EM_F32, 1);
  em_set_default_device(was);
#define BAD(call, msg)                                                                                      \
  do {                                                                                                     \
    cr_assert_null(call, "%s", #call);                                                                     \
    cr_assert(em_last_error() && strstr(em_last_error(), "em_loader_new: ") && strstr(em_last_error(), msg), \
              "%s: %s", #call, err());                                                                     \
    cr_assert(strstr(err(), "test_data.c:"), "names the caller's file: %s", err());                      \
    em_clear_error();                                                                                      \
  } while (0)
  BAD(em_loader_new(3, NULL, &o), "the tensors array is NULL");
  BAD(em_loader_new(3, ts, NULL), "opts is NULL");
  BAD(em_loader_new(0, ts, &o), "needs at least one tensor, got n = 0");
  BAD(em_loader_new(2, ((em_tensor *[]){ts[0], NULL}), &o), "tensors[1] is NULL");
  BAD(em_loader_new(2, ((em_tensor *[]){ts[0], short_y}), &o), "tensors[1] has 9 rows, tensors[0] has 10");
  BAD(em_loader_new(1, &scalar, &o), "tensors[0] is 0-dim");
  BAD(em_loader_new(3, ts, &((em_loader_opts){.batch_size = 0})), "batch_size must be >= 1, got 0");
  BAD(em_loader_new(3, ts, &((em_loader_opts){.batch_size = 2, .workers = -1})), "workers must be in [0, 64], got -1");
  BAD(em_loader_new(3, ts, &((em_loader_opts){.batch_size = 2, .prefetch = 5000})), "prefetch must be in [0, 1024]");
  BAD(em_loader_new(3, ts, &((em_loader_opts){.batch_size = 2, .device = (em_device)7})), "device must be EM_CPU or");
  if (!em_cuda_is_available()) /* the suite's CPU run: no emulator picked */
    BAD(em_loader_new(3, ts, &((em_loader_opts){.batch_size = 2, .device = EM_CUDA})), "no CUDA device");
#undef BAD
  int line = __LINE__ + 1;
  cr_assert_null(em_loader_new(3, ts, &((em_loader_opts){.batch_size = -3})));
  char where[64];
  snprintf(where, sizeof where, "test_data.c:%d: em_loader_new:", line);
  cr_assert(strstr(err(), where), "%s", err());
  em_clear_error();
  /* NULL loaders */
  cr_assert_null(em_loader_next(NULL));
  cr_assert_eq(em_loader_len(NULL), 0);
  em_loader_reset(NULL);
  em_loader_free(NULL);
  cr_assert_null(em_last_error());
}

static em_tensor *fault_ts[3];

static em_tensor *load_two_batches(void) {
  em_tensor **ts = fault_ts;
  /* workers 0: the allocations happen in a fixed order (a worker's failure is reported when its
   * batch is taken, which loader.batches_equal_the_iterators does not provoke) */
  em_loader *l = em_loader_new(3, ts, &((em_loader_opts){.batch_size = 4, .shuffle = true}));
  if (!l) return NULL;
  em_tensor **a = em_loader_next(l), **b = a ? em_loader_next(l) : NULL;
  em_loader_free(l);
  return b ? ts[0] : NULL;
}

ETEST(loader, allocation_failures) {
  dataset(10, fault_ts);
  etest_fail_each_allocation("em_loader", load_two_batches, 400);
}
