/* Launch environment and mesh arithmetic (mesh.h), the pure half: reading and cross-checking the
 * launcher's variables, CUDA device lists and ordinals, dp x tp x pp sizes and
 * coordinates. No MPI calls here, so tests/test_mesh.c checks all of it with setenv. */
#include "mesh.h"

#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- environment ------------------------------------------------------------------------- */

static dt_status_t env_ll(const char *name, long long *out) {
  *out = -1;
  const char *v = getenv(name);
  if (!v) return DT_OK;
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end != '\0' || errno || x < 0)
    return DT_ERR(DT_ERR_LAUNCH, "environment: %s='%s' is not a non-negative integer", name, v);
  *out = x;
  return DT_OK;
}

static dt_status_t env_int(const char *name, int *out) {
  long long x;
  DT_TRY(env_ll(name, &x));
  if (x > INT_MAX) return DT_ERR(DT_ERR_LAUNCH, "environment: %s=%lld is too large", name, x);
  *out = (int)x;
  return DT_OK;
}

static int env_str(const char *name, char *out, size_t n) {
  const char *v = getenv(name);
  snprintf(out, n, "%s", v ? v : "");
  return v != NULL;
}

dt_status_t dt_launch_env_read(dt_launch_env_t *e) {
  memset(e, 0, sizeof *e);
  env_str("SLURM_JOB_ID", e->slurm_job_id, sizeof e->slurm_job_id);
  DT_TRY(env_ll("SLURM_STEP_ID", &e->slurm_step_id));
  DT_TRY(env_int("SLURM_PROCID", &e->slurm_procid));
  DT_TRY(env_int("SLURM_NTASKS", &e->slurm_ntasks));
  DT_TRY(env_int("SLURM_LOCALID", &e->slurm_localid));
  DT_TRY(env_int("SLURM_NODEID", &e->slurm_nodeid));
  DT_TRY(env_int("SLURM_CPUS_PER_TASK", &e->slurm_cpus_per_task));
  DT_TRY(env_int("SLURM_GPUS_ON_NODE", &e->slurm_gpus_on_node));
  DT_TRY(env_int("SLURM_RESTART_COUNT", &e->slurm_restart_count));
  e->has_step_gpus = env_str("SLURM_STEP_GPUS", e->slurm_step_gpus, sizeof e->slurm_step_gpus);
  e->has_cvd = env_str("CUDA_VISIBLE_DEVICES", e->cuda_visible_devices, sizeof e->cuda_visible_devices);
  DT_TRY(env_int("OMPI_COMM_WORLD_RANK", &e->ompi_rank));
  DT_TRY(env_int("OMPI_COMM_WORLD_SIZE", &e->ompi_size));
  DT_TRY(env_int("OMPI_COMM_WORLD_LOCAL_RANK", &e->ompi_local_rank));
  DT_TRY(env_int("RANK", &e->torch_rank));
  DT_TRY(env_int("WORLD_SIZE", &e->torch_world_size));
  DT_TRY(env_int("LOCAL_RANK", &e->torch_local_rank));
  return DT_OK;
}

dt_launcher_t dt_launch_detect(const dt_launch_env_t *e) {
  if (e->ompi_rank >= 0) return DT_LAUNCH_MPIRUN;
  /* Slurm's special step ids (batch 0xfffffffb, extern 0xfffffffc, interactive...) are >= 0xfffffff0. */
  if (e->slurm_procid >= 0 && e->slurm_step_id >= 0 && e->slurm_step_id < 0xfffffff0LL) return DT_LAUNCH_SRUN;
  return DT_LAUNCH_NONE;
}

const char *dt_launcher_name(dt_launcher_t l) {
  switch (l) {
    case DT_LAUNCH_SRUN: return "srun";
    case DT_LAUNCH_MPIRUN: return "mpirun";
    default: return "none";
  }
}

#define MISMATCH(var, val, what, mpi, hint)                                                             \
  DT_ERR(DT_ERR_LAUNCH, "rank %d (host %s): %s=%d but MPI %s is %d%s", rank, host, var, val, what, mpi, hint)

dt_status_t dt_launch_check(const dt_launch_env_t *e, int rank, int size, int local_rank, const char *host) {
  switch (dt_launch_detect(e)) {
    case DT_LAUNCH_MPIRUN:
      if (e->ompi_rank != rank) return MISMATCH("OMPI_COMM_WORLD_RANK", e->ompi_rank, "rank", rank, "");
      if (e->ompi_size >= 0 && e->ompi_size != size)
        return MISMATCH("OMPI_COMM_WORLD_SIZE", e->ompi_size, "world size", size, "");
      if (e->ompi_local_rank >= 0 && e->ompi_local_rank != local_rank)
        return MISMATCH("OMPI_COMM_WORLD_LOCAL_RANK", e->ompi_local_rank, "local rank", local_rank, "");
      break;
    case DT_LAUNCH_SRUN:
      if (e->slurm_ntasks >= 0 && e->slurm_ntasks != size)
        return MISMATCH("SLURM_NTASKS", e->slurm_ntasks, "world size", size,
                        size == 1 ? " (the srun tasks did not join one MPI job: use srun --mpi=pmix)" : "");
      if (e->slurm_procid != rank) return MISMATCH("SLURM_PROCID", e->slurm_procid, "rank", rank, "");
      if (e->slurm_localid >= 0 && e->slurm_localid != local_rank)
        return MISMATCH("SLURM_LOCALID", e->slurm_localid, "local rank", local_rank, "");
      break;
    case DT_LAUNCH_NONE:
      if (e->slurm_job_id[0] && e->slurm_ntasks > 1 && size == 1)
        return DT_ERR(DT_ERR_LAUNCH,
                      "rank %d (host %s): SLURM_NTASKS=%d but MPI world size is 1: dtrain was started without "
                      "srun inside Slurm job %s; launch it with srun (e.g. srun ./dtrain ...)",
                      rank, host, e->slurm_ntasks, e->slurm_job_id);
      break;
  }
  if (e->torch_rank >= 0 && e->torch_world_size >= 0) {
    if (e->torch_world_size != size) return MISMATCH("WORLD_SIZE", e->torch_world_size, "world size", size, "");
    if (e->torch_rank != rank) return MISMATCH("RANK", e->torch_rank, "rank", rank, "");
    if (e->torch_local_rank >= 0 && e->torch_local_rank != local_rank)
      return MISMATCH("LOCAL_RANK", e->torch_local_rank, "local rank", local_rank, "");
  }
  return DT_OK;
}

/* ---- devices ----------------------------------------------------------------------------- */

/* Next entry of a comma list into buf; returns 0 at the end or at an entry CUDA would stop at. */
static int devlist_next(const char **p, char *buf, size_t n) {
  const char *s = *p;
  if (!s || !*s) return 0;
  while (*s == ' ') s++;
  size_t len = strcspn(s, ",");
  size_t l = len;
  while (l > 0 && s[l - 1] == ' ') l--;
  if (l == 0 || l >= n) return 0;
  memcpy(buf, s, l);
  buf[l] = '\0';
  *p = s[len] ? s + len + 1 : s + len;
  if (!strncmp(buf, "GPU-", 4) || !strncmp(buf, "MIG-", 4)) return 1;
  char *end;
  long v = strtol(buf, &end, 10);
  return *end == '\0' && v >= 0;
}

int dt_devlist_count(const char *list) {
  char buf[DT_DEVLIST_MAX];
  int n = 0;
  while (devlist_next(&list, buf, sizeof buf)) n++;
  return n;
}

int dt_launch_visible_devices(const dt_launch_env_t *e, const char **src) {
  if (e->has_cvd) {
    if (src) *src = "CUDA_VISIBLE_DEVICES";
    return dt_devlist_count(e->cuda_visible_devices);
  }
  if (e->has_step_gpus) {
    if (src) *src = "SLURM_STEP_GPUS";
    return dt_devlist_count(e->slurm_step_gpus);
  }
  if (src) *src = NULL;
  return -1;
}

int dt_mesh_device_ordinal(int local_rank, int n_visible) { return n_visible == 1 ? 0 : local_rank; }

int dt_devlist_entry(const char *list, int idx, char *out, size_t n) {
  char buf[DT_DEVLIST_MAX];
  for (int i = 0; devlist_next(&list, buf, sizeof buf); i++)
    if (i == idx) {
      snprintf(out, n, "%s", buf);
      return 1;
    }
  snprintf(out, n, "-");
  return 0;
}

int dt_devlist_union(const char *lists, const int *has, int n) {
  int any = 0, count = 0;
  char(*seen)[64] = calloc((size_t)n * 16 + 1, sizeof *seen);
  if (!seen) return -1;
  for (int i = 0; i < n; i++) {
    if (!has[i]) continue;
    any = 1;
    const char *p = lists + (size_t)i * DT_DEVLIST_MAX;
    char buf[DT_DEVLIST_MAX];
    while (devlist_next(&p, buf, sizeof buf)) {
      int dup = 0;
      for (int j = 0; j < count && !dup; j++) dup = !strncmp(seen[j], buf, 63);
      if (!dup && count < n * 16) snprintf(seen[count++], 64, "%.63s", buf);
    }
  }
  free(seen);
  return any ? count : -1;
}

/* ---- mesh arithmetic ------------------------------------------------------------------- */

dt_status_t dt_mesh_resolve(int world, int *dp, int tp, int pp) {
  if (tp < 1 || pp < 1 || *dp < 0)
    return DT_ERR(DT_ERR_CONFIG, "[parallel] dp=%d tp=%d pp=%d: tp and pp must be >= 1 and dp >= 0", *dp, tp, pp);
  if (*dp == 0) {
    if (world % (tp * pp) != 0)
      return DT_ERR(DT_ERR_CONFIG,
                    "[parallel] tp=%d x pp=%d = %d does not divide the world size %d (ranks started by "
                    "srun/mpirun); use a world size that is a multiple of %d",
                    tp, pp, tp * pp, world, tp * pp);
    *dp = world / (tp * pp);
  } else if ((long long)*dp * tp * pp != world) {
    return DT_ERR(DT_ERR_CONFIG,
                  "[parallel] dp=%d x tp=%d x pp=%d = %lld ranks but the world has %d ranks (started by "
                  "srun/mpirun); set dp=0 (auto) or start %lld ranks",
                  *dp, tp, pp, (long long)*dp * tp * pp, world, (long long)*dp * tp * pp);
  }
  return DT_OK;
}

void dt_mesh_coords(int rank, int tp, int pp, int *dp_idx, int *pp_idx, int *tp_idx) {
  *tp_idx = rank % tp;
  *pp_idx = (rank / tp) % pp;
  *dp_idx = rank / (tp * pp);
}

int dt_mesh_rank_of(int dp_idx, int pp_idx, int tp_idx, int tp, int pp) { return (dp_idx * pp + pp_idx) * tp + tp_idx; }

int dt_devid_shared(const char *ids, size_t stride, int n, int me) {
  const char *mine = ids + (size_t)me * stride;
  if (!mine[0]) return -1;
  for (int i = 0; i < n; i++)
    if (i != me && !strncmp(ids + (size_t)i * stride, mine, stride)) return i;
  return -1;
}
