#!/usr/bin/env bash
# Resharding on resume: a checkpoint written at (dp, tp) = (2, 2) at step 10 of 20 (each rank of
# the first dp replica wrote its tensor shard into the global-shaped datasets) resumes at (1, 4),
# (4, 1), on one rank (tp = 1, grad_accum 2) and as 4 pipeline stages (pp = 4), same global
# batch. Steps 11-20 must match the uninterrupted (2, 2) run within 1e-5 relative loss and
# gradient norm (only summation order differs, see tp_equiv.sh), with its lr (checked against the
# schedule formula) and the same global samples, and end within 3e-5 / 1e-4 of its final
# parameters / AdamW moments. Then the other way: a checkpoint written at tp = 4 resumes at
# tp = 2, and `dtrain eval` gives the same loss at tp = 1, 2, 4.
source "$top_srcdir/tests/lib.sh"
begin_test
m="model.n_layer=4 model.n_head=4 model.n_embd=128"
mpi 4 "$DTRAIN" "$cfg" $m parallel.tp=2 checkpoint.dir="$t/ref" log.metrics="$t/ref.jsonl" > "$t/ref.out"
mpi 4 "$DTRAIN" "$cfg" $m parallel.tp=2 checkpoint.dir="$t/c" train.stop_after=10 > "$t/c.out"
resume() { # name ranks from-dir [keys...]
  local name=$1 n=$2 from=$3
  shift 3
  mkdir -p "$t/$name"
  cp "$t/$from/ckpt_00000010.h5" "$t/$name/"
  mpi "$n" "$DTRAIN" "$cfg" $m checkpoint.dir="$t/$name" checkpoint.resume=auto log.metrics="$t/$name.jsonl" "$@" > "$t/$name.out"
  grep '^# resume' "$t/$name.out"
}
resume tp4 4 c parallel.tp=4
resume dp4 4 c train.micro_batch=2
resume one 1 c
resume pp4 4 c parallel.pp=4
mpi 4 "$DTRAIN" "$cfg" $m parallel.tp=4 checkpoint.dir="$t/c4" train.stop_after=10 > "$t/c4.out"
resume back2 2 c4 parallel.tp=2
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/ref.jsonl" "$cfg" $m
"$PY" "$top_srcdir/tests/ref/tensors_match.py" "$t/ref/ckpt_00000020.h5" 3e-5 1e-4 1e-4 \
  $(for n in tp4 dp4 one pp4 back2; do echo "$t/$n/ckpt_00000020.h5=$n"; done)
"$PY" "$top_srcdir/tests/ref/resumed_match.py" "$t" ref 11 20 "tp4=step-10 (2,2) checkpoint at (1,4)" \
  "dp4=step-10 (2,2) checkpoint at (4,1)" "one=step-10 (2,2) checkpoint on 1 rank" \
  "pp4=step-10 (2,2) checkpoint at (dp,tp,pp) = (1,1,4)" "back2=step-10 (1,4) checkpoint at (1,2)"
# dtrain eval reads its shard too: the (2,2) checkpoint's validation loss at tp = 1, 2, 4.
eval_agree "$t" tp "$t/c/ckpt_00000010.h5" "$cfg" $m
echo "tp_reshard: OK"
