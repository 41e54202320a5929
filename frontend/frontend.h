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

#endif /* EMBER_FRONTEND_H */
