/* Print dtrain's character classes of GPT-2's pattern (src/data/bpe_pretok.c) for every code point as
 * ranges "L|N|S lo hi" (hex; "other" is everything not listed), for tests/bpe_ref.py to compare
 * with tiktoken's regex engine. Usage: bpe_classes */
#include <stdio.h>

#include "bpe.h"

int main(void) {
  int cur = -1;
  unsigned lo = 0;
  for (unsigned cp = 0; cp <= 0x110000; cp++) {
    int c = cp < 0x110000 ? dt_bpe_class(cp) : -1;
    if (c == cur) continue;
    if (cur > 0) printf("%c %X %X\n", cur == DT_BPE_LETTER ? 'L' : cur == DT_BPE_NUMBER ? 'N' : 'S', lo, cp - 1);
    cur = c;
    lo = cp;
  }
  return 0;
}
