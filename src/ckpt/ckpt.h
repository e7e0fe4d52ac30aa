/* Checkpoints: one parallel-HDF5 file per save, written collectively, holding the parameters and
 * AdamW moments at their global Hugging Face GPT2 shapes, the training state and a CRC32C per
 * dataset; committed atomically (tmp file, fsync, rename, fsync dir). File format and commit
 * protocol: docs/checkpoint-format.md. save/write/load/find functions are collective over
 * `mpi_comm` (a pointer to an MPI_Comm, as in comm.h; NULL = MPI_COMM_WORLD) and return the same
 * status on every rank (a failure on one rank is agreed on with MPI_Allreduce, its message
 * broadcast as "rank R: ..."). */
#ifndef DT_CKPT_H
#define DT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_CKPT_FORMAT_VERSION 1
#define DT_CKPT_RNG_MAX 64 /* uint64 words of RNG state */

/* Training state stored beside the tensors. Save takes it from rank 0. */
typedef struct {
  int64_t step;               /* optimizer steps completed */
  int64_t tokens;             /* tokens seen */
  int64_t data_pos;           /* data position: next global sample index */
  int64_t epoch;
  uint64_t seed;
  int n_rng;                  /* words used in rng (0..DT_CKPT_RNG_MAX) */
  uint64_t rng[DT_CKPT_RNG_MAX];
  double loss_scale;          /* mixed-precision loss scale (1 = none) */
  int64_t loss_scale_growth;  /* fp16: consecutive unskipped steps since the last overflow or growth */
  int64_t skipped_steps;      /* optimizer updates skipped for inf/NaN gradients (fp16); AdamW's
                                 step count is step - skipped_steps (absent in older files: 0) */
  int dp, tp, pp;             /* parallel layout that wrote it */
  const char *ini;            /* save: effective ini text (NULL = ""); load: malloc'd, free with dt_ckpt_state_free */
  char version[64];           /* save: ignored, PACKAGE_VERSION is stored; load: the writer's version */
  int world;                  /* load: number of ranks that wrote it */
  dt_dims_t dims;             /* load: model dimensions that wrote it (L, NH, C, V, T; Vp unused) */
} dt_ckpt_state_t;

void dt_ckpt_state_free(dt_ckpt_state_t *st); /* frees ini */

/* A box of one global tensor that a rank holds: rows [row0, row1) x cols [col0, col1) of the
 * tensor in OUR storage (rows, cols) (see model.h; 1-D tensors have rows = 1, so row0 = 0,
 * row1 = 1; wte rows stop at the true vocab V). Element (r, c) of the box lives at
 * local[off + (r - row0) * ld + (c - col0)] of the rank's local buffer. */
typedef struct {
  int tensor;            /* index into lay->tensors */
  int row0, row1, col0, col1;
  size_t off, ld;        /* in floats */
} dt_ckpt_range_t;

/* What a rank holds of a set of tensors. full = 1: every tensor whole at its arena offset in a
 * full arena (pure data parallelism; save then writes 1/P of each tensor from each rank, load
 * fills everything and zeroes the padded vocab rows). full = 0: exactly the n boxes in r (tp, pp
 * or ZeRO shards); on save the boxes of all ranks must tile every tensor exactly once (checked),
 * on load each rank gets its boxes (they may overlap between ranks) and nothing else is touched. */
typedef struct {
  int full;
  int n;
  dt_ckpt_range_t *r;
} dt_ckpt_ranges_t;

/* A rank's buffers: params (model ranges) and AdamW moments m, v (optim ranges; both NULL =
 * no optimizer state: save writes no /optim, load does not read it). */
typedef struct {
  float *params, *m, *v;
  dt_ckpt_ranges_t model, optim;
} dt_ckpt_arenas_t;

/* Full arenas (data parallelism): model.full = optim.full = 1. m, v may be NULL. */
dt_ckpt_arenas_t dt_ckpt_arenas_full(float *params, float *m, float *v);
/* Append to rs (full = 0) the boxes covering arena floats [begin, end) of the layout, skipping
 * alignment padding and padded vocab rows; local offsets are relative to `begin` (a ZeRO shard
 * buffer holding arena[begin..end)). A row or column range of one tensor is one
 * dt_ckpt_ranges_add box. */
dt_status_t dt_ckpt_ranges_add_flat(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, size_t begin, size_t end);
/* Append to rs (full = 0) the boxes of a tensor-parallel shard and/or pipeline stage layout
 * (dt_layout_init_mp): one box per block of every split tensor (c_attn: 3), with with_replicated
 * the whole replicated tensors too (save: tp rank 0 of the first dp replica only, so the boxes
 * tile each tensor once; load: every rank), and with with_tied the last stage's copy of wte (load;
 * on save the first stage writes wte). Tensors of other stages are skipped. Local offsets are
 * arena offsets of lay. */
dt_status_t dt_ckpt_ranges_add_shards(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, int with_replicated,
                                      int with_tied);
/* Append to rs the parts of the boxes of `in` that lie in local arena floats [begin, end), with
 * local offsets relative to `begin` (ZeRO shards of a tensor-parallel arena: m, v hold only
 * [begin, end) of the rank's tp shard). A box row cut by a bound becomes its own box. */
dt_status_t dt_ckpt_ranges_clip(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, const dt_ckpt_ranges_t *in,
                                size_t begin, size_t end);
/* Append one box (bounds checked against the layout). */
dt_status_t dt_ckpt_ranges_add(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, dt_ckpt_range_t r);
void dt_ckpt_ranges_free(dt_ckpt_ranges_t *rs);

/* Write a checkpoint of `st->step` into dir (created if missing) and commit it as
 * dir/ckpt_<step %08>.h5, update dir/latest, then delete all but the newest `keep` checkpoints
 * (keep <= 0: keep all). path (if not NULL) receives the committed file name. */
dt_status_t dt_ckpt_save(const void *mpi_comm, const char *dir, int keep, const dt_layout_t *lay,
                         const dt_ckpt_arenas_t *a, const dt_ckpt_state_t *st, char *path, size_t path_size);
/* Write a checkpoint file at exactly `path` with no commit protocol (save uses it on the tmp name). */
dt_status_t dt_ckpt_write(const void *mpi_comm, const char *path, const dt_layout_t *lay,
                          const dt_ckpt_arenas_t *a, const dt_ckpt_state_t *st);
/* Read a checkpoint: completion marker, format, shapes against lay, every CRC32C, then the
 * tensors into a and the state into st (st may be NULL). Each byte is read once per node through
 * a shared window (docs/checkpoint-format.md, "Reading"), and every rank copies its ranges from
 * there. On failure the buffers' contents are unspecified. */
dt_status_t dt_ckpt_load(const void *mpi_comm, const char *path, const dt_layout_t *lay,
                         const dt_ckpt_arenas_t *a, dt_ckpt_state_t *st);
/* Newest checkpoint in dir (largest step among ckpt_<digits>.h5; `latest` is not trusted) that
 * opens and carries the completion marker and format version; others are reported on stderr by
 * rank 0 with the reason and skipped. `before_step` >= 0 only considers steps < before_step.
 * DT_ERR_CKPT "no complete checkpoint" if none (also when dir does not exist); other codes are
 * real errors (e.g. an unreadable directory). */
dt_status_t dt_ckpt_find_latest(const void *mpi_comm, const char *dir, int64_t before_step, char *path,
                                 size_t path_size, int64_t *step);
/* find_latest + load, falling back to older checkpoints when a load fails (e.g. a checksum
 * mismatch; reported on stderr by rank 0). path receives the file used. Shape mismatches with
 * the model are not skipped: they are returned at once (a config error, not a bad file).
 * DT_ERR_CKPT only when there is no checkpoint at all; DT_ERR_IO when there were some and every one
 * was rejected (the arenas may then hold parts of a rejected file). */
dt_status_t dt_ckpt_load_latest(const void *mpi_comm, const char *dir, const dt_layout_t *lay,
                                const dt_ckpt_arenas_t *a, dt_ckpt_state_t *st, char *path, size_t path_size);

/* Test hook: make rank `rank` fail locally at `phase` ("open", "write", "commit", "read";
 * NULL = off), to check that the other ranks return the error instead of hanging. */
void dt_ckpt__fault(int rank, const char *phase);

#ifdef __cplusplus
}
#endif
#endif
