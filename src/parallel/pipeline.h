/* Pipeline parallelism: the 1F1B schedule (pure, tested on its own) and the point-to-point
 * transfers between neighbouring stages.
 *
 * Schedule (PipeDream-flush / Megatron-LM's 1F1B) for stage s of pp with m micro-batches:
 * warm-up: w = min(pp - 1 - s, m) forwards; steady state: m - w times (forward of the next
 * micro-batch, backward of the oldest); cool-down: the w remaining backwards. Stage s then holds at
 * most min(pp - s, m) micro-batches of activations (dt_pp_inflight), and with equal stage times
 * the idle share of a step (the bubble) is (pp - 1) / (m + pp - 1) (dt_pp_bubble).
 *
 * Transfers: a forward receives x (B, T, C) from stage s - 1 and sends y to s + 1; a backward
 * receives dy from s + 1 and sends dx to s - 1. A send is deferred to the start of the stage's
 * next operation and completed together with that operation's receive in one group (both posted,
 * then both waited for), or alone if it receives nothing; every send has completed before the
 * next operation computes, so one send and one receive buffer suffice. This is Megatron's
 * send_forward_recv_backward / send_backward_recv_forward pairing and cannot deadlock under the
 * schedule above (dt_pp_simulate checks the dependency order; tests/pp_equiv.sh runs it). */
#ifndef DT_PIPELINE_H
#define DT_PIPELINE_H

#include <stddef.h>

#include "comm.h"
#include "status.h"

typedef struct {
  int fwd; /* 1 = forward, 0 = backward */
  int mb;  /* micro-batch 0..m-1 */
} dt_pp_op_t;

/* The 2m operations of stage s in order; returns 2m (0 for bad arguments). */
int dt_pp_schedule(int s, int pp, int m, dt_pp_op_t *ops);
/* Micro-batches whose activations stage s holds at once: min(pp - s, m). */
int dt_pp_inflight(int s, int pp, int m);
/* Idle share of a step with equal stage times: (pp - 1) / (m + pp - 1). */
double dt_pp_bubble(int pp, int m);
/* Run the schedules of all pp stages against their dependencies (forward of micro-batch k on s
 * after it on s - 1, backward on s after it on s + 1) with forward/backward times tf[s], tb[s]
 * per micro-batch and no transfer cost. Returns the step's makespan; busy[s] (may be NULL) gets
 * stage s's compute time. -1 if the schedules deadlock (an operation can never start). */
double dt_pp_simulate(int pp, int m, const double *tf, const double *tb, double *busy);

/* The transfer state of one rank: comm is the pipeline group (rank = stage). */
typedef struct {
  dt_comm_t *comm;
  void *stream;         /* the comm's stream argument (NCCL: the compute stream; MPI: NULL) */
  size_t esz;           /* bytes of an element (the backend's act_bytes; 0 = 4, floats) */
  const void *send_buf; /* deferred send, NULL = none */
  size_t send_n;
  int send_peer;
} dt_pipe_t;

/* Defer a send of n elements (activation storage, esz bytes each) to stage `peer` (completes any
 * earlier deferred send first). */
dt_status_t dt_pipe_send(dt_pipe_t *p, const void *buf, size_t n, int peer);
/* Receive n elements from stage `peer`, completing the deferred send (if any) in the same group. */
dt_status_t dt_pipe_recv(dt_pipe_t *p, void *buf, size_t n, int peer);
/* Complete the deferred send (if any) alone. */
dt_status_t dt_pipe_flush(dt_pipe_t *p);

#endif
