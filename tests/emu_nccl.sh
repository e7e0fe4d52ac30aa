#!/usr/bin/env bash
# The NCCL communicator (cuda/comm_nccl.cu) on the CUDA emulation's NCCL over MPI: tests/gpu_nccl
# (every collective on device buffers, exact data, blocking / request / group, in place and out of
# place) compiled against cuda/emu/, at 1 rank and at 3 ranks with 3 emulated GPUs; and the same
# checks on the communicator that stages device buffers through host memory over MPI
# (cuda/comm_staged.cu, system.device_comm = mpi) at 3 ranks.
source "$top_srcdir/tests/lib.sh"
prog="$top_builddir/tests/gpu_nccl_emu"
[ -x "$prog" ] || { echo "skip: no emulation build"; exit 77; }
for run in "1" "3" "3 mpi"; do
  set -- $run
  mpi "$1" -x DTRAIN_EMU_DEVICES=$1 "$prog" ${2:-} | tee "${TMPDIR:-/tmp}/emu_nccl.$$"
  grep -q '^gpu_nccl: every collective exact on every rank' "${TMPDIR:-/tmp}/emu_nccl.$$" ||
    { rm -f "${TMPDIR:-/tmp}/emu_nccl.$$"; echo "FAIL: $run"; exit 1; }
done
rm -f "${TMPDIR:-/tmp}/emu_nccl.$$"
echo "emu_nccl: OK (NCCL at 1 and 3 ranks, host-staged MPI at 3)"
