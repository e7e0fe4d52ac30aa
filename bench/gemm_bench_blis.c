/* BLIS side of bench/gemm_bench.c, in its own file so that blis.h never meets OpenBLAS's cblas.h:
 * row-major sgemm through BLIS's native bli_sgemm (no cblas symbol clash), thread count, name. */
#include <blis.h>

const char *bench_blis_name(void);
void bench_blis_threads(int n);
void bench_blis_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc);

const char *bench_blis_name(void) { return bli_arch_string(bli_arch_query_id()); }

void bench_blis_threads(int n) { bli_thread_set_num_threads(n); }

void bench_blis_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc) {
  /* Strides describe the stored matrices (row-major: row stride ld, column stride 1). */
  bli_sgemm(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M, N, K, &alpha,
            (float *)A, lda, 1, (float *)B, ldb, 1, &beta, C, ldc, 1);
}
