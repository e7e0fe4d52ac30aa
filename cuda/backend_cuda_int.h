/* The CUDA backend's internals shared by its files (backend_cuda.cu: memory, GPT-2's kernel table;
 * backend_cuda_cnn.cu: the image classifiers' table): the backend's state and the row-major
 * cuBLAS products. Internal (C++). */
#ifndef DT_BACKEND_CUDA_INT_H
#define DT_BACKEND_CUDA_INT_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "dt_build.h"

extern "C" {
#include "backend.h"
}
#include "cuda_check.h"
#include "cuda_launch.h"
#include "embed_buckets.h"
#include "kernels.h"
#include "sparse.h"

/* The activations are the model's (gpt2.c carves them from k_alloc); the backend keeps its
 * streams, the gradient-group events, cuBLAS, and the host-side scratch of its kernels. */
typedef struct {
  cudaStream_t compute, comm;
  cudaEvent_t *group_ev; /* L+2: gradient group g final on the compute stream */
  cudaEvent_t comm_ev;   /* the comm stream's work so far (joined before grads are read/reset) */
  cublasHandle_t blas;
  int device;
  int *order, *h_order, *h_count; /* embedding backward's token buckets (embed_buckets.h): device and */
  dt_embed_bucket_t *buckets, *h_buckets; /* host order (B*T), host counts (V+1), buckets (<= B*T) */
  double *partial, *h_partial; /* device and host DT_CUDA_SUMSQ_BLOCKS */
  float *colscr;               /* column reductions' partials, for up to colscr_cols columns */
  size_t colscr_cols;
  /* bf16/fp16: the layers' products (linear, convolution) on 16-bit tensor cores (cublasGemmEx with fp32
   * operands, CUBLAS_COMPUTE_32F_FAST_16BF or _16F): their operands are already rounded to that
   * format (the model's storage rounding and the rounded working copy of the weights), so the
   * conversion is exact and only the fp32 accumulation order differs from cublasSgemm's */
  int lin_16;
  cublasComputeType_t lin_compute;
  cudaDataType_t st16;       /* 16-bit storage (be->act_bytes 2): CUDA_R_16BF or CUDA_R_16F */
  float *acc;                /* 16-bit storage: the fp32 result of a product with a bias or a */
  size_t acc_n;              /* residual, before its epilogue stores it (backend_cuda_gemm.cu) */
  cublasLtHandle_t lt;       /* 16-bit storage: cuBLASLt for the products with a bias epilogue, */
  void *lt_ws;               /* its workspace, and a plan per problem shape (backend_cuda_gemm.cu) */
  size_t lt_ws_bytes;
  struct dt_cu_lt_plan *lt_plans;
  int lt_nplans;
  struct dt_cudnn *cudnn; /* system.conv or batchnorm = cudnn: conv_cudnn.h's state, else NULL */
  struct dt_cudnn_att *catt; /* system.attention = cudnn: attention_cudnn.h's state, else NULL */
  dt_cu_sparse_t *sp_params, *sp_grads; /* be->sparse: those arenas (sparse.h), else NULL */
  dt_cu_sparse_t *sp_wparams;           /* DT_SPARSE_PARAMS with bf16/fp16: the working copy's */
  size_t *seg_ends;          /* the optimizer range's segments for dt_cu_adamw_multi (device), */
  unsigned char *seg_kinds;  /* built at the first AdamW step */
  int nseg;
} cu_impl_t;

static inline cu_impl_t *impl(dt_backend_t *be) { return (cu_impl_t *)be->impl; }

/* The kernel table's clear and populate (backend.h): on a sparse arena (sparse.cu) a drop and a
 * populate, elsewhere a memset and nothing. */
dt_status_t dt_cu_arena_clear(dt_backend_t *be, float *x, size_t n);
dt_status_t dt_cu_arena_populate(dt_backend_t *be, float *x, size_t n);

/* cuDNN: in the real CUDA build where configure found cudnn.h; the emulation has its own (cuda/emu/cudnn.h) */
#if defined(DT_HAVE_CUDNN_H) || defined(DT_CUDA_EMU_RUNTIME)
#define DT_CU_CUDNN 1
#else
#define DT_CU_CUDNN 0
#endif

/* backend_cuda_cnn.cu: open cuDNN for be->cudnn_conv or cudnn_bn (an error where this build has none), close it */
dt_status_t dt_cu_cudnn_init(dt_backend_t *be);
void dt_cu_cudnn_free(cu_impl_t *im);
void dt_cu_cudnn_print_version(FILE *out); /* dtrain --version's cudnn line */
const char *dt_cu_cudnn_name(const cu_impl_t *im); /* "cuDNN 9.x.y" in use, else NULL */

/* C = alpha op(A) op(B) + beta C on ROW-major matrices, like cblas_sgemm(CblasRowMajor, ...),
 * through dt_cuda_gemm_rowmajor (cuda_launch.h, tested on the CPU against a column-major
 * reference): operands and M/N swapped, flags kept. */
static inline cublasOperation_t op(int t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

static inline dt_status_t gemm_rm(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  dt_cuda_gemm_t g = dt_cuda_gemm_rowmajor(ta, tb, M, N, K);
  DT_CUBLAS_CHECK(
      cublasSgemm(h, op(g.op_first), op(g.op_second), g.m, g.n, g.k, &alpha, B, ldb, A, lda, &beta, C, ldc));
  return DT_OK;
}

/* gemm_rm through cublasGemmEx: fp32 operands and result, `ct` the compute type */
static inline dt_status_t gemm_rm_ex(cublasHandle_t h, cublasComputeType_t ct, bool ta, bool tb, int M, int N, int K,
                                     float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                                     float *C, int ldc) {
  dt_cuda_gemm_t g = dt_cuda_gemm_rowmajor(ta, tb, M, N, K);
  DT_CUBLAS_CHECK(cublasGemmEx(h, op(g.op_first), op(g.op_second), g.m, g.n, g.k, &alpha, B, CUDA_R_32F, ldb, A,
                               CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT));
  return DT_OK;
}

/* A layer's product (the linear layers, the convolutions): cublasSgemm (fp32, TF32 with
 * system.tf32), or 16-bit tensor cores on operands already rounded to bf16/fp16 (lin_16) */
static inline dt_status_t gemm_lin(cu_impl_t *im, bool ta, bool tb, int M, int N, int K, const float *A, int lda,
                                   const float *B, int ldb, float beta, float *C, int ldc) {
  if (im->lin_16) return gemm_rm_ex(im->blas, im->lin_compute, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  return gemm_rm(im->blas, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

/* The same over `batch` problems at fixed strides (elements) between consecutive A, B, C. */
static inline dt_status_t gemm_rm_batched(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                                          const float *A, int lda, long long sA, const float *B, int ldb, long long sB,
                                          float beta, float *C, int ldc, long long sC, int batch) {
  dt_cuda_gemm_t g = dt_cuda_gemm_rowmajor(ta, tb, M, N, K);
  DT_CUBLAS_CHECK(cublasSgemmStridedBatched(h, op(g.op_first), op(g.op_second), g.m, g.n, g.k, &alpha, B, ldb, sB, A,
                                            lda, sA, &beta, C, ldc, sC, batch));
  return DT_OK;
}


/* The precision argument of a kernel that stores activations: with 16-bit storage the run's
 * precision with DT_STORE16, else float_prec (the run's, or DT_PREC_FP32 where the model rounds) */
static inline int dt_cu_store(const dt_backend_t *be, int float_prec) {
  return be->act_bytes == 2 ? be->precision | DT_STORE16 : float_prec;
}

/* backend_cuda_gemm.cu: the layers' products over the storage (be->act_bytes), as the kernel
 * table's linear_forward/backward (backend.h), and the matmul attention on float storage */
dt_status_t dt_cu_linear_forward(dt_backend_t *be, void *out, const void *inp, const void *w, bool w_in_out,
                                 const void *bias, const void *resid, int N, int C, int OC);
dt_status_t dt_cu_linear_backward(dt_backend_t *be, void *dinp, float *dweight, float *dbias, const void *dout,
                                  const void *inp, const void *w, bool w_in_out, int N, int C, int OC);
/* the same with out, dinp fp32 and unrounded whatever the storage (no bias, no residual) */
dt_status_t dt_cu_linear_forward32(dt_backend_t *be, float *out, const void *inp, const void *w, bool w_in_out, int N,
                                   int C, int OC);
dt_status_t dt_cu_linear_backward32(dt_backend_t *be, float *dinp, float *dweight, float *dbias, const void *dout,
                                    const void *inp, const void *w, bool w_in_out, int N, int C, int OC);
/* 16-bit storage: cuBLASLt and its workspace (set_precision), and their release with the plans */
dt_status_t dt_cu_lt_open(cu_impl_t *im);
void dt_cu_lt_close(cu_impl_t *im);
dt_status_t dt_cu_matmul_attention_forward(cu_impl_t *im, float *out, float *att, const float *qkv, int B, int T,
                                           int C, int NH);
dt_status_t dt_cu_matmul_attention_backward(cu_impl_t *im, float *dqkv, float *scratch, const float *dout,
                                            const float *qkv, const float *att, int B, int T, int C, int NH);

/* The column-sum scratch (dt_cu_col_sum) holds at least `cols` columns: grown on first need (the
 * image classifiers' bias widths are not known at init). */
dt_status_t dt_cu_colscr_reserve(cu_impl_t *im, size_t cols);

/* *p = `bytes` (at least 64) of zeroed device memory, the zeroing queued on s (backend_cuda.cu). */
dt_status_t dt_cu_alloc_zero(void **p, size_t bytes, cudaStream_t s);

/* Order the compute stream after everything enqueued on the comm stream so far (the gradients'
 * all-reduces), before gradients are read or reset (backend_cuda.cu). */
dt_status_t dt_cu_join_comm(cu_impl_t *im);

extern "C" const dt_kernels_t dt_cuda_kernels;         /* backend_cuda_table.cu */
extern "C" const dt_cnn_kernels_t dt_cuda_cnn_kernels; /* backend_cuda_cnn.cu */

#endif
