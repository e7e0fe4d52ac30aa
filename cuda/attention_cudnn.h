/* GPT-2's causal attention through cuDNN's fused scaled-dot-product attention (system.attention =
 * cudnn; issue #22). cuDNN's SDPA takes 16-bit inputs only, so it serves bf16 and fp16 training:
 * q, k, v in 16-bit storage are used as they are; in float storage (already rounded to that
 * precision where the model stores them) they are converted to 16 bits exactly and the results
 * come back as fp32. cuDNN computes out and the rows' log-sum-exp (the same (B, NH, T) state as
 * our flash kernels) forward, and dq, dk, dv backward from out, dout and that state. The graphs are built with cuDNN's frontend (header-only C++, its NV_CUDNN_FRONTEND_
 * USE_DYNAMIC_LOADING mode: libcudnn.so.9 is opened at run time, so it stays an optional
 * dependency), one per shape, cached. Internal; only in the real CUDA build with the frontend's
 * headers (configure: DT_HAVE_CUDNN_FRONTEND). Never run on a GPU yet: docs/gpu-runs.md. */
#ifndef DT_CU_ATTENTION_CUDNN_H
#define DT_CU_ATTENTION_CUDNN_H

#include <cuda_runtime.h>
#include <stdio.h>

#include "status.h"

#ifdef __cplusplus
extern "C" { /* C linkage: tests/test_cudnn_att.c calls dt_cudnn_att_validate */
#endif

typedef struct dt_cudnn_att dt_cudnn_att_t;

/* Load cuDNN and make a handle on stream s for 16-bit inputs: bf16 (fp16 = 0) or fp16. An error
 * naming why (no library, too old, no frontend in this build) leaves *out NULL. */
dt_status_t dt_cudnn_att_open(dt_cudnn_att_t **out, cudaStream_t s, int fp16);
void dt_cudnn_att_close(dt_cudnn_att_t *a);
/* "cuDNN 9.x.y fused attention (bf16)" */
const char *dt_cudnn_att_name(const dt_cudnn_att_t *a);

/* Tests, without a device: the forward (bwd 0) or backward graph for (B, T, NH, hs) built and
 * checked by cuDNN's frontend for a GPU of compute capability sm (90: H100/H200); DT_OK or why not
 * (cuDNN missing or the shape unsupported). */
dt_status_t dt_cudnn_att_validate(int sm, int fp16, int bwd, int B, int T, int NH, int hs);

/* out (B,T,C) and lse (B,NH,T) of causal softmax(q k^T / sqrt(hs)) v over qkv (B,T,3C), written;
 * in16: out and qkv are 16-bit storage of the open's type, used as they are; else float, copied */
dt_status_t dt_cudnn_att_forward(dt_cudnn_att_t *a, void *out, float *lse, const void *qkv, int in16, int B, int T,
                                 int C, int NH);
/* dqkv (B,T,3C) written, from dout and forward's out and lse (in16 as forward) */
dt_status_t dt_cudnn_att_backward(dt_cudnn_att_t *a, void *dqkv, const void *dout, const void *out, const void *qkv,
                                  const float *lse, int in16, int B, int T, int C, int NH);

#ifdef __cplusplus
}
#endif
#endif
