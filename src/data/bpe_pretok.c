/* GPT-2's pre-tokenisation pattern by hand (see bpe.h): strict UTF-8 decoding, the Unicode
 * letter/number/space classes (tables generated from Unicode 16.0 by scripts/gen-bpe-unicode.py),
 * the pattern's leftmost-first alternation as a few branches, and the rule that says where a long
 * text may be cut into chunks without changing its pre-tokens. */
#include "bpe.h"
#include "bpe_unicode.h"

/* ---- characters ------------------------------------------------------------------------ */

static inline int ascii_class(uint8_t c) {
  if ((uint8_t)((c | 0x20) - 'a') < 26) return DT_BPE_LETTER;
  if ((uint8_t)(c - '0') < 10) return DT_BPE_NUMBER;
  if (c == ' ' || (uint8_t)(c - '\t') < 5) return DT_BPE_SPACE; /* \t \n \v \f \r */
  return DT_BPE_OTHER;
}

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < r[mid][0])
      hi = mid;
    else if (cp > r[mid][1])
      lo = mid + 1;
    else
      return 1;
  }
  return 0;
}

int dt_bpe_class(uint32_t cp) {
  if (cp < 0x80) return ascii_class((uint8_t)cp);
  switch (cp) { /* Unicode White_Space beyond ASCII (what \s means to both regex engines) */
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return DT_BPE_SPACE;
    default:
      if (cp >= 0x2000 && cp <= 0x200A) return DT_BPE_SPACE;
  }
  if (cp > 0x10FFFF) return DT_BPE_OTHER; /* DT_BPE_INVALID */
  if (in_ranges(dt_bpe_letter_ranges, sizeof dt_bpe_letter_ranges / sizeof *dt_bpe_letter_ranges, cp))
    return DT_BPE_LETTER;
  if (in_ranges(dt_bpe_number_ranges, sizeof dt_bpe_number_ranges / sizeof *dt_bpe_number_ranges, cp))
    return DT_BPE_NUMBER;
  return DT_BPE_OTHER;
}

static inline int cont(uint8_t b) { return (b & 0xC0) == 0x80; }

/* Well-formed sequences (Unicode 16, table 3-7): 00-7F | C2-DF 80-BF | E0 A0-BF 80-BF |
 * E1-EC,EE-EF 80-BF 80-BF | ED 80-9F 80-BF | F0 90-BF 80-BF 80-BF | F1-F3 80-BF x3 |
 * F4 80-8F 80-BF 80-BF. Anything else is one invalid byte (as Python's surrogateescape sees it). */
int dt_bpe_utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
  uint8_t b0 = s[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (n >= 2 && cont(s[1])) {
      *cp = (uint32_t)(b0 & 0x1F) << 6 | (s[1] & 0x3F);
      return 2;
    }
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    if (n >= 3 && s[1] >= lo && s[1] <= hi && cont(s[2])) {
      *cp = (uint32_t)(b0 & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
      return 3;
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (n >= 4 && s[1] >= lo && s[1] <= hi && cont(s[2]) && cont(s[3])) {
      *cp = (uint32_t)(b0 & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
            (s[3] & 0x3F);
      return 4;
    }
  }
  *cp = DT_BPE_INVALID;
  return 1;
}

/* Class and length *w of the character at s[i], i < n. */
static inline int class_at(const uint8_t *s, size_t n, size_t i, int *w) {
  if (s[i] < 0x80) {
    *w = 1;
    return ascii_class(s[i]);
  }
  uint32_t cp;
  *w = dt_bpe_utf8_next(s + i, n - i, &cp);
  return dt_bpe_class(cp);
}

/* First position >= j whose character is not of class c. */
static inline size_t run_end(const uint8_t *s, size_t n, size_t j, int c) {
  while (j < n) {
    int w;
    if (class_at(s, n, j, &w) != c) break;
    j += (size_t)w;
  }
  return j;
}

/* ---- the pattern ----------------------------------------------------------------------- */

/* The alternatives in order, as a backtracking engine (Python's regex, Rust's fancy-regex) tries
 * them at position i; the first that matches gives the pre-token:
 *   1. 's 't 're 've 'm 'll 'd       an ASCII apostrophe and those lowercase letters;
 *   2-4. ` ?X+` for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]: an optional U+0020 and then a maximal run
 *        of one class (the run of "other" characters swallows apostrophes too: "''s" is "''","s");
 *   5. \s+(?!\S): the whitespace run, backtracked by one character when a non-space follows it
 *      (the last space then prefixes the next word through 2-4), all of it at the end of the text;
 *   6. \s+: reached only for a run of one character followed by a non-space (5 failed), so it
 *      matches that one character. */
size_t dt_bpe_pretok_next(const uint8_t *s, size_t n, size_t i) {
  if (s[i] == '\'' && i + 1 < n) {
    uint8_t a = s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      uint8_t b = s[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  int w, c = class_at(s, n, i, &w);
  if (c != DT_BPE_SPACE) return run_end(s, n, i + (size_t)w, c);
  if (s[i] == ' ' && i + 1 < n) {
    int w2, c2 = class_at(s, n, i + 1, &w2);
    if (c2 != DT_BPE_SPACE) return run_end(s, n, i + 1 + (size_t)w2, c2);
  }
  size_t last = i, j = i + (size_t)w; /* last: start of the run's last character */
  while (j < n) {
    int w2;
    if (class_at(s, n, j, &w2) != DT_BPE_SPACE) break;
    last = j;
    j += (size_t)w2;
  }
  if (j == n) return n;       /* 5 at the end of the text */
  if (last > i) return last;  /* 5, backtracked */
  return j;                   /* 6 */
}

/* ---- where a text may be cut ----------------------------------------------------------- */

/* Let c1 be the character that ends at p and c2 the one that starts at p. p is a safe cut when
 *   s[p] is not a continuation byte (so p is a character boundary however s is decoded from s[0]),
 *   class(c1) is letter, number or other, c1 is not an apostrophe, and class(c2) != class(c1).
 * Why: every alternative's match depends only on the text from where it starts, so the pre-tokens
 * after a boundary are a function of the text after it; it remains to see that (a) in the whole
 * text a pre-token ends at p and (b) the pre-tokens before p do not change when the text ends at
 * p. The pre-token holding c1 is a run of c1's class (2-4) or a contraction (1) ending in c1:
 * not whitespace (5, 6), and not an apostrophe that 1 could join to c2. A run stops at p in both
 * texts since c2 is of another class; a contraction ending in c1 is complete, and one that would
 * go on past p ('re, 've, 'll) needs c2 to be a letter of c1's class. Of all the alternatives,
 * only those run extensions and 1 look at c2 from a match that starts before p (5's lookahead and
 * the optional space of 2-4 need whitespace before p, excluded). So chunks of a file cut at safe
 * points tokenize exactly as the whole file. */
int dt_bpe_safe_split(const uint8_t *s, size_t n, size_t p) {
  if (p == 0 || p >= n || cont(s[p])) return 0;
  size_t q = p - 1; /* start of c1: the nearest non-continuation byte within 3 bytes of p - 1 */
  while (q > 0 && p - q < 4 && cont(s[q])) q--;
  uint32_t cp1, cp2;
  int w1 = dt_bpe_utf8_next(s + q, n - q, &cp1);
  if (q + (size_t)w1 != p) cp1 = DT_BPE_INVALID; /* s[p-1] is a stray byte: "other" */
  if (cp1 == '\'') return 0;
  int c1 = dt_bpe_class(cp1);
  if (c1 == DT_BPE_SPACE) return 0;
  dt_bpe_utf8_next(s + p, n - p, &cp2);
  return dt_bpe_class(cp2) != c1;
}
