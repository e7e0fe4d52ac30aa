#!/bin/sh
# Stands in for the Criterion unit tests in a tree configured --without-criterion (configure
# fails without Criterion unless asked): their absence is a SKIP in the test-suite summary.
echo "SKIP: configured --without-criterion: the Criterion unit-test programs (tests/test_*.c) were not built or run"
exit 77
