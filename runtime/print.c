/* runtime/print.c: tensors printed as PyTorch prints them.
 *
 * Follows torch/_tensor_str.py's choices so output reads the same to a PyTorch user: one
 * format per tensor (integer-valued floats as "1.", fixed "%.4f", or "%.4e" when the magnitudes
 * span more than 1000x or exceed 1e8), values right-aligned to a common width, rows wrapped at
 * 80 columns, and tensors over 1000 elements summarised to 3 edge items per dimension. */
#include "rt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *s;
  size_t n, cap;
  bool oom;
} sbuf;

static void put(sbuf *b, const char *text, size_t len) {
  if (b->oom) return;
  if (b->n + len + 1 > b->cap) {
    size_t cap = (b->cap ? b->cap * 2 : 256);
    while (cap < b->n + len + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->oom = true;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
  memcpy(b->s + b->n, text, len);
  b->n += len;
  b->s[b->n] = 0;
}
static void puts_(sbuf *b, const char *t) { put(b, t, strlen(t)); }
static void pad(sbuf *b, int k) {
  while (k-- > 0) put(b, " ", 1);
}

enum { EDGE = 3, THRESHOLD = 1000, LINEWIDTH = 80 };

typedef struct {
  em_dtype dt;
  bool summarize;
  enum { F_INT, F_FIXED, F_SCI } mode;
  int width;
} fmt_state;

static double at_index(const em_tensor *t, const int64_t *idx) {
  const char *p = rt_data(t);
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
  return prim_load(p + off * (int64_t)ir_dtype(t->dtype)->size, t->dtype);
}

static int format_value(const fmt_state *f, double v, char *out, size_t cap) {
  if (f->dt == EM_BOOL) return snprintf(out, cap, "%s", v != 0 ? "True" : "False");
  if (!ir_is_float(f->dt)) return snprintf(out, cap, "%lld", (long long)v);
  if (isnan(v)) return snprintf(out, cap, "nan");
  if (isinf(v)) return snprintf(out, cap, v > 0 ? "inf" : "-inf");
  switch (f->mode) {
  case F_INT: return snprintf(out, cap, "%.0f.", v);
  case F_FIXED: return snprintf(out, cap, "%.4f", v);
  default: return snprintf(out, cap, "%.4e", v);
  }
}

/* Visits the printed elements (edge items only when summarising). */
typedef void (*visit_fn)(void *ctx, double v);
static void visit(const em_tensor *t, int d, int64_t *idx, bool summarize, visit_fn fn, void *ctx) {
  if (d == t->ndim) {
    fn(ctx, at_index(t, idx));
    return;
  }
  int64_t n = t->sizes[d];
  for (int64_t i = 0; i < n; i++) {
    if (summarize && n > 2 * EDGE && i == EDGE) i = n - EDGE;
    idx[d] = i;
    visit(t, d + 1, idx, summarize, fn, ctx);
  }
}

typedef struct {
  bool all_int;
  double max_abs, min_abs;
  bool any_finite;
} stats;

static void collect(void *ctx, double v) {
  stats *s = ctx;
  if (!isfinite(v)) return;
  s->any_finite = true;
  if (v != trunc(v)) s->all_int = false;
  double a = fabs(v);
  if (a > s->max_abs) s->max_abs = a;
  if (a != 0 && (s->min_abs == 0 || a < s->min_abs)) s->min_abs = a;
}

typedef struct {
  const fmt_state *f;
  int width;
} width_ctx;
static void measure(void *ctx, double v) {
  width_ctx *w = ctx;
  char buf[64];
  int n = format_value(w->f, v, buf, sizeof buf);
  if (n > w->width) w->width = n;
}

static void emit(sbuf *b, const em_tensor *t, const fmt_state *f, int d, int64_t *idx, int indent) {
  put(b, "[", 1);
  int64_t n = t->sizes[d];
  if (d == t->ndim - 1) {
    int per_line = (LINEWIDTH - indent - 1) / (f->width + 2);
    if (per_line < 1) per_line = 1;
    int col = 0;
    for (int64_t i = 0; i < n; i++) {
      if (f->summarize && n > 2 * EDGE && i == EDGE) {
        puts_(b, " ...");
        i = n - EDGE;
        put(b, ", ", 2);
        col++;
      }
      if (col == per_line) {
        put(b, "\n", 1);
        pad(b, indent + 1);
        col = 0;
      }
      idx[d] = i;
      char buf[64];
      int len = format_value(f, at_index(t, idx), buf, sizeof buf);
      pad(b, f->width - len);
      put(b, buf, (size_t)len);
      if (i + 1 < n) put(b, ",", 1);
      if (i + 1 < n && col + 1 < per_line) put(b, " ", 1);
      col++;
    }
  } else {
    for (int64_t i = 0; i < n; i++) {
      if (i > 0) {
        for (int k = 0; k < t->ndim - d - 1; k++) put(b, "\n", 1);
        pad(b, indent + 1);
      }
      if (f->summarize && n > 2 * EDGE && i == EDGE) {
        puts_(b, "...,");
        for (int k = 0; k < t->ndim - d - 1; k++) put(b, "\n", 1);
        pad(b, indent + 1);
        i = n - EDGE;
      }
      idx[d] = i;
      emit(b, t, f, d + 1, idx, indent + 1);
      if (i + 1 < n) put(b, ",", 1);
    }
  }
  put(b, "]", 1);
}

static char *format(em_tensor *x, em_site site) {
  if (!x) return NULL;
  em_tensor *dev = NULL;
  if (x->storage->device == EM_CUDA) { /* the values, copied back (waits for them) */
    dev = x;
    if (!(x = rt_to_device(x, EM_CPU, "em_format", site))) return NULL;
  }
  sbuf b = {0};
  fmt_state f = {.dt = x->dtype, .summarize = x->numel > THRESHOLD, .mode = F_FIXED};
  int64_t idx[EM_MAX_DIMS] = {0};
  puts_(&b, "tensor(");
  if (x->numel == 0) {
    puts_(&b, "[], size=(");
    for (int d = 0; d < x->ndim; d++) {
      char s[32];
      snprintf(s, sizeof s, d ? ", %lld" : "%lld", (long long)x->sizes[d]);
      puts_(&b, s);
    }
    puts_(&b, x->ndim == 1 ? ",)" : ")");
  } else {
    if (ir_is_float(x->dtype)) {
      stats s = {.all_int = true};
      visit(x, 0, idx, f.summarize, collect, &s);
      if (s.any_finite && (s.max_abs > 1e8 || (s.min_abs > 0 && s.max_abs / s.min_abs > 1000) ||
                           (!s.all_int && s.max_abs < 1e-4)))
        f.mode = F_SCI;
      else if (s.all_int)
        f.mode = F_INT;
    }
    width_ctx w = {&f, 1};
    visit(x, 0, idx, f.summarize, measure, &w);
    f.width = w.width;
    if (x->ndim == 0) {
      char buf[64];
      puts_(&b, (format_value(&f, prim_load(rt_data(x), x->dtype), buf, sizeof buf), buf));
    } else {
      emit(&b, x, &f, 0, idx, 7);
    }
  }
  if (x->dtype != EM_F32 && x->dtype != EM_I64 && x->dtype != EM_BOOL) {
    puts_(&b, ", dtype=");
    puts_(&b, em_dtype_name(x->dtype));
  }
  if (dev) puts_(&b, ", device='cuda:0'"), em_release(x);
  puts_(&b, ")");
  if (b.oom) {
    free(b.s);
    return rt_error(site, "em_format", "out of memory formatting a tensor");
  }
  return b.s;
}

char *em_format_at(em_tensor *x, em_site site) {
  if (!x) return NULL;
  int tok = rt_break_begin("em_format", "formats a tensor's values", site);
  if (tok < 0) return NULL;
  char *s = format(x, site);
  rt_break_end(tok);
  return s;
}

void em_print_at(em_tensor *x, em_site site) {
  char *s = em_format_at(x, site);
  if (!s) return;
  puts(s);
  free(s);
}
