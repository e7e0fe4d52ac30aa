"""Final tensors of two dtrain checkpoints, compared per tensor (shared by the equivalence tests).

    import sys; sys.path.insert(0, TOP_SRCDIR + "/tests/ref"); from tensors_match import worst
    w, name = worst(REF_H5, OTHER_H5, "model")   # also "optim/exp_avg", "optim/exp_avg_sq"

The measure is ||a - b|| / ||a|| per tensor (2-norm), the largest over the group's tensors, and
the tensor it was found in. A norm, not the worst element: AdamW divides by sqrt(v), so an element
whose gradient is near rounding level moves by ~lr per step whichever way the noise points; a
handful of such elements differ by ~1e-6 absolute while the tensor as a whole agrees to ~1e-7.
Excluded: the key third of each attn.c_attn.bias. Its true gradient is exactly zero (adding q.b_k
to every score of a query does not change the softmax), so what backward produces there is
rounding noise, and AdamW's m/sqrt(v) turns noise of either sign into steps of size ~lr: it
differs with summation order by construction (PyTorch behaves the same)."""
import h5py
import numpy as np


def worst(ref_path, path, group="model"):
    fa, fb = h5py.File(ref_path, "r"), h5py.File(path, "r")
    w, wk = 0.0, ""
    for k in fa[group]:
        a, b = fa[group][k][()], fb[group][k][()]
        assert a.shape == b.shape, (path, k, a.shape, b.shape)
        if k.endswith("attn.c_attn.bias"):
            C = a.shape[0] // 3
            a, b = np.concatenate([a[:C], a[2 * C:]]), np.concatenate([b[:C], b[2 * C:]])
        r = float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))
        if r > w:
            w, wk = r, k
    return w, wk
