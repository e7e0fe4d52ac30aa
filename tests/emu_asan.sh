#!/usr/bin/env bash
# The emulated kernels under AddressSanitizer and UndefinedBehaviorSanitizer: tests/gpu_parity_asan
# is the kernel-parity program with cuda/kernels.cu, cuda/backend_cuda.cu, cuda/comm_nccl.cu and
# the emulation (cuda/emu/) compiled with -fsanitize=address,undefined -fno-sanitize-recover=all.
# Every kernel and backend op runs on small and odd shapes (--small); any out-of-bounds access to
# host, stack or global memory, use after free or undefined behaviour ends it with the
# sanitizer's report. The binary must carry both sanitizers' hooks (checked with nm first), so a
# build that silently dropped the flags fails here. Leaks are not checked (the emulation keeps
# its streams and MPI its buffers until exit).
source "$top_srcdir/tests/lib.sh"
prog="$top_builddir/tests/gpu_parity_asan"
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
nm "$prog" > "$t/symbols"
for hook in __asan_init __asan_report_ __ubsan_handle_; do
  grep -q "$hook" "$t/symbols" || { echo "FAIL: $prog has no $hook: not built with the sanitizers"; exit 1; }
done
echo "$prog carries the AddressSanitizer and UndefinedBehaviorSanitizer hooks"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS"
run "$prog" --small
echo "emu_asan: OK"
