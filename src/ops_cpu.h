/* GPT-2 layer kernels on the CPU (OpenMP + CBLAS): <layer>_forward / <layer>_backward pairs in
 * llm.c's argument order (outputs, inputs/weights, dims). Used by the CPU backend, by the tests and
 * as the CPU twins of the CUDA kernels.
 *
 * Dimensions: B batch, T sequence, C channels, NH heads, hs = C/NH, V vocab, Vp padded vocab,
 * N = B*T rows. All tensors are row-major float; weights are (out, in) like torch.nn.Linear.
 *
 * Gradient convention (everywhere in dtrain):
 *   - PARAMETER gradients ACCUMULATE: dweight += ..., dbias += ... (grad accumulation over micro-steps).
 *   - ACTIVATION gradients are WRITTEN: dinp = ... (previous contents ignored). Where a residual
 *     stream adds a second contribution, it is passed explicitly (layernorm_backward's `dresid`).
 *   - Elementwise backward kernels allow dinp == dout (in place) where stated. */
#ifndef DT_OPS_CPU_H
#define DT_OPS_CPU_H

#include <stddef.h>

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

/* out = inp W^T + bias.  out (N,OC), inp (N,C), weight (OC,C), bias (OC) or NULL. cblas_sgemm. */
void dt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
/* dinp = dout W (if dinp != NULL); dweight += dout^T inp; dbias += sum_N dout (if dbias != NULL).
 * dinp (N,C), dweight (OC,C), dbias (OC), dout (N,OC) */
void dt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int C, int OC);

/* Causal multi-head self-attention (no projections).
 * qkv (B,T,3C) holds q | k | v, head h at channels h*hs..h*hs+hs-1 of each part.
 *   att[b,h,t,:] = softmax_{j<=t}(q_t . k_j / sqrt(hs)), 0 for j > t;  out[b,t,h*hs:] = sum_j att[t,j] v_j
 * out (B,T,C), att (B,NH,T,T) (kept for backward). Matmuls per (b,h) through cblas_sgemm.
 * The (B,NH,T,T) probabilities are held in a buffer sized by dt_attention_scratch_floats, so a tiled
 * implementation can replace it without touching callers. */
size_t dt_attention_scratch_floats(int B, int T, int NH);
void dt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv = d(out)/d(qkv)^T dout (written); scratch (B,NH,T,T) is overwritten.
 *   datt = dout_h v^T;  dpre[t,j] = att[t,j] (datt[t,j] - sum_k att[t,k] datt[t,k]);
 *   dq = dpre k / sqrt(hs);  dk = dpre^T q / sqrt(hs);  dv = att^T dout_h */
void dt_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att,
                           int B, int T, int C, int NH);

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
