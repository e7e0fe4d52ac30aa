#!/usr/bin/env python3
"""The comparisons of scripts/gpu-check.sh, on dtrain's JSONL metrics (standard library only).

  gpu_check_compare.py losses A.jsonl B.jsonl --rtol R --steps N [--what W]   per-step losses of two
                                                 runs (W names them: default "cpu vs cuda")
  gpu_check_compare.py same A.jsonl B.jsonl --steps N --what W      loss and grad norm bitwise equal
  gpu_check_compare.py reference REF.json RUN.jsonl                 validation's numerics reference
  gpu_check_compare.py resume DIR                                   the checkpoint stage's runs
  gpu_check_compare.py runs --rtol R --norm-rtol N --steps S [--acc-images K] [--spread C.jsonl,D.jsonl
                          [--spread-factor F]] NAME=A.jsonl,B.jsonl ...
                          pairs of runs (A: the one checked, B: its reference): per-step loss within R and
                          grad norm within N relative; with --acc-images, the last step's evaluation too
                          (val_loss within R, val_acc within one of K images). With --spread, C and D are
                          two reference runs that differ only in their summation order: at step s the
                          tolerance is at least F (default 10) times the most C and D differ at steps
                          1..s, the evaluation's F times theirs (ReLU networks are chaotic: a ReLU
                          input within rounding of zero passes its gradient on one side only, a max
                          pooling tie flips, and training amplifies it)
Prints what it compared with the numbers; the last line is the one-line result; exit 0 = pass.
"""
import json
import sys


def rows(path):
    with open(path) as f:
        return {r["step"]: r for r in (json.loads(l) for l in f if l.strip())}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def worst(a, b, steps, key="loss"):
    w, at = 0.0, None
    for s in steps:
        if s not in a or s not in b:
            raise SystemExit(f"FAIL: step {s} missing ({'first' if s not in a else 'second'} run)")
        e = rel(a[s][key], b[s][key])
        if e >= w:
            w, at = e, s
    return w, at


def cmd_losses(argv):
    a, b = rows(argv[0]), rows(argv[1])
    rtol, n = float(argv[argv.index("--rtol") + 1]), int(argv[argv.index("--steps") + 1])
    w, at = worst(a, b, range(1, n + 1))
    for s in (1, n // 2, n):
        print(f"  step {s:3d}: {a[s]['loss']:.7f} vs {b[s]['loss']:.7f}")
    ok = w <= rtol
    what = argv[argv.index("--what") + 1] if "--what" in argv else "cpu vs cuda"
    print(f"{'ok' if ok else 'FAIL'}: {what} losses over {n} steps: worst relative difference {w:.2e} at step "
          f"{at} (tolerance {rtol:g})")
    return 0 if ok else 1


def cmd_same(argv):
    a, b = rows(argv[0]), rows(argv[1])
    n, what = int(argv[argv.index("--steps") + 1]), argv[argv.index("--what") + 1]
    for s in range(1, n + 1):
        if s not in a or s not in b:
            print(f"FAIL: {what}: step {s} missing")
            return 1
        if (a[s]["loss"], a[s]["grad_norm"]) != (b[s]["loss"], b[s]["grad_norm"]):
            print(f"FAIL: {what}: step {s} differs: loss {a[s]['loss']!r} vs {b[s]['loss']!r}, grad norm "
                  f"{a[s]['grad_norm']!r} vs {b[s]['grad_norm']!r}")
            return 1
    print(f"ok: {what}: {n} steps' losses and grad norms bitwise equal")
    return 0


def cmd_reference(argv):
    ref = json.load(open(argv[0]))
    run = rows(argv[1])
    tol = ref.get("tolerance_rel", 1e-4)
    want = ref["losses"]
    w, at = 0.0, None
    for i, l in enumerate(want, 1):
        if i not in run:
            print(f"FAIL: step {i} missing from the cuda run")
            return 1
        e = rel(run[i]["loss"], l)
        if e >= w:
            w, at = e, i
    ok = w <= tol
    print(f"{'ok' if ok else 'FAIL'}: validation numerics on cuda vs {argv[0].split('/')[-1]}: worst relative "
          f"difference {w:.2e} at step {at} over {len(want)} steps (tolerance {tol:g})")
    return 0 if ok else 1


def cmd_resume(argv):
    d = argv[0]
    g, c, gg, gc, cg = (rows(f"{d}/{n}.jsonl") for n in ("g", "c", "gg", "gc", "cg"))
    tail = range(11, 21)
    bad = 0
    exact = all(gg[s]["loss"] == g[s]["loss"] and gg[s]["grad_norm"] == g[s]["grad_norm"] for s in tail if s in gg)
    exact = exact and all(s in gg for s in tail)
    print(f"{'ok' if exact else 'FAIL'}: cuda resumed from its step-10 checkpoint repeats steps 11-20 of the "
          f"uninterrupted cuda run bit for bit (loss and grad_norm)")
    bad += not exact
    for name, x, y, what in (("gc", gc, g, "cpu resumed from the cuda checkpoint vs the cuda run"),
                             ("cg", cg, c, "cuda resumed from the cpu checkpoint vs the cpu run")):
        w, at = worst(x, y, tail)
        ok = w <= 2e-3
        bad += not ok
        print(f"{'ok' if ok else 'FAIL'}: {what}: steps 11-20 worst relative loss difference {w:.2e} at step {at} "
              f"(tolerance 2e-3)")
    ev = {}
    for be in ("cpu", "cuda"):
        try:
            ev[be] = float(open(f"{d}.eval_{be}.txt").read().split()[-1])
        except (OSError, ValueError, IndexError):
            ev[be] = float("nan")
    e = rel(ev["cuda"], ev["cpu"])
    ok = e <= 1e-5
    bad += not ok
    print(f"{'ok' if ok else 'FAIL'}: dtrain eval of the cuda step-20 checkpoint: cpu {ev['cpu']:.7f}, cuda "
          f"{ev['cuda']:.7f} (relative {e:.1e}, tolerance 1e-5)")
    print(f"{'all 4 checkpoint checks pass' if not bad else f'{bad} of 4 checkpoint checks FAIL'}")
    return 1 if bad else 0


def check_eval(name, a, b, n, rtol, images, imgtol=1):
    """The evaluation at step n of run a against b's: (ok, text)."""
    va, vb = a[n].get("val_loss"), b[n].get("val_loss")
    if va is None or vb is None:
        return False, f"{name}: no evaluation at step {n}"
    e, da = rel(va, vb), round(abs(a[n]["val_acc"] - b[n]["val_acc"]) * images)
    ok = e <= rtol and da <= imgtol
    return ok, (f"{name}: test loss {va:.7f} vs {vb:.7f} ({e:.1e}, tolerance {rtol:.1e}), accuracy "
                f"{a[n]['val_acc']:.4f} vs {b[n]['val_acc']:.4f} ({da} of {images} images differ, at most {imgtol})")


def spread_limits(files, n, rtol, nrtol, factor, images):
    """Per-step tolerances {step: (loss, grad norm)} and the evaluation's at step n (test loss, images):
    the fixed ones, or factor x the running maximum of the relative differences between two reference
    runs (files "C,D"), whichever is larger."""
    if not files:
        return {s: (rtol, nrtol) for s in range(1, n + 1)}, (rtol, 1)
    c, d = (rows(f) for f in files.split(","))
    lim, ml, mn = {}, 0.0, 0.0
    for s in range(1, n + 1):
        if s not in c or s not in d:
            raise SystemExit(f"FAIL: --spread runs: step {s} missing")
        ml, mn = max(ml, rel(c[s]["loss"], d[s]["loss"])), max(mn, rel(c[s]["grad_norm"], d[s]["grad_norm"]))
        lim[s] = (max(rtol, factor * ml), max(nrtol, factor * mn))
    ev = (rtol, 1)
    if images and c[n].get("val_loss") is not None and d[n].get("val_loss") is not None:
        da = abs(c[n]["val_acc"] - d[n]["val_acc"]) * images
        ev = (max(rtol, factor * rel(c[n]["val_loss"], d[n]["val_loss"]), lim[n][0]), max(1, round(factor * da)))
    return lim, ev


def worst_within(a, b, lim, key, k):
    """The step where run a's relative difference from b in key uses most of lim[step][k]:
    (difference, step, its tolerance)."""
    w = (-1.0, 0.0, None, None)
    for s in sorted(lim):
        if s not in a or s not in b:
            raise SystemExit(f"FAIL: step {s} missing ({'first' if s not in a else 'second'} run)")
        e = rel(a[s][key], b[s][key])
        w = max(w, (e / lim[s][k], e, s, lim[s][k]))
    return w[1:]


def cmd_runs(argv):
    keys = ("--rtol", "--norm-rtol", "--steps", "--acc-images", "--spread", "--spread-factor")
    opt = {k: argv[argv.index(k) + 1] for k in keys if k in argv}
    rtol, nrtol, n = float(opt["--rtol"]), float(opt["--norm-rtol"]), int(opt["--steps"])
    images = int(opt.get("--acc-images", 0))
    pairs = [x for x in argv if "=" in x and "," in x]
    try:
        lim, ev = spread_limits(opt.get("--spread"), n, rtol, nrtol, float(opt.get("--spread-factor", 10)), images)
    except (OSError, ValueError, KeyError, SystemExit) as e:
        print(f"FAIL: --spread {opt.get('--spread')}: {e or 'no metrics'}")
        return 1
    if "--spread" in opt:
        print(f"tolerance per step from the spread of {opt['--spread']}: loss {lim[1][0]:.1e} at step 1, "
              f"{lim[n][0]:.1e} at step {n}; grad norm {lim[1][1]:.1e}, {lim[n][1]:.1e}")
    bad, wl, wn = [], (0.0, "-"), (0.0, "-")
    for p in pairs:
        name, files = p.split("=", 1)
        try:
            a, b = (rows(f) for f in files.split(","))
            (l, ls, ll), (g, gs, gl) = worst_within(a, b, lim, "loss", 0), worst_within(a, b, lim, "grad_norm", 1)
        except (OSError, ValueError, KeyError, SystemExit) as e:
            print(f"FAIL: {name}: {e or 'no metrics'}")
            bad.append(name)
            continue
        ok = l <= ll and g <= gl
        print(f"{'ok' if ok else 'FAIL'}: {name}: loss {l:.2e} (step {ls}, tolerance {ll:.1e}), grad norm {g:.2e} "
              f"(step {gs}, tolerance {gl:.1e}) over {n} steps")
        if images:
            eok, text = check_eval(name, a, b, n, ev[0], images, ev[1])
            print(f"{'ok' if eok else 'FAIL'}: {text}")
            ok = ok and eok
        bad += [] if ok else [name]
        wl, wn = max(wl, (l, name)), max(wn, (g, name))
    tol = f"(tolerance {rtol:g} loss, {nrtol:g} grad norm{', or the spread' if '--spread' in opt else ''})"
    if bad or not pairs:
        print(f"FAIL: {', '.join(bad) or 'no runs'}: outside {tol}")
        return 1
    print(f"{len(pairs)} runs agree: worst loss {wl[0]:.1e} ({wl[1]}), worst grad norm {wn[0]:.1e} ({wn[1]}) {tol}")
    return 0


def main():
    cmds = {"losses": cmd_losses, "same": cmd_same, "reference": cmd_reference, "resume": cmd_resume, "runs": cmd_runs}
    if len(sys.argv) < 3 or sys.argv[1] not in cmds:
        print(__doc__)
        return 2
    return cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
