#!/usr/bin/python3
"""PyTorch DDP (gloo) step time of a CNN, for bench/cnn_ddp.sh: tests/ref/ref_cnn_model.py's model
(torchvision's structure, CIFAR stem), random 3x32x32 images, SGD (momentum 0.9, weight decay
5e-4), fp32, batch norm per rank (torch 1.13's SyncBatchNorm works on GPU modules only; dtrain
synchronises it, one small all-reduce per batch norm more), in RANKS processes of THREADS threads each, every rank with its own batch of BATCH
images (the per-rank batch; RANKS = 1: plain PyTorch, no DDP). Rank 0 prints the median step time
of the steps after warm-up as `RESULT torch-cnn-ddp ranks=R threads=T batch=B step_ms=...`.
A benchmark only; dtrain never runs Python.

usage: /usr/bin/python3 bench/torch_cnn_ddp.py --arch resnet50 --width 64 --ranks 2 --threads 1 --batch 16 \
           --steps 5 --warmup 2
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from ref_cnn_model import BasicBlock, Bottleneck, ResNet, SimpleCNN  # noqa: E402
from torch_launch import launch  # noqa: E402


def worker(rank, a):
    torch.set_num_threads(a.threads)
    if a.ranks > 1:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)
    if a.arch == "cnn":
        m = SimpleCNN(3, 32, 32, 10, a.width, 128)
    else:
        m = ResNet(*((BasicBlock, [2, 2, 2, 2]) if a.arch == "resnet18" else (Bottleneck, [3, 4, 6, 3])), 3, 10, a.width)
    if a.ranks > 1:  # (torch 1.13's SyncBatchNorm runs on GPU modules only: batch norm stays per rank here)
        m = torch.nn.parallel.DistributedDataParallel(m)  # default 25 MB buckets, overlapped with backward
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(a.batch, 3, 32, 32, generator=g), torch.randint(0, 10, (a.batch,), generator=g)
    m.train()
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        ms = statistics.median(times) * 1e3
        print(f"RESULT torch-cnn-ddp ranks={a.ranks} threads={a.threads} batch={a.batch} step_ms={ms:.1f} "
              f"images_per_s={a.ranks * a.batch / ms * 1e3:.1f} (torch {torch.__version__})", flush=True)
    if a.ranks > 1:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet50")
    for k, v in dict(width=64, ranks=2, threads=1, batch=16, steps=5, warmup=2).items():
        p.add_argument("--" + k, type=int, default=v)
    a = p.parse_args()
    launch(worker, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
