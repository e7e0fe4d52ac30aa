#!/usr/bin/env bash
# A sanitizer build of the whole tree (issue #24): the checkout's tracked files (with their
# uncommitted edits) copied to WORK/tree, configured without CUDA with AddressSanitizer and
# UndefinedBehaviorSanitizer compiled into every C file (-fsanitize=address,undefined
# -fno-sanitize-recover=all: the first error ends the process with a report), built, and the
# unit tests and the single-rank training tests run against it with leak detection on (Open MPI's
# and HDF5's own allocations suppressed: tests/lsan-mpi.supp). A report fails the test it is in.
#   usage: scripts/sanitize-check.sh [WORK] [TEST ...]   (WORK default ./build-sanitize; the
#          tests default to the Criterion unit tests and the single-rank training scripts below)
# Not in `make check` (a second build of everything, and the tests 2-5x slower); minutes here.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mkdir -p "${1:-$PWD/build-sanitize}" && cd "${1:-$PWD/build-sanitize}" && pwd)
shift || true
TESTS=${*:-"tests/test_config tests/test_data tests/test_bpe tests/test_model tests/test_cnn tests/test_optim tests/test_sample \
tests/test_crc32c tests/test_mesh tests/test_gemm tests/test_kmath tests/test_precision tests/test_plan tests/test_zero \
tests/test_pipeline tests/test_ddp tests/test_straggler tests/get_data.sh tests/train_tiny.sh tests/gpt2_ini.sh \
tests/resume_exact.sh tests/precision_train.sh tests/ref_cnn.sh tests/images.sh tests/generate.sh"}
git -C "$SRC" rev-parse --git-dir > /dev/null 2>&1 || { echo "sanitize-check: $SRC is not a git checkout" >&2; exit 2; }
rm -rf "$WORK/tree"
mkdir -p "$WORK/tree"
git -C "$SRC" ls-files -z | (cd "$SRC" && tar --null -T - -cf -) | tar -C "$WORK/tree" -xf -
cd "$WORK/tree"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
echo "sanitize-check: configure --without-cuda CFLAGS='-O1 -g $SAN' in $WORK/tree"
autoreconf -fi > "$WORK/build.log" 2>&1
./configure --without-cuda CFLAGS="-O1 -g $SAN" CXXFLAGS="-O1 -g $SAN" LDFLAGS="$SAN" >> "$WORK/build.log" 2>&1 ||
  { tail -20 "$WORK/build.log"; exit 1; }
make -j2 >> "$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; exit 1; }
[ -d "$SRC/data" ] && cp -r "$SRC/data" "$WORK/tree/data"
# Open MPI's plugins stay loaded (a leak inside a dlclose'd plugin has no name to suppress);
# Criterion keeps its argument copies until exit
(cat "$SRC/tests/lsan-mpi.supp"; echo "leak:libcriterion") > "$WORK/lsan.supp"
export OMPI_MCA_mca_base_component_disable_dlclose=1
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=0:halt_on_error=1
export LSAN_OPTIONS="suppressions=$WORK/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "sanitize-check: make check TESTS='$TESTS'"
status=0
make check TESTS="$TESTS" > "$WORK/check.log" 2>&1 || status=1
grep -E '^(PASS|FAIL|SKIP|ERROR):|^# (TOTAL|PASS|FAIL|SKIP|ERROR):' "$WORK/check.log" || true
if [ $status -ne 0 ]; then
  for f in tests/*.log; do
    grep -q ':test-result: \(FAIL\|ERROR\)' "${f%.log}.trs" 2>/dev/null || continue
    echo "=== $f"; grep -m5 -A20 'ERROR: \(AddressSanitizer\|LeakSanitizer\)\|runtime error' "$f" || tail -30 "$f"
  done
fi
exit $status
