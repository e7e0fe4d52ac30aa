/* The checkpoint tests' fixture (ckpt_fixture.h). */
#include "ckpt_fixture.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "dt_build.h"

int rank, size, fails;

void add_t(dt_layout_t *lay, size_t *off, const char *name, int rows, int cols, int ndim, int layer) {
  dt_tensor_t *t = &lay->tensors[lay->n_tensors++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->offset = *off, t->rows = rows, t->cols = cols, t->ndim = ndim, t->layer = layer;
  t->decay = ndim == 2;
  *off += ((size_t)rows * cols + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
}

void layout(dt_layout_t *lay, int L, int NH, int C, int V, int T) {
  memset(lay, 0, sizeof *lay);
  lay->d = (dt_dims_t){L, NH, C, V, (V + 127) / 128 * 128, T};
  lay->tensors = calloc((size_t)(2 + 12 * L + 2), sizeof(dt_tensor_t));
  size_t off = 0;
  char n[48];
  add_t(lay, &off, "wte.weight", lay->d.Vp, C, 2, -1);
  add_t(lay, &off, "wpe.weight", T, C, 2, -1);
  for (int l = 0; l < L; l++) { /* Conv1D weights (in, out) */
    struct {
      const char *s;
      int r, c, nd;
    } b[12] = {{"ln_1.weight", 1, C, 1},
               {"ln_1.bias", 1, C, 1},
               {"attn.c_attn.weight", C, 3 * C, 2},
               {"attn.c_attn.bias", 1, 3 * C, 1},
               {"attn.c_proj.weight", C, C, 2},
               {"attn.c_proj.bias", 1, C, 1},
               {"ln_2.weight", 1, C, 1},
               {"ln_2.bias", 1, C, 1},
               {"mlp.c_fc.weight", C, 4 * C, 2},
               {"mlp.c_fc.bias", 1, 4 * C, 1},
               {"mlp.c_proj.weight", 4 * C, C, 2},
               {"mlp.c_proj.bias", 1, C, 1}};
    for (int k = 0; k < 12; k++) {
      snprintf(n, sizeof n, "h.%d.%s", l, b[k].s);
      add_t(lay, &off, n, b[k].r, b[k].c, b[k].nd, l);
    }
  }
  add_t(lay, &off, "ln_f.weight", 1, C, 1, L);
  add_t(lay, &off, "ln_f.bias", 1, C, 1, L);
  lay->n_params = off;
}

/* ---- deterministic contents ---- */
static float pval(int t, int r, int c, int cols, long step) {
  return (float)((double)t + (double)(r * cols + c) / 65536.0 + 32.0 * (double)(step % 4));
}

void fill(const dt_layout_t *lay, float *p, float *m, float *v, long step) {
  for (size_t i = 0; i < lay->n_params; i++)
    p[i] = m[i] = v[i] = NAN; /* padding: never read */
  for (int t = 0; t < lay->n_tensors; t++) {
    const dt_tensor_t *T = &lay->tensors[t];
    for (int r = 0; r < T->rows; r++)
      for (int c = 0; c < T->cols; c++) {
        size_t i = T->offset + (size_t)r * T->cols + c;
        if (t == 0 && r >= lay->d.V) {
          p[i] = m[i] = v[i] = 0.0f;
          continue;
        } /* padded vocab rows */
        p[i] = pval(t, r, c, T->cols, step), m[i] = -p[i], v[i] = p[i] / 4;
      }
  }
}

static const char *INI = "[model]\nn_layer = 2\nn_embd = 32\n\n[train]\nlr = 0.0006\n# unicode: \xc3\xa9\n";

dt_ckpt_state_t mkstate(long step) {
  dt_ckpt_state_t s;
  memset(&s, 0, sizeof s);
  s.step = step, s.tokens = step * 4096 + 7, s.data_pos = step * 16 + 3, s.epoch = step / 20;
  s.seed = 0xDEADBEEFCAFEF00DULL, s.n_rng = 5;
  for (int i = 0; i < 5; i++)
    s.rng[i] = 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1) + (uint64_t)step;
  s.loss_scale = 65536.0, s.loss_scale_growth = 123, s.skipped_steps = 9, s.dp = size, s.tp = 1, s.pp = 1;
  s.ini = INI;
  return s;
}

/* Compare arenas with the fill of `step` (padded vocab rows must be 0). Returns mismatches. */
long compare(const dt_layout_t *lay, const float *p, const float *m, const float *v, long step) {
  long bad = 0;
  for (int t = 0; t < lay->n_tensors; t++) {
    const dt_tensor_t *T = &lay->tensors[t];
    for (int r = 0; r < T->rows; r++)
      for (int c = 0; c < T->cols; c++) {
        size_t i = T->offset + (size_t)r * T->cols + c;
        float e = t == 0 && r >= lay->d.V ? 0.0f : pval(t, r, c, T->cols, step);
        if (memcmp(&p[i], &e, 4) != 0) bad++;
        if (m) {
          float em = -e, ev = e / 4;
          if (t == 0 && r >= lay->d.V) em = ev = 0.0f;
          if (memcmp(&m[i], &em, 4) != 0 || memcmp(&v[i], &ev, 4) != 0) bad++;
        }
      }
  }
  long tot;
  MPI_Allreduce(&bad, &tot, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return tot;
}

void check_state(const dt_ckpt_state_t *g, long step) {
  dt_ckpt_state_t e = mkstate(step);
  CHECK(g->step == e.step && g->tokens == e.tokens && g->data_pos == e.data_pos && g->epoch == e.epoch &&
            g->seed == e.seed && g->loss_scale == e.loss_scale && g->loss_scale_growth == e.loss_scale_growth &&
            g->skipped_steps == e.skipped_steps,
        "state scalars differ (step %lld vs %ld)", (long long)g->step, step);
  CHECK(g->n_rng == 5 && memcmp(g->rng, e.rng, sizeof(uint64_t) * 5) == 0, "rng state differs (n_rng %d)", g->n_rng);
  CHECK(g->ini && strcmp(g->ini, INI) == 0, "ini text differs: %s", g->ini ? g->ini : "(null)");
  CHECK(g->tp == 1 && g->pp == 1 && g->dp >= 1 && g->world >= 1, "layout dp/tp/pp/world %d/%d/%d/%d", g->dp, g->tp,
        g->pp, g->world);
  CHECK(strcmp(g->version, PACKAGE_VERSION) == 0, "version '%s'", g->version);
  CHECK(g->dims.L == 2 && g->dims.C == 32 && g->dims.V == 100 && g->dims.T == 16 && g->dims.NH == 2, "dims");
}

bufs_t bufs(const dt_layout_t *lay) {
  bufs_t b = {malloc(lay->n_params * 4), malloc(lay->n_params * 4), malloc(lay->n_params * 4)};
  return b;
}
void garbage(const dt_layout_t *lay, bufs_t *b) {
  for (size_t i = 0; i < lay->n_params; i++)
    b->p[i] = b->m[i] = b->v[i] = 12345.0f;
}

int all_agree(dt_status_t st, dt_status_t want) {
  int ok = st == want, all;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all;
}

dt_status_t save_step(const char *dir, int keep, const dt_layout_t *lay, long step, char *path) {
  bufs_t b = bufs(lay);
  fill(lay, b.p, b.m, b.v, step);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
  dt_ckpt_state_t s = mkstate(step);
  MPI_Comm w = MPI_COMM_WORLD;
  dt_status_t st = dt_ckpt_save(&w, dir, keep, lay, &a, rank == 0 ? &s : NULL, path, 1024);
  free(b.p), free(b.m), free(b.v);
  return st;
}

/* Load the newest valid checkpoint of dir and expect the fill of `step`. */
void load_expect(const char *dir, const dt_layout_t *lay, long step, const char *what) {
  bufs_t b = bufs(lay);
  garbage(lay, &b);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
  dt_ckpt_state_t s;
  char used[1024] = "";
  MPI_Comm w = MPI_COMM_WORLD;
  dt_status_t st = dt_ckpt_load_latest(&w, dir, lay, &a, &s, used, sizeof used);
  CHECK(all_agree(st, DT_OK), "%s: load_latest: %s: %s", what, dt_status_str(st), dt_err_msg());
  if (st == DT_OK) {
    char want[64];
    snprintf(want, sizeof want, "ckpt_%08ld.h5", step);
    CHECK(strstr(used, want) != NULL, "%s: used %s, want %s", what, used, want);
    long bad = compare(lay, b.p, b.m, b.v, step);
    CHECK(bad == 0, "%s: %ld values differ after load", what, bad);
    check_state(&s, step);
    dt_ckpt_state_free(&s);
    if (rank == 0 && bad == 0)
      printf("ok %s: loaded %s with %d ranks, bitwise equal (params, m, v, state, ini)\n", what, used, size);
  }
  free(b.p), free(b.m), free(b.v);
}
