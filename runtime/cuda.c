/* runtime/cuda.c: the CUDA device: the driver, loaded at run time (or the host emulator),
 * device discovery and properties, the process's caching allocator for device 0, streams and
 * events, host-device copies through pinned staging buffers, and the kernel cache (memory and
 * disk). See cuda.h.
 *
 * One device (cuda:0) and one context (its primary context, which cuBLAS shares). The driver's
 * current context is per thread, so every entry point that talks to the driver calls cu_enter().
 * Streams: each thread has a current stream (em_cuda_set_stream), the legacy default stream
 * unless set; ops enqueue on it and return. Reading data back (em_item, em_to to the CPU,
 * printing) waits for the copy, so the order of a program is the order of its results. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cuda.h"
#include "rt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_OUT_OF_MEMORY = 2 };
enum {
  ATTR_CLOCK_RATE = 13, ATTR_MULTIPROCESSOR_COUNT = 16, ATTR_MEMORY_CLOCK_RATE = 36, ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37,
  ATTR_L2_CACHE_SIZE = 38, ATTR_COMPUTE_CAPABILITY_MAJOR = 75, ATTR_COMPUTE_CAPABILITY_MINOR = 76,
};

static struct {
  pthread_once_t once;
  void *lib;
  char why[256]; /* why there is no device */
  int count;
  CUcontext ctx;
  cu_allocator *alloc;
  const cu_driver *d;  /* the table in use: &real, or the emulator's */
  cu_driver real;
  char arch[16];
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetName)(char *, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuGetErrorString)(CUresult, const char **);
} drv = {.once = PTHREAD_ONCE_INIT};

static const char *real_error(int r) {
  const char *s = NULL;
  if (drv.cuGetErrorString && drv.cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown CUDA error";
}

static int device_alloc(void *ctx, size_t bytes, uint64_t *ptr, char *why, size_t cap) {
  (void)ctx;
  cu_enter();
  int r = drv.d->mem_alloc(ptr, bytes);
  if (r == CUDA_SUCCESS) return 0;
  snprintf(why, cap, "cuMemAlloc: %s", drv.d->error_string(r));
  return r == CUDA_ERROR_OUT_OF_MEMORY ? 1 : 2;
}

static void device_free(void *ctx, uint64_t ptr) {
  (void)ctx;
  cu_enter();
  drv.d->mem_free(ptr);
}

/* ---- cuBLAS (dlopen'ed like the driver, at the first GEMM) ---- */

static struct {
  pthread_once_t once;
  void *lib, *handle;
  char why[256];
  int (*create)(void **);
  int (*set_stream)(void *, void *);
  int (*set_math_mode)(void *, int);
  int (*gemm)(void *, int, int, int, int, int, const void *, const void *, int, int, long long, const void *, int, int,
              long long, const void *, void *, int, int, long long, int, int, int);
  pthread_mutex_t lock;
} blas = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* Loads libcublas, libcublasLt or libcudnn (base, whose sonames end in one of the major
 * versions majors, best first): the loader's path first, then the toolkit's own directories and
 * $CUDA_PATH's; NULL with dlerror's reason in why. */
static void *open_cuda_lib(const char *base, const char *const *majors, int n_majors, char *why, size_t cap) {
  const char *dirs[] = {"", "/usr/local/cuda/lib64/", "/usr/local/cuda/lib/", NULL, NULL};
  char p[600], d1[520] = "", d2[520] = "";
  const char *cuda_path = getenv("CUDA_PATH");
  if (cuda_path) {
    snprintf(d1, sizeof d1, "%s/lib64/", cuda_path), snprintf(d2, sizeof d2, "%s/lib/", cuda_path);
    dirs[3] = d1, dirs[4] = d2;
  }
  void *lib = NULL;
  for (int d = 0; d < 5 && dirs[d] && !lib; d++)
    for (int v = 0; v <= n_majors && !lib; v++) { /* v == n_majors: the unversioned name (a development link) */
      if (v < n_majors) snprintf(p, sizeof p, "%s%s.so.%s", dirs[d], base, majors[v]);
      else snprintf(p, sizeof p, "%s%s.so", dirs[d], base);
      lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    }
  if (!lib) snprintf(why, cap, "%s did not load (%s)", base, dlerror());
  return lib;
}

static const char *const cublas_majors[] = {"13", "12"};

static void blas_load(void) {
  blas.lib = open_cuda_lib("libcublas", cublas_majors, 2, blas.why, sizeof blas.why);
  if (!blas.lib) return;
  *(void **)&blas.create = dlsym(blas.lib, "cublasCreate_v2");
  *(void **)&blas.set_stream = dlsym(blas.lib, "cublasSetStream_v2");
  *(void **)&blas.set_math_mode = dlsym(blas.lib, "cublasSetMathMode");
  *(void **)&blas.gemm = dlsym(blas.lib, "cublasGemmStridedBatchedEx");
  if (!blas.create || !blas.set_stream || !blas.gemm) {
    snprintf(blas.why, sizeof blas.why, "cuBLAS lacks a function Ember needs");
    return;
  }
  cu_enter();
  int r = blas.create(&blas.handle);
  if (r) snprintf(blas.why, sizeof blas.why, "cublasCreate failed (status %d)", r), blas.handle = NULL;
}

/* cublasGemmAlgo_t's default (cublas_api.h); the other enums are cuda.h's CU_*. */
enum { GEMM_DEFAULT = -1 };

static int cuda_type(em_dtype dt) {
  return dt == EM_F32 ? CU_R_32F : dt == EM_F64 ? CU_R_64F : dt == EM_F16 ? CU_R_16F : CU_R_16BF;
}
static int compute_type(em_dtype dt, bool tf32) {
  return dt == EM_F64 ? CU_COMPUTE_64F : dt == EM_F32 && tf32 ? CU_COMPUTE_32F_FAST_TF32 : CU_COMPUTE_32F;
}

static int real_gemm(cu_stream s, bool ta, bool tb, int m, int n, int k, em_dtype dt, uint64_t a, int lda, int64_t sa,
                     uint64_t b, int ldb, int64_t sb, uint64_t c, int ldc, int64_t sc, int batch, bool accumulate,
                     bool tf32, char *why, size_t cap) {
  pthread_once(&blas.once, blas_load);
  if (!blas.handle) return snprintf(why, cap, "%s", blas.why), 1;
  int type = cuda_type(dt), compute = compute_type(dt, tf32);
  double one64 = 1, beta64 = accumulate;
  float one32 = 1, beta32 = (float)accumulate;
  const void *alpha = dt == EM_F64 ? (const void *)&one64 : (const void *)&one32;
  const void *beta = dt == EM_F64 ? (const void *)&beta64 : (const void *)&beta32;
  pthread_mutex_lock(&blas.lock); /* one handle: its stream is per call */
  cu_enter();
  int r = blas.set_stream(blas.handle, s);
  if (!r)
    r = blas.gemm(blas.handle, ta, tb, m, n, k, alpha, (const void *)(uintptr_t)a, type, lda, sa, (const void *)(uintptr_t)b,
                  type, ldb, sb, beta, (void *)(uintptr_t)c, type, ldc, sc, batch, compute, GEMM_DEFAULT);
  pthread_mutex_unlock(&blas.lock);
  if (r) snprintf(why, cap, "cublasGemmStridedBatchedEx failed (status %d)", r);
  return r;
}

static const cu_lt_api *real_lt(char *why, size_t cap);   /* cuBLASLt, below */
static const cu_dnn_api *real_dnn(char *why, size_t cap); /* cuDNN, below */

static bool real_compile(const char *src, const char *name, char **image, size_t *size, char **log) {
  return cu_nvrtc_compile(src, name, cu_arch(), image, size, log);
}

/* ---- loading ---- */

static bool load_real(void) {
  const char *names[] = {"libcuda.so.1", "libcuda.so"};
  for (int i = 0; i < 2 && !drv.lib; i++) drv.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!drv.lib) {
    snprintf(drv.why, sizeof drv.why, "no CUDA driver (libcuda.so.1 did not load: %s)", dlerror());
    return false;
  }
  cu_driver *d = &drv.real;
#define SYM(field, name) (*(void **)&field = dlsym(drv.lib, name))
  bool ok = SYM(drv.cuInit, "cuInit") && SYM(drv.cuDeviceGetCount, "cuDeviceGetCount") && SYM(drv.cuDeviceGet, "cuDeviceGet") &&
            SYM(drv.cuDeviceGetName, "cuDeviceGetName") && SYM(drv.cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
            SYM(drv.cuDeviceTotalMem, "cuDeviceTotalMem_v2") && SYM(drv.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
            SYM(drv.cuCtxSetCurrent, "cuCtxSetCurrent") && SYM(d->mem_alloc, "cuMemAlloc_v2") && SYM(d->mem_free, "cuMemFree_v2") &&
            SYM(d->host_alloc, "cuMemHostAlloc") && SYM(d->host_free, "cuMemFreeHost") &&
            SYM(d->memcpy_htod, "cuMemcpyHtoDAsync_v2") && SYM(d->memcpy_dtoh, "cuMemcpyDtoHAsync_v2") &&
            SYM(d->memcpy_dtod, "cuMemcpyDtoDAsync_v2") && SYM(d->stream_create, "cuStreamCreate") &&
            SYM(d->stream_destroy, "cuStreamDestroy_v2") && SYM(d->stream_sync, "cuStreamSynchronize") &&
            SYM(d->stream_wait_event, "cuStreamWaitEvent") && SYM(d->event_create, "cuEventCreate") &&
            SYM(d->event_destroy, "cuEventDestroy_v2") && SYM(d->event_record, "cuEventRecord") &&
            SYM(d->event_sync, "cuEventSynchronize") &&
            (SYM(d->event_elapsed, "cuEventElapsedTime_v2") || SYM(d->event_elapsed, "cuEventElapsedTime")) &&
            SYM(d->module_load, "cuModuleLoadData") && SYM(d->module_get_function, "cuModuleGetFunction") &&
            SYM(d->launch, "cuLaunchKernel") && SYM(d->ctx_sync, "cuCtxSynchronize");
  SYM(drv.cuGetErrorString, "cuGetErrorString");
  /* CUDA graphs: optional (reduce-overhead runs without them, and says why) */
  if (!(SYM(d->stream_begin_capture, "cuStreamBeginCapture_v2") && SYM(d->stream_end_capture, "cuStreamEndCapture") &&
        SYM(d->graph_instantiate, "cuGraphInstantiateWithFlags") && SYM(d->graph_launch, "cuGraphLaunch") &&
        SYM(d->graph_exec_destroy, "cuGraphExecDestroy") && SYM(d->graph_destroy, "cuGraphDestroy")))
    d->stream_begin_capture = NULL;
#undef SYM
  if (!ok) {
    snprintf(drv.why, sizeof drv.why, "the CUDA driver lacks a function Ember needs (%s)", dlerror());
    return false;
  }
  d->name = "CUDA driver";
  static char salt[64]; /* load_real runs once (ensure) */
  cu_nvrtc_cache_salt(salt, sizeof salt);
  d->cache_salt = salt;
  d->error_string = real_error;
  d->compile = real_compile;
  d->gemm = real_gemm;
  d->lt = real_lt;
  d->dnn = real_dnn;
  CUresult r = drv.cuInit(0);
  if (r == CUDA_SUCCESS) r = drv.cuDeviceGetCount(&drv.count);
  if (r != CUDA_SUCCESS) {
    drv.count = 0;
    snprintf(drv.why, sizeof drv.why, "the CUDA driver did not initialise: %s", real_error(r));
    return false;
  }
  if (drv.count == 0) {
    snprintf(drv.why, sizeof drv.why, "the CUDA driver reports no device");
    return false;
  }
  CUdevice dev;
  int major = 0, minor = 0;
  r = drv.cuDeviceGet(&dev, 0);
  if (r == CUDA_SUCCESS) r = drv.cuDevicePrimaryCtxRetain(&drv.ctx, dev);
  if (r == CUDA_SUCCESS) r = drv.cuDeviceGetAttribute(&major, ATTR_COMPUTE_CAPABILITY_MAJOR, dev);
  if (r == CUDA_SUCCESS) r = drv.cuDeviceGetAttribute(&minor, ATTR_COMPUTE_CAPABILITY_MINOR, dev);
  if (r != CUDA_SUCCESS) {
    drv.count = 0;
    snprintf(drv.why, sizeof drv.why, "no context on cuda:0: %s", real_error(r));
    return false;
  }
  snprintf(drv.arch, sizeof drv.arch, "sm_%d%d", major, minor);
  drv.d = d;
  return true;
}

static void load(void) {
  const char *emu = getenv("EMBER_CUDA_EMULATE");
  if (emu && *emu && strcmp(emu, "0")) {
    drv.d = cu_emu_driver();
    drv.count = 1;
    snprintf(drv.arch, sizeof drv.arch, "sm_90");
  } else if (!load_real()) {
    return;
  }
  drv.alloc = cu_allocator_new((cu_backend){NULL, device_alloc, device_free}, "cuda:0");
  if (!drv.alloc) drv.count = 0, drv.d = NULL, snprintf(drv.why, sizeof drv.why, "out of memory");
}

static void ensure(void) { pthread_once(&drv.once, load); }

bool em_cuda_is_available(void) { return ensure(), drv.count > 0 && drv.alloc; }
int em_cuda_device_count(void) { return ensure(), drv.alloc ? drv.count : 0; }
cu_allocator *cu_device_allocator(void) { return ensure(), drv.alloc; }
const cu_driver *cu_drv(void) { return ensure(), drv.alloc ? drv.d : NULL; }
const char *cu_arch(void) { return ensure(), drv.arch; }

static _Thread_local bool entered;
void cu_enter(void) {
  if (entered || !drv.ctx) return;
  drv.cuCtxSetCurrent(drv.ctx);
  entered = true;
}

bool em_cuda_get_device_properties_at(int dev, em_cuda_device_properties *p, em_site site) {
  ensure();
  if (!p) return rt_error(site, "em_cuda_get_device_properties", "properties pointer is NULL"), false;
  if (!drv.alloc) return rt_error(site, "em_cuda_get_device_properties", "device %d: %s", dev, drv.why), false;
  if (dev < 0 || dev >= drv.count)
    return rt_error(site, "em_cuda_get_device_properties", "device %d out of range: %d device%s", dev, drv.count,
                    drv.count == 1 ? "" : "s"),
           false;
  memset(p, 0, sizeof *p);
  if (drv.d->emulated) {
    snprintf(p->name, sizeof p->name, "%s", drv.d->name);
    p->major = 9, p->multiprocessors = 1, p->total_memory = (int64_t)4 << 30;
    return true;
  }
  CUdevice d;
  size_t mem = 0;
  int l2 = 0;
  CUresult r = drv.cuDeviceGet(&d, dev);
  if (r == CUDA_SUCCESS) r = drv.cuDeviceGetName(p->name, (int)sizeof p->name, d);
  if (r == CUDA_SUCCESS) r = drv.cuDeviceTotalMem(&mem, d);
  struct { int *to, attr; } at[] = {
      {&p->major, ATTR_COMPUTE_CAPABILITY_MAJOR}, {&p->minor, ATTR_COMPUTE_CAPABILITY_MINOR},
      {&p->multiprocessors, ATTR_MULTIPROCESSOR_COUNT}, {&l2, ATTR_L2_CACHE_SIZE}, {&p->clock_khz, ATTR_CLOCK_RATE},
      {&p->memory_clock_khz, ATTR_MEMORY_CLOCK_RATE}, {&p->memory_bus_bits, ATTR_GLOBAL_MEMORY_BUS_WIDTH},
  };
  for (size_t i = 0; i < sizeof at / sizeof at[0] && r == CUDA_SUCCESS; i++) r = drv.cuDeviceGetAttribute(at[i].to, at[i].attr, d);
  if (r != CUDA_SUCCESS) return rt_error(site, "em_cuda_get_device_properties", "device %d: %s", dev, real_error(r)), false;
  p->total_memory = (int64_t)mem, p->l2_cache_bytes = l2;
  return true;
}

em_cuda_memory_stats em_cuda_memory_stats_get(void) {
  cu_allocator *a = cu_device_allocator();
  return a ? cu_stats(a) : (em_cuda_memory_stats){0};
}

void em_cuda_reset_peak_memory_stats(void) {
  cu_allocator *a = cu_device_allocator();
  if (a) cu_reset_peaks(a);
}

void em_cuda_empty_cache(void) {
  cu_allocator *a = cu_device_allocator();
  if (a) cu_empty_cache(a);
}

static bool no_device(const char *op, em_site site) {
  ensure();
  if (drv.alloc) return false;
  rt_error(site, op, "no CUDA device: %s", drv.why);
  return true;
}

/* ---- streams and events ---- */

struct em_cuda_stream { cu_stream s; };
struct em_cuda_event { cu_event e; };

static _Thread_local cu_stream current;
cu_stream cu_current_stream(void) { return current; }

em_cuda_stream *em_cuda_stream_new_at(em_site site) {
  if (no_device("em_cuda_stream_new", site)) return NULL;
  em_cuda_stream *s = calloc(1, sizeof *s);
  if (!s) return rt_error(site, "em_cuda_stream_new", "out of memory");
  cu_enter();
  int r = drv.d->stream_create(&s->s, 1 /* CU_STREAM_NON_BLOCKING */);
  if (r) return free(s), rt_error(site, "em_cuda_stream_new", "cuStreamCreate: %s", drv.d->error_string(r));
  return s;
}

void em_cuda_stream_free(em_cuda_stream *s) {
  if (!s || !drv.d) return;
  cu_enter();
  if (current == s->s) current = NULL;
  drv.d->stream_sync(s->s);
  drv.d->stream_destroy(s->s);
  free(s);
}

void em_cuda_set_stream(em_cuda_stream *s) { current = s ? s->s : NULL; }

bool em_cuda_synchronize_at(em_site site) {
  if (no_device("em_cuda_synchronize", site)) return false;
  cu_enter();
  int r = drv.d->ctx_sync();
  if (r) return rt_error(site, "em_cuda_synchronize", "%s", drv.d->error_string(r)), false;
  return true;
}

bool cu_sync(const char *op, em_site site) {
  cu_enter();
  int r = drv.d->stream_sync(current);
  if (r) return rt_error(site, op, "waiting for the device: %s", drv.d->error_string(r)), false;
  return true;
}

em_cuda_event *em_cuda_event_record_at(em_site site) {
  if (no_device("em_cuda_event_record", site)) return NULL;
  em_cuda_event *e = calloc(1, sizeof *e);
  if (!e) return rt_error(site, "em_cuda_event_record", "out of memory");
  cu_enter();
  int r = drv.d->event_create(&e->e, 0);
  if (!r) r = drv.d->event_record(e->e, current);
  if (r) {
    if (e->e) drv.d->event_destroy(e->e);
    free(e);
    return rt_error(site, "em_cuda_event_record", "%s", drv.d->error_string(r));
  }
  return e;
}

bool em_cuda_event_synchronize_at(em_cuda_event *e, em_site site) {
  if (!e) return rt_error(site, "em_cuda_event_synchronize", "event is NULL"), false;
  cu_enter();
  int r = drv.d->event_sync(e->e);
  if (r) return rt_error(site, "em_cuda_event_synchronize", "%s", drv.d->error_string(r)), false;
  return true;
}

bool em_cuda_stream_wait_event_at(em_cuda_stream *s, em_cuda_event *e, em_site site) {
  if (!e) return rt_error(site, "em_cuda_stream_wait_event", "event is NULL"), false;
  cu_enter();
  int r = drv.d->stream_wait_event(s ? s->s : NULL, e->e, 0);
  if (r) return rt_error(site, "em_cuda_stream_wait_event", "%s", drv.d->error_string(r)), false;
  return true;
}

double em_cuda_event_elapsed_ms_at(em_cuda_event *start, em_cuda_event *end, em_site site) {
  if (!start || !end) return rt_error(site, "em_cuda_event_elapsed_ms", "event is NULL"), -1;
  cu_enter();
  float ms = 0;
  int r = drv.d->event_sync(end->e);
  if (!r) r = drv.d->event_elapsed(&ms, start->e, end->e);
  if (r) return rt_error(site, "em_cuda_event_elapsed_ms", "%s", drv.d->error_string(r)), -1;
  return ms;
}

void em_cuda_event_free(em_cuda_event *e) {
  if (!e || !drv.d) return;
  cu_enter();
  drv.d->event_destroy(e->e);
  free(e);
}

/* ---- storage and copies ---- */

/* ---- capture into CUDA graphs ---- */

static _Thread_local struct {
  bool on;
  cu_stream stream, prev;  /* the capturing stream; the thread's stream before */
  cu_allocator *pool;
  cu_check *checks;
  int n_checks, cap_checks;
} capture;

cu_allocator *cu_pool_new(void) {
  ensure();
  return drv.alloc ? cu_allocator_new((cu_backend){NULL, device_alloc, device_free}, "cuda:0 graph pool") : NULL;
}

bool cu_graphs_available(char *why, size_t cap) {
  ensure();
  if (!drv.alloc) return snprintf(why, cap, "no CUDA device: %s", drv.why), false;
  if (!drv.d->stream_begin_capture) return snprintf(why, cap, "the CUDA driver has no graph API"), false;
  return true;
}

bool cu_capture_begin(cu_allocator *pool, char *err, size_t cap) {
  if (!cu_graphs_available(err, cap)) return false;
  if (capture.on) return snprintf(err, cap, "already capturing"), false;
  cu_enter();
  int r = drv.d->stream_sync(current);
  cu_stream s = NULL;
  if (!r) r = drv.d->stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING */);
  if (!r) r = drv.d->stream_begin_capture(s, 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */);
  if (r) {
    if (s) drv.d->stream_destroy(s);
    return snprintf(err, cap, "starting a capture: %s", drv.d->error_string(r)), false;
  }
  capture.on = true, capture.stream = s, capture.prev = current, capture.pool = pool;
  capture.n_checks = 0;
  current = s;
  return true;
}

bool cu_capturing(void) { return capture.on; }

bool cu_capture_check(cu_check c) {
  if (capture.n_checks == capture.cap_checks) {
    int n = capture.cap_checks ? 2 * capture.cap_checks : 8;
    cu_check *q = realloc(capture.checks, sizeof *q * (size_t)n);
    if (!q) return false;
    capture.checks = q, capture.cap_checks = n;
  }
  capture.checks[capture.n_checks++] = c;
  return true;
}

bool cu_capture_end(bool ok, void **graph, void **exec, cu_check **checks, int *n_checks, char *err, size_t cap) {
  *graph = *exec = NULL, *checks = NULL, *n_checks = 0;
  if (!capture.on) return snprintf(err, cap, "not capturing"), false;
  cu_enter();
  void *g = NULL;
  int r = drv.d->stream_end_capture(capture.stream, &g);
  current = capture.prev;
  drv.d->stream_destroy(capture.stream);
  capture.on = false;
  if (r && ok) ok = false, snprintf(err, cap, "capturing: %s", drv.d->error_string(r));
  if (ok && !g) ok = false, snprintf(err, cap, "capturing made no graph");
  if (ok && (r = drv.d->graph_instantiate(exec, g, 0)))
    ok = false, snprintf(err, cap, "instantiating the graph: %s", drv.d->error_string(r));
  if (!ok) {
    if (g) drv.d->graph_destroy(g);
    for (int i = 0; i < capture.n_checks; i++) cu_release(capture.checks[i].word->owner, capture.checks[i].word);
    capture.n_checks = 0;
    *exec = NULL;
    return false;
  }
  *graph = g;
  if (capture.n_checks) {
    *checks = malloc(sizeof **checks * (size_t)capture.n_checks);
    if (!*checks) {
      cu_graph_free(g, *exec);
      *graph = *exec = NULL;
      for (int i = 0; i < capture.n_checks; i++) cu_release(capture.checks[i].word->owner, capture.checks[i].word);
      capture.n_checks = 0;
      return snprintf(err, cap, "out of memory"), false;
    }
    memcpy(*checks, capture.checks, sizeof **checks * (size_t)capture.n_checks);
    *n_checks = capture.n_checks;
  }
  capture.n_checks = 0;
  return true;
}

void cu_graph_free(void *graph, void *exec) {
  if (!drv.d || !drv.d->stream_begin_capture) return;
  cu_enter();
  if (exec) drv.d->graph_exec_destroy(exec);
  if (graph) drv.d->graph_destroy(graph);
}

bool cu_graph_launch(void *exec, char *err, size_t cap) {
  cu_enter();
  int r = drv.d->graph_launch(exec, current);
  if (r) return snprintf(err, cap, "launching the graph: %s", drv.d->error_string(r)), false;
  return true;
}

cu_block *cu_storage_alloc(size_t bytes, const char *op, em_site site) {
  if (no_device(op, site)) return NULL;
  char err[512];
  cu_block *b = cu_alloc(capture.on && capture.pool ? capture.pool : drv.alloc, bytes, (uintptr_t)current, err, sizeof err);
  if (!b) return rt_error(site, op, "%s", err);
  return b;
}

/* ---- cuBLASLt (dlopen'ed beside cuBLAS, at the first fused epilogue or autotuned GEMM) ---- */

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  void *lib, *handle;
  char why[256];
  cu_lt_api api;
  bool ok;
} ltlib = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void lt_load(void) {
  ltlib.lib = open_cuda_lib("libcublasLt", cublas_majors, 2, ltlib.why, sizeof ltlib.why);
  if (!ltlib.lib) return;
  cu_lt_api *a = &ltlib.api;
#define LT(field, name) (*(void **)&a->field = dlsym(ltlib.lib, name))
  ltlib.ok = LT(create, "cublasLtCreate") && LT(desc_create, "cublasLtMatmulDescCreate") &&
             LT(desc_destroy, "cublasLtMatmulDescDestroy") && LT(desc_set, "cublasLtMatmulDescSetAttribute") &&
             LT(layout_create, "cublasLtMatrixLayoutCreate") && LT(layout_destroy, "cublasLtMatrixLayoutDestroy") &&
             LT(layout_set, "cublasLtMatrixLayoutSetAttribute") && LT(pref_create, "cublasLtMatmulPreferenceCreate") &&
             LT(pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
             LT(pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
             LT(heuristic, "cublasLtMatmulAlgoGetHeuristic") && LT(matmul, "cublasLtMatmul") &&
             LT(version, "cublasLtGetVersion");
#undef LT
  if (!ltlib.ok) snprintf(ltlib.why, sizeof ltlib.why, "libcublasLt lacks a function Ember needs (%s)", dlerror());
}

static const cu_lt_api *real_lt(char *why, size_t cap) {
  pthread_once(&ltlib.once, lt_load);
  if (!ltlib.ok) return snprintf(why, cap, "%s", ltlib.why), NULL;
  return &ltlib.api;
}

static const cu_lt_api *lt_api(char *why, size_t cap) {
  ensure();
  if (!drv.alloc) return snprintf(why, cap, "no CUDA device: %s", drv.why), NULL;
  return drv.d->lt(why, cap);
}

bool cu_lt_available(char *why, size_t cap) { return lt_api(why, cap) != NULL; }

/* The largest power of two up to 256 that divides address p (cuBLASLt's alignment preferences). */
static uint32_t alignment(uint64_t p) {
  uint32_t a = 256;
  while (a > 1 && p % a) a /= 2;
  return a;
}

void cu_lt_describe(const cu_lt_problem *pr, char *buf, size_t cap) {
  char why[256];
  const cu_lt_api *L = lt_api(why, sizeof why);
  snprintf(buf, cap, "lt%zu %s %c%c%s m%d n%d k%d ld%d,%d,%d batch%d stride%lld,%lld,%lld epi%d align%u,%u,%u,%u",
           L ? L->version() : (size_t)0, em_dtype_name(pr->dt), pr->ta ? 'T' : 'N', pr->tb ? 'T' : 'N',
           pr->tf32 ? " tf32" : "", pr->m, pr->n, pr->k, pr->lda, pr->ldb, pr->ldd, pr->batch, (long long)pr->sa,
           (long long)pr->sb, (long long)pr->sd, (int)pr->epi, alignment(pr->a), alignment(pr->b), alignment(pr->d),
           pr->bias ? alignment(pr->bias) : 0);
}

/* One problem's descriptors. */
typedef struct lt_call {
  const cu_lt_api *L;
  void *handle, *desc, *la, *lb, *ld;
  const cu_lt_problem *pr;
} lt_call;

static void lt_call_free(lt_call *c) {
  if (c->desc) c->L->desc_destroy(c->desc);
  if (c->la) c->L->layout_destroy(c->la);
  if (c->lb) c->L->layout_destroy(c->lb);
  if (c->ld) c->L->layout_destroy(c->ld);
}

/* A stored matrix (rows x cols, column-major, leading dimension ld) of batch copies stride apart. */
static int lt_layout(lt_call *c, void **l, uint64_t rows, uint64_t cols, int ld, int64_t stride) {
  int r = c->L->layout_create(l, cuda_type(c->pr->dt), rows, cols, ld);
  int32_t batch = c->pr->batch;
  if (!r && batch > 1) r = c->L->layout_set(*l, CU_LT_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
  if (!r && batch > 1) r = c->L->layout_set(*l, CU_LT_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  return r;
}

static int lt_describe_call(lt_call *c) {
  const cu_lt_problem *pr = c->pr;
  static const uint32_t epilogue[] = {[CU_EPI_NONE] = CU_LT_EPILOGUE_DEFAULT, [CU_EPI_BIAS] = CU_LT_EPILOGUE_BIAS,
                                      [CU_EPI_BIAS_RELU] = CU_LT_EPILOGUE_RELU_BIAS,
                                      [CU_EPI_BIAS_GELU_TANH] = CU_LT_EPILOGUE_GELU_BIAS};
  int32_t ta = pr->ta ? CU_OP_T : CU_OP_N, tb = pr->tb ? CU_OP_T : CU_OP_N;
  uint32_t epi = epilogue[pr->epi];
  const void *bias = (const void *)(uintptr_t)pr->bias;
  int r = c->L->desc_create(&c->desc, compute_type(pr->dt, pr->tf32), pr->dt == EM_F64 ? CU_R_64F : CU_R_32F);
  if (!r) r = c->L->desc_set(c->desc, CU_LT_DESC_TRANSA, &ta, sizeof ta);
  if (!r) r = c->L->desc_set(c->desc, CU_LT_DESC_TRANSB, &tb, sizeof tb);
  if (!r) r = c->L->desc_set(c->desc, CU_LT_DESC_EPILOGUE, &epi, sizeof epi);
  if (!r && pr->epi != CU_EPI_NONE) r = c->L->desc_set(c->desc, CU_LT_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (!r) r = lt_layout(c, &c->la, pr->ta ? pr->k : pr->m, pr->ta ? pr->m : pr->k, pr->lda, pr->sa);
  if (!r) r = lt_layout(c, &c->lb, pr->tb ? pr->n : pr->k, pr->tb ? pr->k : pr->n, pr->ldb, pr->sb);
  if (!r) r = lt_layout(c, &c->ld, pr->m, pr->n, pr->ldd, pr->sd);
  return r;
}

/* Up to `want` candidates from the heuristic, for the problem's pointers' alignments. */
static int lt_candidates(lt_call *c, int want, cu_lt_heuristic *res, int *n) {
  const cu_lt_problem *pr = c->pr;
  void *pref = NULL;
  uint64_t ws = (uint64_t)32 << 20;
  uint32_t al[4] = {alignment(pr->a), alignment(pr->b), alignment(pr->d), alignment(pr->d)};
  int r = c->L->pref_create(&pref);
  if (!r) r = c->L->pref_set(pref, CU_LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  for (int i = 0; i < 4 && !r; i++) r = c->L->pref_set(pref, CU_LT_PREF_MIN_ALIGNMENT_A + i, &al[i], sizeof al[i]);
  *n = 0;
  if (!r) r = c->L->heuristic(c->handle, c->desc, c->la, c->lb, c->ld, c->ld, pref, want, res, n);
  if (pref) c->L->pref_destroy(pref);
  return r;
}

/* Queues one matmul with algo, its workspace from the caching allocator (stream-ordered: it is
 * free for the stream's next work once queued). */
static int lt_run(lt_call *c, const cu_lt_algo *algo, size_t ws, char *why, size_t cap) {
  const cu_lt_problem *pr = c->pr;
  cu_block *w = NULL;
  if (ws && !(w = cu_alloc(capture.on && capture.pool ? capture.pool : drv.alloc, ws, (uintptr_t)current, why, cap)))
    return -1;
  float one = 1, zero = 0;
  double one64 = 1, zero64 = 0;
  const void *alpha = pr->dt == EM_F64 ? (const void *)&one64 : (const void *)&one;
  const void *beta = pr->dt == EM_F64 ? (const void *)&zero64 : (const void *)&zero;
  void *d = (void *)(uintptr_t)pr->d;
  int r = c->L->matmul(c->handle, c->desc, alpha, (const void *)(uintptr_t)pr->a, c->la, (const void *)(uintptr_t)pr->b,
                       c->lb, beta, d, c->ld, d, c->ld, algo, w ? (void *)(uintptr_t)w->ptr : NULL, ws, current);
  if (w) cu_release(w->owner, w);
  return r;
}

int cu_lt_matmul(const cu_lt_problem *pr, cu_lt_choice *ch, char *why, size_t cap) {
  lt_call c = {.pr = pr};
  if (!(c.L = lt_api(why, cap))) return 1;
  cu_enter();
  pthread_mutex_lock(&ltlib.lock);
  if (!ltlib.handle) {
    int r = c.L->create(&ltlib.handle);
    if (r) ltlib.handle = NULL, snprintf(why, cap, "cublasLtCreate failed (status %d)", r);
  }
  c.handle = ltlib.handle;
  pthread_mutex_unlock(&ltlib.lock);
  if (!c.handle) return 2;
  ch->timed = 0;
  int r = lt_describe_call(&c), n = 0, rc = 0;
  cu_lt_heuristic res[8];
  bool tune = ch->tune && !ch->given && !capture.on; /* timing waits for the device: not while capturing */
  if (r) {
    rc = 2, snprintf(why, cap, "describing the GEMM to cuBLASLt failed (status %d)", r);
  } else if (ch->given) {
    res[0] = (cu_lt_heuristic){.algo = ch->algo, .workspace_size = ch->workspace}, n = 1;
  } else if ((r = lt_candidates(&c, tune ? 8 : 1, res, &n)) || n == 0) {
    rc = r && r != CU_BLAS_NOT_SUPPORTED ? 2 : 1;
    snprintf(why, cap, "cuBLASLt has no algorithm for this GEMM (status %d)", r);
  }
  int pick = 0;
  if (!rc && tune && n > 1) { /* each candidate: a warm-up, then five runs between two events */
    const cu_driver *d = drv.d;
    cu_event ev[2] = {NULL, NULL};
    float best = 0;
    pick = -1;
    if (d->event_create(&ev[0], 0) || d->event_create(&ev[1], 0)) rc = 2, snprintf(why, cap, "cuEventCreate failed");
    for (int i = 0; !rc && i < n; i++) {
      if (res[i].state || (r = lt_run(&c, &res[i].algo, res[i].workspace_size, why, cap))) {
        if (r < 0) rc = 2;
        continue; /* a candidate that does not run is no choice */
      }
      r = d->event_record(ev[0], current);
      for (int k = 0; k < 5 && !r; k++) r = lt_run(&c, &res[i].algo, res[i].workspace_size, why, cap);
      float ms = 0;
      if (!r) r = d->event_record(ev[1], current);
      if (!r) r = d->event_sync(ev[1]);
      if (!r) r = d->event_elapsed(&ms, ev[0], ev[1]);
      if (r) rc = 2, snprintf(why, cap, "timing cuBLASLt's algorithm %d failed (%d)", i, r);
      else if (ch->timed++, pick < 0 || ms < best) best = ms, pick = i;
    }
    for (int e = 0; e < 2; e++)
      if (ev[e]) d->event_destroy(ev[e]);
    if (!rc && pick < 0) rc = 1, snprintf(why, cap, "none of cuBLASLt's %d algorithms ran", n);
  }
  if (!rc) { /* the chosen one runs last, so the result is what later calls with it give */
    r = lt_run(&c, &res[pick].algo, res[pick].workspace_size, why, cap);
    if (r) rc = r < 0 || r != CU_BLAS_NOT_SUPPORTED ? 2 : 1;
    if (r > 0) snprintf(why, cap, "cublasLtMatmul failed (status %d)", r);
    else if (!r) ch->algo = res[pick].algo, ch->workspace = res[pick].workspace_size, ch->timed += tune && n == 1;
  }
  lt_call_free(&c);
  return rc;
}

/* ---- cuDNN (dlopen'ed beside cuBLAS, at the first convolution) ----
 *
 * The legacy convolution API, driven as PyTorch's Conv_v7.cpp does: descriptors for x, w, y and
 * the convolution (padding, stride, dilation, groups, cross-correlation, compute type f32 for
 * the half types), the _v7 heuristic's ranking of algorithms, and the first that runs within the
 * workspace the caching allocator gives. */

static struct {
  pthread_once_t once;
  pthread_mutex_t lock; /* one handle: its stream is set per call */
  void *lib, *handle;
  char why[256];
  cu_dnn_api api;
  bool ok;
} dnnlib = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void dnn_load(void) {
  static const char *const majors[] = {"9"};
  dnnlib.lib = open_cuda_lib("libcudnn", majors, 1, dnnlib.why, sizeof dnnlib.why);
  if (!dnnlib.lib) return;
  cu_dnn_api *a = &dnnlib.api;
#define DNN(field, name) (*(void **)&a->field = dlsym(dnnlib.lib, name))
  dnnlib.ok = DNN(version, "cudnnGetVersion") && DNN(error_string, "cudnnGetErrorString") &&
              DNN(create, "cudnnCreate") && DNN(set_stream, "cudnnSetStream") &&
              DNN(tensor_create, "cudnnCreateTensorDescriptor") &&
              DNN(tensor_destroy, "cudnnDestroyTensorDescriptor") && DNN(tensor_set, "cudnnSetTensor4dDescriptorEx") &&
              DNN(filter_create, "cudnnCreateFilterDescriptor") &&
              DNN(filter_destroy, "cudnnDestroyFilterDescriptor") &&
              DNN(filter_set, "cudnnSetFilter4dDescriptor") && DNN(conv_create, "cudnnCreateConvolutionDescriptor") &&
              DNN(conv_destroy, "cudnnDestroyConvolutionDescriptor") &&
              DNN(conv_set, "cudnnSetConvolution2dDescriptor") && DNN(conv_groups, "cudnnSetConvolutionGroupCount") &&
              DNN(conv_math, "cudnnSetConvolutionMathType") &&
              DNN(fwd_algos, "cudnnGetConvolutionForwardAlgorithm_v7") &&
              DNN(bwd_data_algos, "cudnnGetConvolutionBackwardDataAlgorithm_v7") &&
              DNN(bwd_filter_algos, "cudnnGetConvolutionBackwardFilterAlgorithm_v7") &&
              DNN(fwd, "cudnnConvolutionForward") && DNN(bwd_data, "cudnnConvolutionBackwardData") &&
              DNN(bwd_filter, "cudnnConvolutionBackwardFilter");
#undef DNN
  if (!dnnlib.ok) snprintf(dnnlib.why, sizeof dnnlib.why, "libcudnn lacks a function Ember needs (%s)", dlerror());
  /* the library's major version is the ABI (cudnn.h's CUDNN_VERSION is major * 10000 + ...) */
  else if (a->version() / 10000 != 9)
    dnnlib.ok = false,
    snprintf(dnnlib.why, sizeof dnnlib.why, "cuDNN %zu is not version 9, whose ABI Ember speaks", a->version());
}

static const cu_dnn_api *real_dnn(char *why, size_t cap) {
  pthread_once(&dnnlib.once, dnn_load);
  if (!dnnlib.ok) return snprintf(why, cap, "%s", dnnlib.why), NULL;
  return &dnnlib.api;
}

static const cu_dnn_api *dnn_api(char *why, size_t cap) {
  ensure();
  if (!drv.alloc) return snprintf(why, cap, "no CUDA device: %s", drv.why), NULL;
  return drv.d->dnn(why, cap);
}

bool cu_dnn_available(char *why, size_t cap) { return dnn_api(why, cap) != NULL; }

/* The most workspace one convolution may take (PyTorch lets cuDNN have what the allocator can
 * find; a fixed cap keeps a heuristic's greedy choice from emptying the cache). */
#define DNN_MAX_WORKSPACE ((size_t)1 << 30)

/* One call's descriptors. */
typedef struct dnn_call {
  const cu_dnn_api *D;
  void *x, *y, *w, *conv;
} dnn_call;

static void dnn_call_free(dnn_call *c) {
  if (c->x) c->D->tensor_destroy(c->x);
  if (c->y) c->D->tensor_destroy(c->y);
  if (c->w) c->D->filter_destroy(c->w);
  if (c->conv) c->D->conv_destroy(c->conv);
}

static int dnn_type(em_dtype dt) {
  return dt == EM_F32 ? CU_DNN_DATA_FLOAT : dt == EM_F64 ? CU_DNN_DATA_DOUBLE : dt == EM_F16 ? CU_DNN_DATA_HALF
                                                                                           : CU_DNN_DATA_BFLOAT16;
}

static int dnn_describe(dnn_call *c, const cu_dnn_problem *p) {
  const cu_dnn_api *D = c->D;
  int type = dnn_type(p->dt), r;
  /* as PyTorch: f32 without TF32 asks for FMA math, so no algorithm rounds the operands to 10
   * bits; the half types may use tensor cores; f64 has none */
  int math = p->dt == EM_F32 && !p->tf32 ? CU_DNN_FMA_MATH
           : p->dt == EM_F16 || p->dt == EM_BF16 ? CU_DNN_TENSOR_OP_MATH : CU_DNN_DEFAULT_MATH;
  if ((r = D->tensor_create(&c->x)) || (r = D->tensor_create(&c->y)) || (r = D->filter_create(&c->w)) ||
      (r = D->conv_create(&c->conv)))
    return r;
  if ((r = D->tensor_set(c->x, type, p->x[0], p->x[1], p->x[2], p->x[3], p->xs[0], p->xs[1], p->xs[2], p->xs[3])) ||
      (r = D->tensor_set(c->y, type, p->y[0], p->y[1], p->y[2], p->y[3], p->ys[0], p->ys[1], p->ys[2], p->ys[3])) ||
      (r = D->filter_set(c->w, type, CU_DNN_TENSOR_NCHW, p->w[0], p->w[1], p->w[2], p->w[3])))
    return r;
  if ((r = D->conv_set(c->conv, p->pad[0], p->pad[1], p->stride[0], p->stride[1], p->dilation[0], p->dilation[1],
                       CU_DNN_CROSS_CORRELATION, p->dt == EM_F64 ? CU_DNN_DATA_DOUBLE : CU_DNN_DATA_FLOAT)) ||
      (r = D->conv_groups(c->conv, p->groups)))
    return r;
  return D->conv_math(c->conv, math);
}

static int dnn_run(dnn_call *c, const cu_dnn_problem *p, const cu_dnn_perf *perf, void *handle, char *why, size_t cap) {
  cu_block *w = NULL;
  cu_allocator *from = capture.on && capture.pool ? capture.pool : drv.alloc;
  if (perf->memory && !(w = cu_alloc(from, perf->memory, (uintptr_t)current, why, cap))) return -1;
  float one = 1, zero = 0;
  double one64 = 1, zero64 = 0; /* cuDNN's scaling factors are double for double data, else float */
  const void *alpha = p->dt == EM_F64 ? (const void *)&one64 : (const void *)&one;
  const void *beta = p->dt == EM_F64 ? (const void *)&zero64 : (const void *)&zero;
  void *ws = w ? (void *)(uintptr_t)w->ptr : NULL, *x = (void *)(uintptr_t)p->xp, *wt = (void *)(uintptr_t)p->wp;
  void *y = (void *)(uintptr_t)p->yp;
  const cu_dnn_api *D = c->D;
  int r = D->conv_math(c->conv, perf->math_type); /* the algorithm was ranked for this math type */
  if (!r && p->op == EM_PRIM_CONV2D)
    r = D->fwd(handle, alpha, c->x, x, c->w, wt, c->conv, perf->algo, ws, perf->memory, beta, c->y, y);
  else if (!r && p->op == EM_PRIM_CONV2D_BWD_INPUT)
    r = D->bwd_data(handle, alpha, c->w, wt, c->y, y, c->conv, perf->algo, ws, perf->memory, beta, c->x, x);
  else if (!r)
    r = D->bwd_filter(handle, alpha, c->x, x, c->y, y, c->conv, perf->algo, ws, perf->memory, beta, c->w, wt);
  if (w) cu_release(w->owner, w);
  return r;
}

static int64_t dnn_convs;
int64_t cu_dnn_convs(void) { return __atomic_load_n(&dnn_convs, __ATOMIC_RELAXED); }

int cu_dnn_conv(const cu_dnn_problem *p, char *why, size_t cap) {
  dnn_call c = {0};
  if (!(c.D = dnn_api(why, cap))) return 1;
  const cu_dnn_api *D = c.D;
  cu_enter();
  pthread_mutex_lock(&dnnlib.lock);
  int r = 0, rc = 0, n = 0;
  if (!dnnlib.handle && (r = D->create(&dnnlib.handle))) dnnlib.handle = NULL;
  if (!dnnlib.handle) {
    pthread_mutex_unlock(&dnnlib.lock);
    return snprintf(why, cap, "cudnnCreate failed (%s)", D->error_string(r)), 1;
  }
  void *h = dnnlib.handle;
  cu_dnn_perf perf[8];
  const char *dir = p->op == EM_PRIM_CONV2D ? "forward" : p->op == EM_PRIM_CONV2D_BWD_INPUT ? "backward data"
                                                                                           : "backward filter";
  if ((r = D->set_stream(h, current)) || (r = dnn_describe(&c, p))) {
    rc = r == CU_DNN_STATUS_NOT_SUPPORTED || r == CU_DNN_STATUS_BAD_PARAM ? 1 : 2;
    snprintf(why, cap, "describing the %s convolution to cuDNN failed (%s)", dir, D->error_string(r));
  } else {
    if (p->op == EM_PRIM_CONV2D) r = D->fwd_algos(h, c.x, c.w, c.conv, c.y, 8, &n, perf);
    else if (p->op == EM_PRIM_CONV2D_BWD_INPUT) r = D->bwd_data_algos(h, c.w, c.y, c.conv, c.x, 8, &n, perf);
    else r = D->bwd_filter_algos(h, c.x, c.y, c.conv, c.w, 8, &n, perf);
    if (r) rc = 1, snprintf(why, cap, "cuDNN's %s heuristic failed (%s)", dir, D->error_string(r));
  }
  /* the heuristic's ranking, best first: the first that cuDNN runs within the workspace cap */
  bool ran = false;
  int tried = 0;
  for (int i = 0; !rc && !ran && i < n && i < 8; i++) {
    if (perf[i].status || perf[i].memory > DNN_MAX_WORKSPACE) continue;
    if (p->dt == EM_F32 && !p->tf32 && perf[i].math_type != CU_DNN_FMA_MATH && perf[i].math_type != CU_DNN_DEFAULT_MATH)
      continue; /* an algorithm on tensor cores would round f32 to TF32 */
    tried++;
    r = dnn_run(&c, p, &perf[i], h, why, cap);
    if (!r) ran = true;
    else if (r > 0 && r != CU_DNN_STATUS_NOT_SUPPORTED && r != CU_DNN_STATUS_BAD_PARAM)
      rc = 2, snprintf(why, cap, "cuDNN's %s convolution (algorithm %d) failed (%s)", dir, perf[i].algo,
                       D->error_string(r));
    /* r < 0: the workspace did not fit in memory; r NOT_SUPPORTED: this algorithm refuses the problem */
  }
  if (!rc && !ran)
    rc = 1, snprintf(why, cap, "cuDNN has no %s algorithm for this convolution (%d offered, %d tried)", dir, n, tried);
  if (ran) __atomic_add_fetch(&dnn_convs, 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&dnnlib.lock);
  dnn_call_free(&c);
  return rc;
}

/* Pinned staging: two buffers of STAGE bytes, each guarded by an event recorded after the copy
 * that uses it, so a copy of n bytes overlaps the host's memcpy into (or out of) one buffer with
 * the transfer through the other. Uploads return once the last piece is queued; downloads wait
 * for it. One mutex: copies from several threads take turns. */
#define STAGE ((size_t)4 << 20)
static struct {
  pthread_mutex_t lock;
  char *buf[2];
  cu_event done[2];
  bool pending[2];
  bool failed;
} stage = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool stage_ready(void) {
  if (stage.buf[0]) return true;
  if (stage.failed) return false;
  for (int i = 0; i < 2; i++) {
    void *p = NULL;
    if (drv.d->host_alloc(&p, STAGE, 0) || drv.d->event_create(&stage.done[i], 2 /* CU_EVENT_DISABLE_TIMING */)) {
      stage.failed = true;
      return false;
    }
    stage.buf[i] = p;
  }
  return true;
}

bool cu_copy_to_device(uint64_t dst, const void *src, size_t bytes, const char *op, em_site site) {
  if (!bytes) return true;
  cu_enter();
  pthread_mutex_lock(&stage.lock);
  int r = 0;
  if (!stage_ready()) { /* no pinned memory: a pageable copy, which the driver stages itself */
    r = drv.d->memcpy_htod(dst, src, bytes, current);
  } else {
    for (size_t done = 0, k = 0; done < bytes && !r; done += STAGE, k ^= 1) {
      size_t n = bytes - done < STAGE ? bytes - done : STAGE;
      if (stage.pending[k] && (r = drv.d->event_sync(stage.done[k]))) break;
      memcpy(stage.buf[k], (const char *)src + done, n);
      r = drv.d->memcpy_htod(dst + done, stage.buf[k], n, current);
      if (!r) r = drv.d->event_record(stage.done[k], current);
      stage.pending[k] = !r;
    }
  }
  pthread_mutex_unlock(&stage.lock);
  if (r) return rt_error(site, op, "copying %zu bytes to the device: %s", bytes, drv.d->error_string(r)), false;
  return true;
}

bool cu_copy_to_host(void *dst, uint64_t src, size_t bytes, const char *op, em_site site) {
  cu_enter();
  pthread_mutex_lock(&stage.lock);
  int r = 0;
  if (!stage_ready()) {
    r = drv.d->memcpy_dtoh(dst, src, bytes, current);
    if (!r) r = drv.d->stream_sync(current);
  } else { /* chunk k lands in buffer k % 2 while the host copies chunk k - 1 out of the other */
    size_t chunks = (bytes + STAGE - 1) / STAGE;
    for (size_t k = 0; k <= chunks && !r; k++) {
      if (k < chunks) {
        size_t n = bytes - k * STAGE < STAGE ? bytes - k * STAGE : STAGE;
        if (stage.pending[k & 1] && (r = drv.d->event_sync(stage.done[k & 1]))) break; /* an upload still reads it */
        r = drv.d->memcpy_dtoh(stage.buf[k & 1], src + k * STAGE, n, current);
        if (!r) r = drv.d->event_record(stage.done[k & 1], current);
        stage.pending[k & 1] = !r;
      }
      if (k > 0 && !r) {
        size_t j = k - 1, n = bytes - j * STAGE < STAGE ? bytes - j * STAGE : STAGE;
        r = drv.d->event_sync(stage.done[j & 1]);
        stage.pending[j & 1] = false;
        if (!r) memcpy((char *)dst + j * STAGE, stage.buf[j & 1], n);
      }
    }
    if (!bytes) r = drv.d->stream_sync(current);
  }
  pthread_mutex_unlock(&stage.lock);
  if (r) return rt_error(site, op, "copying %zu bytes from the device: %s", bytes, drv.d->error_string(r)), false;
  return true;
}

/* ---- the kernel cache ----
 *
 * In memory: key -> function, in an open-addressing table looked up before any source is
 * generated (an eager op's launch costs a hash probe, not a code generation). On disk: in
 * cuda/ under the kernel cache's directory (runtime/cache.c), one file per kernel named by a
 * 128-bit hash of (driver, arch, source), holding a header with the source's length and hash and
 * the image's hash, then the image (a cubin; a shared object for the emulator). Written to a
 * temporary file and renamed; a damaged file fails its check and is compiled again. */

typedef struct { uint64_t key; cu_kernel_key k; cu_function f; } kslot; /* key 0: empty */
static struct {
  pthread_mutex_t lock;
  kslot *slot;
  int cap, n;
  char dir[1024];
  bool dir_done;
  int64_t replaced; /* disk entries that loaded without their kernel: compiled again */
} kc = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Generated kernels of compiled graphs, by their source: a kernel's name is its key (it hashes
 * the source), so a lookup compares names. */
static struct {
  char (*name)[64];
  cu_function *f;
  int n, cap;
} sk;

void cu_kernel_cache_forget(int64_t *replaced) {
  pthread_mutex_lock(&kc.lock);
  free(kc.slot);
  kc.slot = NULL, kc.cap = kc.n = 0;
  sk.n = 0; /* the generated kernels too */
  if (replaced) *replaced = kc.replaced;
  pthread_mutex_unlock(&kc.lock);
}

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
  return h;
}

static void kc_dir(void) {
  if (kc.dir_done) return;
  kc.dir_done = true;
  const char *base = rt_cache_dir();
  if (!base) return;
  snprintf(kc.dir, sizeof kc.dir, "%s/cuda", base);
  if (!rt_mkdirs(kc.dir)) kc.dir[0] = 0;
}

typedef struct { char magic[8]; uint64_t src_len, src_hash, image_size, image_hash; } kc_header;
#define KC_MAGIC "EMBRCU01"

static char *disk_read(const char *path, const char *src, size_t *size) {
  int64_t file_size;
  FILE *f = rt_cache_open(path, &file_size);
  if (!f) return NULL;
  kc_header h;
  char *img = NULL;
  size_t n = strlen(src);
  bool ok = fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, KC_MAGIC, 8) && h.src_len == n &&
            h.src_hash == fnv(src, n, 0xcbf29ce484222325ull) && h.image_size > 0 &&
            h.image_size == (uint64_t)file_size - sizeof h;
  if (ok) ok = (img = malloc(h.image_size)) && fread(img, 1, h.image_size, f) == h.image_size && fgetc(f) == EOF &&
               fnv(img, h.image_size, 0xcbf29ce484222325ull) == h.image_hash;
  fclose(f);
  if (!ok) return free(img), NULL;
  *size = h.image_size;
  return img;
}

static void disk_write(const char *path, const char *src, const char *img, size_t size) {
  size_t n = strlen(src);
  kc_header h = {.src_len = n, .src_hash = fnv(src, n, 0xcbf29ce484222325ull), .image_size = size,
                 .image_hash = fnv(img, size, 0xcbf29ce484222325ull)};
  memcpy(h.magic, KC_MAGIC, 8);
  rt_write_file_whole(path, &h, sizeof h, img, size);
}

static uint64_t key_of(const cu_kernel_key *k) {
  uint32_t v[6] = {(uint32_t)k->family, (uint32_t)k->op, (uint32_t)k->in, (uint32_t)k->out, (uint32_t)k->idx, (uint32_t)k->layout};
  uint64_t h = fnv(v, sizeof v, 0xcbf29ce484222325ull);
  return h ? h : 1;
}

static kslot *kc_find(uint64_t key, const cu_kernel_key *k) {
  if (!kc.cap) return NULL;
  for (uint64_t i = key * 0x9e3779b97f4a7c15ull >> 7;; i++) {
    kslot *s = &kc.slot[i & (uint64_t)(kc.cap - 1)];
    if (!s->key || (s->key == key && !memcmp(&s->k, k, sizeof *k))) return s;
  }
}

static bool kc_insert(uint64_t key, const cu_kernel_key *k, cu_function f) {
  if (2 * (kc.n + 1) > kc.cap) {
    int cap = kc.cap ? 2 * kc.cap : 256;
    kslot *old = kc.slot, *nw = calloc((size_t)cap, sizeof *nw);
    if (!nw) return false;
    int oc = kc.cap;
    kc.slot = nw, kc.cap = cap;
    for (int i = 0; i < oc; i++)
      if (old[i].key) *kc_find(old[i].key, &old[i].k) = old[i];
    free(old);
  }
  kslot *s = kc_find(key, k);
  s->key = key, s->k = *k, s->f = f, kc.n++;
  return true;
}

/* The prelude and body as one source (NULL without memory), and its disk cache path ("" without
 * a cache directory: kc_dir first). */
static char *full_source(const char *body, char *path, size_t pcap) {
  const char *pre = cu_kernel_prelude();
  size_t np = strlen(pre), nb = strlen(body);
  char *src = malloc(np + nb + 1);
  path[0] = 0;
  if (!src) return NULL;
  memcpy(src, pre, np), memcpy(src + np, body, nb + 1);
  if (kc.dir[0]) {
    uint64_t h1 = fnv(drv.d->name, strlen(drv.d->name), 0xcbf29ce484222325ull);
    h1 = fnv(drv.d->cache_salt, strlen(drv.d->cache_salt), h1);
    h1 = fnv(drv.arch, strlen(drv.arch), h1);
    uint64_t h2 = fnv(src, np + nb, 0x84222325cbf29ce4ull);
    h1 = fnv(src, np + nb, h1);
    snprintf(path, pcap, "%s/%016llx%016llx.bin", kc.dir, (unsigned long long)h1, (unsigned long long)h2);
  }
  return src;
}

/* Compiles src (its first kernel `name`), writing the image to the disk cache at path (if any).
 * Safe on several threads at once (NVRTC and the host compiler are). */
static bool compile_source(const char *src, const char *name, const char *path, char **img, size_t *size, char *err,
                           size_t cap) {
  char *log = NULL;
  bool ok = drv.d->compile(src, name, img, size, &log);
  if (!ok) snprintf(err, cap, "compiling CUDA kernel %s failed: %s", name, log ? log : "?");
  else if (path[0]) disk_write(path, src, *img, *size);
  free(log);
  return ok;
}

/* Loads the module of image img (taken: freed here) of src, and its kernels names[0..n) into
 * fs[]. An entry whose checksums pass can still hold another kernel's image (a file copied over
 * another): it loads without the function. Then it is compiled again and the entry replaced,
 * once, instead of failing the op on every call (issue 17). The bad module stays loaded. */
static bool load_image(const char *src, const char *path, char *img, size_t size, bool from_disk, const char *const *names,
                       int n, cu_function *fs, char *err, size_t cap) {
  bool ok = false;
  for (;;) {
    cu_enter();
    void *mod = NULL;
    int r = drv.d->module_load(&mod, img);
    for (int i = 0; !r && i < n; i++) r = drv.d->module_get_function(&fs[i], mod, names[i]);
    if (!r) {
      ok = true;
      break;
    }
    if (!from_disk) {
      snprintf(err, cap, "loading CUDA kernel %s: %s", names[0], drv.d->error_string(r));
      break;
    }
    from_disk = false;
    free(img), img = NULL;
    if (!compile_source(src, names[0], path, &img, &size, err, cap)) break;
    kc.replaced++;
  }
  free(img);
  return ok;
}

/* The kernels names[0..n) of body (after the prelude), one module: from the disk cache, else
 * compiled and written there, then loaded, the functions into fs[]. Under kc.lock. */
static bool load_source(const char *body, const char *const *names, int n, cu_function *fs, char *err, size_t cap) {
  char path[1200];
  size_t size = 0;
  kc_dir();
  char *src = full_source(body, path, sizeof path), *img = NULL;
  if (!src) return snprintf(err, cap, "out of memory"), false;
  if (path[0]) img = disk_read(path, src, &size);
  bool from_disk = img != NULL, ok = img || compile_source(src, names[0], path, &img, &size, err, cap);
  ok = ok && load_image(src, path, img, size, from_disk, names, n, fs, err, cap);
  free(src);
  return ok;
}

cu_function cu_kernel(const cu_kernel_key *k, char *err, size_t cap) {
  uint64_t key = key_of(k);
  pthread_mutex_lock(&kc.lock);
  kslot *s = kc_find(key, k);
  if (s && s->key) {
    cu_function f = s->f;
    pthread_mutex_unlock(&kc.lock);
    return f;
  }
  char name[128], *body = NULL;
  cu_function f = NULL;
  if (!cu_kernel_body(k, &body, name, sizeof name))
    snprintf(err, cap, "no CUDA kernel for %s on these dtypes", prim_get(k->op)->name);
  else if (load_source(body, (const char *const[]){name}, 1, &f, err, cap) && !kc_insert(key, k, f))
    snprintf(err, cap, "out of memory"), f = NULL;
  pthread_mutex_unlock(&kc.lock);
  free(body);
  return f;
}

static void sk_add(const char *name, cu_function f) {
  if (sk.n == sk.cap) {
    int c = sk.cap ? 2 * sk.cap : 64;
    char(*nn)[64] = realloc(sk.name, sizeof *nn * (size_t)c);
    if (nn) sk.name = nn;
    cu_function *nf = nn ? realloc(sk.f, sizeof *nf * (size_t)c) : NULL;
    if (nf) sk.f = nf, sk.cap = c;
  }
  if (sk.n < sk.cap) snprintf(sk.name[sk.n], sizeof sk.name[0], "%s", name), sk.f[sk.n++] = f;
}

bool cu_source_kernels(const char *body, const char *const *names, int n, cu_function *fs, char *err, size_t cap) {
  if (n < 1 || n > 8) return snprintf(err, cap, "%d kernels in one module", n), false;
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) >= sizeof sk.name[0]) return snprintf(err, cap, "kernel name too long: %s", names[i]), false;
  pthread_mutex_lock(&kc.lock);
  int found = 0;
  for (int q = 0; q < n; q++) {
    fs[q] = NULL;
    for (int i = 0; i < sk.n && !fs[q]; i++)
      if (!strcmp(sk.name[i], names[q])) fs[q] = sk.f[i];
    found += fs[q] != NULL;
  }
  bool ok = found == n;
  if (!ok && (ok = load_source(body, names, n, fs, err, cap)))
    for (int q = 0; q < n; q++) sk_add(names[q], fs[q]);
  pthread_mutex_unlock(&kc.lock);
  return ok;
}

cu_function cu_source_kernel(const char *body, const char *name, char *err, size_t cap) {
  cu_function f = NULL;
  return cu_source_kernels(body, &name, 1, &f, err, cap) ? f : NULL;
}

/* ---- compiling a program's kernels on several threads ----
 * A compiled graph's kernels that neither cache holds compile at once on up to min(4, cores)
 * threads (NVRTC takes about as long per kernel as the rest of compiling a graph); each job
 * writes its own disk entry, and the modules load afterwards in the kernels' order, so the
 * results and the cache's contents do not depend on the threads. */
static int compile_threads_set; /* tests: cu_set_compile_threads */
static _Thread_local cu_compile_stats compile_stats;
void cu_set_compile_threads(int n) { compile_threads_set = n; }
cu_compile_stats cu_compile_stats_get(void) { return compile_stats; }

typedef struct mod_job {
  char *src, *img, path[1200], err[512];
  const char *name;
  size_t size;
  int same; /* 1 + an earlier job of the batch with the same kernels, else 0 */
  bool ok;
} mod_job;
typedef struct mod_jobs {
  mod_job *j;
  int *pending, n;
  pthread_mutex_t lock;
  int next;
} mod_jobs;

static void *compile_worker(void *arg) {
  mod_jobs *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->lock);
    int i = c->next < c->n ? c->pending[c->next++] : -1;
    pthread_mutex_unlock(&c->lock);
    if (i < 0) return NULL;
    mod_job *m = &c->j[i];
    m->ok = compile_source(m->src, m->name, m->path, &m->img, &m->size, m->err, sizeof m->err);
  }
}

bool cu_source_modules(cu_module_req *req, int n, char *err, size_t cap) {
  mod_job *jobs = calloc((size_t)(n > 0 ? n : 1), sizeof *jobs);
  int *pending = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)), n_pending = 0, failed = 0, first_bad = -1;
  if (!jobs || !pending) return free(jobs), free(pending), snprintf(err, cap, "out of memory"), false;
  pthread_mutex_lock(&kc.lock);
  kc_dir();
  for (int i = 0; i < n; i++) { /* in memory, on disk, or to compile */
    cu_module_req *r = &req[i];
    int found = 0;
    for (int q = 0; q < r->n_names; q++) {
      r->fns[q] = NULL;
      for (int e = 0; e < sk.n && !r->fns[q]; e++)
        if (!strcmp(sk.name[e], r->names[q])) r->fns[q] = sk.f[e];
      found += r->fns[q] != NULL;
    }
    jobs[i].ok = true;
    if (found == r->n_names) continue;
    for (int e = 0; e < i && !jobs[i].same; e++) /* a graph's identical kernels: one compile */
      if (jobs[e].name && !strcmp(jobs[e].name, r->names[0])) jobs[i].same = 1 + (jobs[e].same ? jobs[e].same - 1 : e);
    if (jobs[i].same) continue;
    jobs[i].name = r->names[0];
    if (!(jobs[i].src = full_source(r->body, jobs[i].path, sizeof jobs[i].path))) {
      jobs[i].ok = false, snprintf(jobs[i].err, sizeof jobs[i].err, "out of memory");
      continue;
    }
    if (jobs[i].path[0]) jobs[i].img = disk_read(jobs[i].path, jobs[i].src, &jobs[i].size);
    if (!jobs[i].img) pending[n_pending++] = i;
  }
  pthread_mutex_unlock(&kc.lock);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = compile_threads_set > 0 ? compile_threads_set : cores < 4 ? (int)(cores > 1 ? cores : 1) : 4;
  if (nt > n_pending) nt = n_pending;
  mod_jobs c = {jobs, pending, n_pending, PTHREAD_MUTEX_INITIALIZER, 0};
  pthread_t th[8];
  int started = 0;
  for (int t = 1; t < nt && t < 8; t++) started += !pthread_create(&th[started], NULL, compile_worker, &c);
  compile_worker(&c); /* this thread too; the others' failures to start leave it the work */
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  compile_stats.compiled += n_pending;
  if (started + 1 > compile_stats.max_threads && n_pending) compile_stats.max_threads = started + 1;
  pthread_mutex_lock(&kc.lock);
  for (int i = 0; i < n; i++) { /* load in order */
    cu_module_req *r = &req[i];
    mod_job *m = &jobs[i];
    if (m->same) {
      m->ok = jobs[m->same - 1].ok;
      for (int q = 0; q < r->n_names; q++) r->fns[q] = req[m->same - 1].fns[q];
      snprintf(m->err, sizeof m->err, "%s", jobs[m->same - 1].err);
    } else if (m->ok && m->src) {
      bool from_disk = true;
      for (int t = 0; t < n_pending; t++) from_disk &= pending[t] != i;
      m->ok = load_image(m->src, m->path, m->img, m->size, from_disk, r->names, r->n_names, r->fns, m->err, sizeof m->err);
      m->img = NULL;
      for (int q = 0; m->ok && q < r->n_names; q++) sk_add(r->names[q], r->fns[q]);
    }
    if (!m->ok && failed++ == 0) first_bad = i;
    free(m->src), free(m->img);
  }
  pthread_mutex_unlock(&kc.lock);
  if (failed > 1) snprintf(err, cap, "%s (and %d more of the %d kernels failed)", jobs[first_bad].err, failed - 1, n);
  else if (failed) snprintf(err, cap, "%s", jobs[first_bad].err);
  free(jobs), free(pending);
  return !failed;
}

/* ---- the profiler's device timeline ----
 * While profiling (rt_prof_on), each named launch is bracketed by two events on its stream; when
 * the trace is written (cu_prof_collect) their times become complete events on a "CUDA" track.
 * Device time is placed on the host's clock through a reference event recorded right after a
 * sync at the first profiled launch (the stream idle: the event's time is the host's then). */
typedef struct prof_launch {
  cu_event start, end;
  char name[64];
} prof_launch;
static struct {
  pthread_mutex_t lock;
  prof_launch *v;
  int n, cap;
  cu_event ref;
  uint64_t ref_host;
} prof = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, NULL, 0};

static void prof_begin(cu_event *ev) {
  ev[0] = ev[1] = NULL;
  if (capture.on) return; /* a captured launch runs later, in the graph */
  pthread_mutex_lock(&prof.lock);
  if (!prof.ref && !drv.d->event_create(&prof.ref, 0)) {
    drv.d->stream_sync(current);
    drv.d->event_record(prof.ref, current);
    drv.d->event_sync(prof.ref);
    prof.ref_host = rt_prof_now();
  }
  bool room = prof.n < prof.cap;
  if (!room) {
    int c = prof.cap ? 2 * prof.cap : 256;
    prof_launch *q = realloc(prof.v, sizeof *q * (size_t)c);
    if (q) prof.v = q, prof.cap = c, room = true;
  }
  pthread_mutex_unlock(&prof.lock);
  if (!room || !prof.ref || drv.d->event_create(&ev[0], 0) || drv.d->event_create(&ev[1], 0) ||
      drv.d->event_record(ev[0], current)) {
    if (ev[0]) drv.d->event_destroy(ev[0]);
    if (ev[1]) drv.d->event_destroy(ev[1]);
    ev[0] = ev[1] = NULL;
  }
}

static void prof_end(const char *name, cu_event *ev) {
  if (!ev[0]) return;
  if (drv.d->event_record(ev[1], current)) {
    drv.d->event_destroy(ev[0]), drv.d->event_destroy(ev[1]);
    return;
  }
  pthread_mutex_lock(&prof.lock);
  prof_launch *l = &prof.v[prof.n++]; /* room was made in prof_begin */
  l->start = ev[0], l->end = ev[1];
  snprintf(l->name, sizeof l->name, "%s", name);
  pthread_mutex_unlock(&prof.lock);
}

void cu_prof_collect(void) {
  if (!drv.d) return;
  pthread_mutex_lock(&prof.lock);
  if (prof.n) cu_enter();
  for (int i = 0; i < prof.n; i++) {
    prof_launch *l = &prof.v[i];
    float t0 = 0, t1 = 0;
    if (!drv.d->event_sync(l->end) && !drv.d->event_elapsed(&t0, prof.ref, l->start) &&
        !drv.d->event_elapsed(&t1, prof.ref, l->end))
      rt_prof_device(l->name, prof.ref_host + (uint64_t)((double)t0 * 1e6), (uint64_t)((double)(t1 > t0 ? t1 - t0 : 0) * 1e6));
    drv.d->event_destroy(l->start), drv.d->event_destroy(l->end);
  }
  prof.n = 0;
  if (prof.ref) drv.d->event_destroy(prof.ref), prof.ref = NULL;
  pthread_mutex_unlock(&prof.lock);
}

bool cu_launch_named(cu_function f, const char *name, int64_t n, unsigned block, void **params, char *err, size_t cap) {
  if (n <= 0) return true;
  int64_t blocks = (n + block - 1) / block;
  if (blocks > 65535 * 8) blocks = 65535 * 8; /* grid-stride loops cover the rest */
  cu_enter();
  cu_event ev[2] = {NULL, NULL};
  if (name && RT_PROF_ON()) prof_begin(ev);
  int r = drv.d->launch(f, (unsigned)blocks, 1, 1, block, 1, 1, 0, current, params, NULL);
  if (ev[0]) {
    if (r) drv.d->event_destroy(ev[0]), drv.d->event_destroy(ev[1]);
    else prof_end(name, ev);
  }
  if (r) return snprintf(err, cap, "launching a kernel: %s", drv.d->error_string(r)), false;
  return true;
}

bool cu_launch(cu_function f, int64_t n, unsigned block, void **params, char *err, size_t cap) {
  return cu_launch_named(f, NULL, n, block, params, err, cap);
}
