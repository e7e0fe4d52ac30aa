#!/usr/bin/env bash
# make install works like HPC software: into a temporary prefix, then with Debian's Lmod
# `module use PREFIX/share/dtrain/modulefiles; module load dtrain` puts dtrain on PATH and its man
# page on MANPATH and sets DTRAIN_HOME; `dtrain --version` runs; inputs/tiny.ini trains a few steps
# from $DTRAIN_HOME/share/dtrain (the installed data); `man dtrain` renders the configuration keys;
# the module names the MPI it was built against; make uninstall removes the files again.
source "$top_srcdir/tests/lib.sh"
begin_test
fail() { echo "FAIL: $*"; exit 1; }
init=/usr/share/lmod/lmod/init/bash
[ -r "$init" ] || { echo "SKIP: Lmod is not installed ($init; Debian: apt-get install lmod)"; exit 77; }
command -v man > /dev/null || { echo "SKIP: man is not installed (Debian: apt-get install man-db)"; exit 77; }
pfx="$t/pfx"
run make -C "$top_builddir" install prefix="$pfx" > "$t/install.log" 2>&1 || { tail -20 "$t/install.log"; fail "make install"; }
set +u
source "$init"
run module use "$pfx/share/dtrain/modulefiles"
run module load dtrain || fail "module load dtrain"
set -u
[ "$(command -v dtrain)" = "$pfx/bin/dtrain" ] || fail "dtrain on PATH is $(command -v dtrain), want $pfx/bin/dtrain"
[ "$DTRAIN_HOME" = "$pfx" ] || fail "DTRAIN_HOME=$DTRAIN_HOME, want $pfx"
run dtrain --version | tee "$t/version"
mpi=$(sed -n 's/^mpi: //p' "$t/version")
grep -qF "Built against mpi $mpi" "$pfx/share/dtrain/modulefiles/dtrain/"*.lua || fail "the module file does not name MPI '$mpi'"
set +u
module whatis dtrain 2>&1 | tee "$t/whatis"
set -u
grep -q "Built against hdf5" "$t/whatis" || fail "module whatis does not name HDF5"
cd "$DTRAIN_HOME/share/dtrain"
run dtrain inputs/tiny.ini system.backend=cpu train.steps=3 train.eval_every=0 log.every=1 log.metrics="$t/m.jsonl" \
  checkpoint.dir="$t/ck" > "$t/train.out" || { cat "$t/train.out"; fail "tiny.ini from \$DTRAIN_HOME/share/dtrain"; }
[ "$(wc -l < "$t/m.jsonl")" -eq 3 ] || fail "want 3 metrics rows"
MANWIDTH=100 man dtrain 2> "$t/man.err" > "$t/man.txt" || { cat "$t/man.err"; fail "man dtrain"; }
for want in "DTRAIN(1)" "SYNOPSIS" "CONFIGURATION" "grad_clip (float" "comm_timeout\|threads (int"; do
  grep -q "$want" "$t/man.txt" || fail "man dtrain lacks '$want'"
done
! grep -q "warning" "$t/man.err" || { cat "$t/man.err"; fail "man(1) warned about the markup"; }
[ -x validation/run ] && [ -x sbatch/ddp_4node.sh ] && [ -x scripts/get-data.sh ] || fail "scripts not executable"
cd "$top_builddir"
run make -C "$top_builddir" uninstall prefix="$pfx" > "$t/uninstall.log" 2>&1 || fail "make uninstall"
left=$(find "$pfx" -type f | head -5)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "install: OK"
