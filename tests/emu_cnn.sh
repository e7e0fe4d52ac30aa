#!/usr/bin/env bash
# The image classifiers trained on the CUDA backend through the CUDA emulation (dtrain_emu,
# system.backend=cuda: src/model/cnn.c over cuda/backend_cuda_cnn.cu) against the CPU backend:
#   1. inputs/fmnist.ini's SimpleCNN, 8 steps of 32 real Fashion-MNIST images, an evaluation on 200
#      test images at step 8: every step's loss within 1e-4 relative and grad norm within 1e-3, the
#      test loss within 1e-5 and the same top-1 accuracy. The backends differ in summation orders
#      only; batch norm over 32 images amplifies that at the learning rate's peak: measured worst
#      1.6e-5 (loss) and 7.7e-5 (norm) at step 7, both for cpu vs cuda and for cuda dp=1 vs dp=2;
#   2. dp = 2 on the emulated CUDA backend (2 devices, DTRAIN_EMU_DEVICES=2: batch norm synchronised
#      through the host, gradients all-reduced by the emulated NCCL during backward) against dp = 1
#      on it, the same tolerances;
#   3. a checkpoint written by the CUDA backend after step 4 (checkpoint.every) resumed on the CPU
#      backend: steps 5-8 as the CPU's straight run (the device arenas staged through the host
#      both ways), the same tolerances;
#   4. ResNet-18 (width 4, AdamW, residual adds, stride-2 shortcuts), 4 steps: losses within 1e-5,
#      norms within 1e-4 (measured 4e-8 and 2e-7);
#   5. ZeRO-2 in bf16 at dp = 2 (a SimpleCNN of width 8; gradients reduce-scattered during backward, the momentum sharded,
#      parameters all-gathered on the devices), 4 steps, against the CPU backend's same run: losses
#      within 1e-4, norms within 1e-3 (measured 1.7e-8 and 0; at width 32 1.2e-5 and 2e-4: values on
#      either side of a bf16 rounding boundary).
#   7. the planner's device total (plan_cnn.c: arenas, activations with the CUDA convolution
#      scratch, + an assumed 512 MiB context) against the emulated device's allocations (its
#      cudaMemGetInfo counts them exactly, with no context): the SimpleCNN (B=32, with a
#      checkpoint's staging), ResNet-18 (B=8) and the ZeRO-2 bf16 run at dp=2 within 1% once the
#      512 MiB are taken off (measured: equal to the printed 0.1 MiB);
#   8. ZeRO-3 at dp = 2 on the emulated devices (ResNet-18 width 4, fp32: each parameter tensor
#      broadcast from its owner by the emulated NCCL before its use, cleared after; the running
#      statistics whole), 4 steps, against the CPU backend's same run: losses within 1e-5, norms
#      within 1e-4; its planned device total (whole arenas: the classifiers' are not sparse) within
#      1% as in 7;
#   9. batch norm per rank (model.sync_bn = false) at dp = 2 on the emulated devices (the SimpleCNN
#      of 5): rank 0's running statistics broadcast by the emulated NCCL after every step; 4 steps
#      against the CPU backend's same run: losses within 1e-5, norms within 1e-4, and the final
#      checkpoints (parameters, running statistics: written in pieces by both ranks, so statistics
#      that differed between the ranks would show) within 1e-4 (measured 2.3e-7);
#  10. system.conv, system.batchnorm and system.pool = cudnn (the convolutions, batch norm's training
#      passes and the pooling through cuda/conv_cudnn.cu, here on the emulation's cuDNN:
#      cuda/emu/cudnn.cpp): ResNet-18 (global average pooling) as in 4 against the same CPU run, the
#      same tolerances; the SimpleCNN's (max pooling, whose backward finds each maximum again in the
#      pooling's input and output) per-rank batch norm run
#      of 9 with 2 micro-batches of 8 per step (cuDNN's parameter gradients accumulated onto the
#      first micro-batch's) against the CPU's same run, losses within 1e-5, norms within 1e-4; and
#      system.batchnorm = cudnn with synchronised batch norm at dp = 2 refused in one line;
#   6. bf16 and fp16: the convolutions' and the linear layer's products on 16-bit tensor cores
#      (cublasGemmEx FAST_16BF/_16F) must see only values already rounded to that format (the
#      images are rounded on upload like every stored activation): 2 steps of the SimpleCNN (width
#      8) and of ResNet-18 (width 4) each with DTRAIN_EMU_EXACT16, under which the emulated cuBLAS
#      fails any such product holding a value the conversion would change.
source "$top_srcdir/tests/lib.sh"
begin_test
need_fmnist
EMU="$top_builddir/dtrain_emu"
ini="$top_srcdir/inputs/fmnist.ini"
fmnist_test_head 200 "$t/test"
sc="train.steps=8 train.global_batch=32 train.warmup=2 train.eval_every=8 log.every=1 train.threads=1"
sc="$sc data.val=$t/test-images data.val_labels=$t/test-labels"
mpi 1 "$DTRAIN" "$ini" $sc train.micro_batch=32 log.metrics="$t/cpu.jsonl" checkpoint.dir= > "$t/cpu.out"
mpi 1 "$EMU" "$ini" $sc system.backend=cuda train.micro_batch=32 log.metrics="$t/cuda.jsonl" \
  checkpoint.dir="$t/ck-cuda" checkpoint.every=4 > "$t/cuda.out"
grep '^# backend' "$t/cuda.out"
grep -q '^# backend: cuda' "$t/cuda.out" || { echo "FAIL: dtrain_emu did not train on the cuda backend"; exit 1; }
mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "$ini" $sc system.backend=cuda train.micro_batch=16 \
  log.metrics="$t/cuda2.jsonl" checkpoint.dir= > "$t/cuda2.out"
grep -q '^# batch: micro_batch=16 x grad_accum=1 x dp=2 = 32 images per step; batch norm synchronised over dp' \
  "$t/cuda2.out" || { echo "FAIL: the dp=2 run is not synchronised batch norm over dp=2"; exit 1; }
mpi 1 "$DTRAIN" "$ini" $sc train.micro_batch=32 log.metrics="$t/resumed.jsonl" checkpoint.dir= \
  checkpoint.resume="$t/ck-cuda/ckpt_00000004.h5" > "$t/resumed.out"
grep '^# resume' "$t/resumed.out"
rn="model.arch=resnet18 model.width=4 train.optimizer=adamw train.lr=1e-3 train.steps=4 train.global_batch=8"
rn="$rn train.micro_batch=8 train.warmup=2 log.every=1 train.threads=1 data.val= checkpoint.dir="
mpi 1 "$DTRAIN" "$ini" $rn log.metrics="$t/rn_cpu.jsonl" > "$t/rn_cpu.out"
mpi 1 "$EMU" "$ini" $rn system.backend=cuda log.metrics="$t/rn_cuda.jsonl" > "$t/rn_cuda.out"
z2="train.steps=4 train.global_batch=32 train.micro_batch=16 train.warmup=2 log.every=1 train.threads=1 data.val="
z2="$z2 checkpoint.dir= parallel.zero=2 train.precision=bf16 model.width=8 model.hidden=32"
for p in bf16 fp16; do
  x16="train.precision=$p train.steps=2 train.global_batch=8 train.micro_batch=8 data.val= checkpoint.dir= train.threads=1"
  mpi 1 -x DTRAIN_EMU_EXACT16=1 "$EMU" "$ini" $x16 system.backend=cuda model.width=8 model.hidden=32 > "$t/x16.out"
  mpi 1 -x DTRAIN_EMU_EXACT16=1 "$EMU" "$ini" $x16 system.backend=cuda model.arch=resnet18 model.width=4 > "$t/x16.out"
done
mpi 2 "$DTRAIN" "$ini" $z2 log.metrics="$t/z2_cpu.jsonl" > "$t/z2_cpu.out"
mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "$ini" $z2 system.backend=cuda log.metrics="$t/z2_cuda.jsonl" > "$t/z2_cuda.out"
grep -q '^# gradients: zero2 over dp=2' "$t/z2_cuda.out" || { echo "FAIL: the ZeRO-2 run is not ZeRO-2 over dp=2"; exit 1; }
mpi 2 "$DTRAIN" "$ini" $rn train.micro_batch=4 parallel.zero=3 log.metrics="$t/z3_cpu.jsonl" > "$t/z3_cpu.out"
mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "$ini" $rn train.micro_batch=4 parallel.zero=3 system.backend=cuda \
  log.metrics="$t/z3_cuda.jsonl" > "$t/z3_cuda.out"
grep '^# zero3' "$t/z3_cuda.out"
grep -q '^# gradients: zero3 over dp=2' "$t/z3_cuda.out" || { echo "FAIL: the ZeRO-3 run is not ZeRO-3 over dp=2"; exit 1; }
pb="train.steps=4 train.global_batch=32 train.micro_batch=16 train.warmup=2 log.every=1 train.eval_every=0 data.val="
pb="$pb checkpoint.every=0 model.width=8 model.hidden=32 model.sync_bn=false train.threads=1"
mpi 2 "$DTRAIN" "$ini" $pb log.metrics="$t/pb_cpu.jsonl" checkpoint.dir="$t/ck-pb-cpu" > "$t/pb_cpu.out"
mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "$ini" $pb system.backend=cuda log.metrics="$t/pb_cuda.jsonl" \
  checkpoint.dir="$t/ck-pb-cuda" > "$t/pb_cuda.out"
grep -q "batch norm per rank (model.sync_bn = false)" "$t/pb_cuda.out" || { echo "FAIL: pb_cuda's batch line"; exit 1; }
"$PY" "$top_srcdir/tests/ref/tensors_match.py" "$t/ck-pb-cpu/ckpt_00000004.h5" 1e-4 1e-3 1e-3 \
  "$t/ck-pb-cuda/ckpt_00000004.h5=per-rank batch norm cuda"
dnn="system.backend=cuda system.conv=cudnn system.batchnorm=cudnn system.pool=cudnn"
mpi 1 "$EMU" "$ini" $rn $dnn log.metrics="$t/rn_dnn.jsonl" > "$t/rn_dnn.out"
grep -q '^# backend: cuda .*convolutions: cuDNN .*; batch norm in training: cuDNN .*; pooling: cuDNN' "$t/rn_dnn.out" ||
  { echo "FAIL: rn_dnn's backend line does not name cuDNN for all three"; grep '^# backend' "$t/rn_dnn.out"; exit 1; }
mpi 2 "$DTRAIN" "$ini" $pb train.micro_batch=8 checkpoint.dir= log.metrics="$t/pa_cpu.jsonl" > "$t/pa_cpu.out"
mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "$ini" $pb train.micro_batch=8 checkpoint.dir= $dnn \
  log.metrics="$t/pa_dnn.jsonl" > "$t/pa_dnn.out"
grep -q "micro_batch=8 x grad_accum=2 x dp=2" "$t/pa_dnn.out" || { echo "FAIL: pa_dnn's batch line"; exit 1; }
if mpi 2 -x DTRAIN_EMU_DEVICES=2 "$EMU" "$ini" $pb $dnn model.sync_bn=true checkpoint.dir= > "$t/sync_dnn.out" \
  2> "$t/sync_dnn.err"; then
  echo "FAIL: system.batchnorm = cudnn with synchronised batch norm was not refused"; exit 1
fi
grep -q 'system.batchnorm = cudnn computes each rank.s statistics; with dp = 2 set model.sync_bn = false' \
  "$t/sync_dnn.err" || { echo "FAIL: no one-line refusal:"; cat "$t/sync_dnn.err"; exit 1; }
for r in cuda rn_cuda z2_cuda z3_cuda; do
  line=$(grep '^# memory: rank 0 device memory in use' "$t/$r.out") || { echo "FAIL: $r: no device memory line"; exit 1; }
  echo "$r: ${line#\# memory: rank 0 }"
  echo "$line" | awk '{ for (i = 1; i <= NF; i++) { if ($i == "use") u = $(i + 1); if ($i == "zero0)" || $i == "zero2)" || $i == "zero3)") p = $(i + 1) } }
    END { d = p - 512; exit !(u > 0 && (d - u) / u < 0.01 && (u - d) / u < 0.01) }' ||
    { echo "FAIL: $r: planned device total - 512 MiB context is not within 1% of the emulated allocations"; exit 1; }
done
"$PY" - "$t" "$top_srcdir/tests/ref" <<'PY'
import sys
d = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from metrics_match import load, agree
def steps(rows):
    return [r for r in rows if "loss" in r]
def evals(rows):
    return [(r["val_loss"], r["val_acc"]) for r in rows if r.get("val_loss") is not None]
cpu, cuda, cuda2 = load(f"{d}/cpu.jsonl"), load(f"{d}/cuda.jsonl"), load(f"{d}/cuda2.jsonl")
agree(steps(cpu), steps(cuda), "SimpleCNN cuda (emulated) vs cpu", 1e-4, 1e-3, ref_name="cpu")
agree(steps(cuda), steps(cuda2), "SimpleCNN cuda dp=2 vs dp=1", 1e-4, 1e-3, ref_name="cuda dp=1")
for name, rows in (("cuda", cuda), ("cuda dp=2", cuda2)):
    (lc, ac), (lg, ag) = evals(cpu)[-1], evals(rows)[-1]
    assert abs(lg - lc) <= 1e-5 * abs(lc) and ag == ac, f"{name}: test loss {lg} acc {ag}, cpu {lc} acc {ac}"
    print(f"ok: {name}: test loss {lg:.7f} (cpu {lc:.7f}), accuracy {ag} (cpu {ac}) on 200 images")
res = [r for r in steps(load(f"{d}/resumed.jsonl"))]
assert [r["step"] for r in res] == [5, 6, 7, 8], [r["step"] for r in res]
agree([r for r in steps(cpu) if r["step"] > 4], res, "cuda checkpoint at step 4 resumed on cpu", 1e-4, 1e-3,
      ref_name="cpu straight")
agree(steps(load(f"{d}/rn_cpu.jsonl")), steps(load(f"{d}/rn_cuda.jsonl")), "ResNet-18 w4 cuda vs cpu", 1e-5, 1e-4,
      ref_name="cpu")
agree(steps(load(f"{d}/z2_cpu.jsonl")), steps(load(f"{d}/z2_cuda.jsonl")), "ZeRO-2 bf16 dp=2 cuda vs cpu", 1e-4, 1e-3,
      ref_name="cpu")
agree(steps(load(f"{d}/z3_cpu.jsonl")), steps(load(f"{d}/z3_cuda.jsonl")), "ZeRO-3 ResNet-18 w4 dp=2 cuda vs cpu", 1e-5,
      1e-4, ref_name="cpu")
agree(steps(load(f"{d}/pb_cpu.jsonl")), steps(load(f"{d}/pb_cuda.jsonl")), "batch norm per rank dp=2 cuda vs cpu",
      1e-5, 1e-4, ref_name="cpu")
agree(steps(load(f"{d}/rn_cpu.jsonl")), steps(load(f"{d}/rn_dnn.jsonl")), "ResNet-18 w4 cuda+cuDNN vs cpu", 1e-5,
      1e-4, ref_name="cpu")
agree(steps(load(f"{d}/pa_cpu.jsonl")), steps(load(f"{d}/pa_dnn.jsonl")),
      "batch norm per rank dp=2 x 2 micro-batches cuda+cuDNN vs cpu", 1e-5, 1e-4, ref_name="cpu")
print("emu_cnn: OK")
PY
