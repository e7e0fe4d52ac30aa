#!/bin/sh
# Runs one of automake's test drivers and appends the test's wall time to its log, as the line
# "# elapsed: SECONDS s", so that whoever reads a CI log can see where the suite's time goes
# (.ci/run prints the slowest tests from these lines).
# With --alone LIST (the tests whose checks time something: deadlines, stalls, kills, throughput,
# the Slurm suites; Makefile.am's SERIAL_TESTS), `make -j2 check` stays safe: every test holds a
# lock on .dtrain-tests.lock in the build tree while it runs, shared by the others and exclusive
# for those, so they run with nothing beside them. The lock is the driver's own descriptor: the
# test and what it leaves running (a Slurm cluster's daemons) never hold it.
# The others, which may run beside another test, get OMP_WAIT_POLICY=PASSIVE unless it is set:
# OpenMP threads that wait sleep instead of spinning. Results are the same (the work is split the
# same way); with two tests of 2 OpenMP threads each on 2 cores the spinning took most of the CPU
# (cnn_precision.sh beside cnn_sync.sh: 152 and 140 s, passive 44 and 54 s; alone 31 s).
#   timed-driver.sh [--alone 'TEST ...'] DRIVER [DRIVER'S ARGUMENTS...]
alone=
if [ "$1" = --alone ]; then
  alone=$2
  shift 2
fi
driver=$1
shift
log=
name=
prev=
for a in "$@"; do
  [ "$prev" = --log-file ] && log=$a
  [ "$prev" = --test-name ] && name=$a
  prev=$a
done
mode=-s
case " $alone " in *" $name "*) mode=-x ;; esac
[ $mode = -s ] && [ -z "${OMP_WAIT_POLICY:-}" ] && export OMP_WAIT_POLICY=PASSIVE
exec 9> .dtrain-tests.lock
command -v flock > /dev/null && flock "$mode" 9
t0=$(date +%s.%N) # the test's own time, not its wait for the lock
"$driver" "$@" 9>&-
rc=$?
[ -n "$log" ] && [ -f "$log" ] &&
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "# elapsed: %.1f s\n", b - a}' >> "$log"
exit $rc
