/* What the C side of dtrain sees of CUDA: the device count used to pick a backend, and the NCCL
 * communicator (dt_comm_ops_t on device buffers, cuda/comm_nccl.cu). In a build without CUDA
 * (src/backend/cuda_none.c) the count is 0 and the NCCL calls return DT_ERR_UNSUPPORTED. */
#ifndef DT_CUDA_H
#define DT_CUDA_H

#include <stddef.h>
#include <stdio.h>

#include "comm.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Usable CUDA devices on this process; 0 when CUDA is not built in, there is no driver or no
 * device (any cudaGetDeviceCount error counts as no GPU). */
int dt_cuda_device_count(void);
/* Why the count is 0 (the CUDA runtime's message, or "built without CUDA"); "" when it is not. */
const char *dt_cuda_device_error(void);

/* The PCI bus id of CUDA device `ordinal` ("0000:41:00.0") into buf: one name for one physical
 * GPU, whatever CUDA_VISIBLE_DEVICES calls it. DT_ERR_CUDA when the runtime cannot say (no
 * device, no driver, built without CUDA). */
dt_status_t dt_cuda_device_bus_id(int ordinal, char *buf, size_t n);
/* Device memory in use on `ordinal` (cudaMemGetInfo: total - free, every process's), bytes. */
dt_status_t dt_cuda_mem_used(int ordinal, double *used);
/* One line about a CUDA backend's sparse ZeRO arenas (cuda/sparse.h; be->sparse): for the
 * parameters and the gradients, the device memory behind them now and at most, of the arena's
 * size. Nothing when be has none (or without CUDA). */
struct dt_backend;
void dt_cuda_print_sparse(const struct dt_backend *be, FILE *out);
/* `dtrain --version` lines about CUDA: runtime and driver, cuBLAS and NCCL versions as loaded
 * (and as built against), and each visible device (name, compute capability, memory); or one line
 * saying CUDA is not built in. */
void dt_cuda_print_versions(FILE *out);

/* NCCL's unique id (128 bytes): rank 0 of the MPI communicator `*(const MPI_Comm *)mpi_comm`
 * creates it with ncclGetUniqueId and broadcasts it; every rank gets the same bytes in id. */
#define DT_NCCL_ID_BYTES 128
dt_status_t dt_comm_nccl_unique_id(const void *mpi_comm, unsigned char id[DT_NCCL_ID_BYTES]);

/* NCCL communicator over the ranks of `*(const MPI_Comm *)mpi_comm` (collective over it): the
 * unique id above, cudaSetDevice(device), ncclCommInitRank. Buffers are device pointers, stream
 * a cudaStream_t (NULL = the communicator's own stream). timeout_s > 0: a call that waits on
 * NCCL (wait, test, group_end, a blocking collective) polls ncclCommGetAsyncError and aborts the
 * communicator (ncclCommAbort) after that many seconds without completion, returning
 * DT_ERR_NCCL naming rank, host, device and the collective in flight. timeout_s <= 0: the
 * environment's DTRAIN_NCCL_TIMEOUT (seconds), else 600. With the hang watchdog on
 * (watchdog.h, system.comm_timeout) its deadline applies instead and ends the job (DT_EXIT_HANG)
 * with one line naming the collective. If initialisation fails on any rank,
 * every rank returns an error (agreed over MPI: nobody is left in ncclCommInitRank's peers). */
dt_status_t dt_comm_nccl_create(const void *mpi_comm, int device, double timeout_s, dt_comm_t **out);
extern const dt_comm_ops_t dt_comm_nccl_ops;

/* Device buffers over MPI (system.device_comm = mpi), collective over `*(const MPI_Comm *)mpi_comm`:
 * an MPI communicator over a duplicate of it (comm_mpi.c, with its checks and the hang
 * watchdog), every call staged through pinned host memory on the caller's stream and complete
 * when it returns (requests come back NULL). For MPIs without CUDA support, or clusters without
 * NCCL's transports; slower than NCCL (two copies per call, no overlap). */
dt_status_t dt_comm_staged_create(const void *mpi_comm, dt_comm_t **out);
extern const dt_comm_ops_t dt_comm_staged_ops;
/* 1 if this MPI says it can take device pointers (Open MPI's MPIX_Query_cuda_support), 0 if
 * not, -1 if it cannot say. Reported at start; the staged communicator never passes them. */
int dt_mpi_cuda_aware(void);

#ifdef __cplusplus
}
#endif
#endif
