/* tests/test_checkpoint.c: safetensors checkpoints (em_save_safetensors, em_load_safetensors,
 * em_save / em_load, em_checkpoint_save / _load).
 *
 * Interchange is checked against the reference implementation through committed files (made
 * once by tests/fixtures/make_safetensors.py with PyPI safetensors and numpy): files the Python
 * package wrote must read here with every value, and Ember's writer must produce, byte for
 * byte, ember_written.safetensors, which that script checked with the package's reader.
 * Malformed files are written byte by byte. Resuming training from a checkpoint must give the
 * same bits as training straight through. */
#define _XOPEN_SOURCE 700
#include "common.h"

#include "tmpdir.h"

static const char *fixture(const char *name) {
  static char p[512];
  const char *d = getenv("EMBER_FIXTURES");
  snprintf(p, sizeof p, "%s/%s", d ? d : "tests/fixtures", name);
  return p;
}
static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert(f && fwrite(data, 1, n, f) == n && fclose(f) == 0);
}
static const char *err(void) { return em_last_error() ? em_last_error() : ""; }

/* ---- files from the reference implementation ---- */

ETEST(safetensors, reads_files_python_wrote) {
  em_safetensors *f = em_load_safetensors(fixture("numpy_all.safetensors"));
  cr_assert_not_null(f, "%s", err());
  cr_assert_eq(em_safetensors_count(f), 9);
  cr_assert_str_eq(em_safetensors_metadata(f, "format"), "np");
  cr_assert_str_eq(em_safetensors_metadata(f, "source"), "numpy \xe2\x9c\x93");
  cr_assert_null(em_safetensors_metadata(f, "absent"));
  EXPECT(em_safetensors_get(f, "f32"), EM_F32, SHAPE(2, 3), 0, -1, -0.5, 0, 0.5, 1, 1.5);
  EXPECT(em_safetensors_get(f, "f64"), EM_F64, SHAPE(3), 0, 1e-300, -2.5, 3.141592653589793);
  EXPECT(em_safetensors_get(f, "i32"), EM_I32, SHAPE(2, 2), 0, 2147483647, -2147483648.0, 0, -1);
  EXPECT(em_safetensors_get(f, "u8"), EM_U8, SHAPE(5), 0, 0, 1, 127, 128, 255);
  EXPECT(em_safetensors_get(f, "bool"), EM_BOOL, SHAPE(3), 0, 1, 0, 1);
  EXPECT(em_cast(em_safetensors_get(f, "f16"), EM_F32), EM_F32, SHAPE(4), 0, 1.5, -2, 65504, 6.103515625e-05);
  EXPECT(em_safetensors_get(f, "scalar"), EM_F32, SCALAR_SHAPE, 0, 7.25);
  cr_assert_eq(em_numel(em_safetensors_get(f, "empty")), 0);
  cr_assert_eq(em_size(em_safetensors_get(f, "empty"), 1), 3);
  int64_t bytes = em_debug_live_bytes();
  em_tensor *i64 = em_safetensors_get(f, "i64");
  cr_assert_not_null(i64, "%s", err());
  if (em_device_of(i64) == EM_CPU) { /* exact: i64 extremes do not survive a trip through double */
    const int64_t *v = em_data_ptr(i64);
    cr_assert(v[0] == INT64_MAX && v[1] == INT64_MIN && v[2] == 42 && v[3] == -7);
    /* zero copy: nothing was allocated for the data; the same tensor comes back */
    cr_assert_eq(em_debug_live_bytes(), bytes, "the tensors are views of the mapped file");
    cr_assert_eq(em_safetensors_get(f, "i64"), i64);
  }
  em_safetensors_close(f);
  EXPECT(i64, EM_I64, SHAPE(4), 0, 9223372036854775807.0, -9223372036854775807.0 - 1, 42, -7); /* outlives the handle */
}

ETEST(safetensors, bf16_and_dtypes_ember_lacks) {
  em_safetensors *f = em_load_safetensors(fixture("bf16_i8.safetensors"));
  cr_assert_not_null(f, "%s", err());
  cr_assert_eq(em_safetensors_count(f), 2);
  cr_assert_str_eq(em_safetensors_name(f, 0), "bf16");
  cr_assert_null(em_safetensors_name(f, 2));
  EXPECT(em_cast(em_safetensors_get(f, "bf16"), EM_F32), EM_F32, SHAPE(2, 2), 0, 1, -2.5, 3.140625, 0);
  EXPECT_ERROR(em_safetensors_get(f, "i8"), "tensor 'i8' is I8, which Ember has no dtype for");
  EXPECT_ERROR(em_safetensors_get(f, "nope"), "has no tensor named 'nope'");
  em_safetensors_close(f);
}

/* What Ember writes for these tensors is ember_written.safetensors, byte for byte; the Python
 * package read that file (make_safetensors.py --check). EMBER_WRITE_FIXTURE=path remakes it. */
ETEST(safetensors, writes_what_python_reads) {
  make_dir();
  em_tensor *w = em_transpose(T(EM_F32, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), 0, 1);
  em_tensor *ts[] = {w, T(EM_I64, SHAPE(3), 7, 8, -9), T(EM_BOOL, SCALAR_SHAPE, 1), T(EM_U8, SHAPE(3), 0, 255, 3),
                     T(EM_F16, SHAPE(2), 0.5, -1.25), T(EM_I32, SHAPE(1, 2), -1, 2), T(EM_F64, SHAPE(1), 0.1),
                     T(EM_BF16, SHAPE(2), 1, -3.5)};
  const char *names[] = {"a.weight", "steps", "flag", "bytes", "half", "ids", "x64", "bf"};
  const char *md[] = {"format", "pt", "note", "ember \xc3\xa9" "crit", NULL};
  const char *out = getenv("EMBER_WRITE_FIXTURE") ? getenv("EMBER_WRITE_FIXTURE") : path_in("w.safetensors");
  cr_assert(em_save_safetensors(out, 8, ts, names, md), "%s", err());
  static unsigned char got[4096], want[4096];
  size_t n = read_file(out, got, sizeof got), m = read_file(fixture("ember_written.safetensors"), want, sizeof want);
  cr_assert_eq(n, m, "%zu bytes written, the fixture has %zu", n, m);
  cr_assert(!memcmp(got, want, n), "the bytes differ from ember_written.safetensors");
  /* and it reads back here */
  em_safetensors *f = em_load_safetensors(out);
  cr_assert_not_null(f, "%s", err());
  EXPECT(em_safetensors_get(f, "a.weight"), EM_F32, SHAPE(3, 2), 0, 1, 4, 2, 5, 3, 6);
  EXPECT(em_cast(em_safetensors_get(f, "bf"), EM_F32), EM_F32, SHAPE(2), 0, 1, -3.5);
  cr_assert_str_eq(em_safetensors_metadata(f, "note"), "ember \xc3\xa9" "crit");
  em_safetensors_close(f);
  remove_dir();
}

ETEST(safetensors, writes_into_a_loaded_tensor_leave_the_file_alone) {
  CPU_ONLY("the mapped pages are host memory");
  make_dir();
  cr_assert(em_save(path_in("m.safetensors"), 1, ((em_tensor *[]){T(EM_F32, SHAPE(2), 1, 2)}), ((const char *[]){"x"})));
  em_safetensors *f = em_load_safetensors(path_in("m.safetensors"));
  em_tensor *x = em_safetensors_get(f, "x");
  cr_assert_not_null(x, "%s", err());
  em_fill_(x, 9);
  EXPECT(x, EM_F32, SHAPE(2), 0, 9, 9);
  em_tensor *y = em_zeros(EM_F32, EM_SHAPE(2));
  cr_assert(em_load(path_in("m.safetensors"), 1, &y, ((const char *[]){"x"})), "%s", err());
  EXPECT(y, EM_F32, SHAPE(2), 0, 1, 2);
  em_safetensors_close(f);
  remove_dir();
}

/* ---- malformed files: each a clear error, nothing allocated for tensors, nothing leaked ---- */

static void expect_bad(const char *json, const unsigned char *data, size_t data_len, const char *needle) {
  unsigned char file[1024];
  size_t n = strlen(json);
  for (int i = 0; i < 8; i++) file[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(file + 8, json, n);
  if (data_len) memcpy(file + 8 + n, data, data_len);
  write_bytes(path_in("bad.safetensors"), file, 8 + n + data_len);
  em_clear_error();
  cr_assert_null(em_load_safetensors(path_in("bad.safetensors")), "%s loaded", json);
  cr_assert(strstr(err(), needle), "%s: error '%s' lacks '%s'", json, err(), needle);
  em_clear_error();
}

ETEST(safetensors, malformed_files_are_clear_errors) {
  make_dir();
  /* header JSON, bytes of data after it (zeros), what the error says */
  static const struct {
    const char *json;
    size_t data;
    const char *needle;
  } bad[] = {
      {"[1,2]", 0, "the header is not a JSON object"},
      {"{\"a\":", 0, "a syntax error"},
      {"{}x", 0, "bytes after its JSON object"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "data_offsets are not a range"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "but data_offsets [0, 4] hold 4"},
      {"{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unknown dtype \"Q7\""},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, "dim 0 of its shape is not a size"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, "not a size"},
      {"{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}", 1, "not a size"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "has 9 dims"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "needs \"dtype\""},
      {"{\"a\":3}", 0, "is not a JSON object"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"b\":{\"dtype\":\"U8\",\"shape\":[2]," "\"data_offsets\":[1,3]}}", 3, "overlaps the tensor before it"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "a gap is left before it"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 5, "cover 1 bytes of a 5-byte"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[1]," "\"data_offsets\":[1,2]}}", 2, "tensor 'a' is described twice"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "value 'k' is not a string"},
      {"{\"__metadata__\":[]}", 0, "must be one object of strings"},
  };
  static const unsigned char d[64];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_bad(bad[i].json, d, bad[i].data, bad[i].needle);
  /* sizes in the 8-byte prefix */
  unsigned char huge[16] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0}; /* 100,000,001 */
  write_bytes(path_in("h.safetensors"), huge, 16);
  EXPECT_ERROR(em_load_safetensors(path_in("h.safetensors")), "exceeds the format's limit of 100000000 bytes");
  unsigned char past[10] = {3, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  write_bytes(path_in("p.safetensors"), past, 10);
  EXPECT_ERROR(em_load_safetensors(path_in("p.safetensors")), "header size 3 runs past the end of the file");
  write_bytes(path_in("s.safetensors"), past, 5);
  EXPECT_ERROR(em_load_safetensors(path_in("s.safetensors")), "too short for the 8-byte header size");
  EXPECT_ERROR(em_load_safetensors(path_in("none.safetensors")), "none.safetensors: No such file or directory");
  EXPECT_ERROR(em_load_safetensors(dir), "is not a regular file");
  /* a bool byte other than 0 or 1 is found when the tensor is read */
  unsigned char two = 2;
  const char *bj = "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  unsigned char file[128];
  size_t n = strlen(bj);
  for (int i = 0; i < 8; i++) file[i] = (unsigned char)(n >> (8 * i));
  memcpy(file + 8, bj, n), file[8 + n] = two;
  write_bytes(path_in("b.safetensors"), file, 9 + n);
  em_safetensors *f = em_load_safetensors(path_in("b.safetensors"));
  cr_assert_not_null(f, "%s", err());
  EXPECT_ERROR(em_safetensors_get(f, "b"), "bool tensor 'b' holds the byte 2");
  em_safetensors_close(f);
  /* every proper prefix of a good file fails cleanly */
  unsigned char good[1024];
  size_t len = read_file(fixture("numpy_all.safetensors"), good, sizeof good);
  for (size_t k = 0; k < len; k++) {
    write_bytes(path_in("t.safetensors"), good, k);
    em_clear_error();
    cr_assert_null(em_load_safetensors(path_in("t.safetensors")), "a prefix of %zu bytes loaded", k);
    cr_assert_not_null(em_last_error());
  }
  em_clear_error();
  remove_dir();
}

ETEST(safetensors, save_errors) {
  make_dir();
  em_tensor *w = em_zeros(EM_F32, EM_SHAPE(3));
  EXPECT_ERROR((void *)(intptr_t)em_save_safetensors(NULL, 1, &w, ((const char *[]){"w"}), NULL), "path is NULL");
  EXPECT_ERROR((void *)(intptr_t)em_save_safetensors(path_in("d"), 2, ((em_tensor *[]){w, w}), ((const char *[]){"x", "x"}), NULL),
               "name 'x' is given twice");
  EXPECT_ERROR((void *)(intptr_t)em_save_safetensors(path_in("m"), 1, &w, ((const char *[]){"__metadata__"}), NULL),
               "which the format reserves");
  EXPECT_ERROR((void *)(intptr_t)em_save_safetensors(path_in("k"), 1, &w, ((const char *[]){"w"}), ((const char *[]){"k", NULL})),
               "metadata key 'k' has a NULL value");
  EXPECT_ERROR((void *)(intptr_t)em_save_safetensors("/nonexistent/dir/x.safetensors", 1, &w, ((const char *[]){"w"}), NULL),
               "cannot write /nonexistent/dir/x.safetensors: No such file");
  cr_assert(access(path_in("d"), F_OK) != 0 && access(path_in("m"), F_OK) != 0, "nothing written");
  /* a failed save leaves the earlier file whole */
  cr_assert(em_save(path_in("c"), 1, &w, ((const char *[]){"w"})), "%s", err());
  EXPECT_ERROR((void *)(intptr_t)em_save(path_in("c"), 1, ((em_tensor *[]){EM_NONE}), ((const char *[]){"w"})), "EM_NONE");
  cr_assert(em_load(path_in("c"), 1, &w, ((const char *[]){"w"})), "%s", err());
  remove_dir();
}

/* em_load still reads the former EMBR format (written here byte by byte, as it was). */
ETEST(safetensors, em_load_reads_embr) {
  make_dir();
  const unsigned char embr[] = {'E', 'M', 'B', 'R', 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 'a', 'b', 2, 0, 0, 0, 1, 0, 0, 0,
                                2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff};
  write_bytes(path_in("x.embr"), embr, sizeof embr);
  em_tensor *t = em_zeros(EM_I32, EM_SHAPE(2));
  cr_assert(em_load(path_in("x.embr"), 1, &t, ((const char *[]){"ab"})), "%s", err());
  EXPECT(t, EM_I32, SHAPE(2), 0, 1, -2);
  remove_dir();
}

static bool save_and_load(void) {
  em_tensor *w = em_transpose(em_ones(EM_F32, EM_SHAPE(2, 3)), 0, 1);
  em_tensor *into = em_zeros(EM_F32, EM_SHAPE(3, 2));
  const char *names[1] = {"w"};
  if (!em_save_safetensors(path_in("f.safetensors"), 1, &w, names, ((const char *[]){"k", "v", NULL}))) return false;
  em_safetensors *f = em_load_safetensors(path_in("f.safetensors"));
  em_tensor *g = em_safetensors_get(f, "w");
  em_safetensors_close(f);
  return g && em_load(path_in("f.safetensors"), 1, &into, names);
}

ETEST(safetensors, allocation_failures) {
  make_dir();
  fail_each_alloc(save_and_load);
  remove_dir();
}

/* ---- training resumed from a checkpoint continues bit for bit ---- */

typedef struct {
  em_linear_layer l1, l2;
} mlp;

static void mlp_init(mlp *m) {
  cr_assert(em_linear_layer_init(&m->l1, 8, 16, true) && em_linear_layer_init(&m->l2, 16, 4, true), "%s", err());
}
static em_tensor **mlp_params(mlp *m, em_tensor **p) {
  p[0] = m->l1.weight, p[1] = m->l1.bias, p[2] = m->l2.weight, p[3] = m->l2.bias;
  return p;
}
static const char *const mlp_names[4] = {"l1.weight", "l1.bias", "l2.weight", "l2.bias"};

/* One step on a batch drawn from the generator (so the generator's state matters) with dropout. */
static void train_step(mlp *m, em_optimizer *o) {
  em_scope_begin();
  em_tensor *x = em_randn(EM_F32, EM_SHAPE(32, 8));
  em_tensor *y = em_randint(0, 4, EM_SHAPE(32));
  em_tensor *h = em_dropout(em_relu(em_linear(x, m->l1.weight, m->l1.bias)), 0.2, true);
  em_tensor *loss = em_cross_entropy(em_linear(h, m->l2.weight, m->l2.bias), y, EM_CROSS_ENTROPY_DEFAULT);
  em_optimizer_zero_grad(o);
  cr_assert(loss && em_backward(loss, NULL) && em_optimizer_step(o), "%s", err());
  em_scope_end();
}

static void resume_bit_for_bit(bool adamw) {
  make_dir();
  em_tensor *p[4], *q[4];
  em_manual_seed(5);
  mlp a, b;
  mlp_init(&a);
  em_optimizer *oa = adamw ? em_adamw_new(4, mlp_params(&a, p), EM_ADAMW_DEFAULT(1e-2))
                           : em_sgd_new(4, mlp_params(&a, p), ((em_sgd_opts){0.05, 0.9, 0, 1e-4, true}));
  cr_assert_not_null(oa, "%s", err());
  for (int s = 0; s < 3; s++) train_step(&a, oa);
  em_optimizer_set_lr(oa, adamw ? 5e-3 : 0.02);
  cr_assert(em_checkpoint_save(path_in("ck.safetensors"), 4, p, mlp_names, oa), "%s", err());
  for (int s = 0; s < 4; s++) train_step(&a, oa);
  /* a fresh model and optimizer elsewhere in the generator's sequence, restored */
  em_manual_seed(99);
  mlp_init(&b);
  em_optimizer *ob = adamw ? em_adamw_new(4, mlp_params(&b, q), EM_ADAMW_DEFAULT(1))
                           : em_sgd_new(4, mlp_params(&b, q), ((em_sgd_opts){1, 0.9, 0, 1e-4, true}));
  cr_assert(em_checkpoint_load(path_in("ck.safetensors"), 4, q, mlp_names, ob), "%s", err());
  cr_assert_eq(em_optimizer_get_lr(ob), adamw ? 5e-3 : 0.02);
  for (int s = 0; s < 4; s++) train_step(&b, ob);
  for (int i = 0; i < 4; i++) etest_expect_same_bits(p[i], q[i], mlp_names[i], __FILE__, __LINE__);
  /* the file is what a PyTorch user expects to find */
  em_safetensors *f = em_load_safetensors(path_in("ck.safetensors"));
  cr_assert_str_eq(em_safetensors_metadata(f, "ember.optimizer"), adamw ? "adamw" : "sgd");
  em_clear_error();
  cr_assert_not_null(em_safetensors_get(f, adamw ? "optimizer.3.exp_avg_sq" : "optimizer.0.momentum_buffer"), "%s", err());
  em_safetensors_close(f);
  /* a mismatched optimizer or model is refused, changing nothing */
  em_optimizer *wrong = adamw ? em_sgd_new(4, q, EM_SGD_DEFAULT(0.1)) : em_adamw_new(4, q, EM_ADAMW_DEFAULT(0.1));
  em_tensor *before = em_clone(q[0]);
  EXPECT_ERROR((void *)(intptr_t)em_checkpoint_load(path_in("ck.safetensors"), 4, q, mlp_names, wrong), "optimizer over 4 parameters");
  em_tensor *small[4] = {em_zeros(EM_F32, EM_SHAPE(16, 7)), q[1], q[2], q[3]};
  EXPECT_ERROR((void *)(intptr_t)em_checkpoint_load(path_in("ck.safetensors"), 4, small, mlp_names, NULL),
               "tensor 'l1.weight' is f32[16,8] in the file but f32[16,7] here");
  etest_expect_same_bits(before, q[0], "unchanged", __FILE__, __LINE__);
  em_optimizer_free(wrong);
  em_optimizer_free(oa);
  em_optimizer_free(ob);
  remove_dir();
}

ETEST(checkpoint, sgd_nesterov_resumes_bit_for_bit) { resume_bit_for_bit(false); }
ETEST(checkpoint, adamw_resumes_bit_for_bit) { resume_bit_for_bit(true); }
