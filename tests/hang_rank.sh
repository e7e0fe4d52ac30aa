#!/usr/bin/env bash
# A stalled peer must not hang the job (the hang watchdog, system.comm_timeout): SIGSTOP one rank
# of a 4-rank run mid-training, once with dp = 4 (its peers wait in the gradient all-reduce) and
# once with (dp, pp) = (2, 2) (they wait in point-to-point transfers or collectives), and once
# training the Fashion-MNIST CNN at dp = 4 (synchronised batch norm's all-reduce). Every
# process must be gone within comm_timeout + 30 s, the launcher must exit with 75 (requeue), and
# the watchdog's line must name the stopped rank as not arrived and the operation waited for.
# Then a rank that never arrives (it stops itself before the first collective): the same, under
# system.comm_timeout_start.
# With the watchdog off (system.comm_timeout=0) the same run hangs: tests/hang_rank.sh's check
# then fails on the deadline (DTRAIN_HANG_TIMEOUT=0 shows it).
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
TIMEOUT=${DTRAIN_HANG_TIMEOUT:-3}
cleanup() {
  rm -rf "$t"
  [ -z "${pid:-}" ] || kill -9 "$pid" 2>/dev/null || true
  for v in ${victims:-}; do kill -9 "$v" 2>/dev/null || true; done
}
trap cleanup EXIT
cd "$top_builddir"
# run_ranks: "PID RANK" of each MPI rank of this test's current run (told apart by $mark, a
# checkpoint directory inside this test's temp directory; as in tests/kill_rank.sh)
run_ranks() {
  local p r
  for p in $(pgrep -f -- "$mark"); do
    tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "$mark" || continue
    r=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$r" ] && echo "$p $r"
  done
  return 0
}
# stop_one NAME VICTIM ARGS...: a 4-rank run with ARGS; SIGSTOP rank VICTIM once it is training
stop_one() {
  local name=$1 vr=$2 victim status elapsed left start limit=$((TIMEOUT + 30)) line
  shift 2
  mark="checkpoint.dir=$t/ck-$name"
  echo "+ $MPIRUN -n 4 $DTRAIN ${ini#"$top_srcdir/"} train.steps=100000 log.every=20 system.comm_timeout=$TIMEOUT $* $mark (background)" >&2
  "$MPIRUN" --oversubscribe --bind-to none -n 4 -x OMP_NUM_THREADS=1 "$DTRAIN" "$ini" \
    train.steps=100000 log.every=20 system.comm_timeout="$TIMEOUT" "$@" "$mark" > "$t/$name.out" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    grep -q '^ *20 ' "$t/$name.out" 2>/dev/null && break
    sleep 0.5
  done
  grep -q '^ *20 ' "$t/$name.out" || { cat "$t/$name.out"; echo "FAIL: $name: training did not start"; return 1; }
  run_ranks | sort -k2n > "$t/ranks"
  echo "ranks of this run (pid rank): $(tr '\n' ' ' < "$t/ranks")"
  [ "$(awk '{ print $2 }' "$t/ranks" | tr '\n' ' ')" = "0 1 2 3 " ] || { echo "FAIL: want exactly ranks 0..3"; return 1; }
  victim=$(awk -v r="$vr" '$2 == r { print $1 }' "$t/ranks")
  victims="${victims:-} $victim"
  echo "+ kill -STOP $victim  (rank $vr)"
  start=$(date +%s)
  kill -STOP "$victim"
  for _ in $(seq 1 $((limit * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    tail -5 "$t/$name.out"; echo "FAIL: $name: launcher still running ${limit} s after rank $vr was stopped"; return 1
  fi
  status=0
  wait "$pid" || status=$?
  pid=
  elapsed=$(( $(date +%s) - start ))
  sleep 0.5 # the launcher has gone; its ranks must have gone with it
  left=$(run_ranks | awk '{ print $1 }' | tr '\n' ' ')
  echo "launcher exited with status $status after ${elapsed} s; ranks left: ${left:-none}"
  grep 'watchdog' "$t/$name.out" || true
  [ "$status" -eq 75 ] || { cat "$t/$name.out"; echo "FAIL: $name: exit status $status, want 75 (requeue)"; return 1; }
  [ -z "$left" ] || { echo "FAIL: $name: ranks still running"; return 1; }
  [ "$elapsed" -le "$limit" ] || { echo "FAIL: $name: took ${elapsed} s, limit $limit"; return 1; }
  line=$(grep -m1 '^dtrain: watchdog: rank' "$t/$name.out") || { echo "FAIL: $name: no watchdog line"; return 1; }
  [ "$(grep -c '^dtrain: watchdog: rank' "$t/$name.out")" -eq 1 ] || { echo "FAIL: $name: more than one watchdog line"; return 1; }
  echo "$line" | grep -q "did not report waiting within [0-9]* s: $vr (host " ||
    { echo "FAIL: $name: the line does not name rank $vr (alone) as not arrived"; return 1; }
  echo "$line" | grep -Eq ': (allreduce|allgather|reduce_scatter|broadcast|reduce|barrier|send|recv)[ a-z]* .*on communicator [a-z]+( \([a-z ]+\))? \(rank [0-9]+ of [0-9]+, [0-9]+ bytes\) not complete after' ||
    { echo "FAIL: $name: the line does not name the operation and its communicator"; return 1; }
  echo "$line" | grep -q "exit status 75" || { echo "FAIL: $name: the line does not give the exit status"; return 1; }
}
# never_arrives: rank 2 stops itself before the first collective (DTRAIN_FAULT=stall_start, test
# only): the others' start deadline (system.comm_timeout_start) ends the job the same way
never_arrives() {
  local status start elapsed left line limit=$((TIMEOUT + 30))
  mark="checkpoint.dir=$t/ck-start"
  echo "+ DTRAIN_FAULT=stall_start@2 $MPIRUN -n 4 $DTRAIN tests/small.ini system.comm_timeout=60 system.comm_timeout_start=$TIMEOUT $mark" >&2
  start=$(date +%s)
  status=0
  DTRAIN_FAULT=stall_start@2 timeout $((limit + 5)) "$MPIRUN" --oversubscribe --bind-to none -n 4 -x OMP_NUM_THREADS=1 \
    -x DTRAIN_FAULT "$DTRAIN" "$top_srcdir/tests/small.ini" train.global_batch=16 system.comm_timeout=60 \
    system.comm_timeout_start="$TIMEOUT" "$mark" > "$t/start.out" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - start ))
  sleep 0.5
  left=$(run_ranks | awk '{ print $1 }' | tr '\n' ' ')
  victims="${victims:-} $left"
  echo "launcher exited with status $status after ${elapsed} s; ranks left: ${left:-none}"
  grep 'watchdog' "$t/start.out" || true
  [ "$status" -eq 75 ] || { cat "$t/start.out"; echo "FAIL: start: exit status $status, want 75"; return 1; }
  [ -z "$left" ] || { echo "FAIL: start: ranks still running"; return 1; }
  [ "$elapsed" -le "$limit" ] || { echo "FAIL: start: took ${elapsed} s, limit $limit"; return 1; }
  line=$(grep '^dtrain: watchdog: rank' "$t/start.out") || { echo "FAIL: start: no watchdog line"; return 1; }
  [ "$(echo "$line" | grep -c .)" -eq 1 ] || { echo "FAIL: start: more than one watchdog line"; return 1; }
  echo "$line" | grep -q "at setup (before step 1): allgather of host names .*(system.comm_timeout_start = $TIMEOUT s[,)].*did not report waiting within [0-9]* s: 2 (host unknown)" ||
    { echo "FAIL: start: the line does not name the first collective, its deadline and rank 2"; return 1; }
}
ini=$top_srcdir/tests/small.ini
stop_one dp4 2 train.global_batch=16 || exit 1
stop_one pp2 1 parallel.pp=2 train.global_batch=8 || exit 1
# the image classifiers: their peers wait in synchronised batch norm's all-reduce (or DDP's average)
need_fmnist
ini=$top_srcdir/inputs/fmnist.ini
stop_one cnn 1 train.global_batch=16 train.micro_batch=4 train.eval_every=0 || exit 1
never_arrives || exit 1
echo "hang_rank: OK"
