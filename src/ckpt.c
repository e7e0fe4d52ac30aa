/* Checkpoint file contents: collective parallel-HDF5 write and read of /model, /optim and
 * /state (docs/checkpoint-format.md). Tensors move between our (out, in) arenas and the
 * Hugging Face file layout box by box; each dataset's CRC32C is combined from per-rank parts. */
#include "ckpt.h"

#include <hdf5.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"
#include "crc32c.h"
#include "dt_build.h"

#define N_GROUPS 3 /* /model, /optim/exp_avg, /optim/exp_avg_sq */
static const char *group_path[N_GROUPS] = {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"};

/* ---- shared helpers ---------------------------------------------------------------------- */

static const char *fault_phase;
static int fault_rank = -1;

void dt_ckpt__fault(int rank, const char *phase) {
  fault_rank = rank;
  fault_phase = phase;
}

int dt_ckpt__faulty(MPI_Comm comm, const char *phase) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  return fault_phase && rank == fault_rank && strcmp(fault_phase, phase) == 0;
}

MPI_Comm dt_ckpt__comm(const void *mpi_comm) { return mpi_comm ? *(const MPI_Comm *)mpi_comm : MPI_COMM_WORLD; }

dt_status_t dt_ckpt__agree(MPI_Comm comm, dt_status_t st) {
  int rank, mine, first;
  MPI_Comm_rank(comm, &rank);
  mine = st != DT_OK ? rank : INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT_MAX) return DT_OK;
  struct { int st; char msg[960]; } m;
  memset(&m, 0, sizeof m);
  if (rank == first) {
    m.st = st;
    snprintf(m.msg, sizeof m.msg, "%s", dt_err_msg());
  }
  MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, first, comm);
  if (rank != first) DT_ERR((dt_status_t)m.st, "rank %d: %s", first, m.msg);
  return (dt_status_t)m.st;
}

static herr_t h5walk(unsigned n, const H5E_error2_t *e, void *data) {
  char **s = data; /* s[0] innermost, s[1] outermost */
  if (n == 0) snprintf(s[0], 256, "%s", e->desc ? e->desc : "");
  snprintf(s[1], 256, "%s", e->desc ? e->desc : "");
  return 0;
}

const char *dt_ckpt__h5msg(char *buf, size_t n) {
  char inner[256] = "", outer[256] = "";
  char *s[2] = {inner, outer};
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5walk, s);
  H5Eclear2(H5E_DEFAULT);
  if (strcmp(inner, outer) == 0) snprintf(buf, n, "%s", inner[0] ? inner : "unknown HDF5 error");
  else snprintf(buf, n, "%s: %s", outer, inner);
  return buf;
}

void dt_ckpt__h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* Record an HDF5 failure about object `obj` of file `path`. */
static dt_status_t h5err(const char *path, const char *obj, const char *what) {
  char m[600];
  return DT_ERR(DT_ERR_HDF5, "%s: %s: %s (HDF5: %s)", path, obj, what, dt_ckpt__h5msg(m, sizeof m));
}

/* ---- ranges ------------------------------------------------------------------------------ */

static int is_wte(const dt_tensor_t *t) { return strcmp(t->name, "wte.weight") == 0; }
/* Rows of the global tensor in our layout as far as the file is concerned (wte: true V). */
static int hf_rows(const dt_layout_t *lay, const dt_tensor_t *t) { return is_wte(t) ? lay->d.V : t->rows; }

/* File shape: 1-D (cols); 2-D (rows, cols) or transposed. Returns ndim. */
static int file_shape(const dt_layout_t *lay, const dt_tensor_t *t, hsize_t dims[2]) {
  if (t->ndim == 1) {
    dims[0] = (hsize_t)t->cols;
    dims[1] = 1;
    return 1;
  }
  dims[0] = (hsize_t)(t->hf_transpose ? t->cols : hf_rows(lay, t));
  dims[1] = (hsize_t)(t->hf_transpose ? hf_rows(lay, t) : t->cols);
  return 2;
}

dt_ckpt_arenas_t dt_ckpt_arenas_full(float *params, float *m, float *v) {
  dt_ckpt_arenas_t a;
  memset(&a, 0, sizeof a);
  a.params = params, a.m = m, a.v = v;
  a.model.full = a.optim.full = 1;
  return a;
}

dt_status_t dt_ckpt_ranges_add(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, dt_ckpt_range_t r) {
  if (r.tensor < 0 || r.tensor >= lay->n_tensors)
    return DT_ERR(DT_ERR_ARG, "checkpoint range: tensor index %d out of [0, %d)", r.tensor, lay->n_tensors);
  const dt_tensor_t *t = &lay->tensors[r.tensor];
  if (r.row0 < 0 || r.row0 >= r.row1 || r.row1 > hf_rows(lay, t) || r.col0 < 0 || r.col0 >= r.col1 ||
      r.col1 > t->cols || r.ld < (size_t)(r.col1 - r.col0))
    return DT_ERR(DT_ERR_ARG, "checkpoint range: %s: box rows [%d,%d) cols [%d,%d) ld %zu outside (%d, %d)",
                  t->name, r.row0, r.row1, r.col0, r.col1, r.ld, hf_rows(lay, t), t->cols);
  dt_ckpt_range_t *nr = realloc(rs->r, (size_t)(rs->n + 1) * sizeof *nr);
  if (!nr) return DT_ERR(DT_ERR_NOMEM, "checkpoint ranges: out of memory");
  rs->r = nr;
  rs->r[rs->n++] = r;
  rs->full = 0;
  return DT_OK;
}

dt_status_t dt_ckpt_ranges_add_flat(dt_ckpt_ranges_t *rs, const dt_layout_t *lay, size_t begin, size_t end) {
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    size_t cols = (size_t)t->cols, n = (size_t)hf_rows(lay, t) * cols;
    size_t lo = begin > t->offset ? begin - t->offset : 0, hi = end > t->offset ? end - t->offset : 0;
    if (hi > n) hi = n;
    while (lo < hi) { /* partial first row, full rows, partial last row */
      size_t r = lo / cols, c = lo % cols, stop;
      dt_ckpt_range_t b = {.tensor = i, .row0 = (int)r, .col0 = (int)c, .ld = cols};
      if (c != 0 || hi - lo < cols) { /* within one row */
        stop = (r + 1) * cols < hi ? (r + 1) * cols : hi;
        b.row1 = (int)r + 1, b.col1 = (int)(c + (stop - lo));
      } else {
        stop = hi / cols * cols;
        b.row1 = (int)(stop / cols), b.col1 = (int)cols;
      }
      b.off = t->offset + lo - begin;
      DT_TRY(dt_ckpt_ranges_add(rs, lay, b));
      lo = stop;
    }
  }
  return DT_OK;
}

void dt_ckpt_ranges_free(dt_ckpt_ranges_t *rs) {
  free(rs->r);
  rs->r = NULL;
  rs->n = 0;
}

/* Whole tensors (load into full arenas) or this rank's 1/P of each tensor's first file
 * dimension (save from full arenas; contiguous in the file). */
static dt_status_t ranges_resolve(const dt_layout_t *lay, const dt_ckpt_ranges_t *in, int split, int rank, int size,
                                  dt_ckpt_ranges_t *out) {
  memset(out, 0, sizeof *out);
  if (!in->full) {
    for (int i = 0; i < in->n; i++) DT_TRY(dt_ckpt_ranges_add(out, lay, in->r[i]));
    return DT_OK;
  }
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    int rows = hf_rows(lay, t), cols = t->cols;
    dt_ckpt_range_t b = {.tensor = i, .row0 = 0, .row1 = rows, .col0 = 0, .col1 = cols, .ld = (size_t)cols};
    if (split) {
      int tr = t->ndim == 2 && t->hf_transpose; /* first file dim is our cols */
      int n = t->ndim == 1 || tr ? cols : rows;
      int a = (int)((long long)n * rank / size), z = (int)((long long)n * (rank + 1) / size);
      if (a == z) continue;
      if (t->ndim == 1 || tr) b.col0 = a, b.col1 = z;
      else b.row0 = a, b.row1 = z;
    }
    b.off = t->offset + (size_t)b.row0 * (size_t)cols + (size_t)b.col0;
    DT_TRY(dt_ckpt_ranges_add(out, lay, b));
  }
  return DT_OK;
}

/* A box in file coordinates: rows [r0, r1) x cols [c0, c1) of the (possibly transposed) tensor. */
typedef struct { hsize_t r0, r1, c0, c1; const dt_ckpt_range_t *src; } fbox_t;

static fbox_t to_file(const dt_tensor_t *t, const dt_ckpt_range_t *r) {
  fbox_t b = {(hsize_t)r->row0, (hsize_t)r->row1, (hsize_t)r->col0, (hsize_t)r->col1, r};
  if (t->ndim == 2 && t->hf_transpose) b = (fbox_t){(hsize_t)r->col0, (hsize_t)r->col1, (hsize_t)r->row0, (hsize_t)r->row1, r};
  return b;
}

static int fbox_cmp(const void *a, const void *b) {
  const fbox_t *x = a, *y = b;
  return x->c0 < y->c0 ? -1 : x->c0 > y->c0;
}

/* Local float for file element (i, j) of box b. */
static size_t local_index(const dt_tensor_t *t, const fbox_t *b, hsize_t i, hsize_t j) {
  const dt_ckpt_range_t *r = b->src;
  size_t rr = t->ndim == 2 && t->hf_transpose ? j : i, cc = t->ndim == 2 && t->hf_transpose ? i : j;
  return r->off + (rr - (size_t)r->row0) * r->ld + (cc - (size_t)r->col0);
}

/* Per-rank CRC of a contiguous byte run of a dataset, combined on rank 0. */
typedef struct { uint64_t ds, off, len; uint32_t crc, pad; } seg_t;

typedef struct {
  seg_t *s;
  size_t n, cap;
} segs_t;

static dt_status_t segs_add(segs_t *g, uint64_t ds, uint64_t off, const void *data, uint64_t len) {
  if (g->n && g->s[g->n - 1].ds == ds && g->s[g->n - 1].off + g->s[g->n - 1].len == off) {
    seg_t *l = &g->s[g->n - 1]; /* continues the previous run: extend its CRC */
    l->crc = dt_crc32c(l->crc, data, len);
    l->len += len;
    return DT_OK;
  }
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 256;
    seg_t *s = realloc(g->s, cap * sizeof *s);
    if (!s) return DT_ERR(DT_ERR_NOMEM, "checkpoint: out of memory (checksum segments)");
    g->s = s, g->cap = cap;
  }
  g->s[g->n++] = (seg_t){ds, off, len, dt_crc32c(0, data, len), 0};
  return DT_OK;
}

static int seg_cmp(const void *a, const void *b) {
  const seg_t *x = a, *y = b;
  if (x->ds != y->ds) return x->ds < y->ds ? -1 : 1;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* ---- HDF5 attribute helpers -------------------------------------------------------------- */

static herr_t attr_put(hid_t loc, const char *name, hid_t ftype, hid_t mtype, const void *val) {
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t e = a < 0 ? -1 : H5Awrite(a, mtype, val);
  if (a >= 0) H5Aclose(a);
  H5Sclose(sp);
  return e;
}

static herr_t attr_get(hid_t loc, const char *name, hid_t mtype, void *val) {
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  herr_t e = a < 0 ? -1 : H5Aread(a, mtype, val);
  if (a >= 0) H5Aclose(a);
  return e;
}

static herr_t attr_put_str(hid_t loc, const char *name, const char *s) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, strlen(s) + 1);
  H5Tset_strpad(t, H5T_STR_NULLTERM);
  herr_t e = attr_put(loc, name, t, t, s);
  H5Tclose(t);
  return e;
}

static herr_t attr_get_str(hid_t loc, const char *name, char *buf, size_t n) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, n);
  H5Tset_strpad(t, H5T_STR_NULLTERM);
  herr_t e = attr_get(loc, name, t, buf);
  H5Tclose(t);
  buf[n - 1] = '\0';
  return e;
}

/* ---- file-space helpers ------------------------------------------------------------------- */

typedef struct {
  int ndim;
  hsize_t dims[2];
  hsize_t FR, FC; /* file matrix view: 2-D dims, or (1, n) for 1-D */
} fshape_t;

static fshape_t fshape(const dt_layout_t *lay, const dt_tensor_t *t) {
  fshape_t f;
  f.ndim = file_shape(lay, t, f.dims);
  f.FR = f.ndim == 2 ? f.dims[0] : 1;
  f.FC = f.ndim == 2 ? f.dims[1] : f.dims[0];
  return f;
}

/* Select file box b (in the (FR, FC) view) in space sp, SET or OR. */
static herr_t select_box(hid_t sp, const fshape_t *f, const fbox_t *b, H5S_seloper_t op) {
  hsize_t start[2] = {b->r0, b->c0}, count[2] = {b->r1 - b->r0, b->c1 - b->c0};
  if (f->ndim == 1) start[0] = b->c0, count[0] = b->c1 - b->c0;
  return H5Sselect_hyperslab(sp, op, start, NULL, count, NULL);
}

/* This rank's share [*a, *z) of the first file dimension when P ranks split it evenly. */
static void split_first(const fshape_t *f, int rank, int size, hsize_t *a, hsize_t *z) {
  hsize_t n = f->dims[0];
  *a = n * (hsize_t)rank / (hsize_t)size;
  *z = n * (hsize_t)(rank + 1) / (hsize_t)size;
}

/* Boxes of ranges rs that belong to tensor ti, as file boxes sorted by first column. */
static int boxes_of(const dt_layout_t *lay, const dt_ckpt_ranges_t *rs, int ti, fbox_t *out) {
  int n = 0;
  for (int i = 0; i < rs->n; i++)
    if (rs->r[i].tensor == ti) out[n++] = to_file(&lay->tensors[ti], &rs->r[i]);
  qsort(out, (size_t)n, sizeof *out, fbox_cmp);
  return n;
}

static size_t max_tensor(const dt_layout_t *lay) {
  size_t m = 1;
  for (int i = 0; i < lay->n_tensors; i++) {
    size_t n = (size_t)hf_rows(lay, &lay->tensors[i]) * (size_t)lay->tensors[i].cols;
    if (n > m) m = n;
  }
  return m;
}

/* Save: boxes of one rank must not overlap (overlaps between ranks are found by the CRC tiling). */
static dt_status_t check_disjoint(const dt_layout_t *lay, const dt_ckpt_ranges_t *rs, const char *what) {
  for (int i = 0; i < rs->n; i++)
    for (int k = i + 1; k < rs->n; k++) {
      const dt_ckpt_range_t *x = &rs->r[i], *y = &rs->r[k];
      if (x->tensor == y->tensor && x->row0 < y->row1 && y->row0 < x->row1 && x->col0 < y->col1 && y->col0 < x->col1)
        return DT_ERR(DT_ERR_ARG, "checkpoint save: %s ranges %d and %d of %s overlap", what, i, k,
                      lay->tensors[x->tensor].name);
    }
  return DT_OK;
}

/* Create a small dataset (rank-0 data; n elements, scalar if n == 0 and scalar != 0) with its CRC. */
static dt_status_t put_small(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int scalar, hsize_t n,
                             const void *data, size_t nbytes, int rank, hid_t dxpl, const char *path) {
  hid_t sp = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, NULL);
  hid_t d = H5Dcreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  herr_t e = d < 0 ? -1 : 0;
  if (e == 0 && (scalar || n > 0)) {
    if (rank != 0) H5Sselect_none(sp);
    e = H5Dwrite(d, mtype, sp, sp, dxpl, data);
  }
  uint32_t crc = dt_crc32c(0, data, nbytes);
  if (e == 0) e = attr_put(d, "crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp);
  return e < 0 ? h5err(path, name, "cannot write state dataset") : DT_OK;
}

/* ---- write -------------------------------------------------------------------------------- */

/* Rank 0's state (and ini text) on every rank. */
static dt_status_t state_bcast(MPI_Comm comm, int rank, const dt_ckpt_state_t *in, dt_ckpt_state_t *s, char **ini) {
  long long n = 0;
  memset(s, 0, sizeof *s);
  if (rank == 0 && in) {
    *s = *in;
    n = in->ini ? (long long)strlen(in->ini) : 0;
  }
  int ok = rank != 0 || in != NULL;
  MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
  MPI_Bcast(s, (int)sizeof *s, MPI_BYTE, 0, comm);
  MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
  s->ini = NULL;
  if (n >= INT_MAX) return DT_ERR(DT_ERR_ARG, "checkpoint save: ini text too long (%lld bytes)", n);
  *ini = malloc((size_t)n + 1);
  if (!*ini) return DT_ERR(DT_ERR_NOMEM, "checkpoint save: out of memory");
  if (rank == 0) memcpy(*ini, n ? in->ini : "", (size_t)n + 1);
  MPI_Bcast(*ini, (int)n + 1, MPI_CHAR, 0, comm);
  if (!ok) return DT_ERR(DT_ERR_ARG, "checkpoint save: rank 0 passed no training state");
  if (s->n_rng < 0 || s->n_rng > DT_CKPT_RNG_MAX)
    return DT_ERR(DT_ERR_ARG, "checkpoint save: n_rng %d outside [0, %d]", s->n_rng, DT_CKPT_RNG_MAX);
  return DT_OK;
}

static dt_status_t write_state(hid_t file, const dt_ckpt_state_t *s, const char *ini, int size, int rank,
                               const dt_layout_t *lay, hid_t dxpl, const char *path) {
  hid_t g = H5Gcreate2(file, "/state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) return h5err(path, "/state", "cannot create group");
  struct { const char *k; const void *v; hid_t ft, mt; } at[] = {
      {"step", &s->step, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"tokens", &s->tokens, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"data_pos", &s->data_pos, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"epoch", &s->epoch, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"seed", &s->seed, H5T_STD_U64LE, H5T_NATIVE_UINT64},
      {"loss_scale", &s->loss_scale, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE},
      {"loss_scale_growth", &s->loss_scale_growth, H5T_STD_I64LE, H5T_NATIVE_INT64},
      {"dp", &s->dp, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"tp", &s->tp, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"pp", &s->pp, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"world", &size, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"n_layer", &lay->d.L, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"n_head", &lay->d.NH, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"n_embd", &lay->d.C, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"vocab_size", &lay->d.V, H5T_STD_I32LE, H5T_NATIVE_INT},
      {"seq_len", &lay->d.T, H5T_STD_I32LE, H5T_NATIVE_INT},
  };
  dt_status_t st = DT_OK;
  for (size_t i = 0; i < sizeof at / sizeof at[0] && st == DT_OK; i++)
    if (attr_put(g, at[i].k, at[i].ft, at[i].mt, at[i].v) < 0) st = h5err(path, "/state", at[i].k);
  if (st == DT_OK)
    st = put_small(g, "rng", H5T_STD_U64LE, H5T_NATIVE_UINT64, 0, (hsize_t)s->n_rng, s->rng,
                   (size_t)s->n_rng * sizeof(uint64_t), rank, dxpl, path);
  if (st == DT_OK) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(ini) + 1);
    H5Tset_strpad(t, H5T_STR_NULLTERM);
    st = put_small(g, "config_ini", t, t, 1, 1, ini, strlen(ini) + 1, rank, dxpl, path);
    H5Tclose(t);
  }
  H5Gclose(g);
  return st;
}

/* Pack this rank's boxes of one tensor in file order, select them, record CRC runs. */
static dt_status_t pack(const dt_tensor_t *t, const fshape_t *f, const fbox_t *bx, int nb, const float *local,
                        float *stage, hid_t fsp, hsize_t *count, segs_t *segs, uint64_t ds) {
  hsize_t k = 0, rmin = (hsize_t)-1, rmax = 0;
  for (int b = 0; b < nb; b++) {
    if (select_box(fsp, f, &bx[b], b == 0 ? H5S_SELECT_SET : H5S_SELECT_OR) < 0)
      return h5err("checkpoint", t->name, "cannot select hyperslab");
    if (bx[b].r0 < rmin) rmin = bx[b].r0;
    if (bx[b].r1 > rmax) rmax = bx[b].r1;
  }
  for (hsize_t i = rmin; nb && i < rmax; i++)
    for (int b = 0; b < nb; b++) {
      const fbox_t *x = &bx[b];
      if (i < x->r0 || i >= x->r1) continue;
      float *dst = stage + k;
      if (t->ndim == 2 && t->hf_transpose) {
        for (hsize_t j = x->c0; j < x->c1; j++) stage[k++] = local[local_index(t, x, i, j)];
      } else {
        memcpy(dst, local + local_index(t, x, i, x->c0), (x->c1 - x->c0) * sizeof(float));
        k += x->c1 - x->c0;
      }
      DT_TRY(segs_add(segs, ds, (i * f->FC + x->c0) * sizeof(float), dst, (x->c1 - x->c0) * sizeof(float)));
    }
  *count = k;
  return DT_OK;
}

/* Rank 0: check that the runs of each dataset tile it exactly, and combine their CRCs. */
static dt_status_t combine(seg_t *all, size_t n, const uint64_t *bytes, const char **names, int n_ds, uint32_t *crc,
                           const char *path) {
  qsort(all, n, sizeof *all, seg_cmp);
  size_t i = 0;
  for (int d = 0; d < n_ds; d++) {
    uint64_t at = 0, op_len = UINT64_MAX;
    uint32_t c = 0, op = 0;
    for (; i < n && all[i].ds == (uint64_t)d; i++) {
      if (all[i].off != at)
        return DT_ERR(DT_ERR_ARG, "%s: %s: the ranks' parts %s at byte %llu", path, names[d],
                      all[i].off < at ? "overlap" : "leave a gap", (unsigned long long)(all[i].off < at ? all[i].off : at));
      if (all[i].len != op_len) op = dt_crc32c_combine_op(op_len = all[i].len);
      c = at == 0 ? all[i].crc : dt_crc32c_combine_with(op, c, all[i].crc);
      at += all[i].len;
    }
    if (at != bytes[d])
      return DT_ERR(DT_ERR_ARG, "%s: %s: the ranks' parts leave a gap at byte %llu of %llu", path, names[d],
                    (unsigned long long)at, (unsigned long long)bytes[d]);
    crc[d] = c;
  }
  return DT_OK;
}

typedef struct {
  int n_ds;
  hid_t *ds;
  char (*names)[96];
  uint64_t *bytes;
} dsets_t;

static dt_status_t dsets_init(dsets_t *D, const dt_layout_t *lay, int groups) {
  D->n_ds = lay->n_tensors * groups;
  D->ds = malloc((size_t)D->n_ds * sizeof *D->ds);
  D->names = malloc((size_t)D->n_ds * sizeof *D->names);
  D->bytes = malloc((size_t)D->n_ds * sizeof *D->bytes);
  if (!D->ds || !D->names || !D->bytes) return DT_ERR(DT_ERR_NOMEM, "checkpoint: out of memory");
  for (int d = 0; d < D->n_ds; d++) {
    const dt_tensor_t *t = &lay->tensors[d % lay->n_tensors];
    fshape_t f = fshape(lay, t);
    D->ds[d] = -1;
    snprintf(D->names[d], sizeof D->names[d], "%s/%s", group_path[d / lay->n_tensors], t->name);
    D->bytes[d] = f.FR * f.FC * sizeof(float);
  }
  return DT_OK;
}

static void dsets_free(dsets_t *D) {
  for (int d = 0; D->ds && d < D->n_ds; d++)
    if (D->ds[d] >= 0) H5Dclose(D->ds[d]);
  free(D->ds);
  free(D->names);
  free(D->bytes);
}

dt_status_t dt_ckpt_write(const void *mpi_comm, const char *path, const dt_layout_t *lay,
                          const dt_ckpt_arenas_t *a, const dt_ckpt_state_t *st_in) {
  MPI_Comm comm = dt_ckpt__comm(mpi_comm);
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  dt_ckpt__h5_quiet();
  dt_ckpt_state_t s;
  char *ini = NULL;
  dt_ckpt_ranges_t rg[2];
  memset(rg, 0, sizeof rg);
  dsets_t D;
  memset(&D, 0, sizeof D);
  hid_t fapl = -1, dxpl = -1, file = -1, g = -1;
  float *stage = NULL;
  segs_t segs = {0};
  seg_t *all = NULL;
  uint32_t *crc = NULL;

  /* Phase 1 (local): state from rank 0, ranges, buffers. */
  dt_status_t st = state_bcast(comm, rank, st_in, &s, &ini);
  int optim = a->m != NULL, omin, omax;
  MPI_Allreduce(&optim, &omin, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(&optim, &omax, 1, MPI_INT, MPI_MAX, comm);
  if (st == DT_OK && omin != omax) st = DT_ERR(DT_ERR_ARG, "%s: some ranks pass AdamW moments, others not", path);
  if (st == DT_OK && (a->m == NULL) != (a->v == NULL)) st = DT_ERR(DT_ERR_ARG, "%s: m and v must both be given", path);
  if (st == DT_OK) st = ranges_resolve(lay, &a->model, 1, rank, size, &rg[0]);
  if (st == DT_OK && optim) st = ranges_resolve(lay, &a->optim, 1, rank, size, &rg[1]);
  if (st == DT_OK) st = check_disjoint(lay, &rg[0], "model");
  if (st == DT_OK && optim) st = check_disjoint(lay, &rg[1], "optim");
  if (st == DT_OK) st = dsets_init(&D, lay, optim ? 3 : 1);
  if (st == DT_OK && !(stage = malloc(max_tensor(lay) * sizeof(float))))
    st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory for the staging buffer", path);
  if (st == DT_OK && dt_ckpt__faulty(comm, "open")) st = DT_ERR(DT_ERR_IO, "%s: simulated open failure (test hook)", path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 2: collective create. */
  fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file < 0) st = h5err(path, "/", "cannot create file");
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 3: groups, root attributes. */
  const char *grps[] = {"/model", "/optim", "/optim/exp_avg", "/optim/exp_avg_sq"};
  int fmt = DT_CKPT_FORMAT_VERSION;
  for (int i = 0; i < (optim ? 4 : 1) && st == DT_OK; i++) {
    if ((g = H5Gcreate2(file, grps[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0) st = h5err(path, grps[i], "cannot create group");
    else H5Gclose(g);
  }
  if (st == DT_OK && (attr_put_str(file, "format", "dtrain-checkpoint") < 0 ||
                      attr_put(file, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT, &fmt) < 0 ||
                      attr_put_str(file, "dtrain_version", PACKAGE_VERSION) < 0))
    st = h5err(path, "/", "cannot write attributes");
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 4: tensors, one collective write each. */
  fbox_t *bx = malloc((size_t)(rg[0].n > rg[1].n ? rg[0].n : rg[1].n) * sizeof *bx + 1);
  if (!bx) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  for (int d = 0; d < D.n_ds; d++) {
    int ti = d % lay->n_tensors, gi = d / lay->n_tensors;
    const dt_tensor_t *t = &lay->tensors[ti];
    const float *local = gi == 0 ? a->params : gi == 1 ? a->m : a->v;
    fshape_t f = fshape(lay, t);
    hid_t fsp = H5Screate_simple(f.ndim, f.dims, NULL), msp = -1;
    D.ds[d] = H5Dcreate2(file, D.names[d], H5T_IEEE_F32LE, fsp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (D.ds[d] < 0) st = h5err(path, D.names[d], "cannot create dataset");
    int nb = boxes_of(lay, &rg[gi ? 1 : 0], ti, bx);
    hsize_t count = 0;
    if (st == DT_OK) st = pack(t, &f, bx, nb, local, stage, fsp, &count, &segs, (uint64_t)d);
    if (st == DT_OK) { /* pack only fails on local problems before the collective: agree first */
      hsize_t mc = count ? count : 1;
      msp = H5Screate_simple(1, &mc, NULL);
      if (!count) H5Sselect_none(msp), H5Sselect_none(fsp);
    }
    st = dt_ckpt__agree(comm, st);
    if (st == DT_OK && H5Dwrite(D.ds[d], H5T_NATIVE_FLOAT, msp, fsp, dxpl, stage) < 0)
      st = h5err(path, D.names[d], "cannot write dataset");
    if (st == DT_OK && dt_ckpt__faulty(comm, "write")) st = DT_ERR(DT_ERR_IO, "%s: %s: simulated write failure (test hook)", path, D.names[d]);
    if (msp >= 0) H5Sclose(msp);
    H5Sclose(fsp);
    if ((st = dt_ckpt__agree(comm, st)) != DT_OK) break;
  }
  H5Pclose(dcpl);
  free(bx);
  if (st != DT_OK) goto out;

  /* Phase 5: CRC runs to rank 0, tiling check and combination, CRCs back to all. */
  int mine = (int)(segs.n * sizeof(seg_t)), *cnt = NULL, *dsp = NULL, total = 0;
  if (rank == 0) cnt = calloc((size_t)size, sizeof *cnt), dsp = calloc((size_t)size, sizeof *dsp);
  MPI_Gather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, 0, comm);
  for (int r = 0; rank == 0 && r < size; r++) dsp[r] = total, total += cnt[r];
  if (rank == 0) all = malloc((size_t)total + 1);
  MPI_Gatherv(segs.s, mine, MPI_BYTE, all, cnt, dsp, MPI_BYTE, 0, comm);
  free(cnt);
  free(dsp);
  crc = calloc((size_t)D.n_ds, sizeof *crc);
  if (!crc) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  if (st == DT_OK && rank == 0) {
    const char **nm = malloc((size_t)D.n_ds * sizeof *nm);
    for (int d = 0; nm && d < D.n_ds; d++) nm[d] = D.names[d];
    st = nm ? combine(all, (size_t)total / sizeof(seg_t), D.bytes, nm, D.n_ds, crc, path)
            : DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
    free(nm);
  }
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  MPI_Bcast(crc, D.n_ds, MPI_UINT32_T, 0, comm);

  /* Phase 6: checksums, training state. */
  for (int d = 0; d < D.n_ds && st == DT_OK; d++)
    if (attr_put(D.ds[d], "crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc[d]) < 0)
      st = h5err(path, D.names[d], "cannot write crc32c attribute");
  if (st == DT_OK) st = write_state(file, &s, ini, size, rank, lay, dxpl, path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 7: everything flushed, then the completion marker. */
  int one = 1;
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) st = h5err(path, "/", "cannot flush");
  else if (attr_put(file, "complete", H5T_STD_I32LE, H5T_NATIVE_INT, &one) < 0)
    st = h5err(path, "/", "cannot write the completion marker");
  st = dt_ckpt__agree(comm, st);

out:
  dsets_free(&D);
  if (file >= 0 && H5Fclose(file) < 0 && st == DT_OK) st = h5err(path, "/", "cannot close file");
  if (file >= 0) st = dt_ckpt__agree(comm, st);
  if (fapl >= 0) H5Pclose(fapl);
  if (dxpl >= 0) H5Pclose(dxpl);
  dt_ckpt_ranges_free(&rg[0]);
  dt_ckpt_ranges_free(&rg[1]);
  free(stage);
  free(segs.s);
  free(all);
  free(crc);
  free(ini);
  return st;
}

/* ---- read --------------------------------------------------------------------------------- */

void dt_ckpt_state_free(dt_ckpt_state_t *st) {
  free((char *)st->ini);
  st->ini = NULL;
}

/* Read a small dataset on every rank into buf (cap bytes) and check its CRC. */
static dt_status_t get_small(hid_t loc, const char *name, hid_t mtype, void *buf, size_t elem, size_t cap,
                             size_t *n_out, hid_t dxpl, const char *path) {
  char obj[64];
  snprintf(obj, sizeof obj, "/state/%s", name);
  hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
  if (d < 0) return h5err(path, obj, "missing dataset");
  hid_t sp = H5Dget_space(d);
  hssize_t n = H5Sget_simple_extent_npoints(sp);
  uint32_t stored = 0;
  dt_status_t st = DT_OK;
  if (n < 0 || (size_t)n * elem > cap) st = DT_ERR(DT_ERR_CKPT, "%s: %s: %lld elements do not fit (max %zu)", path, obj, (long long)n, cap / elem);
  else if (n > 0 && H5Dread(d, mtype, H5S_ALL, H5S_ALL, dxpl, buf) < 0) st = h5err(path, obj, "cannot read");
  else if (attr_get(d, "crc32c", H5T_NATIVE_UINT32, &stored) < 0) st = h5err(path, obj, "no crc32c attribute");
  else if (dt_crc32c(0, buf, (size_t)n * elem) != stored)
    st = DT_ERR(DT_ERR_CKPT, "%s: %s: CRC32C mismatch: stored 0x%08x, data 0x%08x (corrupt file)", path, obj, stored,
                dt_crc32c(0, buf, (size_t)n * elem));
  if (n_out) *n_out = n < 0 ? 0 : (size_t)n;
  H5Sclose(sp);
  H5Dclose(d);
  return st;
}

static dt_status_t read_state(hid_t file, dt_ckpt_state_t *s, const char *path) {
  hid_t g = H5Gopen2(file, "/state", H5P_DEFAULT);
  if (g < 0) return h5err(path, "/state", "missing group");
  struct { const char *k; void *v; hid_t mt; } at[] = {
      {"step", &s->step, H5T_NATIVE_INT64},         {"tokens", &s->tokens, H5T_NATIVE_INT64},
      {"data_pos", &s->data_pos, H5T_NATIVE_INT64}, {"epoch", &s->epoch, H5T_NATIVE_INT64},
      {"seed", &s->seed, H5T_NATIVE_UINT64},        {"loss_scale", &s->loss_scale, H5T_NATIVE_DOUBLE},
      {"loss_scale_growth", &s->loss_scale_growth, H5T_NATIVE_INT64},
      {"dp", &s->dp, H5T_NATIVE_INT},               {"tp", &s->tp, H5T_NATIVE_INT},
      {"pp", &s->pp, H5T_NATIVE_INT},               {"world", &s->world, H5T_NATIVE_INT},
      {"n_layer", &s->dims.L, H5T_NATIVE_INT},      {"n_head", &s->dims.NH, H5T_NATIVE_INT},
      {"n_embd", &s->dims.C, H5T_NATIVE_INT},       {"vocab_size", &s->dims.V, H5T_NATIVE_INT},
      {"seq_len", &s->dims.T, H5T_NATIVE_INT},
  };
  dt_status_t st = DT_OK;
  for (size_t i = 0; i < sizeof at / sizeof at[0] && st == DT_OK; i++)
    if (attr_get(g, at[i].k, at[i].mt, at[i].v) < 0) st = h5err(path, "/state", at[i].k);
  H5Gclose(g);
  return st;
}

static dt_status_t read_state_data(hid_t file, dt_ckpt_state_t *s, hid_t dxpl, const char *path) {
  hid_t g = H5Gopen2(file, "/state", H5P_DEFAULT);
  if (g < 0) return h5err(path, "/state", "missing group");
  size_t n = 0;
  dt_status_t st = get_small(g, "rng", H5T_NATIVE_UINT64, s->rng, sizeof(uint64_t), sizeof s->rng, &n, dxpl, path);
  s->n_rng = (int)n;
  hid_t d = st == DT_OK ? H5Dopen2(g, "config_ini", H5P_DEFAULT) : -1;
  if (st == DT_OK && d < 0) st = h5err(path, "/state/config_ini", "missing dataset");
  if (st == DT_OK) {
    hid_t ft = H5Dget_type(d);
    size_t len = H5Tget_size(ft);
    H5Tclose(ft);
    H5Dclose(d);
    char *ini = calloc(len + 1, 1);
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, len);
    H5Tset_strpad(mt, H5T_STR_NULLTERM);
    st = ini ? get_small(g, "config_ini", mt, ini, len, len, NULL, dxpl, path) : DT_ERR(DT_ERR_NOMEM, "out of memory");
    H5Tclose(mt);
    if (st == DT_OK) s->ini = ini;
    else free(ini);
  }
  H5Gclose(g);
  return st;
}

static dt_status_t check_header(hid_t file, const dt_layout_t *lay, dt_ckpt_state_t *s, const char *path) {
  char fmt[64] = "";
  int ver = 0, complete = 0;
  if (attr_get_str(file, "format", fmt, sizeof fmt) < 0 || strcmp(fmt, "dtrain-checkpoint") != 0)
    return DT_ERR(DT_ERR_CKPT, "%s: not a dtrain checkpoint (no /format = \"dtrain-checkpoint\")", path);
  if (attr_get(file, "format_version", H5T_NATIVE_INT, &ver) < 0 || ver != DT_CKPT_FORMAT_VERSION)
    return DT_ERR(DT_ERR_CKPT, "%s: format_version %d, this dtrain reads %d", path, ver, DT_CKPT_FORMAT_VERSION);
  if (!H5Aexists(file, "complete") || attr_get(file, "complete", H5T_NATIVE_INT, &complete) < 0 || complete != 1) {
    H5Eclear2(H5E_DEFAULT);
    return DT_ERR(DT_ERR_CKPT, "%s: no completion marker /complete = 1 (the save did not finish)", path);
  }
  attr_get_str(file, "dtrain_version", s->version, sizeof s->version);
  DT_TRY(read_state(file, s, path));
  const dt_dims_t *m = &lay->d, *f = &s->dims;
  if (m->L != f->L || m->NH != f->NH || m->C != f->C || m->V != f->V || m->T != f->T)
    return DT_ERR(DT_ERR_CONFIG,
                  "%s: checkpoint model n_layer=%d n_head=%d n_embd=%d vocab_size=%d seq_len=%d does not match the "
                  "configured n_layer=%d n_head=%d n_embd=%d vocab_size=%d seq_len=%d",
                  path, f->L, f->NH, f->C, f->V, f->T, m->L, m->NH, m->C, m->V, m->T);
  return DT_OK;
}

static dt_status_t open_dsets(hid_t file, const dt_layout_t *lay, dsets_t *D, uint32_t *stored, const char *path) {
  H5G_info_t gi;
  hid_t g = H5Gopen2(file, "/model", H5P_DEFAULT);
  if (g < 0) return h5err(path, "/model", "missing group");
  herr_t e = H5Gget_info(g, &gi);
  H5Gclose(g);
  if (e < 0 || gi.nlinks != (hsize_t)lay->n_tensors)
    return DT_ERR(DT_ERR_CONFIG, "%s: /model holds %llu tensors, the model has %d", path,
                  (unsigned long long)gi.nlinks, lay->n_tensors);
  if (D->n_ds > lay->n_tensors && H5Lexists(file, "/optim", H5P_DEFAULT) <= 0)
    return DT_ERR(DT_ERR_CKPT, "%s: no optimizer state (/optim) in this checkpoint", path);
  for (int d = 0; d < D->n_ds; d++) {
    fshape_t f = fshape(lay, &lay->tensors[d % lay->n_tensors]);
    if ((D->ds[d] = H5Dopen2(file, D->names[d], H5P_DEFAULT)) < 0) return h5err(path, D->names[d], "missing dataset");
    hid_t sp = H5Dget_space(D->ds[d]), ty = H5Dget_type(D->ds[d]);
    hsize_t dims[2] = {0, 0};
    int nd = H5Sget_simple_extent_dims(sp, dims, NULL);
    int okt = H5Tget_class(ty) == H5T_FLOAT && H5Tget_size(ty) == 4;
    H5Sclose(sp);
    H5Tclose(ty);
    if (nd != f.ndim || dims[0] != f.dims[0] || (nd == 2 && dims[1] != f.dims[1])) {
      char ex[48], fo[48];
      snprintf(ex, sizeof ex, f.ndim == 2 ? "(%llu, %llu)" : "(%llu)", (unsigned long long)f.dims[0], (unsigned long long)f.dims[1]);
      if (nd == 2) snprintf(fo, sizeof fo, "(%llu, %llu)", (unsigned long long)dims[0], (unsigned long long)dims[1]);
      else if (nd == 1) snprintf(fo, sizeof fo, "(%llu)", (unsigned long long)dims[0]);
      else snprintf(fo, sizeof fo, "rank %d", nd);
      return DT_ERR(DT_ERR_CONFIG, "%s: %s: shape %s in the file, the model expects %s", path, D->names[d], fo, ex);
    }
    if (!okt) return DT_ERR(DT_ERR_CKPT, "%s: %s: not float32", path, D->names[d]);
    if (attr_get(D->ds[d], "crc32c", H5T_NATIVE_UINT32, &stored[d]) < 0) return h5err(path, D->names[d], "no crc32c attribute");
  }
  return DT_OK;
}

/* Copy the file-layout tensor `full` (FR, FC) into this rank's boxes; zero padded vocab rows. */
static void unpack(const dt_layout_t *lay, int ti, const fshape_t *f, const float *full, const fbox_t *bx, int nb,
                   float *local, int zero_pad) {
  const dt_tensor_t *t = &lay->tensors[ti];
  for (int b = 0; b < nb; b++)
    for (hsize_t i = bx[b].r0; i < bx[b].r1; i++) {
      if (t->ndim == 2 && t->hf_transpose)
        for (hsize_t j = bx[b].c0; j < bx[b].c1; j++) local[local_index(t, &bx[b], i, j)] = full[i * f->FC + j];
      else
        memcpy(local + local_index(t, &bx[b], i, bx[b].c0), full + i * f->FC + bx[b].c0, (bx[b].c1 - bx[b].c0) * sizeof(float));
    }
  if (zero_pad && is_wte(t) && t->rows > lay->d.V)
    memset(local + t->offset + (size_t)lay->d.V * (size_t)t->cols, 0, (size_t)(t->rows - lay->d.V) * (size_t)t->cols * sizeof(float));
}

dt_status_t dt_ckpt_load(const void *mpi_comm, const char *path, const dt_layout_t *lay, const dt_ckpt_arenas_t *a,
                         dt_ckpt_state_t *st_out) {
  MPI_Comm comm = dt_ckpt__comm(mpi_comm);
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  dt_ckpt__h5_quiet();
  dt_ckpt_state_t s;
  memset(&s, 0, sizeof s);
  dt_ckpt_ranges_t rg[2];
  memset(rg, 0, sizeof rg);
  dsets_t D;
  memset(&D, 0, sizeof D);
  hid_t fapl = -1, dxpl = -1, file = -1;
  float *stage = NULL;
  uint32_t *stored = NULL, *crcs = NULL;
  int *cnt = NULL, *dsp = NULL;
  fbox_t *bx = NULL;

  /* Phase 1 (local). */
  dt_status_t st = DT_OK;
  int optim = a->m != NULL;
  if ((a->m == NULL) != (a->v == NULL)) st = DT_ERR(DT_ERR_ARG, "%s: m and v must both be given", path);
  if (st == DT_OK) st = ranges_resolve(lay, &a->model, 0, rank, size, &rg[0]);
  if (st == DT_OK && optim) st = ranges_resolve(lay, &a->optim, 0, rank, size, &rg[1]);
  if (st == DT_OK) st = dsets_init(&D, lay, optim ? 3 : 1);
  if (st == DT_OK) {
    stage = malloc(max_tensor(lay) * sizeof(float));
    stored = calloc((size_t)D.n_ds, sizeof *stored);
    crcs = calloc((size_t)size, sizeof *crcs);
    cnt = calloc((size_t)size, sizeof *cnt);
    dsp = calloc((size_t)size, sizeof *dsp);
    bx = malloc((size_t)(rg[0].n > rg[1].n ? rg[0].n : rg[1].n) * sizeof *bx + 1);
    if (!stage || !stored || !crcs || !cnt || !dsp || !bx) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  }
  if (st == DT_OK && max_tensor(lay) >= INT_MAX) st = DT_ERR(DT_ERR_UNSUPPORTED, "%s: tensor too large for MPI counts", path);
  FILE *probe = st == DT_OK ? fopen(path, "rb") : NULL;
  if (st == DT_OK && !probe) st = DT_ERR(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  if (probe) fclose(probe);
  if (st == DT_OK && dt_ckpt__faulty(comm, "open")) st = DT_ERR(DT_ERR_IO, "%s: simulated open failure (test hook)", path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 2: collective open, header, shapes, stored checksums. */
  fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (file < 0) st = h5err(path, "/", "cannot open as HDF5 (truncated or not HDF5?)");
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  st = check_header(file, lay, &s, path);
  if (st == DT_OK) st = open_dsets(file, lay, &D, stored, path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 3: per dataset: read 1/P, checksum it, allgather tensor and CRCs, verify, unpack. */
  for (int d = 0; d < D.n_ds; d++) {
    int ti = d % lay->n_tensors, gi = d / lay->n_tensors;
    fshape_t f = fshape(lay, &lay->tensors[ti]);
    hsize_t unit = f.ndim == 2 ? f.dims[1] : 1, lo, hi;
    for (int r = 0; r < size; r++) {
      split_first(&f, r, size, &lo, &hi);
      cnt[r] = (int)((hi - lo) * unit), dsp[r] = (int)(lo * unit);
    }
    split_first(&f, rank, size, &lo, &hi);
    hid_t fsp = H5Dget_space(D.ds[d]);
    hsize_t mc = hi > lo ? (hi - lo) * unit : 1;
    hid_t msp = H5Screate_simple(1, &mc, NULL);
    hsize_t start[2] = {lo, 0}, count[2] = {hi - lo, unit};
    if (hi > lo) H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, NULL, count, NULL);
    else H5Sselect_none(fsp), H5Sselect_none(msp);
    if (H5Dread(D.ds[d], H5T_NATIVE_FLOAT, msp, fsp, dxpl, stage + dsp[rank]) < 0) st = h5err(path, D.names[d], "cannot read");
    H5Sclose(msp);
    H5Sclose(fsp);
    if (st == DT_OK && dt_ckpt__faulty(comm, "read")) st = DT_ERR(DT_ERR_IO, "%s: %s: simulated read failure (test hook)", path, D.names[d]);
    if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
    uint32_t mine = dt_crc32c(0, stage + dsp[rank], (size_t)cnt[rank] * sizeof(float)), crc = 0;
    MPI_Allgather(&mine, 1, MPI_UINT32_T, crcs, 1, MPI_UINT32_T, comm);
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, stage, cnt, dsp, MPI_FLOAT, comm);
    for (int r = 0; r < size; r++) crc = r == 0 ? crcs[0] : dt_crc32c_combine(crc, crcs[r], (uint64_t)cnt[r] * sizeof(float));
    if (crc != stored[d]) { /* same verdict on every rank */
      st = DT_ERR(DT_ERR_CKPT, "%s: %s: CRC32C mismatch: stored 0x%08x, data 0x%08x (corrupt file)", path, D.names[d], stored[d], crc);
      goto out;
    }
    int nb = boxes_of(lay, &rg[gi ? 1 : 0], ti, bx);
    unpack(lay, ti, &f, stage, bx, nb, gi == 0 ? a->params : gi == 1 ? a->m : a->v, (gi ? a->optim : a->model).full);
  }

  /* Phase 4: the rest of the state. */
  st = read_state_data(file, &s, dxpl, path);
  st = dt_ckpt__agree(comm, st);

out:
  dsets_free(&D);
  if (file >= 0) H5Fclose(file);
  if (fapl >= 0) H5Pclose(fapl);
  if (dxpl >= 0) H5Pclose(dxpl);
  dt_ckpt_ranges_free(&rg[0]);
  dt_ckpt_ranges_free(&rg[1]);
  free(stage);
  free(stored);
  free(crcs);
  free(cnt);
  free(dsp);
  free(bx);
  if (st == DT_OK && st_out) *st_out = s;
  else dt_ckpt_state_free(&s);
  return st;
}
