/* The CPU backend (dt_backend_cpu): GPT-2 forward/backward over the ops_cpu.h kernels, AdamW and
 * the arena copies. All memory (params, grads, m, v, activations and
 * activation-gradient scratch) is allocated in init (and set_precision); forward/backward/adamw
 * allocate nothing. bf16/fp16 storage is emulated: STORE() rounds each activation and activation
 * gradient right after the op writing it, and forward reads a rounded copy of the parameters
 * (the rounding points are listed in precision.h). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dt_build.h"
#include "backend.h"
#include "gemm.h"
#include "kmath.h"
#include "ops_cpu.h"
#include "precision.h"
#include "profile.h"

dt_profile_t dt_profile;
const char *const dt_prof_names[DT_PROF_N] = {"encoder", "layernorm", "matmul", "lm_head", "attention", "gelu",
                                               "residual", "crossentropy", "zero_grad", "grad_sumsq", "adamw"};
double dt_profile_now(void) { return omp_get_wtime(); }

/* Activations for capacity (B, T), llm.c's ActivationTensors minus what can be recomputed in
 * place. Per-layer tensors are strided by the capacity so smaller (B, T) reuse the same views.
 * With pipeline parallelism a rank runs only its stage's nl = l1 - l0 blocks (local layer index
 * l - l0) and keeps one set per micro-batch in flight (be->slots); the activation-gradient
 * scratch is shared by the sets. The (B, T, C) stage input sits in `encoded`. lnf..lse exist on
 * the last stage only (NULL elsewhere). */
typedef struct {
  float *encoded;            /* (B,T,C) */
  float *ln1, *ln1_mean, *ln1_rstd; /* (L,B,T,C), (L,B,T), (L,B,T) */
  float *qkv;                /* (L,B,T,3C) */
  float *atty;               /* (L,B,T,C) */
  float *att_lse;            /* (L,B,NH,T) attention row logsumexp */
  float *residual2;          /* (L,B,T,C) */
  float *ln2, *ln2_mean, *ln2_rstd;
  float *fch, *fch_gelu;     /* (L,B,T,4C) */
  float *residual3;          /* (L,B,T,C) */
  float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
  float *logits;             /* (B,T,Vp) */
  float *losses, *lse;       /* (B,T) */
  /* activation-gradient scratch, one layer's worth (written with '=') */
  float *dres;               /* (B,T,C) gradient of the residual stream */
  float *dtmp;               /* (B,T,C) */
  float *dqkv;               /* (B,T,3C) */
  float *dfch;               /* (B,T,4C) */
  float *attscr;             /* per-thread attention scratch (dt_attention_scratch_floats) */
  float *xtmp;               /* tp > 1 only: (B,T) doubles for the vocab-parallel cross-entropy */
  /* no dlogits: backward turns `logits` into d loss / d logits in place (lm_head section) */
  int *inputs, *targets;     /* (B,T) copies of this set's forward batch */
  int B, T;                  /* of that forward */
  int have_fwd, have_targets;
  int logits_gone;           /* backward overwrote logits with dlogits */
  unsigned long logits_gen;  /* param_gen at that forward */
} cpu_acts_t;

typedef struct {
  float *arena;
  cpu_acts_t *acts;     /* be->slots activation sets */
  int nslots;
  int l0, l1, first, last; /* pipeline stage: blocks [l0, l1), embeddings, ln_f + lm_head */
  size_t bt, btc, bth;  /* capacity strides: B*T, B*T*C, B*NH*T (NH: this rank's heads) */
  size_t btcl;          /* B*T*C/tp: stride of the per-rank-width activations (qkv, atty, fch) */
  int tp, Cl, NHl, Vpl, v0; /* tensor parallelism: degree, local C, heads, vocab rows, first vocab row */
  int nthr;             /* OpenMP threads the attention scratch is sized for */
  size_t grads_bytes;   /* length of the parameter and gradient arenas' mappings */
  unsigned long param_gen; /* parameter updates so far */
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
    if (be->wparams != be->params) free(be->wparams);
    if (be->grads) munmap(be->grads, im->grads_bytes);
    if (be->params) munmap(be->params, im->grads_bytes); /* the same size */
    free(im->arena);
    for (int k = 0; im->acts && k < im->nslots; k++) {
      free(im->acts[k].inputs);
      free(im->acts[k].targets);
    }
    free(im->acts);
    free(im);
  }
  free(be->m);
  free(be->v);
  be->params = be->grads = be->m = be->v = be->wparams = NULL;
  be->impl = NULL;
}

/* Carve the activation arena into nslots sets of a stage with nl blocks (lnf..lse if `last`)
 * and the shared scratch; with base == NULL only count. Returns floats used. With recompute,
 * a set keeps of each block only its output (residual3; the stage input is `encoded`), and one
 * block's other activations (ln1 .. fch_gelu) are scratch shared by all sets and blocks: backward
 * recomputes them from the block's input (block_forward) before it differentiates the block. */
static size_t carve(cpu_acts_t *sets, int nslots, float *base, const dt_dims_t *d, int tp, int nl, int last, int B,
                    int T, int nthr, int recompute) {
  size_t off = 0, L = (size_t)nl, bt = (size_t)B * T, C = d->C, Cl = C / tp;
  cpu_acts_t dummy, *a = &dummy;
#define TAKE(field, n)                                                  \
  do {                                                                  \
    size_t n_ = (size_t)(n);                                            \
    a->field = base && n_ ? base + off : NULL;                          \
    off += (n_ + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;                   \
  } while (0)
#define TAKE_BLOCKS(n) /* the blocks' activations for n blocks */ \
  do {                                                            \
    TAKE(ln1, (n) * bt * C);                                      \
    TAKE(ln1_mean, (n) * bt);                                     \
    TAKE(ln1_rstd, (n) * bt);                                     \
    TAKE(qkv, (n) * bt * 3 * Cl);                                 \
    TAKE(atty, (n) * bt * Cl);                                    \
    TAKE(att_lse, (n) * bt * (d->NH / tp));                       \
    TAKE(residual2, (n) * bt * C);                                \
    TAKE(ln2, (n) * bt * C);                                      \
    TAKE(ln2_mean, (n) * bt);                                     \
    TAKE(ln2_rstd, (n) * bt);                                     \
    TAKE(fch, (n) * bt * 4 * Cl);                                 \
    TAKE(fch_gelu, (n) * bt * 4 * Cl);                            \
  } while (0)
  for (int k = 0; k < nslots; k++) {
    a = sets ? &sets[k] : &dummy;
    TAKE(encoded, bt * C);
    if (!recompute) TAKE_BLOCKS(L);
    TAKE(residual3, L * bt * C);
    TAKE(lnf, last ? bt * C : 0);
    TAKE(lnf_mean, last ? bt : 0);
    TAKE(lnf_rstd, last ? bt : 0);
    TAKE(logits, last ? bt * (d->Vp / tp) : 0);
    TAKE(losses, last ? bt : 0);
    TAKE(lse, last ? bt : 0);
  }
  a = sets ? &sets[0] : &dummy; /* the scratch, shared by every set */
  if (recompute && L > 0) TAKE_BLOCKS((size_t)1);
  TAKE(dres, bt * C);
  TAKE(dtmp, bt * C);
  TAKE(dqkv, bt * 3 * Cl);
  TAKE(dfch, bt * 4 * Cl);
  TAKE(attscr, dt_attention_scratch_floats(T, nthr));
  TAKE(xtmp, tp > 1 ? 2 * bt : 0);
#undef TAKE_BLOCKS
#undef TAKE
  for (int k = 1; sets && k < nslots; k++) {
    sets[k].dres = a->dres, sets[k].dtmp = a->dtmp, sets[k].dqkv = a->dqkv, sets[k].dfch = a->dfch;
    sets[k].attscr = a->attscr, sets[k].xtmp = a->xtmp;
    if (recompute) {
      cpu_acts_t *b = &sets[k];
      b->ln1 = a->ln1, b->ln1_mean = a->ln1_mean, b->ln1_rstd = a->ln1_rstd, b->qkv = a->qkv, b->atty = a->atty;
      b->att_lse = a->att_lse, b->residual2 = a->residual2, b->ln2 = a->ln2, b->ln2_mean = a->ln2_mean;
      b->ln2_rstd = a->ln2_rstd, b->fch = a->fch, b->fch_gelu = a->fch_gelu;
    }
  }
  return off;
}

size_t dt_cpu_activation_floats(const dt_dims_t *d, int B, int T, int nthr) {
  return carve(NULL, 1, NULL, d, 1, d->L, 1, B, T, nthr, 0);
}

size_t dt_cpu_activation_floats_tp(const dt_dims_t *d, int tp, int B, int T, int nthr) {
  return carve(NULL, 1, NULL, d, tp, d->L, 1, B, T, nthr, 0);
}

size_t dt_cpu_activation_floats_stage(const dt_dims_t *d, int tp, int nl, int last, int slots, int B, int T, int nthr,
                                      int recompute) {
  return carve(NULL, slots, NULL, d, tp, nl, last, B, T, nthr, recompute);
}

static dt_status_t cpu_init(dt_backend_t *be, const dt_layout_t *lay, int B, int T, int threads) {
  size_t opt_lo = be->opt_lo, opt_hi = be->opt_hi;
  int slots = be->slots > 0 ? be->slots : 1, recompute = be->recompute;
  memset(be, 0, sizeof *be);
  be->slots = slots;
  be->recompute = recompute;
  if (opt_hi > lay->n_params || opt_lo > opt_hi)
    return DT_ERR(DT_ERR_ARG, "cpu backend: optimizer range [%zu, %zu) outside the arena of %zu", opt_lo, opt_hi,
                  lay->n_params);
  be->opt_lo = opt_lo;
  be->opt_hi = opt_hi;
  be->ops = &dt_backend_cpu;
  be->lay = lay;
  be->B = B;
  be->T = T;
  be->threads = threads;
  if (B < 1 || T < 1 || T > lay->d.T)
    return DT_ERR(DT_ERR_ARG, "cpu backend: bad micro-batch B=%d T=%d (model T=%d)", B, T, lay->d.T);
  const int tp = lay->tp > 1 ? lay->tp : 1; /* the caller sets be->tp_comm after init (forward checks it) */
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
  dt_layout_stage(lay, &im->l0, &im->l1, &im->first, &im->last);
  const int nl = im->l1 - im->l0;
  /* what `dtrain plan` counts */
  size_t nact = dt_cpu_activation_floats_stage(&lay->d, tp, nl, im->last, slots, B, T, im->nthr, recompute);
  im->arena = alloc_floats(nact);
  im->nslots = slots;
  im->acts = calloc((size_t)slots, sizeof *im->acts);
  int ints_ok = im->acts != NULL;
  for (int k = 0; ints_ok && k < slots; k++) {
    im->acts[k].inputs = calloc((size_t)B * T, sizeof(int));
    im->acts[k].targets = calloc((size_t)B * T, sizeof(int));
    ints_ok = im->acts[k].inputs && im->acts[k].targets;
  }
  if (!be->params || !be->grads || !be->m || !be->v || !im->arena || !ints_ok) {
    cpu_free(be);
    return DT_ERR(DT_ERR_NOMEM, "cpu backend: cannot allocate 4 x %zu parameter floats + %zu activation floats", n,
                  nact);
  }
  carve(im->acts, slots, im->arena, &lay->d, tp, nl, im->last, B, T, im->nthr, recompute);
  be->wparams = be->params;
  be->precision = DT_PREC_FP32;
  be->loss_scale = 1.0f;
  im->bt = (size_t)B * T;
  im->btc = im->bt * lay->d.C;
  im->tp = tp;
  im->Cl = lay->d.C / tp;
  im->NHl = lay->d.NH / tp;
  im->Vpl = lay->d.Vp / tp;
  im->v0 = lay->tp_rank * im->Vpl;
  im->bth = im->bt * im->NHl;
  im->btcl = im->bt * im->Cl;
  return DT_OK;
}

static dt_status_t cpu_set_precision(dt_backend_t *be, dt_precision_t p) {
  if (!dt_precision_name(p)) return DT_ERR(DT_ERR_ARG, "cpu backend: unknown precision %d", (int)p);
  if (p != DT_PREC_FP32 && be->wparams == be->params) {
    be->wparams = alloc_floats(be->lay->n_params);
    if (!be->wparams) {
      be->wparams = be->params;
      return DT_ERR(DT_ERR_NOMEM, "cpu backend: cannot allocate the %s working copy of %zu parameters",
                    dt_precision_name(p), be->lay->n_params);
    }
  }
  be->precision = (int)p;
  return DT_OK;
}

/* An activation or activation gradient just written: round it to the storage precision. */
#define STORE(x, n) dt_prec_round((x), (size_t)(n), (dt_precision_t)be->precision)

/* Parameter views read by forward/backward: the working copy (the master itself in fp32). */
static const float *P(const dt_backend_t *be, int l, int which) {
  return be->wparams + dt_layout_block(be->lay, l, which)->offset;
}
static float *G(const dt_backend_t *be, int l, int which) { return be->grads + dt_layout_block(be->lay, l, which)->offset; }

/* ---- tensor parallelism (Megatron-LM) --------------------------------------------------------
 * With tp ranks (be->tp_comm) each rank holds the shards of dt_layout_init_tp and runs the same
 * per-layer code at its local widths Cl = C/tp, NHl = NH/tp, 4Cl, Vpl = Vp/tp:
 *   c_attn, c_fc (column-parallel: (in, out) storage, a block of output columns): local outputs,
 *   no communication;
 *   attention: over the local heads only (head size C/NH unchanged);
 *   attn.c_proj, mlp.c_proj (row-parallel, split along their input rows): a partial (B,T,C) product, all-reduced
 *   over tp, then + bias + residual (the bias is replicated and added once, after the sum);
 *   embedding: each rank adds the wte rows it owns (zeros for others), all-reduce, + wpe;
 *   lm_head: local logits (B,T,Vpl); cross-entropy from all-reduced row max, sum of exponentials
 *   and target logit (no rank holds (B,T,Vp)).
 * Backward mirrors it: the input gradients of c_attn, c_fc and the lm_head (partial sums over
 * this rank's output columns) are all-reduced before their layernorm backward.
 * Replicated parameters (wpe, ln_1, ln_2, ln_f, the c_proj biases) get the same gradient on every
 * tp rank: everything they see (residual stream, layernorm inputs and d loss / d residual) is
 * either computed from all-reduced values or is an all-reduced value itself, and an all-reduce
 * gives every rank the same sum. The trainer checks that they stay bitwise equal (train.c). */

static dt_status_t tp_allreduce(dt_backend_t *be, void *x, size_t n, dt_dtype_t ty, dt_redop_t op) {
  return be->tp_comm->ops->allreduce(be->tp_comm, x, x, n, ty, op, NULL, NULL);
}

/* out = resid + inp W + bias; W (IC, OC) (Conv1D), local rows of the global input dim when tp > 1. */
static dt_status_t proj_residual(dt_backend_t *be, float *out, const float *inp, const float *w, const float *bias,
                                 const float *resid, int N, int IC, int OC) {
  cpu_impl_t *im = be->impl;
  if (im->tp == 1) {
    dt_conv1d_residual_forward(out, inp, w, bias, resid, N, IC, OC);
    return DT_OK;
  }
  dt_conv1d_forward(out, inp, w, NULL, N, IC, OC);
  DT_TRY(tp_allreduce(be, out, (size_t)N * OC, DT_F32, DT_SUM));
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float *o = out + (size_t)i * OC;
    const float *r = resid + (size_t)i * OC;
    for (int c = 0; c < OC; c++) o[c] = r[c] + (o[c] + bias[c]);
  }
  return DT_OK;
}

/* Vocab-parallel embedding: rows owned here (global rows [v0, v0+Vpl)), zeros else, summed. */
static dt_status_t tp_encoder_forward(dt_backend_t *be, float *out, const int *inp, const float *wte,
                                      const float *wpe, int B, int T, int C) {
  cpu_impl_t *im = be->impl;
  const int N = B * T;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < N; bt++) {
    float *o = out + (size_t)bt * C;
    int r = inp[bt] - im->v0;
    if (r >= 0 && r < im->Vpl) memcpy(o, wte + (size_t)r * C, (size_t)C * sizeof(float));
    else memset(o, 0, (size_t)C * sizeof(float));
  }
  DT_TRY(tp_allreduce(be, out, (size_t)N * C, DT_F32, DT_SUM));
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < N; bt++) {
    float *o = out + (size_t)bt * C;
    const float *p = wpe + (size_t)(bt % T) * C;
    for (int c = 0; c < C; c++) o[c] += p[c];
  }
  return DT_OK;
}

static void tp_encoder_backward(cpu_impl_t *im, float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                                int T, int C) {
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 64) { /* threads own column blocks: repeated tokens don't race */
    int c1 = c0 + 64 < C ? c0 + 64 : C;
    for (int bt = 0; bt < B * T; bt++) {
      int r = inp[bt] - im->v0;
      if (r < 0 || r >= im->Vpl) continue;
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

/* Vocab-parallel cross-entropy over local logits (N, Vpl) holding global columns [v0, v0+Vpl):
 * the same math as dt_crossentropy_forward with the row max, the sum of exponentials (float
 * chunks, double sum) and the target logit all-reduced. Returns the mean loss. */
static dt_status_t tp_crossentropy_forward(dt_backend_t *be, float *losses, float *lse, const float *logits,
                                           const int *targets, int N, double *mean) {
  cpu_impl_t *im = be->impl;
  const int V = be->lay->d.V, Vpl = im->Vpl, v0 = im->v0;
  int nv = V - v0 < Vpl ? V - v0 : Vpl; /* real vocab columns here */
  if (nv < 0) nv = 0;
  double *sum = (double *)im->acts[0].xtmp;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *z = logits + (size_t)i * Vpl;
    float mx = -INFINITY;
    for (int v = 0; v < nv; v++) mx = z[v] > mx ? z[v] : mx;
    lse[i] = mx;
  }
  DT_TRY(tp_allreduce(be, lse, (size_t)N, DT_F32, DT_MAX));
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *z = logits + (size_t)i * Vpl;
    const float mx = lse[i];
    double s = 0.0;
    for (int a = 0; a < nv; a += 1024) {
      int e = a + 1024 < nv ? a + 1024 : nv;
      float cs = 0.0f;
      for (int v = a; v < e; v++) cs += dt_expf(z[v] - mx);
      s += cs;
    }
    sum[i] = s;
    int t = targets[i] - v0;
    losses[i] = t >= 0 && t < nv ? z[t] : 0.0f;
  }
  DT_TRY(tp_allreduce(be, sum, (size_t)N, DT_F64, DT_SUM));
  DT_TRY(tp_allreduce(be, losses, (size_t)N, DT_F32, DT_SUM));
  double total = 0.0;
  for (int i = 0; i < N; i++) {
    float l = lse[i] + (float)log(sum[i]);
    lse[i] = l;
    losses[i] = l - losses[i];
    total += losses[i];
  }
  *mean = total / N;
  return DT_OK;
}

/* ---- lm_head + cross-entropy --------------------------------------------------------------
 * Backward of softmax cross-entropy written over the logits, row by row (no separate dlogits):
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

/* One block's activations in a set: its own (stored per block) or, with recompute, the shared
 * one-block scratch; the block's output res3 is always its own (the next block's input). */
typedef struct {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *alse, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fchg, *res3;
} cpu_block_t;

static cpu_block_t block_views(const dt_backend_t *be, const cpu_impl_t *im, const cpu_acts_t *a, size_t j) {
  const size_t k = be->recompute ? 0 : j, o = k * im->btc, ol = k * im->btcl, os = k * im->bt;
  return (cpu_block_t){a->ln1 + o,     a->ln1_mean + os,   a->ln1_rstd + os,     a->qkv + 3 * ol,  a->atty + ol,
                       a->att_lse + k * im->bth, a->residual2 + o, a->ln2 + o, a->ln2_mean + os, a->ln2_rstd + os,
                       a->fch + 4 * ol, a->fch_gelu + 4 * ol, a->residual3 + j * im->btc};
}

/* Forward of block l from its input x into y (also backward's recomputation: the same code on
 * the same input gives bitwise the same activations). */
static dt_status_t block_forward(dt_backend_t *be, const cpu_block_t *y, const float *x, int l, int B, int T) {
  cpu_impl_t *im = be->impl;
  const int C = be->lay->d.C, N = B * T, Cl = im->Cl, NHl = im->NHl;
  cpu_acts_t *a = &im->acts[0]; /* the shared attention scratch */
  dt_status_t st = DT_OK;
  DT_PROF(DT_PROF_LAYERNORM, dt_layernorm_forward(y->ln1, y->ln1_mean, y->ln1_rstd, x, P(be, l, DT_LN1W), P(be, l, DT_LN1B), N, C));
  STORE(y->ln1, N * C);
  DT_PROF(DT_PROF_MATMUL, dt_conv1d_forward(y->qkv, y->ln1, P(be, l, DT_QKVW), P(be, l, DT_QKVB), N, C, 3 * Cl));
  STORE(y->qkv, N * 3 * Cl);
  DT_PROF(DT_PROF_ATTENTION, dt_attention_forward(y->atty, y->alse, a->attscr, y->qkv, B, T, Cl, NHl, im->nthr));
  STORE(y->atty, N * Cl);
  DT_PROF(DT_PROF_MATMUL, st = proj_residual(be, y->res2, y->atty, P(be, l, DT_ATTPROJW), P(be, l, DT_ATTPROJB), x, N, Cl, C));
  DT_TRY(st);
  STORE(y->res2, N * C);
  DT_PROF(DT_PROF_LAYERNORM, dt_layernorm_forward(y->ln2, y->ln2_mean, y->ln2_rstd, y->res2, P(be, l, DT_LN2W), P(be, l, DT_LN2B), N, C));
  STORE(y->ln2, N * C);
  DT_PROF(DT_PROF_MATMUL, dt_conv1d_forward(y->fch, y->ln2, P(be, l, DT_FCW), P(be, l, DT_FCB), N, C, 4 * Cl));
  STORE(y->fch, N * 4 * Cl);
  DT_PROF(DT_PROF_GELU, dt_gelu_forward(y->fchg, y->fch, (size_t)N * 4 * Cl));
  STORE(y->fchg, N * 4 * Cl);
  DT_PROF(DT_PROF_MATMUL, st = proj_residual(be, y->res3, y->fchg, P(be, l, DT_FCPROJW), P(be, l, DT_FCPROJB), y->res2, N, 4 * Cl, C));
  DT_TRY(st);
  STORE(y->res3, N * C);
  return DT_OK;
}

static dt_status_t cpu_stage_forward(dt_backend_t *be, int slot, const int *inputs, const int *targets,
                                     const float *x_in, int B, int T, float *loss, float *y_out) {
  cpu_impl_t *im = be->impl;
  const dt_layout_t *lay = be->lay;
  const int C = lay->d.C, V = lay->d.V, N = B * T;
  const int Vpl = im->Vpl; /* this rank's vocab rows (tp = 1: Vp) */
  if (slot < 0 || slot >= im->nslots)
    return DT_ERR(DT_ERR_ARG, "cpu backend: activation set %d of %d", slot, im->nslots);
  cpu_acts_t *a = &im->acts[slot];
  if (B < 1 || T < 1 || B > be->B || T > be->T || (size_t)N > im->bt)
    return DT_ERR(DT_ERR_ARG, "cpu backend: forward with B=%d T=%d exceeds the capacity B=%d T=%d", B, T, be->B, be->T);
  if (im->first ? !inputs : !x_in)
    return DT_ERR(DT_ERR_ARG, "cpu backend: pipeline stage %d needs %s", lay->pp_rank,
                  im->first ? "input tokens" : "the previous stage's activations (x_in)");
  if (!im->last && !y_out)
    return DT_ERR(DT_ERR_ARG, "cpu backend: pipeline stage %d of %d needs y_out for the next stage", lay->pp_rank,
                  lay->pp);
  for (int i = 0; i < N; i++) {
    if (im->first && (inputs[i] < 0 || inputs[i] >= V))
      return DT_ERR(DT_ERR_DATA, "cpu backend: input token %d at position %d is outside [0, %d)", inputs[i], i, V);
    if (im->last && targets && (targets[i] < 0 || targets[i] >= V))
      return DT_ERR(DT_ERR_DATA, "cpu backend: target token %d at position %d is outside [0, %d)", targets[i], i, V);
  }
  if (im->tp > 1 && (!be->tp_comm || be->tp_comm->size != im->tp || be->tp_comm->rank != lay->tp_rank))
    return DT_ERR(DT_ERR_ARG, "cpu backend: the layout is tensor-parallel shard %d of %d but be->tp_comm is %s",
                  lay->tp_rank, im->tp, be->tp_comm ? "another group" : "not set");
  if (im->first) memcpy(a->inputs, inputs, (size_t)N * sizeof(int));
  if (targets) memcpy(a->targets, targets, (size_t)N * sizeof(int));
  a->B = B;
  a->T = T;
  a->have_fwd = 1;
  a->have_targets = targets != NULL;

  if (be->wparams != be->params) dt_prec_round_copy(be->wparams, be->params, lay->n_params, be->precision);
  const float *wte = be->wparams + lay->tensors[0].offset, *wpe = be->wparams + lay->tensors[1].offset;
  dt_status_t st = DT_OK;
  if (!im->first) {
    memcpy(a->encoded, x_in, (size_t)N * C * sizeof(float)); /* stored (rounded) by the previous stage */
  } else {
    if (im->tp > 1) DT_PROF(DT_PROF_ENCODER, st = tp_encoder_forward(be, a->encoded, inputs, wte, wpe, B, T, C));
    else DT_PROF(DT_PROF_ENCODER, dt_encoder_forward(a->encoded, inputs, wte, wpe, B, T, C));
    DT_TRY(st);
    STORE(a->encoded, N * C);
  }
  const float *x = a->encoded; /* (B,T,C) residual stream entering block l */
  for (int l = im->l0; l < im->l1; l++) {
    if (be->layer_hook) DT_TRY(be->layer_hook(be->hook_ctx, l, DT_HOOK_FWD));
    const cpu_block_t y = block_views(be, im, a, (size_t)(l - im->l0)); /* this stage's block index */
    DT_TRY(block_forward(be, &y, x, l, B, T));
    x = y.res3;
    if (be->layer_hook) DT_TRY(be->layer_hook(be->hook_ctx, l, DT_HOOK_FWD_DONE));
  }
  if (!im->last) { /* the residual stream goes on to the next stage */
    memcpy(y_out, x, (size_t)N * C * sizeof(float));
    return DT_OK;
  }
  const dt_tensor_t *lnfw = &lay->tensors[lay->n_tensors - 2], *lnfb = &lay->tensors[lay->n_tensors - 1];
  DT_PROF(DT_PROF_LAYERNORM, dt_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, be->wparams + lnfw->offset, be->wparams + lnfb->offset, N,
                       C));
  STORE(a->lnf, N * C);
  /* tied lm_head: logits = lnf wte^T */
  DT_PROF(DT_PROF_LMHEAD, dt_matmul_forward(a->logits, a->lnf, wte, NULL, N, C, Vpl));
  STORE(a->logits, (size_t)N * Vpl);
  a->logits_gone = 0;
  a->logits_gen = im->param_gen;
  if (targets) {
    double m = 0.0;
    if (im->tp > 1) DT_PROF(DT_PROF_XENT, st = tp_crossentropy_forward(be, a->losses, a->lse, a->logits, targets, N, &m));
    else DT_PROF(DT_PROF_XENT, m = dt_crossentropy_forward(a->losses, a->lse, a->logits, targets, N, V, Vpl));
    DT_TRY(st);
    if (loss) *loss = (float)m;
  }
  return DT_OK;
}

static dt_status_t cpu_forward(dt_backend_t *be, const int *inputs, const int *targets, int B, int T, float *loss) {
  cpu_impl_t *im = be->impl;
  if (!im->first || !im->last)
    return DT_ERR(DT_ERR_ARG, "cpu backend: forward of the whole model on pipeline stage %d of %d (stage_forward)",
                  be->lay->pp_rank, be->lay->pp);
  return cpu_stage_forward(be, 0, inputs, targets, NULL, B, T, loss, NULL);
}

static dt_status_t cpu_stage_backward(dt_backend_t *be, int slot, int accum, const float *dy, float *dx,
                                      dt_grad_ready_fn ready, void *ctx) {
  cpu_impl_t *im = be->impl;
  const dt_layout_t *lay = be->lay;
  const int L = lay->d.L, C = lay->d.C, V = lay->d.V;
  const int Cl = im->Cl, NHl = im->NHl, Vpl = im->Vpl, tp = im->tp; /* this rank's widths */
  if (slot < 0 || slot >= im->nslots)
    return DT_ERR(DT_ERR_ARG, "cpu backend: activation set %d of %d", slot, im->nslots);
  cpu_acts_t *a = &im->acts[slot];
  const int B = a->B, T = a->T, N = B * T;
  int nv = V - im->v0 < Vpl ? V - im->v0 : Vpl; /* real vocab columns among the local logits */
  if (!a->have_fwd || (im->last && !a->have_targets))
    return DT_ERR(DT_ERR_ARG, "cpu backend: backward needs a preceding forward with targets");
  if (accum < 1) return DT_ERR(DT_ERR_ARG, "cpu backend: backward with accum=%d (must be >= 1)", accum);
  if ((!im->last && !dy) || (!im->first && !dx))
    return DT_ERR(DT_ERR_ARG, "cpu backend: pipeline stage %d of %d needs %s", lay->pp_rank, lay->pp,
                  !dy ? "dy from the next stage" : "dx for the previous stage");

  const float *wte = be->wparams + lay->tensors[0].offset;
  float *dwte = be->grads + lay->tensors[0].offset, *dwpe = be->grads + lay->tensors[1].offset;
  const size_t nl = (size_t)(im->l1 - im->l0);
  const float *x_last = nl > 0 ? a->residual3 + (nl - 1) * im->btc : a->encoded;

  if (!im->last) {
    memcpy(a->dres, dy, (size_t)N * C * sizeof(float)); /* d loss / d (this stage's output) */
  } else {
    const dt_tensor_t *lnfw = &lay->tensors[lay->n_tensors - 2], *lnfb = &lay->tensors[lay->n_tensors - 1];
    /* loss = mean over B*T, divided by accum, times the loss scale (1 unless fp16); dlogits replace
     * the logits in place (one (B,T,Vp) buffer instead of two: 206 MB less at GPT-2 124M, B=4, T=256) */
    if (a->logits_gone) { /* a repeated backward: recompute the logits the first one consumed */
      if (im->param_gen != a->logits_gen)
        return DT_ERR(DT_ERR_ARG, "cpu backend: backward again after a parameter update needs a new forward");
      DT_PROF(DT_PROF_LMHEAD, dt_matmul_forward(a->logits, a->lnf, wte, NULL, N, C, Vpl));
      STORE(a->logits, (size_t)N * Vpl);
    }
    DT_PROF(DT_PROF_XENT, xent_backward_inplace(a->logits, a->lse, a->targets, be->loss_scale / ((float)N * accum), N, nv, Vpl, im->v0));
    STORE(a->logits, (size_t)N * Vpl);
    a->logits_gone = 1;
    DT_PROF(DT_PROF_LMHEAD, dt_matmul_backward(a->dtmp, dwte, NULL, a->logits, a->lnf, wte, N, C, Vpl));
    if (tp > 1) DT_TRY(tp_allreduce(be, a->dtmp, (size_t)N * C, DT_F32, DT_SUM));
    STORE(a->dtmp, N * C);
    DT_PROF(DT_PROF_LAYERNORM, dt_layernorm_backward(a->dres, be->grads + lnfw->offset, be->grads + lnfb->offset, NULL, a->dtmp, x_last,
                          be->wparams + lnfw->offset, a->lnf_mean, a->lnf_rstd, N, C));
    STORE(a->dres, N * C);
    if (ready) ready(ctx, lay->layer_begin[L + 1], lay->layer_begin[L + 2]);
  }

  for (int l = im->l1 - 1; l >= im->l0; l--) {
    if (be->layer_hook) DT_TRY(be->layer_hook(be->hook_ctx, l, DT_HOOK_BWD));
    const size_t j = (size_t)(l - im->l0);
    const float *x = j > 0 ? a->residual3 + (j - 1) * im->btc : a->encoded;
    const cpu_block_t y = block_views(be, im, a, j);
    if (be->recompute) DT_TRY(block_forward(be, &y, x, l, B, T)); /* the block's activations again, bitwise */
    const float *ln1 = y.ln1, *qkv = y.qkv, *atty = y.atty, *alse = y.alse;
    const float *res2 = y.res2, *ln2 = y.ln2, *fch = y.fch, *fchg = y.fchg;
    /* dres holds d loss / d residual3[l] */
    DT_PROF(DT_PROF_MATMUL, dt_conv1d_backward(a->dfch, G(be, l, DT_FCPROJW), G(be, l, DT_FCPROJB), a->dres, fchg, P(be, l, DT_FCPROJW), N,
                       4 * Cl, C));
    STORE(a->dfch, N * 4 * Cl);
    DT_PROF(DT_PROF_GELU, dt_gelu_backward(a->dfch, fch, a->dfch, (size_t)N * 4 * Cl));
    STORE(a->dfch, N * 4 * Cl);
    DT_PROF(DT_PROF_MATMUL, dt_conv1d_backward(a->dtmp, G(be, l, DT_FCW), G(be, l, DT_FCB), a->dfch, ln2, P(be, l, DT_FCW), N, C, 4 * Cl));
    if (tp > 1) DT_TRY(tp_allreduce(be, a->dtmp, (size_t)N * C, DT_F32, DT_SUM));
    STORE(a->dtmp, N * C);
    DT_PROF(DT_PROF_LAYERNORM, dt_layernorm_backward(a->dres, G(be, l, DT_LN2W), G(be, l, DT_LN2B), a->dres, a->dtmp, res2, P(be, l, DT_LN2W),
                          y.ln2_mean, y.ln2_rstd, N, C));
    STORE(a->dres, N * C);
    /* dres holds d loss / d residual2[l] */
    DT_PROF(DT_PROF_MATMUL, dt_conv1d_backward(a->dtmp, G(be, l, DT_ATTPROJW), G(be, l, DT_ATTPROJB), a->dres, atty, P(be, l, DT_ATTPROJW),
                       N, Cl, C));
    STORE(a->dtmp, N * Cl);
    DT_PROF(DT_PROF_ATTENTION, dt_attention_backward(a->dqkv, a->attscr, a->dtmp, qkv, alse, B, T, Cl, NHl, im->nthr));
    STORE(a->dqkv, N * 3 * Cl);
    DT_PROF(DT_PROF_MATMUL, dt_conv1d_backward(a->dtmp, G(be, l, DT_QKVW), G(be, l, DT_QKVB), a->dqkv, ln1, P(be, l, DT_QKVW), N, C, 3 * Cl));
    if (tp > 1) DT_TRY(tp_allreduce(be, a->dtmp, (size_t)N * C, DT_F32, DT_SUM));
    STORE(a->dtmp, N * C);
    DT_PROF(DT_PROF_LAYERNORM, dt_layernorm_backward(a->dres, G(be, l, DT_LN1W), G(be, l, DT_LN1B), a->dres, a->dtmp, x, P(be, l, DT_LN1W),
                          y.ln1_mean, y.ln1_rstd, N, C));
    STORE(a->dres, N * C);
    /* dres holds d loss / d (block l input) */
    if (ready) ready(ctx, lay->layer_begin[1 + l], lay->layer_begin[2 + l]);
    if (be->layer_hook) DT_TRY(be->layer_hook(be->hook_ctx, l, DT_HOOK_BWD_DONE));
  }
  if (!im->first) {
    memcpy(dx, a->dres, (size_t)N * C * sizeof(float)); /* d loss / d x_in, for the previous stage */
  } else {
    if (tp > 1) DT_PROF(DT_PROF_ENCODER, tp_encoder_backward(im, dwte, dwpe, a->dres, a->inputs, B, T, C));
    else DT_PROF(DT_PROF_ENCODER, dt_encoder_backward(dwte, dwpe, a->dres, a->inputs, B, T, C));
  }
  /* the embeddings group: wte + wpe on the first stage, the lm_head's copy of wte (final since
   * the lm_head backward above) on a last stage that is not the first, empty elsewhere */
  if (ready) ready(ctx, lay->layer_begin[0], lay->layer_begin[1]);
  return DT_OK;
}

static dt_status_t cpu_backward(dt_backend_t *be, int accum, dt_grad_ready_fn ready, void *ctx) {
  cpu_impl_t *im = be->impl;
  if (!im->first || !im->last)
    return DT_ERR(DT_ERR_ARG, "cpu backend: backward of the whole model on pipeline stage %d of %d (stage_backward)",
                  be->lay->pp_rank, be->lay->pp);
  return cpu_stage_backward(be, 0, accum, NULL, NULL, ready, ctx);
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

DT_CPU_VEC static double sumsq(const float *restrict g, long n) {
  double s = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
  for (long i = 0; i < n; i++) s += (double)g[i] * g[i];
  return s;
}

static dt_status_t grad_sumsq_impl(dt_backend_t *be, double *out) {
  const dt_layout_t *lay = be->lay;
  if (lay->tp <= 1 && lay->pp <= 1) { /* the optimizer range: the whole arena, or this rank's ZeRO shard */
    size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0;
    *out = sumsq(be->grads + lo, (long)dt_backend_opt_floats(be));
    return DT_OK;
  }
  /* tp > 1: shards summed over the tp group, replicated tensors (equal on every tp rank) once;
   * with ZeRO only the parts inside the optimizer range. pp > 1: this stage's tensors without the
   * tied copy of wte (the first stage counts wte; the trainer sums the stages) */
  size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0, hi = lo + dt_backend_opt_floats(be);
  double sh = 0.0, rep = 0.0;
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    size_t a = t->offset > lo ? t->offset : lo, z = t->offset + (size_t)t->rows * t->cols;
    if (z > hi) z = hi;
    if (a >= z || t->tied_copy) continue;
    double s = sumsq(be->grads + a, (long)(z - a));
    if (dt_tensor_sharded(t)) sh += s;
    else rep += s;
  }
  if (lay->tp > 1) DT_TRY(tp_allreduce(be, &sh, 1, DT_F64, DT_SUM));
  *out = sh + rep;
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
  ((cpu_impl_t *)be->impl)->param_gen++; /* cached logits no longer recomputable (lm_head section) */
  return DT_OK;
}

static dt_status_t cpu_grad_sumsq(dt_backend_t *be, double *out) {
  dt_status_t st;
  DT_PROF(DT_PROF_GRAD_SUMSQ, st = grad_sumsq_impl(be, out));
  return st;
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
  ((cpu_impl_t *)be->impl)->param_gen++; /* see cpu_logits_to_host */
  return DT_OK;
}

/* The last forward's logits. After a backward (which turned them into dlogits in place) they are
 * recomputed from the kept lnf activations, bitwise equal, as long as no parameter changed. */
static dt_status_t cpu_logits_to_host(dt_backend_t *be, float *dst) {
  cpu_impl_t *im = be->impl;
  const dt_dims_t *d = &be->lay->d;
  cpu_acts_t *a = &im->acts[0];
  if (!a->have_fwd) return DT_ERR(DT_ERR_ARG, "cpu backend: logits requested before any forward");
  if (im->tp > 1)
    return DT_ERR(DT_ERR_UNSUPPORTED, "cpu backend: logits_to_host with tensor parallelism (each rank holds Vp/tp columns)");
  if (!im->first || !im->last)
    return DT_ERR(DT_ERR_UNSUPPORTED, "cpu backend: logits_to_host with pipeline parallelism");
  if (!a->logits_gone) {
    memcpy(dst, a->logits, (size_t)a->B * a->T * d->Vp * sizeof(float));
    return DT_OK;
  }
  if (im->param_gen != a->logits_gen)
    return DT_ERR(DT_ERR_ARG, "cpu backend: logits requested after backward and a parameter update (run a forward first)");
  dt_matmul_forward(dst, a->lnf, be->wparams + be->lay->tensors[0].offset, NULL, a->B * a->T, d->C, d->Vp);
  STORE(dst, (size_t)a->B * a->T * d->Vp); /* as the forward stored them */
  return DT_OK;
}

/* Every CPU op has finished when it returns. */
static dt_status_t cpu_synchronize(dt_backend_t *be) {
  (void)be;
  return DT_OK;
}

const dt_backend_ops_t dt_backend_cpu = {
    .name = "cpu",
    .init = cpu_init,
    .free = cpu_free,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .zero_grad = cpu_zero_grad,
    .grad_sumsq = cpu_grad_sumsq,
    .adamw = cpu_adamw,
    .copy_to_host = cpu_copy_to_host,
    .copy_from_host = cpu_copy_from_host,
    .logits_to_host = cpu_logits_to_host,
    .set_precision = cpu_set_precision,
    .stage_forward = cpu_stage_forward,
    .stage_backward = cpu_stage_backward,
    .synchronize = cpu_synchronize,
};
