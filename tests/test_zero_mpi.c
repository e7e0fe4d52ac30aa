/* ZeRO's collectives (zero.h) at several ranks, run by tests/zero_mpi.sh under mpirun -n 2 and -n 3,
 * with staging pieces much smaller than a shard (many rounds, a short last one), which the test
 * models never reach (they fit one 25 MiB piece): stage 1's averaged reduce-scatter and the
 * parameter all-gather, stage 2's bucket reduction to the owners, page dropping and shard average,
 * and stage 3's gathers, releases and the layer hook's prefetch order; then stages 1-3 again on
 * the device paths (dt_zero_set_device, with the CPU backend's kernels standing in for a GPU's).
 * Rank r's gradient i is
 * val(r, i) = 3(r + 1) + i % 5, so sums and means over ranks are exact; a parameter owned by rank
 * o is 1000 o + i. Exits 1 if any check failed on any rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model.h"
#include "zero.h"

static int me, n_checks, n_fail;
static dt_backend_t *g_dev; /* set: the device paths (main) */

#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    n_checks++;                                                                   \
    if (!(cond) && n_fail++ < 20) {                                               \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", me, __FILE__, __LINE__);           \
      fprintf(stderr, __VA_ARGS__);                                               \
      fputc('\n', stderr);                                                        \
    }                                                                             \
  } while (0)

static float val(int r, size_t i) { return (float)(3 * (r + 1) + (int)(i % 5)); }
static float mean(int p, size_t i) { return (float)(1.5 * (p + 1) + (double)(i % 5)); }

/* After dt_zero_init: with g_dev set, the device paths as the CUDA backend takes them. */
static void device_mode(dt_zero_t *z, dt_comm_t *w) {
  if (!g_dev) return;
  dt_zero_set_device(z, g_dev);
  CHECK(dt_zero_use_device_comm(z, w) == DT_OK, "use_device_comm");
  CHECK(z->stage_buf == NULL, "a device communicator needs no staging buffer");
}

/* An anonymous mapping, as the CPU backend's arenas are (dt_zero_drop gives pages back). */
static float *arena(size_t n) {
  void *a = mmap(NULL, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) {
    perror("mmap");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return a;
}

/* Stage 1: the reduce-scatter leaves the mean in this rank's shard; the all-gather gives every
 * rank every owner's shard. piece_floats: floats per rank per round. */
static void stage1(dt_comm_t *w, size_t n, size_t piece_floats) {
  int p = w->size;
  dt_zero_t z;
  CHECK(dt_zero_init(&z, 1, w, me, n, piece_floats * (size_t)p * sizeof(float)) == DT_OK, "init");
  device_mode(&z, w);
  float *g = arena(n), *x = arena(n);
  for (size_t i = 0; i < n; i++) g[i] = val(me, i), x[i] = i >= z.lo && i < z.hi ? 1000.0f * me + (float)i : -1.0f;
  CHECK(dt_zero_reduce_grads(&z, g) == DT_OK, "reduce_grads");
  int bad = 0;
  for (size_t i = z.lo; i < z.hi; i++) bad += g[i] != mean(p, i);
  CHECK(!bad, "piece %zu: %d elements of the shard are not the mean over ranks", piece_floats, bad);
  bad = 0; /* the host path moves the shard in rounds and writes nothing else (the device path's in-place
             * collective may use the other blocks as its scratch) */
  for (size_t i = 0; i < n && !g_dev; i++) bad += (i < z.lo || i >= z.hi) && g[i] != val(me, i);
  CHECK(!bad, "piece %zu: %d gradients outside the shard changed (a round past the shard's end)", piece_floats, bad);
  CHECK(dt_zero_gather_params(&z, x) == DT_OK, "gather_params");
  bad = 0;
  for (size_t i = 0; i < n; i++) bad += x[i] != 1000.0f * (float)(i / z.shard) + (float)i;
  CHECK(!bad, "piece %zu: %d parameters are not their owner's after the all-gather", piece_floats, bad);
  munmap(g, n * sizeof(float));
  munmap(x, n * sizeof(float));
  dt_zero_free(&z);
}

/* Pages of a[lo, hi) (floats) resident in memory (mincore), out of the whole pages in it. */
static int resident_pages(float *a, size_t lo, size_t hi, int *pages) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE), per = page / sizeof(float);
  size_t p0 = (lo + per - 1) / per, p1 = hi / per;
  unsigned char v[64];
  *pages = (int)(p1 - p0);
  if (p1 <= p0 || p1 - p0 > sizeof v || mincore(a + p0 * per, (p1 - p0) * page, v) != 0) return -1;
  int r = 0;
  for (size_t i = 0; i < p1 - p0; i++) r += v[i] & 1;
  return r;
}

/* dt_zero_drop zeroes exactly [lo, hi), whole pages given back (not resident afterwards) and
 * partial ones cleared. */
static void drop(size_t n) {
  float *a = arena(n);
  const size_t cuts[][2] = {{0, n}, {1, n - 1}, {5, 5}, {7, 9}, {1000, 3100}, {1024, 2048}, {1023, 2049}};
  for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
    for (size_t i = 0; i < n; i++) a[i] = 1.0f;
    dt_zero_drop(a, cuts[c][0], cuts[c][1]);
    int pages, res = resident_pages(a, cuts[c][0], cuts[c][1], &pages); /* before reading maps them */
    CHECK(pages <= 0 || res == 0, "drop [%zu, %zu): %d of its %d whole pages still resident", cuts[c][0], cuts[c][1],
          res, pages);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != (i >= cuts[c][0] && i < cuts[c][1] ? 0.0f : 1.0f);
    CHECK(!bad, "drop [%zu, %zu): %d elements wrong", cuts[c][0], cuts[c][1], bad);
  }
  munmap(a, n * sizeof(float));
}

/* Stage 2: buckets from the end of the arena down (their edges cross the shards'), each reduced
 * to the owners of its parts and dropped elsewhere; then the shard averaged. */
static void stage2(dt_comm_t *w, size_t n) {
  int p = w->size;
  dt_zero_t z;
  CHECK(dt_zero_init(&z, 2, w, me, n, 64 * sizeof(float)) == DT_OK, "init");
  device_mode(&z, w);
  float *g = arena(n);
  for (size_t i = 0; i < n; i++) g[i] = val(me, i);
  size_t hi = n, step = n / 7 + 13;
  while (hi > 0) {
    size_t lo = hi > step ? hi - step : 0;
    CHECK(dt_zero_reduce_bucket(&z, g, lo, hi) == DT_OK, "reduce_bucket");
    hi = lo;
  }
  CHECK(dt_zero_average_shard(&z, g) == DT_OK, "average_shard");
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad += g[i] != (i >= z.lo && i < z.hi ? mean(p, i) : 0.0f);
  CHECK(!bad, "%d gradients wrong (the shard: the mean; elsewhere: 0)", bad);
  munmap(g, n * sizeof(float));
  dt_zero_free(&z);
}

/* Stage 3: 3 blocks between an embedding group and an ln_f group, edges not on shard edges. */
static int block_complete(const float *x, const size_t *grp, int l, size_t shard) {
  for (size_t i = grp[l + 1]; i < grp[l + 2]; i++)
    if (x[i] != 1000.0f * (float)(i / shard) + (float)i) return 0;
  return 1;
}

static int released(const float *x, size_t lo, size_t hi, const dt_zero_t *z) {
  for (size_t i = lo; i < hi; i++)
    if (x[i] != (i >= z->lo && i < z->hi ? 1000.0f * (float)(i / z->shard) + (float)i : 0.0f)) return 0;
  return 1;
}

static void stage3(dt_comm_t *w, size_t n) {
  enum { L = 3 };
  dt_zero_t z;
  CHECK(dt_zero_init(&z, 3, w, me, n, 1 << 20) == DT_OK, "init");
  device_mode(&z, w);
  const size_t grp[L + 3] = {0, 300, 1100, 1900, 2700, n};
  float *x = arena(n);
  for (size_t i = 0; i < n; i++) x[i] = i >= z.lo && i < z.hi ? 1000.0f * me + (float)i : 0.0f;
  CHECK(dt_zero3_attach(&z, x, grp, L) == DT_OK, "attach");
  CHECK(dt_zero3_gather(&z, grp[0], grp[1]) == DT_OK, "gather the embeddings");
  int bad = 0;
  for (size_t i = grp[0]; i < grp[1]; i++) bad += x[i] != 1000.0f * (float)(i / z.shard) + (float)i;
  CHECK(!bad, "gather: %d embedding parameters are not their owner's", bad);
  CHECK(dt_zero3_release(&z, grp[0], grp[1]) == DT_OK, "release");
  CHECK(released(x, 0, n, &z), "release: only this rank's shard is left");
  for (int pass = 0; pass < 2; pass++) { /* forward 0, 1, 2 then backward 2, 1, 0 */
    for (int k = 0; k < L; k++) {
      int l = pass == 0 ? k : L - 1 - k, next = pass == 0 ? l + 1 : l - 1;
      CHECK(dt_zero3_hook(&z, l, pass == 0 ? DT_HOOK_FWD : DT_HOOK_BWD) == DT_OK, "hook");
      CHECK(block_complete(x, grp, l, z.shard), "pass %d: block %d is not complete when it runs", pass, l);
      if (next >= 0 && next < L) CHECK(z.have == next, "pass %d block %d: block %d's gather not started", pass, l, next);
      CHECK(dt_zero3_hook(&z, l, pass == 0 ? DT_HOOK_FWD_DONE : DT_HOOK_BWD_DONE) == DT_OK, "hook done");
      CHECK(released(x, grp[l + 1], grp[l + 2], &z), "pass %d: block %d not released after it ran", pass, l);
    }
  }
  CHECK(dt_zero3_hook(&z, 0, DT_HOOK_FWD) == DT_OK, "a forward after the backward");
  CHECK(block_complete(x, grp, 0, z.shard), "block 0 again");
  CHECK(dt_zero3_hook(&z, 0, DT_HOOK_FWD_DONE) == DT_OK, "hook done");
  dt_zero_free(&z); /* waits for block 1's prefetch */
  munmap(x, n * sizeof(float));
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  int p;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  dt_err_set_rank(me);
  MPI_Comm wc = MPI_COMM_WORLD;
  dt_comm_t *w = NULL;
  CHECK(dt_comm_mpi_create(&wc, &w) == DT_OK, "create: %s", dt_err_msg());
  size_t n, lo, hi;
  dt_zero_split(5000, p, me, DT_ALIGN, &n, &lo, &hi);
  stage1(w, n, 7);      /* many rounds, a short last one */
  stage1(w, n, n);      /* one round: the piece is clipped to the shard */
  drop(n);
  stage2(w, n);
  stage3(w, n);
  /* The device paths (one in-place collective each on the stream, clears and the mean by the
   * backend's kernels) on the CPU backend's kernels and host memory: the MPI communicator takes
   * the in-place forms NCCL does and ignores the stream. */
  static int fake_stream;
  dt_backend_t dev = {.ops = &dt_backend_cpu, .k = dt_backend_cpu.kernels, .stream = &fake_stream};
  g_dev = &dev;
  stage1(w, n, n);
  stage2(w, n);
  stage3(w, n);
  w->ops->free(w);
  int tot[2] = {n_fail, n_checks}, all[2];
  MPI_Allreduce(tot, all, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0)
    printf("test_zero_mpi: %d ranks, arena %zu floats: %d checks, %d failed\n", p, n, all[1], all[0]);
  MPI_Finalize();
  return all[0] ? 1 : 0;
}
