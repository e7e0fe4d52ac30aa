/* GPT-2 layer kernels on the CPU (OpenMP + CBLAS): <layer>_forward / <layer>_backward pairs in
 * llm.c's argument order (outputs, inputs/weights, dims). Used by the CPU backend, by the tests and
 * as the CPU twins of the CUDA kernels.
 *
 * Dimensions: B batch, T sequence, C channels, NH heads, hs = C/NH, V vocab, Vp padded vocab,
 * N = B*T rows. All tensors are row-major float. Weights: the lm_head's (wte) is (out, in) like
 * torch.nn.Linear (dt_matmul_*); the blocks' are (in, out) like Hugging Face's Conv1D (dt_conv1d_*).
 *
 * Gradient convention (everywhere in dtrain):
 *   - PARAMETER gradients ACCUMULATE: dweight += ..., dbias += ... (grad accumulation over micro-steps).
 *   - ACTIVATION gradients are WRITTEN: dinp = ... (previous contents ignored). Where a residual
 *     stream adds a second contribution, it is passed explicitly (layernorm_backward's `dresid`).
 *   - Elementwise backward kernels allow dinp == dout (in place) where stated. */
#ifndef DT_OPS_CPU_H
#define DT_OPS_CPU_H

#include <stddef.h>

/* Hot kernels are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time (GCC
 * function multiversioning), so one binary runs everywhere and vectorizes where it can. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define DT_CPU_VEC __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DT_CPU_VEC
#endif

/* C = alpha op(A) op(B) + beta C, row-major, cblas semantics (op = transpose if trans*). Every
 * matmul of the CPU backend goes through this one function (the engine is chosen inside). */
void dt_cpu_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc);
/* One line naming the engine behind dt_cpu_sgemm (library, kernel, threads), for logs. */
const char *dt_cpu_gemm_engine(void);

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
 * out (B,T,C), inp (B,T) int, wte (Vp,C), wpe (T,C) */
void dt_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
/* dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:] */
void dt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);

/* y = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + 1e-5), var biased (over C).
 * out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C) */
void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int N, int C);
/* With n = (x - mean) * rstd, g = weight * dout:
 *   dinp = dresid + rstd * (g - mean_C(g) - n * mean_C(g * n))   (dresid may be NULL; dinp == dresid allowed)
 *   dweight += sum_N dout * n;  dbias += sum_N dout */
void dt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dresid, const float *dout,
                           const float *inp, const float *weight, const float *mean, const float *rstd, int N,
                           int C);

/* nn.Linear layout: out = inp W^T + bias.  out (N,OC), inp (N,C), weight (OC,C), bias (OC) or NULL. */
void dt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
/* dinp = dout W (if dinp != NULL); dweight += dout^T inp; dbias += sum_N dout (if dbias != NULL).
 * dinp (N,C), dweight (OC,C), dbias (OC), dout (N,OC) */
void dt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC);
/* Conv1D layout (Hugging Face GPT-2, and the checkpoint's): out = inp W + bias, weight (C,OC). */
void dt_conv1d_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
/* out = resid + inp W + bias (residual add fused; out may alias resid).  resid (N,OC) */
void dt_conv1d_residual_forward(float *out, const float *inp, const float *weight, const float *bias,
                                const float *resid, int N, int C, int OC);
/* dinp = dout W^T (if dinp != NULL); dweight += inp^T dout; dbias += sum_N dout (if dbias != NULL).
 * dinp (N,C), dweight (C,OC), dbias (OC), dout (N,OC) */
void dt_conv1d_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC);

/* Causal multi-head self-attention (no projections), flash-attention style: no (T,T) matrix is
 * kept. qkv (B,T,3C) holds q | k | v, head h at channels h*hs..h*hs+hs-1 of each part.
 *   s[t,j] = q_t . k_j / sqrt(hs) for j <= t;  lse[b,h,t] = log sum_{j<=t} exp(s[t,j])
 *   out[b,t,h*hs:] = sum_{j<=t} exp(s[t,j] - lse) v_j
 * Work is split over (b, h) across `nthr` OpenMP threads; each thread takes query blocks of
 * DT_ATT_QB rows against all keys up to the block's end (two dt_cpu_sgemm calls per block) in its
 * slice of `scratch`, which holds dt_attention_scratch_floats(T, nthr) floats.
 * out (B,T,C), lse (B,NH,T) (kept for backward). */
#define DT_ATT_QB 64
size_t dt_attention_scratch_floats(int T, int nthr);
void dt_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int B, int T, int C, int NH,
                          int nthr);
/* dqkv = d(out)/d(qkv)^T dout (written), recomputing the probabilities p = exp(s - lse) per block:
 *   dp = dout_h v^T;  ds[t,j] = p[t,j] (dp[t,j] - sum_k p[t,k] dp[t,k]);
 *   dq = ds k / sqrt(hs);  dk = ds^T q / sqrt(hs);  dv = p^T dout_h */
void dt_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *lse,
                           int B, int T, int C, int NH, int nthr);
/* Decoding with a key/value cache (dtrain generate): qkv (B,n,3C) holds q | k | v of positions
 * [pos, pos + n) of each sequence; their k and v are stored into kc and vc (B,Tmax,C) at those
 * positions, then out (B,n,C) is the causal attention of each new query at position pos + i over
 * cache positions [0, pos + i], with the formulas of dt_attention_forward (nothing kept for
 * backward). scratch: nthr * Tmax floats. */
void dt_attention_decode(float *out, float *kc, float *vc, float *scratch, const float *qkv, int B, int pos, int n,
                         int Tmax, int C, int NH, int nthr);

/* out = gelu_tanh(inp) (kmath.h dt_gelu); out, inp (n) */
void dt_gelu_forward(float *out, const float *inp, size_t n);
/* dinp = gelu'(inp) * dout; dinp == dout allowed */
void dt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* out = a + b; out may alias a or b. (n) */
void dt_residual_forward(float *out, const float *a, const float *b, size_t n);

/* Softmax over the first V of Vp columns + cross-entropy.
 * losses[i] = lse_i - logits[i, targets[i]], lse_i = log sum_{v<V} exp(logits[i,v]).
 * logits (N,Vp), targets (N), losses (N), lse (N). Padded columns v >= V are ignored.
 * Returns the mean loss (accumulated in double). */
double dt_crossentropy_forward(float *losses, float *lse, const float *logits, const int *targets, int N, int V,
                               int Vp);
/* dlogits[i,v] = (softmax_v - [v == target_i]) * dloss for v < V, 0 for v >= V (written).
 * dlogits (N,Vp); dloss is d(total loss)/d(losses[i]), e.g. 1/(B*T*accum). */
void dt_crossentropy_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                              float dloss, int N, int V, int Vp);

#endif
