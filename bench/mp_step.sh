#!/usr/bin/env bash
# Model-parallel step-time benchmark (issue #6): GPT-2 124M (inputs/gpt2.ini) on the CPU backend,
# 2 ranks with 1 thread each, the same global batch (GLOBAL sequences of T tokens) at (dp, tp, pp)
# = (2,1,1), (1,2,1) and (1,1,2) (stages balanced by parameters, and by compute: 1,1,2c), micro_batch 1; prints the median step time over steps 2..N, rank
# 0's peak RSS, and for pp = 2 dtrain's own "# pp:" lines: the measured bubble against 1F1B's
# prediction for equal stages and for the stages' measured compute times. A benchmark, not a test.
#   usage: bench/mp_step.sh [STEPS] [GLOBAL] [T]   (run from a build tree with ./dtrain and data/)
set -euo pipefail
STEPS=${1:-5}
G=${2:-8}
T=${3:-128}
SRC=$(cd "$(dirname "$0")/.." && pwd)
D=${DTRAIN:-./dtrain}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
t=$(mktemp -d /tmp/dtrain-mpstep.XXXXXX)
trap 'rm -rf "$t"' EXIT
echo "# model-parallel step time: GPT-2 124M, 2 ranks x 1 thread, global batch $G x T=$T, micro_batch 1, $STEPS steps (median of 2..$STEPS); $(getconf _NPROCESSORS_ONLN) cores; $(${MPIRUN:-mpirun} --version | head -1); own AVX-512 sgemm unless DT_GEMM says otherwise"
printf "# %-9s %10s %12s\n" "dp,tp,pp" ms/step peak_MiB
for l in 2,1,1 1,2,1 1,1,2 1,1,2c; do
  IFS=, read -r dp tp pp <<< "$l"
  bal=params
  case $pp in *c) pp=${pp%c} bal=compute ;; esac
  ${MPIRUN:-mpirun} --oversubscribe --bind-to none -n 2 "$D" "$SRC/inputs/gpt2.ini" system.backend=cpu train.threads=1 \
    parallel.tp=$tp parallel.pp=$pp parallel.pp_balance=$bal train.micro_batch=1 train.global_batch="$G" model.seq_len="$T" train.steps="$STEPS" \
    train.eval_every=0 "data.train=data/austen_train_*.bin" data.val= log.metrics="$t/$dp$tp$pp$bal.jsonl" \
    checkpoint.dir="$t/ck" checkpoint.resume=never checkpoint.keep=1 > "$t/$dp$tp$pp$bal.out" 2>&1
  ms=$(python3 -c "import json,statistics as s; r=[json.loads(l)['ms'] for l in open('$t/$dp$tp$pp$bal.jsonl')][1:]; print(round(s.median(r)))")
  rss=$(sed -n 's/^# memory: rank 0 peak RSS (VmHWM) \([0-9.]*\) MiB.*/\1/p' "$t/$dp$tp$pp$bal.out")
  printf "  %-9s %10s %12s\n" "$l" "$ms" "$rss"
  grep '^# plan: pipeline stages\|^# pp:' "$t/$dp$tp$pp$bal.out" | grep -v 'bitwise' | sed 's/^/    /' || true
done
