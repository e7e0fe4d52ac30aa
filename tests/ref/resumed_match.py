"""Resumed runs against an uninterrupted one (shared by the resume tests).

usage: resumed_match.py DIR REF FIRST LAST NAME[=LABEL] ...
Reads DIR/REF.jsonl and DIR/NAME.jsonl (dtrain metrics). Each NAME must log exactly steps
FIRST..LAST, consume the same global samples as REF at each of them (sample0, samples) and have
the same loss within 1e-5 relative. Prints one line per run; exit 1 (assertion) on a mismatch."""
import json
import sys


def main():
    d, ref_name, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
    ref = {r["step"]: r for r in load(ref_name)}
    for arg in sys.argv[5:]:
        n, _, label = arg.partition("=")
        rows = load(n)
        steps = [r["step"] for r in rows]
        assert steps == list(range(first, last + 1)), (n, steps)
        worst = 0.0
        for r in rows:
            x = ref[r["step"]]
            assert (r["sample0"], r["samples"]) == (x["sample0"], x["samples"]), f"{n} step {r['step']}: samples differ"
            rel = abs(r["loss"] - x["loss"]) / abs(x["loss"])
            worst = max(worst, rel)
            assert rel <= 1e-5, f"{n} step {r['step']}: {r['loss']} vs {x['loss']} rel {rel:.2e}"
        print(f"{label or n}: steps {first}-{last} consume the same global samples; "
              f"worst loss difference {worst:.2e} (limit 1e-5)")


if __name__ == "__main__":
    main()
