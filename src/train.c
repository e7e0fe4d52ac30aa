/* Training loop. One optimizer step reads like the algorithm:
 *   lr = schedule(step); zero grads
 *   for each micro-step: batch = sampler(global index); forward; backward (+ overlapped all-reduce)
 *   finish all-reduce; norm = ||g||; clip; AdamW; log
 * Data position: step s consumes global samples [s*G, (s+1)*G), G = global_batch; dp rank r takes
 * the contiguous slice [r*accum*B, (r+1)*accum*B) of it, micro-step k the k-th B of that slice,
 * so the set of samples per step does not depend on dp. */
#include "train.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <mpi.h>

#include "ckpt.h"
#include "dt_build.h"
#include "dt_cuda.h"
#include "fault.h"
#include "mpi_check.h"
#include "ops_cpu.h"
#include "optim.h"
#include "plan.h"
#include "straggler.h"
#include "timer.h"
#include "watchdog.h"

static volatile sig_atomic_t signal_flag = 0;

static void on_signal(int sig) { signal_flag = sig; }

void dt_train_install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int dt_train_signal_pending(void) { return signal_flag; }

static int is_root(const dt_trainer_t *tr) { return tr->mesh.rank == 0; }

/* Sum of the parameter arena's bytes as 64-bit words: cheap, order-independent fingerprint. */
static uint64_t params_fingerprint(const float *p, size_t n) {
  uint64_t h = 0;
  const uint32_t *u = (const uint32_t *)p;
  for (size_t i = 0; i < n; i++) h += (uint64_t)u[i] * (2 * (uint64_t)i + 1);
  return h;
}

/* Identical initial weights on every rank: rank 0 initialises, broadcasts, all verify. With tensor
 * parallelism every rank initialises its own shard of the same global model (dt_model_init_params
 * draws the tp = 1 numbers and keeps the owned ones), and the dp replicas of a shard verify. */
static dt_status_t init_weights(dt_trainer_t *tr, float *host) {
  dt_comm_t *w = tr->mesh.world;
  size_t n = tr->lay.n_params;
  if (tr->lay.tp > 1 || tr->lay.pp > 1) { /* each rank its own part; its dp replicas verify */
    w = tr->mesh.dp_comm;
    dt_model_init_params(&tr->lay, host, tr->cfg.seed);
  } else {
    if (is_root(tr)) dt_model_init_params(&tr->lay, host, tr->cfg.seed);
    DT_TRY(w->ops->broadcast(w, host, n, DT_F32, 0, NULL, NULL));
  }
  uint64_t fp = params_fingerprint(host, n), lo = fp, hi = fp;
  int64_t v[2] = {(int64_t)fp, -(int64_t)fp}, r[2];
  DT_TRY(w->ops->allreduce(w, v, r, 2, DT_I64, DT_MAX, NULL, NULL));
  lo = (uint64_t)(-r[1]);
  hi = (uint64_t)r[0];
  if (lo != hi || hi != fp)
    return DT_ERR(DT_ERR_INTERNAL, "rank %d: initial weights differ between ranks after broadcast", tr->mesh.rank);
  return host == tr->be.params ? DT_OK : tr->be.ops->copy_from_host(&tr->be, DT_BUF_PARAMS, 0, n, host);
}

/* A device backend's NCCL communicator over the ranks of an MPI one. */
static dt_status_t nccl_over(dt_trainer_t *tr, dt_comm_t *mpi, dt_comm_t **out) {
  MPI_Comm h;
  DT_TRY(dt_comm_mpi_handle(mpi, &h));
  return dt_comm_nccl_create(&h, tr->mesh.device, dt_wd_timeout(), out);
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

static dt_status_t be_zero(dt_trainer_t *tr) { return tr->be.ops->zero_grad(&tr->be); }

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
                       .dp = cfg->dp, .tp = cfg->tp, .pp = cfg->pp, .args = cfg_name};
  DT_TRY(dt_mesh_init(&tr->mesh, &mo));
  DT_TRY(derive_batch(tr));
  dt_dims_t d = dt_dims_from_config(&tr->cfg);
  DT_TRY(dt_layout_init_mp(&tr->lay, d, tr->mesh.tp, tr->mesh.tp_idx, tr->mesh.pp, tr->mesh.pp_idx,
                           dt_pp_balance_of(cfg)));
  tr->be.ops = ops;
  tr->be.device = tr->mesh.device; /* the CUDA backend's init does cudaSetDevice(device) */
  tr->be.tf32 = cfg->tf32;
  if (cuda && cfg->zero > 1) /* stages 2 and 3 give pages of host arenas back (zero.h) */
    return DT_ERR(DT_ERR_UNSUPPORTED, "%s: parallel.zero = %d is implemented on the cpu backend only (the cuda backend "
                  "has ZeRO-1)", cfg_name, cfg->zero);
  if (cfg->zero > 0) { /* pad the arena's end so it splits into dp equal shards; m, v: the shard only */
    size_t n, lo, hi;
    dt_zero_split(tr->lay.n_params, tr->mesh.dp, tr->mesh.dp_idx, DT_ALIGN, &n, &lo, &hi);
    tr->lay.n_params = n;
    tr->lay.layer_begin[tr->lay.d.L + 2] = n;
    tr->be.opt_lo = lo;
    tr->be.opt_hi = hi;
    DT_TRY(dt_zero_init(&tr->zero, cfg->zero, tr->mesh.dp_comm, tr->mesh.dp_idx, n, (size_t)cfg->bucket_mb << 20));
    if (tr->lay.tp == 1 && tr->lay.pp <= 1) /* tp, pp: host_arenas clips the shard boxes */
      DT_TRY(dt_ckpt_ranges_add_flat(&tr->zero_optim, &tr->lay, lo, hi));
  }
  DT_TRY(ops->init(&tr->be, &tr->lay, tr->B, tr->T, tr->mesh.threads));
  /* 1F1B's micro-batches in flight: one activation set each */
  DT_TRY(dt_gpt2_init(&tr->model, &tr->be, dt_pp_inflight(tr->mesh.pp_idx, tr->mesh.pp, tr->accum), cfg->recompute));
  tr->model.tp_comm = tr->mesh.tp > 1 ? tr->mesh.tp_comm : NULL;
  if (cuda && tr->mesh.tp > 1) { /* the model's tp all-reduces are on device buffers: NCCL */
    DT_TRY(nccl_over(tr, tr->mesh.tp_comm, &tr->dev_tp_comm));
    tr->model.tp_comm = tr->dev_tp_comm;
  }
  if (tr->mesh.pp > 1) { /* transfers, and the first + last stage group of the tied embedding */
    const int s = tr->mesh.pp_idx, pp = tr->mesh.pp;
    dt_comm_t *c = tr->mesh.pp_comm;
    DT_TRY(c->ops->split(c, s == 0 || s == pp - 1 ? 0 : 1, s, &tr->tied_comm));
    MPI_Comm th; /* named for the hang watchdog's line, as the mesh's are */
    if (dt_comm_mpi_handle(tr->tied_comm, &th) == DT_OK) MPI_Comm_set_name(th, "tied");
    tr->pipe = (dt_pipe_t){.comm = c};
    size_t bytes = sizeof(float) * (size_t)tr->B * tr->T * tr->lay.d.C;
    if (cuda) { /* device buffers sent over NCCL on the compute stream; the tied wte's sum too */
      DT_TRY(nccl_over(tr, c, &tr->dev_pp_comm));
      if (s == 0 || s == pp - 1) DT_TRY(nccl_over(tr, tr->tied_comm, &tr->dev_tied_comm));
      tr->pipe = (dt_pipe_t){.comm = tr->dev_pp_comm, .stream = tr->be.stream};
      DT_TRY(tr->be.k->alloc(&tr->be, (void **)&tr->pp_send, bytes));
      DT_TRY(tr->be.k->alloc(&tr->be, (void **)&tr->pp_recv, bytes));
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
  if (tr->zero.stage == 3) { /* FSDP: blocks gathered around their use (zero.h) */
    DT_TRY(dt_zero3_attach(&tr->zero, tr->be.params, tr->lay.layer_begin, tr->lay.d.L));
    tr->model.layer_hook = dt_zero3_hook;
    tr->model.hook_ctx = &tr->zero;
  }
  dt_precision_t prec = DT_PREC_FP32;
  if (dt_precision_parse(cfg->precision, &prec) != 0)
    return DT_ERR(DT_ERR_CONFIG, "%s: train.precision: '%s' is not one of fp32|bf16|fp16", cfg_name, cfg->precision);
  DT_TRY(ops->set_precision(&tr->be, prec));
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

/* Free the checkpoint boxes host_arenas made (not the trainer's own zero_optim). */
static void arenas_release(dt_trainer_t *tr, dt_ckpt_arenas_t *a) {
  if (!a->optim.full && a->optim.r != a->model.r && a->optim.r != tr->zero_optim.r) dt_ckpt_ranges_free(&a->optim);
  if (!a->model.full && a->model.r != tr->zero_optim.r) dt_ckpt_ranges_free(&a->model);
}

/* Host views of the backend's arenas for checkpoints: the CPU backend's arenas themselves, or
 * for a device backend the host copies (filled from the device when fetch = 1; after a load,
 * push_arenas sends them back). */
static dt_status_t host_arenas(dt_trainer_t *tr, int with_optim, int fetch, dt_ckpt_arenas_t *a) {
  float *hp = tr->be.params, *hm = tr->be.m, *hv = tr->be.v;
  if (!tr->be.ops->host_memory) { /* the host copies, fetched from the device when saving */
    size_t n = tr->lay.n_params;
    hp = tr->host_arena, hm = hp + n, hv = hm + n;
    if (fetch) { /* m, v: the optimizer range (ZeRO: the shard), as the CPU backend holds them */
      size_t nopt = dt_backend_opt_floats(&tr->be);
      DT_TRY(tr->be.ops->copy_to_host(&tr->be, DT_BUF_PARAMS, 0, n, hp));
      if (with_optim) DT_TRY(tr->be.ops->copy_to_host(&tr->be, DT_BUF_M, 0, nopt, hm));
      if (with_optim) DT_TRY(tr->be.ops->copy_to_host(&tr->be, DT_BUF_V, 0, nopt, hv));
    }
  }
  *a = dt_ckpt_arenas_full(hp, with_optim ? hm : NULL, with_optim ? hv : NULL);
  if (tr->zero.stage > 0) a->optim = tr->zero_optim; /* m, v hold this rank's shard only */
  if (tr->zero.stage == 3) { /* and the parameters too (their arena is full-size: offset it) */
    a->params = hp + tr->zero.lo;
    a->model = tr->zero_optim;
  }
  if (tr->lay.tp > 1 || tr->lay.pp > 1) { /* shards: load reads each rank's boxes; save writes each box
                                             once (replicated tensors from tp rank 0 of the first dp
                                             replica of each stage; wte from the first stage) */
    int load = !fetch, writer = tr->mesh.dp_idx == 0, rep = load || tr->mesh.tp_idx == 0;
    dt_ckpt_ranges_t r = {0};
    if (load || writer) DT_TRY(dt_ckpt_ranges_add_shards(&r, &tr->lay, rep, load));
    r.full = 0;
    a->model = r;
    a->optim = r; /* the same boxes (freed once, through model) */
    if (tr->zero.stage > 0) { /* m, v: the part of this tp shard's boxes in the rank's ZeRO range */
      dt_ckpt_ranges_t all = {0}, o = {0};
      dt_status_t st = dt_ckpt_ranges_add_shards(&all, &tr->lay, rep, load);
      if (st == DT_OK) st = dt_ckpt_ranges_clip(&o, &tr->lay, &all, tr->zero.lo, tr->zero.hi);
      dt_ckpt_ranges_free(&all);
      o.full = 0;
      a->optim = o;
      if (tr->zero.stage == 3) { /* the parameters: the same boxes, from every dp rank */
        dt_ckpt_ranges_free(&a->model);
        a->model = o;
        a->params = hp + tr->zero.lo;
      }
      if (st != DT_OK) arenas_release(tr, a);
      DT_TRY(st);
    }
  }
  return DT_OK;
}

static dt_status_t push_arenas(dt_trainer_t *tr) {
  if (tr->be.ops->host_memory) return DT_OK;
  size_t n = tr->lay.n_params;
  float *p = tr->host_arena, *m = p + n, *v = m + n;
  size_t nopt = dt_backend_opt_floats(&tr->be); /* ZeRO: m, v of the shard */
  DT_TRY(tr->be.ops->copy_from_host(&tr->be, DT_BUF_PARAMS, 0, n, p));
  DT_TRY(tr->be.ops->copy_from_host(&tr->be, DT_BUF_M, 0, nopt, m));
  return tr->be.ops->copy_from_host(&tr->be, DT_BUF_V, 0, nopt, v);
}

/* The precision a checkpoint was written with, from its effective ini (files without the key:
 * fp32). */
static dt_precision_t ckpt_precision(const char *ini) {
  dt_config_t c;
  dt_config_defaults(&c);
  dt_precision_t p = DT_PREC_FP32;
  if (!ini || dt_config_parse_text(&c, ini, "checkpoint config_ini") != DT_OK) {
    dt_err_clear();
    return p;
  }
  dt_precision_parse(c.precision, &p);
  return p;
}

/* Loss-scaler state from a checkpoint: scale and growth tracker only if it was written by an
 * fp16 run (else the scaler starts at loss_scale_init); the skipped-step count always (AdamW t). */
static void resume_scaler(dt_trainer_t *tr, const dt_ckpt_state_t *st) {
  tr->scaler.skipped = st->skipped_steps;
  if (!tr->scaler.enabled) return;
  if (ckpt_precision(st->ini) == DT_PREC_FP16 && st->loss_scale > 0) {
    tr->scaler.scale = (float)st->loss_scale;
    tr->scaler.growth = st->loss_scale_growth;
  } else if (is_root(tr)) {
    printf("# resume: the checkpoint is not from an fp16 run: loss scale starts at %g\n", tr->scaler.scale);
  }
}

/* The initial weights of a fresh start (model.h), the same on every rank. */
static dt_status_t initial_weights(dt_trainer_t *tr) {
  /* The CPU backend's parameter arena is host memory: initialise and broadcast in place (a
   * separate host buffer set every rank's peak RSS one arena higher than training needs). */
  int cpu = tr->be.ops->host_memory;
  if (tr->zero.stage == 3) /* each rank makes its own shard (the values of the full initialisation) */
    dt_model_init_params_range(&tr->lay, tr->be.params, tr->cfg.seed, tr->zero.lo, tr->zero.hi);
  float *host = cpu ? tr->be.params : malloc(sizeof(float) * tr->lay.n_params);
  if (!host) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  dt_status_t st = tr->zero.stage == 3 ? DT_OK : init_weights(tr, host);
  if (tr->zero.stage == 3) dt_zero3_release(&tr->zero, 0, tr->lay.n_params); /* tp init wrote its whole shard */
  if (!cpu) free(host);
  return st;
}

/* A load is the first to write the parameter arena's pages (no initial weights were drawn):
 * fault them in first, as drawing them did, so the load's time is reading, not the kernel
 * finding pages (measured on GPT-2 124M: the same whole resume time either way, 0.3 s less in
 * the load). Best effort: kernels before 5.14 refuse MADV_POPULATE_WRITE; the load faults them. */
static void populate_params(dt_trainer_t *tr) {
#ifdef MADV_POPULATE_WRITE
  if (!tr->be.ops->host_memory) return;
  size_t lo = tr->zero.stage == 3 ? tr->zero.lo : 0, hi = tr->zero.stage == 3 ? tr->zero.hi : tr->lay.n_params;
  const uintptr_t page = 4096, a = (uintptr_t)(tr->be.params + lo) / page * page, b = (uintptr_t)(tr->be.params + hi);
  if (b > a) (void)madvise((void *)a, (size_t)(b - a), MADV_POPULATE_WRITE);
#else
  (void)tr;
#endif
}

/* Restore parameters, moments and position per checkpoint.resume (auto | never | PATH), or,
 * with nothing to resume from, draw the initial weights. A resume does not draw them first: the
 * checkpoint replaces every value (GPT-2 124M: seconds of Gaussian draws saved per restart). A
 * failed load never falls back to a fresh start (dt_ckpt_load_latest), so the arenas are never
 * trained from half-loaded or undrawn values. */
static dt_status_t resume(dt_trainer_t *tr) {
  const char *r = tr->cfg.resume;
  if (!strcmp(r, "never")) return initial_weights(tr);
  dt_ckpt_arenas_t a;
  DT_TRY(host_arenas(tr, 1, 0, &a));
  dt_ckpt_state_t st;
  memset(&st, 0, sizeof st);
  char path[DT_PATH_MAX] = "";
  dt_status_t s;
  populate_params(tr);
  /* the load is collective: time it from when every rank is ready, so the time is the load's and
   * not the wait for the slowest rank's setup (that is in the whole start's time) */
  DT_TRY(tr->mesh.world->ops->barrier(tr->mesh.world));
  double t0 = dt_time_now();
  if (!strcmp(r, "auto")) {
    s = dt_ckpt_load_latest(NULL, tr->cfg.ckpt_dir, &tr->lay, &a, &st, path, sizeof path);
    if (s == DT_ERR_CKPT) { /* nothing usable: a fresh start */
      if (is_root(tr)) printf("# resume: no complete checkpoint in %s, starting from step 0\n", tr->cfg.ckpt_dir);
      dt_err_clear();
      arenas_release(tr, &a);
      return initial_weights(tr);
    }
  } else {
    snprintf(path, sizeof path, "%s", r);
    s = dt_ckpt_load(NULL, path, &tr->lay, &a, &st);
  }
  arenas_release(tr, &a);
  if (s != DT_OK) return s;
  DT_TRY(push_arenas(tr));
  tr->step = (int)st.step;
  tr->sample_pos = (uint64_t)st.data_pos;
  tr->tokens_seen = (uint64_t)st.tokens;
  tr->resumed_step = tr->step;
  resume_scaler(tr, &st);
  if (is_root(tr)) {
    printf("# resume: %s at step %d, sample %llu (written by dtrain %s, dp=%d tp=%d pp=%d; read in %.2f s)\n", path,
           tr->step, (unsigned long long)tr->sample_pos, st.version, st.dp, st.tp, st.pp, dt_time_now() - t0);
    if (tr->scaler.enabled || tr->scaler.skipped)
      printf("# resume: loss scale %g, %lld clean steps since the last overflow or growth, %lld steps skipped\n",
             tr->scaler.scale, (long long)tr->scaler.growth, (long long)tr->scaler.skipped);
    if (st.seed != tr->cfg.seed)
      printf("# resume: note: seed %llu differs from the checkpoint's %llu (data order changes)\n",
             (unsigned long long)tr->cfg.seed, (unsigned long long)st.seed);
  }
  dt_ckpt_state_free(&st);
  return DT_OK;
}

/* Tensor parallelism: the replicated tensors (layernorms, wpe, c_proj biases) must be bitwise equal
 * on every tp rank (they get equal gradients, gpt2.c); checked at every save, on the host view of
 * the parameters (params: the CPU arena, or a device backend's host copy just fetched). */
static dt_status_t check_replicated(dt_trainer_t *tr, const float *params) {
  if (tr->mesh.pp > 1 && (tr->mesh.pp_idx == 0 || tr->mesh.pp_idx == tr->mesh.pp - 1)) {
    /* the tied embedding: the first stage's wte and the last stage's copy (same gradients) */
    const dt_tensor_t *t = &tr->lay.tensors[0];
    uint64_t fp = params_fingerprint(params + t->offset, (size_t)t->rows * t->cols);
    int64_t v[2] = {(int64_t)fp, -(int64_t)fp}, r[2];
    DT_TRY(tr->tied_comm->ops->allreduce(tr->tied_comm, v, r, 2, DT_I64, DT_MAX, NULL, NULL));
    if ((uint64_t)r[0] != fp || (uint64_t)(-r[1]) != fp)
      return DT_ERR(DT_ERR_INTERNAL, "rank %d: step %d: the tied wte differs between the first and the last pipeline stage",
                    tr->mesh.rank, tr->step);
    if (tr->mesh.rank == (tr->mesh.pp - 1) * tr->mesh.tp) /* the last stage of replica 0, tp rank 0 */
      printf("# pp: step %d: the last stage's copy of wte is bitwise equal to the first stage's\n", tr->step);
  }
  if (tr->lay.tp == 1) return DT_OK;
  uint64_t fp = 0;
  int z3 = tr->zero.stage == 3; /* only this rank's ZeRO shard is current: compare it within the tp group */
  size_t lo = z3 ? tr->zero.lo : 0, hi = z3 ? tr->zero.hi : tr->lay.n_params;
  for (int i = 0; i < tr->lay.n_tensors; i++) {
    const dt_tensor_t *t = &tr->lay.tensors[i];
    size_t a = t->offset > lo ? t->offset : lo, e = t->offset + (size_t)t->rows * t->cols;
    if (e > hi) e = hi;
    if (!dt_tensor_sharded(t) && a < e)
      fp += params_fingerprint(params + a, e - a) * (uint64_t)(2 * i + 1);
  }
  int64_t v[2] = {(int64_t)fp, -(int64_t)fp}, r[2];
  /* equal on all ranks: dp replicas are identical too; with pp, stages hold different tensors */
  dt_comm_t *c = z3 || tr->mesh.pp > 1 ? tr->mesh.tp_comm : tr->mesh.world;
  DT_TRY(c->ops->allreduce(c, v, r, 2, DT_I64, DT_MAX, NULL, NULL));
  if ((uint64_t)r[0] != fp || (uint64_t)(-r[1]) != fp)
    return DT_ERR(DT_ERR_INTERNAL, "rank %d: step %d: replicated parameters differ between tensor-parallel ranks",
                  tr->mesh.rank, tr->step);
  if (is_root(tr))
    printf("# tp: step %d: replicated parameters bitwise equal on all %d tensor-parallel ranks\n", tr->step, tr->mesh.tp);
  return DT_OK;
}

dt_status_t dt_trainer_save(dt_trainer_t *tr) {
  dt_ckpt_arenas_t a;
  DT_TRY(host_arenas(tr, 1, 1, &a));
  dt_status_t c = check_replicated(tr, tr->be.ops->host_memory ? tr->be.params : tr->host_arena);
  if (c != DT_OK) arenas_release(tr, &a);
  DT_TRY(c);
  char *ini = dt_config_to_string(&tr->cfg);
  uint64_t n = dt_data_num_samples(tr->train);
  dt_ckpt_state_t st = {.step = tr->step, .tokens = (int64_t)tr->tokens_seen, .data_pos = (int64_t)tr->sample_pos,
                        .epoch = (int64_t)(tr->sample_pos / n), .seed = tr->cfg.seed, .loss_scale = tr->scaler.scale,
                        .loss_scale_growth = tr->scaler.growth, .skipped_steps = tr->scaler.skipped,
                        .dp = tr->mesh.dp, .tp = tr->mesh.tp, .pp = tr->mesh.pp, .ini = ini};
  char path[DT_PATH_MAX];
  double t0 = dt_time_now();
  dt_status_t s = dt_ckpt_save(NULL, tr->cfg.ckpt_dir, tr->cfg.ckpt_keep, &tr->lay, &a, &st, path, sizeof path);
  if (s == DT_OK && dt_fault_named("slow_io")) { /* test-only (fault.h): one rank's save lasts x100, all wait */
    if (dt_fault("slow_io", tr->mesh.rank, -1)) dt_fault_sleep((DT_FAULT_SLOW_IO_X - 1) * (dt_time_now() - t0));
    int one = 1;
    s = tr->mesh.world->ops->allreduce(tr->mesh.world, &one, &one, 1, DT_I32, DT_SUM, NULL, NULL);
  }
  arenas_release(tr, &a);
  free(ini);
  DT_TRY(s);
  tr->saved_step = tr->step;
  if (is_root(tr)) printf("# checkpoint: %s (step %d, %.2f s)\n", path, tr->step, dt_time_now() - t0);
  return DT_OK;
}

dt_status_t dt_trainer_init(dt_trainer_t *tr, const dt_config_t *cfg, const char *cfg_name) {
  DT_TRY(dt_trainer_init_model(tr, cfg, cfg_name));
  DT_TRY(dt_data_open(&tr->train, cfg->train, cfg->vocab_size, tr->T, cfg->shuffle, cfg->seed));
  if (cfg->val[0]) DT_TRY(dt_data_open(&tr->val, cfg->val, cfg->vocab_size, tr->T, 0, cfg->seed));
  tr->saved_step = -1;
  tr->resumed_step = -1;
  DT_TRY(resume(tr)); /* or, with nothing to resume from, initial weights */
  dt_comm_t *grad_comm = tr->mesh.dp_comm;
  if (tr->be.comm_stream && tr->mesh.dp > 1) { /* device gradients: NCCL over the dp group */
    DT_TRY(nccl_over(tr, tr->mesh.dp_comm, &tr->dev_dp_comm));
    grad_comm = tr->dev_dp_comm;
    if (tr->zero.stage == 1) /* ZeRO-1's reduce-scatter and all-gather on the compute stream */
      DT_TRY(dt_zero_use_device_comm(&tr->zero, tr->dev_dp_comm, tr->be.stream));
  }
  DT_TRY(dt_ddp_init(&tr->ddp, grad_comm, tr->be.grads, tr->lay.n_params, tr->lay.layer_begin, tr->lay.d.L + 2,
                     (size_t)cfg->bucket_mb << 20));
  tr->ddp.stream = tr->be.comm_stream;
  if (tr->zero.stage >= 2) {
    tr->ddp.action = dt_zero_reduce_bucket;
    tr->ddp.action_ctx = &tr->zero;
    const dt_tensor_t *w = &tr->lay.tensors[0];
    if (tr->mesh.pp > 1 && !w->absent) { /* the tied wte is summed between the stages first (step) */
      tr->ddp.hold_lo = w->offset;
      tr->ddp.hold_hi = w->offset + (size_t)w->rows * w->cols;
    }
  }
  if (tr->zero.stage == 3 && tr->mesh.dp > 1) { /* reference: every block gathered, blocking */
    DT_TRY(tr->mesh.dp_comm->ops->barrier(tr->mesh.dp_comm));
    double t0 = dt_time_now();
    for (int l = 0; l < tr->lay.d.L; l++) {
      DT_TRY(dt_zero3_gather(&tr->zero, tr->lay.layer_begin[l + 1], tr->lay.layer_begin[l + 2]));
      dt_zero3_release(&tr->zero, tr->lay.layer_begin[l + 1], tr->lay.layer_begin[l + 2]);
    }
    tr->t_gather_full = dt_time_now() - t0;
    tr->zero.t_wait = 0;
  }
  if (tr->mesh.dp > 1 && tr->zero.stage == 0) { /* reference: blocking all-reduces of every gradient */
    DT_TRY(be_zero(tr));
    DT_TRY(tr->be.ops->synchronize(&tr->be)); /* the zeros are in before the communicator reads them */
    DT_TRY(tr->mesh.dp_comm->ops->barrier(tr->mesh.dp_comm));
    double t0 = dt_time_now();
    for (int b = 0; b < tr->ddp.n_buckets; b++) { /* bucket by bucket: a single all-reduce of the whole
                                                      arena makes MPI allocate arena-sized temporaries */
      dt_bucket_t *k = &tr->ddp.buckets[b];
      DT_TRY(grad_comm->ops->allreduce(grad_comm, tr->be.grads + k->lo, tr->be.grads + k->lo, k->hi - k->lo, DT_F32,
                                       DT_AVG, tr->ddp.stream, NULL));
    }
    DT_TRY(tr->be.ops->synchronize(&tr->be));
    tr->t_allreduce_full = dt_time_now() - t0;
  }
  tr->straggler_t = malloc(sizeof(double) * 2 * (size_t)tr->mesh.size);
  if (!tr->straggler_t) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  if (is_root(tr) || strstr(cfg->metrics, "{rank}")) DT_TRY(dt_metrics_open_rank(&tr->metrics, cfg->metrics, tr->mesh.rank));
  return DT_OK;
}

void dt_trainer_free(dt_trainer_t *tr) {
  dt_metrics_close(&tr->metrics);
  dt_ddp_free(&tr->ddp);
  dt_ckpt_ranges_free(&tr->zero_optim);
  dt_zero_free(&tr->zero);
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
  free(tr->straggler_t);
  free(tr->inputs);
  free(tr->targets);
  if (tr->train) dt_data_close(tr->train);
  if (tr->val) dt_data_close(tr->val);
  dt_gpt2_free(&tr->model);
  if (tr->be.ops) tr->be.ops->free(&tr->be);
  dt_layout_free(&tr->lay);
  dt_mesh_free(&tr->mesh);
}

/* ZeRO-3: the embeddings and ln_f are used at both ends of forward and backward: gathered for a
 * whole step or evaluation (pinned_gather), dropped again after it (pinned_release); the blocks
 * come and go through the backend's layer hook (zero.h). No-ops otherwise. */
static dt_status_t pinned_gather(dt_trainer_t *tr) {
  if (tr->zero.stage != 3) return DT_OK;
  const size_t *g = tr->lay.layer_begin;
  int L = tr->lay.d.L;
  DT_TRY(dt_zero3_gather(&tr->zero, g[0], g[1]));
  return dt_zero3_gather(&tr->zero, g[L + 1], g[L + 2]);
}

static void pinned_release(dt_trainer_t *tr) {
  if (tr->zero.stage != 3) return;
  const size_t *g = tr->lay.layer_begin;
  int L = tr->lay.d.L;
  dt_zero3_release(&tr->zero, g[0], g[1]);
  dt_zero3_release(&tr->zero, g[L + 1], g[L + 2]);
}

/* One optimizer step's micro-batches: this stage's 1F1B operations (pipeline.h; with one stage
 * simply forward, backward, forward, ...). Every stage reads the micro-batch itself (the first
 * needs the tokens, the last the targets); with pp > 1 the activations and their gradients
 * travel through tr->pipe. The loss is known on the last stage only (added to *loss_sum there).
 * Data parallelism: the last backward reports gradient ranges to DDP; ZeRO-2: every backward
 * reduces its buckets to their owners. */
static dt_status_t microsteps(dt_trainer_t *tr, int ddp, uint64_t slice, double *loss_sum) {
  const int s = tr->mesh.pp_idx, pp = tr->mesh.pp, m = tr->accum, first = s == 0, last = s == pp - 1;
  const int z2 = tr->zero.stage >= 2;
  const size_t n = (size_t)tr->B * tr->T * tr->lay.d.C;
  tr->pipe.t_wait = 0;
  double t_step = dt_time_now();
  for (int i = 0; i < 2 * m; i++) {
    const dt_pp_op_t op = tr->pp_ops[i];
    const int slot = op.mb % tr->model.slots;
    double t0;
    if (op.fwd) {
      if (first) DT_TRY(dt_pipe_flush(&tr->pipe));
      else DT_TRY(dt_pipe_recv(&tr->pipe, tr->pp_recv, n, s - 1));
      DT_TRY(dt_data_batch(tr->train, slice + (uint64_t)op.mb * (uint64_t)tr->B, tr->B, tr->inputs, tr->targets));
      float loss = 0;
      t0 = dt_time_now();
      DT_TRY(dt_gpt2_stage_forward(&tr->model, slot, tr->inputs, tr->targets, first ? NULL : tr->pp_recv, tr->B,
                                   tr->T, &loss, last ? NULL : tr->pp_send));
      tr->t_pp_fwd += dt_time_now() - t0;
      if (last) *loss_sum += loss;
      else DT_TRY(dt_pipe_send(&tr->pipe, tr->pp_send, n, s + 1));
    } else {
      if (last) DT_TRY(dt_pipe_flush(&tr->pipe));
      else DT_TRY(dt_pipe_recv(&tr->pipe, tr->pp_recv, n, s + 1));
      t0 = dt_time_now();
      if (z2) dt_ddp_begin(&tr->ddp); /* ZeRO-2: every micro-batch's buckets to their owners */
      DT_TRY(dt_gpt2_stage_backward(&tr->model, slot, m, last ? NULL : tr->pp_recv, first ? NULL : tr->pp_send,
                                    ((op.mb == m - 1 && ddp) || z2) ? dt_ddp_ready : NULL, &tr->ddp));
      if (z2) DT_TRY(dt_ddp_finish(&tr->ddp));
      tr->t_pp_bwd += dt_time_now() - t0;
      if (!first) DT_TRY(dt_pipe_send(&tr->pipe, tr->pp_send, n, s - 1));
    }
  }
  DT_TRY(dt_pipe_flush(&tr->pipe));
  tr->t_pp_step += dt_time_now() - t_step;
  tr->n_pp_steps++;
  return DT_OK;
}

/* Pipeline parallelism: the first stage's wte and the last stage's copy each hold a partial
 * gradient (embedding / lm_head): both get the sum, so the two copies stay equal. */
static dt_status_t pp_tied_grads(dt_trainer_t *tr) {
  const int s = tr->mesh.pp_idx, pp = tr->mesh.pp;
  if (pp == 1 || (s != 0 && s != pp - 1)) return DT_OK;
  const dt_tensor_t *t = &tr->lay.tensors[0];
  float *g = tr->be.grads + t->offset;
  size_t n = (size_t)t->rows * t->cols, chunk = (size_t)tr->cfg.bucket_mb << 18; /* floats per bucket */
  dt_comm_t *c = tr->dev_tied_comm ? tr->dev_tied_comm : tr->tied_comm; /* device grads: NCCL */
  for (size_t lo = 0; lo < n; lo += chunk) /* bucket-sized: no MPI temporary of the whole embedding */
    DT_TRY(c->ops->allreduce(c, g + lo, g + lo, n - lo < chunk ? n - lo : chunk, DT_F32, DT_SUM, tr->be.stream, NULL));
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

/* Every log.straggler_every steps: each rank's step time outside communication waits, gathered
 * (one double per rank), into the row as min / median / max and the slowest rank (straggler.h). */
static dt_status_t straggler(dt_trainer_t *tr, double busy, dt_step_row_t *row) {
  int n = tr->mesh.size;
  if (n < 2 || !dt_straggler_due(tr->step, tr->cfg.straggler_every, tr->cfg.log_every)) return DT_OK;
  double *all = tr->straggler_t;
  DT_TRY(tr->mesh.world->ops->allgather(tr->mesh.world, &busy, all, 1, DT_F64, NULL, NULL));
  dt_straggler_t s;
  dt_straggler_stats(all, n, all + n, &s);
  row->slowest_rank = s.slowest;
  row->rank_ms_min = 1e3 * s.min, row->rank_ms_median = 1e3 * s.median, row->rank_ms_max = 1e3 * s.max;
  return DT_OK;
}

/* The gradients of a step made final everywhere: the dp all-reduce (DDP) has completed, pp's tied
 * wte copies are summed, ZeRO's shards hold their averaged gradients. */
static dt_status_t sync_grads(dt_trainer_t *tr, int ddp) {
  dt_backend_t *be = &tr->be;
  const int z2 = tr->zero.stage >= 2;
  if (ddp) {
    DT_TRY(dt_ddp_finish(&tr->ddp));
    tr->t_comm_wait_sum += tr->ddp.t_comm_wait;
    tr->n_timed_steps++;
  }
  /* the tied embedding's two partial gradients (pp > 1) are summed while every rank still holds
   * them whole: ZeRO cuts the first and last stage's arenas into different shards, so ZeRO-1
   * reduce-scatters after this and ZeRO-2 held the wte range back from its in-backward reductions */
  DT_TRY(pp_tied_grads(tr));
  if (z2 && tr->ddp.hold_hi > tr->ddp.hold_lo)
    DT_TRY(dt_zero_reduce_bucket(&tr->zero, be->grads, tr->ddp.hold_lo, tr->ddp.hold_hi));
  if (z2) dt_zero_average_shard(&tr->zero, be->grads);
  if (tr->zero.stage == 1) DT_TRY(dt_zero_reduce_grads(&tr->zero, be->grads)); /* this rank's shard, averaged */
  return DT_OK;
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
  *skip = 0;
  if (tr->scaler.enabled) DT_TRY(dt_scaler_agree(&tr->scaler, tr->mesh.world, tr->mesh.rank, sumsq, skip));
  if (tr->zero.stage > 0 && !*skip) /* shard sums of squares -> the global norm's */
    DT_TRY(tr->mesh.dp_comm->ops->allreduce(tr->mesh.dp_comm, &sumsq, &sumsq, 1, DT_F64, DT_SUM, NULL, NULL));
  *norm = sqrt(sumsq) / tr->scaler.scale; /* of the unscaled gradients (exact: scale is a power of two) */
  if (!*skip && !isfinite(*norm))
    return DT_ERR(DT_ERR_NUMERIC, "rank %d: step %d: gradient norm is %g", tr->mesh.rank, tr->step + 1, *norm);
  return DT_OK;
}

/* AdamW (clipped to grad_clip; the loss scale folded into the factor) unless skipped, ZeRO's
 * parameter gather, the loss scaler's update and its message. */
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
    if (tr->zero.stage == 1 || tr->zero.stage == 2) DT_TRY(dt_zero_gather_params(&tr->zero, be->params));
  }
  dt_scaler_update(&tr->scaler, skip);
  pinned_release(tr); /* ZeRO-3: other ranks updated their parts of them */
  if (tr->scaler.enabled && is_root(tr) && (skip || tr->scaler.scale != scale))
    printf("# step %d: %s: loss scale %g -> %g\n", tr->step + 1,
           skip ? "inf/NaN gradients on some rank, update skipped" : "no overflow for loss_scale_window steps", scale,
           tr->scaler.scale);
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
  *row = (dt_step_row_t){.step = tr->step, .loss = mean_loss, .lr = lr, .grad_norm = norm, .ms = 1e3 * tmax,
                         .tok_per_s = tokens / tmax, .gflops = tr->flops_per_token * tokens / tmax * 1e-9,
                         .val_loss = -1, .sample0 = sample0, .samples = tr->global_batch,
                         .tokens = (sample0 + (uint64_t)tr->global_batch) * (uint64_t)tr->T,
                         .loss_scale = tr->scaler.enabled ? scale : 0, .skipped = skip, .slowest_rank = -1};
  return straggler(tr, busy, row);
}

dt_status_t dt_trainer_step(dt_trainer_t *tr, dt_step_row_t *row) {
  dt_backend_t *be = &tr->be;
  double t0 = dt_time_now(), wait0 = dt_wd_wait_seconds();
  dt_wd_set_step(tr->step + 1);
  uint64_t sample0 = tr->sample_pos;
  double lr = dt_lr_at(&tr->cfg, tr->step);
  if (tr->zero.stage >= 2) dt_zero_drop(be->grads, 0, tr->lay.n_params); /* zero, and RSS back */
  else DT_TRY(be->ops->zero_grad(be));
  be->loss_scale = tr->scaler.scale; /* 1 unless fp16 */
  const float scale = tr->scaler.scale;
  int ddp = tr->mesh.dp > 1 && tr->zero.stage == 0; /* ZeRO-1 reduce-scatters after the last backward instead */
  DT_TRY(pinned_gather(tr));
  if (ddp) dt_ddp_begin(&tr->ddp);
  double loss_sum = 0, norm = 0;
  uint64_t slice = tr->sample_pos + (uint64_t)tr->mesh.dp_idx * (uint64_t)tr->accum * (uint64_t)tr->B;
  DT_TRY(microsteps(tr, ddp, slice, &loss_sum));
  DT_TRY(sync_grads(tr, ddp));
  DT_TRY(test_faults(tr, tr->step + 1));
  int skip = 0;
  DT_TRY(global_norm(tr, &norm, &skip));
  DT_TRY(update(tr, lr, norm, skip));
  tr->step++;
  tr->sample_pos += (uint64_t)tr->global_batch;
  tr->tokens_seen += (uint64_t)tr->global_batch * (uint64_t)tr->T;
  return step_row(tr, loss_sum, lr, norm, skip, scale, sample0, t0, wait0, row);
}

dt_status_t dt_trainer_eval(dt_trainer_t *tr, dt_data_t *d, int batches, double *loss) {
  DT_TRY(pinned_gather(tr));
  uint64_t avail = dt_data_num_samples(d) / (uint64_t)tr->B;
  if ((uint64_t)batches > avail) batches = (int)avail;
  if (batches < 1) return DT_ERR(DT_ERR_DATA, "validation data has fewer than micro_batch=%d samples", tr->B);
  double sum[2] = {0, 0};
  int rounds = (batches + tr->mesh.dp - 1) / tr->mesh.dp;
  const int s = tr->mesh.pp_idx, pp = tr->mesh.pp, last = s == pp - 1;
  const size_t n = (size_t)tr->B * tr->T * tr->lay.d.C;
  for (int k = 0; k < rounds; k++) {
    int j = k * tr->mesh.dp + tr->mesh.dp_idx, real = j < batches;
    if (!real && tr->zero.stage != 3) break; /* ZeRO-3's forward gathers collectively: every rank runs each round */
    DT_TRY(dt_data_batch_sequential(d, (uint64_t)(real ? j : 0), tr->B, tr->inputs, tr->targets));
    float l = 0;
    /* the batch through the stages, forward only (one stage: the whole model) */
    if (s > 0) DT_TRY(dt_pipe_recv(&tr->pipe, tr->pp_recv, n, s - 1));
    DT_TRY(dt_gpt2_stage_forward(&tr->model, 0, tr->inputs, tr->targets, s > 0 ? tr->pp_recv : NULL, tr->B, tr->T, &l,
                                 last ? NULL : tr->pp_send));
    if (!last) DT_TRY(dt_pipe_send(&tr->pipe, tr->pp_send, n, s + 1));
    DT_TRY(dt_pipe_flush(&tr->pipe));
    if (!real || !last) continue; /* the loss is the last stage's */
    sum[0] += l;
    sum[1] += 1;
  }
  pinned_release(tr);
  if (pp > 1) DT_TRY(tr->mesh.pp_comm->ops->allreduce(tr->mesh.pp_comm, sum, sum, 2, DT_F64, DT_SUM, NULL, NULL));
  if (tr->mesh.dp > 1)
    DT_TRY(tr->mesh.dp_comm->ops->allreduce(tr->mesh.dp_comm, sum, sum, 2, DT_F64, DT_SUM, NULL, NULL));
  *loss = sum[0] / sum[1];
  return DT_OK;
}

static void print_header(dt_trainer_t *tr) {
  const dt_dims_t *d = &tr->lay.d;
  FILE *o = stdout;
  fprintf(o, "# dtrain %s\n", tr->cfg_name);
  fprintf(o, "# model: L=%d NH=%d C=%d V=%d (padded %d) T=%d, %zu parameters (%.2f M)\n", d->L, d->NH, d->C, d->V,
          d->Vp, d->T, tr->lay.n_params_true, tr->lay.n_params_true * 1e-6);
  fprintf(o, "# batch: micro_batch=%d x grad_accum=%d x dp=%d = %d sequences = %d tokens per step\n", tr->B,
          tr->accum, tr->mesh.dp, tr->global_batch, tr->global_batch * tr->T);
  fprintf(o, "# data: %s: %d shards, %llu tokens, %llu samples of T+1\n", tr->cfg.train,
          dt_data_num_shards(tr->train), (unsigned long long)dt_data_num_tokens(tr->train),
          (unsigned long long)dt_data_num_samples(tr->train));
  fprintf(o, "# backend: %s, %d threads per rank, matmul: %s\n", tr->be.ops->name, tr->mesh.threads,
          tr->be.ops->engine(&tr->be));
  if (tr->cfg.tf32 && tr->be.ops->host_memory)
    fprintf(o, "# note: system.tf32 = true has no effect on the %s backend (fp32 matmuls)\n", tr->be.ops->name);
  if (tr->be.precision != DT_PREC_FP32)
    fprintf(o, "# precision: %s weights/activations/activation gradients, fp32 master weights and accumulation%s\n",
            dt_precision_name((dt_precision_t)tr->be.precision),
            tr->scaler.enabled ? "; dynamic loss scaling (GradScaler rule)" : "");
  if (tr->scaler.enabled)
    fprintf(o, "# loss scale: %g, x2 after %d clean steps, x0.5 and skip on inf/NaN (agreed over all ranks)\n",
            tr->scaler.scale, tr->scaler.interval);
  fprintf(o, "# FLOPs per token = 6*(12*L*C^2 + C*Vp) + 12*L*T*C = %.4g (fwd+bwd, full TxT attention)\n",
          tr->flops_per_token);
}

/* Pipeline bubble: each stage's mean forward, backward and micro-step-loop time per step (over
 * pp_comm, collective), the idle share they imply, 1F1B's prediction for equal stages and the
 * schedule simulated with these stages' own compute times (pipeline.h). Rank 0 prints. */
static dt_status_t pp_report(dt_trainer_t *tr) {
  const int pp = tr->mesh.pp, m = tr->accum, n = tr->n_pp_steps;
  double mine[3] = {tr->t_pp_fwd / n, tr->t_pp_bwd / n, tr->t_pp_step / n}, *all = malloc(sizeof(double) * 3 * pp),
         *tf = malloc(sizeof(double) * 2 * pp);
  if (!all || !tf) {
    free(all);
    free(tf);
    return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  }
  dt_status_t st = tr->mesh.pp_comm->ops->allgather(tr->mesh.pp_comm, mine, all, 3, DT_F64, NULL, NULL);
  if (st == DT_OK && is_root(tr)) {
    double *tb = tf + pp, idle = 0;
    char line[2048];
    int k = 0;
    for (int s = 0; s < pp; s++) {
      const double *x = all + 3 * s;
      tf[s] = x[0] / m, tb[s] = x[1] / m;
      idle += 1.0 - (x[0] + x[1]) / x[2];
      if (k < (int)sizeof line - 96)
        k += snprintf(line + k, sizeof line - (size_t)k, "%s s%d %.1f/%.1f/%.1f", s ? "," : "", s, 1e3 * x[0], 1e3 * x[1],
                      1e3 * x[2]);
    }
    double T = dt_pp_simulate(pp, m, tf, tb, NULL), sim = 0;
    for (int s = 0; s < pp; s++) sim += 1.0 - m * (tf[s] + tb[s]) / T;
    printf("# pp: 1F1B over %d stages x %d micro-batches, ms per step forward/backward/whole micro-step loop:%s\n", pp,
           m, line);
    printf("# pp: bubble (idle share of the micro-step loop, mean over stages) %.1f%% measured; 1F1B predicts "
           "(pp-1)/(m+pp-1) = %.1f%% for equal stages, %.1f%% for these stages' measured compute times\n",
           100.0 * idle / pp, 100.0 * dt_pp_bubble(pp, m), T > 0 ? 100.0 * sim / pp : -1.0);
  }
  free(all);
  free(tf);
  return st;
}

dt_status_t dt_trainer_run(dt_trainer_t *tr) {
  const dt_config_t *c = &tr->cfg;
  if (is_root(tr)) {
    printf("# effective configuration:\n");
    dt_config_write(c, stdout, "#   ");
    dt_mesh_print(&tr->mesh, stdout);
    print_header(tr);
    dt_plan_print_run(c, tr->cfg_name, tr->mesh.size, tr->mesh.threads, stdout); /* memory plan + roofline */
    dt_metrics_header(&tr->metrics);
  }
  int start = tr->step;
  if (tr->step >= c->steps && is_root(tr))
    printf("# nothing to do: step %d of %d already done\n", tr->step, c->steps);
  while (tr->step < c->steps) {
    dt_step_row_t row;
    DT_TRY(dt_trainer_step(tr, &row));
    int last = tr->step == c->steps;
    if (tr->val && c->eval_every > 0 && (tr->step % c->eval_every == 0 || last))
      DT_TRY(dt_trainer_eval(tr, tr->val, c->eval_batches, &row.val_loss));
    if ((is_root(tr) || tr->metrics.jsonl) && (tr->step % c->log_every == 0 || last || row.val_loss >= 0)) dt_metrics_row(&tr->metrics, &row);
    if (is_root(tr) && row.slowest_rank >= 0)
      printf("# straggler: step %d: ms per step outside communication over %d ranks: min %.1f, median %.1f, max %.1f "
             "(slowest: rank %d, host %s)\n", row.step, tr->mesh.size, row.rank_ms_min, row.rank_ms_median,
             row.rank_ms_max, row.slowest_rank, tr->mesh.ranks[row.slowest_rank].host);
    /* All ranks agree whether a stop was requested. */
    int32_t sig = dt_train_signal_pending() ? 1 : 0;
    if (tr->mesh.size > 1)
      DT_TRY(tr->mesh.world->ops->allreduce(tr->mesh.world, &sig, &sig, 1, DT_I32, DT_MAX, NULL, NULL));
    if (sig) {
      tr->stopped_by_signal = 1;
      if (is_root(tr)) printf("# stop requested by signal at step %d: writing a checkpoint\n", tr->step);
      return dt_trainer_save(tr);
    }
    if (c->ckpt_every > 0 && tr->step % c->ckpt_every == 0) DT_TRY(dt_trainer_save(tr));
    if (c->stop_after > 0 && tr->step - start >= c->stop_after) {
      if (is_root(tr)) printf("# stop_after=%d steps reached at step %d\n", c->stop_after, tr->step);
      break;
    }
  }
  if (is_root(tr) && tr->mesh.dp > 1 && tr->n_timed_steps > 0) {
    double wait = tr->t_comm_wait_sum / tr->n_timed_steps, full = tr->t_allreduce_full;
    printf("# ddp: %d buckets; waiting for gradients after backward %.1f ms/step (rank 0 mean) vs %.1f ms for a "
           "blocking all-reduce of all gradients (bucket by bucket): %.0f%% of the all-reduce hidden behind backward\n",
           tr->ddp.n_buckets, 1e3 * wait, 1e3 * full, full > 0 ? 100.0 * fmax(0.0, 1.0 - wait / full) : 0.0);
  }
  if (tr->mesh.pp > 1 && tr->n_pp_steps > 0) DT_TRY(pp_report(tr));
  int nsteps = tr->step - start;
  if (is_root(tr) && tr->zero.stage == 3 && tr->mesh.dp > 1 && nsteps > 0) {
    double wait = tr->zero.t_wait / nsteps, full = 2 * tr->accum * tr->t_gather_full; /* fwd + bwd per micro-step */
    printf("# zero3: waiting for block gathers %.1f ms/step (rank 0 mean, evaluations included) vs %.1f ms for "
           "blocking gathers of every block before each forward and backward: %.0f%% of the gathers hidden behind "
           "compute\n", 1e3 * wait, 1e3 * full, full > 0 ? 100.0 * fmax(0.0, 1.0 - wait / full) : 0.0);
  }
  if (is_root(tr)) /* measured vs plan */
    dt_plan_print_rss(c, tr->cfg_name, tr->mesh.size, tr->mesh.threads, !tr->be.ops->host_memory,
                      tr->saved_step >= 0 || tr->resumed_step >= 0, stdout);
  double dev_used = 0;
  if (is_root(tr) && tr->mesh.device >= 0 && dt_cuda_mem_used(tr->mesh.device, &dev_used) == DT_OK)
    dt_plan_print_device(c, tr->cfg_name, tr->mesh.size, tr->mesh.threads, dev_used, stdout);
  /* The final state is always saved, unless it is already on disk. */
  if (tr->saved_step != tr->step && tr->resumed_step != tr->step) DT_TRY(dt_trainer_save(tr));
  return DT_OK;
}
