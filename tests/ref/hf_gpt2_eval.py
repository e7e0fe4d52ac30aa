#!/usr/bin/python3
"""Independent check of a dtrain checkpoint: open it with h5py, check that every /model tensor has
the Hugging Face GPT2LMHeadModel name and shape, load the tensors by those names into a PyTorch
GPT-2 (hf_gpt2.py, HF's Conv1D convention y = x @ W + b, W of shape (in, out)), and print
the mean loss over the first N batches of a shard, batch j = tokens [j*B*T, j*B*T + B*T + 1).

usage: hf_gpt2_eval.py CKPT SHARD B T N
"""
import os, sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2  # noqa: E402

torch.set_num_threads(2)
ckpt, shard, B, T, N = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
m, L, C, V, NH = hf_gpt2.load(ckpt)
print(f"h5py: {len(m)} /model tensors with Hugging Face GPT-2 names and shapes (L={L}, C={C}, V={V})")
if NH is None:
    NH = int(sys.argv[6]) if len(sys.argv) > 6 else 4
forward = lambda idx: hf_gpt2.forward(m, L, C, NH, idx)


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
