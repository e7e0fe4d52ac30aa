/* Causal self-attention kernels that keep no (T, T) matrix (kernels.h): training's fused forward
 * and backward (system.attention = flash) and decoding over a key/value cache. The formulas are
 * ops_cpu.h's dt_attention_forward/backward/decode (the CPU twins, flash-attention style too).
 *
 * Training: a group of lanes owns one row, a query (forward, dq) or a key (dk, dv), with the
 * head's dims spread over its lanes and every score a group-summed dot product; a block's rows
 * share tiles of keys (or queries) in shared memory, taken in order. Forward keeps the row's
 * log-sum-exp (B,NH,T); backward recomputes each probability from it, first per query (dq, and
 * D = sum_j p dp, the row's <dout, out>, kept (B,NH,T)), then per key (dk, dv from the queries at
 * or after it): each output element is written by one group, no atomics, the same result on
 * every run. fp32 math on the CUDA cores, no tensor cores: memory O(B NH T) instead of O(B NH T^2).
 * Decoding: a warp per query, the keys from the cache one after the other. */
#include <math.h>

#include "kernels.h"

#include "cuda_check.h"
#include "cuda_launch.h"
#include "precision.h"
#include "store.h"
#include "warp.h"

#define LANE_DIMS (DT_CU_ATT_HS_MAX / DT_CUDA_WARP) /* the decoding warp's dims per lane */

/* Activations (qkv, out, dout, dqkv, the key/value cache) are read and written as the storage
 * type S (store.h: floats stored rounded to prec, or 16-bit values); the shared tiles, the
 * registers and the row statistics (lse, D) are floats. */

/* this lane's dims of a head vector x (hs values) into r[] (0 past hs) */
template <typename S>
__device__ static inline void load_lane(float *r, const S *x, int hs) {
  const int lane = threadIdx.x % DT_CUDA_WARP;
  for (int a = 0; a < LANE_DIMS; a++) {
    const int d = lane + a * DT_CUDA_WARP;
    r[a] = d < hs ? dt_ld(x + d) : 0.0f;
  }
}

/* <r, x> over the warp: r this lane's dims (load_lane), x in memory */
template <typename S>
__device__ static inline float dot_warp(const float *r, const S *x, int hs) {
  const int lane = threadIdx.x % DT_CUDA_WARP;
  float s = 0.0f;
  for (int a = 0; a < LANE_DIMS; a++) {
    const int d = lane + a * DT_CUDA_WARP;
    if (d < hs) s += r[a] * dt_ld(x + d);
  }
  return warp_sum(s);
}

/* One query q (lane dims) against keys 0..t (rows `ks` floats apart from k and v): an online
 * softmax (the running max and sum, the same in every lane) and acc = sum_j e^(s_j - max) v_j,
 * unnormalised; returns the sum, *mx the max. */
template <typename S>
__device__ static float attend(float *acc, float *mx, const float *q, const S *k, const S *v, size_t ks, int t, int hs,
                               float scale) {
  const int lane = threadIdx.x % DT_CUDA_WARP;
  float m = -INFINITY, sum = 0.0f;
  for (int a = 0; a < LANE_DIMS; a++) acc[a] = 0.0f;
  for (int j = 0; j <= t; j++) {
    const S *vj = v + (size_t)j * ks;
    const float sc = dot_warp(q, k + (size_t)j * ks, hs) * scale, m2 = fmaxf(m, sc);
    const float corr = expf(m - m2), p = expf(sc - m2); /* corr = 0 at the first key */
    sum = sum * corr + p;
    for (int a = 0; a < LANE_DIMS; a++) {
      const int d = lane + a * DT_CUDA_WARP;
      if (d < hs) acc[a] = acc[a] * corr + p * dt_ld(vj + d);
    }
    m = m2;
  }
  *mx = m;
  return sum;
}

/* out[d] = acc * mul for this lane's dims */
template <typename S>
__device__ static inline void store_lane(S *out, const float *acc, float mul, int hs, int prec) {
  const int lane = threadIdx.x % DT_CUDA_WARP;
  for (int a = 0; a < LANE_DIMS; a++) {
    const int d = lane + a * DT_CUDA_WARP;
    if (d < hs) dt_st(out + d, acc[a] * mul, prec);
  }
}

/* ---- training: forward and backward over qkv (B,T,3C), tiles in shared memory -------------- */

/* A group of G lanes (a power of two, G * ATT_DPL >= hs) owns one row, lane l of the group the
 * dims l, l + G, ...; a block of DT_CUDA_BLOCK threads holds R = DT_CUDA_BLOCK / G consecutive
 * rows of one (b, h) and walks the keys (or queries) in tiles of TK = ATT_TILE / hs rows that the
 * block loads into shared memory together. The keys are taken in order, as the warp-per-row
 * kernels before these did, so each row's online softmax sums in the same order. */
#define ATT_DPL 8       /* head dims per lane */
#define ATT_TILE 4096   /* floats in one shared tile */
#define ATT_TILE_ROWS 256 /* at most this many rows in a tile (small head sizes) */

__host__ __device__ static inline int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ static inline int imax(int a, int b) { return a > b ? a : b; }

static int att_group(int hs) {
  int g = 1;
  while (g * ATT_DPL < hs) g *= 2;
  return g;
}

__device__ static inline float group_sum(float v, int G) {
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

template <typename S>
__device__ static inline void load_group(float *r, const S *x, int gl, int G, int hs) {
  for (int a = 0; a < ATT_DPL; a++) {
    const int d = gl + a * G;
    r[a] = d < hs ? dt_ld(x + d) : 0.0f;
  }
}

/* <r, x> over the group (x: hs floats, in shared memory), in every lane of the group */
__device__ static inline float dot_group(const float *r, const float *x, int gl, int G, int hs) {
  float s = 0.0f;
  for (int a = 0; a < ATT_DPL; a++) {
    const int d = gl + a * G;
    if (d < hs) s += r[a] * x[d];
  }
  return group_sum(s, G);
}

__device__ static inline void axpy_group(float *acc, float p, const float *x, int gl, int G, int hs) {
  for (int a = 0; a < ATT_DPL; a++) {
    const int d = gl + a * G;
    if (d < hs) acc[a] += p * x[d];
  }
}

template <typename S>
__device__ static inline void store_group(S *out, const float *acc, float mul, int gl, int G, int hs, int prec) {
  for (int a = 0; a < ATT_DPL; a++) {
    const int d = gl + a * G;
    if (d < hs) dt_st(out + d, acc[a] * mul, prec);
  }
}

/* rows [r0, r0 + n) of src (hs values each, `stride` apart) into a shared float tile, packed */
template <typename S>
__device__ static inline void tile_load(float *tile, const S *src, size_t stride, int r0, int n, int hs) {
  for (int i = threadIdx.x; i < n * hs; i += blockDim.x) tile[i] = dt_ld(src + (size_t)(r0 + i / hs) * stride + i % hs);
}

/* keys [k0, k0 + nk) of one head into the shared tiles ks and vs (base: the head's q columns of
 * batch row b), between barriers: the block's previous tile is no longer read */
template <typename S>
__device__ static inline void load_kv_tile(float *ks, float *vs, const S *base, int C, int k0, int nk, int hs) {
  __syncthreads();
  tile_load(ks, base + C, 3 * (size_t)C, k0, nk, hs);
  tile_load(vs, base + 2 * C, 3 * (size_t)C, k0, nk, hs);
  __syncthreads();
}

/* The block's (b, h) and first row r0 from its index, this thread's row t and lane gl in it */
#define TILE_INDICES(blk, T, NH, R, G)                                                 \
  const int tiles_ = ((T) + (R) - 1) / (R), r0 = (int)((blk) % tiles_) * (R);           \
  const int h = (int)((blk) / tiles_ % (NH)), b = (int)((blk) / tiles_ / (NH));         \
  const int t = r0 + (int)threadIdx.x / (G), gl = (int)threadIdx.x % (G), live = t < (T)

/* the first and the last row of this thread's warp: bounds of the warp's loops (the shuffles need
 * all of its lanes) */
__device__ static inline int warp_first_row(int r0, int G) {
  return r0 + (int)threadIdx.x / DT_CUDA_WARP * DT_CUDA_WARP / G;
}
__device__ static inline int warp_last_row(int r0, int G) { return warp_first_row(r0, G) + (DT_CUDA_WARP - 1) / G; }

static int att_tile_rows(int hs) { return imin(ATT_TILE / hs, ATT_TILE_ROWS); }

template <typename S>
__global__ static void flash_forward_k(S *out, float *lse, const S *qkv, int T, int C, int NH, int G, int TK,
                                       float scale, int prec, size_t blocks) {
  __shared__ float ks[ATT_TILE], vs[ATT_TILE];
  const int hs = C / NH, R = blockDim.x / G;
  const size_t s3 = 3 * (size_t)C;
  for (size_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    TILE_INDICES(blk, T, NH, R, G);
    const int end = imin(T, r0 + R), t_warp = warp_last_row(r0, G); /* keys 0 .. end - 1 */
    const S *base = qkv + (size_t)b * T * s3 + h * hs;
    float q[ATT_DPL], acc[ATT_DPL], m = -INFINITY, sum = 0.0f;
    load_group(q, base + (size_t)(live ? t : 0) * s3, gl, G, hs);
    for (int a = 0; a < ATT_DPL; a++) acc[a] = 0.0f;
    for (int k0 = 0; k0 < end; k0 += TK) {
      const int nk = imin(TK, end - k0), nw = imin(nk, t_warp - k0 + 1);
      load_kv_tile(ks, vs, base, C, k0, nk, hs);
      for (int j = 0; j < nw; j++) {
        const float sc = dot_group(q, ks + j * hs, gl, G, hs) * scale;
        if (k0 + j > t) continue;
        if (sc > m) { /* a new maximum: rescale what is summed so far (0 at the first key) */
          const float corr = expf(m - sc);
          sum *= corr;
          for (int a = 0; a < ATT_DPL; a++) acc[a] *= corr;
          m = sc;
        }
        const float p = expf(sc - m);
        sum += p;
        axpy_group(acc, p, vs + j * hs, gl, G, hs);
      }
    }
    if (live) {
      store_group(out + ((size_t)b * T + t) * C + h * hs, acc, 1.0f / sum, gl, G, hs, prec);
      if (gl == 0) lse[((size_t)b * NH + h) * T + t] = m + logf(sum);
    }
  }
}

/* per query i: D_i = sum_j p_ij dp_ij (dp_ij = <dout_i, v_j>), then dq_i = scale sum_j p_ij (dp_ij - D_i) k_j:
 * two passes over the key tiles */
template <typename S>
__global__ static void flash_backward_q_k(S *dqkv, float *dsum, const S *dout, const S *qkv, const float *lse, int T,
                                          int C, int NH, int G, int TK, float scale, int prec, size_t blocks) {
  __shared__ float ks[ATT_TILE], vs[ATT_TILE];
  const int hs = C / NH, R = blockDim.x / G;
  const size_t s3 = 3 * (size_t)C;
  for (size_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    TILE_INDICES(blk, T, NH, R, G);
    const int end = imin(T, r0 + R), tc = live ? t : 0, t_warp = warp_last_row(r0, G);
    const S *base = qkv + (size_t)b * T * s3 + h * hs;
    const size_t row = ((size_t)b * NH + h) * T + tc;
    float q[ATT_DPL], g[ATT_DPL], dq[ATT_DPL], D = 0.0f;
    load_group(q, base + (size_t)tc * s3, gl, G, hs);
    load_group(g, dout + ((size_t)b * T + tc) * C + h * hs, gl, G, hs);
    const float L = lse[row];
    for (int a = 0; a < ATT_DPL; a++) dq[a] = 0.0f;
    for (int pass = 0; pass < 2; pass++)
      for (int k0 = 0; k0 < end; k0 += TK) {
        const int nk = imin(TK, end - k0), nw = imin(nk, t_warp - k0 + 1);
        load_kv_tile(ks, vs, base, C, k0, nk, hs);
        for (int j = 0; j < nw; j++) {
          const float p = expf(dot_group(q, ks + j * hs, gl, G, hs) * scale - L);
          const float dp = dot_group(g, vs + j * hs, gl, G, hs);
          if (k0 + j > t) continue;
          if (pass == 0) D += p * dp;
          else axpy_group(dq, p * (dp - D), ks + j * hs, gl, G, hs);
        }
      }
    if (live) {
      store_group(dqkv + ((size_t)b * T + t) * s3 + h * hs, dq, scale, gl, G, hs, prec);
      if (gl == 0) dsum[row] = D;
    }
  }
}

/* per key j: dv_j = sum_{i >= j} p_ij dout_i, dk_j = scale sum_{i >= j} p_ij (dp_ij - D_i) q_i, over
 * tiles of queries (q, dout, lse and D in shared memory) */
template <typename S>
__global__ static void flash_backward_kv_k(S *dqkv, const float *dsum, const S *dout, const S *qkv, const float *lse,
                                           int T, int C, int NH, int G, int TK, float scale, int prec, size_t blocks) {
  __shared__ float qs[ATT_TILE], gs[ATT_TILE], ls[ATT_TILE_ROWS], ds[ATT_TILE_ROWS];
  const int hs = C / NH, R = blockDim.x / G;
  const size_t s3 = 3 * (size_t)C;
  for (size_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    TILE_INDICES(blk, T, NH, R, G); /* t: the key's position */
    const int tc = live ? t : 0, first = warp_first_row(r0, G);
    const size_t row0 = ((size_t)b * NH + h) * T; /* (b, h, 0) in lse and D */
    const S *q = qkv + (size_t)b * T * s3 + h * hs, *gb = dout + (size_t)b * T * C + h * hs;
    float kj[ATT_DPL], vj[ATT_DPL], dk[ATT_DPL], dv[ATT_DPL];
    load_group(kj, q + (size_t)tc * s3 + C, gl, G, hs);
    load_group(vj, q + (size_t)tc * s3 + 2 * C, gl, G, hs);
    for (int a = 0; a < ATT_DPL; a++) dk[a] = dv[a] = 0.0f;
    for (int i0 = r0; i0 < T; i0 += TK) {
      const int ni = imin(TK, T - i0);
      __syncthreads();
      tile_load(qs, q, s3, i0, ni, hs);
      tile_load(gs, gb, (size_t)C, i0, ni, hs);
      for (int i = threadIdx.x; i < ni; i += blockDim.x) {
        ls[i] = lse[row0 + i0 + i];
        ds[i] = dsum[row0 + i0 + i];
      }
      __syncthreads();
      for (int i = imax(0, first - i0); i < ni; i++) {
        const float p = expf(dot_group(kj, qs + i * hs, gl, G, hs) * scale - ls[i]);
        const float dp = dot_group(vj, gs + i * hs, gl, G, hs);
        if (!live || i0 + i < t) continue;
        axpy_group(dv, p, gs + i * hs, gl, G, hs);
        axpy_group(dk, p * (dp - ds[i]), qs + i * hs, gl, G, hs);
      }
    }
    if (live) {
      S *dst = dqkv + ((size_t)b * T + t) * s3 + h * hs;
      store_group(dst + C, dk, scale, gl, G, hs, prec);
      store_group(dst + 2 * C, dv, 1.0f, gl, G, hs, prec);
    }
  }
}

static dt_status_t check_hs(int C, int NH, const char *what) {
  if (C / NH > DT_CU_ATT_HS_MAX)
    return DT_ERR(DT_ERR_UNSUPPORTED, "cuda %s: head size %d above %d", what, C / NH, DT_CU_ATT_HS_MAX);
  return DT_OK;
}

/* blocks of the tiled kernels: B * NH * ceil(T / R) */
static size_t att_blocks(int B, int T, int NH, int G) {
  const int R = DT_CUDA_BLOCK / G;
  return (size_t)B * NH * (size_t)((T + R - 1) / R);
}

static int att_grid(size_t blocks) { return blocks < DT_CUDA_GRID_MAX ? (int)blocks : DT_CUDA_GRID_MAX; }

dt_status_t dt_cu_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int prec,
                                cudaStream_t s) {
  DT_TRY(check_hs(C, NH, "flash attention"));
  const int hs = C / NH, G = att_group(hs);
  const size_t blocks = att_blocks(B, T, NH, G);
  DT_STORE_SWITCH(prec, S,
                  DT_LAUNCH(flash_forward_k<S>, att_grid(blocks), DT_CUDA_BLOCK, 0, s, (S *)out, lse, (const S *)qkv, T,
                            C, NH, G, att_tile_rows(hs), 1.0f / sqrtf((float)hs), dt_store_prec(prec), blocks));
  return DT_OK;
}

dt_status_t dt_cu_flash_backward(void *dqkv, float *dsum, const void *dout, const void *qkv, const float *lse, int B,
                                 int T, int C, int NH, int prec, cudaStream_t s) {
  DT_TRY(check_hs(C, NH, "flash attention"));
  const int hs = C / NH, G = att_group(hs), TK = att_tile_rows(hs), p = dt_store_prec(prec);
  const size_t blocks = att_blocks(B, T, NH, G);
  const float scale = 1.0f / sqrtf((float)hs);
  DT_STORE_SWITCH(prec, S, {
    DT_LAUNCH(flash_backward_q_k<S>, att_grid(blocks), DT_CUDA_BLOCK, 0, s, (S *)dqkv, dsum, (const S *)dout,
              (const S *)qkv, lse, T, C, NH, G, TK, scale, p, blocks);
    DT_LAUNCH(flash_backward_kv_k<S>, att_grid(blocks), DT_CUDA_BLOCK, 0, s, (S *)dqkv, dsum, (const S *)dout,
              (const S *)qkv, lse, T, C, NH, G, TK, scale, p, blocks);
  });
  return DT_OK;
}

/* ---- decoding with a key/value cache ------------------------------------------------------- */

/* a copy: the cache holds the values of qkv as they are stored (a float store at fp32: exact) */
template <typename S>
__global__ static void kv_append_k(S *kc, S *vc, const S *qkv, int pos, int n, int Tmax, int C, size_t total) {
  DT_CUDA_FOR_N(i, total) { /* i over (b, t, c) of the n new positions */
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % n), b = (int)(bt / n);
    const S *src = qkv + bt * 3 * C;
    size_t dst = ((size_t)b * Tmax + pos + t) * C + c;
    dt_st(kc + dst, dt_ld(src + C + c), DT_PREC_FP32);
    dt_st(vc + dst, dt_ld(src + 2 * C + c), DT_PREC_FP32);
  }
}

/* A warp per (b, h, i): query pos + i against the cached keys 0..pos+i */
template <typename S>
__global__ static void attention_decode_k(S *out, const S *kc, const S *vc, const S *qkv, int pos, int n, int Tmax,
                                          int C, int NH, float scale, int prec, size_t rows) {
  const int hs = C / NH;
  FOR_WARP_ROWS(r, rows) {
    const int i = (int)(r % n), h = (int)(r / n % NH), b = (int)(r / n / NH);
    float q[LANE_DIMS], acc[LANE_DIMS], mx;
    load_lane(q, qkv + ((size_t)b * n + i) * 3 * C + h * hs, hs);
    const size_t kv0 = (size_t)b * Tmax * C + h * hs;
    const float sum = attend(acc, &mx, q, kc + kv0, vc + kv0, (size_t)C, pos + i, hs, scale);
    store_lane(out + ((size_t)b * n + i) * C + h * hs, acc, 1.0f / sum, hs, prec);
  }
}

dt_status_t dt_cu_attention_decode(void *out, void *kc, void *vc, const void *qkv, int B, int pos, int n, int Tmax,
                                   int C, int NH, int prec, cudaStream_t s) {
  DT_TRY(check_hs(C, NH, "attention decode"));
  const size_t total = (size_t)B * n * C, rows = (size_t)B * NH * n;
  DT_STORE_SWITCH(prec, S, {
    DT_LAUNCH(kv_append_k<S>, dt_cuda_grid(total, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)kc, (S *)vc,
              (const S *)qkv, pos, n, Tmax, C, total);
    DT_LAUNCH(attention_decode_k<S>, dt_cuda_warp_rows_grid(rows, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (S *)out,
              (const S *)kc, (const S *)vc, (const S *)qkv, pos, n, Tmax, C, NH, 1.0f / sqrtf((float)(C / NH)),
              dt_store_prec(prec), rows);
  });
  return DT_OK;
}
