#!/usr/bin/env bash
# Data parallelism is exact up to summation order: for the same global batch (8 sequences) and
# seed, dp=1 (grad_accum=2), dp=2 and dp=4 give the same loss and gradient norm at each of 20
# steps within 1e-5 relative, the same lr, and the same final parameters and AdamW moments. Only
# the order of float additions differs (gradient averages over ranks vs over micro-steps), which
# in fp32 moves results by a few ulps per step; 1e-5 leaves room for 20 steps of that drift while
# still catching any wrong sample, scale or missing reduction. tests/small.ini trains unclipped:
# a gradient scaled by dp (a sum where the average belongs) changes no loss (AdamW's step does not
# see a constant factor) but doubles grad_norm and m and quadruples v at dp=2. Every run's lr is
# checked against the schedule formula computed in tests/ref/metrics_match.py from small.ini.
source "$top_srcdir/tests/lib.sh"
begin_test
mpi 1 "$DTRAIN" "$cfg" log.metrics="$t/dp1.jsonl" checkpoint.dir="$t/c1" > "$t/dp1.out"
mpi 2 "$DTRAIN" "$cfg" log.metrics="$t/dp2.jsonl" checkpoint.dir="$t/c2" > "$t/dp2.out"
mpi 4 "$DTRAIN" "$cfg" train.micro_batch=2 log.metrics="$t/dp4.jsonl" checkpoint.dir="$t/c4" > "$t/dp4.out"
"$PY" - "$t" "$top_srcdir/tests/ref" "$cfg" <<'PY'
import sys
d, cfg = sys.argv[1], sys.argv[3]
sys.path.insert(0, sys.argv[2])
from metrics_match import load, agree, check_lr, schedule
from tensors_match import state_close
ref = load(f"{d}/dp1.jsonl")
assert [r["step"] for r in ref] == list(range(1, 21)), "dp1 steps"
sched = schedule(cfg)
check_lr(ref, sched, "dp=1")
for n in (2, 4):
    agree(ref, load(f"{d}/dp{n}.jsonl"), f"dp={n}", 1e-5, ref_name="dp=1")
# Final parameters and moments, gathered through the final checkpoints: per tensor ||a-b|| / ||a||,
# the key third of attn.c_attn.bias excluded (tests/ref/tensors_match.py says why).
for n in (2, 4):
    state_close(f"{d}/c1/ckpt_00000020.h5", f"{d}/c{n}/ckpt_00000020.h5", f"dp={n} vs dp=1", 1e-5, 1e-5, 1e-5)
PY

# The end-of-run overlap line agrees with the run's own step times (tests/ref/overlap_report.py).
for n in 2 4; do "$PY" "$top_srcdir/tests/ref/overlap_report.py" "$t/dp$n.out" "$t/dp$n.jsonl" ddp; done
# Every step a probe (all-reduces after backward: bench/ddp_overlap.sh's comparison run): the same
# sums, so the same losses and grad norms bit for bit, and its line's windows agree with its steps.
mpi 2 "$DTRAIN" "$cfg" parallel.ddp_probe=1 log.metrics="$t/dp2a.jsonl" checkpoint.dir= > "$t/dp2a.out"
"$PY" "$top_srcdir/tests/ref/overlap_report.py" "$t/dp2a.out" "$t/dp2a.jsonl" ddp_after
"$PY" - "$t" <<'PY'
import json, sys
rows = lambda n: [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{sys.argv[1]}/{n}.jsonl"))]
assert rows("dp2a") == rows("dp2"), "dp=2 with every all-reduce after backward differs from dp=2"
print("dp=2 with parallel.ddp_probe=1: losses and grad norms bitwise those of dp=2")
PY

# Launch mismatches are one clear line (from rank 0 only) and exit status 2, before any work.
check_mismatch() {
  local want=$1
  shift
  local status=0
  mpi 3 "$DTRAIN" "$cfg" "$@" > "$t/mm.out" 2> "$t/mm.err" || status=$?
  cat "$t/mm.err"
  [ "$status" -eq 2 ] || { echo "FAIL: exit status $status, want 2"; exit 1; }
  [ "$(grep -c '^dtrain: ' "$t/mm.err")" -eq 1 ] || { echo "FAIL: want exactly one error line"; exit 1; }
  grep -q "$want" "$t/mm.err" || { echo "FAIL: message lacks '$want'"; exit 1; }
}
check_mismatch "dp=2 x tp=1 x pp=1 = 2 ranks but the world has 3 ranks" parallel.dp=2
check_mismatch "train.global_batch: 8 is not a multiple of micro_batch\*dp = 4\*3"
echo "ddp_equiv: OK"
