/* The sgemm census (DT_GEMM_CENSUS=1 in the environment): time per product shape, printed to
 * stderr at exit (gemm_census.c). dt_sgemm feeds it; tests read it back. */
#ifndef DT_GEMM_CENSUS_H
#define DT_GEMM_CENSUS_H

#include <stdio.h>

typedef struct {
  int ta, tb, M, N, K;
  long calls;
  double seconds; /* wall time; a call inside a parallel region counts 1/threads of it */
} dt_gemm_census_row_t;

/* 1 when DT_GEMM_CENSUS is set (and not "0"), read once; then the table prints at exit. */
int dt_gemm_census_on(void);
/* Turn the census on or off and empty it (tests). */
void dt_gemm_census_enable(int on);
double dt_gemm_census_now(void); /* seconds, monotonic */
void dt_gemm_census_add(int ta, int tb, int M, int N, int K, double seconds);
/* Up to max shapes, largest time first; returns how many. */
int dt_gemm_census_rows(dt_gemm_census_row_t *out, int max);
void dt_gemm_census_print(FILE *o);

#endif
