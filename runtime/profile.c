/* runtime/profile.c: the Chrome-trace profiler (em_profiler_start / em_profiler_stop,
 * EMBER_PROFILE=trace.json), writing the Trace Event Format that chrome://tracing and Perfetto
 * read: {"traceEvents": [...]} with complete events ("ph": "X", ts and dur in microseconds),
 * instant events ("ph": "i") and thread names ("ph": "M").
 *
 * Off, the cost at each hook is one load of rt_prof_on and a branch. On, each thread appends
 * to its own buffer (no lock): fixed chunks that are never moved or freed while the process
 * runs, with a count published by a release store, so em_profiler_stop on another thread reads
 * a consistent prefix. Events are written by cJSON, one object at a time. */
#define _POSIX_C_SOURCE 200809L
#include "rt.h"
#include "cuda.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int rt_prof_on;

typedef struct event {
  uint64_t ts, dur; /* ns since the clock's epoch */
  const char *cat;  /* static */
  char ph;
  char name[63];
  char args[128];
} event;

#define CHUNK 1024
typedef struct chunk {
  event ev[CHUNK];
  struct chunk *next;
} chunk;

typedef struct tbuf {
  int tid;
  chunk *head, *tail;
  int64_t count; /* events appended (release-stored by the owner) */
  int64_t start; /* events already written or discarded (only em_profiler_stop moves it) */
  struct tbuf *next;
} tbuf;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static tbuf *buffers;
static int n_threads;
static uint64_t t_start;
static _Thread_local tbuf *mine;

uint64_t rt_prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The calling thread's next event slot, or NULL when out of memory (the event is dropped). */
static event *slot(void) {
  if (!mine) {
    tbuf *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    pthread_mutex_lock(&lock);
    b->tid = ++n_threads;
    b->next = buffers, buffers = b;
    pthread_mutex_unlock(&lock);
    mine = b;
  }
  int64_t n = mine->count;
  if (n % CHUNK == 0) { /* a new chunk; the count never goes back, so chunks are only added */
    chunk *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (mine->tail) mine->tail->next = c;
    else mine->head = c;
    mine->tail = c;
  }
  return &mine->tail->ev[n % CHUNK];
}

static void append(char ph, const char *cat, const char *name, uint64_t ts, uint64_t dur, const char *fmt, va_list ap) {
  event *e = slot();
  if (!e) return;
  e->ph = ph, e->cat = cat, e->ts = ts, e->dur = dur;
  snprintf(e->name, sizeof e->name, "%s", name ? name : "?");
  if (fmt) vsnprintf(e->args, sizeof e->args, fmt, ap);
  else e->args[0] = 0;
  __atomic_store_n(&mine->count, mine->count + 1, __ATOMIC_RELEASE);
}

void rt_prof_complete(const char *cat, const char *name, uint64_t t0, const char *fmt, ...) {
  uint64_t t1 = rt_prof_now();
  va_list ap;
  va_start(ap, fmt);
  append('X', cat, name, t0, t1 - t0, fmt, ap);
  va_end(ap);
}

void rt_prof_instant(const char *cat, const char *name, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  append('i', cat, name, rt_prof_now(), 0, fmt, ap);
  va_end(ap);
}

void rt_prof_op(const char *name, em_tensor *const *in, int n_in, uint64_t t0) {
  char args[128];
  size_t k = 0;
  args[0] = 0;
  for (int i = 0; i < n_in && k < sizeof args - 1; i++) {
    char b[96];
    k += (size_t)snprintf(args + k, sizeof args - k, "%s%s", i ? " " : "", in[i] && in[i] != EM_NONE ? rt_fmt(b, sizeof b, in[i]) : "-");
  }
  rt_prof_complete("op", name, t0, "%s", args);
}

/* The device track: kernels' device times (cu_prof_collect), appended under the lock. */
static tbuf device_track = {.tid = 100000};

void rt_prof_device(const char *name, uint64_t ts, uint64_t dur) {
  tbuf *saved = mine;
  mine = &device_track; /* slot() appends to mine; callers hold the lock */
  event *e = slot();
  if (e) {
    e->ph = 'X', e->cat = "cuda", e->ts = ts, e->dur = dur;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->args[0] = 0;
    __atomic_store_n(&mine->count, mine->count + 1, __ATOMIC_RELEASE);
  }
  mine = saved;
}

void em_profiler_start(void) {
  pthread_mutex_lock(&lock);
  for (tbuf *b = buffers; b; b = b->next) b->start = __atomic_load_n(&b->count, __ATOMIC_ACQUIRE);
  device_track.start = device_track.count;
  t_start = rt_prof_now();
  pthread_mutex_unlock(&lock);
  __atomic_store_n(&rt_prof_on, 1, __ATOMIC_RELEASE);
}

static bool put_event(FILE *f, bool *first, const event *e, int tid) {
  cJSON *o = cJSON_CreateObject();
  bool ok = o && cJSON_AddStringToObject(o, "name", e->name) && cJSON_AddStringToObject(o, "cat", e->cat) &&
            cJSON_AddStringToObject(o, "ph", e->ph == 'X' ? "X" : "i") &&
            cJSON_AddNumberToObject(o, "ts", (double)(e->ts - t_start) / 1e3) &&
            cJSON_AddNumberToObject(o, "pid", (double)getpid()) && cJSON_AddNumberToObject(o, "tid", tid);
  if (ok && e->ph == 'X') ok = cJSON_AddNumberToObject(o, "dur", (double)e->dur / 1e3) != NULL;
  if (ok && e->ph == 'i') ok = cJSON_AddStringToObject(o, "s", "t") != NULL;
  if (ok && e->args[0]) {
    cJSON *a = cJSON_AddObjectToObject(o, "args");
    ok = a && cJSON_AddStringToObject(a, "detail", e->args);
  }
  char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  if (!s) return false;
  ok = fprintf(f, "%s%s", *first ? "\n" : ",\n", s) > 0;
  *first = false;
  free(s);
  return ok;
}

bool em_profiler_stop_at(const char *path, em_site site) {
  static const char op[] = "em_profiler_stop";
  __atomic_store_n(&rt_prof_on, 0, __ATOMIC_RELEASE);
  if (!path) return rt_error(site, op, "path is NULL"), false;
  pthread_mutex_lock(&lock);
  cu_prof_collect(); /* the device track (nothing when the device never started), under the lock */
  pthread_mutex_unlock(&lock);
  FILE *f = fopen(path, "w");
  if (!f) return rt_error(site, op, "cannot write %s: %s", path, strerror(errno)), false;
  pthread_mutex_lock(&lock);
  bool ok = fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", f) >= 0, first = true;
  for (tbuf *b = buffers ? buffers : &device_track; b && ok; b = b == &device_track ? NULL : b->next ? b->next : &device_track) {
    int64_t end = __atomic_load_n(&b->count, __ATOMIC_ACQUIRE);
    if (end == b->start) continue;
    char tname[32];
    snprintf(tname, sizeof tname, b == &device_track ? "CUDA (device time)" : "thread %d", b->tid);
    ok = fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                 first ? "\n" : ",\n", (int)getpid(), b->tid, tname) > 0;
    first = false;
    chunk *c = b->head;
    for (int64_t i = 0; c && i < end && ok; i++) {
      if (i && i % CHUNK == 0) c = c->next;
      if (i >= b->start) ok = put_event(f, &first, &c->ev[i % CHUNK], b->tid);
    }
    b->start = end;
  }
  pthread_mutex_unlock(&lock);
  ok = ok && fputs("\n]}\n", f) >= 0;
  if (fclose(f) != 0) ok = false;
  if (!ok) return rt_error(site, op, "writing %s failed: %s", path, strerror(errno)), false;
  return true;
}

/* EMBER_PROFILE=path: profile the whole process, written at exit. */
static const char *env_path;
static void write_at_exit(void) {
  if (!em_profiler_stop_at(env_path, EM_HERE)) fprintf(stderr, "[ember] EMBER_PROFILE: %s\n", em_last_error());
  else fprintf(stderr, "[ember] EMBER_PROFILE: wrote %s\n", env_path);
}
__attribute__((constructor)) static void profile_from_env(void) {
  env_path = getenv("EMBER_PROFILE");
  if (env_path && *env_path) {
    em_profiler_start();
    atexit(write_at_exit);
  }
}
