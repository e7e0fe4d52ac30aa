/* ZeRO shard arithmetic (zero.h): dp equal shards of whole 16-float units that tile the padded
 * arena exactly, the padding less than one unit per rank; the staging pieces a bucket's size, capped
 * by the shard; a failed block gather reaches the layer hook's caller. The collectives themselves: tests/test_zero_mpi.c. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "model.h"
#include "zero.h"

Test(zero, shards_tile_the_padded_arena) {
  const size_t ns[] = {1, 15, 16, 17, 1000, 4096, 124475904, 124475904 + 48};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
    for (int dp = 1; dp <= 8; dp++) {
      size_t next = 0, padded0 = 0;
      for (int r = 0; r < dp; r++) {
        size_t padded, lo, hi;
        dt_zero_split(ns[i], dp, r, DT_ALIGN, &padded, &lo, &hi);
        if (r == 0) padded0 = padded;
        cr_assert_eq(padded, padded0, "every rank computes the same padded size");
        cr_assert_eq(lo, next, "n=%zu dp=%d rank %d: shards are contiguous", ns[i], dp, r);
        cr_assert_eq((hi - lo) % DT_ALIGN, 0, "whole alignment units");
        cr_assert_eq(hi - lo, padded / (size_t)dp, "equal shards");
        next = hi;
      }
      cr_assert_eq(next, padded0, "the shards cover the padded arena");
      cr_assert(padded0 >= ns[i] && padded0 - ns[i] < (size_t)DT_ALIGN * (size_t)dp, "n=%zu dp=%d: padding %zu", ns[i],
                dp, padded0 - ns[i]);
    }
}

/* A fake 2-rank communicator (this is rank 0) whose nonblocking broadcasts from rank 1 fail when
 * waited for: the ZeRO-3 hook must return that failure, not run the block on half its weights. */
struct dt_comm_req {
  int root;
};
static struct dt_comm_req reqs[2];
static int waited;
static dt_status_t f_bcast(dt_comm_t *c, void *buf, size_t n, dt_dtype_t t, int root, void *st, dt_comm_req_t **r) {
  (void)c, (void)buf, (void)n, (void)t, (void)st;
  if (r) reqs[root].root = root, *r = &reqs[root];
  return DT_OK;
}
static dt_status_t f_wait(dt_comm_t *c, dt_comm_req_t *r) {
  (void)c;
  waited++;
  return r->root == 1 ? DT_ERR(DT_ERR_MPI, "fake: broadcast from rank 1 failed") : DT_OK;
}

Test(zero, a_failed_block_gather_is_the_hooks_result) {
  const dt_comm_ops_t ops = {.name = "fake", .broadcast = f_bcast, .wait = f_wait};
  dt_comm_t c = {.ops = &ops, .size = 2, .rank = 0};
  dt_zero_t z;
  cr_assert_eq(dt_zero_init(&z, 3, &c, 0, 64, 1 << 20), DT_OK);
  float *params = calloc(64, sizeof *params);
  const size_t grp[] = {0, 8, 40, 64, 64}; /* one block [8, 40) across both shards */
  cr_assert_eq(dt_zero3_attach(&z, params, grp, 2), DT_OK);
  cr_assert_eq(dt_zero3_hook(&z, 0, DT_HOOK_FWD), DT_ERR_MPI, "the failed wait is returned");
  cr_assert_eq(waited, 2, "both owners' broadcasts completed");
  dt_zero_free(&z);
  cr_assert(z.req == NULL && z.nreq == 0);
  dt_zero_free(&z); /* a second free: nothing left to free or wait for */
  free(params);
}

/* Stages 1-2 on host arenas move each shard in rounds of piece = bucket_bytes / 4 / dp floats per
 * rank (at least 1, at most the shard) through a dp * piece staging buffer; freeing twice is safe. */
Test(zero, staging_pieces_are_bucket_sized) {
  const dt_comm_ops_t ops = {.name = "fake"};
  dt_comm_t c = {.ops = &ops, .size = 2, .rank = 1};
  const struct { size_t bucket, piece; } cases[] = {{1024, 128}, {1, 1}, {8, 1}, {16, 2}, {1 << 20, 2048}, {16384, 2048}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dt_zero_t z;
    cr_assert_eq(dt_zero_init(&z, 1, &c, 1, 4096, cases[i].bucket), DT_OK);
    cr_assert_eq(z.shard, 2048);
    cr_assert_eq(z.lo, 2048, "rank 1's shard starts at the middle");
    cr_assert_eq(z.piece, cases[i].piece, "bucket %zu bytes: piece %zu floats, want %zu", cases[i].bucket, z.piece,
                 cases[i].piece);
    cr_assert_not_null(z.stage_buf);
    dt_zero_free(&z);
    cr_assert_null(z.stage_buf);
    dt_zero_free(&z); /* a second free: nothing left to free */
  }
  dt_zero_t z;
  cr_assert_eq(dt_zero_init(&z, 4, &c, 1, 4096, 1024), DT_ERR_UNSUPPORTED, "there is no ZeRO stage 4");
}

/* ZeRO-3's prefetch: each block's hook brings that block (if not prefetched) and starts the next
 * block of the pass, never past the last block forward or before the first backward (the
 * embeddings and ln_f are pinned, gathered once outside the hooks). A fake 2-rank communicator
 * records every broadcast: offset in the arena, count, root. */
static struct { size_t off, n; int root; } bc[16];
static int n_bc;
static float *bc_base;
static dt_status_t r_bcast(dt_comm_t *c, void *buf, size_t n, dt_dtype_t t, int root, void *st, dt_comm_req_t **r) {
  (void)c, (void)t, (void)st;
  if (n_bc < 16) bc[n_bc].off = (size_t)((float *)buf - bc_base), bc[n_bc].n = n, bc[n_bc].root = root;
  n_bc++;
  if (r) reqs[root].root = 0, *r = &reqs[root];
  return DT_OK;
}
static dt_status_t r_wait(dt_comm_t *c, dt_comm_req_t *r) {
  (void)c, (void)r;
  return DT_OK;
}

static const dt_comm_ops_t fake_ops = {.name = "fake", .broadcast = r_bcast, .wait = r_wait};
/* L = 2: embeddings [0, 8), block 0 [8, 24), block 1 [24, 40) across the shards [0, 32) and [32, 64), ln_f [40, 64) */
static const size_t fake_grp[] = {0, 8, 24, 40, 64};

/* Stage 3 over an arena of 64 floats (bc_base, fresh) as rank 0 of the fake 2-rank communicator c,
 * no broadcast recorded yet. */
static void fake_zero3(dt_zero_t *z, dt_comm_t *c) {
  *c = (dt_comm_t){.ops = &fake_ops, .size = 2, .rank = 0};
  cr_assert_eq(dt_zero_init(z, 3, c, 0, 64, 1 << 20), DT_OK);
  bc_base = calloc(64, sizeof(float));
  cr_assert_eq(dt_zero3_attach(z, bc_base, fake_grp, 2), DT_OK);
  n_bc = 0;
}

Test(zero, zero3_prefetches_the_next_block_of_the_pass_only) {
  dt_comm_t c;
  dt_zero_t z;
  fake_zero3(&z, &c);
  cr_assert_eq(dt_zero3_hook(&z, 0, DT_HOOK_FWD), DT_OK); /* block 0 now, block 1 prefetched */
  cr_assert_eq(dt_zero3_hook(&z, 1, DT_HOOK_FWD), DT_OK); /* nothing after the last block */
  cr_assert_eq(dt_zero3_hook(&z, 1, DT_HOOK_BWD), DT_OK); /* block 1 again (released after forward), block 0 next */
  cr_assert_eq(dt_zero3_hook(&z, 0, DT_HOOK_BWD), DT_OK); /* nothing before the first block */
  const struct { size_t off, n; int root; } want[] = {{8, 16, 0}, {24, 8, 0}, {32, 8, 1},
                                                     {24, 8, 0}, {32, 8, 1}, {8, 16, 0}};
  const int nw = (int)(sizeof want / sizeof want[0]);
  cr_assert_eq(n_bc, nw, "%d broadcasts, want %d", n_bc, nw);
  for (int i = 0; i < nw; i++)
    cr_assert(bc[i].off == want[i].off && bc[i].n == want[i].n && bc[i].root == want[i].root,
              "broadcast %d: [%zu, +%zu) from rank %d, want [%zu, +%zu) from rank %d", i, bc[i].off, bc[i].n, bc[i].root,
              want[i].off, want[i].n, want[i].root);
  dt_zero_free(&z);
  free(bc_base);
}

/* The image classifiers' bound (dt_zero3_bound): the hook serves only the first `blocks` blocks
 * (no prefetch past them), and a release never drops the arena from `keep` on (the batch-norm
 * running statistics every rank keeps whole). */
Test(zero, zero3_bound_stops_prefetch_and_keeps_the_tail) {
  dt_comm_t c;
  dt_zero_t z;
  fake_zero3(&z, &c);
  dt_zero3_bound(&z, 1, 40); /* block 1 ([24, 40)) and the tail [40, 64) are not the hook's */
  cr_assert_eq(dt_zero3_hook(&z, 0, DT_HOOK_FWD), DT_OK);
  cr_assert_eq(n_bc, 1, "block 0 only, no prefetch of block 1: %d broadcasts", n_bc);
  cr_assert(bc[0].off == 8 && bc[0].n == 16 && bc[0].root == 0);
  for (int i = 0; i < 64; i++) bc_base[i] = 7;
  cr_assert_eq(dt_zero3_release(&z, 0, 64), DT_OK); /* rank 0's shard is [0, 32) */
  for (int i = 0; i < 64; i++)
    cr_assert_eq(bc_base[i], i >= 32 && i < 40 ? 0.0f : 7.0f, "element %d: %g", i, bc_base[i]);
  dt_zero_free(&z);
  free(bc_base);
}
