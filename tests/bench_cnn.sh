#!/bin/bash
# Issue #25's benchmark scripts end to end on a small network, so that a change to them or to what
# they parse cannot break them unseen: bench/cnn_step.sh and bench/cnn_ddp.sh (with CORE1=1) with 2 rounds of 2
# steps on ResNet-18 at width 8, batch 4. Their numbers are not checked (a benchmark's numbers are
# not a test); their output is: every summary line, its ratios numbers, and one per-round ratio
# per round.
source "$top_srcdir/tests/lib.sh"
begin_test
export ROUNDS=2 STEPS=2 WARMUP=1 THREADS=2
num='[0-9]+\.[0-9]+'
fail() { echo "FAIL: $*"; exit 1; }
has() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "$1 lacks /$2/"; }; echo "ok: /$2/"; }

echo "\$ ROUNDS=2 STEPS=2 WARMUP=1 bench/cnn_step.sh resnet18 4 3,32,32 8"
bash "$top_srcdir/bench/cnn_step.sh" resnet18 4 3,32,32 8 > "$t/step.out" 2>&1 || { cat "$t/step.out"; fail "cnn_step.sh"; }
[ "$(grep -c '^RESULT dtrain resnet18 batch=4 ' "$t/step.out")" -eq 2 ] || fail "want 2 dtrain RESULT lines"
[ "$(grep -c '^RESULT torch resnet18 batch=4 ' "$t/step.out")" -eq 2 ] || fail "want 2 PyTorch RESULT lines"
has "$t/step.out" "^# summary resnet18 batch 4: dtrain $num ms/step .*PyTorch $num ms/step .*step time $num \(goal"
has "$t/step.out" "^# summary: per round dtrain/PyTorch $num, $num; median $num$"

echo "\$ CORE1=1 ROUNDS=2 STEPS=2 WARMUP=1 bench/cnn_ddp.sh resnet18 4 8"
CORE1=1 bash "$top_srcdir/bench/cnn_ddp.sh" resnet18 4 8 > "$t/ddp.out" 2>&1 || { cat "$t/ddp.out"; fail "cnn_ddp.sh"; }
[ "$(grep -Ec "^# round [12]: ms/step dtrain 1x2 $num, 2x1 $num \(batch norm per rank: $num\); PyTorch 1x2 $num, 2x1 \(DDP gloo\) $num; 1x1: dtrain $num, PyTorch $num$" \
  "$t/ddp.out")" -eq 2 ] || { cat "$t/ddp.out"; fail "want 2 round lines with 7 numbers each"; }
has "$t/ddp.out" "^# summary: images/s dtrain 1x2 $num, 2x1 $num \(scaling $num\); PyTorch 1x2 $num, 2x1 DDP $num \(scaling $num\)$"
has "$t/ddp.out" "^# summary: dtrain/PyTorch 1-rank step time $num \(goal <= 0.80\); 2-rank scaling dtrain/PyTorch $num"
has "$t/ddp.out" "^# summary: dtrain 2x1 with batch norm per rank .* scaling $num: dtrain/PyTorch $num"
has "$t/ddp.out" "^# summary: per round 1-rank step dtrain/PyTorch $num, $num \(median $num\); 2-rank scaling dtrain/PyTorch $num, $num \(median $num\)$"
has "$t/ddp.out" "^# summary: 1x1 -> 2x1 \(twice the cores.*dtrain $num -> $num \(scaling $num; batch norm per rank $num\), PyTorch $num -> $num \(scaling $num\): dtrain/PyTorch $num \(per rank $num; per round $num, $num\)$"
echo "bench_cnn: OK"
