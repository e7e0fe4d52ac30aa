/* Token shards in llm.c's format and the sampler that turns them into batches.
 * Shard: 256 int32 header (magic 20240520, version 1, token count, rest 0), then uint16 tokens.
 * A sample s is the window of T+1 tokens starting at s*T within one shard (windows never cross a
 * shard). A batch of B consecutive samples is exactly llm.c's "B*T+1 contiguous tokens".
 * Training walks a global sample index g = 0, 1, 2, ...: epoch = g / N, and the sample at g is
 * perm_epoch(g % N), a permutation seeded by (seed, epoch) (identity without shuffle). Each
 * optimizer step consumes global_batch consecutive indices, so the data position is one number
 * that does not depend on the data-parallel size. */
#ifndef DT_DATA_H
#define DT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define DT_SHARD_MAGIC 20240520
#define DT_SHARD_VERSION 1
#define DT_SHARD_HEADER_INTS 256

typedef struct dt_data dt_data_t;

/* Open every shard matching `glob_pattern` (sorted by name), validate headers, sizes and that
 * every token < vocab_size; T is the sequence length. Errors name the file. */
dt_status_t dt_data_open(dt_data_t **out, const char *glob_pattern, int vocab_size, int T, int shuffle,
                         uint64_t seed);
void dt_data_close(dt_data_t *d);
/* Number of samples N (windows of T+1) over all shards. */
uint64_t dt_data_num_samples(const dt_data_t *d);
uint64_t dt_data_num_tokens(const dt_data_t *d);
int dt_data_num_shards(const dt_data_t *d);
/* Sample id (0..N-1) at global index g (applies the epoch's permutation). */
uint64_t dt_data_sample_at(dt_data_t *d, uint64_t g);
/* Fill inputs/targets (B, T) int32 with the samples at global indices g0, g0+1, ..., g0+B-1. */
dt_status_t dt_data_batch(dt_data_t *d, uint64_t g0, int B, int *inputs, int *targets);
/* Unshuffled contiguous batch j as `dtrain eval` defines it: tokens [j*B*T, j*B*T+B*T+1) of the
 * concatenated shards' samples, i.e. samples j*B ... j*B+B-1 in order. */
dt_status_t dt_data_batch_sequential(dt_data_t *d, uint64_t j, int B, int *inputs, int *targets);

/* Write a shard file (header + uint16 tokens). Tokens must be < 65536. */
dt_status_t dt_data_write_shard(const char *path, const uint16_t *tokens, size_t n);

/* `dtrain prep`: byte-level tokenise UTF-8 text files into shards of at most shard_tokens tokens
 * named PREFIX_train_000000.bin ... and PREFIX_val_000000.bin (the first val_fraction of tokens
 * of the concatenated text go to val). Returns DT_OK or an error naming the file. */
dt_status_t dt_prep_text(const char *const *inputs, int n_inputs, const char *prefix, size_t shard_tokens,
                         double val_fraction);

#endif
