/* Checkpoint internals shared by ckpt_write.c and ckpt_read.c: status agreement over the
 * communicator, HDF5 error text and attributes, the ranges (boxes of global tensors a rank holds)
 * and their file boxes (the arenas' layout is the Hugging Face file's, so the mapping is 1:1). */
#include "ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "timer.h"
#include "watchdog.h"

static const char *group_path[DT_CKPT_GROUPS] = {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"};

/* ---- shared helpers ---------------------------------------------------------------------- */

static const char *fault_phase;
static int fault_rank = -1;

void dt_ckpt__fault(int rank, const char *phase) {
  fault_rank = rank;
  fault_phase = phase;
}

int dt_ckpt__faulty(MPI_Comm comm, const char *phase) {
  int rank; /* the world rank: with node leaders the I/O runs on a sub-communicator */
  (void)comm;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return fault_phase && rank == fault_rank && strcmp(fault_phase, phase) == 0;
}

int dt_ckpt__own_io(void) {
  const char *e = getenv("DTRAIN_CKPT_DIRECT");
  return !e || strcmp(e, "0") != 0;
}

int dt_ckpt__open_direct(const char *path, int flags) {
  const char *e = getenv("DTRAIN_CKPT_DIRECT");
  if (e && !strcmp(e, "buffered")) return -1; /* own descriptors without O_DIRECT (tests the fallback) */
#ifdef O_DIRECT
  return open(path, flags | O_CLOEXEC | O_DIRECT);
#else
  (void)path, (void)flags;
  return -1;
#endif
}

/* The staging buffers of own-descriptor I/O. An O_DIRECT request is built from the buffer's
 * physical pages and a virtio/NVMe request takes a bounded number of segments (here 254): from
 * scattered 4 KiB pages a 16 MiB read became ~1 MiB device requests, from 2 MiB huge pages it
 * is split only at the device's largest request (4 MiB here), like the page cache's readahead.
 * So: an anonymous mapping aligned to 2 MiB, asked for huge pages, faulted in at once. */
#define IO_HUGE (2u << 20)
void *dt_ckpt__io_buf(size_t n) {
  size_t len = n + IO_HUGE;
  char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  char *a = (char *)(((uintptr_t)p + IO_HUGE - 1) / IO_HUGE * IO_HUGE); /* trim to [a, a + n) */
  if (a > p) munmap(p, (size_t)(a - p));
  if (p + len > a + n) munmap(a + n, (size_t)(p + len - (a + n)));
#ifdef MADV_HUGEPAGE
  (void)madvise(a, n, MADV_HUGEPAGE); /* best effort: THP off or no huge pages free still works */
#endif
#ifdef MADV_POPULATE_WRITE
  (void)madvise(a, n, MADV_POPULATE_WRITE);
#endif
  return a;
}

void dt_ckpt__io_buf_free(void *p, size_t n) {
  if (p) munmap(p, n);
}

size_t dt_ckpt__dio_align(int fd) {
  if (fd < 0) return 0;
#ifdef STATX_DIOALIGN
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_mem_align &&
      sx.stx_dio_offset_align)
    return sx.stx_dio_mem_align > sx.stx_dio_offset_align ? sx.stx_dio_mem_align : sx.stx_dio_offset_align;
#endif
  return DT_CKPT_ALIGN; /* the kernel does not say: a page works wherever O_DIRECT does */
}

/* Read up to n bytes at off; returns the bytes read (fewer only at end of file), -1 on error. */
ssize_t dt_ckpt__pread_full(int fd, void *buf, size_t n, uint64_t off) {
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
    if (span > DT_CKPT_CHUNK) { /* the bounce buffer's size: never, by n's bound above */
      errno = EOVERFLOW;
      return -1;
    }
    ssize_t got = fd_direct >= 0 ? dt_ckpt__pread_full(fd_direct, bounce, span, a0) : -1;
    if (got >= (ssize_t)(pre + n)) {
      memcpy(dst, bounce + pre, n);
    } else if ((errno = 0, dt_ckpt__pread_full(fd_buf, dst, n, off)) != (ssize_t)n) {
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
int dt_ckpt__read_own(int fd_direct, int fd_buf, char *bounce, uint64_t off, size_t len, char *dst, size_t *al) {
  size_t a = *al;
  if (fd_direct < 0 || a == 0 || ((uintptr_t)dst - off) % a != 0 || len < 2 * a)
    return read_bounce(fd_direct, fd_buf, bounce, off, len, dst);
  size_t head = (size_t)((a - off % a) % a), mid = (len - head) / a * a;
  if (head && read_bounce(fd_direct, fd_buf, bounce, off, head, dst) < 0) return -1;
  for (size_t i = head; i < head + mid;) {
    size_t n = head + mid - i < DT_CKPT_CHUNK ? head + mid - i : DT_CKPT_CHUNK;
    ssize_t got = dt_ckpt__pread_full(fd_direct, dst + i, n, off + i);
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

/* ---- node leaders ------------------------------------------------------------------------- */

dt_status_t dt_ckpt__node_comm(MPI_Comm comm, MPI_Comm *node) {
  const char *w = getenv("DTRAIN_CKPT_WRITERS");
  int rank, k = w && !strcmp(w, "all") ? 1 : w && atoi(w) > 0 ? atoi(w) : 0;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  if (k > 0) DT_MPI_CHECK(MPI_Comm_split(comm, rank / k, rank, node)); /* test hook: groups of k consecutive ranks */
  else DT_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, node));
  return DT_OK;
}

dt_status_t dt_ckpt__node_leaders(MPI_Comm comm, const dt_ckpt_arenas_t *a, MPI_Comm *lead, MPI_Comm *node, int *use) {
  *lead = *node = MPI_COMM_NULL;
  *use = 0;
  const char *w = getenv("DTRAIN_CKPT_WRITERS");
  int full = a->model.full && (!a->m || a->optim.full), all_full = 0, rank, size;
  DT_MPI_CHECK(dt_wd_allreduce(&full, &all_full, 1, MPI_INT, MPI_MIN, comm, "allreduce (checkpoint)"));
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DT_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (!all_full || size == 1 || (w && !strcmp(w, "all"))) return DT_OK;
  DT_TRY(dt_ckpt__node_comm(comm, node));
  int nrank, nsize, nodes_max = 0;
  DT_MPI_CHECK(MPI_Comm_rank(*node, &nrank));
  DT_MPI_CHECK(MPI_Comm_size(*node, &nsize));
  DT_MPI_CHECK(dt_wd_allreduce(&nsize, &nodes_max, 1, MPI_INT, MPI_MAX, comm, "allreduce (checkpoint)"));
  if (nodes_max == 1) /* one rank per node everywhere: every rank is a leader, nothing to gain */
    return dt_ckpt__node_leaders_free(lead, node);
  DT_MPI_CHECK(MPI_Comm_split(comm, nrank == 0 ? 0 : MPI_UNDEFINED, rank, lead));
  *use = 1;
  return DT_OK;
}

dt_status_t dt_ckpt__node_leaders_free(MPI_Comm *lead, MPI_Comm *node) {
  dt_status_t st = DT_OK;
  if (*lead != MPI_COMM_NULL) DT_MPI_KEEP(st, MPI_Comm_free(lead));
  if (*node != MPI_COMM_NULL) DT_MPI_KEEP(st, MPI_Comm_free(node));
  return st;
}

dt_status_t dt_ckpt__quiet_barrier(MPI_Comm comm) {
  /* test and sleep 0.2 ms: a waiting rank leaves its core to the I/O */
  DT_MPI_CHECK(dt_wd_barrier(comm, "barrier (checkpoint)", 1));
  return DT_OK;
}

/* Phase timer for bench/ckpt_io.sh: with DTRAIN_CKPT_TIMES set, rank 0 of comm prints
 * "# ckpt-time <what> <seconds>" to stderr (seconds since `t0`); a no-op otherwise. */
void dt_ckpt__time(MPI_Comm comm, const char *what, double t0) {
  static int on = -1;
  if (on < 0) on = getenv("DTRAIN_CKPT_TIMES") != NULL;
  int rank;
  MPI_Comm_rank(comm, &rank);
  if (on && rank == 0) fprintf(stderr, "# ckpt-time %-16s %8.3f s\n", what, dt_time_now() - t0);
}

/* CPU seconds (user + system, all threads) this process has used: with dt_ckpt__time, shows
 * whether a load waits for the disk or for the cores (4 ranks on 2 cores: for the cores). */
double dt_ckpt__cpu(void) {
  struct rusage u;
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

MPI_Comm dt_ckpt__comm(const void *mpi_comm) { return mpi_comm ? *(const MPI_Comm *)mpi_comm : MPI_COMM_WORLD; }

dt_status_t dt_ckpt__agree(MPI_Comm comm, dt_status_t st) {
  int rank, mine, first;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  mine = st != DT_OK ? rank : INT_MAX;
  DT_MPI_CHECK(dt_wd_allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, "allreduce (checkpoint)"));
  if (first == INT_MAX) return DT_OK;
  struct { int st; char msg[960]; } m;
  memset(&m, 0, sizeof m);
  if (rank == first) {
    m.st = st;
    snprintf(m.msg, sizeof m.msg, "%s", dt_err_msg());
  }
  DT_MPI_CHECK(dt_wd_bcast(&m, (int)sizeof m, MPI_BYTE, first, comm, "bcast (checkpoint)"));
  if (rank != first) DT_ERR((dt_status_t)m.st, "rank %d: %s", first, m.msg);
  return (dt_status_t)m.st;
}

static herr_t h5walk(unsigned n, const H5E_error2_t *e, void *data) {
  char **s = data; /* s[0] innermost, s[1] outermost */
  if (n == 0) snprintf(s[0], 256, "%s", e->desc ? e->desc : "");
  snprintf(s[1], 256, "%s", e->desc ? e->desc : "");
  return 0;
}

const char *dt_ckpt__h5msg(char *buf, size_t n) {
  char inner[256] = "", outer[256] = "";
  char *s[2] = {inner, outer};
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5walk, s);
  H5Eclear2(H5E_DEFAULT);
  if (strcmp(inner, outer) == 0) snprintf(buf, n, "%s", inner[0] ? inner : "unknown HDF5 error");
  else snprintf(buf, n, "%s: %s", outer, inner);
  return buf;
}

void dt_ckpt__h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

void dt_ckpt__mpio_plists(MPI_Comm comm, hid_t *fapl, hid_t *dxpl) {
  *fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(*fapl, comm, MPI_INFO_NULL);
  *dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(*dxpl, H5FD_MPIO_COLLECTIVE);
  /* Collective HDF5 calls, independent MPI-IO underneath: every rank's part of a dataset is one
   * contiguous run of MBs, which two-phase buffering only reshuffles (measured: 4 ranks on 2
   * cores 2.3 s instead of 4-5 s in H5Dwrite). DTRAIN_CKPT_TWO_PHASE=1 restores two-phase I/O. */
  if (!getenv("DTRAIN_CKPT_TWO_PHASE")) H5Pset_dxpl_mpio_collective_opt(*dxpl, H5FD_MPIO_INDIVIDUAL_IO);
}

/* Record an HDF5 failure about object `obj` of file `path`. */
dt_status_t dt_ckpt__h5err(const char *path, const char *obj, const char *what) {
  char m[600];
  return DT_ERR(DT_ERR_HDF5, "%s: %s: %s (HDF5: %s)", path, obj, what, dt_ckpt__h5msg(m, sizeof m));
}

/* ---- ranges ------------------------------------------------------------------------------ */

int dt_ckpt__is_wte(const dt_tensor_t *t) { return strcmp(t->name, "wte.weight") == 0; }
/* Rows of the global tensor in our layout as far as the file is concerned (wte: true V). */
int dt_ckpt__hf_rows(const dt_layout_t *lay, const dt_tensor_t *t) { return dt_ckpt__is_wte(t) ? lay->d.V : dt_tensor_grows(t); }

/* File shape: 1-D (cols); 2-D (rows, cols), our layout (wte: V rows); 4-D convolution weights
 * (OC, C, KH, KW) as torchvision's. Returns ndim. */
static int file_shape(const dt_layout_t *lay, const dt_tensor_t *t, hsize_t dims[4]) {
  dims[1] = dims[2] = dims[3] = 1;
  if (t->ndim == 1) {
    dims[0] = (hsize_t)dt_tensor_gcols(t);
    return 1;
  }
  dims[0] = (hsize_t)dt_ckpt__hf_rows(lay, t);
  dims[1] = (hsize_t)dt_tensor_gcols(t);
  if (t->ndim != 4 || t->kh < 1 || t->kw < 1) return 2;
  dims[1] /= (hsize_t)t->kh * (hsize_t)t->kw;
  dims[2] = (hsize_t)t->kh;
  dims[3] = (hsize_t)t->kw;
  return 4;
}

dt_ckpt_arenas_t dt_ckpt_arenas_full(float *params, float *m, float *v) {
  dt_ckpt_arenas_t a;
  memset(&a, 0, sizeof a);
  a.params = params, a.m = m, a.v = v;
  a.model.full = a.optim.full = 1;
  return a;
}

dt_status_t dt_ckpt_ranges_add(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, dt_ckpt_range_t r) {
  if (r.tensor < 0 || r.tensor >= lay->n_tensors)
    return DT_ERR(DT_ERR_ARG, "checkpoint range: tensor index %d out of [0, %d)", r.tensor, lay->n_tensors);
  const dt_tensor_t *t = &lay->tensors[r.tensor];
  if (r.row0 < 0 || r.row0 >= r.row1 || r.row1 > dt_ckpt__hf_rows(lay, t) || r.col0 < 0 || r.col0 >= r.col1 ||
      r.col1 > dt_tensor_gcols(t) || r.ld < (size_t)(r.col1 - r.col0))
    return DT_ERR(DT_ERR_ARG, "checkpoint range: %s: box rows [%d,%d) cols [%d,%d) ld %zu outside (%d, %d)",
                  t->name, r.row0, r.row1, r.col0, r.col1, r.ld, dt_ckpt__hf_rows(lay, t), dt_tensor_gcols(t));
  dt_ckpt_range_t *nr = realloc(rs->r, (size_t)(rs->n + 1) * sizeof *nr);
  if (!nr) return DT_ERR(DT_ERR_NOMEM, "checkpoint ranges: out of memory");
  rs->r = nr;
  rs->r[rs->n++] = r;
  rs->full = 0;
  return DT_OK;
}

dt_status_t dt_ckpt_ranges_add_flat(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, size_t begin, size_t end) {
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    size_t cols = (size_t)t->cols, n = (size_t)dt_ckpt__hf_rows(lay, t) * cols;
    size_t lo = begin > t->offset ? begin - t->offset : 0, hi = end > t->offset ? end - t->offset : 0;
    if (hi > n) hi = n;
    while (lo < hi) { /* partial first row, full rows, partial last row */
      size_t r = lo / cols, c = lo % cols, stop;
      dt_ckpt_range_t b = {.tensor = i, .row0 = (int)r, .col0 = (int)c, .ld = cols};
      if (c != 0 || hi - lo < cols) { /* within one row */
        stop = (r + 1) * cols < hi ? (r + 1) * cols : hi;
        b.row1 = (int)r + 1, b.col1 = (int)(c + (stop - lo));
      } else {
        stop = hi / cols * cols;
        b.row1 = (int)(stop / cols), b.col1 = (int)cols;
      }
      b.off = t->offset + lo - begin;
      DT_TRY(dt_ckpt_ranges_add(rs, lay, b));
      lo = stop;
    }
  }
  return DT_OK;
}

dt_status_t dt_ckpt_ranges_add_shards(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, int with_replicated,
                                      int with_tied) {
  rs->full = 0;
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    if (t->absent || (t->tied_copy && !with_tied)) continue;
    int hr = dt_ckpt__hf_rows(lay, t);
    if (t->split == DT_SPLIT_NONE) {
      if (!with_replicated) continue;
      DT_TRY(dt_ckpt_ranges_add(rs, lay, (dt_ckpt_range_t){.tensor = i, .row0 = 0, .row1 = hr, .col0 = 0,
                                                           .col1 = dt_tensor_gcols(t), .off = t->offset, .ld = (size_t)t->cols}));
      continue;
    }
    int rows = t->split == DT_SPLIT_ROWS, bl = (rows ? t->rows : t->cols) / t->nblk;
    for (int b = 0; b < t->nblk; b++) {
      int g = t->g0 + b * t->gstride;
      dt_ckpt_range_t r = {.tensor = i, .row0 = 0, .row1 = hr, .col0 = 0, .col1 = dt_tensor_gcols(t), .ld = (size_t)t->cols};
      if (rows) {
        r.row0 = g;
        r.row1 = g + bl < hr ? g + bl : hr; /* wte: padded vocab rows are not in the file */
        r.off = t->offset + (size_t)b * bl * (size_t)t->cols;
        if (r.row0 >= r.row1) continue;
      } else {
        r.col0 = g;
        r.col1 = g + bl;
        r.off = t->offset + (size_t)b * bl;
      }
      DT_TRY(dt_ckpt_ranges_add(rs, lay, r));
    }
  }
  return DT_OK;
}

dt_status_t dt_ckpt_ranges_clip(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, const dt_ckpt_ranges_t *in,
                                size_t begin, size_t end) {
  rs->full = 0;
  for (int k = 0; k < in->n; k++) {
    const dt_ckpt_range_t *b = &in->r[k];
    size_t w = (size_t)(b->col1 - b->col0);
    /* rows of the box whose whole width lies inside [begin, end): one box (stride ld kept) */
    int r = b->row0;
    while (r < b->row1) {
      size_t a = b->off + (size_t)(r - b->row0) * b->ld, z = a + w;
      if (z <= begin || a >= end) { r++; continue; }
      if (a >= begin && z <= end) { /* a run of whole rows */
        int r1 = r + 1;
        while (r1 < b->row1 && b->off + (size_t)(r1 - b->row0) * b->ld + w <= end) r1++;
        DT_TRY(dt_ckpt_ranges_add(rs, lay, (dt_ckpt_range_t){.tensor = b->tensor, .row0 = r, .row1 = r1, .col0 = b->col0,
                                                             .col1 = b->col1, .off = a - begin, .ld = b->ld}));
        r = r1;
        continue;
      }
      size_t ca = a > begin ? a : begin, cz = z < end ? z : end; /* a row cut by a bound */
      DT_TRY(dt_ckpt_ranges_add(rs, lay, (dt_ckpt_range_t){.tensor = b->tensor, .row0 = r, .row1 = r + 1,
                                                           .col0 = b->col0 + (int)(ca - a), .col1 = b->col0 + (int)(cz - a),
                                                           .off = ca - begin, .ld = b->ld}));
      r++;
    }
  }
  return DT_OK;
}

void dt_ckpt_ranges_free(dt_ckpt_ranges_t *rs) {
  free(rs->r);
  rs->r = NULL;
  rs->n = 0;
}

/* Whole tensors (load into full arenas) or this rank's 1/P of each tensor's first file
 * dimension (save from full arenas; contiguous in the file). */
dt_status_t dt_ckpt__ranges_resolve(const dt_layout_t *lay, const dt_ckpt_ranges_t *in, int split, int rank, int size,
                                  dt_ckpt_ranges_t *out) {
  memset(out, 0, sizeof *out);
  if (!in->full) {
    for (int i = 0; i < in->n; i++) DT_TRY(dt_ckpt_ranges_add(out, lay, in->r[i]));
    return DT_OK;
  }
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    int rows = dt_ckpt__hf_rows(lay, t), cols = t->cols;
    dt_ckpt_range_t b = {.tensor = i, .row0 = 0, .row1 = rows, .col0 = 0, .col1 = cols, .ld = (size_t)cols};
    if (split) {
      int n = t->ndim == 1 ? cols : rows;
      int a = (int)((long long)n * rank / size), z = (int)((long long)n * (rank + 1) / size);
      if (a == z) continue;
      if (t->ndim == 1) b.col0 = a, b.col1 = z;
      else b.row0 = a, b.row1 = z;
    }
    b.off = t->offset + (size_t)b.row0 * (size_t)cols + (size_t)b.col0;
    DT_TRY(dt_ckpt_ranges_add(out, lay, b));
  }
  return DT_OK;
}

/* A box in file coordinates: rows [r0, r1) x cols [c0, c1) of the tensor (the file's layout is ours). */

fbox_t dt_ckpt__to_file(const dt_ckpt_range_t *r) {
  return (fbox_t){(hsize_t)r->row0, (hsize_t)r->row1, (hsize_t)r->col0, (hsize_t)r->col1, r};
}

static int fbox_cmp(const void *a, const void *b) {
  const fbox_t *x = a, *y = b;
  return x->c0 < y->c0 ? -1 : x->c0 > y->c0;
}

/* Local float for file element (i, j) of box b. */
size_t dt_ckpt__local_index(const fbox_t *b, hsize_t i, hsize_t j) {
  const dt_ckpt_range_t *r = b->src;
  return r->off + (i - (size_t)r->row0) * r->ld + (j - (size_t)r->col0);
}

/* ---- HDF5 attribute helpers -------------------------------------------------------------- */

herr_t dt_ckpt__attr_put(hid_t loc, const char *name, hid_t ftype, hid_t mtype, const void *val) {
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t e = a < 0 ? -1 : H5Awrite(a, mtype, val);
  if (a >= 0) H5Aclose(a);
  H5Sclose(sp);
  return e;
}

/* One value: an attribute of any other size is an error (a file with an array there would
 * otherwise be read past val; found by tests/fuzzing/fuzz_ckpt.c). */
herr_t dt_ckpt__attr_get(hid_t loc, const char *name, hid_t mtype, void *val) {
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return -1;
  hid_t sp = H5Aget_space(a);
  herr_t e = sp >= 0 && H5Sget_simple_extent_npoints(sp) == 1 ? H5Aread(a, mtype, val) : -1;
  if (sp >= 0) H5Sclose(sp);
  H5Aclose(a);
  return e;
}

herr_t dt_ckpt__attr_put_str(hid_t loc, const char *name, const char *s) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, strlen(s) + 1);
  H5Tset_strpad(t, H5T_STR_NULLTERM);
  herr_t e = dt_ckpt__attr_put(loc, name, t, t, s);
  H5Tclose(t);
  return e;
}

herr_t dt_ckpt__attr_get_str(hid_t loc, const char *name, char *buf, size_t n) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, n);
  H5Tset_strpad(t, H5T_STR_NULLTERM);
  herr_t e = dt_ckpt__attr_get(loc, name, t, buf);
  H5Tclose(t);
  buf[n - 1] = '\0';
  return e;
}

/* ---- file-space helpers ------------------------------------------------------------------- */


fshape_t dt_ckpt__fshape(const dt_layout_t *lay, const dt_tensor_t *t) {
  fshape_t f;
  f.ndim = file_shape(lay, t, f.dims);
  f.FR = f.ndim == 1 ? 1 : f.dims[0];
  f.FC = f.ndim == 1 ? f.dims[0] : f.dims[1] * f.dims[2] * f.dims[3];
  return f;
}

/* Flat columns [c0, c1) of row r of a 4-D (OC, C, KH, KW) dataset (a ZeRO shard's bound inside a
 * convolution's filter): the hyperslabs of a partial kernel row, whole kernel rows of a channel,
 * whole channels, ..., in file order; the first with *op, the others OR. */
static herr_t select_flat4(hid_t sp, const fshape_t *f, hsize_t r, hsize_t c0, hsize_t c1, H5S_seloper_t *op) {
  const hsize_t KH = f->dims[2], KW = f->dims[3], K2 = KH * KW;
  while (c0 < c1) {
    const hsize_t left = c1 - c0, kh = c0 % K2 / KW, kw = c0 % KW;
    hsize_t start[4] = {r, c0 / K2, kh, kw}, count[4] = {1, 1, 1, 1};
    if (kw != 0 || left < KW) count[3] = KW - kw < left ? KW - kw : left;                  /* in a kernel row */
    else if (kh != 0 || left < K2) count[2] = KH - kh < left / KW ? KH - kh : left / KW, count[3] = KW; /* rows */
    else count[1] = left / K2, count[2] = KH, count[3] = KW;                                /* channels */
    if (H5Sselect_hyperslab(sp, *op, start, NULL, count, NULL) < 0) return -1;
    *op = H5S_SELECT_OR;
    c0 += count[1] * count[2] * count[3];
  }
  return 0;
}

/* Select file box b (in the (FR, FC) view) in space sp, SET or OR. */
herr_t dt_ckpt__select_box(hid_t sp, const fshape_t *f, const fbox_t *b, H5S_seloper_t op) {
  hsize_t start[4] = {b->r0, b->c0, 0, 0}, count[4] = {b->r1 - b->r0, b->c1 - b->c0, 1, 1};
  if (f->ndim == 1) start[0] = b->c0, count[0] = b->c1 - b->c0;
  if (f->ndim == 4 && (b->c0 != 0 || b->c1 != f->FC)) { /* part of a row: its pieces, row by row */
    for (hsize_t r = b->r0; r < b->r1; r++)
      if (select_flat4(sp, f, r, b->c0, b->c1, &op) < 0) return -1;
    return 0;
  }
  if (f->ndim == 4) {
    start[1] = 0;
    for (int k = 1; k < 4; k++) count[k] = f->dims[k];
  }
  return H5Sselect_hyperslab(sp, op, start, NULL, count, NULL);
}

/* Select file rows [lo, hi) of the (FR, FC) view (1-D tensors: elements [lo, hi)), or nothing. */
herr_t dt_ckpt__select_rows(hid_t sp, const fshape_t *f, hsize_t lo, hsize_t hi) {
  if (hi <= lo) return H5Sselect_none(sp);
  fbox_t b = {lo, hi, 0, f->FC, NULL};
  if (f->ndim == 1) b = (fbox_t){0, 1, lo, hi, NULL};
  return dt_ckpt__select_box(sp, f, &b, H5S_SELECT_SET);
}

/* This rank's share [*a, *z) of the first file dimension when P ranks split it evenly. */
void dt_ckpt__split_first(const fshape_t *f, int rank, int size, hsize_t *a, hsize_t *z) {
  hsize_t n = f->dims[0];
  *a = n * (hsize_t)rank / (hsize_t)size;
  *z = n * (hsize_t)(rank + 1) / (hsize_t)size;
}

/* Boxes of ranges rs that belong to tensor ti, as file boxes sorted by first column. */
int dt_ckpt__boxes_of(const dt_ckpt_ranges_t *rs, int ti, fbox_t *out) {
  int n = 0;
  for (int i = 0; i < rs->n; i++)
    if (rs->r[i].tensor == ti) out[n++] = dt_ckpt__to_file(&rs->r[i]);
  qsort(out, (size_t)n, sizeof *out, fbox_cmp);
  return n;
}

size_t dt_ckpt__max_tensor(const dt_layout_t *lay) {
  size_t m = 1;
  for (int i = 0; i < lay->n_tensors; i++) {
    size_t n = (size_t)dt_ckpt__hf_rows(lay, &lay->tensors[i]) * (size_t)dt_tensor_gcols(&lay->tensors[i]);
    if (n > m) m = n;
  }
  return m;
}


dt_status_t dt_ckpt__dsets_init(dsets_t *D, const dt_layout_t *lay, int groups) {
  D->n_ds = lay->n_tensors * groups;
  D->ds = malloc((size_t)D->n_ds * sizeof *D->ds);
  D->names = malloc((size_t)D->n_ds * sizeof *D->names);
  D->bytes = malloc((size_t)D->n_ds * sizeof *D->bytes);
  if (!D->ds || !D->names || !D->bytes) return DT_ERR(DT_ERR_NOMEM, "checkpoint: out of memory");
  for (int d = 0; d < D->n_ds; d++) {
    const dt_tensor_t *t = &lay->tensors[d % lay->n_tensors];
    fshape_t f = dt_ckpt__fshape(lay, t);
    D->ds[d] = -1;
    snprintf(D->names[d], sizeof D->names[d], "%s/%s", group_path[d / lay->n_tensors], t->name);
    D->bytes[d] = f.FR * f.FC * sizeof(float);
  }
  return DT_OK;
}

void dt_ckpt__dsets_free(dsets_t *D) {
  for (int d = 0; D->ds && d < D->n_ds; d++)
    if (D->ds[d] >= 0) H5Dclose(D->ds[d]);
  free(D->ds);
  free(D->names);
  free(D->bytes);
}

