#!/usr/bin/env bash
# Fuzzing (issue #24): libFuzzer harnesses built with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer for the parsers that read what users and other programs hand dtrain:
#   fuzz_config  the .ini parser, command-line overrides and cross-key validation (src/core/config.c)
#   fuzz_shard   the token-shard reader, dt_data_read_shard and dt_data_open + batches (src/data/data.c)
#   fuzz_bpe     GPT-2 BPE: any bytes encode, tokens in the vocabulary, decode(encode(x)) == x, the
#                two merge loops agree (src/bpe*.c; vocabulary from data/gpt2)
#   fuzz_ckpt    the checkpoint reader (src/ckpt/ckpt_read.c, ckpt_meta.c): a valid checkpoint edited through HDF5
#                (shapes, types, missing or extra datasets and attributes, values, truncation), then
#                dt_ckpt_load and dt_ckpt_find_latest (MPI and HDF5 as dtrain is built: the
#                HDF5_CFLAGS / HDF5_LIBS that configure found)
# Each runs FUZZ_SECONDS (default 10) from the seed corpus tests/fuzzing/corpus/NAME (copied: the
# source tree is not written); a crash, leak, sanitizer report or an input slower than 10 s fails
# the test and prints the reproducer as base64 (add it to the corpus once fixed). A long campaign:
#   FUZZ_SECONDS=600 make check TESTS=tests/fuzz.sh
source "$top_srcdir/tests/lib.sh"
begin_test
fail() { echo "FAIL: $*"; exit 1; }
CLANG=${CLANG:-clang}
command -v "$CLANG" > /dev/null || { echo "SKIP: no clang (Debian: apt-get install clang)"; exit 77; }
secs=${FUZZ_SECONDS:-10}
S="$top_srcdir/src"
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -std=c11 -D_GNU_SOURCE
  -I"$S/core" -I"$S/comm" -I"$S/parallel" -I"$S/model" -I"$S/backend" -I"$S/ckpt" -I"$S/data" -I"$top_builddir")
build() { # build NAME SOURCES...
  local name=$1
  shift
  run "$CLANG" "${flags[@]}" "$top_srcdir/tests/fuzzing/$name.c" "$@" "$S/core/status.c" -lm -o "$t/$name" ||
    fail "building $name"
}
build fuzz_config "$S/core/config.c"
build fuzz_shard "$S/data/data.c" "$S/data/sampler.c"
build fuzz_bpe "$S/data/bpe.c" "$S/data/bpe_vocab.c" "$S/data/bpe_pretok.c"
# shellcheck disable=SC2086 # the flags are word lists
build fuzz_ckpt "$S/ckpt/ckpt.c" "$S/ckpt/ckpt_read.c" "$S/ckpt/ckpt_meta.c" "$S/ckpt/ckpt_write.c" "$S/ckpt/ckpt_own.c" "$S/ckpt/ckpt_dir.c" "$S/core/crc32c.c" "$S/model/model.c" \
  "$S/core/config.c" "$S/comm/watchdog.c" "$S/comm/watchdog_mpi.c" "$S/core/fault.c" "$S/comm/mpi_check.c" ${HDF5_CFLAGS:-} ${HDF5_LIBS:-} -lpthread
export DTRAIN_FUZZ_VOCAB="$DATA/gpt2"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
export LSAN_OPTIONS=suppressions=$top_srcdir/tests/fuzzing/lsan.supp # MPI_Init's lifetime allocations
status=0
for name in fuzz_config fuzz_shard fuzz_bpe fuzz_ckpt; do
  corpus="$t/corpus-$name"
  cp -r "$top_srcdir/tests/fuzzing/corpus/${name#fuzz_}" "$corpus"
  echo "+ $t/$name -max_total_time=$secs -timeout=10 -rss_limit_mb=2048 $corpus"
  lsan=$LSAN_OPTIONS # fuzz_ckpt: leaks are checked per input; at exit Open MPI's unloaded components remain
  [ "$name" = fuzz_ckpt ] && lsan="$lsan:leak_check_at_exit=0"
  if LSAN_OPTIONS=$lsan "$t/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$t/$name-" \
    -print_final_stats=1 "$corpus" > "$t/$name.log" 2>&1; then
    echo "ok: $name: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$t/$name.log"), corpus $(ls "$corpus" | wc -l) inputs"
  else
    tail -40 "$t/$name.log"
    for a in "$t/$name-"*; do
      [ -f "$a" ] && echo "reproducer $a (base64): $(base64 -w0 "$a")"
    done
    echo "FAIL: $name"
    status=1
  fi
done
[ $status -eq 0 ] && echo "fuzz: OK"
exit $status
