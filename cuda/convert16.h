/* fp32 <-> 16-bit (bf16, or IEEE fp16 with fp16 = 1) copies on a stream, n elements, 2 bytes each
 * on the 16-bit side: to16 rounds to nearest even (exact for values the model already stored
 * rounded to that precision), from16 is exact. cuda/convert16.cu. */
#ifndef DT_CU_CONVERT16_H
#define DT_CU_CONVERT16_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "status.h"

dt_status_t dt_cu_to16(void *dst, const float *src, size_t n, int fp16, cudaStream_t s);
dt_status_t dt_cu_from16(float *dst, const void *src, size_t n, int fp16, cudaStream_t s);

#endif
