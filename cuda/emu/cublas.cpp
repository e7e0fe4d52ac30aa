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
 * even, as the tensor cores' fp32 accumulation would end. cuBLASLt (cublasLt.h): the same product
 * on 16-bit operands, its bias epilogue added in fp32 before D is rounded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cublasLt.h"
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

/* C += bias, one value (C's element type) per row, over every column of every batch */
static void add_bias(float *c, const operand_t &o, const void *bias, int batch) {
  for (int i = 0; i < batch; i++)
    for (long long col = 0; col < o.cols; col++)
      for (long long e = 0; e < o.rows; e++) {
        float b;
        if (o.el == EL_F32) {
          b = ((const float *)bias)[e];
        } else {
          uint16_t h;
          memcpy(&h, (const char *)bias + 2 * e, 2);
          b = dt_from16(h, o.el == EL_FP16);
        }
        c[i * o.stride + col * o.ld + e] += b;
      }
}

/* the product of every cublas*gemm* here: A and B of element type eab, C of ec (EL_*); with bias
 * (cuBLASLt's epilogue) + bias per row of C in fp32 before a 16-bit C is rounded */
static cublasStatus_t gemm(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const float *alpha, const void *A, int lda, long long sA, const void *B, int ldb,
                           long long sB, const float *beta, void *C, int ldc, long long sC, int batch, int mode,
                           int eab, int ec, const void *bias = NULL) {
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
    operand_t obias = {"bias", bias, m, bias ? m : 0, 1, 0, ec};
    if (operand_bad(oa, batch, dev, why, sizeof why) || operand_bad(ob, batch, dev, why, sizeof why) ||
        operand_bad(oc, batch, dev, why, sizeof why) || operand_bad(obias, 1, dev, why, sizeof why)) {
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
    if (bias) add_bias(pc, oc, bias, batch);
    if (ec != EL_F32) narrow_c(oc, pc, batch);
  };
  enqueue(s, std::move(op));
  return CUBLAS_STATUS_SUCCESS;
}

/* a handle needs a device (cuBLAS: NOT_INITIALIZED without one) */
static int have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return 1;
  cudaGetLastError();
  return 0;
}

}  // namespace dt_emu

using namespace dt_emu;

extern "C" {

cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value) {
  *value = type == MAJOR_VERSION ? CUBLAS_VER_MAJOR : type == MINOR_VERSION ? CUBLAS_VER_MINOR : CUBLAS_VER_PATCH;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
  if (!have_device()) return CUBLAS_STATUS_NOT_INITIALIZED;
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

/* ---- cuBLASLt (cublasLt.h): descriptors kept on the host, the product through gemm() ---------- */

struct dt_emu_lt {
  int device;
};
struct dt_emu_lt_desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t ta, tb;
  cublasLtEpilogue_t epilogue;
  const void *bias;
  int bias_type_set; /* a CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE other than D's is not emulated */
};
struct dt_emu_lt_layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct dt_emu_lt_pref {
  size_t workspace;
  uint32_t align[4]; /* A, B, C, D */
};

static int lt_el(cudaDataType_t t) { return t == CUDA_R_16BF ? EL_BF16 : t == CUDA_R_16F ? EL_FP16 : EL_F32; }

/* What the emulation runs: fp32 compute and scale, A and B 16-bit of one type, C and D the same
 * layout of that type or fp32, no bias type of its own, shapes that agree; else NOT_SUPPORTED */
static cublasStatus_t lt_check(const dt_emu_lt_desc *d, const dt_emu_lt_layout *a, const dt_emu_lt_layout *b,
                               const dt_emu_lt_layout *c, const dt_emu_lt_layout *o, int *m, int *n, int *k) {
  if (!d || !a || !b || !c || !o) return CUBLAS_STATUS_INVALID_VALUE;
  if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F || d->bias_type_set) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a->type != b->type || (a->type != CUDA_R_16BF && a->type != CUDA_R_16F)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((o->type != a->type && o->type != CUDA_R_32F) || c->type != o->type || c->rows != o->rows ||
      c->cols != o->cols || c->ld != o->ld)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t ka = d->ta != CUBLAS_OP_N ? a->rows : a->cols, ma = d->ta != CUBLAS_OP_N ? a->cols : a->rows;
  const uint64_t kb = d->tb != CUBLAS_OP_N ? b->cols : b->rows, nb = d->tb != CUBLAS_OP_N ? b->rows : b->cols;
  if (ka != kb || ma != o->rows || nb != o->cols) return CUBLAS_STATUS_INVALID_VALUE;
  *m = (int)o->rows, *n = (int)o->cols, *k = (int)ka;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  if (!have_device()) return CUBLAS_STATUS_NOT_INITIALIZED;
  *h = new dt_emu_lt{current_device()};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
  *d = new dt_emu_lt_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, 0};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
  case CUBLASLT_MATMUL_DESC_TRANSB: {
    int32_t v; /* cublasOperation_t, 4 bytes */
    if (size != sizeof v) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&v, buf, sizeof v);
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = (cublasOperation_t)v;
    return CUBLAS_STATUS_SUCCESS;
  }
  case CUBLASLT_MATMUL_DESC_EPILOGUE: {
    uint32_t v;
    if (size != sizeof v) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&v, buf, sizeof v);
    if (v != CUBLASLT_EPILOGUE_DEFAULT && v != CUBLASLT_EPILOGUE_BIAS) return CUBLAS_STATUS_NOT_SUPPORTED;
    d->epilogue = (cublasLtEpilogue_t)v;
    return CUBLAS_STATUS_SUCCESS;
  }
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&d->bias, buf, sizeof(void *));
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    d->bias_type_set = 1;
    return CUBLAS_STATUS_SUCCESS;
  default:
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (ld < (int64_t)(rows > 1 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new dt_emu_lt_layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  *p = new dt_emu_lt_pref{0, {256, 256, 256, 256}};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
  if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
    if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
  uint64_t v;
  memcpy(&v, buf, sizeof v);
  p->workspace = (size_t)v;
  return CUBLAS_STATUS_SUCCESS;
}
/* one algorithm, no workspace, for what lt_check takes (it keeps the preference's alignments);
 * none (NOT_SUPPORTED) for the rest */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t o, cublasLtMatmulPreference_t pref, int want,
                                              cublasLtMatmulHeuristicResult_t results[], int *got) {
  int m, n, k;
  *got = 0;
  if (!h || !pref || want < 1) return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t st = lt_check(d, a, b, c, o, &m, &n, &k);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  memset(&results[0], 0, sizeof results[0]);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  for (int i = 0; i < 4; i++) results[0].algo.data[i] = pref->align[i];
  results[0].wavesCount = 1.0f;
  *got = 1;
  return CUBLAS_STATUS_SUCCESS;
}
/* D = alpha op(A) op(B) + beta C [+ bias per row of D], C and D one buffer (beta 0: C not read) */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t o,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream) {
  (void)algo, (void)ws, (void)ws_bytes;
  int m, n, k;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t st = lt_check(d, a, b, c, o, &m, &n, &k);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (C != D) return CUBLAS_STATUS_NOT_SUPPORTED; /* out of place C is not emulated */
  if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
  const void *ptr[4] = {A, B, C, D}; /* an algorithm chosen for more alignment than a pointer has */
  for (int i = 0; i < 4; i++)
    if (!algo || !algo->data[i] || (uintptr_t)ptr[i] % algo->data[i]) return CUBLAS_STATUS_INVALID_VALUE;
  dt_emu_cublas hh = {h->device, stream, CUBLAS_POINTER_MODE_HOST, CUBLAS_DEFAULT_MATH};
  return gemm("cublasLtMatmul", &hh, d->ta, d->tb, m, n, k, (const float *)alpha, A, (int)a->ld, 0, B, (int)b->ld, 0,
              (const float *)beta, D, (int)o->ld, 0, 1, ROUND_NONE, lt_el(a->type), lt_el(o->type),
              d->epilogue == CUBLASLT_EPILOGUE_BIAS ? d->bias : NULL);
}

}  // extern "C"
