# Shared helpers for the shell tests (sourced). Every test prints the commands it runs.
set -euo pipefail
: "${top_srcdir:?run through make check}" "${top_builddir:?run through make check}"
DTRAIN="$top_builddir/dtrain"
PY="${REF_PYTHON:-/usr/bin/python3}"
MPIRUN="${MPIRUN:-mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Quiet Open MPI's "no high-performance transport" chatter and keep runs deterministic.
export OMPI_MCA_btl_base_warn_component_unused=0
DATA="$top_builddir/data"

# Run a command, echoing it first.
run() {
  echo "+ $*" >&2
  "$@"
}

# Make the bundled Austen shards once per build tree.
ensure_data() {
  if ! ls "$DATA"/austen_train_*.bin >/dev/null 2>&1; then
    DTRAIN="$DTRAIN" run bash "$top_srcdir/scripts/get-data.sh" "$DATA"
  fi
}

# mpirun with n ranks, 1 thread each.
mpi() {
  local n=$1
  shift
  run "$MPIRUN" --oversubscribe --bind-to none -n "$n" -x OMP_NUM_THREADS=1 "$@"
}

tmpdir() {
  local d
  d=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-test.XXXXXX")
  echo "$d"
}
