#!/bin/bash
# dtrain bench-comm on 3 ranks (not a power of two): every table is present, no value is wrong,
# algbw = size/time and busbw = algbw * {2(n-1)/n, (n-1)/n, 1} as printed, exit status 0 and the
# verdict "ok, 0 wrong values"; a planted
# DTRAIN_FAULT=bad_allreduce@2 is counted as wrong values and gives exit 1; bad options exit 2.
source "$top_srcdir/tests/lib.sh"
set +e
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
mpi 3 "$DTRAIN" bench-comm --max-bytes 256K --iters 3 --warmup 1 > "$t/ok.txt"
rc=$?
cat "$t/ok.txt"
[ $rc -eq 0 ] || { echo "FAIL: bench-comm exited $rc, want 0"; exit 1; }
grep -q '^# bench-comm: ok, 0 wrong values in total$' "$t/ok.txt" || { echo "FAIL: no '# bench-comm: ok, 0 wrong values' verdict"; exit 1; }
"$PY" - "$t/ok.txt" 3 <<'PY'
import re, sys
text, n = open(sys.argv[1]).read(), int(sys.argv[2])
fac = {"allreduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "allgather": (n - 1) / n,
       "broadcast": 1.0, "sendrecv": 1.0}
op, rows = None, {}
for line in text.splitlines():
    m = re.match(r"# op: (\w+)", line)
    if m:
        op = m.group(1); rows[op] = []
    elif op and re.match(r"\s+\d", line):
        rows[op].append([float(x) if i not in (2, 3) else x for i, x in enumerate(line.split())])
assert sorted(rows) == sorted(fac), rows.keys()
for o, rs in rows.items():
    assert len(rs) >= 14, (o, len(rs))
    for r in rs:
        size, count, us, alg, bus, wrong = r[0], r[1], r[4], r[5], r[6], r[7]
        assert wrong == 0, (o, r)
        assert size == count * 4, (o, r)
        if o in ("reduce_scatter", "allgather"):
            assert count % n == 0, (o, r)
        assert abs(alg - size / us * 1e-3) <= 0.0015 + 0.01 * alg, (o, r)
        assert abs(bus - alg * fac[o]) <= 0.0015 + 0.01 * bus, (o, r)
    if o == "allreduce":
        assert all(len(r) == 10 for r in rs), "allreduce rows need the plain MPI_Allreduce columns"
print("5 tables, 0 wrong values, algbw = size/time and busbw factors as nccl-tests define them")
PY
[ $? -eq 0 ] || exit 1
DTRAIN_FAULT=bad_allreduce@2 mpi 3 -x DTRAIN_FAULT "$DTRAIN" bench-comm --max-bytes 4K --iters 2 > "$t/bad.txt" 2>&1
rc=$?
grep '^# bench-comm:' "$t/bad.txt"
[ $rc -ne 0 ] || { echo "FAIL: bench-comm passed with bad_allreduce@2"; exit 1; }
grep -q '^# bench-comm: FAILED, [1-9][0-9]* wrong values' "$t/bad.txt" || { echo "FAIL: wrong values not counted"; exit 1; }
for bad in "--max-bytes 0" "--max-bytes 12X" "--ops allreduce,nope" "--min-bytes 1M --max-bytes 1K" "--frob 1"; do
  # shellcheck disable=SC2086
  run "$DTRAIN" bench-comm $bad > "$t/arg.txt" 2>&1
  rc=$?
  [ $rc -eq 2 ] || { cat "$t/arg.txt"; echo "FAIL: bench-comm $bad exited $rc, want 2"; exit 1; }
  tail -1 "$t/arg.txt"
done
echo "bench_comm: OK"
