#!/usr/bin/env python3
"""The first NTRAIN training and NTEST test images of Fashion-MNIST (Debian's dataset-fashion-mnist:
SRC/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz) as uncompressed IDX files of the same names,
without .gz, in DST, the header's count cut to match: the image classifiers' data in the GPU
check (scripts/gpu-bundle.sh, scripts/gpu-check.sh --emulation). Standard library only.
usage: fmnist_subset.py SRC DST NTRAIN NTEST
"""
import gzip
import os
import struct
import sys

if len(sys.argv) != 5:
    sys.exit(__doc__)
src, dst, ntrain, ntest = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(dst, exist_ok=True)
for split, n in (("train", ntrain), ("t10k", ntest)):
    img = gzip.open(f"{src}/{split}-images-idx3-ubyte.gz").read()
    lab = gzip.open(f"{src}/{split}-labels-idx1-ubyte.gz").read()
    with open(f"{dst}/{split}-images-idx3-ubyte", "wb") as f:
        f.write(img[:4] + struct.pack(">I", n) + img[8:16] + img[16:16 + n * 784])
    with open(f"{dst}/{split}-labels-idx1-ubyte", "wb") as f:
        f.write(lab[:4] + struct.pack(">I", n) + lab[8:8 + n])
