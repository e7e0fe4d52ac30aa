#!/usr/bin/env bash
# A crashed peer must not leave the job hanging: SIGKILL rank 1 of a 3-rank run mid-training, and
# of a 4-rank run with 2 pipeline stages (its peers wait in point-to-point receives, not in a
# collective); every remaining rank must be gone and the launcher must exit nonzero within 60 s.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null || true' EXIT
cd "$top_builddir"
# run_ranks: "PID RANK" of each MPI rank of this test's current run. A run is told apart by its
# argument $mark, a checkpoint directory inside this test's fresh temp directory: unique to it,
# unlike tests/small.ini, which the other tests running beside this one also pass.
run_ranks() {
  local p r
  for p in $(pgrep -f -- "$mark"); do
    tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "$mark" || continue
    r=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$r" ] && echo "$p $r"
  done
  return 0
}
# kill_one N ARGS...: an N-rank run with ARGS; SIGKILL rank 1 once it is training
kill_one() {
  local n=$1 victim status elapsed left start
  shift
  mark="checkpoint.dir=$t/ck-$n"
  echo "+ $MPIRUN -n $n $DTRAIN tests/small.ini train.steps=100000 log.every=50 $* $mark (background)" >&2
  "$MPIRUN" --oversubscribe --bind-to none -n "$n" -x OMP_NUM_THREADS=1 \
    "$DTRAIN" "$top_srcdir/tests/small.ini" train.steps=100000 log.every=50 "$@" "$mark" > "$t/out" 2>&1 &
  pid=$!
  # wait until training is under way
  for _ in $(seq 1 120); do
    grep -q '^ *50 ' "$t/out" 2>/dev/null && break
    sleep 0.5
  done
  grep -q '^ *50 ' "$t/out" || { cat "$t/out"; echo "FAIL: training did not start"; return 1; }
  run_ranks | sort -k2n > "$t/ranks"
  echo "ranks of this run (pid rank): $(tr '\n' ' ' < "$t/ranks")"
  [ "$(awk '{ print $2 }' "$t/ranks" | tr '\n' ' ')" = "$(seq -s ' ' 0 $((n - 1))) " ] ||
    { echo "FAIL: want exactly ranks 0..$((n - 1)) of this run"; return 1; }
  victim=$(awk '$2 == 1 { print $1 }' "$t/ranks")
  echo "+ kill -9 $victim  (rank 1)"
  start=$(date +%s)
  kill -9 "$victim"
  status=0
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: launcher still running 60 s after rank 1 was killed"; run_ranks; return 1
  fi
  wait "$pid" || status=$?
  elapsed=$(( $(date +%s) - start ))
  left=$(run_ranks | awk '{ print $1 }' | tr '\n' ' ')
  echo "launcher exited with status $status after ${elapsed} s; ranks left: ${left:-none}"
  [ "$status" -ne 0 ] || { echo "FAIL: exit status 0"; return 1; }
  [ -z "$left" ] || { echo "FAIL: ranks still running"; return 1; }
}
kill_one 3 train.global_batch=12 || exit 1
# pipeline stages block in point-to-point receives: the same for rank 1 of (dp, pp) = (2, 2)
kill_one 4 parallel.pp=2 train.global_batch=8 || exit 1
echo "kill_rank: OK"
