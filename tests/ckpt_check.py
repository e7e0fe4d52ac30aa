"""Independent check of a dtrain checkpoint written by tests/test_ckpt (h5py + numpy only).

usage: ckpt_check.py FILE STEP [L C V T]
Checks: the /model names and shapes are exactly Hugging Face GPT2LMHeadModel's state_dict
(without "transformer."), every tensor holds our arena storage as it is (Conv1D weights are
(in, out) in both), wte has the true vocab rows, the values are the test fill, /optim mirrors /model, every dataset's
crc32c attribute equals a CRC32C computed here, and the state and completion marker."""
import sys
import h5py
import numpy as np

path, step = sys.argv[1], int(sys.argv[2])
L, C, V, T = (int(x) for x in sys.argv[3:7]) if len(sys.argv) > 6 else (2, 32, 100, 16)

# CRC32C (Castagnoli, reflected 0x82F63B78), table-driven, written independently of src/core/crc32c.c
TAB = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    TAB.append(c)


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ TAB[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283

# Hugging Face GPT-2 state_dict (transformer.*) names and shapes, in dtrain arena order.
hf = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
for i in range(L):
    hf += [(f"h.{i}.ln_1.weight", (C,)), (f"h.{i}.ln_1.bias", (C,)),
           (f"h.{i}.attn.c_attn.weight", (C, 3 * C)), (f"h.{i}.attn.c_attn.bias", (3 * C,)),
           (f"h.{i}.attn.c_proj.weight", (C, C)), (f"h.{i}.attn.c_proj.bias", (C,)),
           (f"h.{i}.ln_2.weight", (C,)), (f"h.{i}.ln_2.bias", (C,)),
           (f"h.{i}.mlp.c_fc.weight", (C, 4 * C)), (f"h.{i}.mlp.c_fc.bias", (4 * C,)),
           (f"h.{i}.mlp.c_proj.weight", (4 * C, C)), (f"h.{i}.mlp.c_proj.bias", (C,))]
hf += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]

fails = 0
def check(cond, msg):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", msg)

f = h5py.File(path, "r")
check(f.attrs["complete"] == 1 and f.attrs["format_version"] == 1, "completion marker / format version")
check(set(f["model"].keys()) == {n for n, _ in hf}, f"/model names: {sorted(set(f['model'].keys()) ^ {n for n, _ in hf})}")
ncrc = 0
for t, (name, shape) in enumerate(hf):
    d = f["model"][name]
    check(d.shape == shape, f"{name}: shape {d.shape}, HF has {shape}")
    check(d.dtype == np.dtype("<f4"), f"{name}: dtype {d.dtype}")
    # the fill is a function of (tensor, row, col) of our storage (rows, cols), which is the file's
    ours = shape if len(shape) == 2 else (1, shape[0])
    r, c = np.meshgrid(np.arange(ours[0]), np.arange(ours[1]), indexing="ij")
    p = (t + (r * ours[1] + c) / 65536.0 + 32.0 * (step % 4)).astype(np.float32)
    want = p.reshape(shape)
    for grp, w in (("model", want), ("optim/exp_avg", -want), ("optim/exp_avg_sq", want / 4)):
        a = f[grp][name][()]
        check(a.shape == shape and np.array_equal(a, w), f"/{grp}/{name}: values differ from the fill")
        stored = int(f[grp][name].attrs["crc32c"])
        got = crc32c(np.ascontiguousarray(a, dtype="<f4").tobytes())
        check(stored == got, f"/{grp}/{name}: crc32c attribute 0x{stored:08x}, python 0x{got:08x}")
        ncrc += 1
s = f["state"]
check(int(s.attrs["step"]) == step and int(s.attrs["n_layer"]) == L and int(s.attrs["vocab_size"]) == V, "state attrs")
ini = f["state/config_ini"][()]
check(ini.startswith(b"[model]"), "config_ini text")
check(int(f["state/config_ini"].attrs["crc32c"]) == crc32c(ini + b"\0"), "config_ini crc32c")
rng = f["state/rng"][()]
check(int(f["state/rng"].attrs["crc32c"]) == crc32c(np.ascontiguousarray(rng, dtype="<u8").tobytes()), "rng crc32c")
print(f"{path}: {len(hf)} /model names and shapes = HF GPT2 (L={L} C={C} V={V} T={T}), Conv1D (in, out), "
      f"values = fill of step {step}, {ncrc + 2} crc32c attributes = python CRC32C: {'FAIL' if fails else 'ok'}")
sys.exit(1 if fails else 0)
