/* Matrix multiply engine of the CPU backend: one sgemm entry point with cblas_sgemm's row-major
 * semantics, served either by our own AVX-512 kernel (src/backend/gemm_avx512.c, OpenMP over the calling
 * thread's team) or by the configured CBLAS (OpenBLAS/BLIS). The engine is picked at run time:
 * the own kernel when the CPU has AVX-512F and it was compiled in, else BLAS; the environment
 * variable DT_GEMM=auto|own|blas (or dt_gemm_set_engine) forces one. DT_GEMM_CENSUS=1 times
 * every call per shape and prints the table at exit (gemm_census.h). */
#ifndef DT_GEMM_H
#define DT_GEMM_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DT_GEMM_AUTO = 0, /* own if available, else blas */
  DT_GEMM_OWN,      /* own AVX-512 kernel (needs AVX-512F CPU + compiler support) */
  DT_GEMM_BLAS      /* cblas_sgemm of the linked BLAS */
} dt_gemm_engine_t;

/* C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, all row-major, exactly like
 * cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, ...):
 *   op(A) = A (M, K) with lda >= K      if !transA;  A^T with A (K, M), lda >= M  if transA
 *   op(B) = B (K, N) with ldb >= N      if !transB;  B^T with B (N, K), ldb >= K  if transB
 *   C (M, N) with ldc >= N. beta == 0 overwrites C without reading it (NaN in C is ignored).
 * Threads: the own engine uses omp_get_max_threads() threads (an OpenMP team inside the call;
 * one thread for products under 32 MFLOP or when called inside a parallel region); BLAS uses its
 * own setting. Thread-safe: every thread keeps its own packing buffers (allocated on first use,
 * about 3 MB, then reused: no allocation per call). */
void dt_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

/* Read DT_GEMM from the environment (auto|own|blas) and select the engine. DT_ERR_CONFIG for an
 * unknown value, DT_ERR_UNSUPPORTED for "own" on a CPU/build without AVX-512. dt_sgemm calls
 * this lazily (falling back to auto on error); call it at start-up to report bad values. */
dt_status_t dt_gemm_init(void);
/* Force an engine (tests, benchmarks). DT_ERR_UNSUPPORTED if `own` is not available. */
dt_status_t dt_gemm_set_engine(dt_gemm_engine_t e);
/* The engine dt_sgemm uses now (never AUTO once resolved). */
dt_gemm_engine_t dt_gemm_engine(void);
/* Human-readable name of the engine in use, e.g. "own-avx512 14x32" or "blas:openblas Haswell". */
const char *dt_gemm_engine_name(void);
/* 1 if the own AVX-512 kernel is compiled in and the CPU supports it. */
int dt_gemm_own_available(void);

#ifdef __cplusplus
}
#endif
#endif
