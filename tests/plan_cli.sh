#!/usr/bin/env bash
# `dtrain plan`: GPT-2 1.5B (inputs/gpt2-xl.ini) at world 8 against an 80 GiB device prints the
# seed arithmetic (6.23 GB parameters, 12.46 GB AdamW moments, 18.69 GB with the fp32 master),
# the four ZeRO columns with a fit verdict each, the roofline rows for A100 and H100; a world of 1
# with B=8 does not fit; tp/pp can be planned; a bad key, a bad size and a bad layout each give
# one error line naming the problem and exit status 2.
source "$top_srcdir/tests/lib.sh"
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
xl="$top_srcdir/inputs/gpt2-xl.ini"
run "$DTRAIN" plan "$xl" --world 8 --device-mem 80GiB | tee "$t/out"
fail() { echo "plan_cli: FAIL: $*"; exit 1; }
grep -q '1,557,611,200 parameters, 1,557,686,400 floats per arena' "$t/out" || fail "true parameter count"
grep -Eq 'parameters \(fp32\) +1.558e\+09 x 4 B += +6.23 GB' "$t/out" || fail "6.23 GB parameters line"
grep -Eq 'AdamW m \+ v \(fp32\) +1.558e\+09 x 8 B += +12.46 GB' "$t/out" || fail "12.46 GB moments line"
grep -q 'fp32 master + m + v = 1.558e+09 x 12 B = 18.69 GB' "$t/out" || fail "18.69 GB master line"
grep -q 'stage 1 shards m + v: 12.46 / 8 = 1.56 GB; stage 2 also the gradients: 6.23 / 8 = 0.78 GB; stage 3 also the parameters: 6.23 / 8 = 0.78 GB' "$t/out" ||
  fail "ZeRO division line"
grep -Eq 'per rank, GB .* zero0 +zero1 +zero2 +zero3' "$t/out" || fail "zero stage header"
grep -Eq '^ +fits 80 GiB device memory\? +(fits|NO) +(fits|NO) +(fits|NO) +(fits|NO)$' "$t/out" || fail "fit verdicts"
for g in A100-SXM4-80GB H100-SXM5-80GB; do
  [ "$(grep -c "^roofline: $g" "$t/out")" = 3 ] || fail "3 roofline rows for $g"
done
# one device, B=8: the (B,NH,T,T) attention buffers alone exceed 80 GiB
run "$DTRAIN" plan "$xl" train.micro_batch=8 train.global_batch=0 --device-mem 80GiB > "$t/one"
grep -Eq '^ +fits 80 GiB device memory\? +NO +NO +NO +NO$' "$t/one" || fail "B=8 on one device should not fit"
# tp/pp cannot train yet but are planned
run "$DTRAIN" plan "$xl" parallel.tp=5 parallel.pp=4 --world 40 > "$t/tppp"
grep -q 'world 40 = dp 2 x tp 5 x pp 4' "$t/tppp" || fail "tp/pp layout"
grep -q 'pipeline stages' "$t/tppp" || fail "pipeline stage list"
# errors: one line on stderr, exit status 2
expect_error() {
  local what=$1 pattern=$2
  shift 2
  set +e
  "$DTRAIN" plan "$@" > "$t/o" 2> "$t/e"
  local rc=$?
  set -e
  echo "+ dtrain plan $* -> exit $rc: $(cat "$t/e")"
  [ "$rc" = 2 ] || fail "$what: exit status $rc, want 2"
  [ "$(wc -l < "$t/e")" = 1 ] || fail "$what: want exactly one error line"
  grep -q "$pattern" "$t/e" || fail "$what: message should mention '$pattern'"
}
expect_error "unknown key" "nosuch" "$xl" train.nosuch=1
expect_error "bad value" "micro_batch" "$xl" train.micro_batch=zero
expect_error "bad size" "device-mem" "$xl" --device-mem 80XB
expect_error "bad layout" "does not divide" "$xl" parallel.tp=3 --world 8
expect_error "missing file" "nope.ini" /nonexistent/nope.ini
echo "plan_cli: OK"
