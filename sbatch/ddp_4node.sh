#!/bin/bash
# Data-parallel training on 4 nodes x 4 GPUs, one rank per GPU, with pre-timeout checkpoint and
# automatic requeue. Submit from the dtrain checkout:   sbatch sbatch/ddp_4node.sh
# Scaled down (e.g. the local test cluster, CPU backend): the #SBATCH geometry is overridden on
# the command line, the rest by environment variables:
#   DTRAIN_CONFIG=inputs/tiny.ini DTRAIN_ARGS="system.backend=cpu" \
#     sbatch --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 sbatch/ddp_4node.sh
#
# What a site must adapt:
#   --partition / --account / --qos   (add #SBATCH lines for your site)
#   --cpus-per-task                   cores per GPU on your nodes (also OpenMP threads per rank)
#   --time and the --signal lead time (long enough to write one checkpoint: ~1.5 GB for 124M)
#   DTRAIN_MPI                        srun's MPI plugin for your Open MPI/MPICH build (srun --mpi=list)
#   DTRAIN_EXCLUDE_SUSPECT=0          on small partitions: do not exclude a node the hang watchdog
#                                     suspects from the requeued job (it may then never start)
#   DTRAIN_MIN_NODES=M                shrink and resume: when the hang watchdog names lost nodes,
#                                     give them back and go on at once on the nodes left (at least
#                                     M) instead of requeueing for replacements; dtrain resumes from
#                                     the last checkpoint on the smaller layout. Needs parallel.dp =
#                                     0 (auto) and train.global_batch set so that the training stays
#                                     the same (dtrain says "# resume: layout changed" and whether)
#   system.comm_timeout (DTRAIN_ARGS) the hang watchdog's deadline (default 300 s): above the
#                                     longest checkpoint write and the slowest rank's start
#   module loads / environment        below, before srun
#   DTRAIN_RETRY_STARTUP=1            test clusters with several virtual nodes on one host only:
#                                     launch once more when a rank died inside Open MPI's start-up
#                                     (a call to address 0 with no caller frame; tests/lib.sh)
#
#SBATCH --job-name=dtrain-ddp
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=USR1@300
#SBATCH --open-mode=append
#SBATCH --output=dtrain-%j.out

set -u
DTRAIN=${DTRAIN:-./dtrain}
DTRAIN_CONFIG=${DTRAIN_CONFIG:-inputs/gpt2.ini}
DTRAIN_ARGS=${DTRAIN_ARGS:-}
DTRAIN_MPI=${DTRAIN_MPI:-pmix}
DTRAIN_REQUEUE_STATUS=75   # dtrain's exit status after a signal-triggered checkpoint or a hang
DTRAIN_EXCLUDE_SUSPECT=${DTRAIN_EXCLUDE_SUSPECT:-1}
DTRAIN_MIN_NODES=${DTRAIN_MIN_NODES:-}
DTRAIN_RETRY_STARTUP=${DTRAIN_RETRY_STARTUP:-0}
# The hang watchdog (a rank waited longer than system.comm_timeout for others) writes the nodes of
# the ranks that never arrived here, one per line, before it ends the job with status 75.
export DTRAIN_SUSPECT_FILE=${DTRAIN_SUSPECT_FILE:-dtrain-${SLURM_JOB_ID}.suspect}
rm -f "$DTRAIN_SUSPECT_FILE"

# module load ...   (site environment goes here)

echo "# job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0}: ${SLURM_JOB_NUM_NODES} nodes x ${SLURM_NTASKS_PER_NODE:-?} tasks on ${SLURM_JOB_NODELIST}"
# --kill-on-bad-exit: a rank that dies takes the step down at once instead of leaving peers waiting.
# The checkpoint settings come from the config; resume = auto continues after a requeue or a shrink.
launch() {
  srun --mpi="$DTRAIN_MPI" --kill-on-bad-exit=1 --nodes="${SLURM_JOB_NUM_NODES}" \
       --ntasks=$(( SLURM_JOB_NUM_NODES * SLURM_NTASKS_PER_NODE )) --ntasks-per-node="${SLURM_NTASKS_PER_NODE}" \
       --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" "$DTRAIN" "$DTRAIN_CONFIG" checkpoint.resume=auto $DTRAIN_ARGS
}
run_dtrain() {
  local log st
  [ "$DTRAIN_RETRY_STARTUP" = 1 ] || { launch; return; }
  log=$(mktemp) || { launch; return; }
  launch > >(tee "$log") 2>&1
  st=$?
  wait $! # tee
  if [ "$st" -ne 0 ] && grep -q 'Failing at address: (nil)' "$log" && ! grep -q '\[ 1\] ' "$log"; then
    echo "# a rank called address 0 with no caller frame (Open MPI start-up race, DTRAIN_RETRY_STARTUP=1); launching once more"
    launch
    st=$?
  fi
  rm -f "$log"
  return "$st"
}
# Shrink in place (DTRAIN_MIN_NODES): release the nodes the watchdog suspects from this allocation
# (scontrol update NodeList=) and take Slurm's resized environment. Fails (1) when that would leave
# fewer than DTRAIN_MIN_NODES nodes or Slurm refuses.
shrink() {
  local keep n
  keep=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | grep -vxF -f "$DTRAIN_SUSPECT_FILE" | paste -sd, -)
  n=$(echo "$keep" | tr ',' '\n' | grep -c .)
  if [ "$n" -lt 1 ] || [ "$n" -lt "$DTRAIN_MIN_NODES" ]; then
    echo "# not shrinking: ${n} nodes would be left, DTRAIN_MIN_NODES=${DTRAIN_MIN_NODES}"
    return 1
  fi
  scontrol update JobId="${SLURM_JOB_ID}" NodeList="$keep" || return 1
  . "./slurm_job_${SLURM_JOB_ID}_resize.sh" && rm -f "./slurm_job_${SLURM_JOB_ID}_resize."*
  echo "# shrinking: lost $(sort -u "$DTRAIN_SUSPECT_FILE" | paste -sd, -); going on with ${SLURM_JOB_NUM_NODES} nodes x ${SLURM_NTASKS_PER_NODE} tasks on ${SLURM_JOB_NODELIST}"
  rm -f "$DTRAIN_SUSPECT_FILE"
}
while :; do
  run_dtrain
  status=$?
  [ "$status" -eq "$DTRAIN_REQUEUE_STATUS" ] && [ -s "$DTRAIN_SUSPECT_FILE" ] && [ -n "$DTRAIN_MIN_NODES" ] && shrink || break
done
if [ "$status" -eq "$DTRAIN_REQUEUE_STATUS" ]; then
  suspects=
  if [ -s "$DTRAIN_SUSPECT_FILE" ]; then
    suspects=$(sort -u "$DTRAIN_SUSPECT_FILE" | paste -sd, -)
    echo "# hang watchdog: ranks on ${suspects} did not arrive; the job resumes from its last checkpoint"
  else
    echo "# checkpoint written before the time limit"
  fi
  # Slurm changes ExcNodeList of pending jobs only: requeue first, then exclude. The requeue
  # also signals this script (SIGTERM): ignore it until the exclusion is in.
  trap '' TERM
  old=$(scontrol show job "${SLURM_JOB_ID}" | sed -n 's/.*ExcNodeList=\([^ ]*\).*/\1/p')
  echo "# requeueing job ${SLURM_JOB_ID}"
  scontrol requeue "${SLURM_JOB_ID}"
  if [ -n "$suspects" ] && [ "$DTRAIN_EXCLUDE_SUSPECT" = 1 ]; then
    [ "$old" = "(null)" ] && old=
    if scontrol update jobid="${SLURM_JOB_ID}" ExcNodeList="${old:+$old,}${suspects}"; then
      echo "# excluding ${suspects} from the requeued job"
    else
      echo "# could not exclude ${suspects} (site policy?); requeued without"
    fi
  fi
  exit 0
fi
exit "$status"
