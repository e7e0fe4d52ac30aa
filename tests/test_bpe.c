/* GPT-2 BPE (src/bpe*.c) without GPT-2's vocabulary (tests/bpe_tiktoken.sh checks that against
 * tiktoken): strict UTF-8 against an encoder written here over every code point, the classes on
 * hand-picked code points, the pre-tokeniser on cases whose pieces Python's `regex` module gives
 * for GPT-2's pattern, the chunk-cut rule as a property (pieces of the two halves == pieces of the
 * whole, for every safe cut of adversarial and random texts, and a counterexample for an unsafe
 * one), the merge loops on a small hand-made vocabulary against expectations worked out by hand
 * and against a plain encoder.py-style reference, the loader's errors, and dt_prep_gpt2 end to end
 * (chunked and threaded == whole, val cut, shards only on success). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdarg.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe.h"
#include "data.h"

static char dir[256];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}
static void setup(void) {
  strcpy(dir, "/tmp/dtrain-test-bpe-XXXXXX");
  cr_assert(mkdtemp(dir) != NULL);
  dt_err_clear();
}
static void teardown(void) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }
TestSuite(bpe, .init = setup, .fini = teardown);

static const char *P(const char *name) {
  static char buf[64][512];
  static int k;
  k = (k + 1) % 64;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

static void write_file(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "cannot write %s", path);
  fwrite(b, 1, n, f);
  fclose(f);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng % n);
}

/* ---- UTF-8 and classes ---- */

static int encode_utf8(uint32_t c, uint8_t *b) {
  if (c < 0x80) return b[0] = (uint8_t)c, 1;
  if (c < 0x800) return b[0] = (uint8_t)(0xC0 | c >> 6), b[1] = (uint8_t)(0x80 | (c & 0x3F)), 2;
  if (c < 0x10000) {
    b[0] = (uint8_t)(0xE0 | c >> 12), b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F)), b[2] = (uint8_t)(0x80 | (c & 0x3F));
    return 3;
  }
  b[0] = (uint8_t)(0xF0 | c >> 18), b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
  b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F)), b[3] = (uint8_t)(0x80 | (c & 0x3F));
  return 4;
}

/* Accepted <=> the canonical encoding of a Unicode scalar value: every scalar value's encoding
 * decodes to it, and whatever random bytes decode to re-encodes to exactly those bytes (so no
 * overlong form, surrogate or value above U+10FFFF gets through). */
Test(bpe, utf8_strict) {
  uint8_t b[8];
  uint32_t cp;
  for (uint32_t c = 0; c <= 0x10FFFF; c++) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    int n = encode_utf8(c, b);
    int w = dt_bpe_utf8_next(b, (size_t)n, &cp);
    if (w != n || cp != c) cr_assert_fail("U+%04X: got length %d, U+%04X", c, w, cp);
    if (n > 1 && dt_bpe_utf8_next(b, (size_t)n - 1, &cp) != 1) cr_assert_fail("U+%04X truncated accepted", c);
  }
  for (int t = 0; t < 2000000; t++) {
    for (int k = 0; k < 4; k++) b[k] = (uint8_t)(rnd(4) ? 0x80 + rnd(0x80) : rnd(256));
    int w = dt_bpe_utf8_next(b, 4, &cp);
    if (cp == DT_BPE_INVALID) {
      cr_assert_eq(w, 1);
      continue;
    }
    uint8_t e[4];
    int n = encode_utf8(cp, e);
    if (n != w || memcmp(e, b, (size_t)n) || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
      cr_assert_fail("%02X %02X %02X %02X decoded as U+%04X, length %d", b[0], b[1], b[2], b[3], cp, w);
  }
  const uint8_t bad[][4] = {{0xC0, 0x80}, {0xE0, 0x80, 0x80}, {0xED, 0xA0, 0x80}, {0xF4, 0x90, 0x80, 0x80},
                            {0xF0, 0x8F, 0xBF, 0xBF}, {0xF5, 0x80, 0x80, 0x80}, {0xFF}, {0x80}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(dt_bpe_utf8_next(bad[i], 4, &cp), 1, "case %zu", i);
    cr_expect_eq(cp, DT_BPE_INVALID, "case %zu", i);
  }
}

Test(bpe, classes) {
  /* General categories from the Unicode Character Database; White_Space from PropList.txt. */
  const struct {
    uint32_t cp;
    int cls;
  } c[] = {{'a', DT_BPE_LETTER},      {'Z', DT_BPE_LETTER},     {'0', DT_BPE_NUMBER},   {' ', DT_BPE_SPACE},
           {'\t', DT_BPE_SPACE},      {'\r', DT_BPE_SPACE},     {0x1C, DT_BPE_OTHER},  {'_', DT_BPE_OTHER},
           {'\'', DT_BPE_OTHER},      {0xE9, DT_BPE_LETTER},    {0xAA, DT_BPE_LETTER}, {0x663, DT_BPE_NUMBER},
           {0xB2, DT_BPE_NUMBER},     {0x2163, DT_BPE_NUMBER},  {0x85, DT_BPE_SPACE},  {0xA0, DT_BPE_SPACE},
           {0x2009, DT_BPE_SPACE},    {0x3000, DT_BPE_SPACE},   {0x200B, DT_BPE_OTHER}, {0x180E, DT_BPE_OTHER},
           {0x301, DT_BPE_OTHER},     {0x4E2D, DT_BPE_LETTER},  {0x1F600, DT_BPE_OTHER}, {0x10FFFF, DT_BPE_OTHER},
           {0x20000, DT_BPE_LETTER},  {0x1D7CE, DT_BPE_NUMBER}, {0xAC00, DT_BPE_LETTER}, {0x5D0, DT_BPE_LETTER},
           {DT_BPE_INVALID, DT_BPE_OTHER}};
  for (size_t i = 0; i < sizeof c / sizeof *c; i++)
    cr_expect_eq(dt_bpe_class(c[i].cp), c[i].cls, "U+%04X: class %d, want %d", c[i].cp, dt_bpe_class(c[i].cp),
                 c[i].cls);
}

/* ---- pre-tokeniser ---- */

/* Pieces of s joined with '|' (s must not contain '|'). */
static void pieces(const char *s, size_t n, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    size_t j = dt_bpe_pretok_next((const uint8_t *)s, n, i);
    cr_assert(j > i && j <= n, "no progress at %zu", i);
    if (i) out[o++] = '|';
    memcpy(out + o, s + i, j - i);
    o += j - i;
    i = j;
  }
  out[o] = '\0';
}

Test(bpe, pretok_cases) {
  /* Expected pieces: Python's regex.findall with GPT-2's pattern, joined with '|'. */
  const char *c[][2] = {
      {"Hello world", "Hello| world"},   {"I'm here", "I|'m| here"},        {"they'll've", "they|'ll|'ve"},
      {"''s", "''|s"},                   {" 's", " '|s"},                    {"'S", "'|S"},
      {"a  b", "a| | b"},                {"a   \n\nb", "a|   \n|\n|b"},     {"x  ", "x|  "},
      {"\t\tx", "\t|\t|x"},              {"123abc", "123|abc"},              {" 42", " 42"},
      {"3.14", "3|.|14"},                {"!!! ok", "!!!| ok"},              {"a!?", "a|!?"},
      {"e\xcc\x81", "e|\xcc\x81"},       {"\xe4\xb8\xad\xe6\x96\x87 text", "\xe4\xb8\xad\xe6\x96\x87| text"},
      {" \xc2\xa0" "a", " |\xc2\xa0|a"}, {"hello\n", "hello|\n"},            {"don't", "don|'t"},
      {"'ll'd", "'ll|'d"},               {"a\xe3\x80\x80\xe3\x80\x80" "b", "a|\xe3\x80\x80|\xe3\x80\x80|b"},
      {"  ", "  "},                      {"\n", "\n"},                       {"a \n b", "a| \n| b"},
      {"x'rex", "x|'re|x"},              {"a'", "a|'"},                      {"\x1c\x1d a", "\x1c\x1d| a"},
      {"\xe2\x85\xa3\xc2\xb2 x", "\xe2\x85\xa3\xc2\xb2| x"},
      {"\xff\xfe a\x80", "\xff\xfe| a|\x80"}, /* invalid bytes: "other" characters, one byte each */
  };
  char got[256];
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    pieces(c[i][0], strlen(c[i][0]), got);
    cr_expect_str_eq(got, c[i][1], "case %zu", i);
  }
}

/* Fragments that exercise every branch of the pattern, for random texts. */
static const char *frag[] = {"a", "Zz", "7", "42", " ", "  ", "\n", "\n\n", "\t", "'", "'s", "'re", "'ll", "'S",
                             "!", "?!", ".", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xc2\xa0",
                             "\xe3\x80\x80", "\xe2\x85\xa3", "\xcc\x81", "\xff", "\x80", "\xe4\xb8", "\xed\xa0\x80",
                             "\x1c", "\r\n", "\xd9\xa3"};

static size_t random_text(uint8_t *s, size_t cap) {
  size_t n = 0;
  for (;;) {
    const char *f = frag[rnd(sizeof frag / sizeof *frag)];
    size_t m = strlen(f);
    if (n + m > cap) return n;
    memcpy(s + n, f, m);
    n += m;
  }
}

/* Pre-token ends of s[0..n) into e; returns their number. */
static size_t ends(const uint8_t *s, size_t n, size_t *e) {
  size_t k = 0;
  for (size_t i = 0; i < n; i = e[k++]) e[k] = dt_bpe_pretok_next(s, n, i);
  return k;
}

/* ends(s[0..p)) ++ (p + ends(s[p..n))) == ends(s[0..n)) (whole: kw ends of s). */
static int cut_same(const uint8_t *s, size_t n, size_t p, const size_t *whole, size_t kw, size_t *part) {
  size_t k1 = ends(s, p, part);
  size_t k2 = ends(s + p, n - p, part + k1);
  for (size_t i = k1; i < k1 + k2; i++) part[i] += p;
  return k1 + k2 == kw && !memcmp(part, whole, kw * sizeof *whole);
}

static size_t check_cuts(const uint8_t *s, size_t n, size_t *whole, size_t *part) {
  size_t kw = ends(s, n, whole), safe = 0;
  for (size_t p = 1; p < n; p++) {
    if (!dt_bpe_safe_split(s, n, p)) continue;
    safe++;
    if (!cut_same(s, n, p, whole, kw, part)) cr_assert_fail("cut at %zu of a %zu-byte text changes its pre-tokens", p, n);
  }
  return safe;
}

Test(bpe, safe_split_property) {
  enum { N = 600 };
  uint8_t s[N];
  size_t whole[N + 1], part[N + 1], safe = 0, total = 0;
  for (int t = 0; t < 400; t++) {
    size_t n = random_text(s, 1 + rnd(N));
    safe += check_cuts(s, n, whole, part);
    total += n;
  }
  for (int t = 0; t < 200; t++) { /* random bytes */
    size_t n = 1 + rnd(N);
    for (size_t i = 0; i < n; i++) s[i] = (uint8_t)rnd(256);
    safe += check_cuts(s, n, whole, part);
    total += n;
  }
  printf("safe_split_property: %zu safe cuts checked in %zu bytes of random text\n", safe, total);
  cr_expect_gt(safe, total / 10, "too few safe cuts (%zu in %zu bytes) for chunking to be useful", safe, total);
  /* the check has teeth: cuts that the rule refuses do change the pieces */
  const char *bad[][2] = {{"a\n\nb", "3"}, {"x's", "2"}, {"a b", "2"}, {"ab", "1"}, {"x'll", "3"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const uint8_t *u = (const uint8_t *)bad[i][0];
    size_t n = strlen(bad[i][0]), p = (size_t)atoi(bad[i][1]), kw = ends(u, n, whole);
    cr_expect(!dt_bpe_safe_split(u, n, p), "case %zu", i);
    cr_expect(!cut_same(u, n, p, whole, kw, part), "case %zu: cutting there should change the pieces", i);
  }
  cr_expect(!dt_bpe_safe_split((const uint8_t *)"\xc3\xa9", 2, 1)); /* inside a character */
  cr_expect(dt_bpe_safe_split((const uint8_t *)"ab cd", 5, 2));
}

/* ---- a small vocabulary, written here ---- */

/* GPT-2's byte alphabet: printable bytes stand for themselves, the rest for U+0100 + k in order. */
static uint32_t b2u(int b) {
  int k = 0;
  for (int c = 0; c < b; c++) k += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
  return ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) ? (uint32_t)b : 256u + (uint32_t)k;
}

/* Merges in rank order as (left, right) byte strings; token 256 + rank is their concatenation. */
static const char *merges[][2] = {{"a", "b"}, {"b", "d"}, {"a", "bd"}, {"ab", "c"}, {"b", "c"},
                                  {" ", "a"}, {" a", "b"}, {"a", "a"}, {"aa", "aa"}};
#define NM ((int)(sizeof merges / sizeof *merges))
#define EOT (256 + NM)

/* A token string in the alphabet, raw UTF-8 (the loader also takes \u escapes; ids < 256 use them). */
static void alpha(FILE *f, const char *bytes) {
  for (const char *c = bytes; *c; c++) {
    uint8_t b[4];
    fwrite(b, 1, (size_t)encode_utf8(b2u((uint8_t)*c), b), f);
  }
}

static const char *write_vocab(const char *name) {
  const char *d = P(name);
  mkdir(d, 0755);
  char path[600];
  snprintf(path, sizeof path, "%s/encoder.json", d);
  FILE *f = fopen(path, "wb");
  cr_assert(f);
  fprintf(f, "{");
  for (int b = 0; b < 256; b++) fprintf(f, "\"\\u%04x\": %d, ", b2u(b), b);
  for (int m = 0; m < NM; m++) {
    char both[16];
    snprintf(both, sizeof both, "%s%s", merges[m][0], merges[m][1]);
    fprintf(f, "\"");
    alpha(f, both);
    fprintf(f, "\": %d,\n", 256 + m);
  }
  fprintf(f, "\"<|endoftext|>\": %d}\n", EOT);
  fclose(f);
  snprintf(path, sizeof path, "%s/vocab.bpe", d);
  f = fopen(path, "wb");
  fprintf(f, "#version: 0.2\n");
  for (int m = 0; m < NM; m++) {
    alpha(f, merges[m][0]);
    fprintf(f, " ");
    alpha(f, merges[m][1]);
    fprintf(f, "\n");
  }
  fclose(f);
  return d;
}

/* encoder.py's bpe() on bytes: merge every occurrence of the lowest-ranked pair, left to right,
 * until no pair is a merge; then each part's id. */
static size_t ref_bpe(const uint8_t *s, size_t n, uint16_t *out) {
  char(*part)[64] = malloc(n * sizeof *part);
  size_t m = n;
  for (size_t i = 0; i < n; i++) part[i][0] = (char)s[i], part[i][1] = 0;
  for (;;) {
    int best = NM;
    for (size_t i = 0; i + 1 < m; i++)
      for (int r = 0; r < best; r++)
        if (!strcmp(part[i], merges[r][0]) && !strcmp(part[i + 1], merges[r][1])) best = r;
    if (best == NM) break;
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {
      if (i + 1 < m && !strcmp(part[i], merges[best][0]) && !strcmp(part[i + 1], merges[best][1])) {
        snprintf(part[k++], 64, "%s%s", merges[best][0], merges[best][1]);
        i++;
      } else {
        memmove(part[k++], part[i], 64);
      }
    }
    m = k;
  }
  for (size_t i = 0; i < m; i++) {
    out[i] = (uint8_t)part[i][0];
    for (int r = 0; r < NM && part[i][1]; r++) {
      char both[64];
      snprintf(both, sizeof both, "%s%s", merges[r][0], merges[r][1]);
      if (!strcmp(both, part[i])) out[i] = (uint16_t)(256 + r);
    }
  }
  free(part);
  return m;
}

static dt_bpe_t *load_small(dt_bpe_enc_t **e) {
  dt_bpe_t *b;
  cr_assert_eq(dt_bpe_load(&b, write_vocab("v")), DT_OK, "%s", dt_err_msg());
  cr_assert_eq(dt_bpe_vocab_size(b), EOT + 1);
  cr_assert_eq(dt_bpe_eot(b), EOT);
  if (e) cr_assert_eq(dt_bpe_enc_init(e, b), DT_OK);
  return b;
}

static size_t enc_text(dt_bpe_enc_t *e, const char *s, uint16_t *out) {
  dt_bpe_toks_t t = {0};
  cr_assert_eq(dt_bpe_encode(e, (const uint8_t *)s, strlen(s), &t), DT_OK);
  memcpy(out, t.v, t.n * sizeof *t.v);
  free(t.v);
  return t.n;
}

Test(bpe, merges_by_hand) {
  dt_bpe_enc_t *e;
  dt_bpe_t *b = load_small(&e);
  /* worked out by hand from the merge list (ids: 256 ab, 257 bd, 258 abd, 259 abc, 260 bc, 261 " a",
   * 262 " ab", 263 aa, 264 aaaa); each text is one pre-token */
  const struct {
    const char *text;
    size_t n;
    uint16_t tok[6];
  } c[] = {
      {"ab", 1, {256}},
      {"abd", 2, {256, 'd'}}, /* (a,b) ranks before (b,d): "abd" is a token but BPE never reaches it */
      {"abc", 1, {259}},      {"bcd", 2, {260, 'd'}},
      {" ab", 2, {' ', 256}}, /* (a,b) before (" ",a): " ab" never forms */
      {" a", 1, {261}},       {"aaaaa", 2, {264, 'a'}}, {"aaa", 2, {263, 'a'}},
      {"dcba", 4, {'d', 'c', 'b', 'a'}},
  };
  uint16_t got[64];
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    size_t n = enc_text(e, c[i].text, got);
    cr_expect(n == c[i].n && !memcmp(got, c[i].tok, n * sizeof *got), "'%s': %zu tokens, first %d", c[i].text, n,
              got[0]);
  }
  /* <|endoftext|> in the text is ordinary text, never the special token */
  size_t n = enc_text(e, "<|endoftext|>", got);
  for (size_t i = 0; i < n; i++) cr_expect_neq(got[i], EOT);
  dt_bpe_enc_free(e);
  dt_bpe_free(b);
}

/* The array loop, the heap loop and the automatic choice all equal encoder.py's algorithm. */
Test(bpe, merge_loops_vs_reference) {
  dt_bpe_enc_t *e;
  dt_bpe_t *b = load_small(&e);
  enum { N = 3000 };
  uint8_t *s = malloc(N);
  uint16_t *want = malloc(N * sizeof *want);
  for (int t = 0; t < 3000; t++) {
    size_t n = t < 2900 ? 1 + rnd(200) : 1 + rnd(N);
    for (size_t i = 0; i < n; i++) s[i] = (uint8_t)"aaabbcd "[rnd(8)];
    size_t m = ref_bpe(s, n, want);
    for (int method = 0; method < 3; method++) {
      if (method == 1 && n > 128) continue;
      dt_bpe_toks_t got = {0};
      cr_assert_eq(dt_bpe_encode_piece(e, s, n, method, &got), DT_OK);
      if (got.n != m || memcmp(got.v, want, m * sizeof *want))
        cr_assert_fail("method %d, %zu bytes: %zu tokens, the reference %zu", method, n, got.n, m);
      free(got.v);
    }
  }
  free(s);
  free(want);
  dt_bpe_enc_free(e);
  dt_bpe_free(b);
}

Test(bpe, decode_encode_round_trip) {
  dt_bpe_enc_t *e;
  dt_bpe_t *b = load_small(&e);
  enum { N = 4000 };
  uint8_t *s = malloc(N), *back = NULL;
  size_t cap = 0;
  for (int t = 0; t < 300; t++) {
    size_t n = t % 2 ? random_text(s, rnd(N)) : rnd(N);
    if (t % 2 == 0)
      for (size_t i = 0; i < n; i++) s[i] = (uint8_t)(rnd(3) ? (uint32_t)(uint8_t)"abcd 'x\n"[rnd(8)] : rnd(256));
    dt_bpe_toks_t tok = {0};
    cr_assert_eq(dt_bpe_encode(e, s, n, &tok), DT_OK);
    size_t len = 0;
    cr_assert_eq(dt_bpe_decode(b, tok.v, tok.n, &back, &len, &cap), DT_OK);
    cr_assert(len == n && !memcmp(back, s, n), "text %d (%zu bytes) does not survive encode + decode", t, n);
    free(tok.v);
  }
  uint16_t badtok = EOT + 1;
  size_t len = 0;
  cr_expect_eq(dt_bpe_decode(b, &badtok, 1, &back, &len, &cap), DT_ERR_DATA);
  free(s);
  free(back);
  dt_bpe_enc_free(e);
  dt_bpe_free(b);
}

/* ---- loader errors: one message naming the file ---- */

static void expect_load_error(const char *enc, const char *bpe, const char *want) {
  static int k;
  char name[32];
  snprintf(name, sizeof name, "bad%d", k++);
  const char *d = write_vocab(name);
  char path[600];
  if (enc) {
    snprintf(path, sizeof path, "%s/encoder.json", d);
    write_file(path, enc, strlen(enc));
  }
  if (bpe) {
    snprintf(path, sizeof path, "%s/vocab.bpe", d);
    write_file(path, bpe, strlen(bpe));
  }
  dt_bpe_t *b = NULL;
  dt_err_clear();
  cr_expect_neq(dt_bpe_load(&b, d), DT_OK, "no error for the case '%s'", want);
  cr_expect(strstr(dt_err_msg(), want) != NULL, "message '%s' lacks '%s'", dt_err_msg(), want);
  cr_expect_null(b);
}

Test(bpe, loader_errors) {
  dt_bpe_t *b = NULL;
  cr_expect_eq(dt_bpe_load(&b, P("nowhere")), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), "nowhere/encoder.json") != NULL, "%s", dt_err_msg());
  expect_load_error("{\"a\" 1}", NULL, "encoder.json: byte 5: expected ':'");
  expect_load_error("{\"\\u4e2d\": 0}", NULL, "character U+4E2D is not in GPT-2's byte alphabet");
  expect_load_error("{\"a\": 0, \"b\": 0}", NULL, "token id 0 given twice");
  expect_load_error("{\"a\": 0, \"b\": 2}", NULL, "ids must be 0..V-1");
  expect_load_error("{\"a\": 0, \"b\": 1} x", NULL, "text after the object");
  expect_load_error(NULL, "#version: 0.2\na b\na bb\n", "vocab.bpe:3: 'bb' is not a token of encoder.json");
  expect_load_error(NULL, "#version: 0.2\na d\n", "vocab.bpe:2: the merged token is not in encoder.json");
  expect_load_error(NULL, "a b\na  b\n", "vocab.bpe:2: expected two tokens separated by one space");
  expect_load_error(NULL, "a b\na b\n", "vocab.bpe:2: this pair was merged before");
}

/* ---- dt_prep_gpt2 end to end ---- */

static uint16_t *read_all(const char *prefix, const char *split, size_t *n, int *shards) {
  uint16_t *all = NULL;
  *n = 0;
  for (*shards = 0;; ++*shards) {
    char path[600];
    snprintf(path, sizeof path, "%s_%s_%06d.bin", prefix, split, *shards);
    if (access(path, F_OK) != 0) break;
    uint16_t *t;
    uint64_t m;
    cr_assert_eq(dt_data_read_shard(path, &t, &m), DT_OK, "%s", dt_err_msg());
    all = realloc(all, (*n + m + 1) * sizeof *all);
    memcpy(all + *n, t, m * sizeof *t);
    *n += m;
    free(t);
  }
  return all;
}

static int leftovers(void) {
  int k = 0;
  DIR *dd = opendir(dir);
  struct dirent *ent;
  while ((ent = readdir(dd))) k += strstr(ent->d_name, ".prep.") != NULL || strstr(ent->d_name, ".tmp.") != NULL;
  closedir(dd);
  return k;
}

/* Four documents (random text, an empty file, random bytes): the shards hold EOT + tokens of each
 * document, the same at every chunk size and thread count; val is a prefix ending at a safe cut. */
Test(bpe, prep_chunked_equals_whole) {
  dt_bpe_enc_t *e;
  dt_bpe_t *b = load_small(&e);
  enum { N = 30000 };
  uint8_t *s = malloc(N);
  const char *in[4] = {P("d0.txt"), P("d1.txt"), P("d2.txt"), P("d3.txt")};
  dt_bpe_toks_t want = {0};
  size_t total = 0, lens[4];
  for (int d = 0; d < 4; d++) {
    size_t n = d == 1 ? 0 : d == 3 ? rnd(N) : random_text(s, N);
    if (d == 3)
      for (size_t i = 0; i < n; i++) s[i] = (uint8_t)rnd(256);
    write_file(in[d], s, n);
    want.v = realloc(want.v, (want.n + 1) * sizeof *want.v);
    want.v[want.n++] = EOT;
    want.cap = want.n;
    cr_assert_eq(dt_bpe_encode(e, s, n, &want), DT_OK);
    lens[d] = n;
    total += n;
  }
  const size_t chunks[] = {64, 100, 777, 1 << 20};
  const int threads[] = {1, 2, 3, 2};
  for (int k = 0; k < 4; k++) {
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s/o%d", dir, k);
    dt_prep_opts_t o = {P("v"), 1000, 0.3, threads[k], chunks[k]};
    cr_assert_eq(dt_prep_gpt2(in, 4, prefix, &o, NULL), DT_OK, "%s", dt_err_msg());
    size_t nv, nt;
    int sv, st;
    uint16_t *v = read_all(prefix, "val", &nv, &sv), *t = read_all(prefix, "train", &nt, &st);
    cr_expect_eq(sv, (int)(nv + 999) / 1000);
    cr_expect_eq(st, (int)(nt + 999) / 1000);
    cr_assert_eq(nv + nt, want.n, "chunk %zu: %zu + %zu tokens, want %zu", chunks[k], nv, nt, want.n);
    cr_expect(!memcmp(v, want.v, nv * 2) && !memcmp(t, want.v + nv, nt * 2), "chunk %zu: tokens differ", chunks[k]);
    /* val: the text up to a cut at or after 30% of the bytes, before the next document's start */
    uint8_t *text = NULL;
    size_t len = 0, cap = 0;
    cr_assert_eq(dt_bpe_decode(b, v, nv, &text, &len, &cap), DT_OK);
    size_t floor30 = (size_t)(0.3 * (double)total), eots = 0;
    for (size_t i = 0; i < nv; i++) eots += v[i] == EOT;
    cr_expect_geq(len - 13 * eots, floor30, "val holds %zu text bytes, below 30%% of %zu", len - 13 * eots, total);
    cr_expect_leq(len - 13 * eots, lens[0] + lens[1] + lens[2], "val reaches into the last document");
    free(text), free(v), free(t);
  }
  cr_expect_eq(leftovers(), 0);
  free(s), free(want.v);
  dt_bpe_enc_free(e);
  dt_bpe_free(b);
}

Test(bpe, prep_errors) {
  dt_bpe_t *b = load_small(NULL);
  dt_bpe_free(b);
  write_file(P("a.txt"), "ab cd", 5);
  write_file(P("empty.txt"), "", 0);
  const char *a[1] = {P("a.txt")}, *empty[1] = {P("empty.txt")}, *missing[2] = {P("a.txt"), P("nope.txt")};
  dt_prep_opts_t o = {P("v"), 1000, 0.0, 2, 64};
  cr_expect_eq(dt_prep_gpt2(missing, 2, P("o"), &o, NULL), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), "nope.txt") != NULL, "%s", dt_err_msg());
  dt_err_clear();
  cr_expect_eq(dt_prep_gpt2(empty, 1, P("o"), &o, NULL), DT_ERR_DATA);
  cr_expect(strstr(dt_err_msg(), "empty.txt: input text is empty") != NULL, "%s", dt_err_msg());
  dt_err_clear();
  o.val_fraction = 0.5; /* "ab cd" can be cut after "ab" only: val takes "ab", train " cd" */
  cr_expect_eq(dt_prep_gpt2(a, 1, P("o"), &o, NULL), DT_OK, "%s", dt_err_msg());
  o.val_fraction = 0.9; /* no cut after byte 4: val would take everything */
  dt_err_clear();
  cr_expect_eq(dt_prep_gpt2(a, 1, P("x"), &o, NULL), DT_ERR_DATA);
  cr_expect(strstr(dt_err_msg(), "no tokens left for train") != NULL, "%s", dt_err_msg());
  o.val_fraction = 0.5;
  o.shard_tokens = 1; /* EOT "ab" | " " "c" "d": 2 val and 3 train shards now... */
  dt_err_clear();
  cr_expect_eq(dt_prep_gpt2(a, 1, P("o"), &o, NULL), DT_OK, "%s", dt_err_msg());
  o.shard_tokens = 1000; /* ...so one shard each would leave stale ones: refused, nothing replaced */
  cr_expect_eq(dt_prep_gpt2(a, 1, P("o"), &o, NULL), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), "o_val_000001.bin: stale shard") != NULL, "%s", dt_err_msg());
  size_t nv, nt;
  int sv, st;
  free(read_all(P("o"), "val", &nv, &sv));
  free(read_all(P("o"), "train", &nt, &st));
  cr_expect(nv == 2 && sv == 2 && nt == 3 && st == 3, "val %zu in %d, train %zu in %d", nv, sv, nt, st);
  dt_err_clear();
  o.vocab_dir = P("nowhere");
  cr_expect_eq(dt_prep_gpt2(a, 1, P("y"), &o, NULL), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), "nowhere/encoder.json") != NULL, "%s", dt_err_msg());
  cr_expect_eq(access(P("x_val_000000.bin"), F_OK), -1, "a failed run left a shard");
  cr_expect_eq(access(P("y_train_000000.bin"), F_OK), -1, "a failed run left a shard");
  cr_expect_eq(leftovers(), 0);
}

static int run_main(int n, ...) {
  char *argv[16];
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) argv[i] = va_arg(ap, char *);
  va_end(ap);
  argv[n] = NULL;
  return dt_prep_main(n, argv);
}

/* The command line: usage errors are 2 before any work, failures 1, and the options arrive. */
Test(bpe, prep_main_options) {
  char v[512], f[512], o[512], sh[600];
  snprintf(v, sizeof v, "%s", write_vocab("v"));
  snprintf(f, sizeof f, "%s", P("a.txt"));
  snprintf(o, sizeof o, "%s", P("o"));
  write_file(f, "ab abc 'll\n", 11);
  cr_assert_eq(chdir(dir), 0); /* so that the default --vocab, data/gpt2, does not exist */
  cr_expect_eq(run_main(5, "prep", "--tokenizer", "bpe", o, f), 2);
  cr_expect_eq(run_main(5, "prep", "--threads", "2", o, f), 2);   /* gpt2 only */
  cr_expect_eq(run_main(5, "prep", "--vocab", v, o, f), 2);       /* gpt2 only */
  cr_expect_eq(run_main(7, "prep", "--tokenizer", "gpt2", "--chunk-bytes", "63", o, f), 2);
  cr_expect_eq(run_main(7, "prep", "--tokenizer", "gpt2", "--threads", "0", o, f), 2);
  cr_expect_eq(run_main(2, "prep", "--decode"), 2);
  cr_expect_eq(run_main(5, "prep", "--tokenizer", "gpt2", o, f), 1, "no data/gpt2 here: a failure, not usage");
  cr_expect_eq(run_main(12, "prep", "--tokenizer=gpt2", "--vocab", v, "--threads", "2", "--chunk-bytes", "64",
                        "--val-fraction", "0", o, f),
               0);
  size_t n;
  int k;
  uint16_t *t = read_all(o, "train", &n, &k);
  /* EOT, "ab", " ", "abc", " '", "ll", "\n": pieces "ab"," abc"," '","ll","\n" with " abc" = " " + abc */
  const uint16_t want[] = {EOT, 256, ' ', 259, ' ', '\'', 'l', 'l', '\n'};
  cr_expect(n == sizeof want / sizeof *want && !memcmp(t, want, sizeof want), "%zu tokens", n);
  free(t);
  snprintf(sh, sizeof sh, "%s_train_000000.bin", o);
  cr_expect_eq(run_main(5, "prep", "--decode", "--tokenizer", "gpt2", sh), 1, "no data/gpt2 here");
  cr_expect_eq(run_main(3, "prep", "--decode", sh), 1, "GPT-2 tokens are not bytes");
  cr_expect(strstr(dt_err_msg(), "is 265, not a byte") != NULL, "%s", dt_err_msg());
}
