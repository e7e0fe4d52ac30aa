/* Checkpoint write: every rank packs its boxes of each tensor in file order (the arena's layout is
 * the file's, Hugging Face's) and joins one collective H5Dwrite per dataset; the per-rank CRC32C
 * runs are tiled and combined on rank 0 into each dataset's checksum; state and the completion
 * marker come last. */
#include <errno.h>
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

typedef struct { uint64_t ds, off, len; uint32_t crc, pad; } seg_t;

typedef struct {
  seg_t *s;
  size_t n, cap;
} segs_t;

/* Runs on the packing thread: no DT_ERR here (one global message buffer); -1 = out of memory. */
static int segs_add(segs_t *g, uint64_t ds, uint64_t off, const void *data, uint64_t len) {
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
      if (segs_add(j->segs, j->ds, ((x->r0 + q) * f->FC + x->c0) * sizeof(float), row, w * sizeof(float)) < 0) return -1;
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
      if (segs_add(j->segs, j->ds, (i * f->FC + x->c0) * sizeof(float), dst, (x->c1 - x->c0) * sizeof(float)) < 0) return -1;
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

/* ---- own-descriptor writes of large replicated tensors ---------------------------------------
 * With replicated (full) arenas every rank (node leader) holds every tensor, so the bytes of a
 * large dataset can be split at page boundaries instead of rows: each writer packs its byte range
 * in file order, in chunks, and writes them at the dataset's file offset (H5Dget_offset; HDF5 never
 * writes those raw bytes itself) with O_DIRECT when the file system takes it. That skips the page
 * cache: no 1.5 GB of fresh cache pages to allocate and copy into (which on this VM costs more
 * than the disk: buffered writes slow down 2-3x while other memory is resident, dd as much as we),
 * and the checkpoint does not push the training data out of the cache. The tail of a dataset
 * that does not fill its last page, and every write O_DIRECT refuses, go through a normal
 * descriptor. DTRAIN_CKPT_DIRECT=0 turns the path off (every dataset through H5Dwrite). */

typedef struct { /* one chunk: bytes [lo, hi) of dataset d, at file offset foff + lo */
  const dt_tensor_t *t;
  const float *arena;
  int d;
  uint64_t foff, lo, hi;
  float *buf;
  segs_t *segs;
  int failed;
} chunk_t;

static void *pack_chunk(void *p) {
  chunk_t *c = p;
  /* the file's row-major order is the arena's (wte: its first V rows) */
  memcpy(c->buf, (const char *)(c->arena + c->t->offset) + c->lo, c->hi - c->lo);
  c->failed = segs_add(c->segs, (uint64_t)c->d, c->lo, c->buf, c->hi - c->lo) < 0;
  return NULL;
}

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
  const char *b = buf;
  while (n > 0) {
    ssize_t w = pwrite(fd, b, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w, n -= (size_t)w, off += (uint64_t)w;
  }
  return 0;
}

/* This rank's byte range of every dataset in `own` (part rank of size, split at DT_CKPT_ALIGN),
 * packed on a helper thread one chunk ahead of the writes. *n_direct counts O_DIRECT bytes. */
static dt_status_t write_own(const dt_layout_t *lay, const dt_ckpt_arenas_t *a, const dsets_t *D, const int *own,
                             const uint64_t *foff, int rank, int size, int fd_direct, int fd_buf, segs_t *segs,
                             uint64_t *n_direct, const char *path) {
  float *buf[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) buf[k] = dt_ckpt__io_buf(DT_CKPT_CHUNK);
  if (!buf[0] || !buf[1]) {
    dt_ckpt__io_buf_free(buf[0], DT_CKPT_CHUNK), dt_ckpt__io_buf_free(buf[1], DT_CKPT_CHUNK);
    return DT_ERR(DT_ERR_NOMEM, "%s: out of memory for the write buffers", path);
  }
  chunk_t c[2];
  int have = 0, cur = 0, running = 0;
  pthread_t th;
  dt_status_t st = DT_OK;
  /* the chunks in order: (dataset, range) */
  int d = 0;
  uint64_t lo = 0, hi = 0, end = 0;
  int started = 0;
  for (;;) {
    /* next chunk into c[!cur] */
    chunk_t *n = &c[have ? !cur : cur];
    int got = 0;
    while (!got && d < D->n_ds) {
      if (!own[d]) { d++, started = 0; continue; }
      if (!started) {
        uint64_t nb = D->bytes[d];
        lo = nb * (uint64_t)rank / (uint64_t)size / DT_CKPT_ALIGN * DT_CKPT_ALIGN;
        end = rank == size - 1 ? nb : nb * (uint64_t)(rank + 1) / (uint64_t)size / DT_CKPT_ALIGN * DT_CKPT_ALIGN;
        started = 1;
      }
      if (lo >= end) { d++, started = 0; continue; }
      hi = end - lo > DT_CKPT_CHUNK ? lo + DT_CKPT_CHUNK : end;
      int ti = d % lay->n_tensors, gi = d / lay->n_tensors;
      *n = (chunk_t){&lay->tensors[ti], gi == 0 ? a->params : gi == 1 ? a->m : a->v,
                     d, foff[d], lo, hi, buf[have ? !cur : cur], segs, 0};
      lo = hi;
      got = 1;
    }
    if (!have) { /* the first chunk: pack it here */
      if (!got) break;
      pack_chunk(n);
      have = 1;
      continue;
    }
    if (got) { /* pack the next chunk while this one is written */
      running = pthread_create(&th, NULL, pack_chunk, n) == 0;
      if (!running) pack_chunk(n);
    }
    chunk_t *w = &c[cur];
    if (w->failed && st == DT_OK) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory (checksum runs)", path);
    uint64_t len = w->hi - w->lo, al = fd_direct >= 0 && w->foff % DT_CKPT_ALIGN == 0 ? len / DT_CKPT_ALIGN * DT_CKPT_ALIGN : 0;
    if (st == DT_OK && al > 0 && pwrite_all(fd_direct, w->buf, al, w->foff + w->lo) < 0) al = 0; /* refused: buffered */
    *n_direct += al;
    if (st == DT_OK && pwrite_all(fd_buf, (const char *)w->buf + al, len - al, w->foff + w->lo + al) < 0)
      st = DT_ERR(DT_ERR_IO, "%s: %s: write failed: %s", path, D->names[w->d], strerror(errno));
    if (running) pthread_join(th, NULL);
    running = 0;
    if (!got) break;
    cur = !cur;
  }
  if (st == DT_OK && ((fd_direct >= 0 && fdatasync(fd_direct) != 0) || fdatasync(fd_buf) != 0))
    st = DT_ERR(DT_ERR_IO, "%s: fdatasync: %s", path, strerror(errno));
  dt_ckpt__io_buf_free(buf[0], DT_CKPT_CHUNK);
  dt_ckpt__io_buf_free(buf[1], DT_CKPT_CHUNK);
  return st;
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

/* The file, written collectively by the ranks of comm (all ranks, or the node leaders); world =
 * the number of ranks of the job (the /state attribute). */
static dt_status_t write_file(MPI_Comm comm, int world, const char *path, const dt_layout_t *lay,
                              const dt_ckpt_arenas_t *a, const dt_ckpt_state_t *st_in) {
  int rank, size;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DT_MPI_CHECK(MPI_Comm_size(comm, &size));
  dt_ckpt__h5_quiet();
  dt_ckpt_state_t s;
  char *ini = NULL;
  dt_ckpt_ranges_t rg[2];
  memset(rg, 0, sizeof rg);
  dsets_t D;
  memset(&D, 0, sizeof D);
  hid_t fapl = -1, dxpl = -1, file = -1, g = -1;
  int wb_fd = -1;          /* our own descriptor of the file: start_writeback, and the own-descriptor writes */
  int dio_fd = -1;         /* the same with O_DIRECT, -1 if the file system refuses it */
  int *own = NULL;         /* per dataset: written through our own descriptors (write_own), not H5Dwrite */
  uint64_t *foff = NULL, n_direct = 0;
  uint64_t unsynced = 0;   /* bytes this rank wrote since the last start_writeback */
  float *stage = NULL;
  segs_t segs = {0};
  seg_t *all = NULL;
  uint32_t *crc = NULL;

  double t0 = dt_time_now(), t_pack = 0, t_h5 = 0, t_wb = 0, t_cr = 0;
  /* Phase 1 (local): state from rank 0, ranges, buffers. */
  dt_status_t st = state_bcast(comm, rank, st_in, &s, &ini);
  int optim = a->m != NULL, omin, omax;
  DT_MPI_KEEP(st, dt_wd_allreduce(&optim, &omin, 1, MPI_INT, MPI_MIN, comm, "allreduce (checkpoint save)"));
  DT_MPI_KEEP(st, dt_wd_allreduce(&optim, &omax, 1, MPI_INT, MPI_MAX, comm, "allreduce (checkpoint save)"));
  if (st == DT_OK && omin != omax) st = DT_ERR(DT_ERR_ARG, "%s: some ranks pass AdamW moments, others not", path);
  if (st == DT_OK && (a->m == NULL) != (a->v == NULL)) st = DT_ERR(DT_ERR_ARG, "%s: m and v must both be given", path);
  if (st == DT_OK) st = dt_ckpt__ranges_resolve(lay, &a->model, 1, rank, size, &rg[0]);
  if (st == DT_OK && optim) st = dt_ckpt__ranges_resolve(lay, &a->optim, 1, rank, size, &rg[1]);
  if (st == DT_OK) st = check_disjoint(lay, &rg[0], "model");
  if (st == DT_OK && optim) st = check_disjoint(lay, &rg[1], "optim");
  if (st == DT_OK) st = dt_ckpt__dsets_init(&D, lay, optim ? 3 : 1);
  if (st == DT_OK && dt_ckpt__faulty(comm, "open")) st = DT_ERR(DT_ERR_IO, "%s: simulated open failure (test hook)", path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 2: collective create. */
  fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  /* Collective HDF5 calls, independent MPI-IO underneath: every rank's part of a dataset is one
   * contiguous run of MBs, which two-phase buffering only reshuffles (measured: 4 ranks on 2
   * cores 2.3 s instead of 4-5 s in H5Dwrite). DTRAIN_CKPT_TWO_PHASE=1 restores two-phase I/O. */
  if (!getenv("DTRAIN_CKPT_TWO_PHASE")) H5Pset_dxpl_mpio_collective_opt(dxpl, H5FD_MPIO_INDIVIDUAL_IO);
  /* Replicated arenas on every rank: large datasets are written through our own descriptors
   * (write_own), so their raw data must start on page boundaries. */
  int full_all[2] = {a->model.full, !optim || a->optim.full};
  DT_MPI_KEEP(st, dt_wd_allreduce(MPI_IN_PLACE, full_all, 2, MPI_INT, MPI_MIN, comm, "allreduce (checkpoint save)"));
  int own_ok = dt_ckpt__own_io() && (full_all[0] || full_all[1]);
  if (own_ok) H5Pset_alignment(fapl, DT_CKPT_OWN_MIN, DT_CKPT_ALIGN);
  file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file < 0) st = dt_ckpt__h5err(path, "/", "cannot create file");
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  wb_fd = open(path, O_WRONLY | O_CLOEXEC);
  if (own_ok) {
    dio_fd = dt_ckpt__open_direct(path, O_WRONLY); /* -1: plain writes */
    int have = wb_fd >= 0, all = 0; /* every rank needs a descriptor, else nobody takes the path */
    DT_MPI_KEEP(st, dt_wd_allreduce(&have, &all, 1, MPI_INT, MPI_MIN, comm, "allreduce (checkpoint save)"));
    own_ok = all;
  }
  own = calloc((size_t)D.n_ds, sizeof *own);
  foff = calloc((size_t)D.n_ds, sizeof *foff);
  if (!own || !foff) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  for (int d = 0; own && d < D.n_ds; d++) own[d] = own_ok && full_all[d >= lay->n_tensors] && D.bytes[d] >= DT_CKPT_OWN_MIN;
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 3: groups, root attributes. */
  const char *grps[] = {"/model", "/optim", "/optim/exp_avg", "/optim/exp_avg_sq"};
  int fmt = DT_CKPT_FORMAT_VERSION;
  for (int i = 0; i < (optim ? 4 : 1) && st == DT_OK; i++) {
    if ((g = H5Gcreate2(file, grps[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0) st = dt_ckpt__h5err(path, grps[i], "cannot create group");
    else H5Gclose(g);
  }
  if (st == DT_OK && (dt_ckpt__attr_put_str(file, "format", "dtrain-checkpoint") < 0 ||
                      dt_ckpt__attr_put(file, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT, &fmt) < 0 ||
                      dt_ckpt__attr_put_str(file, "dtrain_version", PACKAGE_VERSION) < 0))
    st = dt_ckpt__h5err(path, "/", "cannot write attributes");
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 4: tensors, one collective write each; tensor d + 1 is packed on a helper thread while
   * d is written (two stage buffers the size of the largest tensor that needs staging). */
  int nbx = rg[0].n > rg[1].n ? rg[0].n : rg[1].n;
  fbox_t *bx[2] = {malloc((size_t)nbx * sizeof(fbox_t) + 1), malloc((size_t)nbx * sizeof(fbox_t) + 1)};
  job_t job[2];
  size_t need = 1;
  for (int d = 0; bx[0] && d < D.n_ds; d++) {
    job_init(&job[0], lay, a, rg, d, bx[0], NULL, NULL, own);
    size_t n = 0;
    for (int b = 0; b < job[0].nb; b++) n += (size_t)((bx[0][b].r1 - bx[0][b].r0) * (bx[0][b].c1 - bx[0][b].c0));
    if (!direct(&job[0]) && n > need) need = n;
  }
  float *stg[2] = {malloc(need * sizeof(float)), malloc(need * sizeof(float))};
  stage = stg[0];
  if (!bx[0] || !bx[1] || !stg[0] || !stg[1]) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory for the staging buffers", path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) {
    free(bx[0]), free(bx[1]), free(stg[1]);
    goto out;
  }
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  job_init(&job[0], lay, a, rg, 0, bx[0], stg[0], &segs, own);
  double tp = dt_time_now();
  pack_thread(&job[0]);
  t_pack += dt_time_now() - tp;
  for (int d = 0; d < D.n_ds; d++) {
    job_t *J = &job[d & 1], *N = &job[(d + 1) & 1];
    pthread_t th;
    int running = 0;
    if (d + 1 < D.n_ds) { /* start packing the next tensor */
      job_init(N, lay, a, rg, d + 1, bx[(d + 1) & 1], stg[(d + 1) & 1], &segs, own);
      running = pthread_create(&th, NULL, pack_thread, N) == 0;
      if (!running) pack_thread(N); /* no thread: pack it here, in order */
    }
    hid_t fsp = H5Screate_simple(J->f.ndim, J->f.dims, NULL), msp = -1;
    double tc = dt_time_now();
    D.ds[d] = H5Dcreate2(file, D.names[d], H5T_IEEE_F32LE, fsp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    t_cr += dt_time_now() - tc;
    if (D.ds[d] < 0) st = dt_ckpt__h5err(path, D.names[d], "cannot create dataset");
    else if (own[d] && (foff[d] = (uint64_t)H5Dget_offset(D.ds[d])) == (uint64_t)HADDR_UNDEF)
      st = dt_ckpt__h5err(path, D.names[d], "no file offset for the raw data");
    if (st == DT_OK && J->failed) st = DT_ERR(DT_ERR_NOMEM, "%s: %s: out of memory (checksum runs)", path, D.names[d]);
    for (int b = 0; st == DT_OK && b < J->nb; b++)
      if (dt_ckpt__select_box(fsp, &J->f, &J->bx[b], b == 0 ? H5S_SELECT_SET : H5S_SELECT_OR) < 0)
        st = dt_ckpt__h5err(path, D.names[d], "cannot select hyperslab");
    if (st == DT_OK) { /* local problems are agreed on before the collective write */
      hsize_t mc = J->count ? J->count : 1;
      msp = H5Screate_simple(1, &mc, NULL);
      if (!J->count) H5Sselect_none(msp), H5Sselect_none(fsp);
    }
    st = dt_ckpt__agree(comm, st);
    tp = dt_time_now();
    if (st == DT_OK && !own[d] && H5Dwrite(D.ds[d], H5T_NATIVE_FLOAT, msp, fsp, dxpl, J->buf) < 0)
      st = dt_ckpt__h5err(path, D.names[d], "cannot write dataset");
    t_h5 += dt_time_now() - tp;
    tp = dt_time_now();
    if ((unsynced += J->count * sizeof(float)) >= (32u << 20)) start_writeback(wb_fd), unsynced = 0;
    t_wb += dt_time_now() - tp;
    if (st == DT_OK && dt_ckpt__faulty(comm, "write")) st = DT_ERR(DT_ERR_IO, "%s: %s: simulated write failure (test hook)", path, D.names[d]);
    if (d == D.n_ds / 2 && dt_fault("ckpt_kill", dt_err_rank(), -1)) /* test-only, fault.h */
      dt_fault_kill("rank %d: ckpt_kill: SIGKILL after writing dataset %d of %d of %s", dt_err_rank(), d + 1, D.n_ds,
                    path);
    if (msp >= 0) H5Sclose(msp);
    H5Sclose(fsp);
    tp = dt_time_now();
    if (running) pthread_join(th, NULL);
    t_pack += dt_time_now() - tp; /* waiting for the packer */
    if ((st = dt_ckpt__agree(comm, st)) != DT_OK) break;
  }
  H5Pclose(dcpl);
  free(bx[0]);
  free(bx[1]);
  free(stg[1]);
  if (st != DT_OK) goto out;
  tp = dt_time_now();
  if (own_ok) st = write_own(lay, a, &D, own, foff, rank, size, dio_fd, wb_fd, &segs, &n_direct, path);
  double t_own = dt_time_now() - tp;
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  dt_ckpt__time(comm, "write: tensors", t0);
  dt_ckpt__time(comm, "  pack+crc wait", dt_time_now() - t_pack);
  dt_ckpt__time(comm, "  H5Dwrite", dt_time_now() - t_h5);
  dt_ckpt__time(comm, "  H5Dcreate", dt_time_now() - t_cr);
  dt_ckpt__time(comm, "  writeback", dt_time_now() - t_wb);
  dt_ckpt__time(comm, own_ok ? (dio_fd >= 0 ? "  own writes, O_DIRECT" : "  own writes, buffered") : "  (no own writes)",
                dt_time_now() - t_own);
  /* Phase 5: CRC runs to rank 0, tiling check and combination, CRCs back to all. */
  int mine = (int)(segs.n * sizeof(seg_t)), *cnt = NULL, *dsp = NULL, total = 0;
  if (rank == 0) cnt = calloc((size_t)size, sizeof *cnt), dsp = calloc((size_t)size, sizeof *dsp);
  DT_MPI_KEEP(st, dt_wd_gather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, 0, comm, "gather (checkpoint save)"));
  for (int r = 0; rank == 0 && r < size; r++) dsp[r] = total, total += cnt[r];
  if (rank == 0) all = malloc((size_t)total + 1);
  DT_MPI_KEEP(st, dt_wd_gatherv(segs.s, mine, MPI_BYTE, all, cnt, dsp, MPI_BYTE, 0, comm, "gatherv (checkpoint save)"));
  free(cnt);
  free(dsp);
  crc = calloc((size_t)D.n_ds, sizeof *crc);
  if (!crc) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  if (st == DT_OK && rank == 0) {
    const char **nm = malloc((size_t)D.n_ds * sizeof *nm);
    for (int d = 0; nm && d < D.n_ds; d++) nm[d] = D.names[d];
    st = nm ? combine(all, (size_t)total / sizeof(seg_t), D.bytes, nm, D.n_ds, crc, path)
            : DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
    free(nm);
  }
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  DT_MPI_KEEP(st, dt_wd_bcast(crc, D.n_ds, MPI_UINT32_T, 0, comm, "bcast (checkpoint save)"));

  /* Phase 6: checksums, training state. */
  for (int d = 0; d < D.n_ds && st == DT_OK; d++)
    if (dt_ckpt__attr_put(D.ds[d], "crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc[d]) < 0)
      st = dt_ckpt__h5err(path, D.names[d], "cannot write crc32c attribute");
  if (st == DT_OK) st = write_state(file, &s, ini, world, rank, lay, dxpl, path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  dt_ckpt__time(comm, "write: crc+state", t0);
  /* Phase 7: everything flushed, then the completion marker. */
  int one = 1;
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) st = dt_ckpt__h5err(path, "/", "cannot flush");
  else if (!dt_fault("ckpt_noflush", 0, (int)s.step) && /* test-only, fault.h; same verdict on all ranks */
           dt_ckpt__attr_put(file, "complete", H5T_STD_I32LE, H5T_NATIVE_INT, &one) < 0)
    st = dt_ckpt__h5err(path, "/", "cannot write the completion marker");
  st = dt_ckpt__agree(comm, st);

out:
  dt_ckpt__dsets_free(&D);
  if (wb_fd >= 0) close(wb_fd);
  if (dio_fd >= 0) close(dio_fd);
  free(own);
  free(foff);
  if (file >= 0 && H5Fclose(file) < 0 && st == DT_OK) st = dt_ckpt__h5err(path, "/", "cannot close file");
  if (file >= 0) st = dt_ckpt__agree(comm, st);
  dt_ckpt__time(comm, "write: closed", t0);
  if (fapl >= 0) H5Pclose(fapl);
  if (dxpl >= 0) H5Pclose(dxpl);
  dt_ckpt_ranges_free(&rg[0]);
  dt_ckpt_ranges_free(&rg[1]);
  free(stage);
  free(segs.s);
  free(all);
  free(crc);
  free(ini);
  return st;
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
