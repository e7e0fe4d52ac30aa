/* sgemm benchmark on the GPT-2 training shapes: dt_sgemm's own AVX-512 engine, the linked BLAS
 * (OpenBLAS: the kernel it picked is printed; run the program once with and once without
 * OPENBLAS_CORETYPE to compare its kernels, see bench/gemm_bench.sh) and BLIS (native API, if
 * built with it), 1 and 2 threads, median GFLOP/s over repeats. Prints numbers; not a test.
 * usage: bench/gemm_bench [-t 1,2] [-r reps] [-e own,blas,blis] [-m 124M,30M,attn] [-s ta,tb,M,N,K] [-p] */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dt_build.h"
#include "gemm.h"

#ifdef DT_HAVE_OPENBLAS
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);
#endif
#ifdef DT_BENCH_BLIS
const char *bench_blis_name(void);
void bench_blis_threads(int n);
void bench_blis_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc);
#endif

typedef struct {
  char name[32];
  int ta, tb, M, N, K;
  float beta;
  int per_step; /* how often a training step runs it */
} shape_t;

enum { ENG_OWN, ENG_BLAS, ENG_BLIS };
static const char *eng_names[] = {"own", "blas", "blis"};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* CPU seconds used by the whole process (all threads, spinning included). */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The three matmuls of one linear layer out = inp W^T (W: OC x IC) over BT tokens. */
static int add_linear(shape_t *s, int n, const char *model, const char *layer, int BT, int OC, int IC, int count) {
  const shape_t three[3] = {
      {"fwd", 0, 1, BT, OC, IC, 0.0f, count},  /* out (BT, OC) = inp (BT, IC) W^T */
      {"dinp", 0, 0, BT, IC, OC, 0.0f, count}, /* dinp (BT, IC) = dout (BT, OC) W */
      {"dW", 1, 0, OC, IC, BT, 1.0f, count},   /* dW (OC, IC) += dout^T inp */
  };
  for (int i = 0; i < 3; i++, n++) {
    s[n] = three[i];
    snprintf(s[n].name, sizeof s[n].name, "%.6s %.8s %.4s", model, layer, three[i].name);
  }
  return n;
}

static int add_model(shape_t *s, int n, const char *model, int L, int C, int BT, int Vp) {
  n = add_linear(s, n, model, "qkv", BT, 3 * C, C, L);
  n = add_linear(s, n, model, "attproj", BT, C, C, L);
  n = add_linear(s, n, model, "fc", BT, 4 * C, C, L);
  n = add_linear(s, n, model, "fcproj", BT, C, 4 * C, L);
  n = add_linear(s, n, model, "lm_head", BT, Vp, C, 1);
  return n;
}

static void run(int eng, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                float beta, float *C, int ldc) {
  switch (eng) {
  case ENG_OWN:
  case ENG_BLAS: dt_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc); break;
#ifdef DT_BENCH_BLIS
  case ENG_BLIS: bench_blis_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc); break;
#endif
  default: break;
  }
}

/* Median wall seconds of `reps` calls after one warm-up call; *cpu: median process CPU seconds
 * (on a shared machine, threads * flops / cpu is the rate the code reaches while it runs). */
static double time_shape(int eng, const shape_t *s, int reps, double *cpu, double *best) {
  const int arows = s->ta ? s->K : s->M, acols = s->ta ? s->M : s->K;
  const int brows = s->tb ? s->N : s->K, bcols = s->tb ? s->K : s->N;
  float *A = malloc(sizeof(float) * (size_t)arows * acols), *B = malloc(sizeof(float) * (size_t)brows * bcols);
  float *C = malloc(sizeof(float) * (size_t)s->M * s->N);
  if (!A || !B || !C) {
    fprintf(stderr, "gemm_bench: out of memory for %s\n", s->name);
    exit(1);
  }
  for (size_t i = 0; i < (size_t)arows * acols; i++) A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  for (size_t i = 0; i < (size_t)brows * bcols; i++) B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
  memset(C, 0, sizeof(float) * (size_t)s->M * s->N);
  double t[64], c[64];
  if (reps > 64) reps = 64;
  run(eng, s->ta, s->tb, s->M, s->N, s->K, A, acols, B, bcols, s->beta, C, s->N);
  for (int r = 0; r < reps; r++) {
    double t0 = now(), c0 = cpu_now();
    run(eng, s->ta, s->tb, s->M, s->N, s->K, A, acols, B, bcols, s->beta, C, s->N);
    t[r] = now() - t0;
    c[r] = cpu_now() - c0;
  }
  qsort(t, reps, sizeof(double), cmp_double);
  qsort(c, reps, sizeof(double), cmp_double);
  *cpu = c[reps / 2];
  *best = t[0];
  free(A);
  free(B);
  free(C);
  return t[reps / 2];
}

/* FMA throughput ceiling: 24 independent chains of 16-lane FMAs per thread, register only. */
__attribute__((target("avx512f,fma"))) static float fma_loop(long iters) {
  __m512 acc[24];
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 24; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long it = 0; it < iters; it++)
    _Pragma("GCC unroll 24") for (int i = 0; i < 24; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

static double fma_peak(int threads, double *best_cpu) {
  const long iters = 20000000;
  volatile float sink = 0.0f;
  double best = 0.0;
  *best_cpu = 0.0;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now(), c0 = cpu_now();
#pragma omp parallel num_threads(threads)
    {
      float r = fma_loop(iters);
#pragma omp atomic
      sink += r;
    }
    const double f = 2.0 * 16 * 24 * (double)iters * threads, g = f / (now() - t0) * 1e-9;
    const double gc = f * threads / (cpu_now() - c0) * 1e-9;
    if (g > best) best = g;
    if (gc > *best_cpu) *best_cpu = gc;
  }
  (void)sink;
  return best;
}

static void set_threads(int eng, int t) {
  omp_set_num_threads(t);
#ifdef DT_HAVE_OPENBLAS
  if (eng == ENG_BLAS) openblas_set_num_threads(t);
#endif
#ifdef DT_BENCH_BLIS
  if (eng == ENG_BLIS) bench_blis_threads(t);
#endif
  (void)eng;
}

static const char *eng_label(int eng) {
  if (eng == ENG_OWN) {
    dt_gemm_set_engine(DT_GEMM_OWN);
    return dt_gemm_engine_name();
  }
  if (eng == ENG_BLAS) {
    dt_gemm_set_engine(DT_GEMM_BLAS);
    return dt_gemm_engine_name();
  }
#ifdef DT_BENCH_BLIS
  static char name[64];
  snprintf(name, sizeof name, "blis-openmp %s", bench_blis_name());
  return name;
#else
  return "blis";
#endif
}

int main(int argc, char **argv) {
  char threads_s[64] = "1,2", engines_s[64] = "own,blas,blis", models_s[64] = "124M,30M";
  int reps = 5, peak = 0, opt;
  shape_t shapes[128];
  int ns = 0;
  while ((opt = getopt(argc, argv, "t:r:e:m:s:ph")) != -1) {
    switch (opt) {
    case 't': snprintf(threads_s, sizeof threads_s, "%s", optarg); break;
    case 'r': reps = atoi(optarg); break;
    case 'e': snprintf(engines_s, sizeof engines_s, "%s", optarg); break;
    case 'm': snprintf(models_s, sizeof models_s, "%s", optarg); break;
    case 'p': peak = 1; break;
    case 's': {
      shape_t *s = &shapes[ns];
      if (ns < 100 && sscanf(optarg, "%d,%d,%d,%d,%d", &s->ta, &s->tb, &s->M, &s->N, &s->K) == 5) {
        snprintf(s->name, sizeof s->name, "custom");
        s->beta = 0.0f;
        s->per_step = 0;
        ns++;
        models_s[0] = 0;
      }
      break;
    }
    default:
      fprintf(stderr, "usage: %s [-t 1,2] [-r reps] [-e own,blas,blis] [-m 124M,30M,attn] [-s ta,tb,M,N,K (custom shape, repeatable)] [-p (FMA peak)]\n", argv[0]);
      return opt == 'h' ? 0 : 2;
    }
  }
  if (reps < 1) reps = 1;
  if (strstr(models_s, "124M")) ns = add_model(shapes, ns, "124M", 12, 768, 1024, 50304);
  if (strstr(models_s, "30M")) ns = add_model(shapes, ns, "30M", 6, 384, 2048, 50304);
  if (strstr(models_s, "attn")) { /* one (b, h) of attention at T = 256, hs = 64 */
    shapes[ns++] = (shape_t){"attn qk^T", 0, 1, 256, 256, 64, 0.0f, 0};
    shapes[ns++] = (shape_t){"attn att*v", 0, 0, 256, 64, 256, 0.0f, 0};
  }

  const char *ct = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
  printf("# gemm_bench: %d repeats, median GFLOP/s = 2MNK / median time\n", reps);
  printf("# OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s OMP_WAIT_POLICY=%s\n", ct ? ct : "(unset)", l2 ? l2 : "(unset)",
         getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(unset)");
  printf("# BLAS linked: %s%s%s\n", DT_BLAS_NAME,
#ifdef DT_HAVE_OPENBLAS
         ", openblas_get_corename() = ", openblas_get_corename()
#else
         "", ""
#endif
  );
  printf("# own engine available: %s\n", dt_gemm_own_available() ? "yes" : "no");
  if (peak && __builtin_cpu_supports("avx512f")) {
    double c1, c2, p1 = fma_peak(1, &c1), p2 = fma_peak(2, &c2);
    printf("# FMA peak (zmm, register only): 1 thread %.1f GFLOP/s (cpu-time rate %.1f), 2 threads %.1f (%.1f)\n", p1,
           c1, p2, c2);
  }
  printf("# ms, GFLOP/s: medians of wall clock; best: fastest repeat; cpuGF/s: threads * flops / process\n"
         "# CPU time (median; insensitive to time-sharing with other processes)\n");
  printf("%-22s %2s %6s %6s %6s %-6s %2s %9s %9s %8s %8s  %s\n", "# shape", "op", "M", "N", "K", "engine", "th", "ms",
         "GFLOP/s", "best", "cpuGF/s", "kernel");

  for (const char *tp = threads_s; *tp;) {
    const int th = atoi(tp);
    for (const char *ep = engines_s; *ep;) {
      int eng = strncmp(ep, "own", 3) == 0 ? ENG_OWN : strncmp(ep, "blas", 4) == 0 ? ENG_BLAS : ENG_BLIS;
      int ok = 1;
      if (eng == ENG_OWN && !dt_gemm_own_available()) ok = 0;
#ifndef DT_BENCH_BLIS
      if (eng == ENG_BLIS) ok = 0;
#endif
      if (ok) {
        const char *label = eng_label(eng);
        set_threads(eng, th);
        usleep(300000); /* let the previous library's idle threads stop spinning */
        double step_t = 0.0, step_f = 0.0, step_c = 0.0, step_b = 0.0;
        char last_model[8] = "";
        for (int i = 0; i < ns; i++) {
          const shape_t *s = &shapes[i];
          if (last_model[0] && strncmp(s->name, last_model, strlen(last_model)) != 0 && step_t > 0) {
            printf("%-22s %2s %6s %6s %6s %-6s %2d %9.1f %9.1f %8.1f %8.1f  matmuls of one step\n", last_model, "", "", "",
                   "", eng_names[eng], th, step_t * 1e3, step_f / step_t * 1e-9, step_f / step_b * 1e-9,
                   th * step_f / step_c * 1e-9);
            step_t = step_f = step_c = step_b = 0.0;
          }
          sscanf(s->name, "%7s", last_model);
          double c, b;
          const double t = time_shape(eng, s, reps, &c, &b), f = 2.0 * s->M * s->N * (double)s->K;
          step_t += s->per_step * t;
          step_f += s->per_step * f;
          step_c += s->per_step * c;
          step_b += s->per_step * b;
          printf("%-22s %c%c %6d %6d %6d %-6s %2d %9.3f %9.1f %8.1f %8.1f  %s\n", s->name, s->ta ? 'T' : 'N',
                 s->tb ? 'T' : 'N', s->M, s->N, s->K, eng_names[eng], th, t * 1e3, f / t * 1e-9, f / b * 1e-9,
                 th * f / c * 1e-9, label);
          fflush(stdout);
        }
        if (step_t > 0)
          printf("%-22s %2s %6s %6s %6s %-6s %2d %9.1f %9.1f %8.1f %8.1f  matmuls of one step\n", last_model, "", "", "",
                 "", eng_names[eng], th, step_t * 1e3, step_f / step_t * 1e-9, step_f / step_b * 1e-9,
                 th * step_f / step_c * 1e-9);
      }
      ep = strchr(ep, ',');
      ep = ep ? ep + 1 : "";
    }
    tp = strchr(tp, ',');
    tp = tp ? tp + 1 : "";
  }
  return 0;
}
