"""The overlap lines a multi-rank run prints at its end, checked against its own step times.

    overlap_report.py OUT JSONL KIND [KIND ...]      KIND: ddp | ddp_after | zero3

`# ddp: ... backward + gradient all-reduce O ms/step overlapped (median of n steps) vs P ms with
the all-reduce after backward (median of k probe steps, parallel.ddp_probe = N), the all-reduce
alone A ms: H% +- U of the all-reduce hidden ... difference, E ms, from their spread[; not measurable here...
| ; below 0: ...]`:
O and P are windows of steps, so each is at most the
slowest step (the JSONL's largest "ms"); A is part of P's window; the probe steps are steps 2,
2 + N, ... and the others from step 2 on are the n (so n + k + 1 = the steps run); H = 100 (P - O) / A
(not clamped, within -999..999) and U = 100 E / A for some O, P, A, E within the 0.05 ms they are
rounded by; "not measurable here" exactly when U >= 50, else "below 0" exactly when H + U < 0.
`# ddp: ... is not measured: k probe and 0 other steps after the first (parallel.ddp_probe = 1);
with every all-reduce after backward: backward + all-reduce W ms, the all-reduce alone A ms
(medians)` (ddp_after): k = the steps after the first, 0 <= A <= W + 0.1 <= the slowest step + 0.1.
`# zero3: waiting for block gathers W ms/step ... vs F ms ... P% ... hidden`: W, F rank 0's own
timings, 0.1 ms <= W (each pass waits for its first block) <= the run's whole time (W also counts
evaluation forwards), F >= 0, and P = 100 * max(0, 1 - W / F) within the rounding.
A clock difference turned into a sum, a wait counted twice, a probe on the wrong steps or a
percentage of the wrong ratio breaks one of these (mutants of src/parallel/sync.c, ddp.c and
zero.c that the equivalence checks cannot see, since they change no number that training uses)."""
import json
import re
import sys

DDP = (r"^# ddp: \d+ buckets; backward \+ gradient all-reduce ([\d.]+) ms/step overlapped \(median of (\d+) steps\) "
       r"vs ([\d.]+) ms with the all-reduce after backward \(median of (\d+) probe steps, parallel.ddp_probe = (\d+)\), "
       r"the all-reduce alone ([\d.]+) ms: (-?\d+)% \+- (\d+) of the all-reduce hidden behind backward \(the probes' "
       r"barrier before it, waiting for the slowest rank, ([\d.]+) ms\); \+- 2 standard errors of the two windows' "
       r"difference, ([\d.]+) ms, from their spread(; not measurable here: the all-reduce is within the steps' noise)?"
       r"(; below 0: the all-reduce during backward slowed the step by more than it hid)?")
DDP_AFTER = (r"^# ddp: \d+ buckets; .*is not measured: (\d+) probe and (\d+) other steps after the first "
             r"\(parallel.ddp_probe = 1\); with every all-reduce after backward: backward \+ all-reduce ([\d.]+) ms, "
             r"the all-reduce alone ([\d.]+) ms \(medians\)")
ZERO3 = r"^# zero3: waiting for block gathers ([\d.]+) ms/step .* vs ([\d.]+) ms .*: (\d+)% of the gathers hidden"


def check_ddp(out, text, rows):
    m = re.search(DDP, text, re.M)
    assert m, f"{out}: no '# ddp:' overlap line"
    o, n, p, k, every, a, h = (float(m.group(1)), int(m.group(2)), float(m.group(3)), int(m.group(4)),
                               int(m.group(5)), float(m.group(6)), int(m.group(7)))
    u, skew, noise, unmeasurable = int(m.group(8)), float(m.group(9)), float(m.group(10)), m.group(11) is not None
    below = m.group(12) is not None
    slowest, steps = max(r["ms"] for r in rows), max(r["step"] for r in rows)
    for name, v in (("overlapped", o), ("probe", p)):
        assert 0 < v <= slowest + 0.1, f"{out}: {name} window {v} ms outside (0, slowest step {slowest:.1f}]"
    assert 0 <= a <= p + 0.1, f"{out}: all-reduce alone {a} ms outside [0, the probe window {p}]"
    assert 0 <= skew <= p + 0.1, f"{out}: barrier wait {skew} ms outside [0, the probe window {p}]"
    want_k = len([s for s in range(2, steps + 1) if (s - 2) % every == 0])
    assert (k, n) == (min(want_k, 64), min(steps - 1 - want_k, 64)), \
        f"{out}: {k} probe and {n} other steps, want {want_k} and {steps - 1 - want_k} of steps 2..{steps} (every {every})"
    assert noise >= 0, f"{out}: noise {noise} ms"
    hid = lambda o_, p_, a_: max(-999.0, min(999.0, 100 * (p_ - o_) / a_)) if a_ > 0 else 0.0
    r = [hid(o + i, p + j, max(a + l, 1e-9)) for i in (-0.05, 0.05) for j in (-0.05, 0.05) for l in (-0.05, 0.05)]
    lo, hi = min(r), max(r)
    assert lo - 1 <= h <= hi + 1, f"{out}: {h}% hidden, its own numbers give {lo:.0f}..{hi:.0f}%"
    # U = min(999, 100 E / A) (100 when A is 0): with A printed below 0.05 ms the true A may be as
    # small as it likes, so nothing bounds U but the 999 cap
    e_lo = min(999.0, 100 * max(noise - 0.05, 0) / (a + 0.05))
    e_hi = 999.0 if a - 0.05 <= 0 else min(999.0, 100 * (noise + 0.05) / (a - 0.05))
    if a - 0.05 <= 0:
        e_lo = min(e_lo, 100.0)
    assert e_lo - 1 <= u <= e_hi + 1, f"{out}: +- {u} points, its own numbers give {e_lo:.0f}..{e_hi:.0f}"
    assert unmeasurable == (u >= 50) or u == 50, f"{out}: +- {u} points but 'not measurable' {'said' if unmeasurable else 'not said'}"
    assert not (below and unmeasurable), f"{out}: both 'not measurable' and 'below 0'"
    assert unmeasurable or below == (h + u < 0) or abs(h + u) <= 1, \
        f"{out}: {h}% +- {u} but 'below 0' {'said' if below else 'not said'}"
    print(f"{out.split('/')[-1]}: ddp overlapped {o} ms, probe {p} ms (all-reduce {a} ms, barrier {skew} ms), "
          f"{k} probes every {every}, "
          f"{h}% +- {u} hidden{' (not measurable)' if unmeasurable else ' (below 0)' if below else ''}: consistent")


def check_ddp_after(out, text, rows):
    m = re.search(DDP_AFTER, text, re.M)
    assert m, f"{out}: no '# ddp:' line with every all-reduce after backward"
    k, n, w, a = int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4))
    slowest, steps = max(r["ms"] for r in rows), max(r["step"] for r in rows)
    assert (k, n) == (min(steps - 1, 64), 0), f"{out}: {k} probe and {n} other steps of steps 2..{steps}"
    assert 0 <= a <= w + 0.1, f"{out}: all-reduce alone {a} ms outside [0, its window {w}]"
    assert 0 < w <= slowest + 0.1, f"{out}: window {w} ms outside (0, slowest step {slowest:.1f}]"
    print(f"{out.split('/')[-1]}: ddp every step a probe: window {w} ms, all-reduce {a} ms, {k} probes: consistent")


def check_zero3(out, text, rows):
    m = re.search(ZERO3, text, re.M)
    assert m, f"{out}: no '# zero3:' overlap line"
    w, f, p = float(m.group(1)), float(m.group(2)), int(m.group(3))
    total = sum(r["ms"] for r in rows)
    assert 0 <= w <= total + 0.1, f"{out}: zero3 wait {w} ms/step outside [0, {total:.1f}]"
    # the first block of every pass is never prefetched: its gather is always waited for (2-5 ms here)
    assert w >= 0.1, f"{out}: zero3 wait {w} ms/step, but the first block of each pass is always waited for"
    assert f >= 0, f"{out}: zero3 blocking reference {f} ms"
    hid = lambda w_, f_: 100 * max(0.0, 1 - w_ / f_) if f_ > 0 else 0.0
    lo, hi = hid(w + 0.05, max(f - 0.05, 1e-9)), hid(max(w - 0.05, 0.0), f + 0.05)
    assert lo - 1 <= p <= hi + 1, f"{out}: zero3 hidden {p}%, its own numbers give {lo:.0f}..{hi:.0f}%"
    print(f"{out.split('/')[-1]}: zero3 wait {w} ms/step in [0, {total:.1f}], blocking {f} ms, {p}% hidden: consistent")


def main(out, jsonl, kinds):
    text = open(out).read()
    rows = [json.loads(l) for l in open(jsonl) if l.strip()]
    for kind in kinds:
        {"ddp": check_ddp, "ddp_after": check_ddp_after, "zero3": check_zero3}[kind](out, text, rows)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
