#!/usr/bin/env bash
# Tensor and pipeline parallelism divide the model's memory: GPT-2 124M (inputs/gpt2.ini) for one step of
# B=1, T=64 on the CPU backend. Each rank's peak resident set (maximum RSS of the process, from
# /usr/bin/time, so it includes initialisation, the step and the final sharded checkpoint write)
# at tp=4 must stay below 40% of the tp=1 process. Params, grads and AdamW m, v are 4 x 497 MB at
# tp=1; at tp=4 each rank holds a quarter of the sharded tensors (all but wpe and the layernorm
# and c_proj biases), about 4 x 127 MB, plus ~175 MB of libraries and MPI per process: ~34%.
# Each rank draws its shard of the tp=1 initialisation straight into its shard-sized arena.
source "$top_srcdir/tests/lib.sh"
ensure_data
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
cd "$top_builddir"
common=("$top_srcdir/inputs/gpt2.ini" train.micro_batch=1 train.global_batch=1 model.seq_len=64 train.steps=1
        "data.train=$DATA/austen_train_*.bin" data.val= checkpoint.resume=never system.backend=cpu train.threads=1)
# each rank's /usr/bin/time appends one line to its own file (-a -o: O_APPEND, no interleaving
# with the other ranks' stderr, which garbled the lines under load)
mpi 1 /usr/bin/time -a -o "$t/1.rss" -f "maxrss_kb %M" "$DTRAIN" "${common[@]}" checkpoint.dir="$t/c1" log.metrics="$t/1.jsonl" > "$t/1.out" 2> "$t/1.err"
mpi 4 /usr/bin/time -a -o "$t/4.rss" -f "maxrss_kb %M" "$DTRAIN" "${common[@]}" parallel.tp=4 checkpoint.dir="$t/c4" log.metrics="$t/4.jsonl" > "$t/4.out" 2> "$t/4.err"
grep '^# memory' "$t/1.out" "$t/4.out"
cat "$t/1.rss" "$t/4.rss"
one=$(awk '/^maxrss_kb/ {print $2}' "$t/1.rss")
four=$(awk '/^maxrss_kb/ {if ($2 > m) m = $2; n++} END {if (n == 4) print m}' "$t/4.rss")
[ -n "$one" ] && [ -n "$four" ] || { echo "FAIL: missing maxrss lines"; cat "$t/1.rss" "$t/4.rss" "$t/1.err" "$t/4.err"; exit 1; }
awk -v a="$one" -v b="$four" 'BEGIN {
  r = b / a
  printf "peak RSS: tp=1 %.1f MiB, tp=4 largest rank %.1f MiB = %.1f%% of tp=1 (limit 40%%)\n", a / 1024, b / 1024, 100 * r
  exit !(r < 0.40) }' || { echo "FAIL: tp=4 does not divide the memory enough"; exit 1; }

# Pipeline stages: at pp = 4 (1, 5, 5, 1 blocks; embeddings on stage 0, ln_f and a copy of the
# tied wte on stage 3) each rank holds its stage only: its peak RSS must match the plan rank 0
# prints for that stage (# plan: per pipeline stage ... total cpu) plus the pre-model resident set
# rank 0 measured, within 10%, and the largest stage stays below 55% of the pp = 1 process (the
# 38.6M-parameter embedding lives on two stages, so pp cannot divide the model evenly by 4).
mpi 4 sh -c 'exec /usr/bin/time -o "$0.$OMPI_COMM_WORLD_RANK" -f "maxrss_kb %M" "$@"' "$t/pp.rss" "$DTRAIN" "${common[@]}" \
  parallel.pp=4 checkpoint.dir="$t/cpp" log.metrics="$t/pp.jsonl" > "$t/pp.out" 2> "$t/pp.err"
grep '^# plan: per pipeline stage' -A4 "$t/pp.out"
"$PY" - "$t" "$one" <<'PY'
import re, sys
d, one = sys.argv[1], int(sys.argv[2]) / 1024
out = open(f"{d}/pp.out").read()
base = float(re.search(r"\+ ([\d.]+) MiB resident before the model", out).group(1))
rows = re.findall(r"^# plan:\s+(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+[\d.]+$", out, re.M)
assert len(rows) == 4, rows
worst = 0
for s, blocks, total_gb in rows:
    rss = int(open(f"{d}/pp.rss.{s}").read().split()[-1]) / 1024
    plan = float(total_gb) * 1e9 / 2**20 + base
    print(f"pp=4 stage {s} ({blocks} blocks): peak RSS {rss:.1f} MiB, plan {plan:.1f} MiB ({100 * (rss - plan) / plan:+.1f}%)")
    assert abs(rss - plan) <= 0.10 * plan, f"stage {s}: peak RSS {rss:.1f} MiB not within 10% of the plan {plan:.1f}"
    worst = max(worst, rss)
print(f"pp=4 largest stage {worst:.1f} MiB = {100 * worst / one:.1f}% of pp=1 ({one:.1f} MiB; limit 55%)")
assert worst < 0.55 * one
PY
echo "tp_memory: OK"
