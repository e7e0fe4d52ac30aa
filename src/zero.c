/* ZeRO stage 1: shard arithmetic and the two collectives of a sharded step (zero.h). */
#include "zero.h"

#include <stdlib.h>
#include <string.h>

void dt_zero_split(size_t n, int dp, int idx, size_t align, size_t *padded, size_t *lo, size_t *hi) {
  size_t unit = align * (size_t)dp;
  *padded = (n + unit - 1) / unit * unit;
  size_t s = *padded / (size_t)dp;
  *lo = (size_t)idx * s;
  *hi = *lo + s;
}

dt_status_t dt_zero_init(dt_zero_t *z, int stage, dt_comm_t *dp_comm, int dp_idx, size_t n, size_t bucket_bytes) {
  *z = (dt_zero_t){.stage = stage, .comm = dp_comm, .n = n};
  if (stage == 0) return DT_OK;
  if (stage != 1) return DT_ERR(DT_ERR_UNSUPPORTED, "parallel.zero=%d is not implemented yet", stage);
  size_t p = (size_t)dp_comm->size;
  if (n % p)
    return DT_ERR(DT_ERR_INTERNAL, "zero: arena of %zu floats does not split into %zu shards", n, p);
  z->shard = n / p;
  z->lo = (size_t)dp_idx * z->shard;
  z->hi = z->lo + z->shard;
  z->piece = bucket_bytes / sizeof(float) / p;
  if (z->piece < 1) z->piece = 1;
  if (z->piece > z->shard) z->piece = z->shard;
  z->stage_buf = malloc(p * z->piece * sizeof(float));
  if (!z->stage_buf) return DT_ERR(DT_ERR_NOMEM, "zero: out of memory for a %zu-float staging buffer", p * z->piece);
  return DT_OK;
}

void dt_zero_free(dt_zero_t *z) {
  free(z->stage_buf);
  z->stage_buf = NULL;
}

/* Round j: floats [j*piece, j*piece + k) of every shard, packed block r = shard r. */
static size_t round_len(const dt_zero_t *z, size_t off) { return z->shard - off < z->piece ? z->shard - off : z->piece; }

dt_status_t dt_zero_reduce_grads(dt_zero_t *z, float *grads) {
  int p = z->comm->size, me = (int)(z->lo / z->shard);
  for (size_t off = 0; off < z->shard; off += z->piece) {
    size_t k = round_len(z, off);
    for (int r = 0; r < p; r++) memcpy(z->stage_buf + (size_t)r * k, grads + (size_t)r * z->shard + off, k * sizeof(float));
    /* in place, NCCL style: the averaged block lands in this rank's own block */
    DT_TRY(z->comm->ops->reduce_scatter(z->comm, z->stage_buf, z->stage_buf + (size_t)me * k, k, DT_F32, DT_AVG, NULL,
                                        NULL));
    memcpy(grads + z->lo + off, z->stage_buf + (size_t)me * k, k * sizeof(float));
  }
  return DT_OK;
}

dt_status_t dt_zero_gather_params(dt_zero_t *z, float *params) {
  int p = z->comm->size, me = (int)(z->lo / z->shard);
  for (size_t off = 0; off < z->shard; off += z->piece) {
    size_t k = round_len(z, off);
    memcpy(z->stage_buf + (size_t)me * k, params + z->lo + off, k * sizeof(float));
    DT_TRY(z->comm->ops->allgather(z->comm, z->stage_buf + (size_t)me * k, z->stage_buf, k, DT_F32, NULL, NULL));
    for (int r = 0; r < p; r++)
      if (r != me) memcpy(params + (size_t)r * z->shard + off, z->stage_buf + (size_t)r * k, k * sizeof(float));
  }
  return DT_OK;
}
