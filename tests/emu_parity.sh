#!/usr/bin/env bash
# Kernel parity on the CUDA emulation: tests/gpu_parity (every CUDA kernel and backend op against
# its CPU twin, fp32 and bf16; the program scripts/gpu-check.sh runs on a real GPU) built against
# cuda/emu/ and run with --small (small, odd and boundary shapes; the shapes past the grid cap take
# minutes on the emulation). Then kernel coverage: every __global__ function in cuda/*.cu must have
# been launched by the parity program (the emulation logs each kernel it launches,
# DTRAIN_EMU_LAUNCH_LOG; the program launches kernels only inside its compared cases), so a
# kernel added without a parity case fails here. The coverage check is first run on a planted
# source with one extra kernel and must name it.
source "$top_srcdir/tests/lib.sh"
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
DTRAIN_EMU_LAUNCH_LOG="$t/launched" run "$top_builddir/tests/gpu_parity_emu" --small > "$t/parity.out" 2> "$t/parity.err" || {
  cat "$t/parity.out" "$t/parity.err"
  echo "FAIL: gpu_parity on the emulation"
  exit 1
}
cat "$t/parity.out"
printf '__global__ static void planted_new_k(float *x) { x[0] = 1; }\n' > "$t/planted.cu"
"$PY" - "$t/launched" "$t/planted.cu" "$top_srcdir"/cuda/*.cu <<'PY'
import re, sys
launched, planted, sources = sys.argv[1], sys.argv[2], sys.argv[3:]
KERNEL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:static\s+)?(?:inline\s+)?void\s+"
                    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
covered = {re.sub(r"<.*", "", k) for k in open(launched).read().split()}  # a template's launches: kernel<S>
assert covered, "the emulation logged no kernel launch"
def uncovered(files):
    found = {}
    for f in files:
        for k in KERNEL.findall(open(f).read()):
            found[k] = f
    return found, sorted(k for k in found if k not in covered)
found, miss = uncovered(sources + [planted])
assert miss == ["planted_new_k"], f"the coverage check did not catch the planted kernel: {miss}"
print(f"self-check: a planted kernel without a parity case is reported ({miss[0]})")
found, miss = uncovered(sources)
print(f"{len(found)} __global__ kernels in cuda/*.cu, {len(covered)} launched by gpu_parity")
for k in miss:
    print(f"FAIL: kernel {k} ({found[k]}) has no parity case in tests/gpu_parity*.cu")
assert not miss, "kernels without a parity case"
stale = sorted(covered - set(found))
assert not stale, f"gpu_parity launched kernels this check did not find in cuda/*.cu: {stale}"
print("every kernel has a parity case")
PY
echo "emu_parity: OK"
