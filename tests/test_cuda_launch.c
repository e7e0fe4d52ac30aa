/* Launch geometry of the CUDA kernels (cuda/cuda_launch.h), on the CPU: grid sizes stay in
 * [1, DT_CUDA_GRID_MAX], grid-stride loops cover every element exactly once whatever the grid,
 * warp-per-row launches have a warp for every row (or loop), row blocks are whole warps <= 1024.
 * And the row-major -> cuBLAS column-major gemm mapping: a column-major sgemm written from the
 * BLAS definition, called with dt_cuda_gemm_rowmajor's arguments, must equal a row-major double
 * reference for every (transposition, leading dimension) pattern the CUDA backend uses. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_launch.h"
#include "model.h"

Test(cuda_launch, grid_bounds) {
  cr_expect_eq(dt_cuda_grid(0, 256), 1); /* never a 0-block launch */
  cr_expect_eq(dt_cuda_grid(1, 256), 1);
  cr_expect_eq(dt_cuda_grid(256, 256), 1);
  cr_expect_eq(dt_cuda_grid(257, 256), 2);
  cr_expect_eq(dt_cuda_grid((size_t)1 << 40, 256), DT_CUDA_GRID_MAX);
  cr_expect_eq(dt_cuda_grid((size_t)DT_CUDA_GRID_MAX * 256, 256), DT_CUDA_GRID_MAX);
  cr_expect_eq(dt_cuda_grid((size_t)DT_CUDA_GRID_MAX * 256 + 1, 256), DT_CUDA_GRID_MAX);
}

Test(cuda_launch, grid_stride_covers_each_element_once) {
  size_t ns[] = {1, 31, 256, 1000, 65536, 124 * 768 + 5, (size_t)DT_CUDA_GRID_MAX * 256 + 12345};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    size_t n = ns[k], threads = (size_t)dt_cuda_grid(n, 256) * 256, total = 0;
    for (size_t tid = 0; tid < threads; tid++) total += dt_cuda_stride_count(n, threads, tid);
    cr_expect_eq(total, n, "n = %zu: %zu elements visited", n, total);
    /* the formula against a direct count of i = tid + j*threads < n for a few threads */
    size_t probe[] = {0, 1, threads / 2, threads - 1};
    for (int p = 0; p < 4; p++) {
      size_t c = 0;
      for (size_t i = probe[p]; i < n; i += threads) c++;
      cr_expect_eq(dt_cuda_stride_count(n, threads, probe[p]), c, "n = %zu tid = %zu", n, probe[p]);
    }
  }
}

Test(cuda_launch, warp_rows) {
  /* 8 warps per 256-thread block */
  cr_expect_eq(dt_cuda_warp_rows_grid(1, 256), 1);
  cr_expect_eq(dt_cuda_warp_rows_grid(8, 256), 1);
  cr_expect_eq(dt_cuda_warp_rows_grid(9, 256), 2);
  cr_expect_eq(dt_cuda_warp_rows_grid(16 * 1024, 256), 2048);
  for (size_t rows = 1; rows < 5000; rows += 37)
    cr_expect((size_t)dt_cuda_warp_rows_grid(rows, 256) * 8 >= rows, "rows %zu lack a warp", rows);
}

Test(cuda_launch, row_block) {
  cr_expect_eq(dt_cuda_row_block(0), 32);
  cr_expect_eq(dt_cuda_row_block(1), 32);
  cr_expect_eq(dt_cuda_row_block(33), 64);
  cr_expect_eq(dt_cuda_row_block(256), 256);
  cr_expect_eq(dt_cuda_row_block(50257), 1024);
  for (size_t n = 1; n < 3000; n += 7) {
    int b = dt_cuda_row_block(n);
    cr_expect(b % 32 == 0 && b >= 32 && b <= 1024, "block %d for %zu", b, n);
  }
}

/* BLAS sgemm semantics, column-major: C(m,n) = alpha op(A)(m,k) op(B)(k,n) + beta C. */
static void colmajor_sgemm(int opa, int opb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                           int ldb, float beta, float *C, int ldc) {
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      float s = 0;
      for (int l = 0; l < k; l++) s += (opa ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda]) *
                                       (opb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb]);
      C[i + (size_t)j * ldc] = alpha * s + beta * C[i + (size_t)j * ldc];
    }
}

/* Row-major C(M,N) = alpha op(A) op(B) + beta C in double. */
static void rowmajor_ref(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda, const float *B,
                         int ldb, double beta, double *C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int l = 0; l < K; l++)
        s += (double)(ta ? A[(size_t)l * lda + i] : A[(size_t)i * lda + l]) *
             (tb ? B[(size_t)j * ldb + l] : B[(size_t)l * ldb + j]);
      C[(size_t)i * ldc + j] = alpha * s + beta * C[(size_t)i * ldc + j];
    }
}

Test(cuda_launch, gemm_rowmajor_mapping) {
  /* N rows, C in, OC out; attention: T, head size hs, C3 = 3C row stride of qkv */
  enum { N = 6, C = 8, OC = 5, T = 4, HS = 3, C3 = 24 };
  struct {
    const char *what;
    int ta, tb, M, Nn, K, lda, ldb, ldc;
    float beta;
  } cs[] = {
      {"matmul forward: out = inp W^T", 0, 1, N, OC, C, C, C, OC, 0},
      {"matmul backward: dinp = dout W", 0, 0, N, C, OC, OC, C, C, 0},
      {"matmul backward: dW += dout^T inp", 1, 0, OC, C, N, OC, C, C, 1},
      {"conv1d forward: out = inp W", 0, 0, N, OC, C, C, OC, OC, 0},
      {"conv1d backward: dinp = dout W^T", 0, 1, N, C, OC, OC, OC, C, 0},
      {"conv1d backward: dW += inp^T dout", 1, 0, C, OC, N, C, OC, OC, 1},
      {"attention: q k^T (ld 3C)", 0, 1, T, T, HS, C3, C3, T, 0},
      {"attention: att v (out ld C)", 0, 0, T, HS, T, T, C3, C, 0},
      {"attention backward: dv = att^T dout_h", 1, 0, T, HS, T, T, C, C3, 0},
      {"attention backward: dk = dpre^T q", 1, 0, T, HS, T, T, C3, C3, 0},
  };
  dt_rng_t r;
  dt_rng_seed(&r, 3);
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    int M = cs[c].M, Nn = cs[c].Nn, K = cs[c].K;
    size_t na = (size_t)(cs[c].ta ? K : M) * cs[c].lda, nb = (size_t)(cs[c].tb ? Nn : K) * cs[c].ldb,
           nc = (size_t)M * cs[c].ldc;
    float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *Cf = malloc(nc * sizeof *Cf);
    double *Cd = malloc(nc * sizeof *Cd);
    for (size_t i = 0; i < na; i++) A[i] = (float)(dt_rng_uniform(&r) - 0.5);
    for (size_t i = 0; i < nb; i++) B[i] = (float)(dt_rng_uniform(&r) - 0.5);
    for (size_t i = 0; i < nc; i++) Cd[i] = Cf[i] = (float)(dt_rng_uniform(&r) - 0.5);
    dt_cuda_gemm_t g = dt_cuda_gemm_rowmajor(cs[c].ta, cs[c].tb, M, Nn, K);
    colmajor_sgemm(g.op_first, g.op_second, g.m, g.n, g.k, 0.75f, B, cs[c].ldb, A, cs[c].lda, cs[c].beta, Cf,
                   cs[c].ldc);
    rowmajor_ref(cs[c].ta, cs[c].tb, M, Nn, K, 0.75, A, cs[c].lda, B, cs[c].ldb, cs[c].beta, Cd, cs[c].ldc);
    double worst = 0; /* every element, including the gaps between rows the product must not touch */
    for (size_t i = 0; i < nc; i++) worst = fmax(worst, fabs(Cf[i] - Cd[i]));
    cr_expect(worst < 1e-5, "%s: max difference %g", cs[c].what, worst);
    free(A);
    free(B);
    free(Cf);
    free(Cd);
  }
  /* and the mapping can fail: without the swap the forward case is wrong */
  float A[N * C], B[OC * C], Cf[N * OC] = {0};
  double Cd[N * OC] = {0};
  for (int i = 0; i < N * C; i++) A[i] = (float)(dt_rng_uniform(&r) - 0.5);
  for (int i = 0; i < OC * C; i++) B[i] = (float)(dt_rng_uniform(&r) - 0.5);
  colmajor_sgemm(0, 1, N, OC, C, 1.0f, A, C, B, C, 0.0f, Cf, OC); /* naive: row-major args passed straight */
  rowmajor_ref(0, 1, N, OC, C, 1.0, A, C, B, C, 0.0, Cd, OC);
  double worst = 0;
  for (int i = 0; i < N * OC; i++) worst = fmax(worst, fabs(Cf[i] - Cd[i]));
  cr_expect(worst > 1e-3, "the unswapped call should differ (max difference %g)", worst);
}
