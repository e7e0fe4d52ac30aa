/* Gradient synchronisation strategies: how the gradients of one optimizer step become final over
 * the data-parallel group, and what the update then needs. One small interface, chosen once at
 * set-up from parallel.zero and the dp size:
 *   local  dp = 1, zero = 0: nothing to synchronise;
 *   ddp    zero = 0, dp > 1: the gradient arena averaged in buckets during the last backward (ddp.h);
 *   zero1  AdamW state sharded: gradients reduce-scattered after backward, parameters all-gathered
 *          after the update (zero.h);
 *   zero2  gradients sharded too: every backward reduces its buckets to their owners;
 *   zero3  parameters sharded too (FSDP): blocks gathered around their use.
 * Every strategy also sums the pipeline's tied embedding gradient (first and last stage, pp > 1)
 * at the point where it is still whole. The trainer calls, per step:
 *   begin_step, then per micro-batch backward_begin / backward_end around its backward,
 *   after_backward, reduce_norm (when the step is not skipped), after_update;
 *   begin_eval / end_eval around an evaluation. */
#ifndef DT_SYNC_H
#define DT_SYNC_H

#include <stdio.h>

#include "backend.h"
#include "comm.h"
#include "ddp.h"
#include "model.h"
#include "status.h"
#include "zero.h"

typedef struct dt_sync dt_sync_t;

#define DT_SYNC_SAMPLES 64

typedef struct {
  const char *name;
  int optim_sharded;  /* AdamW's m, v hold the shard [zero.lo, zero.hi) only */
  int params_sharded; /* between uses only that shard of the parameters is current (ZeRO-3) */
  /* zero the gradients (ZeRO-2/3: give their pages back), gather what a whole step needs */
  dt_status_t (*begin_step)(dt_sync_t *s);
  /* micro-batch mb of m: the gradient-ready hook for its backward (NULL: none; ctx = &s->ddp),
   * and the work after it */
  dt_grad_ready_fn (*backward_begin)(dt_sync_t *s, int mb, int m);
  dt_status_t (*backward_end)(dt_sync_t *s);
  /* after the last backward: gradients final (averaged everywhere, or this rank's shard averaged) */
  dt_status_t (*after_backward)(dt_sync_t *s);
  /* this rank's sum of squares of its final gradients -> the group's (sharded gradients only) */
  dt_status_t (*reduce_norm)(dt_sync_t *s, double *sumsq);
  /* after AdamW (skip: the update was skipped everywhere): every rank's parameters current again */
  dt_status_t (*after_update)(dt_sync_t *s, int skip);
  /* around an evaluation; collective_forward: every rank must run every round of it */
  dt_status_t (*begin_eval)(dt_sync_t *s);
  dt_status_t (*end_eval)(dt_sync_t *s);
  int collective_forward;
  /* once, when the buckets exist (dt_sync_start): what the strategy sets up on them, and the
   * blocking reference its report compares with */
  dt_status_t (*start)(dt_sync_t *s, dt_comm_t *grad_comm);
  /* rank 0's end-of-run line: how much communication the strategy hid (steps run by this process) */
  void (*report)(const dt_sync_t *s, int steps, FILE *o);
} dt_sync_ops_t;

enum { DT_DDP_COMM_AUTO, DT_DDP_COMM_MPI, DT_DDP_COMM_SHM };
/* parallel.ddp_comm's value (auto | mpi | shm, checked by the config) as DT_DDP_COMM_*. */
static inline int dt_sync_ddp_comm(const char *v) {
  return v[0] == 'm' ? DT_DDP_COMM_MPI : v[0] == 's' ? DT_DDP_COMM_SHM : DT_DDP_COMM_AUTO;
}

struct dt_sync {
  const dt_sync_ops_t *ops;
  dt_backend_t *be;
  const dt_layout_t *lay;
  dt_comm_t *dp_comm;   /* the dp group over MPI (norm reductions; host gradients) */
  int dp, accum;
  dt_ddp_t ddp;         /* buckets: DDP's all-reduces, ZeRO-2/3's reductions to the owners */
  dt_zero_t zero;       /* the shard of this rank (stage 0: unused) */
  dt_comm_t *tied;      /* pp > 1, first and last stage: the group that sums wte's gradient; else NULL */
  size_t bucket_bytes;
  double t_full;        /* zero3's reference at start: gathers of every block, blocking */
  /* ddp's overlap measurement (sync.c): every probe_every-th step (0 = none; set after init)
   * starts the all-reduces after backward; the windows from the last backward's start until the
   * gradients are averaged, of the last DT_SYNC_SAMPLES probe and other steps, the probes'
   * all-reduce times and their barrier waits before it (rank skew) */
  int probe_every, n_steps, n_probe, n_run;
  /* DDP's transport for host arenas (parallel.ddp_comm; set after init): DT_DDP_COMM_*; after
   * dt_sync_start, ddp.shm says which one runs and shm_why why not shared memory (auto) */
  int ddp_comm;
  char shm_why[160];
  double t_bwd0, t_wait_sum;
  double probe_win[DT_SYNC_SAMPLES], probe_comm[DT_SYNC_SAMPLES], probe_skew[DT_SYNC_SAMPLES];
  double run_win[DT_SYNC_SAMPLES];
};

/* Pick the strategy for `stage` over a dp group of `dp` ranks (before the backend allocates): with
 * zero > 0 the layout's arena is padded to split into dp equal shards (lay->n_params and its last
 * group boundary grow) and be->opt_lo/opt_hi become this rank's shard. */
dt_status_t dt_sync_init(dt_sync_t *s, int stage, dt_comm_t *dp_comm, int dp, int dp_idx, int accum,
                         dt_layout_t *lay, dt_backend_t *be, size_t bucket_bytes);
/* The backend's sparse arenas (backend.h DT_SPARSE_*) this strategy wants, for be->sparse before
 * the backend allocates: the gradients under ZeRO-2/3, the parameters under ZeRO-3, with dp > 1.
 * Only for a model that calls the layer hook (dt_sync_attach with a hook). */
int dt_sync_sparse(const dt_sync_t *s);
/* After the backend and model exist, and after the backend's set_precision: ZeRO on device arenas
 * uses the backend's kernels and stream; ZeRO-3 hooks its gathers into the model's groups (with
 * bf16/fp16 gathering the working copy: the model must not round it from the master itself, whose
 * other shards are never current), ZeRO-2 on device arenas its gradient
 * populates: *hook and *hook_ctx are set to what the model calls with the layout's block index
 * (hook NULL where the model has no layer hooks; untouched when the strategy needs none). */
dt_status_t dt_sync_attach(dt_sync_t *s, dt_layer_hook_fn *hook, void **hook_ctx);
/* Before the first step (after weights are in place): the buckets over grad_comm (NCCL for device
 * arenas, else dp_comm), the tied group (NULL if none) and the reference timings of the report. */
dt_status_t dt_sync_start(dt_sync_t *s, dt_comm_t *grad_comm, dt_comm_t *tied);
void dt_sync_free(dt_sync_t *s);
/* DDP on host arenas: how the gradients are averaged (after dt_sync_start); "" otherwise. */
const char *dt_sync_transport(const dt_sync_t *s);

#endif
