/* The CUDA backend's products (backend_cuda_int.h): the layers' linear forward and backward over
 * the kernel table's storage, and the matmul attention's batched products (system.attention =
 * matmul). Weights in two layouts, as on the CPU (ops_cpu.h): the lm_head's wte (OC, C) like
 * nn.Linear (w_in_out = 0), the blocks' (C, OC) like Hugging Face's Conv1D (w_in_out = 1).
 *
 * Float storage (act_bytes 4): cuBLAS on fp32 buffers (16-bit tensor cores on operands already
 * rounded for bf16/fp16: gemm_lin), then the epilogue in place. 16-bit storage (act_bytes 2):
 * cublasGemmEx on the bf16/fp16 operands with fp32 accumulation; a product without bias or
 * residual is written by cuBLAS in 16 bits (rounded once from the fp32 sum, the float path's
 * model-side rounding), one with them into the fp32 accumulator im->acc and stored by
 * dt_cu_epilogue (rounded once after the sums, as the float path's epilogue); weight gradients
 * accumulate in fp32. */
#include <math.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "dt_build.h" /* DT_HAVE_CUDA */

#include "backend.h"
#include "cuda_check.h"
#include "kernels.h"
#include "backend_cuda_int.h"

/* ---- float storage ------------------------------------------------------------------------- */

/* out (N,OC) = inp (N,C) W^T + bias with W (OC,C), or inp W + bias with W (C,OC) (w_in_out), then
 * + resid; bias and resid in one pass over out (resid + (out + bias): the CPU's sums, commuted),
 * which also rounds out to prec (with a bias: backend.h) */
static dt_status_t linear_forward32(cu_impl_t *im, float *out, const float *inp, const float *w, bool w_in_out,
                                    const float *bias, const float *resid, int N, int C, int OC, int prec) {
  DT_TRY(gemm_lin(im, false, !w_in_out, N, OC, C, inp, C, w, w_in_out ? OC : C, 0.0f, out, OC));
  if (bias && resid) return dt_cu_bias_residual(out, bias, resid, N, OC, prec, im->compute); /* one pass for both */
  if (bias) return dt_cu_add_bias(out, bias, N, OC, prec, im->compute);
  return resid ? dt_cu_residual_forward(out, out, resid, (size_t)N * OC, DT_PREC_FP32, im->compute) : DT_OK;
}

/* W (OC,C): dinp (N,C) = dout W, dweight (OC,C) += dout^T inp; W (C,OC) (w_in_out): dinp = dout W^T,
 * dweight (C,OC) += inp^T dout; dbias (OC) += sum_N dout */
static dt_status_t linear_backward32(cu_impl_t *im, float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *w, bool w_in_out, int N, int C, int OC) {
  if (dinp) DT_TRY(gemm_lin(im, false, w_in_out, N, C, OC, dout, OC, w, w_in_out ? OC : C, 0.0f, dinp, C));
  if (w_in_out) DT_TRY(gemm_lin(im, true, false, C, OC, N, inp, C, dout, OC, 1.0f, dweight, OC));
  else DT_TRY(gemm_lin(im, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C));
  if (dbias) DT_TRY(dt_cu_colscr_reserve(im, (size_t)OC));
  if (dbias) DT_TRY(dt_cu_col_sum(dbias, dout, N, OC, im->colscr, DT_PREC_FP32, im->compute));
  return DT_OK;
}

/* ---- 16-bit storage ------------------------------------------------------------------------ */

/* C = op(A) op(B) [+ beta C] on row-major 16-bit A and B (cublasGemmEx, fp32 accumulation); C in
 * the operands' type (beta 0: the fp32 sum rounded once) or fp32 (CUDA_R_32F) */
static dt_status_t gemm16(cu_impl_t *im, cudaDataType_t ct, bool ta, bool tb, int M, int N, int K, const void *A,
                          int lda, const void *B, int ldb, float beta, void *C, int ldc) {
  const float alpha = 1.0f;
  dt_cuda_gemm_t g = dt_cuda_gemm_rowmajor(ta, tb, M, N, K);
  DT_CUBLAS_CHECK(cublasGemmEx(im->blas, op(g.op_first), op(g.op_second), g.m, g.n, g.k, &alpha, B, im->st16, ldb, A,
                               im->st16, lda, &beta, C, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return DT_OK;
}

static dt_status_t linear_forward16(dt_backend_t *be, void *out, const void *inp, const void *w, bool w_in_out,
                                    const void *bias, const void *resid, int N, int C, int OC) {
  cu_impl_t *im = impl(be);
  if (!bias && !resid) /* cuBLAS stores the 16 bits */
    return gemm16(im, im->st16, false, !w_in_out, N, OC, C, inp, C, w, w_in_out ? OC : C, 0.0f, out, OC);
  if ((size_t)N * OC > im->acc_n)
    return DT_ERR(DT_ERR_ARG, "cuda backend: a %d x %d product with a bias exceeds the accumulator of %zu floats", N,
                  OC, im->acc_n);
  DT_TRY(gemm16(im, CUDA_R_32F, false, !w_in_out, N, OC, C, inp, C, w, w_in_out ? OC : C, 0.0f, im->acc, OC));
  return dt_cu_epilogue(out, NULL, im->acc, bias, resid, N, OC, dt_cu_store(be, be->precision), im->compute);
}

static dt_status_t linear_backward16(dt_backend_t *be, void *dinp, float *dweight, float *dbias, const void *dout,
                                     const void *inp, const void *w, bool w_in_out, int N, int C, int OC) {
  cu_impl_t *im = impl(be);
  if (dinp) DT_TRY(gemm16(im, im->st16, false, w_in_out, N, C, OC, dout, OC, w, w_in_out ? OC : C, 0.0f, dinp, C));
  if (w_in_out) DT_TRY(gemm16(im, CUDA_R_32F, true, false, C, OC, N, inp, C, dout, OC, 1.0f, dweight, OC));
  else DT_TRY(gemm16(im, CUDA_R_32F, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C));
  if (dbias) DT_TRY(dt_cu_colscr_reserve(im, (size_t)OC));
  if (dbias) DT_TRY(dt_cu_col_sum(dbias, dout, N, OC, im->colscr, dt_cu_store(be, be->precision), im->compute));
  return DT_OK;
}

dt_status_t dt_cu_linear_forward(dt_backend_t *be, void *out, const void *inp, const void *w, bool w_in_out,
                                 const void *bias, const void *resid, int N, int C, int OC) {
  if (be->act_bytes == 2) return linear_forward16(be, out, inp, w, w_in_out, bias, resid, N, C, OC);
  return linear_forward32(impl(be), (float *)out, (const float *)inp, (const float *)w, w_in_out,
                          (const float *)bias, (const float *)resid, N, C, OC, be->precision);
}

dt_status_t dt_cu_linear_backward(dt_backend_t *be, void *dinp, float *dweight, float *dbias, const void *dout,
                                  const void *inp, const void *w, bool w_in_out, int N, int C, int OC) {
  if (be->act_bytes == 2) return linear_backward16(be, dinp, dweight, dbias, dout, inp, w, w_in_out, N, C, OC);
  return linear_backward32(impl(be), (float *)dinp, dweight, dbias, (const float *)dout, (const float *)inp,
                           (const float *)w, w_in_out, N, C, OC);
}

/* tensor parallelism's partial products in fp32, unrounded, whatever the storage */
dt_status_t dt_cu_linear_forward32(dt_backend_t *be, float *out, const void *inp, const void *w, bool w_in_out, int N,
                                   int C, int OC) {
  cu_impl_t *im = impl(be);
  if (be->act_bytes == 2)
    return gemm16(im, CUDA_R_32F, false, !w_in_out, N, OC, C, inp, C, w, w_in_out ? OC : C, 0.0f, out, OC);
  return gemm_lin(im, false, !w_in_out, N, OC, C, (const float *)inp, C, (const float *)w, w_in_out ? OC : C, 0.0f,
                  out, OC);
}

dt_status_t dt_cu_linear_backward32(dt_backend_t *be, float *dinp, float *dweight, float *dbias, const void *dout,
                                    const void *inp, const void *w, bool w_in_out, int N, int C, int OC) {
  if (be->act_bytes == 4) /* the float path's dinp is fp32 and unrounded already */
    return dt_cu_linear_backward(be, dinp, dweight, dbias, dout, inp, w, w_in_out, N, C, OC);
  if (dinp)
    DT_TRY(gemm16(impl(be), CUDA_R_32F, false, w_in_out, N, C, OC, dout, OC, w, w_in_out ? OC : C, 0.0f, dinp, C));
  return dt_cu_linear_backward(be, NULL, dweight, dbias, dout, inp, w, w_in_out, N, C, OC);
}

/* ---- attention (ops_cpu.c's dt_attention_forward/backward with per-b strided batches over heads) */

dt_status_t dt_cu_matmul_attention_forward(cu_impl_t *im, float *out, float *att, const float *qkv, int B, int T, int C,
                                     int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  const long long TT = (long long)T * T;
  for (int b = 0; b < B; b++) { /* scores q k^T * scale, (T,hs) x (hs,T) per head */
    const float *q = qkv + (size_t)b * T * C3, *k = q + C;
    DT_TRY(gemm_rm_batched(im->blas, false, true, T, T, hs, scale, q, C3, hs, k, C3, hs, 0.0f,
                           att + (size_t)b * NH * TT, T, TT, NH));
  }
  DT_TRY(dt_cu_softmax_causal(att, B * NH * T, T, im->compute));
  for (int b = 0; b < B; b++) { /* out_h = att v, (T,T) x (T,hs) */
    const float *v = qkv + (size_t)b * T * C3 + 2 * C;
    DT_TRY(gemm_rm_batched(im->blas, false, false, T, hs, T, 1.0f, att + (size_t)b * NH * TT, T, TT, v, C3, hs, 0.0f,
                           out + (size_t)b * T * C, C, hs, NH));
  }
  return DT_OK;
}

dt_status_t dt_cu_matmul_attention_backward(cu_impl_t *im, float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *att, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  const long long TT = (long long)T * T;
  for (int b = 0; b < B; b++) {
    const float *v = qkv + (size_t)b * T * C3 + 2 * C, *a = att + (size_t)b * NH * TT, *g = dout + (size_t)b * T * C;
    /* datt = dout_h v^T */
    DT_TRY(gemm_rm_batched(im->blas, false, true, T, T, hs, 1.0f, g, C, hs, v, C3, hs, 0.0f,
                           scratch + (size_t)b * NH * TT, T, TT, NH));
    /* dv = att^T dout_h */
    DT_TRY(gemm_rm_batched(im->blas, true, false, T, hs, T, 1.0f, a, T, TT, g, C, hs, 0.0f,
                           dqkv + (size_t)b * T * C3 + 2 * C, C3, hs, NH));
  }
  DT_TRY(dt_cu_softmax_causal_backward(scratch, att, B * NH * T, T, im->compute));
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3, *k = q + C, *dp = scratch + (size_t)b * NH * TT;
    float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C;
    DT_TRY(gemm_rm_batched(im->blas, false, false, T, hs, T, scale, dp, T, TT, k, C3, hs, 0.0f, dq, C3, hs, NH));
    DT_TRY(gemm_rm_batched(im->blas, true, false, T, hs, T, scale, dp, T, TT, q, C3, hs, 0.0f, dk, C3, hs, NH));
  }
  return DT_OK;
}
