#!/usr/bin/env bash
# Does data parallelism pay on the cores a node has, and is dtrain's overlap report true? (issue
# #27). For each model, the same global batch as (a) 1 rank x 2 threads and (b) 2 ranks x 1 thread
# (dp = 2), dtrain and PyTorch (1 process x 2 threads, the faster of two thread settings, vs DDP
# over gloo, 2 x 1), runs alternating,
# ROUNDS rounds; each run's median step time over the steps after WARMUP. Prints per model:
#   dp=2 throughput over 1 rank's (the goal: >= 0.95), for dtrain and for PyTorch DDP;
#   the share of dtrain's all-reduce hidden behind compute, as dtrain prints it ("# ddp:" line:
#   backward + all-reduce in its probe steps, every 3rd from step 2, where the all-reduce starts
#   after backward, minus the same window in the other steps, over the all-reduce alone, +- its
#   2 standard errors from the windows' spread) and as a third run implies: dp=2 with every step's
#   all-reduce after backward (parallel.ddp_probe=1), (its step - the overlapped dp=2 step) / the
#   all-reduce, per round (both runs in the same round; each run's own all-reduce time, since it
#   varies from run to run: (after step - its all-reduce + the overlapped run's - overlapped step)
#   / the overlapped run's all-reduce; a round whose two all-reduces are over 1.3x apart is left
#   out and counted), median +- 2 standard errors over the rounds: within
#   10 points of the median, or the report is not true (when the median's +- exceeds 10 points
#   the step noise is larger than the all-reduce, and the check says so; a
#   difference over 10 points that dtrain's own +- covers is said as such). Also the
#   share the 1-rank run implies (1 - (dp=2 step - 1-rank step) / the all-reduce), which mixes in
#   the difference between 1 rank x 2 threads and 2 ranks x 1 thread.
#   And a fourth and fifth run: dp=2 with MPI's nonblocking all-reduce (parallel.ddp_comm=mpi)
#   instead of the average in shared memory that auto picks on one node, overlapped and with every
#   all-reduce after backward: the transports side by side, and the same check of the printed
#   share on MPI's all-reduce, which is ~8x longer, so the rounds can resolve it.
#   The same check without a second process: in the overlapped run itself, its probe steps whole
#   against its other steps whole (they alternate, so the drift between runs cancels), over its
#   all-reduce, with 2 standard errors from the steps' spread: "within each run" (undetermined when
#   the rounds' median's 2 standard errors exceed 10 points, whatever the median says).
#   MODELS="124M" (or "30M") runs only those; MODELS=124M-T64 (not in the default "124M 30M") runs
#   124M at T = 64, where MPI's all-reduce is about a third of the step, not a tenth; MODELS=30M-T64
#   the 30M model at T = 64 and global batch 2, whose short steps (~250 ms) resolve the share of its
#   MPI all-reduce (~100 ms) to a few points. A benchmark, not a test. Run from a build tree with ./dtrain and data/ on a quiet machine.
#   usage: bench/ddp_overlap.sh [ROUNDS] [STEPS] [WARMUP]     (defaults 2, 6, 2)
set -euo pipefail
ROUNDS=${1:-2}
STEPS=${2:-6}
WARMUP=${3:-2}
SRC=$(cd "$(dirname "$0")/.." && pwd)
D=${DTRAIN:-./dtrain}
PY=${REF_PYTHON:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
t=$(mktemp -d /tmp/dtrain-ddpov.XXXXXX)
trap 'rm -rf "$t"' EXIT
echo "# ddp overlap: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
  "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo no AVX-512); $(${MPIRUN:-mpirun} --version | head -1);" \
  "torch $($PY -c 'import torch; print(torch.__version__)'); rounds $ROUNDS, steps $STEPS (median after $WARMUP)"
# MODELS: name, dtrain overrides, torch_ddp.py shape, global batch, T
models=("124M|model.n_layer=12 model.n_head=12 model.n_embd=768|--layers 12 --heads 12 --embd 768|4|256"
        "30M|model.n_layer=6 model.n_head=6 model.n_embd=384|--layers 6 --heads 6 --embd 384|8|256"
        "124M-T64|model.n_layer=12 model.n_head=12 model.n_embd=768|--layers 12 --heads 12 --embd 768|4|64"
        "30M-T64|model.n_layer=6 model.n_head=6 model.n_embd=384|--layers 6 --heads 6 --embd 384|2|64")
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
dtrain_run() { # RANKS THREADS OVERRIDES G T TAG: median ms/step to stdout; the ddp line kept in $t/TAG.ddp
  local n=$1 th=$2 ov=$3 G=$4 T=$5 tag=$6
  rm -rf "$t/$tag.jsonl" "$t/ck-$tag"
  ${MPIRUN:-mpirun} --oversubscribe --bind-to none -n "$n" "$D" "$SRC/inputs/gpt2.ini" system.backend=cpu \
    train.threads="$th" $ov train.micro_batch=$((G / n)) train.global_batch="$G" model.seq_len="$T" \
    train.steps=$((STEPS + WARMUP)) train.eval_every=0 "data.train=data/austen_train_*.bin" data.val= \
    log.metrics="$t/$tag.jsonl" checkpoint.dir="$t/ck-$tag" checkpoint.every=0 checkpoint.resume=never log.every=1 \
    > "$t/$tag.out" 2>&1
  grep '^# ddp:' "$t/$tag.out" >> "$t/$tag.ddp" || true
  "$PY" -c 'import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
probe = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # dtrain probe steps: 2, 2 + N, ... (not in the median)
print(statistics.median(r["ms"] for r in rows if r["step"] > int(sys.argv[2]) and not (probe and (r["step"] - 2) % probe == 0)))' \
    "$t/$tag.jsonl" "$WARMUP" "$PROBE"
}
within_run() { # TAG: the share the overlapped run's own steps imply, in %: (median probe step - median
  # other step) / its all-reduce alone; probe and other steps alternate in one process, so drift
  # between runs cancels (the probe steps: 2, 2 + 3, ..., as PROBE=3)
  # and its standard error (of the two medians, 1.25 x the standard error of the means), in points
  "$PY" -c 'import json, math, re, sys, statistics as st
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["step"] > int(sys.argv[2])]
probe = [r["ms"] for r in rows if (r["step"] - 2) % 3 == 0]
other = [r["ms"] for r in rows if (r["step"] - 2) % 3 != 0]
m = re.findall(r"the all-reduce alone ([0-9.]+) ms", open(sys.argv[3]).read())
if len(probe) < 2 or len(other) < 2 or not m:
    print("nan nan")
else:
    f = float(m[-1])
    se = 1.25 * math.sqrt(st.variance(probe) / len(probe) + st.variance(other) / len(other))
    print("%.1f %.1f" % (100 * (st.median(probe) - st.median(other)) / f, 100 * se / f))' \
    "$t/$1.jsonl" "$WARMUP" "$t/$1.ddp"
}
torch_run() { # RANKS THREADS SHAPE G T [ENV...]
  env "${@:6}" "$PY" "$SRC/bench/torch_ddp.py" --ranks "$1" --threads "$2" $3 --batch "$4" --seq "$5" --steps "$STEPS" \
    --warmup "$WARMUP" 2> /dev/null | sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p'
}
# PyTorch on one process with 2 threads: the faster of its defaults and OpenBLAS single-threaded
# inside torch's OpenMP ops (its two thread pools compete for 2 cores; bench/torch_gpt2.py)
torch_best() { { torch_run "$@"; torch_run "$@" OPENBLAS_NUM_THREADS=1; } | sort -g | head -1; }
for m in "${models[@]}"; do
  [[ " ${MODELS:-124M 30M} " == *" ${m%%|*} "* ]] || continue  # MODELS="124M": only those
  IFS='|' read -r name ov shape G T <<< "$m"
  : > "$t/d1" ; : > "$t/d2" ; : > "$t/d3" ; : > "$t/d4" ; : > "$t/d5" ; : > "$t/p1" ; : > "$t/p2" ; : > "$t/w2" ; : > "$t/w4"
  for r in $(seq 1 "$ROUNDS"); do
    PROBE=0 dtrain_run 1 2 "$ov" "$G" "$T" "$name-1x2" >> "$t/d1"
    PROBE=3 dtrain_run 2 1 "$ov parallel.ddp_probe=3" "$G" "$T" "$name-2x1" >> "$t/d2"
    within_run "$name-2x1" >> "$t/w2"
    PROBE=0 dtrain_run 2 1 "$ov parallel.ddp_probe=1" "$G" "$T" "$name-2x1-after" >> "$t/d3"
    PROBE=3 dtrain_run 2 1 "$ov parallel.ddp_probe=3 parallel.ddp_comm=mpi" "$G" "$T" "$name-2x1-mpi" >> "$t/d4"
    within_run "$name-2x1-mpi" >> "$t/w4"
    PROBE=0 dtrain_run 2 1 "$ov parallel.ddp_probe=1 parallel.ddp_comm=mpi" "$G" "$T" "$name-2x1-mpi-after" >> "$t/d5"
    torch_best 1 2 "$shape" "$G" "$T" >> "$t/p1"
    torch_run 2 1 "$shape" "$G" "$T" >> "$t/p2"
    printf "# %s round %d: dtrain 1x2 %.0f ms, 2x1 %.0f ms (all-reduce after backward: %.0f ms; over MPI: %.0f ms, after backward %.0f ms); torch 1x2 %.0f ms, DDP 2x1 %.0f ms\n" \
      "$name" "$r" "$(tail -1 "$t/d1")" "$(tail -1 "$t/d2")" "$(tail -1 "$t/d3")" "$(tail -1 "$t/d4")" "$(tail -1 "$t/d5")" "$(tail -1 "$t/p1")" "$(tail -1 "$t/p2")"
  done
  d1=$(median < "$t/d1") d2=$(median < "$t/d2") d4=$(median < "$t/d4") p1=$(median < "$t/p1") p2=$(median < "$t/p2")
  # dtrain's own reports (medians over each transport's overlapped runs): the hidden share it
  # prints and the all-reduce time of its probe steps
  full=$(sed -n 's/.*the all-reduce alone \([0-9.]*\) ms.*/\1/p' "$t/$name-2x1.ddp" | median)
  fmpi=$(sed -n 's/.*the all-reduce alone \([0-9.]*\) ms.*/\1/p' "$t/$name-2x1-mpi.ddp" | median)
  awk -v n="$name" -v G="$G" -v T="$T" -v d1="$d1" -v d2="$d2" -v d4="$d4" -v p1="$p1" -v p2="$p2" -v f="$full" \
      -v fm="$fmpi" 'BEGIN {
    printf "RESULT %s (global batch %d x T=%d): dtrain 1x2 %.0f ms, 2x1 %.0f ms: dp=2 at %.3fx of 1 rank; torch 1x2 %.0f ms, DDP 2x1 %.0f ms: %.3fx\n", n, G, T, d1, d2, d1 / d2, p1, p2, p1 / p2
    printf "RESULT %s transports: dp=2 averaging in shared memory %.0f ms/step (its all-reduce alone %.0f ms) vs MPI nonblocking all-reduce %.0f ms/step (%.0f ms): %.3fx of 1 rank over MPI\n", n, d2, f, d4, fm, d1 / d4
  }'
  # per transport: the printed share against the one the all-reduce-after-backward run of the
  # same round implies
  for tr in "shared memory|$name-2x1|d2|d3|$name-2x1-after|w2" "MPI|$name-2x1-mpi|d4|d5|$name-2x1-mpi-after|w4"; do
    IFS='|' read -r label tag run after atag within <<< "$tr"
    printed=$(sed -n 's/.*: \(-\?[0-9]*\)% +- [0-9]* of the all-reduce hidden.*/\1/p' "$t/$tag.ddp" | median)
    perr=$(sed -n 's/.*: -\?[0-9]*% +- \([0-9]*\) of the all-reduce hidden.*/\1/p' "$t/$tag.ddp" | median)
    f=$(sed -n 's/.*the all-reduce alone \([0-9.]*\) ms.*/\1/p' "$t/$tag.ddp" | median)
    # per round, each run's own all-reduce (it varies between runs): the overlapped run's step
    # had it hidden nothing = the after-backward run's step - its all-reduce + the overlapped run's
    sed -n 's/.*the all-reduce alone \([0-9.]*\) ms:.*/\1/p' "$t/$tag.ddp" > "$t/ar_ov"
    sed -n 's/.*the all-reduce alone \([0-9.]*\) ms (medians).*/\1/p' "$t/$atag.ddp" > "$t/ar_af"
    # Only rounds whose two all-reduces are alike (within 1.3x): Open MPI's on-node all-reduce of
    # the same buffers takes one of two times per process (e.g. ~120 or ~260 ms at 30M-T64, with
    # either binding), and a run in the slow mode is slower beyond its all-reduce alone, so a pair
    # of unlike runs measures that mode, not the overlap.
    paste "$t/$run" "$t/$after" "$t/ar_ov" "$t/ar_af" | awk -v f="$f" '{
      if (NF < 4 || $3 <= 0) printf "%.1f\n", 100 * ($2 - $1) / f
      else if ($3 <= 1.3 * $4 && $4 <= 1.3 * $3) printf "%.1f\n", 100 * ($2 - $4 + $3 - $1) / $3
      else printf "unlike\n" }' > "$t/pairs"
    shares=$(grep -v unlike "$t/pairs" | sort -g | tr '\n' ' ')
    unlike=$(grep -c unlike "$t/pairs" || true)
    wshares=$(cut -d' ' -f1 "$t/$within" | sort -g | tr '\n' ' ')
    wse=$(cut -d' ' -f2 "$t/$within" | median)
    awk -v n="$name" -v l="$label" -v printed="$printed" -v perr="$perr" -v f="$f" -v shares="$shares" -v d1="$d1" \
        -v d="$(median < "$t/$run")" -v wshares="$wshares" -v wse="$wse" -v unlike="$unlike" '
    function med(a, k) { return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }  # a sorted
    function se2(a, k, m,   i, j, v, dev) { # 2 standard errors of the median m of k rounds: 2 x 1.86 MAD / sqrt(k)
      for (i = 1; i <= k; i++) { v = a[i] > m ? a[i] - m : m - a[i]; for (j = i; j > 1 && dev[j - 1] > v; j--) dev[j] = dev[j - 1]; dev[j] = v }
      return k > 2 ? 2 * 1.86 * med(dev, k) / sqrt(k) : 999 }
    function verdict(m, e,   dif) { # the printed share against an estimate m +- e
      dif = printed > m ? printed - m : m - printed
      if (e > 10) return sprintf("undetermined: %.0f points apart, but that estimate is +- %.0f points (the step noise exceeds the all-reduce)", dif, e)
      if (dif <= 10) return sprintf("within 10 points (%.0f apart)", dif)
      return sprintf("NOT within 10 points (%.0f apart)%s", dif, dif <= perr ? ", but within the printed +- " perr : "") }
    BEGIN {
      k = split(shares, a, " "); mid = med(a, k); e = se2(a, k, mid); v = k ? verdict(mid, e) : "undetermined: no round left"
      printf "RESULT %s overlap, %s: all-reduce %.0f ms (dtrain probe steps); hidden as dtrain prints it %.0f%% +- %.0f; as a dp=2 run with every all-reduce after backward implies, per round: %s%% (median %.0f%% +- %.0f, 2 standard errors from the rounds; %d round(s) left out, their two all-reduces over 1.3x apart): %s; as the 1-rank run implies %.0f%%\n", n, l, f, printed, perr, shares, mid, e, unlike, v, 100 * (1 - (d - d1) / f)
      # inside the runs: the median over the rounds +- its 2 standard errors from the spread of the
      # rounds (with 3 rounds or more; else the +- of one run, from the spread of its steps)
      k = split(wshares, w, " "); wmid = med(w, k); we = k > 2 ? se2(w, k, wmid) : 2 * wse
      printf "RESULT %s overlap, %s, within each run (its probe steps whole vs its other steps whole, over its all-reduce): per round %s%% (median %.0f%% +- %.0f, 2 standard errors from the rounds; one run alone +- %.0f): %s\n", n, l, wshares, wmid, we, 2 * wse, verdict(wmid, we)
    }'
  done
done
