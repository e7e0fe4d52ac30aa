#!/bin/sh
# Run bench/gemm_bench for all engines with OpenBLAS as the environment sets it
# (OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512: its AVX2 kernel), then OpenBLAS alone with both
# variables unset (it picks its AVX-512 kernel). OpenBLAS reads them once at load, hence two runs.
# usage: bench/gemm_bench.sh [BUILD_DIR] [extra gemm_bench args, e.g. -t 2 -r 7 -m 124M]
set -e
build=${1:-.}
[ $# -gt 0 ] && shift
bin="$build/bench/gemm_bench"
[ -x "$bin" ] || { echo "gemm_bench.sh: $bin not built (run 'make bench' in the build dir)" >&2; exit 1; }
echo "+ OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512 $bin -p -e own,blas,blis $*"
OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512 "$bin" -p -e own,blas,blis "$@"
echo "+ env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $bin -e blas $*"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$bin" -e blas "$@"
