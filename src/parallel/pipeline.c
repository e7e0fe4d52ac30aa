/* Pipeline parallelism: 1F1B schedule, its simulation, and the deferred/paired stage transfers
 * (see pipeline.h). */
#include "pipeline.h"

#include <stdlib.h>

int dt_pp_inflight(int s, int pp, int m) { return pp - s < m ? pp - s : m; }

double dt_pp_bubble(int pp, int m) { return (double)(pp - 1) / (double)(m + pp - 1); }

int dt_pp_schedule(int s, int pp, int m, dt_pp_op_t *ops) {
  if (pp < 1 || s < 0 || s >= pp || m < 1) return 0;
  int w = pp - 1 - s < m ? pp - 1 - s : m, n = 0, f = 0, b = 0;
  while (f < w) ops[n++] = (dt_pp_op_t){1, f++};
  while (f < m) {
    ops[n++] = (dt_pp_op_t){1, f++};
    ops[n++] = (dt_pp_op_t){0, b++};
  }
  while (b < m) ops[n++] = (dt_pp_op_t){0, b++};
  return n;
}

/* ---- simulation ---------------------------------------------------------------------------
 * Each stage runs groups and computes alternately: group i (before operation i; group 2m is the
 * final flush) holds the send deferred from operation i - 1 and the receive operation i needs.
 * A message is (kind, micro-batch) between two stages; a group completes when every peer has
 * entered the group holding the other end of each of its messages (rendezvous: the slowest
 * case of MPI's protocols), at the latest of those entry times. */

typedef struct {
  int send_to, recv_from;   /* peer stage or -1 */
  int send_kind, recv_kind; /* 1 = activation (forward), 0 = gradient (backward) */
  int send_mb, recv_mb;
} sim_group_t;

static void sim_groups(int s, int pp, const dt_pp_op_t *ops, int n, sim_group_t *g) {
  for (int i = 0; i <= n; i++) {
    sim_group_t x = {-1, -1, 0, 0, 0, 0};
    if (i > 0) { /* the previous operation's output */
      const dt_pp_op_t *o = &ops[i - 1];
      int to = o->fwd ? s + 1 : s - 1;
      if (to >= 0 && to < pp) x.send_to = to, x.send_kind = o->fwd, x.send_mb = o->mb;
    }
    if (i < n) {
      const dt_pp_op_t *o = &ops[i];
      int from = o->fwd ? s - 1 : s + 1;
      if (from >= 0 && from < pp) x.recv_from = from, x.recv_kind = o->fwd, x.recv_mb = o->mb;
    }
    g[i] = x;
  }
}

/* The group index on stage `peer` holding the other end of a message, -1 if none. */
static int sim_find(const sim_group_t *g, int n, int want_send, int peer_of, int kind, int mb) {
  for (int i = 0; i <= n; i++) {
    const sim_group_t *x = &g[i];
    if (want_send && x->send_to == peer_of && x->send_kind == kind && x->send_mb == mb) return i;
    if (!want_send && x->recv_from == peer_of && x->recv_kind == kind && x->recv_mb == mb) return i;
  }
  return -1;
}

double dt_pp_simulate(int pp, int m, const double *tf, const double *tb, double *busy) {
  const int n = 2 * m;
  dt_pp_op_t *ops = malloc(sizeof *ops * (size_t)pp * n);
  sim_group_t *g = malloc(sizeof *g * (size_t)pp * (n + 1));
  int *cur = calloc((size_t)pp, sizeof *cur); /* group each stage is in (n + 1 = done) */
  double *enter = calloc((size_t)pp * (n + 2), sizeof *enter); /* [s][i]: when stage s entered group i */
  double result = -1;
  if (!ops || !g || !cur || !enter) goto out;
  for (int s = 0; s < pp; s++) {
    if (dt_pp_schedule(s, pp, m, ops + (size_t)s * n) != n) goto out;
    sim_groups(s, pp, ops + (size_t)s * n, n, g + (size_t)s * (n + 1));
    if (busy) busy[s] = 0;
  }
  for (int done = 0; done < pp;) {
    int progress = 0;
    for (int s = 0; s < pp; s++) {
      if (cur[s] > n) continue;
      const sim_group_t *x = &g[(size_t)s * (n + 1) + cur[s]];
      double t = enter[(size_t)s * (n + 2) + cur[s]];
      int ready = 1;
      /* the receiver of our send and the sender of our receive must have entered those groups */
      int peers[2] = {x->send_to, x->recv_from};
      for (int k = 0; k < 2 && ready; k++) {
        int p = peers[k];
        if (p < 0) continue;
        const sim_group_t *pg = g + (size_t)p * (n + 1);
        int j = k == 0 ? sim_find(pg, n, 0, s, x->send_kind, x->send_mb) : sim_find(pg, n, 1, s, x->recv_kind, x->recv_mb);
        if (j < 0) goto out; /* a message nobody matches: a broken schedule */
        if (cur[p] < j) ready = 0;
        else if (enter[(size_t)p * (n + 2) + j] > t) t = enter[(size_t)p * (n + 2) + j];
      }
      if (!ready) continue;
      progress = 1;
      double c = 0;
      if (cur[s] < n) { /* operation cur[s] computes after its group; group n is the final flush */
        const dt_pp_op_t *o = &ops[(size_t)s * n + cur[s]];
        c = o->fwd ? tf[s] : tb[s];
        if (busy) busy[s] += c;
      } else {
        done++;
      }
      cur[s]++;
      enter[(size_t)s * (n + 2) + cur[s]] = t + c;
    }
    if (!progress) goto out; /* deadlock */
  }
  result = 0;
  for (int s = 0; s < pp; s++) result = enter[(size_t)s * (n + 2) + n + 1] > result ? enter[(size_t)s * (n + 2) + n + 1] : result;
out:
  free(ops);
  free(g);
  free(cur);
  free(enter);
  return result;
}

/* ---- transfers ------------------------------------------------------------------------------ */

/* n elements of p->esz bytes as the communicator counts them: floats, or bytes for 16-bit storage */
static size_t pipe_count(const dt_pipe_t *p, size_t n, dt_dtype_t *ty) {
  const size_t esz = p->esz ? p->esz : sizeof(float);
  *ty = esz == sizeof(float) ? DT_F32 : DT_U8;
  return esz == sizeof(float) ? n : n * esz;
}

dt_status_t dt_pipe_flush(dt_pipe_t *p) {
  if (!p->send_buf) return DT_OK;
  dt_dtype_t ty;
  size_t k = pipe_count(p, p->send_n, &ty);
  dt_status_t st = p->comm->ops->send(p->comm, p->send_buf, k, ty, p->send_peer, p->stream, NULL);
  p->send_buf = NULL;
  return st;
}

dt_status_t dt_pipe_send(dt_pipe_t *p, const void *buf, size_t n, int peer) {
  DT_TRY(dt_pipe_flush(p));
  p->send_buf = buf;
  p->send_n = n;
  p->send_peer = peer;
  return DT_OK;
}

dt_status_t dt_pipe_recv(dt_pipe_t *p, void *buf, size_t n, int peer) {
  dt_comm_t *c = p->comm;
  dt_status_t st = DT_OK;
  dt_dtype_t ty;
  const size_t k = pipe_count(p, n, &ty);
  if (!p->send_buf) {
    st = c->ops->recv(c, buf, k, ty, peer, p->stream, NULL);
  } else { /* both posted, both completed at group_end */
    const size_t ks = pipe_count(p, p->send_n, &ty);
    st = c->ops->group_start(c);
    if (st == DT_OK) st = c->ops->send(c, p->send_buf, ks, ty, p->send_peer, p->stream, NULL);
    if (st == DT_OK) st = c->ops->recv(c, buf, k, ty, peer, p->stream, NULL);
    dt_status_t e = c->ops->group_end(c);
    if (st == DT_OK) st = e;
    p->send_buf = NULL;
  }
  return st;
}
