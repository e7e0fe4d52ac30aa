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
 * of activations in flight on stage s. The reports over this model (the table, the start and
 * end-of-run lines, `dtrain plan`) are plan_report.c. */
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
#define CUDA_CONTEXT_BYTES DT_PLAN_CUDA_CONTEXT_BYTES

/* Datasheet peaks (dense, no sparsity), per GPU:
 *   NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): FP32 19.5 TFLOPS, TF32 156 TFLOPS,
 *   BF16 312 TFLOPS, HBM2e 2,039 GB/s (2.0 TB/s), NVLink 600 GB/s (both directions: 300 GB/s each);
 *   HDR InfiniBand 200 Gb/s = 25 GB/s per GPU with one NIC per GPU (DGX A100).
 *   NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): FP32 67 TFLOPS, TF32 495 (989 with
 *   sparsity), BF16 989 TFLOPS (1,979 with sparsity), HBM3 3.35 TB/s, NVLink 900 GB/s (450 GB/s
 *   each direction); NDR InfiniBand 400 Gb/s = 50 GB/s per GPU (DGX H100). 8 GPUs per node. */
const dt_gpu_spec_t dt_gpu_a100 = {"A100-SXM4-80GB", 19.5e12, 156e12, 312e12, 2.0e12, 300e9, 25e9, 8};
const dt_gpu_spec_t dt_gpu_h100 = {"H100-SXM5-80GB", 67e12, 495e12, 989e12, 3.35e12, 450e9, 50e9, 8};
/* NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): the H100's compute (FP32 67, TF32 989 and BF16
 * 1,979 TFLOPS with sparsity, so 495 and 989 dense), HBM3e 4.8 TB/s, NVLink 900 GB/s. The GPU the
 * device tool lends (docs/gpu-runs.md). */
const dt_gpu_spec_t dt_gpu_h200 = {"H200-SXM-141GB", 67e12, 495e12, 989e12, 4.8e12, 450e9, 50e9, 8};

/* The CPU backend's activation arena for a stage (gpt2.c carves it, the CPU attention's share
 * sized by backend_cpu.c): exactly what dt_gpt2_init allocates there. */
static size_t cpu_activation_floats(const dt_dims_t *d, int tp, int nl, int last, int slots, int B, int T, int nthr,
                                    int recompute) {
  size_t state = 0, scratch = 0;
  dt_cpu_attention_floats(B, T, d->NH / tp, nthr, &state, &scratch);
  return dt_gpt2_activation_floats(d, tp, nl, last, slots, B, T, recompute, state, scratch);
}

size_t dt_plan_gpu_activation_bytes(const dt_dims_t *d, int B, int T, int recompute, int flash, int act_bytes) {
  size_t state = 0, scratch = 0;
  dt_cuda_attention_floats(B, T, d->NH, flash, &state, &scratch);
  return dt_gpt2_activation_bytes(d, 1, d->L, 1, 1, B, T, recompute, state, scratch, act_bytes);
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
  in->ddp_shm = strcmp(cfg->ddp_comm, "mpi") != 0;
  in->threads = threads > 0 ? threads : 1;
  in->zero = configured_zero(cfg);
  in->pp_balance = (int)dt_pp_balance_of(cfg);
  in->recompute = cfg->recompute;
  in->flash = strcmp(cfg->attention, "matmul") != 0; /* flash, cudnn: the rows' log-sum-exp only */
  in->cudnn = !strcmp(cfg->attention, "cudnn");
  in->tf32 = cfg->tf32;
  in->store16 = !strcmp(cfg->store16, "auto") && dt_cuda_store16_built(prec, in->flash);
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

/* The inputs' bounds, and the parameter groups per tp rank split over the stages: from the tp
 * shard layout the trainer builds (alignment included, so the stage split is the trainer's) when
 * tp divides the padded vocab; else (a layout dtrain cannot run, planned anyway) from the shapes:
 * wte (Vp, C)/tp + wpe (T, C); block (12C^2 + 7C)/tp sharded + 6C replicated; ln_f 2C. *wte: the
 * tied lm_head's copy the last stage holds with pp > 1 (already in its head group). */
static dt_status_t plan_groups(dt_plan_t *p, const dt_plan_in_t *in, double *wte) {
  const dt_dims_t *d = &in->d;
  const int tp = in->tp, pp = in->pp, L = d->L;
  const double C = d->C;
  if (pp < 1 || pp > L || pp > DT_PLAN_MAX_PP)
    return DT_ERR(DT_ERR_CONFIG, "plan: parallel.pp = %d: must be between 1 and n_layer = %d", pp, L);
  if (tp < 1 || d->NH % tp != 0)
    return DT_ERR(DT_ERR_CONFIG, "plan: parallel.tp = %d must divide n_head = %d (heads are split)", tp, d->NH);
  if (in->B < 1 || in->T < 1 || in->T > d->T || in->dp < 1 || in->accum < 1)
    return DT_ERR(DT_ERR_CONFIG, "plan: bad micro-batch B=%d T=%d dp=%d accum=%d", in->B, in->T, in->dp, in->accum);
  dt_layout_t lay;
  DT_TRY(dt_layout_init(&lay, *d));
  p->n_arena = lay.n_params;
  p->n_true = lay.n_params_true;
  dt_layout_free(&lay);
  double emb, blk, head;
  if (d->Vp % tp == 0) {
    DT_TRY(dt_layout_pp_groups(*d, tp, &emb, &blk, &head, wte));
  } else {
    emb = (double)d->Vp * C / tp + (double)d->T * C;
    blk = (12 * C * C + 7 * C) / tp + 6 * C;
    head = 2 * C;
    *wte = (double)d->Vp * C / tp;
  }
  if (pp > 1) head += *wte; /* tied lm_head: the last stage holds a copy of wte */
  split_stages(p, emb, blk, head);
  p->max_group = fmax(emb, fmax(blk, head));
  p->group_emb = emb, p->group_blk = blk, p->group_head = head;
  return DT_OK;
}

/* Activation counts the stages share: the backend's own count for tp = pp = 1; otherwise fixed
 * (embedding/head/scratch, counted on every stage: an upper bound) + per-layer part, with the
 * tp-sharded tensors (qkv, atty, fch, fch_gelu, attention lse/probabilities, logits) divided by
 * tp and pp - s micro-batches in flight (1F1B). CPU in floats, GPU in bytes (its activations of
 * es bytes: 2 with 16-bit storage). */
typedef struct {
  double c_fix, c_per_tp, g_fix, g_per_tp; /* CPU floats / GPU bytes: fixed part, per block (tp-sharded) */
  double logits_sh;                        /* what vocab-parallel logits save (elements) */
  double ints;                             /* inputs + targets of a micro-batch, bytes */
  double wte;                              /* plan_groups' */
  int mixed;                               /* 16-bit working parameters */
  int es;                                  /* bytes of a GPU activation (in->store16: 2) */
} plan_act_t;

static plan_act_t plan_act(const dt_plan_in_t *in, double wte) {
  const dt_dims_t *d = &in->d;
  const double C = d->C, bt = (double)in->B * in->T, shard = 1.0 - 1.0 / in->tp;
  dt_dims_t d0 = *d, d1 = *d;
  d0.L = 0;
  d1.L = 1;
  plan_act_t a = {.wte = wte, .mixed = in->precision != DT_PREC_FP32, .ints = 2 * bt * sizeof(int)};
  a.es = in->store16 ? 2 : 4;
  a.c_fix = (double)cpu_activation_floats(&d0, 1, 0, 1, 1, in->B, in->T, in->threads, 0);
  const double c_per = (double)cpu_activation_floats(&d1, 1, 1, 1, 1, in->B, in->T, in->threads, 0) - a.c_fix;
  a.g_fix = (double)dt_plan_gpu_activation_bytes(&d0, in->B, in->T, 0, in->flash, a.es);
  const double g_per = (double)dt_plan_gpu_activation_bytes(&d1, in->B, in->T, 0, in->flash, a.es) - a.g_fix;
  a.logits_sh = bt * d->Vp * shard;
  a.c_per_tp = c_per - bt * (12 * C + d->NH) * shard;
  const double att_rows = (double)in->B * d->NH * in->T * (in->flash ? 1 : in->T); /* a block's attention state */
  a.g_per_tp = g_per - (bt * 12 * C * a.es + att_rows * 4) * shard;
  return a;
}

/* Activations of stage s with n_l blocks and `inflight` micro-batches, bytes: *cpu and *cpu_alt
 * (the backend's, without and with recomputation: train.recompute keeps each block's output and
 * recomputes one block's activations; a tp that does not divide Vp cannot run: estimated like the
 * GPU, fixed part on every stage, an upper bound), *gpu and *gpu_rc the same for the CUDA backend
 * (the model's own count for tp = pp = 1). The configured choice first. */
static void stage_acts(const dt_plan_in_t *in, const plan_act_t *a, int s, double n_l, int inflight,
                       dt_plan_zero_t *r) {
  const dt_dims_t *d = &in->d;
  const int tp = in->tp, pp = in->pp;
  const double bt = (double)in->B * in->T, C = d->C;
  double keep, rc, gkeep, grc;
  if (d->Vp % tp == 0) {
    keep = (double)cpu_activation_floats(d, tp, (int)n_l, s == pp - 1, inflight, in->B, in->T, in->threads, 0);
    rc = (double)cpu_activation_floats(d, tp, (int)n_l, s == pp - 1, inflight, in->B, in->T, in->threads, 1);
  } else {
    keep = a->c_fix - a->logits_sh + inflight * n_l * a->c_per_tp;
    rc = keep - inflight * n_l * a->c_per_tp + inflight * n_l * bt * C + a->c_per_tp;
  }
  if (tp == 1 && pp == 1) {
    gkeep = (double)dt_plan_gpu_activation_bytes(d, in->B, in->T, 0, in->flash, a->es);
    grc = (double)dt_plan_gpu_activation_bytes(d, in->B, in->T, 1, in->flash, a->es);
  } else {
    gkeep = a->g_fix - a->logits_sh * a->es + inflight * n_l * a->g_per_tp; /* logits (dlogits in place) */
    grc = gkeep - inflight * n_l * a->g_per_tp + inflight * n_l * bt * C * a->es + a->g_per_tp;
  }
  /* + the backend's copies of inputs and targets: of each micro-batch in flight on the CPU */
  r->act_cpu = 4 * (in->recompute ? rc : keep) + inflight * a->ints;
  r->act_cpu_alt = 4 * (in->recompute ? keep : rc) + inflight * a->ints;
  /* cuDNN attention's 16-bit copies of float storage (attention_cudnn.cpp); 16-bit storage: the
   * fp32 accumulator of the biased products (B T 4C floats, backend_cuda.cu) and with tp > 1 the
   * fp32 partial sums tensor parallelism all-reduces (B T C floats, gpt2.c) */
  const double c16 = in->store16 ? 4 * bt * 4 * C + (tp > 1 ? 4 * bt * C : 0) : in->cudnn ? 16 * bt * (C / tp) : 0;
  r->act_gpu = (in->recompute ? grc : gkeep) + a->ints + c16;
  r->act_gpu_rc = (in->recompute ? gkeep : grc) + a->ints + c16;
}

/* Memory of stage s under ZeRO stage z, bytes per rank. */
static dt_plan_zero_t stage_memory(const dt_plan_t *p, const dt_plan_in_t *in, const plan_act_t *a, int z, int s) {
  const int pp = in->pp, dp = in->dp;
  const double P = p->stage_params[s], bt = (double)in->B * in->T;
  const int inflight = pp == 1 ? 1 : (pp - s < in->accum ? pp - s : in->accum);
  dt_plan_zero_t r = {.pp_stage = s};
  r.params = 4 * (z >= 3 ? ceil_div(P, dp) : P);
  r.wparams = a->mixed ? r.params : 0;
  r.grads = 4 * (z >= 2 ? ceil_div(P, dp) : P);
  if (z == 2 && pp > 1 && (s == 0 || s == pp - 1)) /* ZeRO-2 x pp keeps wte's gradient whole (train.c) */
    r.grads = 4 * (ceil_div(P - a->wte, dp) + a->wte);
  r.m = r.v = 4 * (z >= 1 ? ceil_div(P, dp) : P);
  /* ZeRO-3 (zero.c): the embeddings and ln_f gathered for the whole step, plus the running
   * block and the prefetched one; this rank's own part of them is already in params / dp */
  r.gather = z >= 3 ? 4 * (p->group_emb + p->group_head + 2 * p->group_blk) * (1.0 - 1.0 / dp) : 0;
  /* DDP: MPI's temporaries of the 2 bucket all-reduces in flight (ddp.c); ZeRO: its staging
   * bucket (zero.h) + the temporaries of the collective on it (measured at 124M, dp=4) */
  r.comm = r.comm_gpu = dp > 1 ? (z >= 1 ? 3 : 2) * in->bucket_mb * MIB : 0; /* dp = 1: no collectives */
  if (dp > 1 && z == 0 && in->ddp_shm) r.comm = 4 * P * (dp - 1) / dp; /* DDP in shared memory (ddp_shm.c) */
  stage_acts(in, a, s, p->stage_blocks[s], inflight, &r);
  /* CPU: the trainer's (B,T) batch (the initial weights are made and broadcast in the
   * parameter arena itself); pp > 1: its send and receive buffers of (B,T,C) */
  r.work_cpu = a->ints + (pp > 1 ? 2 * 4 * bt * in->d.C : 0);
  r.work_gpu = CUDA_CONTEXT_BYTES;
  double state = r.params + r.wparams + r.grads + r.m + r.v + r.gather + r.comm;
  /* the device's sparse arenas (cuda/sparse.h) under ZeRO-2/3: the shard, the gathered blocks as
   * on the CPU and one more (given back only once the kernels queued on it have run), and for the
   * gradients also what backward holds before it is reduced: the
   * embeddings' and ln_f's (written at both ends of backward), one bucket and 2 blocks (the block
   * a bucket ends on, and the next one populated while the reduction runs), less the own part */
  const double held =
      dp > 1 ? (1.0 - 1.0 / dp) * (4 * (p->group_emb + p->group_head + 2 * p->group_blk) + in->bucket_mb * MIB) : 0;
  const double own = 1.0 - 1.0 / dp; /* ZeRO-3: a third block, released but not yet given back */
  /* ZeRO-3 in bf16/fp16 gathers the working copy (a sparse arena of es-byte elements too) and the
   * master keeps its shard only; else the gathers fill the master and the working copy is whole */
  const double gathered = z >= 3 ? r.params + r.gather + 4 * p->group_blk * own : 4 * P;
  double params_gpu =
      z >= 3 && a->mixed ? r.params + a->es / 4.0 * gathered : gathered + (a->mixed ? (double)a->es * P : 0);
  double grads_gpu = z >= 2 ? r.grads + held : 4 * P;
  double state_gpu = params_gpu + grads_gpu + r.m + r.v + r.comm_gpu;
  r.total_cpu = state + r.act_cpu + r.work_cpu;
  r.total_gpu = state_gpu + r.act_gpu + r.work_gpu;
  r.total_gpu_rc = state_gpu + r.act_gpu_rc + r.work_gpu;
  r.host_gpu = r.params + a->ints; /* host arena's params part, inputs + targets */
  r.host_gpu_ckpt = r.host_gpu + r.m + r.v;
  return r;
}

/* Roofline of the configured ZeRO stage's worst rank (stage zc), per optimizer step. */
static void plan_roof(dt_plan_t *p, const dt_plan_in_t *in, const plan_act_t *a, int zc) {
  const dt_dims_t *d = &in->d;
  const int tp = in->tp, pp = in->pp, dp = in->dp, s = p->z[zc].pp_stage;
  const double P = p->stage_params[s], acc = in->accum, bt = (double)in->B * in->T, C = d->C;
  /* activations one micro-batch writes and reads (not the pp - s kept in flight), in 4-byte storage
   * (the 16-bit figure is act_rw16; with pp > 1 and 16-bit storage scaled from it, statistics too) */
  const double A = tp == 1 && pp == 1
                       ? (double)dt_plan_gpu_activation_bytes(d, in->B, in->T, 0, in->flash, 4) + a->ints +
                             (in->cudnn && !in->store16 ? 16 * bt * C : 0)
                       : (a->g_fix - a->logits_sh * a->es + p->stage_blocks[s] * a->g_per_tp) * 4 / a->es + a->ints;
  dt_plan_roof_t *f = &p->roof;
  f->flops = dt_model_flops_per_token(d, in->T) * bt * acc / ((double)tp * pp);
  f->w_read = acc * 2 * 4 * P + (a->mixed ? 8 * P : 0); /* fwd + bwd read W; rounding copy */
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
}

dt_status_t dt_plan_compute(dt_plan_t *p, const dt_plan_in_t *in) {
  memset(p, 0, sizeof *p);
  p->in = *in;
  double wte = 0;
  DT_TRY(plan_groups(p, in, &wte));
  const plan_act_t a = plan_act(in, wte);
  const int zc = in->zero >= 0 && in->zero < DT_PLAN_ZERO_STAGES ? in->zero : 0; /* the configured stage */
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++) { /* each stage's worst rank, the configured one's every stage */
    dt_plan_zero_t best = {0};
    best.total_gpu = -1;
    for (int s = 0; s < in->pp; s++) {
      dt_plan_zero_t r = stage_memory(p, in, &a, z, s);
      if (r.total_gpu > best.total_gpu) best = r;
      if (z == zc) p->stage[s] = r;
    }
    p->z[z] = best;
  }
  plan_roof(p, in, &a, zc);
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
