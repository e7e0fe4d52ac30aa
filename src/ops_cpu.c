/* GPT-2 layer kernels on the CPU: OpenMP over rows/columns for elementwise work, cblas_sgemm for
 * every matmul (called outside OpenMP regions: the linked OpenBLAS has its own thread pool).
 * Formulas and shapes are in ops_cpu.h. Parameter-gradient reductions over rows are split by
 * column blocks so every thread owns its outputs (deterministic, no atomics). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kmath.h"
#include "ops_cpu.h"

#define COLBLK 16 /* columns per thread chunk in column reductions (one cache line) */

void dt_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    float *o = out + (size_t)bt * C;
    const float *e = wte + (size_t)inp[bt] * C, *p = wpe + (size_t)(bt % T) * C;
    for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
  }
}

void dt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C) {
  int nblk = (C + COLBLK - 1) / COLBLK;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < nblk; k++) { /* threads own column blocks of dwte: repeated tokens don't race */
    int c0 = k * COLBLK, c1 = c0 + COLBLK < C ? c0 + COLBLK : C;
    for (int bt = 0; bt < B * T; bt++) {
      float *d = dwte + (size_t)inp[bt] * C;
      const float *g = dout + (size_t)bt * C;
      for (int c = c0; c < c1; c++) d[c] += g[c];
    }
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    float *d = dwpe + (size_t)t * C;
    for (int b = 0; b < B; b++) {
      const float *g = dout + ((size_t)b * T + t) * C;
      for (int c = 0; c < C; c++) d[c] += g[c];
    }
  }
}

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *x = inp + (size_t)i * C;
    double s = 0.0, s2 = 0.0;
    for (int c = 0; c < C; c++) s += x[c];
    double m = s / C;
    for (int c = 0; c < C; c++) s2 += (x[c] - m) * (x[c] - m);
    float r = (float)(1.0 / sqrt(s2 / C + 1e-5));
    float mf = (float)m;
    float *o = out + (size_t)i * C;
    for (int c = 0; c < C; c++) o[c] = dt_ln_apply(x[c], mf, r, weight[c], bias[c]);
    mean[i] = mf;
    rstd[i] = r;
  }
}

void dt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dresid, const float *dout,
                           const float *inp, const float *weight, const float *mean, const float *rstd, int N,
                           int C) {
  /* parameter grads first: they read only inputs, and dinp may alias dresid */
  int nblk = (C + COLBLK - 1) / COLBLK;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < nblk; k++) {
    int c0 = k * COLBLK, c1 = c0 + COLBLK < C ? c0 + COLBLK : C;
    float dw[COLBLK] = {0}, db[COLBLK] = {0};
    for (int i = 0; i < N; i++) {
      const float *x = inp + (size_t)i * C, *g = dout + (size_t)i * C;
      for (int c = c0; c < c1; c++) {
        dw[c - c0] += g[c] * (x[c] - mean[i]) * rstd[i];
        db[c - c0] += g[c];
      }
    }
    for (int c = c0; c < c1; c++) {
      dweight[c] += dw[c - c0];
      dbias[c] += db[c - c0];
    }
  }
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *x = inp + (size_t)i * C, *g = dout + (size_t)i * C;
    float m = mean[i], r = rstd[i];
    float gm = 0.0f, gnm = 0.0f;
    for (int c = 0; c < C; c++) {
      float wg = weight[c] * g[c];
      gm += wg;
      gnm += wg * (x[c] - m) * r;
    }
    gm /= C;
    gnm /= C;
    float *d = dinp + (size_t)i * C;
    const float *dr = dresid ? dresid + (size_t)i * C : NULL;
    for (int c = 0; c < C; c++) {
      float v = dt_ln_dinp(x[c], m, r, weight[c], g[c], gm, gnm);
      d[c] = dr ? dr[c] + v : v;
    }
  }
}

void dt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
  if (!bias) return;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float *o = out + (size_t)i * OC;
    for (int j = 0; j < OC; j++) o[j] += bias[j];
  }
}

void dt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC) {
  if (dinp) /* (N,OC) x (OC,C) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  /* (OC,N) x (N,C), accumulated */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (!dbias) return;
  int nblk = (OC + COLBLK - 1) / COLBLK;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < nblk; k++) {
    int o0 = k * COLBLK, o1 = o0 + COLBLK < OC ? o0 + COLBLK : OC;
    float acc[COLBLK] = {0};
    for (int i = 0; i < N; i++) {
      const float *g = dout + (size_t)i * OC;
      for (int o = o0; o < o1; o++) acc[o - o0] += g[o];
    }
    for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
  }
}

size_t dt_attention_scratch_floats(int B, int T, int NH) { return (size_t)B * NH * T * T; }

void dt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  /* pre-attention scores q k^T * scale for all (b, h): (T,hs) x (hs,T); upper triangle masked below */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f,
                  att + ((size_t)b * NH + h) * T * T, T);
    }
  /* causal softmax per row */
#pragma omp parallel for schedule(static)
  for (long r = 0; r < (long)B * NH * T; r++) {
    int t = (int)(r % T);
    float *a = att + (size_t)r * T;
    float mx = -INFINITY;
    for (int j = 0; j <= t; j++) mx = a[j] > mx ? a[j] : mx;
    float s = 0.0f;
    for (int j = 0; j <= t; j++) {
      a[j] = expf(a[j] - mx);
      s += a[j];
    }
    float inv = 1.0f / s;
    for (int j = 0; j <= t; j++) a[j] *= inv;
    for (int j = t + 1; j < T; j++) a[j] = 0.0f;
  }
  /* out_h = att v: (T,T) x (T,hs) */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *v = qkv + (size_t)b * T * C3 + 2 * C + h * hs;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, att + ((size_t)b * NH + h) * T * T, T,
                  v, C3, 0.0f, out + (size_t)b * T * C + h * hs, C);
    }
}

void dt_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att,
                           int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *v = qkv + (size_t)b * T * C3 + 2 * C + h * hs;
      const float *a = att + ((size_t)b * NH + h) * T * T;
      const float *g = dout + (size_t)b * T * C + h * hs;
      /* datt = dout_h v^T: (T,hs) x (hs,T) */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, g, C, v, C3, 0.0f,
                  scratch + ((size_t)b * NH + h) * T * T, T);
      /* dv = att^T dout_h: (T,T)^T x (T,hs) */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, g, C, 0.0f,
                  dqkv + (size_t)b * T * C3 + 2 * C + h * hs, C3);
    }
  /* softmax backward in place: dpre = att * (datt - <att, datt>), zero above the diagonal */
#pragma omp parallel for schedule(static)
  for (long r = 0; r < (long)B * NH * T; r++) {
    int t = (int)(r % T);
    float *d = scratch + (size_t)r * T;
    const float *a = att + (size_t)r * T;
    float dot = 0.0f;
    for (int j = 0; j <= t; j++) dot += a[j] * d[j];
    for (int j = 0; j <= t; j++) d[j] = a[j] * (d[j] - dot);
    for (int j = t + 1; j < T; j++) d[j] = 0.0f;
  }
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C;
      const float *dp = scratch + ((size_t)b * NH + h) * T * T;
      float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C;
      /* dq = dpre k * scale: (T,T) x (T,hs);  dk = dpre^T q * scale */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dp, T, k, C3, 0.0f, dq, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dp, T, q, C3, 0.0f, dk, C3);
    }
}

void dt_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = dt_gelu(inp[i]);
}

void dt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) dinp[i] = dt_gelu_grad(inp[i]) * dout[i];
}

void dt_residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

double dt_crossentropy_forward(float *losses, float *lse, const float *logits, const int *targets, int N, int V,
                               int Vp) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int i = 0; i < N; i++) {
    const float *z = logits + (size_t)i * Vp;
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
    double s = 0.0;
    for (int v = 0; v < V; v++) s += expf(z[v] - mx);
    float l = mx + (float)log(s);
    lse[i] = l;
    losses[i] = l - z[targets[i]];
    total += losses[i];
  }
  return total / N;
}

void dt_crossentropy_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                              float dloss, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *z = logits + (size_t)i * Vp;
    float *d = dlogits + (size_t)i * Vp;
    for (int v = 0; v < V; v++) d[v] = expf(z[v] - lse[i]) * dloss;
    d[targets[i]] -= dloss;
    for (int v = V; v < Vp; v++) d[v] = 0.0f;
  }
}
