#!/usr/bin/env bash
# Checkpoints are independent of the ZeRO stage: a checkpoint written at zero=1, dp=4 (each rank
# writes its shard of m and v into the global datasets) resumes at zero=0, dp=1 and at zero=1,
# dp=2; one written at zero=0, dp=2 resumes at zero=1, dp=4; one written at zero=1, dp=2 x tp=2
# resumes at zero=0 on one rank; zero=2 dp=2 resumes at zero=1 dp=4 and back; zero=3 dp=4 (each
# rank writes only its parameter shard) resumes at zero=0 on one rank, zero=1 dp=4 at zero=3 dp=2.
# Steps 11-20 match the uninterrupted run's losses and gradient norms within 1e-5 relative, its lr
# (checked against the schedule formula) and its global samples; the final parameters and AdamW
# moments match its final checkpoint within 1e-5 per tensor.
source "$top_srcdir/tests/lib.sh"
begin_test
mb() { case $1 in 1) echo "train.micro_batch=4";; 2) echo "train.micro_batch=4";; 4) echo "train.micro_batch=2";; esac; }
mpi 2 "$DTRAIN" "$cfg" checkpoint.dir="$t/ref" log.metrics="$t/ref.jsonl" > "$t/ref.out"
mpi 4 "$DTRAIN" "$cfg" $(mb 4) parallel.zero=1 checkpoint.dir="$t/w1" train.stop_after=10 > "$t/w1.out"
mpi 2 "$DTRAIN" "$cfg" $(mb 2) parallel.zero=0 checkpoint.dir="$t/w0" train.stop_after=10 > "$t/w0.out"
mpi 4 "$DTRAIN" "$cfg" train.micro_batch=2 parallel.zero=1 parallel.tp=2 checkpoint.dir="$t/wtp" train.stop_after=10 > "$t/wtp.out"
mpi 2 "$DTRAIN" "$cfg" $(mb 2) parallel.zero=2 checkpoint.dir="$t/w2" train.stop_after=10 > "$t/w2.out"
mpi 4 "$DTRAIN" "$cfg" $(mb 4) parallel.zero=3 checkpoint.dir="$t/w3" train.stop_after=10 > "$t/w3.out"
run_from() { # name, source dir, ranks, zero
  mkdir -p "$t/$1"
  cp "$t/$2/ckpt_00000010.h5" "$t/$1/"
  mpi "$3" "$DTRAIN" "$cfg" $(mb "$3") parallel.zero="$4" checkpoint.dir="$t/$1" checkpoint.resume=auto \
    log.metrics="$t/$1.jsonl" > "$t/$1.out"
  grep '^# resume' "$t/$1.out"
}
run_from z1d4_to_z0d1 w1 1 0
run_from z1d4_to_z1d2 w1 2 1
run_from z0d2_to_z1d4 w0 4 1
run_from z1tp2_to_z0d1 wtp 1 0
run_from z2d2_to_z1d4 w2 4 1
run_from z1d4_to_z2d2 w1 2 2
run_from z3d4_to_z0d1 w3 1 0
run_from z1d4_to_z3d2 w1 2 3
names="z1d4_to_z0d1 z1d4_to_z1d2 z0d2_to_z1d4 z1tp2_to_z0d1 z2d2_to_z1d4 z1d4_to_z2d2 z3d4_to_z0d1 z1d4_to_z3d2"
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/ref.jsonl" "$cfg"
"$PY" "$top_srcdir/tests/ref/resumed_match.py" "$t" ref 11 20 $names
"$PY" "$top_srcdir/tests/ref/tensors_match.py" "$t/ref/ckpt_00000020.h5" 1e-5 1e-5 1e-5 \
  $(for n in $names; do echo "$t/$n/ckpt_00000020.h5=$n"; done)
echo "zero_resume: OK"
