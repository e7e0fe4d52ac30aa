#!/usr/bin/env python3
"""Independent PyTorch GPT-2 reference for dtrain's CPU backend.

Reads the dump written by tests/ref_dump (records: char name[64], int64 n, float32 data[n]),
builds the same GPT-2 from torch ops in float32 (own nn.Module, F.gelu(approximate='tanh'),
tied lm_head over the padded vocab, cross-entropy over the true V), and compares:
  logits, loss and every parameter gradient of one forward+backward; the parameters after 3
  clipped AdamW steps on those same gradients (optimizer arithmetic alone); then the losses, grad norms
  and lrs of 10 AdamW steps (torch.optim.AdamW with decay / no-decay groups, clip_grad_norm_,
  warmup+cosine lr computed here) and the final parameters.
Error per tensor: max|a - b| / max(max|b|, 1e-30)  (b = torch, i.e. relative to the reference
tensor's largest magnitude). Everything except the final parameters must be <= TOL = 1e-5 against
torch float32. Final parameters: see the comment in main (compared against a float64 torch run,
limit max(TOL, 3 x torch-float32's own error)). Exit 1 on any failure.
Usage: ref_gpt2.py DUMP.bin [threads]
"""
import math
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the shell wrapper turns this into a test failure
    print(f"ref_gpt2.py: FAIL: {sys.executable} lacks torch/numpy ({e}); set REF_PYTHON", file=sys.stderr)
    sys.exit(1)

TOL = 1e-5


def read_dump(path):
    recs = {}
    with open(path, "rb") as f:
        while True:
            hdr = f.read(64)
            if not hdr:
                break
            name = hdr.split(b"\0", 1)[0].decode()
            (n,) = struct.unpack("<q", f.read(8))
            recs[name] = np.frombuffer(f.read(4 * n), dtype=np.float32).copy()
    return recs


# 2-D block weights are Hugging Face Conv1D's (in, out), as dtrain stores them: y = x @ W + b
BLOCK = [("ln_1.weight", "C"), ("ln_1.bias", "C"), ("attn.c_attn.weight", (1, 3)), ("attn.c_attn.bias", "3C"),
         ("attn.c_proj.weight", (1, 1)), ("attn.c_proj.bias", "C"), ("ln_2.weight", "C"), ("ln_2.bias", "C"),
         ("mlp.c_fc.weight", (1, 4)), ("mlp.c_fc.bias", "4C"), ("mlp.c_proj.weight", (4, 1)), ("mlp.c_proj.bias", "C")]


def conv1d(x, w, b):
    return x @ w + b


class GPT2(nn.Module):
    def __init__(self, L, NH, C, V, Vp, T, recs, prefix):
        super().__init__()
        self.L, self.NH, self.C, self.V, self.Vp, self.T = L, NH, C, V, Vp, T
        shapes = {"wte.weight": (Vp, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
        for l in range(L):
            for name, s in BLOCK:
                if isinstance(s, tuple):
                    shape = (s[0] * C, s[1] * C)
                else:
                    shape = ({"C": 1, "3C": 3, "4C": 4}[s] * C,)
                shapes[f"h.{l}.{name}"] = shape
        self.names = list(shapes)
        self.p = nn.ParameterDict()
        for name, shape in shapes.items():
            data = torch.from_numpy(recs[prefix + name].reshape(shape))
            self.p[name.replace(".", "__")] = nn.Parameter(data.clone())
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        self.register_buffer("mask", mask)

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def forward(self, idx):
        B, T = idx.shape
        C, NH = self.C, self.NH
        hs = C // NH
        x = self.w("wte.weight")[idx] + self.w("wpe.weight")[:T]
        for l in range(self.L):
            g = lambda n: self.w(f"h.{l}.{n}")
            h = F.layer_norm(x, (C,), g("ln_1.weight"), g("ln_1.bias"), eps=1e-5)
            qkv = conv1d(h, g("attn.c_attn.weight"), g("attn.c_attn.bias"))
            q, k, v = qkv.split(C, dim=2)
            q = q.view(B, T, NH, hs).transpose(1, 2)
            k = k.view(B, T, NH, hs).transpose(1, 2)
            v = v.view(B, T, NH, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + conv1d(y, g("attn.c_proj.weight"), g("attn.c_proj.bias"))
            h = F.layer_norm(x, (C,), g("ln_2.weight"), g("ln_2.bias"), eps=1e-5)
            h = F.gelu(conv1d(h, g("mlp.c_fc.weight"), g("mlp.c_fc.bias")), approximate="tanh")
            x = x + conv1d(h, g("mlp.c_proj.weight"), g("mlp.c_proj.bias"))
        x = F.layer_norm(x, (C,), self.w("ln_f.weight"), self.w("ln_f.bias"), eps=1e-5)
        return x @ self.w("wte.weight").t()  # (B, T, Vp), tied lm_head

    def loss(self, logits, targets):
        return F.cross_entropy(logits[..., : self.V].reshape(-1, self.V), targets.reshape(-1))


rows = []


def compare(what, a, b):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        rows.append((what, float("inf"), 0.0))
        return
    denom = max(np.abs(b).max(), 1e-30)
    rows.append((what, float(np.abs(a - b).max() / denom), float(denom)))


def lr_at(step, lr, min_lr, warmup, steps):
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))


def main():
    if len(sys.argv) < 2:
        print("usage: ref_gpt2.py DUMP.bin [threads]", file=sys.stderr)
        return 2
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(threads)
    r = read_dump(sys.argv[1])
    L, NH, C, V, Vp, T, B, STEPS = (int(x) for x in r["dims"])
    lr, min_lr, warmup, wd, b1, b2, eps, clip = (float(x) for x in r["hparams"])
    warmup = int(warmup)
    print(f"torch {torch.__version__}, {threads} threads, float32; L={L} NH={NH} C={C} V={V} Vp={Vp} T={T} B={B}")

    model = GPT2(L, NH, C, V, Vp, T, r, "param/")
    idx = torch.from_numpy(r["inputs"].astype(np.int64).reshape(B, T))
    tgt = torch.from_numpy(r["targets"].astype(np.int64).reshape(B, T))
    logits = model(idx)
    loss = model.loss(logits, tgt)
    loss.backward()
    compare("logits", r["logits"], logits[..., :V].detach().numpy())
    compare("loss", r["loss"], [loss.item()])
    for n in model.names:
        compare("grad " + n, r["grad/" + n], model.w(n).grad.numpy())

    # The optimizer alone: C's gradients, clip_grad_norm_ once, 3 AdamW steps (t = 1..3) with them.
    mo = GPT2(L, NH, C, V, Vp, T, r, "param/")
    for n in mo.names:
        mo.w(n).grad = torch.from_numpy(r["grad/" + n].reshape(mo.w(n).shape).copy())
    onorm = torch.nn.utils.clip_grad_norm_(mo.parameters(), clip).item()
    dec = [mo.w(n) for n in mo.names if mo.w(n).dim() == 2]
    nodec = [mo.w(n) for n in mo.names if mo.w(n).dim() == 1]
    oopt = torch.optim.AdamW([{"params": dec, "weight_decay": wd}, {"params": nodec, "weight_decay": 0.0}],
                             lr=lr, betas=(b1, b2), eps=eps)
    for _ in range(3):
        oopt.step()
    compare("optimizer-only: grad norm", r["opt_norm"], [onorm])
    for n in mo.names:
        compare("optimizer-only: 3 steps " + n, r["opt3/" + n], mo.w(n).detach().numpy())

    # 10 AdamW steps on the dumped batches, in float32 (the comparison) and float64 (the noise yardstick)
    sin = torch.from_numpy(r["step_inputs"].astype(np.int64).reshape(STEPS, B, T))
    stg = torch.from_numpy(r["step_targets"].astype(np.int64).reshape(STEPS, B, T))

    def train(dtype):
        m = GPT2(L, NH, C, V, Vp, T, r, "param/").to(dtype)
        decay = [m.w(n) for n in m.names if m.w(n).dim() == 2]
        no_decay = [m.w(n) for n in m.names if m.w(n).dim() == 1]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=lr, betas=(b1, b2), eps=eps)
        losses, norms, lrs, clipped = [], [], [], []
        for s in range(STEPS):
            opt.zero_grad(set_to_none=False)
            l = m.loss(m(sin[s]), stg[s])
            l.backward()
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), clip).item()
            cur = lr_at(s, lr, min_lr, warmup, STEPS)
            for g in opt.param_groups:
                g["lr"] = cur
            opt.step()
            losses.append(l.item())
            norms.append(norm)
            lrs.append(cur)
            clipped.append(1.0 if clip / (norm + 1e-6) < 1.0 else 0.0)
            print(f"torch {str(dtype)[6:]} step {s:2d} loss {l.item():.6f} grad_norm {norm:.6f} lr {cur:.6e} "
                  f"clipped {'yes' if clipped[-1] else 'no'}")
        return m, losses, norms, lrs, clipped

    m32, losses, norms, lrs, clipped = train(torch.float32)
    m64 = train(torch.float64)[0]
    compare("step losses (10)", r["step_loss"], losses)
    compare("step grad norms (10)", r["step_norm"], norms)
    compare("step lr (10)", r["step_lr"], lrs)
    if list(r["step_clipped"]) != clipped:
        rows.append(("clipping decisions", float("inf"), 0.0))
    if not any(clipped) or all(clipped):
        print("ref_gpt2.py: FAIL: clipping should trigger on some steps but not all", file=sys.stderr)
        return 1
    # Final parameters. AdamW divides by sqrt(v): for elements whose gradient is at float32
    # rounding level (the key part of c_attn.bias has an exactly-zero true gradient; some weights
    # get ~1e-8 gradients by cancellation) it turns rounding noise into updates of up to ~lr, so
    # two correct fp32 implementations (C and torch fp32) differ there by more than 1e-5. The
    # criterion is therefore against torch float64: C must be within TOL of float64 or at most
    # 3x as far from it as torch float32 itself is (same order: both are amplified fp32 rounding).
    # Measured as ||a-b|| / ||b|| per tensor (2-norm, as ddp_equiv.sh does): the worst single
    # element is one of those amplified ones, so a max-norm criterion measured which of two
    # correct fp32 roundings an element happened to take (it flipped between machines).
    # A real bug (bias correction, decay on biases, clipping, lr) gives errors of 1e-3 and more.
    # The key third of attn.c_attn.bias is left out (as tests/ref/tensors_match.py does): its true
    # gradient is exactly zero (q.b_k shifts every score of a query alike), so after 10 steps it is
    # amplified rounding noise and nothing else; its numbers are printed for information. Its
    # step-1 gradient is compared with everything else above.
    final_rows, key_rows = [], []
    for n in model.names:
        c = r["final/" + n].astype(np.float64)
        b32 = m32.w(n).detach().numpy().astype(np.float64).ravel()
        b64 = m64.w(n).detach().numpy().ravel()
        if n.endswith("attn.c_attn.bias"):
            C, k = model.C, slice(model.C, 2 * model.C)
            den = max(np.linalg.norm(b64), 1e-30)
            key_rows.append((n, np.linalg.norm(c[k] - b64[k]) / den, np.linalg.norm(b32[k] - b64[k]) / den))
            qv = np.r_[0:C, 2 * C:3 * C]
            c, b32, b64 = c[qv], b32[qv], b64[qv]
        den = max(np.linalg.norm(b64), 1e-30)
        e_c64 = np.linalg.norm(c - b64) / den
        e_3264 = np.linalg.norm(b32 - b64) / den
        e_c32 = np.linalg.norm(c - b32) / den
        final_rows.append((n, e_c32, e_3264, e_c64, max(TOL, 3 * e_3264)))

    print(f"{'tensor':50s} {'max|a-b|/max|b|':>16s} {'max|b|':>12s}")
    worst = 0.0
    for what, err, den in rows:
        flag = "" if err <= TOL else "  FAIL"
        print(f"{what:50s} {err:16.3e} {den:12.4e}{flag}")
        worst = max(worst, err)
    print(f"worst relative error {worst:.3e} (tolerance {TOL:.0e}) over {len(rows)} comparisons; "
          f"clipped on {int(sum(clipped))}/{STEPS} steps")
    if worst > TOL:
        print("ref_gpt2.py: FAIL", file=sys.stderr)
        return 1
    print()
    print(f"{'final parameters after 10 steps':36s} {'C vs t32':>10s} {'t32 vs t64':>11s} {'C vs t64':>10s} {'limit':>10s}")
    fail = False
    for n, e_c32, e_3264, e_c64, lim in final_rows:
        bad = e_c64 > lim
        fail |= bad
        print(f"{'final ' + n:36s} {e_c32:10.3e} {e_3264:11.3e} {e_c64:10.3e} {lim:10.3e}{'  FAIL' if bad else ''}")
    print("(errors: ||a-b|| / ||float64 final|| per tensor; limit = max(1e-5, 3 * (t32 vs t64));"
          " attn.c_attn.bias: its q and v thirds)")
    for n, e_c64, e_3264 in key_rows:
        print(f"  not compared: {n} key third, C vs t64 {e_c64:.3e}, t32 vs t64 {e_3264:.3e} (zero true gradient)")
    if fail:
        print("ref_gpt2.py: FAIL (final parameters)", file=sys.stderr)
        return 1
    print("ref_gpt2.py: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
