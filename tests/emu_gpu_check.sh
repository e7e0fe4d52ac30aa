#!/usr/bin/env bash
# scripts/gpu-check.sh itself, end to end, on the CUDA emulation (--emulation --quick): its
# preflight, parity, training, checkpoint, generate, NCCL, parallel (several ranks on one emulated GPU,
# the system's mpirun) and classifiers stages run the emulated CUDA build (dtrain_emu,
# tests/gpu_parity_emu, tests/gpu_nccl_emu) exactly as they would run the bundle on a lent GPU,
# through the same comparisons (scripts/gpu_check_compare.py). Eight stages must PASS (sanitizer
# and speed SKIP on the emulation) and the verdict must say WORKS: the check cannot have a
# broken stage that only a GPU session would discover.
source "$top_srcdir/tests/lib.sh"
[ -x "$top_builddir/dtrain_emu" ] || { echo "skip: no emulation build"; exit 77; }
[ "$top_srcdir" -ef "$top_builddir" ] || { echo "skip: gpu-check.sh --emulation uses the in-tree build"; exit 77; }
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
OUT="$t" run bash "$top_srcdir/scripts/gpu-check.sh" --emulation --quick > "$t/check.out" 2>&1 || true
tail -n 12 "$t/check.out"
pass=$(grep -c '^STAGE .* PASS ' "$t/summary.txt" || true)
skip=$(grep -c '^STAGE \(sanitizer\|speed\) *SKIP ' "$t/summary.txt" || true)
[ "$pass" = 8 ] && [ "$skip" = 2 ] || { echo "FAIL: $pass stages passed (want 8), $skip skipped (want sanitizer, speed)"; exit 1; }
grep -qx 'GPU PATH ON THE CUDA EMULATION: WORKS' "$t/summary.txt" || { echo "FAIL: verdict"; exit 1; }
echo "emu_gpu_check: OK"
