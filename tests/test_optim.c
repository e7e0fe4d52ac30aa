/* Optimizer pieces: the AdamW element update (kmath.h) against hand-computed values, the backend's
 * AdamW over the arena (decay only where decay=1, grad_scale), the lr schedule and the clip scale. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "backend.h"
#include "kmath.h"
#include "optim.h"

/* lr = 0.1, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.1, p0 = 1, m0 = v0 = 0.
 * step 1, g = 0.5:
 *   m = 0.1*0.5 = 0.05;  v = 0.001*0.25 = 0.00025;  bc1 = 0.1, bc2 = 0.001
 *   p <- 1 - 0.1*0.1*1 = 0.99;  denom = sqrt(0.00025)/sqrt(0.001) + 1e-8 = 0.5 + 1e-8
 *   p <- 0.99 - (0.1/0.1) * 0.05 / 0.50000001 = 0.99 - 0.099999998 = 0.890000002
 * step 2, g = -0.25:
 *   m = 0.9*0.05 - 0.1*0.25 = 0.02;  v = 0.999*0.00025 + 0.001*0.0625 = 0.00031225
 *   bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.998001 = 0.001999
 *   p <- 0.890000002 * 0.99 = 0.88110000198;  denom = sqrt(0.00031225/0.001999) + 1e-8 = 0.3952253907
 *   p <- 0.88110000198 - (0.1/0.19) * 0.02 / 0.3952253907 = 0.88110000198 - 0.0266337033 = 0.8544662987
 * step 3, g = 0.125:
 *   m = 0.9*0.02 + 0.1*0.125 = 0.0305;  v = 0.999*0.00031225 + 0.001*0.015625 = 0.00032756275
 *   bc1 = 1 - 0.729 = 0.271, bc2 = 1 - 0.997002999 = 0.002997001
 *   p <- 0.8544662987 * 0.99 = 0.8459216357;  denom = sqrt(0.00032756275/0.002997001) + 1e-8 = 0.3306007416
 *   p <- 0.8459216357 - (0.1/0.271) * 0.0305 / 0.3306007416 = 0.8459216357 - 0.0340429138 = 0.8118787219
 * Float tolerances: the kernel forms 1 - beta2 in float from beta2 = 0.999f, which is 0.00099998713
 * (1.3e-5 relative below 0.001), so v is checked to 2e-5 relative; that moves the update by
 * ~6e-6 relative, i.e. < 1e-6 absolute in p. A wrong formula (no bias correction, decay on the
 * update instead of p, sqrt missing) changes p by > 1e-3. */
Test(optim, adamw_element_by_hand) {
  const float lr = 0.1f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
  const float g[3] = {0.5f, -0.25f, 0.125f};
  const double want_p[3] = {0.890000002, 0.8544662987, 0.8118787219};
  const double want_m[3] = {0.05, 0.02, 0.0305}, want_v[3] = {0.00025, 0.00031225, 0.00032756275};
  float p = 1.0f, m = 0.0f, v = 0.0f;
  for (int t = 1; t <= 3; t++) {
    float bc1 = (float)(1.0 - pow(b1, t)), bc2 = (float)(1.0 - pow(b2, t));
    p = dt_adamw_update(p, g[t - 1], &m, &v, lr, b1, b2, eps, wd, bc1, bc2);
    cr_expect(fabs(m - want_m[t - 1]) < 1e-6 * want_m[t - 1], "step %d: m %.9g want %.9g", t, m, want_m[t - 1]);
    cr_expect(fabs(v - want_v[t - 1]) < 2e-5 * want_v[t - 1], "step %d: v %.9g want %.9g", t, v, want_v[t - 1]);
    cr_expect(fabs(p - want_p[t - 1]) < 1e-6, "step %d: p %.9g want %.9g", t, p, want_p[t - 1]);
  }
}

/* Through the backend: weight decay only on decay=1 tensors, grad_scale applied before the moments. */
Test(optim, backend_adamw_decay_and_scale) {
  dt_dims_t d = {.L = 1, .NH = 2, .C = 8, .V = 10, .Vp = 128, .T = 4};
  dt_layout_t lay;
  cr_assert_eq(dt_layout_init(&lay, d), DT_OK);
  dt_backend_t be = {0};
  cr_assert_eq(dt_backend_cpu.init(&be, &lay, 1, 4, 1), DT_OK, "%s", dt_err_msg());
  for (size_t i = 0; i < lay.n_params; i++) be.params[i] = 0.5f, be.grads[i] = 0.25f;
  dt_adamw_args_t a = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                       .grad_scale = 0.5f, .t = 1};
  cr_assert_eq(be.ops->adamw(&be, &a), DT_OK);
  for (int i = 0; i < lay.n_tensors; i++) {
    const dt_tensor_t *t = &lay.tensors[i];
    float p0 = 0.5f, g = 0.25f * 0.5f;
    float m = 0.1f * g, v = 0.05f * g * g;
    float pd = t->decay ? p0 - 0.01f * 0.1f * p0 : p0;
    float want = pd - (0.01f / 0.1f) * m / (sqrtf(v) / sqrtf(0.05f) + 1e-8f);
    cr_expect(fabsf(be.params[t->offset] - want) < 1e-6f, "%s: p %.8g want %.8g", t->name, be.params[t->offset],
              want);
    cr_expect(fabsf(be.m[t->offset] - m) < 1e-6f * m, "%s: m %.9g want %.9g", t->name, be.m[t->offset], m);
    cr_expect(fabsf(be.v[t->offset] - v) < 1e-6f * v, "%s: v %.9g want %.9g", t->name, be.v[t->offset], v);
    cr_expect_eq(t->decay, t->ndim == 2, "%s: decay flag", t->name);
  }
  /* biases/layernorm: only the Adam step (0.5 - 0.01*1 = 0.49); weights also decay (0.4995 - 0.01) */
  cr_expect(fabsf(be.params[dt_layout_block(&lay, 0, DT_LN1B)->offset] - 0.49f) < 1e-6f);
  cr_expect(fabsf(be.params[dt_layout_block(&lay, 0, DT_FCW)->offset] - 0.4895f) < 1e-6f);
  be.ops->free(&be);
  dt_layout_free(&lay);
}

static dt_config_t sched(const char *kind) {
  dt_config_t c;
  dt_config_defaults(&c);
  c.lr = 1e-3;
  c.min_lr = 1e-4;
  c.warmup = 3;
  c.steps = 11;
  snprintf(c.lr_schedule, sizeof c.lr_schedule, "%s", kind);
  return c;
}

Test(optim, lr_schedule) {
  dt_config_t c = sched("cosine");
  /* warmup: lr * (step+1)/3 */
  cr_expect_float_eq(dt_lr_at(&c, 0), 1e-3 / 3, 1e-15);
  cr_expect_float_eq(dt_lr_at(&c, 1), 2e-3 / 3, 1e-15);
  cr_expect_float_eq(dt_lr_at(&c, 2), 1e-3, 1e-15);
  /* cosine over steps - warmup = 8: p = 0 at step 3, 0.5 at step 7, 0.75 at step 9, 1 at step 11 */
  cr_expect_float_eq(dt_lr_at(&c, 3), 1e-3, 1e-15);
  cr_expect_float_eq(dt_lr_at(&c, 7), 1e-4 + 0.5 * 9e-4, 1e-15);
  cr_expect_float_eq(dt_lr_at(&c, 9), 1e-4 + 0.5 * 9e-4 * (1 - sqrt(0.5)), 1e-15);
  cr_expect_float_eq(dt_lr_at(&c, 11), 1e-4, 1e-15);
  cr_expect_float_eq(dt_lr_at(&c, 50), 1e-4, 1e-15);
  dt_config_t k = sched("constant");
  cr_expect_float_eq(dt_lr_at(&k, 0), 1e-3 / 3, 1e-15);
  cr_expect_float_eq(dt_lr_at(&k, 7), 1e-3, 1e-15);
  k.warmup = 0;
  cr_expect_float_eq(dt_lr_at(&k, 0), 1e-3, 1e-15);
}

/* Schedules with no or one decay step: the span is max(1, steps - warmup), so p = (step -
 * warmup) / span is never 0/0 and the lr stays finite past the end (a resumed run that raised
 * train.steps, or stop_after, asks for such steps). steps == warmup = 3: p = 0 at step 3, 1 at 4;
 * steps = warmup + 1 = 4: the same numbers; later steps hold p at 1 (cos(2 pi) would be lr again). */
Test(optim, lr_schedule_short_decay) {
  dt_config_t c = sched("cosine");
  for (int steps = 3; steps <= 4; steps++) {
    c.steps = steps;
    cr_expect_float_eq(dt_lr_at(&c, 2), 1e-3, 1e-15, "steps %d", steps);
    cr_expect_float_eq(dt_lr_at(&c, 3), 1e-3, 1e-15, "steps %d: step 3 is p = 0", steps);
    cr_expect_float_eq(dt_lr_at(&c, 4), 1e-4, 1e-15, "steps %d: step 4 is p = 1", steps);
    cr_expect_float_eq(dt_lr_at(&c, 5), 1e-4, 1e-15, "steps %d: step 5 is p = 2, held at 1", steps);
    cr_expect_float_eq(dt_lr_at(&c, 9), 1e-4, 1e-15, "steps %d: past the end: min_lr", steps);
  }
}

Test(optim, clip_scale) {
  cr_expect_float_eq(dt_clip_scale(2.0, 1.0), (float)(1.0 / (2.0 + 1e-6)), 1e-9);
  cr_expect_float_eq(dt_clip_scale(0.5, 1.0), 1.0f, 0);
  /* at norm == clip torch still scales by 1/(1+1e-6) */
  cr_expect_float_eq(dt_clip_scale(1.0, 1.0), (float)(1.0 / (1.0 + 1e-6)), 1e-9);
  cr_expect_lt(dt_clip_scale(1.0, 1.0), 1.0f);
  cr_expect_float_eq(dt_clip_scale(100.0, 0.0), 1.0f, 0);
  cr_expect_float_eq(dt_clip_scale(4.0, 2.0), (float)(2.0 / (4.0 + 1e-6)), 1e-9);
}
