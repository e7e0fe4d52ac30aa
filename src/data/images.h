/* Image classification sets in memory (issue #25): the IDX format of MNIST / Fashion-MNIST
 * (images magic 0x00000803: uint8, 3 dimensions n, rows, cols, big-endian; labels magic
 * 0x00000801: n), gzip-compressed or not, and CIFAR-10's binary batches (records of 1 label byte
 * and 3072 pixel bytes: 1024 red, 1024 green, 1024 blue, 32x32 row-major), one or more files.
 *
 * A batch is built like the token shards' (data.h): global sample index g = 0, 1, 2, ... through
 * the epoch permutation of sampler.h, so the data position is one number that does not depend on
 * the data-parallel size and resume continues it. Each image becomes NCHW floats
 * (pixel / 255 - mean[c]) / std[c]; the training set's per-channel mean and standard deviation
 * (dt_images_stats) normalise both sets. Optional augmentation, drawn from (seed, g) alone (so a
 * resumed or re-laid-out run draws the same): a random crop of the image padded by `crop_pad`
 * zero pixels each side (offsets dx, dy uniform in [0, 2 crop_pad]) and a horizontal flip with
 * probability 1/2, torchvision's RandomCrop(size, padding) + RandomHorizontalFlip. */
#ifndef DT_IMAGES_H
#define DT_IMAGES_H

#include <stdint.h>

#include "sampler.h"
#include "status.h"

#define DT_IMAGES_MAX_C 4

typedef struct {
  int n, C, H, W, classes;
  uint8_t *pixels;          /* n x C x H x W */
  uint8_t *labels;          /* n */
  float mean[DT_IMAGES_MAX_C], std[DT_IMAGES_MAX_C]; /* normalisation, per channel (0 and 1 until set) */
  int crop_pad, flip;       /* augmentation (0 and 0: none) */
  uint64_t aug_seed;
  dt_sampler_t sampler;
  char what[256];           /* the file(s), for messages */
} dt_images_t;

/* IDX images and labels files (gzip or plain). Labels must be below `classes`. Errors name the
 * file: not found, wrong magic, size that disagrees with the header, counts that differ. */
dt_status_t dt_images_open_idx(dt_images_t *d, const char *images_path, const char *labels_path, int classes);
/* Every CIFAR-10 batch file matching glob_pattern, sorted by name, in that order. */
dt_status_t dt_images_open_cifar(dt_images_t *d, const char *glob_pattern, int classes);
void dt_images_close(dt_images_t *d);

/* Per-channel mean and standard deviation (population, over all pixels of all images) of the
 * set's pixels / 255, accumulated in double. */
void dt_images_stats(const dt_images_t *d, double *mean, double *std);
/* Use mean/std for normalisation (the training set's, for both sets). */
void dt_images_set_norm(dt_images_t *d, const double *mean, const double *std);
/* Shuffle per epoch with seed (sampler.h), or walk the set in order. */
dt_status_t dt_images_set_order(dt_images_t *d, int shuffle, uint64_t seed);
/* Random crop with crop_pad zero pixels each side and/or horizontal flips, drawn from (seed, g). */
void dt_images_set_augment(dt_images_t *d, int crop_pad, int flip, uint64_t seed);
/* The augmentation of global index g: crop offsets (0 <= dx, dy <= 2 crop_pad) and flip. */
void dt_images_augment_of(const dt_images_t *d, uint64_t g, int *dx, int *dy, int *flip);

/* x (B, C, H, W) and y (B) of the samples at global indices g0 .. g0+B-1; ids (B, may be NULL)
 * receives the sample ids. */
void dt_images_batch(dt_images_t *d, uint64_t g0, int B, float *x, int *y, int64_t *ids);
/* Samples first .. first+B-1 in order, no augmentation (evaluation); first + B <= n. */
void dt_images_batch_sequential(const dt_images_t *d, int first, int B, float *x, int *y);

#endif
