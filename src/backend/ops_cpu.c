/* GPT-2 layer kernels on the CPU (all but attention, see attention_cpu.c): one OpenMP thread pool
 * for everything. dt_cpu_sgemm is the single matmul entry point; it splits a large product across
 * the OpenMP threads and runs the engine single-threaded in each (BLAS threading is switched off
 * so two thread pools never spin against each other). Elementwise loops are `omp simd` with the
 * per-element math from kmath.h, compiled for AVX-512, AVX2 and baseline x86-64 (DT_CPU_VEC).
 * Formulas and shapes are in ops_cpu.h. Parameter-gradient reductions over rows are split by
 * column blocks so every thread owns its outputs (deterministic, no atomics). */
#include "dt_build.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "gemm.h"
#include "kmath.h"
#include "ops_cpu.h"

#define COLBLK 64         /* columns per thread chunk in column reductions (4 cache lines) */
#define SPLIT_FLOPS 4e6   /* below this a matmul runs on one thread */
#define SPLIT_ALIGN 16    /* split points are multiples of this many rows/columns */

/* ---- matmul engine ------------------------------------------------------------------------- */

static void engine(int tA, int tB, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                   float beta, float *C, int ldc) {
  dt_sgemm(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* BLAS runs single-threaded inside our OpenMP threads. */
__attribute__((constructor)) static void engine_single_threaded(void) {
#ifdef DT_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#endif
}

void dt_cpu_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc) {
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  /* The own AVX-512 engine threads (and shares its packed panels) by itself. */
  if (nt <= 1 || 2.0 * M * N * K < SPLIT_FLOPS || dt_gemm_engine() == DT_GEMM_OWN) {
    engine(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int split_m = M >= N, len = split_m ? M : N;
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int per = ((len + n - 1) / n + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN;
    int lo = t * per, hi = lo + per < len ? lo + per : len;
    if (lo < hi) {
      if (split_m) /* rows lo..hi of C and of op(A) */
        engine(transA, transB, hi - lo, N, K, alpha, transA ? A + lo : A + (size_t)lo * lda, lda, B, ldb, beta,
               C + (size_t)lo * ldc, ldc);
      else /* columns lo..hi of C and of op(B) */
        engine(transA, transB, M, hi - lo, K, alpha, A, lda, transB ? B + (size_t)lo * ldb : B + lo, ldb, beta, C + lo,
               ldc);
    }
  }
}

const char *dt_cpu_gemm_engine(void) {
  static char buf[256];
  if (dt_gemm_engine() == DT_GEMM_OWN) return dt_gemm_engine_name();
#ifdef DT_HAVE_OPENBLAS
  snprintf(buf, sizeof buf, "cblas_sgemm: OpenBLAS kernel %s, %s, %d BLAS thread(s) per OpenMP thread",
           openblas_get_corename(), openblas_get_config(), openblas_get_num_threads());
#else
  snprintf(buf, sizeof buf, "cblas_sgemm: %s", DT_BLAS_NAME);
#endif
  return buf;
}

/* ---- encoder ------------------------------------------------------------------------------- */

DT_CPU_VEC void dt_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                                   int C) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    float *restrict o = out + (size_t)bt * C;
    const float *restrict e = wte + (size_t)inp[bt] * C, *restrict p = wpe + (size_t)(bt % T) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
  }
}

DT_CPU_VEC void dt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                                    int C) {
  int nblk = (C + COLBLK - 1) / COLBLK;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < nblk; k++) { /* threads own column blocks of dwte: repeated tokens don't race */
    int c0 = k * COLBLK, c1 = c0 + COLBLK < C ? c0 + COLBLK : C;
    for (int bt = 0; bt < B * T; bt++) {
      float *restrict d = dwte + (size_t)inp[bt] * C;
      const float *restrict g = dout + (size_t)bt * C;
#pragma omp simd
      for (int c = c0; c < c1; c++) d[c] += g[c];
    }
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    float *restrict d = dwpe + (size_t)t * C;
    for (int b = 0; b < B; b++) {
      const float *restrict g = dout + ((size_t)b * T + t) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) d[c] += g[c];
    }
  }
}

/* ---- layernorm ----------------------------------------------------------------------------- */

DT_CPU_VEC void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                     const float *bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *restrict x = inp + (size_t)i * C;
    float *restrict o = out + (size_t)i * C;
    float s = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    float m = s / C;
#pragma omp simd reduction(+ : s2)
    for (int c = 0; c < C; c++) s2 += (x[c] - m) * (x[c] - m);
    float r = dt_ln_rstd(s2 / C);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = r;
  }
}

DT_CPU_VEC void dt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dresid,
                                      const float *dout, const float *inp, const float *weight, const float *mean,
                                      const float *rstd, int N, int C) {
  /* parameter grads first: they read only inputs, and dinp may alias dresid */
  int nblk = (C + COLBLK - 1) / COLBLK;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < nblk; k++) {
    int c0 = k * COLBLK, w = c0 + COLBLK < C ? COLBLK : C - c0;
    float dw[COLBLK] = {0}, db[COLBLK] = {0};
    for (int i = 0; i < N; i++) {
      const float *restrict x = inp + (size_t)i * C + c0, *restrict g = dout + (size_t)i * C + c0;
      float m = mean[i], r = rstd[i];
#pragma omp simd
      for (int c = 0; c < w; c++) {
        dw[c] += g[c] * (x[c] - m) * r;
        db[c] += g[c];
      }
    }
    for (int c = 0; c < w; c++) {
      dweight[c0 + c] += dw[c];
      dbias[c0 + c] += db[c];
    }
  }
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *restrict x = inp + (size_t)i * C, *restrict g = dout + (size_t)i * C;
    float m = mean[i], r = rstd[i];
    float gm = 0.0f, gnm = 0.0f;
#pragma omp simd reduction(+ : gm, gnm)
    for (int c = 0; c < C; c++) {
      float wg = weight[c] * g[c];
      gm += wg;
      gnm += wg * (x[c] - m) * r;
    }
    gm /= C;
    gnm /= C;
    float *d = dinp + (size_t)i * C; /* may alias dresid */
    if (dresid) {
      const float *dr = dresid + (size_t)i * C;
#pragma omp simd
      for (int c = 0; c < C; c++) d[c] = dr[c] + dt_ln_dx(weight[c] * g[c], (x[c] - m) * r, gm, gnm, r);
    } else {
#pragma omp simd
      for (int c = 0; c < C; c++) d[c] = dt_ln_dx(weight[c] * g[c], (x[c] - m) * r, gm, gnm, r);
    }
  }
}

/* ---- matmul -------------------------------------------------------------------------------- */

/* out rows = bias (+ resid rows), so the matmul can accumulate with beta = 1. */
DT_CPU_VEC static void prefill(float *out, const float *bias, const float *resid, int N, int OC) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float *o = out + (size_t)i * OC; /* may alias resid */
    if (resid) {
      const float *r = resid + (size_t)i * OC;
      if (bias) {
#pragma omp simd
        for (int j = 0; j < OC; j++) o[j] = r[j] + bias[j];
      } else if (o != r) {
        memcpy(o, r, (size_t)OC * sizeof(float));
      }
    } else {
      memcpy(o, bias, (size_t)OC * sizeof(float));
    }
  }
}

/* Both weight layouts through one sgemm: (OC, C) = nn.Linear (lm_head), (C, OC) = Conv1D. */
static void mm_forward(float *out, const float *inp, const float *w, int w_in_out, int N, int C, int OC, float beta) {
  dt_cpu_sgemm(0, !w_in_out, N, OC, C, 1.0f, inp, C, w, w_in_out ? OC : C, beta, out, OC);
}

void dt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC) {
  if (bias) prefill(out, bias, NULL, N, OC);
  mm_forward(out, inp, weight, 0, N, C, OC, bias ? 1.0f : 0.0f);
}

void dt_conv1d_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC) {
  if (bias) prefill(out, bias, NULL, N, OC);
  mm_forward(out, inp, weight, 1, N, C, OC, bias ? 1.0f : 0.0f);
}

void dt_conv1d_residual_forward(float *out, const float *inp, const float *weight, const float *bias,
                                const float *resid, int N, int C, int OC) {
  prefill(out, bias, resid, N, OC);
  mm_forward(out, inp, weight, 1, N, C, OC, 1.0f);
}

DT_CPU_VEC static void bias_backward(float *dbias, const float *dout, int N, int OC) {
  int nblk = (OC + COLBLK - 1) / COLBLK;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < nblk; k++) {
    int o0 = k * COLBLK, w = o0 + COLBLK < OC ? COLBLK : OC - o0;
    float acc[COLBLK] = {0};
    for (int i = 0; i < N; i++) {
      const float *restrict g = dout + (size_t)i * OC + o0;
#pragma omp simd
      for (int o = 0; o < w; o++) acc[o] += g[o];
    }
    for (int o = 0; o < w; o++) dbias[o0 + o] += acc[o];
  }
}

static void mm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *w, int w_in_out, int N, int C, int OC) {
  if (w_in_out) {
    if (dinp) dt_cpu_sgemm(0, 1, N, C, OC, 1.0f, dout, OC, w, OC, 0.0f, dinp, C); /* (N,OC) x (C,OC)^T */
    dt_cpu_sgemm(1, 0, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);       /* (C,N) x (N,OC), accumulated */
  } else {
    if (dinp) dt_cpu_sgemm(0, 0, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C); /* (N,OC) x (OC,C) */
    dt_cpu_sgemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);      /* (OC,N) x (N,C), accumulated */
  }
  if (dbias) bias_backward(dbias, dout, N, OC);
}

void dt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC) {
  mm_backward(dinp, dweight, dbias, dout, inp, weight, 0, N, C, OC);
}

void dt_conv1d_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC) {
  mm_backward(dinp, dweight, dbias, dout, inp, weight, 1, N, C, OC);
}

/* ---- elementwise --------------------------------------------------------------------------- */

DT_CPU_VEC void dt_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = dt_gelu(inp[i]);
}

DT_CPU_VEC void dt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) dinp[i] = dt_gelu_grad(inp[i]) * dout[i];
}

DT_CPU_VEC void dt_residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ---- cross-entropy ------------------------------------------------------------------------- */

DT_CPU_VEC double dt_crossentropy_forward(float *losses, float *lse, const float *logits, const int *targets, int N,
                                          int V, int Vp) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int i = 0; i < N; i++) {
    const float *restrict z = logits + (size_t)i * Vp;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
    double s = 0.0; /* float partial sums over chunks (vectorizes), chunks added in double */
    for (int v0 = 0; v0 < V; v0 += 1024) {
      int v1 = v0 + 1024 < V ? v0 + 1024 : V;
      float cs = 0.0f;
#pragma omp simd reduction(+ : cs)
      for (int v = v0; v < v1; v++) cs += dt_expf(z[v] - mx);
      s += cs;
    }
    float l = mx + (float)log(s);
    lse[i] = l;
    losses[i] = l - z[targets[i]];
    total += losses[i];
  }
  return total / N;
}

DT_CPU_VEC void dt_crossentropy_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                                         float dloss, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *restrict z = logits + (size_t)i * Vp;
    float *restrict d = dlogits + (size_t)i * Vp;
    float l = lse[i];
#pragma omp simd
    for (int v = 0; v < V; v++) d[v] = dt_expf(z[v] - l) * dloss;
    d[targets[i]] -= dloss;
    for (int v = V; v < Vp; v++) d[v] = 0.0f;
  }
}
