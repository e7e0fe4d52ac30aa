#!/usr/bin/python3
"""PyTorch timing for bench/cnn_step.sh: the same CNN (tests/ref/ref_cnn_model.py's modules:
torchvision's structure and names, the CIFAR stem), batch, random images and SGD (momentum 0.9,
weight decay 5e-4) as bench/cnn_step; forward + backward + step, fp32, torch.set_num_threads(T),
oneDNN (MKL-DNN) convolutions as Debian's torch 1.13 is built. Prints per-step times and a RESULT
line with the median. A benchmark only; dtrain never runs Python.
usage: /usr/bin/python3 bench/torch_cnn.py ARCH BATCH C,H,W WIDTH CLASSES HIDDEN STEPS WARMUP THREADS [DEVICE]
DEVICE cuda (scripts/gpu-check.sh's classifiers stage): the same on the GPU, fp32 with TF32 off in
cuDNN and cuBLAS (dtrain's fp32), each step timed to a torch.cuda.synchronize().
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from ref_cnn_model import BasicBlock, Bottleneck, ResNet, SimpleCNN  # noqa: E402

arch, B, img, width, classes, hidden, steps, warmup, threads = sys.argv[1:10]
B, width, classes, hidden, steps, warmup, threads = map(int, (B, width, classes, hidden, steps, warmup, threads))
C, H, W = map(int, img.split(","))
dev = torch.device(sys.argv[10] if len(sys.argv) > 10 else "cpu")
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
torch.set_num_threads(threads)
torch.manual_seed(0)
if arch == "cnn":
    model = SimpleCNN(C, H, W, classes, width, hidden)
else:
    model = ResNet(BasicBlock, [2, 2, 2, 2], C, classes, width) if arch == "resnet18" else \
        ResNet(Bottleneck, [3, 4, 6, 3], C, classes, width)
model = model.to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
x, y = torch.randn(B, C, H, W, device=dev), torch.randint(0, classes, (B,), device=dev)
model.train()
times = []
for s in range(warmup + steps):
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    sync()
    dt = time.perf_counter() - t0
    print(f"# torch step {s + 1}: loss {loss.item():.4f} {1e3 * dt:.1f} ms")
    if s >= warmup:
        times.append(dt)
ms = 1e3 * statistics.median(times)
print(f"RESULT torch {arch} batch={B} threads={threads} step_ms={ms:.1f} images_per_s={B / ms * 1e3:.1f} "
      f"(torch {torch.__version__}, {dev.type}, mkldnn {torch.backends.mkldnn.is_available()})")
