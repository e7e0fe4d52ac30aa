/* DT_CUDA_CHECK / DT_CUBLAS_CHECK / DT_NCCL_CHECK: the one way dtrain calls CUDA, cuBLAS and
 * NCCL. A failing call records "file:line: rank R (host H, device D): call failed: <the
 * library's message>" as the dt_err message and returns DT_ERR_CUDA / DT_ERR_NCCL from the
 * enclosing function. Internal header of the .cu files (C++). */
#ifndef DT_CUDA_CHECK_H
#define DT_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "mpi_check.h"
#include "status.h"

/* Record a failure; `call` is the source text, msg the library's message. */
static inline dt_status_t dt__cuda_fail(dt_status_t st, const char *msg, const char *call, const char *file,
                                        int line) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  cudaGetLastError(); /* reset the non-sticky error state so the next check is about the next call */
  int fn = 0;
  while (call[fn] && call[fn] != '(') fn++;
  return dt_err_set(st, file, line, "%s:%d: rank %d (host %s, device %d): %.*s failed: %s", file, line,
                    dt_err_rank(), dt__hostname(), dev, fn, call, msg);
}

static inline const char *dt__cublas_str(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (no usable GPU or driver)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "unknown cuBLAS status";
  }
}

#define DT_CUDA_CHECK(call)                                                                       \
  do {                                                                                            \
    cudaError_t dt_cu_rc_ = (call);                                                               \
    if (dt_cu_rc_ != cudaSuccess)                                                                 \
      return dt__cuda_fail(DT_ERR_CUDA, cudaGetErrorString(dt_cu_rc_), #call, __FILE__, __LINE__); \
  } while (0)

/* After a kernel launch: launch-configuration errors surface here. */
#define DT_KERNEL_CHECK() DT_CUDA_CHECK(cudaGetLastError())

/* Every kernel launch in dtrain: kernel<<<grid, block, shmem, stream>>>(args...), then
 * DT_KERNEL_CHECK(). Launches are spelled only here, so the emulation build (cuda/emu/, which
 * compiles the same .cu files with the host C++ compiler) can run them on the CPU. */
#ifdef DT_CUDA_EMU
#define DT_LAUNCH(kernel, grid, block, shmem, stream, ...)           \
  do {                                                               \
    dt_emu_launch(kernel, grid, block, shmem, stream, __VA_ARGS__); \
    DT_KERNEL_CHECK();                                               \
  } while (0)
#else
#define DT_LAUNCH(kernel, grid, block, shmem, stream, ...)   \
  do {                                                       \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__); \
    DT_KERNEL_CHECK();                                       \
  } while (0)
#endif

#define DT_CUBLAS_CHECK(call)                                                                        \
  do {                                                                                               \
    cublasStatus_t dt_cb_rc_ = (call);                                                               \
    if (dt_cb_rc_ != CUBLAS_STATUS_SUCCESS)                                                          \
      return dt__cuda_fail(DT_ERR_CUDA, dt__cublas_str(dt_cb_rc_), #call, __FILE__, __LINE__);       \
  } while (0)

#define DT_NCCL_CHECK(call)                                                                       \
  do {                                                                                            \
    ncclResult_t dt_nc_rc_ = (call);                                                              \
    if (dt_nc_rc_ != ncclSuccess && dt_nc_rc_ != ncclInProgress)                                  \
      return dt__cuda_fail(DT_ERR_NCCL, ncclGetErrorString(dt_nc_rc_), #call, __FILE__, __LINE__); \
  } while (0)

#endif
