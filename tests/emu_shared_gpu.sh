#!/usr/bin/env bash
# Two ranks on one GPU (the CUDA emulation with DTRAIN_EMU_DEVICES=1: both ranks' device 0 has PCI
# bus 0000:01:00.0), the check of src/parallel/mesh.c check_shared_gpu:
#   1. refused by default, also with system.device_comm = mpi, in words naming the bus id;
#   2. DTRAIN_TEST_SHARED_GPU=1 with device_comm = nccl: still refused (NCCL refuses two ranks on one
#      device), the error naming the variable;
#   3. DTRAIN_TEST_SHARED_GPU=1 with device_comm = mpi: trains, with one "# test:" line from rank 0
#      (scripts/gpu-check.sh's parallel stage runs its layouts this way on a one-GPU machine).
source "$top_srcdir/tests/lib.sh"
begin_test
EMU="$top_builddir/dtrain_emu"
a=("$cfg" system.backend=cuda train.steps=2 log.every=1 checkpoint.dir= train.eval_every=0)
two() { # OUT ARGS...: 2 ranks on one emulated GPU; the exit status
  local out=$1
  shift
  mpi 2 -x DTRAIN_EMU_DEVICES=1 -x DTRAIN_EMU_QUIET=1 "$@" > "$out" 2>&1
}
refused() { # OUT WHAT: the launch failed with the one-GPU-per-rank error
  grep -q 'local ranks 0 and 1 of node 0 both run on the GPU at PCI bus 0000:01:00.0' "$1" ||
    { tail -5 "$1"; echo "FAIL: $2: not refused as two ranks on one GPU"; exit 1; }
}
two "$t/plain.out" "$EMU" "${a[@]}" system.device_comm=mpi && { echo "FAIL: two ranks on one GPU started"; exit 1; }
refused "$t/plain.out" "no DTRAIN_TEST_SHARED_GPU"
grep -q DTRAIN_TEST_SHARED_GPU "$t/plain.out" && { echo "FAIL: the plain refusal advertises the test-only variable"; exit 1; }
two "$t/nccl.out" -x DTRAIN_TEST_SHARED_GPU=1 "$EMU" "${a[@]}" system.device_comm=nccl &&
  { echo "FAIL: DTRAIN_TEST_SHARED_GPU=1 let two ranks share a GPU over NCCL"; exit 1; }
refused "$t/nccl.out" "DTRAIN_TEST_SHARED_GPU=1 with device_comm = nccl"
grep -q 'DTRAIN_TEST_SHARED_GPU=1, test-only, allows it only with system.device_comm = mpi' "$t/nccl.out" ||
  { echo "FAIL: the nccl refusal does not name DTRAIN_TEST_SHARED_GPU"; exit 1; }
two "$t/mpi.out" -x DTRAIN_TEST_SHARED_GPU=1 "$EMU" "${a[@]}" system.device_comm=mpi ||
  { tail -5 "$t/mpi.out"; echo "FAIL: DTRAIN_TEST_SHARED_GPU=1 with device_comm = mpi did not train"; exit 1; }
n=$(grep -c '^# test: local ranks share GPUs (DTRAIN_TEST_SHARED_GPU=1): 2 of the 2 ranks of node 0' "$t/mpi.out" || true)
[ "$n" = 1 ] || { echo "FAIL: $n '# test:' lines (want 1, from rank 0)"; exit 1; }
grep -q '^ *2 ' "$t/mpi.out" || { echo "FAIL: no step 2"; exit 1; }
echo "ok: refused without the variable and over NCCL (naming it), allowed with it over MPI, one '# test:' line"
echo "emu_shared_gpu: OK"
