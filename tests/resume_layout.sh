#!/usr/bin/env bash
# Any-layout resume: a checkpoint written at dp=2 (step 10 of 20) resumes at dp=1 (grad_accum 2)
# and at dp=4 (micro_batch 2), same global batch. The losses of steps 11-20 must match the
# uninterrupted dp=2 run within 1e-5 relative (only summation order differs, see ddp_equiv.sh),
# and the global sample indices consumed after resume are exactly those of the uninterrupted run.
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
"$PY" "$top_srcdir/tests/ref/resumed_match.py" "$t" ref 11 20 dp1 dp4
echo "resume_layout: OK"
