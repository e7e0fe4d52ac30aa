#!/bin/sh
# Checkpoint module under MPI: all scenarios with 1, 2 and 4 ranks, and at 4 ranks also with every
# rank writing replicated arenas and with 2 node leaders; large tensors through the own descriptors
# (round trip, sharded save,
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
mpi() { n=$1; shift; run timeout 120 $MPIRUN --allow-run-as-root --oversubscribe -n "$n" ${DTRAIN_CKPT_WRITERS:+-x DTRAIN_CKPT_WRITERS} ${DTRAIN_CKPT_DIRECT:+-x DTRAIN_CKPT_DIRECT} ${DTRAIN_CKPT_TIMES:+-x DTRAIN_CKPT_TIMES} "$B/tests/test_ckpt" "$@"; }

for n in 1 2 4; do mpi $n all "$W/all$n"; done
# Replicated (full) arenas are written by one rank per node (the default, above: 1 node); also by
# every rank itself as before (DTRAIN_CKPT_WRITERS=all) and by 2 leaders, as on 2 nodes
# (DTRAIN_CKPT_WRITERS=2: pairs of ranks act as nodes).
echo "+ DTRAIN_CKPT_WRITERS=all"
DTRAIN_CKPT_WRITERS=all mpi 4 all "$W/every4"
echo "+ DTRAIN_CKPT_WRITERS=2"
DTRAIN_CKPT_WRITERS=2 mpi 4 all "$W/pairs4"

echo "# large tensors (>= 1 MiB, replicated arenas: written at page-aligned file offsets through dtrain's own"
echo "# descriptors, O_DIRECT where the file system takes it; sizes not page multiples, rank parts cutting"
echo "# Conv1D rows): saved and loaded bitwise at 1, 2, 4 ranks, every rank writing, 2 leaders, path off,"
echo "# own descriptors without O_DIRECT (the fallback where a file system refuses it)"
big="2 396 1001 64"
for n in 1 2 4; do mpi $n bench "$W/big$n" $big; done
DTRAIN_CKPT_WRITERS=all mpi 4 bench "$W/bigall" $big
DTRAIN_CKPT_WRITERS=2 mpi 4 bench "$W/bigpairs" $big
DTRAIN_CKPT_DIRECT=0 mpi 2 bench "$W/bigoff" $big
DTRAIN_CKPT_DIRECT=buffered mpi 2 bench "$W/bigbuf" $big
# where the file system takes O_DIRECT (probed here), the large tensors go through it both ways
# (the ckpt-time lines say which path each took); with DTRAIN_CKPT_DIRECT=buffered through plain
# descriptors
if "$PY" -c 'import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_DIRECT))' "$W/dio.probe" 2>/dev/null; then
  DTRAIN_CKPT_TIMES=1 mpi 2 bench "$W/bigtimes" $big 2> "$W/times.err"
  DTRAIN_CKPT_TIMES=1 DTRAIN_CKPT_DIRECT=buffered mpi 2 bench "$W/bigtimesb" $big 2> "$W/timesb.err"
  grep 'own writes\|read wait' "$W/times.err" "$W/timesb.err"
  for want in "times.err:own writes, O_DIRECT" "times.err:read wait (own, O_DIRECT)" "timesb.err:own writes, buffered" \
              "timesb.err:read wait (own, buffered)"; do
    grep -qF "${want#*:}" "$W/${want%%:*}" || { echo "FAIL: no '${want#*:}' line in ${want%%:*}"; exit 1; }
  done
else
  echo "# this file system refuses O_DIRECT: the O_DIRECT path is not checked here"
fi
run "$PY" "$S/tests/ckpt_check.py" "$W/bigbuf/ckpt_00000001.h5" 1 $big
run "$PY" "$S/tests/ckpt_check.py" "$W/bigall/ckpt_00000001.h5" 1 $big
run "$PY" "$S/tests/ckpt_check.py" "$W/big2/ckpt_00000001.h5" 1 $big
# a flipped bit inside a large dataset (read through the own descriptors) fails its CRC32C
run "$PY" - "$W/big2/ckpt_00000001.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
off = f["optim/exp_avg/h.1.mlp.c_fc.weight"].id.get_offset() + 1234567
f.close()
with open(sys.argv[1], "r+b") as fh:
    fh.seek(off); b = fh.read(1); fh.seek(off); fh.write(bytes([b[0] ^ 0x04]))
PY
for n in 1 3; do mpi $n corrupt "$W/big2/ckpt_00000001.h5" $big /optim/exp_avg/h.1.mlp.c_fc.weight; done

echo "# layout independence: written by 2 ranks, read by 1 and 4 (bitwise compare with the fill)"
mpi 2 save "$W/x" 12
mpi 1 load "$W/x" 12
mpi 4 load "$W/x" 12 2> "$W/load4.err" || { cat "$W/load4.err"; exit 1; }
cat "$W/load4.err"
# the 4 ranks of this node share one window in /dev/shm (a node reads each byte once); the MPI
# exchange is only the fallback for a machine without it
if [ -w /dev/shm ] && grep -q "no shared memory" "$W/load4.err"; then
  echo "FAIL: the 4-rank load fell back to private windows although /dev/shm is writable"
  exit 1
fi

echo "# a state dataset larger than its place (1000 RNG words; the reader's buffer holds a few) is refused"
cp "$W/x/ckpt_00000012.h5" "$W/bigrng.h5"
run "$PY" - "$W/bigrng.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    crc = f["state/rng"].attrs["crc32c"]
    del f["state/rng"]
    f.create_dataset("state/rng", data=np.arange(1000, dtype="<u8")).attrs["crc32c"] = crc
PY
for n in 1 2; do mpi $n refuse "$W/bigrng.h5" "elements do not fit"; done

echo "# independent check with h5py (names, shapes, values, CRC32C in python)"
run "$PY" "$S/tests/ckpt_check.py" "$W/x/ckpt_00000012.h5" 12
run "$PY" "$S/tests/ckpt_check.py" "$W/all4/sharded/ckpt_00000007.h5" 7
run "$PY" "$S/tests/ckpt_check.py" "$W/all1/roundtrip/ckpt_00000007.h5" 7

echo "# a mode the driver does not know is an error (exit 2), never a run of nothing that prints PASSED"
rc=0
mpi 1 nosuch "$W/x" > "$W/nosuch.out" 2>&1 || rc=$?
cat "$W/nosuch.out"
[ "$rc" -eq 2 ] && ! grep -q PASSED "$W/nosuch.out" || { echo "FAIL: test_ckpt nosuch: exit $rc"; exit 1; }

echo "# h5dump -H reads the file; c_attn.weight is (C, 3C) = (32, 96), wte (V, C) = (100, 32)"
run h5dump -H "$W/x/ckpt_00000012.h5" > "$W/dump.txt"
grep -A3 'DATASET "h.0.attn.c_attn.weight"' "$W/dump.txt" | grep -q 'SIMPLE { ( 32, 96 ) / ( 32, 96 ) }'
grep -A3 'DATASET "wte.weight"' "$W/dump.txt" | grep -q 'SIMPLE { ( 100, 32 ) / ( 100, 32 ) }'
grep -q 'ATTRIBUTE "complete"' "$W/dump.txt"
echo "ok h5dump -H: $(grep -c DATASET "$W/dump.txt") datasets, shapes as expected, /complete present"
echo "PASS ckpt_mpi.sh"
