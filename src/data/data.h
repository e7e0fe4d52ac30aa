/* Token shards in llm.c's format and the sampler that turns them into batches.
 * Shard: 256 int32 header (magic 20240520, version 1, token count, rest 0), then uint16 tokens,
 * all little-endian. A split is the sorted list of files matching a glob.
 * A sample s is the window of T+1 tokens starting at s*T within one shard (windows never cross a
 * shard; a shard of n tokens holds (n-1)/T samples, numbered on from the previous shard's). A
 * batch of B consecutive samples in one shard is exactly llm.c's "B*T+1 contiguous tokens".
 * Training walks a global sample index g = 0, 1, 2, ...: epoch = g / N, and the sample at g is
 * perm_epoch(g % N), a Fisher-Yates permutation driven by splitmix64 seeded by (seed, epoch)
 * (identity without shuffle). Each optimizer step consumes global_batch consecutive indices, so
 * the data position is one number that does not depend on the data-parallel size. */
#ifndef DT_DATA_H
#define DT_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
/* Unshuffled batch j as `dtrain eval` defines it: samples j*B ... j*B+B-1 in order. While those
 * samples lie in one shard (always for a single shard) that is the B*T+1 contiguous tokens
 * [j*B*T - o, j*B*T - o + B*T+1) of that shard, o = the shard's first sample * T. A batch that
 * reaches past a shard's last full window continues with the next shard's first window: the
 * shard's last (n-1)%T tokens (which form no window) are skipped and no window crosses files.
 * j must be < dt_data_num_sequential_batches(d, B), else DT_ERR_ARG. */
dt_status_t dt_data_batch_sequential(dt_data_t *d, uint64_t j, int B, int *inputs, int *targets);
/* Number of whole sequential batches: N / B (the last N % B samples are not used by eval). */
uint64_t dt_data_num_sequential_batches(const dt_data_t *d, int B);
/* Path of shard i (0 <= i < dt_data_num_shards), for messages. */
const char *dt_data_shard_path(const dt_data_t *d, int i);

/* Write a shard file (header + uint16 tokens; n <= INT32_MAX) atomically: a temporary file in
 * the same directory, fsync, rename, so an error never leaves a half-written shard at `path`. */
dt_status_t dt_data_write_shard(const char *path, const uint16_t *tokens, size_t n);

/* Read a whole shard (header checked as dt_data_open does) into a new array *tokens (free it). */
dt_status_t dt_data_read_shard(const char *path, uint16_t **tokens, uint64_t *n);

/* `dtrain prep`: byte-level tokenise text files (token = byte value, vocab 256) into shards of at
 * most shard_tokens tokens named PREFIX_val_000000.bin ... and PREFIX_train_000000.bin ...: the
 * first floor(val_fraction * total) bytes of the concatenated files go to val (no val shard if
 * that is 0), the rest to train. 0 <= val_fraction < 1, 1 <= shard_tokens <= INT32_MAX. Refuses
 * to run if PREFIX_{val,train}_*.bin files exist that this run would not overwrite (stale shards
 * would silently join the glob). Returns DT_OK or an error naming the file. */
dt_status_t dt_prep_text(const char *const *inputs, int n_inputs, const char *prefix, size_t shard_tokens,
                         double val_fraction);
#define DT_PREP_DEFAULT_SHARD_TOKENS 100000000 /* llm.c's shard size */
#define DT_PREP_DEFAULT_VAL_FRACTION 0.05
#define DT_PREP_DEFAULT_VOCAB "data/gpt2"          /* where scripts/get-data.sh puts GPT-2's files */
#define DT_PREP_DEFAULT_CHUNK_BYTES (1u << 20)

typedef struct {
  const char *vocab_dir; /* holds encoder.json and vocab.bpe */
  size_t shard_tokens;   /* 1..INT32_MAX */
  double val_fraction;   /* [0, 1) */
  int threads;           /* 0: OpenMP's default (OMP_NUM_THREADS or all cores) */
  size_t chunk_bytes;    /* text per parallel work item, 64 B..1 GiB */
} dt_prep_opts_t;

/* `dtrain prep --tokenizer gpt2` (src/data/prep_bpe.c): GPT-2 BPE tokens of the text files, each file
 * one document preceded by <|endoftext|>, into shards as dt_prep_text names them. Val holds the
 * tokens of the text up to the first place at or after byte floor(val_fraction * total bytes)
 * where the text can be cut without changing its tokens (dt_bpe_safe_split, or a file's end);
 * train the rest (it must not be empty). Streams the files (memory does not grow with them),
 * tokenises on o->threads threads; the shards appear only when everything succeeded (stale shards
 * refused as dt_prep_text does). A summary goes to log (if not NULL), progress every 10 s to
 * stderr. */
dt_status_t dt_prep_gpt2(const char *const *inputs, int n_inputs, const char *prefix, const dt_prep_opts_t *o,
                         FILE *log);
/* `dtrain prep --decode`: the text of the shards matching each glob (sorted) in turn, to out;
 * vocab_dir NULL: byte-level (every token must be < 256). */
dt_status_t dt_prep_decode(const char *const *globs, int n, const char *vocab_dir, FILE *out);

/* Internal, shared by prep.c and prep_bpe.c: the directory part of prefix must exist; refuse if a
 * PREFIX_<split>_*.bin exists with index >= n_new (it would join the split's glob). */
dt_status_t dt_prep__check_outdir(const char *prefix);
dt_status_t dt_prep__check_stale(const char *prefix, const char *split, int n_new);
/* `dtrain prep [options] OUTPREFIX FILE...` or `dtrain prep --decode SHARD...` with argv[0] = "prep";
 * prints a summary to stdout, errors to stderr. Returns the exit status: 0 ok, 2 usage, 1 failure. */
int dt_prep_main(int argc, char **argv);

#endif
