/* The CUDA backend (dt_backend_cuda): memory and kernels for the model (gpt2.c, GPT-2 written
 * once) on one device: the arenas (params, grads, m, v) and what the model allocates are device
 * memory; the kernel table is filled from cuBLAS (every matmul, attention's batched products) and
 * cuda/kernels.cu (the rest, their per-element math shared with the CPU twins in kmath.h); its
 * wrappers are cuda/backend_cuda_table.cu.
 * Everything is allocated in init or by the model's init. Work runs on a compute stream; at each
 * final gradient group the model calls grads_ready, which records an event and makes the
 * communication stream (be->comm_stream) wait on it, so NCCL all-reduces enqueued there overlap
 * the rest of backward. Mixed precision (bf16/fp16) rounds with the same kmath.h functions, in
 * fp32 storage (checked on an H200: docs/gpu-runs.md) or, with system.store16 and an attention
 * that takes it, in 16-bit storage (set_precision; not yet run on a GPU). Also
 * dt_cuda_device_count and friends. */
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
    if (im->sp_wparams) { /* not cudaMalloc's */
      dt_cu_sparse_free(im->sp_wparams);
      be->wparams = NULL;
    }
    if (im->sp_params) {
      dt_cu_sparse_free(im->sp_params);
      if (be->wparams == be->params) be->wparams = NULL;
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
dt_status_t dt_cu_alloc_zero(void **p, size_t bytes, cudaStream_t s) {
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
  DT_TRY(dt_cu_alloc_zero((void **)&im->colscr, dt_cu_col_scratch_floats(cols) * sizeof(float), im->compute));
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
  else DT_TRY(dt_cu_alloc_zero((void **)&be->params, n, s));
  if (be->sparse & DT_SPARSE_GRADS) DT_TRY(dt_cu_sparse_create(im->device, n, s, &im->sp_grads, (void **)&be->grads));
  else DT_TRY(dt_cu_alloc_zero((void **)&be->grads, n, s));
  size_t nopt = dt_backend_opt_floats(be) * sizeof(float); /* m[i]: arena offset opt_lo + i */
  DT_TRY(dt_cu_alloc_zero((void **)&be->m, nopt, s));
  DT_TRY(dt_cu_alloc_zero((void **)&be->v, nopt, s));
  DT_TRY(dt_cu_alloc_zero((void **)&im->order, bt * sizeof(int), s));
  DT_TRY(dt_cu_alloc_zero((void **)&im->buckets, bt * sizeof(dt_embed_bucket_t), s));
  DT_TRY(dt_cu_alloc_zero((void **)&im->partial, DT_CUDA_SUMSQ_BLOCKS * sizeof(double), s));
  im->colscr_cols = 4 * (size_t)lay->d.C; /* the widest bias (the MLP's 4C), and layernorm's 2C */
  DT_TRY(dt_cu_alloc_zero((void **)&im->colscr, dt_cu_col_scratch_floats(im->colscr_cols) * sizeof(float), s));
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
  return be->cudnn_conv || be->cudnn_bn || be->cudnn_pool ? dt_cu_cudnn_init(be) : DT_OK;
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
 * with the fp32 accumulator of the biased products (the widest: the MLP's 4C); else floats. Under
 * ZeRO-3 (DT_SPARSE_PARAMS) a sparse arena, as the master: the gathers fill it (zero.h). */
static dt_status_t cu_set_precision(dt_backend_t *be, dt_precision_t p) {
  cu_impl_t *im = impl(be);
  if (!dt_precision_name(p)) return DT_ERR(DT_ERR_ARG, "cuda backend: unknown precision %d", (int)p);
  const int bytes = be->store16 && dt_cuda_store16_built(p, be->flash) ? 2 : 4;
  DT_CUDA_CHECK(cudaSetDevice(im->device));
  if (be->wparams != be->params && (p == DT_PREC_FP32 || bytes != be->act_bytes)) { /* another storage than before */
    DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
    if (im->sp_wparams)
      dt_cu_sparse_free(im->sp_wparams);
    else
      cudaFree(be->wparams);
    im->sp_wparams = NULL;
    be->wparams = be->params;
  }
  be->act_bytes = bytes;
  const size_t wbytes = be->lay->n_params * (size_t)bytes;
  if (p != DT_PREC_FP32 && be->wparams == be->params) { /* ZeRO-3 gathers into it: sparse like the master */
    if (be->sparse & DT_SPARSE_PARAMS)
      DT_TRY(dt_cu_sparse_create(im->device, wbytes, im->compute, &im->sp_wparams, (void **)&be->wparams));
    else
      DT_TRY(dt_cu_alloc_zero((void **)&be->wparams, wbytes, im->compute));
  }
  if (bytes == 2 && !im->acc) {
    im->acc_n = (size_t)be->B * be->T * 4 * be->lay->d.C;
    DT_TRY(dt_cu_alloc_zero((void **)&im->acc, im->acc_n * sizeof(float), im->compute));
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
  int cudnn_bn = be->cudnn_bn, cudnn_pool = be->cudnn_pool;
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
  be->cudnn_bn = cudnn_bn;
  be->cudnn_pool = cudnn_pool;
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

/* Order the compute stream after everything enqueued on the comm stream so far (all-reduces of
 * the gradients), before gradients are read or reset. */
dt_status_t dt_cu_join_comm(cu_impl_t *im) {
  DT_CUDA_CHECK(cudaSetDevice(im->device));
  DT_CUDA_CHECK(cudaEventRecord(im->comm_ev, im->comm));
  DT_CUDA_CHECK(cudaStreamWaitEvent(im->compute, im->comm_ev, 0));
  return DT_OK;
}

static dt_status_t cu_zero_grad(dt_backend_t *be) {
  cu_impl_t *im = impl(be);
  DT_TRY(dt_cu_join_comm(im));
  DT_CUDA_CHECK(cudaMemsetAsync(be->grads, 0, be->lay->n_params * sizeof(float), im->compute));
  return DT_OK;
}

/* over the optimizer range (ZeRO: this rank's shard) */
static dt_status_t cu_grad_sumsq(dt_backend_t *be, double *out) {
  size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0;
  return dt_cuda_kernels.sumsq(be, be->grads + lo, dt_backend_opt_floats(be), out);
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
  DT_TRY(dt_cu_join_comm(im));
  float bc1 = (float)(1.0 - pow(ar->beta1, ar->t)), bc2 = (float)(1.0 - pow(ar->beta2, ar->t));
  size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0, hi = lo + dt_backend_opt_floats(be);
  DT_TRY(adamw_segments(be, lo, hi));
  return dt_cu_adamw_multi(be->params, be->grads, be->m, be->v, lo, hi - lo, im->seg_ends, im->seg_kinds, im->nseg,
                           ar->lr, ar->beta1, ar->beta2, ar->eps, ar->weight_decay, bc1, bc2, ar->grad_scale,
                           im->compute);
}

/* ---- copies ------------------------------------------------------------------------------- */

/* Copies go on the compute stream after the comm stream's work (dt_cu_join_comm), and the host waits
 * for them: a plain cudaMemcpy runs on the legacy default stream, which is not ordered with the
 * non-blocking compute stream (a host-to-device copy could land after the next kernel read). */
static dt_status_t cu_copy_to_host(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, float *dst) {
  cu_impl_t *im = impl(be);
  DT_TRY(dt_backend_check_range(be, buf, off, count));
  DT_TRY(dt_cu_join_comm(im));
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, dt_backend_buf(be, buf) + off, count * sizeof(float), cudaMemcpyDeviceToHost,
                                im->compute));
  DT_CUDA_CHECK(cudaStreamSynchronize(im->compute));
  return DT_OK;
}

static dt_status_t cu_copy_from_host(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, const float *src) {
  cu_impl_t *im = impl(be);
  DT_TRY(dt_backend_check_range(be, buf, off, count));
  DT_TRY(dt_cu_join_comm(im));
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
  DT_TRY(dt_cu_join_comm(im));
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
  const int conv = dnn && be->cudnn_conv, bn = dnn && be->cudnn_bn, pool = dnn && be->cudnn_pool;
  snprintf(s, sizeof s, "cuBLAS%s%s%s%s%s%s%s%s%s%s%s", be->tf32 ? ", TF32 tensor cores" : "",
           lin16 ? ", layer matmuls on " : "",
           !lin16                          ? ""
           : be->precision == DT_PREC_BF16 ? "bf16 tensor cores"
                                           : "fp16 tensor cores",
           att, be->cudnn_att ? catt : "", conv ? "; convolutions: " : "", conv ? dnn : "",
           bn ? "; batch norm in training: " : "", bn ? dnn : "", pool ? "; pooling: " : "", pool ? dnn : "");
  return s;
}

extern "C" const dt_backend_ops_t dt_backend_cuda = {
    "cuda",          &dt_cuda_kernels,   0 /* host_memory */, 1 /* async */,
    cu_init,         cu_free,         cu_engine,       cu_zero_grad,      cu_grad_sumsq,     cu_adamw,
    cu_copy_to_host, cu_copy_from_host, cu_set_precision, cu_synchronize,
    &dt_cuda_cnn_kernels,
};
