"""The `cnn` check of validation/run (validation/README.md): the image-classifier path (convolutions,
synchronised batch norm, SGD with momentum) on the cluster.

A SimpleCNN (model.arch = cnn, width 8, hidden 32) takes 3 SGD steps of 32 images from an image set
this module writes (deterministic 28x28 gray images of 10 classes, IDX files, Python standard library
only: no dataset needs to be installed), on 1 rank and on dp = 2, 4, 8 (as many as the allocation
has ranks) with batch norm synchronised over dp; then it evaluates the test images.
- numerics: the 1-rank losses within 1e-4 relative of validation/reference/cnn_losses.json
  (written by dtrain: a regression pin; the layers and steps are checked against PyTorch by
  tests/ref_cnn.sh and tests/cnn_train.sh in make check);
- equivalence: every dp run's loss and gradient norm within 1e-5 relative of the 1-rank run's at
  every step, the final test loss too (measured <= 1.5e-7 in steps 1-3 by tests/cnn_train.sh).
"""
import json
import os
import shlex
import struct

STEPS = 3
TRAIN_N, TEST_N = 256, 128
RTOL_REF = 1e-4
RTOL_DP = 1e-5
REF = os.path.join(os.path.dirname(os.path.realpath(__file__)), "reference", "cnn_losses.json")


def _lcg(seed):
    x = seed & 0xFFFFFFFF
    while True:
        x = (1664525 * x + 1013904223) & 0xFFFFFFFF
        yield x >> 24


def _write_set(d, name, n, seed):
    """n images of class i % 10: a bright bar whose row and column depend on the class, plus noise."""
    noise = _lcg(seed)
    img = bytearray()
    lab = bytearray()
    for i in range(n):
        c = (i * 7 + seed) % 10
        lab.append(c)
        r0, c0 = 3 + 2 * c, 25 - 2 * c
        for y in range(28):
            for x in range(28):
                v = next(noise) // 2
                if r0 <= y < r0 + 3 or c0 <= x < c0 + 2:
                    v += 120
                img.append(min(v, 255))
    images, labels = os.path.join(d, f"{name}-images"), os.path.join(d, f"{name}-labels")
    with open(images, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(img))
    with open(labels, "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(lab))
    return images, labels


def write_config(ctx):
    """The check's configuration file in the work directory, with the image set it names (written
    once per suite run)."""
    if "cnn-ini" in ctx.cache:
        return ctx.cache["cnn-ini"]
    d = os.path.join(ctx.workdir, "cnn-data")
    os.makedirs(d, exist_ok=True)
    tr, trl = _write_set(d, "train", TRAIN_N, 3)
    te, tel = _write_set(d, "test", TEST_N, 4)
    ini = os.path.join(d, "cnn.ini")
    with open(ini, "w") as f:
        f.write(f"""# validation/cnn_check.py: a SimpleCNN on synthetic 28x28 images, {STEPS} SGD steps
[model]
arch = cnn
classes = 10
width = 8
hidden = 32

[train]
micro_batch = 32
global_batch = 32
steps = {STEPS}
optimizer = sgd
momentum = 0.9
lr = 0.05
warmup = 1
weight_decay = 5e-4
grad_clip = 0
eval_every = {STEPS}
seed = 1
threads = 1

[data]
format = idx
train = {tr}
train_labels = {trl}
val = {te}
val_labels = {tel}

[log]
every = 1

[checkpoint]
every = 0
resume = never

[system]
backend = cpu
""")
    ctx.cache["cnn-ini"] = ini
    return ini


def run(ctx, dp, read_metrics, need):
    """The 3 steps on dp ranks (cached per dp); returns the metrics rows."""
    key = f"cnn-dp{dp}"
    if key not in ctx.cache:
        d = os.path.join(ctx.workdir, key)
        os.makedirs(d, exist_ok=True)
        metrics = os.path.join(d, "metrics.jsonl")
        if os.path.exists(metrics):
            os.unlink(metrics)
        extra = [f"train.micro_batch={32 // dp}", f"log.metrics={metrics}", f"checkpoint.dir={d}/ck"]
        extra += shlex.split(ctx.opt.get("cnn_args", ""))
        ctx.run(ctx.launcher(dp) + [ctx.dtrain, write_config(ctx)] + extra, os.path.join(d, "out.txt"))
        rows = read_metrics(metrics)
        need([r["step"] for r in rows] == list(range(1, STEPS + 1)) and "val_loss" in rows[-1],
             f"the cnn dp={dp} run did not log steps 1..{STEPS} and a test loss")
        ctx.cache[key] = rows
    return ctx.cache[key]


def check(ctx, say, need, rel, read_metrics, dp_sizes):
    with open(REF) as f:
        ref = json.load(f)
    base = run(ctx, 1, read_metrics, need)
    want = ref["losses"]
    need(len(want) == STEPS, f"{REF}: {len(want)} losses, want {STEPS}")
    worst = max((rel(r["loss"], w), r["step"]) for r, w in zip(base, want))
    say(f"cnn 1 rank vs {os.path.basename(REF)}: worst relative loss difference {worst[0]:.2e} at step "
        f"{worst[1]} (tolerance {RTOL_REF:g})")
    need(worst[0] <= RTOL_REF, f"cnn loss at step {worst[1]} differs from the reference by {worst[0]:.2e} "
                               f"relative (> {RTOL_REF:g})")
    parts, fails = [f"1 rank vs reference {worst[0]:.1e}"], []
    for dp in dp_sizes(ctx):
        rows = run(ctx, dp, read_metrics, need)
        errs = [(rel(r[k], b[k]), f"step {r['step']} {k}") for r, b in zip(rows, base) for k in ("loss", "grad_norm")]
        errs.append((rel(rows[-1]["val_loss"], base[-1]["val_loss"]), "test loss"))
        w, at = max(errs)
        say(f"cnn dp={dp} vs dp=1 (batch norm synchronised): worst relative difference {w:.2e} ({at}, "
            f"tolerance {RTOL_DP:g})")
        parts.append(f"dp={dp}: {w:.1e}")
        if w > RTOL_DP:
            fails.append(f"dp={dp} {at}: {w:.2e}")
    need(not fails, "cnn dp runs disagree with dp=1: " + "; ".join(fails))
    return {"value": ", ".join(parts), "reference": f"<= {RTOL_REF:g} vs reference, <= {RTOL_DP:g} dp vs 1 rank",
            "metrics": {"cnn_max_rel": worst[0]}}


def write_reference(ctx, read_metrics, need, version):
    rows = run(ctx, 1, read_metrics, need)
    doc = {"config": "validation/cnn_check.py (SimpleCNN width 8, synthetic 28x28 images)", "ranks": 1,
           "steps": STEPS, "generated_by": version, "tolerance_rel": RTOL_REF,
           "note": "fp32 losses of the 1-rank run; regenerate with validation/run --write-numerics-reference",
           "losses": [r["loss"] for r in rows]}
    with open(REF, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return REF
