/* Kernel parity cases of the row kernels and the optimizer (see gpu_parity.cu): the causal
 * attention softmax and its backward against float64, softmax + cross-entropy against the CPU
 * twin (also past 2^31 logits), AdamW against kmath.h's dt_adamw_update, the gradient sum of
 * squares against a float64 sum, the fp32 <-> 16-bit copies against kmath.h's rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "ops_cpu.h"
}
#include "gpu_parity.h"
#include "convert16.h"
#include "kernels.h"
#include "kmath.h"
#include "cuda_launch.h"
#include "precision.h"

/* rows = B*NH*T rows of T scores, row r at query position t = r % T */
void gp_attention_softmax(int B, int NH, int T, int prec, dt_rng_t *r) {
  char shape[64];
  size_t rows = (size_t)B * NH * T, n = rows * T;
  snprintf(shape, sizeof shape, "rows=%zu T=%d", rows, T);
  float *att = gp_rand(r, n, 4.0f, prec), *d = gp_rand(r, n, 1.0f, prec);
  float *ref = (float *)gp_host(n * sizeof(float)), *dref = (float *)gp_host(n * sizeof(float));
  for (size_t i = 0; i < rows; i++) {
    int t = (int)(i % T);
    const float *a = att + i * T;
    double mx = -INFINITY, s = 0, dot = 0;
    for (int j = 0; j <= t; j++) mx = fmax(mx, a[j]);
    for (int j = 0; j <= t; j++) s += exp((double)a[j] - mx);
    for (int j = 0; j < T; j++) ref[i * T + j] = j <= t ? (float)(exp((double)a[j] - mx) / s) : 0.0f;
    for (int j = 0; j <= t; j++) dot += (double)ref[i * T + j] * d[i * T + j];
    for (int j = 0; j < T; j++)
      dref[i * T + j] = j <= t ? (float)((double)ref[i * T + j] * ((double)d[i * T + j] - dot)) : 0.0f;
  }
  float *d_att = gp_up(att, n), *d_d = gp_up(d, n), *d_ref = gp_up(ref, n);
  GP_TRY(dt_cu_softmax_causal(d_att, (int)rows, T, 0));
  float *g = gp_down(d_att, n);
  gp_compare("softmax_causal", shape, prec, g, ref, n, 2e-6);
  free(g);
  GP_TRY(dt_cu_softmax_causal_backward(d_d, d_ref, (int)rows, T, 0));
  g = gp_down(d_d, n);
  gp_compare("softmax_causal_backward", shape, prec, g, dref, n, 1e-5);
  free(g);
  free(att);
  free(d);
  free(ref);
  free(dref);
  cudaFree(d_att);
  cudaFree(d_d);
  cudaFree(d_ref);
}

void gp_crossentropy(int N, int V, int Vp, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d V=%d Vp=%d", N, V, Vp);
  size_t n = (size_t)N * Vp;
  float *z = gp_rand(r, n, 6.0f, prec), *losses = (float *)gp_host(N * sizeof(float));
  float *lse = (float *)gp_host(N * sizeof(float)), *dz = (float *)gp_host(n * sizeof(float));
  int *tg = (int *)gp_host(N * sizeof(int));
  for (int i = 0; i < N; i++) tg[i] = (int)(dt_rng_uniform(r) * V);
  float *d_z = gp_up(z, n), *d_losses = (float *)gp_dev(N * sizeof(float)), *d_lse = (float *)gp_dev(N * sizeof(float));
  float *d_dz = (float *)gp_dev(n * sizeof(float));
  int *d_tg = (int *)gp_dev(N * sizeof(int));
  GP_CK(cudaMemcpy(d_tg, tg, N * sizeof(int), cudaMemcpyHostToDevice));
  GP_CK(cudaMemset(d_dz, 0xff, n * sizeof(float))); /* NaN: padded columns must be written too */
  const double acc0 = 0.25; /* the mean is ADDED to the accumulator */
  double *d_acc = (double *)gp_dev(sizeof(double)), acc;
  GP_CK(cudaMemcpy(d_acc, &acc0, sizeof acc0, cudaMemcpyHostToDevice));
  GP_TRY(dt_cu_crossentropy_forward(d_losses, d_lse, d_z, d_tg, N, V, Vp, d_acc, DT_PREC_FP32, 0));
  const float mean = (float)dt_crossentropy_forward(losses, lse, z, tg, N, V, Vp);
  GP_CK(cudaMemcpy(&acc, d_acc, sizeof acc, cudaMemcpyDeviceToHost));
  const float gmean = (float)(acc - acc0);
  gp_compare("crossentropy_forward mean", shape, prec, &gmean, &mean, 1, 1e-6);
  cudaFree(d_acc);
  float *g = gp_down(d_losses, N);
  gp_compare("crossentropy_forward loss", shape, prec, g, losses, N, 2e-6);
  free(g);
  g = gp_down(d_lse, N);
  gp_compare("crossentropy_forward lse", shape, prec, g, lse, N, 2e-6);
  free(g);
  float dloss = 1.0f / (float)N;
  GP_TRY(dt_cu_crossentropy_backward(d_dz, d_z, d_lse, d_tg, dloss, N, V, Vp, 0, prec, 0)); /* rounds as it stores */
  dt_crossentropy_backward(dz, z, lse, tg, dloss, N, V, Vp);
  dt_prec_round(dz, n, (dt_precision_t)prec);
  g = gp_down(d_dz, n);
  gp_compare("crossentropy_backward", shape, prec, g, dz, n, gp_tol(prec, 2e-6));
  free(g);
  free(z);
  free(losses);
  free(lse);
  free(dz);
  free(tg);
  cudaFree(d_z);
  cudaFree(d_losses);
  cudaFree(d_lse);
  cudaFree(d_dz);
  cudaFree(d_tg);
}

/* Logits of more than 2^31 elements (GPT-2's padded vocabulary, 42,692 rows): the 32-bit index
 * overflow a kernel would hit. The device tensor is filled by repeating one random chunk; the CPU
 * twin runs on the first, a middle and the last two rows, downloaded from the device. */
void gp_crossentropy_huge(dt_rng_t *r) {
  const int V = 50257, Vp = 50304, N = (int)(((size_t)1 << 31) / Vp + 2);
  size_t n = (size_t)N * Vp, chunk = (size_t)Vp * 211;
  size_t freeb = 0, total = 0;
  GP_CK(cudaMemGetInfo(&freeb, &total));
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d Vp=%d (%.2fG)", N, Vp, n / 1e9);
  if (freeb < 2 * n * sizeof(float) + ((size_t)1 << 30)) {
    printf("%-28s %-26s %-5s %10s %9s  SKIP (%.1f GiB free, %.1f needed)\n", "crossentropy > 2^31", shape, "fp32", "-",
           "-", freeb / 1073741824.0, 2.0 * n * sizeof(float) / 1073741824.0 + 1);
    return;
  }
  float *h = gp_rand(r, chunk, 6.0f, DT_PREC_FP32);
  float *d_z = (float *)gp_dev(n * sizeof(float)), *d_dz = (float *)gp_dev(n * sizeof(float));
  for (size_t off = 0; off < n; off += chunk)
    GP_CK(cudaMemcpy(d_z + off, h, (off + chunk <= n ? chunk : n - off) * sizeof(float), cudaMemcpyHostToDevice));
  int *tg = (int *)gp_host(N * sizeof(int)), *d_tg = (int *)gp_dev(N * sizeof(int));
  for (int i = 0; i < N; i++) tg[i] = (int)(dt_rng_uniform(r) * V);
  GP_CK(cudaMemcpy(d_tg, tg, N * sizeof(int), cudaMemcpyHostToDevice));
  float *d_losses = (float *)gp_dev(N * sizeof(float)), *d_lse = (float *)gp_dev(N * sizeof(float));
  float dloss = 1.0f / (float)N;
  GP_TRY(dt_cu_crossentropy_forward(d_losses, d_lse, d_z, d_tg, N, V, Vp, NULL, DT_PREC_FP32, 0));
  GP_TRY(dt_cu_crossentropy_backward(d_dz, d_z, d_lse, d_tg, dloss, N, V, Vp, 0, DT_PREC_FP32, 0));
  float *gl = gp_down(d_losses, N), *glse = gp_down(d_lse, N);
  const int rows[] = {0, N / 2, N - 2, N - 1};
  int ok = 1;
  double worst = 0;
  for (int row : rows) {
    float *z = gp_down(d_z + (size_t)row * Vp, Vp), *dz = gp_down(d_dz + (size_t)row * Vp, Vp);
    float loss, lse, ref[Vp];
    dt_crossentropy_forward(&loss, &lse, z, &tg[row], 1, V, Vp);
    dt_crossentropy_backward(ref, z, &lse, &tg[row], dloss, 1, V, Vp);
    worst = fmax(worst, fabs(gl[row] - loss) / fabs(loss));
    worst = fmax(worst, fabs(glse[row] - lse) / fabs(lse));
    double md = 0, mr = 0;
    for (int v = 0; v < Vp; v++) {
      md = fmax(md, fabs((double)dz[v] - ref[v]));
      mr = fmax(mr, fabs((double)ref[v]));
      ok &= isfinite(dz[v]);
    }
    worst = fmax(worst, md / mr);
    free(z);
    free(dz);
  }
  ok &= worst <= 2e-6;
  g_cases++;
  g_fail += !ok;
  printf("%-28s %-26s %-5s %10.3e %9.1e  %s\n", "crossentropy > 2^31 (4 rows)", shape, "fp32", worst, 2e-6,
         ok ? "PASS" : "FAIL");
  free(h);
  free(gl);
  free(glse);
  free(tg);
  cudaFree(d_z);
  cudaFree(d_dz);
  cudaFree(d_tg);
  cudaFree(d_losses);
  cudaFree(d_lse);
}

/* AdamW (kmath.h dt_adamw_update on both sides) and the gradient sum of squares. */
void gp_optimizer(size_t n, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  float *p = gp_rand(r, n, 1.0f, DT_PREC_FP32), *g = gp_rand(r, n, 0.1f, DT_PREC_FP32);
  float *m = gp_rand(r, n, 0.01f, DT_PREC_FP32), *v = gp_rand(r, n, 1e-3f, DT_PREC_FP32);
  for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
  float *d_p = gp_up(p, n), *d_g = gp_up(g, n), *d_m = gp_up(m, n), *d_v = gp_up(v, n);
  const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gscale = 0.5f;
  const int t = 7;
  const float bc1 = (float)(1.0 - pow(b1, t)), bc2 = (float)(1.0 - pow(b2, t));
  GP_TRY(dt_cu_adamw(d_p, d_g, d_m, d_v, n, lr, b1, b2, eps, wd, bc1, bc2, gscale, 0));
  for (size_t i = 0; i < n; i++) p[i] = dt_adamw_update(p[i], g[i] * gscale, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
  float *hp = gp_down(d_p, n), *hm = gp_down(d_m, n), *hv = gp_down(d_v, n);
  gp_compare("adamw param", shape, DT_PREC_FP32, hp, p, n, 1e-6);
  gp_compare("adamw m", shape, DT_PREC_FP32, hm, m, n, 1e-6);
  gp_compare("adamw v", shape, DT_PREC_FP32, hv, v, n, 1e-6);
  free(hp);
  free(hm);
  free(hv);

  /* every tensor in one launch: the range [lo, n) of the arena in segments (decay, a skipped gap,
   * no decay, decay), m and v holding the range only; the skipped gap and what lies before lo
   * must stay as they are */
  {
    const size_t lo = n / 7, e1 = lo + n / 5, e2 = e1 + 3, e3 = e2 + n / 3, ends[] = {e1, e2, e3, n};
    const unsigned char kinds[] = {DT_CU_SEG_DECAY, DT_CU_SEG_SKIP, DT_CU_SEG_NODECAY, DT_CU_SEG_DECAY};
    float *p0 = gp_down(d_p, n), *m0 = gp_down(d_m, n), *v0 = gp_down(d_v, n);
    size_t *d_ends = (size_t *)gp_dev(sizeof ends);
    unsigned char *d_kinds = (unsigned char *)gp_dev(sizeof kinds);
    GP_CK(cudaMemcpy(d_ends, ends, sizeof ends, cudaMemcpyHostToDevice));
    GP_CK(cudaMemcpy(d_kinds, kinds, sizeof kinds, cudaMemcpyHostToDevice));
    GP_TRY(dt_cu_adamw_multi(d_p, d_g, d_m, d_v, lo, n - lo, d_ends, d_kinds, 4, lr, b1, b2, eps, wd, bc1, bc2, gscale,
                             0));
    for (size_t a = lo, k = 0; a < n; a++) {
      while (a >= ends[k]) k++;
      if (kinds[k] == DT_CU_SEG_SKIP) continue;
      size_t i = a - lo;
      p0[a] = dt_adamw_update(p0[a], g[a] * gscale, &m0[i], &v0[i], lr, b1, b2, eps,
                              kinds[k] == DT_CU_SEG_DECAY ? wd : 0.0f, bc1, bc2);
    }
    float *hp2 = gp_down(d_p, n), *hm2 = gp_down(d_m, n), *hv2 = gp_down(d_v, n);
    gp_compare("adamw_multi param", shape, DT_PREC_FP32, hp2, p0, n, 1e-6);
    gp_compare("adamw_multi m", shape, DT_PREC_FP32, hm2, m0, n, 1e-6);
    gp_compare("adamw_multi v", shape, DT_PREC_FP32, hv2, v0, n, 1e-6);
    float *hs2[] = {p0, m0, v0, hp2, hm2, hv2};
    for (float *x : hs2) free(x);
    cudaFree(d_ends);
    cudaFree(d_kinds);
  }

  double *d_part = (double *)gp_dev(DT_CUDA_SUMSQ_BLOCKS * sizeof(double)), part[DT_CUDA_SUMSQ_BLOCKS];
  GP_TRY(dt_cu_sumsq_partial(d_part, d_g, n, 0));
  GP_CK(cudaDeviceSynchronize());
  GP_CK(cudaMemcpy(part, d_part, sizeof part, cudaMemcpyDeviceToHost));
  double gs = 0, ref = 0;
  for (int i = 0; i < DT_CUDA_SUMSQ_BLOCKS; i++) gs += part[i];
  for (size_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
  float fgs = (float)gs, fref = (float)ref;
  gp_compare("sumsq_partial (float64)", shape, DT_PREC_FP32, &fgs, &fref, 1, 3e-7);
  cudaFree(d_part);
  float *hs[] = {p, g, m, v};
  for (float *x : hs) free(x);
  float *ds[] = {d_p, d_g, d_m, d_v};
  for (float *x : ds) cudaFree(x);
}

/* The 16-bit copies (convert16.cu) against kmath.h on the host: to16 then from16 is the
 * storage rounding (bitwise, both formats), and the stored bits decode on the host to the same
 * values; inputs span normal, subnormal, overflowing, infinite and NaN values. */
void gp_convert16(size_t n, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  float *x = gp_rand(r, n, 1.0f, DT_PREC_FP32);
  const float special[] = {0.0f, -0.0f, 65504.0f, 65520.0f, -1e6f, 0x1p-24f, 0x1p-25f, 0x1.8p-20f, 3e38f,
                           INFINITY, -INFINITY, NAN, 0x1p-130f, 1.0f + 0x1p-8f, 1.0f + 0x1p-11f};
  for (size_t i = 0; i < n; i++) x[i] = i < sizeof special / sizeof *special ? special[i] : ldexpf(x[i], (int)(i % 61) - 30);
  float *dx = gp_up(x, n), *dback = (float *)gp_dev(n * sizeof(float));
  uint16_t *d16 = (uint16_t *)gp_dev(n * sizeof(uint16_t)), *h16 = (uint16_t *)gp_host(n * sizeof(uint16_t));
  float *want = (float *)gp_host(n * sizeof(float)), *dec = (float *)gp_host(n * sizeof(float));
  for (int fp16 = 0; fp16 < 2; fp16++) {
    const int prec = fp16 ? DT_PREC_FP16 : DT_PREC_BF16;
    GP_TRY(dt_cu_to16(d16, dx, n, fp16, 0));
    GP_TRY(dt_cu_from16(dback, d16, n, fp16, 0));
    GP_CK(cudaDeviceSynchronize());
    GP_CK(cudaMemcpy(h16, d16, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
      want[i] = fp16 ? dt_round_fp16(x[i]) : dt_round_bf16(x[i]);
      dec[i] = fp16 ? dt_fp16_value(h16[i]) : dt_bf16_value(h16[i]);
    }
    float *back = gp_down(dback, n);
    gp_compare("to16 + from16 (rounding)", shape, prec, back, want, n, 0.0);
    gp_compare("to16 bits decoded on host", shape, prec, dec, want, n, 0.0);
    free(back);
  }
  free(x);
  free(want);
  free(dec);
  free(h16);
  cudaFree(dx);
  cudaFree(dback);
  cudaFree(d16);
}

/* Decoding with a key/value cache against the CPU twin: a cache already holding positions
 * [0, pos) (random), n new positions of qkv; the caches after the append (exact: copies) and the
 * attention output (rounded to prec as the kernel stores it). */
void gp_attention_decode(int B, int NH, int hs, int pos, int n, int Tmax, int prec, dt_rng_t *r) {
  char shape[64];
  const int C = NH * hs;
  snprintf(shape, sizeof shape, "B=%d NH=%d hs=%d pos=%d n=%d", B, NH, hs, pos, n);
  const size_t nq = (size_t)B * n * 3 * C, nc = (size_t)B * Tmax * C, no = (size_t)B * n * C;
  float *qkv = gp_rand(r, nq, 2.0f, prec), *kc = gp_rand(r, nc, 2.0f, prec);
  float *vc = gp_rand(r, nc, 1.0f, prec), *out = (float *)gp_host(no * sizeof(float));
  float *scr = (float *)gp_host((size_t)Tmax * sizeof(float));
  float *d_qkv = gp_up(qkv, nq), *d_kc = gp_up(kc, nc), *d_vc = gp_up(vc, nc), *d_out = (float *)gp_dev(no * sizeof(float));
  GP_TRY(dt_cu_attention_decode(d_out, d_kc, d_vc, d_qkv, B, pos, n, Tmax, C, NH, prec, 0));
  dt_attention_decode(out, kc, vc, scr, qkv, B, pos, n, Tmax, C, NH, 1);
  dt_prec_round(out, no, (dt_precision_t)prec);
  float *g = gp_down(d_kc, nc);
  gp_compare("attention_decode k cache", shape, prec, g, kc, nc, 0.0);
  free(g);
  g = gp_down(d_vc, nc);
  gp_compare("attention_decode v cache", shape, prec, g, vc, nc, 0.0);
  free(g);
  g = gp_down(d_out, no);
  gp_compare("attention_decode", shape, prec, g, out, no, gp_tol(prec, 2e-6));
  free(g);
  for (float *p : {qkv, kc, vc, out, scr}) free(p);
  for (float *p : {d_qkv, d_kc, d_vc, d_out}) cudaFree(p);
}

/* The fused training attention (system.attention = flash) against the CPU twin (also flash-style:
 * the same lse): out, lse, and dqkv from random dout; out and dqkv rounded to prec as stored. */
void gp_attention_flash(int B, int NH, int hs, int T, int prec, dt_rng_t *r) {
  char shape[64];
  const int C = NH * hs;
  snprintf(shape, sizeof shape, "B=%d NH=%d hs=%d T=%d", B, NH, hs, T);
  const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
  float *qkv = gp_rand(r, nq, 2.0f, prec), *dout = gp_rand(r, no, 1.0f, prec);
  float *out = (float *)gp_host(no * sizeof(float)), *lse = (float *)gp_host(nl * sizeof(float));
  float *dqkv = (float *)gp_host(nq * sizeof(float));
  float *scr = (float *)gp_host(dt_attention_scratch_floats(T, 1) * sizeof(float));
  float *d_qkv = gp_up(qkv, nq), *d_dout = gp_up(dout, no), *d_out = (float *)gp_dev(no * sizeof(float));
  float *d_lse = (float *)gp_dev(nl * sizeof(float)), *d_dsum = (float *)gp_dev(nl * sizeof(float));
  float *d_dqkv = (float *)gp_dev(nq * sizeof(float));
  GP_TRY(dt_cu_flash_forward(d_out, d_lse, d_qkv, B, T, C, NH, prec, 0));
  GP_TRY(dt_cu_flash_backward(d_dqkv, d_dsum, d_dout, d_qkv, d_lse, B, T, C, NH, prec, 0));
  dt_attention_forward(out, lse, scr, qkv, B, T, C, NH, 1);
  dt_attention_backward(dqkv, scr, dout, qkv, lse, B, T, C, NH, 1);
  dt_prec_round(out, no, (dt_precision_t)prec);
  dt_prec_round(dqkv, nq, (dt_precision_t)prec);
  float *g = gp_down(d_out, no);
  gp_compare("attention flash forward", shape, prec, g, out, no, gp_tol(prec, 2e-6));
  free(g);
  g = gp_down(d_lse, nl);
  gp_compare("attention flash lse", shape, prec, g, lse, nl, 2e-6);
  free(g);
  g = gp_down(d_dqkv, nq);
  gp_compare("attention flash backward", shape, prec, g, dqkv, nq, gp_tol(prec, 1e-5));
  free(g);
  for (float *p : {qkv, dout, out, lse, dqkv, scr}) free(p);
  for (float *p : {d_qkv, d_dout, d_out, d_lse, d_dsum, d_dqkv}) cudaFree(p);
}
