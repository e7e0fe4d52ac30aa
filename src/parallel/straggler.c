/* Straggler statistics (straggler.h): min, median, max and the slowest rank of per-rank times. */
#include "straggler.h"

#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void dt_straggler_stats(const double *t, int n, double *scratch, dt_straggler_t *out) {
  memset(out, 0, sizeof *out);
  if (n < 1) return;
  out->n = n;
  for (int r = 1; r < n; r++)
    if (t[r] > t[out->slowest]) out->slowest = r;
  memcpy(scratch, t, sizeof(double) * (size_t)n);
  qsort(scratch, (size_t)n, sizeof(double), cmp_double);
  out->min = scratch[0];
  out->max = scratch[n - 1];
  out->median = n % 2 ? scratch[n / 2] : 0.5 * (scratch[n / 2 - 1] + scratch[n / 2]);
}

int dt_straggler_due(int step, int every, int log_every) {
  int n = every < 0 ? log_every : every;
  return n > 0 && step > 0 && step % n == 0;
}
