/* Checkpoint read: collective open, marker/format/shape checks, then the datasets in pieces of
 * rows through a window of shared memory per node: each rank reads its share of a piece (a reader
 * thread, O_DIRECT), node leaders exchange their nodes' shares, every rank copies its boxes out
 * (the file's layout is the arena's), and the CRC32C of every share is combined and verified. */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_int.h"
#include "crc32c.h"
#include "timer.h"
#include "watchdog.h"

#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#endif

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
    if (span > DT_CKPT_CHUNK) { /* the bounce buffer's size: never, by n's bound above */
      errno = EOVERFLOW;
      return -1;
    }
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

/* ---- the data phase ------------------------------------------------------------------------ */

/* Datasets move in pieces of whole rows of their first file dimension (elements for 1-D tensors)
 * of at most PIECE bytes (one row when a row is larger). Each piece passes through one of NW
 * slots of a window that the ranks of a node share: every rank of the node reads its share of
 * the piece into the slot, the node leaders exchange their nodes' shares (more than one node),
 * and every rank copies its boxes out of the slot into its arenas.
 * The ranks of a node never send each other a tensor: each byte is read once per node and copied
 * once per rank (an allgather through MPI moved 1.5-3.5 GB/s on this 2-core VM). */
#define PIECE (8u << 20)
/* window slots: the reader may be NW - 1 pieces ahead of the copies. Every slot is fresh memory
 * that the kernel zeroes on first touch; 8 instead of 16 (medians of 7, alternated): 4 ranks
 * 1.53 s instead of 1.78, 2 ranks 0.97 instead of 1.01, 1 rank the same; 4 was slower at 1 and 2 */
#define NW 8

typedef struct {
  int d;          /* dataset */
  hsize_t r0, r1; /* its rows (first file dimension) */
} piece_t;

/* Rows of `unit` floats in a piece: as many as fit in PIECE bytes, at least one. */
static hsize_t rows_per_piece(hsize_t unit) {
  const hsize_t n = PIECE / (unit * sizeof(float));
  return n ? n : 1;
}

/* Rows [*a, *z) of [r0, r1) for part i of n. */
static void split_rows(hsize_t r0, hsize_t r1, int i, int n, hsize_t *a, hsize_t *z) {
  *a = r0 + (r1 - r0) * (hsize_t)i / (hsize_t)n;
  *z = r0 + (r1 - r0) * (hsize_t)(i + 1) / (hsize_t)n;
}

/* The window and the node layout (G nodes; node g has kof[g] ranks, who[g][j] their ranks in comm). */
typedef struct {
  char *base; /* the header (hdr_bytes), then NW slots of slot_bytes */
  size_t hdr_bytes, slot_bytes, bytes;
  atomic_int *read_done, *copied, *exch_done; /* in the header: per node member; one */
  int shared;       /* a shm mapping (else a private dt_ckpt__io_buf) */
  int g, j, G;      /* this rank's node and its index there; nodes */
  int *kof, *who;   /* kof[g]; who[first[g] + j] */
  int *first;       /* first[g]: offset of node g in who */
  MPI_Comm node, lead; /* this node's ranks; the node leaders (MPI_COMM_NULL elsewhere) */
} window_t;

/* Rows of piece p that member j of node g reads: the node's share, split over its members. */
static void share_of(const window_t *W, const piece_t *p, int g, int j, hsize_t *a, hsize_t *z) {
  hsize_t ga, gz;
  split_rows(p->r0, p->r1, g, W->G, &ga, &gz);
  split_rows(ga, gz, j, W->kof[g], a, z);
}

/* Piece i's rows in its slot, starting at the file offset's place in a page: file and slot then
 * agree modulo any direct-I/O alignment, so reads go from the device straight into the slot. */
static float *slot_rows(const window_t *W, int i, uint64_t off) {
  return (float *)(W->base + W->hdr_bytes + (size_t)(i % NW) * W->slot_bytes + off % DT_CKPT_ALIGN);
}

/* The node's ranks and threads meet through counters in the window's header: a waiter sleeps in
 * the kernel (futex, shared between processes) until another raises the counter, so ranks only
 * wait for what they need, not in lock step (with an MPI agreement per piece, 0.5-0.9 s of a
 * 4-rank GPT-2 124M load went to waiting). Counters only grow. */
static void wait_at_least(atomic_int *c, int want) {
  const dt_wd_op_t op = {.op = "wait for the node's ranks (shared-memory read window, checkpoint load)",
                         .comm = MPI_COMM_NULL, .comm_name = "node", .peer = -1};
  struct timespec tick = {0, 200000000}; /* 0.2 s: the watchdog's deadline is checked between waits */
  double t0 = dt_wd_now();
  for (int v; (v = atomic_load(c)) < want;) {
    syscall(SYS_futex, (int *)c, FUTEX_WAIT, v, dt_wd_on() ? &tick : NULL, NULL, 0);
    dt_wd_check(t0, &op);
  }
}

static void raise_to(atomic_int *c, int v) {
  atomic_store(c, v);
  syscall(SYS_futex, (int *)c, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Wait until every rank of the node has counter c[m] >= want. */
static void wait_node(const window_t *W, atomic_int *c, int want) {
  for (int m = 0; m < W->kof[W->g]; m++) wait_at_least(&c[m], want);
}

/* memcpy of floats into an arena with non-temporal stores: the ranks of a node write 1.5 GB each
 * that nothing reads before the first training step, so the stores skip reading the destination
 * lines into the cache first (on x86-64; elsewhere memcpy). */
static void copy_out(float *dst, const float *src, size_t n) {
#if defined(__x86_64__) || defined(__SSE2__)
  if (n < 64) {
    memcpy(dst, src, n * sizeof(float));
    return;
  }
  size_t head = ((16 - ((uintptr_t)dst & 15)) & 15) / sizeof(float); /* to a 16-byte boundary */
  for (size_t i = 0; i < head; i++) dst[i] = src[i];
  dst += head, src += head, n -= head;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128 a = _mm_loadu_ps(src + i), b = _mm_loadu_ps(src + i + 4), c = _mm_loadu_ps(src + i + 8),
           d = _mm_loadu_ps(src + i + 12);
    _mm_stream_ps(dst + i, a);
    _mm_stream_ps(dst + i + 4, b);
    _mm_stream_ps(dst + i + 8, c);
    _mm_stream_ps(dst + i + 12, d);
  }
  for (; i < n; i++) dst[i] = src[i];
  _mm_sfence();
#else
  memcpy(dst, src, n * sizeof(float));
#endif
}

/* Copy file rows [r0, r1) of a tensor (at `rows`, row length FC; 1-D tensors: elements
 * [r0, r1)) into this rank's boxes bx: plain copies, the file's layout being the arena's. */
static void unpack_rows(const fshape_t *f, const float *rows, hsize_t r0, hsize_t r1, const fbox_t *bx, int nb,
                        float *local) {
  for (int b = 0; b < nb; b++) {
    const fbox_t *x = &bx[b];
    if (f->ndim == 1) { /* the (1, n) view: the piece is a column range */
      hsize_t c0 = x->c0 > r0 ? x->c0 : r0, c1 = x->c1 < r1 ? x->c1 : r1;
      if (c1 > c0) copy_out(local + dt_ckpt__local_index(x, 0, c0), rows + (c0 - r0), c1 - c0);
      continue;
    }
    hsize_t i0 = x->r0 > r0 ? x->r0 : r0, i1 = x->r1 < r1 ? x->r1 : r1;
    if (i1 <= i0) continue;
    if (x->c0 == 0 && x->c1 == f->FC && x->src->ld == f->FC) { /* whole rows, contiguous in the arena too */
      copy_out(local + dt_ckpt__local_index(x, i0, 0), rows + (i0 - r0) * f->FC, (i1 - i0) * f->FC);
      continue;
    }
    for (hsize_t i = i0; i < i1; i++)
      copy_out(local + dt_ckpt__local_index(x, i, x->c0), rows + (i - r0) * f->FC + x->c0, x->c1 - x->c0);
  }
}

/* The node's window: shared memory (POSIX shm, created by the node leader, unlinked once every
 * rank has mapped it) when the node has several ranks, else private huge-page memory. On a
 * failure anywhere every rank takes a private window and acts as its own node. Collective. */
static dt_status_t window_open(MPI_Comm comm, size_t slot_bytes, window_t *W, const char *path) {
  int rank, size;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DT_MPI_CHECK(MPI_Comm_size(comm, &size));
  for (int attempt = 0; attempt < 2; attempt++) {
    if (attempt == 0) DT_TRY(dt_ckpt__node_comm(comm, &W->node));
    else DT_MPI_CHECK(MPI_Comm_split(comm, rank, 0, &W->node)); /* every rank alone */
    int nr, ns;
    DT_MPI_CHECK(MPI_Comm_rank(W->node, &nr));
    DT_MPI_CHECK(MPI_Comm_size(W->node, &ns));
    W->hdr_bytes = ((2 * (size_t)ns + 1) * sizeof(atomic_int) + DT_CKPT_ALIGN - 1) / DT_CKPT_ALIGN * DT_CKPT_ALIGN;
    W->slot_bytes = slot_bytes, W->bytes = W->hdr_bytes + NW * slot_bytes;
    int ok = 1;
    W->shared = ns > 1;
    if (!W->shared) {
      W->base = dt_ckpt__io_buf(W->bytes);
      ok = W->base != NULL;
    } else { /* the leader creates and sizes it; the others map it by name */
      static int serial;
      char name[64];
      snprintf(name, sizeof name, "/dtrain-ckpt-%ld-%d", (long)getpid(), serial++);
      int fd = -1;
      dt_status_t e = DT_OK; /* MPI failures: after the name is unlinked */
      if (nr == 0) {
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        ok = fd >= 0 && posix_fallocate(fd, 0, (off_t)W->bytes) == 0; /* ENOSPC now, not SIGBUS later */
      }
      DT_MPI_KEEP(e, dt_wd_bcast(name, sizeof name, MPI_CHAR, 0, W->node, "bcast (checkpoint load)"));
      DT_MPI_KEEP(e, dt_wd_bcast(&ok, 1, MPI_INT, 0, W->node, "bcast (checkpoint load)"));
      if (ok && nr != 0 && e == DT_OK) fd = shm_open(name, O_RDWR, 0);
      void *p = fd >= 0 ? mmap(NULL, W->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      if (fd >= 0) close(fd);
      ok = ok && p != MAP_FAILED;
      W->base = p == MAP_FAILED ? NULL : p;
      /* every rank has it mapped (or failed): the name can go */
      DT_MPI_KEEP(e, dt_wd_barrier(W->node, "barrier (checkpoint load)", 0));
      if (nr == 0) shm_unlink(name);
      DT_TRY(e);
    }
    int all = 0;
    DT_MPI_CHECK(dt_wd_allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm, "allreduce (checkpoint load)"));
    if (all) break;
    if (W->base) W->shared ? (void)munmap(W->base, W->bytes) : dt_ckpt__io_buf_free(W->base, W->bytes);
    W->base = NULL;
    DT_MPI_CHECK(MPI_Comm_free(&W->node));
    if (attempt == 1) return DT_ERR(DT_ERR_NOMEM, "%s: cannot map %zu bytes of staging memory", path, W->bytes);
    if (rank == 0) fprintf(stderr, "# checkpoint: no shared memory for the load (/dev/shm), ranks exchange through MPI\n");
  }
  /* The node layout: leaders' order gives the node index. */
  int nr, ns;
  DT_MPI_CHECK(MPI_Comm_rank(W->node, &nr));
  DT_MPI_CHECK(MPI_Comm_size(W->node, &ns));
  DT_MPI_CHECK(MPI_Comm_split(comm, nr == 0 ? 0 : MPI_UNDEFINED, rank, &W->lead));
  if (nr == 0) {
    DT_MPI_CHECK(MPI_Comm_rank(W->lead, &W->g));
    DT_MPI_CHECK(MPI_Comm_size(W->lead, &W->G));
  }
  DT_MPI_CHECK(dt_wd_bcast(&W->g, 1, MPI_INT, 0, W->node, "bcast (checkpoint load)"));
  DT_MPI_CHECK(dt_wd_bcast(&W->G, 1, MPI_INT, 0, W->node, "bcast (checkpoint load)"));
  W->j = nr;
  W->read_done = (atomic_int *)W->base, W->copied = W->read_done + ns, W->exch_done = W->copied + ns;
  for (int m = 0; nr == 0 && m < 2 * ns + 1; m++) atomic_init(&W->read_done[m], 0); /* fresh mappings are 0 already */
  DT_MPI_CHECK(dt_wd_barrier(W->node, "barrier (checkpoint load)", 0));
  int mine[2] = {W->g, W->j}, *all = malloc(2 * sizeof(int) * (size_t)size);
  W->kof = calloc((size_t)W->G, sizeof(int));
  W->first = calloc((size_t)W->G, sizeof(int));
  W->who = malloc(sizeof(int) * (size_t)size);
  if (!all || !W->kof || !W->first || !W->who) {
    free(all);
    return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path); /* (every rank: MPI would fail next) */
  }
  dt_status_t st = DT_OK;
  DT_MPI_KEEP(st, dt_wd_allgather(mine, 2, MPI_INT, all, 2, MPI_INT, comm, "allgather (checkpoint load)"));
  if (st != DT_OK) {
    free(all);
    return st;
  }
  for (int r = 0; r < size; r++) W->kof[all[2 * r]]++;
  for (int g = 1; g < W->G; g++) W->first[g] = W->first[g - 1] + W->kof[g - 1];
  for (int r = 0; r < size; r++) W->who[W->first[all[2 * r]] + all[2 * r + 1]] = r;
  free(all);
  return DT_OK;
}

static dt_status_t window_close(window_t *W) {
  dt_status_t st = DT_OK;
  if (W->base) W->shared ? (void)munmap(W->base, W->bytes) : dt_ckpt__io_buf_free(W->base, W->bytes);
  if (W->node != MPI_COMM_NULL) DT_MPI_KEEP(st, MPI_Comm_free(&W->node));
  if (W->lead != MPI_COMM_NULL) DT_MPI_KEEP(st, MPI_Comm_free(&W->lead));
  free(W->kof);
  free(W->first);
  free(W->who);
  memset(W, 0, sizeof *W);
  W->node = W->lead = MPI_COMM_NULL;
  return st;
}

/* The reader: a helper thread that reads this rank's share of every piece in order into the
 * window, as far ahead of the copies as the slots allow (piece i once every rank of the node has
 * copied piece i - NW out), and raises read_done. After a failed read it reads no more but still
 * marks the pieces, so no rank waits forever; the error is agreed on after the loop. It never
 * calls MPI or HDF5. */
typedef struct {
  int err, err_piece; /* errno of the first failed read (0 = none), its piece */
  const window_t *W;
  const piece_t *pc;
  const dsets_t *D;
  const uint64_t *foff;
  const hsize_t *unit;
  int n_pc, fd_direct, fd_buf;
  char *bounce;
  size_t dio_align; /* read_own's (0: bounce buffer only) */
} reader_t;

/* Read this rank's share of piece i (once its slot is free) and raise read_done. */
static void read_piece(reader_t *R, int i) {
  const window_t *W = R->W;
  wait_node(W, W->copied, i - NW + 1);
  if (!R->err) {
    const piece_t *pc = &R->pc[i];
    hsize_t a, z, u = R->unit[pc->d];
    share_of(W, pc, W->g, W->j, &a, &z);
    uint64_t off = R->foff[pc->d] + (uint64_t)a * u * sizeof(float);
    float *dst = slot_rows(W, i, R->foff[pc->d] + (uint64_t)pc->r0 * u * sizeof(float)) + (a - pc->r0) * u;
    size_t n = (size_t)(z - a) * u * sizeof(float);
    errno = 0;
    int e = 0;
    if (R->D->bytes[pc->d] < DT_CKPT_OWN_MIN) { /* small: from the page cache (WILLNEED'd) */
      if (n && pread_full(R->fd_buf, dst, n, off) != (ssize_t)n) e = errno ? errno : EIO;
    } else if (n && read_own(R->fd_direct, R->fd_buf, R->bounce, off, n, (char *)dst, &R->dio_align) < 0) {
      e = errno ? errno : EIO;
    }
    if (e) R->err = e, R->err_piece = i;
  }
  raise_to(&W->read_done[W->j], i + 1);
}

static void *reader_thread(void *p) {
  reader_t *R = p;
  for (int i = 0; i < R->n_pc; i++) read_piece(R, i);
  return NULL;
}

dt_status_t dt_ckpt_load(const void *mpi_comm, const char *path, const dt_layout_t *lay, const dt_ckpt_arenas_t *a,
                         dt_ckpt_state_t *st_out) {
  MPI_Comm comm = dt_ckpt__comm(mpi_comm);
  int rank, size;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DT_MPI_CHECK(MPI_Comm_size(comm, &size));
  dt_ckpt__h5_quiet();
  dt_ckpt_state_t s;
  memset(&s, 0, sizeof s);
  dt_ckpt_ranges_t rg[2];
  memset(rg, 0, sizeof rg);
  dsets_t D;
  memset(&D, 0, sizeof D);
  hid_t fapl = -1, dxpl = -1, file = -1;
  uint32_t *stored = NULL, *crcs = NULL, *mine = NULL; /* crcs: (size, n_pc) CRCs of every rank's shares */
  int *cnt = NULL, *dsp = NULL, n_pc = 0;
  fbox_t *bx = NULL;
  int fd_buf = -1, fd_direct = -1;
  uint64_t *foff = NULL;
  hsize_t *unit = NULL;
  char *bounce = NULL;
  piece_t *pc = NULL;
  window_t W;
  memset(&W, 0, sizeof W);
  W.node = W.lead = MPI_COMM_NULL;
  reader_t R;
  memset(&R, 0, sizeof R);
  pthread_t rth;
  int reading = 0; /* the reader thread runs (join it) */

  double t0 = dt_time_now(), cpu0 = dt_ckpt__cpu(), t_rd = 0, t_crc = 0, t_ag = 0, t_un = 0, tp;
  /* Phase 1 (local). */
  dt_status_t st = DT_OK;
  int optim = a->m != NULL;
  if ((a->m == NULL) != (a->v == NULL)) st = DT_ERR(DT_ERR_ARG, "%s: m and v must both be given", path);
  if (st == DT_OK) st = dt_ckpt__ranges_resolve(lay, &a->model, 0, rank, size, &rg[0]);
  if (st == DT_OK && optim) st = dt_ckpt__ranges_resolve(lay, &a->optim, 0, rank, size, &rg[1]);
  if (st == DT_OK) st = dt_ckpt__dsets_init(&D, lay, optim ? 3 : 1);
  size_t max_row = 1, max_ds = 1; /* bytes of the longest row (a slot holds one) and dataset */
  if (st == DT_OK) {
    stored = calloc((size_t)D.n_ds, sizeof *stored);
    foff = calloc((size_t)D.n_ds, sizeof *foff);
    unit = calloc((size_t)D.n_ds, sizeof *unit);
    bx = malloc((size_t)(rg[0].n > rg[1].n ? rg[0].n : rg[1].n) * sizeof(fbox_t) + 1);
    cnt = calloc((size_t)size, sizeof *cnt);
    dsp = calloc((size_t)size, sizeof *dsp);
    for (int d = 0; unit && d < D.n_ds; d++) { /* the pieces */
      fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[d % lay->n_tensors]);
      unit[d] = f.ndim == 2 ? f.dims[1] : 1;
      const hsize_t per = rows_per_piece(unit[d]);
      n_pc += (int)((f.dims[0] + per - 1) / per);
      if (unit[d] * sizeof(float) > max_row) max_row = unit[d] * sizeof(float);
      if (f.dims[0] * unit[d] * sizeof(float) > max_ds) max_ds = f.dims[0] * unit[d] * sizeof(float);
    }
    pc = malloc((size_t)(n_pc ? n_pc : 1) * sizeof *pc);
    for (int d = 0, i = 0; pc && d < D.n_ds; d++) {
      fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[d % lay->n_tensors]);
      const hsize_t per = rows_per_piece(unit[d]);
      for (hsize_t r = 0; r < f.dims[0]; r += per) pc[i++] = (piece_t){d, r, r + per < f.dims[0] ? r + per : f.dims[0]};
    }
    mine = calloc((size_t)(n_pc ? n_pc : 1), sizeof *mine);
    crcs = calloc((size_t)size * (size_t)(n_pc ? n_pc : 1), sizeof *crcs);
    if (!stored || !foff || !unit || !bx || !cnt || !dsp || !pc || !mine || !crcs)
      st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  }
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
  /* All datasets through our own descriptors at their file offsets (contiguous datasets, as ours
   * are), or, when that is switched off or some dataset has no offset, all through H5Dread (the
   * same choice on every rank: H5Dread is collective). O_DIRECT is each rank's own business. */
  int own_ok = dt_ckpt__own_io(), all = 0;
  for (int d = 0; own_ok && d < D.n_ds; d++) {
    haddr_t o = H5Dget_offset(D.ds[d]);
    own_ok = o != HADDR_UNDEF, foff[d] = (uint64_t)o;
  }
  if (own_ok) {
    fd_buf = open(path, O_RDONLY | O_CLOEXEC);
    fd_direct = dt_ckpt__open_direct(path, O_RDONLY);
    bounce = dt_ckpt__io_buf(DT_CKPT_CHUNK);
    own_ok = fd_buf >= 0 && bounce;
  }
  DT_MPI_KEEP(st, dt_wd_allreduce(&own_ok, &all, 1, MPI_INT, MPI_MIN, comm, "allreduce (checkpoint load)"));
  own_ok = all;
  /* The small datasets (biases, layernorms): ask for them all at once, so their reads overlap
   * instead of costing a round trip each (GPT-2 124M: 294 of them). */
  for (int d = 0; own_ok && d < D.n_ds; d++)
    if (D.bytes[d] < DT_CKPT_OWN_MIN) (void)posix_fadvise(fd_buf, (off_t)foff[d], (off_t)D.bytes[d], POSIX_FADV_WILLNEED);
  /* a slot: a piece (no more than the largest dataset: small models get a small window) */
  size_t piece = max_ds < PIECE ? max_ds : PIECE;
  dt_status_t sw = window_open(comm, (piece > max_row ? piece : max_row) + 2 * DT_CKPT_ALIGN, &W, path);
  if ((st = dt_ckpt__agree(comm, st != DT_OK ? st : sw)) != DT_OK) goto out;

  /* Phase 3: per piece: this rank's share read (reader thread) and checksummed, the node's shares
   * read, the leaders' exchange between nodes, this rank's boxes copied out. A failure is
   * recorded and the loop goes on (every rank must keep raising its counters), then agreed on. */
  if (own_ok) {
    R.W = &W, R.pc = pc, R.D = &D, R.foff = foff, R.unit = unit, R.n_pc = n_pc;
    R.fd_direct = fd_direct, R.fd_buf = fd_buf, R.bounce = bounce;
    /* straight into the slot, also a shared one (measured: shm pages made smaller device
     * requests than the huge-page bounce buffer, but saving its copy won: 4 ranks 1.6-1.9 s
     * instead of 2.3-2.4, 2 ranks 1.1-1.3 instead of 1.4-1.5) */
    R.dio_align = dt_ckpt__dio_align(fd_direct);
    reading = pthread_create(&rth, NULL, reader_thread, &R) == 0; /* else the main thread reads */
  }
  dt_status_t st3 = DT_OK; /* the first failure of phase 3 on this rank */
  for (int i = 0, zeroed = -1; i < n_pc; i++) {
    const piece_t *p = &pc[i];
    const int d = p->d, ti = d % lay->n_tensors, gi = d / lay->n_tensors;
    const fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[ti]);
    const hsize_t u = unit[d];
    float *rows = slot_rows(&W, i, foff[d] + (uint64_t)p->r0 * u * sizeof(float));
    hsize_t lo, hi;
    share_of(&W, p, W.g, W.j, &lo, &hi);
    tp = dt_time_now();
    if (!own_ok) { /* collective: every rank calls it for every piece (once the slot is free) */
      wait_node(&W, W.copied, i - NW + 1);
      hid_t fsp = H5Dget_space(D.ds[d]);
      hsize_t mc = hi > lo ? (hi - lo) * u : 1;
      hid_t msp = H5Screate_simple(1, &mc, NULL);
      hsize_t start[2] = {lo, 0}, count[2] = {hi - lo, u};
      if (hi > lo) H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, NULL, count, NULL);
      else H5Sselect_none(fsp), H5Sselect_none(msp);
      if (H5Dread(D.ds[d], H5T_NATIVE_FLOAT, msp, fsp, dxpl, rows + (lo - p->r0) * u) < 0 && st3 == DT_OK)
        st3 = dt_ckpt__h5err(path, D.names[d], "cannot read");
      H5Sclose(msp);
      H5Sclose(fsp);
      raise_to(&W.read_done[W.j], i + 1);
    } else if (!reading) {
      read_piece(&R, i);
    }
    wait_at_least(&W.read_done[W.j], i + 1);
    t_rd += dt_time_now() - tp, tp = dt_time_now();
    mine[i] = dt_crc32c(0, rows + (lo - p->r0) * u, (size_t)(hi - lo) * u * sizeof(float)); /* verified after the loop */
    t_crc += dt_time_now() - tp, tp = dt_time_now();
    if (st3 == DT_OK && dt_ckpt__faulty(comm, "read"))
      st3 = DT_ERR(DT_ERR_IO, "%s: %s: simulated read failure (test hook)", path, D.names[d]);
    wait_node(&W, W.read_done, i + 1); /* the node's shares are in the slot */
    if (W.G > 1) { /* the node leaders exchange their nodes' shares; the node waits for its leader */
      if (W.lead != MPI_COMM_NULL) {
        for (int g = 0; g < W.G; g++) {
          hsize_t ga, gz;
          split_rows(p->r0, p->r1, g, W.G, &ga, &gz);
          cnt[g] = (int)((gz - ga) * u), dsp[g] = (int)((ga - p->r0) * u);
        }
        DT_MPI_KEEP(st3, dt_wd_allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, rows, cnt, dsp, MPI_FLOAT, W.lead,
                                          "allgatherv (checkpoint load)"));
        raise_to(W.exch_done, i + 1);
      }
      wait_at_least(W.exch_done, i + 1);
    }
    t_ag += dt_time_now() - tp, tp = dt_time_now();
    int nb = dt_ckpt__boxes_of(&rg[gi ? 1 : 0], ti, bx);
    float *local = gi == 0 ? a->params : gi == 1 ? a->m : a->v;
    unpack_rows(&f, rows, p->r0, p->r1, bx, nb, local);
    const dt_tensor_t *t = &lay->tensors[ti];
    if (zeroed != d && (gi ? a->optim : a->model).full && dt_ckpt__is_wte(t) && t->rows > lay->d.V) { /* padded vocab */
      memset(local + t->offset + (size_t)lay->d.V * (size_t)t->cols, 0, (size_t)(t->rows - lay->d.V) * (size_t)t->cols * sizeof(float));
      zeroed = d;
    }
    raise_to(&W.copied[W.j], i + 1);
    t_un += dt_time_now() - tp;
  }
  if (reading) pthread_join(rth, NULL);
  reading = 0;
  if (R.err && st3 == DT_OK)
    st3 = DT_ERR(DT_ERR_IO, "%s: %s: read failed: %s", path, D.names[pc[R.err_piece].d], strerror(R.err));
  if ((st = dt_ckpt__agree(comm, st3)) != DT_OK) goto out;
  /* Checksums: every rank's CRC of its share of every piece in one allgather, combined in file
   * order (pieces; nodes; members); the same verdict on every rank (on a mismatch the arenas hold
   * unspecified data). */
  DT_MPI_KEEP(st, dt_wd_allgather(mine, n_pc, MPI_UINT32_T, crcs, n_pc, MPI_UINT32_T, comm, "allgather (checkpoint load)"));
  if (st != DT_OK) goto out;
  uint32_t crc = 0; /* of dataset d so far */
  for (int i = 0, d = -1; i <= n_pc; i++) {
    if (i == n_pc || pc[i].d != d) { /* dataset d complete */
      if (d >= 0 && crc != stored[d]) {
        st = DT_ERR(DT_ERR_CKPT, "%s: %s: CRC32C mismatch: stored 0x%08x, data 0x%08x (corrupt file)", path, D.names[d], stored[d], crc);
        goto out;
      }
      if (i == n_pc) break;
      d = pc[i].d, crc = 0;
    }
    for (int g = 0; g < W.G; g++)
      for (int j = 0; j < W.kof[g]; j++) {
        hsize_t lo, hi;
        share_of(&W, &pc[i], g, j, &lo, &hi);
        crc = dt_crc32c_combine(crc, crcs[(size_t)W.who[W.first[g] + j] * (size_t)n_pc + (size_t)i], (uint64_t)(hi - lo) * unit[d] * sizeof(float));
      }
  }
  dt_ckpt__time(comm, "read: tensors", t0);
  dt_ckpt__time(comm, own_ok ? (fd_direct >= 0 ? "  read wait (own, O_DIRECT)" : "  read wait (own, buffered)") : "  H5Dread",
                dt_time_now() - t_rd);
  dt_ckpt__time(comm, "  crc", dt_time_now() - t_crc);
  dt_ckpt__time(comm, "  exchange", dt_time_now() - t_ag);
  dt_ckpt__time(comm, "  copy out", dt_time_now() - t_un);
  dt_ckpt__time(comm, "  cpu (rank 0)", dt_time_now() - (dt_ckpt__cpu() - cpu0));

  /* Phase 4: the rest of the state. */
  st = read_state_data(file, &s, dxpl, path);
  st = dt_ckpt__agree(comm, st);

out:
  if (reading) pthread_join(rth, NULL); /* (it ends: phase 3 is never left early) */
  dt_status_t sc = window_close(&W);
  if (st == DT_OK) st = sc;
  if (fd_buf >= 0) close(fd_buf);
  if (fd_direct >= 0) close(fd_direct);
  dt_ckpt__io_buf_free(bounce, DT_CKPT_CHUNK);
  free(foff);
  free(unit);
  free(pc);
  dt_ckpt__dsets_free(&D);
  if (file >= 0) H5Fclose(file);
  if (fapl >= 0) H5Pclose(fapl);
  if (dxpl >= 0) H5Pclose(dxpl);
  dt_ckpt_ranges_free(&rg[0]);
  dt_ckpt_ranges_free(&rg[1]);
  free(bx);
  free(stored);
  free(crcs);
  free(mine);
  free(cnt);
  free(dsp);
  if (st == DT_OK && st_out) *st_out = s;
  else dt_ckpt_state_free(&s);
  return st;
}
