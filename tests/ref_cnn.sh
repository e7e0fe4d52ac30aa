#!/bin/sh
# PyTorch reference for the CNN layer kernels (issue #25): tests/cnn_dump runs conv2d, batch norm
# (training and evaluation), ReLU, max/average/global average pooling and SGD on random inputs;
# tests/ref/ref_cnn.py recomputes them with torch.nn.functional in float64 (limit 1e-5 relative).
# Then the models (src/model/cnn.h): tests/cnn_model_dump trains each for a few steps from its own
# initial weights and tests/ref/ref_cnn_model.py checks every step in float64 PyTorch from dtrain's
# state at that step (loss, gradients, running statistics; the optimizer fed dtrain's gradients
# gives dtrain's next parameters): the SimpleCNN on 1x28x28 with SGD (10 classes) and AdamW (2), ResNet-18 (width 8) on 3x32x32 with
# SGD, ResNet-50 (width 4, zero_init_residual: at torchvision's default initialisation 50 layers of
# batch norm are so ill-conditioned that float32 PyTorch's own gradients are 4e-2 off float64) on
# 3x32x32 with SGD (B=8, 4 steps: later steps of this tiny net on random labels are ill-conditioned
# again); batch norm in training mode, then evaluation; every one within 1e-5.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}" "${REF_PYTHON:=/usr/bin/python3}"
out="${top_builddir}/tests/ref_cnn.bin"
if ! "$REF_PYTHON" -c 'import torch, numpy' 2>/dev/null; then
  echo "ref_cnn.sh: FAIL: REF_PYTHON=$REF_PYTHON cannot import torch and numpy (configure REF_PYTHON=/usr/bin/python3)" >&2
  exit 1
fi
echo "+ ${top_builddir}/tests/cnn_dump $out"
"${top_builddir}/tests/cnn_dump" "$out" || { echo "ref_cnn.sh: FAIL: cnn_dump failed" >&2; exit 1; }
echo "+ $REF_PYTHON ${top_srcdir}/tests/ref/ref_cnn.py $out"
"$REF_PYTHON" "${top_srcdir}/tests/ref/ref_cnn.py" "$out" || { echo "ref_cnn.sh: FAIL" >&2; exit 1; }
rm -f "$out"
for m in "cnn 1 28 28 10 4 16 8 10 sgd" "cnn 1 28 28 2 4 16 8 10 adamw" "resnet18 3 32 32 10 8 0 4 6 sgd" \
  "resnet50z 3 32 32 10 4 0 8 4 sgd"; do
  echo "+ ${top_builddir}/tests/cnn_model_dump $out $m"
  # shellcheck disable=SC2086
  "${top_builddir}/tests/cnn_model_dump" "$out" $m || { echo "ref_cnn.sh: FAIL: cnn_model_dump $m failed" >&2; exit 1; }
  "$REF_PYTHON" "${top_srcdir}/tests/ref/ref_cnn_model.py" "$out" || { echo "ref_cnn.sh: FAIL: $m" >&2; exit 1; }
done
# a model needs at least 2 classes: refused with the reason
if msg=$("${top_builddir}/tests/cnn_model_dump" "$out" cnn 1 28 28 1 4 16 8 1 sgd 2>&1); then
  echo "ref_cnn.sh: FAIL: a 1-class model was accepted" >&2; exit 1
fi
echo "$msg" | grep -q 'at least 2 classes' || { echo "ref_cnn.sh: FAIL: '$msg' does not say why" >&2; exit 1; }
echo "ok: refused: $msg"
rm -f "$out"
