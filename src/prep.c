/* `dtrain prep`: byte-level tokeniser (token = byte value, vocab 256) that turns text files into
 * val/train token shards (see dt_prep_text in data.h), and its command-line front end
 * dt_prep_main. The whole text is held in memory once (bytes), plus one shard of uint16 tokens. */
#include "data.h"

#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NAME_MAX_LEN 4096

/* Read all of `path` and append it to *buf (size *len, capacity *cap). */
static dt_status_t read_append(const char *path, unsigned char **buf, size_t *len, size_t *cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return DT_ERR(DT_ERR_IO, "%s: cannot open input text: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    return DT_ERR(DT_ERR_IO, "%s: input is a directory, not a text file", path);
  }
  for (;;) {
    if (*cap - *len < 65536) {
      size_t ncap = *cap ? *cap * 2 : 1 << 20;
      unsigned char *nb = realloc(*buf, ncap);
      if (!nb) {
        fclose(f);
        return DT_ERR(DT_ERR_NOMEM, "%s: out of memory reading input text", path);
      }
      *buf = nb;
      *cap = ncap;
    }
    size_t got = fread(*buf + *len, 1, *cap - *len, f);
    *len += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  int e = errno;
  fclose(f);
  if (bad) return DT_ERR(DT_ERR_IO, "%s: cannot read input text: %s", path, strerror(e));
  return DT_OK;
}

static int shard_count(size_t n, size_t shard_tokens) { return (int)((n + shard_tokens - 1) / shard_tokens); }

/* Refuse if a PREFIX_<split>_*.bin exists with index >= n_new: it would join the split's glob. */
static dt_status_t check_stale(const char *prefix, const char *split, int n_new) {
  char pat[NAME_MAX_LEN];
  snprintf(pat, sizeof pat, "%s_%s_*.bin", prefix, split);
  glob_t g;
  if (glob(pat, 0, NULL, &g) != 0) {
    globfree(&g);
    return DT_OK; /* no match (or an unreadable dir, which the writes will report) */
  }
  dt_status_t st = DT_OK;
  size_t plen = strlen(prefix) + strlen(split) + 2;
  for (size_t i = 0; i < g.gl_pathc && st == DT_OK; i++) {
    const char *p = g.gl_pathv[i] + plen;
    char *end;
    long idx = strtol(p, &end, 10);
    int ours = end != p && !strcmp(end, ".bin") && idx >= 0 && idx < n_new && end - p == 6;
    if (!ours)
      st = DT_ERR(DT_ERR_IO, "%s: stale shard from an earlier run (this run writes %d %s shard(s)); remove it first",
                  g.gl_pathv[i], n_new, split);
  }
  globfree(&g);
  return st;
}

/* Write text[0..n) as shards PREFIX_<split>_000000.bin ... of at most shard_tokens tokens. */
static dt_status_t write_split(const char *prefix, const char *split, const unsigned char *text, size_t n,
                               size_t shard_tokens, uint16_t *tok, FILE *log) {
  int ns = shard_count(n, shard_tokens);
  for (int k = 0; k < ns; k++) {
    size_t off = (size_t)k * shard_tokens;
    size_t m = n - off < shard_tokens ? n - off : shard_tokens;
    for (size_t i = 0; i < m; i++) tok[i] = text[off + i];
    char path[NAME_MAX_LEN];
    if (snprintf(path, sizeof path, "%s_%s_%06d.bin", prefix, split, k) >= (int)sizeof path)
      return DT_ERR(DT_ERR_ARG, "%s: output prefix too long", prefix);
    DT_TRY(dt_data_write_shard(path, tok, m));
    if (log) fprintf(log, "prep: wrote %s (%zu tokens)\n", path, m);
  }
  return DT_OK;
}

/* Check that the directory part of prefix exists and is a directory. */
static dt_status_t check_outdir(const char *prefix) {
  char dir[NAME_MAX_LEN];
  const char *slash = strrchr(prefix, '/');
  if (!slash) return DT_OK; /* current directory */
  size_t len = (size_t)(slash - prefix);
  if (len == 0) len = 1; /* "/name" */
  if (len >= sizeof dir) return DT_ERR(DT_ERR_ARG, "%s: output prefix too long", prefix);
  memcpy(dir, prefix, len);
  dir[len] = '\0';
  struct stat st;
  if (stat(dir, &st) != 0) return DT_ERR(DT_ERR_IO, "%s: output directory: %s", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return DT_ERR(DT_ERR_IO, "%s: output directory is not a directory", dir);
  return DT_OK;
}

static dt_status_t prep_run(const char *const *inputs, int n_inputs, const char *prefix, size_t shard_tokens,
                            double val_fraction, FILE *log) {
  if (!prefix || !prefix[0]) return DT_ERR(DT_ERR_ARG, "prep: empty output prefix");
  if (n_inputs < 1) return DT_ERR(DT_ERR_ARG, "prep: no input text files");
  if (shard_tokens < 1 || shard_tokens > INT32_MAX)
    return DT_ERR(DT_ERR_ARG, "prep: shard_tokens %zu out of range 1..%d", shard_tokens, INT32_MAX);
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    return DT_ERR(DT_ERR_ARG, "prep: val_fraction %g out of range [0, 1)", val_fraction);
  DT_TRY(check_outdir(prefix));

  unsigned char *text = NULL;
  size_t len = 0, cap = 0;
  dt_status_t st = DT_OK;
  for (int i = 0; i < n_inputs && st == DT_OK; i++) st = read_append(inputs[i], &text, &len, &cap);
  if (st == DT_OK && len == 0)
    st = DT_ERR(DT_ERR_DATA, "%s: input text is empty%s", inputs[0], n_inputs > 1 ? " (all files)" : "");
  size_t n_val = (size_t)floor((double)len * val_fraction);
  if (n_val >= len) n_val = len - 1; /* keep >= 1 train token despite rounding */
  size_t n_train = len - n_val;
  if (st == DT_OK) st = check_stale(prefix, "val", shard_count(n_val, shard_tokens));
  if (st == DT_OK) st = check_stale(prefix, "train", shard_count(n_train, shard_tokens));
  uint16_t *tok = NULL;
  if (st == DT_OK) {
    size_t m = shard_tokens < len ? shard_tokens : len;
    tok = malloc(m * sizeof *tok);
    if (!tok) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory for a shard of %zu tokens", prefix, m);
  }
  if (st == DT_OK) st = write_split(prefix, "val", text, n_val, shard_tokens, tok, log);
  if (st == DT_OK) st = write_split(prefix, "train", text + n_val, n_train, shard_tokens, tok, log);
  if (st == DT_OK && log)
    fprintf(log, "prep: %zu bytes from %d file(s) -> %zu val + %zu train tokens (byte-level, vocab 256)\n", len,
            n_inputs, n_val, n_train);
  free(tok);
  free(text);
  return st;
}

dt_status_t dt_prep_text(const char *const *inputs, int n_inputs, const char *prefix, size_t shard_tokens,
                         double val_fraction) {
  return prep_run(inputs, n_inputs, prefix, shard_tokens, val_fraction, NULL);
}

/* ---- command line --------------------------------------------------------------------- */

static void prep_usage(FILE *out) {
  fprintf(out,
          "usage: dtrain prep [--shard-tokens N] [--val-fraction F] OUTPREFIX FILE...\n"
          "\n"
          "Byte-level tokenise text FILEs (token = byte value, vocab_size 256) into llm.c token\n"
          "shards OUTPREFIX_val_000000.bin ... and OUTPREFIX_train_000000.bin ...\n"
          "The first F of the concatenated bytes go to val, the rest to train.\n"
          "\n"
          "  --shard-tokens N   at most N tokens per shard (default %d)\n"
          "  --val-fraction F   fraction of the text for validation, 0 <= F < 1 (default %g)\n"
          "  -h, --help         show this help\n",
          DT_PREP_DEFAULT_SHARD_TOKENS, DT_PREP_DEFAULT_VAL_FRACTION);
}

/* Value of option `name` given as "--name V" or "--name=V"; NULL if argv[*i] is not it. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, int *missing) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != '\0') return NULL;
  if (*i + 1 >= argc) {
    *missing = 1;
    return NULL;
  }
  return argv[++*i];
}

int dt_prep_main(int argc, char **argv) {
  size_t shard_tokens = DT_PREP_DEFAULT_SHARD_TOKENS;
  double val_fraction = DT_PREP_DEFAULT_VAL_FRACTION;
  int i = 1;
  for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
    const char *v;
    int missing = 0;
    char *end;
    if (!strcmp(argv[i], "--")) {
      i++;
      break;
    }
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      prep_usage(stdout);
      return 0;
    }
    if ((v = opt_value(argc, argv, &i, "--shard-tokens", &missing))) {
      errno = 0;
      unsigned long long x = strtoull(v, &end, 10);
      if (errno || end == v || *end || v[0] == '-' || x < 1 || x > INT32_MAX) {
        fprintf(stderr, "dtrain prep: --shard-tokens: '%s' is not an integer in 1..%d\n", v, INT32_MAX);
        return 2;
      }
      shard_tokens = (size_t)x;
    } else if ((v = opt_value(argc, argv, &i, "--val-fraction", &missing))) {
      errno = 0;
      double x = strtod(v, &end);
      if (errno || end == v || *end || !(x >= 0.0 && x < 1.0)) {
        fprintf(stderr, "dtrain prep: --val-fraction: '%s' is not a number in [0, 1)\n", v);
        return 2;
      }
      val_fraction = x;
    } else if (missing) {
      fprintf(stderr, "dtrain prep: %s needs a value\n", argv[i]);
      return 2;
    } else {
      fprintf(stderr, "dtrain prep: unknown option '%s'\n", argv[i]);
      prep_usage(stderr);
      return 2;
    }
  }
  if (argc - i < 2) {
    fprintf(stderr, "dtrain prep: need OUTPREFIX and at least one input FILE\n");
    prep_usage(stderr);
    return 2;
  }
  dt_err_clear();
  dt_status_t st = prep_run((const char *const *)(argv + i + 1), argc - i - 1, argv[i], shard_tokens, val_fraction,
                            stdout);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain prep: %s\n", dt_err_msg());
    return 1;
  }
  return 0;
}
