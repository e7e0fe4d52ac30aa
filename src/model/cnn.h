/* Convolutional image classifiers (issue #25): a small configurable CNN (the seed's SimpleCNN,
 * with batch norm), ResNet-18 and ResNet-50 with the CIFAR stem (a 3x3 convolution, stride 1, no
 * max pooling: 32x32 inputs). The network is a list of operations over activation slots (slot 0
 * is the input batch, operation i writes slot i + 1), built once from the configuration
 * (cnn_build.c) and run forward and backward (cnn.c) over a backend's memory and kernels
 * (src/backend/cnn_kernels.h, the CPU's: ops_cnn_cpu.h).
 *
 * Parameters live in one arena like GPT-2's (dt_layout_t, built field by field, tp = pp = 1),
 * named and shaped as torchvision's state_dict ("layer2.0.downsample.0.weight": conv weights (OC,
 * C, KH, KW) stored as rows = OC, cols = C*KH*KW, ndim = 4); batch norm's running statistics
 * ("bn1.running_mean", "bn1.running_var") are buffers in a second arena of the same kind: saved
 * with the model, never optimised.
 *
 * Status: the layers, the models, training steps and evaluation are checked against PyTorch
 * (tests/ref_cnn.sh); `dtrain` trains them (model.arch, src/app/train_cnn.c) with data
 * parallelism (the sync strategies of parallel/sync.h: DDP buckets during backward, ZeRO 1-3),
 * synchronised batch norm and checkpoints (train_cnn_ckpt.c), on the CPU and the CUDA backend
 * (checked on the CUDA emulation: tests/gpu_parity_cnn.cu, tests/emu_cnn.sh; not yet on a GPU). */
#ifndef DT_CNN_H
#define DT_CNN_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "status.h"

typedef enum { DT_CNN_SIMPLE = 0, DT_CNN_RESNET18, DT_CNN_RESNET50 } dt_cnn_arch_t;

typedef struct {
  dt_cnn_arch_t arch;
  int C, H, W;  /* input image: channels, height, width */
  int classes;
  int width;    /* simple: channels of the first convolution (the second has 2 x width);
                   resnet: channels of the stem and of layer1 (64 in torchvision) */
  int hidden;   /* simple: units of the hidden linear layer */
  int zero_init_residual; /* resnet: the last batch norm of every residual branch starts at weight 0
                             (torchvision's zero_init_residual: each block starts as the identity) */
} dt_cnn_config_t;

typedef enum { DT_OP_CONV, DT_OP_BN, DT_OP_RELU, DT_OP_MAXPOOL, DT_OP_GAP, DT_OP_LINEAR, DT_OP_ADD } dt_cnn_op_kind_t;

typedef struct {
  dt_cnn_op_kind_t kind;
  int in, in2;        /* input slots (in2: the add's second operand, else -1) */
  int w, b;           /* parameter tensors (index into lay.tensors, -1 none) */
  int rm, rv;         /* batch norm: buffer tensors of the running mean and variance */
  int C, H, W;        /* input shape per image (linear: C = input features, H = W = 1) */
  int OC, K, stride, pad;  /* conv (OC output channels), maxpool (OC = C), linear (OC outputs) */
  size_t aux;         /* batch norm: offset of its C floats in each statistics array; maxpool: of its
                         output's B*C*OH*OW argmax indices */
} dt_cnn_op_t;

typedef struct {
  int C, H, W;        /* shape per image */
  size_t off;         /* offset of its activations (B images) in the arena (acts), or in the pool
                         (dacts) when pooled: forward alone reads them; SIZE_MAX: none (fused) */
  size_t doff;        /* offset of its gradient in the pool (dacts; SIZE_MAX: none) */
  int pooled;
} dt_cnn_slot_t;

typedef struct {
  dt_cnn_config_t cfg;
  dt_layout_t lay;    /* parameters */
  dt_layout_t bufs;   /* batch norm running statistics */
  int n_ops, n_slots;
  dt_cnn_op_t *ops;
  dt_cnn_slot_t *slots;
  size_t n_stat;      /* floats of each batch-norm statistics array (sum of the BN ops' C) */
  /* memory for a batch of B images (dt_cnn_alloc): backend memory from be (the arrays below up to
   * labels), host memory after */
  dt_backend_t *be;
  int B;
  int mem_private; /* set before dt_cnn_alloc: every slot's activations and gradient their own
                      memory instead of a pool shared by those never alive together (tests) */
  float *acts, *dacts, *tmp, *scratch, *mean, *var, *rstd, *sdy, *sdyx, *losses, *lse;
  double *loss;           /* [0] the loss sum (dt_cnn_loss_sum), [1] one forward's */
  int *idx, *labels;
  size_t n_acts, n_dacts, n_tmp, n_idx;
  unsigned char *written; /* backward: slot gradient written yet */
  float *stat_host;       /* 2 x the widest batch norm's C: synchronised statistics on their way */
  float *logits_host;     /* B x classes: the logits, for the top-1 count */
  /* Synchronised batch norm (data parallelism, every rank the same B): sync_sum adds n doubles
   * over the sync_ranks ranks in place; training statistics are then the whole global batch's
   * (forward: each channel's mean and E[x^2]; backward: the sums of dy and dy*(x - mean)), as
   * torch.nn.SyncBatchNorm. NULL: each rank's own batch. The first failure is kept in sync_err. */
  dt_status_t (*sync_sum)(void *ctx, double *buf, int n);
  void *sync_ctx;
  int sync_ranks;
  dt_status_t sync_err;
  double *sync_buf;       /* 2 x the widest batch norm's C */
  /* Gradient-ready hook (data parallelism's buckets, ZeRO-2's reductions; NULL: none): backward
   * calls ready(ready_ctx, lo, hi) as soon as the parameter gradients in [lo, hi) of lay's arena
   * are final, ranges in decreasing order tiling [0, lay.n_params). A tensor is final once the
   * operation that owns it (owner[t], dt_cnn_alloc) has run backward; arena order and operation
   * order differ (a shortcut's convolution is stored after its block's), so a range reaches down
   * only to the lowest tensor below which nothing is pending. Before each call the backend's
   * grads_ready(k) marks the point (k: the range's lowest tensor, as the backend's gradient group:
   * the trainer's layout has one group per tensor). */
  dt_grad_ready_fn ready;
  void *ready_ctx;
  /* Mixed precision: be->precision (precision.h; fp32 by default): every activation an operation
   * writes and every activation gradient is rounded to it as it is stored (forward's slots,
   * backward's slot gradients after each write or sum); batch norm's statistics, the loss, the
   * parameter gradients stay fp32. The caller passes the rounded working copy of the parameters. */
  /* Layer hook (ZeRO-3's gathers; NULL: none): called with the index t (into lay.tensors) of every
   * parameter tensor an operation reads: DT_HOOK_FWD before its forward and DT_HOOK_FWD_DONE after
   * it, in increasing t; DT_HOOK_BWD before its backward and DT_HOOK_BWD_DONE after, in decreasing
   * t. An error stops the pass. */
  dt_layer_hook_fn layer_hook;
  void *hook_ctx;
  int *owner;             /* lay.n_tensors: the operation using each tensor (n_ops: none) */
  unsigned char *fused;   /* n_ops: a batch norm or residual add run with the ReLU after it (dt_cnn_alloc) */
} dt_cnn_t;

/* Parse "cnn" | "resnet18" | "resnet50". DT_ERR_CONFIG naming model.arch otherwise. */
dt_status_t dt_cnn_arch_parse(const char *s, dt_cnn_arch_t *arch);
/* Build the operation list, the slots and both layouts. DT_ERR_CONFIG for shapes the network
 * cannot take (e.g. an image too small for its poolings), naming the key. */
dt_status_t dt_cnn_build(dt_cnn_t *m, const dt_cnn_config_t *c);
/* Activation and scratch memory for batches of B images from backend be (its kernels run the
 * model from then on; be needs no init for this: alloc, release and the kernels). DT_ERR_CONFIG
 * naming the backend when it has no image-classifier kernels (be->ops->cnn NULL). */
dt_status_t dt_cnn_alloc(dt_cnn_t *m, dt_backend_t *be, int B);
/* The bytes dt_cnn_alloc allocates for B images of a built model (for the planner): on the CPU
 * backend with nthr threads (ck NULL), or with the convolution scratch of kernel table ck, whose
 * conv2d_scratch_floats is asked without a backend (the CUDA table's needs none). */
double dt_cnn_alloc_bytes(const dt_cnn_t *m, int B, int nthr, const dt_cnn_kernels_t *ck);
void dt_cnn_free(dt_cnn_t *m);

/* torchvision's initialisation, deterministic in seed: convolutions kaiming normal (fan_out,
 * ReLU gain: std sqrt(2 / (OC KH KW))), biases of convolutions 0, batch norm weight 1 and bias 0,
 * running mean 0 and variance 1, linear layers uniform(-1/sqrt(in), 1/sqrt(in)) (weight and bias);
 * with zero_init_residual the weight of each residual branch's last batch norm is 0. */
void dt_cnn_init_params(const dt_cnn_t *m, float *params, float *bufs, uint64_t seed);

/* Forward over B images x (B, C, H, W) with labels y (B), both host memory; params, bufs, grads:
 * backend memory. *loss = the mean cross-entropy (host; rounded to float), or with loss NULL that
 * mean added to the model's loss sum in backend memory (dt_cnn_loss_sum: no host wait for it);
 * *correct (when not NULL) = the number of correct top-1 predictions. training: batch norm uses
 * the batch's statistics and updates the running ones in bufs (momentum 0.1); else the running
 * ones. */
dt_status_t dt_cnn_forward(dt_cnn_t *m, const float *params, float *bufs, const float *x, const int *y, int training,
                           double *loss, int *correct);
/* *sum_host = the sum of the mean losses of the forwards with loss NULL since the last call; the
 * sum starts again from 0 */
dt_status_t dt_cnn_loss_sum(dt_cnn_t *m, double *sum_host);
/* Backward of the last training forward: grads += d(dloss * sum of the B losses) / d params
 * (dloss = 1/B for the batch mean; 1/(B accum) over accum micro-batches), reporting final ranges
 * to m->ready when set. */
dt_status_t dt_cnn_backward(dt_cnn_t *m, const float *params, float *grads, float dloss);

#endif
