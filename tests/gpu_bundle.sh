#!/usr/bin/env bash
# The GPU check's bundle, here: scripts/gpu-bundle.sh gathers the binaries, Open MPI (plugins
# included), HDF5, OpenBLAS and their dependencies, checks that every library resolves from the
# bundle plus the written base-system list, trains 2 CPU steps with the bundled dtrain under
# `env -i` (alone, and 2 ranks started by the bundled mpirun), and packs what travels (< 60 MiB); then scripts/gpu-check.sh --quick runs from that
# archive and, on this machine without a GPU, reports SKIP for every GPU stage and no verdict.
# Skipped (77) in a build without CUDA.
source "$top_srcdir/tests/lib.sh"
grep -q '^#define DT_HAVE_CUDA 1' "$top_builddir/dt_build.h" || { echo "skip: dtrain is built without CUDA"; exit 77; }
[ "$top_srcdir" -ef "$top_builddir" ] || { echo "skip: gpu-bundle.sh uses the in-tree build"; exit 77; }
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
run bash "$top_srcdir/scripts/gpu-bundle.sh" "$t/gpu-bundle" 2>&1 | tee "$t/bundle.out"
grep -q 'trained 2 steps on the CPU under env -i' "$t/bundle.out" || { echo "FAIL: the bundled dtrain did not train"; exit 1; }
grep -q 'the bundled mpirun started 2 ranks' "$t/bundle.out" || { echo "FAIL: the bundled mpirun did not start 2 ranks"; exit 1; }
[ -f "$t/gpu-bundle.tar.xz" ] || { echo "FAIL: no archive"; exit 1; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "ok: bundle built; a GPU is present: run scripts/gpu-check.sh by hand, not inside make check"
  exit 0
fi
rm -rf "$t/gpu-bundle" # gpu-check must work from the archive alone
OUT="$t/out" run bash "$top_srcdir/scripts/gpu-check.sh" --quick "$t/gpu-bundle.tar.xz" > "$t/check.out" 2>&1 || true
tail -n 12 "$t/check.out"
n=$(grep -c '^STAGE .* SKIP ' "$t/out/summary.txt" || true)
[ "$n" = 10 ] || { echo "FAIL: $n of 10 stages reported SKIP"; exit 1; }
grep -qx 'GPU PATH: NOT CHECKED (no usable GPU here)' "$t/out/summary.txt" || { echo "FAIL: wrong verdict line"; exit 1; }
echo "ok: bundle built, trained under env -i, and gpu-check.sh --quick skipped all 10 GPU stages without a GPU"
