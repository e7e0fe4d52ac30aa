/* DDP's gradient average through shared memory, for a dp group whose ranks share a node (ddp.h,
 * parallel.ddp_comm). Issue #27 measured MPI's nonblocking all-reduce on such a node: Open MPI
 * copies each bucket into a temporary, through the kernel (CMA) and back, then dtrain divides in
 * another pass; 124M floats cost 450-1000 ms of CPU per step at dp = 2 on 2 cores, and it
 * progresses only inside MPI calls. Here every rank's gradient arena is a slice of one
 * shared-memory file (its own pages mapped over the backend's arena at the same address), so a
 * bucket is averaged straight from the arenas: sum the dp values, divide, store the average into
 * every arena, one pass (53 ms per step at 124M, dp = 2 on those cores; bench/ddp_overlap.sh).
 *
 * Protocol, per optimizer step s (counted alike on every rank): a rank stores ready[b][p] = s
 * (release) once its bucket b is final; once every rank's is, rank p averages its own slice of
 * the bucket (the p-th of dp equal slices) into every arena and stores done[b][p] = s. It does so
 * in the backward hook when it can, else in dt_ddp_shm_finish, which returns once every slice of
 * every bucket is done: no rank writes its arena (the next zero_grad) while a peer still reads
 * it, and no peer writes it after. Fixed slices, not whoever comes first: a rank touches 1/dp
 * of each peer's arena, so its RSS (which counts shared pages per process that maps them) grows
 * by a fixed (dp-1)/dp of an arena, as `dtrain plan` counts. Every element is summed in rank
 * order 0..dp-1. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "ddp.h"
#include "fault.h"
#include "mpi_check.h"
#include "timer.h"
#include "watchdog.h"

#define BLOCK 1024 /* floats summed through a stack buffer at a time */

typedef _Atomic uint64_t counter_t;

struct dt_ddp_shm {
  MPI_Comm comm; /* the dp communicator (dt_ddp_t.comm's) */
  int rank, size;
  char comm_name[MPI_MAX_OBJECT_NAME + 32], what[64]; /* for the watchdog's line */
  char *map;
  size_t map_bytes, stride; /* the whole file; bytes from one rank's arena to the next */
  float **arena;            /* [size] each rank's gradient arena: the peers' in map, its own */
  counter_t *ready, *done;  /* [n_buckets * size] */
  uint64_t step;
  int published, open; /* buckets [0, published) announced ready; [0, open) known done */
};

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* ---- the average ---------------------------------------------------------------------------- */

static void average(float *const *a, int size, size_t lo, size_t hi) {
  const float div = (float)size, inv = 1.0f / div;
  const int pow2 = (size & (size - 1)) == 0; /* x * (1/2^k) is exactly x / 2^k */
  const long nb = (long)((hi - lo + BLOCK - 1) / BLOCK);
#pragma omp parallel for schedule(static) if (nb > 8)
  for (long k = 0; k < nb; k++) {
    size_t b0 = lo + (size_t)k * BLOCK, n = hi - b0 < BLOCK ? hi - b0 : BLOCK;
    float acc[BLOCK];
    memcpy(acc, a[0] + b0, n * sizeof(float));
    for (int p = 1; p < size; p++) {
      const float *x = a[p] + b0;
      for (size_t i = 0; i < n; i++) acc[i] += x[i];
    }
    if (pow2)
      for (size_t i = 0; i < n; i++) acc[i] *= inv;
    else
      for (size_t i = 0; i < n; i++) acc[i] /= div;
    for (int p = 0; p < size; p++) memcpy(a[p] + b0, acc, n * sizeof(float));
  }
}

static int all_at(counter_t *flag, const dt_ddp_shm_t *s, int b) {
  for (int p = 0; p < s->size; p++)
    if (atomic_load_explicit(&flag[(size_t)b * s->size + p], memory_order_acquire) != s->step) return 0;
  return 1;
}

/* Average this rank's slice of every bucket that all ranks have ready; 1 when every slice of
 * every bucket is done. */
static int work(dt_ddp_t *d) {
  dt_ddp_shm_t *s = d->shm;
  int prefix = 1;
  for (int b = s->open; b < d->n_buckets; b++) {
    counter_t *mine = &s->done[(size_t)b * s->size + s->rank];
    if (atomic_load_explicit(mine, memory_order_relaxed) != s->step && all_at(s->ready, s, b)) {
      const size_t lo = d->buckets[b].lo, len = d->buckets[b].hi - lo;
      const size_t slice = (len / (size_t)s->size + 15) / 16 * 16; /* 64-byte multiples: no shared lines */
      const size_t a = lo + (size_t)s->rank * slice, z = a + slice;
      if (a < lo + len) average(s->arena, s->size, a, z < lo + len ? z : lo + len);
      atomic_store_explicit(mine, s->step, memory_order_release);
    }
    if (!all_at(s->done, s, b)) prefix = 0;
    else if (prefix) s->open = b + 1;
  }
  return s->open == d->n_buckets;
}

/* ---- the step --------------------------------------------------------------------------------- */

void dt_ddp_shm_begin(dt_ddp_t *d) {
  d->shm->step++;
  d->shm->published = d->shm->open = 0;
}

/* Announce the buckets that are final ([ready_lo, n): buckets run from the arena's end down). */
static void publish(dt_ddp_t *d, size_t ready_lo) {
  dt_ddp_shm_t *s = d->shm;
  for (; s->published < d->n_buckets && d->buckets[s->published].lo >= ready_lo; s->published++)
    atomic_store_explicit(&s->ready[(size_t)s->published * s->size + s->rank], s->step, memory_order_release);
}

void dt_ddp_shm_ready(dt_ddp_t *d) {
  publish(d, d->ready_lo);
  if (d->defer) return; /* the overlap probe: everything after backward (sync.c) */
  double t0 = dt_time_now();
  work(d);
  dt_wd_account(dt_time_now() - t0);
}

dt_status_t dt_ddp_shm_finish(dt_ddp_t *d) {
  dt_ddp_shm_t *s = d->shm;
  publish(d, 0);
  dt_wd_op_t op = {.op = s->what, .comm = s->comm, .comm_name = s->comm_name, .bytes = d->n * sizeof(float),
                   .peer = -1};
  double t0 = dt_time_now(), last = t0;
  for (unsigned k = 0; !work(d); k++) { /* the rest is another rank's: wait, leaving the core to it */
    if (k < 64) {
      sched_yield();
      continue;
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
    double t = dt_time_now();
    if (t - last > 0.1) dt_wd_check(t0, &op), last = t;
  }
  dt_wd_account(dt_time_now() - t0);
  return DT_OK;
}

/* ---- setup ------------------------------------------------------------------------------------ */

/* Every rank of c says whether ok; 1 when all did (or the agreement itself failed: 0). */
static int agree(MPI_Comm c, int ok) {
  int all = 0;
  return dt_wd_allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, c, "allreduce (ddp shared memory setup)") == MPI_SUCCESS &&
         all;
}

/* Rank 0 makes the file and reserves its memory (tmpfs: a full /dev/shm fails here, not as SIGBUS
 * in the middle of a step); every rank maps it. The name is unlinked once all have it open. */
static int map_file(dt_ddp_shm_t *s, size_t bytes, char *why, size_t whylen) {
  static int seq;
  struct {
    int err;
    char name[64];
  } m = {0, ""};
  int fd = -1;
  if (s->rank == 0) {
    snprintf(m.name, sizeof m.name, "/dtrain-ddp-%ld-%d", (long)getpid(), seq++);
    fd = shm_open(m.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    m.err = fd < 0 ? errno : ftruncate(fd, (off_t)bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    int wr = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    if (m.err == 0 && dt_fault("ddp_shm_nospace", wr, -1)) m.err = ENOSPC; /* test-only (fault.h) */
  }
  if (dt_wd_bcast(&m, (int)sizeof m, MPI_BYTE, 0, s->comm, "broadcast (ddp shared memory setup)") != MPI_SUCCESS)
    m.err = EIO;
  if (m.err == 0 && s->rank != 0 && (fd = shm_open(m.name, O_RDWR, 0)) < 0) m.err = errno;
  void *p = m.err == 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  int ok = agree(s->comm, p != MAP_FAILED);
  if (s->rank == 0 && fd >= 0) shm_unlink(m.name);
  if (!ok) {
    if (p != MAP_FAILED) munmap(p, bytes);
    if (fd >= 0) close(fd);
    snprintf(why, whylen, "%.1f MiB of shared memory (/dev/shm) not available to every rank%s%s",
             (double)bytes / 1048576.0, m.err ? ": " : "", m.err ? strerror(m.err) : "");
    return -1;
  }
  s->map = p;
  s->map_bytes = bytes;
  return fd;
}

static dt_status_t setup(dt_ddp_t *d, dt_ddp_shm_t *s, char *why, size_t whylen) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE), nb = (size_t)d->n_buckets;
  const size_t flags = round_up(nb * (size_t)s->size * sizeof(counter_t), 64);
  const size_t ctrl = round_up(2 * flags, page);
  s->stride = round_up(d->n * sizeof(float), page);
  s->arena = calloc((size_t)s->size, sizeof *s->arena);
  if (!s->arena) return DT_ERR(DT_ERR_NOMEM, "ddp: out of memory");
  int fd = map_file(s, ctrl + (size_t)s->size * s->stride, why, whylen);
  if (fd < 0) return DT_OK;
  /* this rank's slice over the backend's arena, at the same address: its kernels write there */
  void *own = mmap(d->grads, d->n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                   (off_t)(ctrl + (size_t)s->rank * s->stride));
  int err = own == MAP_FAILED ? errno : 0;
  close(fd);
  if (own != (void *)d->grads)
    return DT_ERR(DT_ERR_IO, "rank %d: ddp: cannot map the shared gradient arena over its own (%s)", dt_err_rank(),
                  strerror(err));
  s->ready = (counter_t *)s->map;
  s->done = (counter_t *)(s->map + flags);
  /* a page counts in the RSS once per mapping that touched it: this rank's own through its own */
  for (int p = 0; p < s->size; p++)
    s->arena[p] = p == s->rank ? d->grads : (float *)(s->map + ctrl + (size_t)p * s->stride);
  return DT_OK;
}

void dt_ddp_shm_free(dt_ddp_shm_t *s) {
  if (!s) return;
  if (s->map) munmap(s->map, s->map_bytes);
  free(s->arena);
  free(s);
}

dt_status_t dt_ddp_shm_init(dt_ddp_t *d, int required, char *why, size_t whylen) {
  MPI_Comm c;
  why[0] = '\0';
  if (dt_comm_mpi_handle(d->comm, &c) != DT_OK) {
    dt_err_clear();
    snprintf(why, whylen, "the gradients' communicator is not MPI's");
  } else if ((uintptr_t)d->grads % (uintptr_t)sysconf(_SC_PAGESIZE) != 0) {
    snprintf(why, whylen, "the gradient arena is not page-aligned");
  }
  if (why[0]) return required ? DT_ERR(DT_ERR_CONFIG, "parallel.ddp_comm = shm: %s", why) : DT_OK;
  MPI_Comm node;
  int n_node = 0;
  DT_MPI_CHECK(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  MPI_Comm_size(node, &n_node);
  MPI_Comm_free(&node);
  if (!agree(c, n_node == d->comm->size)) {
    snprintf(why, whylen, "the %d ranks of the dp group are not all on one node", d->comm->size);
    return required ? DT_ERR(DT_ERR_CONFIG, "parallel.ddp_comm = shm: %s", why) : DT_OK;
  }
  dt_ddp_shm_t *s = calloc(1, sizeof *s);
  if (!s) return DT_ERR(DT_ERR_NOMEM, "ddp: out of memory");
  *s = (dt_ddp_shm_t){.comm = c, .rank = d->comm->rank, .size = d->comm->size};
  char nm[MPI_MAX_OBJECT_NAME] = "";
  int len = 0;
  MPI_Comm_get_name(c, nm, &len);
  snprintf(s->comm_name, sizeof s->comm_name, "%s (shared memory)", nm[0] ? nm : "dp");
  snprintf(s->what, sizeof s->what, "allreduce of %zu f32", d->n);
  dt_status_t st = setup(d, s, why, whylen);
  if (st != DT_OK || !s->map) {
    dt_ddp_shm_free(s);
    if (st == DT_OK && required) st = DT_ERR(DT_ERR_CONFIG, "parallel.ddp_comm = shm: %s", why);
    return st;
  }
  d->shm = s;
  return DT_OK;
}
