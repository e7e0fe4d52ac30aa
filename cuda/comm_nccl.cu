/* NCCL communicator (dt_comm_nccl_ops, see dt_cuda.h and comm.h) on device buffers. Creation is
 * collective over an MPI communicator: rank 0's ncclGetUniqueId is broadcast over MPI, every
 * rank sets its device and joins with ncclCommInitRankConfig. Communicators are NONBLOCKING
 * (config.blocking = 0) so that no NCCL call can hang: every call is followed by polling
 * ncclCommGetAsyncError, and every wait polls its event, both under a timeout after which the
 * communicator is aborted (ncclCommAbort) and the error names rank, host, device and the
 * operation in flight. Requests are CUDA events recorded on the operation's stream. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

extern "C" {
#include "comm.h"
#include "dt_cuda.h"
#include "watchdog.h"
}
#include "cuda_check.h"

static_assert(sizeof(ncclUniqueId) == DT_NCCL_ID_BYTES, "ncclUniqueId is not 128 bytes");

#define MAX_GROUP_STREAMS 16

struct dt_comm_req {
  cudaEvent_t ev;
  cudaStream_t stream;
  double t0;
  size_t bytes;
  char what[96];
};

typedef struct {
  ncclComm_t comm;
  cudaStream_t own;   /* used when the caller passes stream = NULL */
  cudaEvent_t sync;   /* blocking calls wait on this */
  int *scratch;       /* device int for barrier */
  int device;
  double timeout;
  int aborted;
  int group_depth;
  dt_comm_req_t **pending; /* requests started inside a group: recorded at group_end */
  int n_pending, cap_pending;
  cudaStream_t group_streams[MAX_GROUP_STREAMS]; /* streams of blocking calls inside a group */
  int n_group_streams;
  char inflight[96];
  size_t bytes;                      /* of the call in flight */
  MPI_Comm mpi;                      /* the MPI communicator it was made from (not owned; NULL after split) */
  char name[MPI_MAX_OBJECT_NAME + 8]; /* for the watchdog's message */
} nccl_impl_t;

static nccl_impl_t *impl(const dt_comm_t *c) { return (nccl_impl_t *)c->impl; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double timeout_from_env(double t) {
  if (t > 0) return t;
  const char *e = getenv("DTRAIN_NCCL_TIMEOUT");
  if (e && *e) {
    char *end = NULL;
    double v = strtod(e, &end);
    if (end && *end == '\0' && v > 0) return v;
  }
  return 600.0;
}

/* Abort the communicator and record why (the collective in flight, who, where). */
static dt_status_t abort_with(dt_comm_t *c, const char *what, const char *why) {
  nccl_impl_t *m = impl(c);
  if (m->comm && !m->aborted) ncclCommAbort(m->comm);
  m->aborted = 1;
  m->comm = NULL;
  return DT_ERR(DT_ERR_NCCL, "rank %d (host %s, device %d): NCCL %s failed on rank %d of %d in its communicator: %s; "
                "communicator aborted",
                dt_err_rank(), dt__hostname(), m->device, what, c->rank, c->size, why);
}

/* With the hang watchdog on (system.comm_timeout), its deadline replaces the communicator's own
 * timeout: past it the job ends with DT_EXIT_HANG and one line naming the collective (watchdog.h). */
static void watchdog_check(dt_comm_t *c, const char *what, size_t bytes, double t0) {
  nccl_impl_t *m = impl(c);
  dt_wd_op_t op;
  memset(&op, 0, sizeof op);
  op.op = what;
  op.comm = m->mpi;
  op.comm_name = m->name;
  op.bytes = bytes;
  op.peer = -1;
  dt_wd_check(t0, &op);
}

/* After an NCCL call on a nonblocking communicator: wait until it has been issued (the async
 * state leaves ncclInProgress), under the timeout. */
static dt_status_t settle_comm(dt_comm_t *c, ncclComm_t comm, ncclResult_t rc, const char *what) {
  nccl_impl_t *m = impl(c);
  if (rc != ncclSuccess && rc != ncclInProgress) return abort_with(c, what, ncclGetErrorString(rc));
  double t0 = now_s();
  for (;;) {
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &st);
    if (q != ncclSuccess) return abort_with(c, what, ncclGetErrorString(q));
    if (st == ncclSuccess) return DT_OK;
    if (st != ncclInProgress) return abort_with(c, what, ncclGetErrorString(st));
    if (dt_wd_on()) watchdog_check(c, what, m->bytes, t0);
    else if (now_s() - t0 > m->timeout) {
      char why[96];
      snprintf(why, sizeof why, "not issued after %.0f s (timeout)", m->timeout);
      return abort_with(c, what, why);
    }
    usleep(100);
  }
}

static dt_status_t settle(dt_comm_t *c, ncclResult_t rc, const char *what) {
  return settle_comm(c, impl(c)->comm, rc, what);
}

/* Poll ev until the work before it is done; NCCL's async errors and the timeout abort. */
static dt_status_t poll_event(dt_comm_t *c, cudaEvent_t ev, double t0, const char *what, size_t bytes, int *done,
                              int block) {
  nccl_impl_t *m = impl(c);
  for (;;) {
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) {
      *done = 1;
      return DT_OK;
    }
    if (q != cudaErrorNotReady) {
      cudaGetLastError();
      return abort_with(c, what, cudaGetErrorString(q));
    }
    ncclResult_t st = ncclSuccess;
    if (m->comm && ncclCommGetAsyncError(m->comm, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
      return abort_with(c, what, ncclGetErrorString(st));
    if (dt_wd_on()) watchdog_check(c, what, bytes, t0);
    else if (now_s() - t0 > m->timeout) {
      char why[96];
      snprintf(why, sizeof why, "not complete after %.0f s (timeout; a peer may have died or hung)", m->timeout);
      return abort_with(c, what, why);
    }
    if (!block) {
      *done = 0;
      return DT_OK;
    }
    usleep(50);
  }
}

/* ---- issuing ------------------------------------------------------------------------------ */

static dt_status_t nccl_type(dt_dtype_t t, ncclDataType_t *out) {
  switch (t) {
    case DT_F32: *out = ncclFloat32; return DT_OK;
    case DT_F64: *out = ncclFloat64; return DT_OK;
    case DT_I32: *out = ncclInt32; return DT_OK;
    case DT_I64: *out = ncclInt64; return DT_OK;
    case DT_U8: *out = ncclUint8; return DT_OK;
  }
  return DT_ERR(DT_ERR_ARG, "nccl: unknown dtype %d", (int)t);
}

static dt_status_t nccl_op(dt_redop_t op, dt_dtype_t t, ncclRedOp_t *out) {
  switch (op) {
    case DT_SUM: *out = ncclSum; return DT_OK;
    case DT_AVG:
      if (t != DT_F32 && t != DT_F64)
        return DT_ERR(DT_ERR_ARG, "nccl: DT_AVG needs a float type (got %s)", dt_dtype_name(t));
      *out = ncclAvg;
      return DT_OK;
    case DT_MAX: *out = ncclMax; return DT_OK;
    case DT_MIN: *out = ncclMin; return DT_OK;
  }
  return DT_ERR(DT_ERR_ARG, "nccl: unknown reduction %d", (int)op);
}

/* Checks common to every operation; *s = the stream to use. */
static dt_status_t begin(dt_comm_t *c, size_t count, void *stream, cudaStream_t *s, const char *fmt_what,
                         dt_dtype_t t) {
  nccl_impl_t *m = impl(c);
  snprintf(m->inflight, sizeof m->inflight, "%s of %zu %s", fmt_what, count, dt_dtype_name(t));
  m->bytes = count * dt_dtype_size(t);
  if (m->aborted)
    return DT_ERR(DT_ERR_NCCL, "rank %d (host %s, device %d): NCCL %s on an aborted communicator", dt_err_rank(),
                  dt__hostname(), m->device, m->inflight);
  if (count > (size_t)INT_MAX)
    return DT_ERR(DT_ERR_ARG, "nccl: %s count %zu exceeds INT_MAX elements (split the buffer)", fmt_what, count);
  *s = stream ? (cudaStream_t)stream : m->own;
  DT_CUDA_CHECK(cudaSetDevice(m->device));
  return DT_OK;
}

/* The call was issued on stream s: hand back a request, defer it to group_end, or complete it. */
static dt_status_t finish(dt_comm_t *c, cudaStream_t s, dt_comm_req_t **req) {
  nccl_impl_t *m = impl(c);
  if (req) {
    dt_comm_req_t *r = (dt_comm_req_t *)calloc(1, sizeof *r);
    if (!r) return DT_ERR(DT_ERR_NOMEM, "nccl: out of memory for a request");
    DT_CUDA_CHECK(cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming));
    r->stream = s;
    r->t0 = now_s();
    r->bytes = m->bytes;
    snprintf(r->what, sizeof r->what, "%s", m->inflight);
    if (m->group_depth > 0) { /* the work is enqueued at ncclGroupEnd: record the event then */
      if (m->n_pending == m->cap_pending) {
        int cap = m->cap_pending ? 2 * m->cap_pending : 16;
        dt_comm_req_t **p = (dt_comm_req_t **)realloc(m->pending, (size_t)cap * sizeof *p);
        if (!p) return DT_ERR(DT_ERR_NOMEM, "nccl: out of memory for group requests");
        m->pending = p;
        m->cap_pending = cap;
      }
      m->pending[m->n_pending++] = r;
    } else {
      DT_CUDA_CHECK(cudaEventRecord(r->ev, s));
    }
    *req = r;
    return DT_OK;
  }
  if (m->group_depth > 0) { /* blocking inside a group: completes at the outermost group_end */
    for (int i = 0; i < m->n_group_streams; i++)
      if (m->group_streams[i] == s) return DT_OK;
    if (m->n_group_streams == MAX_GROUP_STREAMS)
      return DT_ERR(DT_ERR_ARG, "nccl: more than %d streams in one group", MAX_GROUP_STREAMS);
    m->group_streams[m->n_group_streams++] = s;
    return DT_OK;
  }
  DT_CUDA_CHECK(cudaEventRecord(m->sync, s));
  int done = 0;
  return poll_event(c, m->sync, now_s(), m->inflight, m->bytes, &done, 1);
}

static int overlap(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

static dt_status_t c_allreduce(dt_comm_t *c, const void *send, void *recv, size_t count, dt_dtype_t t, dt_redop_t op,
                               void *stream, dt_comm_req_t **req) {
  cudaStream_t s;
  ncclDataType_t nt;
  ncclRedOp_t no;
  DT_TRY(begin(c, count, stream, &s, "allreduce", t));
  DT_TRY(nccl_type(t, &nt));
  DT_TRY(nccl_op(op, t, &no));
  size_t bytes = count * dt_dtype_size(t);
  if (send != recv && overlap(send, bytes, recv, bytes))
    return DT_ERR(DT_ERR_ARG, "nccl: allreduce buffers overlap without being in place");
  DT_TRY(settle(c, ncclAllReduce(send, recv, count, nt, no, impl(c)->comm, s), impl(c)->inflight));
  return finish(c, s, req);
}

static dt_status_t c_reduce_scatter(dt_comm_t *c, const void *send, void *recv, size_t recvcount, dt_dtype_t t,
                                    dt_redop_t op, void *stream, dt_comm_req_t **req) {
  cudaStream_t s;
  ncclDataType_t nt;
  ncclRedOp_t no;
  DT_TRY(begin(c, recvcount, stream, &s, "reduce_scatter", t));
  DT_TRY(nccl_type(t, &nt));
  DT_TRY(nccl_op(op, t, &no));
  size_t es = dt_dtype_size(t), block = recvcount * es;
  char *own = (char *)send + (size_t)c->rank * block;
  int mpi_style = recv == send && c->rank != 0; /* result wanted in block 0: reduce into own block, move */
  if (recv != send && (void *)own != recv && overlap(send, block * (size_t)c->size, recv, block))
    return DT_ERR(DT_ERR_ARG, "nccl: reduce_scatter buffers overlap without being in place");
  void *dst = mpi_style ? (void *)own : recv;
  DT_TRY(settle(c, ncclReduceScatter(send, dst, recvcount, nt, no, impl(c)->comm, s), impl(c)->inflight));
  if (mpi_style) {
    if (impl(c)->group_depth > 0)
      return DT_ERR(DT_ERR_UNSUPPORTED, "nccl: reduce_scatter with recv == send (MPI style) inside a group; pass "
                    "recv = send + rank*recvcount");
    DT_CUDA_CHECK(cudaMemcpyAsync(recv, own, block, cudaMemcpyDeviceToDevice, s));
  }
  return finish(c, s, req);
}

static dt_status_t c_allgather(dt_comm_t *c, const void *send, void *recv, size_t sendcount, dt_dtype_t t,
                               void *stream, dt_comm_req_t **req) {
  cudaStream_t s;
  ncclDataType_t nt;
  DT_TRY(begin(c, sendcount, stream, &s, "allgather", t));
  DT_TRY(nccl_type(t, &nt));
  size_t block = sendcount * dt_dtype_size(t);
  char *own = (char *)recv + (size_t)c->rank * block;
  if (send == recv && c->rank != 0) { /* this rank's data in block 0: move it to its block first */
    DT_CUDA_CHECK(cudaMemcpyAsync(own, recv, block, cudaMemcpyDeviceToDevice, s));
    send = own;
  }
  if (send != recv && send != (void *)own && overlap(send, block, recv, block * (size_t)c->size))
    return DT_ERR(DT_ERR_ARG, "nccl: allgather buffers overlap without being in place");
  DT_TRY(settle(c, ncclAllGather(send, recv, sendcount, nt, impl(c)->comm, s), impl(c)->inflight));
  return finish(c, s, req);
}

static dt_status_t c_broadcast(dt_comm_t *c, void *buf, size_t count, dt_dtype_t t, int root, void *stream,
                               dt_comm_req_t **req) {
  cudaStream_t s;
  ncclDataType_t nt;
  DT_TRY(begin(c, count, stream, &s, "broadcast", t));
  DT_TRY(nccl_type(t, &nt));
  if (root < 0 || root >= c->size) return DT_ERR(DT_ERR_ARG, "nccl: broadcast root %d outside [0, %d)", root, c->size);
  DT_TRY(settle(c, ncclBroadcast(buf, buf, count, nt, root, impl(c)->comm, s), impl(c)->inflight));
  return finish(c, s, req);
}

static dt_status_t c_reduce(dt_comm_t *c, const void *send, void *recv, size_t count, dt_dtype_t t, dt_redop_t op,
                            int root, void *stream, dt_comm_req_t **req) {
  cudaStream_t s;
  ncclDataType_t nt;
  ncclRedOp_t no;
  DT_TRY(begin(c, count, stream, &s, "reduce", t));
  DT_TRY(nccl_type(t, &nt));
  DT_TRY(nccl_op(op, t, &no));
  if (root < 0 || root >= c->size) return DT_ERR(DT_ERR_ARG, "nccl: reduce root %d outside [0, %d)", root, c->size);
  size_t bytes = count * dt_dtype_size(t);
  if (c->rank == root && send != recv && overlap(send, bytes, recv, bytes))
    return DT_ERR(DT_ERR_ARG, "nccl: reduce buffers overlap without being in place");
  DT_TRY(settle(c, ncclReduce(send, recv, count, nt, no, root, impl(c)->comm, s), impl(c)->inflight));
  return finish(c, s, req);
}

static dt_status_t c_send(dt_comm_t *c, const void *buf, size_t count, dt_dtype_t t, int peer, void *stream,
                          dt_comm_req_t **req) {
  cudaStream_t s;
  ncclDataType_t nt;
  DT_TRY(begin(c, count, stream, &s, "send", t));
  DT_TRY(nccl_type(t, &nt));
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return DT_ERR(DT_ERR_ARG, "nccl: send to peer %d (rank %d of %d)", peer, c->rank, c->size);
  DT_TRY(settle(c, ncclSend(buf, count, nt, peer, impl(c)->comm, s), impl(c)->inflight));
  return finish(c, s, req);
}

static dt_status_t c_recv(dt_comm_t *c, void *buf, size_t count, dt_dtype_t t, int peer, void *stream,
                          dt_comm_req_t **req) {
  cudaStream_t s;
  ncclDataType_t nt;
  DT_TRY(begin(c, count, stream, &s, "recv", t));
  DT_TRY(nccl_type(t, &nt));
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return DT_ERR(DT_ERR_ARG, "nccl: recv from peer %d (rank %d of %d)", peer, c->rank, c->size);
  DT_TRY(settle(c, ncclRecv(buf, count, nt, peer, impl(c)->comm, s), impl(c)->inflight));
  return finish(c, s, req);
}

static dt_status_t c_barrier(dt_comm_t *c) {
  nccl_impl_t *m = impl(c);
  if (m->group_depth > 0) return DT_ERR(DT_ERR_ARG, "nccl: barrier inside a group");
  return c_allreduce(c, m->scratch, m->scratch, 1, DT_I32, DT_SUM, NULL, NULL);
}

static dt_status_t c_wait(dt_comm_t *c, dt_comm_req_t *r) {
  int done = 0;
  dt_status_t st = poll_event(c, r->ev, r->t0, r->what, r->bytes, &done, 1);
  cudaEventDestroy(r->ev);
  free(r);
  return st;
}

static dt_status_t c_test(dt_comm_t *c, dt_comm_req_t *r, int *done) {
  dt_status_t st = poll_event(c, r->ev, r->t0, r->what, r->bytes, done, 0);
  if (st != DT_OK || *done) {
    cudaEventDestroy(r->ev);
    free(r);
    *done = 1;
  }
  return st;
}

static dt_status_t c_group_start(dt_comm_t *c) {
  nccl_impl_t *m = impl(c);
  snprintf(m->inflight, sizeof m->inflight, "group_start");
  DT_TRY(settle(c, ncclGroupStart(), "ncclGroupStart"));
  m->group_depth++;
  return DT_OK;
}

static dt_status_t c_group_end(dt_comm_t *c) {
  nccl_impl_t *m = impl(c);
  if (m->group_depth < 1) return DT_ERR(DT_ERR_ARG, "nccl: group_end without group_start");
  m->group_depth--;
  dt_status_t st = settle(c, ncclGroupEnd(), "group (ncclGroupEnd)");
  if (m->group_depth > 0) return st;
  /* the group's work is enqueued now: record deferred requests, complete blocking calls */
  for (int i = 0; i < m->n_pending; i++)
    if (st == DT_OK && cudaEventRecord(m->pending[i]->ev, m->pending[i]->stream) != cudaSuccess)
      st = DT_ERR(DT_ERR_CUDA, "nccl: cudaEventRecord failed for a grouped request");
  m->n_pending = 0;
  for (int i = 0; i < m->n_group_streams && st == DT_OK; i++) {
    int done = 0;
    if (cudaEventRecord(m->sync, m->group_streams[i]) != cudaSuccess)
      st = DT_ERR(DT_ERR_CUDA, "nccl: cudaEventRecord failed at group_end");
    else
      st = poll_event(c, m->sync, now_s(), "group (blocking calls)", 0, &done, 1);
  }
  m->n_group_streams = 0;
  return st;
}

/* ---- creation ----------------------------------------------------------------------------- */


extern "C" dt_status_t dt_comm_nccl_unique_id(const void *mpi_comm, unsigned char id[DT_NCCL_ID_BYTES]) {
  MPI_Comm mc = *(const MPI_Comm *)mpi_comm;
  int rank = 0;
  DT_MPI_CHECK(MPI_Comm_rank(mc, &rank));
  struct {
    int ok;
    char msg[200];
    ncclUniqueId id;
  } b;
  memset(&b, 0, sizeof b);
  if (rank == 0) {
    ncclResult_t rc = ncclGetUniqueId(&b.id);
    b.ok = rc == ncclSuccess;
    if (!b.ok) snprintf(b.msg, sizeof b.msg, "host %s: ncclGetUniqueId failed: %s", dt__hostname(), ncclGetErrorString(rc));
  }
  DT_MPI_CHECK(dt_wd_bcast(&b, (int)sizeof b, MPI_BYTE, 0, mc, "broadcast of the NCCL unique id"));
  if (!b.ok) return DT_ERR(DT_ERR_NCCL, "rank %d: NCCL unique id from rank 0 of the communicator: %s", dt_err_rank(), b.msg);
  memcpy(id, &b.id, DT_NCCL_ID_BYTES);
  return DT_OK;
}

static void nccl_release(dt_comm_t *c, int destroy_comm) {
  nccl_impl_t *m = impl(c);
  if (m) {
    if (m->device >= 0) cudaSetDevice(m->device);
    if (m->comm && destroy_comm) {
      /* nonblocking communicator: finalize, wait for it, destroy; abort if that fails */
      ncclResult_t rc = ncclCommFinalize(m->comm);
      if ((rc == ncclSuccess || rc == ncclInProgress) && settle(c, rc, "finalize") == DT_OK)
        ncclCommDestroy(m->comm);
      else if (m->comm)
        ncclCommAbort(m->comm);
    } else if (m->comm) {
      ncclCommAbort(m->comm);
    }
    if (m->sync) cudaEventDestroy(m->sync);
    if (m->own) cudaStreamDestroy(m->own);
    if (m->scratch) cudaFree(m->scratch);
    free(m->pending);
    free(m);
  }
  free(c);
}

static void c_free(dt_comm_t *c) {
  if (c) nccl_release(c, 1);
}

/* The per-rank CUDA side of a communicator once NCCL has it: stream, event, barrier scratch. */
static dt_status_t local_setup(dt_comm_t *c) {
  nccl_impl_t *m = impl(c);
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&m->own, cudaStreamNonBlocking));
  DT_CUDA_CHECK(cudaEventCreateWithFlags(&m->sync, cudaEventDisableTiming));
  DT_CUDA_CHECK(cudaMalloc((void **)&m->scratch, sizeof(int)));
  DT_CUDA_CHECK(cudaMemset(m->scratch, 0, sizeof(int)));
  return DT_OK;
}

/* device >= 0: cudaSetDevice(device); < 0: keep the current device. */
static dt_status_t select_device(dt_comm_t *c, int device) {
  if (device >= 0) DT_CUDA_CHECK(cudaSetDevice(device));
  impl(c)->device = device;
  if (device < 0 && cudaGetDevice(&impl(c)->device) != cudaSuccess) {
    cudaGetLastError();
    impl(c)->device = -1;
  }
  return DT_OK;
}

static dt_status_t new_comm(dt_comm_t **out, int rank, int size, double timeout) {
  dt_comm_t *c = (dt_comm_t *)calloc(1, sizeof *c);
  nccl_impl_t *m = (nccl_impl_t *)calloc(1, sizeof *m);
  if (!c || !m) {
    free(c);
    free(m);
    return DT_ERR(DT_ERR_NOMEM, "nccl: out of memory");
  }
  c->ops = &dt_comm_nccl_ops;
  c->rank = rank;
  c->size = size;
  c->impl = m;
  m->device = -1;
  m->timeout = timeout;
  m->mpi = MPI_COMM_NULL;
  *out = c;
  return DT_OK;
}

extern "C" dt_status_t dt_comm_nccl_create(const void *mpi_comm, int device, double timeout_s, dt_comm_t **out) {
  *out = NULL;
  MPI_Comm mc = *(const MPI_Comm *)mpi_comm;
  int rank = 0, size = 1;
  DT_MPI_CHECK(MPI_Comm_rank(mc, &rank));
  DT_MPI_CHECK(MPI_Comm_size(mc, &size));
  unsigned char id[DT_NCCL_ID_BYTES];
  DT_TRY(dt_comm_nccl_unique_id(mpi_comm, id)); /* agreed: every rank has the id or the same error */
  dt_comm_t *c = NULL;
  dt_status_t st = new_comm(&c, rank, size, timeout_from_env(timeout_s));
  if (st == DT_OK) st = select_device(c, device);
  /* nobody enters ncclCommInitRank unless every rank can (no peer waiting for a missing rank) */
  dt_status_t ag = dt_mpi_agree(mc, st);
  if (ag != DT_OK) {
    if (c && ag != DT_ERR_MPI) nccl_release(c, 0);
    return ag;
  }
  nccl_impl_t *m = impl(c);
  m->mpi = mc;
  char mn[MPI_MAX_OBJECT_NAME] = "";
  int mnl = 0;
  MPI_Comm_get_name(mc, mn, &mnl);
  snprintf(m->name, sizeof m->name, "%s (NCCL)", mn);
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  snprintf(m->inflight, sizeof m->inflight, "init (ncclCommInitRankConfig, %d ranks)", size);
  ncclResult_t rc = ncclCommInitRankConfig(&m->comm, size, uid, rank, &cfg);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    st = abort_with(c, m->inflight, ncclGetErrorString(rc));
  } else {
    st = settle(c, rc, m->inflight);
  }
  if (st == DT_OK) st = local_setup(c);
  ag = dt_mpi_agree(mc, st);
  if (ag != DT_OK) { /* every rank drops its half-made communicator */
    if (ag != DT_ERR_MPI) nccl_release(c, 0);
    return ag;
  }
  *out = c;
  return DT_OK;
}

static dt_status_t c_split(dt_comm_t *c, int color, int key, dt_comm_t **out) {
  nccl_impl_t *m = impl(c);
  *out = NULL;
  if (color < 0) return DT_ERR(DT_ERR_ARG, "nccl: split color %d must be >= 0", color);
  if (m->aborted) return DT_ERR(DT_ERR_NCCL, "nccl: split of an aborted communicator");
  DT_CUDA_CHECK(cudaSetDevice(m->device));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t nc = NULL;
  snprintf(m->inflight, sizeof m->inflight, "split (ncclCommSplit color %d key %d)", color, key);
  ncclResult_t rc = ncclCommSplit(m->comm, color, key, &nc, &cfg);
  DT_TRY(settle(c, rc, m->inflight));
  if (nc) DT_TRY(settle_comm(c, nc, ncclSuccess, m->inflight));
  int r = 0, n = 0;
  if (!nc) return DT_ERR(DT_ERR_NCCL, "nccl: ncclCommSplit returned no communicator for color %d", color);
  DT_NCCL_CHECK(ncclCommUserRank(nc, &r));
  DT_NCCL_CHECK(ncclCommCount(nc, &n));
  dt_comm_t *sc = NULL;
  dt_status_t st = new_comm(&sc, r, n, m->timeout);
  if (st == DT_OK) {
    impl(sc)->device = m->device;
    st = local_setup(sc);
  }
  if (st != DT_OK) {
    ncclCommAbort(nc);
    if (sc) nccl_release(sc, 0);
    return st;
  }
  impl(sc)->comm = nc;
  impl(sc)->mpi = MPI_COMM_NULL;
  snprintf(impl(sc)->name, sizeof impl(sc)->name, "split of %.*s", MPI_MAX_OBJECT_NAME - 2, m->name);
  *out = sc;
  return DT_OK;
}

extern "C" const dt_comm_ops_t dt_comm_nccl_ops = {
    "nccl",  c_split, c_free,    c_allreduce, c_reduce_scatter, c_allgather,    c_broadcast,
    c_send,  c_recv,  c_barrier, c_wait,      c_test,           c_group_start, c_group_end, c_reduce,
};
