/* Causal self-attention kernels that keep no (T, T) matrix (kernels.h): training's fused forward
 * and backward (system.attention = flash) and decoding over a key/value cache. The formulas are
 * ops_cpu.h's dt_attention_forward/backward/decode (the CPU twins, flash-attention style too).
 *
 * A warp owns one row: a query (forward, decode, dq) or a key (dk, dv), with the head's dims
 * spread over its lanes (at most DT_CU_ATT_HS_MAX) and every score a warp-summed dot product,
 * the keys (or queries) one after the other. Forward keeps the row's log-sum-exp (B,NH,T);
 * backward recomputes each probability from it, first per query (dq, and D = sum_j p dp, the
 * row's <dout, out>, kept (B,NH,T)), then per key (dk, dv from the queries at or after it): each
 * output element is written by one warp, no atomics, the same result on every run. Not tiled
 * through shared memory and no tensor cores: memory O(B NH T) instead of O(B NH T^2), speed not
 * yet measured on a GPU (docs/gpu-runs.md). */
#include <math.h>

#include "kernels.h"

#include "cuda_check.h"
#include "cuda_launch.h"
#include "warp.h"

#define LANE_DIMS (DT_CU_ATT_HS_MAX / DT_CUDA_WARP)

/* this lane's dims of a head vector x (hs floats) into r[] (0 past hs) */
__device__ static inline void load_lane(float *r, const float *x, int hs) {
  const int lane = threadIdx.x % DT_CUDA_WARP;
  for (int a = 0; a < LANE_DIMS; a++) {
    const int d = lane + a * DT_CUDA_WARP;
    r[a] = d < hs ? x[d] : 0.0f;
  }
}

/* <r, x> over the warp: r this lane's dims (load_lane), x in memory */
__device__ static inline float dot_warp(const float *r, const float *x, int hs) {
  const int lane = threadIdx.x % DT_CUDA_WARP;
  float s = 0.0f;
  for (int a = 0; a < LANE_DIMS; a++) {
    const int d = lane + a * DT_CUDA_WARP;
    if (d < hs) s += r[a] * x[d];
  }
  return warp_sum(s);
}

/* One query q (lane dims) against keys 0..t (rows `ks` floats apart from k and v): an online
 * softmax (the running max and sum, the same in every lane) and acc = sum_j e^(s_j - max) v_j,
 * unnormalised; returns the sum, *mx the max. */
__device__ static float attend(float *acc, float *mx, const float *q, const float *k, const float *v, size_t ks, int t,
                               int hs, float scale) {
  const int lane = threadIdx.x % DT_CUDA_WARP;
  float m = -INFINITY, sum = 0.0f;
  for (int a = 0; a < LANE_DIMS; a++) acc[a] = 0.0f;
  for (int j = 0; j <= t; j++) {
    const float *vj = v + (size_t)j * ks;
    const float sc = dot_warp(q, k + (size_t)j * ks, hs) * scale, m2 = fmaxf(m, sc);
    const float corr = expf(m - m2), p = expf(sc - m2); /* corr = 0 at the first key */
    sum = sum * corr + p;
    for (int a = 0; a < LANE_DIMS; a++) {
      const int d = lane + a * DT_CUDA_WARP;
      if (d < hs) acc[a] = acc[a] * corr + p * vj[d];
    }
    m = m2;
  }
  *mx = m;
  return sum;
}

/* out[d] = acc * mul for this lane's dims */
__device__ static inline void store_lane(float *out, const float *acc, float mul, int hs) {
  const int lane = threadIdx.x % DT_CUDA_WARP;
  for (int a = 0; a < LANE_DIMS; a++) {
    const int d = lane + a * DT_CUDA_WARP;
    if (d < hs) out[d] = acc[a] * mul;
  }
}

/* ---- training: forward and backward over qkv (B,T,3C) ------------------------------------- */

/* row r = (b, h, t), t fastest: the (B,NH,T) order of lse and D */
#define ROW_INDICES(r, T, NH) \
  const int t = (int)((r) % (T)), h = (int)((r) / (T) % (NH)), b = (int)((r) / (T) / (NH))

__global__ static void flash_forward_k(float *out, float *lse, const float *qkv, int T, int C, int NH, float scale,
                                       size_t rows) {
  const int hs = C / NH;
  FOR_WARP_ROWS(r, rows) {
    ROW_INDICES(r, T, NH);
    const float *base = qkv + (size_t)b * T * 3 * C + h * hs;
    float q[LANE_DIMS], acc[LANE_DIMS], mx;
    load_lane(q, base + (size_t)t * 3 * C, hs);
    const float sum = attend(acc, &mx, q, base + C, base + 2 * C, 3 * (size_t)C, t, hs, scale);
    store_lane(out + ((size_t)b * T + t) * C + h * hs, acc, 1.0f / sum, hs);
    if (threadIdx.x % DT_CUDA_WARP == 0) lse[r] = mx + logf(sum);
  }
}

/* per query i: D_i = sum_j p_ij dp_ij (dp_ij = <dout_i, v_j>), then dq_i = scale sum_j p_ij (dp_ij - D_i) k_j */
__global__ static void flash_backward_q_k(float *dqkv, float *dsum, const float *dout, const float *qkv,
                                          const float *lse, int T, int C, int NH, float scale, size_t rows) {
  const int hs = C / NH;
  FOR_WARP_ROWS(r, rows) {
    ROW_INDICES(r, T, NH);
    const float *base = qkv + (size_t)b * T * 3 * C + h * hs, *k = base + C, *v = base + 2 * C;
    const size_t ks = 3 * (size_t)C;
    float q[LANE_DIMS], g[LANE_DIMS], dq[LANE_DIMS];
    load_lane(q, base + (size_t)t * ks, hs);
    load_lane(g, dout + ((size_t)b * T + t) * C + h * hs, hs);
    const float L = lse[r];
    float D = 0.0f;
    for (int j = 0; j <= t; j++)
      D += expf(dot_warp(q, k + (size_t)j * ks, hs) * scale - L) * dot_warp(g, v + (size_t)j * ks, hs);
    for (int a = 0; a < LANE_DIMS; a++) dq[a] = 0.0f;
    for (int j = 0; j <= t; j++) {
      const float *kj = k + (size_t)j * ks;
      const float p = expf(dot_warp(q, kj, hs) * scale - L), ds = p * (dot_warp(g, v + (size_t)j * ks, hs) - D);
      for (int a = 0; a < LANE_DIMS; a++) {
        const int d = threadIdx.x % DT_CUDA_WARP + a * DT_CUDA_WARP;
        if (d < hs) dq[a] += ds * kj[d];
      }
    }
    store_lane(dqkv + ((size_t)b * T + t) * ks + h * hs, dq, scale, hs);
    if (threadIdx.x % DT_CUDA_WARP == 0) dsum[r] = D;
  }
}

/* per key j: dv_j = sum_{i >= j} p_ij dout_i, dk_j = scale sum_{i >= j} p_ij (dp_ij - D_i) q_i */
__global__ static void flash_backward_kv_k(float *dqkv, const float *dsum, const float *dout, const float *qkv,
                                           const float *lse, int T, int C, int NH, float scale, size_t rows) {
  const int hs = C / NH, lane = threadIdx.x % DT_CUDA_WARP;
  FOR_WARP_ROWS(r, rows) {
    ROW_INDICES(r, T, NH); /* t: the key's position */
    const size_t ks = 3 * (size_t)C, row0 = r - (size_t)t; /* (b, h, 0) in lse and D */
    const float *q = qkv + (size_t)b * T * ks + h * hs, *g = dout + (size_t)b * T * C + h * hs;
    float kj[LANE_DIMS], vj[LANE_DIMS], dk[LANE_DIMS], dv[LANE_DIMS];
    load_lane(kj, q + (size_t)t * ks + C, hs);
    load_lane(vj, q + (size_t)t * ks + 2 * C, hs);
    for (int a = 0; a < LANE_DIMS; a++) dk[a] = dv[a] = 0.0f;
    for (int i = t; i < T; i++) {
      const float *qi = q + (size_t)i * ks, *gi = g + (size_t)i * C;
      const float p = expf(dot_warp(kj, qi, hs) * scale - lse[row0 + i]);
      const float ds = p * (dot_warp(vj, gi, hs) - dsum[row0 + i]);
      for (int a = 0; a < LANE_DIMS; a++) {
        const int d = lane + a * DT_CUDA_WARP;
        if (d < hs) {
          dv[a] += p * gi[d];
          dk[a] += ds * qi[d];
        }
      }
    }
    float *dst = dqkv + ((size_t)b * T + t) * ks + h * hs;
    store_lane(dst + C, dk, scale, hs);
    store_lane(dst + 2 * C, dv, 1.0f, hs);
  }
}

static dt_status_t check_hs(int C, int NH, const char *what) {
  if (C / NH > DT_CU_ATT_HS_MAX)
    return DT_ERR(DT_ERR_UNSUPPORTED, "cuda %s: head size %d above %d", what, C / NH, DT_CU_ATT_HS_MAX);
  return DT_OK;
}

dt_status_t dt_cu_flash_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH, cudaStream_t s) {
  DT_TRY(check_hs(C, NH, "flash attention"));
  const size_t rows = (size_t)B * NH * T;
  DT_LAUNCH(flash_forward_k, dt_cuda_warp_rows_grid(rows, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, out, lse, qkv, T, C, NH,
            1.0f / sqrtf((float)(C / NH)), rows);
  return DT_OK;
}

dt_status_t dt_cu_flash_backward(float *dqkv, float *dsum, const float *dout, const float *qkv, const float *lse, int B,
                                 int T, int C, int NH, cudaStream_t s) {
  DT_TRY(check_hs(C, NH, "flash attention"));
  const size_t rows = (size_t)B * NH * T;
  const float scale = 1.0f / sqrtf((float)(C / NH));
  DT_LAUNCH(flash_backward_q_k, dt_cuda_warp_rows_grid(rows, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dqkv, dsum, dout, qkv,
            lse, T, C, NH, scale, rows);
  DT_LAUNCH(flash_backward_kv_k, dt_cuda_warp_rows_grid(rows, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dqkv, dsum, dout,
            qkv, lse, T, C, NH, scale, rows);
  return DT_OK;
}

/* ---- decoding with a key/value cache ------------------------------------------------------- */

__global__ static void kv_append_k(float *kc, float *vc, const float *qkv, int pos, int n, int Tmax, int C, size_t total) {
  DT_CUDA_FOR_N(i, total) { /* i over (b, t, c) of the n new positions */
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % n), b = (int)(bt / n);
    const float *src = qkv + bt * 3 * C;
    size_t dst = ((size_t)b * Tmax + pos + t) * C + c;
    kc[dst] = src[C + c];
    vc[dst] = src[2 * C + c];
  }
}

/* A warp per (b, h, i): query pos + i against the cached keys 0..pos+i */
__global__ static void attention_decode_k(float *out, const float *kc, const float *vc, const float *qkv, int pos,
                                          int n, int Tmax, int C, int NH, float scale, size_t rows) {
  const int hs = C / NH;
  FOR_WARP_ROWS(r, rows) {
    const int i = (int)(r % n), h = (int)(r / n % NH), b = (int)(r / n / NH);
    float q[LANE_DIMS], acc[LANE_DIMS], mx;
    load_lane(q, qkv + ((size_t)b * n + i) * 3 * C + h * hs, hs);
    const size_t kv0 = (size_t)b * Tmax * C + h * hs;
    const float sum = attend(acc, &mx, q, kc + kv0, vc + kv0, (size_t)C, pos + i, hs, scale);
    store_lane(out + ((size_t)b * n + i) * C + h * hs, acc, 1.0f / sum, hs);
  }
}

dt_status_t dt_cu_attention_decode(float *out, float *kc, float *vc, const float *qkv, int B, int pos, int n, int Tmax,
                                   int C, int NH, cudaStream_t s) {
  DT_TRY(check_hs(C, NH, "attention decode"));
  const size_t total = (size_t)B * n * C, rows = (size_t)B * NH * n;
  DT_LAUNCH(kv_append_k, dt_cuda_grid(total, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, kc, vc, qkv, pos, n, Tmax, C, total);
  DT_LAUNCH(attention_decode_k, dt_cuda_warp_rows_grid(rows, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, out, kc, vc, qkv,
            pos, n, Tmax, C, NH, 1.0f / sqrtf((float)(C / NH)), rows);
  return DT_OK;
}
