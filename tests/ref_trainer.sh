#!/usr/bin/env bash
# The real trainer against PyTorch: the dtrain binary trains tests/small.ini for 24 steps (warmup
# 5, cosine decay to min_lr, a clip that binds on some steps and not on others) as one global
# batch of 8 sequences split four ways: 1 rank x 1 micro-batch of 8, 1 rank x grad_accum 4 x 2,
# 2 ranks (mpirun) x grad_accum 2 x 2, and 2 pipeline stages x 4 micro-batches of 2 (whose final
# checkpoint is written as the stages' boxes of the global tensors). tests/ref/ref_trainer.py
# trains the same model from dtrain's step-0 checkpoint in an independent PyTorch loop (data
# order, lr schedule, clipping and AdamW written from the documentation) in float64, and compares
# each run's JSONL (lr, loss, grad_norm, clipping, sample0 per step) and final checkpoint (every
# parameter, AdamW m and v). Every optimizer setting is given here explicitly, so the reference
# assumes no dtrain default.
source "$top_srcdir/tests/lib.sh"
begin_test
if ! "$PY" -c 'import torch, numpy, h5py' 2>/dev/null; then
  echo "ref_trainer.sh: FAIL: $PY cannot import torch, numpy and h5py (configure REF_PYTHON=/usr/bin/python3)" >&2
  exit 1
fi
keys=(train.steps=24 train.warmup=5 train.global_batch=8 train.lr=1e-3 train.min_lr=1e-4 train.lr_schedule=cosine
  train.weight_decay=0.1 train.beta1=0.9 train.beta2=0.95 train.eps=1e-8 train.grad_clip=1.85 train.seed=7
  data.shuffle=true data.train="data/austen_train_*.bin")
run "$DTRAIN" "$cfg" "${keys[@]}" train.steps=0 checkpoint.dir="$t/init" > "$t/init.out"
run "$DTRAIN" "$cfg" "${keys[@]}" train.micro_batch=8 log.metrics="$t/accum1.jsonl" checkpoint.dir="$t/accum1" \
  > "$t/accum1.out"
run "$DTRAIN" "$cfg" "${keys[@]}" train.micro_batch=2 log.metrics="$t/accum4.jsonl" checkpoint.dir="$t/accum4" \
  > "$t/accum4.out"
mpi 2 "$DTRAIN" "$cfg" "${keys[@]}" train.micro_batch=2 log.metrics="$t/dp2.jsonl" checkpoint.dir="$t/dp2" \
  > "$t/dp2.out"
mpi 2 "$DTRAIN" "$cfg" "${keys[@]}" train.micro_batch=2 parallel.pp=2 log.metrics="$t/pp2.jsonl" \
  checkpoint.dir="$t/pp2" > "$t/pp2.out"
grep -h '^# batch' "$t/accum1.out" "$t/accum4.out" "$t/dp2.out" "$t/pp2.out"
run "$PY" "$top_srcdir/tests/ref/ref_trainer.py" "$cfg" "$t/init/ckpt_00000000.h5" "$t" "${keys[@]}" -- \
  accum1 accum4 dp2 pp2
