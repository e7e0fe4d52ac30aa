/* `dtrain prep`: byte-level tokeniser (token = byte value, vocab 256) that turns text files into
 * val/train token shards (see dt_prep_text in data.h), `--decode` (shards back to text, byte-level
 * or GPT-2), and the command-line front end dt_prep_main, which sends `--tokenizer gpt2` to
 * prep_bpe.c. The byte-level path holds the whole text in memory once, plus one shard. */
#include "bpe.h"
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

dt_status_t dt_prep__check_stale(const char *prefix, const char *split, int n_new) {
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

dt_status_t dt_prep__check_outdir(const char *prefix) {
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
  DT_TRY(dt_prep__check_outdir(prefix));

  unsigned char *text = NULL;
  size_t len = 0, cap = 0;
  dt_status_t st = DT_OK;
  for (int i = 0; i < n_inputs && st == DT_OK; i++) st = read_append(inputs[i], &text, &len, &cap);
  if (st == DT_OK && len == 0)
    st = DT_ERR(DT_ERR_DATA, "%s: input text is empty%s", inputs[0], n_inputs > 1 ? " (all files)" : "");
  size_t n_val = (size_t)floor((double)len * val_fraction);
  if (n_val >= len) n_val = len - 1; /* keep >= 1 train token despite rounding */
  size_t n_train = len - n_val;
  if (st == DT_OK) st = dt_prep__check_stale(prefix, "val", shard_count(n_val, shard_tokens));
  if (st == DT_OK) st = dt_prep__check_stale(prefix, "train", shard_count(n_train, shard_tokens));
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

/* ---- decoding ------------------------------------------------------------------------- */

static dt_status_t decode_shard(const char *path, const dt_bpe_t *bpe, FILE *out, uint8_t **buf, size_t *cap) {
  uint16_t *tok;
  uint64_t n;
  DT_TRY(dt_data_read_shard(path, &tok, &n));
  size_t len = 0;
  dt_status_t st = DT_OK;
  if (bpe) {
    st = dt_bpe_decode(bpe, tok, n, buf, &len, cap);
    if (st != DT_OK) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", dt_err_msg());
      dt_err_clear();
      st = DT_ERR(st, "%s: %s", path, msg);
    }
  } else {
    if (*cap < n) {
      uint8_t *nb = realloc(*buf, n);
      if (!nb) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
      else *buf = nb, *cap = n;
    }
    for (uint64_t i = 0; i < n && st == DT_OK; i++) {
      if (tok[i] > 255)
        st = DT_ERR(DT_ERR_DATA, "%s: token %llu is %d, not a byte: decode GPT-2 shards with --tokenizer gpt2", path,
                    (unsigned long long)i, tok[i]);
      else
        (*buf)[len++] = (uint8_t)tok[i];
    }
  }
  free(tok);
  if (st == DT_OK && fwrite(*buf, 1, len, out) != len) st = DT_ERR(DT_ERR_IO, "decoding %s: write error", path);
  return st;
}

dt_status_t dt_prep_decode(const char *const *globs, int n, const char *vocab_dir, FILE *out) {
  dt_bpe_t *bpe = NULL;
  if (vocab_dir) DT_TRY(dt_bpe_load(&bpe, vocab_dir));
  uint8_t *buf = NULL;
  size_t cap = 0;
  dt_status_t st = DT_OK;
  for (int i = 0; i < n && st == DT_OK; i++) {
    glob_t g;
    int rc = glob(globs[i], 0, NULL, &g);
    if (rc != 0)
      st = DT_ERR(DT_ERR_IO, "%s: no such token shard%s", globs[i], rc == GLOB_NOMATCH ? "" : " (glob failed)");
    for (size_t k = 0; rc == 0 && k < g.gl_pathc && st == DT_OK; k++) st = decode_shard(g.gl_pathv[k], bpe, out, &buf, &cap);
    globfree(&g);
  }
  if (st == DT_OK && fflush(out) != 0) st = DT_ERR(DT_ERR_IO, "decode: write error: %s", strerror(errno));
  free(buf);
  dt_bpe_free(bpe);
  return st;
}

/* ---- command line --------------------------------------------------------------------- */

static void prep_usage(FILE *out) {
  fprintf(out,
          "usage: dtrain prep [--tokenizer byte|gpt2] [--vocab DIR] [--shard-tokens N] [--val-fraction F]\n"
          "                   [--threads N] [--chunk-bytes N] OUTPREFIX FILE...\n"
          "       dtrain prep --decode [--tokenizer byte|gpt2] [--vocab DIR] SHARD...\n"
          "\n"
          "Tokenise text FILEs into llm.c token shards OUTPREFIX_val_000000.bin ... and\n"
          "OUTPREFIX_train_000000.bin ... (256 int32 header, uint16 tokens).\n"
          "  byte (default): token = byte value, vocab_size 256; the first F of the concatenated\n"
          "    bytes go to val, the rest to train.\n"
          "  gpt2: GPT-2's byte-level BPE (vocab_size 50257) from DIR/encoder.json and DIR/vocab.bpe.\n"
          "    Each FILE is one document, preceded by <|endoftext|> (50256) as llm.c writes it.\n"
          "    Val gets the tokens of the text up to the first place at or after the first F of the\n"
          "    bytes where the text can be cut without changing any token; the rest goes to train.\n"
          "    Files are streamed and tokenised in parallel (chunks cut only where that changes no\n"
          "    token); progress goes to stderr every 10 s; shards appear only if everything succeeds.\n"
          "--decode writes the text of the SHARDs (globs, each sorted) to stdout; GPT-2 tokens\n"
          "decode to their bytes, <|endoftext|> to that text.\n"
          "\n"
          "  --tokenizer T      byte or gpt2 (default byte)\n"
          "  --vocab DIR        GPT-2 vocabulary directory (default %s, made by scripts/get-data.sh)\n"
          "  --shard-tokens N   at most N tokens per shard (default %d)\n"
          "  --val-fraction F   fraction of the text for validation, 0 <= F < 1 (default %g)\n"
          "  --threads N        gpt2: tokeniser threads (default: OMP_NUM_THREADS, else all cores)\n"
          "  --chunk-bytes N    gpt2: text per parallel work item, 64..2^30 (default %u)\n"
          "  --decode           shards -> text on stdout\n"
          "  -h, --help         show this help\n",
          DT_PREP_DEFAULT_VOCAB, DT_PREP_DEFAULT_SHARD_TOKENS, DT_PREP_DEFAULT_VAL_FRACTION,
          DT_PREP_DEFAULT_CHUNK_BYTES);
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

/* Unsigned integer option in lo..hi; prints the error and returns -1 if it is not. */
static int parse_uint(const char *opt, const char *v, unsigned long long lo, unsigned long long hi,
                      unsigned long long *x) {
  char *end;
  errno = 0;
  *x = strtoull(v, &end, 10);
  if (errno || end == v || *end || v[0] == '-' || *x < lo || *x > hi) {
    fprintf(stderr, "dtrain prep: %s: '%s' is not an integer in %llu..%llu\n", opt, v, lo, hi);
    return -1;
  }
  return 0;
}

typedef struct {
  dt_prep_opts_t o;
  int gpt2, decode;
  const char *gpt2_only; /* the last option given that only --tokenizer gpt2 takes */
} prep_cli_t;

/* One option at argv[*i]: 0 taken, 1 help, 2 usage error (printed). */
static int parse_opt(int argc, char **argv, int *i, prep_cli_t *c) {
  const char *v;
  int missing = 0;
  unsigned long long x;
  if (!strcmp(argv[*i], "-h") || !strcmp(argv[*i], "--help")) return 1;
  if (!strcmp(argv[*i], "--decode")) {
    c->decode = 1;
  } else if ((v = opt_value(argc, argv, i, "--tokenizer", &missing))) {
    if (strcmp(v, "byte") && strcmp(v, "gpt2")) {
      fprintf(stderr, "dtrain prep: --tokenizer: '%s' is not byte or gpt2\n", v);
      return 2;
    }
    c->gpt2 = !strcmp(v, "gpt2");
  } else if ((v = opt_value(argc, argv, i, "--vocab", &missing))) {
    c->o.vocab_dir = v;
    c->gpt2_only = "--vocab";
  } else if ((v = opt_value(argc, argv, i, "--shard-tokens", &missing))) {
    if (parse_uint("--shard-tokens", v, 1, INT32_MAX, &x)) return 2;
    c->o.shard_tokens = (size_t)x;
  } else if ((v = opt_value(argc, argv, i, "--threads", &missing))) {
    if (parse_uint("--threads", v, 1, 4096, &x)) return 2;
    c->o.threads = (int)x;
    c->gpt2_only = "--threads";
  } else if ((v = opt_value(argc, argv, i, "--chunk-bytes", &missing))) {
    if (parse_uint("--chunk-bytes", v, 64, 1u << 30, &x)) return 2;
    c->o.chunk_bytes = (size_t)x;
    c->gpt2_only = "--chunk-bytes";
  } else if ((v = opt_value(argc, argv, i, "--val-fraction", &missing))) {
    char *end;
    errno = 0;
    double f = strtod(v, &end);
    if (errno || end == v || *end || !(f >= 0.0 && f < 1.0)) {
      fprintf(stderr, "dtrain prep: --val-fraction: '%s' is not a number in [0, 1)\n", v);
      return 2;
    }
    c->o.val_fraction = f;
  } else if (missing) {
    fprintf(stderr, "dtrain prep: %s needs a value\n", argv[*i]);
    return 2;
  } else {
    fprintf(stderr, "dtrain prep: unknown option '%s'\n", argv[*i]);
    prep_usage(stderr);
    return 2;
  }
  return 0;
}

int dt_prep_main(int argc, char **argv) {
  prep_cli_t c = {.o = {DT_PREP_DEFAULT_VOCAB, DT_PREP_DEFAULT_SHARD_TOKENS, DT_PREP_DEFAULT_VAL_FRACTION, 0,
                        DT_PREP_DEFAULT_CHUNK_BYTES}};
  int i = 1;
  for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
    if (!strcmp(argv[i], "--")) {
      i++;
      break;
    }
    int r = parse_opt(argc, argv, &i, &c);
    if (r == 1) prep_usage(stdout);
    if (r) return r == 1 ? 0 : 2;
  }
  if (c.gpt2_only && !c.gpt2) {
    fprintf(stderr, "dtrain prep: %s is for --tokenizer gpt2\n", c.gpt2_only);
    return 2;
  }
  if (argc - i < (c.decode ? 1 : 2)) {
    fprintf(stderr, c.decode ? "dtrain prep: --decode needs at least one SHARD\n"
                             : "dtrain prep: need OUTPREFIX and at least one input FILE\n");
    prep_usage(stderr);
    return 2;
  }
  dt_err_clear();
  const char *const *rest = (const char *const *)(argv + i);
  dt_status_t st;
  if (c.decode)
    st = dt_prep_decode(rest, argc - i, c.gpt2 ? c.o.vocab_dir : NULL, stdout);
  else if (c.gpt2)
    st = dt_prep_gpt2(rest + 1, argc - i - 1, rest[0], &c.o, stdout);
  else
    st = prep_run(rest + 1, argc - i - 1, rest[0], c.o.shard_tokens, c.o.val_fraction, stdout);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain prep: %s\n", dt_err_msg());
    return 1;
  }
  return 0;
}
