#!/bin/sh
# Make dtrain's default corpus: Jane Austen's six novels as byte-level token shards.
#   usage: scripts/get-data.sh [OUTDIR]        (default OUTDIR: data)
#   env:   DTRAIN = path to the dtrain binary (default ./dtrain)
# Writes OUTDIR/austen/*.txt (one file per novel, ~4 MB in all) and, via `dtrain prep`,
# OUTDIR/austen_val_000000.bin (first 5% of the bytes) and OUTDIR/austen_train_000000.bin.
# Idempotent: does nothing when the shards already exist.
#
# Source: the Debian package r-cran-janeaustenr (R package janeaustenr by Julia Silge, MIT
# licence); the novels' text itself is in the public domain (Project Gutenberg transcriptions).
set -eu

OUTDIR=${1:-data}
DTRAIN=${DTRAIN:-./dtrain}
BOOKS="emma mansfieldpark northangerabbey persuasion prideprejudice sensesensibility"

if ls "$OUTDIR"/austen_train_*.bin >/dev/null 2>&1 && ls "$OUTDIR"/austen_val_*.bin >/dev/null 2>&1; then
  echo "get-data: $OUTDIR/austen_{val,train}_*.bin already exist; nothing to do"
  exit 0
fi

if ! command -v Rscript >/dev/null 2>&1; then
  echo "get-data: Rscript not found; install the Debian package r-cran-janeaustenr (it pulls in r-base-core)" >&2
  exit 1
fi
if ! Rscript -e 'suppressMessages(library(janeaustenr))' >/dev/null 2>&1; then
  echo "get-data: R package janeaustenr not found; install the Debian package r-cran-janeaustenr" >&2
  exit 1
fi
if [ ! -x "$DTRAIN" ]; then
  echo "get-data: dtrain binary '$DTRAIN' not found or not executable; build it or set DTRAIN=/path/to/dtrain" >&2
  exit 1
fi

mkdir -p "$OUTDIR/austen"
# Each novel as lines joined by "\n" (the package stores one line of text per element); the text
# is ASCII, useBytes keeps R from re-encoding anything.
Rscript -e '
  args <- commandArgs(trailingOnly = TRUE)
  library(janeaustenr)
  for (b in strsplit(args[2], " ")[[1]]) {
    f <- file.path(args[1], paste0(b, ".txt"))
    writeLines(get(b), f, useBytes = TRUE)
  }' "$OUTDIR/austen" "$BOOKS"

set --
for b in $BOOKS; do
  [ -s "$OUTDIR/austen/$b.txt" ] || { echo "get-data: $OUTDIR/austen/$b.txt was not written" >&2; exit 1; }
  set -- "$@" "$OUTDIR/austen/$b.txt"
done
echo "+ $DTRAIN prep --val-fraction 0.05 $OUTDIR/austen $*"
"$DTRAIN" prep --val-fraction 0.05 "$OUTDIR/austen" "$@"
