/* inductor/renderer.c: the renderers' tables. The scheduler (schedule.c, rewrite.c) and the
 * compile driver (inductor.c) reach a target only through its ind_renderer (internal.h): what
 * it renders, which reductions and GEMM epilogues its kernels take, and its build entry. A new
 * target is one more table here and its renderer's file. */
#include "internal.h"

/* CPU: a sum, amax or amin that no kernel accumulates for its dtypes runs op by op as well. */
static bool llvm_dtype_eager(const ir_graph *g, const ir_node *n) { return ind_dtype_eager(g, n); }

const ind_renderer ind_llvm_renderer = {
  .name = "llvm",
  .device = EM_CPU,
  .renders = ind_renders,
  .dtype_eager = llvm_dtype_eager,
  .column_reductions = true, /* accumulated per thread over its rows, then summed in a fixed order */
  .row_f64 = true,
  .gemm_epilogues = true,    /* bias, ReLU, GELU (tanh, erf) on each oneDNN sgemm tile (prim_gemm_epilogue) */
  .combo_kernels = true,     /* one prim_parallel over the parts' row or column blocks (run.c: run_combo) */
  .build = ind_build_kernels,
};

const ind_renderer ind_cuda_renderer = {
  .name = "cuda",
  .device = EM_CUDA,
  .renders = ind_cuda_renders,
  .dtype_eager = NULL,       /* integer arithmetic stays with the eager kernels by design */
  .column_reductions = false,/* the eager CUDA reduction kernels run them */
  .row_f64 = false,          /* block reductions accumulate f32 */
  .gemm_epilogues = true,    /* cuBLASLt's bias, bias + ReLU and bias + GELU (tanh) epilogues */
  .combo_kernels = false,    /* a launch per kernel; a combo launch would need one grid over all parts */
  .build = ind_cuda_build_kernels,
};

const ind_renderer *ind_renderer_for(em_device device) {
  return device == EM_CUDA ? &ind_cuda_renderer : &ind_llvm_renderer;
}
