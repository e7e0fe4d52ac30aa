/* Launch layout (mesh.h), the collective half: dt_mesh_init agrees on one view of the launch over
 * MPI_COMM_WORLD (node grouping, environment and device checks, the dp x tp x pp communicators,
 * the gathered rank table), dt_mesh_print, and the `dtrain layout` subcommand. Tested by
 * tests/test_mesh_mpi.c, tests/mesh_mpi.sh and tests/slurm_layout.sh; the pure half is launch.c. */
#include "mesh.h"

#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dt_build.h"
#include "dt_cuda.h"
#include "mpi_check.h"
#include "watchdog.h"

/* ---- mesh -------------------------------------------------------------------------------- */

/* The one-task-sees-several-GPUs rule and the device count checks (this rank's view). */
static dt_status_t check_devices(dt_mesh_t *m, const dt_mesh_opts_t *o, const char *list_src) {
  int G = m->node_devices;
  const char *args = o->args ? o->args : "...";
  const char *shown = m->env.has_cvd ? m->env.cuda_visible_devices : m->env.slurm_step_gpus;
  if (G > m->local_size) {
    if (!m->cuda) return DT_OK; /* a note in the table (dt_mesh_note) */
    char cmd[400];
    if (m->launcher == DT_LAUNCH_MPIRUN)
      snprintf(cmd, sizeof cmd, "mpirun -n %d --map-by ppr:%d:node ./dtrain %s", m->n_nodes * G, G, args);
    else
      snprintf(cmd, sizeof cmd,
               "srun -N %d --ntasks-per-node=%d --gpus-per-node=%d ./dtrain %s (or srun -N %d "
               "--ntasks-per-node=%d --gpus-per-task=1 ./dtrain %s)",
               m->n_nodes, G, G, args, m->n_nodes, G, args);
    return DT_ERR(DT_ERR_LAUNCH,
                  "rank %d (host %s): %d GPUs visible on node %d (%s=%s) but only %d rank%s there; dtrain uses "
                  "one GPU per rank and will not leave %d idle: start one task per GPU: %s",
                  m->rank, m->host, G, m->node, list_src ? list_src : "CUDA runtime", list_src ? shown : "",
                  m->local_size, m->local_size == 1 ? " runs" : "s run", G - m->local_size, cmd);
  }
  if (!m->cuda) return DT_OK;
  int avail = m->n_visible >= 0 ? m->n_visible : o->runtime_devices;
  if (avail == 0)
    return DT_ERR(DT_ERR_LAUNCH, "rank %d (host %s): backend cuda but no GPU is visible%s%s%s", m->rank, m->host,
                  list_src ? " (" : "", list_src ? list_src : "", list_src ? " is empty)" : "");
  if (avail > 1 && m->device >= avail)
    return DT_ERR(DT_ERR_LAUNCH,
                  "rank %d (host %s): local rank %d of %d on node %d but only %d GPUs visible%s%s; start at most "
                  "one rank per GPU",
                  m->rank, m->host, m->local_rank, m->local_size, m->node, avail, list_src ? " in " : "",
                  list_src ? list_src : "");
  return DT_OK;
}

/* Same node <=> same SLURM_NODEID (srun only), from the gathered table: same answer everywhere. */
static dt_status_t check_nodeids(const dt_mesh_t *m) {
  int *sid = malloc((size_t)m->n_nodes * sizeof *sid);
  if (!sid) return DT_ERR(DT_ERR_NOMEM, "mesh: out of memory");
  for (int k = 0; k < m->n_nodes; k++) sid[k] = -2;
  dt_status_t st = DT_OK;
  for (int r = 0; r < m->size && st == DT_OK; r++) {
    const dt_rank_info_t *x = &m->ranks[r];
    if (x->slurm_nodeid < 0) continue;
    if (sid[x->node] == -2) {
      for (int k = 0; k < m->n_nodes; k++)
        if (sid[k] == x->slurm_nodeid)
          st = DT_ERR(DT_ERR_LAUNCH,
                      "rank %d (host %s): SLURM_NODEID=%d is also the SLURM_NODEID of node %d but MPI puts "
                      "rank %d on node %d",
                      r, x->host, x->slurm_nodeid, k, r, x->node);
      sid[x->node] = x->slurm_nodeid;
    } else if (sid[x->node] != x->slurm_nodeid) {
      st = DT_ERR(DT_ERR_LAUNCH, "rank %d (host %s): SLURM_NODEID=%d but MPI puts it on node %d, whose ranks have SLURM_NODEID=%d",
                  r, x->host, x->slurm_nodeid, x->node, sid[x->node]);
    }
  }
  free(sid);
  return st;
}

/* DTRAIN_TEST_SHARED_GPU=1 (test-only: scripts/gpu-check.sh's parallel stage runs tp, pp, dp and
 * ZeRO layouts on a machine with one GPU) lets local ranks share a GPU, but only when no device
 * buffer goes through NCCL (system.device_comm = mpi): NCCL refuses two ranks on one device. */
static int test_shared_gpu(void) {
  const char *e = getenv("DTRAIN_TEST_SHARED_GPU");
  return e && !strcmp(e, "1");
}

/* The node's ranks whose GPU another local rank also has (ids: their PCI bus ids). */
static int count_shared(const char *ids, size_t stride, int n) {
  int k = 0;
  for (int j = 0; j < n; j++) k += dt_devid_shared(ids, stride, n, j) >= 0;
  return k;
}

/* Two ranks of a node on one physical GPU (the same PCI bus id, whatever CUDA_VISIBLE_DEVICES
 * calls it: under Slurm's device cgroups every task's GPU is "0"): refused here, in words, rather
 * than left to NCCL ("duplicate GPU detected") or to two ranks sharing one GPU's memory. Ranks
 * whose runtime cannot name their device (no driver: `dtrain layout` on a login node) skip it.
 * Allowed for tests by DTRAIN_TEST_SHARED_GPU=1 with device_comm = mpi: one line from each such
 * node's first rank. */
static dt_status_t check_shared_gpu(dt_mesh_t *m, const dt_mesh_opts_t *o, MPI_Comm node) {
  enum { ID = 32 };
  char mine[ID] = "", *ids = calloc((size_t)m->local_size, ID);
  if (!ids) return DT_ERR(DT_ERR_NOMEM, "mesh: out of memory");
  if (m->cuda && m->device >= 0 && dt_cuda_device_bus_id(m->device, mine, ID) != DT_OK) {
    mine[0] = '\0';
    dt_err_clear();
  }
  int rc = dt_wd_allgather(mine, ID, MPI_CHAR, ids, ID, MPI_CHAR, node, "allgather of GPU bus ids (node)");
  int other = rc == MPI_SUCCESS ? dt_devid_shared(ids, ID, m->local_size, m->local_rank) : -1;
  int shared = rc == MPI_SUCCESS ? count_shared(ids, ID, m->local_size) : 0;
  free(ids);
  if (rc != MPI_SUCCESS) return dt__mpi_error(rc, "MPI_Allgather", __FILE__, __LINE__);
  int test = test_shared_gpu();
  if (shared > 0 && test && o->device_comm_mpi && m->local_rank == 0) {
    printf("# test: local ranks share GPUs (DTRAIN_TEST_SHARED_GPU=1): %d of the %d ranks of node %d (host %s) "
           "share a GPU with another; device buffers go over MPI (system.device_comm = mpi), no NCCL\n",
           shared, m->local_size, m->node, m->host);
    fflush(stdout);
  }
  if (other < 0 || (test && o->device_comm_mpi)) return DT_OK;
  return DT_ERR(DT_ERR_LAUNCH,
                "rank %d (host %s): local ranks %d and %d of node %d both run on the GPU at PCI bus %s (device "
                "ordinal %d); dtrain uses one GPU per rank: start at most as many ranks per node as it has GPUs%s",
                m->rank, m->host, other < m->local_rank ? other : m->local_rank,
                other < m->local_rank ? m->local_rank : other, m->node, mine, m->device,
                test ? " (DTRAIN_TEST_SHARED_GPU=1, test-only, allows it only with system.device_comm = mpi: "
                       "NCCL refuses two ranks on one GPU)"
                     : "");
}

/* Names of the communicators in the watchdog's messages (MPI_Comm_set_name). */
static void name_comms(dt_mesh_t *m) {
  struct { dt_comm_t *c; const char *name; } n[] = {
      {m->world, "world"}, {m->node_comm, "node"}, {m->dp_comm, "dp"}, {m->tp_comm, "tp"}, {m->pp_comm, "pp"}};
  for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) {
    MPI_Comm h;
    if (n[i].c && dt_comm_mpi_handle(n[i].c, &h) == DT_OK) MPI_Comm_set_name(h, n[i].name);
  }
}

static dt_status_t mesh_local(dt_mesh_t *m, const dt_mesh_opts_t *o, MPI_Comm node) {
  const char *list_src = NULL;
  m->n_visible = dt_launch_visible_devices(&m->env, &list_src);
  m->device = m->cuda ? dt_mesh_device_ordinal(m->local_rank, m->n_visible >= 0 ? m->n_visible : o->runtime_devices) : -1;
  /* distinct devices on this node, over every local rank's list */
  char *lists = calloc((size_t)m->local_size, DT_DEVLIST_MAX);
  int *has = calloc((size_t)m->local_size, sizeof *has);
  if (!lists || !has) {
    free(lists);
    free(has);
    return DT_ERR(DT_ERR_NOMEM, "mesh: out of memory");
  }
  char mine[DT_DEVLIST_MAX] = "";
  int my_has = list_src != NULL;
  if (my_has) snprintf(mine, sizeof mine, "%s", m->env.has_cvd ? m->env.cuda_visible_devices : m->env.slurm_step_gpus);
  int rc = dt_wd_allgather(mine, DT_DEVLIST_MAX, MPI_CHAR, lists, DT_DEVLIST_MAX, MPI_CHAR, node, "allgather of device lists (node)");
  if (rc == MPI_SUCCESS) rc = dt_wd_allgather(&my_has, 1, MPI_INT, has, 1, MPI_INT, node, "allgather of device lists (node)");
  if (rc == MPI_SUCCESS) m->node_devices = dt_devlist_union(lists, has, m->local_size);
  free(lists);
  free(has);
  if (rc != MPI_SUCCESS) return dt__mpi_error(rc, "MPI_Allgather", __FILE__, __LINE__);
  /* no device list: Slurm's count for the node (srun only), else what the CUDA runtime reports */
  if (m->node_devices < 0 && m->launcher == DT_LAUNCH_SRUN && m->env.slurm_gpus_on_node > 0)
    m->node_devices = m->env.slurm_gpus_on_node;
  if (m->node_devices < 0 && m->cuda) m->node_devices = o->runtime_devices;
  DT_TRY(dt_launch_check(&m->env, m->rank, m->size, m->local_rank, m->host));
  return check_devices(m, o, list_src);
}

/* The oversubscription warning once per node: from its lowest oversubscribed rank, with the count. */
static void warn_node(const dt_mesh_t *m, const char *warn) {
  int first = m->rank, n = 0;
  for (int r = 0; r < m->size; r++)
    if (m->ranks[r].node == m->node && m->ranks[r].oversub) {
      if (r < first) first = r;
      n++;
    }
  if (first != m->rank) return;
  if (n > 1)
    fprintf(stderr, "dtrain: %s (and %d more rank%s on this node)\n", warn, n - 1, n == 2 ? "" : "s");
  else
    fprintf(stderr, "dtrain: %s\n", warn);
  fflush(stderr);
}

/* The ranks sharing memory (node_comm, ordered by world rank) and this node's index (nodes
 * numbered by their lowest world rank). */
static dt_status_t mesh_node(dt_mesh_t *m, MPI_Comm w) {
  MPI_Comm node;
  int rc = MPI_Comm_split_type(w, MPI_COMM_TYPE_SHARED, m->rank, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) return dt__mpi_error(rc, "MPI_Comm_split_type", __FILE__, __LINE__);
  dt_status_t st = dt_comm_mpi_create(&node, &m->node_comm);
  rc = MPI_Comm_free(&node);
  if (st == DT_OK && rc != MPI_SUCCESS) st = dt__mpi_error(rc, "MPI_Comm_free", __FILE__, __LINE__);
  DT_TRY(st);
  name_comms(m); /* world and node now, the rest after the splits */
  m->local_rank = m->node_comm->rank;
  m->local_size = m->node_comm->size;
  int leader = m->rank, *leaders = malloc((size_t)m->size * sizeof(int));
  if (!leaders) return DT_ERR(DT_ERR_NOMEM, "mesh: out of memory");
  if ((st = m->node_comm->ops->broadcast(m->node_comm, &leader, 1, DT_I32, 0, NULL, NULL)) == DT_OK)
    st = m->world->ops->allgather(m->world, &leader, leaders, 1, DT_I32, NULL, NULL);
  if (st == DT_OK)
    for (int r = 0; r < m->size; r++)
      if (leaders[r] == r) {
        if (r < leader) m->node++;
        m->n_nodes++;
      }
  free(leaders);
  return st;
}

/* Environment, threads and devices: checked locally, then agreed on by every rank. */
static dt_status_t mesh_env(dt_mesh_t *m, const dt_mesh_opts_t *o, MPI_Comm w) {
  MPI_Comm node;
  dt_comm_mpi_handle(m->node_comm, &node);
  dt_status_t st = dt_launch_env_read(&m->env);
  if (st == DT_OK) {
    m->launcher = dt_launch_detect(&m->env);
    dt_cpuset_read(&m->cpuset);
    const char *omp = getenv("OMP_NUM_THREADS");
    m->threads = dt_cpuset_threads(&m->cpuset, o->threads, m->env.slurm_cpus_per_task, omp ? atoi(omp) : 0,
                                   m->local_size, &m->threads_src);
    st = mesh_local(m, o, node);
  }
  DT_TRY(dt_mpi_agree(w, st));
  return dt_mpi_agree(w, check_shared_gpu(m, o, node)); /* collective: after the agreement */
}

/* The process mesh (the same inputs on every rank, so the same answer) and its communicators. */
static dt_status_t mesh_grid(dt_mesh_t *m, const dt_mesh_opts_t *o) {
  m->dp = o->dp;
  m->tp = o->tp > 0 ? o->tp : 1;
  m->pp = o->pp > 0 ? o->pp : 1;
  DT_TRY(dt_mesh_resolve(m->size, &m->dp, m->tp, m->pp));
  dt_mesh_coords(m->rank, m->tp, m->pp, &m->dp_idx, &m->pp_idx, &m->tp_idx);
  const dt_comm_ops_t *ops = m->world->ops;
  DT_TRY(ops->split(m->world, m->dp_idx * m->pp + m->pp_idx, m->tp_idx, &m->tp_comm));
  DT_TRY(ops->split(m->world, m->dp_idx * m->tp + m->tp_idx, m->pp_idx, &m->pp_comm));
  DT_TRY(ops->split(m->world, m->pp_idx * m->tp + m->tp_idx, m->dp_idx, &m->dp_comm));
  name_comms(m);
  return DT_OK;
}

/* This rank's row of the rank table; *warn gets its CPU oversubscription warning (me->oversub). */
static void rank_row(const dt_mesh_t *m, dt_rank_info_t *me, char *warn, int nwarn) {
  memset(me, 0, sizeof *me);
  me->rank = m->rank;
  me->node = m->node;
  me->local_rank = m->local_rank;
  me->local_size = m->local_size;
  me->device = m->device;
  me->threads = m->threads;
  me->slurm_nodeid = m->env.slurm_nodeid;
  me->slurm_localid = m->env.slurm_localid;
  me->n_visible = m->n_visible;
  me->node_devices = m->node_devices;
  me->dp_idx = m->dp_idx;
  me->pp_idx = m->pp_idx;
  me->tp_idx = m->tp_idx;
  snprintf(me->host, sizeof me->host, "%s", m->host);
  dt_cpuset_format(m->cpuset.cpus, m->cpuset.n_mask, me->cpus, (int)sizeof me->cpus);
  me->oversub = dt_cpuset_warning(&m->cpuset, m->threads, m->local_size, m->rank, m->host,
                                  dt_launcher_name(m->launcher), warn, nwarn);
  snprintf(me->visible, sizeof me->visible, "%.47s",
           m->env.has_cvd ? m->env.cuda_visible_devices : m->env.has_step_gpus ? m->env.slurm_step_gpus : "-");
  if (m->device >= 0 && m->n_visible > 0)
    dt_devlist_entry(m->env.has_cvd ? m->env.cuda_visible_devices : m->env.slurm_step_gpus, m->device, me->gpu,
                     sizeof me->gpu);
  else
    snprintf(me->gpu, sizeof me->gpu, "-");
}

/* The rank table, on every rank; srun's node ids checked; this node's oversubscription warned. */
static dt_status_t rank_table(dt_mesh_t *m, MPI_Comm w) {
  dt_rank_info_t me;
  char warn[512];
  rank_row(m, &me, warn, (int)sizeof warn);
  m->ranks = malloc((size_t)m->size * sizeof *m->ranks);
  if (!m->ranks) return DT_ERR(DT_ERR_NOMEM, "mesh: out of memory");
  int rc = dt_wd_allgather(&me, (int)sizeof me, MPI_BYTE, m->ranks, (int)sizeof me, MPI_BYTE, w,
                           "allgather of the rank table");
  if (rc != MPI_SUCCESS) return dt__mpi_error(rc, "MPI_Allgather", __FILE__, __LINE__);
  if (m->launcher == DT_LAUNCH_SRUN) DT_TRY(check_nodeids(m));
  if (me.oversub) warn_node(m, warn);
  return DT_OK;
}

/* Every OpenMP region of the rank uses its threads, whatever the backend: the cpu kernels and
 * sgemm, and the CUDA backend's host work (the emulation's cuBLAS: left at OpenMP's default, a
 * 1-thread rank's idle workers spun on the other core); pinned in the CPU set; the note on GPUs a
 * cpu run leaves unused (the CPU form of the one-task-several-GPUs rule). */
static void mesh_threads(dt_mesh_t *m) {
  omp_set_num_threads(m->threads);
  m->pinned = dt_cpuset_pin(&m->cpuset, m->threads);
  for (int r = 0; r < m->size && !m->cuda; r++)
    if (m->ranks[r].node_devices > m->ranks[r].local_size) {
      snprintf(m->note, sizeof m->note,
               "note: %d GPUs visible on node %d but %d rank%s there and the backend is cpu: the GPUs stay unused",
               m->ranks[r].node_devices, m->ranks[r].node, m->ranks[r].local_size,
               m->ranks[r].local_size == 1 ? " runs" : "s run");
      break;
    }
}

dt_status_t dt_mesh_init(dt_mesh_t *m, const dt_mesh_opts_t *o) {
  memset(m, 0, sizeof *m);
  m->cuda = o->cuda;
  MPI_Comm world = MPI_COMM_WORLD, w;
  DT_TRY(dt_comm_mpi_create(&world, &m->world));
  DT_TRY(dt_comm_mpi_handle(m->world, &w));
  m->rank = m->world->rank;
  m->size = m->world->size;
  dt_err_set_rank(m->rank);
  snprintf(m->host, sizeof m->host, "%s", dt__hostname());
  dt_status_t st = mesh_node(m, w);
  if (st == DT_OK) st = mesh_env(m, o, w);
  if (st == DT_OK) st = mesh_grid(m, o);
  if (st == DT_OK) st = rank_table(m, w);
  if (st != DT_OK) {
    dt_mesh_free(m);
    return st;
  }
  mesh_threads(m);
  return DT_OK;
}

void dt_mesh_free(dt_mesh_t *m) {
  dt_comm_t **cs[] = {&m->pp_comm, &m->tp_comm, &m->dp_comm, &m->node_comm, &m->world};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
    if (*cs[i]) {
      (*cs[i])->ops->free(*cs[i]);
      *cs[i] = NULL;
    }
  free(m->ranks);
  m->ranks = NULL;
}

static const char *num(char *buf, int v) {
  if (v < 0) return "-";
  snprintf(buf, 16, "%d", v);
  return buf;
}

void dt_mesh_print(const dt_mesh_t *m, FILE *out) {
  if (m->rank != 0 || !m->ranks) return;
  char job[96] = "";
  if (m->env.slurm_job_id[0]) {
    int n = snprintf(job, sizeof job, " job %.40s", m->env.slurm_job_id);
    if (m->env.slurm_step_id >= 0 && m->env.slurm_step_id < 0xfffffff0LL)
      n += snprintf(job + n, sizeof job - (size_t)n, " step %lld", m->env.slurm_step_id);
    if (m->env.slurm_restart_count >= 0)
      snprintf(job + n, sizeof job - (size_t)n, " restart %d", m->env.slurm_restart_count);
  }
  fprintf(out, "# layout: %d rank%s on %d node%s, mesh dp=%d x tp=%d x pp=%d, backend %s, launcher %s%s, threads from %s%s\n",
          m->size, m->size == 1 ? "" : "s", m->n_nodes, m->n_nodes == 1 ? "" : "s", m->dp, m->tp, m->pp,
          m->cuda ? "cuda" : "cpu", dt_launcher_name(m->launcher), job, m->threads_src,
          m->pinned ? " (pinned in the mask)" : "");
  fprintf(out, "# %5s %-16s %4s %5s %6s %7s %4s %4s %4s %12s %13s %-10s %-10s %s\n", "rank", "host", "node", "local",
          "device", "threads", "dp", "pp", "tp", "SLURM_NODEID", "SLURM_LOCALID", "visible", "gpu", "cpus");
  for (int r = 0; r < m->size; r++) {
    const dt_rank_info_t *x = &m->ranks[r];
    char a[16], b[16], c[16];
    fprintf(out, "# %5d %-16s %4d %5d %6s %7d %4d %4d %4d %12s %13s %-10s %-10s %s\n", x->rank, x->host, x->node,
            x->local_rank, num(a, x->device), x->threads, x->dp_idx, x->pp_idx, x->tp_idx, num(b, x->slurm_nodeid),
            num(c, x->slurm_localid), x->visible, x->gpu, x->cpus);
  }
  if (m->note[0]) fprintf(out, "# %s\n", m->note);
  fflush(out);
}

/* ---- dtrain layout ----------------------------------------------------------------------- */

static int layout_usage(FILE *out) {
  fprintf(out, "usage: dtrain layout [--backend auto|cpu|cuda] [--dp N] [--tp N] [--pp N] [--threads N]\n");
  return 2;
}

static int parse_nonneg(const char *s, int *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : -1;
  if (!s || end == s || *end || errno || v < 0 || v > INT_MAX) return 0;
  *out = (int)v;
  return 1;
}

int dt_layout_main(int argc, char **argv) {
  int rank = 0;
  if (dt_mpi_init(&argc, &argv, &rank) != MPI_SUCCESS) {
    fprintf(stderr, "dtrain layout: MPI_Init failed\n");
    return 1;
  }
  dt_mesh_opts_t o = {.cuda = -1, .runtime_devices = -1, .threads = 0, .dp = 0, .tp = 1, .pp = 1, .args = NULL};
  char args[256] = "";
  int bad = 0;
  for (int i = 1; i < argc && !bad; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int *dst = !strcmp(a, "--dp") ? &o.dp : !strcmp(a, "--tp") ? &o.tp : !strcmp(a, "--pp") ? &o.pp
             : !strcmp(a, "--threads") ? &o.threads : NULL;
    if (!strcmp(a, "--backend") && v && (!strcmp(v, "cpu") || !strcmp(v, "cuda") || !strcmp(v, "auto"))) {
      o.cuda = !strcmp(v, "cuda") ? 1 : !strcmp(v, "cpu") ? 0 : -1;
      i++;
    } else if (dst && parse_nonneg(v, dst)) {
      i++;
    } else {
      if (rank == 0) fprintf(stderr, "dtrain layout: bad argument '%s'%s%s\n", a, v ? " " : "", v ? v : "");
      bad = 1;
    }
  }
  size_t n = strlen("layout");
  memcpy(args, "layout", n + 1);
  for (int i = 1; i < argc && n + strlen(argv[i]) + 2 < sizeof args; i++) n += (size_t)snprintf(args + n, sizeof args - n, " %s", argv[i]);
  o.args = args;
  if (bad) {
    if (rank == 0) layout_usage(stderr);
    MPI_Finalize();
    return 2;
  }
  if (o.cuda < 0) { /* auto: CUDA when it is built in and the environment names devices */
#ifdef DT_HAVE_CUDA
    dt_launch_env_t e;
    o.cuda = dt_launch_env_read(&e) == DT_OK && dt_launch_visible_devices(&e, NULL) > 0;
#else
    o.cuda = 0;
#endif
  }
  dt_mesh_t m;
  dt_status_t st = dt_mesh_init(&m, &o);
  if (st == DT_ERR_MPI) { /* peers may be stuck in a collective: abort the job */
    fprintf(stderr, "dtrain layout: %s\n", dt_err_msg());
    dt_comm_abort(1);
  }
  if (st != DT_OK) {
    if (rank == 0) fprintf(stderr, "dtrain layout: %s\n", dt_err_msg());
    MPI_Finalize();
    return st == DT_ERR_NOMEM || st == DT_ERR_INTERNAL ? 1 : 2;
  }
  dt_mesh_print(&m, stdout);
  dt_mesh_free(&m);
  MPI_Finalize();
  return 0;
}
