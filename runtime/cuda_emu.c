/* runtime/cuda_emu.c: a CUDA device emulated on the host, for testing the device runtime where
 * there is no GPU (EMBER_CUDA_EMULATE=1; see cuda.h).
 *
 * It implements the driver table with host memory and runs the very CUDA C that NVRTC compiles
 * for the GPU, compiled instead by the host C++ compiler (c++, or $CXX) into a shared object:
 * a prelude defines CUDA's qualifiers away, gives blockIdx / threadIdx / blockDim / gridDim as
 * thread-local variables, and appends to each kernel an entry point that unpacks the launch's
 * parameter array by the kernel's own signature (a variadic template) and runs the grid block
 * after block (see emu_prelude for how threads of a block run). What it cannot check: real
 * concurrency (races, atomics under contention), the GPU's math library, and the driver.
 * Work runs at launch, so streams and events are trivially ordered; events record host time;
 * a capturing stream records its work into a graph instead (CUDA graphs), replayed at launch.
 * GEMM runs through the CPU BLAS (f32, f64) or a plain loop (f16, bf16: f32 accumulation). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cuda.h"
#include "rt.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef EMBER_HAVE_BLAS
#include <cblas.h>
#endif

static int e_mem_alloc(uint64_t *p, size_t bytes) {
  void *q = aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!q) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  *p = (uint64_t)(uintptr_t)q;
  return 0;
}
static int e_mem_free(uint64_t p) { return free((void *)(uintptr_t)p), 0; }
static int e_host_alloc(void **p, size_t bytes, unsigned flags) {
  (void)flags;
  return (*p = malloc(bytes)) ? 0 : 2;
}
static int e_host_free(void *p) { return free(p), 0; }
/* ---- streams, and capture into graphs ----
 * A stream records what is queued on it while capturing, instead of running it; a graph is that
 * list of operations, replayed in order at launch. As on a GPU, a sync or a download while
 * capturing invalidates the capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, then _INVALIDATED at
 * its end). */
enum { E_UNSUPPORTED = 900, E_INVALIDATED = 901 };
typedef struct e_fn { /* an emulated kernel: its entry, and its parameters' sizes */
  void (*run)(void **params, unsigned grid, unsigned block);
  void (*sizes)(size_t *sizes, int *n);
} e_fn;
/* A cublasLtMatmul with its descriptors resolved (column-major, as cuBLASLt): D = act(alpha
 * op(A) op(B) + beta C + bias), C = D. */
typedef struct e_ltmm {
  bool ta, tb;
  int m, n, k, batch;
  em_dtype dt;
  uint32_t epilogue;
  uint64_t a, b, d, bias;
  int64_t lda, ldb, ldd, sa, sb, sd;
  double alpha, beta;
} e_ltmm;
static void e_ltmm_run(const e_ltmm *x);
/* A cuDNN convolution with its descriptors resolved: dir 0 forward (y from x, w), 1 backward
 * data (x from y, w), 2 backward filter (w from x, y); out = alpha conv + beta out. */
typedef struct e_conv {
  int dir;
  em_dtype dt;
  int x[4], xs[4], w[4], y[4], ys[4], pad[2], stride[2], dil[2], groups;
  uint64_t xp, wp, yp;
  double alpha, beta;
} e_conv;
static bool e_conv_run(const e_conv *c);
typedef struct e_op {
  enum { OP_LAUNCH, OP_COPY, OP_GEMM, OP_LTMM, OP_CONV } kind;
  e_ltmm lt;
  e_conv conv;
  const e_fn *f;
  unsigned gx, bx;
  void **params; /* the launch's parameters, copied */
  uint64_t dst, src; /* OP_COPY: as memmove (device and host memory are one on the emulator) */
  size_t n;
  struct { bool ta, tb, acc, tf32; int m, n, k, lda, ldb, ldc, batch; em_dtype dt; uint64_t a, b, c; int64_t sa, sb, sc; } g;
} e_op;
typedef struct e_graph {
  e_op *ops;
  int n, cap;
} e_graph;
typedef struct e_stream {
  bool capturing, invalid;
  e_graph *g;
} e_stream;
static int capturing_streams; /* any capture makes a context-wide sync invalid */

static e_stream *e_capturing(cu_stream s) { return s && ((e_stream *)s)->capturing ? s : NULL; }

static int e_record(e_stream *st, e_op op) {
  e_graph *g = st->g;
  if (g->n == g->cap) {
    int c = g->cap ? 2 * g->cap : 16;
    e_op *q = realloc(g->ops, sizeof *q * (size_t)c);
    if (!q) return st->invalid = true, 2;
    g->ops = q, g->cap = c;
  }
  g->ops[g->n++] = op;
  return 0;
}

static int e_copy(uint64_t dst, uint64_t src, size_t n, cu_stream s) {
  e_stream *st = e_capturing(s);
  if (st) return e_record(st, (e_op){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
  return memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n), 0;
}
static int e_htod(uint64_t dst, const void *src, size_t n, cu_stream s) { return e_copy(dst, (uint64_t)(uintptr_t)src, n, s); }
static int e_dtoh(void *dst, uint64_t src, size_t n, cu_stream s) {
  if (e_capturing(s)) return ((e_stream *)s)->invalid = true, E_UNSUPPORTED;
  return e_copy((uint64_t)(uintptr_t)dst, src, n, s);
}
static int e_dtod(uint64_t dst, uint64_t src, size_t n, cu_stream s) { return e_copy(dst, src, n, s); }
static int e_stream_create(cu_stream *s, unsigned flags) {
  (void)flags;
  return (*s = calloc(1, sizeof(e_stream))) ? 0 : 2;
}
static int e_stream_destroy(cu_stream s) { return free(s), 0; }
static int e_stream_sync(cu_stream s) {
  if (e_capturing(s)) return ((e_stream *)s)->invalid = true, E_UNSUPPORTED;
  return 0;
}
static int e_begin_capture(cu_stream s, int mode) {
  (void)mode;
  e_stream *st = s;
  if (!st || st->capturing) return 400; /* the legacy stream cannot capture */
  if (!(st->g = calloc(1, sizeof *st->g))) return 2;
  st->capturing = true, st->invalid = false;
  capturing_streams++;
  return 0;
}
static int e_graph_destroy(void *graph) {
  e_graph *g = graph;
  if (!g) return 0;
  for (int i = 0; i < g->n; i++)
    if (g->ops[i].kind == OP_LAUNCH) free(g->ops[i].params);
  free(g->ops), free(g);
  return 0;
}
static int e_end_capture(cu_stream s, void **graph) {
  e_stream *st = s;
  *graph = NULL;
  if (!st || !st->capturing) return 400;
  st->capturing = false;
  capturing_streams--;
  if (st->invalid) return e_graph_destroy(st->g), st->g = NULL, E_INVALIDATED;
  *graph = st->g, st->g = NULL;
  return 0;
}
static int e_instantiate(void **exec, void *graph, unsigned long long flags) { return (void)flags, *exec = graph, 0; }
static int e_exec_destroy(void *exec) { return (void)exec, 0; } /* the graph owns the operations */
static int e_gemm(cu_stream s, bool ta, bool tb, int m, int n, int k, em_dtype dt, uint64_t a, int lda, int64_t sa,
                  uint64_t b, int ldb, int64_t sb, uint64_t c, int ldc, int64_t sc, int batch, bool accumulate, bool tf32,
                  char *why, size_t cap);
static int e_graph_launch(void *exec, cu_stream s) {
  e_graph *g = exec;
  if (e_capturing(s)) return ((e_stream *)s)->invalid = true, E_UNSUPPORTED;
  char why[64];
  for (int i = 0; i < g->n; i++) {
    const e_op *o = &g->ops[i];
    if (o->kind == OP_LAUNCH) o->f->run(o->params, o->gx, o->bx);
    else if (o->kind == OP_COPY) memmove((void *)(uintptr_t)o->dst, (const void *)(uintptr_t)o->src, o->n);
    else if (o->kind == OP_LTMM) e_ltmm_run(&o->lt);
    else if (o->kind == OP_CONV && !e_conv_run(&o->conv)) return 2;
    else if (e_gemm(NULL, o->g.ta, o->g.tb, o->g.m, o->g.n, o->g.k, o->g.dt, o->g.a, o->g.lda, o->g.sa, o->g.b, o->g.ldb,
                    o->g.sb, o->g.c, o->g.ldc, o->g.sc, o->g.batch, o->g.acc, o->g.tf32, why, sizeof why))
      return 1;
  }
  return 0;
}
static int e_wait_event(cu_stream s, cu_event e, unsigned f) { return (void)s, (void)e, (void)f, 0; }
static int e_event_create(cu_event *e, unsigned flags) {
  (void)flags;
  return (*e = calloc(1, sizeof(double))) ? 0 : 2;
}
static int e_event_destroy(cu_event e) { return free(e), 0; }
static int e_event_record(cu_event e, cu_stream s) {
  (void)s;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *(double *)e = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
  return 0;
}
static int e_event_sync(cu_event e) { return (void)e, 0; }
static int e_elapsed(float *ms, cu_event a, cu_event b) { return *ms = (float)(*(double *)b - *(double *)a), 0; }
static int e_ctx_sync(void) { return capturing_streams ? E_UNSUPPORTED : 0; }
static const char *e_error(int r) {
  return r == 2     ? "out of memory (emulator)"
         : r == 400 ? "invalid handle (emulator)"
         : r == E_UNSUPPORTED ? "operation not permitted when stream is capturing (emulator)"
         : r == E_INVALIDATED ? "operation failed due to a previous error during capture (emulator)"
                              : "error (emulator)";
}

/* A module: the shared object, loaded from a memfd holding the image. */
static int e_module_load(void **m, const void *image) {
  const uint64_t *sz = image; /* the image starts with its size */
  int fd = memfd_create("ember_cuda_emu", MFD_CLOEXEC);
  if (fd < 0) return 1;
  bool ok = write(fd, (const char *)image + 8, *sz) == (ssize_t)*sz;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  void *h = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  /* the descriptor stays open with the module: dlopen knows objects by path, and a reused
   * descriptor number would hand back the previous module */
  if (!h) close(fd);
  if (!h) return 218; /* CUDA_ERROR_INVALID_PTX */
  *m = h;
  return 0;
}

static int e_get_function(cu_function *f, void *m, const char *name) {
  char sym[160];
  e_fn *fn = calloc(1, sizeof *fn); /* kept with the module, which stays loaded */
  if (!fn) return 2;
  snprintf(sym, sizeof sym, "em_emu_%s", name);
  *(void **)&fn->run = dlsym(m, sym);
  snprintf(sym, sizeof sym, "em_emu_sizes_%s", name);
  *(void **)&fn->sizes = dlsym(m, sym);
  if (!fn->run || !fn->sizes) return free(fn), 500; /* CUDA_ERROR_NOT_FOUND */
  *f = fn;
  return 0;
}

static int e_launch(cu_function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                    unsigned shmem, cu_stream s, void **params, void **extra) {
  (void)gy, (void)gz, (void)by, (void)bz, (void)shmem, (void)extra;
  const e_fn *fn = f;
  e_stream *st = e_capturing(s);
  if (!st) return fn->run(params, gx, bx), 0;
  /* captured: the parameters' values now, as cuStreamBeginCapture's kernel nodes keep them */
  size_t sz[256], total = 0;
  int n = 0;
  fn->sizes(sz, &n);
  for (int i = 0; i < n; i++) total += (sz[i] + 15) / 16 * 16;
  void **p = malloc(sizeof(void *) * (size_t)(n + 1) + total);
  if (!p) return st->invalid = true, 2;
  char *at = (char *)(p + n + 1);
  for (int i = 0; i < n; i++) {
    at = (char *)(((uintptr_t)at + 15) / 16 * 16);
    memcpy(at, params[i], sz[i]);
    p[i] = at, at += sz[i];
  }
  int r = e_record(st, (e_op){.kind = OP_LAUNCH, .f = fn, .gx = gx, .bx = bx, .params = p});
  if (r) free(p);
  return r;
}

/* The prelude of every emulated kernel. Kernels without __syncthreads run their blocks with one
 * thread (grid-stride loops make that exact). Kernels with it (the reductions) run each block's
 * threads as cooperative fibers (ucontext): __syncthreads switches to the next thread, and the
 * scheduler runs every live thread up to its next barrier in turn, so each round of the loop is a
 * barrier; __shared__ arrays are static, shared by the fibers of the block running. Warp shuffles
 * exchange through such an array between two barriers (all of a block's threads must call them,
 * as the generated row kernels do; a block of a warp or more). The block
 * size is capped at EMBER_CUDA_EMULATE_THREADS (default 32, a power of two: the kernels' trees
 * halve blockDim) and halved while a launch would make more than 4096 fibers, to keep the
 * emulation quick: small reductions (the tests') run cooperatively, huge grids one thread each. */
static const char emu_prelude[] =
    "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cmath>\n#include <cstdlib>\n#include <utility>\n#include <vector>\n"
    "#include <ucontext.h>\n"
    "#undef __global__\n#undef __device__\n#undef __host__\n#undef __forceinline__\n#undef __shared__\n#undef __restrict__\n"
    "#define __global__\n#define __device__\n#define __host__\n#define __forceinline__ inline\n#define __shared__ static\n"
    "#define __restrict__ __restrict\n"
    "struct em_dim3 { unsigned x, y, z; };\n"
    "static thread_local em_dim3 blockIdx, threadIdx, blockDim, gridDim;\n"
    "static thread_local ucontext_t em_sched, *em_fibers;\n"
    "static thread_local unsigned em_cur;\n"
    "static inline void __syncthreads() { if (blockDim.x > 1) swapcontext(&em_fibers[em_cur], &em_sched); }\n"
    "template <typename T> static inline T em_shfl(T v, unsigned from) { static thread_local T x[1024]; x[threadIdx.x] = v; __syncthreads(); T r = x[from]; __syncthreads(); return r; }\n"
    "template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int m) { return em_shfl(v, threadIdx.x ^ (unsigned)m); }\n"
    "template <typename T> static inline T __shfl_sync(unsigned, T v, int l) { return em_shfl(v, (threadIdx.x & ~31u) | ((unsigned)l & 31u)); }\n"
    "static inline float __int_as_float(int x) { float f; __builtin_memcpy(&f, &x, sizeof f); return f; }\n"
    "static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }\n"
    "static inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }\n"
    "template <typename T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = (T)(o + v); return o; }\n"
    "static inline __half atomicAdd(__half *p, __half v) { __half o = *p; *p = __float2half_rn(__half2float(o) + __half2float(v)); return o; }\n"
    "static inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v) { __nv_bfloat16 o = *p; *p = __float2bfloat16_rn(__bfloat162float(o) + __bfloat162float(v)); return o; }\n"
    "static inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long c, unsigned long long v) { unsigned long long o = *p; if (o == c) *p = v; return o; }\n"
    "template <typename... A> static void em_param_sizes(void (*)(A...), size_t *s, int *n) {\n"
    "  const size_t z[] = {sizeof(A)..., 0}; *n = (int)sizeof...(A); for (int i = 0; i < *n; i++) s[i] = z[i];\n"
    "}\n"
    "template <typename... A, std::size_t... I> static void em_call(void (*f)(A...), void **p, std::index_sequence<I...>) { f(*(A *)p[I]...); }\n"
    "template <typename... A> static void em_grid(void (*f)(A...), void **p, unsigned g) {\n"
    "  gridDim = {g, 1, 1}; blockDim = {1, 1, 1}; threadIdx = {0, 0, 0};\n"
    "  for (unsigned b = 0; b < g; b++) { blockIdx = {b, 0, 0}; em_call(f, p, std::index_sequence_for<A...>{}); }\n"
    "}\n"
    "template <typename... A> struct em_fiber {\n"
    "  static thread_local void (*f)(A...);\n  static thread_local void **p;\n  static thread_local bool *done;\n"
    "  static void run() { unsigned me = em_cur; em_call(f, p, std::index_sequence_for<A...>{}); done[me] = true; }\n"
    "};\n"
    "template <typename... A> thread_local void (*em_fiber<A...>::f)(A...);\n"
    "template <typename... A> thread_local void **em_fiber<A...>::p;\n"
    "template <typename... A> thread_local bool *em_fiber<A...>::done;\n"
    "template <typename... A> static void em_grid_threads(void (*f)(A...), void **p, unsigned g, unsigned want) {\n"
    "  const char *cap_s = std::getenv(\"EMBER_CUDA_EMULATE_THREADS\");\n"
    "  unsigned cap = cap_s ? (unsigned)std::atoi(cap_s) : 32, t = 1;\n"
    "  while (2 * t <= want && 2 * t <= cap) t *= 2;\n"
    "  while (t > 1 && (unsigned long long)g * t > (1u << 12)) t /= 2; /* big grids: fewer fibers, or none */\n"
    "  if (t == 1) { em_grid(f, p, g); return; }\n"
    "  const size_t stack = 64 << 10;\n"
    "  static thread_local std::vector<char> stacks; /* kept: a fresh 2 MiB per launch costs page faults */\n"
    "  if (stacks.size() < t * stack) stacks.resize(t * stack);\n"
    "  std::vector<ucontext_t> fib(t);\n  std::vector<char> done_v(t);\n"
    "  bool *done = (bool *)done_v.data();\n"
    "  em_fiber<A...>::f = f, em_fiber<A...>::p = p, em_fiber<A...>::done = done;\n"
    "  em_fibers = fib.data();\n  gridDim = {g, 1, 1}; blockDim = {t, 1, 1};\n"
    "  for (unsigned b = 0; b < g; b++) {\n"
    "    blockIdx = {b, 0, 0};\n"
    "    for (unsigned i = 0; i < t; i++) {\n"
    "      done[i] = false;\n      getcontext(&fib[i]);\n"
    "      fib[i].uc_stack.ss_sp = stacks.data() + i * stack, fib[i].uc_stack.ss_size = stack, fib[i].uc_link = &em_sched;\n"
    "      makecontext(&fib[i], (void (*)())em_fiber<A...>::run, 0);\n"
    "    }\n"
    "    for (unsigned live = t; live;) {\n"
    "      live = 0;\n"
    "      for (unsigned i = 0; i < t; i++)\n"
    "        if (!done[i]) { em_cur = i; threadIdx = {i, 0, 0}; swapcontext(&em_sched, &fib[i]); live += !done[i]; }\n"
    "    }\n"
    "  }\n"
    "}\n";

/* The host compiler: $CXX, else c++. The image is [size][shared object]. */
static bool e_compile(const char *src, const char *name, char **image, size_t *size, char **log) {
  *image = NULL, *size = 0, *log = NULL;
  char dir[] = "/tmp/ember_cuda_emu_XXXXXX";
  if (!mkdtemp(dir)) return (*log = strdup("mkdtemp failed")), false;
  char cpp[128], so[128], errf[128], cmd[1024];
  snprintf(cpp, sizeof cpp, "%s/k.cpp", dir), snprintf(so, sizeof so, "%s/k.so", dir), snprintf(errf, sizeof errf, "%s/log", dir);
  FILE *f = fopen(cpp, "w");
  bool ok = f != NULL;
  if (f) {
    fputs(emu_prelude, f);
    fputs(src, f);
    /* an entry for every kernel the source defines (a module can hold several: the inductor's
     * scalar and vector variants), name among them */
    static const char kw[] = "extern \"C\" __global__ void ";
    bool named = false;
    for (const char *at = strstr(src, kw); at || !named; at = at ? strstr(at + 1, kw) : NULL) {
      char kn[128];
      size_t len = 0;
      if (at) {
        const char *q = at + strlen(kw);
        while (len < sizeof kn - 1 && (q[len] == '_' || (q[len] >= 'a' && q[len] <= 'z') || (q[len] >= 'A' && q[len] <= 'Z') ||
                                       (q[len] >= '0' && q[len] <= '9')))
          len++;
        memcpy(kn, q, len);
      } else {
        len = strlen(name) < sizeof kn - 1 ? strlen(name) : sizeof kn - 1; /* a kernel declared otherwise */
        memcpy(kn, name, len);
      }
      kn[len] = 0;
      if (!len) continue;
      named |= !strcmp(kn, name);
      if (strstr(src, "__syncthreads"))
        fprintf(f, "\nextern \"C\" void em_emu_%s(void **p, unsigned g, unsigned b) { em_grid_threads(%s, p, g, b); }\n", kn, kn);
      else
        fprintf(f, "\nextern \"C\" void em_emu_%s(void **p, unsigned g, unsigned b) { (void)b; em_grid(%s, p, g); }\n", kn, kn);
      fprintf(f, "extern \"C\" void em_emu_sizes_%s(size_t *s, int *n) { em_param_sizes(%s, s, n); }\n", kn, kn);
    }
    ok = fclose(f) == 0;
  }
  const char *cxx = getenv("CXX");
#ifdef EMBER_CUDA_INCLUDE
  const char *inc = EMBER_CUDA_INCLUDE;
#else
  const char *inc = "/usr/local/cuda/include";
#endif
  /* in the scratch directory, by relative names: the image holds no path of its own, so a
   * source's image has the same bytes in every compile (the disk cache's contents do not depend
   * on which thread or run made them) */
  snprintf(cmd, sizeof cmd, "cd '%s' && %s -std=c++17 -O1 -w -fPIC -shared -frandom-seed=ember -I'%s' k.cpp -o k.so 2>log", dir,
           cxx && *cxx ? cxx : "c++", inc);
  int st = ok ? system(cmd) : -1;
  ok = st == 0;
  FILE *r = fopen(ok ? so : errf, "rb");
  if (r) {
    fseek(r, 0, SEEK_END);
    long n = ftell(r);
    fseek(r, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 9) : NULL;
    if (buf && fread(buf + 8, 1, (size_t)n, r) == (size_t)n) {
      if (ok) *(uint64_t *)buf = (uint64_t)n, *image = buf, *size = (size_t)n + 8;
      else buf[8 + n] = 0, *log = strdup(buf + 8), free(buf);
    } else {
      free(buf);
    }
    fclose(r);
  }
  if (!ok && !*log) *log = strdup("the host C++ compiler failed to run");
  unlink(cpp), unlink(so), unlink(errf), rmdir(dir);
  return *image != NULL;
}

static float ld(const char *p, em_dtype dt) { return (float)prim_load(p, dt); }

static int e_gemm(cu_stream s, bool ta, bool tb, int m, int n, int k, em_dtype dt, uint64_t a, int lda, int64_t sa,
                  uint64_t b, int ldb, int64_t sb, uint64_t c, int ldc, int64_t sc, int batch, bool accumulate, bool tf32,
                  char *why, size_t cap) {
  (void)tf32, (void)why, (void)cap;
  e_stream *st = e_capturing(s);
  if (st)
    return e_record(st, (e_op){.kind = OP_GEMM, .g = {ta, tb, accumulate, tf32, m, n, k, lda, ldb, ldc, batch, dt, a, b, c, sa, sb, sc}});
  size_t es = ir_dtype(dt)->size;
  for (int q = 0; q < batch; q++) {
    char *A = (char *)(uintptr_t)a + (size_t)(q * sa) * es, *B = (char *)(uintptr_t)b + (size_t)(q * sb) * es;
    char *C = (char *)(uintptr_t)c + (size_t)(q * sc) * es;
#ifdef EMBER_HAVE_BLAS
    if (dt == EM_F32 || dt == EM_F64) {
      CBLAS_TRANSPOSE oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
      if (dt == EM_F32) cblas_sgemm(CblasColMajor, oa, ob, m, n, k, 1.0f, (float *)A, lda, (float *)B, ldb, accumulate, (float *)C, ldc);
      else cblas_dgemm(CblasColMajor, oa, ob, m, n, k, 1.0, (double *)A, lda, (double *)B, ldb, accumulate, (double *)C, ldc);
      continue;
    }
#endif
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        double acc = accumulate ? prim_load(C + (size_t)(i + (int64_t)j * ldc) * es, dt) : 0;
        float facc = 0;
        for (int p = 0; p < k; p++) {
          int64_t ia = ta ? p + (int64_t)i * lda : i + (int64_t)p * lda, ib = tb ? j + (int64_t)p * ldb : p + (int64_t)j * ldb;
          if (dt == EM_F64) acc += prim_load(A + (size_t)ia * es, dt) * prim_load(B + (size_t)ib * es, dt);
          else facc += ld(A + (size_t)ia * es, dt) * ld(B + (size_t)ib * es, dt);
        }
        prim_store(C + (size_t)(i + (int64_t)j * ldc) * es, dt, dt == EM_F64 ? acc : (double)(float)(acc + facc));
      }
  }
  return 0;
}

/* ---- cuBLASLt on the host ----
 * The entry points Ember calls, with cuBLASLt's argument conventions and enum values (cuda.h's
 * CU_LT_*, checked against cublasLt.h by runtime/cuda_abi.c), so the code that drives the real
 * library (runtime/cuda.c) runs unchanged in the tests. Stricter than the library where that
 * finds mistakes: an attribute it does not model, a value of the wrong size, layouts that do not
 * make a product of the descriptor's shape, or pointers less aligned than the algorithm was
 * chosen for are all CUBLAS_STATUS_INVALID_VALUE. The heuristic offers three algorithms, which
 * differ only in the workspace they ask for (all run the same host code); the GEMM accumulates in
 * f32 (f64 for f64) and applies the epilogue before the one rounding to D's dtype, as cuBLASLt. */
typedef struct e_lt_desc {
  int compute, scale;
  int32_t ta, tb;
  uint32_t epilogue;
  const void *bias;
  int64_t bias_stride;
} e_lt_desc;
typedef struct e_lt_layout { int type; uint64_t rows, cols; int64_t ld, stride; int32_t batch; } e_lt_layout;
typedef struct e_lt_pref { uint64_t workspace; uint32_t align[4]; } e_lt_pref;
static cu_emu_lt_stats lt_stats;
cu_emu_lt_stats cu_emu_lt_stats_get(void) { return lt_stats; }

static int e_lt_create(void **h) { return *h = (void *)&lt_stats, 0; }
static bool e_lt_type(int t) { return t == CU_R_32F || t == CU_R_64F || t == CU_R_16F || t == CU_R_16BF; }
/* A descriptor: a copy of init, or CUBLAS_STATUS_ALLOC_FAILED. */
static int e_lt_new(void **out, const void *init, size_t size) {
  void *x = malloc(size);
  if (!x) return 3;
  return memcpy(x, init, size), *out = x, 0;
}
static int e_lt_desc_create(void **d, int compute, int scale) {
  if (!(compute == CU_COMPUTE_32F || compute == CU_COMPUTE_32F_FAST_TF32 || compute == CU_COMPUTE_64F) ||
      scale != (compute == CU_COMPUTE_64F ? CU_R_64F : CU_R_32F))
    return CU_BLAS_INVALID_VALUE;
  e_lt_desc x = {.compute = compute, .scale = scale, .epilogue = CU_LT_EPILOGUE_DEFAULT};
  return e_lt_new(d, &x, sizeof x);
}
static int e_lt_free(void *x) { return free(x), 0; }
/* Copies an attribute's value of the size cuBLASLt's header gives it. */
static int e_lt_put(void *to, size_t want, const void *buf, size_t size) {
  if (!buf || size != want) return CU_BLAS_INVALID_VALUE;
  return memcpy(to, buf, size), 0;
}
static int e_lt_desc_set(void *d, int attr, const void *buf, size_t size) {
  e_lt_desc *x = d;
  switch (attr) {
  case CU_LT_DESC_TRANSA: return e_lt_put(&x->ta, sizeof x->ta, buf, size);
  case CU_LT_DESC_TRANSB: return e_lt_put(&x->tb, sizeof x->tb, buf, size);
  case CU_LT_DESC_EPILOGUE: return e_lt_put(&x->epilogue, sizeof x->epilogue, buf, size);
  case CU_LT_DESC_BIAS_POINTER: return e_lt_put((void *)&x->bias, sizeof x->bias, buf, size);
  case CU_LT_DESC_BIAS_BATCH_STRIDE: return e_lt_put(&x->bias_stride, sizeof x->bias_stride, buf, size);
  default: return CU_BLAS_INVALID_VALUE;
  }
}
static int e_lt_layout_create(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (!e_lt_type(type) || (rows && ld < (int64_t)rows) || ld < 1) return CU_BLAS_INVALID_VALUE;
  return e_lt_new(l, &(e_lt_layout){type, rows, cols, ld, 0, 1}, sizeof(e_lt_layout));
}
static int e_lt_layout_set(void *l, int attr, const void *buf, size_t size) {
  e_lt_layout *x = l;
  if (attr == CU_LT_LAYOUT_BATCH_COUNT) return e_lt_put(&x->batch, sizeof x->batch, buf, size);
  if (attr == CU_LT_LAYOUT_STRIDED_BATCH_OFFSET) return e_lt_put(&x->stride, sizeof x->stride, buf, size);
  return CU_BLAS_INVALID_VALUE;
}
static int e_lt_pref_create(void **p) {
  /* the header's defaults: no workspace, 256-byte alignment */
  return e_lt_new(p, &(e_lt_pref){0, {256, 256, 256, 256}}, sizeof(e_lt_pref));
}
static int e_lt_pref_set(void *p, int attr, const void *buf, size_t size) {
  e_lt_pref *x = p;
  if (attr == CU_LT_PREF_MAX_WORKSPACE_BYTES) return e_lt_put(&x->workspace, sizeof x->workspace, buf, size);
  if (attr >= CU_LT_PREF_MIN_ALIGNMENT_A && attr <= CU_LT_PREF_MIN_ALIGNMENT_D)
    return e_lt_put(&x->align[attr - CU_LT_PREF_MIN_ALIGNMENT_A], sizeof x->align[0], buf, size);
  return CU_BLAS_INVALID_VALUE;
}

static em_dtype e_lt_dtype(int t) {
  return t == CU_R_32F ? EM_F32 : t == CU_R_64F ? EM_F64 : t == CU_R_16F ? EM_F16 : EM_BF16;
}

/* The product the descriptor and layouts describe, or INVALID_VALUE when they disagree. */
static int e_lt_resolve(const e_lt_desc *x, const e_lt_layout *a, const e_lt_layout *b, const e_lt_layout *c,
                        const e_lt_layout *d, e_ltmm *r) {
  if (!x || !a || !b || !c || !d) return CU_BLAS_INVALID_VALUE;
  bool ta = x->ta == CU_OP_T, tb = x->tb == CU_OP_T;
  uint64_t m = d->rows, n = d->cols, k = ta ? a->rows : a->cols;
  bool ok = (x->ta == CU_OP_N || ta) && (x->tb == CU_OP_N || tb) && a->type == b->type && a->type == d->type &&
            c->type == d->type && c->rows == m && c->cols == n && c->ld == d->ld && (ta ? a->cols : a->rows) == m &&
            (tb ? b->rows : b->cols) == n && (tb ? b->cols : b->rows) == k && a->batch == d->batch &&
            b->batch == d->batch && c->batch == d->batch && c->stride == d->stride && d->batch >= 1 &&
            (d->batch == 1 || d->stride >= (int64_t)(d->ld * n)) && m <= INT32_MAX && n <= INT32_MAX &&
            k <= INT32_MAX &&
            (x->compute == CU_COMPUTE_64F) == (d->type == CU_R_64F) && x->bias_stride == 0;
  uint32_t e = x->epilogue;
  ok = ok && (e == CU_LT_EPILOGUE_DEFAULT || e == CU_LT_EPILOGUE_RELU || e == CU_LT_EPILOGUE_GELU ||
              ((e == CU_LT_EPILOGUE_BIAS || e == CU_LT_EPILOGUE_RELU_BIAS || e == CU_LT_EPILOGUE_GELU_BIAS) &&
               x->bias));
  if (!ok) return CU_BLAS_INVALID_VALUE;
  *r = (e_ltmm){ta, tb, (int)m, (int)n, (int)k, d->batch, e_lt_dtype(d->type), e, 0, 0, 0,
                (e & CU_LT_EPILOGUE_BIAS) ? (uint64_t)(uintptr_t)x->bias : 0, a->ld, b->ld, d->ld, a->stride, b->stride,
                d->stride, 1, 0};
  return 0;
}

static int e_lt_heuristic(void *h, void *desc, void *a, void *b, void *c, void *d, void *pref, int requested,
                          cu_lt_heuristic *res, int *returned) {
  (void)h;
  e_ltmm r;
  int st = e_lt_resolve(desc, a, b, c, d, &r);
  if (st || !pref || requested < 1 || !res || !returned) return st ? st : CU_BLAS_INVALID_VALUE;
  const e_lt_pref *p = pref;
  lt_stats.heuristics++;
  int n = 0;
  for (int i = 0; i < 3 && n < requested; i++) {
    uint64_t ws = 256 * (uint64_t)i;
    if (ws > p->workspace) continue;
    res[n] = (cu_lt_heuristic){.workspace_size = ws, .waves = 1};
    res[n].algo.data[0] = (uint64_t)i, res[n].algo.data[1] = ws;
    for (int q = 0; q < 4; q++) res[n].algo.data[2 + q] = p->align[q];
    n++;
  }
  *returned = n;
  return n ? 0 : CU_BLAS_NOT_SUPPORTED;
}

static float e_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

static double e_lt_act(uint32_t e, double v) {
  if ((e & ~(uint32_t)CU_LT_EPILOGUE_BIAS) == CU_LT_EPILOGUE_RELU) return v > 0 ? v : 0; /* NaN to 0, as max(v, 0) */
  if ((e & ~(uint32_t)CU_LT_EPILOGUE_BIAS) == CU_LT_EPILOGUE_GELU) return e_gelu_tanh((float)v);
  return v;
}

static void e_ltmm_run(const e_ltmm *x) {
  size_t es = ir_dtype(x->dt)->size;
  for (int q = 0; q < x->batch; q++) {
    const char *A = (const char *)(uintptr_t)x->a + (size_t)(q * x->sa) * es;
    const char *B = (const char *)(uintptr_t)x->b + (size_t)(q * x->sb) * es;
    char *D = (char *)(uintptr_t)x->d + (size_t)(q * x->sd) * es;
    for (int j = 0; j < x->n; j++)
      for (int i = 0; i < x->m; i++) {
        double acc64 = 0;
        float acc = 0;
        for (int p = 0; p < x->k; p++) {
          int64_t ia = x->ta ? p + (int64_t)i * x->lda : i + (int64_t)p * x->lda;
          int64_t ib = x->tb ? j + (int64_t)p * x->ldb : p + (int64_t)j * x->ldb;
          if (x->dt == EM_F64) acc64 += prim_load(A + (size_t)ia * es, x->dt) * prim_load(B + (size_t)ib * es, x->dt);
          else acc += ld(A + (size_t)ia * es, x->dt) * ld(B + (size_t)ib * es, x->dt);
        }
        char *at = D + (size_t)(i + (int64_t)j * x->ldd) * es;
        double v = x->dt == EM_F64 ? x->alpha * acc64 : (double)((float)x->alpha * acc);
        if (x->beta != 0) v += x->beta * prim_load(at, x->dt);
        if (x->dt != EM_F64) v = (float)v;
        if (x->bias) {
          const char *bias = (const char *)(uintptr_t)x->bias + (size_t)i * es;
          v = x->dt == EM_F64 ? v + prim_load(bias, x->dt) : (double)((float)v + ld(bias, x->dt));
        }
        prim_store(at, x->dt, e_lt_act(x->epilogue, v));
      }
  }
}

static int e_lt_matmul(void *h, void *desc, const void *alpha, const void *a, void *adesc, const void *b, void *bdesc,
                       const void *beta, const void *c, void *cdesc, void *d, void *ddesc, const cu_lt_algo *algo,
                       void *workspace, size_t workspace_size, void *stream) {
  (void)h;
  e_ltmm r;
  int st = e_lt_resolve(desc, adesc, bdesc, cdesc, ddesc, &r);
  if (st) return st;
  if (!alpha || !beta || !algo || c != d || algo->data[0] > 2 || workspace_size < algo->data[1] ||
      (algo->data[1] && !workspace))
    return CU_BLAS_INVALID_VALUE;
  const uint64_t ptr[4] = {(uintptr_t)a, (uintptr_t)b, (uintptr_t)c, (uintptr_t)d};
  for (int q = 0; q < 4; q++) /* the algorithm was chosen for pointers this aligned */
    if (!algo->data[2 + q] || ptr[q] % algo->data[2 + q]) return CU_BLAS_INVALID_VALUE;
  r.a = ptr[0], r.b = ptr[1], r.d = ptr[3];
  bool f64 = r.dt == EM_F64;
  r.alpha = f64 ? *(const double *)alpha : *(const float *)alpha;
  r.beta = f64 ? *(const double *)beta : *(const float *)beta;
  lt_stats.matmuls++, lt_stats.last_algo = *algo, lt_stats.last_epilogue = (int)r.epilogue;
  e_stream *s = e_capturing(stream);
  if (s) return e_record(s, (e_op){.kind = OP_LTMM, .lt = r});
  return e_ltmm_run(&r), 0;
}

static size_t e_lt_version(void) { return 0; }

static const cu_lt_api emu_lt = {
    .create = e_lt_create, .desc_create = e_lt_desc_create, .desc_destroy = e_lt_free, .desc_set = e_lt_desc_set,
    .layout_create = e_lt_layout_create, .layout_destroy = e_lt_free, .layout_set = e_lt_layout_set,
    .pref_create = e_lt_pref_create, .pref_destroy = e_lt_free, .pref_set = e_lt_pref_set,
    .heuristic = e_lt_heuristic, .matmul = e_lt_matmul, .version = e_lt_version,
};
static const cu_lt_api *e_lt(char *why, size_t cap) { return (void)why, (void)cap, &emu_lt; }

/* ---- cuDNN on the host ----
 * The legacy convolution entry points Ember calls (cuda.h's cu_dnn_api), with cuDNN's argument
 * conventions and enum values (checked against cudnn.h by runtime/cuda_abi.c), so runtime/cuda.c's
 * cuDNN code runs unchanged in the tests. Stricter than the library where that finds mistakes:
 * a descriptor of the wrong kind or never set, shapes that do not make the convolution the
 * descriptor says, a compute type other than cuDNN's for the data type, too small a workspace
 * or an algorithm the heuristic did not offer are CUDNN_STATUS_BAD_PARAM; a convolution mode
 * other than cross-correlation is NOT_SUPPORTED. The heuristics offer two algorithms (1 with a
 * workspace, then 0 without), which run the same host code: prims/extern.c's reference
 * convolution (f64 sums; the half types read as f32), its result rounded once to the dtype. */
enum { E_DNN_TENSOR = 0x7e5, E_DNN_FILTER = 0xf17, E_DNN_CONV = 0xc07 };
typedef struct e_dnn_desc {
  int kind, type;
  bool set;
  int d[4], s[4];      /* tensor: sizes, strides; filter: k, c, h, w (packed NCHW) */
  int pad[2], stride[2], dil[2], mode, compute, groups, math; /* convolution */
} e_dnn_desc;
typedef struct e_dnn_handle { cu_stream stream; } e_dnn_handle;
static cu_emu_dnn_stats dnn_stats;
cu_emu_dnn_stats cu_emu_dnn_stats_get(void) { return dnn_stats; }
#define E_DNN_WORKSPACE 4096 /* algorithm 1's */
#define E_DNN_ALLOC_FAILED 4003 /* CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED */

static size_t e_dnn_version(void) { return 91900; } /* the cuDNN whose header cuda_abi.c checks against */
static const char *e_dnn_error(int st) {
  return st == 0 ? "CUDNN_STATUS_SUCCESS" : st == CU_DNN_STATUS_BAD_PARAM ? "CUDNN_STATUS_BAD_PARAM (emulated)"
       : st == CU_DNN_STATUS_NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED (emulated)" : "cuDNN error (emulated)";
}
static int e_dnn_create(void **h) {
  if (!h || !(*h = calloc(1, sizeof(e_dnn_handle)))) return CU_DNN_STATUS_BAD_PARAM;
  return 0;
}
static int e_dnn_set_stream(void *h, void *s) {
  if (!h) return CU_DNN_STATUS_BAD_PARAM;
  return ((e_dnn_handle *)h)->stream = s, 0;
}
static int e_dnn_new(void **d, int kind) {
  if (!d || !(*d = calloc(1, sizeof(e_dnn_desc)))) return CU_DNN_STATUS_BAD_PARAM;
  return ((e_dnn_desc *)*d)->kind = kind, 0;
}
static int e_dnn_tensor_create(void **d) { return e_dnn_new(d, E_DNN_TENSOR); }
static int e_dnn_filter_create(void **d) { return e_dnn_new(d, E_DNN_FILTER); }
static int e_dnn_conv_create(void **d) { return e_dnn_new(d, E_DNN_CONV); }
static int e_dnn_destroy(void *d) { return free(d), 0; }
static bool e_dnn_type(int t) {
  return t == CU_DNN_DATA_FLOAT || t == CU_DNN_DATA_DOUBLE || t == CU_DNN_DATA_HALF || t == CU_DNN_DATA_BFLOAT16;
}
static e_dnn_desc *e_dnn_is(void *d, int kind) {
  e_dnn_desc *x = d;
  return x && x->kind == kind ? x : NULL;
}
static int e_dnn_tensor_set(void *d, int type, int n, int c, int h, int w, int ns, int cs, int hs, int ws) {
  e_dnn_desc *x = e_dnn_is(d, E_DNN_TENSOR);
  if (!x || !e_dnn_type(type) || n < 1 || c < 1 || h < 1 || w < 1 || ns < 1 || cs < 1 || hs < 1 || ws < 1)
    return CU_DNN_STATUS_BAD_PARAM;
  *x = (e_dnn_desc){.kind = E_DNN_TENSOR, .type = type, .set = true, .d = {n, c, h, w}, .s = {ns, cs, hs, ws}};
  return 0;
}
static int e_dnn_filter_set(void *d, int type, int format, int k, int c, int h, int w) {
  e_dnn_desc *x = e_dnn_is(d, E_DNN_FILTER);
  if (!x || !e_dnn_type(type) || format != CU_DNN_TENSOR_NCHW || k < 1 || c < 1 || h < 1 || w < 1)
    return CU_DNN_STATUS_BAD_PARAM;
  *x = (e_dnn_desc){.kind = E_DNN_FILTER, .type = type, .set = true, .d = {k, c, h, w}, .s = {c * h * w, h * w, w, 1}};
  return 0;
}
static int e_dnn_conv_set(void *d, int ph, int pw, int u, int v, int dh, int dw, int mode, int compute) {
  e_dnn_desc *x = e_dnn_is(d, E_DNN_CONV);
  if (!x || ph < 0 || pw < 0 || u < 1 || v < 1 || dh < 1 || dw < 1 || !e_dnn_type(compute) ||
      (mode != CU_DNN_CROSS_CORRELATION && mode != 0))
    return CU_DNN_STATUS_BAD_PARAM;
  *x = (e_dnn_desc){.kind = E_DNN_CONV, .set = true, .pad = {ph, pw}, .stride = {u, v}, .dil = {dh, dw}, .mode = mode,
                    .compute = compute, .groups = x->groups ? x->groups : 1, .math = x->math};
  return 0;
}
static int e_dnn_conv_groups(void *d, int g) {
  e_dnn_desc *x = e_dnn_is(d, E_DNN_CONV);
  if (!x || g < 1) return CU_DNN_STATUS_BAD_PARAM;
  return x->groups = g, 0;
}
static int e_dnn_conv_math(void *d, int m) {
  e_dnn_desc *x = e_dnn_is(d, E_DNN_CONV);
  if (!x || m < 0 || m > 3) return CU_DNN_STATUS_BAD_PARAM;
  return x->math = m, 0;
}

/* The convolution x, w, conv, y describe (dir as e_conv's), or BAD_PARAM when they disagree. */
static int e_dnn_resolve(int dir, void *xd, void *wd, void *cd, void *yd, e_conv *r) {
  const e_dnn_desc *x = e_dnn_is(xd, E_DNN_TENSOR), *w = e_dnn_is(wd, E_DNN_FILTER), *c = e_dnn_is(cd, E_DNN_CONV);
  const e_dnn_desc *y = e_dnn_is(yd, E_DNN_TENSOR);
  if (!x || !w || !c || !y || !x->set || !w->set || !c->set || !y->set) return CU_DNN_STATUS_BAD_PARAM;
  if (c->mode != CU_DNN_CROSS_CORRELATION) return CU_DNN_STATUS_NOT_SUPPORTED;
  int g = c->groups;
  bool ok = x->type == w->type && y->type == w->type && x->d[0] == y->d[0] && x->d[1] == w->d[1] * g &&
            w->d[0] % g == 0 && y->d[1] == w->d[0] &&
            c->compute == (x->type == CU_DNN_DATA_DOUBLE ? CU_DNN_DATA_DOUBLE : CU_DNN_DATA_FLOAT);
  for (int i = 0; i < 2 && ok; i++) {
    int room = x->d[2 + i] + 2 * c->pad[i] - c->dil[i] * (w->d[2 + i] - 1) - 1;
    ok = room >= 0 && y->d[2 + i] == room / c->stride[i] + 1;
  }
  if (!ok) return CU_DNN_STATUS_BAD_PARAM;
  em_dtype dt = x->type == CU_DNN_DATA_FLOAT ? EM_F32 : x->type == CU_DNN_DATA_DOUBLE ? EM_F64
              : x->type == CU_DNN_DATA_HALF ? EM_F16 : EM_BF16;
  *r = (e_conv){.dir = dir, .dt = dt, .groups = g};
  for (int i = 0; i < 4; i++)
    r->x[i] = x->d[i], r->xs[i] = x->s[i], r->w[i] = w->d[i], r->y[i] = y->d[i], r->ys[i] = y->s[i];
  for (int i = 0; i < 2; i++) r->pad[i] = c->pad[i], r->stride[i] = c->stride[i], r->dil[i] = c->dil[i];
  return 0;
}

static int e_dnn_algos(int dir, void *xd, void *wd, void *cd, void *yd, int want, int *got, cu_dnn_perf *perf) {
  e_conv r;
  int st = e_dnn_resolve(dir, xd, wd, cd, yd, &r);
  if (st) return st;
  if (want < 1 || !got || !perf) return CU_DNN_STATUS_BAD_PARAM;
  dnn_stats.heuristics++;
  int math = ((e_dnn_desc *)cd)->math, n = 0;
  for (int a = 1; a >= 0 && n < want; a--)
    perf[n++] = (cu_dnn_perf){.algo = a, .time = -1, .memory = a ? E_DNN_WORKSPACE : 0, .math_type = math};
  return *got = n, 0;
}
static int e_dnn_fwd_algos(void *h, void *xd, void *wd, void *cd, void *yd, int want, int *got, cu_dnn_perf *perf) {
  return h ? e_dnn_algos(0, xd, wd, cd, yd, want, got, perf) : CU_DNN_STATUS_BAD_PARAM;
}
static int e_dnn_data_algos(void *h, void *wd, void *dyd, void *cd, void *dxd, int want, int *got, cu_dnn_perf *perf) {
  return h ? e_dnn_algos(1, dxd, wd, cd, dyd, want, got, perf) : CU_DNN_STATUS_BAD_PARAM;
}
static int e_dnn_filter_algos(void *h, void *xd, void *dyd, void *cd, void *dwd, int want, int *got,
                              cu_dnn_perf *perf) {
  return h ? e_dnn_algos(2, xd, dwd, cd, dyd, want, got, perf) : CU_DNN_STATUS_BAD_PARAM;
}

/* The offset of packed element i in a [4] of sizes with strides. */
static int64_t e_conv_off(int64_t i, const int *sizes, const int *strides) {
  int64_t off = 0;
  for (int d = 3; d >= 0; i /= sizes[d], d--) off += (i % sizes[d]) * strides[d];
  return off;
}

/* One operand as the reference convolution reads it: in place for f32 and f64, else a packed f32
 * copy in *tmp (NULL without memory). */
static bool e_conv_buf(prim_buf *b, em_dtype dt, uint64_t p, const int *sizes, const int *strides, bool copy,
                       char **tmp) {
  *b = (prim_buf){.data = (char *)(uintptr_t)p, .dtype = dt == EM_F64 ? EM_F64 : EM_F32, .ndim = 4};
  int64_t n = 1;
  for (int d = 3; d >= 0; d--) b->sizes[d] = sizes[d], b->strides[d] = strides[d], n *= sizes[d];
  *tmp = NULL;
  if (dt == EM_F32 || dt == EM_F64) return true;
  if (!(*tmp = malloc(sizeof(float) * (size_t)n))) return false;
  float *f = (float *)*tmp;
  size_t es = ir_dtype(dt)->size;
  for (int64_t i = 0; i < n; i++)
    f[i] = copy ? (float)prim_load(b->data + (size_t)e_conv_off(i, sizes, strides) * es, dt) : 0;
  b->data = *tmp;
  for (int d = 3, q = 1; d >= 0; d--) b->strides[d] = q, q *= sizes[d];
  return true;
}

/* Runs through prims/extern.c's reference convolution (f64 sums, rounded once to f32 or f64),
 * into a packed buffer of the compute dtype; then out = alpha conv + beta out in out's dtype. */
static bool e_conv_run(const e_conv *c) {
  static const em_prim prims[3] = {EM_PRIM_CONV2D, EM_PRIM_CONV2D_BWD_INPUT, EM_PRIM_CONV2D_BWD_WEIGHT};
  int wst[4] = {c->w[1] * c->w[2] * c->w[3], c->w[2] * c->w[3], c->w[3], 1};
  prim_buf x, w, y;
  char *tx = NULL, *tw = NULL, *ty = NULL, *to = NULL;
  bool ok = e_conv_buf(&x, c->dt, c->xp, c->x, c->xs, c->dir != 1, &tx) &&
            e_conv_buf(&w, c->dt, c->wp, c->w, wst, c->dir != 2, &tw) &&
            e_conv_buf(&y, c->dt, c->yp, c->y, c->ys, c->dir != 0, &ty);
  prim_buf *out = c->dir == 0 ? &y : c->dir == 1 ? &x : &w, res = *out;
  int64_t n = 1;
  for (int d = 3; d >= 0; d--) res.strides[d] = n, n *= res.sizes[d];
  size_t es = ir_dtype(res.dtype)->size, eo = ir_dtype(c->dt)->size;
  if (!ok || !(to = malloc(es * (size_t)n))) return free(tx), free(tw), free(ty), false; /* host memory ran out */
  res.data = to;
  prim_attrs at = {.conv = {{c->stride[0], c->stride[1]}, {c->pad[0], c->pad[1]}, {c->dil[0], c->dil[1]}, c->groups,
                            EM_CONV_PAD_EXPLICIT}};
  prim_conv2d_ref(prims[c->dir], &at, &res, c->dir == 1 ? &y : &x, c->dir == 2 ? &y : &w); /* the prims' operands */
  const int *os = c->dir == 0 ? c->ys : c->dir == 1 ? c->xs : wst, *sz = c->dir == 0 ? c->y : c->dir == 1 ? c->x : c->w;
  uint64_t op = c->dir == 0 ? c->yp : c->dir == 1 ? c->xp : c->wp;
  for (int64_t i = 0; i < n; i++) {
    char *at_ = (char *)(uintptr_t)op + (size_t)e_conv_off(i, sz, os) * eo;
    double v = prim_load(to + (size_t)i * es, res.dtype) * c->alpha;
    if (c->beta != 0) v += c->beta * prim_load(at_, c->dt);
    prim_store(at_, c->dt, v);
  }
  free(tx), free(tw), free(ty), free(to);
  return true;
}

static int e_dnn_run(void *h, int dir, const void *alpha, void *xd, const void *x, void *wd, const void *w, void *cd,
                     int algo, void *ws, size_t ws_size, const void *beta, void *yd, const void *y) {
  e_conv r;
  int st = e_dnn_resolve(dir, xd, wd, cd, yd, &r);
  if (st) return st;
  size_t need = algo == 1 ? E_DNN_WORKSPACE : 0;
  if (!h || !alpha || !beta || !x || !w || !y || (algo != 0 && algo != 1) || ws_size < need || (need && !ws))
    return CU_DNN_STATUS_BAD_PARAM;
  r.xp = (uintptr_t)x, r.wp = (uintptr_t)w, r.yp = (uintptr_t)y;
  bool f64 = r.dt == EM_F64;
  r.alpha = f64 ? *(const double *)alpha : *(const float *)alpha;
  r.beta = f64 ? *(const double *)beta : *(const float *)beta;
  if (need) memset(ws, 0xa5, need); /* the workspace is the algorithm's: it must be real, writable memory */
  dnn_stats.runs[dir]++, dnn_stats.last_algo = algo, dnn_stats.last_math = ((e_dnn_desc *)cd)->math;
  e_stream *s = e_capturing(((e_dnn_handle *)h)->stream);
  if (s) return e_record(s, (e_op){.kind = OP_CONV, .conv = r});
  return e_conv_run(&r) ? 0 : E_DNN_ALLOC_FAILED;
}
static int e_dnn_fwd(void *h, const void *alpha, void *xd, const void *x, void *wd, const void *w, void *cd, int algo,
                     void *ws, size_t ws_size, const void *beta, void *yd, void *y) {
  return e_dnn_run(h, 0, alpha, xd, x, wd, w, cd, algo, ws, ws_size, beta, yd, y);
}
static int e_dnn_bwd_data(void *h, const void *alpha, void *wd, const void *w, void *dyd, const void *dy, void *cd,
                          int algo, void *ws, size_t ws_size, const void *beta, void *dxd, void *dx) {
  return e_dnn_run(h, 1, alpha, dxd, dx, wd, w, cd, algo, ws, ws_size, beta, dyd, dy);
}
static int e_dnn_bwd_filter(void *h, const void *alpha, void *xd, const void *x, void *dyd, const void *dy, void *cd,
                            int algo, void *ws, size_t ws_size, const void *beta, void *dwd, void *dw) {
  return e_dnn_run(h, 2, alpha, xd, x, dwd, dw, cd, algo, ws, ws_size, beta, dyd, dy);
}

static const cu_dnn_api emu_dnn = {
    .version = e_dnn_version, .error_string = e_dnn_error, .create = e_dnn_create, .set_stream = e_dnn_set_stream,
    .tensor_create = e_dnn_tensor_create, .tensor_destroy = e_dnn_destroy, .tensor_set = e_dnn_tensor_set,
    .filter_create = e_dnn_filter_create, .filter_destroy = e_dnn_destroy, .filter_set = e_dnn_filter_set,
    .conv_create = e_dnn_conv_create, .conv_destroy = e_dnn_destroy, .conv_set = e_dnn_conv_set,
    .conv_groups = e_dnn_conv_groups, .conv_math = e_dnn_conv_math, .fwd_algos = e_dnn_fwd_algos,
    .bwd_data_algos = e_dnn_data_algos, .bwd_filter_algos = e_dnn_filter_algos, .fwd = e_dnn_fwd,
    .bwd_data = e_dnn_bwd_data, .bwd_filter = e_dnn_bwd_filter,
};
static const cu_dnn_api *e_dnn(char *why, size_t cap) { return (void)why, (void)cap, &emu_dnn; }

static const cu_driver emu = {
    .name = "CUDA emulator (host)", .emulated = true, .cache_salt = emu_prelude,
    .mem_alloc = e_mem_alloc, .mem_free = e_mem_free, .host_alloc = e_host_alloc, .host_free = e_host_free,
    .memcpy_htod = e_htod, .memcpy_dtoh = e_dtoh, .memcpy_dtod = e_dtod,
    .stream_create = e_stream_create, .stream_destroy = e_stream_destroy, .stream_sync = e_stream_sync,
    .stream_wait_event = e_wait_event, .event_create = e_event_create, .event_destroy = e_event_destroy,
    .event_record = e_event_record, .event_sync = e_event_sync, .event_elapsed = e_elapsed,
    .module_load = e_module_load, .module_get_function = e_get_function, .launch = e_launch,
    .ctx_sync = e_ctx_sync, .error_string = e_error, .compile = e_compile, .gemm = e_gemm, .lt = e_lt, .dnn = e_dnn,
    .stream_begin_capture = e_begin_capture, .stream_end_capture = e_end_capture, .graph_instantiate = e_instantiate,
    .graph_launch = e_graph_launch, .graph_exec_destroy = e_exec_destroy, .graph_destroy = e_graph_destroy,
};

const cu_driver *cu_emu_driver(void) { return &emu; }
