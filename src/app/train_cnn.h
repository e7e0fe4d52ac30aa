/* Training the image classifiers (model.arch = cnn | resnet18 | resnet50, issue #25): their own
 * step loop beside GPT-2's trainer (train.h), over the same launch layout (mesh.h), learning-rate
 * schedule, per-element optimizers (kmath.h), metrics rows and signals. Data parallelism only:
 * each dp rank takes a contiguous slice of the step's global batch (the sample positions of the
 * token trainer, so the set of images per step does not depend on dp), gradients are averaged
 * over the dp group, batch norm is synchronised over it (dp = N x B equals dp = 1 x N*B), or with
 * model.sync_bn = false per rank (rank 0's running statistics broadcast after every step).
 * Evaluation: loss and top-1 accuracy over the whole validation set, batch norm's running
 * statistics. The parameters, their batch norm statistics, gradients and optimizer state are the
 * CPU backend's arenas (backend.h) over one layout, and the gradients become final over dp through
 * GPT-2's sync strategies (sync.h): DDP's buckets all-reduced during backward, ZeRO-1 and ZeRO-2,
 * and ZeRO-3 (fp32) with each parameter tensor gathered around its use through the
 * model's layer hook (block l of the sync strategy = tensor l + 1; tensor 0 stays gathered for the
 * whole step, the running statistics are never sharded).
 * Checkpoints (train_cnn_ckpt.c): GPT-2's format and commit protocol, exact and any-layout resume.
 * Mixed precision (train.precision = bf16 | fp16, emulated as GPT-2's: cnn.h) with fp16's loss scaler.
 * Not yet (README, Status): tp, pp. The model-side seam that would
 * join this loop and GPT-2's into one trainer is docs/architecture.md's next step. */
#ifndef DT_TRAIN_CNN_H
#define DT_TRAIN_CNN_H

#include "backend.h"
#include "ckpt.h"
#include "cnn.h"
#include "config.h"
#include "images.h"
#include "mesh.h"
#include "metrics.h"
#include "sync.h"

typedef struct {
  dt_config_t cfg;
  const char *cfg_name;
  dt_mesh_t mesh;
  dt_cnn_t model;
  dt_layout_t ck;     /* checkpoints: the parameters' tensors, then the running statistics' */
  dt_layout_t arena;  /* the same tensors for the backend and the sync strategy: one group per
                         tensor (DDP's buckets are unions of groups), ZeRO's padding at the end */
  dt_backend_t be;    /* the backend's arenas over `arena` (system.backend): params (then bufs),
                         grads, and the optimizer state m (SGD's momentum buffer or AdamW's first
                         moment), v (AdamW's second) of the optimizer range (ZeRO: this shard) */
  float *host;        /* a device backend: host copies of params (then bufs), m and v for the
                         initial weights and checkpoints (NULL on the CPU) */
  dt_comm_t *dev_dp_comm; /* a device backend with dp > 1: the gradients' communicator (NCCL) */
  dt_sync_t sync;     /* local, ddp, zero1, zero2 or zero3 (parallel.zero) */
  dt_layer_hook_fn zero3_hook; /* ZeRO-3: the sync strategy's block hook (model.layer_hook calls it) */
  void *zero3_ctx;
  dt_scaler_t scaler; /* fp16's dynamic loss scale (precision.h); disabled otherwise */
  dt_ckpt_ranges_t zero_optim; /* ZeRO: the boxes of m, v in checkpoints */
  float *bufs;        /* the running statistics: be.params + model.lay.n_params */
  dt_images_t train, val;
  int have_val;
  float *x;           /* (B, C, H, W) */
  int *y;             /* (B) */
  int B, accum, global_batch, step, first_step;
  uint64_t sample_pos;
  double flops_per_image; /* forward + backward, convolutions and linear layers */
  dt_metrics_t metrics;
  int stopped_by_signal;
  int saved_step, resumed_step; /* -1: none */
  double bn_wait, step_s;       /* this run's seconds in synchronised batch norm's sums, and in its steps */
  long bn_sums;
} dt_cnn_trainer_t;

/* Is model.arch one of the image classifiers? */
int dt_cnn_trainer_wanted(const dt_config_t *cfg);
/* An image set of data.format (idx: images + labels files; cifar: a glob of batch files). */
dt_status_t dt_cnn_open_set(dt_images_t *d, const dt_config_t *c, const char *images, const char *labels);
/* The model's configuration from [model] and the training images' shape (DT_ERR_CONFIG: model.arch). */
dt_status_t dt_cnn_model_config(const dt_config_t *c, const dt_images_t *train, dt_cnn_config_t *mc);
/* Launch layout, data (normalised with the training set's statistics), model, initial weights
 * (the same seed on every rank). Errors name the file or key. */
dt_status_t dt_cnn_trainer_init(dt_cnn_trainer_t *tr, const dt_config_t *cfg, const char *cfg_name);
/* One optimizer step; fills row. */
dt_status_t dt_cnn_trainer_step(dt_cnn_trainer_t *tr, dt_step_row_t *row);
/* Mean loss and top-1 accuracy over the whole validation set (split over the dp ranks). */
dt_status_t dt_cnn_trainer_eval(dt_cnn_trainer_t *tr, double *loss, double *acc);
/* Header, steps, evaluation, rows, checkpoints every checkpoint.every steps and at the end; a
 * signal saves and stops the run (stopped_by_signal). */
dt_status_t dt_cnn_trainer_run(dt_cnn_trainer_t *tr);
/* train_cnn_ckpt.c: tr->ck from the model's two layouts; save (collective); resume per
 * checkpoint.resume (auto | never | PATH), after the initial weights were drawn. */
dt_status_t dt_cnn_trainer_ckpt_layout(dt_cnn_trainer_t *tr);
dt_status_t dt_cnn_trainer_save(dt_cnn_trainer_t *tr);
dt_status_t dt_cnn_trainer_resume(dt_cnn_trainer_t *tr);
void dt_cnn_trainer_free(dt_cnn_trainer_t *tr);

#endif
