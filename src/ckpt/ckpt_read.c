/* Checkpoint read: collective open and the metadata checks (ckpt_meta.c), then the datasets in
 * pieces of rows through a window of shared memory per node: each rank reads its share of a piece
 * (a reader thread, O_DIRECT), node leaders exchange their nodes' shares, every rank copies its
 * boxes out (the file's layout is the arena's), and the CRC32C of every share is combined and
 * verified. dt_ckpt_load runs the phases: load_plan, load_open, load_pieces, load_verify. */
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
      if (n && dt_ckpt__pread_full(R->fd_buf, dst, n, off) != (ssize_t)n) e = errno ? errno : EIO;
    } else if (n && dt_ckpt__read_own(R->fd_direct, R->fd_buf, R->bounce, off, n, (char *)dst, &R->dio_align) < 0) {
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

/* One load's state (dt_ckpt_load): what phase 1 plans, phase 2 opens, phase 3 reads. */
typedef struct {
  MPI_Comm comm;
  int rank, size;
  const char *path;
  const dt_layout_t *lay;
  const dt_ckpt_arenas_t *a;
  dt_ckpt_state_t s;
  dt_ckpt_ranges_t rg[2]; /* this rank's boxes of the model and of m, v */
  dsets_t D;
  hid_t fapl, dxpl, file;
  uint32_t *stored, *crcs, *mine; /* crcs: (size, n_pc) CRCs of every rank's shares */
  int *cnt, *dsp, n_pc;
  fbox_t *bx;
  int own_ok, fd_buf, fd_direct;
  uint64_t *foff;         /* each dataset's file offset (own descriptors) */
  hsize_t *unit;          /* floats per row of each dataset */
  char *bounce;
  piece_t *pc;
  size_t max_row, max_ds; /* bytes of the longest row (a slot holds one) and dataset */
  window_t W;
  reader_t R;
  pthread_t rth;
  int reading;            /* the reader thread runs (join it) */
  double t_rd, t_crc, t_ag, t_un;
} load_t;

/* Phase 1 (local): the rank's boxes, the datasets' names, the pieces. */
static dt_status_t load_plan(load_t *L) {
  const dt_layout_t *lay = L->lay;
  const int optim = L->a->m != NULL;
  if ((L->a->m == NULL) != (L->a->v == NULL)) return DT_ERR(DT_ERR_ARG, "%s: m and v must both be given", L->path);
  DT_TRY(dt_ckpt__ranges_resolve(lay, &L->a->model, 0, L->rank, L->size, &L->rg[0]));
  if (optim) DT_TRY(dt_ckpt__ranges_resolve(lay, &L->a->optim, 0, L->rank, L->size, &L->rg[1]));
  DT_TRY(dt_ckpt__dsets_init(&L->D, lay, optim ? 3 : 1));
  const int n_ds = L->D.n_ds;
  L->max_row = L->max_ds = 1;
  L->stored = calloc((size_t)n_ds, sizeof *L->stored);
  L->foff = calloc((size_t)n_ds, sizeof *L->foff);
  L->unit = calloc((size_t)n_ds, sizeof *L->unit);
  L->bx = malloc((size_t)(L->rg[0].n > L->rg[1].n ? L->rg[0].n : L->rg[1].n) * sizeof(fbox_t) + 1);
  L->cnt = calloc((size_t)L->size, sizeof *L->cnt);
  L->dsp = calloc((size_t)L->size, sizeof *L->dsp);
  for (int d = 0; L->unit && d < n_ds; d++) { /* the pieces */
    fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[d % lay->n_tensors]);
    L->unit[d] = f.ndim == 1 ? 1 : f.FC;
    const hsize_t per = rows_per_piece(L->unit[d]), row = L->unit[d] * sizeof(float);
    L->n_pc += (int)((f.dims[0] + per - 1) / per);
    if (row > L->max_row) L->max_row = row;
    if (f.dims[0] * row > L->max_ds) L->max_ds = f.dims[0] * row;
  }
  const size_t n_pc = (size_t)(L->n_pc ? L->n_pc : 1);
  L->pc = malloc(n_pc * sizeof *L->pc);
  for (int d = 0, i = 0; L->pc && d < n_ds; d++) {
    fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[d % lay->n_tensors]);
    const hsize_t per = rows_per_piece(L->unit[d]);
    for (hsize_t r = 0; r < f.dims[0]; r += per) L->pc[i++] = (piece_t){d, r, r + per < f.dims[0] ? r + per : f.dims[0]};
  }
  L->mine = calloc(n_pc, sizeof *L->mine);
  L->crcs = calloc((size_t)L->size * n_pc, sizeof *L->crcs);
  if (!L->stored || !L->foff || !L->unit || !L->bx || !L->cnt || !L->dsp || !L->pc || !L->mine || !L->crcs)
    return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", L->path);
  FILE *probe = fopen(L->path, "rb");
  if (!probe) return DT_ERR(DT_ERR_IO, "%s: cannot open: %s", L->path, strerror(errno));
  fclose(probe);
  if (dt_ckpt__faulty(L->comm, "open")) return DT_ERR(DT_ERR_IO, "%s: simulated open failure (test hook)", L->path);
  return DT_OK;
}

/* Phase 2 (collective): open, header, shapes, stored checksums; own descriptors or H5Dread (the
 * same choice on every rank); the node's window. Returns the agreed status. */
static dt_status_t load_open(load_t *L) {
  const char *path = L->path;
  dt_status_t st = DT_OK;
  dt_ckpt__mpio_plists(L->comm, &L->fapl, &L->dxpl);
  L->file = H5Fopen(path, H5F_ACC_RDONLY, L->fapl);
  if (L->file < 0) st = dt_ckpt__h5err(path, "/", "cannot open as HDF5 (truncated or not HDF5?)");
  DT_TRY(dt_ckpt__agree(L->comm, st));
  st = dt_ckpt__check_header(L->file, L->lay, &L->s, path);
  if (st == DT_OK) st = dt_ckpt__open_dsets(L->file, L->lay, &L->D, L->stored, path);
  DT_TRY(dt_ckpt__agree(L->comm, st));
  /* All datasets through our own descriptors at their file offsets (contiguous datasets, as ours
   * are), or, when that is switched off or some dataset has no offset, all through H5Dread (the
   * same choice on every rank: H5Dread is collective). O_DIRECT is each rank's own business. */
  int own_ok = dt_ckpt__own_io(), all = 0;
  for (int d = 0; own_ok && d < L->D.n_ds; d++) {
    haddr_t o = H5Dget_offset(L->D.ds[d]);
    own_ok = o != HADDR_UNDEF, L->foff[d] = (uint64_t)o;
  }
  if (own_ok) {
    L->fd_buf = open(path, O_RDONLY | O_CLOEXEC);
    L->fd_direct = dt_ckpt__open_direct(path, O_RDONLY);
    L->bounce = dt_ckpt__io_buf(DT_CKPT_CHUNK);
    own_ok = L->fd_buf >= 0 && L->bounce;
  }
  DT_MPI_KEEP(st, dt_wd_allreduce(&own_ok, &all, 1, MPI_INT, MPI_MIN, L->comm, "allreduce (checkpoint load)"));
  L->own_ok = all;
  /* The small datasets (biases, layernorms): ask for them all at once, so their reads overlap
   * instead of costing a round trip each (GPT-2 124M: 294 of them). */
  for (int d = 0; L->own_ok && d < L->D.n_ds; d++)
    if (L->D.bytes[d] < DT_CKPT_OWN_MIN) (void)posix_fadvise(L->fd_buf, (off_t)L->foff[d], (off_t)L->D.bytes[d], POSIX_FADV_WILLNEED);
  /* a slot: a piece (no more than the largest dataset: small models get a small window) */
  size_t piece = L->max_ds < PIECE ? L->max_ds : PIECE;
  dt_status_t sw = window_open(L->comm, (piece > L->max_row ? piece : L->max_row) + 2 * DT_CKPT_ALIGN, &L->W, path);
  return dt_ckpt__agree(L->comm, st != DT_OK ? st : sw);
}

/* Piece i through H5Dread (collective: every rank calls it for every piece, once the slot is free). */
static void load_h5_piece(load_t *L, int i, float *rows, hsize_t lo, hsize_t hi, dt_status_t *st3) {
  const piece_t *p = &L->pc[i];
  const int d = p->d;
  const hsize_t u = L->unit[d];
  const fshape_t f = dt_ckpt__fshape(L->lay, &L->lay->tensors[d % L->lay->n_tensors]);
  wait_node(&L->W, L->W.copied, i - NW + 1);
  hid_t fsp = H5Dget_space(L->D.ds[d]);
  hsize_t mc = hi > lo ? (hi - lo) * u : 1;
  hid_t msp = H5Screate_simple(1, &mc, NULL);
  dt_ckpt__select_rows(fsp, &f, lo, hi);
  if (hi <= lo) H5Sselect_none(msp);
  if (H5Dread(L->D.ds[d], H5T_NATIVE_FLOAT, msp, fsp, L->dxpl, rows + (lo - p->r0) * u) < 0 && *st3 == DT_OK)
    *st3 = dt_ckpt__h5err(L->path, L->D.names[d], "cannot read");
  H5Sclose(msp);
  H5Sclose(fsp);
  raise_to(&L->W.read_done[L->W.j], i + 1);
}

/* Piece i: this rank's share read (or waited for from the reader thread) and checksummed, the
 * node's shares waited for, the leaders' exchange between nodes, this rank's boxes copied out. A
 * failure goes to *st3 and the piece still completes (every rank must keep raising its counters). */
static void load_piece(load_t *L, int i, int *zeroed, dt_status_t *st3) {
  const dt_layout_t *lay = L->lay;
  window_t *W = &L->W;
  const piece_t *p = &L->pc[i];
  const int d = p->d, ti = d % lay->n_tensors, gi = d / lay->n_tensors;
  const fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[ti]);
  const hsize_t u = L->unit[d];
  float *rows = slot_rows(W, i, L->foff[d] + (uint64_t)p->r0 * u * sizeof(float));
  hsize_t lo, hi;
  share_of(W, p, W->g, W->j, &lo, &hi);
  double tp = dt_time_now();
  if (!L->own_ok) load_h5_piece(L, i, rows, lo, hi, st3);
  else if (!L->reading) read_piece(&L->R, i);
  wait_at_least(&W->read_done[W->j], i + 1);
  L->t_rd += dt_time_now() - tp, tp = dt_time_now();
  L->mine[i] = dt_crc32c(0, rows + (lo - p->r0) * u, (size_t)(hi - lo) * u * sizeof(float)); /* verified after the loop */
  L->t_crc += dt_time_now() - tp, tp = dt_time_now();
  if (*st3 == DT_OK && dt_ckpt__faulty(L->comm, "read"))
    *st3 = DT_ERR(DT_ERR_IO, "%s: %s: simulated read failure (test hook)", L->path, L->D.names[d]);
  wait_node(W, W->read_done, i + 1); /* the node's shares are in the slot */
  if (W->G > 1) { /* the node leaders exchange their nodes' shares; the node waits for its leader */
    if (W->lead != MPI_COMM_NULL) {
      for (int g = 0; g < W->G; g++) {
        hsize_t ga, gz;
        split_rows(p->r0, p->r1, g, W->G, &ga, &gz);
        L->cnt[g] = (int)((gz - ga) * u), L->dsp[g] = (int)((ga - p->r0) * u);
      }
      DT_MPI_KEEP(*st3, dt_wd_allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, rows, L->cnt, L->dsp, MPI_FLOAT, W->lead,
                                         "allgatherv (checkpoint load)"));
      raise_to(W->exch_done, i + 1);
    }
    wait_at_least(W->exch_done, i + 1);
  }
  L->t_ag += dt_time_now() - tp, tp = dt_time_now();
  int nb = dt_ckpt__boxes_of(&L->rg[gi ? 1 : 0], ti, L->bx);
  float *local = gi == 0 ? L->a->params : gi == 1 ? L->a->m : L->a->v;
  unpack_rows(&f, rows, p->r0, p->r1, L->bx, nb, local);
  const dt_tensor_t *t = &lay->tensors[ti];
  if (*zeroed != d && (gi ? L->a->optim : L->a->model).full && dt_ckpt__is_wte(t) && t->rows > lay->d.V) { /* padded vocab */
    memset(local + t->offset + (size_t)lay->d.V * (size_t)t->cols, 0, (size_t)(t->rows - lay->d.V) * (size_t)t->cols * sizeof(float));
    *zeroed = d;
  }
  raise_to(&W->copied[W->j], i + 1);
  L->t_un += dt_time_now() - tp;
}

/* Phase 3: every piece (the reader thread reads ahead when own descriptors are used); the
 * agreed status. */
static dt_status_t load_pieces(load_t *L) {
  if (L->own_ok) {
    reader_t *R = &L->R;
    R->W = &L->W, R->pc = L->pc, R->D = &L->D, R->foff = L->foff, R->unit = L->unit, R->n_pc = L->n_pc;
    R->fd_direct = L->fd_direct, R->fd_buf = L->fd_buf, R->bounce = L->bounce;
    /* straight into the slot, also a shared one (measured: shm pages made smaller device
     * requests than the huge-page bounce buffer, but saving its copy won: 4 ranks 1.6-1.9 s
     * instead of 2.3-2.4, 2 ranks 1.1-1.3 instead of 1.4-1.5) */
    R->dio_align = dt_ckpt__dio_align(L->fd_direct);
    L->reading = pthread_create(&L->rth, NULL, reader_thread, R) == 0; /* else the main thread reads */
  }
  dt_status_t st3 = DT_OK; /* the first failure of phase 3 on this rank */
  for (int i = 0, zeroed = -1; i < L->n_pc; i++) load_piece(L, i, &zeroed, &st3);
  if (L->reading) pthread_join(L->rth, NULL);
  L->reading = 0;
  if (L->R.err && st3 == DT_OK)
    st3 = DT_ERR(DT_ERR_IO, "%s: %s: read failed: %s", L->path, L->D.names[L->pc[L->R.err_piece].d], strerror(L->R.err));
  return dt_ckpt__agree(L->comm, st3);
}

/* Checksums: every rank's CRC of its share of every piece in one allgather, combined in file order
 * (pieces; nodes; members); the same verdict on every rank (on a mismatch the arenas hold
 * unspecified data). */
static dt_status_t load_verify(load_t *L) {
  const window_t *W = &L->W;
  const int n_pc = L->n_pc;
  dt_status_t st = DT_OK;
  DT_MPI_KEEP(st, dt_wd_allgather(L->mine, n_pc, MPI_UINT32_T, L->crcs, n_pc, MPI_UINT32_T, L->comm,
                                  "allgather (checkpoint load)"));
  DT_TRY(st);
  uint32_t crc = 0; /* of dataset d so far */
  for (int i = 0, d = -1; i <= n_pc; i++) {
    if (i == n_pc || L->pc[i].d != d) { /* dataset d complete */
      if (d >= 0 && crc != L->stored[d])
        return DT_ERR(DT_ERR_CKPT, "%s: %s: CRC32C mismatch: stored 0x%08x, data 0x%08x (corrupt file)", L->path,
                      L->D.names[d], L->stored[d], crc);
      if (i == n_pc) break;
      d = L->pc[i].d, crc = 0;
    }
    for (int g = 0; g < W->G; g++)
      for (int j = 0; j < W->kof[g]; j++) {
        hsize_t lo, hi;
        share_of(W, &L->pc[i], g, j, &lo, &hi);
        crc = dt_crc32c_combine(crc, L->crcs[(size_t)W->who[W->first[g] + j] * (size_t)n_pc + (size_t)i],
                                (uint64_t)(hi - lo) * L->unit[d] * sizeof(float));
      }
  }
  return DT_OK;
}

/* Everything a load holds, whichever phase it stopped in; a close failure of the window is the
 * status if there was none before. */
static dt_status_t load_free(load_t *L, dt_status_t st) {
  if (L->reading) pthread_join(L->rth, NULL); /* (it ends: phase 3 is never left early) */
  dt_status_t sc = window_close(&L->W);
  if (st == DT_OK) st = sc;
  if (L->fd_buf >= 0) close(L->fd_buf);
  if (L->fd_direct >= 0) close(L->fd_direct);
  dt_ckpt__io_buf_free(L->bounce, DT_CKPT_CHUNK);
  dt_ckpt__dsets_free(&L->D);
  if (L->file >= 0) H5Fclose(L->file);
  if (L->fapl >= 0) H5Pclose(L->fapl);
  if (L->dxpl >= 0) H5Pclose(L->dxpl);
  dt_ckpt_ranges_free(&L->rg[0]);
  dt_ckpt_ranges_free(&L->rg[1]);
  void *bufs[] = {L->foff, L->unit, L->pc, L->bx, L->stored, L->crcs, L->mine, L->cnt, L->dsp};
  for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) free(bufs[k]);
  return st;
}

dt_status_t dt_ckpt_load(const void *mpi_comm, const char *path, const dt_layout_t *lay, const dt_ckpt_arenas_t *a,
                         dt_ckpt_state_t *st_out) {
  load_t L;
  memset(&L, 0, sizeof L);
  L.comm = dt_ckpt__comm(mpi_comm), L.path = path, L.lay = lay, L.a = a;
  L.fapl = L.dxpl = L.file = -1;
  L.fd_buf = L.fd_direct = -1;
  L.W.node = L.W.lead = MPI_COMM_NULL;
  DT_MPI_CHECK(MPI_Comm_rank(L.comm, &L.rank));
  DT_MPI_CHECK(MPI_Comm_size(L.comm, &L.size));
  dt_ckpt__h5_quiet();
  double t0 = dt_time_now(), cpu0 = dt_ckpt__cpu();
  dt_status_t st = dt_ckpt__agree(L.comm, load_plan(&L));
  if (st == DT_OK) st = load_open(&L);
  if (st == DT_OK) st = load_pieces(&L);
  if (st == DT_OK) st = load_verify(&L);
  if (st == DT_OK) {
    dt_ckpt__time(L.comm, "read: tensors", t0);
    dt_ckpt__time(L.comm, L.own_ok ? (L.fd_direct >= 0 ? "  read wait (own, O_DIRECT)" : "  read wait (own, buffered)")
                                   : "  H5Dread", dt_time_now() - L.t_rd);
    dt_ckpt__time(L.comm, "  crc", dt_time_now() - L.t_crc);
    dt_ckpt__time(L.comm, "  exchange", dt_time_now() - L.t_ag);
    dt_ckpt__time(L.comm, "  copy out", dt_time_now() - L.t_un);
    dt_ckpt__time(L.comm, "  cpu (rank 0)", dt_time_now() - (dt_ckpt__cpu() - cpu0));
    /* Phase 4: the rest of the state. */
    st = dt_ckpt__agree(L.comm, dt_ckpt__read_state_data(L.file, &L.s, L.dxpl, path));
  }
  st = load_free(&L, st);
  if (st == DT_OK && st_out) *st_out = L.s;
  else dt_ckpt_state_free(&L.s);
  return st;
}
