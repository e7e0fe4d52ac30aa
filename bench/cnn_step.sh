#!/usr/bin/env bash
# Issue #25's CNN step comparison, one invocation: bench/cnn_step (dtrain's CNN kernels) and
# bench/torch_cnn.py (PyTorch 1.13 with oneDNN) on the same model, batch and SGD, alternating for
# ROUNDS rounds (default 2), then the medians of each side's step medians and their ratio (goal:
# dtrain's step at most 0.8x PyTorch's), and each round's ratio with their median. CONV_COMPARE=1
# also runs dtrain with DT_CONV=im2col in each round. Run from the build tree. A benchmark, not a
# test.
#   usage: bench/cnn_step.sh [ARCH [BATCH [C,H,W [WIDTH]]]]     e.g. bench/cnn_step.sh resnet50 32 3,32,32 64
#          bench/cnn_step.sh cnn 64 1,28,28 32                  (the Fashion-MNIST SimpleCNN)
#          ROUNDS=3 STEPS=3 WARMUP=1 bench/cnn_step.sh resnet50 256    (the seed's 256 per rank)
set -euo pipefail
arch=${1:-resnet50} batch=${2:-32} img=${3:-3,32,32} width=${4:-64}
steps=${STEPS:-5} warmup=${WARMUP:-2} threads=${THREADS:-$(nproc)} rounds=${ROUNDS:-2}
dir=$(cd "$(dirname "$0")/.." && pwd)
STEP=${STEP:-./bench/cnn_step}
PY=${REF_PYTHON:-/usr/bin/python3}
ours=() theirs=() im2col=()
for r in $(seq "$rounds"); do
  echo "# ===== round $r"
  out=$("$STEP" --arch "$arch" --batch "$batch" --image "$img" --width "$width" --steps "$steps" --warmup "$warmup" \
    --threads "$threads")
  echo "$out"
  ours+=("$(sed -n 's/^RESULT dtrain .*step_ms=\([0-9.]*\).*/\1/p' <<< "$out")")
  if [ -n "${CONV_COMPARE:-}" ]; then # the same step with im2col for every convolution, in the same round
    out=$(DT_CONV=im2col "$STEP" --arch "$arch" --batch "$batch" --image "$img" --width "$width" --steps "$steps" \
      --warmup "$warmup" --threads "$threads")
    grep -E '^(RESULT|# cpu)' <<< "$out" | sed 's/^RESULT dtrain/RESULT dtrain-im2col/'
    im2col+=("$(sed -n 's/^RESULT dtrain .*step_ms=\([0-9.]*\).*/\1/p' <<< "$out")")
  fi
  out=$("$PY" "$dir/bench/torch_cnn.py" "$arch" "$batch" "$img" "$width" 10 128 "$steps" "$warmup" "$threads")
  grep -v '^# torch step' <<< "$out"
  theirs+=("$(sed -n 's/^RESULT torch .*step_ms=\([0-9.]*\).*/\1/p' <<< "$out")")
done
"$PY" - "${ours[*]}" "${theirs[*]}" "$arch" "$batch" "${im2col[*]}" <<'PY'
import statistics, sys
a, b = [float(v) for v in sys.argv[1].split()], [float(v) for v in sys.argv[2].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"# summary {sys.argv[3]} batch {sys.argv[4]}: dtrain {ma:.1f} ms/step (rounds {a}), PyTorch {mb:.1f} ms/step "
      f"(rounds {b}); dtrain/PyTorch step time {ma / mb:.2f} (goal <= 0.80)")
# each round's two runs are minutes apart at most: their ratio is less exposed to the VM's drift
r = [x / y for x, y in zip(a, b)]
print(f"# summary: per round dtrain/PyTorch {', '.join(f'{v:.2f}' for v in r)}; median {statistics.median(r):.2f}")
if sys.argv[5].split():
    c = [float(v) for v in sys.argv[5].split()]
    mc = statistics.median(c)
    print(f"# summary: dtrain with DT_CONV=im2col {mc:.1f} ms/step (rounds {c}): {mc / mb:.2f} of PyTorch's step; "
          f"the default convolutions (Winograd for 3x3 stride 1) {ma / mc:.2f} of im2col's")
PY
