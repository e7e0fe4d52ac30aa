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

#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>
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

/* ---- cuBLASLt's bias epilogue (16-bit storage): out = round(inp W + bias) in one kernel, the bias
 * added in fp32 before the one rounding, as dt_cu_epilogue adds it to the fp32 accumulator: the
 * same values without the accumulator's write and read. A plan (descriptor, layouts, the
 * heuristic's algorithm) per problem shape, kept; a shape the heuristic finds nothing for takes
 * the accumulator. ---------------------------------------------------------------------------- */

#define LT_PLANS 16
#define LT_WORKSPACE (32u << 20) /* bytes, as llm.c gives cuBLASLt */

struct dt_cu_lt_plan {
  int m, n, k, ta, tb, lda, ldb, align, ok; /* the column-major problem, its pointers' alignment (bytes);
                                               ok: an algorithm was found */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
};

dt_status_t dt_cu_lt_open(cu_impl_t *im) {
  if (im->lt) return DT_OK;
  DT_CUBLAS_CHECK(cublasLtCreate(&im->lt));
  im->lt_plans = (dt_cu_lt_plan *)calloc(LT_PLANS, sizeof *im->lt_plans);
  if (!im->lt_plans) return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory");
  DT_CUDA_CHECK(cudaMalloc(&im->lt_ws, LT_WORKSPACE));
  im->lt_ws_bytes = LT_WORKSPACE;
  return DT_OK;
}

void dt_cu_lt_close(cu_impl_t *im) {
  for (int i = 0; i < im->lt_nplans; i++) {
    dt_cu_lt_plan *p = &im->lt_plans[i];
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
  }
  free(im->lt_plans);
  im->lt_plans = NULL;
  im->lt_nplans = 0;
  if (im->lt_ws) cudaFree(im->lt_ws);
  im->lt_ws = NULL;
  if (im->lt) cublasLtDestroy(im->lt);
  im->lt = NULL;
}

/* The largest power of two (up to 256) that divides every address (cuBLASLt's heuristic assumes 256
 * unless told: our views are 16 to 64 bytes aligned) */
static int lt_align(const void *a, const void *b, const void *c) {
  const uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | 256;
  return (int)(u & (~u + 1));
}

/* A new plan for the column-major problem g with leading dimensions lda (first operand), ldb and
 * pointers aligned to `align` bytes */
static dt_status_t lt_plan_make(cu_impl_t *im, dt_cu_lt_plan *p, const dt_cuda_gemm_t *g, int lda, int ldb,
                                int align, const void *bias) {
  const int32_t ta = g->op_first ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->op_second ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint32_t epi = CUBLASLT_EPILOGUE_BIAS, al = (uint32_t)align;
  *p = (dt_cu_lt_plan){g->m, g->n, g->k, g->op_first, g->op_second, lda, ldb, align, 0, NULL, NULL, NULL, NULL, {}};
  DT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  DT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  DT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  DT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, im->st16, ta ? g->k : g->m, ta ? g->m : g->k, lda));
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, im->st16, tb ? g->n : g->k, tb ? g->k : g->n, ldb));
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, im->st16, g->m, g->n, g->m));
  cublasLtMatmulPreference_t pref;
  const uint64_t ws = im->lt_ws_bytes;
  DT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
    st = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &al, sizeof al);
  cublasLtMatmulHeuristicResult_t r;
  int got = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(im->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &r, &got);
  cublasLtMatmulPreferenceDestroy(pref);
  p->ok = (st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED) && got > 0; /* else: the accumulator */
  if (p->ok) p->algo = r.algo;
  return DT_OK;
}

/* out (N,OC) = inp W + bias through cuBLASLt: DT_OK with *done = 1, or *done = 0 where it has no
 * plan for the shape (the caller takes the accumulator) */
static dt_status_t lt_bias_forward(cu_impl_t *im, void *out, const void *inp, const void *w, bool w_in_out,
                                   const void *bias, int N, int C, int OC, int *done) {
  dt_cuda_gemm_t g = dt_cuda_gemm_rowmajor(false, !w_in_out, N, OC, C);
  const int lda = w_in_out ? OC : C, align = lt_align(w, inp, out); /* first operand W, the second inp (ld C) */
  dt_cu_lt_plan *p = NULL;
  for (int i = 0; i < im->lt_nplans && !p; i++) {
    dt_cu_lt_plan *q = &im->lt_plans[i];
    if (q->m == g.m && q->n == g.n && q->k == g.k && q->ta == g.op_first && q->tb == g.op_second && q->lda == lda &&
        q->ldb == C && q->align == align)
      p = q;
  }
  if (!p && im->lt_nplans < LT_PLANS) {
    p = &im->lt_plans[im->lt_nplans++];
    DT_TRY(lt_plan_make(im, p, &g, lda, C, align, bias));
  }
  *done = 0;
  if (!p || !p->ok) return DT_OK;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmul(im->lt, p->desc, &one, w, p->a, inp, p->b, &zero, out, p->d, out, p->d, &p->algo, im->lt_ws,
                        im->lt_ws_bytes, im->compute);
  if (st != CUBLAS_STATUS_SUCCESS) { /* refused before it ran: this shape takes the accumulator from now on */
    fprintf(stderr, "# note: cuda backend: cuBLASLt's bias epilogue refused a %d x %d x %d product (status %d); "
            "it takes the fp32 accumulator instead\n", g.m, g.n, g.k, (int)st);
    p->ok = 0;
    return DT_OK;
  }
  *done = 1;
  return DT_OK;
}

static dt_status_t linear_forward16(dt_backend_t *be, void *out, const void *inp, const void *w, bool w_in_out,
                                    const void *bias, const void *resid, int N, int C, int OC) {
  cu_impl_t *im = impl(be);
  if (!bias && !resid) /* cuBLAS stores the 16 bits */
    return gemm16(im, im->st16, false, !w_in_out, N, OC, C, inp, C, w, w_in_out ? OC : C, 0.0f, out, OC);
  int done = 0;
  if (bias && !resid && im->lt) DT_TRY(lt_bias_forward(im, out, inp, w, w_in_out, bias, N, C, OC, &done));
  if (done) return DT_OK;
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
