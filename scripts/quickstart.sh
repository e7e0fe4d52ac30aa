#!/usr/bin/env bash
# Quick start on a fresh Debian 12 machine (as root): install packages, build, fetch the bundled
# corpus, and train the embedded default (inputs/tiny.ini) on the CPU. Prints the loss per step
# and writes a checkpoint under checkpoints/tiny/ and a picture of its curves, tiny_metrics.svg,
# and ends with a few lines of text sampled from the model it just trained.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure
make -j"$(nproc)"
DTRAIN=./dtrain bash scripts/get-data.sh data
./dtrain inputs/tiny.ini "$@"
./dtrain plot tiny_metrics.jsonl # -> tiny_metrics.svg: the run's curves, for a browser
./dtrain generate inputs/tiny.ini --prompt "It is a truth universally acknowledged" --tokens 80 \
  --temperature 0.8 --top-k 40 # text from checkpoints/tiny/'s latest checkpoint
