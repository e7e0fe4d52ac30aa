/* Unit tests of the image classifiers' model code (src/model/cnn*.c) and batch-norm kernels
 * (src/backend/ops_cnn_cpu.c) for what PyTorch comparisons cannot see: the configurations the
 * builder refuses at their exact bounds, writes that stay inside their tensors and arrays (a loop
 * one past its end lands in padding or in a neighbour overwritten later), the edge case of a
 * one-value batch norm, and memory: dt_cnn_free releases every block dt_cnn_alloc took, the shared
 * pool of activations and their gradients gives the loss and gradients of private ones. The
 * convolutions' scratch sizes (im2col and Winograd) and the choice of algorithm (DT_CONV).
 * The layers' numbers against PyTorch: tests/ref_cnn.sh. */
#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cnn.h"
#include "conv_winograd.h"
#include "ops_cnn_cpu.h"

static const dt_cnn_config_t simple = {.arch = DT_CNN_SIMPLE, .C = 1, .H = 28, .W = 28, .classes = 10, .width = 4,
                                       .hidden = 8};

static dt_status_t build(dt_cnn_config_t c) {
  dt_cnn_t m;
  dt_err_clear();
  dt_status_t st = dt_cnn_build(&m, &c);
  if (st == DT_OK) dt_cnn_free(&m);
  return st;
}

Test(cnn, build_refuses_each_field_below_its_bound_and_takes_the_bound) {
  typedef struct {
    size_t at; /* offset of the int field in dt_cnn_config_t */
    int bound;
    const char *name;
  } field_t;
  const field_t f[] = {{offsetof(dt_cnn_config_t, C), 1, "C"},          {offsetof(dt_cnn_config_t, H), 1, "H"},
                       {offsetof(dt_cnn_config_t, W), 1, "W"},          {offsetof(dt_cnn_config_t, classes), 2, "classes"},
                       {offsetof(dt_cnn_config_t, width), 1, "width"}, {offsetof(dt_cnn_config_t, hidden), 1, "hidden"}};
  const int n = (int)(sizeof f / sizeof f[0]);
  dt_cnn_config_t c;
  for (int i = 0; i < n; i++) {
    c = simple;
    int *v = (int *)((char *)&c + f[i].at);
    *v = f[i].bound - 1;
    cr_expect(build(c) == DT_ERR_CONFIG, "%s = %d not refused as a configuration error", f[i].name, f[i].bound - 1);
    if (v == &c.H || v == &c.W) continue; /* a 1-pixel image is too small to pool */
    *v = f[i].bound;
    cr_expect(build(c) == DT_OK, "%s = %d refused: %s", f[i].name, f[i].bound, dt_err_msg());
  }
  c = simple, c.arch = DT_CNN_RESNET18, c.C = 3, c.H = c.W = 32, c.hidden = 0; /* hidden: the simple CNN's only */
  cr_expect(build(c) == DT_OK, "resnet18 with hidden = 0 refused: %s", dt_err_msg());
}

/* Floats of an arena (n_params, then DT_ALIGN more past it) outside its tensors that do not hold
 * what dt_cnn_init_params leaves there: 0 in the padding (it zeroes its arenas first), the NaN the
 * test put past the end. */
static size_t outside_changed(const dt_layout_t *lay, const float *a) {
  const size_t n = lay->n_params + DT_ALIGN;
  unsigned char *in = calloc(n, 1);
  for (int t = 0; t < lay->n_tensors; t++)
    memset(in + lay->tensors[t].offset, 1, (size_t)lay->tensors[t].rows * lay->tensors[t].cols);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (!in[i]) bad += i < lay->n_params ? a[i] != 0.0f : !isnan(a[i]);
  free(in);
  return bad;
}

static float *arena(const dt_layout_t *lay) {
  float *a = malloc((lay->n_params + DT_ALIGN) * sizeof *a);
  for (size_t i = 0; i < lay->n_params + DT_ALIGN; i++) a[i] = NAN;
  return a;
}

Test(cnn, init_writes_only_inside_the_tensors) {
  dt_cnn_config_t cs[3] = {simple, simple, simple};
  cs[1].arch = DT_CNN_RESNET18, cs[1].C = 3, cs[1].H = cs[1].W = 8; /* the classifier's bias ends the arenas: */
  cs[1].classes = cs[2].classes = cs[2].hidden = DT_ALIGN;            /* with DT_ALIGN classes, flush */
  for (int k = 0; k < 3; k++) {
    dt_cnn_t m;
    cr_assert(dt_cnn_build(&m, &cs[k]) == DT_OK, "%s", dt_err_msg());
    float *p = arena(&m.lay), *b = arena(&m.bufs);
    dt_cnn_init_params(&m, p, b, 7);
    cr_expect(outside_changed(&m.lay, p) == 0, "config %d: parameter floats outside the tensors written", k);
    cr_expect(outside_changed(&m.bufs, b) == 0, "config %d: buffer floats outside the tensors written", k);
    free(p), free(b);
    dt_cnn_free(&m);
  }
}

/* ---- batch norm: the C (and B*C*HW) values each kernel writes, and no more ------------------- */

#define BB 2
#define BC 3
#define BHW 5

#define GUARD -1234.5f /* not NaN: a loop one past the end may read NaN and write it back */

/* n floats then a guard */
static float *guarded(size_t n, float v) {
  float *a = malloc((n + 1) * sizeof *a);
  for (size_t i = 0; i < n; i++) a[i] = v;
  a[n] = GUARD;
  return a;
}

Test(cnn, batchnorm_kernels_write_their_arrays_and_no_further) {
  const size_t n = (size_t)BB * BC * BHW;
  float *x = guarded(n, 0), *d = guarded(n, 0), *y = guarded(n, 0), *dx = guarded(n, 0), *w = guarded(BC, 0);
  float *bias = guarded(BC, 0), *mean = guarded(BC, 0), *var = guarded(BC, 0), *rstd = guarded(BC, 0);
  float *sdy = guarded(BC, 0), *sdyx = guarded(BC, 0), *dw = guarded(BC, 0), *db = guarded(BC, 0);
  for (size_t i = 0; i < n; i++) x[i] = (float)((i * 7) % 11) - 4.0f, d[i] = (float)((i * 5) % 7) - 3.0f;
  for (int c = 0; c < BC; c++) w[c] = 1.0f + c, bias[c] = 0.5f * c;
  dt_batchnorm_stats(mean, var, x, BB, BC, BHW);
  for (int c = 0; c < BC; c++) { /* against float64 */
    double s = 0, s2 = 0;
    for (int b = 0; b < BB; b++)
      for (int i = 0; i < BHW; i++) s += x[(b * BC + c) * BHW + i];
    s /= BB * BHW;
    for (int b = 0; b < BB; b++)
      for (int i = 0; i < BHW; i++) s2 += pow(x[(b * BC + c) * BHW + i] - s, 2);
    cr_expect(fabs(mean[c] - s) < 1e-6 && fabs(var[c] - s2 / (BB * BHW)) < 1e-5, "channel %d: mean %g var %g", c,
              mean[c], var[c]);
  }
  dt_batchnorm_forward(y, rstd, x, mean, var, w, bias, 1e-5f, 1, BB, BC, BHW);
  dt_batchnorm_backward_reduce(sdy, sdyx, dw, db, d, y, x, mean, rstd, BB, BC, BHW);
  dt_batchnorm_backward(dx, d, y, x, mean, rstd, w, sdy, sdyx, (double)BB * BHW, BB, BC, BHW);
  float *arrays[] = {mean, var, rstd, sdy, sdyx, dw, db, y, dx, x, d};
  const char *names[] = {"mean", "var", "rstd", "sdy", "sdyx", "dweight", "dbias", "out", "dinp", "inp", "dout"};
  for (int k = 0; k < 11; k++) {
    size_t len = k < 7 ? BC : n;
    cr_expect(arrays[k][len] == GUARD, "%s: the float after its %zu was written", names[k], len);
    for (size_t i = 0; i < len; i++) cr_expect(isfinite(arrays[k][i]), "%s[%zu] = %g", names[k], i, arrays[k][i]);
  }
  for (int k = 0; k < 11; k++) free(arrays[k]);
  free(w), free(bias);
}

/* One convolution's forward and backward on guarded arrays and a guarded scratch of the size
 * dt_conv2d_scratch_floats gives: every output written (they start as NaN), nothing past any end. */
static void conv_inside(int B, int C, int H, int W, int OC, int K, int s, int p, int nthr) {
  const int OH = dt_conv_out(H, K, s, p), OW = dt_conv_out(W, K, s, p);
  const size_t ni = (size_t)B * C * H * W, no = (size_t)B * OC * OH * OW, nw = (size_t)OC * C * K * K;
  const size_t ns = dt_conv2d_scratch_floats(C, K, K, OC, OH, OW, s, p, nthr);
  float *x = guarded(ni, 0), *w = guarded(nw, 0), *b = guarded((size_t)OC, 0.5f), *d = guarded(no, 0);
  float *y = guarded(no, NAN), *dx = guarded(ni, NAN), *dw = guarded(nw, 0), *db = guarded((size_t)OC, 0);
  float *scr = guarded(ns, 0);
  for (size_t i = 0; i < ni; i++) x[i] = (float)((i * 7) % 11) - 5.0f;
  for (size_t i = 0; i < nw; i++) w[i] = 0.01f * (float)((i * 5) % 9);
  for (size_t i = 0; i < no; i++) d[i] = (float)((i * 3) % 5) - 2.0f;
  dt_conv2d_forward(y, scr, x, w, b, B, C, H, W, OC, K, K, s, p, nthr);
  dt_conv2d_backward(dx, dw, db, scr, d, x, w, B, C, H, W, OC, K, K, s, p, nthr);
  float *arrays[] = {y, dx, dw, db, scr, x, w, b, d};
  const size_t lens[] = {no, ni, nw, (size_t)OC, ns, ni, nw, (size_t)OC, no};
  const char *names[] = {"out", "dinp", "dweight", "dbias", "scratch", "inp", "weight", "bias", "dout"};
  for (int k = 0; k < 9; k++) {
    cr_expect(arrays[k][lens[k]] == GUARD,
              "algo %d, %dx%dx%dx%d -> %d, K%d s%d p%d, %d threads: %s: the float after its %zu was written",
              (int)dt_conv_algo(), B, C, H, W, OC, K, s, p, nthr, names[k], lens[k]);
    for (size_t i = 0; k < 4 && i < lens[k]; i++)
      if (!isfinite(arrays[k][i])) {
        cr_expect(0, "algo %d, %dx%dx%dx%d, %d threads: %s[%zu] = %g", (int)dt_conv_algo(), B, C, H, W, nthr,
                  names[k], i, arrays[k][i]);
        break;
      }
    free(arrays[k]);
  }
}

Test(cnn, convolutions_write_their_arrays_and_scratch_and_no_further) {
  const dt_conv_algo_t algos[] = {DT_CONV_AUTO, DT_CONV_IM2COL, DT_CONV_WINOGRAD4};
  for (int a = 0; a < 3; a++) {
    dt_conv_set_algo(algos[a]);
    for (int nthr = 1; nthr <= 2; nthr++) {
      conv_inside(3, 16, 9, 7, 5, 3, 1, 1, nthr);   /* Winograd, partial tiles */
      conv_inside(2, 16, 32, 32, 4, 3, 1, 1, nthr); /* Winograd, an image per chunk */
      conv_inside(1, 16, 32, 32, 64, 3, 1, 1, nthr); /* Winograd, a chunk's products larger than the thread buffers */
      conv_inside(5, 32, 4, 4, 8, 3, 1, 1, nthr);   /* Winograd, all images in one chunk */
      conv_inside(1, 16, 3, 140, 2, 3, 1, 1, nthr); /* Winograd, a tile row wider than a block */
      conv_inside(3, 3, 9, 7, 5, 3, 1, 1, nthr);    /* im2col: 3 channels */
      conv_inside(3, 16, 9, 9, 6, 3, 2, 1, nthr);   /* im2col: stride 2 */
      conv_inside(2, 16, 8, 8, 6, 1, 1, 0, nthr);   /* im2col: 1x1 */
    }
  }
  dt_conv_set_algo(DT_CONV_AUTO);
}

Test(cnn, winograd_takes_3x3_stride1_pad1_layers_of_16_or_more_channels) {
  dt_conv_set_algo(DT_CONV_AUTO);
  cr_expect_eq(dt_conv_winograd_m(16, 3, 3, 1, 1), 2);
  cr_expect_eq(dt_conv_winograd_m(15, 3, 3, 1, 1), 0, "15 channels: im2col");
  cr_expect_eq(dt_conv_winograd_m(64, 3, 3, 2, 1), 0, "stride 2");
  cr_expect_eq(dt_conv_winograd_m(64, 3, 3, 1, 0), 0, "padding 0");
  cr_expect_eq(dt_conv_winograd_m(64, 1, 1, 1, 0), 0, "1x1");
  cr_expect_eq(dt_conv_winograd_m(64, 3, 5, 1, 1), 0, "3x5");
  cr_expect_eq(dt_conv_winograd_m(64, 5, 3, 1, 1), 0, "5x3");
  dt_conv_set_algo(DT_CONV_WINOGRAD4);
  cr_expect_eq(dt_conv_winograd_m(16, 3, 3, 1, 1), 4);
  dt_conv_set_algo(DT_CONV_WINOGRAD2);
  cr_expect_eq(dt_conv_winograd_m(16, 3, 3, 1, 1), 2);
  dt_conv_set_algo(DT_CONV_IM2COL);
  cr_expect_eq(dt_conv_winograd_m(16, 3, 3, 1, 1), 0);
  dt_conv_set_algo(DT_CONV_AUTO);
}

Test(cnn, dt_conv_reads_its_environment_and_names_a_bad_value) {
  const char *ok[] = {"auto", "im2col", "winograd2", "winograd4", ""};
  const dt_conv_algo_t want[] = {DT_CONV_AUTO, DT_CONV_IM2COL, DT_CONV_WINOGRAD2, DT_CONV_WINOGRAD4, DT_CONV_AUTO};
  for (int i = 0; i < 5; i++) {
    setenv("DT_CONV", ok[i], 1);
    dt_conv_set_algo(DT_CONV_IM2COL + (want[i] == DT_CONV_IM2COL)); /* something else first */
    cr_expect_eq(dt_conv_algo_init(), DT_OK, "DT_CONV=%s", ok[i]);
    cr_expect_eq(dt_conv_algo(), want[i], "DT_CONV=%s", ok[i]);
  }
  setenv("DT_CONV", "winograd", 1);
  cr_expect_eq(dt_conv_algo_init(), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "DT_CONV='winograd'") != NULL, "%s", dt_err_msg());
  cr_expect_eq(dt_conv_algo(), DT_CONV_AUTO, "a bad value leaves auto");
  unsetenv("DT_CONV");
  cr_expect_eq(dt_conv_algo_init(), DT_OK);
  cr_expect_eq(dt_conv_algo(), DT_CONV_AUTO);
}

Test(cnn, running_statistics_of_a_one_value_batch_norm_stay_finite) {
  /* n = 1 (one image of 1x1 at one rank): no unbiasing n / (n - 1); the variance is 0 */
  float rm[2] = {1.0f, 2.0f}, rv[2] = {3.0f, 4.0f}, mean[2] = {5.0f, 6.0f}, var[2] = {0.0f, 0.0f};
  dt_batchnorm_running(rm, rv, mean, var, 2, 0.1f, 1.0);
  for (int c = 0; c < 2; c++) {
    cr_expect(fabsf(rm[c] - (0.9f * (1.0f + c) + 0.1f * (5.0f + c))) < 1e-6f, "running mean %d: %g", c, rm[c]);
    cr_expect(fabsf(rv[c] - 0.9f * (3.0f + c)) < 1e-6f, "running var %d: %g", c, rv[c]);
  }
  rv[0] = 1.0f, var[0] = 2.0f; /* n = 4: unbiased by 4/3 */
  dt_batchnorm_running(rm, rv, mean, var, 1, 0.5f, 4.0);
  cr_expect(fabsf(rv[0] - (0.5f + 0.5f * 2.0f * 4.0f / 3.0f)) < 1e-6f, "running var with n = 4: %g", rv[0]);
}

/* ---- memory: dt_cnn_free gives back what dt_cnn_alloc took -------------------------------------- */

static int live;
static dt_status_t count_alloc(dt_backend_t *be, void **p, size_t bytes) {
  dt_status_t st = dt_backend_cpu.kernels->alloc(be, p, bytes);
  live += st == DT_OK;
  return st;
}
static void count_release(dt_backend_t *be, void *p) {
  live -= p != NULL;
  dt_backend_cpu.kernels->release(be, p);
}

Test(cnn, free_releases_every_block_alloc_took) {
  dt_kernels_t k = *dt_backend_cpu.kernels;
  k.alloc = count_alloc, k.release = count_release;
  dt_backend_t be = {.ops = &dt_backend_cpu, .k = &k, .threads = 1};
  dt_cnn_t m;
  cr_assert(dt_cnn_build(&m, &simple) == DT_OK, "%s", dt_err_msg());
  cr_assert(dt_cnn_alloc(&m, &be, 4) == DT_OK, "%s", dt_err_msg());
  cr_expect(live >= 10, "only %d blocks allocated", live);
  dt_cnn_free(&m);
  cr_expect(live == 0, "%d blocks not released", live);
  dt_cnn_t z;
  memset(&z, 0, sizeof z);
  dt_cnn_free(&z); /* never allocated: nothing to release, no backend to ask */
  cr_expect(live == 0);
}

/* One training forward and backward of c on B random images with every slot's activations and
 * gradient in their own memory (mem_private) or in the shared pool: the np parameter gradients,
 * the loss, the arena's and the pool's floats. */
typedef struct {
  float *grads;
  double loss;
  size_t np, acts, pool;
} cnn_run_t;

static cnn_run_t cnn_run(const dt_cnn_config_t *c, int B, int mem_private) {
  dt_backend_t be = {.ops = &dt_backend_cpu, .k = dt_backend_cpu.kernels, .threads = 1};
  dt_cnn_t m;
  cr_assert(dt_cnn_build(&m, c) == DT_OK, "%s", dt_err_msg());
  m.mem_private = mem_private;
  cr_assert(dt_cnn_alloc(&m, &be, B) == DT_OK, "%s", dt_err_msg());
  size_t np = m.lay.n_params, nx = (size_t)B * c->C * c->H * c->W;
  float *p = malloc(np * sizeof *p), *g = calloc(np, sizeof *g), *bufs = malloc(m.bufs.n_params * sizeof *bufs);
  float *x = malloc(nx * sizeof *x);
  int *y = malloc((size_t)B * sizeof *y);
  cr_assert(p && g && bufs && x && y);
  dt_cnn_init_params(&m, p, bufs, 7);
  for (size_t i = 0; i < nx; i++)
    x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  for (int i = 0; i < B; i++)
    y[i] = (i * 7) % c->classes;
  cnn_run_t r = {g, 0.0, np, m.n_acts, m.n_dacts};
  cr_assert(dt_cnn_forward(&m, p, bufs, x, y, 1, &r.loss, NULL) == DT_OK, "%s", dt_err_msg());
  cr_assert(dt_cnn_backward(&m, p, g, 1.0f / (float)B) == DT_OK, "%s", dt_err_msg());
  dt_cnn_free(&m);
  free(p), free(bufs), free(x), free(y);
  return r;
}

/* The pool is planned from when forward and backward write and read each slot; a slot overwritten
 * while still needed changes the loss or the parameter gradients. Residual blocks keep a block's
 * input gradient alive across the block, ResNet-50's projection shortcuts read a slot twice, the
 * branch's last batch norm and the shortcut's write activations that only the add reads. */
Test(cnn, shared_memory_gives_the_same_loss_and_gradients_in_a_fraction_of_the_memory) {
  const dt_cnn_config_t cs[] = {
      simple,
      {.arch = DT_CNN_RESNET18, .C = 3, .H = 16, .W = 16, .classes = 10, .width = 4},
      {.arch = DT_CNN_RESNET50, .C = 3, .H = 16, .W = 16, .classes = 10, .width = 4},
  };
  /* at most, of the private layout's floats: the pool, and the arena (measured 0.62, 0.13, 0.09
   * and 1, 0.80, 0.74) */
  const double pool_most[] = {0.7, 0.2, 0.12}, acts_most[] = {1.0, 0.85, 0.8};
  for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
    const cnn_run_t a = cnn_run(&cs[k], 3, 1), b = cnn_run(&cs[k], 3, 0);
    const int arch = (int)cs[k].arch;
    size_t np = a.np, same = 0;
    for (size_t i = 0; i < np; i++)
      same += memcmp(&a.grads[i], &b.grads[i], sizeof *a.grads) == 0;
    cr_expect_eq(a.loss, b.loss, "arch %d: loss %.9g shared, %.9g private", arch, b.loss, a.loss);
    cr_expect_eq(same, np, "arch %d: %zu of %zu parameter gradients differ", arch, np - same, np);
    cr_expect_eq(a.pool, a.acts, "arch %d: private gradients %zu floats, activations %zu", arch, a.pool, a.acts);
    cr_expect_leq((double)b.pool, pool_most[k] * (double)a.acts, "arch %d: pool %zu floats of %zu", arch, b.pool,
                  a.acts);
    cr_expect_leq((double)b.acts, acts_most[k] * (double)a.acts, "arch %d: arena %zu floats of %zu", arch, b.acts,
                  a.acts);
    free(a.grads), free(b.grads);
  }
}
