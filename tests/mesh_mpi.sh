#!/bin/sh
# Multi-rank checks of the launch layout under mpirun (one host): mesh coordinates and axis
# communicators at 4 and 8 ranks (tests/test_mesh_mpi), layouts that do not fit and environment
# mismatches failing on every rank with the message, and `dtrain layout` exit codes and output.
set -u
: "${top_builddir:=.}" "${MPIRUN:=mpirun}"
T="$top_builddir/tests/test_mesh_mpi"
# Run as if outside any job: launcher and device variables from the caller's environment (make
# check inside a Slurm job, a GPU machine) would change what is being tested.
for v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\|PMIX_[A-Za-z0-9_]*\|OMPI_COMM_WORLD_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset CUDA_VISIBLE_DEVICES RANK WORLD_SIZE LOCAL_RANK
D="$top_builddir/dtrain"
MR="$MPIRUN --allow-run-as-root --oversubscribe"
out=$(mktemp); trap 'rm -f "$out"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

# run EXPECTED_RC CMD...: prints the command, runs it with a time limit, checks the exit status
run() {
  want=$1; shift
  echo "\$ $*"
  timeout 60 "$@" >"$out" 2>&1; rc=$?
  sed 's/^/    /' "$out" | grep -v '^    *$' | head -20
  case $want in
    0) [ $rc -eq 0 ] || fail "exit $rc, want 0: $*" ;;
    nz) [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit $rc, want a fast nonzero exit: $*" ;;
  esac
}
expect_out() { grep -qF -- "$1" "$out" || fail "output lacks '$1'"; }

for n in 4 8; do
  for l in "0 1 1" "0 2 1" "0 1 2" "0 2 2" "2 1 $((n / 2))" "1 $n 1"; do
    run 0 $MR -n $n $T ok $l
  done
done
# layouts that do not fit: every rank must report the same error (test_mesh_mpi checks each)
run 0 $MR -n 4 $T fail 3 2 1 "dp=3 x tp=2 x pp=1 = 6 ranks but the world has 4 ranks"
run 0 $MR -n 4 $T fail 0 3 1 "tp=3 x pp=1 = 3 does not divide the world size 4"
# an environment mismatch on rank 1 only: every rank reports rank 1's error (no hang)
run 0 $MR -n 4 -x RANK=0 -x WORLD_SIZE=4 $T fail 0 1 1 "rank 1 (host "
run 0 $MR -n 4 -x RANK=0 -x WORLD_SIZE=4 $T fail 0 1 1 "RANK=0 but MPI rank is 1"

# dtrain layout itself
run 0 $MR -n 4 $D layout --tp 2 --backend cpu
expect_out "# layout: 4 ranks on 1 node, mesh dp=2 x tp=2 x pp=1, backend cpu, launcher mpirun"
[ "$(grep -c '^# *[0-9]' "$out")" -eq 4 ] || fail "want 4 table rows"
# columns: # rank host node local device threads dp pp tp SLURM_NODEID SLURM_LOCALID visible gpu
[ "$(awk '$1=="#" && $2=="3" {print $8, $9, $10}' "$out")" = "1 0 1" ] || fail "rank 3 should be dp 1 pp 0 tp 1"
run nz $MR -n 4 $D layout --dp 3 --tp 2
expect_out "dtrain layout: [parallel] dp=3 x tp=2 x pp=1 = 6 ranks but the world has 4 ranks"
[ "$(grep -c 'dtrain layout: ' "$out")" -eq 1 ] || fail "the error should be printed once (by rank 0)"
run nz $MR -n 2 -x WORLD_SIZE=3 -x RANK=0 $D layout
expect_out "WORLD_SIZE=3 but MPI world size is 2"
run nz $D layout --dp x
expect_out "dtrain layout: bad argument '--dp' x"
# one rank seeing several GPUs: a one-line error for CUDA, a note for the CPU backend
run nz env CUDA_VISIBLE_DEVICES=0,1,2,3 $D layout --backend cuda
expect_out "4 GPUs visible on node 0 (CUDA_VISIBLE_DEVICES=0,1,2,3) but only 1 rank runs there"
expect_out "srun -N 1 --ntasks-per-node=4 --gpus-per-node=4 ./dtrain layout --backend cuda"
run nz $MR -n 2 -x CUDA_VISIBLE_DEVICES=0,1,2,3 $D layout --backend cuda
expect_out "mpirun -n 4 --map-by ppr:4:node ./dtrain layout --backend cuda"
run 0 env CUDA_VISIBLE_DEVICES=0,1,2,3 $D layout --backend cpu
expect_out "# note: 4 GPUs visible on node 0 but 1 rank runs there and the backend is cpu"
run 0 $MR -n 4 -x CUDA_VISIBLE_DEVICES=0,1,2,3 $D layout --backend cuda
[ "$(awk '$1=="#" && $2=="2" {print $6, $13, $14}' "$out")" = "2 0,1,2,3 2" ] || fail "rank 2 should use device 2 of 0,1,2,3"
run nz $MR -n 4 -x CUDA_VISIBLE_DEVICES=0,1 $D layout --backend cuda
expect_out "local rank 2 of 4 on node 0 but only 2 GPUs visible"
exit $status
