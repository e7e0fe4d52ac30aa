/* The CUDA emulation's runtime (cuda/emu/: heap, memory, streams, errors, devices) against the
 * CUDA runtime's documented behaviour: fresh device memory reads as NaN bytes; the host cannot
 * load or store device memory (SIGSEGV); device count and sm_90 properties from
 * DTRAIN_EMU_DEVICES; streams run only when waited for, so a pinned host buffer filled by
 * cudaMemcpyAsync is stale until the stream is synchronised; the legacy default stream waits for
 * blocking streams but not for cudaStreamNonBlocking ones (and such a host read is reported);
 * cudaStreamWaitEvent orders two streams; events query/synchronize/elapsed time; non-sticky and
 * sticky errors; copies checked against their allocation; a kernel writing one element past its
 * buffer, into freed memory or through a host pointer is an illegal address naming the kernel. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "emu_test.h"

__global__ static void fill_k(float *x, float v, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] = v;
}

__global__ static void add_k(float *y, const float *x, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] += x[i];
}

Test(emu_runtime, fresh_device_memory_is_nan_bytes) {
  float *d;
  CU(cudaMalloc((void **)&d, 1000 * sizeof(float)));
  std::vector<float> h = host_from(d, 1000);
  for (int i = 0; i < 1000; i++) cr_assert(isnan(h[i]), "element %d is %g, not NaN", i, h[i]);
  printf("1000 floats of a fresh cudaMalloc: all NaN\n");
}

Test(emu_runtime, host_write_into_device_memory_faults, .signal = SIGSEGV) {
  float *d;
  CU(cudaMalloc((void **)&d, 64 * sizeof(float)));
  printf("writing d[3] from the host: must die of SIGSEGV\n");
  fflush(stdout);
  ((volatile float *)d)[3] = 1.0f;
}

Test(emu_runtime, host_read_of_device_memory_faults, .signal = SIGSEGV) {
  float *d;
  CU(cudaMalloc((void **)&d, 64 * sizeof(float)));
  CU(cudaMemset(d, 0, 64 * sizeof(float)));
  CU(cudaDeviceSynchronize());
  volatile float x = ((volatile float *)d)[0];
  (void)x;
}

Test(emu_runtime, devices_from_the_environment) {
  setenv("DTRAIN_EMU_DEVICES", "3", 1);
  int n = 0, dev = -1;
  CU(cudaGetDeviceCount(&n));
  cr_expect_eq(n, 3);
  struct cudaDeviceProp p;
  CU(cudaGetDeviceProperties(&p, 2));
  cr_expect(p.major == 9 && p.minor == 0 && p.maxThreadsPerBlock == 1024 && p.maxGridSize[1] == 65535 &&
            p.sharedMemPerBlock == 48 << 10 && p.warpSize == 32);
  CU(cudaSetDevice(2));
  CU(cudaGetDevice(&dev));
  cr_expect_eq(dev, 2);
  cr_expect_eq(cudaSetDevice(3), cudaErrorInvalidDevice);
  cr_expect_eq(cudaGetLastError(), cudaErrorInvalidDevice, "the failed call is the last error");
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "non-sticky: read once");
  /* memory belongs to its device: a kernel on device 0 may not touch device 2's memory */
  float *d2;
  CU(cudaMalloc((void **)&d2, 256));
  CU(cudaSetDevice(0));
  dt_emu_launch(fill_k, 1, 32, 0, (cudaStream_t)0, d2, 1.0f, (size_t)64);
  cudaError_t e = cudaDeviceSynchronize();
  cr_expect_eq(e, cudaErrorIllegalAddress);
  cr_expect(err_mentions(e, "fill_k") && err_mentions(e, "another device"), "%s", cudaGetErrorString(e));
  printf("DTRAIN_EMU_DEVICES=3: %d devices, %s, sm_%d%d; cudaSetDevice(3): invalid device; device 0 kernel on device 2 "
         "memory: %s\n", n, p.name, p.major, p.minor, cudaGetErrorString(e));
}

Test(emu_runtime, no_devices) {
  setenv("DTRAIN_EMU_DEVICES", "0", 1);
  int n = 7;
  cr_expect_eq(cudaGetDeviceCount(&n), cudaErrorNoDevice);
  cr_expect_eq(n, 0);
  void *p;
  cr_expect_eq(cudaMalloc(&p, 4), cudaErrorNoDevice);
}

Test(emu_runtime, pinned_copy_is_stale_until_the_stream_is_synchronised) {
  size_t n = 4096;
  cudaStream_t s;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *d, *h;
  CU(cudaMalloc((void **)&d, n * sizeof(float)));
  CU(cudaMallocHost((void **)&h, n * sizeof(float)));
  for (size_t i = 0; i < n; i++) h[i] = -1.0f;
  dt_emu_launch(fill_k, 4, 256, 0, s, d, 3.0f, n);
  CU(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  cr_expect_eq(h[0], -1.0f, "the stream ran before it was synchronised");
  cr_expect_eq(h[n - 1], -1.0f);
  CU(cudaStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) cr_assert_eq(h[i], 3.0f, "h[%zu] = %g after the sync", i, h[i]);
  /* pinned source: read when the stream runs, not at the call */
  for (size_t i = 0; i < n; i++) h[i] = 5.0f;
  CU(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, s));
  h[0] = 6.0f; /* a GPU copies whatever is there when the copy runs */
  CU(cudaStreamSynchronize(s));
  std::vector<float> back = host_from(d, n);
  cr_expect_eq(back[0], 6.0f);
  cr_expect_eq(back[1], 5.0f);
  CU(cudaFreeHost(h));
  printf("kernel + cudaMemcpyAsync to pinned memory on a non-blocking stream: host sees -1 before "
         "cudaStreamSynchronize, 3 after; a pinned source is read when the stream runs\n");
}

Test(emu_runtime, legacy_stream_waits_for_blocking_streams_only) {
  size_t n = 1024;
  cudaStream_t b, nb;
  CU(cudaStreamCreate(&b));
  CU(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  float *x, *y;
  CU(cudaMalloc((void **)&x, n * sizeof(float)));
  CU(cudaMalloc((void **)&y, n * sizeof(float)));
  dt_emu_launch(fill_k, 4, 256, 0, b, x, 1.0f, n);
  std::vector<float> hx = host_from(x, n); /* cudaMemcpy on the legacy stream: after b's kernel */
  cr_expect_eq(hx[0], 1.0f);
  cr_expect_eq(hx[n - 1], 1.0f);
  dt_emu_launch(fill_k, 4, 256, 0, nb, y, 2.0f, n);
  std::vector<float> hy(n);
  cudaError_t e = cudaMemcpy(hy.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
  cr_expect(isnan(hy[0]), "the legacy stream waited for a non-blocking stream (%g)", hy[0]);
  cr_expect_eq(e, cudaErrorIllegalState, "the unordered read was not reported: %s", cudaGetErrorString(e));
  cr_expect(err_mentions(e, "fill_k") && err_mentions(e, "non-blocking"), "%s", cudaGetErrorString(e));
  CU(cudaStreamSynchronize(nb));
  hy = host_from(y, n);
  cr_expect_eq(hy[0], 2.0f);
  printf("blocking stream: cudaMemcpy saw 1; non-blocking stream: cudaMemcpy saw NaN and said: %s\n",
         cudaGetErrorString(e));
}

Test(emu_runtime, blocking_stream_waits_for_earlier_legacy_work) {
  size_t n = 256;
  cudaStream_t b, nb;
  CU(cudaStreamCreate(&b));
  CU(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  float *x, *y, *z;
  CU(cudaMalloc((void **)&x, n * sizeof(float)));
  CU(cudaMalloc((void **)&y, n * sizeof(float)));
  CU(cudaMalloc((void **)&z, n * sizeof(float)));
  CU(cudaMemset(x, 0, n * sizeof(float))); /* legacy stream */
  dt_emu_launch(fill_k, 1, 256, 0, b, y, 1.0f, n);
  dt_emu_launch(add_k, 1, 256, 0, b, y, (const float *)x, n); /* after the memset: 1 + 0 */
  dt_emu_launch(fill_k, 1, 256, 0, nb, z, 1.0f, n);
  dt_emu_launch(add_k, 1, 256, 0, nb, z, (const float *)x, n); /* not after it: 1 + NaN */
  CU(cudaStreamSynchronize(nb));
  CU(cudaStreamSynchronize(b));
  float hy = host_from(y, n)[0], hz = host_from(z, n)[0];
  cr_expect_eq(hy, 1.0f, "a blocking stream did not wait for the legacy stream's memset");
  cr_expect(isnan(hz), "a non-blocking stream waited for the legacy stream (%g)", hz);
  printf("memset on the legacy stream, then y += x on a blocking stream: %g; z += x on a non-blocking one: %g\n", hy, hz);
}

Test(emu_runtime, stream_wait_event_orders_two_streams) {
  size_t n = 512;
  cudaStream_t s1, s2;
  cudaEvent_t ev, t0, t1, nt;
  CU(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CU(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CU(cudaEventCreate(&t0));
  CU(cudaEventCreate(&t1));
  CU(cudaEventCreate(&nt));
  CU(cudaEventQuery(nt)); /* never recorded: complete */
  float *x, *y;
  CU(cudaMalloc((void **)&x, n * sizeof(float)));
  CU(cudaMalloc((void **)&y, n * sizeof(float)));
  CU(cudaEventRecord(t0, s1));
  dt_emu_launch(fill_k, 2, 256, 0, s1, x, 4.0f, n);
  CU(cudaEventRecord(ev, s1));
  CU(cudaEventRecord(t1, s1));
  dt_emu_launch(fill_k, 2, 256, 0, s2, y, 0.0f, n);
  CU(cudaStreamWaitEvent(s2, ev, 0));
  dt_emu_launch(add_k, 2, 256, 0, s2, y, (const float *)x, n);
  float ms = -1;
  cr_expect_eq(cudaEventElapsedTime(&ms, t0, t1), cudaErrorNotReady);
  CU(cudaStreamSynchronize(s2)); /* runs s1 up to ev first */
  std::vector<float> h = host_from(y, n);
  cr_expect_eq(h[0], 4.0f);
  cr_expect_eq(h[n - 1], 4.0f);
  CU(cudaEventSynchronize(t1));
  CU(cudaEventElapsedTime(&ms, t0, t1));
  cr_expect_geq(ms, 0.0f);
  cr_expect_eq(cudaEventElapsedTime(&ms, t0, ev), cudaErrorInvalidResourceHandle, "a DisableTiming event");
  cudaGetLastError();
  printf("s2 waited for s1's event: y = %g (want 4); elapsed between two timing events %.3f ms\n", h[0], ms);
}

Test(emu_runtime, copies_are_checked_against_their_allocation) {
  float *d, h[100];
  CU(cudaMalloc((void **)&d, 64 * sizeof(float)));
  cudaError_t e = cudaMemcpy(h, d, 65 * sizeof(float), cudaMemcpyDeviceToHost);
  cr_expect_eq(e, cudaErrorInvalidValue);
  cr_expect(err_mentions(e, "past its end"), "%s", cudaGetErrorString(e));
  cr_expect_eq(cudaMemcpy(d, h, 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue, "kind contradicts the pointers");
  cr_expect_eq(cudaMemset(d + 60, 0, 5 * sizeof(float)), cudaErrorInvalidValue);
  cr_expect_eq(cudaFree(d + 1), cudaErrorInvalidValue);
  cudaGetLastError();
  CU(cudaFree(d));
  cr_expect_eq(cudaFree(d), cudaErrorInvalidValue, "double free");
  printf("a copy of 65 floats from a 64-float allocation: %s\n", cudaGetErrorString(e));
}

static void expect_illegal(const char *what, const char *want1, const char *want2) {
  cudaError_t e = cudaDeviceSynchronize();
  cr_assert_eq(e, cudaErrorIllegalAddress, "%s: %s", what, cudaGetErrorString(e));
  cr_expect(err_mentions(e, want1) && err_mentions(e, want2), "%s: '%s' lacks '%s' or '%s'", what,
            cudaGetErrorString(e), want1, want2);
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress, "sticky");
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress, "sticky");
  printf("%s: %s\n", what, cudaGetErrorString(e));
}

Test(emu_runtime, one_element_past_an_aligned_buffer) {
  float *d;
  CU(cudaMalloc((void **)&d, 1024 * sizeof(float))); /* ends at a page: the next float faults */
  dt_emu_launch(fill_k, 4, 256, 0, (cudaStream_t)0, d, 1.0f, (size_t)1025);
  expect_illegal("fill_k over 1025 floats of a 1024-float buffer", "fill_k", "0 bytes past the end");
}

Test(emu_runtime, one_element_past_an_odd_buffer) {
  float *d;
  CU(cudaMalloc((void **)&d, 1000 * sizeof(float))); /* the next float is in the slack: canary */
  dt_emu_launch(fill_k, 4, 256, 0, (cudaStream_t)0, d, 1.0f, (size_t)1001);
  expect_illegal("fill_k over 1001 floats of a 1000-float buffer", "fill_k", "past the end");
}

Test(emu_runtime, freed_memory_and_host_pointers_in_kernels) {
  float *d, h[64];
  CU(cudaMalloc((void **)&d, 64 * sizeof(float)));
  CU(cudaFree(d));
  dt_emu_launch(fill_k, 1, 64, 0, (cudaStream_t)0, d, 1.0f, (size_t)64);
  expect_illegal("fill_k on a freed buffer", "fill_k", "freed allocation");
  cudaDeviceReset();
  dt_emu_launch(fill_k, 1, 64, 0, (cudaStream_t)0, h, 1.0f, (size_t)64);
  expect_illegal("fill_k on a host array", "fill_k", "host memory");
}
