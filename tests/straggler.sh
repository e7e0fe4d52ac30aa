#!/usr/bin/env bash
# The straggler report end to end: rank 1 of 4 sleeps 0.5 s in every step (DTRAIN_FAULT=slow_rank,
# test only); every log.every = 2 steps rank 0's `# straggler:` line must name rank 1 as the
# slowest with max >= 500 ms and min < 500 ms (the others wait for it, which does not count),
# and the JSONL rows of those steps must carry the same fields. With log.straggler_every=0 no
# line and no field.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
cd "$top_builddir"
DTRAIN_FAULT=slow_rank@1 mpi 4 -x DTRAIN_FAULT "$DTRAIN" "$top_srcdir/tests/small.ini" train.global_batch=16 \
  train.steps=4 log.every=2 log.metrics="$t/m.jsonl" checkpoint.dir="$t/ck" > "$t/out" 2>&1 || { cat "$t/out"; exit 1; }
grep '^# straggler' "$t/out"
[ "$(grep -c '^# straggler: step [24]: ms per step outside communication over 4 ranks: .*(slowest: rank 1, host ' "$t/out")" -eq 2 ] ||
  { echo "FAIL: want a straggler line naming rank 1 at steps 2 and 4"; exit 1; }
"$PY" - "$t/m.jsonl" <<'PY' || exit 1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [2, 4], rows
for r in rows:
    assert r["slowest_rank"] == 1, r
    assert r["rank_ms_max"] >= 500 > r["rank_ms_min"], r
    assert r["rank_ms_min"] <= r["rank_ms_median"] <= r["rank_ms_max"], r
print("ok: JSONL rows of steps 2 and 4 name rank 1, max %.1f ms, min %.1f ms" % (rows[-1]["rank_ms_max"], rows[-1]["rank_ms_min"]))
PY
mpi 2 "$DTRAIN" "$top_srcdir/tests/small.ini" train.steps=2 log.every=1 log.straggler_every=0 log.metrics="$t/off.jsonl" \
  checkpoint.dir="$t/ck-off" > "$t/off" 2>&1 || { cat "$t/off"; exit 1; }
! grep -q '^# straggler' "$t/off" && ! grep -q slowest_rank "$t/off.jsonl" || { echo "FAIL: a report with log.straggler_every=0"; exit 1; }
echo "straggler: OK"
