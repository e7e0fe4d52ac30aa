/* The record files the dump programs (tests/*_dump.c) write for the Python references
 * (tests/ref/dump.py reads them): records of { char name[64]; int64 n; float32 data[n] }. */
#ifndef DT_TESTS_DUMP_H
#define DT_TESTS_DUMP_H

#include <stdint.h>
#include <stdio.h>

static inline void dump_rec(FILE *out, const char *name, const float *x, size_t n) {
  char nm[64] = {0};
  snprintf(nm, sizeof nm, "%s", name);
  int64_t n64 = (int64_t)n;
  fwrite(nm, 1, sizeof nm, out);
  fwrite(&n64, sizeof n64, 1, out);
  fwrite(x, sizeof(float), n, out);
}

#endif
