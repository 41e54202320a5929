/* inductor/cuda_codegen.c: the CUDA C renderer of a schedule's kernels.
 *
 * A graph whose inputs are on the GPU is scheduled as on the CPU (schedule.c), with pointwise
 * kernels only: reductions, GEMMs, indexing and copies run as steps through the eager CUDA
 * kernels and cuBLAS. Each pointwise kernel becomes one CUDA C kernel over the elements of its
 * iteration shape (a grid-stride loop): every input read through its own strides (0 for a
 * broadcast; dense ones at the element's linear index), every node's value from its prim's
 * scalar expression in the prim table (prims.def), rendered by the same renderer as the eager
 * CUDA kernels (runtime/cuda_kernels.c), every output stored contiguous. Where the layout allows,
 * the same source also holds a vector variant (<name>_v<W>: 16-byte loads and stores of W
 * elements a thread; vector_width), which the launcher takes for 16-byte aligned buffers (run.c).
 * Indices are 32-bit where every element index fits. A graph's kernels compile together, those
 * no cache holds on several threads (runtime/cuda.c: cu_source_modules). A kernel's name is a
 * hash of its text, so the CUDA kernel caches (memory and disk) find it again. Kernels compile
 * with NVRTC for the device's architecture, or on the emulator (EMBER_CUDA_EMULATE=1) with the
 * host's C++ compiler; tests/test_cuda_eager.c compares them with the eager kernels. */
#include "internal.h"
#include "../runtime/cuda.h"

#include <stdio.h>

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h;
}

/* How input m is read over iteration shape t: dense (at the element's linear index), a broadcast
 * scalar (element 0), or neither (through its strides). */
static void input_layout(const ir_type *t, const int64_t *cont, const prim_meta *m, bool *dense, bool *scalar) {
  *dense = *scalar = true;
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] != 1) *dense = *dense && m->strides[d] == cont[d], *scalar = *scalar && m->strides[d] == 0;
}

/* The value's name in the kernel's text. */
static void vname(int v, char *buf, size_t cap) { snprintf(buf, cap, "v%d", v); }

/* The dtypes a generated kernel reads and writes: floating point and bool (integer arithmetic
 * stays with the eager kernels, which refuse integer division by zero as the CPU does). f16 and
 * bf16 compute in f32, each op's result rounded to its dtype as the eager kernels store it, so
 * the fused chain gives eager's bits (torch.compile keeps f32 between ops instead, unless
 * emulate_precision_casts). */
static bool kernel_dtype(em_dtype dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16 || dt == EM_BOOL; }

/* Renders node nd as `const auto v<out> = ...;` (with its scalar expression's temporaries) at
 * indent; the views a kernel holds (detach, broadcasts of per-row values, reshapes of them) are
 * the operand's value. */
static bool render_node(ir_sbuf *b, ir_sbuf *helpers, const ir_graph *g, const ir_node *nd, const char *indent,
                        uint32_t *done, char *err, size_t cap) {
  const int *o = ir_operands(g, nd);
  char out[48], arg[3][48];
  vname(nd->out, out, sizeof out);
  if (prim_get(nd->op)->flags & P_VIEW) {
    vname(o[0], arg[0], sizeof arg[0]);
    ir_sb_printf(b, "%sconst auto %s = %s;\n", indent, out, arg[0]);
    return true;
  }
  if (nd->n_in > 3) return ir_fail(err, cap, "%s with %d operands", prim_get(nd->op)->name, nd->n_in);
  em_dtype args[3];
  const char *names[3];
  for (int a = 0; a < nd->n_in; a++) {
    args[a] = cu_compute_dtype(g->values[o[a]].type.dtype);
    vname(o[a], arg[a], sizeof arg[a]);
    names[a] = arg[a];
  }
  prim_sexpr x;
  em_dtype compute = args[nd->op == EM_PRIM_WHERE ? 1 : 0];
  if (!prim_scalar_expr(nd->op, args, compute, cu_compute_dtype(g->values[nd->out].type.dtype), &x))
    return ir_fail(err, cap, "%s has no scalar expression", prim_get(nd->op)->name);
  cu_render_helpers(helpers, &x, done);
  char prefix[64], r[80];
  snprintf(prefix, sizeof prefix, "%s_", out);
  if (!cu_render_expr(b, &x, names, prefix, indent, r, sizeof r))
    return ir_fail(err, cap, "the CUDA renderer has no %s over %s", prim_get(nd->op)->name, em_dtype_name(compute));
  em_dtype odt = g->values[nd->out].type.dtype;
  if (odt == EM_F16 || odt == EM_BF16) /* rounded as eager rounds each op's result, then computed on in f32 */
    ir_sb_printf(b, "%sconst float %s = em_ld(em_to<%s>(%s));\n", indent, out, cu_ctype(odt), r);
  else ir_sb_printf(b, "%sconst auto %s = %s;\n", indent, out, r);
  return true;
}

bool ind_cuda_renders(const ir_graph *g, const ir_node *n) {
  if (!(prim_get(n->op)->flags & P_POINTWISE) || !ir_type_concrete(&g->values[n->out].type) || n->n_in > 3) return false;
  const int *o = ir_operands(g, n);
  em_dtype args[3];
  static const char *const names[3] = {"a", "b", "c"};
  if (!kernel_dtype(g->values[n->out].type.dtype)) return false;
  for (int a = 0; a < n->n_in; a++) {
    if (!kernel_dtype(g->values[o[a]].type.dtype)) return false;
    args[a] = cu_compute_dtype(g->values[o[a]].type.dtype);
  }
  prim_sexpr x;
  if (!prim_scalar_expr(n->op, args, args[n->op == EM_PRIM_WHERE ? 1 : 0], cu_compute_dtype(g->values[n->out].type.dtype), &x))
    return false;
  ir_sbuf b = {0};
  char r[80];
  bool ok = cu_render_expr(&b, &x, names, "t_", "", r, sizeof r);
  free(ir_sb_finish(&b));
  return ok;
}

/* The width of pointwise kernel k's vector variant, 0 for none. The variant reads and stores
 * 16-byte chunks (4 f32, 8 f16 / bf16, 2 f64: 16 bytes of the narrowest floating-point operand;
 * wider ones take several, bools W bytes), each thread W consecutive elements of the innermost dim that moves (its extent a
 * multiple of W, so a chunk never crosses a row). Every input is dense, a broadcast scalar, or
 * moves along that dim with stride 1 (its other strides multiples of W, so every chunk starts
 * W-aligned) or 0 (one value for the chunk). The launcher takes it where every buffer is
 * 16-byte aligned (run.c), else the scalar variant. */
static int vector_width(const ir_graph *g, const prim_meta *meta, const kernel *k) {
  const ir_type *t = &k->shape;
  int inner = -1, minsize = 16;
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] != 1) inner = d;
  if (inner < 0 || k->row || k->has_col || k->n_in + k->n_out > 130) return 0; /* run.c launches up to 130 buffers */
  for (int i = 0; i < k->n_out + k->n_in; i++) { /* bools (comparisons' results) take the width of the floats */
    em_dtype dt = g->values[i < k->n_out ? k->out[i] : k->in[i - k->n_out]].type.dtype;
    int sz = dt == EM_BOOL ? 16 : (int)em_dtype_size(dt);
    if (sz < minsize) minsize = sz;
  }
  int w = 16 / minsize;
  if (w < 2 || t->sizes[inner] % w) return 0;
  int64_t cont[EM_MAX_DIMS];
  ir_contiguous_strides(t->ndim, t->sizes, cont);
  for (int i = 0; i < k->n_in; i++) {
    const prim_meta *m = &meta[k->in[i]];
    bool dense, scalar;
    input_layout(t, cont, m, &dense, &scalar);
    if (dense || scalar || m->strides[inner] == 0) continue;
    if (m->strides[inner] != 1) return 0;
    for (int d = 0; d < t->ndim; d++)
      if (t->sizes[d] != 1 && d != inner && m->strides[d] % w) return 0;
  }
  return w;
}

/* Sizes as arguments (ind_options.sizes_as_args, a dynamic entry's graphs): the sizes and
 * strides a pointwise kernel's index arithmetic uses are read from a table passed by value
 * (`const em_ktab<N> K`, after n) instead of written into the text, so the same graph at another
 * size renders the same source, whose name (a hash of the text) finds the module the CUDA kernel
 * caches hold instead of compiling it again with NVRTC. As on the CPU (codegen.c: kint), 0 and 1
 * stay literals: the code's shape depends on them. The scalar and vector variants append to one
 * table, which both take. Row kernels keep their sizes literal: their structure (columns a
 * thread keeps in registers, the block) follows from the row length. */
typedef struct ktab {
  bool on;
  int base; /* the variant being rendered numbers its entries from here */
  int n, cap;
  int64_t *v;
  bool oom;
} ktab;

enum { KTAB_MAX = 128 }; /* 1 KiB of parameters: past it, literals */

/* Writes number v of the index arithmetic: K.v[i] (a new entry) or the literal. */
static void knum(ir_sbuf *b, ktab *t, int64_t v) {
  if (!t || !t->on || v == 0 || v == 1 || t->n == KTAB_MAX) {
    ir_sb_printf(b, "%lld", (long long)v);
    return;
  }
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 16;
    int64_t *nv = realloc(t->v, sizeof(int64_t) * (size_t)cap);
    if (!nv) {
      t->oom = true;
      ir_sb_printf(b, "%lld", (long long)v);
      return;
    }
    t->v = nv, t->cap = cap;
  }
  t->v[t->n] = v;
  ir_sb_printf(b, "K.v[%d]", t->n++ - t->base);
}

/* Renders kernel k as the parameter list and body of a kernel (after its name) into b: the
 * scalar variant (vec 0: a thread an element), or the vector variant of width vec (a thread a
 * chunk of vec elements, its size parameter the number of chunks; vector_width). */
static bool render_body(ir_sbuf *b, ir_sbuf *helpers, const ir_graph *g, const prim_meta *meta, const kernel *k, int vec,
                        ktab *tab, bool fits32, char *err, size_t cap);

static bool render_kernel(ir_sbuf *b, ir_sbuf *helpers, const ir_graph *g, const prim_meta *meta, const kernel *k, int vec,
                          ktab *tab, char *err, size_t cap) {
  const ir_type *t = &k->shape;
  int64_t n = numel_of(t), cont[EM_MAX_DIMS];
  ir_contiguous_strides(t->ndim, t->sizes, cont);
  bool fits32 = n < ((int64_t)1 << 31);
  for (int i = 0; i < k->n_out + k->n_in; i++) {
    int v = i < k->n_out ? k->out[i] : k->in[i - k->n_out];
    em_dtype dt = g->values[v].type.dtype;
    if (!kernel_dtype(dt)) return ir_fail(err, cap, "CUDA kernel over %s values", em_dtype_name(dt));
    const char *T = cu_ctype(dt);
    ir_sb_printf(b, "%s%s%s *__restrict__ %s%d", i ? ", " : "(", i < k->n_out ? "" : "const ", T,
                 i < k->n_out ? "o" : "x", i < k->n_out ? i : i - k->n_out);
  }
  /* the body goes to its own buffer first: the table's length, known after it, is in the
   * parameter list */
  ir_sbuf body = {0};
  int tab0 = tab ? tab->n : 0;
  if (tab) tab->base = tab0;
  bool ok = render_body(&body, helpers, g, meta, k, vec, tab, fits32, err, cap);
  char *bt = ir_sb_finish(&body);
  if (ok && (!bt || (tab && tab->oom))) ok = ir_fail(err, cap, "out of memory");
  /* a variant's table: its own entries, [tab0, tab->n) */
  if (ok && tab && tab->n > tab0) ir_sb_printf(b, ", i64 n, const em_ktab<%d> K) {\n%s", tab->n - tab0, bt);
  else if (ok) ir_sb_printf(b, ", i64 n) {\n%s", bt);
  free(bt);
  return ok;
}

/* The statements of kernel k's body (render_kernel), after its parameter list; with tab, the
 * sizes and strides numbered from the variant's first entry. */
static bool render_body(ir_sbuf *b, ir_sbuf *helpers, const ir_graph *g, const prim_meta *meta, const kernel *k, int vec,
                        ktab *tab, bool fits32, char *err, size_t cap) {
  const ir_type *t = &k->shape;
  int64_t cont[EM_MAX_DIMS];
  ir_contiguous_strides(t->ndim, t->sizes, cont);
  /* 32-bit indexing where every element index fits (32-bit division is several times cheaper);
   * i + the grid's stride stays below 2^32 then */
  if (fits32)
    ir_sb_printf(b, "  for (unsigned q = blockIdx.x * blockDim.x + threadIdx.x; q < (unsigned)n; q += gridDim.x * blockDim.x) {\n");
  else ir_sb_printf(b, "  EM_GRID_LOOP(q, n) {\n");
  if (vec) ir_sb_printf(b, "    const %s i = q * %d;\n", fits32 ? "unsigned" : "i64", vec);
  else ir_sb_printf(b, "    const %s i = q;\n", fits32 ? "unsigned" : "i64");
  /* the element's coordinates along the dims some strided input (neither dense nor a broadcast
   * scalar) moves along */
  bool used[EM_MAX_DIMS] = {false};
  int lowest = t->ndim;
  for (int i = 0; i < k->n_in; i++) {
    bool dense, scalar;
    const prim_meta *m = &meta[k->in[i]];
    input_layout(t, cont, m, &dense, &scalar);
    for (int d = 0; !dense && !scalar && d < t->ndim; d++)
      if (t->sizes[d] != 1 && m->strides[d]) used[d] = true, lowest = d < lowest ? d : lowest;
  }
  if (lowest < t->ndim) {
    const char *I = fits32 ? "unsigned" : "i64";
    ir_sb_printf(b, "    %s r = (%s)i;\n", I, I);
    for (int d = t->ndim - 1; d >= lowest; d--) {
      if (t->sizes[d] == 1) continue;
      if (used[d]) ir_sb_printf(b, "    const i64 c%d = (i64)(r %% ", d), knum(b, tab, t->sizes[d]), ir_sb_printf(b, ");\n");
      if (d > lowest) ir_sb_printf(b, "    r /= "), knum(b, tab, t->sizes[d]), ir_sb_printf(b, ";\n");
    }
  }
  char nm[48];
  bool lane[130] = {false}; /* vector variant: input i read as a chunk, a value a lane */
  for (int i = 0; i < k->n_in; i++) {
    int v = k->in[i];
    const prim_meta *m = &meta[v];
    em_dtype dt = g->values[v].type.dtype;
    const char *C = cu_ctype(cu_compute_dtype(dt));
    bool dense, scalar;
    input_layout(t, cont, m, &dense, &scalar);
    ir_sbuf off = {0};
    if (dense) ir_sb_printf(&off, "i");
    else if (scalar) ir_sb_printf(&off, "0");
    else {
      bool first = true;
      for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] != 1 && m->strides[d]) {
          ir_sb_printf(&off, "%sc%d * ", first ? "" : " + ", d);
          knum(&off, tab, m->strides[d]);
          first = false;
        }
      if (first) ir_sb_printf(&off, "0");
    }
    char *o = ir_sb_finish(&off);
    if (!o) return ir_fail(err, cap, "out of memory");
    int inner = t->ndim - 1;
    while (inner > 0 && t->sizes[inner] == 1) inner--;
    vname(v, nm, sizeof nm);
    if (vec && i < 130 && (dense || (!scalar && m->strides[inner] == 1))) {
      lane[i] = true;
      ir_sb_printf(b, "    const em_vec<%s, %d> x%dv = *(const em_vec<%s, %d> *)(x%d + %s);\n", cu_ctype(dt), vec, i, cu_ctype(dt), vec, i, o);
    } else {
      ir_sb_printf(b, "    const %s %s = (%s)em_ld(x%d[%s]);\n", C, nm, C, i, o);
    }
    free(o);
  }
  const char *ind = "    ";
  if (vec) {
    for (int i = 0; i < k->n_out; i++)
      ir_sb_printf(b, "    em_vec<%s, %d> o%dv;\n", cu_ctype(g->values[k->out[i]].type.dtype), vec, i);
    ir_sb_printf(b, "#pragma unroll\n    for (int e = 0; e < %d; e++) {\n", vec);
    ind = "      ";
    for (int i = 0; i < k->n_in; i++) {
      if (!lane[i]) continue;
      const char *C = cu_ctype(cu_compute_dtype(g->values[k->in[i]].type.dtype));
      vname(k->in[i], nm, sizeof nm);
      ir_sb_printf(b, "      const %s %s = (%s)em_ld(x%dv.v[e]);\n", C, nm, C, i);
    }
  }
  uint32_t done = 0;
  for (int e = 0; e < k->n_nodes; e++)
    if (!render_node(b, helpers, g, &g->nodes[k->nodes[e]], ind, &done, err, cap)) return false;
  for (int i = 0; i < k->n_out; i++) {
    vname(k->out[i], nm, sizeof nm);
    ir_sb_printf(b, "%so%d%s = em_to<%s>(%s);\n", ind, i, vec ? "v.v[e]" : "[i]", cu_ctype(g->values[k->out[i]].type.dtype), nm);
  }
  if (vec) {
    ir_sb_printf(b, "    }\n");
    for (int i = 0; i < k->n_out; i++) {
      const char *T = cu_ctype(g->values[k->out[i]].type.dtype);
      ir_sb_printf(b, "    *(em_vec<%s, %d> *)(o%d + i) = o%dv;\n", T, vec, i, i);
    }
  }
  ir_sb_printf(b, "  }\n}\n");
  return true;
}

/* The block-wide reduction of a row kernel, for op ("sum", "max", "min"): every thread's partial
 * combined, the result in every thread. Full warps combine with shuffles (a butterfly, then lane
 * 0's value to all lanes, so every thread holds the same bits), the warps' results in a fixed
 * order through shared memory; blocks under a warp (the emulator's) with a tree in shared
 * memory. max and min propagate NaN, as the eager reductions do. */
static void render_block_reduce(ir_sbuf *h, const char *op) {
  const char *comb = !strcmp(op, "sum") ? "a + b" : !strcmp(op, "max") ? "a != a || a > b ? a : b" : "a != a || a < b ? a : b";
  /* guarded: a program's output_code (every kernel's source, one after another) stays one
   * translation unit that compiles, as the tests compile it with NVRTC */
  ir_sb_printf(h, "#ifndef EM_BLOCK_%s\n#define EM_BLOCK_%s\n", op, op);
  ir_sb_printf(h, "__device__ __forceinline__ float em_r%s(float a, float b) { return %s; }\n", op, comb);
  ir_sb_printf(h,
      "__device__ float em_block_%s(float v, float *sh) {\n"
      "  if (blockDim.x >= 32) {\n"
      "    for (int o = 16; o > 0; o >>= 1) v = em_r%s(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
      "    v = __shfl_sync(0xffffffffu, v, 0);\n"
      "    const unsigned nw = blockDim.x >> 5;\n"
      "    if (nw == 1) return v;\n"
      "    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
      "    __syncthreads();\n"
      "    v = sh[0];\n"
      "    for (unsigned w = 1; w < nw; w++) v = em_r%s(v, sh[w]);\n"
      "    __syncthreads();\n"
      "    return v;\n"
      "  }\n"
      "  sh[threadIdx.x] = v;\n"
      "  __syncthreads();\n"
      "  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {\n"
      "    if (threadIdx.x < s) sh[threadIdx.x] = em_r%s(sh[threadIdx.x], sh[threadIdx.x + s]);\n"
      "    __syncthreads();\n"
      "  }\n"
      "  v = sh[0];\n"
      "  __syncthreads();\n"
      "  return v;\n"
      "}\n#endif\n", op, op, op, op);
}

static const char *reduce_name(em_prim op) { return op == EM_PRIM_SUM ? "sum" : op == EM_PRIM_AMAX ? "max" : "min"; }

/* What rendering one row kernel needs (render_row_kernel). */
typedef struct rowgen {
  ir_sbuf *b, *helpers;
  const ir_graph *g;
  const kernel *k;
  const signed char *kind; /* [n_values] kinds of the kernel's values, 0 outside it */
  const int *avail;        /* [n_values] the pass from which a value can be computed */
  const int *red_pass;     /* [n_values] the pass a reduction accumulates in, else -1 */
  const bool *full;        /* [n_bufs] a FULL buffer (else per row) */
  const int64_t *inner;    /* [n_bufs] a FULL buffer's stride along the row */
  bool *need;              /* [2][passes + 1][n_values] FULL values and inputs a pass reads, persistent
                            * (reading kept values) and not (recomputing them) */
  const int *first;        /* [n_values] the first pass that reads it, else -1 */
  const bool *kept;        /* [n_values] a persistent kernel keeps it in registers for a later pass */
  int passes, ept;
  uint32_t done;
  int64_t chunk; /* a split kernel (k->parts): columns a part */
} rowgen;

/* Loads FULL input i, or reads FULL value v from the registers that keep it. */
static void row_input(rowgen *r, int i, int pass, bool persistent, const char *ind) {
  const kernel *k = r->k;
  int bi = k->n_out + i, v = k->in[i], nv = r->g->n_values;
  if (!r->full[bi] || !r->need[((size_t)!persistent * (size_t)(r->passes + 1) + (size_t)pass) * (size_t)nv + (size_t)v]) return;
  em_dtype ct = cu_compute_dtype(r->g->values[v].type.dtype);
  char nm[48];
  vname(v, nm, sizeof nm);
  if (persistent && r->kept[v] && r->first[v] < pass) {
    ir_sb_printf(r->b, "%sconst %s %s = k%d[t];\n", ind, cu_ctype(ct), nm, v);
    return;
  }
  ir_sb_printf(r->b, "%sconst %s %s = (%s)em_ld(x%d[rb%d", ind, cu_ctype(ct), nm, cu_ctype(ct), i, bi);
  if (r->inner[bi]) ir_sb_printf(r->b, " + (i64)j * %lld", (long long)r->inner[bi]);
  ir_sb_printf(r->b, "]);\n");
  if (persistent && r->kept[v]) ir_sb_printf(r->b, "%sk%d[t] = %s;\n", ind, v, nm);
}

/* One row's passes. Persistent: each thread holds ept columns of the row (j = threadIdx.x + t *
 * blockDim.x), and the FULL values a later pass reads stay in registers (k<v>[t]); otherwise
 * every pass recomputes them from the inputs. */
static bool row_passes(rowgen *r, bool persistent, const char *ind) {
  const ir_graph *g = r->g;
  const kernel *k = r->k;
  int nv = g->n_values;
  char nm[48], ind2[32];
  snprintf(ind2, sizeof ind2, "%s%s", ind, persistent ? "    " : "  ");
  if (persistent)
    for (int v = 0; v < nv; v++)
      if (r->kept[v]) ir_sb_printf(r->b, "%s%s k%d[%d];\n", ind, cu_ctype(cu_compute_dtype(g->values[v].type.dtype)), v, r->ept);
  for (int pass = 0; pass <= r->passes; pass++) {
    for (int i = 0; i < k->n_nodes; i++) { /* per-row values ready at this pass */
      const ir_node *n = &g->nodes[k->nodes[i]];
      if (r->kind[n->out] == K_ROW && r->avail[n->out] == pass && r->red_pass[n->out] < 0 &&
          !render_node(r->b, r->helpers, g, n, ind, &r->done, NULL, 0))
        return false;
    }
    if (pass == r->passes) break;
    const bool *need = r->need + ((size_t)!persistent * (size_t)(r->passes + 1) + (size_t)pass) * (size_t)nv;
    for (int i = 0; i < k->n_nodes; i++) {
      const ir_node *n = &g->nodes[k->nodes[i]];
      if (r->red_pass[n->out] == pass)
        ir_sb_printf(r->b, "%sfloat a%d = %s;\n", ind, n->out,
                     n->op == EM_PRIM_SUM ? "0.0f" : n->op == EM_PRIM_AMAX ? "-__int_as_float(0x7f800000)" : "__int_as_float(0x7f800000)");
    }
    if (persistent)
      ir_sb_printf(r->b, "%s#pragma unroll\n%sfor (int t = 0; t < %d; t++) {\n%s  const int j = threadIdx.x + t * blockDim.x;\n"
                   "%s  if (j < %lld) {\n", ind, ind, r->ept, ind, ind, (long long)k->cols);
    else if (k->parts)
      ir_sb_printf(r->b, "%sconst i64 em_end = em_part * %lld + %lld < %lld ? em_part * %lld + %lld : %lld;\n"
                   "%sfor (i64 j = em_part * %lld + threadIdx.x; j < em_end; j += blockDim.x) {\n", ind,
                   (long long)r->chunk, (long long)r->chunk, (long long)k->cols, (long long)r->chunk, (long long)r->chunk,
                   (long long)k->cols, ind, (long long)r->chunk);
    else ir_sb_printf(r->b, "%sfor (int j = threadIdx.x; j < %lld; j += blockDim.x) {\n", ind, (long long)k->cols);
    for (int i = 0; i < k->n_in; i++) row_input(r, i, pass, persistent, ind2);
    for (int i = 0; i < k->n_nodes; i++) {
      const ir_node *n = &g->nodes[k->nodes[i]];
      int v = n->out;
      if (r->kind[v] == K_FULL && need[v]) {
        if (persistent && r->kept[v] && r->first[v] < pass) {
          vname(v, nm, sizeof nm);
          ir_sb_printf(r->b, "%sconst auto %s = k%d[t];\n", ind2, nm, v);
          continue;
        }
        if (!render_node(r->b, r->helpers, g, n, ind2, &r->done, NULL, 0)) return false;
        vname(v, nm, sizeof nm);
        if (persistent && r->kept[v]) ir_sb_printf(r->b, "%sk%d[t] = %s;\n", ind2, v, nm);
      } else if (r->red_pass[v] == pass) {
        vname(ir_operands(g, n)[0], nm, sizeof nm);
        ir_sb_printf(r->b, "%sa%d = em_r%s(a%d, %s);\n", ind2, v, reduce_name(n->op), v, nm);
      }
    }
    for (int o = 0; o < k->n_out; o++) {
      int v = k->out[o];
      if (r->kind[v] != K_FULL || r->avail[v] != pass) continue;
      vname(v, nm, sizeof nm);
      ir_sb_printf(r->b, "%so%d[rb%d + j] = em_to<%s>(%s);\n", ind2, o, o, cu_ctype(g->values[v].type.dtype), nm);
    }
    ir_sb_printf(r->b, persistent ? "%s  }\n%s}\n" : "%s}\n", ind, ind);
    for (int i = 0; i < k->n_nodes; i++) {
      const ir_node *n = &g->nodes[k->nodes[i]];
      if (r->red_pass[n->out] != pass) continue;
      vname(n->out, nm, sizeof nm);
      ir_sb_printf(r->b, "%sconst float %s = em_block_%s(a%d, em_sh);\n", ind, nm, reduce_name(n->op), n->out);
    }
  }
  for (int o = 0; o < k->n_out; o++) {
    if (r->kind[k->out[o]] == K_FULL) continue;
    vname(k->out[o], nm, sizeof nm);
    ir_sb_printf(r->b, "%sif (threadIdx.x == 0) o%d[%s] = em_to<%s>(%s);\n", ind, o, k->parts ? "rr" : "r",
                 cu_ctype(g->values[k->out[o]].type.dtype), nm);
  }
  return true;
}

/* Renders row kernel k (schedule.c: an iteration shape S whose dims [split, ndim) are reduced;
 * FULL values over S, ROW values one per row): one block per row, rows strided over the grid, a
 * block's threads strided over the row's columns. The kernel runs in passes, as the CPU's row
 * kernels do: pass p accumulates the reductions whose operands are ready after p earlier
 * reductions, then combines them across the block (render_block_reduce); per-row values are
 * computed by every thread, stored by thread 0. When the row fits in the block's registers (at
 * most 8 columns a thread: rows up to 2048), the kernel is persistent: it reads each input once
 * and keeps the FULL values a later pass reads in registers (softmax, layer_norm and their
 * backward read their row once); when the launch has fewer threads than planned (the emulator's
 * blocks) or the row is longer, each pass recomputes those values from the inputs (the GPU's
 * caches hold the row). FULL inputs are read at their row's offset plus j times their inner
 * stride (the schedule admits only those whose reduced dims coalesce), per-row inputs at row r's
 * element, outputs stored contiguous. */
static bool render_row_kernel(ir_sbuf *b, ir_sbuf *helpers, const ir_graph *g, const prim_meta *meta,
                              const signed char *kind_all, kernel *k, char *err, size_t cap) {
  const ir_type *S = &k->shape;
  int nb = k->n_out + k->n_in, nv = g->n_values;
  k->rows = prefix_numel(S, k->split), k->cols = k->rows ? numel_of(S) / k->rows : 0;
  k->n_elems = k->rows; /* k->block: the caller's choice */
  int64_t ept = (k->cols + k->block - 1) / k->block;
  signed char *kind = calloc((size_t)nv + 1, 1);
  int *avail = calloc((size_t)nv + 1, sizeof(int)), *red_pass = malloc(sizeof(int) * ((size_t)nv + 1));
  int *first = malloc(sizeof(int) * ((size_t)nv + 1));
  bool *full = calloc((size_t)nb + 1, sizeof(bool)), *kept = calloc((size_t)nv + 1, sizeof(bool)), *need = NULL;
  int64_t *inner = calloc((size_t)nb + 1, sizeof(int64_t));
  int64_t (*outer)[EM_MAX_DIMS] = calloc((size_t)nb + 1, sizeof *outer);
  bool ok = kind && avail && red_pass && first && full && kept && inner && outer;
  int passes = 0;
  bool have_op[3] = {false};
  for (int i = 0; ok && i < k->n_nodes; i++) kind[g->nodes[k->nodes[i]].out] = kind_all[g->nodes[k->nodes[i]].out];
  for (int v = 0; ok && v < nv; v++) red_pass[v] = first[v] = -1;
  /* passes: a reduction runs in the pass after its operands' */
  for (int i = 0; ok && i < k->n_nodes; i++) {
    const ir_node *n = &g->nodes[k->nodes[i]];
    int a = 0;
    for (int o = 0; o < n->n_in; o++) a = avail[ir_operands(g, n)[o]] > a ? avail[ir_operands(g, n)[o]] : a;
    if (trailing_reduction(g, n) >= 0) {
      red_pass[n->out] = a, avail[n->out] = a + 1;
      if (a + 1 > passes) passes = a + 1;
      have_op[n->op == EM_PRIM_SUM ? 0 : n->op == EM_PRIM_AMAX ? 1 : 2] = true;
    } else {
      avail[n->out] = a;
      if (kind[n->out] == K_FULL && a + 1 > passes) passes = a + 1;
    }
  }
  /* a split kernel (k->parts, asked for by ind_cuda_build_kernels): one pass whose outputs are
   * all f32 reductions, so that a part's partial results fold into the row's */
  for (int o = 0; ok && k->parts && o < k->n_out; o++)
    if (passes != 1 || red_pass[k->out[o]] != 0 || g->values[k->out[o]].type.dtype != EM_F32) k->parts = 0;
  /* what each pass reads: its reductions' operands and the FULL outputs it stores, and the FULL
   * values and inputs they are computed from; a value a later pass reads again is kept (in a
   * persistent kernel: the later pass reads the registers, not what it was computed from) */
  if (ok) ok = (need = calloc(2 * (size_t)(passes + 1) * ((size_t)nv + 1), sizeof(bool))) != NULL;
  for (int persistent = 1; ok && persistent >= 0; persistent--) {
    for (int pass = 0; pass < passes; pass++) {
      bool *nd = need + ((size_t)(1 - persistent) * (size_t)(passes + 1) + (size_t)pass) * (size_t)nv;
      for (int i = 0; i < k->n_nodes; i++) {
        const ir_node *n = &g->nodes[k->nodes[i]];
        if (red_pass[n->out] == pass) nd[ir_operands(g, n)[0]] = true;
      }
      for (int o = 0; o < k->n_out; o++) nd[k->out[o]] |= kind[k->out[o]] == K_FULL && avail[k->out[o]] == pass;
      for (int i = k->n_nodes - 1; i >= 0; i--) {
        const ir_node *n = &g->nodes[k->nodes[i]];
        if (!nd[n->out] || kind[n->out] != K_FULL) continue;
        if (persistent && first[n->out] >= 0 && first[n->out] < pass) {
          kept[n->out] = true;
          continue;
        }
        for (int o = 0; o < n->n_in; o++) nd[ir_operands(g, n)[o]] = true;
      }
      for (int v = 0; persistent && v < nv; v++) {
        if (!nd[v]) continue;
        if (first[v] < 0) first[v] = pass;
        else if (first[v] < pass && !kind[v]) kept[v] = true; /* an input read again */
      }
    }
  }
  if (!ok) ir_fail(err, cap, "out of memory");
  /* buffers: FULL ones at a row offset plus j * inner, per-row ones at the row's element */
  for (int bi = 0; ok && bi < nb; bi++) {
    int v = bi < k->n_out ? k->out[bi] : k->in[bi - k->n_out];
    em_dtype dt = g->values[v].type.dtype;
    if (!kernel_dtype(dt)) ok = ir_fail(err, cap, "CUDA kernel over %s values", em_dtype_name(dt));
    full[bi] = ind_row_buffer(g, meta, kind, k, bi, outer[bi], &inner[bi]);
  }
  for (int i = 0; ok && i < 3; i++)
    if (have_op[i]) render_block_reduce(helpers, i == 0 ? "sum" : i == 1 ? "max" : "min");
  char nm[48];
  for (int i = 0; ok && i < nb; i++) {
    int v = i < k->n_out ? k->out[i] : k->in[i - k->n_out];
    ir_sb_printf(b, "%s%s%s *__restrict__ %s%d", i ? ", " : "(", i < k->n_out ? "" : "const ",
                 cu_ctype(g->values[v].type.dtype), i < k->n_out ? "o" : "x", i < k->n_out ? i : i - k->n_out);
  }
  if (ok) {
    /* the block reductions' scratch; a row kernel without one (the backward of a softmax whose
     * row sums are inputs) declares none: NVRTC warns of an unused variable */
    ir_sb_printf(b, ", i64 rows) {\n%s", have_op[0] || have_op[1] || have_op[2] ? "  __shared__ float em_sh[32];\n" : "");
    if (k->parts) /* block rr: part rr %% parts of row rr / parts */
      ir_sb_printf(b, "  for (i64 rr = blockIdx.x; rr < rows * %d; rr += gridDim.x) {\n    const i64 r = rr / %d, em_part = rr %% %d;\n    (void)r;\n",
                   k->parts, k->parts, k->parts);
    else ir_sb_printf(b, "  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {\n");
    /* the row's coordinates, and each FULL buffer's offset from them */
    int first_dim = -1;
    for (int d = 0; d < k->split && first_dim < 0; d++)
      if (S->sizes[d] != 1) first_dim = d;
    if (first_dim >= 0) ir_sb_printf(b, "    i64 q = r;\n");
    for (int d = k->split - 1; d >= 0; d--) {
      if (S->sizes[d] == 1) continue;
      if (d == first_dim) ir_sb_printf(b, "    const i64 c%d = q;\n", d);
      else ir_sb_printf(b, "    const i64 c%d = q %% %lld;\n    q /= %lld;\n", d, (long long)S->sizes[d], (long long)S->sizes[d]);
    }
    for (int bi = 0; bi < nb; bi++) {
      if (!full[bi]) continue;
      ir_sb_printf(b, "    const i64 rb%d = 0", bi);
      for (int d = 0; d < k->split; d++)
        if (S->sizes[d] != 1 && outer[bi][d]) ir_sb_printf(b, " + c%d * %lld", d, (long long)outer[bi][d]);
      ir_sb_printf(b, ";\n");
    }
    for (int i = 0; i < k->n_in; i++) { /* per-row inputs: row r is element r in row-major order */
      int bi = k->n_out + i, v = k->in[i];
      if (full[bi]) continue;
      const prim_meta *m = &meta[v];
      em_dtype ct = cu_compute_dtype(g->values[v].type.dtype);
      vname(v, nm, sizeof nm);
      ir_sb_printf(b, "    const %s %s = (%s)em_ld(x%d[0", cu_ctype(ct), nm, cu_ctype(ct), i);
      int64_t div = 1;
      for (int d = m->ndim - 1; d >= 0; d--) {
        if (m->sizes[d] == 1) continue;
        if (m->strides[d]) ir_sb_printf(b, " + r / %lld %% %lld * %lld", (long long)div, (long long)m->sizes[d], (long long)m->strides[d]);
        div *= m->sizes[d];
      }
      ir_sb_printf(b, "]);\n");
    }
    rowgen r = {b, helpers, g, k, kind, avail, red_pass, full, inner, need, first, kept, passes, (int)ept, 0,
                k->parts ? (k->cols + k->parts - 1) / k->parts : 0};
    bool any_kept = false;
    for (int v = 0; v < nv; v++) any_kept |= kept[v];
    /* not for empty rows (ept 0): "blockDim.x * 0 >= 0" is an NVRTC warning, and a warning fails
     * the compile (an amax over an empty extent ran op by op on an H200) */
    if (any_kept && ept >= 1 && ept <= 8 && !k->parts) {
      ir_sb_printf(b, "    if (blockDim.x * %d >= %lld) {\n", (int)ept, (long long)k->cols);
      ok = row_passes(&r, true, "      ");
      ir_sb_printf(b, "    } else {\n");
      ok = ok && row_passes(&r, false, "      ");
      ir_sb_printf(b, "    }\n");
    } else {
      ok = row_passes(&r, false, "    ");
    }
    if (!ok) ir_fail(err, cap, "a node of row kernel %s has no CUDA rendering", k->name);
  }
  if (ok) ir_sb_printf(b, "  }\n}\n");
  free(kind), free(avail), free(red_pass), free(first), free(full), free(kept), free(need), free(inner), free(outer);
  return ok;
}

/* The second kernel of a split row kernel: row r's result folds its parts' partial results in
 * order 0, 1, ..., parts - 1, one thread a row, so the sum is the same on every run (no atomics,
 * no order that depends on which block finishes first). */
static char *render_combine(const ir_graph *g, const kernel *k, char *name, size_t name_cap) {
  ir_sbuf b = {0};
  for (int o = 0; o < k->n_out; o++) ir_sb_printf(&b, "%sfloat *__restrict__ o%d", o ? ", " : "(", o);
  for (int o = 0; o < k->n_out; o++) ir_sb_printf(&b, ", const float *__restrict__ q%d", o);
  ir_sb_printf(&b, ", i64 rows) {\n  for (i64 r = blockIdx.x * (i64)blockDim.x + threadIdx.x; r < rows; "
               "r += (i64)gridDim.x * blockDim.x) {\n");
  for (int o = 0; o < k->n_out; o++) {
    em_prim op = EM_PRIM_SUM;
    for (int i = 0; i < k->n_nodes; i++)
      if (g->nodes[k->nodes[i]].out == k->out[o]) op = g->nodes[k->nodes[i]].op;
    const char *comb = op == EM_PRIM_SUM ? "a + b" : op == EM_PRIM_AMAX ? "a != a || a > b ? a : b" : "a != a || a < b ? a : b";
    ir_sb_printf(&b, "    {\n      float a = q%d[r * %d];\n      for (int c = 1; c < %d; c++) {\n"
                 "        const float b = q%d[r * %d + c];\n        a = %s;\n      }\n      o%d[r] = a;\n    }\n",
                 o, k->parts, k->parts, o, k->parts, comb, o);
  }
  ir_sb_printf(&b, "  }\n}\n");
  char *bt = ir_sb_finish(&b);
  if (!bt) return NULL;
  snprintf(name, name_cap, "em_ind_c%015llx", (unsigned long long)(fnv1a(bt, strlen(bt)) >> 4));
  size_t len = strlen(bt) + 64;
  char *src = malloc(len);
  if (src) snprintf(src, len, "extern \"C\" __global__ void %s%s", name, bt);
  free(bt);
  return src;
}

/* Renders kernel k for its launch configuration (k->block) as one CUDA C source (*src, the
 * caller frees): its scalar kernel, named after the text (k->name), and its vector variant
 * (vname, "" for none). */
static bool kernel_source(ind_program *p, const prim_meta *meta, kernel *k, char **src, char *vname_, size_t vcap,
                          char *err, size_t cap) {
  ir_sbuf body = {0}, helpers = {0}, vbody = {0};
  *src = NULL, vname_[0] = 0;
  k->vec = k->row ? 0 : vector_width(p->g, meta, k);
  if (k->vec) /* the vector variant's chunk: aligned to its bytes, at most 16 (the widest load) */
    ir_sb_printf(&helpers, "#ifndef EM_VEC_DEFINED\n#define EM_VEC_DEFINED\n"
                 "template <typename T, int W> struct alignas(sizeof(T) * W < 16 ? sizeof(T) * W : 16) em_vec { T v[W]; };\n"
                 "#endif\n");
  ktab tab = {.on = p->opts.sizes_as_args && !k->row};
  if (tab.on) /* the table of sizes, passed by value */
    ir_sb_printf(&helpers, "#ifndef EM_KTAB_DEFINED\n#define EM_KTAB_DEFINED\ntemplate <int N> struct em_ktab { i64 v[N]; };\n#endif\n");
  bool ok = k->row ? render_row_kernel(&body, &helpers, p->g, meta, p->kind, k, err, cap)
                   : render_kernel(&body, &helpers, p->g, meta, k, 0, &tab, err, cap);
  int scalar_entries = tab.n;
  /* the vector variant's helpers go in once: each render emits the one-line helpers its
   * expressions use (em_fmod_py, ...), and a second copy in the same source does not compile */
  ir_sbuf vhelpers = {0};
  if (ok && k->vec) ok = render_kernel(&vbody, &vhelpers, p->g, meta, k, k->vec, &tab, err, cap);
  free(k->table);
  k->table = tab.v, k->n_table = tab.n, k->vtab = scalar_entries;
  char *vh = ir_sb_finish(&vhelpers);
  for (const char *line = vh; line && *line;) {
    const char *nl = strchr(line, '\n');
    size_t n = nl ? (size_t)(nl - line) + 1 : strlen(line);
    char *one = strndup(line, n);
    bool seen = false;
    for (const char *at = helpers.s; one && at && !seen && (at = strstr(at, one)) != NULL; at++)
      seen = at == helpers.s || at[-1] == '\n';
    if (!one) helpers.oom = true;
    else if (!seen) ir_sb_printf(&helpers, "%s", one);
    free(one);
    line += n;
  }
  free(vh);
  char *bt = ir_sb_finish(&body), *ht = ir_sb_finish(&helpers), *vt = ir_sb_finish(&vbody);
  if (ok && (!bt || !ht || (k->vec && !vt))) ok = ir_fail(err, cap, "out of memory");
  if (ok) {
    uint64_t h = fnv1a(bt, strlen(bt)) ^ (fnv1a(ht, strlen(ht)) * 31) ^ (vt ? fnv1a(vt, strlen(vt)) * 131 : 0);
    snprintf(k->name, sizeof k->name, "em_ind_%016llx", (unsigned long long)h);
    if (k->vec) snprintf(vname_, vcap, "%s_v%d", k->name, k->vec);
    size_t len = strlen(ht) + strlen(bt) + (vt ? strlen(vt) : 0) + 160;
    char *s = malloc(len);
    if (!s) ok = ir_fail(err, cap, "out of memory");
    else if (!k->vec) snprintf(s, len, "%sextern \"C\" __global__ void %s%s", ht, k->name, bt);
    else snprintf(s, len, "%sextern \"C\" __global__ void %s%sextern \"C\" __global__ void %s%s", ht, k->name, bt, vname_, vt);
    *src = s;
  }
  if (!k->row) k->n_elems = numel_of(&k->shape), k->rows = 1, k->cols = k->n_elems;
  free(bt), free(ht), free(vt);
  return ok;
}

/* Appends kernel source src (and comb, a split row kernel's fold, or NULL) to p's output_code
 * (EMBER_LOGS=output_code prints the CUDA C). output_code stays one translation unit that
 * compiles (the tests give it to NVRTC): a one-line helper (cu_render_helpers) an earlier kernel
 * defined is left out; the block reductions' are guarded (render_block_reduce). */
static void log_source(ind_program *p, const char *src, const char *comb) {
  ir_sbuf all = {0};
  if (p->ir_text) ir_sb_printf(&all, "%s", p->ir_text);
  const char *body_at = strstr(src, "extern \"C\" __global__");
  for (const char *line = src; body_at && line < body_at;) {
    const char *nl = strchr(line, '\n');
    size_t n = nl ? (size_t)(nl - line) + 1 : strlen(line);
    char *one = strncmp(line, "__device__ __forceinline__", 26) || !p->ir_text ? NULL : strndup(line, n);
    bool seen = false;
    for (const char *at = p->ir_text; one && !seen && (at = strstr(at, one)); at++)
      seen = at == p->ir_text || at[-1] == '\n';
    free(one);
    if (!seen) ir_sb_printf(&all, "%.*s", (int)n, line);
    line += n;
  }
  ir_sb_printf(&all, "%s\n", body_at ? body_at : src);
  if (comb) ir_sb_printf(&all, "%s\n", comb);
  free(p->ir_text);
  p->ir_text = ir_sb_finish(&all);
}

/* A split row kernel's fold (render_combine), loaded into k->cu_combine; *comb receives its
 * source for the log (the caller frees). Nothing for an unsplit kernel. */
static bool build_combine(ind_program *p, kernel *k, char **comb, char *err, size_t cap) {
  *comb = NULL;
  if (!k->parts) return true;
  if (!(*comb = render_combine(p->g, k, k->combine_name, sizeof k->combine_name))) return ir_fail(err, cap, "out of memory");
  return (k->cu_combine = cu_source_kernel(*comb, k->combine_name, err, cap)) != NULL;
}

/* Renders kernel k (kernel_source), loads it into k->cu_fn (and k->cu_vec, k->cu_combine) and
 * logs it. */
static bool build_kernel(ind_program *p, const prim_meta *meta, kernel *k, char *err, size_t cap) {
  char *src, vname_[40], *comb = NULL;
  bool ok = kernel_source(p, meta, k, &src, vname_, sizeof vname_, err, cap);
  if (ok) {
    const char *names[2] = {k->name, vname_};
    void *fns[2] = {NULL, NULL};
    ok = cu_source_kernels(src, names, k->vec ? 2 : 1, fns, err, cap) && build_combine(p, k, &comb, err, cap);
    k->cu_fn = fns[0], k->cu_vec = fns[1];
    if (ok) log_source(p, src, comb);
  }
  free(src), free(comb);
  return ok;
}

/* ---- max-autotune ----
 * Each kernel's candidate launch configurations are timed on its first run (ind_cuda_autotune,
 * from run.c), on the program's real inputs, writing scratch outputs, and the fastest is kept
 * and written to the disk cache (next to the CUDA kernel cache, keyed by the default
 * configuration's kernel, the device's name and architecture), so a later compile of the same
 * kernel on the same device takes the choice without timing. Pointwise kernels: 128 to 1024
 * threads a block (one compiled kernel: the grid-stride loop takes any), each with the scalar
 * variant and, where the kernel has one and the buffers are 16-byte aligned, the vector
 * variant (a thread a 16-byte chunk; vector_width), so the choice of width is timed too. Row
 * kernels: half, once and twice the heuristic block (each its own kernel: how many columns a
 * thread keeps in registers follows from it). */
struct ind_tune {
  int n;
  void *fn[8];
  unsigned block[8];
  bool vec[8]; /* the vector variant (its size parameter: chunks, not elements) */
  char key[32];
};

/* A tuning choice on disk: "block B" (older entries: the launcher picks the variant by
 * alignment) or "block B scalar" (the scalar variant timed faster than the vector one). */
typedef struct tune_choice {
  unsigned block;
  bool scalar;
} tune_choice;

static _Thread_local ind_autotune_stats tune_stats;
ind_autotune_stats ind_autotune_stats_get(void) { return tune_stats; }

static unsigned long long tune_salt; /* tests: a fresh set of cache entries (ind_autotune_salt) */
void ind_autotune_salt(unsigned long long salt) { tune_salt = salt; }

static bool tune_path(const char *key, char *path, size_t cap) {
  const char *dir = ind_cache_dir();
  em_cuda_device_properties pr;
  if (!dir || !em_cuda_get_device_properties(0, &pr)) return em_clear_error(), false;
  for (char *c = pr.name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) *c = '_';
  snprintf(path, cap, "%s/cuda/tune-%s-%s-%s", dir, key, pr.name, cu_arch());
  if (tune_salt) snprintf(path + strlen(path), cap - strlen(path), "-%llx", tune_salt);
  return true;
}

static tune_choice tune_read(const char *key) {
  char path[1200], word[16] = "";
  int64_t size;
  FILE *f = tune_path(key, path, sizeof path) ? rt_cache_open(path, &size) : NULL;
  tune_choice c = {0, false};
  int got = f ? fscanf(f, "block %u %15s", &c.block, word) : 0;
  if (got < 1 || c.block < 1 || c.block > 1024 || (c.block & (c.block - 1))) c.block = 0;
  c.scalar = got == 2 && !strcmp(word, "scalar");
  if (f) fclose(f);
  return c;
}

static void tune_write(const char *key, tune_choice c) {
  char path[1200], text[48];
  if (!tune_path(key, path, sizeof path)) return;
  int n = snprintf(text, sizeof text, "block %u%s\n", c.block, c.scalar ? " scalar" : "");
  rt_write_file_whole(path, text, (size_t)n, "", 0); /* best effort: a lost choice is timed again */
}

/* Split reductions: a row kernel over fewer rows than the device has SMs, each row at least
 * 8192 columns long, would leave most SMs idle (a block a row); it is split into parts of at
 * least 4096 columns, about two blocks an SM in all, whose partial results a second kernel
 * folds in a fixed order (render_combine). The emulator plans for an H100's 132 SMs, so that it
 * runs the schedule the GPU would. The row kernel keeps the split only when it can
 * (render_row_kernel: one pass, f32 reductions as its only outputs). Not under max-autotune,
 * whose timing runs the one kernel. */
static int split_parts(const ind_program *p, const kernel *k) {
  if (!k->row || p->opts.autotune || k->cols < 8192 || k->rows < 1 || k->n_out > 32) return 0;
  int sms = 132;
  em_cuda_device_properties pr;
  if (!cu_drv()->emulated) {
    if (!em_cuda_get_device_properties(0, &pr)) return em_clear_error(), 0;
    sms = pr.multiprocessors;
  }
  if (k->rows >= sms) return 0;
  int64_t parts = 2 * sms / k->rows, most = k->cols / 4096;
  if (parts > most) parts = most;
  return parts >= 2 ? (int)parts : 0;
}

/* Row kernels' heuristic block: a power of two (the tree halves it) from 32 to 256, about 4
 * columns a thread. */
static unsigned row_block(const kernel *k) {
  unsigned b = 32;
  while (b < 256 && (int64_t)b * 4 < k->cols) b *= 2;
  return b;
}

/* Renders every kernel, then compiles those no cache holds on several threads (cuda.c:
 * cu_source_modules) and loads them in order. */
static bool build_all(ind_program *p, const prim_meta *meta, char *err, size_t cap) {
  int n = p->n_kernels;
  char **src = calloc((size_t)n + 1, sizeof *src), (*vn)[40] = calloc((size_t)n + 1, sizeof *vn);
  cu_module_req *req = calloc((size_t)n + 1, sizeof *req);
  bool ok = src && vn && req;
  if (!ok) ir_fail(err, cap, "out of memory");
  for (int ki = 0; ok && ki < n; ki++) {
    kernel *k = &p->kernels[ki];
    if (k->has_col) ok = ir_fail(err, cap, "a CUDA schedule with a column reduction");
    if (k->row) k->rows = prefix_numel(&k->shape, k->split), k->cols = k->rows ? numel_of(&k->shape) / k->rows : 0;
    k->block = k->row ? row_block(k) : 256;
    k->parts = split_parts(p, k);
    if (k->parts) k->block = 256; /* 4096 columns or more a block */
    ok = ok && kernel_source(p, meta, k, &src[ki], vn[ki], sizeof vn[ki], err, cap);
    if (ok) req[ki] = (cu_module_req){src[ki], {k->name, vn[ki]}, k->vec ? 2 : 1, {NULL, NULL}};
  }
  ok = ok && cu_source_modules(req, n, err, cap);
  for (int ki = 0; ok && ki < n; ki++) {
    kernel *k = &p->kernels[ki];
    char *comb = NULL;
    k->cu_fn = req[ki].fns[0], k->cu_vec = req[ki].fns[1];
    ok = build_combine(p, k, &comb, err, cap);
    if (ok) log_source(p, src[ki], comb);
    free(comb);
  }
  for (int ki = 0; src && ki < n; ki++) free(src[ki]);
  free(src), free(vn), free(req);
  return ok;
}

bool ind_cuda_build_kernels(ind_program *p, const prim_meta *meta, char *err, size_t cap) {
  if (!build_all(p, meta, err, cap)) return false;
  for (int ki = 0; ki < p->n_kernels; ki++) {
    kernel *k = &p->kernels[ki];
    if (!p->opts.autotune) continue;
    char key[32];
    snprintf(key, sizeof key, "%s", k->name);
    unsigned dflt = k->block;
    tune_choice chosen = tune_read(key);
    if (chosen.block) { /* timed before, on this device */
      tune_stats.cached++;
      k->block = chosen.block;
      if (chosen.scalar) k->cu_vec = NULL;
      if (k->row && chosen.block != dflt && !build_kernel(p, meta, k, err, cap)) return false;
      continue;
    }
    struct ind_tune *t = calloc(1, sizeof *t);
    if (!t) return ir_fail(err, cap, "out of memory");
    snprintf(t->key, sizeof t->key, "%s", key);
    void *dfn = k->cu_fn;
    char dname[32];
    snprintf(dname, sizeof dname, "%s", k->name);
    static const unsigned pw[4] = {128, 256, 512, 1024};
    for (int v = 0; v < 2 && !k->row; v++)
      for (int c = 0; c < 4 && (v == 0 || k->cu_vec); c++)
        t->fn[t->n] = v ? k->cu_vec : dfn, t->vec[t->n] = v, t->block[t->n++] = pw[c];
    for (int c = 0; c < 3 && k->row; c++) {
      unsigned b = c == 0 ? dflt / 2 : c == 1 ? dflt : dflt * 2;
      if (b < 32 || b > 1024) continue;
      k->block = b;
      if (b != dflt && !build_kernel(p, meta, k, err, cap)) return free(t), false;
      t->fn[t->n] = b == dflt ? dfn : k->cu_fn, t->block[t->n++] = b;
    }
    k->cu_fn = dfn, k->block = dflt; /* until timed */
    snprintf(k->name, sizeof k->name, "%s", dname);
    k->tune = t;
  }
  return true;
}

void ind_cuda_tune_free(kernel *k) { free(k->tune), k->tune = NULL; }

bool ind_cuda_autotune(kernel *k, const ir_graph *g, char **bufs, em_site site) {
  struct ind_tune *t = k->tune;
  int nb = k->n_out + k->n_in;
  em_tensor *scratch[64] = {0};
  uint64_t ptr[131];
  void *params[133];
  int64_t n = k->n_elems;
  bool ok = nb <= 130 && k->n_out <= 64;
  for (int o = 0; ok && o < k->n_out; o++) { /* the outputs may be stored into inputs: time into scratch */
    const ir_type *ty = &g->values[k->out[o]].type;
    int64_t e = numel_of(ty) ? numel_of(ty) : 1;
    ok = (scratch[o] = rt_new_device(ty->dtype, 1, &e, EM_CUDA, "em_call", site)) != NULL;
    if (ok) ptr[o] = (uint64_t)(uintptr_t)rt_data(scratch[o]);
  }
  for (int q = k->n_out; ok && q < nb; q++) ptr[q] = (uint64_t)(uintptr_t)bufs[q];
  bool aligned = true; /* the vector candidates need every buffer 16-byte aligned, as run.c's launch does */
  for (int q = 0; q < nb && q < 130; q++) params[q] = &ptr[q], aligned = aligned && ptr[q] % 16 == 0;
  int64_t nv = k->vec ? n / k->vec : n, arg = n;
  params[nb < 130 ? nb : 130] = &arg;
  params[(nb < 130 ? nb : 130) + 1] = NULL;
  const cu_driver *d = cu_drv();
  cu_event ev[2] = {NULL, NULL};
  cu_enter();
  ok = ok && !d->event_create(&ev[0], 0) && !d->event_create(&ev[1], 0);
  float best = 0;
  int pick = 0;
  char why[256] = "";
  for (int c = 0; ok && c < t->n; c++) {
    if (t->vec[c] && !aligned) continue;
    arg = t->vec[c] ? nv : n;
    /* sizes_as_args: the variant's table of sizes (kernel_source), by value after n */
    if (t->vec[c] ? k->n_table > k->vtab : k->vtab > 0) params[(nb < 130 ? nb : 130) + 1] = t->vec[c] ? k->table + k->vtab : k->table;
    int64_t threads = k->row ? n * t->block[c] : arg;
    tune_stats.candidates++;
    ok = cu_launch(t->fn[c], threads, t->block[c], params, why, sizeof why); /* warm up */
    ok = ok && !d->event_record(ev[0], cu_current_stream());
    for (int r = 0; ok && r < 5; r++) ok = cu_launch(t->fn[c], threads, t->block[c], params, why, sizeof why);
    ok = ok && !d->event_record(ev[1], cu_current_stream()) && !d->event_sync(ev[1]);
    float ms = 0;
    ok = ok && !d->event_elapsed(&ms, ev[0], ev[1]);
    if (ok && (c == 0 || ms < best)) best = ms, pick = c;
  }
  for (int e = 0; e < 2; e++)
    if (ev[e]) d->event_destroy(ev[e]);
  for (int o = 0; o < k->n_out && o < 64; o++) em_release(scratch[o]);
  if (!ok) return rt_error(site, "em_call", "autotuning kernel %s: %s", k->name, why[0] ? why : "out of memory"), false;
  k->block = t->block[pick];
  if (!t->vec[pick]) k->cu_fn = t->fn[pick];
  /* the scalar variant won although the vector one ran: keep to it (unaligned calls take it anyway) */
  bool scalar = k->cu_vec && aligned && !t->vec[pick];
  if (scalar) k->cu_vec = NULL;
  tune_write(t->key, (tune_choice){k->block, scalar});
  tune_stats.tuned++;
  ind_cuda_tune_free(k);
  return true;
}

/* ---- GEMMs through cuBLASLt: fused epilogues, and under max-autotune a timed algorithm ----
 * A GEMM step's algorithm is chosen at its first run: up to 8 of the heuristic's candidates are
 * timed on the step's real operands (runtime/cuda.c: cu_lt_matmul) and the fastest kept, with
 * the workspace it asks for, in the program and in the autotune cache beside the kernels'
 * choices, keyed by a hash of the problem's description (cu_lt_describe: shape, layouts,
 * alignments, epilogue, cuBLASLt version) and the device. A later program with the same problem
 * on the same device finds the choice there and times nothing. */

static bool tune_read_algo(const char *key, cu_lt_algo *algo, size_t *workspace) {
  char path[1200];
  int64_t size;
  FILE *f = tune_path(key, path, sizeof path) ? rt_cache_open(path, &size) : NULL;
  if (!f) return false;
  unsigned long long w[8], ws;
  bool ok = fscanf(f, "algo %llx %llx %llx %llx %llx %llx %llx %llx workspace %llu", &w[0], &w[1], &w[2], &w[3], &w[4],
                   &w[5], &w[6], &w[7], &ws) == 9;
  fclose(f);
  for (int i = 0; ok && i < 8; i++) algo->data[i] = w[i];
  if (ok) *workspace = (size_t)ws;
  return ok;
}

static void tune_write_algo(const char *key, const cu_lt_algo *algo, size_t workspace) {
  char path[1200], text[256];
  if (!tune_path(key, path, sizeof path)) return;
  int n = snprintf(text, sizeof text, "algo");
  for (int i = 0; i < 8; i++)
    n += snprintf(text + n, sizeof text - (size_t)n, " %llx", (unsigned long long)algo->data[i]);
  n += snprintf(text + n, sizeof text - (size_t)n, " workspace %llu\n", (unsigned long long)workspace);
  rt_write_file_whole(path, text, (size_t)n, "", 0); /* best effort: a lost choice is timed again */
}

em_tensor *ind_cuda_gemm(const ind_program *p, int s, em_tensor *a, em_tensor *b, em_tensor *bias, int epi,
                         bool *fallback, em_site site) {
  *fallback = false;
  cu_gemm G;
  int r = cu_gemm_prepare(&G, a, b, bias, (cu_epilogue)epi, "em_call", site);
  if (r) return *fallback = r == 1, NULL;
  ind_gemm_choice *c = &p->gemm[s];
  cu_lt_choice ch = {0};
  char desc[512], key[40], why[256] = "";
  if (p->opts.autotune) {
    cu_lt_describe(&G.pr, desc, sizeof desc);
    snprintf(key, sizeof key, "gemm_%016llx", (unsigned long long)fnv1a(desc, strlen(desc)));
    if (strcmp(key, c->key)) { /* a problem met first now: cached on disk, or to be timed */
      snprintf(c->key, sizeof c->key, "%s", key);
      c->held = tune_read_algo(key, &c->algo, &c->workspace);
      if (c->held) tune_stats.gemms_cached++;
    }
    ch.given = c->held, ch.algo = c->algo, ch.workspace = c->workspace, ch.tune = !c->held;
  }
  r = cu_lt_matmul(&G.pr, &ch, why, sizeof why);
  if (r && ch.given) { /* a choice from another run that this library no longer takes: choose again */
    c->held = ch.given = false, ch.tune = true;
    r = cu_lt_matmul(&G.pr, &ch, why, sizeof why);
  }
  cu_gemm_release(&G);
  if (r) {
    em_release(G.out);
    if (r == 1) return *fallback = true, NULL;
    return rt_error(site, "em_call", "%s", why);
  }
  if (p->opts.autotune && !c->held && ch.timed) { /* timed now (not while capturing a CUDA graph) */
    c->held = true, c->algo = ch.algo, c->workspace = ch.workspace;
    tune_write_algo(key, &ch.algo, ch.workspace);
    tune_stats.gemms_tuned++;
  }
  return G.out;
}
