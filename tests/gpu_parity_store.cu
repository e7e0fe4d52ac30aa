/* Kernel parity of 16-bit activation storage (cuda/store.h, issue #22 step 7c): each launcher that
 * takes DT_STORE16 runs twice on the same values, once on float buffers that store rounded to bf16
 * or fp16 (the path the rest of gpu_parity checks against the CPU twins) and once on 16-bit
 * buffers of the same values, and every output must agree bit for bit: 16-bit storage changes
 * the bytes, never a value. One row per output ("bits": the tolerance is equality). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "model.h"
#include "ops_cpu.h"
}
#include "gpu_parity.h"
#include "kernels.h"
#include "kmath.h"
#include "precision.h"

/* A tensor on the device twice: float values (f) and the same values in 16 bits (h). */
typedef struct {
  float *f;
  void *h;
  size_t n;
} pair_t;

/* x (n host floats, already rounded to prec) on the device both ways */
static pair_t up_pair(const float *x, size_t n, int prec) {
  pair_t p = {gp_up(x, n), gp_dev(n * 2), n};
  uint16_t *b = (uint16_t *)gp_host(n * 2);
  for (size_t i = 0; i < n; i++) b[i] = dt_to16(x[i], prec == DT_PREC_FP16);
  GP_CK(cudaMemcpy(p.h, b, n * 2, cudaMemcpyHostToDevice));
  free(b);
  return p;
}

/* outputs, both sides filled with NaN bits: an element a kernel does not write shows */
static pair_t out_pair(size_t n) {
  pair_t p = {(float *)gp_dev(n * sizeof(float)), gp_dev(n * 2), n};
  GP_CK(cudaMemset(p.f, 0xff, n * sizeof(float)));
  GP_CK(cudaMemset(p.h, 0xff, n * 2));
  return p;
}

static void free_pair(pair_t p) {
  cudaFree(p.f);
  cudaFree(p.h);
}

/* One row: the float values a and b (n) bit for bit (NaN equals NaN). */
static void same_values(const char *op, const char *shape, int prec, const float *a, const float *b, size_t n) {
  size_t bad = 0;
  double maxd = 0, maxc = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t ua, ub;
    memcpy(&ua, &a[i], 4);
    memcpy(&ub, &b[i], 4);
    if (ua != ub && !(isnan(a[i]) && isnan(b[i]))) bad++;
    if (isfinite(a[i]) && isfinite(b[i])) maxd = fmax(maxd, fabs((double)a[i] - (double)b[i]));
    if (isfinite(b[i])) maxc = fmax(maxc, fabs((double)b[i]));
  }
  g_cases++;
  g_fail += bad != 0;
  char where[96];
  snprintf(where, sizeof where, "%s, 16-bit", shape);
  printf("%-28s %-26s %-5s %10.3e %9s  %s", op, where, dt_precision_name((dt_precision_t)prec),
         maxc > 0 ? maxd / maxc : maxd, "bits", bad ? "FAIL" : "PASS");
  if (bad) printf(" (%zu of %zu values differ)", bad, n);
  printf("\n");
  fflush(stdout);
}

/* the 16-bit side of p against its float side */
static void same(const char *op, const char *shape, int prec, pair_t p) {
  float *f = gp_down(p.f, p.n), *v = (float *)gp_host(p.n * sizeof(float));
  uint16_t *b = (uint16_t *)gp_host(p.n * 2);
  GP_CK(cudaMemcpy(b, p.h, p.n * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < p.n; i++) v[i] = dt_from16(b[i], prec == DT_PREC_FP16);
  same_values(op, shape, prec, v, f, p.n);
  free(f);
  free(v);
  free(b);
}

/* two float device tensors (statistics, parameter gradients) */
static void same_f(const char *op, const char *shape, int prec, const float *d16, const float *d32, size_t n) {
  float *a = gp_down(d16, n), *b = gp_down(d32, n);
  same_values(op, shape, prec, a, b, n);
  free(a);
  free(b);
}

static void elementwise(size_t n, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  const int p16 = prec | DT_STORE16;
  float *x = gp_rand(r, n, 4.0f, prec), *y = gp_rand(r, n, 1.0f, prec), *m = gp_rand(r, n, 3.0f, DT_PREC_FP32);
  pair_t X = up_pair(x, n, prec), Y = up_pair(y, n, prec), O = out_pair(n);
  GP_TRY(dt_cu_gelu_forward(O.f, X.f, n, prec, 0));
  GP_TRY(dt_cu_gelu_forward(O.h, X.h, n, p16, 0));
  same("gelu_forward", shape, prec, O);
  GP_TRY(dt_cu_gelu_backward(O.f, X.f, Y.f, n, prec, 0));
  GP_TRY(dt_cu_gelu_backward(O.h, X.h, Y.h, n, p16, 0));
  same("gelu_backward", shape, prec, O);
  GP_TRY(dt_cu_residual_forward(O.f, X.f, Y.f, n, prec, 0));
  GP_TRY(dt_cu_residual_forward(O.h, X.h, Y.h, n, p16, 0));
  same("residual_forward", shape, prec, O);
  float *dm = gp_up(m, n); /* an fp32 master: the weights' working copy */
  GP_TRY(dt_cu_round_copy(O.f, dm, n, prec, 0));
  GP_TRY(dt_cu_round_copy(O.h, dm, n, p16, 0));
  same("round_copy (working copy)", shape, prec, O);
  cudaFree(dm);
  free_pair(X);
  free_pair(Y);
  free_pair(O);
  free(x);
  free(y);
  free(m);
}

static void bias_cols(int N, int OC, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d OC=%d", N, OC);
  size_t n = (size_t)N * OC;
  float *x = gp_rand(r, n, 1.0f, prec), *b = gp_rand(r, OC, 1.0f, prec), *acc = gp_rand(r, OC, 1.0f, DT_PREC_FP32);
  pair_t X = up_pair(x, n, prec), Bi = up_pair(b, OC, prec);
  GP_TRY(dt_cu_add_bias(X.f, Bi.f, N, OC, prec, 0));
  GP_TRY(dt_cu_add_bias(X.h, Bi.h, N, OC, prec | DT_STORE16, 0));
  same("add_bias", shape, prec, X);
  float *a32 = gp_up(acc, OC), *a16 = gp_up(acc, OC);
  float *scr = (float *)gp_dev(dt_cu_col_scratch_floats(OC) * sizeof(float));
  GP_TRY(dt_cu_col_sum(a32, X.f, N, OC, scr, prec, 0));
  GP_TRY(dt_cu_col_sum(a16, X.h, N, OC, scr, prec | DT_STORE16, 0));
  same_f("col_sum (+=)", shape, prec, a16, a32, OC);
  free_pair(X);
  free_pair(Bi);
  cudaFree(a32);
  cudaFree(a16);
  cudaFree(scr);
  free(x);
  free(b);
  free(acc);
}

/* A product's epilogue from its fp32 accumulator (the 16-bit path's products write fp32, then this
 * stores once): the float path runs it in place on the accumulator, the 16-bit one from a separate
 * fp32 buffer; both against round(resid + (acc + bias)) computed here. With and without the bias
 * and the residual. */
static void epilogue32(int N, int OC, int prec, dt_rng_t *r) {
  size_t n = (size_t)N * OC;
  float *acc = gp_rand(r, n, 2.0f, DT_PREC_FP32), *b = gp_rand(r, OC, 1.0f, prec), *res = gp_rand(r, n, 1.0f, prec);
  float *ref = (float *)gp_host(n * sizeof(float));
  pair_t Bi = up_pair(b, OC, prec), R = up_pair(res, n, prec), O = out_pair(n);
  float *dacc = gp_up(acc, n);
  for (int v = 0; v < 4; v++) {
    const int has_b = v & 1, has_r = v >> 1;
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d OC=%d%s%s", N, OC, has_b ? " +bias" : "", has_r ? " +resid" : "");
    GP_CK(cudaMemcpy(O.f, acc, n * sizeof(float), cudaMemcpyHostToDevice));
    GP_TRY(dt_cu_epilogue(O.f, O.f, NULL, has_b ? Bi.f : NULL, has_r ? R.f : NULL, N, OC, prec, 0));
    GP_TRY(dt_cu_epilogue(O.h, NULL, dacc, has_b ? Bi.h : NULL, has_r ? R.h : NULL, N, OC, prec | DT_STORE16, 0));
    same("epilogue from fp32", shape, prec, O);
    for (size_t i = 0; i < n; i++) {
      float x = acc[i] + (has_b ? b[i % OC] : 0.0f);
      ref[i] = dt_prec_round1(has_r ? res[i] + x : x, prec);
    }
    float *f = gp_down(O.f, n);
    same_values("epilogue float side vs host", shape, prec, f, ref, n);
    free(f);
  }
  free_pair(Bi);
  free_pair(R);
  free_pair(O);
  cudaFree(dacc);
  free(acc);
  free(b);
  free(res);
  free(ref);
}

/* the statistics from the 32 and 16-bit runs (m32, r32, m16, r16), the parameter gradients the
 * same way: each kernel's float outputs compared too */
static void layernorm(int N, int C, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
  size_t n = (size_t)N * C;
  const int p16 = prec | DT_STORE16;
  float *x = gp_rand(r, n, 2.0f, prec), *w = gp_rand(r, C, 1.0f, prec), *b = gp_rand(r, C, 1.0f, prec);
  float *dout = gp_rand(r, n, 1.0f, prec), *dres = gp_rand(r, n, 1.0f, prec);
  float *g0 = gp_rand(r, 2 * (size_t)C, 1.0f, DT_PREC_FP32);
  pair_t X = up_pair(x, n, prec), W = up_pair(w, C, prec), Bi = up_pair(b, C, prec), D = up_pair(dout, n, prec);
  pair_t R = up_pair(dres, n, prec), O = out_pair(n);
  float *st = (float *)gp_dev(4 * (size_t)N * sizeof(float)), *m32 = st, *r32 = st + N, *m16 = st + 2 * N,
        *r16 = st + 3 * N;
  float *g32 = gp_up(g0, 2 * (size_t)C), *g16 = gp_up(g0, 2 * (size_t)C);
  float *scr = (float *)gp_dev(dt_cu_col_scratch_floats(2 * (size_t)C) * sizeof(float));
  GP_TRY(dt_cu_layernorm_forward(O.f, m32, r32, X.f, W.f, Bi.f, N, C, prec, 0));
  GP_TRY(dt_cu_layernorm_forward(O.h, m16, r16, X.h, W.h, Bi.h, N, C, p16, 0));
  same("layernorm_forward out", shape, prec, O);
  same_f("layernorm_forward mean", shape, prec, m16, m32, N);
  same_f("layernorm_forward rstd", shape, prec, r16, r32, N);
  /* in place on the residual gradient (dinp == dresid), as the backend calls it */
  GP_TRY(dt_cu_layernorm_backward(R.f, g32, g32 + C, R.f, D.f, X.f, W.f, m32, r32, N, C, scr, prec, 0));
  GP_TRY(dt_cu_layernorm_backward(R.h, g16, g16 + C, R.h, D.h, X.h, W.h, m32, r32, N, C, scr, p16, 0));
  same("layernorm_backward dinp+=", shape, prec, R);
  same_f("layernorm_backward dw, db", shape, prec, g16, g32, 2 * (size_t)C);
  GP_TRY(dt_cu_layernorm_backward(O.f, g32, g32 + C, NULL, D.f, X.f, W.f, m32, r32, N, C, scr, prec, 0));
  GP_TRY(dt_cu_layernorm_backward(O.h, g16, g16 + C, NULL, D.h, X.h, W.h, m32, r32, N, C, scr, p16, 0));
  same("layernorm_backward dinp", shape, prec, O);
  pair_t ps[] = {X, W, Bi, D, R, O};
  for (pair_t p : ps) free_pair(p);
  float *ds[] = {st, g32, g16, scr};
  for (float *p : ds) cudaFree(p);
  float *hs[] = {x, w, b, dout, dres, g0};
  for (float *p : hs) free(p);
}

static void encoder(int B, int T, int C, int V, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
  size_t N = (size_t)B * T, n = N * C, nte = (size_t)V * C, npe = (size_t)T * C;
  int *inp = (int *)gp_host(N * sizeof(int)), *order = (int *)gp_host(N * sizeof(int));
  int *count = (int *)gp_host(((size_t)V + 1) * sizeof(int));
  dt_embed_bucket_t *bk = (dt_embed_bucket_t *)gp_host(N * sizeof(dt_embed_bucket_t));
  for (size_t i = 0; i < N; i++)
    inp[i] = dt_rng_uniform(r) < 0.3 ? (int)(dt_rng_uniform(r) * 4) : (int)(dt_rng_uniform(r) * V);
  int nb = dt_embed_buckets(inp, (int)N, V, count, order, bk);
  int *d_inp = (int *)gp_dev(N * sizeof(int)), *d_order = (int *)gp_dev(N * sizeof(int));
  dt_embed_bucket_t *d_bk = (dt_embed_bucket_t *)gp_dev(N * sizeof(dt_embed_bucket_t));
  GP_CK(cudaMemcpy(d_inp, inp, N * sizeof(int), cudaMemcpyHostToDevice));
  GP_CK(cudaMemcpy(d_order, order, N * sizeof(int), cudaMemcpyHostToDevice));
  GP_CK(cudaMemcpy(d_bk, bk, (size_t)nb * sizeof(dt_embed_bucket_t), cudaMemcpyHostToDevice));
  float *wte = gp_rand(r, nte, 1.0f, prec), *wpe = gp_rand(r, npe, 1.0f, prec), *dout = gp_rand(r, n, 1.0f, prec);
  float *g0 = gp_rand(r, nte + npe, 1.0f, DT_PREC_FP32);
  pair_t E = up_pair(wte, nte, prec), P = up_pair(wpe, npe, prec), D = up_pair(dout, n, prec), O = out_pair(n);
  float *g32 = gp_up(g0, nte + npe), *g16 = gp_up(g0, nte + npe);
  GP_TRY(dt_cu_encoder_forward(O.f, d_inp, E.f, P.f, B, T, C, prec, 0));
  GP_TRY(dt_cu_encoder_forward(O.h, d_inp, E.h, P.h, B, T, C, prec | DT_STORE16, 0));
  same("encoder_forward", shape, prec, O);
  GP_TRY(dt_cu_encoder_backward(g32, g32 + nte, D.f, d_order, d_bk, nb, B, T, C, prec, 0));
  GP_TRY(dt_cu_encoder_backward(g16, g16 + nte, D.h, d_order, d_bk, nb, B, T, C, prec | DT_STORE16, 0));
  same_f("encoder_backward dwte, dwpe", shape, prec, g16, g32, nte + npe);
  pair_t ps[] = {E, P, D, O};
  for (pair_t p : ps) free_pair(p);
  cudaFree(g32);
  cudaFree(g16);
  cudaFree(d_inp);
  cudaFree(d_order);
  cudaFree(d_bk);
  float *hs[] = {wte, wpe, dout, g0};
  for (float *p : hs) free(p);
  free(inp);
  free(order);
  free(count);
  free(bk);
}

/* forward's losses, lse and mean; backward in place over the logits, as the backend runs it */
static void crossentropy(int N, int V, int Vp, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d V=%d Vp=%d", N, V, Vp);
  size_t n = (size_t)N * Vp;
  float *z = gp_rand(r, n, 6.0f, prec);
  int *tg = (int *)gp_host(N * sizeof(int)), *d_tg = (int *)gp_dev(N * sizeof(int));
  for (int i = 0; i < N; i++) tg[i] = (int)(dt_rng_uniform(r) * V);
  GP_CK(cudaMemcpy(d_tg, tg, N * sizeof(int), cudaMemcpyHostToDevice));
  pair_t Z = up_pair(z, n, prec);
  float *st = (float *)gp_dev(4 * (size_t)N * sizeof(float)), *l32 = st, *e32 = st + N, *l16 = st + 2 * N,
        *e16 = st + 3 * N;
  double *acc = (double *)gp_dev(2 * sizeof(double));
  GP_CK(cudaMemset(acc, 0, 2 * sizeof(double)));
  GP_TRY(dt_cu_crossentropy_forward(l32, e32, Z.f, d_tg, N, V, Vp, acc, prec, 0));
  GP_TRY(dt_cu_crossentropy_forward(l16, e16, Z.h, d_tg, N, V, Vp, acc + 1, prec | DT_STORE16, 0));
  same_f("crossentropy_forward loss", shape, prec, l16, l32, N);
  same_f("crossentropy_forward lse", shape, prec, e16, e32, N);
  double a[2];
  GP_CK(cudaMemcpy(a, acc, sizeof a, cudaMemcpyDeviceToHost));
  float m[2] = {(float)a[1], (float)a[0]};
  same_values("crossentropy_forward mean", shape, prec, &m[0], &m[1], 1);
  float dloss = 1.0f / (float)N;
  GP_TRY(dt_cu_crossentropy_backward(Z.f, Z.f, e32, d_tg, dloss, N, V, Vp, 0, prec, 0));
  GP_TRY(dt_cu_crossentropy_backward(Z.h, Z.h, e32, d_tg, dloss, N, V, Vp, 0, prec | DT_STORE16, 0));
  same("crossentropy_backward", shape, prec, Z);
  free_pair(Z);
  cudaFree(st);
  cudaFree(acc);
  cudaFree(d_tg);
  free(z);
  free(tg);
}

/* tensor parallelism's kernels: the vocabulary shard's embedding rows, the bias + residual
 * epilogue, the vocab-parallel cross-entropy's pieces */
static void tensor_parallel(int N, int C, int V, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d V=%d", N, C, V);
  const int p16 = prec | DT_STORE16, v0 = V / 3, nrows = V / 2, Vp = nrows + 3;
  size_t n = (size_t)N * C, nz = (size_t)N * Vp;
  int *inp = (int *)gp_host(N * sizeof(int)), *d_inp = (int *)gp_dev(N * sizeof(int));
  for (int i = 0; i < N; i++) inp[i] = (int)(dt_rng_uniform(r) * V); /* inside the shard or not */
  GP_CK(cudaMemcpy(d_inp, inp, N * sizeof(int), cudaMemcpyHostToDevice));
  float *wte = gp_rand(r, (size_t)nrows * C, 1.0f, prec), *b = gp_rand(r, C, 1.0f, prec);
  float *res = gp_rand(r, n, 1.0f, prec), *z = gp_rand(r, nz, 6.0f, prec);
  pair_t E = up_pair(wte, (size_t)nrows * C, prec), Bi = up_pair(b, C, prec), R = up_pair(res, n, prec);
  pair_t Z = up_pair(z, nz, prec), O = out_pair(n);
  GP_TRY(dt_cu_embed_rows(O.f, d_inp, E.f, N, C, v0, nrows, prec, 0));
  GP_TRY(dt_cu_embed_rows(O.h, d_inp, E.h, N, C, v0, nrows, p16, 0));
  same("embed_rows", shape, prec, O);
  GP_TRY(dt_cu_bias_residual(O.f, Bi.f, R.f, N, C, prec, 0));
  GP_TRY(dt_cu_bias_residual(O.h, Bi.h, R.h, N, C, p16, 0));
  same("bias_residual", shape, prec, O);
  float *st = (float *)gp_dev(4 * (size_t)N * sizeof(float));
  double *sum = (double *)gp_dev(2 * (size_t)N * sizeof(double));
  GP_TRY(dt_cu_xent_max(st, Z.f, N, nrows, Vp, prec, 0));
  GP_TRY(dt_cu_xent_max(st + N, Z.h, N, nrows, Vp, p16, 0));
  same_f("xent_max", shape, prec, st + N, st, N);
  GP_TRY(dt_cu_xent_sumexp(sum, st + 2 * N, Z.f, st, d_inp, N, nrows, Vp, v0, prec, 0));
  GP_TRY(dt_cu_xent_sumexp(sum + N, st + 3 * N, Z.h, st, d_inp, N, nrows, Vp, v0, p16, 0));
  same_f("xent_sumexp target logit", shape, prec, st + 3 * N, st + 2 * N, N);
  double *hs = (double *)gp_host(2 * (size_t)N * sizeof(double));
  GP_CK(cudaMemcpy(hs, sum, 2 * (size_t)N * sizeof(double), cudaMemcpyDeviceToHost));
  float f[2] = {0.0f, (float)memcmp(hs, hs + N, (size_t)N * sizeof(double))}; /* the double sums: all bits */
  same_values("xent_sumexp sum (double)", shape, prec, &f[1], &f[0], 1);
  pair_t ps[] = {E, Bi, R, Z, O};
  for (pair_t p : ps) free_pair(p);
  cudaFree(st);
  cudaFree(sum);
  cudaFree(d_inp);
  float *h[] = {wte, b, res, z};
  for (float *p : h) free(p);
  free(hs);
  free(inp);
}

/* the fused attention: forward's out and lse, backward's dqkv and D (dsum) */
static void flash(int B, int NH, int hs, int T, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "B=%d NH=%d hs=%d T=%d", B, NH, hs, T);
  const int C = NH * hs, p16 = prec | DT_STORE16;
  size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C, rows = (size_t)B * NH * T;
  float *qkv = gp_rand(r, n3, 1.0f, prec), *dout = gp_rand(r, n, 1.0f, prec);
  pair_t Q = up_pair(qkv, n3, prec), D = up_pair(dout, n, prec), O = out_pair(n), DQ = out_pair(n3);
  float *st = (float *)gp_dev(4 * rows * sizeof(float));
  GP_TRY(dt_cu_flash_forward(O.f, st, Q.f, B, T, C, NH, prec, 0));
  GP_TRY(dt_cu_flash_forward(O.h, st + rows, Q.h, B, T, C, NH, p16, 0));
  same("flash_forward out", shape, prec, O);
  same_f("flash_forward lse", shape, prec, st + rows, st, rows);
  GP_TRY(dt_cu_flash_backward(DQ.f, st + 2 * rows, D.f, Q.f, st, B, T, C, NH, prec, 0));
  GP_TRY(dt_cu_flash_backward(DQ.h, st + 3 * rows, D.h, Q.h, st, B, T, C, NH, p16, 0));
  same("flash_backward dqkv", shape, prec, DQ);
  same_f("flash_backward D", shape, prec, st + 3 * rows, st + 2 * rows, rows);
  pair_t ps[] = {Q, D, O, DQ};
  for (pair_t p : ps) free_pair(p);
  cudaFree(st);
  free(qkv);
  free(dout);
}

/* decoding: n new positions appended to a 16-bit key/value cache at pos, then attended */
static void decode(int B, int NH, int hs, int pos, int n, int Tmax, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "B=%d NH=%d hs=%d pos=%d n=%d", B, NH, hs, pos, n);
  const int C = NH * hs;
  size_t nc = (size_t)B * Tmax * C, n3 = (size_t)B * n * 3 * C, no = (size_t)B * n * C;
  float *kc = gp_rand(r, nc, 1.0f, prec), *vc = gp_rand(r, nc, 1.0f, prec), *qkv = gp_rand(r, n3, 1.0f, prec);
  pair_t K = up_pair(kc, nc, prec), V = up_pair(vc, nc, prec), Q = up_pair(qkv, n3, prec), O = out_pair(no);
  GP_TRY(dt_cu_attention_decode(O.f, K.f, V.f, Q.f, B, pos, n, Tmax, C, NH, prec, 0));
  GP_TRY(dt_cu_attention_decode(O.h, K.h, V.h, Q.h, B, pos, n, Tmax, C, NH, prec | DT_STORE16, 0));
  same("attention_decode out", shape, prec, O);
  same("attention_decode k cache", shape, prec, K);
  same("attention_decode v cache", shape, prec, V);
  pair_t ps[] = {K, V, Q, O};
  for (pair_t p : ps) free_pair(p);
  free(kc);
  free(vc);
  free(qkv);
}

void gp_store16_all(dt_rng_t *r, int small) {
  const int precs[] = {DT_PREC_BF16, DT_PREC_FP16};
  for (int prec : precs) {
    elementwise(1, prec, r);
    elementwise(small ? 4099 : 1000003, prec, r);
    bias_cols(7, 33, prec, r);
    bias_cols(257, 768, prec, r);
    epilogue32(37, 100, prec, r);
    layernorm(1, 1, prec, r);
    layernorm(37, 100, prec, r);
    layernorm(64, 768, prec, r);
    encoder(3, 17, 40, 97, prec, r);
    crossentropy(37, 97, 128, prec, r);
    crossentropy(4, 50257, 50304, prec, r);
    tensor_parallel(37, 48, 101, prec, r);
    flash(2, 3, 16, 13, prec, r);   /* odd T */
    flash(1, 2, 64, 150, prec, r);  /* several key tiles, the last one partial */
    flash(2, 5, 40, 33, prec, r);   /* a head size that is no multiple of the warp */
    decode(2, 3, 16, 5, 4, 12, prec, r);
    decode(1, 2, 256, 30, 1, 64, prec, r); /* the largest head size */
    if (!small) { /* past the launch grid's cap */
      layernorm(524281, 32, prec, r);
      encoder(1, 200000, 4, 140000, prec, r);
    }
  }
  /* fp32 with DT_STORE16 names no 16-bit format: refused */
  float *d = (float *)gp_dev(16);
  dt_status_t st = dt_cu_gelu_forward(d, d, 1, DT_PREC_FP32 | DT_STORE16, 0);
  g_cases++;
  g_fail += st == DT_OK;
  printf("%-28s %-26s %-5s %10s %9s  %s\n", "fp32 as 16-bit refused", "n=1", "fp32", "-", "error",
         st != DT_OK ? "PASS" : "FAIL");
  cudaFree(d);
}
