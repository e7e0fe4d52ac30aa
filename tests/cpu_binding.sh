#!/usr/bin/env bash
# Ranks use the CPUs they were given (src/parallel/cpuset.c, issue #27):
#  1. mpirun --bind-to core -n 1 with train.threads=2: one warning line names rank 0, its mask
#     and the mpirun flag that fixes it; the run still trains;
#  2. the same launch with train.threads=0 (no OMP_NUM_THREADS): 1 thread, "threads from cpus",
#     no warning;
#  3. taskset -c 0 (no launcher) with threads=2: the warning names both launchers' flags;
#  4. 2 unbound ranks on this host with threads = all CPUs: the host warning (ranks x threads);
#     with threads=0 each rank takes its share, CPUs / 2, and nothing is said.
source "$top_srcdir/tests/lib.sh"
begin_test
unset OMP_NUM_THREADS OMP_PROC_BIND OMP_PLACES GOMP_CPU_AFFINITY SLURM_CPUS_PER_TASK
ncpu=$(nproc)
one="train.steps=1 log.every=1 checkpoint.dir=$t/ck"
fail() { echo "FAIL: $*"; exit 1; }
has() { grep -qF -- "$2" "$1" || { cat "$1"; fail "expected '$2' in $1"; }; }
hasnt() { ! grep -qF -- "$2" "$1" || { cat "$1"; fail "did not expect '$2' in $1"; }; }

run "$MPIRUN" --bind-to core -n 1 "$DTRAIN" "$cfg" $one train.threads=2 > "$t/1.out" 2>&1 || { cat "$t/1.out"; fail "bound run"; }
has "$t/1.out" "warning: rank 0 (host $(hostname)) runs 2 threads on 1 CPU (mask "
has "$t/1.out" "mpirun --bind-to none or --map-by slot:PE=2"
has "$t/1.out" "set train.threads=1"
has "$t/1.out" "threads from config"
[ "$(grep -c 'warning: ' "$t/1.out")" -eq 1 ] || fail "more than one warning line"
grep -q '^ *1 ' "$t/1.out" || { cat "$t/1.out"; fail "no step row"; }

run "$MPIRUN" --bind-to core -n 1 "$DTRAIN" "$cfg" $one train.threads=0 > "$t/2.out" 2>&1 || { cat "$t/2.out"; fail "bound run, threads=0"; }
has "$t/2.out" "threads from cpus"
has "$t/2.out" "backend: cpu, 1 threads per rank"
hasnt "$t/2.out" "warning: "

run taskset -c 0 "$DTRAIN" "$cfg" $one train.threads=2 > "$t/3.out" 2>&1 || { cat "$t/3.out"; fail "taskset run"; }
has "$t/3.out" "runs 2 threads on 1 CPU (mask 0)"
has "$t/3.out" "srun --cpus-per-task=2"

if [ "$ncpu" -ge 2 ]; then
  run "$MPIRUN" --oversubscribe --bind-to none -n 2 "$DTRAIN" "$cfg" $one train.micro_batch=2 train.threads="$ncpu" \
    > "$t/4.out" 2>&1 || { cat "$t/4.out"; fail "2 unbound ranks"; }
  has "$t/4.out" "runs 2 ranks x $ncpu threads on $ncpu CPUs"
  [ "$(grep -c 'warning: ' "$t/4.out")" -eq 1 ] || fail "one warning per host expected"
  run "$MPIRUN" --oversubscribe --bind-to none -n 2 "$DTRAIN" "$cfg" $one train.micro_batch=2 train.threads=0 \
    > "$t/5.out" 2>&1 || { cat "$t/5.out"; fail "2 unbound ranks, threads=0"; }
  has "$t/5.out" "backend: cpu, $((ncpu / 2)) threads per rank"
  hasnt "$t/5.out" "warning: "
fi
echo "cpu_binding: OK"
