#!/usr/bin/env bash
# Any-layout resume: a checkpoint written at dp=2 (step 10 of 20) resumes at dp=1 (grad_accum 2)
# and at dp=4 (micro_batch 2), same global batch. The losses of steps 11-20 must match the
# uninterrupted dp=2 run within 1e-5 relative (only summation order differs, see ddp_equiv.sh),
# and the global sample indices consumed after resume are exactly those of the uninterrupted run.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
cd "$top_builddir"
cfg="$top_srcdir/tests/small.ini"
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/ref" log.metrics="$t/ref.jsonl" > "$t/ref.out"
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/c" train.stop_after=10 > "$t/c.out"
for n in 1 4; do
  mkdir -p "$t/dp$n"
  cp "$t/c/ckpt_00000010.h5" "$t/dp$n/"
  extra=""
  [ "$n" = 4 ] && extra="train.micro_batch=2"
  mpi "$n" "$DTRAIN" "$cfg" checkpoint.dir="$t/dp$n" checkpoint.resume=auto log.metrics="$t/dp$n.jsonl" $extra > "$t/dp$n.out"
  grep '^# resume' "$t/dp$n.out"
done
"$PY" - "$t" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
ref = {r["step"]: r for r in load("ref")}
for n in ("dp1", "dp4"):
    rows = load(n)
    assert [r["step"] for r in rows] == list(range(11, 21)), (n, [r["step"] for r in rows])
    worst = 0
    for r in rows:
        x = ref[r["step"]]
        assert (r["sample0"], r["samples"]) == (x["sample0"], x["samples"]), f"{n} step {r['step']}: samples differ"
        rel = abs(r["loss"] - x["loss"]) / abs(x["loss"])
        worst = max(worst, rel)
        assert rel <= 1e-5, f"{n} step {r['step']}: {r['loss']} vs {x['loss']} rel {rel:.2e}"
    print(f"{n}: steps 11-20 consume the same global samples; worst loss difference {worst:.2e} (limit 1e-5)")
PY
echo "resume_layout: OK"
