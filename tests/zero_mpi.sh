#!/usr/bin/env bash
# ZeRO's collectives at 2 and 3 ranks with staging pieces far smaller than a shard:
# tests/test_zero_mpi compares stage 1, 2 and 3 results with closed-form values (its header).
source "$top_srcdir/tests/lib.sh"
for n in 2 3; do
  mpi "$n" timeout 120 "$top_builddir/tests/test_zero_mpi"
done
echo "zero_mpi: OK"
