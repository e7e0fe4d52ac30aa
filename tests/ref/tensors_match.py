"""Final tensors of two dtrain checkpoints, compared per tensor (shared by the equivalence tests).

    import sys; sys.path.insert(0, TOP_SRCDIR + "/tests/ref"); from tensors_match import worst, state_close
    w, name = worst(REF_H5, OTHER_H5, "model")   # also "optim/exp_avg", "optim/exp_avg_sq"
    state_close(REF_H5, OTHER_H5, "dp=2", 1e-5, 1e-3, 1e-3)   # parameters, m, v: assert and print

or from a shell: tensors_match.py REF_H5 LIMIT_PARAMS LIMIT_M LIMIT_V OTHER_H5[=LABEL] ...

The measure is ||a - b|| / ||a|| per tensor (2-norm), the largest over the group's tensors, and
the tensor it was found in. A norm, not the worst element: AdamW divides by sqrt(v), so an element
whose gradient is near rounding level moves by ~lr per step whichever way the noise points; a
handful of such elements differ by ~1e-6 absolute while the tensor as a whole agrees to ~1e-7.
Excluded: the key third of each attn.c_attn.bias. Its true gradient is exactly zero (adding q.b_k
to every score of a query does not change the softmax), so what backward produces there is
rounding noise, and AdamW's m/sqrt(v) turns noise of either sign into steps of size ~lr: it
differs with summation order by construction (PyTorch behaves the same).
The AdamW moments carry what the parameters cannot show: AdamW's step m / sqrt(v) does not change
when every gradient is scaled by the same factor, so a gradient average that became a sum (x dp)
leaves the parameters and losses alone but makes m dp times and v dp^2 times larger. m and v
follow the raw gradients, whose small, cancelling tensors (layernorm biases) show summation order
more than the parameters do: their limits are looser, still far below any factor."""
import sys

import h5py
import numpy as np

GROUPS = ("model", "optim/exp_avg", "optim/exp_avg_sq")


def worst(ref_path, path, group="model"):
    fa, fb = h5py.File(ref_path, "r"), h5py.File(path, "r")
    assert sorted(fa[group]) == sorted(fb[group]), (path, group, "other tensor names")
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


def state_close(ref_path, path, name, tol_params, tol_m, tol_v):
    """Parameters, exp_avg and exp_avg_sq of `path` within the limits of `ref_path`'s (per tensor,
    as worst() measures); one line printed; returns {group: (worst, tensor)}."""
    got = {}
    for g, tol in zip(GROUPS, (tol_params, tol_m, tol_v)):
        w, k = got[g] = worst(ref_path, path, g)
        assert w <= tol, f"{name}: final /{g}/{k} differs by {w:.2e} (limit {tol:g})"
    print(f"{name}: final parameters within {got['model'][0]:.2e} (limit {tol_params:g}), AdamW m within "
          f"{got['optim/exp_avg'][0]:.2e} ({tol_m:g}), v within {got['optim/exp_avg_sq'][0]:.2e} ({tol_v:g}); "
          f"worst tensors {', '.join(got[g][1] or '-' for g in GROUPS)}")
    return got


def main(argv):
    if len(argv) < 6:
        sys.exit("usage: tensors_match.py REF_H5 LIMIT_PARAMS LIMIT_M LIMIT_V OTHER_H5[=LABEL] ...")
    ref, limits = argv[1], [float(x) for x in argv[2:5]]
    for arg in argv[5:]:
        path, _, label = arg.partition("=")
        state_close(ref, path, label or path, *limits)


if __name__ == "__main__":
    main(sys.argv)
