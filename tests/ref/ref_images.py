#!/usr/bin/env python3
"""Independent check of dtrain's image sets (src/data/images.c) against numpy.

Reads the dump of tests/images_dump (records: char name[64], int64 n, float32 data[n]) and the
same files with numpy's own parser (gzip or plain IDX; CIFAR-10 records), then checks:
  - the shape and, for every sample of the batch, its label;
  - the per-channel mean and standard deviation of pixels / 255 over the whole set (float64
    numpy; within 1e-6 relative);
  - the shuffled order: each of two epochs is a permutation of all N samples, the epochs differ
    and neither is the identity;
  - the augmented batch: sample ids are the order's at G0.., crop offsets within [0, 2 pad], both
    flips and several offsets occur (when enabled), and every image equals numpy's zero-padding,
    crop, horizontal flip (torchvision's RandomCrop(padding) then RandomHorizontalFlip) and
    normalisation of the raw pixels, within 1e-6;
  - the first B images in order without augmentation.
Usage: ref_images.py DUMP.bin (idx IMAGES LABELS | cifar FILE...) PAD FLIP G0
"""
import gzip
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump import read_dump  # noqa: E402

fails = []


def raw(path):
    data = open(path, "rb").read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def load(argv):
    if argv[0] == "idx":
        img, lab = raw(argv[1]), raw(argv[2])
        n, h, w = struct.unpack(">III", img[4:16])
        x = np.frombuffer(img, np.uint8, offset=16).reshape(n, 1, h, w)
        y = np.frombuffer(lab, np.uint8, offset=8)
        return x, y, argv[3:]
    files = [a for a in argv[1:] if not a.lstrip("-").isdigit()]
    recs = np.concatenate([np.frombuffer(raw(f), np.uint8).reshape(-1, 3073) for f in sorted(files)])
    return recs[:, 1:].reshape(-1, 3, 32, 32), recs[:, 0], argv[1 + len(files):]


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what} {detail}")
    if not ok:
        fails.append(what)


def main():
    r = read_dump(sys.argv[1])
    x, y, rest = load(sys.argv[2:])
    pad, flip, g0 = (int(v) for v in rest)
    n, C, H, W = x.shape
    check("shape", list(r["meta"]) == [n, C, H, W], f"{list(r['meta'])} vs {[n, C, H, W]}")
    v = x.astype(np.float64) / 255.0
    mean, std = v.mean(axis=(0, 2, 3)), v.std(axis=(0, 2, 3))
    em = np.max(np.abs(r["mean"] - mean) / mean)
    es = np.max(np.abs(r["std"] - std) / std)
    check("mean/std", em < 1e-6 and es < 1e-6, f"mean {mean} ({em:.1e}), std {std} ({es:.1e})")
    perm = r["perm"].astype(np.int64).reshape(2, n)
    ok = all(np.array_equal(np.sort(p), np.arange(n)) for p in perm)
    check("order", ok and not np.array_equal(perm[0], perm[1]) and not np.array_equal(perm[0], np.arange(n)),
          f"2 epochs of {n}: permutations, different, shuffled")
    aug = r["aug"].astype(np.int64).reshape(-1, 4)
    B = len(aug)
    ids, dx, dy, fl = aug.T
    flat = perm.reshape(-1)
    check("ids", np.array_equal(ids, flat[g0:g0 + B]), f"batch of {B} at g0={g0}")
    check("labels", np.array_equal(r["y"].astype(np.int64), y[ids]) and
          np.array_equal(r["ys"].astype(np.int64), y[:B]))
    rng_ok = (dx.min() >= 0 and dx.max() <= 2 * pad and dy.min() >= 0 and dy.max() <= 2 * pad and
              set(fl) <= ({0, 1} if flip else {0}))
    varied = (not pad or len(set(dx)) > 1 and len(set(dy)) > 1) and (not flip or set(fl) == {0, 1})
    check("augmentation draws", rng_ok and varied,
          f"dx {dx.min()}..{dx.max()}, dy {dy.min()}..{dy.max()}, flips {sorted(set(fl))}")
    norm = lambda a: (a.astype(np.float64) / 255.0 - mean[None, :, None, None]) / std[None, :, None, None]
    padded = np.pad(x[ids], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    want = np.stack([padded[b, :, dy[b]:dy[b] + H, dx[b]:dx[b] + W] for b in range(B)])
    want = np.where(fl[:, None, None, None] == 1, want[..., ::-1], want)
    e = np.max(np.abs(r["x"].reshape(B, C, H, W) - norm(want)))
    check("augmented images", e < 1e-5, f"worst {e:.1e}")
    e = np.max(np.abs(r["xs"].reshape(B, C, H, W) - norm(x[:B])))
    check("images in order", e < 1e-5, f"worst {e:.1e}")
    if fails:
        print(f"ref_images: FAIL: {', '.join(fails)}")
        sys.exit(1)
    print(f"ref_images: OK: {n} images {C}x{H}x{W}")


if __name__ == "__main__":
    main()
