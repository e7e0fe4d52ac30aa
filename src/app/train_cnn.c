/* The image classifiers' training run (train_cnn.h). One step:
 *   lr = schedule(step); gradients zeroed
 *   for each micro-step: images = sampler(global index) (+ crop/flip); forward with batch norm
 *     synchronised over dp (model.sync_bn); backward
 *   gradients averaged over dp; norm = ||g||; clip; SGD or AdamW on every parameter; log
 * Data position as the token trainer's (train_step.c): step s consumes global samples
 * [s*G, (s+1)*G), dp rank r the slice [r*accum*B, (r+1)*accum*B), micro-step k its k-th B. */
#include "train_cnn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cnn_kernels.h"
#include "conv_winograd.h"
#include "dt_cuda.h"
#include "fault.h"
#include "gemm.h"
#include "optim.h"
#include "plan_cnn.h"
#include "run_loop.h"
#include "timer.h"
#include "train.h"
#include "watchdog.h"

int dt_cnn_trainer_wanted(const dt_config_t *cfg) { return strcmp(cfg->arch, "gpt2") != 0; }

static int is_root(const dt_cnn_trainer_t *tr) { return tr->mesh.rank == 0; }

/* Synchronised batch norm's sums over the dp group (cnn.h sync_sum). The fault bn_local keeps this
 * rank's own values (times dp, so the callers' division by dp gives them back) after joining the
 * sum, as a batch norm that is not synchronised would: validation/'s cnn check must catch it. */
static dt_status_t dp_sum(void *ctx, double *buf, int n) {
  dt_cnn_trainer_t *tr = ctx;
  dt_comm_t *c = tr->mesh.dp_comm;
  const double t0 = dt_time_now();
  dt_status_t st;
  if (!dt_fault("bn_local", tr->mesh.rank, tr->step + 1)) {
    st = c->ops->allreduce(c, buf, buf, (size_t)n, DT_F64, DT_SUM, NULL, NULL);
  } else {
    double *sum = malloc(sizeof(double) * (size_t)n);
    if (!sum) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
    st = c->ops->allreduce(c, buf, sum, (size_t)n, DT_F64, DT_SUM, NULL, NULL);
    for (int i = 0; i < n; i++)
      buf[i] *= tr->mesh.dp;
    free(sum);
  }
  tr->bn_wait += dt_time_now() - t0;
  tr->bn_sums++;
  return st;
}

/* Synchronised batch norm's price (model.sync_bn, dp > 1): every rank waits in each sum for the
 * slowest to arrive, so the step is the sum over the layers of the slowest rank's time, not the
 * slowest rank's sum over the layers. The ranks' mean wait per step estimates that price (the sums
 * themselves are a few microseconds); per-rank batch norm has no such waits. Collective. */
static dt_status_t report_bn_waits(dt_cnn_trainer_t *tr, int steps, FILE *out) {
  if (!tr->model.sync_sum || steps < 1) return DT_OK;
  dt_comm_t *c = tr->mesh.dp_comm;
  double sum[3] = {tr->bn_wait, (double)tr->bn_sums, tr->step_s}, most = tr->bn_wait;
  DT_TRY(c->ops->allreduce(c, sum, sum, 3, DT_F64, DT_SUM, NULL, NULL));
  DT_TRY(c->ops->allreduce(c, &most, &most, 1, DT_F64, DT_MAX, NULL, NULL));
  if (!is_root(tr)) return DT_OK;
  const double dp = tr->mesh.dp, wait = sum[0] / dp / steps, step = sum[2] / dp / steps;
  fprintf(out,
          "# batch norm: synchronised over dp = %d, %.0f sums a step; waiting in them for the slower ranks %.1f ms a "
          "step (the ranks' mean; at most %.1f), %.1f%% of the %.1f ms step: what synchronising costs here "
          "(model.sync_bn = false has no such waits)\n",
          tr->mesh.dp, sum[1] / dp / steps, 1e3 * wait, 1e3 * most / steps, 100 * wait / step, 1e3 * step);
  return DT_OK;
}

dt_status_t dt_cnn_open_set(dt_images_t *d, const dt_config_t *c, const char *images, const char *labels) {
  if (!strcmp(c->format, "idx")) return dt_images_open_idx(d, images, labels, c->classes);
  return dt_images_open_cifar(d, images, c->classes);
}

/* Training (and validation) images, normalised with the training set's per-channel statistics. */
static dt_status_t open_data(dt_cnn_trainer_t *tr) {
  const dt_config_t *c = &tr->cfg;
  double mean[DT_IMAGES_MAX_C], std[DT_IMAGES_MAX_C];
  DT_TRY(dt_cnn_open_set(&tr->train, c, c->train, c->train_labels));
  dt_images_stats(&tr->train, mean, std);
  dt_images_set_norm(&tr->train, mean, std);
  DT_TRY(dt_images_set_order(&tr->train, c->shuffle, c->seed));
  dt_images_set_augment(&tr->train, c->crop_pad, c->flip, c->seed);
  if (!c->val[0]) return DT_OK;
  DT_TRY(dt_cnn_open_set(&tr->val, c, c->val, c->val_labels));
  tr->have_val = 1;
  dt_images_set_norm(&tr->val, mean, std);
  if (tr->val.C != tr->train.C || tr->val.H != tr->train.H || tr->val.W != tr->train.W)
    return DT_ERR(DT_ERR_DATA, "%s: images of %dx%dx%d, the training set's are %dx%dx%d", tr->val.what, tr->val.C,
                  tr->val.H, tr->val.W, tr->train.C, tr->train.H, tr->train.W);
  return DT_OK;
}

/* Multiply-adds x 2 per image of the convolutions and linear layers, x 3 for forward + backward. */
static double flops_per_image(const dt_cnn_t *m) {
  double f = 0;
  for (int i = 0; i < m->n_ops; i++) {
    const dt_cnn_op_t *o = &m->ops[i];
    const dt_cnn_slot_t *y = &m->slots[i + 1];
    if (o->kind == DT_OP_CONV) f += 2.0 * o->OC * o->C * o->K * o->K * y->H * y->W;
    if (o->kind == DT_OP_LINEAR) f += 2.0 * o->C * o->OC;
  }
  return 3 * f;
}

/* tr->arena: ck's tensors with one group per tensor (d.L = n_tensors - 2, as a layout has d.L + 2
 * groups) and d.T = 1 (the backend's micro-batch bound; the images have no sequence). */
static dt_status_t arena_layout(dt_cnn_trainer_t *tr) {
  const dt_layout_t *c = &tr->ck;
  dt_layout_t *a = &tr->arena;
  const int n = c->n_tensors;
  if (n < 2) return DT_ERR(DT_ERR_INTERNAL, "model: %d parameter tensors (at least 2 expected)", n);
  *a = *c;
  a->tensors = malloc(sizeof *a->tensors * (size_t)n);
  a->layer_begin = malloc(sizeof *a->layer_begin * (size_t)(n + 1));
  if (!a->tensors || !a->layer_begin) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  memcpy(a->tensors, c->tensors, sizeof *a->tensors * (size_t)n);
  for (int t = 0; t < n; t++) a->layer_begin[t] = t ? c->tensors[t].offset : 0;
  a->layer_begin[n] = c->n_params;
  a->d.L = n - 2;
  a->d.T = 1;
  return DT_OK;
}

/* ZeRO-3's gathers around each parameter tensor's use (cnn.h layer_hook): tensor t is the sync
 * strategy's block t - 1 (the arena layout has one group per tensor); tensor 0, the first
 * convolution, is its pinned group, gathered for a whole step. */
static dt_status_t cnn_zero3_hook(void *ctx, int t, dt_hook_phase_t phase) {
  dt_cnn_trainer_t *tr = ctx;
  return t > 0 ? tr->zero3_hook(tr->zero3_ctx, t - 1, phase) : DT_OK;
}

/* The sync strategy on the backend's arenas; ZeRO-3 hooked into the model. Its
 * blocks are the parameter tensors 1 .. P-1; the running statistics after them are kept whole on
 * every rank (each updates them from the same synchronised statistics). */
static dt_status_t attach_sync(dt_cnn_trainer_t *tr) {
  if (!tr->sync.ops->params_sharded) return dt_sync_attach(&tr->sync, NULL, NULL);
  DT_TRY(dt_sync_attach(&tr->sync, &tr->zero3_hook, &tr->zero3_ctx));
  dt_zero3_bound(&tr->sync.zero, tr->model.lay.n_tensors - 1, tr->model.lay.n_params);
  tr->model.layer_hook = cnn_zero3_hook;
  tr->model.hook_ctx = tr;
  return DT_OK;
}

/* ZeRO-3 after the initial weights or a resume filled every rank's whole arena: only this rank's
 * shard of the parameters stays (and of their working copy: bf16, fp16). */
static dt_status_t shard_params(dt_cnn_trainer_t *tr) {
  return tr->sync.ops->params_sharded ? dt_zero3_shard(&tr->sync.zero) : DT_OK;
}

/* The arenas (system.backend's; tr->be.ops chosen) and the sync strategy over them: parallel.zero
 * over the dp group (ZeRO pads the arena's end to dp equal shards and keeps m, v of this rank's
 * shard). A device backend also gets host copies of the arenas (initial weights, checkpoints). */
static dt_status_t init_arenas(dt_cnn_trainer_t *tr) {
  const dt_config_t *c = &tr->cfg;
  DT_TRY(arena_layout(tr));
  DT_TRY(dt_sync_init(&tr->sync, c->zero, tr->mesh.dp_comm, tr->mesh.dp, tr->mesh.dp_idx, tr->accum, &tr->arena,
                      &tr->be, (size_t)c->bucket_mb << 20));
  tr->sync.probe_every = c->ddp_probe;
  tr->sync.ddp_comm = dt_sync_ddp_comm(c->ddp_comm);
  if (tr->sync.ops->optim_sharded)
    DT_TRY(dt_ckpt_ranges_add_flat(&tr->zero_optim, &tr->ck, tr->be.opt_lo, tr->be.opt_hi));
  const dt_backend_ops_t *ops = tr->be.ops;
  tr->be.device = tr->mesh.device; /* the CUDA backend's init does cudaSetDevice(device) */
  tr->be.tf32 = c->tf32;
  tr->be.cudnn_conv = !strcmp(c->conv, "cudnn");
  tr->be.cudnn_bn = !strcmp(c->batchnorm, "cudnn") && !ops->host_memory;
  tr->be.cudnn_pool = !strcmp(c->pool, "cudnn") && !ops->host_memory;
  if (tr->be.cudnn_bn && tr->model.sync_sum)
    return DT_ERR(DT_ERR_CONFIG,
                  "%s: system.batchnorm = cudnn computes each rank's statistics; with dp = %d set "
                  "model.sync_bn = false, or keep system.batchnorm = own (synchronised batch norm)",
                  tr->cfg_name, tr->mesh.dp);
  /* the CUDA backend's per-row host buffers are for B rows (the loss); the CPU's need none */
  DT_TRY(ops->init(&tr->be, &tr->arena, ops->host_memory ? 1 : tr->B, 1, tr->mesh.threads));
  tr->bufs = tr->be.params + tr->model.lay.n_params;
  dt_precision_t prec = DT_PREC_FP32;
  if (dt_precision_parse(c->precision, &prec) != 0)
    return DT_ERR(DT_ERR_CONFIG, "%s: train.precision: '%s' is not one of fp32|bf16|fp16", tr->cfg_name, c->precision);
  DT_TRY(tr->be.ops->set_precision(&tr->be, prec)); /* bf16, fp16: the working copy be.wparams */
  dt_scaler_init(&tr->scaler, prec == DT_PREC_FP16, c->loss_scale_init, c->loss_scale_window);
  DT_TRY(attach_sync(tr)); /* after set_precision: ZeRO-3 gathers the working copy */
  if (!ops->host_memory && !(tr->host = calloc(tr->arena.n_params + 2 * dt_backend_opt_floats(&tr->be), sizeof(float))))
    return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  return DT_OK;
}

/* The parameters forward and backward read: the fp32 master, or (bf16, fp16) its rounded working
 * copy, rounded now from the master (the running statistics stay in the master's arena); under
 * ZeRO-3 the sync strategy rounds this rank's shard of it and the gathers bring the rest. */
static dt_status_t working_params(dt_cnn_trainer_t *tr, const float **w) {
  dt_backend_t *be = &tr->be;
  if (be->wparams != be->params && !be->wparams_by_sync)
    DT_TRY(be->k->round_copy(be, be->wparams, be->params, tr->model.lay.n_params));
  *w = be->wparams;
  return DT_OK;
}

dt_status_t dt_cnn_model_config(const dt_config_t *c, const dt_images_t *train, dt_cnn_config_t *mc) {
  *mc = (dt_cnn_config_t){.C = train->C, .H = train->H, .W = train->W, .classes = c->classes, .width = c->width,
                          .hidden = c->hidden, .zero_init_residual = c->zero_init_residual};
  DT_TRY(dt_cnn_arch_parse(c->arch, &mc->arch));
  if (!mc->width) mc->width = mc->arch == DT_CNN_SIMPLE ? 32 : 64;
  return DT_OK;
}

static dt_status_t init_model(dt_cnn_trainer_t *tr) {
  dt_cnn_config_t mc;
  DT_TRY(dt_cnn_model_config(&tr->cfg, &tr->train, &mc));
  DT_TRY(dt_cnn_build(&tr->model, &mc));
  if (tr->mesh.dp > 1 && tr->cfg.sync_bn) {
    tr->model.sync_sum = dp_sum;
    tr->model.sync_ctx = tr;
    tr->model.sync_ranks = tr->mesh.dp;
  }
  DT_TRY(dt_cnn_trainer_ckpt_layout(tr));
  DT_TRY(init_arenas(tr));
  DT_TRY(dt_cnn_alloc(&tr->model, &tr->be, tr->B));
  tr->x = malloc(sizeof(float) * (size_t)tr->B * mc.C * mc.H * mc.W);
  tr->y = malloc(sizeof(int) * (size_t)tr->B);
  if (!tr->x || !tr->y) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  /* the same on every rank; a device backend's through its host copy */
  float *p = tr->host ? tr->host : tr->be.params;
  dt_cnn_init_params(&tr->model, p, p + tr->model.lay.n_params, tr->cfg.seed);
  if (tr->host) DT_TRY(tr->be.ops->copy_from_host(&tr->be, DT_BUF_PARAMS, 0, tr->arena.n_params, tr->host));
  tr->flops_per_image = flops_per_image(&tr->model);
  return DT_OK;
}

dt_status_t dt_cnn_trainer_init(dt_cnn_trainer_t *tr, const dt_config_t *cfg, const char *cfg_name) {
  memset(tr, 0, sizeof *tr);
  tr->cfg = *cfg;
  tr->cfg_name = cfg_name;
  const dt_backend_ops_t *ops = NULL;
  int devices = 0;
  DT_TRY(dt_train_pick_backend(cfg, cfg_name, &ops, &devices));
  tr->be.ops = ops;
  const int cuda = !ops->host_memory; /* a device backend: GPUs assigned per rank (mesh.h) */
  dt_mesh_opts_t mo = {.cuda = cuda, .runtime_devices = cuda ? devices : -1, .threads = cfg->threads, .dp = cfg->dp,
                       .tp = 1, .pp = 1, .args = cfg_name,
                       .device_comm_mpi = !strcmp(cfg->device_comm, "mpi")};
  DT_TRY(dt_mesh_init(&tr->mesh, &mo)); /* also sets the rank's OpenMP threads (our sgemm's split included) */
  DT_TRY(dt_gemm_init());      /* DT_GEMM=auto|own|blas, a bad value reported now */
  DT_TRY(dt_conv_algo_init()); /* DT_CONV=auto|im2col|winograd2|winograd4, likewise */
  int dp = 0;
  DT_TRY(dt_train_batch_plan(cfg, cfg_name, tr->mesh.size, &dp, &tr->accum));
  tr->B = cfg->micro_batch;
  tr->global_batch = tr->B * tr->accum * dp;
  tr->saved_step = tr->resumed_step = -1;
  DT_TRY(open_data(tr));
  DT_TRY(init_model(tr));
  DT_TRY(dt_cnn_trainer_resume(tr));
  DT_TRY(shard_params(tr));
  tr->first_step = tr->step;
  if (tr->be.comm_stream && tr->mesh.dp > 1) /* device gradients: NCCL (or staged MPI) over dp */
    DT_TRY(dt_train_device_comm(cfg, tr->mesh.device, tr->mesh.dp_comm, &tr->dev_dp_comm));
  /* DDP's buckets over the gradient arena */
  DT_TRY(dt_sync_start(&tr->sync, tr->dev_dp_comm ? tr->dev_dp_comm : tr->mesh.dp_comm, NULL));
  if (is_root(tr) || strstr(cfg->metrics, "{rank}")) DT_TRY(dt_metrics_open_rank(&tr->metrics, cfg->metrics, tr->mesh.rank));
  tr->metrics.images = 1;
  return DT_OK;
}

/* SGD (torch.optim.SGD) or AdamW (torch.optim.AdamW) on the parameters of the optimizer range
 * (ZeRO: this rank's shard; never the batch norm statistics above the parameters), the gradient
 * scaled by `scale` first (the clipping factor over fp16's loss scale); m, v hold the range (m[i -
 * lo] for arena offset i); AdamW's step count leaves out the steps fp16 skipped. */
static dt_status_t update(dt_cnn_trainer_t *tr, double lr, float scale) {
  const dt_config_t *c = &tr->cfg;
  dt_backend_t *be = &tr->be;
  const size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0, np = tr->model.lay.n_params;
  size_t hi = lo + dt_backend_opt_floats(be);
  if (hi > np) hi = np;
  const size_t n = hi > lo ? hi - lo : 0;
  float *p = be->params + lo, *g = be->grads + lo;
  const float flr = (float)lr, wd = (float)c->weight_decay, mom = (float)c->momentum;
  const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps;
  const float t = (float)(tr->step - tr->scaler.skipped + 1), bc1 = 1.0f - powf(b1, t), bc2 = 1.0f - powf(b2, t);
  if (!strcmp(c->optimizer, "sgd")) return be->ops->cnn->sgd(be, p, g, be->m, n, scale, flr, mom, wd, c->nesterov);
  return be->ops->cnn->adamw(be, p, g, be->m, be->v, n, scale, flr, b1, b2, eps, wd, bc1, bc2);
}

/* Batch norm per rank (model.sync_bn = false, dp > 1): each rank's running statistics followed its
 * own batches; rank 0's go to every rank, as PyTorch DDP's broadcast_buffers does, so evaluation and
 * checkpoints (written in pieces by every rank) see one set. A device backend's over its gradients'
 * communicator on its stream. */
static dt_status_t broadcast_running_stats(dt_cnn_trainer_t *tr) {
  if (tr->mesh.dp < 2 || tr->cfg.sync_bn) return DT_OK;
  dt_comm_t *c = tr->dev_dp_comm ? tr->dev_dp_comm : tr->mesh.dp_comm;
  return c->ops->broadcast(c, tr->bufs, tr->model.bufs.n_params, DT_F32, 0, tr->dev_dp_comm ? tr->be.stream : NULL,
                           NULL);
}

/* The micro-batches of this rank's slice: forward (batch norm synchronised over dp), backward with
 * the sync strategy's gradient-ready hook (DDP's buckets on the last one, ZeRO-2's on each). */
static dt_status_t microsteps(dt_cnn_trainer_t *tr, uint64_t slice) {
  dt_cnn_t *m = &tr->model;
  dt_sync_t *sy = &tr->sync;
  const float *w;
  DT_TRY(working_params(tr, &w));
  if (dt_fault("slow_rank", tr->mesh.rank, tr->step + 1)) dt_fault_sleep(DT_FAULT_SLOW_RANK_S);
  for (int k = 0; k < tr->accum; k++) {
    dt_images_batch(&tr->train, slice + (uint64_t)k * tr->B, tr->B, tr->x, tr->y, NULL);
    DT_TRY(dt_cnn_forward(m, w, tr->bufs, tr->x, tr->y, 1, NULL, NULL)); /* the loss: read once per step */
    m->ready = sy->ops->backward_begin(sy, k, tr->accum);
    m->ready_ctx = &sy->ddp;
    /* fp16: the loss times the scale */
    dt_status_t st = dt_cnn_backward(m, w, tr->be.grads, tr->scaler.scale / ((float)tr->B * tr->accum));
    m->ready = NULL;
    DT_TRY(st);
    DT_TRY(m->sync_err);
    DT_TRY(sy->ops->backward_end(sy));
  }
  return DT_OK;
}

dt_status_t dt_cnn_trainer_step(dt_cnn_trainer_t *tr, dt_step_row_t *row) {
  dt_sync_t *sy = &tr->sync;
  const double t0 = dt_time_now(), wait0 = dt_wd_wait_seconds(), lr = dt_lr_at(&tr->cfg, tr->step);
  const uint64_t sample0 = tr->sample_pos, slice = sample0 + (uint64_t)tr->mesh.dp_idx * tr->accum * tr->B;
  dt_wd_set_step(tr->step + 1);
  double loss = 0, sumsq = 0, norm = 0;
  const float scale = tr->scaler.scale; /* 1 unless fp16 */
  int skip = 0;
  DT_TRY(sy->ops->begin_step(sy)); /* gradients zeroed */
  DT_TRY(microsteps(tr, slice));
  DT_TRY(sy->ops->after_backward(sy)); /* gradients final over dp (ZeRO: this rank's shard) */
  DT_TRY(tr->be.ops->grad_sumsq(&tr->be, &sumsq)); /* the host waits for backward here, */
  DT_TRY(dt_cnn_loss_sum(&tr->model, &loss));      /* so the losses' read costs no second wait */
  loss /= tr->accum;
  DT_TRY(dt_train_norm(sy, &tr->scaler, &tr->mesh, tr->step + 1, sumsq, &norm, &skip));
  if (!skip) DT_TRY(update(tr, lr, dt_clip_scale(norm, tr->cfg.grad_clip) / scale));
  DT_TRY(sy->ops->after_update(sy, skip)); /* ZeRO: the parameters whole again */
  DT_TRY(broadcast_running_stats(tr));
  dt_train_scaler_step(&tr->scaler, skip, tr->step + 1, is_root(tr));
  tr->step++;
  tr->sample_pos += (uint64_t)tr->global_batch;
  double dt = dt_time_now() - t0, tmax = dt, busy = dt - (dt_wd_wait_seconds() - wait0);
  tr->step_s += dt;
  dt_comm_t *dpc = tr->mesh.dp_comm;
  if (tr->mesh.size > 1) {
    DT_TRY(dpc->ops->allreduce(dpc, &loss, &loss, 1, DT_F64, DT_AVG, NULL, NULL));
    DT_TRY(tr->mesh.world->ops->allreduce(tr->mesh.world, &dt, &tmax, 1, DT_F64, DT_MAX, NULL, NULL));
  }
  *row = (dt_step_row_t){.step = tr->step,
                         .loss = loss,
                         .lr = lr,
                         .grad_norm = norm,
                         .ms = 1e3 * tmax,
                         .tok_per_s = tr->global_batch / tmax,
                         .gflops = tr->flops_per_image * tr->global_batch / tmax * 1e-9,
                         .val_loss = -1,
                         .val_acc = -1,
                         .sample0 = sample0,
                         .samples = tr->global_batch,
                         .epoch = (double)tr->sample_pos / tr->train.n,
                         .loss_scale = tr->scaler.enabled ? scale : 0,
                         .skipped = skip};
  return dt_run_straggler(&tr->mesh, &tr->cfg, tr->step, busy, row); /* the slowest rank */
}

dt_status_t dt_cnn_trainer_eval(dt_cnn_trainer_t *tr, double *loss, double *acc) {
  dt_cnn_t *m = &tr->model;
  const int n = tr->val.n, batches = (n + tr->B - 1) / tr->B;
  double sum[3] = {0, 0, 0}; /* loss x images, correct, images */
  const float *w;
  dt_sync_t *sy = &tr->sync;
  DT_TRY(working_params(tr, &w));
  DT_TRY(sy->ops->begin_eval(sy)); /* ZeRO-3: the pinned tensor */
  const int dp = tr->mesh.dp, rounds = (batches + dp - 1) / dp;
  for (int r = 0; r < rounds; r++) { /* round r: batch r * dp + dp_idx on each rank */
    const int real = r * dp + tr->mesh.dp_idx < batches, j = real ? r * dp + tr->mesh.dp_idx : 0;
    if (!real && !sy->ops->collective_forward) break; /* ZeRO-3's gathers: every rank runs every round */
    int b = n - j * tr->B < tr->B ? n - j * tr->B : tr->B, correct = 0;
    m->B = b; /* a smaller last batch fits in the memory of B images */
    dt_images_batch_sequential(&tr->val, j * tr->B, b, tr->x, tr->y);
    double l = 0;
    dt_status_t st = dt_cnn_forward(m, w, tr->bufs, tr->x, tr->y, 0, &l, &correct);
    m->B = tr->B;
    DT_TRY(st);
    if (!real) continue; /* a forward for the gathers only */
    sum[0] += l * b;
    sum[1] += correct, sum[2] += b;
  }
  DT_TRY(sy->ops->end_eval(sy));
  dt_comm_t *dpc = tr->mesh.dp_comm;
  if (tr->mesh.dp > 1) DT_TRY(dpc->ops->allreduce(dpc, sum, sum, 3, DT_F64, DT_SUM, NULL, NULL));
  *loss = sum[0] / sum[2];
  *acc = sum[1] / sum[2];
  return DT_OK;
}

static void print_header(void *t) {
  const dt_cnn_trainer_t *tr = t;
  const dt_config_t *c = &tr->cfg;
  const dt_cnn_config_t *mc = &tr->model.cfg;
  printf("# dtrain %s\n", tr->cfg_name);
  printf("# model: %s, images %dx%dx%d, %d classes, width %d, %zu parameters (%.2f M), %zu batch-norm buffers\n",
         c->arch, mc->C, mc->H, mc->W, mc->classes, mc->width, tr->model.lay.n_params_true,
         tr->model.lay.n_params_true * 1e-6, tr->model.bufs.n_params_true);
  printf("# batch: micro_batch=%d x grad_accum=%d x dp=%d = %d images per step%s\n", tr->B, tr->accum, tr->mesh.dp,
         tr->global_batch, tr->mesh.dp < 2 ? "" : c->sync_bn ? "; batch norm synchronised over dp" :
         "; batch norm per rank (model.sync_bn = false), rank 0's running statistics broadcast after every step");
  if (tr->mesh.dp > 1 || c->zero > 0)
    printf("# gradients: %s over dp=%d (parallel.zero = %d), %d buckets of at most %d MiB during backward%s%s\n",
           tr->sync.ops->name, tr->mesh.dp, c->zero, tr->sync.ddp.n_buckets, c->bucket_mb,
           dt_sync_transport(&tr->sync)[0] ? ", " : "", dt_sync_transport(&tr->sync));
  printf("# data: %s: %d images (an epoch: %.1f steps); normalised by mean", tr->train.what, tr->train.n,
         (double)tr->train.n / tr->global_batch);
  for (int k = 0; k < tr->train.C; k++) printf(" %.4f", tr->train.mean[k]);
  printf(", std");
  for (int k = 0; k < tr->train.C; k++) printf(" %.4f", tr->train.std[k]);
  printf("; crop padding %d, flips %s\n", c->crop_pad, c->flip ? "on" : "off");
  if (tr->have_val) printf("# validation: %s: %d images\n", tr->val.what, tr->val.n);
  if (!strcmp(c->optimizer, "sgd"))
    printf("# optimizer: SGD, momentum %g%s, weight decay %g\n", c->momentum, c->nesterov ? " (Nesterov)" : "",
           c->weight_decay);
  else
    printf("# optimizer: AdamW, betas %g %g, eps %g, weight decay %g\n", c->beta1, c->beta2, c->eps, c->weight_decay);
  if (tr->be.ops->host_memory)
    printf("# backend: cpu (src/backend/ops_cnn_cpu.c), %d threads per rank, matmul: %s; 3x3 convolutions: %s\n",
           tr->mesh.threads, dt_gemm_engine_name(), dt_conv_algo_name());
  else
    printf("# backend: %s (cuda/backend_cuda_cnn.cu), device %d, matmul: %s%s\n", tr->be.ops->name, tr->mesh.device,
           tr->be.ops->engine(&tr->be), tr->be.cudnn_conv ? "" : "; convolutions: im2col + cuBLAS (ours)");
  if (tr->be.ops->host_memory && strcmp(c->conv, "own"))
    printf("# note: system.conv = %s has no effect on the %s backend (its own convolutions)\n", c->conv,
           tr->be.ops->name);
  if (tr->be.ops->host_memory && strcmp(c->batchnorm, "own"))
    printf("# note: system.batchnorm = %s has no effect on the %s backend (its own batch norm)\n", c->batchnorm,
           tr->be.ops->name);
  if (tr->be.ops->host_memory && strcmp(c->pool, "own"))
    printf("# note: system.pool = %s has no effect on the %s backend (its own pooling)\n", c->pool, tr->be.ops->name);
  dt_train_print_precision(stdout, (dt_precision_t)tr->be.precision, &tr->scaler);
  printf("# FLOPs per image (forward + backward: 3 x 2 x the convolutions' and linear layers' multiply-adds) = %.4g\n",
         tr->flops_per_image);
}

/* dt_run_loop's view of the trainer (run_loop.h) */
static dt_status_t run_step(void *t, dt_step_row_t *row) { return dt_cnn_trainer_step(t, row); }
static dt_status_t run_save(void *t) { return dt_cnn_trainer_save(t); }
static dt_status_t run_eval(void *t, dt_step_row_t *row) {
  return dt_cnn_trainer_eval(t, &row->val_loss, &row->val_acc);
}

dt_status_t dt_cnn_trainer_run(dt_cnn_trainer_t *tr) {
  const dt_config_t *c = &tr->cfg;
  dt_run_loop_t L = {.t = tr, .cfg = c, .mesh = &tr->mesh, .metrics = &tr->metrics, .step = &tr->step,
                     .step_fn = run_step, .eval_fn = tr->have_val ? run_eval : NULL, .save_fn = run_save,
                     .header_fn = print_header};
  DT_TRY(dt_run_loop(&L, &tr->stopped_by_signal));
  if (is_root(tr)) tr->sync.ops->report(&tr->sync, tr->step - tr->first_step, stdout); /* communication hidden */
  DT_TRY(report_bn_waits(tr, tr->step - tr->first_step, stdout));
  if (tr->stopped_by_signal) return DT_OK;
  if (is_root(tr)) { /* the peak so far against the planner's (plan_cnn.c) */
    static dt_plan_cnn_t p;
    double dev_used = 0;
    dt_plan_cnn_compute(&p, c, &tr->model, &tr->train, tr->have_val ? &tr->val : NULL, tr->mesh.dp, tr->accum,
                        tr->mesh.threads);
    if (tr->be.ops->host_memory) dt_plan_cnn_print_rss(&p, stdout);
    else if (tr->mesh.device >= 0 && dt_cuda_mem_used(tr->mesh.device, &dev_used) == DT_OK)
      dt_plan_cnn_print_device(&p, dev_used, stdout);
  }
  /* the final state is always saved, unless it is already on disk */
  if (tr->saved_step != tr->step && tr->resumed_step != tr->step) DT_TRY(dt_cnn_trainer_save(tr));
  return DT_OK;
}

void dt_cnn_trainer_free(dt_cnn_trainer_t *tr) {
  dt_metrics_close(&tr->metrics);
  dt_sync_free(&tr->sync);
  dt_ckpt_ranges_free(&tr->zero_optim);
  dt_cnn_free(&tr->model); /* its memory is the backend's: before the backend goes */
  if (tr->dev_dp_comm) tr->dev_dp_comm->ops->free(tr->dev_dp_comm);
  if (tr->be.ops && tr->be.impl) tr->be.ops->free(&tr->be);
  free(tr->host);
  free(tr->x), free(tr->y);
  dt_layout_free(&tr->arena);
  dt_layout_free(&tr->ck);
  dt_images_close(&tr->train);
  if (tr->have_val) dt_images_close(&tr->val);
  dt_mesh_free(&tr->mesh);
}
