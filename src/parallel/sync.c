/* Gradient synchronisation strategies (sync.h): local, ddp, zero1, zero2, zero3. */
#include "sync.h"

#include <math.h>

#include "timer.h"

/* ---- shared pieces ---- */

static dt_status_t nothing(dt_sync_t *s) {
  (void)s;
  return DT_OK;
}
static dt_grad_ready_fn no_hook(dt_sync_t *s, int mb, int m) {
  (void)s, (void)mb, (void)m;
  return NULL;
}
static dt_status_t no_reduce(dt_sync_t *s, double *sumsq) {
  (void)s, (void)sumsq;
  return DT_OK;
}
static dt_status_t no_gather(dt_sync_t *s, int skip) {
  (void)s, (void)skip;
  return DT_OK;
}
static void no_report(const dt_sync_t *s, int steps, FILE *o) { (void)s, (void)steps, (void)o; }
static dt_status_t no_start(dt_sync_t *s, dt_comm_t *grad_comm) {
  (void)s, (void)grad_comm;
  return DT_OK;
}

static dt_status_t zero_grads(dt_sync_t *s) { return s->be->ops->zero_grad(s->be); }

/* Pipeline parallelism: the first stage's wte and the last stage's copy each hold a partial
 * gradient (embedding / lm_head): both get the sum, so the two copies stay equal. Bucket-sized
 * pieces: no MPI temporary of the whole embedding. */
static dt_status_t tied_sum(dt_sync_t *s) {
  if (!s->tied) return DT_OK;
  const dt_tensor_t *t = &s->lay->tensors[0];
  float *g = s->be->grads + t->offset;
  size_t n = (size_t)t->rows * t->cols, chunk = s->bucket_bytes / sizeof(float);
  for (size_t lo = 0; lo < n; lo += chunk)
    DT_TRY(s->tied->ops->allreduce(s->tied, g + lo, g + lo, n - lo < chunk ? n - lo : chunk, DT_F32, DT_SUM,
                                   s->be->stream, NULL));
  return DT_OK;
}

/* Sharded gradients: the global norm's sum of squares is the sum of the shards'. */
static dt_status_t shard_norm(dt_sync_t *s, double *sumsq) {
  return s->dp_comm->ops->allreduce(s->dp_comm, sumsq, sumsq, 1, DT_F64, DT_SUM, NULL, NULL);
}

/* ZeRO-1/2: every rank updated its shard; all-gather the parameters (not after a skipped step). */
static dt_status_t gather_params(dt_sync_t *s, int skip) {
  return skip ? DT_OK : dt_zero_gather_params(&s->zero, s->be->params);
}

/* ---- local and ddp ---- */

/* The overlap measurement (issue #27: a share of the all-reduce "hidden" must be one that a
 * comparison shows): every probe_every-th step from step 2 on starts the all-reduces after
 * backward instead of during it (the same calls on the same buckets: the same sums, nothing else
 * changes). The window from the last micro-batch's backward start until every gradient is
 * averaged is then backward + the whole all-reduce; in the other steps it is backward + what the
 * overlap did not hide, and backward's slowdown by the communication beside it counts too. A
 * barrier starts the probe's all-reduces on every rank at once (dt_ddp_finish), so the all-reduce
 * alone is timed without the wait for the slowest rank's backward (reported beside it). */
static int ddp_probe_now(const dt_sync_t *s) {
  return s->probe_every > 0 && s->n_steps >= 2 && (s->n_steps - 2) % s->probe_every == 0;
}

static dt_status_t ddp_begin_step(dt_sync_t *s) {
  DT_TRY(zero_grads(s));
  dt_ddp_begin(&s->ddp);
  s->n_steps++;
  s->ddp.defer = ddp_probe_now(s);
  return DT_OK;
}

/* Only the last micro-batch's backward reports ready gradients: earlier ones only accumulate. */
static dt_grad_ready_fn ddp_hook(dt_sync_t *s, int mb, int m) {
  if (mb != m - 1) return NULL;
  s->t_bwd0 = dt_time_now();
  return dt_ddp_ready;
}

static void sample(double *v, int *n, double x) { v[*n % DT_SYNC_SAMPLES] = x, (*n)++; }

static dt_status_t ddp_after_backward(dt_sync_t *s) {
  DT_TRY(dt_ddp_finish(&s->ddp));
  if (s->n_steps >= 2) { /* step 1 warms up caches and MPI's buffers */
    double win = dt_time_now() - s->t_bwd0;
    if (s->ddp.defer) {
      sample(s->probe_win, &s->n_probe, win);
      s->probe_comm[(s->n_probe - 1) % DT_SYNC_SAMPLES] = s->ddp.t_comm_wait;
      s->probe_skew[(s->n_probe - 1) % DT_SYNC_SAMPLES] = s->ddp.t_skew;
    } else {
      sample(s->run_win, &s->n_run, win);
      s->t_wait_sum += s->ddp.t_comm_wait;
    }
  }
  return tied_sum(s);
}

static double median(const double *v, int n) {
  double a[DT_SYNC_SAMPLES];
  n = n < DT_SYNC_SAMPLES ? n : DT_SYNC_SAMPLES;
  for (int i = 0; i < n; i++) { /* insertion sort: at most DT_SYNC_SAMPLES values, once per run */
    int j = i;
    for (; j > 0 && a[j - 1] > v[i]; j--) a[j] = a[j - 1];
    a[j] = v[i];
  }
  return n == 0 ? 0.0 : n % 2 ? a[n / 2] : 0.5 * (a[n / 2 - 1] + a[n / 2]);
}

/* Median absolute deviation from the median m. */
static double mad(const double *v, int n, double m) {
  double d[DT_SYNC_SAMPLES];
  n = n < DT_SYNC_SAMPLES ? n : DT_SYNC_SAMPLES;
  for (int i = 0; i < n; i++) d[i] = fabs(v[i] - m);
  return median(d, n);
}

static void ddp_report(const dt_sync_t *s, int steps, FILE *o) {
  (void)steps;
  if (s->n_probe == 0 || s->n_run == 0) {
    /* every step a probe (parallel.ddp_probe = 1): its windows and all-reduce, for comparisons
     * with an overlapped run (bench/ddp_overlap.sh), whose all-reduce can take another time */
    char all[160] = "";
    if (s->n_probe)
      snprintf(all, sizeof all, "; with every all-reduce after backward: backward + all-reduce %.1f ms, the all-reduce "
               "alone %.1f ms (medians)", 1e3 * median(s->probe_win, s->n_probe), 1e3 * median(s->probe_comm, s->n_probe));
    fprintf(o, "# ddp: %d buckets; waiting for gradients after backward %.1f ms/step (rank 0 mean); the hidden share "
            "is not measured: %d probe and %d other steps after the first (parallel.ddp_probe = %d)%s\n",
            s->ddp.n_buckets, s->n_run ? 1e3 * s->t_wait_sum / s->n_run : 0.0, s->n_probe, s->n_run, s->probe_every, all);
    return;
  }
  int nr = s->n_run < DT_SYNC_SAMPLES ? s->n_run : DT_SYNC_SAMPLES;
  int np = s->n_probe < DT_SYNC_SAMPLES ? s->n_probe : DT_SYNC_SAMPLES;
  double run = median(s->run_win, s->n_run), probe = median(s->probe_win, s->n_probe);
  double comm = median(s->probe_comm, s->n_probe);
  /* The estimate (probe - run) / comm, with two standard errors of probe - run from the windows'
   * spread (a median's standard error is 1.86 MAD / sqrt(n) for normal noise; the larger MAD for
   * both, a few probes say little of theirs), as points of the all-reduce: a share whose error
   * covers most of 0..100% is said to be unmeasurable rather than reported as overlap. */
  double spread = fmax(mad(s->run_win, s->n_run, run), mad(s->probe_win, s->n_probe, probe));
  double noise = 2 * 1.86 * spread * sqrt(1.0 / nr + 1.0 / np);
  /* not clamped to 0..100%: below 0 the all-reduce beside backward cost more than it after
   * backward (it competes for the cores), above 100 the noise exceeds it; a clamped 0% would hide
   * the first, and comparisons with shares other runs imply (bench/ddp_overlap.sh) need the sign */
  double hid = comm > 0 ? fmax(-999.0, fmin(999.0, 100.0 * (probe - run) / comm)) : 0.0;
  double err = comm > 0 ? 100.0 * noise / comm : 100.0;
  const char *what = err >= 50       ? "; not measurable here: the all-reduce is within the steps' noise"
                     : hid + err < 0 ? "; below 0: the all-reduce during backward slowed the step by more than it hid"
                                     : "";
  fprintf(o,
          "# ddp: %d buckets; backward + gradient all-reduce %.1f ms/step overlapped (median of %d steps) vs "
          "%.1f ms with the all-reduce after backward (median of %d probe steps, parallel.ddp_probe = %d), the "
          "all-reduce alone %.1f ms: %.0f%% +- %.0f of the all-reduce hidden behind backward (the probes' barrier "
          "before it, waiting for the slowest rank, %.1f ms); +- 2 standard errors of the two windows' difference, "
          "%.1f ms, from their spread%s%s\n",
          s->ddp.n_buckets, 1e3 * run, nr, 1e3 * probe, np, s->probe_every, 1e3 * comm, hid, fmin(err, 999.0),
          1e3 * median(s->probe_skew, s->n_probe), 1e3 * noise, what,
          s->ddp.shm ? "; averaged in shared memory by the ranks' own threads, in backward's hooks and after it" : "");
}

static const dt_sync_ops_t sync_local = {
    .name = "local", .begin_step = zero_grads, .backward_begin = no_hook, .backward_end = nothing,
    .after_backward = tied_sum, .reduce_norm = no_reduce, .after_update = no_gather, .begin_eval = nothing,
    .end_eval = nothing, .start = no_start, .report = no_report};

/* Host arenas of a dp group on one node: average them in shared memory (ddp_shm.c), unless
 * parallel.ddp_comm = mpi. */
static dt_status_t ddp_start(dt_sync_t *s, dt_comm_t *grad_comm) {
  (void)grad_comm;
  s->shm_why[0] = '\0';
  if (!s->be->ops->host_memory || s->ddp_comm == DT_DDP_COMM_MPI) return DT_OK;
  return dt_ddp_shm_init(&s->ddp, s->ddp_comm == DT_DDP_COMM_SHM, s->shm_why, sizeof s->shm_why);
}

static const dt_sync_ops_t sync_ddp = {
    .name = "ddp", .begin_step = ddp_begin_step, .backward_begin = ddp_hook, .backward_end = nothing,
    .after_backward = ddp_after_backward, .reduce_norm = no_reduce, .after_update = no_gather,
    .begin_eval = nothing, .end_eval = nothing, .start = ddp_start, .report = ddp_report};

const char *dt_sync_transport(const dt_sync_t *s) {
  static char buf[256];
  if (s->ops != &sync_ddp || !s->be->ops->host_memory) return "";
  if (s->ddp.shm) return "averaged in shared memory, straight from the dp ranks' arenas (parallel.ddp_comm)";
  snprintf(buf, sizeof buf, "MPI nonblocking all-reduce (parallel.ddp_comm = %s%s%s)",
           s->ddp_comm == DT_DDP_COMM_MPI ? "mpi" : "auto", s->shm_why[0] ? "; no shared memory: " : "", s->shm_why);
  return buf;
}

/* ---- ZeRO-1 ---- */

/* The tied wte is summed while every rank still holds it whole (ZeRO cuts the first and last
 * stage's arenas into different shards), then this rank's shard is averaged. */
static dt_status_t zero1_after_backward(dt_sync_t *s) {
  DT_TRY(tied_sum(s));
  return dt_zero_reduce_grads(&s->zero, s->be->grads);
}

/* Device arenas (gradients over NCCL): ZeRO's collectives in place on the compute stream. */
static dt_status_t zero1_start(dt_sync_t *s, dt_comm_t *grad_comm) {
  return grad_comm == s->dp_comm ? DT_OK : dt_zero_use_device_comm(&s->zero, grad_comm);
}

static const dt_sync_ops_t sync_zero1 = {
    .name = "zero1", .optim_sharded = 1, .begin_step = zero_grads, .backward_begin = no_hook,
    .backward_end = nothing, .after_backward = zero1_after_backward, .reduce_norm = shard_norm,
    .after_update = gather_params, .begin_eval = nothing, .end_eval = nothing, .start = zero1_start,
    .report = no_report};

/* ---- ZeRO-2 ---- */

static dt_status_t drop_grads(dt_sync_t *s) {
  return dt_zero_clear(&s->zero, s->be->grads, 0, s->lay->n_params); /* zero, and host pages back */
}

/* Every micro-batch's buckets go to their owners as backward finishes them. On device arenas the
 * gradients of the embeddings and ln_f (written at both ends of backward) are populated first; the
 * blocks' come with the layer hook (dt_zero2_hook). */
static dt_grad_ready_fn zero2_hook(dt_sync_t *s, int mb, int m) {
  (void)mb, (void)m;
  const size_t *g = s->lay->layer_begin;
  int L = s->lay->d.L;
  dt_status_t st = dt_zero_populate_grads(&s->zero, g[0], g[1]);
  if (st == DT_OK) st = dt_zero_populate_grads(&s->zero, g[L + 1], g[L + 2]);
  dt_ddp_begin(&s->ddp);
  s->ddp.err = st; /* reported by backward_end (dt_ddp_finish) */
  return dt_ddp_ready;
}

static dt_status_t zero2_backward_end(dt_sync_t *s) { return dt_ddp_finish(&s->ddp); }

/* wte was held back from the in-backward reductions (pp > 1): summed between the stages first. */
static dt_status_t zero2_after_backward(dt_sync_t *s) {
  DT_TRY(tied_sum(s));
  if (s->ddp.hold_hi > s->ddp.hold_lo)
    DT_TRY(dt_zero_reduce_bucket(&s->zero, s->be->grads, s->ddp.hold_lo, s->ddp.hold_hi));
  return dt_zero_average_shard(&s->zero, s->be->grads);
}

/* The buckets go to their owners as backward finishes them; the tied wte (pp > 1) is held back: it
 * is summed between the stages first (after_backward). */
static dt_status_t owners_start(dt_sync_t *s, dt_comm_t *grad_comm) {
  DT_TRY(zero1_start(s, grad_comm));
  s->ddp.action = dt_zero_reduce_bucket;
  s->ddp.action_ctx = &s->zero;
  const dt_tensor_t *w = &s->lay->tensors[0];
  if (s->lay->pp > 1 && !w->absent) {
    s->ddp.hold_lo = w->offset;
    s->ddp.hold_hi = w->offset + (size_t)w->rows * w->cols;
  }
  return DT_OK;
}

static const dt_sync_ops_t sync_zero2 = {
    .name = "zero2", .optim_sharded = 1, .begin_step = drop_grads, .backward_begin = zero2_hook,
    .backward_end = zero2_backward_end, .after_backward = zero2_after_backward, .reduce_norm = shard_norm,
    .after_update = gather_params, .begin_eval = nothing, .end_eval = nothing, .start = owners_start,
    .report = no_report};

/* ---- ZeRO-3 ---- */

/* The embeddings and ln_f are used at both ends of forward and backward: gathered for a whole step
 * or evaluation, dropped after it; the blocks come and go through the model's layer hook. With
 * bf16/fp16 what moves is the working copy: each rank first rounds its shard of it from the master
 * (which changed since the last gathers: an update, a resume, the initial weights). */
static dt_status_t pinned_gather(dt_sync_t *s) {
  const size_t *g = s->lay->layer_begin;
  int L = s->lay->d.L;
  DT_TRY(dt_zero3_round(&s->zero));
  DT_TRY(dt_zero3_gather(&s->zero, g[0], g[1]));
  return dt_zero3_gather(&s->zero, g[L + 1], g[L + 2]);
}

static dt_status_t pinned_release(dt_sync_t *s) {
  const size_t *g = s->lay->layer_begin;
  int L = s->lay->d.L;
  DT_TRY(dt_zero3_release(&s->zero, g[0], g[1]));
  return dt_zero3_release(&s->zero, g[L + 1], g[L + 2]);
}

static dt_status_t zero3_begin_step(dt_sync_t *s) {
  DT_TRY(drop_grads(s));
  return pinned_gather(s);
}

/* Each rank updated its own shard (or nobody did): only the pinned tensors are whole, drop them. */
static dt_status_t zero3_after_update(dt_sync_t *s, int skip) {
  (void)skip;
  return pinned_release(s);
}

static void zero3_report(const dt_sync_t *s, int steps, FILE *o) {
  if (s->dp < 2 || steps < 1) return;
  double wait = s->zero.t_wait / steps, full = 2 * s->accum * s->t_full; /* fwd + bwd per micro-step */
  fprintf(o, "# zero3: waiting for block gathers %.1f ms/step (rank 0 mean, evaluations included) vs %.1f ms for "
          "blocking gathers of every block before each forward and backward: %.0f%% of the gathers hidden behind "
          "compute\n", 1e3 * wait, 1e3 * full, full > 0 ? 100.0 * fmax(0.0, 1.0 - wait / full) : 0.0);
}

/* As ZeRO-2, and the report's reference: every block gathered, blocking. */
static dt_status_t zero3_start(dt_sync_t *s, dt_comm_t *grad_comm) {
  const dt_layout_t *lay = s->lay;
  DT_TRY(owners_start(s, grad_comm));
  if (s->dp < 2) return DT_OK;
  DT_TRY(s->dp_comm->ops->barrier(s->dp_comm));
  double t0 = dt_time_now();
  for (int l = 0; l < s->zero.L; l++) { /* the blocks the hook serves (dt_zero3_bound) */
    DT_TRY(dt_zero3_gather(&s->zero, lay->layer_begin[l + 1], lay->layer_begin[l + 2]));
    DT_TRY(dt_zero3_release(&s->zero, lay->layer_begin[l + 1], lay->layer_begin[l + 2]));
  }
  s->t_full = dt_time_now() - t0;
  s->zero.t_wait = 0;
  return DT_OK;
}

static const dt_sync_ops_t sync_zero3 = {
    .name = "zero3", .optim_sharded = 1, .params_sharded = 1, .begin_step = zero3_begin_step,
    .backward_begin = zero2_hook, .backward_end = zero2_backward_end, .after_backward = zero2_after_backward,
    .reduce_norm = shard_norm, .after_update = zero3_after_update, .begin_eval = pinned_gather,
    .end_eval = pinned_release, .collective_forward = 1, .start = zero3_start, .report = zero3_report};

/* ---- set-up ---- */

dt_status_t dt_sync_init(dt_sync_t *s, int stage, dt_comm_t *dp_comm, int dp, int dp_idx, int accum,
                         dt_layout_t *lay, dt_backend_t *be, size_t bucket_bytes) {
  static const dt_sync_ops_t *by_stage[] = {&sync_zero1, &sync_zero2, &sync_zero3};
  *s = (dt_sync_t){.ops = stage > 0 ? by_stage[stage - 1] : dp > 1 ? &sync_ddp : &sync_local, .be = be, .lay = lay,
                   .dp_comm = dp_comm, .dp = dp, .accum = accum, .bucket_bytes = bucket_bytes};
  if (stage == 0) return DT_OK;
  size_t n, lo, hi; /* pad the arena's end so it splits into dp equal shards; m, v: the shard only */
  dt_zero_split(lay->n_params, dp, dp_idx, DT_ALIGN, &n, &lo, &hi);
  lay->n_params = n;
  lay->layer_begin[lay->d.L + 2] = n;
  be->opt_lo = lo;
  be->opt_hi = hi;
  return dt_zero_init(&s->zero, stage, dp_comm, dp_idx, n, bucket_bytes);
}

int dt_sync_sparse(const dt_sync_t *s) {
  if (s->dp < 2) return 0;
  return (s->zero.stage >= 2 ? DT_SPARSE_GRADS : 0) | (s->zero.stage >= 3 ? DT_SPARSE_PARAMS : 0);
}

dt_status_t dt_sync_attach(dt_sync_t *s, dt_layer_hook_fn *hook, void **hook_ctx) {
  if (s->zero.stage > 0 && !s->be->ops->host_memory) dt_zero_set_device(&s->zero, s->be);
  if (!s->ops->params_sharded) {
    if (!hook || !s->zero.grads) return DT_OK;
    s->zero.group = s->lay->layer_begin; /* ZeRO-2 on device arenas: blocks' gradients populated */
    s->zero.L = s->lay->d.L;
    *hook = dt_zero2_hook;
    *hook_ctx = &s->zero;
    return DT_OK;
  }
  if (!hook) return DT_ERR(DT_ERR_INTERNAL, "sync: ZeRO-3 needs a model with layer hooks");
  DT_TRY(dt_zero3_attach(&s->zero, s->be->params, s->lay->layer_begin, s->lay->d.L));
  DT_TRY(dt_zero3_working(&s->zero, s->be)); /* bf16/fp16: the gathers move the working copy */
  *hook = dt_zero3_hook;
  *hook_ctx = &s->zero;
  return DT_OK;
}

dt_status_t dt_sync_start(dt_sync_t *s, dt_comm_t *grad_comm, dt_comm_t *tied) {
  const dt_layout_t *lay = s->lay;
  s->tied = tied;
  DT_TRY(dt_ddp_init(&s->ddp, grad_comm, s->be->grads, lay->n_params, lay->layer_begin, lay->d.L + 2,
                     s->bucket_bytes));
  s->ddp.stream = s->be->comm_stream;
  return s->ops->start(s, grad_comm);
}

void dt_sync_free(dt_sync_t *s) {
  dt_ddp_free(&s->ddp);
  dt_zero_free(&s->zero);
}
