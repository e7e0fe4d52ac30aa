/* Checkpoint read: collective open, marker/format/shape checks, then per dataset each rank
 * reads and checksums 1/P of it, an allgather gives every rank the whole tensor, the combined
 * CRC32C is verified and each rank copies out its boxes (transposing back to our layout). */
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
#include "crc32c.h"
#include "timer.h"

/* ---- read --------------------------------------------------------------------------------- */

void dt_ckpt_state_free(dt_ckpt_state_t *st) {
  free((char *)st->ini);
  st->ini = NULL;
}

/* Read a small dataset on every rank into buf (cap bytes) and check its CRC. */
static dt_status_t get_small(hid_t loc, const char *name, hid_t mtype, void *buf, size_t elem, size_t cap,
                             size_t *n_out, hid_t dxpl, const char *path) {
  char obj[64];
  snprintf(obj, sizeof obj, "/state/%s", name);
  hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
  if (d < 0) return dt_ckpt__h5err(path, obj, "missing dataset");
  hid_t sp = H5Dget_space(d);
  hssize_t n = H5Sget_simple_extent_npoints(sp);
  uint32_t stored = 0;
  dt_status_t st = DT_OK;
  if (n < 0 || (size_t)n * elem > cap) st = DT_ERR(DT_ERR_CKPT, "%s: %s: %lld elements do not fit (max %zu)", path, obj, (long long)n, cap / elem);
  else if (n > 0 && H5Dread(d, mtype, H5S_ALL, H5S_ALL, dxpl, buf) < 0) st = dt_ckpt__h5err(path, obj, "cannot read");
  else if (dt_ckpt__attr_get(d, "crc32c", H5T_NATIVE_UINT32, &stored) < 0) st = dt_ckpt__h5err(path, obj, "no crc32c attribute");
  else if (dt_crc32c(0, buf, (size_t)n * elem) != stored)
    st = DT_ERR(DT_ERR_CKPT, "%s: %s: CRC32C mismatch: stored 0x%08x, data 0x%08x (corrupt file)", path, obj, stored,
                dt_crc32c(0, buf, (size_t)n * elem));
  if (n_out) *n_out = n < 0 ? 0 : (size_t)n;
  H5Sclose(sp);
  H5Dclose(d);
  return st;
}

static dt_status_t read_state(hid_t file, dt_ckpt_state_t *s, const char *path) {
  hid_t g = H5Gopen2(file, "/state", H5P_DEFAULT);
  if (g < 0) return dt_ckpt__h5err(path, "/state", "missing group");
  struct { const char *k; void *v; hid_t mt; } at[] = {
      {"step", &s->step, H5T_NATIVE_INT64},         {"tokens", &s->tokens, H5T_NATIVE_INT64},
      {"data_pos", &s->data_pos, H5T_NATIVE_INT64}, {"epoch", &s->epoch, H5T_NATIVE_INT64},
      {"seed", &s->seed, H5T_NATIVE_UINT64},        {"loss_scale", &s->loss_scale, H5T_NATIVE_DOUBLE},
      {"loss_scale_growth", &s->loss_scale_growth, H5T_NATIVE_INT64},
      {"dp", &s->dp, H5T_NATIVE_INT},               {"tp", &s->tp, H5T_NATIVE_INT},
      {"pp", &s->pp, H5T_NATIVE_INT},               {"world", &s->world, H5T_NATIVE_INT},
      {"n_layer", &s->dims.L, H5T_NATIVE_INT},      {"n_head", &s->dims.NH, H5T_NATIVE_INT},
      {"n_embd", &s->dims.C, H5T_NATIVE_INT},       {"vocab_size", &s->dims.V, H5T_NATIVE_INT},
      {"seq_len", &s->dims.T, H5T_NATIVE_INT},
  };
  dt_status_t st = DT_OK;
  for (size_t i = 0; i < sizeof at / sizeof at[0] && st == DT_OK; i++)
    if (dt_ckpt__attr_get(g, at[i].k, at[i].mt, at[i].v) < 0) st = dt_ckpt__h5err(path, "/state", at[i].k);
  s->skipped_steps = 0; /* optional: files before mixed precision do not have it */
  if (st == DT_OK && H5Aexists(g, "skipped_steps") > 0 &&
      dt_ckpt__attr_get(g, "skipped_steps", H5T_NATIVE_INT64, &s->skipped_steps) < 0)
    st = dt_ckpt__h5err(path, "/state", "skipped_steps");
  H5Gclose(g);
  return st;
}

static dt_status_t read_state_data(hid_t file, dt_ckpt_state_t *s, hid_t dxpl, const char *path) {
  hid_t g = H5Gopen2(file, "/state", H5P_DEFAULT);
  if (g < 0) return dt_ckpt__h5err(path, "/state", "missing group");
  size_t n = 0;
  dt_status_t st = get_small(g, "rng", H5T_NATIVE_UINT64, s->rng, sizeof(uint64_t), sizeof s->rng, &n, dxpl, path);
  s->n_rng = (int)n;
  hid_t d = st == DT_OK ? H5Dopen2(g, "config_ini", H5P_DEFAULT) : -1;
  if (st == DT_OK && d < 0) st = dt_ckpt__h5err(path, "/state/config_ini", "missing dataset");
  if (st == DT_OK) {
    hid_t ft = H5Dget_type(d);
    size_t len = H5Tget_size(ft);
    H5Tclose(ft);
    H5Dclose(d);
    char *ini = calloc(len + 1, 1);
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, len);
    H5Tset_strpad(mt, H5T_STR_NULLTERM);
    st = ini ? get_small(g, "config_ini", mt, ini, len, len, NULL, dxpl, path) : DT_ERR(DT_ERR_NOMEM, "out of memory");
    H5Tclose(mt);
    if (st == DT_OK) s->ini = ini;
    else free(ini);
  }
  H5Gclose(g);
  return st;
}

static dt_status_t check_header(hid_t file, const dt_layout_t *lay, dt_ckpt_state_t *s, const char *path) {
  char fmt[64] = "";
  int ver = 0, complete = 0;
  if (dt_ckpt__attr_get_str(file, "format", fmt, sizeof fmt) < 0 || strcmp(fmt, "dtrain-checkpoint") != 0)
    return DT_ERR(DT_ERR_CKPT, "%s: not a dtrain checkpoint (no /format = \"dtrain-checkpoint\")", path);
  if (dt_ckpt__attr_get(file, "format_version", H5T_NATIVE_INT, &ver) < 0 || ver != DT_CKPT_FORMAT_VERSION)
    return DT_ERR(DT_ERR_CKPT, "%s: format_version %d, this dtrain reads %d", path, ver, DT_CKPT_FORMAT_VERSION);
  if (!H5Aexists(file, "complete") || dt_ckpt__attr_get(file, "complete", H5T_NATIVE_INT, &complete) < 0 || complete != 1) {
    H5Eclear2(H5E_DEFAULT);
    return DT_ERR(DT_ERR_CKPT, "%s: no completion marker /complete = 1 (the save did not finish)", path);
  }
  dt_ckpt__attr_get_str(file, "dtrain_version", s->version, sizeof s->version);
  DT_TRY(read_state(file, s, path));
  const dt_dims_t *m = &lay->d, *f = &s->dims;
  if (m->L != f->L || m->NH != f->NH || m->C != f->C || m->V != f->V || m->T != f->T)
    return DT_ERR(DT_ERR_CONFIG,
                  "%s: checkpoint model n_layer=%d n_head=%d n_embd=%d vocab_size=%d seq_len=%d does not match the "
                  "configured n_layer=%d n_head=%d n_embd=%d vocab_size=%d seq_len=%d",
                  path, f->L, f->NH, f->C, f->V, f->T, m->L, m->NH, m->C, m->V, m->T);
  return DT_OK;
}

static dt_status_t open_dsets(hid_t file, const dt_layout_t *lay, dsets_t *D, uint32_t *stored, const char *path) {
  H5G_info_t gi;
  hid_t g = H5Gopen2(file, "/model", H5P_DEFAULT);
  if (g < 0) return dt_ckpt__h5err(path, "/model", "missing group");
  herr_t e = H5Gget_info(g, &gi);
  H5Gclose(g);
  if (e < 0 || gi.nlinks != (hsize_t)lay->n_tensors)
    return DT_ERR(DT_ERR_CONFIG, "%s: /model holds %llu tensors, the model has %d", path,
                  (unsigned long long)gi.nlinks, lay->n_tensors);
  if (D->n_ds > lay->n_tensors && H5Lexists(file, "/optim", H5P_DEFAULT) <= 0)
    return DT_ERR(DT_ERR_CKPT, "%s: no optimizer state (/optim) in this checkpoint", path);
  for (int d = 0; d < D->n_ds; d++) {
    fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[d % lay->n_tensors]);
    if ((D->ds[d] = H5Dopen2(file, D->names[d], H5P_DEFAULT)) < 0) return dt_ckpt__h5err(path, D->names[d], "missing dataset");
    hid_t sp = H5Dget_space(D->ds[d]), ty = H5Dget_type(D->ds[d]);
    hsize_t dims[2] = {0, 0};
    int nd = H5Sget_simple_extent_dims(sp, dims, NULL);
    int okt = H5Tget_class(ty) == H5T_FLOAT && H5Tget_size(ty) == 4;
    H5Sclose(sp);
    H5Tclose(ty);
    if (nd != f.ndim || dims[0] != f.dims[0] || (nd == 2 && dims[1] != f.dims[1])) {
      char ex[48], fo[48];
      snprintf(ex, sizeof ex, f.ndim == 2 ? "(%llu, %llu)" : "(%llu)", (unsigned long long)f.dims[0], (unsigned long long)f.dims[1]);
      if (nd == 2) snprintf(fo, sizeof fo, "(%llu, %llu)", (unsigned long long)dims[0], (unsigned long long)dims[1]);
      else if (nd == 1) snprintf(fo, sizeof fo, "(%llu)", (unsigned long long)dims[0]);
      else snprintf(fo, sizeof fo, "rank %d", nd);
      return DT_ERR(DT_ERR_CONFIG, "%s: %s: shape %s in the file, the model expects %s", path, D->names[d], fo, ex);
    }
    if (!okt) return DT_ERR(DT_ERR_CKPT, "%s: %s: not float32", path, D->names[d]);
    if (dt_ckpt__attr_get(D->ds[d], "crc32c", H5T_NATIVE_UINT32, &stored[d]) < 0) return dt_ckpt__h5err(path, D->names[d], "no crc32c attribute");
  }
  return DT_OK;
}

/* Copy the file-layout tensor `full` (FR, FC) into this rank's boxes; zero padded vocab rows. */
static void unpack(const dt_layout_t *lay, int ti, const fshape_t *f, const float *full, const fbox_t *bx, int nb,
                   float *local, int zero_pad) {
  const dt_tensor_t *t = &lay->tensors[ti];
  for (int b = 0; b < nb; b++) {
    const fbox_t *x = &bx[b];
    if (t->ndim == 2 && t->hf_transpose) { /* file (rows, cols) -> our (cols, rows), in 8x8 tiles */
      dt_ckpt__transpose(full + x->r0 * f->FC + x->c0, f->FC, x->r1 - x->r0, x->c1 - x->c0,
                         local + dt_ckpt__local_index(t, x, x->r0, x->c0), x->src->ld);
      continue;
    }
    for (hsize_t i = x->r0; i < x->r1; i++)
      memcpy(local + dt_ckpt__local_index(t, x, i, x->c0), full + i * f->FC + x->c0, (x->c1 - x->c0) * sizeof(float));
  }
  if (zero_pad && dt_ckpt__is_wte(t) && t->rows > lay->d.V)
    memset(local + t->offset + (size_t)lay->d.V * (size_t)t->cols, 0, (size_t)(t->rows - lay->d.V) * (size_t)t->cols * sizeof(float));
}

/* The reader (below) and the unpack share the staging slots: slot k % NSLOT holds the k-th
 * dataset that is not read in place; the reader takes it for dataset k only after dataset
 * k - NSLOT's slot was released (its unpack or transpose_share finished). */
#define NSLOT 4
typedef struct reader reader_t;
static void slot_release(reader_t *R);

/* One tensor's unpack, run on a helper thread while the next tensors are read (no HDF5 in here). */
typedef struct {
  const dt_layout_t *lay;
  int ti, nb, zero_pad, staged;
  fshape_t f;
  const float *full;
  const fbox_t *bx;
  float *local;
  reader_t *R;
} job_t;

static void *unpack_thread(void *p) {
  job_t *j = p;
  unpack(j->lay, j->ti, &j->f, j->full, j->bx, j->nb, j->local, j->zero_pad);
  if (j->staged) slot_release(j->R);
  return NULL;
}

/* 1 if bx is the whole Conv1D weight, stored (rows = file cols, cols = file rows) in the arena. */
static int whole_transposed(const dt_tensor_t *t, const fshape_t *f, const fbox_t *bx, int nb) {
  return nb == 1 && t->ndim == 2 && t->hf_transpose && bx[0].r0 == 0 && bx[0].r1 == f->FR && bx[0].c0 == 0 &&
         bx[0].c1 == f->FC;
}

/* Several ranks, a whole Conv1D weight: each rank transposes only the file rows it read (= its
 * columns of our storage) into the arena, then every rank broadcasts its column block (a strided
 * MPI vector) to the others: the transposes are split P ways instead of done P times. */
static void transpose_share(MPI_Comm comm, int size, const fshape_t *f, const float *mine, hsize_t lo, hsize_t hi,
                            float *dst, size_t ld) {
  if (hi > lo) dt_ckpt__transpose(mine, f->FC, hi - lo, f->FC, dst + lo, ld);
  for (int r = 0; r < size; r++) {
    hsize_t a, z;
    dt_ckpt__split_first(f, r, size, &a, &z);
    if (z == a) continue;
    MPI_Datatype col;
    MPI_Type_vector((int)f->FC, (int)(z - a), (int)ld, MPI_FLOAT, &col);
    MPI_Type_commit(&col);
    MPI_Bcast(dst + a, 1, col, r, comm);
    MPI_Type_free(&col);
  }
}

/* 1 if tensor ti's boxes bx are the whole tensor, contiguous in file order in the arena. */
static int in_place(const dt_tensor_t *t, const fshape_t *f, const fbox_t *bx, int nb) {
  return nb == 1 && !(t->ndim == 2 && t->hf_transpose) && bx[0].r0 == 0 && bx[0].r1 == f->FR && bx[0].c0 == 0 &&
         bx[0].c1 == f->FC && (f->FR == 1 || bx[0].src->ld == f->FC);
}

/* ---- own-descriptor reads (ckpt_int.h) ------------------------------------------------------ */

/* Read up to n bytes at off; returns the bytes read (fewer only at end of file), -1 on error. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off) {
  char *b = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, b + got, n - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* len bytes of the file at off into dst: O_DIRECT reads of the page-aligned cover of each chunk
 * into the aligned bounce buffer (the extra bytes at the edges are dropped), or, when O_DIRECT is
 * unavailable or refuses, a plain read. 0 or -1 (errno). */
static int read_bounce(int fd_direct, int fd_buf, char *bounce, uint64_t off, size_t len, char *dst) {
  while (len > 0) {
    size_t n = len < DT_CKPT_CHUNK - 2 * DT_CKPT_ALIGN ? len : DT_CKPT_CHUNK - 2 * DT_CKPT_ALIGN;
    uint64_t a0 = off / DT_CKPT_ALIGN * DT_CKPT_ALIGN;
    size_t pre = (size_t)(off - a0), span = (pre + n + DT_CKPT_ALIGN - 1) / DT_CKPT_ALIGN * DT_CKPT_ALIGN;
    ssize_t got = fd_direct >= 0 ? pread_full(fd_direct, bounce, span, a0) : -1;
    if (got >= (ssize_t)(pre + n)) {
      memcpy(dst, bounce + pre, n);
    } else if ((errno = 0, pread_full(fd_buf, dst, n, off)) != (ssize_t)n) {
      if (errno == 0) errno = EIO; /* a short read: the file ends early */
      return -1;
    }
    off += n, dst += n, len -= n;
  }
  return 0;
}

/* The same, but where the file offset and dst agree modulo the file's direct-I/O alignment `al`
 * (dt_ckpt__dio_align; GPT-2's tensors all do), the aligned middle goes from the device straight
 * into dst: no bounce copy. Only the unaligned edges, and all of it when the kernel refuses a
 * request (*al is then set to 0 for the rest of the load), take the bounce buffer. */
static int read_own(int fd_direct, int fd_buf, char *bounce, uint64_t off, size_t len, char *dst, size_t *al) {
  size_t a = *al;
  if (fd_direct < 0 || a == 0 || ((uintptr_t)dst - off) % a != 0 || len < 2 * a)
    return read_bounce(fd_direct, fd_buf, bounce, off, len, dst);
  size_t head = (size_t)((a - off % a) % a), mid = (len - head) / a * a;
  if (head && read_bounce(fd_direct, fd_buf, bounce, off, head, dst) < 0) return -1;
  for (size_t i = head; i < head + mid;) {
    size_t n = head + mid - i < DT_CKPT_CHUNK ? head + mid - i : DT_CKPT_CHUNK;
    ssize_t got = pread_full(fd_direct, dst + i, n, off + i);
    if (got == (ssize_t)n) {
      i += n;
      continue;
    }
    if (got < 0 && errno != EINVAL) return -1;
    *al = 0; /* refused (or short): the rest through the bounce buffer */
    return read_bounce(fd_direct, fd_buf, bounce, off + i, len - i, dst + i);
  }
  return read_bounce(fd_direct, fd_buf, bounce, off + head + mid, len - head - mid, dst + head + mid);
}

/* Dataset d for this rank: its tensor and group, file shape, the rank's rows [lo, hi) of the first
 * file dimension (of unit floats each), its boxes (into bx), and the buffer that takes the whole
 * tensor in file order: the arena itself when the tensor is one contiguous non-transposed box
 * there (read and gathered in place, no staging copy), else the stage buffer (then unpacked). */
typedef struct {
  int ti, gi, nb;
  fshape_t f;
  hsize_t unit, lo, hi;
  fbox_t *b;
  float *local, *buf;
} part_t;

static part_t part_of(const dt_layout_t *lay, const dt_ckpt_ranges_t *rg, const dt_ckpt_arenas_t *a, int d, int rank,
                      int size, fbox_t *bx, float *stage) {
  part_t p = {.ti = d % lay->n_tensors, .gi = d / lay->n_tensors, .b = bx, .buf = stage};
  p.f = dt_ckpt__fshape(lay, &lay->tensors[p.ti]);
  p.unit = p.f.ndim == 2 ? p.f.dims[1] : 1;
  dt_ckpt__split_first(&p.f, rank, size, &p.lo, &p.hi);
  p.nb = dt_ckpt__boxes_of(lay, &rg[p.gi ? 1 : 0], p.ti, bx);
  p.local = p.gi == 0 ? a->params : p.gi == 1 ? a->m : a->v;
  if (in_place(&lay->tensors[p.ti], &p.f, bx, p.nb)) p.buf = p.local + dt_ckpt__local_index(&lay->tensors[p.ti], &bx[0], 0, 0);
  return p;
}

/* The reader: one helper thread reads (and checksums) this rank's part of every large dataset
 * (own[d]) in dataset order, as far ahead of the main thread as the staging slots allow, so the
 * disk is kept busy while the main thread reads the small datasets through HDF5, exchanges and
 * unpacks. In-place parts go straight to the arena and need no slot. */
struct reader {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop, released; /* released: staged datasets whose slot is free again, in order */
  int *ready, *err;   /* [d]: the reader finished d; errno of a failed read (0 = ok) */
  /* read-only for the thread */
  const dt_layout_t *lay;
  const dt_ckpt_ranges_t *rg;
  const dt_ckpt_arenas_t *a;
  const int *own, *kst; /* kst[d]: index among staged datasets, -1 when read in place */
  const uint64_t *foff;
  float **slot;
  fbox_t *bx; /* the thread's own box scratch */
  int n_ds, rank, size, fd_direct, fd_buf;
  char *bounce;
  size_t dio_align; /* read_own's; 0 = bounce buffer only */
};

static float *slot_of(const reader_t *R, int d) { return R->kst[d] >= 0 ? R->slot[R->kst[d] % NSLOT] : NULL; }

/* Wait until dataset d's staging slot is free (or a stop); 0 = go, -1 = stopped. */
static int slot_wait(reader_t *R, int d) {
  pthread_mutex_lock(&R->mu);
  while (!R->stop && R->kst[d] >= 0 && R->kst[d] - R->released >= NSLOT) pthread_cond_wait(&R->cv, &R->mu);
  int stop = R->stop;
  pthread_mutex_unlock(&R->mu);
  return stop ? -1 : 0;
}

static void slot_release(reader_t *R) {
  pthread_mutex_lock(&R->mu);
  R->released++;
  pthread_cond_broadcast(&R->cv);
  pthread_mutex_unlock(&R->mu);
}

static void *reader_thread(void *p) {
  reader_t *R = p;
  for (int d = 0; d < R->n_ds; d++) {
    if (!R->own[d]) continue;
    if (slot_wait(R, d) < 0) break;
    const part_t q = part_of(R->lay, R->rg, R->a, d, R->rank, R->size, R->bx, slot_of(R, d));
    size_t n = (size_t)(q.hi - q.lo) * q.unit * sizeof(float);
    char *dst = (char *)(q.buf + q.lo * q.unit);
    errno = 0;
    int e = n && read_own(R->fd_direct, R->fd_buf, R->bounce, R->foff[d] + (uint64_t)q.lo * q.unit * sizeof(float), n, dst,
                          &R->dio_align) < 0
                ? (errno ? errno : EIO)
                : 0;
    pthread_mutex_lock(&R->mu);
    R->err[d] = e, R->ready[d] = 1;
    pthread_cond_broadcast(&R->cv);
    pthread_mutex_unlock(&R->mu);
    if (e) break; /* the main thread stops at d */
  }
  return NULL;
}

/* Wait for the reader to finish dataset d; returns its errno (0 = ok). */
static int reader_wait(reader_t *R, int d) {
  pthread_mutex_lock(&R->mu);
  while (!R->ready[d]) pthread_cond_wait(&R->cv, &R->mu);
  int e = R->err[d];
  pthread_mutex_unlock(&R->mu);
  return e;
}

dt_status_t dt_ckpt_load(const void *mpi_comm, const char *path, const dt_layout_t *lay, const dt_ckpt_arenas_t *a,
                         dt_ckpt_state_t *st_out) {
  MPI_Comm comm = dt_ckpt__comm(mpi_comm);
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  dt_ckpt__h5_quiet();
  dt_ckpt_state_t s;
  memset(&s, 0, sizeof s);
  dt_ckpt_ranges_t rg[2];
  memset(rg, 0, sizeof rg);
  dsets_t D;
  memset(&D, 0, sizeof D);
  hid_t fapl = -1, dxpl = -1, file = -1;
  float *stg[NSLOT] = {NULL}; /* staging slots (reader_t), stg_bytes each */
  size_t stg_bytes = 0;
  uint32_t *stored = NULL, *crcs = NULL, *mine = NULL; /* crcs: (size, n_ds) per-rank part CRCs */
  int *cnt = NULL, *dsp = NULL, *kst = NULL, *rd_ready = NULL, *rd_err = NULL;
  fbox_t *bx[4] = {NULL, NULL, NULL, NULL}; /* [d % 3]: the main thread's boxes of d; [3]: the reader's */
  pthread_t th;
  int running = 0; /* an unpack thread to join */
  job_t job[2];
  int fd_buf = -1, fd_direct = -1, *own = NULL; /* own[d]: read through our descriptors (read_own) */
  uint64_t *foff = NULL;
  char *bounce = NULL;
  reader_t R = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  pthread_t rth;
  int reading = 0; /* the reader thread runs (join it) */

  double t0 = dt_time_now(), t_rd = 0, t_crc = 0, t_ag = 0, t_un = 0, tp;
  /* Phase 1 (local). */
  dt_status_t st = DT_OK;
  int optim = a->m != NULL;
  if ((a->m == NULL) != (a->v == NULL)) st = DT_ERR(DT_ERR_ARG, "%s: m and v must both be given", path);
  if (st == DT_OK) st = dt_ckpt__ranges_resolve(lay, &a->model, 0, rank, size, &rg[0]);
  if (st == DT_OK && optim) st = dt_ckpt__ranges_resolve(lay, &a->optim, 0, rank, size, &rg[1]);
  if (st == DT_OK) st = dt_ckpt__dsets_init(&D, lay, optim ? 3 : 1);
  if (st == DT_OK) {
    stored = calloc((size_t)D.n_ds, sizeof *stored);
    crcs = calloc((size_t)size * (size_t)D.n_ds, sizeof *crcs);
    mine = calloc((size_t)D.n_ds, sizeof *mine);
    cnt = calloc((size_t)size, sizeof *cnt);
    dsp = calloc((size_t)size, sizeof *dsp);
    kst = calloc((size_t)D.n_ds, sizeof *kst);
    rd_ready = calloc((size_t)D.n_ds, sizeof *rd_ready);
    rd_err = calloc((size_t)D.n_ds, sizeof *rd_err);
    int ok = kst && rd_ready && rd_err;
    for (int k = 0; k < 4; k++) ok &= (bx[k] = malloc((size_t)(rg[0].n > rg[1].n ? rg[0].n : rg[1].n) * sizeof(fbox_t) + 1)) != NULL;
    size_t need = 1; /* NSLOT stage buffers, each the largest tensor that is not read in place */
    for (int d = 0, k = 0; ok && d < D.n_ds; d++) {
      int ti = d % lay->n_tensors;
      fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[ti]);
      int nb = dt_ckpt__boxes_of(lay, &rg[d >= lay->n_tensors], ti, bx[0]);
      kst[d] = in_place(&lay->tensors[ti], &f, bx[0], nb) ? -1 : k++;
      if (kst[d] >= 0 && f.FR * f.FC > need) need = f.FR * f.FC;
    }
    stg_bytes = need * sizeof(float);
    for (int k = 0; ok && k < NSLOT; k++) ok &= (stg[k] = dt_ckpt__io_buf(stg_bytes)) != NULL;
    if (!ok || !stored || !crcs || !mine || !cnt || !dsp) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  }
  if (st == DT_OK && dt_ckpt__max_tensor(lay) >= INT_MAX) st = DT_ERR(DT_ERR_UNSUPPORTED, "%s: tensor too large for MPI counts", path);
  FILE *probe = st == DT_OK ? fopen(path, "rb") : NULL;
  if (st == DT_OK && !probe) st = DT_ERR(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  if (probe) fclose(probe);
  if (st == DT_OK && dt_ckpt__faulty(comm, "open")) st = DT_ERR(DT_ERR_IO, "%s: simulated open failure (test hook)", path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 2: collective open, header, shapes, stored checksums. */
  fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  /* Collective HDF5 calls, independent MPI-IO underneath: every rank's part of a dataset is one
   * contiguous run of MBs, which two-phase buffering only reshuffles (measured: 4 ranks on 2
   * cores 2.3 s instead of 4-5 s in H5Dwrite). DTRAIN_CKPT_TWO_PHASE=1 restores two-phase I/O. */
  if (!getenv("DTRAIN_CKPT_TWO_PHASE")) H5Pset_dxpl_mpio_collective_opt(dxpl, H5FD_MPIO_INDIVIDUAL_IO);
  file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (file < 0) st = dt_ckpt__h5err(path, "/", "cannot open as HDF5 (truncated or not HDF5?)");
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  st = check_header(file, lay, &s, path);
  if (st == DT_OK) st = open_dsets(file, lay, &D, stored, path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  /* Large datasets through our own descriptors (the same choice on every rank: H5Dread is
   * collective); every rank needs a plain descriptor, O_DIRECT is each rank's own business. */
  int own_ok = dt_ckpt__own_io(), have, all;
  if (own_ok) {
    fd_buf = open(path, O_RDONLY | O_CLOEXEC);
    fd_direct = dt_ckpt__open_direct(path, O_RDONLY);
    bounce = dt_ckpt__io_buf(DT_CKPT_CHUNK);
    have = fd_buf >= 0 && bounce;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, comm);
    own_ok = all;
  }
  own = calloc((size_t)D.n_ds, sizeof *own);
  foff = calloc((size_t)D.n_ds, sizeof *foff);
  if (!own || !foff) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  for (int d = 0; own && foff && own_ok && d < D.n_ds; d++) {
    haddr_t o = H5Dget_offset(D.ds[d]);
    own[d] = o != HADDR_UNDEF && D.bytes[d] >= DT_CKPT_OWN_MIN, foff[d] = (uint64_t)o;
    /* The small ones (biases, layernorms; H5Dread reads them one at a time below): ask the
     * kernel for all of them now, so their reads overlap instead of costing a round trip each
     * (GPT-2 124M: 294 datasets). */
    if (o != HADDR_UNDEF && !own[d]) (void)posix_fadvise(fd_buf, (off_t)o, (off_t)D.bytes[d], POSIX_FADV_WILLNEED);
  }
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Every rank holds full arenas (the same boxes everywhere): then Conv1D weights use
   * transpose_share, a collective path all ranks must take together. */
  int full_all[2] = {a->model.full, a->optim.full};
  MPI_Allreduce(MPI_IN_PLACE, full_all, 2, MPI_INT, MPI_MIN, comm);

  /* Phase 3: per dataset: read 1/P, checksum it, allgather tensor and CRCs, verify, unpack. The
   * reader thread reads the large parts ahead; the unpack (transposes) of tensor d runs on
   * another helper thread while the main thread exchanges d + 1. */
  R.ready = rd_ready, R.err = rd_err, R.lay = lay, R.rg = rg, R.a = a, R.own = own, R.kst = kst;
  R.foff = foff, R.slot = stg, R.bx = bx[3], R.n_ds = D.n_ds, R.rank = rank, R.size = size;
  R.fd_direct = fd_direct, R.fd_buf = fd_buf, R.bounce = bounce, R.dio_align = dt_ckpt__dio_align(fd_direct);
  if (own_ok) {
    if (pthread_create(&rth, NULL, reader_thread, &R) == 0) reading = 1;
    else st = DT_ERR(DT_ERR_NOMEM, "%s: cannot start the reader thread: %s", path, strerror(errno));
  }
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  for (int d = 0; d < D.n_ds; d++) {
    const part_t p = part_of(lay, rg, a, d, rank, size, bx[d % 3], slot_of(&R, d));
    const int ti = p.ti, gi = p.gi, nb = p.nb;
    const fshape_t f = p.f;
    const hsize_t unit = p.unit, lo = p.lo, hi = p.hi;
    fbox_t *b = p.b;
    float *local = p.local, *buf = p.buf;
    for (int r = 0; r < size; r++) {
      hsize_t rlo, rhi;
      dt_ckpt__split_first(&f, r, size, &rlo, &rhi);
      cnt[r] = (int)((rhi - rlo) * unit), dsp[r] = (int)(rlo * unit);
    }
    tp = dt_time_now();
    if (own[d]) {
      int e = reader_wait(&R, d);
      if (e) st = DT_ERR(DT_ERR_IO, "%s: %s: read failed: %s", path, D.names[d], strerror(e));
    } else {
      (void)slot_wait(&R, d); /* never stopped here: only this thread stops the reader */
      hid_t fsp = H5Dget_space(D.ds[d]);
      hsize_t mc = hi > lo ? (hi - lo) * unit : 1;
      hid_t msp = H5Screate_simple(1, &mc, NULL);
      hsize_t start[2] = {lo, 0}, count[2] = {hi - lo, unit};
      if (hi > lo) H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, NULL, count, NULL);
      else H5Sselect_none(fsp), H5Sselect_none(msp);
      if (H5Dread(D.ds[d], H5T_NATIVE_FLOAT, msp, fsp, dxpl, buf + dsp[rank]) < 0) st = dt_ckpt__h5err(path, D.names[d], "cannot read");
      H5Sclose(msp);
      H5Sclose(fsp);
    }
    t_rd += dt_time_now() - tp;
    if (st == DT_OK && dt_ckpt__faulty(comm, "read")) st = DT_ERR(DT_ERR_IO, "%s: %s: simulated read failure (test hook)", path, D.names[d]);
    if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
    tp = dt_time_now();
    /* here, not on the reader: the disk is the longest path of a load (verified after the loop) */
    mine[d] = dt_crc32c(0, buf + dsp[rank], (size_t)cnt[rank] * sizeof(float));
    t_crc += dt_time_now() - tp, tp = dt_time_now();
    int share = size > 1 && full_all[gi ? 1 : 0] && whole_transposed(&lay->tensors[ti], &f, b, nb);
    if (!share) MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, cnt, dsp, MPI_FLOAT, comm);
    t_ag += dt_time_now() - tp;
    if (share) { /* (the unpack thread of d - 1 uses another stage buffer) */
      tp = dt_time_now();
      if (running) pthread_join(th, NULL);
      running = 0;
      transpose_share(comm, size, &f, buf + dsp[rank], lo, hi, local + dt_ckpt__local_index(&lay->tensors[ti], &b[0], 0, 0),
                      b[0].src->ld);
      slot_release(&R); /* a whole Conv1D weight is never read in place */
      t_ag += dt_time_now() - tp;
      continue;
    }
    tp = dt_time_now();
    if (running) pthread_join(th, NULL); /* the previous tensor's unpack (it used another slot) */
    running = 0;
    t_un += dt_time_now() - tp;
    job[d & 1] = (job_t){lay, ti, kst[d] >= 0 ? nb : 0, (gi ? a->optim : a->model).full, kst[d] >= 0, f, buf, b, local, &R};
    if (job[d & 1].nb == 0 || pthread_create(&th, NULL, unpack_thread, &job[d & 1]) != 0) unpack_thread(&job[d & 1]);
    else running = 1;
  }
  tp = dt_time_now();
  if (running) pthread_join(th, NULL);
  running = 0;
  t_un += dt_time_now() - tp;
  /* Checksums: every rank's CRC of its part of every dataset in one allgather, combined in rank
   * order; the same verdict on every rank (on a mismatch the arenas hold unspecified data). */
  MPI_Allgather(mine, D.n_ds, MPI_UINT32_T, crcs, D.n_ds, MPI_UINT32_T, comm);
  for (int d = 0; d < D.n_ds; d++) {
    fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[d % lay->n_tensors]);
    hsize_t unit = f.ndim == 2 ? f.dims[1] : 1, lo, hi;
    uint32_t crc = 0;
    for (int r = 0; r < size; r++) {
      dt_ckpt__split_first(&f, r, size, &lo, &hi);
      crc = r == 0 ? crcs[d] : dt_crc32c_combine(crc, crcs[(size_t)r * D.n_ds + d], (uint64_t)((hi - lo) * unit) * sizeof(float));
    }
    if (crc != stored[d]) {
      st = DT_ERR(DT_ERR_CKPT, "%s: %s: CRC32C mismatch: stored 0x%08x, data 0x%08x (corrupt file)", path, D.names[d], stored[d], crc);
      goto out;
    }
  }
  dt_ckpt__time(comm, "read: tensors", t0);
  dt_ckpt__time(comm, own_ok ? (fd_direct >= 0 ? "  read (own, O_DIRECT)" : "  read (own, buffered)") : "  H5Dread",
                dt_time_now() - t_rd);
  dt_ckpt__time(comm, "  crc", dt_time_now() - t_crc);
  dt_ckpt__time(comm, "  allgather", dt_time_now() - t_ag);
  dt_ckpt__time(comm, "  unpack wait", dt_time_now() - t_un);

  /* Phase 4: the rest of the state. */
  st = read_state_data(file, &s, dxpl, path);
  st = dt_ckpt__agree(comm, st);

out:
  if (reading) {
    pthread_mutex_lock(&R.mu);
    R.stop = 1;
    pthread_cond_broadcast(&R.cv);
    pthread_mutex_unlock(&R.mu);
    pthread_join(rth, NULL);
  }
  if (running) pthread_join(th, NULL);
  if (fd_buf >= 0) close(fd_buf);
  if (fd_direct >= 0) close(fd_direct);
  dt_ckpt__io_buf_free(bounce, DT_CKPT_CHUNK);
  free(own);
  free(foff);
  dt_ckpt__dsets_free(&D);
  if (file >= 0) H5Fclose(file);
  if (fapl >= 0) H5Pclose(fapl);
  if (dxpl >= 0) H5Pclose(dxpl);
  dt_ckpt_ranges_free(&rg[0]);
  dt_ckpt_ranges_free(&rg[1]);
  for (int k = 0; k < NSLOT; k++) dt_ckpt__io_buf_free(stg[k], stg_bytes);
  for (int k = 0; k < 4; k++) free(bx[k]);
  free(stored);
  free(crcs);
  free(mine);
  free(cnt);
  free(dsp);
  free(kst);
  free(rd_ready);
  free(rd_err);
  if (st == DT_OK && st_out) *st_out = s;
  else dt_ckpt_state_free(&s);
  return st;
}
