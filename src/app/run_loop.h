/* The step loop every trainer runs (GPT-2's train_run.c, the image classifiers' train_cnn.c):
 * rank 0 prints the effective configuration, the rank table, the trainer's header and the
 * metrics header; then steps until train.steps, evaluation every eval_every steps and at the last, a metrics row every
 * log.every steps (and with every evaluation), a stop requested by SIGUSR1/SIGTERM on any rank
 * agreed by all and answered with a checkpoint, checkpoints every checkpoint.every steps, and
 * train.stop_after; after a row whose step carried the straggler report (dt_run_straggler), rank
 * 0's `# straggler:` line. A trainer gives its step, evaluation and save. */
#ifndef DT_RUN_LOOP_H
#define DT_RUN_LOOP_H

#include "config.h"
#include "mesh.h"
#include "metrics.h"

typedef struct {
  void *t;                 /* the trainer, passed to the functions below */
  const dt_config_t *cfg;
  dt_mesh_t *mesh;
  dt_metrics_t *metrics;
  const int *step;         /* the trainer's count of completed steps (its step function advances it) */
  dt_status_t (*step_fn)(void *t, dt_step_row_t *row);
  dt_status_t (*eval_fn)(void *t, dt_step_row_t *row); /* fills row's val_loss (val_acc); NULL: no validation set */
  dt_status_t (*save_fn)(void *t);
  void (*header_fn)(void *t);                         /* rank 0's '#' lines about the model, data, ... */
} dt_run_loop_t;

/* Returns after the last step, after stop_after steps, or after the checkpoint of a signal
 * (*stopped = 1; else 0). The first error of a step, evaluation or save ends it. */
dt_status_t dt_run_loop(const dt_run_loop_t *L, int *stopped);

/* For a trainer's step function: every log.straggler_every steps (straggler.h), each rank's step
 * time outside communication waits (`busy` seconds; the watchdog's dt_wd_wait_seconds counts the
 * waits) gathered over the world into row's min / median / max and slowest rank, the rank the
 * others waited for; collective on those steps. Otherwise, and with one rank, row->slowest_rank = -1. */
dt_status_t dt_run_straggler(const dt_mesh_t *mesh, const dt_config_t *cfg, int step, double busy, dt_step_row_t *row);

#endif
