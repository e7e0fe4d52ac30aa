/* The record files the dump programs (tests/ref_dump.c, cnn_dump.c, cnn_model_dump.c, images_dump.c)
 * (tests/ref/dump.py reads them): records of { char name[64]; int64 n; float32 data[n] }. */
#ifndef DT_TESTS_DUMP_H
#define DT_TESTS_DUMP_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline void dump_rec(FILE *out, const char *name, const float *x, size_t n) {
  char nm[64] = {0};
  size_t l = strlen(name);
  memcpy(nm, name, l < sizeof nm - 1 ? l : sizeof nm - 1); /* longer names are cut at 63 bytes */
  int64_t n64 = (int64_t)n;
  fwrite(nm, 1, sizeof nm, out);
  fwrite(&n64, sizeof n64, 1, out);
  fwrite(x, sizeof(float), n, out);
}

#endif
