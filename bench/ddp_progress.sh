#!/usr/bin/env bash
# Issue #27: what makes MPI's nonblocking gradient all-reduces progress during backward, measured.
# Open MPI moves a nonblocking collective forward only inside MPI calls (no asynchronous progress
# over shared memory or TCP). dtrain's answer is its backward hook: between layers it starts the
# buckets that became final and tests the ones in flight (src/parallel/ddp.c). The alternatives the
# issue names: a progress thread (here Open MPI's own for its TCP transport, btl_tcp_progress_thread,
# which needs no code of ours) and MPI-4 persistent collectives (Open MPI 4.1 has them only as
# MPIX_ extensions; they make no more progress than the nonblocking ones). GPT-2 124M at T = 64,
# global batch 4, dp = 2 x 1 thread, parallel.ddp_comm = mpi, alternating for ROUNDS rounds, each
# run's median ms/step after WARMUP steps:
#   hook        dtrain's default: the hook starts and tests (probe steps off: parallel.ddp_probe = 0)
#   hook+thread the same with Open MPI's TCP progress thread on
#   after       every all-reduce after backward (parallel.ddp_probe = 1): nothing overlaps
# all over Open MPI's TCP transport (OMPI_MCA_btl=tcp,self: what carries the all-reduce between
# nodes without a fabric; between nodes with one, MPI's own progress rules are the same), and
# `hook` once more over shared memory (vader: Open MPI's choice on one node) for reference. Prints
# the medians over the rounds, and each variant's step over `after`'s (below 1: overlap pays).
# Run from a build tree with ./dtrain and data/ on a quiet machine. A benchmark, not a test.
#   usage: bench/ddp_progress.sh [ROUNDS] [STEPS] [WARMUP] [T]     (defaults 3, 10, 2, 64)
set -euo pipefail
ROUNDS=${1:-3}
STEPS=${2:-10}
WARMUP=${3:-2}
T=${4:-64}
SRC=$(cd "$(dirname "$0")/.." && pwd)
D=${DTRAIN:-./dtrain}
PY=${REF_PYTHON:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
t=$(mktemp -d /tmp/dtrain-ddpprog.XXXXXX)
trap 'rm -rf "$t"' EXIT
echo "# ddp progress: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
  "$(${MPIRUN:-mpirun} --version | head -1); GPT-2 124M, T = $T, global batch 4, dp = 2 x 1 thread, MPI all-reduce;" \
  "rounds $ROUNDS, steps $STEPS (median after $WARMUP)"
run() { # TAG PROBE [ENV=VALUE ...]: median ms/step
  local tag=$1 probe=$2
  shift 2
  rm -rf "$t/$tag.jsonl"
  env "$@" ${MPIRUN:-mpirun} --oversubscribe --bind-to none -n 2 "$D" "$SRC/inputs/gpt2.ini" system.backend=cpu \
    train.threads=1 train.micro_batch=2 train.global_batch=4 model.seq_len="$T" parallel.ddp_comm=mpi \
    parallel.ddp_probe="$probe" train.steps=$((STEPS + WARMUP)) train.eval_every=0 "data.train=data/austen_train_*.bin" \
    data.val= log.metrics="$t/$tag.jsonl" checkpoint.dir= checkpoint.resume=never log.every=1 > "$t/$tag.out" 2>&1 ||
    { tail -5 "$t/$tag.out" >&2; exit 1; }
  "$PY" -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median(r["ms"] for r in rows if r["step"] > int(sys.argv[2])))' "$t/$tag.jsonl" "$WARMUP"
}
tcp=(OMPI_MCA_btl=tcp,self)
for r in $(seq "$ROUNDS"); do
  a=$(run hook 0 "${tcp[@]}") b=$(run thread 0 "${tcp[@]}" OMPI_MCA_btl_tcp_progress_thread=1)
  c=$(run after 1 "${tcp[@]}") s=$(run shm 0)
  echo "# round $r: ms/step over TCP: hook $a, hook+thread $b, after $c; over shared memory: hook $s"
  echo "$a $b $c $s" >> "$t/rounds"
done
"$PY" - "$t/rounds" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
a, b, c, s = (statistics.median(r[i] for r in rows) for i in range(4))
per = lambda i: ", ".join(f"{r[i] / r[2]:.3f}" for r in rows)
print(f"# summary: median ms/step over TCP: hook {a:.0f}, hook+thread {b:.0f}, after backward {c:.0f}; shared memory hook {s:.0f}")
print(f"# summary: step over after-backward's: hook {a / c:.3f} (rounds {per(0)}), hook+thread {b / c:.3f} (rounds {per(1)})")
PY
