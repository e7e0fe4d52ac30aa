/* Tensor parallelism's kernels (cuda/kernels_tp.cu and the v0 of the cross-entropy backward)
 * against references written here in double precision: the vocab-parallel embedding rows, the
 * row-parallel bias + residual epilogue, the vocab-parallel cross-entropy's three pieces on one
 * vocabulary shard (global columns v0 .. v0 + Vp, nv of them real, targets inside and outside the
 * shard) and its in-place backward. The end-to-end check (tp = 2 training on the emulated GPU
 * against the CPU backend) is tests/emu_tp.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu_parity.h"
#include "kernels.h"
#include "precision.h"

static int *rand_tokens(dt_rng_t *r, int n, int hi) {
  int *t = (int *)gp_host((size_t)n * sizeof(int));
  for (int i = 0; i < n; i++) t[i] = (int)(dt_rng_uniform(r) * hi) % hi;
  return t;
}

static int *up_ints(const int *h, int n) {
  int *d = (int *)gp_dev((size_t)n * sizeof(int));
  GP_CK(cudaMemcpy(d, h, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
  return d;
}

static void embed_and_epilogue(int prec, dt_rng_t *r) {
  const int N = 37, C = 40, V = 128, v0 = 50, nrows = 47, OC = 100;
  int *inp = rand_tokens(r, N, V), *d_inp = up_ints(inp, N);
  float *wte = gp_rand(r, (size_t)nrows * C, 1.0f, prec), *ref = (float *)gp_host((size_t)N * C * sizeof(float));
  float *d_wte = gp_up(wte, (size_t)nrows * C), *d_out = (float *)gp_dev((size_t)N * C * sizeof(float));
  GP_TRY(dt_cu_embed_rows(d_out, d_inp, d_wte, N, C, v0, nrows, DT_PREC_FP32, 0));
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) {
      int k = inp[i] - v0;
      ref[(size_t)i * C + c] = k >= 0 && k < nrows ? wte[(size_t)k * C + c] : 0.0f;
    }
  float *g = gp_down(d_out, (size_t)N * C);
  gp_compare("tp embed_rows", "N=37 C=40 v0=50 rows=47", prec, g, ref, (size_t)N * C, 0);
  free(g);
  size_t n = (size_t)N * OC;
  float *out = gp_rand(r, n, 1.0f, prec), *bias = gp_rand(r, OC, 1.0f, prec), *res = gp_rand(r, n, 1.0f, prec);
  float *d_o = gp_up(out, n), *d_b = gp_up(bias, OC), *d_r = gp_up(res, n);
  GP_TRY(dt_cu_bias_residual(d_o, d_b, d_r, N, OC, prec, 0)); /* stored rounded: exactly the rounded sum */
  for (size_t i = 0; i < n; i++) out[i] = dt_prec_round1(res[i] + (out[i] + bias[i % OC]), prec);
  g = gp_down(d_o, n);
  gp_compare("tp bias_residual", "N=37 OC=100", prec, g, out, n, 0);
  free(g);
  float *hs[] = {wte, ref, out, bias, res};
  for (float *p : hs) free(p);
  float *ds[] = {d_wte, d_out, d_o, d_b, d_r};
  for (float *p : ds) cudaFree(p);
  free(inp);
  cudaFree(d_inp);
}

/* one shard of a vocabulary of 125: columns [64, 128) of which nv = 61 are real */
static void xent_shard(int prec, dt_rng_t *r) {
  const int N = 37, Vp = 64, v0 = 64, nv = 61;
  const float dloss = 0.37f;
  size_t n = (size_t)N * Vp;
  float *z = gp_rand(r, n, 3.0f, prec);
  int *tg = rand_tokens(r, N, v0 + nv), *d_tg = up_ints(tg, N);
  float *d_z = gp_up(z, n), *d_mx = (float *)gp_dev(N * sizeof(float)), *d_tl = (float *)gp_dev(N * sizeof(float));
  double *d_sum = (double *)gp_dev(N * sizeof(double));
  float *mx = (float *)gp_host(N * sizeof(float)), *sum = (float *)gp_host(N * sizeof(float));
  float *tl = (float *)gp_host(N * sizeof(float)), *lse = (float *)gp_host(N * sizeof(float));
  float *loss = (float *)gp_host(N * sizeof(float)), *dz = (float *)gp_host(n * sizeof(float));
  GP_TRY(dt_cu_xent_max(d_mx, d_z, N, nv, Vp, DT_PREC_FP32, 0));
  GP_TRY(dt_cu_xent_sumexp(d_sum, d_tl, d_z, d_mx, d_tg, N, nv, Vp, v0, DT_PREC_FP32, 0));
  double *hs = (double *)gp_host(N * sizeof(double));
  GP_CK(cudaMemcpy(hs, d_sum, N * sizeof(double), cudaMemcpyDeviceToHost));
  float *gsum = (float *)gp_host(N * sizeof(float));
  for (int i = 0; i < N; i++) gsum[i] = (float)hs[i];
  float *gmx = gp_down(d_mx, N), *gtl = gp_down(d_tl, N);
  double *d_acc = (double *)gp_dev(sizeof(double)), acc = 0;
  GP_CK(cudaMemcpy(d_acc, &acc, sizeof acc, cudaMemcpyHostToDevice));
  GP_TRY(dt_cu_xent_finish(d_mx, d_tl, d_sum, N, d_acc, 0)); /* one shard: the all-reduces are identities */
  GP_CK(cudaMemcpy(&acc, d_acc, sizeof acc, cudaMemcpyDeviceToHost));
  cudaFree(d_acc);
  GP_TRY(dt_cu_crossentropy_backward(d_z, d_z, d_mx, d_tg, dloss, N, nv, Vp, v0, prec, 0));
  for (int i = 0; i < N; i++) {
    const float *zi = z + (size_t)i * Vp;
    double m = -INFINITY, s = 0;
    for (int v = 0; v < nv; v++) m = fmax(m, zi[v]);
    for (int v = 0; v < nv; v++) s += exp((double)zi[v] - m);
    int t = tg[i] - v0;
    mx[i] = (float)m;
    sum[i] = (float)s;
    tl[i] = t >= 0 && t < nv ? zi[t] : 0.0f;
    lse[i] = (float)(m + log(s));
    loss[i] = lse[i] - tl[i];
    for (int v = 0; v < Vp; v++) { /* the kernel stores it rounded */
      const float dv = (float)((exp((double)zi[v] - lse[i]) - (v == t)) * dloss);
      dz[(size_t)i * Vp + v] = v < nv ? dt_prec_round1(dv, prec) : 0.0f;
    }
  }
  const char *sh = "N=37 Vp=64 v0=64 nv=61";
  gp_compare("tp xent_max", sh, prec, gmx, mx, N, 0);
  gp_compare("tp xent_sumexp sum", sh, prec, gsum, sum, N, 1e-6);
  gp_compare("tp xent_sumexp target", sh, prec, gtl, tl, N, 0);
  float *glse = gp_down(d_mx, N), *gloss = gp_down(d_tl, N), *gdz = gp_down(d_z, n);
  gp_compare("tp xent_finish lse", sh, prec, glse, lse, N, 1e-6);
  gp_compare("tp xent_finish loss", sh, prec, gloss, loss, N, 1e-6);
  double total = 0;
  for (int i = 0; i < N; i++) total += loss[i];
  const float mean = (float)(total / N), gmean = (float)acc;
  gp_compare("tp xent_finish mean", sh, prec, &gmean, &mean, 1, 1e-6);
  gp_compare("tp crossentropy_backward", sh, prec, gdz, dz, n, gp_tol(prec, 2e-6));
  float *hf[] = {z, mx, sum, tl, lse, loss, dz, gsum, gmx, gtl, glse, gloss, gdz};
  for (float *p : hf) free(p);
  free(hs);
  free(tg);
  cudaFree(d_tg);
  cudaFree(d_z);
  cudaFree(d_mx);
  cudaFree(d_tl);
  cudaFree(d_sum);
}

void gp_tensor_parallel(int prec, dt_rng_t *r) {
  embed_and_epilogue(prec, r);
  xent_shard(prec, r);
}
