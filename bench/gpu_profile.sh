#!/usr/bin/env bash
# Where dtrain's GPU step spends its time: Nsight Compute (ncu) times every kernel of one training
# step of GPT-2 124M (B=16, T=1024 unless given; init and the step, kernels serialised), and this
# sums the durations per kernel name and per class (cuBLAS matmuls, attention's softmax, layernorm,
# cross-entropy, AdamW, the rest), largest first, with each one's share. The total is GPU busy time
# without overlap; compare it with the ms/step of bench/gpu_step.sh from the same machine.
#
#   bench/gpu_profile.sh [--batch B] [--top N] [--out DIR] [dtrain key=value ...]
#       e.g. bench/gpu_profile.sh system.tf32=true      bench/gpu_profile.sh train.precision=bf16
# env: DTRAIN (default: dtrain on PATH, else ./dtrain), DATA (token shards), NCU (default: ncu on
#      PATH, else the toolkit's). Needs a GPU that ncu may profile (not gVisor: docs/gpu-runs.md).
set -uo pipefail
batch=16
top=25
out=${OUT:-/tmp}/gpu_profile
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --batch) batch=$2; shift 2 ;;
    --top) top=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *=*) extra+=("$1"); shift ;;
    *) echo "usage: $0 [--batch B] [--top N] [--out DIR] [key=value ...]" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
DTRAIN=${DTRAIN:-$(command -v dtrain || echo "$here/dtrain")}
DATA=${DATA:-$here/data/austen_train_*.bin}
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
[ -n "$NCU" ] || { echo "gpu_profile: no ncu (Nsight Compute) here"; exit 2; }
mkdir -p "$out"
tag=$(printf '%s' "${extra[*]:-default}" | tr -c 'A-Za-z0-9._-' '_')
csv="$out/ncu_$tag.csv"
cmd=("$DTRAIN" "$here/inputs/gpt2.ini" system.backend=cuda train.micro_batch="$batch" train.global_batch="$batch"
     model.seq_len=1024 train.steps=1 train.warmup=1 train.eval_every=0 "data.train=$DATA" data.val= log.every=1
     checkpoint.dir="$out/ckpt" checkpoint.every=0 checkpoint.resume=never "${extra[@]}")
echo "+ $NCU --metrics gpu__time_duration.sum --csv --page raw --clock-control none ${cmd[*]}"
"$NCU" --metrics gpu__time_duration.sum --csv --page raw --clock-control none "${cmd[@]}" > "$csv" 2> "$out/ncu_$tag.err"
rc=$?
rm -rf "$out/ckpt"
[ $rc = 0 ] || { echo "gpu_profile: ncu exit $rc"; tail -5 "$csv" "$out/ncu_$tag.err"; exit 1; }
grep -c '^"' "$csv" > /dev/null || { echo "gpu_profile: no CSV rows from ncu:"; tail -8 "$csv" "$out/ncu_$tag.err"; exit 1; }
python3 - "$csv" "$top" "${extra[*]:-defaults}" "$batch" <<'PY'
import collections, csv, sys
path, top, what, B = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lines = [l for l in open(path) if l.startswith('"')]  # ncu's CSV rows; dtrain's own output is not quoted
rows = list(csv.DictReader(lines))
if not rows:
    sys.exit("gpu_profile: no kernel rows in ncu's output")
name_col = next(c for c in rows[0] if c in ("Kernel Name", "Function Name", "Name"))
unit = rows[0].get("gpu__time_duration.sum", "")
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit.strip(), None)
if scale is None:  # no units row: ncu's raw page default is nanoseconds
    scale = 1e-6
else:
    rows = rows[1:]
per = collections.defaultdict(lambda: [0.0, 0])
for r in rows:
    v = r.get("gpu__time_duration.sum", "").replace(",", "")
    try:
        ms = float(v) * scale
    except ValueError:
        continue
    n = r[name_col].split("(")[0].strip()
    per[n][0] += ms
    per[n][1] += 1

def cls(n):
    l = n.lower()
    if any(k in l for k in ("gemm", "xmma", "cutlass", "sm90", "sm80", "cublas", "splitk")): return "cuBLAS matmuls"
    if "softmax" in l: return "attention softmax"
    if "layernorm" in l: return "layernorm"
    if "crossentropy" in l or "xent" in l: return "cross-entropy"
    if "adamw" in l or "sumsq" in l: return "AdamW + grad norm"
    if "gelu" in l: return "GELU"
    if "bias" in l or "col_sum" in l: return "bias add / bias grads"
    if "encoder" in l: return "embedding"
    if "round" in l: return "precision rounding"
    return "other"

total = sum(v[0] for v in per.values())
print(f"# ncu, one dtrain step of GPT-2 124M, B={B}, T=1024 ({what}), init included: {sum(v[1] for v in per.values())} "
      f"kernels, {total:.1f} ms of serialised kernel time")
byc = collections.defaultdict(float)
for n, (ms, _) in per.items():
    byc[cls(n)] += ms
print(f"{'class':<28} {'ms':>9} {'share':>7}")
for c, ms in sorted(byc.items(), key=lambda x: -x[1]):
    print(f"{c:<28} {ms:9.2f} {100 * ms / total:6.1f}%")
print(f"\n{'kernel':<70} {'calls':>6} {'ms':>9} {'share':>7}")
for n, (ms, k) in sorted(per.items(), key=lambda x: -x[1][0])[:top]:
    print(f"{n[:70]:<70} {k:6d} {ms:9.2f} {100 * ms / total:6.1f}%")
PY
