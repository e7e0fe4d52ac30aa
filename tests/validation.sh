#!/bin/bash
# The validation suite (validation/) tested on the local Slurm cluster (2 virtual nodes x 2 ranks,
# CPU backend, system `ci`):
#  1. clean: validation/validate.sbatch --system ci submits itself and polls the job; every check
#     passes, exit 0, TAP and JUnit XML written. A skipped check counts as a failure here, not as
#     a pass: this cluster is built with the nodes and ranks all 10 checks need, so a skip (TAP
#     "ok N - x # SKIP", JUnit skipped=) means a check did not run; the bandwidth and scaling
#     pictures (validation/plots.py) are SVG with their axes and lines;
#  2. each planted fault (DTRAIN_FAULT, src/core/fault.h) under salloc, with the checks up to the one
#     that should catch it: validation/run exits nonzero and the first failing check in its summary
#     is that one:
#       bad_allreduce@1 -> collectives   bad_math@0:3 -> numerics
#       ckpt_noflush@0  -> checkpoint    slow_rank@1  -> throughput
#       tied_drift@1:3  -> model_parallel bn_local@1      -> cnn
#  3. slow_io@1 under salloc with only environment,checkpoint_io: checkpoint_io fails on the
#     write bandwidth. The fault makes rank 1's saves last 100x as long (src/core/fault.h), so the
#     write/dd ratio drops 100x on any disk (a fixed stall would only show on a fast one); the run
#     saves inputs/tiny.ini (39 MB) instead of the clean run's 0.65 GB, so the stall is 20-65 s
#     here (the save took 0.2-0.66 s); --timeout 400 lets a save of up to 4 s (~10 MB/s) stall.
set -u
: "${top_srcdir:?}" "${top_builddir:?}"
source "$top_srcdir/tests/lib.sh"
begin_slurm_test dtrain-valid || { echo "FAIL: the cluster did not start"; exit 1; }
export DTRAIN="$top_builddir/dtrain"
# Open MPI's start-up race on this one-host cluster (tests/lib.sh srun_once_more): one more launch
export DTRAIN_VALIDATION_RETRY_STARTUP=1
cd "$top_builddir"
fail() { echo "FAIL: $*"; exit 1; }
t_start=$(date +%s)

# 1. clean run through the sbatch wrapper
echo "\$ VALIDATION_OUTPUT=$DIR/clean-%j.out $top_srcdir/validation/validate.sbatch --system ci --workdir $DIR/clean --junit $DIR/clean.xml --timeout 120"
t0=$(date +%s)
VALIDATION_OUTPUT="$DIR/clean-%j.out" VALIDATION_SBATCH_ARGS="--time=10" timeout 600 \
  "$top_srcdir/validation/validate.sbatch" --system ci --workdir "$DIR/clean" --junit "$DIR/clean.xml" \
  --timeout 120 > "$DIR/clean.log" 2>&1
rc=$?
grep -v '^# \+[0-9]' "$DIR/clean.log" # the bench-comm rows are in the log file
[ $rc -eq 0 ] || fail "clean validation run exited $rc"
grep -q '^# failed checks: none' "$DIR/clean.log" || fail "clean run: summary does not say 'failed checks: none'"
skips=$(grep -E '^ok [0-9]+ - .*# SKIP' "$DIR/clean.log")
[ -z "$skips" ] || fail "clean run: skipped checks (a skip is not a pass; this cluster can run all 10): $skips"
n_ok=$(grep -E '^ok [0-9]+ - ' "$DIR/clean.log" | grep -vc '# SKIP')
[ "$n_ok" -eq 10 ] || fail "clean run: $n_ok of 10 TAP lines are ok (without SKIP)"
grep -q '<testsuite name="dtrain-validation.ci" tests="10" failures="0" errors="0" skipped="0"' "$DIR/clean.xml" ||
  { grep '<testsuite' "$DIR/clean.xml"; fail "JUnit XML: want 10 tests, 0 failures, 0 errors, 0 skipped"; }
grep -q 'checkpoint_io/ckpt_write_vs_dd' "$DIR/clean.log" || fail "no checkpoint write bandwidth vs dd in the summary"
grep -q 'throughput/scaling_efficiency' "$DIR/clean.log" || fail "no scaling efficiency (1 node vs 2 nodes) in the summary"
# the pictures next to the table: well-formed SVG with its axes, a line per collective / per series
"$PY" - "$DIR/clean" <<'PY' || fail "clean run: validation's plots"
import sys, xml.dom.minidom
d = sys.argv[1]
for name, words, lines in (("bandwidth", ["message size (bytes)", "busbw (GB/s)", "allreduce", "sendrecv"], 5),
                           ("scaling", ["ranks", "tokens/s", "measured", "ideal"], 2)):
    text = open(f"{d}/{name}.svg").read()
    doc = xml.dom.minidom.parseString(text)
    n = len(doc.getElementsByTagName("polyline"))
    missing = [w for w in words if w not in text]
    assert not missing and n == lines, f"{name}.svg: missing {missing}, {n} lines (want {lines})"
    print(f"ok: {name}.svg: {len(text)} bytes, {n} lines, names {words}")
PY
grep -q "^# plots: $DIR/clean/bandwidth.svg, $DIR/clean/scaling.svg" "$DIR/clean.log" || fail "no '# plots:' line"
echo "ok: clean run passed all 10 checks, none skipped, in $(($(date +%s) - t0)) s (TAP + JUnit XML, plots)"

# 2. planted faults: the suite must fail and name the right check first
# Each fault runs the checks up to the one that must catch it (that check's dependencies for a
# performance check), so every check before it is shown to pass with the fault in place; the
# checks after it, whose verdicts the test does not read, are left out (they took ~100 s).
sanity=environment,collectives,numerics,equivalence
for case in bad_allreduce@1/collectives/environment,collectives bad_math@0:3/numerics/environment,collectives,numerics \
  tied_drift@1:3/model_parallel/$sanity,model_parallel ckpt_noflush@0/checkpoint/$sanity,model_parallel,checkpoint \
  slow_rank@1/throughput/$sanity,throughput bn_local@1/cnn/environment,cnn; do
  IFS=/ read -r fault want checks <<< "$case"
  log="$DIR/fault-${fault%%@*}.log"
  t0=$(date +%s)
  echo "\$ DTRAIN_FAULT=$fault salloc -N 2 --ntasks-per-node=2 --cpus-per-task=1 $top_srcdir/validation/run --system ci --checks $checks --workdir $DIR/${fault%%@*} --timeout 120"
  DTRAIN_FAULT=$fault timeout 600 salloc -N 2 --ntasks-per-node=2 --cpus-per-task=1 --time=10 \
    "$top_srcdir/validation/run" --system ci --checks "$checks" --workdir "$DIR/${fault%%@*}" --timeout 120 > "$log" 2>&1
  rc=$?
  sed -n '/^# summary:/,/^# failed checks/p' "$log"
  grep "^not ok" "$log"
  got=$(sed -n 's/^# failed checks: //p' "$log")
  first=${got%%,*}
  [ $rc -ne 0 ] || { cat "$log"; fail "DTRAIN_FAULT=$fault: the suite passed (exit 0)"; }
  [ "$first" = "$want" ] || { cat "$log"; fail "DTRAIN_FAULT=$fault: first failing check is '$first', want '$want'"; }
  grep -q "^not ok [0-9]* - $want:" "$log" || fail "DTRAIN_FAULT=$fault: no 'not ok' TAP line for $want"
  echo "ok: DTRAIN_FAULT=$fault -> exit $rc, failing checks: $got ($(($(date +%s) - t0)) s)"
done
# The checkpoint_io check can fail: one rank's saves last 100x as long (only the checks it needs).
t0=$(date +%s)
log="$DIR/fault-slow_io.log"
small="--set ckpt_io_config=inputs/tiny.ini --set ckpt_io_args="
echo "\$ DTRAIN_FAULT=slow_io@1 salloc -N 2 --ntasks-per-node=2 --cpus-per-task=1 $top_srcdir/validation/run --system ci --checks environment,checkpoint_io $small --workdir $DIR/slow_io --timeout 400"
# shellcheck disable=SC2086
DTRAIN_FAULT=slow_io@1 timeout 600 salloc -N 2 --ntasks-per-node=2 --cpus-per-task=1 --time=10 \
  "$top_srcdir/validation/run" --system ci --checks environment,checkpoint_io $small --workdir "$DIR/slow_io" --timeout 400 \
  > "$log" 2>&1
rc=$?
sed -n '/^# summary:/,/^# failed checks/p' "$log"
[ $rc -ne 0 ] || { cat "$log"; fail "DTRAIN_FAULT=slow_io@1: the suite passed (exit 0)"; }
grep -q "^# failed checks: checkpoint_io$" "$log" || { cat "$log"; fail "DTRAIN_FAULT=slow_io@1: checkpoint_io is not the failing check"; }
grep -q "^not ok 2 - checkpoint_io: ckpt_write_vs_dd" "$log" || fail "DTRAIN_FAULT=slow_io@1: not failed on the write bandwidth"
echo "ok: DTRAIN_FAULT=slow_io@1 -> exit $rc, checkpoint_io failed on the write bandwidth ($(($(date +%s) - t0)) s)"
echo "validation: OK ($(($(date +%s) - t_start)) s)"
