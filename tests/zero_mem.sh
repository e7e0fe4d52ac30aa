#!/usr/bin/env bash
# ZeRO memory, measured: GPT-2 124M (inputs/gpt2.ini) at dp=4 on the CPU backend, B=1, T=64,
# one step, zero=0, 1, 2 and 3, and zero=2 and 3 in bf16. Rank 0's peak RSS (VmHWM, printed after the last step) must fall
# from stage to stage by at least 90% of what the planner says each saves (stage 1: 3/4 of the
# AdamW m and v arenas; stage 2: 3/4 of the gradient arena; stage 3: 3/4 of the parameters less
# the embeddings, ln_f and 2 blocks it holds gathered; in bf16 3/4 of the fp32 master and of the
# working copy, less those), and for each
# stage the planner's host total plus the pre-model RSS must be within 10% of the measured peak
# (DeepSpeed's estimators are known to be off by 2x). The runs keep no checkpoint (checkpoint.dir
# empty, resume = auto): each says so, and none reads or writes one.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
cd "$top_builddir"
mkdir "$t/cwd" # each run's working directory: an empty checkpoint.dir must leave it empty
dt=$(realpath "$DTRAIN") ini=$(realpath "$top_srcdir/inputs/gpt2.ini") data=$(realpath "$DATA")
for run in 0 1 2 3 b2 b3; do # b: bf16 (stage 3 gathers the working copy, the master stays sharded)
  z=${run#b} prec=fp32
  [ "$run" = "$z" ] || prec=bf16
  (cd "$t/cwd" && mpi 4 "$dt" "$ini" system.backend=cpu train.threads=1 parallel.zero=$z train.precision=$prec \
    train.micro_batch=1 train.global_batch=0 train.grad_accum=1 model.seq_len=64 train.steps=1 \
    train.eval_every=0 data.train="$data/austen_train_*.bin" data.val= log.metrics= \
    checkpoint.dir= > "$t/z$run.out")
  grep -E '^#   (AdamW m|total host)|^# memory' "$t/z$run.out"
  grep '^# no checkpoints: checkpoint.dir is empty' "$t/z$run.out" || { echo "FAIL: zero=$run: no 'no checkpoints' line"; exit 1; }
  ! grep '^# \(checkpoint\|resume\):' "$t/z$run.out" || { echo "FAIL: zero=$run: checkpoint.dir is empty, yet a checkpoint line"; exit 1; }
done
[ -z "$(ls -A "$t/cwd")" ] || { echo "FAIL: an empty checkpoint.dir wrote into the working directory: $(ls -A "$t/cwd")"; exit 1; }
"$PY" - "$t" <<'PY'
import re, sys
got = {}
for z in (0, 1, 2, 3, "b2", "b3"):
    line = [l for l in open(f"{sys.argv[1]}/z{z}.out") if l.startswith("# memory:")]
    assert len(line) == 1, f"zero={z}: no '# memory:' line"
    m = re.search(r"VmHWM\) ([\d.]+) MiB; planned host total \(CPU backend, zero(\d)\) ([\d.]+) MiB.*"
                  r"\+ ([\d.]+) MiB resident before the model.* = ([\d.]+) MiB", line[0])
    assert m, line[0]
    rss, zs, plan, base, both = float(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5])
    assert zs == int(str(z)[-1]), f"the plan line names zero{zs}, the run is zero={z}"
    got[z] = (rss, plan)
    print(f"zero={z}: rank 0 peak RSS {rss:.1f} MiB; plan {plan:.1f} + pre-model {base:.1f} = {both:.1f} MiB "
          f"({100 * (both - rss) / rss:+.1f}%)")
    assert abs(both - rss) <= 0.10 * rss, f"zero={z}: plan not within 10% of the measured peak"
arena = 124439808 * 4 / 2**20  # one fp32 arena of 124M
# stage 3 also holds the embeddings, ln_f and 2 blocks gathered: its plan saves less than 3/4
# bf16: stage 3 shards the master and the (fp32-stored) working copy, less the gathered groups
for a, b, what, want, floor in ((0, 1, "m and v", 2 * arena, 0.7), (1, 2, "the gradients", arena, 0.7),
                                (2, 3, "the parameters", arena, 0.4),
                                ("b2", "b3", "the bf16 parameters and working copy", 2 * arena, 0.55)):
    drop, pdrop = got[a][0] - got[b][0], got[a][1] - got[b][1]
    print(f"zero={b} vs zero={a}: saves {drop:.1f} MiB measured, {pdrop:.1f} MiB planned "
          f"(3/4 of {what} = {0.75 * want:.1f} MiB)")
    assert pdrop > floor * want, f"the plan should divide {what} by 4"
    assert drop > 0, f"zero={b} must need less memory than zero={a}"
    assert drop >= 0.9 * pdrop, "measured saving below 90% of the planned one"
print("zero_mem: OK")
PY
