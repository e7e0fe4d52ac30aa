/* Backend parity (see gpu_parity.cu): the CUDA backend's ops against the CPU backend's on the same
 * weights and tokens: forward (loss, logits), backward (every parameter gradient, with grad_accum
 * 2), grad_sumsq, AdamW (from preset moments, so the update is smooth in the gradient), and a
 * second forward; fp32 and bf16 storage; small and odd shapes, and an attention of more than
 * 524,280 softmax rows. Covers what the kernel cases cannot: the cuBLAS calls and their
 * row-major mapping, the attention's batched products, the layer order and the rounding points. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_build.h" /* DT_HAVE_CUDA: dt_backend_cuda */
extern "C" {
#include "backend.h"
#include "gpt2.h"
#include "model.h"
}
#include "gpu_parity.h"
#include "precision.h"

typedef struct {
  double loss, logits, grads, sumsq, update; /* tolerances */
} tols_t;

/* Worst normalised error over the arena's tensors (each by its own max|cpu|); names the tensor. */
static void compare_arena(const char *what, const char *shape, int prec, const dt_layout_t *lay, const float *g,
                          const float *c, double tol) {
  double worst = 0;
  const char *at = "-";
  int ok = 1;
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    size_t n = (size_t)t->rows * t->cols;
    double md = 0, mc = 0;
    for (size_t k = 0; k < n; k++) {
      ok &= isfinite(g[t->offset + k]);
      md = fmax(md, fabs((double)g[t->offset + k] - c[t->offset + k]));
      mc = fmax(mc, fabs((double)c[t->offset + k]));
    }
    double e = mc > 0 ? md / mc : md;
    if (e > worst) {
      worst = e;
      at = t->name;
    }
  }
  ok &= worst <= tol;
  g_cases++;
  g_fail += !ok;
  char label[64];
  snprintf(label, sizeof label, "%s", what);
  printf("%-28s %-26s %-5s %10.3e %9.1e  %s (worst: %s)\n", label, shape, dt_precision_name((dt_precision_t)prec),
         worst, tol, ok ? "PASS" : "FAIL", at);
}

static void both(dt_status_t a, dt_status_t b, const char *what) {
  if (a == DT_OK && b == DT_OK) return;
  fprintf(stderr, "gpu_parity: backend %s failed (cpu %s, cuda %s): %s\n", what, dt_status_str(a), dt_status_str(b),
          dt_err_msg());
  exit(1);
}

static void backend_case(dt_dims_t d, int B, int T, int prec, const tols_t *tol, dt_rng_t *r) {
  char shape[64];
  snprintf(shape, sizeof shape, "L%d C%d NH%d V%d B%d T%d", d.L, d.C, d.NH, d.V, B, T);
  dt_layout_t lay;
  GP_TRY(dt_layout_init(&lay, d));
  size_t np = lay.n_params, nl = (size_t)B * T * d.Vp;
  float *p = (float *)gp_host(np * sizeof(float)), *hc = (float *)gp_host(np * sizeof(float));
  float *hg = (float *)gp_host(np * sizeof(float)), *lc = (float *)gp_host(nl * sizeof(float));
  float *lg = (float *)gp_host(nl * sizeof(float));
  dt_model_init_params(&lay, p, 42);
  int *inp = (int *)gp_host((size_t)B * T * sizeof(int)), *tg = (int *)gp_host((size_t)B * T * sizeof(int));
  for (int i = 0; i < B * T; i++) {
    inp[i] = (int)(dt_rng_uniform(r) * d.V);
    tg[i] = (int)(dt_rng_uniform(r) * d.V);
  }
  dt_backend_t cpu, gpu;
  memset(&cpu, 0, sizeof cpu);
  memset(&gpu, 0, sizeof gpu);
  gpu.device = 0;
  both(dt_backend_cpu.init(&cpu, &lay, B, d.T, 1), dt_backend_cuda.init(&gpu, &lay, B, d.T, 1), "init");
  both(cpu.ops->set_precision(&cpu, (dt_precision_t)prec), gpu.ops->set_precision(&gpu, (dt_precision_t)prec),
       "set_precision");
  dt_gpt2_t mc, mg; /* the model over each backend */
  both(dt_gpt2_init(&mc, &cpu, 1, 0), dt_gpt2_init(&mg, &gpu, 1, 0), "gpt2_init");
  both(cpu.ops->copy_from_host(&cpu, DT_BUF_PARAMS, 0, np, p), gpu.ops->copy_from_host(&gpu, DT_BUF_PARAMS, 0, np, p),
       "copy_from_host");
  both(cpu.ops->zero_grad(&cpu), gpu.ops->zero_grad(&gpu), "zero_grad");
  float loss_c = 0, loss_g = 0;
  for (int micro = 0; micro < 2; micro++) { /* grad_accum 2: the second backward adds to the first */
    both(dt_gpt2_forward(&mc, inp, tg, B, T, &loss_c), dt_gpt2_forward(&mg, inp, tg, B, T, &loss_g), "forward");
    if (micro == 0) {
      gp_compare("backend forward loss", shape, prec, &loss_g, &loss_c, 1, tol->loss);
      both(dt_gpt2_logits_to_host(&mc, lc), dt_gpt2_logits_to_host(&mg, lg), "logits_to_host");
      gp_compare("backend forward logits", shape, prec, lg, lc, nl, tol->logits);
    }
    both(dt_gpt2_backward(&mc, 2, NULL, NULL), dt_gpt2_backward(&mg, 2, NULL, NULL), "backward");
  }
  both(cpu.ops->copy_to_host(&cpu, DT_BUF_GRADS, 0, np, hc), gpu.ops->copy_to_host(&gpu, DT_BUF_GRADS, 0, np, hg),
       "copy_to_host");
  compare_arena("backend backward grads", shape, prec, &lay, hg, hc, tol->grads);
  double sc = 0, sg = 0;
  both(cpu.ops->grad_sumsq(&cpu, &sc), gpu.ops->grad_sumsq(&gpu, &sg), "grad_sumsq");
  float fsc = (float)sc, fsg = (float)sg;
  gp_compare("backend grad_sumsq", shape, prec, &fsg, &fsc, 1, tol->sumsq);

  /* ZeRO's kernels on those gradients: the second quarter divided by 3, the third cleared */
  size_t q = np / 4;
  both(cpu.k->divide(&cpu, cpu.grads + q, q, 3.0f), gpu.k->divide(&gpu, gpu.grads + q, q, 3.0f), "divide");
  both(cpu.k->clear(&cpu, cpu.grads + 2 * q, q), gpu.k->clear(&gpu, gpu.grads + 2 * q, q), "clear");
  float *hd = (float *)gp_host(np * sizeof(float));
  both(DT_OK, gpu.ops->copy_to_host(&gpu, DT_BUF_GRADS, 0, np, hd), "copy_to_host");
  int bad = 0;
  for (size_t i = 0; i < np; i++) /* a true division (bitwise), zeros, the rest untouched */
    bad += hd[i] != (i < q || i >= 3 * q ? hg[i] : i < 2 * q ? hg[i] / 3.0f : 0.0f);
  g_cases++;
  g_fail += bad != 0;
  printf("%-28s %-26s %-5s %10d %9s  %s\n", "backend divide + clear", shape, dt_precision_name((dt_precision_t)prec), bad,
         "0", bad ? "FAIL" : "PASS");
  both(cpu.ops->copy_to_host(&cpu, DT_BUF_GRADS, 0, np, hc), DT_OK, "copy_to_host");
  compare_arena("backend divide + clear", shape, prec, &lay, hd, hc, tol->grads);
  free(hd);

  /* AdamW from preset moments (step 10): the update is smooth in the gradients */
  float *m = gp_rand(r, np, 1e-3f, DT_PREC_FP32), *v = gp_rand(r, np, 1e-5f, DT_PREC_FP32);
  for (size_t i = 0; i < np; i++) v[i] = fabsf(v[i]) + 1e-6f;
  both(cpu.ops->copy_from_host(&cpu, DT_BUF_M, 0, np, m), gpu.ops->copy_from_host(&gpu, DT_BUF_M, 0, np, m), "copy m");
  both(cpu.ops->copy_from_host(&cpu, DT_BUF_V, 0, np, v), gpu.ops->copy_from_host(&gpu, DT_BUF_V, 0, np, v), "copy v");
  dt_adamw_args_t a = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 10};
  both(cpu.ops->adamw(&cpu, &a), gpu.ops->adamw(&gpu, &a), "adamw");
  both(cpu.ops->copy_to_host(&cpu, DT_BUF_PARAMS, 0, np, hc), gpu.ops->copy_to_host(&gpu, DT_BUF_PARAMS, 0, np, hg),
       "copy params");
  for (size_t i = 0; i < np; i++) { /* compare the updates, not the parameters they moved */
    hc[i] -= p[i];
    hg[i] -= p[i];
  }
  compare_arena("backend adamw update", shape, prec, &lay, hg, hc, tol->update);
  both(dt_gpt2_forward(&mc, inp, tg, B, T, &loss_c), dt_gpt2_forward(&mg, inp, tg, B, T, &loss_g), "forward 2");
  gp_compare("backend loss after update", shape, prec, &loss_g, &loss_c, 1, tol->loss);

  dt_gpt2_free(&mc);
  dt_gpt2_free(&mg);
  cpu.ops->free(&cpu);
  gpu.ops->free(&gpu);
  float *hs[] = {p, hc, hg, lc, lg, m, v};
  for (float *x : hs) free(x);
  free(inp);
  free(tg);
  dt_layout_free(&lay);
}

void gp_backend_all(int small) {
  dt_rng_t r;
  dt_rng_seed(&r, 77);
  /* fp32: summation order only (cuBLAS vs our sgemm); bf16: a storage rounding may land on the
   * other side of a bf16 step on one backend, and that difference flows on */
  const tols_t t32 = {1e-5, 5e-5, 1e-4, 1e-5, 1e-4}, t16 = {5e-3, 2e-2, 5e-2, 2e-2, 5e-2};
  const int precs[] = {DT_PREC_FP32, DT_PREC_BF16};
  for (int prec : precs) {
    const tols_t *t = prec == DT_PREC_FP32 ? &t32 : &t16;
    backend_case((dt_dims_t){.L = 2, .NH = 4, .C = 64, .V = 97, .Vp = 128, .T = 16}, 3, 16, prec, t, &r);
    backend_case((dt_dims_t){.L = 1, .NH = 3, .C = 48, .V = 61, .Vp = 64, .T = 16}, 2, 13, prec, t, &r);
    if (!small) /* 64 x 64 x 128 = 524,288 attention softmax rows: past the capped grid */
      backend_case((dt_dims_t){.L = 1, .NH = 64, .C = 128, .V = 300, .Vp = 320, .T = 128}, 64, 128, prec, t, &r);
  }
}
