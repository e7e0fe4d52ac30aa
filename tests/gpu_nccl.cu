/* The NCCL communicator (cuda/comm_nccl.cu) on real devices: every collective of dt_comm_ops_t on
 * device buffers with exact data (integers, and floats that are small integers for AVG), blocking
 * and through requests (wait, test), inside a group, in place and out of place; send/recv around
 * a ring (two ranks or more). Every rank checks every element against the value its formula
 * gives. Runs as a singleton (one GPU: multi-rank NCCL is then NOT tested, and it says so) or
 * under mpirun/srun with one rank per GPU. With the argument `mpi`, the same checks run on the
 * communicator that stages device buffers through host memory over MPI (cuda/comm_staged.cu,
 * system.device_comm = mpi) instead.
 *   gpu_nccl [mpi]  exit 0 all correct, 1 a wrong element or a failed call, 77 no usable GPU */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "comm.h"
#include "dt_cuda.h"
}

static int g_bad = 0, g_rank = 0;

static void check_call(dt_status_t st, const char *what) {
  if (st == DT_OK) return;
  printf("rank %d: %s failed: %s\n", g_rank, what, dt_err_msg());
  g_bad++;
}
#define CALL(x) check_call((x), #x)

static void ck(cudaError_t rc, const char *what) {
  if (rc == cudaSuccess) return;
  printf("rank %d: %s: %s\n", g_rank, what, cudaGetErrorString(rc));
  exit(1);
}

/* n ints of device memory holding f(i) */
static int *dev_ints(size_t n, int (*f)(int r, size_t i), int r) {
  int *h = (int *)malloc(n * sizeof(int)), *d = NULL;
  for (size_t i = 0; i < n; i++) h[i] = f(r, i);
  ck(cudaMalloc(&d, n * sizeof(int)), "cudaMalloc");
  ck(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice), "cudaMemcpy");
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); /* see copy() */
  free(h);
  return d;
}

/* dst = src on the device, finished before the communicator's stream reads dst: cudaMemcpy runs
 * on the legacy default stream, which a non-blocking stream (the communicator's) does not wait
 * for, and a device-to-device cudaMemcpy returns before the copy is done. */
static void copy(int *dst, const int *src, size_t n) {
  ck(cudaMemcpy(dst, src, n * sizeof(int), cudaMemcpyDeviceToDevice), "cudaMemcpy");
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static void expect(const char *what, const int *d, size_t n, int (*want)(int r, size_t i, int size), int size) {
  int *h = (int *)malloc(n * sizeof(int));
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  ck(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
  size_t wrong = 0, first = n;
  for (size_t i = 0; i < n; i++)
    if (h[i] != want(g_rank, i, size)) {
      wrong++;
      if (first == n) first = i;
    }
  if (wrong) {
    printf("rank %d: %s: %zu of %zu elements wrong (first [%zu] = %d, want %d)\n", g_rank, what, wrong, n, first,
           h[first], want(g_rank, first, size));
    g_bad++;
  } else if (g_rank == 0) {
    printf("ok: %s (%zu elements)\n", what, n);
  }
  free(h);
}

static int val(int r, size_t i) { return (int)(i % 1000) * 7 + r * 3 + 1; }
static int sum_val(int r, size_t i, int size) {
  (void)r;
  return (int)(i % 1000) * 7 * size + 3 * size * (size - 1) / 2 + size;
}
static int max_val(int r, size_t i, int size) { return val(size - 1, i) + 0 * r; }
static int min_val(int r, size_t i, int size) { return val(0, i) + 0 * r * size; }
static int gathered(int r, size_t i, int size) { return val((int)(i / (size_t)(1 << 16)) % size, i % (1 << 16)) + 0 * r; }
static int from_root1(int r, size_t i, int size) { return val(size > 1 ? 1 : 0, i) + 0 * r; }
static int from_prev(int r, size_t i, int size) { return val((r + size - 1) % size, i); }

int main(int argc, char **argv) {
  const int staged = argc > 1 && !strcmp(argv[1], "mpi");
  int provided = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int ndev = dt_cuda_device_count();
  if (ndev < 1) {
    if (g_rank == 0) printf("skip: no usable GPU (%s)\n", dt_cuda_device_error());
    MPI_Finalize();
    return 77;
  }
  MPI_Comm w = MPI_COMM_WORLD;
  dt_comm_t *c = NULL;
  ck(cudaSetDevice(g_rank % ndev), "cudaSetDevice");
  dt_status_t st = staged ? dt_comm_staged_create(&w, &c) : dt_comm_nccl_create(&w, g_rank % ndev, 60, &c);
  if (st != DT_OK) {
    printf("rank %d: creating the communicator failed: %s\n", g_rank, dt_err_msg());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (g_rank == 0)
    printf("# %s communicator of %d rank%s on %d visible GPU%s%s\n", staged ? "host-staged MPI" : "NCCL", size,
           size > 1 ? "s" : "", ndev, ndev > 1 ? "s" : "",
           size == 1 ? " (one rank: collectives run, multi-rank communication is NOT tested here)" : "");
  const size_t n = (size_t)1 << 16; /* per rank: 256 KiB of int32 */
  int *a = dev_ints(n, val, g_rank), *b = NULL, *big = NULL;
  ck(cudaMalloc(&b, n * sizeof(int)), "cudaMalloc");
  ck(cudaMalloc(&big, n * size * sizeof(int)), "cudaMalloc");

  CALL(c->ops->allreduce(c, a, b, n, DT_I32, DT_SUM, NULL, NULL));
  expect("allreduce sum (out of place)", b, n, sum_val, size);
  CALL(c->ops->allreduce(c, a, b, n, DT_I32, DT_MAX, NULL, NULL));
  expect("allreduce max", b, n, max_val, size);
  dt_comm_req_t *req = NULL;
  CALL(c->ops->allreduce(c, a, b, n, DT_I32, DT_MIN, NULL, &req));
  CALL(c->ops->wait(c, req));
  expect("allreduce min (request, wait)", b, n, min_val, size);
  copy(b, a, n);
  CALL(c->ops->allreduce(c, b, b, n, DT_I32, DT_SUM, NULL, &req));
  for (int done = 0; !done && g_bad == 0;) CALL(c->ops->test(c, req, &done));
  expect("allreduce sum (in place, request, test)", b, n, sum_val, size);

  /* every rank's a into big: block r from rank r */
  CALL(c->ops->allgather(c, a, big, n, DT_I32, NULL, NULL));
  expect("allgather", big, n * size, gathered, size);
  /* big holds the same size*n on every rank: reduce-scattered, block r (= gathered block r x size) */
  int *rs = NULL;
  ck(cudaMalloc(&rs, n * sizeof(int)), "cudaMalloc");
  CALL(c->ops->reduce_scatter(c, big, rs, n, DT_I32, DT_SUM, NULL, NULL));
  int *hrs = (int *)malloc(n * sizeof(int));
  ck(cudaMemcpy(hrs, rs, n * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += hrs[i] != val(g_rank, i) * size;
  if (wrong) {
    printf("rank %d: reduce_scatter: %zu of %zu wrong\n", g_rank, wrong, n);
    g_bad++;
  } else if (g_rank == 0) {
    printf("ok: reduce_scatter (%zu elements per rank)\n", n);
  }
  free(hrs);
  /* the in-place forms ZeRO uses: this rank's block already in place (allgather), the result
   * landing in this rank's own block (reduce-scatter, NCCL style) */
  int *ip = NULL;
  ck(cudaMalloc(&ip, n * size * sizeof(int)), "cudaMalloc");
  copy(ip + (size_t)g_rank * n, a, n);
  CALL(c->ops->allgather(c, ip + (size_t)g_rank * n, ip, n, DT_I32, NULL, NULL));
  expect("allgather (in place)", ip, n * size, gathered, size);
  CALL(c->ops->reduce_scatter(c, ip, ip + (size_t)g_rank * n, n, DT_I32, DT_SUM, NULL, NULL));
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  hrs = (int *)malloc(n * sizeof(int));
  ck(cudaMemcpy(hrs, ip + (size_t)g_rank * n, n * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
  wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += hrs[i] != val(g_rank, i) * size;
  if (wrong) {
    printf("rank %d: reduce_scatter (in place): %zu of %zu wrong\n", g_rank, wrong, n);
    g_bad++;
  } else if (g_rank == 0) {
    printf("ok: reduce_scatter (in place, own block)\n");
  }
  free(hrs);
  cudaFree(ip);

  copy(b, a, n);
  CALL(c->ops->broadcast(c, b, n, DT_I32, size > 1 ? 1 : 0, NULL, NULL));
  expect("broadcast from rank 1 (0 at one rank)", b, n, from_root1, size);
  CALL(c->ops->reduce(c, a, b, n, DT_I32, DT_SUM, 0, NULL, NULL));
  if (g_rank == 0) expect("reduce sum to rank 0", b, n, sum_val, size);

  /* a ring in one group: send a to the next rank, receive the previous rank's (needs 2 ranks: the
   * communicator refuses a send to itself) */
  if (size > 1) {
    CALL(c->ops->group_start(c));
    CALL(c->ops->send(c, a, n, DT_I32, (g_rank + 1) % size, NULL, NULL));
    CALL(c->ops->recv(c, b, n, DT_I32, (g_rank + size - 1) % size, NULL, NULL));
    CALL(c->ops->group_end(c));
    expect("send/recv ring in a group", b, n, from_prev, size);
  } else if (g_rank == 0) {
    printf("skip: send/recv (one rank)\n");
  }

  /* AVG on floats that are small integers: exact */
  float *f = NULL, hf[256];
  for (int i = 0; i < 256; i++) hf[i] = (float)(i * size + g_rank * 2);
  ck(cudaMalloc(&f, sizeof hf), "cudaMalloc");
  ck(cudaMemcpy(f, hf, sizeof hf, cudaMemcpyHostToDevice), "cudaMemcpy");
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  CALL(c->ops->allreduce(c, f, f, 256, DT_F32, DT_AVG, NULL, NULL));
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  ck(cudaMemcpy(hf, f, sizeof hf, cudaMemcpyDeviceToHost), "cudaMemcpy");
  int avg_bad = 0;
  for (int i = 0; i < 256; i++) avg_bad += hf[i] != (float)(i * size + (size - 1));
  if (avg_bad) {
    printf("rank %d: allreduce avg f32: %d of 256 wrong (first %g)\n", g_rank, avg_bad, hf[0]);
    g_bad++;
  } else if (g_rank == 0) {
    printf("ok: allreduce avg (f32, exact values)\n");
  }
  CALL(c->ops->barrier(c));

  c->ops->free(c);
  cudaFree(a);
  cudaFree(b);
  cudaFree(big);
  cudaFree(rs);
  cudaFree(f);
  int bad = 0;
  MPI_Allreduce(&g_bad, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) printf("gpu_nccl: %s\n", bad ? "FAILED" : "every collective exact on every rank");
  MPI_Finalize();
  return bad ? 1 : 0;
}
