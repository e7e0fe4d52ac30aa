/* Token shard reader and sampler (see data.h for the format and the sample/epoch semantics).
 * Shards are validated once at open and mmap'd read-only; a batch is a copy of B windows of T+1
 * uint16 tokens into int32 inputs/targets. The current epoch's permutation is cached. */
#include "data.h"
#include "sampler.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token shards are little-endian and read in place; big-endian hosts are not supported"
#endif

#define HEADER_BYTES (DT_SHARD_HEADER_INTS * (int)sizeof(int32_t))

typedef struct {
  char *path;
  void *map;              /* whole file, read-only */
  size_t map_len;
  const uint16_t *tokens; /* (n,) = map + HEADER_BYTES */
  uint64_t n;
  uint64_t first_sample;  /* global id of this shard's sample 0 */
  uint64_t n_samples;     /* (n - 1) / T, 0 if n <= T */
} shard_t;

struct dt_data {
  shard_t *shards;
  int n_shards;
  int T;
  int vocab_size;
  int shuffle;
  uint64_t seed;
  uint64_t n_samples; /* N */
  uint64_t n_tokens;
  dt_sampler_t sampler; /* the epochs' permutations (sampler.h) */
};

/* ---- opening and validation ----------------------------------------------------------- */

/* Open a shard, check that it is a regular file whose header (magic, version, count) matches its
 * size; *fd_out = the open descriptor, *n_out = the token count, *size_out = the file size. */
static dt_status_t shard_check(const char *path, int *fd_out, uint64_t *n_out, uint64_t *size_out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return DT_ERR(DT_ERR_IO, "%s: cannot open token shard: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return DT_ERR(DT_ERR_IO, "%s: cannot stat token shard: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return DT_ERR(DT_ERR_DATA, "%s: not a regular file", path);
  }
  uint64_t size = (uint64_t)st.st_size;
  if (size < (uint64_t)HEADER_BYTES) {
    close(fd);
    return DT_ERR(DT_ERR_DATA, "%s: truncated: %llu bytes, shorter than the %d-byte shard header", path,
                  (unsigned long long)size, HEADER_BYTES);
  }
  int32_t header[DT_SHARD_HEADER_INTS];
  ssize_t got = pread(fd, header, sizeof header, 0);
  if (got != (ssize_t)sizeof header) {
    int e = errno;
    close(fd);
    return DT_ERR(DT_ERR_IO, "%s: cannot read shard header: %s", path, got < 0 ? strerror(e) : "short read");
  }
  if (header[0] != DT_SHARD_MAGIC) {
    close(fd);
    return DT_ERR(DT_ERR_DATA, "%s: bad magic %d in header (expected %d): not an llm.c token shard", path,
                  (int)header[0], DT_SHARD_MAGIC);
  }
  if (header[1] != DT_SHARD_VERSION) {
    close(fd);
    return DT_ERR(DT_ERR_DATA, "%s: unsupported shard version %d (expected %d, uint16 tokens)", path,
                  (int)header[1], DT_SHARD_VERSION);
  }
  if (header[2] < 0) {
    close(fd);
    return DT_ERR(DT_ERR_DATA, "%s: negative token count %d in header", path, (int)header[2]);
  }
  uint64_t n = (uint64_t)header[2];
  uint64_t expect = (uint64_t)HEADER_BYTES + 2 * n;
  if (size < expect) {
    close(fd);
    return DT_ERR(DT_ERR_DATA, "%s: truncated: header says %llu tokens (%llu bytes) but the file has %llu bytes",
                  path, (unsigned long long)n, (unsigned long long)expect, (unsigned long long)size);
  }
  if (size > expect) {
    close(fd);
    return DT_ERR(DT_ERR_DATA, "%s: %llu trailing bytes: header says %llu tokens (%llu bytes) but the file has %llu",
                  path, (unsigned long long)(size - expect), (unsigned long long)n, (unsigned long long)expect,
                  (unsigned long long)size);
  }
  *fd_out = fd;
  *n_out = n;
  *size_out = size;
  return DT_OK;
}

/* Open, check header and size, mmap, check tokens < vocab_size. */
static dt_status_t shard_open(shard_t *s, const char *path, int vocab_size) {
  int fd;
  uint64_t n, size;
  DT_TRY(shard_check(path, &fd, &n, &size));
  void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (map == MAP_FAILED) return DT_ERR(DT_ERR_IO, "%s: cannot mmap token shard: %s", path, strerror(e));
  const uint16_t *tok = (const uint16_t *)((const char *)map + HEADER_BYTES);
  /* One pass over the tokens (a read at memory bandwidth): find the first bad one, if any. */
  uint16_t maxtok = 0;
  for (uint64_t i = 0; i < n; i++) maxtok = tok[i] > maxtok ? tok[i] : maxtok;
  if ((int)maxtok >= vocab_size) {
    uint64_t i = 0;
    while ((int)tok[i] < vocab_size) i++;
    dt_status_t st2 = DT_ERR(DT_ERR_DATA, "%s: token %llu has value %d >= vocab_size %d", path,
                             (unsigned long long)i, (int)tok[i], vocab_size);
    munmap(map, (size_t)size);
    return st2;
  }
  s->path = strdup(path);
  if (!s->path) {
    munmap(map, (size_t)size);
    return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  }
  s->map = map;
  s->map_len = (size_t)size;
  s->tokens = tok;
  s->n = n;
  return DT_OK;
}

static int has_glob_chars(const char *p) { return strpbrk(p, "*?[") != NULL; }

dt_status_t dt_data_open(dt_data_t **out, const char *glob_pattern, int vocab_size, int T, int shuffle,
                         uint64_t seed) {
  *out = NULL;
  if (!glob_pattern || !glob_pattern[0]) return DT_ERR(DT_ERR_ARG, "data: empty shard pattern");
  if (vocab_size < 1 || vocab_size > 65536)
    return DT_ERR(DT_ERR_ARG, "%s: vocab_size %d out of range 1..65536 for uint16 shards", glob_pattern, vocab_size);
  if (T < 1) return DT_ERR(DT_ERR_ARG, "%s: sequence length T = %d must be >= 1", glob_pattern, T);

  glob_t g;
  int rc = glob(glob_pattern, 0, NULL, &g);
  if (rc == GLOB_NOMATCH) {
    globfree(&g);
    if (!has_glob_chars(glob_pattern))
      return DT_ERR(DT_ERR_DATA, "%s: no such token shard", glob_pattern);
    return DT_ERR(DT_ERR_DATA, "%s: no file matches this shard pattern", glob_pattern);
  }
  if (rc != 0) {
    globfree(&g);
    return DT_ERR(DT_ERR_IO, "%s: glob failed (%s)", glob_pattern, rc == GLOB_NOSPACE ? "out of memory" : "read error");
  }
  if (g.gl_pathc > 1000000) {
    globfree(&g);
    return DT_ERR(DT_ERR_DATA, "%s: too many shards (%zu)", glob_pattern, (size_t)g.gl_pathc);
  }

  dt_data_t *d = calloc(1, sizeof *d);
  if (d) d->shards = calloc(g.gl_pathc, sizeof *d->shards);
  if (!d || !d->shards) {
    free(d);
    globfree(&g);
    return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", glob_pattern);
  }
  d->T = T;
  d->vocab_size = vocab_size;
  d->shuffle = shuffle != 0;
  d->seed = seed;
  dt_status_t st = DT_OK;
  uint64_t largest = 0;
  for (size_t i = 0; i < g.gl_pathc && st == DT_OK; i++) {
    shard_t *s = &d->shards[i];
    st = shard_open(s, g.gl_pathv[i], vocab_size);
    if (st != DT_OK) break;
    d->n_shards++;
    s->first_sample = d->n_samples;
    s->n_samples = s->n > (uint64_t)T ? (s->n - 1) / (uint64_t)T : 0;
    d->n_samples += s->n_samples;
    d->n_tokens += s->n;
    if (s->n > largest) largest = s->n;
  }
  globfree(&g);
  if (st == DT_OK && d->n_samples == 0) {
    if (d->n_shards == 1)
      st = DT_ERR(DT_ERR_DATA, "%s: too few tokens: %llu, need at least T+1 = %d for one sample", d->shards[0].path,
                  (unsigned long long)d->n_tokens, T + 1);
    else
      st = DT_ERR(DT_ERR_DATA,
                  "%s: too few tokens: %llu in %d shards, largest %llu; one sample needs T+1 = %d tokens in one shard",
                  glob_pattern, (unsigned long long)d->n_tokens, d->n_shards, (unsigned long long)largest, T + 1);
  }
  if (st == DT_OK) st = dt_sampler_init(&d->sampler, d->n_samples, d->shuffle, d->seed, glob_pattern);
  if (st != DT_OK) {
    dt_data_close(d);
    return st;
  }
  *out = d;
  return DT_OK;
}

void dt_data_close(dt_data_t *d) {
  if (!d) return;
  for (int i = 0; i < d->n_shards; i++) {
    munmap(d->shards[i].map, d->shards[i].map_len);
    free(d->shards[i].path);
  }
  free(d->shards);
  dt_sampler_free(&d->sampler);
  free(d);
}

uint64_t dt_data_num_samples(const dt_data_t *d) { return d->n_samples; }
uint64_t dt_data_num_tokens(const dt_data_t *d) { return d->n_tokens; }
int dt_data_num_shards(const dt_data_t *d) { return d->n_shards; }
const char *dt_data_shard_path(const dt_data_t *d, int i) {
  return i >= 0 && i < d->n_shards ? d->shards[i].path : NULL;
}
uint64_t dt_data_num_sequential_batches(const dt_data_t *d, int B) {
  return B > 0 ? d->n_samples / (uint64_t)B : 0;
}

/* ---- sampling ------------------------------------------------------------------------- */

uint64_t dt_data_sample_at(dt_data_t *d, uint64_t g) { return dt_sampler_at(&d->sampler, g); }

/* First token of sample s (0 <= s < N): the last shard whose first_sample <= s holds it (a shard
 * with no samples shares first_sample with its successor, so it is never the last one). */
static const uint16_t *sample_tokens(const dt_data_t *d, uint64_t s) {
  int lo = 0, hi = d->n_shards - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (d->shards[mid].first_sample <= s)
      lo = mid;
    else
      hi = mid - 1;
  }
  const shard_t *sh = &d->shards[lo];
  return sh->tokens + (s - sh->first_sample) * (uint64_t)d->T;
}

/* inputs[t] = w[t], targets[t] = w[t+1] for the window w of sample s; inputs, targets (T,). */
static void copy_sample(const dt_data_t *d, uint64_t s, int *inputs, int *targets) {
  const uint16_t *w = sample_tokens(d, s);
  int T = d->T;
  for (int t = 0; t < T; t++) inputs[t] = w[t];
  for (int t = 0; t < T; t++) targets[t] = w[t + 1];
}

dt_status_t dt_data_batch(dt_data_t *d, uint64_t g0, int B, int *inputs, int *targets) {
  if (B < 1 || !inputs || !targets) return DT_ERR(DT_ERR_ARG, "data: batch needs B >= 1 and output buffers (B = %d)", B);
  for (int b = 0; b < B; b++) {
    uint64_t s = dt_data_sample_at(d, g0 + (uint64_t)b);
    copy_sample(d, s, inputs + (size_t)b * d->T, targets + (size_t)b * d->T);
  }
  return DT_OK;
}

dt_status_t dt_data_batch_sequential(dt_data_t *d, uint64_t j, int B, int *inputs, int *targets) {
  if (B < 1 || !inputs || !targets)
    return DT_ERR(DT_ERR_ARG, "data: sequential batch needs B >= 1 and output buffers (B = %d)", B);
  uint64_t nb = dt_data_num_sequential_batches(d, B);
  if (j >= nb)
    return DT_ERR(DT_ERR_ARG, "%s: sequential batch %llu out of range: %llu samples of T = %d give %llu batches of B = %d",
                  d->shards[0].path, (unsigned long long)j, (unsigned long long)d->n_samples, d->T,
                  (unsigned long long)nb, B);
  for (int b = 0; b < B; b++)
    copy_sample(d, j * (uint64_t)B + (uint64_t)b, inputs + (size_t)b * d->T, targets + (size_t)b * d->T);
  return DT_OK;
}

/* ---- writing -------------------------------------------------------------------------- */

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

dt_status_t dt_data_write_shard(const char *path, const uint16_t *tokens, size_t n) {
  if (n > INT32_MAX)
    return DT_ERR(DT_ERR_ARG, "%s: %zu tokens do not fit the int32 count of a shard header", path, n);
  if (n > 0 && !tokens) return DT_ERR(DT_ERR_ARG, "%s: no tokens given", path);
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
    return DT_ERR(DT_ERR_ARG, "%s: path too long", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return DT_ERR(DT_ERR_IO, "%s: cannot create shard: %s", tmp, strerror(errno));
  int32_t header[DT_SHARD_HEADER_INTS] = {0};
  header[0] = DT_SHARD_MAGIC;
  header[1] = DT_SHARD_VERSION;
  header[2] = (int32_t)n;
  if (write_all(fd, header, sizeof header) != 0 || write_all(fd, tokens, n * sizeof *tokens) != 0 ||
      fsync(fd) != 0) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return DT_ERR(DT_ERR_IO, "%s: cannot write shard: %s", tmp, strerror(e));
  }
  if (close(fd) != 0) {
    int e = errno;
    unlink(tmp);
    return DT_ERR(DT_ERR_IO, "%s: cannot write shard: %s", tmp, strerror(e));
  }
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return DT_ERR(DT_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(e));
  }
  return DT_OK;
}

dt_status_t dt_data_read_shard(const char *path, uint16_t **tokens, uint64_t *n) {
  int fd;
  uint64_t size;
  *tokens = NULL;
  DT_TRY(shard_check(path, &fd, n, &size));
  uint16_t *t = malloc(*n ? *n * sizeof *t : 1);
  if (!t) {
    close(fd);
    return DT_ERR(DT_ERR_NOMEM, "%s: out of memory for %llu tokens", path, (unsigned long long)*n);
  }
  size_t want = (size_t)*n * sizeof *t, got = 0;
  while (got < want) {
    ssize_t r = pread(fd, (char *)t + got, want - got, (off_t)(HEADER_BYTES + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = errno;
      close(fd);
      free(t);
      return DT_ERR(DT_ERR_IO, "%s: cannot read tokens: %s", path, r < 0 ? strerror(e) : "short read");
    }
    got += (size_t)r;
  }
  close(fd);
  *tokens = t;
  return DT_OK;
}
