/* Token sampling (sample.h). Top-k keeps the k largest logits (ties broken by the lower index, so
 * the set is deterministic); the probabilities are exp((z - max) / temperature) in double and one
 * uniform draw walks their cumulative sum in index order. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int dt_sample_argmax(const float *logits, int V) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (logits[v] > logits[best]) best = v;
  return best;
}

size_t dt_sample_scratch_bytes(int V) { return (size_t)V * (sizeof(double) + sizeof(int)); }

/* Larger logit first, then lower index: a total order, so the top k are always the same set. */
static int by_logit_desc(const void *pa, const void *pb, void *ctx) {
  const float *z = ctx;
  const int a = *(const int *)pa, b = *(const int *)pb;
  if (z[a] != z[b]) return z[a] > z[b] ? -1 : 1;
  return (a > b) - (a < b);
}

static int by_index(const void *pa, const void *pb) {
  const int a = *(const int *)pa, b = *(const int *)pb;
  return (a > b) - (a < b);
}

int dt_sample(const float *logits, int V, float temperature, int top_k, dt_rng_t *rng, void *scratch) {
  if (temperature <= 0.0f || top_k == 1) return dt_sample_argmax(logits, V);
  double *p = scratch;
  int *idx = (int *)(p + V), n = V;
  for (int v = 0; v < V; v++) idx[v] = v;
  if (top_k > 0 && top_k < V) { /* the k largest, in index order afterwards */
    qsort_r(idx, (size_t)V, sizeof *idx, by_logit_desc, (void *)logits);
    n = top_k;
    qsort(idx, (size_t)n, sizeof *idx, by_index);
  }
  float mx = logits[idx[0]];
  for (int i = 1; i < n; i++) mx = logits[idx[i]] > mx ? logits[idx[i]] : mx;
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += p[i] = exp(((double)logits[idx[i]] - mx) / temperature);
  double u = dt_rng_uniform(rng) * sum, c = 0.0;
  for (int i = 0; i < n; i++) {
    c += p[i];
    if (u < c) return idx[i];
  }
  return idx[n - 1]; /* u rounded up to the sum */
}
