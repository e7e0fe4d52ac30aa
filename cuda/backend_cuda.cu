/* The CUDA backend (dt_backend_cuda): the GPT-2 forward/backward of gpt2.c step for step,
 * on one device, with cuBLAS for every matmul and cuda/kernels.cu for the rest. Arenas (params,
 * grads, m, v) and the activations are device memory carved like the CPU backend's; everything
 * is allocated in init. Work runs on a compute stream; backward records an event per finished
 * gradient group and makes the communication stream (be->comm_stream) wait on it before it calls
 * ready(), so NCCL all-reduces enqueued there overlap the rest of backward. Mixed precision
 * (bf16/fp16) rounds at the same points as gpt2.c (STORE, precision.h) with the same
 * kmath.h functions, in fp32 storage: compiled, never run on a GPU. Also dt_cuda_device_count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include "dt_build.h" /* DT_HAVE_CUDA */
extern "C" {
#include "backend.h"
#include "dt_cuda.h"
}
#include "cuda_check.h"
#include "cuda_launch.h"
#include "kernels.h"

/* ---- device discovery --------------------------------------------------------------------- */

static char device_error[256];

extern "C" int dt_cuda_device_count(void) {
  int n = 0; /* cudaGetDeviceCount leaves it untouched on error (e.g. no driver) */
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    snprintf(device_error, sizeof device_error, "cudaGetDeviceCount: %s", cudaGetErrorString(rc));
    cudaGetLastError();
    return 0;
  }
  if (n <= 0) {
    snprintf(device_error, sizeof device_error, "cudaGetDeviceCount: no CUDA device");
    return 0;
  }
  device_error[0] = '\0';
  return n;
}

extern "C" const char *dt_cuda_device_error(void) { return device_error; }

extern "C" dt_status_t dt_cuda_device_bus_id(int ordinal, char *buf, size_t n) {
  if (n) buf[0] = '\0';
  DT_CUDA_CHECK(cudaDeviceGetPCIBusId(buf, (int)n, ordinal));
  return DT_OK;
}

extern "C" dt_status_t dt_cuda_mem_used(int ordinal, double *used) {
  size_t freeb = 0, total = 0;
  *used = 0;
  DT_CUDA_CHECK(cudaSetDevice(ordinal));
  DT_CUDA_CHECK(cudaMemGetInfo(&freeb, &total));
  *used = (double)(total - freeb);
  return DT_OK;
}

/* The shared library a symbol came from, "" if unknown. */
static const char *lib_of(const void *sym) {
  Dl_info info;
  return dladdr(sym, &info) && info.dli_fname ? info.dli_fname : "";
}

static void print_devices(FILE *out) {
  int n = dt_cuda_device_count();
  if (n == 0) fprintf(out, "gpu: none usable (%s)\n", device_error);
  for (int i = 0; i < n; i++) {
    cudaDeviceProp p;
    char bus[32] = "";
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      fprintf(out, "gpu %d: cudaGetDeviceProperties failed\n", i);
      continue;
    }
    cudaDeviceGetPCIBusId(bus, sizeof bus, i);
    fprintf(out, "gpu %d: %s, sm_%d%d, %d SMs, %.1f GiB, bus %s\n", i, p.name, p.major, p.minor, p.multiProcessorCount,
            (double)p.totalGlobalMem / (1 << 30), bus);
  }
}

extern "C" void dt_cuda_print_versions(FILE *out) {
  int rt = 0, drv = 0, cb[3] = {0, 0, 0}, nc = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  cublasGetProperty(MAJOR_VERSION, &cb[0]);
  cublasGetProperty(MINOR_VERSION, &cb[1]);
  cublasGetProperty(PATCH_LEVEL, &cb[2]);
  ncclGetVersion(&nc);
  fprintf(out, "cuda: runtime %d.%d (built against %d.%d), driver %d.%d %s\n", rt / 1000, rt % 1000 / 10,
          CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, drv / 1000, drv % 1000 / 10,
          lib_of((const void *)cudaRuntimeGetVersion));
  fprintf(out, "cublas: %d.%d.%d (built against %d.%d.%d) %s\n", cb[0], cb[1], cb[2], CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR,
          CUBLAS_VER_PATCH, lib_of((const void *)cublasGetProperty));
  fprintf(out, "nccl: %d.%d.%d (built against %d.%d.%d) %s\n", nc / 10000, nc / 100 % 100, nc % 100, NCCL_MAJOR,
          NCCL_MINOR, NCCL_PATCH, lib_of((const void *)ncclGetVersion));
  print_devices(out);
  cudaGetLastError();
}

/* ---- state -------------------------------------------------------------------------------- */

/* Activations for capacity (B, T): the same tensors and carving as gpt2.c's acts_t.
 * src/plan.c dt_plan_gpu_activation_floats mirrors carve() below for `dtrain plan` in builds
 * without CUDA; tests/test_plan.c checks the two agree (dt_cuda_activation_floats). */
typedef struct {
  float *encoded;
  float *ln1, *ln1_mean, *ln1_rstd;
  float *qkv, *atty, *att, *residual2;
  float *ln2, *ln2_mean, *ln2_rstd;
  float *fch, *fch_gelu, *residual3;
  float *lnf, *lnf_mean, *lnf_rstd;
  float *logits, *losses, *lse;
  float *dres, *dtmp, *dqkv, *dfch, *datt, *dlogits;
} cu_acts_t;

typedef struct {
  cudaStream_t compute, comm;
  cudaEvent_t *group_ev; /* L+2: gradient group g final on the compute stream */
  cudaEvent_t comm_ev;   /* the comm stream's work so far (joined before grads are read/reset) */
  cublasHandle_t blas;
  int device;
  float *arena; /* activations, device */
  cu_acts_t a;
  int *inputs, *targets;     /* device (B,T) */
  int *order, *h_order, *h_count; /* embedding backward's token buckets (embed_buckets.h): device and */
  dt_embed_bucket_t *buckets, *h_buckets; /* host order (B*T), host counts (V+1), buckets (<= B*T) */
  int nb;                    /* buckets of the last forward with targets */
  float *h_losses;           /* host (B,T) */
  double *partial, *h_partial; /* device and host DT_CUDA_SUMSQ_BLOCKS */
  size_t bt, btc, attn;
  int B, T, have_fwd, have_targets;
} cu_impl_t;

static cu_impl_t *impl(dt_backend_t *be) { return (cu_impl_t *)be->impl; }

/* Attention probabilities (B, NH, T, T) per layer: the GPU path keeps the full matrix for now
 * (the CPU backend keeps only the row logsumexp); a fused attention kernel is the next step. */
static size_t cu_attn_floats(int B, int T, int NH) { return (size_t)B * NH * T * T; }

static size_t carve(cu_acts_t *a, float *base, const dt_dims_t *d, int B, int T) {
  size_t off = 0, L = d->L, bt = (size_t)B * T, C = d->C, attn = cu_attn_floats(B, T, d->NH);
#define TAKE(field, n)                                         \
  do {                                                         \
    a->field = base ? base + off : NULL;                       \
    off += ((size_t)(n) + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN; \
  } while (0)
  TAKE(encoded, bt * C);
  TAKE(ln1, L * bt * C);
  TAKE(ln1_mean, L * bt);
  TAKE(ln1_rstd, L * bt);
  TAKE(qkv, L * bt * 3 * C);
  TAKE(atty, L * bt * C);
  TAKE(att, L * attn);
  TAKE(residual2, L * bt * C);
  TAKE(ln2, L * bt * C);
  TAKE(ln2_mean, L * bt);
  TAKE(ln2_rstd, L * bt);
  TAKE(fch, L * bt * 4 * C);
  TAKE(fch_gelu, L * bt * 4 * C);
  TAKE(residual3, L * bt * C);
  TAKE(lnf, bt * C);
  TAKE(lnf_mean, bt);
  TAKE(lnf_rstd, bt);
  TAKE(logits, bt * d->Vp);
  TAKE(losses, bt);
  TAKE(lse, bt);
  TAKE(dres, bt * C);
  TAKE(dtmp, bt * C);
  TAKE(dqkv, bt * 3 * C);
  TAKE(dfch, bt * 4 * C);
  TAKE(datt, attn);
  TAKE(dlogits, bt * d->Vp);
#undef TAKE
  return off;
}

extern "C" size_t dt_cuda_activation_floats(const dt_dims_t *d, int B, int T) {
  cu_acts_t a;
  return carve(&a, NULL, d, B, T);
}

static void cu_free(dt_backend_t *be) {
  cu_impl_t *im = impl(be);
  if (im) {
    if (im->device >= 0) cudaSetDevice(im->device);
    if (im->blas) cublasDestroy(im->blas);
    if (im->group_ev)
      for (int g = 0; g < be->lay->d.L + 2; g++)
        if (im->group_ev[g]) cudaEventDestroy(im->group_ev[g]);
    free(im->group_ev);
    if (im->comm_ev) cudaEventDestroy(im->comm_ev);
    if (im->compute) cudaStreamDestroy(im->compute);
    if (im->comm) cudaStreamDestroy(im->comm);
    cudaFree(im->arena);
    cudaFree(im->inputs);
    cudaFree(im->targets);
    cudaFree(im->partial);
    cudaFree(im->order);
    cudaFree(im->buckets);
    free(im->h_order);
    free(im->h_count);
    free(im->h_buckets);
    free(im->h_losses);
    free(im->h_partial);
    free(im);
  }
  if (be->wparams != be->params) cudaFree(be->wparams);
  cudaFree(be->params);
  cudaFree(be->grads);
  cudaFree(be->m);
  cudaFree(be->v);
  be->params = be->grads = be->m = be->v = be->wparams = NULL;
  be->impl = NULL;
  be->comm_stream = NULL;
}

/* Zeroed on the compute stream (not with cudaMemset: the legacy default stream is not ordered
 * with a non-blocking stream, so a kernel could read the memory before the zeros land). */
static dt_status_t alloc_zero(void **p, size_t bytes, cudaStream_t s) {
  DT_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 64));
  DT_CUDA_CHECK(cudaMemsetAsync(*p, 0, bytes ? bytes : 64, s));
  return DT_OK;
}

static dt_status_t init_all(dt_backend_t *be, cu_impl_t *im) {
  const dt_layout_t *lay = be->lay;
  size_t n = lay->n_params * sizeof(float), bt = (size_t)be->B * be->T;
  DT_CUDA_CHECK(cudaSetDevice(im->device));
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&im->compute, cudaStreamNonBlocking));
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&im->comm, cudaStreamNonBlocking));
  im->group_ev = (cudaEvent_t *)calloc((size_t)lay->d.L + 2, sizeof(cudaEvent_t));
  if (!im->group_ev) return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory");
  for (int g = 0; g < lay->d.L + 2; g++)
    DT_CUDA_CHECK(cudaEventCreateWithFlags(&im->group_ev[g], cudaEventDisableTiming));
  DT_CUDA_CHECK(cudaEventCreateWithFlags(&im->comm_ev, cudaEventDisableTiming));
  DT_CUBLAS_CHECK(cublasCreate(&im->blas));
  DT_CUBLAS_CHECK(cublasSetStream(im->blas, im->compute));
  cudaStream_t s = im->compute;
  DT_TRY(alloc_zero((void **)&be->params, n, s));
  DT_TRY(alloc_zero((void **)&be->grads, n, s));
  DT_TRY(alloc_zero((void **)&be->m, n, s));
  DT_TRY(alloc_zero((void **)&be->v, n, s));
  size_t nact = dt_cuda_activation_floats(&lay->d, be->B, be->T);
  DT_TRY(alloc_zero((void **)&im->arena, nact * sizeof(float), s));
  carve(&im->a, im->arena, &lay->d, be->B, be->T);
  DT_TRY(alloc_zero((void **)&im->inputs, bt * sizeof(int), s));
  DT_TRY(alloc_zero((void **)&im->targets, bt * sizeof(int), s));
  DT_TRY(alloc_zero((void **)&im->order, bt * sizeof(int), s));
  DT_TRY(alloc_zero((void **)&im->buckets, bt * sizeof(dt_embed_bucket_t), s));
  DT_TRY(alloc_zero((void **)&im->partial, DT_CUDA_SUMSQ_BLOCKS * sizeof(double), s));
  im->h_losses = (float *)calloc(bt, sizeof(float));
  im->h_partial = (double *)calloc(DT_CUDA_SUMSQ_BLOCKS, sizeof(double));
  im->h_order = (int *)calloc(bt, sizeof(int));
  im->h_count = (int *)calloc((size_t)lay->d.V + 1, sizeof(int));
  im->h_buckets = (dt_embed_bucket_t *)calloc(bt, sizeof(dt_embed_bucket_t));
  if (!im->h_losses || !im->h_partial || !im->h_order || !im->h_count || !im->h_buckets)
    return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory");
  DT_CUDA_CHECK(cudaStreamSynchronize(s)); /* the arenas are zero before anyone (the host, NCCL) touches them */
  im->bt = bt;
  im->btc = bt * lay->d.C;
  im->attn = cu_attn_floats(be->B, be->T, lay->d.NH);
  be->comm_stream = im->comm;
  be->wparams = be->params;
  be->precision = DT_PREC_FP32;
  be->loss_scale = 1.0f;
  return DT_OK;
}

/* bf16/fp16: a device working copy of the parameters, rounded from the master in forward. */
static dt_status_t cu_set_precision(dt_backend_t *be, dt_precision_t p) {
  if (!dt_precision_name(p)) return DT_ERR(DT_ERR_ARG, "cuda backend: unknown precision %d", (int)p);
  if (p != DT_PREC_FP32 && be->wparams == be->params) {
    DT_CUDA_CHECK(cudaSetDevice(impl(be)->device));
    float *w = NULL;
    DT_TRY(alloc_zero((void **)&w, be->lay->n_params * sizeof(float), impl(be)->compute));
    be->wparams = w;
  }
  be->precision = (int)p;
  return DT_OK;
}

/* be->device (set by the caller before init; < 0 = device 0) chooses the GPU. */
static dt_status_t cu_init(dt_backend_t *be, const dt_layout_t *lay, int B, int T, int threads) {
  int device = be->device < 0 ? 0 : be->device;
  if (be->opt_hi > be->opt_lo) /* ZeRO shards of the optimizer state: CPU backend only, so far */
    return DT_ERR(DT_ERR_UNSUPPORTED, "cuda backend: parallel.zero > 0 is not implemented for CUDA yet (use system.backend=cpu)");
  memset(be, 0, sizeof *be);
  be->ops = &dt_backend_cuda;
  be->lay = lay;
  be->B = B;
  be->T = T;
  be->threads = threads;
  be->device = device;
  if (lay->tp > 1)
    return DT_ERR(DT_ERR_UNSUPPORTED, "cuda backend: parallel.tp = %d: tensor parallelism is implemented on the cpu "
                  "backend only (system.backend = cpu)", lay->tp);
  if (B < 1 || T < 1 || T > lay->d.T)
    return DT_ERR(DT_ERR_ARG, "cuda backend: bad micro-batch B=%d T=%d (model T=%d)", B, T, lay->d.T);
  cu_impl_t *im = (cu_impl_t *)calloc(1, sizeof *im);
  if (!im) return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory");
  im->device = device;
  be->impl = im;
  dt_status_t st = init_all(be, im);
  if (st != DT_OK) cu_free(be);
  return st;
}

/* ---- matmuls ------------------------------------------------------------------------------ */

/* C = alpha op(A) op(B) + beta C on ROW-major matrices, like cblas_sgemm(CblasRowMajor, ...),
 * through dt_cuda_gemm_rowmajor (cuda_launch.h, tested on the CPU against a column-major
 * reference): operands and M/N swapped, flags kept. */
static cublasOperation_t op(int t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

static dt_status_t gemm_rm(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  dt_cuda_gemm_t g = dt_cuda_gemm_rowmajor(ta, tb, M, N, K);
  DT_CUBLAS_CHECK(cublasSgemm(h, op(g.op_first), op(g.op_second), g.m, g.n, g.k, &alpha, B, ldb, A, lda, &beta, C, ldc));
  return DT_OK;
}

/* The same over `batch` problems at fixed strides (elements) between consecutive A, B, C. */
static dt_status_t gemm_rm_batched(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                                   const float *A, int lda, long long sA, const float *B, int ldb, long long sB,
                                   float beta, float *C, int ldc, long long sC, int batch) {
  dt_cuda_gemm_t g = dt_cuda_gemm_rowmajor(ta, tb, M, N, K);
  DT_CUBLAS_CHECK(cublasSgemmStridedBatched(h, op(g.op_first), op(g.op_second), g.m, g.n, g.k, &alpha, B, ldb, sB, A,
                                            lda, sA, &beta, C, ldc, sC, batch));
  return DT_OK;
}

/* Weights in two layouts, as on the CPU (ops_cpu.h): the lm_head's wte (OC, C) like nn.Linear
 * (matmul_*), the blocks' (C, OC) like Hugging Face's Conv1D (conv1d_*). */

/* out (N,OC) = inp (N,C) W^T + bias with W (OC,C), or inp W + bias with W (C,OC) (w_in_out) */
static dt_status_t linear_forward(cu_impl_t *im, float *out, const float *inp, const float *w, bool w_in_out,
                                  const float *bias, int N, int C, int OC) {
  DT_TRY(gemm_rm(im->blas, false, !w_in_out, N, OC, C, 1.0f, inp, C, w, w_in_out ? OC : C, 0.0f, out, OC));
  if (bias) DT_TRY(dt_cu_add_bias(out, bias, N, OC, im->compute));
  return DT_OK;
}

/* W (OC,C): dinp (N,C) = dout W, dweight (OC,C) += dout^T inp; W (C,OC) (w_in_out): dinp = dout W^T,
 * dweight (C,OC) += inp^T dout; dbias (OC) += sum_N dout */
static dt_status_t linear_backward(cu_impl_t *im, float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *w, bool w_in_out, int N, int C, int OC) {
  if (dinp) DT_TRY(gemm_rm(im->blas, false, w_in_out, N, C, OC, 1.0f, dout, OC, w, w_in_out ? OC : C, 0.0f, dinp, C));
  if (w_in_out) DT_TRY(gemm_rm(im->blas, true, false, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC));
  else DT_TRY(gemm_rm(im->blas, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C));
  if (dbias) DT_TRY(dt_cu_col_sum(dbias, dout, N, OC, im->compute));
  return DT_OK;
}

static dt_status_t matmul_forward(cu_impl_t *im, float *out, const float *inp, const float *w, const float *bias, int N,
                                  int C, int OC) {
  return linear_forward(im, out, inp, w, false, bias, N, C, OC);
}
static dt_status_t matmul_backward(cu_impl_t *im, float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *w, int N, int C, int OC) {
  return linear_backward(im, dinp, dweight, dbias, dout, inp, w, false, N, C, OC);
}
static dt_status_t conv1d_forward(cu_impl_t *im, float *out, const float *inp, const float *w, const float *bias, int N,
                                  int C, int OC) {
  return linear_forward(im, out, inp, w, true, bias, N, C, OC);
}
static dt_status_t conv1d_backward(cu_impl_t *im, float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *w, int N, int C, int OC) {
  return linear_backward(im, dinp, dweight, dbias, dout, inp, w, true, N, C, OC);
}

/* ---- attention (ops_cpu.c's dt_attention_forward/backward with per-b strided batches over heads) */

static dt_status_t attention_forward(cu_impl_t *im, float *out, float *att, const float *qkv, int B, int T, int C,
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

static dt_status_t attention_backward(cu_impl_t *im, float *dqkv, float *scratch, const float *dout,
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

/* ---- forward / backward ------------------------------------------------------------------- */

/* An activation or activation gradient just written: round it to the storage precision (no-op
 * in fp32). The same points as gpt2.c. */
#define STORE(x, n) DT_TRY(dt_cu_round_copy((x), (x), (size_t)(n), be->precision, s))

/* Parameter views read by forward/backward: the working copy (the master itself in fp32). */
static const float *P(const dt_backend_t *be, int l, int which) {
  return be->wparams + dt_layout_block(be->lay, l, which)->offset;
}
static float *G(const dt_backend_t *be, int l, int which) { return be->grads + dt_layout_block(be->lay, l, which)->offset; }

static dt_status_t cu_forward(dt_backend_t *be, const int *inputs, const int *targets, int B, int T, float *loss) {
  cu_impl_t *im = impl(be);
  cu_acts_t *a = &im->a;
  const dt_layout_t *lay = be->lay;
  const int L = lay->d.L, C = lay->d.C, NH = lay->d.NH, V = lay->d.V, Vp = lay->d.Vp, N = B * T;
  cudaStream_t s = im->compute;
  if (B < 1 || T < 1 || B > be->B || T > be->T || (size_t)N > im->bt)
    return DT_ERR(DT_ERR_ARG, "cuda backend: forward with B=%d T=%d exceeds the capacity B=%d T=%d", B, T, be->B,
                  be->T);
  for (int i = 0; i < N; i++) {
    if (inputs[i] < 0 || inputs[i] >= V)
      return DT_ERR(DT_ERR_DATA, "cuda backend: input token %d at position %d is outside [0, %d)", inputs[i], i, V);
    if (targets && (targets[i] < 0 || targets[i] >= V))
      return DT_ERR(DT_ERR_DATA, "cuda backend: target token %d at position %d is outside [0, %d)", targets[i], i, V);
  }
  DT_CUDA_CHECK(cudaSetDevice(im->device));
  DT_CUDA_CHECK(cudaMemcpyAsync(im->inputs, inputs, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
  if (targets) DT_CUDA_CHECK(cudaMemcpyAsync(im->targets, targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
  im->B = B;
  im->T = T;
  im->have_fwd = 1;
  im->have_targets = targets != NULL;
  if (targets) { /* the embedding backward's token buckets, while the inputs are on the host */
    im->nb = dt_embed_buckets(inputs, N, V, im->h_count, im->h_order, im->h_buckets);
    DT_CUDA_CHECK(cudaMemcpyAsync(im->order, im->h_order, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    DT_CUDA_CHECK(cudaMemcpyAsync(im->buckets, im->h_buckets, (size_t)im->nb * sizeof(dt_embed_bucket_t),
                                  cudaMemcpyHostToDevice, s));
  }

  if (be->wparams != be->params)
    DT_TRY(dt_cu_round_copy(be->wparams, be->params, lay->n_params, be->precision, s));
  const float *wte = be->wparams + lay->tensors[0].offset, *wpe = be->wparams + lay->tensors[1].offset;
  DT_TRY(dt_cu_encoder_forward(a->encoded, im->inputs, wte, wpe, B, T, C, s));
  STORE(a->encoded, (size_t)N * C);
  const float *x = a->encoded;
  for (int l = 0; l < L; l++) {
    size_t o = l * im->btc, os = l * im->bt;
    float *ln1 = a->ln1 + o, *qkv = a->qkv + 3 * o, *atty = a->atty + o, *att = a->att + l * im->attn;
    float *res2 = a->residual2 + o, *ln2 = a->ln2 + o, *fch = a->fch + 4 * o, *fchg = a->fch_gelu + 4 * o;
    float *res3 = a->residual3 + o;
    DT_TRY(dt_cu_layernorm_forward(ln1, a->ln1_mean + os, a->ln1_rstd + os, x, P(be, l, DT_LN1W), P(be, l, DT_LN1B),
                                   N, C, s));
    STORE(ln1, (size_t)N * C);
    DT_TRY(conv1d_forward(im, qkv, ln1, P(be, l, DT_QKVW), P(be, l, DT_QKVB), N, C, 3 * C));
    STORE(qkv, (size_t)N * 3 * C);
    DT_TRY(attention_forward(im, atty, att, qkv, B, T, C, NH));
    STORE(atty, (size_t)N * C);
    DT_TRY(conv1d_forward(im, res2, atty, P(be, l, DT_ATTPROJW), P(be, l, DT_ATTPROJB), N, C, C));
    DT_TRY(dt_cu_residual_forward(res2, res2, x, (size_t)N * C, s));
    STORE(res2, (size_t)N * C); /* once after the residual add, like the CPU's fused matmul + residual */
    DT_TRY(dt_cu_layernorm_forward(ln2, a->ln2_mean + os, a->ln2_rstd + os, res2, P(be, l, DT_LN2W), P(be, l, DT_LN2B),
                                   N, C, s));
    STORE(ln2, (size_t)N * C);
    DT_TRY(conv1d_forward(im, fch, ln2, P(be, l, DT_FCW), P(be, l, DT_FCB), N, C, 4 * C));
    STORE(fch, (size_t)N * 4 * C);
    DT_TRY(dt_cu_gelu_forward(fchg, fch, (size_t)N * 4 * C, s));
    STORE(fchg, (size_t)N * 4 * C);
    DT_TRY(conv1d_forward(im, res3, fchg, P(be, l, DT_FCPROJW), P(be, l, DT_FCPROJB), N, 4 * C, C));
    DT_TRY(dt_cu_residual_forward(res3, res3, res2, (size_t)N * C, s));
    STORE(res3, (size_t)N * C);
    x = res3;
  }
  const dt_tensor_t *lnfw = &lay->tensors[lay->n_tensors - 2], *lnfb = &lay->tensors[lay->n_tensors - 1];
  DT_TRY(dt_cu_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, be->wparams + lnfw->offset,
                                 be->wparams + lnfb->offset, N, C, s));
  STORE(a->lnf, (size_t)N * C);
  DT_TRY(matmul_forward(im, a->logits, a->lnf, wte, NULL, N, C, Vp)); /* tied lm_head */
  STORE(a->logits, (size_t)N * Vp);
  if (targets) {
    DT_TRY(dt_cu_crossentropy_forward(a->losses, a->lse, a->logits, im->targets, N, V, Vp, s));
    DT_CUDA_CHECK(cudaMemcpyAsync(im->h_losses, a->losses, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, s));
    DT_CUDA_CHECK(cudaStreamSynchronize(s));
    double total = 0.0; /* mean in double, as the CPU backend */
    for (int i = 0; i < N; i++) total += im->h_losses[i];
    if (loss) *loss = (float)(total / N);
  }
  return DT_OK;
}

/* Gradient group g is final on the compute stream: the comm stream waits for it, then ready(). */
static dt_status_t group_ready(dt_backend_t *be, int g, dt_grad_ready_fn ready, void *ctx) {
  cu_impl_t *im = impl(be);
  if (!ready) return DT_OK;
  DT_CUDA_CHECK(cudaEventRecord(im->group_ev[g], im->compute));
  DT_CUDA_CHECK(cudaStreamWaitEvent(im->comm, im->group_ev[g], 0));
  ready(ctx, be->lay->layer_begin[g], be->lay->layer_begin[g + 1]);
  return DT_OK;
}

static dt_status_t cu_backward(dt_backend_t *be, int accum, dt_grad_ready_fn ready, void *ctx) {
  cu_impl_t *im = impl(be);
  cu_acts_t *a = &im->a;
  const dt_layout_t *lay = be->lay;
  const int L = lay->d.L, C = lay->d.C, NH = lay->d.NH, V = lay->d.V, Vp = lay->d.Vp;
  const int B = im->B, T = im->T, N = B * T;
  cudaStream_t s = im->compute;
  if (!im->have_fwd || !im->have_targets)
    return DT_ERR(DT_ERR_ARG, "cuda backend: backward needs a preceding forward with targets");
  if (accum < 1) return DT_ERR(DT_ERR_ARG, "cuda backend: backward with accum=%d (must be >= 1)", accum);
  DT_CUDA_CHECK(cudaSetDevice(im->device));

  const float *wte = be->wparams + lay->tensors[0].offset;
  float *dwte = be->grads + lay->tensors[0].offset, *dwpe = be->grads + lay->tensors[1].offset;
  const dt_tensor_t *lnfw = &lay->tensors[lay->n_tensors - 2], *lnfb = &lay->tensors[lay->n_tensors - 1];
  const float *x_last = L > 0 ? a->residual3 + (size_t)(L - 1) * im->btc : a->encoded;

  DT_TRY(dt_cu_crossentropy_backward(a->dlogits, a->logits, a->lse, im->targets, be->loss_scale / ((float)N * accum), N,
                                     V, Vp, s));
  STORE(a->dlogits, (size_t)N * Vp);
  DT_TRY(matmul_backward(im, a->dtmp, dwte, NULL, a->dlogits, a->lnf, wte, N, C, Vp));
  STORE(a->dtmp, (size_t)N * C);
  DT_TRY(dt_cu_layernorm_backward(a->dres, be->grads + lnfw->offset, be->grads + lnfb->offset, NULL, a->dtmp, x_last,
                                  be->wparams + lnfw->offset, a->lnf_mean, a->lnf_rstd, N, C, s));
  STORE(a->dres, (size_t)N * C);
  DT_TRY(group_ready(be, L + 1, ready, ctx));

  for (int l = L - 1; l >= 0; l--) {
    size_t o = l * im->btc, os = l * im->bt;
    const float *x = l > 0 ? a->residual3 + o - im->btc : a->encoded;
    const float *ln1 = a->ln1 + o, *qkv = a->qkv + 3 * o, *atty = a->atty + o, *att = a->att + l * im->attn;
    const float *res2 = a->residual2 + o, *ln2 = a->ln2 + o, *fch = a->fch + 4 * o, *fchg = a->fch_gelu + 4 * o;
    DT_TRY(conv1d_backward(im, a->dfch, G(be, l, DT_FCPROJW), G(be, l, DT_FCPROJB), a->dres, fchg,
                           P(be, l, DT_FCPROJW), N, 4 * C, C));
    STORE(a->dfch, (size_t)N * 4 * C);
    DT_TRY(dt_cu_gelu_backward(a->dfch, fch, a->dfch, (size_t)N * 4 * C, s));
    STORE(a->dfch, (size_t)N * 4 * C);
    DT_TRY(conv1d_backward(im, a->dtmp, G(be, l, DT_FCW), G(be, l, DT_FCB), a->dfch, ln2, P(be, l, DT_FCW), N, C,
                           4 * C));
    STORE(a->dtmp, (size_t)N * C);
    DT_TRY(dt_cu_layernorm_backward(a->dres, G(be, l, DT_LN2W), G(be, l, DT_LN2B), a->dres, a->dtmp, res2,
                                    P(be, l, DT_LN2W), a->ln2_mean + os, a->ln2_rstd + os, N, C, s));
    STORE(a->dres, (size_t)N * C);
    DT_TRY(conv1d_backward(im, a->dtmp, G(be, l, DT_ATTPROJW), G(be, l, DT_ATTPROJB), a->dres, atty,
                           P(be, l, DT_ATTPROJW), N, C, C));
    STORE(a->dtmp, (size_t)N * C);
    DT_TRY(attention_backward(im, a->dqkv, a->datt, a->dtmp, qkv, att, B, T, C, NH));
    STORE(a->dqkv, (size_t)N * 3 * C);
    DT_TRY(conv1d_backward(im, a->dtmp, G(be, l, DT_QKVW), G(be, l, DT_QKVB), a->dqkv, ln1, P(be, l, DT_QKVW), N, C,
                           3 * C));
    STORE(a->dtmp, (size_t)N * C);
    DT_TRY(dt_cu_layernorm_backward(a->dres, G(be, l, DT_LN1W), G(be, l, DT_LN1B), a->dres, a->dtmp, x,
                                    P(be, l, DT_LN1W), a->ln1_mean + os, a->ln1_rstd + os, N, C, s));
    STORE(a->dres, (size_t)N * C);
    DT_TRY(group_ready(be, 1 + l, ready, ctx));
  }
  DT_TRY(dt_cu_encoder_backward(dwte, dwpe, a->dres, im->order, im->buckets, im->nb, B, T, C, s));
  DT_TRY(group_ready(be, 0, ready, ctx));
  return DT_OK;
}

/* Order the compute stream after everything enqueued on the comm stream so far (all-reduces of
 * the gradients), before gradients are read or reset. */
static dt_status_t join_comm(cu_impl_t *im) {
  DT_CUDA_CHECK(cudaSetDevice(im->device));
  DT_CUDA_CHECK(cudaEventRecord(im->comm_ev, im->comm));
  DT_CUDA_CHECK(cudaStreamWaitEvent(im->compute, im->comm_ev, 0));
  return DT_OK;
}

static dt_status_t cu_zero_grad(dt_backend_t *be) {
  cu_impl_t *im = impl(be);
  DT_TRY(join_comm(im));
  DT_CUDA_CHECK(cudaMemsetAsync(be->grads, 0, be->lay->n_params * sizeof(float), im->compute));
  return DT_OK;
}

static dt_status_t cu_grad_sumsq(dt_backend_t *be, double *out) {
  cu_impl_t *im = impl(be);
  DT_TRY(join_comm(im));
  DT_TRY(dt_cu_sumsq_partial(im->partial, be->grads, be->lay->n_params, im->compute));
  DT_CUDA_CHECK(cudaMemcpyAsync(im->h_partial, im->partial, DT_CUDA_SUMSQ_BLOCKS * sizeof(double),
                                cudaMemcpyDeviceToHost, im->compute));
  DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
  double s = 0.0;
  for (int i = 0; i < DT_CUDA_SUMSQ_BLOCKS; i++) s += im->h_partial[i];
  *out = s;
  return DT_OK;
}

static dt_status_t cu_adamw(dt_backend_t *be, const dt_adamw_args_t *ar) {
  if (ar->t < 1) return DT_ERR(DT_ERR_ARG, "cuda backend: adamw step t=%d (must be >= 1)", ar->t);
  cu_impl_t *im = impl(be);
  const dt_layout_t *lay = be->lay;
  DT_TRY(join_comm(im));
  float bc1 = (float)(1.0 - pow(ar->beta1, ar->t)), bc2 = (float)(1.0 - pow(ar->beta2, ar->t));
  for (int i = 0; i < lay->n_tensors; i++) { /* per tensor: weight decay only where decay = 1 */
    const dt_tensor_t *t = &lay->tensors[i];
    size_t n = (size_t)t->rows * t->cols;
    DT_TRY(dt_cu_adamw(be->params + t->offset, be->grads + t->offset, be->m + t->offset, be->v + t->offset, n, ar->lr,
                       ar->beta1, ar->beta2, ar->eps, t->decay ? ar->weight_decay : 0.0f, bc1, bc2, ar->grad_scale,
                       im->compute));
  }
  return DT_OK;
}

/* ---- copies ------------------------------------------------------------------------------- */

/* Copies go on the compute stream after the comm stream's work (join_comm), and the host waits
 * for them: a plain cudaMemcpy runs on the legacy default stream, which is not ordered with the
 * non-blocking compute stream (a host-to-device copy could land after the next kernel read). */
static dt_status_t cu_copy_to_host(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, float *dst) {
  cu_impl_t *im = impl(be);
  DT_TRY(dt_backend_check_range(be, buf, off, count));
  DT_TRY(join_comm(im));
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, dt_backend_buf(be, buf) + off, count * sizeof(float), cudaMemcpyDeviceToHost,
                                im->compute));
  DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
  return DT_OK;
}

static dt_status_t cu_copy_from_host(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, const float *src) {
  cu_impl_t *im = impl(be);
  DT_TRY(dt_backend_check_range(be, buf, off, count));
  DT_TRY(join_comm(im));
  DT_CUDA_CHECK(cudaMemcpyAsync(dt_backend_buf(be, buf) + off, src, count * sizeof(float), cudaMemcpyHostToDevice,
                                im->compute));
  DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
  return DT_OK;
}

/* Everything queued on both streams has finished. */
static dt_status_t cu_synchronize(dt_backend_t *be) {
  cu_impl_t *im = impl(be);
  DT_TRY(join_comm(im));
  DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
  return DT_OK;
}

static dt_status_t cu_logits_to_host(dt_backend_t *be, float *dst) {
  cu_impl_t *im = impl(be);
  if (!im->have_fwd) return DT_ERR(DT_ERR_ARG, "cuda backend: logits requested before any forward");
  DT_CUDA_CHECK(cudaSetDevice(im->device));
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, im->a.logits, (size_t)im->B * im->T * be->lay->d.Vp * sizeof(float),
                                cudaMemcpyDeviceToHost, im->compute));
  DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
  return DT_OK;
}

static const char *cu_engine(const dt_backend_t *be) {
  (void)be;
  return "cuBLAS";
}

/* No kernel table yet (issue #21 step 2): the model (gpt2.c) calls forward/backward above. */
extern "C" const dt_backend_ops_t dt_backend_cuda = {
    "cuda",          NULL /* kernels */, 0 /* host_memory */, 1 /* async */,
    cu_init,         cu_free,         cu_engine,       cu_forward,        cu_backward,       cu_logits_to_host,
    cu_zero_grad,    cu_grad_sumsq,   cu_adamw,        cu_copy_to_host,   cu_copy_from_host, cu_set_precision,
    cu_synchronize,
};
