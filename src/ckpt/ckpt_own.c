/* Checkpoint write through our own descriptors: with replicated (full) arenas every rank (node
 * leader) holds every tensor, so the bytes of a large dataset can be split at page boundaries
 * instead of rows: each writer packs its byte range in file order, in chunks, and writes them at
 * the dataset's file offset (H5Dget_offset; HDF5 never writes those raw bytes itself) with
 * O_DIRECT when the file system takes it. That skips the page cache: no 1.5 GB of fresh cache
 * pages to allocate and copy into (which on this VM costs more than the disk: buffered writes slow
 * down 2-3x while other memory is resident, dd as much as we), and the checkpoint does not push
 * the training data out of the cache. The tail of a dataset that does not fill its last page, and
 * every write O_DIRECT refuses, go through a normal descriptor. DTRAIN_CKPT_DIRECT=0 turns the path
 * off (every dataset through H5Dwrite). ckpt_write.c decides which datasets go this way. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_int.h"

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
  c->failed = dt_ckpt__segs_add(c->segs, (uint64_t)c->d, c->lo, c->buf, c->hi - c->lo) < 0;
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

dt_status_t dt_ckpt__write_own(const dt_layout_t *lay, const dt_ckpt_arenas_t *a, const dsets_t *D, const int *own,
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

