/* Status strings and the recorded error message. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static char err_msg[1024];
static char err_where[256];
static int err_rank = -1;

const char *dt_status_str(dt_status_t st) {
  switch (st) {
#define DT_STATUS_CASE(name, str) \
  case name:                      \
    return str;
    DT_STATUS_LIST(DT_STATUS_CASE)
#undef DT_STATUS_CASE
    default:
      return "unknown status";
  }
}

dt_status_t dt_err_set(dt_status_t st, const char *file, int line, const char *fmt, ...) {
  /* One writer at a time: OpenMP worker threads (dtrain prep's tokenisers) may fail together. */
#pragma omp critical(dt_err_set)
  if (err_msg[0] == '\0') { /* keep the first, root-cause message */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    snprintf(err_where, sizeof err_where, "%s:%d", file, line);
  }
  return st;
}

const char *dt_err_msg(void) { return err_msg; }
const char *dt_err_where(void) { return err_where; }
void dt_err_clear(void) { err_msg[0] = '\0'; err_where[0] = '\0'; }
void dt_err_set_rank(int rank) { err_rank = rank; }
int dt_err_rank(void) { return err_rank; }
