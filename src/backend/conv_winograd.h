/* Winograd F(m x m, 3 x 3) convolution for the CPU backend (conv_winograd.c): the 3x3, stride-1,
 * padding-1 convolutions of ResNet, with the arguments and results of dt_conv2d_forward and
 * dt_conv2d_backward (ops_cnn_cpu.h), which call these when dt_conv_winograd_m says so. */
#ifndef DT_CONV_WINOGRAD_H
#define DT_CONV_WINOGRAD_H

#include <stddef.h>

#include "status.h"

typedef enum {
  DT_CONV_AUTO = 0,  /* Winograd F(2x2) for 3x3 stride-1 padding-1 layers, im2col for the rest */
  DT_CONV_IM2COL,    /* im2col + sgemm everywhere */
  DT_CONV_WINOGRAD2, /* F(2x2, 3x3) where it applies (as auto) */
  DT_CONV_WINOGRAD4  /* F(4x4, 3x3) where it applies: 4x fewer multiplies, about 10x the rounding error */
} dt_conv_algo_t;

/* Read DT_CONV from the environment (auto|im2col|winograd2|winograd4); DT_ERR_CONFIG naming the
 * value for anything else (auto is used then). The kernels call it lazily; call it at start-up to
 * report a bad value. */
dt_status_t dt_conv_algo_init(void);
/* Force an algorithm (tests, benchmarks); size the scratch after choosing it. */
void dt_conv_set_algo(dt_conv_algo_t a);
dt_conv_algo_t dt_conv_algo(void);
/* For logs: what 3x3 stride-1 layers of 16+ channels run, e.g. "Winograd F(2x2,3x3) (DT_CONV=auto)". */
const char *dt_conv_algo_name(void);
/* The Winograd tile m (2 or 4) the algorithm in use takes for this convolution (C input channels),
 * 0 for im2col. */
int dt_conv_winograd_m(int C, int KH, int KW, int stride, int pad);

/* Floats of scratch for F(m x m) on (C, H, W) -> (OC, H, W) with nthr threads: the transformed
 * filters and their gradient (m+2)^2 OC C each, a chunk's transformed inputs and outputs
 * ((m+2)^2 (C + OC) x about 512 tiles) and each thread's transform buffers. */
size_t dt_conv_winograd_scratch_floats(int m, int C, int OC, int H, int W, int nthr);
void dt_conv_winograd_forward(int m, float *out, float *scratch, const float *inp, const float *weight,
                              const float *bias, int B, int C, int H, int W, int OC, int nthr);
/* dt_conv2d_backward's dinp (if not NULL) and dweight; the bias gradient is the caller's. */
void dt_conv_winograd_backward(int m, float *dinp, float *dweight, float *scratch, const float *dout,
                               const float *inp, const float *weight, int B, int C, int H, int W, int OC, int nthr);

#endif
