#!/usr/bin/env bash
# Checkpoint faults through dtrain itself:
#  1. SIGKILL of a rank in the middle of writing the step-10 checkpoint file (DTRAIN_FAULT=ckpt_kill,
#     after half of the datasets: src/ckpt/ckpt_write.c) ends the job nonzero, leaves the half-written
#     temp file .ckpt_00000010.h5.tmp and the step-5 checkpoint (still `latest`), and the next
#     start resumes from step 5, never from the temp file, and finishes with exactly the losses,
#     gradient norms and final state of an uninterrupted run. Two layouts, so that the killed rank
#     really writes: dp=2 with replicated arenas, where rank 0 (the node's leader) writes the whole
#     file and rank 1 writes nothing, killed on rank 0; and dp=2 with ZeRO-1, where every rank writes
#     its shard of the AdamW moments, killed on rank 1 while rank 0 waits in the collective write.
#     The line the fault prints ("after writing dataset K of N", 0 < K < N) and the temp file prove
#     the kill happened mid-write.
#  2. A truncated newest checkpoint and a bit-flipped one (a byte inside a tensor's data) are
#     each reported with a clear message and skipped in favour of the one before.
#  3. Every checkpoint unusable: an error, no silent fresh start.
#  4. A full disk during the step-10 save (each rank's writes past 600 KiB of a file fail: a
#     file-size limit with SIGXFSZ ignored stands in for ENOSPC, the same failed write(); the file
#     is 1.4 MB): one line names the temp file, the dataset and the failed write, the exit status is
#     nonzero, nothing of step 10 is left or committed, latest stays step 5, and the next start
#     resumes there and logs steps 6-20 bitwise as the uninterrupted run.
source "$top_srcdir/tests/lib.sh"
begin_test
common="checkpoint.every=5 checkpoint.keep=5"
mpi 2 "$DTRAIN" "$cfg" $common checkpoint.dir="$t/ref" log.metrics="$t/ref.jsonl" > "$t/ref.out"

# 1. killed mid-save
mpi 2 "$DTRAIN" "$cfg" $common checkpoint.dir="$t/k" train.stop_after=5 > "$t/k1.out"
cp -a "$t/k" "$t/kz"
cp -a "$t/k" "$t/full"
# kill_mid_save NAME RANK DIR ARGS...: resume from DIR's step-5 checkpoint with ckpt_kill on RANK;
# the run must die in the middle of writing the step-10 file and leave the step-5 one in charge
kill_mid_save() {
  local name=$1 rank=$2 dir=$3 status=0
  shift 3
  echo "+ DTRAIN_FAULT=ckpt_kill@$rank $MPIRUN -n 2 $DTRAIN $cfg $common${*:+ $*} checkpoint.dir=$dir checkpoint.resume=auto"
  DTRAIN_FAULT=ckpt_kill@$rank timeout 120 "$MPIRUN" --oversubscribe --bind-to none -n 2 -x OMP_NUM_THREADS=1 \
    -x DTRAIN_FAULT "$DTRAIN" "$cfg" $common "$@" checkpoint.dir="$dir" checkpoint.resume=auto > "$t/$name.out" 2>&1 ||
    status=$?
  echo "killed run exited with status $status"
  grep 'DTRAIN_FAULT' "$t/$name.out" || true
  ls -la "$dir"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || { cat "$t/$name.out"; echo "FAIL: $name: expected a nonzero exit (not a timeout)"; exit 1; }
  local line k n
  line=$(grep -o "DTRAIN_FAULT rank $rank: ckpt_kill: SIGKILL after writing dataset [0-9]* of [0-9]*" "$t/$name.out") ||
    { cat "$t/$name.out"; echo "FAIL: $name: rank $rank was not killed while writing the checkpoint file"; exit 1; }
  k=$(echo "$line" | awk '{print $(NF-2)}')
  n=$(echo "$line" | awk '{print $NF}')
  [ "$k" -gt 0 ] && [ "$k" -lt "$n" ] || { echo "FAIL: $name: killed after dataset $k of $n: not mid-file"; exit 1; }
  [ -s "$dir/.ckpt_00000010.h5.tmp" ] || { echo "FAIL: $name: no half-written .ckpt_00000010.h5.tmp"; exit 1; }
  [ ! -e "$dir/ckpt_00000010.h5" ] || { echo "FAIL: $name: a half-written checkpoint was committed"; exit 1; }
  [ "$(cat "$dir/latest")" = ckpt_00000005.h5 ] || { echo "FAIL: $name: latest is '$(cat "$dir/latest")'"; exit 1; }
  echo "ok: $name: rank $rank SIGKILLed after dataset $k of $n of the step-10 file;" \
    "$(stat -c %s "$dir/.ckpt_00000010.h5.tmp") bytes of it left as the temp file, latest still ckpt_00000005.h5"
}
# dp=2, replicated arenas: rank 0 is the only writer
kill_mid_save kill0 0 "$t/k"
# dp=2, ZeRO-1: rank 1 writes its shard of m and v into the same file
kill_mid_save kill1 1 "$t/kz" parallel.zero=1
# the restarts (at the uninterrupted run's layout: resume is then exact) take step 5, not the
# half-written temp file
mpi 2 "$DTRAIN" "$cfg" $common checkpoint.dir="$t/k" checkpoint.resume=auto log.metrics="$t/k3.jsonl" > "$t/k3.out"
mpi 2 "$DTRAIN" "$cfg" $common checkpoint.dir="$t/kz" checkpoint.resume=auto train.stop_after=1 log.metrics="$t/kz3.jsonl" \
  > "$t/kz3.out"
for r in k3 kz3; do
  grep '^# resume' "$t/$r.out"
  grep -q "^# resume: .*ckpt_00000005.h5 at step 5" "$t/$r.out" || { echo "FAIL: $r: did not resume from step 5"; exit 1; }
done
[ ! -e "$t/k/.ckpt_00000010.h5.tmp" ] || { echo "FAIL: the temp file outlived the next save of step 10"; exit 1; }
"$PY" - "$t" "$top_srcdir/tests/ref" <<'PY'
import json, sys
import h5py, numpy as np
d = sys.argv[1]
load = lambda n: {r["step"]: r for r in map(json.loads, open(f"{d}/{n}.jsonl"))}
ref, got, gz = load("ref"), load("k3"), load("kz3")
assert sorted(got) == list(range(6, 21)), sorted(got)
assert sorted(gz) == [6], sorted(gz)
for s, r in list(got.items()) + list(gz.items()):
    for k in ("loss", "grad_norm", "lr"):
        assert r[k] == ref[s][k], f"step {s}: {k} {r[k]!r} after recovery, {ref[s][k]!r} uninterrupted"
fa, fb = h5py.File(f"{d}/ref/ckpt_00000020.h5", "r"), h5py.File(f"{d}/k/ckpt_00000020.h5", "r")
n = 0
for grp in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
    for k in fa[grp]:
        assert np.array_equal(fa[grp][k][()].view(np.uint32), fb[grp][k][()].view(np.uint32)), f"/{grp}/{k} differs"
        n += 1
print("after the kills: resumed at step 5; steps 6-20 (and step 6 after the ZeRO-1 kill) log bitwise the losses, grad norms "
      f"and lr of the uninterrupted run, and the final {n} tensors (params, m, v) are bitwise equal")
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
# 4. a full disk during a save (the ranks talk over TCP: Open MPI's shared-memory segment is a file too)
status=0
mpi 2 --mca btl self,tcp bash -c 'trap "" XFSZ; ulimit -f 600; exec "$@"' limit "$DTRAIN" "$cfg" $common \
  checkpoint.dir="$t/full" checkpoint.resume=auto > "$t/full1.out" 2>&1 || status=$?
grep 'cannot write' "$t/full1.out" || true
ls -a "$t/full"
[ "$status" -ne 0 ] || { cat "$t/full1.out"; echo "FAIL: full disk: the run went on"; exit 1; }
grep -Eq "^dtrain: rank 0 .*/\.ckpt_00000010\.h5\.tmp: /[a-z_/.0-9]+: cannot write dataset \(HDF5: .*write failed\)" "$t/full1.out" ||
  { cat "$t/full1.out"; echo "FAIL: full disk: no line naming the file, the dataset and the failed write"; exit 1; }
[ ! -e "$t/full/ckpt_00000010.h5" ] && [ ! -e "$t/full/.ckpt_00000010.h5.tmp" ] ||
  { echo "FAIL: full disk: step 10's file was committed or left behind"; exit 1; }
[ "$(cat "$t/full/latest")" = ckpt_00000005.h5 ] || { echo "FAIL: full disk: latest is '$(cat "$t/full/latest")'"; exit 1; }
mpi 2 "$DTRAIN" "$cfg" $common checkpoint.dir="$t/full" checkpoint.resume=auto log.metrics="$t/full2.jsonl" > "$t/full2.out"
grep -q "^# resume: .*ckpt_00000005.h5 at step 5" "$t/full2.out" || { echo "FAIL: full disk: did not resume from step 5"; exit 1; }
"$PY" - "$t" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: {r["step"]: r for r in map(json.loads, open(f"{d}/{n}.jsonl"))}
ref, got = load("ref"), load("full2")
assert sorted(got) == list(range(6, 21)), sorted(got)
for s, r in got.items():
    for k in ("loss", "grad_norm", "lr"):
        assert r[k] == ref[s][k], f"step {s}: {k} {r[k]!r} after the full disk, {ref[s][k]!r} uninterrupted"
print("after the full disk: resumed at step 5, steps 6-20 bitwise as the uninterrupted run")
PY
echo "ckpt_faults: OK"
