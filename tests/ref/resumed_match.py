"""Resumed runs against an uninterrupted one (shared by the resume tests).

usage: resumed_match.py DIR REF FIRST LAST NAME[=LABEL] ...
Reads DIR/REF.jsonl and DIR/NAME.jsonl (dtrain metrics). Each NAME must log exactly steps
FIRST..LAST, consume the same global samples as REF at each of them (sample0, samples), have the
same loss and gradient norm within 1e-5 relative and the same lr (metrics_match.agree). Prints
one line per run; exit 1 (assertion) on a mismatch. The REF run's lr against the schedule
formula: metrics_match.py lr."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metrics_match import agree  # noqa: E402


def main():
    d, ref_name, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
    ref = {r["step"]: r for r in load(ref_name)}
    want = list(range(first, last + 1))
    assert all(s in ref for s in want), f"{ref_name} lacks some of steps {first}-{last}"
    for arg in sys.argv[5:]:
        n, _, label = arg.partition("=")
        rows = load(n)
        for r in rows:
            assert "sample0" in r, f"{n} step {r['step']}: no sample0 logged"
        agree([ref[s] for s in want], rows, label or n, 1e-5, ref_name=ref_name)


if __name__ == "__main__":
    main()
