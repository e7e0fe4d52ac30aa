"""Per-step metrics of dtrain runs (the JSONL of log.metrics) against each other, and the logged
learning rate against the schedule computed here from its documented formula (shared by the
equivalence and resume tests).

    sys.path.insert(0, TOP_SRCDIR + "/tests/ref")
    from metrics_match import load, agree, check_lr, schedule
    sched = schedule(INI, ["train.steps=10"])     # the run's keys: the .ini file, then overrides
    check_lr(load(PATH), sched, "dp2")            # every logged lr against the formula
    agree(ref_rows, rows, "dp2", 1e-5)            # loss, grad_norm and lr at every step

or from a shell: metrics_match.py lr JSONL INI [section.key=value ...], or metrics_match.py same A B
(two runs' loss, grad_norm, val_loss and lr equal bit for bit at every step)

The schedule (README "Learning-rate schedule", `dtrain --help`), for the 0-based step s (the
JSONL's "step" is s + 1), W = warmup, S = steps:
    s < W:              lr * (s + 1) / W
    else, constant:     lr
    else, cosine:       min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,  p = min(1, (s - W) / max(1, S - W))
It is computed from the .ini text and the overrides, not from anything dtrain prints, so an lr
taken one step early or late (or a warmup off by one) shows as a mismatch at the first step."""
import configparser
import json
import math
import os
import sys

# dtrain's defaults for the keys the schedule reads (src/core/config.c; `dtrain --help`)
DEFAULTS = {"lr": "3e-4", "min_lr": "0", "warmup": "0", "lr_schedule": "cosine", "steps": "100"}
LR_RTOL = 1e-7  # the JSONL prints lr with 9 significant digits


def load(path):
    return [json.loads(line) for line in open(path)]


def schedule(ini, overrides=()):
    """The [train] keys of the schedule from INI, overridden by "train.key=value" words."""
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    cp.read(ini)
    keys = dict(DEFAULTS)
    if cp.has_section("train"):
        keys.update({k: v for k, v in cp.items("train") if k in DEFAULTS})
    for o in overrides:
        name, _, value = o.partition("=")
        section, _, key = name.partition(".")
        if section == "train" and key in DEFAULTS:
            keys[key] = value
    return {"lr": float(keys["lr"]), "min_lr": float(keys["min_lr"]), "warmup": int(keys["warmup"]),
            "steps": int(keys["steps"]), "cosine": keys["lr_schedule"].strip() == "cosine"}


def lr_at(sched, s):
    """The learning rate of 0-based step s (the formula in this module's docstring)."""
    lr, lo, w, n = sched["lr"], sched["min_lr"], sched["warmup"], sched["steps"]
    if s < w:
        return lr * (s + 1) / w
    if not sched["cosine"]:
        return lr
    p = min(1.0, (s - w) / max(1, n - w))
    return lo + (lr - lo) * (1 + math.cos(math.pi * p)) / 2


def check_lr(rows, sched, name):
    """Every row's lr is lr_at(step - 1) within LR_RTOL; prints one line."""
    assert rows, f"{name}: no rows"
    worst = 0.0
    for r in rows:
        want = lr_at(sched, r["step"] - 1)
        rel = abs(r["lr"] - want) / want
        assert rel <= LR_RTOL, (f"{name} step {r['step']}: lr {r['lr']!r}, the schedule gives {want!r} "
                                f"(rel {rel:.2e}; lr={sched['lr']} min_lr={sched['min_lr']} warmup={sched['warmup']} "
                                f"steps={sched['steps']} {'cosine' if sched['cosine'] else 'constant'})")
        worst = max(worst, rel)
    print(f"{name}: lr of steps {rows[0]['step']}-{rows[-1]['step']} as the schedule formula gives "
          f"(warmup {sched['warmup']}, {'cosine' if sched['cosine'] else 'constant'} to step {sched['steps']}) "
          f"within {worst:.1e} (limit {LR_RTOL:g})")
    return worst


def rel(a, b):
    if a is None or b is None:  # fp16: no norm on a skipped step, and both must have skipped
        return 0.0 if a is None and b is None else math.inf
    return abs(a - b) / max(abs(a), 1e-30)


def agree(ref, rows, name, tol, norm_tol=None, ref_name="the reference"):
    """rows and ref log the same steps, with loss, grad_norm (within norm_tol, default tol) and lr
    (within LR_RTOL) equal up to the relative tolerance at every step, and the same global samples
    where logged. Prints one line; returns the worst relative differences (loss, grad_norm)."""
    norm_tol = tol if norm_tol is None else norm_tol
    steps = [r["step"] for r in ref]
    assert [r["step"] for r in rows] == steps, f"{name}: steps {[r['step'] for r in rows]}, want {steps}"
    wl = wn = 0.0
    for a, b in zip(ref, rows):
        s = b["step"]
        dl, dn, dr = rel(a["loss"], b["loss"]), rel(a["grad_norm"], b["grad_norm"]), rel(a["lr"], b["lr"])
        assert dl <= tol, f"{name} step {s}: loss {b['loss']!r} vs {ref_name} {a['loss']!r} (rel {dl:.2e} > {tol:g})"
        assert dn <= norm_tol, (f"{name} step {s}: grad_norm {b['grad_norm']!r} vs {ref_name} {a['grad_norm']!r} "
                                f"(rel {dn:.2e} > {norm_tol:g})")
        assert dr <= LR_RTOL, f"{name} step {s}: lr {b['lr']!r} vs {ref_name} {a['lr']!r}"
        if "sample0" in a and "sample0" in b:
            assert (a["sample0"], a["samples"]) == (b["sample0"], b["samples"]), f"{name} step {s}: other samples"
        wl, wn = max(wl, dl), max(wn, dn)
    print(f"{name}: {len(rows)} steps: loss within {wl:.2e} (limit {tol:g}), grad_norm within {wn:.2e} "
          f"(limit {norm_tol:g}), lr equal, of {ref_name}")
    return wl, wn


def same(a, b, name):
    """Two runs bit for bit alike: the same steps, each with equal loss, grad_norm, val_loss and lr
    (or both without one). Prints one line; exits 1 at the first difference."""
    keys = ("step", "loss", "grad_norm", "val_loss", "lr")
    ra = [{k: r.get(k) for k in keys} for r in a]
    rb = [{k: r.get(k) for k in keys} for r in b]
    assert ra, f"{name}: no rows"
    for x, y in zip(ra, rb):
        if x != y:
            sys.exit(f"{name}: step {x['step']} differs: {x} vs {y}")
    if len(ra) != len(rb):
        sys.exit(f"{name}: {len(ra)} rows vs {len(rb)}")
    vals = sum(r["val_loss"] is not None for r in ra)
    print(f"{name}: {len(ra)} steps ({vals} with val_loss) equal bit for bit")


def main(argv):
    if len(argv) == 4 and argv[1] == "same":
        same(load(argv[2]), load(argv[3]), f"{os.path.basename(argv[2])} = {os.path.basename(argv[3])}")
        return
    if len(argv) < 4 or argv[1] != "lr":
        sys.exit("usage: metrics_match.py lr JSONL INI [section.key=value ...] | same JSONL JSONL")
    check_lr(load(argv[2]), schedule(argv[3], argv[4:]), os.path.basename(argv[2]))


if __name__ == "__main__":
    main(sys.argv)
