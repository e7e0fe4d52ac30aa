/* Image classification sets (formats and semantics: images.h). Files are read whole through
 * zlib's gzread, which also reads uncompressed files. */
#include "images.h"

#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u
#define CIFAR_RECORD 3073

/* The whole (decompressed) content of path into a new buffer. */
static dt_status_t read_all(const char *path, uint8_t **out, size_t *len) {
  gzFile f = gzopen(path, "rb");
  if (!f) return DT_ERR(DT_ERR_IO, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
  size_t cap = 1 << 20, n = 0;
  uint8_t *buf = malloc(cap);
  for (;;) {
    if (!buf) {
      gzclose(f);
      return DT_ERR(DT_ERR_NOMEM, "%s: out of memory reading it", path);
    }
    int got = gzread(f, buf + n, (unsigned)(cap - n < (1u << 30) ? cap - n : (1u << 30)));
    if (got < 0) {
      int e;
      const char *msg = gzerror(f, &e);
      dt_status_t st = DT_ERR(DT_ERR_IO, "%s: read error: %s", path, e == Z_ERRNO ? strerror(errno) : msg);
      free(buf);
      gzclose(f);
      return st;
    }
    if (got == 0) break;
    n += (size_t)got;
    if (n == cap) {
      uint8_t *b = realloc(buf, cap *= 2);
      if (!b) free(buf);
      buf = b;
    }
  }
  gzclose(f);
  *out = buf;
  *len = n;
  return DT_OK;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static dt_status_t check_labels(const dt_images_t *d, const char *path) {
  for (int i = 0; i < d->n; i++)
    if (d->labels[i] >= d->classes)
      return DT_ERR(DT_ERR_DATA, "%s: label %d of image %d is not below model.classes = %d", path, d->labels[i], i,
                    d->classes);
  return DT_OK;
}

static void init(dt_images_t *d, int classes) {
  memset(d, 0, sizeof *d);
  d->classes = classes;
  for (int c = 0; c < DT_IMAGES_MAX_C; c++) d->std[c] = 1.0f;
}

static dt_status_t open_idx(dt_images_t *d, const char *ip, const char *lp) {
  uint8_t *img = NULL, *lab = NULL;
  size_t ni = 0, nl = 0;
  dt_status_t st = read_all(ip, &img, &ni);
  if (st == DT_OK) st = read_all(lp, &lab, &nl);
  if (st != DT_OK) goto out;
  if (ni < 16 || be32(img) != IDX_IMAGES_MAGIC) {
    st = DT_ERR(DT_ERR_DATA, "%s: not an IDX images file (magic 0x%08x, want 0x%08x)", ip, ni >= 4 ? be32(img) : 0,
                IDX_IMAGES_MAGIC);
    goto out;
  }
  uint32_t n = be32(img + 4), h = be32(img + 8), w = be32(img + 12);
  if (n == 0 || n > INT32_MAX || h == 0 || w == 0 || h > 4096 || w > 4096 || ni != 16 + (size_t)n * h * w) {
    st = DT_ERR(DT_ERR_DATA, "%s: %zu bytes, but its header says %u images of %ux%u (%zu bytes)", ip, ni, n, h, w,
                16 + (size_t)n * h * w);
    goto out;
  }
  if (nl < 8 || be32(lab) != IDX_LABELS_MAGIC || be32(lab + 4) != n || nl != 8 + (size_t)n) {
    st = DT_ERR(DT_ERR_DATA, "%s: not the IDX labels of the %u images of %s (magic 0x%08x, %u labels, %zu bytes)", lp, n,
                ip, nl >= 4 ? be32(lab) : 0, nl >= 8 ? be32(lab + 4) : 0, nl);
    goto out;
  }
  d->n = (int)n, d->C = 1, d->H = (int)h, d->W = (int)w;
  memmove(img, img + 16, ni - 16);
  memmove(lab, lab + 8, nl - 8);
  d->pixels = img, d->labels = lab;
  img = lab = NULL;
  st = check_labels(d, lp);
out:
  free(img);
  free(lab);
  return st;
}

dt_status_t dt_images_open_idx(dt_images_t *d, const char *images_path, const char *labels_path, int classes) {
  init(d, classes);
  snprintf(d->what, sizeof d->what, "%s", images_path);
  dt_status_t st = open_idx(d, images_path, labels_path);
  if (st == DT_OK) st = dt_sampler_init(&d->sampler, (uint64_t)d->n, 0, 0, images_path);
  if (st != DT_OK) dt_images_close(d);
  return st;
}

/* Append one CIFAR-10 batch file's records. */
static dt_status_t add_cifar(dt_images_t *d, const char *path) {
  uint8_t *buf;
  size_t len;
  DT_TRY(read_all(path, &buf, &len));
  size_t k = len / CIFAR_RECORD;
  dt_status_t st = DT_OK;
  if (len == 0 || len % CIFAR_RECORD || (size_t)d->n + k > INT32_MAX) {
    st = DT_ERR(DT_ERR_DATA, "%s: %zu bytes is not a whole number of CIFAR-10 records (%d bytes each)", path, len,
                CIFAR_RECORD);
  } else {
    uint8_t *p = realloc(d->pixels, ((size_t)d->n + k) * (CIFAR_RECORD - 1)), *l = NULL;
    if (p) d->pixels = p;
    if (p) l = realloc(d->labels, (size_t)d->n + k);
    if (l) d->labels = l;
    if (!p || !l) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; st == DT_OK && i < k; i++) {
      d->labels[(size_t)d->n + i] = buf[i * CIFAR_RECORD];
      memcpy(d->pixels + ((size_t)d->n + i) * (CIFAR_RECORD - 1), buf + i * CIFAR_RECORD + 1, CIFAR_RECORD - 1);
    }
    if (st == DT_OK) d->n += (int)k;
  }
  free(buf);
  return st;
}

dt_status_t dt_images_open_cifar(dt_images_t *d, const char *glob_pattern, int classes) {
  init(d, classes);
  snprintf(d->what, sizeof d->what, "%s", glob_pattern);
  d->C = 3, d->H = 32, d->W = 32;
  glob_t g;
  int rc = glob(glob_pattern, 0, NULL, &g);
  if (rc != 0) {
    if (rc != GLOB_NOMATCH) globfree(&g);
    return DT_ERR(DT_ERR_IO, "%s: no CIFAR-10 batch file matches", glob_pattern);
  }
  dt_status_t st = DT_OK;
  for (size_t i = 0; st == DT_OK && i < g.gl_pathc; i++) {
    int n0 = d->n;
    st = add_cifar(d, g.gl_pathv[i]);
    for (int j = n0; st == DT_OK && j < d->n; j++)
      if (d->labels[j] >= classes)
        st = DT_ERR(DT_ERR_DATA, "%s: label %d of record %d is not below model.classes = %d", g.gl_pathv[i],
                    d->labels[j], j - n0, classes);
  }
  globfree(&g);
  if (st == DT_OK) st = dt_sampler_init(&d->sampler, (uint64_t)d->n, 0, 0, glob_pattern);
  if (st != DT_OK) dt_images_close(d);
  return st;
}

void dt_images_close(dt_images_t *d) {
  free(d->pixels);
  free(d->labels);
  dt_sampler_free(&d->sampler);
  d->pixels = d->labels = NULL;
  d->n = 0;
}

void dt_images_stats(const dt_images_t *d, double *mean, double *std) {
  const size_t hw = (size_t)d->H * d->W;
  for (int c = 0; c < d->C; c++) { /* a histogram of the 256 values: exact sums */
    uint64_t hist[256] = {0};
    for (int i = 0; i < d->n; i++) {
      const uint8_t *p = d->pixels + ((size_t)i * d->C + c) * hw;
      for (size_t k = 0; k < hw; k++) hist[p[k]]++;
    }
    double n = (double)d->n * (double)hw, s = 0, s2 = 0;
    for (int v = 0; v < 256; v++) s += (double)hist[v] * (v / 255.0);
    mean[c] = s / n;
    for (int v = 0; v < 256; v++) s2 += (double)hist[v] * (v / 255.0 - mean[c]) * (v / 255.0 - mean[c]);
    std[c] = sqrt(s2 / n);
  }
}

void dt_images_set_norm(dt_images_t *d, const double *mean, const double *std) {
  for (int c = 0; c < d->C; c++) d->mean[c] = (float)mean[c], d->std[c] = (float)std[c];
}

dt_status_t dt_images_set_order(dt_images_t *d, int shuffle, uint64_t seed) {
  dt_sampler_free(&d->sampler);
  return dt_sampler_init(&d->sampler, (uint64_t)d->n, shuffle, seed, d->what);
}

void dt_images_set_augment(dt_images_t *d, int crop_pad, int flip, uint64_t seed) {
  d->crop_pad = crop_pad, d->flip = flip != 0, d->aug_seed = seed;
}

void dt_images_augment_of(const dt_images_t *d, uint64_t g, int *dx, int *dy, int *flip) {
  uint64_t a = d->aug_seed ^ 0x61756700ull, b = g; /* "aug": not the sampler's stream */
  uint64_t state = dt_splitmix64(&a) ^ dt_splitmix64(&b);
  *dx = *dy = d->crop_pad;
  if (d->crop_pad > 0) {
    *dx = (int)dt_rand_below(&state, (uint64_t)(2 * d->crop_pad + 1));
    *dy = (int)dt_rand_below(&state, (uint64_t)(2 * d->crop_pad + 1));
  }
  *flip = d->flip ? (int)(dt_splitmix64(&state) >> 63) : 0;
}

/* Image s of the set into x (C, H, W), cropped at (dx, dy) of the padded image and flipped. */
static void one_image(const dt_images_t *d, int64_t s, int dx, int dy, int flip, float *x) {
  const int H = d->H, W = d->W, p = d->crop_pad;
  for (int c = 0; c < d->C; c++) {
    float lut[256];
    for (int v = 0; v < 256; v++) lut[v] = ((float)v / 255.0f - d->mean[c]) / d->std[c];
    const uint8_t *src = d->pixels + ((size_t)s * d->C + c) * H * W;
    float *dst = x + (size_t)c * H * W;
    for (int y = 0; y < H; y++) {
      int sy = y + dy - p;
      for (int xx = 0; xx < W; xx++) {
        int sx = (flip ? W - 1 - xx : xx) + dx - p;
        dst[y * W + xx] = sy >= 0 && sy < H && sx >= 0 && sx < W ? lut[src[sy * W + sx]] : lut[0];
      }
    }
  }
}

void dt_images_batch(dt_images_t *d, uint64_t g0, int B, float *x, int *y, int64_t *ids) {
  const size_t img = (size_t)d->C * d->H * d->W;
  for (int b = 0; b < B; b++) {
    uint64_t g = g0 + (uint64_t)b;
    int64_t s = (int64_t)dt_sampler_at(&d->sampler, g);
    int dx, dy, flip;
    dt_images_augment_of(d, g, &dx, &dy, &flip);
    one_image(d, s, dx, dy, flip, x + (size_t)b * img);
    y[b] = d->labels[s];
    if (ids) ids[b] = s;
  }
}

void dt_images_batch_sequential(const dt_images_t *d, int first, int B, float *x, int *y) {
  const size_t img = (size_t)d->C * d->H * d->W;
  for (int b = 0; b < B; b++) {
    one_image(d, first + b, d->crop_pad, d->crop_pad, 0, x + (size_t)b * img);
    y[b] = d->labels[first + b];
  }
}
