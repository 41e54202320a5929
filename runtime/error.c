/* runtime/error.c: sticky, located errors.
 *
 * cairo's model: the first failure is recorded and kept; ops handed the NULL it produced return
 * NULL at once, so the caller checks once, at the end, and reads a message that names the op,
 * the operands and the user's own file:line. The message lives in thread-local storage so
 * recording an error never allocates (it may be reporting an allocation failure). */
#include "rt.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];
static _Thread_local bool has_error;

void *rt_error(em_site site, const char *op, const char *fmt, ...) {
  if (has_error) return NULL;
  /* the composite the user called, when op is inside one: its C name less the "_at" suffix */
  const char *outer = rt_scope_op();
  int len = outer ? (int)strlen(outer) : 0;
  if (len > 3 && !strcmp(outer + len - 3, "_at")) len -= 3;
  int n = outer && (strncmp(outer, op, (size_t)len) || op[len])
              ? snprintf(last_error, sizeof last_error, "%s:%d: %.*s: %s: ", site.file ? site.file : "?", site.line, len, outer, op)
              : snprintf(last_error, sizeof last_error, "%s:%d: %s: ", site.file ? site.file : "?", site.line, op);
  if (n < 0) n = 0;
  if ((size_t)n < sizeof last_error) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
  }
  has_error = true;
  return NULL;
}

bool rt_has_error(void) { return has_error; }

const char *em_last_error(void) { return has_error ? last_error : NULL; }

void em_clear_error(void) {
  has_error = false;
  last_error[0] = 0;
}

char *rt_fmt(char *buf, size_t cap, const em_tensor *t) {
  return ir_fmt_type(buf, cap, t->dtype, t->ndim, t->sizes);
}
