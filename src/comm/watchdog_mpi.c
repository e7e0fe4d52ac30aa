/* The blocking MPI collectives dtrain calls outside the communicator vtable (checkpoints, launch
 * checks, error agreement), under the watchdog's deadline: the nonblocking form and dt_wd_wait
 * when the watchdog is on, the plain blocking call (timed) when it is off (watchdog.h). */
#include <time.h>

#include "watchdog.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t bytes_of(int n, MPI_Datatype t) {
  int sz = 0;
  if (n <= 0 || MPI_Type_size(t, &sz) != MPI_SUCCESS || sz < 0) return 0;
  return (size_t)n * (size_t)sz;
}

/* Complete a started request rq (MPI return code rc of the start) under the deadline. */
static int finish(int rc, MPI_Request *rq, const char *what, MPI_Comm c, size_t bytes) {
  if (rc != MPI_SUCCESS) return rc;
  dt_wd_op_t op = {.op = what, .comm = c, .bytes = bytes, .peer = -1};
  return dt_wd_wait(rq, MPI_STATUS_IGNORE, &op);
}

/* Run `blocking` when the watchdog is off (its time counted as waiting), else start `start`. */
#define WATCHED(blocking, start, what, c, bytes)              \
  do {                                                        \
    if (!dt_wd_on()) {                                        \
      double t0_ = now_s();                                   \
      int rc_ = (blocking);                                   \
      dt_wd_account(now_s() - t0_);                           \
      return rc_;                                             \
    }                                                         \
    MPI_Request rq_ = MPI_REQUEST_NULL;                       \
    int rc_ = (start);                                        \
    return finish(rc_, &rq_, (what), (c), (bytes));           \
  } while (0)

int dt_wd_allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c, const char *what) {
  WATCHED(MPI_Allreduce(s, r, n, t, o, c), MPI_Iallreduce(s, r, n, t, o, c, &rq_), what, c, bytes_of(n, t));
}

int dt_wd_bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c, const char *what) {
  WATCHED(MPI_Bcast(b, n, t, root, c), MPI_Ibcast(b, n, t, root, c, &rq_), what, c, bytes_of(n, t));
}

int dt_wd_barrier(MPI_Comm c, const char *what, int quiet) {
  if (!dt_wd_on() && !quiet) {
    double t0 = now_s();
    int rc = MPI_Barrier(c);
    dt_wd_account(now_s() - t0);
    return rc;
  }
  MPI_Request rq = MPI_REQUEST_NULL;
  int rc = MPI_Ibarrier(c, &rq);
  if (rc != MPI_SUCCESS) return rc;
  dt_wd_op_t op = {.op = what, .comm = c, .peer = -1, .quiet = quiet};
  if (dt_wd_on()) return dt_wd_wait(&rq, MPI_STATUS_IGNORE, &op);
  double t0 = now_s(); /* quiet, no deadline: test and sleep until done */
  int done = 0;
  while ((rc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !done) {
    struct timespec ts = {0, 200000}; /* 0.2 ms: a waiting rank leaves its core to the I/O */
    nanosleep(&ts, NULL);
  }
  dt_wd_account(now_s() - t0);
  return rc;
}

int dt_wd_allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c,
                    const char *what) {
  WATCHED(MPI_Allgather(s, sn, st, r, rn, rt, c), MPI_Iallgather(s, sn, st, r, rn, rt, c, &rq_), what, c,
          bytes_of(sn, st));
}

int dt_wd_allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *displs,
                     MPI_Datatype rt, MPI_Comm c, const char *what) {
  WATCHED(MPI_Allgatherv(s, sn, st, r, rn, displs, rt, c), MPI_Iallgatherv(s, sn, st, r, rn, displs, rt, c, &rq_),
          what, c, bytes_of(sn, st));
}

int dt_wd_gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c,
                 const char *what) {
  WATCHED(MPI_Gather(s, sn, st, r, rn, rt, root, c), MPI_Igather(s, sn, st, r, rn, rt, root, c, &rq_), what, c,
          bytes_of(sn, st));
}

int dt_wd_gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *displs,
                  MPI_Datatype rt, int root, MPI_Comm c, const char *what) {
  WATCHED(MPI_Gatherv(s, sn, st, r, rn, displs, rt, root, c), MPI_Igatherv(s, sn, st, r, rn, displs, rt, root, c, &rq_),
          what, c, bytes_of(sn, st));
}
