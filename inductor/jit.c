/* inductor/jit.c: the JIT (one ORC LLJIT per process), the kernel cache in memory and on disk,
 * and building a program's kernels into one module loaded into the JIT. */
#define _POSIX_C_SOURCE 200809L /* strdup, mkstemp */
#include "internal.h"
#include "llvm_guard.h"

#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <llvm-c/blake3.h>
#include <pthread.h>
#include <string.h>
#include <stdio.h>

int ind_lanes = 8;
char *ind_host_cpu, *ind_host_features;
const char *ind_cpu_name(void) { return ind_host_cpu; }

/* ---- the JIT ----
 *
 * All LLVM work runs inside ind_llvm_guard (llvm_guard.cpp), which turns LLVM running out of
 * memory (or any fatal error) into an error instead of the end of the process; the caller then
 * runs the graph op by op. What an interrupted piece of work was building is leaked, not
 * disposed of (it may be half-updated). An exception out of the JIT itself may leave ORC's
 * session lock held, so the JIT is then retired: kernels it loaded keep working, and no new
 * ones are compiled in this process (jit_broken). */

static pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;
static LLVMOrcLLJITRef jit;
static char jit_error[256];
static bool jit_tried;

/* EMBER_CPU_ISA=avx2 on an AVX-512 host (em_cpu_isa, runtime/isa.c): LLVM's host features with
 * every AVX-512 feature turned off ("+avx512f" becomes "-avx512f", and so on for avx512*, evex512,
 * avx10* and amx*, which need AVX-512's state), in place: the code generator then emits no EVEX
 * instruction and no zmm register. Its CPU becomes Zen 3 on a Zen 4 or 5 (znver3's cost model
 * for AVX2 code, as the AVX2 machines the project measures), x86-64-v3 elsewhere; the caller
 * frees *cpu. These, and LANES, are what the kernels' attributes, the target machine and the
 * kernel cache key use, so held kernels are cached apart from native ones. 1 when it held
 * something, 0 when the host has no AVX-512, -1 when out of memory. */
static int hold_to_avx2(char **cpu, char *features) {
  static const char *const off[] = {"avx512", "evex512", "avx10", "amx"};
  bool held = false;
  for (char *t = features; t && *t;) {
    size_t n = strcspn(t, ",");
    for (size_t i = 0; *t == '+' && i < sizeof off / sizeof *off; i++)
      if (!strncmp(t + 1, off[i], strlen(off[i]))) *t = '-', held = true;
    t += n + (t[n] == ',');
  }
  if (!held) return 0;
  char *tuned = strdup(!strncmp(*cpu, "znver", 5) ? "znver3" : "x86-64-v3");
  if (!tuned) return -1;
  LLVMDisposeMessage(*cpu);
  *cpu = tuned;
  return 1;
}

/* A builder whose target machine is the effective CPU and features (the JIT adds object files
 * the kernels' own target machine made, so this only keeps the two in agreement); NULL when
 * LLVM has no such target machine. */
static LLVMOrcLLJITBuilderRef jit_builder(const char *cpu, const char *features) {
  char *triple = LLVMGetDefaultTargetTriple(), *msg = NULL;
  LLVMTargetRef target;
  if (!triple || LLVMGetTargetFromTriple(triple, &target, &msg)) {
    LLVMDisposeMessage(triple), LLVMDisposeMessage(msg);
    return NULL;
  }
  LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, cpu, features, LLVMCodeGenLevelAggressive,
                                                    LLVMRelocPIC, LLVMCodeModelSmall);
  LLVMDisposeMessage(triple);
  if (!tm) return NULL;
  LLVMOrcLLJITBuilderRef b = LLVMOrcCreateLLJITBuilder();
  LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(b, LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(tm));
  return b;
}

/* Creates the JIT into jit (NULL and jit_error on an LLVM error; *oom when it ran out of
 * memory, which is worth another try later). Guarded, under jit_lock. */
static void create_jit(void *arg) {
  bool *oom = arg;
  LLVMInitializeNativeTarget();
  LLVMInitializeNativeAsmPrinter();
  char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures(); /* strdup'd: may be NULL */
  LLVMOrcLLJITBuilderRef builder = NULL; /* NULL: LLJIT's own, the host's */
  if (cpu && features && !strcmp(em_cpu_isa(), "avx2")) {
    int held = hold_to_avx2(&cpu, features);
    if (held < 0) LLVMDisposeMessage(features), features = NULL; /* out of memory: below */
    if (held > 0 && !(builder = jit_builder(cpu, features))) {
      snprintf(jit_error, sizeof jit_error, "creating the LLJIT: no %s target machine without AVX-512 (EMBER_CPU_ISA)",
               cpu);
      LLVMDisposeMessage(cpu), LLVMDisposeMessage(features);
      return;
    }
  }
  if (!cpu || !features) {
    LLVMDisposeMessage(cpu), LLVMDisposeMessage(features);
    snprintf(jit_error, sizeof jit_error, "creating the LLJIT: out of memory");
    *oom = true;
    return;
  }
  LLVMOrcLLJITRef j = NULL;
  LLVMErrorRef e = LLVMOrcCreateLLJIT(&j, builder); /* takes the builder */
  if (e) {
    char *m = LLVMGetErrorMessage(e);
    snprintf(jit_error, sizeof jit_error, "creating the LLJIT: %s", m ? m : "out of memory");
    LLVMDisposeErrorMessage(m);
    LLVMDisposeMessage(cpu), LLVMDisposeMessage(features);
    return;
  }
  /* kernels call SLEEF and libm, which the process has loaded */
  LLVMOrcDefinitionGeneratorRef gen;
  e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(j), NULL, NULL);
  if (e) {
    char *m = LLVMGetErrorMessage(e);
    snprintf(jit_error, sizeof jit_error, "process symbol generator: %s", m ? m : "out of memory");
    LLVMDisposeErrorMessage(m);
    LLVMOrcDisposeLLJIT(j);
    LLVMDisposeMessage(cpu), LLVMDisposeMessage(features);
    return;
  }
  LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(j), gen);
  ind_host_cpu = cpu, ind_host_features = features;
  /* 16 f32 lanes (one zmm register) where AVX-512 is on; held to AVX2 its "+avx512f" is "-" */
  if (strstr(ind_host_features, "+avx512f,")) LANES = 16;
  jit = j;
}

bool ind_jit_get(char *err, size_t cap) {
  pthread_mutex_lock(&jit_lock);
  if (!jit_tried) {
    ind_llvm_install_handlers();
    char why[200];
    bool oom = false;
    /* An LLVM error is final; running out of memory is not: the next compile tries again. */
    if (ind_llvm_guard(create_jit, &oom, why, sizeof why) != IND_LLVM_OK)
      snprintf(jit_error, sizeof jit_error, "creating the LLJIT: %s", why), jit = NULL;
    else if (!oom) jit_tried = true;
  }
  bool ok = jit != NULL;
  if (!ok) snprintf(err, cap, "%s", jit_error);
  pthread_mutex_unlock(&jit_lock);
  return ok;
}

/* The JIT failed inside (see above): compile nothing more. Under jit_lock. */
static void retire_jit(const char *why) {
  snprintf(jit_error, sizeof jit_error, "the LLJIT is out of service after an earlier failure (%s)", why);
  jit = NULL; /* leaked: its kernels stay callable */
}

/* ---- the kernel cache ----
 *
 * A module's key is the BLAKE3 hash of its LLVM IR before optimisation, the CPU and features the
 * code is made for (the host's, or held to AVX2 by EMBER_CPU_ISA), the vector lanes, the LLVM
 * version and the cache format. Its kernels are named after the key. In
 * memory, each module loaded into the JIT has its own resource tracker and an entry in `mods`,
 * counting the programs that use it: a program built again finds its module there. The cache
 * is bounded (LRU): past the limit (EMBER_KERNEL_CACHE_MODULES, default 256 modules), the least
 * recently used module that no live program uses is removed from the JIT, its code and symbols
 * freed; a program needing it again gets it from the disk cache. So a process that compiles an
 * endless stream of distinct graphs (constants that change every call) keeps at most the limit
 * plus the modules live programs use. On disk (EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember/kernels, else
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

const char *ind_cache_dir(void) { return rt_cache_dir(); }

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
  snprintf(path, cap, "%s/%s.o", rt_cache_dir(), hex);
}

/* The object of the cache entry at path for key, checked (header, key, size, checksum), in a
 * malloc'd buffer of *size bytes; NULL when absent or damaged. Nothing is allocated before the
 * size is checked against the file's. */
static char *cache_read_path(const char *path, const uint8_t key[16], size_t *size) {
  int64_t file_size;
  FILE *f = rt_cache_open(path, &file_size);
  if (!f) return NULL;
  cache_header h;
  char *data = NULL;
  bool ok = fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, CACHE_MAGIC, 8) && h.format == CACHE_FORMAT &&
            !memcmp(h.key, key, 16) && h.size > 0 && h.size == (uint64_t)file_size - sizeof h; /* no over-allocation */
  if (ok) ok = (data = malloc(h.size)) != NULL && fread(data, 1, h.size, f) == h.size && fgetc(f) == EOF;
  fclose(f);
  uint8_t sum[16];
  if (ok) hash16(data, h.size, sum), ok = !memcmp(sum, h.sum, 16);
  if (!ok) return free(data), NULL;
  *size = h.size;
  return data;
}

static char *cache_read(const uint8_t key[16], size_t *size) {
  if (!ind_cache_dir()) return NULL;
  char path[1200];
  cache_path(key, path, sizeof path);
  return cache_read_path(path, key, size);
}

static void cache_write(const uint8_t key[16], const char *data, size_t size) {
  if (!ind_cache_dir()) return;
  char path[1200];
  cache_path(key, path, sizeof path);
  cache_header h = {.format = CACHE_FORMAT, .size = size};
  memcpy(h.magic, CACHE_MAGIC, 8);
  memcpy(h.key, key, 16);
  hash16(data, size, h.sum);
  rt_write_file_whole(path, &h, sizeof h, data, size);
}

/* Whether obj is an object file that defines every kernel of p by name. A cache entry can pass
 * its checksum and still hold the wrong object (a file copied over another, a bug in an older
 * writer); loaded, its kernels were missing and the graph fell back to op by op on every call
 * (issue 17). The names embed the module's key, which hashes the IR and so every kernel's
 * signature: an object defining them was compiled from this module. The object is read by
 * elf.c, which checks all of it first: LLVM's object reader ends the process on some damage. */
static bool program_defined_by(LLVMMemoryBufferRef obj, const ind_program *p) {
  const char **names = malloc(sizeof *names * (size_t)(p->n_kernels + 1));
  if (!names) return false;
  for (int k = 0; k < p->n_kernels; k++) names[k] = p->kernels[k].name;
  bool ok = ind_elf_defines(LLVMGetBufferStart(obj), LLVMGetBufferSize(obj), p->n_kernels, names);
  free(names);
  return ok;
}

bool ind_cache_entry_ok(const char *path, const uint8_t key[16], int n, const char *const *names) {
  size_t size;
  char *data = cache_read_path(path, key, &size);
  if (!data) return false;
  bool ok = ind_elf_defines(data, size, n, names); /* C only: no LLVM, nothing to guard */
  free(data);
  return ok;
}

static _Thread_local ind_cache_stats cache_stats;
ind_cache_stats ind_cache_counters(void) { return cache_stats; }

/* The modules loaded into the JIT, under jit_lock. */
typedef struct module {
  uint8_t key[16];
  LLVMOrcResourceTrackerRef rt;
  int users;         /* live programs whose kernels are in it */
  uint64_t last_use; /* the LRU clock at its last build */
} module;

static module *mods;
static int n_mods, cap_mods;
static uint64_t mod_clock;
static int64_t mod_evictions, mod_limit = -1;

static int module_limit(void) {
  if (mod_limit < 0) {
    const char *e = getenv("EMBER_KERNEL_CACHE_MODULES");
    long v = e && *e ? strtol(e, NULL, 10) : 0;
    mod_limit = v > 0 ? v : 256;
  }
  return (int)mod_limit;
}

void ind_set_kernel_cache_limit(int modules) {
  pthread_mutex_lock(&jit_lock);
  mod_limit = modules > 0 ? modules : -1;
  pthread_mutex_unlock(&jit_lock);
}

em_kernel_cache_stats em_kernel_cache_info(void) {
  pthread_mutex_lock(&jit_lock);
  em_kernel_cache_stats s = {.modules = n_mods, .limit = module_limit(), .evictions = mod_evictions};
  for (int i = 0; i < n_mods; i++) s.in_use += mods[i].users > 0;
  pthread_mutex_unlock(&jit_lock);
  return s;
}

static module *module_find(const uint8_t key[16]) {
  for (int i = 0; i < n_mods; i++)
    if (!memcmp(mods[i].key, key, 16)) return &mods[i];
  return NULL;
}

/* Removes least recently used modules no program uses while there are more than the limit.
 * Guarded, under jit_lock. A removal that fails leaves the module loaded (and counted). */
static void evict_modules(void) {
  int limit = module_limit();
  while (n_mods > limit) {
    int lru = -1;
    for (int i = 0; i < n_mods; i++)
      if (!mods[i].users && (lru < 0 || mods[i].last_use < mods[lru].last_use)) lru = i;
    if (lru < 0) return; /* every module is in use */
    LLVMErrorRef e = LLVMOrcResourceTrackerRemove(mods[lru].rt);
    if (e) {
      LLVMConsumeError(e);
      mods[lru].last_use = mod_clock++; /* try the next one */
      return;
    }
    LLVMOrcReleaseResourceTracker(mods[lru].rt);
    mods[lru] = mods[--n_mods];
    mod_evictions++;
  }
}

/* The program no longer runs its kernels: its module may be evicted. */
void ind_release_kernels(ind_program *p) {
  if (!p->has_module) return;
  pthread_mutex_lock(&jit_lock);
  module *m = module_find(p->module_key);
  if (m && m->users > 0) m->users--;
  p->has_module = false;
  pthread_mutex_unlock(&jit_lock);
}

static void llvm_error(LLVMErrorRef e, const char *what, char *err, size_t cap) {
  char *m = LLVMGetErrorMessage(e);
  ir_fail(err, cap, "%s: %s", what, m ? m : "out of memory");
  LLVMDisposeErrorMessage(m);
}

/* The module text with the kernels' provisional names (@k<i>) replaced by their final ones
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

/* p runs module m's kernels. Under jit_lock. */
static void hold(ind_program *p, module *m) {
  m->users++;
  m->last_use = mod_clock++;
  memcpy(p->module_key, m->key, 16);
  p->has_module = true;
}

/* One build of a program's kernels: what each guarded step makes, kept here so that a step LLVM
 * interrupts leaves it where ind_build_kernels can see it. */
typedef struct build {
  ind_program *p;
  const prim_meta *meta;
  cg c;
  LLVMOrcThreadSafeContextRef tsc;
  const char *triple;
  uint8_t key[16];
  char *cached; /* the object from the disk cache (malloc'd), or NULL */
  size_t cached_size;
  LLVMMemoryBufferRef obj;
  bool ok, found, hit;
  char *err;
  size_t cap;
} build;

/* Emits every kernel into one module, prints it, hashes it into the module's key and names the
 * kernels after the key. Guarded. */
static void emit_module(void *arg) {
  build *b = arg;
  ind_program *p = b->p;
  cg *c = &b->c;
  b->tsc = LLVMOrcCreateNewThreadSafeContext();
  c->ctx = LLVMOrcThreadSafeContextGetContext(b->tsc);
  c->mod = LLVMModuleCreateWithNameInContext("ember_kernels", c->ctx);
  b->triple = LLVMOrcLLJITGetTripleString(jit);
  LLVMSetTarget(c->mod, b->triple);
  LLVMSetDataLayout(c->mod, LLVMOrcLLJITGetDataLayoutStr(jit));
  c->b = LLVMCreateBuilderInContext(c->ctx);
  c->f32 = LLVMFloatTypeInContext(c->ctx), c->i1 = LLVMInt1TypeInContext(c->ctx), c->i8 = LLVMInt8TypeInContext(c->ctx);
  c->i64 = LLVMInt64TypeInContext(c->ctx), c->ptr = LLVMPointerTypeInContext(c->ctx, 0);
  c->f64 = LLVMDoubleTypeInContext(c->ctx);
  c->vf32 = LLVMVectorType(c->f32, (unsigned)LANES), c->vi8 = LLVMVectorType(c->i8, (unsigned)LANES);
  c->args = p->opts.sizes_as_args, c->table = NULL, c->n_table = c->cap_table = 0, c->oom = false;
  b->ok = true;
  for (int k = 0; b->ok && k < p->n_kernels; k++)
    b->ok = p->kernels[k].row ? ind_emit_row_kernel(c, p->g, b->meta, p->kind, &p->kernels[k], b->err, b->cap)
                              : ind_emit_kernel(c, p->g, b->meta, p->kind, &p->kernels[k], b->err, b->cap);
  free(c->table);
  c->table = NULL;
  LLVMDisposeBuilder(c->b);
  if (!b->ok) return;
  char *bad = NULL; /* a code generator bug: the graph runs op by op instead of LLVM crashing on it */
  if (LLVMVerifyModule(c->mod, LLVMReturnStatusAction, &bad)) {
    b->ok = ir_fail(b->err, b->cap, "internal error: the kernels' LLVM IR does not verify: %.300s", bad ? bad : "?");
    LLVMDisposeMessage(bad);
    return;
  }
  LLVMDisposeMessage(bad);
  char *text = LLVMPrintModuleToString(c->mod); /* strdup'd: may be NULL */
  if (!text) {
    b->ok = ir_fail(b->err, b->cap, "out of memory printing the kernels' module");
    return;
  }
  llvm_blake3_hasher h;
  llvm_blake3_hasher_init(&h);
  llvm_blake3_hasher_update(&h, text, strlen(text) + 1);
  char salt[256];
  int n = snprintf(salt, sizeof salt, "%s|%s|%d|%d", LLVM_VERSION_STRING, ind_host_cpu, LANES, CACHE_FORMAT);
  llvm_blake3_hasher_update(&h, salt, (size_t)n);
  llvm_blake3_hasher_update(&h, ind_host_features, strlen(ind_host_features));
  llvm_blake3_hasher_finalize(&h, b->key, 16);
  char hex[33];
  hex16(b->key, hex);
  for (int k = 0; k < p->n_kernels; k++) {
    kernel *kk = &p->kernels[k];
    LLVMValueRef f = LLVMGetNamedFunction(c->mod, kk->name);
    snprintf(kk->name, sizeof kk->name, "em_%.16s_%d", hex, k);
    LLVMSetValueName2(f, kk->name, strlen(kk->name));
  }
  p->ir_text = renamed(text, hex);
  LLVMDisposeMessage(text);
}

/* b->found: whether the JIT has the module's kernels already (then the program uses it).
 * Guarded, under jit_lock. */
static void find_kernels(void *arg) {
  build *b = arg;
  module *m = module_find(b->key);
  b->found = m && jit_find(b->p);
  if (b->found) hold(b->p, m);
}

/* The module's object code in b->obj: the disk cache's copy, or optimised (a short pipeline, see
 * below) and compiled with the host's target machine. Guarded. */
static void compile_module(void *arg) {
  build *b = arg;
  if (b->cached) {
    b->obj = LLVMCreateMemoryBufferWithMemoryRangeCopy(b->cached, b->cached_size, "ember_cached");
    if (program_defined_by(b->obj, b->p)) {
      b->hit = true;
      return;
    }
    LLVMDisposeMemoryBuffer(b->obj); /* compiled again below, and the entry replaced */
    b->obj = NULL;
    cache_stats.bad_entries++;
  }
  LLVMTargetRef target;
  char *msg = NULL;
  if (LLVMGetTargetFromTriple(b->triple, &target, &msg)) {
    b->ok = ir_fail(b->err, b->cap, "LLVM target %s: %s", b->triple, msg ? msg : "?");
    LLVMDisposeMessage(msg);
    return;
  }
  LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, b->triple, ind_host_cpu, ind_host_features,
                                                    LLVMCodeGenLevelAggressive, LLVMRelocPIC, LLVMCodeModelSmall);
  LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
  /* The kernels are explicit vector loops already: promote the accumulator and counter
   * slots, clean up, hoist the per-row address arithmetic out of the column loops and
   * number values. default<O3> gave the same kernel speed (softmax 1.49 vs 1.61 ms, within
   * noise) at 6x the compile time (MLP step: 370 vs 60 ms), its loop and vectorizer
   * passes finding nothing left to do. instcombine runs without its fixpoint check:
   * LLVM 19 aborts the process (report_fatal_error) when one iteration leaves something
   * to combine, which a gathered kernel's index arithmetic did. */
  LLVMErrorRef e = LLVMRunPasses(b->c.mod, "function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,loop-mssa(licm),gvn,instcombine<no-verify-fixpoint>,simplifycfg)", tm, po);
  LLVMDisposePassBuilderOptions(po);
  if (e) b->ok = (llvm_error(e, "LLVM passes", b->err, b->cap), false);
  if (b->ok && LLVMTargetMachineEmitToMemoryBuffer(tm, b->c.mod, LLVMObjectFile, &msg, &b->obj)) {
    b->ok = ir_fail(b->err, b->cap, "LLVM code generation: %s", msg ? msg : "?");
    LLVMDisposeMessage(msg);
    b->obj = NULL;
  }
  LLVMDisposeTargetMachine(tm);
}

/* Loads b->obj into the JIT (unless another thread loaded the same module meanwhile) and finds
 * the kernels. The JIT takes the buffer. Guarded, under jit_lock. */
static void load_module(void *arg) {
  build *b = arg;
  module *m = module_find(b->key);
  if (m && jit_find(b->p)) {
    hold(b->p, m);
    return;
  }
  if (n_mods == cap_mods) {
    int c = cap_mods ? 2 * cap_mods : 64;
    module *t = realloc(mods, sizeof *t * (size_t)c);
    if (!t) {
      b->ok = ir_fail(b->err, b->cap, "out of memory");
      return;
    }
    mods = t, cap_mods = c;
  }
  LLVMMemoryBufferRef obj = b->obj;
  b->obj = NULL;
  LLVMOrcResourceTrackerRef rt = LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(jit));
  LLVMErrorRef e = LLVMOrcLLJITAddObjectFileWithRT(jit, rt, obj);
  if (e) {
    b->ok = (llvm_error(e, "LLJIT", b->err, b->cap), false);
    LLVMOrcReleaseResourceTracker(rt);
    return;
  }
  m = &mods[n_mods++];
  memcpy(m->key, b->key, 16);
  m->rt = rt, m->users = 0;
  if (!jit_find(b->p)) {
    b->ok = ir_fail(b->err, b->cap, "LLJIT: the kernels' symbols are missing from their object file");
    return;
  }
  hold(b->p, m);
  evict_modules();
}

/* Runs a step of the JIT's own under jit_lock; false after an exception, which retires the JIT. */
static bool jit_step(void (*fn)(void *), build *b) {
  pthread_mutex_lock(&jit_lock);
  bool ok = jit != NULL;
  if (!ok) snprintf(b->err, b->cap, "%s", jit_error);
  else if (ind_llvm_guard(fn, b, b->err, b->cap) != IND_LLVM_OK) retire_jit(b->err), ok = false;
  pthread_mutex_unlock(&jit_lock);
  return ok;
}

/* Emits every kernel of p into one module, then loads its object code: from the JIT if this
 * process compiled it already, from the disk cache, or by optimising and compiling it, writing
 * the object to the disk cache. When LLVM fails (out of memory included), returns false with
 * the reason; what LLVM was building is leaked then (see the JIT's section). */
static bool ind_build_kernels_impl(ind_program *p, const prim_meta *meta, char *err, size_t cap);

bool ind_build_kernels(ind_program *p, const prim_meta *meta, char *err, size_t cap) {
  if (!RT_PROF_ON()) return ind_build_kernels_impl(p, meta, err, cap);
  uint64_t t0_ = rt_prof_now();
  bool r_ = ind_build_kernels_impl(p, meta, err, cap);
  rt_prof_complete("phase", "LLVM codegen + JIT", t0_, "%d kernels", p->n_kernels);
  return r_;
}

static bool ind_build_kernels_impl(ind_program *p, const prim_meta *meta, char *err, size_t cap) {
  build b = {.p = p, .meta = meta, .err = err, .cap = cap};
  bool intact = ind_llvm_guard(emit_module, &b, err, cap) == IND_LLVM_OK; /* else leak ctx, module */
  bool ok = intact && b.ok;
  if (ok) ok = jit_step(find_kernels, &b);
  if (ok && b.found) {
    cache_stats.memory_hits++;
  } else if (ok) {
    b.cached = cache_read(b.key, &b.cached_size);
    intact = ind_llvm_guard(compile_module, &b, err, cap) == IND_LLVM_OK;
    ok = intact && b.ok;
    if (b.hit) cache_stats.disk_hits++;
    else cache_stats.misses++;
    if (ok && !b.hit) cache_write(b.key, LLVMGetBufferStart(b.obj), LLVMGetBufferSize(b.obj));
    free(b.cached);
  }
  if (intact) {
    LLVMDisposeModule(b.c.mod);
    LLVMOrcDisposeThreadSafeContext(b.tsc);
  }
  if (ok && !b.found) ok = jit_step(load_module, &b) && b.ok;
  if (b.obj && intact) LLVMDisposeMemoryBuffer(b.obj);
  return ok;
}
