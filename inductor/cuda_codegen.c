/* inductor/cuda_codegen.c: the CUDA C renderer of a schedule's kernels.
 *
 * A graph whose inputs are on the GPU is scheduled as on the CPU (schedule.c), with pointwise
 * kernels only: reductions, GEMMs, indexing and copies run as steps through the eager CUDA
 * kernels and cuBLAS. Each pointwise kernel becomes one CUDA C kernel over the elements of its
 * iteration shape (a grid-stride loop): every input read through its own strides (0 for a
 * broadcast; dense ones at the element's linear index), every node's value from its prim's
 * scalar expression in the prim table (prims.def), rendered by the same renderer as the eager
 * CUDA kernels (runtime/cuda_kernels.c), every output stored contiguous. A kernel's name is a
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

/* Renders kernel k as the parameter list and body of a kernel (after its name) into b. */
static bool render_kernel(ir_sbuf *b, ir_sbuf *helpers, const ir_graph *g, const prim_meta *meta, const kernel *k,
                          char *err, size_t cap) {
  const ir_type *t = &k->shape;
  int64_t n = numel_of(t), cont[EM_MAX_DIMS];
  ir_contiguous_strides(t->ndim, t->sizes, cont);
  bool fits32 = n < ((int64_t)1 << 31);
  for (int i = 0; i < k->n_out + k->n_in; i++) {
    int v = i < k->n_out ? k->out[i] : k->in[i - k->n_out];
    em_dtype dt = g->values[v].type.dtype;
    if (dt != EM_F32 && dt != EM_BOOL) return ir_fail(err, cap, "CUDA kernel over %s values", em_dtype_name(dt));
    const char *T = cu_ctype(dt);
    ir_sb_printf(b, "%s%s%s *__restrict__ %s%d", i ? ", " : "(", i < k->n_out ? "" : "const ", T,
                 i < k->n_out ? "o" : "x", i < k->n_out ? i : i - k->n_out);
  }
  ir_sb_printf(b, ", i64 n) {\n  EM_GRID_LOOP(i, n) {\n");
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
      if (used[d]) ir_sb_printf(b, "    const i64 c%d = (i64)(r %% %lld);\n", d, (long long)t->sizes[d]);
      if (d > lowest) ir_sb_printf(b, "    r /= %lld;\n", (long long)t->sizes[d]);
    }
  }
  char nm[48], arg[3][48];
  for (int i = 0; i < k->n_in; i++) {
    int v = k->in[i];
    const prim_meta *m = &meta[v];
    em_dtype dt = g->values[v].type.dtype;
    bool dense, scalar;
    input_layout(t, cont, m, &dense, &scalar);
    vname(v, nm, sizeof nm);
    ir_sb_printf(b, "    const %s %s = (%s)em_ld(x%d[", cu_ctype(cu_compute_dtype(dt)), nm, cu_ctype(cu_compute_dtype(dt)), i);
    if (dense) ir_sb_printf(b, "i");
    else if (scalar) ir_sb_printf(b, "0");
    else {
      bool first = true;
      for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] != 1 && m->strides[d]) ir_sb_printf(b, "%sc%d * %lld", first ? "" : " + ", d, (long long)m->strides[d]), first = false;
      if (first) ir_sb_printf(b, "0");
    }
    ir_sb_printf(b, "]);\n");
  }
  uint32_t done = 0;
  for (int e = 0; e < k->n_nodes; e++) {
    const ir_node *nd = &g->nodes[k->nodes[e]];
    const int *o = ir_operands(g, nd);
    char out[48];
    vname(nd->out, out, sizeof out);
    if (nd->op == EM_PRIM_DETACH) {
      vname(o[0], arg[0], sizeof arg[0]);
      ir_sb_printf(b, "    const auto %s = %s;\n", out, arg[0]);
      continue;
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
    cu_render_helpers(helpers, &x, &done);
    char prefix[64], r[80];
    snprintf(prefix, sizeof prefix, "%s_", out);
    if (!cu_render_expr(b, &x, names, prefix, "    ", r, sizeof r))
      return ir_fail(err, cap, "the CUDA renderer has no %s over %s", prim_get(nd->op)->name, em_dtype_name(compute));
    ir_sb_printf(b, "    const auto %s = %s;\n", out, r);
  }
  for (int i = 0; i < k->n_out; i++) {
    vname(k->out[i], nm, sizeof nm);
    ir_sb_printf(b, "    o%d[i] = %s;\n", i, nm);
  }
  ir_sb_printf(b, "  }\n}\n");
  return true;
}

bool ind_cuda_build_kernels(ind_program *p, const prim_meta *meta, char *err, size_t cap) {
  for (int ki = 0; ki < p->n_kernels; ki++) {
    kernel *k = &p->kernels[ki];
    if (k->row || k->has_col) return ir_fail(err, cap, "a CUDA schedule with a reduction kernel");
    ir_sbuf body = {0}, helpers = {0};
    bool ok = render_kernel(&body, &helpers, p->g, meta, k, err, cap);
    char *bt = ir_sb_finish(&body), *ht = ir_sb_finish(&helpers);
    if (ok && (!bt || !ht)) ok = ir_fail(err, cap, "out of memory");
    char *src = NULL;
    if (ok) {
      uint64_t h = fnv1a(bt, strlen(bt)) ^ (fnv1a(ht, strlen(ht)) * 31);
      snprintf(k->name, sizeof k->name, "em_ind_%016llx", (unsigned long long)h);
      size_t len = strlen(ht) + strlen(bt) + 64;
      src = malloc(len);
      if (!src) ok = ir_fail(err, cap, "out of memory");
      else snprintf(src, len, "%sextern \"C\" __global__ void %s%s", ht, k->name, bt);
    }
    if (ok) {
      k->cu_fn = cu_source_kernel(src, k->name, err, cap);
      ok = k->cu_fn != NULL;
      k->n_elems = numel_of(&k->shape);
      k->rows = 1, k->cols = k->n_elems;
      if (ok) { /* EMBER_LOGS=output_code prints the CUDA C */
        ir_sbuf all = {0};
        if (p->ir_text) ir_sb_printf(&all, "%s", p->ir_text);
        ir_sb_printf(&all, "%s\n", src);
        free(p->ir_text);
        p->ir_text = ir_sb_finish(&all);
      }
    }
    free(src), free(bt), free(ht);
    if (!ok) return false;
  }
  return true;
}
