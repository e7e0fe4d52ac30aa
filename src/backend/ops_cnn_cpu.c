/* Convolutional-network layer kernels on the CPU (shapes and formulas: ops_cnn_cpu.h).
 * Convolution is im2col + dt_cpu_sgemm over chunks of images (enough images side by side that the
 * product is wide), chunks split over the OpenMP threads (CNN images are small: one image's
 * product is too small to split well, a batch of them is not).
 * Everything else is a loop over channels or planes, each owned by one thread (no atomics). */
#include "dt_build.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "conv_winograd.h"
#include "kmath.h"
#include "ops_cnn_cpu.h"
#include "ops_cpu.h"

/* ---- conv2d ------------------------------------------------------------------------------ */

static void bias_grad(float *dbias, const float *dout, int B, int OC, int HW, int nthr); /* batch norm's below */

/* A convolution's product per chunk of G images: col (C*KH*KW, G*P) holds the G images' im2col
 * matrices side by side (P = OH*OW), so a layer with small feature maps (ResNet's last stage: 4x4)
 * still multiplies matrices at least CONV_MIN_N wide; each thread takes whole chunks. */
#define CONV_MIN_N 256

typedef struct {
  int C, H, W, KH, KW, stride, pad, OH, OW;
} conv_geom_t;

static int is_pointwise(const conv_geom_t *g) { return g->KH == 1 && g->KW == 1 && g->stride == 1 && g->pad == 0; }

/* Images per chunk for a batch of B over nthr threads: wide enough products, every thread busy. */
static int conv_chunk(int B, int P, int nthr) {
  int g = (CONV_MIN_N + P - 1) / P, per = (B + nthr - 1) / nthr;
  if (g > per) g = per;
  return g < 1 ? 1 : g;
}

/* A thread's slice of the scratch: col (ckk, Gmax*P) at 0, the chunk's output or its gradient
 * (OC, Gmax*P) at *y, the partial dweight (OC, ckk) and dbias (OC) at *part; returns its floats. */
static size_t conv_slice(size_t ckk, size_t OC, size_t P, size_t *y, size_t *part) {
  size_t gp = (CONV_MIN_N + P - 1) / P * P;
  *y = ckk * gp;
  *part = *y + OC * gp;
  return *part + OC * ckk + OC;
}

size_t dt_conv2d_scratch_floats(int C, int KH, int KW, int OC, int OH, int OW, int stride, int pad, int nthr) {
  int m = dt_conv_winograd_m(C, KH, KW, stride, pad);
  if (m) return dt_conv_winograd_scratch_floats(m, C, OC, OH, OW, nthr); /* OH, OW = H, W */
  size_t y, part;
  return (size_t)nthr * conv_slice((size_t)C * KH * KW, (size_t)OC, (size_t)OH * OW, &y, &part);
}

/* The output columns x whose input column x*stride - pad + j lies inside [0, W): [*x0, *x1). */
static void inside_cols(const conv_geom_t *g, int j, int *x0, int *x1) {
  int lo = g->pad - j, hi = g->W - 1 + g->pad - j; /* x*stride in [lo, hi] */
  *x0 = lo <= 0 ? 0 : (lo + g->stride - 1) / g->stride;
  *x1 = hi < 0 ? 0 : hi / g->stride + 1;
  if (*x1 > g->OW) *x1 = g->OW;
  if (*x0 > *x1) *x0 = *x1;
}

/* col rows of length ld (>= OH*OW): row (c*KH + i)*KW + j holds image channel c shifted by (i, j). */
static void im2col(float *restrict col, size_t ld, const float *restrict img, const conv_geom_t *g) {
  for (int c = 0; c < g->C; c++)
    for (int i = 0; i < g->KH; i++)
      for (int j = 0; j < g->KW; j++) {
        float *restrict row = col + ((size_t)(c * g->KH + i) * g->KW + j) * ld;
        const float *restrict plane = img + (size_t)c * g->H * g->W;
        int x0, x1, s = g->stride;
        inside_cols(g, j, &x0, &x1);
        for (int y = 0; y < g->OH; y++) {
          int iy = y * s - g->pad + i;
          float *restrict r = row + (size_t)y * g->OW;
          if (iy < 0 || iy >= g->H) {
            memset(r, 0, (size_t)g->OW * sizeof *r);
            continue;
          }
          const float *restrict src = plane + (size_t)iy * g->W; /* src[x*s + off] for x in [x0, x1) */
          int off = j - g->pad;
          for (int x = 0; x < x0; x++) r[x] = 0.0f;
          if (s == 1) memcpy(r + x0, src + x0 + off, (size_t)(x1 - x0) * sizeof *r);
          else
            for (int x = x0; x < x1; x++) r[x] = src[x * s + off];
          for (int x = x1; x < g->OW; x++) r[x] = 0.0f;
        }
      }
}

/* img (C,H,W) = the sum of col's entries over the positions they were taken from (written). */
static void col2im(float *restrict img, const float *restrict col, size_t ld, const conv_geom_t *g) {
  if (g->KH == 1 && g->KW == 1 && g->stride == 1 && g->pad == 0) { /* one position each: a copy */
    for (int c = 0; c < g->C; c++)
      memcpy(img + (size_t)c * g->H * g->W, col + (size_t)c * ld, (size_t)g->H * g->W * sizeof *img);
    return;
  }
  memset(img, 0, (size_t)g->C * g->H * g->W * sizeof *img);
  for (int c = 0; c < g->C; c++)
    for (int i = 0; i < g->KH; i++)
      for (int j = 0; j < g->KW; j++) {
        const float *restrict row = col + ((size_t)(c * g->KH + i) * g->KW + j) * ld;
        float *restrict plane = img + (size_t)c * g->H * g->W;
        int x0, x1, s = g->stride;
        inside_cols(g, j, &x0, &x1);
        for (int y = 0; y < g->OH; y++) {
          int iy = y * s - g->pad + i;
          if (iy < 0 || iy >= g->H) continue;
          float *restrict dst = plane + (size_t)iy * g->W;
          const float *restrict r = row + (size_t)y * g->OW;
          int off = j - g->pad;
          for (int x = x0; x < x1; x++) dst[x * s + off] += r[x];
        }
      }
}

/* The chunk's im2col matrix: images [b0, b0+n) of inp side by side, or the image itself (one
 * image, a 1x1 convolution with stride 1). Returns the matrix. */
static const float *chunk_col(float *col, const float *inp, int b0, int n, const conv_geom_t *g) {
  const size_t P = (size_t)g->OH * g->OW, img = (size_t)g->C * g->H * g->W;
  if (n == 1 && is_pointwise(g)) return inp + (size_t)b0 * img;
  for (int i = 0; i < n; i++) im2col(col + i * P, n * P, inp + (size_t)(b0 + i) * img, g);
  return col;
}

void dt_conv2d_forward(float *out, float *scratch, const float *inp, const float *weight, const float *bias, int B,
                       int C, int H, int W, int OC, int KH, int KW, int stride, int pad, int nthr) {
  const int m = dt_conv_winograd_m(C, KH, KW, stride, pad);
  if (m) {
    dt_conv_winograd_forward(m, out, scratch, inp, weight, bias, B, C, H, W, OC, nthr);
    return;
  }
  const conv_geom_t g = {C, H, W, KH, KW, stride, pad, dt_conv_out(H, KH, stride, pad), dt_conv_out(W, KW, stride, pad)};
  const int P = g.OH * g.OW, ckk = C * KH * KW, G = conv_chunk(B, P, nthr), nch = (B + G - 1) / G;
  size_t yoff, part, per = conv_slice((size_t)ckk, (size_t)OC, (size_t)P, &yoff, &part);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
  for (int k = 0; k < nch; k++) {
    int b0 = k * G, n = b0 + G <= B ? G : B - b0;
    float *col = scratch + per * (size_t)omp_get_thread_num(), *y = col + yoff;
    const float *cl = chunk_col(col, inp, b0, n, &g);
    if (n == 1) { /* straight into the image's output */
      float *o = out + (size_t)b0 * OC * P;
      if (bias)
        for (int oc = 0; oc < OC; oc++)
          for (int p = 0; p < P; p++) o[(size_t)oc * P + p] = bias[oc];
      dt_cpu_sgemm(0, 0, OC, P, ckk, 1.0f, weight, ckk, cl, P, bias ? 1.0f : 0.0f, o, P);
      continue;
    }
    dt_cpu_sgemm(0, 0, OC, n * P, ckk, 1.0f, weight, ckk, cl, n * P, 0.0f, y, n * P);
    for (int i = 0; i < n; i++) /* (OC, n*P) -> images (OC, P) */
      for (int oc = 0; oc < OC; oc++) {
        float *o = out + ((size_t)(b0 + i) * OC + oc) * P, bv = bias ? bias[oc] : 0.0f;
        const float *src = y + (size_t)oc * n * P + (size_t)i * P;
        for (int p = 0; p < P; p++) o[p] = src[p] + bv;
      }
  }
}

/* One chunk's backward: partial dweight (dw) and dbias (db) of this thread, and dinp. */
static void conv_chunk_backward(float *dinp, float *dw, float *db, float *col, float *y, const float *dout,
                                const float *inp, const float *weight, int b0, int n, int OC, const conv_geom_t *g) {
  const int P = g->OH * g->OW, ckk = g->C * g->KH * g->KW;
  const size_t img = (size_t)g->C * g->H * g->W, ld = (size_t)n * P;
  const float *cl = chunk_col(col, inp, b0, n, g), *d = dout + (size_t)b0 * OC * P;
  if (n > 1) { /* the chunk's gradient side by side like its columns: (OC, n*P) */
    for (int i = 0; i < n; i++)
      for (int oc = 0; oc < OC; oc++)
        memcpy(y + (size_t)oc * ld + (size_t)i * P, dout + ((size_t)(b0 + i) * OC + oc) * P, (size_t)P * sizeof *y);
    d = y;
  }
  dt_cpu_sgemm(0, 1, OC, ckk, (int)ld, 1.0f, d, (int)ld, cl, (int)ld, 1.0f, dw, ckk);
  for (int oc = 0; db && oc < OC; oc++) {
    float s = 0.0f;
    for (size_t p = 0; p < ld; p++) s += d[(size_t)oc * ld + p];
    db[oc] += s;
  }
  if (!dinp) return;
  if (n == 1 && is_pointwise(g)) { /* dinp_b = W^T dout_b directly */
    dt_cpu_sgemm(1, 0, ckk, P, OC, 1.0f, weight, ckk, d, P, 0.0f, dinp + (size_t)b0 * img, P);
    return;
  }
  dt_cpu_sgemm(1, 0, ckk, (int)ld, OC, 1.0f, weight, ckk, d, (int)ld, 0.0f, col, (int)ld); /* col no longer needed */
  for (int i = 0; i < n; i++) col2im(dinp + (size_t)(b0 + i) * img, col + (size_t)i * P, ld, g);
}

void dt_conv2d_backward(float *dinp, float *dweight, float *dbias, float *scratch, const float *dout,
                        const float *inp, const float *weight, int B, int C, int H, int W, int OC, int KH, int KW,
                        int stride, int pad, int nthr) {
  const int m = dt_conv_winograd_m(C, KH, KW, stride, pad);
  if (m) {
    dt_conv_winograd_backward(m, dinp, dweight, scratch, dout, inp, weight, B, C, H, W, OC, nthr);
    if (dbias) bias_grad(dbias, dout, B, OC, H * W, nthr);
    return;
  }
  const conv_geom_t g = {C, H, W, KH, KW, stride, pad, dt_conv_out(H, KH, stride, pad), dt_conv_out(W, KW, stride, pad)};
  const int P = g.OH * g.OW, ckk = C * KH * KW, G = conv_chunk(B, P, nthr), nch = (B + G - 1) / G;
  size_t yoff, part, per = conv_slice((size_t)ckk, (size_t)OC, (size_t)P, &yoff, &part);
  int used = nthr;
#pragma omp parallel num_threads(nthr)
  {
    int t = omp_get_thread_num();
    float *col = scratch + per * (size_t)t, *y = col + yoff, *dw = col + part, *db = dw + (size_t)OC * ckk;
    memset(dw, 0, ((size_t)OC * ckk + OC) * sizeof *dw);
#pragma omp single
    used = omp_get_num_threads();
#pragma omp for schedule(static)
    for (int k = 0; k < nch; k++) {
      int b0 = k * G, n = b0 + G <= B ? G : B - b0;
      conv_chunk_backward(dinp, dw, dbias ? db : NULL, col, y, dout, inp, weight, b0, n, OC, &g);
    }
  }
  /* partial sums in thread order */
  const size_t nw = (size_t)OC * ckk;
#pragma omp parallel for schedule(static) num_threads(nthr)
  for (size_t i = 0; i < nw + (size_t)OC; i++) {
    float s = 0.0f;
    for (int t = 0; t < used; t++) s += scratch[per * (size_t)t + part + i];
    if (i < nw) dweight[i] += s;
    else if (dbias) dbias[i - nw] += s;
  }
}

/* ---- batch normalisation ------------------------------------------------------------------- */

/* Sums in double over vector lanes (the order is fixed: the results do not depend on threads). */
DT_CPU_VEC static double plane_sum(const float *restrict x, int n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; i++) s += x[i];
  return s;
}

/* dbias[oc] += the sum of dout over b, y, x (Winograd's layers; im2col sums per chunk). */
static void bias_grad(float *dbias, const float *dout, int B, int OC, int HW, int nthr) {
#pragma omp parallel for schedule(static) num_threads(nthr)
  for (int oc = 0; oc < OC; oc++) {
    double s = 0.0;
    for (int b = 0; b < B; b++) s += plane_sum(dout + ((size_t)b * OC + oc) * HW, HW);
    dbias[oc] += (float)s;
  }
}

DT_CPU_VEC static double plane_sqdev(const float *restrict x, int n, double m) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; i++) s += (x[i] - m) * (x[i] - m);
  return s;
}

/* *s += the sum of g, *sx += the sum of g (x - m) r over a plane, g = d, or with y (a ReLU's output
 * after the batch norm) d where y > 0 and 0 elsewhere: the ReLU's backward on the fly. */
DT_CPU_VEC static void plane_dsums(const float *restrict d, const float *restrict y, const float *restrict x, int n,
                                   float m, float r, double *s, double *sx) {
  double a = 0.0, b = 0.0;
  if (y) {
#pragma omp simd reduction(+ : a, b)
    for (int i = 0; i < n; i++) { /* g = y > 0 ? d : 0 as a bit mask: GCC 12 vectorizes it, not the select */
      uint32_t bits;
      float g;
      memcpy(&bits, &d[i], sizeof bits);
      bits &= -(uint32_t)(y[i] > 0.0f);
      memcpy(&g, &bits, sizeof g);
      a += g;
      b += g * ((x[i] - m) * r);
    }
  } else {
#pragma omp simd reduction(+ : a, b)
    for (int i = 0; i < n; i++) {
      a += d[i];
      b += d[i] * ((x[i] - m) * r);
    }
  }
  *s += a;
  *sx += b;
}

void dt_batchnorm_stats(float *mean, float *var, const float *inp, int B, int C, int HW) {
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; c++) {
    double s = 0.0, s2 = 0.0, n = (double)B * HW;
    for (int b = 0; b < B; b++) s += plane_sum(inp + ((size_t)b * C + c) * HW, HW);
    double m = s / n;
    for (int b = 0; b < B; b++) s2 += plane_sqdev(inp + ((size_t)b * C + c) * HW, HW, m);
    mean[c] = (float)m;
    var[c] = (float)(s2 / n);
  }
}

void dt_batchnorm_running(float *running_mean, float *running_var, const float *mean, const float *var, int C,
                          float momentum, double n) {
  double unbias = n > 1 ? n / (n - 1) : 1.0;
  for (int c = 0; c < C; c++) {
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean[c];
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)(var[c] * unbias);
  }
}

DT_CPU_VEC void dt_batchnorm_forward(float *out, float *rstd, const float *inp, const float *mean, const float *var,
                                     const float *weight, const float *bias, float eps, int relu, int B, int C,
                                     int HW) {
#pragma omp parallel for schedule(static)
  for (int bc = 0; bc < B * C; bc++) {
    int c = bc % C;
    float r = 1.0f / sqrtf(var[c] + eps), m = mean[c], a = r * weight[c], sh = bias[c];
    if (rstd && bc < C) rstd[c] = r;
    const float *restrict x = inp + (size_t)bc * HW;
    float *restrict o = out + (size_t)bc * HW;
    if (relu) {
#pragma omp simd
      for (int i = 0; i < HW; i++) {
        float v = (x[i] - m) * a + sh;
        o[i] = v > 0.0f ? v : 0.0f;
      }
    } else {
#pragma omp simd
      for (int i = 0; i < HW; i++) o[i] = (x[i] - m) * a + sh;
    }
  }
}

void dt_batchnorm_backward_reduce(float *sdy, float *sdyx, float *dweight, float *dbias, const float *dout,
                                  const float *relu_out, const float *inp, const float *mean, const float *rstd, int B,
                                  int C, int HW) {
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; c++) {
    double s = 0.0, sx = 0.0;
    for (int b = 0; b < B; b++) {
      size_t at = ((size_t)b * C + c) * HW;
      plane_dsums(dout + at, relu_out ? relu_out + at : NULL, inp + at, HW, mean[c], rstd[c], &s, &sx);
    }
    sdy[c] = (float)s;
    sdyx[c] = (float)sx;
    dweight[c] += (float)sx;
    dbias[c] += (float)s;
  }
}

DT_CPU_VEC void dt_batchnorm_backward(float *dinp, const float *dout, const float *relu_out, const float *inp,
                                      const float *mean, const float *rstd, const float *weight, const float *sdy,
                                      const float *sdyx, double count, int B, int C, int HW) {
#pragma omp parallel for schedule(static)
  for (int bc = 0; bc < B * C; bc++) {
    int c = bc % C;
    float a = weight[c] * rstd[c], m = mean[c], r = rstd[c];
    float gm = sdy ? (float)(sdy[c] / count) : 0.0f, gxm = sdyx ? (float)(sdyx[c] / count) : 0.0f;
    const float *restrict x = inp + (size_t)bc * HW, *restrict d = dout + (size_t)bc * HW;
    float *restrict o = dinp + (size_t)bc * HW;
    if (relu_out) {
      const float *restrict y = relu_out + (size_t)bc * HW;
#pragma omp simd
      for (int i = 0; i < HW; i++) o[i] = a * ((y[i] > 0.0f ? d[i] : 0.0f) - gm - (x[i] - m) * r * gxm);
    } else {
#pragma omp simd
      for (int i = 0; i < HW; i++) o[i] = a * (d[i] - gm - (x[i] - m) * r * gxm);
    }
  }
}

/* ---- ReLU ---------------------------------------------------------------------------------- */

DT_CPU_VEC void dt_relu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

DT_CPU_VEC void dt_add_relu_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float s = a[i] + b[i];
    out[i] = s > 0.0f ? s : 0.0f;
  }
}

DT_CPU_VEC void dt_relu_backward(float *dinp, const float *dout, const float *out, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

/* ---- pooling ------------------------------------------------------------------------------- */

void dt_maxpool_forward(float *out, int *idx, const float *inp, int B, int C, int H, int W, int K, int stride,
                        int pad) {
  const int OH = dt_conv_out(H, K, stride, pad), OW = dt_conv_out(W, K, stride, pad);
#pragma omp parallel for schedule(static)
  for (int bc = 0; bc < B * C; bc++) {
    const float *plane = inp + (size_t)bc * H * W;
    for (int y = 0; y < OH; y++)
      for (int x = 0; x < OW; x++) {
        float best;
        idx[((size_t)bc * OH + y) * OW + x] = dt_maxpool_at(plane, H, W, K, stride, pad, y, x, &best);
        out[((size_t)bc * OH + y) * OW + x] = best;
      }
  }
}

void dt_maxpool_backward(float *dinp, const float *dout, const int *idx, int B, int C, int H, int W, int OH, int OW) {
#pragma omp parallel for schedule(static)
  for (int bc = 0; bc < B * C; bc++) {
    float *plane = dinp + (size_t)bc * H * W;
    memset(plane, 0, (size_t)H * W * sizeof *plane);
    const float *d = dout + (size_t)bc * OH * OW;
    const int *ix = idx + (size_t)bc * OH * OW;
    for (int p = 0; p < OH * OW; p++)
      if (ix[p] >= 0) plane[ix[p]] += d[p];
  }
}

void dt_avgpool_forward(float *out, const float *inp, int B, int C, int H, int W, int K, int stride, int pad) {
  const int OH = dt_conv_out(H, K, stride, pad), OW = dt_conv_out(W, K, stride, pad);
  const float inv = 1.0f / (float)(K * K);
#pragma omp parallel for schedule(static)
  for (int bc = 0; bc < B * C; bc++) {
    const float *plane = inp + (size_t)bc * H * W;
    for (int y = 0; y < OH; y++)
      for (int x = 0; x < OW; x++) {
        float s = 0.0f;
        for (int i = 0; i < K; i++) {
          int iy = y * stride - pad + i;
          if (iy < 0 || iy >= H) continue;
          for (int j = 0; j < K; j++) {
            int ix = x * stride - pad + j;
            if (ix >= 0 && ix < W) s += plane[iy * W + ix];
          }
        }
        out[((size_t)bc * OH + y) * OW + x] = s * inv;
      }
  }
}

void dt_avgpool_backward(float *dinp, const float *dout, int B, int C, int H, int W, int K, int stride, int pad) {
  const int OH = dt_conv_out(H, K, stride, pad), OW = dt_conv_out(W, K, stride, pad);
  const float inv = 1.0f / (float)(K * K);
#pragma omp parallel for schedule(static)
  for (int bc = 0; bc < B * C; bc++) {
    float *plane = dinp + (size_t)bc * H * W;
    memset(plane, 0, (size_t)H * W * sizeof *plane);
    const float *d = dout + (size_t)bc * OH * OW;
    for (int y = 0; y < OH; y++)
      for (int x = 0; x < OW; x++) {
        float g = d[y * OW + x] * inv;
        for (int i = 0; i < K; i++) {
          int iy = y * stride - pad + i;
          if (iy < 0 || iy >= H) continue;
          for (int j = 0; j < K; j++) {
            int ix = x * stride - pad + j;
            if (ix >= 0 && ix < W) plane[iy * W + ix] += g;
          }
        }
      }
  }
}

void dt_global_avgpool_forward(float *out, const float *inp, int B, int C, int HW) {
#pragma omp parallel for schedule(static)
  for (int bc = 0; bc < B * C; bc++) {
    const float *x = inp + (size_t)bc * HW;
    float s = 0.0f;
    for (int i = 0; i < HW; i++) s += x[i];
    out[bc] = s / (float)HW;
  }
}

void dt_global_avgpool_backward(float *dinp, const float *dout, int B, int C, int HW) {
#pragma omp parallel for schedule(static)
  for (int bc = 0; bc < B * C; bc++) {
    float g = dout[bc] / (float)HW, *d = dinp + (size_t)bc * HW;
    for (int i = 0; i < HW; i++) d[i] = g;
  }
}
