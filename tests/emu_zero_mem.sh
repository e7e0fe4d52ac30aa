#!/usr/bin/env bash
# ZeRO-2 and ZeRO-3 lower the device memory on the CUDA backend (cuda/sparse.h: parameter and
# gradient arenas with memory only where in use, over CUDA's virtual memory management, here the
# emulation's, 4 KiB granules), through the CUDA emulation at dp = 2: an 8-layer, 128-channel
# model (1.6M parameters, 6.5 MB per arena), 3 steps at ZeRO-1, -2 and -3, 1 MiB buckets.
#   1. Losses bitwise equal at the three stages, gradient norms within 1e-6 (the gradients are
#      summed in buckets at ZeRO-2/3, reduce-scattered whole at ZeRO-1: another order).
#   2. The run's own "sparse device arenas" line (ZeRO-2: the gradients; ZeRO-3: the parameters
#      too): at most 80% of the arena behind it at any time.
#   3. The emulated device's peak memory in use (DTRAIN_EMU_PEAK, every allocation and every
#      cuMemCreate counted) falls from ZeRO-1 to -2 to -3, each step by at least half of what
#      `dtrain plan` (the run's own "planned device total" line) predicts for it.
#   4. The same in bf16 with 16-bit storage (system.attention = flash), ZeRO-2 against ZeRO-3, where
#      the gathers move the 16-bit working copy (its own sparse arena) and the fp32 master keeps
#      only its shard: rows bitwise equal, the master at most 55% backed (the shard, half at
#      dp = 2), the working copy at most 80%, and the peak lower by at least half the plan's.
# A sparse arena that is written where it has no memory (a missing populate) faults in the
# emulation; zeros read there are the CPU's madvise semantics (zero.h).
source "$top_srcdir/tests/lib.sh"
begin_test
EMU="$top_builddir/dtrain_emu"
go() { # NAME STAGE [ARGS...]
  local n=$1 z=$2
  shift 2
  mpi 2 -x DTRAIN_EMU_DEVICES=2 -x DTRAIN_EMU_PEAK=1 "$EMU" "$cfg" system.backend=cuda parallel.zero=$z model.n_layer=8 \
    model.n_embd=128 parallel.bucket_mb=1 train.micro_batch=2 train.steps=3 log.every=1 checkpoint.dir= \
    log.metrics="$t/$n.jsonl" "$@" > "$t/$n.out" 2>&1 || { cat "$t/$n.out"; echo "FAIL: $n did not run"; exit 1; }
}
for z in 1 2 3; do go z$z $z; done
for z in 2 3; do go b$z $z train.precision=bf16 system.attention=flash; done
grep -q '^# storage: 16 bits' "$t/b3.out" || { grep '^# storage' "$t/b3.out"; echo "FAIL: b3 not on 16-bit storage"; exit 1; }
"$PY" - "$t" <<'PY'
import json, re, sys
t = sys.argv[1]
rows, peak, plan = {}, {}, {}
for z in (1, 2, 3):
    rows[z] = [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{t}/z{z}.jsonl")) if "grad_norm" in r]
    out = open(f"{t}/z{z}.out").read()
    peak[z] = max(int(b) for b in re.findall(r"dt_emu: device \d+ peak memory in use (\d+) bytes", out))
    if z > 1:
        line = re.search(r"^# memory: rank 0 sparse device arenas.*$", out, re.M).group(0)
        print(line)
        arenas = re.findall(r"(\w+) ([0-9.]+) MiB now, ([0-9.]+) MiB at most, of ([0-9.]+) MiB", line)
        assert [a[0] for a in arenas] == (["gradients"] if z == 2 else ["parameters", "gradients"]), arenas
        for name, now, most, size in arenas:
            assert float(most) <= 0.8 * float(size), f"zero{z}: {name}: {most} of {size} MiB backed at most"
    plan[z] = float(re.search(r"planned device total \(CUDA backend, zero%d\) ([0-9.]+) MiB" % z, out).group(1)) * 2**20
    print(f"zero{z}: peak device memory {peak[z] / 2**20:.2f} MiB (emulated), planned {plan[z] / 2**20:.2f} MiB "
          f"(with a 512 MiB context); losses {[round(l, 6) for l, _ in rows[z]]}")
assert len(rows[1]) == 3, rows[1]
for z in (2, 3):
    assert [l for l, _ in rows[z]] == [l for l, _ in rows[1]], f"zero{z} losses differ from zero1: {rows[z]} vs {rows[1]}"
    for (_, a), (_, b) in zip(rows[z], rows[1]):
        assert abs(a - b) <= 1e-6 * abs(b), f"zero{z} grad norm {a} vs zero1's {b}"
for z in (2, 3):
    saved, want = peak[z - 1] - peak[z], plan[z - 1] - plan[z]
    print(f"zero{z - 1} -> zero{z}: {saved / 2**20:.2f} MiB less at the peak, planned {want / 2**20:.2f} MiB")
    assert want > 0 and saved >= 0.5 * want, f"zero{z} saves {saved} bytes of device memory, want >= half of {want}"
# 4. bf16, 16-bit storage: ZeRO-3 gathers the working copy
b = {}
for z in (2, 3):
    out = open(f"{t}/b{z}.out").read()
    b[z] = ([(r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{t}/b{z}.jsonl")) if "grad_norm" in r],
            max(int(x) for x in re.findall(r"dt_emu: device \d+ peak memory in use (\d+) bytes", out)),
            float(re.search(r"planned device total \(CUDA backend, zero%d\) ([0-9.]+) MiB" % z, out).group(1)) * 2**20)
assert len(b[2][0]) == 3 and b[2][0] == b[3][0], f"bf16 zero3 rows {b[3][0]} differ from zero2's {b[2][0]}"
line = re.search(r"^# memory: rank 0 sparse device arenas.*$", open(f"{t}/b3.out").read(), re.M).group(0)
print(line)
arenas = {a[0]: a[1:] for a in re.findall(r"(\w+(?: copy)?) ([0-9.]+) MiB now, ([0-9.]+) MiB at most, of ([0-9.]+) MiB", line)}
assert sorted(arenas) == ["gradients", "parameters", "working copy"], arenas
for name, limit in (("parameters", 0.55), ("working copy", 0.8)):
    most, size = float(arenas[name][1]), float(arenas[name][2])
    assert most <= limit * size, f"bf16 zero3: {name}: {most} of {size} MiB backed at most (limit {limit:.0%})"
saved, want = b[2][1] - b[3][1], b[2][2] - b[3][2]
print(f"bf16 zero2 -> zero3: rows bitwise equal; {saved / 2**20:.2f} MiB less at the peak, planned {want / 2**20:.2f} MiB")
assert want > 0 and saved >= 0.5 * want, f"bf16 zero3 saves {saved} bytes of device memory, want >= half of {want}"
print("PASS")
PY
