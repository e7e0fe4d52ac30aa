/* Dump a few training steps of a CNN model (src/model/cnn.h) for the PyTorch reference
 * (tests/ref/ref_cnn_model.py): for every step s its batch (random images and labels), the
 * parameters q{s}/ and running statistics c{s}/ it starts from, its loss and gradients g{s}/, then
 * the parameters and running statistics after the last step (q{STEPS}/, c{STEPS}/) and the
 * evaluation-mode loss and accuracy there on the first batch. The update is SGD with momentum 0.9
 * and weight decay 5e-4, lr 0.05, or AdamW lr 1e-3, weight decay 0.01; the histogram of the
 * evaluation's predictions over the classes. ARCH resnet50z is resnet50
 * with zero_init_residual. Records { char name[64]; int64 n; float32 data[n] } (tests/dump.h).
 * Usage: cnn_model_dump OUT.bin ARCH C H W CLASSES WIDTH HIDDEN B STEPS sgd|adamw */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cnn.h"
#include "dump.h"
#include "kmath.h"

static FILE *out;

static void rec(const char *a, const char *b, const float *x, size_t n) {
  char nm[64];
  snprintf(nm, sizeof nm, "%s%s", a, b);
  dump_rec(out, nm, x, n);
}

static void rec_arena(const dt_layout_t *lay, const char *prefix, const float *arena) {
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    rec(prefix, t->name, arena + t->offset, (size_t)t->rows * t->cols);
  }
}

static void update(const dt_layout_t *lay, float *p, const float *g, float *m, float *v, int adamw, int step) {
  const float b1 = 0.9f, b2 = 0.999f, bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    for (size_t k = t->offset; k < t->offset + (size_t)t->rows * t->cols; k++)
      p[k] = adamw ? dt_adamw_update(p[k], g[k], &m[k], &v[k], 1e-3f, b1, b2, 1e-8f, 0.01f, bc1, bc2)
                   : dt_sgd_update(p[k], g[k], &m[k], 0.05f, 0.9f, 5e-4f, 0);
  }
}

int main(int argc, char **argv) {
  if (argc != 12) {
    fprintf(stderr, "usage: cnn_model_dump OUT.bin ARCH C H W CLASSES WIDTH HIDDEN B STEPS sgd|adamw\n");
    return 2;
  }
  dt_cnn_config_t c = {0};
  dt_cnn_t m;
  c.zero_init_residual = !strcmp(argv[2], "resnet50z");
  dt_status_t st = dt_cnn_arch_parse(c.zero_init_residual ? "resnet50" : argv[2], &c.arch);
  c.C = atoi(argv[3]), c.H = atoi(argv[4]), c.W = atoi(argv[5]), c.classes = atoi(argv[6]);
  c.width = atoi(argv[7]), c.hidden = atoi(argv[8]);
  int B = atoi(argv[9]), steps = atoi(argv[10]), adamw = !strcmp(argv[11], "adamw");
  dt_backend_t be = {.ops = &dt_backend_cpu, .k = dt_backend_cpu.kernels, .threads = 2}; /* kernels and memory */
  if (st || (st = dt_cnn_build(&m, &c)) || (st = dt_cnn_alloc(&m, &be, B))) {
    fprintf(stderr, "cnn_model_dump: %s\n", dt_err_msg());
    return 1;
  }
  out = fopen(argv[1], "wb");
  if (!out) {
    perror(argv[1]);
    return 1;
  }
  size_t np = m.lay.n_params, nx = (size_t)B * c.C * c.H * c.W;
  float *p = malloc(np * sizeof *p), *g = calloc(np, sizeof *g), *mo = calloc(np, sizeof *mo),
        *v = calloc(np, sizeof *v), *bufs = malloc(m.bufs.n_params * sizeof *bufs), *x = malloc(nx * sizeof *x),
        *x0 = malloc(nx * sizeof *x0), *yf = malloc((size_t)B * sizeof *yf), *losses = malloc((size_t)steps * sizeof *losses);
  int *y = malloc((size_t)B * sizeof *y), *y0 = malloc((size_t)B * sizeof *y0);
  dt_cnn_init_params(&m, p, bufs, 25);
  float meta[] = {(float)c.arch, (float)c.C, (float)c.H, (float)c.W, (float)c.classes, (float)c.width,
                  (float)c.hidden, (float)B, (float)steps, (float)adamw, (float)m.lay.n_params_true, (float)c.zero_init_residual};
  rec("meta", "", meta, sizeof meta / sizeof meta[0]);
  dt_rng_t r;
  dt_rng_seed(&r, 7);
  char nm[16];
  for (int s = 0; s <= steps; s++) {
    snprintf(nm, sizeof nm, "q%d/", s), rec_arena(&m.lay, nm, p);
    snprintf(nm, sizeof nm, "c%d/", s), rec_arena(&m.bufs, nm, bufs);
    if (s == steps) break;
    for (size_t i = 0; i < nx; i++) x[i] = (float)dt_rng_normal(&r);
    for (int i = 0; i < B; i++) y[i] = (int)(dt_rng_next(&r) % (uint64_t)c.classes), yf[i] = (float)y[i];
    if (s == 0) memcpy(x0, x, nx * sizeof *x), memcpy(y0, y, (size_t)B * sizeof *y);
    snprintf(nm, sizeof nm, "x%d", s), rec(nm, "", x, nx);
    snprintf(nm, sizeof nm, "y%d", s), rec(nm, "", yf, (size_t)B);
    memset(g, 0, np * sizeof *g);
    double l = 0;
    if (dt_cnn_forward(&m, p, bufs, x, y, 1, &l, NULL) || dt_cnn_backward(&m, p, g, 1.0f / (float)B)) {
      fprintf(stderr, "cnn_model_dump: %s\n", dt_err_msg());
      return 1;
    }
    losses[s] = (float)l;
    snprintf(nm, sizeof nm, "g%d/", s), rec_arena(&m.lay, nm, g);
    update(&m.lay, p, g, mo, v, adamw, s + 1);
  }
  rec("losses", "", losses, (size_t)steps);
  int correct = 0;
  double l0 = 0;
  if (dt_cnn_forward(&m, p, bufs, x0, y0, 0, &l0, &correct)) return 1;
  float ev[2] = {(float)l0, (float)correct};
  rec("eval", "", ev, 2);
  /* the predictions' histogram: with every label set to class k, "correct" counts the images
   * predicted as k */
  float *hist = malloc((size_t)c.classes * sizeof *hist);
  for (int k = 0; k < c.classes; k++) {
    for (int i = 0; i < B; i++) y0[i] = k;
    if (dt_cnn_forward(&m, p, bufs, x0, y0, 0, &l0, &correct)) return 1;
    hist[k] = (float)correct;
  }
  rec("pred_hist", "", hist, (size_t)c.classes);
  free(hist);
  dt_cnn_free(&m);
  free(p), free(g), free(mo), free(v), free(bufs), free(x), free(x0), free(yf), free(losses), free(y), free(y0);
  if (fclose(out)) {
    perror(argv[1]);
    return 1;
  }
  return 0;
}
