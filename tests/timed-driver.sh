#!/bin/sh
# Runs one of automake's test drivers and appends the test's wall time to its log, as the line
# "# elapsed: SECONDS s", so that whoever reads a CI log can see where the suite's time goes
# (.ci/run prints the slowest tests from these lines).
#   timed-driver.sh DRIVER [DRIVER'S ARGUMENTS...]
driver=$1
shift
log=
prev=
for a in "$@"; do
  [ "$prev" = --log-file ] && log=$a
  prev=$a
done
t0=$(date +%s.%N)
"$driver" "$@"
rc=$?
[ -n "$log" ] && [ -f "$log" ] &&
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "# elapsed: %.1f s\n", b - a}' >> "$log"
exit $rc
