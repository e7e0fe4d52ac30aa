#!/usr/bin/env bash
# The planner against a real run: GPT-2 124M (inputs/gpt2.ini, 124,439,808 parameters) trained 2
# steps on the CPU backend at dp=1, B=1, T=64, in fp32 and in bf16 (+ one fp32-stored working
# copy of the parameters), on the byte-level Austen shards (token ids
# < 256 are valid GPT-2 ids), no checkpoint (checkpoint.dir empty). After the last step rank 0
# prints its peak RSS (VmHWM) next to the plan's host total for the CPU backend. Criteria: the plan is within 10% of the measured peak
# (the plan leaves out the ~170 MiB the process holds before any model memory: libraries, MPI,
# the CUDA runtime in CUDA builds), and plan + that measured pre-model RSS is within 3%. Third,
# an activation-dominated run (inputs/tiny.ini, B=16, T=128): plan + pre-model RSS within 5%, also
# with activation recomputation (train.recompute), whose measured saving is within 15% of the plan's.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
cd "$top_builddir"
for prec in fp32 bf16; do
  run "$DTRAIN" "$top_srcdir/inputs/gpt2.ini" system.backend=cpu train.threads=1 parallel.dp=1 \
    train.micro_batch=1 train.global_batch=0 train.grad_accum=1 model.seq_len=64 train.steps=2 \
    train.eval_every=0 train.precision=$prec data.train="$DATA/austen_train_*.bin" data.val= log.metrics= \
    checkpoint.dir= checkpoint.resume=never > "$t/$prec.out"
  grep -E '^# (model|plan: world|  total host)|^# memory' "$t/$prec.out"
done
# activation-dominated: inputs/tiny.ini (B=16, T=128: 160 of the plan's 215 MB are activations)
run "$DTRAIN" "$top_srcdir/inputs/tiny.ini" system.backend=cpu train.threads=1 parallel.dp=1 train.steps=2 \
  train.eval_every=0 data.train="$DATA/austen_train_*.bin" data.val= log.metrics= checkpoint.dir="$t/ckpt_tiny" \
  checkpoint.resume=never > "$t/tiny.out"
grep -E '^#   (activations, CPU|total host)|^# memory' "$t/tiny.out"
# the same with activation recomputation (train.recompute): the plan's saving must show in the RSS
run "$DTRAIN" "$top_srcdir/inputs/tiny.ini" system.backend=cpu train.threads=1 parallel.dp=1 train.steps=2 \
  train.recompute=true train.eval_every=0 data.train="$DATA/austen_train_*.bin" data.val= log.metrics= \
  checkpoint.dir="$t/ckpt_tinyrc" checkpoint.resume=never > "$t/tinyrc.out"
grep -E '^#   (activations, CPU|total host)|^# memory' "$t/tinyrc.out"
"$PY" - "$t" <<'PY'
import re, sys
plans, rsses = {}, {}
for prec in ("fp32", "bf16", "tiny", "tinyrc"):
    line = [l for l in open(f"{sys.argv[1]}/{prec}.out") if l.startswith("# memory:")]
    assert len(line) == 1, f"{prec}: no '# memory:' line"
    m = re.search(r"VmHWM\) ([\d.]+) MiB; planned host total \(CPU backend, zero0\) ([\d.]+) MiB.*"
                  r"\+ ([\d.]+) MiB resident before the model.* = ([\d.]+) MiB", line[0])
    assert m, line[0]
    rss, plan, base, both = map(float, m.groups())
    plans[prec], rsses[prec] = plan, rss
    print(f"{prec}: peak RSS {rss:.1f} MiB, plan {plan:.1f} MiB ({100*(plan-rss)/rss:+.1f}%), "
          f"plan + pre-model RSS {base:.1f} = {both:.1f} MiB ({100*(both-rss)/rss:+.1f}%)")
    if prec.startswith("tiny"):  # small, so the unplanned few MB (thread stacks, BLAS buffers) weigh more
        assert abs(both - rss) <= 0.05 * rss, f"{prec}: plan + pre-model RSS not within 5% of the measured peak RSS"
        continue
    assert plan > 4 * 124439808 * 4 / 2**20, "the plan must hold at least the four fp32 arenas"
    assert abs(plan - rss) <= 0.10 * rss, f"{prec}: plan not within 10% of the measured peak RSS"
    assert abs(both - rss) <= 0.03 * rss, f"{prec}: plan + pre-model RSS not within 3% of the measured peak RSS"
# bf16 adds exactly the fp32-stored working copy: one arena, 124,475,904 floats at T=1024 minus
# the (1024 - 64) x 768 rows of wpe not needed at seq_len = 64
arena = (124475904 - (1024 - 64) * 768) * 4 / 2**20
extra = plans["bf16"] - plans["fp32"]
print(f"bf16 - fp32 plan: {extra:.1f} MiB (one arena: {arena:.1f} MiB)")
assert abs(extra - arena) < 0.2, "bf16 should add one fp32 working copy"
saved_plan, saved_rss = plans["tiny"] - plans["tinyrc"], rsses["tiny"] - rsses["tinyrc"]
print(f"tiny.ini with recompute: planned saving {saved_plan:.1f} MiB, measured peak RSS saving {saved_rss:.1f} MiB")
assert saved_plan > 50 and abs(saved_rss - saved_plan) <= 0.15 * saved_plan, "recompute: measured saving off the plan"
print("plan_mem: OK")
PY
