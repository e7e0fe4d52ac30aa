/* Memory planner and roofline (`dtrain plan`, and the table rank 0 prints before training): per
 * rank bytes of everything dtrain allocates for a configuration and layout (parameters, working
 * copy, gradients, AdamW moments, activations, communication buffers, workspace) for ZeRO stages
 * 0..3 side by side, and a datasheet roofline of one optimizer step on A100 and H100.
 * dt_plan_compute is pure (no MPI, no allocation of model-sized memory) so tests check its
 * numbers; dt_plan_print formats them. */
#ifndef DT_PLAN_H
#define DT_PLAN_H

#include <stdio.h>

#include "config.h"
#include "model.h"
#include "status.h"

/* Device memory dtrain does not allocate itself but a CUDA process holds: context, cuBLAS
 * workspace, allocator slack. An assumption (typically 0.3-0.6 GiB), not a measurement. */
#define DT_PLAN_CUDA_CONTEXT_BYTES (512 * 1048576.0)

#define DT_PLAN_ZERO_STAGES 4
#define DT_PLAN_MAX_PP 1024

typedef struct {
  dt_dims_t d;
  int B, T, accum;    /* micro-batch, sequence length, micro-steps per optimizer step */
  int dp, tp, pp;     /* mesh; world = dp * tp * pp */
  int precision;      /* dt_precision_t of the working copy, activations, activation gradients */
  int bucket_mb;      /* parallel.bucket_mb */
  int ddp_shm;        /* parallel.ddp_comm = auto | shm (auto assumed to find the dp group on one
                         node): the CPU backend's DDP averages in shared memory, no MPI temporaries,
                         but each rank touches (dp-1)/dp of an arena in its peers' (ddp_shm.c) */
  int threads;        /* CPU OpenMP threads per rank (the attention scratch is per thread) */
  int zero;           /* configured parallel.zero, or -1 when this build has no such key */
  int pp_balance;     /* dt_pp_balance_t: what the pipeline stages balance */
  int recompute;      /* train.recompute: activations recomputed in backward */
  int flash;          /* system.attention = flash or cudnn: the CUDA attention keeps (B,NH,T), not (B,NH,T,T) */
  int tf32;           /* system.tf32: the CUDA fp32 products on TF32 tensor cores (the kernel roofline) */
  int cudnn;          /* system.attention = cudnn: + its 16-bit copies of one block's qkv, out, dout and dqkv
                         (16 B T C/tp bytes); cuDNN's workspace is not counted */
  int store16;        /* the CUDA backend stores 16 bits (system.store16 = auto, bf16/fp16, flash or cudnn:
                         train.c): the kernel roofline's as-built storage */
  double device_mem;  /* bytes per device for the fit verdict */
} dt_plan_in_t;

/* Bytes on one rank (the worst pipeline stage for that ZeRO stage). */
typedef struct {
  int pp_stage;       /* which pipeline stage is the worst (largest device total) */
  double params;      /* fp32 master (the `params` arena AdamW updates) */
  double wparams;     /* working copy forward/backward read (bf16/fp16 only; 0 in fp32 where it is
                         the master itself). dtrain emulates 16-bit storage: 4 bytes per value */
  double grads;       /* fp32 gradient arena */
  double m, v;        /* AdamW moments, fp32 */
  double gather;      /* ZeRO-3: full-size working parameters of 2 groups (current + prefetched) */
  double comm;        /* communication staging on the host: MPI's temporaries of DDP's buckets in
                         flight, ZeRO's staging; DDP in shared memory: the peers' gradient slices
                         this rank touches (shared pages, held once per node, in every rank's RSS) */
  double comm_gpu;    /* the same in the device total */
  double act_cpu, act_gpu;       /* activations (+ activation-gradient scratch) of this stage (CPU:
                                    with train.recompute as configured) */
  double act_cpu_alt;            /* CPU activations with the other choice of train.recompute */
  double act_gpu_rc;             /* GPU activations with the other choice of train.recompute */
  double work_cpu, work_gpu;     /* workspace: token buffers;
                                    GPU: assumed CUDA context + cuBLAS workspace */
  double total_cpu, total_gpu;   /* host RSS of the CPU backend / device memory of the CUDA backend */
  double host_gpu, host_gpu_ckpt; /* host memory of a CUDA-backend rank: the initial weights' copy
                                    and the token batch; + m, v copies once a checkpoint was
                                    written or read (train.c's host arena) */
  double total_gpu_rc;           /* device total with the other choice of train.recompute */
} dt_plan_zero_t;

/* One GPU datasheet: dense peaks, HBM bandwidth and link bandwidths per direction. */
typedef struct {
  const char *name;
  double fp32, tf32, bf16; /* FLOP/s, dense */
  double hbm;              /* bytes/s */
  double nvlink;           /* bytes/s per GPU per direction, inside a node */
  double net;              /* bytes/s per GPU per direction between nodes (one NIC per GPU) */
  int gpus_per_node;
} dt_gpu_spec_t;

extern const dt_gpu_spec_t dt_gpu_a100, dt_gpu_h100, dt_gpu_h200;

/* Per rank per optimizer step, for the configured ZeRO stage. */
typedef struct {
  double flops;                 /* model FLOPs of this rank (fwd + bwd) */
  double w_read, g_rw, act_rw, opt_rw; /* HBM bytes by kind, at 4 bytes per stored value */
  double w_read16, act_rw16;           /* the same two with 2-byte storage (bf16 row) */
  double dp_bytes[DT_PLAN_ZERO_STAGES]; /* gradient/parameter collectives, bytes sent per rank */
  double tp_bytes, pp_bytes;    /* tensor-parallel all-reduces, pipeline sends, per rank */
  double bubble;                /* 1F1B step time over the mean stage's compute: simulated with the
                                   stages' FLOPs (equal stages: 1 + (pp-1)/accum) */
} dt_plan_roof_t;

typedef struct {
  dt_plan_in_t in;
  size_t n_arena, n_true;     /* whole model: arena floats (padding incl.), true parameters */
  double stage_params[DT_PLAN_MAX_PP]; /* parameters (floats) per tp rank of each pipeline stage */
  int stage_blocks[DT_PLAN_MAX_PP];    /* blocks per pipeline stage */
  double max_group;           /* largest parameter group per tp rank (floats) */
  double group_emb, group_blk, group_head; /* floats of the embeddings, one block, ln_f (per tp rank) */
  dt_plan_zero_t z[DT_PLAN_ZERO_STAGES];
  dt_plan_zero_t stage[DT_PLAN_MAX_PP]; /* every pipeline stage at the configured ZeRO stage */
  dt_plan_roof_t roof;
  double stage_flops_share;   /* pp > 1: the busiest stage's FLOPs over the mean stage's */
} dt_plan_t;

/* GPU backend activation bytes for (B, T): what the model (gpt2.c) allocates on the CUDA backend
 * (tp = pp = 1), whose attention keeps the (B, NH, T, T) probabilities and their gradient (flash:
 * the rows' log-sum-exp), with activations of act_bytes (4, or 2 with 16-bit storage). */
size_t dt_plan_gpu_activation_bytes(const dt_dims_t *d, int B, int T, int recompute, int flash, int act_bytes);

/* The planner's input for a loaded config and a world size (0: dp*tp*pp with dp=0 read as 1).
 * Errors (DT_ERR_CONFIG) name the key. */
dt_status_t dt_plan_input(dt_plan_in_t *in, const dt_config_t *cfg, const char *name, int world, int threads,
                          double device_mem);
dt_status_t dt_plan_compute(dt_plan_t *p, const dt_plan_in_t *in);
/* Predicted seconds per optimizer step: max(flops/peak, bytes/HBM) x bubble + communication,
 * math: 0 fp32, 1 tf32, 2 bf16 (2-byte storage). Pieces into the optional outputs. */
double dt_plan_step_time(const dt_plan_t *p, const dt_gpu_spec_t *g, int math, double *t_flops, double *t_mem,
                         double *t_comm);
/* One line of a report: prefix, the formatted text, a newline. */
void dt_plan_line(FILE *o, const char *prefix, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The full report, each line starting with `prefix`. */
void dt_plan_print(const dt_plan_t *p, FILE *out, const char *prefix);
/* Parse "80GiB", "80GB", "80G" (= GiB), "8e10", ... into bytes; -1 if malformed. */
double dt_plan_parse_bytes(const char *s);
/* Peak resident set size of this process (VmHWM from /proc/self/status) in bytes, -1 if unknown. */
double dt_plan_peak_rss(void);

/* Remember the current RSS (VmRSS) as the process's baseline before any model memory: the CLI
 * calls it after MPI and the backend runtime are up; dt_plan_print_rss reports plan + baseline. */
void dt_plan_note_baseline(void);
/* For train.c, one line each: the plan before step 1 (on a GPU, `device`, also the kernels'
 * roofline: roofline.h) and the measured peak RSS against it. */
void dt_plan_print_run(const dt_config_t *cfg, const char *name, int world, int threads, int device, FILE *out);
void dt_plan_print_rss(const dt_config_t *cfg, const char *name, int world, int threads, int device, int ckpt,
                       FILE *out);
/* That line for a planned total of `plan` bytes (`what`: the backend and what it counts; ZeRO stage
 * `zero`): the peak RSS, the plan, and plan + the baseline, each against the peak. */
void dt_plan_print_rss_line(FILE *out, const char *what, int zero, double plan);
/* The same for a CUDA rank: device memory in use (bytes, cudaMemGetInfo's total - free, so the
 * CUDA context and library workspaces count) against the plan's CUDA-backend total. */
void dt_plan_print_device(const dt_config_t *cfg, const char *name, int world, int threads, double used, FILE *out);
/* That line for a planned device total of `plan` bytes at ZeRO stage `zero` (the classifiers' too). */
void dt_plan_print_device_line(FILE *out, double used, int zero, double plan);

/* `dtrain plan CONFIG [section.key=value ...] [--world N] [--device-mem 80GiB]`. */
int dt_plan_main(int argc, char **argv);

#endif
