/* Planted bugs for the CUDA emulation (run by tests/emu_bugs.sh). Six small pieces of CUDA code
 * in dtrain's style, each correct unless DTRAIN_FAULT (src/core/fault.h) plants its bug:
 *   emu_oob        a grid-stride loop writes one element past its output buffer (i <= n)
 *   emu_nosync     a shared-memory block reduction lacks the __syncthreads() between the writes
 *                  and the tree
 *   emu_grid       a row kernel puts its rows on grid.y, uncapped: 70,000 rows > 65,535
 *   emu_nosync_read  a kernel's result is copied to the host on the legacy stream without
 *                  synchronising the non-blocking stream that computes it
 *   emu_host_write the host zeroes a device buffer by a store instead of cudaMemset
 *   emu_cudnn_ws   a cuDNN convolution given a workspace smaller than its algorithm's entry says
 *   emu_cudnn_out  a cuDNN convolution's output allocated one image short
 * Each scenario prints what it runs and checks its result against the host; any CUDA error ends
 * the program with the emulation's message (exit 1), a host access to device memory with SIGSEGV.
 * Without DTRAIN_FAULT every scenario passes (exit 0). */
#include <cuda_runtime.h>
#include <cudnn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "fault.h"
}

static int planted(const char *name) { return dt_fault(name, 0, -1); }

static void check(cudaError_t rc, const char *call, int line) {
  if (rc == cudaSuccess) return;
  printf("emu_bugs.cpp:%d: %s failed: %s\n", line, call, cudaGetErrorString(rc));
  exit(1);
}
#define CK(call) check((call), #call, __LINE__)

__global__ static void scale_k(float *y, const float *x, float a, size_t n, int past) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n + (size_t)past; i += (size_t)gridDim.x * blockDim.x)
    y[i] = a * x[i];
}

static void scale(void) {
  size_t n = 1000;
  int past = planted("emu_oob");
  float *x, *y, h[1001];
  for (size_t i = 0; i <= n; i++) h[i] = (float)i;
  CK(cudaMalloc((void **)&x, (n + 1) * sizeof(float)));
  CK(cudaMalloc((void **)&y, n * sizeof(float)));
  CK(cudaMemcpy(x, h, (n + 1) * sizeof(float), cudaMemcpyHostToDevice));
  printf("scale_k: y[0..%zu) = 2 x over a 1000-float y%s\n", n + past, past ? " (planted: one past the end)" : "");
  dt_emu_launch(scale_k, 4, 256, 0, (cudaStream_t)0, y, (const float *)x, 2.0f, n, past);
  CK(cudaGetLastError());
  CK(cudaMemcpy(h, y, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++)
    if (h[i] != 2.0f * (float)i) {
      printf("scale_k: y[%zu] = %g, want %g\n", i, h[i], 2.0 * i);
      exit(1);
    }
}

__global__ static void block_sum_k(float *out, const float *x, int n, int skip_sync) {
  __shared__ float sh[256];
  float a = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) a += x[i];
  sh[threadIdx.x] = a;
  if (!skip_sync) __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = sh[0];
}

static void block_sum(void) {
  int n = 5000, skip = planted("emu_nosync");
  float *x, *out, h[5000], got;
  double want = 0;
  for (int i = 0; i < n; i++) want += h[i] = (float)(i % 7) - 3.0f;
  CK(cudaMalloc((void **)&x, n * sizeof(float)));
  CK(cudaMalloc((void **)&out, sizeof(float)));
  CK(cudaMemcpy(x, h, n * sizeof(float), cudaMemcpyHostToDevice));
  printf("block_sum_k: one block of 256 sums %d floats through shared memory%s\n", n,
         skip ? " (planted: no __syncthreads before the tree)" : "");
  dt_emu_launch(block_sum_k, 1, 256, 0, (cudaStream_t)0, out, (const float *)x, n, skip);
  CK(cudaGetLastError());
  CK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
  if (!(fabs(got - want) <= 1e-3)) {
    printf("kernel block_sum_k: sum %g, want %g (host, double): the reduction read shared memory before it was "
           "written (a missing __syncthreads?)\n", got, want);
    exit(1);
  }
}

__global__ static void row_fill_k(float *y, int rows, int C) {
  for (int r = blockIdx.y; r < rows; r += gridDim.y)
    for (int c = threadIdx.x; c < C; c += blockDim.x) y[(size_t)r * C + c] = (float)r;
}

static void row_fill(void) {
  int rows = 70000, C = 4, uncapped = planted("emu_grid");
  float *y, *h = (float *)malloc((size_t)rows * C * sizeof(float));
  CK(cudaMalloc((void **)&y, (size_t)rows * C * sizeof(float)));
  dim3 grid(1, uncapped ? rows : 65535);
  printf("row_fill_k: %d rows on grid.y = %u%s\n", rows, grid.y, uncapped ? " (planted: not capped at 65535)" : "");
  dt_emu_launch(row_fill_k, grid, 32, 0, (cudaStream_t)0, y, rows, C);
  CK(cudaGetLastError());
  CK(cudaMemcpy(h, y, (size_t)rows * C * sizeof(float), cudaMemcpyDeviceToHost));
  for (int r = 0; r < rows; r++)
    if (h[(size_t)r * C] != (float)r) {
      printf("row_fill_k: row %d holds %g\n", r, h[(size_t)r * C]);
      exit(1);
    }
  free(h);
}

static void stream_read(void) {
  size_t n = 512;
  int nosync = planted("emu_nosync_read");
  cudaStream_t s;
  float *x, *y, h[512];
  for (size_t i = 0; i < n; i++) h[i] = 1.0f;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc((void **)&x, n * sizeof(float)));
  CK(cudaMalloc((void **)&y, n * sizeof(float)));
  CK(cudaMemcpyAsync(x, h, n * sizeof(float), cudaMemcpyHostToDevice, s));
  dt_emu_launch(scale_k, 2, 256, 0, s, y, (const float *)x, 3.0f, n, 0);
  CK(cudaGetLastError());
  printf("scale_k on a non-blocking stream, then cudaMemcpy to the host%s\n",
         nosync ? " (planted: without cudaStreamSynchronize)" : " after cudaStreamSynchronize");
  if (!nosync) CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(h, y, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++)
    if (h[i] != 3.0f) {
      printf("host copy of scale_k's result: y[%zu] = %g, want 3\n", i, h[i]);
      exit(1);
    }
}

static void host_write(void) {
  float *d, h[64];
  CK(cudaMalloc((void **)&d, 64 * sizeof(float)));
  int bug = planted("emu_host_write");
  printf("zero a device buffer %s\n", bug ? "by a host store (planted)" : "with cudaMemset");
  fflush(stdout);
  if (bug) for (int i = 0; i < 64; i++) ((volatile float *)d)[i] = 0.0f;
  else CK(cudaMemset(d, 0, 64 * sizeof(float)));
  CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  if (h[63] != 0.0f) {
    printf("the buffer holds %g\n", h[63]);
    exit(1);
  }
}

#define DNN(call)                                                                                                      \
  do {                                                                                                                 \
    cudnnStatus_t st_ = (call);                                                                                        \
    if (st_ != CUDNN_STATUS_SUCCESS) {                                                                                 \
      printf("emu_bugs.cpp:%d: %s failed: %s\n", __LINE__, #call, cudnnGetErrorString(st_));                           \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

/* A 3x3 convolution of 2 images through cuDNN, as cuda/conv_cudnn.cu makes it: the first
 * deterministic algorithm and its workspace; y checked against the host */
static void cudnn_conv(void) {
  const int B = 2, C = 3, H = 5, OC = 4, K = 3;
  int small_ws = planted("emu_cudnn_ws"), short_out = planted("emu_cudnn_out");
  cudnnHandle_t h;
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  DNN(cudnnCreate(&h));
  DNN(cudnnCreateTensorDescriptor(&xd));
  DNN(cudnnCreateTensorDescriptor(&yd));
  DNN(cudnnCreateFilterDescriptor(&wd));
  DNN(cudnnCreateConvolutionDescriptor(&cd));
  DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, C, H, H));
  DNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, OC, H, H));
  DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, OC, C, K, K));
  DNN(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DNN(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));
  cudnnConvolutionFwdAlgoPerf_t perf[4];
  int n = 0, a = -1;
  DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 4, &n, perf));
  for (int i = 0; i < n && a < 0; i++)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC) a = i;
  const size_t nx = (size_t)B * C * H * H, ny = (size_t)B * OC * H * H, nw = (size_t)OC * C * K * K;
  const size_t ws_bytes = small_ws ? perf[a].memory / 2 : perf[a].memory;
  float hx[150], hw[108], hy[200], *x, *w, *y;
  void *ws;
  for (size_t i = 0; i < nx; i++)
    hx[i] = (float)(i % 7) - 3.0f;
  for (size_t i = 0; i < nw; i++)
    hw[i] = (float)(i % 5) - 2.0f;
  CK(cudaMalloc((void **)&x, nx * sizeof(float)));
  CK(cudaMalloc((void **)&w, nw * sizeof(float)));
  CK(cudaMalloc((void **)&y, (short_out ? ny - ny / B : ny) * sizeof(float)));
  CK(cudaMalloc(&ws, perf[a].memory));
  CK(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w, hw, sizeof hw, cudaMemcpyHostToDevice));
  printf("cudnnConvolutionForward: algorithm %d, workspace %zu of %zu bytes, y of %d images%s\n", (int)perf[a].algo,
         ws_bytes, perf[a].memory, short_out ? B - 1 : B, small_ws || short_out ? " (planted)" : "");
  const float one = 1.0f, zero = 0.0f;
  DNN(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, perf[a].algo, ws, ws_bytes, &zero, yd, y));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  for (int b = 0; b < B; b++)
    for (int o = 0; o < OC; o++)
      for (int p = 0; p < H * H; p++) {
        double r = 0;
        for (int c = 0; c < C; c++)
          for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++) {
              const int hh = p / H - 1 + i, ww = p % H - 1 + j;
              if (hh >= 0 && hh < H && ww >= 0 && ww < H)
                r += hx[((b * C + c) * H + hh) * H + ww] * hw[((o * C + c) * K + i) * K + j];
            }
        if (fabs(hy[(b * OC + o) * H * H + p] - r) > 1e-4) {
          printf("cudnnConvolutionForward: y[%d] = %g, want %g\n", (b * OC + o) * H * H + p,
                 hy[(b * OC + o) * H * H + p], r);
          exit(1);
        }
      }
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  scale();
  block_sum();
  row_fill();
  stream_read();
  host_write();
  cudnn_conv();
  printf("emu_bugs: every scenario ran correctly\n");
  return 0;
}
