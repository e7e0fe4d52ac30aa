#!/usr/bin/python3
"""Independent check of `dtrain generate --temperature 0`: every generated token must be the argmax
of a float64 PyTorch forward (hf_gpt2.py) of the whole sequence before it, the full forward that a
key/value cache saves. Where the reference's best logit beats the generated token's by less than
TOL (relative to the row's largest |logit|), the two are a tie within float32 rounding and the
run may go either way; after such a position the rest of that run is not compared.

usage: greedy_check.py CKPT NH OUTPUT...   (each OUTPUT has dtrain's 'tokens: PROMPT | NEW' line)
"""
import os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2  # noqa: E402

TOL = 1e-4
torch.set_num_threads(2)
ckpt, NH, outs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
m, L, C, V, nh = hf_gpt2.load(ckpt, torch.float64)
NH = nh or NH
bad = 0
for out in outs:
    line = [l for l in open(out) if l.startswith("tokens:")][-1]
    prompt, new = line[len("tokens:"):].split("|")
    prompt, new = [int(t) for t in prompt.split()], [int(t) for t in new.split()]
    seq = torch.tensor([prompt + new])
    with torch.no_grad():
        z = hf_gpt2.forward(m, L, C, NH, seq)[0]
    checked, tie, worst = 0, None, 0.0
    for i, tok in enumerate(new):
        row = z[len(prompt) + i - 1]
        gap = (row.max() - row[tok]).item() / row.abs().max().item()
        worst = max(worst, gap)
        if gap == 0.0:
            checked += 1
            continue
        if gap < TOL:
            tie = i
            break
        print(f"FAIL {out}: new token {i} is {tok}, the reference's argmax is {row.argmax().item()} "
              f"(ahead by {gap:.3g} relative)")
        bad += 1
        break
    note = f"; a tie within {TOL} at new token {tie}, not compared after it" if tie is not None else ""
    print(f"{out}: {checked} of {len(new)} greedy tokens are the float64 reference's argmax{note}")
sys.exit(1 if bad else 0)
