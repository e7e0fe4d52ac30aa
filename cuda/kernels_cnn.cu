/* The image classifiers' layer kernels (kernels_cnn.h), the twins of src/backend/ops_cnn_cpu.c.
 * Elementwise kernels are grid-stride loops; a per-channel reduction is one block per channel
 * (double partial sums in a fixed tree); a per-plane one (global average pooling) one thread per
 * plane. Sums over a pixel's windows (col2im, max pooling's backward) are gathers in the CPU's
 * order: no atomics anywhere. */
#include <math.h>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "kernels_cnn.h"
#include "kmath.h"

#define CNN_RED_BLOCK 256 /* threads of the per-channel reductions (a power of two) */

/* ---- convolution pieces -------------------------------------------------------------------- */

/* col (C*K*K, n*P): column b*P + p of row (c, i, j) is input pixel (c, p's y * stride - pad + i,
 * p's x * stride - pad + j) of image b, 0 outside */
__global__ static void im2col_k(float *col, const float *inp, size_t total, int n, dt_cu_conv_t g) {
  const size_t P = (size_t)g.OH * g.OW, nP = (size_t)n * P;
  DT_CUDA_FOR_N(e, total) {
    size_t r = e / nP, b = e % nP / P, p = e % P;
    int c = (int)(r / ((size_t)g.K * g.K)), i = (int)(r / g.K % g.K), j = (int)(r % g.K);
    int iy = (int)(p / g.OW) * g.stride - g.pad + i, ix = (int)(p % g.OW) * g.stride - g.pad + j;
    col[e] = iy >= 0 && iy < g.H && ix >= 0 && ix < g.W ? inp[((b * g.C + c) * g.H + iy) * g.W + ix] : 0.0f;
  }
}

dt_status_t dt_cu_im2col(float *col, const float *inp, int n, dt_cu_conv_t g, cudaStream_t s) {
  size_t total = (size_t)n * g.C * g.K * g.K * g.OH * g.OW;
  if (total == 0) return DT_OK;
  DT_LAUNCH(im2col_k, dt_cuda_grid(total, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, col, inp, total, n, g);
  return DT_OK;
}

/* The output positions along one axis whose window covers input coordinate v: [*o0, *o1). */
__device__ static void covering(int v, int K, int stride, int pad, int On, int *o0, int *o1) {
  int lo = v + pad - K + 1, hi = v + pad; /* o * stride in [lo, hi] */
  *o0 = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  *o1 = hi < 0 ? 0 : hi / stride + 1;
  if (*o1 > On) *o1 = On;
}

__global__ static void col2im_k(float *dinp, const float *col, size_t total, int n, dt_cu_conv_t g) {
  const size_t P = (size_t)g.OH * g.OW, nP = (size_t)n * P, HW = (size_t)g.H * g.W;
  DT_CUDA_FOR_N(e, total) {
    size_t b = e / ((size_t)g.C * HW);
    int c = (int)(e / HW % g.C), iy = (int)(e % HW / g.W), ix = (int)(e % g.W);
    const float *cb = col + b * P;
    float s = 0.0f;
    for (int i = 0; i < g.K; i++) { /* rows (c, i, j) in order, as the CPU adds them */
      int y = iy + g.pad - i;
      if (y < 0 || y % g.stride || y / g.stride >= g.OH) continue;
      for (int j = 0; j < g.K; j++) {
        int x = ix + g.pad - j;
        if (x < 0 || x % g.stride || x / g.stride >= g.OW) continue;
        s += cb[((size_t)(c * g.K + i) * g.K + j) * nP + (size_t)(y / g.stride) * g.OW + x / g.stride];
      }
    }
    dinp[e] = s;
  }
}

dt_status_t dt_cu_col2im(float *dinp, const float *col, int n, dt_cu_conv_t g, cudaStream_t s) {
  size_t total = (size_t)n * g.C * g.H * g.W;
  if (total == 0) return DT_OK;
  DT_LAUNCH(col2im_k, dt_cuda_grid(total, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dinp, col, total, n, g);
  return DT_OK;
}

/* dst (C, n, P) = src (n, C, P), or back (to_nchw) */
__global__ static void permute_k(float *dst, const float *src, size_t total, int n, int C, int P, int to_nchw) {
  DT_CUDA_FOR_N(e, total) { /* e indexes src */
    size_t p = e % P, a = e / P % (to_nchw ? n : C), z = e / P / (to_nchw ? n : C);
    /* src (z, a, p): (b, c, p) from NCHW, (c, b, p) back */
    dst[(a * (to_nchw ? C : n) + z) * P + p] = src[e];
  }
}

dt_status_t dt_cu_nchw_to_cnp(float *dst, const float *src, int n, int C, int P, cudaStream_t s) {
  size_t total = (size_t)n * C * P;
  if (total == 0) return DT_OK;
  DT_LAUNCH(permute_k, dt_cuda_grid(total, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dst, src, total, n, C, P, 0);
  return DT_OK;
}

dt_status_t dt_cu_cnp_to_nchw(float *dst, const float *src, int n, int C, int P, cudaStream_t s) {
  size_t total = (size_t)n * C * P;
  if (total == 0) return DT_OK;
  DT_LAUNCH(permute_k, dt_cuda_grid(total, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dst, src, total, n, C, P, 1);
  return DT_OK;
}

__global__ static void bias_nchw_k(float *out, const float *bias, size_t n, int OC, int P) {
  DT_CUDA_FOR_N(e, n) out[e] += bias[e / P % OC];
}

dt_status_t dt_cu_bias_nchw(float *out, const float *bias, int B, int OC, int P, cudaStream_t s) {
  size_t n = (size_t)B * OC * P;
  if (n == 0) return DT_OK;
  DT_LAUNCH(bias_nchw_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, out, bias, n, OC, P);
  return DT_OK;
}

/* The block's double sums a[], b[] (b may be NULL) of its threads, in a fixed tree; the totals in
 * a[0], b[0]. */
__device__ static void block_sum2(double *a, double *b) {
  for (int o = CNN_RED_BLOCK / 2; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) {
      a[threadIdx.x] += a[threadIdx.x + o];
      if (b) b[threadIdx.x] += b[threadIdx.x + o];
    }
    __syncthreads();
  }
}

/* one block per channel: its B planes of P values */
__global__ static void channel_sum_k(float *dst, const float *src, int B, int C, int P) {
  __shared__ double a[CNN_RED_BLOCK];
  const int c = blockIdx.x;
  double s = 0.0;
  for (size_t k = threadIdx.x; k < (size_t)B * P; k += CNN_RED_BLOCK) s += src[((k / P) * C + c) * P + k % P];
  a[threadIdx.x] = s;
  __syncthreads();
  block_sum2(a, NULL);
  if (threadIdx.x == 0) dst[c] += (float)a[0];
}

dt_status_t dt_cu_bias_nchw_backward(float *dbias, const float *dout, int B, int OC, int P, cudaStream_t s) {
  if (OC == 0) return DT_OK;
  DT_LAUNCH(channel_sum_k, OC, CNN_RED_BLOCK, 0, s, dbias, dout, B, OC, P);
  return DT_OK;
}

/* ---- batch normalisation ------------------------------------------------------------------- */

__global__ static void bn_stats_k(float *mean, float *var, const float *inp, int B, int C, int HW) {
  __shared__ double a[CNN_RED_BLOCK];
  const int c = blockIdx.x;
  const size_t n = (size_t)B * HW;
  double s = 0.0;
  for (size_t k = threadIdx.x; k < n; k += CNN_RED_BLOCK) s += inp[((k / HW) * C + c) * HW + k % HW];
  a[threadIdx.x] = s;
  __syncthreads();
  block_sum2(a, NULL);
  const double m = a[0] / (double)n; /* every thread reads it before anyone writes a[] again */
  __syncthreads();
  double s2 = 0.0;
  for (size_t k = threadIdx.x; k < n; k += CNN_RED_BLOCK) {
    double d = inp[((k / HW) * C + c) * HW + k % HW] - m;
    s2 += d * d;
  }
  a[threadIdx.x] = s2;
  __syncthreads();
  block_sum2(a, NULL);
  if (threadIdx.x == 0) mean[c] = (float)m, var[c] = (float)(a[0] / (double)n);
}

dt_status_t dt_cu_bn_stats(float *mean, float *var, const float *inp, int B, int C, int HW, cudaStream_t s) {
  if (C == 0) return DT_OK;
  DT_LAUNCH(bn_stats_k, C, CNN_RED_BLOCK, 0, s, mean, var, inp, B, C, HW);
  return DT_OK;
}

__global__ static void bn_running_k(float *rm, float *rv, const float *mean, const float *var, int C, float momentum,
                                    double unbias) {
  DT_CUDA_FOR_N(c, (size_t)C) {
    rm[c] = (1.0f - momentum) * rm[c] + momentum * mean[c];
    rv[c] = (1.0f - momentum) * rv[c] + momentum * (float)(var[c] * unbias);
  }
}

dt_status_t dt_cu_bn_running(float *running_mean, float *running_var, const float *mean, const float *var, int C,
                             float momentum, double n, cudaStream_t s) {
  if (C == 0) return DT_OK;
  double unbias = n > 1 ? n / (n - 1) : 1.0;
  DT_LAUNCH(bn_running_k, dt_cuda_grid((size_t)C, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, running_mean, running_var, mean,
            var, C, momentum, unbias);
  return DT_OK;
}

__global__ static void bn_forward_k(float *out, float *rstd, const float *inp, const float *mean, const float *var,
                                    const float *weight, const float *bias, float eps, int relu, size_t n, int C,
                                    int HW) {
  DT_CUDA_FOR_N(e, n) {
    int c = (int)(e / HW % C);
    float r = 1.0f / sqrtf(var[c] + eps), v = (inp[e] - mean[c]) * (r * weight[c]) + bias[c];
    if (rstd && e < (size_t)C * HW && e % HW == 0) rstd[c] = r;
    out[e] = relu ? (v > 0.0f ? v : 0.0f) : v;
  }
}

dt_status_t dt_cu_bn_forward(float *out, float *rstd, const float *inp, const float *mean, const float *var,
                             const float *weight, const float *bias, float eps, int relu, int B, int C, int HW,
                             cudaStream_t s) {
  size_t n = (size_t)B * C * HW;
  if (n == 0) return DT_OK;
  DT_LAUNCH(bn_forward_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, out, rstd, inp, mean, var, weight, bias,
            eps, relu, n, C, HW);
  return DT_OK;
}

/* one block per channel: sums of g and g (x - mean) rstd, g = dout (0 where the fused ReLU's
 * output is not positive) */
__global__ static void bn_backward_reduce_k(float *sdy, float *sdyx, float *dweight, float *dbias, const float *dout,
                                            const float *relu_out, const float *inp, const float *mean,
                                            const float *rstd, int B, int C, int HW) {
  __shared__ double a[CNN_RED_BLOCK], b[CNN_RED_BLOCK];
  const int c = blockIdx.x;
  const float m = mean[c], r = rstd[c];
  double s = 0.0, sx = 0.0;
  for (size_t k = threadIdx.x; k < (size_t)B * HW; k += CNN_RED_BLOCK) {
    size_t e = ((k / HW) * C + c) * HW + k % HW;
    float g = relu_out && !(relu_out[e] > 0.0f) ? 0.0f : dout[e];
    s += g;
    sx += g * ((inp[e] - m) * r);
  }
  a[threadIdx.x] = s, b[threadIdx.x] = sx;
  __syncthreads();
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    sdy[c] = (float)a[0], sdyx[c] = (float)b[0];
    dweight[c] += (float)b[0];
    dbias[c] += (float)a[0];
  }
}

dt_status_t dt_cu_bn_backward_reduce(float *sdy, float *sdyx, float *dweight, float *dbias, const float *dout,
                                     const float *relu_out, const float *inp, const float *mean, const float *rstd,
                                     int B, int C, int HW, cudaStream_t s) {
  if (C == 0) return DT_OK;
  DT_LAUNCH(bn_backward_reduce_k, C, CNN_RED_BLOCK, 0, s, sdy, sdyx, dweight, dbias, dout, relu_out, inp, mean, rstd, B,
            C, HW);
  return DT_OK;
}

__global__ static void bn_backward_k(float *dinp, const float *dout, const float *relu_out, const float *inp,
                                     const float *mean, const float *rstd, const float *weight, const float *sdy,
                                     const float *sdyx, double count, size_t n, int C, int HW) {
  DT_CUDA_FOR_N(e, n) {
    int c = (int)(e / HW % C);
    float a = weight[c] * rstd[c], m = mean[c], r = rstd[c];
    float gm = sdy ? (float)(sdy[c] / count) : 0.0f, gxm = sdyx ? (float)(sdyx[c] / count) : 0.0f;
    float d = relu_out && !(relu_out[e] > 0.0f) ? 0.0f : dout[e];
    dinp[e] = a * (d - gm - (inp[e] - m) * r * gxm);
  }
}

dt_status_t dt_cu_bn_backward(float *dinp, const float *dout, const float *relu_out, const float *inp,
                              const float *mean, const float *rstd, const float *weight, const float *sdy,
                              const float *sdyx, double count, int B, int C, int HW, cudaStream_t s) {
  size_t n = (size_t)B * C * HW;
  if (n == 0) return DT_OK;
  DT_LAUNCH(bn_backward_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dinp, dout, relu_out, inp, mean, rstd,
            weight, sdy, sdyx, count, n, C, HW);
  return DT_OK;
}

/* ---- ReLU, pooling, SGD -------------------------------------------------------------------- */

__global__ static void relu_forward_k(float *out, const float *inp, size_t n) {
  DT_CUDA_FOR_N(i, n) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

__global__ static void relu_backward_k(float *dinp, const float *dout, const float *out, size_t n) {
  DT_CUDA_FOR_N(i, n) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

dt_status_t dt_cu_relu_forward(float *out, const float *inp, size_t n, cudaStream_t s) {
  if (n == 0) return DT_OK;
  DT_LAUNCH(relu_forward_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, out, inp, n);
  return DT_OK;
}

dt_status_t dt_cu_relu_backward(float *dinp, const float *dout, const float *out, size_t n, cudaStream_t s) {
  if (n == 0) return DT_OK;
  DT_LAUNCH(relu_backward_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dinp, dout, out, n);
  return DT_OK;
}

/* one thread per output: kmath.h's window scan, as the CPU's */
__global__ static void maxpool_forward_k(float *out, int *idx, const float *inp, size_t n, int H, int W, int K,
                                         int stride, int pad, int OH, int OW) {
  DT_CUDA_FOR_N(e, n) {
    float best;
    idx[e] = dt_maxpool_at(inp + e / ((size_t)OH * OW) * H * W, H, W, K, stride, pad, (int)(e / OW % OH), (int)(e % OW),
                           &best);
    out[e] = best;
  }
}

dt_status_t dt_cu_maxpool_forward(float *out, int *idx, const float *inp, int B, int C, int H, int W, int K, int stride,
                                  int pad, cudaStream_t s) {
  const int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
  size_t n = (size_t)B * C * OH * OW;
  if (n == 0) return DT_OK;
  DT_LAUNCH(maxpool_forward_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, out, idx, inp, n, H, W, K, stride,
            pad, OH, OW);
  return DT_OK;
}

/* one thread per input pixel: the outputs whose window covers it and chose it, in output order */
__global__ static void maxpool_backward_k(float *dinp, const float *dout, const int *idx, size_t n, int H, int W, int K,
                                          int stride, int pad, int OH, int OW) {
  DT_CUDA_FOR_N(e, n) {
    size_t bc = e / ((size_t)H * W), o = bc * OH * OW;
    int iy = (int)(e / W % H), ix = (int)(e % W), y0, y1, x0, x1, me = iy * W + ix;
    covering(iy, K, stride, pad, OH, &y0, &y1);
    covering(ix, K, stride, pad, OW, &x0, &x1);
    float s = 0.0f;
    for (int y = y0; y < y1; y++)
      for (int x = x0; x < x1; x++)
        if (idx[o + (size_t)y * OW + x] == me) s += dout[o + (size_t)y * OW + x];
    dinp[e] = s;
  }
}

dt_status_t dt_cu_maxpool_backward(float *dinp, const float *dout, const int *idx, int B, int C, int H, int W, int K,
                                   int stride, int pad, cudaStream_t s) {
  const int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
  size_t n = (size_t)B * C * H * W;
  if (n == 0) return DT_OK;
  DT_LAUNCH(maxpool_backward_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dinp, dout, idx, n, H, W, K,
            stride, pad, OH, OW);
  return DT_OK;
}

__global__ static void gap_forward_k(float *out, const float *inp, size_t planes, int HW) {
  DT_CUDA_FOR_N(p, planes) {
    const float *x = inp + p * HW;
    float s = 0.0f;
    for (int i = 0; i < HW; i++) s += x[i];
    out[p] = s / (float)HW;
  }
}

__global__ static void gap_backward_k(float *dinp, const float *dout, size_t n, int HW) {
  DT_CUDA_FOR_N(e, n) dinp[e] = dout[e / HW] / (float)HW;
}

dt_status_t dt_cu_gap_forward(float *out, const float *inp, int B, int C, int HW, cudaStream_t s) {
  size_t planes = (size_t)B * C;
  if (planes == 0) return DT_OK;
  DT_LAUNCH(gap_forward_k, dt_cuda_grid(planes, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, out, inp, planes, HW);
  return DT_OK;
}

dt_status_t dt_cu_gap_backward(float *dinp, const float *dout, int B, int C, int HW, cudaStream_t s) {
  size_t n = (size_t)B * C * HW;
  if (n == 0) return DT_OK;
  DT_LAUNCH(gap_backward_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dinp, dout, n, HW);
  return DT_OK;
}

__global__ static void sgd_k(float *p, const float *g, float *m, size_t n, float scale, float lr, float momentum,
                             float wd, int nesterov) {
  DT_CUDA_FOR_N(i, n) {
    float mi = m[i];
    p[i] = dt_sgd_update(p[i], g[i] * scale, &mi, lr, momentum, wd, nesterov);
    m[i] = mi;
  }
}

dt_status_t dt_cu_sgd(float *p, const float *g, float *m, size_t n, float scale, float lr, float momentum, float wd,
                      int nesterov, cudaStream_t s) {
  if (n == 0) return DT_OK;
  DT_LAUNCH(sgd_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, p, g, m, n, scale, lr, momentum, wd, nesterov);
  return DT_OK;
}
