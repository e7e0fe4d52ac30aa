#!/usr/bin/env bash
# DT_GEMM_CENSUS=1 (src/backend/gemm_census.c): a real training run prints, at exit on stderr, one
# row per sgemm shape with its calls, and the header's call count is the rows' sum. Checked on a
# shape whose count follows from the run: tests/small.ini's MLP projection (4C = 256 -> C = 64 over
# micro_batch x seq_len = 128 tokens, NT 128 x 64 x 256) runs once per layer per micro-batch: 2
# layers x 2 micro-batches x 2 steps = 8 calls. Without the variable nothing is printed.
source "$top_srcdir/tests/lib.sh"
begin_test
fail() { echo "FAIL: $*"; exit 1; }
args="train.steps=2 train.eval_every=0 log.every=1 checkpoint.dir=$t/ck"
echo "+ DT_GEMM_CENSUS=1 $MPIRUN -n 1 $DTRAIN $cfg $args" >&2
DT_GEMM_CENSUS=1 "$MPIRUN" --bind-to none -n 1 -x DT_GEMM_CENSUS "$DTRAIN" "$cfg" $args > "$t/on.out" 2> "$t/on.err" ||
  { cat "$t/on.out" "$t/on.err"; fail "run with the census"; }
cat "$t/on.err"
"$PY" - "$t/on.err" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"^# gemm census \(DT_GEMM_CENSUS\): (\d+) calls, ([\d.]+) ms, ([\d.]+) GFLOP/s over all", text, re.M)
assert m, "no census header"
rows = [l.split() for l in text.splitlines() if re.match(r"^  [NT][NT] ", l)]
assert sum(int(r[4]) for r in rows) == int(m.group(1)), f"header says {m.group(1)} calls, the rows sum to another"
shapes = {(r[0], int(r[1]), int(r[2]), int(r[3])): int(r[4]) for r in rows}
assert len(shapes) == len(rows), "a shape in two rows"
assert shapes.get(("NT", 128, 64, 256)) == 8, f"MLP projection: {shapes.get(('NT', 128, 64, 256))} calls, want 8"
assert all(float(r[5]) >= 0 and float(r[6]) >= 0 for r in rows)
print(f"census: {len(rows)} shapes, {m.group(1)} calls; the MLP projection 8 calls: consistent")
PY
run "$MPIRUN" --bind-to none -n 1 "$DTRAIN" "$cfg" $args checkpoint.dir="$t/ck2" > "$t/off.out" 2> "$t/off.err" ||
  { cat "$t/off.out" "$t/off.err"; fail "run without the census"; }
! grep -q "gemm census" "$t/off.out" "$t/off.err" || fail "a census without DT_GEMM_CENSUS"
echo "PASS"
