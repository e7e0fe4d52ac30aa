#!/usr/bin/env bash
# dtrain's GPT-2 124M training step on one GPU next to PyTorch's GPT-2 124M on the same GPU, in
# the same call (bench/torch_gpt2_gpu.py: eager with scaled_dot_product_attention, and
# torch.compile with --compile): B=16, T=1024, fp32, tf32 (fp32 storage, matmuls on TF32 tensor
# cores: dtrain system.tf32=true, torch allow_tf32) and bf16; median ms/step over the steps after
# the first two, tokens/s, MFU against the GPU's dense peak (H100/H200: 989 TFLOP/s bf16, 495 tf32,
# 67 fp32; datasheet leads), and device memory (dtrain: cudaMemGetInfo in use vs `dtrain plan`'s prediction;
# PyTorch: max_memory_allocated), and the step dtrain's kernel roofline predicts for the GPU
# (`dtrain plan`, src/app/roofline.c: H200 or H100 datasheet) with measured / predicted. A
# precision written PREC+rc runs dtrain with train.recompute=true,
# PREC+flash with system.attention=flash, PREC+cudnn with system.attention=cudnn (cuDNN's fused
# attention, bf16/fp16 only), PREC+tf32 with system.tf32=true (bf16+tf32: the products
# outside the linear layers, the attention's, on TF32), PREC+f32s with system.store16=off (bf16 or
# fp16 on float storage; without it flash and cudnn store 16 bits); no PyTorch row for any of
# these. Prints one table at the end; logs go to OUT.
#
# --max-batch adds dtrain at the largest micro batch whose `dtrain plan` device total fits 92% of
# the GPU (in the first bf16 precision of --prec), --xl a GPT-2 1.5B step (inputs/gpt2-xl.ini, B=4,
# bf16, cuDNN's attention, recomputation if the plan needs it); PyTorch runs at B only.
#
#   bench/gpu_step.sh [--steps N] [--batch B] [--prec fp32,tf32,bf16] [--compile] [--max-batch] [--xl] [--out DIR]
# env: DTRAIN (default: dtrain on PATH, else ./dtrain), DATA (token shards, default
#      data/austen_train_*.bin), PYTHON (default python3, with PyTorch >= 2 and CUDA), GPU_MEM_GIB
#      (the GPU's memory for --max-batch and --xl; default from nvidia-smi).
# Run on a GPU machine: scripts/gpu-check.sh runs it from the bundle as its speed stage.
set -uo pipefail
steps=12
batch=16
precs=fp32,tf32,bf16
compile=""
maxb=""
xl=""
out=${OUT:-/tmp}/gpu_step
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --prec) precs=$2; shift 2 ;;
    --compile) compile=--compile; shift ;;
    --max-batch) maxb=1; shift ;;
    --xl) xl=1; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--batch B] [--prec fp32,tf32,bf16] [--compile] [--max-batch] [--xl] [--out DIR]" >&2
       exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
DTRAIN=${DTRAIN:-$(command -v dtrain || echo "$here/dtrain")}
DATA=${DATA:-$here/data/austen_train_*.bin}
PYTHON=${PYTHON:-python3}
mkdir -p "$out"
T=1024
table=()
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

# plan_gib INI ARGS...: `dtrain plan`'s device total of the CUDA backend in GiB (ZeRO 0)
plan_gib() {
  "$DTRAIN" plan "$@" 2>/dev/null | awk '/total device, CUDA backend, GiB/ {print $(NF - 3)}'
}

# prec_args PREC: the dtrain overrides a precision name stands for (fp32, tf32, bf16, fp16 with
# +rc, +flash, +cudnn, +tf32, +f32s)
prec_args() {
  local p=${1%%+*} tf=false rc=false att=matmul s16=auto
  [[ "$1" == *+rc* ]] && rc=true
  [[ "$1" == *+flash* ]] && att=flash
  [[ "$1" == *+cudnn* ]] && att=cudnn
  [[ "$1" == *+tf32* ]] && tf=true
  [[ "$1" == *+f32s* ]] && s16=off
  [ "$p" = tf32 ] && p=fp32 tf=true
  echo "train.precision=$p system.tf32=$tf train.recompute=$rc system.attention=$att system.store16=$s16"
}

# dtrain_row NAME PREC B INI L C [OVERRIDES...]: one dtrain run of the model in INI (L blocks of
# width C, for the MFU) at micro batch B, T=1024, its row appended to the table
dtrain_row() {
  local name=$1 prec=$2 B=$3 ini=$4 L=$5 C=$6
  shift 6
  local log="$out/dtrain_${name// /_}_$prec"
  local cmd=("$DTRAIN" "$ini" system.backend=cuda $(prec_args "$prec") train.micro_batch="$B" train.global_batch="$B"
             model.seq_len=$T train.steps="$steps" train.warmup=2 train.eval_every=0 "data.train=$DATA" data.val=
             log.every=1 log.metrics="$log.jsonl" checkpoint.dir="$out/ckpt_$prec" checkpoint.every=0
             checkpoint.resume=never "$@")
  echo "+ ${cmd[*]}"
  rm -f "$log.jsonl"
  "${cmd[@]}" > "$log.out" 2>&1
  local rc=$?
  tail -n 4 "$log.out"
  rm -rf "$out/ckpt_$prec"
  if [ $rc -ne 0 ]; then
    table+=("$(printf '%-22s %-10s %10s %12s %7s %22s' "$name" "$prec" "exit $rc" "-" "-" "-")")
    return
  fi
  table+=("$("$PYTHON" - "$log.jsonl" "$log.out" "$prec" "$B" "$gpu" "$name" "$L" "$C" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out, prec, B, gpu, name = open(sys.argv[2]).read(), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
L, C, T, Vp = int(sys.argv[7]), int(sys.argv[8]), 1024, 50304
ms = statistics.median(r["ms"] for r in rows[2:]) if len(rows) > 2 else float("nan")
tok_s = B * T / (ms / 1e3)
peak = {"bf16": 989.0, "tf32": 495.0}.get(prec.split("+")[0], 67.0)  # H100/H200 dense, datasheet
mfu = (6 * (12 * L * C * C + C * Vp) + 12 * L * T * C) * tok_s / 1e12 / peak
m = re.search(r"device memory in use ([0-9.]+) MiB.*planned device total .* ([0-9.]+) MiB \(([-+0-9.]+)%\)", out)
mem = f"{float(m.group(1)):.0f} (plan {float(m.group(2)):.0f}, {m.group(3)}%)" if m else "-"
# the kernel roofline's predicted step (roofline.h) for this GPU: the H200 line on an H200, else H100's
r = re.search(r"roofline: kernels: on an H200\S* .*?step ([0-9.]+) ms as built" if "H200" in gpu else
              r"roofline: kernels: step ([0-9.]+) ms", out)
roof = f"{float(r.group(1)):.1f} ({ms / float(r.group(1)):.2f}x)" if r else "-"
print(f"{name:<22} {prec:<10} {ms:10.1f} {tok_s:12.0f} {mfu:7.3f} {mem:>22} {roof:>16}")
PY
)")
}

for prec in ${precs//,/ }; do
  dtrain_row dtrain "$prec" "$batch" "$here/inputs/gpt2.ini" 12 768
done

# --max-batch: the largest micro batch of 124M (a multiple of 8 up to 256) whose planned device
# total fits 92% of the GPU's memory, in the first bf16 precision of --prec (a test of the plan too)
gpu_gib=${GPU_MEM_GIB:-$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 |
  awk '{printf "%.1f", $1 / 1024}')}
if [ -n "$maxb" ]; then
  mprec=$(echo "$precs" | tr ',' '\n' | grep -m1 '^bf16' || echo bf16)
  best=""
  for b in 16 24 32 40 48 56 64 80 96 112 128 160 192 224 256; do
    g=$(plan_gib "$here/inputs/gpt2.ini" train.micro_batch=$b train.global_batch=$b model.seq_len=$T \
      $(prec_args "$mprec"))
    echo "# max batch: B=$b plans ${g:-?} GiB of ${gpu_gib:-?} GiB"
    [ -n "$g" ] && [ -n "$gpu_gib" ] && awk -v g="$g" -v m="$gpu_gib" 'BEGIN {exit !(g <= 0.92 * m)}' && best=$b
  done
  if [ -n "$best" ] && [ "$best" != "$batch" ]; then
    dtrain_row "dtrain-B$best" "$mprec" "$best" "$here/inputs/gpt2.ini" 12 768
  else echo "# max batch: none above B=$batch fits (GPU memory ${gpu_gib:-unknown} GiB)"; fi
fi

# --xl: GPT-2 1.5B (inputs/gpt2-xl.ini) at micro batch 4 in bf16 with cuDNN's attention (flash where
# cuDNN is missing), with recomputation only if the plan does not fit 92% of the GPU without it
if [ -n "$xl" ]; then
  xini="$here/inputs/gpt2-xl.ini" xrc=""
  g=$(plan_gib "$xini" train.micro_batch=4 train.global_batch=4 system.attention=flash)
  echo "# gpt2-xl: B=4 plans ${g:-?} GiB without recomputation, the GPU has ${gpu_gib:-?} GiB"
  [ -n "$g" ] && [ -n "$gpu_gib" ] && ! awk -v g="$g" -v m="$gpu_gib" 'BEGIN {exit !(g <= 0.92 * m)}' && xrc=+rc
  xatt=cudnn
  "$DTRAIN" --version 2>/dev/null | grep -q '^cudnn: .* found' || xatt=flash
  dtrain_row "dtrain-1.5B-B4" "bf16+$xatt$xrc" 4 "$xini" 48 1600
fi

tprecs=$(echo "$precs" | tr ',' '\n' | grep -v '+' | paste -sd, -)
echo "+ $PYTHON $here/bench/torch_gpt2_gpu.py --batch $batch --seq $T --steps $steps --warmup 3 --prec $tprecs $compile"
"$PYTHON" "$here/bench/torch_gpt2_gpu.py" --batch "$batch" --seq $T --steps "$steps" --warmup 3 --prec "$tprecs" \
  $compile | tee "$out/torch.out"
while read -r line; do
  case $line in
    torch\ mode=*)
      set -- $line
      mode=${2#mode=}; prec=${3#prec=}; ms=${6#step_ms=}; tok=${7#tok_s=}; mfu=${8#mfu=}; mib=${9#peak_mib=}
      table+=("$(printf '%-22s %-10s %10s %12s %7s %22s' "torch $mode" "$prec" "$ms" "$tok" "$mfu" "$mib")") ;;
  esac
done < "$out/torch.out"

echo
echo "# GPT-2 124M, B=$batch (unless the run says otherwise), T=$T, median over steps 3..$steps ($gpu); roofline ms:" \
  "dtrain's kernel roofline (dtrain plan), measured / predicted in ()"
printf '%-22s %-10s %10s %12s %7s %22s %16s\n' "run" "prec" "ms/step" "tokens/s" "MFU" "device MiB" "roofline ms"
printf '%s\n' "${table[@]}"
