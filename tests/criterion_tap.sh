#!/bin/sh
# make check's LOG_COMPILER for the test programs (automake's tap-driver.sh reads what this prints
# on stdout; the .sh tests have their own driver). A Criterion program (one of $CRITERION_TESTS,
# set by Makefile.am) runs with its TAP report (one line per case; a skipped case is
# "ok - suite::case # SKIP reason") on stdout and Criterion's verbose log on stderr, which goes
# to its .log file; its exit status is kept (nonzero when a case failed). Any other program runs
# as it is, its output to the .log file, and its exit status becomes one TAP line: 0 ok, 77 SKIP,
# 99 a hard error, anything else not ok.
prog=$1
shift
case " $CRITERION_TESTS " in
  *" ${prog#./} "*)
    tap=$(mktemp "${TMPDIR:-/tmp}/criterion-tap.XXXXXX") || exit 99
    "$prog" --verbose --output=tap:"$tap" "$@" >&2
    rc=$?
    cat "$tap"
    rm -f "$tap"
    exit $rc
    ;;
esac
"$prog" "$@" >&2
rc=$?
echo "1..1"
case $rc in
  0) echo "ok 1 - ${prog#./}" ;;
  77) echo "ok 1 - ${prog#./} # SKIP (exit status 77)" ;;
  99) echo "Bail out! ${prog#./}: hard error (exit status 99)" ;;
  *) echo "not ok 1 - ${prog#./} (exit status $rc)" ;;
esac
exit 0
