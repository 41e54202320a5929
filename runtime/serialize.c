/* runtime/serialize.c: em_save and em_load, Ember's checkpoint calls.
 *
 * em_save writes safetensors (runtime/safetensors.c), the format every other library reads.
 * em_load reads safetensors, and for compatibility also Ember's former format, "EMBR" version
 * 1, which nothing writes any more. EMBR, every integer little-endian whatever the host:
 *
 *   offset 0   4 bytes   "EMBR"
 *              u32       version = 1
 *              u32       count
 *   count times:
 *              u32       name_len
 *              name_len  name bytes (UTF-8 or anything but NUL; no terminator)
 *              u32       dtype (the em_dtype value: f32 0, f64 1, i32 2, i64 3, bool 4, u8 5,
 *                        f16 6, bf16 7)
 *              u32       ndim (0 to 8)
 *              ndim x i64 sizes
 *              numel x dtype-size bytes: the values in row-major (C) order, little-endian
 *
 * Loading copies into existing tensors (checked for shape and dtype), so a model is built first
 * and then filled, as with PyTorch's load_state_dict. Loading runs in two passes: the first
 * reads every header and checks each requested name, shape and dtype against the file (and
 * that the file is long enough), the second copies; so a mismatch, a missing name or a
 * truncated file changes no tensor. */
#define _POSIX_C_SOURCE 200809L /* fseeko / ftello: files larger than 2 GiB where long is 32-bit */
#include "rt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Names longer than this are refused on saving and taken as corruption on loading. */
#define MAX_NAME 65535u

static bool get(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

static bool get_u32(FILE *f, uint32_t *v) {
  unsigned char b[4];
  if (!get(f, b, 4)) return false;
  *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  return true;
}
static bool get_i64(FILE *f, int64_t *v) {
  unsigned char b[8];
  if (!get(f, b, 8)) return false;
  uint64_t u = 0;
  for (int i = 0; i < 8; i++) u |= (uint64_t)b[i] << (8 * i);
  *v = (int64_t)u;
  return true;
}

/* EMBR data is little-endian; on a big-endian host each element is swapped in place. */
static void swap_to_host(char *p, size_t n, size_t size) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (size_t i = 0; i < n; i++, p += size)
    for (size_t j = 0; j < size / 2; j++) {
      char t = p[j];
      p[j] = p[size - 1 - j];
      p[size - 1 - j] = t;
    }
#else
  (void)p, (void)n, (void)size;
#endif
}

static bool load_embr(FILE *f, const char *path, int n, em_tensor *const *ts, const char *const *names, em_site site) {
  static const char name[] = "em_load";
  bool ok = false;
  char *tname = NULL;
  /* offset[i]: where the data of names[i] starts in the file, or -1 while not found */
  off_t *offset = rt_alloc(sizeof(off_t) * (size_t)(n ? n : 1), 16);
  char b0[128], b1[128];
  uint32_t version, count = 0, k = 0;
  off_t file_size;
  if (!offset || !(tname = rt_alloc(MAX_NAME + 1, 16))) {
    rt_error(site, name, "out of memory reading %s", path);
    goto out;
  }
  for (int i = 0; i < n; i++) offset[i] = -1;
  if (fseeko(f, 0, SEEK_END) || (file_size = ftello(f)) < 0 || fseeko(f, 0, SEEK_SET)) {
    rt_error(site, name, "cannot seek in %s: %s", path, strerror(errno));
    goto out;
  }
  if (!get(f, b0, 4) || memcmp(b0, "EMBR", 4) || !get_u32(f, &version)) {
    rt_error(site, name, "%s is not an Ember tensor file (no EMBR header)", path);
    goto out;
  }
  if (version != 1) {
    rt_error(site, name, "%s is EMBR version %u; this Ember reads version 1", path, version);
    goto out;
  }
  if (!get_u32(f, &count)) goto truncated;
  /* Pass 1: headers only, checking everything that can fail before any tensor is written. */
  for (k = 0; k < count; k++) {
    uint32_t len, dt, nd;
    int64_t sizes[EM_MAX_DIMS];
    if (!get_u32(f, &len) || len > MAX_NAME || !get(f, tname, len)) goto truncated;
    tname[len] = 0;
    if (!get_u32(f, &dt) || !get_u32(f, &nd) || dt >= EM_DTYPE_COUNT || nd > EM_MAX_DIMS) goto truncated;
    for (uint32_t d = 0; d < nd; d++)
      if (!get_i64(f, &sizes[d]) || sizes[d] < 0) goto truncated;
    int64_t numel = ir_numel((int)nd, sizes);
    size_t esize = ir_dtype((em_dtype)dt)->size;
    off_t here = ftello(f);
    if (here < 0 || numel == INT64_MAX || (uint64_t)numel > (uint64_t)(file_size - here) / esize) goto truncated;
    int i = 0;
    while (i < n && strcmp(names[i], tname)) i++;
    if (i < n) {
      em_tensor *t = ts[i];
      if (t->dtype != (em_dtype)dt || t->ndim != (int)nd || memcmp(t->sizes, sizes, sizeof(int64_t) * nd)) {
        rt_error(site, name, "%s: tensor '%s' is %s in the file but %s here", path, tname,
                 ir_fmt_type(b0, sizeof b0, (em_dtype)dt, (int)nd, sizes), rt_fmt(b1, sizeof b1, t));
        goto out;
      }
      offset[i] = here;
    }
    if (fseeko(f, (off_t)((uint64_t)numel * esize), SEEK_CUR)) goto truncated;
  }
  for (int i = 0; i < n; i++)
    if (offset[i] < 0) {
      rt_error(site, name, "%s has no tensor named '%s'", path, names[i]);
      goto out;
    }
  /* Pass 2: the data, staged in a fresh tensor and copied in, so that any strides, views and
   * leaves requiring grad are handled by em_copy_ as for any other in-place write. */
  for (int i = 0; i < n; i++) {
    em_tensor *t = ts[i];
    em_tensor *src = rt_new(t->dtype, t->ndim, t->sizes, name, site);
    if (!src) goto out;
    size_t esize = ir_dtype(t->dtype)->size;
    bool read = fseeko(f, offset[i], SEEK_SET) == 0 && get(f, rt_data(src), src->storage->bytes);
    if (!read) {
      em_release(src);
      rt_error(site, name, "reading %s failed: %s", path, ferror(f) ? strerror(errno) : "file shrank while read");
      goto out;
    }
    swap_to_host(rt_data(src), (size_t)src->numel, esize);
    em_no_grad_begin();
    bool copied = em_copy__at(t, src, site) != NULL;
    em_no_grad_end();
    em_release(src);
    if (!copied) goto out;
  }
  ok = true;
  goto out;
truncated:
  if (ferror(f))
    rt_error(site, name, "reading %s failed: %s", path, strerror(errno));
  else
    rt_error(site, name, "%s is truncated or corrupt (in tensor %u of %u)", path, k, count);
out:
  rt_free(tname);
  rt_free(offset);
  return ok;
}

bool em_load_at(const char *path, int n, em_tensor *const *ts, const char *const *names, em_site site) {
  static const char name[] = "em_load";
  if (!path) return rt_error(site, name, "path is NULL"), false;
  if (n < 0 || (n && (!ts || !names)))
    return rt_error(site, name, "bad arguments: %d tensors, tensors %s, names %s", n, ts ? "given" : "NULL",
                    names ? "given" : "NULL"), false;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) return false;
    if (ts[i] == EM_NONE) return rt_error(site, name, "tensor %d is EM_NONE", i), false;
    if (!names[i]) return rt_error(site, name, "name %d is NULL", i), false;
  }
  FILE *f = fopen(path, "rb");
  if (!f) return rt_error(site, name, "cannot open %s: %s", path, strerror(errno)), false;
  char magic[4];
  bool embr = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "EMBR", 4);
  if (!embr) {
    fclose(f);
    return rt_load_safetensors_into(path, n, ts, names, name, site);
  }
  bool ok = load_embr(f, path, n, ts, names, site);
  fclose(f);
  return ok;
}

bool em_save_at(const char *path, int n, em_tensor *const *ts, const char *const *names, em_site site) {
  int tok = rt_break_begin("em_save", "writes tensors' data to a file", site);
  if (tok < 0) return false;
  bool ok = rt_save_safetensors(path, n, ts, names, NULL, "em_save", site);
  rt_break_end(tok);
  return ok;
}
