/* Data-parallel gradient buckets (ddp.h) against a recording fake communicator that plays a
 * second rank: bucket tiling, every gradient averaged exactly once and only after backward has
 * reported it final, at most 2 all-reduces in flight (the memory plan counts 2 MPI temporaries),
 * and ZeRO-2's action path with a held range. The small test models fit one 25 MiB bucket, so
 * the multi-bucket paths are exercised only here. */
#include <criterion/criterion.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "ddp.h"
#include "timer.h"

/* The fake: an all-reduce completes when it is waited for (or tested, when `eager`); then its
 * range becomes the average (or sum) with the other rank's gradients. */
struct dt_comm_req {
  float *buf;
  size_t lo, hi;
  dt_redop_t op;
};

enum { N = 120, MAXREQ = 64 };
static float other[N];          /* the other rank's gradients */
static int times_reduced[N];    /* per element */
static size_t final_lo;         /* what backward has reported final: [final_lo, N) */
static int in_flight, max_in_flight, eager, early_starts, n_calls;
static size_t fail_lo = (size_t)-1; /* the wait of the all-reduce starting there fails */
static struct dt_comm_req reqs[MAXREQ];
static int flight_at[MAXREQ]; /* in_flight just after the k-th all-reduce started */
static long wait_ns;          /* each wait takes this long (the timing test) */

static void complete(struct dt_comm_req *r) {
  for (size_t i = r->lo; i < r->hi; i++) {
    float *g = r->buf + (i - r->lo);
    *g = r->op == DT_AVG ? (*g + other[i]) / 2 : r->op == DT_SUM ? *g + other[i] : -1e30f;
    times_reduced[i]++;
  }
  in_flight--;
}

static dt_status_t f_allreduce(dt_comm_t *c, const void *send, void *recv, size_t count, dt_dtype_t t, dt_redop_t op,
                               void *stream, dt_comm_req_t **req) {
  float *base = c->impl;
  cr_assert_eq(send, recv, "in place");
  cr_assert_eq(t, DT_F32);
  cr_assert_null(stream);
  cr_assert_not_null(req, "bucket all-reduces are nonblocking");
  cr_assert_lt(n_calls, MAXREQ);
  struct dt_comm_req *r = &reqs[n_calls++];
  *r = (struct dt_comm_req){.buf = recv, .lo = (size_t)((float *)recv - base), .op = op};
  r->hi = r->lo + count;
  if (r->lo < final_lo) early_starts++;
  in_flight++;
  if (in_flight > max_in_flight) max_in_flight = in_flight;
  flight_at[n_calls - 1] = in_flight;
  *req = r;
  return DT_OK;
}

static dt_status_t f_wait(dt_comm_t *c, dt_comm_req_t *req) {
  (void)c;
  if (wait_ns > 0) nanosleep(&(struct timespec){.tv_nsec = wait_ns}, NULL);
  complete(req);
  return req->lo == fail_lo ? DT_ERR(DT_ERR_MPI, "fake: the wait of [%zu, %zu) failed", req->lo, req->hi) : DT_OK;
}

static dt_status_t f_test(dt_comm_t *c, dt_comm_req_t *req, int *done) {
  (void)c;
  *done = eager;
  if (eager) complete(req);
  return DT_OK;
}

/* The probe's barrier (a deferred step): how many, and how many all-reduces had started before the first. */
static int n_barriers, calls_before_barrier = -1;
static dt_status_t f_barrier(dt_comm_t *c) {
  (void)c;
  if (n_barriers++ == 0) calls_before_barrier = n_calls;
  return DT_OK;
}

static const dt_comm_ops_t fake_ops = {
    .name = "fake", .allreduce = f_allreduce, .wait = f_wait, .test = f_test, .barrier = f_barrier};

/* Group starts (like a layout's layer_begin): 50 | 10 | 10 | 10 | 10 | 30 floats; buckets of 20. */
static const size_t groups[] = {0, 50, 60, 70, 80, 90, N};
enum { NG = 6, LIMIT = 20 };

/* By hand, from the top: 30-float group 5 gives the piece [100, 120) and leaves 10; with group
 * 4 that is 20, a bucket [80, 100); groups 3 and 2 make [60, 80); group 1's 10 waits; group 0
 * leaves [0, 60), cut into pieces [40, 60) and [20, 40) and the closing [0, 20). */
static const size_t want6[][2] = {{100, 120}, {80, 100}, {60, 80}, {40, 60}, {20, 40}, {0, 20}};

/* Backward's reports: every group final, from the last to the first. */
static void report_all(dt_ddp_t *d) {
  for (int k = NG - 1; k >= 0; k--) {
    final_lo = groups[k];
    dt_ddp_ready(d, groups[k], groups[k + 1]);
  }
}

static void expect_buckets(const dt_ddp_t *d, const size_t (*want)[2], int n, const char *what) {
  cr_assert_eq(d->n_buckets, n, "%s: %d buckets, want %d", what, d->n_buckets, n);
  for (int b = 0; b < n; b++)
    cr_assert(d->buckets[b].lo == want[b][0] && d->buckets[b].hi == want[b][1],
              "%s: bucket %d is [%zu, %zu), want [%zu, %zu)", what, b, d->buckets[b].lo, d->buckets[b].hi, want[b][0],
              want[b][1]);
}

static void reset(float *g) {
  for (int i = 0; i < N; i++) g[i] = (float)(i + 1), other[i] = (float)(1000 + 3 * i), times_reduced[i] = 0;
  final_lo = N;
  in_flight = max_in_flight = early_starts = n_calls = 0;
}

Test(ddp, buckets_tile_the_arena_from_the_end) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, LIMIT * sizeof(float)), DT_OK);
  cr_assert_gt(d.n_buckets, 1);
  size_t hi = N;
  for (int b = 0; b < d.n_buckets; b++) {
    const dt_bucket_t *k = &d.buckets[b];
    cr_assert_eq(k->hi, hi, "bucket %d starts where the one above it ends", b);
    cr_assert_gt(k->hi, k->lo, "bucket %d is not empty", b);
    cr_assert_leq(k->hi - k->lo, 2 * LIMIT, "bucket %d: about one bucket's size, not more", b);
    if (b < d.n_buckets - 1) cr_assert_geq(k->hi - k->lo, LIMIT, "bucket %d closed before it reached the limit", b);
    int whole = 0; /* each edge is a group start, or inside a group larger than the limit */
    for (int i = 0; i <= NG; i++) whole += groups[i] == k->lo;
    for (int i = 0; i < NG && !whole; i++) whole = groups[i] < k->lo && k->lo < groups[i + 1] &&
                                                   groups[i + 1] - groups[i] > LIMIT;
    cr_assert(whole, "bucket %d starts at %zu, inside a small group", b, k->lo);
    hi = k->lo;
  }
  cr_assert_eq(hi, 0, "the buckets reach the arena's start");
  expect_buckets(&d, want6, 6, "groups of 50|10|10|10|10|30, limit 20");
  dt_ddp_free(&d);
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, 4 * N * sizeof(float)), DT_OK);
  cr_assert_eq(d.n_buckets, 1, "a limit above the arena: one bucket");
  cr_assert(d.buckets[0].lo == 0 && d.buckets[0].hi == N);
  dt_ddp_free(&d);
  /* a later pipeline stage: no embeddings, so group 0 is empty; no empty bucket for it */
  const size_t stage[] = {0, 0, 40, 80, N};
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, stage, 4, LIMIT * sizeof(float)), DT_OK);
  for (int b = 0; b < d.n_buckets; b++)
    cr_assert_gt(d.buckets[b].hi, d.buckets[b].lo, "stage layout: bucket %d is empty", b);
  cr_assert_eq(d.buckets[d.n_buckets - 1].lo, 0);
  /* by hand: 40-float groups, each a piece of 20 at its top and a closing bucket of 20 below */
  expect_buckets(&d, want6, 6, "stage layout 0|40|40|40, limit 20");
  dt_ddp_free(&d);
}

/* The limit's edges: under 4 bytes is one float (not zero floats); no limit (SIZE_MAX bytes) is
 * one bucket; a single group not a multiple of the limit ends in a short bucket at the bottom. */
Test(ddp, bucket_limit_edges) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  for (size_t bytes = 0; bytes < sizeof(float); bytes++) {
    cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, bytes), DT_OK, "%zu bytes", bytes);
    cr_assert_eq(d.n_buckets, N, "%zu bytes: one bucket per float", bytes);
    for (int b = 0; b < N; b++)
      cr_assert(d.buckets[b].lo == (size_t)(N - 1 - b) && d.buckets[b].hi == (size_t)(N - b), "%zu bytes: bucket %d",
                bytes, b);
    dt_ddp_free(&d);
  }
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, SIZE_MAX), DT_OK, "no limit");
  expect_buckets(&d, (const size_t[][2]){{0, N}}, 1, "no limit");
  dt_ddp_free(&d);
  /* one group of 120 floats, limit 7: 17 pieces from the top ([113, 120) ... [1, 8)), then [0, 1) */
  const size_t one[] = {0, N};
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, one, 1, 7 * sizeof(float)), DT_OK);
  cr_assert_eq(d.n_buckets, 18);
  for (int b = 0; b < 17; b++)
    cr_assert(d.buckets[b].lo == (size_t)(N - 7 * (b + 1)) && d.buckets[b].hi == (size_t)(N - 7 * b), "bucket %d", b);
  cr_assert(d.buckets[17].lo == 0 && d.buckets[17].hi == 1);
  /* the array really holds them: one bucket too few is a heap overflow glibc does not notice */
  cr_assert_geq(malloc_usable_size(d.buckets), 18 * sizeof(dt_bucket_t));
  dt_ddp_free(&d);
}

/* init and free leave nothing allocated: over 1000 rounds glibc's count of bytes in use grows
 * by less than 64 KiB (a leak is 4 KiB a round: 127 buckets at limit 1; the harness moves the
 * count by a few KB). */
Test(ddp, free_releases_the_buckets) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  size_t before = mallinfo2().uordblks;
  for (int i = 0; i < 1000; i++) {
    cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, 1), DT_OK);
    dt_ddp_free(&d);
  }
  size_t after = mallinfo2().uordblks;
  cr_assert_lt(after, before + 65536, "bytes in use %zu -> %zu after 1000 rounds", before, after);
}

/* Backward reports the groups from the last to the first, twice (two optimizer steps); each
 * bucket's all-reduce starts once all of it is final, never earlier, and in the very report that
 * makes it final (want6: after groups 5..0, 1 2 2 3 3 6 have started); at most 2 in flight, a
 * new one waiting only for the oldest (so 1 2 2 2 2 2 in flight as they start); with `eager`,
 * the poke in each report completes them, so none is left for finish. */
static const int started_after[NG] = {1, 2, 2, 3, 3, 6};
static const int flight_when_started[6] = {1, 2, 2, 2, 2, 2};

static void one_run(int test_completes) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, LIMIT * sizeof(float)), DT_OK);
  eager = test_completes;
  for (int step = 0; step < 2; step++) {
    reset(g);
    dt_ddp_begin(&d);
    cr_assert_eq(d.t_comm_wait, 0, "step %d: begin resets the step's wait time", step);
    int started_before = 0;
    for (int k = NG - 1; k >= 0; k--) {
      final_lo = groups[k];
      dt_ddp_ready(&d, groups[k], groups[k + 1]);
      if (k == 2) started_before = n_calls;
      cr_assert_eq(n_calls, started_after[NG - 1 - k], "step %d: %d started after group %d is final", step, n_calls, k);
      if (eager) cr_assert_eq(in_flight, 0, "step %d: group %d: the poke did not complete them", step, k);
    }
    if (!eager)
      for (int k = 0; k < n_calls; k++)
        cr_assert_eq(flight_at[k], flight_when_started[k], "step %d: %d in flight when all-reduce %d started", step,
                     flight_at[k], k);
    cr_assert_eq(dt_ddp_finish(&d), DT_OK);
    for (int b = 0; b < d.n_buckets; b++)
      cr_assert_null(d.buckets[b].req, "step %d: bucket %d still holds a request", step, b);
    cr_assert_geq(d.t_comm_wait, 0, "step %d: wait time %g", step, d.t_comm_wait);
    cr_assert_eq(early_starts, 0, "an all-reduce started before its gradients were final");
    cr_assert_gt(started_before, 1, "step %d: buckets started during backward (overlap): %d", step, started_before);
    cr_assert_eq(n_calls, d.n_buckets, "step %d: one all-reduce per bucket", step);
    cr_assert_eq(in_flight, 0, "step %d: every all-reduce completed by finish", step);
    cr_assert_leq(max_in_flight, 2, "step %d: %d all-reduces in flight", step, max_in_flight);
    if (!eager) cr_assert_eq(max_in_flight, 2, "step %d: the in-flight limit was reached", step);
    for (int i = 0; i < N; i++) {
      cr_assert_eq(times_reduced[i], 1, "step %d: element %d reduced %d times", step, i, times_reduced[i]);
      cr_assert_float_eq(g[i], (i + 1 + 1000 + 3 * i) / 2.0f, 0, "step %d: element %d is %g, not the average", step, i,
                         g[i]);
    }
  }
  dt_ddp_free(&d);
}

Test(ddp, every_gradient_averaged_once_after_it_is_final) { one_run(0); }
Test(ddp, requests_completed_by_test_are_not_waited_again) { one_run(1); }

/* ZeRO-2's action instead of the all-reduce: called on every bucket's parts outside the held
 * range [hold_lo, hold_hi), once, when final; one call for a whole bucket, never an empty one
 * (each is a blocking reduce to the owners); after a failed call, none. */
enum { MAXACT = 16 };
static int acted[N];
static size_t calls[MAXACT][2]; /* the action's ranges in call order */
static int n_acts;
static size_t fail_act_lo = (size_t)-1; /* the action on a range starting there fails */

static dt_status_t action(void *ctx, float *grads, size_t lo, size_t hi) {
  cr_assert_eq(grads, ctx);
  cr_assert_geq(lo, final_lo, "action on [%zu, %zu) before it was final", lo, hi);
  cr_assert_lt(n_acts, MAXACT);
  calls[n_acts][0] = lo, calls[n_acts++][1] = hi;
  for (size_t i = lo; i < hi; i++) acted[i]++;
  return lo == fail_act_lo ? DT_ERR(DT_ERR_MPI, "fake: the action on [%zu, %zu) failed", lo, hi) : DT_OK;
}

/* One step with the action and hold [hold_lo, hold_hi); the action's ranges must be want[0..n). */
static dt_status_t act_step(size_t hold_lo, size_t hold_hi, const size_t (*want)[2], int n) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, LIMIT * sizeof(float)), DT_OK);
  d.action = action;
  d.action_ctx = g;
  d.hold_lo = hold_lo;
  d.hold_hi = hold_hi;
  reset(g);
  memset(acted, 0, sizeof acted);
  n_acts = 0;
  dt_ddp_begin(&d);
  report_all(&d);
  dt_status_t st = dt_ddp_finish(&d);
  cr_assert_eq(n_calls, 0, "no all-reduce with an action");
  cr_assert_eq(n_acts, n, "hold [%zu, %zu): %d action calls, want %d", hold_lo, hold_hi, n_acts, n);
  for (int i = 0; i < n; i++)
    cr_assert(calls[i][0] == want[i][0] && calls[i][1] == want[i][1],
              "hold [%zu, %zu): call %d on [%zu, %zu), want [%zu, %zu)", hold_lo, hold_hi, i, calls[i][0], calls[i][1],
              want[i][0], want[i][1]);
  dt_ddp_free(&d);
  return st;
}

/* The calls by hand, buckets in want6's (start) order, each clipped by the hold. */
Test(ddp, action_skips_the_held_range) {
  static const struct {
    size_t lo, hi;
    int n;
    size_t want[8][2];
  } cases[] = {
      {0, 0, 6, {{100, 120}, {80, 100}, {60, 80}, {40, 60}, {20, 40}, {0, 20}}},      /* empty: none held */
      {70, 70, 6, {{100, 120}, {80, 100}, {60, 80}, {40, 60}, {20, 40}, {0, 20}}},    /* empty inside a bucket */
      {0, 50, 4, {{100, 120}, {80, 100}, {60, 80}, {50, 60}}},                        /* [40, 60) loses its bottom */
      {45, 85, 5, {{100, 120}, {85, 100}, {40, 45}, {20, 40}, {0, 20}}},              /* [60, 80) wholly held */
      {100, 120, 5, {{80, 100}, {60, 80}, {40, 60}, {20, 40}, {0, 20}}},              /* touches [80, 100) only */
      {65, 75, 7, {{100, 120}, {80, 100}, {60, 65}, {75, 80}, {40, 60}, {20, 40}, {0, 20}}}, /* a hole in [60, 80) */
  };
  for (size_t h = 0; h < sizeof cases / sizeof cases[0]; h++) {
    cr_assert_eq(act_step(cases[h].lo, cases[h].hi, cases[h].want, cases[h].n), DT_OK);
    for (size_t i = 0; i < N; i++) {
      int held = i >= cases[h].lo && i < cases[h].hi;
      cr_assert_eq(acted[i], !held, "hold [%zu, %zu): element %zu acted on %d times", cases[h].lo, cases[h].hi, i,
                   acted[i]);
    }
  }
}

/* A failed action is the step's result, and nothing is acted on after it: not the bucket's part
 * above the hold, not the buckets below. */
Test(ddp, a_failed_action_stops_the_step) {
  fail_act_lo = 60;
  const size_t want[][2] = {{100, 120}, {80, 100}, {60, 65}};
  cr_assert_eq(act_step(65, 75, want, 3), DT_ERR_MPI);
  fail_act_lo = (size_t)-1;
}

/* A failed wait in finish (the last bucket's, [0, 20)) is the step's error, and the other
 * requests are still completed (none left in flight). */
Test(ddp, a_failed_wait_is_the_result) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, LIMIT * sizeof(float)), DT_OK);
  eager = 0;
  reset(g);
  fail_lo = 0;
  dt_ddp_begin(&d);
  report_all(&d);
  cr_assert_eq(dt_ddp_finish(&d), DT_ERR_MPI, "finish reports the failed wait");
  cr_assert_eq(in_flight, 0, "every request completed");
  fail_lo = (size_t)-1;
  /* the next step starts clean: begin forgets the failure */
  reset(g);
  dt_ddp_begin(&d);
  report_all(&d);
  cr_assert_eq(dt_ddp_finish(&d), DT_OK, "the step after a failed one");
  for (int i = 0; i < N; i++)
    cr_assert_eq(times_reduced[i], 1, "after a failure: element %d reduced %d times", i, times_reduced[i]);
  dt_ddp_free(&d);
}

/* t_comm_wait is the step's time spent in waits, no more, no less: with every wait taking 2 ms,
 * the 6 waits of a step (4 in the ready hook to keep 2 in flight, 2 in finish) are at least
 * 12 ms, and the step itself is longer than its waits; each step counts from zero. */
Test(ddp, wait_time_counts_every_wait) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, LIMIT * sizeof(float)), DT_OK);
  eager = 0;
  wait_ns = 2000000;
  for (int step = 0; step < 2; step++) {
    reset(g);
    double t0 = dt_time_now();
    dt_ddp_begin(&d);
    report_all(&d);
    cr_assert_eq(dt_ddp_finish(&d), DT_OK);
    double wall = dt_time_now() - t0;
    cr_assert_geq(d.t_comm_wait, 6 * 2e-3, "step %d: %g s waiting, 6 waits of 2 ms", step, d.t_comm_wait);
    cr_assert_leq(d.t_comm_wait, wall, "step %d: %g s waiting in a step of %g s", step, d.t_comm_wait, wall);
  }
  wait_ns = 0;
  dt_ddp_free(&d);
}

/* The usual small model: one bucket for the whole arena, started by the last report and
 * completed only by finish. */
Test(ddp, one_bucket_is_completed_by_finish) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, 25 << 20), DT_OK);
  cr_assert_eq(d.n_buckets, 1);
  eager = 0;
  reset(g);
  dt_ddp_begin(&d);
  report_all(&d);
  cr_assert_eq(n_calls, 1, "started by the report of group 0");
  cr_assert_eq(dt_ddp_finish(&d), DT_OK);
  cr_assert_eq(in_flight, 0, "finish completed it");
  for (int i = 0; i < N; i++) cr_assert_float_eq(g[i], (i + 1 + 1000 + 3 * i) / 2.0f, 0, "element %d is %g", i, g[i]);
  dt_ddp_free(&d);
}

/* Backward that reports nothing (a hook not passed): finish starts and completes every bucket;
 * and a second free is harmless. */
Test(ddp, finish_alone_reduces_everything) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, LIMIT * sizeof(float)), DT_OK);
  eager = 0;
  reset(g);
  final_lo = 0;
  dt_ddp_begin(&d);
  n_barriers = 0;
  cr_assert_eq(dt_ddp_finish(&d), DT_OK);
  cr_assert_eq(n_calls, d.n_buckets);
  cr_assert_eq(n_barriers, 0, "only the probe's deferred finish waits at a barrier");
  for (int i = 0; i < N; i++) cr_assert_eq(times_reduced[i], 1, "element %d reduced %d times", i, times_reduced[i]);
  dt_ddp_free(&d);
  cr_assert_null(d.buckets);
  dt_ddp_free(&d);
}

/* The overlap probe's step (sync.c): with defer the reports start nothing and poke nothing, and
 * finish then averages every bucket once, exactly as an overlapped step does. */
Test(ddp, a_deferred_step_starts_everything_in_finish) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  dt_ddp_t d;
  cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, LIMIT * sizeof(float)), DT_OK);
  eager = 0;
  reset(g);
  dt_ddp_begin(&d);
  d.defer = 1;
  for (int k = NG - 1; k >= 0; k--) {
    final_lo = groups[k];
    dt_ddp_ready(&d, groups[k], groups[k + 1]);
    cr_assert_eq(n_calls, 0, "group %d final: %d all-reduces started in a deferred step", k, n_calls);
  }
  cr_assert_eq(d.ready_lo, 0, "the reports were not recorded");
  n_barriers = 0;
  cr_assert_eq(dt_ddp_finish(&d), DT_OK);
  cr_assert_eq(n_calls, d.n_buckets);
  cr_assert(n_barriers == 1 && calls_before_barrier == 0,
            "a deferred finish: %d barriers, the first after %d all-reduces (want 1, before any)", n_barriers,
            calls_before_barrier);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(times_reduced[i], 1, "element %d reduced %d times", i, times_reduced[i]);
    cr_assert_float_eq(g[i], (i + 1 + 1000 + 3 * i) / 2.0f, 0, "element %d is %g, not the average", i, g[i]);
  }
  dt_ddp_free(&d);
}
