/* runtime/data.c: reading data sets: IDX files (MNIST's format), NumPy .npy files, the
 * Fashion-MNIST files Debian installs, and a shuffling mini-batch iterator.
 *
 * IDX files are read through zlib's gzread, which passes uncompressed files through unchanged, so
 * one reader handles both .gz and raw files, told apart by content rather than by name. .npy
 * files are written as format 1.0 (what numpy.save writes for small headers) and read in
 * versions 1 to 3; only C-order little-endian arrays of Ember's dtypes are accepted, with an
 * error naming what was found otherwise, never a silent reinterpretation. The iterator shuffles
 * with Fisher-Yates driven by Philox keyed by (seed, epoch), so an epoch's order depends on
 * nothing else: not on the global generator, not on how many epochs ran before. */
#include "rt.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* ---- IDX ---- */

/* Reads exactly n bytes; gzread takes an unsigned count, so big reads go in 1 GiB pieces. */
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

static uint32_t be32(const unsigned char *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static void byteswap(char *p, size_t n, size_t size) {
  for (size_t i = 0; i < n; i++, p += size)
    for (size_t j = 0; j < size / 2; j++) {
      char t = p[j];
      p[j] = p[size - 1 - j];
      p[size - 1 - j] = t;
    }
}

/* The body of em_load_idx, returning a caller-owned tensor so that the Fashion-MNIST loader can
 * drop what it loaded when a later file fails, instead of leaving it in the caller's scope. */
/* The uncompressed bytes of f (opened by gzopen, its header read), when they can be known: the
 * file's size for a plain file; for a gzip file (one member, as gzip writes them) the trailer's
 * ISIZE, the size mod 2^32, which is the size itself when the file is small enough that it
 * cannot inflate past 4 GiB (deflate expands at most about 1032 times). */
/* The size of an uncompressed file (false when it is not a regular file). */
static bool file_bytes(const char *path, uint64_t *bytes) {
  struct stat st;
  if (stat(path, &st) || !S_ISREG(st.st_mode)) return false;
  return *bytes = (uint64_t)st.st_size, true;
}

/* Inflates up to need bytes of a gzip stream into a buffer that grows (from 1 MiB, doubling)
 * with what arrives: a stream's inflated size is known only by inflating it (its ISIZE trailer
 * is absent from a cut stream and can be forged), so a 17-byte stream claiming a huge shape
 * allocates no more than about twice what it really holds (fuzz/fuzz_idx found the
 * over-allocation: issue 17). Returns the buffer (*got bytes; caller frees) or NULL when out of
 * memory. */
static char *inflate_staged(gzFile f, size_t need, size_t *got) {
  size_t cap = need < ((size_t)1 << 20) ? need : ((size_t)1 << 20);
  char *buf = malloc(cap ? cap : 1);
  *got = 0;
  while (buf && *got < need) {
    if (*got == cap) {
      size_t grown = cap > need / 2 ? need : 2 * cap;
      char *b = realloc(buf, grown);
      if (!b) return free(buf), NULL;
      buf = b, cap = grown;
    }
    size_t want = cap - *got;
    int r = gzread(f, buf + *got, want > (1u << 30) ? (1u << 30) : (unsigned)want);
    if (r <= 0) break;
    *got += (size_t)r;
  }
  return buf;
}

static em_tensor *idx_read(const char *path, const char *name, em_site site) {
  if (!path) return rt_error(site, name, "path is NULL");
  errno = 0;
  gzFile f = gzopen(path, "rb");
  /* gzopen leaves errno 0 when only its own state could not be allocated. */
  if (!f) return rt_error(site, name, "cannot open %s: %s", path, errno ? strerror(errno) : "out of memory");
  unsigned char h[4], d[4];
  em_tensor *t = NULL;
  if (!read_all(f, h, 4) || h[0] || h[1] || h[3] < 1 || h[3] > EM_MAX_DIMS) {
    rt_error(site, name, "%s is not an IDX file (bad magic; expected 00 00 type ndim with 1 to %d dims)", path,
             EM_MAX_DIMS);
    goto out;
  }
  int ndim = h[3];
  int64_t sizes[EM_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    if (!read_all(f, d, 4)) {
      rt_error(site, name, "%s is truncated in its header", path);
      goto out;
    }
    /* IDX sizes are unsigned 32-bit, so any value is a valid int64_t size. */
    sizes[i] = be32(d);
  }
  em_dtype dt;
  size_t fsize; /* bytes per element in the file */
  switch (h[2]) {
  case 0x08: dt = EM_U8, fsize = 1; break;
  case 0x09: dt = EM_I32, fsize = 1; break;
  case 0x0B: dt = EM_I32, fsize = 2; break;
  case 0x0C: dt = EM_I32, fsize = 4; break;
  case 0x0D: dt = EM_F32, fsize = 4; break;
  case 0x0E: dt = EM_F64, fsize = 8; break;
  default: rt_error(site, name, "%s has unknown IDX element type 0x%02x", path, h[2]); goto out;
  }
  /* the data the header promises must be in the file before anything is allocated (a 13-byte
   * file claiming [65535, 65535] allocated 4 GiB first: issue 17) */
  int64_t need_bytes; /* numel (ir_shape_fits bounds it) times the file's element size */
  uint64_t need = ir_shape_fits(ndim, sizes) && ir_mul_ok(ir_numel(ndim, sizes), (int64_t)fsize, &need_bytes)
                      ? (uint64_t)need_bytes : UINT64_MAX, have = 0;
  if (need > SIZE_MAX / 2) {
    rt_error(site, name, "%s: its header's shape is too large to address", path);
    goto out;
  }
  /* the data the header promises must be in the file before the tensor is allocated: an
   * uncompressed file's size says so; a gzip stream is inflated into a growing buffer first */
  char *staged = NULL;
  size_t got = 0;
  if (gzdirect(f)) {
    if (file_bytes(path, &have) && need > have - (uint64_t)(4 + 4 * ndim)) {
      rt_error(site, name, "%s is truncated: its header promises %llu bytes of data, the file holds %llu", path,
               (unsigned long long)need, (unsigned long long)(have - (uint64_t)(4 + 4 * ndim)));
      goto out;
    }
  } else {
    if (!(staged = inflate_staged(f, (size_t)need, &got))) {
      rt_error(site, name, "out of memory reading %s", path);
      goto out;
    }
    if (got < need) {
      int zerr;
      const char *msg = gzerror(f, &zerr);
      if (zerr != Z_OK && zerr != Z_BUF_ERROR)
        rt_error(site, name, "reading %s failed: %s", path, zerr == Z_ERRNO ? strerror(errno) : msg);
      else
        rt_error(site, name, "%s is truncated: its header promises %llu bytes of data, the stream holds %zu", path,
                 (unsigned long long)need, got);
      free(staged);
      goto out;
    }
  }
  t = rt_new(dt, ndim, sizes, name, site);
  if (!t) {
    free(staged);
    goto out;
  }
  size_t n = (size_t)t->numel;
  char *data = rt_data(t);
  if (staged) memcpy(data, staged, n * fsize), free(staged);
  else if (!read_all(f, data, n * fsize)) {
    int zerr;
    const char *msg = gzerror(f, &zerr);
    if (zerr != Z_OK && zerr != Z_BUF_ERROR)
      rt_error(site, name, "reading %s failed: %s", path, zerr == Z_ERRNO ? strerror(errno) : msg);
    else
      rt_error(site, name, "%s is truncated: expected %zu bytes of data", path, n * fsize);
    em_release(t);
    t = NULL;
    goto out;
  }
  if (fsize > 1) byteswap(data, n, fsize); /* IDX is big-endian */
  if (fsize < ir_dtype(dt)->size) {        /* widen i8 / i16 in place, from the end so nothing is overwritten unread */
    for (size_t i = n; i-- > 0;) {
      int16_t v16 = 0;
      if (fsize == 2) memcpy(&v16, data + 2 * i, 2);
      int32_t v = fsize == 1 ? (int8_t)data[i] : v16;
      memcpy(data + 4 * i, &v, 4);
    }
  }
out:
  gzclose(f);
  return t;
}

em_tensor *em_load_idx_at(const char *path, em_site site) {
  return rt_scope_add(idx_read(path, "em_load_idx", site), "em_load_idx", site);
}

/* ---- .npy ---- */

static const struct {
  const char *descr;
  em_dtype dt;
} npy_types[] = {
    {"<f4", EM_F32}, {"<f8", EM_F64}, {"<i4", EM_I32}, {"<i8", EM_I64}, {"|u1", EM_U8}, {"|b1", EM_BOOL},
};
#define N_NPY_TYPES (sizeof npy_types / sizeof npy_types[0])

bool em_save_npy_at(const char *path, em_tensor *t, em_site site) {
  static const char name[] = "em_save_npy";
  if (!t) return false;
  if (!path) return rt_error(site, name, "path is NULL"), false;
  const char *descr = NULL;
  for (size_t i = 0; i < N_NPY_TYPES; i++)
    if (npy_types[i].dt == t->dtype) descr = npy_types[i].descr;
  char b[128];
  if (!descr) return rt_error(site, name, ".npy has no type for %s", rt_fmt(b, sizeof b, t)), false;
  /* The header is a Python dict literal; numpy pads it with spaces and a final newline so that
   * the data starts at a multiple of 64 bytes. Eight 19-digit sizes fit easily in 512 bytes. */
  char header[512];
  int k = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < t->ndim; i++)
    k += snprintf(header + k, sizeof header - (size_t)k, "%lld%s", (long long)t->sizes[i],
                  t->ndim == 1 ? "," : i + 1 < t->ndim ? ", " : "");
  k += snprintf(header + k, sizeof header - (size_t)k, "), }");
  int total = 10 + k + 1, padded = (total + 63) / 64 * 64;
  memset(header + k, ' ', (size_t)(padded - total));
  header[padded - 10 - 1] = '\n';
  size_t bytes = (size_t)t->numel * ir_dtype(t->dtype)->size;
  /* em_to_buffer gives the row-major values whatever t's strides are. */
  char *buf = rt_alloc(bytes ? bytes : 1, 64);
  if (!buf) return rt_error(site, name, "out of memory staging %s (%zu bytes)", rt_fmt(b, sizeof b, t), bytes), false;
  if (!em_to_buffer_at(t, t->dtype, buf, bytes, site)) {
    rt_free(buf);
    return false;
  }
  FILE *f = fopen(path, "wb");
  if (!f) {
    rt_error(site, name, "cannot write %s: %s", path, strerror(errno));
    rt_free(buf);
    return false;
  }
  unsigned hl = (unsigned)(padded - 10);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
  bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, hl, f) == hl && fwrite(buf, 1, bytes, f) == bytes;
  int saved = errno;
  if (fclose(f) != 0 && ok) ok = false, saved = errno;
  if (!ok) {
    rt_error(site, name, "writing %s failed: %s", path, strerror(saved));
    remove(path); /* a partial file would later read as "truncated"; better none at all */
  }
  rt_free(buf);
  return ok;
}

/* The value of key in a .npy header dict: a pointer just after the ':' and any spaces, or NULL.
 * numpy writes 'key', other writers sometimes "key"; both are accepted. */
static const char *npy_value(const char *header, const char *key) {
  char q[2][40];
  snprintf(q[0], sizeof q[0], "'%s'", key);
  snprintf(q[1], sizeof q[1], "\"%s\"", key);
  for (int i = 0; i < 2; i++) {
    const char *p = strstr(header, q[i]);
    if (!p) continue;
    p += strlen(q[i]);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
  }
  return NULL;
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
    rt_error(site, name, "%s is not a .npy file (bad magic or format version)", path);
    goto out;
  }
  /* Version 1 has a 2-byte header length, versions 2 and 3 a 4-byte one (3 only adds UTF-8). */
  size_t hlen;
  if (pre[6] == 1) {
    if (fread(pre + 8, 1, 2, f) != 2) goto truncated;
    hlen = pre[8] | (size_t)pre[9] << 8;
  } else {
    if (fread(pre + 8, 1, 4, f) != 4) goto truncated;
    hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  }
  if (hlen > (1u << 20)) {
    rt_error(site, name, "%s: header of %zu bytes is implausibly large", path, hlen);
    goto out;
  }
  if (!(header = rt_alloc(hlen + 1, 16))) {
    rt_error(site, name, "out of memory reading the header of %s", path);
    goto out;
  }
  if (fread(header, 1, hlen, f) != hlen) goto truncated;
  header[hlen] = 0;
  const char *d = npy_value(header, "descr"), *fo = npy_value(header, "fortran_order"),
             *sh = npy_value(header, "shape");
  if (!d || !fo || !sh) {
    rt_error(site, name, "%s: header lacks descr, fortran_order or shape: %s", path, header);
    goto out;
  }
  em_dtype dt = EM_DTYPE_COUNT;
  char quote = *d;
  if (quote == '\'' || quote == '"')
    for (size_t i = 0; i < N_NPY_TYPES; i++)
      if (!strncmp(d + 1, npy_types[i].descr, 3) && d[4] == quote) dt = npy_types[i].dt;
  if (dt == EM_DTYPE_COUNT) {
    int len = 0;
    while (d[len] && d[len] != ',' && d[len] != '}' && len < 40) len++;
    rt_error(site, name, "%s: unsupported dtype %.*s (supported: <f4 <f8 <i4 <i8 |u1 |b1)", path, len, d);
    goto out;
  }
  if (strncmp(fo, "False", 5)) {
    rt_error(site, name, "%s: Fortran-order arrays are not supported (save with numpy.ascontiguousarray)", path);
    goto out;
  }
  if (*sh != '(') {
    rt_error(site, name, "%s: bad shape in header", path);
    goto out;
  }
  /* a Python tuple of sizes, as numpy writes it: (), (3,), (2, 3); "(2 3)" and "(2,,,3)" are
   * not (issue 17: both were read as (2, 3)) */
  int ndim = 0;
  int64_t sizes[EM_MAX_DIMS];
  const char *p = sh + 1;
  while (*p == ' ') p++;
  while (*p != ')') {
    if (ndim == EM_MAX_DIMS || *p < '0' || *p > '9') {
      rt_error(site, name, "%s: bad shape in header (a tuple of at most %d non-negative sizes): %s", path, EM_MAX_DIMS, sh);
      goto out;
    }
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno == ERANGE) {
      rt_error(site, name, "%s: size in shape is too large", path);
      goto out;
    }
    while (*end == 'L') end++; /* Python 2 wrote long sizes as 3L */
    sizes[ndim++] = v;
    p = end;
    while (*p == ' ') p++;
    if (*p == ',') {
      p++;
      while (*p == ' ') p++;
    } else if (*p != ')') {
      rt_error(site, name, "%s: bad shape in header (a tuple of at most %d non-negative sizes): %s", path, EM_MAX_DIMS, sh);
      goto out;
    }
  }
  /* the data must be in the file before it is allocated */
  size_t need_bytes;
  uint64_t need = ir_nbytes(dt, ndim, sizes, 0, &need_bytes) ? need_bytes : UINT64_MAX;
  struct stat st;
  long at = ftell(f);
  if (at >= 0 && !fstat(fileno(f), &st) && S_ISREG(st.st_mode) && need > (uint64_t)(st.st_size - at)) goto truncated;
  t = rt_new(dt, ndim, sizes, name, site);
  if (!t) goto out;
  if (fread(rt_data(t), 1, t->storage->bytes, f) != t->storage->bytes) {
    em_release(t);
    t = NULL;
    goto truncated;
  }
  if (dt == EM_BOOL) /* Ember's bools are 0 or 1; a foreign writer's nonzero byte means true */
    for (size_t i = 0; i < t->storage->bytes; i++) rt_data(t)[i] = rt_data(t)[i] != 0;
  if (rt_default_device() == EM_CUDA) { /* a factory: it creates on the default device */
    em_tensor *moved = rt_to_device(t, EM_CUDA, name, site);
    em_release(t);
    t = moved;
  }
  goto out;
truncated:
  if (ferror(f))
    rt_error(site, name, "reading %s failed: %s", path, strerror(errno));
  else
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
  static const char *const files[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                       "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
  /* Loaded caller-owned and handed to the scope only once all four are good, so a failure
   * leaves nothing allocated. */
  em_tensor *t[4] = {0};
  bool ok = true;
  char path[4096], b[128];
  for (int i = 0; ok && i < 4; i++) {
    if (snprintf(path, sizeof path, "%s/%s", dir, files[i]) >= (int)sizeof path) {
      rt_error(site, name, "directory name is too long: %s", dir);
      ok = false;
      break;
    }
    /* Probe first so that a missing file gets the install hint rather than a bare errno. */
    FILE *probe = fopen(path, "rb");
    if (!probe) {
      rt_error(site, name, "cannot open %s: %s; install Debian's dataset-fashion-mnist package", path,
               strerror(errno));
      ok = false;
      break;
    }
    fclose(probe);
    ok = (t[i] = idx_read(path, name, site)) != NULL;
    if (!ok) break;
    /* images u8 [N, 28, 28], labels u8 [N] with N matching its images */
    bool images = i % 2 == 0;
    bool shape_ok = t[i]->dtype == EM_U8 &&
                    (images ? t[i]->ndim == 3 && t[i]->sizes[1] == 28 && t[i]->sizes[2] == 28
                            : t[i]->ndim == 1 && t[i]->sizes[0] == t[i - 1]->sizes[0]);
    if (!shape_ok) {
      rt_error(site, name, "%s holds %s, expected %s", path, rt_fmt(b, sizeof b, t[i]),
               images ? "u8[N,28,28]" : "u8[N] matching its images");
      ok = false;
    }
  }
  for (int i = 0; ok && rt_default_device() == EM_CUDA && i < 4; i++) { /* factories create on the default device */
    em_tensor *moved = rt_to_device(t[i], EM_CUDA, name, site);
    em_release(t[i]);
    ok = (t[i] = moved) != NULL;
  }
  if (!ok) {
    for (int i = 0; i < 4; i++) em_release(t[i]);
    return false;
  }
  /* Should the scope fail to grow part-way, rt_scope_add has released that tensor and those
   * already handed over go with the caller's scope; the struct still says "failed". */
  for (int i = 0; i < 4; i++) {
    if (!rt_scope_add(t[i], name, site)) {
      for (int j = i + 1; j < 4; j++) em_release(t[j]);
      return false;
    }
  }
  d->train_images = t[0], d->train_labels = t[1], d->test_images = t[2], d->test_labels = t[3];
  return true;
}

/* ---- mini-batches ---- */

struct em_batch_iter {
  int64_t n, batch, pos, epoch;
  uint64_t seed;
  bool shuffle, drop_last;
  int64_t *order; /* [n] this epoch's permutation */
};

/* A uniform integer in [0, bound) from the Philox stream (counter (k, epoch), key seed), by
 * Lemire's multiply-and-reject ("Fast random integer generation in an interval", 2019): the
 * rejection removes the bias a plain modulo would have, and the division runs only when the
 * low word falls in the short rejection zone. */
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

/* Sets order[0..n) to epoch's permutation: the identity, Fisher-Yates shuffled when asked. The
 * iterator and the loader (loader.c) share it, so their batches are the same. */
void rt_batch_order(int64_t *order, int64_t n, bool shuffle, uint64_t seed, uint64_t epoch) {
  for (int64_t i = 0; i < n; i++) order[i] = i;
  if (!shuffle) return;
  uint64_t k = 0;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)bounded(seed, epoch, &k, (uint64_t)i + 1);
    int64_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

static void reorder(em_batch_iter *it) { rt_batch_order(it->order, it->n, it->shuffle, it->seed, (uint64_t)it->epoch); }

/* No em_site here (the public signature has none), so bad arguments are reported by the NULL
 * result alone, as allocation failure is. */
em_batch_iter *em_batch_iter_new_at(int64_t n, int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last,
                                    em_site site) {
  static const char name[] = "em_batch_iter_new";
  if (n < 0 || batch_size < 1)
    return rt_error(site, name, "needs n >= 0 and batch_size >= 1, got %lld and %lld", (long long)n, (long long)batch_size);
  if ((uint64_t)n > (uint64_t)PTRDIFF_MAX / sizeof(int64_t))
    return rt_error(site, name, "n = %lld examples: their order would not fit in memory", (long long)n);
  em_batch_iter *it = rt_alloc(sizeof *it, 16);
  if (!it) return rt_error(site, name, "out of memory");
  *it = (em_batch_iter){.n = n, .batch = batch_size, .seed = seed, .shuffle = shuffle, .drop_last = drop_last};
  it->order = rt_alloc(sizeof(int64_t) * (size_t)(n ? n : 1), 64);
  if (!it->order) {
    rt_free(it);
    return rt_error(site, name, "out of memory for the order of %lld examples (%lld bytes)", (long long)n,
                    (long long)(n * (int64_t)sizeof(int64_t)));
  }
  reorder(it);
  return it;
}

int64_t em_batch_iter_len(const em_batch_iter *it) {
  if (!it) return 0;
  return it->drop_last ? it->n / it->batch : it->n / it->batch + (it->n % it->batch != 0);
}

em_tensor *em_batch_iter_next_at(em_batch_iter *it, em_site site) {
  static const char name[] = "em_batch_iter_next";
  if (!it) return NULL;
  int64_t left = it->n - it->pos;
  if (left <= 0 || (it->drop_last && left < it->batch)) {
    it->pos = 0;
    it->epoch++;
    reorder(it);
    return NULL;
  }
  int64_t b = left < it->batch ? left : it->batch;
  em_tensor *t = rt_new(EM_I64, 1, &b, name, site);
  /* On failure the position stays, so a retry after the error yields the same batch. */
  if (!t) return NULL;
  memcpy(rt_data(t), it->order + it->pos, sizeof(int64_t) * (size_t)b);
  if (rt_default_device() == EM_CUDA) { /* a factory: on the default device */
    em_tensor *moved = rt_to_device(t, EM_CUDA, name, site);
    em_release(t);
    if (!(t = moved)) return NULL;
  }
  if (!rt_scope_add(t, name, site)) return NULL;
  it->pos += b;
  return t;
}

void em_batch_iter_free(em_batch_iter *it) {
  if (!it) return;
  rt_free(it->order);
  rt_free(it);
}
