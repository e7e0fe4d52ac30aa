/* Token sampling (sample.h): greedy cases, the top-k set, and draw frequencies against the
 * softmax probabilities computed by hand; a seed gives the same draws. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "sample.h"

static int draw(const float *z, int V, float temp, int k, dt_rng_t *r) {
  static char scratch[4096];
  cr_assert(dt_sample_scratch_bytes(V) <= sizeof scratch);
  return dt_sample(z, V, temp, k, r, scratch);
}

Test(sample, argmax_takes_the_lowest_index_among_equals) {
  const float z[] = {-1.0f, 3.0f, 2.0f, 3.0f, -INFINITY};
  cr_assert_eq(dt_sample_argmax(z, 5), 1);
  cr_assert_eq(dt_sample_argmax(z, 1), 0);
}

Test(sample, temperature_zero_and_top_one_are_greedy) {
  const float z[] = {0.5f, 0.1f, 0.7f, 0.69f};
  dt_rng_t r;
  dt_rng_seed(&r, 3);
  for (int i = 0; i < 20; i++) {
    cr_assert_eq(draw(z, 4, 0.0f, 0, &r), 2);
    cr_assert_eq(draw(z, 4, 5.0f, 1, &r), 2);
  }
}

/* Frequencies of n draws against p (hand-computed), to 4 standard deviations. */
static void check_freq(const float *z, int V, float temp, int k, const double *p, int n) {
  int count[8] = {0};
  dt_rng_t r;
  dt_rng_seed(&r, 11);
  for (int i = 0; i < n; i++) count[draw(z, V, temp, k, &r)]++;
  for (int v = 0; v < V; v++) {
    double f = (double)count[v] / n, sd = sqrt(p[v] * (1 - p[v]) / n);
    cr_assert(fabs(f - p[v]) <= 4 * sd + 1e-12, "token %d: frequency %.4f, probability %.4f", v, f, p[v]);
  }
}

/* z = (0, ln 3): softmax = (1/4, 3/4); at temperature 2, exp(z/2) = (1, sqrt 3): (0.366, 0.634). */
Test(sample, temperature_scales_the_logits) {
  const float z[] = {0.0f, (float)log(3.0)};
  const double p1[] = {0.25, 0.75}, p2[] = {1 / (1 + sqrt(3.0)), sqrt(3.0) / (1 + sqrt(3.0))};
  check_freq(z, 2, 1.0f, 0, p1, 20000);
  check_freq(z, 2, 2.0f, 0, p2, 20000);
}

/* top-2 of (0, 5, 4, -1, 3.9): only the two largest are drawn, in softmax proportion
 * exp(5) : exp(4) = e : 1 -> (0.7311, 0.2689). */
Test(sample, top_k_keeps_the_k_largest) {
  const float z[] = {0.0f, 5.0f, 4.0f, -1.0f, 3.9f};
  const double e = exp(1.0), p[] = {0, e / (e + 1), 1 / (e + 1), 0, 0};
  check_freq(z, 5, 1.0f, 2, p, 20000);
}

Test(sample, a_seed_repeats_its_draws) {
  const float z[] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  dt_rng_t a, b, c;
  dt_rng_seed(&a, 42);
  dt_rng_seed(&b, 42);
  dt_rng_seed(&c, 43);
  int same = 1, differ = 0;
  for (int i = 0; i < 64; i++) {
    int x = draw(z, 6, 1.0f, 0, &a), y = draw(z, 6, 1.0f, 0, &b), w = draw(z, 6, 1.0f, 0, &c);
    same &= x == y;
    differ |= x != w;
  }
  cr_assert(same, "the same seed drew different tokens");
  cr_assert(differ, "seeds 42 and 43 drew the same 64 tokens");
}
