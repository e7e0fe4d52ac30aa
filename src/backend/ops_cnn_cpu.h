/* Convolutional-network layer kernels on the CPU (issue #25): conv2d, batch normalisation, ReLU,
 * max / average / global average pooling. The same conventions as ops_cpu.h: <layer>_forward /
 * <layer>_backward pairs, outputs first; PARAMETER gradients ACCUMULATE (dweight += ...),
 * ACTIVATION gradients are WRITTEN (dinp = ..., previous contents ignored).
 *
 * Layout: images are NCHW row-major float (B images, C channels, H x W), like PyTorch. Weights in
 * PyTorch's layouts: conv2d (OC, C, KH, KW), batch norm (C). The linear layer, the residual add and
 * the softmax cross-entropy are ops_cpu.h's dt_matmul_*, dt_residual_forward, dt_crossentropy_*.
 *
 * Output sizes: OH = (H + 2 pad - KH) / stride + 1, OW likewise (dt_conv_out). Pooling pads with
 * -inf (max) or zeros counted in the divisor (average: PyTorch's count_include_pad = True).
 *
 * Batch normalisation is split where synchronised batch norm all-reduces over data-parallel
 * ranks (the model does the all-reduce between the pieces; on one rank nothing is reduced):
 *   forward:  stats (per-channel mean and biased variance of this rank's batch)
 *             [combine across ranks] -> running (running statistics) -> forward (normalise)
 *   backward: backward_reduce (per-channel sums of dout and dout * xhat; dweight, dbias)
 *             [all-reduce the sums] -> backward (dinp) */
#ifndef DT_OPS_CNN_CPU_H
#define DT_OPS_CNN_CPU_H

#include <stddef.h>

/* (n + 2 pad - k) / stride + 1: a convolution's or pooling's output size along one axis. */
static inline int dt_conv_out(int n, int k, int stride, int pad) { return (n + 2 * pad - k) / stride + 1; }

/* Floats of scratch dt_conv2d_forward and dt_conv2d_backward need for nthr OpenMP threads with the
 * convolution algorithm chosen now (conv_winograd.h): im2col: each thread's im2col buffer
 * (C*KH*KW, OH*OW) and, for backward, its partial dweight and dbias; Winograd (3x3, stride 1,
 * padding 1, 16+ channels): dt_conv_winograd_scratch_floats. */
size_t dt_conv2d_scratch_floats(int C, int KH, int KW, int OC, int OH, int OW, int stride, int pad, int nthr);

/* out[b,o,y,x] = bias[o] + sum_{c,i,j} weight[o,c,i,j] inp[b,c,y*stride-pad+i,x*stride-pad+j]
 * (zero outside the image). out (B,OC,OH,OW), inp (B,C,H,W), weight (OC,C,KH,KW), bias (OC) or
 * NULL. Images are split over nthr threads; each one's im2col matrix times the weight is one
 * dt_cpu_sgemm (a 1x1 convolution with stride 1 and no padding multiplies the image itself).
 * 3x3 stride-1 padding-1 layers of 16+ channels go to Winograd (conv_winograd.c) unless DT_CONV
 * says im2col. */
void dt_conv2d_forward(float *out, float *scratch, const float *inp, const float *weight, const float *bias, int B,
                       int C, int H, int W, int OC, int KH, int KW, int stride, int pad, int nthr);
/* dinp = d out / d inp ^T dout (if dinp != NULL); dweight += sum_b dout_b col_b^T; dbias += sum of
 * dout over b, y, x (if dbias != NULL). The per-thread partial sums of dweight and dbias are added
 * in thread order: deterministic for a given nthr. */
void dt_conv2d_backward(float *dinp, float *dweight, float *dbias, float *scratch, const float *dout,
                        const float *inp, const float *weight, int B, int C, int H, int W, int OC, int KH, int KW,
                        int stride, int pad, int nthr);

/* Per channel c over its B*HW values: mean[c] and the biased variance var[c] (two passes, double
 * accumulators). inp (B,C,HW). */
void dt_batchnorm_stats(float *mean, float *var, const float *inp, int B, int C, int HW);
/* PyTorch's running statistics: rm = (1 - momentum) rm + momentum mean;
 * rv = (1 - momentum) rv + momentum var * n / (n - 1), n the count behind var (unbiased). */
void dt_batchnorm_running(float *running_mean, float *running_var, const float *mean, const float *var, int C,
                          float momentum, double n);
/* out = (inp - mean[c]) rstd[c] weight[c] + bias[c], rstd[c] = 1 / sqrt(var[c] + eps) (written to
 * rstd when rstd != NULL, for backward); with relu, max(that, 0): a following ReLU fused (its
 * input never stored). Training passes the batch's mean and var, evaluation the running ones.
 * out may alias inp. */
void dt_batchnorm_forward(float *out, float *rstd, const float *inp, const float *mean, const float *var,
                          const float *weight, const float *bias, float eps, int relu, int B, int C, int HW);
/* sdy[c] = sum dout, sdyx[c] = sum dout * xhat with xhat = (inp - mean) rstd (written);
 * dweight[c] += sdyx[c], dbias[c] += sdy[c]. relu_out (or NULL): the fused ReLU's output; dout is
 * then the ReLU's output gradient, taken as 0 where relu_out <= 0 (the ReLU's backward). */
void dt_batchnorm_backward_reduce(float *sdy, float *sdyx, float *dweight, float *dbias, const float *dout,
                                  const float *relu_out, const float *inp, const float *mean, const float *rstd, int B,
                                  int C, int HW);
/* Training-mode batch norm (the statistics depend on the batch of `count` values per channel):
 *   dinp = weight rstd (dout - sdy / count - xhat sdyx / count).
 * With sdy == sdyx == NULL the statistics are constants (evaluation mode): dinp = weight rstd dout.
 * relu_out as for dt_batchnorm_backward_reduce. dinp may alias dout. */
void dt_batchnorm_backward(float *dinp, const float *dout, const float *relu_out, const float *inp, const float *mean,
                           const float *rstd, const float *weight, const float *sdy, const float *sdyx, double count,
                           int B, int C, int HW);

/* out = max(inp, 0); out may alias inp. (n) */
void dt_relu_forward(float *out, const float *inp, size_t n);
/* out = max(a + b, 0): a residual add and the ReLU after it in one pass; out may alias a or b. (n) */
void dt_add_relu_forward(float *out, const float *a, const float *b, size_t n);
/* dinp = dout where out > 0, else 0 (out is the forward's output); dinp may alias dout. */
void dt_relu_backward(float *dinp, const float *dout, const float *out, size_t n);

/* Max pooling, window K x K: out (B,C,OH,OW); idx (B,C,OH,OW) the flat y*W+x of each maximum in
 * its plane (the first one in row-major order on a tie, like PyTorch). */
void dt_maxpool_forward(float *out, int *idx, const float *inp, int B, int C, int H, int W, int K, int stride,
                        int pad);
/* dinp[idx] += dout over each plane, after dinp is zeroed. dinp (B,C,H,W). */
void dt_maxpool_backward(float *dinp, const float *dout, const int *idx, int B, int C, int H, int W, int OH, int OW);
/* Average pooling, window K x K, padding counted in the divisor K*K. */
void dt_avgpool_forward(float *out, const float *inp, int B, int C, int H, int W, int K, int stride, int pad);
void dt_avgpool_backward(float *dinp, const float *dout, int B, int C, int H, int W, int K, int stride, int pad);
/* Global average pooling: out[b,c] = mean over the HW values of plane (b,c). out (B,C). */
void dt_global_avgpool_forward(float *out, const float *inp, int B, int C, int HW);
/* dinp[b,c,:] = dout[b,c] / HW. */
void dt_global_avgpool_backward(float *dinp, const float *dout, int B, int C, int HW);

#endif
