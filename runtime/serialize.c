/* runtime/serialize.c: saving and loading named tensors.
 *
 * The format ("EMBR" version 1), all integers little-endian:
 *   "EMBR"  u32 version = 1  u32 count
 *   count times:  u32 name_len, name bytes (no NUL), u32 dtype (em_dtype value),
 *                 u32 ndim, ndim x i64 sizes, then numel x dtype-size bytes, row-major.
 * It is deliberately plain: a reader in any language is a page long. Loading copies into
 * existing tensors (checked for shape and dtype), so a model is built first and then filled. */
#include "rt.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static bool put(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }
static bool get(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

bool em_save_at(const char *path, int n, em_tensor *const *ts, const char *const *names, em_site site) {
  static const char name[] = "em_save";
  if (n < 0 || (n && (!ts || !names)) || !path) return rt_error(site, name, "bad arguments (%d tensors)", n), false;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) return false;
    if (!names[i]) return rt_error(site, name, "name %d is NULL", i), false;
  }
  FILE *f = fopen(path, "wb");
  if (!f) return rt_error(site, name, "cannot write %s: %s", path, strerror(errno)), false;
  uint32_t head[2] = {1, (uint32_t)n};
  bool ok = put(f, "EMBR", 4) && put(f, head, sizeof head);
  for (int i = 0; ok && i < n; i++) {
    em_tensor *t = ts[i];
    uint32_t len = (uint32_t)strlen(names[i]), dt = (uint32_t)t->dtype, nd = (uint32_t)t->ndim;
    size_t bytes = (size_t)t->numel * ir_dtype(t->dtype)->size;
    char *buf = rt_alloc(bytes ? bytes : 1, 64);
    ok = buf && em_to_buffer_at(t, t->dtype, buf, bytes, site) && put(f, &len, 4) && put(f, names[i], len) &&
         put(f, &dt, 4) && put(f, &nd, 4) && put(f, t->sizes, sizeof(int64_t) * nd) && put(f, buf, bytes);
    if (!buf) rt_error(site, name, "out of memory");
    rt_free(buf);
  }
  if (fclose(f) != 0) ok = false;
  if (!ok) rt_error(site, name, "writing %s failed: %s", path, strerror(errno));
  return ok;
}

bool em_load_at(const char *path, int n, em_tensor *const *ts, const char *const *names, em_site site) {
  static const char name[] = "em_load";
  if (n < 0 || (n && (!ts || !names)) || !path) return rt_error(site, name, "bad arguments (%d tensors)", n), false;
  for (int i = 0; i < n; i++)
    if (!ts[i]) return false;
  FILE *f = fopen(path, "rb");
  if (!f) return rt_error(site, name, "cannot open %s: %s", path, strerror(errno)), false;
  char magic[4];
  uint32_t head[2];
  bool ok = false;
  bool *found = rt_alloc(sizeof(bool) * (size_t)(n ? n : 1), 16);
  char *buf = NULL;
  if (!found) {
    rt_error(site, name, "out of memory");
    goto out;
  }
  memset(found, 0, sizeof(bool) * (size_t)(n ? n : 1));
  if (!get(f, magic, 4) || memcmp(magic, "EMBR", 4) || !get(f, head, sizeof head) || head[0] != 1) {
    rt_error(site, name, "%s is not an Ember tensor file (EMBR version 1)", path);
    goto out;
  }
  for (uint32_t k = 0; k < head[1]; k++) {
    uint32_t len, dt, nd;
    char tname[1024];
    int64_t sizes[EM_MAX_DIMS];
    if (!get(f, &len, 4) || len >= sizeof tname || !get(f, tname, len)) goto truncated;
    tname[len] = 0;
    if (!get(f, &dt, 4) || !get(f, &nd, 4) || dt >= EM_DTYPE_COUNT || nd > EM_MAX_DIMS ||
        !get(f, sizes, sizeof(int64_t) * nd))
      goto truncated;
    size_t bytes = (size_t)ir_numel((int)nd, sizes) * ir_dtype((em_dtype)dt)->size;
    int i = 0;
    while (i < n && strcmp(names[i], tname)) i++;
    if (i == n) { /* not asked for: skip its data */
      if (fseek(f, (long)bytes, SEEK_CUR)) goto truncated;
      continue;
    }
    em_tensor *t = ts[i];
    char b0[128], b1[128];
    if (t->dtype != (em_dtype)dt || t->ndim != (int)nd || memcmp(t->sizes, sizes, sizeof(int64_t) * nd)) {
      rt_error(site, name, "%s: tensor '%s' is %s in the file but %s here", path, tname,
               ir_fmt_type(b0, sizeof b0, (em_dtype)dt, (int)nd, sizes), rt_fmt(b1, sizeof b1, t));
      goto out;
    }
    em_tensor *src = rt_new(t->dtype, t->ndim, t->sizes, name, site);
    if (!src) goto out;
    bool read = get(f, rt_data(src), bytes);
    em_no_grad_begin();
    bool copied = read && em_copy__at(t, src, site);
    em_no_grad_end();
    em_release(src);
    if (!read) goto truncated;
    if (!copied) goto out;
    found[i] = true;
  }
  for (int i = 0; i < n; i++)
    if (!found[i]) {
      rt_error(site, name, "%s has no tensor named '%s'", path, names[i]);
      goto out;
    }
  ok = true;
  goto out;
truncated:
  rt_error(site, name, "%s is truncated or corrupt", path);
out:
  rt_free(found);
  rt_free(buf);
  fclose(f);
  return ok;
}
