#!/bin/sh
# Checkpoint module under MPI: all scenarios with 1, 2 and 4 ranks (round trip, sharded save,
# tiling check, keep-K, bit flip, missing marker, truncation, model mismatch, faults on one
# rank), a file written by 2 ranks read by 1 and 4, an independent h5py check of the HF layout
# and checksums, and h5dump -H.
set -eu
B=${top_builddir:-.}
S=${top_srcdir:-.}
MPIRUN=${MPIRUN:-mpirun}
PY=${REF_PYTHON:-/usr/bin/python3}
W=$(mktemp -d /tmp/dtrain-ckpt.XXXXXX)
trap 'rm -rf "$W"' EXIT
run() { echo "+ $*"; "$@"; }
mpi() { n=$1; shift; run timeout 300 $MPIRUN --allow-run-as-root --oversubscribe -n "$n" "$B/tests/test_ckpt" "$@"; }

for n in 1 2 4; do mpi $n all "$W/all$n"; done

echo "# layout independence: written by 2 ranks, read by 1 and 4 (bitwise compare with the fill)"
mpi 2 save "$W/x" 12
mpi 1 load "$W/x" 12
mpi 4 load "$W/x" 12

echo "# independent check with h5py (names, shapes, transposes, values, CRC32C in python)"
run "$PY" "$S/tests/ckpt_check.py" "$W/x/ckpt_00000012.h5" 12
run "$PY" "$S/tests/ckpt_check.py" "$W/all4/sharded/ckpt_00000007.h5" 7
run "$PY" "$S/tests/ckpt_check.py" "$W/all1/roundtrip/ckpt_00000007.h5" 7

echo "# h5dump -H reads the file; c_attn.weight is (C, 3C) = (32, 96), wte (V, C) = (100, 32)"
run h5dump -H "$W/x/ckpt_00000012.h5" > "$W/dump.txt"
grep -A3 'DATASET "h.0.attn.c_attn.weight"' "$W/dump.txt" | grep -q 'SIMPLE { ( 32, 96 ) / ( 32, 96 ) }'
grep -A3 'DATASET "wte.weight"' "$W/dump.txt" | grep -q 'SIMPLE { ( 100, 32 ) / ( 100, 32 ) }'
grep -q 'ATTRIBUTE "complete"' "$W/dump.txt"
echo "ok h5dump -H: $(grep -c DATASET "$W/dump.txt") datasets, shapes as expected, /complete present"
echo "PASS ckpt_mpi.sh"
