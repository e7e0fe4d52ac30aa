#!/bin/sh
# PyTorch reference for the CPU GPT-2: tests/ref_dump runs init, forward/backward and 10 AdamW
# steps through the CPU backend and dumps everything; tests/ref/ref_gpt2.py rebuilds the model in
# PyTorch and compares logits, loss, every gradient, the 10 losses and the final parameters.
# Fails (exit 1) if REF_PYTHON has no torch.
set -u
: "${top_srcdir:=.}" "${top_builddir:=.}" "${REF_PYTHON:=/usr/bin/python3}"
out="${top_builddir}/tests/ref_gpt2.bin"
if ! "$REF_PYTHON" -c 'import torch, numpy' 2>/dev/null; then
  echo "ref_gpt2.sh: FAIL: REF_PYTHON=$REF_PYTHON cannot import torch and numpy (configure REF_PYTHON=/usr/bin/python3)" >&2
  exit 1
fi
echo "+ ${top_builddir}/tests/ref_dump $out"
"${top_builddir}/tests/ref_dump" "$out" || { echo "ref_gpt2.sh: FAIL: ref_dump failed" >&2; exit 1; }
echo "+ $REF_PYTHON ${top_srcdir}/tests/ref/ref_gpt2.py $out 2"
"$REF_PYTHON" "${top_srcdir}/tests/ref/ref_gpt2.py" "$out" 2 || { echo "ref_gpt2.sh: FAIL" >&2; exit 1; }
rm -f "$out"
