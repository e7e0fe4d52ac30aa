/* Per-element and per-row arithmetic shared by the CPU backend and the CUDA kernels.
 * Everything here is `static inline` and marked DT_HD (__host__ __device__ under nvcc), so the
 * CPU tests check exactly the arithmetic the GPU runs. Only the common subset of C and C++. */
#ifndef DT_KMATH_H
#define DT_KMATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DT_HD __host__ __device__
#else
#define DT_HD
#endif

#define DT_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
DT_HD static inline float dt_gelu(float x) {
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(DT_GELU_SCALE * (x + cube)));
}

/* d gelu(x) / dx for the tanh approximation. */
DT_HD static inline float dt_gelu_grad(float x) {
  float cube = 0.044715f * x * x * x;
  float arg = DT_GELU_SCALE * (x + cube);
  float th = tanhf(arg);
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * DT_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

/* AdamW (decoupled weight decay, PyTorch's torch.optim.AdamW arithmetic) for one element.
 * g is the (already scaled) gradient; m, v updated in place; returns the new parameter.
 * bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. */
DT_HD static inline float dt_adamw_update(float p, float g, float *m, float *v, float lr, float beta1,
                                          float beta2, float eps, float wd, float bc1, float bc2) {
  float mm = beta1 * (*m) + (1.0f - beta1) * g;
  float vv = beta2 * (*v) + (1.0f - beta2) * g * g;
  *m = mm;
  *v = vv;
  p -= lr * wd * p;
  float denom = sqrtf(vv) / sqrtf(bc2) + eps;
  return p - (lr / bc1) * mm / denom;
}

#endif
