/* The CNN models' memory, forward and backward over host memory (cnn.h): each operation reads
 * its input slots and writes its own; backward walks the operations in reverse, writing each
 * input slot's gradient the first time and adding to it after (a residual block's input feeds
 * both its convolutions and its shortcut). */
#include <stdlib.h>
#include <string.h>

#include "cnn.h"
#include "ops_cnn_cpu.h"
#include "ops_cpu.h"

#define BN_MOMENTUM 0.1f
#define BN_EPS 1e-5f

static size_t slot_floats(const dt_cnn_slot_t *s) { return (size_t)s->C * s->H * s->W; }

void dt_cnn_free(dt_cnn_t *m) {
  free(m->ops), free(m->slots), free(m->acts), free(m->dacts), free(m->tmp), free(m->scratch);
  free(m->mean), free(m->var), free(m->rstd), free(m->sdy), free(m->sdyx), free(m->losses), free(m->lse);
  free(m->idx), free(m->labels), free(m->written), free(m->sync_buf), free(m->owner), free(m->fused);
  dt_layout_free(&m->lay);
  dt_layout_free(&m->bufs);
  memset(m, 0, sizeof *m);
}

/* Op i is a batch norm whose output only the ReLU right after it reads: the two run as one pass
 * forward and backward, and the batch norm's output slot gets no memory (never written; the ReLU's
 * gradient is applied inside the batch norm's backward). Bitwise the same results: rounding to
 * bf16/fp16 commutes with max(., 0). */
static int bn_relu_fused(const dt_cnn_t *m, int i) {
  if (i + 1 >= m->n_ops || m->ops[i].kind != DT_OP_BN || m->ops[i + 1].kind != DT_OP_RELU || m->ops[i + 1].in != i + 1)
    return 0;
  int readers = 0;
  for (int j = 0; j < m->n_ops; j++) readers += (m->ops[j].in == i + 1) + (m->ops[j].in2 == i + 1);
  return readers == 1;
}

/* Images' floats of slot s in the activation arena: 0 for a fused batch norm's output. */
static size_t slot_kept(const dt_cnn_t *m, int s) {
  return s > 0 && bn_relu_fused(m, s - 1) ? 0 : slot_floats(&m->slots[s]);
}

/* Floats of dt_cnn_alloc's arrays for batches of B on nthr threads: the activation arena (acts, and
 * dacts the same), the widest slot (tmp), the largest convolution scratch, the maxpools' indices,
 * the widest batch norm's C. */
typedef struct {
  size_t acts, tmp, scratch, idx, maxc;
} cnn_sizes_t;

static cnn_sizes_t cnn_sizes(const dt_cnn_t *m, int B, int nthr) {
  cnn_sizes_t z = {0, 0, 0, 0, 1};
  for (int i = 0; i < m->n_slots; i++) {
    size_t n = (size_t)B * slot_kept(m, i);
    z.acts += n;
    if (n > z.tmp) z.tmp = n;
  }
  for (int i = 0; i < m->n_ops; i++) {
    const dt_cnn_op_t *o = &m->ops[i];
    const dt_cnn_slot_t *y = &m->slots[i + 1];
    if (o->kind == DT_OP_CONV) {
      size_t s = dt_conv2d_scratch_floats(o->C, o->K, o->K, o->OC, y->H, y->W, nthr);
      if (s > z.scratch) z.scratch = s;
    } else if (o->kind == DT_OP_MAXPOOL) {
      z.idx += (size_t)B * slot_floats(y);
    } else if (o->kind == DT_OP_BN && (size_t)o->C > z.maxc) {
      z.maxc = (size_t)o->C;
    }
  }
  return z;
}

double dt_cnn_alloc_bytes(const dt_cnn_t *m, int B, int nthr) {
  cnn_sizes_t z = cnn_sizes(m, B, nthr);
  double ns = m->n_stat ? (double)m->n_stat : 1.0;
  return 4.0 * (2.0 * z.acts + z.tmp + z.scratch + 5 * ns + 2.0 * B) + 4.0 * (z.idx + B) + m->n_slots +
         16.0 * z.maxc + 4.0 * m->lay.n_tensors + m->n_ops;
}

dt_status_t dt_cnn_alloc(dt_cnn_t *m, int B, int nthr) {
  const cnn_sizes_t z = cnn_sizes(m, B, nthr);
  size_t off = z.acts, maxs = z.tmp, scr = z.scratch, nidx = z.idx, maxc = z.maxc, at = 0, ix = 0;
  for (int i = 0; i < m->n_slots; i++) {
    m->slots[i].off = at;
    at += (size_t)B * slot_kept(m, i);
  }
  for (int i = 0; i < m->n_ops; i++)
    if (m->ops[i].kind == DT_OP_MAXPOOL) {
      m->ops[i].aux = ix;
      ix += (size_t)B * slot_floats(&m->slots[i + 1]);
    }
  m->B = B, m->nthr = nthr, m->n_acts = off, m->n_tmp = maxs, m->n_idx = nidx;
  size_t ns = m->n_stat ? m->n_stat : 1;
  m->acts = malloc(off * sizeof(float)), m->dacts = malloc(off * sizeof(float));
  m->tmp = malloc(maxs * sizeof(float)), m->scratch = malloc((scr ? scr : 1) * sizeof(float));
  m->mean = malloc(ns * sizeof(float)), m->var = malloc(ns * sizeof(float)), m->rstd = malloc(ns * sizeof(float));
  m->sdy = malloc(ns * sizeof(float)), m->sdyx = malloc(ns * sizeof(float));
  m->losses = malloc((size_t)B * sizeof(float)), m->lse = malloc((size_t)B * sizeof(float));
  m->idx = malloc((nidx ? nidx : 1) * sizeof(int)), m->labels = malloc((size_t)B * sizeof(int));
  m->written = malloc((size_t)m->n_slots);
  m->sync_buf = malloc(2 * maxc * sizeof(double));
  m->owner = malloc(sizeof(int) * (size_t)(m->lay.n_tensors ? m->lay.n_tensors : 1));
  m->fused = calloc((size_t)m->n_ops, 1);
  for (int i = 0; m->fused && i < m->n_ops; i++) m->fused[i] = (unsigned char)bn_relu_fused(m, i);
  if (m->owner) {
    for (int t = 0; t < m->lay.n_tensors; t++) m->owner[t] = m->n_ops;
    for (int i = 0; i < m->n_ops; i++) {
      if (m->ops[i].w >= 0) m->owner[m->ops[i].w] = i;
      if (m->ops[i].b >= 0) m->owner[m->ops[i].b] = i;
    }
  }
  if (!m->fused || !m->owner || !m->sync_buf || !m->acts || !m->dacts || !m->tmp || !m->scratch || !m->mean ||
      !m->var || !m->rstd || !m->sdy || !m->sdyx || !m->losses || !m->lse || !m->idx || !m->labels || !m->written)
    return DT_ERR(DT_ERR_NOMEM, "model: cannot allocate %.1f MiB of activations for a batch of %d images",
                  2.0 * (double)off * sizeof(float) / (1 << 20), B);
  return DT_OK;
}

/* Synchronised batch norm: a[c], b[c] (C floats each, this rank's) become their sums over the
 * ranks; with `moments`, a and b are the mean and variance, combined through E[x^2] into the
 * whole batch's (every rank has the same B). */
static void sync_pair(dt_cnn_t *m, float *a, float *b, int C, int moments) {
  double *buf = m->sync_buf, R = moments ? (double)m->sync_ranks : 1.0;
  for (int c = 0; c < C; c++) buf[c] = a[c], buf[C + c] = moments ? (double)b[c] + (double)a[c] * a[c] : b[c];
  dt_status_t st = m->sync_sum(m->sync_ctx, buf, 2 * C);
  if (st != DT_OK && m->sync_err == DT_OK) m->sync_err = st;
  for (int c = 0; c < C; c++) {
    double mean = buf[c] / R, second = buf[C + c] / R;
    a[c] = (float)mean;
    b[c] = moments ? (float)(second - mean * mean > 0 ? second - mean * mean : 0) : (float)second;
  }
}

/* Ranks whose images one batch norm's statistics cover. */
static int bn_ranks(const dt_cnn_t *m) { return m->sync_sum ? m->sync_ranks : 1; }

static void bn_forward(dt_cnn_t *m, const dt_cnn_op_t *o, const float *params, float *bufs, const float *x, float *y,
                       int training, int relu) {
  const int B = m->B, HW = o->H * o->W;
  const float *w = params + m->lay.tensors[o->w].offset, *b = params + m->lay.tensors[o->b].offset;
  float *rm = bufs + m->bufs.tensors[o->rm].offset, *rv = bufs + m->bufs.tensors[o->rv].offset;
  if (!training) {
    dt_batchnorm_forward(y, NULL, x, rm, rv, w, b, BN_EPS, relu, B, o->C, HW);
    return;
  }
  float *mean = m->mean + o->aux, *var = m->var + o->aux;
  dt_batchnorm_stats(mean, var, x, B, o->C, HW);
  if (m->sync_sum) sync_pair(m, mean, var, o->C, 1);
  dt_batchnorm_running(rm, rv, mean, var, o->C, BN_MOMENTUM, (double)B * HW * bn_ranks(m));
  dt_batchnorm_forward(y, m->rstd + o->aux, x, mean, var, w, b, BN_EPS, relu, B, o->C, HW);
}

double dt_cnn_forward(dt_cnn_t *m, const float *params, float *bufs, const float *x, const int *y, int training,
                      int *correct) {
  const int B = m->B;
  memcpy(m->acts, x, (size_t)B * slot_floats(&m->slots[0]) * sizeof(float));
  for (int i = 0; i < m->n_ops; i++) {
    const dt_cnn_op_t *o = &m->ops[i];
    const int f = m->fused[i]; /* a batch norm writing its ReLU's output (op i + 1) */
    const float *in = m->acts + m->slots[o->in].off;
    float *out = m->acts + m->slots[i + 1 + f].off;
    const float *w = o->w >= 0 ? params + m->lay.tensors[o->w].offset : NULL;
    const float *b = o->b >= 0 ? params + m->lay.tensors[o->b].offset : NULL;
    size_t n = (size_t)B * slot_floats(&m->slots[o->in]);
    switch (o->kind) {
      case DT_OP_CONV:
        dt_conv2d_forward(out, m->scratch, in, w, b, B, o->C, o->H, o->W, o->OC, o->K, o->K, o->stride, o->pad,
                          m->nthr);
        break;
      case DT_OP_BN: bn_forward(m, o, params, bufs, in, out, training, f); break;
      case DT_OP_RELU: dt_relu_forward(out, in, n); break;
      case DT_OP_MAXPOOL:
        dt_maxpool_forward(out, m->idx + o->aux, in, B, o->C, o->H, o->W, o->K, o->stride, o->pad);
        break;
      case DT_OP_GAP: dt_global_avgpool_forward(out, in, B, o->C, o->H * o->W); break;
      case DT_OP_LINEAR: dt_matmul_forward(out, in, w, b, B, o->C, o->OC); break;
      case DT_OP_ADD: dt_residual_forward(out, in, m->acts + m->slots[o->in2].off, n); break;
    }
    dt_prec_round(out, (size_t)B * slot_floats(&m->slots[i + 1 + f]), m->precision); /* bf16, fp16: as stored */
    i += f;
  }
  const int K = m->cfg.classes;
  const float *logits = m->acts + m->slots[m->n_slots - 1].off;
  memcpy(m->labels, y, (size_t)B * sizeof(int));
  double loss = dt_crossentropy_forward(m->losses, m->lse, logits, y, B, K, K);
  if (correct) {
    int c = 0;
    for (int i = 0; i < B; i++) {
      int best = 0;
      for (int k = 1; k < K; k++)
        if (logits[(size_t)i * K + k] > logits[(size_t)i * K + best]) best = k;
      c += best == y[i];
    }
    *correct = c;
  }
  return loss;
}

/* Where an operation writes the gradient of its input slot s: the slot's own gradient the first
 * time, else m->tmp, added by grad_done. Slot 0 (the images) has none: NULL. */
static float *grad_dst(dt_cnn_t *m, int s) {
  if (s == 0) return NULL;
  return m->written[s] ? m->tmp : m->dacts + m->slots[s].off;
}

static void grad_done(dt_cnn_t *m, int s) {
  if (s == 0) return;
  float *d = m->dacts + m->slots[s].off;
  size_t n = (size_t)m->B * slot_floats(&m->slots[s]);
  if (m->written[s]) dt_residual_forward(d, d, m->tmp, n);
  m->written[s] = 1;
  dt_prec_round(d, n, m->precision); /* bf16, fp16: as stored */
}

static void op_backward(dt_cnn_t *m, const dt_cnn_op_t *o, int i, const float *params, float *grads) {
  const int B = m->B, HW = o->H * o->W;
  const int f = m->fused[i]; /* a batch norm with its ReLU (op i + 1): from the ReLU's output gradient */
  const float *in = m->acts + m->slots[o->in].off, *out = m->acts + m->slots[i + 1 + f].off;
  const float *dout = m->dacts + m->slots[i + 1 + f].off;
  const float *w = o->w >= 0 ? params + m->lay.tensors[o->w].offset : NULL;
  float *dw = o->w >= 0 ? grads + m->lay.tensors[o->w].offset : NULL;
  float *db = o->b >= 0 ? grads + m->lay.tensors[o->b].offset : NULL;
  float *dx = grad_dst(m, o->in);
  size_t n = (size_t)B * o->C * HW;
  switch (o->kind) {
    case DT_OP_CONV:
      dt_conv2d_backward(dx, dw, db, m->scratch, dout, in, w, B, o->C, o->H, o->W, o->OC, o->K, o->K, o->stride,
                         o->pad, m->nthr);
      break;
    case DT_OP_BN:
      dt_batchnorm_backward_reduce(m->sdy + o->aux, m->sdyx + o->aux, dw, db, dout, f ? out : NULL, in,
                                   m->mean + o->aux, m->rstd + o->aux, B, o->C, HW);
      if (dx && m->sync_sum) sync_pair(m, m->sdy + o->aux, m->sdyx + o->aux, o->C, 0);
      if (dx)
        dt_batchnorm_backward(dx, dout, f ? out : NULL, in, m->mean + o->aux, m->rstd + o->aux, w, m->sdy + o->aux,
                              m->sdyx + o->aux, (double)B * HW * bn_ranks(m), B, o->C, HW);
      break;
    case DT_OP_RELU:
      if (dx) dt_relu_backward(dx, dout, out, n);
      break;
    case DT_OP_MAXPOOL:
      if (dx)
        dt_maxpool_backward(dx, dout, m->idx + o->aux, B, o->C, o->H, o->W, m->slots[i + 1].H, m->slots[i + 1].W);
      break;
    case DT_OP_GAP:
      if (dx) dt_global_avgpool_backward(dx, dout, B, o->C, HW);
      break;
    case DT_OP_LINEAR: dt_matmul_backward(dx, dw, db, dout, in, w, B, o->C, o->OC); break;
    case DT_OP_ADD:
      if (dx) memcpy(dx, dout, n * sizeof *dx);
      grad_done(m, o->in);
      if ((dx = grad_dst(m, o->in2))) memcpy(dx, dout, n * sizeof *dx);
      grad_done(m, o->in2);
      return;
  }
  grad_done(m, o->in);
}

void dt_cnn_backward(dt_cnn_t *m, const float *params, float *grads, float dloss) {
  const int K = m->cfg.classes, last = m->n_slots - 1;
  memset(m->written, 0, (size_t)m->n_slots);
  float *dlogits = m->dacts + m->slots[last].off;
  dt_crossentropy_backward(dlogits, m->acts + m->slots[last].off, m->lse, m->labels, dloss, m->B, K, K);
  dt_prec_round(dlogits, (size_t)m->B * K, m->precision);
  m->written[last] = 1;
  int k = m->lay.n_tensors; /* tensors [k, n_tensors) (arena order) are final */
  size_t hi = m->lay.n_params;
  for (int i = m->n_ops - 1; i >= 0; i--) {
    const int j = i > 0 && m->fused[i - 1] ? i - 1 : i; /* a fused ReLU: its batch norm's backward */
    if (!m->fused[i] && m->written[i + 1]) op_backward(m, &m->ops[j], j, params, grads);
    if (!m->ready) continue;
    const int k0 = k;
    while (k > 0 && m->owner[k - 1] >= i) k--;
    if (k == k0) continue;
    size_t lo = k > 0 ? m->lay.tensors[k].offset : 0;
    m->ready(m->ready_ctx, lo, hi);
    hi = lo;
  }
}
