/* ir/graph.h: the graph IR: SSA values, nodes, symbolic sizes, printer, parser, verifier, passes.
 *
 * A graph is a list of nodes in topological order (each node defines one SSA value from values
 * defined before it), a list of graph inputs and a list of output values. Every
 * node applies one prim (prims/prims.def) with its attributes and carries the user's source site.
 *
 * Layering. ir/types.c sits below prims/ (prims use its dtypes and shapes). The graph half of
 * ir/ sits just above prims/' *table*: it names prims, reads their attribute schemas and calls
 * their meta functions, which are pure functions of dtypes and shapes. It never touches
 * tensors. The one exception is constant folding (passes.c), which runs a pointwise prim's
 * reference kernel on a few elements of stack memory so a folded constant is bit-identical to
 * what eager execution computes; re-deriving every kernel's rounding here would be the worse
 * choice.
 *
 * Sizes are ir_dim: a value >= 0 is a concrete size; a negative value -1-k names entry k of the
 * graph's table of symbolic size expressions (a symbol s0, s1, ..., or a sum, product or floor
 * quotient of two dims). Tracing produces concrete sizes today; symbolic sizes are printed,
 * parsed, checked by the verifier where they can be, and bound from the inputs by the
 * interpreter, so dynamic shapes can arrive without changing the data structure.
 *
 * Memory: graphs use malloc (not Ember's allocator): they are compiler data, not tensor data.
 * Functions that can fail return false (or NULL) and write a reason into err (cap bytes). */
#ifndef EMBER_IR_GRAPH_H
#define EMBER_IR_GRAPH_H

#include "../prims/prims.h"

#include <stdio.h>

typedef int64_t ir_dim;
#define IR_DIM_IS_SYM(d) ((d) < 0)
#define IR_SYM_REF(k) (-1 - (int64_t)(k))
#define IR_SYM_INDEX(d) ((int)(-1 - (d)))

typedef enum ir_sexpr_kind { IR_SEXPR_SYM, IR_SEXPR_ADD, IR_SEXPR_MUL, IR_SEXPR_FLOORDIV } ir_sexpr_kind;
typedef struct ir_sexpr {
  ir_sexpr_kind kind;
  ir_dim a, b;  /* operands of ADD/MUL/FLOORDIV */
  int sym;      /* IR_SEXPR_SYM: symbol number (printed s<sym>) */
} ir_sexpr;

/* The type of a value: dtype, device and (possibly symbolic) shape. */
typedef struct ir_type {
  em_dtype dtype;
  em_device device;
  int ndim;
  ir_dim sizes[EM_MAX_DIMS];
} ir_type;

typedef struct ir_value {
  ir_type type;
  int def;   /* index of the defining node, or -1 for a graph input */
} ir_value;

typedef struct ir_node {
  em_prim op;
  int n_in;
  int in_at;         /* operands: value ids g->operands[in_at .. in_at + n_in) */
  prim_attrs attrs;
  int out;           /* the value it defines */
  em_site site;      /* the user's call site */
  const char *opname; /* public op that emitted it ("em_linear"); the prim's name if unknown */
  int rng_slot;      /* random prims split by AOT autograd: which execution-time counters they
                      * share between a forward graph and a backward graph; -1 otherwise */
} ir_node;

typedef struct ir_graph {
  char name[64];
  ir_value *values;
  int n_values, cap_values;
  ir_node *nodes;
  int n_nodes, cap_nodes;
  int *operands;
  int n_operands, cap_operands;
  int *inputs, n_inputs, cap_inputs;    /* value ids */
  int *outputs, n_outputs, cap_outputs; /* value ids (a value may appear more than once) */
  ir_sexpr *sexprs;
  int n_sexprs, cap_sexprs, n_symbols;
  bool oom;                             /* an allocation failed; the graph is unusable */
} ir_graph;

/* ---- ir/graph.c: building ---- */

/* Writes a reason into err (cap bytes) and returns false: the error path of every function
 * above prims that reports through a buffer. */
bool ir_fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

ir_graph *ir_graph_new(const char *name);
void ir_graph_free(ir_graph *g);
/* A deep copy, or NULL. */
ir_graph *ir_graph_clone(const ir_graph *g);
/* Adds a graph input of type t; returns its value id, or -1 when out of memory. */
int ir_add_input(ir_graph *g, const ir_type *t);
/* Appends a node; operands must be existing value ids. The result type is given (the tracer has
 * it from the meta function). Returns the new value id, or -1 when out of memory. */
int ir_add_node(ir_graph *g, em_prim op, const int *in, int n_in, const prim_attrs *at, const ir_type *t,
                em_site site, const char *opname);
bool ir_add_output(ir_graph *g, int value);
static inline const int *ir_operands(const ir_graph *g, const ir_node *n) { return g->operands + n->in_at; }
/* A copy of s that lives until the process ends, shared by equal strings (NULL for NULL or out
 * of memory). Nodes keep their site's file and function and their opname as plain pointers,
 * which must outlive the graph and every autograd node made from it: string literals (what
 * the tracer records) or interned strings (what the parser makes). */
const char *ir_intern(const char *s);
/* A new symbol (s<k>) or expression; returns its ir_dim, or 0 with g->oom set. */
ir_dim ir_new_symbol(ir_graph *g);
ir_dim ir_sexpr_binary(ir_graph *g, ir_sexpr_kind kind, ir_dim a, ir_dim b);
/* Evaluates d with symbol values syms[k] (-1 = unbound). Returns -1 when unbound. */
int64_t ir_dim_eval(const ir_graph *g, ir_dim d, const int64_t *syms);
bool ir_type_concrete(const ir_type *t);
/* Type <-> prim_meta (contiguous strides, offset 0). The meta conversion needs concrete sizes. */
ir_type ir_type_of_meta(const prim_meta *m, em_device dev);
prim_meta ir_meta_of_type(const ir_type *t);
bool ir_type_equal(const ir_type *a, const ir_type *b);
/* Attributes a prim reads, compared and hashed field by field according to its schema. */
bool ir_attrs_equal(em_prim op, const prim_attrs *a, const prim_attrs *b);
uint64_t ir_attrs_hash(em_prim op, const prim_attrs *a, uint64_t h);
/* The attributes of op a size can flow into from the function that traced it (dynamic shapes,
 * frontend/dynamic.c): shape sizes, slice start/stop/step, pads (integers), and full, pad and
 * iota values (doubles; a mean's divisor is one). Writes pointers into a, one field each, into
 * out (room for IR_ATTR_SIZES_MAX) and returns how many. Every other attribute (axes, dtypes,
 * counts, RNG keys, conv parameters) is part of the graph's structure. */
enum { IR_ATTR_SIZES_MAX = 3 * EM_MAX_DIMS + 5 };
typedef struct ir_attr_size {
  int64_t *i; /* one of these two is set */
  double *d;
  const char *name; /* the attribute, as the printer names it */
  int at;           /* its element, or -1 for a scalar attribute */
} ir_attr_size;
int ir_attr_sizes(em_prim op, prim_attrs *a, ir_attr_size *out);
/* Number of uses of each value (operands and outputs) into uses[n_values]. */
void ir_count_uses(const ir_graph *g, int *uses);
/* Removes nodes with keep[i] false (their values must be unused) and renumbers values densely:
 * inputs first, then node results in order. remap (may be NULL) receives old -> new value ids
 * (-1 for removed). Returns false on out of memory (g unchanged). */
bool ir_graph_compact(ir_graph *g, const bool *keep, int *remap);
/* A structural hash of the graph: inputs' types, each node's prim, operands, attributes and
 * type, the outputs. Sites and names do not count, so the same program traced from another
 * call site hashes alike. ir_graph_same_structure compares exactly what the hash covers. */
uint64_t ir_graph_hash(const ir_graph *g);
bool ir_graph_same_structure(const ir_graph *a, const ir_graph *b);

/* ---- ir/print.c ---- */

/* "f32[128,s0]" (with "@cuda" appended for CUDA values). */
char *ir_fmt_ir_type(const ir_graph *g, const ir_type *t, char *buf, size_t cap);
/* The text form:
 *   graph name(%0 : f32[128,784], %1 : f32[512,784]) {
 *     %2 : f32[784,512] = permute(%1, axes=[1,0])  # model.c:41 forward
 *     ...
 *     return %5, %7
 *   }
 * Attributes are printed as name=value in the order of the prim's schema; doubles with 17
 * significant digits, so text round-trips bit-exactly. Returns a malloc'd string or NULL. */
char *ir_print(const ir_graph *g, bool with_sites);
/* A growing string for text that code emits (the printer, the CUDA kernel generator): start from
 * {0}; ir_sb_printf appends; after an allocation failure appends are dropped and ir_sb_finish
 * frees the text and returns NULL, else returns it (never NULL; the caller frees it). */
typedef struct ir_sbuf {
  char *s;
  size_t n, cap;
  bool oom;
} ir_sbuf;
void ir_sb_printf(ir_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *ir_sb_finish(ir_sbuf *b);
bool ir_print_file(const ir_graph *g, FILE *f);
/* Graphviz DOT: one box per node (prim, result type, site), coloured by family; inputs and
 * outputs as ellipses. Returns a malloc'd string or NULL. */
char *ir_to_dot(const ir_graph *g);

/* ---- ir/parse.c ---- */

/* Parses the text form back into a graph. On error returns NULL and writes
 * "line L, column C: message" into err. */
ir_graph *ir_parse(const char *text, char *err, size_t cap);

/* ---- ir/verify.c ---- */

enum { IR_VERIFY_NO_DEAD = 1 }; /* also reject node results nothing uses */
/* Checks operand ids (defined, defined before use), arity, attributes (axes in range), that
 * each node's type is what its prim's meta function gives for its operands' types (dtype
 * always; shape where sizes are concrete), and outputs. Returns false with the first problem,
 * naming the node as "%3 = add(...)" and both types, in err. */
bool ir_verify(const ir_graph *g, unsigned flags, char *err, size_t cap);

/* ---- ir/passes.c ---- */

typedef struct ir_pass_stats {
  int dce, cse, folded, simplified, rounds;
} ir_pass_stats;
/* Each returns the number of nodes removed or rewritten, or -1 on out of memory. */
int ir_pass_dce(ir_graph *g);
int ir_pass_cse(ir_graph *g);
int ir_pass_fold(ir_graph *g);
int ir_pass_simplify(ir_graph *g);
/* full(shape=S) -> expand(full([]), S) for S of more than one element (see passes.c). */
int ir_pass_scalar_constants(ir_graph *g);
/* simplify, fold, cse, dce, scalar constants to a fixed point. Returns false on out of memory. */
bool ir_optimize(ir_graph *g, ir_pass_stats *stats);
/* The names of the algebraic rewrite rules, for tests and logs (NULL-terminated). */
extern const char *const ir_rewrite_rule_names[];

#endif /* EMBER_IR_GRAPH_H */
