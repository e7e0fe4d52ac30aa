/* Per-element and per-row arithmetic shared by the CPU backend and the CUDA kernels.
 * Everything here is `static inline` and marked DT_HD (__host__ __device__ under nvcc), so the
 * CPU tests check exactly the arithmetic the GPU runs. Only the common subset of C and C++. */
#ifndef DT_KMATH_H
#define DT_KMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DT_HD __host__ __device__
#else
#define DT_HD
#endif

#define DT_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* exp(x) without libm calls and without branches, so `omp simd` loops vectorize (Cephes expf:
 * x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, 2^n by exponent bits). Relative error
 * ~1e-7 for x in [-87.3, 88.3]; 0 below (also for -inf), exp(88.3) above, NaN stays NaN. */
DT_HD static inline float dt_expf(float x0) {
  float x = x0 < -87.3f ? -87.3f : x0;
  x = x > 88.3f ? 88.3f : x;
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;              /* x - n ln2 in two parts */
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
#ifdef __CUDA_ARCH__
  scale = __int_as_float(bits);
#else
  memcpy(&scale, &bits, sizeof scale);
#endif
  return x0 < -87.3f ? 0.0f : p * scale;
}

/* tanh(x), Cephes tanhf: odd polynomial for |x| < 0.625, else 1 - 2 / (1 + exp(2|x|)) (no
 * cancellation there). Relative error ~1.3e-7 (tests/test_model.c); branch-free so it vectorizes. */
DT_HD static inline float dt_tanhf(float x) {
  float ax = x < 0.0f ? -x : x;
  float big = 1.0f - 2.0f / (1.0f + dt_expf(2.0f * (ax > 10.0f ? 10.0f : ax)));
  float z = ax * ax;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
                 3.33332819422e-1f) * z * ax + ax;
  float t = ax < 0.625f ? small : big;
  return x < 0.0f ? -t : t;
}

/* GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
DT_HD static inline float dt_gelu(float x) {
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + dt_tanhf(DT_GELU_SCALE * (x + cube)));
}

/* d gelu(x) / dx for the tanh approximation. */
DT_HD static inline float dt_gelu_grad(float x) {
  float cube = 0.044715f * x * x * x;
  float arg = DT_GELU_SCALE * (x + cube);
  float th = dt_tanhf(arg);
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

/* LayerNorm: 1 / sqrt(var + 1e-5) from the biased variance over C (PyTorch's eps). */
DT_HD static inline float dt_ln_rstd(float var) { return 1.0f / sqrtf(var + 1e-5f); }

/* LayerNorm backward for one element, with n = (x - mean) * rstd, g = weight * dout and the row
 * means gm = mean_C(g), gnm = mean_C(g * n):  dx = rstd * (g - gm - n * gnm). */
DT_HD static inline float dt_ln_dx(float g, float n, float gm, float gnm, float rstd) {
  return rstd * (g - gm - n * gnm);
}

#endif

