/* Kernel parity: every launcher of cuda/kernels.h run on the device and its CPU twin
 * (src/backend/ops_cpu.h, or a float64 reference where the CPU has no separate twin: the attention
 * softmax, the gradient sum of squares) on the same inputs, fp32 and bf16 storage, small, odd and
 * large shapes; the kernels' 16-bit storage against their float storage (tests/gpu_parity_store.cu);
 * and the CUDA backend's ops against the CPU backend (tests/gpu_parity_backend.cu).
 * One row per case: op, shape, precision, normalised max error max|gpu - cpu| / max|cpu|, the
 * tolerance, the verdict. The same program runs on a real GPU (scripts/gpu-check.sh) and, built
 * against cuda/emu/, on the CPU.
 *
 *   gpu_parity [--small] [--huge] [--no-backend]
 *     --small  small and odd shapes only (compute-sanitizer, the emulation build)
 *     --no-backend  the kernels only (racecheck: cuBLAS's kernels under it take minutes)
 *     (default) also shapes past the launch grid's cap: 524,281+ rows, 2M+ columns, 65,536+ buckets
 *     --huge   also a logits tensor of more than 2^31 elements, when the device has the memory
 * Exit status: 0 all cases pass, 1 a case fails, 77 no usable GPU (the test suite's SKIP). */
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
#include "cuda_launch.h"
#include "gpu_parity.h"
#include "kernels.h"
#include "kmath.h"
#include "precision.h"

int g_fail = 0, g_cases = 0;

/* ---- helpers (gpu_parity.h) --------------------------------------------------------------- */

void gp_check(cudaError_t rc, const char *what, int line) {
  if (rc == cudaSuccess) return;
  fprintf(stderr, "gpu_parity.cu:%d: %s failed: %s\n", line, what, cudaGetErrorString(rc));
  exit(1);
}

void gp_try(dt_status_t st, const char *what, int line) {
  if (st == DT_OK) return;
  fprintf(stderr, "gpu_parity:%d: %s failed: %s\n", line, what, dt_err_msg());
  exit(1);
}

void *gp_dev(size_t bytes) {
  void *p = NULL;
  GP_CK(cudaMalloc(&p, bytes ? bytes : 16));
  return p;
}

void *gp_host(size_t bytes) {
  void *p = malloc(bytes ? bytes : 16);
  if (!p) {
    fprintf(stderr, "gpu_parity: out of host memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

float *gp_up(const float *h, size_t n) {
  float *d = (float *)gp_dev(n * sizeof(float));
  GP_CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

float *gp_down(const float *d, size_t n) {
  float *h = (float *)gp_host(n * sizeof(float));
  GP_CK(cudaDeviceSynchronize());
  GP_CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

/* uniform in [-scale, scale), rounded to the storage precision */
float *gp_rand(dt_rng_t *r, size_t n, float scale, int prec) {
  float *h = (float *)gp_host(n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = dt_prec_round1((float)(dt_rng_uniform(r) * 2 - 1) * scale, prec);
  return h;
}

int gp_compare(const char *op, const char *shape, int prec, const float *gpu, const float *cpu, size_t n, double tol) {
  double maxd = 0, maxc = 0;
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(gpu[i]) && !(isnan(gpu[i]) && isnan(cpu[i])) && gpu[i] != cpu[i]) bad++;
    maxd = fmax(maxd, fabs((double)gpu[i] - (double)cpu[i]));
    maxc = fmax(maxc, fabs((double)cpu[i]));
  }
  double err = maxc > 0 ? maxd / maxc : maxd;
  int ok = bad == 0 && err <= tol;
  g_cases++;
  g_fail += !ok;
  printf("%-28s %-26s %-5s %10.3e %9.1e  %s", op, shape, dt_precision_name((dt_precision_t)prec), err, tol,
         ok ? "PASS" : "FAIL");
  if (bad) printf(" (%zu non-finite)", bad);
  printf("\n");
  fflush(stdout);
  return ok;
}

/* the device output rounded to the storage precision by the rounding kernel (also a parity case
 * of dt_cu_round_copy), the CPU's with dt_prec_round1 */
static void round_both(float *d, float *h, size_t n, int prec) {
  GP_TRY(dt_cu_round_copy(d, d, n, prec, 0));
  for (size_t i = 0; i < n; i++) h[i] = dt_prec_round1(h[i], prec);
}

double gp_tol(int prec, double fp32) { return prec == DT_PREC_FP32 ? fp32 : 8e-3; }

/* ---- elementwise ------------------------------------------------------------------------ */

static void elementwise(size_t n, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  float *x = gp_rand(r, n, 4.0f, prec), *y = gp_rand(r, n, 1.0f, prec);
  float *dx = gp_up(x, n), *dy = gp_up(y, n), *dout = (float *)gp_dev(n * sizeof(float));
  float *h = (float *)gp_host(n * sizeof(float));

  GP_TRY(dt_cu_gelu_forward(dout, dx, n, prec, 0)); /* rounds as it stores */
  dt_gelu_forward(h, x, n);
  round_both(dout, h, n, prec);
  float *g = gp_down(dout, n);
  gp_compare("gelu_forward", shape, prec, g, h, n, gp_tol(prec, 1e-6));
  free(g);

  GP_TRY(dt_cu_gelu_backward(dout, dx, dy, n, prec, 0));
  dt_gelu_backward(h, x, y, n);
  round_both(dout, h, n, prec);
  g = gp_down(dout, n);
  gp_compare("gelu_backward", shape, prec, g, h, n, gp_tol(prec, 1e-6));
  free(g);

  GP_TRY(dt_cu_residual_forward(dout, dx, dy, n, DT_PREC_FP32, 0));
  dt_residual_forward(h, x, y, n);
  round_both(dout, h, n, prec);
  g = gp_down(dout, n);
  gp_compare("residual_forward", shape, prec, g, h, n, 0);
  free(g);

  for (int p = DT_PREC_BF16; p <= DT_PREC_FP16; p++) { /* the rounding kernel itself, bit for bit */
    float *xs = gp_rand(r, n, 70000.0f, DT_PREC_FP32), *dxs = gp_up(xs, n);
    GP_TRY(dt_cu_round_copy(dout, dxs, n, p, 0));
    for (size_t i = 0; i < n; i++) h[i] = dt_prec_round1(xs[i], p);
    g = gp_down(dout, n);
    gp_compare(p == DT_PREC_BF16 ? "round_copy bf16" : "round_copy fp16", shape, DT_PREC_FP32, g, h, n, 0);
    free(g);
    free(xs);
    cudaFree(dxs);
  }
  free(x);
  free(y);
  free(h);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dout);
}

/* ---- bias, column sums ---------------------------------------------------------------- */

static void bias_cols(int N, int OC, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d OC=%d", N, OC);
  size_t n = (size_t)N * OC;
  float *x = gp_rand(r, n, 1.0f, prec), *b = gp_rand(r, OC, 1.0f, prec), *acc = gp_rand(r, OC, 1.0f, prec);
  float *dx = gp_up(x, n), *db = gp_up(b, OC), *dacc = gp_up(acc, OC);
  GP_TRY(dt_cu_add_bias(dx, db, N, OC, prec, 0)); /* stored rounded: exactly the rounded sum */
  for (size_t i = 0; i < n; i++) x[i] = dt_prec_round1(x[i] + b[i % OC], prec);
  float *g = gp_down(dx, n);
  gp_compare("add_bias", shape, prec, g, x, n, 0);
  free(g);
  float *scr = (float *)gp_dev(dt_cu_col_scratch_floats(OC) * sizeof(float));
  GP_TRY(dt_cu_col_sum(dacc, dx, N, OC, scr, DT_PREC_FP32, 0)); /* acc += column sums of x (now with the bias) */
  for (int j = 0; j < OC; j++) {
    double s = 0;
    for (int i = 0; i < N; i++) s += x[(size_t)i * OC + j];
    acc[j] = (float)(acc[j] + s);
  }
  g = gp_down(dacc, OC);
  gp_compare("col_sum (+=)", shape, prec, g, acc, OC, 1e-5 * sqrt((double)N));
  free(g);
  free(x);
  free(b);
  free(acc);
  cudaFree(dx);
  cudaFree(db);
  cudaFree(dacc);
  cudaFree(scr);
}

/* ---- layernorm ---------------------------------------------------------------------------- */

static void layernorm(int N, int C, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
  size_t n = (size_t)N * C;
  float *x = gp_rand(r, n, 2.0f, prec), *w = gp_rand(r, C, 1.0f, prec), *b = gp_rand(r, C, 1.0f, prec);
  float *dout = gp_rand(r, n, 1.0f, prec), *dres = gp_rand(r, n, 1.0f, prec);
  float *dw0 = gp_rand(r, C, 1.0f, DT_PREC_FP32), *db0 = gp_rand(r, C, 1.0f, DT_PREC_FP32);
  float *out = (float *)gp_host(n * sizeof(float)), *mean = (float *)gp_host(N * sizeof(float));
  float *rstd = (float *)gp_host(N * sizeof(float)), *dinp = (float *)gp_host(n * sizeof(float));
  float *d_x = gp_up(x, n), *d_w = gp_up(w, C), *d_b = gp_up(b, C), *d_dout = gp_up(dout, n);
  float *d_dres = gp_up(dres, n), *d_dw = gp_up(dw0, C), *d_db = gp_up(db0, C);
  float *d_out = (float *)gp_dev(n * sizeof(float)), *d_mean = (float *)gp_dev(N * sizeof(float));
  float *d_rstd = (float *)gp_dev(N * sizeof(float)), *d_dinp = (float *)gp_dev(n * sizeof(float));
  float *d_scr = (float *)gp_dev(dt_cu_col_scratch_floats(2 * (size_t)C) * sizeof(float));

  GP_TRY(dt_cu_layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, prec, 0));
  dt_layernorm_forward(out, mean, rstd, x, w, b, N, C);
  round_both(d_out, out, n, prec);
  float *g = gp_down(d_out, n);
  gp_compare("layernorm_forward out", shape, prec, g, out, n, gp_tol(prec, 2e-5));
  free(g);
  g = gp_down(d_mean, N);
  gp_compare("layernorm_forward mean", shape, prec, g, mean, N, 1e-5);
  free(g);
  g = gp_down(d_rstd, N);
  gp_compare("layernorm_forward rstd", shape, prec, g, rstd, N, 1e-5);
  free(g);

  /* backward from the CPU's statistics on both sides, with the residual gradient added in place
   * (dinp == dresid, as the backend calls it) */
  GP_CK(cudaMemcpy(d_mean, mean, N * sizeof(float), cudaMemcpyHostToDevice));
  GP_CK(cudaMemcpy(d_rstd, rstd, N * sizeof(float), cudaMemcpyHostToDevice));
  GP_TRY(dt_cu_layernorm_backward(d_dres, d_dw, d_db, d_dres, d_dout, d_x, d_w, d_mean, d_rstd, N, C, d_scr, prec, 0));
  dt_layernorm_backward(dres, dw0, db0, dres, dout, x, w, mean, rstd, N, C);
  round_both(d_dres, dres, n, prec);
  g = gp_down(d_dres, n);
  gp_compare("layernorm_backward dinp+=", shape, prec, g, dres, n, gp_tol(prec, 5e-5));
  free(g);
  double tol_p = 2e-6 * sqrt((double)N) + 1e-6;
  g = gp_down(d_dw, C);
  gp_compare("layernorm_backward dweight", shape, prec, g, dw0, C, tol_p);
  free(g);
  g = gp_down(d_db, C);
  gp_compare("layernorm_backward dbias", shape, prec, g, db0, C, tol_p);
  free(g);
  GP_TRY(dt_cu_layernorm_backward(d_dinp, d_dw, d_db, NULL, d_dout, d_x, d_w, d_mean, d_rstd, N, C, d_scr, prec, 0));
  dt_layernorm_backward(dinp, dw0, db0, NULL, dout, x, w, mean, rstd, N, C);
  for (size_t i = 0; i < n; i++) dinp[i] = dt_prec_round1(dinp[i], prec); /* the kernel's own rounding only */
  g = gp_down(d_dinp, n);
  gp_compare("layernorm_backward dinp", shape, prec, g, dinp, n, gp_tol(prec, 5e-5));
  free(g);

  float *hs[] = {x, w, b, dout, dres, dw0, db0, out, mean, rstd, dinp};
  for (float *p : hs) free(p);
  float *ds[] = {d_x, d_w, d_b, d_dout, d_dres, d_dw, d_db, d_out, d_mean, d_rstd, d_dinp, d_scr};
  for (float *p : ds) cudaFree(p);
}

/* ---- embedding ---------------------------------------------------------------------------- */

static void encoder(int B, int T, int C, int V, int prec, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
  size_t N = (size_t)B * T, n = N * C;
  int *inp = (int *)gp_host(N * sizeof(int)), *order = (int *)gp_host(N * sizeof(int));
  int *count = (int *)gp_host(((size_t)V + 1) * sizeof(int));
  dt_embed_bucket_t *bk = (dt_embed_bucket_t *)gp_host(N * sizeof(dt_embed_bucket_t));
  for (size_t i = 0; i < N; i++) /* a few frequent tokens and a long tail, like text */
    inp[i] = dt_rng_uniform(r) < 0.3 ? (int)(dt_rng_uniform(r) * 4) : (int)(dt_rng_uniform(r) * V);
  float *wte = gp_rand(r, (size_t)V * C, 1.0f, prec), *wpe = gp_rand(r, (size_t)T * C, 1.0f, prec);
  float *dout = gp_rand(r, n, 1.0f, prec), *out = (float *)gp_host(n * sizeof(float));
  float *dwte = gp_rand(r, (size_t)V * C, 1.0f, DT_PREC_FP32), *dwpe = gp_rand(r, (size_t)T * C, 1.0f, DT_PREC_FP32);
  float *d_wte = gp_up(wte, (size_t)V * C), *d_wpe = gp_up(wpe, (size_t)T * C), *d_dout = gp_up(dout, n);
  float *d_dwte = gp_up(dwte, (size_t)V * C), *d_dwpe = gp_up(dwpe, (size_t)T * C);
  float *d_out = (float *)gp_dev(n * sizeof(float));
  int *d_inp = (int *)gp_dev(N * sizeof(int)), *d_order = (int *)gp_dev(N * sizeof(int));
  dt_embed_bucket_t *d_bk = (dt_embed_bucket_t *)gp_dev(N * sizeof(dt_embed_bucket_t));
  GP_CK(cudaMemcpy(d_inp, inp, N * sizeof(int), cudaMemcpyHostToDevice));

  GP_TRY(dt_cu_encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C, DT_PREC_FP32, 0));
  dt_encoder_forward(out, inp, wte, wpe, B, T, C);
  round_both(d_out, out, n, prec);
  float *g = gp_down(d_out, n);
  gp_compare("encoder_forward", shape, prec, g, out, n, 0);
  free(g);

  int nb = dt_embed_buckets(inp, (int)N, V, count, order, bk);
  GP_CK(cudaMemcpy(d_order, order, N * sizeof(int), cudaMemcpyHostToDevice));
  GP_CK(cudaMemcpy(d_bk, bk, (size_t)nb * sizeof(dt_embed_bucket_t), cudaMemcpyHostToDevice));
  GP_TRY(dt_cu_encoder_backward(d_dwte, d_dwpe, d_dout, d_order, d_bk, nb, B, T, C, DT_PREC_FP32, 0));
  dt_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
  g = gp_down(d_dwte, (size_t)V * C); /* deterministic and in the CPU's order: bit for bit */
  gp_compare("encoder_backward dwte (bits)", shape, prec, g, dwte, (size_t)V * C, 0);
  free(g);
  g = gp_down(d_dwpe, (size_t)T * C);
  gp_compare("encoder_backward dwpe (bits)", shape, prec, g, dwpe, (size_t)T * C, 0);
  free(g);

  free(inp);
  free(order);
  free(count);
  free(bk);
  float *hs[] = {wte, wpe, dout, out, dwte, dwpe};
  for (float *p : hs) free(p);
  float *ds[] = {d_wte, d_wpe, d_dout, d_dwte, d_dwpe, d_out};
  for (float *p : ds) cudaFree(p);
  cudaFree(d_inp);
  cudaFree(d_order);
  cudaFree(d_bk);
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  int small = 0, huge = 0, backend = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--small")) small = 1;
    else if (!strcmp(argv[i], "--huge")) huge = 1;
    else if (!strcmp(argv[i], "--no-backend")) backend = 0;
    else {
      fprintf(stderr, "usage: gpu_parity [--small] [--huge] [--no-backend]\n");
      return 2;
    }
  }
  int ndev = 0;
  cudaError_t rc = cudaGetDeviceCount(&ndev);
  if (rc != cudaSuccess || ndev < 1) {
    printf("skip: no usable GPU (%s)\n", rc != cudaSuccess ? cudaGetErrorString(rc) : "no device");
    return 77;
  }
  cudaDeviceProp prop;
  GP_CK(cudaGetDeviceProperties(&prop, 0));
  printf("# gpu_parity on %s (sm_%d%d), %s shapes\n", prop.name, prop.major, prop.minor,
         small ? "small" : huge ? "all + huge" : "small + past the grid cap");
  printf("# error = max|gpu - cpu| / max|cpu| over the tensor; tolerance per case\n");
  printf("%-28s %-26s %-5s %10s %9s  %s\n", "op", "shape", "prec", "error", "tol", "verdict");
  dt_rng_t r;
  dt_rng_seed(&r, 1234);
  const int precs[] = {DT_PREC_FP32, DT_PREC_BF16};
  for (int prec : precs) {
    elementwise(1, prec, &r);
    elementwise(1000003, prec, &r);
    bias_cols(7, 33, prec, &r);
    bias_cols(257, 768, prec, &r);
    layernorm(1, 1, prec, &r);
    layernorm(37, 100, prec, &r);
    layernorm(64, 768, prec, &r);
    encoder(3, 17, 40, 97, prec, &r);
    gp_attention_softmax(2, 3, 17, prec, &r);
    gp_crossentropy(37, 97, 128, prec, &r);
    gp_crossentropy(4, 50257, 50304, prec, &r);
    gp_optimizer(1000, &r);
    gp_tensor_parallel(prec, &r);
    if (!small) { /* past the launch grid's cap: the kernels loop */
      layernorm(524281, 32, prec, &r);
      bias_cols(2, 2097152 + 33, prec, &r);
      gp_attention_softmax(1, 32801, 16, prec, &r); /* 524,816 rows */
      gp_crossentropy(70001, 61, 64, prec, &r);     /* blocks per row past 65,535 */
      encoder(1, 200000, 4, 140000, prec, &r);      /* more than 65,535 token buckets */
    }
  }
  gp_optimizer(3000017, &r);
  gp_attention_decode(2, 3, 16, 5, 4, 12, DT_PREC_FP32, &r); /* the prompt of a continued sequence */
  gp_attention_decode(1, 12, 64, 0, 17, 40, DT_PREC_FP32, &r); /* a prompt (GPT-2's head size) */
  gp_attention_decode(1, 2, 256, 30, 1, 64, DT_PREC_FP32, &r); /* one step, the largest head size */
  gp_attention_decode(3, 4, 40, 63, 1, 64, DT_PREC_FP32, &r); /* the last position of the cache */
  {
    dt_rng_t r16; /* its own numbers: the cases after it keep theirs */
    dt_rng_seed(&r16, 1616);
    gp_convert16(1001, &r16); /* fp32 <-> 16-bit copies (cuDNN's attention) */
  }
  gp_attention_flash(2, 3, 16, 13, DT_PREC_FP32, &r); /* odd T */
  gp_attention_flash(1, 2, 64, 40, DT_PREC_FP32, &r); /* GPT-2's head size */
  gp_attention_flash(1, 1, 256, 9, DT_PREC_FP32, &r); /* the largest head size */
  gp_attention_flash(2, 5, 40, 33, DT_PREC_FP32, &r); /* a head size that is no multiple of the warp */
  gp_attention_flash(1, 2, 64, 150, DT_PREC_FP32, &r); /* several key tiles (64 keys each), the last one partial */
  gp_attention_flash(2, 2, 128, 77, DT_PREC_FP32, &r); /* 32-key tiles, 16 query rows per block */
  gp_attention_flash(1, 3, 16, 300, DT_PREC_FP32, &r); /* 2 lanes per row, 128 rows per block */
  gp_attention_flash(1, 1, 3, 520, DT_PREC_FP32, &r); /* 1 lane per row, 256-key tiles */
  if (!small) gp_attention_flash(1, 8201, 16, 64, DT_PREC_FP32, &r); /* 524,864 rows: past the capped grid */
  gp_attention_flash(1, 2, 64, 150, DT_PREC_BF16, &r); /* out and dqkv rounded as they are stored */
  gp_attention_flash(2, 5, 40, 33, DT_PREC_FP16, &r);
  gp_attention_decode(1, 12, 64, 3, 5, 16, DT_PREC_BF16, &r);
  {
    dt_rng_t rs; /* 16-bit storage, its own numbers too */
    dt_rng_seed(&rs, 1617);
    gp_store16_all(&rs, small);
  }
  if (huge) gp_crossentropy_huge(&r);
  if (backend) gp_backend_all(small);
  {
    dt_rng_t rc; /* the classifiers' own numbers: cases added above do not change their data */
    dt_rng_seed(&rc, getenv("DTRAIN_PARITY_CNN_SEED") ? (uint64_t)atoll(getenv("DTRAIN_PARITY_CNN_SEED")) : 2525);
    gp_cnn_all(&rc);
  }
  printf("gpu_parity: %d of %d cases pass%s\n", g_cases - g_fail, g_cases, g_fail ? "; FAILED" : "");
  return g_fail ? 1 : 0;
}
