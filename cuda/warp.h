/* Warp-level helpers shared by the row kernels (kernels.cu, attention.cu). Internal (C++). */
#ifndef DT_CU_WARP_H
#define DT_CU_WARP_H

#include "cuda_launch.h"

#define FULL_MASK 0xffffffffu

/* the sum of v over the 32 lanes, in every lane */
__device__ static inline float warp_sum(float v) {
  for (int o = DT_CUDA_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

/* Warp-per-row launches: every warp loops over rows warp, warp + warps, ... (a capped grid still
 * covers them all). The loop bound is the same for the 32 lanes of a warp, so shuffles are safe. */
#define FOR_WARP_ROWS(row, rows)                                                              \
  DT_CUDA_FOR_ROWS(row, rows, ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / DT_CUDA_WARP, \
                   (size_t)gridDim.x * blockDim.x / DT_CUDA_WARP)

#endif
