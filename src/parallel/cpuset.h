/* The CPUs a rank may run on: its affinity mask (what mpirun --bind-to or srun's cpu binding left
 * it) and its cgroup's CPU quota (a container or Slurm's cgroup plugin), the thread count chosen
 * from them, the warning when a rank has more threads than CPUs, and pinning the OpenMP threads
 * inside a mask the launcher restricted. */
#ifndef DT_CPUSET_H
#define DT_CPUSET_H

typedef struct {
  int n_mask;     /* CPUs in the affinity mask */
  int n_online;   /* CPUs online on the host */
  double quota;   /* cgroup CPU quota in CPUs (quota / period), 0 = none */
  int avail;      /* CPUs this process can use: n_mask, capped by floor(quota) (at least 1) */
  char list[48];  /* the mask as a cpulist ("0-3,8"), "..." at the end when cut */
  int cpus[1024]; /* the mask's CPU numbers, ascending (the first n_mask entries, at most 1024) */
} dt_cpuset_t;

/* This process' mask and quota (from sched_getaffinity and cgroup v2 cpu.max or v1
 * cpu.cfs_quota_us / cpu.cfs_period_us, the tightest along the cgroup's path). Never fails: what
 * cannot be read counts as unrestricted. */
void dt_cpuset_read(dt_cpuset_t *c);

/* Write CPU numbers as a cpulist ("0-3,8,10-11") into buf (cut with "..." when it does not fit). */
void dt_cpuset_format(const int *cpus, int n, char *buf, int size);

/* Threads per rank: cfg_threads if > 0 ("config"); else slurm_cpus_per_task if > 0 ("slurm"); else
 * OMP_NUM_THREADS if omp_env > 0 ("OMP_NUM_THREADS"); else the CPUs this rank may use ("cpus"),
 * shared by the local_size ranks of the node when the mask is the whole host (no launcher
 * binding), at least 1. *src (may be NULL) gets the name in quotes above. */
int dt_cpuset_threads(const dt_cpuset_t *c, int cfg_threads, int slurm_cpus_per_task, int omp_env, int local_size,
                      const char **src);

/* The one-line warning (no newline) when `threads` threads per rank oversubscribe the CPUs: more
 * threads than this rank's CPU set allows, or (mask = the whole host, threads > 1) local_size
 * ranks x threads more than the host's CPUs (more single-threaded ranks than CPUs is the launch's
 * choice, which no thread count can fix: no warning). Names the rank, host, mask, quota and the launcher flags that fix it
 * (launcher: "mpirun", "srun" or anything else). Returns 0 and leaves buf "" when all fits. */
int dt_cpuset_warning(const dt_cpuset_t *c, int threads, int local_size, int rank, const char *host,
                      const char *launcher, char *buf, int size);

/* Pin OpenMP worker thread i (1..threads-1) to the mask's i-th CPU when a launcher restricted the
 * mask (n_mask < n_online), 2 <= threads <= n_mask, and the user set none of OMP_PROC_BIND,
 * OMP_PLACES, GOMP_CPU_AFFINITY. The master thread keeps the whole mask (threads that MPI, NCCL or
 * CUDA start later inherit it). Returns 1 if it pinned, 0 if it left placement to the OS. */
int dt_cpuset_pin(const dt_cpuset_t *c, int threads);

#endif
