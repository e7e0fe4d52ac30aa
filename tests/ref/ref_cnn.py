#!/usr/bin/env python3
"""PyTorch reference for dtrain's CNN layer kernels (src/backend/ops_cnn_cpu.c) and SGD update.

Reads the dump of tests/cnn_dump (records: char name[64], int64 n, float32 data[n]; a case's
records are CASE/meta, its inputs and its outputs) and recomputes every case in float64 with
torch.nn.functional: conv2d (forward, input, weight and bias gradients; with 1 and 2 threads, under
im2col, Winograd F(2x2, 3x3) and F(4x4, 3x3); Winograd's results must not depend on the threads),
batch_norm in training mode (output, gradients, running statistics with momentum 0.1) and in
evaluation mode, ReLU, max and average pooling (PyTorch's tie rule, count_include_pad), global
average pooling, torch.optim.SGD (momentum 0.9, weight decay 0.05, with and without Nesterov).
Parameter gradients were started at 0.25 by the dump (the kernels accumulate), activation
gradients at NaN (the kernels write them).
Error: max|a - b| / max(max|b|, 1e-30) per tensor (b = torch), limit TOL = 1e-5 (TOL_W4 = 3e-5 for
F(4x4), which is not the default).
Usage: ref_cnn.py DUMP.bin
"""
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"ref_cnn.py: FAIL: {sys.executable} lacks torch/numpy ({e}); set REF_PYTHON", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump import err, read_dump  # noqa: E402

TOL = 1e-5
TOL_W4 = 3e-5  # Winograd F(4x4, 3x3) (DT_CONV=winograd4, not the default): its transforms round more
fails = []


def check(case, what, got, want, tol=None):
    tol = TOL if tol is None else tol
    want = want.detach().numpy().ravel() if torch.is_tensor(want) else np.asarray(want).ravel()
    e = err(got, want)
    ok = e <= tol and not np.isnan(np.asarray(got)).any()
    print(f"{'ok  ' if ok else 'FAIL'} {case:18s} {what:8s} {e:.2e}")
    if not ok:
        fails.append(f"{case}/{what}")


def t(a, shape=None, grad=False):
    x = torch.tensor(a, dtype=torch.float64)
    if shape is not None:
        x = x.reshape(shape)
    return x.requires_grad_(grad)


def conv(r, c):
    B, C, H, W, OC, K, s, p, with_bias = (int(v) for v in r[f"{c}/meta"])
    x, w = t(r[f"{c}/x"], (B, C, H, W), True), t(r[f"{c}/w"], (OC, C, K, K), True)
    b = t(r[f"{c}/b"], None, True) if with_bias else None
    y = F.conv2d(x, w, b, stride=s, padding=p)
    y.backward(t(r[f"{c}/dy"], y.shape))
    names = ["y", "dx", "dw"] + (["db"] if with_bias else [])
    for sfx, tol in (("", TOL), ("_im2col", TOL), ("_w4", TOL_W4)):
        for n in (1, 2):
            check(c, f"y{n}{sfx}", r[f"{c}/y{n}{sfx}"], y, tol)
            check(c, f"dx{n}{sfx}", r[f"{c}/dx{n}{sfx}"], x.grad, tol)
            check(c, f"dw{n}{sfx}", r[f"{c}/dw{n}{sfx}"], 0.25 + w.grad, tol)
            if with_bias:
                check(c, f"db{n}{sfx}", r[f"{c}/db{n}{sfx}"], 0.25 + b.grad, tol)
        if sfx != "_im2col" and K == 3 and s == 1 and p == 1 and C >= 16:
            # Winograd: every output owned by one thread, sums in a fixed order: 1 thread == 2
            same = all(np.array_equal(r[f"{c}/{v}1{sfx}"], r[f"{c}/{v}2{sfx}"]) for v in names)
            print(f"{'ok  ' if same else 'FAIL'} {c:18s} winograd{sfx or '2'} 1 thread == 2 threads: {same}")
            if not same:
                fails.append(f"{c}/threads{sfx}")


def bn(r, c):
    B, C, HW = (int(v) for v in r[f"{c}/meta"])
    x = t(r[f"{c}/x"], (B, C, HW), True)
    w, b = t(r[f"{c}/w"], None, True), t(r[f"{c}/b"], None, True)
    rm, rv = t(r[f"{c}/rm0"]), t(r[f"{c}/rv0"])
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    y.backward(t(r[f"{c}/dy"], y.shape))
    check(c, "y", r[f"{c}/y"], y)
    check(c, "dx", r[f"{c}/dx"], x.grad)
    check(c, "dw", r[f"{c}/dw"], 0.25 + w.grad)
    check(c, "db", r[f"{c}/db"], 0.25 + b.grad)
    check(c, "rm", r[f"{c}/rm1"], rm)
    check(c, "rv", r[f"{c}/rv1"], rv)
    x2 = x.detach().clone().requires_grad_(True)
    y2 = F.batch_norm(x2, rm, rv, w.detach(), b.detach(), training=False, eps=1e-5)
    y2.backward(t(r[f"{c}/dy"], y2.shape))
    check(c, "y_eval", r[f"{c}/y_eval"], y2)
    check(c, "dx_eval", r[f"{c}/dx_eval"], x2.grad)


def pool(r, c):
    kind, B, C, H, W, K, s, p = (int(v) for v in r[f"{c}/meta"])
    # the *_ties cases hold integers: equal maxima in a window, where the first one must win
    x = t(r[f"{c}/x"], (B, C, H, W), True)
    y = F.max_pool2d(x, K, s, p) if kind == 0 else F.avg_pool2d(x, K, s, p, count_include_pad=True)
    y.backward(t(r[f"{c}/dy"], y.shape))
    check(c, "y", r[f"{c}/y"], y)
    check(c, "dx", r[f"{c}/dx"], x.grad)


def pointwise(r):
    B, C, HW = (int(v) for v in r["relu/meta"])
    x = t(r["relu/x"], None, True)
    y = F.relu(x)
    y.backward(t(r["relu/dy"]))
    check("relu", "y", r["relu/y"], y)
    check("relu", "dx", r["relu/dx"], x.grad)
    x = t(r["gap/x"], (B, C, HW), True)
    y = x.mean(dim=2)
    y.backward(t(r["gap/dy"], y.shape))
    check("global_avgpool", "y", r["gap/y"], y)
    check("global_avgpool", "dx", r["gap/dx"], x.grad)


def sgd(r, c):
    N, S, nesterov = (int(v) for v in r[f"{c}/meta"])
    p = t(r[f"{c}/p0"], None, True)
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=5e-2, nesterov=bool(nesterov))
    for s in range(S):
        p.grad = t(r[f"{c}/g{s}"])
        opt.step()
    check(c, "p", r[f"{c}/p"], p)


def main():
    r = read_dump(sys.argv[1])
    cases = sorted({k.split("/")[0] for k in r})
    for c in cases:
        if c.startswith("conv"):
            conv(r, c)
        elif c.startswith("bn"):
            bn(r, c)
        elif c.startswith(("maxpool", "avgpool")):
            pool(r, c)
        elif c.startswith("sgd"):
            sgd(r, c)
    pointwise(r)
    want = {"conv_3x3", "conv_3x3_s2", "conv_stem7", "conv_1x1", "conv_1x1_b1", "conv_1x1_s2", "conv_5x5_mnist", "conv_3x3_4x4",
            "conv_3x3_s2_8x8", "conv_1x1_4x4", "conv_3x3_wino_odd", "conv_3x3_wino_chunks", "conv_3x3_wino_wide",
            "conv_3x3_wino_c80",
            "bn_4x3", "bn_1x1",
            "maxpool_3s2p1", "maxpool_2s2_ties", "maxpool_3s1_ties", "avgpool_2s2", "avgpool_3s2p1", "relu", "gap",
            "sgd", "sgd_nesterov"}
    if set(cases) != want:
        fails.append(f"cases in the dump {sorted(set(cases) ^ want)} differ from the list")
    if fails:
        print(f"ref_cnn: FAIL: {len(fails)} tensors above {TOL}: {', '.join(fails)}")
        sys.exit(1)
    print(f"ref_cnn: OK: {len(cases)} cases within {TOL} of torch float64")


if __name__ == "__main__":
    main()
