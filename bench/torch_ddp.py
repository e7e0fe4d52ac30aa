#!/usr/bin/python3
"""PyTorch DDP (gloo) step time, for bench/ddp_overlap.sh: the GPT-2 of bench/torch_gpt2.py on
random tokens, fp32, AdamW, clipping, in RANKS processes of THREADS threads each with the global
batch split between them (RANKS = 1: plain PyTorch, no DDP). Rank 0 prints the median step time of
the steps after warm-up as `torch-ddp ranks=R threads=T step_ms=...`.

usage: /usr/bin/python3 bench/torch_ddp.py --ranks 2 --threads 1 --layers 12 --heads 12 --embd 768 \
           --vocab 50257 --batch 4 --seq 256 --steps 5 --warmup 2
"""
import argparse, os, statistics, sys, time

sys.argv.append("--single")  # torch_gpt2.py defines its model over torch only in a measuring process
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as tg  # noqa: E402
from torch_launch import launch  # noqa: E402
sys.argv.pop()
torch = tg.torch


def worker(rank, a):
    torch.set_num_threads(a.threads)
    if a.ranks > 1:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)
    Vp = (a.vocab + 127) // 128 * 128
    m = tg.GPT(a.layers, a.heads, a.embd, Vp, a.seq)
    tg.gpt2_init(m, a.layers)
    if a.ranks > 1:
        m = torch.nn.parallel.DistributedDataParallel(m)  # default 25 MB buckets, overlapped with backward
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(rank)
    B = a.batch // a.ranks
    idx = torch.randint(0, a.vocab, (B, a.seq), generator=g)
    tgt = torch.randint(0, a.vocab, (B, a.seq), generator=g)
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        m(idx, tgt).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"torch-ddp ranks={a.ranks} threads={a.threads} step_ms={statistics.median(times) * 1e3:.1f}", flush=True)
    if a.ranks > 1:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(ranks=2, threads=1, layers=12, heads=12, embd=768, vocab=50257, batch=4, seq=256, steps=5,
                     warmup=2).items():
        p.add_argument("--" + k, type=int, default=v)
    a = p.parse_args()
    launch(worker, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
