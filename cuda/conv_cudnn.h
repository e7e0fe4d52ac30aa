/* The image classifiers' convolutions through cuDNN (system.conv = cudnn; the default `own` is
 * backend_cuda_cnn.cu's im2col + cuBLAS, the CUDA emulation's twin). cuDNN is loaded at run time
 * (dlopen of libcudnn.so.9), so a machine without it runs everything else and only this choice
 * fails, with one line. fp32 NCHW tensors, weights (OC, C, K, K), cross-correlation as PyTorch;
 * the algorithm per shape from cuDNN's heuristics, deterministic ones only (the same result on
 * every run), its workspace grown on demand. Internal (C++); only in the real CUDA build. */
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

#endif
