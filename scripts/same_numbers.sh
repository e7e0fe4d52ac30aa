#!/usr/bin/env bash
# Same numbers as a reference build: a refactoring that must not change one bit (issue #21's
# steps) records a set of short training runs with the build before it and compares the build
# after it against them. A developer's script, not part of make check (it needs a second build,
# of the commit before the change); run by hand:
#   scripts/same_numbers.sh run DTRAIN DIR [key=value ...]   the runs below with binary DTRAIN into DIR
#   scripts/same_numbers.sh compare REFDIR DIR [TOL]          TOL absent: every logged loss, grad_norm,
#                                                           lr and val_loss bitwise equal and every
#                                                           checkpoint dataset (model, optimizer
#                                                           moments) bitwise equal; TOL: the same
#                                                           within TOL relative (another backend)
# The runs: tests/small.ini (2 layers, C=64, 20 steps, global batch 8) at dp=1, dp=2, tp=2,
# pp=2 with 4 micro-batches, tp=2 x pp=2, recompute (1 rank and pp=2), bf16, fp16, fp16 from a
# loss scale of 2^30 (skipped steps), tp=2 in bf16, ZeRO-1/2/3 at dp=2, dp=1 with a validation
# loss every 5 steps, recompute at tp=2, fp16 at tp=2 x pp=2, ZeRO-1 x pp=2, ZeRO-2/3 x tp=2,
# and dp=2 x tp=2 x pp=2 (8 ranks). Extra key=value arguments go to every run (system.backend=cuda
# with the emulation's dtrain_emu: the CUDA backend through the same model; the runs it cannot do
# yet, tp, pp, recompute and ZeRO, are then left out). Data: $DATA (default: data/ under the build
# tree of DTRAIN, made by scripts/get-data.sh); ONLY='dp1|tp2' runs just those.
set -euo pipefail
tests=$(cd "$(dirname "$0")/../tests" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_base_warn_component_unused=0
MPIRUN=${MPIRUN:-mpirun}

runs() { # NAME RANKS ARGS...
  cat <<'EOF'
dp1 1
dp2 2
tp2 2 parallel.tp=2
pp2 2 parallel.pp=2 train.micro_batch=2
tp2pp2 4 parallel.tp=2 parallel.pp=2
rc1 1 train.recompute=true
rcpp2 2 parallel.pp=2 train.micro_batch=2 train.recompute=true
bf16 1 train.precision=bf16
fp16 1 train.precision=fp16
fp16skip 1 train.precision=fp16 train.loss_scale_init=1073741824
tp2bf16 2 parallel.tp=2 train.precision=bf16
zero1 2 parallel.zero=1
zero2 2 parallel.zero=2
zero3 2 parallel.zero=3
eval 1 train.eval_every=5 train.eval_batches=4
rctp2 2 parallel.tp=2 train.recompute=true
fp16tp2pp2 4 parallel.tp=2 parallel.pp=2 train.precision=fp16
zero1pp2 4 parallel.zero=1 parallel.pp=2
zero2tp2 4 parallel.zero=2 parallel.tp=2
zero3tp2 4 parallel.zero=3 parallel.tp=2
hybrid 8 parallel.tp=2 parallel.pp=2
EOF
}

case "${1:-}" in
run)
  dtrain=$(realpath "$2") dir=$3
  shift 3
  data=${DATA:-$(dirname "$dtrain")/data}
  mkdir -p "$dir"
  cuda=0
  for a in "$@"; do [ "$a" = system.backend=cuda ] && cuda=1; done
  runs | while read -r name n args; do
    # what the CUDA backend runs so far (docs/architecture.md "Where the code is today")
    [ "$cuda" = 1 ] && ! [[ $name =~ ^(dp1|dp2|bf16|fp16|fp16skip|eval)$ ]] && continue
    [ -n "${ONLY:-}" ] && ! [[ $name =~ ^($ONLY)$ ]] && continue
    echo "+ $MPIRUN -n $n $dtrain small.ini $args $* -> $dir/$name"
    rm -rf "${dir:?}/$name"
    # shellcheck disable=SC2086
    DTRAIN_EMU_DEVICES=$n "$MPIRUN" --oversubscribe --bind-to none -n "$n" -x OMP_NUM_THREADS=1 -x DTRAIN_EMU_DEVICES \
      "$dtrain" "$tests/small.ini" data.train="$data/austen_train_*.bin" data.val="$data/austen_val_*.bin" $args "$@" \
      log.metrics="$dir/$name.jsonl" checkpoint.dir="$dir/$name" < /dev/null > "$dir/$name.out" 2> "$dir/$name.err" ||
      { tail -5 "$dir/$name.err"; echo "FAIL: run $name"; exit 1; }
  done
  ;;
compare)
  /usr/bin/python3 - "$2" "$3" "${4:-0}" <<'PY'
import json, os, sys
import h5py, numpy as np
ref, new, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
names = sorted(f[:-6] for f in os.listdir(new) if f.endswith(".jsonl"))
assert names, f"no runs in {new}"
bad = 0
def close(a, b):
    if tol == 0 or a is None or b is None:
        return a == b
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-30)
for name in names:
    a = [json.loads(l) for l in open(f"{ref}/{name}.jsonl")]
    b = [json.loads(l) for l in open(f"{new}/{name}.jsonl")]
    keys = ("step", "loss", "grad_norm", "lr", "val_loss", "loss_scale", "skipped")
    rows = len(a) == len(b) and all(close(x.get(k), y.get(k)) for x, y in zip(a, b) for k in keys)
    worst, nt = 0.0, 0
    for ck in sorted(os.listdir(f"{ref}/{name}")):
        if not ck.endswith(".h5"):
            continue
        f, g = h5py.File(f"{ref}/{name}/{ck}", "r"), h5py.File(f"{new}/{name}/{ck}", "r")
        def walk(grp, path=""):
            global worst, nt
            for k in grp:
                x = grp[k]
                if isinstance(x, h5py.Group):
                    walk(x, f"{path}/{k}")
                    continue
                p, q = x[()], g[f"{path}/{k}"][()]
                if isinstance(p, bytes):  # the effective config names the run's own directory
                    p, q = (v.replace(os.path.abspath(d).encode(), b"DIR").replace(d.encode(), b"DIR")
                            for v, d in ((p, ref), (q, new)))
                nt += 1
                if tol == 0:
                    if not np.array_equal(p, q):
                        worst = float("inf")
                        print(f"  {name}: {ck}:{path}/{k} differs")
                elif isinstance(p, np.ndarray) and p.dtype.kind == "f":
                    d = np.linalg.norm((p - q).ravel()) / max(np.linalg.norm(p.ravel()), 1e-30)
                    worst = max(worst, d)
                elif k != "config_ini" and not np.array_equal(p, q):  # another backend's config differs
                    worst = float("inf")
                    print(f"  {name}: {ck}:{path}/{k} differs")
        walk(f)
    ok = rows and nt > 0 and worst <= (tol * 100 if tol else 0)
    bad += not ok
    what = "bitwise equal" if tol == 0 else f"within {tol:g} (checkpoint tensors within {worst:.1e})"
    print(f"{name:10s} {len(b):2d} rows, {nt:3d} checkpoint datasets: {'OK' if ok else 'DIFFER'} ({what})")
    if not rows:
        for x, y in zip(a, b):
            if any(not close(x.get(k), y.get(k)) for k in keys):
                print(f"  first differing row: {x}\n                      {y}")
                break
sys.exit(1 if bad else 0)
PY
  ;;
*)
  sed -n '2,19p' "$0"
  exit 2
  ;;
esac
