#!/bin/sh
# Multi-rank check of the MPI communicator: tests/test_comm_mpi under mpirun at 4 and 3 ranks
# (even and odd sizes; the split gives groups of 2+2 and 2+1). The program compares every
# collective with closed-form values and exits nonzero if any rank saw a wrong value.
set -u
: "${top_builddir:=.}" "${MPIRUN:=mpirun}"
prog="$top_builddir/tests/test_comm_mpi"
# Run as if outside any job: launcher and device variables from the caller's environment (make
# check inside a Slurm job, a GPU machine) would change what is being tested.
for v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\|PMIX_[A-Za-z0-9_]*\|OMPI_COMM_WORLD_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset CUDA_VISIBLE_DEVICES RANK WORLD_SIZE LOCAL_RANK
status=0
for n in 4 3; do
  cmd="$MPIRUN --allow-run-as-root --oversubscribe -n $n $prog"
  echo "\$ $cmd"
  if timeout 120 $cmd; then
    echo "ok: $n ranks, all collectives matched the closed-form values"
  else
    echo "FAIL: $n ranks (exit $?)"
    status=1
  fi
done
exit $status
