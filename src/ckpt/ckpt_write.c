/* Checkpoint write: every rank packs its boxes of each tensor in file order (the arena's layout is
 * the file's, Hugging Face's) and joins one collective H5Dwrite per dataset; the per-rank CRC32C
 * runs are tiled and combined on rank 0 into each dataset's checksum; state and the completion
 * marker come last. */
#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_int.h"
#include "fault.h"
#include "crc32c.h"
#include "dt_build.h"
#include "timer.h"
#include "watchdog.h"

int dt_ckpt__segs_add(segs_t *g, uint64_t ds, uint64_t off, const void *data, uint64_t len) {
  if (g->n && g->s[g->n - 1].ds == ds && g->s[g->n - 1].off + g->s[g->n - 1].len == off) {
    seg_t *l = &g->s[g->n - 1]; /* continues the previous run: extend its CRC */
    l->crc = dt_crc32c(l->crc, data, len);
    l->len += len;
    return 0;
  }
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 256;
    seg_t *s = realloc(g->s, cap * sizeof *s);
    if (!s) return -1;
    g->s = s, g->cap = cap;
  }
  g->s[g->n++] = (seg_t){ds, off, len, dt_crc32c(0, data, len), 0};
  return 0;
}

static int seg_cmp(const void *a, const void *b) {
  const seg_t *x = a, *y = b;
  if (x->ds != y->ds) return x->ds < y->ds ? -1 : 1;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Save: boxes of one rank must not overlap (overlaps between ranks are found by the CRC tiling). */
static dt_status_t check_disjoint(const dt_layout_t *lay, const dt_ckpt_ranges_t *rs, const char *what) {
  for (int i = 0; i < rs->n; i++)
    for (int k = i + 1; k < rs->n; k++) {
      const dt_ckpt_range_t *x = &rs->r[i], *y = &rs->r[k];
      if (x->tensor == y->tensor && x->row0 < y->row1 && y->row0 < x->row1 && x->col0 < y->col1 && y->col0 < x->col1)
        return DT_ERR(DT_ERR_ARG, "checkpoint save: %s ranges %d and %d of %s overlap", what, i, k,
                      lay->tensors[x->tensor].name);
    }
  return DT_OK;
}

/* Create a small dataset (rank-0 data; n elements, scalar if n == 0 and scalar != 0) with its CRC. */
static dt_status_t put_small(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int scalar, hsize_t n,
                             const void *data, size_t nbytes, int rank, hid_t dxpl, const char *path) {
  hid_t sp = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, NULL);
  hid_t d = H5Dcreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  herr_t e = d < 0 ? -1 : 0;
  if (e == 0 && (scalar || n > 0)) {
    if (rank != 0) H5Sselect_none(sp);
    e = H5Dwrite(d, mtype, sp, sp, dxpl, data);
  }
  uint32_t crc = dt_crc32c(0, data, nbytes);
  if (e == 0) e = dt_ckpt__attr_put(d, "crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp);
  return e < 0 ? dt_ckpt__h5err(path, name, "cannot write state dataset") : DT_OK;
}

/* ---- write -------------------------------------------------------------------------------- */

/* Rank 0's state (and ini text) on every rank. */
static dt_status_t state_bcast(MPI_Comm comm, int rank, const dt_ckpt_state_t *in, dt_ckpt_state_t *s, char **ini) {
  long long n = 0;
  memset(s, 0, sizeof *s);
  if (rank == 0 && in) {
    *s = *in;
    n = in->ini ? (long long)strlen(in->ini) : 0;
  }
  int ok = rank != 0 || in != NULL;
  DT_MPI_CHECK(dt_wd_bcast(&ok, 1, MPI_INT, 0, comm, "bcast (checkpoint save)"));
  DT_MPI_CHECK(dt_wd_bcast(s, (int)sizeof *s, MPI_BYTE, 0, comm, "bcast (checkpoint save)"));
  DT_MPI_CHECK(dt_wd_bcast(&n, 1, MPI_LONG_LONG, 0, comm, "bcast (checkpoint save)"));
  s->ini = NULL;
  if (n >= INT_MAX) return DT_ERR(DT_ERR_ARG, "checkpoint save: ini text too long (%lld bytes)", n);
  *ini = malloc((size_t)n + 1);
  if (!*ini) return DT_ERR(DT_ERR_NOMEM, "checkpoint save: out of memory");
  if (rank == 0) memcpy(*ini, n ? in->ini : "", (size_t)n + 1);
  DT_MPI_CHECK(dt_wd_bcast(*ini, (int)n + 1, MPI_CHAR, 0, comm, "bcast (checkpoint save)"));
  if (!ok) return DT_ERR(DT_ERR_ARG, "checkpoint save: rank 0 passed no training state");
  if (s->n_rng < 0 || s->n_rng > DT_CKPT_RNG_MAX)
    return DT_ERR(DT_ERR_ARG, "checkpoint save: n_rng %d outside [0, %d]", s->n_rng, DT_CKPT_RNG_MAX);
  return DT_OK;
}

static dt_status_t write_state(hid_t file, const dt_ckpt_state_t *s, const char *ini, int size, int rank,
                               const dt_layout_t *lay, hid_t dxpl, const char *path) {
  hid_t g = H5Gcreate2(file, "/state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) return dt_ckpt__h5err(path, "/state", "cannot create group");
  struct { const char *k; const void *v; hid_t ft, mt; } at[] = {
      {"step", &s->step, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"tokens", &s->tokens, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"data_pos", &s->data_pos, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"epoch", &s->epoch, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"seed", &s->seed, H5T_STD_U64LE, H5T_NATIVE_UINT64},
      {"loss_scale", &s->loss_scale, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE},
      {"loss_scale_growth", &s->loss_scale_growth, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"skipped_steps", &s->skipped_steps, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"dp", &s->dp, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"tp", &s->tp, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"pp", &s->pp, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"world", &size, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"n_layer", &lay->d.L, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"n_head", &lay->d.NH, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"n_embd", &lay->d.C, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"vocab_size", &lay->d.V, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"seq_len", &lay->d.T, H5T_STD_I32LE, H5T_NATIVE_INT},
  };
  dt_status_t st = DT_OK;
  for (size_t i = 0; i < sizeof at / sizeof at[0] && st == DT_OK; i++)
    if (dt_ckpt__attr_put(g, at[i].k, at[i].ft, at[i].mt, at[i].v) < 0) st = dt_ckpt__h5err(path, "/state", at[i].k);
  if (st == DT_OK)
    st = put_small(g, "rng", H5T_STD_U64LE, H5T_NATIVE_UINT64, 0, (hsize_t)s->n_rng, s->rng,
                   (size_t)s->n_rng * sizeof(uint64_t), rank, dxpl, path);
  if (st == DT_OK) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(ini) + 1);
    H5Tset_strpad(t, H5T_STR_NULLTERM);
    st = put_small(g, "config_ini", t, t, 1, 1, ini, strlen(ini) + 1, rank, dxpl, path);
    H5Tclose(t);
  }
  H5Gclose(g);
  return st;
}

/* One tensor's packing, run on a helper thread while the previous tensor is written (HDF5 is
 * not thread safe: no HDF5 call in here). */
typedef struct {
  fshape_t f;
  fbox_t *bx;         /* this rank's boxes of t, file coordinates */
  int nb;
  const float *local; /* the arena */
  float *stage;
  segs_t *segs;       /* CRC runs (one job at a time touches them) */
  uint64_t ds;
  hsize_t count;      /* out: floats to write */
  const float *buf;   /* out: what to hand to H5Dwrite */
  int failed;         /* out: out of memory */
} job_t;

/* 1 if the job's data is one contiguous run of the arena (written from there, no stage). */
static int direct(const job_t *j) {
  const fbox_t *x = &j->bx[0];
  return j->nb == 1 && (x->src->ld == x->c1 - x->c0 || x->r1 - x->r0 == 1);
}

/* Pack the boxes in file order and record CRC runs; a contiguous box is not copied. */
static int pack(job_t *j) {
  const fshape_t *f = &j->f;
  const fbox_t *bx = j->bx;
  float *stage = j->stage;
  hsize_t k = 0, rmin = (hsize_t)-1, rmax = 0;
  j->buf = stage;
  if (j->nb == 1) { /* the common case (full arenas, tensor shards): one box, block copies */
    const fbox_t *x = &bx[0];
    hsize_t nr = x->r1 - x->r0, w = x->c1 - x->c0;
    size_t ld = x->src->ld;
    const float *src = j->local + dt_ckpt__local_index(x, x->r0, x->c0);
    j->count = nr * w;
    if (direct(j)) j->buf = src;
    for (hsize_t q = 0; q < nr; q++) {
      const float *row = src + q * ld;
      if (j->buf == stage) row = memcpy(stage + q * w, row, w * sizeof(float));
      if (dt_ckpt__segs_add(j->segs, j->ds, ((x->r0 + q) * f->FC + x->c0) * sizeof(float), row, w * sizeof(float)) < 0) return -1;
    }
    return 0;
  }
  for (int b = 0; b < j->nb; b++) {
    if (bx[b].r0 < rmin) rmin = bx[b].r0;
    if (bx[b].r1 > rmax) rmax = bx[b].r1;
  }
  for (hsize_t i = rmin; j->nb && i < rmax; i++) /* several boxes (ZeRO flat slices): row by row */
    for (int b = 0; b < j->nb; b++) {
      const fbox_t *x = &bx[b];
      if (i < x->r0 || i >= x->r1) continue;
      float *dst = stage + k;
      memcpy(dst, j->local + dt_ckpt__local_index(x, i, x->c0), (x->c1 - x->c0) * sizeof(float));
      k += x->c1 - x->c0;
      if (dt_ckpt__segs_add(j->segs, j->ds, (i * f->FC + x->c0) * sizeof(float), dst, (x->c1 - x->c0) * sizeof(float)) < 0) return -1;
    }
  j->count = k;
  return 0;
}

static void *pack_thread(void *p) {
  job_t *j = p;
  j->failed = pack(j) < 0;
  return NULL;
}

/* Describe dataset d's job (no packing yet). */
static void job_init(job_t *j, const dt_layout_t *lay, const dt_ckpt_arenas_t *a, const dt_ckpt_ranges_t *rg, int d,
                     fbox_t *bx, float *stage, segs_t *segs, const int *own) {
  int ti = d % lay->n_tensors, gi = d / lay->n_tensors;
  *j = (job_t){.f = dt_ckpt__fshape(lay, &lay->tensors[ti]), .bx = bx,
               .nb = own && own[d] ? 0 : dt_ckpt__boxes_of(&rg[gi ? 1 : 0], ti, bx),
               .local = gi == 0 ? a->params : gi == 1 ? a->m : a->v, .stage = stage, .segs = segs, .ds = (uint64_t)d};
}

/* Start the kernel's write-back of the file's dirty pages without waiting for it (Linux
 * sync_file_range), so the disk works while we pack the next tensors and the final flush only
 * waits for the tail: without it the page cache holds all 1.5 GB until the fsync at the end
 * and the disk idles meanwhile. fd < 0 or another OS: nothing. */
static void start_writeback(int fd) {
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
  if (fd >= 0) (void)sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#else
  (void)fd;
#endif
}

/* Rank 0: check that the runs of each dataset tile it exactly, and combine their CRCs. */
static dt_status_t combine(seg_t *all, size_t n, const uint64_t *bytes, const char **names, int n_ds, uint32_t *crc,
                           const char *path) {
  qsort(all, n, sizeof *all, seg_cmp);
  size_t i = 0;
  for (int d = 0; d < n_ds; d++) {
    uint64_t at = 0, op_len = UINT64_MAX;
    uint32_t c = 0, op = 0;
    for (; i < n && all[i].ds == (uint64_t)d; i++) {
      if (all[i].off != at)
        return DT_ERR(DT_ERR_ARG, "%s: %s: the ranks' parts %s at byte %llu", path, names[d],
                      all[i].off < at ? "overlap" : "leave a gap", (unsigned long long)(all[i].off < at ? all[i].off : at));
      if (all[i].len != op_len) op = dt_crc32c_combine_op(op_len = all[i].len);
      c = at == 0 ? all[i].crc : dt_crc32c_combine_with(op, c, all[i].crc);
      at += all[i].len;
    }
    if (at != bytes[d])
      return DT_ERR(DT_ERR_ARG, "%s: %s: the ranks' parts leave a gap at byte %llu of %llu", path, names[d],
                    (unsigned long long)at, (unsigned long long)bytes[d]);
    crc[d] = c;
  }
  return DT_OK;
}

/* One save's state (write_file): what phase 1 plans, phase 2 creates, phase 4 writes. */
typedef struct {
  MPI_Comm comm;
  int world, rank, size, optim;
  const char *path;
  const dt_layout_t *lay;
  const dt_ckpt_arenas_t *a;
  dt_ckpt_state_t s; /* rank 0's, on every rank */
  char *ini;
  dt_ckpt_ranges_t rg[2];
  dsets_t D;
  hid_t fapl, dxpl, file;
  int full_all[2]; /* every rank passes whole (replicated) model / moment arenas */
  int own_ok;      /* large datasets of replicated arenas go through our own descriptors */
  int wb_fd;       /* our own descriptor of the file: start_writeback, and the own-descriptor writes */
  int dio_fd;      /* the same with O_DIRECT, -1 if the file system refuses it */
  int *own;        /* per dataset: written through our own descriptors (ckpt_own.c), not H5Dwrite */
  uint64_t *foff, n_direct;
  uint64_t unsynced; /* bytes this rank wrote since the last start_writeback */
  fbox_t *bx[2];     /* the boxes of the tensor being written and of the one being packed */
  float *stg[2];     /* their stage buffers (each the size of the largest tensor that needs staging) */
  job_t job[2];
  segs_t segs;
  seg_t *all; /* rank 0: every rank's CRC runs */
  uint32_t *crc;
  double t0, t_pack, t_h5, t_wb, t_cr;
} save_t;

/* Phase 1 (local): state from rank 0, ranges, dataset names. The agreed status. */
static dt_status_t save_plan(save_t *S, const dt_ckpt_state_t *st_in) {
  const dt_ckpt_arenas_t *a = S->a;
  dt_status_t st = state_bcast(S->comm, S->rank, st_in, &S->s, &S->ini);
  int omin, omax;
  S->optim = a->m != NULL;
  DT_MPI_KEEP(st, dt_wd_allreduce(&S->optim, &omin, 1, MPI_INT, MPI_MIN, S->comm, "allreduce (checkpoint save)"));
  DT_MPI_KEEP(st, dt_wd_allreduce(&S->optim, &omax, 1, MPI_INT, MPI_MAX, S->comm, "allreduce (checkpoint save)"));
  if (st == DT_OK && omin != omax) st = DT_ERR(DT_ERR_ARG, "%s: some ranks pass AdamW moments, others not", S->path);
  if (st == DT_OK && (a->m == NULL) != (a->v == NULL)) st = DT_ERR(DT_ERR_ARG, "%s: m and v must both be given", S->path);
  if (st == DT_OK) st = dt_ckpt__ranges_resolve(S->lay, &a->model, 1, S->rank, S->size, &S->rg[0]);
  if (st == DT_OK && S->optim) st = dt_ckpt__ranges_resolve(S->lay, &a->optim, 1, S->rank, S->size, &S->rg[1]);
  if (st == DT_OK) st = check_disjoint(S->lay, &S->rg[0], "model");
  if (st == DT_OK && S->optim) st = check_disjoint(S->lay, &S->rg[1], "optim");
  if (st == DT_OK) st = dt_ckpt__dsets_init(&S->D, S->lay, S->optim ? 3 : 1);
  if (st == DT_OK && dt_ckpt__faulty(S->comm, "open")) st = DT_ERR(DT_ERR_IO, "%s: simulated open failure (test hook)", S->path);
  return dt_ckpt__agree(S->comm, st);
}

/* Phase 2: the collective create, our own descriptors, which datasets take them. The agreed status. */
static dt_status_t save_create(save_t *S) {
  const char *path = S->path;
  dt_status_t st = DT_OK;
  dt_ckpt__mpio_plists(S->comm, &S->fapl, &S->dxpl);
  /* Replicated arenas on every rank: large datasets are written through our own descriptors
   * (dt_ckpt__write_own, ckpt_own.c), so their raw data must start on page boundaries. */
  S->full_all[0] = S->a->model.full, S->full_all[1] = !S->optim || S->a->optim.full;
  DT_MPI_KEEP(st, dt_wd_allreduce(MPI_IN_PLACE, S->full_all, 2, MPI_INT, MPI_MIN, S->comm, "allreduce (checkpoint save)"));
  S->own_ok = dt_ckpt__own_io() && (S->full_all[0] || S->full_all[1]);
  if (S->own_ok) H5Pset_alignment(S->fapl, DT_CKPT_OWN_MIN, DT_CKPT_ALIGN);
  S->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, S->fapl);
  if (S->file < 0) st = dt_ckpt__h5err(path, "/", "cannot create file");
  DT_TRY(dt_ckpt__agree(S->comm, st));
  S->wb_fd = open(path, O_WRONLY | O_CLOEXEC);
  if (S->own_ok) {
    S->dio_fd = dt_ckpt__open_direct(path, O_WRONLY); /* -1: plain writes */
    int have = S->wb_fd >= 0, all = 0; /* every rank needs a descriptor, else nobody takes the path */
    DT_MPI_KEEP(st, dt_wd_allreduce(&have, &all, 1, MPI_INT, MPI_MIN, S->comm, "allreduce (checkpoint save)"));
    S->own_ok = all;
  }
  S->own = calloc((size_t)S->D.n_ds, sizeof *S->own);
  S->foff = calloc((size_t)S->D.n_ds, sizeof *S->foff);
  if (!S->own || !S->foff) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  for (int d = 0; S->own && d < S->D.n_ds; d++)
    S->own[d] = S->own_ok && S->full_all[d >= S->lay->n_tensors] && S->D.bytes[d] >= DT_CKPT_OWN_MIN;
  return dt_ckpt__agree(S->comm, st);
}

/* Phase 3: groups, root attributes. The agreed status. */
static dt_status_t save_groups(save_t *S) {
  const char *grps[] = {"/model", "/optim", "/optim/exp_avg", "/optim/exp_avg_sq"};
  const int fmt = DT_CKPT_FORMAT_VERSION;
  dt_status_t st = DT_OK;
  for (int i = 0; i < (S->optim ? 4 : 1) && st == DT_OK; i++) {
    hid_t g = H5Gcreate2(S->file, grps[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) st = dt_ckpt__h5err(S->path, grps[i], "cannot create group");
    else H5Gclose(g);
  }
  if (st == DT_OK && (dt_ckpt__attr_put_str(S->file, "format", "dtrain-checkpoint") < 0 ||
                      dt_ckpt__attr_put(S->file, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT, &fmt) < 0 ||
                      dt_ckpt__attr_put_str(S->file, "dtrain_version", PACKAGE_VERSION) < 0))
    st = dt_ckpt__h5err(S->path, "/", "cannot write attributes");
  return dt_ckpt__agree(S->comm, st);
}

/* The boxes and the two stage buffers of phase 4. The agreed status. */
static dt_status_t save_stage(save_t *S) {
  int nbx = S->rg[0].n > S->rg[1].n ? S->rg[0].n : S->rg[1].n;
  S->bx[0] = malloc((size_t)nbx * sizeof(fbox_t) + 1), S->bx[1] = malloc((size_t)nbx * sizeof(fbox_t) + 1);
  size_t need = 1;
  for (int d = 0; S->bx[0] && d < S->D.n_ds; d++) {
    job_init(&S->job[0], S->lay, S->a, S->rg, d, S->bx[0], NULL, NULL, S->own);
    size_t n = 0;
    for (int b = 0; b < S->job[0].nb; b++) n += (size_t)((S->bx[0][b].r1 - S->bx[0][b].r0) * (S->bx[0][b].c1 - S->bx[0][b].c0));
    if (!direct(&S->job[0]) && n > need) need = n;
  }
  S->stg[0] = malloc(need * sizeof(float)), S->stg[1] = malloc(need * sizeof(float));
  dt_status_t st = DT_OK;
  if (!S->bx[0] || !S->bx[1] || !S->stg[0] || !S->stg[1]) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory for the staging buffers", S->path);
  return dt_ckpt__agree(S->comm, st);
}

/* Tensor d (packed already, in job[d & 1]): created, its boxes selected, written collectively
 * (H5Dwrite unless it goes through our own descriptors later) while tensor d + 1 is packed on a
 * helper thread. The agreed status. */
static dt_status_t save_tensor(save_t *S, int d, hid_t dcpl) {
  const char *path = S->path;
  dsets_t *D = &S->D;
  job_t *J = &S->job[d & 1], *N = &S->job[(d + 1) & 1];
  pthread_t th;
  int running = 0;
  dt_status_t st = DT_OK;
  if (d + 1 < D->n_ds) { /* start packing the next tensor */
    job_init(N, S->lay, S->a, S->rg, d + 1, S->bx[(d + 1) & 1], S->stg[(d + 1) & 1], &S->segs, S->own);
    running = pthread_create(&th, NULL, pack_thread, N) == 0;
    if (!running) pack_thread(N); /* no thread: pack it here, in order */
  }
  hid_t fsp = H5Screate_simple(J->f.ndim, J->f.dims, NULL), msp = -1;
  double tc = dt_time_now();
  D->ds[d] = H5Dcreate2(S->file, D->names[d], H5T_IEEE_F32LE, fsp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  S->t_cr += dt_time_now() - tc;
  if (D->ds[d] < 0) st = dt_ckpt__h5err(path, D->names[d], "cannot create dataset");
  else if (S->own[d] && (S->foff[d] = (uint64_t)H5Dget_offset(D->ds[d])) == (uint64_t)HADDR_UNDEF)
    st = dt_ckpt__h5err(path, D->names[d], "no file offset for the raw data");
  if (st == DT_OK && J->failed) st = DT_ERR(DT_ERR_NOMEM, "%s: %s: out of memory (checksum runs)", path, D->names[d]);
  for (int b = 0; st == DT_OK && b < J->nb; b++)
    if (dt_ckpt__select_box(fsp, &J->f, &J->bx[b], b == 0 ? H5S_SELECT_SET : H5S_SELECT_OR) < 0)
      st = dt_ckpt__h5err(path, D->names[d], "cannot select hyperslab");
  if (st == DT_OK) { /* local problems are agreed on before the collective write */
    hsize_t mc = J->count ? J->count : 1;
    msp = H5Screate_simple(1, &mc, NULL);
    if (!J->count) H5Sselect_none(msp), H5Sselect_none(fsp);
  }
  st = dt_ckpt__agree(S->comm, st);
  double tp = dt_time_now();
  if (st == DT_OK && !S->own[d] && H5Dwrite(D->ds[d], H5T_NATIVE_FLOAT, msp, fsp, S->dxpl, J->buf) < 0)
    st = dt_ckpt__h5err(path, D->names[d], "cannot write dataset");
  S->t_h5 += dt_time_now() - tp;
  tp = dt_time_now();
  if ((S->unsynced += J->count * sizeof(float)) >= (32u << 20)) start_writeback(S->wb_fd), S->unsynced = 0;
  S->t_wb += dt_time_now() - tp;
  if (st == DT_OK && dt_ckpt__faulty(S->comm, "write")) st = DT_ERR(DT_ERR_IO, "%s: %s: simulated write failure (test hook)", path, D->names[d]);
  if (d == D->n_ds / 2 && dt_fault("ckpt_kill", dt_err_rank(), -1)) /* test-only, fault.h */
    dt_fault_kill("rank %d: ckpt_kill: SIGKILL after writing dataset %d of %d of %s", dt_err_rank(), d + 1, D->n_ds,
                  path);
  if (msp >= 0) H5Sclose(msp);
  H5Sclose(fsp);
  tp = dt_time_now();
  if (running) pthread_join(th, NULL);
  S->t_pack += dt_time_now() - tp; /* waiting for the packer */
  return dt_ckpt__agree(S->comm, st);
}

/* Phase 4: tensors, one collective write each; tensor d + 1 is packed on a helper thread while d
 * is written (two stage buffers the size of the largest tensor that needs staging); then the
 * large ones of replicated arenas through our own descriptors. The agreed status. */
static dt_status_t save_tensors(save_t *S) {
  dt_status_t st = save_stage(S);
  if (st == DT_OK) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    job_init(&S->job[0], S->lay, S->a, S->rg, 0, S->bx[0], S->stg[0], &S->segs, S->own);
    double tp = dt_time_now();
    pack_thread(&S->job[0]);
    S->t_pack += dt_time_now() - tp;
    for (int d = 0; d < S->D.n_ds && st == DT_OK; d++) st = save_tensor(S, d, dcpl);
    H5Pclose(dcpl);
  }
  free(S->bx[0]), free(S->bx[1]), free(S->stg[1]); /* stg[0] stays until the end, as it always did */
  S->bx[0] = S->bx[1] = NULL, S->stg[1] = NULL;
  DT_TRY(st);
  double tp = dt_time_now();
  if (S->own_ok)
    st = dt_ckpt__write_own(S->lay, S->a, &S->D, S->own, S->foff, S->rank, S->size, S->dio_fd, S->wb_fd, &S->segs, &S->n_direct,
                   S->path);
  double t_own = dt_time_now() - tp;
  DT_TRY(dt_ckpt__agree(S->comm, st));
  dt_ckpt__time(S->comm, "write: tensors", S->t0);
  dt_ckpt__time(S->comm, "  pack+crc wait", dt_time_now() - S->t_pack);
  dt_ckpt__time(S->comm, "  H5Dwrite", dt_time_now() - S->t_h5);
  dt_ckpt__time(S->comm, "  H5Dcreate", dt_time_now() - S->t_cr);
  dt_ckpt__time(S->comm, "  writeback", dt_time_now() - S->t_wb);
  dt_ckpt__time(S->comm, S->own_ok ? (S->dio_fd >= 0 ? "  own writes, O_DIRECT" : "  own writes, buffered") : "  (no own writes)",
                dt_time_now() - t_own);
  return DT_OK;
}

/* Phase 5: CRC runs to rank 0, tiling check and combination. The agreed status. */
static dt_status_t save_crcs(save_t *S) {
  const int rank = S->rank, size = S->size, n_ds = S->D.n_ds;
  dt_status_t st = DT_OK;
  int mine = (int)(S->segs.n * sizeof(seg_t)), *cnt = NULL, *dsp = NULL, total = 0;
  if (rank == 0) cnt = calloc((size_t)size, sizeof *cnt), dsp = calloc((size_t)size, sizeof *dsp);
  DT_MPI_KEEP(st, dt_wd_gather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, 0, S->comm, "gather (checkpoint save)"));
  for (int r = 0; rank == 0 && r < size; r++) dsp[r] = total, total += cnt[r];
  if (rank == 0) S->all = malloc((size_t)total + 1);
  DT_MPI_KEEP(st, dt_wd_gatherv(S->segs.s, mine, MPI_BYTE, S->all, cnt, dsp, MPI_BYTE, 0, S->comm, "gatherv (checkpoint save)"));
  free(cnt);
  free(dsp);
  S->crc = calloc((size_t)n_ds, sizeof *S->crc);
  if (!S->crc) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", S->path);
  if (st == DT_OK && rank == 0) {
    const char **nm = malloc((size_t)n_ds * sizeof *nm);
    for (int d = 0; nm && d < n_ds; d++) nm[d] = S->D.names[d];
    st = nm ? combine(S->all, (size_t)total / sizeof(seg_t), S->D.bytes, nm, n_ds, S->crc, S->path)
            : DT_ERR(DT_ERR_NOMEM, "%s: out of memory", S->path);
    free(nm);
  }
  return dt_ckpt__agree(S->comm, st);
}

/* Phases 6 and 7: the CRCs from rank 0 to all, written with the training state, everything
 * flushed, then the completion marker. The agreed status. */
static dt_status_t save_finish(save_t *S) {
  const char *path = S->path;
  dt_status_t st = DT_OK;
  DT_MPI_KEEP(st, dt_wd_bcast(S->crc, S->D.n_ds, MPI_UINT32_T, 0, S->comm, "bcast (checkpoint save)"));
  for (int d = 0; d < S->D.n_ds && st == DT_OK; d++)
    if (dt_ckpt__attr_put(S->D.ds[d], "crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, &S->crc[d]) < 0)
      st = dt_ckpt__h5err(path, S->D.names[d], "cannot write crc32c attribute");
  if (st == DT_OK) st = write_state(S->file, &S->s, S->ini, S->world, S->rank, S->lay, S->dxpl, path);
  DT_TRY(dt_ckpt__agree(S->comm, st));
  dt_ckpt__time(S->comm, "write: crc+state", S->t0);
  int one = 1;
  if (H5Fflush(S->file, H5F_SCOPE_GLOBAL) < 0) st = dt_ckpt__h5err(path, "/", "cannot flush");
  else if (!dt_fault("ckpt_noflush", 0, (int)S->s.step) && /* test-only, fault.h; same verdict on all ranks */
           dt_ckpt__attr_put(S->file, "complete", H5T_STD_I32LE, H5T_NATIVE_INT, &one) < 0)
    st = dt_ckpt__h5err(path, "/", "cannot write the completion marker");
  return dt_ckpt__agree(S->comm, st);
}

/* Everything a save holds, whichever phase it stopped in; closing the file is agreed on too. */
static dt_status_t save_free(save_t *S, dt_status_t st) {
  dt_ckpt__dsets_free(&S->D);
  if (S->wb_fd >= 0) close(S->wb_fd);
  if (S->dio_fd >= 0) close(S->dio_fd);
  if (S->file >= 0 && H5Fclose(S->file) < 0 && st == DT_OK) st = dt_ckpt__h5err(S->path, "/", "cannot close file");
  if (S->file >= 0) st = dt_ckpt__agree(S->comm, st);
  dt_ckpt__time(S->comm, "write: closed", S->t0);
  if (S->fapl >= 0) H5Pclose(S->fapl);
  if (S->dxpl >= 0) H5Pclose(S->dxpl);
  dt_ckpt_ranges_free(&S->rg[0]);
  dt_ckpt_ranges_free(&S->rg[1]);
  void *bufs[] = {S->own, S->foff, S->bx[0], S->bx[1], S->stg[0], S->stg[1], S->segs.s, S->all, S->crc, S->ini};
  for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) free(bufs[k]);
  return st;
}

/* The file, written collectively by the ranks of comm (all ranks, or the node leaders); world =
 * the number of ranks of the job (the /state attribute). */
static dt_status_t write_file(MPI_Comm comm, int world, const char *path, const dt_layout_t *lay,
                              const dt_ckpt_arenas_t *a, const dt_ckpt_state_t *st_in) {
  save_t S;
  memset(&S, 0, sizeof S);
  S.comm = comm, S.world = world, S.path = path, S.lay = lay, S.a = a;
  S.fapl = S.dxpl = S.file = -1;
  S.wb_fd = S.dio_fd = -1;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &S.rank));
  DT_MPI_CHECK(MPI_Comm_size(comm, &S.size));
  dt_ckpt__h5_quiet();
  S.t0 = dt_time_now();
  dt_status_t st = save_plan(&S, st_in);
  if (st == DT_OK) st = save_create(&S);
  if (st == DT_OK) st = save_groups(&S);
  if (st == DT_OK) st = save_tensors(&S);
  if (st == DT_OK) st = save_crcs(&S);
  if (st == DT_OK) st = save_finish(&S);
  return save_free(&S, st);
}

dt_status_t dt_ckpt_write(const void *mpi_comm, const char *path, const dt_layout_t *lay,
                          const dt_ckpt_arenas_t *a, const dt_ckpt_state_t *st_in) {
  MPI_Comm comm = dt_ckpt__comm(mpi_comm), lead, node;
  int size, leaders;
  DT_MPI_CHECK(MPI_Comm_size(comm, &size));
  DT_TRY(dt_ckpt__node_leaders(comm, a, &lead, &node, &leaders));
  if (!leaders) return write_file(comm, size, path, lay, a, st_in);
  /* Replicated arenas: the node leaders write the file (each 1/nodes of every tensor), the other
   * ranks hold the same numbers and wait without spinning, so the writers keep the cores and no
   * two ranks of a node contend for the file. The state comes from rank 0, a leader. */
  dt_status_t st = DT_OK;
  if (lead != MPI_COMM_NULL) {
    st = write_file(lead, size, path, lay, a, st_in);
  } else { /* test hooks of the ranks that write nothing (fault.h, ckpt__fault) */
    if (dt_fault("ckpt_kill", dt_err_rank(), -1))
      dt_fault_kill("rank %d: ckpt_kill: SIGKILL in the save of %s, which this rank does not write", dt_err_rank(),
                    path);
    if (dt_ckpt__faulty(comm, "open") || dt_ckpt__faulty(comm, "write"))
      st = DT_ERR(DT_ERR_IO, "%s: simulated %s failure (test hook)", path, dt_ckpt__faulty(comm, "open") ? "open" : "write");
  }
  dt_status_t b = dt_ckpt__quiet_barrier(comm);
  st = dt_ckpt__agree(comm, st != DT_OK ? st : b);
  b = dt_ckpt__node_leaders_free(&lead, &node);
  return st != DT_OK ? st : b;
}
