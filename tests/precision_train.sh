#!/usr/bin/env bash
# Mixed precision on the CPU backend tracks fp32: tests/small.ini (2 layers, C=64, byte-level
# Austen data) trained 200 steps in fp32, bf16 and fp16 from the same initial weights and data,
# with the global-norm clipping at 1.0 the tolerances were measured with (small.ini itself trains
# unclipped; this and tests/zero_equiv.sh keep clipping in the suite).
# Tolerances on the training loss, stated against the fp32 run (measured when written: bf16 mean
# |diff| 0.004, worst 0.03, last-50 mean within 0.003; fp16 mean 0.0004, worst 0.002):
#   bf16: mean |diff| over all steps <= 0.02, every step <= 0.1, mean of steps 151-200 within 0.02
#   fp16: mean |diff| <= 0.005, every step <= 0.03, mean of steps 151-200 within 0.01
# and each mode's step-1 loss (same weights and batch, only the forward's rounding differs) must
# differ from fp32 (the rounding is really applied) by less than 0.02 (bf16) / 0.002 (fp16).
# The fp16 run keeps its loss scale of 65536 throughout (no inf/NaN here). A second fp16 run
# starts at loss scale 2^30, where the scaled logit gradients overflow fp16 for real: step 1
# must be skipped, every skipped step (null grad_norm) halves the scale for the next, a clean
# step keeps it (growth only after 2000), and at most 15 of the 30 steps may be skipped.
source "$top_srcdir/tests/lib.sh"
begin_test
for p in fp32 bf16 fp16; do
  run "$DTRAIN" "$cfg" system.backend=cpu train.steps=200 train.grad_clip=1.0 train.precision=$p log.every=1 \
    log.metrics="$t/$p.jsonl" checkpoint.dir="$t/c_$p" > "$t/$p.out"
done
grep '^# precision\|^# loss scale' "$t/fp16.out"
run "$DTRAIN" "$cfg" system.backend=cpu train.steps=30 train.grad_clip=1.0 train.precision=fp16 train.loss_scale_init=1073741824 \
  log.metrics="$t/big.jsonl" checkpoint.dir="$t/c_big" > "$t/big.out"
grep '^# step' "$t/big.out" || true
"$PY" - "$t" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
ref = load("fp32")
assert [r["step"] for r in ref] == list(range(1, 201)), "fp32 steps"
assert ref[-1]["loss"] < ref[0]["loss"] - 0.5, "fp32 did not learn"
lim = {"bf16": (0.02, 0.1, 0.02, 0.02), "fp16": (0.005, 0.03, 0.01, 0.002)}
for p, (mean_max, step_max, tail_max, first_max) in lim.items():
    rows = load(p)
    assert [r["step"] for r in rows] == list(range(1, 201)), f"{p} steps"
    diff = [abs(a["loss"] - b["loss"]) for a, b in zip(ref, rows)]
    mean = sum(diff) / len(diff)
    worst = max(diff)
    tail = abs(sum(a["loss"] for a in ref[150:]) - sum(b["loss"] for b in rows[150:])) / 50
    print(f"{p}: step-1 diff {diff[0]:.3g} (0 < . < {first_max}), mean |diff| {mean:.4f} (<= {mean_max}), "
          f"worst {worst:.4f} at step {diff.index(worst) + 1} (<= {step_max}), steps 151-200 mean diff {tail:.4f} (<= {tail_max}); "
          f"final loss {rows[-1]['loss']:.4f} vs fp32 {ref[-1]['loss']:.4f}")
    assert 0 < diff[0] < first_max, f"{p}: step-1 loss {rows[0]['loss']} vs fp32 {ref[0]['loss']}"
    assert mean <= mean_max and worst <= step_max and tail <= tail_max, f"{p} does not track fp32"
    if p == "fp16":
        assert all(r["loss_scale"] == 65536 and r["skipped"] == 0 for r in rows), "fp16: unexpected overflow"
    else:
        assert all("loss_scale" not in r for r in rows), "bf16 must not log a loss scale"
big = load("big")
assert [r["step"] for r in big] == list(range(1, 31)), "big-scale steps"
assert big[0]["loss_scale"] == 2.0 ** 30 and big[0]["skipped"] == 1, "2^30 must overflow fp16 at step 1"
for a, b in zip(big, big[1:]):
    want = a["loss_scale"] / 2 if a["skipped"] else a["loss_scale"]
    assert b["loss_scale"] == want, f"step {b['step']}: scale {b['loss_scale']}, want {want} after {a}"
for r in big:
    assert (r["grad_norm"] is None) == (r["skipped"] == 1), f"step {r['step']}: skipped but finite norm or vice versa"
skips = [r["step"] for r in big if r["skipped"]]
assert len(skips) <= 15, f"{len(skips)} skipped steps"
print(f"fp16 from loss scale 2^30: steps {skips} overflowed and were skipped, halving the scale each time to "
      f"{big[-1]['loss_scale']:g} = 2^{30 - len(skips)}; the other {30 - len(skips)} steps clean")
PY
echo "precision_train: OK"
