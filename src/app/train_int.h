/* Shared by the trainer's files (train.c set-up, train_ckpt.c weights and checkpoints,
 * train_step.c the step, train_run.c the run); not an interface for anything else. */
#ifndef DT_TRAIN_INT_H
#define DT_TRAIN_INT_H

#include "train.h"

static inline int is_root(const dt_trainer_t *tr) { return tr->mesh.rank == 0; }
/* Resume from train.resume (exact or another layout), or draw the initial weights (train_ckpt.c). */
dt_status_t dt_trainer_load_weights(dt_trainer_t *tr);

#endif
