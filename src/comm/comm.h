/* Communicator interface: collectives and point-to-point over a group of ranks.
 * One vtable serves MPI on host buffers (comm_mpi.c) and NCCL on device buffers (cuda/, later).
 * Every call takes an optional stream (NULL for MPI; a cudaStream_t for NCCL) and an optional
 * request: req == NULL means blocking; otherwise the call starts the operation and *req is
 * completed with dt_comm_wait/test. send == recv means in place. group_start/group_end bracket
 * calls that may be fused (NCCL group semantics; no-ops for MPI). */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stddef.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_F32, DT_F64, DT_I32, DT_I64, DT_U8 } dt_dtype_t;
typedef enum { DT_SUM, DT_AVG, DT_MAX, DT_MIN } dt_redop_t;

typedef struct dt_comm dt_comm_t;
typedef struct dt_comm_req dt_comm_req_t;

typedef struct {
  const char *name;
  /* New communicator of the ranks with the same color, ordered by key (MPI_Comm_split). */
  dt_status_t (*split)(dt_comm_t *c, int color, int key, dt_comm_t **out);
  void (*free)(dt_comm_t *c);
  dt_status_t (*allreduce)(dt_comm_t *c, const void *send, void *recv, size_t count, dt_dtype_t t,
                           dt_redop_t op, void *stream, dt_comm_req_t **req);
  /* send holds size*recvcount elements; rank r receives block r, reduced. */
  dt_status_t (*reduce_scatter)(dt_comm_t *c, const void *send, void *recv, size_t recvcount, dt_dtype_t t,
                                dt_redop_t op, void *stream, dt_comm_req_t **req);
  /* recv gets size*sendcount elements, block r from rank r. */
  dt_status_t (*allgather)(dt_comm_t *c, const void *send, void *recv, size_t sendcount, dt_dtype_t t,
                           void *stream, dt_comm_req_t **req);
  dt_status_t (*broadcast)(dt_comm_t *c, void *buf, size_t count, dt_dtype_t t, int root, void *stream,
                           dt_comm_req_t **req);
  dt_status_t (*send)(dt_comm_t *c, const void *buf, size_t count, dt_dtype_t t, int peer, void *stream,
                      dt_comm_req_t **req);
  dt_status_t (*recv)(dt_comm_t *c, void *buf, size_t count, dt_dtype_t t, int peer, void *stream,
                      dt_comm_req_t **req);
  dt_status_t (*barrier)(dt_comm_t *c);
  dt_status_t (*wait)(dt_comm_t *c, dt_comm_req_t *req);             /* completes and frees req */
  dt_status_t (*test)(dt_comm_t *c, dt_comm_req_t *req, int *done);  /* frees req when done */
  dt_status_t (*group_start)(dt_comm_t *c);
  dt_status_t (*group_end)(dt_comm_t *c);
  /* recv on rank `root` gets the reduction of every rank's send (recv is ignored elsewhere;
   * send == recv at the root is in place). */
  dt_status_t (*reduce)(dt_comm_t *c, const void *send, void *recv, size_t count, dt_dtype_t t, dt_redop_t op,
                        int root, void *stream, dt_comm_req_t **req);
} dt_comm_ops_t;

struct dt_comm {
  const dt_comm_ops_t *ops;
  int rank, size;
  void *impl;
};

/* In-place forms (send == recv is always accepted; buffers that overlap otherwise are an error):
 *   allreduce, broadcast, reduce (at the root): send == recv.
 *   reduce_scatter: recv == send (result in the first recvcount elements, MPI_IN_PLACE style) or
 *                   recv == send + rank*recvcount (result in this rank's own block, NCCL style).
 *   allgather:      send == recv + rank*sendcount (this rank's block already in place, MPI and
 *                   NCCL style) or send == recv (this rank's data in block 0; it is moved first).
 * DT_AVG: sum, then divide by the communicator size (F32/F64 only; integer types are rejected).
 * Counts above INT_MAX elements are rejected. */

size_t dt_dtype_size(dt_dtype_t t);
const char *dt_dtype_name(dt_dtype_t t);

/* MPI communicator over a duplicate of `*(const MPI_Comm *)mpi_comm` (a pointer to an MPI_Comm,
 * passed as void* to keep mpi.h out). The duplicate returns errors (MPI_ERRORS_RETURN); every
 * MPI call is checked and a failure records file, line, rank, host and MPI's message.
 * send/recv use one tag (DT_COMM_MPI_TAG) on the private duplicate: messages between a pair of
 * ranks match in the order they were posted (MPI's non-overtaking rule), as with NCCL.
 * Inside group_start/group_end, calls with req == NULL are started and completed at the
 * outermost group_end (so a blocking send/recv ring in a group cannot deadlock). */
dt_status_t dt_comm_mpi_create(const void *mpi_comm, dt_comm_t **out);
/* Copy the communicator's MPI_Comm into *(MPI_Comm *)mpi_comm_out (for MPI-IO / HDF5). */
dt_status_t dt_comm_mpi_handle(const dt_comm_t *c, void *mpi_comm_out);
extern const dt_comm_ops_t dt_comm_mpi_ops;
#define DT_COMM_MPI_TAG 7411

/* Top level only: print nothing, abort every rank of the job (MPI_Abort on MPI_COMM_WORLD when
 * MPI is initialised), never returns. Library code returns errors instead. */
void dt_comm_abort(int code) __attribute__((noreturn));

#ifdef __cplusplus
}
#endif
#endif
