/* Pipeline parallelism, the parts that need no MPI: the 1F1B schedule (pipeline.h), its simulation
 * against the stage dependencies, and the stage layout (model.h: dt_layout_init_mp, dt_pp_split). */
#include <criterion/criterion.h>
#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "pipeline.h"

/* Every stage runs each micro-batch's forward and backward once, forward first, micro-batches in
 * order, never holding more than min(pp - s, m) forwards without their backward, and in the
 * 1F1B shape: pp - 1 - s warm-up forwards, then alternating, then the remaining backwards. */
Test(pipeline, schedule_is_1f1b) {
  for (int pp = 1; pp <= 8; pp++)
    for (int m = 1; m <= 12; m++)
      for (int s = 0; s < pp; s++) {
        dt_pp_op_t ops[24];
        cr_assert_eq(dt_pp_schedule(s, pp, m, ops), 2 * m);
        int nf = 0, nb = 0, live = 0, peak = 0;
        for (int i = 0; i < 2 * m; i++) {
          if (ops[i].fwd) {
            cr_assert_eq(ops[i].mb, nf++, "pp=%d m=%d s=%d: forwards in order", pp, m, s);
            peak = ++live > peak ? live : peak;
          } else {
            cr_assert_eq(ops[i].mb, nb++, "pp=%d m=%d s=%d: backwards in order", pp, m, s);
            cr_assert(nb <= nf, "backward of micro-batch %d before its forward", ops[i].mb);
            live--;
          }
        }
        cr_assert_eq(nf, m);
        cr_assert_eq(nb, m);
        cr_assert_eq(peak, dt_pp_inflight(s, pp, m), "pp=%d m=%d s=%d: %d in flight", pp, m, s, peak);
        int w = pp - 1 - s < m ? pp - 1 - s : m;
        for (int i = 0; i < w; i++) cr_assert(ops[i].fwd, "warm-up is forwards");
        for (int i = w; i < w + 2 * (m - w); i++) cr_assert_eq(ops[i].fwd, (i - w) % 2 == 0, "steady state alternates");
        for (int i = w + 2 * (m - w); i < 2 * m; i++) cr_assert(!ops[i].fwd, "cool-down is backwards");
      }
  dt_pp_op_t ops[4];
  cr_assert_eq(dt_pp_schedule(2, 2, 2, ops), 0, "a stage outside the pipeline");
  cr_assert_eq(dt_pp_schedule(-1, 2, 2, ops), 0, "a negative stage");
  cr_assert_eq(dt_pp_schedule(0, 0, 2, ops), 0, "no stages");
  cr_assert_eq(dt_pp_schedule(0, 2, 0, ops), 0, "no micro-batches");
}

/* With equal stage times the schedules run without deadlock in the transfer protocol's
 * rendezvous model and take (m + pp - 1)(tf + tb): the bubble is (pp - 1)/(m + pp - 1). */
Test(pipeline, equal_stages_give_the_textbook_bubble) {
  for (int pp = 1; pp <= 8; pp++)
    for (int m = 1; m <= 16; m++) {
      double tf[8], tb[8], busy[8];
      for (int s = 0; s < pp; s++) tf[s] = 1e-3, tb[s] = 2e-3; /* seconds, as the planner gives them */
      cr_assert_float_eq(dt_pp_simulate(pp, m, tf, tb, NULL), (m + pp - 1) * 3e-3, 1e-12, "pp=%d m=%d", pp, m);
      for (int s = 0; s < pp; s++) tf[s] = 1.0, tb[s] = 2.0;
      double T = dt_pp_simulate(pp, m, tf, tb, busy);
      cr_assert(T > 0, "pp=%d m=%d: deadlock", pp, m);
      cr_assert_float_eq(T, (m + pp - 1) * 3.0, 1e-9, "pp=%d m=%d: makespan %g", pp, m, T);
      for (int s = 0; s < pp; s++) {
        cr_assert_float_eq(busy[s], 3.0 * m, 1e-9);
        cr_assert_float_eq(1.0 - busy[s] / T, dt_pp_bubble(pp, m), 1e-12, "pp=%d m=%d", pp, m);
      }
    }
  cr_assert_float_eq(dt_pp_bubble(2, 8), 1.0 / 9, 1e-15);
  cr_assert_float_eq(dt_pp_bubble(1, 5), 0.0, 1e-15);
}

/* Unequal stages: the slowest stage sets the pace, never less than its own work plus the fill and
 * drain of the others; hand-derived for pp = 2, m = 3, tf = (1, 2), tb = (2, 4): stage 1 can start
 * at 1 and then runs its 3 x (2 + 4) back to back; stage 0's last backward waits for stage 1's. */
Test(pipeline, unequal_stages) {
  double tf[2] = {1, 2}, tb[2] = {2, 4}, busy[2];
  double T = dt_pp_simulate(2, 3, tf, tb, busy);
  cr_assert_float_eq(T, 1 + 18 + 2, 1e-9, "makespan %g", T);
  cr_assert_float_eq(busy[0], 9, 1e-9);
  cr_assert_float_eq(busy[1], 18, 1e-9);
}

/* Stage split: each stage >= 1 block, contiguous, and no better split exists (brute force over
 * all compositions of L into pp parts). */
static double worst(const int *b, int pp, double emb, double blk, double head) {
  double w = 0;
  for (int s = 0; s < pp; s++) w = fmax(w, b[s] * blk + (s == 0 ? emb : 0) + (s == pp - 1 ? head : 0));
  return w;
}

static double brute(int L, int pp, int s, int *b, double emb, double blk, double head) {
  if (s == pp - 1) {
    b[s] = L;
    return L >= 1 ? worst(b, pp, emb, blk, head) : INFINITY;
  }
  double best = INFINITY;
  for (int k = 1; k <= L - (pp - 1 - s); k++) {
    b[s] = k;
    best = fmin(best, brute(L - k, pp, s + 1, b, emb, blk, head));
  }
  return best;
}

Test(pipeline, stage_split_is_optimal) {
  const double embs[] = {0, 0.3, 2.5, 5.4}, heads[] = {0, 0.01, 5.4};
  for (int L = 1; L <= 9; L++)
    for (int pp = 1; pp <= L && pp <= 5; pp++)
      for (int e = 0; e < 4; e++)
        for (int h = 0; h < 3; h++) {
          int b[8], tmp[8], sum = 0;
          memset(b, 0xff, sizeof b); /* -1: every entry must be written */
          dt_pp_split(L, pp, embs[e], 1.0, heads[h], b);
          for (int s = 0; s < pp; s++) {
            cr_assert(b[s] >= 1, "L=%d pp=%d: stage %d empty", L, pp, s);
            sum += b[s];
          }
          cr_assert_eq(sum, L);
          double want = brute(L, pp, 0, tmp, embs[e], 1.0, heads[h]);
          cr_assert_float_eq(worst(b, pp, embs[e], 1.0, heads[h]), want, 1e-9, "L=%d pp=%d emb=%g head=%g", L, pp,
                             embs[e], heads[h]);
        }
}

/* Among the parameter-optimal splits the most even one: GPT-2 124M's embeddings weigh 5.5 blocks
 * and its head 5.4, so 4 stages take 1, 5, 5, 1 blocks (1, 6, 4, 1 has the same largest stage by
 * parameters but 6 blocks of compute on one stage). */
Test(pipeline, stage_split_evens_out_the_blocks) {
  int b[4];
  dt_pp_split(12, 4, 5.5, 1.0, 5.4, b);
  cr_assert(b[0] == 1 && b[1] == 5 && b[2] == 5 && b[3] == 1, "%d %d %d %d", b[0], b[1], b[2], b[3]);
  dt_pp_split(12, 2, 5.5, 1.0, 5.4, b);
  cr_assert(b[0] == 6 && b[1] == 6, "%d %d", b[0], b[1]);
  dt_pp_split(4, 4, 0.1, 1.0, 0.1, b);
  cr_assert(b[0] == 1 && b[1] == 1 && b[2] == 1 && b[3] == 1);
}

/* parallel.pp_balance = compute: GPT-2 124M at T = 128 weighs a block 72 C^2 + 12 T C = 43.6M FLOPs
 * per token and the lm_head 6 C Vp = 231.8M (5.3 blocks), the embedding lookup nothing: 2 stages
 * take 9 and 3 blocks (9 vs 8.3 block-equivalents; by parameters it is 6 and 6). */
Test(pipeline, compute_balance) {
  dt_dims_t d = {.L = 12, .NH = 12, .C = 768, .V = 50257, .Vp = 50304, .T = 128};
  double e, b, h;
  cr_assert_eq(dt_pp_weights(d, 1, DT_PP_BALANCE_COMPUTE, &e, &b, &h), DT_OK);
  cr_assert_float_eq(b, 72.0 * 768 * 768 + 12.0 * 128 * 768, 1);
  cr_assert_float_eq(h, 6.0 * 768 * 50304, 1);
  cr_assert_float_eq(e, 0, 0);
  int bl[2];
  dt_pp_split(12, 2, e, b, h, bl);
  cr_assert(bl[0] == 9 && bl[1] == 3, "%d %d", bl[0], bl[1]);
  cr_assert_eq(dt_pp_weights(d, 1, DT_PP_BALANCE_PARAMS, &e, &b, &h), DT_OK);
  /* by parameters: wte + wpe, a block's 12 C^2 + 13 C, ln_f + the lm_head's wte (C = 768: no padding) */
  cr_assert_float_eq(e, (50304.0 + 128) * 768, 0.5);
  cr_assert_float_eq(b, 12.0 * 768 * 768 + 13.0 * 768, 0.5);
  cr_assert_float_eq(h, 2.0 * 768 + 50304.0 * 768, 0.5);
  dt_pp_split(12, 2, e, b, h, bl);
  cr_assert(bl[0] == 6 && bl[1] == 6, "%d %d", bl[0], bl[1]);
  dt_layout_t lay;
  cr_assert_eq(dt_layout_init_mp(&lay, d, 1, 0, 2, 1, DT_PP_BALANCE_COMPUTE), DT_OK);
  cr_assert(lay.l0 == 9 && lay.l1 == 12, "stage 1 holds blocks [%d, %d)", lay.l0, lay.l1);
  dt_layout_free(&lay);
  /* a mesh the layout cannot have */
  cr_assert_eq(dt_layout_init_mp(&lay, d, 0, 0, 1, 0, DT_PP_BALANCE_PARAMS), DT_ERR_CONFIG, "tp = 0");
  cr_assert_eq(dt_layout_init_mp(&lay, d, 2, 2, 1, 0, DT_PP_BALANCE_PARAMS), DT_ERR_CONFIG, "tp rank 2 of 2");
}

/* A stage's layout: the global tensor table with other stages' tensors absent (no arena space),
 * wte on the first and (a tied copy) on the last stage, and the init values of the whole model. */
Test(pipeline, stage_layouts_partition_the_model) {
  dt_dims_t d = {.L = 5, .NH = 4, .C = 32, .V = 100, .Vp = 128, .T = 16};
  for (int tp = 1; tp <= 2; tp++) {
    dt_layout_t full;
    cr_assert_eq(dt_layout_init_tp(&full, d, tp, 0), DT_OK);
    float *pf = malloc(sizeof(float) * full.n_params);
    dt_model_init_params(&full, pf, 42);
    for (int pp = 1; pp <= 5; pp++) {
      int owner[64], next = 0, wte_copies = 0;
      memset(owner, 0, sizeof owner);
      for (int s = 0; s < pp; s++) {
        dt_layout_t lay;
        cr_assert_eq(dt_layout_init_mp(&lay, d, tp, 0, pp, s, DT_PP_BALANCE_PARAMS), DT_OK, "%s", dt_err_msg());
        cr_assert_eq(lay.n_tensors, full.n_tensors);
        cr_assert_eq(lay.l0, next, "tp=%d pp=%d stage %d: blocks are contiguous", tp, pp, s);
        cr_assert(lay.l1 > lay.l0);
        next = lay.l1;
        float *ps = malloc(sizeof(float) * (lay.n_params ? lay.n_params : 1));
        dt_model_init_params(&lay, ps, 42);
        size_t used = 0;
        for (int i = 0; i < lay.n_tensors; i++) {
          const dt_tensor_t *t = &lay.tensors[i], *f = &full.tensors[i];
          cr_assert_str_eq(t->name, f->name);
          cr_assert_eq(t->grows, f->grows);
          cr_assert_eq(t->gcols, f->gcols);
          int want = t->layer < 0 ? (i == 0 ? s == 0 || s == pp - 1 : s == 0)
                     : t->layer == d.L ? s == pp - 1 : t->layer >= lay.l0 && t->layer < lay.l1;
          cr_assert_eq(!t->absent, want, "tp=%d pp=%d stage %d: %s", tp, pp, s, t->name);
          cr_assert_eq(t->tied_copy, i == 0 && s == pp - 1 && s > 0, "%s", t->name);
          if (t->absent) {
            cr_assert_eq(t->rows * t->cols, 0);
            continue;
          }
          if (!t->tied_copy) owner[i]++;
          else wte_copies++;
          size_t n = (size_t)t->rows * t->cols;
          used += n;
          cr_assert_eq(memcmp(ps + t->offset, pf + f->offset, n * sizeof(float)), 0, "%s: init differs", t->name);
        }
        cr_assert(lay.n_params >= used && lay.n_params < used + (size_t)DT_ALIGN * lay.n_tensors);
        for (int g = 0; g <= d.L + 1; g++) { /* groups: absent ones are empty */
          int present = g == 0 ? s == 0 || s == pp - 1 : g == d.L + 1 ? s == pp - 1 : g - 1 >= lay.l0 && g - 1 < lay.l1;
          cr_assert_eq(lay.layer_begin[g + 1] > lay.layer_begin[g], present, "pp=%d stage %d group %d", pp, s, g);
        }
        free(ps);
        dt_layout_free(&lay);
      }
      cr_assert_eq(next, d.L, "the stages cover every block");
      for (int i = 0; i < full.n_tensors; i++) cr_assert_eq(owner[i], 1, "pp=%d: tensor %d on one stage", pp, i);
      cr_assert_eq(wte_copies, pp > 1, "one tied copy of wte");
    }
    free(pf);
    dt_layout_free(&full);
  }
  dt_layout_t lay;
  cr_assert_eq(dt_layout_init_mp(&lay, d, 1, 0, 6, 0, DT_PP_BALANCE_PARAMS), DT_ERR_CONFIG, "more stages than blocks");
  cr_assert(strstr(dt_err_msg(), "parallel.pp"), "%s", dt_err_msg());
  const int bad[][2] = {{0, 0}, {2, -1}, {2, 2}, {3, 5}}; /* (pp, stage) */
  for (int i = 0; i < 4; i++)
    cr_assert_eq(dt_layout_init_mp(&lay, d, 1, 0, bad[i][0], bad[i][1], DT_PP_BALANCE_PARAMS), DT_ERR_CONFIG,
                 "pp %d stage %d", bad[i][0], bad[i][1]);
}

/* The stage transfers (dt_pipe_*) against a fake communicator that logs each call: a deferred
 * send goes out at the next flush, alone, or paired with the next receive inside one group
 * (send first), and a second send completes the first before it is deferred itself. */
static char plog[256];
static int plen;
static void note(const char *s) { plen += snprintf(plog + plen, sizeof plog - (size_t)plen, "%s ", s); }
static dt_status_t p_send(dt_comm_t *c, const void *buf, size_t n, dt_dtype_t t, int peer, void *st, dt_comm_req_t **r) {
  (void)c, (void)t, (void)st;
  cr_assert_null(r, "blocking");
  char s[32];
  snprintf(s, sizeof s, "send%d:%zu@%d", (int)((const float *)buf)[0], n, peer);
  note(s);
  return DT_OK;
}
static dt_status_t p_recv(dt_comm_t *c, void *buf, size_t n, dt_dtype_t t, int peer, void *st, dt_comm_req_t **r) {
  (void)c, (void)t, (void)st, (void)buf;
  cr_assert_null(r, "blocking");
  char s[32];
  snprintf(s, sizeof s, "recv:%zu@%d", n, peer);
  note(s);
  return DT_OK;
}
static dt_status_t p_start(dt_comm_t *c) {
  (void)c;
  note("(");
  return DT_OK;
}
static dt_status_t p_end(dt_comm_t *c) {
  (void)c;
  note(")");
  return DT_OK;
}

Test(pipeline, transfers_defer_and_pair_sends) {
  const dt_comm_ops_t ops = {.name = "log", .send = p_send, .recv = p_recv, .group_start = p_start, .group_end = p_end};
  dt_comm_t c = {.ops = &ops, .size = 3, .rank = 1};
  dt_pipe_t p = {.comm = &c};
  float a[4] = {1}, b[4] = {2}, in[4];
  plen = 0, plog[0] = 0;
  cr_assert_eq(dt_pipe_flush(&p), DT_OK);
  cr_assert_eq(dt_pipe_recv(&p, in, 4, 0), DT_OK);    /* nothing deferred: a plain receive */
  cr_assert_eq(dt_pipe_send(&p, a, 4, 2), DT_OK);     /* deferred */
  cr_assert_str_eq(plog, "recv:4@0 ", "flush with nothing deferred sends nothing; the send is deferred");
  cr_assert_eq(dt_pipe_send(&p, b, 3, 0), DT_OK);     /* completes a's send first */
  cr_assert_eq(dt_pipe_recv(&p, in, 2, 2), DT_OK);    /* b's send paired with this receive */
  cr_assert_eq(dt_pipe_flush(&p), DT_OK);             /* nothing left */
  cr_assert_eq(dt_pipe_send(&p, a, 1, 2), DT_OK);
  cr_assert_eq(dt_pipe_flush(&p), DT_OK);             /* alone */
  cr_assert_eq(dt_pipe_flush(&p), DT_OK);
  cr_assert_str_eq(plog, "recv:4@0 send1:4@2 ( send2:3@0 recv:2@2 ) send1:1@2 ", "%s", plog);
  cr_assert_null(p.send_buf, "nothing deferred at the end");
}

/* A paired send + receive whose group fails at its end (a peer gone): the receive returns that
 * failure and drops the deferred send, it does not report success on a buffer never filled. */
static dt_status_t p_end_fails(dt_comm_t *c) {
  (void)c;
  note(")");
  return DT_ERR(DT_ERR_MPI, "fake: group_end failed");
}

Test(pipeline, a_failed_group_is_the_receives_result) {
  const dt_comm_ops_t ops = {.name = "log", .send = p_send, .recv = p_recv, .group_start = p_start,
                             .group_end = p_end_fails};
  dt_comm_t c = {.ops = &ops, .size = 3, .rank = 1};
  dt_pipe_t p = {.comm = &c};
  float a[4] = {1}, in[4];
  plen = 0, plog[0] = 0;
  cr_assert_eq(dt_pipe_send(&p, a, 4, 2), DT_OK);
  cr_assert_eq(dt_pipe_recv(&p, in, 4, 0), DT_ERR_MPI);
  cr_assert_str_eq(plog, "( send1:4@2 recv:4@0 ) ", "%s", plog);
  cr_assert_null(p.send_buf, "the failed group's send is not sent again");
}

/* The simulation frees everything it allocates: glibc's count of bytes in use grows by less
 * than 16 bytes per call over 10000 calls (the smallest block it allocates takes 32; the
 * test harness itself moves the count by a few KB). */
Test(pipeline, simulate_does_not_leak) {
  double tf[4] = {1, 2, 1, 3}, tb[4] = {2, 4, 2, 5};
  cr_assert_gt(dt_pp_simulate(4, 6, tf, tb, NULL), 0);
  size_t before = mallinfo2().uordblks;
  for (int i = 0; i < 10000; i++) dt_pp_simulate(4, 6, tf, tb, NULL);
  size_t after = mallinfo2().uordblks;
  cr_assert_lt(after, before + 16 * 10000, "bytes in use %zu -> %zu after 10000 simulations", before, after);
}
