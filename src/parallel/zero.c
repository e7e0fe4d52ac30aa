/* ZeRO stages 1, 2 and 3: shard arithmetic and the collectives of a sharded step (zero.h). */
#include "zero.h"

#include "timer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
  z->have = -1;
  if (stage > 3) return DT_ERR(DT_ERR_UNSUPPORTED, "parallel.zero=%d does not exist", stage);
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
  for (int i = 0; i < z->nreq; i++)
    if (z->req[i]) z->comm->ops->wait(z->comm, z->req[i]);
  free(z->req);
  free(z->stage_buf);
  z->stage_buf = NULL;
  z->req = NULL;
  z->nreq = 0;
}

/* Round j: floats [j*piece, j*piece + k) of every shard, packed block r = shard r. */
static size_t round_len(const dt_zero_t *z, size_t off) { return z->shard - off < z->piece ? z->shard - off : z->piece; }

void dt_zero_set_device(dt_zero_t *z, dt_backend_t *be) {
  z->dev = be;
  z->stream = be->stream;
  z->grads = z->stage >= 2 ? be->grads : NULL;
}

dt_status_t dt_zero_populate_grads(dt_zero_t *z, size_t lo, size_t hi) {
  return z->grads && lo < hi ? z->dev->k->populate(z->dev, z->grads + lo, hi - lo) : DT_OK;
}

dt_status_t dt_zero_use_device_comm(dt_zero_t *z, dt_comm_t *comm) {
  if (comm->size != z->comm->size) return DT_ERR(DT_ERR_INTERNAL, "zero: a device communicator of another group");
  z->comm = comm;
  free(z->stage_buf); /* NCCL's in-place collectives need no staging */
  z->stage_buf = NULL;
  return DT_OK;
}

dt_status_t dt_zero_clear(dt_zero_t *z, float *x, size_t lo, size_t hi) {
  if (lo >= hi) return DT_OK;
  if (z->dev) return z->dev->k->clear(z->dev, x + lo, hi - lo);
  dt_zero_drop(x, lo, hi);
  return DT_OK;
}

/* Elements [lo, hi) of an arena of esz-byte elements as floats [*f, *f + *n): the collectives, clears
 * and populates work in floats, so 16-bit storage needs even boundaries (DT_ALIGN-aligned shards and
 * groups are). */
static dt_status_t as_floats(size_t esz, size_t lo, size_t hi, size_t *f, size_t *n) {
  if ((lo * esz | hi * esz) % sizeof(float))
    return DT_ERR(DT_ERR_INTERNAL, "zero: elements [%zu, %zu) of %zu-byte storage are not whole floats", lo, hi, esz);
  *f = lo * esz / sizeof(float);
  *n = hi > lo ? (hi - lo) * esz / sizeof(float) : 0;
  return DT_OK;
}

/* x[lo, hi) of elements of esz bytes cleared */
static dt_status_t clear_elems(dt_zero_t *z, float *x, size_t esz, size_t lo, size_t hi) {
  size_t f = 0, n = 0;
  if (lo >= hi) return DT_OK;
  DT_TRY(as_floats(esz, lo, hi, &f, &n));
  return dt_zero_clear(z, x, f, f + n);
}

/* x[lo, hi) outside this rank's shard cleared (elements of esz bytes) */
static dt_status_t clear_outside(dt_zero_t *z, float *x, size_t esz, size_t lo, size_t hi) {
  DT_TRY(clear_elems(z, x, esz, lo, hi < z->lo ? hi : z->lo)); /* below this rank's shard */
  return clear_elems(z, x, esz, lo > z->hi ? lo : z->hi, hi);  /* above it */
}

dt_status_t dt_zero_reduce_grads(dt_zero_t *z, float *grads) {
  int p = z->comm->size, me = (int)(z->lo / z->shard);
  if (p == 1) return DT_OK; /* the shard is the arena (also a device one) */
  if (z->stream) /* device arena: one in-place reduce-scatter (shard r is block r of the arena) */
    return z->comm->ops->reduce_scatter(z->comm, grads, grads + z->lo, z->shard, DT_F32, DT_AVG, z->stream, NULL);
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
  if (p == 1) return DT_OK;
  if (z->stream) /* device arena: one in-place all-gather */
    return z->comm->ops->allgather(z->comm, params + z->lo, params, z->shard, DT_F32, z->stream, NULL);
  for (size_t off = 0; off < z->shard; off += z->piece) {
    size_t k = round_len(z, off);
    memcpy(z->stage_buf + (size_t)me * k, params + z->lo + off, k * sizeof(float));
    DT_TRY(z->comm->ops->allgather(z->comm, z->stage_buf + (size_t)me * k, z->stage_buf, k, DT_F32, NULL, NULL));
    for (int r = 0; r < p; r++)
      if (r != me) memcpy(params + (size_t)r * z->shard + off, z->stage_buf + (size_t)r * k, k * sizeof(float));
  }
  return DT_OK;
}

void dt_zero_drop(float *grads, size_t lo, size_t hi) {
  if (lo >= hi) return;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)(grads + lo), z = (uintptr_t)(grads + hi);
  uintptr_t pa = (a + page - 1) / page * page, pz = z / page * page;
  if (pa >= pz || madvise((void *)pa, pz - pa, MADV_DONTNEED) != 0) { /* no whole page (or no madvise) */
    memset((void *)a, 0, z - a);
    return;
  }
  memset((void *)a, 0, pa - a);
  memset((void *)pz, 0, z - pz);
}

dt_status_t dt_zero_reduce_bucket(void *ctx, float *grads, size_t lo, size_t hi) {
  dt_zero_t *z = ctx;
  int p = z->comm->size;
  if (p == 1) return DT_OK; /* the shard is the arena */
  for (int r = 0; r < p; r++) { /* the parts of [lo, hi) in each rank's shard, summed at that rank */
    size_t a = (size_t)r * z->shard, e = a + z->shard;
    if (a < lo) a = lo;
    if (e > hi) e = hi;
    if (a < e)
      DT_TRY(z->comm->ops->reduce(z->comm, grads + a, grads + a, e - a, DT_F32, DT_SUM, r, z->stream, NULL));
  }
  return clear_outside(z, grads, sizeof(float), lo, hi);
}

dt_status_t dt_zero_average_shard(dt_zero_t *z, float *grads) {
  const float n = (float)z->comm->size; /* divided like the all-reduce's DT_AVG */
  float *g = grads + z->lo;
  if (z->dev) return z->dev->k->divide(z->dev, g, z->shard, n);
  for (size_t i = 0; i < z->shard; i++) g[i] /= n;
  return DT_OK;
}

/* ---- stage 3 ------------------------------------------------------------------------------ */

dt_status_t dt_zero3_attach(dt_zero_t *z, float *params, const size_t *layer_begin, int L) {
  z->params = params;
  z->esz = sizeof(float);
  z->work = NULL;
  z->group = layer_begin;
  z->L = L;
  z->keep = z->n;
  z->have = -1;
  z->req = calloc((size_t)z->comm->size, sizeof *z->req);
  if (!z->req) return DT_ERR(DT_ERR_NOMEM, "zero: out of memory");
  z->nreq = z->comm->size; /* dt_zero_free waits for a prefetch still in flight */
  return DT_OK;
}

/* Start the broadcasts that bring [lo, hi) from its owners (reqs: one per owner; NULL = blocking). */
static dt_status_t gather_start(dt_zero_t *z, size_t lo, size_t hi, dt_comm_req_t **req) {
  if (z->comm->size == 1) return DT_OK; /* the shard is the arena */
  size_t f = 0, n = 0; /* as floats: 16-bit elements move in pairs, bit for bit (a broadcast converts nothing) */
  if (z->dev && lo < hi) {
    DT_TRY(as_floats(z->esz, lo, hi, &f, &n));
    DT_TRY(z->dev->k->populate(z->dev, z->params + f, n));
  }
  for (int r = 0; r < z->comm->size; r++) {
    size_t a = (size_t)r * z->shard, e = a + z->shard;
    if (a < lo) a = lo;
    if (e > hi) e = hi;
    if (a >= e) continue;
    DT_TRY(as_floats(z->esz, a, e, &f, &n));
    DT_TRY(z->comm->ops->broadcast(z->comm, z->params + f, n, DT_F32, r, z->stream, req ? &req[r] : NULL));
  }
  return DT_OK;
}

static dt_status_t gather_wait(dt_zero_t *z) {
  dt_status_t st = DT_OK;
  for (int r = 0; r < z->comm->size; r++)
    if (z->req[r]) {
      dt_status_t s2 = z->comm->ops->wait(z->comm, z->req[r]);
      if (st == DT_OK) st = s2;
      z->req[r] = NULL;
    }
  z->have = -1;
  return st;
}

dt_status_t dt_zero3_gather(dt_zero_t *z, size_t lo, size_t hi) { return gather_start(z, lo, hi, NULL); }

void dt_zero3_bound(dt_zero_t *z, int blocks, size_t keep) {
  z->L = blocks < z->L ? blocks : z->L;
  z->keep = keep < z->n ? keep : z->n;
}

dt_status_t dt_zero3_release(dt_zero_t *z, size_t lo, size_t hi) {
  return clear_outside(z, z->params, z->esz, lo, hi < z->keep ? hi : z->keep);
}

dt_status_t dt_zero3_working(dt_zero_t *z, dt_backend_t *be) {
  if (be->wparams == be->params) return DT_OK; /* fp32: the gathers fill the master */
  if (be->act_bytes != 2 && be->act_bytes != 4)
    return DT_ERR(DT_ERR_INTERNAL, "zero: a working copy of %d-byte elements", be->act_bytes);
  z->params = (float *)be->wparams;
  z->esz = (size_t)be->act_bytes;
  z->work = be;
  be->wparams_by_sync = 1;
  return DT_OK;
}

dt_status_t dt_zero3_round(dt_zero_t *z) {
  size_t f = 0, n = 0;
  if (!z->work) return DT_OK;
  DT_TRY(as_floats(z->esz, z->lo, z->hi, &f, &n));
  if (z->dev) DT_TRY(z->dev->k->populate(z->dev, z->params + f, n)); /* a sparse working copy: written next */
  return z->work->k->round_copy(z->work, (dt_act_t *)(z->params + f), z->work->params + z->lo, z->shard);
}

dt_status_t dt_zero3_shard(dt_zero_t *z) {
  DT_TRY(dt_zero3_release(z, 0, z->n));
  return z->work ? clear_outside(z, z->work->params, sizeof(float), 0, z->keep) : DT_OK;
}

static dt_status_t block_start(dt_zero_t *z, int l) {
  z->have = l;
  return gather_start(z, z->group[l + 1], z->group[l + 2], z->req);
}

dt_status_t dt_zero2_hook(void *ctx, int l, dt_hook_phase_t phase) {
  dt_zero_t *z = ctx;
  return phase == DT_HOOK_BWD ? dt_zero_populate_grads(z, z->group[l + 1], z->group[l + 2]) : DT_OK;
}

dt_status_t dt_zero3_hook(void *ctx, int l, dt_hook_phase_t phase) {
  dt_zero_t *z = ctx;
  if (phase == DT_HOOK_FWD_DONE || phase == DT_HOOK_BWD_DONE) return dt_zero3_release(z, z->group[l + 1], z->group[l + 2]);
  DT_TRY(dt_zero2_hook(z, l, phase));
  double t0 = dt_time_now();
  if (z->have != l) { /* nothing prefetched for l (the first block of a pass): bring it now */
    DT_TRY(gather_wait(z));
    DT_TRY(block_start(z, l));
  }
  DT_TRY(gather_wait(z));
  z->t_wait += dt_time_now() - t0;
  int next = phase == DT_HOOK_FWD ? l + 1 : l - 1; /* prefetch the block that runs next */
  if (next >= 0 && next < z->L) DT_TRY(block_start(z, next));
  return DT_OK;
}
