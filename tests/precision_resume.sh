#!/usr/bin/env bash
# Exact resume of an fp16 run: the loss-scaler state (scale, growth tracker, skipped steps) is
# restored from the checkpoint. dp=2, loss_scale_init = 1024, loss_scale_window = 3, an overflow
# planted on rank 0 at step 5 (DTRAIN_FAULT=grad_inf@0:5). 16 steps straight vs 9 steps,
# checkpoint, a NEW job, 7 more. After step 9 the state is scale 2048, growth 1, 1 skipped step
# (not the initial 1024/0/0): a resume that lost any of it would grow the scale at the wrong
# step or use another AdamW step count, and the losses would differ. Every logged loss, gradient
# norm, lr, loss scale and skip flag must be bitwise identical, and so must the final weights and
# moments; the lr is also checked against the schedule formula (tests/ref/metrics_match.py).
# Also: a checkpoint without the skipped_steps attribute (older files) resumes with 0 skipped.
source "$top_srcdir/tests/lib.sh"
begin_test
opts=(system.backend=cpu train.steps=16 train.precision=fp16 train.loss_scale_init=1024 train.loss_scale_window=3)
echo "+ DTRAIN_FAULT=grad_inf@0:5 for every run"
mpi 2 -x DTRAIN_FAULT=grad_inf@0:5 "$DTRAIN" "$cfg" "${opts[@]}" checkpoint.dir="$t/a" log.metrics="$t/a.jsonl" > "$t/a.out"
mpi 2 -x DTRAIN_FAULT=grad_inf@0:5 "$DTRAIN" "$cfg" "${opts[@]}" checkpoint.dir="$t/b" log.metrics="$t/b.jsonl" \
  train.stop_after=9 > "$t/b1.out"
mpi 2 -x DTRAIN_FAULT=grad_inf@0:5 "$DTRAIN" "$cfg" "${opts[@]}" checkpoint.dir="$t/b" log.metrics="$t/b.jsonl" \
  checkpoint.resume=auto > "$t/b2.out"
grep '^# resume' "$t/b2.out"
grep -q '^# resume: .*ckpt_00000009.h5 at step 9' "$t/b2.out" || { echo "FAIL: did not resume from step 9"; exit 1; }
grep -q '^# resume: loss scale 2048, 1 clean steps since the last overflow or growth, 1 steps skipped' "$t/b2.out" ||
  { echo "FAIL: the resumed scaler state is not 2048/1/1"; exit 1; }
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/b.jsonl" "$cfg" "${opts[@]}"
"$PY" - "$t" <<'PY'
import json, sys
import h5py, numpy as np
d = sys.argv[1]
a = [json.loads(l) for l in open(f"{d}/a.jsonl")]
b = [json.loads(l) for l in open(f"{d}/b.jsonl")]
assert [r["step"] for r in a] == list(range(1, 17)) and [r["step"] for r in b] == list(range(1, 17)), "steps"
assert [r["skipped"] for r in a] == [int(s == 5) for s in range(1, 17)], "step 5 must be the only skip"
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "lr", "loss_scale", "skipped", "sample0"):
        assert x[k] == y[k], f"step {x['step']}: {k} {x[k]!r} != {y[k]!r}"
print("16 losses (17 digits), grad norms and lr identical; loss scales", [r["loss_scale"] for r in a], "and skips identical")
fa, fb = h5py.File(f"{d}/a/ckpt_00000016.h5", "r"), h5py.File(f"{d}/b/ckpt_00000016.h5", "r")
n = 0
for grp in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
    for k in fa[grp]:
        assert np.array_equal(fa[grp][k][()].view(np.uint32), fb[grp][k][()].view(np.uint32)), f"{grp}/{k} differs"
        n += 1
sa = {k: fa["state"].attrs[k] for k in ("loss_scale", "loss_scale_growth", "skipped_steps")}
sb = {k: fb["state"].attrs[k] for k in sa}
assert sa == sb, (sa, sb)
print(f"final checkpoints: {n} tensors bitwise identical; scaler state {sa} identical")
PY
# A file written before mixed precision has no skipped_steps attribute: it reads as 0.
cp "$t/b/ckpt_00000009.h5" "$t/old.h5"
run "$PY" -c 'import h5py, sys; del h5py.File(sys.argv[1], "r+")["state"].attrs["skipped_steps"]' "$t/old.h5"
mpi 2 "$DTRAIN" "$cfg" "${opts[@]}" train.steps=10 checkpoint.dir="$t/o" checkpoint.resume="$t/old.h5" > "$t/o.out"
grep '^# resume: loss' "$t/o.out"
grep -q '^# resume: loss scale 2048, 1 clean steps since the last overflow or growth, 0 steps skipped' "$t/o.out" ||
  { echo "FAIL: a file without skipped_steps did not read as 0 skipped"; exit 1; }
echo "precision_resume: OK"
