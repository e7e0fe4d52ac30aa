/* A roofline of the CUDA backend's kernels by class (issue #22; `dtrain plan` prints it): for one
 * optimizer step of GPT-2 on one rank (the last pipeline stage: its blocks, the head and, with
 * pp = 1, the embeddings), the FLOPs and the HBM bytes of each class of kernel as dtrain's CUDA
 * code runs them now, and the class's time on a GPU datasheet: max(FLOPs / the peak of the units
 * it runs on, bytes / HBM bandwidth). Classes run one after another on the compute stream, so the
 * step is their sum (no launch gaps, no communication). Bytes count every tensor a kernel reads or
 * writes once (the compulsory traffic: tiles a kernel reads again from L2 or HBM are not counted).
 * A prediction from datasheet peaks, never compared with a GPU yet: bench/gpu_profile.sh splits a
 * real step by kernel (ncu) when one is lent, into the same classes. Pure: tests/test_plan.c
 * checks its numbers by hand. */
#ifndef DT_ROOFLINE_H
#define DT_ROOFLINE_H

#include <stdio.h>

#include "plan.h"

typedef enum {
  DT_KC_MATMUL,    /* the blocks' linear layers, forward and backward (cuBLAS) */
  DT_KC_LMHEAD,    /* the tied lm_head, forward and backward (cuBLAS) */
  DT_KC_ATTENTION, /* system.attention's kernels (cuBLAS products + softmax, flash, or cuDNN + conversions) */
  DT_KC_LAYERNORM,
  DT_KC_BIAS,      /* bias and residual epilogues, bias gradients (column sums) */
  DT_KC_GELU,
  DT_KC_EMBED,     /* token + position embedding, forward and backward */
  DT_KC_XENT,      /* softmax cross-entropy over the vocabulary, forward and in-place backward */
  DT_KC_ROUND,     /* bf16/fp16 storage rounding passes and the working copy of the weights */
  DT_KC_OPTIM,     /* zero_grad, the gradient norm's sum of squares, AdamW */
  DT_KC_N
} dt_kclass_t;

extern const char *const dt_kclass_names[DT_KC_N];

/* What runs a class's FLOPs: 0 fp32 CUDA cores, 1 TF32 tensor cores, 2 bf16/fp16 tensor cores. */
enum { DT_KU_FP32, DT_KU_TF32, DT_KU_16 };

typedef struct {
  double flops[DT_KC_N], bytes[DT_KC_N]; /* per optimizer step on the rank */
  int unit[DT_KC_N];
  int act_bytes;                         /* bytes per stored activation value (4 now; 2 = 16-bit storage) */
} dt_kroof_t;

/* The classes for the plan's configuration (p->in: dims, B, T, accum, tp, pp, precision, tf32,
 * attention, recompute) with activations and activation gradients stored in act_bytes bytes per
 * value: 4 is dtrain's CUDA backend today (bf16/fp16 round fp32 storage); 2 is what 16-bit storage
 * (#22 item 1, not built) would move: no rounding passes, 16-bit weights for the products, cuDNN
 * without its conversions, every product on 16-bit tensor cores. */
void dt_kroof_compute(const dt_plan_t *p, int act_bytes, dt_kroof_t *r);
/* Seconds per optimizer step on g: the sum over the classes, each in t_class[k] if not NULL. */
double dt_kroof_time(const dt_kroof_t *r, const dt_gpu_spec_t *g, double *t_class);
/* The table (`roofline: kernels ...` lines, each starting with prefix) on H100. */
void dt_kroof_print(const dt_plan_t *p, FILE *o, const char *prefix);

#endif
