/* The trainer's weights in and out: identical initial weights on every rank, resume from a
 * checkpoint (exact, or onto another layout), and checkpoint writes; with device backends through
 * host copies of the arenas. */
#include "train_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <mpi.h>

#include "ckpt.h"
#include "fault.h"
#include "timer.h"

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
  if (tr->sync.ops->optim_sharded) a->optim = tr->zero_optim; /* m, v hold this rank's shard only */
  if (tr->sync.ops->params_sharded) { /* and the parameters too (their arena is full-size: offset it) */
    a->params = hp + tr->sync.zero.lo;
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
    if (tr->sync.ops->optim_sharded) { /* m, v: the part of this tp shard's boxes in the rank's ZeRO range */
      dt_ckpt_ranges_t all = {0}, o = {0};
      dt_status_t st = dt_ckpt_ranges_add_shards(&all, &tr->lay, rep, load);
      if (st == DT_OK) st = dt_ckpt_ranges_clip(&o, &tr->lay, &all, tr->sync.zero.lo, tr->sync.zero.hi);
      dt_ckpt_ranges_free(&all);
      o.full = 0;
      a->optim = o;
      if (tr->sync.ops->params_sharded) { /* the parameters: the same boxes, from every dp rank */
        dt_ckpt_ranges_free(&a->model);
        a->model = o;
        a->params = hp + tr->sync.zero.lo;
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
  int z3 = tr->sync.ops->params_sharded; /* ZeRO-3: the shard was loaded; the rest comes by gathers */
  size_t lo = z3 ? tr->sync.zero.lo : 0, hi = z3 ? tr->sync.zero.hi : n;
  DT_TRY(tr->be.ops->copy_from_host(&tr->be, DT_BUF_PARAMS, lo, hi - lo, p + lo));
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

void dt_train_resume_scaler(dt_scaler_t *sc, const dt_ckpt_state_t *st, int root) {
  sc->skipped = st->skipped_steps;
  if (!sc->enabled) return;
  if (ckpt_precision(st->ini) == DT_PREC_FP16 && st->loss_scale > 0) {
    sc->scale = (float)st->loss_scale;
    sc->growth = st->loss_scale_growth;
  } else if (root) {
    printf("# resume: the checkpoint is not from an fp16 run: loss scale starts at %g\n", sc->scale);
  }
}

/* The initial weights of a fresh start (model.h), the same on every rank. */
static dt_status_t initial_weights(dt_trainer_t *tr) {
  /* The CPU backend's parameter arena is host memory: initialise and broadcast in place (a
   * separate host buffer set every rank's peak RSS one arena higher than training needs). */
  int cpu = tr->be.ops->host_memory, z3 = tr->sync.ops->params_sharded;
  float *host = cpu ? tr->be.params : malloc(sizeof(float) * tr->lay.n_params);
  if (!host) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  dt_status_t st = DT_OK;
  if (z3) { /* each rank makes its own shard (the values of the full initialisation) */
    size_t lo = tr->sync.zero.lo, hi = tr->sync.zero.hi;
    dt_model_init_params_range(&tr->lay, host, tr->cfg.seed, lo, hi);
    if (tr->lay.tp > 1) lo = 0, hi = tr->lay.n_params; /* the range written (model.h) */
    if (!cpu) st = tr->be.ops->copy_from_host(&tr->be, DT_BUF_PARAMS, lo, hi - lo, host + lo);
    if (st == DT_OK) st = dt_zero3_shard(&tr->sync.zero); /* tp init wrote its whole shard */
  } else {
    st = init_weights(tr, host);
  }
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
  const int z3 = tr->sync.ops->params_sharded;
  size_t lo = z3 ? tr->sync.zero.lo : 0, hi = z3 ? tr->sync.zero.hi : tr->lay.n_params;
  const uintptr_t page = 4096, a = (uintptr_t)(tr->be.params + lo) / page * page, b = (uintptr_t)(tr->be.params + hi);
  if (b > a) (void)madvise((void *)a, (size_t)(b - a), MADV_POPULATE_WRITE);
#else
  (void)tr;
#endif
}

/* A resume on another layout (a job that lost or gained nodes, or a new dp x tp x pp): what changed,
 * and whether the global batch is the one the checkpoint's run took (data_pos / step: every step
 * takes global_batch samples), so the run continues the same training. Rank 0. */
static void report_layout_change(const dt_trainer_t *tr, const dt_ckpt_state_t *st) {
  const dt_mesh_t *m = &tr->mesh;
  if (st->world == m->size && st->dp == m->dp && st->tp == m->tp && st->pp == m->pp) return;
  printf("# resume: layout changed: written by %d ranks (dp=%d tp=%d pp=%d), now %d ranks (dp=%d tp=%d pp=%d); "
         "global batch %d sequences = micro_batch %d x grad_accum %d x dp %d, data from sample %llu\n",
         st->world, st->dp, st->tp, st->pp, m->size, m->dp, m->tp, m->pp, tr->global_batch, tr->B, tr->accum, m->dp,
         (unsigned long long)st->data_pos);
  if (st->step <= 0 || st->data_pos % st->step != 0) return;
  long long before = st->data_pos / st->step;
  if (before == tr->global_batch)
    printf("# resume: the same global batch as the checkpoint's run (%lld sequences per step)\n", before);
  else
    printf("# resume: warning: the checkpoint's run took %lld sequences per step, this one takes %d: the training "
           "changes; set train.global_batch = %lld to keep it on any number of ranks\n", before, tr->global_batch, before);
}

/* Restore parameters, moments and position per checkpoint.resume (auto | never | PATH), or,
 * with nothing to resume from, draw the initial weights. A resume does not draw them first: the
 * checkpoint replaces every value (GPT-2 124M: seconds of Gaussian draws saved per restart). A
 * failed load never falls back to a fresh start (dt_ckpt_load_latest), so the arenas are never
 * trained from half-loaded or undrawn values. */
dt_status_t dt_trainer_load_weights(dt_trainer_t *tr) {
  const char *r = tr->cfg.resume;
  if (!strcmp(r, "never") || (!strcmp(r, "auto") && !tr->cfg.ckpt_dir[0])) return initial_weights(tr);
  dt_ckpt_arenas_t a;
  DT_TRY(host_arenas(tr, 1, 0, &a));
  dt_ckpt_state_t st;
  memset(&st, 0, sizeof st);
  char path[DT_PATH_MAX] = "";
  dt_status_t s;
  MPI_Comm w; /* the trainer's world: MPI errors come back as errors (not MPI's abort) */
  DT_TRY(dt_comm_mpi_handle(tr->mesh.world, &w));
  populate_params(tr);
  /* the load is collective: time it from when every rank is ready, so the time is the load's and
   * not the wait for the slowest rank's setup (that is in the whole start's time) */
  DT_TRY(tr->mesh.world->ops->barrier(tr->mesh.world));
  double t0 = dt_time_now();
  if (!strcmp(r, "auto")) {
    s = dt_ckpt_load_latest(&w, tr->cfg.ckpt_dir, &tr->lay, &a, &st, path, sizeof path);
    if (s == DT_ERR_CKPT) { /* nothing usable: a fresh start */
      if (is_root(tr)) printf("# resume: no complete checkpoint in %s, starting from step 0\n", tr->cfg.ckpt_dir);
      dt_err_clear();
      arenas_release(tr, &a);
      return initial_weights(tr);
    }
  } else {
    snprintf(path, sizeof path, "%s", r);
    s = dt_ckpt_load(&w, path, &tr->lay, &a, &st);
  }
  arenas_release(tr, &a);
  if (s != DT_OK) return s;
  DT_TRY(push_arenas(tr));
  tr->step = (int)st.step;
  tr->sample_pos = (uint64_t)st.data_pos;
  tr->tokens_seen = (uint64_t)st.tokens;
  tr->resumed_step = tr->step;
  dt_train_resume_scaler(&tr->scaler, &st, is_root(tr));
  if (is_root(tr)) {
    printf("# resume: %s at step %d, sample %llu (written by dtrain %s, dp=%d tp=%d pp=%d; read in %.2f s)\n", path,
           tr->step, (unsigned long long)tr->sample_pos, st.version, st.dp, st.tp, st.pp, dt_time_now() - t0);
    if (tr->scaler.enabled || tr->scaler.skipped)
      printf("# resume: loss scale %g, %lld clean steps since the last overflow or growth, %lld steps skipped\n",
             tr->scaler.scale, (long long)tr->scaler.growth, (long long)tr->scaler.skipped);
    report_layout_change(tr, &st);
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
  int z3 = tr->sync.ops->params_sharded; /* only this rank's ZeRO shard is current: compare it within the tp group */
  size_t lo = z3 ? tr->sync.zero.lo : 0, hi = z3 ? tr->sync.zero.hi : tr->lay.n_params;
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

/* Writes nothing when checkpoint.dir is empty (no checkpoints asked for). */
dt_status_t dt_trainer_save(dt_trainer_t *tr) {
  if (!tr->cfg.ckpt_dir[0]) return DT_OK;
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
  MPI_Comm w; /* the trainer's world: MPI errors come back as errors (not MPI's abort) */
  dt_status_t s = dt_comm_mpi_handle(tr->mesh.world, &w);
  if (s == DT_OK) s = dt_ckpt_save(&w, tr->cfg.ckpt_dir, tr->cfg.ckpt_keep, &tr->lay, &a, &st, path, sizeof path);
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

dt_status_t dt_trainer_load_checkpoint(dt_trainer_t *tr, const char *path, char *used, size_t used_size) {
  int dev = !tr->be.ops->host_memory; /* device backend: load into the host copy, then send it */
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(dev ? tr->host_arena : tr->be.params, NULL, NULL);
  int part = tr->lay.tp > 1 || tr->lay.pp > 1; /* this rank's shard / stage */
  MPI_Comm w; /* the trainer's world: MPI errors come back as errors */
  dt_status_t st = part ? dt_ckpt_ranges_add_shards(&a.model, &tr->lay, 1, 1) : DT_OK;
  if (st == DT_OK) st = dt_comm_mpi_handle(tr->mesh.world, &w);
  struct stat sb;
  if (st == DT_OK && stat(path, &sb) != 0)
    st = DT_ERR(DT_ERR_CKPT, "%s: no such checkpoint file or directory (train first, or name one with --checkpoint)", path);
  if (st == DT_OK && S_ISDIR(sb.st_mode)) {
    char file[4096];
    st = dt_ckpt_load_latest(&w, path, &tr->lay, &a, NULL, file, sizeof file);
    if (used) snprintf(used, used_size, "%s", file);
  } else if (st == DT_OK) {
    st = dt_ckpt_load(&w, path, &tr->lay, &a, NULL);
    if (used) snprintf(used, used_size, "%s", path);
  }
  if (part) dt_ckpt_ranges_free(&a.model);
  if (st == DT_OK && dev) st = tr->be.ops->copy_from_host(&tr->be, DT_BUF_PARAMS, 0, tr->lay.n_params, tr->host_arena);
  return st;
}
