/* Loading GPT-2's vocabulary files into the tables of bpe_int.h: encoder.json (a JSON object of
 * token string -> id, the strings written in GPT-2's byte-to-unicode alphabet) and vocab.bpe (the
 * merges, one pair "A B" per line in rank order after a "#version" line). Everything is checked;
 * an error names the file and the byte offset or line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_int.h"

#define EOT_TEXT "<|endoftext|>"
#define MAX_TOKEN_BYTES 4096

/* GPT-2's bytes_to_unicode(): the printable bytes ! .. ~, 0xA1 .. 0xAC and 0xAE .. 0xFF stand for
 * themselves, the other 68 bytes for U+0100, U+0101, ... in byte order. u2b inverts it (-1: not
 * in the alphabet). */
static void byte_alphabet(int16_t u2b[324]) {
  for (int u = 0; u < 324; u++) u2b[u] = -1;
  int extra = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    u2b[printable ? b : 256 + extra++] = (int16_t)b;
  }
}

static dt_status_t read_file(const char *path, uint8_t **buf, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return DT_ERR(DT_ERR_IO, "%s: cannot open GPT-2 vocabulary file: %s (scripts/get-data.sh puts it under data/gpt2)",
                  path, strerror(errno));
  size_t cap = 1 << 20, n = 0;
  uint8_t *b = malloc(cap);
  for (;;) {
    if (!b) break;
    n += fread(b + n, 1, cap - n, f);
    if (n < cap) break;
    uint8_t *nb = realloc(b, cap *= 2);
    if (!nb) free(b);
    b = nb;
  }
  int bad = ferror(f);
  fclose(f);
  if (!b) return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  if (bad) {
    free(b);
    return DT_ERR(DT_ERR_IO, "%s: read error", path);
  }
  *buf = b;
  *len = n;
  return DT_OK;
}

/* ---- encoder.json ---------------------------------------------------------------------- */

typedef struct {
  const char *path;
  const uint8_t *s;
  size_t n, i;
  const int16_t *u2b;
} json_t;

static void skip_ws(json_t *j) {
  while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r')) j->i++;
}

static dt_status_t json_err(const json_t *j, const char *what) {
  return DT_ERR(DT_ERR_DATA, "%s: byte %zu: %s", j->path, j->i, what);
}

static int hex4(const uint8_t *s, uint32_t *v) {
  *v = 0;
  for (int k = 0; k < 4; k++) {
    int c = s[k], d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
    if (d < 0) return -1;
    *v = *v << 4 | (uint32_t)d;
  }
  return 0;
}

/* One code point of a JSON string body (raw UTF-8 or an escape) at j->i. */
static dt_status_t json_char(json_t *j, uint32_t *cp) {
  const uint8_t *s = j->s;
  if (s[j->i] != '\\') {
    int w = dt_bpe_utf8_next(s + j->i, j->n - j->i, cp);
    if (*cp == DT_BPE_INVALID || *cp < 0x20) return json_err(j, "invalid character in a string");
    j->i += (size_t)w;
    return DT_OK;
  }
  if (j->i + 1 >= j->n) return json_err(j, "unterminated escape");
  uint8_t e = s[j->i + 1];
  const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
  const char *k = e ? strchr(from, e) : NULL;
  if (k) {
    *cp = (uint8_t)to[k - from];
    j->i += 2;
    return DT_OK;
  }
  if (e != 'u' || j->i + 6 > j->n || hex4(s + j->i + 2, cp) != 0) return json_err(j, "bad escape");
  j->i += 6;
  if (*cp >= 0xD800 && *cp <= 0xDBFF) { /* a surrogate pair */
    uint32_t lo;
    if (j->i + 6 > j->n || s[j->i] != '\\' || s[j->i + 1] != 'u' || hex4(s + j->i + 2, &lo) != 0 || lo < 0xDC00 ||
        lo > 0xDFFF)
      return json_err(j, "unpaired surrogate escape");
    *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
    j->i += 6;
  } else if (*cp >= 0xDC00 && *cp <= 0xDFFF) {
    return json_err(j, "unpaired surrogate escape");
  }
  return DT_OK;
}

/* A token string, each character turned back into its byte; out has MAX_TOKEN_BYTES of space. */
static dt_status_t json_token(json_t *j, uint8_t *out, size_t *len) {
  skip_ws(j);
  if (j->i >= j->n || j->s[j->i] != '"') return json_err(j, "expected a string");
  j->i++;
  *len = 0;
  while (j->i < j->n && j->s[j->i] != '"') {
    size_t at = j->i;
    uint32_t cp;
    DT_TRY(json_char(j, &cp));
    if (cp >= 324 || j->u2b[cp] < 0)
      return DT_ERR(DT_ERR_DATA, "%s: byte %zu: character U+%04X is not in GPT-2's byte alphabet", j->path, at,
                    (unsigned)cp);
    if (*len == MAX_TOKEN_BYTES) return json_err(j, "token longer than 4096 bytes");
    out[(*len)++] = (uint8_t)j->u2b[cp];
  }
  if (j->i >= j->n) return json_err(j, "unterminated string");
  j->i++;
  return DT_OK;
}

static dt_status_t json_id(json_t *j, int *id) {
  skip_ws(j);
  long v = 0;
  size_t start = j->i;
  while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9' && v < 65536) v = v * 10 + (j->s[j->i++] - '0');
  if (j->i == start || v > 65534) return json_err(j, "expected a token id 0..65534");
  *id = (int)v;
  return DT_OK;
}

static dt_status_t expect_char(json_t *j, char c, const char *what) {
  skip_ws(j);
  if (j->i >= j->n || j->s[j->i] != c) return json_err(j, what);
  j->i++;
  return DT_OK;
}

/* Parse the whole object into tokens in id order: b->n_vocab, b->off, b->blob. */
static dt_status_t parse_encoder(struct dt_bpe *b, json_t *j) {
  enum { MAXV = 65535 };
  uint32_t *len = calloc(MAXV, sizeof *len), *at = calloc(MAXV, sizeof *at);
  uint8_t *tmp = malloc(j->n + 1), tok[MAX_TOKEN_BYTES];
  size_t used = 0;
  int count = 0, maxid = -1;
  dt_status_t st = !len || !at || !tmp ? DT_ERR(DT_ERR_NOMEM, "%s: out of memory", j->path) : DT_OK;
  if (st == DT_OK) st = expect_char(j, '{', "expected '{'");
  skip_ws(j);
  int empty = j->i < j->n && j->s[j->i] == '}';
  while (st == DT_OK && !empty) {
    size_t n = 0, where = j->i;
    int id = 0;
    st = json_token(j, tok, &n);
    if (st == DT_OK) st = expect_char(j, ':', "expected ':'");
    if (st == DT_OK) st = json_id(j, &id);
    if (st == DT_OK && len[id]) st = DT_ERR(DT_ERR_DATA, "%s: byte %zu: token id %d given twice", j->path, where, id);
    if (st == DT_OK && n == 0) st = DT_ERR(DT_ERR_DATA, "%s: byte %zu: empty token string", j->path, where);
    if (st != DT_OK) break;
    memcpy(tmp + used, tok, n); /* the bytes never outnumber the JSON text's */
    at[id] = (uint32_t)used;
    len[id] = (uint32_t)n;
    used += n;
    count++;
    maxid = id > maxid ? id : maxid;
    skip_ws(j);
    if (j->i < j->n && j->s[j->i] == ',') {
      j->i++;
      continue;
    }
    break;
  }
  if (st == DT_OK) st = expect_char(j, '}', "expected ',' or '}'");
  skip_ws(j);
  if (st == DT_OK && j->i != j->n) st = json_err(j, "text after the object");
  if (st == DT_OK && count != maxid + 1)
    st = DT_ERR(DT_ERR_DATA, "%s: %d tokens but ids up to %d: ids must be 0..V-1, each once", j->path, count, maxid);
  if (st == DT_OK && count < 257) st = DT_ERR(DT_ERR_DATA, "%s: only %d tokens (need the 256 bytes and %s)",
                                               j->path, count, EOT_TEXT);
  if (st == DT_OK) {
    b->n_vocab = count;
    b->off = malloc(((size_t)count + 1) * sizeof *b->off);
    b->blob = malloc(used);
    if (!b->off || !b->blob) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", j->path);
  }
  if (st == DT_OK) {
    uint32_t o = 0;
    for (int id = 0; id < count; id++) {
      b->off[id] = o;
      memcpy(b->blob + o, tmp + at[id], len[id]);
      o += len[id];
    }
    b->off[count] = o;
  }
  free(len);
  free(at);
  free(tmp);
  return st;
}

/* The bytes -> id table (all tokens but <|endoftext|>), the 256 byte tokens and the eot id. */
static dt_status_t index_tokens(struct dt_bpe *b, const char *path) {
  uint32_t size = 1;
  while (size < 2u * (uint32_t)b->n_vocab) size <<= 1;
  b->vmask = size - 1;
  b->vslot = malloc(size * sizeof *b->vslot);
  if (!b->vslot) return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  memset(b->vslot, 0xFF, size * sizeof *b->vslot);
  b->eot = -1;
  for (int id = 0; id < b->n_vocab; id++) {
    const uint8_t *s = b->blob + b->off[id];
    size_t n = b->off[id + 1] - b->off[id];
    if (n == sizeof EOT_TEXT - 1 && !memcmp(s, EOT_TEXT, n)) {
      b->eot = id;
      continue;
    }
    int dup = dt_bpe__find(b, s, n, dt_bpe__hash(s, n));
    if (dup >= 0) return DT_ERR(DT_ERR_DATA, "%s: tokens %d and %d have the same bytes", path, dup, id);
    uint32_t i = (uint32_t)dt_bpe__hash(s, n) & b->vmask;
    while (b->vslot[i] >= 0) i = (i + 1) & b->vmask;
    b->vslot[i] = id;
  }
  if (b->eot < 0) return DT_ERR(DT_ERR_DATA, "%s: no %s token", path, EOT_TEXT);
  for (int c = 0; c < 256; c++) {
    uint8_t byte = (uint8_t)c;
    int id = dt_bpe__find(b, &byte, 1, dt_bpe__hash(&byte, 1));
    if (id < 0) return DT_ERR(DT_ERR_DATA, "%s: no token for the single byte 0x%02X", path, c);
    b->byte_tok[c] = (uint16_t)id;
  }
  return DT_OK;
}

/* ---- vocab.bpe ------------------------------------------------------------------------- */

/* One side of a merge line: UTF-8 text of alphabet characters -> bytes; the token's id. */
static dt_status_t merge_side(const struct dt_bpe *b, const int16_t *u2b, const char *path, int line,
                              const uint8_t *s, size_t n, uint8_t *out, size_t *len, int *id) {
  *len = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += (size_t)dt_bpe_utf8_next(s + i, n - i, &cp);
    if (cp >= 324 || u2b[cp] < 0 || *len == MAX_TOKEN_BYTES)
      return DT_ERR(DT_ERR_DATA, "%s:%d: '%.*s' is not a string of GPT-2's byte alphabet", path, line, (int)n, s);
    out[(*len)++] = (uint8_t)u2b[cp];
  }
  *id = dt_bpe__find(b, out, *len, dt_bpe__hash(out, *len));
  if (*id < 0) return DT_ERR(DT_ERR_DATA, "%s:%d: '%.*s' is not a token of encoder.json", path, line, (int)n, s);
  return DT_OK;
}

static dt_status_t parse_merges(struct dt_bpe *b, const int16_t *u2b, const char *path, const uint8_t *s, size_t n) {
  uint32_t size = 1;
  while (size < 2u * (uint32_t)b->n_vocab) size <<= 1; /* merges < vocab */
  b->mmask = size - 1;
  b->mkey = malloc(size * sizeof *b->mkey);
  b->mval = malloc(size * sizeof *b->mval);
  if (!b->mkey || !b->mval) return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  memset(b->mkey, 0xFF, size * sizeof *b->mkey);
  uint8_t l[MAX_TOKEN_BYTES], r[MAX_TOKEN_BYTES], both[2 * MAX_TOKEN_BYTES];
  int rank = 0, line = 0;
  for (size_t i = 0; i < n;) {
    size_t e = i;
    while (e < n && s[e] != '\n') e++;
    const uint8_t *ln = s + i;
    size_t ll = e - i;
    line++;
    i = e + 1;
    if (ll && ln[ll - 1] == '\r') ll--;
    if (ll == 0 || (line == 1 && ll >= 8 && !memcmp(ln, "#version", 8))) continue;
    const uint8_t *sp = memchr(ln, ' ', ll);
    if (!sp || sp == ln || sp == ln + ll - 1 || memchr(sp + 1, ' ', (size_t)(ln + ll - sp - 1)))
      return DT_ERR(DT_ERR_DATA, "%s:%d: expected two tokens separated by one space", path, line);
    size_t nl, nr;
    int a, c;
    DT_TRY(merge_side(b, u2b, path, line, ln, (size_t)(sp - ln), l, &nl, &a));
    DT_TRY(merge_side(b, u2b, path, line, sp + 1, (size_t)(ln + ll - sp - 1), r, &nr, &c));
    memcpy(both, l, nl);
    memcpy(both + nl, r, nr);
    int m = dt_bpe__find(b, both, nl + nr, dt_bpe__hash(both, nl + nr));
    if (m < 0) return DT_ERR(DT_ERR_DATA, "%s:%d: the merged token is not in encoder.json", path, line);
    if (rank >= 65535 || rank >= b->n_vocab) return DT_ERR(DT_ERR_DATA, "%s:%d: more merges than tokens", path, line);
    uint32_t key = (uint32_t)a << 16 | (uint32_t)c, k = dt_bpe__pair_slot(key, b->mmask);
    while (b->mkey[k] != DT_BPE_NO_MERGE && b->mkey[k] != key) k = (k + 1) & b->mmask;
    if (b->mkey[k] == key) return DT_ERR(DT_ERR_DATA, "%s:%d: this pair was merged before", path, line);
    b->mkey[k] = key;
    b->mval[k] = (uint32_t)rank++ << 16 | (uint32_t)m;
  }
  return DT_OK;
}

/* direct[id]: 1 when BPE of the token's own bytes gives the token itself (true of every GPT-2
 * token, but not of every vocabulary), so a pre-token equal to it needs no merging. */
static dt_status_t mark_direct(struct dt_bpe *b, const char *path) {
  b->direct = calloc((size_t)b->n_vocab, 1);
  if (!b->direct) return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  uint16_t tok[DT_BPE_SHORT];
  for (int id = 0; id < b->n_vocab; id++) {
    size_t n = b->off[id + 1] - b->off[id];
    if (id == b->eot || n > DT_BPE_SHORT) continue;
    b->direct[id] = n == 1 || (dt_bpe__merge_short(b, b->blob + b->off[id], n, tok) == 1 && tok[0] == id);
  }
  return DT_OK;
}

dt_status_t dt_bpe_load(dt_bpe_t **out, const char *dir) {
  *out = NULL;
  char ep[4096], mp[4096];
  if (snprintf(ep, sizeof ep, "%s/encoder.json", dir) >= (int)sizeof ep ||
      snprintf(mp, sizeof mp, "%s/vocab.bpe", dir) >= (int)sizeof mp)
    return DT_ERR(DT_ERR_ARG, "%s: vocabulary directory name too long", dir);
  int16_t u2b[324];
  byte_alphabet(u2b);
  struct dt_bpe *b = calloc(1, sizeof *b);
  if (!b) return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", dir);
  uint8_t *text = NULL;
  size_t n = 0;
  dt_status_t st = read_file(ep, &text, &n);
  if (st == DT_OK) {
    json_t j = {ep, text, n, 0, u2b};
    st = parse_encoder(b, &j);
  }
  if (st == DT_OK) st = index_tokens(b, ep);
  free(text);
  text = NULL;
  if (st == DT_OK) st = read_file(mp, &text, &n);
  if (st == DT_OK) st = parse_merges(b, u2b, mp, text, n);
  if (st == DT_OK) st = mark_direct(b, mp);
  free(text);
  if (st != DT_OK) {
    dt_bpe_free(b);
    return st;
  }
  *out = b;
  return DT_OK;
}

void dt_bpe_free(dt_bpe_t *b) {
  if (!b) return;
  free(b->blob);
  free(b->off);
  free(b->direct);
  free(b->vslot);
  free(b->mkey);
  free(b->mval);
  free(b);
}

int dt_bpe_vocab_size(const dt_bpe_t *b) { return b->n_vocab; }
int dt_bpe_eot(const dt_bpe_t *b) { return b->eot; }
const uint8_t *dt_bpe_token_bytes(const dt_bpe_t *b, int id, size_t *len) {
  *len = b->off[id + 1] - b->off[id];
  return b->blob + b->off[id];
}
