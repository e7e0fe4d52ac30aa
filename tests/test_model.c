/* GPT-2 model and CPU backend: arena layout, init statistics, RNG, a whole-model gradient check
 * through the backend vtable against central finite differences of the double-precision reference
 * forwards (ref_gpt2.h), the grad-ready hook, gradient accumulation, smaller (B, T), logits-only
 * forward and input validation. The per-layer checks: tests/test_layers.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpt2.h"
#include "kmath.h"
#include "model.h"
#include "ops_cpu.h"
#include "ref_gpt2.h"

/* ---- layout, init, RNG -------------------------------------------------------------------------- */

static const char *const block_names[DT_BLOCK_TENSORS] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

static void check_layout(dt_dims_t d) {
  dt_layout_t lay;
  cr_assert_eq(dt_layout_init(&lay, d), DT_OK, "%s", dt_err_msg());
  const int C = d.C, L = d.L;
  cr_assert_eq(lay.n_tensors, 4 + 12 * L);
  size_t prev_end = 0, total = 0;
  for (int i = 0; i < lay.n_tensors; i++) {
    const dt_tensor_t *t = &lay.tensors[i];
    cr_expect_eq(t->offset % DT_ALIGN, 0, "%s: offset %zu not aligned", t->name, t->offset);
    cr_expect_geq(t->offset, prev_end, "%s overlaps its predecessor", t->name);
    cr_expect_lt(t->offset - prev_end, DT_ALIGN, "%s: gap larger than alignment", t->name);
    prev_end = t->offset + (size_t)t->rows * t->cols;
    total += (size_t)t->rows * t->cols;
    cr_expect_eq(t->decay, t->ndim == 2, "%s decay", t->name);
  }
  cr_expect_geq(lay.n_params, prev_end);
  cr_expect_lt(lay.n_params - prev_end, DT_ALIGN);
  cr_expect_eq(lay.n_params % DT_ALIGN, 0);
  cr_expect_eq(total, (size_t)d.Vp * C + (size_t)d.T * C + (size_t)L * (12 * C * C + 13 * C) + 2 * C);
  cr_expect_eq(lay.n_params_true, (size_t)d.V * C + (size_t)d.T * C + (size_t)L * (12 * C * C + 13 * C) + 2 * C);
  /* names, shapes, flags */
  const dt_tensor_t *t = dt_layout_find(&lay, "wte.weight");
  cr_assert(t && t == &lay.tensors[0] && t->rows == d.Vp && t->cols == C && t->layer == -1 && t->decay);
  t = dt_layout_find(&lay, "wpe.weight");
  cr_assert(t && t->rows == d.T && t->cols == C && t->layer == -1 && t->decay);
  /* Hugging Face's shapes: Conv1D weights (in, out) */
  int rows[DT_BLOCK_TENSORS] = {1, 1, C, 1, C, 1, 1, 1, C, 1, 4 * C, 1};
  int cols[DT_BLOCK_TENSORS] = {C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C};
  for (int l = 0; l < L; l++)
    for (int k = 0; k < DT_BLOCK_TENSORS; k++) {
      char nm[64];
      snprintf(nm, sizeof nm, "h.%d.%s", l, block_names[k]);
      t = dt_layout_find(&lay, nm);
      cr_assert(t, "missing %s", nm);
      cr_expect_eq(t, dt_layout_block(&lay, l, k), "%s: dt_layout_block disagrees", nm);
      cr_expect_eq(t, &lay.tensors[2 + 12 * l + k], "%s out of arena order", nm);
      cr_expect(t->rows == rows[k] && t->cols == cols[k], "%s shape %dx%d", nm, t->rows, t->cols);
      cr_expect_eq(t->layer, l);
      cr_expect_eq(t->ndim, rows[k] == 1 ? 1 : 2, "%s ndim", nm);
    }
  t = dt_layout_find(&lay, "ln_f.bias");
  cr_assert(t && t == &lay.tensors[lay.n_tensors - 1] && t->layer == L && t->ndim == 1 && !t->decay);
  cr_expect_null(dt_layout_find(&lay, "h.0.attn.bias"));
  cr_expect_null(dt_layout_block(&lay, L, 0));
  cr_expect_null(dt_layout_block(&lay, -1, 0));
  cr_expect_null(dt_layout_block(&lay, 0, -1));
  cr_expect_null(dt_layout_block(&lay, 0, DT_BLOCK_TENSORS));
  /* groups tile [0, n_params) and each group holds exactly its tensors */
  cr_expect_eq(lay.layer_begin[0], 0);
  cr_expect_eq(lay.layer_begin[L + 2], lay.n_params);
  for (int g = 0; g < L + 2; g++) cr_expect_lt(lay.layer_begin[g], lay.layer_begin[g + 1]);
  for (int i = 0; i < lay.n_tensors; i++) {
    int g = lay.tensors[i].layer + 1;
    cr_expect(lay.tensors[i].offset >= lay.layer_begin[g] &&
                  lay.tensors[i].offset + (size_t)lay.tensors[i].rows * lay.tensors[i].cols <= lay.layer_begin[g + 1],
              "%s outside its group %d", lay.tensors[i].name, g);
  }
  dt_layout_free(&lay);
}

Test(model, layout) {
  check_layout((dt_dims_t){.L = 2, .NH = 4, .C = 64, .V = 97, .Vp = 128, .T = 16});
  check_layout((dt_dims_t){.L = 3, .NH = 3, .C = 12, .V = 50257, .Vp = 50304, .T = 7}); /* odd sizes */
  dt_layout_t lay;
  dt_err_clear();
  cr_expect_eq(dt_layout_init(&lay, (dt_dims_t){.L = 2, .NH = 3, .C = 64, .V = 97, .Vp = 128, .T = 16}),
               DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "not divisible") != NULL, "%s", dt_err_msg());
  cr_expect_eq(dt_layout_init(&lay, (dt_dims_t){.L = 0, .NH = 1, .C = 64, .V = 97, .Vp = 128, .T = 16}),
               DT_ERR_CONFIG);
}

/* Tensor-parallel shards: local shapes, global shapes and positions for tp = 2 and 4; every
 * element of the global tensor is held by exactly one rank (replicated: by all); the sharded init
 * equals the tp = 1 init element for element; bad divisibility is one error naming parallel.tp. */
static void check_tp_layout(dt_dims_t d, int tp) {
  dt_layout_t full;
  cr_assert_eq(dt_layout_init(&full, d), DT_OK, "%s", dt_err_msg());
  float *pf = malloc(full.n_params * sizeof *pf);
  dt_model_init_params(&full, pf, 99);
  int *owners = calloc(full.n_params, sizeof *owners);
  const int C = d.C;
  for (int r = 0; r < tp; r++) {
    dt_layout_t lay;
    cr_assert_eq(dt_layout_init_tp(&lay, d, tp, r), DT_OK, "%s", dt_err_msg());
    cr_assert_eq(lay.n_tensors, full.n_tensors);
    cr_expect_eq(lay.n_params_true, full.n_params_true);
    cr_expect_lt(lay.n_params, full.n_params);
    const dt_tensor_t *wte = &lay.tensors[0];
    cr_expect(wte->rows == d.Vp / tp && wte->cols == C && wte->grows == d.Vp && wte->split == DT_SPLIT_ROWS &&
              wte->g0 == r * d.Vp / tp, "wte shard rank %d", r);
    for (int l = 0; l < d.L; l++) {
      const dt_tensor_t *q = dt_layout_block(&lay, l, DT_QKVW), *qb = dt_layout_block(&lay, l, DT_QKVB);
      cr_expect(q->rows == C && q->cols == 3 * C / tp && q->gcols == 3 * C && q->nblk == 3 && q->gstride == C &&
                q->g0 == r * C / tp && q->split == DT_SPLIT_COLS, "c_attn.weight shard");
      cr_expect(qb->rows == 1 && qb->cols == 3 * C / tp && qb->gcols == 3 * C && qb->nblk == 3 &&
                qb->split == DT_SPLIT_COLS, "c_attn.bias shard");
      const dt_tensor_t *ap = dt_layout_block(&lay, l, DT_ATTPROJW), *fc = dt_layout_block(&lay, l, DT_FCW);
      const dt_tensor_t *fp = dt_layout_block(&lay, l, DT_FCPROJW), *fb = dt_layout_block(&lay, l, DT_FCB);
      cr_expect(ap->rows == C / tp && ap->cols == C && ap->split == DT_SPLIT_ROWS && ap->g0 == r * C / tp, "attn.c_proj");
      cr_expect(fc->rows == C && fc->cols == 4 * C / tp && fc->split == DT_SPLIT_COLS && fc->g0 == r * 4 * C / tp, "c_fc");
      cr_expect(fb->cols == 4 * C / tp && fb->split == DT_SPLIT_COLS, "c_fc.bias");
      cr_expect(fp->rows == 4 * C / tp && fp->cols == C && fp->grows == 4 * C && fp->split == DT_SPLIT_ROWS, "mlp.c_proj");
      cr_expect(dt_layout_block(&lay, l, DT_ATTPROJB)->split == DT_SPLIT_NONE, "attn.c_proj.bias replicated");
      cr_expect(dt_layout_block(&lay, l, DT_LN1W)->split == DT_SPLIT_NONE, "ln_1 replicated");
      cr_expect(dt_layout_block(&lay, l, DT_FCPROJB)->cols == C, "mlp.c_proj.bias replicated");
    }
    float *p = malloc(lay.n_params * sizeof *p);
    dt_model_init_params(&lay, p, 99);
    for (int i = 0; i < lay.n_tensors; i++) { /* every global element: owned here? same value as tp = 1 */
      const dt_tensor_t *t = &lay.tensors[i], *g = &full.tensors[i];
      cr_assert_eq(t->offset % DT_ALIGN, 0);
      /* an index outside the global shape belongs to no rank */
      cr_assert(dt_tensor_local_index(t, -1, 0) < 0 && dt_tensor_local_index(t, t->grows, 0) < 0 &&
                    dt_tensor_local_index(t, 0, -1) < 0 && dt_tensor_local_index(t, 0, t->gcols) < 0,
                "%s: an index outside its global shape was found", t->name);
      for (int gr = 0; gr < t->grows; gr++)
        for (int gc = 0; gc < t->gcols; gc++) {
          long li = dt_tensor_local_index(t, gr, gc);
          size_t gi = g->offset + (size_t)gr * g->cols + gc;
          if (li < 0) continue;
          cr_assert(li >= (long)t->offset && li < (long)(t->offset + (size_t)t->rows * t->cols));
          if (t->split != DT_SPLIT_NONE) owners[gi]++;
          else if (r == 0) owners[gi]++;
          cr_assert_eq(p[li], pf[gi], "%s (%d, %d) rank %d: %g vs %g", t->name, gr, gc, r, p[li], pf[gi]);
        }
    }
    free(p);
    dt_layout_free(&lay);
  }
  for (int i = 0; i < full.n_tensors; i++) {
    const dt_tensor_t *g = &full.tensors[i];
    for (size_t k = 0; k < (size_t)g->rows * g->cols; k++)
      cr_assert_eq(owners[g->offset + k], 1, "%s element %zu held by %d ranks (tp=%d)", g->name, k,
                   owners[g->offset + k], tp);
  }
  free(owners);
  free(pf);
  dt_layout_free(&full);
}

Test(model, tp_layout) {
  dt_dims_t d = {.L = 2, .NH = 4, .C = 64, .V = 200, .Vp = 256, .T = 16};
  check_tp_layout(d, 2);
  check_tp_layout(d, 4);
  dt_layout_t a, b;
  cr_assert_eq(dt_layout_init(&a, d), DT_OK);
  cr_assert_eq(dt_layout_init_tp(&b, d, 1, 0), DT_OK); /* tp = 1 is the plain layout */
  cr_expect_eq(a.n_params, b.n_params);
  for (int i = 0; i < a.n_tensors; i++)
    cr_expect(a.tensors[i].offset == b.tensors[i].offset && a.tensors[i].rows == b.tensors[i].rows &&
              b.tensors[i].grows == b.tensors[i].rows && b.tensors[i].split == DT_SPLIT_NONE);
  dt_layout_free(&a);
  dt_layout_free(&b);
  dt_err_clear();
  cr_expect_eq(dt_layout_init_tp(&a, (dt_dims_t){.L = 1, .NH = 6, .C = 96, .V = 97, .Vp = 128, .T = 8}, 4, 0),
               DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "parallel.tp: 4 does not divide model.n_head 6"), "%s", dt_err_msg());
  dt_err_clear();
  cr_expect_eq(dt_layout_init_tp(&a, (dt_dims_t){.L = 1, .NH = 3, .C = 96, .V = 97, .Vp = 128, .T = 8}, 3, 0),
               DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "parallel.tp: 3 does not divide the padded vocab 128"), "%s", dt_err_msg());
  /* every dimension must be at least 1 (no layers: refused as a pipeline with nothing to hold) */
  const dt_dims_t ok = {.L = 1, .NH = 2, .C = 8, .V = 10, .Vp = 16, .T = 4};
  for (int k = 0; k < 5; k++) {
    dt_dims_t d = ok;
    int *f[5] = {&d.L, &d.NH, &d.C, &d.V, &d.T};
    *f[k] = 0;
    dt_err_clear();
    cr_expect_eq(dt_layout_init_tp(&a, d, 1, 0), DT_ERR_CONFIG, "dimension %d = 0", k);
    const char *want = k == 0 ? "model.n_layer = 0" : "dimensions must be positive";
    cr_expect(strstr(dt_err_msg(), want), "dimension %d = 0: %s", k, dt_err_msg());
  }
  cr_assert_eq(dt_layout_init_tp(&a, ok, 1, 0), DT_OK);
  dt_layout_free(&a);
}

Test(model, dims_and_flops) {
  dt_config_t c;
  dt_config_defaults(&c);
  c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.vocab_size = 50257, c.seq_len = 1024;
  dt_dims_t d = dt_dims_from_config(&c);
  cr_expect(d.L == 12 && d.NH == 12 && d.C == 768 && d.V == 50257 && d.Vp == 50304 && d.T == 1024);
  double want = 6.0 * (12.0 * 12 * 768 * 768 + 768.0 * 50304) + 12.0 * 12 * 1024 * 768;
  cr_expect_float_eq(dt_model_flops_per_token(&d, 1024), want, want * 1e-12);
  dt_layout_t lay;
  cr_assert_eq(dt_layout_init(&lay, d), DT_OK);
  cr_expect_eq(lay.n_params_true, 124439808); /* GPT-2 124M */
  dt_layout_free(&lay);
}

Test(model, rng) {
  dt_rng_t a, b;
  dt_rng_seed(&a, 7);
  dt_rng_seed(&b, 7);
  for (int i = 0; i < 100; i++) cr_assert_eq(dt_rng_next(&a), dt_rng_next(&b));
  dt_rng_seed(&b, 8);
  cr_expect_neq(dt_rng_next(&a), dt_rng_next(&b));
  double s = 0, s2 = 0, umin = 1, umax = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    double u = dt_rng_uniform(&a);
    umin = fmin(umin, u), umax = fmax(umax, u);
    double z = dt_rng_normal(&a);
    s += z, s2 += z * z;
  }
  cr_expect(umin >= 0.0 && umax < 1.0 && umin < 1e-3 && umax > 1 - 1e-3);
  cr_expect(fabs(s / n) < 0.01, "normal mean %g", s / n);
  cr_expect(fabs(s2 / n - 1) < 0.02, "normal variance %g", s2 / n);
  /* splitmix64's published test vector (seed 1234567): the same stream as every other implementation */
  const uint64_t want[5] = {6457827717110365317ULL, 3203168211198807973ULL, 9817491932198370423ULL,
                            4593380528125082431ULL, 16408922859458223821ULL};
  dt_rng_seed(&a, 1234567);
  for (int i = 0; i < 5; i++) cr_assert_eq(dt_rng_next(&a), want[i], "output %d", i);
}

static void tensor_stats(const float *p, size_t n, double *mean, double *std) {
  double s = 0, s2 = 0;
  for (size_t i = 0; i < n; i++) s += p[i], s2 += (double)p[i] * p[i];
  *mean = s / n;
  *std = sqrt(s2 / n - *mean * *mean);
}

Test(model, init_statistics) {
  dt_dims_t d = {.L = 4, .NH = 4, .C = 128, .V = 1000, .Vp = 1024, .T = 64};
  dt_layout_t lay;
  cr_assert_eq(dt_layout_init(&lay, d), DT_OK);
  float *p = malloc(lay.n_params * sizeof *p), *q = malloc(lay.n_params * sizeof *q);
  for (size_t i = 0; i < lay.n_params; i++) p[i] = 123.0f; /* init must zero the arena (padding) */
  dt_model_init_params(&lay, p, 42);
  for (int i = 0; i < lay.n_tensors; i++) {
    const dt_tensor_t *t = &lay.tensors[i];
    size_t n = (size_t)t->rows * t->cols;
    if (i == 0) n = (size_t)d.V * d.C;
    double mean, std;
    tensor_stats(p + t->offset, n, &mean, &std);
    if (t->ndim == 2) {
      int resid = strstr(t->name, "c_proj.weight") != NULL;
      double want = resid ? 0.02 / sqrt(2.0 * d.L) : 0.02;
      /* n >= 16384 samples: the std estimate is within ~0.6% (1 sigma); allow 3% */
      cr_expect(fabs(std - want) < 0.03 * want, "%s: std %g want %g", t->name, std, want);
      cr_expect(fabs(mean) < 0.03 * want, "%s: mean %g", t->name, mean);
    } else {
      double want = strstr(t->name, "ln_") && strstr(t->name, "weight") ? 1.0 : 0.0;
      cr_expect(mean == want && std == 0.0, "%s: mean %g std %g want constant %g", t->name, mean, std, want);
    }
  }
  for (size_t k = (size_t)d.V * d.C; k < (size_t)d.Vp * d.C; k++)
    cr_assert_eq(p[k], 0.0f, "padded vocab row %zu not zero", k / d.C);
  for (int i = 0; i + 1 < lay.n_tensors; i++) /* alignment padding stays zero */
    for (size_t k = lay.tensors[i].offset + (size_t)lay.tensors[i].rows * lay.tensors[i].cols;
         k < lay.tensors[i + 1].offset; k++)
      cr_assert_eq(p[k], 0.0f);
  /* deterministic in the seed and independent of the thread count */
  int nt = omp_get_max_threads();
  omp_set_num_threads(1);
  dt_model_init_params(&lay, q, 42);
  omp_set_num_threads(nt);
  cr_expect_eq(memcmp(p, q, lay.n_params * sizeof *p), 0, "same seed, different result");
  dt_model_init_params(&lay, q, 43);
  cr_expect_neq(memcmp(p, q, lay.n_params * sizeof *p), 0, "different seeds, same result");
  free(p);
  free(q);
  dt_layout_free(&lay);
}

/* Every tp shard initialises to exactly its part of the tp = 1 model, and a ZeRO-3 range to exactly
 * that range of it (untouched outside): C = 192 makes the 2-D tensors span several of the init's
 * 65536-element chunks, so chunk skipping is exercised (the small test models fit one chunk). */
Test(model, shard_and_range_init_equal_the_full_init) {
  dt_dims_t d = {.L = 2, .NH = 4, .C = 192, .V = 250, .Vp = 256, .T = 16};
  dt_layout_t full;
  cr_assert_eq(dt_layout_init(&full, d), DT_OK);
  float *f = malloc(full.n_params * sizeof *f), *g = malloc(full.n_params * sizeof *g);
  dt_model_init_params(&full, f, 5);
  for (int tp = 2; tp <= 4; tp *= 2)
    for (int r = 0; r < tp; r++) {
      dt_layout_t sh;
      cr_assert_eq(dt_layout_init_tp(&sh, d, tp, r), DT_OK);
      float *p = malloc(sh.n_params * sizeof *p);
      dt_model_init_params(&sh, p, 5);
      for (int i = 0; i < sh.n_tensors; i++) {
        const dt_tensor_t *t = &sh.tensors[i], *u = &full.tensors[i];
        long owned = 0, bad = 0;
        for (int gr = 0; gr < t->grows; gr++)
          for (int gc = 0; gc < t->gcols; gc++) {
            long li = dt_tensor_local_index(t, gr, gc);
            if (li < 0) continue;
            owned++;
            bad += p[li] != f[u->offset + (size_t)gr * u->cols + gc];
          }
        cr_assert_eq(owned, (long)t->rows * t->cols, "tp %d rank %d %s: owns %ld elements", tp, r, t->name, owned);
        cr_assert_eq(bad, 0, "tp %d rank %d %s: %ld elements differ from the tp = 1 init", tp, r, t->name, bad);
      }
      free(p);
      dt_layout_free(&sh);
    }
  const size_t cuts[][2] = {{0, 1000}, {5000, 190000}, {100003, full.n_params}, {0, full.n_params}};
  for (int c = 0; c < 4; c++) {
    size_t lo = cuts[c][0], hi = cuts[c][1];
    for (size_t k = 0; k < full.n_params; k++) g[k] = -7.0f;
    dt_model_init_params_range(&full, g, 5, lo, hi);
    size_t bad = 0;
    for (size_t k = 0; k < full.n_params; k++) bad += g[k] != (k >= lo && k < hi ? f[k] : -7.0f);
    cr_assert_eq(bad, 0, "range [%zu, %zu): %zu elements wrong", lo, hi, bad);
  }
  free(f);
  free(g);
  dt_layout_free(&full);
}

/* ---- whole model through the backend vtable ----------------------------------------------------- */

enum { MB = 2, MT = 5 };
static const dt_dims_t tiny = {.L = 2, .NH = 2, .C = 8, .V = 11, .Vp = 128, .T = 6};

typedef struct {
  const dt_layout_t *lay;
  double *p; /* double copy of the parameter arena */
  const int *inp, *tgt;
  int B, T;
  double *x, *h, *qkv, *a, *f, *logits, *tmp;
} mctx_t;

static double obj_model(void *ctx) {
  mctx_t *m = ctx;
  const dt_layout_t *lay = m->lay;
  const int C = lay->d.C, N = m->B * m->T;
  const double *wte = m->p + lay->tensors[0].offset, *wpe = m->p + lay->tensors[1].offset;
#define W(l, k) (m->p + dt_layout_block(lay, l, k)->offset)
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) m->x[i * C + c] = wte[m->inp[i] * C + c] + wpe[(i % m->T) * C + c];
  for (int l = 0; l < lay->d.L; l++) {
    ref_layernorm(m->h, m->x, W(l, DT_LN1W), W(l, DT_LN1B), N, C);
    ref_conv1d(m->qkv, m->h, W(l, DT_QKVW), W(l, DT_QKVB), N, C, 3 * C);
    ref_attention(m->a, m->qkv, m->B, m->T, C, lay->d.NH);
    ref_conv1d(m->tmp, m->a, W(l, DT_ATTPROJW), W(l, DT_ATTPROJB), N, C, C);
    for (int i = 0; i < N * C; i++) m->x[i] += m->tmp[i];
    ref_layernorm(m->h, m->x, W(l, DT_LN2W), W(l, DT_LN2B), N, C);
    ref_conv1d(m->f, m->h, W(l, DT_FCW), W(l, DT_FCB), N, C, 4 * C);
    for (int i = 0; i < N * 4 * C; i++) m->f[i] = ref_gelu(m->f[i]);
    ref_conv1d(m->tmp, m->f, W(l, DT_FCPROJW), W(l, DT_FCPROJB), N, 4 * C, C);
    for (int i = 0; i < N * C; i++) m->x[i] += m->tmp[i];
  }
#undef W
  const dt_tensor_t *lnf = &lay->tensors[lay->n_tensors - 2];
  ref_layernorm(m->h, m->x, m->p + lnf->offset, m->p + lnf->offset + DT_ALIGN * ((C + DT_ALIGN - 1) / DT_ALIGN), N,
                C);
  ref_matmul(m->logits, m->h, wte, NULL, N, C, lay->d.Vp);
  return ref_crossentropy(m->logits, m->tgt, N, lay->d.V, lay->d.Vp);
}

static void model_ctx(mctx_t *m, const dt_layout_t *lay, const float *params, const int *inp, const int *tgt, int B,
                      int T) {
  size_t N = (size_t)B * T, C = lay->d.C;
  m->lay = lay, m->inp = inp, m->tgt = tgt, m->B = B, m->T = T;
  m->p = to_double(params, lay->n_params);
  m->x = malloc(N * C * sizeof(double)), m->h = malloc(N * C * sizeof(double));
  m->qkv = malloc(N * 3 * C * sizeof(double)), m->a = malloc(N * C * sizeof(double));
  m->f = malloc(N * 4 * C * sizeof(double)), m->tmp = malloc(N * C * sizeof(double));
  m->logits = malloc(N * lay->d.Vp * sizeof(double));
}

static void model_ctx_free(mctx_t *m) {
  free(m->p), free(m->x), free(m->h), free(m->qkv), free(m->a), free(m->f), free(m->tmp), free(m->logits);
}

/* A tiny model with random biases / layernorm parameters and a fixed batch. */
static void tiny_setup(dt_layout_t *lay, dt_backend_t *be, dt_gpt2_t *g, int B, int T, int *inp, int *tgt, int nseq) {
  cr_assert_eq(dt_layout_init(lay, tiny), DT_OK);
  memset(be, 0, sizeof *be); /* fields a caller may set before init (opt_lo/opt_hi) start unset */
  cr_assert_eq(dt_backend_find("cpu")->init(be, lay, B, T, 2), DT_OK, "%s", dt_err_msg());
  dt_model_init_params(lay, be->params, 5);
  dt_rng_t r;
  dt_rng_seed(&r, 77);
  for (int i = 0; i < lay->n_tensors; i++) { /* make the tiny model's weights O(1) so FD sees every path */
    const dt_tensor_t *t = &lay->tensors[i];
    size_t n = (size_t)(i == 0 ? tiny.V : t->rows) * t->cols;
    for (size_t k = 0; k < n; k++) be->params[t->offset + k] += (float)((t->ndim == 1 ? 0.3 : 0.2) * dt_rng_normal(&r));
  }
  for (int i = 0; i < nseq * T; i++) inp[i] = (int)(dt_rng_next(&r) % tiny.V), tgt[i] = (int)(dt_rng_next(&r) % tiny.V);
  cr_assert_eq(dt_gpt2_init(g, be, 1, 0), DT_OK, "%s", dt_err_msg());
}

Test(model, whole_model_gradient) {
  dt_layout_t lay;
  dt_backend_t be = {0};
  dt_gpt2_t g;
  int inp[MB * MT], tgt[MB * MT];
  tiny_setup(&lay, &be, &g, MB, MT, inp, tgt, MB);
  float loss = -1;
  cr_assert_eq(dt_gpt2_forward(&g, inp, tgt, MB, MT, &loss), DT_OK, "%s", dt_err_msg());
  for (size_t i = 0; i < lay.n_params; i++) be.grads[i] = 0.0f;
  cr_assert_eq(dt_gpt2_backward(&g, 1, NULL, NULL), DT_OK);
  mctx_t m;
  model_ctx(&m, &lay, be.params, inp, tgt, MB, MT);
  double want = obj_model(&m);
  cr_expect(fabs(loss - want) < 1e-6 * want, "loss %.8g, double reference %.8g", loss, want);
  float *logits = malloc(sizeof(float) * MB * MT * tiny.Vp);
  cr_assert_eq(dt_gpt2_logits_to_host(&g, logits), DT_OK);
  expect_close("model logits", logits, m.logits, (size_t)MB * MT * tiny.Vp, 1e-5);
  for (int i = 0; i < lay.n_tensors; i++) {
    const dt_tensor_t *t = &lay.tensors[i];
    size_t n = (size_t)(i == 0 ? tiny.V : t->rows) * t->cols;
    fd_check(t->name, m.p + t->offset, n, be.grads + t->offset, obj_model, &m);
  }
  for (size_t k = (size_t)tiny.V * tiny.C; k < lay.tensors[1].offset; k++)
    cr_assert_eq(be.grads[k], 0.0f, "padded vocab row gradient at %zu", k);
  model_ctx_free(&m);
  free(logits);
  dt_gpt2_free(&g);
  be.ops->free(&be);
  dt_layout_free(&lay);
}

typedef struct {
  size_t lo[16], hi[16];
  int n;
  float *snap; /* grads as they were when their range was reported */
  const float *grads;
} ready_log_t;

static void on_ready(void *ctx, size_t lo, size_t hi) {
  ready_log_t *g = ctx;
  if (g->n < 16) g->lo[g->n] = lo, g->hi[g->n] = hi;
  g->n++;
  memcpy(g->snap + lo, g->grads + lo, (hi - lo) * sizeof(float));
}

Test(model, grad_ready_hook) {
  dt_layout_t lay;
  dt_backend_t be = {0};
  dt_gpt2_t gm;
  int inp[MB * MT], tgt[MB * MT];
  tiny_setup(&lay, &be, &gm, MB, MT, inp, tgt, MB);
  ready_log_t g = {.snap = calloc(lay.n_params, sizeof(float)), .grads = be.grads};
  cr_assert_eq(be.ops->zero_grad(&be), DT_OK);
  cr_assert_eq(dt_gpt2_forward(&gm, inp, tgt, MB, MT, NULL), DT_OK);
  cr_assert_eq(dt_gpt2_backward(&gm, 1, on_ready, &g), DT_OK);
  const int L = tiny.L;
  cr_assert_eq(g.n, L + 2);
  /* ln_f, block L-1, ..., block 0, embeddings; decreasing and tiling [0, n_params) */
  cr_expect_eq(g.lo[0], lay.layer_begin[L + 1]);
  cr_expect_eq(g.hi[0], lay.n_params);
  for (int k = 1; k <= L; k++) {
    int l = L - k;
    cr_expect(g.lo[k] == lay.layer_begin[1 + l] && g.hi[k] == lay.layer_begin[2 + l], "call %d is not block %d", k, l);
  }
  cr_expect(g.lo[L + 1] == 0 && g.hi[L + 1] == lay.layer_begin[1]);
  for (int k = 1; k < g.n; k++) cr_expect_eq(g.hi[k], g.lo[k - 1], "ranges do not tile at call %d", k);
  /* every range was final when reported (the tied wte only at the very end) */
  cr_expect_eq(memcmp(g.snap, be.grads, lay.n_params * sizeof(float)), 0, "a range changed after its ready call");
  free(g.snap);
  dt_gpt2_free(&gm);
  be.ops->free(&be);
  dt_layout_free(&lay);
}

static float *grads_of(dt_backend_t *be) {
  float *g = malloc(be->lay->n_params * sizeof *g);
  cr_assert_eq(be->ops->copy_to_host(be, DT_BUF_GRADS, 0, be->lay->n_params, g), DT_OK);
  return g;
}

Test(model, grad_accumulation_and_smaller_batch) {
  /* one batch of 4 sequences (accum=1) == two micro-batches of 2 (accum=2), on a backend sized for 4 */
  dt_layout_t lay;
  dt_backend_t be = {0};
  dt_gpt2_t g;
  int inp[4 * MT], tgt[4 * MT];
  tiny_setup(&lay, &be, &g, 4, MT, inp, tgt, 4);
  float l4, la, lb;
  cr_assert_eq(be.ops->zero_grad(&be), DT_OK);
  cr_assert_eq(dt_gpt2_forward(&g, inp, tgt, 4, MT, &l4), DT_OK);
  cr_assert_eq(dt_gpt2_backward(&g, 1, NULL, NULL), DT_OK);
  float *g4 = grads_of(&be);
  cr_assert_eq(be.ops->zero_grad(&be), DT_OK);
  cr_assert_eq(dt_gpt2_forward(&g, inp, tgt, 2, MT, &la), DT_OK);
  cr_assert_eq(dt_gpt2_backward(&g, 2, NULL, NULL), DT_OK);
  cr_assert_eq(dt_gpt2_forward(&g, inp + 2 * MT, tgt + 2 * MT, 2, MT, &lb), DT_OK);
  cr_assert_eq(dt_gpt2_backward(&g, 2, NULL, NULL), DT_OK);
  float *g2 = grads_of(&be);
  cr_expect(fabsf(l4 - 0.5f * (la + lb)) < 1e-6f * l4, "loss %g vs mean of halves %g", l4, 0.5f * (la + lb));
  double maxd = 0, maxg = 0;
  for (size_t i = 0; i < lay.n_params; i++) maxd = fmax(maxd, fabs(g4[i] - g2[i])), maxg = fmax(maxg, fabs(g4[i]));
  cr_expect(maxg > 0 && maxd <= 1e-5 * maxg, "accumulated grads differ: %.3e of %.3e", maxd, maxg);
  /* backward again on the last micro-batch without zero_grad: adds that micro-batch's grads once
   * more, i.e. g3 - g2 equals a fresh backward of the second half alone */
  cr_assert_eq(dt_gpt2_backward(&g, 2, NULL, NULL), DT_OK);
  float *g3 = grads_of(&be);
  cr_assert_eq(be.ops->zero_grad(&be), DT_OK);
  cr_assert_eq(dt_gpt2_backward(&g, 2, NULL, NULL), DT_OK);
  float *gb = grads_of(&be);
  double d3 = 0, mb = 0;
  for (size_t i = 0; i < lay.n_params; i++) d3 = fmax(d3, fabs(g3[i] - g2[i] - gb[i])), mb = fmax(mb, fabs(gb[i]));
  cr_expect(mb > 0 && d3 <= 1e-5 * mb, "second backward did not accumulate: %.3e of %.3e", d3, mb);
  free(g4), free(g2), free(g3), free(gb);
  dt_gpt2_free(&g);
  be.ops->free(&be);
  dt_layout_free(&lay);
}

Test(model, smaller_T_and_logits_only) {
  dt_layout_t lay;
  dt_backend_t be = {0}, be3 = {0};
  dt_gpt2_t g, g3;
  int inp[MB * MT], tgt[MB * MT];
  tiny_setup(&lay, &be, &g, MB, MT, inp, tgt, MB);
  memset(&be3, 0, sizeof be3);
  cr_assert_eq(dt_backend_cpu.init(&be3, &lay, 1, 3, 0), DT_OK);
  cr_assert_eq(dt_gpt2_init(&g3, &be3, 1, 0), DT_OK);
  memcpy(be3.params, be.params, lay.n_params * sizeof(float));
  /* T=3, B=1 on the big backend equals a backend built for (1, 3); inputs use the first 3 tokens */
  float lbig = 0, lsmall = 0, sentinel = 12345.0f;
  cr_assert_eq(dt_gpt2_forward(&g, inp, tgt, 1, 3, &lbig), DT_OK);
  cr_assert_eq(dt_gpt2_forward(&g3, inp, tgt, 1, 3, &lsmall), DT_OK);
  cr_expect(fabsf(lbig - lsmall) <= 1e-6f * lsmall);
  float a[3 * 128], b[3 * 128];
  cr_assert_eq(dt_gpt2_logits_to_host(&g, a), DT_OK);
  /* logits-only forward: loss untouched, same logits; backward then refuses */
  cr_assert_eq(dt_gpt2_forward(&g3, inp, NULL, 1, 3, &sentinel), DT_OK);
  cr_expect_eq(sentinel, 12345.0f);
  cr_assert_eq(dt_gpt2_logits_to_host(&g3, b), DT_OK);
  for (int i = 0; i < 3 * 128; i++) cr_assert_float_eq(a[i], b[i], 1e-5f, "logit %d", i);
  cr_expect_eq(dt_gpt2_backward(&g3, 1, NULL, NULL), DT_ERR_ARG);
  /* the reference model on the same 3 tokens agrees */
  mctx_t m;
  model_ctx(&m, &lay, be.params, inp, tgt, 1, 3);
  double want = obj_model(&m);
  cr_expect(fabs(lbig - want) < 1e-6 * want);
  model_ctx_free(&m);
  dt_gpt2_free(&g3);
  be3.ops->free(&be3);
  dt_gpt2_free(&g);
  be.ops->free(&be);
  dt_layout_free(&lay);
}

Test(model, bad_input_and_registry) {
  dt_layout_t lay;
  dt_backend_t be = {0};
  dt_gpt2_t g;
  int inp[MB * MT], tgt[MB * MT];
  tiny_setup(&lay, &be, &g, MB, MT, inp, tgt, MB);
  dt_err_clear();
  inp[3] = tiny.V;
  cr_expect_eq(dt_gpt2_forward(&g, inp, tgt, MB, MT, NULL), DT_ERR_DATA);
  cr_expect(strstr(dt_err_msg(), "input token 11 at position 3") != NULL, "%s", dt_err_msg());
  inp[3] = 0;
  cr_expect_eq(dt_gpt2_forward(&g, inp, tgt, MB + 1, MT, NULL), DT_ERR_ARG);
  cr_expect_eq(dt_gpt2_forward(&g, inp, tgt, MB, MT + 1, NULL), DT_ERR_ARG);
  float x;
  cr_expect_eq(be.ops->copy_to_host(&be, DT_BUF_M, lay.n_params, 1, &x), DT_ERR_ARG);
  cr_expect_eq(be.ops->copy_to_host(&be, DT_BUF_V, lay.n_params - 1, 1, &x), DT_OK);
  cr_expect_eq(dt_backend_find("cpu"), &dt_backend_cpu);
  cr_expect_null(dt_backend_find("tpu"));
  int n = 0;
  while (dt_backends[n]) n++;
  cr_expect_geq(n, 1);
  dt_gpt2_free(&g);
  be.ops->free(&be);
  dt_layout_free(&lay);
}

Test(model, logits_survive_the_inplace_backward) {
  /* backward turns the logits buffer into dlogits in place; logits_to_host recomputes them,
   * bitwise equal, until a parameter update, after which it (and a repeated backward) refuse */
  dt_layout_t lay;
  dt_backend_t be = {0};
  dt_gpt2_t g;
  int inp[MB * MT], tgt[MB * MT];
  tiny_setup(&lay, &be, &g, MB, MT, inp, tgt, MB);
  size_t n = (size_t)MB * MT * tiny.Vp;
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  cr_assert_eq(be.ops->zero_grad(&be), DT_OK);
  cr_assert_eq(dt_gpt2_forward(&g, inp, tgt, MB, MT, NULL), DT_OK);
  cr_assert_eq(dt_gpt2_logits_to_host(&g, a), DT_OK);
  cr_assert_eq(dt_gpt2_backward(&g, 1, NULL, NULL), DT_OK);
  cr_assert_eq(dt_gpt2_logits_to_host(&g, b), DT_OK);
  cr_expect_eq(memcmp(a, b, n * sizeof(float)), 0, "logits after backward differ from the forward's");
  dt_adamw_args_t aw = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 1.0f, .t = 1};
  cr_assert_eq(be.ops->adamw(&be, &aw), DT_OK);
  cr_expect_eq(dt_gpt2_logits_to_host(&g, b), DT_ERR_ARG);
  cr_expect_eq(dt_gpt2_backward(&g, 1, NULL, NULL), DT_ERR_ARG);
  dt_err_clear();
  free(a), free(b);
  dt_gpt2_free(&g);
  be.ops->free(&be);
  dt_layout_free(&lay);
}
