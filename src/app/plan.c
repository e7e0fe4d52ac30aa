/* Memory planner and roofline (see plan.h). The model of what dtrain allocates per rank:
 *   params   fp32 master arena (AdamW updates it, checkpoints hold it)          4 B x P
 *   wparams  working copy for bf16/fp16 (forward/backward read it); dtrain emulates 16-bit
 *            storage, so it is fp32 too                                       4 B x P (mixed only)
 *   grads, m, v  fp32 arenas                                                  4 B x P each
 *   activations  dt_gpt2_activation_floats (gpt2.c) with the CPU or the CUDA attention's share, fp32
 *   DDP      all-reduces the gradient arena in place, bucket by bucket: no extra buffer
 * P = the arena of the rank's pipeline stage per tensor-parallel rank. ZeRO over dp (the model
 * the ZeRO work implements): stage 1 divides m, v by dp; stage 2 also the gradients, plus one
 * bucket of staging; stage 3 also the parameters (and working copy), plus full-size working
 * buffers for 2 parameter groups (current + prefetched; a group is the embeddings, one block, or
 * ln_f (+ the tied head)). tp divides the block weights and the vocabulary embedding (Megatron:
 * column/row parallel weights, vocab-parallel wte); layernorms, row-parallel biases and wpe are
 * replicated. pp gives each stage contiguous blocks balanced by parameter count, the embeddings
 * on the first stage, ln_f and (tied) a copy of wte on the last; 1F1B keeps pp - s micro-batches
 * of activations in flight on stage s. */
#include "plan.h"

#include <ctype.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "mesh.h"
#include "pipeline.h"
#include "precision.h"
#include "train.h"

#define GB 1e9
#define GIB 1073741824.0
#define MIB 1048576.0
/* Device memory dtrain does not allocate itself but a CUDA process holds: context, cuBLAS
 * workspace, allocator slack. An assumption (typically 0.3-0.6 GiB), not a measurement. */
#define CUDA_CONTEXT_BYTES (512 * MIB)

/* Datasheet peaks (dense, no sparsity), per GPU:
 *   NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): FP32 19.5 TFLOPS, TF32 156 TFLOPS,
 *   BF16 312 TFLOPS, HBM2e 2,039 GB/s (2.0 TB/s), NVLink 600 GB/s (both directions: 300 GB/s each);
 *   HDR InfiniBand 200 Gb/s = 25 GB/s per GPU with one NIC per GPU (DGX A100).
 *   NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): FP32 67 TFLOPS, TF32 495 (989 with
 *   sparsity), BF16 989 TFLOPS (1,979 with sparsity), HBM3 3.35 TB/s, NVLink 900 GB/s (450 GB/s
 *   each direction); NDR InfiniBand 400 Gb/s = 50 GB/s per GPU (DGX H100). 8 GPUs per node. */
const dt_gpu_spec_t dt_gpu_a100 = {"A100-SXM4-80GB", 19.5e12, 156e12, 312e12, 2.0e12, 300e9, 25e9, 8};
const dt_gpu_spec_t dt_gpu_h100 = {"H100-SXM5-80GB", 67e12, 495e12, 989e12, 3.35e12, 450e9, 50e9, 8};

/* The CPU backend's activation arena for a stage (gpt2.c carves it, the CPU attention's share
 * sized by backend_cpu.c): exactly what dt_gpt2_init allocates there. */
static size_t cpu_activation_floats(const dt_dims_t *d, int tp, int nl, int last, int slots, int B, int T, int nthr,
                                    int recompute) {
  size_t state = 0, scratch = 0;
  dt_cpu_attention_floats(B, T, d->NH / tp, nthr, &state, &scratch);
  return dt_gpt2_activation_floats(d, tp, nl, last, slots, B, T, recompute, state, scratch);
}

size_t dt_plan_gpu_activation_floats(const dt_dims_t *d, int B, int T, int recompute, int flash) {
  size_t state = 0, scratch = 0;
  dt_cuda_attention_floats(B, T, d->NH, flash, &state, &scratch);
  return dt_gpt2_activation_floats(d, 1, d->L, 1, 1, B, T, recompute, state, scratch);
}

/* parallel.zero when this build's config table has it (the ZeRO work adds it), else -1. */
static int configured_zero(const dt_config_t *cfg) {
  for (int i = 0; dt_config_keys[i].key; i++) {
    const dt_config_key_t *k = &dt_config_keys[i];
    if (strcmp(k->section, "parallel") || strcmp(k->key, "zero")) continue;
    const char *field = (const char *)cfg + k->offset;
    int z = -1;
    if (k->type == DT_KEY_INT) z = *(const int *)field;
    if (k->type == DT_KEY_ENUM || k->type == DT_KEY_STR) z = isdigit((unsigned char)field[0]) ? atoi(field) : -1;
    return z >= 0 && z < DT_PLAN_ZERO_STAGES ? z : -1;
  }
  return -1;
}

dt_status_t dt_plan_input(dt_plan_in_t *in, const dt_config_t *cfg, const char *name, int world, int threads,
                          double device_mem) {
  memset(in, 0, sizeof *in);
  in->d = dt_dims_from_config(cfg);
  in->B = cfg->micro_batch;
  in->T = cfg->seq_len;
  in->tp = cfg->tp;
  in->pp = cfg->pp;
  if (world <= 0) world = (cfg->dp > 0 ? cfg->dp : 1) * cfg->tp * cfg->pp;
  DT_TRY(dt_train_batch_plan(cfg, name, world, &in->dp, &in->accum));
  dt_precision_t prec = DT_PREC_FP32;
  if (dt_precision_parse(cfg->precision, &prec) != 0)
    return DT_ERR(DT_ERR_CONFIG, "%s: train.precision: '%s' is not one of fp32|bf16|fp16", name, cfg->precision);
  in->precision = (int)prec;
  in->bucket_mb = cfg->bucket_mb;
  in->threads = threads > 0 ? threads : 1;
  in->zero = configured_zero(cfg);
  in->pp_balance = (int)dt_pp_balance_of(cfg);
  in->recompute = cfg->recompute;
  in->flash = !strcmp(cfg->attention, "flash");
  in->device_mem = device_mem;
  return DT_OK;
}

/* Pipeline stages: dt_pp_split over dt_pp_weights, as dt_layout_init_mp splits the model (by
 * compute: the split from FLOP weights, the stage sizes still in parameters). */
static void split_stages(dt_plan_t *p, double emb, double blk, double head) {
  const int pp = p->in.pp;
  double we = emb, wb = blk, wh = head;
  if (p->in.pp_balance == DT_PP_BALANCE_COMPUTE) dt_pp_weights(p->in.d, p->in.tp, DT_PP_BALANCE_COMPUTE, &we, &wb, &wh);
  dt_pp_split(p->in.d.L, pp, we, wb, wh, p->stage_blocks);
  for (int s = 0; s < pp; s++)
    p->stage_params[s] = (s == 0 ? emb : 0) + (s == pp - 1 ? head : 0) + p->stage_blocks[s] * blk;
}

static double ceil_div(double x, int n) { return ceil(x / n); }

dt_status_t dt_plan_compute(dt_plan_t *p, const dt_plan_in_t *in) {
  memset(p, 0, sizeof *p);
  p->in = *in;
  const dt_dims_t *d = &in->d;
  const int tp = in->tp, pp = in->pp, dp = in->dp, L = d->L;
  const double C = d->C, bt = (double)in->B * in->T;
  if (pp < 1 || pp > L || pp > DT_PLAN_MAX_PP)
    return DT_ERR(DT_ERR_CONFIG, "plan: parallel.pp = %d: must be between 1 and n_layer = %d", pp, L);
  if (tp < 1 || d->NH % tp != 0)
    return DT_ERR(DT_ERR_CONFIG, "plan: parallel.tp = %d must divide n_head = %d (heads are split)", tp, d->NH);
  if (in->B < 1 || in->T < 1 || in->T > d->T || dp < 1 || in->accum < 1)
    return DT_ERR(DT_ERR_CONFIG, "plan: bad micro-batch B=%d T=%d dp=%d accum=%d", in->B, in->T, dp, in->accum);
  dt_layout_t lay;
  DT_TRY(dt_layout_init(&lay, *d));
  p->n_arena = lay.n_params;
  p->n_true = lay.n_params_true;
  /* parameter groups per tp rank: from the tp shard layout the trainer builds (alignment
   * included, so the stage split is the trainer's) when tp divides the padded vocab; else (a
   * layout dtrain cannot run, planned anyway) from the shapes: wte (Vp, C)/tp + wpe (T, C);
   * block (12C^2 + 7C)/tp sharded + 6C replicated; ln_f 2C */
  double emb, blk, head, wte;
  if (d->Vp % tp == 0) {
    DT_TRY(dt_layout_pp_groups(*d, tp, &emb, &blk, &head, &wte));
  } else {
    emb = (double)d->Vp * C / tp + (double)d->T * C;
    blk = (12 * C * C + 7 * C) / tp + 6 * C;
    head = 2 * C;
    wte = (double)d->Vp * C / tp;
  }
  if (pp > 1) head += wte; /* tied lm_head: the last stage holds a copy of wte */
  dt_layout_free(&lay);
  split_stages(p, emb, blk, head);
  p->max_group = fmax(emb, fmax(blk, head));
  p->group_emb = emb, p->group_blk = blk, p->group_head = head;

  /* activations (floats) of a stage: the backend's own count for tp = pp = 1; otherwise
   * fixed (embedding/head/scratch, counted on every stage: an upper bound) + per-layer part,
   * with the tp-sharded tensors (qkv, atty, fch, fch_gelu, attention lse/probabilities, logits)
   * divided by tp and pp - s micro-batches in flight (1F1B) */
  dt_dims_t d0 = *d, d1 = *d;
  d0.L = 0;
  d1.L = 1;
  const double c_fix = (double)cpu_activation_floats(&d0, 1, 0, 1, 1, in->B, in->T, in->threads, 0);
  const double c_per = (double)cpu_activation_floats(&d1, 1, 1, 1, 1, in->B, in->T, in->threads, 0) - c_fix;
  const double g_fix = (double)dt_plan_gpu_activation_floats(&d0, in->B, in->T, 0, in->flash);
  const double g_per = (double)dt_plan_gpu_activation_floats(&d1, in->B, in->T, 0, in->flash) - g_fix;
  const double shard = 1.0 - 1.0 / tp, logits_sh = bt * d->Vp * shard; /* vocab-parallel logits */
  const double c_per_tp = c_per - bt * (12 * C + d->NH) * shard;
  const double att_rows = (double)in->B * d->NH * in->T * (in->flash ? 1 : in->T); /* a block's attention state */
  const double g_per_tp = g_per - (bt * 12 * C + att_rows) * shard;
  const int mixed = in->precision != DT_PREC_FP32;
  const double ints = 2 * bt * sizeof(int); /* inputs + targets */

  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++) {
    dt_plan_zero_t best = {0};
    best.total_gpu = -1;
    for (int s = 0; s < pp; s++) {
      const double P = p->stage_params[s], n_l = p->stage_blocks[s];
      const int inflight = pp == 1 ? 1 : (pp - s < in->accum ? pp - s : in->accum);
      dt_plan_zero_t r = {.pp_stage = s};
      r.params = 4 * (z >= 3 ? ceil_div(P, dp) : P);
      r.wparams = mixed ? r.params : 0;
      r.grads = 4 * (z >= 2 ? ceil_div(P, dp) : P);
      if (z == 2 && pp > 1 && (s == 0 || s == pp - 1)) /* ZeRO-2 x pp keeps wte's gradient whole (train.c) */
        r.grads = 4 * (ceil_div(P - wte, dp) + wte);
      r.m = r.v = 4 * (z >= 1 ? ceil_div(P, dp) : P);
      /* ZeRO-3 (zero.c): the embeddings and ln_f gathered for the whole step, plus the running
       * block and the prefetched one; this rank's own part of them is already in params / dp */
      r.gather = z >= 3 ? 4 * (p->group_emb + p->group_head + 2 * p->group_blk) * (1.0 - 1.0 / dp) : 0;
      /* DDP: MPI's temporaries of the 2 bucket all-reduces in flight (ddp.c); ZeRO: its staging
       * bucket (zero.h) + the temporaries of the collective on it (measured at 124M, dp=4) */
      r.comm = dp > 1 ? (z >= 1 ? 3 : 2) * in->bucket_mb * MIB : 0; /* dp = 1: no collectives */
      /* CPU: what the backend allocates for this stage (its blocks, the loss on the last stage,
       * `inflight` micro-batches of activations), without and with recomputation (train.recompute:
       * each block's output kept, one block's activations recomputed); a tp that does not divide
       * Vp cannot run: estimated like the GPU (fixed part on every stage, an upper bound) */
      double keep, rc;
      if (d->Vp % tp == 0) {
        keep = (double)cpu_activation_floats(d, tp, (int)n_l, s == pp - 1, inflight, in->B, in->T, in->threads, 0);
        rc = (double)cpu_activation_floats(d, tp, (int)n_l, s == pp - 1, inflight, in->B, in->T, in->threads, 1);
      } else {
        keep = c_fix - logits_sh + inflight * n_l * c_per_tp;
        rc = keep - inflight * n_l * c_per_tp + inflight * n_l * bt * C + c_per_tp;
      }
      r.act_cpu = 4 * (in->recompute ? rc : keep);
      r.act_cpu_alt = 4 * (in->recompute ? keep : rc);
      /* GPU: the model's own count for tp = pp = 1; else, like the CPU's, recomputation keeps each
       * block's output (B,T,C) and one block's activations */
      double gkeep, grc;
      if (tp == 1 && pp == 1) {
        gkeep = 4 * (double)dt_plan_gpu_activation_floats(d, in->B, in->T, 0, in->flash);
        grc = 4 * (double)dt_plan_gpu_activation_floats(d, in->B, in->T, 1, in->flash);
      } else {
        gkeep = 4 * (g_fix - logits_sh + inflight * n_l * g_per_tp); /* logits (dlogits in place) */
        grc = gkeep - 4 * inflight * n_l * g_per_tp + 4 * (inflight * n_l * bt * C + g_per_tp);
      }
      r.act_gpu = in->recompute ? grc : gkeep;
      r.act_gpu_rc = in->recompute ? gkeep : grc;
      r.act_cpu += inflight * ints; /* the backend's copies of each micro-batch in flight */
      r.act_gpu += ints;
      r.act_cpu_alt += inflight * ints;
      r.act_gpu_rc += ints;
      /* CPU: the trainer's (B,T) batch (the initial weights are made and broadcast in the
       * parameter arena itself); pp > 1: its send and receive buffers of (B,T,C) */
      r.work_cpu = ints + (pp > 1 ? 2 * 4 * bt * C : 0);
      r.work_gpu = CUDA_CONTEXT_BYTES;
      double state = r.params + r.wparams + r.grads + r.m + r.v + r.gather + r.comm;
      /* the device keeps whole parameter and gradient arenas under ZeRO-2/3 (zero.h: its drops
       * clear, they free nothing; the gathered blocks land in the whole arena) */
      double state_gpu = 4 * P + (mixed ? 4 * P : 0) + 4 * P + r.m + r.v + r.comm;
      r.total_cpu = state + r.act_cpu + r.work_cpu;
      r.total_gpu = state_gpu + r.act_gpu + r.work_gpu;
      r.total_gpu_rc = state_gpu + r.act_gpu_rc + r.work_gpu;
      r.host_gpu = r.params + ints; /* host arena's params part, inputs + targets */
      r.host_gpu_ckpt = r.host_gpu + r.m + r.v;
      if (r.total_gpu > best.total_gpu) best = r;
      if (z == (in->zero >= 0 && in->zero < DT_PLAN_ZERO_STAGES ? in->zero : 0)) p->stage[s] = r;
    }
    p->z[z] = best;
  }

  /* roofline of the configured ZeRO stage's worst rank, per optimizer step */
  const int zc = in->zero >= 0 && in->zero < DT_PLAN_ZERO_STAGES ? in->zero : 0;
  const int s = p->z[zc].pp_stage;
  const double P = p->stage_params[s], acc = in->accum;
  /* activations one micro-batch writes and reads (not the pp - s kept in flight) */
  const double A = tp == 1 && pp == 1 ? p->z[zc].act_gpu
                                      : 4 * (g_fix - logits_sh + p->stage_blocks[s] * g_per_tp) + ints;
  dt_plan_roof_t *f = &p->roof;
  f->flops = dt_model_flops_per_token(d, in->T) * bt * acc / ((double)tp * pp);
  f->w_read = acc * 2 * 4 * P + (mixed ? 8 * P : 0);  /* fwd + bwd read W; rounding copy */
  f->w_read16 = acc * 2 * 2 * P + 6 * P;
  f->g_rw = acc * 2 * 4 * P + 2 * 4 * P;               /* += per micro-step; zero_grad, norm */
  f->act_rw = acc * 2 * A;                             /* written forward, read backward */
  f->act_rw16 = f->act_rw / 2;
  f->opt_rw = 7 * 4 * (zc >= 1 ? ceil_div(P, dp) : P); /* AdamW reads p,g,m,v, writes p,m,v */
  const double G = 4 * P, ring = dp > 1 ? (double)(dp - 1) / dp : 0;
  f->dp_bytes[0] = 2 * ring * G;       /* all-reduce */
  f->dp_bytes[1] = 2 * ring * G;       /* reduce-scatter grads + all-gather params */
  f->dp_bytes[2] = 2 * ring * G;
  f->dp_bytes[3] = 3 * ring * G;       /* + all-gather params again for backward */
  f->tp_bytes = tp > 1 ? acc * p->stage_blocks[s] * 4 * 2.0 * (tp - 1) / tp * bt * C * 4 : 0;
  f->pp_bytes = pp > 1 ? acc * 2 * bt * C * 4 : 0;
  /* The step's length over the average stage's compute: the 1F1B schedule simulated with each
   * stage's training FLOPs (its blocks, the lm_head on the last; dt_pp_weights) as its time,
   * backward twice forward. Equal stages give 1 + (pp - 1)/accum; a split by parameters leaves
   * the lm_head's cost on the last stage and the factor shows it. */
  f->bubble = 1 + (pp - 1) / acc;
  if (pp > 1 && pp <= DT_PLAN_MAX_PP) {
    double we, wb, wh, tf[DT_PLAN_MAX_PP], tb[DT_PLAN_MAX_PP], mean = 0;
    dt_pp_weights(*d, tp, DT_PP_BALANCE_COMPUTE, &we, &wb, &wh);
    for (int k = 0; k < pp; k++) {
      double w = p->stage_blocks[k] * wb + (k == 0 ? we : 0) + (k == pp - 1 ? wh : 0);
      tf[k] = w / 3, tb[k] = 2 * w / 3, mean += w / pp;
    }
    p->stage_flops_share = 0;
    for (int k = 0; k < pp; k++) p->stage_flops_share = fmax(p->stage_flops_share, (tf[k] + tb[k]) / mean);
    double T = dt_pp_simulate(pp, in->accum, tf, tb, NULL);
    if (T > 0) f->bubble = T / (acc * mean);
  }
  return DT_OK;
}

double dt_plan_step_time(const dt_plan_t *p, const dt_gpu_spec_t *g, int math, double *t_flops, double *t_mem,
                         double *t_comm) {
  const dt_plan_roof_t *f = &p->roof;
  const int zc = p->in.zero >= 0 && p->in.zero < DT_PLAN_ZERO_STAGES ? p->in.zero : 0;
  const int world = p->in.dp * p->in.tp * p->in.pp;
  double peak = math == 0 ? g->fp32 : math == 1 ? g->tf32 : g->bf16;
  double bytes = math == 2 ? f->w_read16 + f->g_rw + f->act_rw16 + f->opt_rw : f->w_read + f->g_rw + f->act_rw + f->opt_rw;
  double tf = f->flops / peak, tm = bytes / g->hbm;
  double inter = world <= g->gpus_per_node ? g->nvlink : g->net; /* dp/pp span nodes beyond one */
  double act_scale = math == 2 ? 0.5 : 1.0;
  double tc = f->dp_bytes[zc] / inter + act_scale * (f->tp_bytes / g->nvlink + f->pp_bytes / inter);
  if (t_flops) *t_flops = tf;
  if (t_mem) *t_mem = tm;
  if (t_comm) *t_comm = tc;
  return fmax(tf, tm) * f->bubble + tc;
}

/* ---- printing ------------------------------------------------------------------------------ */

static void pl(FILE *o, const char *prefix, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pl(FILE *o, const char *prefix, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(prefix, o);
  vfprintf(o, fmt, ap);
  fputc('\n', o);
  va_end(ap);
}

static void row(FILE *o, const char *prefix, const char *label, const dt_plan_t *p, size_t off) {
  char line[256];
  int n = snprintf(line, sizeof line, "  %-44s", label);
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
    n += snprintf(line + n, sizeof line - (size_t)n, " %9.3f", *(const double *)((const char *)&p->z[z] + off) / GB);
  pl(o, prefix, "%s", line);
}

/* n with thousands separators: 1,557,611,200 */
static const char *commas(size_t n, char buf[32]) {
  char raw[32];
  int len = snprintf(raw, sizeof raw, "%zu", n), k = 0;
  for (int i = 0; i < len; i++) {
    if (i > 0 && (len - i) % 3 == 0) buf[k++] = ',';
    buf[k++] = raw[i];
  }
  buf[k] = '\0';
  return buf;
}

#define ROW(label, field) row(o, prefix, label, p, offsetof(dt_plan_zero_t, field))

void dt_plan_print(const dt_plan_t *p, FILE *o, const char *prefix) {
  const dt_plan_in_t *in = &p->in;
  const dt_dims_t *d = &in->d;
  const int dp = in->dp, world = in->dp * in->tp * in->pp, mixed = in->precision != DT_PREC_FP32;
  const char *prec = dt_precision_name((dt_precision_t)in->precision);
  const double n = (double)p->n_arena;
  char b1[32], b2[32];
  pl(o, prefix, "plan: GPT-2 L=%d NH=%d C=%d V=%d (padded %d) T=%d: %s parameters, %s floats per arena "
     "(padded vocabulary rows and %d-float alignment)", d->L, d->NH, d->C, d->V, d->Vp, d->T, commas(p->n_true, b1),
     commas(p->n_arena, b2), DT_ALIGN);
  pl(o, prefix, "plan: world %d = dp %d x tp %d x pp %d; micro_batch %d x seq_len %d x grad_accum %d; precision %s; "
     "bucket %d MiB; %d CPU threads", world, dp, in->tp, in->pp, in->B, in->T, in->accum, prec, in->bucket_mb,
     in->threads);
  pl(o, prefix, "plan: units: GB = 1e9 bytes, GiB = 2^30 bytes");
  pl(o, prefix, "plan: whole model on one rank (%.4g floats; 4 B each in fp32):", n);
  pl(o, prefix, "  parameters (fp32)        %.4g x 4 B  = %7.2f GB", n, 4 * n / GB);
  pl(o, prefix, "  gradients (fp32)         %.4g x 4 B  = %7.2f GB", n, 4 * n / GB);
  pl(o, prefix, "  AdamW m + v (fp32)       %.4g x 8 B  = %7.2f GB", n, 8 * n / GB);
  pl(o, prefix, "  mixed precision: fp32 master + m + v = %.4g x 12 B = %.2f GB, plus a 16-bit working copy "
     "%.4g x 2 B = %.2f GB", n, 12 * n / GB, n, 2 * n / GB);
  pl(o, prefix, "    (dtrain emulates bf16/fp16 storage in fp32: its working copy is %.4g x 4 B = %.2f GB)", n,
     4 * n / GB);
  pl(o, prefix, "  ZeRO over dp=%d, per rank: stage 1 shards m + v: %.2f / %d = %.2f GB; stage 2 also the gradients: "
     "%.2f / %d = %.2f GB; stage 3 also the parameters: %.2f / %d = %.2f GB", dp, 8 * n / GB, dp,
     8 * ceil_div(n, dp) / GB, 4 * n / GB, dp, 4 * ceil_div(n, dp) / GB, 4 * n / GB, dp, 4 * ceil_div(n, dp) / GB);
  if (in->pp > 1) {
    char line[1024];
    int k = 0;
    for (int s = 0; s < in->pp && k < (int)sizeof line - 64; s++)
      k += snprintf(line + k, sizeof line - (size_t)k, " %d:%d blk/%.4g", s, p->stage_blocks[s], p->stage_params[s]);
    pl(o, prefix, "plan: pipeline stages (blocks/parameters per tp rank):%s", line);
  }
  pl(o, prefix, "plan: per rank, GB (worst pipeline stage)       %9s %9s %9s %9s", "zero0", "zero1", "zero2", "zero3");
  ROW("parameters (fp32 master)", params);
  if (mixed) ROW("working copy (emulated 16-bit, stored fp32)", wparams);
  ROW("gradients (fp32)", grads);
  ROW("AdamW m (fp32)", m);
  ROW("AdamW v (fp32)", v);
  ROW("zero3 gathered params (emb+ln_f+2 blocks)", gather);
  ROW("comm buffers (MPI temporaries, ZeRO staging)", comm);
  ROW("activations, CPU backend", act_cpu);
  ROW(in->flash ? "activations, CUDA backend (flash attention)" : "activations, CUDA backend (keeps B*NH*T*T)",
      act_gpu);
  ROW("workspace CPU (token batch)", work_cpu);
  ROW("workspace GPU (context+cuBLAS, assumed)", work_gpu);
  ROW("total host RSS, CPU backend", total_cpu);
  ROW("total device, CUDA backend", total_gpu);
  char line[256];
  int k = snprintf(line, sizeof line, "  %-44s", "total device, CUDA backend, GiB");
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
    k += snprintf(line + k, sizeof line - (size_t)k, " %9.3f", p->z[z].total_gpu / GIB);
  pl(o, prefix, "%s", line);
  char lab[64];
  snprintf(lab, sizeof lab, "fits %.4g GiB device memory?", in->device_mem / GIB);
  k = snprintf(line, sizeof line, "  %-44s", lab);
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
    k += snprintf(line + k, sizeof line - (size_t)k, " %9s", p->z[z].total_gpu <= in->device_mem ? "fits" : "NO");
  pl(o, prefix, "%s", line);
  ROW(in->recompute ? "activations, CPU, without recompute" : "activations, CPU, train.recompute = true", act_cpu_alt);
  ROW(in->recompute ? "activations, GPU, without recompute" : "activations, GPU, train.recompute = true", act_gpu_rc);
  ROW(in->recompute ? "device total without recompute" : "device total with recompute", total_gpu_rc);
  k = snprintf(line, sizeof line, "  %-44s", in->recompute ? "fits without recompute?" : "fits with recompute?");
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
    k += snprintf(line + k, sizeof line - (size_t)k, " %9s", p->z[z].total_gpu_rc <= in->device_mem ? "fits" : "NO");
  pl(o, prefix, "%s", line);
  if (in->pp > 1) {
    k = snprintf(line, sizeof line, "  %-44s", "worst pipeline stage");
    for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
      k += snprintf(line + k, sizeof line - (size_t)k, " %9d", p->z[z].pp_stage);
    pl(o, prefix, "%s", line);
  }
  if (in->pp > 1) { /* the per-rank table: ranks of one stage differ only in their tp shard */
    const int zc = in->zero >= 0 && in->zero < DT_PLAN_ZERO_STAGES ? in->zero : 0;
    pl(o, prefix, "plan: per pipeline stage (zero%d), GB per rank: %5s %6s %9s %9s %9s %9s %9s %9s %9s", zc, "stage",
       "blocks", "params", "grads", "adam m+v", "act cpu", "total cpu", "act gpu", "total gpu");
    for (int s = 0; s < in->pp && s < 64; s++) {
      const dt_plan_zero_t *r = &p->stage[s];
      pl(o, prefix, "plan: %*s %5d %6d %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f", 32, "", s, p->stage_blocks[s],
         (r->params + r->wparams) / GB, r->grads / GB, (r->m + r->v) / GB, r->act_cpu / GB, r->total_cpu / GB,
         r->act_gpu / GB, r->total_gpu / GB);
    }
    if (in->pp > 64) pl(o, prefix, "plan: (%d more stages)", in->pp - 64);
  }
  pl(o, prefix, "plan: host memory with the CUDA backend (not in the device totals): a copy of the parameters %.3f GB "
     "(initial weights, checkpoint staging), + m, v %.3f GB once a checkpoint is written or read", 4 * n / GB,
     8 * n / GB);
  pl(o, prefix, "plan: the CUDA backend runs ZeRO-2 and -3 over whole parameter and gradient arenas (the same "
     "updates and communication, not yet their memory saving): its device rows count them whole");
  if (in->zero >= 0)
    pl(o, prefix, "plan: configured parallel.zero = %d", in->zero);
  else
    pl(o, prefix, "plan: ZeRO is not in this build (no parallel.zero): stages 1-3 are what it would need");
  pl(o, prefix, "plan: train.recompute = %s: both backends keep each block's output and recompute one block's "
     "activations in backward", in->recompute ? "true" : "false");

  /* roofline */
  const dt_plan_roof_t *f = &p->roof;
  const int zc = in->zero >= 0 && in->zero < DT_PLAN_ZERO_STAGES ? in->zero : 0;
  const double tokens = (double)in->B * in->T * in->accum * dp;
  pl(o, prefix, "roofline: per rank per optimizer step (zero%d, worst rank; GPU datasheet peaks, never measured on a "
     "GPU)", zc);
  pl(o, prefix, "roofline: FLOPs %.4g = %.4g per token (dt_model_flops_per_token) x %d tokens / (tp %d x pp %d)", f->flops,
     dt_model_flops_per_token(d, in->T), in->B * in->T * in->accum, in->tp, in->pp);
  pl(o, prefix, "roofline: HBM bytes (4 B storage): weights read %.3g GB, gradients r/w %.3g GB, activations w+r %.3g GB, "
     "optimizer r/w %.3g GB", f->w_read / GB, f->g_rw / GB, f->act_rw / GB, f->opt_rw / GB);
  pl(o, prefix, "roofline: communication sent per rank: dp gradients zero0 %.3g GB (all-reduce 2(n-1)/n), zero1-2 %.3g "
     "GB (reduce-scatter + all-gather), zero3 %.3g GB (3(n-1)/n); tp %.3g GB; pp %.3g GB", f->dp_bytes[0] / GB,
     f->dp_bytes[1] / GB, f->dp_bytes[3] / GB, f->tp_bytes / GB, f->pp_bytes / GB);
  pl(o, prefix, "roofline: time = max(FLOPs/peak, bytes/HBM) x bubble %.3f + comm (no overlap); links: NVLink inside a "
     "node of 8 GPUs, InfiniBand (1 NIC per GPU) beyond", f->bubble);
  if (in->pp > 1)
    pl(o, prefix, "roofline: bubble: 1F1B over %d stages x %d micro-batches simulated with each stage's FLOPs: %.3f "
       "(equal stages: 1 + (pp-1)/m = %.3f; the busiest stage does %.2fx the mean)", in->pp, in->accum, f->bubble,
       1.0 + (in->pp - 1.0) / in->accum, p->stage_flops_share);
  pl(o, prefix, "roofline: %-15s %-5s %9s %9s %9s %9s %9s %12s  %s", "gpu", "math", "peak TF", "compute s", "memory s",
     "comm s", "step s", "tokens/s", "bound");
  const dt_gpu_spec_t *gs[2] = {&dt_gpu_a100, &dt_gpu_h100};
  static const char *mname[3] = {"fp32", "tf32", "bf16"};
  for (int g = 0; g < 2; g++)
    for (int m = 0; m < 3; m++) {
      double tf, tm, tc, t = dt_plan_step_time(p, gs[g], m, &tf, &tm, &tc);
      double peak = m == 0 ? gs[g]->fp32 : m == 1 ? gs[g]->tf32 : gs[g]->bf16;
      const char *bound = tc > fmax(tf, tm) ? "communication" : tf >= tm ? "compute" : "memory";
      pl(o, prefix, "roofline: %-15s %-5s %9.1f %9.4f %9.4f %9.4f %9.4f %12.4g  %s%s", gs[g]->name, mname[m], peak / 1e12,
         tf, tm, tc, t, tokens / t, bound,
         m == 0 ? " (dtrain's CUDA path, system.tf32 = false: cuBLAS SGEMM, fp32 storage)"
         : m == 2 ? " (needs 2-byte storage + tensor cores: not implemented)"
                  : " (system.tf32 = true: TF32 matmuls, fp32 storage)");
    }
}

double dt_plan_parse_bytes(const char *s) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0) || !isfinite(v)) return -1;
  static const struct {
    const char *suf;
    double mul;
  } u[] = {{"", 1},         {"B", 1},          {"K", 1024.0},      {"KiB", 1024.0},   {"KB", 1e3},
           {"M", MIB},      {"MiB", MIB},      {"MB", 1e6},        {"G", GIB},        {"GiB", GIB},
           {"GB", 1e9},     {"T", GIB * 1024}, {"TiB", GIB * 1024}, {"TB", 1e12}};
  for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
    if (!strcmp(end, u[i].suf)) return v * u[i].mul;
  return -1;
}

/* A "VmXXX:   123 kB" field of /proc/self/status in bytes, -1 if unknown. */
static double proc_status_bytes(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kb = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, n) && line[n] == ':') kb = strtod(line + n + 1, NULL);
  fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

double dt_plan_peak_rss(void) { return proc_status_bytes("VmHWM"); }

static double baseline_rss = -1;
void dt_plan_note_baseline(void) { baseline_rss = proc_status_bytes("VmRSS"); }

static int plan_for(dt_plan_t *p, const dt_config_t *cfg, const char *name, int world, int threads) {
  dt_plan_in_t in;
  if (dt_plan_input(&in, cfg, name, world, threads, 80 * GIB) != DT_OK || dt_plan_compute(p, &in) != DT_OK) {
    dt_err_clear();
    return -1;
  }
  return 0;
}

void dt_plan_print_run(const dt_config_t *cfg, const char *name, int world, int threads, FILE *out) {
  static dt_plan_t p;
  if (plan_for(&p, cfg, name, world, threads) == 0) dt_plan_print(&p, out, "# ");
}

void dt_plan_print_rss(const dt_config_t *cfg, const char *name, int world, int threads, int device, int ckpt,
                       FILE *out) {
  static dt_plan_t p;
  double rss = dt_plan_peak_rss();
  if (rss < 0) return;
  int z = 0;
  if (plan_for(&p, cfg, name, world, threads) == 0) z = p.in.zero >= 0 && p.in.zero < DT_PLAN_ZERO_STAGES ? p.in.zero : 0;
  const dt_plan_zero_t *r = &p.z[z];
  double plan = !device ? r->total_cpu : ckpt ? r->host_gpu_ckpt : r->host_gpu;
  const char *what = !device ? "CPU backend" : ckpt ? "CUDA backend, host copies of params, m, v" :
                                                      "CUDA backend, host copy of params, no checkpoint yet";
  fprintf(out, "# memory: rank 0 peak RSS (VmHWM) %.1f MiB; planned host total (%s, zero%d) %.1f MiB (%+.1f%%)",
          rss / MIB, what, z, plan / MIB, 100 * (plan - rss) / rss);
  if (baseline_rss >= 0)
    fprintf(out, "; + %.1f MiB resident before the model (libraries, MPI, CUDA runtime) = %.1f MiB (%+.1f%%)",
            baseline_rss / MIB, (plan + baseline_rss) / MIB, 100 * (plan + baseline_rss - rss) / rss);
  fputc('\n', out);
}

void dt_plan_print_device(const dt_config_t *cfg, const char *name, int world, int threads, double used, FILE *out) {
  static dt_plan_t p;
  int z = 0;
  if (plan_for(&p, cfg, name, world, threads) != 0) return;
  z = p.in.zero >= 0 && p.in.zero < DT_PLAN_ZERO_STAGES ? p.in.zero : 0;
  double plan = p.z[z].total_gpu;
  fprintf(out, "# memory: rank 0 device memory in use %.1f MiB (cudaMemGetInfo: context and library workspaces "
          "included); planned device total (CUDA backend, zero%d) %.1f MiB (%+.1f%%)\n",
          used / MIB, z, plan / MIB, used > 0 ? 100 * (plan - used) / used : 0.0);
}

/* ---- `dtrain plan` ---------------------------------------------------------------------------- */

static int usage(FILE *out, int code) {
  fprintf(out,
          "usage: dtrain plan CONFIG.ini [section.key=value ...] [--world N] [--device-mem 80GiB]\n"
          "Per-rank memory of the configured model and layout for ZeRO stages 0-3 (parameters, working\n"
          "copy, gradients, AdamW moments, activations of the CPU and CUDA backends, buffers), whether it\n"
          "fits --device-mem (default 80GiB; suffixes B K M G T = powers of 1024, KB MB GB TB = of 1000,\n"
          "KiB MiB GiB TiB), and a datasheet roofline of one step on A100 and H100. --world defaults to\n"
          "parallel.dp x tp x pp (dp = 0 read as 1).\n");
  return code;
}

int dt_plan_main(int argc, char **argv) {
  const char *cfg_path = NULL;
  int world = 0;
  double mem = 80 * GIB;
  char *over[256];
  int n_over = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout, 0);
    if (!strcmp(argv[i], "--world") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 1 << 24) {
        fprintf(stderr, "dtrain plan: --world: '%s' is not a positive integer\n", argv[i]);
        return 2;
      }
      world = (int)v;
    } else if (!strcmp(argv[i], "--device-mem") && i + 1 < argc) {
      mem = dt_plan_parse_bytes(argv[++i]);
      if (mem <= 0) {
        fprintf(stderr, "dtrain plan: --device-mem: '%s' is not a size like 80GiB, 40GB or 8e10\n", argv[i]);
        return 2;
      }
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "dtrain plan: unknown or incomplete option '%s'\n", argv[i]);
      return usage(stderr, 2);
    } else if (!cfg_path) {
      cfg_path = argv[i];
    } else if (n_over < 256) {
      over[n_over++] = argv[i];
    } else {
      fprintf(stderr, "dtrain plan: more than 256 overrides\n");
      return 2;
    }
  }
  if (!cfg_path) return usage(stderr, 2);
  dt_config_t cfg;
  dt_config_defaults(&cfg);
  dt_status_t st = dt_config_load(&cfg, cfg_path);
  for (int i = 0; st == DT_OK && i < n_over; i++) st = dt_config_override(&cfg, over[i]);
  if (st == DT_OK) st = dt_cli_gpt2_only(&cfg, cfg_path, "plan");
  if (st == DT_OK) { /* layouts dtrain cannot run (tp not dividing the vocab, ...) can still be planned */
    int tp = cfg.tp, pp = cfg.pp;
    cfg.tp = cfg.pp = 1;
    st = dt_config_validate(&cfg, cfg_path);
    cfg.tp = tp;
    cfg.pp = pp;
  }
  const char *env = getenv("SLURM_CPUS_PER_TASK");
  int threads = cfg.threads > 0 ? cfg.threads : env && atoi(env) > 0 ? atoi(env) : omp_get_max_threads();
  dt_plan_in_t in;
  static dt_plan_t p;
  if (st == DT_OK) st = dt_plan_input(&in, &cfg, cfg_path, world, threads, mem);
  if (st == DT_OK) st = dt_plan_compute(&p, &in);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain plan: %s\n", dt_err_msg());
    return 2;
  }
  printf("plan: %s\n", cfg_path);
  dt_plan_print(&p, stdout, "");
  return 0;
}
