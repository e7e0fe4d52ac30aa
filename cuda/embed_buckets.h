/* Token buckets for a deterministic embedding backward on the GPU: the positions of a micro-batch
 * grouped by token with a counting sort (ascending position inside a token), so that one thread
 * per (token, channel) adds its positions' gradients in the order the CPU twin
 * (dt_encoder_backward: positions ascending) does. No atomics: the same bits on every run and on
 * both backends. Built on the host from the host copy of the inputs; plain C, header-only, tested
 * on the CPU by tests/test_cuda_launch.c. */
#ifndef DT_EMBED_BUCKETS_H
#define DT_EMBED_BUCKETS_H

#include <string.h>

typedef struct {
  int token; /* row of wte */
  int start; /* first index into order[] */
  int count; /* positions with this token */
} dt_embed_bucket_t;

/* inp (N) tokens in [0, V); count: V + 1 ints of scratch; order (N): positions grouped by token in
 * increasing token order, ascending inside a token; buckets: one per distinct token (at most
 * min(N, V)). Returns the number of buckets. */
static inline int dt_embed_buckets(const int *inp, int N, int V, int *count, int *order, dt_embed_bucket_t *buckets) {
  memset(count, 0, (size_t)(V + 1) * sizeof *count);
  for (int i = 0; i < N; i++) count[inp[i] + 1]++;
  int nb = 0;
  for (int v = 0; v < V; v++) { /* count[v + 1] -> bucket of token v; count[v] becomes its start */
    if (count[v + 1] > 0) {
      buckets[nb].token = v;
      buckets[nb].start = count[v];
      buckets[nb].count = count[v + 1];
      nb++;
    }
    count[v + 1] += count[v];
  }
  for (int i = 0; i < N; i++) order[count[inp[i]]++] = i; /* stable: positions stay ascending */
  return nb;
}

#endif
