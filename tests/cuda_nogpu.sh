#!/usr/bin/env bash
# Backend choice on a machine without a usable GPU (this one: the CUDA runtime loads but finds
# no driver). system.backend=cuda must end every rank with status 2 and exactly one error line
# (from rank 0) naming the first rank without a GPU, its host and the CUDA runtime's reason (or,
# in a build without CUDA, that cuda is not built in); system.backend=auto must train on the CPU, with exactly one line from
# rank 0 saying so in a CUDA build and none in a CPU build. Skipped (77) when a GPU is usable.
source "$top_srcdir/tests/lib.sh"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "skip: a GPU is present"
  exit 77
fi
begin_test
cuda_built=0
grep -q '^#define DT_HAVE_CUDA 1' dt_build.h && cuda_built=1
echo "CUDA built in: $cuda_built"

# each rank reports its own exit status through a wrapper shell
set +e
mpi 2 sh -c '"$0" "$@"; echo "exit status of rank $OMPI_COMM_WORLD_RANK: $?" >&2' "$DTRAIN" "$cfg" \
  system.backend=cuda train.steps=1 > "$t/cuda.out" 2> "$t/cuda.err"
set -e
cat "$t/cuda.err"
if [ $cuda_built = 1 ]; then want='system.backend = cuda but rank 0 (host .*) has no usable GPU'; else want="'cuda' is not built into this dtrain"; fi
n=$(grep -c "^dtrain: .*$want" "$t/cuda.err" || true)
[ "$n" = 1 ] || { echo "FAIL: $n lines matching '$want' (want exactly 1, from rank 0)"; exit 1; }
for r in 0 1; do
  grep -q "^exit status of rank $r: 2$" "$t/cuda.err" || { echo "FAIL: rank $r did not exit with status 2"; exit 1; }
done
if grep -q '^# *step\|^ *1 ' "$t/cuda.out"; then echo "FAIL: a step ran"; exit 1; fi
echo "ok: backend=cuda: exactly one line matching '$want', both ranks exit 2, no step ran"

mpi 2 "$DTRAIN" "$cfg" system.backend=auto train.steps=1 checkpoint.dir= > "$t/auto.out" 2> "$t/auto.err"
cat "$t/auto.err"
grep -q '^# backend: cpu' "$t/auto.out" || { echo "FAIL: auto did not report the cpu backend"; cat "$t/auto.out"; exit 1; }
n=$(grep -c 'system.backend = auto: .*using the CPU backend' "$t/auto.err" || true)
want=$cuda_built
[ "$n" = "$want" ] || { echo "FAIL: auto printed $n fallback lines (want $want)"; exit 1; }
echo "ok: backend=auto trained on the cpu backend with $n fallback line(s) on stderr"
