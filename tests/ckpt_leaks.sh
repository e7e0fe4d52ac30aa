#!/usr/bin/env bash
# The checkpoint module leaks nothing: tests/test_ckpt_asan (test_ckpt with src/ckpt/*.c built with
# AddressSanitizer) runs every scenario of `test_ckpt all` (round trips, sharded saves, keep-K,
# damaged files, injected faults on one rank, MPI errors) at 1 and 2 ranks with LeakSanitizer on:
# any block of dtrain's own still unreachable at exit fails it (suppressed: what the MPI stack and
# the CUDA libraries keep, tests/lsan-mpi.supp); out-of-bounds accesses and use after free in the
# module fail it too. Open file descriptors and HDF5 identifiers are counted by test_ckpt itself.
# First a self-check: the same run with a block planted unfreed (DT_TEST_PLANT_LEAK) must fail
# naming it, so a leak checker that stopped working fails here.
source "$top_srcdir/tests/lib.sh"
prog="$top_builddir/tests/test_ckpt_asan"
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
nm "$prog" > "$t/symbols" # (not piped into grep -q: with pipefail, nm's SIGPIPE would fail the check)
grep -q __asan_init "$t/symbols" || { echo "FAIL: $prog was not built with -fsanitize=address"; exit 1; }
# plugins stay mapped at exit (their frames resolve against the suppressions); the slow unwinder
# walks through MPI's frame-pointer-less code to them
export OMPI_MCA_mca_base_component_disable_dlclose=1
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=0
export LSAN_OPTIONS=suppressions=$top_srcdir/tests/lsan-mpi.supp:print_suppressions=0
status=0
DT_TEST_PLANT_LEAK=1 mpi 1 -x DT_TEST_PLANT_LEAK "$prog" all "$t/plant" > "$t/plant.out" 2>&1 || status=$?
grep -A4 'Direct leak of 48 byte' "$t/plant.out" | head -5
[ "$status" != 0 ] && grep -A4 'Direct leak of 48 byte' "$t/plant.out" | grep -q test_roundtrip ||
  { tail -20 "$t/plant.out"; echo "FAIL: the planted 48-byte leak was not reported (exit $status)"; exit 1; }
echo "self-check: a planted leak is reported"
for n in 1 2; do
  mpi "$n" -x OMPI_MCA_mca_base_component_disable_dlclose -x ASAN_OPTIONS -x LSAN_OPTIONS "$prog" all "$t/r$n" \
    > "$t/r$n.out" 2>&1 || { tail -40 "$t/r$n.out"; echo "FAIL: test_ckpt_asan at $n ranks"; exit 1; }
  tail -1 "$t/r$n.out"
done
echo "ckpt_leaks: OK"
