/* aot_autograd/aot.h: ahead-of-time autograd: the joint forward/backward graph, its partition
 * into a forward and a backward graph (default, or min-cut rematerialization), and running
 * them: the forward now, the backward later as the grad_fn of the outputs.
 *
 * The joint graph is made by tracing, not by a second implementation of differentiation: the
 * forward graph is interpreted under the tracer on proxy primals, then the autograd engine
 * runs on proxy tangents (rt_grad), and every vjp rule's ops land in the same graph. The
 * result has inputs (primals..., tangents...) and outputs (forward outputs..., gradients of
 * the primals that have one). */
#ifndef EMBER_AOT_H
#define EMBER_AOT_H

#include "../runtime/rt.h"
#include "../ir/graph.h"
#include "../inductor/inductor.h"

typedef struct aot_joint_info {
  int n_primals;        /* joint inputs [0, n_primals) are the forward graph's inputs */
  int n_tangents;       /* then one tangent per differentiable forward output */
  int n_fwd_outputs;    /* joint outputs [0, n_fwd_outputs) are the forward outputs */
  int *tangent_of_output; /* [n_fwd_outputs] index of the output's tangent, or -1 */
  int *grad_of_primal;    /* [n_primals] joint output holding its gradient, or -1 */
} aot_joint_info;

void aot_joint_info_free(aot_joint_info *info);

/* The joint graph of fwd when its inputs with in_rg[i] require grad (and grad mode is on).
 * NULL with an error on failure. */
ir_graph *aot_joint_graph(const ir_graph *fwd, const bool *in_rg, aot_joint_info *info, em_site site);

/* MIN_CUT: the fewest bytes saved (partition.c); DEFAULT: every value the backward reads;
 * RECOMPUTE: only the primal inputs (and random draws' counters), the backward recomputing the
 * rest, as activation checkpointing does: nothing saved lacks autograd history, so a backward
 * under create_graph is exact (aot.c: aot_backward). */
typedef enum aot_partitioner { AOT_PARTITION_MIN_CUT, AOT_PARTITION_DEFAULT, AOT_PARTITION_RECOMPUTE } aot_partitioner;

/* A forward graph (inputs: primals; outputs: forward outputs, then saved values) and a backward
 * graph (inputs: saved values, then tangents; outputs: the gradients, in primal order, of the
 * primals that have one). saved[] are joint value ids; saved_bytes counts saved values that are
 * not primals (a primal is alive anyway). */
typedef struct aot_split {
  ir_graph *fwd, *bwd;
  int n_saved;
  int *saved;
  int64_t saved_bytes;
  int n_recomputed;     /* forward nodes the backward recomputes (min-cut) */
} aot_split;

/* Partitions joint (whose random nodes get rng slots = their joint node index). */
bool aot_partition(const ir_graph *joint, const aot_joint_info *info, aot_partitioner p, aot_split *out, char *err,
                   size_t cap);
void aot_split_free(aot_split *s);

/* ---- aot.c: compiled forward/backward pairs ---- */

typedef struct aot_compiled aot_compiled;
/* Joint graph, partition (p), checks. NULL with an error, or with *unsupported set when the
 * graph cannot be split (differentiable outputs of mixed dtypes): run it plainly then. */
aot_compiled *aot_compile(const ir_graph *fwd, const bool *in_rg, aot_partitioner p, const char *name, em_site site);
/* With use_inductor, the forward and backward graphs run as generated kernels (compiled at their
 * first run, for the layouts seen then; the interpreter runs them when that fails or layouts
 * differ later). */
void aot_set_inductor(aot_compiled *a, bool use_inductor, const ind_options *opts);
/* Runs the forward graph; outputs get a grad_fn that runs the backward graph. */
bool aot_run(aot_compiled *a, em_tensor *const *in, int n_in, em_tensor **out, em_site site);
void aot_release(aot_compiled *a);
const aot_split *aot_get_split(const aot_compiled *a);

#endif /* EMBER_AOT_H */
