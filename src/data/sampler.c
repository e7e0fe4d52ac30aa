/* The global sampler (sampler.h). */
#include "sampler.h"

#include <stdlib.h>

uint64_t dt_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t dt_rand_below(uint64_t *state, uint64_t bound) {
  uint64_t threshold = (0 - bound) % bound; /* = 2^64 mod bound: reject the short top range */
  for (;;) {
    uint64_t r = dt_splitmix64(state);
    if (r >= threshold) return r % bound;
  }
}

dt_status_t dt_sampler_init(dt_sampler_t *s, uint64_t n, int shuffle, uint64_t seed, const char *what) {
  *s = (dt_sampler_t){.n = n, .seed = seed, .shuffle = shuffle != 0};
  if (!s->shuffle) return DT_OK;
  if (n <= UINT32_MAX) s->perm32 = malloc(n * sizeof *s->perm32);
  else s->perm64 = malloc(n * sizeof *s->perm64);
  if (!s->perm32 && !s->perm64)
    return DT_ERR(DT_ERR_NOMEM, "%s: out of memory for the permutation of %llu samples", what, (unsigned long long)n);
  return DT_OK;
}

void dt_sampler_free(dt_sampler_t *s) {
  free(s->perm32);
  free(s->perm64);
  s->perm32 = NULL;
  s->perm64 = NULL;
  s->valid = 0;
}

/* Fill the cache with epoch e's permutation: identity, then Fisher-Yates from the top with
 * state = splitmix64 output of (seed) xor splitmix64 output of (epoch), so nearby seeds and
 * epochs give unrelated streams. */
static void perm_compute(dt_sampler_t *s, uint64_t epoch) {
  uint64_t N = s->n, a = s->seed, b = epoch;
  uint64_t state = dt_splitmix64(&a) ^ dt_splitmix64(&b);
  if (s->perm32) {
    for (uint64_t i = 0; i < N; i++) s->perm32[i] = (uint32_t)i;
    for (uint64_t i = N - 1; i > 0; i--) {
      uint64_t j = dt_rand_below(&state, i + 1);
      uint32_t t = s->perm32[i];
      s->perm32[i] = s->perm32[j];
      s->perm32[j] = t;
    }
  } else {
    for (uint64_t i = 0; i < N; i++) s->perm64[i] = i;
    for (uint64_t i = N - 1; i > 0; i--) {
      uint64_t j = dt_rand_below(&state, i + 1);
      uint64_t t = s->perm64[i];
      s->perm64[i] = s->perm64[j];
      s->perm64[j] = t;
    }
  }
  s->epoch = epoch;
  s->valid = 1;
}

uint64_t dt_sampler_at(dt_sampler_t *s, uint64_t g) {
  uint64_t epoch = g / s->n, pos = g % s->n;
  if (!s->shuffle) return pos;
  if (!s->valid || s->epoch != epoch) perm_compute(s, epoch);
  return s->perm32 ? s->perm32[pos] : s->perm64[pos];
}
