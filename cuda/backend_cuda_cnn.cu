/* The CUDA backend's image-classifier kernels (src/backend/cnn_kernels.h): convolutions as im2col
 * + one cuBLAS product per chunk of images (the chunk's im2col matrices side by side, so the
 * weight gradient sums images and positions in one product), the other layers from kernels_cnn.cu. Everything is queued
 * on the compute stream; the results match the CPU twins to rounding (tests/gpu_parity_cnn.cu). With system.conv =
 * cudnn the convolutions, with system.batchnorm = cudnn batch norm's training passes and with system.pool = cudnn the
 * pooling are cuDNN's (conv_cudnn.h). */
#include <stdlib.h>

#include "dt_build.h"
extern "C" {
#include "cnn_kernels.h"
}
#include "backend_cuda_int.h"
#include "kernels.h"
#include "kernels_cnn.h"
#if DT_CU_CUDNN
#include "conv_cudnn.h"
#endif

/* Floats of scratch a chunk of images may use: the chunk's im2col matrix (C*K*K rows, a column per
 * output position of every image) and its output or output gradient in the products' layout
 * (OC, n*P): up to this many floats (64 MiB) or one image whatever its size. */
#define CONV_SCRATCH_FLOATS ((size_t)16 << 20)

static cudaStream_t S(dt_backend_t *be) { return impl(be)->compute; }

static dt_cu_conv_t geom(int C, int H, int W, int K, int stride, int pad) {
  dt_cu_conv_t g = {C, H, W, K, stride, pad, (H + 2 * pad - K) / stride + 1, (W + 2 * pad - K) / stride + 1};
  return g;
}

/* Images per chunk: as many (ckk + OC) x P slices as CONV_SCRATCH_FLOATS holds, at least 1. */
static int chunk_images(size_t ckk, size_t OC, size_t P) {
  size_t n = CONV_SCRATCH_FLOATS / ((ckk + OC) * P);
  return n < 1 ? 1 : n > ((size_t)1 << 20) ? 1 << 20 : (int)n;
}

static size_t conv_scratch(const dt_backend_t *be, int C, int K, int OC, int OH, int OW, int stride, int pad) {
  (void)be, (void)stride, (void)pad;
  const size_t ckk = (size_t)C * K * K, P = (size_t)OH * OW;
  return (ckk + OC) * P * (size_t)chunk_images(ckk, (size_t)OC, P);
}

/* ---- system.conv, system.batchnorm, system.pool = cudnn ---------------------------------------- */

dt_status_t dt_cu_cudnn_init(dt_backend_t *be) {
#if DT_CU_CUDNN
  return dt_cudnn_open(&impl(be)->cudnn, impl(be)->compute, be->tf32);
#else
  (void)be;
  return DT_ERR(DT_ERR_UNSUPPORTED, "system.conv/batchnorm/pool = cudnn: this build has no cuDNN (configure found no "
                                    "cudnn.h); = own needs none");
#endif
}

void dt_cu_cudnn_print_version(FILE *out) {
#if DT_CU_CUDNN
  dt_cudnn_print_version(out);
#else
  fprintf(out, "cudnn: not in this build (system.conv, system.batchnorm and system.pool = cudnn unavailable)\n");
#endif
}

const char *dt_cu_cudnn_name(const cu_impl_t *im) {
#if DT_CU_CUDNN
  return im->cudnn ? dt_cudnn_version(im->cudnn) : NULL;
#else
  (void)im;
  return NULL;
#endif
}

void dt_cu_cudnn_free(cu_impl_t *im) {
#if DT_CU_CUDNN
  dt_cudnn_close(im->cudnn);
#endif
  im->cudnn = NULL;
}

/* Per chunk of n images: col (ckk, n*P) = im2col, outT (OC, n*P) = W (OC, ckk) col in one
 * product, then outT into the chunk's NCHW output; the bias over the whole batch at the end. */
static dt_status_t conv_forward(dt_backend_t *be, float *out, float *scratch, const float *inp, const float *w,
                                const float *bias, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
  cu_impl_t *im = impl(be);
  const dt_cu_conv_t g = geom(C, H, W, K, stride, pad);
  const int ckk = C * K * K, P = g.OH * g.OW, G = chunk_images((size_t)ckk, (size_t)OC, (size_t)P);
#if DT_CU_CUDNN
  if (be->cudnn_conv) {
    DT_TRY(dt_cudnn_conv_forward(im->cudnn, out, inp, w, B, C, H, W, OC, K, stride, pad));
    return bias ? dt_cu_bias_nchw(out, bias, B, OC, P, S(be)) : DT_OK;
  }
#endif
  for (int b0 = 0; b0 < B; b0 += G) {
    const int n = b0 + G <= B ? G : B - b0, nP = n * P;
    float *col = scratch, *outT = scratch + (size_t)ckk * nP;
    DT_TRY(dt_cu_im2col(col, inp + (size_t)b0 * C * H * W, n, g, S(be)));
    DT_TRY(gemm_lin(im, false, false, OC, nP, ckk, w, ckk, col, nP, 0.0f, outT, nP));
    DT_TRY(dt_cu_cnp_to_nchw(out + (size_t)b0 * OC * P, outT, n, OC, P, S(be)));
  }
  return bias ? dt_cu_bias_nchw(out, bias, B, OC, P, S(be)) : DT_OK;
}

/* Per chunk: col = im2col, dT (OC, n*P) = the chunk's dout in the products' layout, dweight (OC,
 * ckk) += dT col^T (the chunk's images and positions in one sum), then col = W^T dT (the columns
 * are used up) and dinp = col2im(col); dbias += the channel sums of dout */
static dt_status_t conv_backward(dt_backend_t *be, float *dinp, float *dw, float *db, float *scratch,
                                 const float *dout, const float *inp, const float *w, int B, int C, int H, int W,
                                 int OC, int K, int stride, int pad) {
  cu_impl_t *im = impl(be);
  const dt_cu_conv_t g = geom(C, H, W, K, stride, pad);
  const int ckk = C * K * K, P = g.OH * g.OW, G = chunk_images((size_t)ckk, (size_t)OC, (size_t)P);
  const size_t img = (size_t)C * H * W;
#if DT_CU_CUDNN
  if (be->cudnn_conv) {
    DT_TRY(dt_cudnn_conv_backward(im->cudnn, dinp, dw, dout, inp, w, B, C, H, W, OC, K, stride, pad));
    return db ? dt_cu_bias_nchw_backward(db, dout, B, OC, P, S(be)) : DT_OK;
  }
#endif
  for (int b0 = 0; b0 < B; b0 += G) {
    const int n = b0 + G <= B ? G : B - b0, nP = n * P;
    float *col = scratch, *dT = scratch + (size_t)ckk * nP;
    DT_TRY(dt_cu_im2col(col, inp + (size_t)b0 * img, n, g, S(be)));
    DT_TRY(dt_cu_nchw_to_cnp(dT, dout + (size_t)b0 * OC * P, n, OC, P, S(be)));
    DT_TRY(gemm_lin(im, false, true, OC, ckk, nP, dT, nP, col, nP, 1.0f, dw, ckk));
    if (!dinp) continue;
    DT_TRY(gemm_lin(im, true, false, ckk, nP, OC, w, ckk, dT, nP, 0.0f, col, nP));
    DT_TRY(dt_cu_col2im(dinp + (size_t)b0 * img, col, n, g, S(be)));
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
#if DT_CU_CUDNN
/* system.batchnorm = cudnn (cnn.c calls these only then): cuDNN's training passes, its ReLU ours (a
 * launch of its own; cuDNN's fused BN + ReLU is for NHWC 16-bit tensors). In backward the ReLU's
 * mask goes into dout in place first (its last reader). A build without cuDNN has neither (NULL in
 * the table below; system.batchnorm = cudnn fails at init there). */
static dt_status_t bn_train_forward(dt_backend_t *be, float *out, float *mean, float *rstd, float *rm, float *rv,
                                    const float *inp, const float *w, const float *b, float eps, float momentum,
                                    int relu, int B, int C, int HW) {
  DT_TRY(dt_cudnn_bn_forward(impl(be)->cudnn, out, mean, rstd, rm, rv, inp, w, b, eps, momentum, B, C, HW));
  return relu ? dt_cu_relu_forward(out, out, (size_t)B * C * HW, S(be)) : DT_OK;
}
static dt_status_t bn_train_backward(dt_backend_t *be, float *dinp, float *dw, float *db, float *dout,
                                     const float *relu_out, const float *inp, const float *mean, const float *rstd,
                                     const float *w, float eps, int B, int C, int HW) {
  if (relu_out) DT_TRY(dt_cu_relu_backward(dout, dout, relu_out, (size_t)B * C * HW, S(be)));
  return dt_cudnn_bn_backward(impl(be)->cudnn, dinp, dw, db, dout, inp, w, mean, rstd, eps, B, C, HW);
}
/* system.pool = cudnn: max pooling and global average pooling by cuDNN (NULL without it, as above) */
static dt_status_t pool_forward(dt_backend_t *be, float *out, const float *inp, int B, int C, int H, int W, int KH,
                                int KW, int stride, int pad, int avg) {
  return dt_cudnn_pool_forward(impl(be)->cudnn, out, inp, B, C, H, W, KH, KW, stride, pad, avg);
}
static dt_status_t pool_backward(dt_backend_t *be, float *dinp, const float *dout, const float *out, const float *inp,
                                 int B, int C, int H, int W, int KH, int KW, int stride, int pad, int avg) {
  return dt_cudnn_pool_backward(impl(be)->cudnn, dinp, dout, out, inp, B, C, H, W, KH, KW, stride, pad, avg);
}
#else
#define bn_train_forward NULL
#define bn_train_backward NULL
#define pool_forward NULL
#define pool_backward NULL
#endif
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
static dt_status_t add(dt_backend_t *be, float *out, const float *a, const float *b, int relu, size_t n) {
  DT_TRY(dt_cu_residual_forward(out, a, b, n, DT_PREC_FP32, S(be)));
  return relu ? dt_cu_relu_forward(out, out, n, S(be)) : DT_OK; /* two launches: the GPU's step is not this */
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
    conv_scratch,
    conv_forward,
    conv_backward,
    bn_stats,
    bn_running,
    bn_forward,
    bn_backward_reduce,
    bn_backward,
    bn_train_forward,
    bn_train_backward,
    relu_forward,
    relu_backward,
    maxpool_forward,
    maxpool_backward,
    gap_forward,
    gap_backward,
    pool_forward,
    pool_backward,
    add,
    sgd,
    adamw,
};
