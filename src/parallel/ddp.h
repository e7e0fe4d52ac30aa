/* Data-parallel gradient averaging: the gradient arena is cut into buckets of about bucket_mb,
 * each a contiguous arena range. Backward reports ranges whose gradients are final (from the end
 * of the arena downwards); each bucket's in-place average all-reduce starts as soon as all of it
 * is final, so communication overlaps the rest of backward. dt_ddp_finish waits for all.
 * Two transports: the communicator's nonblocking all-reduce (MPI, NCCL), or, for host arenas of a
 * dp group on one node, the arenas themselves in shared memory (ddp_shm.c). */
#ifndef DT_DDP_H
#define DT_DDP_H

#include <stddef.h>

#include "comm.h"
#include "status.h"

typedef struct {
  size_t lo, hi;        /* arena range [lo, hi) in floats */
  dt_comm_req_t *req;   /* in flight, or NULL */
  int started;
} dt_bucket_t;

typedef struct dt_ddp_shm dt_ddp_shm_t;

typedef struct {
  dt_comm_t *comm;      /* data-parallel communicator */
  float *grads;         /* gradient arena (host for MPI, device for NCCL) */
  void *stream;         /* NULL for MPI */
  int n_buckets;
  dt_bucket_t *buckets; /* ordered from the end of the arena to the start */
  size_t ready_lo;      /* everything in [ready_lo, n) is final */
  size_t n;             /* arena size */
  dt_status_t err;      /* first failure inside the backward hook */
  double t_comm_wait;   /* seconds spent waiting in dt_ddp_finish (communication not hidden) */
  double t_skew;        /* probe steps (defer): seconds in the barrier before the all-reduces,
                           i.e. waiting for the slowest rank's backward, kept out of t_comm_wait */
  int defer;            /* this step: the hook only records what is ready; dt_ddp_finish starts
                           every all-reduce (sync.c's overlap probe) */
  /* Instead of the all-reduce: a blocking action on each bucket when it is final (ZeRO-2's
   * reduce to the owners, zero.h); NULL = all-reduce. */
  dt_status_t (*action)(void *ctx, float *grads, size_t lo, size_t hi);
  void *action_ctx;
  /* With an action: arena range [hold_lo, hold_hi) is left out of it (the caller handles it
   * after the step: pipeline parallelism's tied embedding under ZeRO-2); empty = none. */
  size_t hold_lo, hold_hi;
  dt_ddp_shm_t *shm;    /* the arenas in shared memory (dt_ddp_shm_init), or NULL */
} dt_ddp_t;

/* group_begin: the layout's group start offsets (n_groups+1 entries, last = n); buckets are
 * unions of whole groups, cut when they reach bucket_bytes. */
dt_status_t dt_ddp_init(dt_ddp_t *d, dt_comm_t *comm, float *grads, size_t n, const size_t *group_begin,
                        int n_groups, size_t bucket_bytes);
void dt_ddp_free(dt_ddp_t *d);
/* Reset for a new optimizer step. */
void dt_ddp_begin(dt_ddp_t *d);
/* The backward hook (dt_grad_ready_fn): ctx is a dt_ddp_t. */
void dt_ddp_ready(void *ctx, size_t lo, size_t hi);
/* Start what has not started, wait for everything; gradients are then averaged over ranks. */
dt_status_t dt_ddp_finish(dt_ddp_t *d);

/* Shared-memory transport (parallel.ddp_comm): after dt_ddp_init, collective over d->comm. Puts
 * this rank's gradient arena (page-aligned host memory, e.g. an anonymous mapping) into a file in
 * /dev/shm shared by the group, mapped at the same address; its contents are not kept (the
 * gradients are zeroed at every step). When the group is not on one node, its communicator is not
 * MPI's or the memory is not there: with `required` an error, else DT_OK, d->shm NULL and `why`
 * says why. dt_ddp_free releases it; the arena's own mapping stays the owner's to unmap. */
dt_status_t dt_ddp_shm_init(dt_ddp_t *d, int required, char *why, size_t whylen);
void dt_ddp_shm_free(dt_ddp_shm_t *s);
void dt_ddp_shm_begin(dt_ddp_t *d);
void dt_ddp_shm_ready(dt_ddp_t *d);
dt_status_t dt_ddp_shm_finish(dt_ddp_t *d);

#endif
