/* The CPUs a rank may run on, the thread count chosen from them, the oversubscription warning and
 * thread pinning (cpuset.h). Linux: sched_getaffinity and the cgroup files; elsewhere the mask is
 * taken as the whole host. */
#include "cpuset.h"

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CG_ROOT "/sys/fs/cgroup"

/* ---- cgroup quota ------------------------------------------------------------------------- */

/* Quota in CPUs from cgroup v2 "cpu.max" ("max 100000" or "150000 100000"): 0 = none. */
static double quota_v2(const char *dir) {
  char path[4200], q[32];
  long long period = 0;
  snprintf(path, sizeof path, "%s/cpu.max", dir);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int n = fscanf(f, "%31s %lld", q, &period);
  fclose(f);
  if (n != 2 || period <= 0 || !strcmp(q, "max")) return 0;
  return atoll(q) > 0 ? (double)atoll(q) / (double)period : 0;
}

/* Quota in CPUs from cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us (quota -1 = none). */
static double quota_v1(const char *dir) {
  char path[4200];
  long long quota = -1, period = 0;
  snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int ok = fscanf(f, "%lld", &quota) == 1;
  fclose(f);
  snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
  if (!ok || !(f = fopen(path, "r"))) return 0;
  ok = fscanf(f, "%lld", &period) == 1;
  fclose(f);
  return ok && quota > 0 && period > 0 ? (double)quota / (double)period : 0;
}

/* The tightest quota along mount/rel and its parents (each level may set one); 0 = none. */
static double quota_walk(const char *mount, const char *rel, int v2) {
  char dir[4096];
  double best = 0;
  int found = 0;
  snprintf(dir, sizeof dir, "%s%s", mount, rel);
  for (;;) {
    double q = v2 ? quota_v2(dir) : quota_v1(dir);
    if (q >= 0) found = 1;
    if (q > 0 && (best == 0 || q < best)) best = q;
    char *slash = strrchr(dir, '/');
    if (!slash || (size_t)(slash - dir) < strlen(mount)) break;
    *slash = '\0';
  }
  if (!found && strcmp(rel, "/")) return quota_walk(mount, "/", v2); /* a cgroup namespace: its root */
  return best;
}

/* This process' CPU quota from /proc/self/cgroup (v2 "0::/path", v1 "N:cpu,cpuacct:/path"). */
static double cgroup_quota(void) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return 0;
  char line[4096];
  double best = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    const char *ctrl = c1 + 1, *rel = c2 + 1;
    double q = 0;
    if (!strcmp(line, "0") && !*ctrl) {
      q = quota_walk(CG_ROOT, rel, 1);
    } else {
      char list[256];
      snprintf(list, sizeof list, ",%s,", ctrl);
      if (!strstr(list, ",cpu,")) continue;
      static const char *mounts[] = {CG_ROOT "/cpu", CG_ROOT "/cpu,cpuacct", CG_ROOT "/cpuacct,cpu"};
      for (size_t i = 0; i < sizeof mounts / sizeof mounts[0] && q == 0; i++) q = quota_walk(mounts[i], rel, 0);
    }
    if (q > 0 && (best == 0 || q < best)) best = q;
  }
  fclose(f);
  return best;
}

/* ---- the set ------------------------------------------------------------------------------ */

void dt_cpuset_format(const int *cpus, int n, char *buf, int size) {
  int off = 0;
  buf[0] = '\0';
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && cpus[j + 1] == cpus[j] + 1) j++;
    char item[32];
    if (j > i)
      snprintf(item, sizeof item, "%s%d-%d", i ? "," : "", cpus[i], cpus[j]);
    else
      snprintf(item, sizeof item, "%s%d", i ? "," : "", cpus[i]);
    int len = (int)strlen(item);
    if (off + len + 4 > size) { /* keep room for "..." */
      snprintf(buf + off, (size_t)(size - off), "...");
      return;
    }
    memcpy(buf + off, item, (size_t)len + 1);
    off += len;
    i = j + 1;
  }
}

void dt_cpuset_read(dt_cpuset_t *c) {
  memset(c, 0, sizeof *c);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  c->n_online = online > 0 ? (int)online : 1;
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int i = 0; i < CPU_SETSIZE && c->n_mask < (int)(sizeof c->cpus / sizeof c->cpus[0]); i++)
      if (CPU_ISSET(i, &set)) c->cpus[c->n_mask++] = i;
  c->quota = cgroup_quota();
#endif
  if (c->n_mask == 0) /* unknown: the whole host */
    for (int i = 0; i < c->n_online && i < (int)(sizeof c->cpus / sizeof c->cpus[0]); i++) c->cpus[c->n_mask++] = i;
  c->avail = c->n_mask;
  if (c->quota > 0 && floor(c->quota) < c->avail) c->avail = floor(c->quota) >= 1 ? (int)floor(c->quota) : 1;
  dt_cpuset_format(c->cpus, c->n_mask, c->list, (int)sizeof c->list);
}

/* The mask is the whole host: no launcher bound this rank. */
static int unbound(const dt_cpuset_t *c) { return c->n_mask >= c->n_online; }

int dt_cpuset_threads(const dt_cpuset_t *c, int cfg_threads, int slurm_cpus_per_task, int omp_env, int local_size,
                      const char **src) {
  const char *s;
  int n;
  if (cfg_threads > 0) {
    s = "config";
    n = cfg_threads;
  } else if (slurm_cpus_per_task > 0) {
    s = "slurm";
    n = slurm_cpus_per_task;
  } else if (omp_env > 0) {
    s = "OMP_NUM_THREADS";
    n = omp_env;
  } else {
    s = "cpus";
    n = c->avail;
    if (unbound(c) && local_size > 1) n /= local_size; /* ranks of a node share an unbound host */
  }
  if (src) *src = s;
  return n > 0 ? n : 1;
}

int dt_cpuset_warning(const dt_cpuset_t *c, int threads, int local_size, int rank, const char *host,
                      const char *launcher, char *buf, int size) {
  char quota[48] = "";
  if (c->quota > 0) snprintf(quota, sizeof quota, ", cgroup quota %.2f CPUs", c->quota);
  const char *fix = !strcmp(launcher, "mpirun") ? "mpirun --bind-to none or --map-by slot:PE=%d"
                    : !strcmp(launcher, "srun") ? "srun --cpus-per-task=%d"
                                                : "mpirun --map-by slot:PE=%d or srun --cpus-per-task=%d";
  char how[96];
  snprintf(how, sizeof how, fix, threads, threads);
  buf[0] = '\0';
  if (threads > c->avail)
    snprintf(buf, (size_t)size,
             "warning: rank %d (host %s) runs %d threads on %d CPU%s (mask %s%s): every step will be slower; "
             "give each rank %d CPUs (%s) or set train.threads=%d",
             rank, host, threads, c->avail, c->avail == 1 ? "" : "s", c->list, quota, threads, how, c->avail);
  else if (unbound(c) && local_size > 1 && threads > 1 && (long)threads * local_size > c->avail)
    snprintf(buf, (size_t)size,
             "warning: host %s runs %d ranks x %d threads on %d CPUs (mask %s%s): every step will be slower; "
             "set train.threads=%d (or 0)",
             host, local_size, threads, c->avail, c->list, quota, c->avail / local_size > 0 ? c->avail / local_size : 1);
  return buf[0] != '\0';
}

int dt_cpuset_pin(const dt_cpuset_t *c, int threads) {
  if (unbound(c) || threads < 2 || threads > c->n_mask || getenv("OMP_PROC_BIND") || getenv("OMP_PLACES") ||
      getenv("GOMP_CPU_AFFINITY"))
    return 0;
  int ok = 1;
#ifdef __linux__
  omp_set_num_threads(threads);
#pragma omp parallel num_threads(threads) reduction(&& : ok)
  {
    int t = omp_get_thread_num();
    if (t > 0) { /* the master keeps the mask: threads started later (MPI, NCCL, CUDA) inherit it */
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c->cpus[t], &one);
      ok = sched_setaffinity(0, sizeof one, &one) == 0; /* pid 0: the calling thread */
    }
  }
#else
  ok = 0;
#endif
  return ok;
}
