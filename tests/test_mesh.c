/* Launch layout, pure parts: environment parsing, the launcher rule and the cross-checks, threads,
 * device lists and ordinals, mesh sizes and coordinates. The environment is set with setenv. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mesh.h"

static const char *vars[] = {"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                             "SLURM_NODEID", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS",
                             "SLURM_RESTART_COUNT", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "RANK", "WORLD_SIZE",
                             "LOCAL_RANK", NULL};

static void clean_env(void) {
  for (int i = 0; vars[i]; i++) unsetenv(vars[i]);
  dt_err_clear();
}

static dt_launch_env_t read_env(void) {
  dt_launch_env_t e;
  cr_assert_eq(dt_launch_env_read(&e), DT_OK, "%s", dt_err_msg());
  return e;
}

/* An srun task: rank 5 of 8, local 1, node 2, job 77 step 0. */
static void srun_env(void) {
  clean_env();
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NODEID", "2", 1);
}

static void expect_check_err(const dt_launch_env_t *e, int rank, int size, int local, const char *msg) {
  dt_err_clear();
  cr_expect_eq(dt_launch_check(e, rank, size, local, "h1"), DT_ERR_LAUNCH, "accepted (want '%s')", msg);
  cr_expect(strstr(dt_err_msg(), msg) != NULL, "message '%s' lacks '%s'", dt_err_msg(), msg);
}

Test(mesh, env_read) {
  clean_env();
  dt_launch_env_t e = read_env();
  cr_expect_eq(e.slurm_procid, -1);
  cr_expect_eq(e.slurm_step_id, -1);
  cr_expect_eq(e.has_cvd, 0);
  cr_expect_str_eq(e.slurm_job_id, "");
  srun_env();
  setenv("SLURM_CPUS_PER_TASK", "3", 1);
  setenv("SLURM_GPUS_ON_NODE", "4", 1);
  setenv("SLURM_STEP_GPUS", "0,1,2,3", 1);
  setenv("SLURM_RESTART_COUNT", "2", 1);
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  e = read_env();
  cr_expect_str_eq(e.slurm_job_id, "77");
  cr_expect_eq(e.slurm_procid, 5);
  cr_expect_eq(e.slurm_ntasks, 8);
  cr_expect_eq(e.slurm_localid, 1);
  cr_expect_eq(e.slurm_nodeid, 2);
  cr_expect_eq(e.slurm_cpus_per_task, 3);
  cr_expect_eq(e.slurm_gpus_on_node, 4);
  cr_expect_eq(e.slurm_restart_count, 2);
  cr_expect_str_eq(e.slurm_step_gpus, "0,1,2,3");
  cr_expect_eq(e.has_cvd, 1);
  setenv("SLURM_NTASKS", "4x", 1);
  dt_launch_env_t f;
  cr_expect_eq(dt_launch_env_read(&f), DT_ERR_LAUNCH);
  cr_expect(strstr(dt_err_msg(), "SLURM_NTASKS='4x' is not a non-negative integer"), "%s", dt_err_msg());
  clean_env();
  setenv("RANK", "-1", 1);
  cr_expect_eq(dt_launch_env_read(&f), DT_ERR_LAUNCH);
  cr_expect(strstr(dt_err_msg(), "RANK='-1'"), "%s", dt_err_msg());
  clean_env();
}

Test(mesh, launcher_rule) {
  clean_env();
  dt_launch_env_t e = read_env();
  cr_expect_eq(dt_launch_detect(&e), DT_LAUNCH_NONE);
  srun_env();
  e = read_env();
  cr_expect_eq(dt_launch_detect(&e), DT_LAUNCH_SRUN);
  /* the batch step (SLURM_BATCH_SCRIPT = 0xfffffffb) is not an srun step */
  setenv("SLURM_STEP_ID", "4294967291", 1);
  e = read_env();
  cr_expect_eq(dt_launch_detect(&e), DT_LAUNCH_NONE);
  /* no step id (salloc shell): not srun */
  unsetenv("SLURM_STEP_ID");
  e = read_env();
  cr_expect_eq(dt_launch_detect(&e), DT_LAUNCH_NONE);
  /* mpirun inside an srun step or an allocation: OMPI wins */
  srun_env();
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  e = read_env();
  cr_expect_eq(dt_launch_detect(&e), DT_LAUNCH_MPIRUN);
  cr_expect_str_eq(dt_launcher_name(DT_LAUNCH_MPIRUN), "mpirun");
  clean_env();
}

Test(mesh, check_srun) {
  srun_env();
  dt_launch_env_t e = read_env();
  cr_expect_eq(dt_launch_check(&e, 5, 8, 1, "h1"), DT_OK, "%s", dt_err_msg());
  expect_check_err(&e, 5, 4, 1, "rank 5 (host h1): SLURM_NTASKS=8 but MPI world size is 4");
  expect_check_err(&e, 4, 8, 1, "rank 4 (host h1): SLURM_PROCID=5 but MPI rank is 4");
  expect_check_err(&e, 5, 8, 0, "SLURM_LOCALID=1 but MPI local rank is 0");
  expect_check_err(&e, 0, 1, 0, "use srun --mpi=pmix");
  clean_env();
}

Test(mesh, check_mpirun_ignores_slurm_rank_vars) {
  /* mpirun -n 4 inside an allocation: SLURM_PROCID/LOCALID/NTASKS describe the launcher */
  srun_env();
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
  dt_launch_env_t e = read_env();
  cr_expect_eq(dt_launch_check(&e, 2, 4, 2, "h1"), DT_OK, "%s", dt_err_msg());
  expect_check_err(&e, 2, 5, 2, "OMPI_COMM_WORLD_SIZE=4 but MPI world size is 5");
  expect_check_err(&e, 1, 4, 2, "OMPI_COMM_WORLD_RANK=2 but MPI rank is 1");
  expect_check_err(&e, 2, 4, 0, "OMPI_COMM_WORLD_LOCAL_RANK=2 but MPI local rank is 0");
  clean_env();
}

Test(mesh, check_no_launcher) {
  clean_env();
  dt_launch_env_t e = read_env();
  cr_expect_eq(dt_launch_check(&e, 0, 1, 0, "h1"), DT_OK);
  /* a batch script or salloc shell running dtrain directly in a 4-task job */
  setenv("SLURM_JOB_ID", "12", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_PROCID", "0", 1);
  e = read_env();
  expect_check_err(&e, 0, 1, 0, "SLURM_NTASKS=4 but MPI world size is 1: dtrain was started without srun inside Slurm job 12");
  setenv("SLURM_NTASKS", "1", 1);
  e = read_env();
  cr_expect_eq(dt_launch_check(&e, 0, 1, 0, "h1"), DT_OK, "%s", dt_err_msg());
  clean_env();
}

Test(mesh, check_torchrun_vars) {
  clean_env();
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  dt_launch_env_t e = read_env();
  cr_expect_eq(dt_launch_check(&e, 1, 2, 1, "h1"), DT_OK, "%s", dt_err_msg());
  expect_check_err(&e, 1, 3, 1, "WORLD_SIZE=2 but MPI world size is 3");
  expect_check_err(&e, 0, 2, 1, "RANK=1 but MPI rank is 0");
  expect_check_err(&e, 1, 2, 0, "LOCAL_RANK=1 but MPI local rank is 0");
  unsetenv("WORLD_SIZE"); /* RANK alone is too generic a name to trust */
  e = read_env();
  cr_expect_eq(dt_launch_check(&e, 0, 3, 0, "h1"), DT_OK, "%s", dt_err_msg());
  clean_env();
}

static dt_cpuset_t cpus_of(int n_mask, int n_online, double quota) {
  dt_cpuset_t c;
  memset(&c, 0, sizeof c);
  c.n_mask = n_mask;
  c.n_online = n_online;
  c.quota = quota;
  for (int i = 0; i < n_mask; i++) c.cpus[i] = 2 * i; /* 0,2,4,...: no ranges */
  c.avail = quota > 0 && (int)quota < n_mask ? ((int)quota > 0 ? (int)quota : 1) : n_mask;
  dt_cpuset_format(c.cpus, n_mask, c.list, (int)sizeof c.list);
  return c;
}

Test(mesh, threads) {
  const char *src;
  dt_cpuset_t host8 = cpus_of(8, 8, 0), bound1 = cpus_of(1, 8, 0), quota3 = cpus_of(8, 8, 3.5);
  cr_expect_eq(dt_cpuset_threads(&host8, 0, 0, 0, 1, &src), 8);
  cr_expect_str_eq(src, "cpus");
  cr_expect_eq(dt_cpuset_threads(&host8, 0, 0, 0, 2, &src), 4, "2 unbound ranks share the host");
  cr_expect_eq(dt_cpuset_threads(&host8, 0, 0, 0, 16, &src), 1);
  cr_expect_eq(dt_cpuset_threads(&bound1, 0, 0, 0, 4, &src), 1, "a bound rank owns its mask");
  cr_expect_eq(dt_cpuset_threads(&quota3, 0, 0, 0, 1, &src), 3, "a quota of 3.5 CPUs runs 3 threads");
  cr_expect_eq(dt_cpuset_threads(&host8, 0, 0, 5, 2, &src), 5);
  cr_expect_str_eq(src, "OMP_NUM_THREADS");
  cr_expect_eq(dt_cpuset_threads(&host8, 0, 3, 5, 2, &src), 3);
  cr_expect_str_eq(src, "slurm");
  cr_expect_eq(dt_cpuset_threads(&host8, 2, 3, 5, 2, &src), 2);
  cr_expect_str_eq(src, "config");
}

Test(mesh, cpuset_warning) {
  char w[512];
  dt_cpuset_t host2 = cpus_of(2, 2, 0), bound1 = cpus_of(1, 2, 0), quota1 = cpus_of(4, 4, 1.0);
  cr_expect_eq(dt_cpuset_warning(&host2, 2, 1, 0, "h", "mpirun", w, sizeof w), 0);
  cr_expect_str_eq(w, "");
  cr_expect_eq(dt_cpuset_warning(&host2, 1, 2, 0, "h", "mpirun", w, sizeof w), 0, "2 ranks x 1 thread fit");
  cr_expect_eq(dt_cpuset_warning(&host2, 1, 4, 0, "h", "mpirun", w, sizeof w), 0, "more 1-thread ranks than CPUs");
  cr_expect_eq(dt_cpuset_warning(&bound1, 2, 1, 3, "h", "mpirun", w, sizeof w), 1);
  cr_expect(strstr(w, "rank 3 (host h) runs 2 threads on 1 CPU (mask 0)") != NULL, "%s", w);
  cr_expect(strstr(w, "--bind-to none") != NULL && strstr(w, "train.threads=1") != NULL, "%s", w);
  cr_expect_eq(dt_cpuset_warning(&bound1, 2, 1, 0, "h", "srun", w, sizeof w), 1);
  cr_expect(strstr(w, "srun --cpus-per-task=2") != NULL, "%s", w);
  cr_expect_eq(dt_cpuset_warning(&quota1, 2, 1, 0, "h", "none", w, sizeof w), 1);
  cr_expect(strstr(w, "cgroup quota 1.00 CPUs") != NULL, "%s", w);
  cr_expect_eq(dt_cpuset_warning(&host2, 2, 2, 0, "h", "mpirun", w, sizeof w), 1);
  cr_expect(strstr(w, "2 ranks x 2 threads on 2 CPUs") != NULL, "%s", w);
}

Test(mesh, cpuset_read_and_format) {
  dt_cpuset_t c;
  dt_cpuset_read(&c);
  cr_expect(c.n_mask >= 1 && c.avail >= 1 && c.avail <= c.n_mask && c.n_mask <= c.n_online + 0, "%d %d %d", c.n_mask,
            c.avail, c.n_online);
  char buf[16];
  int cpus[] = {0, 1, 2, 3, 8, 10, 11, 20, 21, 22, 23, 24, 30, 31};
  dt_cpuset_format(cpus, 4, buf, sizeof buf);
  cr_expect_str_eq(buf, "0-3");
  dt_cpuset_format(cpus, 7, buf, sizeof buf);
  cr_expect_str_eq(buf, "0-3,8,10-11");
  dt_cpuset_format(cpus, 14, buf, sizeof buf);
  cr_expect_str_eq(buf, "0-3,8,10-11...");
}

Test(mesh, device_lists) {
  cr_expect_eq(dt_devlist_count(""), 0);
  cr_expect_eq(dt_devlist_count("0"), 1);
  cr_expect_eq(dt_devlist_count("0,1,2,3"), 4);
  cr_expect_eq(dt_devlist_count("2, 3"), 2);
  cr_expect_eq(dt_devlist_count("GPU-8e1a3c2b-1111,GPU-22aa"), 2);
  cr_expect_eq(dt_devlist_count("MIG-abc"), 1);
  cr_expect_eq(dt_devlist_count("-1"), 0);          /* CUDA: hide all devices */
  cr_expect_eq(dt_devlist_count("0,1,-1,3"), 2);    /* enumeration stops at an invalid entry */
  cr_expect_eq(dt_devlist_count("NoDevFiles"), 0);
  cr_expect_eq(dt_devlist_count("0,,1"), 1);

  clean_env();
  dt_launch_env_t e = read_env();
  const char *src;
  cr_expect_eq(dt_launch_visible_devices(&e, &src), -1);
  cr_expect_null(src);
  setenv("SLURM_STEP_GPUS", "0,1", 1);
  e = read_env();
  cr_expect_eq(dt_launch_visible_devices(&e, &src), 2);
  cr_expect_str_eq(src, "SLURM_STEP_GPUS");
  setenv("CUDA_VISIBLE_DEVICES", "3", 1); /* what CUDA sees wins */
  e = read_env();
  cr_expect_eq(dt_launch_visible_devices(&e, &src), 1);
  cr_expect_str_eq(src, "CUDA_VISIBLE_DEVICES");
  clean_env();

  /* --gpus-per-task=1: each task its own single device -> ordinal 0 */
  cr_expect_eq(dt_mesh_device_ordinal(3, 1), 0);
  /* --gpus-per-node=4 --ntasks-per-node=4: a shared list -> the local rank */
  cr_expect_eq(dt_mesh_device_ordinal(3, 4), 3);
  cr_expect_eq(dt_mesh_device_ordinal(2, -1), 2);
  char g[16];
  cr_expect_eq(dt_devlist_entry("4,5,6,7", 2, g, sizeof g), 1);
  cr_expect_str_eq(g, "6");
  cr_expect_eq(dt_devlist_entry("GPU-aa, GPU-bb", 1, g, sizeof g), 1);
  cr_expect_str_eq(g, "GPU-bb");
  cr_expect_eq(dt_devlist_entry("0,1", 2, g, sizeof g), 0);
  cr_expect_str_eq(g, "-");
}

Test(mesh, resolve) {
  int dp = 0;
  cr_expect_eq(dt_mesh_resolve(8, &dp, 2, 2), DT_OK);
  cr_expect_eq(dp, 2);
  dp = 0;
  cr_expect_eq(dt_mesh_resolve(8, &dp, 1, 1), DT_OK);
  cr_expect_eq(dp, 8);
  dp = 4;
  cr_expect_eq(dt_mesh_resolve(8, &dp, 2, 1), DT_OK);
  dt_err_clear();
  dp = 3;
  cr_expect_eq(dt_mesh_resolve(4, &dp, 2, 1), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "dp=3 x tp=2 x pp=1 = 6 ranks but the world has 4 ranks"), "%s", dt_err_msg());
  dt_err_clear();
  dp = 0;
  cr_expect_eq(dt_mesh_resolve(6, &dp, 4, 1), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "tp=4 x pp=1 = 4 does not divide the world size 6"), "%s", dt_err_msg());
  dt_err_clear();
  dp = 0;
  cr_expect_eq(dt_mesh_resolve(4, &dp, 0, 1), DT_ERR_CONFIG);
  dt_err_clear();
}

Test(mesh, coords) {
  /* dp=2 x pp=3 x tp=4 = 24: hand-checked ranks */
  int d, p, t;
  dt_mesh_coords(0, 4, 3, &d, &p, &t);
  cr_expect(d == 0 && p == 0 && t == 0);
  dt_mesh_coords(3, 4, 3, &d, &p, &t);
  cr_expect(d == 0 && p == 0 && t == 3);
  dt_mesh_coords(4, 4, 3, &d, &p, &t);
  cr_expect(d == 0 && p == 1 && t == 0);
  dt_mesh_coords(13, 4, 3, &d, &p, &t); /* 13 = (1*3 + 0)*4 + 1 */
  cr_expect(d == 1 && p == 0 && t == 1, "13 -> %d %d %d", d, p, t);
  dt_mesh_coords(23, 4, 3, &d, &p, &t);
  cr_expect(d == 1 && p == 2 && t == 3);
  /* round trip over the whole mesh, every coordinate triple hit exactly once */
  int seen[24] = {0};
  for (int r = 0; r < 24; r++) {
    dt_mesh_coords(r, 4, 3, &d, &p, &t);
    cr_expect(d >= 0 && d < 2 && p >= 0 && p < 3 && t >= 0 && t < 4);
    cr_expect_eq(dt_mesh_rank_of(d, p, t, 4, 3), r);
    seen[(d * 3 + p) * 4 + t]++;
  }
  for (int i = 0; i < 24; i++) cr_expect_eq(seen[i], 1);
}

Test(mesh, device_union) {
  /* per node: the distinct devices over its ranks' lists (what Slurm gave the node's tasks) */
  char lists[4][DT_DEVLIST_MAX] = {{0}};
  int has[4] = {1, 1, 1, 1};
  strcpy(lists[0], "0");
  strcpy(lists[1], "1");
  strcpy(lists[2], "2");
  strcpy(lists[3], "3");
  cr_expect_eq(dt_devlist_union(&lists[0][0], has, 4), 4); /* --gpus-per-task=1 */
  for (int i = 0; i < 4; i++) strcpy(lists[i], "0,1,2,3");
  cr_expect_eq(dt_devlist_union(&lists[0][0], has, 4), 4); /* one shared list */
  strcpy(lists[0], "0,1");
  strcpy(lists[1], "2,3");
  cr_expect_eq(dt_devlist_union(&lists[0][0], has, 2), 4); /* --gpus-per-task=2: 2 tasks, 4 GPUs */
  int none[2] = {0, 0};
  cr_expect_eq(dt_devlist_union(&lists[0][0], none, 2), -1);
  strcpy(lists[0], "");
  cr_expect_eq(dt_devlist_union(&lists[0][0], has, 1), 0); /* CUDA_VISIBLE_DEVICES="" hides all */
}

/* The one-rank-per-GPU check's comparison (mesh.c check_shared_gpu gathers the PCI bus ids of a
 * node's ranks): a rank whose GPU another rank also names is found; unknown ("") never matches. */
Test(mesh, shared_gpu) {
  char ids[4][32] = {"0000:41:00.0", "0000:61:00.0", "0000:41:00.0", ""};
  cr_expect_eq(dt_devid_shared(&ids[0][0], 32, 4, 0), 2);
  cr_expect_eq(dt_devid_shared(&ids[0][0], 32, 4, 2), 0);
  cr_expect_eq(dt_devid_shared(&ids[0][0], 32, 4, 1), -1);
  cr_expect_eq(dt_devid_shared(&ids[0][0], 32, 4, 3), -1);
  char none[2][32] = {"", ""};
  cr_expect_eq(dt_devid_shared(&none[0][0], 32, 2, 0), -1, "two unknown devices are not the same device");
}
