/* inductor/inductor.c: scheduling, LLVM code generation and execution of fused pointwise
 * kernels (see inductor.h). Sections: the JIT (one ORC LLJIT per process), the schedule, code
 * generation, running a program. */
#define _POSIX_C_SOURCE 200809L /* strdup, clock_gettime */
#include "inductor.h"

#include <llvm-c/Core.h>
#include <llvm-c/blake3.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <omp.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* f32 lanes of the vector loops: 16 (a zmm register) where the host has AVX-512F, else 8 (ymm,
 * the width of the eager SLEEF loops). SLEEF's f16 and f8 u10 functions share their algorithm
 * and error bound (1 ULP). */
static int LANES = 8;

/* ---- the JIT ---- */

static pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;
static LLVMOrcLLJITRef jit;
static char *host_cpu, *host_features;
static char jit_error[256];
static bool jit_tried;

static bool jit_get(char *err, size_t cap) {
  pthread_mutex_lock(&jit_lock);
  if (!jit_tried) {
    jit_tried = true;
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    LLVMErrorRef e = LLVMOrcCreateLLJIT(&jit, NULL);
    if (e) {
      char *m = LLVMGetErrorMessage(e);
      snprintf(jit_error, sizeof jit_error, "creating the LLJIT: %s", m);
      LLVMDisposeErrorMessage(m);
      jit = NULL;
    } else {
      /* kernels call SLEEF and libm, which the process has loaded */
      LLVMOrcDefinitionGeneratorRef gen;
      e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL);
      if (e) {
        char *m = LLVMGetErrorMessage(e);
        snprintf(jit_error, sizeof jit_error, "process symbol generator: %s", m);
        LLVMDisposeErrorMessage(m);
        LLVMOrcDisposeLLJIT(jit);
        jit = NULL;
      } else {
        LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), gen);
        host_cpu = LLVMGetHostCPUName();
        host_features = LLVMGetHostCPUFeatures();
        if (host_features && strstr(host_features, "+avx512f,") && !getenv("EMBER_NO_AVX512")) LANES = 16;
      }
    }
  }
  bool ok = jit != NULL;
  if (!ok) snprintf(err, cap, "%s", jit_error);
  pthread_mutex_unlock(&jit_lock);
  return ok;
}


/* ---- the kernel cache ----
 *
 * A module's key is the BLAKE3 hash of its LLVM IR before optimisation, the host CPU and its
 * features, the LLVM version and the cache format. Its kernels are named after the key, so the
 * JIT's own symbol table is the in-memory cache: a module whose first kernel is already defined
 * is not compiled again. On disk (EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember/kernels, else
 * ~/.cache/ember/kernels; EMBER_CACHE=0 turns it off) each module is one object file behind a
 * header with its key and the hash of its bytes: written to a temporary file and renamed, so
 * concurrent writers each leave a whole file; a short or corrupt file fails its check and is
 * compiled and written again. */

enum { CACHE_FORMAT = 1 };
#define CACHE_MAGIC "EMBRKOBJ"

typedef struct cache_header {
  char magic[8];
  uint32_t format, reserved;
  uint64_t size;              /* object bytes that follow */
  uint8_t key[16], sum[16];   /* the module's key; BLAKE3 of the object bytes */
} cache_header;

static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static char cache_dir[1024];

static void mkdirs(char *path) {
  for (char *q = path + 1; *q; q++)
    if (*q == '/') {
      *q = 0;
      mkdir(path, 0755);
      *q = '/';
    }
  mkdir(path, 0755);
}

static void cache_init(void) {
  const char *off = getenv("EMBER_CACHE");
  if (off && !strcmp(off, "0")) return;
  const char *dir = getenv("EMBER_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (dir && *dir) snprintf(cache_dir, sizeof cache_dir, "%s", dir);
  else if (xdg && *xdg) snprintf(cache_dir, sizeof cache_dir, "%s/ember/kernels", xdg);
  else if (home && *home) snprintf(cache_dir, sizeof cache_dir, "%s/.cache/ember/kernels", home);
  if (!cache_dir[0]) return;
  mkdirs(cache_dir);
  struct stat st;
  if (stat(cache_dir, &st) || !S_ISDIR(st.st_mode)) cache_dir[0] = 0;
}

const char *ind_cache_dir(void) {
  pthread_once(&cache_once, cache_init);
  return cache_dir[0] ? cache_dir : NULL;
}

static void hash16(const void *a, size_t na, uint8_t out[16]) {
  llvm_blake3_hasher h;
  llvm_blake3_hasher_init(&h);
  llvm_blake3_hasher_update(&h, a, na);
  llvm_blake3_hasher_finalize(&h, out, 16);
}

static void hex16(const uint8_t key[16], char out[33]) {
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", key[i]);
}

static void cache_path(const uint8_t key[16], char *path, size_t cap) {
  char hex[33];
  hex16(key, hex);
  snprintf(path, cap, "%s/%s.o", cache_dir, hex);
}

/* The cached object for key, checked; NULL when absent or damaged. */
static LLVMMemoryBufferRef cache_read(const uint8_t key[16]) {
  if (!ind_cache_dir()) return NULL;
  char path[1200];
  cache_path(key, path, sizeof path);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  cache_header h;
  char *data = NULL;
  bool ok = fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, CACHE_MAGIC, 8) && h.format == CACHE_FORMAT &&
            !memcmp(h.key, key, 16) && h.size > 0 && h.size < ((uint64_t)1 << 32);
  if (ok) ok = (data = malloc(h.size)) != NULL && fread(data, 1, h.size, f) == h.size && fgetc(f) == EOF;
  fclose(f);
  uint8_t sum[16];
  if (ok) hash16(data, h.size, sum), ok = !memcmp(sum, h.sum, 16);
  LLVMMemoryBufferRef buf = ok ? LLVMCreateMemoryBufferWithMemoryRangeCopy(data, h.size, "ember_cached") : NULL;
  free(data);
  return buf;
}

static void cache_write(const uint8_t key[16], const char *data, size_t size) {
  if (!ind_cache_dir()) return;
  char path[1200], tmp[1300];
  cache_path(key, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) return;
  cache_header h = {.format = CACHE_FORMAT, .size = size};
  memcpy(h.magic, CACHE_MAGIC, 8);
  memcpy(h.key, key, 16);
  hash16(data, size, h.sum);
  bool ok = write(fd, &h, sizeof h) == (ssize_t)sizeof h && write(fd, data, size) == (ssize_t)size;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp, path)) unlink(tmp);
}

static _Thread_local ind_cache_stats cache_stats;
ind_cache_stats ind_cache_counters(void) { return cache_stats; }

/* ---- programs ---- */

/* A kernel covers rows [r0, r1) and columns [j0, j1) of its iteration space, so the runtime can
 * split it across threads either way (row kernels only by rows); scratch holds the row kernel's
 * spilled values: n_spill rows of cols floats for the calling thread. */
typedef void (*kernel_fn)(char **bufs, int64_t r0, int64_t r1, int64_t j0, int64_t j1, float *scratch);

/* Kinds of the values a kernel computes or reads. A pointwise kernel's values are all FULL:
 * one element per point of its iteration shape. A row kernel's iteration shape S splits into
 * rows (dims [0, split)) and the reduced columns (dims [split, ndim)); its FULL values have
 * shape S, its ROW values one element per row (any shape of that many elements, row r at
 * linear index r): reductions over the columns, and pointwise ops and views on them. */
enum { K_NONE = 0, K_FULL = 1, K_ROW = 2, K_COL = 3 };
/* K_COL: a pointwise kernel's reduction over the leading dims of its iteration shape (a bias
 * gradient): accumulated in its output buffer, one column per element, so it is an output only,
 * never read inside its kernel. */

typedef struct kernel {
  int n_nodes, *nodes;    /* graph node indices, in order */
  int n_in, *in;          /* values read from outside */
  int n_out, *out;        /* values other steps or the graph's outputs read */
  char name[32];
  kernel_fn fn;
  bool row;               /* a row kernel (holds reductions) */
  bool has_col;           /* a pointwise kernel with K_COL reductions: split across threads by columns only */
  ir_type shape;          /* iteration shape S */
  int split;              /* row kernel: dims [split, ndim) are reduced */
  int n_spill;            /* row kernel: FULL values kept in scratch between passes over a row */
  int64_t rows, cols;     /* the iteration space as the generated loops see it */
  int64_t bytes;          /* bytes read and written, for EMBER_LOGS=schedule */
  char *loop_ir;          /* the loop-level form, printed under EMBER_LOGS=schedule */
  double prof_ms;         /* EMBER_INDUCTOR_PROFILE: time in this kernel, all runs */
  int64_t prof_runs;
} kernel;

typedef struct step {
  int node;   /* >= 0: run this node with the eager kernels */
  int kernel; /* >= 0: run this kernel */
  int tmat;   /* >= 0: node is clone(transpose(matmul(a, b))), run as matmul(b^T, a^T): this matmul */
  bool alias; /* node is a clone of a value nothing else reads: the same tensor when contiguous */
  int n_release, *release; /* values whose last reader is this step */
} step;

struct ind_program {
  ir_graph *g;
  prim_meta *in_meta; /* the input layouts the kernels are specialised to */
  step *steps;
  int n_steps;
  kernel *kernels;
  int n_kernels;
  signed char *kind;  /* [n_values] K_FULL / K_ROW for values computed inside kernels */
  /* memory planning */
  int64_t *arena_off;      /* [n_values] byte offset in the arena of a kernel output, or -1 */
  int64_t arena_bytes;
  int64_t planned_peak;    /* most bytes of kernel outputs live at once (arena and outputs) */
  int *out_step;           /* [n_outputs] the pointwise kernel step that stores output o, or -1 */
  int *in_last_read;       /* [n_inputs] last step that reads input i or a view of it */
  int *in_view_read;       /* [n_inputs] last step that reads a view of input i (not i itself) */
  bool *in_returned;       /* [n_inputs] input i or a view of it is a graph output */
  char *ir_text;
  char *schedule_text;
  ind_stats stats;
};

const char *ind_kernel_ir(const ind_program *p) { return p->ir_text; }
const char *ind_schedule(const ind_program *p) { return p->schedule_text; }

static int profile_on = -1; /* EMBER_INDUCTOR_PROFILE, read at the first run */
static void profile_kernels(const ind_program *p);

void ind_free(ind_program *p) {
  if (!p) return;
  profile_kernels(p);
  for (int k = 0; k < p->n_kernels; k++)
    free(p->kernels[k].nodes), free(p->kernels[k].in), free(p->kernels[k].out), free(p->kernels[k].loop_ir);
  for (int s = 0; s < p->n_steps; s++) free(p->steps[s].release);
  free(p->kernels), free(p->steps), free(p->in_meta), free(p->ir_text), free(p->schedule_text), free(p->kind);
  free(p->arena_off), free(p->out_step), free(p->in_last_read), free(p->in_view_read), free(p->in_returned);
  ir_graph_free(p->g);
  free(p);
}


/* ---- the schedule ---- */

static bool is_f32_or_bool(em_dtype dt) { return dt == EM_F32 || dt == EM_BOOL; }

/* Pointwise prims the code generator implements, for the operand and result dtypes given. */
static bool fusible(const ir_graph *g, const ir_node *n) {
  if (!(prim_get(n->op)->flags & P_POINTWISE)) return false;
  em_dtype out = g->values[n->out].type.dtype;
  if (!is_f32_or_bool(out) || !ir_type_concrete(&g->values[n->out].type)) return false;
  bool all_f32 = out == EM_F32 || n->op == EM_PRIM_CONVERT || (prim_get(n->op)->flags & P_BOOL_OUT);
  for (int k = 0; k < n->n_in; k++) {
    em_dtype d = g->values[ir_operands(g, n)[k]].type.dtype;
    if (!is_f32_or_bool(d)) return false;
    if (!(n->op == EM_PRIM_WHERE && k == 0) && d != EM_F32) all_f32 = false;
  }
  switch (n->op) {
  case EM_PRIM_NEG: case EM_PRIM_ABS: case EM_PRIM_EXP: case EM_PRIM_LOG: case EM_PRIM_LOG1P: case EM_PRIM_EXPM1:
  case EM_PRIM_SQRT: case EM_PRIM_RSQRT: case EM_PRIM_SIN: case EM_PRIM_COS: case EM_PRIM_TANH: case EM_PRIM_ERF:
  case EM_PRIM_RECIPROCAL: case EM_PRIM_ADD: case EM_PRIM_SUB: case EM_PRIM_MUL: case EM_PRIM_DIV:
  case EM_PRIM_MAXIMUM: case EM_PRIM_MINIMUM:
    return out == EM_F32 && all_f32;
  case EM_PRIM_EQ: case EM_PRIM_NE: case EM_PRIM_LT: case EM_PRIM_LE: case EM_PRIM_GT: case EM_PRIM_GE:
  case EM_PRIM_WHERE: case EM_PRIM_CONVERT: case EM_PRIM_LOGICAL_NOT:
    return true;
  case EM_PRIM_LOGICAL_AND: case EM_PRIM_LOGICAL_OR:
    return g->values[ir_operands(g, n)[0]].type.dtype == EM_BOOL;
  default:
    return false;
  }
}

/* An f32 sum, amax or amin over the trailing dims of its operand: the first reduced dim, or -1. */
static int trailing_reduction(const ir_graph *g, const ir_node *n) {
  if (n->op != EM_PRIM_SUM && n->op != EM_PRIM_AMAX && n->op != EM_PRIM_AMIN) return -1;
  const ir_type *u = &g->values[ir_operands(g, n)[0]].type;
  if (u->dtype != EM_F32 || g->values[n->out].type.dtype != EM_F32 || !ir_type_concrete(u)) return -1;
  bool red[EM_MAX_DIMS] = {0};
  for (int a = 0; a < n->attrs.n_axes; a++) red[n->attrs.axes[a]] = true;
  int k = u->ndim;
  while (k > 0 && (red[k - 1] || u->sizes[k - 1] == 1)) k--;
  for (int d = 0; d < k; d++)
    if (red[d] && u->sizes[d] != 1) return -1;
  if (k == u->ndim) return -1; /* reduces nothing of size > 1: leave it to the eager kernel */
  return k;
}

/* An f32 sum, amax or amin over leading dims of its operand that keeps a trailing dim of size
 * > 1: the number of leading dims, or -1. */
static int leading_reduction(const ir_graph *g, const ir_node *n) {
  if (n->op != EM_PRIM_SUM && n->op != EM_PRIM_AMAX && n->op != EM_PRIM_AMIN) return -1;
  const ir_type *u = &g->values[ir_operands(g, n)[0]].type;
  if (u->dtype != EM_F32 || g->values[n->out].type.dtype != EM_F32 || !ir_type_concrete(u)) return -1;
  bool red[EM_MAX_DIMS] = {0};
  for (int a = 0; a < n->attrs.n_axes; a++) red[n->attrs.axes[a]] = true;
  int k = 0;
  while (k < u->ndim && (red[k] || u->sizes[k] == 1)) k++;
  bool kept = false, reduces = false;
  for (int d = 0; d < k; d++) reduces |= red[d] && u->sizes[d] > 1;
  for (int d = k; d < u->ndim; d++) {
    if (red[d] && u->sizes[d] > 1) return -1;
    kept |= u->sizes[d] > 1;
  }
  return kept && reduces ? k : -1;
}

/* Views and scalar constants only make headers: they may run before a kernel that does not feed
 * them, so they do not split a run of pointwise nodes. */
static bool hoistable(const ir_graph *g, const ir_node *n, const bool *in_group) {
  if (!(prim_get(n->op)->flags & P_VIEW) && !(n->op == EM_PRIM_FULL && n->attrs.shape.ndim == 0)) return false;
  for (int k = 0; k < n->n_in; k++)
    if (in_group[ir_operands(g, n)[k]]) return false;
  return true;
}

static bool same_shape(const ir_type *a, const ir_type *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return false;
  return true;
}

static int64_t numel_of(const ir_type *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
  return n;
}

/* Whether dims [split, ndim) of a buffer with these strides (over sizes) coalesce into one. */
static bool inner_coalesces(int ndim, const int64_t *sizes, const int64_t *strides, int split) {
  int prev = -1;
  for (int d = split; d < ndim; d++) {
    if (sizes[d] == 1) continue;
    if (prev >= 0 && strides[prev] != strides[d] * sizes[d]) return false;
    prev = d;
  }
  return true;
}

/* The group being built: nodes fused so far and the iteration space they share. */
enum { G_EMPTY, G_PW, G_ROW };
typedef struct group {
  int n, *nodes;
  int mode;
  bool has_col;
  ir_type shape;
  int split;
  int64_t rows;
} group;

typedef struct builder {
  ind_program *p;
  const prim_meta *meta;
  bool *in_group;
  int *tmat;  /* [n_nodes] see step.tmat */
  bool *alias; /* [n_nodes] see step.alias */
  bool *skip; /* [n_nodes] a matmul or transpose folded into a later node's tmat */
  group gr;
  int cap_steps, cap_kernels;
} builder;

static bool push_step(builder *b, step s) {
  if (b->p->n_steps == b->cap_steps) {
    int c = b->cap_steps ? 2 * b->cap_steps : 64;
    step *n = realloc(b->p->steps, sizeof(step) * (size_t)c);
    if (!n) return false;
    b->p->steps = n, b->cap_steps = c;
  }
  s.n_release = 0, s.release = NULL;
  b->p->steps[b->p->n_steps++] = s;
  return true;
}

/* Whether external operand v can be read by a node of kind `kind` in the group. */
static bool external_ok(const builder *b, int v, int kind) {
  const prim_meta *m = &b->meta[v];
  if (kind == K_ROW || b->gr.mode != G_ROW) return true; /* row r: linear index r, any strides */
  return inner_coalesces(m->ndim, m->sizes, m->strides, b->gr.split);
}

static bool operands_ok(const builder *b, const ir_node *n, int kind) {
  const ir_graph *g = b->p->g;
  for (int k = 0; k < n->n_in; k++) {
    int v = ir_operands(g, n)[k];
    if (!b->in_group[v] && !external_ok(b, v, kind)) return false;
  }
  return true;
}

/* Every external operand of the group's nodes is still readable if the group's nodes took the
 * given kind (FULL under a new split, or ROW). */
static bool group_operands_ok(const builder *b, int kind) {
  for (int i = 0; i < b->gr.n; i++)
    if (!operands_ok(b, &b->p->g->nodes[b->gr.nodes[i]], kind)) return false;
  return true;
}

static void set_kind_all(builder *b, int kind) {
  for (int i = 0; i < b->gr.n; i++) b->p->kind[b->p->g->nodes[b->gr.nodes[i]].out] = (signed char)kind;
}

static void add(builder *b, int node, int kind) {
  b->gr.nodes[b->gr.n++] = node;
  b->in_group[b->p->g->nodes[node].out] = true;
  b->p->kind[b->p->g->nodes[node].out] = (signed char)kind;
}

static int64_t prefix_numel(const ir_type *t, int k) {
  int64_t n = 1;
  for (int d = 0; d < k; d++) n *= t->sizes[d];
  return n;
}

/* Adds node i to the open group when it fits its iteration space; false when it does not. */
static bool try_add(builder *b, int i) {
  const ir_graph *g = b->p->g;
  const ir_node *n = &g->nodes[i];
  const ir_type *t = &g->values[n->out].type;
  group *gr = &b->gr;
  signed char *kind = b->p->kind;
  for (int a = 0; a < n->n_in; a++) /* a column reduction is complete only when its kernel ends */
    if (b->in_group[ir_operands(g, n)[a]] && kind[ir_operands(g, n)[a]] == K_COL) return false;
  if (leading_reduction(g, n) >= 0 && gr->mode != G_ROW) {
    int u = ir_operands(g, n)[0];
    const ir_type *ut = &g->values[u].type;
    if (gr->mode == G_EMPTY) gr->mode = G_PW, gr->shape = *ut, gr->split = ut->ndim, gr->rows = numel_of(ut);
    else if (!same_shape(ut, &gr->shape)) return false;
    gr->has_col = true;
    return add(b, i, K_COL), true;
  }
  if (fusible(g, n)) {
    if (gr->mode == G_EMPTY) {
      if (!operands_ok(b, n, K_FULL)) return false;
      gr->mode = G_PW, gr->shape = *t, gr->split = t->ndim, gr->rows = numel_of(t);
      return add(b, i, K_FULL), true;
    }
    if (same_shape(t, &gr->shape)) return operands_ok(b, n, K_FULL) ? (add(b, i, K_FULL), true) : false;
    if (gr->mode == G_ROW && numel_of(t) == gr->rows && operands_ok(b, n, K_ROW)) return add(b, i, K_ROW), true;
    return false;
  }
  int k = trailing_reduction(g, n);
  if (k >= 0) {
    int u = ir_operands(g, n)[0];
    const ir_type *ut = &g->values[u].type;
    if (b->in_group[u] && kind[u] != K_FULL) return false;
    if (gr->mode == G_EMPTY) {
      gr->mode = G_ROW, gr->shape = *ut, gr->split = k, gr->rows = prefix_numel(ut, k);
      if (!operands_ok(b, n, K_FULL)) return gr->mode = G_EMPTY, false;
      return add(b, i, K_ROW), true;
    }
    if (!same_shape(ut, &gr->shape)) return false;
    if (gr->mode == G_ROW) return k == gr->split && operands_ok(b, n, K_FULL) ? (add(b, i, K_ROW), true) : false;
    /* a pointwise group over S becomes a row kernel */
    if (gr->has_col) return false;
    group saved = *gr;
    gr->mode = G_ROW, gr->split = k, gr->rows = prefix_numel(ut, k);
    if (!group_operands_ok(b, K_FULL) || !operands_ok(b, n, K_FULL)) return *gr = saved, false;
    return add(b, i, K_ROW), true;
  }
  if (!(prim_get(n->op)->flags & P_VIEW) || n->n_in != 1) return false;
  int u = ir_operands(g, n)[0];
  if (!b->in_group[u]) return false;
  const ir_type *ut = &g->values[u].type;
  if (n->op == EM_PRIM_DETACH) return add(b, i, kind[u]), true;
  if (kind[u] == K_ROW && (n->op == EM_PRIM_RESHAPE || n->op == EM_PRIM_SQUEEZE || n->op == EM_PRIM_UNSQUEEZE))
    return add(b, i, K_ROW), true;
  if (n->op != EM_PRIM_EXPAND || ut->ndim != t->ndim) return false;
  /* a broadcast of per-row values over the trailing dims */
  k = ut->ndim;
  while (k > 0 && ut->sizes[k - 1] == 1) k--;
  for (int d = 0; d < k; d++)
    if (ut->sizes[d] != t->sizes[d]) return false;
  if (k == t->ndim) return false;
  if (gr->mode == G_ROW) {
    if (kind[u] != K_ROW || !same_shape(t, &gr->shape) || prefix_numel(t, k) != gr->rows) return false;
    return add(b, i, K_FULL), true;
  }
  /* a pointwise group over per-row values becomes a row kernel over t */
  if (gr->mode != G_PW || gr->has_col || numel_of(&gr->shape) != prefix_numel(t, k)) return false;
  group saved = *gr;
  gr->mode = G_ROW, gr->shape = *t, gr->split = k, gr->rows = prefix_numel(t, k);
  if (!group_operands_ok(b, K_ROW)) return *gr = saved, false;
  set_kind_all(b, K_ROW);
  return add(b, i, K_FULL), true;
}

static bool contains(const int *a, int n, int v) {
  for (int i = 0; i < n; i++)
    if (a[i] == v) return true;
  return false;
}

/* Closes the open group into a kernel step. In-group broadcasts that later steps read are
 * made again after the kernel, as views of their operand (which the kernel then stores). */
static bool close_group(builder *b) {
  group *gr = &b->gr;
  int n = gr->n;
  if (!n) return gr->mode = G_EMPTY, gr->has_col = false, true;
  ind_program *p = b->p;
  const ir_graph *g = p->g;
  if (p->n_kernels == b->cap_kernels) {
    int c = b->cap_kernels ? 2 * b->cap_kernels : 16;
    kernel *k = realloc(p->kernels, sizeof(kernel) * (size_t)c);
    if (!k) return false;
    p->kernels = k, b->cap_kernels = c;
  }
  kernel *k = &p->kernels[p->n_kernels];
  memset(k, 0, sizeof *k);
  k->nodes = malloc(sizeof(int) * (size_t)n);
  k->in = malloc(sizeof(int) * (size_t)(n * 3 + 1));
  k->out = malloc(sizeof(int) * (size_t)(2 * n + 1));
  int *redo = malloc(sizeof(int) * (size_t)(n + 1)), n_redo = 0;
  if (!k->nodes || !k->in || !k->out || !redo) {
    free(k->nodes), free(k->in), free(k->out), free(redo);
    return false;
  }
  memcpy(k->nodes, gr->nodes, sizeof(int) * (size_t)n);
  k->n_nodes = n;
  k->row = gr->mode == G_ROW;
  k->has_col = gr->has_col;
  k->shape = gr->shape;
  k->split = k->row ? gr->split : gr->shape.ndim;
  for (int i = 0; i < n; i++) {
    const ir_node *x = &g->nodes[gr->nodes[i]];
    for (int a = 0; a < x->n_in; a++) {
      int v = ir_operands(g, x)[a];
      if (!b->in_group[v] && !contains(k->in, k->n_in, v)) k->in[k->n_in++] = v;
    }
  }
  /* outputs: results read after the kernel or returned (hoisted views between the group's
   * nodes cannot read a group value: see hoistable) */
  int last = gr->nodes[n - 1];
  for (int i = n - 1; i >= 0; i--) {
    const ir_node *x = &g->nodes[gr->nodes[i]];
    int v = x->out;
    if (contains(k->out, k->n_out, v)) continue; /* already: the operand of a broadcast made again */
    bool used = false;
    for (int o = 0; o < g->n_outputs && !used; o++) used = g->outputs[o] == v;
    for (int j = last + 1; j < g->n_nodes && !used; j++)
      used = contains(ir_operands(g, &g->nodes[j]), g->nodes[j].n_in, v);
    if (!used) continue;
    if (x->op == EM_PRIM_EXPAND) { /* stored, it would not have the view's layout */
      redo[n_redo++] = gr->nodes[i];
      int u = ir_operands(g, x)[0];
      if (!contains(k->out, k->n_out, u)) k->out[k->n_out++] = u;
    } else {
      k->out[k->n_out++] = v;
    }
  }
  /* in graph order, so a later output of the same group is after the values it reads */
  for (int i = 0; i < k->n_out; i++)
    for (int j = i + 1; j < k->n_out; j++)
      if (k->out[j] < k->out[i]) {
        int t = k->out[i];
        k->out[i] = k->out[j], k->out[j] = t;
      }
  snprintf(k->name, sizeof k->name, "k%d", p->n_kernels); /* renamed after the module's key */
  for (int i = 0; i < n; i++) b->in_group[g->nodes[gr->nodes[i]].out] = false;
  p->n_kernels++;
  bool ok = push_step(b, (step){-1, p->n_kernels - 1, -1, false, 0, NULL});
  for (int i = n_redo - 1; ok && i >= 0; i--) ok = push_step(b, (step){redo[i], -1, -1, false, 0, NULL});
  free(redo);
  gr->n = 0, gr->mode = G_EMPTY, gr->has_col = false;
  return ok;
}

/* A contiguous copy of a transposed product, clone(permute(matmul(a, b))) with the last two dims
 * swapped (the gradient of a weight, as the autograd engine accumulates it), is the product
 * b^T a^T, which the GEMM library writes contiguous directly: no transposing copy. The rounding
 * may differ from eager's (the library may sum in another order). */
static void find_transposed_products(builder *b) {
  const ir_graph *g = b->p->g;
  int *uses = malloc(sizeof(int) * (size_t)(g->n_values + 1));
  int *def = malloc(sizeof(int) * (size_t)(g->n_values + 1));
  if (!uses || !def) {
    free(uses), free(def);
    return; /* an optimisation: without it the copies run */
  }
  ir_count_uses(g, uses);
  for (int v = 0; v < g->n_values; v++) def[v] = -1;
  for (int i = 0; i < g->n_nodes; i++) def[g->nodes[i].out] = i;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *c = &g->nodes[i];
    if (c->op != EM_PRIM_CLONE) continue;
    int v = ir_operands(g, c)[0];
    if (def[v] < 0 || uses[v] != 1 || g->nodes[def[v]].op != EM_PRIM_PERMUTE) continue;
    const ir_node *t = &g->nodes[def[v]];
    int nd = t->attrs.n_axes;
    bool swap = nd >= 2 && t->attrs.axes[nd - 1] == nd - 2 && t->attrs.axes[nd - 2] == nd - 1;
    for (int d = 0; swap && d < nd - 2; d++) swap = t->attrs.axes[d] == d;
    int m = ir_operands(g, t)[0];
    if (!swap || def[m] < 0 || uses[m] != 1 || g->nodes[def[m]].op != EM_PRIM_MATMUL) continue;
    const ir_node *mm = &g->nodes[def[m]];
    const ir_type *ta = &g->values[ir_operands(g, mm)[0]].type, *tb = &g->values[ir_operands(g, mm)[1]].type;
    if (ta->ndim < 2 || tb->ndim < 2 || ta->dtype != EM_F32 || tb->dtype != EM_F32) continue;
    b->tmat[i] = def[m];
    b->skip[def[m]] = b->skip[def[v]] = true;
  }
  /* a clone (the autograd engine's copy of a gradient it keeps) of a value made inside the graph
   * that nothing else reads copies nothing: the clone is that tensor */
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *c = &g->nodes[i];
    if (c->op != EM_PRIM_CLONE || b->tmat[i] >= 0) continue;
    int v = ir_operands(g, c)[0];
    bool output = false;
    for (int o = 0; o < g->n_outputs; o++) output |= g->outputs[o] == v;
    b->alias[i] = def[v] >= 0 && uses[v] == 1 && !output;
  }
  free(uses), free(def);
}

static bool schedule(builder *b) {
  const ir_graph *g = b->p->g;
  b->gr.nodes = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
  b->in_group = calloc((size_t)(g->n_values + 1), 1);
  b->tmat = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
  b->skip = calloc((size_t)g->n_nodes + 1, 1);
  b->alias = calloc((size_t)g->n_nodes + 1, 1);
  bool ok = b->gr.nodes && b->in_group && b->tmat && b->skip && b->alias;
  for (int i = 0; ok && i < g->n_nodes; i++) b->tmat[i] = -1;
  if (ok) find_transposed_products(b);
  for (int i = 0; ok && i < g->n_nodes; i++) {
    const ir_node *x = &g->nodes[i];
    if (b->skip[i]) continue;
    if (b->tmat[i] < 0 && !b->alias[i] && try_add(b, i)) continue;
    if (b->gr.n && hoistable(g, x, b->in_group)) {
      ok = push_step(b, (step){i, -1, b->tmat[i], b->alias[i], 0, NULL});
      continue;
    }
    ok = close_group(b) &&
         ((b->tmat[i] < 0 && !b->alias[i] && try_add(b, i)) || push_step(b, (step){i, -1, b->tmat[i], b->alias[i], 0, NULL}));
  }
  ok = ok && close_group(b);
  free(b->gr.nodes), free(b->in_group), free(b->tmat), free(b->skip), free(b->alias);
  return ok;
}

/* Memory planning over the schedule. Each value gets the last step that reads it; a view shares
 * its base's storage (its alias root), so a root's storage lives until the last read of any of
 * its views. Then:
 *  - each step releases the tensors whose last reader it is (graph outputs are kept);
 *  - the intermediates that kernels store (not graph outputs, nor viewed by one) get fixed
 *    byte offsets in one arena per run, placed greedily by size so that two whose lifetimes
 *    overlap never share bytes (the order TFLite's planner uses);
 *  - for in-place updates, each input's last reader and each output's producing kernel. */
static bool plan_memory(ind_program *p) {
  const ir_graph *g = p->g;
  int nv = g->n_values, ns = p->n_steps;
  int *last = malloc(sizeof(int) * (size_t)(nv + 1)), *root = malloc(sizeof(int) * (size_t)(nv + 1));
  int *prod = malloc(sizeof(int) * (size_t)(nv + 1)), *end = malloc(sizeof(int) * (size_t)(nv + 1));
  int *count = calloc((size_t)ns + 1, sizeof(int));
  bool *pinned = calloc((size_t)nv + 1, 1), *stored = calloc((size_t)nv + 1, 1);
  p->arena_off = malloc(sizeof(int64_t) * (size_t)(nv + 1));
  p->out_step = malloc(sizeof(int) * (size_t)(g->n_outputs + 1));
  p->in_last_read = malloc(sizeof(int) * (size_t)(g->n_inputs + 1));
  p->in_view_read = malloc(sizeof(int) * (size_t)(g->n_inputs + 1));
  p->in_returned = calloc((size_t)g->n_inputs + 1, 1);
  bool ok = last && root && prod && end && count && pinned && stored && p->arena_off && p->out_step && p->in_last_read &&
            p->in_view_read && p->in_returned;
  for (int v = 0; ok && v < nv; v++) last[v] = prod[v] = -1, root[v] = v, p->arena_off[v] = -1;
  for (int s = 0; ok && s < ns; s++) {
    const step *st = &p->steps[s];
    if (st->node >= 0) {
      const ir_node *n = &g->nodes[st->node];
      const ir_node *r = st->tmat >= 0 ? &g->nodes[st->tmat] : n; /* a lowered clone reads the product's operands */
      for (int a = 0; a < r->n_in; a++) last[ir_operands(g, r)[a]] = s;
      prod[n->out] = s;
      if (((prim_get(n->op)->flags & P_VIEW) || st->alias) && st->tmat < 0) root[n->out] = root[ir_operands(g, n)[0]];
    } else {
      const kernel *k = &p->kernels[st->kernel];
      for (int i = 0; i < k->n_in; i++) last[k->in[i]] = s;
      for (int i = 0; i < k->n_out; i++) prod[k->out[i]] = s, stored[k->out[i]] = true;
    }
  }
  for (int v = 0; ok && v < nv; v++) end[v] = prod[v];
  for (int v = 0; ok && v < nv; v++)
    if (last[v] > end[root[v]]) end[root[v]] = last[v];
  for (int o = 0; ok && o < g->n_outputs; o++) pinned[root[g->outputs[o]]] = true;
  /* releases: a header at its own last read (its storage lives on in its views) */
  for (int v = 0; ok && v < nv; v++) {
    int at = last[v] > prod[v] ? last[v] : prod[v];
    if (at < 0) continue;
    bool output = false;
    for (int o = 0; o < g->n_outputs && !output; o++) output = g->outputs[o] == v;
    if (!output) count[at]++;
  }
  for (int s = 0; ok && s < ns; s++)
    if (count[s]) ok = (p->steps[s].release = malloc(sizeof(int) * (size_t)count[s])) != NULL;
  for (int v = 0; ok && v < nv; v++) {
    int at = last[v] > prod[v] ? last[v] : prod[v];
    bool output = false;
    for (int o = 0; o < g->n_outputs && !output; o++) output = g->outputs[o] == v;
    if (at >= 0 && !output) p->steps[at].release[p->steps[at].n_release++] = v;
  }
  /* the arena: greedy by size, first offset clear of every placed value live at the same time */
  int n_cand = 0;
  int *cand = ok ? malloc(sizeof(int) * (size_t)(nv + 1)) : NULL;
  ok = ok && cand;
  for (int v = 0; ok && v < nv; v++)
    if (stored[v] && !pinned[v] && numel_of(&g->values[v].type) > 0) cand[n_cand++] = v;
  for (int i = 0; ok && i < n_cand; i++) /* by size, largest first */
    for (int j = i + 1; j < n_cand; j++) {
      const ir_type *ti = &g->values[cand[i]].type, *tj = &g->values[cand[j]].type;
      if (numel_of(tj) * (int64_t)em_dtype_size(tj->dtype) > numel_of(ti) * (int64_t)em_dtype_size(ti->dtype)) {
        int t = cand[i];
        cand[i] = cand[j], cand[j] = t;
      }
    }
  p->arena_bytes = 0;
  for (int i = 0; ok && i < n_cand; i++) {
    int v = cand[i];
    const ir_type *t = &g->values[v].type;
    int64_t size = (numel_of(t) * (int64_t)em_dtype_size(t->dtype) + 63) / 64 * 64, off = 0;
    for (bool moved = true; moved;) {
      moved = false;
      for (int j = 0; j < i; j++) {
        int u = cand[j];
        const ir_type *tu = &g->values[u].type;
        int64_t us = (numel_of(tu) * (int64_t)em_dtype_size(tu->dtype) + 63) / 64 * 64;
        bool overlap_time = !(end[u] < prod[v] || end[v] < prod[u]);
        if (overlap_time && off < p->arena_off[u] + us && p->arena_off[u] < off + size) off = p->arena_off[u] + us, moved = true;
      }
    }
    p->arena_off[v] = off;
    if (off + size > p->arena_bytes) p->arena_bytes = off + size;
  }
  /* the peak of stored bytes live at once, arena and outputs together */
  p->planned_peak = 0;
  for (int s = 0; ok && s < ns; s++) {
    int64_t live = 0;
    for (int v = 0; v < nv; v++)
      if (stored[v] && prod[v] <= s && (pinned[v] || end[v] >= s))
        live += numel_of(&g->values[v].type) * (int64_t)em_dtype_size(g->values[v].type.dtype);
    if (live > p->planned_peak) p->planned_peak = live;
  }
  /* in-place updates */
  for (int o = 0; ok && o < g->n_outputs; o++) {
    int v = g->outputs[o], s = prod[v];
    p->out_step[o] = s >= 0 && p->steps[s].kernel >= 0 && !p->kernels[p->steps[s].kernel].row ? s : -1;
  }
  for (int i = 0; ok && i < g->n_inputs; i++) {
    int x = g->inputs[i];
    p->in_last_read[i] = end[x];
    p->in_view_read[i] = -1;
    p->in_returned[i] = pinned[x];
    for (int v = 0; v < nv; v++)
      if (v != x && root[v] == x && last[v] > p->in_view_read[i]) p->in_view_read[i] = last[v];
  }
  free(last), free(root), free(prod), free(end), free(count), free(pinned), free(stored), free(cand);
  return ok;
}

/* Whether output o may be stored straight into input i (an in-place update the caller would
 * otherwise copy back): a pointwise kernel stores it, after every other read of i and of its
 * views, reading i (if at all) at the element it writes; i is not returned and has o's layout. */
static bool donatable(const ind_program *p, int o, int i) {
  const ir_graph *g = p->g;
  int s = p->out_step[o];
  if (s < 0 || p->in_last_read[i] > s || p->in_view_read[i] >= s || p->in_returned[i]) return false;
  const ir_type *t = &g->values[g->outputs[o]].type;
  const prim_meta *m = &p->in_meta[i];
  if (m->dtype != t->dtype || m->ndim != t->ndim || memcmp(m->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim) ||
      !ir_is_contiguous(m->ndim, m->sizes, m->strides))
    return false;
  for (int q = 0; q < g->n_outputs; q++) /* one value, one buffer */
    if (q != o && g->outputs[q] == g->outputs[o]) return false;
  return true;
}

/* ---- loop IR text ---- */

/* Appends to a growing string (*s, *len); on out of memory the text is dropped (NULL). */
static void sappend(char **s, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sappend(char **s, size_t *len, const char *fmt, ...) {
  if (!*s && *len) return; /* dropped earlier */
  va_list ap;
  va_start(ap, fmt);
  char tmp[512];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n >= (int)sizeof tmp) n = (int)sizeof tmp - 1;
  char *t = realloc(*s, *len + (size_t)n + 1);
  if (!t) {
    free(*s), *s = NULL, *len = 1;
    return;
  }
  memcpy(t + *len, tmp, (size_t)n + 1);
  *s = t, *len += (size_t)n;
}

/* "%v = op(%a, %b)" */
static void node_text(char **s, size_t *len, const ir_graph *g, const ir_node *n) {
  sappend(s, len, "%%%d = %s(", n->out, prim_get(n->op)->name);
  for (int a = 0; a < n->n_in; a++) sappend(s, len, "%s%%%d", a ? ", " : "", ir_operands(g, n)[a]);
  sappend(s, len, ")");
}

/* A buffer's index expression: sum of loop indices times strides. */
static void index_text(char **s, size_t *len, int nd, const int64_t *sizes, const int64_t *strides, const char *const *names) {
  bool any = false;
  for (int d = 0; d < nd; d++) {
    if (!strides[d] || sizes[d] == 1) continue;
    if (strides[d] == 1) sappend(s, len, "%s%s", any ? " + " : "", names[d]);
    else sappend(s, len, "%s%s*%lld", any ? " + " : "", names[d], (long long)strides[d]);
    any = true;
  }
  if (!any) sappend(s, len, "0");
}

/* ---- code generation ---- */

typedef struct cg {
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMTypeRef f32, i1, i8, i64, ptr, vf32, vi8;
} cg;

static LLVMValueRef splat(cg *c, LLVMValueRef s, int w) {
  if (w == 1) return s;
  LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(s), (unsigned)w);
  LLVMValueRef v = LLVMBuildInsertElement(c->b, LLVMGetUndef(vt), s, LLVMConstInt(c->i64, 0, 0), "");
  LLVMValueRef zero_mask = LLVMConstNull(LLVMVectorType(LLVMInt32TypeInContext(c->ctx), (unsigned)w));
  return LLVMBuildShuffleVector(c->b, v, LLVMGetUndef(vt), zero_mask, "splat");
}

static LLVMValueRef fconst(cg *c, double v, int w) { return splat(c, LLVMConstReal(c->f32, v), w); }

static LLVMValueRef call_fn(cg *c, const char *name, LLVMTypeRef ret, LLVMValueRef *args, int n) {
  LLVMTypeRef at[3];
  for (int i = 0; i < n; i++) at[i] = LLVMTypeOf(args[i]);
  LLVMTypeRef ft = LLVMFunctionType(ret, at, (unsigned)n, 0);
  LLVMValueRef f = LLVMGetNamedFunction(c->mod, name);
  if (!f) f = LLVMAddFunction(c->mod, name, ft);
  return LLVMBuildCall2(c->b, ft, f, args, (unsigned)n, "");
}

static LLVMValueRef intrinsic(cg *c, const char *name, LLVMValueRef x) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef f = LLVMGetIntrinsicDeclaration(c->mod, id, &t, 1);
  return LLVMBuildCall2(c->b, LLVMIntrinsicGetType(c->ctx, id, &t, 1), f, &x, 1, "");
}

/* exp, log, ...: SLEEF's 8-lane u10 functions in the vector body, libm in the scalar tail: the
 * functions the eager kernels call. */
static LLVMValueRef transcendental(cg *c, em_prim op, LLVMValueRef x, int w) {
  const char *base = NULL;
  switch (op) {
  case EM_PRIM_EXP: base = "exp"; break;
  case EM_PRIM_LOG: base = "log"; break;
  case EM_PRIM_LOG1P: base = "log1p"; break;
  case EM_PRIM_EXPM1: base = "expm1"; break;
  case EM_PRIM_SIN: base = "sin"; break;
  case EM_PRIM_COS: base = "cos"; break;
  case EM_PRIM_TANH: base = "tanh"; break;
  case EM_PRIM_ERF: base = "erf"; break;
  default: return NULL;
  }
  char name[64];
  if (w == 1) {
    snprintf(name, sizeof name, "%sf", base);
    return call_fn(c, name, c->f32, &x, 1);
  }
#ifdef EMBER_HAVE_SLEEF
  snprintf(name, sizeof name, "Sleef_%sf%d_u10", base, w);
  return call_fn(c, name, c->vf32, &x, 1);
#else
  LLVMValueRef r = LLVMGetUndef(c->vf32);
  snprintf(name, sizeof name, "%sf", base);
  for (int l = 0; l < w; l++) {
    LLVMValueRef lane = LLVMBuildExtractElement(c->b, x, LLVMConstInt(c->i64, (unsigned)l, 0), "");
    r = LLVMBuildInsertElement(c->b, r, call_fn(c, name, c->f32, &lane, 1), LLVMConstInt(c->i64, (unsigned)l, 0), "");
  }
  return r;
#endif
}

/* One node's value from its operands' (f32 as float, bool as i1), w lanes. */
static LLVMValueRef emit_node(cg *c, const ir_graph *g, const ir_node *n, LLVMValueRef *v, int w) {
  LLVMBuilderRef b = c->b;
  const int *o = ir_operands(g, n);
  LLVMValueRef x = v[o[0]], y = n->n_in > 1 ? v[o[1]] : NULL;
  em_dtype xd = g->values[o[0]].type.dtype;
  switch (n->op) {
  case EM_PRIM_DETACH: case EM_PRIM_RESHAPE: case EM_PRIM_SQUEEZE: case EM_PRIM_UNSQUEEZE: return x;
  case EM_PRIM_NEG: return LLVMBuildFNeg(b, x, "");
  case EM_PRIM_ABS: return intrinsic(c, "llvm.fabs", x);
  case EM_PRIM_SQRT: return intrinsic(c, "llvm.sqrt", x);
  case EM_PRIM_RSQRT: return LLVMBuildFDiv(b, fconst(c, 1, w), intrinsic(c, "llvm.sqrt", x), "");
  case EM_PRIM_RECIPROCAL: return LLVMBuildFDiv(b, fconst(c, 1, w), x, "");
  case EM_PRIM_ADD: return LLVMBuildFAdd(b, x, y, "");
  case EM_PRIM_SUB: return LLVMBuildFSub(b, x, y, "");
  case EM_PRIM_MUL: return LLVMBuildFMul(b, x, y, "");
  case EM_PRIM_DIV: return LLVMBuildFDiv(b, x, y, "");
  case EM_PRIM_MAXIMUM: case EM_PRIM_MINIMUM: { /* NaN propagates, as torch.maximum */
    LLVMValueRef xn = LLVMBuildFCmp(b, LLVMRealUNO, x, x, ""), yn = LLVMBuildFCmp(b, LLVMRealUNO, y, y, "");
    LLVMValueRef gt = LLVMBuildFCmp(b, n->op == EM_PRIM_MAXIMUM ? LLVMRealOGT : LLVMRealOLT, x, y, "");
    LLVMValueRef pick = LLVMBuildSelect(b, gt, x, y, "");
    return LLVMBuildSelect(b, xn, x, LLVMBuildSelect(b, yn, y, pick, ""), "");
  }
  case EM_PRIM_EQ: case EM_PRIM_NE: case EM_PRIM_LT: case EM_PRIM_LE: case EM_PRIM_GT: case EM_PRIM_GE: {
    if (xd == EM_F32) {
      static const LLVMRealPredicate rp[] = {LLVMRealOEQ, LLVMRealUNE, LLVMRealOLT, LLVMRealOLE, LLVMRealOGT, LLVMRealOGE};
      return LLVMBuildFCmp(b, rp[n->op - EM_PRIM_EQ], x, y, "");
    }
    static const LLVMIntPredicate ip[] = {LLVMIntEQ, LLVMIntNE, LLVMIntULT, LLVMIntULE, LLVMIntUGT, LLVMIntUGE};
    return LLVMBuildICmp(b, ip[n->op - EM_PRIM_EQ], x, y, "");
  }
  case EM_PRIM_LOGICAL_AND: return LLVMBuildAnd(b, x, y, "");
  case EM_PRIM_LOGICAL_OR: return LLVMBuildOr(b, x, y, "");
  case EM_PRIM_LOGICAL_NOT:
    if (xd == EM_F32) return LLVMBuildFCmp(b, LLVMRealOEQ, x, fconst(c, 0, w), "");
    return LLVMBuildNot(b, x, "");
  case EM_PRIM_WHERE: return LLVMBuildSelect(b, x, y, v[o[2]], "");
  case EM_PRIM_CONVERT: {
    em_dtype to = n->attrs.dtype;
    if (to == xd) return x;
    if (to == EM_BOOL) return LLVMBuildFCmp(b, LLVMRealUNE, x, fconst(c, 0, w), ""); /* (bool)x: x != 0 */
    return LLVMBuildUIToFP(b, x, w == 1 ? c->f32 : c->vf32, "");
  }
  default:
    return transcendental(c, n->op, x, w);
  }
}

/* Layout of one buffer of a kernel in the coalesced iteration space. */
typedef struct buf_access {
  int64_t strides[EM_MAX_DIMS];
  em_dtype dtype;
  em_prim col; /* an output accumulating a column reduction (SUM, AMAX, AMIN), else -1 */
} buf_access;

/* Emits the loads, the node computations and the stores of one iteration: lanes w, buffers at
 * element offsets off[] (outputs first). */
static LLVMValueRef combine(cg *c, em_prim op, LLVMValueRef a, LLVMValueRef x);

/* `void name(char **bufs, i64 r0, i64 r1, i64 j0, i64 j1, float *scratch)` for the host CPU. */
static LLVMValueRef kernel_function(cg *c, const char *name) {
  LLVMTypeRef params[6] = {c->ptr, c->i64, c->i64, c->i64, c->i64, c->ptr};
  LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(c->ctx), params, 6, 0);
  LLVMValueRef fn = LLVMAddFunction(c->mod, name, ft);
  LLVMAddTargetDependentFunctionAttr(fn, "target-cpu", host_cpu);
  LLVMAddTargetDependentFunctionAttr(fn, "target-features", host_features);
  return fn;
}

static void emit_body(cg *c, const ir_graph *g, const kernel *k, LLVMValueRef *base, LLVMValueRef *off,
                      const buf_access *acc, int inner, int w, LLVMValueRef *vals) {
  LLVMBuilderRef b = c->b;
  for (int i = 0; i < k->n_in; i++) {
    const buf_access *a = &acc[k->n_out + i];
    bool is_bool = a->dtype == EM_BOOL;
    LLVMTypeRef et = is_bool ? c->i8 : c->f32;
    LLVMValueRef p = LLVMBuildGEP2(b, et, base[k->n_out + i], &off[k->n_out + i], 1, "");
    LLVMValueRef x;
    if (w > 1 && a->strides[inner] == 1) {
      LLVMTypeRef vt = is_bool ? c->vi8 : c->vf32;
      x = LLVMBuildLoad2(b, vt, p, "");
      LLVMSetAlignment(x, is_bool ? 1 : 4);
    } else {
      x = LLVMBuildLoad2(b, et, p, "");
      LLVMSetAlignment(x, is_bool ? 1 : 4);
      x = splat(c, x, w);
    }
    if (is_bool) x = LLVMBuildICmp(b, LLVMIntNE, x, LLVMConstNull(w == 1 ? c->i8 : c->vi8), "");
    vals[k->in[i]] = x;
  }
  for (int j = 0; j < k->n_nodes; j++) {
    const ir_node *n = &g->nodes[k->nodes[j]];
    bool col = false;
    for (int i = 0; i < k->n_out && !col; i++) col = k->out[i] == n->out && acc[i].col != (em_prim)-1;
    vals[n->out] = col ? vals[ir_operands(g, n)[0]] : emit_node(c, g, n, vals, w);
  }
  for (int i = 0; i < k->n_out; i++) {
    bool is_bool = acc[i].dtype == EM_BOOL;
    LLVMValueRef x = vals[k->out[i]];
    if (acc[i].col != (em_prim)-1) { /* out[column] = out[column] op x */
      LLVMValueRef p = LLVMBuildGEP2(b, c->f32, base[i], &off[i], 1, "");
      LLVMValueRef old = LLVMBuildLoad2(b, w > 1 ? c->vf32 : c->f32, p, "");
      LLVMSetAlignment(old, 4);
      x = combine(c, acc[i].col, old, x);
    }
    if (is_bool) x = LLVMBuildZExt(b, x, w == 1 ? c->i8 : c->vi8, "");
    LLVMValueRef p = LLVMBuildGEP2(b, is_bool ? c->i8 : c->f32, base[i], &off[i], 1, "");
    LLVMValueRef st = LLVMBuildStore(b, x, p);
    LLVMSetAlignment(st, is_bool ? 1 : 4);
  }
}

/* Element offsets of every buffer at column j of the current row. */
static void column_offsets(cg *c, const buf_access *acc, int nb, int inner, LLVMValueRef *row, LLVMValueRef j,
                           LLVMValueRef *off) {
  for (int bi = 0; bi < nb; bi++)
    off[bi] = acc[bi].strides[inner]
                  ? LLVMBuildAdd(c->b, row[bi],
                                 LLVMBuildMul(c->b, j, LLVMConstInt(c->i64, (unsigned long long)acc[bi].strides[inner], 0), ""), "")
                  : row[bi];
}

/* Emits pointwise kernel k as `void name(char **bufs, r0, r1, j0, j1, scratch)`: outer loops over the coalesced leading dims, the
 * innermost dim vectorized when every buffer's innermost stride is 0 or 1, a scalar tail. */
static bool emit_kernel(cg *c, const ir_graph *g, const prim_meta *meta, const signed char *kind, kernel *k, char *err,
                        size_t cap) {
  const ir_type *t = &k->shape;
  int nb = k->n_out + k->n_in;
  buf_access acc[128];
  if (nb > 128) return ir_fail(err, cap, "kernel with %d buffers", nb);
  /* coalesce dims: merge i into i+1 where every buffer's strides allow it */
  int64_t sizes[EM_MAX_DIMS];
  int nd = 0;
  int64_t cont[EM_MAX_DIMS];
  ir_contiguous_strides(t->ndim, t->sizes, cont);
  for (int bi = 0; bi < nb; bi++) {
    int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
    acc[bi].dtype = g->values[v].type.dtype;
  }
  int64_t st[128][EM_MAX_DIMS];
  for (int bi = 0; bi < nb; bi++) {
    int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
    acc[bi].col = bi < k->n_out && kind[v] == K_COL ? EM_PRIM_SUM : (em_prim)-1;
    if (acc[bi].col != (em_prim)-1) { /* a column reduction: its element for the kept dims, 0 across the reduced */
      const ir_node *rn = NULL;
      for (int i = 0; i < k->n_nodes && !rn; i++)
        if (g->nodes[k->nodes[i]].out == v) rn = &g->nodes[k->nodes[i]];
      acc[bi].col = rn->op;
      int lead = leading_reduction(g, rn);
      int64_t run = 1;
      for (int d = t->ndim - 1; d >= 0; d--) {
        st[bi][d] = d < lead ? 0 : run;
        if (d >= lead) run *= t->sizes[d];
      }
      continue;
    }
    for (int d = 0; d < t->ndim; d++) st[bi][d] = bi < k->n_out ? cont[d] : meta[v].strides[d];
  }
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 1) continue; /* size-1 dims contribute nothing */
    bool merge = nd > 0;
    for (int bi = 0; merge && bi < nb; bi++) merge = acc[bi].strides[nd - 1] == st[bi][d] * t->sizes[d];
    if (merge) {
      sizes[nd - 1] *= t->sizes[d];
      for (int bi = 0; bi < nb; bi++) acc[bi].strides[nd - 1] = st[bi][d];
    } else {
      sizes[nd] = t->sizes[d];
      for (int bi = 0; bi < nb; bi++) acc[bi].strides[nd] = st[bi][d];
      nd++;
    }
  }
  if (nd == 0) { /* a single element */
    sizes[0] = 1;
    for (int bi = 0; bi < nb; bi++) acc[bi].strides[0] = 0;
    nd = 1;
  }
  int inner = nd - 1;
  bool vec = true;
  for (int bi = 0; bi < nb; bi++) vec = vec && (acc[bi].strides[inner] == 0 || acc[bi].strides[inner] == 1);
  int64_t outer = 1;
  for (int d = 0; d < inner; d++) outer *= sizes[d];
  int64_t cols = sizes[inner];

  k->rows = outer, k->cols = cols;
  { /* loop IR: for i0..: for j (vectorized): loads, node expressions, stores */
    char *txt = NULL;
    size_t len = 0;
    static const char *const names[] = {"i0", "i1", "i2", "i3", "i4", "i5", "i6", "i7"};
    const char *nm[EM_MAX_DIMS];
    for (int d = 0; d < nd; d++) nm[d] = d == inner ? "j" : names[d < 8 ? d : 7];
    sappend(&txt, &len, "    for");
    for (int d = 0; d < nd; d++) sappend(&txt, &len, " %s in [0,%lld)%s", nm[d], (long long)sizes[d], d + 1 < nd ? "," : "");
    sappend(&txt, &len, "%s:\n", vec ? " (j vectorized)" : "");
    for (int i = 0; i < k->n_in; i++) {
      sappend(&txt, &len, "      %%%d = load in%d[", k->in[i], i);
      index_text(&txt, &len, nd, sizes, acc[k->n_out + i].strides, nm);
      sappend(&txt, &len, "]\n");
    }
    for (int i = 0; i < k->n_nodes; i++) {
      sappend(&txt, &len, "      ");
      node_text(&txt, &len, g, &g->nodes[k->nodes[i]]);
      sappend(&txt, &len, "\n");
    }
    for (int o = 0; o < k->n_out; o++) {
      sappend(&txt, &len, "      %s out%d[", acc[o].col != (em_prim)-1 ? "accumulate" : "store", o);
      index_text(&txt, &len, nd, sizes, acc[o].strides, nm);
      sappend(&txt, &len, "] = %%%d\n", k->out[o]);
    }
    k->loop_ir = txt;
  }
  LLVMBuilderRef b = c->b;
  LLVMValueRef fn = kernel_function(c, k->name);
  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"),
                    ohdr = LLVMAppendBasicBlockInContext(c->ctx, fn, "outer"),
                    obody = LLVMAppendBasicBlockInContext(c->ctx, fn, "row"),
                    vhdr = LLVMAppendBasicBlockInContext(c->ctx, fn, "vhdr"),
                    vbody = LLVMAppendBasicBlockInContext(c->ctx, fn, "vbody"),
                    thdr = LLVMAppendBasicBlockInContext(c->ctx, fn, "thdr"),
                    tbody = LLVMAppendBasicBlockInContext(c->ctx, fn, "tbody"),
                    olatch = LLVMAppendBasicBlockInContext(c->ctx, fn, "olatch"),
                    exitb = LLVMAppendBasicBlockInContext(c->ctx, fn, "exit");
  LLVMPositionBuilderAtEnd(b, entry);
  LLVMValueRef bufs = LLVMGetParam(fn, 0), base[128];
  LLVMValueRef r0 = LLVMGetParam(fn, 1), r1 = LLVMGetParam(fn, 2), j0 = LLVMGetParam(fn, 3), j1 = LLVMGetParam(fn, 4);
  for (int bi = 0; bi < nb; bi++) {
    LLVMValueRef idx = LLVMConstInt(c->i64, (unsigned long long)bi, 0);
    LLVMValueRef pp = LLVMBuildGEP2(b, c->ptr, bufs, &idx, 1, "");
    base[bi] = LLVMBuildLoad2(b, c->ptr, pp, "");
  }
  LLVMBuildBr(b, ohdr);
  LLVMValueRef zero = LLVMConstInt(c->i64, 0, 0), one = LLVMConstInt(c->i64, 1, 0);
  /* outer: r in [0, outer) */
  LLVMPositionBuilderAtEnd(b, ohdr);
  LLVMValueRef r = LLVMBuildPhi(b, c->i64, "r");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, r, r1, ""), obody, exitb);
  LLVMPositionBuilderAtEnd(b, obody);
  LLVMValueRef row[128];
  for (int bi = 0; bi < nb; bi++) row[bi] = zero;
  LLVMValueRef rem = r;
  for (int d = inner - 1; d >= 0; d--) { /* r's index in each leading dim (sizes are constants) */
    LLVMValueRef sz = LLVMConstInt(c->i64, (unsigned long long)sizes[d], 0);
    LLVMValueRef id = d > 0 ? LLVMBuildURem(b, rem, sz, "") : rem;
    if (d > 0) rem = LLVMBuildUDiv(b, rem, sz, "");
    for (int bi = 0; bi < nb; bi++)
      if (acc[bi].strides[d])
        row[bi] = LLVMBuildAdd(b, row[bi], LLVMBuildMul(b, id, LLVMConstInt(c->i64, (unsigned long long)acc[bi].strides[d], 0), ""), "");
  }
  LLVMBuildBr(b, vhdr);
  /* vector loop: j in steps of LANES while j + LANES <= cols */
  LLVMPositionBuilderAtEnd(b, vhdr);
  LLVMValueRef j = LLVMBuildPhi(b, c->i64, "j");
  LLVMValueRef lanes = LLVMConstInt(c->i64, LANES, 0), ncols = j1;
  LLVMValueRef vcond = vec ? LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildAdd(b, j, lanes, ""), ncols, "")
                           : LLVMConstInt(c->i1, 0, 0);
  LLVMBuildCondBr(b, vcond, vbody, thdr);
  LLVMValueRef *vals = calloc((size_t)g->n_values + 1, sizeof(LLVMValueRef));
  if (!vals) return ir_fail(err, cap, "out of memory");
  LLVMPositionBuilderAtEnd(b, vbody);
  LLVMValueRef off[128];
  column_offsets(c, acc, nb, inner, row, j, off);
  if (vec) emit_body(c, g, k, base, off, acc, inner, LANES, vals);
  LLVMValueRef jn = LLVMBuildAdd(b, j, lanes, "");
  LLVMBuildBr(b, vhdr);
  LLVMValueRef jin[2] = {j0, jn};
  LLVMBasicBlockRef jbb[2] = {obody, vbody};
  LLVMAddIncoming(j, jin, jbb, 2);
  /* scalar tail */
  LLVMPositionBuilderAtEnd(b, thdr);
  LLVMValueRef t2 = LLVMBuildPhi(b, c->i64, "t");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, t2, ncols, ""), tbody, olatch);
  LLVMPositionBuilderAtEnd(b, tbody);
  column_offsets(c, acc, nb, inner, row, t2, off);
  emit_body(c, g, k, base, off, acc, inner, 1, vals);
  LLVMValueRef tn = LLVMBuildAdd(b, t2, one, "");
  LLVMBuildBr(b, thdr);
  LLVMValueRef tin[2] = {j, tn};
  LLVMBasicBlockRef tbb[2] = {vhdr, tbody};
  LLVMAddIncoming(t2, tin, tbb, 2);
  /* next row */
  LLVMPositionBuilderAtEnd(b, olatch);
  LLVMValueRef rn = LLVMBuildAdd(b, r, one, "");
  LLVMBuildBr(b, ohdr);
  LLVMValueRef rin[2] = {r0, rn};
  LLVMBasicBlockRef rbb[2] = {entry, olatch};
  LLVMAddIncoming(r, rin, rbb, 2);
  LLVMPositionBuilderAtEnd(b, exitb);
  LLVMBuildRetVoid(b);
  free(vals);
  return true;
}

/* ---- row kernels ----
 *
 * Per row: the loads of per-row inputs, then passes over the row's columns. Pass p computes the
 * FULL values whose inputs are ready at p (avail), accumulates the reductions whose operand is
 * one of them, stores the FULL outputs made in it and spills to scratch the values a later pass
 * reads; between passes the finished reductions become per-row scalars and the ROW values that
 * depend on them are computed. Each value is computed once per row; several passes over a row
 * run in cache. Vector body (8 lanes) plus scalar tail, accumulators in stack slots that
 * mem2reg turns into registers. */

enum { UNROLL = 4 }; /* vectors per step of a pass that reduces: independent accumulator chains */

typedef struct rowgen {
  cg *c;
  const ir_graph *g;
  const kernel *k;
  const signed char *kind; /* of the kernel's own values; 0 for what it reads from outside */
  int *avail;           /* [n_values] pass at which a value is ready (externals 0) */
  int *red_pass;        /* [n_values] pass a reduction's result accumulates in, or -1 */
  int *spill;           /* [n_values] scratch row of a spilled value, or -1 */
  int *buf;             /* [n_values] buffer index of a kernel input or output, or -1 */
  bool *is_full_buf;    /* [buffers] */
  int64_t *inner;       /* [buffers] FULL buffers: stride of the coalesced columns */
  LLVMValueRef *base, *rowoff, *rowval, *vals, scratch, acc_v[64][4], acc_s[64];
  int n_acc, acc_of[64];
} rowgen;

/* a op x for the accumulator a: a NaN in x or in a stays (torch.amax propagates NaN); the chain
 * through a is one compare and one select. */
static LLVMValueRef combine(cg *c, em_prim op, LLVMValueRef a, LLVMValueRef x) {
  LLVMBuilderRef b = c->b;
  if (op == EM_PRIM_SUM) return LLVMBuildFAdd(b, a, x, "");
  LLVMValueRef better = LLVMBuildFCmp(b, op == EM_PRIM_AMAX ? LLVMRealOGT : LLVMRealOLT, x, a, "");
  return LLVMBuildSelect(b, LLVMBuildOr(b, better, LLVMBuildFCmp(b, LLVMRealUNO, x, x, ""), ""), x, a, "");
}

static double reduce_init(em_prim op) { return op == EM_PRIM_SUM ? 0.0 : op == EM_PRIM_AMAX ? -INFINITY : INFINITY; }

static LLVMValueRef load_elem(cg *c, LLVMValueRef base, LLVMValueRef off, em_dtype dt, int w, bool contiguous) {
  LLVMBuilderRef b = c->b;
  bool is_bool = dt == EM_BOOL;
  LLVMTypeRef et = is_bool ? c->i8 : c->f32;
  LLVMValueRef p = LLVMBuildGEP2(b, et, base, &off, 1, "");
  LLVMValueRef x;
  if (w > 1 && contiguous) {
    x = LLVMBuildLoad2(b, is_bool ? c->vi8 : c->vf32, p, "");
    LLVMSetAlignment(x, is_bool ? 1 : 4);
  } else {
    x = LLVMBuildLoad2(b, et, p, "");
    LLVMSetAlignment(x, is_bool ? 1 : 4);
    x = splat(c, x, w);
  }
  if (is_bool) x = LLVMBuildICmp(b, LLVMIntNE, x, LLVMConstNull(w == 1 ? c->i8 : c->vi8), "");
  return x;
}

static void store_elem(cg *c, LLVMValueRef base, LLVMValueRef off, em_dtype dt, LLVMValueRef x, int w) {
  bool is_bool = dt == EM_BOOL;
  if (is_bool) x = LLVMBuildZExt(c->b, x, w == 1 ? c->i8 : c->vi8, "");
  LLVMValueRef p = LLVMBuildGEP2(c->b, is_bool ? c->i8 : c->f32, base, &off, 1, "");
  LLVMSetAlignment(LLVMBuildStore(c->b, x, p), is_bool ? 1 : 4);
}

/* The value of v at column j of the current row in pass `pass`, w lanes. */
static LLVMValueRef row_get(rowgen *r, int v, int pass, LLVMValueRef j, int w) {
  if (r->vals[v]) return r->vals[v];
  cg *c = r->c;
  const ir_graph *g = r->g;
  LLVMValueRef x;
  int bi = r->buf[v];
  if (r->kind[v] == K_ROW || (bi >= 0 && !r->is_full_buf[bi] && !r->kind[v])) {
    x = splat(c, r->rowval[v], w);
  } else if (!r->kind[v]) { /* an external FULL input */
    LLVMValueRef off = r->inner[bi] ? LLVMBuildAdd(c->b, r->rowoff[bi], LLVMBuildMul(c->b, j, LLVMConstInt(c->i64, (unsigned long long)r->inner[bi], 0), ""), "")
                                    : r->rowoff[bi];
    x = load_elem(c, r->base[bi], off, g->values[v].type.dtype, w, r->inner[bi] == 1);
  } else {
    const ir_node *n = NULL;
    for (int i = 0; i < r->k->n_nodes && !n; i++)
      if (g->nodes[r->k->nodes[i]].out == v) n = &g->nodes[r->k->nodes[i]];
    if (n->op == EM_PRIM_EXPAND) {
      x = splat(c, r->rowval[ir_operands(g, n)[0]], w);
    } else if (n->op == EM_PRIM_DETACH) {
      x = row_get(r, ir_operands(g, n)[0], pass, j, w);
    } else if (bi >= 0) { /* made in an earlier pass and stored: read it back */
      LLVMValueRef off = LLVMBuildAdd(c->b, r->rowoff[bi], j, "");
      x = load_elem(c, r->base[bi], off, g->values[v].type.dtype, w, true);
    } else {
      EM_ASSERT(r->spill[v] >= 0);
      LLVMValueRef off = LLVMBuildAdd(c->b, LLVMConstInt(c->i64, (unsigned long long)(r->spill[v] * r->k->cols), 0), j, "");
      x = load_elem(c, r->scratch, off, g->values[v].type.dtype, w, true);
    }
  }
  return r->vals[v] = x;
}

/* One column step of pass `pass` at column j, w lanes, accumulating into accumulator set u. */
static void row_body(rowgen *r, int pass, LLVMValueRef j, int w, int u) {
  cg *c = r->c;
  const ir_graph *g = r->g;
  const kernel *k = r->k;
  for (int v = 0; v < g->n_values; v++) r->vals[v] = NULL;
  for (int i = 0; i < k->n_nodes; i++) {
    const ir_node *n = &g->nodes[k->nodes[i]];
    if (r->red_pass[n->out] == pass) {
      int a = 0;
      while (r->acc_of[a] != n->out) a++;
      LLVMValueRef slot = w > 1 ? r->acc_v[a][u] : r->acc_s[a];
      LLVMValueRef acc = LLVMBuildLoad2(c->b, w > 1 ? c->vf32 : c->f32, slot, "");
      LLVMBuildStore(c->b, combine(c, n->op, acc, row_get(r, ir_operands(g, n)[0], pass, j, w)), slot);
      continue;
    }
    if (r->kind[n->out] != K_FULL || r->avail[n->out] != pass) continue;
    if (n->op == EM_PRIM_EXPAND || n->op == EM_PRIM_DETACH) {
      row_get(r, n->out, pass, j, w);
      continue;
    }
    for (int a = 0; a < n->n_in; a++) row_get(r, ir_operands(g, n)[a], pass, j, w);
    r->vals[n->out] = emit_node(c, g, n, r->vals, w);
  }
  for (int i = 0; i < k->n_nodes; i++) {
    int v = g->nodes[k->nodes[i]].out;
    if (r->kind[v] != K_FULL || r->avail[v] != pass) continue;
    int bi = r->buf[v];
    if (bi >= 0) store_elem(c, r->base[bi], LLVMBuildAdd(c->b, r->rowoff[bi], j, ""), g->values[v].type.dtype, row_get(r, v, pass, j, w), w);
    if (r->spill[v] >= 0) {
      LLVMValueRef off = LLVMBuildAdd(c->b, LLVMConstInt(c->i64, (unsigned long long)(r->spill[v] * k->cols), 0), j, "");
      store_elem(c, r->scratch, off, g->values[v].type.dtype, row_get(r, v, pass, j, w), w);
    }
  }
}

/* Per-row values with avail == pass, in order. */
static void row_scalars(rowgen *r, int pass) {
  const ir_graph *g = r->g;
  for (int i = 0; i < r->k->n_nodes; i++) {
    const ir_node *n = &g->nodes[r->k->nodes[i]];
    if (r->kind[n->out] != K_ROW || r->avail[n->out] != pass || r->red_pass[n->out] >= 0) continue;
    if (prim_get(n->op)->flags & P_VIEW) r->rowval[n->out] = r->rowval[ir_operands(g, n)[0]];
    else r->rowval[n->out] = emit_node(r->c, g, n, r->rowval, 1);
  }
}

static bool emit_row_kernel(cg *c, const ir_graph *g, const prim_meta *meta, const signed char *kind, kernel *k,
                            char *err, size_t cap) {
  const ir_type *S = &k->shape;
  int nb = k->n_out + k->n_in, nv = g->n_values;
  k->rows = prefix_numel(S, k->split), k->cols = numel_of(S) / (k->rows ? k->rows : 1);
  if (k->rows == 0) k->cols = 0;
  signed char *mine = calloc((size_t)nv + 1, 1);
  if (mine)
    for (int i = 0; i < k->n_nodes; i++) mine[g->nodes[k->nodes[i]].out] = kind[g->nodes[k->nodes[i]].out];
  kind = mine;
  rowgen r = {c, g, k, kind};
  r.avail = calloc((size_t)nv + 1, sizeof(int));
  r.red_pass = malloc(sizeof(int) * ((size_t)nv + 1));
  r.spill = malloc(sizeof(int) * ((size_t)nv + 1));
  r.buf = malloc(sizeof(int) * ((size_t)nv + 1));
  r.is_full_buf = calloc((size_t)nb + 1, sizeof(bool));
  r.inner = calloc((size_t)nb + 1, sizeof(int64_t));
  int64_t (*outer)[EM_MAX_DIMS] = calloc((size_t)nb + 1, sizeof *outer);
  r.base = calloc((size_t)nb + 1, sizeof(LLVMValueRef));
  r.rowoff = calloc((size_t)nb + 1, sizeof(LLVMValueRef));
  r.rowval = calloc((size_t)nv + 1, sizeof(LLVMValueRef));
  r.vals = calloc((size_t)nv + 1, sizeof(LLVMValueRef));
  bool ok = mine && r.avail && r.red_pass && r.spill && r.buf && r.is_full_buf && r.inner && outer && r.base &&
            r.rowoff && r.rowval && r.vals;
  if (!ok) ir_fail(err, cap, "out of memory");
  int passes = 0;
  for (int v = 0; ok && v < nv; v++) r.red_pass[v] = r.spill[v] = r.buf[v] = -1;
  /* passes */
  for (int i = 0; ok && i < k->n_nodes; i++) {
    const ir_node *n = &g->nodes[k->nodes[i]];
    int a = 0;
    for (int o = 0; o < n->n_in; o++) {
      int u = ir_operands(g, n)[o];
      if (r.avail[u] > a) a = r.avail[u];
    }
    if (trailing_reduction(g, n) >= 0) {
      if (r.n_acc == 64) ok = ir_fail(err, cap, "more than 64 reductions in one kernel");
      else r.acc_of[r.n_acc++] = n->out;
      r.red_pass[n->out] = a, r.avail[n->out] = a + 1;
      if (a + 1 > passes) passes = a + 1;
    } else {
      r.avail[n->out] = a;
      if (kind[n->out] == K_FULL && a + 1 > passes) passes = a + 1;
    }
  }
  /* buffers */
  for (int bi = 0; ok && bi < nb; bi++) {
    int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
    const ir_type *t = &g->values[v].type;
    r.buf[v] = bi;
    r.is_full_buf[bi] = kind[v] ? kind[v] == K_FULL : same_shape(t, S);
    if (!r.is_full_buf[bi]) continue;
    int64_t st[EM_MAX_DIMS];
    if (bi < k->n_out) ir_contiguous_strides(S->ndim, S->sizes, st);
    else memcpy(st, meta[v].strides, sizeof(int64_t) * (size_t)S->ndim);
    for (int d = 0; d < k->split; d++) outer[bi][d] = st[d];
    for (int d = S->ndim - 1; d >= k->split; d--)
      if (S->sizes[d] != 1) {
        r.inner[bi] = st[d];
        break;
      }
    if (bi < k->n_out && k->cols > 0) r.inner[bi] = 1;
  }
  /* spills: FULL values a later pass reads that are neither stored nor remade for free */
  for (int i = 0; ok && i < k->n_nodes; i++) {
    const ir_node *n = &g->nodes[k->nodes[i]];
    for (int o = 0; o < n->n_in; o++) {
      int u = ir_operands(g, n)[o];
      if (kind[u] != K_FULL || r.buf[u] >= 0 || r.spill[u] >= 0) continue;
      int use_pass = r.red_pass[n->out] >= 0 ? r.red_pass[n->out] : r.avail[n->out];
      if (kind[n->out] != K_FULL && r.red_pass[n->out] < 0) continue;
      if (use_pass <= r.avail[u]) continue;
      int w = u;
      for (;;) { /* through in-kernel detaches to the value that is computed */
        const ir_node *pn = NULL;
        for (int q = 0; q < k->n_nodes && !pn; q++)
          if (g->nodes[k->nodes[q]].out == w) pn = &g->nodes[k->nodes[q]];
        if (pn->op == EM_PRIM_EXPAND) { w = -1; break; }
        if (pn->op != EM_PRIM_DETACH) break;
        w = ir_operands(g, pn)[0];
        if (kind[w] != K_FULL || r.buf[w] >= 0) { w = -1; break; }
      }
      if (w >= 0 && r.spill[w] < 0) r.spill[w] = k->n_spill++;
    }
  }
  if (!ok) goto done;
  { /* loop IR: for r: row values; per pass, for j (vectorized): computes, accumulates, stores */
    char *t = NULL;
    size_t len = 0;
    sappend(&t, &len, "    for r in [0,%lld): (rows split across threads)\n", (long long)k->rows);
    bool rvec = true;
    for (int bi = 0; bi < nb; bi++) rvec = rvec && (!r.is_full_buf[bi] || r.inner[bi] == 0 || r.inner[bi] == 1);
    for (int bi = 0; bi < nb; bi++) {
      int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
      const char *role = bi < k->n_out ? "out" : "in";
      int idx = bi < k->n_out ? bi : bi - k->n_out;
      if (!r.is_full_buf[bi]) sappend(&t, &len, "      %s%d[r] is %%%d (per row)\n", role, idx, v);
      else {
        sappend(&t, &len, "      %s%d[", role, idx);
        static const char *const names[] = {"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"};
        index_text(&t, &len, k->split, S->sizes, outer[bi], names);
        sappend(&t, &len, " + j*%lld] is %%%d\n", (long long)r.inner[bi], v);
      }
    }
    for (int pass = 0; pass <= passes; pass++) {
      for (int i = 0; i < k->n_nodes; i++) { /* per-row values ready at this pass */
        const ir_node *n = &g->nodes[k->nodes[i]];
        if (kind[n->out] != K_ROW || r.avail[n->out] != pass || r.red_pass[n->out] >= 0) continue;
        sappend(&t, &len, "      ");
        node_text(&t, &len, g, n);
        sappend(&t, &len, "\n");
      }
      if (pass == passes) break;
      bool reduces = false;
      for (int a = 0; a < r.n_acc; a++) reduces |= r.red_pass[r.acc_of[a]] == pass;
      sappend(&t, &len, "      pass %d: for j in [0,%lld)%s:\n", pass, (long long)k->cols,
              !rvec ? "" : reduces ? " (vectorized, 4 accumulators a reduction)" : " (vectorized)");
      for (int i = 0; i < k->n_nodes; i++) {
        const ir_node *n = &g->nodes[k->nodes[i]];
        bool here = r.red_pass[n->out] == pass || (kind[n->out] == K_FULL && r.avail[n->out] == pass);
        if (!here) continue;
        sappend(&t, &len, "        ");
        node_text(&t, &len, g, n);
        if (r.red_pass[n->out] >= 0) sappend(&t, &len, " (accumulated over j)");
        if (r.spill[n->out] >= 0) sappend(&t, &len, " -> scratch%d[j]", r.spill[n->out]);
        if (r.buf[n->out] >= 0 && r.buf[n->out] < k->n_out && kind[n->out] == K_FULL) sappend(&t, &len, " -> out%d", r.buf[n->out]);
        sappend(&t, &len, "\n");
      }
    }
    k->loop_ir = t;
  }
  /* the function */
  LLVMBuilderRef b = c->b;
  LLVMValueRef fn = kernel_function(c, k->name);
  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"),
                    ohdr = LLVMAppendBasicBlockInContext(c->ctx, fn, "row_hdr"),
                    obody = LLVMAppendBasicBlockInContext(c->ctx, fn, "row"),
                    exitb = LLVMAppendBasicBlockInContext(c->ctx, fn, "exit");
  LLVMPositionBuilderAtEnd(b, entry);
  LLVMValueRef bufs = LLVMGetParam(fn, 0), r0 = LLVMGetParam(fn, 1), r1 = LLVMGetParam(fn, 2);
  r.scratch = LLVMGetParam(fn, 5);
  for (int bi = 0; bi < nb; bi++) {
    LLVMValueRef idx = LLVMConstInt(c->i64, (unsigned long long)bi, 0);
    r.base[bi] = LLVMBuildLoad2(b, c->ptr, LLVMBuildGEP2(b, c->ptr, bufs, &idx, 1, ""), "");
  }
  for (int a = 0; a < r.n_acc; a++) {
    for (int u = 0; u < UNROLL; u++) r.acc_v[a][u] = LLVMBuildAlloca(b, c->vf32, "accv");
    r.acc_s[a] = LLVMBuildAlloca(b, c->f32, "accs");
  }
  LLVMValueRef jslot = LLVMBuildAlloca(b, c->i64, "j");
  LLVMBuildBr(b, ohdr);
  LLVMValueRef zero = LLVMConstInt(c->i64, 0, 0), one = LLVMConstInt(c->i64, 1, 0);
  LLVMValueRef ncols = LLVMConstInt(c->i64, (unsigned long long)k->cols, 0), lanes = LLVMConstInt(c->i64, LANES, 0);
  LLVMPositionBuilderAtEnd(b, ohdr);
  LLVMValueRef row = LLVMBuildPhi(b, c->i64, "r");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, row, r1, ""), obody, exitb);
  LLVMPositionBuilderAtEnd(b, obody);
  /* row offsets */
  for (int bi = 0; bi < nb; bi++) r.rowoff[bi] = r.is_full_buf[bi] ? zero : row;
  LLVMValueRef rem = row;
  for (int d = k->split - 1; d >= 0; d--) {
    if (S->sizes[d] == 1) continue;
    LLVMValueRef sz = LLVMConstInt(c->i64, (unsigned long long)S->sizes[d], 0);
    LLVMValueRef id = d > 0 ? LLVMBuildURem(b, rem, sz, "") : rem;
    if (d > 0) rem = LLVMBuildUDiv(b, rem, sz, "");
    for (int bi = 0; bi < nb; bi++)
      if (r.is_full_buf[bi] && outer[bi][d])
        r.rowoff[bi] = LLVMBuildAdd(b, r.rowoff[bi], LLVMBuildMul(b, id, LLVMConstInt(c->i64, (unsigned long long)outer[bi][d], 0), ""), "");
  }
  for (int i = 0; i < k->n_in; i++) { /* per-row inputs: row r is element r in row-major order */
    int bi = k->n_out + i, v = k->in[i];
    if (r.is_full_buf[bi]) continue;
    const prim_meta *m = &meta[v];
    LLVMValueRef off = zero, q = row;
    for (int d = m->ndim - 1; d >= 0; d--) {
      if (m->sizes[d] == 1) continue;
      LLVMValueRef sz = LLVMConstInt(c->i64, (unsigned long long)m->sizes[d], 0);
      if (m->strides[d])
        off = LLVMBuildAdd(b, off, LLVMBuildMul(b, LLVMBuildURem(b, q, sz, ""), LLVMConstInt(c->i64, (unsigned long long)m->strides[d], 0), ""), "");
      q = LLVMBuildUDiv(b, q, sz, "");
    }
    r.rowval[v] = load_elem(c, r.base[bi], off, g->values[v].type.dtype, 1, false);
  }
  bool vec = true;
  for (int bi = 0; bi < nb; bi++) vec = vec && (!r.is_full_buf[bi] || r.inner[bi] == 0 || r.inner[bi] == 1);
  for (int pass = 0; pass < passes; pass++) {
    row_scalars(&r, pass);
    for (int a = 0; a < r.n_acc; a++)
      if (r.red_pass[r.acc_of[a]] == pass) {
        em_prim op = EM_PRIM_SUM;
        for (int i = 0; i < k->n_nodes; i++)
          if (g->nodes[k->nodes[i]].out == r.acc_of[a]) op = g->nodes[k->nodes[i]].op;
        for (int u = 0; u < UNROLL; u++) LLVMBuildStore(b, fconst(c, reduce_init(op), LANES), r.acc_v[a][u]);
        LLVMBuildStore(b, fconst(c, reduce_init(op), 1), r.acc_s[a]);
      }
    bool reduces = false;
    for (int a = 0; a < r.n_acc; a++) reduces |= r.red_pass[r.acc_of[a]] == pass;
    LLVMBasicBlockRef vh = LLVMAppendBasicBlockInContext(c->ctx, fn, "vhdr"), vb = LLVMAppendBasicBlockInContext(c->ctx, fn, "vbody"),
                      th = LLVMAppendBasicBlockInContext(c->ctx, fn, "thdr"), tb = LLVMAppendBasicBlockInContext(c->ctx, fn, "tbody"),
                      done_bb = LLVMAppendBasicBlockInContext(c->ctx, fn, "pass_end");
    LLVMBuildStore(b, zero, jslot);
    if (vec && reduces) { /* UNROLL vectors a step, each into its own accumulators */
      LLVMBasicBlockRef uh = LLVMAppendBasicBlockInContext(c->ctx, fn, "uhdr"), ub = LLVMAppendBasicBlockInContext(c->ctx, fn, "ubody");
      LLVMBuildBr(b, uh);
      LLVMPositionBuilderAtEnd(b, uh);
      LLVMValueRef j = LLVMBuildLoad2(b, c->i64, jslot, "");
      LLVMValueRef ustep = LLVMConstInt(c->i64, (unsigned long long)(UNROLL * LANES), 0);
      LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildAdd(b, j, ustep, ""), ncols, ""), ub, vh);
      LLVMPositionBuilderAtEnd(b, ub);
      for (int u = 0; u < UNROLL; u++)
        row_body(&r, pass, LLVMBuildAdd(b, j, LLVMConstInt(c->i64, (unsigned long long)(u * LANES), 0), ""), LANES, u);
      LLVMBuildStore(b, LLVMBuildAdd(b, j, ustep, ""), jslot);
      LLVMBuildBr(b, uh);
    } else {
      LLVMBuildBr(b, vec ? vh : th);
    }
    if (vec) {
      LLVMPositionBuilderAtEnd(b, vh);
      LLVMValueRef j = LLVMBuildLoad2(b, c->i64, jslot, "");
      LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildAdd(b, j, lanes, ""), ncols, ""), vb, th);
      LLVMPositionBuilderAtEnd(b, vb);
      row_body(&r, pass, j, LANES, 0);
      LLVMBuildStore(b, LLVMBuildAdd(b, j, lanes, ""), jslot);
      LLVMBuildBr(b, vh);
    } else {
      LLVMPositionBuilderAtEnd(b, vh);
      LLVMBuildUnreachable(b);
      LLVMPositionBuilderAtEnd(b, vb);
      LLVMBuildUnreachable(b);
    }
    LLVMPositionBuilderAtEnd(b, th);
    LLVMValueRef t = LLVMBuildLoad2(b, c->i64, jslot, "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, t, ncols, ""), tb, done_bb);
    LLVMPositionBuilderAtEnd(b, tb);
    row_body(&r, pass, t, 1, 0);
    LLVMBuildStore(b, LLVMBuildAdd(b, t, one, ""), jslot);
    LLVMBuildBr(b, th);
    LLVMPositionBuilderAtEnd(b, done_bb);
    for (int a = 0; a < r.n_acc; a++) { /* finished reductions: lanes in order, then the tail */
      int v = r.acc_of[a];
      if (r.red_pass[v] != pass) continue;
      em_prim op = EM_PRIM_SUM;
      for (int i = 0; i < k->n_nodes; i++)
        if (g->nodes[k->nodes[i]].out == v) op = g->nodes[k->nodes[i]].op;
      LLVMValueRef av = LLVMBuildLoad2(b, c->vf32, r.acc_v[a][0], ""), x = LLVMConstReal(c->f32, reduce_init(op));
      for (int u = 1; u < UNROLL; u++) av = combine(c, op, av, LLVMBuildLoad2(b, c->vf32, r.acc_v[a][u], ""));
      for (int l = 0; l < LANES; l++) x = combine(c, op, x, LLVMBuildExtractElement(b, av, LLVMConstInt(c->i64, (unsigned)l, 0), ""));
      r.rowval[v] = combine(c, op, x, LLVMBuildLoad2(b, c->f32, r.acc_s[a], ""));
    }
  }
  row_scalars(&r, passes);
  for (int o = 0; o < k->n_out; o++) /* per-row outputs */
    if (!r.is_full_buf[o]) store_elem(c, r.base[o], row, g->values[k->out[o]].type.dtype, r.rowval[k->out[o]], 1);
  LLVMValueRef rn = LLVMBuildAdd(b, row, one, "");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(b);
  LLVMBuildBr(b, ohdr);
  LLVMValueRef rin[2] = {r0, rn};
  LLVMBasicBlockRef rbb[2] = {entry, latch};
  LLVMAddIncoming(row, rin, rbb, 2);
  LLVMPositionBuilderAtEnd(b, exitb);
  LLVMBuildRetVoid(b);
done:
  free(r.avail), free(r.red_pass), free(r.spill), free(r.buf), free(r.is_full_buf), free(r.inner), free(outer);
  free(r.base), free(r.rowoff), free(r.rowval), free(r.vals), free(mine);
  return ok;
}

/* Layouts of every value, as the eager execution of g on inputs with metas in_meta gives them:
 * views carry their strides, everything else is contiguous (a RESHAPE that cannot be a view
 * copies). */
static bool value_metas(const ir_graph *g, const prim_meta *in_meta, prim_meta *meta) {
  for (int i = 0; i < g->n_inputs; i++) meta[g->inputs[i]] = in_meta[i];
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    prim_meta ms[64];
    if (n->n_in > 64) return false;
    for (int k = 0; k < n->n_in; k++) ms[k] = meta[ir_operands(g, n)[k]];
    char why[128];
    if (!prim_meta_fn(n->op, &n->attrs, ms, n->n_in, &meta[n->out], why, sizeof why)) {
      if (n->op != EM_PRIM_RESHAPE) return false;
      meta[n->out] = ir_meta_of_type(&g->values[n->out].type);
    }
    if (!(prim_get(n->op)->flags & P_VIEW)) {
      ir_contiguous_strides(meta[n->out].ndim, meta[n->out].sizes, meta[n->out].strides);
      meta[n->out].offset = 0;
    }
  }
  return true;
}

/* EMBER_LOGS=schedule: each kernel's nodes, iteration space and bytes moved. */
static void describe_schedule(ind_program *p) {
  const ir_graph *g = p->g;
  size_t cap = 256, len = 0;
  char *t = malloc(cap);
  for (int s = 0; t && s < p->n_steps; s++) {
    char line[512];
    int n = 0;
    if (p->steps[s].node >= 0) {
      const ir_node *x = &g->nodes[p->steps[s].node];
      const step *st = &p->steps[s];
      if (st->tmat >= 0)
        n = snprintf(line, sizeof line, "  step %d: %%%d = matmul(%%%d^T, %%%d^T) (GEMM library; the clone of a transposed product)\n", s,
                     x->out, ir_operands(g, &g->nodes[st->tmat])[1], ir_operands(g, &g->nodes[st->tmat])[0]);
      else if (st->alias)
        n = snprintf(line, sizeof line, "  step %d: %%%d = clone(%%%d): the same tensor (nothing else reads it)\n", s, x->out,
                     ir_operands(g, x)[0]);
      else
        n = snprintf(line, sizeof line, "  step %d: %%%d = %s (%s)\n", s, x->out, prim_get(x->op)->name,
                     prim_get(x->op)->flags & P_EXTERN ? "library" : prim_get(x->op)->flags & P_VIEW ? "view" : "eager kernel");
    } else {
      kernel *k = &p->kernels[p->steps[s].kernel];
      int64_t bytes = 0;
      for (int i = 0; i < k->n_in; i++) bytes += numel_of(&g->values[k->in[i]].type) * (int64_t)em_dtype_size(g->values[k->in[i]].type.dtype);
      for (int i = 0; i < k->n_out; i++) bytes += numel_of(&g->values[k->out[i]].type) * (int64_t)em_dtype_size(g->values[k->out[i]].type.dtype);
      k->bytes = bytes;
      n = snprintf(line, sizeof line, "  step %d: %s, %s kernel over [", s, k->name,
                   k->row ? "row" : k->has_col ? "pointwise + column reduction" : "pointwise");
      for (int d = 0; d < k->shape.ndim && n < 400; d++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s%lld%s", d ? "," : "", (long long)k->shape.sizes[d],
                      k->row && d == k->split - 1 ? " |" : "");
      n += snprintf(line + n, sizeof line - (size_t)n, "], %d nodes (", k->n_nodes);
      for (int i = 0; i < k->n_nodes && n < 440; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s%s", i ? " " : "", prim_get(g->nodes[k->nodes[i]].op)->name);
      if (n >= 440) n = 440 + snprintf(line + 440, sizeof line - 440, " ...");
      n += snprintf(line + n, sizeof line - (size_t)n, "), %d in, %d out, %lld bytes\n", k->n_in, k->n_out, (long long)bytes);
      if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
      if (k->loop_ir) { /* the line, then the loop IR after it */
        size_t extra = strlen(k->loop_ir);
        if (len + (size_t)n + extra + 1 > cap) {
          while (len + (size_t)n + extra + 1 > cap) cap *= 2;
          char *nt = realloc(t, cap);
          if (!nt) {
            free(t);
            t = NULL;
            break;
          }
          t = nt;
        }
        memcpy(t + len, line, (size_t)n), len += (size_t)n;
        memcpy(t + len, k->loop_ir, extra), len += extra;
        t[len] = 0;
        continue;
      }
    }
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    if (len + (size_t)n + 1 > cap) {
      while (len + (size_t)n + 1 > cap) cap *= 2;
      char *nt = realloc(t, cap);
      if (!nt) { free(t); t = NULL; break; }
      t = nt;
    }
    memcpy(t + len, line, (size_t)n), len += (size_t)n;
    t[len] = 0;
  }
  p->schedule_text = t;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}


static void llvm_error(LLVMErrorRef e, const char *what, char *err, size_t cap) {
  char *m = LLVMGetErrorMessage(e);
  ir_fail(err, cap, "%s: %s", what, m);
  LLVMDisposeErrorMessage(m);
}

/* The module text with the kernels' placeholder names (@k<i>) replaced by their final ones
 * (@em_<key>_<i>), for EMBER_LOGS=output_code; NULL when out of memory. */
static char *renamed(const char *text, const char *hex) {
  size_t n = strlen(text), cap = n + n / 8 + 64, len = 0;
  char *out = malloc(cap);
  for (size_t i = 0; out && i < n;) {
    if (text[i] == '@' && text[i + 1] == 'k' && text[i + 2] >= '0' && text[i + 2] <= '9') {
      size_t j = i + 2;
      while (text[j] >= '0' && text[j] <= '9') j++;
      if (len + 40 > cap) {
        char *t = realloc(out, cap *= 2);
        if (!t) return free(out), NULL;
        out = t;
      }
      len += (size_t)snprintf(out + len, cap - len, "@em_%.16s_%.*s", hex, (int)(j - i - 2), text + i + 2);
      i = j;
      continue;
    }
    if (len + 2 > cap) {
      char *t = realloc(out, cap *= 2);
      if (!t) return free(out), NULL;
      out = t;
    }
    out[len++] = text[i++];
  }
  if (out) out[len] = 0;
  return out;
}

/* Whether the kernels of module `key` are in the JIT already; fills their addresses. Under jit_lock. */
static bool jit_find(ind_program *p) {
  for (int k = 0; k < p->n_kernels; k++) {
    LLVMOrcExecutorAddress addr;
    LLVMErrorRef e = LLVMOrcLLJITLookup(jit, &addr, p->kernels[k].name);
    if (e) {
      LLVMConsumeError(e);
      return false;
    }
    p->kernels[k].fn = (kernel_fn)(uintptr_t)addr;
  }
  return true;
}

/* Emits every kernel of p into one module, then loads its object code: from the JIT if this
 * process compiled it already, from the disk cache, or by optimising (default<O3> with the host's
 * target machine) and compiling it, writing the object to the disk cache. */
static bool build_kernels(ind_program *p, const prim_meta *meta, ind_stats *stats, char *err, size_t cap) {
  const ir_graph *g = p->g;
  cg c = {0};
  LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
  c.ctx = LLVMOrcThreadSafeContextGetContext(tsc);
  c.mod = LLVMModuleCreateWithNameInContext("ember_kernels", c.ctx);
  const char *triple = LLVMOrcLLJITGetTripleString(jit);
  LLVMSetTarget(c.mod, triple);
  LLVMSetDataLayout(c.mod, LLVMOrcLLJITGetDataLayoutStr(jit));
  c.b = LLVMCreateBuilderInContext(c.ctx);
  c.f32 = LLVMFloatTypeInContext(c.ctx), c.i1 = LLVMInt1TypeInContext(c.ctx), c.i8 = LLVMInt8TypeInContext(c.ctx);
  c.i64 = LLVMInt64TypeInContext(c.ctx), c.ptr = LLVMPointerTypeInContext(c.ctx, 0);
  c.vf32 = LLVMVectorType(c.f32, (unsigned)LANES), c.vi8 = LLVMVectorType(c.i8, (unsigned)LANES);
  bool ok = true;
  for (int k = 0; ok && k < p->n_kernels; k++)
    ok = p->kernels[k].row ? emit_row_kernel(&c, g, meta, p->kind, &p->kernels[k], err, cap)
                           : emit_kernel(&c, g, meta, p->kind, &p->kernels[k], err, cap);
  LLVMDisposeBuilder(c.b);
  LLVMMemoryBufferRef obj = NULL;
  bool found = false;
  if (ok) {
    char *text = LLVMPrintModuleToString(c.mod);
    llvm_blake3_hasher h;
    llvm_blake3_hasher_init(&h);
    llvm_blake3_hasher_update(&h, text, strlen(text) + 1);
    char salt[256];
    int n = snprintf(salt, sizeof salt, "%s|%s|%d|%d", LLVM_VERSION_STRING, host_cpu, LANES, CACHE_FORMAT);
    llvm_blake3_hasher_update(&h, salt, (size_t)n);
    llvm_blake3_hasher_update(&h, host_features, strlen(host_features));
    uint8_t key[16];
    llvm_blake3_hasher_finalize(&h, key, 16);
    char hex[33];
    hex16(key, hex);
    for (int k = 0; k < p->n_kernels; k++) {
      kernel *kk = &p->kernels[k];
      LLVMValueRef f = LLVMGetNamedFunction(c.mod, kk->name);
      snprintf(kk->name, sizeof kk->name, "em_%.16s_%d", hex, k);
      LLVMSetValueName2(f, kk->name, strlen(kk->name));
    }
    p->ir_text = renamed(text, hex);
    LLVMDisposeMessage(text);
    pthread_mutex_lock(&jit_lock);
    found = jit_find(p);
    pthread_mutex_unlock(&jit_lock);
    if (found) {
      cache_stats.memory_hits++;
    } else if ((obj = cache_read(key))) {
      cache_stats.disk_hits++;
    } else {
      cache_stats.misses++;
      LLVMTargetRef target;
      char *msg = NULL;
      if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
        ok = ir_fail(err, cap, "LLVM target %s: %s", triple, msg ? msg : "?");
        LLVMDisposeMessage(msg);
      } else {
        LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, host_cpu, host_features, LLVMCodeGenLevelAggressive,
                                                          LLVMRelocPIC, LLVMCodeModelSmall);
        LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
        /* The kernels are explicit vector loops already: promote the accumulator and counter
         * slots, clean up, hoist the per-row address arithmetic out of the column loops and
         * number values. default<O3> gave the same kernel speed (softmax 1.49 vs 1.61 ms, within
         * noise) at 6x the compile time (MLP step: 370 vs 60 ms), its loop and vectorizer
         * passes finding nothing left to do. */
        LLVMErrorRef e = LLVMRunPasses(c.mod, "function(sroa,early-cse,instcombine,simplifycfg,loop-mssa(licm),gvn,instcombine,simplifycfg)", tm, po);
        LLVMDisposePassBuilderOptions(po);
        if (e) ok = (llvm_error(e, "LLVM passes", err, cap), false);
        if (ok && LLVMTargetMachineEmitToMemoryBuffer(tm, c.mod, LLVMObjectFile, &msg, &obj)) {
          ok = ir_fail(err, cap, "LLVM code generation: %s", msg ? msg : "?");
          LLVMDisposeMessage(msg);
          obj = NULL;
        }
        LLVMDisposeTargetMachine(tm);
        if (ok) cache_write(key, LLVMGetBufferStart(obj), LLVMGetBufferSize(obj));
      }
    }
  }
  LLVMDisposeModule(c.mod);
  LLVMOrcDisposeThreadSafeContext(tsc);
  if (ok && !found) {
    pthread_mutex_lock(&jit_lock);
    if (!jit_find(p)) { /* another thread may have loaded the same module meanwhile */
      LLVMErrorRef e = LLVMOrcLLJITAddObjectFile(jit, LLVMOrcLLJITGetMainJITDylib(jit), obj);
      obj = NULL;
      if (e) ok = (llvm_error(e, "LLJIT", err, cap), false);
      else if (!jit_find(p)) ok = ir_fail(err, cap, "LLJIT: the kernels' symbols are missing from their object file");
    }
    pthread_mutex_unlock(&jit_lock);
  }
  if (obj) LLVMDisposeMemoryBuffer(obj);
  (void)stats;
  return ok;
}

static ind_failure_hook failure_hook;
static ind_compiled_hook compiled_hook;
void ind_set_compiled_hook(ind_compiled_hook hook) { compiled_hook = hook; }
static const char *injected_failure;
static _Thread_local int64_t failures;

void ind_set_failure_hook(ind_failure_hook hook) { failure_hook = hook; }
void ind_debug_fail(const char *reason) { injected_failure = reason; }
int64_t ind_failures(void) { return failures; }

static ind_program *compile(const ir_graph *graph, em_tensor *const *inputs, ind_stats *stats, char *err, size_t cap);

ind_program *ind_compile(const ir_graph *graph, em_tensor *const *inputs, ind_stats *stats, char *err, size_t cap) {
  ind_program *p = injected_failure ? (ir_fail(err, cap, "%s", injected_failure), NULL) : compile(graph, inputs, stats, err, cap);
  if (!p) {
    failures++;
    if (failure_hook) failure_hook(graph->name, err);
  } else if (compiled_hook) {
    compiled_hook(graph->name, p);
  }
  return p;
}

static ind_program *compile(const ir_graph *graph, em_tensor *const *inputs, ind_stats *stats, char *err, size_t cap) {
  double t0 = now_ms();
  if (stats) memset(stats, 0, sizeof *stats);
  if (!jit_get(err, cap)) return NULL;
  ind_program *p = calloc(1, sizeof *p);
  prim_meta *meta = p ? calloc((size_t)graph->n_values + 1, sizeof(prim_meta)) : NULL;
  if (!p || !meta || !(p->g = ir_graph_clone(graph))) {
    free(meta), free(p);
    ir_fail(err, cap, "out of memory");
    return NULL;
  }
  const ir_graph *g = p->g;
  bool ok = true;
  p->in_meta = malloc(sizeof(prim_meta) * (size_t)(g->n_inputs + 1));
  if (!p->in_meta) ok = ir_fail(err, cap, "out of memory");
  for (int i = 0; ok && i < g->n_inputs; i++) p->in_meta[i] = rt_meta(inputs[i]);
  for (int i = 0; ok && i < g->n_nodes; i++)
    if (!ir_type_concrete(&g->values[g->nodes[i].out].type)) ok = ir_fail(err, cap, "symbolic sizes");
  if (ok && !value_metas(g, p->in_meta, meta)) ok = ir_fail(err, cap, "the graph's layouts do not follow from its inputs");
  p->kind = calloc((size_t)g->n_values + 1, 1);
  if (ok && !p->kind) ok = ir_fail(err, cap, "out of memory");
  builder bld = {p, meta};
  if (ok && (!schedule(&bld) || !plan_memory(p))) ok = ir_fail(err, cap, "out of memory scheduling");
  if (ok && p->n_kernels) ok = build_kernels(p, meta, stats, err, cap);
  if (ok) describe_schedule(p);
  free(meta);
  if (!ok) {
    ind_free(p);
    return NULL;
  }
  p->stats.kernels = p->n_kernels;
  for (int k = 0; k < p->n_kernels; k++) p->stats.fused_nodes += p->kernels[k].n_nodes;
  for (int s = 0; s < p->n_steps; s++) p->stats.fallback_nodes += p->steps[s].node >= 0;
  p->stats.compile_ms = now_ms() - t0;
  if (stats) *stats = p->stats;
  return p;
}

ind_stats ind_program_stats(const ind_program *p) { return p->stats; }

/* ---- running ---- */

static _Thread_local int64_t kernel_runs;

/* Runs k over its whole iteration space, split across the OpenMP threads when it is large
 * (rows when there are enough of them, else column blocks that are multiples of the vector
 * width; row kernels only by rows), with the eager loops' grain so small kernels stay on the
 * calling thread. scratch: k->n_spill * k->cols floats per thread. */
static void run_kernel(const kernel *k, char **bufs, float *scratch) {
  int64_t n = k->rows * k->cols;
  int nt = omp_get_max_threads();
  int64_t per = k->n_spill * k->cols;
  if (nt < 2 || n < 2 * PRIM_PARALLEL_GRAIN || (k->row && k->rows < 2) || omp_get_level() > 0) {
    k->fn(bufs, 0, k->rows, 0, k->cols, scratch);
    return;
  }
  if (k->has_col && k->cols < 2 * LANES * nt) { /* each column's accumulation stays on one thread */
    k->fn(bufs, 0, k->rows, 0, k->cols, scratch);
  } else if (!k->has_col && (k->rows >= nt || k->row)) {
    if (nt > k->rows) nt = (int)k->rows;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; t++) {
      int64_t a = k->rows * t / nt, z = k->rows * (t + 1) / nt;
      if (a < z) k->fn(bufs, a, z, 0, k->cols, scratch + per * t);
    }
  } else {
    int64_t block = (k->cols / nt + LANES - 1) / LANES * LANES;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < nt; t++) {
      int64_t a = block * t, z = t == nt - 1 ? k->cols : block * (t + 1);
      if (z > k->cols) z = k->cols;
      if (a < z) k->fn(bufs, 0, k->rows, a, z, scratch);
    }
  }
}
int64_t ind_kernel_runs(void) { return kernel_runs; }

/* EMBER_INDUCTOR_PROFILE=1: time spent per kind of step (each eager prim, pointwise kernels, row
 * kernels) over the process, printed at exit: where a compiled step's time goes. */

static double profile_ms[EM_PRIM_COUNT + 2];
static int64_t profile_n[EM_PRIM_COUNT + 2], profile_bytes[EM_PRIM_COUNT + 2];
static pthread_mutex_t profile_lock = PTHREAD_MUTEX_INITIALIZER;

/* GEMM time by operand shapes. */
static struct { char key[96]; double ms; int64_t n; } profile_gemm[64];

static void profile_gemm_add(const em_tensor *a, const em_tensor *b, double ms) {
  char key[96];
  int n = 0;
  for (int q = 0; q < 2; q++) {
    const em_tensor *t = q ? b : a;
    n += snprintf(key + n, sizeof key - (size_t)n, "%s[", q ? " x " : "");
    for (int d = 0; d < t->ndim && n < 80; d++) n += snprintf(key + n, sizeof key - (size_t)n, "%s%lld", d ? "," : "", (long long)t->sizes[d]);
    n += snprintf(key + n, sizeof key - (size_t)n, "]%s", t->ndim >= 2 && t->strides[t->ndim - 2] == 1 && t->sizes[t->ndim - 1] > 1 ? "T" : "");
  }
  pthread_mutex_lock(&profile_lock);
  for (int i = 0; i < 64; i++)
    if (!profile_gemm[i].n || !strcmp(profile_gemm[i].key, key)) {
      snprintf(profile_gemm[i].key, sizeof profile_gemm[i].key, "%s", key);
      profile_gemm[i].ms += ms, profile_gemm[i].n++;
      break;
    }
  pthread_mutex_unlock(&profile_lock);
}

static void profile_print(void) {
  double total = 0;
  for (int i = 0; i < EM_PRIM_COUNT + 2; i++) total += profile_ms[i];
  fprintf(stderr, "[ember] inductor profile: %.1f ms in compiled graphs\n", total);
  for (;;) {
    int best = -1;
    for (int i = 0; i < EM_PRIM_COUNT + 2; i++)
      if (profile_n[i] && (best < 0 || profile_ms[i] > profile_ms[best])) best = i;
    if (best < 0) break;
    const char *name = best == EM_PRIM_COUNT ? "pointwise kernels" : best == EM_PRIM_COUNT + 1 ? "row kernels" : prim_get((em_prim)best)->name;
    fprintf(stderr, "  %-20s %9.1f ms %5.1f%% %8lld runs", name, profile_ms[best], 100 * profile_ms[best] / (total > 0 ? total : 1),
            (long long)profile_n[best]);
    if (best >= EM_PRIM_COUNT) fprintf(stderr, " %6.1f GB/s", (double)profile_bytes[best] / (profile_ms[best] * 1e6));
    fprintf(stderr, "\n");
    profile_n[best] = 0;
  }
  fprintf(stderr, "  GEMMs by shape (T: transposed operand):\n");
  for (;;) {
    int best = -1;
    for (int i = 0; i < 64; i++)
      if (profile_gemm[i].n && (best < 0 || profile_gemm[i].ms > profile_gemm[best].ms)) best = i;
    if (best < 0) break;
    fprintf(stderr, "    %9.1f ms %6lld runs  %s\n", profile_gemm[best].ms, (long long)profile_gemm[best].n, profile_gemm[best].key);
    profile_gemm[best].n = 0;
  }
}

/* The program's ten slowest kernels, when it is freed. */
static void profile_kernels(const ind_program *p) {
  if (profile_on != 1 || !p->n_kernels || !p->schedule_text) return;
  bool *done = calloc((size_t)p->n_kernels, 1);
  fprintf(stderr, "[ember] inductor profile of %s: slowest kernels\n", p->g->name);
  for (int r = 0; done && r < 10 && r < p->n_kernels; r++) {
    int best = -1;
    for (int k = 0; k < p->n_kernels; k++)
      if (!done[k] && (best < 0 || p->kernels[k].prof_ms > p->kernels[best].prof_ms)) best = k;
    done[best] = true;
    const kernel *k = &p->kernels[best];
    if (!k->prof_runs) break;
    const char *line = strstr(p->schedule_text, k->name), *eol = line ? strchr(line, '\n') : NULL;
    fprintf(stderr, "  %8.3f ms/run %6.1f GB/s  %.*s\n", k->prof_ms / (double)k->prof_runs,
            (double)k->bytes * (double)k->prof_runs / (k->prof_ms * 1e6), line ? (int)(eol ? eol - line : (long)strlen(line)) : 0,
            line ? line : "");
  }
  free(done);
}

static bool profiling(void) {
  if (profile_on < 0) {
    const char *e = getenv("EMBER_INDUCTOR_PROFILE");
    profile_on = e && *e && strcmp(e, "0");
    if (profile_on) atexit(profile_print);
  }
  return profile_on;
}

static void profile_add(int slot, double ms, int64_t bytes) {
  pthread_mutex_lock(&profile_lock);
  profile_ms[slot] += ms, profile_n[slot]++, profile_bytes[slot] += bytes;
  pthread_mutex_unlock(&profile_lock);
}

bool ind_accepts(const ind_program *p, em_tensor *const *in, int n_in) {
  if (n_in != p->g->n_inputs) return false;
  for (int i = 0; i < n_in; i++) {
    prim_meta m = rt_meta(in[i]);
    const prim_meta *w = &p->in_meta[i];
    if (m.dtype != w->dtype || m.ndim != w->ndim || memcmp(m.sizes, w->sizes, sizeof(int64_t) * (size_t)m.ndim) ||
        memcmp(m.strides, w->strides, sizeof(int64_t) * (size_t)m.ndim))
      return false;
  }
  return true;
}

bool ind_run(const ind_program *p, em_tensor *const *in, int n_in, em_tensor **out, const int *donate, em_site site) {
  const ir_graph *g = p->g;
  for (int i = 0; i < g->n_outputs; i++) out[i] = NULL;
  if (!ind_accepts(p, in, n_in))
    return rt_error(site, "em_call", "the inputs do not have the layouts the kernels were compiled for"), false;
  int nv = g->n_values;
  em_tensor **vals = rt_alloc(sizeof(em_tensor *) * (size_t)(nv + 1), 16);
  if (!vals) return rt_error(site, "em_call", "out of memory"), false;
  memset(vals, 0, sizeof(em_tensor *) * (size_t)nv);
  for (int i = 0; i < n_in; i++) vals[g->inputs[i]] = em_retain(in[i]);
  bool ok = true;
  float *scratch = NULL;
  size_t scratch_bytes = 0;
  int nt = omp_get_max_threads();
  /* in-place updates the caller asked for and the plan allows: output value -> input tensor */
  em_tensor **into = NULL;
  if (donate) {
    into = rt_alloc(sizeof(em_tensor *) * (size_t)(nv + 1), 16);
    if (!into) ok = (rt_error(site, "em_call", "out of memory"), false);
    else memset(into, 0, sizeof(em_tensor *) * (size_t)(nv + 1));
    for (int o = 0; ok && o < g->n_outputs; o++) {
      int i = donate[o];
      if (i < 0 || i >= n_in || !donatable(p, o, i)) continue;
      bool shared = false;
      for (int j = 0; j < n_in && !shared; j++) shared = j != i && in[j]->storage == in[i]->storage;
      for (int q = 0; q < g->n_outputs && !shared; q++) shared = q != o && donate[q] == i;
      if (!shared) into[g->outputs[o]] = in[i];
    }
  }
  em_tensor *arena = NULL;
  if (ok && p->arena_bytes > 0) {
    arena = rt_new(EM_F32, 1, (int64_t[]){p->arena_bytes / 4}, "em_call", site);
    ok = arena != NULL;
  }
  bool prof = profiling();
  rt_trace_suspend();
  for (int s = 0; ok && s < p->n_steps; s++) {
    const step *st = &p->steps[s];
    double t0 = prof ? now_ms() : 0;
    if (st->node >= 0) {
      const ir_node *n = &g->nodes[st->node];
      em_tensor *small[4], **ops = n->n_in <= 4 ? small : rt_alloc(sizeof(em_tensor *) * (size_t)n->n_in, 16);
      if (!ops) {
        ok = (rt_error(n->site, n->opname, "out of memory"), false);
        break;
      }
      for (int k = 0; k < n->n_in; k++) ops[k] = vals[ir_operands(g, n)[k]];
      prim_attrs at = n->attrs;
      if (prim_get(n->op)->flags & P_RANDOM)
        rt_rng_reserve(prim_philox_calls(n->op, at.dtype, ir_numel(at.shape.ndim, at.shape.sizes)), &at.seed, &at.offset);
      em_tensor *r;
      if (st->tmat >= 0) { /* (a b)^T as b^T a^T */
        const ir_node *m = &g->nodes[st->tmat];
        em_tensor *ab[2];
        for (int q = 0; q < 2; q++) {
          em_tensor *x = vals[ir_operands(g, m)[q]];
          prim_attrs pa = {.n_axes = x->ndim};
          for (int d = 0; d < x->ndim; d++) pa.axes[d] = d;
          pa.axes[x->ndim - 1] = x->ndim - 2, pa.axes[x->ndim - 2] = x->ndim - 1;
          ab[1 - q] = rt_dispatch(m->opname, EM_PRIM_PERMUTE, &x, 1, &pa, m->site);
        }
        r = ab[0] && ab[1] ? rt_dispatch(m->opname, EM_PRIM_MATMUL, ab, 2, &m->attrs, m->site) : NULL;
        if (prof && r) profile_gemm_add(ab[0], ab[1], now_ms() - t0);
        em_release(ab[0]), em_release(ab[1]);
      } else if (st->alias && ir_is_contiguous(ops[0]->ndim, ops[0]->sizes, ops[0]->strides)) {
        r = em_retain(ops[0]);
      } else {
        r = n->op == EM_PRIM_RESHAPE ? rt_reshape(ops[0], at.shape.ndim, at.shape.sizes, n->opname, n->site)
                                     : rt_dispatch(n->opname, n->op, ops, n->n_in, &at, n->site);
        if (prof && r && n->op == EM_PRIM_MATMUL) profile_gemm_add(ops[0], ops[1], now_ms() - t0);
      }
      if (ops != small) rt_free(ops);
      vals[n->out] = r;
      ok = r != NULL;
      if (prof) profile_add(st->tmat >= 0 ? EM_PRIM_MATMUL : n->op, now_ms() - t0, 0);
    } else {
      const kernel *k = &p->kernels[st->kernel];
      char *small[32], **bufs = k->n_out + k->n_in <= 32 ? small : rt_alloc(sizeof(char *) * (size_t)(k->n_out + k->n_in), 16);
      if (!bufs) {
        ok = (rt_error(site, "em_call", "out of memory"), false);
        break;
      }
      size_t need = sizeof(float) * (size_t)(k->n_spill * k->cols) * (size_t)nt;
      if (need > scratch_bytes) {
        rt_free(scratch);
        scratch = rt_alloc(need, 64);
        scratch_bytes = scratch ? need : 0;
        if (!scratch) ok = (rt_error(site, "em_call", "out of memory for %zu bytes of kernel scratch", need), false);
      }
      for (int o = 0; ok && o < k->n_out; o++) {
        int v = k->out[o];
        const ir_type *t = &g->values[v].type;
        int64_t sz[EM_MAX_DIMS], st_[EM_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++) sz[d] = t->sizes[d];
        if (into && into[v]) {
          vals[v] = em_retain(into[v]);
          rt_bump_version(into[v], "em_call", site);
        } else if (p->arena_off[v] >= 0 && arena) { /* a view of the arena at the planned offset */
          ir_contiguous_strides(t->ndim, sz, st_);
          vals[v] = rt_new_view(arena, t->ndim, sz, st_, 0, "em_call", site);
          if (vals[v]) vals[v]->dtype = t->dtype, vals[v]->offset = p->arena_off[v] / (int64_t)em_dtype_size(t->dtype);
        } else {
          vals[v] = rt_new(t->dtype, t->ndim, sz, "em_call", site);
        }
        ok = vals[v] != NULL;
        if (ok) bufs[o] = rt_data(vals[v]);
      }
      for (int o = 0; ok && o < k->n_out; o++) /* column reductions accumulate from their identity */
        if (p->kind[k->out[o]] == K_COL) {
          float init = 0;
          for (int i = 0; i < k->n_nodes; i++)
            if (g->nodes[k->nodes[i]].out == k->out[o]) init = (float)reduce_init(g->nodes[k->nodes[i]].op);
          float *d = (float *)bufs[o];
          for (int64_t e = 0, n = vals[k->out[o]]->numel; e < n; e++) d[e] = init;
        }
      for (int i = 0; ok && i < k->n_in; i++) bufs[k->n_out + i] = rt_data(vals[k->in[i]]);
      if (ok) {
        run_kernel(k, bufs, scratch);
        kernel_runs++;
        if (prof) {
          double dt = now_ms() - t0;
          profile_add(EM_PRIM_COUNT + k->row, dt, k->bytes);
          ((kernel *)k)->prof_ms += dt, ((kernel *)k)->prof_runs++;
        }
      }
      if (bufs != small) rt_free(bufs);
    }
    for (int i = 0; ok && i < st->n_release; i++) em_release(vals[st->release[i]]), vals[st->release[i]] = NULL;
  }
  rt_trace_resume();
  rt_free(scratch), rt_free(into);
  em_release(arena);
  if (ok)
    for (int i = 0; i < g->n_outputs; i++) out[i] = em_retain(vals[g->outputs[i]]);
  for (int v = 0; v < nv; v++) em_release(vals[v]);
  rt_free(vals);
  return ok;
}

int64_t ind_arena_bytes(const ind_program *p) { return p->arena_bytes; }
int64_t ind_planned_peak(const ind_program *p) { return p->planned_peak; }
