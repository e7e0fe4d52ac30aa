/* GPT-2 layer kernels (see kernels.h). Each kernel is a thin loop over the per-element and
 * per-row pieces of src/core/kmath.h, so tests/test_kmath.c checks the arithmetic they run; launch
 * geometry comes from cuda_launch.h (tested on the CPU by tests/test_cuda_launch.c).
 * Elementwise kernels are grid-stride loops; layernorm and the attention softmax give a warp
 * to a row; the cross-entropy gives a block to a row of the vocabulary. */
#include "kernels.h"

#include "cuda_check.h"
#include "cuda_launch.h"
#include "kmath.h"
#include "precision.h"
#include "store.h"
#include "warp.h"


__device__ static inline void warp_merge_softmax(float *mx, float *sum) {
  for (int o = DT_CUDA_WARP / 2; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(FULL_MASK, *mx, o), s2 = __shfl_xor_sync(FULL_MASK, *sum, o);
    dt_softmax_merge(mx, sum, m2, s2);
  }
}


/* ---- encoder ------------------------------------------------------------------------------ */

template <typename S>
__global__ static void encoder_forward_k(S *out, const int *inp, const S *wte, const S *wpe, int T, int C, size_t n,
                                         int prec) {
  DT_CUDA_FOR_N(i, n) {
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % T);
    dt_st(out + i, dt_ld(wte + (size_t)inp[bt] * C + c) + dt_ld(wpe + (size_t)t * C + c), prec);
  }
}

/* One block per token bucket (embed_buckets.h), its threads over channels: each (token, channel)
 * adds its positions' gradients in ascending position, as the CPU twin does: no atomics, the same
 * bits on every run and on both backends. */
template <typename S>
__global__ static void encoder_backward_wte_k(float *dwte, const S *dout, const int *order,
                                              const dt_embed_bucket_t *buckets, int nb, int C) {
  DT_CUDA_FOR_ROWS(b, nb, blockIdx.x, gridDim.x) {
    dt_embed_bucket_t k = buckets[b];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float *d = dwte + (size_t)k.token * C + c;
      float acc = *d;
      for (int p = k.start; p < k.start + k.count; p++) acc += dt_ld(dout + (size_t)order[p] * C + c);
      *d = acc;
    }
  }
}

/* dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in that order (the CPU twin's). */
template <typename S>
__global__ static void encoder_backward_wpe_k(float *dwpe, const S *dout, int B, int T, int C) {
  DT_CUDA_FOR_N(i, (size_t)T * C) {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dt_ld(dout + (size_t)b * T * C + i);
    dwpe[i] = acc;
  }
}

dt_status_t dt_cu_encoder_forward(void *out, const int *inp, const void *wte, const void *wpe, int B, int T, int C,
                                  int prec, cudaStream_t s) {
  size_t n = (size_t)B * T * C;
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(encoder_forward_k<S>, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)out, inp,
                            (const S *)wte, (const S *)wpe, T, C, n, dt_store_prec(prec)));
  return DT_OK;
}

dt_status_t dt_cu_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *order,
                                   const dt_embed_bucket_t *buckets, int nb, int B, int T, int C, int prec,
                                   cudaStream_t s) {
  DT_STORE_SWITCH(prec, S, {
    if (nb > 0)
      DT_LAUNCH(encoder_backward_wte_k<S>, dt_cuda_grid(nb, 1),
                dt_cuda_row_block(C < DT_CUDA_BLOCK ? C : DT_CUDA_BLOCK), 0, s, dwte, (const S *)dout, order, buckets,
                nb, C);
    DT_LAUNCH(encoder_backward_wpe_k<S>, dt_cuda_grid((size_t)T * C, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dwpe,
              (const S *)dout, B, T, C);
  });
  return DT_OK;
}

/* ---- layernorm ---------------------------------------------------------------------------- */

template <typename S>
__global__ static void layernorm_forward_k(S *out, float *mean, float *rstd, const S *inp, const S *w, const S *b,
                                           int N, int C, int prec) {
  int lane = threadIdx.x % DT_CUDA_WARP;
  FOR_WARP_ROWS(row, N) {
    const S *x = inp + row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += DT_CUDA_WARP) s += dt_ld(x + c);
    float m = warp_sum(s) / (float)C;
    float s2 = 0.0f;
    for (int c = lane; c < C; c += DT_CUDA_WARP) s2 += (dt_ld(x + c) - m) * (dt_ld(x + c) - m);
    float r = dt_ln_rstd(warp_sum(s2) / (float)C);
    S *o = out + row * C;
    for (int c = lane; c < C; c += DT_CUDA_WARP)
      dt_st(o + c, dt_ln_apply(dt_ld(x + c), m, r, dt_ld(w + c), dt_ld(b + c)), prec);
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = r;
    }
  }
}

template <typename S>
__global__ static void layernorm_backward_dinp_k(S *dinp, const S *dresid, const S *dout, const S *inp, const S *w,
                                                 const float *mean, const float *rstd, int N, int C, int prec) {
  int lane = threadIdx.x % DT_CUDA_WARP;
  FOR_WARP_ROWS(row, N) {
    const S *x = inp + row * C, *g = dout + row * C;
    float m = mean[row], r = rstd[row], a = 0.0f, bb = 0.0f;
    for (int c = lane; c < C; c += DT_CUDA_WARP) {
      float wg = dt_ld(w + c) * dt_ld(g + c);
      a += wg;
      bb += wg * (dt_ld(x + c) - m) * r;
    }
    float gm = warp_sum(a) / (float)C, gnm = warp_sum(bb) / (float)C;
    S *d = dinp + row * C;
    const S *dr = dresid ? dresid + row * C : NULL;
    for (int c = lane; c < C; c += DT_CUDA_WARP) {
      float v = dt_ln_dinp(dt_ld(x + c), m, r, dt_ld(w + c), dt_ld(g + c), gm, gnm);
      dt_st(d + c, dr ? dt_ld(dr + c) + v : v, prec);
    }
  }
}

/* Column reductions in two passes, deterministic (no atomics): the N rows are cut into
 * DT_CUDA_COL_CHUNKS chunks; a (32 x 8) block of pass 1 owns 32 columns of one chunk (blockIdx.y),
 * its 8 thread rows stride over the chunk's rows and add up in shared memory in a fixed order,
 * and write one partial per column and chunk to scratch (chunk-major); pass 2 adds each column's
 * partials in chunk order into the output. Column groups loop when the grid is capped; the loop
 * bound is the same for the whole block (barriers). */
#define COLS_X 32
#define COLS_Y 8

/* the rows [lo, hi) of chunk k */
__device__ static void chunk_rows(int N, int k, int *lo, int *hi) {
  int per = (N + DT_CUDA_COL_CHUNKS - 1) / DT_CUDA_COL_CHUNKS;
  *lo = k * per < N ? k * per : N;
  *hi = *lo + per < N ? *lo + per : N;
}

/* part (2, chunks, C): dweight's partials, then dbias's */
template <typename S>
__global__ static void layernorm_backward_params_k(float *part, const S *dout, const S *inp, const float *mean,
                                                   const float *rstd, int N, int C) {
  __shared__ float sw[COLS_Y][COLS_X], sb[COLS_Y][COLS_X];
  int lo, hi;
  chunk_rows(N, blockIdx.y, &lo, &hi);
  DT_CUDA_FOR_ROWS(c0, C, (size_t)blockIdx.x * COLS_X, (size_t)gridDim.x * COLS_X) {
    size_t c = c0 + threadIdx.x;
    float aw = 0.0f, ab = 0.0f;
    if (c < (size_t)C)
      for (int i = lo + threadIdx.y; i < hi; i += COLS_Y) {
        float g = dt_ld(dout + (size_t)i * C + c);
        aw += g * (dt_ld(inp + (size_t)i * C + c) - mean[i]) * rstd[i];
        ab += g;
      }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < (size_t)C) {
      for (int y = 1; y < COLS_Y; y++) {
        aw += sw[y][threadIdx.x];
        ab += sb[y][threadIdx.x];
      }
      part[(size_t)blockIdx.y * C + c] = aw;
      part[((size_t)DT_CUDA_COL_CHUNKS + blockIdx.y) * C + c] = ab;
    }
    __syncthreads(); /* the shared rows are written again in the next column group */
  }
}

template <typename S>
__global__ static void col_partial_k(float *part, const S *src, int N, int OC) {
  __shared__ float sh[COLS_Y][COLS_X];
  int lo, hi;
  chunk_rows(N, blockIdx.y, &lo, &hi);
  DT_CUDA_FOR_ROWS(j0, OC, (size_t)blockIdx.x * COLS_X, (size_t)gridDim.x * COLS_X) {
    size_t j = j0 + threadIdx.x;
    float a = 0.0f;
    if (j < (size_t)OC)
      for (int i = lo + threadIdx.y; i < hi; i += COLS_Y) a += dt_ld(src + (size_t)i * OC + j);
    sh[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && j < (size_t)OC) {
      for (int y = 1; y < COLS_Y; y++) a += sh[y][threadIdx.x];
      part[(size_t)blockIdx.y * OC + j] = a;
    }
    __syncthreads();
  }
}

/* dst[j] += sum over chunks k (in order) of part[k * n + j] */
__global__ static void col_finish_k(float *dst, const float *part, int n) {
  DT_CUDA_FOR_N(j, (size_t)n) {
    float a = 0.0f;
    for (int k = 0; k < DT_CUDA_COL_CHUNKS; k++) a += part[(size_t)k * n + j];
    dst[j] += a;
  }
}

static dim3 col_grid(int cols) { return dim3((unsigned)dt_cuda_grid((size_t)cols, COLS_X), DT_CUDA_COL_CHUNKS); }

dt_status_t dt_cu_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                                    const void *bias, int N, int C, int prec, cudaStream_t s) {
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(layernorm_forward_k<S>, dt_cuda_warp_rows_grid(N, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s,
                            (S *)out, mean, rstd, (const S *)inp, (const S *)weight, (const S *)bias, N, C,
                            dt_store_prec(prec)));
  return DT_OK;
}

dt_status_t dt_cu_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dresid, const void *dout,
                                     const void *inp, const void *weight, const float *mean, const float *rstd, int N,
                                     int C, float *scratch, int prec, cudaStream_t s) {
  /* parameter grads first: they read only inputs, and dinp may alias dresid */
  dim3 blk(COLS_X, COLS_Y);
  DT_STORE_SWITCH(prec, S, {
    DT_LAUNCH(layernorm_backward_params_k<S>, col_grid(C), blk, 0, s, scratch, (const S *)dout, (const S *)inp, mean,
              rstd, N, C);
    DT_LAUNCH(col_finish_k, dt_cuda_grid(C, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dweight, scratch, C);
    DT_LAUNCH(col_finish_k, dt_cuda_grid(C, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dbias,
              scratch + (size_t)DT_CUDA_COL_CHUNKS * C, C);
    DT_LAUNCH(layernorm_backward_dinp_k<S>, dt_cuda_warp_rows_grid(N, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)dinp,
              (const S *)dresid, (const S *)dout, (const S *)inp, (const S *)weight, mean, rstd, N, C,
              dt_store_prec(prec));
  });
  return DT_OK;
}

/* ---- matmul helpers ----------------------------------------------------------------------- */

/* out = [resid +] (acc + [bias]) stored as S, the accumulator read from acc32 (float) when given,
 * else from acc (S; out itself for the in-place epilogues); bias, resid may be NULL. The sums in
 * the CPU's order (ops_cpu.h's epilogues): one rounding, at the store. */
template <typename S>
__global__ static void epilogue_k(S *out, const S *acc, const float *acc32, const S *bias, const S *resid, int OC,
                                  size_t n, int prec) {
  DT_CUDA_FOR_N(i, n) {
    float v = acc32 ? acc32[i] : dt_ld(acc + i);
    if (bias) v += dt_ld(bias + i % OC);
    if (resid) v = dt_ld(resid + i) + v;
    dt_st(out + i, v, prec);
  }
}

dt_status_t dt_cu_epilogue(void *out, const void *acc, const float *acc32, const void *bias, const void *resid, int N,
                           int OC, int prec, cudaStream_t s) {
  size_t n = (size_t)N * OC;
  if (n == 0) return DT_OK;
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(epilogue_k<S>, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)out,
                            acc32 ? NULL : (const S *)acc, acc32, (const S *)bias, (const S *)resid, OC, n,
                            dt_store_prec(prec)));
  return DT_OK;
}

dt_status_t dt_cu_add_bias(void *out, const void *bias, int N, int OC, int prec, cudaStream_t s) {
  return dt_cu_epilogue(out, out, NULL, bias, NULL, N, OC, prec, s);
}

dt_status_t dt_cu_col_sum(float *dst, const void *src, int N, int OC, float *scratch, int prec, cudaStream_t s) {
  dim3 blk(COLS_X, COLS_Y);
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(col_partial_k<S>, col_grid(OC), blk, 0, s, scratch, (const S *)src, N, OC));
  DT_LAUNCH(col_finish_k, dt_cuda_grid(OC, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dst, scratch, OC);
  return DT_OK;
}

/* ---- attention softmax -------------------------------------------------------------------- */

__global__ static void softmax_causal_k(float *att, int rows, int T) {
  int lane = threadIdx.x % DT_CUDA_WARP;
  FOR_WARP_ROWS(r, rows) {
    int t = (int)(r % T);
    float *a = att + r * T;
    float mx = -INFINITY, sum = 0.0f;
    for (int j = lane; j <= t; j += DT_CUDA_WARP) dt_softmax_online(&mx, &sum, a[j]);
    warp_merge_softmax(&mx, &sum);
    float inv = 1.0f / sum;
    for (int j = lane; j < T; j += DT_CUDA_WARP) a[j] = j <= t ? expf(a[j] - mx) * inv : 0.0f;
  }
}

__global__ static void softmax_causal_backward_k(float *d, const float *att, int rows, int T) {
  int lane = threadIdx.x % DT_CUDA_WARP;
  FOR_WARP_ROWS(r, rows) {
    int t = (int)(r % T);
    float *dr = d + r * T;
    const float *a = att + r * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += DT_CUDA_WARP) dot += a[j] * dr[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += DT_CUDA_WARP) dr[j] = j <= t ? dt_softmax_bwd(a[j], dr[j], dot) : 0.0f;
  }
}

dt_status_t dt_cu_softmax_causal(float *att, int rows, int T, cudaStream_t s) {
  DT_LAUNCH(softmax_causal_k, dt_cuda_warp_rows_grid(rows, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, att, rows, T);
  return DT_OK;
}

dt_status_t dt_cu_softmax_causal_backward(float *d, const float *att, int rows, int T, cudaStream_t s) {
  DT_LAUNCH(softmax_causal_backward_k, dt_cuda_warp_rows_grid(rows, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, d, att, rows,
            T);
  return DT_OK;
}

/* ---- elementwise -------------------------------------------------------------------------- */

template <typename S>
__global__ static void gelu_forward_k(S *out, const S *inp, size_t n, int prec) {
  DT_CUDA_FOR_N(i, n) dt_st(out + i, dt_gelu(dt_ld(inp + i)), prec);
}

template <typename S>
__global__ static void gelu_backward_k(S *dinp, const S *inp, const S *dout, size_t n, int prec) {
  DT_CUDA_FOR_N(i, n) dt_st(dinp + i, dt_gelu_grad(dt_ld(inp + i)) * dt_ld(dout + i), prec);
}

template <typename S>
__global__ static void residual_k(S *out, const S *a, const S *b, size_t n, int prec) {
  DT_CUDA_FOR_N(i, n) dt_st(out + i, dt_ld(a + i) + dt_ld(b + i), prec);
}

dt_status_t dt_cu_gelu_forward(void *out, const void *inp, size_t n, int prec, cudaStream_t s) {
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(gelu_forward_k<S>, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)out,
                            (const S *)inp, n, dt_store_prec(prec)));
  return DT_OK;
}

dt_status_t dt_cu_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, int prec, cudaStream_t s) {
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(gelu_backward_k<S>, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)dinp,
                            (const S *)inp, (const S *)dout, n, dt_store_prec(prec)));
  return DT_OK;
}

/* storage-precision rounding (precision.h): dst = round(src), dst == src allowed; with DT_STORE16
 * dst (16-bit) gets the rounded values of the float src (the weights' working copy) */
template <typename S>
__global__ static void round_k(S *dst, const float *src, size_t n, int prec) {
  DT_CUDA_FOR_N(i, n) dt_st(dst + i, src[i], prec);
}

dt_status_t dt_cu_round_copy(void *dst, const float *src, size_t n, int prec, cudaStream_t s) {
  if (prec == DT_PREC_FP32 && dst == src) return DT_OK;
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(round_k<S>, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)dst, src, n,
                            dt_store_prec(prec)));
  return DT_OK;
}

__global__ static void divide_k(float *x, size_t n, float d) { DT_CUDA_FOR_N(i, n) x[i] /= d; }

dt_status_t dt_cu_divide(float *x, size_t n, float d, cudaStream_t s) {
  if (n == 0) return DT_OK;
  DT_LAUNCH(divide_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, x, n, d);
  return DT_OK;
}

dt_status_t dt_cu_residual_forward(void *out, const void *a, const void *b, size_t n, int prec, cudaStream_t s) {
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(residual_k<S>, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)out,
                            (const S *)a, (const S *)b, n, dt_store_prec(prec)));
  return DT_OK;
}

/* ---- softmax + cross-entropy over the vocabulary ------------------------------------------ */

template <typename S>
__global__ static void crossentropy_forward_k(float *losses, float *lse, const S *logits, const int *targets, int N,
                                              int V, int Vp) {
  __shared__ float smx[1024 / DT_CUDA_WARP], ssum[1024 / DT_CUDA_WARP];
  int warp = threadIdx.x / DT_CUDA_WARP, lane = threadIdx.x % DT_CUDA_WARP, nw = blockDim.x / DT_CUDA_WARP;
  DT_CUDA_FOR_ROWS(i, N, blockIdx.x, gridDim.x) { /* a block per row */
    const S *z = logits + i * Vp;
    float mx = -INFINITY, sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) dt_softmax_online(&mx, &sum, dt_ld(z + v));
    warp_merge_softmax(&mx, &sum);
    if (lane == 0) {
      smx[warp] = mx;
      ssum[warp] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = smx[0], s = ssum[0];
      for (int w = 1; w < nw; w++) dt_softmax_merge(&m, &s, smx[w], ssum[w]);
      float l = dt_softmax_lse(m, s);
      lse[i] = l;
      losses[i] = l - dt_ld(z + targets[i]);
    }
    __syncthreads(); /* smx, ssum are written again for the next row */
  }
}

template <typename S>
__global__ static void crossentropy_backward_k(S *dlogits, const S *logits, const float *lse, const int *targets,
                                               float dloss, int V, int Vp, int v0, size_t n, int prec) {
  DT_CUDA_FOR_N(k, n) {
    size_t i = k / Vp;
    int v = (int)(k % Vp);
    dt_st(dlogits + k, v < V ? dt_ce_dlogit(dt_ld(logits + k), lse[i], v + v0 == targets[i], dloss) : 0.0f, prec);
  }
}

/* *acc += (float)((the sum of losses[0, N)) / N), summed in double by one block in a fixed order
 * (deterministic) */
__global__ static void loss_mean_add_k(double *acc, const float *losses, int N) {
  __shared__ double sh[DT_CUDA_BLOCK];
  double a = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) a += losses[i];
  sh[threadIdx.x] = a;
  __syncthreads();
  for (int o = DT_CUDA_BLOCK / 2; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) *acc += (float)(sh[0] / N);
}

dt_status_t dt_cu_loss_mean_add(double *loss_sum, const float *losses, int N, cudaStream_t s) {
  if (!loss_sum || N < 1) return DT_OK;
  DT_LAUNCH(loss_mean_add_k, 1, DT_CUDA_BLOCK, 0, s, loss_sum, losses, N);
  return DT_OK;
}

dt_status_t dt_cu_crossentropy_forward(float *losses, float *lse, const void *logits, const int *targets, int N, int V,
                                       int Vp, double *loss_sum, int prec, cudaStream_t s) {
  if (N < 1) return DT_OK;
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(crossentropy_forward_k<S>, dt_cuda_grid(N, 1), dt_cuda_row_block(V), 0, s, losses, lse,
                            (const S *)logits, targets, N, V, Vp));
  return dt_cu_loss_mean_add(loss_sum, losses, N, s);
}

dt_status_t dt_cu_crossentropy_backward(void *dlogits, const void *logits, const float *lse, const int *targets,
                                        float dloss, int N, int V, int Vp, int v0, int prec, cudaStream_t s) {
  size_t n = (size_t)N * Vp;
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(crossentropy_backward_k<S>, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s,
                            (S *)dlogits, (const S *)logits, lse, targets, dloss, V, Vp, v0, n, dt_store_prec(prec)));
  return DT_OK;
}

/* ---- optimizer and gradient norm ---------------------------------------------------------- */

__global__ static void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                               float beta2, float eps, float wd, float bc1, float bc2, float gscale) {
  DT_CUDA_FOR_N(i, n) {
    float mi = m[i], vi = v[i];
    p[i] = dt_adamw_update(p[i], g[i] * gscale, &mi, &vi, lr, beta1, beta2, eps, wd, bc1, bc2);
    m[i] = mi;
    v[i] = vi;
  }
}

dt_status_t dt_cu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                        float eps, float wd, float bc1, float bc2, float gscale, cudaStream_t s) {
  if (n == 0) return DT_OK;
  DT_LAUNCH(adamw_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1,
            bc2, gscale);
  return DT_OK;
}

/* the segment of arena offset a: the first k with ends[k] > a (a < ends[nseg - 1]) */
__device__ static inline int segment_of(const size_t *ends, int nseg, size_t a) {
  int lo = 0, hi = nseg - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (ends[mid] > a) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

__global__ static void adamw_multi_k(float *p, const float *g, float *m, float *v, size_t lo, size_t n,
                                     const size_t *ends, const unsigned char *kinds, int nseg, float lr, float beta1,
                                     float beta2, float eps, float wd, float bc1, float bc2, float gscale) {
  DT_CUDA_FOR_N(i, n) {
    const size_t a = lo + i;
    const int kind = kinds[segment_of(ends, nseg, a)];
    if (kind == DT_CU_SEG_SKIP) continue;
    float mi = m[i], vi = v[i];
    p[a] = dt_adamw_update(p[a], g[a] * gscale, &mi, &vi, lr, beta1, beta2, eps, kind == DT_CU_SEG_DECAY ? wd : 0.0f,
                           bc1, bc2);
    m[i] = mi;
    v[i] = vi;
  }
}

dt_status_t dt_cu_adamw_multi(float *p, const float *g, float *m, float *v, size_t lo, size_t n, const size_t *ends,
                              const unsigned char *kinds, int nseg, float lr, float beta1, float beta2, float eps,
                              float wd, float bc1, float bc2, float gscale, cudaStream_t s) {
  if (n == 0) return DT_OK;
  if (nseg < 1) return DT_ERR(DT_ERR_ARG, "cuda adamw: no segments for a range of %zu", n);
  DT_LAUNCH(adamw_multi_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, p, g, m, v, lo, n, ends, kinds, nseg,
            lr, beta1, beta2, eps, wd, bc1, bc2, gscale);
  return DT_OK;
}

__global__ static void sumsq_partial_k(double *partial, const float *g, size_t n) {
  __shared__ double sh[DT_CUDA_BLOCK];
  double a = 0.0;
  DT_CUDA_FOR_N(i, n) a += (double)g[i] * g[i];
  sh[threadIdx.x] = a;
  __syncthreads();
  for (int o = DT_CUDA_BLOCK / 2; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

dt_status_t dt_cu_sumsq_partial(double *partial, const float *g, size_t n, cudaStream_t s) {
  /* a small tensor (tensor parallelism sums per tensor) needs fewer blocks: the rest stay 0 */
  size_t nb = (n + DT_CUDA_BLOCK - 1) / DT_CUDA_BLOCK;
  if (nb < DT_CUDA_SUMSQ_BLOCKS) DT_CUDA_CHECK(cudaMemsetAsync(partial, 0, DT_CUDA_SUMSQ_BLOCKS * sizeof(double), s));
  if (nb == 0) return DT_OK;
  DT_LAUNCH(sumsq_partial_k, nb < DT_CUDA_SUMSQ_BLOCKS ? (int)nb : DT_CUDA_SUMSQ_BLOCKS, DT_CUDA_BLOCK, 0, s, partial, g,
            n);
  return DT_OK;
}
