"""Start the PyTorch DDP benchmarks' workers (bench/torch_ddp.py, bench/torch_cnn_ddp.py)."""
import os

import torch


def launch(worker, a):
    """worker(rank, a) in this process when a.ranks == 1, else in a.ranks spawned processes that
    meet at a local rendezvous chosen once here (a port from this process's id)."""
    if a.ranks == 1:
        worker(0, a)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    torch.multiprocessing.spawn(worker, args=(a,), nprocs=a.ranks)
