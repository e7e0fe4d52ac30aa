/* The CUDA backend's kernel table (backend.h dt_kernels_t), the interface gpt2.c runs on: each
 * entry is a thin wrapper that queues cuda/kernels.cu's, attention.cu's or cuBLAS's work
 * (backend_cuda_gemm.cu) on the compute stream, at the storage precision dt_cu_store gives. The
 * rest of the backend (devices, arenas, precision, optimizer, copies) is backend_cuda.cu. */
#include <stdio.h>

#include <cuda_runtime.h>

#include "dt_build.h" /* DT_HAVE_CUDA */
extern "C" {
#include "backend.h"
}
#include "cuda_check.h"
#include "kernels.h"
#include "backend_cuda_int.h"
#include "attention_cudnn.h"
#include "convert16.h"

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
  return dt_cu_alloc_zero(p, bytes, S(be));
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

/* *out_host = sum of x[i]^2 over (n), after the comm stream's work on the gradients so far */
static dt_status_t k_sumsq(dt_backend_t *be, const float *x, size_t n, double *out_host) {
  cu_impl_t *im = impl(be);
  DT_TRY(dt_cu_join_comm(im));
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

/* Positional (C++17 has no designated initializers): the order of backend.h's dt_kernels_t. */
extern "C" const dt_kernels_t dt_cuda_kernels = {
    k_alloc,           k_release,           k_copy,           k_upload,          k_download,
    k_grads_ready,     k_attention_floats,  k_encoder_forward, k_encoder_backward, k_epilogue,
    k_widen,           k_layernorm_forward, k_layernorm_backward, k_linear_forward, k_linear_backward,
    k_linear_forward32, k_linear_backward32,
    k_attention_forward, k_attention_backward, k_attention_decode, k_gelu_forward, k_gelu_backward,
    k_crossentropy_forward,
    k_xent_max,        k_xent_sumexp,       k_xent_finish,    k_crossentropy_backward, k_round,
    k_round_copy,      k_sumsq,             dt_cu_arena_clear, dt_cu_arena_populate, k_divide,
};
