/* The image classifiers' convolutions (system.conv = cudnn), batch norm's training passes
 * (system.batchnorm = cudnn) and pooling (system.pool = cudnn) through cuDNN; the default `own` is
 * backend_cuda_cnn.cu's im2col + cuBLAS and kernels_cnn.cu's batch norm and pooling. cuDNN is
 * loaded at run time (dlopen of libcudnn.so.9), so a machine without it runs everything else and
 * only these choices fail, with one line; the CUDA emulation links cuda/emu/cudnn.cpp's instead.
 * fp32 NCHW tensors, weights (OC, C, K, K), cross-correlation as PyTorch; the algorithm per shape
 * from cuDNN's heuristics, deterministic ones only (the same result on every run), its workspace
 * grown on demand. Internal (C++). */
#ifndef DT_CU_CONV_CUDNN_H
#define DT_CU_CONV_CUDNN_H

#include <cuda_runtime.h>
#include <stdio.h>

#include "status.h"

typedef struct dt_cudnn dt_cudnn_t;

/* Load cuDNN and make a handle on stream s; tf32: allow TF32 tensor cores (else FMA math). */
dt_status_t dt_cudnn_open(dt_cudnn_t **out, cudaStream_t s, int tf32);
void dt_cudnn_close(dt_cudnn_t *c);
/* one line for `dtrain --version`: cuDNN's version and path, or why it cannot be loaded */
void dt_cudnn_print_version(FILE *out);
/* "cuDNN 9.x.y" after a successful open */
const char *dt_cudnn_version(const dt_cudnn_t *c);

/* out (B, OC, OH, OW) = conv(inp (B, C, H, W), w (OC, C, K, K)), written; no bias */
dt_status_t dt_cudnn_conv_forward(dt_cudnn_t *c, float *out, const float *inp, const float *w, int B, int C, int H,
                                  int W, int OC, int K, int stride, int pad);
/* dw += the weight gradient of dout; dinp (if not NULL) = the input gradient, written */
dt_status_t dt_cudnn_conv_backward(dt_cudnn_t *c, float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, int B, int C, int H, int W, int OC, int K, int stride, int pad);
/* Batch norm in training over this rank's B x HW values per channel (spatial, cuDNN's legacy
 * API): out = (inp - mean) * rstd * w + b, written; mean and rstd = 1 / sqrt(biased variance +
 * eps) saved for backward; the running statistics moved by momentum towards the mean and the
 * unbiased variance. No ReLU: the caller applies it. */
dt_status_t dt_cudnn_bn_forward(dt_cudnn_t *c, float *out, float *mean, float *rstd, float *running_mean,
                                float *running_var, const float *inp, const float *w, const float *b, double eps,
                                double momentum, int B, int C, int HW);
/* dinp = the input gradient (written), dw, db += the parameters' gradients, from dout and the saved
 * mean and rstd */
dt_status_t dt_cudnn_bn_backward(dt_cudnn_t *c, float *dinp, float *dw, float *db, const float *dout,
                                 const float *inp, const float *w, const float *mean, const float *rstd, double eps,
                                 int B, int C, int HW);

/* Pooling over a KH x KW window (stride, zero padding pad) of inp (B, C, H, W) into out (B, C, OH,
 * OW), written: its maximum (avg 0: cuDNN's deterministic max pooling) or its mean, the padding
 * counted (avg 1; a window of the whole plane is global average pooling). */
dt_status_t dt_cudnn_pool_forward(dt_cudnn_t *c, float *out, const float *inp, int B, int C, int H, int W, int KH,
                                  int KW, int stride, int pad, int avg);
/* dinp = the input gradient (written) from dout and the forward's out and inp (max pooling finds
 * each window's maximum again in them) */
dt_status_t dt_cudnn_pool_backward(dt_cudnn_t *c, float *dinp, const float *dout, const float *out, const float *inp,
                                   int B, int C, int H, int W, int KH, int KW, int stride, int pad, int avg);

#endif
