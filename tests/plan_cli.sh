#!/usr/bin/env bash
# `dtrain plan`: GPT-2 1.5B (inputs/gpt2-xl.ini) at world 8 against an 80 GiB device prints the
# seed arithmetic (6.23 GB parameters, 12.46 GB AdamW moments, 18.69 GB with the fp32 master),
# the four ZeRO columns with the fit verdicts computed here by hand (all fit 80 GiB; at 64 GiB
# zero1-3; at 52 GiB zero3 alone: the sparse device arenas of zero2/3 hold the shard and what is in
# use), the roofline rows for A100 and H100; a world of 1 with
# B=8 does not fit; tp/pp can be planned; a bad key, a bad size and a bad layout each give
# one error line naming the problem and exit status 2.
source "$top_srcdir/tests/lib.sh"
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
xl="$top_srcdir/inputs/gpt2-xl.ini"
run "$DTRAIN" plan "$xl" --world 8 --device-mem 80GiB | tee "$t/out"
fail() { echo "plan_cli: FAIL: $*"; exit 1; }
grep -q '1,557,611,200 parameters, 1,557,686,400 floats per arena' "$t/out" || fail "true parameter count"
grep -Eq 'parameters \(fp32\) +1.558e\+09 x 4 B += +6.23 GB' "$t/out" || fail "6.23 GB parameters line"
grep -Eq 'AdamW m \+ v \(fp32\) +1.558e\+09 x 8 B += +12.46 GB' "$t/out" || fail "12.46 GB moments line"
grep -q 'fp32 master + m + v = 1.558e+09 x 12 B = 18.69 GB' "$t/out" || fail "18.69 GB master line"
grep -q 'stage 1 shards m + v: 12.46 / 8 = 1.56 GB; stage 2 also the gradients: 6.23 / 8 = 0.78 GB; stage 3 also the parameters: 6.23 / 8 = 0.78 GB' "$t/out" ||
  fail "ZeRO division line"
grep -Eq 'per rank, GB .* zero0 +zero1 +zero2 +zero3' "$t/out" || fail "zero stage header"
# The fit verdicts, hand-computed from the memory model in src/app/plan.c's header (per rank, bytes):
# fp32 master 4P, bf16 working copy 4P, gradients 4P, m and v 4P each divided by dp for ZeRO
# (on the device the working copy stays whole; ZeRO-3's master holds the shard plus the gathered
# embeddings, ln_f and 3 blocks, ZeRO-2/3's gradients the shard plus the embeddings', ln_f's, 2
# blocks' and one 25 MiB bucket, each of those less the own part: cuda/sparse.h); MPI/ZeRO buffers of 2 or
# 3 x 25 MiB; the CUDA activations llm.c's layout keeps (per layer and token: ln1, qkv, atty,
# the NH*T attention row, residual2, ln2, fch, fch_gelu, residual3 = 16C + NH*T plus 4 mean/rstd;
# once per token: encoded, lnf, logits, the backward scratch = 11C + 2Vp + NH*T + 4); the token
# batch; 512 MiB CUDA context. Each case's totals lie >= 1.9 GiB from its limit, so the verdict
# does not hang on alignment or rounding, and each limit gets a different verdict line.
verdicts() { # verdicts WORLD B GIB: the expected "fits"/"NO" of zero0..3
  "$PY" - "$@" <<'PY'
import sys
world, B, gib = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
L, NH, C, V, T = 48, 25, 1600, 50257, 1024          # inputs/gpt2-xl.ini
Vp = (V + 127) // 128 * 128                          # the padded vocabulary (50304)
P = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C   # floats per arena: 1,557,686,400
bt, dp, MiB = B * T, world, 2.0 ** 20
act = 4 * bt * (L * (16 * C + 4 + NH * T) + 11 * C + 4 + 2 * Vp + NH * T)
emb, head, blk = Vp * C + T * C, 2 * C, 12 * C * C + 13 * C
out = []
for z in range(4):
    shard = lambda on: 4 * P / dp if on else 4 * P
    own = 1 - 1 / dp  # the part of a gathered or held group that is not the rank's own
    master = shard(True) + 4 * (emb + head + 3 * blk) * own if z >= 3 else 4 * P
    grads = shard(True) + (4 * (emb + head + 2 * blk) + 25 * MiB) * own if z >= 2 else 4 * P
    state = master + 4 * P + grads + 2 * shard(z >= 1)  # master, working copy, grads, m + v
    comm = ((3 if z else 2) * 25 * MiB) if dp > 1 else 0
    total = (state + comm + act + 2 * bt * 4 + 512 * MiB) / 2 ** 30
    assert abs(total - gib) >= 1.9, f"zero{z}: {total:.2f} GiB too close to {gib} GiB to judge by hand"
    out.append("fits" if total <= gib else "NO")
    print(f"world {world} B={B} zero{z}: {total:.2f} GiB by hand vs {gib:g} GiB: {out[-1]}", file=sys.stderr)
print(" ".join(out))
PY
}
check_verdicts() { # check_verdicts FILE WORLD B GIB: dtrain's verdict line is the hand-computed one
  local want got
  want=$(verdicts "$2" "$3" "$4") || fail "hand computation"
  got=$(sed -n "s/^ *fits $4 GiB device memory? *//p" "$1" | tr -s ' ')
  echo "fit verdicts, world $2, B=$3, $4 GiB: dtrain '$got', by hand '$want'"
  [ "$got" = "$want" ] || fail "fit verdicts at world $2, B=$3, $4 GiB: '$got', want '$want'"
}
check_verdicts "$t/out" 8 4 80
run "$DTRAIN" plan "$xl" --world 8 --device-mem 64GiB > "$t/64"
check_verdicts "$t/64" 8 4 64
run "$DTRAIN" plan "$xl" --world 8 --device-mem 52GiB > "$t/52"
check_verdicts "$t/52" 8 4 52
for g in A100-SXM4-80GB H100-SXM5-80GB; do
  [ "$(grep -c "^roofline: $g" "$t/out")" = 3 ] || fail "3 roofline rows for $g"
done
# one device, B=8: the (B,NH,T,T) attention buffers alone exceed 80 GiB
run "$DTRAIN" plan "$xl" train.micro_batch=8 train.global_batch=0 --device-mem 80GiB > "$t/one"
grep -Eq '^ +fits 80 GiB device memory\? +NO +NO +NO +NO$' "$t/one" || fail "B=8 on one device should not fit"
check_verdicts "$t/one" 1 8 80
# tp/pp cannot train yet but are planned
run "$DTRAIN" plan "$xl" parallel.tp=5 parallel.pp=4 --world 40 > "$t/tppp"
grep -q 'world 40 = dp 2 x tp 5 x pp 4' "$t/tppp" || fail "tp/pp layout"
grep -q 'pipeline stages' "$t/tppp" || fail "pipeline stage list"
# errors: one line on stderr, exit status 2
expect_error() {
  local what=$1 pattern=$2
  shift 2
  set +e
  "$DTRAIN" plan "$@" > "$t/o" 2> "$t/e"
  local rc=$?
  set -e
  echo "+ dtrain plan $* -> exit $rc: $(cat "$t/e")"
  [ "$rc" = 2 ] || fail "$what: exit status $rc, want 2"
  [ "$(wc -l < "$t/e")" = 1 ] || fail "$what: want exactly one error line"
  grep -q "$pattern" "$t/e" || fail "$what: message should mention '$pattern'"
}
expect_error "unknown key" "nosuch" "$xl" train.nosuch=1
expect_error "bad value" "micro_batch" "$xl" train.micro_batch=zero
expect_error "bad size" "device-mem" "$xl" --device-mem 80XB
expect_error "bad layout" "does not divide" "$xl" parallel.tp=3 --world 8
expect_error "missing file" "nope.ini" /nonexistent/nope.ini
echo "plan_cli: OK"
