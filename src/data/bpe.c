/* GPT-2 BPE encoding and decoding (bpe.h): pre-tokens from bpe_pretok.c, then per pre-token
 * 1. a single byte is its byte token; 2. bytes equal to a token that the merges reproduce are that
 * token (a hash lookup); 3. a per-thread cache of pre-token -> tokens (direct-mapped, bounded);
 * 4. the merge loop: lowest rank first, leftmost among equal ranks, as encoder.py's bpe() (which
 * merges every occurrence of the best pair left to right: the same result, since a merged pair's
 * new neighbours can only have higher ranks). An array scan for short pieces, a heap with lazy
 * deletion, O(n log n), for long ones (a run of a million spaces is one pre-token). */
#include <stdlib.h>
#include <string.h>

#include "bpe_int.h"

#define CACHE_BITS 16
#define CACHE_KEY 14 /* longest cached pre-token, bytes */
#define CACHE_TOK 4  /* most tokens of a cached pre-token */

typedef struct { /* 32 bytes: the 2 MB cache of 65536 slots is mostly pre-tokens of 1-4 tokens */
  uint64_t hash;
  uint8_t len, ntok; /* len 0: empty slot */
  uint8_t key[CACHE_KEY];
  uint16_t tok[CACHE_TOK];
} cache_slot_t;

struct dt_bpe_enc {
  const struct dt_bpe *b;
  cache_slot_t *cache; /* (1 << CACHE_BITS,) */
  /* scratch of the heap loop, grown to the longest piece seen */
  uint16_t *tok;
  int32_t *next, *prev;
  uint64_t *heap;
  size_t scratch;
};

dt_status_t dt_bpe_enc_init(dt_bpe_enc_t **out, const dt_bpe_t *b) {
  *out = NULL;
  dt_bpe_enc_t *e = calloc(1, sizeof *e);
  if (e) e->cache = calloc((size_t)1 << CACHE_BITS, sizeof *e->cache);
  if (!e || !e->cache) {
    free(e);
    return DT_ERR(DT_ERR_NOMEM, "bpe: out of memory for an encoder");
  }
  e->b = b;
  *out = e;
  return DT_OK;
}

void dt_bpe_enc_free(dt_bpe_enc_t *e) {
  if (!e) return;
  free(e->cache);
  free(e->tok);
  free(e->next);
  free(e->prev);
  free(e->heap);
  free(e);
}

static int toks_reserve(dt_bpe_toks_t *t, size_t extra) {
  if (t->cap - t->n >= extra) return 0;
  size_t cap = t->cap ? t->cap : 1024;
  while (cap - t->n < extra) cap *= 2;
  uint16_t *v = realloc(t->v, cap * sizeof *v);
  if (!v) return -1;
  t->v = v;
  t->cap = cap;
  return 0;
}

/* ---- the merge loops ------------------------------------------------------------------- */

size_t dt_bpe__merge_short(const struct dt_bpe *b, const uint8_t *s, size_t n, uint16_t *tok) {
  uint32_t mv[DT_BPE_SHORT]; /* mv[i]: merge of (tok[i], tok[i+1]) */
  for (size_t i = 0; i < n; i++) tok[i] = b->byte_tok[s[i]];
  for (size_t i = 0; i + 1 < n; i++) mv[i] = dt_bpe__merge(b, tok[i], tok[i + 1]);
  size_t m = n;
  while (m > 1) {
    uint32_t best = DT_BPE_NO_MERGE;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < m; i++)
      if (mv[i] < best) best = mv[i], bi = i;
    if (best == DT_BPE_NO_MERGE) break;
    tok[bi] = (uint16_t)(best & 0xFFFF);
    memmove(tok + bi + 1, tok + bi + 2, (m - bi - 2) * sizeof *tok);
    if (m >= bi + 3) memmove(mv + bi + 1, mv + bi + 2, (m - bi - 3) * sizeof *mv);
    m--;
    if (bi > 0) mv[bi - 1] = dt_bpe__merge(b, tok[bi - 1], tok[bi]);
    if (bi + 1 < m) mv[bi] = dt_bpe__merge(b, tok[bi], tok[bi + 1]);
  }
  return m;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t x) {
  size_t i = (*n)++;
  while (i > 0 && h[(i - 1) / 2] > x) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = x;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0], x = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= x) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = x;
  return top;
}

/* Heap entries (merge value << 32 | position of the pair's left node): the smallest is the
 * lowest rank (rank is the high half of the merge value) and then the leftmost. An entry is stale
 * when its pair has changed since; recomputing the pair's merge value tells. */
static dt_status_t merge_long(dt_bpe_enc_t *e, const uint8_t *s, size_t n, dt_bpe_toks_t *out) {
  const struct dt_bpe *b = e->b;
  if (n > INT32_MAX) return DT_ERR(DT_ERR_DATA, "bpe: a pre-token of %zu bytes is too long", n);
  if (e->scratch < n) {
    free(e->tok), free(e->next), free(e->prev), free(e->heap);
    e->tok = malloc(n * sizeof *e->tok);
    e->next = malloc(n * sizeof *e->next);
    e->prev = malloc(n * sizeof *e->prev);
    e->heap = malloc(2 * n * sizeof *e->heap);
    e->scratch = n;
    if (!e->tok || !e->next || !e->prev || !e->heap) {
      e->scratch = 0;
      return DT_ERR(DT_ERR_NOMEM, "bpe: out of memory for a pre-token of %zu bytes", n);
    }
  }
  uint16_t *tok = e->tok;
  int32_t *next = e->next, *prev = e->prev;
  size_t hn = 0;
  for (size_t i = 0; i < n; i++) {
    tok[i] = b->byte_tok[s[i]];
    next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
    prev[i] = (int32_t)i - 1;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    uint32_t mv = dt_bpe__merge(b, tok[i], tok[i + 1]);
    if (mv != DT_BPE_NO_MERGE) heap_push(e->heap, &hn, (uint64_t)mv << 32 | i);
  }
  while (hn > 0) {
    uint64_t top = heap_pop(e->heap, &hn);
    uint32_t mv = (uint32_t)(top >> 32), i = (uint32_t)top;
    int32_t j = next[i];
    if (prev[i] == -2 || j < 0 || dt_bpe__merge(b, tok[i], tok[j]) != mv) continue; /* stale */
    tok[i] = (uint16_t)(mv & 0xFFFF);
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = (int32_t)i;
    prev[j] = -2; /* dead */
    if (prev[i] >= 0) {
      uint32_t m2 = dt_bpe__merge(b, tok[prev[i]], tok[i]);
      if (m2 != DT_BPE_NO_MERGE) heap_push(e->heap, &hn, (uint64_t)m2 << 32 | (uint32_t)prev[i]);
    }
    if (next[i] >= 0) {
      uint32_t m2 = dt_bpe__merge(b, tok[i], tok[next[i]]);
      if (m2 != DT_BPE_NO_MERGE) heap_push(e->heap, &hn, (uint64_t)m2 << 32 | i);
    }
  }
  if (toks_reserve(out, n) != 0) return DT_ERR(DT_ERR_NOMEM, "bpe: out of memory for tokens");
  for (int32_t i = 0; i >= 0; i = next[i]) out->v[out->n++] = tok[i];
  return DT_OK;
}

dt_status_t dt_bpe_encode_piece(dt_bpe_enc_t *e, const uint8_t *s, size_t n, int method, dt_bpe_toks_t *out) {
  if (n == 0) return DT_OK;
  if (method == 2 || (method == 0 && n > DT_BPE_SHORT)) return merge_long(e, s, n, out);
  if (n > DT_BPE_SHORT) return DT_ERR(DT_ERR_ARG, "bpe: the array loop takes at most %d bytes", DT_BPE_SHORT);
  if (toks_reserve(out, n) != 0) return DT_ERR(DT_ERR_NOMEM, "bpe: out of memory for tokens");
  if (n == 1)
    out->v[out->n++] = e->b->byte_tok[s[0]];
  else
    out->n += dt_bpe__merge_short(e->b, s, n, out->v + out->n);
  return DT_OK;
}

/* ---- encoding a text ------------------------------------------------------------------- */

/* Tokens of one pre-token into out (room for n reserved); h = dt_bpe__hash(s, n) if n > 1. */
static dt_status_t encode_one(dt_bpe_enc_t *e, const uint8_t *s, size_t n, uint64_t h, dt_bpe_toks_t *out) {
  const struct dt_bpe *b = e->b;
  if (n == 1) {
    out->v[out->n++] = b->byte_tok[s[0]];
    return DT_OK;
  }
  if (n > CACHE_KEY) {
    int id = dt_bpe__find(b, s, n, h);
    if (id >= 0 && b->direct[id]) {
      out->v[out->n++] = (uint16_t)id;
      return DT_OK;
    }
    return dt_bpe_encode_piece(e, s, n, 0, out);
  }
  cache_slot_t *c = &e->cache[h >> (64 - CACHE_BITS)];
  if (c->hash == h && c->len == n && !memcmp(c->key, s, n)) {
    memcpy(out->v + out->n, c->tok, c->ntok * sizeof *c->tok);
    out->n += c->ntok;
    return DT_OK;
  }
  int id = dt_bpe__find(b, s, n, h);
  uint16_t *dst = out->v + out->n;
  size_t k;
  if (id >= 0 && b->direct[id]) {
    dst[0] = (uint16_t)id;
    k = 1;
  } else {
    k = dt_bpe__merge_short(b, s, n, dst);
  }
  out->n += k;
  if (k > CACHE_TOK) return DT_OK;
  c->hash = h;
  c->len = (uint8_t)n;
  c->ntok = (uint8_t)k;
  memcpy(c->key, s, n);
  memcpy(c->tok, dst, k * sizeof *dst);
  return DT_OK;
}

/* The next pre-token [j, k) is found and its cache slot prefetched while [i, j) is encoded: the
 * 2.6 MB cache does not stay in L2, and its lookups were half of the encoding time. */
dt_status_t dt_bpe_encode(dt_bpe_enc_t *e, const uint8_t *s, size_t n, dt_bpe_toks_t *out) {
  if (n == 0) return DT_OK;
  size_t i = 0, j = dt_bpe_pretok_next(s, n, 0);
  uint64_t h = j > 1 ? dt_bpe__hash(s, j) : 0;
  while (i < n) {
    size_t k = j < n ? dt_bpe_pretok_next(s, n, j) : n;
    uint64_t hk = k - j > 1 ? dt_bpe__hash(s + j, k - j) : 0;
    __builtin_prefetch(&e->cache[hk >> (64 - CACHE_BITS)]);
    if (toks_reserve(out, j - i) != 0) return DT_ERR(DT_ERR_NOMEM, "bpe: out of memory for tokens");
    DT_TRY(encode_one(e, s + i, j - i, h, out));
    i = j, j = k, h = hk;
  }
  return DT_OK;
}

dt_status_t dt_bpe_decode(const dt_bpe_t *b, const uint16_t *tok, size_t n, uint8_t **out, size_t *len, size_t *cap) {
  for (size_t i = 0; i < n; i++) {
    if (tok[i] >= b->n_vocab)
      return DT_ERR(DT_ERR_DATA, "token %zu is %d, not below the vocabulary size %d", i, tok[i], b->n_vocab);
    size_t m = b->off[tok[i] + 1] - b->off[tok[i]];
    if (*cap - *len < m) {
      size_t c = *cap ? *cap : 4096;
      while (c - *len < m) c *= 2;
      uint8_t *nb = realloc(*out, c);
      if (!nb) return DT_ERR(DT_ERR_NOMEM, "bpe: out of memory decoding");
      *out = nb;
      *cap = c;
    }
    memcpy(*out + *len, b->blob + b->off[tok[i]], m);
    *len += m;
  }
  return DT_OK;
}
