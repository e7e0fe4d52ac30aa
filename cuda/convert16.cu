/* fp32 <-> 16-bit copies (convert16.h): the bridge from dtrain's fp32 storage to libraries that
 * take 16-bit tensors (cuDNN's fused attention, attention_cudnn.cpp). Grid-stride loops over the
 * per-element math of kmath.h (dt_round_bf16/fp16, then the bits), so the CPU tests and the
 * emulation check exactly what the GPU runs (tests/test_kmath.c, tests/gpu_parity_ops.cu). */
#include <stdint.h>

#include "convert16.h"
#include "cuda_check.h"
#include "cuda_launch.h"
#include "kmath.h"

__global__ static void to16_k(uint16_t *dst, const float *src, size_t n, int fp16) {
  DT_CUDA_FOR_N(i, n) dst[i] = dt_to16(src[i], fp16);
}

__global__ static void from16_k(float *dst, const uint16_t *src, size_t n, int fp16) {
  DT_CUDA_FOR_N(i, n) dst[i] = dt_from16(src[i], fp16);
}

dt_status_t dt_cu_to16(void *dst, const float *src, size_t n, int fp16, cudaStream_t s) {
  if (n == 0) return DT_OK;
  DT_LAUNCH(to16_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, (uint16_t *)dst, src, n, fp16);
  return DT_OK;
}

dt_status_t dt_cu_from16(float *dst, const void *src, size_t n, int fp16, cudaStream_t s) {
  if (n == 0) return DT_OK;
  DT_LAUNCH(from16_k, dt_cuda_grid(n, DT_CUDA_BLOCK), DT_CUDA_BLOCK, 0, s, dst, (const uint16_t *)src, n, fp16);
  return DT_OK;
}
