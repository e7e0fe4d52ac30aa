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

/* SGD with momentum and weight decay for one element, torch.optim.SGD's arithmetic (dampening 0):
 * d = g + wd p; buf = momentum buf + d (buf starts at 0, so the first step sets buf = d as
 * PyTorch's clone does); the step is buf, or d + momentum buf with Nesterov. Returns the new
 * parameter. */
DT_HD static inline float dt_sgd_update(float p, float g, float *buf, float lr, float momentum, float wd,
                                        int nesterov) {
  float d = g + wd * p;
  float b = momentum * (*buf) + d;
  *buf = b;
  return p - lr * (nesterov ? d + momentum * b : b);
}

/* Max pooling of output (y, x) over its K x K window in a plane of H x W (stride, pad; outside the
 * plane counts as -inf): *best = the maximum, the first in row-major order on a tie; a NaN wins and
 * ends the scan (PyTorch propagates it). Returns its index iy * W + ix, -1 for an empty window. */
DT_HD static inline int dt_maxpool_at(const float *plane, int H, int W, int K, int stride, int pad, int y, int x,
                                      float *best) {
  int at = -1;
  float b = -INFINITY;
  for (int i = 0; i < K; i++) {
    int iy = y * stride - pad + i;
    if (iy < 0 || iy >= H) continue;
    for (int j = 0; j < K; j++) {
      int ix = x * stride - pad + j;
      if (ix < 0 || ix >= W) continue;
      float v = plane[iy * W + ix];
      if (isnan(v)) {
        *best = v;
        return iy * W + ix;
      }
      if (at < 0 || v > b) b = v, at = iy * W + ix;
    }
  }
  *best = b;
  return at;
}

/* LayerNorm: 1 / sqrt(var + 1e-5) from the biased variance over C (PyTorch's eps). */
DT_HD static inline float dt_ln_rstd(float var) { return 1.0f / sqrtf(var + 1e-5f); /* DT_LN_EPS */ }

/* LayerNorm backward for one element, with n = (x - mean) * rstd, g = weight * dout and the row
 * means gm = mean_C(g), gnm = mean_C(g * n):  dx = rstd * (g - gm - n * gnm). */
DT_HD static inline float dt_ln_dx(float g, float n, float gm, float gnm, float rstd) {
  return rstd * (g - gm - n * gnm);
}


/* ---- added for CUDA ---- */
/* Layernorm, softmax and cross-entropy pieces shared by ops_cpu.c and cuda/kernels.cu. A GPU
 * row kernel computes the same partial sums in a different order (warp/block reductions), so
 * the row functions below are the reference the CPU tests check against double precision and
 * the per-element functions are bit-identical on both sides. */
#define DT_LN_EPS 1e-5f

/* (dt_ln_rstd above: rstd = 1 / sqrt(var + DT_LN_EPS), var the biased variance over the row.) */

/* y = (x - mean) * rstd * w + b */
DT_HD static inline float dt_ln_apply(float x, float mean, float rstd, float w, float b) {
  return (x - mean) * rstd * w + b;
}

/* Row statistics by two passes (mean, then the centred sum of squares). x (C) */
DT_HD static inline void dt_ln_row_stats(const float *x, int C, float *mean, float *rstd) {
  float s = 0.0f, s2 = 0.0f;
  for (int c = 0; c < C; c++) s += x[c];
  float m = s / (float)C;
  for (int c = 0; c < C; c++) s2 += (x[c] - m) * (x[c] - m);
  *mean = m;
  *rstd = dt_ln_rstd(s2 / (float)C);
}

/* Backward row sums, with g = w * dout and n = (x - mean) * rstd:
 * *gm = mean_C(g), *gnm = mean_C(g * n).  x, dout, w (C) */
DT_HD static inline void dt_ln_row_bwd_sums(const float *x, const float *dout, const float *w, float mean, float rstd,
                                            int C, float *gm, float *gnm) {
  float a = 0.0f, b = 0.0f;
  for (int c = 0; c < C; c++) {
    float wg = w[c] * dout[c];
    a += wg;
    b += wg * (x[c] - mean) * rstd;
  }
  *gm = a / (float)C;
  *gnm = b / (float)C;
}

/* d loss / d x for one element of the row (without the residual term):
 * rstd * (w dout - gm - n gnm), n = (x - mean) rstd. */
DT_HD static inline float dt_ln_dinp(float x, float mean, float rstd, float w, float dout, float gm, float gnm) {
  return rstd * (w * dout - gm - (x - mean) * rstd * gnm);
}

/* Online softmax normaliser: (max, sum of exp(z - max)) updated with one value z.
 * Start from max = -INFINITY, sum = 0. */
DT_HD static inline void dt_softmax_online(float *mx, float *sum, float z) {
  if (z > *mx) {
    *sum = *sum * expf(*mx - z) + 1.0f;
    *mx = z;
  } else {
    *sum += expf(z - *mx);
  }
}

/* Merge two online states (mx2, sum2) into (mx, sum); either may be empty (max = -INFINITY). */
DT_HD static inline void dt_softmax_merge(float *mx, float *sum, float mx2, float sum2) {
  if (mx2 == -INFINITY) return;
  if (*mx == -INFINITY) {
    *mx = mx2;
    *sum = sum2;
    return;
  }
  float m = *mx > mx2 ? *mx : mx2;
  *sum = *sum * expf(*mx - m) + sum2 * expf(mx2 - m);
  *mx = m;
}

/* log sum_v exp(z_v) from an online state. */
DT_HD static inline float dt_softmax_lse(float mx, float sum) { return mx + logf(sum); }

/* Row log-sum-exp over z (n) by the online rule, one element at a time. */
DT_HD static inline float dt_row_lse(const float *z, int n) {
  float mx = -INFINITY, sum = 0.0f;
  for (int v = 0; v < n; v++) dt_softmax_online(&mx, &sum, z[v]);
  return dt_softmax_lse(mx, sum);
}

/* Cross-entropy gradient for one logit: (softmax(z) - [v == target]) * dloss, softmax = exp(z - lse). */
DT_HD static inline float dt_ce_dlogit(float z, float lse, int is_target, float dloss) {
  return (expf(z - lse) - (is_target ? 1.0f : 0.0f)) * dloss;
}

/* Softmax backward for one entry: a (d - <a, d>), a the probability, d the upstream gradient. */
DT_HD static inline float dt_softmax_bwd(float a, float d, float dot) { return a * (d - dot); }

/* ---- storage precision (mixed precision, src/core/precision.h) ---- */
/* Float <-> bits without aliasing problems, on host and device. */
DT_HD static inline uint32_t dt_f2u(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}
DT_HD static inline float dt_u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/* x rounded to the nearest bfloat16 (8 exponent bits, 7 stored mantissa bits), ties to even,
 * returned as the float of the same value (bf16 is the top half of a float). Overflow rounds
 * to +-inf as IEEE RNE does (|x| >= 0x1.ffp127 ties up), inf stays inf, NaN stays a (quiet)
 * NaN, float subnormals round like any other value (bf16 has the same exponent range).
 * Integer form: add 0x7fff + (bit 16) and clear the low 16 bits. */
DT_HD static inline float dt_round_bf16(float x) {
  uint32_t u = dt_f2u(x);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  r = (u & 0x7fffffffu) > 0x7f800000u ? ((u | 0x00400000u) & 0xffff0000u) : r; /* NaN: quiet, keep sign */
  return dt_u2f(r);
}

/* x rounded to the nearest IEEE 754 binary16 value (5 exponent bits, 10 mantissa bits), ties to
 * even, returned as a float. |x| >= 65520 (the midpoint above the largest half, 65504) becomes
 * +-inf; below 2^-14 the result is a half subnormal (multiples of 2^-24; |x| <= 2^-25 gives
 * +-0); inf stays inf, NaN stays a (quiet) NaN. Normal range: the bf16 trick at bit 13.
 * Subnormal range: (|x| + 0.5f) - 0.5f, whose float sum has ulp 2^-24 and rounds to nearest
 * even in hardware (no fast-math: the compiler must not fold it). */
DT_HD static inline float dt_round_fp16(float x) {
  uint32_t u = dt_f2u(x), sign = u & 0x80000000u, a = u & 0x7fffffffu;
  uint32_t rn = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
  rn = rn > 0x477fe000u ? 0x7f800000u : rn; /* above 65504: inf */
  float sub = (dt_u2f(a) + 0.5f) - 0.5f;
  uint32_t r = a < 0x38800000u ? dt_f2u(sub) : rn; /* 0x38800000 = 2^-14, the smallest normal half */
  r = a > 0x7f800000u ? (a | 0x00400000u) : r;    /* NaN */
  return dt_u2f(r | sign);
}

/* The 16 bits of a float already rounded to bf16 (dt_round_bf16): its top half; and back. */
DT_HD static inline uint16_t dt_bf16_bits(float r) { return (uint16_t)(dt_f2u(r) >> 16); }
DT_HD static inline float dt_bf16_value(uint16_t h) { return dt_u2f((uint32_t)h << 16); }

/* The IEEE binary16 bits of a float already rounded to it (dt_round_fp16), and back: the
 * exponent rebiased from 127 to 15 (minus 112 << 23), the mantissa's top 10 bits; half subnormals
 * are multiples of 2^-24; inf stays inf, NaN a quiet NaN. */
DT_HD static inline uint16_t dt_fp16_bits(float r) {
  uint32_t u = dt_f2u(r), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a < 0x38800000u) return (uint16_t)(sign | (uint32_t)(dt_u2f(a) * 16777216.0f)); /* / 2^-24 */
  return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}
DT_HD static inline float dt_fp16_value(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 31) return dt_u2f(sign | 0x7f800000u | (m << 13));
  if (e == 0) return dt_u2f(sign | dt_f2u((float)m * 5.9604644775390625e-8f)); /* m * 2^-24 */
  return dt_u2f(sign | ((e + 112u) << 23) | (m << 13));
}

/* 16-bit storage of x: rounded to nearest even and stored as the bits of bf16 (fp16 = 0) or of an
 * IEEE half (fp16 = 1); and the float value of such bits (exact) */
DT_HD static inline uint16_t dt_to16(float x, int fp16) {
  return fp16 ? dt_fp16_bits(dt_round_fp16(x)) : dt_bf16_bits(dt_round_bf16(x));
}
DT_HD static inline float dt_from16(uint16_t h, int fp16) { return fp16 ? dt_fp16_value(h) : dt_bf16_value(h); }

#endif

