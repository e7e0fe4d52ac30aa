/* Mixed precision (src/core/precision.h): the loss scaler's update rule against a hand-derived
 * GradScaler sequence, the array rounding, and the CPU backend's bf16/fp16 modes (the working
 * copy is the rounded master, activations are stored rounded, the master is untouched, loss
 * scaling scales the gradients exactly, an fp16 overflow shows up as a non-finite gradient). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#include "gpt2.h"
#include "kmath.h"
#include "model.h"
#include "precision.h"

/* torch.cuda.amp.GradScaler(init_scale=65536, growth_factor=2, backoff_factor=0.5,
 * growth_interval=3), found_inf per step as below. By hand, from _amp_update_scale_:
 *   step:      1   2   3     4     5    6   7   8     9    10    11  12
 *   found_inf: 0   0   0     0     1    0   0   0     1    1     0   0
 *   scale:     64k 64k 128k  128k  64k  64k 64k 128k  64k  32k   32k 32k   (k = 1024, after the step)
 *   tracker:   1   2   0     1     0    1   2   0     0    0     1   2
 * (step 3: tracker + 1 == 3 -> grow and reset; a found_inf halves and resets.) */
Test(precision, scaler_follows_gradscaler_by_hand) {
  const int found[12] = {0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0};
  const float k = 1024.0f;
  const float want_scale[12] = {64 * k, 64 * k, 128 * k, 128 * k, 64 * k, 64 * k, 64 * k, 128 * k, 64 * k, 32 * k, 32 * k, 32 * k};
  const int want_growth[12] = {1, 2, 0, 1, 0, 1, 2, 0, 0, 0, 1, 2};
  const int want_skipped[12] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3, 3};
  dt_scaler_t s;
  dt_scaler_init(&s, 1, 65536.0, 3);
  cr_assert_eq(s.scale, 65536.0f);
  for (int i = 0; i < 12; i++) {
    dt_scaler_update(&s, found[i]);
    cr_expect_eq(s.scale, want_scale[i], "step %d: scale %g, want %g", i + 1, s.scale, want_scale[i]);
    cr_expect_eq(s.growth, want_growth[i], "step %d: growth tracker %lld, want %d", i + 1, (long long)s.growth,
                 want_growth[i]);
    cr_expect_eq(s.skipped, want_skipped[i], "step %d: skipped %lld", i + 1, (long long)s.skipped);
  }
}

Test(precision, scaler_never_grows_to_inf_and_disabled_is_inert) {
  dt_scaler_t s;
  dt_scaler_init(&s, 1, 0x1p127, 1);
  dt_scaler_update(&s, 0);
  cr_expect_eq(s.scale, 0x1p127f, "2^127 * 2 is inf in float: the scale must stay");
  cr_expect_eq(s.growth, 0);
  dt_scaler_init(&s, 1, 1024.0, 0); /* an interval below 1 counts as 1: growth after every clean step */
  dt_scaler_update(&s, 0);
  dt_scaler_update(&s, 0);
  cr_expect_eq(s.scale, 4096.0f, "interval 0: scale %g after 2 clean steps, want 4096", s.scale);
  dt_scaler_init(&s, 0, 65536.0, 3);
  cr_expect_eq(s.scale, 1.0f);
  for (int i = 0; i < 5; i++) dt_scaler_update(&s, i & 1);
  cr_expect(s.scale == 1.0f && s.growth == 0 && s.skipped == 0, "a disabled scaler changed");
}

/* init sets every field, whatever the memory held before (a scaler inside a struct that was
 * not zeroed); interval 1 stays 1: growth after every clean step. */
Test(precision, scaler_init_sets_every_field) {
  dt_scaler_t s;
  memset(&s, 0xff, sizeof s);
  dt_scaler_init(&s, 1, 8.0, 1);
  cr_expect(s.enabled == 1 && s.scale == 8.0f && s.growth == 0 && s.interval == 1 && s.skipped == 0,
            "enabled %d scale %g growth %lld interval %d skipped %lld", s.enabled, s.scale, (long long)s.growth,
            s.interval, (long long)s.skipped);
  dt_scaler_update(&s, 0);
  cr_expect_eq(s.scale, 16.0f, "interval 1: the first clean step doubles the scale");
  memset(&s, 0xff, sizeof s);
  dt_scaler_init(&s, 0, 8.0, 3);
  cr_expect(s.enabled == 0 && s.scale == 1.0f && s.growth == 0 && s.skipped == 0, "disabled");
}

/* dt_scaler_agree against a fake world of two ranks: this one and `peer`, whose scaler state and
 * gradient sum of squares the test sets. The fake reduces elementwise (MAX or MIN) like MPI. */
static dt_scaler_t peer;
static double peer_sumsq;

static void words(const dt_scaler_t *s, double sumsq, double *v) {
  const double w[7] = {isfinite(sumsq) ? 0.0 : 1.0, s->scale, -(double)s->scale, (double)s->growth,
                       -(double)s->growth, (double)s->skipped, -(double)s->skipped};
  memcpy(v, w, sizeof w);
}

static dt_status_t f_allreduce(dt_comm_t *c, const void *send, void *recv, size_t count, dt_dtype_t t, dt_redop_t op,
                               void *stream, dt_comm_req_t **req) {
  (void)c;
  cr_assert(t == DT_F64 && stream == NULL && req == NULL, "a blocking F64 all-reduce");
  cr_assert_eq(count, 7, "the flag and three state words with both signs: %zu values", count);
  cr_assert(op == DT_MAX || op == DT_MIN);
  double other[7];
  words(&peer, peer_sumsq, other);
  const double *a = send;
  double *r = recv;
  for (size_t i = 0; i < count; i++) r[i] = (op == DT_MAX) == (a[i] > other[i]) ? a[i] : other[i];
  return DT_OK;
}

static const dt_comm_ops_t fake_ops = {.name = "fake", .allreduce = f_allreduce};

/* found_inf (preset to the wrong answer) after an agreement with the peer; -1 for an error. */
static int agree(const dt_scaler_t *s, double sumsq) {
  dt_comm_t world = {.ops = &fake_ops, .rank = 0, .size = 2};
  int found = 7;
  dt_status_t st = dt_scaler_agree(s, &world, 0, sumsq, &found);
  if (st != DT_OK) return st == DT_ERR_INTERNAL ? -1 : -2;
  return found;
}

Test(precision, scaler_agreement_over_ranks) {
  dt_scaler_t s;
  dt_scaler_init(&s, 1, 4096.0, 5);
  s.growth = 2, s.skipped = 3; /* nonzero words: a sign mixed up shows */
  peer = s, peer_sumsq = 1.5;
  cr_expect_eq(agree(&s, 2.0), 0, "both finite: no overflow");
  cr_expect_eq(agree(&s, INFINITY), 1, "this rank's inf");
  cr_expect_eq(agree(&s, NAN), 1, "this rank's NaN");
  peer_sumsq = INFINITY;
  cr_expect_eq(agree(&s, 2.0), 1, "only the peer's gradients overflowed: every rank skips");
  peer_sumsq = NAN;
  cr_expect_eq(agree(&s, INFINITY), 1, "both");
  /* each state word differing alone, the peer's above and below ours (0 included) */
  const double d_scale[] = {8192.0, 2048.0}, d_growth[] = {0, 4}, d_skipped[] = {0, 9};
  for (int k = 0; k < 2; k++) {
    peer = s, peer_sumsq = 1.0, peer.scale = (float)d_scale[k];
    cr_expect_eq(agree(&s, 2.0), -1, "peer's scale %g vs %g", d_scale[k], s.scale);
    peer = s, peer.growth = (int64_t)d_growth[k];
    cr_expect_eq(agree(&s, 2.0), -1, "peer's growth %g vs 2", d_growth[k]);
    peer = s, peer.skipped = (int64_t)d_skipped[k];
    cr_expect_eq(agree(&s, 2.0), -1, "peer's skipped %g vs 3", d_skipped[k]);
  }
}

Test(precision, names_and_array_rounding) {
  dt_precision_t p;
  cr_expect(dt_precision_parse("bf16", &p) == 0 && p == DT_PREC_BF16);
  cr_expect(dt_precision_parse("fp16", &p) == 0 && p == DT_PREC_FP16);
  cr_expect(dt_precision_parse("fp32", &p) == 0 && p == DT_PREC_FP32);
  cr_expect(dt_precision_parse("fp8", &p) != 0);
  for (int i = 0; i < 3; i++) { /* p is set from whatever it held before */
    const char *name[3] = {"fp32", "bf16", "fp16"};
    p = (dt_precision_t)((i + 1) % 3);
    cr_expect(dt_precision_parse(name[i], &p) == 0 && p == (dt_precision_t)i, "%s", name[i]);
  }
  p = DT_PREC_FP16;
  cr_expect(dt_precision_parse("", &p) == -1 && p == DT_PREC_FP16, "an unknown name is -1 and leaves p alone");
  cr_expect_str_eq(dt_precision_name(DT_PREC_BF16), "bf16");
  cr_expect_str_eq(dt_precision_name(DT_PREC_FP16), "fp16");
  cr_expect_str_eq(dt_precision_name(DT_PREC_FP32), "fp32");
  for (int v = 3; v < 256; v++) cr_expect_null(dt_precision_name((dt_precision_t)v), "no name for %d", v);
  cr_expect_null(dt_precision_name((dt_precision_t)-1), "no name for a negative value");
  /* one element past the end of each array is a sentinel no call may touch; element 0 is not a
   * bf16 or fp16 value (1 + 2^-20 rounds to 1 in both), so a loop that skips it shows */
  enum { N = 10007 };
  const float sentinel = 0x1.234568p+3f;
  float *x = malloc((N + 1) * sizeof *x), *y = malloc((N + 1) * sizeof *y), *z = malloc((N + 1) * sizeof *z);
  dt_rng_t r;
  dt_rng_seed(&r, 3);
  for (int i = 0; i < N; i++) x[i] = (float)(dt_rng_normal(&r) * pow(10.0, (double)(i % 13) - 6));
  x[0] = 1.0f + 0x1p-20f;
  x[N] = 3.0f;
  for (int p2 = 0; p2 < 3; p2++) {
    memcpy(y, x, N * sizeof *x);
    for (int i = 0; i < N; i++) z[i] = NAN;
    y[N] = z[N] = sentinel;
    dt_prec_round(y, N, (dt_precision_t)p2);
    dt_prec_round_copy(z, x, N, (dt_precision_t)p2);
    cr_assert(y[N] == sentinel && z[N] == sentinel, "precision %d wrote past the end", p2);
    for (int i = 0; i < N; i++) {
      float want = p2 == DT_PREC_BF16 ? dt_round_bf16(x[i]) : p2 == DT_PREC_FP16 ? dt_round_fp16(x[i]) : x[i];
      cr_assert(memcmp(&y[i], &want, 4) == 0 && memcmp(&z[i], &want, 4) == 0, "precision %d, element %d", p2, i);
    }
    if (p2 != DT_PREC_FP32) cr_assert_eq(y[0], 1.0f, "precision %d: element 0 rounded", p2);
  }
  free(x), free(y), free(z);
}

/* ---- the CPU backend in bf16 / fp16 ---------------------------------------------------------- */

static const dt_dims_t dims = {.L = 2, .NH = 2, .C = 16, .V = 37, .Vp = 128, .T = 8};
enum { B = 2, T = 8 };

static void setup(dt_layout_t *lay, dt_backend_t *be, dt_gpt2_t *g, dt_precision_t p, int *inp, int *tgt) {
  cr_assert_eq(dt_layout_init(lay, dims), DT_OK);
  memset(be, 0, sizeof *be); /* fields a caller may set before init (opt_lo/opt_hi) start unset */
  cr_assert_eq(dt_backend_cpu.init(be, lay, B, T, 1), DT_OK, "%s", dt_err_msg());
  cr_assert_eq(be->ops->set_precision(be, p), DT_OK, "%s", dt_err_msg());
  dt_model_init_params(lay, be->params, 11);
  dt_rng_t r;
  dt_rng_seed(&r, 5);
  for (size_t i = 0; i < lay->n_params; i++) be->params[i] += (float)(0.05 * dt_rng_normal(&r));
  for (int i = 0; i < B * T; i++) inp[i] = (int)(dt_rng_next(&r) % dims.V), tgt[i] = (int)(dt_rng_next(&r) % dims.V);
  cr_assert_eq(dt_gpt2_init(g, be, 1, 0), DT_OK, "%s", dt_err_msg());
}

static double run(dt_gpt2_t *g, const int *inp, const int *tgt, float loss_scale, float *grads_out) {
  dt_backend_t *be = g->be;
  float loss = 0;
  be->loss_scale = loss_scale;
  cr_assert_eq(be->ops->zero_grad(be), DT_OK);
  cr_assert_eq(dt_gpt2_forward(g, inp, tgt, B, T, &loss), DT_OK, "%s", dt_err_msg());
  cr_assert_eq(dt_gpt2_backward(g, 1, NULL, NULL), DT_OK, "%s", dt_err_msg());
  if (grads_out) memcpy(grads_out, be->grads, be->lay->n_params * sizeof(float));
  return loss;
}

Test(precision, bf16_backend_rounds_working_copy_and_activations_not_master) {
  dt_layout_t lay;
  dt_backend_t be = {0}, ref = {0};
  dt_gpt2_t g, gref;
  int inp[B * T], tgt[B * T];
  setup(&lay, &be, &g, DT_PREC_BF16, inp, tgt);
  dt_layout_t lay2;
  setup(&lay2, &ref, &gref, DT_PREC_FP32, inp, tgt);
  size_t n = lay.n_params;
  cr_assert(be.wparams != be.params, "bf16 needs a separate working copy");
  cr_assert(ref.wparams == ref.params, "fp32 reads the master itself");
  float *master = malloc(n * sizeof *master);
  memcpy(master, be.params, n * sizeof *master);
  double l16 = run(&g, inp, tgt, 1.0f, NULL), l32 = run(&gref, inp, tgt, 1.0f, NULL);
  cr_expect_eq(memcmp(master, be.params, n * sizeof *master), 0, "forward/backward changed the fp32 master");
  size_t changed = 0;
  const float *w = be.wparams; /* the CPU backend's storage: floats */
  for (size_t i = 0; i < n; i++) {
    cr_assert(w[i] == dt_round_bf16(be.params[i]), "working copy %zu is not the rounded master", i);
    changed += w[i] != be.params[i];
  }
  cr_expect(changed > n / 2, "only %zu of %zu parameters changed by rounding", changed, n);
  float *logits = malloc((size_t)B * T * dims.Vp * sizeof *logits);
  cr_assert_eq(dt_gpt2_logits_to_host(&g, logits), DT_OK);
  for (size_t i = 0; i < (size_t)B * T * dims.Vp; i++)
    cr_assert(logits[i] == dt_round_bf16(logits[i]), "logit %zu = %a is not a bf16 value", i, (double)logits[i]);
  /* bf16 keeps ~3 significant digits: the loss moves, but little */
  cr_expect(l16 != l32 && fabs(l16 - l32) < 0.02 * l32, "bf16 loss %.9g vs fp32 %.9g", l16, l32);
  free(master), free(logits);
  dt_gpt2_free(&g), dt_gpt2_free(&gref);
  be.ops->free(&be), ref.ops->free(&ref);
  dt_layout_free(&lay), dt_layout_free(&lay2);
}

/* bf16 has float's exponent range, so multiplying the loss by 2^10 multiplies every rounded
 * activation gradient and every fp32 parameter gradient by exactly 2^10. */
Test(precision, loss_scale_scales_gradients_exactly_in_bf16) {
  dt_layout_t lay;
  dt_backend_t be = {0};
  dt_gpt2_t g;
  int inp[B * T], tgt[B * T];
  setup(&lay, &be, &g, DT_PREC_BF16, inp, tgt);
  size_t n = lay.n_params;
  float *g1 = malloc(n * sizeof *g1), *g2 = malloc(n * sizeof *g2);
  run(&g, inp, tgt, 1.0f, g1);
  run(&g, inp, tgt, 1024.0f, g2);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; i++) {
    cr_assert(g2[i] == 1024.0f * g1[i], "gradient %zu: %a vs 1024 x %a", i, (double)g2[i], (double)g1[i]);
    nonzero += g1[i] != 0.0f;
  }
  cr_expect(nonzero > n / 4, "only %zu nonzero gradients", nonzero);
  free(g1), free(g2);
  dt_gpt2_free(&g);
  be.ops->free(&be);
  dt_layout_free(&lay);
}

/* fp16 tops out at 65504: with a loss scale of 2^40 the logit gradients overflow to inf, and the
 * gradient sum of squares (what the scaler checks) is no longer finite; with 2^10 it is. */
Test(precision, fp16_overflow_reaches_the_gradient_norm) {
  dt_layout_t lay;
  dt_backend_t be = {0};
  dt_gpt2_t g;
  int inp[B * T], tgt[B * T];
  setup(&lay, &be, &g, DT_PREC_FP16, inp, tgt);
  double ss = 0;
  run(&g, inp, tgt, 1024.0f, NULL);
  cr_assert_eq(be.ops->grad_sumsq(&be, &ss), DT_OK);
  cr_expect(isfinite(ss) && ss > 0, "scale 2^10: sum of squares %g", ss);
  run(&g, inp, tgt, 0x1p40f, NULL);
  cr_assert_eq(be.ops->grad_sumsq(&be, &ss), DT_OK);
  cr_expect(!isfinite(ss), "scale 2^40: sum of squares %g should be inf/NaN", ss);
  dt_gpt2_free(&g);
  be.ops->free(&be);
  dt_layout_free(&lay);
}
