/* Multi-rank check of the MPI communicator (plain MPI program, run by tests/comm_mpi.sh under
 * mpirun -n 4 and -n 3): every collective blocking, nonblocking (wait and test) and deferred in a
 * group; in place (both conventions) and not; SUM/AVG/MAX/MIN on every dtype; on the world and on
 * a split into two groups with reversed key order; send/recv ordering and a large ring; error
 * paths. Expected values come from closed forms: rank r holds val(r, i) = 3(r+1) + i%5, so over
 * n ranks sum = 3n(n+1)/2 + n(i%5), max = 3n + i%5, min = 3 + i%5, avg = sum/n (exact in
 * binary floating point). All of it twice: with the hang watchdog off (blocking MPI calls) and on
 * (nonblocking calls completed under a deadline, watchdog.h). Exits 1 if any check failed on any rank. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "watchdog.h"

static int world_rank, n_checks, n_fail;

#define CHECK(cond, ...)                                        \
  do {                                                          \
    n_checks++;                                                 \
    if (!(cond)) {                                              \
      if (n_fail++ < 20) {                                      \
        fprintf(stderr, "rank %d: FAIL %s:%d: ", world_rank, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                           \
        fputc('\n', stderr);                                    \
      }                                                         \
    }                                                           \
  } while (0)

static double val(int r, size_t i) { return 3.0 * (r + 1) + (double)(i % 5); }

static void set(void *b, dt_dtype_t t, size_t i, double v) {
  switch (t) {
    case DT_F32: ((float *)b)[i] = (float)v; break;
    case DT_F64: ((double *)b)[i] = v; break;
    case DT_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    case DT_U8: ((uint8_t *)b)[i] = (uint8_t)v; break;
  }
}

static double get(const void *b, dt_dtype_t t, size_t i) {
  switch (t) {
    case DT_F32: return ((const float *)b)[i];
    case DT_F64: return ((const double *)b)[i];
    case DT_I32: return ((const int32_t *)b)[i];
    case DT_I64: return (double)((const int64_t *)b)[i];
    case DT_U8: return ((const uint8_t *)b)[i];
  }
  return 0;
}

static double expect_red(dt_redop_t op, int n, size_t i) {
  double s = 1.5 * n * (n + 1) + (double)n * (double)(i % 5);
  switch (op) {
    case DT_SUM: return s;
    case DT_AVG: return s / n;
    case DT_MAX: return 3.0 * n + (double)(i % 5);
    case DT_MIN: return 3.0 + (double)(i % 5);
  }
  return -1;
}

enum { M_BLOCK, M_WAIT, M_TEST, M_GROUP, M_COUNT };
static const char *mode_name[] = {"blocking", "nonblocking+wait", "nonblocking+test", "group"};
static const char *op_name[] = {"sum", "avg", "max", "min"};

/* Run one operation (already bound in a small closure struct) in a mode. */
typedef struct {
  int kind; /* 0 allreduce, 1 reduce_scatter, 2 allgather, 3 broadcast, 4 reduce */
  const void *send;
  void *recv;
  size_t count;
  dt_dtype_t t;
  dt_redop_t op;
  int root;
} call_t;

static dt_status_t run(dt_comm_t *c, int mode, const call_t *k) {
  dt_comm_req_t *r = NULL, **rp = (mode == M_WAIT || mode == M_TEST) ? &r : NULL;
  dt_status_t st;
  if (mode == M_GROUP) c->ops->group_start(c);
  switch (k->kind) {
    case 0: st = c->ops->allreduce(c, k->send, k->recv, k->count, k->t, k->op, NULL, rp); break;
    case 1: st = c->ops->reduce_scatter(c, k->send, k->recv, k->count, k->t, k->op, NULL, rp); break;
    case 2: st = c->ops->allgather(c, k->send, k->recv, k->count, k->t, NULL, rp); break;
    case 4: st = c->ops->reduce(c, k->send, k->recv, k->count, k->t, k->op, k->root, NULL, rp); break;
    default: st = c->ops->broadcast(c, k->recv, k->count, k->t, k->root, NULL, rp); break;
  }
  if (mode == M_GROUP) {
    dt_status_t s2 = c->ops->group_end(c);
    if (st == DT_OK) st = s2;
  }
  if (st != DT_OK || !rp) return st;
  if (mode == M_WAIT) return c->ops->wait(c, r);
  int done = 0;
  while (!done) {
    st = c->ops->test(c, r, &done);
    if (st != DT_OK) return st;
  }
  return DT_OK;
}

static const dt_dtype_t types[] = {DT_F32, DT_F64, DT_I32, DT_I64, DT_U8};
static const size_t counts[] = {1, 1000, 65537};

static void check_allreduce(dt_comm_t *c, const char *cn) {
  int n = c->size, me = c->rank;
  for (int ti = 0; ti < 5; ti++)
    for (int ci = 0; ci < 3; ci++)
      for (int op = DT_SUM; op <= DT_MIN; op++)
        for (int mode = 0; mode < M_COUNT; mode++)
          for (int inplace = 0; inplace < 2; inplace++) {
            dt_dtype_t t = types[ti];
            size_t cnt = counts[ci], es = dt_dtype_size(t);
            if (op == DT_AVG && t != DT_F32 && t != DT_F64) continue;
            char *s = malloc(cnt * es), *d = malloc(cnt * es);
            for (size_t i = 0; i < cnt; i++) {
              set(s, t, i, val(me, i));
              set(d, t, i, -1);
            }
            call_t k = {0, s, inplace ? s : d, cnt, t, (dt_redop_t)op, 0};
            dt_status_t st = run(c, mode, &k);
            CHECK(st == DT_OK, "%s allreduce: %s", cn, dt_err_msg());
            const char *res = inplace ? s : d;
            size_t bad = 0;
            for (size_t i = 0; i < cnt; i++)
              if (get(res, t, i) != expect_red((dt_redop_t)op, n, i)) bad++;
            CHECK(bad == 0, "%s allreduce %s %s count %zu %s%s: %zu wrong (e.g. [0] %g want %g)", cn,
                  dt_dtype_name(t), op_name[op], cnt, mode_name[mode], inplace ? " in place" : "", bad,
                  get(res, t, 0), expect_red((dt_redop_t)op, n, 0));
            free(s);
            free(d);
          }
}

static void check_reduce(dt_comm_t *c, const char *cn) {
  int n = c->size, me = c->rank;
  for (int ti = 0; ti < 5; ti++)
    for (int ci = 0; ci < 3; ci++)
      for (int op = DT_SUM; op <= DT_MIN; op++)
        for (int mode = 0; mode < M_COUNT; mode++)
          for (int root = 0; root < n; root++)
            for (int inplace = 0; inplace < 2; inplace++) {
              dt_dtype_t t = types[ti];
              size_t cnt = counts[ci], es = dt_dtype_size(t);
              if (op == DT_AVG && t != DT_F32 && t != DT_F64) continue;
              char *s = malloc(cnt * es), *d = malloc(cnt * es);
              for (size_t i = 0; i < cnt; i++) {
                set(s, t, i, val(me, i));
                set(d, t, i, -1);
              }
              call_t k = {4, s, inplace ? s : d, cnt, t, (dt_redop_t)op, root};
              dt_status_t st = run(c, mode, &k);
              CHECK(st == DT_OK, "%s reduce: %s", cn, dt_err_msg());
              const char *res = inplace ? s : d;
              size_t bad = 0;
              for (size_t i = 0; i < cnt; i++) /* non-roots: their send buffer is untouched */
                if (me == root ? get(res, t, i) != expect_red((dt_redop_t)op, n, i) : get(s, t, i) != val(me, i)) bad++;
              CHECK(bad == 0, "%s reduce %s %s count %zu %s root %d%s: %zu wrong", cn, dt_dtype_name(t), op_name[op],
                    cnt, mode_name[mode], root, inplace ? " in place" : "", bad);
              free(s);
              free(d);
            }
}

static void check_reduce_scatter(dt_comm_t *c, const char *cn) {
  int n = c->size, me = c->rank;
  for (int ti = 0; ti < 5; ti++)
    for (int ci = 0; ci < 2; ci++)
      for (int op = DT_SUM; op <= DT_MIN; op++)
        for (int mode = 0; mode < M_COUNT; mode++)
          for (int inplace = 0; inplace < 3; inplace++) { /* 0 no, 1 recv==send, 2 recv==own block */
            dt_dtype_t t = types[ti];
            size_t cnt = counts[ci], es = dt_dtype_size(t), tot = cnt * (size_t)n;
            if (op == DT_AVG && t != DT_F32 && t != DT_F64) continue;
            char *s = malloc(tot * es), *d = malloc(cnt * es);
            for (size_t j = 0; j < tot; j++) set(s, t, j, val(me, j));
            for (size_t i = 0; i < cnt; i++) set(d, t, i, -1);
            char *rb = inplace == 0 ? d : inplace == 1 ? s : s + (size_t)me * cnt * es;
            call_t k = {1, s, rb, cnt, t, (dt_redop_t)op, 0};
            dt_status_t st = run(c, mode, &k);
            CHECK(st == DT_OK, "%s reduce_scatter: %s", cn, dt_err_msg());
            size_t bad = 0;
            for (size_t i = 0; i < cnt; i++) /* block me, element i = global index me*cnt+i */
              if (get(rb, t, i) != expect_red((dt_redop_t)op, n, (size_t)me * cnt + i)) bad++;
            CHECK(bad == 0, "%s reduce_scatter %s %s count %zu %s inplace=%d: %zu wrong", cn,
                  dt_dtype_name(t), op_name[op], cnt, mode_name[mode], inplace, bad);
            free(s);
            free(d);
          }
}

static void check_allgather(dt_comm_t *c, const char *cn) {
  int n = c->size, me = c->rank;
  for (int ti = 0; ti < 5; ti++)
    for (int ci = 0; ci < 3; ci++)
      for (int mode = 0; mode < M_COUNT; mode++)
        for (int inplace = 0; inplace < 3; inplace++) { /* 0 no, 1 send==own block, 2 send==recv */
          dt_dtype_t t = types[ti];
          size_t cnt = counts[ci], es = dt_dtype_size(t), tot = cnt * (size_t)n;
          char *s = malloc(cnt * es), *d = malloc(tot * es);
          for (size_t j = 0; j < tot; j++) set(d, t, j, 99);
          char *sb = inplace == 0 ? s : inplace == 1 ? d + (size_t)me * cnt * es : d;
          for (size_t i = 0; i < cnt; i++) set(sb, t, i, val(me, i));
          call_t k = {2, sb, d, cnt, t, DT_SUM, 0};
          dt_status_t st = run(c, mode, &k);
          CHECK(st == DT_OK, "%s allgather: %s", cn, dt_err_msg());
          size_t bad = 0;
          for (int b = 0; b < n; b++)
            for (size_t i = 0; i < cnt; i++)
              if (get(d, t, (size_t)b * cnt + i) != val(b, i)) bad++;
          CHECK(bad == 0, "%s allgather %s count %zu %s inplace=%d: %zu wrong", cn, dt_dtype_name(t), cnt,
                mode_name[mode], inplace, bad);
          free(s);
          free(d);
        }
}

static void check_broadcast(dt_comm_t *c, const char *cn) {
  int n = c->size, me = c->rank;
  for (int ti = 0; ti < 5; ti++)
    for (int ci = 0; ci < 3; ci++)
      for (int mode = 0; mode < M_COUNT; mode++)
        for (int root = 0; root < n; root += n - 1 > 0 ? n - 1 : 1) {
          dt_dtype_t t = types[ti];
          size_t cnt = counts[ci], es = dt_dtype_size(t);
          char *b = malloc(cnt * es);
          for (size_t i = 0; i < cnt; i++) set(b, t, i, me == root ? val(root, i) : 0);
          call_t k = {3, NULL, b, cnt, t, DT_SUM, root};
          dt_status_t st = run(c, mode, &k);
          CHECK(st == DT_OK, "%s broadcast: %s", cn, dt_err_msg());
          size_t bad = 0;
          for (size_t i = 0; i < cnt; i++)
            if (get(b, t, i) != val(root, i)) bad++;
          CHECK(bad == 0, "%s broadcast %s count %zu root %d %s: %zu wrong", cn, dt_dtype_name(t), cnt, root,
                mode_name[mode], bad);
          free(b);
          if (n == 1) break;
        }
}

/* Ring exchange of a message far above any eager limit: rank r sends val(r, .) to r+1. */
static void check_p2p(dt_comm_t *c, const char *cn) {
  int n = c->size, me = c->rank, next = (me + 1) % n, prev = (me + n - 1) % n;
  size_t cnt = 1 << 18;
  float *s = malloc(cnt * 4), *d = malloc(cnt * 4);
  for (size_t i = 0; i < cnt; i++) s[i] = (float)val(me, i);
  for (int mode = 0; mode < M_COUNT; mode++) {
    for (size_t i = 0; i < cnt; i++) d[i] = -1;
    dt_status_t st = DT_OK, s2 = DT_OK;
    if (mode == M_BLOCK && n == 1) { /* a blocking send to oneself must be refused, not hang */
      dt_err_clear();
      CHECK(c->ops->send(c, s, cnt, DT_F32, 0, NULL, NULL) == DT_ERR_ARG && strstr(dt_err_msg(), "deadlock"),
            "%s blocking self-send accepted", cn);
      dt_err_clear();
      continue;
    }
    if (mode == M_BLOCK) { /* even ranks send first, odd ranks receive first */
      if (me % 2 == 0) {
        st = c->ops->send(c, s, cnt, DT_F32, next, NULL, NULL);
        s2 = c->ops->recv(c, d, cnt, DT_F32, prev, NULL, NULL);
      } else {
        st = c->ops->recv(c, d, cnt, DT_F32, prev, NULL, NULL);
        s2 = c->ops->send(c, s, cnt, DT_F32, next, NULL, NULL);
      }
    } else if (mode == M_GROUP) { /* everyone sends first: only safe because the group defers */
      c->ops->group_start(c);
      st = c->ops->send(c, s, cnt, DT_F32, next, NULL, NULL);
      s2 = c->ops->recv(c, d, cnt, DT_F32, prev, NULL, NULL);
      dt_status_t s3 = c->ops->group_end(c);
      if (st == DT_OK) st = s3;
    } else {
      dt_comm_req_t *rs = NULL, *rr = NULL;
      st = c->ops->recv(c, d, cnt, DT_F32, prev, NULL, &rr);
      s2 = c->ops->send(c, s, cnt, DT_F32, next, NULL, &rs);
      if (mode == M_WAIT) {
        if (st == DT_OK) st = c->ops->wait(c, rr);
        if (s2 == DT_OK) s2 = c->ops->wait(c, rs);
      } else {
        int d1 = 0, d2 = 0;
        while (st == DT_OK && s2 == DT_OK && !(d1 && d2)) {
          if (!d1) st = c->ops->test(c, rr, &d1);
          if (!d2) s2 = c->ops->test(c, rs, &d2);
        }
      }
    }
    CHECK(st == DT_OK && s2 == DT_OK, "%s p2p %s: %s", cn, mode_name[mode], dt_err_msg());
    size_t bad = 0;
    for (size_t i = 0; i < cnt; i++)
      if (d[i] != (float)val(prev, i)) bad++;
    CHECK(bad == 0, "%s p2p ring %s: %zu wrong", cn, mode_name[mode], bad);
  }
  /* Three messages to the same peer arrive in the order they were sent (single tag). */
  int32_t m[3] = {10 * me + 1, 10 * me + 2, 10 * me + 3}, got[3] = {0, 0, 0};
  dt_comm_req_t *rq[6];
  for (int j = 0; j < 3; j++) c->ops->recv(c, &got[j], 1, DT_I32, prev, NULL, &rq[j]);
  for (int j = 0; j < 3; j++) c->ops->send(c, &m[j], 1, DT_I32, next, NULL, &rq[3 + j]);
  for (int j = 0; j < 6; j++) c->ops->wait(c, rq[j]);
  CHECK(got[0] == 10 * prev + 1 && got[1] == 10 * prev + 2 && got[2] == 10 * prev + 3,
        "%s p2p order: got %d %d %d from %d", cn, got[0], got[1], got[2], prev);
  free(s);
  free(d);
}

static void check_errors(dt_comm_t *c) {
  int me = c->rank;
  float x[4] = {0};
  int32_t xi[4] = {0};
  dt_err_clear();
  CHECK(c->ops->allreduce(c, xi, xi, 4, DT_I32, DT_AVG, NULL, NULL) == DT_ERR_ARG &&
            strstr(dt_err_msg(), "DT_AVG needs a float type"),
        "avg on i32 accepted: '%s'", dt_err_msg());
  dt_err_clear();
  CHECK(c->ops->broadcast(c, x, 4, DT_F32, c->size, NULL, NULL) == DT_ERR_ARG && strstr(dt_err_msg(), "root"),
        "bad root accepted: '%s'", dt_err_msg());
  dt_err_clear();
  CHECK(c->ops->send(c, x, 4, DT_F32, -1, NULL, NULL) == DT_ERR_ARG && strstr(dt_err_msg(), "peer -1"),
        "bad peer accepted: '%s'", dt_err_msg());
  dt_err_clear();
  CHECK(c->ops->allreduce(c, x, x + 1, 2, DT_F32, DT_SUM, NULL, NULL) == DT_ERR_ARG, "overlap accepted");
  dt_err_clear();
  /* A real MPI failure: rank 1 receives 10 ints into a 5-int message -> MPI_ERR_TRUNCATE. */
  if (c->size >= 2 && me <= 1) {
    int32_t big[10] = {0};
    dt_status_t st = me == 0 ? c->ops->send(c, big, 10, DT_I32, 1, NULL, NULL)
                             : c->ops->recv(c, big, 5, DT_I32, 0, NULL, NULL);
    if (me == 0) {
      CHECK(st == DT_OK, "send for truncation: %s", dt_err_msg());
    } else {
      const char *msg = dt_err_msg();
      CHECK(st == DT_ERR_MPI, "truncated recv returned %d", (int)st);
      CHECK(strstr(msg, "comm_mpi.c:") && strstr(msg, "rank 1 (host ") && strstr(msg, "MPI_Recv failed: ") &&
                strstr(msg, "TRUNCATE"),
            "error message lacks file/rank/host/call/MPI string: '%s'", msg);
      if (world_rank == 1) printf("# recorded MPI error: %s\n", msg);
    }
    dt_err_clear();
  }
}

/* Blocking reductions above the watchdog's 4 MiB piece (comm_mpi.c WATCHED_PIECE): 3 and 2 pieces
 * with a partial last one, in place and not, to the root and to all. */
static void check_big(dt_comm_t *c, const char *cn) {
  int n = c->size, me = c->rank, root = 1 % n;
  size_t cnt = ((size_t)1 << 20) + 7; /* f64: 8 MiB + 56 B; f32: 4 MiB + 28 B */
  for (int ti = 0; ti < 2; ti++) {
    dt_dtype_t t = ti ? DT_F32 : DT_F64;
    dt_redop_t op = ti ? DT_AVG : DT_SUM;
    size_t es = dt_dtype_size(t);
    char *s = malloc(cnt * es), *d = malloc(cnt * es);
    for (int kind = 0; kind < 3; kind++) { /* allreduce, allreduce in place, reduce in place at the root */
      for (size_t i = 0; i < cnt; i++) set(s, t, i, val(me, i)), set(d, t, i, -1);
      dt_status_t st = kind < 2 ? c->ops->allreduce(c, s, kind ? s : d, cnt, t, op, NULL, NULL)
                                : c->ops->reduce(c, s, s, cnt, t, op, root, NULL, NULL);
      CHECK(st == DT_OK, "%s big reduction %d: %s", cn, kind, dt_err_msg());
      const char *res = kind == 0 ? d : s;
      size_t bad = 0;
      for (size_t i = 0; (kind < 2 || me == root) && i < cnt; i++)
        if (get(res, t, i) != expect_red(op, n, i)) bad++;
      CHECK(bad == 0, "%s big reduction %d (%s, %zu elements): %zu wrong", cn, kind, dt_dtype_name(t), cnt, bad);
    }
    free(s);
    free(d);
  }
}

static void check_comm(dt_comm_t *c, const char *cn) {
  check_big(c, cn);
  check_allreduce(c, cn);
  check_reduce_scatter(c, cn);
  check_reduce(c, cn);
  check_allgather(c, cn);
  check_broadcast(c, cn);
  check_p2p(c, cn);
}

/* Every check on the world and on a split of it. */
static void check_all(int wsize) {
  MPI_Comm w = MPI_COMM_WORLD;
  dt_comm_t *world = NULL, *half = NULL;
  CHECK(dt_comm_mpi_create(&w, &world) == DT_OK, "create: %s", dt_err_msg());
  CHECK(world->rank == world_rank && world->size == wsize, "world rank/size %d/%d", world->rank, world->size);
  check_comm(world, "world");

  /* Two groups by parity; key = -rank reverses the order within each group. */
  int color = world_rank % 2;
  CHECK(world->ops->split(world, color, -world_rank, &half) == DT_OK, "split: %s", dt_err_msg());
  int members = (wsize - color + 1) / 2;     /* ranks with this parity */
  int expect_rank = (wsize - 1 - world_rank) / 2; /* position from the top, same parity */
  CHECK(half->size == members && half->rank == expect_rank, "split rank/size %d/%d want %d/%d", half->rank,
        half->size, expect_rank, members);
  check_comm(half, color ? "odd-group" : "even-group");
  check_errors(world);
  MPI_Comm hc;
  CHECK(dt_comm_mpi_handle(half, &hc) == DT_OK, "handle");
  int hs = 0;
  MPI_Comm_size(hc, &hs);
  CHECK(hs == members, "handle size %d", hs);

  half->ops->free(half);
  world->ops->free(world);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int wsize;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  dt_err_set_rank(world_rank);
  check_all(wsize); /* blocking MPI calls (the hang watchdog off) */
  /* with the hang watchdog on, every blocking call is a nonblocking one completed under a deadline */
  CHECK(dt_wd_start(60, 60) == DT_OK && dt_wd_on(), "watchdog start: %s", dt_err_msg());
  check_all(wsize);
  dt_wd_stop();

  int tot_fail = 0, tot_checks = 0;
  MPI_Allreduce(&n_fail, &tot_fail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&n_checks, &tot_checks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank == 0)
    printf("# comm_mpi: %d ranks, %d checks over all ranks (watchdog off, then on), %d failed\n", wsize, tot_checks,
           tot_fail);
  MPI_Finalize();
  return tot_fail ? 1 : 0;
}
