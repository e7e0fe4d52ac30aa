#!/usr/bin/env bash
# Fuzzing (issue #24): libFuzzer harnesses built with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer for the parsers that read what users and other programs hand dtrain:
#   fuzz_config  the .ini parser, command-line overrides and cross-key validation (src/config.c)
#   fuzz_shard   the token-shard reader, dt_data_read_shard and dt_data_open + batches (src/data.c)
#   fuzz_bpe     GPT-2 BPE: any bytes encode, tokens in the vocabulary, decode(encode(x)) == x, the
#                two merge loops agree (src/bpe*.c; vocabulary from data/gpt2)
# Each runs FUZZ_SECONDS (default 15) from the seed corpus tests/fuzzing/corpus/NAME (copied: the
# source tree is not written); a crash, leak, sanitizer report or an input slower than 10 s fails
# the test and prints the reproducer as base64 (add it to the corpus once fixed). A long campaign:
#   FUZZ_SECONDS=600 make check TESTS=tests/fuzz.sh
source "$top_srcdir/tests/lib.sh"
begin_test
fail() { echo "FAIL: $*"; exit 1; }
CLANG=${CLANG:-clang}
command -v "$CLANG" > /dev/null || { echo "SKIP: no clang (Debian: apt-get install clang)"; exit 77; }
secs=${FUZZ_SECONDS:-15}
S="$top_srcdir/src"
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -std=c11 -D_GNU_SOURCE
  -I"$S" -I"$top_builddir")
build() { # build NAME SOURCES...
  local name=$1
  shift
  run "$CLANG" "${flags[@]}" "$top_srcdir/tests/fuzzing/$name.c" "$@" "$S/status.c" -lm -o "$t/$name" ||
    fail "building $name"
}
build fuzz_config "$S/config.c"
build fuzz_shard "$S/data.c"
build fuzz_bpe "$S/bpe.c" "$S/bpe_vocab.c" "$S/bpe_pretok.c"
export DTRAIN_FUZZ_VOCAB="$DATA/gpt2"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
status=0
for name in fuzz_config fuzz_shard fuzz_bpe; do
  corpus="$t/corpus-$name"
  cp -r "$top_srcdir/tests/fuzzing/corpus/${name#fuzz_}" "$corpus"
  echo "+ $t/$name -max_total_time=$secs -timeout=10 -rss_limit_mb=2048 $corpus"
  if "$t/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$t/$name-" \
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
