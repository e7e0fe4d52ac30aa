/* The image classifiers' checkpoints (train_cnn.h): the HDF5 files and commit protocol of GPT-2's
 * (ckpt.h, docs/checkpoint-format.md) over one layout that is the parameters' tensors followed by
 * batch norm's running statistics (so /model holds both, in torchvision's names and shapes: conv
 * weights (OC, C, KH, KW)); /optim/m is SGD's momentum buffer or AdamW's first moment, /optim/v AdamW's
 * second (zeros for SGD), both 0 for the statistics. The data position is the next global sample
 * index and the crops and flips are drawn from (seed, index), so a resume continues bitwise, on
 * any number of dp ranks and ZeRO stage (with ZeRO m and v are this rank's shard of the arena,
 * written and read as its boxes, tr->zero_optim; ZeRO-3 writes the parameters from the same boxes
 * and reads them whole on every rank, then drops what is not its shard: train_cnn.c). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "comm.h"
#include "timer.h"
#include "train.h"
#include "train_cnn.h"

/* tr->ck: the parameters' layout, then the running statistics' at offset lay.n_params. */
dt_status_t dt_cnn_trainer_ckpt_layout(dt_cnn_trainer_t *tr) {
  const dt_layout_t *p = &tr->model.lay, *b = &tr->model.bufs;
  dt_layout_t *c = &tr->ck;
  memset(c, 0, sizeof *c);
  c->tensors = calloc((size_t)(p->n_tensors + b->n_tensors), sizeof *c->tensors);
  if (!c->tensors) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  memcpy(c->tensors, p->tensors, sizeof *c->tensors * (size_t)p->n_tensors);
  for (int i = 0; i < b->n_tensors; i++) {
    c->tensors[p->n_tensors + i] = b->tensors[i];
    c->tensors[p->n_tensors + i].offset += p->n_params;
  }
  c->n_tensors = p->n_tensors + b->n_tensors;
  c->n_params = p->n_params + b->n_params;
  c->n_params_true = p->n_params_true + b->n_params_true;
  c->tp = c->pp = 1;
  return DT_OK;
}

static dt_status_t world_of(dt_cnn_trainer_t *tr, MPI_Comm *w) { return dt_comm_mpi_handle(tr->mesh.world, w); }

/* The backend's arenas as checkpoint buffers (a device backend's host copies): m, v the optimizer
 * range's boxes under ZeRO; a ZeRO-3 save the parameters' too (each rank holds only its shard of
 * them; the running statistics, whole on every rank, are written from the same boxes). */
static dt_ckpt_arenas_t arenas(dt_cnn_trainer_t *tr, int save) {
  const size_t np = tr->arena.n_params, no = dt_backend_opt_floats(&tr->be);
  dt_ckpt_arenas_t a = tr->host ? dt_ckpt_arenas_full(tr->host, tr->host + np, tr->host + np + no)
                                : dt_ckpt_arenas_full(tr->be.params, tr->be.m, tr->be.v);
  if (tr->sync.ops->optim_sharded) a.optim = tr->zero_optim;
  if (save && tr->sync.ops->params_sharded) {
    a.params += tr->sync.zero.lo;
    a.model = tr->zero_optim;
  }
  return a;
}

/* A device backend: its arenas to the host copies (to_host) or back. */
static dt_status_t stage(dt_cnn_trainer_t *tr, int to_host) {
  if (!tr->host) return DT_OK;
  const size_t np = tr->arena.n_params, no = dt_backend_opt_floats(&tr->be);
  const dt_buf_t buf[3] = {DT_BUF_PARAMS, DT_BUF_M, DT_BUF_V};
  float *h[3] = {tr->host, tr->host + np, tr->host + np + no};
  const size_t n[3] = {np, no, no};
  for (int i = 0; i < 3; i++)
    DT_TRY(to_host ? tr->be.ops->copy_to_host(&tr->be, buf[i], 0, n[i], h[i])
                   : tr->be.ops->copy_from_host(&tr->be, buf[i], 0, n[i], h[i]));
  return DT_OK;
}

/* Writes nothing when checkpoint.dir is empty (no checkpoints asked for). */
dt_status_t dt_cnn_trainer_save(dt_cnn_trainer_t *tr) {
  if (!tr->cfg.ckpt_dir[0]) return DT_OK;
  DT_TRY(stage(tr, 1));
  dt_ckpt_arenas_t a = arenas(tr, 1);
  char *ini = dt_config_to_string(&tr->cfg), path[DT_PATH_MAX];
  dt_ckpt_state_t st = {.step = tr->step, .data_pos = (int64_t)tr->sample_pos,
                        .epoch = (int64_t)(tr->sample_pos / (uint64_t)tr->train.n), .seed = tr->cfg.seed,
                        .loss_scale = tr->scaler.scale, .loss_scale_growth = tr->scaler.growth,
                        .skipped_steps = tr->scaler.skipped, .dp = tr->mesh.dp, .tp = 1, .pp = 1, .ini = ini};
  double t0 = dt_time_now();
  MPI_Comm w;
  dt_status_t s = world_of(tr, &w);
  if (s == DT_OK) s = dt_ckpt_save(&w, tr->cfg.ckpt_dir, tr->cfg.ckpt_keep, &tr->ck, &a, &st, path, sizeof path);
  free(ini);
  DT_TRY(s);
  tr->saved_step = tr->step;
  if (tr->mesh.rank == 0) printf("# checkpoint: %s (step %d, %.2f s)\n", path, tr->step, dt_time_now() - t0);
  return DT_OK;
}

/* checkpoint.resume = auto (the newest complete checkpoint in checkpoint.dir, else a fresh start),
 * never, or a file. The initial weights are already drawn; a load replaces every value. */
dt_status_t dt_cnn_trainer_resume(dt_cnn_trainer_t *tr) {
  const char *r = tr->cfg.resume;
  if (!strcmp(r, "never") || (!strcmp(r, "auto") && !tr->cfg.ckpt_dir[0])) return DT_OK;
  dt_ckpt_arenas_t a = arenas(tr, 0);
  dt_ckpt_state_t st;
  memset(&st, 0, sizeof st);
  char path[DT_PATH_MAX] = "";
  MPI_Comm w;
  DT_TRY(world_of(tr, &w));
  dt_status_t s;
  if (!strcmp(r, "auto")) {
    s = dt_ckpt_load_latest(&w, tr->cfg.ckpt_dir, &tr->ck, &a, &st, path, sizeof path);
    if (s == DT_ERR_CKPT) {
      if (tr->mesh.rank == 0) printf("# resume: no complete checkpoint in %s, starting from step 0\n", tr->cfg.ckpt_dir);
      dt_err_clear();
      return DT_OK;
    }
  } else {
    snprintf(path, sizeof path, "%s", r);
    s = dt_ckpt_load(&w, path, &tr->ck, &a, &st);
  }
  DT_TRY(s);
  DT_TRY(stage(tr, 0));
  tr->step = (int)st.step;
  tr->sample_pos = (uint64_t)st.data_pos;
  tr->resumed_step = tr->step;
  dt_train_resume_scaler(&tr->scaler, &st, tr->mesh.rank == 0);
  if (tr->mesh.rank == 0) {
    printf("# resume: %s at step %d, sample %llu (written by dtrain %s, dp=%d)\n", path, tr->step,
           (unsigned long long)tr->sample_pos, st.version, st.dp);
    if (st.seed != tr->cfg.seed)
      printf("# resume: note: seed %llu differs from the checkpoint's %llu (data order and augmentation change)\n",
             (unsigned long long)tr->cfg.seed, (unsigned long long)st.seed);
  }
  dt_ckpt_state_free(&st);
  return DT_OK;
}
