/* The CPU backend (dt_backend_cpu): memory (the arenas as host memory), the kernel table the model
 * (gpt2.c) runs on, filled from ops_cpu.h, attention_cpu.c and our sgemm, plus the vocab-parallel
 * variants tensor parallelism needs, and AdamW, the gradient sum of squares and the arena copies.
 * Everything is allocated in init (and set_precision); nothing allocates during a step. bf16/fp16
 * storage is emulated: the round kernels round float arrays (precision.h). The reference every
 * other backend is tested against. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dt_build.h"
#include "backend.h"
#include "cnn_kernels.h"
#include "gemm.h"
#include "kmath.h"
#include "ops_cpu.h"
#include "precision.h"
#include "profile.h"

typedef struct {
  int nthr;             /* OpenMP threads the attention scratch is sized for */
  size_t grads_bytes;   /* length of the parameter and gradient arenas' mappings */
} cpu_impl_t;

static void *alloc_floats(size_t n) {
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  void *p = aligned_alloc(64, bytes ? bytes : 64);
  if (p) memset(p, 0, bytes);
  return p;
}

/* The parameter and gradient arenas are anonymous mappings (zeroed, page-aligned): ZeRO-2/3 give
 * pages they no longer need back to the kernel (madvise DONTNEED; they read as zeros again). */
static float *map_floats(size_t n) {
  void *p = mmap(NULL, (n ? n : 1) * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void cpu_free(dt_backend_t *be) {
  cpu_impl_t *im = be->impl;
  if (im) {
    if (be->wparams != be->params) munmap(be->wparams, im->grads_bytes);
    if (be->grads) munmap(be->grads, im->grads_bytes);
    if (be->params) munmap(be->params, im->grads_bytes); /* the same size */
    free(im);
  }
  free(be->m);
  free(be->v);
  be->params = be->grads = be->m = be->v = be->wparams = NULL;
  be->impl = NULL;
}

static dt_status_t cpu_init(dt_backend_t *be, const dt_layout_t *lay, int B, int T, int threads) {
  size_t opt_lo = be->opt_lo, opt_hi = be->opt_hi;
  memset(be, 0, sizeof *be);
  if (opt_hi > lay->n_params || opt_lo > opt_hi)
    return DT_ERR(DT_ERR_ARG, "cpu backend: optimizer range [%zu, %zu) outside the arena of %zu", opt_lo, opt_hi,
                  lay->n_params);
  be->opt_lo = opt_lo;
  be->opt_hi = opt_hi;
  be->ops = &dt_backend_cpu;
  be->k = dt_backend_cpu.kernels;
  be->lay = lay;
  be->B = B;
  be->T = T;
  be->threads = threads;
  if (B < 1 || T < 1 || T > lay->d.T)
    return DT_ERR(DT_ERR_ARG, "cpu backend: bad micro-batch B=%d T=%d (model T=%d)", B, T, lay->d.T);
  if (threads > 0) omp_set_num_threads(threads);
  DT_TRY(dt_gemm_init()); /* DT_GEMM=auto|own|blas */
  cpu_impl_t *im = calloc(1, sizeof *im);
  if (!im) return DT_ERR(DT_ERR_NOMEM, "cpu backend: out of memory");
  be->impl = im;
  size_t n = lay->n_params;
  be->params = map_floats(n);
  be->grads = map_floats(n);
  im->grads_bytes = (n ? n : 1) * sizeof(float);
  be->m = alloc_floats(dt_backend_opt_floats(be));
  be->v = alloc_floats(dt_backend_opt_floats(be));
  im->nthr = omp_get_max_threads();
  if (!be->params || !be->grads || !be->m || !be->v) {
    cpu_free(be);
    return DT_ERR(DT_ERR_NOMEM, "cpu backend: cannot allocate 4 x %zu parameter floats", n);
  }
  be->wparams = be->params;
  be->precision = DT_PREC_FP32;
  be->act_bytes = 4; /* always: 16-bit storage is emulated by rounding floats (precision.h) */
  be->loss_scale = 1.0f;
  return DT_OK;
}

static dt_status_t cpu_set_precision(dt_backend_t *be, dt_precision_t p) {
  if (!dt_precision_name(p)) return DT_ERR(DT_ERR_ARG, "cpu backend: unknown precision %d", (int)p);
  if (p != DT_PREC_FP32 && be->wparams == be->params) { /* a mapping too: ZeRO-3 gathers into it, drops pages */
    be->wparams = map_floats(be->lay->n_params);
    if (!be->wparams) {
      be->wparams = be->params;
      return DT_ERR(DT_ERR_NOMEM, "cpu backend: cannot allocate the %s working copy of %zu parameters",
                    dt_precision_name(p), be->lay->n_params);
    }
  }
  be->precision = (int)p;
  return DT_OK;
}

/* ---- memory --------------------------------------------------------------------------------- */

static dt_status_t k_alloc(dt_backend_t *be, void **p, size_t bytes) {
  *p = alloc_floats((bytes + sizeof(float) - 1) / sizeof(float));
  return *p ? DT_OK : DT_ERR(DT_ERR_NOMEM, "%s backend: cannot allocate %zu bytes", be->ops->name, bytes);
}
static void k_release(dt_backend_t *be, void *p) {
  (void)be;
  free(p);
}
static dt_status_t k_copy(dt_backend_t *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  memcpy(dst, src, bytes);
  return DT_OK;
}
static dt_status_t k_grads_ready(dt_backend_t *be, int g) { /* every op has finished when it returns */
  (void)be, (void)g;
  return DT_OK;
}

/* ---- kernels: ops_cpu.h and the vocab-parallel variants ------------------------------------- */

void dt_cpu_attention_floats(int B, int T, int NH, int nthr, size_t *state, size_t *scratch) {
  *state = (size_t)B * T * NH; /* the row log-sum-exp (B,NH,T) */
  *scratch = dt_attention_scratch_floats(T, nthr);
}

static void k_attention_floats(const dt_backend_t *be, int B, int T, int NH, size_t *state, size_t *scratch) {
  dt_cpu_attention_floats(B, T, NH, ((const cpu_impl_t *)be->impl)->nthr, state, scratch);
}

/* Vocab-parallel rows (tp > 1): rows owned here, zeros for the others. */
static void embed_rows(float *out, const int *inp, const float *wte, int N, int C, int v0, int nrows) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < N; bt++) {
    float *o = out + (size_t)bt * C;
    int r = inp[bt] - v0;
    if (r >= 0 && r < nrows) memcpy(o, wte + (size_t)r * C, (size_t)C * sizeof(float));
    else memset(o, 0, (size_t)C * sizeof(float));
  }
}

static dt_status_t k_add_bias(dt_backend_t *be, dt_act_t *out_, const dt_act_t *bias_, int N, int OC) {
  (void)be;
  float *out = out_;
  const float *bias = bias_;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float *o = out + (size_t)i * OC;
    for (int c = 0; c < OC; c++) o[c] += bias[c];
  }
  return DT_OK;
}

static dt_status_t k_encoder_forward(dt_backend_t *be, dt_act_t *out, const int *inp, const dt_act_t *wte,
                                     const dt_act_t *wpe, int B, int T, int C, int v0, int nrows) {
  if (wpe && v0 == 0 && nrows >= be->lay->d.V) { /* every token's row is here */
    dt_encoder_forward(out, inp, wte, wpe, B, T, C);
    return DT_OK;
  }
  embed_rows(out, inp, wte, B * T, C, v0, nrows);
  return wpe ? k_add_bias(be, out, wpe, B, T * C) : DT_OK;
}

/* dwte rows owned here (tokens in [v0, v0 + nrows)), dwpe. */
static void tp_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C,
                                int v0, int nrows) {
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 64) { /* threads own column blocks: repeated tokens don't race */
    int c1 = c0 + 64 < C ? c0 + 64 : C;
    for (int bt = 0; bt < B * T; bt++) {
      int r = inp[bt] - v0;
      if (r < 0 || r >= nrows) continue;
      float *d = dwte + (size_t)r * C;
      const float *g = dout + (size_t)bt * C;
      for (int c = c0; c < c1; c++) d[c] += g[c];
    }
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    float *d = dwpe + (size_t)t * C;
    for (int b = 0; b < B; b++) {
      const float *g = dout + ((size_t)b * T + t) * C;
      for (int c = 0; c < C; c++) d[c] += g[c];
    }
  }
}

static dt_status_t k_encoder_backward(dt_backend_t *be, float *dwte, float *dwpe, const dt_act_t *dout, const int *inp,
                                      const int *inp_host, int B, int T, int C, int v0, int nrows) {
  (void)inp_host;
  if (v0 == 0 && nrows >= be->lay->d.V) dt_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
  else tp_encoder_backward(dwte, dwpe, dout, inp, B, T, C, v0, nrows);
  return DT_OK;
}

/* x (n floats) rounded to the storage precision in place: the ops that store rounded (backend.h)
 * round after computing, which gives the values the CUDA kernels round as they write */
static void store_rounded(const dt_backend_t *be, float *x, size_t n) {
  dt_prec_round(x, n, (dt_precision_t)be->precision);
}

/* out = [resid +] (acc + [bias]), rounded; acc may be out (the CPU's storage is float) */
static dt_status_t k_epilogue(dt_backend_t *be, dt_act_t *out_, const float *acc, const dt_act_t *bias_,
                              const dt_act_t *resid_, int N, int OC) {
  float *out = out_;
  const float *bias = bias_, *resid = resid_;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float *o = out + (size_t)i * OC;
    const float *a = acc + (size_t)i * OC, *r = resid ? resid + (size_t)i * OC : NULL;
    for (int c = 0; c < OC; c++) {
      float v = bias ? a[c] + bias[c] : a[c];
      o[c] = r ? r[c] + v : v;
    }
  }
  store_rounded(be, out, (size_t)N * OC);
  return DT_OK;
}

static dt_status_t k_widen(dt_backend_t *be, float *dst, const dt_act_t *src, size_t n) {
  (void)be;
  if (dst != src) memcpy(dst, src, n * sizeof(float));
  return DT_OK;
}

static dt_status_t k_layernorm_forward(dt_backend_t *be, dt_act_t *out, float *mean, float *rstd, const dt_act_t *inp,
                                       const dt_act_t *weight, const dt_act_t *bias, int N, int C) {
  dt_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  store_rounded(be, out, (size_t)N * C);
  return DT_OK;
}

static dt_status_t k_layernorm_backward(dt_backend_t *be, dt_act_t *dinp, float *dweight, float *dbias,
                                        const dt_act_t *dresid, const dt_act_t *dout, const dt_act_t *inp,
                                        const dt_act_t *weight, const float *mean, const float *rstd, int N, int C) {
  dt_layernorm_backward(dinp, dweight, dbias, dresid, dout, inp, weight, mean, rstd, N, C);
  store_rounded(be, dinp, (size_t)N * C);
  return DT_OK;
}

static dt_status_t k_linear_forward(dt_backend_t *be, dt_act_t *out, const dt_act_t *inp, const dt_act_t *w,
                                    int w_in_out, const dt_act_t *bias, const dt_act_t *resid, int N, int C, int OC) {
  if (!w_in_out && resid)
    return DT_ERR(DT_ERR_ARG, "%s backend: a residual epilogue needs the Conv1D layout", be->ops->name);
  if (!w_in_out) dt_matmul_forward(out, inp, w, bias, N, C, OC);
  else if (resid) dt_conv1d_residual_forward(out, inp, w, bias, resid, N, C, OC);
  else dt_conv1d_forward(out, inp, w, bias, N, C, OC);
  if (bias) store_rounded(be, out, (size_t)N * OC);
  return DT_OK;
}

static dt_status_t k_linear_backward(dt_backend_t *be, dt_act_t *dinp, float *dweight, float *dbias,
                                     const dt_act_t *dout, const dt_act_t *inp, const dt_act_t *w, int w_in_out, int N,
                                     int C, int OC) {
  (void)be;
  if (w_in_out) dt_conv1d_backward(dinp, dweight, dbias, dout, inp, w, N, C, OC);
  else dt_matmul_backward(dinp, dweight, dbias, dout, inp, w, N, C, OC);
  return DT_OK;
}

/* float storage: the fp32 versions are the same products */
static dt_status_t k_linear_forward32(dt_backend_t *be, float *out, const dt_act_t *inp, const dt_act_t *w,
                                      int w_in_out, int N, int C, int OC) {
  return k_linear_forward(be, out, inp, w, w_in_out, NULL, NULL, N, C, OC);
}
static dt_status_t k_linear_backward32(dt_backend_t *be, float *dinp, float *dweight, float *dbias,
                                       const dt_act_t *dout, const dt_act_t *inp, const dt_act_t *w, int w_in_out,
                                       int N, int C, int OC) {
  return k_linear_backward(be, dinp, dweight, dbias, dout, inp, w, w_in_out, N, C, OC);
}

static dt_status_t k_attention_forward(dt_backend_t *be, dt_act_t *out, float *state, float *scratch,
                                       const dt_act_t *qkv, int B, int T, int C, int NH) {
  dt_attention_forward(out, state, scratch, qkv, B, T, C, NH, ((cpu_impl_t *)be->impl)->nthr);
  store_rounded(be, out, (size_t)B * T * C);
  return DT_OK;
}

static dt_status_t k_attention_backward(dt_backend_t *be, dt_act_t *dqkv, float *scratch, const dt_act_t *dout,
                                        const dt_act_t *out, const dt_act_t *qkv, const float *state, int B, int T,
                                        int C, int NH) {
  (void)out; /* recomputed with the probabilities */
  dt_attention_backward(dqkv, scratch, dout, qkv, state, B, T, C, NH, ((cpu_impl_t *)be->impl)->nthr);
  store_rounded(be, dqkv, (size_t)B * T * 3 * C);
  return DT_OK;
}

static dt_status_t k_attention_decode(dt_backend_t *be, dt_act_t *out, dt_act_t *kc, dt_act_t *vc, const dt_act_t *qkv,
                                      int B, int pos, int n, int Tmax, int C, int NH) {
  const int nthr = ((cpu_impl_t *)be->impl)->nthr;
  float *scratch = malloc((size_t)nthr * Tmax * sizeof(float)); /* decoding only: not a hot path */
  if (!scratch) return DT_ERR(DT_ERR_NOMEM, "cpu backend: attention decode scratch of %d x %d floats", nthr, Tmax);
  dt_attention_decode(out, kc, vc, scratch, qkv, B, pos, n, Tmax, C, NH, nthr);
  free(scratch);
  store_rounded(be, out, (size_t)B * n * C);
  return DT_OK;
}

static dt_status_t k_gelu_forward(dt_backend_t *be, dt_act_t *out, const dt_act_t *inp, size_t n) {
  dt_gelu_forward(out, inp, n);
  store_rounded(be, out, n);
  return DT_OK;
}

static dt_status_t k_gelu_backward(dt_backend_t *be, dt_act_t *dinp, const dt_act_t *inp, const dt_act_t *dout,
                                   size_t n) {
  dt_gelu_backward(dinp, inp, dout, n);
  store_rounded(be, dinp, n);
  return DT_OK;
}

static dt_status_t k_crossentropy_forward(dt_backend_t *be, float *losses, float *lse, const dt_act_t *logits,
                                          const int *targets, int N, int V, int Vp, double *loss_sum) {
  (void)be;
  *loss_sum += (float)dt_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
  return DT_OK;
}

/* The vocab-parallel cross-entropy's pieces: the same math as dt_crossentropy_forward (float
 * chunks of exponentials, added in double), the final sums on the host. */
static dt_status_t k_xent_max(dt_backend_t *be, float *mx, const dt_act_t *logits_, int N, int nv, int Vp) {
  (void)be;
  const float *logits = logits_;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *z = logits + (size_t)i * Vp;
    float m = -INFINITY;
    for (int v = 0; v < nv; v++) m = z[v] > m ? z[v] : m;
    mx[i] = m;
  }
  return DT_OK;
}

static dt_status_t k_xent_sumexp(dt_backend_t *be, double *sum, float *tl, const dt_act_t *logits_, const float *mx,
                                 const int *targets, int N, int nv, int Vp, int v0) {
  (void)be;
  const float *logits = logits_;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *z = logits + (size_t)i * Vp;
    const float m = mx[i];
    double s = 0.0;
    for (int a = 0; a < nv; a += 1024) {
      int e = a + 1024 < nv ? a + 1024 : nv;
      float cs = 0.0f;
      for (int v = a; v < e; v++) cs += dt_expf(z[v] - m);
      s += cs;
    }
    sum[i] = s;
    int t = targets[i] - v0;
    tl[i] = t >= 0 && t < nv ? z[t] : 0.0f;
  }
  return DT_OK;
}

static dt_status_t k_xent_finish(dt_backend_t *be, float *lse, float *losses, const double *sum, int N,
                                 double *loss_sum) {
  (void)be;
  double total = 0.0;
  for (int i = 0; i < N; i++) {
    float l = lse[i] + (float)log(sum[i]);
    lse[i] = l;
    losses[i] = l - losses[i];
    total += losses[i];
  }
  *loss_sum += (float)(total / N);
  return DT_OK;
}

/* Backward of softmax cross-entropy written over the logits, row by row (no separate dlogits):
 * z[i, v] <- (exp(z[i, v] - lse[i]) - [v == target[i]]) * dloss for v < V, 0 for the padded
 * v in [V, Vp). The same per-element math as dt_crossentropy_backward (ops_cpu.h), so the
 * numbers are bitwise those of the two-buffer version. */
DT_CPU_VEC static void xent_backward_inplace(float *zd, const float *lse, const int *targets, float dloss, int N, int V,
                                             int Vp, int v0) {
  /* tensor parallelism: the rows hold global columns [v0, v0 + Vp), of which V are real vocab */
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float *z = zd + (size_t)i * Vp;
    const float l = lse[i];
#pragma omp simd
    for (int v = 0; v < V; v++) z[v] = dt_expf(z[v] - l) * dloss;
    int t = targets[i] - v0;
    if (t >= 0 && t < V) z[t] -= dloss;
    for (int v = V < 0 ? 0 : V; v < Vp; v++) z[v] = 0.0f;
  }
}

static dt_status_t k_crossentropy_backward(dt_backend_t *be, dt_act_t *logits, const float *lse, const int *targets,
                                           float dloss, int N, int nv, int Vp, int v0) {
  xent_backward_inplace(logits, lse, targets, dloss, N, nv, Vp, v0);
  store_rounded(be, logits, (size_t)N * Vp);
  return DT_OK;
}

static dt_status_t k_round(dt_backend_t *be, dt_act_t *x, size_t n) {
  store_rounded(be, x, n);
  return DT_OK;
}

static dt_status_t k_round_copy(dt_backend_t *be, dt_act_t *dst, const float *src, size_t n) {
  dt_prec_round_copy(dst, src, n, (dt_precision_t)be->precision);
  return DT_OK;
}

/* memset split across the threads (one thread cannot saturate memory bandwidth) */
static void zero_floats(float *x, size_t n) {
  const size_t chunk = 1 << 16;
  long nchunk = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
  for (long c = 0; c < nchunk; c++) {
    size_t lo = (size_t)c * chunk, len = lo + chunk < n ? chunk : n - lo;
    memset(x + lo, 0, len * sizeof(float));
  }
}

static dt_status_t cpu_zero_grad(dt_backend_t *be) {
  DT_PROF(DT_PROF_ZERO_GRAD, zero_floats(be->grads, be->lay->n_params));
  return DT_OK;
}

static dt_status_t k_clear(dt_backend_t *be, float *x, size_t n) {
  (void)be;
  zero_floats(x, n);
  return DT_OK;
}
static dt_status_t k_populate(dt_backend_t *be, float *x, size_t n) {
  (void)be, (void)x, (void)n;
  return DT_OK;
}

DT_CPU_VEC static dt_status_t k_divide(dt_backend_t *be, float *restrict x, size_t n, float d) {
  (void)be;
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < (long)n; i++) x[i] /= d;
  return DT_OK;
}

DT_CPU_VEC static double sumsq(const float *restrict g, long n) {
  double s = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
  for (long i = 0; i < n; i++) s += (double)g[i] * g[i];
  return s;
}

/* the optimizer range: the whole arena, or this rank's ZeRO shard */
static dt_status_t cpu_grad_sumsq(dt_backend_t *be, double *out) {
  size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0;
  DT_PROF(DT_PROF_GRAD_SUMSQ, *out = sumsq(be->grads + lo, (long)dt_backend_opt_floats(be)));
  return DT_OK;
}

static dt_status_t k_sumsq(dt_backend_t *be, const float *x, size_t n, double *out_host) {
  (void)be;
  *out_host = sumsq(x, (long)n);
  return DT_OK;
}

/* One pass over arena range [lo, hi) in one parallel region: the part of each tensor inside it is
 * split statically over the threads (no barrier between tensors; they are disjoint). m and v
 * hold the range only: mom[k - lo] belongs to arena offset k. */
DT_CPU_VEC static void adamw_arena(const dt_layout_t *lay, size_t lo, size_t hi, float *params, const float *grads,
                                   float *mom, float *var, const dt_adamw_args_t *ar, float bc1, float bc2) {
  const float lr = ar->lr, b1 = ar->beta1, b2 = ar->beta2, eps = ar->eps, gs = ar->grad_scale;
#pragma omp parallel
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    size_t a = t->offset > lo ? t->offset : lo, z = t->offset + (size_t)t->rows * t->cols;
    if (z > hi) z = hi;
    if (a >= z) continue;
    float *restrict p = params + a, *restrict m = mom + (a - lo), *restrict v = var + (a - lo);
    const float *restrict g = grads + a;
    const float wd = t->decay ? ar->weight_decay : 0.0f;
    const long n = (long)(z - a);
#pragma omp for simd schedule(static) nowait
    for (long k = 0; k < n; k++) p[k] = dt_adamw_update(p[k], g[k] * gs, &m[k], &v[k], lr, b1, b2, eps, wd, bc1, bc2);
  }
}

static dt_status_t adamw_impl(dt_backend_t *be, const dt_adamw_args_t *ar) {
  if (ar->t < 1) return DT_ERR(DT_ERR_ARG, "cpu backend: adamw step t=%d (must be >= 1)", ar->t);
  float bc1 = (float)(1.0 - pow(ar->beta1, ar->t)), bc2 = (float)(1.0 - pow(ar->beta2, ar->t));
  size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0, hi = lo + dt_backend_opt_floats(be);
  adamw_arena(be->lay, lo, hi, be->params, be->grads, be->m, be->v, ar, bc1, bc2);
  be->param_gen++; /* cached logits no longer recomputable (gpt2.c) */
  return DT_OK;
}

static dt_status_t cpu_adamw(dt_backend_t *be, const dt_adamw_args_t *ar) {
  dt_status_t st;
  DT_PROF(DT_PROF_ADAMW, st = adamw_impl(be, ar));
  return st;
}

static dt_status_t cpu_copy_to_host(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, float *dst) {
  DT_TRY(dt_backend_check_range(be, buf, off, count));
  memcpy(dst, dt_backend_buf(be, buf) + off, count * sizeof(float));
  return DT_OK;
}

static dt_status_t cpu_copy_from_host(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, const float *src) {
  DT_TRY(dt_backend_check_range(be, buf, off, count));
  memcpy(dt_backend_buf(be, buf) + off, src, count * sizeof(float));
  be->param_gen++; /* cached logits no longer recomputable (gpt2.c) */
  return DT_OK;
}

static const char *cpu_engine(const dt_backend_t *be) {
  (void)be;
  return dt_cpu_gemm_engine();
}

/* Every CPU op has finished when it returns. */
static dt_status_t cpu_synchronize(dt_backend_t *be) {
  (void)be;
  return DT_OK;
}

static const dt_kernels_t cpu_kernels = {
    .alloc = k_alloc,
    .release = k_release,
    .copy = k_copy,
    .upload = k_copy,
    .download = k_copy,
    .grads_ready = k_grads_ready,
    .attention_floats = k_attention_floats,
    .encoder_forward = k_encoder_forward,
    .encoder_backward = k_encoder_backward,
    .epilogue = k_epilogue,
    .widen = k_widen,
    .layernorm_forward = k_layernorm_forward,
    .layernorm_backward = k_layernorm_backward,
    .linear_forward = k_linear_forward,
    .linear_backward = k_linear_backward,
    .linear_forward32 = k_linear_forward32,
    .linear_backward32 = k_linear_backward32,
    .attention_forward = k_attention_forward,
    .attention_backward = k_attention_backward,
    .attention_decode = k_attention_decode,
    .gelu_forward = k_gelu_forward,
    .gelu_backward = k_gelu_backward,
    .crossentropy_forward = k_crossentropy_forward,
    .xent_max = k_xent_max,
    .xent_sumexp = k_xent_sumexp,
    .xent_finish = k_xent_finish,
    .crossentropy_backward = k_crossentropy_backward,
    .round = k_round,
    .round_copy = k_round_copy,
    .sumsq = k_sumsq,
    .clear = k_clear,
    .populate = k_populate,
    .divide = k_divide,
};

const dt_backend_ops_t dt_backend_cpu = {
    .name = "cpu",
    .kernels = &cpu_kernels,
    .cnn = &dt_cpu_cnn_kernels,
    .host_memory = 1,
    .async = 0,
    .init = cpu_init,
    .free = cpu_free,
    .engine = cpu_engine,
    .zero_grad = cpu_zero_grad,
    .grad_sumsq = cpu_grad_sumsq,
    .adamw = cpu_adamw,
    .copy_to_host = cpu_copy_to_host,
    .copy_from_host = cpu_copy_from_host,
    .set_precision = cpu_set_precision,
    .synchronize = cpu_synchronize,
};
