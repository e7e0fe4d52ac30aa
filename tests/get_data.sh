#!/bin/sh
# scripts/get-data.sh end to end: the Austen corpus becomes val/train shards whose tokens are
# exactly the bytes of the six novels (first 5% val); GPT-2's vocabulary arrives with the sha256
# sums committed in scripts/gpt2-vocab.sha256 (recomputed here with Python's hashlib); the GPT-2
# shards decode (dtrain prep --decode) to <|endoftext|> + novel, for each novel in order; a
# second run does nothing; a changed vocabulary file is refused. (tests/bpe_tiktoken.sh checks
# the GPT-2 tokens themselves against tiktoken.)
# Skips (77) if Rscript/janeaustenr are missing or `dtrain prep` is not wired into the CLI yet.
set -eu
: "${top_srcdir:?}" "${top_builddir:?}" "${REF_PYTHON:=/usr/bin/python3}"
DTRAIN="$top_builddir/dtrain"
export DTRAIN

if ! command -v Rscript >/dev/null 2>&1 || ! Rscript -e 'library(janeaustenr)' >/dev/null 2>&1; then
  echo "SKIP: Rscript or r-cran-janeaustenr not installed"; exit 77
fi
if ! "$DTRAIN" prep --help >/dev/null 2>&1; then
  echo "SKIP: '$DTRAIN prep --help' fails (prep subcommand not available)"; exit 77
fi

out=$(mktemp -d /tmp/dtrain-get-data-XXXXXX)
trap 'rm -rf "$out"' EXIT

echo "+ DTRAIN=$DTRAIN $top_srcdir/scripts/get-data.sh $out"
"$top_srcdir/scripts/get-data.sh" "$out"

echo "compare: tokens of $out/austen_val_*.bin then austen_train_*.bin == bytes of $out/austen/*.txt (sorted);"
echo "         val holds floor(0.05 * total) tokens; every shard has magic 20240520, version 1, exact size"
"$REF_PYTHON" - "$out" <<'EOF'
import glob, struct, sys, os
out = sys.argv[1]
books = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]
text = b"".join(open(os.path.join(out, "austen", b + ".txt"), "rb").read() for b in books)
def split(name):
    toks = []
    for p in sorted(glob.glob(os.path.join(out, "austen_%s_*.bin" % name))):
        data = open(p, "rb").read()
        magic, version, n = struct.unpack("<3i", data[:12])
        assert magic == 20240520 and version == 1 and len(data) == 1024 + 2 * n, p
        toks += struct.unpack("<%dH" % n, data[1024:])
    return toks
val, train = split("val"), split("train")
assert 3_500_000 < len(text) < 4_500_000, len(text)
assert len(val) == int(len(text) * 0.05), (len(val), len(text))
assert bytes(val + train) == text, "shard tokens differ from the text bytes"
print("ok: %d bytes -> %d val + %d train tokens" % (len(text), len(val), len(train)))
EOF

echo "compare: sha256 of $out/gpt2/{encoder.json,vocab.bpe} (hashlib) == scripts/gpt2-vocab.sha256"
"$REF_PYTHON" - "$out" "$top_srcdir/scripts/gpt2-vocab.sha256" <<'EOF'
import hashlib, sys
out, sums = sys.argv[1], sys.argv[2]
for line in open(sums):
    want, name = line.split()
    got = hashlib.sha256(open(f"{out}/gpt2/{name}", "rb").read()).hexdigest()
    assert got == want, (name, got, want)
    print(f"ok: {name} sha256 {got}")
EOF

echo "+ $DTRAIN prep --decode --tokenizer gpt2 --vocab $out/gpt2 '$out/austen_gpt2_val_*.bin' '$out/austen_gpt2_train_*.bin'"
"$DTRAIN" prep --decode --tokenizer gpt2 --vocab "$out/gpt2" "$out/austen_gpt2_val_*.bin" "$out/austen_gpt2_train_*.bin" \
  > "$out/decoded.txt"
echo "compare: decoded text == <|endoftext|> + novel for each novel; 6 x 50256, all tokens < 50257"
"$REF_PYTHON" - "$out" <<'EOF'
import glob, os, struct, sys
out = sys.argv[1]
books = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]
texts = [open(os.path.join(out, "austen", b + ".txt"), "rb").read() for b in books]
want = b"".join(b"<|endoftext|>" + t for t in texts)
got = open(os.path.join(out, "decoded.txt"), "rb").read()
assert got == want, "decoded GPT-2 shards differ from the novels (%d vs %d bytes)" % (len(got), len(want))
def tokens(split):
    toks = []
    for p in sorted(glob.glob(os.path.join(out, "austen_gpt2_%s_*.bin" % split))):
        data = open(p, "rb").read()
        magic, version, n = struct.unpack("<3i", data[:12])
        assert magic == 20240520 and version == 1 and len(data) == 1024 + 2 * n, p
        toks += struct.unpack("<%dH" % n, data[1024:])
    return toks
val, train = tokens("val"), tokens("train")
assert max(val + train) < 50257 and val[0] == 50256 and (val + train).count(50256) == 6
print("ok: %d bytes -> %d val + %d train GPT-2 tokens, decoded byte for byte"
      % (sum(len(t) for t in texts), len(val), len(train)))
EOF

before=$(ls -l --time-style=+%s.%N "$out"/austen_*.bin "$out"/gpt2/*)
echo "+ $top_srcdir/scripts/get-data.sh $out   (again: must not rewrite the shards)"
"$top_srcdir/scripts/get-data.sh" "$out" | tee "$out/second.log"
grep -q "nothing to do" "$out/second.log"
after=$(ls -l --time-style=+%s.%N "$out"/austen_*.bin "$out"/gpt2/*)
[ "$before" = "$after" ] || { echo "FAIL: second run changed the shards"; exit 1; }
echo "ok: second run left the shards and the vocabulary untouched"

printf ' ' >> "$out/gpt2/vocab.bpe"
echo "+ $top_srcdir/scripts/get-data.sh $out   (vocab.bpe changed by one byte: must fail)"
if "$top_srcdir/scripts/get-data.sh" "$out" > "$out/third.log" 2>&1; then
  cat "$out/third.log"; echo "FAIL: get-data.sh accepted a changed vocab.bpe"; exit 1
fi
cat "$out/third.log"
grep -q "does not match scripts/gpt2-vocab.sha256" "$out/third.log"
echo "ok: a changed vocabulary file is refused"
