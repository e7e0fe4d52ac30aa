/* Helpers of the CUDA emulation's unit tests (tests/test_emu_*.cpp, C++ against cuda/emu/): a
 * checked CUDA call, device buffers filled from / copied to host vectors. */
#ifndef DT_EMU_TEST_H
#define DT_EMU_TEST_H

#include <criterion/criterion.h>
#include <cuda_runtime.h>
#include <string.h>

#include <vector>

#define CU(call)                                                                                   \
  do {                                                                                             \
    cudaError_t rc_ = (call);                                                                      \
    cr_assert_eq(rc_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(rc_));                     \
  } while (0)

template <typename T>
static inline T *dev_from(const std::vector<T> &h) {
  T *d = NULL;
  CU(cudaMalloc((void **)&d, h.size() * sizeof(T)));
  CU(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
static inline std::vector<T> host_from(const T *d, size_t n) {
  std::vector<T> h(n);
  CU(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

/* The error string of the last sticky or launch error contains `want`. */
static inline int err_mentions(cudaError_t e, const char *want) { return strstr(cudaGetErrorString(e), want) != NULL; }

#endif
