/* sgemm dispatcher: picks our own AVX-512 kernel or the linked CBLAS at run time (CPU features,
 * DT_GEMM=auto|own|blas, dt_gemm_set_engine) and forwards dt_sgemm to it. */
#include "gemm.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_build.h"
#include "gemm_census.h"
#include "gemm_own.h"

#ifdef DT_HAVE_OPENBLAS
char *openblas_get_corename(void);
#endif

static int g_engine = -1; /* resolved dt_gemm_engine_t, -1 until the first init */

int dt_gemm_own_available(void) {
#ifdef DT_HAVE_AVX512_GEMM
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

dt_status_t dt_gemm_set_engine(dt_gemm_engine_t e) {
  if (e == DT_GEMM_AUTO) e = dt_gemm_own_available() ? DT_GEMM_OWN : DT_GEMM_BLAS;
  if (e == DT_GEMM_OWN && !dt_gemm_own_available())
    return DT_ERR(DT_ERR_UNSUPPORTED, "DT_GEMM=own: the own sgemm needs AVX-512 (F/VL/BW/DQ) in both the CPU and the build");
  if (e != DT_GEMM_OWN && e != DT_GEMM_BLAS) return DT_ERR(DT_ERR_ARG, "dt_gemm_set_engine: unknown engine %d", (int)e);
  __atomic_store_n(&g_engine, (int)e, __ATOMIC_RELEASE);
  return DT_OK;
}

dt_status_t dt_gemm_init(void) {
  const char *s = getenv("DT_GEMM");
  dt_gemm_engine_t e = DT_GEMM_AUTO;
  dt_status_t st = DT_OK;
  if (s && *s && strcmp(s, "auto") != 0) {
    if (strcmp(s, "own") == 0) e = DT_GEMM_OWN;
    else if (strcmp(s, "blas") == 0) e = DT_GEMM_BLAS;
    else st = DT_ERR(DT_ERR_CONFIG, "environment DT_GEMM='%s': expected auto, own or blas", s);
  }
  if (st == DT_OK) st = dt_gemm_set_engine(e);
  if (st != DT_OK) dt_gemm_set_engine(DT_GEMM_AUTO); /* keep working; the caller reports st */
  return st;
}

dt_gemm_engine_t dt_gemm_engine(void) {
  int e = __atomic_load_n(&g_engine, __ATOMIC_ACQUIRE);
  if (e < 0) {
    dt_gemm_init();
    e = __atomic_load_n(&g_engine, __ATOMIC_ACQUIRE);
  }
  return (dt_gemm_engine_t)e;
}

const char *dt_gemm_engine_name(void) {
#ifdef DT_HAVE_AVX512_GEMM
  if (dt_gemm_engine() == DT_GEMM_OWN) return dt__sgemm_avx512_name();
#endif
  static char name[96];
#ifdef DT_HAVE_OPENBLAS
  snprintf(name, sizeof name, "blas:openblas %s", openblas_get_corename());
#else
  snprintf(name, sizeof name, "blas:%s", DT_BLAS_NAME);
#endif
  return name;
}

static void sgemm_engine(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc);

void dt_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  if (!dt_gemm_census_on()) {
    sgemm_engine(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const double t0 = dt_gemm_census_now();
  sgemm_engine(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  dt_gemm_census_add(transA, transB, M, N, K, dt_gemm_census_now() - t0);
}

static void sgemm_engine(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc) {
#ifdef DT_HAVE_AVX512_GEMM
  if (dt_gemm_engine() == DT_GEMM_OWN) {
    dt__sgemm_avx512(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}
