#!/usr/bin/env bash
# fp16 dynamic loss scaling with a planted overflow, 2 ranks (dp=2), CPU backend.
# DTRAIN_FAULT=grad_inf@1:5 puts +inf into ONE gradient of rank 1 only, at step 5, after the
# gradient all-reduce (so rank 0's own gradients stay finite: only the all-rank agreement can
# make rank 0 skip). loss_scale_init = 1024, loss_scale_window = 3. Hand-derived from
# GradScaler's rule (x2 when the growth tracker reaches 3, x0.5 and skip on inf), the scale each
# step's backward uses and the skips are
#   step:   1    2    3    4    5     6    7    8    9    10   11   12
#   scale:  1024 1024 1024 2048 2048  1024 1024 1024 2048 2048 2048 4096
#   skip:   -    -    -    -    yes   -    -    -    -    -    -    -
# Checked on EVERY rank from its own metrics file (log.metrics with {rank}); rank 1's grad_norm
# at step 5 is null (inf), rank 0's finite. Checkpoints after every step show the skip did not
# touch the weights or AdamW moments (ckpt 5 == ckpt 4 bitwise, ckpt 6 != ckpt 5) and carry the
# scaler state (loss_scale, loss_scale_growth, skipped_steps). Steps 1-5 have the same losses as
# a run without the fault (the skip happens after step 5's forward/backward). Finally, the same
# fault in a bf16 run (no loss scaling) stops the job with exit status 1 and a message naming
# the non-finite gradient norm.
source "$top_srcdir/tests/lib.sh"
begin_test
common=(system.backend=cpu train.steps=12 train.precision=fp16 train.loss_scale_init=1024 train.loss_scale_window=3
  checkpoint.every=1 checkpoint.keep=20)
echo "+ DTRAIN_FAULT=grad_inf@1:5"
mpi 2 -x DTRAIN_FAULT=grad_inf@1:5 "$DTRAIN" "$cfg" "${common[@]}" checkpoint.dir="$t/f" \
  log.metrics="$t/f.{rank}.jsonl" > "$t/f.out"
grep '^# step' "$t/f.out"
mpi 2 "$DTRAIN" "$cfg" "${common[@]}" checkpoint.dir="$t/c" log.metrics="$t/c.jsonl" > "$t/c.out"
"$PY" - "$t" <<'PY'
import json, sys
import h5py, numpy as np
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
want_scale = [1024, 1024, 1024, 2048, 2048, 1024, 1024, 1024, 2048, 2048, 2048, 4096]
want_skip = [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
runs = {r: load(f"f.{r}") for r in (0, 1)}
for r, rows in runs.items():
    assert [x["step"] for x in rows] == list(range(1, 13)), f"rank {r}: steps"
    got_scale = [x["loss_scale"] for x in rows]
    got_skip = [x["skipped"] for x in rows]
    assert got_scale == want_scale, f"rank {r}: loss scales {got_scale}"
    assert got_skip == want_skip, f"rank {r}: skips {got_skip}"
    print(f"rank {r}: loss scale per step {got_scale}, skipped {got_skip}: as hand-derived")
assert runs[1][4]["grad_norm"] is None and runs[0][4]["grad_norm"] is not None, "the inf was not rank 1's alone"
assert [x["loss"] for x in runs[0]] == [x["loss"] for x in runs[1]], "ranks log different losses"
clean = load("c")
assert all(x["skipped"] == 0 for x in clean), "the run without the fault skipped a step"
for a, b in zip(clean[:5], runs[0][:5]):
    assert a["loss"] == b["loss"], f"step {a['step']}: {a['loss']} vs {b['loss']} before the skip took effect"
assert clean[5]["loss"] != runs[0][5]["loss"], "step 6 should differ: step 5's update was skipped"
print("steps 1-5 bitwise equal to a run without the fault; step 6 differs")
def tensors(step):
    f = h5py.File(f"{d}/f/ckpt_{step:08d}.h5", "r")
    out = {}
    for grp in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
        for k in f[grp]:
            out[f"{grp}/{k}"] = f[grp][k][()].view(np.uint32)
    st = f["state"].attrs
    return out, (float(st["loss_scale"]), int(st["loss_scale_growth"]), int(st["skipped_steps"]))
t4, s4 = tensors(4)
t5, s5 = tensors(5)
t6, s6 = tensors(6)
assert all(np.array_equal(t4[k], t5[k]) for k in t4), "the skipped step changed weights or moments"
assert any(not np.array_equal(t5[k], t6[k]) for k in t5), "step 6 did not update"
print(f"checkpoint 5 == checkpoint 4 in all {len(t4)} tensors (weights, exp_avg, exp_avg_sq); 6 differs")
assert s4 == (2048.0, 1, 0) and s5 == (1024.0, 0, 1) and s6 == (1024.0, 1, 1), (s4, s5, s6)
print(f"checkpoint state (loss_scale, growth, skipped): step 4 {s4}, step 5 {s5}, step 6 {s6}")
PY
set +e
echo "+ DTRAIN_FAULT=grad_inf@0:2 (bf16: no loss scaling, must stop)"
DTRAIN_FAULT=grad_inf@0:2 run "$DTRAIN" "$cfg" system.backend=cpu train.steps=4 train.precision=bf16 \
  checkpoint.dir="$t/b" > "$t/b.out" 2> "$t/b.err"
rc=$?
set -e
cat "$t/b.err"
[ "$rc" -eq 1 ] || { echo "FAIL: bf16 with an inf gradient exited $rc, want 1"; exit 1; }
grep -q 'step 2: gradient norm is inf' "$t/b.err" || { echo "FAIL: no message about the inf norm"; exit 1; }
echo "precision_scaler: OK"
