/* ZeRO stage 1 over the data-parallel group: the flat parameter arena is cut into dp equal,
 * contiguous shards; each rank keeps AdamW's m and v for its shard only. A step reduce-scatters
 * (averages) the gradients so each rank holds its shard's mean gradient, updates that shard of
 * the parameters, and all-gathers the parameters. Clipping uses the global norm (shard sums of
 * squares all-reduced) and weight decay follows each tensor's flag, so the update is the one
 * plain data parallelism makes (PyTorch's ZeroRedundancyOptimizer). */
#ifndef DT_ZERO_H
#define DT_ZERO_H

#include <stddef.h>

#include "comm.h"
#include "status.h"

typedef struct {
  int stage;            /* 0 = off */
  dt_comm_t *comm;      /* the dp group */
  size_t n;             /* padded arena floats: a multiple of DT_ALIGN * dp */
  size_t shard;         /* n / dp */
  size_t lo, hi;        /* this rank's shard [lo, hi) = [dp_idx * shard, (dp_idx + 1) * shard) */
  size_t piece;         /* floats per rank per collective: the arena moves in bucket-sized rounds */
  float *stage_buf;     /* dp * piece floats: round j packs piece j of every shard here */
} dt_zero_t;

/* Shards of an arena of n floats over dp ranks: the arena is padded at its end to *padded, a
 * multiple of align * dp, so every shard is the same whole number of align-float units (the
 * padding lies outside every tensor and stays zero). Pure; for rank idx. */
void dt_zero_split(size_t n, int dp, int idx, size_t align, size_t *padded, size_t *lo, size_t *hi);
/* Set up stage `stage` (0 or 1) for an arena of n floats (already padded by dt_zero_split).
 * Collectives run in rounds of about bucket_bytes (one staging buffer of that size): Open MPI's
 * reduce-scatter and all-gather of a whole 0.5 GB arena allocate temporaries of the arena's size
 * (measured at 124M, dp=4: +950 MiB peak RSS), which would cancel what sharding saves. */
dt_status_t dt_zero_init(dt_zero_t *z, int stage, dt_comm_t *dp_comm, int dp_idx, size_t n, size_t bucket_bytes);
void dt_zero_free(dt_zero_t *z);
/* Average the gradient arena over the group into this rank's shard (in place, other shards'
 * contents are left unspecified). */
dt_status_t dt_zero_reduce_grads(dt_zero_t *z, float *grads);
/* Every rank's updated shard to every rank (in place). */
dt_status_t dt_zero_gather_params(dt_zero_t *z, float *params);

#endif
