#!/usr/bin/env bash
# Issue #5's comparison in one invocation: bench/step (dtrain, with its own sgemm ceiling) and
# bench/torch_gpt2.py (PyTorch, best of its thread settings) side by side, once with the OpenBLAS
# variables unset (OpenBLAS picks its AVX-512 kernel) and once as CI sets them
# (OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512). A benchmark, not a test.
#   usage: bench/step_both.sh [bench/step options...]   (run from the build tree)
#   e.g.   bench/step_both.sh --steps 5 --warmup 2                       (GPT-2 124M, B=4, T=256)
#          bench/step_both.sh --layers 6 --heads 6 --embd 384 --batch 8 --seq 256   (the 30M model)
set -uo pipefail
STEP=${STEP:-./bench/step}
run() {
  echo "# ===== $1"
  echo "# + $2 $STEP --torch ${*:3}"
  env $2 "$STEP" --torch "${@:3}" 2>&1 | tee "$log"
  grep -E '^RESULT|^# sgemm ceiling|torch-setting' "$log" | sed "s/^/[$1] /" >>"$sum"
}
sum=$(mktemp) log=$(mktemp)
trap 'rm -f "$sum" "$log"' EXIT
run "blas vars unset" "-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE" "$@"
run "CI env: Haswell" "OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512" "$@"
echo "# ===== summary (medians; ratio > 1.25 means dtrain <= 0.8x PyTorch's step time)"
cat "$sum"
