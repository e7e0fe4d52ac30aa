/* Test-only fault injection, for the test suite and validation/ to prove they catch failures.
 * DTRAIN_FAULT="name@rank[:step]" plants one fault on one rank (all ranks when rank is '*'),
 * from `step` on (default: at once; faults marked "at" only at exactly that step). Never set it
 * in production. Names in use:
 *   ckpt_kill      SIGKILL this rank in the middle of writing a checkpoint's datasets (after half
 *                  of them; a rank that writes no part of the file dies on entering the save);
 *                  the line it prints first says which
 *   ckpt_noflush   a checkpoint whose completion marker is never written (the file is committed
 *                  but incomplete, as after a lost flush); rank 0 decides (rank field: 0 or '*')
 *   bad_math       from `step` on, this rank's gradients of the first transformer block are
 *                  multiplied by DT_FAULT_BAD_MATH_SCALE after the all-reduce (wrong arithmetic
 *                  in one layer on one rank; device arenas through a host copy)
 *   slow_rank      this rank sleeps DT_FAULT_SLOW_RANK_S seconds in every step from `step` on
 *                  (GPT-2: after backward; the image classifiers: before forward)
 *   slow_io        every checkpoint save of this rank lasts DT_FAULT_SLOW_IO_X times as long: after
 *                  the save it sleeps (X - 1) times the save's duration, and every rank waits for
 *                  it before the save's time is taken, so the measured bandwidth drops by X
 *                  whatever the disk's speed
 *   bad_allreduce  float (f32/f64) results of blocking allreduce/reduce_scatter/allgather on this
 *                  rank get +1 in one element (MPI communicator, comm_mpi.c)
 *   grad_inf       at exactly step `step` (1-based), one gradient of this rank (the first of
 *                  block 0) becomes +inf after the all-reduce, before the norm: with
 *                  precision = fp16 every rank must skip that step and halve the loss scale
 *                  (tests/precision_scaler.sh); otherwise the run stops on the non-finite norm
 *   tied_drift     with pp > 1 only, from `step` on, this rank's gradient of wte is scaled like
 *                  bad_math after the pipeline's tied-embedding sum (the first and last stage's
 *                  copies of the tied embedding drift apart: the save refuses, tests/pp_equiv.sh;
 *                  validation/'s model_parallel check fails first)
 *   bn_local       from `step` on, this rank's batch norm uses its own images' statistics (the image
 *                  classifiers with dp > 1: synchronised batch norm broken on one rank; validation/'s
 *                  cnn check fails)
 *   stall_start    this rank stops itself (SIGSTOP) before the first collective of a training run:
 *                  a rank that never arrives; the hang watchdog's start deadline ends the job
 *                  (tests/hang_rank.sh)
 *   stall          at exactly step `step` this rank stops itself (SIGSTOP) before its last
 *                  micro-batch's backward, the one whose buckets are summed as it runs: a node that
 *                  hangs mid-run, its peers wait in the gradient collective (MPI, NCCL or shared
 *                  memory; after backward, this rank could already have done its part of it); the watchdog ends the job
 * (tests/slurm_hang.sh: a job that restarts without that rank, on fewer nodes, runs on; tests/emu_hang.sh: the peers
 * wait in NCCL) ddp_shm_nospace  DDP's shared-memory setup (ddp_shm.c) finds no room in /dev/shm, as on a node with a
 * small one; rank 0 of the dp group decides (tests/ddp_shm.sh) validation/ (tests/validation.sh) plants each and
 * expects the matching check to fail. */
#ifndef DT_FAULT_H
#define DT_FAULT_H

/* 1 when DTRAIN_FAULT names `name` for this rank at this step (step < 0: any step). */
int dt_fault(const char *name, int rank, int step);
/* 1 when DTRAIN_FAULT names `name` for this rank with exactly this step (no step given: step 1). */
int dt_fault_at(const char *name, int rank, int step);
/* 1 when DTRAIN_FAULT names `name`, for any rank (the same on every rank: hooks that all ranks
 * must join, like slow_io's wait). */
int dt_fault_named(const char *name);

#include <stddef.h>

#define DT_FAULT_BAD_MATH_SCALE 4.0f
#define DT_FAULT_SLOW_RANK_S 0.5
#define DT_FAULT_SLOW_IO_X 100.0

/* Helpers the hooks call: x[0..n) *= s; sleep for `seconds`; print "dtrain: DTRAIN_FAULT " and
 * the formatted line to stderr (where the fault fires, for the test to check), then SIGKILL. */
void dt_fault_scale(float *x, size_t n, float s);
void dt_fault_sleep(double seconds);
void dt_fault_kill(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
