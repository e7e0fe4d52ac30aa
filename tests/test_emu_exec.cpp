/* The CUDA emulation's SIMT executor (cuda/emu/exec.cpp), with kernels written for the test and
 * host references written from the CUDA programming guide: every built-in index of every thread
 * of a 3-D grid of 3-D blocks; __syncthreads between warps (both schedules); shared memory
 * undefined (NaN bytes) at the start of every block; __syncthreads_count/and/or; shuffles
 * (idx/up/down/xor, widths 32, 16, 8, 4) against the guide's lane formulas; ballot/all/any;
 * the sm_80 warp reductions; atomics; arguments copied at the launch. Misuse that hangs or is
 * undefined on a GPU must stop the kernel with a sticky cudaErrorLaunchFailure naming the kernel:
 * barriers in divergent code, a lane waiting in a shuffle for lanes at a barrier, a shuffle
 * whose mask names exited or missing lanes. Launch limits of sm_90 (each one just over and just
 * at the limit) give cudaErrorInvalidConfiguration / cudaErrorInvalidValue, non-sticky. And the
 * executor's speed: a sync-free kernel must cost about a loop. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "emu_test.h"

#define FULL 0xffffffffu

__global__ static void ids_k(unsigned *out) {
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned n = blockDim.x * blockDim.y * blockDim.z;
  unsigned i = b * n + threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[4 * i + 0] = threadIdx.x | threadIdx.y << 8 | threadIdx.z << 16;
  out[4 * i + 1] = blockIdx.x | blockIdx.y << 8 | blockIdx.z << 16;
  out[4 * i + 2] = blockDim.x | blockDim.y << 8 | blockDim.z << 16;
  out[4 * i + 3] = gridDim.x | gridDim.y << 8 | gridDim.z << 16;
}

Test(emu_exec, every_index_of_a_3d_launch) {
  dim3 g(3, 2, 2), b(5, 3, 2);
  size_t n = 3 * 2 * 2 * 5 * 3 * 2;
  unsigned *d;
  CU(cudaMalloc((void **)&d, 4 * n * sizeof(unsigned)));
  dt_emu_launch(ids_k, g, b, 0, (cudaStream_t)0, d);
  CU(cudaGetLastError());
  std::vector<unsigned> h = host_from(d, 4 * n);
  size_t i = 0;
  for (unsigned bz = 0; bz < 2; bz++)
    for (unsigned by = 0; by < 2; by++)
      for (unsigned bx = 0; bx < 3; bx++)
        for (unsigned tz = 0; tz < 2; tz++)
          for (unsigned ty = 0; ty < 3; ty++)
            for (unsigned tx = 0; tx < 5; tx++, i++) {
              cr_expect_eq(h[4 * i], tx | ty << 8 | tz << 16, "threadIdx of element %zu", i);
              cr_expect_eq(h[4 * i + 1], bx | by << 8 | bz << 16, "blockIdx of element %zu", i);
              cr_expect_eq(h[4 * i + 2], 5u | 3u << 8 | 2u << 16, "blockDim of element %zu", i);
              cr_expect_eq(h[4 * i + 3], 3u | 2u << 8 | 2u << 16, "gridDim of element %zu", i);
            }
  printf("3-D launch <<<(3,2,2), (5,3,2)>>>: %zu threads, each wrote its threadIdx/blockIdx/blockDim/gridDim\n", n);
}

__global__ static void reverse_k(int *out) {
  __shared__ int sh[1024];
  sh[threadIdx.x] = (int)threadIdx.x * 3 + (int)blockIdx.x;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = sh[blockDim.x - 1 - threadIdx.x];
}

static void check_reverse(void) {
  int *d;
  CU(cudaMalloc((void **)&d, 4 * 1024 * sizeof(int)));
  dt_emu_launch(reverse_k, 4, 1024, 0, (cudaStream_t)0, d);
  std::vector<int> h = host_from(d, 4 * 1024);
  for (int b = 0; b < 4; b++)
    for (int t = 0; t < 1024; t++) cr_assert_eq(h[b * 1024 + t], (1023 - t) * 3 + b, "block %d thread %d", b, t);
}

Test(emu_exec, syncthreads_orders_shared_memory_across_warps) {
  check_reverse();
  printf("4 blocks of 1024 threads: each read the shared value its mirror thread wrote before __syncthreads\n");
}

Test(emu_exec, syncthreads_reverse_schedule) {
  setenv("DTRAIN_EMU_SCHEDULE", "reverse", 1);
  check_reverse();
  printf("the same with DTRAIN_EMU_SCHEDULE=reverse (warps and lanes run last to first)\n");
}

__global__ static void fresh_shared_k(unsigned *out) {
  __shared__ unsigned s[4];
  out[blockIdx.x] = s[blockIdx.x % 4]; /* read before any write: undefined on a GPU */
  s[blockIdx.x % 4] = 5u;
}

Test(emu_exec, shared_memory_is_nan_bytes_at_block_start) {
  unsigned *d;
  CU(cudaMalloc((void **)&d, 8 * sizeof(unsigned)));
  dt_emu_launch(fresh_shared_k, 8, 1, 0, (cudaStream_t)0, d);
  std::vector<unsigned> h = host_from(d, 8);
  for (int b = 0; b < 8; b++) cr_expect_eq(h[b], 0xffffffffu, "block %d saw 0x%08x, not the NaN bytes", b, h[b]);
  printf("8 blocks read shared memory before writing it: 0xffffffff every time (not the previous block's 5)\n");
}

__global__ static void barops_k(int *out) {
  int p = threadIdx.x % 3 == 0;
  int c = __syncthreads_count(p), a = __syncthreads_and(p), o = __syncthreads_or(p), a1 = __syncthreads_and(1);
  if (threadIdx.x == 99) {
    out[0] = c;
    out[1] = a;
    out[2] = o;
    out[3] = a1;
  }
}

Test(emu_exec, syncthreads_count_and_or) {
  int *d;
  CU(cudaMalloc((void **)&d, 4 * sizeof(int)));
  dt_emu_launch(barops_k, 1, 100, 0, (cudaStream_t)0, d);
  std::vector<int> h = host_from(d, 4);
  cr_expect_eq(h[0], 34);
  cr_expect_eq(h[1], 0);
  cr_expect_eq(h[2], 1);
  cr_expect_eq(h[3], 1);
  printf("100 threads, predicate tid %% 3 == 0: count %d (want 34), and %d, or %d, and(1) %d\n", h[0], h[1], h[2], h[3]);
}

enum { S_IDX, S_UP, S_DOWN, S_XOR };

__global__ static void shfl_k(int *out, int mode, int arg, int width) {
  int v = (int)threadIdx.x * 10 + 7;
  int r = mode == S_IDX ? __shfl_sync(FULL, v, arg, width)
          : mode == S_UP ? __shfl_up_sync(FULL, v, (unsigned)arg, width)
          : mode == S_DOWN ? __shfl_down_sync(FULL, v, (unsigned)arg, width)
                           : __shfl_xor_sync(FULL, v, arg, width);
  out[threadIdx.x] = r;
}

/* The programming guide's rules, lane l of a warp, w = width. */
static int shfl_ref(int mode, int l, int arg, int w) {
  int base = l / w * w, src = l;
  if (mode == S_IDX) src = base + arg % w;
  if (mode == S_UP && l % w >= arg) src = l - arg;
  if (mode == S_DOWN && l % w + arg < w) src = l + arg;
  if (mode == S_XOR && (l ^ arg) < base + w) src = l ^ arg; /* earlier groups only */
  return src;
}

Test(emu_exec, shuffles_match_the_lane_rules) {
  int *d, n = 0;
  CU(cudaMalloc((void **)&d, 64 * sizeof(int)));
  const char *name[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
  for (int mode = 0; mode < 4; mode++)
    for (int w = 4; w <= 32; w *= 2)
      for (int arg = 0; arg < 32; arg += (arg < 3 ? 1 : 5)) {
        dt_emu_launch(shfl_k, 1, 64, 0, (cudaStream_t)0, d, mode, arg, w);
        std::vector<int> h = host_from(d, 64);
        for (int t = 0; t < 64; t++) {
          int want = (t / 32 * 32 + shfl_ref(mode, t % 32, arg, w)) * 10 + 7;
          cr_assert_eq(h[t], want, "%s arg %d width %d: thread %d got %d, want %d", name[mode], arg, w, t, h[t], want);
        }
        n++;
      }
  printf("%d shuffle cases (4 kinds x widths 4..32 x arguments 0..31), 2 warps each: every lane as the guide says\n", n);
}

__global__ static void votes_k(unsigned *out) {
  int lane = threadIdx.x % 32;
  unsigned b = __ballot_sync(FULL, lane % 3 == 0);
  int all = __all_sync(FULL, lane < 32), any = __any_sync(FULL, lane == 31), none = __any_sync(FULL, 0);
  float f = (float)lane;
  for (int o = 16; o > 0; o >>= 1) f += __shfl_xor_sync(FULL, f, o);
  unsigned sum = __reduce_add_sync(FULL, (unsigned)lane);
  int mn = __reduce_min_sync(FULL, lane - 20), mx = __reduce_max_sync(FULL, lane - 20);
  if (lane == 5) {
    out[0] = b;
    out[1] = (unsigned)all;
    out[2] = (unsigned)any;
    out[3] = (unsigned)none;
    out[4] = (unsigned)f;
    out[5] = sum;
    out[6] = (unsigned)mn;
    out[7] = (unsigned)mx;
  }
}

Test(emu_exec, votes_butterfly_and_warp_reductions) {
  unsigned *d;
  CU(cudaMalloc((void **)&d, 8 * sizeof(unsigned)));
  dt_emu_launch(votes_k, 1, 32, 0, (cudaStream_t)0, d);
  std::vector<unsigned> h = host_from(d, 8);
  cr_expect_eq(h[0], 0x49249249u, "ballot 0x%08x", h[0]);
  cr_expect_eq(h[1], 1u);
  cr_expect_eq(h[2], 1u);
  cr_expect_eq(h[3], 0u);
  cr_expect_eq(h[4], 496u, "xor butterfly sum %u", h[4]);
  cr_expect_eq(h[5], 496u);
  cr_expect_eq((int)h[6], -20);
  cr_expect_eq((int)h[7], 11);
  printf("ballot(lane %% 3 == 0) = 0x%08x, all/any/none = %u/%u/%u, butterfly sum %u, reduce add %u, min %d, max %d\n",
         h[0], h[1], h[2], h[3], h[4], h[5], (int)h[6], (int)h[7]);
}

__global__ static void atomics_k(int *count, float *fsum, unsigned *mx) {
  atomicAdd(count, 1);
  atomicAdd(fsum, 1.0f);
  atomicMax(mx, blockIdx.x * blockDim.x + threadIdx.x);
}

Test(emu_exec, atomics) {
  int *c;
  float *f;
  unsigned *m;
  CU(cudaMalloc((void **)&c, sizeof(int)));
  CU(cudaMalloc((void **)&f, sizeof(float)));
  CU(cudaMalloc((void **)&m, sizeof(unsigned)));
  CU(cudaMemset(c, 0, sizeof(int)));
  CU(cudaMemset(f, 0, sizeof(float)));
  CU(cudaMemset(m, 0, sizeof(unsigned)));
  dt_emu_launch(atomics_k, 300, 256, 0, (cudaStream_t)0, c, f, m);
  cr_expect_eq(host_from(c, 1)[0], 300 * 256);
  cr_expect_eq(host_from(f, 1)[0], 300.0f * 256);
  cr_expect_eq(host_from(m, 1)[0], 300u * 256 - 1);
  printf("300 x 256 threads: atomicAdd int %d, float %.0f, atomicMax %u\n", host_from(c, 1)[0], host_from(f, 1)[0],
         host_from(m, 1)[0]);
}

__global__ static void args_k(int *out, int v, double x) { out[threadIdx.x] = v + (int)x; }

Test(emu_exec, arguments_are_copied_at_launch) {
  int *d, v = 5;
  double x = 0.5;
  CU(cudaMalloc((void **)&d, 2 * sizeof(int)));
  dt_emu_launch(args_k, 1, 2, 0, (cudaStream_t)0, d, v, 2.0f); /* float -> double as in a launch */
  v = 6;
  x = 100;
  (void)x;
  std::vector<int> h = host_from(d, 2);
  cr_expect_eq(h[0], 7);
  cr_expect_eq(h[1], 7);
}

/* ---- misuse ----------------------------------------------------------------------------------- */

__global__ static void divergent_barrier_k(int *out) {
  if (threadIdx.x < 64) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ static void shfl_vs_barrier_k(float *out) {
  float v = 1.0f;
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(FULL, v, 16);
  else __syncthreads();
  out[threadIdx.x] = v;
}

__global__ static void shfl_exited_k(float *out, int n) {
  if ((int)threadIdx.x >= n) return;
  out[threadIdx.x] = __shfl_xor_sync(FULL, 1.0f, 1);
}

static void expect_launch_failure(const char *what, const char *kernel, const char *want) {
  cudaError_t e = cudaDeviceSynchronize();
  cr_assert_eq(e, cudaErrorLaunchFailure, "%s: got %s", what, cudaGetErrorString(e));
  cr_expect(err_mentions(e, kernel) && err_mentions(e, want), "%s: message '%s' lacks '%s' or '%s'", what,
            cudaGetErrorString(e), kernel, want);
  cr_expect_eq(cudaGetLastError(), cudaErrorLaunchFailure, "sticky: cudaGetLastError does not clear it");
  cr_expect_eq(cudaGetLastError(), cudaErrorLaunchFailure);
  void *p;
  cr_expect_eq(cudaMalloc(&p, 16), cudaErrorLaunchFailure, "sticky: later calls fail too");
  printf("%s: %s\n", what, cudaGetErrorString(e));
}

Test(emu_exec, barrier_in_divergent_code_fails) {
  int *d;
  CU(cudaMalloc((void **)&d, 128 * sizeof(int)));
  dt_emu_launch(divergent_barrier_k, 1, 128, 0, (cudaStream_t)0, d);
  expect_launch_failure("two __syncthreads in divergent branches", "divergent_barrier_k", "different barriers");
}

Test(emu_exec, shuffle_waiting_for_lanes_at_a_barrier_deadlocks) {
  float *d;
  CU(cudaMalloc((void **)&d, 64 * sizeof(float)));
  dt_emu_launch(shfl_vs_barrier_k, 1, 64, 0, (cudaStream_t)0, d);
  expect_launch_failure("half a warp in __shfl_xor_sync(FULL), half at __syncthreads", "shfl_vs_barrier_k", "deadlock");
}

Test(emu_exec, shuffle_naming_an_exited_lane_fails) {
  float *d;
  CU(cudaMalloc((void **)&d, 32 * sizeof(float)));
  dt_emu_launch(shfl_exited_k, 1, 32, 0, (cudaStream_t)0, d, 20);
  expect_launch_failure("lanes 20..31 returned before __shfl_xor_sync(FULL)", "shfl_exited_k", "has exited");
}

Test(emu_exec, shuffle_naming_a_missing_lane_fails) {
  float *d;
  CU(cudaMalloc((void **)&d, 48 * sizeof(float)));
  dt_emu_launch(shfl_exited_k, 1, 48, 0, (cudaStream_t)0, d, 48);
  expect_launch_failure("__shfl_xor_sync(FULL) in a block of 48 threads", "shfl_exited_k", "do not exist");
}

/* ---- launch limits ---------------------------------------------------------------------------- */

__global__ static void nop_k(int *p) { (void)p; }

static void launch_expect(dim3 g, dim3 b, size_t shmem, cudaError_t want) {
  dt_emu_launch(nop_k, g, b, shmem, (cudaStream_t)0, (int *)NULL);
  cudaError_t e = cudaGetLastError();
  cr_expect_eq(e, want, "<<<(%u,%u,%u), (%u,%u,%u), %zu>>>: %s (want %s)", g.x, g.y, g.z, b.x, b.y, b.z, shmem,
               cudaGetErrorName(e), cudaGetErrorName(want));
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "launch errors are not sticky");
  printf("<<<(%u,%u,%u), (%u,%u,%u), %zu>>>: %s\n", g.x, g.y, g.z, b.x, b.y, b.z, shmem, cudaGetErrorName(e));
}

Test(emu_exec, launch_limits_of_sm90) {
  const cudaError_t OK = cudaSuccess, BAD = cudaErrorInvalidConfiguration;
  launch_expect(dim3(0), dim3(32), 0, BAD);
  launch_expect(dim3(1, 65535, 1), dim3(1), 0, OK);
  launch_expect(dim3(1, 65536, 1), dim3(1), 0, BAD);
  launch_expect(dim3(1, 1, 65535), dim3(1), 0, OK);
  launch_expect(dim3(1, 1, 65536), dim3(1), 0, BAD);
  launch_expect(dim3(2147483648u), dim3(1), 0, BAD);
  launch_expect(dim3(1), dim3(1024), 0, OK);
  launch_expect(dim3(1), dim3(1025), 0, BAD);
  launch_expect(dim3(1), dim3(1, 1024), 0, OK);
  launch_expect(dim3(1), dim3(1, 1025), 0, BAD);
  launch_expect(dim3(1), dim3(1, 1, 64), 0, OK);
  launch_expect(dim3(1), dim3(1, 1, 65), 0, BAD);
  launch_expect(dim3(1), dim3(512, 2), 0, OK);
  launch_expect(dim3(1), dim3(512, 3), 0, BAD);
  launch_expect(dim3(1), dim3(0), 0, BAD);
  launch_expect(dim3(1), dim3(32), 48 << 10, OK);
  launch_expect(dim3(1), dim3(32), (48 << 10) + 1, cudaErrorInvalidValue);
  CU(cudaFuncSetAttribute(nop_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10));
  launch_expect(dim3(1), dim3(32), 100 << 10, OK);
  launch_expect(dim3(1), dim3(32), (100 << 10) + 1, cudaErrorInvalidValue);
  cr_expect_eq(cudaFuncSetAttribute(nop_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (227 << 10) + 1),
               cudaErrorInvalidValue);
  cr_expect_eq(cudaGetLastError(), cudaErrorInvalidValue);
  CU(cudaGetLastError());
  CU(cudaDeviceSynchronize());
}

Test(emu_exec, grid_over_the_limit_names_the_kernel) {
  dt_emu_launch(nop_k, dim3(4, 70000), dim3(256), 0, (cudaStream_t)0, (int *)NULL);
  cudaError_t e = cudaGetLastError();
  cr_expect_eq(e, cudaErrorInvalidConfiguration);
  cr_expect(err_mentions(e, "nop_k") && err_mentions(e, "grid.y"), "%s", cudaGetErrorString(e));
}

/* ---- speed ------------------------------------------------------------------------------------ */

__global__ static void axpy_k(float *y, const float *x, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] += 2.0f * x[i];
}

__global__ static void rowsum_k(float *out, const float *x, int rows, int C) {
  int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
  if (row >= rows) return;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[(size_t)row * C + c];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
  if (lane == 0) out[row] = s;
}

/* CPU time of this process: the machine may be shared, wall time would measure the neighbours */
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

Test(emu_exec, speed) {
  size_t n = (size_t)1 << 22;
  float *x, *y, *o;
  CU(cudaMalloc((void **)&x, n * sizeof(float)));
  CU(cudaMalloc((void **)&y, n * sizeof(float)));
  CU(cudaMemset(x, 0, n * sizeof(float)));
  CU(cudaMemset(y, 0, n * sizeof(float)));
  CU(cudaDeviceSynchronize());
  double t0 = now();
  dt_emu_launch(axpy_k, (int)(n / 256), 256, 0, (cudaStream_t)0, y, (const float *)x, n);
  CU(cudaDeviceSynchronize());
  double t1 = now();
  int rows = 1 << 15, C = 128;
  CU(cudaMalloc((void **)&o, rows * sizeof(float)));
  dt_emu_launch(rowsum_k, rows / 8, 256, 0, (cudaStream_t)0, o, (const float *)x, rows, C);
  CU(cudaDeviceSynchronize());
  double t2 = now();
  printf("CPU time: sync-free kernel: %zu threads in %.3f s (%.1f ns/thread); warp-per-row with 5 shuffles: %d warps in %.3f s "
         "(%.1f ns/thread)\n", n, t1 - t0, 1e9 * (t1 - t0) / (double)n, rows, t2 - t1, 1e9 * (t2 - t1) / (rows * 32.0));
  cr_expect_lt(t1 - t0, 5.0, "a sync-free kernel over 4M threads took %.1f s", t1 - t0);
  cr_expect_lt(t2 - t1, 5.0, "a warp-per-row kernel over 1M threads took %.1f s", t2 - t1);
}
