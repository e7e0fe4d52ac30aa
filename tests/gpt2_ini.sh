#!/usr/bin/env bash
# inputs/gpt2.ini runs as shipped on the data of the quick start (scripts/get-data.sh's GPT-2
# shards of the novels, its default [data]): GPT-2 124M, 2 steps on the CPU, with only the batch
# shrunk to 1 x 64 tokens (the shipped 512 x 1024 per step takes hours on 2 cores). Checks: the
# run reads the default shards (the echoed config and the data line), step 1's loss is that of a
# near-uniform prediction over the 50257 tokens (ln 50257 = 10.825; GPT-2's init, std 0.02, gives
# logits near 0), within 0.5, and step 2 reports a validation loss from the val shards.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
cd "$top_builddir"
run "$DTRAIN" "$top_srcdir/inputs/gpt2.ini" train.steps=2 train.micro_batch=1 train.global_batch=1 model.seq_len=64 \
  train.eval_every=2 train.eval_batches=2 system.backend=cpu checkpoint.dir="$t/ckpt" log.metrics="$t/m.jsonl" \
  > "$t/out.txt"
grep -E '^# data:|^#   (train|val) = |^ +[12] ' "$t/out.txt"
grep -q '^# data: data/austen_gpt2_train_\*.bin: 1 shards' "$t/out.txt" ||
  { echo "FAIL: the run did not read the default GPT-2 shards"; exit 1; }
echo "compare: step 1 loss vs ln(50257) (limit 0.5); step 2 has a val_loss"
"$PY" - "$t/m.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
l1, ln = rows[0]["loss"], math.log(50257)
print(f"step 1 loss {l1:.4f}, ln(50257) = {ln:.4f}, difference {l1 - ln:+.4f}; step 2 val_loss {rows[1].get('val_loss')}")
assert len(rows) == 2 and abs(l1 - ln) < 0.5, rows
assert rows[1].get("val_loss") is not None and abs(rows[1]["val_loss"] - ln) < 0.5, rows[1]
PY
