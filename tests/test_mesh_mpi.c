/* Multi-rank check of dt_mesh_init (plain MPI program, run by tests/mesh_mpi.sh under mpirun).
 *   test_mesh_mpi ok DP TP PP       build the mesh; check every rank's coordinates against a
 *                                   nested-loop enumeration (tp fastest, then pp, then dp), the
 *                                   members of each axis communicator, and the gathered table
 *   test_mesh_mpi fail DP TP PP MSG every rank must get an error whose message contains MSG
 * Exits 1 if the check failed on any rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh.h"

static int rank, n_fail;
#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      n_fail++;                                                   \
      fprintf(stderr, "rank %d: FAIL line %d: ", rank, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                               \
      fputc('\n', stderr);                                        \
    }                                                             \
  } while (0)

/* World ranks of this rank's group along one axis, in axis order, by enumeration. */
static void check_axis(dt_comm_t *c, const char *name, const int *want, int n) {
  CHECK(c && c->size == n, "%s comm size %d want %d", name, c ? c->size : -1, n);
  if (!c || c->size != n) return;
  int *got = malloc((size_t)n * sizeof *got);
  CHECK(c->ops->allgather(c, &rank, got, 1, DT_I32, NULL, NULL) == DT_OK, "%s allgather", name);
  for (int i = 0; i < n; i++) CHECK(got[i] == want[i], "%s member %d is world rank %d want %d", name, i, got[i], want[i]);
  free(got);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 5) {
    fprintf(stderr, "usage: test_mesh_mpi ok|fail DP TP PP [MSG]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int expect_ok = !strcmp(argv[1], "ok");
  dt_mesh_opts_t o = {.cuda = 0, .runtime_devices = -1, .threads = 1,
                      .dp = atoi(argv[2]), .tp = atoi(argv[3]), .pp = atoi(argv[4]), .args = "layout"};
  dt_mesh_t m;
  dt_status_t st = dt_mesh_init(&m, &o);
  if (!expect_ok) {
    const char *want = argc > 5 ? argv[5] : "";
    CHECK(st != DT_OK, "mesh accepted");
    CHECK(strstr(dt_err_msg(), want) != NULL, "message '%s' lacks '%s'", dt_err_msg(), want);
    if (rank == 0) printf("# every rank must fail with: %s\n# rank 0 got: %s\n", want, dt_err_msg());
  } else {
    CHECK(st == DT_OK, "mesh: %s", dt_err_msg());
    if (st == DT_OK) {
      int dp = o.dp ? o.dp : size / (o.tp * o.pp), tp = o.tp, pp = o.pp;
      /* enumerate: the k-th rank in (dp, pp, tp) nested order, tp innermost */
      int k = 0, md = -1, mp = -1, mt = -1;
      for (int d = 0; d < dp; d++)
        for (int p = 0; p < pp; p++)
          for (int t = 0; t < tp; t++, k++)
            if (k == rank) md = d, mp = p, mt = t;
      CHECK(m.dp == dp && m.tp == tp && m.pp == pp, "mesh %dx%dx%d", m.dp, m.tp, m.pp);
      CHECK(m.dp_idx == md && m.pp_idx == mp && m.tp_idx == mt, "coords dp %d pp %d tp %d want %d %d %d", m.dp_idx,
            m.pp_idx, m.tp_idx, md, mp, mt);
      int want[64];
      for (int t = 0; t < tp; t++) want[t] = (md * pp + mp) * tp + t;
      check_axis(m.tp_comm, "tp", want, tp);
      for (int p = 0; p < pp; p++) want[p] = (md * pp + p) * tp + mt;
      check_axis(m.pp_comm, "pp", want, pp);
      for (int d = 0; d < dp; d++) want[d] = (d * pp + mp) * tp + mt;
      check_axis(m.dp_comm, "dp", want, dp);
      CHECK(m.tp_comm->rank == mt && m.pp_comm->rank == mp && m.dp_comm->rank == md, "axis ranks");
      /* one host under mpirun: one node, local rank = rank */
      CHECK(m.n_nodes == 1 && m.node == 0 && m.local_rank == rank && m.local_size == size, "node %d/%d local %d/%d",
            m.node, m.n_nodes, m.local_rank, m.local_size);
      CHECK(m.threads == 1 && m.device == -1, "threads %d device %d", m.threads, m.device);
      for (int r = 0; r < size; r++) {
        const dt_rank_info_t *x = &m.ranks[r];
        CHECK(x->rank == r && dt_mesh_rank_of(x->dp_idx, x->pp_idx, x->tp_idx, tp, pp) == r, "table row %d", r);
      }
      if (rank == 0) dt_mesh_print(&m, stdout);
      dt_mesh_free(&m);
    }
  }
  int tot = 0;
  MPI_Allreduce(&n_fail, &tot, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("# mesh %s dp=%s tp=%s pp=%s on %d ranks: %d failures\n", argv[1], argv[2], argv[3], argv[4], size, tot);
  MPI_Finalize();
  return tot ? 1 : 0;
}
