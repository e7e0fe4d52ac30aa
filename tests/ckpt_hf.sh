#!/usr/bin/env bash
# A checkpoint is a Hugging Face GPT-2 state dict: h5py opens it, every /model tensor has the HF
# name and shape, and a PyTorch GPT-2 loaded from those tensors gives the same loss as
# `dtrain eval` on the same batches within 1e-5 relative (fp32 both sides; differences are
# summation order only).
source "$top_srcdir/tests/lib.sh"
begin_test
mpi 2 "$DTRAIN" "$cfg" train.steps=10 checkpoint.dir="$t/c" > "$t/train.out"
shard=$(ls "$DATA"/austen_val_*.bin | head -1)
mpi 2 "$DTRAIN" eval "$cfg" --checkpoint "$t/c/ckpt_00000010.h5" --data "$shard" --batches 4 | tee "$t/eval.out"
run "$PY" "$top_srcdir/tests/ref/hf_gpt2_eval.py" "$t/c/ckpt_00000010.h5" "$shard" 4 32 4 4 | tee "$t/py.out"
run h5dump -H "$t/c/ckpt_00000010.h5" > "$t/h5dump.out"
grep -q 'DATASET "h.1.mlp.c_fc.weight"' "$t/h5dump.out"
a=$(sed -n 's/.* loss \([0-9.]*\)$/\1/p' "$t/eval.out")
b=$(sed -n 's/^pytorch loss \([0-9.]*\)$/\1/p' "$t/py.out")
"$PY" -c "
a, b = float('$a'), float('$b')
rel = abs(a - b) / abs(b)
print(f'dtrain eval {a:.9f} vs PyTorch {b:.9f}: relative difference {rel:.2e} (limit 1e-5)')
assert rel <= 1e-5
"
echo "ckpt_hf: OK"
