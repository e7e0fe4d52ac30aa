/* `dtrain prep --tokenizer gpt2`: text files -> GPT-2 BPE token shards, streamed. Every file is one
 * document and is preceded by <|endoftext|> (as llm.c's data scripts write it), so the token
 * sits between documents. Files are read in chunks of about chunk_bytes, cut only where
 * dt_bpe_safe_split allows (so the tokens are those of the whole file); rounds of 4 chunks per
 * thread are tokenised in parallel (OpenMP, one encoder and cache per thread) while one thread
 * appends the previous round's tokens to the shard being filled and reads the next round.
 * Memory: two rounds of chunks and their tokens, plus one shard. Shards are written under
 * temporary names and renamed into place only when the whole run has succeeded. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bpe.h"
#include "data.h"

#define LOOKAHEAD 4                /* bytes past a cut that dt_bpe_safe_split reads */
#define MAX_CHUNK ((size_t)1 << 30) /* no safe cut in 1 GiB: refuse rather than hold more */

typedef struct {
  uint8_t *buf;
  size_t len, cap;
  int doc_start; /* the file's first chunk: <|endoftext|> goes first */
  int val;       /* belongs to the val split */
  dt_bpe_toks_t toks;
} chunk_t;

/* ---- reading: files -> chunks cut at safe points ---------------------------------------- */

typedef struct {
  const char *const *paths;
  int n_paths, fi; /* file being read; fi == n_paths: done */
  FILE *f;
  int eof, doc_start;
  uint8_t *pend; /* bytes of file fi read but not handed out yet */
  size_t pend_len, pend_cap;
  uint64_t g;         /* offset of pend[0] in the concatenated text */
  uint64_t g_file;    /* offset of file fi's first byte in it */
  uint64_t val_bytes; /* the first chunks up to the first safe cut at or after this go to val */
  size_t chunk_bytes;
} reader_t;

static dt_status_t grow(uint8_t **b, size_t *cap, size_t need, const char *path) {
  if (*cap >= need) return DT_OK;
  size_t c = *cap ? *cap : 1 << 16;
  while (c < need) c *= 2;
  uint8_t *nb = realloc(*b, c);
  if (!nb) return DT_ERR(DT_ERR_NOMEM, "%s: out of memory for a chunk of %zu bytes", path, need);
  *b = nb;
  *cap = c;
  return DT_OK;
}

/* Read file fi until pend holds `want` bytes or the file ends. */
static dt_status_t fill(reader_t *r, size_t want) {
  const char *path = r->paths[r->fi];
  DT_TRY(grow(&r->pend, &r->pend_cap, want, path));
  while (!r->eof && r->pend_len < want) {
    size_t got = fread(r->pend + r->pend_len, 1, want - r->pend_len, r->f);
    r->pend_len += got;
    if (got == 0) {
      if (ferror(r->f)) return DT_ERR(DT_ERR_IO, "%s: cannot read input text: %s", path, strerror(errno));
      r->eof = 1;
    }
  }
  return DT_OK;
}

/* Where the next chunk ends in pend, or 0 with *found = 0 when more bytes are needed. Cuts are
 * safe points (or the end of the file); a cut at p needs pend[p..p+4) to be real bytes. */
static size_t find_cut(const reader_t *r, size_t want, int *found) {
  const uint8_t *s = r->pend;
  size_t n = r->pend_len, lim = r->eof ? n : (n > LOOKAHEAD ? n - LOOKAHEAD : 0);
  *found = 1;
  if (r->g < r->val_bytes && r->val_bytes - r->g <= lim) { /* the val/train cut is in reach */
    for (size_t p = (size_t)(r->val_bytes - r->g); p <= lim; p++)
      if ((r->eof && p == n) || dt_bpe_safe_split(s, n, p)) return p;
  } else {
    if (r->eof && n <= want) return n;
    for (size_t p = want < lim ? want : lim; p > 0; p--)
      if (dt_bpe_safe_split(s, n, p)) return p;
    if (r->eof) return n;
  }
  *found = 0;
  return 0;
}

/* The next chunk into c; 0 when every file has been handed out. */
static dt_status_t reader_next(reader_t *r, chunk_t *c, int *got) {
  *got = 0;
  if (r->fi >= r->n_paths) return DT_OK;
  const char *path = r->paths[r->fi];
  if (!r->f) {
    r->f = fopen(path, "rb");
    if (!r->f) return DT_ERR(DT_ERR_IO, "%s: cannot open input text: %s", path, strerror(errno));
    r->eof = 0;
    r->doc_start = 1;
    r->pend_len = 0;
    r->g_file = r->g;
  }
  size_t want = r->chunk_bytes, cut;
  for (;;) {
    DT_TRY(fill(r, want + LOOKAHEAD));
    int found;
    cut = find_cut(r, want, &found);
    if (found) break;
    if (want >= MAX_CHUNK)
      return DT_ERR(DT_ERR_DATA, "%s: no place to cut the text in the %zu bytes after byte %llu (one pre-token that long?)",
                    path, want, (unsigned long long)(r->g - r->g_file));
    want *= 2;
  }
  /* The chunk takes pend's buffer; the bytes after the cut move to the chunk's old buffer. */
  uint8_t *rest = c->buf;
  size_t rest_cap = c->cap, tail = r->pend_len - cut;
  DT_TRY(grow(&rest, &rest_cap, tail, path));
  if (tail) memcpy(rest, r->pend + cut, tail); /* rest may still be NULL when nothing follows the cut */
  c->buf = r->pend;
  c->cap = r->pend_cap;
  c->len = cut;
  c->doc_start = r->doc_start;
  c->val = r->g < r->val_bytes;
  r->pend = rest;
  r->pend_cap = rest_cap;
  r->pend_len = tail;
  r->g += cut;
  r->doc_start = 0;
  if (r->eof && tail == 0) {
    fclose(r->f);
    r->f = NULL;
    r->fi++;
  }
  *got = 1;
  return DT_OK;
}

/* ---- writing: tokens -> shards under temporary names ------------------------------------ */

typedef struct {
  const char *prefix, *split;
  uint16_t *buf;
  size_t n, cap, shard_tokens;
  int count;      /* shards written */
  uint64_t total; /* tokens */
} writer_t;

static void shard_name(char *out, size_t size, const writer_t *w, int k, int tmp) {
  if (tmp)
    snprintf(out, size, "%s_%s_%06d.bin.prep.%ld", w->prefix, w->split, k, (long)getpid());
  else
    snprintf(out, size, "%s_%s_%06d.bin", w->prefix, w->split, k);
}

static dt_status_t writer_flush(writer_t *w) {
  if (w->n == 0) return DT_OK;
  char path[4200];
  shard_name(path, sizeof path, w, w->count, 1);
  DT_TRY(dt_data_write_shard(path, w->buf, w->n));
  w->count++;
  w->n = 0;
  return DT_OK;
}

static dt_status_t writer_add(writer_t *w, const uint16_t *t, size_t n) {
  w->total += n;
  while (n > 0) {
    if (w->n == w->cap) {
      size_t c = w->cap ? w->cap * 2 : 1 << 20;
      c = c < w->shard_tokens ? c : w->shard_tokens;
      uint16_t *nb = realloc(w->buf, c * sizeof *nb);
      if (!nb) return DT_ERR(DT_ERR_NOMEM, "%s: out of memory for a shard of %zu tokens", w->prefix, c);
      w->buf = nb;
      w->cap = c;
    }
    size_t m = w->cap - w->n < n ? w->cap - w->n : n;
    memcpy(w->buf + w->n, t, m * sizeof *t);
    w->n += m;
    t += m;
    n -= m;
    if (w->n == w->shard_tokens) DT_TRY(writer_flush(w));
  }
  return DT_OK;
}

/* Rename the temporary shards into place (keep = 1) or delete them. */
static dt_status_t writer_finish(writer_t *w, int keep, FILE *log) {
  dt_status_t st = DT_OK;
  for (int k = 0; k < w->count; k++) {
    char tmp[4200], fin[4200];
    shard_name(tmp, sizeof tmp, w, k, 1);
    shard_name(fin, sizeof fin, w, k, 0);
    if (!keep || st != DT_OK) {
      unlink(tmp);
    } else if (rename(tmp, fin) != 0) {
      st = DT_ERR(DT_ERR_IO, "%s: cannot rename %s into place: %s", fin, tmp, strerror(errno));
      unlink(tmp);
    } else if (log) {
      uint64_t n = k + 1 < w->count ? w->shard_tokens : w->total - (uint64_t)k * w->shard_tokens;
      fprintf(log, "prep: wrote %s (%llu tokens)\n", fin, (unsigned long long)n);
    }
  }
  free(w->buf);
  w->buf = NULL;
  return st;
}

/* ---- the run ----------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  reader_t rd;
  writer_t w[2]; /* val, train */
  chunk_t *ch[2];
  int nk[2];
  int eot;
  uint64_t total_bytes, done_bytes;
  double t0, last_report;
} run_t;

/* Append round k's tokens to the writers, then read the next round into it. */
static dt_status_t round_io(run_t *r, int k, int per_round) {
  for (int i = 0; i < r->nk[k]; i++) {
    chunk_t *c = &r->ch[k][i];
    DT_TRY(writer_add(&r->w[c->val ? 0 : 1], c->toks.v, c->toks.n));
    r->done_bytes += c->len;
  }
  double t = now_s();
  if (t - r->last_report >= 10.0 && r->total_bytes > 0) {
    fprintf(stderr, "prep: %.1f%% (%.1f of %.1f MB), %.1f MB/s, %llu tokens\n",
            100.0 * (double)r->done_bytes / (double)r->total_bytes, 1e-6 * (double)r->done_bytes,
            1e-6 * (double)r->total_bytes, 1e-6 * (double)r->done_bytes / (t - r->t0),
            (unsigned long long)(r->w[0].total + r->w[1].total));
    r->last_report = t;
  }
  r->nk[k] = 0;
  for (int got = 1; got && r->nk[k] < per_round;) {
    DT_TRY(reader_next(&r->rd, &r->ch[k][r->nk[k]], &got));
    r->nk[k] += got;
  }
  return DT_OK;
}

static dt_status_t encode_chunk(dt_bpe_enc_t *e, chunk_t *c, int eot) {
  c->toks.n = 0;
  if (c->doc_start) {
    if (c->toks.cap == 0) {
      c->toks.v = malloc(1024 * sizeof *c->toks.v);
      if (!c->toks.v) return DT_ERR(DT_ERR_NOMEM, "prep: out of memory for tokens");
      c->toks.cap = 1024;
    }
    c->toks.v[c->toks.n++] = (uint16_t)eot;
  }
  return dt_bpe_encode(e, c->buf, c->len, &c->toks);
}

/* Tokenise round `cur` on all threads while one of them does round_io on the other round. */
static dt_status_t run_rounds(run_t *r, dt_bpe_enc_t **enc, int threads, int per_round) {
  dt_status_t io_st = round_io(r, 0, per_round), enc_st = DT_OK;
  int cur = 0;
#pragma omp parallel num_threads(threads)
  {
    dt_bpe_enc_t *e = enc[omp_get_thread_num()];
    for (;;) {
      if (r->nk[cur] == 0 || io_st != DT_OK || enc_st != DT_OK) break; /* same view on every thread */
#pragma omp single nowait
      io_st = round_io(r, 1 - cur, per_round);
#pragma omp for schedule(dynamic, 1)
      for (int i = 0; i < r->nk[cur]; i++) {
        dt_status_t s = encode_chunk(e, &r->ch[cur][i], r->eot);
        if (s != DT_OK) {
#pragma omp atomic write
          enc_st = s;
        }
      }
#pragma omp single
      cur = 1 - cur;
    }
  }
  DT_TRY(io_st);
  DT_TRY(enc_st);
  return round_io(r, 1 - cur, 0); /* the last round's tokens */
}

/* The inputs' sizes (and that each is a readable regular file) before any work. */
static dt_status_t stat_inputs(const char *const *inputs, int n, uint64_t *total) {
  *total = 0;
  for (int i = 0; i < n; i++) {
    struct stat st;
    if (stat(inputs[i], &st) != 0) return DT_ERR(DT_ERR_IO, "%s: cannot open input text: %s", inputs[i], strerror(errno));
    if (S_ISDIR(st.st_mode)) return DT_ERR(DT_ERR_IO, "%s: input is a directory, not a text file", inputs[i]);
    if (access(inputs[i], R_OK) != 0)
      return DT_ERR(DT_ERR_IO, "%s: cannot open input text: %s", inputs[i], strerror(errno));
    *total += (uint64_t)st.st_size;
  }
  return DT_OK;
}

static dt_status_t check_opts(int n_inputs, const char *prefix, const dt_prep_opts_t *o) {
  if (!prefix || !prefix[0]) return DT_ERR(DT_ERR_ARG, "prep: empty output prefix");
  if (n_inputs < 1) return DT_ERR(DT_ERR_ARG, "prep: no input text files");
  if (o->shard_tokens < 1 || o->shard_tokens > INT32_MAX)
    return DT_ERR(DT_ERR_ARG, "prep: shard_tokens %zu out of range 1..%d", o->shard_tokens, INT32_MAX);
  if (!(o->val_fraction >= 0.0 && o->val_fraction < 1.0))
    return DT_ERR(DT_ERR_ARG, "prep: val_fraction %g out of range [0, 1)", o->val_fraction);
  if (o->threads < 0 || o->threads > 4096) return DT_ERR(DT_ERR_ARG, "prep: threads %d out of range 0..4096", o->threads);
  if (o->chunk_bytes < 64 || o->chunk_bytes > MAX_CHUNK)
    return DT_ERR(DT_ERR_ARG, "prep: chunk_bytes %zu out of range 64..%zu", o->chunk_bytes, MAX_CHUNK);
  return DT_OK;
}

dt_status_t dt_prep_gpt2(const char *const *inputs, int n_inputs, const char *prefix, const dt_prep_opts_t *o,
                         FILE *log) {
  DT_TRY(check_opts(n_inputs, prefix, o));
  DT_TRY(dt_prep__check_outdir(prefix));
  run_t r = {0};
  DT_TRY(stat_inputs(inputs, n_inputs, &r.total_bytes));
  if (r.total_bytes == 0)
    return DT_ERR(DT_ERR_DATA, "%s: input text is empty%s", inputs[0], n_inputs > 1 ? " (all files)" : "");
  dt_bpe_t *bpe;
  DT_TRY(dt_bpe_load(&bpe, o->vocab_dir));
  int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
  int per_round = 4 * threads;
  dt_bpe_enc_t **enc = calloc((size_t)threads, sizeof *enc);
  r.ch[0] = calloc((size_t)per_round, sizeof *r.ch[0]);
  r.ch[1] = calloc((size_t)per_round, sizeof *r.ch[1]);
  dt_status_t st = enc && r.ch[0] && r.ch[1] ? DT_OK : DT_ERR(DT_ERR_NOMEM, "prep: out of memory");
  for (int t = 0; t < threads && st == DT_OK; t++) st = dt_bpe_enc_init(&enc[t], bpe);
  r.rd = (reader_t){.paths = inputs, .n_paths = n_inputs, .chunk_bytes = o->chunk_bytes};
  r.rd.val_bytes = (uint64_t)floor((double)r.total_bytes * o->val_fraction);
  r.w[0] = (writer_t){.prefix = prefix, .split = "val", .shard_tokens = o->shard_tokens};
  r.w[1] = (writer_t){.prefix = prefix, .split = "train", .shard_tokens = o->shard_tokens};
  r.eot = dt_bpe_eot(bpe);
  r.t0 = r.last_report = now_s();
  if (st == DT_OK) st = run_rounds(&r, enc, threads, per_round);
  if (st == DT_OK) st = writer_flush(&r.w[0]);
  if (st == DT_OK) st = writer_flush(&r.w[1]);
  if (st == DT_OK && r.w[1].total == 0)
    st = DT_ERR(DT_ERR_DATA, "%s: no tokens left for train: val_fraction %g takes the whole text", inputs[0],
                o->val_fraction);
  if (st == DT_OK) st = dt_prep__check_stale(prefix, "val", r.w[0].count);
  if (st == DT_OK) st = dt_prep__check_stale(prefix, "train", r.w[1].count);
  double secs = now_s() - r.t0;
  dt_status_t st0 = writer_finish(&r.w[0], st == DT_OK, log);
  dt_status_t st1 = writer_finish(&r.w[1], st == DT_OK && st0 == DT_OK, log);
  if (st == DT_OK) st = st0 != DT_OK ? st0 : st1;
  if (st == DT_OK && log)
    fprintf(log,
            "prep: %llu bytes in %d document(s) -> %llu val + %llu train tokens (GPT-2 BPE, vocab %d, "
            "<|endoftext|> before each document) in %.2f s, %.1f MB/s on %d thread(s)\n",
            (unsigned long long)r.total_bytes, n_inputs, (unsigned long long)r.w[0].total,
            (unsigned long long)r.w[1].total, dt_bpe_vocab_size(bpe), secs, 1e-6 * (double)r.total_bytes / secs,
            threads);
  if (r.rd.f) fclose(r.rd.f);
  free(r.rd.pend);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; r.ch[k] && i < per_round; i++) {
      free(r.ch[k][i].buf);
      free(r.ch[k][i].toks.v);
    }
    free(r.ch[k]);
  }
  for (int t = 0; enc && t < threads; t++) dt_bpe_enc_free(enc[t]);
  free(enc);
  dt_bpe_free(bpe);
  return st;
}
