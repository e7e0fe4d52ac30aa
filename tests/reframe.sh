#!/bin/bash
# validation/ as a ReFrame test library (validation/reframe/dtrain_checks.py) through ReFrame's
# Slurm scheduler (squeue) on the local cluster (2 virtual nodes x 2 ranks, CPU backend, system
# `ci`), with the checks environment, collectives, numerics and bandwidth (the others are the
# business of tests/validation.sh; here they are selected out and must show as skipped):
#  1. clean: reframe exits 0, the four tests pass (bandwidth's allreduce_busbw reported as a
#     ReFrame performance variable against the system file's reference), six are skipped;
#  2. planted faults (DTRAIN_FAULT, src/core/fault.h), as tests/validation.sh plants them: with
#     bad_math@0:3 reframe exits nonzero and exactly the numerics test fails, with validation/run's
#     message; with bad_allreduce@1 collectives fails and bandwidth (which depends on it) is
#     reported NOT RUN. The other faults of tests/validation.sh need the checks selected out here.
# ReFrame comes from PyPI into its own virtual environment (scripts/install-deps.sh --test).
set -u
: "${top_srcdir:?}" "${top_builddir:?}"
RF=${REFRAME:-/opt/dtrain-test-venv/bin/reframe}
[ -x "$RF" ] || { echo "SKIP: no ReFrame at $RF (scripts/install-deps.sh --test installs it)"; exit 77; }
source "$top_srcdir/tests/lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
begin_slurm_test dtrain-reframe || fail "the cluster did not start"
export DTRAIN="$top_builddir/dtrain" DTRAIN_DATA="$top_builddir/data" DTRAIN_VALIDATION_RETRY_STARTUP=1
export DTRAIN_SYSTEM=ci DTRAIN_CHECKS=environment,collectives,numerics,bandwidth
cd "$DIR"
rf() { # NAME: one reframe run into DIR/NAME, its output in DIR/NAME.out; returns reframe's status
  echo "\$ $RF -C validation/reframe/config_ci.py -c validation/reframe/dtrain_checks.py --prefix $DIR/$1 -r"
  timeout 600 "$RF" --nocolor -C "$top_srcdir/validation/reframe/config_ci.py" -c "$top_srcdir/validation/reframe/dtrain_checks.py" \
    --prefix "$DIR/$1" -r > "$DIR/$1.out" 2>&1
}

# 1. clean
rf clean
status=$?
grep -E '^\[ +(OK|FAIL|SKIP) +\]| P: |PASSED|FAILED' "$DIR/clean.out"
[ $status -eq 0 ] || { tail -60 "$DIR/clean.out"; fail "reframe exited $status on a clean run"; }
for c in environment collectives numerics bandwidth; do
  grep -Eq "^\[ +OK +\] .*dtrain_validation %check=$c( |$)" "$DIR/clean.out" || fail "$c did not pass"
done
[ "$(grep -Ec '^\[ +SKIP +\] .*dtrain_validation %check=' "$DIR/clean.out")" -eq 6 ] || fail "want the 6 other checks skipped"
grep -Eq '^ *P: allreduce_busbw: [0-9.e+-]+ GB/s \(r:0.2, l:-0.95, u:None\)' "$DIR/clean.out" ||
  fail "no allreduce_busbw performance line with the ci reference (0.2, -0.95, unbounded)"
echo "ok: clean: 4 checks passed, 6 skipped, allreduce_busbw reported against its reference"

# 2. planted faults: the tests that fail are the check that catches it (and what depends on it)
fault_case() { # FAULT "EXPECTED FAILING CHECKS " PATTERN-OF-THE-FIRST'S-MESSAGE
  DTRAIN_FAULT=$1 rf "fault-${1%%@*}"
  local status=$? o="$DIR/fault-${1%%@*}.out" failed
  grep -E '^\[ +(OK|FAIL|SKIP) +\]' "$o"
  [ $status -ne 0 ] || fail "reframe exited 0 with $1 planted"
  failed=$(sed -nE 's/^\[ +FAIL +\] .*dtrain_validation %check=([a-z_]+).*/\1/p' "$o" | tr '\n' ' ')
  [ "$failed" = "$2" ] || { tail -40 "$o"; fail "$1: failing tests '$failed', want '$2'"; }
  grep -q "$3" "$o" || { tail -40 "$o"; fail "$1: no '$3' in the failure messages"; }
  echo "ok: $1: failing tests: $failed"
}
fault_case bad_math@0:3 "numerics " 'numerics: FAIL: '
fault_case bad_allreduce@1 "collectives bandwidth " 'bandwidth: NOT RUN: depends on failed collectives'
echo "reframe: OK"
