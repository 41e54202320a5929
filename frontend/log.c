/* frontend/log.c: EMBER_LOGS (the analogue of TORCH_LOGS) and EMBER_DUMP_DIR. */
#define _POSIX_C_SOURCE 200809L
#include "frontend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[FE_LOG_COUNT] = {"graph", "guards", "recompiles", "graph_breaks",
                                                "aot", "schedule", "output_code", "perf", "dynamic", "fusion"};
static int enabled = -1; /* bit mask; -1 until read */
static int dump_counter;

void fe_log_reload(void) {
  int mask = 0;
  const char *env = getenv("EMBER_LOGS");
  if (env) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", env);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
      if (!strcmp(tok, "all")) {
        mask = (1 << FE_LOG_COUNT) - 1;
        continue;
      }
      bool known = false;
      for (int i = 0; i < FE_LOG_COUNT; i++)
        if (!strcmp(tok, names[i])) mask |= 1 << i, known = true;
      if (!known)
        fprintf(stderr, "[ember] EMBER_LOGS: unknown artifact '%s' (known: graph, guards, recompiles, "
                        "graph_breaks, aot, schedule, output_code, perf, dynamic, fusion, all)\n", tok);
    }
  }
  __atomic_store_n(&enabled, mask, __ATOMIC_RELAXED);
}

bool fe_log_on(fe_artifact a) {
  int m = __atomic_load_n(&enabled, __ATOMIC_RELAXED);
  if (m < 0) {
    fe_log_reload();
    m = __atomic_load_n(&enabled, __ATOMIC_RELAXED);
  }
  return m & (1 << a);
}

void fe_log(fe_artifact a, const char *fmt, ...) {
  if (!fe_log_on(a)) return;
  char small[1024], *msg = small;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof small) {
    if (!(msg = malloc((size_t)n + 1))) return;
    va_start(ap, fmt);
    vsnprintf(msg, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  /* one fprintf per line keeps lines whole when threads interleave */
  for (char *line = msg; *line;) {
    char *nl = strchr(line, '\n');
    int len = nl ? (int)(nl - line) : (int)strlen(line);
    fprintf(stderr, "[ember:%s] %.*s\n", names[a], len, line);
    line += len + (nl ? 1 : 0);
  }
  if (msg != small) free(msg);
}

void fe_dump_graph(const ir_graph *g) {
  const char *dir = getenv("EMBER_DUMP_DIR");
  if (!dir || !*dir) return;
  int k = __atomic_fetch_add(&dump_counter, 1, __ATOMIC_RELAXED);
  char *text = ir_print(g, true), *dot = ir_to_dot(g);
  const char *ext[2] = {"txt", "dot"};
  char *body[2] = {text, dot};
  for (int i = 0; i < 2; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s_%d.%s", dir, g->name, k, ext[i]);
    FILE *f = body[i] ? fopen(path, "w") : NULL;
    if (!f || fputs(body[i], f) < 0) fprintf(stderr, "[ember] EMBER_DUMP_DIR: cannot write %s\n", path);
    if (f) fclose(f);
  }
  free(text), free(dot);
}
