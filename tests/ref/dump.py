"""The record files the C dump programs write (tests/dump.h): records of { char name[64]; int64 n;
float32 data[n] }, read into float64 numpy arrays by name; and the per-tensor error the reference
scripts use."""
import struct

import numpy as np


def read_dump(path):
    recs = {}
    with open(path, "rb") as f:
        while hdr := f.read(64):
            name = hdr.split(b"\0", 1)[0].decode()
            (n,) = struct.unpack("<q", f.read(8))
            recs[name] = np.frombuffer(f.read(4 * n), dtype=np.float32).astype(np.float64)
    return recs


def err(got, want):
    """max|got - want| / max(max|want|, 1e-30), over the flattened arrays (same size)."""
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    assert got.shape == want.shape, (got.shape, want.shape)
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30) if got.size else 0.0
