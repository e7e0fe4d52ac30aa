#!/usr/bin/env bash
# dtrain's GPT-2 tokeniser against tiktoken (tests/bpe_ref.py builds tiktoken's Encoding offline
# from the same encoder.json, with GPT-2's pattern; bytes that are not UTF-8 go through Python's
# regex + tiktoken's BPE per pre-token):
#  1. the letter/number/space classes of every code point (tests/bpe_classes) == tiktoken's regex
#     engine's \p{L}, \p{N}, \s, and == Python's unicodedata on every code point it assigns;
#  2. the Austen shards of scripts/get-data.sh == <|endoftext|> + tiktoken's tokens of each novel;
#  3. adversarial documents (scripts of many languages, random code points of every category,
#     emoji sequences, every kind of whitespace run, contractions, digits, pre-tokens of thousands
#     of bytes, <|endoftext|> as text, CRLF, invalid UTF-8, random bytes, an empty file) through
#     dtrain prep at the default chunk size and at 4 KiB chunks on 2 threads with small shards:
#     token for token equal to the reference, and `dtrain prep --decode` gives the bytes back.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
REF="$top_srcdir/tests/bpe_ref.py"
V="$DATA/gpt2"
"$PY" -c 'import tiktoken, regex; print("tiktoken", tiktoken.__version__, "regex", regex.__version__)' ||
  { echo "FAIL: tiktoken and regex are needed (scripts/install-deps.sh installs them)"; exit 1; }

echo "== 1. character classes"
run "$top_builddir/tests/bpe_classes" > "$t/classes.txt"
run "$PY" "$REF" classes "$V" "$t/classes.txt"

echo "== 2. the bundled novels (scripts/get-data.sh's shards)"
books=()
for b in emma mansfieldpark northangerabbey persuasion prideprejudice sensesensibility; do books+=("$DATA/austen/$b.txt"); done
run "$PY" "$REF" compare "$V" "$DATA/austen_gpt2" "${books[@]}"

echo "== 3. adversarial documents"
run "$PY" "$REF" corpus "$t/docs"
docs=("$t"/docs/*)
run "$DTRAIN" prep --tokenizer gpt2 --vocab "$V" --val-fraction 0.3 "$t/a" "${docs[@]}"
run "$PY" "$REF" compare "$V" "$t/a" "${docs[@]}"
run "$DTRAIN" prep --tokenizer gpt2 --vocab "$V" --val-fraction 0.3 --chunk-bytes 4096 --threads 2 \
  --shard-tokens 100000 "$t/b" "${docs[@]}"
run "$PY" "$REF" compare "$V" "$t/b" "${docs[@]}"
run "$DTRAIN" prep --decode --tokenizer gpt2 --vocab "$V" "$t/b_val_*.bin" "$t/b_train_*.bin" > "$t/decoded"
run "$PY" "$REF" decoded "$t/decoded" "${docs[@]}"
