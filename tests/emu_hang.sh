#!/usr/bin/env bash
# A stalled peer on the NCCL communicator must not hang the job, through the CUDA emulation
# (dtrain_emu, one emulated device per rank, NCCL emulated over MPI: an NCCL call stays in flight
# until every peer has taken part, and cudaEventQuery says "not ready" meanwhile, as on a GPU).
# Rank 1 of 2 stops itself (SIGSTOP, the test-only fault stall@1:5) after its backward of step 5,
# before its gradients are summed; rank 0 then waits for the gradient all-reduce on the device.
#   1. With the hang watchdog (system.comm_timeout = 3): every process is gone within 3 + 30 s,
#      the exit status is 75 (requeue), and the watchdog's one line names rank 1 as not arrived
#      and the all-reduce on the dp communicator's NCCL side (cuda/comm_nccl.cu polling its event).
#   2. With the watchdog off, the NCCL communicator's own timeout (DTRAIN_NCCL_TIMEOUT = 3): the
#      job ends within 3 + 30 s with a nonzero status and the line "NCCL allreduce ... not complete
#      after 3 s (timeout; a peer may have died or hung); communicator aborted".
# Before the emulated NCCL tested its MPI requests instead of waiting for them, rank 0 blocked
# inside the emulation and case 1 named the next host collective, never NCCL.
source "$top_srcdir/tests/lib.sh"
begin_test
EMU="$top_builddir/dtrain_emu"
LIMIT=33
# stall NAME ARGS...: the 2-rank run with rank 1 stalling at step 5; sets status and elapsed
stall() {
  local name=$1 start mark p r left
  shift
  mark="checkpoint.dir=$t/ck-$name" # tells this run's processes apart
  start=$(date +%s)
  status=0
  run timeout -s KILL 120 "$MPIRUN" --oversubscribe --bind-to none -n 2 -x OMP_NUM_THREADS=1 -x DTRAIN_EMU_DEVICES=2 \
    -x DTRAIN_FAULT=stall@1:5 -x DTRAIN_NCCL_TIMEOUT "$EMU" "$cfg" system.backend=cuda system.device_comm=nccl \
    train.steps=20 log.every=1 "$@" "$mark" > "$t/$name.out" 2>&1 || status=$?
  elapsed=$(($(date +%s) - start))
  sleep 0.5
  left=
  for p in $(pgrep -f -- "$mark"); do
    [ "$p" != "$$" ] && tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "$mark" && left="$left $p"
  done
  for p in $left; do kill -9 "$p" 2>/dev/null || true; done
  echo "$name: exit status $status after ${elapsed} s; processes left:${left:- none}"
  grep -q '^ *4 ' "$t/$name.out" || { cat "$t/$name.out"; echo "FAIL: $name: steps 1-4 did not run"; exit 1; }
  [ -z "$left" ] || { echo "FAIL: $name: processes still running"; exit 1; }
  [ "$elapsed" -le "$LIMIT" ] || { tail -5 "$t/$name.out"; echo "FAIL: $name: took ${elapsed} s, limit $LIMIT"; exit 1; }
}

DTRAIN_NCCL_TIMEOUT= stall watchdog system.comm_timeout=3
[ "$status" -eq 75 ] || { cat "$t/watchdog.out"; echo "FAIL: watchdog: exit status $status, want 75"; exit 1; }
line=$(grep -m1 '^dtrain: watchdog: rank' "$t/watchdog.out") || { cat "$t/watchdog.out"; echo "FAIL: no watchdog line"; exit 1; }
echo "$line"
echo "$line" | grep -q "did not report waiting within [0-9]* s: 1 (host " || { echo "FAIL: rank 1 not named"; exit 1; }
echo "$line" | grep -Eq 'at step 5: allreduce of [0-9]+ f32 on communicator dp \(NCCL\) \(rank 0 of 2, [0-9]+ bytes\) not complete' ||
  { echo "FAIL: the line does not name the gradient all-reduce on the NCCL communicator"; exit 1; }

DTRAIN_NCCL_TIMEOUT=3 stall nccl_timeout system.comm_timeout=0
[ "$status" -ne 0 ] || { echo "FAIL: nccl_timeout: exit status 0"; exit 1; }
grep -m1 'NCCL allreduce' "$t/nccl_timeout.out" || true
grep -Eq 'NCCL allreduce of [0-9]+ f32 failed on rank 0 of 2 in its communicator: not complete after 3 s \(timeout; a peer may have died or hung\); communicator aborted' \
  "$t/nccl_timeout.out" || { cat "$t/nccl_timeout.out"; echo "FAIL: no NCCL timeout line"; exit 1; }
echo "PASS"
