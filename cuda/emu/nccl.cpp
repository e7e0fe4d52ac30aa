/* CUDA emulation: NCCL over MPI (nccl.h). ncclGetUniqueId writes the creator's MPI_COMM_WORLD rank
 * into the id; ncclCommInitRank sends (nccl rank, world rank) to the creator over MPI_COMM_WORLD
 * (a tag derived from the id), the creator answers with the table, and every member calls
 * MPI_Comm_create_group, which involves only the members: ranks ordered as NCCL numbers them.
 * Calls are checked when issued (device buffers of the communicator's device, in range; types
 * MPI has) and queued on their stream; when the stream runs they start nonblocking MPI
 * operations on host copies of their buffers and test them: the stream stays at the call until
 * every peer has taken part (cudaEventQuery says cudaErrorNotReady meanwhile, as on a GPU, so a
 * stalled peer reaches dtrain's polling and its hang watchdog). Calls between ncclGroupStart and ncclGroupEnd become one queued
 * operation (started together, so a send/recv ring cannot deadlock) on the first call's stream,
 * ordered after the other calls' streams' earlier work and before their later work. ncclAvg is
 * the sum divided by the rank count (as comm_mpi.c does). 16-bit types are not emulated. */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "emu_int.h"
#include "nccl.h"

struct dt_emu_nccl {
  MPI_Comm mc;
  int rank, size, device;
  ncclResult_t async;
  int aborted; /* by ncclCommAbort: its calls still queued finish without doing anything */
};

namespace dt_emu {

enum { C_ALLREDUCE, C_REDUCE, C_BCAST, C_REDUCE_SCATTER, C_ALLGATHER, C_SEND, C_RECV };
static const char *const CALL_NAME[] = {"ncclAllReduce", "ncclReduce", "ncclBroadcast", "ncclReduceScatter",
                                        "ncclAllGather", "ncclSend", "ncclRecv"};
static const int P2P_TAG = 7412;

struct call_t {
  int kind;
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t t;
  ncclRedOp_t op;
  int root; /* or the peer of send/recv */
  dt_emu_nccl *c;
  stream_t *s;
};

static const char ID_MAGIC[8] = "dtEMUid";
struct emu_id_t {
  char magic[8];
  int creator; /* MPI_COMM_WORLD rank */
  int counter;
  long pid;
};
static thread_local int t_group_depth;
static thread_local std::vector<call_t> t_group;

static MPI_Datatype mpi_type(ncclDataType_t t, size_t *size) {
  switch (t) {
    case ncclInt8: *size = 1; return MPI_INT8_T;
    case ncclUint8: *size = 1; return MPI_UINT8_T;
    case ncclInt32: *size = 4; return MPI_INT32_T;
    case ncclUint32: *size = 4; return MPI_UINT32_T;
    case ncclInt64: *size = 8; return MPI_INT64_T;
    case ncclUint64: *size = 8; return MPI_UINT64_T;
    case ncclFloat32: *size = 4; return MPI_FLOAT;
    case ncclFloat64: *size = 8; return MPI_DOUBLE;
    default: *size = 0; return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: case ncclAvg: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

template <typename T>
static void div_by(void *p, size_t n, int d) {
  T *x = (T *)p;
  for (size_t i = 0; i < n; i++) x[i] = (T)(x[i] / (T)d);
}

static void avg(void *p, size_t n, ncclDataType_t t, int d) {
  switch (t) {
    case ncclFloat32: div_by<float>(p, n, d); break;
    case ncclFloat64: div_by<double>(p, n, d); break;
    case ncclInt32: div_by<int32_t>(p, n, d); break;
    case ncclUint32: div_by<uint32_t>(p, n, d); break;
    case ncclInt64: div_by<int64_t>(p, n, d); break;
    case ncclUint64: div_by<uint64_t>(p, n, d); break;
    case ncclInt8: div_by<int8_t>(p, n, d); break;
    case ncclUint8: div_by<uint8_t>(p, n, d); break;
    default: break;
  }
}

/* One queued NCCL call or group on its way: host copies of its buffers (MPI never touches device
 * memory, which is inaccessible outside stream work: a peer's progress may come in any MPI call)
 * and the MPI requests. */
struct flight_t {
  std::vector<call_t> calls;
  std::vector<MPI_Request> req;
  std::vector<std::vector<char>> send, recv;
  int started = 0;
};

/* Bytes call k reads from its send buffer and writes to its recv buffer on this rank. */
static void sizes(const call_t &k, size_t *sb, size_t *rb) {
  size_t es;
  mpi_type(k.t, &es);
  size_t b = k.count * es, all = b * (size_t)k.c->size, root = k.c->rank == k.root;
  switch (k.kind) {
    case C_ALLREDUCE: *sb = b; *rb = b; return;
    case C_REDUCE: *sb = b; *rb = root ? b : 0; return;
    case C_BCAST: *sb = root ? b : 0; *rb = b; return;
    case C_REDUCE_SCATTER: *sb = all; *rb = b; return;
    case C_ALLGATHER: *sb = b; *rb = all; return;
    case C_SEND: *sb = b; *rb = 0; return;
    case C_RECV: *sb = 0; *rb = b; return;
  }
  *sb = *rb = 0;
}

/* Start call i of f on host copies of its inputs. */
static int start(flight_t &f, size_t i) {
  const call_t &k = f.calls[i];
  size_t es, sb, rb;
  MPI_Datatype mt = mpi_type(k.t, &es);
  sizes(k, &sb, &rb);
  f.send[i].assign((const char *)k.send, (const char *)k.send + sb);
  f.recv[i].resize(rb);
  char *snd = f.send[i].data(), *rcv = f.recv[i].data();
  MPI_Comm mc = k.c->mc;
  MPI_Request *r = &f.req[i];
  int n = (int)k.count;
  switch (k.kind) {
    case C_ALLREDUCE: return MPI_Iallreduce(snd, rcv, n, mt, mpi_op(k.op), mc, r);
    case C_REDUCE: return MPI_Ireduce(snd, rcv, n, mt, mpi_op(k.op), k.root, mc, r);
    case C_BCAST:
      if (sb) memcpy(rcv, snd, sb);
      return MPI_Ibcast(rcv, n, mt, k.root, mc, r);
    case C_REDUCE_SCATTER: return MPI_Ireduce_scatter_block(snd, rcv, n, mt, mpi_op(k.op), mc, r);
    case C_ALLGATHER: return MPI_Iallgather(snd, n, mt, rcv, n, mt, mc, r);
    case C_SEND: return MPI_Isend(snd, n, mt, k.root, P2P_TAG, mc, r);
    case C_RECV: return MPI_Irecv(rcv, n, mt, k.root, P2P_TAG, mc, r);
  }
  return MPI_ERR_OTHER;
}

/* The stream work of one call or one group, run while device memory is accessible: start
 * everything, then test; when all is done, copy the results into the recv buffers and finish
 * ncclAvg. true when finished (or failed: the communicator's async error says so), false while
 * a peer has not taken part yet. */
static bool step_calls(flight_t &f) {
  dt_emu_nccl *c0 = f.calls[0].c;
  if (c0->aborted) return true;
  if (!f.started) {
    f.started = 1;
    f.req.assign(f.calls.size(), MPI_REQUEST_NULL);
    f.send.resize(f.calls.size());
    f.recv.resize(f.calls.size());
    for (size_t i = 0; i < f.calls.size(); i++) {
      int rc = start(f, i);
      if (rc != MPI_SUCCESS) {
        f.calls[i].c->async = EMU_BAD(ncclSystemError, "%s: MPI failed to start it (error %d)", CALL_NAME[f.calls[i].kind], rc);
        return true;
      }
    }
  }
  int flag = 0;
  if (MPI_Testall((int)f.req.size(), f.req.data(), &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
    c0->async = EMU_BAD(ncclSystemError, "%s: MPI_Testall failed", CALL_NAME[f.calls[0].kind]);
    return true;
  }
  if (!flag) return false;
  for (size_t i = 0; i < f.calls.size(); i++) {
    const call_t &k = f.calls[i];
    if (!f.recv[i].empty()) memcpy(k.recv, f.recv[i].data(), f.recv[i].size());
    if (k.op != ncclAvg || (k.kind != C_ALLREDUCE && k.kind != C_REDUCE_SCATTER && k.kind != C_REDUCE)) continue;
    if (k.kind == C_REDUCE && k.c->rank != k.root) continue;
    avg(k.recv, k.count, k.t, k.c->size);
  }
  return true;
}

static op_t nccl_op(const char *what, std::vector<call_t> calls) {
  op_t op;
  op.what = what;
  auto f = std::make_shared<flight_t>();
  f->calls = std::move(calls);
  op.step = [f]() { return step_calls(*f); };
  return op;
}

/* Bytes a call writes on this rank (recv buffer), for the host-read hazard check. */
static range_t written(const call_t &k) {
  size_t es;
  mpi_type(k.t, &es);
  size_t n = k.count * es * (k.kind == C_ALLGATHER ? (size_t)k.c->size : 1);
  int writes = k.kind != C_SEND && (k.kind != C_REDUCE || k.c->rank == k.root);
  return range_t{(uintptr_t)k.recv, writes ? (uintptr_t)k.recv + n : (uintptr_t)k.recv};
}

static ncclResult_t check_buf(const call_t &k, const char *which, const void *p, size_t bytes) {
  char why[256];
  if (bytes && heap_check_range(p, bytes, k.c->device, why, sizeof why))
    return EMU_BAD(ncclInvalidArgument, "%s: %s buffer: %s", CALL_NAME[k.kind], which, why);
  return ncclSuccess;
}

static ncclResult_t issue(call_t k, cudaStream_t stream) {
  if (!k.c) return EMU_BAD(ncclInvalidArgument, "%s: NULL communicator", CALL_NAME[k.kind]);
  size_t es;
  if (mpi_type(k.t, &es) == MPI_DATATYPE_NULL)
    return EMU_BAD(ncclInvalidArgument, "%s: data type %d is not emulated (16-bit types)", CALL_NAME[k.kind], (int)k.t);
  if (mpi_op(k.op) == MPI_OP_NULL) return EMU_BAD(ncclInvalidArgument, "%s: reduction %d", CALL_NAME[k.kind], (int)k.op);
  if (k.count > (size_t)2147483647) return EMU_BAD(ncclInvalidArgument, "%s: count %zu > INT_MAX", CALL_NAME[k.kind], k.count);
  int p2p = k.kind == C_SEND || k.kind == C_RECV;
  if (k.root < 0 || k.root >= k.c->size || (p2p && k.root == k.c->rank))
    return EMU_BAD(ncclInvalidArgument, "%s: %s %d of %d ranks", CALL_NAME[k.kind], p2p ? "peer" : "root", k.root, k.c->size);
  size_t b = k.count * es, all = b * (size_t)k.c->size, me = k.c->rank == k.root;
  ncclResult_t r = ncclSuccess;
  switch (k.kind) {
    case C_ALLREDUCE: r = check_buf(k, "send", k.send, b) ?: check_buf(k, "recv", k.recv, b); break;
    case C_REDUCE: r = check_buf(k, "send", k.send, b) ?: check_buf(k, "recv", k.recv, me ? b : 0); break;
    case C_BCAST: r = check_buf(k, "send", k.send, me ? b : 0) ?: check_buf(k, "recv", k.recv, b); break;
    case C_REDUCE_SCATTER: r = check_buf(k, "send", k.send, all) ?: check_buf(k, "recv", k.recv, b); break;
    case C_ALLGATHER: r = check_buf(k, "send", k.send, b) ?: check_buf(k, "recv", k.recv, all); break;
    case C_SEND: r = check_buf(k, "send", k.send, b); break;
    case C_RECV: r = check_buf(k, "recv", k.recv, b); break;
  }
  if (r != ncclSuccess) return r;
  cudaError_t e;
  if (!(k.s = get_stream(stream, &e))) return EMU_BAD(ncclInvalidArgument, "%s: not a live stream", CALL_NAME[k.kind]);
  if (k.s->device != k.c->device)
    return EMU_BAD(ncclInvalidArgument, "%s: a stream of device %d for a communicator of device %d", CALL_NAME[k.kind],
               k.s->device, k.c->device);
  if (t_group_depth > 0) {
    t_group.push_back(k);
    return ncclSuccess;
  }
  op_t op = nccl_op(CALL_NAME[k.kind], std::vector<call_t>{k});
  op.writes.push_back(written(k));
  enqueue(k.s, std::move(op));
  return ncclSuccess;
}

static ncclResult_t group_end(void) {
  std::vector<call_t> calls;
  calls.swap(t_group);
  if (calls.empty()) return ncclSuccess;
  stream_t *s0 = calls[0].s;
  std::vector<stream_t *> others;
  for (const call_t &k : calls)
    if (k.s != s0 && std::find(others.begin(), others.end(), k.s) == others.end()) others.push_back(k.s);
  for (stream_t *o : others) enqueue(s0, wait_op(o, o->enq));
  op_t op = nccl_op("ncclGroupEnd", calls);
  for (const call_t &k : calls) op.writes.push_back(written(k));
  enqueue(s0, std::move(op));
  for (stream_t *o : others) enqueue(o, wait_op(s0, s0->enq));
  return ncclSuccess;
}

/* Members' world ranks in NCCL rank order, gathered at the id's creator. */
static ncclResult_t members(const emu_id_t &id, int nranks, int rank, int tag, std::vector<int> &world) {
  int wr;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  world.assign((size_t)nranks, -1);
  if (wr == id.creator) {
    world[rank] = wr;
    for (int i = 1; i < nranks; i++) {
      int pair[2];
      MPI_Recv(pair, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (pair[0] < 0 || pair[0] >= nranks || world[pair[0]] >= 0)
        return EMU_BAD(ncclInvalidArgument, "ncclCommInitRank: rank %d joined twice or is outside [0, %d)", pair[0], nranks);
      world[pair[0]] = pair[1];
    }
    for (int r = 0; r < nranks; r++)
      if (r != rank) MPI_Send(world.data(), nranks, MPI_INT, world[r], tag, MPI_COMM_WORLD);
  } else {
    int pair[2] = {rank, wr};
    MPI_Send(pair, 2, MPI_INT, id.creator, tag, MPI_COMM_WORLD);
    MPI_Recv(world.data(), nranks, MPI_INT, id.creator, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  return ncclSuccess;
}

}  // namespace dt_emu

using namespace dt_emu;

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

ncclResult_t ncclGetVersion(int *version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *out) {
  static int counter;
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return EMU_BAD(ncclSystemError, "ncclGetUniqueId: the NCCL emulation needs MPI to be initialised");
  emu_id_t id = {};
  memcpy(id.magic, ID_MAGIC, sizeof id.magic);
  MPI_Comm_rank(MPI_COMM_WORLD, &id.creator);
  id.counter = ++counter;
  id.pid = (long)getpid();
  memset(out, 0, sizeof *out);
  memcpy(out->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId uid, int rank, ncclConfig_t *config) {
  (void)config;
  *comm = NULL;
  emu_id_t id;
  memcpy(&id, uid.internal, sizeof id);
  if (memcmp(id.magic, ID_MAGIC, sizeof id.magic) != 0)
    return EMU_BAD(ncclInvalidArgument, "ncclCommInitRank: not an id from ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return EMU_BAD(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess || entry() != cudaSuccess) {
    cudaGetLastError();
    return EMU_BAD(ncclUnhandledCudaError, "ncclCommInitRank: no usable CUDA device");
  }
  int tag = 20000 + (id.counter * 131 + id.creator) % 10000;
  std::vector<int> world;
  ncclResult_t r = members(id, nranks, rank, tag, world);
  if (r != ncclSuccess) return r;
  MPI_Group wg, g;
  MPI_Comm mc;
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_incl(wg, nranks, world.data(), &g);
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &mc);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  if (rc != MPI_SUCCESS) return EMU_BAD(ncclSystemError, "ncclCommInitRank: MPI_Comm_create_group failed");
  MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
  *comm = new dt_emu_nccl{mc, rank, nranks, dev, ncclSuccess, 0};
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)config;
  *newcomm = NULL;
  if (!comm) return EMU_BAD(ncclInvalidArgument, "ncclCommSplit: NULL communicator");
  MPI_Comm nm;
  if (MPI_Comm_split(comm->mc, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &nm) != MPI_SUCCESS)
    return EMU_BAD(ncclSystemError, "ncclCommSplit: MPI_Comm_split failed");
  if (nm == MPI_COMM_NULL) return ncclSuccess;
  MPI_Comm_set_errhandler(nm, MPI_ERRORS_RETURN);
  dt_emu_nccl *c = new dt_emu_nccl{nm, 0, 1, comm->device, ncclSuccess, 0};
  MPI_Comm_rank(nm, &c->rank);
  MPI_Comm_size(nm, &c->size);
  *newcomm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&comm->mc);
  delete comm;
  return ncclSuccess;
}

/* Drops the communicator without MPI (peers may be gone): its MPI communicator is leaked, and
 * the handle stays (reachable, for LeakSanitizer) because calls still queued name it. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  static std::vector<dt_emu_nccl *> &aborted = *new std::vector<dt_emu_nccl *>;
  if (!comm) return ncclInvalidArgument;
  comm->aborted = 1;
  aborted.push_back(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm) return ncclInvalidArgument;
  *asyncError = comm->async;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm) return ncclInvalidArgument;
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return issue(call_t{C_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, NULL}, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return issue(call_t{C_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, NULL}, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(call_t{C_BCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, NULL}, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return issue(call_t{C_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, NULL}, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(call_t{C_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, NULL}, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(call_t{C_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, NULL}, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(call_t{C_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, NULL}, stream);
}

ncclResult_t ncclGroupStart(void) {
  t_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (t_group_depth < 1) return EMU_BAD(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  return group_end();
}

}  // extern "C"
