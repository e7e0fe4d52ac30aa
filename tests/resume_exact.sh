#!/usr/bin/env bash
# Exact resume: 20 steps straight vs 10 steps, checkpoint, a NEW process, 10 more steps. Every
# logged loss (printed with 17 significant digits) and the final parameters and AdamW moments
# (compared in the final checkpoints) must be bitwise identical. Same layout (dp=2), CPU.
source "$top_srcdir/tests/lib.sh"
begin_test
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/a" log.metrics="$t/a.jsonl" > "$t/a.out"
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/b" log.metrics="$t/b.jsonl" train.stop_after=10 > "$t/b1.out"
ls "$t/b"
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/b" log.metrics="$t/b.jsonl" checkpoint.resume=auto > "$t/b2.out"
grep '^# resume' "$t/b2.out"
grep -q '^# resume: .*ckpt_00000010.h5 at step 10' "$t/b2.out" || { echo "FAIL: did not resume from step 10"; exit 1; }
"$PY" - "$t" <<'PY'
import json, sys
import h5py, numpy as np
d = sys.argv[1]
a = [json.loads(l) for l in open(f"{d}/a.jsonl")]
b = [json.loads(l) for l in open(f"{d}/b.jsonl")]
assert [r["step"] for r in a] == list(range(1, 21)), "straight run steps"
assert [r["step"] for r in b] == list(range(1, 21)), "resumed run steps"
for x, y in zip(a, b):
    assert x["loss"] == y["loss"], f"step {x['step']}: {x['loss']!r} != {y['loss']!r}"
    assert (x["sample0"], x["samples"]) == (y["sample0"], y["samples"]), f"step {x['step']}: samples differ"
print("all 20 losses bitwise identical (17 digits) and the same samples per step")
fa, fb = h5py.File(f"{d}/a/ckpt_00000020.h5", "r"), h5py.File(f"{d}/b/ckpt_00000020.h5", "r")
n = 0
for grp in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
    for k in fa[grp]:
        x, y = fa[grp][k][()], fb[grp][k][()]
        assert x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32)), f"{grp}/{k} differs"
        n += 1
print(f"final checkpoints: {n} tensors (params, exp_avg, exp_avg_sq) bitwise identical")
PY
echo "resume_exact: OK"
