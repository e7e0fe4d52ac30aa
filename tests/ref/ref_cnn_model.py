#!/usr/bin/env python3
"""PyTorch reference for dtrain's CNN models (src/model/cnn.h): the seed's SimpleCNN with batch
norm, and ResNet-18 / ResNet-50 with the CIFAR stem, written here from torch.nn modules in
torchvision's structure and parameter names (torchvision itself is not installed).

Reads the dump of tests/cnn_model_dump (records: char name[64], int64 n, float32 data[n]) and
checks every training step against float64 PyTorch *from dtrain's own state at that step*
(teacher forcing): the parameters q{s}/ and running statistics c{s}/ loaded by name (conv weights
reshaped to (OC, C, KH, KW)), batch norm in training mode (momentum 0.1) on the step's batch:
  - the loss and the gradient of every parameter (g{s}/), and the running statistics after the
    forward (c{s+1}/);
  - the update: torch.optim.SGD (momentum 0.9, weight decay 5e-4, lr 0.05) or torch.optim.AdamW
    (lr 1e-3, weight decay 0.01), one parameter group, fed dtrain's gradients from q0/, must give
    dtrain's parameters q{s+1}/ after every step;
  - evaluation mode after the last step on the first batch: loss, accuracy and how many images
    are predicted as each class;
  - the dump's parameter count equals the torch model's.
Teacher forcing, not a free replay: ReLU networks are not smooth, and two float32 runs that differ
in summation order leave each other for good when a pre-activation near 0 lands on the other
side (seen: ResNet-18, B=4, a 5% gradient difference at step 3 between two correct builds).
Error per tensor: max|a - b| / max(max|b|, 1e-30). Every check within TOL = 1e-5.
Usage: ref_cnn_model.py DUMP.bin
"""
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"ref_cnn_model.py: FAIL: {sys.executable} lacks torch/numpy ({e}); set REF_PYTHON", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump import err, read_dump  # noqa: E402

TOL = 1e-5
ARCHS = {0: "cnn", 1: "resnet18", 2: "resnet50"}


class SimpleCNN(nn.Module):
    def __init__(self, C, H, W, classes, width, hidden):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(C, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, 2 * width, 3, 1, 1, bias=False), nn.BatchNorm2d(2 * width)
        self.fc1 = nn.Linear(2 * width * (H // 4) * (W // 4), hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inp, planes, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False), nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inp != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inp, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inp, planes, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(inp, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, 4 * planes, 1, bias=False), nn.BatchNorm2d(4 * planes)
        self.downsample = None
        if stride != 1 or inp != 4 * planes:
            self.downsample = nn.Sequential(nn.Conv2d(inp, 4 * planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(4 * planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn3(self.conv3(F.relu(self.bn2(self.conv2(out)))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """torchvision's ResNet with the CIFAR stem: conv 3x3 stride 1, no max pooling."""

    def __init__(self, block, layers, C, classes, width):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(C, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width)
        inp = width
        for i, n in enumerate(layers):
            blocks = []
            for k in range(n):
                blocks.append(block(inp, width << i, 2 if k == 0 and i > 0 else 1))
                inp = (width << i) * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(inp, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean(dim=(2, 3)))


def build(meta):
    arch, C, H, W, classes, width, hidden = (int(v) for v in meta[:7])
    if ARCHS[arch] == "cnn":
        return SimpleCNN(C, H, W, classes, width, hidden)
    if ARCHS[arch] == "resnet18":
        return ResNet(BasicBlock, [2, 2, 2, 2], C, classes, width)
    return ResNet(Bottleneck, [3, 4, 6, 3], C, classes, width)


def load(model, r, s):
    state = model.state_dict()
    names = [k for k in state if not k.endswith("num_batches_tracked")]
    missing = [k for k in names if f"q{s}/{k}" not in r and f"c{s}/{k}" not in r]
    extra = [k.split("/", 1)[1] for k in r if k.startswith((f"q{s}/", f"c{s}/")) and k.split("/", 1)[1] not in state]
    assert not missing and not extra, f"names differ: torch only {missing}, dump only {extra}"
    with torch.no_grad():
        for k in names:
            src = r.get(f"q{s}/{k}", r.get(f"c{s}/{k}"))
            state[k].copy_(torch.tensor(src, dtype=torch.float64).reshape(state[k].shape))


def main():
    r = read_dump(sys.argv[1])
    meta = r["meta"]
    arch, B, steps, adamw = ARCHS[int(meta[0])], int(meta[7]), int(meta[8]), int(meta[9])
    C, H, W = (int(v) for v in meta[1:4])
    what = (f"{arch}{' (zero_init_residual)' if int(meta[11]) else ''} {'AdamW' if adamw else 'SGD'} "
            f"B={B} {C}x{H}x{W}")
    model = build(meta).double()
    fails = []
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != int(meta[10]):
        fails.append(f"parameter count {int(meta[10])} vs torch's {n_params}")
    worst = {"loss": (0.0, ""), "grad": (0.0, ""), "running": (0.0, ""), "update": (0.0, "")}
    for s in range(steps):
        load(model, r, s)
        model.train()
        model.zero_grad()
        x = torch.tensor(r[f"x{s}"]).reshape(B, C, H, W)
        y = torch.tensor(r[f"y{s}"]).long()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        e = abs(r["losses"][s] - loss.item()) / abs(loss.item())
        print(f"  step {s + 1:2d} loss {r['losses'][s]:.7f} torch64 {loss.item():.7f} rel {e:.1e}")
        worst["loss"] = max(worst["loss"], (e, f"step {s + 1}"))
        for k, p in model.named_parameters():
            worst["grad"] = max(worst["grad"], (err(r[f"g{s}/{k}"], p.grad.numpy()), f"step {s + 1} {k}"))
        for k, v in model.state_dict().items():
            if "running" in k:
                worst["running"] = max(worst["running"], (err(r[f"c{s + 1}/{k}"], v.numpy()), f"step {s + 1} {k}"))
    # the optimizer alone, fed dtrain's gradients
    load(model, r, 0)
    params = dict(model.named_parameters())
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01) if adamw else
           torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4))
    for s in range(steps):
        for k, p in params.items():
            p.grad = torch.tensor(r[f"g{s}/{k}"]).reshape(p.shape)
        opt.step()
        for k, p in params.items():
            worst["update"] = max(worst["update"], (err(r[f"q{s + 1}/{k}"], p.detach().numpy()), f"step {s + 1} {k}"))
    load(model, r, steps)
    model.eval()
    with torch.no_grad():
        x0 = torch.tensor(r["x0"]).reshape(B, C, H, W)
        y0 = torch.tensor(r["y0"]).long()
        logits = model(x0)
        ev = (F.cross_entropy(logits, y0).item(), int((logits.argmax(1) == y0).sum()))
        hist = torch.bincount(logits.argmax(1), minlength=logits.shape[1]).tolist()
    worst["eval"] = (abs(r["eval"][0] - ev[0]) / abs(ev[0]), f"loss {r['eval'][0]:.7f} vs {ev[0]:.7f}")
    for k, (e, where) in worst.items():
        print(f"{what}: {k:8s} worst {e:.2e} ({where}), limit {TOL}")
        if e > TOL:
            fails.append(k)
    print(f"{what}: evaluation mode: correct {int(r['eval'][1])} of {B} vs torch's {ev[1]}")
    got_hist = [int(v) for v in r["pred_hist"]]
    print(f"{what}: predictions per class {got_hist} vs torch's {hist}")
    if int(r["eval"][1]) != ev[1] or got_hist != hist:
        fails.append("accuracy")
    if fails:
        print(f"ref_cnn_model: FAIL: {what}: {', '.join(fails)}")
        sys.exit(1)
    print(f"ref_cnn_model: OK: {what}: {steps} steps")


if __name__ == "__main__":
    main()
