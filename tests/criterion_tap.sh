#!/bin/sh
# make check's LOG_COMPILER for the Criterion programs (Makefile.am): run PROGRAM with its TAP
# report (one line per case; a skipped case is "ok - suite::case # SKIP reason") on stdout for
# automake's tap-driver.sh to count, and Criterion's usual verbose log on stderr, which goes to
# the program's .log file. Criterion's exit status is kept (nonzero when a case failed).
prog=$1
shift
tap=$(mktemp "${TMPDIR:-/tmp}/criterion-tap.XXXXXX") || exit 99
"$prog" --verbose --output=tap:"$tap" "$@" >&2
rc=$?
cat "$tap"
rm -f "$tap"
exit $rc
