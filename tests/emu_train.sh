#!/usr/bin/env bash
# The CUDA backend trained on the CUDA emulation (dtrain_emu: cuda/*.cu compiled as C++ and run on
# the CPU, README "CUDA emulation") against the CPU backend, tests/small.ini (20 steps, global batch 8):
#   1. 1 rank, system.backend=cuda vs cpu: every step's loss within 1e-6 relative and grad norm
#      within 1e-4 relative, final parameters within 1e-5 (per tensor ||a-b||/||a||). The two
#      backends share kmath.h's per-element math and the sgemm, but not the attention (full T x T
#      probabilities vs flash-style blocks) nor summation orders: fp32 drift only.
#   2. dp=2 through the NCCL emulation (2 ranks, DTRAIN_EMU_DEVICES=2, device = local rank): the
#      same 20 losses within 1e-6 and grad norms within 1e-4 of the 1-rank cuda run (gradients
#      averaged by ncclAllReduce on the communication stream instead of over micro-steps; AdamW
#      hides a gradient scale from the losses, the norm does not).
#   3. checkpoints across backends: cuda stopped after step 10 and resumed on the cpu backend, and
#      cpu stopped after 10 and resumed on cuda: steps 11-20 within 1e-6 of the straight runs of
#      the resuming backend.
#   4. system.tf32 = true (the emulated cuBLAS rounds every matmul's operands to TF32), steps 1-10
#      (train.stop_after): losses within 1e-3 relative of the fp32 cuda run but not all bitwise
#      equal (the switch reaches the matmuls), and the start line names the TF32 engine.
#   6. train.precision = bf16 and fp16: the linear layers' products run on 16-bit tensor cores
#      (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_16BF/_16F), which round their fp32 operands; with
#      DTRAIN_EMU_EXACT16 the emulated cuBLAS fails any such product whose operands hold a value
#      the rounding would change, so 4 steps of each (with an evaluation, with fp16's scaler)
#      prove the operands are already rounded (the model's storage rounding, the rounded weight
#      copy) and the tensor cores see exactly what the CPU backend multiplies.
#   7. host waits (the emulation counts every call that blocks the host until the GPU is done,
#      DTRAIN_EMU_WAITS): 4 steps of 1 micro-batch and of 4 micro-batches wait equally often, so
#      nothing inside a micro-step (the loss above all) makes the host wait for the GPU; the loss
#      is read once per step, after the gradient norm's wait.
#   5. system.attention = flash (cuda/attention.cu: no (T,T) matrix, backward from the row
#      log-sum-exp), without and with train.recompute: losses within 1e-6 and grad norms within
#      1e-4 of the cpu run, final parameters within 1e-5, and the start line names the kernels.
#      system.attention = cudnn stops with one line in fp32 and on the emulation (no cuDNN here;
#      tests/test_cudnn_att.c validates its graphs, scripts/gpu-check.sh runs them).
source "$top_srcdir/tests/lib.sh"
begin_test
EMU="$top_builddir/dtrain_emu"
cfg="$top_srcdir/tests/small.ini"
mpi 1 "$DTRAIN" "$cfg" log.metrics="$t/cpu.jsonl" checkpoint.dir="$t/cpu" > "$t/cpu.out"
mpi 1 "$EMU" "$cfg" system.backend=cuda log.metrics="$t/cuda.jsonl" checkpoint.dir="$t/cuda" > "$t/cuda.out"
grep '^# backend' "$t/cuda.out"
grep -q '^# backend: cuda' "$t/cuda.out" || { echo "FAIL: dtrain_emu did not train on the cuda backend"; exit 1; }
mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "$cfg" system.backend=cuda log.metrics="$t/cuda_dp2.jsonl" \
  checkpoint.dir="$t/cuda_dp2" > "$t/cuda_dp2.out"
# cuda -> cpu and cpu -> cuda at step 10
mpi 1 "$EMU" "$cfg" system.backend=cuda train.stop_after=10 log.metrics="$t/x1.jsonl" checkpoint.dir="$t/x" > /dev/null
mpi 1 "$DTRAIN" "$cfg" checkpoint.resume=auto log.metrics="$t/x1.jsonl" checkpoint.dir="$t/x" > "$t/x2.out"
mpi 1 "$DTRAIN" "$cfg" train.stop_after=10 log.metrics="$t/y1.jsonl" checkpoint.dir="$t/y" > /dev/null
mpi 1 "$EMU" "$cfg" system.backend=cuda checkpoint.resume=auto log.metrics="$t/y1.jsonl" checkpoint.dir="$t/y" > "$t/y2.out"
grep '^# resume' "$t/x2.out" "$t/y2.out"
mpi 1 "$EMU" "$cfg" system.backend=cuda system.tf32=true train.stop_after=10 log.metrics="$t/tf32.jsonl" checkpoint.dir="$t/tf32" > "$t/tf32.out"
grep -q '^# backend: cuda.*matmul: cuBLAS, TF32 tensor cores' "$t/tf32.out" || { echo "FAIL: no TF32 engine line"; exit 1; }
mpi 1 "$EMU" "$cfg" system.backend=cuda system.attention=flash log.metrics="$t/flash.jsonl" checkpoint.dir="$t/flash" \
  > "$t/flash.out"
mpi 1 "$EMU" "$cfg" system.backend=cuda system.attention=flash train.recompute=true log.metrics="$t/flash_rc.jsonl" \
  checkpoint.dir="$t/flash_rc" > "$t/flash_rc.out"
for p in bf16 fp16; do
  mpi 1 -x DTRAIN_EMU_EXACT16=1 "$EMU" "$cfg" system.backend=cuda train.precision=$p train.stop_after=4 \
    train.eval_every=2 log.metrics="$t/$p.jsonl" checkpoint.dir= > "$t/$p.out"
  grep -q "^# backend: cuda.*layer matmuls on $p tensor cores" "$t/$p.out" || { echo "FAIL: $p: no tensor-core line"; exit 1; }
done
for f in flash flash_rc; do
  grep -q '^# backend: cuda.*attention: flash kernels' "$t/$f.out" || { echo "FAIL: $f: no flash attention line"; exit 1; }
done
# system.attention = cudnn: refused with one line in fp32 (cuDNN's fused attention takes 16-bit
# inputs) and on the emulation (no cuDNN), before any step
for p in fp32 bf16; do
  if mpi 1 "$EMU" "$cfg" system.backend=cuda system.attention=cudnn train.precision=$p log.metrics="$t/cudnn_$p.jsonl" \
    checkpoint.dir= > "$t/cudnn_$p.out" 2>&1; then
    echo "FAIL: system.attention=cudnn with $p trained on the emulation"; exit 1
  fi
  want=$([ $p = fp32 ] && echo 'takes 16-bit inputs' || echo 'the CUDA emulation has no cuDNN')
  grep -q "system.attention = cudnn: .*$want" "$t/cudnn_$p.out" || { cat "$t/cudnn_$p.out"; echo "FAIL: cudnn $p: no '$want' line"; exit 1; }
  ! grep -q '"step"' "$t/cudnn_$p.jsonl" 2>/dev/null || { echo "FAIL: cudnn $p: a step was logged"; exit 1; }
  grep -m1 "system.attention = cudnn" "$t/cudnn_$p.out"
done
for mb in 8 2; do
  mpi 1 -x DTRAIN_EMU_WAITS=1 "$EMU" "$cfg" system.backend=cuda train.micro_batch=$mb train.stop_after=4 \
    log.metrics= checkpoint.dir= > "$t/waits_$mb.out" 2>&1
  grep -m1 '^dt_emu: host waits' "$t/waits_$mb.out" | sed "s/^/micro_batch $mb: /"
done
w8=$(sed -n 's/^dt_emu: host waits \([0-9]*\).*/\1/p' "$t/waits_8.out")
w2=$(sed -n 's/^dt_emu: host waits \([0-9]*\).*/\1/p' "$t/waits_2.out")
[ -n "$w8" ] && [ "$w8" = "$w2" ] || { echo "FAIL: host waits: $w8 with 1 micro-batch per step, $w2 with 4"; exit 1; }
"$PY" - "$t" "$top_srcdir/tests/ref" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
cpu, cuda, dp2, x, y, tf = load("cpu"), load("cuda"), load("cuda_dp2"), load("x1"), load("y1"), load("tf32")
for n, rows in (("cpu", cpu), ("cuda", cuda), ("cuda dp=2", dp2), ("cuda->cpu", x), ("cpu->cuda", y), ("tf32", tf)):
    want = list(range(1, 11 if n == "tf32" else 21))
    assert [r["step"] for r in rows] == want, f"{n}: steps {[r['step'] for r in rows]}"
rel = lambda a, b: abs(a - b) / abs(b)
print(f"{'step':>4} {'cpu loss':>10} {'cuda loss':>10} {'rel':>8} {'cpu gnorm':>10} {'cuda gnorm':>10} {'rel':>8} "
      f"{'dp=2 loss':>10} {'rel':>8} {'gn rel':>8}")
worst = [0.0, 0.0, 0.0, 0.0]
for a, b, c in zip(cpu, cuda, dp2):
    r = [rel(b["loss"], a["loss"]), rel(b["grad_norm"], a["grad_norm"]), rel(c["loss"], b["loss"]),
         rel(c["grad_norm"], b["grad_norm"])]
    worst = [max(w, v) for w, v in zip(worst, r)]
    print(f"{a['step']:4d} {a['loss']:10.6f} {b['loss']:10.6f} {r[0]:8.1e} {a['grad_norm']:10.6f} {b['grad_norm']:10.6f} "
          f"{r[1]:8.1e} {c['loss']:10.6f} {r[2]:8.1e} {r[3]:8.1e}")
print(f"worst: cuda vs cpu loss {worst[0]:.2e} (limit 1e-6), grad norm {worst[1]:.2e} (limit 1e-4); "
      f"cuda dp=2 vs dp=1 loss {worst[2]:.2e} (limit 1e-6), grad norm {worst[3]:.2e} (limit 1e-4: a sum over "
      f"ranks instead of the average would be 1.0)")
assert worst[0] <= 1e-6 and worst[1] <= 1e-4 and worst[2] <= 1e-6 and worst[3] <= 1e-4, "the emulated CUDA backend drifted"
wx = max(rel(b["loss"], a["loss"]) for a, b in zip(cpu[10:], x[10:]))
wy = max(rel(b["loss"], a["loss"]) for a, b in zip(cuda[10:], y[10:]))
print(f"cuda checkpoint at 10 resumed on cpu: steps 11-20 within {wx:.2e} of the cpu run; cpu checkpoint resumed on "
      f"cuda: within {wy:.2e} of the cuda run (limit 1e-6)")
assert wx <= 1e-6 and wy <= 1e-6, "resume across backends drifted"
sys.path.insert(0, sys.argv[2])
from tensors_match import worst as tensors_worst
w, name = tensors_worst(f"{d}/cpu/ckpt_00000020.h5", f"{d}/cuda/ckpt_00000020.h5")
print(f"final parameters, cuda vs cpu: worst tensor {name} {w:.2e} (limit 1e-5)")
assert w <= 1e-5, "final parameters differ"
wt = max(rel(b["loss"], a["loss"]) for a, b in zip(cuda, tf))
same = sum(a["loss"] == b["loss"] for a, b in zip(cuda, tf))
print(f"system.tf32 = true vs fp32 on cuda: losses within {wt:.2e} (limit 1e-3), {same} of 10 bitwise equal (must be < 10)")
assert wt <= 1e-3 and same < 10, "tf32 drifted or did nothing"
for n in ("flash", "flash_rc"):
    f = load(n)
    assert [r["step"] for r in f] == list(range(1, 21)), n
    wl = max(rel(b["loss"], a["loss"]) for a, b in zip(cpu, f))
    wg = max(rel(b["grad_norm"], a["grad_norm"]) for a, b in zip(cpu, f))
    w, name = tensors_worst(f"{d}/cpu/ckpt_00000020.h5", f"{d}/{n}/ckpt_00000020.h5")
    print(f"system.attention = flash{' + recompute' if n == 'flash_rc' else ''} vs cpu: loss {wl:.2e} (limit 1e-6), "
          f"grad norm {wg:.2e} (limit 1e-4), final parameters {w:.2e} ({name}, limit 1e-5)")
    assert wl <= 1e-6 and wg <= 1e-4 and w <= 1e-5, f"{n} drifted"
PY
echo "emu_train: OK"
