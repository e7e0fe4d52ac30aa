/* Launch geometry of the CUDA kernels, as plain C so the CPU tests check it (tests/test_cuda_launch.c).
 * Elementwise kernels are grid-stride loops over n elements; row kernels give each row one warp
 * (rows of C <= a few thousand: layernorm, attention softmax) or one block (rows of V: the
 * cross-entropy over the vocabulary). Header-only, no CUDA types. */
#ifndef DT_CUDA_LAUNCH_H
#define DT_CUDA_LAUNCH_H

#include <stddef.h>

#define DT_CUDA_WARP 32
#define DT_CUDA_BLOCK 256        /* threads per block for elementwise and warp-per-row kernels */
#define DT_CUDA_GRID_MAX 65535   /* blocks per launch; grid-stride loops cover the rest */
#define DT_CUDA_SUMSQ_BLOCKS 512 /* partial sums of the gradient sum of squares (fixed: deterministic) */
#define DT_CUDA_COL_CHUNKS 32    /* row chunks of the column reductions (bias, layernorm grads) */

/* Blocks for a grid-stride loop over n elements with `block` threads: ceil(n / block), at least
 * 1 (a launch with 0 blocks is an error) and at most DT_CUDA_GRID_MAX. */
static inline int dt_cuda_grid(size_t n, int block) {
  size_t g = (n + (size_t)block - 1) / (size_t)block;
  if (g < 1) g = 1;
  if (g > DT_CUDA_GRID_MAX) g = DT_CUDA_GRID_MAX;
  return (int)g;
}

/* Blocks for one warp per row: block/32 rows per block, ceil(rows / that), same bounds. Past
 * DT_CUDA_GRID_MAX * block/32 rows (524,280 at 256 threads) the grid is capped and the warps loop
 * over rows, DT_CUDA_FOR_ROWS below. */
static inline int dt_cuda_warp_rows_grid(size_t rows, int block) {
  return dt_cuda_grid(rows, block / DT_CUDA_WARP);
}

/* The row loop of every warp-per-row (and block-per-row) kernel: the unit `id` of `units` in the
 * grid takes rows id, id + units, ... below rows. The kernels pass their global warp index and the
 * grid's warp count; the tests pass the same numbers for a capped grid and count the rows. */
/* Grid-stride loop over [0, n) in a kernel (every elementwise kernel of cuda/kernels*.cu). */
#define DT_CUDA_FOR_N(i, n) \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
#define DT_CUDA_FOR_ROWS(row, rows, id, units) for (size_t row = (id); row < (size_t)(rows); row += (size_t)(units))

/* Threads for one block per row of n columns: n rounded up to a whole warp, between 32 and 1024
 * (wider rows loop). */
static inline int dt_cuda_row_block(size_t n) {
  size_t b = (n + DT_CUDA_WARP - 1) / DT_CUDA_WARP * DT_CUDA_WARP;
  if (b < DT_CUDA_WARP) b = DT_CUDA_WARP;
  if (b > 1024) b = 1024;
  return (int)b;
}

/* Elements a grid-stride loop hands to thread `tid` (0 <= tid < threads): the i = tid + k*threads
 * below n. Used by the tests to show every element is covered exactly once. */
static inline size_t dt_cuda_stride_count(size_t n, size_t threads, size_t tid) {
  return tid < n ? (n - tid + threads - 1) / threads : 0;
}

/* cuBLAS (column-major) arguments for the row-major product of cblas_sgemm(CblasRowMajor, ta,
 * tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc): a row-major matrix is its transpose in
 * column-major order, so compute C^T = op(B)^T op(A)^T, i.e. cublasSgemm(op_first, op_second, m,
 * n, k, alpha, B, ldb, A, lda, beta, C, ldc) with the operands and M, N swapped and the
 * transposition flags kept. op: 0 = CUBLAS_OP_N, 1 = CUBLAS_OP_T. */
typedef struct {
  int op_first, op_second; /* for B and A, in that order */
  int m, n, k;
} dt_cuda_gemm_t;

static inline dt_cuda_gemm_t dt_cuda_gemm_rowmajor(int ta, int tb, int M, int N, int K) {
  dt_cuda_gemm_t g;
  g.op_first = tb;
  g.op_second = ta;
  g.m = N;
  g.n = M;
  g.k = K;
  return g;
}

#endif
