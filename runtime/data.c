/* runtime/data.c: reading data sets: IDX files (MNIST's format), NumPy .npy files, the
 * Fashion-MNIST files Debian installs, and a shuffling mini-batch iterator.
 *
 * Files are read through zlib's gzread, which passes uncompressed files through unchanged, so
 * one reader handles both .gz and raw files. The iterator shuffles with Fisher-Yates driven by
 * the Philox generator keyed by (seed, epoch), so an epoch's order depends on nothing else. */
#include "rt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static bool read_all(gzFile f, void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
    int got = gzread(f, p, chunk);
    if (got <= 0) return false;
    p += got;
    n -= (size_t)got;
  }
  return true;
}

static uint32_t be32(const unsigned char *b) { return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]; }

static void byteswap(char *p, size_t n, size_t size) {
  for (size_t i = 0; i < n; i++, p += size)
    for (size_t j = 0; j < size / 2; j++) {
      char t = p[j];
      p[j] = p[size - 1 - j];
      p[size - 1 - j] = t;
    }
}

em_tensor *em_load_idx_at(const char *path, em_site site) {
  static const char name[] = "em_load_idx";
  if (!path) return rt_error(site, name, "path is NULL");
  gzFile f = gzopen(path, "rb");
  if (!f) return rt_error(site, name, "cannot open %s: %s", path, strerror(errno ? errno : ENOENT));
  unsigned char h[4], d[4];
  em_tensor *t = NULL;
  if (!read_all(f, h, 4) || h[0] || h[1] || h[3] < 1 || h[3] > EM_MAX_DIMS) {
    rt_error(site, name, "%s is not an IDX file (bad magic)", path);
    goto out;
  }
  int ndim = h[3];
  int64_t sizes[EM_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    if (!read_all(f, d, 4)) {
      rt_error(site, name, "%s is truncated in its header", path);
      goto out;
    }
    sizes[i] = be32(d);
  }
  em_dtype dt;
  size_t fsize;
  switch (h[2]) {
  case 0x08: dt = EM_U8, fsize = 1; break;
  case 0x09: dt = EM_I32, fsize = 1; break;
  case 0x0B: dt = EM_I32, fsize = 2; break;
  case 0x0C: dt = EM_I32, fsize = 4; break;
  case 0x0D: dt = EM_F32, fsize = 4; break;
  case 0x0E: dt = EM_F64, fsize = 8; break;
  default: rt_error(site, name, "%s has unknown IDX element type 0x%02x", path, h[2]); goto out;
  }
  t = rt_new(dt, ndim, sizes, name, site);
  if (!t) goto out;
  size_t n = (size_t)t->numel;
  char *data = rt_data(t);
  if (!read_all(f, data, n * fsize)) {
    rt_error(site, name, "%s is truncated: expected %zu bytes of data", path, n * fsize);
    em_release(t);
    t = NULL;
    goto out;
  }
  if (fsize > 1) byteswap(data, n, fsize); /* IDX is big-endian */
  if (fsize < ir_dtype(dt)->size) {        /* widen i8 / i16 in place, from the end */
    for (size_t i = n; i-- > 0;) {
      int32_t v = fsize == 1 ? (int8_t)data[i] : ((int16_t *)data)[i];
      ((int32_t *)data)[i] = v;
    }
  }
out:
  gzclose(f);
  return rt_scope_add(t, name, site);
}

/* ---- .npy ---- */

static const struct { const char *descr; em_dtype dt; } npy_types[] = {
    {"<f4", EM_F32}, {"<f8", EM_F64}, {"<i4", EM_I32}, {"<i8", EM_I64}, {"|u1", EM_U8}, {"|b1", EM_BOOL},
};

bool em_save_npy_at(const char *path, em_tensor *t, em_site site) {
  static const char name[] = "em_save_npy";
  if (!t) return false;
  const char *descr = NULL;
  for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
    if (npy_types[i].dt == t->dtype) descr = npy_types[i].descr;
  char b[128];
  if (!descr) return rt_error(site, name, ".npy has no type for %s", rt_fmt(b, sizeof b, t)), false;
  char header[512];
  int k = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < t->ndim; i++) k += snprintf(header + k, sizeof header - (size_t)k, "%lld,%s", (long long)t->sizes[i], i + 1 < t->ndim ? " " : "");
  k += snprintf(header + k, sizeof header - (size_t)k, "), }");
  int total = 10 + k + 1, padded = (total + 63) / 64 * 64; /* header padded to 64 bytes, ends with \n */
  memset(header + k, ' ', (size_t)(padded - total));
  header[padded - 10 - 1] = '\n';
  size_t bytes = (size_t)t->numel * ir_dtype(t->dtype)->size;
  char *buf = rt_alloc(bytes ? bytes : 1, 64);
  if (!buf) return rt_error(site, name, "out of memory"), false;
  bool ok = em_to_buffer_at(t, t->dtype, buf, bytes, site);
  FILE *f = ok ? fopen(path, "wb") : NULL;
  if (ok && !f) {
    rt_error(site, name, "cannot write %s: %s", path, strerror(errno));
    ok = false;
  }
  if (f) {
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)((padded - 10) & 0xff), (unsigned char)((padded - 10) >> 8)};
    ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, (size_t)(padded - 10), f) == (size_t)(padded - 10) &&
         fwrite(buf, 1, bytes, f) == bytes;
    ok = (fclose(f) == 0) && ok;
    if (!ok) rt_error(site, name, "writing %s failed: %s", path, strerror(errno));
  }
  rt_free(buf);
  return ok;
}

em_tensor *em_load_npy_at(const char *path, em_site site) {
  static const char name[] = "em_load_npy";
  if (!path) return rt_error(site, name, "path is NULL");
  FILE *f = fopen(path, "rb");
  if (!f) return rt_error(site, name, "cannot open %s: %s", path, strerror(errno));
  unsigned char pre[12];
  em_tensor *t = NULL;
  char *header = NULL;
  if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) || pre[6] < 1 || pre[6] > 3) {
    rt_error(site, name, "%s is not a .npy file", path);
    goto out;
  }
  size_t hlen;
  if (pre[6] == 1) {
    if (fread(pre + 8, 1, 2, f) != 2) goto truncated;
    hlen = pre[8] | (size_t)pre[9] << 8;
  } else {
    if (fread(pre + 8, 1, 4, f) != 4) goto truncated;
    hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  }
  if (hlen > 1 << 20 || !(header = rt_alloc(hlen + 1, 16))) {
    rt_error(site, name, "%s: header too large", path);
    goto out;
  }
  if (fread(header, 1, hlen, f) != hlen) goto truncated;
  header[hlen] = 0;
  const char *d = strstr(header, "'descr'"), *fo = strstr(header, "'fortran_order'"), *sh = strstr(header, "'shape'");
  if (!d || !fo || !sh) {
    rt_error(site, name, "%s: header lacks descr, fortran_order or shape", path);
    goto out;
  }
  em_dtype dt = EM_DTYPE_COUNT;
  for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
    const char *q = strchr(d + 7, '\'');
    if (q && !strncmp(q + 1, npy_types[i].descr, 3) && q[4] == '\'') dt = npy_types[i].dt;
  }
  if (dt == EM_DTYPE_COUNT) {
    rt_error(site, name, "%s: unsupported dtype (supported: <f4 <f8 <i4 <i8 |u1 |b1)", path);
    goto out;
  }
  const char *fv = strchr(fo + 15, ':');
  while (fv && (*fv == ':' || *fv == ' ')) fv++;
  if (!fv || strncmp(fv, "False", 5)) {
    rt_error(site, name, "%s: Fortran-order arrays are not supported", path);
    goto out;
  }
  const char *p = strchr(sh, '(');
  int ndim = 0;
  int64_t sizes[EM_MAX_DIMS];
  for (p = p ? p + 1 : NULL; p && *p && *p != ')';) {
    while (*p == ' ' || *p == ',') p++;
    if (*p == ')') break;
    if (ndim == EM_MAX_DIMS || *p < '0' || *p > '9') {
      rt_error(site, name, "%s: bad shape in header", path);
      goto out;
    }
    sizes[ndim++] = strtoll(p, (char **)&p, 10);
  }
  t = rt_new(dt, ndim, sizes, name, site);
  if (!t) goto out;
  if (fread(rt_data(t), 1, t->storage->bytes, f) != t->storage->bytes) {
    em_release(t);
    t = NULL;
    goto truncated;
  }
  goto out;
truncated:
  rt_error(site, name, "%s is truncated", path);
out:
  rt_free(header);
  fclose(f);
  return rt_scope_add(t, name, site);
}

/* ---- Fashion-MNIST ---- */

bool em_fashion_mnist_load_at(em_fashion_mnist *d, const char *dir, em_site site) {
  static const char name[] = "em_fashion_mnist_load";
  if (!d) return rt_error(site, name, "d is NULL"), false;
  memset(d, 0, sizeof *d);
  if (!dir) dir = "/usr/share/datasets/fashion-mnist";
  static const char *files[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                                 "t10k-labels-idx1-ubyte.gz"};
  em_tensor *t[4] = {0};
  for (int i = 0; i < 4; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    FILE *probe = fopen(path, "rb");
    if (!probe) {
      return rt_error(site, name, "cannot open %s: %s; install Debian's dataset-fashion-mnist package", path,
                      strerror(errno)), false;
    }
    fclose(probe);
    if (!(t[i] = em_load_idx_at(path, site))) return false;
  }
  char b[128];
  if (t[0]->ndim != 3 || t[1]->ndim != 1 || t[0]->sizes[0] != t[1]->sizes[0] || t[2]->ndim != 3 ||
      t[3]->ndim != 1 || t[2]->sizes[0] != t[3]->sizes[0])
    return rt_error(site, name, "unexpected shapes in %s (train images %s)", dir, rt_fmt(b, sizeof b, t[0])), false;
  d->train_images = t[0], d->train_labels = t[1], d->test_images = t[2], d->test_labels = t[3];
  return true;
}

/* ---- mini-batches ---- */

struct em_batch_iter {
  int64_t n, batch, pos, epoch;
  uint64_t seed;
  bool shuffle, drop_last;
  int64_t *order;
};

/* Uniform integer in [0, bound) from the Philox stream at counter (epoch, k), by rejection
 * (Lemire's method without the division in the common case). */
static uint64_t bounded(uint64_t seed, uint64_t epoch, uint64_t *k, uint64_t bound) {
  for (;;) {
    uint32_t w[4];
    prim_philox((*k)++, epoch, seed, w);
    uint64_t r = (uint64_t)w[0] << 32 | w[1];
    unsigned __int128 m = (unsigned __int128)r * bound;
    uint64_t low = (uint64_t)m;
    if (low >= bound || low >= (-bound) % bound) return (uint64_t)(m >> 64);
  }
}

static void shuffle(em_batch_iter *it) {
  for (int64_t i = 0; i < it->n; i++) it->order[i] = i;
  if (!it->shuffle) return;
  uint64_t k = 0;
  for (int64_t i = it->n - 1; i > 0; i--) {
    int64_t j = (int64_t)bounded(it->seed, (uint64_t)it->epoch, &k, (uint64_t)i + 1);
    int64_t t = it->order[i];
    it->order[i] = it->order[j];
    it->order[j] = t;
  }
}

em_batch_iter *em_batch_iter_new(int64_t n, int64_t batch_size, bool shuf, uint64_t seed, bool drop_last) {
  if (n < 0 || batch_size < 1) return NULL;
  em_batch_iter *it = rt_alloc(sizeof *it, 16);
  if (!it) return NULL;
  *it = (em_batch_iter){.n = n, .batch = batch_size, .seed = seed, .shuffle = shuf, .drop_last = drop_last};
  it->order = rt_alloc(sizeof(int64_t) * (size_t)(n ? n : 1), 16);
  if (!it->order) {
    rt_free(it);
    return NULL;
  }
  shuffle(it);
  return it;
}

int64_t em_batch_iter_len(const em_batch_iter *it) {
  if (!it) return 0;
  return it->drop_last ? it->n / it->batch : (it->n + it->batch - 1) / it->batch;
}

em_tensor *em_batch_iter_next_at(em_batch_iter *it, em_site site) {
  if (!it) return NULL;
  int64_t left = it->n - it->pos;
  if (left <= 0 || (it->drop_last && left < it->batch)) {
    it->pos = 0;
    it->epoch++;
    shuffle(it);
    return NULL;
  }
  int64_t b = left < it->batch ? left : it->batch;
  em_tensor *t = rt_new(EM_I64, 1, &b, "em_batch_iter_next", site);
  if (!t) return NULL;
  memcpy(rt_data(t), it->order + it->pos, sizeof(int64_t) * (size_t)b);
  it->pos += b;
  return rt_scope_add(t, "em_batch_iter_next", site);
}

void em_batch_iter_free(em_batch_iter *it) {
  if (!it) return;
  rt_free(it->order);
  rt_free(it);
}
