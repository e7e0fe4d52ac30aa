/* Hang watchdog (watchdog.h): deadlines on blocking waits, the census of stuck ranks when one
 * passes, the one-line report and the end of the job with DT_EXIT_HANG. */
#include "watchdog.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "mpi_check.h"

#define HOST_MAX 64
#define CENSUS_TAG 7412 /* on MPI_COMM_WORLD; the CUDA emulation's NCCL init uses 20000-29999 there */

static struct {
  double timeout, first; /* seconds; timeout 0 = off */
  int in_first;          /* the first collective of the job is running */
  MPI_Comm census;       /* MPI_COMM_WORLD once dt_wd_start ran (MPI_COMM_NULL before): dtrain sends no
                          * point-to-point messages on it otherwise (its communicators are duplicates) */
  int rank, size;
  char (*hosts)[HOST_MAX]; /* host of every world rank */
  long step;
  double wait_s;
  double last_probe;
} wd = {.census = MPI_COMM_NULL, .rank = -1};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The node's name as the job scheduler knows it (Slurm's virtual nodes share one host name, and
 * it is what the sbatch template excludes), else the host name. */
static const char *node_name(void) {
  const char *n = getenv("SLURMD_NODENAME");
  return n && *n ? n : dt__hostname();
}

int dt_wd_on(void) { return wd.timeout > 0; }
double dt_wd_timeout(void) { return wd.timeout; }
void dt_wd_set_step(long step) { wd.step = step; }
double dt_wd_wait_seconds(void) { return wd.wait_s; }
void dt_wd_account(double seconds) { wd.wait_s += seconds; }

dt_status_t dt_wd_start(double timeout, double first) {
  wd.timeout = timeout > 0 ? timeout : 0;
  wd.first = first > 0 ? first : wd.timeout;
  DT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &wd.rank));
  DT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &wd.size));
  if (!dt_wd_on() || wd.census != MPI_COMM_NULL) return DT_OK;
  wd.hosts = calloc((size_t)wd.size, sizeof *wd.hosts);
  if (!wd.hosts) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory for the watchdog's host table", wd.rank);
  char mine[HOST_MAX] = "";
  snprintf(mine, sizeof mine, "%s", node_name());
  wd.census = MPI_COMM_WORLD;
  wd.in_first = 1; /* a rank that never arrives is found after `first` seconds (its host unknown) */
  int rc = dt_wd_allgather(mine, HOST_MAX, MPI_CHAR, wd.hosts, HOST_MAX, MPI_CHAR, MPI_COMM_WORLD,
                           "allgather of host names (start of the job)");
  wd.in_first = 0;
  DT_MPI_CHECK(rc);
  return DT_OK;
}

void dt_wd_stop(void) {
  wd.census = MPI_COMM_NULL;
  free(wd.hosts);
  wd.hosts = NULL;
  wd.timeout = 0;
}

static const char *host_of(int world_rank) {
  const char *h = wd.hosts && world_rank >= 0 && world_rank < wd.size ? wd.hosts[world_rank] : "";
  return h[0] ? h : "unknown";
}

/* Has another rank started a census (passed its deadline)? Checked every 0.1 s of waiting. */
static int census_called(double t) {
  if (wd.census == MPI_COMM_NULL || t - wd.last_probe < 0.1) return 0;
  wd.last_probe = t;
  int flag = 0;
  return MPI_Iprobe(MPI_ANY_SOURCE, CENSUS_TAG, wd.census, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag;
}

int dt_wd_wait(MPI_Request *req, MPI_Status *status, const dt_wd_op_t *op) {
  double t0 = now_s(), lim = wd.in_first ? wd.first : wd.timeout;
  int rc, flag = 0;
  if (lim <= 0) {
    rc = MPI_Wait(req, status);
  } else {
    for (unsigned k = 1;; k++) {
      rc = MPI_Test(req, &flag, status);
      if (rc != MPI_SUCCESS || flag) break;
      if (op->quiet) {
        struct timespec ts = {0, 200000}; /* 0.2 ms */
        nanosleep(&ts, NULL);
      } else if (k % 16) {
        continue; /* the clock every 16 tests */
      }
      double t = now_s();
      if (t - t0 > lim || census_called(t)) dt_wd_expire(op, t - t0);
    }
  }
  wd.wait_s += now_s() - t0;
  return rc;
}

double dt_wd_now(void) { return now_s(); }

void dt_wd_check(double t0, const dt_wd_op_t *op) {
  double t = now_s(), lim = wd.in_first ? wd.first : wd.timeout;
  if (lim > 0 && (t - t0 > lim || census_called(t))) dt_wd_expire(op, t - t0);
}

/* ---- the end of the job ------------------------------------------------------------------ */

/* Every rank that passes its deadline (or joins) tells all others so; heard[r] = 1 for each rank
 * heard from within `grace` seconds (and for this one). Returns the number heard from. */
static int census(int *heard, double grace) {
  heard[wd.rank] = 1;
  if (wd.census == MPI_COMM_NULL || wd.size < 2) return 1;
  int n = wd.size, got = 1, me = wd.rank;
  MPI_Request *rq = malloc(sizeof *rq * (size_t)n);
  int *in = calloc((size_t)n, sizeof *in);
  if (!rq || !in) {
    free(rq);
    free(in);
    return 1;
  }
  for (int p = 0; p < n; p++) {
    rq[p] = MPI_REQUEST_NULL;
    if (p == me) continue;
    MPI_Request s;
    MPI_Irecv(&in[p], 1, MPI_INT, p, CENSUS_TAG, wd.census, &rq[p]);
    if (MPI_Isend(&wd.rank, 1, MPI_INT, p, CENSUS_TAG, wd.census, &s) == MPI_SUCCESS) MPI_Request_free(&s);
  }
  for (double t0 = now_s(); got < n && now_s() - t0 < grace;) {
    for (int p = 0; p < n; p++) {
      int flag = 0;
      if (rq[p] == MPI_REQUEST_NULL || MPI_Test(&rq[p], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) continue;
      heard[p] = 1;
      got++;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  free(rq);
  free(in);
  return got;
}

/* "allreduce on dp (rank 1 of 4, 1024 bytes)" or "recv from rank 2 (world rank 5, host h) on pp (...)". */
static void describe(const dt_wd_op_t *op, char *out, size_t len) {
  char name[MPI_MAX_OBJECT_NAME] = "?";
  int r = -1, n = 0, nl = 0, k = 0;
  if (op->comm != MPI_COMM_NULL) {
    MPI_Comm_get_name(op->comm, name, &nl);
    MPI_Comm_rank(op->comm, &r);
    MPI_Comm_size(op->comm, &n);
  }
  if (op->comm_name) snprintf(name, sizeof name, "%s", op->comm_name);
  k = snprintf(out, len, "%s", op->op);
  if (op->peer >= 0 && k < (int)len) {
    int wr = -1;
    MPI_Group g, w;
    if (op->comm != MPI_COMM_NULL && MPI_Comm_group(op->comm, &g) == MPI_SUCCESS) {
      MPI_Comm_group(MPI_COMM_WORLD, &w);
      MPI_Group_translate_ranks(g, 1, &op->peer, w, &wr);
      MPI_Group_free(&g);
      MPI_Group_free(&w);
    }
    k += snprintf(out + k, len - (size_t)k, " %s rank %d (world rank %d, host %s)", strncmp(op->op, "send", 4) ? "from" : "to",
                  op->peer, wr, host_of(wr));
  }
  if (k < (int)len)
    snprintf(out + k, len - (size_t)k, " on communicator %s (rank %d of %d, %zu bytes)", name, r, n, op->bytes);
}

/* The ranks not heard from, "2 (host n1), 5 (host n2)", at most 16 named; writes their hosts to
 * $DTRAIN_SUSPECT_FILE (one per line) when print is set. */
static void missing_list(const int *heard, int got, char *out, size_t len, int print) {
  if (wd.census == MPI_COMM_NULL) {
    snprintf(out, len, "unknown (before the census was set up)");
    return;
  }
  if (got == wd.size) {
    snprintf(out, len, "none (every rank waits: a deadlock or a stalled network, not a stalled rank)");
    return;
  }
  const char *path = print ? getenv("DTRAIN_SUSPECT_FILE") : NULL;
  FILE *f = path && *path ? fopen(path, "w") : NULL;
  int k = 0, shown = 0;
  out[0] = '\0';
  for (int p = 0; p < wd.size; p++) {
    if (heard[p]) continue;
    if (f) fprintf(f, "%s\n", host_of(p));
    if (shown < 16 && k < (int)len)
      k += snprintf(out + k, len - (size_t)k, "%s%d (host %s)", shown ? ", " : "", p, host_of(p));
    else if (shown == 16 && k < (int)len)
      k += snprintf(out + k, len - (size_t)k, " and %d more", wd.size - got - 16);
    shown++;
  }
  if (f) fclose(f);
}

void dt_wd_expire(const dt_wd_op_t *op, double waited) {
  static int expiring;
  if (expiring) dt_comm_abort(DT_EXIT_HANG); /* a wait inside the report itself */
  expiring = 1;
  char what[512], miss[1024], when[48];
  int *heard = calloc(wd.size > 0 ? (size_t)wd.size : 1, sizeof *heard);
  double grace = wd.timeout / 10 < 2 ? 2 : wd.timeout / 10 > 10 ? 10 : wd.timeout / 10;
  int got = heard ? census(heard, grace) : 1, printer = wd.rank;
  for (int p = 0; heard && p < wd.size; p++)
    if (heard[p]) {
      printer = p;
      break;
    }
  if (printer != wd.rank) { /* the lowest rank heard from prints and ends the job: its launcher's */
    signal(SIGTERM, SIG_DFL); /* SIGTERM ends this one silently (the trainer catches it otherwise) */
    struct timespec ts = {10, 0}; /* still here: the printer failed; print and end the job */
    while (nanosleep(&ts, &ts) != 0) continue;
  }
  describe(op, what, sizeof what);
  if (heard) missing_list(heard, got, miss, sizeof miss, printer == wd.rank);
  else snprintf(miss, sizeof miss, "unknown (out of memory)");
  if (wd.step > 0) snprintf(when, sizeof when, "step %ld", wd.step);
  else snprintf(when, sizeof when, "setup (before step 1)");
  double lim = wd.in_first ? wd.first : wd.timeout;
  fprintf(stderr,
          "dtrain: watchdog: rank %d (host %s) at %s: %s not complete after %.1f s (system.comm_timeout%s = %g s%s); "
          "ranks that did not report waiting within %.0f s: %s; ending the job with exit status %d (requeue)\n",
          wd.rank, node_name(), when, what, waited, wd.in_first ? "_start" : "", lim,
          waited < lim ? ", passed on another rank" : "", grace, miss, DT_EXIT_HANG);
  free(heard);
  dt_comm_abort(DT_EXIT_HANG);
}
