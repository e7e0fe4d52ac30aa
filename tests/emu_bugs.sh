#!/usr/bin/env bash
# Planted bugs the CUDA emulation must catch, each switched on with DTRAIN_FAULT like
# validation/'s faults, each failing with a message that names the kernel or the call.
# tests/emu_bugs (tests/emu_bugs.cpp) runs six small pieces of CUDA code in dtrain's style: clean it must
# pass; with one bug planted it must fail:
#   emu_oob          a kernel writes one element past its buffer: the canary after the allocation
#   emu_nosync       a block reduction lacks a __syncthreads(): shared memory read before it is
#                    written holds NaN bytes, the sum is NaN
#   emu_grid         a launch with grid.y = 70,000: cudaErrorInvalidConfiguration, as on an sm_90
#   emu_nosync_read  the host copies a result computed on a non-blocking stream without
#                    synchronising it: the copy runs before the kernel and is reported
#   emu_host_write   the host stores into device memory: SIGSEGV with a line naming the allocation
#   emu_cudnn_ws     a cuDNN convolution given half the workspace its algorithm needs:
#                    CUDNN_STATUS_BAD_PARAM at the call, with a line giving both sizes
#   emu_cudnn_out    a cuDNN convolution whose output buffer is one image short: a sticky illegal
#                    address when it runs, naming the call and the operand
# And the same class in dtrain's own kernels: emu_no_barrier turns every __syncthreads() of the
# emulation into nothing; tests/gpu_parity must then fail the reductions (column sums, layernorm
# parameter gradients, cross-entropy, gradient sum of squares) by name.
source "$top_srcdir/tests/lib.sh"
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
prog="$top_builddir/tests/emu_bugs"
export DTRAIN_EMU_DEVICES=1
run "$prog" > "$t/clean.out" 2>&1 || { cat "$t/clean.out"; echo "FAIL: emu_bugs fails without a planted bug"; exit 1; }
cat "$t/clean.out"
status=0
expect() { # FAULT WANT_EXIT(any|139) PATTERN...
  local f=$1 want=$2 rc
  shift 2
  echo "+ DTRAIN_FAULT=$f@0 $prog"
  set +e
  DTRAIN_FAULT="$f@0" "$prog" > "$t/$f.out" 2>&1
  rc=$?
  set -e
  sed 's/^/    /' "$t/$f.out" | tail -3
  if [ $rc = 0 ] || { [ "$want" != any ] && [ $rc != "$want" ]; }; then
    echo "FAIL: $f: exit status $rc"
    status=1
    return
  fi
  for p in "$@"; do
    grep -q -- "$p" "$t/$f.out" || { echo "FAIL: $f: no line matching '$p'"; status=1; return; }
  done
  echo "ok: $f caught (exit $rc), message names: $*"
}
expect emu_oob any "kernel scale_k wrote outside its buffers: byte 0 past the end of allocation"
expect emu_nosync any "kernel block_sum_k: sum -\?nan"
expect emu_grid any "launch of kernel row_fill_k<<<(1,70000,1)" "grid.y outside \[1, 65535\]"
expect emu_nosync_read any "cudaMemcpy (device to host)" "scale_k, queued on a non-blocking stream"
expect emu_host_write 139 "the host tried to write device memory"
expect emu_cudnn_ws any "cudnnConvolutionForward: algorithm 2 needs a workspace of 2700 bytes, got 1350" \
  "CUDNN_STATUS_BAD_PARAM"
expect emu_cudnn_out any "cudnnConvolutionForward: output: "

echo "+ DTRAIN_FAULT=emu_no_barrier@0 $top_builddir/tests/gpu_parity_emu --small"
set +e
DTRAIN_FAULT=emu_no_barrier@0 "$top_builddir/tests/gpu_parity_emu" --small > "$t/nb.out" 2>&1
rc=$?
set -e
awk '/FAIL/ && n++ < 8' "$t/nb.out" # (grep | head: SIGPIPE under pipefail when there are more)
[ $rc = 1 ] || { echo "FAIL: gpu_parity without barriers exited $rc (want 1)"; status=1; }
for op in "col_sum" "layernorm_backward dweight" "crossentropy_forward loss" "sumsq_partial"; do
  grep -q "^$op .*FAIL" "$t/nb.out" || { echo "FAIL: no FAIL row for $op without barriers"; status=1; }
done
if grep -q "^gelu_forward .*FAIL\|^encoder_forward .*FAIL" "$t/nb.out"; then
  echo "FAIL: kernels without barriers failed too"
  status=1
fi
[ $status = 0 ] && echo "emu_bugs: every planted bug was caught"
exit $status
