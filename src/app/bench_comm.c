/* `dtrain bench-comm`: nccl-tests-style benchmark of the communicator vtable (dt_comm_t) on
 * MPI_COMM_WORLD: allreduce, reduce_scatter, allgather, broadcast and a send/recv ring over
 * message sizes from --min-bytes to --max-bytes. Every row checks the data it moved (rank- and
 * index-dependent small integers whose sums are exact in fp32) and counts wrong elements; the
 * allreduce table also times a plain MPI_Allreduce loop on the same buffers for comparison. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "comm.h"
#include "mpi_check.h"
#include "timer.h"
#include "watchdog.h"

typedef enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_SENDRECV, OP_N } bench_op_t;
static const char *op_names[OP_N] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "sendrecv"};

typedef struct {
  size_t min_bytes, max_bytes;
  int iters, warmup, ops[OP_N], mpi_ref;
  double comm_timeout; /* hang watchdog deadline, 0 = off */
} bench_opts_t;

typedef struct {
  dt_comm_t *c;
  MPI_Comm world;
  float *a, *b; /* max_bytes each */
  int rank, n;
} bench_t;

/* Value rank r contributes at global element index i: a small integer, so any sum over up to 2^20
 * ranks is exact in fp32 and the expected result is known without communication. */
static float val(int r, size_t i) { return (float)((i + 3 * (size_t)r) % 8 + 1); }
static float val_sum(int n, size_t i) {
  float s = 0;
  for (int r = 0; r < n; r++) s += val(r, i);
  return s;
}

static void fill(float *p, size_t n, int r, size_t off) {
  for (size_t i = 0; i < n; i++) p[i] = val(r, off + i);
}

/* Bus bandwidth factor (nccl-tests' PERFORMANCE.md). */
static double bus_factor(bench_op_t op, int n) {
  switch (op) {
    case OP_ALLREDUCE: return 2.0 * (n - 1) / n;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER: return (double)(n - 1) / n;
    default: return 1.0;
  }
}

/* Elements moved per call for a message of `bytes` (the larger buffer); 0 = size skipped. */
static size_t op_count(bench_op_t op, size_t bytes, int n) {
  size_t count = bytes / sizeof(float);
  if (op == OP_REDUCE_SCATTER || op == OP_ALLGATHER) count -= count % (size_t)n;
  return count;
}

/* One call of op on `count` elements (total over the larger buffer). */
static dt_status_t run_once(bench_t *B, bench_op_t op, size_t count) {
  dt_comm_t *c = B->c;
  int n = B->n, r = B->rank;
  switch (op) {
    case OP_ALLREDUCE: return c->ops->allreduce(c, B->a, B->b, count, DT_F32, DT_SUM, NULL, NULL);
    case OP_REDUCE_SCATTER:
      return c->ops->reduce_scatter(c, B->a, B->b, count / (size_t)n, DT_F32, DT_SUM, NULL, NULL);
    case OP_ALLGATHER: return c->ops->allgather(c, B->a, B->b, count / (size_t)n, DT_F32, NULL, NULL);
    case OP_BROADCAST: return c->ops->broadcast(c, B->a, count, DT_F32, 0, NULL, NULL);
    case OP_SENDRECV:
      DT_TRY(c->ops->group_start(c));
      DT_TRY(c->ops->send(c, B->a, count, DT_F32, (r + 1) % n, NULL, NULL));
      DT_TRY(c->ops->recv(c, B->b, count, DT_F32, (r + n - 1) % n, NULL, NULL));
      return c->ops->group_end(c);
    default: return DT_ERR(DT_ERR_ARG, "bench-comm: unknown op %d", (int)op);
  }
}

/* Inputs for op; for broadcast the non-root ranks start from zeros so a no-op is caught. */
static void prepare(bench_t *B, bench_op_t op, size_t count) {
  int n = B->n, r = B->rank;
  size_t blk = count / (size_t)n;
  switch (op) {
    case OP_ALLREDUCE:
    case OP_REDUCE_SCATTER:
    case OP_SENDRECV: fill(B->a, count, r, 0); break;
    case OP_ALLGATHER: fill(B->a, blk, r, r * blk); break;
    case OP_BROADCAST:
      if (r == 0) fill(B->a, count, 0, 0);
      else memset(B->a, 0, count * sizeof(float));
      break;
    default: break;
  }
  if (op != OP_BROADCAST) memset(B->b, 0, count * sizeof(float));
}

/* Elements of this rank's result that differ from the exact expectation. */
static long long count_wrong(const bench_t *B, bench_op_t op, size_t count) {
  int n = B->n, r = B->rank;
  size_t blk = count / (size_t)n;
  long long bad = 0;
  switch (op) {
    case OP_ALLREDUCE:
      for (size_t i = 0; i < count; i++) bad += B->b[i] != val_sum(n, i);
      break;
    case OP_REDUCE_SCATTER:
      for (size_t i = 0; i < blk; i++) bad += B->b[i] != val_sum(n, r * blk + i);
      break;
    case OP_ALLGATHER:
      for (size_t i = 0; i < blk * (size_t)n; i++) bad += B->b[i] != val((int)(i / blk), i);
      break;
    case OP_BROADCAST:
      for (size_t i = 0; i < count; i++) bad += B->a[i] != val(0, i);
      break;
    case OP_SENDRECV:
      for (size_t i = 0; i < count; i++) bad += B->b[i] != val((r + n - 1) % n, i);
      break;
    default: break;
  }
  return bad;
}

/* Seconds per call (slowest rank) of a timed loop of op. */
static dt_status_t time_op(bench_t *B, const bench_opts_t *o, bench_op_t op, size_t count, double *sec) {
  for (int i = 0; i < o->warmup; i++) DT_TRY(run_once(B, op, count));
  DT_TRY(B->c->ops->barrier(B->c));
  double t0 = dt_time_now();
  for (int i = 0; i < o->iters; i++) DT_TRY(run_once(B, op, count));
  double t = (dt_time_now() - t0) / o->iters;
  return B->c->ops->allreduce(B->c, &t, sec, 1, DT_F64, DT_MAX, NULL, NULL);
}

/* The same allreduce as a plain MPI_Allreduce loop, outside the vtable. */
static dt_status_t time_mpi_allreduce(bench_t *B, const bench_opts_t *o, size_t count, double *sec) {
  for (int i = 0; i < o->warmup; i++) MPI_Allreduce(B->a, B->b, (int)count, MPI_FLOAT, MPI_SUM, B->world);
  MPI_Barrier(B->world);
  double t0 = dt_time_now();
  for (int i = 0; i < o->iters; i++) MPI_Allreduce(B->a, B->b, (int)count, MPI_FLOAT, MPI_SUM, B->world);
  double t = (dt_time_now() - t0) / o->iters;
  return B->c->ops->allreduce(B->c, &t, sec, 1, DT_F64, DT_MAX, NULL, NULL);
}

static dt_status_t bench_op(bench_t *B, const bench_opts_t *o, bench_op_t op, long long *wrong_total) {
  int root = B->rank == 0;
  int mpi_col = op == OP_ALLREDUCE && o->mpi_ref;
  if (root) {
    printf("#\n# op: %s  (busbw = algbw * %s)\n", op_names[op],
           op == OP_ALLREDUCE ? "2(n-1)/n" : (op == OP_REDUCE_SCATTER || op == OP_ALLGATHER) ? "(n-1)/n" : "1");
    printf("# %12s %12s %5s %6s %12s %11s %11s %8s%s\n", "size(B)", "count", "type", "redop", "time(us)",
           "algbw(GB/s)", "busbw(GB/s)", "#wrong", mpi_col ? "  mpi_time(us) mpi_busbw(GB/s)" : "");
  }
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 2) {
    size_t count = op_count(op, bytes, B->n);
    if (count == 0) continue;
    size_t size = count * sizeof(float);
    prepare(B, op, count);
    double sec = 0;
    DT_TRY(time_op(B, o, op, count, &sec));
    long long bad = count_wrong(B, op, count), bad_all = 0;
    DT_TRY(B->c->ops->allreduce(B->c, &bad, &bad_all, 1, DT_I64, DT_SUM, NULL, NULL));
    *wrong_total += bad_all;
    double algbw = (double)size / sec * 1e-9, busbw = algbw * bus_factor(op, B->n);
    double msec = 0;
    if (mpi_col) DT_TRY(time_mpi_allreduce(B, o, count, &msec));
    if (root) {
      printf("  %12zu %12zu %5s %6s %12.2f %11.3f %11.3f %8lld", size, count, "float",
             (op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER) ? "sum" : "none", sec * 1e6, algbw, busbw, bad_all);
      if (mpi_col) printf("  %12.2f %15.3f", msec * 1e6, (double)size / msec * 1e-9 * bus_factor(op, B->n));
      printf("\n");
      fflush(stdout);
    }
    if (bytes > o->max_bytes / 2) break; /* no overflow past SIZE_MAX/2 */
  }
  return DT_OK;
}

static int usage(FILE *out, int code) {
  fprintf(out,
          "usage: dtrain bench-comm [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N] [--ops LIST] [--no-mpi-ref]\n"
          "                        [--comm-timeout S]\n"
          "Times allreduce, reduce_scatter, allgather, broadcast and a send/recv ring through the communicator\n"
          "on all ranks, sizes doubling from --min-bytes (default 8) to --max-bytes (default 1G; suffixes K M G),\n"
          "checks every result and prints an nccl-tests-style table (size, count, type, time, algbw, busbw,\n"
          "#wrong) plus, for allreduce, a plain MPI_Allreduce loop on the same buffers. LIST is comma-separated\n"
          "op names (default all). --comm-timeout S: the hang watchdog's deadline as in training (system.comm_timeout:\n"
          "each blocking call becomes a nonblocking one completed in a test loop); default 0 = off, plain blocking calls.\n"
          "Exit status 0 when no value was wrong, 1 otherwise.\n");
  return code;
}

static int parse_bytes(const char *s, size_t *out) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return -1;
  if (*end == 'K' || *end == 'k') v <<= 10, end++;
  else if (*end == 'M' || *end == 'm') v <<= 20, end++;
  else if (*end == 'G' || *end == 'g') v <<= 30, end++;
  if (*end == 'B' || *end == 'i') end++;
  if (*end || v < 1 || v > (1ULL << 32)) return -1; /* 4 GiB: counts stay below INT_MAX */
  *out = (size_t)v;
  return 0;
}

static int parse_ops(const char *s, int *ops) {
  memset(ops, 0, sizeof(int) * OP_N);
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int k = 0;
    while (k < OP_N && strcmp(t, op_names[k])) k++;
    if (k == OP_N) return -1;
    ops[k] = 1;
  }
  return 0;
}

static int parse_args(int argc, char **argv, bench_opts_t *o) {
  *o = (bench_opts_t){.min_bytes = 8, .max_bytes = (size_t)1 << 30, .iters = 20, .warmup = 2, .mpi_ref = 1};
  for (int k = 0; k < OP_N; k++) o->ops[k] = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0);
    if (!strcmp(a, "--no-mpi-ref")) {
      o->mpi_ref = 0;
      continue;
    }
    if (!v) bad = 1;
    else if (!strcmp(a, "--min-bytes")) bad = parse_bytes(v, &o->min_bytes);
    else if (!strcmp(a, "--max-bytes")) bad = parse_bytes(v, &o->max_bytes);
    else if (!strcmp(a, "--iters")) bad = (o->iters = atoi(v)) < 1;
    else if (!strcmp(a, "--warmup")) bad = (o->warmup = atoi(v)) < 0 || strspn(v, "0123456789") != strlen(v);
    else if (!strcmp(a, "--ops")) bad = parse_ops(v, o->ops);
    else if (!strcmp(a, "--comm-timeout")) bad = (o->comm_timeout = atof(v)) < 0 || strspn(v, "0123456789.") != strlen(v);
    else {
      fprintf(stderr, "dtrain bench-comm: unknown option '%s'\n", a);
      return usage(stderr, 2);
    }
    if (bad) {
      fprintf(stderr, "dtrain bench-comm: %s: bad or missing value '%s'\n", a, v ? v : "");
      return 2;
    }
    i++;
  }
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "dtrain bench-comm: --min-bytes %zu exceeds --max-bytes %zu\n", o->min_bytes, o->max_bytes);
    return 2;
  }
  return -1;
}

int dt_bench_comm_main(int argc, char **argv) {
  bench_opts_t o;
  int code = parse_args(argc, argv, &o);
  if (code >= 0) return code;
  bench_t B = {.world = MPI_COMM_WORLD};
  dt_mpi_init(&argc, &argv, &B.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &B.n);
  long long wrong = 0;
  dt_status_t st = dt_wd_start(o.comm_timeout, o.comm_timeout);
  if (st == DT_OK) st = dt_comm_mpi_create(&B.world, &B.c);
  B.a = malloc(o.max_bytes);
  B.b = malloc(o.max_bytes);
  if (st == DT_OK && (!B.a || !B.b)) st = DT_ERR(DT_ERR_NOMEM, "rank %d: cannot allocate 2 x %zu bytes", B.rank, o.max_bytes);
  if (st == DT_OK && B.rank == 0) {
    int vlen;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(ver, &vlen);
    ver[strcspn(ver, "\n,")] = '\0';
    printf("# bench-comm: %d ranks, communicator %s, %s\n", B.n, B.c->ops->name, ver);
    printf("# sizes %zu..%zu bytes (x2), %d warmup + %d timed iterations; time = slowest rank's mean\n",
           o.min_bytes, o.max_bytes, o.warmup, o.iters);
    if (o.comm_timeout > 0)
      printf("# hang watchdog on (--comm-timeout %g): nonblocking calls completed in a test loop\n", o.comm_timeout);
  }
  for (int k = 0; k < OP_N && st == DT_OK; k++)
    if (o.ops[k]) st = bench_op(&B, &o, (bench_op_t)k, &wrong);
  free(B.a);
  free(B.b);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain bench-comm: rank %d: %s\n", B.rank, dt_err_msg());
    fflush(stderr);
    if (B.n > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    return 1;
  }
  if (B.rank == 0) printf("# bench-comm: %s, %lld wrong values in total\n", wrong ? "FAILED" : "ok", wrong);
  B.c->ops->free(B.c);
  dt_wd_stop();
  MPI_Finalize();
  return wrong ? 1 : 0;
}
