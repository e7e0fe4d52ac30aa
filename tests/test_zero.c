/* ZeRO shard arithmetic (zero.h): dp equal shards of whole 16-float units that tile the padded
 * arena exactly, the padding less than one unit per rank. */
#include <criterion/criterion.h>

#include "model.h"
#include "zero.h"

Test(zero, shards_tile_the_padded_arena) {
  const size_t ns[] = {1, 15, 16, 17, 1000, 4096, 124475904, 124475904 + 48};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
    for (int dp = 1; dp <= 8; dp++) {
      size_t next = 0, padded0 = 0;
      for (int r = 0; r < dp; r++) {
        size_t padded, lo, hi;
        dt_zero_split(ns[i], dp, r, DT_ALIGN, &padded, &lo, &hi);
        if (r == 0) padded0 = padded;
        cr_assert_eq(padded, padded0, "every rank computes the same padded size");
        cr_assert_eq(lo, next, "n=%zu dp=%d rank %d: shards are contiguous", ns[i], dp, r);
        cr_assert_eq((hi - lo) % DT_ALIGN, 0, "whole alignment units");
        cr_assert_eq(hi - lo, padded / (size_t)dp, "equal shards");
        next = hi;
      }
      cr_assert_eq(next, padded0, "the shards cover the padded arena");
      cr_assert(padded0 >= ns[i] && padded0 - ns[i] < (size_t)DT_ALIGN * (size_t)dp, "n=%zu dp=%d: padding %zu", ns[i],
                dp, padded0 - ns[i]);
    }
}
