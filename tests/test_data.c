/* Token shards, sampler and `dtrain prep`: shard round trip, every validation error, batch
 * contents against windows computed here from the token arrays, the per-epoch permutation,
 * independence of the sample sequence from the data-parallel split, sequential (eval) batches,
 * and text -> shards -> text through prep. Every test works in its own temporary directory. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdarg.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "sampler.h"
#include "heap_count.h"

static char dir[256];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}
static void setup(void) {
  strcpy(dir, "/tmp/dtrain-test-data-XXXXXX");
  cr_assert(mkdtemp(dir) != NULL);
  dt_err_clear();
}
static void teardown(void) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }
TestSuite(data, .init = setup, .fini = teardown);

static const char *P(const char *name) {
  static char buf[8][512];
  static int k;
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

/* Raw shard writer for crafting bad files: header (magic, version, count), n tokens, extra bytes. */
static void write_raw(const char *path, int magic, int version, int count, const uint16_t *tok, size_t n,
                      size_t extra) {
  FILE *f = fopen(path, "wb");
  cr_assert(f);
  int32_t h[256] = {magic, version, count};
  fwrite(h, 4, 256, f);
  if (n) fwrite(tok, 2, n, f);
  for (size_t i = 0; i < extra; i++) fputc(0x5a, f);
  fclose(f);
}

static uint16_t *ramp(size_t n, int base) {
  uint16_t *t = malloc(n * sizeof *t);
  for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(base + i);
  return t;
}

static void write_ramp(const char *path, size_t n, int base) {
  uint16_t *t = ramp(n, base);
  cr_assert_eq(dt_data_write_shard(path, t, n), DT_OK, "%s", dt_err_msg());
  free(t);
}

/* Read a whole file. */
static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)n + 1);
  cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

Test(data, write_and_read_back) {
  uint16_t tok[5] = {0, 1, 65535, 258, 7};
  cr_assert_eq(dt_data_write_shard(P("a.bin"), tok, 5), DT_OK, "%s", dt_err_msg());
  size_t len;
  unsigned char *b = slurp(P("a.bin"), &len);
  cr_assert_eq(len, 1024 + 10);
  int32_t h[256];
  memcpy(h, b, sizeof h);
  cr_expect_eq(h[0], 20240520);
  cr_expect_eq(h[1], 1);
  cr_expect_eq(h[2], 5);
  for (int i = 3; i < 256; i++) cr_expect_eq(h[i], 0);
  /* little-endian uint16 tokens */
  for (int i = 0; i < 5; i++) cr_expect_eq(b[1024 + 2 * i] | b[1024 + 2 * i + 1] << 8, tok[i]);
  free(b);

  dt_data_t *d;
  cr_assert_eq(dt_data_open(&d, P("a.bin"), 65536, 2, 0, 0), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(dt_data_num_tokens(d), 5);
  cr_expect_eq(dt_data_num_shards(d), 1);
  cr_expect_eq(dt_data_num_samples(d), 2); /* (5-1)/2 */
  cr_expect_str_eq(dt_data_shard_path(d, 0), P("a.bin"));
  int in[2], tg[2];
  cr_assert_eq(dt_data_batch(d, 1, 1, in, tg), DT_OK);
  cr_expect(in[0] == 65535 && in[1] == 258 && tg[0] == 258 && tg[1] == 7);
  dt_data_close(d);
  /* no temporary left behind */
  DIR *dd = opendir(dir);
  struct dirent *e;
  while ((e = readdir(dd))) cr_expect(strstr(e->d_name, ".tmp") == NULL, "left %s", e->d_name);
  closedir(dd);
}

static void expect_open_err(const char *pattern, int vocab, int T, dt_status_t want, const char *name,
                            const char *msg) {
  dt_data_t *d = (dt_data_t *)1;
  dt_err_clear();
  dt_status_t st = dt_data_open(&d, pattern, vocab, T, 1, 1);
  cr_expect_eq(st, want, "%s: got %s (%s)", pattern, dt_status_str(st), dt_err_msg());
  cr_expect_null(d);
  cr_expect(strstr(dt_err_msg(), name) != NULL, "message '%s' does not name '%s'", dt_err_msg(), name);
  cr_expect(strstr(dt_err_msg(), msg) != NULL, "message '%s' lacks '%s'", dt_err_msg(), msg);
  cr_expect(strchr(dt_err_msg(), '\n') == NULL, "message is not one line: '%s'", dt_err_msg());
}

Test(data, open_errors) {
  uint16_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  write_raw(P("magic.bin"), 20240521, 1, 8, tok, 8, 0);
  expect_open_err(P("magic.bin"), 256, 2, DT_ERR_DATA, P("magic.bin"), "bad magic 20240521");
  write_raw(P("version.bin"), 20240520, 2, 8, tok, 8, 0);
  expect_open_err(P("version.bin"), 256, 2, DT_ERR_DATA, P("version.bin"), "unsupported shard version 2");
  write_raw(P("trunc.bin"), 20240520, 1, 8, tok, 7, 1); /* 7.5 tokens */
  expect_open_err(P("trunc.bin"), 256, 2, DT_ERR_DATA, P("trunc.bin"), "truncated");
  write_raw(P("trail.bin"), 20240520, 1, 8, tok, 8, 1);
  expect_open_err(P("trail.bin"), 256, 2, DT_ERR_DATA, P("trail.bin"), "1 trailing bytes");
  write_raw(P("more.bin"), 20240520, 1, 9, tok, 8, 0); /* header claims more tokens than present */
  expect_open_err(P("more.bin"), 256, 2, DT_ERR_DATA, P("more.bin"), "truncated: header says 9 tokens");
  write_raw(P("fewer.bin"), 20240520, 1, 6, tok, 8, 0); /* header claims fewer */
  expect_open_err(P("fewer.bin"), 256, 2, DT_ERR_DATA, P("fewer.bin"), "4 trailing bytes: header says 6 tokens");
  write_raw(P("neg.bin"), 20240520, 1, -1, tok, 0, 0);
  expect_open_err(P("neg.bin"), 256, 2, DT_ERR_DATA, P("neg.bin"), "negative token count");
  FILE *f = fopen(P("short.bin"), "wb");
  fwrite(tok, 2, 8, f);
  fclose(f);
  expect_open_err(P("short.bin"), 256, 2, DT_ERR_DATA, P("short.bin"), "shorter than the 1024-byte shard header");
  write_raw(P("vocab.bin"), 20240520, 1, 8, tok, 8, 0);
  expect_open_err(P("vocab.bin"), 5, 2, DT_ERR_DATA, P("vocab.bin"), "token 4 has value 5 >= vocab_size 5");
  expect_open_err(P("nomatch_*.bin"), 256, 2, DT_ERR_DATA, P("nomatch_*.bin"), "no file matches");
  expect_open_err(P("missing.bin"), 256, 2, DT_ERR_DATA, P("missing.bin"), "no such token shard");
  /* too few tokens: 8 tokens, T = 8 needs 9 */
  write_raw(P("few.bin"), 20240520, 1, 8, tok, 8, 0);
  expect_open_err(P("few.bin"), 256, 8, DT_ERR_DATA, P("few.bin"), "too few tokens: 8, need at least T+1 = 9");
  /* several shards, each too short for a window even though the total is enough */
  write_raw(P("few_a.bin"), 20240520, 1, 8, tok, 8, 0);
  write_raw(P("few_b.bin"), 20240520, 1, 8, tok, 8, 0);
  expect_open_err(P("few_*.bin"), 256, 8, DT_ERR_DATA, P("few_*.bin"), "16 in 2 shards");
  /* a bad shard among good ones is named */
  write_raw(P("mix_0.bin"), 20240520, 1, 8, tok, 8, 0);
  write_raw(P("mix_1.bin"), 20240520, 3, 8, tok, 8, 0);
  expect_open_err(P("mix_*.bin"), 256, 2, DT_ERR_DATA, P("mix_1.bin"), "version 3");
  /* directory instead of a file */
  mkdir(P("dir.bin"), 0755);
  expect_open_err(P("dir.bin"), 256, 2, DT_ERR_DATA, P("dir.bin"), "not a regular file");
  expect_open_err(P("mix_0.bin"), 0, 2, DT_ERR_ARG, P("mix_0.bin"), "vocab_size 0");
  expect_open_err(P("mix_0.bin"), 256, 0, DT_ERR_ARG, P("mix_0.bin"), "T = 0");
}

Test(data, unreadable_file) {
  if (geteuid() == 0) {
    teardown(); /* .fini does not run for a skipped test */
    cr_skip_test("root can read mode-000 files");
  }
  uint16_t tok[4] = {1, 2, 3, 4};
  write_raw(P("noread.bin"), 20240520, 1, 4, tok, 4, 0);
  chmod(P("noread.bin"), 0);
  expect_open_err(P("noread.bin"), 256, 2, DT_ERR_IO, P("noread.bin"), "cannot open");
}

/* Expected window of sample s for the shards given as (n, base) ramps: returns token base + offset. */
typedef struct {
  size_t n;
  int base;
} ramp_t;
static int window_token(const ramp_t *sh, int ns, int T, uint64_t s, int t) {
  for (int k = 0; k < ns; k++) {
    uint64_t cnt = sh[k].n > (size_t)T ? (sh[k].n - 1) / T : 0;
    if (s < cnt) return sh[k].base + (int)(s * T) + t;
    s -= cnt;
  }
  cr_assert_fail("sample out of range");
  return -1;
}

static void check_batch(const ramp_t *sh, int ns, int T, const uint64_t *ids, int B, const int *in, const int *tg) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      cr_assert_eq(in[b * T + t], window_token(sh, ns, T, ids[b], t), "input b=%d t=%d sample %llu", b, t,
                   (unsigned long long)ids[b]);
      cr_assert_eq(tg[b * T + t], window_token(sh, ns, T, ids[b], t + 1), "target b=%d t=%d", b, t);
    }
}

Test(data, windows_single_shard) {
  /* 23 tokens 0..22, T = 4: samples at 0, 4, 8, 12, 16 (5 = 22/4); tokens 21, 22 are only targets/unused */
  write_ramp(P("one.bin"), 23, 0);
  dt_data_t *d;
  cr_assert_eq(dt_data_open(&d, P("one.bin"), 256, 4, 0, 7), DT_OK, "%s", dt_err_msg());
  cr_assert_eq(dt_data_num_samples(d), 5);
  int in[4 * 4], tg[4 * 4];
  cr_assert_eq(dt_data_batch(d, 0, 4, in, tg), DT_OK);
  /* hand-written: sample 1 = inputs 4,5,6,7 targets 5,6,7,8 */
  cr_expect(in[4] == 4 && in[7] == 7 && tg[4] == 5 && tg[7] == 8);
  cr_expect(in[0] == 0 && tg[3] == 4 && in[12] == 12 && tg[15] == 16);
  /* wrap into epoch 1 without shuffle: g = 3,4,5,6 -> samples 3,4,0,1 */
  cr_assert_eq(dt_data_batch(d, 3, 4, in, tg), DT_OK);
  cr_expect(in[0] == 12 && in[4] == 16 && tg[7] == 20 && in[8] == 0 && in[12] == 4 && tg[15] == 8);
  ramp_t sh[1] = {{23, 0}};
  uint64_t ids[4] = {3, 4, 0, 1};
  check_batch(sh, 1, 4, ids, 4, in, tg);
  for (uint64_t g = 0; g < 20; g++) cr_expect_eq(dt_data_sample_at(d, g), g % 5);
  cr_expect_eq(dt_data_batch(d, 0, 0, in, tg), DT_ERR_ARG);
  dt_data_close(d);
}

Test(data, windows_multiple_shards) {
  /* Created out of order; glob sorts: s_a (10 tokens, 3 samples of T=3), s_b (7: 2), s_c (3: 0), s_d (4: 1) */
  write_ramp(P("s_d.bin"), 4, 400);
  write_ramp(P("s_b.bin"), 7, 200);
  write_ramp(P("s_c.bin"), 3, 300);
  write_ramp(P("s_a.bin"), 10, 100);
  ramp_t sh[4] = {{10, 100}, {7, 200}, {3, 300}, {4, 400}};
  dt_data_t *d;
  cr_assert_eq(dt_data_open(&d, P("s_*.bin"), 1000, 3, 0, 0), DT_OK, "%s", dt_err_msg());
  cr_assert_eq(dt_data_num_shards(d), 4);
  cr_expect_str_eq(dt_data_shard_path(d, 0), P("s_a.bin"));
  cr_expect_str_eq(dt_data_shard_path(d, 3), P("s_d.bin"));
  cr_assert_eq(dt_data_num_tokens(d), 24);
  cr_assert_eq(dt_data_num_samples(d), 6);
  int in[6 * 3], tg[6 * 3];
  cr_assert_eq(dt_data_batch(d, 0, 6, in, tg), DT_OK);
  uint64_t ids[6] = {0, 1, 2, 3, 4, 5};
  check_batch(sh, 4, 3, ids, 6, in, tg);
  /* by hand: sample 2 is the last window of s_a (106..109), sample 3 starts s_b, sample 5 is s_d */
  cr_expect(in[6] == 106 && tg[8] == 109);
  cr_expect(in[9] == 200 && tg[11] == 203);
  cr_expect(in[12] == 203 && tg[14] == 206);
  cr_expect(in[15] == 400 && tg[17] == 403);
  dt_data_close(d);
}

static void perm_of(dt_data_t *d, uint64_t epoch, uint64_t *p) {
  uint64_t N = dt_data_num_samples(d);
  for (uint64_t i = 0; i < N; i++) p[i] = dt_data_sample_at(d, epoch * N + i);
}

Test(data, permutation) {
  enum { N = 1000, T = 2 };
  write_ramp(P("p.bin"), N * T + 1, 0);
  dt_data_t *a, *b, *c, *id;
  cr_assert_eq(dt_data_open(&a, P("p.bin"), 65536, T, 1, 42), DT_OK, "%s", dt_err_msg());
  cr_assert_eq(dt_data_open(&b, P("p.bin"), 65536, T, 1, 42), DT_OK);
  cr_assert_eq(dt_data_open(&c, P("p.bin"), 65536, T, 1, 43), DT_OK);
  cr_assert_eq(dt_data_open(&id, P("p.bin"), 65536, T, 0, 42), DT_OK);
  static uint64_t pa[3][N], pb[N], pc[N], pid[N];
  for (int e = 0; e < 3; e++) {
    perm_of(a, e, pa[e]);
    char seen[N] = {0};
    for (int i = 0; i < N; i++) {
      cr_assert_lt(pa[e][i], N);
      cr_assert_eq(seen[pa[e][i]], 0, "epoch %d: %llu twice", e, (unsigned long long)pa[e][i]);
      seen[pa[e][i]] = 1;
    }
  }
  for (int e = 0; e < 3; e++)
    for (int f = e + 1; f < 3; f++)
      cr_expect_neq(memcmp(pa[e], pa[f], sizeof pa[0]), 0, "epochs %d and %d have the same order", e, f);
  int fixed = 0;
  for (int i = 0; i < N; i++) fixed += pa[0][i] == (uint64_t)i;
  cr_expect_lt(fixed, 10, "%d fixed points: not shuffled", fixed);
  /* deterministic in (seed, epoch), also when visited in another order (b: epoch 2 first) */
  perm_of(b, 2, pb);
  cr_expect_eq(memcmp(pa[2], pb, sizeof pb), 0);
  perm_of(b, 0, pb);
  cr_expect_eq(memcmp(pa[0], pb, sizeof pb), 0);
  perm_of(c, 0, pc);
  cr_expect_neq(memcmp(pa[0], pc, sizeof pc), 0, "seeds 42 and 43 give the same order");
  for (int e = 0; e < 3; e++) {
    perm_of(id, e, pid);
    for (int i = 0; i < N; i++) cr_assert_eq(pid[i], (uint64_t)i);
  }
  /* shuffled batches are the permuted windows */
  int in[5 * T], tg[5 * T];
  cr_assert_eq(dt_data_batch(a, N + 7, 5, in, tg), DT_OK);
  ramp_t sh[1] = {{N * T + 1, 0}};
  check_batch(sh, 1, T, pa[1] + 7, 5, in, tg);
  dt_data_close(a);
  dt_data_close(b);
  dt_data_close(c);
  dt_data_close(id);
}

Test(data, permutation_pinned) {
  /* Pins the RNG so that a resumed run sees the same order across dtrain versions. Expected values
   * from an independent Python implementation of splitmix64 + Fisher-Yates as in data.c:
   *   state = sm(seed) ^ sm(epoch); for i = N-1..1: j = rejection-sampled next() % (i+1); swap */
  write_ramp(P("p.bin"), 10 * 3 + 1, 0);
  const uint64_t want[3][10] = {{4, 7, 0, 8, 1, 3, 6, 9, 5, 2},  /* seed 1234, epoch 0 */
                                {6, 3, 8, 0, 1, 5, 7, 4, 2, 9},  /* seed 1234, epoch 1 */
                                {6, 3, 2, 9, 8, 1, 4, 7, 0, 5}}; /* seed 0, epoch 0 */
  dt_data_t *d, *z;
  cr_assert_eq(dt_data_open(&d, P("p.bin"), 256, 3, 1, 1234), DT_OK, "%s", dt_err_msg());
  cr_assert_eq(dt_data_open(&z, P("p.bin"), 256, 3, 1, 0), DT_OK);
  uint64_t p[10];
  perm_of(d, 0, p);
  cr_expect_eq(memcmp(p, want[0], sizeof p), 0);
  perm_of(d, 1, p);
  cr_expect_eq(memcmp(p, want[1], sizeof p), 0);
  perm_of(z, 0, p);
  cr_expect_eq(memcmp(p, want[2], sizeof p), 0);
  dt_data_close(d);
  dt_data_close(z);
}

Test(data, dp_split_invariance) {
  /* Two shards (N = 6 + 7 = 13 samples of T = 4), global batch 8, 6 steps = several epochs. The
   * concatenation of dp ranks' slices [g0 + r*8/dp, +8/dp) must equal the dp = 1 global batch, and
   * that must be the windows of sample_at(g). Each rank has its own dt_data, as in a real run. */
  enum { T = 4, GB = 8, STEPS = 6 };
  write_ramp(P("x_0.bin"), 6 * T + 3, 0);
  write_ramp(P("x_1.bin"), 7 * T + 1, 1000);
  ramp_t sh[2] = {{6 * T + 3, 0}, {7 * T + 1, 1000}};
  for (int shuffle = 0; shuffle <= 1; shuffle++) {
    dt_data_t *ref;
    cr_assert_eq(dt_data_open(&ref, P("x_*.bin"), 2000, T, shuffle, 99), DT_OK, "%s", dt_err_msg());
    cr_assert_eq(dt_data_num_samples(ref), 13);
    static int gin[STEPS][GB * T], gtg[STEPS][GB * T];
    for (int s = 0; s < STEPS; s++) {
      cr_assert_eq(dt_data_batch(ref, (uint64_t)s * GB, GB, gin[s], gtg[s]), DT_OK);
      uint64_t ids[GB];
      for (int b = 0; b < GB; b++) ids[b] = dt_data_sample_at(ref, (uint64_t)s * GB + b);
      check_batch(sh, 2, T, ids, GB, gin[s], gtg[s]);
    }
    for (int dp = 2; dp <= 4; dp *= 2) {
      int lb = GB / dp;
      dt_data_t *rank[4];
      for (int r = 0; r < dp; r++) cr_assert_eq(dt_data_open(&rank[r], P("x_*.bin"), 2000, T, shuffle, 99), DT_OK);
      for (int s = 0; s < STEPS; s++) {
        int in[GB * T], tg[GB * T];
        for (int r = 0; r < dp; r++)
          cr_assert_eq(dt_data_batch(rank[r], (uint64_t)s * GB + (uint64_t)r * lb, lb, in + r * lb * T,
                                     tg + r * lb * T),
                       DT_OK);
        cr_expect_eq(memcmp(in, gin[s], sizeof in), 0, "shuffle %d dp %d step %d inputs differ", shuffle, dp, s);
        cr_expect_eq(memcmp(tg, gtg[s], sizeof tg), 0, "shuffle %d dp %d step %d targets differ", shuffle, dp, s);
      }
      for (int r = 0; r < dp; r++) dt_data_close(rank[r]);
    }
    dt_data_close(ref);
  }
}

Test(data, sequential) {
  /* one shard, 40 tokens, T = 4: N = 9, B = 3 -> 3 batches, batch j = tokens [12j, 12j+13) */
  enum { T = 4, B = 3 };
  write_ramp(P("v.bin"), 40, 0);
  dt_data_t *d;
  cr_assert_eq(dt_data_open(&d, P("v.bin"), 256, T, 1, 5), DT_OK, "%s", dt_err_msg()); /* shuffle ignored */
  cr_assert_eq(dt_data_num_sequential_batches(d, B), 3);
  int in[B * T], tg[B * T];
  for (int j = 0; j < 3; j++) {
    cr_assert_eq(dt_data_batch_sequential(d, j, B, in, tg), DT_OK, "%s", dt_err_msg());
    for (int i = 0; i < B * T; i++) {
      cr_assert_eq(in[i], j * B * T + i);
      cr_assert_eq(tg[i], j * B * T + i + 1);
    }
  }
  cr_expect_eq(dt_data_batch_sequential(d, 3, B, in, tg), DT_ERR_ARG);
  cr_expect(strstr(dt_err_msg(), "sequential batch 3 out of range") != NULL, "%s", dt_err_msg());
  cr_expect(strstr(dt_err_msg(), P("v.bin")) != NULL, "%s", dt_err_msg());
  dt_data_close(d);

  /* shard boundary: w_0 10 tokens (2 samples, token 9 only ends no window... tokens 8,9 skipped as
   * inputs), w_1 9 tokens (2 samples); batch 0 = w_0 samples 0,1 then w_1 sample 0 */
  write_ramp(P("w_0.bin"), 10, 0);
  write_ramp(P("w_1.bin"), 9, 100);
  cr_assert_eq(dt_data_open(&d, P("w_*.bin"), 256, T, 0, 0), DT_OK, "%s", dt_err_msg());
  cr_assert_eq(dt_data_num_samples(d), 4);
  cr_assert_eq(dt_data_num_sequential_batches(d, B), 1);
  cr_assert_eq(dt_data_batch_sequential(d, 0, B, in, tg), DT_OK);
  const int want_in[B * T] = {0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103};
  const int want_tg[B * T] = {1, 2, 3, 4, 5, 6, 7, 8, 101, 102, 103, 104};
  cr_expect_eq(memcmp(in, want_in, sizeof in), 0);
  cr_expect_eq(memcmp(tg, want_tg, sizeof tg), 0);
  cr_expect_eq(dt_data_batch_sequential(d, 1, B, in, tg), DT_ERR_ARG);
  dt_data_close(d);
}

Test(data, write_shard_errors) {
  uint16_t tok[3] = {1, 2, 3};
  cr_expect_eq(dt_data_write_shard(P("nodir/a.bin"), tok, 3), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), P("nodir/a.bin")) != NULL, "%s", dt_err_msg());
  /* rename onto a directory fails after the data was written: the temporary must be gone */
  dt_err_clear();
  mkdir(P("isdir.bin"), 0755);
  cr_expect_eq(dt_data_write_shard(P("isdir.bin"), tok, 3), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), P("isdir.bin")) != NULL, "%s", dt_err_msg());
  DIR *dd = opendir(dir);
  struct dirent *e;
  while ((e = readdir(dd))) cr_expect(strstr(e->d_name, ".tmp") == NULL, "left %s", e->d_name);
  closedir(dd);
}

/* ---- prep ---- */

static void write_text(const char *path, const unsigned char *b, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert(f);
  fwrite(b, 1, n, f);
  fclose(f);
}

/* Concatenate the raw tokens of PREFIX_<split>_000000.bin ... (read directly, not via dt_data),
 * check every shard but the last is full; returns the number of shards. */
static int read_split(const char *prefix, const char *split, size_t shard_tokens, unsigned char *out, size_t *n) {
  *n = 0;
  int k = 0;
  for (;; k++) {
    char path[600];
    snprintf(path, sizeof path, "%s_%s_%06d.bin", prefix, split, k);
    if (access(path, F_OK) != 0) break;
    size_t len;
    unsigned char *b = slurp(path, &len);
    int32_t h[3];
    memcpy(h, b, sizeof h);
    cr_assert(h[0] == 20240520 && h[1] == 1 && len == 1024 + 2 * (size_t)h[2], "%s: bad shard", path);
    cr_assert_leq((size_t)h[2], shard_tokens);
    if (k > 0) cr_assert_eq(*n % shard_tokens, 0, "%s: an earlier shard was not full", path);
    for (int i = 0; i < h[2]; i++) {
      cr_assert_eq(b[1024 + 2 * i + 1], 0, "%s: token %d > 255", path, i);
      out[(*n)++] = b[1024 + 2 * i];
    }
    free(b);
  }
  return k;
}

Test(data, prep_round_trip) {
  /* three files: ASCII, UTF-8 and every byte value including 0 */
  const char *a = "It is a truth universally acknowledged,\n";
  const char *u = "caf\xc3\xa9 \xe2\x80\x94 na\xc3\xafve\n";
  unsigned char all[256];
  for (int i = 0; i < 256; i++) all[i] = (unsigned char)i;
  write_text(P("a.txt"), (const unsigned char *)a, strlen(a));
  write_text(P("u.txt"), (const unsigned char *)u, strlen(u));
  write_text(P("all.txt"), all, 256);
  size_t total = strlen(a) + strlen(u) + 256;
  unsigned char text[1024];
  memcpy(text, a, strlen(a));
  memcpy(text + strlen(a), u, strlen(u));
  memcpy(text + strlen(a) + strlen(u), all, 256);
  const char *inputs[3] = {P("a.txt"), P("u.txt"), P("all.txt")};
  char prefix[512];
  snprintf(prefix, sizeof prefix, "%s/out", dir);
  cr_assert_eq(dt_prep_text(inputs, 3, prefix, 7, 0.1), DT_OK, "%s", dt_err_msg());

  size_t n_val_want = (size_t)(total * 0.1), nv, nt;
  unsigned char got[1024];
  int kv = read_split(prefix, "val", 7, got, &nv);
  cr_expect_eq(nv, n_val_want);
  cr_expect_eq(kv, (int)((n_val_want + 6) / 7));
  int kt = read_split(prefix, "train", 7, got + nv, &nt);
  cr_expect_eq(nt, total - n_val_want);
  cr_expect_eq(kt, (int)((total - n_val_want + 6) / 7));
  cr_assert_eq(nv + nt, total);
  cr_expect_eq(memcmp(got, text, total), 0, "val + train tokens differ from the text bytes");

  /* the reader accepts them with vocab 256, and batch tokens are the text bytes */
  dt_data_t *d;
  char pat[600];
  snprintf(pat, sizeof pat, "%s_train_*.bin", prefix);
  cr_assert_eq(dt_data_open(&d, pat, 256, 6, 0, 0), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(dt_data_num_tokens(d), nt);
  cr_expect_eq(dt_data_num_shards(d), kt);
  int in[6], tg[6];
  cr_assert_eq(dt_data_batch(d, 0, 1, in, tg), DT_OK);
  for (int t = 0; t < 6; t++) cr_expect_eq(in[t], text[n_val_want + t]);
  dt_data_close(d);

  /* rerunning with the same settings overwrites; fewer shards would leave stale ones: refused */
  cr_assert_eq(dt_prep_text(inputs, 3, prefix, 7, 0.1), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(dt_prep_text(inputs, 3, prefix, 1000, 0.1), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), "_val_000001.bin: stale shard") != NULL, "%s", dt_err_msg());

  /* val_fraction 0: no val shard; everything in one train shard */
  char prefix2[512];
  snprintf(prefix2, sizeof prefix2, "%s/nov", dir);
  cr_assert_eq(dt_prep_text(inputs, 3, prefix2, 1000, 0.0), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(read_split(prefix2, "val", 1000, got, &nv), 0);
  cr_expect_eq(read_split(prefix2, "train", 1000, got, &nt), 1);
  cr_expect_eq(nt, total);
  cr_expect_eq(memcmp(got, text, total), 0);
}

Test(data, prep_errors) {
  write_text(P("a.txt"), (const unsigned char *)"abc", 3);
  write_text(P("empty.txt"), (const unsigned char *)"", 0);
  const char *in1[1] = {P("a.txt")};
  const char *missing[2] = {P("a.txt"), P("nope.txt")};
  cr_expect_eq(dt_prep_text(missing, 2, P("o"), 10, 0.1), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), P("nope.txt")) != NULL, "%s", dt_err_msg());
  dt_err_clear();
  const char *empty[1] = {P("empty.txt")};
  cr_expect_eq(dt_prep_text(empty, 1, P("o"), 10, 0.1), DT_ERR_DATA);
  cr_expect(strstr(dt_err_msg(), P("empty.txt")) != NULL, "%s", dt_err_msg());
  dt_err_clear();
  cr_expect_eq(dt_prep_text(in1, 1, P("nodir/o"), 10, 0.1), DT_ERR_IO);
  cr_expect(strstr(dt_err_msg(), P("nodir")) != NULL, "%s", dt_err_msg());
  dt_err_clear();
  cr_expect_eq(dt_prep_text(in1, 1, P("a.txt/o"), 10, 0.1), DT_ERR_IO); /* "directory" is a file */
  cr_expect(strstr(dt_err_msg(), P("a.txt")) != NULL, "%s", dt_err_msg());
  dt_err_clear();
  cr_expect_eq(dt_prep_text(in1, 1, P("o"), 0, 0.1), DT_ERR_ARG);
  dt_err_clear();
  cr_expect_eq(dt_prep_text(in1, 1, P("o"), 10, 1.0), DT_ERR_ARG);
  dt_err_clear();
  cr_expect_eq(dt_prep_text(in1, 0, P("o"), 10, 0.1), DT_ERR_ARG);
  /* nothing was written by the failures */
  DIR *dd = opendir(dir);
  struct dirent *e;
  while ((e = readdir(dd))) cr_expect(strstr(e->d_name, ".bin") == NULL, "left %s", e->d_name);
  closedir(dd);
}

static int run_main(int n, ...) {
  char *argv[16];
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) argv[i] = va_arg(ap, char *);
  va_end(ap);
  argv[n] = NULL;
  return dt_prep_main(n, argv);
}

Test(data, prep_main) {
  write_text(P("a.txt"), (const unsigned char *)"hello world\n", 12);
  char f[512], o[512];
  snprintf(f, sizeof f, "%s", P("a.txt"));
  snprintf(o, sizeof o, "%s", P("o"));
  cr_expect_eq(run_main(2, "prep", "--help"), 0);
  cr_expect_eq(run_main(1, "prep"), 2);
  cr_expect_eq(run_main(2, "prep", o), 2);
  cr_expect_eq(run_main(4, "prep", "--bogus", o, f), 2);
  cr_expect_eq(run_main(4, "prep", "--shard-tokens", o, f), 2); /* o is not a number */
  cr_expect_eq(run_main(5, "prep", "--shard-tokens", "0", o, f), 2);
  cr_expect_eq(run_main(5, "prep", "--val-fraction", "1", o, f), 2);
  cr_expect_eq(run_main(4, "prep", o, "--val-fraction"), 1); /* options come first: it is a file name */
  cr_expect_eq(run_main(3, "prep", o, P("nope.txt")), 1);
  cr_expect_eq(run_main(6, "prep", "--shard-tokens=5", "--val-fraction", "0.25", o, f), 0);
  size_t nv, nt;
  unsigned char got[64];
  cr_expect_eq(read_split(o, "val", 5, got, &nv), 1);
  cr_expect_eq(nv, 3);
  cr_expect_eq(read_split(o, "train", 5, got + nv, &nt), 2);
  cr_expect_eq(nt, 9);
  cr_expect_eq(memcmp(got, "hello world\n", 12), 0);
}

Test(data, sampler_free_returns_its_permutation) {
  if (!heap_is_counted()) cr_skip_test("mallinfo2 does not count this allocator's blocks (a sanitizer build)");
  /* 2^20 samples: a 4 MB permutation, far above the sizes freed chunks could hide in */
  const size_t before = heap_in_use();
  dt_sampler_t s;
  cr_assert_eq(dt_sampler_init(&s, 1u << 20, 1, 5, "test"), DT_OK, "%s", dt_err_msg());
  (void)dt_sampler_at(&s, 3);
  cr_expect_geq(heap_in_use(), before + (4u << 20), "the permutation was not allocated");
  dt_sampler_free(&s);
  cr_expect_lt(heap_in_use(), before + 4096, "%zu bytes still in use after dt_sampler_free",
               heap_in_use() - before);
  dt_sampler_free(&s); /* twice: a no-op */
}
