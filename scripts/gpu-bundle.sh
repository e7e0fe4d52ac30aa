#!/usr/bin/env bash
# Build dtrain with CUDA and gather into one git-ignored folder what a lent GPU machine lacks (it
# has CUDA, cuBLAS, NCCL, PyTorch; no MPI, HDF5, OpenBLAS, Criterion or compiler toolchain of
# ours): the binaries (dtrain, tests/gpu_parity, tests/gpu_nccl), Open MPI's launcher (mpirun,
# for one node: no orted) and shared libraries (with its plugins, so a singleton rank starts
# without mpirun), HDF5, OpenBLAS and their own dependencies, the bundled token shards, a
# Fashion-MNIST subset (data/fmnist: 2048 training and 500 test images, scripts/fmnist_subset.py)
# and the small configs. Not the CUDA libraries: scripts/gpu-check.sh finds those on the GPU
# machine. Also writes BUNDLE.tar.xz, the form that
# travels (device `carry`), and checks here that everything resolves from the bundle plus the
# base-system libraries listed below, by running the bundled dtrain under `env -i` on the CPU,
# once alone and once as 2 ranks started by the bundled mpirun.
#
#   scripts/gpu-bundle.sh [BUNDLE]      (default BUNDLE: gpu-bundle, at the top of the tree)
#
# Uses the in-tree build when it is configured with CUDA (else configures one), so run it from
# a tree where `./configure` found nvcc. Prints the folder's and the archive's size.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
out=$(realpath -m "${1:-gpu-bundle}")
die() { echo "gpu-bundle: $*" >&2; exit 1; }
say() { echo "gpu-bundle: $*" >&2; }

# What the GPU machine must provide itself: glibc's libraries and the C++ runtime (its Python
# and PyTorch need them too), and CUDA's (found there at run time by scripts/gpu-check.sh).
BASE='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libgcc_s\.so\.1|libstdc\+\+\.so\.6)$'
CUDA='^(libcuda\.so\.1|libcudart\.so\.[0-9]+|libcublas\.so\.[0-9]+|libcublasLt\.so\.[0-9]+|libnccl\.so\.[0-9]+|libcudnn[a-z_]*\.so\.[0-9]+)$'
# Open MPI plugins for fabrics a one-GPU machine does not have (their libraries are not bundled)
SKIP_PLUGIN='^(libfabric|libefa|libibverbs|librdmacm|libpsm|libinfinipath|libuc[pmst]|libmca_common_(ucx|ofi|verbs)|liboshmem|libnl-)'

# ---- build -------------------------------------------------------------------------------
if [ ! -f Makefile ]; then
  say "configuring in-tree with CUDA"
  autoreconf -fi >/dev/null
  ./configure --with-cuda >/dev/null
fi
grep -q '^#define DT_HAVE_CUDA 1' dt_build.h || die "this tree is configured without CUDA (./configure --with-cuda)"
make -j2 dtrain tests/gpu_parity tests/gpu_nccl >/dev/null
[ -f data/austen_train_000000.bin ] || DTRAIN=./dtrain bash scripts/get-data.sh data >/dev/null

# ---- gather ------------------------------------------------------------------------------
mpilib=$(dirname "$(ldd dtrain | awk '$1 == "libmpi.so.40" {print $3}')")
ompi_plugins=$(ls -d /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 2>/dev/null || true)
pmix_plugins=$(ls -d /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix 2>/dev/null || true)
[ -n "$ompi_plugins" ] || die "Open MPI's plugin folder not found (Debian's libopenmpi3 layout expected)"
rm -rf "$out" "$out.tar.xz"
mkdir -p "$out"/{bin,lib/openmpi3,lib/pmix,share/openmpi,data,inputs,configs}
for b in dtrain tests/gpu_parity tests/gpu_nccl; do
  cp "$b" "$out/bin/"
  strip "$out/bin/$(basename "$b")"
done
# mpirun is Open MPI's orterun (a symlink through /etc/alternatives); single-node launches fork the
# ranks themselves (plugin odls_default), so orted stays behind
orterun=$(readlink -f "$(command -v mpirun || true)")
[ "$(basename "$orterun")" = orterun ] || die "mpirun is not Open MPI's orterun (found '$orterun')"
cp "$orterun" "$out/bin/mpirun"
strip "$out/bin/mpirun"
objs=("$out"/bin/*)
for p in "$ompi_plugins"/*.so; do
  deps=$(ldd "$p" 2>&1) || die "ldd $p failed: $deps"
  # names only: the load addresses are random hex and once in a while spell "efa"
  if grep -q 'not found' <<< "$deps" || awk '{print $1}' <<< "$deps" | grep -Eq "$SKIP_PLUGIN"; then continue; fi
  cp "$p" "$out/lib/openmpi3/"
  objs+=("$out/lib/openmpi3/$(basename "$p")")
done
# what a singleton rank and its checkpoints cannot do without (a missing one fails only at run time),
# and what mpirun needs to start ranks on its own node
for need in state_app ess_singleton io_ompio fs_ufs fbtl_posix fcoll_vulcan sharedfp_lockedfile \
  ess_hnp state_hnp plm_rsh odls_default errmgr_default_hnp iof_hnp rmaps_round_robin ras_simulator schizo_ompi \
  oob_tcp rml_oob routed_direct grpcomm_direct filem_raw pmix_ext3x btl_vader btl_tcp; do
  [ -f "$out/lib/openmpi3/mca_$need.so" ] || die "Open MPI plugin mca_$need.so was not bundled"
done
if [ -n "$pmix_plugins" ]; then
  cp "$pmix_plugins"/*.so "$out/lib/pmix/"
  objs+=("$out"/lib/pmix/*.so)
fi
# every library those objects load (transitively: ldd lists the whole closure), minus the base
# system's and CUDA's
ldd "${objs[@]}" 2>/dev/null | awk 'NF >= 3 && $2 == "=>" {print $1, $3}' | sort -u |
  while read -r name path; do
    if echo "$name" | grep -Eq "$BASE|$CUDA"; then continue; fi
    [ -f "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done
cp /usr/share/openmpi/help-*.txt "$out/share/openmpi/" 2>/dev/null || true
cp data/austen_train_000000.bin data/austen_val_000000.bin "$out/data/"
# the image classifiers' real data: the first 2048 training and 500 test images of Debian's
# Fashion-MNIST as IDX files (the header's count cut to match), ~2 MiB
fm=/usr/share/datasets/fashion-mnist
[ -f $fm/train-images-idx3-ubyte.gz ] || die "$fm is missing: scripts/install-deps.sh --test installs dataset-fashion-mnist"
/usr/bin/python3 scripts/fmnist_subset.py $fm "$out/data/fmnist" 2048 500
cp inputs/*.ini "$out/inputs/"
cp tests/small.ini "$out/configs/small.ini"
cp validation/small.ini "$out/configs/validation_small.ini"
cat > "$out/env.sh" <<'EOF'
# Source this to run the bundle's programs: its libraries first, Open MPI's plugins and help
# files from the bundle, a singleton rank that starts no daemon. CUDA's libraries come from the
# machine (scripts/gpu-check.sh adds their folders after the bundle's).
b=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export DTRAIN_BUNDLE=$b
export LD_LIBRARY_PATH="$b/lib${DTRAIN_CUDA_LIBS:+:$DTRAIN_CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_MCA_mca_base_component_path="$b/lib/openmpi3"
export PMIX_MCA_mca_base_component_path="$b/lib/pmix"
export OPAL_PKGDATADIR="$b/share/openmpi"
export OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp
export PMIX_MCA_psec=native
export PATH="$b/bin:$PATH"
EOF
git rev-parse HEAD > "$out/COMMIT"
git status --porcelain --untracked-files=no | grep -q . && echo "(plus uncommitted changes)" >> "$out/COMMIT"

# ---- check: every library resolves from the bundle plus the base system ------------------
unresolved=$(env -i LD_LIBRARY_PATH="$out/lib" ldd "${objs[@]}" 2>&1 | grep 'not found' |
  awk '{print $1}' | grep -Ev "$CUDA" | sort -u || true)
[ -z "$unresolved" ] || die "not in the bundle: $unresolved"
outside=$(env -i LD_LIBRARY_PATH="$out/lib" ldd "${objs[@]}" 2>/dev/null | awk 'NF >= 3 && $2 == "=>" {print $1, $3}' |
  grep -v " $out/lib/" | awk '{print $1}' | sort -u | grep -Ev "$BASE|$CUDA" || true)
[ -z "$outside" ] || die "resolved outside the bundle and the base list: $outside"
vers=$(objdump -T "${objs[@]}" "$out"/lib/*.so* 2>/dev/null | grep -o 'GLIBC[XX]*_[0-9.]*' | sort -uV || true)
say "needs from the machine: glibc >= $(echo "$vers" | grep '^GLIBC_' | tail -1 | cut -d_ -f2), libstdc++ and libgcc_s,\
 CUDA's libcudart, libcublas, libcublasLt (13) and libnccl (2)"

# the bundled dtrain, CPU backend, nothing from this machine's library path or MPI environment
cd "$out"
set +e
env -i HOME=/tmp PATH=/usr/bin:/bin bash -c "source ./env.sh; export LD_LIBRARY_PATH=$out/lib;
  dtrain --version && dtrain inputs/tiny.ini system.backend=cpu train.steps=2 train.threads=1 train.micro_batch=2 \
    model.seq_len=64 data.train='data/austen_train_*.bin' data.val= log.every=1 checkpoint.dir=/tmp/gpu-bundle-ckpt.$$ \
    checkpoint.resume=never" > check.log 2>&1
rc=$?
set -e
rm -rf "/tmp/gpu-bundle-ckpt.$$"
cd "$top"
grep -q '^ *2 ' "$out/check.log" && [ $rc -eq 0 ] || { cat "$out/check.log"; die "the bundled dtrain did not train 2 steps under env -i (exit $rc)"; }
say "the bundled dtrain trained 2 steps on the CPU under env -i with only the bundle's library path"
# the bundled mpirun: 2 ranks (dp = 2) of the bundled dtrain, as gpu-check.sh's parallel stage starts them
cd "$out"
set +e
env -i HOME=/tmp PATH=/usr/bin:/bin bash -c "source ./env.sh; export LD_LIBRARY_PATH=$out/lib;
  mpirun --oversubscribe --bind-to none -n 2 -x OMP_NUM_THREADS=1 dtrain configs/small.ini system.backend=cpu \
    train.steps=2 log.every=1 data.train='data/austen_train_*.bin' data.val= checkpoint.dir= checkpoint.resume=never" \
  > check_mpirun.log 2>&1
rc=$?
set -e
cd "$top"
grep -q '^# layout: 2 ranks on 1 node, mesh dp=2' "$out/check_mpirun.log" && grep -q '^ *2 ' "$out/check_mpirun.log" &&
  [ $rc -eq 0 ] || { cat "$out/check_mpirun.log"; die "the bundled mpirun did not train 2 steps with 2 ranks under env -i (exit $rc)"; }
say "the bundled mpirun started 2 ranks of the bundled dtrain (dp = 2) that trained 2 steps under env -i"

XZ_OPT="-T0 -3" tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
mib=$(du -m "$out.tar.xz" | cut -f1)
[ "$mib" -lt 60 ] || die "$out.tar.xz is $mib MiB: over the 60 MiB a device call may carry beside the tree"
say "$out: $(du -sm "$out" | cut -f1) MiB in $(find "$out" -type f | wc -l) files (35 of them OpenBLAS's kernels for every x86 CPU); $out.tar.xz, what travels: $mib MiB"
