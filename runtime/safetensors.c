/* runtime/safetensors.c: the safetensors checkpoint format (Hugging Face), read and written.
 *
 * A file is an 8-byte little-endian unsigned header size N, N bytes of JSON, then one byte
 * buffer. The JSON object maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
 * end]} (byte offsets into the buffer) and may hold "__metadata__", an object of string values.
 * The reference implementation (the `safetensors` Rust crate behind the Python package) refuses
 * a header over 100,000,000 bytes, and requires the tensors' byte ranges, sorted, to tile the
 * buffer exactly: no gap, no overlap, nothing after the last. Every such limit is checked here
 * before anything is allocated for the tensors, and the JSON is parsed by cJSON (Debian's
 * libcjson), so a malformed file is an error naming the file and what is wrong with it.
 *
 * Loading maps the file (MAP_PRIVATE: a write into a loaded tensor changes this process's copy,
 * never the file) and a tensor whose bytes are aligned to its element size is a view of the
 * mapping, with no copy; the mapping lives until its last tensor and the handle are gone. The
 * Python writer pads the header to 8 bytes and orders tensors by decreasing element size, so all
 * of its tensors are aligned; Ember writes the same way. Unaligned ones are copied.
 *
 * Writing goes to a temporary file in the same directory, renamed over the target when
 * complete, so an interrupted checkpoint never destroys the previous one. */
#define _POSIX_C_SOURCE 200809L
#include "rt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER 100000000ull   /* the reference implementation's limit */
#define MAX_EXACT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact doubles */

/* The format's dtype names; ember -1 where Ember has no such dtype (the file still loads, and
 * asking for that tensor is an error). */
static const struct {
  const char *name;
  int size;
  int ember;
} dtypes[] = {
    {"F32", 4, EM_F32}, {"F64", 8, EM_F64}, {"I32", 4, EM_I32}, {"I64", 8, EM_I64},  {"BOOL", 1, EM_BOOL},
    {"U8", 1, EM_U8},   {"F16", 2, EM_F16}, {"BF16", 2, EM_BF16}, {"I8", 1, -1},     {"I16", 2, -1},
    {"U16", 2, -1},     {"U32", 4, -1},     {"U64", 8, -1},       {"F8_E4M3", 1, -1}, {"F8_E5M2", 1, -1},
};
#define N_DTYPES (int)(sizeof dtypes / sizeof dtypes[0])

static const char *dtype_format_name(em_dtype dt) {
  for (int i = 0; i < N_DTYPES; i++)
    if (dtypes[i].ember == (int)dt) return dtypes[i].name;
  return NULL;
}

/* ---- the mapping, shared by the handle and every tensor that views it ---- */

typedef struct mapping {
  int64_t refs;
  void *base;
  size_t len;
} mapping;

static void mapping_release(void *ctx) {
  mapping *m = ctx;
  if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0) {
    munmap(m->base, m->len);
    rt_free(m);
  }
}

typedef struct entry {
  char *name;     /* borrowed from the JSON tree */
  int dtype;      /* index into dtypes[] */
  int ndim;
  int64_t sizes[EM_MAX_DIMS];
  uint64_t begin, end; /* byte range in the buffer */
  em_tensor *tensor;   /* made by the first em_safetensors_get (owned), else NULL */
} entry;

struct em_safetensors {
  char *path;
  mapping *map;
  const char *buffer; /* the byte buffer after the header, inside the mapping */
  cJSON *json;
  entry *entries;     /* in file order */
  int n;
  cJSON *metadata;    /* the "__metadata__" object (borrowed from json), or NULL */
};

void em_safetensors_close(em_safetensors *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) em_release(f->entries[i].tensor);
  rt_free(f->entries);
  cJSON_Delete(f->json);
  if (f->map) mapping_release(f->map);
  rt_free(f->path);
  rt_free(f);
}

static bool json_exact_uint(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return false;
  double d = v->valuedouble;
  if (!(d >= 0 && d <= MAX_EXACT) || d != floor(d)) return false;
  *out = (uint64_t)d;
  return true;
}

/* Checks one tensor's description; false with an error naming it. */
static bool parse_entry(em_safetensors *f, const cJSON *item, entry *e, uint64_t buffer_len, const char *op,
                        em_site site) {
  const char *p = f->path, *nm = item->string;
  if (!cJSON_IsObject(item)) return rt_error(site, op, "%s: tensor '%s' is not a JSON object", p, nm), false;
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return rt_error(site, op, "%s: tensor '%s' needs \"dtype\" (a string), \"shape\" (an array) and "
                    "\"data_offsets\" (two numbers)", p, nm), false;
  e->name = item->string;
  e->dtype = -1;
  for (int i = 0; i < N_DTYPES; i++)
    if (!strcmp(dt->valuestring, dtypes[i].name)) e->dtype = i;
  if (e->dtype < 0) return rt_error(site, op, "%s: tensor '%s' has unknown dtype \"%s\"", p, nm, dt->valuestring), false;
  e->ndim = cJSON_GetArraySize(shape);
  if (e->ndim > EM_MAX_DIMS)
    return rt_error(site, op, "%s: tensor '%s' has %d dims; Ember tensors have at most %d", p, nm, e->ndim, EM_MAX_DIMS),
           false;
  int64_t bytes = dtypes[e->dtype].size;
  int d = 0;
  for (const cJSON *s = shape->child; s; s = s->next, d++) {
    uint64_t v;
    if (!json_exact_uint(s, &v) || !ir_mul_ok(bytes, (int64_t)v, &bytes))
      return rt_error(site, op, "%s: tensor '%s': dim %d of its shape is not a size (a non-negative integer whose "
                      "byte count fits in 64 bits)", p, nm, d), false;
    e->sizes[d] = (int64_t)v;
  }
  if (!json_exact_uint(offs->child, &e->begin) || !json_exact_uint(offs->child->next, &e->end) || e->begin > e->end ||
      e->end > buffer_len)
    return rt_error(site, op, "%s: tensor '%s': data_offsets are not a range inside the %llu-byte data buffer", p, nm,
                    (unsigned long long)buffer_len), false;
  if (e->end - e->begin != (uint64_t)bytes)
    return rt_error(site, op, "%s: tensor '%s' is %s of %d dims, %lld bytes, but data_offsets [%llu, %llu] hold %llu",
                    p, nm, dtypes[e->dtype].name, e->ndim, (long long)bytes, (unsigned long long)e->begin,
                    (unsigned long long)e->end, (unsigned long long)(e->end - e->begin)), false;
  return true;
}

static int by_begin(const void *a, const void *b) {
  const entry *x = *(entry *const *)a, *y = *(entry *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}
static int by_name(const void *a, const void *b) {
  return strcmp((*(entry *const *)a)->name, (*(entry *const *)b)->name);
}

/* The ranges tile the buffer and names are unique; false with an error. order: scratch. */
static bool check_layout(em_safetensors *f, entry **order, uint64_t buffer_len, const char *op, em_site site) {
  for (int i = 0; i < f->n; i++) order[i] = &f->entries[i];
  qsort(order, (size_t)f->n, sizeof *order, by_name);
  for (int i = 1; i < f->n; i++)
    if (!strcmp(order[i - 1]->name, order[i]->name))
      return rt_error(site, op, "%s: tensor '%s' is described twice", f->path, order[i]->name), false;
  qsort(order, (size_t)f->n, sizeof *order, by_begin);
  uint64_t at = 0;
  for (int i = 0; i < f->n; i++) {
    if (order[i]->begin != at)
      return rt_error(site, op, "%s: tensor '%s' starts at byte %llu of the data buffer, where %s", f->path,
                      order[i]->name, (unsigned long long)order[i]->begin,
                      order[i]->begin < at ? "it overlaps the tensor before it" : "a gap is left before it"), false;
    at = order[i]->end;
  }
  if (at != buffer_len)
    return rt_error(site, op, "%s: the tensors cover %llu bytes of a %llu-byte data buffer", f->path,
                    (unsigned long long)at, (unsigned long long)buffer_len), false;
  return true;
}

/* Opens, maps and validates path. The whole handle is checked before it is returned. */
static em_safetensors *open_file(const char *path, const char *op, em_site site) {
  if (!path) return rt_error(site, op, "path is NULL");
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block the open */
  if (fd < 0) return rt_error(site, op, "cannot open %s: %s", path, strerror(errno));
  em_safetensors *f = NULL;
  struct stat st;
  unsigned char h8[8];
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    rt_error(site, op, "%s is not a regular file", path);
    goto fail;
  }
  uint64_t size = (uint64_t)st.st_size, n = 0;
  if (size < 8 || pread(fd, h8, 8, 0) != 8) {
    rt_error(site, op, "%s is not a safetensors file: %llu bytes, too short for the 8-byte header size", path,
             (unsigned long long)size);
    goto fail;
  }
  for (int i = 0; i < 8; i++) n |= (uint64_t)h8[i] << (8 * i);
  if (n > MAX_HEADER || n > size - 8) {
    rt_error(site, op, "%s: header size %llu %s", path, (unsigned long long)n,
             n > MAX_HEADER ? "exceeds the format's limit of 100000000 bytes" : "runs past the end of the file");
    goto fail;
  }
  if (!(f = rt_alloc(sizeof *f, 16))) goto oom;
  memset(f, 0, sizeof *f);
  size_t plen = strlen(path);
  if (!(f->path = rt_alloc(plen + 1, 16)) || !(f->map = rt_alloc(sizeof *f->map, 16))) goto oom;
  memcpy(f->path, path, plen + 1);
  void *base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) {
    rt_free(f->map), f->map = NULL;
    rt_error(site, op, "cannot map %s: %s", path, strerror(errno));
    goto fail;
  }
  *f->map = (mapping){.refs = 1, .base = base, .len = (size_t)size};
  close(fd), fd = -1;
  const char *json = (const char *)base + 8, *end = NULL;
  f->buffer = json + n;
  uint64_t buffer_len = size - 8 - n;
  f->json = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, false);
  if (!f->json || !cJSON_IsObject(f->json)) {
    rt_error(site, op, "%s: the header is not a JSON object (%s at byte %lld of it)", path,
             f->json ? "another value" : "a syntax error", (long long)((end ? end : cJSON_GetErrorPtr()) - json));
    goto fail;
  }
  for (; end < json + n; end++) /* the Python writer pads with spaces */
    if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
      rt_error(site, op, "%s: the header has bytes after its JSON object", path);
      goto fail;
    }
  int count = 0;
  for (const cJSON *it = f->json->child; it; it = it->next) count += strcmp(it->string, "__metadata__") != 0;
  if (!(f->entries = rt_alloc(sizeof(entry) * (size_t)(count ? count : 1), 16))) goto oom;
  memset(f->entries, 0, sizeof(entry) * (size_t)(count ? count : 1));
  for (const cJSON *it = f->json->child; it; it = it->next) {
    if (!strcmp(it->string, "__metadata__")) {
      if (f->metadata || !cJSON_IsObject(it)) {
        rt_error(site, op, "%s: \"__metadata__\" must be one object of strings", path);
        goto fail;
      }
      for (const cJSON *m = it->child; m; m = m->next)
        if (!cJSON_IsString(m)) {
          rt_error(site, op, "%s: \"__metadata__\" value '%s' is not a string", path, m->string);
          goto fail;
        }
      f->metadata = (cJSON *)it;
      continue;
    }
    if (!parse_entry(f, it, &f->entries[f->n], buffer_len, op, site)) goto fail;
    f->n++;
  }
  entry **order = rt_alloc(sizeof(entry *) * (size_t)(count ? count : 1), 16);
  if (!order) goto oom;
  bool laid_out = check_layout(f, order, buffer_len, op, site);
  rt_free(order);
  if (!laid_out) goto fail;
  return f;
oom:
  rt_error(site, op, "out of memory reading %s", path);
fail:
  if (fd >= 0) close(fd);
  em_safetensors_close(f);
  return NULL;
}

em_safetensors *em_load_safetensors_at(const char *path, em_site site) {
  return open_file(path, "em_load_safetensors", site);
}

em_safetensors *rt_safetensors_open(const char *path, const char *op, em_site site) {
  return open_file(path, op, site);
}

int em_safetensors_count(const em_safetensors *f) { return f ? f->n : 0; }

const char *em_safetensors_name(const em_safetensors *f, int i) {
  return f && i >= 0 && i < f->n ? f->entries[i].name : NULL;
}

const char *em_safetensors_metadata(const em_safetensors *f, const char *key) {
  if (!f || !key || !f->metadata) return NULL;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->metadata, key);
  return v ? v->valuestring : NULL;
}

static entry *find(const em_safetensors *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->entries[i].name, name)) return &f->entries[i];
  return NULL;
}

/* The CPU tensor of e, caller-owned: a view of the mapping when aligned, else a copy. */
static em_tensor *make_tensor(em_safetensors *f, entry *e, const char *op, em_site site) {
  em_dtype dt = (em_dtype)dtypes[e->dtype].ember;
  const char *data = f->buffer + e->begin;
  size_t bytes = (size_t)(e->end - e->begin);
  if (dt == EM_BOOL)
    for (size_t i = 0; i < bytes; i++)
      if ((unsigned char)data[i] > 1)
        return rt_error(site, op, "%s: bool tensor '%s' holds the byte %u at element %zu (bools are 0 or 1)", f->path,
                        e->name, (unsigned char)data[i], i);
  if ((uintptr_t)data % (uintptr_t)dtypes[e->dtype].size == 0) {
    __atomic_add_fetch(&f->map->refs, 1, __ATOMIC_RELAXED);
    em_tensor *t = rt_new_external(dt, e->ndim, e->sizes, NULL, 0, EM_CPU, (void *)data, bytes, mapping_release,
                                   f->map, op, site);
    if (!t) __atomic_sub_fetch(&f->map->refs, 1, __ATOMIC_RELAXED);
    return t;
  }
  em_tensor *t = rt_new(dt, e->ndim, e->sizes, op, site);
  if (t && bytes) memcpy(rt_data(t), data, bytes);
  return t;
}

bool rt_safetensors_find(const em_safetensors *f, const char *name, em_dtype *dt, int *ndim, int64_t *sizes) {
  entry *e = find(f, name);
  if (!e || dtypes[e->dtype].ember < 0) return false;
  *dt = (em_dtype)dtypes[e->dtype].ember;
  *ndim = e->ndim;
  memcpy(sizes, e->sizes, sizeof(int64_t) * (size_t)e->ndim);
  return true;
}

em_tensor *rt_safetensors_cpu(em_safetensors *f, const char *name, const char *op, em_site site) {
  entry *e = find(f, name);
  if (!e || dtypes[e->dtype].ember < 0) return rt_error(site, op, "%s has no readable tensor named '%s'", f->path, name);
  return make_tensor(f, e, op, site);
}

/* e's tensor on the default device, caller-owned; made once per handle and cached. */
static em_tensor *entry_tensor(em_safetensors *f, entry *e, const char *op, em_site site) {
  if (dtypes[e->dtype].ember < 0)
    return rt_error(site, op, "%s: tensor '%s' is %s, which Ember has no dtype for", f->path, e->name,
                    dtypes[e->dtype].name);
  if (!e->tensor) {
    em_tensor *t = make_tensor(f, e, op, site);
    if (t && rt_default_device() != EM_CPU) {
      em_tensor *d = rt_to_device(t, rt_default_device(), op, site);
      em_release(t);
      t = d;
    }
    if (!t) return NULL;
    e->tensor = t;
  }
  return em_retain(e->tensor);
}

em_tensor *em_safetensors_get_at(em_safetensors *f, const char *name, em_site site) {
  static const char op[] = "em_safetensors_get";
  if (!f) return rt_error(site, op, "handle is NULL");
  if (!name) return rt_error(site, op, "name is NULL");
  entry *e = find(f, name);
  if (!e) return rt_error(site, op, "%s has no tensor named '%s'", f->path, name);
  return rt_scope_add(entry_tensor(f, e, op, site), op, site);
}

/* em_load's safetensors half (serialize.c): every name found with the expected dtype and shape
 * before any tensor is written. */
bool rt_load_safetensors_into(const char *path, int n, em_tensor *const *ts, const char *const *names,
                              const char *op, em_site site) {
  em_safetensors *f = open_file(path, op, site);
  if (!f) return false;
  bool ok = false;
  char b0[128], b1[128];
  for (int i = 0; i < n; i++) {
    entry *e = find(f, names[i]);
    if (!e) {
      rt_error(site, op, "%s has no tensor named '%s'", path, names[i]);
      goto out;
    }
    em_tensor *t = ts[i];
    if (dtypes[e->dtype].ember != (int)t->dtype || e->ndim != t->ndim ||
        memcmp(e->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim)) {
      if (dtypes[e->dtype].ember >= 0)
        ir_fmt_type(b0, sizeof b0, (em_dtype)dtypes[e->dtype].ember, e->ndim, e->sizes);
      else
        snprintf(b0, sizeof b0, "%s (no Ember dtype)", dtypes[e->dtype].name);
      rt_error(site, op, "%s: tensor '%s' is %s in the file but %s here", path, names[i], b0, rt_fmt(b1, sizeof b1, t));
      goto out;
    }
  }
  for (int i = 0; i < n; i++) {
    em_tensor *src = make_tensor(f, find(f, names[i]), op, site);
    if (!src) goto out;
    em_no_grad_begin();
    bool copied = em_copy__at(ts[i], src, site) != NULL;
    em_no_grad_end();
    em_release(src);
    if (!copied) goto out;
  }
  ok = true;
out:
  em_safetensors_close(f);
  return ok;
}

/* ---- writing ---- */

static bool check_named(int n, em_tensor *const *ts, const char *const *names, const char *const *metadata,
                        const char *op, em_site site) {
  if (n < 0 || (n && (!ts || !names)))
    return rt_error(site, op, "bad arguments: %d tensors, tensors %s, names %s", n, ts ? "given" : "NULL",
                    names ? "given" : "NULL"), false;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) return false; /* the error that made it NULL is already recorded */
    if (ts[i] == EM_NONE) return rt_error(site, op, "tensor %d is EM_NONE", i), false;
    if (!names[i]) return rt_error(site, op, "name %d is NULL", i), false;
    if (!strcmp(names[i], "__metadata__"))
      return rt_error(site, op, "name %d is \"__metadata__\", which the format reserves", i), false;
    if (!dtype_format_name(ts[i]->dtype))
      return rt_error(site, op, "tensor '%s' has dtype %s, which the format cannot hold", names[i],
                      em_dtype_name(ts[i]->dtype)), false;
    for (int j = 0; j < i; j++)
      if (!strcmp(names[i], names[j]))
        return rt_error(site, op, "name '%s' is given twice (tensors %d and %d)", names[i], j, i), false;
  }
  for (int k = 0; metadata && metadata[k]; k += 2)
    if (!metadata[k + 1])
      return rt_error(site, op, "metadata key '%s' has a NULL value (the list is key, value, ..., NULL)", metadata[k]),
             false;
  return true;
}

/* The JSON header, padded with spaces to a multiple of 8 bytes; malloc'd (cJSON's), or NULL.
 * order[k]: the tensor written k-th. */
static char *make_header(int n, em_tensor *const *ts, const char *const *names, const char *const *metadata,
                         const int *order, size_t *len) {
  cJSON *root = cJSON_CreateObject();
  bool ok = root != NULL;
  if (ok && metadata && metadata[0]) {
    cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
    ok = md != NULL;
    for (int k = 0; ok && metadata[k]; k += 2) ok = cJSON_AddStringToObject(md, metadata[k], metadata[k + 1]) != NULL;
  }
  uint64_t at = 0;
  for (int k = 0; ok && k < n; k++) {
    em_tensor *t = ts[order[k]];
    uint64_t bytes = (uint64_t)t->numel * ir_dtype(t->dtype)->size;
    cJSON *o = cJSON_AddObjectToObject(root, names[order[k]]), *shape, *offs;
    ok = o && cJSON_AddStringToObject(o, "dtype", dtype_format_name(t->dtype)) &&
         (shape = cJSON_AddArrayToObject(o, "shape")) && (offs = cJSON_AddArrayToObject(o, "data_offsets"));
    for (int d = 0; ok && d < t->ndim; d++) ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->sizes[d]));
    ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)at)) &&
         cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(at + bytes)));
    at += bytes;
  }
  char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (!s) return NULL;
  size_t l = strlen(s), padded = (l + 7) / 8 * 8;
  char *p = realloc(s, padded + 1);
  if (!p) return free(s), NULL;
  memset(p + l, ' ', padded - l);
  p[padded] = 0;
  *len = padded;
  return p;
}

static bool write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= (size_t)w;
  }
  return true;
}

bool rt_save_safetensors(const char *path, int n, em_tensor *const *ts, const char *const *names,
                         const char *const *metadata, const char *op, em_site site) {
  if (!path) return rt_error(site, op, "path is NULL"), false;
  if (!check_named(n, ts, names, metadata, op, site)) return false;
  int *order = rt_alloc(sizeof(int) * (size_t)(n ? n : 1), 16);
  if (!order) return rt_error(site, op, "out of memory writing %s", path), false;
  /* Decreasing element size, stable: every tensor stays aligned after the 8-byte-padded header. */
  int k = 0;
  for (int size = 8; size >= 1; size /= 2)
    for (int i = 0; i < n; i++)
      if ((int)ir_dtype(ts[i]->dtype)->size == size) order[k++] = i;
  size_t hlen = 0;
  char *header = make_header(n, ts, names, metadata, order, &hlen);
  char *tmp = rt_alloc(strlen(path) + 16, 16);
  int fd = -1;
  bool ok = false, reported = false;
  if (!header || !tmp) {
    rt_error(site, op, "out of memory writing %s", path);
    goto out;
  }
  sprintf(tmp, "%s.tmp.XXXXXX", path);
  if ((fd = mkstemp(tmp)) < 0) {
    rt_error(site, op, "cannot write %s: %s", path, strerror(errno));
    goto out;
  }
  unsigned char h8[8];
  for (int i = 0; i < 8; i++) h8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  ok = write_all(fd, h8, 8) && write_all(fd, header, hlen);
  for (int j = 0; ok && j < n; j++) {
    em_tensor *t = ts[order[j]];
    size_t bytes = (size_t)t->numel * ir_dtype(t->dtype)->size;
    if (!bytes) continue;
    /* em_to_buffer gives the row-major values whatever t's strides or device. */
    char *buf = rt_alloc(bytes, 64);
    if (!buf) {
      rt_error(site, op, "out of memory staging '%s' (%zu bytes)", names[order[j]], bytes);
      ok = false, reported = true;
      break;
    }
    if (!em_to_buffer_at(t, t->dtype, buf, bytes, site)) ok = false, reported = true;
    else ok = write_all(fd, buf, bytes);
    rt_free(buf);
  }
  int saved = errno;
  if (close(fd) != 0 && ok) ok = false, saved = errno;
  if (ok && rename(tmp, path) != 0) ok = false, saved = errno;
  if (!ok) {
    if (!reported) rt_error(site, op, "writing %s failed: %s", path, strerror(saved));
    unlink(tmp);
  }
out:
  free(header);
  rt_free(tmp);
  rt_free(order);
  return ok;
}

bool em_save_safetensors_at(const char *path, int n, em_tensor *const *ts, const char *const *names,
                            const char *const *metadata, em_site site) {
  int tok = rt_break_begin("em_save_safetensors", "writes tensors' data to a file", site);
  if (tok < 0) return false;
  bool ok = rt_save_safetensors(path, n, ts, names, metadata, "em_save_safetensors", site);
  rt_break_end(tok);
  return ok;
}
