/* The per-element and per-row arithmetic of src/core/kmath.h that the CPU backend and the CUDA kernels
 * share, against independent double-precision references: GELU and its derivative (central
 * finite differences of the double GELU), AdamW (hand-computed values), the layernorm row
 * statistics and backward terms, the online softmax and its merge (any split of a row gives the
 * row's log-sum-exp), the cross-entropy gradient and the softmax backward; the bf16 and fp16
 * storage rounding of mixed precision against an exact round-to-nearest-even reference in
 * double arithmetic (every bf16/fp16 value, every midpoint and its float neighbours, overflow,
 * subnormals, NaN, and a sweep of 21M float bit patterns; fp16 also against _Float16), and the
 * 16-bit patterns of both formats decoded and encoded back (cuda/convert16.cu's). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kmath.h"
#include "model.h"

static double gelu_d(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

/* deterministic values in [-a, a) */
static void fill(float *x, int n, double a, uint64_t seed) {
  dt_rng_t r;
  dt_rng_seed(&r, seed);
  for (int i = 0; i < n; i++) x[i] = (float)((2 * dt_rng_uniform(&r) - 1) * a);
}

Test(kmath, gelu_value_and_derivative_vs_double) {
  for (double x = -6; x <= 6; x += 0.05) {
    cr_expect(fabs(dt_gelu((float)x) - gelu_d((float)x)) < 2e-6 + 1e-6 * fabs(x), "gelu(%g)", x);
    double h = 1e-4, xf = (float)x;
    double fd = (gelu_d(xf + h) - gelu_d(xf - h)) / (2 * h);
    cr_expect(fabs(dt_gelu_grad((float)x) - fd) < 2e-6, "gelu'(%g) = %.9g, finite difference %.9g", x,
              dt_gelu_grad((float)x), fd);
  }
}

/* One step from p = 2, m = v = 0 with g = -1, lr = 0.01, beta1 = 0.9, beta2 = 0.99, eps = 1e-8,
 * wd = 0 (t = 1: bc1 = 0.1, bc2 = 0.01):
 *   m = -0.1, v = 0.01;  denom = sqrt(0.01)/sqrt(0.01) + 1e-8 = 1.00000001
 *   p = 2 - (0.01/0.1) * (-0.1) / 1.00000001 = 2.0099999999   (Adam's first step moves by lr)
 * and with wd = 0.5: p first becomes 2 - 0.01*0.5*2 = 1.99, then 1.99 + 0.01 = 2.0 (to 1e-8). */
Test(kmath, adamw_first_step_by_hand) {
  float m = 0, v = 0;
  float p = dt_adamw_update(2.0f, -1.0f, &m, &v, 0.01f, 0.9f, 0.99f, 1e-8f, 0.0f, 0.1f, 0.01f);
  cr_expect_float_eq(m, -0.1f, 1e-7);
  cr_expect_float_eq(v, 0.01f, 1e-8);
  cr_expect(fabs(p - 2.01) < 2e-6, "p = %.9g, expected 2.01", p);
  m = v = 0;
  p = dt_adamw_update(2.0f, -1.0f, &m, &v, 0.01f, 0.9f, 0.99f, 1e-8f, 0.5f, 0.1f, 0.01f);
  cr_expect(fabs(p - 2.0) < 2e-6, "with decay p = %.9g, expected 2.0", p);
}

Test(kmath, layernorm_row_vs_double) {
  enum { C = 96 };
  float x[C], w[C], b[C], g[C];
  for (int trial = 0; trial < 4; trial++) {
    fill(x, C, 3.0, 10 + trial);
    for (int c = 0; c < C; c++) x[c] += 5.0f * trial; /* a large mean: the two-pass variance must hold */
    fill(w, C, 1.5, 20 + trial);
    fill(b, C, 0.5, 30 + trial);
    fill(g, C, 1.0, 40 + trial);
    double s = 0, s2 = 0;
    for (int c = 0; c < C; c++) s += x[c];
    double md = s / C;
    for (int c = 0; c < C; c++) s2 += (x[c] - md) * (x[c] - md);
    double rd = 1 / sqrt(s2 / C + 1e-5);
    float mean, rstd;
    dt_ln_row_stats(x, C, &mean, &rstd);
    cr_expect(fabs(mean - md) < 1e-5 * (1 + fabs(md)), "mean %.9g vs %.9g", mean, md);
    cr_expect(fabs(rstd - rd) < 1e-5 * rd, "rstd %.9g vs %.9g", rstd, rd);
    /* backward: y = n w + b, n = (x - mean) rstd; dx from the double formula */
    double gm = 0, gnm = 0;
    for (int c = 0; c < C; c++) {
      double n = (x[c] - md) * rd;
      gm += (double)w[c] * g[c];
      gnm += (double)w[c] * g[c] * n;
    }
    gm /= C;
    gnm /= C;
    float fgm, fgnm;
    dt_ln_row_bwd_sums(x, g, w, mean, rstd, C, &fgm, &fgnm);
    cr_expect(fabs(fgm - gm) < 1e-5, "mean(w g) %.9g vs %.9g", fgm, gm);
    cr_expect(fabs(fgnm - gnm) < 1e-5, "mean(w g n) %.9g vs %.9g", fgnm, gnm);
    for (int c = 0; c < C; c++) {
      double n = (x[c] - md) * rd;
      double dx = rd * ((double)w[c] * g[c] - gm - n * gnm);
      float f = dt_ln_dinp(x[c], mean, rstd, w[c], g[c], fgm, fgnm);
      cr_expect(fabs(f - dx) < 1e-4 * (1 + fabs(dx)), "dx[%d] %.9g vs %.9g", c, f, dx);
      double y = n * w[c] + b[c];
      cr_expect(fabs(dt_ln_apply(x[c], mean, rstd, w[c], b[c]) - y) < 1e-5 * (1 + fabs(y)), "y[%d]", c);
    }
  }
}

/* The layernorm backward terms are the gradient of sum_c g_c y_c: check dx by finite differences
 * of the double forward (so the formula itself is tested, not only its float evaluation). */
Test(kmath, layernorm_dinp_is_the_gradient) {
  enum { C = 16 };
  float x[C], w[C], g[C];
  fill(x, C, 2.0, 1);
  fill(w, C, 1.5, 2);
  fill(g, C, 1.0, 3);
  float mean, rstd, gm, gnm;
  dt_ln_row_stats(x, C, &mean, &rstd);
  dt_ln_row_bwd_sums(x, g, w, mean, rstd, C, &gm, &gnm);
  for (int k = 0; k < C; k++) {
    double f[2];
    for (int sgn = 0; sgn < 2; sgn++) {
      double xx[C], h = sgn ? -1e-5 : 1e-5, s = 0, s2 = 0, o = 0;
      for (int c = 0; c < C; c++) xx[c] = x[c] + (c == k ? h : 0);
      for (int c = 0; c < C; c++) s += xx[c];
      double m = s / C;
      for (int c = 0; c < C; c++) s2 += (xx[c] - m) * (xx[c] - m);
      double r = 1 / sqrt(s2 / C + 1e-5);
      for (int c = 0; c < C; c++) o += g[c] * ((xx[c] - m) * r * w[c]);
      f[sgn] = o;
    }
    double fd = (f[0] - f[1]) / 2e-5;
    float an = dt_ln_dinp(x[k], mean, rstd, w[k], g[k], gm, gnm);
    cr_expect(fabs(an - fd) < 1e-3 * (1 + fabs(fd)), "dx[%d] = %.7g, finite difference %.7g", k, an, fd);
  }
}

Test(kmath, online_softmax_and_merge_vs_double) {
  enum { V = 1000 };
  float *z = malloc(V * sizeof *z);
  fill(z, V, 8.0, 99);
  z[17] = 40.0f; /* a dominant logit: the running max must rescale the sum */
  double mx = -INFINITY, s = 0;
  for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
  for (int v = 0; v < V; v++) s += exp(z[v] - mx);
  double lse = mx + log(s);
  cr_expect(fabs(dt_row_lse(z, V) - lse) < 1e-5 * fabs(lse), "row lse %.9g vs %.9g", dt_row_lse(z, V), lse);
  /* any split into strided parts (as a warp or block reduces) merges to the same lse */
  int parts[] = {2, 7, 32, 256, 1024};
  for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
    int P = parts[k];
    float m = -INFINITY, sum = 0;
    for (int p = 0; p < P; p++) {
      float pm = -INFINITY, ps = 0;
      for (int v = p; v < V; v += P) dt_softmax_online(&pm, &ps, z[v]);
      dt_softmax_merge(&m, &sum, pm, ps); /* some parts are empty when P > V */
    }
    cr_expect(fabs(dt_softmax_lse(m, sum) - lse) < 1e-5 * fabs(lse), "%d parts: lse %.9g vs %.9g", P,
              dt_softmax_lse(m, sum), lse);
  }
  free(z);
}

Test(kmath, crossentropy_gradient_vs_double) {
  enum { V = 50 };
  float z[V];
  fill(z, V, 4.0, 5);
  float lse = dt_row_lse(z, V);
  double mx = -INFINITY, s = 0;
  for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
  for (int v = 0; v < V; v++) s += exp(z[v] - mx);
  int target = 13;
  double dloss = 0.125, total = 0;
  for (int v = 0; v < V; v++) {
    double p = exp(z[v] - mx) / s, ref = (p - (v == target)) * dloss;
    float d = dt_ce_dlogit(z[v], lse, v == target, (float)dloss);
    cr_expect(fabs(d - ref) < 1e-6, "dlogit[%d] %.9g vs %.9g", v, d, ref);
    total += d;
  }
  cr_expect(fabs(total) < 1e-6, "cross-entropy gradient sums to %g, not 0", total);
}

Test(kmath, softmax_backward_vs_double) {
  enum { T = 12 };
  float a[T], d[T];
  fill(d, T, 1.0, 8);
  float raw[T];
  fill(raw, T, 3.0, 9);
  float lse = dt_row_lse(raw, T);
  for (int j = 0; j < T; j++) a[j] = expf(raw[j] - lse);
  double dot = 0;
  for (int j = 0; j < T; j++) dot += (double)a[j] * d[j];
  /* reference: Jacobian of softmax, J_jk = a_j (delta_jk - a_k), times d */
  for (int j = 0; j < T; j++) {
    double ref = 0;
    for (int k = 0; k < T; k++) ref += (double)a[j] * ((j == k) - a[k]) * d[k];
    cr_expect(fabs(dt_softmax_bwd(a[j], d[j], (float)dot) - ref) < 1e-6, "dpre[%d]", j);
  }
}

/* ---- storage-precision rounding (dt_round_bf16, dt_round_fp16) ---------------------------- */

/* Exact round-to-nearest-even of x to a binary format with p significant bits, smallest normal
 * exponent emin (subnormals below, same quantum) and largest finite value maxv, in double
 * arithmetic (every step below is exact for float inputs): the two grid neighbours lo <= |x| <
 * hi, the nearer one, on a tie the one with an even multiple of the quantum; above maxv: inf.
 * Independent of the bit tricks in kmath.h. */
static double ref_round(double x, int p, int emin, double maxv) {
  if (isnan(x) || isinf(x) || x == 0) return x;
  double a = fabs(x);
  int e;
  frexp(a, &e); /* a = m 2^e, m in [0.5, 1): leading bit 2^(e-1) */
  int lead = e - 1 < emin ? emin : e - 1;
  double q = ldexp(1.0, lead - (p - 1));
  double k = floor(a / q), lo = k * q, hi = lo + q;
  double r = a - lo < hi - a ? lo : a - lo > hi - a ? hi : fmod(k, 2.0) == 0 ? lo : hi;
  if (r > maxv) r = INFINITY;
  return copysign(r, x);
}
#define BF16_MAX 0x1.fep127 /* (2 - 2^-7) 2^127 */
static double ref_bf16(float x) { return ref_round(x, 8, -126, BF16_MAX); }
static double ref_fp16(float x) { return ref_round(x, 11, -14, 65504.0); }

static float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}
static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

/* got == want bitwise for numbers (so -0 vs +0 counts), or both NaN */
static int same(float got, double want) {
  if (isnan(want)) return isnan(got);
  return bits_of(got) == bits_of((float)want);
}

/* half bits -> value, decoded with ldexp (independent of the rounding code) */
static double half_value(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

Test(kmath, round_bf16_every_value_midpoint_and_neighbour) {
  /* all 2^16 bf16 values stay; the midpoint between hi and hi+1 goes to the even one; one float
   * ulp either side of it goes to the nearer; all against the double reference too */
  long bad = 0;
  uint32_t first = 0;
  for (uint32_t hi = 0; hi < 65536; hi++) {
    uint32_t u = hi << 16;
    int finite = ((u >> 23) & 0xff) != 0xff;
    float x = from_bits(u), mid = from_bits(u | 0x8000), below = from_bits(u | 0x7fff), above = from_bits(u | 0x8001);
    if (!same(dt_round_bf16(x), ref_bf16(x)) || (finite && bits_of(dt_round_bf16(x)) != u)) bad++;
    if (!finite) continue;
    uint32_t even = (hi & 1) ? (hi + 1) << 16 : u; /* hi + 1 may carry into the exponent or reach inf */
    if (bits_of(dt_round_bf16(mid)) != even || !same(dt_round_bf16(mid), ref_bf16(mid))) bad++;
    if (bits_of(dt_round_bf16(below)) != u || !same(dt_round_bf16(below), ref_bf16(below))) bad++;
    if (bits_of(dt_round_bf16(above)) != (hi + 1) << 16 || !same(dt_round_bf16(above), ref_bf16(above))) bad++;
    if (bad && !first) first = u | 1;
  }
  cr_expect_eq(bad, 0, "%ld bf16 mismatches, the first near 0x%08x", bad, first & ~1u);
}

Test(kmath, round_fp16_every_value_midpoint_and_neighbour) {
  long bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    double v = half_value((uint16_t)h);
    float x = (float)v;
    if (!same(dt_round_fp16(x), v)) bad++, cr_log_error("half 0x%04x: %a -> %a", h, v, dt_round_fp16(x));
    if (isnan(v) || isinf(v) || (h & 0x7fff) == 0x7bff) continue; /* the top midpoint below */
    double w = half_value((uint16_t)(h + 1)); /* next half away from zero */
    float mid = (float)((v + w) / 2);         /* 12 significant bits: exact in float */
    cr_assert_eq((double)mid, (v + w) / 2);
    double even = (h & 1) ? w : v;
    if (!same(dt_round_fp16(mid), even) || !same(dt_round_fp16(mid), ref_fp16(mid)))
      bad++, cr_log_error("half 0x%04x midpoint %a -> %a, want %a", h, (double)mid, dt_round_fp16(mid), even);
    float in = nextafterf(mid, 0.0f), out = nextafterf(mid, signbit(v) ? -INFINITY : INFINITY);
    if (!same(dt_round_fp16(in), v) || !same(dt_round_fp16(out), w)) bad++, cr_log_error("half 0x%04x neighbours", h);
  }
  cr_expect_eq(bad, 0, "%ld fp16 mismatches", bad);
}

Test(kmath, round_fp16_overflow_subnormals_specials) {
  struct { float x; double want; } c[] = {
      {65504.0f, 65504.0},       {65519.99f, 65504.0},     {65520.0f, INFINITY},     {-65520.0f, -INFINITY},
      {1e10f, INFINITY},         {FLT_MAX, INFINITY},      {INFINITY, INFINITY},     {-INFINITY, -INFINITY},
      {0x1p-24f, 0x1p-24},       {0x1p-25f, 0.0},          {-0x1p-25f, -0.0},        {0x1.000002p-25f, 0x1p-24},
      {0x3p-25f, 0x1p-23},       {0x5p-25f, 0x1p-23},      {0x1p-14f, 0x1p-14},      {0x1.ff8p-15f, 0x1.ff8p-15},
      {0x1.ffcp-15f, 0x1p-14} /* 1023.5 quanta: tie, to 1024 */, {0x1.ff4p-15f, 0x1.ffp-15} /* 1022.5: to 1022 */,   {0x1p-149f, 0.0},         {-0.0f, -0.0},            {1.0f + 0x1p-11f, 1.0},
      {1.0f + 0x3p-11f, 1.0f + 0x1p-9f},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    cr_expect(same(dt_round_fp16(c[i].x), c[i].want), "fp16(%a) = %a, want %a", (double)c[i].x,
              (double)dt_round_fp16(c[i].x), c[i].want);
    cr_expect(same(dt_round_fp16(c[i].x), ref_fp16(c[i].x)), "reference disagrees at %a", (double)c[i].x);
  }
  /* NaNs stay NaN, including signalling NaNs whose payload is only in the low bits */
  uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f801fffu, 0x7fffffffu};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    cr_expect(isnan(dt_round_fp16(from_bits(nans[i]))), "fp16 of NaN 0x%08x", nans[i]);
    cr_expect(isnan(dt_round_bf16(from_bits(nans[i]))), "bf16 of NaN 0x%08x", nans[i]);
  }
  /* bf16: FLT_MAX is above the last midpoint (0x7f7f8000) and overflows; the midpoint itself
   * ties to the even neighbour, which is inf; just below it stays finite */
  cr_expect(same(dt_round_bf16(FLT_MAX), INFINITY));
  cr_expect(same(dt_round_bf16(from_bits(0x7f7f8000u)), INFINITY));
  cr_expect(same(dt_round_bf16(from_bits(0x7f7f7fffu)), BF16_MAX));
  cr_expect(same(dt_round_bf16(-0.0f), -0.0));
  cr_expect(same(dt_round_bf16(0x1p-149f), 0.0), "the smallest float subnormal is below half a bf16 quantum");
  cr_expect(same(dt_round_bf16(0x1p-133f), 0x1p-133), "the smallest bf16 subnormal");
}

Test(kmath, round_bf16_fp16_sweep_of_float_bit_patterns) {
  /* every 251st float bit pattern (17.1M values of every sign, exponent and mantissa) plus
   * 2^22 pseudo-random ones, against the double reference; and against the compiler's own
   * _Float16 conversion where it has one */
  long bad16 = 0, badb = 0, badf = 0, n = 0;
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; i < (1ull << 32) + (1ull << 22) * 251; i += 251, n++) {
    uint32_t u;
    if (i < (1ull << 32)) {
      u = (uint32_t)i;
    } else {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      u = (uint32_t)(s >> 32);
    }
    float x = from_bits(u);
    if (!same(dt_round_bf16(x), ref_bf16(x))) badb++;
    if (!same(dt_round_fp16(x), ref_fp16(x))) bad16++;
#ifdef __FLT16_MAX__
    if (!same(dt_round_fp16(x), (double)(float)(_Float16)x)) badf++;
#endif
  }
  cr_expect_eq(badb, 0, "%ld of %ld bf16 mismatches", badb, n);
  cr_expect_eq(bad16, 0, "%ld of %ld fp16 mismatches", bad16, n);
  cr_expect_eq(badf, 0, "%ld of %ld fp16 values differ from the compiler's _Float16", badf, n);
}

Test(kmath, bf16_fp16_bits_of_every_16_bit_value_and_back) {
  /* the 16-bit patterns cuda/convert16.cu stores for cuDNN: every one decodes to its value (fp16:
   * against the ldexp decoder above, and the compiler's _Float16 where it has one) and encodes
   * back to itself; NaNs to a NaN */
  long bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    const uint16_t b = (uint16_t)h;
    const double v = half_value(b);
    if (!same(dt_fp16_value(b), v)) bad++, cr_log_error("fp16 0x%04x decodes to %a, want %a", h, (double)dt_fp16_value(b), v);
    const uint16_t back = dt_fp16_bits((float)v);
    if (isnan(v) ? (back & 0x7c00u) != 0x7c00u || !(back & 0x3ffu) : back != b)
      bad++, cr_log_error("fp16 0x%04x encodes back to 0x%04x", h, back);
#ifdef __FLT16_MAX__
    _Float16 f;
    memcpy(&f, &b, sizeof f);
    if (!same(dt_fp16_value(b), (double)(float)f)) bad++, cr_log_error("fp16 0x%04x differs from _Float16", h);
#endif
    if (bits_of(dt_bf16_value(b)) != h << 16) bad++, cr_log_error("bf16 0x%04x decodes wrong", h);
    if (dt_bf16_bits(dt_bf16_value(b)) != b) bad++, cr_log_error("bf16 0x%04x encodes back wrong", h);
  }
  cr_expect_eq(bad, 0, "%ld 16-bit encode/decode mismatches", bad);
}
