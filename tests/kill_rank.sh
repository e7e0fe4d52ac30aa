#!/usr/bin/env bash
# A crashed peer must not leave the job hanging: SIGKILL rank 1 of a 3-rank run mid-training;
# every remaining rank must be gone and the launcher must exit nonzero within 60 s.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null || true' EXIT
cd "$top_builddir"
echo "+ $MPIRUN -n 3 $DTRAIN tests/small.ini train.steps=100000 (background)" >&2
"$MPIRUN" --oversubscribe --bind-to none -n 3 -x OMP_NUM_THREADS=1 \
  "$DTRAIN" "$top_srcdir/tests/small.ini" train.steps=100000 train.global_batch=12 log.every=50 > "$t/out" 2>&1 &
pid=$!
# wait until training is under way
for _ in $(seq 1 120); do
  grep -q '^ *50 ' "$t/out" 2>/dev/null && break
  sleep 0.5
done
grep -q '^ *50 ' "$t/out" || { cat "$t/out"; echo "FAIL: training did not start"; exit 1; }
victim=""
for p in $(pgrep -f "$DTRAIN .*small.ini"); do
  if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$p; fi
done
[ -n "$victim" ] || { echo "FAIL: rank 1 not found"; exit 1; }
echo "+ kill -9 $victim  (rank 1)"
start=$(date +%s)
kill -9 "$victim"
status=0
for _ in $(seq 1 600); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: launcher still running 60 s after rank 1 was killed"; pgrep -af "$DTRAIN" || true; exit 1
fi
wait "$pid" || status=$?
elapsed=$(( $(date +%s) - start ))
left=$(pgrep -f "$DTRAIN .*small.ini" || true)
echo "launcher exited with status $status after ${elapsed} s; ranks left: ${left:-none}"
[ "$status" -ne 0 ] || { echo "FAIL: exit status 0"; exit 1; }
[ -z "$left" ] || { echo "FAIL: ranks still running"; exit 1; }
echo "kill_rank: OK"
