/* Private interface between the gemm dispatcher (gemm.c) and our own AVX-512 sgemm
 * (gemm_avx512.c, compiled with AVX-512 flags; call it only when the CPU has AVX-512F). */
#ifndef DT_GEMM_OWN_H
#define DT_GEMM_OWN_H

/* Same contract as dt_sgemm (row-major, cblas semantics). */
void dt__sgemm_avx512(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc);
/* "own-avx512 MRxNR" with the blocking used. */
const char *dt__sgemm_avx512_name(void);

#endif
