/* libFuzzer harness: the checkpoint reader (src/ckpt/ckpt_read.c, dt_ckpt_load and dt_ckpt_find_latest).
 * Structure-aware: at start a valid checkpoint of a small GPT-2 (L=1, C=16, V=40, T=8, with AdamW
 * moments) is written with dt_ckpt_write; every input is a list of edits applied to a copy of it
 * through the HDF5 API (wrong shapes, wrong types, missing or extra datasets and attributes,
 * attributes of another type or size, changed tensor values, a truncated file), then the copy is
 * read as a resume would. The reader must return an error (or DT_OK for an edit it may ignore),
 * never crash, read out of bounds, leak or hang. Byte-level corruption of HDF5's own metadata is
 * not the target: that tests HDF5, and tests/ckpt_faults.sh covers truncation and flipped bytes
 * through dtrain itself. Needs MPI (one rank: singleton MPI_Init) and parallel HDF5 as dtrain is
 * built. */
#include <hdf5.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "model.h"

#define MAX_OBJ 256

static MPI_Comm comm;
static dt_layout_t lay;
static float *arena;           /* params, m, v: 3 x n_params */
static unsigned char *valid;   /* the valid file's bytes */
static size_t valid_size;
static char dir[64], path[96];
static char *obj[MAX_OBJ];     /* paths of the groups and datasets in the valid file */
static int n_obj;
static char *att[MAX_OBJ][2];  /* (object path, attribute name) */
static int n_att;

/* ---- the input as a byte stream ---- */
typedef struct {
  const uint8_t *p;
  size_t n;
} in_t;

static unsigned next(in_t *in) {
  if (!in->n) return 0;
  in->n--;
  return *in->p++;
}

static int64_t next_i64(in_t *in) { /* small values most of the time: near the real ones */
  unsigned k = next(in);
  if (k < 128) return (int64_t)k - 8;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | next(in);
  return (int64_t)v;
}

/* ---- the valid file's structure ---- */
static herr_t on_attr(hid_t loc, const char *name, const H5A_info_t *info, void *op) {
  (void)loc, (void)info;
  if (n_att < MAX_OBJ) att[n_att][0] = strdup(op), att[n_att++][1] = strdup(name);
  return 0;
}

static herr_t on_obj(hid_t root, const char *name, const H5O_info_t *info, void *op) {
  (void)info, (void)op;
  if (n_obj < MAX_OBJ && strcmp(name, ".") != 0) obj[n_obj++] = strdup(name);
  hid_t o = H5Oopen(root, name, H5P_DEFAULT);
  if (o >= 0) {
    H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, on_attr, (void *)name);
    H5Oclose(o);
  }
  return 0;
}

static hid_t pick_type(unsigned k) {
  switch (k % 6) {
  case 0: return H5T_NATIVE_FLOAT;
  case 1: return H5T_NATIVE_DOUBLE;
  case 2: return H5T_NATIVE_INT32;
  case 3: return H5T_NATIVE_INT64;
  case 4: return H5T_NATIVE_UINT8;
  default: return H5T_NATIVE_UINT64;
  }
}

/* A dataspace of rank 0..3 with dimensions from the input (small, or the layout's sizes). */
static hid_t pick_space(in_t *in, hsize_t *count) {
  static const hsize_t sizes[] = {0, 1, 2, 3, 8, 16, 40, 48, 64, 128};
  int rank = (int)(next(in) % 4);
  hsize_t d[3];
  *count = 1;
  for (int i = 0; i < rank; i++) d[i] = sizes[next(in) % 10], *count *= d[i];
  return rank ? H5Screate_simple(rank, d, NULL) : H5Screate(H5S_SCALAR);
}

/* Write count elements of type t from the input's bytes (repeated when they run out). */
static void write_bytes(hid_t id, hid_t t, hsize_t count, in_t *in, int is_attr) {
  size_t bytes = (size_t)count * H5Tget_size(t);
  unsigned char *b = malloc(bytes ? bytes : 1);
  if (!b) return;
  for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)next(in);
  if (is_attr) H5Awrite(id, t, b);
  else H5Dwrite(id, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, b);
  free(b);
}

/* A string attribute (the reader has some: format, version, ini): fixed or variable length. */
static void string_attr(hid_t o, const char *name, in_t *in) {
  char s[32];
  int n = (int)(next(in) % sizeof s);
  for (int i = 0; i < n; i++) s[i] = (char)(next(in) | 1);
  s[n] = 0;
  hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
  int vl = next(in) & 1;
  H5Tset_size(t, vl ? H5T_VARIABLE : (size_t)(n ? n : 1));
  hid_t a = H5Acreate2(o, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    const char *p = s;
    H5Awrite(a, t, vl ? (const void *)&p : (const void *)s);
    H5Aclose(a);
  }
  H5Sclose(sp);
  H5Tclose(t);
}

/* ---- the edits ---- */
static void edit_attr(hid_t f, in_t *in, int replace) {
  if (!n_att) return;
  int k = (int)(next(in) % (unsigned)n_att);
  hid_t o = H5Oopen(f, att[k][0], H5P_DEFAULT);
  if (o < 0) return;
  const char *name = att[k][1];
  if (H5Aexists(o, name) > 0) H5Adelete(o, name);
  if (replace) {
    unsigned how = next(in) % 3;
    if (how == 0) string_attr(o, name, in);
    else {
      hsize_t count;
      hid_t t = pick_type(next(in)), sp = how == 1 ? H5Screate(H5S_SCALAR) : pick_space(in, &count);
      if (how == 1) count = 1;
      hid_t a = H5Acreate2(o, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
      if (a >= 0) {
        if (how == 1 && t == H5T_NATIVE_INT64) {
          int64_t v = next_i64(in);
          H5Awrite(a, t, &v);
        } else write_bytes(a, t, count, in, 1);
        H5Aclose(a);
      }
      H5Sclose(sp);
    }
  }
  H5Oclose(o);
}

/* Replace object k by a dataset of another type and shape (or just delete it). */
static void edit_obj(hid_t f, in_t *in, int replace) {
  if (!n_obj) return;
  const char *name = obj[next(in) % (unsigned)n_obj];
  if (H5Lexists(f, name, H5P_DEFAULT) <= 0) return;
  if (H5Ldelete(f, name, H5P_DEFAULT) < 0 || !replace) return;
  hsize_t count;
  hid_t t = pick_type(next(in)), sp = pick_space(in, &count);
  hid_t d = H5Dcreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (d >= 0) {
    write_bytes(d, t, count, in, 0);
    H5Dclose(d);
  }
  H5Sclose(sp);
}

/* Overwrite a few bytes of a numeric dataset in place (type and shape kept): NaN, inf, anything. */
static void edit_values(hid_t f, in_t *in) {
  if (!n_obj) return;
  hid_t d = H5Dopen2(f, obj[next(in) % (unsigned)n_obj], H5P_DEFAULT);
  if (d < 0) return;
  hid_t ft = H5Dget_type(d), sp = H5Dget_space(d);
  H5T_class_t cls = H5Tget_class(ft);
  hssize_t n = H5Sget_simple_extent_npoints(sp);
  size_t sz = H5Tget_size(ft), bytes = n > 0 ? (size_t)n * sz : 0;
  if ((cls == H5T_FLOAT || cls == H5T_INTEGER) && bytes > 0 && bytes < (1u << 24)) {
    hid_t mt = H5Tget_native_type(ft, H5T_DIR_DEFAULT);
    unsigned char *b = malloc(bytes);
    if (b && H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, b) >= 0) {
      size_t at = next(in) * 257u % bytes;
      for (size_t i = 0; i < 4 && at + i < bytes; i++) b[at + i] = (unsigned char)next(in);
      H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, b);
    }
    free(b);
    H5Tclose(mt);
  }
  H5Tclose(ft);
  H5Sclose(sp);
  H5Dclose(d);
}

static void edit_file(in_t *in, size_t *truncate_at) {
  FILE *w = fopen(path, "wb");
  if (!w) abort();
  fwrite(valid, 1, valid_size, w);
  fclose(w);
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) abort();
  *truncate_at = 0;
  for (int k = 0; k < 8 && in->n; k++) {
    switch (next(in) % 7) {
    case 0: edit_obj(f, in, 0); break;
    case 1: edit_obj(f, in, 1); break;
    case 2: edit_attr(f, in, 0); break;
    case 3: case 4: edit_attr(f, in, 1); break;
    case 5: edit_values(f, in); break;
    case 6: *truncate_at = 1 + (size_t)next(in) * 257u % valid_size; break;
    }
  }
  H5Fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  MPI_Init(argc, argv);
  MPI_Comm_dup(MPI_COMM_SELF, &comm);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* the edits' expected HDF5 errors are not news */
  snprintf(dir, sizeof dir, "/tmp/dtrain-fuzz-ckpt-%d", (int)getpid());
  snprintf(path, sizeof path, "%s/ckpt_00000007.h5", dir);
  dt_dims_t d = {.L = 1, .NH = 2, .C = 16, .V = 40, .Vp = 128, .T = 8};
  if (dt_layout_init(&lay, d) != DT_OK || !(arena = calloc(3 * lay.n_params, sizeof(float)))) abort();
  for (size_t i = 0; i < 3 * lay.n_params; i++) arena[i] = (float)(i % 97) / 97.0f - 0.5f;
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(arena, arena + lay.n_params, arena + 2 * lay.n_params);
  dt_ckpt_state_t st = {.step = 7, .tokens = 7 * 64, .data_pos = 56, .seed = 1234, .n_rng = 2, .rng = {1, 2},
                        .loss_scale = 1, .dp = 1, .tp = 1, .pp = 1, .ini = "[model]\nn_layer = 1\n"};
  char cmd[96];
  snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
  if (system(cmd) != 0 || dt_ckpt_write(&comm, path, &lay, &a, &st) != DT_OK) abort();
  FILE *f = fopen(path, "rb");
  if (!f || fseek(f, 0, SEEK_END) != 0) abort();
  valid_size = (size_t)ftell(f);
  rewind(f);
  if (!(valid = malloc(valid_size)) || fread(valid, 1, valid_size, f) != valid_size) abort();
  fclose(f);
  hid_t h = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (h < 0) abort();
  H5Ovisit2(h, H5_INDEX_NAME, H5_ITER_NATIVE, on_obj, NULL, H5O_INFO_BASIC);
  H5Aiterate2(h, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, on_attr, (void *)".");
  H5Fclose(h);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  in_t in = {data, size};
  size_t cut = 0;
  edit_file(&in, &cut);
  if (cut && truncate(path, (off_t)cut) != 0) abort();
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(arena, arena + lay.n_params, arena + 2 * lay.n_params);
  dt_ckpt_state_t st;
  memset(&st, 0, sizeof st);
  if (dt_ckpt_load(&comm, path, &lay, &a, &st) == DT_OK) dt_ckpt_state_free(&st);
  char found[256];
  int64_t step = 0;
  (void)dt_ckpt_find_latest(&comm, dir, -1, found, sizeof found, &step);
  return 0;
}
