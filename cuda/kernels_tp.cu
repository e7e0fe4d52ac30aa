/* Tensor parallelism's pieces of GPT-2 on the GPU (kernels.h, dt_cu_embed_rows .. dt_cu_xent_*):
 * the vocab-parallel embedding's owned rows, the row-parallel projection's bias + residual
 * epilogue, and the vocab-parallel cross-entropy in three pieces that the model all-reduces
 * between (row max, sum of exponentials with the target logit, then lse and losses). The twins
 * are backend_cpu.c's k_* of the same names, with the same formulas; the sums add in another
 * order, so tests/gpu_parity compares them within a tolerance. A block per row for the row
 * reductions, grid-stride loops for the elementwise ones. */
#include <math.h>

#include "kernels.h"

#include "cuda_check.h"
#include "cuda_launch.h"
#include "kmath.h"
#include "precision.h"
#include "store.h"

#define FULL_MASK 0xffffffffu
#define MAX_WARPS (1024 / DT_CUDA_WARP)


/* the block's maximum of v, in every thread (blockDim.x a multiple of the warp) */
__device__ static float block_max(float v, float *sh) {
  int warp = threadIdx.x / DT_CUDA_WARP, lane = threadIdx.x % DT_CUDA_WARP, nw = blockDim.x / DT_CUDA_WARP;
  for (int o = DT_CUDA_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float m = sh[0];
  for (int w = 1; w < nw; w++) m = fmaxf(m, sh[w]);
  __syncthreads(); /* sh is written again by the next call */
  return m;
}

/* the block's sum of v in double, warps in order, in every thread */
__device__ static double block_sum_d(double v, double *sh) {
  int warp = threadIdx.x / DT_CUDA_WARP, lane = threadIdx.x % DT_CUDA_WARP, nw = blockDim.x / DT_CUDA_WARP;
  for (int o = DT_CUDA_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double s = sh[0];
  for (int w = 1; w < nw; w++) s += sh[w];
  __syncthreads();
  return s;
}

template <typename S>
__global__ static void embed_rows_k(S *out, const int *inp, const S *wte, int C, int v0, int nrows, size_t n,
                                    int prec) {
  DT_CUDA_FOR_N(i, n) {
    int r = inp[i / C] - v0;
    dt_st(out + i, r >= 0 && r < nrows ? dt_ld(wte + (size_t)r * C + i % C) : 0.0f, prec);
  }
}

template <typename S>
__global__ static void xent_max_k(float *mx, const S *logits, int N, int nv, int Vp) {
  __shared__ float sh[MAX_WARPS];
  DT_CUDA_FOR_ROWS(i, N, blockIdx.x, gridDim.x) {
    const S *z = logits + i * Vp;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < nv; v += blockDim.x) m = fmaxf(m, dt_ld(z + v));
    m = block_max(m, sh);
    if (threadIdx.x == 0) mx[i] = m;
  }
}

/* each thread's exponentials in float, the block's sum of those in double (the CPU twin: float
 * chunks of 1024 columns, added in double) */
template <typename S>
__global__ static void xent_sumexp_k(double *sum, float *tl, const S *logits, const float *mx, const int *targets,
                                     int N, int nv, int Vp, int v0) {
  __shared__ double sh[MAX_WARPS];
  DT_CUDA_FOR_ROWS(i, N, blockIdx.x, gridDim.x) {
    const S *z = logits + i * Vp;
    const float m = mx[i];
    float cs = 0.0f;
    for (int v = threadIdx.x; v < nv; v += blockDim.x) cs += dt_expf(dt_ld(z + v) - m);
    double s = block_sum_d((double)cs, sh);
    if (threadIdx.x == 0) {
      sum[i] = s;
      int t = targets[i] - v0;
      tl[i] = t >= 0 && t < nv ? dt_ld(z + t) : 0.0f;
    }
  }
}

__global__ static void xent_finish_k(float *lse, float *losses, const double *sum, int N) {
  DT_CUDA_FOR_N(i, (size_t)N) {
    float l = lse[i] + (float)log(sum[i]);
    lse[i] = l;
    losses[i] = l - losses[i];
  }
}

dt_status_t dt_cu_embed_rows(void *out, const int *inp, const void *wte, int N, int C, int v0, int nrows, int prec,
                             cudaStream_t s) {
  size_t n = (size_t)N * C;
  if (n == 0) return DT_OK;
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(embed_rows_k<S>, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)out, inp,
                            (const S *)wte, C, v0, nrows, n, dt_store_prec(prec)));
  return DT_OK;
}

dt_status_t dt_cu_bias_residual(void *out, const void *bias, const void *resid, int N, int OC, int prec,
                                cudaStream_t s) {
  return dt_cu_epilogue(out, out, NULL, bias, resid, N, OC, prec, s); /* kernels.cu */
}

dt_status_t dt_cu_xent_max(float *mx, const void *logits, int N, int nv, int Vp, int prec, cudaStream_t s) {
  if (N < 1) return DT_OK;
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(xent_max_k<S>, dt_cuda_grid(N, 1), dt_cuda_row_block(nv), 0, s, mx, (const S *)logits, N,
                            nv, Vp));
  return DT_OK;
}

dt_status_t dt_cu_xent_sumexp(double *sum, float *tl, const void *logits, const float *mx, const int *targets, int N,
                              int nv, int Vp, int v0, int prec, cudaStream_t s) {
  if (N < 1) return DT_OK;
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(xent_sumexp_k<S>, dt_cuda_grid(N, 1), dt_cuda_row_block(nv), 0, s, sum, tl,
                            (const S *)logits, mx, targets, N, nv, Vp, v0));
  return DT_OK;
}

dt_status_t dt_cu_xent_finish(float *lse, float *losses, const double *sum, int N, double *loss_sum, cudaStream_t s) {
  if (N < 1) return DT_OK;
  DT_LAUNCH(xent_finish_k, dt_cuda_grid(N, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, lse, losses, sum, N);
  return dt_cu_loss_mean_add(loss_sum, losses, N, s);
}
