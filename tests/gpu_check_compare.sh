#!/usr/bin/env bash
# scripts/gpu_check_compare.py's `runs` with --spread (the GPU check's classifiers stage): the
# per-step tolerance is the fixed one or 10x the running maximum of the difference between two
# reference runs, whichever is larger; the evaluation's likewise. Synthetic metrics rows, where
# the right verdict is known: a run inside the spread passes, the same difference one step
# before the spread grows fails, and without --spread the fixed tolerances apply.
. "$(dirname "$0")/lib.sh"
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
CMP="$PY $top_srcdir/scripts/gpu_check_compare.py"
rows() { # FILE LOSS... : steps 1..n with grad norm 10 x loss, an evaluation at the last step
  local f=$1 s=0
  shift
  : > "$f"
  for l in "$@"; do
    s=$((s + 1))
    if [ $s = $# ]; then ev=", \"val_loss\": $l, \"val_acc\": 0.5"; else ev=""; fi
    echo "{\"step\": $s, \"loss\": $l, \"grad_norm\": $(awk -v l="$l" 'BEGIN {printf "%.9g", 10 * l}')$ev}" >> "$f"
  done
}
# the references: apart by 1e-6 relative at step 2, 1e-3 from step 3 on
rows "$t/c.jsonl" 1.0 2.0 3.0 4.0
rows "$t/d.jsonl" 1.0 2.000002 3.003 4.004
rows "$t/late.jsonl" 1.0 2.0 3.02 4.03  # 7e-3 from step 3: within 10 x 1e-3
rows "$t/early.jsonl" 1.0 2.01 3.0 4.0  # 5e-3 at step 2, where the spread allows 1e-4 (the fixed floor)
rows "$t/far.jsonl" 1.0 2.0 3.0 4.2     # 5e-2 at step 4: outside 10 x 1e-3
run $CMP runs --rtol 1e-4 --norm-rtol 1e-3 --steps 4 --acc-images 100 --spread "$t/d.jsonl,$t/c.jsonl" \
  "late=$t/late.jsonl,$t/c.jsonl" > "$t/out" || { cat "$t/out"; echo "FAIL: inside the spread but rejected"; exit 1; }
cat "$t/out"
grep -q '^tolerance per step from the spread of .*: loss 1.0e-04 at step 1, 1.0e-02 at step 4' "$t/out" ||
  { echo "FAIL: the per-step tolerances"; exit 1; }
for bad in early far; do
  if run $CMP runs --rtol 1e-4 --norm-rtol 1e-3 --steps 4 --spread "$t/d.jsonl,$t/c.jsonl" \
    "$bad=$t/$bad.jsonl,$t/c.jsonl" > "$t/out"; then
    cat "$t/out"
    echo "FAIL: $bad passed"
    exit 1
  fi
  grep "^FAIL: $bad: " "$t/out"
done
if run $CMP runs --rtol 1e-4 --norm-rtol 1e-3 --steps 4 "late=$t/late.jsonl,$t/c.jsonl" > "$t/out"; then
  cat "$t/out"
  echo "FAIL: without --spread the fixed tolerances apply"
  exit 1
fi
echo "PASS: the spread widens the tolerance where the references part, and only there"
