/* Launch geometry of the CUDA kernels (cuda/cuda_launch.h), on the CPU: grid sizes stay in
 * [1, DT_CUDA_GRID_MAX], grid-stride loops cover every element exactly once whatever the grid,
 * warp-per-row launches have a warp for every row (or loop), row blocks are whole warps <= 1024.
 * And the row-major -> cuBLAS column-major gemm mapping: a column-major sgemm written from the
 * BLAS definition, called with dt_cuda_gemm_rowmajor's arguments, must equal a row-major double
 * reference for every (transposition, leading dimension) pattern the CUDA backend uses. And the
 * GPU embedding backward's token buckets: the same bits as the CPU twin in any block order. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_launch.h"
#include "embed_buckets.h"
#include "model.h"
#include "ops_cpu.h"

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

/* The row loop of the warp-per-row kernels (DT_CUDA_FOR_ROWS with the global warp index and the
 * grid's warp count, as kernels.cu's FOR_WARP_ROWS passes them): past 524,280 rows the grid is
 * capped and every row must still be visited exactly once. Before the loop existed, rows past the
 * capped grid's warps were silently skipped (GPT-2 124M's attention softmax at T=1024, B >= 43). */
Test(cuda_launch, warp_rows_loop_covers_rows_past_the_grid_cap) {
  size_t ns[] = {1, 8, 9, 524280, 524281, (size_t)12 * 1024 * 43, (size_t)48 * 25 * 1024 * 8 + 3};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    size_t rows = ns[k], warps = (size_t)dt_cuda_warp_rows_grid(rows, 256) * (256 / DT_CUDA_WARP);
    unsigned char *seen = calloc(rows, 1);
    cr_assert(seen);
    size_t visits = 0;
    for (size_t w = 0; w < warps; w++) DT_CUDA_FOR_ROWS(r, rows, w, warps) {
        cr_assert(r < rows);
        seen[r]++;
        visits++;
      }
    size_t once = 0;
    for (size_t r = 0; r < rows; r++) once += seen[r] == 1;
    cr_expect(visits == rows && once == rows, "rows %zu (%zu warps): %zu visits, %zu rows visited once", rows, warps,
              visits, once);
    if (rows > 524280) cr_expect(warps < rows, "rows %zu: the grid should be capped (%zu warps)", rows, warps);
    free(seen);
  }
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

/* The GPU's embedding backward (cuda/embed_buckets.h + encoder_backward_wte_k): the kernel's order
 * of additions, written out here on the CPU (a bucket per block, in any block order; per channel,
 * the bucket's positions in order), must give exactly the bits of the CPU twin
 * dt_encoder_backward, and the same bits whatever order the blocks run in. */
static void wte_backward_as_kernel(float *dwte, const float *dout, const int *order, const dt_embed_bucket_t *bk,
                                   int nb, int C, int reverse) {
  for (int i = 0; i < nb; i++) {
    dt_embed_bucket_t k = bk[reverse ? nb - 1 - i : i];
    for (int c = 0; c < C; c++) {
      float acc = dwte[(size_t)k.token * C + c];
      for (int p = k.start; p < k.start + k.count; p++) acc += dout[(size_t)order[p] * C + c];
      dwte[(size_t)k.token * C + c] = acc;
    }
  }
}

Test(cuda_launch, embedding_backward_buckets_match_the_cpu_twin_bitwise) {
  enum { B = 3, T = 37, C = 19, V = 50 };
  const int N = B * T;
  dt_rng_t r;
  dt_rng_seed(&r, 11);
  int inp[N], order[N], count[V + 1];
  dt_embed_bucket_t bk[N];
  float *dout = malloc((size_t)N * C * sizeof *dout), *init = malloc((size_t)V * C * sizeof *init);
  float *cpu = malloc((size_t)V * C * sizeof *cpu), *gpu = malloc((size_t)V * C * sizeof *gpu);
  float *gpu2 = malloc((size_t)V * C * sizeof *gpu2), *dwpe = calloc((size_t)T * C, sizeof *dwpe);
  cr_assert(dout && init && cpu && gpu && gpu2 && dwpe);
  for (int i = 0; i < N; i++) inp[i] = (int)(dt_rng_uniform(&r) * 12) * 4 % V; /* repeats; most tokens absent */
  inp[5] = V - 1;
  for (int i = 0; i < N * C; i++) dout[i] = (float)(dt_rng_uniform(&r) - 0.5) * (i % 7 == 0 ? 1e4f : 1.0f);
  for (int i = 0; i < V * C; i++) init[i] = (float)(dt_rng_uniform(&r) - 0.5); /* += onto existing grads */
  int nb = dt_embed_buckets(inp, N, V, count, order, bk);
  /* buckets: distinct tokens in increasing order, positions ascending, every position once */
  int distinct = 0, covered = 0;
  for (int v = 0; v < V; v++) {
    int n = 0;
    for (int i = 0; i < N; i++) n += inp[i] == v;
    distinct += n > 0;
  }
  cr_expect_eq(nb, distinct, "%d buckets for %d distinct tokens", nb, distinct);
  for (int b = 0; b < nb; b++) {
    cr_expect(b == 0 || bk[b].token > bk[b - 1].token);
    cr_expect(bk[b].start == covered, "bucket %d starts at %d, want %d", b, bk[b].start, covered);
    for (int p = bk[b].start; p < bk[b].start + bk[b].count; p++) {
      cr_expect_eq(inp[order[p]], bk[b].token);
      cr_expect(p == bk[b].start || order[p] > order[p - 1], "positions not ascending in bucket %d", b);
    }
    covered += bk[b].count;
  }
  cr_expect_eq(covered, N);
  memcpy(cpu, init, (size_t)V * C * sizeof *cpu);
  memcpy(gpu, init, (size_t)V * C * sizeof *gpu);
  memcpy(gpu2, init, (size_t)V * C * sizeof *gpu2);
  dt_encoder_backward(cpu, dwpe, dout, inp, B, T, C);
  wte_backward_as_kernel(gpu, dout, order, bk, nb, C, 0);
  wte_backward_as_kernel(gpu2, dout, order, bk, nb, C, 1);
  cr_expect(memcmp(cpu, gpu, (size_t)V * C * sizeof *cpu) == 0, "bucket order differs from dt_encoder_backward's bits");
  cr_expect(memcmp(gpu, gpu2, (size_t)V * C * sizeof *gpu) == 0, "the result depends on the order of the blocks");
  /* and the check can fail: summing a bucket first, then adding to the gradient (the old kernel's
   * wpe order) rounds differently on these inputs */
  memcpy(gpu2, init, (size_t)V * C * sizeof *gpu2);
  for (int b = 0; b < nb; b++)
    for (int c = 0; c < C; c++) {
      float s = 0;
      for (int p = bk[b].start; p < bk[b].start + bk[b].count; p++) s += dout[(size_t)order[p] * C + c];
      gpu2[(size_t)bk[b].token * C + c] += s;
    }
  cr_expect(memcmp(cpu, gpu2, (size_t)V * C * sizeof *cpu) != 0, "sum-then-add should round differently");
  free(dout);
  free(init);
  free(cpu);
  free(gpu);
  free(gpu2);
  free(dwpe);
}
