#!/usr/bin/env bash
# ZeRO step-time benchmark (issue #7): GPT-2 124M (inputs/gpt2.ini) at dp=2 on the CPU backend,
# 1 thread per rank, B=1, T=64, the same run for zero = 0, 1, 2, 3; prints the median step time
# over steps 2..N, rank 0's peak RSS, and for zero=3 the share of block all-gather time hidden
# behind compute (dtrain's own "# zero3:" line). PRECISION=bf16 (or fp16) trains in that precision
# (ZeRO-3 then gathers the working copy). A benchmark, not a test.
#   usage: [PRECISION=fp32] bench/zero_step.sh [STEPS] [RANKS]   (run from a build tree with ./dtrain and data/)
set -euo pipefail
STEPS=${1:-6}
N=${2:-2}
PREC=${PRECISION:-fp32}
SRC=$(cd "$(dirname "$0")/.." && pwd)
D=${DTRAIN:-./dtrain}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
t=$(mktemp -d /tmp/dtrain-zstep.XXXXXX)
trap 'rm -rf "$t"' EXIT
echo "# zero step time: GPT-2 124M, $PREC, dp=$N, B=1 T=64, 1 thread/rank, $STEPS steps (median of 2..$STEPS); $(getconf _NPROCESSORS_ONLN) cores; $(${MPIRUN:-mpirun} --version | head -1); own AVX-512 sgemm unless DT_GEMM says otherwise"
printf "# %-5s %10s %12s  %s\n" zero ms/step peak_MiB note
for z in 0 1 2 3; do
  ${MPIRUN:-mpirun} --oversubscribe --bind-to none -n "$N" "$D" "$SRC/inputs/gpt2.ini" system.backend=cpu train.threads=1 \
    parallel.zero=$z train.precision="$PREC" train.micro_batch=1 train.global_batch=0 train.grad_accum=1 model.seq_len=64 train.steps="$STEPS" \
    train.eval_every=0 "data.train=data/austen_train_*.bin" data.val= log.metrics="$t/z$z.jsonl" checkpoint.dir="$t/ck$z" \
    checkpoint.resume=never > "$t/z$z.out" 2>&1
  ms=$(python3 -c "import json,statistics as s; r=[json.loads(l)['ms'] for l in open('$t/z$z.jsonl')][1:]; print(round(s.median(r)))")
  rss=$(sed -n 's/^# memory: rank 0 peak RSS (VmHWM) \([0-9.]*\) MiB.*/\1/p' "$t/z$z.out")
  note=$(sed -n 's/^# zero3: //p; s/^# ddp: \([0-9]* buckets\).*: \(-\?[0-9]*% +- [0-9]*\) of the all-reduce hidden.*/\1, \2 of the all-reduce hidden/p' "$t/z$z.out")
  printf "  %-5s %10s %12s  %s\n" "$z" "$ms" "$rss" "$note"
done
