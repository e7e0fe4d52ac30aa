/* Hang watchdog: a deadline on every blocking wait for other ranks (collectives, point-to-point,
 * checkpoint barriers). The communicators start the nonblocking form of a call and complete it
 * in a test loop (dt_wd_wait); a wait that passes system.comm_timeout asks every rank which of
 * them are stuck too (a census: point-to-point messages on MPI_COMM_WORLD, which dtrain uses for
 * nothing else), prints one line naming this rank, the step, the operation and the ranks that did
 * not report, and ends the whole job with DT_EXIT_HANG (75, "requeue"). Also counts the seconds spent waiting (straggler report).
 * Internal header: the state is one per process, set once by dt_wd_start. */
#ifndef DT_WATCHDOG_H
#define DT_WATCHDOG_H

#include <stddef.h>

#include <mpi.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit status of a job ended by the watchdog: EX_TEMPFAIL, the same "requeue" status as a
 * signal-triggered checkpoint (train.h DT_EXIT_REQUEUE); the sbatch template requeues on it. */
#define DT_EXIT_HANG 75

/* One blocking operation, for the message. */
typedef struct {
  const char *op;        /* "allreduce", "recv", "barrier (checkpoint)", ... */
  MPI_Comm comm;         /* its communicator (name, ranks); MPI_COMM_NULL if not an MPI one */
  const char *comm_name; /* overrides MPI_Comm_get_name when set (NCCL) */
  size_t bytes;          /* this rank's payload */
  int peer;              /* rank in comm of the peer of a send/recv, -1 for a collective */
  int quiet;             /* sleep 0.2 ms between tests (leave the core to I/O) */
} dt_wd_op_t;

/* Set the deadlines (seconds; timeout 0 = off) and run the first collective of the job under
 * `first` (0 = timeout): a gather of every rank's node name (SLURMD_NODENAME, else the host name)
 * over MPI_COMM_WORLD. Collective over MPI_COMM_WORLD. */
dt_status_t dt_wd_start(double timeout, double first);
/* Deadlines off, host table freed (before MPI_Finalize). */
void dt_wd_stop(void);
/* 1 when deadlines are on (the communicators then use nonblocking calls and dt_wd_wait). */
int dt_wd_on(void);
double dt_wd_timeout(void);
/* The optimizer step being run (1-based, as logged; 0 = setup), for the message. */
void dt_wd_set_step(long step);
/* Seconds spent in blocking waits so far (dt_wd_wait and dt_wd_account). */
double dt_wd_wait_seconds(void);
void dt_wd_account(double seconds);

/* Complete *req (MPI_Test loop) under the deadline; returns MPI's return code. Past the deadline
 * it does not return: dt_wd_expire. */
int dt_wd_wait(MPI_Request *req, MPI_Status *status, const dt_wd_op_t *op);
/* For wait loops that are not MPI requests (shared-memory counters): call every 0.1-1 s while
 * waiting since t0 (dt_wd_now()); does not return once the deadline has passed or another rank
 * has started the census. */
void dt_wd_check(double t0, const dt_wd_op_t *op);
double dt_wd_now(void);
/* The deadline has passed after `waited` seconds: census, one line, MPI_Abort(DT_EXIT_HANG). */
void dt_wd_expire(const dt_wd_op_t *op, double waited) __attribute__((noreturn));

/* The blocking MPI collectives dtrain calls directly (checkpoints, launch checks), under the
 * deadline when it is on (the plain blocking call otherwise); same arguments and return codes. */
int dt_wd_allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c, const char *what);
int dt_wd_bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c, const char *what);
int dt_wd_barrier(MPI_Comm c, const char *what, int quiet);
int dt_wd_allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c,
                    const char *what);
int dt_wd_allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *displs,
                     MPI_Datatype rt, MPI_Comm c, const char *what);
int dt_wd_gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c,
                 const char *what);
int dt_wd_gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *displs,
                  MPI_Datatype rt, int root, MPI_Comm c, const char *what);

#ifdef __cplusplus
}
#endif
#endif
