/* runtime/cache.c: where compiled kernels are kept on disk, shared by the CPU code generator
 * (inductor/jit.c: object files) and the CUDA runtime (runtime/cuda.c: cubins).
 *
 * The directory is EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember/kernels, else
 * ~/.cache/ember/kernels, created on first use; EMBER_CACHE=0 turns caching off. Files are
 * written whole or not at all: to a temporary file in the same directory, then renamed, so
 * concurrent writers each leave a complete file and readers never see a partial one. */
#include "rt.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char dir[1024];

/* Creates path and its missing parents; true when it is a directory afterwards. */
bool rt_mkdirs(char *path) {
  for (char *q = path + 1; *q; q++)
    if (*q == '/') {
      *q = 0;
      mkdir(path, 0755);
      *q = '/';
    }
  mkdir(path, 0755);
  struct stat st;
  return !stat(path, &st) && S_ISDIR(st.st_mode);
}

static void init(void) {
  const char *off = getenv("EMBER_CACHE");
  if (off && !strcmp(off, "0")) return;
  const char *env = getenv("EMBER_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (env && *env) snprintf(dir, sizeof dir, "%s", env);
  else if (xdg && *xdg) snprintf(dir, sizeof dir, "%s/ember/kernels", xdg);
  else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/ember/kernels", home);
  if (dir[0] && !rt_mkdirs(dir)) dir[0] = 0;
}

const char *rt_cache_dir(void) {
  pthread_once(&once, init);
  return dir[0] ? dir : NULL;
}

bool rt_write_file_whole(const char *path, const void *head, size_t head_size, const void *body, size_t body_size) {
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) return false;
  bool ok = write(fd, head, head_size) == (ssize_t)head_size && write(fd, body, body_size) == (ssize_t)body_size;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp, path)) return unlink(tmp), false;
  return true;
}

FILE *rt_cache_open(const char *path, int64_t *size) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* O_NONBLOCK: opening a FIFO returns at once */
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) return close(fd), NULL;
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, "rb");
  if (!f) return close(fd), NULL;
  *size = (int64_t)st.st_size;
  return f;
}
