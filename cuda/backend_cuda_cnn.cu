/* The CUDA backend's image-classifier kernels (src/backend/cnn_kernels.h): convolutions as im2col
 * + cuBLAS products over chunks of images (a 1x1 convolution with stride 1 multiplies the images
 * themselves), the other layers from kernels_cnn.cu. Everything is queued on the compute stream;
 * the results match the CPU twins to rounding (tests/gpu_parity_cnn.cu). Not yet cuDNN. */
#include <stdlib.h>

#include "dt_build.h"
extern "C" {
#include "cnn_kernels.h"
}
#include "backend_cuda_int.h"
#include "kernels.h"
#include "kernels_cnn.h"

/* Floats of im2col matrices a chunk may hold: chunks of images share one product call, up to
 * this many floats of scratch (64 MiB) or one image whatever its size. */
#define CONV_SCRATCH_FLOATS ((size_t)16 << 20)

static cudaStream_t S(dt_backend_t *be) { return impl(be)->compute; }

static dt_cu_conv_t geom(int C, int H, int W, int K, int stride, int pad) {
  dt_cu_conv_t g = {C, H, W, K, stride, pad, (H + 2 * pad - K) / stride + 1, (W + 2 * pad - K) / stride + 1};
  return g;
}

static int pointwise(const dt_cu_conv_t *g) { return g->K == 1 && g->stride == 1 && g->pad == 0; }

/* Images per chunk: as many im2col matrices (ckk x P) as CONV_SCRATCH_FLOATS holds, at least 1. */
static int chunk_images(size_t ckk, size_t P) {
  size_t n = CONV_SCRATCH_FLOATS / (ckk * P);
  return n < 1 ? 1 : n > ((size_t)1 << 20) ? 1 << 20 : (int)n;
}

static size_t conv_scratch(const dt_backend_t *be, int C, int K, int OC, int OH, int OW) {
  (void)be, (void)OC;
  size_t one = (size_t)C * K * K * OH * OW;
  return one * (size_t)chunk_images((size_t)C * K * K, (size_t)OH * OW);
}

/* out_b (OC, P) = W (OC, ckk) col_b (ckk, P) [+ bias] for every image: one strided batched
 * product per chunk (the weight's stride 0) */
static dt_status_t conv_forward(dt_backend_t *be, float *out, float *scratch, const float *inp, const float *w,
                                const float *bias, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
  cu_impl_t *im = impl(be);
  const dt_cu_conv_t g = geom(C, H, W, K, stride, pad);
  const int ckk = C * K * K, P = g.OH * g.OW, G = chunk_images((size_t)ckk, (size_t)P);
  for (int b0 = 0; b0 < B; b0 += G) {
    const int n = b0 + G <= B ? G : B - b0;
    const float *col = inp + (size_t)b0 * C * H * W;
    if (!pointwise(&g)) {
      DT_TRY(dt_cu_im2col(scratch, col, n, g, S(be)));
      col = scratch;
    }
    DT_TRY(gemm_rm_batched(im->blas, false, false, OC, P, ckk, 1.0f, w, ckk, 0, col, P, (long long)ckk * P, 0.0f,
                           out + (size_t)b0 * OC * P, P, (long long)OC * P, n));
  }
  return bias ? dt_cu_bias_nchw(out, bias, B, OC, P, S(be)) : DT_OK;
}

/* dweight (OC, ckk) += sum_b dout_b col_b^T (one product per image, in image order); dinp_b =
 * col2im(W^T dout_b) (batched per chunk); dbias += the channel sums of dout */
static dt_status_t conv_backward(dt_backend_t *be, float *dinp, float *dw, float *db, float *scratch,
                                 const float *dout, const float *inp, const float *w, int B, int C, int H, int W,
                                 int OC, int K, int stride, int pad) {
  cu_impl_t *im = impl(be);
  const dt_cu_conv_t g = geom(C, H, W, K, stride, pad);
  const int ckk = C * K * K, P = g.OH * g.OW, G = chunk_images((size_t)ckk, (size_t)P);
  const size_t img = (size_t)C * H * W;
  for (int b0 = 0; b0 < B; b0 += G) {
    const int n = b0 + G <= B ? G : B - b0;
    const float *col = inp + (size_t)b0 * img, *d = dout + (size_t)b0 * OC * P;
    if (!pointwise(&g)) {
      DT_TRY(dt_cu_im2col(scratch, col, n, g, S(be)));
      col = scratch;
    }
    for (int i = 0; i < n; i++)
      DT_TRY(gemm_rm(im->blas, false, true, OC, ckk, P, 1.0f, d + (size_t)i * OC * P, P, col + (size_t)i * ckk * P, P,
                     1.0f, dw, ckk));
    if (!dinp) continue;
    float *dcol = pointwise(&g) ? dinp + (size_t)b0 * img : scratch; /* the chunk's columns are used up */
    DT_TRY(gemm_rm_batched(im->blas, true, false, ckk, P, OC, 1.0f, w, ckk, 0, d, P, (long long)OC * P, 0.0f, dcol, P,
                           (long long)ckk * P, n));
    if (!pointwise(&g)) DT_TRY(dt_cu_col2im(dinp + (size_t)b0 * img, scratch, n, g, S(be)));
  }
  return db ? dt_cu_bias_nchw_backward(db, dout, B, OC, P, S(be)) : DT_OK;
}

static dt_status_t bn_stats(dt_backend_t *be, float *mean, float *var, const float *inp, int B, int C, int HW) {
  return dt_cu_bn_stats(mean, var, inp, B, C, HW, S(be));
}
static dt_status_t bn_running(dt_backend_t *be, float *rm, float *rv, const float *mean, const float *var, int C,
                              float momentum, double n) {
  return dt_cu_bn_running(rm, rv, mean, var, C, momentum, n, S(be));
}
static dt_status_t bn_forward(dt_backend_t *be, float *out, float *rstd, const float *inp, const float *mean,
                              const float *var, const float *w, const float *b, float eps, int relu, int B, int C,
                              int HW) {
  return dt_cu_bn_forward(out, rstd, inp, mean, var, w, b, eps, relu, B, C, HW, S(be));
}
static dt_status_t bn_backward_reduce(dt_backend_t *be, float *sdy, float *sdyx, float *dw, float *db,
                                      const float *dout, const float *relu_out, const float *inp, const float *mean,
                                      const float *rstd, int B, int C, int HW) {
  return dt_cu_bn_backward_reduce(sdy, sdyx, dw, db, dout, relu_out, inp, mean, rstd, B, C, HW, S(be));
}
static dt_status_t bn_backward(dt_backend_t *be, float *dinp, const float *dout, const float *relu_out,
                               const float *inp, const float *mean, const float *rstd, const float *w, const float *sdy,
                               const float *sdyx, double count, int B, int C, int HW) {
  return dt_cu_bn_backward(dinp, dout, relu_out, inp, mean, rstd, w, sdy, sdyx, count, B, C, HW, S(be));
}
static dt_status_t relu_forward(dt_backend_t *be, float *out, const float *inp, size_t n) {
  return dt_cu_relu_forward(out, inp, n, S(be));
}
static dt_status_t relu_backward(dt_backend_t *be, float *dinp, const float *dout, const float *out, size_t n) {
  return dt_cu_relu_backward(dinp, dout, out, n, S(be));
}
static dt_status_t maxpool_forward(dt_backend_t *be, float *out, int *idx, const float *inp, int B, int C, int H,
                                   int W, int K, int stride, int pad) {
  return dt_cu_maxpool_forward(out, idx, inp, B, C, H, W, K, stride, pad, S(be));
}
static dt_status_t maxpool_backward(dt_backend_t *be, float *dinp, const float *dout, const int *idx, int B, int C,
                                    int H, int W, int K, int stride, int pad) {
  return dt_cu_maxpool_backward(dinp, dout, idx, B, C, H, W, K, stride, pad, S(be));
}
static dt_status_t gap_forward(dt_backend_t *be, float *out, const float *inp, int B, int C, int HW) {
  return dt_cu_gap_forward(out, inp, B, C, HW, S(be));
}
static dt_status_t gap_backward(dt_backend_t *be, float *dinp, const float *dout, int B, int C, int HW) {
  return dt_cu_gap_backward(dinp, dout, B, C, HW, S(be));
}
static dt_status_t add(dt_backend_t *be, float *out, const float *a, const float *b, size_t n) {
  return dt_cu_residual_forward(out, a, b, n, S(be));
}
static dt_status_t sgd(dt_backend_t *be, float *p, const float *g, float *m, size_t n, float scale, float lr,
                       float momentum, float wd, int nesterov) {
  return dt_cu_sgd(p, g, m, n, scale, lr, momentum, wd, nesterov, S(be));
}
static dt_status_t adamw(dt_backend_t *be, float *p, const float *g, float *m, float *v, size_t n, float scale,
                         float lr, float b1, float b2, float eps, float wd, float bc1, float bc2) {
  return dt_cu_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, scale, S(be));
}

extern "C" const dt_cnn_kernels_t dt_cuda_cnn_kernels = {
    conv_scratch,   conv_forward,     conv_backward, bn_stats,    bn_running,    bn_forward,
    bn_backward_reduce, bn_backward,  relu_forward,  relu_backward, maxpool_forward, maxpool_backward,
    gap_forward,    gap_backward,     add,           sgd,         adamw,
};
