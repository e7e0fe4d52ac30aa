/* MPI communicator (dt_comm_mpi_ops) on host buffers: blocking MPI collectives when req == NULL,
 * otherwise the nonblocking forms with a heap request that dt_comm wait/test complete and free.
 * Work MPI cannot do (the DT_AVG division, moving an in-place block) is recorded in the request
 * and done at completion. With the hang watchdog on (watchdog.h), blocking calls are started
 * nonblocking and completed under its deadline. */
#include "comm.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "mpi_check.h"
#include "watchdog.h"

typedef struct {
  MPI_Comm comm;
  int group_depth;          /* nesting of group_start */
  dt_comm_req_t **pending;  /* requests deferred to the outermost group_end */
  int n_pending, cap_pending;
} mpi_impl_t;

struct dt_comm_req {
  MPI_Request mreq;
  /* after completion: copy move_bytes from move_src to move_dst, then divide scale_n elements
   * of type t at scale by scale_div (scale_div 0 = nothing to do) */
  void *move_dst;
  const void *move_src;
  size_t move_bytes;
  void *scale;
  size_t scale_n;
  dt_dtype_t t;
  int scale_div;
  void *corrupt;      /* a blocking call run as a request (watchdog): fault_corrupt(corrupt, */
  size_t corrupt_n;   /* corrupt_n, t) at completion */
  const char *what;   /* for the watchdog's message: operation, this rank's bytes, peer (-1) */
  const char *call;   /* the blocking MPI call it stands for (errors name it), NULL = MPI_Wait */
  size_t bytes;
  int peer;
};

/* ---- types ------------------------------------------------------------------------------- */

size_t dt_dtype_size(dt_dtype_t t) {
  switch (t) {
    case DT_F32: return 4;
    case DT_F64: return 8;
    case DT_I32: return 4;
    case DT_I64: return 8;
    case DT_U8: return 1;
  }
  return 0;
}

const char *dt_dtype_name(dt_dtype_t t) {
  switch (t) {
    case DT_F32: return "f32";
    case DT_F64: return "f64";
    case DT_I32: return "i32";
    case DT_I64: return "i64";
    case DT_U8: return "u8";
  }
  return "?";
}

static dt_status_t mpi_type(dt_dtype_t t, MPI_Datatype *out) {
  switch (t) {
    case DT_F32: *out = MPI_FLOAT; return DT_OK;
    case DT_F64: *out = MPI_DOUBLE; return DT_OK;
    case DT_I32: *out = MPI_INT32_T; return DT_OK;
    case DT_I64: *out = MPI_INT64_T; return DT_OK;
    case DT_U8: *out = MPI_UINT8_T; return DT_OK;
  }
  return DT_ERR(DT_ERR_ARG, "comm: unknown dtype %d", (int)t);
}

static dt_status_t mpi_op(dt_redop_t op, dt_dtype_t t, MPI_Op *out) {
  switch (op) {
    case DT_SUM: *out = MPI_SUM; return DT_OK;
    case DT_AVG:
      if (t != DT_F32 && t != DT_F64)
        return DT_ERR(DT_ERR_ARG, "comm: DT_AVG needs a float type (got %s)", dt_dtype_name(t));
      *out = MPI_SUM;
      return DT_OK;
    case DT_MAX: *out = MPI_MAX; return DT_OK;
    case DT_MIN: *out = MPI_MIN; return DT_OK;
  }
  return DT_ERR(DT_ERR_ARG, "comm: unknown reduction %d", (int)op);
}

static dt_status_t check_count(size_t count, const char *what) {
  if (count > (size_t)INT_MAX)
    return DT_ERR(DT_ERR_ARG, "comm: %s count %zu exceeds INT_MAX elements (split the buffer)", what, count);
  return DT_OK;
}

/* DT_AVG: x / div. A power-of-two div multiplies by its reciprocal, which is exact, so the result is
 * bitwise the quotient's, at memory speed instead of a divider's (124M floats: ~130 ms -> ~40 ms
 * on a Zen 4 core, the largest CPU cost of DDP's gradient all-reduce at dp = 2). */
static void scale_div(void *buf, size_t n, dt_dtype_t t, int div) {
  int pow2 = div > 0 && (div & (div - 1)) == 0;
  if (t == DT_F32) {
    float *p = buf, d = (float)div, r = 1.0f / d;
    if (pow2)
      for (size_t i = 0; i < n; i++) p[i] *= r;
    else
      for (size_t i = 0; i < n; i++) p[i] /= d;
  } else if (t == DT_F64) {
    double *p = buf, d = (double)div, r = 1.0 / d;
    if (pow2)
      for (size_t i = 0; i < n; i++) p[i] *= r;
    else
      for (size_t i = 0; i < n; i++) p[i] /= d;
  }
}

static int overlap(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

static int world_rank(void) {
  int r = dt_err_rank();
  if (r < 0) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/* Test-only (fault.h, bad_allreduce): +1 in the middle element of a float result on the faulty
 * rank (integer results, used for launch and consistency checks, are left alone). */
static void fault_corrupt(void *buf, size_t n, dt_dtype_t t) {
  if (n == 0 || !buf || (t != DT_F32 && t != DT_F64) || !dt_fault("bad_allreduce", world_rank(), -1)) return;
  if (t == DT_F32) ((float *)buf)[n / 2] += 1.0f;
  else ((double *)buf)[n / 2] += 1.0;
}

/* ---- requests ---------------------------------------------------------------------------- */

static mpi_impl_t *impl(const dt_comm_t *c) { return (mpi_impl_t *)c->impl; }

static dt_comm_req_t *req_new(void) {
  dt_comm_req_t *r = calloc(1, sizeof *r);
  if (r) r->mreq = MPI_REQUEST_NULL, r->peer = -1;
  return r;
}

static void req_finish(dt_comm_req_t *r) {
  if (r->move_bytes) memmove(r->move_dst, r->move_src, r->move_bytes);
  if (r->scale_div) scale_div(r->scale, r->scale_n, r->t, r->scale_div);
  if (r->corrupt) fault_corrupt(r->corrupt, r->corrupt_n, r->t);
}

/* Hand a started request to the caller, defer it to group_end, or complete it now. */
static dt_status_t req_deliver(dt_comm_t *c, dt_comm_req_t *r, dt_comm_req_t **req) {
  if (req) {
    *req = r;
    return DT_OK;
  }
  mpi_impl_t *m = impl(c);
  if (m->group_depth > 0) {
    if (m->n_pending == m->cap_pending) {
      int cap = m->cap_pending ? 2 * m->cap_pending : 16;
      dt_comm_req_t **p = realloc(m->pending, (size_t)cap * sizeof *p);
      if (!p) {
        MPI_Wait(&r->mreq, MPI_STATUS_IGNORE);
        free(r);
        return DT_ERR(DT_ERR_NOMEM, "comm: out of memory for group requests");
      }
      m->pending = p;
      m->cap_pending = cap;
    }
    m->pending[m->n_pending++] = r;
    return DT_OK;
  }
  return dt_comm_mpi_ops.wait(c, r);
}

#define NEW_REQ(r)                                                                  \
  dt_comm_req_t *r = req_new();                                                     \
  if (!r) return DT_ERR(DT_ERR_NOMEM, "comm: out of memory for a request")

/* Start call (which fills r->mreq); on failure free r and return the error. */
#define START(r, call)                                                                \
  do {                                                                                \
    int rc_ = (call);                                                                 \
    if (rc_ != MPI_SUCCESS) {                                                         \
      free(r);                                                                        \
      return dt__mpi_error(rc_, #call, __FILE__, __LINE__);                           \
    }                                                                                 \
  } while (0)

static int immediate(const dt_comm_t *c, dt_comm_req_t **req) { return !req && impl(c)->group_depth == 0; }
/* An immediate call made as the blocking MPI call: the watchdog is off (else it is started and
 * completed under the deadline). */
static int blocking(const dt_comm_t *c, dt_comm_req_t **req) { return immediate(c, req) && !dt_wd_on(); }

/* A blocking MPI call whose time counts as waiting for other ranks (the straggler report). */
#define TIMED_CHECK(call)                   \
  do {                                      \
    double t0_ = dt_wd_now();               \
    DT_MPI_CHECK(call);                     \
    dt_wd_account(dt_wd_now() - t0_);       \
  } while (0)

/* What the watchdog says about r; a blocking call run as a request also gets its test fault. */
static void label(dt_comm_req_t *r, const char *what, size_t bytes, int peer, const char *blocking_call, void *res,
                  size_t n, dt_dtype_t t) {
  r->what = what;
  r->call = blocking_call;
  r->bytes = bytes;
  r->peer = peer;
  r->t = t;
  if (blocking_call) r->corrupt = res, r->corrupt_n = n;
}

/* ---- operations -------------------------------------------------------------------------- */

/* DT_AVG on a nonblocking request: divide by the group size when the request completes. */
static void defer_avg(dt_comm_req_t *r, void *buf, size_t n, dt_dtype_t t, int size) {
  r->scale = buf;
  r->scale_n = n;
  r->t = t;
  r->scale_div = size;
}

/* A blocking all-reduce (root < 0) or reduce with the watchdog on: the nonblocking form in pieces
 * of at most WATCHED_PIECE bytes, each completed under the deadline. Open MPI's nonblocking
 * reductions take a temporary as large as the message (ZeRO-2's 25 MiB buckets in one piece:
 * +54 MiB peak RSS), its blocking ones pipeline small segments. Elementwise: the same result. */
#define WATCHED_PIECE ((size_t)4 << 20)
static dt_status_t watched_reduction(dt_comm_t *c, const void *sb, void *rb, size_t count, dt_dtype_t t,
                                     MPI_Datatype mt, MPI_Op mo, int root) {
  size_t es = dt_dtype_size(t), step = WATCHED_PIECE / es, off = 0;
  MPI_Comm comm = impl(c)->comm;
  dt_wd_op_t op = {.op = root < 0 ? "allreduce" : "reduce", .comm = comm, .bytes = count * es, .peer = -1};
  do {
    size_t n = count - off < step ? count - off : step;
    const void *s = sb == MPI_IN_PLACE ? sb : (const char *)sb + off * es;
    void *r = rb ? (char *)rb + off * es : NULL;
    MPI_Request rq = MPI_REQUEST_NULL;
    int rc = root < 0 ? MPI_Iallreduce(s, r, (int)n, mt, mo, comm, &rq)
                      : MPI_Ireduce(s, r, (int)n, mt, mo, root, comm, &rq);
    if (rc == MPI_SUCCESS) rc = dt_wd_wait(&rq, MPI_STATUS_IGNORE, &op);
    if (rc != MPI_SUCCESS) return dt__mpi_error(rc, root < 0 ? "MPI_Allreduce" : "MPI_Reduce", __FILE__, __LINE__);
    off += n;
  } while (off < count);
  return DT_OK;
}

static dt_status_t c_allreduce(dt_comm_t *c, const void *send, void *recv, size_t count, dt_dtype_t t,
                               dt_redop_t op, void *stream, dt_comm_req_t **req) {
  (void)stream;
  MPI_Datatype mt;
  MPI_Op mo;
  DT_TRY(mpi_type(t, &mt));
  DT_TRY(mpi_op(op, t, &mo));
  DT_TRY(check_count(count, "allreduce"));
  size_t bytes = count * dt_dtype_size(t);
  if (send != recv && overlap(send, bytes, recv, bytes))
    return DT_ERR(DT_ERR_ARG, "comm: allreduce buffers overlap without being in place");
  const void *sb = send == recv ? MPI_IN_PLACE : send;
  MPI_Comm comm = impl(c)->comm;
  if (immediate(c, req)) {
    if (dt_wd_on()) DT_TRY(watched_reduction(c, sb, recv, count, t, mt, mo, -1));
    else TIMED_CHECK(MPI_Allreduce(sb, recv, (int)count, mt, mo, comm));
    if (op == DT_AVG) scale_div(recv, count, t, c->size);
    fault_corrupt(recv, count, t);
    return DT_OK;
  }
  NEW_REQ(r);
  START(r, MPI_Iallreduce(sb, recv, (int)count, mt, mo, comm, &r->mreq));
  label(r, "allreduce", bytes, -1, NULL, NULL, 0, t);
  if (op == DT_AVG) defer_avg(r, recv, count, t, c->size);
  return req_deliver(c, r, req);
}

static dt_status_t c_reduce(dt_comm_t *c, const void *send, void *recv, size_t count, dt_dtype_t t, dt_redop_t op,
                            int root, void *stream, dt_comm_req_t **req) {
  (void)stream;
  MPI_Datatype mt;
  MPI_Op mo;
  DT_TRY(mpi_type(t, &mt));
  DT_TRY(mpi_op(op, t, &mo));
  DT_TRY(check_count(count, "reduce"));
  if (root < 0 || root >= c->size) return DT_ERR(DT_ERR_ARG, "comm: reduce root %d outside 0..%d", root, c->size - 1);
  int me = c->rank == root;
  size_t bytes = count * dt_dtype_size(t);
  if (me && send != recv && overlap(send, bytes, recv, bytes))
    return DT_ERR(DT_ERR_ARG, "comm: reduce buffers overlap without being in place");
  const void *sb = me && send == recv ? MPI_IN_PLACE : send;
  void *rb = me ? recv : NULL;
  MPI_Comm comm = impl(c)->comm;
  if (immediate(c, req)) {
    if (dt_wd_on()) DT_TRY(watched_reduction(c, sb, rb, count, t, mt, mo, root));
    else TIMED_CHECK(MPI_Reduce(sb, rb, (int)count, mt, mo, root, comm));
    if (me && op == DT_AVG) scale_div(recv, count, t, c->size);
    if (me) fault_corrupt(recv, count, t);
    return DT_OK;
  }
  NEW_REQ(r);
  START(r, MPI_Ireduce(sb, rb, (int)count, mt, mo, root, comm, &r->mreq));
  label(r, "reduce", bytes, -1, NULL, NULL, 0, t);
  if (me && op == DT_AVG) defer_avg(r, recv, count, t, c->size);
  return req_deliver(c, r, req);
}

static dt_status_t c_reduce_scatter(dt_comm_t *c, const void *send, void *recv, size_t recvcount, dt_dtype_t t,
                                    dt_redop_t op, void *stream, dt_comm_req_t **req) {
  (void)stream;
  MPI_Datatype mt;
  MPI_Op mo;
  DT_TRY(mpi_type(t, &mt));
  DT_TRY(mpi_op(op, t, &mo));
  DT_TRY(check_count(recvcount, "reduce_scatter"));
  size_t blk = recvcount * dt_dtype_size(t);
  char *own = (char *)send + (size_t)c->rank * blk; /* NCCL-style in-place destination */
  const void *sb = send;
  void *rb = recv, *dst = NULL;
  if (recv == send) {
    sb = MPI_IN_PLACE;
  } else if ((char *)recv == own) {
    sb = MPI_IN_PLACE; /* MPI leaves the result in block 0; move it to this rank's block */
    rb = (void *)send;
    dst = recv;
  } else if (overlap(send, blk * (size_t)c->size, recv, blk)) {
    return DT_ERR(DT_ERR_ARG, "comm: reduce_scatter buffers overlap without being in place");
  }
  void *res = dst ? dst : recv;
  MPI_Comm comm = impl(c)->comm;
  if (blocking(c, req)) {
    TIMED_CHECK(MPI_Reduce_scatter_block(sb, rb, (int)recvcount, mt, mo, comm));
    if (dst && dst != rb) memmove(dst, rb, blk);
    if (op == DT_AVG) scale_div(res, recvcount, t, c->size);
    fault_corrupt(res, recvcount, t);
    return DT_OK;
  }
  NEW_REQ(r);
  START(r, MPI_Ireduce_scatter_block(sb, rb, (int)recvcount, mt, mo, comm, &r->mreq));
  label(r, "reduce_scatter", blk * (size_t)c->size, -1, immediate(c, req) ? "MPI_Reduce_scatter_block" : NULL, res,
        recvcount, t);
  if (dst && dst != rb) {
    r->move_dst = dst;
    r->move_src = rb;
    r->move_bytes = blk;
  }
  if (op == DT_AVG) defer_avg(r, res, recvcount, t, c->size);
  return req_deliver(c, r, req);
}

static dt_status_t c_allgather(dt_comm_t *c, const void *send, void *recv, size_t sendcount, dt_dtype_t t,
                               void *stream, dt_comm_req_t **req) {
  (void)stream;
  MPI_Datatype mt;
  DT_TRY(mpi_type(t, &mt));
  DT_TRY(check_count(sendcount, "allgather"));
  size_t blk = sendcount * dt_dtype_size(t);
  char *own = (char *)recv + (size_t)c->rank * blk;
  const void *sb = send;
  if ((const char *)send == own) {
    sb = MPI_IN_PLACE;
  } else if (send == recv) {
    memmove(own, recv, blk); /* this rank's data sits in block 0: put it in its own block */
    sb = MPI_IN_PLACE;
  } else if (overlap(send, blk, recv, blk * (size_t)c->size)) {
    return DT_ERR(DT_ERR_ARG, "comm: allgather buffers overlap without being in place");
  }
  MPI_Comm comm = impl(c)->comm;
  if (blocking(c, req)) {
    TIMED_CHECK(MPI_Allgather(sb, (int)sendcount, mt, recv, (int)sendcount, mt, comm));
    fault_corrupt(recv, sendcount * (size_t)c->size, t);
    return DT_OK;
  }
  NEW_REQ(r);
  START(r, MPI_Iallgather(sb, (int)sendcount, mt, recv, (int)sendcount, mt, comm, &r->mreq));
  label(r, "allgather", blk, -1, immediate(c, req) ? "MPI_Allgather" : NULL, recv, sendcount * (size_t)c->size, t);
  return req_deliver(c, r, req);
}

static dt_status_t c_broadcast(dt_comm_t *c, void *buf, size_t count, dt_dtype_t t, int root, void *stream,
                               dt_comm_req_t **req) {
  (void)stream;
  MPI_Datatype mt;
  DT_TRY(mpi_type(t, &mt));
  DT_TRY(check_count(count, "broadcast"));
  if (root < 0 || root >= c->size)
    return DT_ERR(DT_ERR_ARG, "comm: broadcast root %d outside 0..%d", root, c->size - 1);
  MPI_Comm comm = impl(c)->comm;
  if (blocking(c, req)) {
    TIMED_CHECK(MPI_Bcast(buf, (int)count, mt, root, comm));
    return DT_OK;
  }
  NEW_REQ(r);
  START(r, MPI_Ibcast(buf, (int)count, mt, root, comm, &r->mreq));
  label(r, "broadcast", count * dt_dtype_size(t), -1, immediate(c, req) ? "MPI_Bcast" : NULL, NULL, 0, t);
  return req_deliver(c, r, req);
}

static dt_status_t check_peer(const dt_comm_t *c, int peer, const char *what, dt_comm_req_t **req) {
  if (peer < 0 || peer >= c->size)
    return DT_ERR(DT_ERR_ARG, "comm: %s peer %d outside 0..%d", what, peer, c->size - 1);
  if (peer == c->rank && immediate(c, req))
    return DT_ERR(DT_ERR_ARG, "comm: blocking %s to itself (rank %d) would deadlock; use a request or a group",
                  what, peer);
  return DT_OK;
}

static dt_status_t c_send(dt_comm_t *c, const void *buf, size_t count, dt_dtype_t t, int peer, void *stream,
                          dt_comm_req_t **req) {
  (void)stream;
  MPI_Datatype mt;
  DT_TRY(mpi_type(t, &mt));
  DT_TRY(check_count(count, "send"));
  DT_TRY(check_peer(c, peer, "send", req));
  MPI_Comm comm = impl(c)->comm;
  if (blocking(c, req)) {
    TIMED_CHECK(MPI_Send(buf, (int)count, mt, peer, DT_COMM_MPI_TAG, comm));
    return DT_OK;
  }
  NEW_REQ(r);
  START(r, MPI_Isend(buf, (int)count, mt, peer, DT_COMM_MPI_TAG, comm, &r->mreq));
  label(r, "send", count * dt_dtype_size(t), peer, immediate(c, req) ? "MPI_Send" : NULL, NULL, 0, t);
  return req_deliver(c, r, req);
}

static dt_status_t c_recv(dt_comm_t *c, void *buf, size_t count, dt_dtype_t t, int peer, void *stream,
                          dt_comm_req_t **req) {
  (void)stream;
  MPI_Datatype mt;
  DT_TRY(mpi_type(t, &mt));
  DT_TRY(check_count(count, "recv"));
  DT_TRY(check_peer(c, peer, "recv", req));
  MPI_Comm comm = impl(c)->comm;
  if (blocking(c, req)) {
    TIMED_CHECK(MPI_Recv(buf, (int)count, mt, peer, DT_COMM_MPI_TAG, comm, MPI_STATUS_IGNORE));
    return DT_OK;
  }
  NEW_REQ(r);
  START(r, MPI_Irecv(buf, (int)count, mt, peer, DT_COMM_MPI_TAG, comm, &r->mreq));
  label(r, "recv", count * dt_dtype_size(t), peer, immediate(c, req) ? "MPI_Recv" : NULL, NULL, 0, t);
  return req_deliver(c, r, req);
}

static dt_status_t c_barrier(dt_comm_t *c) {
  DT_MPI_CHECK(dt_wd_barrier(impl(c)->comm, "barrier", 0));
  return DT_OK;
}

static dt_status_t c_wait(dt_comm_t *c, dt_comm_req_t *r) {
  if (!r) return DT_ERR(DT_ERR_ARG, "comm: wait on a NULL request");
  MPI_Status stt;
  dt_wd_op_t op = {.op = r->what ? r->what : "request", .comm = impl(c)->comm, .bytes = r->bytes, .peer = r->peer};
  int rc = dt_wd_wait(&r->mreq, &stt, &op);
  if (rc == MPI_ERR_IN_STATUS) rc = stt.MPI_ERROR;
  if (rc != MPI_SUCCESS) {
    const char *call = r->call ? r->call : "MPI_Wait";
    free(r);
    return dt__mpi_error(rc, call, __FILE__, __LINE__);
  }
  req_finish(r);
  free(r);
  return DT_OK;
}

static dt_status_t c_test(dt_comm_t *c, dt_comm_req_t *r, int *done) {
  (void)c;
  *done = 0;
  if (!r) return DT_ERR(DT_ERR_ARG, "comm: test on a NULL request");
  int flag = 0;
  int rc = MPI_Test(&r->mreq, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    free(r);
    *done = 1;
    return dt__mpi_error(rc, "MPI_Test", __FILE__, __LINE__);
  }
  if (flag) {
    req_finish(r);
    free(r);
    *done = 1;
  }
  return DT_OK;
}

static dt_status_t c_group_start(dt_comm_t *c) {
  impl(c)->group_depth++;
  return DT_OK;
}

static dt_status_t c_group_end(dt_comm_t *c) {
  mpi_impl_t *m = impl(c);
  if (m->group_depth <= 0) return DT_ERR(DT_ERR_ARG, "comm: group_end without group_start");
  if (--m->group_depth > 0) return DT_OK;
  dt_status_t st = DT_OK;
  for (int i = 0; i < m->n_pending; i++) {
    dt_status_t s = c_wait(c, m->pending[i]); /* waits all, keeps the first error */
    if (st == DT_OK) st = s;
  }
  m->n_pending = 0;
  return st;
}

/* ---- creation ---------------------------------------------------------------------------- */

static dt_status_t wrap(MPI_Comm comm, dt_comm_t **out) {
  *out = NULL;
  DT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  dt_comm_t *c = calloc(1, sizeof *c);
  mpi_impl_t *m = calloc(1, sizeof *m);
  if (!c || !m) {
    free(c);
    free(m);
    MPI_Comm_free(&comm);
    return DT_ERR(DT_ERR_NOMEM, "comm: out of memory");
  }
  m->comm = comm;
  c->ops = &dt_comm_mpi_ops;
  c->impl = m;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &c->rank));
  DT_MPI_CHECK(MPI_Comm_size(comm, &c->size));
  *out = c;
  return DT_OK;
}

dt_status_t dt_comm_mpi_create(const void *mpi_comm, dt_comm_t **out) {
  *out = NULL;
  if (!mpi_comm) return DT_ERR(DT_ERR_ARG, "comm: dt_comm_mpi_create needs a pointer to an MPI_Comm");
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return DT_ERR(DT_ERR_MPI, "comm: MPI is not initialised (call MPI_Init first)");
  MPI_Comm dup;
  DT_MPI_CHECK(MPI_Comm_dup(*(const MPI_Comm *)mpi_comm, &dup));
  return wrap(dup, out);
}

dt_status_t dt_comm_mpi_handle(const dt_comm_t *c, void *mpi_comm_out) {
  if (!c || c->ops != &dt_comm_mpi_ops) return DT_ERR(DT_ERR_ARG, "comm: not an MPI communicator");
  *(MPI_Comm *)mpi_comm_out = impl(c)->comm;
  return DT_OK;
}

static dt_status_t c_split(dt_comm_t *c, int color, int key, dt_comm_t **out) {
  *out = NULL;
  if (color < 0) return DT_ERR(DT_ERR_ARG, "comm: split color %d must be >= 0", color);
  MPI_Comm nc;
  DT_MPI_CHECK(MPI_Comm_split(impl(c)->comm, color, key, &nc));
  return wrap(nc, out);
}

static void c_free(dt_comm_t *c) {
  if (!c) return;
  mpi_impl_t *m = impl(c);
  if (m) {
    for (int i = 0; i < m->n_pending; i++) c_wait(c, m->pending[i]);
    free(m->pending);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&m->comm);
    free(m);
  }
  free(c);
}

const dt_comm_ops_t dt_comm_mpi_ops = {
    .name = "mpi",
    .split = c_split,
    .free = c_free,
    .allreduce = c_allreduce,
    .reduce_scatter = c_reduce_scatter,
    .allgather = c_allgather,
    .broadcast = c_broadcast,
    .send = c_send,
    .recv = c_recv,
    .barrier = c_barrier,
    .wait = c_wait,
    .test = c_test,
    .group_start = c_group_start,
    .group_end = c_group_end,
    .reduce = c_reduce,
};
