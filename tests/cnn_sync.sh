#!/usr/bin/env bash
# The image classifiers' gradients through GPT-2's sync strategies (src/parallel/sync.h, issue #25):
# a ResNet-18 of width 16 (701,178 parameters, AdamW) on Fashion-MNIST, 4 steps of 8 images as
# dp = 2 x 4 images, a checkpoint every 2 steps:
#  1. DDP's buckets start during backward as the model reports final gradients (cnn.h `ready`):
#     parallel.bucket_mb = 1 (3 buckets, the last layers' all-reduced while backward still runs)
#     gives bitwise the losses, gradient norms and final checkpoint of one bucket all-reduced after
#     backward (bucket_mb = 100). A bucket started before all of its gradients were added (a
#     shortcut convolution is stored after its block's, but runs backward later) would differ.
#     The end-of-run '# ddp:' overlap line is printed.
#  2. parallel.zero = 1 and 2 (AdamW's m, v sharded; ZeRO-2 also reduces each bucket to its owners
#     during backward) give bitwise DDP's losses, norms and final checkpoint (parameters, m, v). The
#     shard bound lies inside a row of layer4.0.conv2.weight (128, 128, 3, 3) here, so the writer
#     selects that 4-D box as the hyperslabs of its pieces.
#  3. resume across strategies: ZeRO-2's step-2 checkpoint resumed with DDP, DDP's with ZeRO-1:
#     steps 3-4 and the final checkpoints bitwise those of the straight runs;
#  4. ZeRO-3 (parameters sharded, each tensor gathered around its use by the model's layer hook,
#     the next one prefetched; the running statistics kept whole): bitwise DDP's losses, norms and
#     final checkpoint, also when resumed from DDP's step-2 checkpoint, and DDP resumed from ZeRO-3's
#     (whose parameters each rank wrote from its own shard); a ResNet-18's arena order differs from
#     its operation order (a shortcut's convolution is stored after its block's), so some prefetches
#     miss: a miss that brought or dropped the wrong tensor would change the numbers; the run's
#     `# zero3:` gather line agrees with its own step times (tests/ref/overlap_report.py);
#     With 2 micro-batches per rank (grad_accum = 2: every forward and backward gathers again)
#     ZeRO-3 gives bitwise ZeRO-2's rows (both reduce each micro-batch's buckets to their owners;
#     DDP sums the micro-batches first, a different rounding: measured 1.6e-7 apart in a norm of 7.7);
#  5. the SimpleCNN (convolution biases) evaluated under ZeRO-3 on 10,000 test images in batches of
#     48 (209 batches: rank 1 runs one forward for the gathers only) gives DDP's test loss and
#     accuracy bitwise, the training rows too; the ResNet-18 in bf16 at ZeRO-3 (the working copy
#     gathered, the fp32 master sharded: zero.h) gives bitwise ZeRO-2's rows and final checkpoint;
#  6. model.sync_bn = false (batch norm per rank, PyTorch DDP's plain BatchNorm): the SimpleCNN at dp = 2
#     x 16 images gives dp = 1's rows with 2 micro-batches of 16 (each micro-batch its own
#     statistics: the same gradients, summed in another order; within 1e-6, measured bitwise), not
#     the synchronised run's; rank 0's running statistics broadcast after every step make DDP's
#     final checkpoint (each rank writes 1/dp of every tensor) bitwise ZeRO-3's (each rank its
#     shard): without the broadcast bn1.running_mean differed by 4.6;
#  7. the end-of-run '# batch norm:' line, what synchronised batch norm's sums cost in waits for the
#     slower rank: rank 1 sleeping 0.5 s a step before forward (DTRAIN_FAULT=slow_rank) shows as
#     rank 0 waiting >= 450 ms a step, the ranks' mean >= 150 ms above the quiet run's; 4 sums a
#     step for the SimpleCNN's 2 batch norms; no line with batch norm per rank. The straggler
#     report (log.straggler_every, as GPT-2's: tests/straggler.sh) names rank 1 in every step's line
#     and JSONL row, its time outside communication >= 500 ms, rank 0's below.
source "$top_srcdir/tests/lib.sh"
begin_test
need_fmnist
ini="$top_srcdir/inputs/fmnist.ini"
rn="model.arch=resnet18 model.width=16 train.optimizer=adamw train.lr=1e-3 train.steps=4 train.global_batch=8"
rn="$rn train.micro_batch=4 train.eval_every=0 log.every=1 checkpoint.every=2 data.val="
go() { # name, overrides...
  local n=$1
  shift
  mpi 2 "$DTRAIN" "$ini" $rn log.metrics="$t/$n.jsonl" checkpoint.dir="$t/ck-$n" "$@" > "$t/$n.out"
}
go ddp parallel.bucket_mb=1
go one parallel.bucket_mb=100
go z1 parallel.zero=1 parallel.bucket_mb=1
go z2 parallel.zero=2 parallel.bucket_mb=1
go z3 parallel.zero=3 parallel.bucket_mb=1
go a2 parallel.zero=2 parallel.bucket_mb=1 train.micro_batch=2 checkpoint.every=0
go a3 parallel.zero=3 parallel.bucket_mb=1 train.micro_batch=2 checkpoint.every=0
grep '^# gradients\|^# ddp' "$t/ddp.out" "$t/one.out" "$t/z2.out"
grep -q '^# gradients: ddp over dp=2 (parallel.zero = 0), 3 buckets' "$t/ddp.out" || { echo "FAIL: ddp's line"; exit 1; }
grep -q '^# ddp: 3 buckets' "$t/ddp.out" || { echo "FAIL: no '# ddp:' report"; exit 1; }
grep -q '^# gradients: zero2 over dp=2 (parallel.zero = 2)' "$t/z2.out" || { echo "FAIL: zero2's line"; exit 1; }
# 3. resumes across strategies (each from the other's step-2 checkpoint)
mkdir "$t/ck-x" "$t/ck-y" "$t/ck-u" "$t/ck-w"
cp "$t/ck-z2/ckpt_00000002.h5" "$t/ck-x/"
cp "$t/ck-ddp/ckpt_00000002.h5" "$t/ck-y/"
cp "$t/ck-ddp/ckpt_00000002.h5" "$t/ck-u/"
cp "$t/ck-z3/ckpt_00000002.h5" "$t/ck-w/"
go x parallel.bucket_mb=1 checkpoint.resume=auto
go y parallel.zero=1 parallel.bucket_mb=1 checkpoint.resume=auto
go u parallel.zero=3 parallel.bucket_mb=1 checkpoint.resume=auto
go w parallel.bucket_mb=1 checkpoint.resume=auto
grep '^# resume\|^# zero3' "$t/x.out" "$t/y.out" "$t/u.out" "$t/w.out" "$t/z3.out"
grep -q '^# gradients: zero3 over dp=2 (parallel.zero = 3)' "$t/z3.out" || { echo "FAIL: zero3's line"; exit 1; }
"$PY" "$top_srcdir/tests/ref/overlap_report.py" "$t/z3.out" "$t/z3.jsonl" zero3 # its gather line, against its own steps
"$PY" - "$t" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{d}/{n}.jsonl"))]
ref = rows("ddp")
assert [s for s, _, _ in ref] == [1, 2, 3, 4], ref
for n, want in (("one", ref), ("z1", ref), ("z2", ref), ("z3", ref), ("x", ref[2:]), ("y", ref[2:]), ("u", ref[2:]),
                ("w", ref[2:])):
    got = rows(n)
    print(f"{n:>3}: " + "  ".join(f"{s} {l:.9f} {g:.8f}" for s, l, g in got))
    assert got == want, f"{n}: not bitwise DDP's (bucket_mb = 1) steps"
print("bitwise equal: one bucket after backward, ZeRO-1, ZeRO-2, ZeRO-3, and the four resumes across strategies")
a2, a3 = rows("a2"), rows("a3")
print("grad_accum 2: zero2 " + "  ".join(f"{s} {l:.9f} {g:.8f}" for s, l, g in a2))
assert a3 == a2 and len(a2) == 4, "ZeRO-3 with grad_accum = 2: not bitwise ZeRO-2's steps"
print("bitwise equal: ZeRO-3 and ZeRO-2 with 2 micro-batches per rank")
PY
for n in one z1 z2 z3 x y u w; do
  "$PY" "$top_srcdir/tests/ref/tensors_match.py" "$t/ck-ddp/ckpt_00000004.h5" 0 0 0 "$t/ck-$n/ckpt_00000004.h5=$n"
done
# 5. ZeRO-3's evaluation rounds (every rank runs as many forwards), and ZeRO-3 in bf16
ev="train.steps=2 train.global_batch=96 train.micro_batch=48 train.eval_every=2 log.every=1 checkpoint.dir="
mpi 2 "$DTRAIN" "$ini" $ev log.metrics="$t/e0.jsonl" > "$t/e0.out"
mpi 2 "$DTRAIN" "$ini" $ev parallel.zero=3 log.metrics="$t/e3.jsonl" > "$t/e3.out"
"$PY" - "$t" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: [(r["step"], r["loss"], r["grad_norm"], r.get("val_loss"), r.get("val_acc"))
                  for r in map(json.loads, open(f"{d}/{n}.jsonl"))]
a, b = rows("e0"), rows("e3")
print("ddp:  ", a, "\nzero3:", b)
assert any(r[3] is not None for r in a), "no evaluation row"
assert a == b, "ZeRO-3's training or evaluation rows differ from DDP's"
print("SimpleCNN: ZeRO-3's evaluation (209 batches over 2 ranks) and steps bitwise DDP's")
PY
for z in 2 3; do
  mpi 2 "$DTRAIN" "$ini" $rn train.precision=bf16 parallel.zero=$z parallel.bucket_mb=1 log.metrics="$t/h$z.jsonl" \
    checkpoint.dir="$t/ck-h$z" > "$t/h$z.out"
done
"$PY" - "$t" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{d}/{n}.jsonl"))]
a, b = rows("h2"), rows("h3")
assert len(a) == 4 and a == b, f"ResNet-18 bf16: ZeRO-3's rows {b} differ from ZeRO-2's {a}"
print("ResNet-18 bf16: ZeRO-3's 4 steps bitwise ZeRO-2's")
PY
"$PY" "$top_srcdir/tests/ref/tensors_match.py" "$t/ck-h2/ckpt_00000004.h5" 0 0 0 "$t/ck-h3/ckpt_00000004.h5=bf16-z3"
# 6. batch norm per rank
pr="train.steps=4 train.global_batch=32 train.micro_batch=16 train.warmup=2 log.every=1 train.eval_every=0 data.val="
pr="$pr checkpoint.every=0"
mpi 1 "$DTRAIN" "$ini" $pr log.metrics="$t/p1.jsonl" checkpoint.dir="$t/ck-p1" > "$t/p1.out"
mpi 2 "$DTRAIN" "$ini" $pr log.metrics="$t/ps.jsonl" checkpoint.dir="$t/ck-ps" > "$t/ps.out"
mpi 2 "$DTRAIN" "$ini" $pr model.sync_bn=false log.metrics="$t/p2.jsonl" checkpoint.dir="$t/ck-p2" > "$t/p2.out"
mpi 2 "$DTRAIN" "$ini" $pr model.sync_bn=false parallel.zero=3 log.metrics="$t/p3.jsonl" checkpoint.dir="$t/ck-p3" \
  > "$t/p3.out"
grep '^# batch' "$t/p2.out"
grep -q "batch norm per rank (model.sync_bn = false)" "$t/p2.out" || { echo "FAIL: p2's batch line"; exit 1; }
"$PY" - "$t" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda n: [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{d}/{n}.jsonl"))]
one, syn, per = rows("p1"), rows("ps"), rows("p2")
worst = max(max(abs(a[1] - b[1]) / abs(a[1]), abs(a[2] - b[2]) / abs(a[2])) for a, b in zip(one, per))
print(f"per-rank batch norm at dp=2 vs dp=1 x 2 micro-batches: worst relative difference {worst:.2e}")
assert len(per) == 4 and worst <= 1e-6, "dp=2 with batch norm per rank is not dp=1 with 2 micro-batches"
gap = max(abs(a[1] - b[1]) for a, b in zip(syn, per))
assert gap > 1e-4, f"synchronised and per-rank batch norm within {gap:.1e}: the key did nothing"
print(f"synchronised batch norm differs by up to {gap:.2e} in the loss, as it should")
PY
"$PY" "$top_srcdir/tests/ref/tensors_match.py" "$t/ck-p2/ckpt_00000004.h5" 0 0 0 "$t/ck-p3/ckpt_00000004.h5=per-rank-z3"
# 7. synchronised batch norm's price: rank 1 sleeping 0.5 s before each step's forward
#    (DTRAIN_FAULT=slow_rank) makes rank 0 wait that long in the first batch norm's sum
DTRAIN_FAULT=slow_rank@1 mpi 2 -x DTRAIN_FAULT "$DTRAIN" "$ini" $pr log.metrics="$t/pw.jsonl" \
  checkpoint.dir="$t/ck-pw" > "$t/pw.out"
grep '^# batch norm:' "$t/ps.out" "$t/pw.out"
! grep -q '^# batch norm:' "$t/p2.out" || { echo "FAIL: a batch norm wait line with model.sync_bn = false"; exit 1; }
"$PY" - "$t/ps.out" "$t/pw.out" <<'PY'
import re, sys
def line(f):
    m = re.search(r"^# batch norm: synchronised over dp = 2, (\d+) sums a step; waiting in them for the slower ranks "
                  r"([\d.]+) ms a step \(the ranks' mean; at most ([\d.]+)\), ([\d.]+)% of the ([\d.]+) ms step", open(f).read(), re.M)
    assert m, f"{f}: no batch norm wait line"
    return [float(v) for v in m.groups()]
quiet, slow = line(sys.argv[1]), line(sys.argv[2])
# the SimpleCNN's 2 batch norms: 2 sums forward, 2 backward (both need their input gradient)
assert quiet[0] == 4 and slow[0] == 4, f"sums a step: {quiet[0]}, {slow[0]} (expected 4)"
assert 450 <= slow[2] <= 1500, f"rank 0 waited at most {slow[2]} ms a step behind a rank sleeping 500 ms"
assert 200 <= slow[1] <= 800 and slow[1] - quiet[1] >= 150, f"the ranks' mean wait {slow[1]} ms (quiet run {quiet[1]})"
assert abs(slow[3] - 100 * slow[1] / slow[4]) < 0.2, "the share is not the mean wait over the step"
print(f"batch norm waits: {quiet[1]:.1f} ms a step, {slow[1]:.1f} (at most {slow[2]:.1f}) behind a rank sleeping 500 ms")
PY
[ "$(grep -c '^# straggler: step [1-4]: ms per step outside communication over 2 ranks: .*(slowest: rank 1, host ' \
  "$t/pw.out")" -eq 4 ] || { grep '^# straggler' "$t/pw.out"; echo "FAIL: want 4 straggler lines naming rank 1"; exit 1; }
"$PY" - "$t/pw.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2, 3, 4], rows
for r in rows:  # rank 0's waits in the sums count as communication, rank 1's sleep does not
    assert r["slowest_rank"] == 1 and r["rank_ms_max"] >= 500 > r["rank_ms_min"], r
print("straggler rows: rank 1 the slowest in every step, max %.1f ms, min %.1f ms" % (rows[-1]["rank_ms_max"], rows[-1]["rank_ms_min"]))
PY
echo "cnn_sync: OK"
