/* GPT-2's forward and backward, written once over the kernel table (gpt2.h, backend.h). The
 * activations of a stage live in one arena of backend memory carved into named views (llm.c's
 * ActivationTensors minus what can be recomputed in place); per-layer tensors are strided by the
 * capacity so smaller (B, T) reuse the same views.
 *
 * Tensor parallelism (Megatron-LM): with tp ranks (m->tp_comm) each rank holds the shards of
 * dt_layout_init_tp and runs the same per-layer code at its local widths Cl = C/tp, NHl = NH/tp,
 * 4Cl, Vpl = Vp/tp:
 *   c_attn, c_fc (column-parallel: (in, out) storage, a block of output columns): local outputs,
 *   no communication; attention over the local heads only (head size C/NH unchanged);
 *   attn.c_proj, mlp.c_proj (row-parallel, split along their input rows): a partial (B,T,C)
 *   product, all-reduced over tp, then + bias + residual (the replicated bias added once);
 *   embedding: each rank adds the wte rows it owns (zeros for others), all-reduce, + wpe;
 *   lm_head: local logits (B,T,Vpl); cross-entropy from all-reduced row max, sum of exponentials
 *   and target logit (no rank holds (B,T,Vp)).
 * Backward mirrors it: the input gradients of c_attn, c_fc and the lm_head (partial sums over this
 * rank's output columns) are all-reduced before their layernorm backward. Replicated parameters
 * (wpe, ln_1, ln_2, ln_f, the c_proj biases) get the same gradient on every tp rank: everything
 * they see is computed from all-reduced values or is one, and an all-reduce gives every rank the
 * same sum. The trainer checks that they stay bitwise equal (train.c).
 *
 * Mixed precision: each activation and activation gradient is rounded right after the op that
 * writes it: by the op itself where the kernel table says so (backend.h: its kernels round as
 * they store), else by STORE; forward reads a rounded copy of the parameters (the points are listed in
 * precision.h). Pipeline parallelism: a rank runs its stage's blocks [l0, l1) (local index
 * l - l0), the first stage embeds, the last one has ln_f, the lm_head and the loss. */
#include "gpt2_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kmath.h"
#include "precision.h"
#include "timer.h"

dt_profile_t dt_profile;
const char *const dt_prof_names[DT_PROF_N] = {"encoder", "layernorm", "matmul", "lm_head", "attention", "gelu",
                                               "residual", "crossentropy", "zero_grad", "grad_sumsq", "adamw",
                                               "conv", "conv_backward", "batchnorm", "relu", "pool"};
double dt_profile_now(void) { return dt_time_now(); }

/* Carve nslots sets of a stage with nl blocks (lnf..lse if `last`) and the shared scratch; with
 * base == NULL only count. Returns bytes: activations of esz bytes each, statistics floats, every
 * view aligned to DT_ALIGN floats. With recompute a set keeps of each block only its output
 * (residual3; the stage input is `encoded`), and one block's other activations (ln1 .. fch_gelu)
 * are scratch shared by all sets and blocks: backward recomputes them from the block's input. */
static size_t carve(acts_t *sets, int nslots, char *base, const dt_dims_t *d, int tp, int nl, int last, int B, int T,
                    int recompute, size_t att_state, size_t att_scratch, size_t esz) {
  size_t off = 0, L = (size_t)nl, bt = (size_t)B * T, C = d->C, Cl = C / tp;
  const size_t align = DT_ALIGN * sizeof(float);
  acts_t dummy, *a = &dummy;
#define TAKE_SZ(field, n, sz)                            \
  do {                                                   \
    size_t n_ = (size_t)(n) * (sz);                      \
    a->field = base && n_ ? (void *)(base + off) : NULL; \
    off += (n_ + align - 1) / align * align;             \
  } while (0)
#define TAKE(field, n) TAKE_SZ(field, n, esz)            /* activation storage */
#define TAKEF(field, n) TAKE_SZ(field, n, sizeof(float)) /* statistics and state */
#define TAKE_BLOCKS(n) /* the blocks' activations for n blocks */ \
  do {                                                            \
    TAKE(ln1, (n) * bt * C);                                      \
    TAKEF(ln1_mean, (n) * bt);                                    \
    TAKEF(ln1_rstd, (n) * bt);                                    \
    TAKE(qkv, (n) * bt * 3 * Cl);                                 \
    TAKE(atty, (n) * bt * Cl);                                    \
    TAKEF(att, (n) * att_state);                                  \
    TAKE(residual2, (n) * bt * C);                                \
    TAKE(ln2, (n) * bt * C);                                      \
    TAKEF(ln2_mean, (n) * bt);                                    \
    TAKEF(ln2_rstd, (n) * bt);                                    \
    TAKE(fch, (n) * bt * 4 * Cl);                                 \
    TAKE(fch_gelu, (n) * bt * 4 * Cl);                            \
  } while (0)
  for (int k = 0; k < nslots; k++) {
    a = sets ? &sets[k] : &dummy;
    TAKE(encoded, bt * C);
    if (!recompute) TAKE_BLOCKS(L);
    TAKE(residual3, L * bt * C);
    TAKE(lnf, last ? bt * C : 0);
    TAKEF(lnf_mean, last ? bt : 0);
    TAKEF(lnf_rstd, last ? bt : 0);
    TAKE(logits, last ? bt * (d->Vp / tp) : 0);
    TAKEF(losses, last ? bt : 0);
    TAKEF(lse, last ? bt : 0);
  }
  a = sets ? &sets[0] : &dummy; /* the scratch, shared by every set */
  if (recompute && L > 0) TAKE_BLOCKS((size_t)1);
  TAKE(dres, bt * C);
  TAKE(dtmp, bt * C);
  TAKE(dqkv, bt * 3 * Cl);
  TAKE(dfch, bt * 4 * Cl);
  TAKEF(attscr, att_scratch);
  TAKEF(xtmp, tp > 1 ? 2 * bt : 0);
  TAKEF(tpacc, tp > 1 && esz != sizeof(float) ? bt * C : 0);
#undef TAKE_BLOCKS
#undef TAKEF
#undef TAKE
#undef TAKE_SZ
  for (int k = 1; sets && k < nslots; k++) {
    acts_t *b = &sets[k];
    b->dres = a->dres, b->dtmp = a->dtmp, b->dqkv = a->dqkv, b->dfch = a->dfch, b->attscr = a->attscr;
    b->xtmp = a->xtmp, b->tpacc = a->tpacc;
    if (recompute) {
      b->ln1 = a->ln1, b->ln1_mean = a->ln1_mean, b->ln1_rstd = a->ln1_rstd, b->qkv = a->qkv, b->atty = a->atty;
      b->att = a->att, b->residual2 = a->residual2, b->ln2 = a->ln2, b->ln2_mean = a->ln2_mean;
      b->ln2_rstd = a->ln2_rstd, b->fch = a->fch, b->fch_gelu = a->fch_gelu;
    }
  }
  return off;
}

size_t dt_gpt2_activation_floats(const dt_dims_t *d, int tp, int nl, int last, int slots, int B, int T, int recompute,
                                 size_t att_state, size_t att_scratch) {
  return dt_gpt2_activation_bytes(d, tp, nl, last, slots, B, T, recompute, att_state, att_scratch, sizeof(float)) /
         sizeof(float);
}

size_t dt_gpt2_activation_bytes(const dt_dims_t *d, int tp, int nl, int last, int slots, int B, int T, int recompute,
                                size_t att_state, size_t att_scratch, int act_bytes) {
  return carve(NULL, slots, NULL, d, tp, nl, last, B, T, recompute, att_state, att_scratch, (size_t)act_bytes);
}

void dt_gpt2_free(dt_gpt2_t *m) {
  dt_gpt2_state_t *s = m->st;
  if (s) {
    dt_backend_t *be = m->be;
    if (s->arena) be->k->release(be, s->arena);
    if (s->ints) be->k->release(be, s->ints);
    if (s->loss) be->k->release(be, s->loss);
    free(s->h_ints);
    free(s->acts);
    free(s);
  }
  m->st = NULL;
}

dt_status_t dt_gpt2_init(dt_gpt2_t *m, dt_backend_t *be, int slots, int recompute) {
  memset(m, 0, sizeof *m);
  const dt_layout_t *lay = be->lay;
  m->be = be;
  m->slots = slots > 0 ? slots : 1;
  m->recompute = recompute;
  dt_gpt2_state_t *s = calloc(1, sizeof *s);
  if (!s) return DT_ERR(DT_ERR_NOMEM, "gpt2: out of memory");
  m->st = s;
  const int tp = lay->tp > 1 ? lay->tp : 1;
  s->tp = tp;
  s->Cl = lay->d.C / tp;
  s->NHl = lay->d.NH / tp;
  s->Vpl = lay->d.Vp / tp;
  s->v0 = lay->tp_rank * s->Vpl;
  s->bt = (size_t)be->B * be->T;
  s->btc = s->bt * lay->d.C;
  s->btcl = s->bt * s->Cl;
  dt_layout_stage(lay, &s->l0, &s->l1, &s->first, &s->last);
  s->esz = (size_t)be->act_bytes;
  if (s->esz != 2 && s->esz != 4) {
    dt_gpt2_free(m);
    return DT_ERR(DT_ERR_UNSUPPORTED, "gpt2: %s backend with %d-byte activations", be->ops->name, be->act_bytes);
  }
  size_t att_scratch = 0;
  be->k->attention_floats(be, be->B, be->T, s->NHl, &s->att, &att_scratch);
  const int nl = s->l1 - s->l0;
  size_t nact = carve(NULL, m->slots, NULL, &lay->d, tp, nl, s->last, be->B, be->T, recompute, s->att, att_scratch,
                      s->esz);
  s->acts = calloc((size_t)m->slots, sizeof *s->acts);
  s->h_ints = calloc((size_t)m->slots * s->bt, sizeof(int));
  dt_status_t st = s->acts && s->h_ints ? DT_OK : DT_ERR(DT_ERR_NOMEM, "gpt2: out of memory");
  if (st == DT_OK) st = be->k->alloc(be, &s->arena, nact);
  if (st == DT_OK) st = be->k->alloc(be, (void **)&s->ints, 2 * (size_t)m->slots * s->bt * sizeof(int));
  if (st == DT_OK) st = be->k->alloc(be, (void **)&s->loss, 2 * sizeof(double));
  if (st != DT_OK) {
    dt_gpt2_free(m);
    return st;
  }
  carve(s->acts, m->slots, s->arena, &lay->d, tp, nl, s->last, be->B, be->T, recompute, s->att, att_scratch, s->esz);
  for (int k = 0; k < m->slots; k++) {
    s->acts[k].inputs = s->ints + 2 * (size_t)k * s->bt;
    s->acts[k].targets = s->acts[k].inputs + s->bt;
    s->acts[k].h_inputs = s->h_ints + (size_t)k * s->bt;
  }
  return DT_OK;
}


/* Parameter views read by forward/backward: the working copy (the master itself in fp32), in
 * activation storage. */
static const dt_act_t *W(const dt_backend_t *be, size_t off) {
  return (const char *)be->wparams + off * (size_t)be->act_bytes;
}
static const dt_act_t *P(const dt_backend_t *be, int l, int which) {
  return W(be, dt_layout_block(be->lay, l, which)->offset);
}
static float *G(const dt_backend_t *be, int l, int which) { return be->grads + dt_layout_block(be->lay, l, which)->offset; }

static dt_status_t tp_allreduce(dt_gpt2_t *m, void *x, size_t n, dt_dtype_t ty, dt_redop_t op) {
  return m->tp_comm->ops->allreduce(m->tp_comm, x, x, n, ty, op, m->be->stream, NULL);
}

/* Tensor parallelism sums partial results in fp32: their fp32 buffer for out, out itself in
 * float storage (all-reduced in place, as before 16-bit storage) */
static float *tp_acc(const dt_gpt2_t *m, dt_act_t *out) {
  return m->st->esz == sizeof(float) ? (float *)out : m->st->acts[0].tpacc;
}

/* out = resid + inp W + bias; W (IC, OC) (Conv1D), local rows of the global input dim when tp > 1:
 * the partial products in fp32, all-reduced, then the epilogue stores once. */
static dt_status_t proj_residual(dt_gpt2_t *m, dt_act_t *out, const dt_act_t *inp, const dt_act_t *w,
                                 const dt_act_t *bias, const dt_act_t *resid, int N, int IC, int OC) {
  dt_backend_t *be = m->be;
  if (m->st->tp == 1) return be->k->linear_forward(be, out, inp, w, 1, bias, resid, N, IC, OC);
  float *acc = tp_acc(m, out);
  DT_TRY(be->k->linear_forward32(be, acc, inp, w, 1, N, IC, OC));
  DT_TRY(tp_allreduce(m, acc, (size_t)N * OC, DT_F32, DT_SUM));
  return be->k->epilogue(be, out, acc, bias, resid, N, OC);
}

/* dinp = d out / d inp of a column-parallel product (c_attn, c_fc, the lm_head), stored: with tp > 1
 * a partial sum over this rank's output columns, all-reduced in fp32 first. Weight gradients as
 * linear_backward. */
static dt_status_t linear_backward_tp(dt_gpt2_t *m, dt_act_t *dinp, float *dw, float *db, const dt_act_t *dout,
                                      const dt_act_t *inp, const dt_act_t *w, int w_in_out, int N, int C, int OC) {
  dt_backend_t *be = m->be;
  if (m->st->tp == 1) {
    RUN(w_in_out ? DT_PROF_MATMUL : DT_PROF_LMHEAD,
        be->k->linear_backward(be, dinp, dw, db, dout, inp, w, w_in_out, N, C, OC));
    STORE(dinp, (size_t)N * C);
    return DT_OK;
  }
  float *acc = tp_acc(m, dinp);
  RUN(w_in_out ? DT_PROF_MATMUL : DT_PROF_LMHEAD,
      be->k->linear_backward32(be, acc, dw, db, dout, inp, w, w_in_out, N, C, OC));
  DT_TRY(tp_allreduce(m, acc, (size_t)N * C, DT_F32, DT_SUM));
  return be->k->epilogue(be, dinp, acc, NULL, NULL, N, C);
}

/* The embedding (vocab-parallel with tp > 1: the rows owned here, zeros else, summed, + wpe),
 * positions from pos. */
dt_status_t dt_gpt2__encoder_forward(dt_gpt2_t *m, dt_act_t *out, const int *inp, int B, int T, int pos) {
  dt_backend_t *be = m->be;
  const dt_gpt2_state_t *s = m->st;
  const int C = be->lay->d.C;
  const dt_act_t *wte = W(be, be->lay->tensors[0].offset);
  const dt_act_t *wpe = W(be, be->lay->tensors[1].offset + (size_t)pos * C);
  if (s->tp == 1) return be->k->encoder_forward(be, out, inp, wte, wpe, B, T, C, 0, s->Vpl);
  DT_TRY(be->k->encoder_forward(be, out, inp, wte, NULL, B, T, C, s->v0, s->Vpl)); /* rows here, zeros else */
  float *acc = tp_acc(m, out);
  DT_TRY(be->k->widen(be, acc, out, (size_t)B * T * C));
  DT_TRY(tp_allreduce(m, acc, (size_t)B * T * C, DT_F32, DT_SUM));
  return be->k->epilogue(be, out, acc, wpe, NULL, B, T * C);
}

block_t dt_gpt2__block_views(const dt_gpt2_t *m, const acts_t *a, size_t j) {
  const dt_gpt2_state_t *s = m->st;
  const size_t k = m->recompute ? 0 : j, o = k * s->btc, ol = k * s->btcl, os = k * s->bt;
  return (block_t){.ln1 = ACT(s, a->ln1, o),
                   .ln1_mean = a->ln1_mean + os,
                   .ln1_rstd = a->ln1_rstd + os,
                   .qkv = ACT(s, a->qkv, 3 * ol),
                   .atty = ACT(s, a->atty, ol),
                   .att = a->att + k * s->att,
                   .res2 = ACT(s, a->residual2, o),
                   .ln2 = ACT(s, a->ln2, o),
                   .ln2_mean = a->ln2_mean + os,
                   .ln2_rstd = a->ln2_rstd + os,
                   .fch = ACT(s, a->fch, 4 * ol),
                   .fchg = ACT(s, a->fch_gelu, 4 * ol),
                   .res3 = ACT(s, a->residual3, j * s->btc)};
}

/* Forward of block l from its input x into y (also backward's recomputation: the same code on
 * the same input gives bitwise the same activations; and decoding, where kv replaces the
 * attention over the T rows by one over the layer's key/value cache). */
dt_status_t dt_gpt2__block_forward(dt_gpt2_t *m, const block_t *y, const dt_act_t *x, int l, int B, int T,
                                   const kv_layer_t *kv) {
  dt_backend_t *be = m->be;
  const dt_kernels_t *k = be->k;
  const int C = be->lay->d.C, N = B * T, Cl = m->st->Cl, NHl = m->st->NHl;
  float *scr = m->st->acts[0].attscr; /* the shared attention scratch */
  RUN(DT_PROF_LAYERNORM, k->layernorm_forward(be, y->ln1, y->ln1_mean, y->ln1_rstd, x, P(be, l, DT_LN1W),
                                              P(be, l, DT_LN1B), N, C));
  RUN(DT_PROF_MATMUL, k->linear_forward(be, y->qkv, y->ln1, P(be, l, DT_QKVW), 1, P(be, l, DT_QKVB), NULL, N, C, 3 * Cl));
  if (kv) RUN(DT_PROF_ATTENTION, k->attention_decode(be, y->atty, kv->k, kv->v, y->qkv, B, kv->pos, T, kv->Tmax, Cl, NHl));
  else RUN(DT_PROF_ATTENTION, k->attention_forward(be, y->atty, y->att, scr, y->qkv, B, T, Cl, NHl));
  RUN(DT_PROF_MATMUL, proj_residual(m, y->res2, y->atty, P(be, l, DT_ATTPROJW), P(be, l, DT_ATTPROJB), x, N, Cl, C));
  RUN(DT_PROF_LAYERNORM, k->layernorm_forward(be, y->ln2, y->ln2_mean, y->ln2_rstd, y->res2, P(be, l, DT_LN2W),
                                              P(be, l, DT_LN2B), N, C));
  RUN(DT_PROF_MATMUL, k->linear_forward(be, y->fch, y->ln2, P(be, l, DT_FCW), 1, P(be, l, DT_FCB), NULL, N, C, 4 * Cl));
  RUN(DT_PROF_GELU, k->gelu_forward(be, y->fchg, y->fch, (size_t)N * 4 * Cl));
  RUN(DT_PROF_MATMUL,
      proj_residual(m, y->res3, y->fchg, P(be, l, DT_FCPROJW), P(be, l, DT_FCPROJB), y->res2, N, 4 * Cl, C));
  return DT_OK;
}

/* The vocab-parallel cross-entropy: the pieces of dt_crossentropy_forward with the row max, the
 * sum of exponentials and the target logit all-reduced over tp. */
static dt_status_t tp_crossentropy_forward(dt_gpt2_t *m, acts_t *a, const int *targets, int N, double *loss_sum) {
  dt_backend_t *be = m->be;
  const dt_gpt2_state_t *s = m->st;
  int nv = be->lay->d.V - s->v0 < s->Vpl ? be->lay->d.V - s->v0 : s->Vpl; /* real vocab columns here */
  if (nv < 0) nv = 0;
  double *sum = (double *)a->xtmp;
  DT_TRY(be->k->xent_max(be, a->lse, a->logits, N, nv, s->Vpl));
  DT_TRY(tp_allreduce(m, a->lse, (size_t)N, DT_F32, DT_MAX));
  DT_TRY(be->k->xent_sumexp(be, sum, a->losses, a->logits, a->lse, targets, N, nv, s->Vpl, s->v0));
  DT_TRY(tp_allreduce(m, sum, (size_t)N, DT_F64, DT_SUM));
  DT_TRY(tp_allreduce(m, a->losses, (size_t)N, DT_F32, DT_SUM));
  return be->k->xent_finish(be, a->lse, a->losses, sum, N, loss_sum);
}

/* ln_f, the tied lm_head (logits = lnf wte^T) and, with targets, the loss. */
dt_status_t dt_gpt2__head_forward(dt_gpt2_t *m, acts_t *a, const dt_act_t *x, int N, float *loss) {
  dt_backend_t *be = m->be;
  const dt_layout_t *lay = be->lay;
  const int C = lay->d.C, Vpl = m->st->Vpl;
  const dt_act_t *wte = W(be, lay->tensors[0].offset);
  const dt_tensor_t *lnfw = &lay->tensors[lay->n_tensors - 2], *lnfb = &lay->tensors[lay->n_tensors - 1];
  RUN(DT_PROF_LAYERNORM, be->k->layernorm_forward(be, a->lnf, a->lnf_mean, a->lnf_rstd, x, W(be, lnfw->offset),
                                                  W(be, lnfb->offset), N, C));
  RUN(DT_PROF_LMHEAD, be->k->linear_forward(be, a->logits, a->lnf, wte, 0, NULL, NULL, N, C, Vpl));
  STORE(a->logits, (size_t)N * Vpl);
  a->logits_gone = 0;
  a->logits_gen = be->param_gen;
  if (!a->have_targets) return DT_OK;
  double mean = 0.0, *acc = m->st->loss + (loss != NULL); /* [1]: this forward's alone, read now */
  if (loss) DT_TRY(be->k->upload(be, acc, &mean, sizeof mean));
  if (m->st->tp > 1) RUN(DT_PROF_XENT, tp_crossentropy_forward(m, a, a->targets, N, acc));
  else RUN(DT_PROF_XENT, be->k->crossentropy_forward(be, a->losses, a->lse, a->logits, a->targets, N, lay->d.V, Vpl, acc));
  if (!loss) return DT_OK;
  DT_TRY(be->k->download(be, &mean, acc, sizeof mean));
  *loss = (float)mean;
  return DT_OK;
}

dt_status_t dt_gpt2_loss_sum(dt_gpt2_t *m, double *sum_host) {
  dt_backend_t *be = m->be;
  const double zero = 0.0;
  *sum_host = 0.0;
  if (!m->st->last) return DT_OK;
  DT_TRY(be->k->download(be, sum_host, m->st->loss, sizeof *sum_host));
  return be->k->upload(be, m->st->loss, &zero, sizeof zero);
}

/* The arguments of a stage's forward, checked; the batch copied into set `slot`. */
static dt_status_t forward_begin(dt_gpt2_t *m, int slot, const int *inputs, const int *targets, const dt_act_t *x_in,
                                 int B, int T, dt_act_t *y_out) {
  dt_backend_t *be = m->be;
  const dt_layout_t *lay = be->lay;
  dt_gpt2_state_t *s = m->st;
  const int V = lay->d.V, N = B * T;
  if (slot < 0 || slot >= m->slots) return DT_ERR(DT_ERR_ARG, "gpt2: activation set %d of %d", slot, m->slots);
  acts_t *a = &s->acts[slot];
  if (B < 1 || T < 1 || B > be->B || T > be->T || (size_t)N > s->bt)
    return DT_ERR(DT_ERR_ARG, "gpt2: forward with B=%d T=%d exceeds the capacity B=%d T=%d", B, T, be->B, be->T);
  if (s->first ? !inputs : !x_in)
    return DT_ERR(DT_ERR_ARG, "gpt2: pipeline stage %d needs %s", lay->pp_rank,
                  s->first ? "input tokens" : "the previous stage's activations (x_in)");
  if (!s->last && !y_out)
    return DT_ERR(DT_ERR_ARG, "gpt2: pipeline stage %d of %d needs y_out for the next stage", lay->pp_rank, lay->pp);
  for (int i = 0; i < N; i++) {
    if (s->first && (inputs[i] < 0 || inputs[i] >= V))
      return DT_ERR(DT_ERR_DATA, "gpt2: input token %d at position %d is outside [0, %d)", inputs[i], i, V);
    if (s->last && targets && (targets[i] < 0 || targets[i] >= V))
      return DT_ERR(DT_ERR_DATA, "gpt2: target token %d at position %d is outside [0, %d)", targets[i], i, V);
  }
  if (s->tp > 1 && (!m->tp_comm || m->tp_comm->size != s->tp || m->tp_comm->rank != lay->tp_rank))
    return DT_ERR(DT_ERR_ARG, "gpt2: the layout is tensor-parallel shard %d of %d but tp_comm is %s", lay->tp_rank,
                  s->tp, m->tp_comm ? "another group" : "not set");
  if (s->first) {
    memcpy(a->h_inputs, inputs, (size_t)N * sizeof(int));
    DT_TRY(be->k->upload(be, a->inputs, inputs, (size_t)N * sizeof(int)));
  }
  if (targets) DT_TRY(be->k->upload(be, a->targets, targets, (size_t)N * sizeof(int)));
  a->B = B;
  a->T = T;
  a->have_fwd = 1;
  a->have_targets = targets != NULL;
  return DT_OK;
}

dt_status_t dt_gpt2_stage_forward(dt_gpt2_t *m, int slot, const int *inputs, const int *targets, const dt_act_t *x_in,
                                  int B, int T, float *loss, dt_act_t *y_out) {
  dt_backend_t *be = m->be;
  DT_TRY(forward_begin(m, slot, inputs, targets, x_in, B, T, y_out));
  dt_gpt2_state_t *s = m->st;
  acts_t *a = &s->acts[slot];
  const int N = B * T, C = be->lay->d.C;
  if (be->wparams != be->params && !be->wparams_by_sync)
    DT_TRY(be->k->round_copy(be, be->wparams, be->params, be->lay->n_params));
  if (!s->first) {
    DT_TRY(be->k->copy(be, a->encoded, x_in, (size_t)N * C * s->esz)); /* stored (rounded) by the previous stage */
  } else {
    RUN(DT_PROF_ENCODER, dt_gpt2__encoder_forward(m, a->encoded, a->inputs, B, T, 0));
    STORE(a->encoded, N * C);
  }
  const dt_act_t *x = a->encoded; /* (B,T,C) residual stream entering block l */
  for (int l = s->l0; l < s->l1; l++) {
    if (m->layer_hook) DT_TRY(m->layer_hook(m->hook_ctx, l, DT_HOOK_FWD));
    const block_t y = dt_gpt2__block_views(m, a, (size_t)(l - s->l0)); /* this stage's block index */
    DT_TRY(dt_gpt2__block_forward(m, &y, x, l, B, T, NULL));
    x = y.res3;
    if (m->layer_hook) DT_TRY(m->layer_hook(m->hook_ctx, l, DT_HOOK_FWD_DONE));
  }
  if (!s->last) return be->k->copy(be, y_out, x, (size_t)N * C * s->esz); /* on to the next stage */
  return dt_gpt2__head_forward(m, a, x, N, loss);
}

dt_status_t dt_gpt2_forward(dt_gpt2_t *m, const int *inputs, const int *targets, int B, int T, float *loss) {
  if (!m->st->first || !m->st->last)
    return DT_ERR(DT_ERR_ARG, "gpt2: forward of the whole model on pipeline stage %d of %d (stage_forward)",
                  m->be->lay->pp_rank, m->be->lay->pp);
  return dt_gpt2_stage_forward(m, 0, inputs, targets, NULL, B, T, loss, NULL);
}

/* Gradient group g is final: the backend orders communication after it, then ready(). */
static dt_status_t group_ready(dt_gpt2_t *m, int g, dt_grad_ready_fn ready, void *ctx) {
  if (!ready) return DT_OK;
  DT_TRY(m->be->k->grads_ready(m->be, g));
  ready(ctx, m->be->lay->layer_begin[g], m->be->lay->layer_begin[g + 1]);
  return DT_OK;
}

/* The loss, the lm_head and ln_f backward into dres = d loss / d (the last block's output). The
 * loss is the mean over B*T, divided by accum, times the loss scale (1 unless fp16); dlogits
 * replace the logits in place (one (B,T,Vp) buffer instead of two: 206 MB less at GPT-2 124M,
 * B=4, T=256). */
static dt_status_t head_backward(dt_gpt2_t *m, acts_t *a, const dt_act_t *x_last, int accum) {
  dt_backend_t *be = m->be;
  const dt_kernels_t *k = be->k;
  const dt_layout_t *lay = be->lay;
  const dt_gpt2_state_t *s = m->st;
  const int C = lay->d.C, V = lay->d.V, Vpl = s->Vpl, N = a->B * a->T;
  const int nv = V - s->v0 < Vpl ? V - s->v0 : Vpl; /* real vocab columns among the local logits */
  const dt_act_t *wte = W(be, lay->tensors[0].offset);
  float *dwte = be->grads + lay->tensors[0].offset;
  const dt_tensor_t *lnfw = &lay->tensors[lay->n_tensors - 2], *lnfb = &lay->tensors[lay->n_tensors - 1];
  if (a->logits_gone) { /* a repeated backward: recompute the logits the first one consumed */
    if (be->param_gen != a->logits_gen)
      return DT_ERR(DT_ERR_ARG, "gpt2: backward again after a parameter update needs a new forward");
    RUN(DT_PROF_LMHEAD, k->linear_forward(be, a->logits, a->lnf, wte, 0, NULL, NULL, N, C, Vpl));
    STORE(a->logits, (size_t)N * Vpl);
  }
  RUN(DT_PROF_XENT, k->crossentropy_backward(be, a->logits, a->lse, a->targets, be->loss_scale / ((float)N * accum), N,
                                             nv, Vpl, s->v0));
  a->logits_gone = 1;
  DT_TRY(linear_backward_tp(m, a->dtmp, dwte, NULL, a->logits, a->lnf, wte, 0, N, C, Vpl));
  RUN(DT_PROF_LAYERNORM, k->layernorm_backward(be, a->dres, be->grads + lnfw->offset, be->grads + lnfb->offset, NULL,
                                               a->dtmp, x_last, W(be, lnfw->offset), a->lnf_mean, a->lnf_rstd,
                                               N, C));
  return DT_OK;
}

/* Backward of block l with input x: dres holds d loss / d residual3[l] on entry and d loss / d x
 * on return. */
static dt_status_t block_backward(dt_gpt2_t *m, acts_t *a, const block_t *y, const dt_act_t *x, int l) {
  dt_backend_t *be = m->be;
  const dt_kernels_t *k = be->k;
  const dt_gpt2_state_t *s = m->st;
  const int B = a->B, T = a->T, N = B * T, C = be->lay->d.C, Cl = s->Cl, NHl = s->NHl;
  RUN(DT_PROF_MATMUL, k->linear_backward(be, a->dfch, G(be, l, DT_FCPROJW), G(be, l, DT_FCPROJB), a->dres, y->fchg,
                                         P(be, l, DT_FCPROJW), 1, N, 4 * Cl, C));
  STORE(a->dfch, N * 4 * Cl);
  RUN(DT_PROF_GELU, k->gelu_backward(be, a->dfch, y->fch, a->dfch, (size_t)N * 4 * Cl));
  DT_TRY(linear_backward_tp(m, a->dtmp, G(be, l, DT_FCW), G(be, l, DT_FCB), a->dfch, y->ln2, P(be, l, DT_FCW), 1, N,
                            C, 4 * Cl));
  RUN(DT_PROF_LAYERNORM, k->layernorm_backward(be, a->dres, G(be, l, DT_LN2W), G(be, l, DT_LN2B), a->dres, a->dtmp,
                                               y->res2, P(be, l, DT_LN2W), y->ln2_mean, y->ln2_rstd, N, C));
  /* dres holds d loss / d residual2[l] */
  RUN(DT_PROF_MATMUL, k->linear_backward(be, a->dtmp, G(be, l, DT_ATTPROJW), G(be, l, DT_ATTPROJB), a->dres, y->atty,
                                         P(be, l, DT_ATTPROJW), 1, N, Cl, C));
  STORE(a->dtmp, N * Cl);
  RUN(DT_PROF_ATTENTION, k->attention_backward(be, a->dqkv, a->attscr, a->dtmp, y->atty, y->qkv, y->att, B, T, Cl,
                                                     NHl));
  DT_TRY(linear_backward_tp(m, a->dtmp, G(be, l, DT_QKVW), G(be, l, DT_QKVB), a->dqkv, y->ln1, P(be, l, DT_QKVW), 1,
                            N, C, 3 * Cl));
  RUN(DT_PROF_LAYERNORM, k->layernorm_backward(be, a->dres, G(be, l, DT_LN1W), G(be, l, DT_LN1B), a->dres, a->dtmp, x,
                                               P(be, l, DT_LN1W), y->ln1_mean, y->ln1_rstd, N, C));
  return DT_OK;
}

dt_status_t dt_gpt2_stage_backward(dt_gpt2_t *m, int slot, int accum, const dt_act_t *dy, dt_act_t *dx,
                                   dt_grad_ready_fn ready, void *ctx) {
  dt_backend_t *be = m->be;
  const dt_layout_t *lay = be->lay;
  dt_gpt2_state_t *s = m->st;
  if (slot < 0 || slot >= m->slots) return DT_ERR(DT_ERR_ARG, "gpt2: activation set %d of %d", slot, m->slots);
  acts_t *a = &s->acts[slot];
  const int B = a->B, T = a->T, N = B * T, C = lay->d.C, L = lay->d.L;
  if (!a->have_fwd || (s->last && !a->have_targets))
    return DT_ERR(DT_ERR_ARG, "gpt2: backward needs a preceding forward with targets");
  if (accum < 1) return DT_ERR(DT_ERR_ARG, "gpt2: backward with accum=%d (must be >= 1)", accum);
  if ((!s->last && !dy) || (!s->first && !dx))
    return DT_ERR(DT_ERR_ARG, "gpt2: pipeline stage %d of %d needs %s", lay->pp_rank, lay->pp,
                  !dy ? "dy from the next stage" : "dx for the previous stage");
  const size_t nl = (size_t)(s->l1 - s->l0);
  if (!s->last) { /* d loss / d (this stage's output) */
    DT_TRY(be->k->copy(be, a->dres, dy, (size_t)N * C * s->esz));
  } else {
    DT_TRY(head_backward(m, a, nl > 0 ? ACT(s, a->residual3, (nl - 1) * s->btc) : a->encoded, accum));
    DT_TRY(group_ready(m, L + 1, ready, ctx));
  }
  for (int l = s->l1 - 1; l >= s->l0; l--) {
    if (m->layer_hook) DT_TRY(m->layer_hook(m->hook_ctx, l, DT_HOOK_BWD));
    const size_t j = (size_t)(l - s->l0);
    const dt_act_t *x = j > 0 ? ACT(s, a->residual3, (j - 1) * s->btc) : a->encoded;
    const block_t y = dt_gpt2__block_views(m, a, j);
    if (m->recompute) DT_TRY(dt_gpt2__block_forward(m, &y, x, l, B, T, NULL)); /* the block's activations again, bitwise */
    DT_TRY(block_backward(m, a, &y, x, l));
    /* dres holds d loss / d (block l input) */
    DT_TRY(group_ready(m, 1 + l, ready, ctx));
    if (m->layer_hook) DT_TRY(m->layer_hook(m->hook_ctx, l, DT_HOOK_BWD_DONE));
  }
  if (!s->first) {
    DT_TRY(be->k->copy(be, dx, a->dres, (size_t)N * C * s->esz)); /* d loss / d x_in, for the previous stage */
  } else {
    float *dwte = be->grads + lay->tensors[0].offset, *dwpe = be->grads + lay->tensors[1].offset;
    RUN(DT_PROF_ENCODER, be->k->encoder_backward(be, dwte, dwpe, a->dres, a->inputs, a->h_inputs, B, T, C, s->v0, s->Vpl));
  }
  /* the embeddings group: wte + wpe on the first stage, the lm_head's copy of wte (final since
   * the lm_head backward above) on a last stage that is not the first, empty elsewhere */
  return group_ready(m, 0, ready, ctx);
}

dt_status_t dt_gpt2_backward(dt_gpt2_t *m, int accum, dt_grad_ready_fn ready, void *ctx) {
  if (!m->st->first || !m->st->last)
    return DT_ERR(DT_ERR_ARG, "gpt2: backward of the whole model on pipeline stage %d of %d (stage_backward)",
                  m->be->lay->pp_rank, m->be->lay->pp);
  return dt_gpt2_stage_backward(m, 0, accum, NULL, NULL, ready, ctx);
}

dt_status_t dt_gpt2_logits_to_host(dt_gpt2_t *m, float *dst) {
  dt_backend_t *be = m->be;
  const dt_dims_t *d = &be->lay->d;
  acts_t *a = &m->st->acts[0];
  if (!a->have_fwd) return DT_ERR(DT_ERR_ARG, "gpt2: logits requested before any forward");
  if (m->st->tp > 1)
    return DT_ERR(DT_ERR_UNSUPPORTED, "gpt2: logits_to_host with tensor parallelism (each rank holds Vp/tp columns)");
  if (!m->st->first || !m->st->last) return DT_ERR(DT_ERR_UNSUPPORTED, "gpt2: logits_to_host with pipeline parallelism");
  const size_t n = (size_t)a->B * a->T * d->Vp;
  if (a->logits_gone) { /* recomputed from the kept lnf as the forward stored them (into the
                         * logits buffer, which stays "gone": a parameter update may follow) */
    if (be->param_gen != a->logits_gen)
      return DT_ERR(DT_ERR_ARG, "gpt2: logits requested after backward and a parameter update (run a forward first)");
    DT_TRY(be->k->linear_forward(be, a->logits, a->lnf, W(be, be->lay->tensors[0].offset), 0, NULL, NULL,
                                 a->B * a->T, d->C, d->Vp));
    STORE(a->logits, n);
  }
  return dt_gpt2__act_to_host(m, dst, a->logits, n);
}

dt_status_t dt_gpt2__act_to_host(dt_gpt2_t *m, float *dst, const dt_act_t *src, size_t n) {
  dt_backend_t *be = m->be;
  if (m->st->esz == sizeof(float)) return be->k->download(be, dst, src, n * sizeof(float));
  uint16_t *h = malloc(n * sizeof *h);
  if (!h) return DT_ERR(DT_ERR_NOMEM, "gpt2: out of memory");
  dt_status_t st = be->k->download(be, h, src, n * sizeof *h);
  const int fp16 = be->precision == DT_PREC_FP16;
  for (size_t i = 0; st == DT_OK && i < n; i++) dst[i] = dt_from16(h[i], fp16);
  free(h);
  return st;
}

dt_status_t dt_gpt2_grad_sumsq(dt_gpt2_t *m, double *sharded, double *replicated) {
  dt_backend_t *be = m->be;
  const dt_layout_t *lay = be->lay;
  *sharded = *replicated = 0.0;
  if (lay->tp <= 1 && lay->pp <= 1) return be->ops->grad_sumsq(be, sharded); /* the optimizer range */
  /* per tensor, only the parts inside the optimizer range (ZeRO), without pp's tied copy of wte */
  size_t lo = be->opt_hi > be->opt_lo ? be->opt_lo : 0, hi = lo + dt_backend_opt_floats(be);
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    size_t a = t->offset > lo ? t->offset : lo, z = t->offset + (size_t)t->rows * t->cols;
    if (z > hi) z = hi;
    if (a >= z || t->tied_copy) continue;
    double s = 0.0;
    RUN(DT_PROF_GRAD_SUMSQ, be->k->sumsq(be, be->grads + a, z - a, &s));
    if (dt_tensor_sharded(t)) *sharded += s;
    else *replicated += s;
  }
  return DT_OK;
}
