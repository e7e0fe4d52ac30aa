/* The sgemm census (DT_GEMM_CENSUS=1): every dt_sgemm call timed and summed per shape (transposes,
 * M, N, K), printed to stderr at exit, largest time first, with its calls and GFLOP/s. What the
 * step-level op timings of bench/cnn_step or the trainer cannot say: which products a model's
 * step spends its matmul time in and at what rate, so a kernel change can be measured as the
 * sum of those products rather than as a whole step (whose noise on a shared VM is larger).
 *
 * Time is wall time of the call. A call made inside an OpenMP parallel region (each thread its
 * own product, as the convolutions' chunks) counts 1/threads of its time, so that the sum over
 * shapes stays comparable with the step's wall time. */
#include "gemm_census.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SHAPES 512

static dt_gemm_census_row_t rows[SHAPES];
static int n_rows, overflow_calls;
static double overflow_s;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int g_on = -1; /* -1 until DT_GEMM_CENSUS is read */

static void print_at_exit(void) { dt_gemm_census_print(stderr); }

int dt_gemm_census_on(void) {
  int on = __atomic_load_n(&g_on, __ATOMIC_ACQUIRE);
  if (on >= 0) return on;
  pthread_mutex_lock(&lock);
  if (g_on < 0) {
    const char *e = getenv("DT_GEMM_CENSUS");
    g_on = e && *e && strcmp(e, "0") != 0;
    if (g_on) atexit(print_at_exit);
  }
  on = g_on;
  pthread_mutex_unlock(&lock);
  return on;
}

void dt_gemm_census_enable(int on) {
  pthread_mutex_lock(&lock);
  g_on = on != 0;
  n_rows = overflow_calls = 0;
  overflow_s = 0.0;
  pthread_mutex_unlock(&lock);
}

double dt_gemm_census_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void dt_gemm_census_add(int ta, int tb, int M, int N, int K, double seconds) {
  if (omp_in_parallel()) seconds /= omp_get_num_threads();
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < n_rows && !(rows[i].ta == ta && rows[i].tb == tb && rows[i].M == M && rows[i].N == N && rows[i].K == K))
    i++;
  if (i == n_rows && n_rows < SHAPES) rows[n_rows++] = (dt_gemm_census_row_t){ta, tb, M, N, K, 0, 0.0};
  if (i < n_rows) {
    rows[i].calls++;
    rows[i].seconds += seconds;
  } else {
    overflow_calls++;
    overflow_s += seconds;
  }
  pthread_mutex_unlock(&lock);
}

static int by_time(const void *a, const void *b) {
  double x = ((const dt_gemm_census_row_t *)a)->seconds, y = ((const dt_gemm_census_row_t *)b)->seconds;
  return x < y ? 1 : x > y ? -1 : 0;
}

int dt_gemm_census_rows(dt_gemm_census_row_t *out, int max) {
  pthread_mutex_lock(&lock);
  int n = n_rows < max ? n_rows : max;
  qsort(rows, (size_t)n_rows, sizeof *rows, by_time);
  memcpy(out, rows, (size_t)n * sizeof *out);
  pthread_mutex_unlock(&lock);
  return n;
}

void dt_gemm_census_print(FILE *o) {
  static dt_gemm_census_row_t r[SHAPES];
  int n = dt_gemm_census_rows(r, SHAPES);
  double total = overflow_s, flops = 0.0;
  long calls = overflow_calls;
  for (int i = 0; i < n; i++) {
    total += r[i].seconds;
    calls += r[i].calls;
    flops += 2.0 * r[i].M * r[i].N * r[i].K * r[i].calls;
  }
  fprintf(o,
          "# gemm census (DT_GEMM_CENSUS): %ld calls, %.1f ms, %.1f GFLOP/s over all; per shape, largest "
          "time first:\n# op      M      N      K    calls        ms   GFLOP/s\n",
          calls, 1e3 * total, total > 0 ? 1e-9 * flops / total : 0.0);
  for (int i = 0; i < n; i++)
    fprintf(o, "  %c%c %6d %6d %6d %8ld %9.1f %9.1f\n", r[i].ta ? 'T' : 'N', r[i].tb ? 'T' : 'N', r[i].M, r[i].N,
            r[i].K, r[i].calls, 1e3 * r[i].seconds,
            r[i].seconds > 0 ? 2e-9 * r[i].M * r[i].N * r[i].K * r[i].calls / r[i].seconds : 0.0);
  if (overflow_calls) fprintf(o, "  (%d calls of further shapes, %.1f ms)\n", overflow_calls, 1e3 * overflow_s);
}
