/* ZeRO stages 1, 2 and 3 over the data-parallel group: the flat parameter arena is cut into dp
 * equal, contiguous shards; each rank keeps AdamW's m and v for its shard only.
 *   stage 1: after the last backward of a step the gradients are reduce-scattered (averaged) so
 *            each rank holds its shard's mean gradient (PyTorch's ZeroRedundancyOptimizer);
 *   stage 2: during every backward, each gradient bucket, as soon as it is final, is reduced to
 *            the owners of its parts (summed into the owner's shard) and the rest of the bucket's
 *            pages are given back (the CPU gradient arena is an anonymous mapping): a rank holds
 *            its shard of the gradients plus the buckets backward has not finished yet; after the
 *            last micro-step the shard is divided by dp.
 * Then each rank updates its shard of the parameters and the parameters are all-gathered.
 * Stage 3 (below) keeps only the shard of the parameters between their uses.
 * Device arenas (dt_zero_use_device_comm): the same collectives over NCCL on the backend's compute
 * stream, and "dropped" means the backend's clear kernel: in its sparse arenas (be->sparse, CUDA's
 * virtual memory, cuda/sparse.h) that gives the memory back too. As the device has no pages that
 * come back by themselves, what is about to be written is populated first: a block's parameters
 * before their gather, a block's gradients before its backward (the layer hook, stages 2 and 3),
 * the embeddings' and ln_f's gradients before every micro-batch's backward.
 * Clipping uses the global norm (shard sums of squares all-reduced) and weight decay follows
 * each tensor's flag, so the update is the one plain data parallelism makes. */
#ifndef DT_ZERO_H
#define DT_ZERO_H

#include <stddef.h>

#include "backend.h"
#include "comm.h"
#include "model.h" /* dt_hook_phase_t */
#include "status.h"

typedef struct {
  int stage;            /* 0 = off */
  /* stage 3 */
  float *params;        /* the arena the gathers fill: the backend's parameters (an anonymous mapping),
                           or with bf16/fp16 their working copy (dt_zero3_working) */
  size_t esz;           /* bytes per element of params: 4, or 2 for a device's 16-bit working copy */
  dt_backend_t *work;   /* bf16/fp16: the backend whose working copy params is; its fp32 master
                           work->params is current in this rank's shard only, its round_copy makes the
                           working copy's shard (NULL: the gathers fill the master itself, fp32) */
  const size_t *group;  /* the layout's layer_begin: block l is [group[l + 1], group[l + 2]) */
  int L;                /* blocks the hook serves: 0 .. L-1 (it prefetches inside them only) */
  size_t keep;          /* the arena from here on is never dropped (n unless dt_zero3_bound) */
  int have;             /* the block whose gather was started (or -1) */
  dt_comm_req_t **req;  /* that gather's broadcasts in flight, one per owner (comm size) */
  int nreq;
  double t_wait;        /* seconds spent waiting for block gathers (not hidden behind compute) */
  dt_comm_t *comm;      /* the dp group */
  size_t n;             /* padded arena floats: a multiple of DT_ALIGN * dp */
  size_t shard;         /* n / dp */
  size_t lo, hi;        /* this rank's shard [lo, hi) = [dp_idx * shard, (dp_idx + 1) * shard) */
  size_t piece;         /* floats per rank per collective: the arena moves in bucket-sized rounds */
  void *stream;         /* device arenas (dt_zero_set_device): be->stream, the collectives' stream (NULL: host) */
  dt_backend_t *dev;    /* and this backend's clear and divide kernels do the drops and the mean,
                           its populate brings back what a gather or backward writes next */
  float *grads;         /* stages 2 and 3 on device arenas: the gradient arena the layer hook
                           populates block by block (NULL: nothing to populate) */
  float *stage_buf;     /* dp * piece floats: round j packs piece j of every shard here */
} dt_zero_t;

/* Shards of an arena of n floats over dp ranks: the arena is padded at its end to *padded, a
 * multiple of align * dp, so every shard is the same whole number of align-float units (the
 * padding lies outside every tensor and stays zero). Pure; for rank idx. */
void dt_zero_split(size_t n, int dp, int idx, size_t align, size_t *padded, size_t *lo, size_t *hi);
/* Set up stage `stage` (0, 1 or 2) for an arena of n floats (already padded by dt_zero_split).
 * Collectives run in rounds of about bucket_bytes (one staging buffer of that size): Open MPI's
 * reduce-scatter and all-gather of a whole 0.5 GB arena allocate temporaries of the arena's size
 * (measured at 124M, dp=4: +950 MiB peak RSS), which would cancel what sharding saves. */
dt_status_t dt_zero_init(dt_zero_t *z, int stage, dt_comm_t *dp_comm, int dp_idx, size_t n, size_t bucket_bytes);
/* Waits for a prefetch still in flight and frees; a second call does nothing (everything is NULL then). */
void dt_zero_free(dt_zero_t *z);
/* Stage 2: reduce gradient bucket [lo, hi) to the owners of its parts (blocking; every rank
 * calls it for the same buckets in the same order), then drop the bucket's pages outside this
 * rank's shard. A dt_ddp_t bucket action (ctx = dt_zero_t). */
dt_status_t dt_zero_reduce_bucket(void *ctx, float *grads, size_t lo, size_t hi);
/* Zero grads[lo, hi) by giving its whole pages back (madvise DONTNEED on an anonymous mapping)
 * and clearing the partial pages at its ends. */
void dt_zero_drop(float *grads, size_t lo, size_t hi);
/* x[lo, hi) = 0: dt_zero_drop on host arenas, the backend's clear kernel on device ones. */
dt_status_t dt_zero_clear(dt_zero_t *z, float *x, size_t lo, size_t hi);
/* Stage 2, after the last micro-step: the shard holds the sum over ranks; make it the mean. */
dt_status_t dt_zero_average_shard(dt_zero_t *z, float *grads);

/* Stage 3 (FSDP): each rank keeps only its shard of the parameters between uses. Set up with
 * the backend's parameter arena and the layout's group offsets (layer_begin, L). */
dt_status_t dt_zero3_attach(dt_zero_t *z, float *params, const size_t *layer_begin, int L);
/* Mixed precision (after the backend's set_precision; nothing to do when be->wparams is the master):
 * the gathers move the working copy be->wparams (be->act_bytes per element), not the fp32 master,
 * as FSDP gathers its low-precision parameters. The master keeps only this rank's shard (plus
 * anything from `keep` on) for good: AdamW updates it, dt_zero3_round makes the working copy's shard
 * from it before the owners send it. DT_ERR_INTERNAL when a group or shard boundary does not fall on
 * a whole float of 16-bit storage (the collectives move floats). Sets be->wparams_by_sync. */
dt_status_t dt_zero3_working(dt_zero_t *z, dt_backend_t *be);
/* Mixed precision: this rank's shard of the working copy = the master's, rounded (the master just
 * changed: after an update, a resume or the initial weights). Nothing in fp32. */
dt_status_t dt_zero3_round(dt_zero_t *z);
/* After the initial weights or a resume filled more than this rank's shard: only the shard stays, of
 * the gathered arena and (mixed precision) of the master, both below `keep`. */
dt_status_t dt_zero3_shard(dt_zero_t *z);
/* A model whose arena ends in values every rank keeps whole (the image classifiers' batch-norm
 * running statistics, updated by every rank from synchronised statistics): the hook serves blocks
 * 0 .. blocks-1 only, and nothing from arena offset `keep` on is ever dropped. */
void dt_zero3_bound(dt_zero_t *z, int blocks, size_t keep);
/* Parameters [lo, hi) from their owners (blocking), or dropped again outside this rank's shard:
 * the trainer brackets a step or an evaluation with the embeddings and ln_f groups this way. */
dt_status_t dt_zero3_gather(dt_zero_t *z, size_t lo, size_t hi);
dt_status_t dt_zero3_release(dt_zero_t *z, size_t lo, size_t hi);
/* The backend's layer hook (ctx = dt_zero_t): before block l runs, its gather (started ahead
 * when possible) is completed and the next block's is started (l + 1 forward, l - 1 backward);
 * after it ran, its parameters outside this rank's shard are dropped. */
dt_status_t dt_zero3_hook(void *ctx, int l, dt_hook_phase_t phase);
/* Stage 2's layer hook on device arenas (ctx = dt_zero_t): block l's gradients populated before its
 * backward. Stage 3's hook does the same. */
dt_status_t dt_zero2_hook(void *ctx, int l, dt_hook_phase_t phase);
/* Device arenas: grads[lo, hi) populated (the embeddings' and ln_f's groups before a backward). */
dt_status_t dt_zero_populate_grads(dt_zero_t *z, size_t lo, size_t hi);
/* A device backend's arenas (after its init): collectives on be's compute stream, stages 2 and 3
 * clear and average with be's kernels (the note at the top). */
void dt_zero_set_device(dt_zero_t *z, dt_backend_t *be);
/* ... and through `comm` (NCCL over the same dp group), in place, in one call each (no host
 * staging). */
dt_status_t dt_zero_use_device_comm(dt_zero_t *z, dt_comm_t *comm);
/* Average the gradient arena over the group into this rank's shard (in place, other shards'
 * contents are left unspecified). */
dt_status_t dt_zero_reduce_grads(dt_zero_t *z, float *grads);
/* Every rank's updated shard to every rank (in place). */
dt_status_t dt_zero_gather_params(dt_zero_t *z, float *params);

#endif
