#!/usr/bin/env bash
# 16-bit storage on the emulated CUDA backend (system.store16, issue #22 step 7d): activations,
# activation gradients and the weights' working copy held as bf16/fp16 bits, the products on
# 16-bit operands with fp32 accumulation (cublasGemmEx), the biased ones through an fp32
# accumulator and dt_cu_epilogue. Each value it stores is the value the float storage rounds to,
# so the two storages must train bit for bit alike (tests/small.ini, 8 steps, an evaluation every
# 4; tests/ref/metrics_match.py same compares loss, grad_norm, val_loss and lr exactly):
#   1. bf16 and fp16 (the loss scaler) with system.attention = flash, store16 auto against off,
#      and the start line names the storage of each run;
#   2. bf16 with train.recompute, with 2 pipeline stages (its transfers are 2-byte elements), with
#      2 data-parallel ranks on ZeRO-2, and with tensor parallelism over 2 ranks (its partial
#      products all-reduced in fp32 before they are stored), each against off;
#   3. decoding with a 16-bit key/value cache, on 1 rank and with tp = 2 (the last row's 16-bit
#      logits gathered): `dtrain generate --verify` (cached logits against the uncached forward)
#      gives the tokens float storage gives;
#   4. where 16-bit storage is not built (the matmul attention) auto keeps float storage and the
#      start line says why.
# The CPU backend always stores rounded floats; tests/emu_train.sh compares those with it.
source "$top_srcdir/tests/lib.sh"
begin_test
EMU="$top_builddir/dtrain_emu"
cfg="$top_srcdir/tests/small.ini"
base=(system.backend=cuda train.stop_after=8 train.eval_every=4 checkpoint.dir=)
same() { # run a and run b trained alike
  run "$PY" "$top_srcdir/tests/ref/metrics_match.py" same "$t/$1.jsonl" "$t/$2.jsonl" ||
    { echo "FAIL: $1 and $2 differ"; exit 1; }
}
storage() { # run $1's start line says $2
  grep -q "^# storage: $2" "$t/$1.out" ||
    { grep '^# storage' "$t/$1.out"; echo "FAIL: $1: no '# storage: $2'"; exit 1; }
}
train() { # name ranks args...
  local name=$1 n=$2
  shift 2
  mpi "$n" -x DTRAIN_EMU_DEVICES="$n" "$EMU" "$cfg" "${base[@]}" log.metrics="$t/$name.jsonl" "$@" > "$t/$name.out" ||
    { local rc=$?; tail -20 "$t/$name.out"; echo "FAIL: $name: exit status $rc"; exit 1; }
}
for p in bf16 fp16; do
  for s in auto off; do train "${p}_$s" 1 train.precision=$p system.attention=flash system.store16=$s; done
  storage "${p}_auto" "16 bits" && storage "${p}_off" "float values"
  same "${p}_auto" "${p}_off"
done
for s in auto off; do
  train "rc_$s" 1 train.precision=bf16 system.attention=flash train.recompute=true system.store16=$s
  train "pp_$s" 2 train.precision=bf16 system.attention=flash parallel.pp=2 train.grad_accum=2 system.store16=$s
  train "z2_$s" 2 train.precision=bf16 system.attention=flash parallel.zero=2 system.store16=$s
  train "tp_$s" 2 train.precision=bf16 system.attention=flash parallel.tp=2 system.store16=$s
done
for r in rc pp z2 tp; do
  storage ${r}_auto "16 bits"
  same ${r}_auto ${r}_off
done
# decoding: a checkpoint of the bf16 run, greedy tokens with the cache in 16 bits and in floats
train ck 1 train.precision=bf16 system.attention=flash checkpoint.dir="$t/c" checkpoint.every=8
gen=(generate "$cfg" system.backend=cuda train.precision=bf16 system.attention=flash --checkpoint "$t/c"
  --prompt "It is a truth" --tokens 16 --print-tokens --temperature 0 --verify)
generate() { # name ranks args...: its stderr (and the command's trace) in $t/name.err, shown if it fails
  local name=$1 n=$2
  shift 2
  mpi "$n" -x DTRAIN_EMU_DEVICES="$n" "$EMU" "${gen[@]}" "$@" > "$t/$name.out" 2> "$t/$name.err" ||
    { local rc=$?; tail -20 "$t/$name.err"; echo "FAIL: $name: exit status $rc"; exit 1; }
}
for s in auto off; do
  generate "gen_$s" 1 system.store16=$s
  generate "gentp_$s" 2 parallel.tp=2 system.store16=$s
done
grep '^tokens:' "$t/gen_auto.out"
for g in gen_auto gentp_auto; do
  grep -q '^# generate: .*cuda backend (16-bit storage)' "$t/$g.err" || { echo "FAIL: $g: no 16-bit storage"; exit 1; }
done
! grep -q '16-bit storage' "$t/gen_off.err" || { echo "FAIL: generate with store16 = off: 16-bit storage"; exit 1; }
for g in gen_off gentp_auto gentp_off; do
  [ "$(grep '^tokens:' "$t/gen_auto.out")" = "$(grep '^tokens:' "$t/$g.out")" ] ||
    { echo "FAIL: generate: $g gave other tokens than gen_auto"; exit 1; }
done
# not built: float storage, and the start line says why
train mm 1 train.precision=bf16 train.stop_after=1 system.store16=auto
storage mm "float values .*needs system.attention = flash or cudnn"
echo "emu_store16: OK"
