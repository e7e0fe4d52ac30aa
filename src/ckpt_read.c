/* Checkpoint read: collective open, marker/format/shape checks, then per dataset each rank
 * reads and checksums 1/P of it, an allgather gives every rank the whole tensor, the combined
 * CRC32C is verified and each rank copies out its boxes (transposing back to our layout). */
#include <errno.h>
#include <hdf5.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "ckpt_int.h"
#include "crc32c.h"

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
  if (d < 0) return dt_ckpt__h5err(path, obj, "missing dataset");
  hid_t sp = H5Dget_space(d);
  hssize_t n = H5Sget_simple_extent_npoints(sp);
  uint32_t stored = 0;
  dt_status_t st = DT_OK;
  if (n < 0 || (size_t)n * elem > cap) st = DT_ERR(DT_ERR_CKPT, "%s: %s: %lld elements do not fit (max %zu)", path, obj, (long long)n, cap / elem);
  else if (n > 0 && H5Dread(d, mtype, H5S_ALL, H5S_ALL, dxpl, buf) < 0) st = dt_ckpt__h5err(path, obj, "cannot read");
  else if (dt_ckpt__attr_get(d, "crc32c", H5T_NATIVE_UINT32, &stored) < 0) st = dt_ckpt__h5err(path, obj, "no crc32c attribute");
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
  if (g < 0) return dt_ckpt__h5err(path, "/state", "missing group");
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
    if (dt_ckpt__attr_get(g, at[i].k, at[i].mt, at[i].v) < 0) st = dt_ckpt__h5err(path, "/state", at[i].k);
  s->skipped_steps = 0; /* optional: files before mixed precision do not have it */
  if (st == DT_OK && H5Aexists(g, "skipped_steps") > 0 &&
      dt_ckpt__attr_get(g, "skipped_steps", H5T_NATIVE_INT64, &s->skipped_steps) < 0)
    st = dt_ckpt__h5err(path, "/state", "skipped_steps");
  H5Gclose(g);
  return st;
}

static dt_status_t read_state_data(hid_t file, dt_ckpt_state_t *s, hid_t dxpl, const char *path) {
  hid_t g = H5Gopen2(file, "/state", H5P_DEFAULT);
  if (g < 0) return dt_ckpt__h5err(path, "/state", "missing group");
  size_t n = 0;
  dt_status_t st = get_small(g, "rng", H5T_NATIVE_UINT64, s->rng, sizeof(uint64_t), sizeof s->rng, &n, dxpl, path);
  s->n_rng = (int)n;
  hid_t d = st == DT_OK ? H5Dopen2(g, "config_ini", H5P_DEFAULT) : -1;
  if (st == DT_OK && d < 0) st = dt_ckpt__h5err(path, "/state/config_ini", "missing dataset");
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
  if (dt_ckpt__attr_get_str(file, "format", fmt, sizeof fmt) < 0 || strcmp(fmt, "dtrain-checkpoint") != 0)
    return DT_ERR(DT_ERR_CKPT, "%s: not a dtrain checkpoint (no /format = \"dtrain-checkpoint\")", path);
  if (dt_ckpt__attr_get(file, "format_version", H5T_NATIVE_INT, &ver) < 0 || ver != DT_CKPT_FORMAT_VERSION)
    return DT_ERR(DT_ERR_CKPT, "%s: format_version %d, this dtrain reads %d", path, ver, DT_CKPT_FORMAT_VERSION);
  if (!H5Aexists(file, "complete") || dt_ckpt__attr_get(file, "complete", H5T_NATIVE_INT, &complete) < 0 || complete != 1) {
    H5Eclear2(H5E_DEFAULT);
    return DT_ERR(DT_ERR_CKPT, "%s: no completion marker /complete = 1 (the save did not finish)", path);
  }
  dt_ckpt__attr_get_str(file, "dtrain_version", s->version, sizeof s->version);
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
  if (g < 0) return dt_ckpt__h5err(path, "/model", "missing group");
  herr_t e = H5Gget_info(g, &gi);
  H5Gclose(g);
  if (e < 0 || gi.nlinks != (hsize_t)lay->n_tensors)
    return DT_ERR(DT_ERR_CONFIG, "%s: /model holds %llu tensors, the model has %d", path,
                  (unsigned long long)gi.nlinks, lay->n_tensors);
  if (D->n_ds > lay->n_tensors && H5Lexists(file, "/optim", H5P_DEFAULT) <= 0)
    return DT_ERR(DT_ERR_CKPT, "%s: no optimizer state (/optim) in this checkpoint", path);
  for (int d = 0; d < D->n_ds; d++) {
    fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[d % lay->n_tensors]);
    if ((D->ds[d] = H5Dopen2(file, D->names[d], H5P_DEFAULT)) < 0) return dt_ckpt__h5err(path, D->names[d], "missing dataset");
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
    if (dt_ckpt__attr_get(D->ds[d], "crc32c", H5T_NATIVE_UINT32, &stored[d]) < 0) return dt_ckpt__h5err(path, D->names[d], "no crc32c attribute");
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
        for (hsize_t j = bx[b].c0; j < bx[b].c1; j++) local[dt_ckpt__local_index(t, &bx[b], i, j)] = full[i * f->FC + j];
      else
        memcpy(local + dt_ckpt__local_index(t, &bx[b], i, bx[b].c0), full + i * f->FC + bx[b].c0, (bx[b].c1 - bx[b].c0) * sizeof(float));
    }
  if (zero_pad && dt_ckpt__is_wte(t) && t->rows > lay->d.V)
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
  if (st == DT_OK) st = dt_ckpt__ranges_resolve(lay, &a->model, 0, rank, size, &rg[0]);
  if (st == DT_OK && optim) st = dt_ckpt__ranges_resolve(lay, &a->optim, 0, rank, size, &rg[1]);
  if (st == DT_OK) st = dt_ckpt__dsets_init(&D, lay, optim ? 3 : 1);
  if (st == DT_OK) {
    stage = malloc(dt_ckpt__max_tensor(lay) * sizeof(float));
    stored = calloc((size_t)D.n_ds, sizeof *stored);
    crcs = calloc((size_t)size, sizeof *crcs);
    cnt = calloc((size_t)size, sizeof *cnt);
    dsp = calloc((size_t)size, sizeof *dsp);
    bx = malloc((size_t)(rg[0].n > rg[1].n ? rg[0].n : rg[1].n) * sizeof *bx + 1);
    if (!stage || !stored || !crcs || !cnt || !dsp || !bx) st = DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  }
  if (st == DT_OK && dt_ckpt__max_tensor(lay) >= INT_MAX) st = DT_ERR(DT_ERR_UNSUPPORTED, "%s: tensor too large for MPI counts", path);
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
  if (file < 0) st = dt_ckpt__h5err(path, "/", "cannot open as HDF5 (truncated or not HDF5?)");
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;
  st = check_header(file, lay, &s, path);
  if (st == DT_OK) st = open_dsets(file, lay, &D, stored, path);
  if ((st = dt_ckpt__agree(comm, st)) != DT_OK) goto out;

  /* Phase 3: per dataset: read 1/P, checksum it, allgather tensor and CRCs, verify, unpack. */
  for (int d = 0; d < D.n_ds; d++) {
    int ti = d % lay->n_tensors, gi = d / lay->n_tensors;
    fshape_t f = dt_ckpt__fshape(lay, &lay->tensors[ti]);
    hsize_t unit = f.ndim == 2 ? f.dims[1] : 1, lo, hi;
    for (int r = 0; r < size; r++) {
      dt_ckpt__split_first(&f, r, size, &lo, &hi);
      cnt[r] = (int)((hi - lo) * unit), dsp[r] = (int)(lo * unit);
    }
    dt_ckpt__split_first(&f, rank, size, &lo, &hi);
    hid_t fsp = H5Dget_space(D.ds[d]);
    hsize_t mc = hi > lo ? (hi - lo) * unit : 1;
    hid_t msp = H5Screate_simple(1, &mc, NULL);
    hsize_t start[2] = {lo, 0}, count[2] = {hi - lo, unit};
    if (hi > lo) H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, NULL, count, NULL);
    else H5Sselect_none(fsp), H5Sselect_none(msp);
    if (H5Dread(D.ds[d], H5T_NATIVE_FLOAT, msp, fsp, dxpl, stage + dsp[rank]) < 0) st = dt_ckpt__h5err(path, D.names[d], "cannot read");
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
    int nb = dt_ckpt__boxes_of(lay, &rg[gi ? 1 : 0], ti, bx);
    unpack(lay, ti, &f, stage, bx, nb, gi == 0 ? a->params : gi == 1 ? a->m : a->v, (gi ? a->optim : a->model).full);
  }

  /* Phase 4: the rest of the state. */
  st = read_state_data(file, &s, dxpl, path);
  st = dt_ckpt__agree(comm, st);

out:
  dt_ckpt__dsets_free(&D);
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

