#!/usr/bin/env bash
# Checkpoint faults through dtrain itself:
#  1. SIGKILL of one rank in the middle of writing the step-10 checkpoint ends the job nonzero,
#     leaves the step-5 checkpoint usable, and the next start resumes from it and finishes with
#     exactly the losses of an uninterrupted run.
#  2. A truncated newest checkpoint and a bit-flipped one (a byte inside a tensor's data) are
#     each reported with a clear message and skipped in favour of the one before.
source "$top_srcdir/tests/lib.sh"
begin_test
common="checkpoint.every=5 checkpoint.keep=5"
mpi 2 "$DTRAIN" "$cfg" $common checkpoint.dir="$t/ref" log.metrics="$t/ref.jsonl" > "$t/ref.out"

# 1. killed mid-save
mpi 2 "$DTRAIN" "$cfg" $common checkpoint.dir="$t/k" train.stop_after=5 > "$t/k1.out"
status=0
echo "+ DTRAIN_FAULT=ckpt_kill@1 (rank 1 SIGKILLs itself while writing the step-10 checkpoint)"
DTRAIN_FAULT=ckpt_kill@1 timeout 120 "$MPIRUN" --oversubscribe --bind-to none -n 2 -x OMP_NUM_THREADS=1 -x DTRAIN_FAULT \
  "$DTRAIN" "$cfg" $common checkpoint.dir="$t/k" checkpoint.resume=auto log.metrics="$t/k.jsonl" > "$t/k2.out" 2>&1 || status=$?
echo "killed run exited with status $status"
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || { cat "$t/k2.out"; echo "FAIL: expected a nonzero exit (not a timeout)"; exit 1; }
ls -a "$t/k"
[ ! -e "$t/k/ckpt_00000010.h5" ] || { echo "FAIL: a half-written checkpoint was committed"; exit 1; }
mpi 2 "$DTRAIN" "$cfg" $common checkpoint.dir="$t/k" checkpoint.resume=auto log.metrics="$t/k3.jsonl" > "$t/k3.out"
grep '^# resume' "$t/k3.out"
grep -q 'ckpt_00000005.h5 at step 5' "$t/k3.out" || { echo "FAIL: did not resume from step 5"; exit 1; }
"$PY" - "$t" <<'PY'
import json, sys
d = sys.argv[1]
ref = {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/ref.jsonl"))}
got = {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/k3.jsonl"))}
assert sorted(got) == list(range(6, 21)), sorted(got)
assert all(got[s] == ref[s] for s in got), "losses after recovery differ from the uninterrupted run"
print("after the kill: resumed at step 5, steps 6-20 bitwise equal to the uninterrupted run")
PY

# 2. truncated and bit-flipped checkpoints are skipped
for kind in truncate bitflip; do
  mkdir -p "$t/$kind"
  cp "$t/ref/ckpt_00000015.h5" "$t/ref/ckpt_00000020.h5" "$t/$kind/"
  f="$t/$kind/ckpt_00000020.h5"
  if [ $kind = truncate ]; then
    run truncate -s 100000 "$f"
  else
    "$PY" - "$f" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
off = f["model/h.1.mlp.c_fc.weight"].id.get_offset() + 1000
f.close()
with open(sys.argv[1], "r+b") as fh:
    fh.seek(off); b = fh.read(1); fh.seek(off); fh.write(bytes([b[0] ^ 0x10]))
print(f"flipped one bit at file offset {off} (inside h.1.mlp.c_fc.weight)")
PY
  fi
  cp "$f" "$t/$kind.bad.h5"
  mpi 2 "$DTRAIN" "$cfg" $common train.steps=21 checkpoint.dir="$t/$kind" checkpoint.resume=auto > "$t/$kind.out" 2> "$t/$kind.err"
  cat "$t/$kind.err"
  grep '^# resume' "$t/$kind.out"
  grep -q 'ckpt_00000015.h5 at step 15' "$t/$kind.out" || { echo "FAIL: $kind: did not fall back to step 15"; exit 1; }
  grep -q 'ckpt_00000020.h5' "$t/$kind.err" || { echo "FAIL: $kind: no message about the bad file"; exit 1; }
done

# 3. every checkpoint unusable: an error (no silent fresh start on half-loaded weights), files kept
mkdir -p "$t/allbad"
cp "$t/bitflip.bad.h5" "$t/allbad/ckpt_00000020.h5"
status=0
mpi 2 "$DTRAIN" "$cfg" $common train.steps=21 checkpoint.dir="$t/allbad" checkpoint.resume=auto > "$t/allbad.out" 2> "$t/allbad.err" || status=$?
tail -n 3 "$t/allbad.err"
[ "$status" -ne 0 ] || { echo "FAIL: all-bad: training started anyway"; exit 1; }
grep -q 'all 1 checkpoint(s) are unusable' "$t/allbad.err" || { echo "FAIL: all-bad: no clear message"; exit 1; }
[ "$(ls "$t/allbad")" = ckpt_00000020.h5 ] || { echo "FAIL: all-bad: directory changed: $(ls "$t/allbad")"; exit 1; }
echo "ckpt_faults: OK"
