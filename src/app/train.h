/* The training run: set-up from a validated config, the step loop, evaluation, checkpoints and
 * signal handling. Used by `dtrain CONFIG` (cli.c) and by tests and benchmarks. */
#ifndef DT_TRAIN_H
#define DT_TRAIN_H

#include <signal.h>
#include <stdio.h>
#include <stdint.h>

#include "backend.h"
#include "ckpt.h"
#include "config.h"
#include "data.h"
#include "ddp.h"
#include "gpt2.h"
#include "mesh.h"
#include "metrics.h"
#include "model.h"
#include "pipeline.h"
#include "precision.h"
#include "sync.h"

/* Exit status when a signal stopped training after a checkpoint was written: the sbatch
 * templates requeue the job on it (EX_TEMPFAIL). */
#define DT_EXIT_REQUEUE 75

typedef struct {
  dt_config_t cfg;
  const char *cfg_name;   /* the .ini path, for messages */
  dt_mesh_t mesh;
  dt_layout_t lay;
  dt_backend_t be;
  dt_gpt2_t model;         /* GPT-2 over be's kernels: activations, tp collectives, stages */
  dt_data_t *train, *val;
  dt_metrics_t metrics;
  int B, T, accum, global_batch; /* global_batch = B * accum * dp sequences per step */
  int *inputs, *targets;   /* (B, T) host */
  float *host_arena;       /* device backends: host copies of params, m, v (3 x n_params) for checkpoints */
  dt_comm_t *dev_dp_comm;  /* device backends with dp > 1: NCCL over the dp group (gradients) */
  dt_comm_t *dev_tp_comm;  /* device backends with tp > 1: NCCL over the tp group (the model's) */
  dt_comm_t *dev_pp_comm;  /* device backends with pp > 1: NCCL over the pp group (stage transfers) */
  dt_comm_t *dev_tied_comm; /* ... and over the first + last stage (the tied wte's gradient sum) */
  int step;                /* optimizer steps completed */
  uint64_t sample_pos;     /* global sample index of the next step's first sample */
  uint64_t tokens_seen;
  double flops_per_token;
  int stopped_by_signal;
  int saved_step;          /* step of the last checkpoint written by this run, -1 none */
  int resumed_step;        /* step restored from a checkpoint, -1 none */
  dt_scaler_t scaler;      /* fp16 dynamic loss scaling (disabled: scale 1); skipped-step count */
  dt_sync_t sync;          /* how gradients become final over dp: local, ddp, zero1-3 (sync.h) */
  dt_ckpt_ranges_t zero_optim; /* zero >= 1: the checkpoint boxes of that shard (m, v) */
  /* pipeline parallelism (pp > 1): the 1F1B transfers over mesh.pp_comm, the group of the first
   * and last stage (the tied embedding's gradient is summed over it), one send and one receive
   * buffer of (B, T, C), this stage's schedule, and per-step time sums for the bubble report */
  dt_pipe_t pipe;
  dt_comm_t *tied_comm;
  void *pp_send, *pp_recv;
  dt_pp_op_t *pp_ops;
  double t_pp_fwd, t_pp_bwd, t_pp_step; /* forward and backward compute, whole micro-step loop */
  int n_pp_steps;
} dt_trainer_t;

/* Data-parallel size and micro-steps per optimizer step for `world` ranks. Pure (no MPI), so a
 * bad launch is reported identically by every rank before any collective. */
dt_status_t dt_train_batch_plan(const dt_config_t *c, const char *name, int world, int *dp, int *accum);
/* Loss-scaler state from a checkpoint (train_ckpt.c; GPT-2's and the image classifiers'): scale and
 * growth tracker only if it was written by an fp16 run (else the scaler keeps loss_scale_init, and
 * rank 0 (root) says so); the skipped-step count always (the optimizer's step t). */
void dt_train_resume_scaler(dt_scaler_t *sc, const dt_ckpt_state_t *st, int root);
/* After the final gradients' sum of squares (this rank's shard under ZeRO, tp and pp already
 * summed): fp16's inf/NaN agreement (*skip), the sync strategy's shard sum, *norm of the unscaled
 * gradients; a non-finite norm of a step not skipped is an error naming the rank and step
 * (train_step.c; both trainers). */
dt_status_t dt_train_norm(dt_sync_t *sy, dt_scaler_t *sc, const dt_mesh_t *mesh, int step, double sumsq,
                          double *norm, int *skip);
/* After the update: the loss scaler's update and, on root, its message when it skipped or grew. */
void dt_train_scaler_step(dt_scaler_t *sc, int skip, int step, int root);
/* The start lines of a bf16/fp16 run (precision and loss scaler; nothing for fp32), train_run.c. */
void dt_train_print_precision(FILE *o, dt_precision_t p, const dt_scaler_t *s);
/* The backend for system.backend (collective over MPI_COMM_WORLD, same verdict on every rank):
 * cpu; cuda, an error naming the first rank without a usable GPU (DT_ERR_LAUNCH) or that cuda is
 * not built in; auto = cuda when it is built in and every rank has a GPU, else cpu with one note
 * on stderr from rank 0 (CUDA builds only, once per process). *devices = this rank's CUDA
 * device count. dt_trainer_init_model calls it; the CLI calls it first, so a bad choice is
 * reported once by rank 0 before any other work. */
dt_status_t dt_train_pick_backend(const dt_config_t *cfg, const char *cfg_name, const dt_backend_ops_t **ops,
                                  int *devices);
/* A communicator on device buffers over the ranks of MPI communicator `mpi`: NCCL on `device`, or
 * with system.device_comm = mpi staged through host memory (dt_cuda.h). Collective over mpi. */
dt_status_t dt_train_device_comm(const dt_config_t *cfg, int device, dt_comm_t *mpi, dt_comm_t **out);
/* Everything for training: model set-up, data, identical weights on all ranks (or resume). */
dt_status_t dt_trainer_init(dt_trainer_t *tr, const dt_config_t *cfg, const char *cfg_name);
/* Only the launch layout, the layout and the backend (used by `dtrain eval`). */
dt_status_t dt_trainer_init_model(dt_trainer_t *tr, const dt_config_t *cfg, const char *cfg_name);
/* The weights of checkpoint `path` (a file, or a directory: its latest complete checkpoint, whose
 * name goes to `used` when given) into the model of dt_trainer_init_model, from any layout
 * (collective; `dtrain eval` and `dtrain generate`). */
dt_status_t dt_trainer_load_checkpoint(dt_trainer_t *tr, const char *path, char *used, size_t used_size);
/* Write and commit a checkpoint of the current state (collective). */
dt_status_t dt_trainer_save(dt_trainer_t *tr);
/* `dtrain eval CONFIG --checkpoint FILE --data SHARD [--batches N] [section.key=value ...]`. */
int dt_eval_main(int argc, char **argv);
/* `dtrain generate CONFIG [--checkpoint FILE|DIR] [--prompt TEXT] [--tokens N] ...` (generate.c). */
int dt_generate_main(int argc, char **argv);
/* One optimizer step; fills row (except val_loss). */
dt_status_t dt_trainer_step(dt_trainer_t *tr, dt_step_row_t *row);
/* Mean loss over cfg.eval_batches sequential micro-batches of d, split over dp ranks. */
dt_status_t dt_trainer_eval(dt_trainer_t *tr, dt_data_t *d, int batches, double *loss);
/* The whole run (init is done by the caller): steps, logging, eval, checkpoints, signals. */
dt_status_t dt_trainer_run(dt_trainer_t *tr);
void dt_trainer_free(dt_trainer_t *tr);

/* Install SIGUSR1/SIGTERM handlers that request a checkpoint and a clean stop. */
void dt_train_install_signals(void);
int dt_train_signal_pending(void);

#endif
