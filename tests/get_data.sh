#!/bin/sh
# scripts/get-data.sh end to end: the Austen corpus becomes val/train shards whose tokens are
# exactly the bytes of the six novels (first 5% val), and a second run does nothing.
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

before=$(ls -l --time-style=+%s.%N "$out"/austen_*.bin)
echo "+ $top_srcdir/scripts/get-data.sh $out   (again: must not rewrite the shards)"
"$top_srcdir/scripts/get-data.sh" "$out" | tee "$out/second.log"
grep -q "nothing to do" "$out/second.log"
after=$(ls -l --time-style=+%s.%N "$out"/austen_*.bin)
[ "$before" = "$after" ] || { echo "FAIL: second run changed the shards"; exit 1; }
echo "ok: second run left the shards untouched"
