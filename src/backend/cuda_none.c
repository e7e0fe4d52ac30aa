/* The CUDA entry points of cuda/dt_cuda.h in a build without CUDA (--without-cuda or no nvcc):
 * no devices, and the NCCL communicator reports that it is not built in. */
#include "dt_cuda.h"

int dt_cuda_device_count(void) { return 0; }

const char *dt_cuda_device_error(void) { return "this dtrain is built without CUDA"; }

dt_status_t dt_cuda_device_bus_id(int ordinal, char *buf, size_t n) {
  if (n) buf[0] = '\0';
  return DT_ERR(DT_ERR_UNSUPPORTED, "device %d: this dtrain is built without CUDA", ordinal);
}

dt_status_t dt_cuda_mem_used(int ordinal, double *used) {
  *used = 0;
  return DT_ERR(DT_ERR_UNSUPPORTED, "device %d: this dtrain is built without CUDA", ordinal);
}

void dt_cuda_print_versions(FILE *out) { fprintf(out, "cuda: not built in (nccl, cublas: not used)\n"); }

dt_status_t dt_comm_nccl_unique_id(const void *mpi_comm, unsigned char id[DT_NCCL_ID_BYTES]) {
  (void)mpi_comm;
  (void)id;
  return DT_ERR(DT_ERR_UNSUPPORTED, "NCCL: this dtrain is built without CUDA");
}

dt_status_t dt_comm_staged_create(const void *mpi_comm, dt_comm_t **out) {
  (void)mpi_comm;
  *out = NULL;
  return DT_ERR(DT_ERR_UNSUPPORTED, "device communication over MPI: this dtrain is built without CUDA");
}

int dt_mpi_cuda_aware(void) { return -1; }

dt_status_t dt_comm_nccl_create(const void *mpi_comm, int device, double timeout_s, dt_comm_t **out) {
  (void)mpi_comm;
  (void)device;
  (void)timeout_s;
  *out = NULL;
  return DT_ERR(DT_ERR_UNSUPPORTED, "NCCL: this dtrain is built without CUDA");
}

void dt_cuda_print_sparse(const struct dt_backend *be, FILE *out) { (void)be, (void)out; }
