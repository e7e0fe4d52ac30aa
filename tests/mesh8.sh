#!/usr/bin/env bash
# Every factorisation of 8 ranks into dp x tp x pp trains the same model: an 8-layer, 8-head,
# 64-channel GPT-2 (head size 8, vocabulary 256) for 10 steps at a global batch of 8 sequences,
# (dp, tp, pp) = (8,1,1) (4,2,1) (4,1,2) (2,4,1) (2,2,2) (2,1,4) (1,8,1) (1,4,2) (1,2,4) (1,1,8),
# under mpirun --oversubscribe on one machine, against one rank: the same loss and gradient norm at
# every step within 1e-5 relative, the same lr (the 1-rank run's checked against the schedule
# formula) and global samples, and final parameters / AdamW moments within 3e-5 / 1e-4 per tensor
# (summation order, see tests/tp_equiv.sh). (Across the virtual nodes of a local Slurm:
# tests/slurm_train.sh.)
source "$top_srcdir/tests/lib.sh"
begin_test
m="model.n_layer=8 model.n_head=8 model.n_embd=64 train.steps=10 train.warmup=2"
mpi 1 "$DTRAIN" "$cfg" $m log.metrics="$t/ref.jsonl" checkpoint.dir="$t/c_ref" > "$t/ref.out"
names=""
for lay in $(mesh8_layouts); do # (not a `while read` loop: mpirun and srun read stdin)
  IFS=, read -r dp tp pp B <<< "$lay"
  mpi 8 "$DTRAIN" "$cfg" $m parallel.tp=$tp parallel.pp=$pp train.micro_batch=$B log.metrics="$t/m$dp$tp$pp.jsonl" \
    checkpoint.dir="$t/c$dp$tp$pp" > "$t/m$dp$tp$pp.out"
  grep -q "mesh dp=$dp x tp=$tp x pp=$pp" "$t/m$dp$tp$pp.out" || { echo "FAIL: mesh line of ($dp,$tp,$pp)"; exit 1; }
  names="$names m$dp$tp$pp=(dp,tp,pp)=($dp,$tp,$pp)"
done
"$PY" "$top_srcdir/tests/ref/metrics_match.py" lr "$t/ref.jsonl" "$cfg" $m
"$PY" "$top_srcdir/tests/ref/resumed_match.py" "$t" ref 1 10 $names
"$PY" "$top_srcdir/tests/ref/tensors_match.py" "$t/c_ref/ckpt_00000010.h5" 3e-5 1e-4 1e-4 \
  $(for n in $names; do tag=${n%%=*}; echo "$t/c${tag#m}/ckpt_00000010.h5=${n#*=}"; done)
[ "$(echo $names | wc -w)" -eq 10 ] || { echo "FAIL: $(echo $names | wc -w) layouts, want 10"; exit 1; }
echo "mesh8: OK (all 10 factorisations of 8 ranks)"
