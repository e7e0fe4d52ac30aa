#!/usr/bin/env bash
# Exact resume: 20 steps straight vs 10 steps, checkpoint, a NEW process, 10 more steps. Every
# logged loss (printed with 17 significant digits), gradient norm and lr, and the final parameters
# and AdamW moments (compared in the final checkpoints) must be bitwise identical. Same layout
# (dp=2), CPU. Both runs' lr must be what the schedule formula gives (tests/ref/metrics_match.py):
# a resume that restarted the schedule or shifted it by a step is caught there.
source "$top_srcdir/tests/lib.sh"
begin_test
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/a" log.metrics="$t/a.jsonl" > "$t/a.out"
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/b" log.metrics="$t/b.jsonl" train.stop_after=10 > "$t/b1.out"
ls "$t/b"
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/b" log.metrics="$t/b.jsonl" checkpoint.resume=auto > "$t/b2.out"
grep '^# resume' "$t/b2.out"
grep -q '^# resume: .*ckpt_00000010.h5 at step 10' "$t/b2.out" || { echo "FAIL: did not resume from step 10"; exit 1; }
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/a.jsonl" "$cfg"
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/b.jsonl" "$cfg"
"$PY" - "$t" <<'PY'
import json, sys
import h5py, numpy as np
d = sys.argv[1]
a = [json.loads(l) for l in open(f"{d}/a.jsonl")]
b = [json.loads(l) for l in open(f"{d}/b.jsonl")]
assert [r["step"] for r in a] == list(range(1, 21)), "straight run steps"
assert [r["step"] for r in b] == list(range(1, 21)), "resumed run steps"
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "lr"):
        assert x[k] == y[k], f"step {x['step']}: {k} {x[k]!r} != {y[k]!r}"
    assert (x["sample0"], x["samples"]) == (y["sample0"], y["samples"]), f"step {x['step']}: samples differ"
print("all 20 losses (17 digits), gradient norms and lr (9 digits) identical, and the same samples per step")
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
