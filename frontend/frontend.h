/* frontend/frontend.h: the private header of frontend/ (em_compile, guards, graph breaks,
 * explain, logs). */
#ifndef EMBER_FRONTEND_H
#define EMBER_FRONTEND_H

#include "../runtime/rt.h"
#include "../ir/graph.h"

/* ---- log.c: EMBER_LOGS and EMBER_DUMP_DIR ---- */

typedef enum fe_artifact {
  FE_LOG_GRAPH,
  FE_LOG_GUARDS,
  FE_LOG_RECOMPILES,
  FE_LOG_GRAPH_BREAKS,
  FE_LOG_AOT,
  FE_LOG_SCHEDULE,
  FE_LOG_OUTPUT_CODE,
  FE_LOG_PERF,
  FE_LOG_DYNAMIC,
  FE_LOG_FUSION, /* eager fusion (eager_fusion.c): signatures that fell back to op by op */
  FE_LOG_COUNT
} fe_artifact;

/* Whether EMBER_LOGS enables the artifact (read once per process; fe_log_reload re-reads it,
 * for tests). */
bool fe_log_on(fe_artifact a);
void fe_log_reload(void);
/* Writes the message to stderr, each line prefixed with "[ember:<artifact>] ". */
void fe_log(fe_artifact a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Writes g as <dir>/<name>_<n>.txt and .dot when EMBER_DUMP_DIR is set. */
void fe_dump_graph(const ir_graph *g);

/* ---- repro.c: the accuracy checker, repro directories, planted bugs ---- */

enum { FE_PLANT_NONE, FE_PLANT_ADD_TO_SUB, FE_PLANT_CRASH };
/* EMBER_DEBUG_PLANT_BUG (tests only): FE_PLANT_*. */
int fe_planted_bug(void);
/* With add_to_sub planted, turns g's first add into a sub (g is what the inductor compiles). */
void fe_plant(ir_graph *g);
/* Compares got with ref (the outputs of traced run by the backend and by the reference): NULL
 * when they agree, else a new message naming the output, the element and, with inductor, the
 * first node whose value differs and the user's line that made it. exact: bit for bit. */
char *fe_check_accuracy(const char *graph_name, const ir_graph *traced, bool exact, bool inductor, em_tensor *const *in,
                        int n_in, em_tensor *const *got, em_tensor *const *ref);
/* The reference outputs of traced on in (caller-owned, n_outputs of them): the graph as traced,
 * interpreted on the eager kernels without autograd, the RNG state restored after. */
bool fe_reference(const ir_graph *traced, em_tensor *const *in, int n_in, em_tensor **ref, em_site site);
/* EMBER_REPRO_DIR, or NULL. */
const char *fe_repro_root(void);
/* Writes a repro directory for traced on in under EMBER_REPRO_DIR; returns its path (caller
 * frees) or NULL. for_crash: prepared before a run, armed for the crash handler; fe_repro_done
 * removes it when the run finished. */
char *fe_write_repro(const char *name, const ir_graph *traced, em_tensor *const *in, int n_in, const char *backend,
                     const char *partitioner, const char *failure, bool for_crash);
void fe_repro_done(const char *dir);
/* Runs g on in through backend and through the reference; 0 when they agree, 1 when they
 * differ or the backend fails, -1 when the reference fails. report: what happened. */
int fe_check_graph(const ir_graph *g, em_tensor *const *in, int n_in, const char *backend, char *report, size_t cap);

/* ---- dynamic.c: symbolic sizes recovered from probe traces (see ember.h, "Dynamic shapes") ----
 *
 * A graph traced at the real sizes (the base) and at the corners of a box of probe sizes (each
 * symbol k at r[k] or r[k] + delta[k]) determines every number in the graph that depends on the
 * sizes as a polynomial linear in each symbol: multilinear interpolation over the corners. The
 * template is the base graph plus one formula per such number (a slot); specializing it writes
 * each formula's value at given symbol values into a copy of the base. A template is only
 * trusted after fe_dyn_check agrees with traces at unrelated sizes. */

enum { FE_DYN_MAX_SYMS = 3 };
typedef struct fe_dyn fe_dyn;

/* The template from corner graphs g[mask] (bit k of mask: symbol k at r[k] + delta[k]; g[0] is
 * the base), or NULL with the reason (naming the node and the user's line) in why: the graphs'
 * structure differs, or a number is not such a polynomial with integer coefficients. */
fe_dyn *fe_dyn_decode(const ir_graph *const *g, int n_syms, const int64_t *r, const int64_t *delta, char *why,
                      size_t cap);
void fe_dyn_free(fe_dyn *d);
int fe_dyn_slots(const fe_dyn *d);
/* A copy of the base with every slot evaluated at syms (caller frees), or NULL with why (a
 * formula out of range there, out of memory). */
ir_graph *fe_dyn_specialize(const fe_dyn *d, const int64_t *syms, char *why, size_t cap);
/* Whether g (traced at symbol values syms) is what the template specializes to there; else
 * false with the first difference in why. */
bool fe_dyn_check(const fe_dyn *d, const ir_graph *g, const int64_t *syms, char *why, size_t cap);
/* "%12 = reshape shape[0] = s0*64  (model.c:41)", one line per slot (at most max lines, then a
 * count), malloc'd. */
char *fe_dyn_describe(const fe_dyn *d, int max);

#endif /* EMBER_FRONTEND_H */
