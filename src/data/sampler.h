/* The global sampler shared by token shards (data.c) and image sets (images.c): training walks a
 * global sample index g = 0, 1, 2, ...; epoch = g / N, and the sample at g is perm_epoch(g % N),
 * a Fisher-Yates permutation driven by splitmix64 seeded by (seed, epoch) (identity without
 * shuffle). The current epoch's permutation is cached. */
#ifndef DT_SAMPLER_H
#define DT_SAMPLER_H

#include <stdint.h>

#include "status.h"

typedef struct {
  uint64_t n, seed;
  int shuffle;
  uint32_t *perm32; /* the cached permutation when N <= UINT32_MAX (halves the memory) */
  uint64_t *perm64; /* otherwise */
  uint64_t epoch;
  int valid;
} dt_sampler_t;

/* N = n >= 1 samples. DT_ERR_NOMEM naming `what` (a file or pattern) when the permutation does
 * not fit. */
dt_status_t dt_sampler_init(dt_sampler_t *s, uint64_t n, int shuffle, uint64_t seed, const char *what);
void dt_sampler_free(dt_sampler_t *s);
/* Sample id (0..N-1) at global index g. */
uint64_t dt_sampler_at(dt_sampler_t *s, uint64_t g);

/* splitmix64 (Steele, Lea, Flood 2014), the reference constants: the next output of *state. */
uint64_t dt_splitmix64(uint64_t *state);
/* Uniform in [0, bound), bound >= 1, without modulo bias. */
uint64_t dt_rand_below(uint64_t *state, uint64_t bound);

#endif
