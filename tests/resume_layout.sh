#!/usr/bin/env bash
# Any-layout resume: a checkpoint written at dp=2 (step 10 of 20) resumes at dp=1 (grad_accum 2)
# and at dp=4 (micro_batch 2), same global batch. The losses of steps 11-20 must match the
# uninterrupted dp=2 run within 1e-5 relative (only summation order differs, see ddp_equiv.sh), and
# so must their gradient norms (tests/small.ini trains unclipped: a gradient scale shows there) and
# lr (the uninterrupted run's checked against the schedule formula); the global sample indices
# consumed after resume are exactly those of the uninterrupted run; the final parameters and
# AdamW moments match the uninterrupted run's within 1e-5 per tensor.
source "$top_srcdir/tests/lib.sh"
begin_test
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
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/ref.jsonl" "$cfg"
"$PY" "$top_srcdir/tests/ref/resumed_match.py" "$t" ref 11 20 dp1 dp4
"$PY" - "$t" "$top_srcdir/tests/ref" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from tensors_match import state_close
for n in (1, 4):
    state_close(f"{sys.argv[1]}/ref/ckpt_00000020.h5", f"{sys.argv[1]}/dp{n}/ckpt_00000020.h5",
                f"dp=2 step-10 checkpoint resumed at dp={n}", 1e-5, 1e-5, 1e-5)
PY
echo "resume_layout: OK"
