/* Dump what src/data/images.c makes of an image set, for tests/ref/ref_images.py: the shape, the
 * per-channel mean and standard deviation, the sample ids of global indices 0 .. 2N-1 (two
 * epochs of the shuffled order), one augmented batch at G0 (images, labels, ids, crop offsets and
 * flips) and the first B images in order without augmentation. Records { char name[64]; int64 n;
 * float32 data[n] } (tests/dump.h). On an error: its message, exit 1.
 * Usage: images_dump OUT.bin (idx IMAGES LABELS | cifar GLOB) SEED CROP_PAD FLIP G0 B */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dump.h"
#include "images.h"

static FILE *out;

static void rec(const char *name, const float *x, size_t n) { dump_rec(out, name, x, n); }

int main(int argc, char **argv) {
  int idx = argc == 10 && !strcmp(argv[2], "idx"), cifar = argc == 9 && !strcmp(argv[2], "cifar");
  if (!idx && !cifar) {
    fprintf(stderr, "usage: images_dump OUT.bin (idx IMAGES LABELS | cifar GLOB) SEED CROP_PAD FLIP G0 B\n");
    return 2;
  }
  dt_images_t d;
  dt_status_t st = idx ? dt_images_open_idx(&d, argv[3], argv[4], 10) : dt_images_open_cifar(&d, argv[3], 10);
  if (st != DT_OK) {
    fprintf(stderr, "images_dump: %s\n", dt_err_msg());
    return 1;
  }
  char **a = argv + (idx ? 5 : 4);
  uint64_t seed = strtoull(a[0], NULL, 10), g0 = strtoull(a[3], NULL, 10);
  int pad = atoi(a[1]), flip = atoi(a[2]), B = atoi(a[4]);
  out = fopen(argv[1], "wb");
  if (!out) {
    perror(argv[1]);
    return 1;
  }
  double mean[DT_IMAGES_MAX_C], sd[DT_IMAGES_MAX_C];
  dt_images_stats(&d, mean, sd);
  float meta[4] = {(float)d.n, (float)d.C, (float)d.H, (float)d.W}, fm[DT_IMAGES_MAX_C], fs[DT_IMAGES_MAX_C];
  for (int c = 0; c < d.C; c++) fm[c] = (float)mean[c], fs[c] = (float)sd[c];
  rec("meta", meta, 4), rec("mean", fm, (size_t)d.C), rec("std", fs, (size_t)d.C);
  dt_images_set_norm(&d, mean, sd);
  if (dt_images_set_order(&d, 1, seed) != DT_OK) {
    fprintf(stderr, "images_dump: %s\n", dt_err_msg());
    return 1;
  }
  dt_images_set_augment(&d, pad, flip, seed);
  float *perm = malloc(2 * (size_t)d.n * sizeof *perm);
  for (uint64_t g = 0; g < 2 * (uint64_t)d.n; g++) perm[g] = (float)dt_sampler_at(&d.sampler, g);
  rec("perm", perm, 2 * (size_t)d.n);
  size_t img = (size_t)d.C * d.H * d.W;
  float *x = malloc((size_t)B * img * sizeof *x), *f = malloc((size_t)B * 4 * sizeof *f);
  int *y = malloc((size_t)B * sizeof *y);
  int64_t *ids = malloc((size_t)B * sizeof *ids);
  dt_images_batch(&d, g0, B, x, y, ids);
  for (int b = 0; b < B; b++) {
    int dx, dy, fl;
    dt_images_augment_of(&d, g0 + (uint64_t)b, &dx, &dy, &fl);
    f[4 * b] = (float)ids[b], f[4 * b + 1] = (float)dx, f[4 * b + 2] = (float)dy, f[4 * b + 3] = (float)fl;
  }
  rec("x", x, (size_t)B * img), rec("aug", f, (size_t)B * 4);
  for (int b = 0; b < B; b++) f[b] = (float)y[b];
  rec("y", f, (size_t)B);
  dt_images_batch_sequential(&d, 0, B, x, y);
  rec("xs", x, (size_t)B * img);
  for (int b = 0; b < B; b++) f[b] = (float)y[b];
  rec("ys", f, (size_t)B);
  dt_images_close(&d);
  free(perm), free(x), free(f), free(y), free(ids);
  if (fclose(out)) {
    perror(argv[1]);
    return 1;
  }
  return 0;
}
