#!/usr/bin/env bash
# `dtrain generate` (key/value-cache decoding) on a checkpoint written by tp=2:
#   1. greedy (temperature 0) on the cpu backend with 1 rank and with tp=2, and on the emulated cuda
#      backend (dtrain_emu) with 1 rank and tp=2 over 2 emulated GPUs: --verify compares every
#      step's cached logits with the uncached full forward of the whole sequence (1e-4 relative),
#      the four runs give the same tokens, and each token is the argmax of an independent float64
#      PyTorch forward of the sequence before it (tests/ref/greedy_check.py); the same check fails
#      on a run with one token changed;
#   2. sampling: a seed gives the same tokens twice, another seed others;
#   3. the GPT-2 tokenizer: a vocab-50257 model's prompt tokens are tiktoken's (tests/bpe_ref.py);
#   4. bad requests: more tokens than model.seq_len, parallel.pp = 2: exit 2 or 1 with a message.
source "$top_srcdir/tests/lib.sh"
begin_test
EMU="$top_builddir/dtrain_emu"
[ -x "$EMU" ] || EMU=  # configured without the CUDA emulation: its runs are skipped, and the test with them
small=(model.seq_len=64 train.steps=60 train.lr=3e-3)
mpi 2 "$DTRAIN" "$cfg" "${small[@]}" parallel.tp=2 checkpoint.dir="$t/c" checkpoint.every=60 > "$t/train.out"
ck="$t/c/ckpt_00000060.h5"
gen=(generate "$cfg" "${small[@]}" --checkpoint "$t/c" --prompt "It is a truth" --tokens 48 --print-tokens)
mpi 1 "$DTRAIN" "${gen[@]}" --temperature 0 --verify > "$t/cpu1.out"
mpi 2 "$DTRAIN" "${gen[@]}" --temperature 0 --verify parallel.tp=2 > "$t/cpu_tp2.out"
runs=(cpu1 cpu_tp2)
if [ -n "$EMU" ]; then
  mpi 1 "$EMU" "${gen[@]}" --temperature 0 --verify system.backend=cuda > "$t/cuda1.out"
  mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "${gen[@]}" --temperature 0 --verify system.backend=cuda parallel.tp=2 \
    > "$t/cuda_tp2.out"
  runs+=(cuda1 cuda_tp2)
fi
cat "$t/cpu1.out"
for r in "${runs[@]}"; do
  grep -q '^tokens: .* | ' "$t/$r.out" || { echo "FAIL: $r printed no tokens line"; exit 1; }
  [ "$(grep '^tokens:' "$t/$r.out")" = "$(grep '^tokens:' "$t/cpu1.out")" ] ||
    { echo "FAIL: $r generated other tokens than cpu1"; grep '^tokens:' "$t/cpu1.out" "$t/$r.out"; exit 1; }
done
outs=()
for r in "${runs[@]}"; do outs+=("$t/$r.out"); done
run "$PY" "$top_srcdir/tests/ref/greedy_check.py" "$ck" 4 "${outs[@]}"
# the check can fail: the 5th new token replaced by another
sed -E 's/^(tokens: [^|]*\|( [0-9]+){4}) [0-9]+/\1 0/' "$t/cpu1.out" > "$t/bad.out"
! cmp -s "$t/cpu1.out" "$t/bad.out" || { echo "FAIL: the planted change did not happen"; exit 1; }
if "$PY" "$top_srcdir/tests/ref/greedy_check.py" "$ck" 4 "$t/bad.out"; then
  echo "FAIL: greedy_check.py accepted a changed token"
  exit 1
fi

# 2. sampling with a seed; --verify on these more varied sequences too (tp=2: the emulated GPUs
# when there are some)
for s in 3.1 3.2 4.3; do
  mpi 1 "$DTRAIN" "${gen[@]}" --temperature 1 --top-k 20 --seed ${s%.*} | grep '^tokens:' > "$t/seed$s"
done
cat "$t/seed3.1"
cmp "$t/seed3.1" "$t/seed3.2" || { echo "FAIL: --seed 3 twice gave different tokens"; exit 1; }
! cmp -s "$t/seed3.1" "$t/seed4.3" || { echo "FAIL: --seed 3 and 4 gave the same 48 tokens"; exit 1; }
if [ -n "$EMU" ]; then
  mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "${gen[@]}" --temperature 1 --top-k 20 --seed 3 --verify system.backend=cuda \
    parallel.tp=2 > "$t/seed3.cuda"
else
  mpi 2 "$DTRAIN" "${gen[@]}" --temperature 1 --top-k 20 --seed 3 --verify parallel.tp=2 > "$t/seed3.cuda"
fi
grep '^tokens:' "$t/seed3.cuda" | cmp - "$t/seed3.1" || { echo "FAIL: tp=2 sampled other tokens with --seed 3"; exit 1; }

# 3. GPT-2 tokenizer: the prompt's ids against tiktoken
g2=(model.vocab_size=50257 "data.train=$DATA/austen_gpt2_train_*.bin" "data.val=$DATA/austen_gpt2_val_*.bin")
mpi 1 "$DTRAIN" "$cfg" "${g2[@]}" train.steps=2 checkpoint.dir="$t/g" checkpoint.every=2 > /dev/null
prompt="It is a truth universally acknowledged, that a single man's 1,000 pounds — naïve?"
mpi 1 "$DTRAIN" generate "$cfg" "${g2[@]}" --checkpoint "$t/g" --vocab "$DATA/gpt2" --prompt "$prompt" --tokens 4 \
  --print-tokens > "$t/g.out"
run "$PY" - "$DATA/gpt2" "$prompt" "$t/g.out" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.environ["top_srcdir"], "tests"))
import bpe_ref
vocab, prompt, out = sys.argv[1:]
line = [l for l in open(out) if l.startswith("tokens:")][-1]
ids = [int(t) for t in line[len("tokens:"):].split("|")[0].split()]
ref = bpe_ref.ref_tokens(bpe_ref.encoding(vocab), prompt.encode())
print(f"prompt: dtrain {ids}\n        tiktoken {ref}")
assert ids == ref, "the prompt's GPT-2 tokens differ from tiktoken's"
PY

# 4. bad requests
set +e
mpi 1 "$DTRAIN" "${gen[@]}" --tokens 60 > "$t/long.out" 2>&1
rc=$?
mpi 2 "$DTRAIN" "${gen[@]}" parallel.pp=2 > "$t/pp.out" 2>&1
rc_pp=$?
set -e
[ $rc -eq 2 ] && grep -q 'exceed model.seq_len = 64' "$t/long.out" ||
  { echo "FAIL: 13 + 60 tokens past seq_len 64: exit $rc"; cat "$t/long.out"; exit 1; }
[ $rc_pp -ne 0 ] && grep -q 'parallel.pp=2' "$t/pp.out" || { echo "FAIL: pp=2: exit $rc_pp"; cat "$t/pp.out"; exit 1; }
[ -n "$EMU" ] || { echo "SKIP: the cuda backend's runs (no dtrain_emu: configured without the CUDA emulation)"; exit 77; }
echo "generate: OK"
