/* CUDA emulation: cuBLAS (cublas_v2.h). Arguments are checked as cuBLAS does
 * (CUBLAS_STATUS_INVALID_VALUE for negative sizes or leading dimensions too small); host-mode
 * alpha and beta are read at the call. The product is queued on the handle's stream and runs
 * through dt_cpu_sgemm: column-major C (m x n) = op(A) op(B) is row-major C^T = op(B)^T op(A)^T,
 * so the row-major call takes B before A, n before m and keeps each transposition flag. An operand
 * that does not lie inside one allocation of the handle's device is an illegal address when the
 * product runs (sticky, as the cuBLAS kernel's fault would be), named with the call. With
 * CUBLAS_TF32_TENSOR_OP_MATH the operands are rounded to TF32 first (to nearest: the hardware may
 * round otherwise, so tests compare TF32 against fp32 within a tolerance, never bitwise). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cublas_v2.h"
#include "emu_int.h"

extern "C" {
#include "kmath.h"
#include "ops_cpu.h"
}

struct dt_emu_cublas {
  int device;
  cudaStream_t stream;
  cublasPointerMode_t mode;
  cublasMath_t math;
};

namespace dt_emu {

/* A column-major operand of `rows` x `cols` with leading dimension ld, batch i at i*stride. */
struct operand_t {
  const char *name;
  const float *p;
  long long ld, rows, cols, stride;
};

static int operand_bad(const operand_t &o, int batch, int dev, char *why, size_t n) {
  if (o.rows == 0 || o.cols == 0 || batch == 0) return 0;
  size_t extent = (size_t)(o.ld * (o.cols - 1) + o.rows) * sizeof(float);
  for (int i = 0; i < batch; i += batch - 1 > 0 ? batch - 1 : 1) { /* first and last batch */
    char w[256];
    if (heap_check_range(o.p + (long long)i * o.stride, extent, dev, w, sizeof w)) {
      snprintf(why, n, "%s of batch %d: %s", o.name, i, w);
      return 1;
    }
  }
  return 0;
}

/* How the tensor cores see fp32 operands: unchanged, or rounded to nearest (ties to even; NaN and
 * infinity kept) to TF32 (1 + 8 + 10 bits), bf16 or fp16 (kmath.h's roundings, the CPU backend's). */
enum { ROUND_NONE, ROUND_TF32, ROUND_BF16, ROUND_FP16 };

static float round_to(float x, int mode) {
  if (mode == ROUND_BF16) return dt_round_bf16(x);
  if (mode == ROUND_FP16) return dt_round_fp16(x);
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  memcpy(&x, &u, 4);
  return x;
}

/* A copy of an operand's span (every batch) with each value rounded as `mode` says. */
static const float *rounded_copy(std::vector<float> &dst, const operand_t &o, int batch, int mode) {
  if (o.rows == 0 || o.cols == 0 || mode == ROUND_NONE) return (const float *)o.p;
  size_t span = (size_t)((long long)(batch - 1) * o.stride + (long long)o.ld * (o.cols - 1) + o.rows);
  dst.resize(span);
  const float *src = (const float *)o.p;
  for (size_t i = 0; i < span; i++) dst[i] = round_to(src[i], mode);
  return dst.data();
}

/* Does the rounded copy r of operand o differ from it anywhere (NaN equals NaN)? */
static int changed(const float *r, const operand_t &o, int batch) {
  if (r == o.p || o.rows == 0 || o.cols == 0) return 0;
  for (int i = 0; i < batch; i++)
    for (long long c = 0; c < o.cols; c++)
      for (long long e = 0; e < o.rows; e++) {
        const long long at = i * o.stride + c * o.ld + e;
        if (r[at] != o.p[at] && !(r[at] != r[at] && o.p[at] != o.p[at])) return 1;
      }
  return 0;
}

static cublasStatus_t gemm(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, long long sA, const float *B, int ldb,
                           long long sB, const float *beta, float *C, int ldc, long long sC, int batch, int mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode < 0) mode = h->math == CUBLAS_TF32_TENSOR_OP_MATH ? ROUND_TF32 : ROUND_NONE;
  if (ta > CUBLAS_OP_C || tb > CUBLAS_OP_C || ta < CUBLAS_OP_N || tb < CUBLAS_OP_N) return CUBLAS_STATUS_INVALID_VALUE;
  int tA = ta != CUBLAS_OP_N, tB = tb != CUBLAS_OP_N;
  long long ra = tA ? k : m, ca = tA ? m : k, rb = tB ? n : k, cb = tB ? k : n;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) ||
      ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  if (entry() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  cudaError_t e;
  int cur = current_device();
  stream_t *s = h->stream ? get_stream(h->stream, &e) : NULL;
  if (!h->stream) { /* the legacy stream of the handle's device */
    cudaSetDevice(h->device);
    s = get_stream(NULL, &e);
    cudaSetDevice(cur);
  }
  if (!s) return CUBLAS_STATUS_EXECUTION_FAILED;
  int host = h->mode == CUBLAS_POINTER_MODE_HOST;
  float a = host ? *alpha : 0.0f, b = host ? *beta : 0.0f;
  operand_t oa = {"A", A, lda, k ? ra : 0, ca, sA}, ob = {"B", B, ldb, k ? rb : 0, cb, sB}, oc = {"C", C, ldc, m, n, sC};
  op_t op;
  op.what = call;
  op.writes.push_back(range_t{(uintptr_t)C, (uintptr_t)(C + (long long)(batch - 1) * sC + (long long)ldc * (n - 1) + m)});
  int dev = h->device, exact16 = getenv("DTRAIN_EMU_EXACT16") != NULL;
  op.run = [=]() {
    char why[320];
    if (operand_bad(oa, batch, dev, why, sizeof why) || operand_bad(ob, batch, dev, why, sizeof why) ||
        operand_bad(oc, batch, dev, why, sizeof why)) {
      fail_sticky(dev, cudaErrorIllegalAddress, "%s(m=%d, n=%d, k=%d, batch %d): %s", call, m, n, k, batch, why);
      return;
    }
    float al = host ? a : *alpha, be = host ? b : *beta;
    std::vector<float> ra, rb; /* the operands as the tensor cores see them */
    const float *pa = rounded_copy(ra, oa, batch, mode), *pb = rounded_copy(rb, ob, batch, mode);
    if (exact16 && (mode == ROUND_BF16 || mode == ROUND_FP16)) {
      const char *bad = changed(pa, oa, batch) ? "A" : changed(pb, ob, batch) ? "B" : NULL;
      if (bad) {
        fail_sticky(dev, cudaErrorLaunchFailure, "%s(m=%d, n=%d, k=%d): operand %s holds values that are not %s "
                    "(DTRAIN_EMU_EXACT16: the 16-bit tensor-core products would round them)", call, m, n, k, bad,
                    mode == ROUND_BF16 ? "bf16" : "fp16");
        return;
      }
    }
    for (int i = 0; i < batch; i++)
      dt_cpu_sgemm(tB, tA, n, m, k, al, pb + (long long)i * sB, ldb, pa + (long long)i * sA, lda, be,
                   C + (long long)i * sC, ldc);
  };
  enqueue(s, std::move(op));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace dt_emu

using namespace dt_emu;

extern "C" {

cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value) {
  *value = type == MAJOR_VERSION ? CUBLAS_VER_MAJOR : type == MINOR_VERSION ? CUBLAS_VER_MINOR : CUBLAS_VER_PATCH;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  *handle = new dt_emu_cublas{current_device(), NULL, CUBLAS_POINTER_MODE_HOST, CUBLAS_DEFAULT_MATH};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  cudaError_t e;
  if (stream && !get_stream(stream, &e)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_TF32_TENSOR_OP_MATH) return CUBLAS_STATUS_INVALID_VALUE;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc) {
  return gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, -1);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  if (Atype != CUDA_R_32F || Btype != CUDA_R_32F || Ctype != CUDA_R_32F || algo != CUBLAS_GEMM_DEFAULT)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  int mode = computeType == CUBLAS_COMPUTE_32F_FAST_16BF  ? ROUND_BF16
             : computeType == CUBLAS_COMPUTE_32F_FAST_16F ? ROUND_FP16
             : computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ? ROUND_TF32
             : computeType == CUBLAS_COMPUTE_32F           ? -1
                                                           : -2;
  if (mode == -2) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm("cublasGemmEx", handle, transa, transb, m, n, k, (const float *)alpha, (const float *)A, lda, 0,
              (const float *)B, ldb, 0, (const float *)beta, (float *)C, ldc, 0, 1, mode);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb, long long strideB,
                                         const float *beta, float *C, int ldc, long long strideC, int batchCount) {
  return gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB,
              beta, C, ldc, strideC, batchCount, -1);
}

}  // extern "C"
