/* GPT-2's layers on the CPU backend: the vectorizable math (kmath.h) against libm in double, each
 * layer's backward against central finite differences of an independent double-precision forward
 * (ref_gpt2.h, which gives the tolerance reasoning), the sgemm engines' splits and the fused
 * residual matmul. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpt2.h"
#include "kmath.h"
#include "model.h"
#include "ops_cpu.h"
#include "ref_gpt2.h"

/* ---- vectorizable math (kmath.h) against libm in double --------------------------------------- */

Test(kmath, expf_tanhf) {
  double worst_e = 0, worst_t = 0;
  for (int i = -800000; i <= 800000; i++) {
    float x = (float)(i * 1.1e-4); /* [-88, 88] */
    double e = exp((double)x), t = tanh((double)x);
    if (x >= -87.3f && x <= 88.3f) worst_e = fmax(worst_e, fabs(dt_expf(x) - e) / e);
    worst_t = fmax(worst_t, fabs(dt_tanhf(x) - t) / fmax(fabs(t), 1e-30));
  }
  cr_expect(worst_e < 3e-7, "dt_expf relative error %.3e", worst_e);
  cr_expect(worst_t < 3e-7, "dt_tanhf relative error %.3e", worst_t);
  cr_expect_eq(dt_expf(-INFINITY), 0.0f);
  cr_expect_eq(dt_expf(-100.0f), 0.0f);
  cr_expect(isnan(dt_expf(NAN)) && isnan(dt_tanhf(NAN)));
  cr_expect(dt_tanhf(1e-30f) == 1e-30f && dt_tanhf(-40.0f) == -1.0f && dt_tanhf(0.0f) == 0.0f);
}

/* ---- per-layer gradient checks ------------------------------------------------------------------ */

/* Each context holds double copies of the layer inputs, the random output weighting R (the
 * objective is sum(out * R), so the analytic backward gets dout = R) and scratch for out. */
typedef struct {
  int B, T, C, NH, N, OC, V, Vp, conv1d;
  double *x, *w, *b, *out, *R;
  const int *tok;
} lctx_t;

static double obj_encoder(void *p) {
  lctx_t *c = p; /* x = wte (V,C), w = wpe (T,C) */
  for (int bt = 0; bt < c->B * c->T; bt++)
    for (int k = 0; k < c->C; k++)
      c->out[bt * c->C + k] = c->x[c->tok[bt] * c->C + k] + c->w[(bt % c->T) * c->C + k];
  return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

Test(grad, encoder) {
  enum { B = 2, T = 3, C = 8, V = 5 };
  int tok[B * T] = {1, 3, 1, 4, 1, 0}; /* repeated tokens exercise the accumulation */
  float wte[V * C], wpe[T * C], out[B * T * C], R[B * T * C], dwte[V * C] = {0}, dwpe[T * C] = {0};
  fill_normal(wte, V * C, 1, 1), fill_normal(wpe, T * C, 1, 2), fill_normal(R, B * T * C, 1, 3);
  dt_encoder_forward(out, tok, wte, wpe, B, T, C);
  dt_encoder_backward(dwte, dwpe, R, tok, B, T, C);
  lctx_t c = {.B = B,
              .T = T,
              .C = C,
              .x = to_double(wte, V * C),
              .w = to_double(wpe, T * C),
              .out = malloc(sizeof(double) * B * T * C),
              .R = to_double(R, B * T * C),
              .tok = tok};
  obj_encoder(&c);
  expect_close("encoder forward", out, c.out, B * T * C, 1e-6);
  fd_check("encoder dwte", c.x, V * C, dwte, obj_encoder, &c);
  fd_check("encoder dwpe", c.w, T * C, dwpe, obj_encoder, &c);
  free(c.x), free(c.w), free(c.out), free(c.R);
}

static double obj_layernorm(void *p) {
  lctx_t *c = p;
  ref_layernorm(c->out, c->x, c->w, c->b, c->N, c->C);
  return dot(c->out, c->R, (size_t)c->N * c->C);
}

Test(grad, layernorm) {
  enum { N = 6, C = 16 };
  float x[N * C], w[C], b[C], out[N * C], mean[N], rstd[N], R[N * C], dres[N * C], dx[N * C], dw[C], db[C];
  fill_normal(x, N * C, 2, 4), fill_normal(w, C, 1, 5), fill_normal(b, C, 1, 6), fill_normal(R, N * C, 1, 7);
  for (int i = 0; i < N * C; i++)
    x[i] += 0.5f; /* nonzero mean */
  fill_normal(dres, N * C, 1, 8);
  /* parameter grads accumulate onto existing contents: start from a known offset */
  for (int k = 0; k < C; k++)
    dw[k] = 1.0f, db[k] = -2.0f;
  dt_layernorm_forward(out, mean, rstd, x, w, b, N, C);
  memcpy(dx, dres, sizeof dx); /* dinp aliases dresid: dx = dres + dLN */
  dt_layernorm_backward(dx, dw, db, dx, R, x, w, mean, rstd, N, C);
  for (int i = 0; i < N * C; i++)
    dx[i] -= dres[i];
  for (int k = 0; k < C; k++)
    dw[k] -= 1.0f, db[k] += 2.0f;
  lctx_t c = {.N = N,
              .C = C,
              .x = to_double(x, N * C),
              .w = to_double(w, C),
              .b = to_double(b, C),
              .out = malloc(sizeof(double) * N * C),
              .R = to_double(R, N * C)};
  obj_layernorm(&c);
  expect_close("layernorm forward", out, c.out, N * C, 1e-6);
  fd_check("layernorm dinp", c.x, N * C, dx, obj_layernorm, &c);
  fd_check("layernorm dweight", c.w, C, dw, obj_layernorm, &c);
  fd_check("layernorm dbias", c.b, C, db, obj_layernorm, &c);
  /* dresid == NULL writes (=) rather than accumulates */
  for (int i = 0; i < N * C; i++)
    dx[i] = 1e6f;
  float dw2[C] = {0}, db2[C] = {0};
  dt_layernorm_backward(dx, dw2, db2, NULL, R, x, w, mean, rstd, N, C);
  fd_check("layernorm dinp (no dresid)", c.x, N * C, dx, obj_layernorm, &c);
  free(c.x), free(c.w), free(c.b), free(c.out), free(c.R);
}

static double obj_matmul(void *p) {
  lctx_t *c = p;
  ref_linear(c->out, c->x, c->w, c->b, c->N, c->C, c->OC, c->conv1d);
  return dot(c->out, c->R, (size_t)c->N * c->OC);
}

/* dt_cpu_sgemm against a double reference in all transpose combinations, with leading dimensions
 * larger than the matrix, alpha/beta, shapes big enough to be split across threads along M
 * (M >= N) and along N (M < N) with ragged split points, and once from inside a parallel region. */
static void check_sgemm(int tA, int tB, int M, int N, int K, int in_parallel) {
  int lda = (tA ? M : K) + 3, ldb = (tB ? K : N) + 5, ldc = N + 7;
  size_t na = (size_t)(tA ? K : M) * lda, nb = (size_t)(tB ? N : K) * ldb, nc = (size_t)M * ldc;
  float *A = malloc(na * sizeof(float)), *Bm = malloc(nb * sizeof(float)), *Cm = malloc(nc * sizeof(float));
  double *ref = malloc(nc * sizeof(double));
  fill_normal(A, na, 1, 101), fill_normal(Bm, nb, 1, 102), fill_normal(Cm, nc, 1, 103);
  const float alpha = 0.75f, beta = -0.5f;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++) {
      double acc = 0; /* columns N..ldc-1 are padding: no product (B has no such column) */
      for (int k = 0; k < K && j < N; k++)
        acc += (double)(tA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
               (tB ? Bm[(size_t)j * ldb + k] : Bm[(size_t)k * ldb + j]);
      ref[(size_t)i * ldc + j] = j < N ? alpha * acc + beta * (double)Cm[(size_t)i * ldc + j] : Cm[(size_t)i * ldc + j];
    }
  if (in_parallel) {
#pragma omp parallel num_threads(2)
#pragma omp single
    dt_cpu_sgemm(tA, tB, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
  } else {
    dt_cpu_sgemm(tA, tB, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
  }
  char what[96];
  snprintf(what, sizeof what, "sgemm tA=%d tB=%d M=%d N=%d K=%d parallel=%d (incl. untouched ldc padding)", tA, tB, M,
           N, K, in_parallel);
  expect_close(what, Cm, ref, nc, 1e-5);
  free(A), free(Bm), free(Cm), free(ref);
}

Test(ops, sgemm_split) {
  int nt = omp_get_max_threads();
  omp_set_num_threads(2);
  for (int tA = 0; tA < 2; tA++)
    for (int tB = 0; tB < 2; tB++) {
      check_sgemm(tA, tB, 203, 150, 90, 0); /* split along M */
      check_sgemm(tA, tB, 70, 301, 110, 0); /* split along N */
      check_sgemm(tA, tB, 70, 301, 110, 1);
    }
  omp_set_num_threads(nt);
}

Test(ops, residual_and_fused_matmul) {
  enum { N = 5, C = 7, OC = 9 };
  float x[N * C], w[OC * C], b[OC], r[N * OC], out[N * OC], ref[N * OC], s[N * OC];
  fill_normal(x, N * C, 1, 41), fill_normal(w, OC * C, 1, 42), fill_normal(b, OC, 1, 43), fill_normal(r, N * OC, 1, 44);
  dt_conv1d_forward(ref, x, w, b, N, C, OC);
  dt_residual_forward(s, ref, r, N * OC);
  for (int i = 0; i < N * OC; i++)
    cr_assert_float_eq(s[i], ref[i] + r[i], 0.0f);
  dt_conv1d_residual_forward(out, x, w, b, r, N, C, OC);
  for (int i = 0; i < N * OC; i++)
    cr_assert_float_eq(out[i], s[i], 1e-5f * (1 + fabsf(s[i])), "element %d", i);
  memcpy(out, r, sizeof out); /* in place: out aliases resid */
  dt_conv1d_residual_forward(out, x, w, b, out, N, C, OC);
  for (int i = 0; i < N * OC; i++)
    cr_assert_float_eq(out[i], s[i], 1e-5f * (1 + fabsf(s[i])), "in place, element %d", i);
}

/* Both weight layouts: nn.Linear's (OC, C) (dt_matmul_*, the lm_head) and Conv1D's (C, OC)
 * (dt_conv1d_*, the blocks): forward against float64, gradients against finite differences. */
static void check_matmul_grad(int conv1d) {
  enum { N = 6, C = 8, OC = 20 };
  const char *nm = conv1d ? "conv1d" : "matmul";
  void (*fwd)(float *, const float *, const float *, const float *, int, int, int) =
      conv1d ? dt_conv1d_forward : dt_matmul_forward;
  void (*bwd)(float *, float *, float *, const float *, const float *, const float *, int, int, int) =
      conv1d ? dt_conv1d_backward : dt_matmul_backward;
  float x[N * C], w[OC * C], b[OC], out[N * OC], R[N * OC], dx[N * C], dw[OC * C] = {0}, db[OC] = {0};
  fill_normal(x, N * C, 1, 9), fill_normal(w, OC * C, 0.5, 10), fill_normal(b, OC, 1, 11);
  fill_normal(R, N * OC, 1, 12);
  for (int i = 0; i < N * C; i++)
    dx[i] = 1e6f; /* written, not accumulated */
  fwd(out, x, w, b, N, C, OC);
  bwd(dx, dw, db, R, x, w, N, C, OC);
  lctx_t c = {.N = N,
              .C = C,
              .OC = OC,
              .conv1d = conv1d,
              .x = to_double(x, N * C),
              .w = to_double(w, OC * C),
              .b = to_double(b, OC),
              .out = malloc(sizeof(double) * N * OC),
              .R = to_double(R, N * OC)};
  obj_matmul(&c);
  char what[64];
  snprintf(what, sizeof what, "%s forward", nm);
  expect_close(what, out, c.out, N * OC, 1e-6);
  snprintf(what, sizeof what, "%s dinp", nm);
  fd_check(what, c.x, N * C, dx, obj_matmul, &c);
  snprintf(what, sizeof what, "%s dweight", nm);
  fd_check(what, c.w, OC * C, dw, obj_matmul, &c);
  snprintf(what, sizeof what, "%s dbias", nm);
  fd_check(what, c.b, OC, db, obj_matmul, &c);
  /* a second backward accumulates into dweight/dbias */
  float dw1[OC * C], db1[OC];
  memcpy(dw1, dw, sizeof dw), memcpy(db1, db, sizeof db);
  bwd(dx, dw, db, R, x, w, N, C, OC);
  for (int i = 0; i < OC * C; i++)
    cr_assert_float_eq(dw[i], 2 * dw1[i], 1e-5 * fabsf(dw1[i]) + 1e-7);
  for (int i = 0; i < OC; i++)
    cr_assert_float_eq(db[i], 2 * db1[i], 1e-5 * fabsf(db1[i]) + 1e-7);
  free(c.x), free(c.w), free(c.b), free(c.out), free(c.R);
}

Test(grad, matmul) { check_matmul_grad(0); }
Test(grad, conv1d) { check_matmul_grad(1); }

static double obj_attention(void *p) {
  lctx_t *c = p;
  ref_attention(c->out, c->x, c->B, c->T, c->C, c->NH);
  return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

/* Reference logsumexp of the causal scores, (B,NH,T). */
static void ref_attention_lse(double *lse, const double *qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        double s = 0;
        for (int j = 0; j <= t; j++) {
          double w = 0;
          for (int e = 0; e < hs; e++)
            w += qkv[(size_t)(b * T + t) * 3 * C + h * hs + e] * qkv[(size_t)(b * T + j) * 3 * C + C + h * hs + e];
          s += exp(w / sqrt((double)hs));
        }
        lse[((size_t)b * NH + h) * T + t] = log(s);
      }
}

/* Forward (output and logsumexp) and FD check of backward; T > DT_ATT_QB exercises several query
 * blocks, a partial last block and keys spanning blocks. */
static void check_attention(int B, int T, int C, int NH, int nthr, uint64_t seed) {
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
  float *qkv = malloc(nq * sizeof(float)), *out = malloc(no * sizeof(float)), *R = malloc(no * sizeof(float));
  float *dqkv = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
  float *scr = malloc(dt_attention_scratch_floats(T, nthr) * sizeof(float));
  fill_normal(qkv, nq, 1, seed), fill_normal(R, no, 1, seed + 1);
  for (size_t i = 0; i < nq; i++)
    dqkv[i] = 1e6f; /* every element must be written */
  dt_attention_forward(out, lse, scr, qkv, B, T, C, NH, nthr);
  dt_attention_backward(dqkv, scr, R, qkv, lse, B, T, C, NH, nthr);
  lctx_t c = {.B = B,
              .T = T,
              .C = C,
              .NH = NH,
              .x = to_double(qkv, nq),
              .out = malloc(sizeof(double) * no),
              .R = to_double(R, no)};
  double *lref = malloc(nl * sizeof(double));
  ref_attention_lse(lref, c.x, B, T, C, NH);
  expect_close("attention logsumexp", lse, lref, nl, 1e-6);
  obj_attention(&c);
  expect_close("attention forward", out, c.out, no, 1e-6);
  fd_check("attention dqkv", c.x, nq, dqkv, obj_attention, &c);
  free(c.x), free(c.out), free(c.R), free(lref), free(qkv), free(out), free(R), free(dqkv), free(lse), free(scr);
}

Test(grad, attention) { check_attention(2, 5, 12, 3, 2, 13); }

Test(grad, attention_blocks) { check_attention(1, DT_ATT_QB + 9, 8, 2, 2, 31); }

static double obj_gelu(void *p) {
  lctx_t *c = p;
  for (int i = 0; i < c->N; i++)
    c->out[i] = ref_gelu(c->x[i]);
  return dot(c->out, c->R, c->N);
}

Test(grad, gelu) {
  enum { N = 64 };
  float x[N], out[N], R[N], dx[N];
  fill_normal(x, N, 2.5, 15), fill_normal(R, N, 1, 16);
  dt_gelu_forward(out, x, N);
  memcpy(dx, R, sizeof dx);
  dt_gelu_backward(dx, x, dx, N); /* in place */
  lctx_t c = {.N = N, .x = to_double(x, N), .out = malloc(sizeof(double) * N), .R = to_double(R, N)};
  obj_gelu(&c);
  expect_close("gelu forward", out, c.out, N, 1e-6);
  fd_check("gelu dinp", c.x, N, dx, obj_gelu, &c);
  free(c.x), free(c.out), free(c.R);
}

static double obj_ce(void *p) {
  lctx_t *c = p;
  return ref_crossentropy(c->x, c->tok, c->N, c->V, c->Vp);
}

Test(grad, crossentropy) {
  enum { N = 5, V = 11, Vp = 16 };
  int tgt[N] = {0, 10, 3, 3, 7};
  float logits[N * Vp], losses[N], lse[N], dl[N * Vp];
  fill_normal(logits, N * Vp, 3, 17);
  for (int i = 0; i < N; i++)
    for (int v = V; v < Vp; v++)
      logits[i * Vp + v] = 50.0f; /* padded columns must be ignored */
  double mean = dt_crossentropy_forward(losses, lse, logits, tgt, N, V, Vp);
  for (int i = 0; i < N * Vp; i++)
    dl[i] = 1e6f;
  dt_crossentropy_backward(dl, logits, lse, tgt, 1.0f / N, N, V, Vp);
  lctx_t c = {.N = N, .V = V, .Vp = Vp, .x = to_double(logits, N * Vp), .tok = tgt};
  double want = obj_ce(&c);
  cr_expect(fabs(mean - want) < 1e-6 * want, "mean loss %.8g want %.8g", mean, want);
  for (int i = 0; i < N; i++)
    for (int v = V; v < Vp; v++)
      cr_assert_eq(dl[i * Vp + v], 0.0f, "padded column %d has gradient", v);
  fd_check("crossentropy dlogits", c.x, N * Vp, dl, obj_ce, &c);
  free(c.x);
}
