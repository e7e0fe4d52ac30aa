/* Dump the CNN layer kernels (src/backend/ops_cnn_cpu.c) and the SGD update (kmath.h) on random
 * inputs for the PyTorch reference (tests/ref/ref_cnn.py). Each case writes a "NAME/meta" record
 * (its shape numbers), its inputs and its outputs. Parameter gradients start at 0.25 (the kernels
 * must add to them), activation gradients at NaN (they must be written). Convolutions run with 1
 * thread and with 2 under each algorithm (im2col, Winograd F(2x2) and F(4x4)), all dumped. File
 * format: records of { char name[64]; int64 n; float32 data[n] } (tests/dump.h).
 * Usage: cnn_dump OUT.bin */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dump.h"
#include "kmath.h"
#include "conv_winograd.h"
#include "ops_cnn_cpu.h"
#include "model.h"

static FILE *out;
static dt_rng_t rng;

static void rec(const char *c, const char *what, const float *x, size_t n) {
  char nm[64];
  snprintf(nm, sizeof nm, "%s/%s", c, what);
  dump_rec(out, nm, x, n);
}

static void meta(const char *c, int n, const int *v) {
  float f[16];
  for (int i = 0; i < n; i++) f[i] = (float)v[i];
  rec(c, "meta", f, (size_t)n);
}

static float *rnd(size_t n, float scale) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = scale * (float)dt_rng_normal(&rng);
  return x;
}

static float *fill(size_t n, float v) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = v;
  return x;
}

/* Every case runs under each convolution algorithm (conv_winograd.h), outputs named with its suffix:
 * "" auto (Winograd F(2x2) for 3x3 stride-1 padding-1 layers of 16+ channels), "_im2col", "_w4"
 * (F(4x4) where Winograd applies); cases it does not apply to repeat im2col's results. */
static const struct {
  dt_conv_algo_t algo;
  const char *suffix;
} algos[] = {{DT_CONV_AUTO, ""}, {DT_CONV_IM2COL, "_im2col"}, {DT_CONV_WINOGRAD4, "_w4"}};

static void conv_case(const char *c, int B, int C, int H, int W, int OC, int K, int s, int p, int with_bias) {
  int OH = dt_conv_out(H, K, s, p), OW = dt_conv_out(W, K, s, p);
  size_t ni = (size_t)B * C * H * W, no = (size_t)B * OC * OH * OW, nw = (size_t)OC * C * K * K;
  int m[] = {B, C, H, W, OC, K, s, p, with_bias};
  meta(c, 9, m);
  float *x = rnd(ni, 1.0f), *w = rnd(nw, 0.3f), *bias = with_bias ? rnd((size_t)OC, 0.5f) : NULL, *dy = rnd(no, 1.0f);
  rec(c, "x", x, ni);
  rec(c, "w", w, nw);
  if (bias) rec(c, "b", bias, (size_t)OC);
  rec(c, "dy", dy, no);
  for (size_t a = 0; a < sizeof algos / sizeof *algos; a++) {
    dt_conv_set_algo(algos[a].algo);
    /* NaN: the kernels must not read scratch they did not write (a partial they did not zero) */
    float *scr = fill(dt_conv2d_scratch_floats(C, K, K, OC, OH, OW, s, p, 2), NAN);
    for (int nthr = 1; nthr <= 2; nthr++) {
      float *y = fill(no, NAN), *dx = fill(ni, NAN), *dw = fill(nw, 0.25f), *db = fill((size_t)OC, 0.25f);
      dt_conv2d_forward(y, scr, x, w, bias, B, C, H, W, OC, K, K, s, p, nthr);
      dt_conv2d_backward(dx, dw, bias ? db : NULL, scr, dy, x, w, B, C, H, W, OC, K, K, s, p, nthr);
      char what[32];
      snprintf(what, sizeof what, "y%d%s", nthr, algos[a].suffix), rec(c, what, y, no);
      snprintf(what, sizeof what, "dx%d%s", nthr, algos[a].suffix), rec(c, what, dx, ni);
      snprintf(what, sizeof what, "dw%d%s", nthr, algos[a].suffix), rec(c, what, dw, nw);
      if (bias) snprintf(what, sizeof what, "db%d%s", nthr, algos[a].suffix), rec(c, what, db, (size_t)OC);
      free(y), free(dx), free(dw), free(db);
    }
    free(scr);
  }
  dt_conv_set_algo(DT_CONV_AUTO);
  free(x), free(w), free(bias), free(dy);
}

/* training: stats, running, forward, backward_reduce, backward; then evaluation mode */
static void bn_case(const char *c, int B, int C, int HW) {
  size_t n = (size_t)B * C * HW;
  int m[] = {B, C, HW};
  meta(c, 3, m);
  float *x = rnd(n, 2.0f), *w = rnd((size_t)C, 1.0f), *b = rnd((size_t)C, 1.0f), *dy = rnd(n, 1.0f);
  for (size_t i = 0; i < n; i++) x[i] += 3.0f; /* a mean far from 0 */
  float *rm = rnd((size_t)C, 1.0f), *rv = fill((size_t)C, 0.0f), mean[64], var[64], rstd[64], sdy[64], sdyx[64];
  for (int i = 0; i < C; i++) rv[i] = 0.5f + (float)dt_rng_uniform(&rng);
  rec(c, "x", x, n), rec(c, "w", w, (size_t)C), rec(c, "b", b, (size_t)C), rec(c, "dy", dy, n);
  rec(c, "rm0", rm, (size_t)C), rec(c, "rv0", rv, (size_t)C);
  float *y = fill(n, NAN), *dx = fill(n, NAN), *dw = fill((size_t)C, 0.25f), *db = fill((size_t)C, 0.25f);
  dt_batchnorm_stats(mean, var, x, B, C, HW);
  dt_batchnorm_running(rm, rv, mean, var, C, 0.1f, (double)B * HW);
  dt_batchnorm_forward(y, rstd, x, mean, var, w, b, 1e-5f, 0, B, C, HW);
  dt_batchnorm_backward_reduce(sdy, sdyx, dw, db, dy, NULL, x, mean, rstd, B, C, HW);
  dt_batchnorm_backward(dx, dy, NULL, x, mean, rstd, w, sdy, sdyx, (double)B * HW, B, C, HW);
  rec(c, "y", y, n), rec(c, "dx", dx, n), rec(c, "dw", dw, (size_t)C), rec(c, "db", db, (size_t)C);
  rec(c, "rm1", rm, (size_t)C), rec(c, "rv1", rv, (size_t)C);
  /* evaluation mode with the updated running statistics; dinp in place over a copy of dy */
  memcpy(dx, dy, n * sizeof *dx);
  dt_batchnorm_forward(y, rstd, x, rm, rv, w, b, 1e-5f, 0, B, C, HW);
  dt_batchnorm_backward(dx, dx, NULL, x, rm, rstd, w, NULL, NULL, 0.0, B, C, HW);
  rec(c, "y_eval", y, n), rec(c, "dx_eval", dx, n);
  free(x), free(w), free(b), free(dy), free(rm), free(rv), free(y), free(dx), free(dw), free(db);
}

/* kind 0 max, 1 average; ties: inputs rounded to integers so windows hold equal maxima */
static void pool_case(const char *c, int kind, int B, int C, int H, int W, int K, int s, int p, int ties) {
  int OH = dt_conv_out(H, K, s, p), OW = dt_conv_out(W, K, s, p);
  size_t ni = (size_t)B * C * H * W, no = (size_t)B * C * OH * OW;
  int m[] = {kind, B, C, H, W, K, s, p};
  meta(c, 8, m);
  float *x = rnd(ni, 2.0f), *dy = rnd(no, 1.0f), *y = fill(no, NAN), *dx = fill(ni, NAN);
  if (ties)
    for (size_t i = 0; i < ni; i++) x[i] = roundf(x[i]);
  int *idx = malloc(no * sizeof *idx);
  if (kind == 0) {
    dt_maxpool_forward(y, idx, x, B, C, H, W, K, s, p);
    dt_maxpool_backward(dx, dy, idx, B, C, H, W, OH, OW);
  } else {
    dt_avgpool_forward(y, x, B, C, H, W, K, s, p);
    dt_avgpool_backward(dx, dy, B, C, H, W, K, s, p);
  }
  rec(c, "x", x, ni), rec(c, "dy", dy, no), rec(c, "y", y, no), rec(c, "dx", dx, ni);
  free(x), free(dy), free(y), free(dx), free(idx);
}

static void pointwise_cases(void) {
  int B = 3, C = 4, HW = 25, n = B * C * HW, m[] = {B, C, HW};
  float *x = rnd((size_t)n, 1.0f), *dy = rnd((size_t)n, 1.0f), *y = fill((size_t)n, NAN), *dx = fill((size_t)n, NAN);
  meta("relu", 3, m);
  x[0] = 0.0f; /* relu'(0) = 0, as PyTorch's threshold_backward */
  dt_relu_forward(y, x, (size_t)n);
  memcpy(dx, dy, (size_t)n * sizeof *dx);
  dt_relu_backward(dx, dx, y, (size_t)n); /* in place */
  rec("relu", "x", x, (size_t)n), rec("relu", "dy", dy, (size_t)n), rec("relu", "y", y, (size_t)n);
  rec("relu", "dx", dx, (size_t)n);
  meta("gap", 3, m);
  float *g = fill((size_t)(B * C), NAN), *dg = rnd((size_t)(B * C), 1.0f);
  dt_global_avgpool_forward(g, x, B, C, HW);
  for (int i = 0; i < n; i++) dx[i] = NAN;
  dt_global_avgpool_backward(dx, dg, B, C, HW);
  rec("gap", "x", x, (size_t)n), rec("gap", "dy", dg, (size_t)(B * C)), rec("gap", "y", g, (size_t)(B * C));
  rec("gap", "dx", dx, (size_t)n);
  free(x), free(dy), free(y), free(dx), free(g), free(dg);
}

/* 6 SGD steps over 40 parameters, with and without Nesterov */
static void sgd_case(const char *c, int nesterov) {
  enum { N = 40, S = 6 };
  int m[] = {N, S, nesterov};
  meta(c, 3, m);
  float *p = rnd(N, 1.0f), buf[N] = {0};
  rec(c, "p0", p, N);
  for (int s = 0; s < S; s++) {
    float *g = rnd(N, 1.0f);
    char what[16];
    snprintf(what, sizeof what, "g%d", s), rec(c, what, g, N);
    for (int i = 0; i < N; i++) p[i] = dt_sgd_update(p[i], g[i], &buf[i], 0.1f, 0.9f, 5e-2f, nesterov);
    free(g);
  }
  rec(c, "p", p, N);
  free(p);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: cnn_dump OUT.bin\n");
    return 2;
  }
  out = fopen(argv[1], "wb");
  if (!out) {
    perror(argv[1]);
    return 1;
  }
  dt_rng_seed(&rng, 25);
  conv_case("conv_3x3", 2, 3, 9, 7, 4, 3, 1, 1, 1);
  conv_case("conv_3x3_s2", 3, 4, 11, 10, 5, 3, 2, 1, 0);
  conv_case("conv_stem7", 2, 3, 16, 16, 8, 7, 2, 3, 0);
  conv_case("conv_1x1", 2, 6, 5, 5, 7, 1, 1, 0, 1);
  conv_case("conv_1x1_b1", 1, 6, 5, 5, 7, 1, 1, 0, 1); /* one image: with 2 threads, one has no chunk */
  conv_case("conv_1x1_s2", 3, 4, 8, 8, 6, 1, 2, 0, 0);
  conv_case("conv_5x5_mnist", 4, 1, 28, 28, 8, 5, 1, 0, 1);
  /* small feature maps: several images side by side in one product (ops_cnn_cpu.c's chunks) */
  conv_case("conv_3x3_4x4", 5, 16, 4, 4, 12, 3, 1, 1, 1);
  conv_case("conv_3x3_s2_8x8", 5, 8, 8, 8, 16, 3, 2, 1, 0);
  conv_case("conv_1x1_4x4", 5, 16, 4, 4, 24, 1, 1, 0, 1);
  /* Winograd (conv_winograd.c): partial tiles at odd sizes; images in several chunks with a short
   * last one (32x32: 256 tiles of F(2x2) per image, one image per chunk; 64 of F(4x4), two); a tile
   * row wider than one transform block (70 tiles of F(2x2) across); more channels than one block */
  conv_case("conv_3x3_wino_odd", 3, 16, 9, 7, 20, 3, 1, 1, 1);
  conv_case("conv_3x3_wino_chunks", 3, 17, 32, 32, 8, 3, 1, 1, 0);
  conv_case("conv_3x3_wino_wide", 1, 16, 3, 140, 4, 3, 1, 1, 1);
  conv_case("conv_3x3_wino_c80", 2, 80, 6, 5, 70, 3, 1, 1, 0); /* channels in two blocks of the filter transform */
  bn_case("bn_4x3", 4, 3, 30);
  bn_case("bn_1x1", 8, 5, 1);
  pool_case("maxpool_3s2p1", 0, 2, 3, 9, 9, 3, 2, 1, 0);
  pool_case("maxpool_2s2_ties", 0, 2, 2, 8, 8, 2, 2, 0, 1);
  pool_case("maxpool_3s1_ties", 0, 1, 2, 6, 7, 3, 1, 1, 1);
  pool_case("avgpool_2s2", 1, 2, 3, 8, 8, 2, 2, 0, 0);
  pool_case("avgpool_3s2p1", 1, 2, 2, 7, 7, 3, 2, 1, 0);
  pointwise_cases();
  sgd_case("sgd", 0);
  sgd_case("sgd_nesterov", 1);
  if (fclose(out)) {
    perror(argv[1]);
    return 1;
  }
  return 0;
}
