#!/usr/bin/env bash
# A rank's memory does not grow with the number of steps when it runs more OpenMP threads than
# cores. The own AVX-512 sgemm kept a packing buffer per thread, and libgomp ends a team's surplus
# workers whenever a smaller team starts (the sgemm asked for fewer threads on small products) and
# starts new ones at the next full-size region: every new worker allocated its own buffer and none
# was freed. Measured before the fix with inputs/tiny.ini at train.threads=16 on 2 cores: peak RSS
# 497 MiB after 5 steps, 1203 MiB after 40 (about 20 MiB per step; 2.5 GB after 50 steps on the
# 16-core host of a GPU run; tests/small.ini's products are too small to start a team at all).
# Here: inputs/tiny.ini at 16 threads, the peak RSS (the run's own `# memory:` line) after 4 and
# after 24 steps within 16 MiB of each other.
source "$top_srcdir/tests/lib.sh"
begin_test
ensure_data
cd "$top_builddir"
for n in 4 24; do
  mpi 1 "$DTRAIN" "$top_srcdir/inputs/tiny.ini" system.backend=cpu train.threads=16 train.steps=$n train.eval_every=0 \
    log.every=$n checkpoint.dir= data.val= > "$t/s$n.out"
  grep '^# memory: rank 0 peak RSS' "$t/s$n.out" | cut -c1-60
done
rss() { sed -n 's/^# memory: rank 0 peak RSS (VmHWM) \([0-9.]*\) MiB.*/\1/p' "$t/s$1.out"; }
a=$(rss 4) b=$(rss 24)
[ -n "$a" ] && [ -n "$b" ] || { echo "FAIL: no memory line"; exit 1; }
awk -v a="$a" -v b="$b" 'BEGIN { d = b - a; printf "peak RSS after 4 steps %.1f MiB, after 24 %.1f MiB: %+.1f MiB\n", a, b, d; exit !(d < 16) }' ||
  { echo "FAIL: memory grew with the steps"; exit 1; }
