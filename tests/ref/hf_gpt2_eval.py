#!/usr/bin/python3
"""Independent check of a dtrain checkpoint: open it with h5py, check that every /model tensor has
the Hugging Face GPT2LMHeadModel name and shape, load the tensors by those names into a PyTorch
GPT-2 written here with HF's Conv1D convention (y = x @ W + b, W of shape (in, out)), and print
the mean loss over the first N batches of a shard, batch j = tokens [j*B*T, j*B*T + B*T + 1).

usage: hf_gpt2_eval.py CKPT SHARD B T N
"""
import math, sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(2)
ckpt, shard, B, T, N = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
f = h5py.File(ckpt, "r")
m = {k: torch.from_numpy(f["model"][k][()]) for k in f["model"]}
V, C = m["wte.weight"].shape
L = sum(1 for k in m if k.endswith(".ln_1.weight"))
NH = int(f.attrs["n_head"]) if "n_head" in f.attrs else None
expect = {"wte.weight": (V, C), "wpe.weight": (m["wpe.weight"].shape[0], C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
for i in range(L):
    h = f"h.{i}."
    expect.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (C, 3 * C),
                   h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                   h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (C, 4 * C),
                   h + "mlp.c_fc.bias": (4 * C,), h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
assert set(m) == set(expect), f"names differ: {sorted(set(m) ^ set(expect))}"
for k, s in expect.items():
    assert tuple(m[k].shape) == s, f"{k}: shape {tuple(m[k].shape)} != HF {s}"
print(f"h5py: {len(m)} /model tensors with Hugging Face GPT-2 names and shapes (L={L}, C={C}, V={V})")
if NH is None:
    NH = int(sys.argv[6]) if len(sys.argv) > 6 else 4


def ln(x, w, b):
    return F.layer_norm(x, (C,), w, b, 1e-5)


def forward(idx):
    Bn, Tn = idx.shape
    x = m["wte.weight"][idx] + m["wpe.weight"][:Tn]
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    for i in range(L):
        p = lambda n: m[f"h.{i}.{n}"]
        a = ln(x, p("ln_1.weight"), p("ln_1.bias")) @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = (t.view(Bn, Tn, NH, C // NH).transpose(1, 2) for t in a.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + y.transpose(1, 2).reshape(Bn, Tn, C) @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        hdn = F.gelu(ln(x, p("ln_2.weight"), p("ln_2.bias")) @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"),
                     approximate="tanh")
        x = x + hdn @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    return ln(x, m["ln_f.weight"], m["ln_f.bias"]) @ m["wte.weight"].t()


hdr = np.fromfile(shard, dtype="<i4", count=256)
assert hdr[0] == 20240520 and hdr[1] == 1
tok = np.fromfile(shard, dtype="<u2", offset=1024).astype(np.int64)
losses = []
with torch.no_grad():
    for j in range(N):
        buf = torch.from_numpy(tok[j * B * T: j * B * T + B * T + 1])
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        losses.append(F.cross_entropy(forward(x).view(-1, V), y.reshape(-1)).item())
print(f"pytorch loss {sum(losses) / N:.9f}")
