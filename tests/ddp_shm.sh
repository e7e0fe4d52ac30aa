#!/usr/bin/env bash
# DDP's gradient average in shared memory (parallel.ddp_comm, src/parallel/ddp_shm.c), against
# MPI's all-reduce, on a 4-layer x 128 model with 1 MiB buckets (4 buckets, each cut into one
# slice per rank), 12 steps of 2 micro-batches:
#   1. dp = 2: auto picks shared memory (the start line says so) and every loss and gradient norm
#      is bitwise MPI's (a + b and the halving are exact in any order), and so are the final
#      parameters and AdamW moments.
#   2. dp = 3 (not a power of two: a division, slices of unequal ranks): within 1e-6 of MPI's.
#   3. No room in /dev/shm (the test-only fault ddp_shm_nospace): auto falls back to MPI and says
#      why on its start line, with MPI's losses; shm required ends the run with one line and
#      status 2 (a configuration that cannot be met) before any step.
#   4. A rank that stops after its backward (fault stall): the peer waits in the average, and the
#      hang watchdog ends the job with 75, naming the all-reduce on "dp (shared memory)".
#   5. No /dev/shm file is left behind by any of these runs.
source "$top_srcdir/tests/lib.sh"
begin_test
export DTRAIN_FAULT=
ls /dev/shm > "$t/shm.before" 2>/dev/null || true
model="model.n_layer=4 model.n_embd=128 parallel.bucket_mb=1 train.steps=12 train.eval_every=0 log.every=1"
# train N NAME [ARGS...]: N ranks, metrics and final checkpoint in $t/NAME* (DTRAIN_FAULT passed on)
train() {
  local n=$1 name=$2
  shift 2
  mpi "$n" -x DTRAIN_FAULT "$DTRAIN" "$cfg" $model train.global_batch=$((4 * n)) train.micro_batch=2 log.metrics="$t/$name.jsonl" \
    checkpoint.dir="$t/c-$name" "$@" > "$t/$name.out" 2>&1 || { cat "$t/$name.out"; echo "FAIL: $name"; exit 1; }
  grep '^# gradients:' "$t/$name.out"
}
train 2 shm2
train 2 mpi2 parallel.ddp_comm=mpi
train 3 shm3 parallel.ddp_comm=shm
train 3 mpi3 parallel.ddp_comm=mpi
for r in shm2 shm3; do
  grep -q '^# gradients: 4 buckets, averaged in shared memory' "$t/$r.out" || { echo "FAIL: $r: not in shared memory"; exit 1; }
done
grep -q '^# gradients: 4 buckets, MPI nonblocking all-reduce (parallel.ddp_comm = mpi)$' "$t/mpi2.out" ||
  { echo "FAIL: mpi2: its start line does not say MPI"; exit 1; }
"$PY" - "$t" "$top_srcdir/tests/ref" <<'PY'
import sys
import h5py
import numpy as np
d = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from metrics_match import load, agree
def state(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) and
                     k.startswith(("model/", "optim/")) else None)
    return out
a, b = load(f"{d}/shm2.jsonl"), load(f"{d}/mpi2.jsonl")
assert len(a) == len(b) == 12, "dp=2: 12 steps each"
for x, y in zip(a, b):
    assert (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"]), f"dp=2 step {x['step']}: {x} vs {y}"
sa, sb = state(f"{d}/c-shm2/ckpt_00000012.h5"), state(f"{d}/c-mpi2/ckpt_00000012.h5")
assert sa.keys() == sb.keys() and len(sa) > 10, sorted(sa)[:5]
for k in sa:
    assert np.array_equal(sa[k], sb[k]), f"dp=2: {k} differs"
print(f"dp=2: shared memory = MPI bitwise: 12 losses and gradient norms, {len(sa)} tensors")
agree(load(f"{d}/mpi3.jsonl"), load(f"{d}/shm3.jsonl"), "dp=3 shared memory", 1e-6, ref_name="MPI")
sa, sb = state(f"{d}/c-shm3/ckpt_00000012.h5"), state(f"{d}/c-mpi3/ckpt_00000012.h5")
worst = max(float(np.linalg.norm(sa[k] - sb[k]) / max(np.linalg.norm(sb[k]), 1e-30)) for k in sa if k.startswith("model/"))
assert worst <= 1e-6, f"dp=3: parameters differ by {worst:.2e} (relative)"
print(f"dp=3: within 1e-6 of MPI (parameters {worst:.1e})")
PY

# 3. /dev/shm full
DTRAIN_FAULT=ddp_shm_nospace@0 train 2 full
grep -Eq '^# gradients: 4 buckets, MPI nonblocking all-reduce \(parallel.ddp_comm = auto; no shared memory: [0-9.]+ MiB of shared memory \(/dev/shm\) not available to every rank: No space left on device\)$' "$t/full.out" ||
  { echo "FAIL: full: the start line does not say why not shared memory"; exit 1; }
cmp <(grep -o '"loss": [^,]*' "$t/full.jsonl") <(grep -o '"loss": [^,]*' "$t/mpi2.jsonl") ||
  { echo "FAIL: full: losses differ from MPI's"; exit 1; }
status=0
DTRAIN_FAULT=ddp_shm_nospace@0 mpi 2 -x DTRAIN_FAULT "$DTRAIN" "$cfg" $model parallel.ddp_comm=shm \
  checkpoint.dir="$t/c-req" > "$t/req.out" 2>&1 || status=$?
cat "$t/req.out" | grep -v '^#' | head -5
[ "$status" -eq 2 ] || { echo "FAIL: shm required without room: exit status $status, want 2"; exit 1; }
grep -q 'parallel.ddp_comm = shm: [0-9.]* MiB of shared memory (/dev/shm) not available to every rank: No space left on device' "$t/req.out" ||
  { echo "FAIL: shm required: no line naming the key and the reason"; exit 1; }
! grep -q '^ *1 ' "$t/req.out" || { echo "FAIL: shm required: a step ran"; exit 1; }
[ -z "$(ls -A "$t/c-req" 2>/dev/null)" ] || { echo "FAIL: shm required: wrote $(ls "$t/c-req")"; exit 1; }

# 4. a stalled rank
status=0
start=$(date +%s)
DTRAIN_FAULT=stall@1:5 timeout -s KILL 60 "$MPIRUN" --oversubscribe --bind-to none -n 2 -x OMP_NUM_THREADS=1 \
  -x DTRAIN_FAULT "$DTRAIN" "$cfg" $model system.comm_timeout=3 checkpoint.dir="$t/c-stall" > "$t/stall.out" 2>&1 || status=$?
elapsed=$(($(date +%s) - start))
line=$(grep -m1 '^dtrain: watchdog: rank' "$t/stall.out") || { cat "$t/stall.out"; echo "FAIL: stall: no watchdog line"; exit 1; }
echo "stall: exit status $status after $elapsed s: $line"
[ "$status" -eq 75 ] || { echo "FAIL: stall: exit status $status, want 75"; exit 1; }
echo "$line" | grep -Eq 'at step 5: allreduce of [0-9]+ f32 on communicator dp \(shared memory\) \(rank 0 of 2, [0-9]+ bytes\) not complete' ||
  { echo "FAIL: stall: the line does not name the shared-memory average"; exit 1; }

# 5. nothing left in /dev/shm (a file of a process still running belongs to another test)
sleep 0.5
for f in $(ls /dev/shm 2>/dev/null | grep '^dtrain-ddp-' | grep -vxFf "$t/shm.before" || true); do
  pid=${f#dtrain-ddp-}
  pid=${pid%%-*}
  [ -d "/proc/$pid" ] || { echo "FAIL: /dev/shm/$f left behind"; exit 1; }
done
echo "ddp_shm: OK"
