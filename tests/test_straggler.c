/* Straggler statistics (straggler.h): min / median / max / slowest rank against values worked out
 * by hand, ties, one rank, the input left alone, and when the report is due. */
#include <criterion/criterion.h>

#include "straggler.h"

Test(straggler, odd_count) {
  const double t[5] = {0.030, 0.010, 0.050, 0.020, 0.040};
  double s[5];
  dt_straggler_t r;
  dt_straggler_stats(t, 5, s, &r);
  cr_expect_eq(r.n, 5);
  cr_expect_float_eq(r.min, 0.010, 1e-15);
  cr_expect_float_eq(r.median, 0.030, 1e-15);
  cr_expect_float_eq(r.max, 0.050, 1e-15);
  cr_expect_eq(r.slowest, 2);
  cr_expect_float_eq(t[0], 0.030, 0); /* input untouched (sorted in scratch) */
}

Test(straggler, even_count_median_is_mean_of_middle_two) {
  const double t[4] = {4.0, 1.0, 3.0, 2.0};
  double s[4];
  dt_straggler_t r;
  dt_straggler_stats(t, 4, s, &r);
  cr_expect_float_eq(r.median, 2.5, 1e-15);
  cr_expect_float_eq(r.min, 1.0, 0);
  cr_expect_float_eq(r.max, 4.0, 0);
  cr_expect_eq(r.slowest, 0);
}

Test(straggler, ties_name_the_lowest_rank) {
  const double t[6] = {1.0, 7.0, 2.0, 7.0, 7.0, 0.5};
  double s[6];
  dt_straggler_t r;
  dt_straggler_stats(t, 6, s, &r);
  cr_expect_eq(r.slowest, 1);
  cr_expect_float_eq(r.median, 4.5, 1e-15); /* sorted 0.5 1 2 7 7 7 */
}

Test(straggler, one_rank) {
  const double t[1] = {0.25};
  double s[1];
  dt_straggler_t r;
  dt_straggler_stats(t, 1, s, &r);
  cr_expect_eq(r.n, 1);
  cr_expect_eq(r.slowest, 0);
  cr_expect_float_eq(r.min, 0.25, 0);
  cr_expect_float_eq(r.median, 0.25, 0);
  cr_expect_float_eq(r.max, 0.25, 0);
}

Test(straggler, slow_rank_last) {
  double t[64], s[64];
  for (int i = 0; i < 64; i++) t[i] = 0.1 + 1e-3 * (i % 7);
  t[63] = 0.6; /* one rank sleeps 0.5 s more, as DTRAIN_FAULT=slow_rank does */
  dt_straggler_t r;
  dt_straggler_stats(t, 64, s, &r);
  cr_expect_eq(r.slowest, 63);
  cr_expect_float_eq(r.max, 0.6, 0);
  cr_expect_float_eq(r.min, 0.1, 0);
  cr_expect(r.median > 0.1 && r.median < 0.107);
}

Test(straggler, due) {
  cr_expect(dt_straggler_due(10, -1, 5));  /* -1: every log.every steps */
  cr_expect(!dt_straggler_due(11, -1, 5));
  cr_expect(dt_straggler_due(3, 3, 5));
  cr_expect(!dt_straggler_due(5, 3, 5));
  cr_expect(!dt_straggler_due(10, 0, 5)); /* 0: off */
  cr_expect(!dt_straggler_due(0, 1, 1));  /* nothing done yet */
}
