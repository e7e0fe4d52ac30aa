/* Internals of the BPE tokeniser shared by bpe.c (encoding) and bpe_vocab.c (loading): the
 * vocabulary's tables and their inline lookups. Not for other modules. */
#ifndef DT_BPE_INT_H
#define DT_BPE_INT_H

#include <string.h>

#include "bpe.h"

#define DT_BPE_NO_MERGE 0xFFFFFFFFu
#define DT_BPE_SHORT 128 /* pieces up to this many bytes use the array merge loop, longer the heap */

struct dt_bpe {
  int n_vocab; /* V: token ids 0..V-1, V <= 65535 */
  int eot;     /* id of <|endoftext|> */
  uint8_t *blob;
  uint32_t *off;   /* (V+1,) token id's bytes are blob[off[id] .. off[id+1]) */
  uint8_t *direct; /* (V,) 1 when the merges turn the token's own bytes into the token itself */
  int32_t *vslot;  /* bytes -> id, open addressing, -1 empty; (vmask+1,) */
  uint32_t vmask;
  uint32_t *mkey;  /* pair (left << 16 | right) -> mval = rank << 16 | merged id; ~0 empty */
  uint32_t *mval;
  uint32_t mmask;
  uint16_t byte_tok[256]; /* token of each single byte */
};

/* 64-bit hash of a short byte string: 8 bytes at a time, multiply-xorshift mixing. */
static inline uint64_t dt_bpe__hash(const uint8_t *s, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    s += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, s, n);
  h = (h ^ w) * 0x94d049bb133111ebull;
  return h ^ (h >> 32);
}

static inline uint32_t dt_bpe__pair_slot(uint32_t key, uint32_t mask) {
  return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & mask;
}

/* rank << 16 | merged id of the pair (left, right), or DT_BPE_NO_MERGE. */
static inline uint32_t dt_bpe__merge(const struct dt_bpe *b, uint16_t left, uint16_t right) {
  uint32_t key = (uint32_t)left << 16 | right;
  for (uint32_t i = dt_bpe__pair_slot(key, b->mmask);; i = (i + 1) & b->mmask) {
    if (b->mkey[i] == key) return b->mval[i];
    if (b->mkey[i] == DT_BPE_NO_MERGE) return DT_BPE_NO_MERGE;
  }
}

/* Id of the token whose bytes are s[0..n), or -1; h = dt_bpe__hash(s, n). */
static inline int dt_bpe__find(const struct dt_bpe *b, const uint8_t *s, size_t n, uint64_t h) {
  for (uint32_t i = (uint32_t)h & b->vmask;; i = (i + 1) & b->vmask) {
    int32_t id = b->vslot[i];
    if (id < 0) return -1;
    if (b->off[id + 1] - b->off[id] == n && memcmp(b->blob + b->off[id], s, n) == 0) return id;
  }
}

/* The merge loop for a piece of 2 <= n <= DT_BPE_SHORT bytes; writes its tokens to tok (n
 * entries of space) and returns their number. In bpe.c; the loader uses it for `direct`. */
size_t dt_bpe__merge_short(const struct dt_bpe *b, const uint8_t *s, size_t n, uint16_t *tok);

#endif
