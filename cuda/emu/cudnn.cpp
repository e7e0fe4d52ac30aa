/* CUDA emulation: cuDNN's convolutions, spatial batch norm and pooling (cudnn.h), for the code of
 * cuda/conv_cudnn.cu (system.conv, system.batchnorm, system.pool = cudnn). What it checks as cuDNN
 * does, at the call: descriptors set, in fp32 NCHW, whose shapes fit together (an output of the
 * size the convolution gives, a 1 x C x 1 x 1 batch-norm parameter tensor), an algorithm of those
 * the query listed, a workspace at least as large as that algorithm's entry says. At run time (a
 * stream op on the handle's stream): every operand inside one allocation of the handle's device,
 * else a sticky illegal address; the workspace is filled with NaN first, so a result that depends
 * on it, or an operand that lies in it, shows. The arithmetic is the definition, accumulated in
 * double: cross-correlation as PyTorch, alpha * result + beta * prior (the prior not read where
 * beta is 0, as cuDNN), TF32 rounding of the operands under CUDNN_DEFAULT_MATH. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>
#include <vector>

#include "cudnn.h"
#include "emu_int.h"

struct dt_emu_cudnn {
  int device;
  cudaStream_t stream;
};
struct dt_emu_cudnn_tensor {
  int set, n, c, h, w;
};
struct dt_emu_cudnn_filter {
  int set, k, c, h, w;
};
struct dt_emu_cudnn_conv {
  int set, pad, stride;
  cudnnMathType_t math;
};
struct dt_emu_cudnn_pool {
  int set, avg, kh, kw, ph, pw, sh, sw;
};

namespace dt_emu {

/* fp32 rounded to TF32 (10 mantissa bits, to nearest even; NaN and infinity kept) */
static float tf32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  memcpy(&x, &u, 4);
  return x;
}

static size_t numel(const dt_emu_cudnn_tensor *t) { return (size_t)t->n * t->c * t->h * t->w; }

/* A convolution's shapes: x (N, C, H, W), w (K, C, R, R), y (N, K, P, Q) */
struct geom_t {
  int N, C, H, W, K, R, P, Q, stride, pad, tf32;
};

static cudnnStatus_t geometry(const dt_emu_cudnn_tensor *x, const dt_emu_cudnn_filter *w, const dt_emu_cudnn_conv *cv,
                              const dt_emu_cudnn_tensor *y, geom_t *g) {
  if (!x || !w || !cv || !y || !x->set || !w->set || !cv->set || !y->set) return CUDNN_STATUS_BAD_PARAM;
  if (w->h != w->w || x->c != w->c || y->n != x->n || y->c != w->k) return CUDNN_STATUS_BAD_PARAM;
  const int P = (x->h + 2 * cv->pad - w->h) / cv->stride + 1, Q = (x->w + 2 * cv->pad - w->w) / cv->stride + 1;
  if (P < 1 || Q < 1 || y->h != P || y->w != Q) return CUDNN_STATUS_BAD_PARAM;
  *g = geom_t{x->n, x->c, x->h, x->w, w->k, w->h, P, Q, cv->stride, cv->pad, cv->math == CUDNN_DEFAULT_MATH};
  return CUDNN_STATUS_SUCCESS;
}

/* The workspace the listed deterministic algorithm asks for: one image's im2col matrix */
static size_t ws_need(const geom_t &g) { return (size_t)g.C * g.R * g.R * g.P * g.Q * sizeof(float); }

/* Queue fn on the handle's stream; at run time first check the operands (pointer, bytes, name) and
 * fill the workspace with NaN. */
struct operand_t {
  const void *p;
  size_t bytes;
  const char *name;
};
static cudnnStatus_t queue(cudnnHandle_t h, const char *call, std::vector<operand_t> ops, void *ws, size_t ws_bytes,
                           std::vector<range_t> writes, std::function<void()> fn) {
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  if (entry() != cudaSuccess) return CUDNN_STATUS_EXECUTION_FAILED;
  cudaError_t e;
  const int cur = current_device();
  cudaSetDevice(h->device);
  stream_t *s = get_stream(h->stream, &e);
  cudaSetDevice(cur);
  if (!s) return CUDNN_STATUS_EXECUTION_FAILED;
  if (ws_bytes) ops.push_back(operand_t{ws, ws_bytes, "workspace"});
  op_t op;
  op.what = call;
  op.writes = std::move(writes);
  const int dev = h->device;
  op.run = [=]() {
    for (const operand_t &o : ops) {
      char why[256];
      if (o.bytes && heap_check_range(o.p, o.bytes, dev, why, sizeof why)) {
        fail_sticky(dev, cudaErrorIllegalAddress, "%s: %s: %s", call, o.name, why);
        return;
      }
    }
    for (size_t i = 0; i < ws_bytes / sizeof(float); i++)
      ((float *)ws)[i] = NAN;
    fn();
  };
  enqueue(s, std::move(op));
  return CUDNN_STATUS_SUCCESS;
}

static range_t span(const void *p, size_t bytes) { return range_t{(uintptr_t)p, (uintptr_t)p + bytes}; }

/* out[i] = alpha * r[i] + beta * out[i] (out not read where beta is 0) */
static void blend(float *out, const std::vector<double> &r, float alpha, float beta) {
  for (size_t i = 0; i < r.size(); i++)
    out[i] = (float)(alpha * r[i] + (beta != 0.0f ? (double)beta * out[i] : 0.0));
}

static float in_tf32(const float *p, size_t i, int t) { return t ? tf32(p[i]) : p[i]; }

/* The three directions of one cross-correlation, summed in double: what = 0 y from x and w, 1 dx
 * from dy and w, 2 dw from x and dy */
static std::vector<double> correlate(const geom_t &g, int what, const float *a, const float *b) {
  const size_t nx = (size_t)g.N * g.C * g.H * g.W, nw = (size_t)g.K * g.C * g.R * g.R;
  std::vector<double> r(what == 0 ? (size_t)g.N * g.K * g.P * g.Q : what == 1 ? nx : nw, 0.0);
  for (int n = 0; n < g.N; n++)
    for (int k = 0; k < g.K; k++)
      for (int p = 0; p < g.P; p++)
        for (int q = 0; q < g.Q; q++) {
          const size_t yi = (((size_t)n * g.K + k) * g.P + p) * g.Q + q;
          for (int c = 0; c < g.C; c++)
            for (int i = 0; i < g.R; i++)
              for (int j = 0; j < g.R; j++) {
                const int h = p * g.stride - g.pad + i, w = q * g.stride - g.pad + j;
                if (h < 0 || h >= g.H || w < 0 || w >= g.W) continue;
                const size_t xi = (((size_t)n * g.C + c) * g.H + h) * g.W + w,
                             wi = (((size_t)k * g.C + c) * g.R + i) * g.R + j;
                if (what == 0)
                  r[yi] += (double)in_tf32(a, xi, g.tf32) * in_tf32(b, wi, g.tf32);
                else if (what == 1)
                  r[xi] += (double)in_tf32(a, yi, g.tf32) * in_tf32(b, wi, g.tf32);
                else
                  r[wi] += (double)in_tf32(a, xi, g.tf32) * in_tf32(b, yi, g.tf32);
              }
        }
  return r;
}

/* The algorithm numbers each direction's query ranks (what = 0 forward, 1 backward data, 2 backward
 * filter): a non-deterministic one first, a deterministic one that needs a workspace, a
 * deterministic one that needs none (cuDNN's numbers for kinds of that sort) */
enum { NONDET, DET_WS, DET };
static const int k_algo[3][3] = {
    {1, CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, 4},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3}};

template <typename Perf, typename Algo>
static void rank_algos(int what, int requested, int *returned, Perf *perf, size_t need) {
  const int *a = k_algo[what];
  const Perf all[3] = {
      {(Algo)a[NONDET], CUDNN_STATUS_SUCCESS, 0.1f, 0, CUDNN_NON_DETERMINISTIC, CUDNN_DEFAULT_MATH, {0}},
      {(Algo)a[DET_WS], CUDNN_STATUS_SUCCESS, 0.2f, need, CUDNN_DETERMINISTIC, CUDNN_DEFAULT_MATH, {0}},
      {(Algo)a[DET], CUDNN_STATUS_SUCCESS, 0.3f, 0, CUDNN_DETERMINISTIC, CUDNN_DEFAULT_MATH, {0}}};
  *returned = requested < 3 ? requested : 3;
  for (int i = 0; i < *returned; i++)
    perf[i] = all[i];
}

/* The workspace algorithm `algo` of direction `what` asks for (its entry above), or -1 for one not listed */
static long long algo_ws(int what, int algo, size_t need) {
  const int *a = k_algo[what];
  return algo == a[NONDET] || algo == a[DET] ? 0 : algo == a[DET_WS] ? (long long)need : -1;
}

} // namespace dt_emu

using namespace dt_emu;

extern "C" {

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    cudaGetLastError();
    return CUDNN_STATUS_NOT_INITIALIZED;
  }
  *handle = new dt_emu_cudnn{current_device(), NULL};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  cudaError_t e;
  if (!handle || (stream && !get_stream(stream, &e))) return CUDNN_STATUS_BAD_PARAM;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

const char *cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
  case CUDNN_STATUS_SUCCESS:
    return "CUDNN_STATUS_SUCCESS";
  case CUDNN_STATUS_NOT_INITIALIZED:
    return "CUDNN_STATUS_NOT_INITIALIZED";
  case CUDNN_STATUS_BAD_PARAM:
    return "CUDNN_STATUS_BAD_PARAM";
  case CUDNN_STATUS_NOT_SUPPORTED:
    return "CUDNN_STATUS_NOT_SUPPORTED";
  case CUDNN_STATUS_EXECUTION_FAILED:
    return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

size_t cudnnGetVersion(void) { return CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL; }

#define DESCRIPTOR(T, Create, Destroy)                                                                                 \
  cudnnStatus_t Create(T *d) {                                                                                         \
    *d = new std::remove_pointer<T>::type();                                                                           \
    return CUDNN_STATUS_SUCCESS;                                                                                       \
  }                                                                                                                    \
  cudnnStatus_t Destroy(T d) {                                                                                         \
    delete d;                                                                                                          \
    return CUDNN_STATUS_SUCCESS;                                                                                       \
  }
DESCRIPTOR(cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor)
DESCRIPTOR(cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor)
DESCRIPTOR(cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor)
DESCRIPTOR(cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor)
#undef DESCRIPTOR

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format, cudnnDataType_t type,
                                         int n, int c, int h, int w) {
  if (!d || n < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW || type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
  *d = dt_emu_cudnn_tensor{1, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w) {
  if (!d || k < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW || type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
  *d = dt_emu_cudnn_filter{1, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
  if (!d || pad_h < 0 || u < 1 || dilation_h < 1 || dilation_w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (pad_h != pad_w || u != v || dilation_h != 1 || dilation_w != 1 || mode != CUDNN_CROSS_CORRELATION ||
      computeType != CUDNN_DATA_FLOAT)
    return CUDNN_STATUS_NOT_SUPPORTED; /* the emulation's subset: square, undilated, as PyTorch's */
  d->set = 1, d->pad = pad_h, d->stride = u;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t mathType) {
  if (!d || mathType < CUDNN_DEFAULT_MATH || mathType > CUDNN_FMA_MATH) return CUDNN_STATUS_BAD_PARAM;
  d->math = mathType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t cv,
                                                     cudnnTensorDescriptor_t y, int requested, int *returned,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf) {
  geom_t g;
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  if (geometry(x, w, cv, y, &g) || requested < 1 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
  rank_algos<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(0, requested, returned, perf, ws_need(g));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, cudnnFilterDescriptor_t w,
                                                          cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t cv,
                                                          cudnnTensorDescriptor_t dx, int requested, int *returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  geom_t g;
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  if (geometry(dx, w, cv, dy, &g) || requested < 1 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
  rank_algos<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(1, requested, returned, perf,
                                                                               ws_need(g));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                            cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t cv,
                                                            cudnnFilterDescriptor_t dw, int requested, int *returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
  geom_t g;
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  if (geometry(x, dw, cv, dy, &g) || requested < 1 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
  rank_algos<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(2, requested, returned, perf,
                                                                                   ws_need(g));
  return CUDNN_STATUS_SUCCESS;
}

/* The three directions: what = 0 forward, 1 backward data, 2 backward filter (correlate's) */
static cudnnStatus_t conv_call(const char *call, int what, cudnnHandle_t h, const void *alpha, const geom_t &g,
                               const float *a, const float *b, int algo, void *ws, size_t ws_bytes, const void *beta,
                               float *out) {
  const long long need = algo_ws(what, algo, ws_need(g));
  if (need < 0) return EMU_BAD(CUDNN_STATUS_BAD_PARAM, "%s: algorithm %d is not one its query listed", call, algo);
  if (ws_bytes < (size_t)need || (need > 0 && !ws))
    return EMU_BAD(CUDNN_STATUS_BAD_PARAM, "%s: algorithm %d needs a workspace of %lld bytes, got %zu at %p", call,
                   algo, need, ws_bytes, ws);
  const size_t nx = (size_t)g.N * g.C * g.H * g.W * 4, ny = (size_t)g.N * g.K * g.P * g.Q * 4;
  const size_t nw = (size_t)g.K * g.C * g.R * g.R * 4;
  const size_t na = what == 1 ? ny : nx,
               nb = what == 0   ? nw
                    : what == 1 ? nw
                                : ny,
               no = what == 0   ? ny
                    : what == 1 ? nx
                                : nw;
  const float al = *(const float *)alpha, be = *(const float *)beta;
  return queue(h, call, {{a, na, "first operand"}, {b, nb, "second operand"}, {out, no, "output"}}, ws, (size_t)need,
               {span(out, no)}, [=]() { blend(out, correlate(g, what, a, b), al, be); });
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w, cudnnConvolutionDescriptor_t cv,
                                      cudnnConvolutionFwdAlgo_t algo, void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *y) {
  geom_t g;
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  if (geometry(xd, wd, cv, yd, &g) || !alpha || !beta) return CUDNN_STATUS_BAD_PARAM;
  return conv_call("cudnnConvolutionForward", 0, h, alpha, g, (const float *)x, (const float *)w, algo, ws, ws_bytes,
                   beta, (float *)y);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha, cudnnFilterDescriptor_t wd,
                                           const void *w, cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t cv, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *ws, size_t ws_bytes, const void *beta, cudnnTensorDescriptor_t dxd,
                                           void *dx) {
  geom_t g;
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  if (geometry(dxd, wd, cv, dyd, &g) || !alpha || !beta) return CUDNN_STATUS_BAD_PARAM;
  return conv_call("cudnnConvolutionBackwardData", 1, h, alpha, g, (const float *)dy, (const float *)w, algo, ws,
                   ws_bytes, beta, (float *)dx);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd,
                                             const void *x, cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t cv, cudnnConvolutionBwdFilterAlgo_t algo,
                                             void *ws, size_t ws_bytes, const void *beta, cudnnFilterDescriptor_t dwd,
                                             void *dw) {
  geom_t g;
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  if (geometry(xd, dwd, cv, dyd, &g) || !alpha || !beta) return CUDNN_STATUS_BAD_PARAM;
  return conv_call("cudnnConvolutionBackwardFilter", 2, h, alpha, g, (const float *)x, (const float *)dy, algo, ws,
                   ws_bytes, beta, (float *)dw);
}

/* A batch norm call's shapes: x, y (or dy, dx) alike, the parameters' tensor 1 x C x 1 x 1 */
static cudnnStatus_t bn_shapes(cudnnBatchNormMode_t mode, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y,
                               cudnnTensorDescriptor_t y2, cudnnTensorDescriptor_t p, double eps) {
  if (mode != CUDNN_BATCHNORM_SPATIAL && mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT) return CUDNN_STATUS_NOT_SUPPORTED;
  if (!x || !y || !y2 || !p || !x->set || !y->set || !y2->set || !p->set || eps < CUDNN_BN_MIN_EPSILON)
    return CUDNN_STATUS_BAD_PARAM;
  for (cudnnTensorDescriptor_t t : {y, y2})
    if (t->n != x->n || t->c != x->c || t->h != x->h || t->w != x->w) return CUDNN_STATUS_BAD_PARAM;
  if (p->n != 1 || p->c != x->c || p->h != 1 || p->w != 1) return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

/* Channel c's mean and biased variance over N x HW values, in double */
static void moments(const float *x, int N, int C, size_t HW, int c, double *mean, double *var) {
  double s = 0, s2 = 0;
  for (int n = 0; n < N; n++)
    for (size_t i = 0; i < HW; i++)
      s += x[((size_t)n * C + c) * HW + i];
  *mean = s / ((double)N * HW);
  for (int n = 0; n < N; n++)
    for (size_t i = 0; i < HW; i++) {
      const double d = x[((size_t)n * C + c) * HW + i] - *mean;
      s2 += d * d;
    }
  *var = s2 / ((double)N * HW);
}

cudnnStatus_t cudnnBatchNormalizationForwardTraining(cudnnHandle_t h, cudnnBatchNormMode_t mode, const void *alpha,
                                                     const void *beta, cudnnTensorDescriptor_t xd, const void *x,
                                                     cudnnTensorDescriptor_t yd, void *y, cudnnTensorDescriptor_t pd,
                                                     const void *scale, const void *bias, double factor, void *rmean,
                                                     void *rvar, double eps, void *smean, void *sinv) {
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  cudnnStatus_t st = bn_shapes(mode, xd, yd, yd, pd, eps);
  if (st) return st;
  if (!alpha || !beta || !x || !y || !scale || !bias || !rmean != !rvar || !smean != !sinv)
    return CUDNN_STATUS_BAD_PARAM;
  const int N = xd->n, C = xd->c;
  const size_t HW = (size_t)xd->h * xd->w, nx = numel(xd) * 4, nc = (size_t)C * 4;
  if ((size_t)N * HW < 2 && rmean) return CUDNN_STATUS_NOT_SUPPORTED; /* an unbiased variance of one value */
  const float al = *(const float *)alpha, be = *(const float *)beta;
  std::vector<operand_t> ops = {{x, nx, "x"}, {y, nx, "y"}, {scale, nc, "scale"}, {bias, nc, "bias"}};
  std::vector<range_t> w = {span(y, nx)};
  for (void *p : {rmean, rvar, smean, sinv})
    if (p) ops.push_back(operand_t{p, nc, "a statistics vector"}), w.push_back(span(p, nc));
  return queue(h, "cudnnBatchNormalizationForwardTraining", ops, NULL, 0, w, [=]() {
    const float *xf = (const float *)x, *sc = (const float *)scale, *bi = (const float *)bias;
    float *yf = (float *)y;
    const double n = (double)N * HW;
    for (int c = 0; c < C; c++) {
      double mean, var;
      moments(xf, N, C, HW, c, &mean, &var);
      const double inv = 1.0 / sqrt(var + eps);
      for (int b = 0; b < N; b++)
        for (size_t i = 0; i < HW; i++) {
          const size_t at = ((size_t)b * C + c) * HW + i;
          const double r = sc[c] * (xf[at] - mean) * inv + bi[c];
          yf[at] = (float)(al * r + (be != 0.0f ? (double)be * yf[at] : 0.0));
        }
      if (rmean) {
        float *rm = (float *)rmean, *rv = (float *)rvar;
        rm[c] = (float)((1.0 - factor) * rm[c] + factor * mean);
        rv[c] = (float)((1.0 - factor) * rv[c] + factor * var * n / (n - 1.0));
      }
      if (smean) ((float *)smean)[c] = (float)mean, ((float *)sinv)[c] = (float)inv;
    }
  });
}

cudnnStatus_t cudnnBatchNormalizationBackward(cudnnHandle_t h, cudnnBatchNormMode_t mode, const void *alphaDataDiff,
                                              const void *betaDataDiff, const void *alphaParamDiff,
                                              const void *betaParamDiff, cudnnTensorDescriptor_t xd, const void *x,
                                              cudnnTensorDescriptor_t dyd, const void *dy, cudnnTensorDescriptor_t dxd,
                                              void *dx, cudnnTensorDescriptor_t pd, const void *scale, void *dscale,
                                              void *dbias, double eps, const void *smean, const void *sinv) {
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  cudnnStatus_t st = bn_shapes(mode, xd, dyd, dxd, pd, eps);
  if (st) return st;
  if (!alphaDataDiff || !betaDataDiff || !alphaParamDiff || !betaParamDiff || !x || !dy || !dx || !scale || !dscale ||
      !dbias || !smean != !sinv)
    return CUDNN_STATUS_BAD_PARAM;
  const int N = xd->n, C = xd->c;
  const size_t HW = (size_t)xd->h * xd->w, nx = numel(xd) * 4, nc = (size_t)C * 4;
  const float aD = *(const float *)alphaDataDiff, bD = *(const float *)betaDataDiff;
  const float aP = *(const float *)alphaParamDiff, bP = *(const float *)betaParamDiff;
  std::vector<operand_t> ops = {{x, nx, "x"},         {dy, nx, "dy"},         {dx, nx, "dx"},
                                {scale, nc, "scale"}, {dscale, nc, "dscale"}, {dbias, nc, "dbias"}};
  if (smean) ops.push_back(operand_t{smean, nc, "savedMean"}), ops.push_back(operand_t{sinv, nc, "savedInvVariance"});
  return queue(h, "cudnnBatchNormalizationBackward", ops, NULL, 0, {span(dx, nx), span(dscale, nc), span(dbias, nc)},
               [=]() {
                 const float *xf = (const float *)x, *g = (const float *)dy, *sc = (const float *)scale;
                 float *dxf = (float *)dx, *ds = (float *)dscale, *db = (float *)dbias;
                 const double n = (double)N * HW;
                 std::vector<double> r(numel(xd));
                 for (int c = 0; c < C; c++) {
                   double mean, inv, var;
                   if (smean)
                     mean = ((const float *)smean)[c], inv = ((const float *)sinv)[c];
                   else
                     moments(xf, N, C, HW, c, &mean, &var), inv = 1.0 / sqrt(var + eps);
                   double sdy = 0, sdyx = 0;
                   for (int b = 0; b < N; b++)
                     for (size_t i = 0; i < HW; i++) {
                       const size_t at = ((size_t)b * C + c) * HW + i;
                       sdy += g[at], sdyx += g[at] * (xf[at] - mean) * inv;
                     }
                   for (int b = 0; b < N; b++)
                     for (size_t i = 0; i < HW; i++) {
                       const size_t at = ((size_t)b * C + c) * HW + i;
                       r[at] = sc[c] * inv / n * (n * g[at] - sdy - (xf[at] - mean) * inv * sdyx);
                     }
                   ds[c] = (float)(aP * sdyx + (bP != 0.0f ? (double)bP * ds[c] : 0.0));
                   db[c] = (float)(aP * sdy + (bP != 0.0f ? (double)bP * db[c] : 0.0));
                 }
                 blend(dxf, r, aD, bD);
               });
}

cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t nan, int kh, int kw, int ph, int pw, int sh, int sw) {
  if (!d || kh < 1 || kw < 1 || ph < 0 || pw < 0 || sh < 1 || sw < 1 || ph >= kh || pw >= kw)
    return CUDNN_STATUS_BAD_PARAM;
  if (mode == CUDNN_POOLING_MAX || mode == CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING || nan != CUDNN_PROPAGATE_NAN)
    return CUDNN_STATUS_NOT_SUPPORTED; /* the emulation's subset: what conv_cudnn.cu asks for */
  *d = dt_emu_cudnn_pool{1, mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, kh, kw, ph, pw, sh, sw};
  return CUDNN_STATUS_SUCCESS;
}

/* x (N, C, H, W) pooled by d is y (N, C, P, Q) */
static cudnnStatus_t pool_shapes(const dt_emu_cudnn_pool *d, const dt_emu_cudnn_tensor *x,
                                 const dt_emu_cudnn_tensor *y) {
  if (!d || !x || !y || !d->set || !x->set || !y->set || y->n != x->n || y->c != x->c) return CUDNN_STATUS_BAD_PARAM;
  if (y->h != (x->h + 2 * d->ph - d->kh) / d->sh + 1 || y->w != (x->w + 2 * d->pw - d->kw) / d->sw + 1 ||
      x->h + 2 * d->ph < d->kh || x->w + 2 * d->pw < d->kw)
    return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

/* Output (p, q) of plane `in` (H x W): the mean over the window (padding counted as zeros), or the
 * offset of the window's first maximum (NaN first) with *v its value (-1 for a window in padding) */
static int window(const dt_emu_cudnn_pool *d, const float *in, int H, int W, int p, int q, double *v) {
  int at = -1;
  double s = 0;
  for (int i = 0; i < d->kh; i++)
    for (int j = 0; j < d->kw; j++) {
      const int y = p * d->sh - d->ph + i, x = q * d->sw - d->pw + j;
      if (y < 0 || y >= H || x < 0 || x >= W) continue;
      const float e = in[y * W + x];
      s += e;
      if (!d->avg && (at < 0 || (!isnan(*v) && (isnan(e) || e > *v)))) at = y * W + x, *v = e;
    }
  if (d->avg) *v = s / (d->kh * d->kw);
  return at;
}

/* Output (p, q)'s gradient g into dx's plane: the window's share to each of its inputs (average), or
 * all of it to the window's first input (row by row) equal to the output yv (max: x's maximum when yv
 * is x's pooling) */
static void window_grad(const dt_emu_cudnn_pool *d, const float *in, float yv, double g, int H, int W, int p, int q,
                        double *dx) {
  for (int i = 0; i < d->kh; i++)
    for (int j = 0; j < d->kw; j++) {
      const int y = p * d->sh - d->ph + i, x = q * d->sw - d->pw + j;
      if (y < 0 || y >= H || x < 0 || x >= W) continue;
      if (d->avg) {
        dx[y * W + x] += g / (d->kh * d->kw);
      } else if (in[y * W + x] == yv || (isnan(yv) && isnan(in[y * W + x]))) {
        dx[y * W + x] += g;
        return;
      }
    }
}

cudnnStatus_t cudnnPoolingForward(cudnnHandle_t h, const cudnnPoolingDescriptor_t d, const void *alpha,
                                  const cudnnTensorDescriptor_t xd, const void *x, const void *beta,
                                  const cudnnTensorDescriptor_t yd, void *y) {
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  cudnnStatus_t st = pool_shapes(d, xd, yd);
  if (st) return st;
  if (!alpha || !beta || !x || !y) return CUDNN_STATUS_BAD_PARAM;
  const dt_emu_cudnn_pool pd = *d;
  const int NC = xd->n * xd->c, H = xd->h, W = xd->w, P = yd->h, Q = yd->w;
  const size_t nx = numel(xd) * 4, ny = numel(yd) * 4;
  const float al = *(const float *)alpha, be = *(const float *)beta;
  return queue(h, "cudnnPoolingForward", {{x, nx, "x"}, {y, ny, "y"}}, NULL, 0, {span(y, ny)}, [=]() {
    std::vector<double> r((size_t)NC * P * Q);
    for (int c = 0; c < NC; c++)
      for (int p = 0; p < P; p++)
        for (int q = 0; q < Q; q++) {
          double v = 0;
          window(&pd, (const float *)x + (size_t)c * H * W, H, W, p, q, &v);
          r[((size_t)c * P + p) * Q + q] = v;
        }
    blend((float *)y, r, al, be);
  });
}

cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t h, const cudnnPoolingDescriptor_t d, const void *alpha,
                                   const cudnnTensorDescriptor_t yd, const void *y, const cudnnTensorDescriptor_t dyd,
                                   const void *dy, const cudnnTensorDescriptor_t xd, const void *x, const void *beta,
                                   const cudnnTensorDescriptor_t dxd, void *dx) {
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  cudnnStatus_t st = pool_shapes(d, xd, yd);
  if (st == CUDNN_STATUS_SUCCESS) st = pool_shapes(d, dxd, dyd);
  if (st) return st;
  if (!alpha || !beta || !x || !y || !dy || !dx) return CUDNN_STATUS_BAD_PARAM;
  const dt_emu_cudnn_pool pd = *d;
  const int NC = xd->n * xd->c, H = xd->h, W = xd->w, P = yd->h, Q = yd->w;
  const size_t nx = numel(xd) * 4, ny = numel(yd) * 4;
  const float al = *(const float *)alpha, be = *(const float *)beta;
  return queue(h, "cudnnPoolingBackward", {{x, nx, "x"}, {y, ny, "y"}, {dy, ny, "dy"}, {dx, nx, "dx"}}, NULL, 0,
               {span(dx, nx)}, [=]() {
                 std::vector<double> r((size_t)NC * H * W, 0.0);
                 for (int c = 0; c < NC; c++)
                   for (int p = 0; p < P; p++)
                     for (int q = 0; q < Q; q++) {
                       const size_t o = ((size_t)c * P + p) * Q + q;
                       window_grad(&pd, (const float *)x + (size_t)c * H * W, ((const float *)y)[o],
                                   ((const float *)dy)[o], H, W, p, q, r.data() + (size_t)c * H * W);
                     }
                 blend((float *)dx, r, al, be);
               });
}

} // extern "C"
