/* Kernel parity of the image classifiers (see gpu_parity.cu): the same network (src/model/cnn.c,
 * written once over cnn_kernels.h) on the CPU backend and on the CUDA backend, from the same
 * weights and images: two training steps (forward, backward, the optimizer) and an evaluation
 * pass; compared: each step's loss, the gradients, the running statistics, the parameters and
 * optimizer state after the update, the evaluation's loss and top-1 count, and after forward
 * every activation. Each comparison starts from the same inputs: backward from the CPU's
 * activations, the update from its gradients, the next step from its parameters, optimizer state
 * and statistics. Without that the comparison measured the data's luck, not the kernels: a ReLU
 * whose input lies within rounding of 0 passes its gradient on one side only (ResNet-50's 49
 * ReLUs see such an input about once in ten steps of random data: its 1e-5 gradients then differ
 * by 1e-2 before it), AdamW turns the rounding noise of a near-zero gradient into a step of
 * +-lr, and one step's differences grew tenfold in the next (6 of 7 other seeds failed).
 * DTRAIN_PARITY_CNN_SEED=N draws other data (16 seeds pass). Three networks cover every kernel and
 * convolution shape: the SimpleCNN (3x3 with padding, max pooling, linear layers), ResNet-18 (3x3
 * with stride 2, 1x1 stride-2 shortcuts) and ResNet-50 (1x1 stride-1 bottlenecks), with SGD and
 * AdamW, in fp32 and bf16. */
#include <dlfcn.h>
#include <initializer_list>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_build.h" /* DT_HAVE_CUDA: dt_backend_cuda */
extern "C" {
#include "cnn.h"
#include "cnn_kernels.h"
#include "conv_winograd.h"
}
#include "gpu_parity.h"
#include "kmath.h"

/* A backend for one network: the CPU's bare kernels, or the CUDA backend initialised over a copy
 * of the network's layout (its arenas: the device parameters, gradients and optimizer state). */
typedef struct {
  dt_backend_t be;
  dt_layout_t lay;
  dt_cnn_t m;
  float *p, *g, *mo, *v, *bufs; /* backend memory */
} side_t;

/* gpu: 0 the CPU backend, 1 the CUDA backend, 2 the CUDA backend with cuDNN's convolutions, 3 with
 * cuDNN's convolutions, batch norm and pooling */
static void side_init(side_t *s, const dt_cnn_config_t *c, int B, int gpu, int prec) {
  memset(s, 0, sizeof *s);
  GP_TRY(dt_cnn_build(&s->m, c));
  if (gpu) {
    s->lay = s->m.lay;
    s->lay.d.T = 1, s->lay.d.L = 0; /* one gradient group; micro-batches of B x 1 */
    s->be.device = 0;
    s->be.cudnn_conv = gpu >= 2;
    s->be.cudnn_bn = gpu == 3;
    s->be.cudnn_pool = gpu == 3;
    GP_TRY(dt_backend_cuda.init(&s->be, &s->lay, B, 1, 1));
  } else {
    s->be.ops = &dt_backend_cpu, s->be.k = dt_backend_cpu.kernels, s->be.threads = 1;
  }
  s->be.precision = prec;
  GP_TRY(dt_cnn_alloc(&s->m, &s->be, B));
  size_t np = s->m.lay.n_params * sizeof(float);
  float **arr[] = {&s->p, &s->g, &s->mo, &s->v};
  for (int i = 0; i < 4; i++) GP_TRY(s->be.k->alloc(&s->be, (void **)arr[i], np));
  GP_TRY(s->be.k->alloc(&s->be, (void **)&s->bufs, s->m.bufs.n_params * sizeof(float)));
}

static void side_free(side_t *s) {
  float *arr[] = {s->p, s->g, s->mo, s->v, s->bufs};
  for (int i = 0; i < 5; i++) s->be.k->release(&s->be, arr[i]);
  dt_cnn_free(&s->m);
  if (s->be.ops->free) s->be.ops->free(&s->be);
}

static float *host_copy(side_t *s, const float *x, size_t n) {
  float *h = (float *)gp_host(n * sizeof(float));
  GP_TRY(s->be.k->download(&s->be, h, x, n * sizeof(float)));
  return h;
}

/* both sides' copies of backend array x (n floats) against each other */
static void compare(const char *what, const char *shape, int prec, side_t *cpu, side_t *gpu, const float *xc,
                    const float *xg, size_t n, double tol) {
  float *a = host_copy(gpu, xg, n), *b = host_copy(cpu, xc, n);
  gp_compare(what, shape, prec, a, b, n, tol);
  free(a), free(b);
}

/* the CPU side's backend memory xc (bytes) into the CUDA side's xg */
static void sync_to_gpu(side_t *cpu, side_t *gpu, const void *xc, void *xg, size_t bytes) {
  void *h = gp_host(bytes);
  GP_TRY(cpu->be.k->download(&cpu->be, h, xc, bytes));
  GP_TRY(gpu->be.k->upload(&gpu->be, xg, h, bytes));
  free(h);
}

/* What backward reads of forward (the same layout on both sides: one build of the network): the
 * activations, batch norm's statistics, the cross-entropy's rows, max pooling's argmax */
static void sync_forward(side_t *cpu, side_t *gpu) {
  const dt_cnn_t *c = &cpu->m;
  dt_cnn_t *g = &gpu->m;
  const size_t f = sizeof(float);
  sync_to_gpu(cpu, gpu, c->acts, g->acts, c->n_acts * f);
  sync_to_gpu(cpu, gpu, c->mean, g->mean, c->n_stat * f);
  sync_to_gpu(cpu, gpu, c->var, g->var, c->n_stat * f);
  sync_to_gpu(cpu, gpu, c->rstd, g->rstd, c->n_stat * f);
  sync_to_gpu(cpu, gpu, c->lse, g->lse, (size_t)c->B * f);
  sync_to_gpu(cpu, gpu, c->losses, g->losses, (size_t)c->B * f);
  if (c->n_idx) sync_to_gpu(cpu, gpu, c->idx, g->idx, c->n_idx * sizeof(int));
}

/* fp32: the products' summation order only; bf16: activations that land on either side of a bf16
 * rounding boundary differ by one bf16 step (2^-8) and carry it on */
static double tol(int prec, double fp32) { return prec == DT_PREC_FP32 ? fp32 : 2e-2; }

static void cnn_case(const char *name, dt_cnn_config_t c, int B, int adamw, float lr, int prec, dt_rng_t *r,
                     int gpu = 1) {
  char shape[64];
  snprintf(shape, sizeof shape, "%s %dx%dx%d B=%d %s", name, c.C, c.H, c.W, B, adamw ? "adamw" : "sgd");
  side_t cs, gs;
  side_init(&cs, &c, B, 0, prec);
  side_init(&gs, &c, B, gpu, prec);
  const size_t np = cs.m.lay.n_params, nb = cs.m.bufs.n_params, nx = (size_t)B * c.C * c.H * c.W;
  float *p = (float *)gp_host(np * sizeof(float)), *bufs = (float *)gp_host(nb * sizeof(float) + 4);
  dt_cnn_init_params(&cs.m, p, bufs, 5);
  for (side_t *s : {&cs, &gs}) {
    GP_TRY(s->be.k->upload(&s->be, s->p, p, np * sizeof(float)));
    GP_TRY(s->be.k->upload(&s->be, s->bufs, bufs, nb * sizeof(float)));
  }
  int *y = (int *)gp_host((size_t)B * sizeof(int));
  for (int step = 0; step < 2; step++) {
    float *x = gp_rand(r, nx, 1.0f, DT_PREC_FP32);
    for (int i = 0; i < B; i++) y[i] = (int)(dt_rng_uniform(r) * c.classes);
    double loss[2];
    side_t *sides[2] = {&cs, &gs};
    for (int k = 0; k < 2; k++) {
      side_t *s = sides[k];
      GP_TRY(s->be.k->clear(&s->be, s->g, np));
      GP_TRY(dt_cnn_forward(&s->m, s->p, s->bufs, x, y, 1, &loss[k], NULL));
    }
    float lf[2] = {(float)loss[1], (float)loss[0]};
    gp_compare("cnn loss", shape, prec, &lf[0], &lf[1], 1, tol(prec, 1e-5));
    compare("cnn activations", shape, prec, &cs, &gs, cs.m.acts, gs.m.acts, cs.m.n_acts, tol(prec, 1e-5));
    sync_forward(&cs, &gs); /* backward from the same activations */
    for (side_t *s : sides) GP_TRY(dt_cnn_backward(&s->m, s->p, s->g, 1.0f / (float)B));
    compare("cnn gradients", shape, prec, &cs, &gs, cs.g, gs.g, np, tol(prec, 1e-4));
    compare("cnn running statistics", shape, prec, &cs, &gs, cs.bufs, gs.bufs, nb, tol(prec, 1e-5));
    sync_to_gpu(&cs, &gs, cs.g, gs.g, np * sizeof(float)); /* the update from the same gradients */
    const float t = (float)(step + 1), bc1 = 1.0f - powf(0.9f, t), bc2 = 1.0f - powf(0.999f, t);
    for (side_t *s : sides) {
      const dt_cnn_kernels_t *ck = s->be.ops->cnn;
      if (adamw) GP_TRY(ck->adamw(&s->be, s->p, s->g, s->mo, s->v, np, 0.5f, lr, 0.9f, 0.999f, 1e-8f, 0.01f, bc1, bc2));
      else GP_TRY(ck->sgd(&s->be, s->p, s->g, s->mo, np, 0.5f, lr, 0.9f, 5e-4f, step));
    }
    compare(adamw ? "cnn adamw parameters" : "cnn sgd parameters", shape, prec, &cs, &gs, cs.p, gs.p, np,
            tol(prec, 1e-5));
    compare(adamw ? "cnn adamw m" : "cnn sgd momentum", shape, prec, &cs, &gs, cs.mo, gs.mo, np, 1e-6);
    if (adamw) compare("cnn adamw v", shape, prec, &cs, &gs, cs.v, gs.v, np, 1e-6);
    /* the next step from the same state */
    sync_to_gpu(&cs, &gs, cs.p, gs.p, np * sizeof(float));
    sync_to_gpu(&cs, &gs, cs.mo, gs.mo, np * sizeof(float));
    if (adamw) sync_to_gpu(&cs, &gs, cs.v, gs.v, np * sizeof(float));
    sync_to_gpu(&cs, &gs, cs.bufs, gs.bufs, nb * sizeof(float));
    free(x);
  }
  float *x = gp_rand(r, nx, 1.0f, DT_PREC_FP32);
  double el[2];
  int correct[2];
  GP_TRY(dt_cnn_forward(&cs.m, cs.p, cs.bufs, x, y, 0, &el[0], &correct[0]));
  GP_TRY(dt_cnn_forward(&gs.m, gs.p, gs.bufs, x, y, 0, &el[1], &correct[1]));
  float ef[4] = {(float)el[1], (float)correct[1], (float)el[0], (float)correct[0]};
  gp_compare("cnn eval loss", shape, prec, &ef[0], &ef[2], 1, tol(prec, 1e-5));
  gp_compare("cnn eval top-1 count", shape, prec, &ef[1], &ef[3], 1, 0.0);
  free(x), free(y), free(p), free(bufs);
  side_free(&cs);
  side_free(&gs);
}

/* One convolution with a bias (no network here has one) through both tables: the output, and
 * dinp, dweight, dbias (accumulated onto nonzero values) of a random dout. */
static void conv_case(int B, int C, int H, int W, int OC, int K, int stride, int pad, dt_rng_t *r, int gpu = 1) {
  char shape[64];
  snprintf(shape, sizeof shape, "%dx%dx%dx%d->%d k%d s%d p%d%s", B, C, H, W, OC, K, stride, pad,
           gpu == 2 ? " cudnn" : "");
  const dt_cnn_config_t c = {DT_CNN_SIMPLE, 1, 8, 8, 10, 4, 16, 0};
  side_t cs, gs;
  side_init(&cs, &c, 1, 0, DT_PREC_FP32);
  side_init(&gs, &c, 1, gpu, DT_PREC_FP32);
  const int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
  const size_t nx = (size_t)B * C * H * W, ny = (size_t)B * OC * OH * OW, nw = (size_t)OC * C * K * K;
  float *h[5] = {gp_rand(r, nx, 1.0f, 0), gp_rand(r, nw, 0.3f, 0), gp_rand(r, OC, 1.0f, 0), gp_rand(r, ny, 1.0f, 0),
                 gp_rand(r, nw + OC, 1.0f, 0)}; /* x, w, bias, dout, the gradients' prior values */
  float *d[2][8];
  side_t *sides[2] = {&cs, &gs};
  for (int k = 0; k < 2; k++) {
    dt_backend_t *be = &sides[k]->be;
    const size_t scr = be->ops->cnn->conv2d_scratch_floats(be, C, K, OC, OH, OW, stride, pad);
    const size_t n[8] = {nx, nw, (size_t)OC, ny, nw + OC, ny, nx, scr};
    for (int i = 0; i < 8; i++) GP_TRY(be->k->alloc(be, (void **)&d[k][i], n[i] * sizeof(float) + 4));
    for (int i = 0; i < 5; i++) GP_TRY(be->k->upload(be, d[k][i], h[i], n[i] * sizeof(float)));
    const dt_cnn_kernels_t *ck = be->ops->cnn;
    GP_TRY(ck->conv2d_forward(be, d[k][5], d[k][7], d[k][0], d[k][1], d[k][2], B, C, H, W, OC, K, stride, pad));
    GP_TRY(ck->conv2d_backward(be, d[k][6], d[k][4], d[k][4] + nw, d[k][7], d[k][3], d[k][0], d[k][1], B, C, H, W, OC,
                               K, stride, pad));
  }
  compare("conv2d_forward (bias)", shape, 0, &cs, &gs, d[0][5], d[1][5], ny, 2e-6);
  compare("conv2d_backward dinp", shape, 0, &cs, &gs, d[0][6], d[1][6], nx, 2e-6);
  compare("conv2d_backward dw, dbias", shape, 0, &cs, &gs, d[0][4], d[1][4], nw + OC, 2e-6);
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 8; i++) sides[k]->be.k->release(&sides[k]->be, d[k][i]);
  for (int i = 0; i < 5; i++) free(h[i]);
  side_free(&cs);
  side_free(&gs);
}

void gp_cnn_all(dt_rng_t *r) {
  /* The CPU side convolves by im2col, as the CUDA backend does: kernel parity compares the same
   * algorithm on two backends. (With the CPU's Winograd the 3x3 layers' rounding differs, and
   * ResNet-18's 1x1 last stage, batch norm over 3 values, amplified it to 4e-4 in a step's loss;
   * Winograd's own accuracy is tests/ref_cnn.sh's, against PyTorch.) */
  dt_conv_set_algo(DT_CONV_IM2COL);
  conv_case(3, 5, 9, 7, 6, 3, 2, 1, r); /* odd sizes, stride 2 */
  conv_case(2, 4, 6, 6, 3, 1, 1, 0, r); /* pointwise: the images multiplied directly */
  conv_case(2, 3, 7, 7, 4, 5, 1, 2, r); /* a 5x5 window */
  conv_case(27, 16, 64, 64, 16, 3, 1, 1, r); /* the CUDA side in two chunks of images (25 + 2) */
  for (int prec : {(int)DT_PREC_FP32, (int)DT_PREC_BF16}) {
    dt_cnn_config_t simple = {DT_CNN_SIMPLE, 1, 12, 12, 10, 4, 16, 0};
    cnn_case("cnn", simple, 5, 0, 0.05f, prec, r);
    dt_cnn_config_t r18 = {DT_CNN_RESNET18, 3, 8, 8, 10, 4, 0, 0};
    cnn_case("resnet18", r18, 3, 1, 1e-3f, prec, r);
  }
  /* 16x16: the last stage's batch norms see B x 2 x 2 values per channel (at 8x8, B x 1 x 1 = 2:
   * statistics of two values amplify float rounding past any tolerance). A gentle lr: at 0.05 the
   * first step's 1e-6 differences grew to 1.8e-2 in the second step's gradients (between two CPU
   * thread counts to 3.4e-4), at 0.005 to 3.7e-5, at 0 they stay 4.7e-6 (no state carried wrong). */
  dt_cnn_config_t r50 = {DT_CNN_RESNET50, 3, 16, 16, 7, 4, 0, 0};
  cnn_case("resnet50", r50, 4, 0, 0.002f, DT_PREC_FP32, r);
#if defined(DT_HAVE_CUDNN_H) || defined(DT_CUDA_EMU_RUNTIME)
  /* system.conv, system.batchnorm and system.pool = cudnn (the emulation: cuda/emu/cudnn.cpp's): the
   * same convolutions, a whole ResNet-18 (global average pooling) and the SimpleCNN (max pooling;
   * batch norm with and without its ReLU fused, which the cuDNN path applies as a kernel of its own). On a GPU skipped,
   * with a line, where this machine has no cuDNN to load (an option, not a requirement), and under
   * DTRAIN_PARITY_NO_CUDNN */
  if (getenv("DTRAIN_PARITY_NO_CUDNN")) { /* scripts/gpu-check.sh's compute-sanitizer runs */
    printf("# cudnn cases skipped: DTRAIN_PARITY_NO_CUDNN is set\n");
    return;
  }
#ifndef DT_CUDA_EMU_RUNTIME
  void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("# cudnn cases skipped: %s\n", dlerror());
    return;
  }
  dlclose(lib);
#endif
  conv_case(3, 5, 9, 7, 6, 3, 2, 1, r, 2);
  conv_case(2, 4, 6, 6, 3, 1, 1, 0, r, 2);
  conv_case(2, 3, 7, 7, 4, 5, 1, 2, r, 2);
  conv_case(27, 16, 64, 64, 16, 3, 1, 1, r, 2);
  dt_cnn_config_t r18c = {DT_CNN_RESNET18, 3, 8, 8, 10, 4, 0, 0};
  cnn_case("resnet18 cudnn", r18c, 3, 1, 1e-3f, DT_PREC_FP32, r, 2);
  /* 16x16 (the last stage's statistics over B x 2 x 2 values, not 3): cuDNN's statistics are its own
   * sums (the emulation's in double), and at 8x8 the CPU's float sums over 3 values differed from
   * them by 1.5e-5 in the activations after batch norm */
  dt_cnn_config_t r18b = {DT_CNN_RESNET18, 3, 16, 16, 10, 4, 0, 0};
  cnn_case("resnet18 cudnn+bn+pool", r18b, 3, 1, 1e-3f, DT_PREC_FP32, r, 3);
  dt_cnn_config_t simple = {DT_CNN_SIMPLE, 1, 12, 12, 10, 4, 16, 0};
  cnn_case("cnn cudnn+bn+pool", simple, 5, 0, 0.05f, DT_PREC_FP32, r, 3);
  cnn_case("cnn cudnn+bn+pool", simple, 5, 0, 0.05f, DT_PREC_BF16, r, 3);
#endif
}
