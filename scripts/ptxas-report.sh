#!/bin/sh
# Regenerate docs/ptxas-report.txt: recompile the CUDA objects of a configured build directory
# with -Xptxas -v and keep ptxas's per-kernel registers / shared memory / spill lines, with the
# kernel names demangled. Usage: scripts/ptxas-report.sh BUILD_DIR > docs/ptxas-report.txt
set -eu
b=${1:?usage: $0 BUILD_DIR}
cd "$b"
for o in cuda/kernels.o cuda/kernels_tp.o cuda/attention.o cuda/backend_cuda.o cuda/comm_nccl.o; do
  echo "== $o"
  rm -f "$o" # not make -B: that also reruns config.status, which blanks every dependency file
  make -s "$o" NVCC_PTXAS_V="-Xptxas -v" 2>&1 | grep '^ptxas\|bytes stack' | grep -v '^ptxas info    : Compile time' | c++filt
done
