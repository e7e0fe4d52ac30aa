"""The overlap lines a multi-rank run prints at its end, checked against its own step times.

    overlap_report.py OUT JSONL KIND [KIND ...]      KIND: ddp | zero3

`# ddp: ... waiting for gradients after backward W ms/step ... vs F ms for a blocking all-reduce
... P% ... hidden` and `# zero3: waiting for block gathers W ms/step ... vs F ms ... P% ...
hidden`: W and F are rank 0's own timings, so 0 <= W <= the slowest step (the JSONL's largest
"ms": waiting is part of a step; ZeRO-3's W also counts evaluation forwards, which the steps do
not, so it is allowed the run's whole time), F >= 0, and P = 100 * max(0, 1 - W / F) rounded, for
some W and F within the 0.05 ms that the printed values are rounded by.
A clock difference turned into a sum, a wait counted twice or a percentage of the wrong ratio
breaks one of these (mutants of src/parallel/ddp.c and src/parallel/zero.c that the equivalence checks cannot see,
since they change no number that training uses)."""
import json
import re
import sys

LINE = {"ddp": r"^# ddp: \d+ buckets; waiting for gradients after backward ([\d.]+) ms/step .* vs ([\d.]+) ms .*: "
               r"(\d+)% of the all-reduce hidden",
        "zero3": r"^# zero3: waiting for block gathers ([\d.]+) ms/step .* vs ([\d.]+) ms .*: (\d+)% of the gathers hidden"}


def main(out, jsonl, kinds):
    text = open(out).read()
    rows = [json.loads(l) for l in open(jsonl) if l.strip()]
    slowest, total = max(r["ms"] for r in rows), sum(r["ms"] for r in rows)
    for kind in kinds:
        m = re.search(LINE[kind], text, re.M)
        assert m, f"{out}: no '# {kind}:' overlap line"
        w, f, p = float(m.group(1)), float(m.group(2)), int(m.group(3))
        limit = total if kind == "zero3" else slowest
        assert 0 <= w <= limit + 0.1, f"{out}: {kind} wait {w} ms/step outside [0, {limit:.1f}]"
        assert f >= 0, f"{out}: {kind} blocking reference {f} ms"
        hid = lambda w_, f_: 100 * max(0.0, 1 - w_ / f_) if f_ > 0 else 0.0
        lo, hi = hid(w + 0.05, max(f - 0.05, 1e-9)), hid(max(w - 0.05, 0.0), f + 0.05)
        assert lo - 1 <= p <= hi + 1, f"{out}: {kind} hidden {p}%, its own numbers give {lo:.0f}..{hi:.0f}%"
        print(f"{out.split('/')[-1]}: {kind} wait {w} ms/step in [0, {limit:.1f}], blocking {f} ms, {p}% hidden: consistent")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
