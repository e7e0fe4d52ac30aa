/* The CUDA emulation's cuBLAS (cuda/emu/cublas.cpp) against a column-major double-precision
 * reference written from the BLAS definition: cublasSgemm for every (transa, transb) with leading
 * dimensions larger than the matrices, alpha and beta != 1, beta = 0 over a NaN-filled C (cuBLAS
 * does not read C then); cublasSgemmStridedBatched; the handle's stream (the product waits for
 * it to run); CUBLAS_STATUS_INVALID_VALUE for a leading dimension too small; an operand outside
 * its allocation is a sticky illegal address naming the call; cublasGemmEx on bf16 and fp16
 * operands with an fp32 or 16-bit C; cublasLtMatmul's bias epilogue. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "kmath.h"
}

#include "emu_test.h"

static float val(int i, int salt) { return (float)((i * 37 + salt * 11) % 23 - 11) / 8.0f; }

/* C (m x n, ldc) = alpha op(A) op(B) + beta C, column-major, in double; beta == 0: C not read. */
static void ref_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B, int ldb,
                     float beta, float *C, int ldc) {
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0;
      for (int p = 0; p < k; p++) {
        double a = ta ? A[p + (size_t)i * lda] : A[i + (size_t)p * lda];
        double b = tb ? B[j + (size_t)p * ldb] : B[p + (size_t)j * ldb];
        s += a * b;
      }
      double c = beta == 0.0f ? 0.0 : (double)beta * C[i + (size_t)j * ldc];
      C[i + (size_t)j * ldc] = (float)(alpha * s + c);
    }
}

static float max_err(const std::vector<float> &a, const std::vector<float> &b) {
  float e = 0;
  for (size_t i = 0; i < a.size(); i++) e = fmaxf(e, fabsf(a[i] - b[i]) / fmaxf(1.0f, fabsf(b[i])));
  return e;
}

Test(emu_cublas, sgemm_every_transposition) {
  cublasHandle_t h;
  cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const int m = 13, n = 7, k = 19;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int zero_beta = 0; zero_beta < 2; zero_beta++) {
        int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 2, ldc = m + 5;
        std::vector<float> A((size_t)lda * (ta ? m : k)), B((size_t)ldb * (tb ? k : n)), C((size_t)ldc * n);
        for (size_t i = 0; i < A.size(); i++) A[i] = val((int)i, 1);
        for (size_t i = 0; i < B.size(); i++) B[i] = val((int)i, 2);
        for (size_t i = 0; i < C.size(); i++) C[i] = zero_beta ? NAN : val((int)i, 3);
        float alpha = 0.75f, beta = zero_beta ? 0.0f : -1.5f;
        float *dA = dev_from(A), *dB = dev_from(B), *dC = dev_from(C);
        cr_assert_eq(cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, dA,
                                 lda, dB, ldb, &beta, dC, ldc),
                     CUBLAS_STATUS_SUCCESS);
        std::vector<float> got = host_from(dC, C.size()), want = C;
        ref_gemm(ta, tb, m, n, k, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
        for (int j = 0; j < n; j++) /* padding rows of C must be untouched */
          for (int i = m; i < ldc; i++) {
            size_t q = i + (size_t)j * ldc;
            cr_assert(zero_beta ? isnan(got[q]) : got[q] == C[q], "padding C[%d,%d] changed", i, j);
            got[q] = want[q] = 0;
          }
        float e = max_err(got, want);
        cr_expect_lt(e, 1e-5f, "transa %d transb %d beta %g: max relative error %g", ta, tb, beta, e);
        printf("cublasSgemm(%c, %c, m=%d n=%d k=%d, lda=%d ldb=%d ldc=%d, alpha=%g beta=%g%s): max rel. error %.2e "
               "vs the double reference\n", ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, lda, ldb, ldc, alpha, beta,
               zero_beta ? " over NaN" : "", e);
        CU(cudaFree(dA));
        CU(cudaFree(dB));
        CU(cudaFree(dC));
      }
  cublasDestroy(h);
}

Test(emu_cublas, strided_batched_on_the_handles_stream) {
  cublasHandle_t h;
  cudaStream_t s;
  cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cr_assert_eq(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
  const int m = 8, n = 5, k = 6, batch = 4, lda = k, ldb = k, ldc = m; /* A^T (k x m), B (k x n) */
  long long sA = (long long)lda * m + 3, sB = (long long)ldb * n + 1, sC = (long long)ldc * n + 2;
  std::vector<float> A((size_t)sA * batch), B((size_t)sB * batch), C((size_t)sC * batch, 0.0f);
  for (size_t i = 0; i < A.size(); i++) A[i] = val((int)i, 4);
  for (size_t i = 0; i < B.size(); i++) B[i] = val((int)i, 5);
  float *dA = dev_from(A), *dB = dev_from(B), *dC = dev_from(C), alpha = 1.0f, beta = 0.0f;
  cr_assert_eq(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, lda, sA, dB, ldb, sB, &beta,
                                         dC, ldc, sC, batch),
               CUBLAS_STATUS_SUCCESS);
  std::vector<float> early(C.size());
  cudaError_t e0 = cudaMemcpyAsync(early.data(), dC, C.size() * sizeof(float), cudaMemcpyDeviceToHost, 0);
  cr_expect_eq(e0, cudaErrorIllegalState, "reading C before the handle's stream ran is not reported");
  cudaGetLastError();
  CU(cudaStreamSynchronize(s));
  std::vector<float> got = host_from(dC, C.size()), want = C;
  for (int b = 0; b < batch; b++)
    ref_gemm(1, 0, m, n, k, alpha, &A[(size_t)b * sA], lda, &B[(size_t)b * sB], ldb, beta, &want[(size_t)b * sC], ldc);
  float e = max_err(got, want);
  cr_expect_lt(e, 1e-5f, "max relative error %g", e);
  cr_expect_eq(early[0], 0.0f, "the product ran before its stream was synchronised");
  printf("cublasSgemmStridedBatched(T, N, %d batches) on a non-blocking stream: max rel. error %.2e\n", batch, e);
  cublasDestroy(h);
}

Test(emu_cublas, bad_arguments) {
  cublasHandle_t h;
  cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  float *d, one = 1.0f;
  CU(cudaMalloc((void **)&d, 64 * sizeof(float)));
  cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, 7, d, 8, &one, d, 8), CUBLAS_STATUS_INVALID_VALUE);
  cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 8, 8, &one, d, 8, d, 8, &one, d, 8), CUBLAS_STATUS_INVALID_VALUE);
  /* 9 x 8 does not fit in 64 floats: the product faults when it runs */
  cr_expect_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 9, 8, 8, &one, d, 9, d, 8, &one, d, 9), CUBLAS_STATUS_SUCCESS);
  cudaError_t e = cudaDeviceSynchronize();
  cr_expect_eq(e, cudaErrorIllegalAddress);
  cr_expect(err_mentions(e, "cublasSgemm") && err_mentions(e, "past its end"), "%s", cudaGetErrorString(e));
  printf("lda too small: CUBLAS_STATUS_INVALID_VALUE; A outside its allocation: %s\n", cudaGetErrorString(e));
}

/* cublasGemmEx with bf16 / fp16 A and B (CUBLAS_COMPUTE_32F): C in fp32 against the double
 * reference on the operands' values; C in the operands' type bit for bit the fp32 C rounded (the
 * same product, then one rounding), its padding untouched, not read at beta = 0 (NaN there) */
Test(emu_cublas, gemmex_16bit_operands) {
  cublasHandle_t h;
  cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const int m = 11, n = 6, k = 17;
  for (int fp16 = 0; fp16 < 2; fp16++)
    for (int t = 0; t < 2; t++)
      for (int zero_beta = 0; zero_beta < 2; zero_beta++) {
        const int ta = t, tb = !t, lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
        const cudaDataType_t ty = fp16 ? CUDA_R_16F : CUDA_R_16BF;
        std::vector<uint16_t> A((size_t)lda * (ta ? m : k)), B((size_t)ldb * (tb ? k : n)), C16((size_t)ldc * n);
        std::vector<float> Af(A.size()), Bf(B.size()), Cf(C16.size());
        for (size_t i = 0; i < A.size(); i++) Af[i] = dt_from16(A[i] = dt_to16(val((int)i, 6) * 1.37f, fp16), fp16);
        for (size_t i = 0; i < B.size(); i++) Bf[i] = dt_from16(B[i] = dt_to16(val((int)i, 7) * 0.71f, fp16), fp16);
        for (size_t i = 0; i < C16.size(); i++) { /* C's values exact in 16 bits: both Cs start equal */
          Cf[i] = zero_beta ? NAN : dt_from16(C16[i] = dt_to16(val((int)i, 8), fp16), fp16);
          if (zero_beta) C16[i] = fp16 ? 0x7e00 : 0x7fc0;
        }
        float alpha = 0.5f, beta = zero_beta ? 0.0f : 1.25f;
        uint16_t *dA = dev_from(A), *dB = dev_from(B), *dC16 = dev_from(C16);
        float *dCf = dev_from(Cf);
        cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        cr_assert_eq(cublasGemmEx(h, oa, ob, m, n, k, &alpha, dA, ty, lda, dB, ty, ldb, &beta, dCf, CUDA_R_32F, ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasGemmEx(h, oa, ob, m, n, k, &alpha, dA, ty, lda, dB, ty, ldb, &beta, dC16, ty, ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
        std::vector<float> got = host_from(dCf, Cf.size()), want = Cf;
        std::vector<uint16_t> got16 = host_from(dC16, C16.size());
        ref_gemm(ta, tb, m, n, k, alpha, Af.data(), lda, Bf.data(), ldb, beta, want.data(), ldc);
        int bits = 0, pad = 0;
        for (int j = 0; j < n; j++)
          for (int i = 0; i < ldc; i++) {
            size_t q = i + (size_t)j * ldc;
            if (i >= m) { /* padding: untouched on both sides */
              pad += got16[q] != C16[q] || !(zero_beta ? isnan(got[q]) : got[q] == Cf[q]);
              got[q] = want[q] = 0;
            } else {
              bits += got16[q] != dt_to16(got[q], fp16);
            }
          }
        float e = max_err(got, want);
        cr_expect_lt(e, 1e-5f, "%s ta %d beta %g: fp32 C max relative error %g", fp16 ? "fp16" : "bf16", ta, beta, e);
        cr_expect_eq(bits, 0, "%d elements of the 16-bit C are not the fp32 C rounded", bits);
        cr_expect_eq(pad, 0, "%d padding elements of C changed", pad);
        printf("cublasGemmEx(%s A, B; %c, %c; beta=%g%s): fp32 C max rel. error %.2e vs double, 16-bit C = fp32 C "
               "rounded (%d differ)\n", fp16 ? "fp16" : "bf16", ta ? 'T' : 'N', tb ? 'T' : 'N', beta,
               zero_beta ? " over NaN" : "", e, bits);
        CU(cudaFree(dA));
        CU(cudaFree(dB));
        CU(cudaFree(dC16));
        CU(cudaFree(dCf));
      }
  /* what cuBLAS does not run either: mixed A/B types, a 16-bit C of the other type, a FAST
   * compute type on 16-bit operands */
  void *d;
  float one = 1.0f;
  CU(cudaMalloc(&d, 256));
  cr_expect_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_16BF, 4, d, CUDA_R_16F, 4, &one, d,
                            CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               CUBLAS_STATUS_NOT_SUPPORTED);
  cr_expect_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_16BF, 4, d, CUDA_R_16BF, 4, &one, d,
                            CUDA_R_16F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               CUBLAS_STATUS_NOT_SUPPORTED);
  cr_expect_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_16F, 4, d, CUDA_R_16F, 4, &one, d,
                            CUDA_R_32F, 4, CUBLAS_COMPUTE_32F_FAST_16F, CUBLAS_GEMM_DEFAULT),
               CUBLAS_STATUS_NOT_SUPPORTED);
  CU(cudaFree(d));
  cublasDestroy(h);
}

/* cuBLASLt's bias epilogue on 16-bit operands (the CUDA backend's biased products with 16-bit
 * storage): D = round(op(A) op(B) + bias per row of D), the bias added in fp32 before the one
 * rounding; against a double reference (within one 16-bit rounding) and against cublasGemmEx's
 * fp32 C plus the bias, rounded, bit for bit. The heuristic keeps the preference's alignments and
 * cublasLtMatmul refuses a pointer less aligned; mixed A and B types have no algorithm. */
Test(emu_cublas, lt_bias_epilogue_16bit) {
  cublasHandle_t h;
  cublasLtHandle_t lt;
  cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  const int m = 13, n = 7, k = 19;
  for (int fp16 = 0; fp16 < 2; fp16++)
    for (int ta = 0; ta < 2; ta++) {
      const int tb = !ta, lda = ta ? k : m, ldb = tb ? n : k;
      const cudaDataType_t ty = fp16 ? CUDA_R_16F : CUDA_R_16BF;
      std::vector<uint16_t> A((size_t)lda * (ta ? m : k)), B((size_t)ldb * (tb ? k : n)), bias(m), D((size_t)m * n);
      std::vector<float> Af(A.size()), Bf(B.size()), bf(m), C32((size_t)m * n, 0.0f);
      for (size_t i = 0; i < A.size(); i++) Af[i] = dt_from16(A[i] = dt_to16(val((int)i, 3) * 1.11f, fp16), fp16);
      for (size_t i = 0; i < B.size(); i++) Bf[i] = dt_from16(B[i] = dt_to16(val((int)i, 4) * 0.93f, fp16), fp16);
      for (int i = 0; i < m; i++) bf[i] = dt_from16(bias[i] = dt_to16(val(i, 5) * 2.3f, fp16), fp16);
      uint16_t *dA = dev_from(A), *dB = dev_from(B), *dbias = dev_from(bias), *dD = dev_from(D);
      float *dC = dev_from(C32);
      cublasLtMatmulDesc_t desc;
      cublasLtMatrixLayout_t la, lb, ld;
      cublasLtMatmulPreference_t pref;
      const int32_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
      const uint32_t epi = CUBLASLT_EPILOGUE_BIAS, al = 16;
      const uint64_t ws = 0;
      const void *bp = dbias;
      cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp);
      cublasLtMatrixLayoutCreate(&la, ty, ta ? k : m, ta ? m : k, lda);
      cublasLtMatrixLayoutCreate(&lb, ty, tb ? n : k, tb ? k : n, ldb);
      cublasLtMatrixLayoutCreate(&ld, ty, m, n, m);
      cublasLtMatmulPreferenceCreate(&pref);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      for (int a = CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES; a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES; a++)
        cublasLtMatmulPreferenceSetAttribute(pref, (cublasLtMatmulPreferenceAttributes_t)a, &al, sizeof al);
      cublasLtMatmulHeuristicResult_t r;
      int got = 0;
      cr_assert_eq(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &r, &got), CUBLAS_STATUS_SUCCESS);
      cr_assert_eq(got, 1);
      const float one = 1.0f, zero = 0.0f;
      cr_assert_eq(cublasLtMatmul(lt, desc, &one, dA, la, dB, lb, &zero, dD, ld, dD, ld, &r.algo, NULL, 0, 0),
                   CUBLAS_STATUS_SUCCESS);
      cr_expect_eq(cublasLtMatmul(lt, desc, &one, (char *)dA + 2, la, dB, lb, &zero, dD, ld, dD, ld, &r.algo, NULL, 0,
                                  0),
                   CUBLAS_STATUS_INVALID_VALUE, "a pointer less aligned than the plan's");
      cr_assert_eq(cublasGemmEx(h, (cublasOperation_t)oa, (cublasOperation_t)ob, m, n, k, &one, dA, ty, lda, dB, ty,
                                ldb, &zero, dC, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   CUBLAS_STATUS_SUCCESS);
      std::vector<uint16_t> gotD = host_from(dD, D.size());
      std::vector<float> c = host_from(dC, C32.size()), want((size_t)m * n, 0.0f);
      ref_gemm(ta, tb, m, n, k, 1.0f, Af.data(), lda, Bf.data(), ldb, 0.0f, want.data(), m);
      int bits = 0, far = 0;
      for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
          const size_t q = i + (size_t)j * m;
          const uint16_t expect = dt_to16(c[q] + bf[i], fp16);
          const double ref = (double)want[q] + bf[i], v = dt_from16(gotD[q], fp16);
          bits += gotD[q] != expect;
          far += fabs(v - ref) > fabs(ref) * (fp16 ? 1.0 / 1024 : 1.0 / 128) + 1e-6; /* one rounding */
        }
      cr_expect_eq(bits, 0, "%d elements of D are not round(GemmEx fp32 C + bias)", bits);
      cr_expect_eq(far, 0, "%d elements of D more than one 16-bit rounding from the double reference", far);
      printf("cublasLtMatmul(%s, %c, %c, bias epilogue): D = round(fp32 product + bias) (%d differ), within one "
             "rounding of double (%d further)\n", fp16 ? "fp16" : "bf16", ta ? 'T' : 'N', tb ? 'T' : 'N', bits, far);
      /* mixed A and B types: no algorithm */
      cublasLtMatrixLayout_t l16;
      cublasLtMatrixLayoutCreate(&l16, fp16 ? CUDA_R_16BF : CUDA_R_16F, tb ? n : k, tb ? k : n, ldb);
      cr_expect_eq(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, l16, ld, ld, pref, 1, &r, &got),
                   CUBLAS_STATUS_NOT_SUPPORTED);
      cr_expect_eq(got, 0);
      cublasLtMatrixLayoutDestroy(l16);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(ld);
      cublasLtMatmulDescDestroy(desc);
      CU(cudaFree(dA));
      CU(cudaFree(dB));
      CU(cudaFree(dbias));
      CU(cudaFree(dD));
      CU(cudaFree(dC));
    }
  cublasLtDestroy(lt);
  cublasDestroy(h);
}
