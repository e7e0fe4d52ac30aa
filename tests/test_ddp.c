/* Data-parallel gradient buckets (ddp.h) against a recording fake communicator that plays a
 * second rank: bucket tiling, every gradient averaged exactly once and only after backward has
 * reported it final, at most 2 all-reduces in flight (the memory plan counts 2 MPI temporaries),
 * and ZeRO-2's action path with a held range. The small test models fit one 25 MiB bucket, so
 * the multi-bucket paths are exercised only here. */
#include <criterion/criterion.h>
#include <string.h>

#include "ddp.h"

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
  *req = r;
  return DT_OK;
}

static dt_status_t f_wait(dt_comm_t *c, dt_comm_req_t *req) {
  (void)c;
  complete(req);
  return req->lo == fail_lo ? DT_ERR(DT_ERR_MPI, "fake: the wait of [%zu, %zu) failed", req->lo, req->hi) : DT_OK;
}

static dt_status_t f_test(dt_comm_t *c, dt_comm_req_t *req, int *done) {
  (void)c;
  *done = eager;
  if (eager) complete(req);
  return DT_OK;
}

static const dt_comm_ops_t fake_ops = {.name = "fake", .allreduce = f_allreduce, .wait = f_wait, .test = f_test};

/* Group starts (like a layout's layer_begin): 50 | 10 | 10 | 10 | 10 | 30 floats; buckets of 20. */
static const size_t groups[] = {0, 50, 60, 70, 80, 90, N};
enum { NG = 6, LIMIT = 20 };

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
  dt_ddp_free(&d);
}

/* Backward reports the groups from the last to the first, twice (two optimizer steps); each
 * bucket's all-reduce starts once all of it is final, never earlier, at most 2 in flight. */
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
    }
    cr_assert_eq(dt_ddp_finish(&d), DT_OK);
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
 * range [hold_lo, hold_hi), once, when final. */
static int acted[N];
static dt_status_t action(void *ctx, float *grads, size_t lo, size_t hi) {
  cr_assert_eq(grads, ctx);
  cr_assert_geq(lo, final_lo, "action on [%zu, %zu) before it was final", lo, hi);
  for (size_t i = lo; i < hi; i++) acted[i]++;
  return DT_OK;
}

Test(ddp, action_skips_the_held_range) {
  float g[N];
  dt_comm_t c = {.ops = &fake_ops, .size = 2, .impl = g};
  const size_t holds[][2] = {{0, 0}, {0, 50}, {45, 85}, {100, 120}, {65, 75}};
  for (size_t h = 0; h < sizeof holds / sizeof holds[0]; h++) {
    dt_ddp_t d;
    cr_assert_eq(dt_ddp_init(&d, &c, g, N, groups, NG, LIMIT * sizeof(float)), DT_OK);
    d.action = action;
    d.action_ctx = g;
    d.hold_lo = holds[h][0];
    d.hold_hi = holds[h][1];
    reset(g);
    memset(acted, 0, sizeof acted);
    dt_ddp_begin(&d);
    for (int k = NG - 1; k >= 0; k--) {
      final_lo = groups[k];
      dt_ddp_ready(&d, groups[k], groups[k + 1]);
    }
    cr_assert_eq(dt_ddp_finish(&d), DT_OK);
    cr_assert_eq(n_calls, 0, "no all-reduce with an action");
    for (size_t i = 0; i < N; i++) {
      int held = i >= holds[h][0] && i < holds[h][1];
      cr_assert_eq(acted[i], !held, "hold [%zu, %zu): element %zu acted on %d times", holds[h][0], holds[h][1], i,
                   acted[i]);
    }
    dt_ddp_free(&d);
  }
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
  for (int k = NG - 1; k >= 0; k--) {
    final_lo = groups[k];
    dt_ddp_ready(&d, groups[k], groups[k + 1]);
  }
  cr_assert_eq(dt_ddp_finish(&d), DT_ERR_MPI, "finish reports the failed wait");
  cr_assert_eq(in_flight, 0, "every request completed");
  fail_lo = (size_t)-1;
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
  cr_assert_eq(dt_ddp_finish(&d), DT_OK);
  cr_assert_eq(n_calls, d.n_buckets);
  for (int i = 0; i < N; i++) cr_assert_eq(times_reduced[i], 1, "element %d reduced %d times", i, times_reduced[i]);
  dt_ddp_free(&d);
  cr_assert_null(d.buckets);
  dt_ddp_free(&d);
}
