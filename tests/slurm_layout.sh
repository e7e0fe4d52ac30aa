#!/bin/bash
# `dtrain layout` under a real (throw-away, local) Slurm: 2 virtual nodes with 4 fake GPUs each,
# started by scripts/slurm-cluster.sh and stopped on exit. Checks that each rank's SLURM_NODEID,
# SLURM_LOCALID, MPI node, local rank and CUDA device agree; that one task seeing 4 GPUs fails at
# once with the command that works; that a job started without srun, or with a wrong
# SLURM_NTASKS, fails with a message naming the variable. Skipped (77) without root or Slurm.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}"
D="$top_builddir/dtrain"
CLUSTER="$top_srcdir/scripts/slurm-cluster.sh"
# Run as if outside any job: launcher and device variables from the caller's environment (make
# check inside a Slurm job, a GPU machine) would change what is being tested.
for v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\|PMIX_[A-Za-z0-9_]*\|OMPI_COMM_WORLD_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset CUDA_VISIBLE_DEVICES RANK WORLD_SIZE LOCAL_RANK
export PATH=$PATH:/usr/sbin
for p in slurmctld slurmd srun salloc munged; do
  command -v $p >/dev/null || { echo "SKIP: $p not installed (apt-get install slurm-wlm munge libpmix-dev)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: the local Slurm cluster needs root"; exit 77; }

DIR=$(mktemp -d /tmp/dtrain-slurm.XXXXXX)
out=$DIR/out
cleanup() { "$CLUSTER" stop "$DIR" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
mknod "$DIR/probe" c 1 3 2>/dev/null || { echo "SKIP: cannot create device nodes in $DIR (fake GPUs need mknod)"; exit 77; }
rm -f "$DIR/probe"
trap 'exit 1' INT TERM
start_cluster() { echo "\$ $CLUSTER start $DIR 2"; env_line=$("$CLUSTER" start "$DIR" 2); }
if ! start_cluster; then # a second try on fresh ports (derived from DIR) when the first found its port taken
  "$CLUSTER" stop "$DIR" 2>/dev/null
  rm -rf "$DIR"
  DIR=$(mktemp -d /tmp/dtrain-slurm.XXXXXX)
  out=$DIR/out
  sleep 2
  start_cluster || { echo "FAIL: the cluster did not start"; exit 1; }
fi
eval "$env_line"
echo "$env_line"
# several virtual nodes on one host: Open MPI's shared-memory transport must stay off
export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo

status=0
fail() { echo "FAIL: $*"; status=1; }
run() { # run ok|nz CMD...: print the command, run it with a time limit, check the exit status
  want=$1; shift
  echo "\$ $*"
  timeout 30 "$@" >"$out" 2>&1; rc=$?
  # Open MPI's start-up race on virtual nodes (tests/lib.sh srun_once_more): once more
  if [ $want = ok ] && [ $rc -ne 0 ] && grep -q 'Failing at address: (nil)' "$out" && ! grep -q '\[ 1\] ' "$out"; then
    sed 's/^/    /' "$out"
    echo "note: a rank called address 0 with no caller frame (Open MPI start-up race); launching once more"
    timeout 30 "$@" >"$out" 2>&1; rc=$?
  fi
  sed 's/^/    /' "$out"
  case $want in
    ok) [ $rc -eq 0 ] || fail "exit $rc, want 0" ;;
    nz) { [ $rc -ne 0 ] && [ $rc -ne 124 ]; } || fail "exit $rc, want a fast nonzero exit" ;;
  esac
}
expect_out() { grep -qF -- "$1" "$out" && echo "ok: output has '$1'" || fail "output lacks '$1'"; }
# rows of the table: rank host node local device threads dp pp tp SLURM_NODEID SLURM_LOCALID visible gpu
rows() { awk '$1 == "#" && $2 ~ /^[0-9]+$/ { $1 = ""; print substr($0, 2) }' "$out"; }
# check_rows N AWK-CONDITION WHAT: the table has exactly the rows of ranks 0..N-1, none of which
# meets AWK-CONDITION (a disagreement); an empty or short table is a failure, not an ok
check_rows() {
  local n=$1 cond=$2 what=$3 got bad
  got=$(rows | awk '{ print $1 }' | sort -n | tr '\n' ' ')
  [ "$got" = "$(seq -s ' ' 0 $((n - 1))) " ] || { fail "table rows for ranks '$got', want 0..$((n - 1))"; return; }
  bad=$(rows | awk "{ if ($cond) print \"rank \" \$1 }")
  [ -z "$bad" ] && echo "ok: $n rows; $what" || fail "inconsistent rows: $bad"
}

# 1. Two nodes, two tasks and two GPUs per node: shared list "0,1", device = local rank.
run ok srun -N 2 --ntasks-per-node=2 --gpus-per-node=2 --mpi=pmix "$D" layout --backend cuda
expect_out "# layout: 4 ranks on 2 nodes"
expect_out "launcher srun job "
check_rows 4 '$3 != $10 || $4 != $11 || $5 != $4 || $1 != 2 * $3 + $4 || $12 != "0,1" || $13 != $4' \
  "node = SLURM_NODEID, local = SLURM_LOCALID, device = local, rank = 2*node+local, visible 0,1, gpu = local"

# Cyclic distribution: ranks alternate between the nodes; node and local rank still follow Slurm.
run ok srun -N 2 --ntasks-per-node=2 -m cyclic --mpi=pmix "$D" layout --backend cpu
check_rows 4 '$3 != $10 || $4 != $11 || $1 != $3 + 2 * $4' \
  "cyclic: rank = node + 2*local, node = SLURM_NODEID, local = SLURM_LOCALID"

# 2. One GPU per task (-c 2): each task sees its own device, so device 0; threads from SLURM_CPUS_PER_TASK.
run ok srun -N 2 --ntasks-per-node=2 --gpus-per-task=1 -c 2 --mpi=pmix "$D" layout --backend cuda --tp 2
expect_out "mesh dp=2 x tp=2 x pp=1"
expect_out "threads from slurm"
check_rows 4 '$3 != $10 || $4 != $11 || $5 != 0 || $6 != 2 || $12 != $4 || $13 != $4 || $9 != $4' \
  "device 0 per task, visible = gpu = own GPU, 2 threads, tp index = local rank"

# 3. One task seeing 4 GPUs: CUDA stops at once naming the command that works; CPU only notes it.
run nz srun -N 1 -n 1 --gpus=4 "$D" layout --backend cuda
expect_out "4 GPUs visible on node 0 (CUDA_VISIBLE_DEVICES=0,1,2,3) but only 1 rank runs there"
expect_out "srun -N 1 --ntasks-per-node=4 --gpus-per-node=4 ./dtrain layout --backend cuda"
[ "$(grep -c '^dtrain layout: ' "$out")" -eq 1 ] || fail "want exactly one error line"
run ok srun -N 1 -n 1 --gpus=4 "$D" layout --backend cpu
expect_out "# note: 4 GPUs visible on node 0 but 1 rank runs there and the backend is cpu"
# ... and the command it suggests works
run ok srun -N 1 --ntasks-per-node=4 --gpus-per-node=4 "$D" layout --backend cuda
[ "$(rows | awk '{ printf "%s", $5 }')" = "0123" ] && echo "ok: devices 0 1 2 3" || fail "want devices 0 1 2 3"

# 4. Launch mistakes: dtrain run directly in a 4-task allocation (what a batch script without
#    srun does), and an SLURM_NTASKS that disagrees with MPI.
run nz salloc -N 1 -n 4 "$D" layout
expect_out "SLURM_NTASKS=4 but MPI world size is 1: dtrain was started without srun inside Slurm job"
run nz srun -N 1 -n 2 env SLURM_NTASKS=7 "$D" layout
expect_out "dtrain layout: rank 0 (host $(hostname)): SLURM_NTASKS=7 but MPI world size is 2"
# 5. SLURM_NODEID must group ranks exactly as MPI's nodes do.
run nz srun -N 2 --ntasks-per-node=2 --mpi=pmix env SLURM_NODEID=0 "$D" layout
expect_out "SLURM_NODEID=0 is also the SLURM_NODEID of node 0 but MPI puts rank 2 on node 1"
exit $status
