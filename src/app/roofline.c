/* The CUDA backend's kernels by class on a GPU datasheet (roofline.h). Counted per micro-batch of
 * N = B*T tokens on the last pipeline stage (nl blocks, tp-local widths Cl = C/tp, NHl = NH/tp,
 * Vpl = Vp/tp), times the micro-batches of a step, plus the optimizer's passes once. s is the bytes
 * of a stored activation or activation gradient, ws of a weight as the products read it (the
 * working copy: 4 today, 2 with 16-bit storage); parameter gradients are fp32 (4 bytes, read and
 * written where they accumulate). The kernels and their tensors, as cuda/ and gpt2.c run them:
 *   products   forward out = inp W, backward dinp = dout W^T and dW += inp^T dout (cuBLAS)
 *   attention  matmul: scores, softmax, probabilities x v, kept (B, NHl, T, T) and their gradient;
 *              flash: the causal half of the products on fp32 CUDA cores, the rows' log-sum-exp
 *              kept, backward 5 products (recomputed scores, dP, dV, dQ, dK) and the rows' dsum;
 *              cudnn: the same FLOPs on 16-bit tensor cores, plus convert16's copies both ways
 *   layernorm  forward: read x, write y, mean, rstd; backward: dinp from dout, x, dresid (the
 *              blocks') and the parameters' partial sums from dout and x again
 *   bias       qkv and fc: + bias in place (read, write); projections: resid + (out + bias) (read
 *              both, write); with 16-bit storage qkv's and fc's bias is cuBLASLt's epilogue (no
 *              pass), the projections write their fp32 sums and this epilogue reads those (4
 *              bytes) and stores 2; backward: each bias's column sum reads dout
 *   gelu       forward read, write; backward read x and dout, write dinp
 *   xent       forward one pass over the logits (online softmax), lse and losses out; backward
 *              rewrites them in place
 *   round      bf16/fp16 on fp32 storage: every stored activation and gradient that its kernel does
 *              not round as it writes (backend.h lists those that do) is read and written once
 *              more (gpt2.c's STORE, or the backend's pass after the matmul attention's cuBLAS
 *              products): the products' input gradients, the logits, the embeddings; and each
 *              forward rounds the weights' working copy
 *   optim      zero_grad writes, the norm reads and AdamW reads p, g, m, v and writes p, m, v
 * With train.recompute the blocks' forward runs twice. FLOPs of the elementwise classes are not
 * counted: they are bound by memory by a factor of 10 or more. */
#include "roofline.h"

#include <math.h>
#include <string.h>

#include "backend.h"
#include "precision.h"

const char *const dt_kclass_names[DT_KC_N] = {"matmul (layers)", "lm_head", "attention", "layernorm", "bias+residual",
                                              "gelu", "embedding", "cross-entropy", "16-bit rounding", "optimizer"};

typedef struct {
  double N, B, T, C, Cl, NHl, hs, Vpl, s, ws;
  double acc; /* bytes of a biased product's forward result: s, or 4 with 16-bit storage (its fp32
               * accumulator, which the epilogue reads back) */
  double fwd; /* forward passes of the blocks per micro-batch: 1, 2 with recompute */
} dims_t;

static void add(dt_kroof_t *r, int k, double flops, double bytes) {
  r->flops[k] += flops;
  r->bytes[k] += bytes;
}

/* inp (M, K) x W (K, Nn), forward `fwd` times writing ob bytes per output, backward once */
static void product(dt_kroof_t *r, int k, const dims_t *d, double M, double K, double Nn, double fwd, double ob) {
  const double f = 2 * M * K * Nn, s = d->s, ws = d->ws;
  add(r, k, fwd * f, fwd * (s * M * K + ws * K * Nn + ob * M * Nn));
  add(r, k, f, s * M * Nn + ws * K * Nn + s * M * K); /* dinp */
  add(r, k, f, s * M * K + s * M * Nn + 8 * K * Nn);  /* dW += */
}

static void attention(dt_kroof_t *r, const dims_t *d, const dt_plan_in_t *in, int act16) {
  const double BH = d->B * d->NHl, TT = d->T * d->T, s = d->s, P = BH * TT, o = d->N * d->Cl, qkv = 3 * o;
  const double lse = 4 * BH * d->T, gemm = 2 * BH * TT * d->hs; /* one (T,T) product over all heads, full */
  const int k = DT_KC_ATTENTION;
  if (!in->flash) {
    add(r, k, d->fwd * 2 * gemm, d->fwd * s * (2 * o + P + 2 * P + P + o + o)); /* q k^T, softmax, att v */
    add(r, k, 4 * gemm, s * (2 * o + P) + 2 * s * (P + 2 * o) + 3 * s * P + s * (P + 2 * o)); /* dAtt, dV, dS, dQ, dK */
  } else if (!in->cudnn || act16) {
    add(r, k, d->fwd * gemm, d->fwd * (s * qkv + s * o + lse));
    add(r, k, 2.5 * gemm, s * qkv + s * o + lse + s * qkv + 2 * lse);
  } else { /* 16-bit copies: to16 reads 4 writes 2 bytes, from16 the reverse */
    add(r, k, d->fwd * gemm, d->fwd * (6 * qkv + 2 * qkv + 2 * o + lse + 6 * o));
    add(r, k, 2.5 * gemm, 6 * (qkv + 2 * o) + 2 * (qkv + 2 * o) + lse + 2 * qkv + 6 * qkv);
  }
}

/* One micro-batch through nl blocks (forward, backward). */
static void blocks(dt_kroof_t *r, const dims_t *d, const dt_plan_in_t *in, int act16, double nl) {
  dt_kroof_t b;
  memset(&b, 0, sizeof b);
  const double N = d->N, C = d->C, Cl = d->Cl, s = d->s, F = d->fwd;
  /* every block product has a bias: with 16-bit storage qkv's and fc's go through cuBLASLt's bias
   * epilogue (2-byte out, no pass of ours), the projections (+ residual) through the fp32 sums */
  const double a = d->acc, lt = act16 ? s : a;
  product(&b, DT_KC_MATMUL, d, N, C, 3 * Cl, F, lt);
  product(&b, DT_KC_MATMUL, d, N, Cl, C, F, a);
  product(&b, DT_KC_MATMUL, d, N, C, 4 * Cl, F, lt);
  product(&b, DT_KC_MATMUL, d, N, 4 * Cl, C, F, a);
  attention(&b, d, in, act16);
  add(&b, DT_KC_LAYERNORM, 0, 2 * F * (2 * s * N * C + 8 * N) + 2 * (6 * s * N * C + 8 * N));
  add(&b, DT_KC_BIAS, 0,
      F * N * ((act16 ? 0 : a + s) * (3 * Cl + 4 * Cl) + 2 * (a + 2 * s) * C) + s * N * (3 * Cl + C + 4 * Cl + C));
  add(&b, DT_KC_GELU, 0, F * 2 * s * N * 4 * Cl + 3 * s * N * 4 * Cl);
  if (!act16 && in->precision != DT_PREC_FP32) { /* STOREs: backward dfch, dtmp x3 */
    const double att = in->flash ? 0 : F * N * Cl + 3 * N * Cl; /* cuBLAS's out and dqkv: a pass in the backend */
    add(&b, DT_KC_ROUND, 0, 8 * (att + 2 * N * C + 5 * N * Cl));
  }
  for (int k = 0; k < DT_KC_N; k++) add(r, k, nl * b.flops[k], nl * b.bytes[k]);
}

void dt_kroof_compute(const dt_plan_t *p, int act_bytes, dt_kroof_t *r) {
  const dt_plan_in_t *in = &p->in;
  const int tp = in->tp > 1 ? in->tp : 1, last = in->pp > 1 ? in->pp - 1 : 0, act16 = act_bytes == 2;
  const int half = act16 || in->precision != DT_PREC_FP32; /* the layers' products on 16-bit tensor cores */
  memset(r, 0, sizeof *r);
  r->act_bytes = act_bytes;
  dims_t d = {.B = in->B, .T = in->T, .C = in->d.C, .Cl = (double)in->d.C / tp, .NHl = (double)in->d.NH / tp,
              .hs = (double)in->d.C / in->d.NH, .Vpl = (double)in->d.Vp / tp, .s = act_bytes, .ws = act16 ? 2 : 4,
              .fwd = in->recompute ? 2 : 1, .acc = act16 ? 4 : act_bytes};
  d.N = d.B * d.T;
  const double N = d.N, C = d.C, s = d.s, m = in->accum > 0 ? in->accum : 1;
  const double Pst = p->stage_params[last]; /* floats of this stage's parameters per tp rank */
  dt_kroof_t mb;                           /* one micro-batch */
  memset(&mb, 0, sizeof mb);
  blocks(&mb, &d, in, act16, p->stage_blocks[last]);
  product(&mb, DT_KC_LMHEAD, &d, N, C, d.Vpl, 1, s); /* no bias: cuBLAS stores the logits */
  add(&mb, DT_KC_LAYERNORM, 0, 2 * s * N * C + 8 * N + 5 * s * N * C + 8 * N); /* ln_f: no dresid */
  add(&mb, DT_KC_XENT, 0, s * N * d.Vpl + 12 * N + 2 * s * N * d.Vpl);
  if (in->pp <= 1) /* the embeddings live on stage 0 */
    add(&mb, DT_KC_EMBED, 0, d.ws * (N * C + d.T * C) + s * N * C + 2 * s * N * C + 8 * (N * C + d.T * C));
  if (!act16 && in->precision != DT_PREC_FP32) /* head (logits; dtmp), encoder, working copy */
    add(&mb, DT_KC_ROUND, 0, 8 * (N * d.Vpl + N * C + (in->pp <= 1 ? N * C : 0) + Pst));
  for (int k = 0; k < DT_KC_N; k++) add(r, k, m * mb.flops[k], m * mb.bytes[k]);
  const int zc = in->zero >= 1 && in->zero < DT_PLAN_ZERO_STAGES ? in->zero : 0;
  const double Popt = zc ? Pst / (in->dp > 0 ? in->dp : 1) : Pst; /* AdamW's and the norm's range */
  add(r, DT_KC_OPTIM, 0, 4 * Pst + 4 * Popt + 28 * Popt);
  if (act16) add(r, DT_KC_ROUND, 0, 6 * Pst); /* the 16-bit working copy, once per step */
  r->unit[DT_KC_MATMUL] = r->unit[DT_KC_LMHEAD] = half ? DT_KU_16 : in->tf32 ? DT_KU_TF32 : DT_KU_FP32;
  /* the attention: cuDNN on tensor cores, our flash kernels on fp32 cores (whatever the storage),
   * the matmul attention's cuBLAS products fp32 or TF32 whatever the precision (a 16-bit matmul
   * attention, not built, on tensor cores) */
  const int fp32 = in->tf32 ? DT_KU_TF32 : DT_KU_FP32;
  r->unit[DT_KC_ATTENTION] = in->cudnn || (act16 && !in->flash) ? DT_KU_16 : in->flash ? DT_KU_FP32 : fp32;
}

static double peak(const dt_gpu_spec_t *g, int unit) {
  return unit == DT_KU_16 ? g->bf16 : unit == DT_KU_TF32 ? g->tf32 : g->fp32;
}

double dt_kroof_time(const dt_kroof_t *r, const dt_gpu_spec_t *g, double *t_class) {
  double t = 0;
  for (int k = 0; k < DT_KC_N; k++) {
    double tk = fmax(r->flops[k] / peak(g, r->unit[k]), r->bytes[k] / g->hbm);
    if (t_class) t_class[k] = tk;
    t += tk;
  }
  return t;
}

void dt_kroof_print(const dt_plan_t *p, FILE *o, const char *prefix) {
  const dt_plan_in_t *in = &p->in;
  const dt_gpu_spec_t *g = &dt_gpu_h100, *h200 = &dt_gpu_h200;
  static const char *unit[3] = {"fp32 cores", "tf32 tensor", "16-bit tensor"};
  static const char *att[3] = {"matmul", "flash", "cudnn"};
  dt_kroof_t r, r16;
  double tk[DT_KC_N];
  const int built = in->store16 ? 2 : 4; /* the other storage is the alternative line's */
  dt_kroof_compute(p, built, &r);
  dt_kroof_compute(p, 6 - built, &r16);
  const double t = dt_kroof_time(&r, g, tk), t16 = dt_kroof_time(&r16, g, NULL);
  const double tokens = (double)in->B * in->T * (in->accum > 0 ? in->accum : 1);
  const double split = (in->tp > 1 ? in->tp : 1) * (in->pp > 1 ? in->pp : 1);
  const double model = dt_model_flops_per_token(&in->d, in->T) * tokens / split;
  const int pp = in->pp > 1;
  dt_plan_line(o, prefix,
               "roofline: kernels: the CUDA backend's kernels by class, one optimizer step of %s (%d blocks%s), "
               "as built: activations stored in %d bytes, train.precision = %s, system.attention = %s, "
               "system.tf32 = %s%s; %s datasheet (fp32 %.0f TF, TF32 %.0f, bf16 %.0f, HBM %.2f TB/s); each class "
               "max(FLOPs/peak, bytes/HBM), the step their sum; a prediction, not measured on a GPU",
               pp ? "the last pipeline stage" : "one rank", p->stage_blocks[pp ? in->pp - 1 : 0],
               pp ? " + the head" : " + embeddings + head", built, dt_precision_name((dt_precision_t)in->precision),
               att[in->cudnn ? 2 : in->flash ? 1 : 0], in->tf32 ? "true" : "false",
               in->recompute ? ", train.recompute = true" : "", g->name, g->fp32 / 1e12, g->tf32 / 1e12,
               g->bf16 / 1e12, g->hbm / 1e12);
  dt_plan_line(o, prefix, "roofline: kernels: %-16s %10s %10s  %-13s %9s  %-7s %6s", "class", "GFLOP", "GB", "runs on",
               "ms", "bound", "share");
  for (int k = 0; k < DT_KC_N; k++) {
    if (r.flops[k] == 0 && r.bytes[k] == 0) continue;
    const int mem = r.bytes[k] / g->hbm >= r.flops[k] / peak(g, r.unit[k]);
    dt_plan_line(o, prefix, "roofline: kernels: %-16s %10.1f %10.2f  %-13s %9.3f  %-7s %5.1f%%", dt_kclass_names[k],
                 r.flops[k] / 1e9, r.bytes[k] / 1e9, r.flops[k] > 0 ? unit[r.unit[k]] : "memory", 1e3 * tk[k],
                 mem ? "memory" : "compute", 100 * tk[k] / t);
  }
  dt_plan_line(o, prefix,
               "roofline: kernels: step %.2f ms: %.4g tokens/s per GPU, %.1f%% of the bf16 dense peak in model "
               "FLOPs (%.4g per step)", 1e3 * t, tokens / t, 100 * model / t / g->bf16, model);
  const int can16 = dt_cuda_store16_built((dt_precision_t)in->precision, in->flash);
  if (built == 4)
    dt_plan_line(o, prefix,
                 "roofline: kernels: with activations stored in 16 bits (%s: no rounding passes, 16-bit products "
                 "and weights): step %.2f ms, %.4g tokens/s per GPU, %.1f%% of the bf16 peak",
                 can16 ? "system.store16 = auto"
                       : "not built for this configuration: it needs bf16/fp16 and system.attention = flash or "
                         "cudnn",
                 1e3 * t16, tokens / t16, 100 * model / t16 / g->bf16);
  else
    dt_plan_line(o, prefix,
                 "roofline: kernels: with float storage instead (system.store16 = off: rounding passes, twice the "
                 "bytes): step %.2f ms, %.4g tokens/s per GPU, %.1f%% of the bf16 peak",
                 1e3 * t16, tokens / t16, 100 * model / t16 / g->bf16);
  const double th = dt_kroof_time(&r, h200, NULL), th16 = dt_kroof_time(&r16, h200, NULL);
  dt_plan_line(o, prefix,
               "roofline: kernels: on an %s (HBM %.1f TB/s, the GPU docs/gpu-runs.md ran on): step %.2f ms as "
               "built, %.2f ms with %s", h200->name, h200->hbm / 1e12, 1e3 * th, 1e3 * th16,
               built == 4 ? "16-bit activations" : "float storage");
}
