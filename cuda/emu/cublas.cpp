/* CUDA emulation: cuBLAS (cublas_v2.h). Arguments are checked as cuBLAS does
 * (CUBLAS_STATUS_INVALID_VALUE for negative sizes or leading dimensions too small); host-mode
 * alpha and beta are read at the call. The product is queued on the handle's stream and runs
 * through dt_cpu_sgemm: column-major C (m x n) = op(A) op(B) is row-major C^T = op(B)^T op(A)^T,
 * so the row-major call takes B before A, n before m and keeps each transposition flag. An operand
 * that does not lie inside one allocation of the handle's device is an illegal address when the
 * product runs (sticky, as the cuBLAS kernel's fault would be), named with the call. With
 * CUBLAS_TF32_TENSOR_OP_MATH the operands are rounded to TF32 first (to nearest: the hardware may
 * round otherwise, so tests compare TF32 against fp32 within a tolerance, never bitwise).
 * cublasGemmEx also takes bf16 or fp16 A and B (CUDA_R_16BF, CUDA_R_16F, both the same) with
 * CUBLAS_COMPUTE_32F and C in fp32 or in A's type: the operands widen to float exactly, the
 * product runs in fp32, a 16-bit C is read widened (beta != 0) and written rounded to nearest
 * even, as the tensor cores' fp32 accumulation would end. */
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

/* Element types of an operand: fp32, or the 16 bits of a bf16 / fp16 value. */
enum { EL_F32, EL_BF16, EL_FP16 };

static size_t el_size(int el) { return el == EL_F32 ? 4 : 2; }

/* A column-major operand of `rows` x `cols` with leading dimension ld, batch i at i*stride
 * (elements of type el). */
struct operand_t {
  const char *name;
  const void *p;
  long long ld, rows, cols, stride;
  int el;
};

static const char *el_at(const operand_t &o, long long i) { return (const char *)o.p + i * (long long)el_size(o.el); }

static int operand_bad(const operand_t &o, int batch, int dev, char *why, size_t n) {
  if (o.rows == 0 || o.cols == 0 || batch == 0) return 0;
  size_t extent = (size_t)(o.ld * (o.cols - 1) + o.rows) * el_size(o.el);
  for (int i = 0; i < batch; i += batch - 1 > 0 ? batch - 1 : 1) { /* first and last batch */
    char w[256];
    if (heap_check_range(el_at(o, (long long)i * o.stride), extent, dev, w, sizeof w)) {
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

static size_t span_of(const operand_t &o, int batch) {
  return (size_t)((long long)(batch - 1) * o.stride + (long long)o.ld * (o.cols - 1) + o.rows);
}

/* The float value of element i of a 16-bit operand (exact) */
static float widen(const operand_t &o, size_t i) {
  uint16_t b;
  memcpy(&b, el_at(o, (long long)i), 2);
  return dt_from16(b, o.el == EL_FP16);
}

/* An operand as floats: fp32 ones as they are, or a copy of the span (every batch) with each value
 * rounded as `mode` says; 16-bit ones widened (exact; their mode is ROUND_NONE). */
static const float *rounded_copy(std::vector<float> &dst, const operand_t &o, int batch, int mode) {
  if (o.rows == 0 || o.cols == 0 || (mode == ROUND_NONE && o.el == EL_F32)) return (const float *)o.p;
  size_t span = span_of(o, batch);
  dst.resize(span);
  for (size_t i = 0; i < span; i++) dst[i] = o.el == EL_F32 ? round_to(((const float *)o.p)[i], mode) : widen(o, i);
  return dst.data();
}

/* Does the rounded copy r of an fp32 operand o differ from it anywhere (NaN equals NaN)? */
static int changed(const float *r, const operand_t &o, int batch) {
  const float *p = (const float *)o.p;
  if (r == p || o.el != EL_F32 || o.rows == 0 || o.cols == 0) return 0;
  for (int i = 0; i < batch; i++)
    for (long long c = 0; c < o.cols; c++)
      for (long long e = 0; e < o.rows; e++) {
        const long long at = i * o.stride + c * o.ld + e;
        if (r[at] != p[at] && !(r[at] != r[at] && p[at] != p[at])) return 1;
      }
  return 0;
}

/* A 16-bit C: its m x n elements of every batch written back from the float product f, rounded */
static void narrow_c(const operand_t &o, const float *f, int batch) {
  for (int i = 0; i < batch; i++)
    for (long long c = 0; c < o.cols; c++)
      for (long long e = 0; e < o.rows; e++) {
        const long long at = i * o.stride + c * o.ld + e;
        uint16_t b = dt_to16(f[at], o.el == EL_FP16);
        memcpy((char *)o.p + at * 2, &b, 2);
      }
}

/* the product of every cublas*gemm* here: A and B of element type eab, C of ec (EL_*) */
static cublasStatus_t gemm(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const float *alpha, const void *A, int lda, long long sA, const void *B, int ldb,
                           long long sB, const float *beta, void *C, int ldc, long long sC, int batch, int mode,
                           int eab, int ec) {
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
  operand_t oa = {"A", A, lda, k ? ra : 0, ca, sA, eab}, ob = {"B", B, ldb, k ? rb : 0, cb, sB, eab};
  operand_t oc = {"C", C, ldc, m, n, sC, ec};
  op_t op;
  op.what = call;
  op.writes.push_back(range_t{(uintptr_t)C, (uintptr_t)el_at(oc, (long long)span_of(oc, batch))});
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
    std::vector<float> wc; /* a 16-bit C as floats: read only where beta is not 0 (cuBLAS's rule) */
    float *pc = (float *)C;
    if (ec != EL_F32) {
      wc.assign(span_of(oc, batch), 0.0f);
      if (be != 0.0f)
        for (size_t i = 0; i < wc.size(); i++) wc[i] = widen(oc, i);
      pc = wc.data();
    }
    for (int i = 0; i < batch; i++)
      dt_cpu_sgemm(tB, tA, n, m, k, al, pb + (long long)i * sB, ldb, pa + (long long)i * sA, lda, be,
                   pc + (long long)i * sC, ldc);
    if (ec != EL_F32) narrow_c(oc, pc, batch);
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
  return gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, -1,
              EL_F32, EL_F32);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  if (algo != CUBLAS_GEMM_DEFAULT || Atype != Btype) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (Atype == CUDA_R_16BF || Atype == CUDA_R_16F) { /* 16-bit operands: fp32 compute, C fp32 or A's type */
    int el = Atype == CUDA_R_16BF ? EL_BF16 : EL_FP16;
    if (computeType != CUBLAS_COMPUTE_32F || (Ctype != CUDA_R_32F && Ctype != Atype))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, (const float *)alpha, A, lda, 0, B, ldb, 0,
                (const float *)beta, C, ldc, 0, 1, ROUND_NONE, el, Ctype == CUDA_R_32F ? EL_F32 : el);
  }
  if (Atype != CUDA_R_32F || Ctype != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  int mode = computeType == CUBLAS_COMPUTE_32F_FAST_16BF  ? ROUND_BF16
             : computeType == CUBLAS_COMPUTE_32F_FAST_16F ? ROUND_FP16
             : computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ? ROUND_TF32
             : computeType == CUBLAS_COMPUTE_32F           ? -1
                                                           : -2;
  if (mode == -2) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm("cublasGemmEx", handle, transa, transb, m, n, k, (const float *)alpha, A, lda, 0, B, ldb, 0,
              (const float *)beta, C, ldc, 0, 1, mode, EL_F32, EL_F32);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb, long long strideB,
                                         const float *beta, float *C, int ldc, long long strideC, int batchCount) {
  return gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB,
              beta, C, ldc, strideC, batchCount, -1, EL_F32, EL_F32);
}

}  // extern "C"
