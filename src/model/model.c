/* GPT-2 model description: parameter arena layout (named tensors, DT_ALIGN-aligned, block-major),
 * GPT-2 initialisation, FLOP count and the deterministic RNG (splitmix64 + Box-Muller) used for
 * seeding. See model.h for the layout contract. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

dt_dims_t dt_dims_from_config(const dt_config_t *cfg) {
  dt_dims_t d;
  d.L = cfg->n_layer;
  d.NH = cfg->n_head;
  d.C = cfg->n_embd;
  d.V = cfg->vocab_size;
  d.Vp = dt_config_padded_vocab(cfg);
  d.T = cfg->seq_len;
  return d;
}

/* ---- RNG ------------------------------------------------------------------------------------ */

void dt_rng_seed(dt_rng_t *r, uint64_t seed) { r->s = seed; }

uint64_t dt_rng_next(dt_rng_t *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double dt_rng_uniform(dt_rng_t *r) { return (double)(dt_rng_next(r) >> 11) * 0x1.0p-53; }

double dt_rng_normal(dt_rng_t *r) {
  double u1 = 1.0 - dt_rng_uniform(r); /* (0, 1]: log is finite */
  double u2 = dt_rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ---- layout --------------------------------------------------------------------------------- */

static size_t align_up(size_t n) { return (n + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN; }

/* Shard of one tensor: split dim, block count, this rank's first global index, block stride. */
typedef struct { int split, nblk, g0, gstride; } shard_t;

static void add_tensor(dt_layout_t *lay, size_t *off, const char *name, int rows, int cols, int ndim, int decay,
                       int layer, shard_t sh) {
  dt_tensor_t *t = &lay->tensors[lay->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->offset = *off;
  t->grows = rows;
  t->gcols = cols;
  t->split = lay->tp > 1 ? sh.split : DT_SPLIT_NONE;
  t->nblk = 1;
  t->g0 = 0;
  t->gstride = 0;
  if (t->split != DT_SPLIT_NONE) {
    t->nblk = sh.nblk;
    t->g0 = sh.g0;
    t->gstride = sh.gstride;
    if (t->split == DT_SPLIT_ROWS) rows /= lay->tp;
    else cols /= lay->tp;
  }
  t->rows = rows;
  t->cols = cols;
  t->ndim = ndim;
  t->decay = decay;
  t->layer = layer;
  *off = align_up(*off + (size_t)rows * cols);
}

long dt_tensor_local_index(const dt_tensor_t *t, int gr, int gc) {
  if (gr < 0 || gr >= t->grows || gc < 0 || gc >= t->gcols) return -1;
  if (t->split == DT_SPLIT_NONE) return (long)t->offset + (long)gr * t->cols + gc;
  int ext = t->split == DT_SPLIT_ROWS ? t->rows : t->cols, bl = ext / t->nblk;
  int g = t->split == DT_SPLIT_ROWS ? gr : gc;
  for (int b = 0; b < t->nblk; b++) {
    int rel = g - (t->g0 + b * t->gstride);
    if (rel < 0 || rel >= bl) continue;
    int l = b * bl + rel;
    return t->split == DT_SPLIT_ROWS ? (long)t->offset + (long)l * t->cols + gc
                                     : (long)t->offset + (long)gr * t->cols + l;
  }
  return -1;
}

/* The tensor just added is not on this pipeline stage: it keeps its name and global shape (the
 * checkpoint's datasets are the global model's) but holds nothing and takes no arena space. */
static void drop_last(dt_layout_t *lay, size_t *off) {
  dt_tensor_t *t = &lay->tensors[lay->n_tensors - 1];
  *off = t->offset;
  t->rows = t->cols = 0;
  t->absent = 1;
}

/* The tp shard of rank tp_rank holding blocks [l0, l1), the embeddings (first), ln_f (last) and
 * wte also on the last stage (a tied copy unless it is the first too). */
static dt_status_t build(dt_layout_t *lay, dt_dims_t d, int tp, int tp_rank, int l0, int l1, int first, int last) {
  memset(lay, 0, sizeof *lay);
  lay->tp = tp;
  lay->tp_rank = tp_rank;
  if (tp < 1 || tp_rank < 0 || tp_rank >= tp)
    return DT_ERR(DT_ERR_CONFIG, "parallel.tp: %d with tensor-parallel rank %d is invalid", tp, tp_rank);
  if (d.L < 1 || d.NH < 1 || d.C < 1 || d.V < 1 || d.T < 1)
    return DT_ERR(DT_ERR_CONFIG, "model: dimensions must be positive (L=%d NH=%d C=%d V=%d T=%d)", d.L, d.NH, d.C,
                  d.V, d.T);
  if (d.C % d.NH != 0)
    return DT_ERR(DT_ERR_CONFIG, "model: n_embd %d is not divisible by n_head %d", d.C, d.NH);
  if (d.Vp < d.V) return DT_ERR(DT_ERR_CONFIG, "model: padded vocab %d < vocab %d", d.Vp, d.V);
  if (d.NH % tp != 0)
    return DT_ERR(DT_ERR_CONFIG, "parallel.tp: %d does not divide model.n_head %d (attention heads are split over tp)",
                  tp, d.NH);
  if (d.Vp % tp != 0)
    return DT_ERR(DT_ERR_CONFIG, "parallel.tp: %d does not divide the padded vocab %d (wte rows are split over tp)", tp,
                  d.Vp);
  lay->d = d;
  int n = 2 + DT_BLOCK_TENSORS * d.L + 2;
  lay->tensors = calloc((size_t)n, sizeof *lay->tensors);
  lay->layer_begin = calloc((size_t)d.L + 3, sizeof *lay->layer_begin);
  if (!lay->tensors || !lay->layer_begin) {
    dt_layout_free(lay);
    return DT_ERR(DT_ERR_NOMEM, "model: cannot allocate the layout of %d tensors", n);
  }
  const int C = d.C;
  size_t off = 0;
  char nm[48];
  lay->layer_begin[0] = 0;
  const int r = tp_rank, Ct = C / tp;
  const shard_t rep = {DT_SPLIT_NONE, 1, 0, 0};
  add_tensor(lay, &off, "wte.weight", d.Vp, C, 2, 1, -1, (shard_t){DT_SPLIT_ROWS, 1, r * (d.Vp / tp), 0});
  if (!first && !last) drop_last(lay, &off);
  else if (!first) lay->tensors[0].tied_copy = 1;
  add_tensor(lay, &off, "wpe.weight", d.T, C, 2, 1, -1, rep);
  if (!first) drop_last(lay, &off);
  static const struct {
    const char *name;
    int rows_mult, cols_mult, ndim; /* rows = rows_mult*C (1 for 1-D), cols = cols_mult*C */
    int split, nblk, mult; /* tp shard: split dim, blocks, block length = mult*C/tp (stride C) */
  } blk[DT_BLOCK_TENSORS] = { /* 2-D weights are Conv1D's (in, out) */
      {"ln_1.weight", 0, 1, 1, 0, 1, 0},                    {"ln_1.bias", 0, 1, 1, 0, 1, 0},
      {"attn.c_attn.weight", 1, 3, 2, DT_SPLIT_COLS, 3, 1}, {"attn.c_attn.bias", 0, 3, 1, DT_SPLIT_COLS, 3, 1},
      {"attn.c_proj.weight", 1, 1, 2, DT_SPLIT_ROWS, 1, 1}, {"attn.c_proj.bias", 0, 1, 1, 0, 1, 0},
      {"ln_2.weight", 0, 1, 1, 0, 1, 0},                    {"ln_2.bias", 0, 1, 1, 0, 1, 0},
      {"mlp.c_fc.weight", 1, 4, 2, DT_SPLIT_COLS, 1, 4},    {"mlp.c_fc.bias", 0, 4, 1, DT_SPLIT_COLS, 1, 4},
      {"mlp.c_proj.weight", 4, 1, 2, DT_SPLIT_ROWS, 1, 4},  {"mlp.c_proj.bias", 0, 1, 1, 0, 1, 0},
  };
  for (int l = 0; l < d.L; l++) {
    lay->layer_begin[1 + l] = off;
    for (int i = 0; i < DT_BLOCK_TENSORS; i++) {
      snprintf(nm, sizeof nm, "h.%d.%s", l, blk[i].name);
      int two_d = blk[i].ndim == 2;
      shard_t sh = {blk[i].split, blk[i].nblk, r * blk[i].mult * Ct, C};
      add_tensor(lay, &off, nm, two_d ? blk[i].rows_mult * C : 1, blk[i].cols_mult * C, blk[i].ndim, two_d, l, sh);
      if (l < l0 || l >= l1) drop_last(lay, &off);
    }
  }
  lay->layer_begin[1 + d.L] = off;
  add_tensor(lay, &off, "ln_f.weight", 1, C, 1, 0, d.L, rep);
  if (!last) drop_last(lay, &off);
  add_tensor(lay, &off, "ln_f.bias", 1, C, 1, 0, d.L, rep);
  if (!last) drop_last(lay, &off);
  lay->layer_begin[2 + d.L] = off;
  lay->n_params = off;
  size_t total = 0;
  for (int i = 0; i < lay->n_tensors; i++) total += (size_t)lay->tensors[i].grows * lay->tensors[i].gcols;
  lay->n_params_true = total - (size_t)(d.Vp - d.V) * C;
  lay->l0 = l0;
  lay->l1 = l1;
  return DT_OK;
}

dt_status_t dt_layout_init(dt_layout_t *lay, dt_dims_t d) { return dt_layout_init_mp(lay, d, 1, 0, 1, 0, 0); }

dt_status_t dt_layout_init_tp(dt_layout_t *lay, dt_dims_t d, int tp, int tp_rank) {
  return dt_layout_init_mp(lay, d, tp, tp_rank, 1, 0, 0);
}

void dt_pp_split(int L, int pp, double emb, double blk, double head, int *blocks) {
  if (pp <= 1 || pp > DT_PP_SPLIT_MAX) { /* (DT_PP_SPLIT_MAX >= n_layer's maximum, config.c) */
    blocks[0] = L;
    return;
  }
  /* Blocks are all the same size, so the largest stage of an optimal split is one of emb + k blk,
   * k blk, head + k blk: take the smallest candidate into which L blocks fit, each stage >= 1. */
  double best = INFINITY;
  for (int k = 1; k <= L; k++) {
    double cand[3] = {emb + k * blk, k * blk, head + k * blk};
    for (int c = 0; c < 3; c++) {
      double M = cand[c];
      if (M >= best) continue;
      long sum = 0;
      int ok = 1;
      for (int s = 0; s < pp; s++) {
        double extra = (s == 0 ? emb : 0) + (s == pp - 1 ? head : 0);
        long cap = (long)floor((M - extra) / blk + 1e-9);
        if (cap < 1) ok = 0;
        sum += cap;
      }
      if (ok && sum >= L) best = M;
    }
  }
  /* Many splits reach that; of them take the one with the fewest blocks on the busiest stage
   * (compute balance): fill every stage up to a common height h (within its cap), the smallest h
   * that holds L blocks, and take any surplus from the last stages first (the last also runs the
   * lm_head, the first only the cheap embedding lookup). */
  long cap[DT_PP_SPLIT_MAX];
  for (int s = 0; s < pp; s++) {
    double extra = (s == 0 ? emb : 0) + (s == pp - 1 ? head : 0);
    cap[s] = (long)floor((best - extra) / blk + 1e-9);
  }
  for (long h = 1; h <= L; h++) {
    long sum = 0;
    for (int s = 0; s < pp; s++) sum += cap[s] < h ? cap[s] : h;
    if (sum < L) continue;
    for (int s = 0; s < pp; s++) blocks[s] = (int)(cap[s] < h ? cap[s] : h);
    for (int s = pp - 1; s >= 0 && sum > L; s--)
      if (blocks[s] == h && h > 1) blocks[s]--, sum--;
    break;
  }
}

dt_status_t dt_layout_pp_groups(dt_dims_t d, int tp, double *emb, double *blk, double *lnf, double *wte) {
  dt_layout_t f;
  DT_TRY(build(&f, d, tp, 0, 0, d.L, 1, 1));
  const size_t *g = f.layer_begin;
  *emb = (double)(g[1] - g[0]);
  *blk = (double)(g[2] - g[1]);
  *lnf = (double)(g[d.L + 2] - g[d.L + 1]);
  *wte = (double)(f.tensors[1].offset - f.tensors[0].offset);
  dt_layout_free(&f);
  return DT_OK;
}

dt_pp_balance_t dt_pp_balance_of(const dt_config_t *cfg) {
  return strcmp(cfg->pp_balance, "compute") == 0 ? DT_PP_BALANCE_COMPUTE : DT_PP_BALANCE_PARAMS;
}

dt_status_t dt_pp_weights(dt_dims_t d, int tp, dt_pp_balance_t balance, double *emb, double *blk, double *head) {
  if (balance == DT_PP_BALANCE_COMPUTE) {
    const double C = d.C;
    *emb = 0;
    *blk = 72 * C * C + 12.0 * d.T * C;
    *head = 6 * C * d.Vp;
    return DT_OK;
  }
  double lnf, wte;
  DT_TRY(dt_layout_pp_groups(d, tp, emb, blk, &lnf, &wte));
  *head = lnf + wte; /* ln_f and the lm_head's copy of wte */
  return DT_OK;
}

dt_status_t dt_layout_init_mp(dt_layout_t *lay, dt_dims_t d, int tp, int tp_rank, int pp, int pp_rank,
                              dt_pp_balance_t balance) {
  memset(lay, 0, sizeof *lay);
  if (pp < 1 || pp_rank < 0 || pp_rank >= pp)
    return DT_ERR(DT_ERR_CONFIG, "parallel.pp: %d with pipeline stage %d is invalid", pp, pp_rank);
  if (pp > d.L)
    return DT_ERR(DT_ERR_CONFIG, "parallel.pp: %d stages for model.n_layer = %d blocks (each stage needs at least one)",
                  pp, d.L);
  if (pp == 1) {
    DT_TRY(build(lay, d, tp, tp_rank, 0, d.L, 1, 1));
  } else {
    double emb, blk, head;
    DT_TRY(dt_pp_weights(d, tp, balance, &emb, &blk, &head));
    int *blocks = malloc(sizeof(int) * (size_t)pp);
    if (!blocks) return DT_ERR(DT_ERR_NOMEM, "model: out of memory");
    dt_pp_split(d.L, pp, emb, blk, head, blocks);
    int l0 = 0;
    for (int s = 0; s < pp_rank; s++) l0 += blocks[s];
    int l1 = l0 + blocks[pp_rank];
    free(blocks);
    DT_TRY(build(lay, d, tp, tp_rank, l0, l1, pp_rank == 0, pp_rank == pp - 1));
  }
  lay->pp = pp;
  lay->pp_rank = pp_rank;
  return DT_OK;
}

void dt_layout_free(dt_layout_t *lay) {
  free(lay->tensors);
  free(lay->layer_begin);
  lay->tensors = NULL;
  lay->layer_begin = NULL;
  lay->n_tensors = 0;
}

const dt_tensor_t *dt_layout_block(const dt_layout_t *lay, int l, int which) {
  if (l < 0 || l >= lay->d.L || which < 0 || which >= DT_BLOCK_TENSORS) return NULL;
  return &lay->tensors[2 + l * DT_BLOCK_TENSORS + which];
}

const dt_tensor_t *dt_layout_find(const dt_layout_t *lay, const char *name) {
  for (int i = 0; i < lay->n_tensors; i++)
    if (strcmp(lay->tensors[i].name, name) == 0) return &lay->tensors[i];
  return NULL;
}

/* ---- init ----------------------------------------------------------------------------------- */

#define INIT_CHUNK 65536

/* Each (tensor, chunk) pair gets its own RNG stream, so the result does not depend on the number
 * of threads. A tensor's stream runs over its elements in row-major order of the (out, in) shape
 * for the blocks' weights (stored (in, out)), which keeps every seed's initial weights what they
 * were when dtrain stored those weights (out, in). */
static int init_transposed(const dt_tensor_t *t) { return t->ndim == 2 && t->layer >= 0; } /* the blocks' weights */
void dt_model_init_params(const dt_layout_t *lay, float *params, uint64_t seed) {
  dt_model_init_params_range(lay, params, seed, 0, lay->n_params);
}

void dt_model_init_params_range(const dt_layout_t *lay, float *params, uint64_t seed, size_t lo, size_t hi) {
  if (lay->tp > 1) lo = 0, hi = lay->n_params; /* the tp shard path below writes its whole shard */
  memset(params + lo, 0, (hi - lo) * sizeof *params);
  const double std = 0.02, std_resid = 0.02 / sqrt(2.0 * lay->d.L);
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    if (t->absent) continue; /* on another pipeline stage */
    float *p = params + t->offset;
    size_t n = (size_t)t->rows * t->cols;
    if (t->ndim == 1) {
      /* biases stay 0; layernorm weights are 1 */
      if (strstr(t->name, "ln_") && strstr(t->name, ".weight"))
        for (size_t k = 0; k < n; k++)
          if (t->offset + k >= lo && t->offset + k < hi) p[k] = 1.0f;
      continue;
    }
    if (lay->tp > 1) { /* a shard: the whole tensor's streams, keeping the owned elements */
      size_t gn = (size_t)(i == 0 ? lay->d.V : t->grows) * t->gcols, gc = (size_t)t->gcols, gr = (size_t)t->grows;
      int tr = init_transposed(t);
      int resid = strstr(t->name, "attn.c_proj.weight") || strstr(t->name, "mlp.c_proj.weight");
      double s = resid ? std_resid : std;
      long nchunk = (long)((gn + INIT_CHUNK - 1) / INIT_CHUNK);
      int bl = (t->split == DT_SPLIT_ROWS ? t->rows : t->cols) / t->nblk;
#pragma omp parallel for schedule(static)
      for (long c = 0; c < nchunk; c++) {
        size_t lo = (size_t)c * INIT_CHUNK, hi = lo + INIT_CHUNK < gn ? lo + INIT_CHUNK : gn;
        if (t->split == DT_SPLIT_ROWS && !tr) { /* skip chunks whose rows are all elsewhere */
          int r0 = (int)(lo / gc), r1 = (int)((hi - 1) / gc), any = 0;
          for (int b = 0; b < t->nblk; b++) {
            int b0 = t->g0 + b * t->gstride;
            if (r1 >= b0 && r0 < b0 + bl) any = 1;
          }
          if (!any) continue;
        }
        dt_rng_t r;
        dt_rng_seed(&r, seed ^ (0x632be59bd9b4e019ULL * (uint64_t)(i + 1)));
        dt_rng_seed(&r, dt_rng_next(&r) + 0xd1b54a32d192ed03ULL * (uint64_t)c);
        for (size_t k = lo; k < hi; k++) {
          float v = (float)(s * dt_rng_normal(&r));
          long li = tr ? dt_tensor_local_index(t, (int)(k % gr), (int)(k / gr))
                       : dt_tensor_local_index(t, (int)(k / gc), (int)(k % gc));
          if (li >= 0) params[li] = v;
        }
      }
      continue;
    }
    if (i == 0) n = (size_t)lay->d.V * t->cols; /* wte: padded vocab rows stay 0 */
    int resid = strstr(t->name, "attn.c_proj.weight") || strstr(t->name, "mlp.c_proj.weight");
    double s = resid ? std_resid : std;
    long nchunk = (long)((n + INIT_CHUNK - 1) / INIT_CHUNK);
    const size_t rows = (size_t)t->rows, cols = (size_t)t->cols;
    const int tr = init_transposed(t);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < nchunk; c++) {
      size_t k0 = (size_t)c * INIT_CHUNK, k1 = (size_t)(c + 1) * INIT_CHUNK < n ? (size_t)(c + 1) * INIT_CHUNK : n;
      /* chunk outside [lo, hi)? (a transposed chunk is spread over the whole tensor) */
      if (tr ? t->offset + n <= lo || t->offset >= hi : t->offset + k1 <= lo || t->offset + k0 >= hi) continue;
      dt_rng_t r;
      dt_rng_seed(&r, seed ^ (0x632be59bd9b4e019ULL * (uint64_t)(i + 1)));
      dt_rng_seed(&r, dt_rng_next(&r) + 0xd1b54a32d192ed03ULL * (uint64_t)c);
      for (size_t k = k0; k < k1; k++) { /* the whole chunk's stream, stored where in range */
        float v = (float)(s * dt_rng_normal(&r));
        size_t at = tr ? (k % rows) * cols + k / rows : k; /* transposed: (out, in) = (k / rows, k % rows) */
        if (t->offset + at >= lo && t->offset + at < hi) p[at] = v;
      }
    }
  }
}

double dt_model_flops_per_token(const dt_dims_t *d, int T) {
  double C = d->C, L = d->L;
  return 6.0 * (12.0 * L * C * C + C * d->Vp) + 12.0 * L * T * C;
}
