/* Launch layout and process mesh: who this rank is (world rank, host, node, local rank, threads,
 * CUDA device), a cross-check of the launcher's environment against MPI, and the dp x tp x pp
 * mesh with one communicator per axis. Ranks are ordered tp fastest, then pp, then dp:
 *   rank = (dp_idx*pp + pp_idx)*tp + tp_idx      (tp groups are consecutive ranks, one node)
 * Every check that can fail is agreed over the world, so all ranks return the same error. */
#ifndef DT_MESH_H
#define DT_MESH_H

#include <stddef.h>
#include <stdio.h>

#include "comm.h"
#include "cpuset.h"
#include "status.h"

#define DT_HOST_MAX 64
#define DT_DEVLIST_MAX 256

/* Which launcher started this process, decided from the environment (dt_launch_detect):
 *   MPIRUN: OMPI_COMM_WORLD_RANK is set. Open MPI's mpirun/orted started us; any SLURM_PROCID,
 *           SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS describe the job or the launcher step,
 *           not this rank, and are not checked. OMPI_COMM_WORLD_* are checked.
 *   SRUN:   no OMPI_COMM_WORLD_RANK, SLURM_PROCID set and SLURM_STEP_ID set to a regular step
 *           (not the batch/extern/interactive step ids >= 0xfffffff0): srun started this task,
 *           so SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (and SLURM_NODEID, per node) describe
 *           it and are checked.
 *   NONE:   anything else (singleton, batch script, salloc shell). If SLURM_JOB_ID is set with
 *           SLURM_NTASKS > 1 while MPI has one rank, dtrain was started without srun inside a
 *           multi-task job: an error (it would silently run 1 of N ranks).
 * torchrun-style RANK/WORLD_SIZE (and LOCAL_RANK) are checked whenever RANK and WORLD_SIZE are
 * both set, whatever the launcher. */
typedef enum { DT_LAUNCH_NONE, DT_LAUNCH_SRUN, DT_LAUNCH_MPIRUN } dt_launcher_t;

/* The launch environment as read; integers are -1 when unset, strings "" (has_* says set). */
typedef struct {
  char slurm_job_id[32];
  long long slurm_step_id;
  int slurm_procid, slurm_ntasks, slurm_localid, slurm_nodeid;
  int slurm_cpus_per_task, slurm_gpus_on_node, slurm_restart_count;
  int has_step_gpus, has_cvd;
  char slurm_step_gpus[DT_DEVLIST_MAX];
  char cuda_visible_devices[DT_DEVLIST_MAX];
  int ompi_rank, ompi_size, ompi_local_rank;
  int torch_rank, torch_world_size, torch_local_rank;
} dt_launch_env_t;

/* Read the variables above from the process environment. A variable that is set but not a
 * non-negative integer is an error naming it ("SLURM_NTASKS='abc' is not an integer"). */
dt_status_t dt_launch_env_read(dt_launch_env_t *e);
dt_launcher_t dt_launch_detect(const dt_launch_env_t *e);
const char *dt_launcher_name(dt_launcher_t l);
/* Cross-check the variables that describe this process against MPI's view (see the rule
 * above). host is only used in the message. Error: DT_ERR_LAUNCH, "rank R (host H): VAR=v but
 * MPI says w ...". */
dt_status_t dt_launch_check(const dt_launch_env_t *e, int rank, int size, int local_rank, const char *host);


/* Devices named by a CUDA_VISIBLE_DEVICES-style list: entries up to the first invalid one (a
 * negative or empty entry ends the list as it does for CUDA); "" -> 0. Indices and GPU-/MIG-
 * UUIDs both count. */
int dt_devlist_count(const char *list);
/* Distinct device names over n lists of DT_DEVLIST_MAX chars each (lists + i*DT_DEVLIST_MAX);
 * lists with has[i] == 0 are skipped. -1 if no list is present. */
int dt_devlist_union(const char *lists, const int *has, int n);
/* Devices visible to this process: CUDA_VISIBLE_DEVICES if set, else SLURM_STEP_GPUS if set,
 * else -1 (unknown: no list). *src (may be NULL) names the variable used. */
int dt_launch_visible_devices(const dt_launch_env_t *e, const char **src);
/* CUDA ordinal for a rank: 0 when the process sees exactly one device (Slurm gave this task
 * its own GPU), else its local rank (all ranks of the node share one list). */
int dt_mesh_device_ordinal(int local_rank, int n_visible);
/* The idx-th entry of a device list into out (the physical GPU a CUDA ordinal names); "-" and 0
 * if the list has no such entry. */
int dt_devlist_entry(const char *list, int idx, char *out, size_t n);

/* Another of n device ids (strings in slots of `stride` chars, e.g. the PCI bus ids of a node's
 * ranks) equal to slot me's, or -1 (also when slot me is "": unknown). */
int dt_devid_shared(const char *ids, size_t stride, int n, int me);

/* dp x tp x pp: *dp == 0 means world/(tp*pp). Error (same on every rank) if it does not fit. */
dt_status_t dt_mesh_resolve(int world, int *dp, int tp, int pp);
void dt_mesh_coords(int rank, int tp, int pp, int *dp_idx, int *pp_idx, int *tp_idx);
int dt_mesh_rank_of(int dp_idx, int pp_idx, int tp_idx, int tp, int pp);

typedef struct {
  int cuda;            /* 1: the backend will use one CUDA device per rank */
  int runtime_devices; /* devices the CUDA runtime reports, -1 = unknown (used when no list) */
  int threads;         /* [train] threads; 0 = auto */
  int dp, tp, pp;      /* [parallel]; dp 0 = auto */
  const char *args;    /* the dtrain arguments for hints in messages; NULL = "..." */
  int device_comm_mpi; /* 1: device buffers go over MPI, no NCCL (system.device_comm = mpi): with
                          DTRAIN_TEST_SHARED_GPU=1 (test-only) local ranks may share a GPU */
} dt_mesh_opts_t;

/* One row of the rank table (gathered from every rank). */
typedef struct {
  int rank, node, local_rank, local_size, device, threads;
  int slurm_nodeid, slurm_localid; /* -1 unset */
  int n_visible;                   /* -1 = no device list */
  int node_devices;                /* distinct devices over the node's ranks, -1 unknown */
  int dp_idx, pp_idx, tp_idx;
  char host[DT_HOST_MAX];
  char visible[48];                /* this process' CUDA_VISIBLE_DEVICES (or SLURM_STEP_GPUS), "-" */
  char gpu[48];                    /* the list entry the device ordinal names (physical GPU), "-" */
  char cpus[24];                   /* the rank's CPU affinity mask as a cpulist (cpuset.h) */
  int oversub;                     /* 1: more threads than CPUs (dt_cpuset_warning) */
} dt_rank_info_t;

typedef struct {
  int rank, size;            /* world */
  char host[DT_HOST_MAX];
  int node, n_nodes;         /* node index: nodes ordered by their lowest world rank */
  int local_rank, local_size;
  dt_launch_env_t env;
  dt_launcher_t launcher;
  int threads;
  const char *threads_src;   /* config, slurm, OMP_NUM_THREADS or cpus (dt_cpuset_threads) */
  dt_cpuset_t cpuset;        /* the CPUs this rank may run on */
  int pinned;                /* 1: OpenMP workers pinned inside the mask (dt_cpuset_pin) */
  int cuda;
  int n_visible;             /* devices this process sees, -1 unknown */
  int node_devices;          /* distinct devices over the node's ranks, -1 unknown */
  int device;                /* CUDA ordinal for this rank, -1 = CPU backend */
  int dp, tp, pp, dp_idx, tp_idx, pp_idx;
  dt_comm_t *world, *node_comm, *dp_comm, *tp_comm, *pp_comm;
  dt_rank_info_t *ranks;     /* size rows, on every rank */
  char note[512];            /* "" or a one-line note for rank 0 to print */
} dt_mesh_t;

/* Build the mesh (MPI must be initialised). Collective over MPI_COMM_WORLD. On error every
 * rank returns the same status and message (the lowest failing rank's) and m is freed. */
dt_status_t dt_mesh_init(dt_mesh_t *m, const dt_mesh_opts_t *o);
void dt_mesh_free(dt_mesh_t *m);
/* Rank 0 writes the '#'-prefixed rank table (and the note, if any); other ranks write nothing. */
void dt_mesh_print(const dt_mesh_t *m, FILE *out);

/* `dtrain layout [--backend auto|cpu|cuda] [--dp N] [--tp N] [--pp N] [--threads N]`:
 * MPI_Init, build the mesh, print the rank table, MPI_Finalize. argv[0] is "layout".
 * Returns 0, 2 (usage, layout or launch error, same on every rank) or 1 (runtime failure). */
int dt_layout_main(int argc, char **argv);

#endif
