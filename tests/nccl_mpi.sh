#!/bin/sh
# NCCL communicator set-up on a machine without a GPU: tests/test_nccl_mpi under mpirun -n 3.
# The unique id broadcast must give every rank rank 0's bytes; communicator creation must fail
# cleanly on every rank (no hang: each run is under a 120 s timeout) when ncclCommInitRank fails,
# when cudaSetDevice fails everywhere, and when only rank 1 fails. Skipped (77) without CUDA; on a
# machine with GPUs the init cases do not apply and are skipped.
set -u
: "${top_builddir:=.}" "${MPIRUN:=mpirun}"
prog="$top_builddir/tests/test_nccl_mpi"
if ! grep -q '^#define DT_HAVE_CUDA 1' "$top_builddir/dt_build.h"; then
  echo "skip: dtrain is built without CUDA"
  exit 77
fi
for v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\|PMIX_[A-Za-z0-9_]*\|OMPI_COMM_WORLD_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset CUDA_VISIBLE_DEVICES
export OMPI_MCA_btl_base_warn_component_unused=0
status=0
modes="id"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "note: a GPU is present: only the unique-id case applies"
else
  modes="id init-nodev init-dev init-rank1"
fi
for mode in $modes; do
  cmd="$MPIRUN --allow-run-as-root --oversubscribe -n 3 $prog $mode"
  echo "\$ $cmd"
  timeout 120 $cmd
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "ok: $mode"
  else
    echo "FAIL: $mode (exit $rc; 124 = timed out, i.e. a hang)"
    status=1
  fi
done
exit $status
