#!/usr/bin/env python3
"""The real trainer against an independent PyTorch training loop (tests/ref_trainer.sh).

    ref_trainer.py CONFIG.ini INIT.h5 DIR [section.key=value ...] -- RUN...

CONFIG.ini plus the key=value overrides are the settings dtrain ran with; every key this file uses
must be given there (no dtrain defaults are assumed). INIT.h5 is the checkpoint dtrain wrote at
step 0 (its initial weights). Each RUN names DIR/RUN.jsonl (dtrain's metrics) and DIR/RUN/ (its
checkpoint directory, ckpt_<steps>.h5): runs of one global batch over different micro-batch x
grad_accum x dp splits, all compared with the same reference trajectory.

The reference is written here from dtrain's documentation, not from its code:
  data     src/data/data.h: sample s = the T+1 tokens at s*T of the shard holding it (shards sorted by
           name, samples numbered on); global index g -> sample perm_e(g mod N), e = g div N,
           perm_e = Fisher-Yates from the top over identity, j = uniform [0, i] by splitmix64
           (rejecting r < 2^64 mod bound) seeded with splitmix64(seed) xor splitmix64(e); step s
           takes the global_batch indices [s*G, (s+1)*G) (README: the set does not depend on dp).
  model    tests/ref/ref_gpt2.py's GPT2 (own torch module, tied lm_head, tanh GELU).
  loss     the mean token cross-entropy over the whole global batch, one forward of G sequences
           (dtrain: mean over micro-steps and dp ranks of micro-batch means: the same number).
  lr       `dtrain --help`: warmup lr*(s+1)/warmup for s < warmup, then cosine from lr to min_lr
           at the last step, p = (s - warmup) / max(1, steps - warmup) (or constant).
  clip     torch.nn.utils.clip_grad_norm_ (global 2-norm, coef clip/(norm+1e-6) when below 1).
  AdamW    torch.optim.AdamW; weight decay on 2-D tensors (embeddings included), none on 1-D.
The loop runs in float64 (the reference) and float32 (a second correct fp32 implementation: how
far fp32 rounding alone moves things, printed next to dtrain's error).

Compared per run and step: lr, loss, grad_norm, whether clipping bound, sample0; at the end every
parameter and both AdamW moments (per tensor ||a-b|| / ||ref||, the key third of attn.c_attn.bias
left out as in tensors_match.py), and the checkpoint's step and data_pos. Tolerances: see TOL.
"""
import configparser
import glob
import json
import math
import os
import sys

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:  # the shell wrapper turns this into a test failure
    print(f"ref_trainer.py: FAIL: {sys.executable} lacks torch/numpy/h5py ({e}); set REF_PYTHON", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_gpt2 import GPT2  # noqa: E402

# Tolerances against the float64 reference. dtrain computes in fp32 and sums in another order than
# torch, so its numbers sit about as far from float64 as torch's own float32 run does. Measured on
# tests/small.ini, 24 steps (worst over the three runs; torch float32 vs float64 in brackets):
# loss 8e-8 (1e-7), grad_norm 5e-8 (5e-7), final parameters 1.2e-6 (4e-7), AdamW m 6e-6 (5e-6), v 7e-7
# (6e-7): fp32 rounding of ~1e-7 per step, grown through AdamW's m/sqrt(v) by the end (m is a mean
# of gradients that partly cancel, so its relative error is the largest). Each limit is about 10x
# the worst seen, and 100x or more below what a wrong lr step, a missing or doubled 1/accum or
# 1/dp, a wrong clip, bias correction or decay group gives (1e-3 and up).
TOL = {
    "lr": 1e-8,          # printed with 9 significant digits, computed in double by both
    "loss": 1e-6,        # per step, relative
    "grad_norm": 1e-6,   # per step, relative
    "model": 1e-5,       # final parameters, per tensor ||a-b|| / ||ref||
    "exp_avg": 1e-4,     # AdamW m
    "exp_avg_sq": 1e-5,  # AdamW v
}
CLIP_MARGIN = 1e-4       # every reference norm this far (relative) from the clip: no toss-up decisions
M64 = (1 << 64) - 1


def splitmix64(state):
    """(new state, output): Steele, Lea, Flood 2014."""
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def permutation(n, seed, epoch):
    a, oa = splitmix64(seed)
    b, ob = splitmix64(epoch)
    state = oa ^ ob
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        threshold = ((1 << 64) - bound) % bound
        while True:
            state, r = splitmix64(state)
            if r >= threshold:
                break
        j = r % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class Sampler:
    """Global sample index -> (inputs, targets) of T tokens, per src/data/data.h's definition."""

    def __init__(self, pattern, T, shuffle, seed):
        self.T, self.shuffle, self.seed = T, shuffle, seed
        self.shards, self.first = [], []
        n = 0
        for path in sorted(glob.glob(pattern)):
            raw = np.fromfile(path, dtype="<i4", count=256)
            assert raw[0] == 20240520 and raw[1] == 1, f"{path}: not a version-1 token shard"
            tok = np.fromfile(path, dtype="<u2", offset=1024)
            assert len(tok) == raw[2], f"{path}: {len(tok)} tokens, header says {raw[2]}"
            self.shards.append(tok)
            self.first.append(n)
            n += (len(tok) - 1) // T if len(tok) > T else 0
        self.N = n
        self.perms = {}

    def sample(self, g):
        e, pos = divmod(g, self.N)
        if self.shuffle:
            if e not in self.perms:
                self.perms[e] = permutation(self.N, self.seed, e)
            pos = self.perms[e][pos]
        k = max(i for i, f in enumerate(self.first) if f <= pos and len(self.shards[i]) > self.T)
        w = self.shards[k][(pos - self.first[k]) * self.T:][: self.T + 1].astype(np.int64)
        return w[:-1], w[1:]

    def batch(self, g0, n):
        xs, ys = zip(*(self.sample(g0 + i) for i in range(n)))
        return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def settings(ini, overrides):
    cp = configparser.ConfigParser(inline_comment_prefixes=("#",))
    cp.read(ini)
    for kv in overrides:
        k, v = kv.split("=", 1)
        sec, key = k.split(".", 1)
        if not cp.has_section(sec):
            cp.add_section(sec)
        cp.set(sec, key, v)

    def get(k, conv=str):
        sec, key = k.split(".", 1)
        if not cp.has_option(sec, key):
            sys.exit(f"ref_trainer.py: FAIL: {k} must be set in {ini} or on the command line")
        return conv(cp.get(sec, key))

    truth = lambda s: s.strip().lower() in ("true", "1", "yes")
    return {k.split(".")[1]: get(k, c) for k, c in [
        ("model.n_layer", int), ("model.n_head", int), ("model.n_embd", int), ("model.vocab_size", int),
        ("model.seq_len", int), ("train.global_batch", int), ("train.steps", int), ("train.lr", float),
        ("train.min_lr", float), ("train.warmup", int), ("train.lr_schedule", str),
        ("train.weight_decay", float), ("train.beta1", float), ("train.beta2", float), ("train.eps", float),
        ("train.grad_clip", float), ("train.seed", int), ("data.train", str), ("data.shuffle", truth)]}


def lr_at(s, c):
    if s < c["warmup"]:
        return c["lr"] * (s + 1) / c["warmup"]
    if c["lr_schedule"] == "constant":
        return c["lr"]
    p = min(1.0, (s - c["warmup"]) / max(1, c["steps"] - c["warmup"]))
    return c["min_lr"] + 0.5 * (c["lr"] - c["min_lr"]) * (1 + math.cos(math.pi * p))


def initial_weights(path, c):
    """The step-0 checkpoint as ref_gpt2.GPT2's records (wte padded to the 128-multiple vocab)."""
    V, C = c["vocab_size"], c["n_embd"]
    Vp = (V + 127) // 128 * 128
    recs = {}
    with h5py.File(path, "r") as f:
        assert int(f["state"].attrs["step"]) == 0, f"{path} is not a step-0 checkpoint"
        for name, d in f["model"].items():
            a = d[()].astype(np.float32)
            if name == "wte.weight":
                a = np.concatenate([a, np.zeros((Vp - V, C), np.float32)])
            recs["p/" + name] = a.ravel()
    return recs, Vp


def train(c, recs, Vp, sampler, dtype):
    m = GPT2(c["n_layer"], c["n_head"], c["n_embd"], c["vocab_size"], Vp, c["seq_len"], recs, "p/").to(dtype)
    decay = [m.w(n) for n in m.names if m.w(n).dim() == 2]
    no_decay = [m.w(n) for n in m.names if m.w(n).dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    G, rows = c["global_batch"], []
    for s in range(c["steps"]):
        x, y = sampler.batch(s * G, G)
        opt.zero_grad(set_to_none=False)
        loss = m.loss(m(x), y)
        loss.backward()
        if c["grad_clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), c["grad_clip"]).item()
        else:
            norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in m.parameters()))
        lr = lr_at(s, c)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        rows.append({"step": s + 1, "loss": loss.item(), "lr": lr, "grad_norm": norm, "sample0": s * G})
    final = {"model": {}, "exp_avg": {}, "exp_avg_sq": {}}
    for n in m.names:
        p = m.w(n)
        final["model"][n] = p.detach().numpy().astype(np.float64)
        final["exp_avg"][n] = opt.state[p]["exp_avg"].numpy().astype(np.float64)
        final["exp_avg_sq"][n] = opt.state[p]["exp_avg_sq"].numpy().astype(np.float64)
    return rows, final


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def tensor_err(a, b, name, C):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if name.endswith("attn.c_attn.bias"):  # the key third: zero true gradient (tensors_match.py)
        keep = np.r_[0:C, 2 * C:3 * C]
        a, b = a[keep], b[keep]
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class Verdict:
    def __init__(self):
        self.fails = []

    def check(self, ok, msg):
        if not ok:
            self.fails.append(msg)
            if len(self.fails) <= 30:  # the first ones tell the story; the count says the rest
                print("FAIL: " + msg)


def compare_steps(v, run, got, ref, ref32, c):
    """Per step: lr, loss, grad_norm, the clipping decision, sample0; a table and worst errors."""
    v.check(len(got) == c["steps"], f"{run}: {len(got)} metric rows, want {c['steps']}")
    clip = c["grad_clip"]
    print(f"{run}: {'step':>4s} {'lr':>11s} {'loss':>10s} {'rel err':>9s} {'(t32)':>9s} "
          f"{'grad_norm':>10s} {'rel err':>9s} {'(t32)':>9s} clipped")
    worst = {"lr": 0.0, "loss": 0.0, "grad_norm": 0.0}
    for d, r, r32 in zip(got, ref, ref32):
        s = r["step"]
        v.check(d["step"] == s and d["sample0"] == r["sample0"] and d["samples"] == c["global_batch"],
                f"{run} step {s}: row step {d['step']} sample0 {d['sample0']} samples {d['samples']}, want "
                f"{s}, {r['sample0']}, {c['global_batch']}")
        e = {k: rel(d[k], r[k]) for k in worst}
        for k in worst:
            worst[k] = max(worst[k], e[k])
            v.check(e[k] <= TOL[k], f"{run} step {s}: {k} {d[k]!r} vs torch float64 {r[k]!r}: relative error "
                    f"{e[k]:.2e} > {TOL[k]:.0e}")
        bound, bound_ref = d["grad_norm"] > clip, r["grad_norm"] > clip
        v.check(bound == bound_ref, f"{run} step {s}: clipping {'bound' if bound else 'did not bind'} in dtrain, "
                f"not in torch (norms {d['grad_norm']} and {r['grad_norm']}, clip {clip})")
        print(f"{run}: {s:4d} {d['lr']:11.4e} {d['loss']:10.6f} {e['loss']:9.2e} {rel(r32['loss'], r['loss']):9.2e} "
              f"{d['grad_norm']:10.6f} {e['grad_norm']:9.2e} {rel(r32['grad_norm'], r['grad_norm']):9.2e} "
              f"{'yes' if bound else 'no'}")
    return worst


def compare_final(v, run, path, fin, fin32, c):
    worst = {}
    with h5py.File(path, "r") as f:
        st = f["state"].attrs
        v.check(int(st["step"]) == c["steps"] and int(st["data_pos"]) == c["steps"] * c["global_batch"],
                f"{run}: checkpoint step {st['step']} data_pos {st['data_pos']}, want {c['steps']} and "
                f"{c['steps'] * c['global_batch']}")
        for grp, h5grp in (("model", "model"), ("exp_avg", "optim/exp_avg"), ("exp_avg_sq", "optim/exp_avg_sq")):
            w, wn, w32 = 0.0, "", 0.0
            for n, ref in fin[grp].items():
                a = f[h5grp][n][()]
                if n == "wte.weight":
                    ref, r32 = ref[: c["vocab_size"]], fin32[grp][n][: c["vocab_size"]]
                else:
                    r32 = fin32[grp][n]
                e = tensor_err(a, ref.reshape(a.shape), n, c["n_embd"])
                w32 = max(w32, tensor_err(r32, ref, n, c["n_embd"]))
                if e > w:
                    w, wn = e, n
                v.check(e <= TOL[grp], f"{run}: final {h5grp}/{n}: ||dtrain - torch float64|| / ||torch float64|| = "
                        f"{e:.2e} > {TOL[grp]:.0e}")
            worst[grp] = (w, wn, w32)
    return worst


def main():
    argv = sys.argv[1:]
    if "--" not in argv or len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    ini, init, d, overrides, runs = argv[0], argv[1], argv[2], argv[3:cut], argv[cut + 1:]
    c = settings(ini, overrides)
    torch.set_num_threads(1)
    sampler = Sampler(c["train"], c["seq_len"], c["shuffle"], c["seed"])
    print(f"torch {torch.__version__}; data {c['train']}: {sampler.N} samples of T+1 = {c['seq_len'] + 1} tokens, "
          f"shuffle {c['shuffle']}, seed {c['seed']}; {c['steps']} steps of {c['global_batch']} sequences, "
          f"warmup {c['warmup']}, {c['lr_schedule']} lr {c['lr']} -> {c['min_lr']}, clip {c['grad_clip']}, "
          f"AdamW betas ({c['beta1']}, {c['beta2']}) eps {c['eps']} wd {c['weight_decay']} (2-D tensors)")
    recs, Vp = initial_weights(init, c)
    ref, fin = train(c, recs, Vp, sampler, torch.float64)
    ref32, fin32 = train(c, recs, Vp, sampler, torch.float32)
    v = Verdict()
    nclip = sum(r["grad_norm"] > c["grad_clip"] for r in ref)
    v.check(0 < nclip < c["steps"], f"clipping binds on {nclip} of {c['steps']} reference steps: want some, not all")
    margin = min(rel(r["grad_norm"], c["grad_clip"]) for r in ref)
    v.check(margin >= CLIP_MARGIN, f"a reference grad norm is within {margin:.1e} of the clip: choose another clip")
    summary = []
    for run in runs:
        got = [json.loads(line) for line in open(os.path.join(d, run + ".jsonl"))]
        ws = compare_steps(v, run, got, ref, ref32, c)
        ck = os.path.join(d, run, f"ckpt_{c['steps']:08d}.h5")
        wf = compare_final(v, run, ck, fin, fin32, c)
        summary.append((run, ws, wf))
    print()
    print(f"worst errors vs torch float64 (limits: {', '.join(f'{k} {t:.0e}' for k, t in TOL.items())}); "
          f"clipping bound on {nclip}/{c['steps']} steps, norms at least {margin:.1e} (relative) from the clip")
    for run, ws, wf in summary:
        print(f"  {run}: lr {ws['lr']:.1e}, loss {ws['loss']:.2e}, grad_norm {ws['grad_norm']:.2e}; final "
              + ", ".join(f"{g} {w:.2e} ({n}; torch float32 {w32:.2e})" for g, (w, n, w32) in wf.items()))
    if v.fails:
        print(f"ref_trainer.py: FAIL ({len(v.fails)} checks failed, the first {min(30, len(v.fails))} printed above)",
              file=sys.stderr)
        return 1
    print("ref_trainer.py: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
