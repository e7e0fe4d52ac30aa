/* CUDA emulation: the cuDNN subset cuda/conv_cudnn.cu calls (handles, 4-d NCHW fp32 tensor,
 * filter and convolution descriptors, the three convolution directions with their algorithm
 * queries, spatial batch norm's training forward and backward, 2-d max and average pooling),
 * under cuDNN's names and signatures. The calls are checked as cuDNN checks them
 * (CUDNN_STATUS_BAD_PARAM for shapes that do not fit together, a workspace smaller than the
 * algorithm asked for) and queued on the
 * handle's stream; there an operand outside the handle's device memory is an illegal address
 * (sticky). The arithmetic: cuda/emu/cudnn.cpp. The real build includes cuDNN's own cudnn.h. */
#ifndef DT_EMU_CUDNN_H
#define DT_EMU_CUDNN_H

#include <stddef.h>

#include "cuda_runtime.h"

#define CUDNN_MAJOR 9
#define CUDNN_MINOR 0
#define CUDNN_PATCHLEVEL 0
#define CUDNN_BN_MIN_EPSILON 0.0

typedef enum {
  CUDNN_STATUS_SUCCESS = 0,
  CUDNN_STATUS_NOT_INITIALIZED = 1001,
  CUDNN_STATUS_BAD_PARAM = 2000,
  CUDNN_STATUS_NOT_SUPPORTED = 3000,
  CUDNN_STATUS_EXECUTION_FAILED = 5000,
} cudnnStatus_t;

typedef struct dt_emu_cudnn *cudnnHandle_t;
typedef struct dt_emu_cudnn_tensor *cudnnTensorDescriptor_t;
typedef struct dt_emu_cudnn_filter *cudnnFilterDescriptor_t;
typedef struct dt_emu_cudnn_conv *cudnnConvolutionDescriptor_t;

typedef enum { CUDNN_DATA_FLOAT = 0, CUDNN_DATA_DOUBLE = 1, CUDNN_DATA_HALF = 2 } cudnnDataType_t;
typedef enum { CUDNN_TENSOR_NCHW = 0, CUDNN_TENSOR_NHWC = 1 } cudnnTensorFormat_t;
typedef enum { CUDNN_CONVOLUTION = 0, CUDNN_CROSS_CORRELATION = 1 } cudnnConvolutionMode_t;
/* DEFAULT: TF32 tensor cores allowed (the emulation rounds x and w, or dy, to TF32); FMA: fp32 only */
typedef enum {
  CUDNN_DEFAULT_MATH = 0,
  CUDNN_TENSOR_OP_MATH = 1,
  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
  CUDNN_FMA_MATH = 3
} cudnnMathType_t;
typedef enum { CUDNN_NON_DETERMINISTIC = 0, CUDNN_DETERMINISTIC = 1 } cudnnDeterminism_t;
typedef enum {
  CUDNN_BATCHNORM_PER_ACTIVATION = 0,
  CUDNN_BATCHNORM_SPATIAL = 1,
  CUDNN_BATCHNORM_SPATIAL_PERSISTENT = 2
} cudnnBatchNormMode_t;

/* The algorithms the emulation ranks: one non-deterministic first (as cuDNN often ranks an atomics
 * kernel first), then a deterministic one that needs a workspace, then one that needs none */
typedef enum {
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0,
  CUDNN_CONVOLUTION_FWD_ALGO_GEMM = 2
} cudnnConvolutionFwdAlgo_t;
typedef enum {
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1
} cudnnConvolutionBwdDataAlgo_t;
typedef enum {
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 = 3
} cudnnConvolutionBwdFilterAlgo_t;

#define DT_EMU_CUDNN_PERF(NAME, ALGO)                                                                                  \
  typedef struct {                                                                                                     \
    ALGO algo;                                                                                                         \
    cudnnStatus_t status;                                                                                              \
    float time;                                                                                                        \
    size_t memory;                                                                                                     \
    cudnnDeterminism_t determinism;                                                                                    \
    cudnnMathType_t mathType;                                                                                          \
    int reserved[3];                                                                                                   \
  } NAME;
DT_EMU_CUDNN_PERF(cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t)
DT_EMU_CUDNN_PERF(cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t)
DT_EMU_CUDNN_PERF(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t)
#undef DT_EMU_CUDNN_PERF

typedef struct dt_emu_cudnn_pool *cudnnPoolingDescriptor_t;
typedef enum {
  CUDNN_POOLING_MAX = 0,
  CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1,
  CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2,
  CUDNN_POOLING_MAX_DETERMINISTIC = 3
} cudnnPoolingMode_t;
typedef enum { CUDNN_NOT_PROPAGATE_NAN = 0, CUDNN_PROPAGATE_NAN = 1 } cudnnNanPropagation_t;

#ifdef __cplusplus
extern "C" {
#endif

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream);
const char *cudnnGetErrorString(cudnnStatus_t status);
size_t cudnnGetVersion(void);

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format, cudnnDataType_t type,
                                         int n, int c, int h, int w);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t mathType);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d);

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, cudnnTensorDescriptor_t xDesc,
                                                     cudnnFilterDescriptor_t wDesc,
                                                     cudnnConvolutionDescriptor_t convDesc,
                                                     cudnnTensorDescriptor_t yDesc, int requestedAlgoCount,
                                                     int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, cudnnFilterDescriptor_t wDesc,
                                                          cudnnTensorDescriptor_t dyDesc,
                                                          cudnnConvolutionDescriptor_t convDesc,
                                                          cudnnTensorDescriptor_t dxDesc, int requestedAlgoCount,
                                                          int *returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perfResults);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, cudnnTensorDescriptor_t srcDesc,
                                                            cudnnTensorDescriptor_t diffDesc,
                                                            cudnnConvolutionDescriptor_t convDesc,
                                                            cudnnFilterDescriptor_t gradDesc, int requestedAlgoCount,
                                                            int *returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perfResults);

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha, cudnnTensorDescriptor_t xDesc,
                                      const void *x, cudnnFilterDescriptor_t wDesc, const void *w,
                                      cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
                                      cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha, cudnnFilterDescriptor_t wDesc,
                                           const void *w, cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
                                           cudnnTensorDescriptor_t dxDesc, void *dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha, cudnnTensorDescriptor_t xDesc,
                                             const void *x, cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             cudnnFilterDescriptor_t dwDesc, void *dw);

/* Spatial batch norm: statistics over N x H x W per channel; the saved inverse standard deviation
 * is 1 / sqrt(biased variance + epsilon); the running variance moves towards the unbiased one
 * (times n / (n - 1), n = N*H*W), as PyTorch's running_var on its cuDNN path. */
cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta, cudnnTensorDescriptor_t xDesc,
    const void *x, cudnnTensorDescriptor_t yDesc, void *y, cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
    const void *bnScale, const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance);
cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff, const void *betaDataDiff,
    const void *alphaParamDiff, const void *betaParamDiff, cudnnTensorDescriptor_t xDesc, const void *x,
    cudnnTensorDescriptor_t dyDesc, const void *dy, cudnnTensorDescriptor_t dxDesc, void *dx,
    cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult, void *dBnBiasResult,
    double epsilon, const void *savedMean, const void *savedInvVariance);

/* 2-d pooling: the window's maximum (the deterministic mode: backward gives each output's gradient
 * to the first input in the window, row by row, equal to that output), or its mean over the
 * window, padding included; NaN propagated. */
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *d);
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t d);
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t maxpoolingNanOpt, int windowHeight, int windowWidth,
                                          int verticalPadding, int horizontalPadding, int verticalStride,
                                          int horizontalStride);
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
                                  const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                  const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
                                   const cudnnTensorDescriptor_t yDesc, const void *y,
                                   const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                   const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                   const cudnnTensorDescriptor_t dxDesc, void *dx);

#ifdef __cplusplus
}
#endif
#endif
