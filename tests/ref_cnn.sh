#!/bin/sh
# PyTorch reference for the CNN layer kernels (issue #25): tests/cnn_dump runs conv2d, batch norm
# (training and evaluation), ReLU, max/average/global average pooling and SGD on random inputs;
# tests/ref/ref_cnn.py recomputes them with torch.nn.functional in float64 (limit 1e-5 relative).
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
