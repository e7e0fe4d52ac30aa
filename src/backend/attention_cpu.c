/* Causal self-attention on the CPU, flash-attention style: per (batch, head) task, query blocks of
 * DT_ATT_QB rows are scored against the keys up to the block's end in a per-thread scratch of
 * (QB, T) floats, softmaxed in place and multiplied into the output; only the row logsumexp
 * (B,NH,T) is kept, and backward recomputes each block's probabilities from it. Formulas in
 * ops_cpu.h. Matmuls go through dt_cpu_sgemm, single-threaded inside the (b, h) loop. */
#include <math.h>
#include <omp.h>

#include "kmath.h"
#include "ops_cpu.h"

size_t dt_attention_scratch_floats(int T, int nthr) {
  size_t qb = T < DT_ATT_QB ? (size_t)T : DT_ATT_QB;
  return (size_t)nthr * 2 * qb * (size_t)T; /* scores and their gradient */
}

/* Row of scores s[0..n) -> probabilities in place, zeros in [n, nk); returns the logsumexp. */
DT_CPU_VEC static float softmax_row(float *restrict s, int n, int nk) {
  float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; j++) {
    s[j] = dt_expf(s[j] - mx);
    sum += s[j];
  }
  float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < n; j++) s[j] *= inv;
  for (int j = n; j < nk; j++) s[j] = 0.0f;
  return mx + logf(sum);
}

void dt_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int B, int T, int C, int NH,
                          int nthr) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  const size_t per = dt_attention_scratch_floats(T, 1);
#pragma omp parallel for schedule(static) num_threads(nthr)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    float *S = scratch + (size_t)omp_get_thread_num() * per;
    const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
    float *o = out + (size_t)b * T * C + h * hs, *l = lse + (size_t)bh * T;
    for (int i0 = 0; i0 < T; i0 += DT_ATT_QB) {
      const int i1 = i0 + DT_ATT_QB < T ? i0 + DT_ATT_QB : T, qb = i1 - i0, nk = i1;
      /* S (qb,nk) = scale q[i0:i1] k[0:nk]^T */
      dt_cpu_sgemm(0, 1, qb, nk, hs, scale, q + (size_t)i0 * C3, C3, k, C3, 0.0f, S, nk);
      for (int r = 0; r < qb; r++) l[i0 + r] = softmax_row(S + (size_t)r * nk, i0 + r + 1, nk);
      /* out[i0:i1] (qb,hs) = P v[0:nk] */
      dt_cpu_sgemm(0, 0, qb, hs, nk, 1.0f, S, nk, v, C3, 0.0f, o + (size_t)i0 * C, C);
    }
  }
}

/* p = exp(s - lse) for j < n, 0 beyond; then ds = p (dp - <p, dp>) in dp. */
DT_CPU_VEC static void softmax_backward_row(float *restrict p, float *restrict dp, float lse, int n, int nk) {
  double dot = 0.0; /* in double: rows of ds sum to ~0 exactly (the key-bias gradient is 0) */
#pragma omp simd
  for (int j = 0; j < n; j++) p[j] = dt_expf(p[j] - lse);
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j < n; j++) dot += (double)p[j] * dp[j];
  const float dotf = (float)dot;
#pragma omp simd
  for (int j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - dotf);
  for (int j = n; j < nk; j++) p[j] = dp[j] = 0.0f;
}

void dt_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *lse,
                           int B, int T, int C, int NH, int nthr) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  const size_t per = dt_attention_scratch_floats(T, 1);
  const int qbmax = T < DT_ATT_QB ? T : DT_ATT_QB;
#pragma omp parallel for schedule(static) num_threads(nthr)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    float *S = scratch + (size_t)omp_get_thread_num() * per, *D = S + (size_t)qbmax * T;
    const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
    const float *g = dout + (size_t)b * T * C + h * hs, *l = lse + (size_t)bh * T;
    float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
    for (int t = 0; t < T; t++)
      for (int e = 0; e < hs; e++) dk[(size_t)t * C3 + e] = dv[(size_t)t * C3 + e] = 0.0f;
    for (int i0 = 0; i0 < T; i0 += DT_ATT_QB) {
      const int i1 = i0 + DT_ATT_QB < T ? i0 + DT_ATT_QB : T, qb = i1 - i0, nk = i1;
      dt_cpu_sgemm(0, 1, qb, nk, hs, scale, q + (size_t)i0 * C3, C3, k, C3, 0.0f, S, nk);      /* scores */
      dt_cpu_sgemm(0, 1, qb, nk, hs, 1.0f, g + (size_t)i0 * C, C, v, C3, 0.0f, D, nk);         /* dp */
      for (int r = 0; r < qb; r++)
        softmax_backward_row(S + (size_t)r * nk, D + (size_t)r * nk, l[i0 + r], i0 + r + 1, nk);
      dt_cpu_sgemm(1, 0, nk, hs, qb, 1.0f, S, nk, g + (size_t)i0 * C, C, 1.0f, dv, C3);         /* dv += p^T g */
      dt_cpu_sgemm(0, 0, qb, hs, nk, scale, D, nk, k, C3, 0.0f, dq + (size_t)i0 * C3, C3);     /* dq = ds k */
      dt_cpu_sgemm(1, 0, nk, hs, qb, scale, D, nk, q + (size_t)i0 * C3, C3, 1.0f, dk, C3);     /* dk += ds^T q */
    }
  }
}

void dt_attention_decode(float *out, float *kc, float *vc, float *scratch, const float *qkv, int B, int pos, int n,
                         int Tmax, int C, int NH, int nthr) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) /* the new keys and values into the cache */
    for (int i = 0; i < n; i++) {
      const float *src = qkv + ((size_t)b * n + i) * C3;
      const size_t dst = ((size_t)b * Tmax + pos + i) * C;
      for (int c = 0; c < C; c++) {
        kc[dst + c] = src[C + c];
        vc[dst + c] = src[2 * C + c];
      }
    }
#pragma omp parallel for schedule(static) num_threads(nthr)
  for (int r = 0; r < B * NH * n; r++) { /* (b, h, i) */
    const int i = r % n, h = (r / n) % NH, b = r / (n * NH), t = pos + i;
    float *S = scratch + (size_t)omp_get_thread_num() * Tmax;
    const float *q = qkv + ((size_t)b * n + i) * C3 + h * hs;
    const float *k = kc + (size_t)b * Tmax * C + h * hs, *v = vc + (size_t)b * Tmax * C + h * hs;
    for (int j = 0; j <= t; j++) {
      float s = 0.0f;
      for (int d = 0; d < hs; d++) s += q[d] * k[(size_t)j * C + d];
      S[j] = s * scale;
    }
    softmax_row(S, t + 1, t + 1);
    float *o = out + ((size_t)b * n + i) * C + h * hs;
    for (int d = 0; d < hs; d++) o[d] = 0.0f;
    for (int j = 0; j <= t; j++)
      for (int d = 0; d < hs; d++) o[d] += S[j] * v[(size_t)j * C + d];
  }
}
