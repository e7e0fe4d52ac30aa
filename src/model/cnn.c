/* The CNN models' memory, forward and backward (cnn.h), over a backend's kernels (dt_kernels_t
 * and cnn_kernels.h) and memory: each operation reads its input slots and writes its own; backward
 * walks the operations in reverse, writing each input slot's gradient the first time and adding
 * to it after (a residual block's input feeds both its convolutions and its shortcut), in a pool
 * where gradients that are never alive at the same time share memory with each other and with the
 * activations that forward alone reads (cnn_plan). */
#include <stdlib.h>
#include <string.h>

#include "cnn.h"
#include "cnn_kernels.h"
#include "ops_cnn_cpu.h"
#include "profile.h"

#define BN_MOMENTUM 0.1f
#define BN_EPS 1e-5f

static size_t slot_floats(const dt_cnn_slot_t *s) { return (size_t)s->C * s->H * s->W; }

void dt_cnn_free(dt_cnn_t *m) {
  if (m->be) {
    void *dev[] = {m->acts, m->dacts, m->tmp, m->scratch, m->mean, m->var, m->rstd, m->sdy, m->sdyx, m->losses,
                   m->lse, m->loss, m->idx, m->labels};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
      if (dev[i]) m->be->k->release(m->be, dev[i]);
  }
  free(m->ops), free(m->slots), free(m->written), free(m->sync_buf), free(m->stat_host), free(m->logits_host);
  free(m->owner), free(m->fused);
  dt_layout_free(&m->lay);
  dt_layout_free(&m->bufs);
  memset(m, 0, sizeof *m);
}

/* Operation o reads slot s. */
static int reads(const dt_cnn_op_t *o, int s) { return o->in == s || o->in2 == s; }

/* Op i is a batch norm or a residual add whose output only the ReLU right after it reads: the two
 * run as one pass forward and backward, and op i's output slot gets no memory (never written; the
 * ReLU's gradient is applied inside op i's backward). Bitwise the same results: rounding to
 * bf16/fp16 commutes with max(., 0). */
static int relu_fused(const dt_cnn_t *m, int i) {
  if (i + 1 >= m->n_ops || (m->ops[i].kind != DT_OP_BN && m->ops[i].kind != DT_OP_ADD) ||
      m->ops[i + 1].kind != DT_OP_RELU || m->ops[i + 1].in != i + 1)
    return 0;
  int readers = 0;
  for (int j = 0; j < m->n_ops; j++) readers += (m->ops[j].in == i + 1) + (m->ops[j].in2 == i + 1);
  return readers == 1;
}

/* Images' floats of slot s in the activation arena: 0 for a fused batch norm's or add's output. */
static size_t slot_kept(const dt_cnn_t *m, int s) {
  return s > 0 && relu_fused(m, s - 1) ? 0 : slot_floats(&m->slots[s]);
}

/* A pooling's backward: cuDNN's (system.pool = cudnn) reads its input and output, ours an argmax. */
static int is_pool(dt_cnn_op_kind_t k) { return k == DT_OP_MAXPOOL || k == DT_OP_GAP; }

/* Slot s is read by backward: the images, the logits, a ReLU's output (its backward's mask),
 * every input of a convolution, a batch norm or a linear layer (their weight or statistics
 * gradients need it) and a pooling's input and output (cuDNN's backward needs both; for the
 * models here they are kept anyway, as a ReLU's output and a convolution's or linear layer's
 * input, so the plan is the same with either pooling). The others (a batch norm's output that
 * only a residual add reads: the last of a bottleneck branch, a shortcut's) die in forward. */
static int slot_needed(const dt_cnn_t *m, int s) {
  if (s == 0 || s == m->n_slots - 1 || m->ops[s - 1].kind == DT_OP_RELU || is_pool(m->ops[s - 1].kind)) return 1;
  for (int r = 0; r < m->n_ops; r++) {
    const dt_cnn_op_kind_t k = m->ops[r].kind;
    if (reads(&m->ops[r], s) && (k == DT_OP_CONV || k == DT_OP_BN || k == DT_OP_LINEAR || is_pool(k))) return 1;
  }
  return 0;
}

/* Places slots order[0..k) at the lowest per-image float offsets off[] clear of every slot placed
 * before it whose index range [lo, hi] meets its own (first fit); returns the floats used. */
static size_t first_fit(const dt_cnn_t *m, const int *lo, const int *hi, const int *order, int k, size_t *off) {
  size_t pool = 0;
  for (int a = 0; a < k; a++) {
    const int s = order[a];
    const size_t need = slot_floats(&m->slots[s]);
    size_t at = 0;
    for (int moved = 1; moved;) {
      moved = 0;
      for (int b = 0; b < a; b++) {
        const int t = order[b];
        if (lo[t] <= hi[s] && lo[s] <= hi[t] && at < off[t] + slot_floats(&m->slots[t]) && off[t] < at + need)
          at = off[t] + slot_floats(&m->slots[t]), moved = 1;
      }
    }
    off[s] = at;
    if (at + need > pool) pool = at + need;
  }
  return pool;
}

/* Where slots live, per image (dt_cnn_alloc multiplies by B): act[s] in the activation arena for
 * the slots backward reads (slot_needed), in the pool for those that die in forward (alive from
 * their producer's operation to their last reader's); grad[s] in the pool for backward's slot
 * gradients, each alive from the backward of its last reader (where it is first written) down to
 * that of its producer (where it is read last): the loop indices of dt_cnn_backward s - 1 (a ReLU
 * fused into the operation before it runs at the ReLU's index) up to the last reader's (a fused
 * batch norm or add at its ReLU's index; the logits': n_ops, before the loop). Forward and backward
 * never overlap, so both kinds share the pool; within a kind, slots whose ranges do not meet share
 * memory. SIZE_MAX: none (a fused output; the images' gradient; a slot no one reads). With
 * m->mem_private every kept slot has its own activation and its own gradient (tests). */
typedef struct {
  size_t *act, *grad, acts, pool; /* the arena's and the pool's floats */
  unsigned char *pooled;          /* act[s] is in the pool */
} cnn_plan_t;

static void plan_free(cnn_plan_t *p) {
  free(p->act), free(p->grad), free(p->pooled);
  *p = (cnn_plan_t){0};
}

static dt_status_t cnn_plan(const dt_cnn_t *m, cnn_plan_t *p) {
  const int n = m->n_slots;
  int *lo = calloc((size_t)n, sizeof(int)), *hi = calloc((size_t)n, sizeof(int));
  int *order = calloc((size_t)n, sizeof(int));
  *p = (cnn_plan_t){malloc(sizeof(size_t) * (size_t)n), malloc(sizeof(size_t) * (size_t)n), 0, 0, calloc((size_t)n, 1)};
  if (!lo || !hi || !order || !p->act || !p->grad || !p->pooled) {
    free(lo), free(hi), free(order), plan_free(p);
    return DT_ERR(DT_ERR_NOMEM, "model: out of host memory");
  }
  int k = 0;
  for (int s = 0; s < n; s++) { /* activations: the arena, or the pool (forward's ranges) */
    p->act[s] = SIZE_MAX, lo[s] = s - 1, hi[s] = -1;
    for (int c = 0; c < m->n_ops; c++)
      if (reads(&m->ops[c], s) && c + relu_fused(m, c) > hi[s]) hi[s] = c + relu_fused(m, c);
    if (!slot_kept(m, s)) continue;
    if (m->mem_private || slot_needed(m, s))
      p->act[s] = p->acts, p->acts += slot_kept(m, s);
    else
      p->pooled[s] = 1, order[k++] = s;
  }
  size_t fwd = first_fit(m, lo, hi, order, k, p->act);
  k = 0;
  for (int s = 0; s < n; s++) { /* gradients: backward's ranges (hi as above; the logits' n_ops) */
    p->grad[s] = SIZE_MAX;
    if (s == n - 1) hi[s] = m->n_ops;
    if (s > 0 && slot_kept(m, s) && hi[s] >= lo[s]) order[k++] = s;
  }
  for (int a = 1; a < k; a++) /* in the order backward creates them: the last reader's index, descending */
    for (int b = a; b > 0 && hi[order[b - 1]] < hi[order[b]]; b--) {
      int t = order[b];
      order[b] = order[b - 1], order[b - 1] = t;
    }
  size_t bwd = p->acts; /* mem_private: the arena's layout */
  if (m->mem_private)
    for (int a = 0; a < k; a++)
      p->grad[order[a]] = p->act[order[a]];
  else
    bwd = first_fit(m, lo, hi, order, k, p->grad);
  p->pool = fwd > bwd ? fwd : bwd;
  free(lo), free(hi), free(order);
  return DT_OK;
}

/* Floats of dt_cnn_alloc's arrays for batches of B: the activation arena (acts), the pool (dacts:
 * cnn_plan), the widest slot (tmp), the largest convolution scratch (ck's, asked
 * with be, or the CPU's for nthr threads when ck is NULL), the maxpools' indices, the widest batch
 * norm's C. */
typedef struct {
  size_t acts, dacts, tmp, scratch, idx, maxc;
} cnn_sizes_t;

static cnn_sizes_t cnn_sizes(const dt_cnn_t *m, const cnn_plan_t *p, const dt_cnn_kernels_t *ck, const dt_backend_t *be,
                             int B, int nthr) {
  cnn_sizes_t z = {0, 0, 0, 0, 0, 1};
  for (int i = 0; i < m->n_slots; i++) {
    size_t n = (size_t)B * slot_kept(m, i);
    z.acts += n; /* p NULL (no plan: out of memory): every slot in the arena, as much for gradients */
    if (n > z.tmp) z.tmp = n;
  }
  z.dacts = z.acts;
  if (p) z.acts = (size_t)B * p->acts, z.dacts = (size_t)B * p->pool;
  for (int i = 0; i < m->n_ops; i++) {
    const dt_cnn_op_t *o = &m->ops[i];
    const dt_cnn_slot_t *y = &m->slots[i + 1];
    if (o->kind == DT_OP_CONV) {
      size_t s = ck ? ck->conv2d_scratch_floats(be, o->C, o->K, o->OC, y->H, y->W, o->stride, o->pad)
                    : dt_conv2d_scratch_floats(o->C, o->K, o->K, o->OC, y->H, y->W, o->stride, o->pad, nthr);
      if (s > z.scratch) z.scratch = s;
    } else if (o->kind == DT_OP_MAXPOOL) {
      z.idx += (size_t)B * slot_floats(y);
    } else if (o->kind == DT_OP_BN && (size_t)o->C > z.maxc) {
      z.maxc = (size_t)o->C;
    }
  }
  return z;
}

double dt_cnn_alloc_bytes(const dt_cnn_t *m, int B, int nthr, const dt_cnn_kernels_t *ck) {
  cnn_plan_t p;
  const int planned = cnn_plan(m, &p) == DT_OK;
  cnn_sizes_t z = cnn_sizes(m, planned ? &p : NULL, ck, NULL, B, nthr);
  plan_free(&p);
  double ns = m->n_stat ? (double)m->n_stat : 1.0;
  return 4.0 * ((double)z.acts + z.dacts + z.tmp + z.scratch + 5 * ns + 2.0 * B) + 16.0 + 4.0 * (z.idx + B) +
         m->n_slots + 24.0 * z.maxc + 4.0 * m->lay.n_tensors + m->n_ops + 4.0 * B * m->cfg.classes;
}

/* Slot s's activations (B images): in the arena, or in the pool while forward runs. */
static float *act(const dt_cnn_t *m, int s) { return (m->slots[s].pooled ? m->dacts : m->acts) + m->slots[s].off; }

/* Backend memory of n elements of `size` bytes (at least one) into *p. */
static dt_status_t be_alloc(dt_cnn_t *m, void *p, size_t n, size_t size) {
  return m->be->k->alloc(m->be, (void **)p, (n ? n : 1) * size);
}

/* Host arrays: gradient bookkeeping, the operations' tensor owners, the ops fused with a ReLU. */
static dt_status_t host_alloc(dt_cnn_t *m, size_t maxc) {
  m->written = malloc((size_t)m->n_slots);
  m->sync_buf = malloc(2 * maxc * sizeof(double));
  m->stat_host = malloc(2 * maxc * sizeof(float));
  m->logits_host = malloc(sizeof(float) * (size_t)m->B * m->cfg.classes);
  m->owner = malloc(sizeof(int) * (size_t)(m->lay.n_tensors ? m->lay.n_tensors : 1));
  m->fused = calloc((size_t)m->n_ops, 1);
  if (!m->written || !m->sync_buf || !m->stat_host || !m->logits_host || !m->owner || !m->fused)
    return DT_ERR(DT_ERR_NOMEM, "model: out of host memory");
  for (int i = 0; i < m->n_ops; i++) m->fused[i] = (unsigned char)relu_fused(m, i);
  for (int t = 0; t < m->lay.n_tensors; t++) m->owner[t] = m->n_ops;
  for (int i = 0; i < m->n_ops; i++) {
    if (m->ops[i].w >= 0) m->owner[m->ops[i].w] = i;
    if (m->ops[i].b >= 0) m->owner[m->ops[i].b] = i;
  }
  return DT_OK;
}

dt_status_t dt_cnn_alloc(dt_cnn_t *m, dt_backend_t *be, int B) {
  if (!be->ops->cnn)
    return DT_ERR(DT_ERR_CONFIG, "the %s backend has no kernels for the image classifiers", be->ops->name);
  m->be = be;
  cnn_plan_t p;
  DT_TRY(cnn_plan(m, &p));
  const cnn_sizes_t z = cnn_sizes(m, &p, be->ops->cnn, be, B, 0);
  size_t ix = 0;
  for (int i = 0; i < m->n_slots; i++) {
    m->slots[i].off = p.act[i] == SIZE_MAX ? SIZE_MAX : (size_t)B * p.act[i];
    m->slots[i].pooled = p.pooled[i];
    m->slots[i].doff = p.grad[i] == SIZE_MAX ? SIZE_MAX : (size_t)B * p.grad[i];
  }
  plan_free(&p);
  for (int i = 0; i < m->n_ops; i++)
    if (m->ops[i].kind == DT_OP_MAXPOOL) {
      m->ops[i].aux = ix;
      ix += (size_t)B * slot_floats(&m->slots[i + 1]);
    }
  m->B = B, m->n_acts = z.acts, m->n_dacts = z.dacts, m->n_tmp = z.tmp, m->n_idx = z.idx;
  const size_t ns = m->n_stat, f = sizeof(float);
  dt_status_t st = be_alloc(m, &m->acts, z.acts, f);
  if (st == DT_OK) st = be_alloc(m, &m->dacts, z.dacts, f);
  if (st == DT_OK) st = be_alloc(m, &m->tmp, z.tmp, f);
  if (st == DT_OK) st = be_alloc(m, &m->scratch, z.scratch, f);
  float **stat[] = {&m->mean, &m->var, &m->rstd, &m->sdy, &m->sdyx};
  for (int i = 0; i < 5 && st == DT_OK; i++) st = be_alloc(m, stat[i], ns, f);
  if (st == DT_OK) st = be_alloc(m, &m->losses, (size_t)B, f);
  if (st == DT_OK) st = be_alloc(m, &m->lse, (size_t)B, f);
  if (st == DT_OK) st = be_alloc(m, &m->loss, 2, sizeof(double));
  if (st == DT_OK) st = be_alloc(m, &m->idx, z.idx, sizeof(int));
  if (st == DT_OK) st = be_alloc(m, &m->labels, (size_t)B, sizeof(int));
  if (st != DT_OK)
    return DT_ERR(DT_ERR_NOMEM, "model: cannot allocate %.1f MiB of activations for a batch of %d images (%s)",
                  (double)(z.acts + z.dacts) * f / (1 << 20), B, dt_err_msg());
  return host_alloc(m, z.maxc);
}

/* Synchronised batch norm: a[c], b[c] (C floats each, this rank's, backend memory) become their
 * sums over the ranks (through the host); with `moments`, a and b are the mean and variance,
 * combined through E[x^2] into the whole batch's (every rank has the same B). */
static dt_status_t sync_pair(dt_cnn_t *m, float *a, float *b, int C, int moments) {
  dt_backend_t *be = m->be;
  double *buf = m->sync_buf, R = moments ? (double)m->sync_ranks : 1.0;
  float *ha = m->stat_host, *hb = m->stat_host + C;
  DT_TRY(be->k->download(be, ha, a, (size_t)C * sizeof(float)));
  DT_TRY(be->k->download(be, hb, b, (size_t)C * sizeof(float)));
  for (int c = 0; c < C; c++) buf[c] = ha[c], buf[C + c] = moments ? (double)hb[c] + (double)ha[c] * ha[c] : hb[c];
  dt_status_t st = m->sync_sum(m->sync_ctx, buf, 2 * C);
  if (st != DT_OK && m->sync_err == DT_OK) m->sync_err = st;
  for (int c = 0; c < C; c++) {
    double mean = buf[c] / R, second = buf[C + c] / R;
    ha[c] = (float)mean;
    hb[c] = moments ? (float)(second - mean * mean > 0 ? second - mean * mean : 0) : (float)second;
  }
  DT_TRY(be->k->upload(be, a, ha, (size_t)C * sizeof(float)));
  return be->k->upload(be, b, hb, (size_t)C * sizeof(float));
}

/* Ranks whose images one batch norm's statistics cover. */
static int bn_ranks(const dt_cnn_t *m) { return m->sync_sum ? m->sync_ranks : 1; }

/* Batch norm's training passes as one backend call each (cnn_kernels.h's bn_train_*): where the
 * backend runs them whole (be->cudnn_bn: cuDNN's) and the statistics are this rank's alone */
static int bn_whole(const dt_cnn_t *m) { return m->be->cudnn_bn && !m->sync_sum && m->be->ops->cnn->bn_train_forward; }

/* Pooling as one backend call each way (cnn_kernels.h's pool_*): where the backend runs it by a
 * library (be->cudnn_pool: cuDNN's) */
static int pool_whole(const dt_cnn_t *m) { return m->be->cudnn_pool && m->be->ops->cnn->pool_forward; }

static dt_status_t bn_forward(dt_cnn_t *m, const dt_cnn_op_t *o, const float *params, float *bufs, const float *x,
                              float *y, int training, int relu) {
  dt_backend_t *be = m->be;
  const dt_cnn_kernels_t *ck = be->ops->cnn;
  const int B = m->B, HW = o->H * o->W;
  const float *w = params + m->lay.tensors[o->w].offset, *b = params + m->lay.tensors[o->b].offset;
  float *rm = bufs + m->bufs.tensors[o->rm].offset, *rv = bufs + m->bufs.tensors[o->rv].offset;
  if (!training) return ck->bn_forward(be, y, NULL, x, rm, rv, w, b, BN_EPS, relu, B, o->C, HW);
  float *mean = m->mean + o->aux, *var = m->var + o->aux;
  if (bn_whole(m))
    return ck->bn_train_forward(be, y, mean, m->rstd + o->aux, rm, rv, x, w, b, BN_EPS, BN_MOMENTUM, relu, B, o->C, HW);
  DT_TRY(ck->bn_stats(be, mean, var, x, B, o->C, HW));
  if (m->sync_sum) DT_TRY(sync_pair(m, mean, var, o->C, 1));
  DT_TRY(ck->bn_running(be, rm, rv, mean, var, o->C, BN_MOMENTUM, (double)B * HW * bn_ranks(m)));
  return ck->bn_forward(be, y, m->rstd + o->aux, x, mean, var, w, b, BN_EPS, relu, B, o->C, HW);
}

static dt_status_t op_forward(dt_cnn_t *m, const dt_cnn_op_t *o, float *out, const float *params, float *bufs,
                              int training, int fused) {
  dt_backend_t *be = m->be;
  const dt_cnn_kernels_t *ck = be->ops->cnn;
  const int B = m->B;
  const float *in = act(m, o->in);
  const float *w = o->w >= 0 ? params + m->lay.tensors[o->w].offset : NULL;
  const float *b = o->b >= 0 ? params + m->lay.tensors[o->b].offset : NULL;
  size_t n = (size_t)B * slot_floats(&m->slots[o->in]);
  switch (o->kind) {
    case DT_OP_CONV:
      return ck->conv2d_forward(be, out, m->scratch, in, w, b, B, o->C, o->H, o->W, o->OC, o->K, o->stride, o->pad);
    case DT_OP_BN: return bn_forward(m, o, params, bufs, in, out, training, fused);
    case DT_OP_RELU: return ck->relu_forward(be, out, in, n);
    case DT_OP_MAXPOOL:
      if (pool_whole(m)) return ck->pool_forward(be, out, in, B, o->C, o->H, o->W, o->K, o->K, o->stride, o->pad, 0);
      return ck->maxpool_forward(be, out, m->idx + o->aux, in, B, o->C, o->H, o->W, o->K, o->stride, o->pad);
    case DT_OP_GAP:
      if (pool_whole(m)) return ck->pool_forward(be, out, in, B, o->C, o->H, o->W, o->H, o->W, 1, 0, 1);
      return ck->gap_forward(be, out, in, B, o->C, o->H * o->W);
    case DT_OP_LINEAR: return be->k->linear_forward(be, out, in, w, 0, b, NULL, B, o->C, o->OC);
    case DT_OP_ADD:
      return ck->add(be, out, in, act(m, o->in2), fused, n);
  }
  return DT_ERR(DT_ERR_INTERNAL, "model: operation kind %d", (int)o->kind);
}

/* The profile kind (profile.h) of operation o's forward or backward. */
static dt_prof_kind_t prof_kind(const dt_cnn_op_t *o, int backward) {
  switch (o->kind) {
    case DT_OP_CONV: return backward ? DT_PROF_CONV_BWD : DT_PROF_CONV;
    case DT_OP_BN: return DT_PROF_BATCHNORM;
    case DT_OP_RELU: return DT_PROF_RELU;
    case DT_OP_MAXPOOL: case DT_OP_GAP: return DT_PROF_POOL;
    case DT_OP_LINEAR: return DT_PROF_MATMUL;
    case DT_OP_ADD: break;
  }
  return DT_PROF_RESIDUAL;
}

/* Top-1 predictions that match the labels y (host), from the logits (backend memory). */
static dt_status_t count_correct(dt_cnn_t *m, const float *logits, const int *y, int *correct) {
  const int B = m->B, K = m->cfg.classes;
  const float *z = m->logits_host;
  DT_TRY(m->be->k->download(m->be, m->logits_host, logits, sizeof(float) * (size_t)B * K));
  int c = 0;
  for (int i = 0; i < B; i++) {
    int best = 0;
    for (int k = 1; k < K; k++)
      if (z[(size_t)i * K + k] > z[(size_t)i * K + best]) best = k;
    c += best == y[i];
  }
  *correct = c;
  return DT_OK;
}

/* The layer hook for the parameter tensors of operation o (cnn.h layer_hook): weight, then bias
 * going forward; bias, then weight going backward. */
static dt_status_t hook(dt_cnn_t *m, const dt_cnn_op_t *o, dt_hook_phase_t ph) {
  if (!m->layer_hook) return DT_OK;
  const int bwd = ph == DT_HOOK_BWD || ph == DT_HOOK_BWD_DONE;
  const int t[2] = {bwd ? o->b : o->w, bwd ? o->w : o->b};
  for (int k = 0; k < 2; k++)
    if (t[k] >= 0) DT_TRY(m->layer_hook(m->hook_ctx, t[k], ph));
  return DT_OK;
}

dt_status_t dt_cnn_forward(dt_cnn_t *m, const float *params, float *bufs, const float *x, const int *y, int training,
                           double *loss, int *correct) {
  dt_backend_t *be = m->be;
  const int B = m->B, K = m->cfg.classes;
  DT_TRY(be->k->upload(be, m->acts, x, (size_t)B * slot_floats(&m->slots[0]) * sizeof(float)));
  DT_TRY(be->k->round(be, m->acts, (size_t)B * slot_floats(&m->slots[0]))); /* the images, stored in bf16/fp16 too */
  for (int i = 0; i < m->n_ops; i++) {
    const int f = m->fused[i]; /* a batch norm or add writing its ReLU's output (op i + 1) */
    float *out = act(m, i + 1 + f);
    DT_TRY(hook(m, &m->ops[i], DT_HOOK_FWD));
    dt_status_t st;
    DT_PROF(prof_kind(&m->ops[i], 0), st = op_forward(m, &m->ops[i], out, params, bufs, training, f));
    DT_TRY(st);
    DT_TRY(be->k->round(be, out, (size_t)B * slot_floats(&m->slots[i + 1 + f]))); /* bf16, fp16: as stored */
    DT_TRY(hook(m, &m->ops[i], DT_HOOK_FWD_DONE));
    i += f;
  }
  const float *logits = act(m, m->n_slots - 1);
  DT_TRY(be->k->upload(be, m->labels, y, (size_t)B * sizeof(int)));
  double *acc = m->loss + (loss != NULL); /* [1]: this forward's alone, read now */
  if (loss) {
    *loss = 0.0;
    DT_TRY(be->k->upload(be, acc, loss, sizeof *loss));
  }
  DT_TRY(be->k->crossentropy_forward(be, m->losses, m->lse, logits, m->labels, B, K, K, acc));
  if (loss) DT_TRY(be->k->download(be, loss, acc, sizeof *loss));
  return correct ? count_correct(m, logits, y, correct) : DT_OK;
}

dt_status_t dt_cnn_loss_sum(dt_cnn_t *m, double *sum_host) {
  const double zero = 0.0;
  DT_TRY(m->be->k->download(m->be, sum_host, m->loss, sizeof *sum_host));
  return m->be->k->upload(m->be, m->loss, &zero, sizeof zero);
}

/* Where an operation writes the gradient of its input slot s: the slot's own gradient the first
 * time, else m->tmp, added by grad_done. Slot 0 (the images) has none: NULL. */
static float *grad_dst(dt_cnn_t *m, int s) {
  if (s == 0) return NULL;
  return m->written[s] ? m->tmp : m->dacts + m->slots[s].doff;
}

static dt_status_t grad_done(dt_cnn_t *m, int s) {
  if (s == 0) return DT_OK;
  float *d = m->dacts + m->slots[s].doff;
  size_t n = (size_t)m->B * slot_floats(&m->slots[s]);
  if (m->written[s]) DT_TRY(m->be->ops->cnn->add(m->be, d, d, m->tmp, 0, n));
  m->written[s] = 1;
  return m->be->k->round(m->be, d, n); /* bf16, fp16: as stored */
}

/* A max or global average pooling's input gradient dx (written) from dout: ours through the argmax
 * the forward kept, cuDNN's from the forward's input and output (slot_needed keeps both). */
static dt_status_t pool_backward(dt_cnn_t *m, const dt_cnn_op_t *o, float *dx, const float *dout, const float *in,
                                 const float *out) {
  dt_backend_t *be = m->be;
  const dt_cnn_kernels_t *ck = be->ops->cnn;
  const int B = m->B, gap = o->kind == DT_OP_GAP;
  if (pool_whole(m))
    return gap ? ck->pool_backward(be, dx, dout, out, in, B, o->C, o->H, o->W, o->H, o->W, 1, 0, 1)
               : ck->pool_backward(be, dx, dout, out, in, B, o->C, o->H, o->W, o->K, o->K, o->stride, o->pad, 0);
  if (gap) return ck->gap_backward(be, dx, dout, B, o->C, o->H * o->W);
  return ck->maxpool_backward(be, dx, dout, m->idx + o->aux, B, o->C, o->H, o->W, o->K, o->stride, o->pad);
}

/* dout: the output's gradient, not read again after this (its last reader: the pool may reuse it) */
static dt_status_t bn_backward(dt_cnn_t *m, const dt_cnn_op_t *o, const float *out, float *dout, const float *in,
                               const float *w, float *dw, float *db, float *dx, int f) {
  dt_backend_t *be = m->be;
  const dt_cnn_kernels_t *ck = be->ops->cnn;
  const int B = m->B, HW = o->H * o->W;
  float *sdy = m->sdy + o->aux, *sdyx = m->sdyx + o->aux;
  const float *mean = m->mean + o->aux, *rstd = m->rstd + o->aux, *relu_out = f ? out : NULL;
  if (bn_whole(m) && dx)
    return ck->bn_train_backward(be, dx, dw, db, dout, relu_out, in, mean, rstd, w, BN_EPS, B, o->C, HW);
  DT_TRY(ck->bn_backward_reduce(be, sdy, sdyx, dw, db, dout, relu_out, in, mean, rstd, B, o->C, HW));
  if (!dx) return DT_OK;
  if (m->sync_sum) DT_TRY(sync_pair(m, sdy, sdyx, o->C, 0));
  return ck->bn_backward(be, dx, dout, relu_out, in, mean, rstd, w, sdy, sdyx, (double)B * HW * bn_ranks(m), B, o->C,
                         HW);
}

/* A residual add: both inputs get g = dout (with a fused ReLU: where its output y > 0), computed
 * once and copied before grad_done rounds it. When both inputs already have a gradient, both
 * destinations are m->tmp, which grad_done reads and leaves as it is: g serves both. */
static dt_status_t add_backward(dt_cnn_t *m, const dt_cnn_op_t *o, const float *y, const float *dout, size_t n) {
  dt_backend_t *be = m->be;
  float *d1 = grad_dst(m, o->in), *d2 = grad_dst(m, o->in2), *g = d1 ? d1 : d2;
  if (g) DT_TRY(y ? be->ops->cnn->relu_backward(be, g, dout, y, n) : be->k->copy(be, g, dout, n * sizeof *g));
  if (d1 && d2 && d2 != d1) DT_TRY(be->k->copy(be, d2, d1, n * sizeof *d2));
  DT_TRY(grad_done(m, o->in));
  return grad_done(m, o->in2);
}

static dt_status_t op_backward(dt_cnn_t *m, const dt_cnn_op_t *o, int i, const float *params, float *grads) {
  dt_backend_t *be = m->be;
  const dt_cnn_kernels_t *ck = be->ops->cnn;
  const int B = m->B, HW = o->H * o->W;
  const int f = m->fused[i]; /* a batch norm or add with its ReLU (op i + 1): from the ReLU's output gradient */
  const float *in = act(m, o->in), *out = act(m, i + 1 + f);
  float *dout = m->dacts + m->slots[i + 1 + f].doff;
  const float *w = o->w >= 0 ? params + m->lay.tensors[o->w].offset : NULL;
  float *dw = o->w >= 0 ? grads + m->lay.tensors[o->w].offset : NULL;
  float *db = o->b >= 0 ? grads + m->lay.tensors[o->b].offset : NULL;
  float *dx = grad_dst(m, o->in);
  size_t n = (size_t)B * o->C * HW;
  dt_status_t st = DT_OK;
  switch (o->kind) {
    case DT_OP_CONV:
      st = ck->conv2d_backward(be, dx, dw, db, m->scratch, dout, in, w, B, o->C, o->H, o->W, o->OC, o->K, o->stride,
                               o->pad);
      break;
    case DT_OP_BN: st = bn_backward(m, o, out, dout, in, w, dw, db, dx, f); break;
    case DT_OP_RELU: st = dx ? ck->relu_backward(be, dx, dout, out, n) : DT_OK; break;
    case DT_OP_MAXPOOL:
    case DT_OP_GAP:
      st = dx ? pool_backward(m, o, dx, dout, in, out) : DT_OK;
      break;
    case DT_OP_LINEAR: st = be->k->linear_backward(be, dx, dw, db, dout, in, w, 0, B, o->C, o->OC); break;
    case DT_OP_ADD: return add_backward(m, o, f ? out : NULL, dout, n);
  }
  DT_TRY(st);
  return grad_done(m, o->in);
}

dt_status_t dt_cnn_backward(dt_cnn_t *m, const float *params, float *grads, float dloss) {
  dt_backend_t *be = m->be;
  const int K = m->cfg.classes, last = m->n_slots - 1;
  memset(m->written, 0, (size_t)m->n_slots);
  float *dlogits = m->dacts + m->slots[last].doff;
  DT_TRY(be->k->copy(be, dlogits, act(m, last), sizeof(float) * (size_t)m->B * K));
  DT_TRY(be->k->crossentropy_backward(be, dlogits, m->lse, m->labels, dloss, m->B, K, K, 0)); /* stored rounded */
  m->written[last] = 1;
  int k = m->lay.n_tensors; /* tensors [k, n_tensors) (arena order) are final */
  size_t hi = m->lay.n_params;
  for (int i = m->n_ops - 1; i >= 0; i--) {
    const int j = i > 0 && m->fused[i - 1] ? i - 1 : i; /* a fused ReLU: its batch norm's or add's backward */
    if (!m->fused[i] && m->written[i + 1]) {
      DT_TRY(hook(m, &m->ops[j], DT_HOOK_BWD));
      dt_status_t st;
      DT_PROF(prof_kind(&m->ops[j], 1), st = op_backward(m, &m->ops[j], j, params, grads));
      DT_TRY(st);
      DT_TRY(hook(m, &m->ops[j], DT_HOOK_BWD_DONE));
    }
    if (!m->ready) continue;
    const int k0 = k;
    while (k > 0 && m->owner[k - 1] >= i) k--;
    if (k == k0) continue;
    size_t lo = k > 0 ? m->lay.tensors[k].offset : 0;
    DT_TRY(be->k->grads_ready(be, k)); /* a device backend: communication queued after this point */
    m->ready(m->ready_ctx, lo, hi);
    hi = lo;
  }
  return DT_OK;
}
