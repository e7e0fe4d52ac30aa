/* GPT-2's byte-level BPE tokeniser (encoder.json + vocab.bpe), as OpenAI's encoder.py defines it:
 * the text is cut into pre-tokens by GPT-2's pattern
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (implemented by hand in bpe_pretok.c), and each pre-token's bytes are merged pair by pair, the
 * pair of lowest rank (line of vocab.bpe) first, leftmost first among equals (bpe.c).
 * Text is bytes: valid UTF-8 is decoded strictly (Unicode table 3-7), and every byte that does
 * not start a well-formed sequence is one character of the "other" class (what U+FFFD would be);
 * its byte still goes into the pre-token, so decode(encode(x)) == x for any bytes x.
 * Vocabulary files: bpe_vocab.c. Token ids are < 65536 (llm.c shards hold uint16). */
#ifndef DT_BPE_H
#define DT_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* ---- pre-tokeniser (bpe_pretok.c; needs no vocabulary) ---- */

/* Character classes of GPT-2's pattern: \p{L}, \p{N}, \s (Unicode White_Space), everything else. */
enum { DT_BPE_OTHER = 0, DT_BPE_LETTER = 1, DT_BPE_NUMBER = 2, DT_BPE_SPACE = 3 };
#define DT_BPE_INVALID 0xFFFFFFFFu /* "code point" of a byte that is not well-formed UTF-8 */

/* Class of code point cp (DT_BPE_INVALID and unassigned code points are DT_BPE_OTHER). */
int dt_bpe_class(uint32_t cp);
/* Decode the character at s[0..n), n >= 1: its length 1..4 and *cp, or 1 and DT_BPE_INVALID. */
int dt_bpe_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
/* End of the pre-token that starts at s[i], i < n (the text is s[0..n)). */
size_t dt_bpe_pretok_next(const uint8_t *s, size_t n, size_t i);
/* 1 when position p (0 < p < n) may cut the text: the pre-tokens of s[0..p) followed by those of
 * s[p..n) are the pre-tokens of the whole text, whatever comes before s[0] (a character boundary)
 * or after s[n-1], as long as s[p..p+4) are the real bytes (a caller that holds only part of the
 * text asks for p <= n - 4 unless s[n-1] ends it). Rule and proof in bpe_pretok.c. */
int dt_bpe_safe_split(const uint8_t *s, size_t n, size_t p);

/* ---- vocabulary (bpe_vocab.c) ---- */

typedef struct dt_bpe dt_bpe_t; /* read-only after load; shared by all threads */

/* Read DIR/encoder.json and DIR/vocab.bpe (GPT-2's format). Errors name the file (and line). */
dt_status_t dt_bpe_load(dt_bpe_t **out, const char *dir);
void dt_bpe_free(dt_bpe_t *b);
int dt_bpe_vocab_size(const dt_bpe_t *b);
/* Id of <|endoftext|> (50256 in GPT-2). */
int dt_bpe_eot(const dt_bpe_t *b);
/* Bytes of token id (0 <= id < vocab size); <|endoftext|> gives its own 13 characters. */
const uint8_t *dt_bpe_token_bytes(const dt_bpe_t *b, int id, size_t *len);

/* ---- encoding (bpe.c) ---- */

typedef struct dt_bpe_enc dt_bpe_enc_t; /* one thread's scratch space and pre-token cache */

/* A growable token array. */
typedef struct {
  uint16_t *v;
  size_t n, cap;
} dt_bpe_toks_t;

dt_status_t dt_bpe_enc_init(dt_bpe_enc_t **out, const dt_bpe_t *b);
void dt_bpe_enc_free(dt_bpe_enc_t *e);
/* Append the tokens of the text s[0..n) (no <|endoftext|> added) to *out. */
dt_status_t dt_bpe_encode(dt_bpe_enc_t *e, const uint8_t *s, size_t n, dt_bpe_toks_t *out);
/* Append the tokens of one pre-token s[0..n), n >= 1: the merge loop alone, no cache. `method`
 * 0 = automatic, 1 = the array loop for short pieces, 2 = the heap for long ones (tests compare
 * the two). */
dt_status_t dt_bpe_encode_piece(dt_bpe_enc_t *e, const uint8_t *s, size_t n, int method, dt_bpe_toks_t *out);
/* Append bytes of tokens tok[0..n) to *out (a byte buffer of *len, capacity *cap). DT_ERR_DATA
 * if a token is >= the vocabulary size. */
dt_status_t dt_bpe_decode(const dt_bpe_t *b, const uint16_t *tok, size_t n, uint8_t **out, size_t *len, size_t *cap);

#endif
