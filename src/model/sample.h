/* Choosing the next token from logits (dtrain generate): greedy at temperature 0, else a draw
 * from softmax(logits / temperature) restricted to the top_k largest logits (0 = all), with the
 * model's seeded RNG (model.h), so a seed gives the same tokens on every run and every rank. */
#ifndef DT_SAMPLE_H
#define DT_SAMPLE_H

#include "model.h"

/* The index of the largest of logits[0..V) (the lowest index among equals). */
int dt_sample_argmax(const float *logits, int V);
/* A token from logits[0..V); scratch: V floats + V ints (see dt_sample_scratch_bytes). */
int dt_sample(const float *logits, int V, float temperature, int top_k, dt_rng_t *rng, void *scratch);
size_t dt_sample_scratch_bytes(int V);

#endif
