#!/usr/bin/python3
"""PyTorch reference timing: train a GPT-2 of the given shape (fp32, AdamW, same FLOPs formula
as dtrain) on random tokens and print per-step median time and GFLOP/s. For side-by-side
benchmarks only; dtrain never runs Python.

usage: /usr/bin/python3 bench/torch_gpt2.py --layers 12 --heads 12 --embd 768 --vocab 50257 \
           --batch 4 --seq 256 --threads 2 --steps 5 --warmup 2
"""
import argparse, math, resource, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, C, NH):
        super().__init__()
        s.NH = NH
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.c_attn, s.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.c_fc, s.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.NH, C // s.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // s.NH)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + s.c_proj(y)
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, L, NH, C, V, T):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.h:
            x = b(x)
        logits = s.ln_f(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(layers=12, heads=12, embd=768, vocab=50257, batch=4, seq=256, threads=2, steps=5,
                     warmup=2).items():
        p.add_argument("--" + k, type=int, default=v)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    Vp = (a.vocab + 127) // 128 * 128
    m = GPT(a.layers, a.heads, a.embd, Vp, a.seq)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95))
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = m(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    L, C, T = a.layers, a.embd, a.seq
    flops = 6 * a.batch * T * (12 * L * C * C + C * Vp) + 12 * L * T * C * a.batch * T
    med = statistics.median(times)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"torch {torch.__version__} threads={a.threads} step_ms={med * 1e3:.1f} "
          f"gflops={flops / med * 1e-9:.1f} peak_rss_mb={rss:.0f}")


if __name__ == "__main__":
    main()
