/* `dtrain generate CONFIG [--checkpoint FILE|DIR] [--prompt TEXT] [--tokens N] ...`: text from a
 * checkpoint's weights, one token at a time through the model's key/value cache (gpt2.h
 * dt_gpt2_decode: the prompt once, then one position per step, no prefix recomputed), on the
 * config's backend and tensor-parallel layout (any checkpoint layout loads). Every rank runs the
 * same steps; rank 0 samples (sample.h), broadcasts the token and prints the text. --verify also
 * runs the uncached forward of the whole sequence at every step and compares its logits. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "cli.h"
#include "data.h"
#include "mpi_check.h"
#include "sample.h"
#include "train.h"

typedef struct {
  const char *cfg_path, *ckpt, *prompt, *vocab;
  int tokens, top_k, tokenizer; /* tokenizer: -1 from the vocabulary size, 0 byte, 1 gpt2 */
  float temperature;
  long long seed; /* -1: train.seed */
  int print_tokens, verify;
  char *over[256];
  int n_over;
} gen_opts_t;

static int usage(FILE *out, int code) {
  fprintf(out,
          "usage: dtrain generate CONFIG.ini [--checkpoint FILE|DIR] [--prompt TEXT] [--tokens N]\n"
          "       [--temperature T] [--top-k K] [--seed S] [--tokenizer byte|gpt2] [--vocab DIR]\n"
          "       [--print-tokens] [--verify] [section.key=value ...]\n"
          "Samples N tokens (default 64) after the prompt from the checkpoint's weights with a key/value\n"
          "cache and prints the text. --checkpoint defaults to checkpoint.dir (a directory: its latest\n"
          "complete checkpoint). Temperature 0 is greedy (argmax); default 1. --top-k 0 (default) keeps the\n"
          "whole vocabulary. --seed defaults to train.seed: the same seed gives the same text. The\n"
          "tokenizer is gpt2 (vocabulary in --vocab, default " DT_PREP_DEFAULT_VOCAB ") when model.vocab_size\n"
          "is above 256, else byte; an empty prompt starts from <|endoftext|> (gpt2) or a newline (byte).\n"
          "The prompt and the new tokens together must fit model.seq_len. Runs on the cpu and cuda\n"
          "backends with parallel.tp = any (every rank runs it); parallel.pp = 1 only.\n"
          "--print-tokens adds a last line 'tokens: PROMPT_IDS | NEW_IDS'. --verify recomputes every step's\n"
          "logits without the cache (the full forward of the whole sequence; slow) and fails if they differ.\n");
  return code;
}

static int parse_num(const char *opt, const char *v, double lo, double hi, double *out) {
  char *end;
  double x = strtod(v, &end);
  if (!*v || *end || !(x >= lo && x <= hi)) {
    fprintf(stderr, "dtrain generate: %s: '%s' is not a number in [%g, %g]\n", opt, v, lo, hi);
    return 2;
  }
  *out = x;
  return 0;
}

/* 0 ok, 2 usage error (printed), 1 --help. */
static int parse_args(int argc, char **argv, gen_opts_t *o) {
  *o = (gen_opts_t){.tokens = 64, .tokenizer = -1, .temperature = 1.0f, .seed = -1, .vocab = DT_PREP_DEFAULT_VOCAB};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    double x = 0;
    int used = 1; /* the option takes a value */
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0), 1;
    if (!strcmp(a, "--print-tokens")) o->print_tokens = 1, used = 0;
    else if (!strcmp(a, "--verify")) o->verify = 1, used = 0;
    else if (a[0] != '-') {
      if (!o->cfg_path) o->cfg_path = a;
      else if (o->n_over < 256) o->over[o->n_over++] = argv[i];
      used = 0;
    } else if (!v) {
      fprintf(stderr, "dtrain generate: unknown or incomplete option '%s'\n", a);
      return usage(stderr, 2);
    } else if (!strcmp(a, "--checkpoint")) o->ckpt = v;
    else if (!strcmp(a, "--prompt")) o->prompt = v;
    else if (!strcmp(a, "--vocab")) o->vocab = v;
    else if (!strcmp(a, "--tokenizer")) {
      if (strcmp(v, "byte") && strcmp(v, "gpt2")) {
        fprintf(stderr, "dtrain generate: --tokenizer: '%s' is not byte or gpt2\n", v);
        return 2;
      }
      o->tokenizer = !strcmp(v, "gpt2");
    } else if (!strcmp(a, "--tokens")) {
      if (parse_num(a, v, 1, 1 << 20, &x) || x != floor(x)) return 2;
      o->tokens = (int)x;
    } else if (!strcmp(a, "--top-k")) {
      if (parse_num(a, v, 0, 1 << 24, &x) || x != floor(x)) return 2;
      o->top_k = (int)x;
    } else if (!strcmp(a, "--temperature")) {
      if (parse_num(a, v, 0, 1e6, &x)) return 2;
      o->temperature = (float)x;
    } else if (!strcmp(a, "--seed")) {
      if (parse_num(a, v, 0, 9e15, &x) || x != floor(x)) return 2;
      o->seed = (long long)x;
    } else {
      fprintf(stderr, "dtrain generate: unknown option '%s'\n", a);
      return usage(stderr, 2);
    }
    i += used;
  }
  if (!o->cfg_path) return usage(stderr, 2);
  return 0;
}

/* The text side: the prompt's token ids and the bytes of a token. */
typedef struct {
  dt_bpe_t *bpe; /* NULL: byte-level */
  int *ids, n;
} gen_text_t;

static dt_status_t encode_prompt(gen_text_t *tx, const gen_opts_t *o, int V) {
  const char *p = o->prompt ? o->prompt : "";
  size_t len = strlen(p);
  tx->ids = malloc((len + 1) * sizeof(int));
  if (!tx->ids) return DT_ERR(DT_ERR_NOMEM, "generate: out of memory");
  if (!tx->bpe) {
    for (size_t i = 0; i < len; i++) tx->ids[i] = (unsigned char)p[i];
    tx->n = (int)len;
    if (!len) tx->ids[tx->n++] = '\n';
    for (int i = 0; i < tx->n; i++)
      if (tx->ids[i] >= V)
        return DT_ERR(DT_ERR_ARG, "generate: --prompt byte %d is outside model.vocab_size = %d", tx->ids[i], V);
    return DT_OK;
  }
  dt_bpe_enc_t *e = NULL;
  dt_bpe_toks_t t = {0};
  dt_status_t st = dt_bpe_enc_init(&e, tx->bpe);
  if (st == DT_OK) st = dt_bpe_encode(e, (const uint8_t *)p, len, &t);
  dt_bpe_enc_free(e);
  if (st == DT_OK && t.n + 1 > len + 1) {
    int *ids = realloc(tx->ids, (t.n + 1) * sizeof(int));
    if (!ids) st = DT_ERR(DT_ERR_NOMEM, "generate: out of memory");
    else tx->ids = ids;
  }
  if (st == DT_OK) {
    for (size_t i = 0; i < t.n; i++) tx->ids[i] = t.v[i];
    tx->n = (int)t.n;
    if (!t.n) tx->ids[tx->n++] = dt_bpe_eot(tx->bpe);
    for (int i = 0; i < tx->n && st == DT_OK; i++)
      if (tx->ids[i] >= V) st = DT_ERR(DT_ERR_ARG, "generate: GPT-2 token %d is outside model.vocab_size = %d", tx->ids[i], V);
  }
  free(t.v);
  return st;
}

static void print_token(const gen_text_t *tx, int id) {
  if (!tx->bpe) {
    putchar(id);
  } else {
    size_t n = 0;
    const uint8_t *b = dt_bpe_token_bytes(tx->bpe, id, &n);
    fwrite(b, 1, n, stdout);
  }
  fflush(stdout);
}

/* The uncached reference: the training forward of the whole sequence so far; *worst = the largest
 * |cached - uncached| relative to the largest |logit|. An argmax that differs where the reference's
 * two best logits are further apart than tol fails. */
static dt_status_t verify_step(dt_trainer_t *tr, dt_gpt2_kv_t *kv, const int *seq, int n, const float *cached,
                               float *ref, float tol, double *worst) {
  const int V = tr->lay.d.V;
  DT_TRY(dt_gpt2_forward(&tr->model, seq, NULL, 1, n, NULL));
  DT_TRY(dt_gpt2_kv_logits(&tr->model, kv, ref));
  double scale = 1e-30, diff = 0;
  for (int v = 0; v < V; v++) {
    scale = fmax(scale, fabs(ref[v]));
    diff = fmax(diff, fabs((double)cached[v] - ref[v]));
  }
  *worst = fmax(*worst, diff / scale);
  int a = dt_sample_argmax(cached, V), b = dt_sample_argmax(ref, V);
  if (diff > tol * scale || (a != b && ref[b] - ref[a] > tol * scale))
    return DT_ERR(DT_ERR_NUMERIC, "generate --verify: position %d: cached logits differ from the full forward's by "
                  "%.3g relative (tolerance %.3g), argmax %d vs %d", n - 1, diff / scale, tol, a, b);
  return DT_OK;
}

/* The loop: prompt, then one token per step; ids holds prompt + new tokens. */
static dt_status_t generate(dt_trainer_t *tr, const gen_opts_t *o, const gen_text_t *tx, int rank, int *ids) {
  const int V = tr->lay.d.V, total = tx->n + o->tokens;
  MPI_Comm w;
  DT_TRY(dt_comm_mpi_handle(tr->mesh.world, &w));
  dt_gpt2_kv_t *kv = NULL;
  float *logits = malloc(2 * (size_t)V * sizeof(float));
  void *scratch = malloc(dt_sample_scratch_bytes(V));
  dt_status_t st = logits && scratch ? DT_OK : DT_ERR(DT_ERR_NOMEM, "generate: out of memory");
  if (st == DT_OK) st = dt_gpt2_kv_init(&tr->model, total, &kv);
  dt_rng_t rng;
  dt_rng_seed(&rng, o->seed >= 0 ? (uint64_t)o->seed : tr->cfg.seed);
  const float tol = tr->be.precision == DT_PREC_FP32 ? 1e-4f : 5e-2f;
  double worst = 0;
  memcpy(ids, tx->ids, (size_t)tx->n * sizeof(int));
  for (int n = tx->n; st == DT_OK && n < total; n++) {
    const int pos = dt_gpt2_kv_pos(kv);
    st = dt_gpt2_decode(&tr->model, kv, ids + pos, n - pos); /* the prompt, then the last token */
    if (st == DT_OK) st = dt_gpt2_kv_logits(&tr->model, kv, logits);
    if (st == DT_OK && o->verify) st = verify_step(tr, kv, ids, n, logits, logits + V, tol, &worst);
    if (st != DT_OK) break;
    ids[n] = rank == 0 ? dt_sample(logits, V, o->temperature, o->top_k, &rng, scratch) : 0;
    DT_MPI_KEEP(st, MPI_Bcast(&ids[n], 1, MPI_INT, 0, w));
    if (rank == 0 && st == DT_OK) print_token(tx, ids[n]);
  }
  if (rank == 0) { /* the text's end, before any line on stderr */
    putchar('\n');
    fflush(stdout);
  }
  if (st == DT_OK && rank == 0 && o->verify)
    fprintf(stderr, "# verify: %d positions, cached logits within %.3g (relative) of the full forward's, tolerance %.3g\n",
            o->tokens, worst, tol);
  dt_gpt2_kv_free(&tr->model, kv);
  free(logits);
  free(scratch);
  return st;
}

static void print_ids(const int *ids, int n, int split) {
  printf("tokens:");
  for (int i = 0; i < n; i++) printf(i == split ? " | %d" : " %d", ids[i]);
  printf("\n");
}

int dt_generate_main(int argc, char **argv) {
  gen_opts_t o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc == 1 ? 0 : rc;
  int rank;
  dt_mpi_init(&argc, &argv, &rank);
  dt_config_t cfg;
  if (dt_cli_load_config(&cfg, o.cfg_path, o.n_over, o.over) != DT_OK || dt_cli_gpt2_only(&cfg, o.cfg_path, "generate")) {
    if (rank == 0) fprintf(stderr, "dtrain: %s\n", dt_err_msg());
    MPI_Finalize();
    return 2;
  }
  /* one sequence: activations for 1 x seq_len, all ranks over tp (and dp copies), no ZeRO sharding */
  cfg.micro_batch = 1;
  cfg.grad_accum = cfg.micro_batches = cfg.global_batch = 0;
  cfg.zero = 0;
  static dt_trainer_t tr;
  gen_text_t tx = {0};
  int *ids = NULL;
  char used[4096] = "";
  const char *ckpt = o.ckpt ? o.ckpt : cfg.ckpt_dir;
  int gpt2 = o.tokenizer >= 0 ? o.tokenizer : cfg.vocab_size > 256;
  dt_status_t st = gpt2 ? dt_bpe_load(&tx.bpe, o.vocab) : DT_OK;
  if (st == DT_OK) st = encode_prompt(&tx, &o, cfg.vocab_size);
  if (st == DT_OK && tx.n + o.tokens > cfg.seq_len)
    st = DT_ERR(DT_ERR_ARG, "generate: the prompt's %d tokens + --tokens %d exceed model.seq_len = %d", tx.n, o.tokens,
                cfg.seq_len);
  if (st == DT_OK && !(ids = malloc((size_t)(tx.n + o.tokens) * sizeof(int))))
    st = DT_ERR(DT_ERR_NOMEM, "generate: out of memory");
  if (st == DT_OK && !ckpt[0]) st = DT_ERR(DT_ERR_ARG, "generate: no --checkpoint and checkpoint.dir is empty");
  if (st == DT_OK) st = dt_trainer_init_model(&tr, &cfg, o.cfg_path);
  if (st == DT_OK) st = dt_trainer_load_checkpoint(&tr, ckpt, used, sizeof used);
  if (st == DT_OK && rank == 0) {
    fprintf(stderr,
            "# generate: checkpoint %s, %s backend%s, tp=%d, %s tokenizer, prompt %d tokens, %d new, "
            "temperature %g, top-k %d\n",
            used, tr.be.ops->name, tr.be.act_bytes == 2 ? " (16-bit storage)" : "", tr.lay.tp, gpt2 ? "gpt2" : "byte",
            tx.n, o.tokens, o.temperature, o.top_k);
    for (int i = 0; i < tx.n; i++) print_token(&tx, tx.ids[i]);
  }
  if (st == DT_OK) st = generate(&tr, &o, &tx, rank, ids);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain: rank %d: %s\n", rank, dt_err_msg());
    MPI_Abort(MPI_COMM_WORLD, st == DT_ERR_CONFIG || st == DT_ERR_ARG ? 2 : 1);
    return 1;
  }
  if (rank == 0 && o.print_tokens) print_ids(ids, tx.n + o.tokens, tx.n);
  free(ids);
  free(tx.ids);
  dt_bpe_free(tx.bpe);
  dt_trainer_free(&tr);
  MPI_Finalize();
  return 0;
}
