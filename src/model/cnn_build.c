/* The CNN models as operation lists over activation slots, and their parameter and buffer
 * layouts in torchvision's names and order (cnn.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cnn.h"
#include "ops_cnn_cpu.h"

typedef struct {
  dt_cnn_t *m;
  int cap_ops, cap_slots, cap_p, cap_b;
  size_t off_p, off_b;
  int failed;
} bld_t;

dt_status_t dt_cnn_arch_parse(const char *s, dt_cnn_arch_t *arch) {
  static const struct {
    const char *name;
    dt_cnn_arch_t arch;
  } t[] = {{"cnn", DT_CNN_SIMPLE}, {"resnet18", DT_CNN_RESNET18}, {"resnet50", DT_CNN_RESNET50}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (!strcmp(s, t[i].name)) {
      *arch = t[i].arch;
      return DT_OK;
    }
  return DT_ERR(DT_ERR_CONFIG, "model.arch: '%s' is not a convolutional network (cnn, resnet18, resnet50)", s);
}

static int grow(void **p, int *cap, int n, size_t elem) {
  if (n < *cap) return 0;
  int nc = *cap ? 2 * *cap : 32;
  void *q = realloc(*p, (size_t)nc * elem);
  if (!q) return -1;
  memset((char *)q + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
  *p = q;
  *cap = nc;
  return 0;
}

/* A tensor of (rows, cols) in layout lay at *off (DT_ALIGN-aligned); its index, -1 on failure. */
static int add_tensor(bld_t *b, dt_layout_t *lay, int *cap, size_t *off, const char *prefix, const char *what,
                      int rows, int cols, int ndim, int decay) {
  if (b->failed || grow((void **)&lay->tensors, cap, lay->n_tensors, sizeof *lay->tensors)) {
    b->failed = 1;
    return -1;
  }
  dt_tensor_t *t = &lay->tensors[lay->n_tensors]; /* zeroed by grow */
  snprintf(t->name, sizeof t->name, "%s.%s", prefix, what);
  t->offset = *off;
  t->rows = t->grows = rows;
  t->cols = t->gcols = cols;
  t->ndim = ndim;
  t->decay = decay;
  t->layer = -1;
  t->nblk = 1;
  *off += ((size_t)rows * cols + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
  lay->n_params_true += (size_t)rows * cols;
  return lay->n_tensors++;
}

static int param(bld_t *b, const char *prefix, const char *what, int rows, int cols, int ndim) {
  /* torch.optim.SGD(model.parameters(), weight_decay=wd) decays every parameter */
  return add_tensor(b, &b->m->lay, &b->cap_p, &b->off_p, prefix, what, rows, cols, ndim, 1);
}

static int buffer(bld_t *b, const char *prefix, const char *what, int n) {
  return add_tensor(b, &b->m->bufs, &b->cap_b, &b->off_b, prefix, what, 1, n, 1, 0);
}

/* Append operation o reading slot o.in; its output slot has shape (C, H, W). Returns that slot. */
static int add_op(bld_t *b, dt_cnn_op_t o, int C, int H, int W) {
  dt_cnn_t *m = b->m;
  if (b->failed || grow((void **)&m->ops, &b->cap_ops, m->n_ops, sizeof *m->ops) ||
      grow((void **)&m->slots, &b->cap_slots, m->n_slots, sizeof *m->slots)) {
    b->failed = 1;
    return 0;
  }
  if (C < 1 || H < 1 || W < 1) b->failed = 2; /* the image shrank to nothing */
  m->ops[m->n_ops++] = o;
  m->slots[m->n_slots] = (dt_cnn_slot_t){C, H, W, 0, 0, 0};
  return m->n_slots++;
}

static dt_cnn_op_t op_of(const bld_t *b, dt_cnn_op_kind_t kind, int in) {
  const dt_cnn_slot_t *s = &b->m->slots[in];
  return (dt_cnn_op_t){.kind = kind, .in = in, .in2 = -1, .w = -1, .b = -1, .rm = -1, .rv = -1, .C = s->C,
                       .H = s->H, .W = s->W, .OC = s->C};
}

static int conv(bld_t *b, const char *name, int in, int OC, int K, int stride, int pad, int bias) {
  dt_cnn_op_t o = op_of(b, DT_OP_CONV, in);
  o.OC = OC, o.K = K, o.stride = stride, o.pad = pad;
  o.w = param(b, name, "weight", OC, o.C * K * K, 4);
  if (o.w >= 0) b->m->lay.tensors[o.w].kh = b->m->lay.tensors[o.w].kw = K;
  if (bias) o.b = param(b, name, "bias", 1, OC, 1);
  return add_op(b, o, OC, dt_conv_out(o.H, K, stride, pad), dt_conv_out(o.W, K, stride, pad));
}

static int bn(bld_t *b, const char *name, int in) {
  dt_cnn_op_t o = op_of(b, DT_OP_BN, in);
  o.w = param(b, name, "weight", 1, o.C, 1);
  o.b = param(b, name, "bias", 1, o.C, 1);
  o.rm = buffer(b, name, "running_mean", o.C);
  o.rv = buffer(b, name, "running_var", o.C);
  o.aux = b->m->n_stat;
  b->m->n_stat += (size_t)o.C;
  return add_op(b, o, o.C, o.H, o.W);
}

static int unary(bld_t *b, dt_cnn_op_kind_t kind, int in) {
  dt_cnn_op_t o = op_of(b, kind, in);
  return kind == DT_OP_GAP ? add_op(b, o, o.C, 1, 1) : add_op(b, o, o.C, o.H, o.W);
}

static int maxpool(bld_t *b, int in, int K, int stride, int pad) {
  dt_cnn_op_t o = op_of(b, DT_OP_MAXPOOL, in);
  o.K = K, o.stride = stride, o.pad = pad;
  return add_op(b, o, o.C, dt_conv_out(o.H, K, stride, pad), dt_conv_out(o.W, K, stride, pad));
}

static int linear(bld_t *b, const char *name, int in, int out) {
  dt_cnn_op_t o = op_of(b, DT_OP_LINEAR, in);
  o.C = o.C * o.H * o.W, o.H = o.W = 1, o.OC = out; /* flatten: NCHW is contiguous per image */
  o.w = param(b, name, "weight", out, o.C, 2);
  o.b = param(b, name, "bias", 1, out, 1);
  return add_op(b, o, out, 1, 1);
}

static int add(bld_t *b, int x, int y) {
  dt_cnn_op_t o = op_of(b, DT_OP_ADD, x);
  o.in2 = y;
  return add_op(b, o, o.C, o.H, o.W);
}

static int simple_cnn(bld_t *b, const dt_cnn_config_t *c) {
  int s = 0, w = c->width;
  s = unary(b, DT_OP_RELU, bn(b, "bn1", conv(b, "conv1", s, w, 3, 1, 1, 0))); /* no bias: batch norm removes it */
  s = maxpool(b, s, 2, 2, 0);
  s = unary(b, DT_OP_RELU, bn(b, "bn2", conv(b, "conv2", s, 2 * w, 3, 1, 1, 0)));
  s = maxpool(b, s, 2, 2, 0);
  s = unary(b, DT_OP_RELU, linear(b, "fc1", s, c->hidden));
  return linear(b, "fc2", s, c->classes);
}

/* conv then batch norm, named PREFIX.CONV and PREFIX.BN */
static int conv_bn(bld_t *b, const char *p, const char *cn, const char *bnn, int in, int OC, int K, int stride,
                   int pad) {
  char n[48];
  snprintf(n, sizeof n, "%s.%s", p, cn);
  int s = conv(b, n, in, OC, K, stride, pad, 0);
  snprintf(n, sizeof n, "%s.%s", p, bnn);
  return bn(b, n, s);
}

/* torchvision's BasicBlock (expansion 1) or Bottleneck (expansion 4, stride on the 3x3) */
static int res_block(bld_t *b, const char *p, int in, int planes, int stride, int bottleneck) {
  int s = in, exp = bottleneck ? 4 : 1;
  if (bottleneck) {
    s = unary(b, DT_OP_RELU, conv_bn(b, p, "conv1", "bn1", s, planes, 1, 1, 0));
    s = unary(b, DT_OP_RELU, conv_bn(b, p, "conv2", "bn2", s, planes, 3, stride, 1));
    s = conv_bn(b, p, "conv3", "bn3", s, planes * exp, 1, 1, 0);
  } else {
    s = unary(b, DT_OP_RELU, conv_bn(b, p, "conv1", "bn1", s, planes, 3, stride, 1));
    s = conv_bn(b, p, "conv2", "bn2", s, planes, 3, 1, 1);
  }
  int id = in;
  if (stride != 1 || b->m->slots[in].C != planes * exp)
    id = conv_bn(b, p, "downsample.0", "downsample.1", in, planes * exp, 1, stride, 0);
  return unary(b, DT_OP_RELU, add(b, s, id));
}

static int resnet(bld_t *b, const dt_cnn_config_t *c, const int *blocks, int bottleneck) {
  int s = unary(b, DT_OP_RELU, bn(b, "bn1", conv(b, "conv1", 0, c->width, 3, 1, 1, 0))); /* the CIFAR stem */
  for (int li = 0; li < 4; li++)
    for (int k = 0; k < blocks[li]; k++) {
      char p[32];
      snprintf(p, sizeof p, "layer%d.%d", li + 1, k);
      s = res_block(b, p, s, c->width << li, k == 0 && li > 0 ? 2 : 1, bottleneck);
    }
  return linear(b, "fc", unary(b, DT_OP_GAP, s), c->classes);
}

dt_status_t dt_cnn_build(dt_cnn_t *m, const dt_cnn_config_t *c) {
  memset(m, 0, sizeof *m);
  m->cfg = *c;
  if (c->C < 1 || c->H < 1 || c->W < 1 || c->classes < 2 || c->width < 1 || (c->arch == DT_CNN_SIMPLE && c->hidden < 1))
    return DT_ERR(DT_ERR_CONFIG, "model: image %dx%dx%d, %d classes, width %d, hidden %d: all must be positive "
                  "(at least 2 classes)", c->C, c->H, c->W, c->classes, c->width, c->hidden);
  bld_t b = {.m = m};
  static const int r18[4] = {2, 2, 2, 2}, r50[4] = {3, 4, 6, 3};
  if (!grow((void **)&m->slots, &b.cap_slots, 0, sizeof *m->slots)) {
    m->slots[0] = (dt_cnn_slot_t){c->C, c->H, c->W, 0, 0, 0};
    m->n_slots = 1;
    if (c->arch == DT_CNN_SIMPLE) simple_cnn(&b, c);
    else resnet(&b, c, c->arch == DT_CNN_RESNET18 ? r18 : r50, c->arch == DT_CNN_RESNET50);
  } else {
    b.failed = 1;
  }
  m->lay.n_params = b.off_p;
  m->bufs.n_params = b.off_b;
  m->lay.tp = m->lay.pp = m->bufs.tp = m->bufs.pp = 1;
  if (b.failed == 2) {
    dt_cnn_free(m);
    return DT_ERR(DT_ERR_CONFIG, "model: a %dx%d image is too small for this network's %s", c->H, c->W,
                  c->arch == DT_CNN_SIMPLE ? "two 2x2 poolings" : "three stride-2 stages");
  }
  if (b.failed) {
    dt_cnn_free(m);
    return DT_ERR(DT_ERR_NOMEM, "model: cannot allocate the network's operation list");
  }
  return DT_OK;
}

/* Operation i ends a residual branch: a block's add reads its output as the first operand (the
 * second is the shortcut). */
static int branch_end(const dt_cnn_t *m, int i) {
  for (int k = i + 1; k < m->n_ops; k++)
    if (m->ops[k].kind == DT_OP_ADD && m->ops[k].in == i + 1) return 1;
  return 0;
}

void dt_cnn_init_params(const dt_cnn_t *m, float *params, float *bufs, uint64_t seed) {
  dt_rng_t r;
  dt_rng_seed(&r, seed);
  memset(params, 0, m->lay.n_params * sizeof *params);
  memset(bufs, 0, m->bufs.n_params * sizeof *bufs);
  for (int i = 0; i < m->n_ops; i++) {
    const dt_cnn_op_t *o = &m->ops[i];
    const dt_tensor_t *w = o->w >= 0 ? &m->lay.tensors[o->w] : NULL, *bi = o->b >= 0 ? &m->lay.tensors[o->b] : NULL;
    if (o->kind == DT_OP_CONV) {
      float sd = sqrtf(2.0f / (float)(o->OC * o->K * o->K));
      for (size_t k = 0; k < (size_t)w->rows * w->cols; k++) params[w->offset + k] = sd * (float)dt_rng_normal(&r);
    } else if (o->kind == DT_OP_BN) {
      int last = m->cfg.zero_init_residual && branch_end(m, i);
      for (int k = 0; k < o->C; k++) {
        params[w->offset + k] = last ? 0.0f : 1.0f;
        bufs[m->bufs.tensors[o->rv].offset + k] = 1.0f;
      }
    } else if (o->kind == DT_OP_LINEAR) {
      float bound = 1.0f / sqrtf((float)o->C);
      for (size_t k = 0; k < (size_t)w->rows * w->cols; k++)
        params[w->offset + k] = bound * (float)(2.0 * dt_rng_uniform(&r) - 1.0);
      for (int k = 0; k < o->OC; k++) params[bi->offset + k] = bound * (float)(2.0 * dt_rng_uniform(&r) - 1.0);
    }
  }
}
