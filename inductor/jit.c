/* inductor/jit.c: the JIT (one ORC LLJIT per process), the kernel cache in memory and on disk,
 * and building a program's kernels into one module loaded into the JIT. */
#define _POSIX_C_SOURCE 200809L /* strdup, mkstemp */
#include "internal.h"

#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <llvm-c/blake3.h>
#include <pthread.h>
#include <stdio.h>

int ind_lanes = 8;
char *ind_host_cpu, *ind_host_features;
const char *ind_cpu_name(void) { return ind_host_cpu; }

/* ---- the JIT ---- */

static pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;
static LLVMOrcLLJITRef jit;
static char jit_error[256];
static bool jit_tried;

bool ind_jit_get(char *err, size_t cap) {
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
        ind_host_cpu = LLVMGetHostCPUName();
        ind_host_features = LLVMGetHostCPUFeatures();
        if (ind_host_features && strstr(ind_host_features, "+avx512f,") && !getenv("EMBER_NO_AVX512")) LANES = 16;
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

/* The object of the cache entry at path for key, checked (header, key, size, checksum); NULL when
 * absent or damaged. Nothing is allocated before the size is checked against the file's. */
static LLVMMemoryBufferRef cache_read_path(const char *path, const uint8_t key[16]) {
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
  LLVMMemoryBufferRef buf = ok ? LLVMCreateMemoryBufferWithMemoryRangeCopy(data, h.size, "ember_cached") : NULL;
  free(data);
  return buf;
}

static LLVMMemoryBufferRef cache_read(const uint8_t key[16]) {
  if (!ind_cache_dir()) return NULL;
  char path[1200];
  cache_path(key, path, sizeof path);
  return cache_read_path(path, key);
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
  LLVMMemoryBufferRef obj = cache_read_path(path, key);
  if (!obj) return false;
  bool ok = ind_elf_defines(LLVMGetBufferStart(obj), LLVMGetBufferSize(obj), n, names);
  LLVMDisposeMemoryBuffer(obj);
  return ok;
}

static _Thread_local ind_cache_stats cache_stats;
ind_cache_stats ind_cache_counters(void) { return cache_stats; }

static void llvm_error(LLVMErrorRef e, const char *what, char *err, size_t cap) {
  char *m = LLVMGetErrorMessage(e);
  ir_fail(err, cap, "%s: %s", what, m);
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

/* Emits every kernel of p into one module, then loads its object code: from the JIT if this
 * process compiled it already, from the disk cache, or by optimising (default<O3> with the host's
 * target machine) and compiling it, writing the object to the disk cache. */
bool ind_build_kernels(ind_program *p, const prim_meta *meta, char *err, size_t cap) {
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
    ok = p->kernels[k].row ? ind_emit_row_kernel(&c, g, meta, p->kind, &p->kernels[k], err, cap)
                           : ind_emit_kernel(&c, g, meta, p->kind, &p->kernels[k], err, cap);
  LLVMDisposeBuilder(c.b);
  LLVMMemoryBufferRef obj = NULL;
  bool found = false;
  if (ok) {
    char *text = LLVMPrintModuleToString(c.mod);
    llvm_blake3_hasher h;
    llvm_blake3_hasher_init(&h);
    llvm_blake3_hasher_update(&h, text, strlen(text) + 1);
    char salt[256];
    int n = snprintf(salt, sizeof salt, "%s|%s|%d|%d", LLVM_VERSION_STRING, ind_host_cpu, LANES, CACHE_FORMAT);
    llvm_blake3_hasher_update(&h, salt, (size_t)n);
    llvm_blake3_hasher_update(&h, ind_host_features, strlen(ind_host_features));
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
    if (!found && (obj = cache_read(key)) && !program_defined_by(obj, p)) {
      LLVMDisposeMemoryBuffer(obj); /* compiled again below, and the entry replaced */
      obj = NULL;
      cache_stats.bad_entries++;
    }
    if (found) {
      cache_stats.memory_hits++;
    } else if (obj) {
      cache_stats.disk_hits++;
    } else {
      cache_stats.misses++;
      LLVMTargetRef target;
      char *msg = NULL;
      if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
        ok = ir_fail(err, cap, "LLVM target %s: %s", triple, msg ? msg : "?");
        LLVMDisposeMessage(msg);
      } else {
        LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, ind_host_cpu, ind_host_features, LLVMCodeGenLevelAggressive,
                                                          LLVMRelocPIC, LLVMCodeModelSmall);
        LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
        /* The kernels are explicit vector loops already: promote the accumulator and counter
         * slots, clean up, hoist the per-row address arithmetic out of the column loops and
         * number values. default<O3> gave the same kernel speed (softmax 1.49 vs 1.61 ms, within
         * noise) at 6x the compile time (MLP step: 370 vs 60 ms), its loop and vectorizer
         * passes finding nothing left to do. instcombine runs without its fixpoint check:
         * LLVM 19 aborts the process (report_fatal_error) when one iteration leaves something
         * to combine, which a gathered kernel's index arithmetic did. */
        LLVMErrorRef e = LLVMRunPasses(c.mod, "function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,loop-mssa(licm),gvn,instcombine<no-verify-fixpoint>,simplifycfg)", tm, po);
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
  return ok;
}
