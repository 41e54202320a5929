/* tests/tmpdir.h: a scratch directory per test (mkdtemp), for the suites that write files:
 * make_dir, path_in (a path inside it; one static buffer), remove_dir (with its files), and
 * read_file; and fail_each_alloc, for the file readers and writers. */
#ifndef EMBER_TEST_TMPDIR_H
#define EMBER_TEST_TMPDIR_H

#include <criterion/criterion.h>
#include <ember.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
__attribute__((unused)) static void make_dir(void) {
  strcpy(dir, "/tmp/ember-test-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
__attribute__((unused)) static const char *path_in(const char *name) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}
__attribute__((unused)) static void remove_dir(void) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(path_in(e->d_name));
  closedir(d);
  cr_assert_eq(rmdir(dir), 0);
}
__attribute__((unused)) static size_t read_file(const char *path, unsigned char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

/* Calls fn with the k-th allocation failing, for k = 1, 2, ... until it succeeds: each failure
 * must be reported with an error and must leave nothing alive beyond what was alive before. */
__attribute__((unused)) static void fail_each_alloc(bool (*fn)(void)) {
  for (int64_t k = 1;; k++) {
    cr_assert_lt(k, 10000, "never succeeded");
    int64_t live = em_debug_live_tensors();
    em_scope_begin();
    em_clear_error();
    em_debug_fail_alloc(k);
    bool ok = fn();
    em_debug_fail_alloc(0);
    if (!ok) cr_assert_not_null(em_last_error(), "allocation %lld failed silently", (long long)k);
    em_scope_end();
    cr_assert_eq(em_debug_live_tensors(), live, "allocation %lld: tensors leaked", (long long)k);
    em_clear_error();
    if (ok) break;
  }
}

#endif
