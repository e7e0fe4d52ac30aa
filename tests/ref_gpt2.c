/* Reference forwards and the finite-difference check (ref_gpt2.h). */
#include "ref_gpt2.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "model.h" /* dt_rng_t */

void fill_normal(float *x, size_t n, double s, uint64_t seed) {
  dt_rng_t r;
  dt_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(s * dt_rng_normal(&r));
}

double *to_double(const float *x, size_t n) {
  double *d = malloc(n * sizeof *d);
  for (size_t i = 0; i < n; i++)
    d[i] = x[i];
  return d;
}

/* Central differences of f over x[0..n) (double inputs the objective reads) against `analytic`. */
void fd_check(const char *what, double *x, size_t n, const float *analytic, objective_fn f, void *ctx) {
  double maxdiff = 0.0, maxfd = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < n; i++) {
    double x0 = x[i];
    x[i] = x0 + FD_H;
    double fp = f(ctx);
    x[i] = x0 - FD_H;
    double fm = f(ctx);
    x[i] = x0;
    double fd = (fp - fm) / (2 * FD_H);
    double diff = fabs(fd - analytic[i]);
    if (diff > maxdiff) maxdiff = diff, worst = i;
    if (fabs(fd) > maxfd) maxfd = fabs(fd);
  }
  cr_expect(maxfd > 0.0, "%s: finite-difference gradient is identically zero", what);
  cr_expect(maxdiff <= FD_TOL * maxfd, "%s: max|analytic - fd| = %.3e > %.0e * %.3e (worst index %zu)", what, maxdiff,
            FD_TOL, maxfd, worst);
}

void expect_close(const char *what, const float *a, const double *b, size_t n, double tol) {
  double maxdiff = 0.0, maxb = 1e-30;
  for (size_t i = 0; i < n; i++) {
    if (fabs(a[i] - b[i]) > maxdiff) maxdiff = fabs(a[i] - b[i]);
    if (fabs(b[i]) > maxb) maxb = fabs(b[i]);
  }
  cr_expect(maxdiff <= tol * maxb, "%s: max diff %.3e > %.0e * %.3e", what, maxdiff, tol, maxb);
}

double dot(const double *a, const double *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* ---- independent double-precision reference forwards ------------------------------------------ */

void ref_layernorm(double *out, const double *x, const double *w, const double *b, int N, int C) {
  for (int i = 0; i < N; i++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++)
      m += x[i * C + c] / C;
    for (int c = 0; c < C; c++)
      v += (x[i * C + c] - m) * (x[i * C + c] - m) / C;
    for (int c = 0; c < C; c++)
      out[i * C + c] = (x[i * C + c] - m) / sqrt(v + 1e-5) * w[c] + b[c];
  }
}

/* out = x W^T + b with W (OC, C) (nn.Linear: the lm_head) or, conv1d = 1, out = x W + b with
 * W (C, OC) (Hugging Face's Conv1D: the blocks' weights). */
void ref_linear(double *out, const double *x, const double *W, const double *b, int N, int C, int OC, int conv1d) {
  for (int i = 0; i < N; i++)
    for (int o = 0; o < OC; o++) {
      double s = b ? b[o] : 0.0;
      for (int c = 0; c < C; c++)
        s += x[i * C + c] * (conv1d ? W[c * OC + o] : W[o * C + c]);
      out[i * OC + o] = s;
    }
}
void ref_matmul(double *out, const double *x, const double *W, const double *b, int N, int C, int OC) {
  ref_linear(out, x, W, b, N, C, OC, 0);
}
void ref_conv1d(double *out, const double *x, const double *W, const double *b, int N, int C, int OC) {
  ref_linear(out, x, W, b, N, C, OC, 1);
}

void ref_attention(double *out, const double *qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  double *w = malloc((size_t)T * sizeof *w);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const double *q = qkv + (size_t)(b * T + t) * 3 * C + h * hs;
        double mx = -1e300, s = 0;
        for (int j = 0; j <= t; j++) {
          const double *k = qkv + (size_t)(b * T + j) * 3 * C + C + h * hs;
          w[j] = 0;
          for (int e = 0; e < hs; e++)
            w[j] += q[e] * k[e];
          w[j] /= sqrt((double)hs);
          if (w[j] > mx) mx = w[j];
        }
        for (int j = 0; j <= t; j++)
          s += (w[j] = exp(w[j] - mx));
        for (int e = 0; e < hs; e++) {
          double acc = 0;
          for (int j = 0; j <= t; j++)
            acc += w[j] / s * qkv[(size_t)(b * T + j) * 3 * C + 2 * C + h * hs + e];
          out[(size_t)(b * T + t) * C + h * hs + e] = acc;
        }
      }
  free(w);
}

double ref_gelu(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

double ref_crossentropy(const double *logits, const int *tgt, int N, int V, int Vp) {
  double total = 0;
  for (int i = 0; i < N; i++) {
    double mx = -1e300, s = 0;
    for (int v = 0; v < V; v++)
      mx = fmax(mx, logits[i * Vp + v]);
    for (int v = 0; v < V; v++)
      s += exp(logits[i * Vp + v] - mx);
    total += mx + log(s) - logits[i * Vp + tgt[i]];
  }
  return total / N;
}
