/* The trainer's set-up and tear-down: the launch layout and batch, the backend, the model, the sync
 * strategy (sync.h), the pipeline's buffers and communicators, data, weights (train_ckpt.c).
 * The step is in train_step.c, the run loop and its reports in train_run.c. */
#include "train_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "dt_build.h"
#include "dt_cuda.h"
#include "mpi_check.h"
#include "watchdog.h"

/* A device backend's communicator over the ranks of an MPI one: NCCL, or (system.device_comm =
 * mpi) MPI staged through host memory. */
dt_status_t dt_train_device_comm(const dt_config_t *cfg, int device, dt_comm_t *mpi, dt_comm_t **out) {
  MPI_Comm h;
  DT_TRY(dt_comm_mpi_handle(mpi, &h));
  if (!strcmp(cfg->device_comm, "mpi")) return dt_comm_staged_create(&h, out);
  return dt_comm_nccl_create(&h, device, dt_wd_timeout(), out);
}

static dt_status_t device_comm_over(dt_trainer_t *tr, dt_comm_t *mpi, dt_comm_t **out) {
  return dt_train_device_comm(&tr->cfg, tr->mesh.device, mpi, out);
}

/* parallel.micro_batches is another name for train.grad_accum (config.c checks they agree). */
static int config_accum(const dt_config_t *c) { return c->grad_accum > 0 ? c->grad_accum : c->micro_batches; }

dt_status_t dt_train_batch_plan(const dt_config_t *c, const char *name, int world, int *dp, int *accum) {
  *dp = c->dp;
  DT_TRY(dt_mesh_resolve(world, dp, c->tp, c->pp));
  if (c->global_batch > 0) {
    if (c->global_batch % (c->micro_batch * *dp) != 0)
      return DT_ERR(DT_ERR_CONFIG,
                    "%s: train.global_batch: %d is not a multiple of micro_batch*dp = %d*%d (dp from %d ranks)", name,
                    c->global_batch, c->micro_batch, *dp, world);
    *accum = c->global_batch / (c->micro_batch * *dp);
    if (config_accum(c) > 0 && config_accum(c) != *accum)
      return DT_ERR(DT_ERR_CONFIG, "%s: %s: %d disagrees with global_batch/(micro_batch*dp) = %d", name,
                    c->grad_accum > 0 ? "train.grad_accum" : "parallel.micro_batches", config_accum(c), *accum);
  } else {
    *accum = config_accum(c) > 0 ? config_accum(c) : 1;
  }
  return DT_OK;
}


static dt_status_t derive_batch(dt_trainer_t *tr) {
  int dp = 0;
  DT_TRY(dt_train_batch_plan(&tr->cfg, tr->cfg_name, tr->mesh.size, &dp, &tr->accum));
  tr->B = tr->cfg.micro_batch;
  tr->T = tr->cfg.seq_len;
  tr->global_batch = tr->B * tr->accum * dp;
  return DT_OK;
}

/* Collective over MPI_COMM_WORLD: the same verdict on every rank. */
dt_status_t dt_train_pick_backend(const dt_config_t *cfg, const char *cfg_name, const dt_backend_ops_t **ops,
                                  int *devices) {
  static int noted; /* the auto fallback note, once per process */
  int rank = 0, size = 1;
  DT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  DT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  *devices = dt_cuda_device_count();
  /* the lowest rank without a GPU tells the others its host and reason */
  int mine = *devices == 0 ? rank : size, first = size;
  DT_MPI_CHECK(dt_wd_allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, "allreduce (backend choice)"));
  struct {
    char host[64], why[192];
  } b;
  memset(&b, 0, sizeof b);
  if (first < size) {
    if (rank == first) {
      snprintf(b.host, sizeof b.host, "%s", dt__hostname());
      snprintf(b.why, sizeof b.why, "%s", dt_cuda_device_error());
    }
    DT_MPI_CHECK(dt_wd_bcast(&b, (int)sizeof b, MPI_BYTE, first, MPI_COMM_WORLD, "broadcast (backend choice)"));
  }
  if (!strcmp(cfg->backend, "cpu")) {
    *ops = dt_backend_find("cpu");
    return DT_OK;
  }
  if (!strcmp(cfg->backend, "cuda")) {
    *ops = dt_backend_find("cuda");
    if (!*ops)
      return DT_ERR(DT_ERR_UNSUPPORTED, "%s: system.backend: 'cuda' is not built into this dtrain (configure --with-cuda)",
                    cfg_name);
    if (first < size)
      return DT_ERR(DT_ERR_LAUNCH, "%s: system.backend = cuda but rank %d (host %s) has no usable GPU (%s); use cpu or auto",
                    cfg_name, first, b.host, b.why);
    return DT_OK;
  }
  *ops = first == size ? dt_backend_find("cuda") : dt_backend_find("cpu");
  if (!*ops) *ops = dt_backend_find("cpu"); /* auto in a build without CUDA: quietly the CPU */
  int cuda_built = dt_backend_find("cuda") != NULL;
  if (cuda_built && first < size && rank == 0 && !noted)
    fprintf(stderr, "dtrain: system.backend = auto: rank %d (host %s) has no usable GPU (%s): using the CPU backend\n",
            first, b.host, b.why);
  noted = 1;
  return DT_OK;
}

dt_status_t dt_trainer_init_model(dt_trainer_t *tr, const dt_config_t *cfg, const char *cfg_name) {
  memset(tr, 0, sizeof *tr);
  tr->cfg = *cfg;
  tr->cfg_name = cfg_name;
  const dt_backend_ops_t *ops = NULL;
  int devices = 0;
  DT_TRY(dt_train_pick_backend(cfg, cfg_name, &ops, &devices));
  int cuda = !ops->host_memory; /* a device backend: GPUs assigned per rank (mesh.h) */
  dt_mesh_opts_t mo = {.cuda = cuda, .runtime_devices = cuda ? devices : -1, .threads = cfg->threads,
                       .dp = cfg->dp, .tp = cfg->tp, .pp = cfg->pp, .args = cfg_name,
                       .device_comm_mpi = !strcmp(cfg->device_comm, "mpi")};
  DT_TRY(dt_mesh_init(&tr->mesh, &mo));
  DT_TRY(derive_batch(tr));
  dt_dims_t d = dt_dims_from_config(&tr->cfg);
  DT_TRY(dt_layout_init_mp(&tr->lay, d, tr->mesh.tp, tr->mesh.tp_idx, tr->mesh.pp, tr->mesh.pp_idx,
                           dt_pp_balance_of(cfg)));
  tr->be.ops = ops;
  tr->be.device = tr->mesh.device; /* the CUDA backend's init does cudaSetDevice(device) */
  tr->be.tf32 = cfg->tf32;
  tr->be.flash = !strcmp(cfg->attention, "flash");
  tr->be.cudnn_att = !strcmp(cfg->attention, "cudnn");
  DT_TRY(dt_sync_init(&tr->sync, cfg->zero, tr->mesh.dp_comm, tr->mesh.dp, tr->mesh.dp_idx, tr->accum, &tr->lay,
                      &tr->be, (size_t)cfg->bucket_mb << 20));
  tr->sync.probe_every = cfg->ddp_probe;
  tr->sync.ddp_comm = dt_sync_ddp_comm(cfg->ddp_comm);
  tr->be.sparse = dt_sync_sparse(&tr->sync); /* ZeRO-2/3 device arenas: memory only where in use */
  if (tr->sync.ops->optim_sharded && tr->lay.tp == 1 && tr->lay.pp <= 1) /* tp, pp: host_arenas clips the boxes */
    DT_TRY(dt_ckpt_ranges_add_flat(&tr->zero_optim, &tr->lay, tr->be.opt_lo, tr->be.opt_hi));
  DT_TRY(ops->init(&tr->be, &tr->lay, tr->B, tr->T, tr->mesh.threads));
  dt_precision_t prec = DT_PREC_FP32; /* before the model: the precision decides the activation storage */
  if (dt_precision_parse(cfg->precision, &prec) != 0)
    return DT_ERR(DT_ERR_CONFIG, "%s: train.precision: '%s' is not one of fp32|bf16|fp16", cfg_name, cfg->precision);
  tr->be.store16 = cuda && !strcmp(cfg->store16, "auto");
  DT_TRY(ops->set_precision(&tr->be, prec));
  /* 1F1B's micro-batches in flight: one activation set each */
  DT_TRY(dt_gpt2_init(&tr->model, &tr->be, dt_pp_inflight(tr->mesh.pp_idx, tr->mesh.pp, tr->accum), cfg->recompute));
  tr->model.tp_comm = tr->mesh.tp > 1 ? tr->mesh.tp_comm : NULL;
  if (cuda && tr->mesh.tp > 1) { /* the model's tp all-reduces are on device buffers */
    DT_TRY(device_comm_over(tr, tr->mesh.tp_comm, &tr->dev_tp_comm));
    tr->model.tp_comm = tr->dev_tp_comm;
  }
  if (tr->mesh.pp > 1) { /* transfers, and the first + last stage group of the tied embedding */
    const int s = tr->mesh.pp_idx, pp = tr->mesh.pp;
    dt_comm_t *c = tr->mesh.pp_comm;
    DT_TRY(c->ops->split(c, s == 0 || s == pp - 1 ? 0 : 1, s, &tr->tied_comm));
    MPI_Comm th; /* named for the hang watchdog's line, as the mesh's are */
    if (dt_comm_mpi_handle(tr->tied_comm, &th) == DT_OK) MPI_Comm_set_name(th, "tied");
    tr->pipe = (dt_pipe_t){.comm = c, .esz = (size_t)tr->be.act_bytes};
    size_t bytes = (size_t)tr->be.act_bytes * tr->B * tr->T * tr->lay.d.C; /* activation storage */
    if (cuda) { /* device buffers sent on the compute stream (NCCL or staged MPI); the tied sum too */
      DT_TRY(device_comm_over(tr, c, &tr->dev_pp_comm));
      if (s == 0 || s == pp - 1) DT_TRY(device_comm_over(tr, tr->tied_comm, &tr->dev_tied_comm));
      tr->pipe = (dt_pipe_t){.comm = tr->dev_pp_comm, .stream = tr->be.stream, .esz = (size_t)tr->be.act_bytes};
      DT_TRY(tr->be.k->alloc(&tr->be, &tr->pp_send, bytes));
      DT_TRY(tr->be.k->alloc(&tr->be, &tr->pp_recv, bytes));
    } else {
      tr->pp_send = malloc(bytes);
      tr->pp_recv = malloc(bytes);
    }
    if (!tr->pp_send || !tr->pp_recv) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  }
  /* the micro-step order: 1F1B for this stage (with one stage: forward, backward, forward, ...) */
  tr->pp_ops = malloc(sizeof *tr->pp_ops * 2 * (size_t)tr->accum);
  if (!tr->pp_ops) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  dt_pp_schedule(tr->mesh.pp_idx, tr->mesh.pp, tr->accum, tr->pp_ops);
  /* ZeRO-3: blocks gathered around their use */
  DT_TRY(dt_sync_attach(&tr->sync, &tr->model.layer_hook, &tr->model.hook_ctx));
  dt_scaler_init(&tr->scaler, prec == DT_PREC_FP16, cfg->loss_scale_init, cfg->loss_scale_window);
  if (cuda) { /* host copies of params, m, v for checkpoints */
    tr->host_arena = malloc(3 * sizeof(float) * tr->lay.n_params);
    if (!tr->host_arena) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  }
  tr->inputs = malloc(sizeof(int) * (size_t)tr->B * (size_t)tr->T);
  tr->targets = malloc(sizeof(int) * (size_t)tr->B * (size_t)tr->T);
  if (!tr->inputs || !tr->targets) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  tr->flops_per_token = dt_model_flops_per_token(&tr->lay.d, tr->T);
  return DT_OK;
}

dt_status_t dt_trainer_init(dt_trainer_t *tr, const dt_config_t *cfg, const char *cfg_name) {
  DT_TRY(dt_trainer_init_model(tr, cfg, cfg_name));
  DT_TRY(dt_data_open(&tr->train, cfg->train, cfg->vocab_size, tr->T, cfg->shuffle, cfg->seed));
  if (cfg->val[0]) DT_TRY(dt_data_open(&tr->val, cfg->val, cfg->vocab_size, tr->T, 0, cfg->seed));
  tr->saved_step = -1;
  tr->resumed_step = -1;
  DT_TRY(dt_trainer_load_weights(tr)); /* from a checkpoint, or initial weights (train_ckpt.c) */
  dt_comm_t *grad_comm = tr->mesh.dp_comm, *tied = NULL;
  if (tr->be.comm_stream && tr->mesh.dp > 1) { /* device gradients: NCCL (or staged MPI) over dp */
    DT_TRY(device_comm_over(tr, tr->mesh.dp_comm, &tr->dev_dp_comm));
    grad_comm = tr->dev_dp_comm;
  }
  if (tr->mesh.pp > 1 && (tr->mesh.pp_idx == 0 || tr->mesh.pp_idx == tr->mesh.pp - 1)) /* the device one if any */
    tied = tr->dev_tied_comm ? tr->dev_tied_comm : tr->tied_comm;
  DT_TRY(dt_sync_start(&tr->sync, grad_comm, tied));
  if (is_root(tr) || strstr(cfg->metrics, "{rank}")) DT_TRY(dt_metrics_open_rank(&tr->metrics, cfg->metrics, tr->mesh.rank));
  return DT_OK;
}

void dt_trainer_free(dt_trainer_t *tr) {
  dt_metrics_close(&tr->metrics);
  dt_sync_free(&tr->sync);
  dt_ckpt_ranges_free(&tr->zero_optim);
  if (tr->dev_dp_comm) tr->dev_dp_comm->ops->free(tr->dev_dp_comm);
  if (tr->dev_tp_comm) tr->dev_tp_comm->ops->free(tr->dev_tp_comm);
  if (tr->dev_pp_comm) tr->dev_pp_comm->ops->free(tr->dev_pp_comm);
  if (tr->dev_tied_comm) tr->dev_tied_comm->ops->free(tr->dev_tied_comm);
  if (tr->tied_comm) tr->tied_comm->ops->free(tr->tied_comm);
  if (tr->be.ops && !tr->be.ops->host_memory) { /* device buffers */
    if (tr->pp_send) tr->be.k->release(&tr->be, tr->pp_send);
    if (tr->pp_recv) tr->be.k->release(&tr->be, tr->pp_recv);
  } else {
    free(tr->pp_send);
    free(tr->pp_recv);
  }
  free(tr->pp_ops);
  free(tr->host_arena);
  free(tr->inputs);
  free(tr->targets);
  if (tr->train) dt_data_close(tr->train);
  if (tr->val) dt_data_close(tr->val);
  dt_gpt2_free(&tr->model);
  if (tr->be.ops) tr->be.ops->free(&tr->be);
  dt_layout_free(&tr->lay);
  dt_mesh_free(&tr->mesh);
}

