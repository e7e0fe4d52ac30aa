/* libFuzzer harness: GPT-2's tokeniser (src/bpe*.c). Any byte string must encode without a crash,
 * every token must be in the vocabulary, and decoding the tokens must give the bytes back exactly
 * (byte-level BPE is lossless); the short-piece and heap merge loops must agree on a piece. The
 * vocabulary is read from $DTRAIN_FUZZ_VOCAB (data/gpt2, made by scripts/get-data.sh). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"

static dt_bpe_t *bpe;
static dt_bpe_enc_t *enc;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *dir = getenv("DTRAIN_FUZZ_VOCAB");
  if (!dir || dt_bpe_load(&bpe, dir) != DT_OK || dt_bpe_enc_init(&enc, bpe) != DT_OK) {
    fprintf(stderr, "fuzz_bpe: set DTRAIN_FUZZ_VOCAB to a directory with encoder.json and vocab.bpe\n");
    exit(2);
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dt_bpe_toks_t t = {0}, a = {0}, b = {0};
  if (dt_bpe_encode(enc, data, size, &t) != DT_OK) abort(); /* any bytes are valid input */
  for (size_t i = 0; i < t.n; i++)
    if (t.v[i] >= dt_bpe_vocab_size(bpe)) abort();
  uint8_t *out = NULL;
  size_t len = 0, cap = 0;
  if (dt_bpe_decode(bpe, t.v, t.n, &out, &len, &cap) != DT_OK) abort();
  if (len != size || (size && memcmp(out, data, size))) abort(); /* not lossless */
  if (size > 0 && size <= 64 && dt_bpe_encode_piece(enc, data, size, 1, &a) == DT_OK &&
      dt_bpe_encode_piece(enc, data, size, 2, &b) == DT_OK)
    if (a.n != b.n || memcmp(a.v, b.v, a.n * sizeof *a.v)) abort(); /* the two merge loops differ */
  free(out);
  free(t.v);
  free(a.v);
  free(b.v);
  return 0;
}
