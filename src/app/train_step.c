/* One optimizer step reads like the algorithm:
 *   lr = schedule(step); gradients zeroed (sync strategy)
 *   for each micro-step (1F1B with pp > 1): batch = sampler(global index); forward; backward
 *     (the strategy's hook overlaps its communication with it)
 *   gradients final over dp (sync strategy); norm = ||g||; clip; AdamW; parameters whole again; log
 * Data position: step s consumes global samples [s*G, (s+1)*G), G = global_batch; dp rank r takes
 * the contiguous slice [r*accum*B, (r+1)*accum*B) of it, micro-step k the k-th B of that slice,
 * so the set of samples per step does not depend on dp. Evaluation is here too. */
#include "train_int.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "fault.h"
#include "optim.h"
#include "run_loop.h"
#include "timer.h"
#include "watchdog.h"

/* One optimizer step's micro-batches: this stage's 1F1B operations (pipeline.h; with one stage
 * simply forward, backward, forward, ...). Every stage reads the micro-batch itself (the first
 * needs the tokens, the last the targets); with pp > 1 the activations and their gradients
 * travel through tr->pipe. The loss is known on the last stage only, where each forward adds its
 * mean to the model's loss sum in backend memory (read once per step: dt_trainer_step).
 * The sync strategy brackets each backward (its gradient-ready hook: DDP's buckets, ZeRO-2/3's
 * reductions to the owners). */
static dt_status_t microsteps(dt_trainer_t *tr, uint64_t slice) {
  const int s = tr->mesh.pp_idx, pp = tr->mesh.pp, m = tr->accum, first = s == 0, last = s == pp - 1;
  dt_sync_t *sy = &tr->sync;
  const size_t n = (size_t)tr->B * tr->T * tr->lay.d.C;
  double t_step = dt_time_now();
  for (int i = 0; i < 2 * m; i++) {
    const dt_pp_op_t op = tr->pp_ops[i];
    const int slot = op.mb % tr->model.slots;
    double t0;
    if (op.fwd) {
      if (first) DT_TRY(dt_pipe_flush(&tr->pipe));
      else DT_TRY(dt_pipe_recv(&tr->pipe, tr->pp_recv, n, s - 1));
      DT_TRY(dt_data_batch(tr->train, slice + (uint64_t)op.mb * (uint64_t)tr->B, tr->B, tr->inputs, tr->targets));
      t0 = dt_time_now();
      DT_TRY(dt_gpt2_stage_forward(&tr->model, slot, tr->inputs, tr->targets, first ? NULL : tr->pp_recv, tr->B,
                                   tr->T, NULL, last ? NULL : tr->pp_send));
      tr->t_pp_fwd += dt_time_now() - t0;
      if (!last) DT_TRY(dt_pipe_send(&tr->pipe, tr->pp_send, n, s + 1));
    } else {
      if (last) DT_TRY(dt_pipe_flush(&tr->pipe));
      else DT_TRY(dt_pipe_recv(&tr->pipe, tr->pp_recv, n, s + 1));
      if (op.mb == m - 1 && dt_fault_at("stall", tr->mesh.rank, tr->step + 1)) raise(SIGSTOP); /* test-only (fault.h) */
      t0 = dt_time_now();
      dt_grad_ready_fn ready = sy->ops->backward_begin(sy, op.mb, m);
      DT_TRY(dt_gpt2_stage_backward(&tr->model, slot, m, last ? NULL : tr->pp_recv, first ? NULL : tr->pp_send, ready,
                                    &sy->ddp));
      DT_TRY(sy->ops->backward_end(sy));
      tr->t_pp_bwd += dt_time_now() - t0;
      if (!first) DT_TRY(dt_pipe_send(&tr->pipe, tr->pp_send, n, s - 1));
    }
  }
  DT_TRY(dt_pipe_flush(&tr->pipe));
  tr->t_pp_step += dt_time_now() - t_step;
  tr->n_pp_steps++;
  return DT_OK;
}

/* Test-only (fault.h): grads[off, off + n) *= DT_FAULT_BAD_MATH_SCALE through a host copy, so it
 * works on device arenas too. */
static dt_status_t fault_scale_grads(dt_backend_t *be, size_t off, size_t n) {
  float *h = malloc(n * sizeof *h);
  if (!h) return DT_ERR(DT_ERR_NOMEM, "fault: out of memory");
  dt_status_t st = be->ops->copy_to_host(be, DT_BUF_GRADS, off, n, h);
  if (st == DT_OK) {
    dt_fault_scale(h, n, DT_FAULT_BAD_MATH_SCALE);
    st = be->ops->copy_from_host(be, DT_BUF_GRADS, off, n, h);
  }
  free(h);
  return st;
}

/* Test-only faults (fault.h) on the final gradients of step `step` (1-based), all in one place. */
static dt_status_t test_faults(dt_trainer_t *tr, int step) {
  dt_backend_t *be = &tr->be;
  const dt_tensor_t *wte = &tr->lay.tensors[0];
  if (tr->mesh.pp > 1 && dt_fault("tied_drift", tr->mesh.rank, step)) /* the wte grads of one stage */
    DT_TRY(fault_scale_grads(be, wte->offset, (size_t)wte->rows * wte->cols));
  if (dt_fault("bad_math", tr->mesh.rank, step)) /* block 1's grads */
    DT_TRY(fault_scale_grads(be, tr->lay.layer_begin[1], tr->lay.layer_begin[2] - tr->lay.layer_begin[1]));
  if (dt_fault("slow_rank", tr->mesh.rank, step)) dt_fault_sleep(DT_FAULT_SLOW_RANK_S);
  if (dt_fault_at("grad_inf", tr->mesh.rank, step)) { /* one inf in block 0's grads */
    float inf = INFINITY;
    DT_TRY(be->ops->copy_from_host(be, DT_BUF_GRADS, tr->lay.layer_begin[1], 1, &inf));
  }
  return DT_OK;
}

dt_status_t dt_train_norm(dt_sync_t *sy, dt_scaler_t *sc, const dt_mesh_t *mesh, int step, double sumsq,
                          double *norm, int *skip) {
  *skip = 0;
  if (sc->enabled) DT_TRY(dt_scaler_agree(sc, mesh->world, mesh->rank, sumsq, skip));
  if (!*skip) DT_TRY(sy->ops->reduce_norm(sy, &sumsq)); /* sharded gradients: the shards' sum */
  *norm = sqrt(sumsq) / sc->scale; /* of the unscaled gradients (exact: scale is a power of two) */
  if (!*skip && !isfinite(*norm))
    return DT_ERR(DT_ERR_NUMERIC, "rank %d: step %d: gradient norm is %g", mesh->rank, step, *norm);
  return DT_OK;
}

void dt_train_scaler_step(dt_scaler_t *sc, int skip, int step, int root) {
  const float scale = sc->scale;
  dt_scaler_update(sc, skip);
  if (sc->enabled && root && (skip || sc->scale != scale))
    printf("# step %d: %s: loss scale %g -> %g\n", step,
           skip ? "inf/NaN gradients on some rank, update skipped" : "no overflow for loss_scale_window steps", scale,
           sc->scale);
}

/* The global gradient norm (of the unscaled gradients) over tp shards, pp stages and ZeRO shards;
 * with fp16, *skip = some rank saw inf/NaN (the step is then skipped everywhere). */
static dt_status_t global_norm(dt_trainer_t *tr, double *norm, int *skip) {
  double sumsq = 0, rep = 0; /* this stage's (the tied copy of wte not counted): tp shards summed, replicas once */
  DT_TRY(dt_gpt2_grad_sumsq(&tr->model, &sumsq, &rep));
  if (tr->lay.tp > 1)
    DT_TRY(tr->mesh.tp_comm->ops->allreduce(tr->mesh.tp_comm, &sumsq, &sumsq, 1, DT_F64, DT_SUM, NULL, NULL));
  sumsq += rep;
  if (tr->mesh.pp > 1)
    DT_TRY(tr->mesh.pp_comm->ops->allreduce(tr->mesh.pp_comm, &sumsq, &sumsq, 1, DT_F64, DT_SUM, NULL, NULL));
  return dt_train_norm(&tr->sync, &tr->scaler, &tr->mesh, tr->step + 1, sumsq, norm, skip);
}

/* AdamW (clipped to grad_clip; the loss scale folded into the factor) unless skipped, what the sync
 * strategy needs after it (ZeRO's parameter gather), the loss scaler's update and its message. */
static dt_status_t update(dt_trainer_t *tr, double lr, double norm, int skip) {
  const dt_config_t *c = &tr->cfg;
  dt_backend_t *be = &tr->be;
  const float scale = tr->scaler.scale;
  if (!skip) { /* unscale (x 1/scale) folded into the clipping factor: both exact powers of two apart */
    dt_adamw_args_t a = {.lr = (float)lr, .beta1 = (float)c->beta1, .beta2 = (float)c->beta2, .eps = (float)c->eps,
                         .weight_decay = (float)c->weight_decay,
                         .grad_scale = dt_clip_scale(norm, c->grad_clip) / scale,
                         .t = (int)(tr->step - tr->scaler.skipped) + 1};
    DT_TRY(be->ops->adamw(be, &a));
  }
  DT_TRY(tr->sync.ops->after_update(&tr->sync, skip)); /* ZeRO: parameters whole again */
  dt_train_scaler_step(&tr->scaler, skip, tr->step + 1, is_root(tr));
  return DT_OK;
}

/* The step's row: the global mean loss and the slowest rank's time, in one reduction each. */
static dt_status_t step_row(dt_trainer_t *tr, double loss_sum, double lr, double norm, int skip, float scale,
                            uint64_t sample0, double t0, double wait0, dt_step_row_t *row) {
  double dt = dt_time_now() - t0, busy = dt - (dt_wd_wait_seconds() - wait0);
  double mean_loss = loss_sum / tr->accum, tmax = dt;
  dt_comm_t *w = tr->mesh.world;
  if (tr->mesh.pp > 1) /* the loss is known on the last stage (0 on the others) */
    DT_TRY(tr->mesh.pp_comm->ops->allreduce(tr->mesh.pp_comm, &mean_loss, &mean_loss, 1, DT_F64, DT_SUM, NULL, NULL));
  if (tr->mesh.size > 1) {
    DT_TRY(tr->mesh.dp_comm->ops->allreduce(tr->mesh.dp_comm, &mean_loss, &mean_loss, 1, DT_F64, DT_AVG, NULL, NULL));
    DT_TRY(w->ops->allreduce(w, &dt, &tmax, 1, DT_F64, DT_MAX, NULL, NULL));
  }
  double tokens = (double)tr->global_batch * tr->T;
  *row = (dt_step_row_t){.step = tr->step,
                         .loss = mean_loss,
                         .lr = lr,
                         .grad_norm = norm,
                         .ms = 1e3 * tmax,
                         .tok_per_s = tokens / tmax,
                         .gflops = tr->flops_per_token * tokens / tmax * 1e-9,
                         .val_loss = -1,
                         .sample0 = sample0,
                         .samples = tr->global_batch,
                         .tokens = (sample0 + (uint64_t)tr->global_batch) * (uint64_t)tr->T,
                         .loss_scale = tr->scaler.enabled ? scale : 0,
                         .skipped = skip};
  return dt_run_straggler(&tr->mesh, &tr->cfg, tr->step, busy, row); /* the slowest rank */
}

dt_status_t dt_trainer_step(dt_trainer_t *tr, dt_step_row_t *row) {
  dt_sync_t *sy = &tr->sync;
  double t0 = dt_time_now(), wait0 = dt_wd_wait_seconds(), loss_sum = 0, norm = 0;
  const float scale = tr->scaler.scale;
  const uint64_t sample0 = tr->sample_pos;
  const double lr = dt_lr_at(&tr->cfg, tr->step);
  int skip = 0;
  dt_wd_set_step(tr->step + 1);
  tr->be.loss_scale = scale; /* 1 unless fp16 */
  DT_TRY(sy->ops->begin_step(sy)); /* gradients zeroed */
  DT_TRY(microsteps(tr, sample0 + (uint64_t)tr->mesh.dp_idx * (uint64_t)tr->accum * (uint64_t)tr->B));
  DT_TRY(sy->ops->after_backward(sy)); /* gradients final over dp (and pp's tied wte) */
  DT_TRY(test_faults(tr, tr->step + 1));
  DT_TRY(global_norm(tr, &norm, &skip));               /* the host waits for backward here, */
  DT_TRY(dt_gpt2_loss_sum(&tr->model, &loss_sum)); /* so reading the losses costs no second wait */
  DT_TRY(update(tr, lr, norm, skip));
  tr->step++;
  tr->sample_pos += (uint64_t)tr->global_batch;
  tr->tokens_seen += (uint64_t)tr->global_batch * (uint64_t)tr->T;
  return step_row(tr, loss_sum, lr, norm, skip, scale, sample0, t0, wait0, row);
}

dt_status_t dt_trainer_eval(dt_trainer_t *tr, dt_data_t *d, int batches, double *loss) {
  dt_sync_t *sy = &tr->sync;
  DT_TRY(sy->ops->begin_eval(sy)); /* ZeRO-3: the pinned tensors */
  uint64_t avail = dt_data_num_samples(d) / (uint64_t)tr->B;
  if ((uint64_t)batches > avail) batches = (int)avail;
  if (batches < 1) return DT_ERR(DT_ERR_DATA, "validation data has fewer than micro_batch=%d samples", tr->B);
  double sum[2] = {0, 0};
  int rounds = (batches + tr->mesh.dp - 1) / tr->mesh.dp;
  const int s = tr->mesh.pp_idx, pp = tr->mesh.pp, last = s == pp - 1;
  const size_t n = (size_t)tr->B * tr->T * tr->lay.d.C;
  for (int k = 0; k < rounds; k++) {
    int j = k * tr->mesh.dp + tr->mesh.dp_idx, real = j < batches;
    if (!real && !sy->ops->collective_forward) break; /* ZeRO-3's gathers: every rank runs every round */
    DT_TRY(dt_data_batch_sequential(d, (uint64_t)(real ? j : 0), tr->B, tr->inputs, tr->targets));
    float l = 0; /* a padding round's loss, dropped; the real ones add up in the model's loss sum */
    /* the batch through the stages, forward only (one stage: the whole model) */
    if (s > 0) DT_TRY(dt_pipe_recv(&tr->pipe, tr->pp_recv, n, s - 1));
    DT_TRY(dt_gpt2_stage_forward(&tr->model, 0, tr->inputs, tr->targets, s > 0 ? tr->pp_recv : NULL, tr->B, tr->T,
                                 real ? NULL : &l, last ? NULL : tr->pp_send));
    if (!last) DT_TRY(dt_pipe_send(&tr->pipe, tr->pp_send, n, s + 1));
    DT_TRY(dt_pipe_flush(&tr->pipe));
    if (real && last) sum[1] += 1; /* the loss is the last stage's */
  }
  DT_TRY(dt_gpt2_loss_sum(&tr->model, &sum[0])); /* one read for all batches (0 off the last stage) */
  DT_TRY(sy->ops->end_eval(sy));
  if (pp > 1) DT_TRY(tr->mesh.pp_comm->ops->allreduce(tr->mesh.pp_comm, sum, sum, 2, DT_F64, DT_SUM, NULL, NULL));
  if (tr->mesh.dp > 1)
    DT_TRY(tr->mesh.dp_comm->ops->allreduce(tr->mesh.dp_comm, sum, sum, 2, DT_F64, DT_SUM, NULL, NULL));
  *loss = sum[0] / sum[1];
  return DT_OK;
}
