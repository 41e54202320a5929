/* fuzz/fuzz_ir.c: the IR text parser (ir_parse, the format EMBER_LOGS and repro dirs write) and
 * then the verifier, as em_debug_check_repro and ember_minify read graph.ir, on arbitrary text;
 * a graph that verifies must print, run through the graph passes' cloning, and round-trip: its
 * printed text parses to a graph that verifies and prints the same (the format promises
 * bit-exact doubles; a repro directory is only as good as this). */
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
    ir_graph *again = printed ? ir_parse(printed, err, sizeof err) : NULL;
    if (printed && !again) fprintf(stderr, "fuzz: printed graph does not parse: %s\n%s", err, printed), abort();
    if (again && !ir_verify(again, 0, err, sizeof err))
      fprintf(stderr, "fuzz: printed graph does not verify: %s\n%s", err, printed), abort();
    char *reprinted = again ? ir_print(again, true) : NULL;
    if (reprinted && strcmp(printed, reprinted))
      fprintf(stderr, "fuzz: print differs after a round trip:\n%s---\n%s", printed, reprinted), abort();
    free(reprinted);
    ir_graph_free(again);
    free(printed);
    ir_graph_free(c);
  }
  ir_graph_free(g);
  free(text);
  fz_end();
  return 0;
}
