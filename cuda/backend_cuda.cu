/* The CUDA backend (dt_backend_cuda): memory and kernels for the model (gpt2.c, GPT-2 written
 * once) on one device: the arenas (params, grads, m, v) and what the model allocates are device
 * memory; the kernel table is filled from cuBLAS (every matmul, attention's batched products) and
 * cuda/kernels.cu (the rest, their per-element math shared with the CPU twins in kmath.h).
 * Everything is allocated in init or by the model's init. Work runs on a compute stream; at each
 * final gradient group the model calls grads_ready, which records an event and makes the
 * communication stream (be->comm_stream) wait on it, so NCCL all-reduces enqueued there overlap
 * the rest of backward. Mixed precision (bf16/fp16) rounds with the same kmath.h functions, in
 * fp32 storage (checked on an H200: docs/gpu-runs.md). Also dt_cuda_device_count and friends. */
#include <math.h>
#include <stdio.h>
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
#include "backend_cuda_int.h"
#include "attention_cudnn.h"
#include "convert16.h"

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
  dt_cu_cudnn_print_version(out);
  print_devices(out);
  cudaGetLastError();
}

static void cu_free(dt_backend_t *be) {
  cu_impl_t *im = impl(be);
  if (im) {
    if (im->device >= 0) cudaSetDevice(im->device);
    if (im->blas) cublasDestroy(im->blas);
    dt_cu_cudnn_free(im);
    dt_cudnn_att_close(im->catt);
    if (im->group_ev)
      for (int g = 0; g < be->lay->d.L + 2; g++)
        if (im->group_ev[g]) cudaEventDestroy(im->group_ev[g]);
    free(im->group_ev);
    if (im->comm_ev) cudaEventDestroy(im->comm_ev);
    if (im->compute) cudaStreamDestroy(im->compute);
    if (im->comm) cudaStreamDestroy(im->comm);
    cudaFree(im->partial);
    cudaFree(im->colscr);
    cudaFree(im->acc);
    dt_cu_lt_close(im);
    cudaFree(im->seg_ends);
    cudaFree(im->seg_kinds);
    cudaFree(im->order);
    cudaFree(im->buckets);
    free(im->h_order);
    free(im->h_count);
    free(im->h_buckets);
    free(im->h_partial);
    if (im->sp_params) { /* not cudaMalloc's */
      dt_cu_sparse_free(im->sp_params);
      be->params = NULL;
    }
    if (im->sp_grads) {
      dt_cu_sparse_free(im->sp_grads);
      be->grads = NULL;
    }
    free(im);
  }
  if (be->wparams != be->params) cudaFree(be->wparams);
  cudaFree(be->params);
  cudaFree(be->grads);
  cudaFree(be->m);
  cudaFree(be->v);
  be->params = be->grads = be->m = be->v = NULL;
  be->wparams = NULL;
  be->impl = NULL;
  be->stream = be->comm_stream = NULL;
}

/* Zeroed on the compute stream (not with cudaMemset: the legacy default stream is not ordered
 * with a non-blocking stream, so a kernel could read the memory before the zeros land). */
static dt_status_t alloc_zero(void **p, size_t bytes, cudaStream_t s) {
  DT_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 64));
  DT_CUDA_CHECK(cudaMemsetAsync(*p, 0, bytes ? bytes : 64, s));
  return DT_OK;
}

dt_status_t dt_cu_colscr_reserve(cu_impl_t *im, size_t cols) {
  if (cols <= im->colscr_cols) return DT_OK;
  DT_CUDA_CHECK(cudaStreamSynchronize(im->compute)); /* nothing queued still reads the old one */
  cudaFree(im->colscr);
  im->colscr = NULL;
  im->colscr_cols = 0;
  DT_TRY(alloc_zero((void **)&im->colscr, dt_cu_col_scratch_floats(cols) * sizeof(float), im->compute));
  im->colscr_cols = cols;
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
  if (be->tf32) DT_CUBLAS_CHECK(cublasSetMathMode(im->blas, CUBLAS_TF32_TENSOR_OP_MATH));
  cudaStream_t s = im->compute;
  if (be->sparse & DT_SPARSE_PARAMS) DT_TRY(dt_cu_sparse_create(im->device, n, s, &im->sp_params, (void **)&be->params));
  else DT_TRY(alloc_zero((void **)&be->params, n, s));
  if (be->sparse & DT_SPARSE_GRADS) DT_TRY(dt_cu_sparse_create(im->device, n, s, &im->sp_grads, (void **)&be->grads));
  else DT_TRY(alloc_zero((void **)&be->grads, n, s));
  size_t nopt = dt_backend_opt_floats(be) * sizeof(float); /* m[i]: arena offset opt_lo + i */
  DT_TRY(alloc_zero((void **)&be->m, nopt, s));
  DT_TRY(alloc_zero((void **)&be->v, nopt, s));
  DT_TRY(alloc_zero((void **)&im->order, bt * sizeof(int), s));
  DT_TRY(alloc_zero((void **)&im->buckets, bt * sizeof(dt_embed_bucket_t), s));
  DT_TRY(alloc_zero((void **)&im->partial, DT_CUDA_SUMSQ_BLOCKS * sizeof(double), s));
  im->colscr_cols = 4 * (size_t)lay->d.C; /* the widest bias (the MLP's 4C), and layernorm's 2C */
  DT_TRY(alloc_zero((void **)&im->colscr, dt_cu_col_scratch_floats(im->colscr_cols) * sizeof(float), s));
  im->h_partial = (double *)calloc(DT_CUDA_SUMSQ_BLOCKS, sizeof(double));
  im->h_order = (int *)calloc(bt, sizeof(int));
  im->h_count = (int *)calloc((size_t)lay->d.V + 1, sizeof(int));
  im->h_buckets = (dt_embed_bucket_t *)calloc(bt, sizeof(dt_embed_bucket_t));
  if (!im->h_partial || !im->h_order || !im->h_count || !im->h_buckets)
    return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory");
  DT_CUDA_CHECK(cudaStreamSynchronize(s)); /* the arenas are zero before anyone (the host, NCCL) touches them */
  be->stream = im->compute;
  be->comm_stream = im->comm;
  be->wparams = be->params;
  be->precision = DT_PREC_FP32;
  be->loss_scale = 1.0f;
  return be->cudnn_conv ? dt_cu_cudnn_init(be) : DT_OK;
}

/* system.attention = cudnn: cuDNN's fused attention for this precision's 16-bit inputs */
static dt_status_t open_cudnn_att(dt_backend_t *be, dt_precision_t p) {
  cu_impl_t *im = impl(be);
  if (!be->cudnn_att) return DT_OK;
  if (p == DT_PREC_FP32)
    return DT_ERR(DT_ERR_CONFIG, "system.attention = cudnn: cuDNN's fused attention takes 16-bit inputs; "
                                 "train.precision = fp32 needs system.attention = matmul or flash");
  dt_cudnn_att_close(im->catt); /* a state for another precision's type */
  im->catt = NULL;
  return dt_cudnn_att_open(&im->catt, im->compute, p == DT_PREC_FP16); /* the emulation: refused */
}

/* bf16/fp16: a device working copy of the parameters, rounded from the master in forward, in the
 * activation storage: 16 bits with be->store16 and an attention that takes them (flash, cuDNN),
 * with the fp32 accumulator of the biased products (the widest: the MLP's 4C); else floats. */
static dt_status_t cu_set_precision(dt_backend_t *be, dt_precision_t p) {
  cu_impl_t *im = impl(be);
  if (!dt_precision_name(p)) return DT_ERR(DT_ERR_ARG, "cuda backend: unknown precision %d", (int)p);
  const int bytes = be->store16 && dt_cuda_store16_built(p, be->flash) ? 2 : 4;
  DT_CUDA_CHECK(cudaSetDevice(im->device));
  if (be->wparams != be->params && (p == DT_PREC_FP32 || bytes != be->act_bytes)) { /* another storage than before */
    DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
    cudaFree(be->wparams);
    be->wparams = be->params;
  }
  be->act_bytes = bytes;
  if (p != DT_PREC_FP32 && be->wparams == be->params)
    DT_TRY(alloc_zero((void **)&be->wparams, be->lay->n_params * (size_t)bytes, im->compute));
  if (bytes == 2 && !im->acc) {
    im->acc_n = (size_t)be->B * be->T * 4 * be->lay->d.C;
    DT_TRY(alloc_zero((void **)&im->acc, im->acc_n * sizeof(float), im->compute));
  }
  if (bytes == 2) DT_TRY(dt_cu_lt_open(im)); /* the products' bias epilogue */
  im->st16 = p == DT_PREC_FP16 ? CUDA_R_16F : CUDA_R_16BF;
  be->precision = (int)p;
  DT_TRY(open_cudnn_att(be, p));
  impl(be)->lin_16 = p != DT_PREC_FP32;
  impl(be)->lin_compute = p == DT_PREC_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F;
  return DT_OK;
}

/* be->device (set by the caller before init; < 0 = device 0) chooses the GPU, be->tf32 the math
 * mode of every matmul, be->flash the attention kernels. */
static dt_status_t cu_init(dt_backend_t *be, const dt_layout_t *lay, int B, int T, int threads) {
  int device = be->device < 0 ? 0 : be->device, tf32 = be->tf32, flash = be->flash, cudnn = be->cudnn_conv;
  int catt = be->cudnn_att;
  int sparse = be->sparse;
  size_t opt_lo = be->opt_lo, opt_hi = be->opt_hi; /* ZeRO: m, v of this shard only */
  if (opt_hi > lay->n_params || opt_lo > opt_hi)
    return DT_ERR(DT_ERR_ARG, "cuda backend: optimizer range [%zu, %zu) outside the arena of %zu", opt_lo, opt_hi,
                  lay->n_params);
  memset(be, 0, sizeof *be);
  be->ops = &dt_backend_cuda;
  be->k = dt_backend_cuda.kernels;
  be->lay = lay;
  be->B = B;
  be->T = T;
  be->threads = threads;
  be->device = device;
  be->tf32 = tf32;
  be->flash = flash || catt;
  be->cudnn_att = catt;
  be->cudnn_conv = cudnn;
  be->sparse = sparse;
  be->opt_lo = opt_lo;
  be->opt_hi = opt_hi;
  be->act_bytes = 4; /* float storage rounded to the precision until step 7d (docs/architecture.md) */
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

/* ---- the kernel table (backend.h dt_kernels_t) the model runs on -------------------------- *
 * Every entry queues its work on the compute stream. Tensor parallelism's vocab-parallel pieces
 * (rows [v0, v0 + nrows) of the embedding, the split cross-entropy, the bias + residual
 * epilogue after the row-parallel all-reduce) are cuda/kernels_tp.cu; the model all-reduces
 * between them over the tp group's NCCL communicator on the same stream. */

static cudaStream_t S(dt_backend_t *be) { return impl(be)->compute; }
/* The precision argument of kernels that store at the run's precision (dt_cu_store) */
static int SP(const dt_backend_t *be) { return dt_cu_store(be, be->precision); }
/* Float storage (act_bytes 4) as the matmul attention's buffers take it */
static float *F(dt_act_t *x) { return (float *)x; }
static const float *CF(const dt_act_t *x) { return (const float *)x; }

static dt_status_t k_alloc(dt_backend_t *be, void **p, size_t bytes) {
  DT_CUDA_CHECK(cudaSetDevice(impl(be)->device));
  return alloc_zero(p, bytes, S(be));
}
static void k_release(dt_backend_t *be, void *p) {
  (void)be;
  cudaFree(p);
}
static dt_status_t k_copy(dt_backend_t *be, void *dst, const void *src, size_t bytes) {
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S(be)));
  return DT_OK;
}
/* From pageable host memory the source is read before the call returns (CUDA's rule). */
static dt_status_t k_upload(dt_backend_t *be, void *dst, const void *src_host, size_t bytes) {
  DT_CUDA_CHECK(cudaSetDevice(impl(be)->device));
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, S(be)));
  return DT_OK;
}
static dt_status_t k_download(dt_backend_t *be, void *dst_host, const void *src, size_t bytes) {
  DT_CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, S(be)));
  DT_CUDA_CHECK(cudaStreamSynchronize(S(be)));
  return DT_OK;
}
/* The comm stream waits for gradient group g, so NCCL work queued there overlaps the rest. */
static dt_status_t k_grads_ready(dt_backend_t *be, int g) {
  cu_impl_t *im = impl(be);
  DT_CUDA_CHECK(cudaEventRecord(im->group_ev[g], im->compute));
  DT_CUDA_CHECK(cudaStreamWaitEvent(im->comm, im->group_ev[g], 0));
  return DT_OK;
}
static void k_attention_floats(const dt_backend_t *be, int B, int T, int NH, size_t *state, size_t *scratch) {
  dt_cuda_attention_floats(B, T, NH, be->flash, state, scratch);
}

static dt_status_t k_encoder_forward(dt_backend_t *be, dt_act_t *out, const int *inp, const dt_act_t *wte,
                                     const dt_act_t *wpe, int B, int T, int C, int v0, int nrows) {
  if (wpe && v0 == 0 && nrows >= be->lay->d.V)
    return dt_cu_encoder_forward(out, inp, wte, wpe, B, T, C, dt_cu_store(be, DT_PREC_FP32), S(be));
  DT_TRY(dt_cu_embed_rows(out, inp, wte, B * T, C, v0, nrows, dt_cu_store(be, DT_PREC_FP32), S(be))); /* a shard */
  return wpe ? dt_cu_add_bias(out, wpe, B, T * C, dt_cu_store(be, DT_PREC_FP32), S(be)) : DT_OK;
}
/* The token buckets from the host copy of the inputs, then the deterministic backward. */
static dt_status_t k_encoder_backward(dt_backend_t *be, float *dwte, float *dwpe, const dt_act_t *dout, const int *inp,
                                      const int *inp_host, int B, int T, int C, int v0, int nrows) {
  (void)inp;
  cu_impl_t *im = impl(be);
  const int N = B * T, V = be->lay->d.V;
  int nb = dt_embed_buckets(inp_host, N, V, im->h_count, im->h_order, im->h_buckets);
  if (v0 != 0 || nrows < V) { /* a vocabulary shard: the buckets of its rows, renumbered */
    int k = 0;
    for (int b = 0; b < nb; b++)
      if (im->h_buckets[b].token >= v0 && im->h_buckets[b].token < v0 + nrows) {
        im->h_buckets[k] = im->h_buckets[b];
        im->h_buckets[k++].token -= v0;
      }
    nb = k;
  }
  DT_CUDA_CHECK(cudaMemcpyAsync(im->order, im->h_order, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, S(be)));
  DT_CUDA_CHECK(cudaMemcpyAsync(im->buckets, im->h_buckets, (size_t)nb * sizeof(dt_embed_bucket_t),
                                cudaMemcpyHostToDevice, S(be)));
  return dt_cu_encoder_backward(dwte, dwpe, dout, im->order, im->buckets, nb, B, T, C, dt_cu_store(be, DT_PREC_FP32),
                                S(be));
}
/* float storage: acc may be out (the kernel reads each element before it writes it) */
static dt_status_t k_epilogue(dt_backend_t *be, dt_act_t *out, const float *acc, const dt_act_t *bias,
                              const dt_act_t *resid, int N, int OC) {
  return dt_cu_epilogue(out, NULL, acc, bias, resid, N, OC, SP(be), S(be));
}
static dt_status_t k_widen(dt_backend_t *be, float *dst, const dt_act_t *src, size_t n) {
  if ((const void *)dst == src || n == 0) return DT_OK;
  if (be->act_bytes == 4) {
    DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, S(be)));
    return DT_OK;
  }
  return dt_cu_from16(dst, src, n, be->precision == DT_PREC_FP16, S(be));
}
static dt_status_t k_layernorm_forward(dt_backend_t *be, dt_act_t *out, float *mean, float *rstd, const dt_act_t *inp,
                                       const dt_act_t *weight, const dt_act_t *bias, int N, int C) {
  return dt_cu_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, SP(be), S(be));
}
static dt_status_t k_layernorm_backward(dt_backend_t *be, dt_act_t *dinp, float *dweight, float *dbias,
                                        const dt_act_t *dresid, const dt_act_t *dout, const dt_act_t *inp,
                                        const dt_act_t *weight, const float *mean, const float *rstd, int N, int C) {
  return dt_cu_layernorm_backward(dinp, dweight, dbias, dresid, dout, inp, weight, mean, rstd, N, C, impl(be)->colscr,
                                  SP(be), S(be));
}
/* out = [resid +] (inp W + bias): the residual added after the product, one rounding later */
static dt_status_t k_linear_forward(dt_backend_t *be, dt_act_t *out, const dt_act_t *inp, const dt_act_t *w,
                                    int w_in_out, const dt_act_t *bias, const dt_act_t *resid, int N, int C, int OC) {
  return dt_cu_linear_forward(be, out, inp, w, w_in_out != 0, bias, resid, N, C, OC);
}
static dt_status_t k_linear_backward(dt_backend_t *be, dt_act_t *dinp, float *dweight, float *dbias,
                                     const dt_act_t *dout, const dt_act_t *inp, const dt_act_t *w, int w_in_out, int N,
                                     int C, int OC) {
  return dt_cu_linear_backward(be, dinp, dweight, dbias, dout, inp, w, w_in_out != 0, N, C, OC);
}
static dt_status_t k_linear_forward32(dt_backend_t *be, float *out, const dt_act_t *inp, const dt_act_t *w,
                                      int w_in_out, int N, int C, int OC) {
  return dt_cu_linear_forward32(be, out, inp, w, w_in_out != 0, N, C, OC);
}
static dt_status_t k_linear_backward32(dt_backend_t *be, float *dinp, float *dweight, float *dbias,
                                       const dt_act_t *dout, const dt_act_t *inp, const dt_act_t *w, int w_in_out,
                                       int N, int C, int OC) {
  return dt_cu_linear_backward32(be, dinp, dweight, dbias, dout, inp, w, w_in_out != 0, N, C, OC);
}
/* state: this block's probabilities (B,NH,T,T), with flash its rows' log-sum-exp (B,NH,T); scratch: their
 * gradient, with flash the rows' <dout, out> (backward only) */
static dt_status_t k_attention_forward(dt_backend_t *be, dt_act_t *out, float *state, float *scratch,
                                       const dt_act_t *qkv, int B, int T, int C, int NH) {
  (void)scratch;
  if (impl(be)->catt) /* 16-bit values */
    return dt_cudnn_att_forward(impl(be)->catt, out, state, qkv, be->act_bytes == 2, B, T, C, NH);
  if (be->flash) return dt_cu_flash_forward(out, state, qkv, B, T, C, NH, SP(be), S(be));
  if (be->act_bytes != 4) return DT_ERR(DT_ERR_UNSUPPORTED, "cuda backend: matmul attention on 16-bit storage");
  DT_TRY(dt_cu_matmul_attention_forward(impl(be), F(out), state, CF(qkv), B, T, C, NH)); /* then a rounding pass */
  return dt_cu_round_copy(out, CF(out), (size_t)B * T * C, be->precision, S(be));
}
static dt_status_t k_attention_backward(dt_backend_t *be, dt_act_t *dqkv, float *scratch, const dt_act_t *dout,
                                        const dt_act_t *out, const dt_act_t *qkv, const float *state, int B, int T,
                                        int C, int NH) {
  if (impl(be)->catt)
    return dt_cudnn_att_backward(impl(be)->catt, dqkv, dout, out, qkv, state, be->act_bytes == 2, B, T, C, NH);
  if (be->flash) return dt_cu_flash_backward(dqkv, scratch, dout, qkv, state, B, T, C, NH, SP(be), S(be));
  if (be->act_bytes != 4) return DT_ERR(DT_ERR_UNSUPPORTED, "cuda backend: matmul attention on 16-bit storage");
  DT_TRY(dt_cu_matmul_attention_backward(impl(be), F(dqkv), scratch, CF(dout), CF(qkv), state, B, T, C, NH));
  return dt_cu_round_copy(dqkv, CF(dqkv), (size_t)B * T * 3 * C, be->precision, S(be));
}
static dt_status_t k_attention_decode(dt_backend_t *be, dt_act_t *out, dt_act_t *kc, dt_act_t *vc, const dt_act_t *qkv,
                                      int B, int pos, int n, int Tmax, int C, int NH) {
  return dt_cu_attention_decode(out, kc, vc, qkv, B, pos, n, Tmax, C, NH, SP(be), S(be));
}
static dt_status_t k_gelu_forward(dt_backend_t *be, dt_act_t *out, const dt_act_t *inp, size_t n) {
  return dt_cu_gelu_forward(out, inp, n, SP(be), S(be));
}
static dt_status_t k_gelu_backward(dt_backend_t *be, dt_act_t *dinp, const dt_act_t *inp, const dt_act_t *dout,
                                   size_t n) {
  return dt_cu_gelu_backward(dinp, inp, dout, n, SP(be), S(be));
}
/* the mean loss added on the device (dt_cu_crossentropy_forward): no host wait */
static dt_status_t k_crossentropy_forward(dt_backend_t *be, float *losses, float *lse, const dt_act_t *logits,
                                          const int *targets, int N, int V, int Vp, double *loss_sum) {
  return dt_cu_crossentropy_forward(losses, lse, logits, targets, N, V, Vp, loss_sum, dt_cu_store(be, DT_PREC_FP32),
                                    S(be));
}
static dt_status_t k_xent_max(dt_backend_t *be, float *mx, const dt_act_t *logits, int N, int nv, int Vp) {
  return dt_cu_xent_max(mx, logits, N, nv, Vp, dt_cu_store(be, DT_PREC_FP32), S(be));
}
static dt_status_t k_xent_sumexp(dt_backend_t *be, double *sum, float *tl, const dt_act_t *logits, const float *mx,
                                 const int *targets, int N, int nv, int Vp, int v0) {
  return dt_cu_xent_sumexp(sum, tl, logits, mx, targets, N, nv, Vp, v0, dt_cu_store(be, DT_PREC_FP32), S(be));
}
static dt_status_t k_xent_finish(dt_backend_t *be, float *lse_mx, float *losses_tl, const double *sum, int N,
                                 double *loss_sum) {
  return dt_cu_xent_finish(lse_mx, losses_tl, sum, N, loss_sum, S(be));
}
/* in place: the kernel reads each logit before it writes its gradient at the same index */
static dt_status_t k_crossentropy_backward(dt_backend_t *be, dt_act_t *logits, const float *lse, const int *targets,
                                           float dloss, int N, int nv, int Vp, int v0) {
  return dt_cu_crossentropy_backward(logits, logits, lse, targets, dloss, N, nv, Vp, v0, SP(be), S(be));
}
/* 16-bit storage holds rounded values by construction: nothing to round */
static dt_status_t k_round(dt_backend_t *be, dt_act_t *x, size_t n) {
  return be->act_bytes == 2 ? DT_OK : dt_cu_round_copy(x, CF(x), n, be->precision, S(be));
}
static dt_status_t k_round_copy(dt_backend_t *be, dt_act_t *dst, const float *src, size_t n) {
  return dt_cu_round_copy(dst, src, n, SP(be), S(be));
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

/* *out_host = sum of x[i]^2 over (n), after the comm stream's work on the gradients so far */
static dt_status_t k_sumsq(dt_backend_t *be, const float *x, size_t n, double *out_host) {
  cu_impl_t *im = impl(be);
  DT_TRY(join_comm(im));
  DT_TRY(dt_cu_sumsq_partial(im->partial, x, n, im->compute));
  DT_CUDA_CHECK(cudaMemcpyAsync(im->h_partial, im->partial, DT_CUDA_SUMSQ_BLOCKS * sizeof(double),
                                cudaMemcpyDeviceToHost, im->compute));
  DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
  double s = 0.0;
  for (int i = 0; i < DT_CUDA_SUMSQ_BLOCKS; i++) s += im->h_partial[i];
  *out_host = s;
  return DT_OK;
}

static dt_status_t k_divide(dt_backend_t *be, float *x, size_t n, float d) { return dt_cu_divide(x, n, d, S(be)); }

/* over the optimizer range (ZeRO: this rank's shard) */
static dt_status_t cu_grad_sumsq(dt_backend_t *be, double *out) {
  size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0;
  return k_sumsq(be, be->grads + lo, dt_backend_opt_floats(be), out);
}

/* The optimizer range [lo, hi) cut into dt_cu_adamw_multi's segments, once (the range is fixed at
 * init): each tensor's part inside it (weight decay where decay = 1; outside the shard, or a
 * tensor of another pipeline stage: none), the padding between them skipped. */
static dt_status_t adamw_segments(dt_backend_t *be, size_t lo, size_t hi) {
  cu_impl_t *im = impl(be);
  const dt_layout_t *lay = be->lay;
  if (im->seg_ends || hi <= lo) return DT_OK;
  const size_t cap = 2 * (size_t)lay->n_tensors + 1;
  size_t *ends = (size_t *)malloc(cap * sizeof *ends), at = lo;
  unsigned char *kinds = (unsigned char *)malloc(cap);
  int n = 0;
  if (!ends || !kinds) {
    free(ends);
    free(kinds);
    return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory (adamw segments)");
  }
  dt_status_t st = DT_OK;
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    size_t a = t->offset > lo ? t->offset : lo, z = t->offset + (size_t)t->rows * t->cols;
    if (z > hi) z = hi;
    if (a >= z) continue;
    if (a < at) {
      st = DT_ERR(DT_ERR_INTERNAL, "cuda backend: tensor %d overlaps another or is out of arena order", i);
      break;
    }
    if (a > at) ends[n] = a, kinds[n++] = DT_CU_SEG_SKIP;
    ends[n] = z, kinds[n++] = t->decay ? DT_CU_SEG_DECAY : DT_CU_SEG_NODECAY;
    at = z;
  }
  if (at < hi) ends[n] = hi, kinds[n++] = DT_CU_SEG_SKIP; /* at most 2 per tensor + 1: cap */
  /* on the compute stream, which the update runs on (a plain cudaMemcpy goes on the legacy stream,
   * not ordered with it), then waited for: the host tables are freed below */
  if (st == DT_OK && cudaMalloc((void **)&im->seg_ends, (size_t)n * sizeof *ends) == cudaSuccess &&
      cudaMalloc((void **)&im->seg_kinds, (size_t)n) == cudaSuccess &&
      cudaMemcpyAsync(im->seg_ends, ends, (size_t)n * sizeof *ends, cudaMemcpyHostToDevice, im->compute) ==
          cudaSuccess &&
      cudaMemcpyAsync(im->seg_kinds, kinds, (size_t)n, cudaMemcpyHostToDevice, im->compute) == cudaSuccess &&
      cudaStreamSynchronize(im->compute) == cudaSuccess)
    im->nseg = n;
  else if (st == DT_OK)
    st = DT_ERR(DT_ERR_CUDA, "cuda backend: adamw segments: %s", cudaGetErrorString(cudaGetLastError()));
  free(ends);
  free(kinds);
  return st;
}

/* Every tensor of the optimizer range in one launch (dt_cu_adamw_multi) */
static dt_status_t cu_adamw(dt_backend_t *be, const dt_adamw_args_t *ar) {
  if (ar->t < 1) return DT_ERR(DT_ERR_ARG, "cuda backend: adamw step t=%d (must be >= 1)", ar->t);
  cu_impl_t *im = impl(be);
  DT_TRY(join_comm(im));
  float bc1 = (float)(1.0 - pow(ar->beta1, ar->t)), bc2 = (float)(1.0 - pow(ar->beta2, ar->t));
  size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0, hi = lo + dt_backend_opt_floats(be);
  DT_TRY(adamw_segments(be, lo, hi));
  return dt_cu_adamw_multi(be->params, be->grads, be->m, be->v, lo, hi - lo, im->seg_ends, im->seg_kinds, im->nseg,
                           ar->lr, ar->beta1, ar->beta2, ar->eps, ar->weight_decay, bc1, bc2, ar->grad_scale,
                           im->compute);
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
  if (buf == DT_BUF_PARAMS || buf == DT_BUF_GRADS) /* a sparse arena's dropped part has no memory to write */
    DT_TRY(dt_cu_arena_populate(be, dt_backend_buf(be, buf) + off, count));
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

static const char *cu_engine(const dt_backend_t *be) {
  static char s[200];
  const cu_impl_t *im = (const cu_impl_t *)be->impl;
  const int lin16 = im && im->lin_16;
  const char *dnn = im ? dt_cu_cudnn_name(im) : NULL;
  const char *att = !be->flash ? "" : be->cudnn_att ? "; attention: " : "; attention: flash kernels";
  const char *catt = im && im->catt ? dt_cudnn_att_name(im->catt) : "";
  snprintf(s, sizeof s, "cuBLAS%s%s%s%s%s%s%s", be->tf32 ? ", TF32 tensor cores" : "", lin16 ? ", layer matmuls on " : "",
           !lin16 ? "" : be->precision == DT_PREC_BF16 ? "bf16 tensor cores" : "fp16 tensor cores", att,
           be->cudnn_att ? catt : "", dnn ? "; convolutions: " : "", dnn ? dnn : "");
  return s;
}

/* Positional (C++17 has no designated initializers): the order of backend.h's dt_kernels_t. */
static const dt_kernels_t cuda_kernels = {
    k_alloc,           k_release,           k_copy,           k_upload,          k_download,
    k_grads_ready,     k_attention_floats,  k_encoder_forward, k_encoder_backward, k_epilogue,
    k_widen,           k_layernorm_forward, k_layernorm_backward, k_linear_forward, k_linear_backward,
    k_linear_forward32, k_linear_backward32,
    k_attention_forward, k_attention_backward, k_attention_decode, k_gelu_forward, k_gelu_backward, k_crossentropy_forward,
    k_xent_max,        k_xent_sumexp,       k_xent_finish,    k_crossentropy_backward, k_round,
    k_round_copy,      k_sumsq,             dt_cu_arena_clear, dt_cu_arena_populate, k_divide,
};

extern "C" const dt_backend_ops_t dt_backend_cuda = {
    "cuda",          &cuda_kernels,   0 /* host_memory */, 1 /* async */,
    cu_init,         cu_free,         cu_engine,       cu_zero_grad,      cu_grad_sumsq,     cu_adamw,
    cu_copy_to_host, cu_copy_from_host, cu_set_precision, cu_synchronize,
    &dt_cuda_cnn_kernels,
};
