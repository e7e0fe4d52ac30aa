#!/bin/sh
# CI evidence that the CUDA build carries machine code for both target GPUs: cuobjdump
# --list-elf on the dtrain binary must list sm_80 and sm_90 cubins, and --list-ptx the
# compute_90 PTX (for newer GPUs). Skipped (77) in a build without CUDA or when no cuobjdump is
# found (CUDA's bin/, PATH, or the pip package nvidia-cuda-cuobjdump under REF_PYTHON).
set -u
: "${top_builddir:=.}" "${REF_PYTHON:=/usr/bin/python3}"
bin="$top_builddir/dtrain"
if ! grep -q '^#define DT_HAVE_CUDA 1' "$top_builddir/dt_build.h"; then
  echo "skip: dtrain is built without CUDA"
  exit 77
fi
nvcc=$(sed -n 's/^NVCC = //p' "$top_builddir/Makefile")
cuobjdump=""
for c in "$(dirname "$nvcc")/cuobjdump" "$(command -v cuobjdump 2>/dev/null)" \
  "$("$REF_PYTHON" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "bin", "cuobjdump"))' 2>/dev/null)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then cuobjdump=$c; break; fi
done
if [ -z "$cuobjdump" ]; then
  echo "skip: no cuobjdump (install it: $REF_PYTHON -m pip install nvidia-cuda-cuobjdump)"
  exit 77
fi
status=0
echo "\$ $cuobjdump --list-elf $bin"
elf=$("$cuobjdump" --list-elf "$bin") || { echo "FAIL: cuobjdump --list-elf failed"; exit 1; }
echo "$elf"
for sm in sm_80 sm_90; do
  n=$(echo "$elf" | grep -c "\.$sm\.cubin")
  if [ "$n" -ge 3 ]; then echo "ok: $n $sm cubins (kernels, backend, NCCL communicator)"; else echo "FAIL: $n $sm cubins, want >= 3"; status=1; fi
done
echo "\$ $cuobjdump --list-ptx $bin"
ptx=$("$cuobjdump" --list-ptx "$bin") || { echo "FAIL: cuobjdump --list-ptx failed"; exit 1; }
echo "$ptx"
if echo "$ptx" | grep -q 'sm_90\.ptx'; then echo "ok: compute_90 PTX present"; else echo "FAIL: no compute_90 PTX"; status=1; fi
archs=$(echo "$elf $ptx" | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')
if [ "$archs" = "sm_80 sm_90 " ]; then echo "ok: architectures exactly: $archs"; else echo "FAIL: architectures $archs (want sm_80 sm_90)"; status=1; fi
exit $status
