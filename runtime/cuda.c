/* runtime/cuda.c: the CUDA driver, loaded at run time, device discovery and properties, and the
 * process's caching allocator for device 0 over cuMemAlloc/cuMemFree. See cuda.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cuda.h"
#include "rt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The driver ABI (cuda.h). */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
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
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetName)(char *, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuGetErrorString)(CUresult, const char **);
} drv = {.once = PTHREAD_ONCE_INIT};

static const char *cu_error(CUresult r) {
  const char *s = NULL;
  if (drv.cuGetErrorString && drv.cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown CUDA error";
}

static int device_alloc(void *ctx, size_t bytes, uint64_t *ptr, char *why, size_t cap) {
  (void)ctx;
  CUdeviceptr p = 0;
  drv.cuCtxSetCurrent(drv.ctx);
  CUresult r = drv.cuMemAlloc(&p, bytes);
  if (r == CUDA_SUCCESS) return *ptr = p, 0;
  snprintf(why, cap, "cuMemAlloc: %s", cu_error(r));
  return r == CUDA_ERROR_OUT_OF_MEMORY ? 1 : 2;
}

static void device_free(void *ctx, uint64_t ptr) {
  (void)ctx;
  drv.cuCtxSetCurrent(drv.ctx);
  drv.cuMemFree((CUdeviceptr)ptr);
}

static void load(void) {
  const char *names[] = {"libcuda.so.1", "libcuda.so"};
  for (int i = 0; i < 2 && !drv.lib; i++) drv.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!drv.lib) {
    snprintf(drv.why, sizeof drv.why, "no CUDA driver (libcuda.so.1 did not load: %s)", dlerror());
    return;
  }
#define SYM(field, name) (*(void **)&drv.field = dlsym(drv.lib, name))
  bool ok = SYM(cuInit, "cuInit") && SYM(cuDeviceGetCount, "cuDeviceGetCount") && SYM(cuDeviceGet, "cuDeviceGet") &&
            SYM(cuDeviceGetName, "cuDeviceGetName") && SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
            SYM(cuDeviceTotalMem, "cuDeviceTotalMem_v2") && SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
            SYM(cuCtxSetCurrent, "cuCtxSetCurrent") && SYM(cuMemAlloc, "cuMemAlloc_v2") && SYM(cuMemFree, "cuMemFree_v2");
  SYM(cuGetErrorString, "cuGetErrorString");
#undef SYM
  if (!ok) {
    snprintf(drv.why, sizeof drv.why, "the CUDA driver lacks a function Ember needs (%s)", dlerror());
    return;
  }
  CUresult r = drv.cuInit(0);
  if (r == CUDA_SUCCESS) r = drv.cuDeviceGetCount(&drv.count);
  if (r != CUDA_SUCCESS) {
    drv.count = 0;
    snprintf(drv.why, sizeof drv.why, "the CUDA driver did not initialise: %s", cu_error(r));
    return;
  }
  if (drv.count == 0) {
    snprintf(drv.why, sizeof drv.why, "the CUDA driver reports no device");
    return;
  }
  CUdevice d;
  r = drv.cuDeviceGet(&d, 0);
  if (r == CUDA_SUCCESS) r = drv.cuDevicePrimaryCtxRetain(&drv.ctx, d);
  if (r != CUDA_SUCCESS) {
    drv.count = 0;
    snprintf(drv.why, sizeof drv.why, "no context on cuda:0: %s", cu_error(r));
    return;
  }
  drv.alloc = cu_allocator_new((cu_backend){NULL, device_alloc, device_free}, "cuda:0");
}

static void ensure(void) { pthread_once(&drv.once, load); }

bool em_cuda_is_available(void) { return ensure(), drv.count > 0 && drv.alloc; }
int em_cuda_device_count(void) { return ensure(), drv.count; }
cu_allocator *cu_device_allocator(void) { return ensure(), drv.alloc; }

bool em_cuda_get_device_properties_at(int dev, em_cuda_device_properties *p, em_site site) {
  ensure();
  if (!p) return rt_error(site, "em_cuda_get_device_properties", "properties pointer is NULL"), false;
  if (drv.count == 0) return rt_error(site, "em_cuda_get_device_properties", "device %d: %s", dev, drv.why), false;
  if (dev < 0 || dev >= drv.count)
    return rt_error(site, "em_cuda_get_device_properties", "device %d out of range: %d device%s", dev, drv.count,
                    drv.count == 1 ? "" : "s"),
           false;
  memset(p, 0, sizeof *p);
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
  if (r != CUDA_SUCCESS) return rt_error(site, "em_cuda_get_device_properties", "device %d: %s", dev, cu_error(r)), false;
  p->total_memory = (int64_t)mem, p->l2_cache_bytes = l2;
  return true;
}

em_cuda_memory_stats em_cuda_memory_stats_get(void) {
  cu_allocator *a = cu_device_allocator();
  return a ? cu_stats(a) : (em_cuda_memory_stats){0};
}

void em_cuda_empty_cache(void) {
  cu_allocator *a = cu_device_allocator();
  if (a) cu_empty_cache(a);
}
