/* GPT-2 layer kernels on the GPU, the twins of src/backend/ops_cpu.h: same names with dt_cu_ in front,
 * same argument order (outputs, inputs/weights, dims) and the same formulas (read ops_cpu.h for
 * them), plus the stream. All pointers are device pointers. Parameter gradients accumulate (+=),
 * activation gradients are written (=). Matmuls are not here: backend_cuda.cu calls cuBLAS.
 * Every launcher checks the launch and returns DT_ERR_CUDA on failure. Internal (C++). */
#ifndef DT_CU_KERNELS_H
#define DT_CU_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "cuda_launch.h"
#include "embed_buckets.h"
#include "status.h"

/* Activation storage (store.h, issue #22 step 7c): the launchers whose activation arguments are
 * void pointers read and write them as floats (stored rounded to `prec`) or, with DT_STORE16 or'ed
 * into prec, as 16-bit values of prec (bf16 or fp16); the weights' working copy they read (wte,
 * wpe, layernorm weight and bias, the bias) is stored the same way. Statistics, losses and
 * parameter gradients are floats either way. */
#define DT_STORE16 0x100

/* out (B,T,C) = wte[inp] + wpe (rounded to prec);  dwte[inp] += dout, dwpe += sum_b dout, deterministic: the
 * positions of each token in the order the CPU twin adds them, from the token buckets (order (N),
 * buckets (nb)) that dt_embed_buckets built on the host from the same inputs */
dt_status_t dt_cu_encoder_forward(void *out, const int *inp, const void *wte, const void *wpe, int B, int T, int C,
                                  int prec, cudaStream_t s);
dt_status_t dt_cu_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *order,
                                   const dt_embed_bucket_t *buckets, int nb, int B, int T, int C, int prec,
                                   cudaStream_t s);
/* Kernels that store an activation or an activation gradient round it to the storage precision
 * `prec` (precision.h: DT_PREC_FP32 stores as computed) as they write it: the same value as a
 * separate rounding pass after them, without its read and write.
 * out (N,C), mean (N), rstd (N): one warp per row (rows loop past a capped grid, as in every row
 * kernel here); out rounded to prec */
dt_status_t dt_cu_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                                    const void *bias, int N, int C, int prec, cudaStream_t s);
/* dinp = dresid + ...(dresid may be NULL, dinp == dresid allowed), rounded to prec; dweight, dbias
 * += (through scratch of dt_cu_col_scratch_floats(2 * C) floats: column sums below) */
dt_status_t dt_cu_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dresid, const void *dout,
                                     const void *inp, const void *weight, const float *mean, const float *rstd, int N,
                                     int C, float *scratch, int prec, cudaStream_t s);
/* out (N,OC) += bias (OC) broadcast over rows, rounded to prec */
dt_status_t dt_cu_add_bias(void *out, const void *bias, int N, int OC, int prec, cudaStream_t s);
/* A product's epilogue: out (N,OC) = [resid +] (acc + [bias]) rounded once to out's storage (prec);
 * the accumulator is acc32 (float, a product's fp32 result) when not NULL, else acc (out's
 * storage; acc == out: in place, as add_bias and bias_residual); bias, resid may be NULL */
dt_status_t dt_cu_epilogue(void *out, const void *acc, const float *acc32, const void *bias, const void *resid, int N,
                           int OC, int prec, cudaStream_t s);
/* dst (OC) += sum over N rows of src (N,OC, stored as prec says): the rows in DT_CUDA_COL_CHUNKS
 * chunks over the whole GPU, partial sums in scratch (dt_cu_col_scratch_floats(OC) floats), added
 * in a fixed order */
dt_status_t dt_cu_col_sum(float *dst, const void *src, int N, int OC, float *scratch, int prec, cudaStream_t s);
static inline size_t dt_cu_col_scratch_floats(size_t cols) { return (size_t)DT_CUDA_COL_CHUNKS * cols; }
/* causal softmax in place on rows of att (B*NH*T rows of T, row r has t = r % T) */
dt_status_t dt_cu_softmax_causal(float *att, int rows, int T, cudaStream_t s);
/* d (rows of T) = att * (d - <att, d>) on j <= t, 0 above the diagonal */
dt_status_t dt_cu_softmax_causal_backward(float *d, const float *att, int rows, int T, cudaStream_t s);
/* attention.cu: attention that keeps no (T,T) matrix; a group of lanes per row, the head's dims
 * over its lanes (head size at most DT_CU_ATT_HS_MAX), tiles of keys in shared memory.
 * Training (ops_cpu.h dt_attention_forward/backward; system.attention = flash): out (B,T,C) and
 * the row log-sum-exp lse (B,NH,T) from qkv (B,T,3C); backward writes dqkv from dout, qkv and lse,
 * with dsum (B,NH,T) as scratch (the rows' <dout, out>). out and dqkv rounded to prec. */
#define DT_CU_ATT_HS_MAX 256
dt_status_t dt_cu_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int prec,
                                cudaStream_t s);
dt_status_t dt_cu_flash_backward(void *dqkv, float *dsum, const void *dout, const void *qkv, const float *lse, int B,
                                 int T, int C, int NH, int prec, cudaStream_t s);
/* Decoding with a key/value cache (ops_cpu.h dt_attention_decode): k and v of the n new positions
 * of qkv (B,n,3C) into kc, vc (B,Tmax,C) at [pos, pos + n), then out (B,n,C): one warp per (b, h,
 * query) with an online softmax over the cached keys; out rounded to prec. */
dt_status_t dt_cu_attention_decode(void *out, void *kc, void *vc, const void *qkv, int B, int pos, int n, int Tmax,
                                   int C, int NH, int prec, cudaStream_t s);
/* out, dinp rounded to prec */
dt_status_t dt_cu_gelu_forward(void *out, const void *inp, size_t n, int prec, cudaStream_t s);
dt_status_t dt_cu_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, int prec, cudaStream_t s);
/* out = a + b, rounded to prec */
dt_status_t dt_cu_residual_forward(void *out, const void *a, const void *b, size_t n, int prec, cudaStream_t s);
/* losses (N), lse (N) from logits (N,Vp) over the first V columns: one block per row; then, if
 * loss_sum (one device double) is not NULL, dt_cu_loss_mean_add */
dt_status_t dt_cu_crossentropy_forward(float *losses, float *lse, const void *logits, const int *targets, int N,
                                       int V, int Vp, double *loss_sum, int prec, cudaStream_t s);
/* *loss_sum += the mean of losses (N), summed in double in a fixed order (one block), rounded to
 * float: the loss stays on the device until the host asks for it */
dt_status_t dt_cu_loss_mean_add(double *loss_sum, const float *losses, int N, cudaStream_t s);
/* dlogits (N,Vp) written, rounded to prec; padded columns v >= V get 0. The columns are global v0 ..
 * v0 + Vp - 1 (tensor parallelism: a vocabulary shard; else v0 = 0): the target's is column
 * targets - v0. */
dt_status_t dt_cu_crossentropy_backward(void *dlogits, const void *logits, const float *lse, const int *targets,
                                        float dloss, int N, int V, int Vp, int v0, int prec, cudaStream_t s);
/* Tensor parallelism (kernels_tp.cu; twins: backend_cpu.c's k_* of the same names):
 * out (N,C) = wte row inp - v0 where v0 <= inp < v0 + nrows, else 0 (wte holds nrows rows),
 * rounded to prec */
dt_status_t dt_cu_embed_rows(void *out, const int *inp, const void *wte, int N, int C, int v0, int nrows, int prec,
                             cudaStream_t s);
/* out (N,OC) = resid + (out + bias), rounded to prec */
dt_status_t dt_cu_bias_residual(void *out, const void *bias, const void *resid, int N, int OC, int prec,
                                cudaStream_t s);
/* the vocab-parallel cross-entropy (backend.h xent_*): mx[i] = max of the first nv of Vp columns;
 * sum[i] = sum of exp(z - mx[i]) (double), tl[i] = z[targets[i] - v0] if in [0, nv), else 0;
 * then lse = mx + log(sum), losses = lse - tl in place of mx and tl */
dt_status_t dt_cu_xent_max(float *mx, const void *logits, int N, int nv, int Vp, int prec, cudaStream_t s);
dt_status_t dt_cu_xent_sumexp(double *sum, float *tl, const void *logits, const float *mx, const int *targets, int N,
                              int nv, int Vp, int v0, int prec, cudaStream_t s);
dt_status_t dt_cu_xent_finish(float *lse, float *losses, const double *sum, int N, double *loss_sum, cudaStream_t s);
/* dst (n) = src rounded to the storage precision prec (precision.h; dst == src allowed, fp32 in
 * place is a no-op); with DT_STORE16, dst holds 16-bit values (the weights' working copy). The
 * trainer stores nothing in 16 bits on the GPU yet: the float form emulates the storage rounding
 * exactly as the CPU backend does (parity on an H200: docs/gpu-runs.md). */
dt_status_t dt_cu_round_copy(void *dst, const float *src, size_t n, int prec, cudaStream_t s);
/* x (n) = x / d */
dt_status_t dt_cu_divide(float *x, size_t n, float d, cudaStream_t s);
/* one AdamW step over n elements (kmath.h dt_adamw_update) */
dt_status_t dt_cu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                        float eps, float wd, float bc1, float bc2, float gscale, cudaStream_t s);
/* One AdamW step over the optimizer range [lo, lo + n) of the arena, every tensor in one launch
 * (the per-tensor dt_cu_adamw is a launch per tensor): p and g are indexed by arena offset, m and
 * v by offset - lo. The range is cut into nseg segments, segment k ending at offset ends[k]
 * (ascending, ends[nseg - 1] = lo + n), of kind kinds[k]: DT_CU_SEG_DECAY (weight decay wd),
 * DT_CU_SEG_NODECAY (none) or DT_CU_SEG_SKIP (padding between tensors: left as it is). ends and
 * kinds are device memory. Each element's math is dt_cu_adamw's. */
enum { DT_CU_SEG_SKIP = 0, DT_CU_SEG_NODECAY = 1, DT_CU_SEG_DECAY = 2 };
dt_status_t dt_cu_adamw_multi(float *p, const float *g, float *m, float *v, size_t lo, size_t n, const size_t *ends,
                              const unsigned char *kinds, int nseg, float lr, float beta1, float beta2, float eps,
                              float wd, float bc1, float bc2, float gscale, cudaStream_t s);
/* partial[DT_CUDA_SUMSQ_BLOCKS] = per-block double sums of g^2 over (n), a block per 256 elements
 * up to the fixed count (the same partition for the same n: deterministic), unused ones 0; the
 * caller adds them */
dt_status_t dt_cu_sumsq_partial(double *partial, const float *g, size_t n, cudaStream_t s);

#endif
