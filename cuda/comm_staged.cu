/* Device buffers over MPI, staged through pinned host memory (system.device_comm = mpi; see
 * dt_cuda.h). Every call: the caller's stream is drained of what it was computing (the copy out
 * is queued on that stream, then awaited), the MPI communicator (comm_mpi.c: checked calls, the
 * hang watchdog's deadline) works on the host copy, and the result is copied back on the same
 * stream, awaited again. So every call completes before it returns (*req = NULL): no overlap with
 * compute, the price of an MPI that cannot read device memory. Inside group_start/group_end the
 * MPI communicator defers blocking sends and receives to the outermost group_end, so each of them
 * gets its own host buffer, kept until then, and receives are copied to the device after it. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> /* Open MPI's MPIX_Query_cuda_support */
#endif

extern "C" {
#include "comm.h"
#include "dt_cuda.h"
}
#include "cuda_check.h"

typedef struct {
  void *host, *dev; /* a receive's host copy and its device destination (dev NULL: a send's) */
  size_t bytes;
  cudaStream_t stream;
} staged_op_t;

typedef struct {
  dt_comm_t *mpi; /* owned: over a duplicate of the MPI communicator */
  void *buf;      /* pinned, reused by calls outside a group */
  size_t buf_bytes;
  int depth;
  staged_op_t *ops; /* sends and receives of the open group */
  int n_ops, cap_ops;
} staged_t;

static staged_t *S(const dt_comm_t *c) { return (staged_t *)c->impl; }

/* A pinned host buffer of `bytes`: the shared one outside a group, a new one inside. */
static dt_status_t host_buf(staged_t *s, size_t bytes, void **out) {
  if (bytes == 0) bytes = 1;
  if (s->depth > 0) {
    DT_CUDA_CHECK(cudaMallocHost(out, bytes));
    return DT_OK;
  }
  if (bytes > s->buf_bytes) {
    if (s->buf) DT_CUDA_CHECK(cudaFreeHost(s->buf));
    s->buf = NULL, s->buf_bytes = 0;
    DT_CUDA_CHECK(cudaMallocHost(&s->buf, bytes));
    s->buf_bytes = bytes;
  }
  *out = s->buf;
  return DT_OK;
}

static dt_status_t to_host(void *h, const void *d, size_t bytes, void *stream) {
  if (bytes == 0) return DT_OK;
  DT_CUDA_CHECK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
  DT_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
  return DT_OK;
}

static dt_status_t to_device(void *d, const void *h, size_t bytes, void *stream) {
  if (bytes == 0) return DT_OK;
  DT_CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
  DT_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
  return DT_OK;
}

static dt_status_t done(dt_comm_req_t **req) {
  if (req) *req = NULL; /* complete already: callers treat a NULL request as done */
  return DT_OK;
}

static dt_status_t s_allreduce(dt_comm_t *c, const void *send, void *recv, size_t n, dt_dtype_t t, dt_redop_t op,
                               void *stream, dt_comm_req_t **req) {
  size_t b = n * dt_dtype_size(t);
  void *h;
  DT_TRY(host_buf(S(c), b, &h));
  DT_TRY(to_host(h, send, b, stream));
  DT_TRY(S(c)->mpi->ops->allreduce(S(c)->mpi, h, h, n, t, op, NULL, NULL));
  DT_TRY(to_device(recv, h, b, stream));
  return done(req);
}

static dt_status_t s_reduce_scatter(dt_comm_t *c, const void *send, void *recv, size_t rc, dt_dtype_t t,
                                    dt_redop_t op, void *stream, dt_comm_req_t **req) {
  size_t es = dt_dtype_size(t), b = (size_t)c->size * rc * es;
  ptrdiff_t at = (const char *)recv - (const char *)send; /* the in-place forms: recv inside send */
  int inside = at >= 0 && (size_t)at + rc * es <= b;
  void *h;
  DT_TRY(host_buf(S(c), b + (inside ? 0 : rc * es), &h));
  char *hr = (char *)h + (inside ? (size_t)at : b);
  DT_TRY(to_host(h, send, b, stream));
  DT_TRY(S(c)->mpi->ops->reduce_scatter(S(c)->mpi, h, hr, rc, t, op, NULL, NULL));
  DT_TRY(to_device(recv, hr, rc * es, stream));
  return done(req);
}

static dt_status_t s_allgather(dt_comm_t *c, const void *send, void *recv, size_t sc, dt_dtype_t t, void *stream,
                               dt_comm_req_t **req) {
  size_t es = dt_dtype_size(t), b = (size_t)c->size * sc * es;
  ptrdiff_t at = (const char *)send - (const char *)recv; /* the in-place forms: send inside recv */
  int inside = at >= 0 && (size_t)at + sc * es <= b;
  void *h;
  DT_TRY(host_buf(S(c), b + (inside ? 0 : sc * es), &h));
  char *hs = (char *)h + (inside ? (size_t)at : b);
  DT_TRY(to_host(hs, send, sc * es, stream));
  DT_TRY(S(c)->mpi->ops->allgather(S(c)->mpi, hs, h, sc, t, NULL, NULL));
  DT_TRY(to_device(recv, h, b, stream));
  return done(req);
}

static dt_status_t s_broadcast(dt_comm_t *c, void *buf, size_t n, dt_dtype_t t, int root, void *stream,
                               dt_comm_req_t **req) {
  size_t b = n * dt_dtype_size(t);
  void *h;
  DT_TRY(host_buf(S(c), b, &h));
  if (c->rank == root) DT_TRY(to_host(h, buf, b, stream));
  DT_TRY(S(c)->mpi->ops->broadcast(S(c)->mpi, h, n, t, root, NULL, NULL));
  if (c->rank != root) DT_TRY(to_device(buf, h, b, stream));
  return done(req);
}

static dt_status_t s_reduce(dt_comm_t *c, const void *send, void *recv, size_t n, dt_dtype_t t, dt_redop_t op,
                            int root, void *stream, dt_comm_req_t **req) {
  size_t b = n * dt_dtype_size(t);
  void *h;
  DT_TRY(host_buf(S(c), b, &h));
  DT_TRY(to_host(h, send, b, stream));
  DT_TRY(S(c)->mpi->ops->reduce(S(c)->mpi, h, h, n, t, op, root, NULL, NULL));
  if (c->rank == root) DT_TRY(to_device(recv, h, b, stream));
  return done(req);
}

/* Inside a group: the host copy is kept (and a receive's copied to the device) until group_end. */
static dt_status_t keep(staged_t *s, void *h, void *dev, size_t bytes, void *stream) {
  if (s->n_ops == s->cap_ops) {
    int cap = s->cap_ops ? 2 * s->cap_ops : 8;
    staged_op_t *o = (staged_op_t *)realloc(s->ops, (size_t)cap * sizeof *o);
    if (!o) return DT_ERR(DT_ERR_NOMEM, "staged communicator: out of memory");
    s->ops = o, s->cap_ops = cap;
  }
  s->ops[s->n_ops++] = (staged_op_t){h, dev, bytes, (cudaStream_t)stream};
  return DT_OK;
}

static dt_status_t s_send(dt_comm_t *c, const void *buf, size_t n, dt_dtype_t t, int peer, void *stream,
                          dt_comm_req_t **req) {
  size_t b = n * dt_dtype_size(t);
  void *h;
  DT_TRY(host_buf(S(c), b, &h));
  if (S(c)->depth > 0) DT_TRY(keep(S(c), h, NULL, b, stream));
  DT_TRY(to_host(h, buf, b, stream));
  DT_TRY(S(c)->mpi->ops->send(S(c)->mpi, h, n, t, peer, NULL, NULL));
  return done(req);
}

static dt_status_t s_recv(dt_comm_t *c, void *buf, size_t n, dt_dtype_t t, int peer, void *stream,
                          dt_comm_req_t **req) {
  size_t b = n * dt_dtype_size(t);
  void *h;
  DT_TRY(host_buf(S(c), b, &h));
  if (S(c)->depth > 0) DT_TRY(keep(S(c), h, buf, b, stream));
  DT_TRY(S(c)->mpi->ops->recv(S(c)->mpi, h, n, t, peer, NULL, NULL));
  if (S(c)->depth == 0) DT_TRY(to_device(buf, h, b, stream));
  return done(req);
}

static dt_status_t s_group_start(dt_comm_t *c) {
  S(c)->depth++;
  return S(c)->mpi->ops->group_start(S(c)->mpi);
}

static dt_status_t s_group_end(dt_comm_t *c) {
  staged_t *s = S(c);
  dt_status_t st = s->mpi->ops->group_end(s->mpi);
  if (--s->depth > 0) return st;
  for (int i = 0; i < s->n_ops; i++) { /* every buffer freed, also after a failure */
    staged_op_t *o = &s->ops[i];
    if (st == DT_OK && o->dev) st = to_device(o->dev, o->host, o->bytes, o->stream);
    if (cudaFreeHost(o->host) != cudaSuccess && st == DT_OK)
      st = DT_ERR(DT_ERR_CUDA, "staged communicator: cudaFreeHost failed");
  }
  s->n_ops = 0;
  return st;
}

static dt_status_t s_barrier(dt_comm_t *c) { return S(c)->mpi->ops->barrier(S(c)->mpi); }

static dt_status_t s_wait(dt_comm_t *c, dt_comm_req_t *req) {
  (void)c;
  return req ? DT_ERR(DT_ERR_INTERNAL, "staged communicator: wait on a request it never returned") : DT_OK;
}

static dt_status_t s_test(dt_comm_t *c, dt_comm_req_t *req, int *flag) {
  *flag = 1;
  return s_wait(c, req);
}

static dt_status_t s_split(dt_comm_t *c, int color, int key, dt_comm_t **out) {
  (void)c, (void)color, (void)key, (void)out;
  return DT_ERR(DT_ERR_UNSUPPORTED, "staged communicator: split the MPI communicator, then stage the part");
}

static void s_free(dt_comm_t *c) {
  if (!c) return;
  staged_t *s = S(c);
  if (s->mpi) s->mpi->ops->free(s->mpi);
  if (s->buf) cudaFreeHost(s->buf);
  free(s->ops);
  free(s);
  free(c);
}

extern "C" const dt_comm_ops_t dt_comm_staged_ops = {
    "mpi-staged", s_split,   s_free,   s_allreduce,   s_reduce_scatter, s_allgather, s_broadcast, s_send,
    s_recv,       s_barrier, s_wait,   s_test,        s_group_start,    s_group_end, s_reduce};

extern "C" int dt_mpi_cuda_aware(void) {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support();
#else
  return -1;
#endif
}

extern "C" dt_status_t dt_comm_staged_create(const void *mpi_comm, dt_comm_t **out) {
  *out = NULL;
  dt_comm_t *c = (dt_comm_t *)calloc(1, sizeof *c);
  staged_t *s = (staged_t *)calloc(1, sizeof *s);
  if (!c || !s) {
    free(c), free(s);
    return DT_ERR(DT_ERR_NOMEM, "staged communicator: out of memory");
  }
  c->ops = &dt_comm_staged_ops;
  c->impl = s;
  dt_status_t st = dt_comm_mpi_create(mpi_comm, &s->mpi);
  if (st != DT_OK) {
    s_free(c);
    return st;
  }
  c->rank = s->mpi->rank, c->size = s->mpi->size;
  *out = c;
  return DT_OK;
}
