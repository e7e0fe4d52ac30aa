#!/usr/bin/env bash
# Checkpoint I/O benchmark: write and read bandwidth of a GPT-2 124M checkpoint with AdamW state
# (~1.5 GB) from 1, 2 and 4 ranks, next to dd moving the same number of bytes on the same disk in
# the same run (interleaved: dd and dtrain alternate in every repetition). A benchmark, not a test.
#   usage: bench/ckpt_io.sh [DIR] [REPEATS] [RANKS...]   (run from a build tree with ./dtrain and data/)
#   e.g.   bench/ckpt_io.sh /tmp/ckptio 3 1 2 4
# Both sides are measured the same way (dd with O_DIRECT is printed too, as the device's own speed):
#   write: dd if=/dev/zero bs=16M conv=fsync (data on disk when dd exits) vs dtrain's own timer of
#          the committed save (collective HDF5 write with checksums, flush, fsync, rename, dir fsync).
#   read:  the file's pages are dropped from the page cache first (dd iflag=nocache count=0, i.e.
#          posix_fadvise DONTNEED on that file only; no root needed), then dd if=FILE bs=16M
#          of=/dev/null vs dtrain's timer of the load (open, checks, read, CRC32C verification,
#          transposes into the arenas, allgather between ranks).
#   start: the whole resuming dtrain (train.steps=0) as the shell sees it, mpirun to exit: launch,
#          model setup, the load above, exit; what a requeued job waits before its first step.
# CKPT_IO_PHASES=1 also prints dtrain's per-phase times (DTRAIN_CKPT_TIMES) to stderr; DTRAIN_CKPT_TWO_PHASE=1
# switches the MPI-IO layer from independent transfers under collective HDF5 calls (the default,
# H5FD_MPIO_INDIVIDUAL_IO) to two-phase collective buffering, for comparison.
set -euo pipefail
DIR=${1:-$(mktemp -d /tmp/dtrain-ckptio.XXXXXX)}
REP=${2:-3}
shift $(( $# > 2 ? 2 : $# ))
RANKS=${*:-1 2 4}
SRC=$(cd "$(dirname "$0")/.." && pwd)
D=${DTRAIN:-./dtrain}
MPIRUN=${MPIRUN:-mpirun}
# 4 ranks on 2 cores: idle ranks must yield instead of busy-polling the cores away.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
[ "${CKPT_IO_PHASES:-0}" = 1 ] && export DTRAIN_CKPT_TIMES=1
mkdir -p "$DIR"
args=(train.steps=0 train.micro_batch=1 train.global_batch=0 train.grad_accum=1 "data.train=data/austen_train_*.bin"
      data.val= log.metrics= checkpoint.keep=1 system.backend=cpu)
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{print b - a}'; }
drop() { dd if="$1" iflag=nocache count=0 status=none; } # evict this file's (clean) pages
cached() { command -v fincore >/dev/null && fincore -nb -o RES "$1" | awk '{print $1}' || echo "?"; }
dev=$(df -P "$DIR" | awk 'NR==2{print $1}')
fs=$(df -PT "$DIR" | awk 'NR==2{print $2}')
echo "# checkpoint I/O: GPT-2 124M + AdamW moments ($SRC/inputs/gpt2.ini), dir $DIR on $dev ($fs), $REP repetitions, medians"
echo "# $(getconf _NPROCESSORS_ONLN) cores; $($MPIRUN --version 2>/dev/null | head -1); OMPI_MCA_mpi_yield_when_idle=1"
printf "# %-5s %11s %9s %9s %8s %8s %9s %9s %8s %8s %8s\n" ranks bytes dd_w_MB/s w_MB/s w_s w/dd dd_r_MB/s r_MB/s r_s r/dd start_s
for n in $RANKS; do
  w=(); r=(); st=(); ddw=(); ddr=(); ddwd=(); ddrd=(); bytes=0; left=""
  for i in $(seq 1 "$REP"); do
    rm -rf "$DIR/c$n"
    out=$($MPIRUN --oversubscribe --bind-to none -n "$n" "$D" "$SRC/inputs/gpt2.ini" "${args[@]}" checkpoint.dir="$DIR/c$n" checkpoint.resume=never)
    w+=("$(echo "$out" | sed -n 's/^# checkpoint: .*(step 0, \([0-9.]*\) s)$/\1/p')")
    f=$(ls "$DIR/c$n"/ckpt_*.h5)
    bytes=$(stat -c %s "$f")
    t0=$(now) # dd write of the same size, fsync'd
    dd if=/dev/zero of="$DIR/dd.bin" bs=16M count=$(( (bytes + 16777215) / 16777216 )) conv=fsync status=none
    ddw+=("$(since "$t0")")
    drop "$DIR/dd.bin"
    left="$left $(cached "$DIR/dd.bin")"
    t0=$(now)
    dd if="$DIR/dd.bin" of=/dev/null bs=16M status=none
    ddr+=("$(since "$t0")")
    rm -f "$DIR/dd.bin"
    t0=$(now) # the same with O_DIRECT (the device without the page cache), for reference
    dd if=/dev/zero of="$DIR/dd.bin" bs=16M count=$(( (bytes + 16777215) / 16777216 )) oflag=direct conv=fsync status=none
    ddwd+=("$(since "$t0")")
    t0=$(now)
    dd if="$DIR/dd.bin" of=/dev/null bs=16M iflag=direct status=none
    ddrd+=("$(since "$t0")")
    rm -f "$DIR/dd.bin"
    drop "$f"
    left="$left $(cached "$f")"
    t0=$(now)
    out=$($MPIRUN --oversubscribe --bind-to none -n "$n" "$D" "$SRC/inputs/gpt2.ini" "${args[@]}" checkpoint.dir="$DIR/c$n" checkpoint.resume="$f")
    st+=("$(since "$t0")")
    r+=("$(echo "$out" | sed -n 's/^# resume: .*read in \([0-9.]*\) s)$/\1/p')")
  done
  ws=$(printf '%s\n' "${w[@]}" | median); rs=$(printf '%s\n' "${r[@]}" | median); ss=$(printf '%s\n' "${st[@]}" | median)
  dws=$(printf '%s\n' "${ddw[@]}" | median); drs=$(printf '%s\n' "${ddr[@]}" | median)
  dwds=$(printf '%s\n' "${ddwd[@]}" | median); drds=$(printf '%s\n' "${ddrd[@]}" | median)
  ddwb=$(( (bytes + 16777215) / 16777216 * 16777216 ))
  awk -v n="$n" -v b="$bytes" -v db="$ddwb" -v w="$ws" -v r="$rs" -v dw="$dws" -v dr="$drs" -v s="$ss" 'BEGIN{
    printf "  %-5d %11d %9.0f %9.0f %8.2f %7.0f%% %9.0f %9.0f %8.2f %7.0f%% %8.2f\n", n, b, db / dw / 1e6, b / w / 1e6, w,
      100 * (b / w) / (db / dw), db / dr / 1e6, b / r / 1e6, r, 100 * (b / r) / (db / dr), s}'
  echo "#   ($n ranks) write s: ${w[*]}; dd write s: ${ddw[*]}; read s: ${r[*]}; dd read s: ${ddr[*]}; bytes cached after the drop:$left"
  awk -v db="$ddwb" -v a="$dwds" -v b="$drds" 'BEGIN{printf "#   (reference) dd with O_DIRECT, same run: write %.0f MB/s, read %.0f MB/s (medians)\n", db / a / 1e6, db / b / 1e6}'
  echo "#   ($n ranks) dd O_DIRECT write s: ${ddwd[*]}; read s: ${ddrd[*]}"
done
echo "# w/dd, r/dd: dtrain's MB/s over dd's MB/s (goal >= 70%). dd writes the size rounded up to 16 MiB blocks"
echo "# (its MB/s uses its own byte count). Write times include fsync on both sides; reads start with the"
echo "# file's pages dropped on both sides ('bytes cached after the drop' should be 0)."
