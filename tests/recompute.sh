#!/usr/bin/env bash
# Activation recomputation (train.recompute, cpu backend) is exact: backward recomputes a block's
# activations with the same code from the same input, so runs with and without it log bitwise the
# same 10 losses, gradient norms and lr (the lr also as the schedule formula gives) and end with
# bitwise the same parameters and AdamW moments, on one rank (fp32 and bf16, whose rounding points
# recomputation repeats), with tensor parallelism (the recomputed block all-reduces again), with
# pipeline parallelism (4 stages x 8 micro-batches: the stage keeps its blocks' outputs per
# micro-batch in flight) and with ZeRO-3 (the block's parameters are gathered before its
# backward, so before the recomputation). The same on the CUDA backend through the CUDA emulation
# (dtrain_emu, system.backend=cuda, fp32 and bf16): the model's recomputation is backend-neutral
# code (gpt2.c). The memory it saves
# is checked against the planner in tests/plan_mem.sh.
source "$top_srcdir/tests/lib.sh"
begin_test
# 10 steps (warm-up 5, then decay) keep the slow tier short; 20 showed nothing 10 did not
m="model.n_layer=4 model.n_head=4 model.n_embd=128 train.steps=10"
pair() { # pair NAME RANKS ARGS...: the same run without and with recomputation
  local name=$1 n=$2 rc
  shift 2
  for rc in false true; do
    mpi "$n" "${BIN:-$DTRAIN}" "$cfg" $m "$@" train.recompute=$rc log.metrics="$t/$name-$rc.jsonl" \
      checkpoint.dir="$t/$name-$rc" > "$t/$name-$rc.out"
  done
}
pair one 1
pair bf16 1 train.precision=bf16
pair tp 2 parallel.tp=2
pair pp 4 parallel.pp=4 train.micro_batch=1
pair z3 2 parallel.zero=3
BIN="$top_builddir/dtrain_emu" pair cuda 1 system.backend=cuda
BIN="$top_builddir/dtrain_emu" pair cuda_bf16 1 system.backend=cuda train.precision=bf16
grep -q '^# backend: cuda' "$t/cuda-true.out" || { echo "FAIL: dtrain_emu did not train on the cuda backend"; exit 1; }
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/one-true.jsonl" "$cfg" $m
"$PY" - "$t" <<'PY'
import json, sys
import h5py, numpy as np
d = sys.argv[1]
for name in ("one", "bf16", "tp", "pp", "z3", "cuda", "cuda_bf16"):
    a = [json.loads(l) for l in open(f"{d}/{name}-false.jsonl")]
    b = [json.loads(l) for l in open(f"{d}/{name}-true.jsonl")]
    assert len(a) == len(b) == 10, (name, len(a), len(b))
    for x, y in zip(a, b):
        assert (x["loss"], x["grad_norm"], x["lr"]) == (y["loss"], y["grad_norm"], y["lr"]), (name, x, y)
    f, g = h5py.File(f"{d}/{name}-false/ckpt_00000010.h5", "r"), h5py.File(f"{d}/{name}-true/ckpt_00000010.h5", "r")
    n = 0
    for grp in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
        for k in f[grp]:
            assert np.array_equal(f[grp][k][()], g[grp][k][()]), f"{name}: /{grp}/{k} differs"
            n += 1
    print(f"{name}: with and without recomputation: 10 losses, grad norms and lr and {n} final tensors bitwise equal")
PY
echo "recompute: OK"
