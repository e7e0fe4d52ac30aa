/* The image classifiers' layer kernels on the GPU, the twins of src/backend/ops_cnn_cpu.h (same
 * formulas; read it for them) with dt_cu_ in front and the stream last. All pointers are device
 * pointers, NCHW images. The convolution's products are cuBLAS (backend_cuda_cnn.cu); here are its
 * im2col, col2im, bias and bias-gradient pieces. Every reduction runs in a fixed order (a block per
 * channel or a thread per plane): the results do not change from run to run. Internal (C++). */
#ifndef DT_CU_KERNELS_CNN_H
#define DT_CU_KERNELS_CNN_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "status.h"

/* A convolution's geometry: input C x H x W, K x K window, stride, pad, output OH x OW. */
typedef struct {
  int C, H, W, K, stride, pad, OH, OW;
} dt_cu_conv_t;

/* col (C*K*K, n*OH*OW): the im2col matrix of images [0, n) of inp (n, C, H, W) side by side (image
 * b's output positions are columns b*OH*OW ...), zero outside: one product serves the n images */
dt_status_t dt_cu_im2col(float *col, const float *inp, int n, dt_cu_conv_t g, cudaStream_t s);
/* dinp (n, C, H, W) = the sum over each pixel's window positions of col's entries (col laid out
 * as dt_cu_im2col's; written; the positions added in (i, j) order as the CPU's col2im adds them) */
dt_status_t dt_cu_col2im(float *dinp, const float *col, int n, dt_cu_conv_t g, cudaStream_t s);
/* dst (C, n, P) = src (n, C, P), and back: an output or its gradient to and from the products'
 * channel-major layout */
dt_status_t dt_cu_nchw_to_cnp(float *dst, const float *src, int n, int C, int P, cudaStream_t s);
dt_status_t dt_cu_cnp_to_nchw(float *dst, const float *src, int n, int C, int P, cudaStream_t s);
/* out (B, OC, P) += bias[oc] */
dt_status_t dt_cu_bias_nchw(float *out, const float *bias, int B, int OC, int P, cudaStream_t s);
/* dbias[oc] += the sum of dout (B, OC, P) over b and p */
dt_status_t dt_cu_bias_nchw_backward(float *dbias, const float *dout, int B, int OC, int P, cudaStream_t s);

dt_status_t dt_cu_bn_stats(float *mean, float *var, const float *inp, int B, int C, int HW, cudaStream_t s);
dt_status_t dt_cu_bn_running(float *running_mean, float *running_var, const float *mean, const float *var, int C,
                             float momentum, double n, cudaStream_t s);
dt_status_t dt_cu_bn_forward(float *out, float *rstd, const float *inp, const float *mean, const float *var,
                             const float *weight, const float *bias, float eps, int relu, int B, int C, int HW,
                             cudaStream_t s);
dt_status_t dt_cu_bn_backward_reduce(float *sdy, float *sdyx, float *dweight, float *dbias, const float *dout,
                                     const float *relu_out, const float *inp, const float *mean, const float *rstd,
                                     int B, int C, int HW, cudaStream_t s);
dt_status_t dt_cu_bn_backward(float *dinp, const float *dout, const float *relu_out, const float *inp,
                              const float *mean, const float *rstd, const float *weight, const float *sdy,
                              const float *sdyx, double count, int B, int C, int HW, cudaStream_t s);
dt_status_t dt_cu_relu_forward(float *out, const float *inp, size_t n, cudaStream_t s);
dt_status_t dt_cu_relu_backward(float *dinp, const float *dout, const float *out, size_t n, cudaStream_t s);
dt_status_t dt_cu_maxpool_forward(float *out, int *idx, const float *inp, int B, int C, int H, int W, int K, int stride,
                                  int pad, cudaStream_t s);
/* gathered per input pixel (its windows in output order, as the CPU adds them): written */
dt_status_t dt_cu_maxpool_backward(float *dinp, const float *dout, const int *idx, int B, int C, int H, int W, int K,
                                   int stride, int pad, cudaStream_t s);
dt_status_t dt_cu_gap_forward(float *out, const float *inp, int B, int C, int HW, cudaStream_t s);
dt_status_t dt_cu_gap_backward(float *dinp, const float *dout, int B, int C, int HW, cudaStream_t s);
/* n SGD steps (kmath.h dt_sgd_update), each gradient times scale first */
dt_status_t dt_cu_sgd(float *p, const float *g, float *m, size_t n, float scale, float lr, float momentum, float wd,
                      int nesterov, cudaStream_t s);

#endif
