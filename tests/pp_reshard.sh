#!/usr/bin/env bash
# Checkpoints written by pipeline stages (each stage's first dp replica writes its blocks into the
# global-shaped datasets; wte from the first stage, not the last stage's tied copy) resume at any
# layout: a checkpoint from (dp, tp, pp) = (1, 2, 2) at step 10 of 20 continues at (2, 2, 1),
# (1, 1, 4), (2, 1, 2) and on one rank, same global batch, within 1e-5 relative loss and gradient
# norm of the uninterrupted run, with its lr and on the same global samples
# (tests/ref/resumed_match.py), ending within 3e-5 / 1e-4 of its final parameters / AdamW moments
# (summation order, see tests/tp_equiv.sh); with ZeRO-1 at
# (2, 1, 2) too, and a (2, 1, 2) ZeRO-1 checkpoint (m, v shards of each stage) on one rank. Resume at the
# same pipeline layout is exact: 20 steps straight and 10 + 10 at pp = 2 log bitwise the same
# losses and end with bitwise the same parameters and AdamW moments. `dtrain eval` of a pp = 4
# checkpoint gives the same loss at pp = 1, 2, 4 (the batch passed through the stages).
# The other direction (a (2,2,1) checkpoint resumed at (1,1,4)) is in tests/tp_reshard.sh.
source "$top_srcdir/tests/lib.sh"
begin_test
m="model.n_layer=4 model.n_head=4 model.n_embd=128"
mpi 4 "$DTRAIN" "$cfg" $m parallel.tp=2 parallel.pp=2 checkpoint.dir="$t/ref" log.metrics="$t/ref.jsonl" > "$t/ref.out"
mpi 4 "$DTRAIN" "$cfg" $m parallel.tp=2 parallel.pp=2 checkpoint.dir="$t/c" train.stop_after=10 > "$t/c.out"
resume() { # name ranks from-dir [keys...]
  local name=$1 n=$2 from=$3
  shift 3
  mkdir -p "$t/$name"
  cp "$t/$from/ckpt_00000010.h5" "$t/$name/"
  mpi "$n" "$DTRAIN" "$cfg" $m checkpoint.dir="$t/$name" checkpoint.resume=auto log.metrics="$t/$name.jsonl" "$@" > "$t/$name.out"
  grep '^# resume' "$t/$name.out"
}
resume tp2dp2 4 c parallel.tp=2 train.micro_batch=2
resume pp4 4 c parallel.pp=4
resume dp2pp2 4 c parallel.pp=2 train.micro_batch=2
resume one 1 c
resume z1 4 c parallel.pp=2 train.micro_batch=2 parallel.zero=1
mpi 4 "$DTRAIN" "$cfg" $m parallel.pp=2 train.micro_batch=2 parallel.zero=1 checkpoint.dir="$t/cz" train.stop_after=10 > "$t/cz.out"
resume z1one 1 cz
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/ref.jsonl" "$cfg" $m
"$PY" "$top_srcdir/tests/ref/tensors_match.py" "$t/ref/ckpt_00000020.h5" 3e-5 1e-4 1e-4 \
  $(for n in tp2dp2 pp4 dp2pp2 one z1 z1one; do echo "$t/$n/ckpt_00000020.h5=$n"; done)
"$PY" "$top_srcdir/tests/ref/resumed_match.py" "$t" ref 11 20 "tp2dp2=step-10 (1,2,2) checkpoint at (2,2,1)" \
  "z1=step-10 (1,2,2) checkpoint at (2,1,2) with zero=1" "z1one=step-10 (2,1,2) zero=1 checkpoint on 1 rank" \
  "pp4=step-10 (1,2,2) checkpoint at (1,1,4)" "dp2pp2=step-10 (1,2,2) checkpoint at (2,1,2)" \
  "one=step-10 (1,2,2) checkpoint on 1 rank"

# Exact resume at pp = 2: bitwise the same losses and final state.
mpi 2 "$DTRAIN" "$cfg" $m parallel.pp=2 checkpoint.dir="$t/x20" log.metrics="$t/x20.jsonl" > "$t/x20.out"
mpi 2 "$DTRAIN" "$cfg" $m parallel.pp=2 checkpoint.dir="$t/x10" log.metrics="$t/x10a.jsonl" train.stop_after=10 > "$t/x10a.out"
mpi 2 "$DTRAIN" "$cfg" $m parallel.pp=2 checkpoint.dir="$t/x10" log.metrics="$t/x10b.jsonl" checkpoint.resume=auto > "$t/x10b.out"
"$PY" - "$t" <<'PY'
import json, sys
import h5py, numpy as np
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
a, b = load("x20"), load("x10a") + load("x10b")
assert [r["step"] for r in b] == list(range(1, 21)), [r["step"] for r in b]
for x, y in zip(a, b):
    assert (x["loss"], x["grad_norm"], x["lr"]) == (y["loss"], y["grad_norm"], y["lr"]), (x, y)
f, g = h5py.File(f"{d}/x20/ckpt_00000020.h5", "r"), h5py.File(f"{d}/x10/ckpt_00000020.h5", "r")
n = 0
for grp in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
    for k in f[grp]:
        assert np.array_equal(f[grp][k][()], g[grp][k][()]), f"/{grp}/{k} differs"
        n += 1
print(f"pp=2: 20 steps straight and 10 + 10 give bitwise the same 20 losses, grad norms and lr and the same {n} tensors")
PY

# dtrain eval of a pp = 4 checkpoint at pp = 1, 2, 4
mpi 4 "$DTRAIN" "$cfg" $m parallel.pp=4 checkpoint.dir="$t/e4" train.steps=5 > "$t/e4.out"
eval_agree "$t" pp "$t/e4/ckpt_00000005.h5" "$cfg" $m
echo "pp_reshard: OK"
