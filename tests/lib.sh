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
# PMIx's munge security plugin retries a munged that is not running for ~2.3 s in every mpirun and
# every singleton start (strace: connect to /run/munge/munge.socket.2 refused, 0.05-0.45 s apart);
# hundreds of launches in the suite. mpirun's own PMIx server and its ranks agree on the native
# plugin; start_slurm_cluster drops this again, so srun and sbatch use Slurm's choice.
export PMIX_MCA_psec=native
DATA="$top_builddir/data"

# Run a command, echoing it first.
run() {
  echo "+ $*" >&2
  "$@"
}

# Make the bundled Austen shards (byte-level and GPT-2) and GPT-2's vocabulary once per build tree.
# Under an exclusive lock, so tests that make -j runs side by side make it once.
ensure_data() {
  mkdir -p "$DATA"
  (
    flock 9
    if ! ls "$DATA"/austen_train_*.bin "$DATA"/austen_gpt2_train_*.bin "$DATA"/gpt2/vocab.bpe >/dev/null 2>&1; then
      DTRAIN="$DTRAIN" run bash "$top_srcdir/scripts/get-data.sh" "$DATA"
    fi
  ) 9> "$DATA/.lock"
}

# mpirun with n ranks, 1 thread each.
mpi() {
  local n=$1
  shift
  run "$MPIRUN" --oversubscribe --bind-to none -n "$n" -x OMP_NUM_THREADS=1 "$@"
}

# srun_once_more OUT CMD...: run CMD (an srun launch) with its output in OUT. When it fails
# because a rank called address 0 and Open MPI's handler found no frame above libc's signal
# frame, run it once more (the first output is kept as OUT.first). That is how Debian's Open MPI
# 4.1.4 sometimes dies inside MPI_Init under srun --mpi=pmix with virtual nodes on one host
# (btl=self,tcp): a core showed mca_btl_tcp calling a not yet registered PML callback (tag 0x41)
# from opal_progress in ompi_mpi_init, in 8 of ~260 back-to-back 8-rank launches. A dtrain bug
# that calls address 0 would fail the second launch as well.
srun_once_more() {
  local out=$1
  shift
  "$@" > "$out" 2>&1 && return 0
  startup_crash "$out" || return 1
  echo "note: a rank called address 0 with no caller frame (Open MPI startup race, tests/lib.sh); launching once more"
  mv "$out" "$out.first"
  "$@" > "$out" 2>&1
}

# startup_crash FILE: FILE shows that start-up race (srun_once_more): a rank called address 0 and
# the handler found no frame above libc's. The sbatch template launches once more itself when
# DTRAIN_RETRY_STARTUP=1 (start_slurm_cluster sets it).
startup_crash() { grep -q 'Failing at address: (nil)' "$1" && ! grep -q '\[ 1\] ' "$1"; }

# sbatch_wait SECONDS SBATCH_ARGS...: submit a batch job, print its id, wait for it by polling
# the controller every 0.2 s (`sbatch --wait` polls at growing intervals: a 42 s job took 75 s)
# and return 0 when it COMPLETED with exit code 0; after SECONDS it is cancelled (return 124).
sbatch_wait() {
  local limit=$1 job s i
  shift
  job=$(sbatch --parsable "$@") || return 1
  job=${job%%;*}
  echo "$job"
  for ((i = 0; i < limit * 5; i++)); do
    s=$(scontrol -o show job "$job" 2>/dev/null | grep -oE 'JobState=[A-Z_]+ .* ExitCode=[0-9]+:[0-9]+')
    case "$s" in *=PENDING* | *=CONFIGURING* | *=RUNNING* | *=COMPLETING* | "") sleep 0.2 ;; *) break ;; esac
  done
  case "$s" in
    JobState=COMPLETED*ExitCode=0:0) return 0 ;;
    "" | *=PENDING* | *=CONFIGURING* | *=RUNNING* | *=COMPLETING*) scancel "$job"; echo "sbatch_wait: job $job still '$s' after $limit s" >&2; return 124 ;;
    *) echo "sbatch_wait: job $job ended ${s%% *} ${s##* }" >&2; return 1 ;;
  esac
}

# The Slurm tests' start: a throw-away 2-node cluster (scripts/slurm-cluster.sh) in a fresh
# directory DIR=/tmp/PREFIX.XXXXXX, its environment (SLURM_CONF, ...) set here, and TCP over
# loopback between the virtual nodes for Open MPI. A loaded machine can miss slurm-cluster.sh's
# start-up window: one more try, in a new DIR and so on other ports (once in CI node n1 stayed
# unk* in both tries with the same DIR and ports). Returns 1 when it did not start. The caller
# stops it: "$CLUSTER" stop "$DIR".
start_slurm_cluster() {
  local line
  CLUSTER="$top_srcdir/scripts/slurm-cluster.sh"
  unset PMIX_MCA_psec
  DIR=$(mktemp -d "/tmp/$1.XXXXXX")
  echo "\$ $CLUSTER start $DIR 2"
  line=$("$CLUSTER" start "$DIR" 2) ||
    { "$CLUSTER" stop "$DIR"; rm -rf "$DIR"; DIR=$(mktemp -d "/tmp/$1.XXXXXX"); sleep 2; line=$("$CLUSTER" start "$DIR" 2); } ||
    { tail -20 "$DIR"/log/slurmctld.log; return 1; }
  eval "$line"
  # virtual nodes share one host: TCP over loopback between them; ranks on 2 cores must yield
  export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_mpi_yield_when_idle=1
  # and the start-up race (srun_once_more) retried inside sbatch/ddp_4node.sh
  export DTRAIN_RETRY_STARTUP=1
}

# The start of a test of a whole suite on a throw-away Slurm cluster (validation.sh, reframe.sh):
# the launch variables of an enclosing job cleared, so the test's own srun and salloc see only its
# cluster; errors checked by the caller from here on (set +e); the data made; the cluster started
# (start_slurm_cluster PREFIX, its DIR removed on exit). Returns 1 when the cluster did not start.
begin_slurm_test() {
  local v
  for v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\|PMIX_[A-Za-z0-9_]*\|OMPI_COMM_WORLD_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
  unset CUDA_VISIBLE_DEVICES RANK WORLD_SIZE LOCAL_RANK DTRAIN_FAULT
  export PATH=$PATH:/usr/sbin
  set +e
  ensure_data
  DIR=
  trap 'if [ -n "$DIR" ]; then "$CLUSTER" stop "$DIR" 2>/dev/null; rm -rf "$DIR"; fi' EXIT
  start_slurm_cluster "$1"
}

tmpdir() {
  local d
  d=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-test.XXXXXX")
  echo "$d"
}

# The common start of a training test: the data made, a fresh work directory $t removed on exit,
# the build tree as working directory and $cfg the small test model.
begin_test() {
  ensure_data
  t=$(tmpdir)
  trap 'rm -rf "$t"' EXIT
  cd "$top_builddir" || exit 1
  cfg="$top_srcdir/tests/small.ini"
}

# Debian's dataset-fashion-mnist (the image classifiers' tests): sets F to its folder, or fails.
need_fmnist() {
  F=/usr/share/datasets/fashion-mnist
  [ -f "$F/train-images-idx3-ubyte.gz" ] ||
    { echo "FAIL: $F is missing: scripts/install-deps.sh --test installs dataset-fashion-mnist"; exit 1; }
}

# fmnist_test_head N PREFIX: the first N Fashion-MNIST test images and labels as IDX files
# PREFIX-images and PREFIX-labels (after need_fmnist).
fmnist_test_head() {
  "$PY" - "$F" "$1" "$2" <<'PY'
import gzip, struct, sys
f, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
img, lab = gzip.open(f"{f}/t10k-images-idx3-ubyte.gz").read(), gzip.open(f"{f}/t10k-labels-idx1-ubyte.gz").read()
open(f"{out}-images", "wb").write(img[:4] + struct.pack(">I", n) + img[8:16] + img[16:16 + n * 784])
open(f"{out}-labels", "wb").write(lab[:4] + struct.pack(">I", n) + lab[8:8 + n])
PY
}

# The 10 factorisations of 8 ranks as words "dp,tp,pp,B", B the micro-batch that keeps the global
# batch at 4 sequences (1 below dp = 4): the hybrid-mesh tests' layouts.
mesh8_layouts() {
  local dp tp
  for dp in 8 4 2 1; do
    for tp in 1 2 4 8; do
      [ $((dp * tp)) -le 8 ] && [ $((8 % (dp * tp))) -eq 0 ] || continue
      echo "$dp,$tp,$((8 / dp / tp)),$((dp <= 4 ? 4 / dp : 1))"
    done
  done
}

# eval_agree DIR KEY CKPT CONFIG [keys...]: `dtrain eval` of checkpoint CKPT on 4 validation batches
# at parallel.KEY = 1, 2 and 4 ranks must give the same loss within 1e-5 relative (each layout
# reads its own shard or stage of the global tensors). Scratch files go to DIR.
eval_agree() {
  local dir=$1 key=$2 ck=$3 n
  shift 3
  for n in 1 2 4; do
    mpi "$n" "$DTRAIN" eval "$@" parallel.$key=$n --checkpoint "$ck" --data "$DATA/austen_val_*.bin" \
      --batches 4 2> /dev/null | tail -1 | tee "$dir/eval$n.txt"
  done
  "$PY" - "$dir" "$key" <<'PY'
import sys
d, key = sys.argv[1], sys.argv[2]
l = [float(open(f"{d}/eval{n}.txt").read().split()[-1]) for n in (1, 2, 4)]
w = max(abs(x - l[0]) / l[0] for x in l)
assert w <= 1e-5, f"eval losses at {key}=1,2,4 {l} differ by {w:.2e}"
print(f"dtrain eval at {key}=1,2,4: {l} agree within {w:.2e} (limit 1e-5)")
PY
}
