/* fuzz/fuzz_ir.c: the IR text parser (ir_parse, the format EMBER_LOGS and repro dirs write) and
 * then the verifier, as em_debug_check_repro and ember_minify read graph.ir, on arbitrary text;
 * a graph that verifies must print and run through the graph passes' cloning. */
#include "fuzz_common.h"

#include <string.h>

#include "../ir/graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  char err[512];
  ir_graph *g = ir_parse(text, err, sizeof err);
  if (g && ir_verify(g, 0, err, sizeof err)) {
    char *printed = ir_print(g, true);
    ir_graph *c = ir_graph_clone(g);
    free(printed);
    ir_graph_free(c);
  }
  ir_graph_free(g);
  free(text);
  fz_end();
  return 0;
}
