#!/usr/bin/env python3
"""PyTorch's GPT-2 on one GPU, the peer of dtrain's GPU step (bench/gpu_step.sh): the same model
(GPT-2 124M by default: 12 layers, 12 heads, 768 channels, vocabulary 50257 padded to 50304,
tied lm_head, GELU tanh), AdamW (fused), batch and sequence length, random tokens. Attention is
F.scaled_dot_product_attention(is_causal=True); fp32 runs with TF32 off (the matmuls dtrain's
fp32 runs), tf32 the same with allow_tf32 on (dtrain's system.tf32 = true); bf16 under torch.autocast. Times steps with CUDA events and prints, per mode, one
line `torch mode=... prec=... B=.. T=.. step_ms=<median> tok_s=.. mfu=.. peak_mib=..`.

usage: python3 bench/torch_gpt2_gpu.py [--batch 16] [--seq 1024] [--steps 20] [--warmup 5]
           [--prec fp32,tf32,bf16] [--compile] [--layers 12 --heads 12 --embd 768]
MFU is against the dense peak of the GPU's name (H100 SXM/H200: 989 TFLOP/s bf16, 495 tf32, 67
fp32 non tensor-core; a lead from the datasheet); FLOPs per token 6(12 L C^2 + C Vp) + 12 L T C, as dtrain.
Needs PyTorch >= 2.0 and a CUDA GPU; never used by dtrain itself.
"""
import argparse, math, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, C, NH):
        super().__init__()
        s.NH = NH
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.c_attn, s.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.c_fc, s.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.NH, C // s.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, L, NH, C, Vp, T):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(Vp, C), nn.Embedding(T, C)
        s.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)
        s.apply(lambda m: nn.init.normal_(m.weight, std=0.02) if isinstance(m, (nn.Linear, nn.Embedding)) else None)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.h:
            x = b(x)
        logits = F.linear(s.ln_f(x), s.wte.weight)  # tied lm_head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


def peak_tflops(name, prec):
    n = name.upper()
    if "H100" in n or "H200" in n or "GH200" in n:
        return {"bf16": 989.0, "tf32": 495.0}.get(prec, 67.0)
    if "A100" in n:
        return {"bf16": 312.0, "tf32": 156.0}.get(prec, 19.5)
    return float("nan")


def run(a, prec, compiled):
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"  # fp32 storage either way
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    V, Vp = 50257, 50304
    model = GPT(a.layers, a.heads, a.embd, Vp, a.seq).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if compiled else model
    idx = torch.randint(0, V, (a.batch, a.seq), device="cuda")
    tgt = torch.randint(0, V, (a.batch, a.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(a.warmup + a.steps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        e1.record()
        e1.synchronize()
        if i >= a.warmup:
            times.append(e0.elapsed_time(e1))
    ms = statistics.median(times)
    L, C, T = a.layers, a.embd, a.seq
    flops_tok = 6 * (12 * L * C * C + C * Vp) + 12 * L * T * C
    tok_s = a.batch * T / (ms / 1e3)
    mfu = flops_tok * tok_s / 1e12 / peak_tflops(torch.cuda.get_device_name(), prec)
    mode = "compile-sdpa" if compiled else "eager-sdpa"
    print(f"torch mode={mode} prec={prec} B={a.batch} T={T} step_ms={ms:.2f} tok_s={tok_s:.0f} mfu={mfu:.3f} "
          f"peak_mib={torch.cuda.max_memory_allocated() / 2**20:.0f} loss={loss.item():.4f} "
          f"(median of {len(times)}, min {min(times):.2f}, max {max(times):.2f})", flush=True)
    del model, opt, step_model
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--prec", default="fp32,tf32,bf16")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch: no CUDA device", flush=True)
        return 77
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    for prec in a.prec.split(","):
        run(a, prec, False)
        if a.compile:
            t0 = time.time()
            run(a, prec, True)
            print(f"# torch.compile {prec}: {time.time() - t0:.0f} s including compilation", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
