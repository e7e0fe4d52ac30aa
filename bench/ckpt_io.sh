#!/usr/bin/env bash
# Checkpoint I/O benchmark: write and read time of a GPT-2 124M checkpoint with AdamW state
# (~1.5 GB) from 1, 2 and 4 ranks, next to dd writing the same number of bytes to the same disk
# in the same run. Prints a table; a benchmark, not a test.
#   usage: bench/ckpt_io.sh [DIR] [REPEATS]     (run from a build tree with ./dtrain and data/)
set -euo pipefail
DIR=${1:-$(mktemp -d /tmp/dtrain-ckptio.XXXXXX)}
REP=${2:-3}
SRC=$(cd "$(dirname "$0")/.." && pwd)
D=${DTRAIN:-./dtrain}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mkdir -p "$DIR"
args=(train.steps=0 train.micro_batch=1 train.global_batch=0 train.grad_accum=1 "data.train=data/austen_train_*.bin"
      data.val= log.metrics= checkpoint.keep=1)
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "# checkpoint I/O, GPT-2 124M + AdamW moments, dir $DIR ($(df -h "$DIR" | awk 'NR==2{print $1}')), medians of $REP"
printf "# %-6s %10s %10s %10s %10s %12s\n" ranks bytes write_s read_s write_GB/s dd_GB/s
for n in 1 2 4; do
  w=(); r=(); dd_t=()
  for i in $(seq 1 "$REP"); do
    rm -rf "$DIR/c$n"
    out=$(mpirun --oversubscribe --bind-to none -n "$n" "$D" "$SRC/inputs/gpt2.ini" "${args[@]}" checkpoint.dir="$DIR/c$n" checkpoint.resume=never)
    w+=("$(echo "$out" | sed -n 's/^# checkpoint: .*(step 0, \([0-9.]*\) s)$/\1/p')")
    f=$(ls "$DIR/c$n"/ckpt_*.h5)
    sync
    out=$(mpirun --oversubscribe --bind-to none -n "$n" "$D" "$SRC/inputs/gpt2.ini" "${args[@]}" checkpoint.dir="$DIR/c$n" checkpoint.resume="$f")
    r+=("$(echo "$out" | sed -n 's/^# resume: .*read in \([0-9.]*\) s)$/\1/p')")
    bytes=$(stat -c %s "$f")
    t0=$(date +%s.%N)
    dd if=/dev/zero of="$DIR/dd.bin" bs=16M count=$(( (bytes + 16777215) / 16777216 )) conv=fsync status=none
    t1=$(date +%s.%N)
    dd_t+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')")
    rm -f "$DIR/dd.bin"
  done
  ws=$(printf '%s\n' "${w[@]}" | median); rs=$(printf '%s\n' "${r[@]}" | median); ds=$(printf '%s\n' "${dd_t[@]}" | median)
  awk -v n="$n" -v b="$bytes" -v w="$ws" -v r="$rs" -v d="$ds" \
    'BEGIN{printf "  %-6d %10d %10.2f %10.2f %10.2f %12.2f\n", n, b, w, r, b / w / 1e9, b / d / 1e9}'
done
echo "# write_s: dtrain's collective HDF5 write incl. checksums, fsync, rename, directory fsync (its own timer);"
echo "# read_s: open, checksum verification and load (page cache warm: the file was just written)."
echo "# dd: dd if=/dev/zero bs=16M conv=fsync of the same number of bytes to the same directory."
