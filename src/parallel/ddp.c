/* Bucketed, overlapped gradient all-reduce for data parallelism (see ddp.h). */
#include "ddp.h"

#include <stdlib.h>

#include "timer.h"

dt_status_t dt_ddp_init(dt_ddp_t *d, dt_comm_t *comm, float *grads, size_t n, const size_t *group_begin,
                        int n_groups, size_t bucket_bytes) {
  *d = (dt_ddp_t){.comm = comm, .grads = grads, .n = n, .err = DT_OK};
  size_t limit = bucket_bytes / sizeof(float);
  if (limit < 1) limit = 1;
  /* Buckets: unions of whole groups from the end, closed once they reach the limit; a group
   * larger than the limit (the embeddings: 155 MB at 124M) is cut into limit-sized pieces, so
   * no single all-reduce (and no MPI temporary for it) exceeds about one bucket. */
  size_t cap = (size_t)n_groups + n / limit + 1;
  d->buckets = calloc(cap, sizeof *d->buckets);
  if (!d->buckets) return DT_ERR(DT_ERR_NOMEM, "ddp: out of memory");
  size_t hi = n;
  for (int g = n_groups - 1; g >= 0; g--) {
    size_t lo = group_begin[g];
    while (hi - lo > limit) { /* a whole piece of at most limit floats at the top */
      d->buckets[d->n_buckets++] = (dt_bucket_t){.lo = hi - limit, .hi = hi};
      hi -= limit;
    }
    if (hi - lo >= limit || (g == 0 && hi > lo)) {
      d->buckets[d->n_buckets++] = (dt_bucket_t){.lo = lo, .hi = hi};
      hi = lo;
    }
  }
  return DT_OK;
}

void dt_ddp_free(dt_ddp_t *d) {
  dt_ddp_shm_free(d->shm);
  d->shm = NULL;
  free(d->buckets);
  d->buckets = NULL;
}

void dt_ddp_begin(dt_ddp_t *d) {
  d->ready_lo = d->n;
  d->err = DT_OK;
  d->t_comm_wait = 0;
  d->t_skew = 0;
  for (int i = 0; i < d->n_buckets; i++) {
    d->buckets[i].req = NULL;
    d->buckets[i].started = 0;
  }
  if (d->shm) dt_ddp_shm_begin(d);
}

/* At most DT_DDP_IN_FLIGHT all-reduces at once (the oldest is completed first): each nonblocking
 * MPI all-reduce holds a temporary of its size until it completes. */
#define DT_DDP_IN_FLIGHT 2

static void start(dt_ddp_t *d, dt_bucket_t *b) {
  b->started = 1;
  if (d->err != DT_OK) return;
  if (d->action) { /* on the parts of the bucket outside the held range */
    size_t hl = d->hold_lo > b->lo ? d->hold_lo : b->lo, hh = d->hold_hi < b->hi ? d->hold_hi : b->hi;
    if (hl >= hh) {
      d->err = d->action(d->action_ctx, d->grads, b->lo, b->hi);
      return;
    }
    if (b->lo < hl) d->err = d->action(d->action_ctx, d->grads, b->lo, hl);
    if (d->err == DT_OK && hh < b->hi) d->err = d->action(d->action_ctx, d->grads, hh, b->hi);
    return;
  }
  int busy = 0;
  for (dt_bucket_t *o = d->buckets; o < b; o++) busy += o->req != NULL;
  for (dt_bucket_t *o = d->buckets; o < b && busy >= DT_DDP_IN_FLIGHT && d->err == DT_OK; o++)
    if (o->req) {
      double t0 = dt_time_now();
      d->err = d->comm->ops->wait(d->comm, o->req);
      d->t_comm_wait += dt_time_now() - t0;
      o->req = NULL;
      busy--;
    }
  if (d->err != DT_OK) return;
  float *p = d->grads + b->lo;
  d->err = d->comm->ops->allreduce(d->comm, p, p, b->hi - b->lo, DT_F32, DT_AVG, d->stream, &b->req);
}

void dt_ddp_ready(void *ctx, size_t lo, size_t hi) {
  dt_ddp_t *d = ctx;
  (void)hi;
  if (lo < d->ready_lo) d->ready_lo = lo;
  if (d->shm) {
    dt_ddp_shm_ready(d);
    return;
  }
  if (d->defer) return;
  for (int i = 0; i < d->n_buckets; i++) {
    dt_bucket_t *b = &d->buckets[i];
    if (!b->started && b->lo >= d->ready_lo) start(d, b);
    /* Poke the in-flight ones so MPI makes progress while backward computes. */
    if (b->req && d->err == DT_OK) {
      int done = 0;
      d->err = d->comm->ops->test(d->comm, b->req, &done);
      if (done) b->req = NULL;
    }
  }
}

dt_status_t dt_ddp_finish(dt_ddp_t *d) {
  if (d->defer && d->err == DT_OK) { /* the probe times the all-reduce alone: every rank starts it together */
    double tb = dt_time_now();
    d->err = d->comm->ops->barrier(d->comm);
    d->t_skew += dt_time_now() - tb;
  }
  double t0 = dt_time_now();
  if (d->shm) {
    if (d->err == DT_OK) d->err = dt_ddp_shm_finish(d);
    d->t_comm_wait += dt_time_now() - t0;
    return d->err;
  }
  for (int i = 0; i < d->n_buckets; i++)
    if (!d->buckets[i].started) start(d, &d->buckets[i]);
  for (int i = 0; i < d->n_buckets; i++) {
    dt_bucket_t *b = &d->buckets[i];
    if (b->req) {
      dt_status_t st = d->comm->ops->wait(d->comm, b->req);
      if (d->err == DT_OK) d->err = st;
      b->req = NULL;
    }
  }
  d->t_comm_wait += dt_time_now() - t0;
  return d->err;
}
