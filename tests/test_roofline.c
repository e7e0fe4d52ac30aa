/* The CUDA kernels' roofline by class (roofline.c) against numbers worked out by hand: the products'
 * and the attention's FLOPs add up to dt_model_flops_per_token (counted independently in model.c),
 * recomputation adds exactly the blocks' forward, flash does 3.5 of the 6 (T, T) products of the
 * matmul attention, the memory classes' bytes from the tensors each kernel reads and writes, the
 * rounding passes only where bf16/fp16 round fp32 storage, the units each class runs on, and the
 * time as the sum over the classes of max(FLOPs/peak, bytes/HBM). */
#include <criterion/criterion.h>
#include <math.h>

#include "dt_build.h"
#include "plan.h"
#include "precision.h"
#include "roofline.h"

/* 2 blocks, C = 8, 2 heads, Vp = 16, B = 2, T = 4, 3 micro-batches: small enough to count by hand */
static const dt_dims_t tiny = {.L = 2, .NH = 2, .C = 8, .V = 13, .Vp = 16, .T = 4};
enum { B = 2, T = 4, M = 3, N = B * T, C = 8, L = 2, Vp = 16 };

static dt_plan_t P; /* large: static */

static void plan(int prec, int flash, int cudnn, int tf32, int recompute) {
  dt_plan_in_t in = {.d = tiny, .B = B, .T = T, .accum = M, .dp = 1, .tp = 1, .pp = 1, .precision = prec,
                     .bucket_mb = 25, .threads = 1, .zero = 0, .device_mem = 80.0 * 1073741824.0, .flash = flash,
                     .cudnn = cudnn, .tf32 = tf32, .recompute = recompute};
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
}

Test(roofline, product_and_attention_flops_are_the_models) {
  plan(DT_PREC_FP32, 0, 0, 0, 0);
  dt_kroof_t r;
  dt_kroof_compute(&P, 4, &r);
  const double model = dt_model_flops_per_token(&tiny, T) * N * M;
  const double got = r.flops[DT_KC_MATMUL] + r.flops[DT_KC_LMHEAD] + r.flops[DT_KC_ATTENTION];
  cr_assert_eq(got, model, "products %g, model %g", got, model);
  cr_assert_eq(r.flops[DT_KC_MATMUL], 6.0 * N * 12 * C * C * L * M);
  cr_assert_eq(r.flops[DT_KC_LMHEAD], 6.0 * N * C * Vp * M);
  /* recompute: the blocks' forward again (2 N 12 C^2 and the two (T, T) products per block) */
  plan(DT_PREC_FP32, 0, 0, 0, 1);
  dt_kroof_t rc;
  dt_kroof_compute(&P, 4, &rc);
  cr_assert_eq(rc.flops[DT_KC_MATMUL] - r.flops[DT_KC_MATMUL], 2.0 * N * 12 * C * C * L * M);
  cr_assert_eq(rc.flops[DT_KC_ATTENTION] - r.flops[DT_KC_ATTENTION], 2 * 2.0 * B * 2 * T * T * (C / 2) * L * M);
  /* flash: the causal half of 2 products forward and 5 backward: 3.5 of matmul's 6 */
  plan(DT_PREC_FP32, 1, 0, 0, 0);
  dt_kroof_t f;
  dt_kroof_compute(&P, 4, &f);
  cr_assert_eq(f.flops[DT_KC_ATTENTION] * 6, r.flops[DT_KC_ATTENTION] * 3.5);
}

Test(roofline, memory_classes_count_each_tensor_once) {
  plan(DT_PREC_FP32, 0, 0, 0, 0);
  dt_kroof_t r;
  dt_kroof_compute(&P, 4, &r);
  const double s = 4, fc = (double)N * 4 * C;
  /* gelu: forward reads and writes (N, 4C); backward reads x and dout, writes dinp */
  cr_assert_eq(r.bytes[DT_KC_GELU], M * L * (2 + 3) * s * fc);
  /* layernorm: per block 2 forward (x in, y out, mean + rstd) and 2 backward (dout, x, dresid in,
   * dinp out; dout, x again for the parameters), ln_f without dresid */
  const double nc = (double)N * C;
  cr_assert_eq(r.bytes[DT_KC_LAYERNORM],
               M * (L * (2 * (2 * s * nc + 8 * N) + 2 * (6 * s * nc + 8 * N)) + (2 * s * nc + 8 * N) +
                    (5 * s * nc + 8 * N)));
  /* cross-entropy: one read of the logits forward, lse + losses out, the mean's read; in place backward */
  cr_assert_eq(r.bytes[DT_KC_XENT], M * (3 * s * N * Vp + 12.0 * N));
  /* optimizer, once per step: zero_grad writes, the norm reads, AdamW 7 floats per parameter */
  const double p = P.stage_params[0];
  cr_assert(p > 0);
  cr_assert_eq(r.bytes[DT_KC_OPTIM], 36 * p);
  cr_assert_eq(r.bytes[DT_KC_ROUND], 0, "fp32 rounds nothing");
  cr_assert_eq(r.flops[DT_KC_GELU], 0);
}

Test(roofline, rounding_passes_only_for_16_bit_on_fp32_storage) {
  plan(DT_PREC_BF16, 0, 0, 0, 0);
  dt_kroof_t r, r16;
  dt_kroof_compute(&P, 4, &r);
  dt_kroof_compute(&P, 2, &r16);
  const double nc = (double)N * C, p = P.stage_params[0];
  /* every STORE of gpt2.c: per block 2 (N, C) and 5 (N, C/tp) backward (dfch dtmp dtmp dtmp);
   * the head's logits and dtmp; the embeddings; the working copy each forward. Layernorm, GELU,
   * the bias epilogues, cross-entropy backward and the attention round as they store; the matmul
   * attention (cuBLAS writes out and dqkv) with a pass of the backend: 1 (N, C/tp) forward, 3
   * backward. */
  const double head = 1.0 * N * Vp + nc + nc + p;
  const double per_mb = 8 * (L * (nc + 3 * nc + 2 * nc + 5 * nc) + head);
  cr_assert_eq(r.bytes[DT_KC_ROUND], M * per_mb);
  plan(DT_PREC_BF16, 1, 0, 0, 0);
  dt_kroof_t rf;
  dt_kroof_compute(&P, 4, &rf);
  cr_assert_eq(rf.bytes[DT_KC_ROUND], M * 8 * (L * (2 * nc + 5 * nc) + head), "flash: no attention pass");
  plan(DT_PREC_BF16, 0, 0, 0, 0);
  cr_assert_eq(r16.bytes[DT_KC_ROUND], 6 * p, "16-bit storage: only the working copy, once per step");
  cr_assert_eq(r16.bytes[DT_KC_GELU] * 2, r.bytes[DT_KC_GELU], "half the bytes per activation");
}

/* 16-bit storage as built (bf16, flash): qkv's and fc's bias is cuBLASLt's epilogue (they write 2
 * bytes, no pass of ours); the projections write their fp32 sums (4 bytes) and their epilogue reads
 * them back with the residual and stores 2; the biases' column sums read dout (2 bytes); our
 * flash kernels stay on fp32 cores */
Test(roofline, sixteen_bit_storage_goes_through_the_fp32_accumulator) {
  plan(DT_PREC_BF16, 1, 0, 0, 0);
  dt_kroof_t r4, r16;
  dt_kroof_compute(&P, 4, &r4);
  dt_kroof_compute(&P, 2, &r16);
  const double n = N, c = C;
  cr_assert_eq(r16.bytes[DT_KC_BIAS], M * L * (n * 2 * 8 * c + 2 * n * 9 * c));
  cr_assert_eq(r4.bytes[DT_KC_BIAS], M * L * (n * (8 * 7 * c + 2 * 12 * c) + 4 * n * 9 * c));
  cr_assert_eq(r16.unit[DT_KC_ATTENTION], DT_KU_FP32);
  /* the projections' forward outputs stay 4 bytes, every other operand saves 2 bytes a value: over
   * the four block products (K, Nn) = (C, 3C), (C, C), (C, 4C), (4C, C), sum K = 7C, sum Nn = 9C,
   * sum K Nn = 12 C^2: forward inp and W, dinp's dout, W and dinp, dW's inp and dout (dW stays
   * fp32): 3 x 2 N 7C + 2 x 2 N 9C + 2 x 2 x 12 C^2, and qkv's and fc's outputs 2 N (3C + 4C) */
  const double saved = r4.bytes[DT_KC_MATMUL] - r16.bytes[DT_KC_MATMUL];
  cr_assert_eq(saved, M * L * (6 * n * 7 * c + 4 * n * 9 * c + 4 * 12 * c * c + 2 * n * 7 * c));
}

/* the classes' units for one configuration */
static dt_kroof_t units(int prec, int flash, int cudnn, int tf32) {
  dt_kroof_t r;
  plan(prec, flash, cudnn, tf32, 0);
  dt_kroof_compute(&P, 4, &r);
  return r;
}

Test(roofline, units_follow_the_configuration) {
  dt_kroof_t r = units(DT_PREC_FP32, 0, 0, 0);
  cr_assert_eq(r.unit[DT_KC_MATMUL], DT_KU_FP32);
  cr_assert_eq(r.unit[DT_KC_ATTENTION], DT_KU_FP32);
  r = units(DT_PREC_FP32, 0, 0, 1);
  cr_assert_eq(r.unit[DT_KC_MATMUL], DT_KU_TF32);
  cr_assert_eq(r.unit[DT_KC_LMHEAD], DT_KU_TF32);
  cr_assert_eq(r.unit[DT_KC_ATTENTION], DT_KU_TF32);
  r = units(DT_PREC_BF16, 1, 0, 1); /* the layers on bf16 tensor cores, our flash kernels on fp32 cores */
  cr_assert_eq(r.unit[DT_KC_MATMUL], DT_KU_16);
  cr_assert_eq(r.unit[DT_KC_ATTENTION], DT_KU_FP32);
  r = units(DT_PREC_BF16, 1, 1, 0);
  cr_assert_eq(r.unit[DT_KC_ATTENTION], DT_KU_16);
}

Test(roofline, step_time_is_the_sum_of_the_classes) {
  plan(DT_PREC_BF16, 0, 0, 0, 0);
  dt_kroof_t r;
  dt_kroof_compute(&P, 4, &r);
  const dt_gpu_spec_t g = {"test", 1e12, 2e12, 4e12, 1e11, 1, 1, 8};
  double tk[DT_KC_N], sum = 0;
  const double t = dt_kroof_time(&r, &g, tk);
  for (int k = 0; k < DT_KC_N; k++) {
    const double peak = r.unit[k] == DT_KU_16 ? 4e12 : r.unit[k] == DT_KU_TF32 ? 2e12 : 1e12;
    cr_assert_float_eq(tk[k], fmax(r.flops[k] / peak, r.bytes[k] / 1e11), 1e-15 * (1 + tk[k]), "%s",
                       dt_kclass_names[k]);
    sum += tk[k];
  }
  cr_assert_float_eq(t, sum, 1e-15);
}
