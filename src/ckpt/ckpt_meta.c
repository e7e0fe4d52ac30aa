/* Checkpoint read, the metadata (ckpt_int.h): the completion marker, format version and tensor
 * shapes checked against the layout, the training state (scalars, RNG state, the effective ini)
 * and the datasets opened with their stored checksums. The tensors follow in ckpt_read.c. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "ckpt_int.h"
#include "crc32c.h"

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

dt_status_t dt_ckpt__read_state_data(hid_t file, dt_ckpt_state_t *s, hid_t dxpl, const char *path) {
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

dt_status_t dt_ckpt__check_header(hid_t file, const dt_layout_t *lay, dt_ckpt_state_t *s, const char *path) {
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

/* "(d0, d1, ...)" for a shape of rank nd (1 to 4), else "rank nd". */
static void shape_str(char *buf, size_t cap, const hsize_t *dims, int nd) {
  if (nd < 1 || nd > 4) {
    snprintf(buf, cap, "rank %d", nd);
    return;
  }
  size_t n = (size_t)snprintf(buf, cap, "(");
  for (int k = 0; k < nd && n < cap; k++) n += (size_t)snprintf(buf + n, cap - n, k ? ", %llu" : "%llu", (unsigned long long)dims[k]);
  if (n < cap) snprintf(buf + n, cap - n, ")");
}

dt_status_t dt_ckpt__open_dsets(hid_t file, const dt_layout_t *lay, dsets_t *D, uint32_t *stored, const char *path) {
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
    hsize_t dims[H5S_MAX_RANK] = {0};
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd >= 1 && nd <= 4) nd = H5Sget_simple_extent_dims(sp, dims, NULL);
    int okt = H5Tget_class(ty) == H5T_FLOAT && H5Tget_size(ty) == 4;
    H5Sclose(sp);
    H5Tclose(ty);
    int same = nd == f.ndim;
    for (int k = 0; same && k < nd; k++) same = dims[k] == f.dims[k];
    if (!same) {
      char ex[96], fo[96];
      shape_str(ex, sizeof ex, f.dims, f.ndim);
      shape_str(fo, sizeof fo, dims, nd);
      return DT_ERR(DT_ERR_CONFIG, "%s: %s: shape %s in the file, the model expects %s", path, D->names[d], fo, ex);
    }
    if (!okt) return DT_ERR(DT_ERR_CKPT, "%s: %s: not float32", path, D->names[d]);
    if (dt_ckpt__attr_get(D->ds[d], "crc32c", H5T_NATIVE_UINT32, &stored[d]) < 0) return dt_ckpt__h5err(path, D->names[d], "no crc32c attribute");
  }
  return DT_OK;
}
