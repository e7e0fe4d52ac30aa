/* DTRAIN_FAULT parsing (see fault.h). */
#include "fault.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The step field of DTRAIN_FAULT if it names `name` for `rank`: 1 and *step (-1 when absent);
 * else 0. */
static int match(const char *name, int rank, int *step) {
  const char *f = getenv("DTRAIN_FAULT");
  if (!f || !*f) return 0;
  size_t n = strlen(name);
  if (strncmp(f, name, n) != 0 || f[n] != '@') return 0;
  const char *r = f + n + 1;
  char *end = NULL;
  if (*r == '*') {
    end = (char *)r + 1;
  } else {
    long want = strtol(r, &end, 10);
    if (end == r || want != rank) return 0;
  }
  *step = *end == ':' ? atoi(end + 1) : -1;
  return 1;
}

int dt_fault_named(const char *name) {
  const char *f = getenv("DTRAIN_FAULT");
  size_t n = strlen(name);
  return f && strncmp(f, name, n) == 0 && f[n] == '@';
}

int dt_fault(const char *name, int rank, int step) {
  int from = -1;
  if (!match(name, rank, &from)) return 0;
  return from < 0 || step < 0 || step >= from;
}

int dt_fault_at(const char *name, int rank, int step) {
  int at = -1;
  if (!match(name, rank, &at)) return 0;
  return step == (at < 0 ? 1 : at);
}

void dt_fault_scale(float *x, size_t n, float s) {
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

void dt_fault_sleep(double seconds) {
  struct timespec ts = {.tv_sec = (time_t)seconds, .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

void dt_fault_kill(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("dtrain: DTRAIN_FAULT ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  raise(SIGKILL);
  abort(); /* not reached: SIGKILL cannot be caught */
}
