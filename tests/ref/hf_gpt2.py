"""A dtrain checkpoint as a Hugging Face-named PyTorch GPT-2 (written here, HF's Conv1D convention
y = x @ W + b with W of shape (in, out)): load() reads /model with h5py and checks every tensor's
HF name and shape; forward() runs the model. Used by hf_gpt2_eval.py and greedy_check.py."""
import math

import h5py
import torch
import torch.nn.functional as F


def load(ckpt, dtype=torch.float32):
    """(tensors by HF name, L, C, V, NH or None) of a checkpoint, names and shapes checked."""
    f = h5py.File(ckpt, "r")
    m = {k: torch.from_numpy(f["model"][k][()]).to(dtype) for k in f["model"]}
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
    return m, L, C, V, NH


def forward(m, L, C, NH, idx):
    """Logits (B, T, V) of token ids idx (B, T)."""
    ln = lambda x, w, b: F.layer_norm(x, (C,), w, b, 1e-5)
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
