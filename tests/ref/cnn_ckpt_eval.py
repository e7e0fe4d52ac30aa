#!/usr/bin/env python3
"""A dtrain image-classifier checkpoint evaluated by PyTorch, independently of dtrain's own
evaluation: the file's /model tensors (h5py) loaded by name into the float64 torch model of
ref_cnn_model.py (every torch parameter and running statistic must be in the file with torch's own
shape, conv weights (OC, C, KH, KW), and nothing else), the IDX test set parsed with numpy and normalised
with the training set's mean and standard deviation (numpy, float64), batch norm in evaluation
mode; the mean cross-entropy and top-1 accuracy over the whole test set must equal what dtrain
logged (val_loss within 1e-5 relative; accuracy within 2 images in 10,000: a float32 and a float64
model may rank two nearly equal logits differently).

Usage: cnn_ckpt_eval.py CKPT.h5 METRICS.jsonl ARCH WIDTH HIDDEN CLASSES TRAIN_IMAGES TEST_IMAGES TEST_LABELS
"""
import json
import os
import sys

try:
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"cnn_ckpt_eval.py: FAIL: {sys.executable} lacks torch/numpy/h5py ({e}); set REF_PYTHON", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_cnn_model import ResNet, SimpleCNN, BasicBlock, Bottleneck  # noqa: E402
from ref_images import load as load_images  # noqa: E402


def main():
    ckpt, metrics, arch, width, hidden, classes, train_img, test_img, test_lab = sys.argv[1:10]
    width, hidden, classes = int(width), int(hidden), int(classes)
    xt, _, _ = load_images(["idx", train_img, test_lab])  # the training images (labels unused)
    x, y, _ = load_images(["idx", test_img, test_lab])
    n, C, H, W = x.shape
    if arch == "cnn":
        model = SimpleCNN(C, H, W, classes, width, hidden)
    else:
        model = ResNet(*((BasicBlock, [2, 2, 2, 2]) if arch == "resnet18" else (Bottleneck, [3, 4, 6, 3])), C, classes,
                       width)
    model = model.double().eval()
    state = model.state_dict()
    names = [k for k in state if not k.endswith("num_batches_tracked")]
    with h5py.File(ckpt, "r") as f:
        stored = sorted(f["model"].keys())
        assert stored == sorted(names), (f"names differ: torch only {sorted(set(names) - set(stored))}, "
                                         f"file only {sorted(set(stored) - set(names))}")
        with torch.no_grad():  # torchvision's shapes as they are (conv weights (OC, C, KH, KW)): no reshape
            for k in names:
                a = f["model"][k][()]
                assert a.shape == tuple(state[k].shape), f"{k}: shape {a.shape} in the file, torch has {tuple(state[k].shape)}"
                state[k].copy_(torch.tensor(a, dtype=torch.float64))
    mean, std = np.zeros(C), np.zeros(C)
    for c in range(C):  # from each channel's pixel histogram (exact, and no float copy of the set)
        h = np.bincount(xt[:, c].ravel(), minlength=256).astype(np.float64)
        p = np.arange(256) / 255.0
        mean[c] = (h * p).sum() / h.sum()
        std[c] = np.sqrt((h * (p - mean[c]) ** 2).sum() / h.sum())
    v = (x.astype(np.float64) / 255.0 - mean[None, :, None, None]) / std[None, :, None, None]
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, 1000):
            logits = model(torch.tensor(v[i:i + 1000]))
            target = torch.tensor(y[i:i + 1000].astype(np.int64))
            loss += F.cross_entropy(logits, target, reduction="sum").item()
            correct += int((logits.argmax(1) == target).sum())
    loss, acc = loss / n, correct / n
    row = [json.loads(line) for line in open(metrics)][-1]
    rel = abs(row["val_loss"] - loss) / loss
    print(f"{ckpt}: PyTorch float64 on the {n} test images: loss {loss:.7f} accuracy {acc:.4f}; dtrain logged "
          f"{row['val_loss']:.7f} {row['val_acc']:.4f} (loss rel {rel:.1e}, limit 1e-5; "
          f"{abs(row['val_acc'] - acc) * n:.0f} images apart, limit 2)")
    assert rel <= 1e-5 and abs(row["val_acc"] - acc) * n <= 2.5, "dtrain's checkpoint or evaluation is off"


if __name__ == "__main__":
    main()
