/* The checkpoint tests' fixture (tests/test_ckpt.c, tests/test_ckpt_damage.c): a GPT-2 layout
 * built by hand from model.h's documented order (model.c is not the checkpoint module's), its
 * deterministic contents, exact in float32: param(t, r, c) = t + (r*cols + c)/65536 + 32*(step%4),
 * m = -param, v = param/4, and the collective checks every scenario uses. */
#ifndef DT_TEST_CKPT_FIXTURE_H
#define DT_TEST_CKPT_FIXTURE_H

#include <stdio.h>

#include "ckpt.h"

extern int rank, size, fails; /* MPI_COMM_WORLD's; failed checks on this rank */

#define CHECK(cond, ...)                                                                                               \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      fails++;                                                                                                         \
      fprintf(stderr, "FAIL rank %d line %d: ", rank, __LINE__);                                                       \
      fprintf(stderr, __VA_ARGS__);                                                                                    \
      fprintf(stderr, "\n");                                                                                           \
    }                                                                                                                  \
  } while (0)

typedef struct {
  float *p, *m, *v;
} bufs_t;

/* one tensor appended at *off (DT_ALIGN-padded) */
void add_t(dt_layout_t *lay, size_t *off, const char *name, int rows, int cols, int ndim, int layer);
/* GPT-2's tensors for L layers, NH heads, width C, vocabulary V (padded to 128), context T */
void layout(dt_layout_t *lay, int L, int NH, int C, int V, int T);
/* the contents of `step` (padding NaN, padded vocab rows 0) */
void fill(const dt_layout_t *lay, float *p, float *m, float *v, long step);
/* the trainer state saved with `step`'s contents */
dt_ckpt_state_t mkstate(long step);
/* arenas against the fill of `step` (m NULL: the parameters only): mismatches over all ranks */
long compare(const dt_layout_t *lay, const float *p, const float *m, const float *v, long step);
void check_state(const dt_ckpt_state_t *g, long step);
bufs_t bufs(const dt_layout_t *lay);
void garbage(const dt_layout_t *lay, bufs_t *b);
/* 1 when every rank got `want` */
int all_agree(dt_status_t st, dt_status_t want);
/* save the fill of `step` into dir (keep: as checkpoint.keep); path gets the file's name */
dt_status_t save_step(const char *dir, int keep, const dt_layout_t *lay, long step, char *path);
/* load the newest valid checkpoint of dir and expect the fill of `step` */
void load_expect(const char *dir, const dt_layout_t *lay, long step, const char *what);

/* tests/test_ckpt_damage.c: damaged files, faults on one rank, MPI errors */
void test_damage(const char *dir, const dt_layout_t *lay);
void test_refusals(const char *dir, const dt_layout_t *lay);
void test_faults(const char *dir, const dt_layout_t *lay);
void test_mpi_error(const char *dir, const dt_layout_t *lay);

#endif
