/* Multi-rank checkpoint tests (plain MPI program, run by tests/ckpt_mpi.sh with 1, 2, 4 ranks).
 *   test_ckpt all DIR         every scenario at this world size, in DIR (fresh)
 *   test_ckpt save DIR STEP   save a checkpoint of the deterministic fill at STEP into DIR
 *   test_ckpt load DIR STEP   load the newest valid checkpoint of DIR, expect the fill of STEP
 * The layout is built here by hand from model.h (model.c is not this module's). Values are
 * exact in float32: param(t, r, c) = t + (r*cols + c)/65536 + 32*(step%4), m = -param, v = param/4. */
#include <hdf5.h>
#include <math.h>
#include <mpi.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "crc32c.h"
#include "dt_build.h"

static int rank, size, fails;

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      fails++;                                                    \
      fprintf(stderr, "FAIL rank %d line %d: ", rank, __LINE__);  \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, "\n");                                      \
    }                                                             \
  } while (0)

/* ---- test-only layout builder (model.h's documented order) ---- */
static void add_t(dt_layout_t *lay, size_t *off, const char *name, int rows, int cols, int ndim, int layer) {
  dt_tensor_t *t = &lay->tensors[lay->n_tensors++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->offset = *off, t->rows = rows, t->cols = cols, t->ndim = ndim, t->layer = layer;
  t->decay = ndim == 2;
  *off += ((size_t)rows * cols + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
}

static void layout(dt_layout_t *lay, int L, int NH, int C, int V, int T) {
  memset(lay, 0, sizeof *lay);
  lay->d = (dt_dims_t){L, NH, C, V, (V + 127) / 128 * 128, T};
  lay->tensors = calloc((size_t)(2 + 12 * L + 2), sizeof(dt_tensor_t));
  size_t off = 0;
  char n[48];
  add_t(lay, &off, "wte.weight", lay->d.Vp, C, 2, -1);
  add_t(lay, &off, "wpe.weight", T, C, 2, -1);
  for (int l = 0; l < L; l++) { /* Conv1D weights (in, out) */
    struct { const char *s; int r, c, nd; } b[12] = {
        {"ln_1.weight", 1, C, 1}, {"ln_1.bias", 1, C, 1}, {"attn.c_attn.weight", C, 3 * C, 2},
        {"attn.c_attn.bias", 1, 3 * C, 1}, {"attn.c_proj.weight", C, C, 2}, {"attn.c_proj.bias", 1, C, 1},
        {"ln_2.weight", 1, C, 1}, {"ln_2.bias", 1, C, 1}, {"mlp.c_fc.weight", C, 4 * C, 2},
        {"mlp.c_fc.bias", 1, 4 * C, 1}, {"mlp.c_proj.weight", 4 * C, C, 2}, {"mlp.c_proj.bias", 1, C, 1}};
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

static void fill(const dt_layout_t *lay, float *p, float *m, float *v, long step) {
  for (size_t i = 0; i < lay->n_params; i++) p[i] = m[i] = v[i] = NAN; /* padding: never read */
  for (int t = 0; t < lay->n_tensors; t++) {
    const dt_tensor_t *T = &lay->tensors[t];
    for (int r = 0; r < T->rows; r++)
      for (int c = 0; c < T->cols; c++) {
        size_t i = T->offset + (size_t)r * T->cols + c;
        if (t == 0 && r >= lay->d.V) { p[i] = m[i] = v[i] = 0.0f; continue; } /* padded vocab rows */
        p[i] = pval(t, r, c, T->cols, step), m[i] = -p[i], v[i] = p[i] / 4;
      }
  }
}

static const char *INI = "[model]\nn_layer = 2\nn_embd = 32\n\n[train]\nlr = 0.0006\n# unicode: \xc3\xa9\n";

static dt_ckpt_state_t mkstate(long step) {
  dt_ckpt_state_t s;
  memset(&s, 0, sizeof s);
  s.step = step, s.tokens = step * 4096 + 7, s.data_pos = step * 16 + 3, s.epoch = step / 20;
  s.seed = 0xDEADBEEFCAFEF00DULL, s.n_rng = 5;
  for (int i = 0; i < 5; i++) s.rng[i] = 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1) + (uint64_t)step;
  s.loss_scale = 65536.0, s.loss_scale_growth = 123, s.skipped_steps = 9, s.dp = size, s.tp = 1, s.pp = 1;
  s.ini = INI;
  return s;
}

/* Compare arenas with the fill of `step` (padded vocab rows must be 0). Returns mismatches. */
static long compare(const dt_layout_t *lay, const float *p, const float *m, const float *v, long step) {
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

static void check_state(const dt_ckpt_state_t *g, long step) {
  dt_ckpt_state_t e = mkstate(step);
  CHECK(g->step == e.step && g->tokens == e.tokens && g->data_pos == e.data_pos && g->epoch == e.epoch &&
            g->seed == e.seed && g->loss_scale == e.loss_scale && g->loss_scale_growth == e.loss_scale_growth &&
            g->skipped_steps == e.skipped_steps,
        "state scalars differ (step %lld vs %ld)", (long long)g->step, step);
  CHECK(g->n_rng == 5 && memcmp(g->rng, e.rng, sizeof(uint64_t) * 5) == 0, "rng state differs (n_rng %d)", g->n_rng);
  CHECK(g->ini && strcmp(g->ini, INI) == 0, "ini text differs: %s", g->ini ? g->ini : "(null)");
  CHECK(g->tp == 1 && g->pp == 1 && g->dp >= 1 && g->world >= 1, "layout dp/tp/pp/world %d/%d/%d/%d", g->dp, g->tp, g->pp, g->world);
  CHECK(strcmp(g->version, PACKAGE_VERSION) == 0, "version '%s'", g->version);
  CHECK(g->dims.L == 2 && g->dims.C == 32 && g->dims.V == 100 && g->dims.T == 16 && g->dims.NH == 2, "dims");
}

typedef struct { float *p, *m, *v; } bufs_t;

static bufs_t bufs(const dt_layout_t *lay) {
  bufs_t b = {malloc(lay->n_params * 4), malloc(lay->n_params * 4), malloc(lay->n_params * 4)};
  return b;
}
static void garbage(const dt_layout_t *lay, bufs_t *b) {
  for (size_t i = 0; i < lay->n_params; i++) b->p[i] = b->m[i] = b->v[i] = 12345.0f;
}

static int all_agree(dt_status_t st, dt_status_t want) {
  int ok = st == want, all;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all;
}

static dt_status_t save_step(const char *dir, int keep, const dt_layout_t *lay, long step, char *path) {
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
static void load_expect(const char *dir, const dt_layout_t *lay, long step, const char *what) {
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
    if (rank == 0 && bad == 0) printf("ok %s: loaded %s with %d ranks, bitwise equal (params, m, v, state, ini)\n", what, used, size);
  }
  free(b.p), free(b.m), free(b.v);
}

/* Rank 0: serial helpers that damage files. */
static void flip_byte(const char *path, const char *dset) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dset, H5P_DEFAULT);
  haddr_t off = H5Dget_offset(d);
  H5Dclose(d), H5Fclose(f);
  FILE *fp = fopen(path, "r+b");
  unsigned char c;
  fseek(fp, (long)off + 37, SEEK_SET);
  if (fread(&c, 1, 1, fp) != 1) fails++;
  c ^= 0x10;
  fseek(fp, (long)off + 37, SEEK_SET);
  fwrite(&c, 1, 1, fp);
  fclose(fp);
  printf("flipped one bit of %s at file offset %llu (data of %s)\n", path, (unsigned long long)off + 37, dset);
}

static void drop_marker(const char *path) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  H5Adelete(f, "complete");
  H5Fclose(f);
  printf("deleted /complete from %s\n", path);
}

static void truncate_half(const char *path) {
  struct stat sb;
  stat(path, &sb);
  if (truncate(path, sb.st_size / 2) != 0) fails++;
  printf("truncated %s from %lld to %lld bytes\n", path, (long long)sb.st_size, (long long)sb.st_size / 2);
}

static int count_files(const char *dir) {
  int n = 0;
  char p[1100];
  for (int s = 0; s <= 100; s += 10) {
    snprintf(p, sizeof p, "%s/ckpt_%08d.h5", dir, s);
    n += access(p, F_OK) == 0;
  }
  return n;
}

/* Open file descriptors of this process (leak checks around repeated calls). */
static int count_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

/* This process's shared-memory read windows still named in /dev/shm (a load unlinks its window's
 * name as soon as every rank of the node has it mapped). */
static int shm_left(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "dtrain-ckpt-%ld-", (long)getpid());
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

/* Open HDF5 identifiers of each kind (files, groups, datasets, dataspaces, datatypes, attributes,
 * property lists): a leak check around repeated calls. Heap leaks: tests/ckpt_leaks.sh. */
enum { N_ID_KINDS = 7 };
void *volatile dt_test_planted; /* DT_TEST_PLANT_LEAK: a block nobody frees */
static void open_ids(hsize_t *n) {
  static const H5I_type_t kinds[N_ID_KINDS] = {H5I_FILE, H5I_GROUP, H5I_DATASET, H5I_DATASPACE, H5I_DATATYPE, H5I_ATTR,
                                               H5I_GENPROP_LST};
  for (int k = 0; k < N_ID_KINDS; k++)
    if (H5Inmembers(kinds[k], &n[k]) < 0) n[k] = (hsize_t)-1;
}

static void test_roundtrip(const char *dir, const dt_layout_t *lay) {
  char path[1024];
  dt_status_t st = save_step(dir, 0, lay, 7, path);
  CHECK(all_agree(st, DT_OK), "save: %s", dt_err_msg());
  load_expect(dir, lay, 7, "roundtrip");
  /* repeated saves and loads keep no descriptor open (the file's, O_DIRECT's, a node window's
   * shm) and no HDF5 identifier */
  int fds = count_fds();
  hsize_t ids0[N_ID_KINDS], ids1[N_ID_KINDS];
  open_ids(ids0);
  for (int i = 0; i < 4; i++) {
    st = save_step(dir, 0, lay, 7, path);
    CHECK(all_agree(st, DT_OK), "save again: %s", dt_err_msg());
    load_expect(dir, lay, 7, "roundtrip again");
  }
  open_ids(ids1);
  CHECK(count_fds() == fds, "4 more saves and loads left %d file descriptors open on rank %d", count_fds() - fds, rank);
  CHECK(shm_left() == 0, "%d shared-memory read windows of rank %d (/dev/shm/dtrain-ckpt-%ld-*) outlived their loads",
        shm_left(), rank, (long)getpid());
  for (int k = 0; k < N_ID_KINDS; k++)
    CHECK(ids1[k] == ids0[k], "4 more saves and loads left %lld more HDF5 identifiers of kind %d open on rank %d",
          (long long)ids1[k] - (long long)ids0[k], k, rank);
  if (getenv("DT_TEST_PLANT_LEAK")) { /* tests/ckpt_leaks.sh: its leak checker must see this */
    dt_test_planted = malloc(48);
    dt_test_planted = NULL;
  }
}

/* ZeRO-like: params full, m and v each rank's flat arena slice; written file must equal the DP one. */
static void test_sharded(const char *dir, const dt_layout_t *lay) {
  bufs_t full = bufs(lay);
  fill(lay, full.p, full.m, full.v, 7);
  size_t n = lay->n_params, b0 = n * (size_t)rank / (size_t)size, b1 = n * (size_t)(rank + 1) / (size_t)size;
  float *ms = malloc((b1 - b0 + 1) * 4), *vs = malloc((b1 - b0 + 1) * 4);
  memcpy(ms, full.m + b0, (b1 - b0) * 4), memcpy(vs, full.v + b0, (b1 - b0) * 4);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(full.p, ms, vs);
  a.optim.full = 0;
  dt_status_t st = dt_ckpt_ranges_add_flat(&a.optim, lay, b0, b1);
  CHECK(st == DT_OK, "add_flat: %s", dt_err_msg());
  dt_ckpt_state_t s = mkstate(7);
  MPI_Comm w = MPI_COMM_WORLD;
  st = dt_ckpt_save(&w, dir, 0, lay, &a, &s, NULL, 0);
  CHECK(all_agree(st, DT_OK), "sharded save: %s", dt_err_msg());
  load_expect(dir, lay, 7, "sharded-save");
  /* load back into shards */
  memset(ms, 0, (b1 - b0) * 4), memset(vs, 0, (b1 - b0) * 4);
  char p[1100];
  snprintf(p, sizeof p, "%s/ckpt_00000007.h5", dir);
  st = dt_ckpt_load(&w, p, lay, &a, NULL);
  CHECK(all_agree(st, DT_OK), "sharded load: %s", dt_err_msg());
  long bad = 0;
  for (size_t i = b0; i < b1; i++) {
    int pad = isnan(full.m[i]); /* alignment padding: in no box, left as is (padded vocab rows are 0 in both) */
    if (!pad && (memcmp(&ms[i - b0], &full.m[i], 4) != 0 || memcmp(&vs[i - b0], &full.v[i], 4) != 0)) bad++;
  }
  CHECK(bad == 0, "sharded load: %ld values differ", bad);
  if (rank == 0) printf("ok sharded: m, v saved and loaded as flat arena slices [%zu, %zu) per rank\n", b0, b1);
  dt_ckpt_ranges_free(&a.optim);
  /* bad tiling: every rank leaves out the last tensor -> gap; with >1 rank, overlap first */
  dt_ckpt_arenas_t bad_a = dt_ckpt_arenas_full(full.p, NULL, NULL);
  bad_a.model.full = 0;
  for (int t = 0; t < lay->n_tensors - (size == 1); t++) {
    const dt_tensor_t *T = &lay->tensors[t];
    dt_ckpt_range_t r = {t, 0, t == 0 ? lay->d.V : T->rows, 0, T->cols, T->offset, (size_t)T->cols};
    dt_ckpt_ranges_add(&bad_a.model, lay, r);
  }
  char bd[1100];
  snprintf(bd, sizeof bd, "%s/bad", dir);
  st = dt_ckpt_save(&w, bd, 0, lay, &bad_a, &s, NULL, 0);
  CHECK(all_agree(st, DT_ERR_ARG) && strstr(dt_err_msg(), size == 1 ? "gap" : "overlap"), "bad tiling not detected: %s",
        dt_err_msg());
  if (rank == 0) printf("ok tiling check: %s\n", dt_err_msg());
  dt_err_clear();
  dt_ckpt_ranges_free(&bad_a.model);
  free(ms), free(vs), free(full.p), free(full.m), free(full.v);
}

/* 4-D convolution weights (OC, C, KH, KW) whose optimizer state is cut into flat pieces with bounds
 * inside a filter row, a kernel row and a channel (a ZeRO shard of an image classifier's arena):
 * piece j goes to rank j % size, boxes at their arena offsets in full-size m, v buffers. The file
 * must be the full arenas' (load_expect), and loading the pieces back must give them bitwise. */
static void test_conv4d(const char *dir) {
  dt_layout_t lay;
  memset(&lay, 0, sizeof lay);
  lay.d = (dt_dims_t){2, 2, 32, 100, 128, 16}; /* check_state's dims; nothing else reads them */
  lay.tensors = calloc(3, sizeof(dt_tensor_t));
  size_t off = 0;
  add_t(&lay, &off, "conv1.weight", 6, 5 * 3 * 3, 4, -1);
  add_t(&lay, &off, "bn1.weight", 1, 6, 1, -1);
  add_t(&lay, &off, "conv2.weight", 4, 6 * 2 * 2, 4, -1);
  lay.tensors[0].kh = lay.tensors[0].kw = 3, lay.tensors[2].kh = lay.tensors[2].kw = 2;
  lay.n_params = off;
  const size_t c2 = lay.tensors[2].offset; /* conv1 rows of 45 = 5 channels x 3 kernel rows of 3 */
  const size_t cut[] = {0, 7, 12, 50, 100, 135, 200, c2 + 5, c2 + 30, c2 + 48, off};
  const int npieces = (int)(sizeof cut / sizeof cut[0]) - 1;
  bufs_t full = bufs(&lay), mine = bufs(&lay);
  fill(&lay, full.p, full.m, full.v, 5);
  memcpy(mine.p, full.p, off * 4);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(mine.p, mine.m, mine.v);
  a.optim.full = 0;
  for (int j = rank; j < npieces; j += size) {
    int n0 = a.optim.n;
    dt_status_t st = dt_ckpt_ranges_add_flat(&a.optim, &lay, cut[j], cut[j + 1]);
    CHECK(st == DT_OK, "conv4d: add_flat: %s", dt_err_msg());
    for (int i = n0; i < a.optim.n; i++) a.optim.r[i].off += cut[j]; /* arena offsets, not piece ones */
    memcpy(mine.m + cut[j], full.m + cut[j], (cut[j + 1] - cut[j]) * 4);
    memcpy(mine.v + cut[j], full.v + cut[j], (cut[j + 1] - cut[j]) * 4);
  }
  dt_ckpt_state_t s = mkstate(5);
  MPI_Comm w = MPI_COMM_WORLD;
  dt_status_t st = dt_ckpt_save(&w, dir, 0, &lay, &a, &s, NULL, 0);
  CHECK(all_agree(st, DT_OK), "conv4d: save: %s", dt_err_msg());
  load_expect(dir, &lay, 5, "conv4d");
  garbage(&lay, &mine);
  char p[1100];
  snprintf(p, sizeof p, "%s/ckpt_00000005.h5", dir);
  st = dt_ckpt_load(&w, p, &lay, &a, NULL);
  CHECK(all_agree(st, DT_OK), "conv4d: load: %s", dt_err_msg());
  long bad = 0;
  for (int j = rank; j < npieces; j += size)
    for (size_t i = cut[j]; i < cut[j + 1]; i++)
      if (!isnan(full.m[i]) && (memcmp(&mine.m[i], &full.m[i], 4) != 0 || memcmp(&mine.v[i], &full.v[i], 4) != 0)) bad++;
  CHECK(bad == 0, "conv4d: %ld values of the pieces differ after load", bad);
  if (rank == 0 && bad == 0) printf("ok conv4d: 4-D m, v cut inside filter rows, kernel rows and channels\n");
  dt_ckpt_ranges_free(&a.optim);
  free(full.p), free(full.m), free(full.v), free(mine.p), free(mine.m), free(mine.v), free(lay.tensors);
}

static void test_damage(const char *dir, const dt_layout_t *lay) {
  char p[1100];
  MPI_Comm w = MPI_COMM_WORLD;
  for (long s = 10; s <= 40; s += 10) {
    dt_status_t st = save_step(dir, 3, lay, s, p);
    CHECK(all_agree(st, DT_OK), "save %ld: %s", s, dt_err_msg());
  }
  CHECK(count_files(dir) == 3, "keep=3: %d files", count_files(dir));
  snprintf(p, sizeof p, "%s/latest", dir);
  FILE *f = fopen(p, "r");
  char l[64] = "";
  if (f) { if (!fgets(l, sizeof l, f)) l[0] = 0; fclose(f); }
  CHECK(strcmp(l, "ckpt_00000040.h5\n") == 0, "latest = '%s'", l);
  if (rank == 0) printf("ok keep=3: steps 20, 30, 40 kept, latest -> %s", l);
  load_expect(dir, lay, 40, "newest");

  /* bit flip in 40 -> load fails with a CRC error, load_latest falls back to 30 */
  snprintf(p, sizeof p, "%s/ckpt_00000040.h5", dir);
  if (rank == 0) flip_byte(p, "/model/h.0.attn.c_attn.weight");
  MPI_Barrier(w);
  bufs_t b = bufs(lay);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
  dt_status_t st = dt_ckpt_load(&w, p, lay, &a, NULL);
  CHECK(all_agree(st, DT_ERR_CKPT) && strstr(dt_err_msg(), "CRC32C mismatch") &&
            strstr(dt_err_msg(), "/model/h.0.attn.c_attn.weight"), "bit flip: %s", dt_err_msg());
  if (rank == 0) printf("ok bit flip detected: %s\n", dt_err_msg());
  dt_err_clear();
  load_expect(dir, lay, 30, "after-bitflip");

  /* no completion marker in 30 -> skipped too */
  snprintf(p, sizeof p, "%s/ckpt_00000030.h5", dir);
  if (rank == 0) drop_marker(p);
  MPI_Barrier(w);
  st = dt_ckpt_load(&w, p, lay, &a, NULL);
  CHECK(all_agree(st, DT_ERR_CKPT) && strstr(dt_err_msg(), "completion marker"), "marker: %s", dt_err_msg());
  if (rank == 0) printf("ok missing marker detected: %s\n", dt_err_msg());
  dt_err_clear();
  load_expect(dir, lay, 20, "after-marker");

  /* truncated 20 -> nothing valid left */
  snprintf(p, sizeof p, "%s/ckpt_00000020.h5", dir);
  if (rank == 0) truncate_half(p);
  MPI_Barrier(w);
  st = dt_ckpt_load(&w, p, lay, &a, NULL);
  CHECK(all_agree(st, DT_ERR_HDF5), "truncated: %s", dt_err_msg());
  if (rank == 0) printf("ok truncated file detected: %s\n", dt_err_msg());
  dt_err_clear();
  char used[1024];
  st = dt_ckpt_load_latest(&w, dir, lay, &a, NULL, used, sizeof used);
  /* every candidate rejected: an error of its own (the arenas may hold parts of a rejected file),
   * not "no checkpoint", which would let the trainer start over */
  CHECK(all_agree(st, DT_ERR_IO) && strstr(dt_err_msg(), "all 1 checkpoint(s) are unusable"), "none valid: %s",
        dt_err_msg());
  if (rank == 0) printf("ok nothing valid: %s\n", dt_err_msg());
  dt_err_clear();
  int64_t step = -1;
  st = dt_ckpt_find_latest(&w, dir, -1, used, sizeof used, &step);
  CHECK(all_agree(st, DT_OK) && step == 40, "find_latest -> %lld", (long long)step);

  /* a new save rotates the damaged ones out (keep 1) */
  st = save_step(dir, 1, lay, 50, p);
  CHECK(all_agree(st, DT_OK) && count_files(dir) == 1, "save 50 keep 1: %d files", count_files(dir));
  load_expect(dir, lay, 50, "after-rotation");

  /* shape mismatch: a model with another width -> config error naming both */
  dt_layout_t other;
  layout(&other, 2, 2, 48, 100, 16);
  bufs_t o = bufs(&other);
  dt_ckpt_arenas_t oa = dt_ckpt_arenas_full(o.p, o.m, o.v);
  st = dt_ckpt_load_latest(&w, dir, &other, &oa, NULL, used, sizeof used);
  CHECK(all_agree(st, DT_ERR_CONFIG) && strstr(dt_err_msg(), "n_embd=32") && strstr(dt_err_msg(), "n_embd=48"),
        "shape mismatch: %s", dt_err_msg());
  if (rank == 0) printf("ok model mismatch: %s\n", dt_err_msg());
  dt_err_clear();
  free(o.p), free(o.m), free(o.v), free(other.tensors);

  /* weights only (eval export): no /optim; loading moments from it fails clearly */
  dt_ckpt_arenas_t wo = dt_ckpt_arenas_full(b.p, NULL, NULL);
  fill(lay, b.p, b.m, b.v, 60);
  dt_ckpt_state_t s = mkstate(60);
  char wd[1100];
  snprintf(wd, sizeof wd, "%s/weights", dir);
  st = dt_ckpt_save(&w, wd, 0, lay, &wo, &s, used, sizeof used);
  CHECK(all_agree(st, DT_OK), "weights-only save: %s", dt_err_msg());
  st = dt_ckpt_load(&w, used, lay, &a, NULL);
  CHECK(all_agree(st, DT_ERR_CKPT) && strstr(dt_err_msg(), "no optimizer state"), "no /optim: %s", dt_err_msg());
  dt_err_clear();
  garbage(lay, &b);
  st = dt_ckpt_load(&w, used, lay, &wo, NULL);
  CHECK(all_agree(st, DT_OK) && compare(lay, b.p, NULL, NULL, 60) == 0, "weights-only load: %s", dt_err_msg());
  if (rank == 0) printf("ok weights-only checkpoint saved and loaded\n");
  free(b.p), free(b.m), free(b.v);
}

/* A failure on one rank must reach every rank (and not hang them). */
static void test_faults(const char *dir, const dt_layout_t *lay) {
  const char *phases[] = {"open", "write", "commit", "read"};
  int victim = size - 1;
  MPI_Comm w = MPI_COMM_WORLD;
  char p[1100];
  for (int i = 0; i < 4; i++) {
    int v = strcmp(phases[i], "commit") == 0 ? 0 : victim; /* commit runs on rank 0 */
    dt_status_t st;
    if (strcmp(phases[i], "read") == 0) {
      CHECK(all_agree(save_step(dir, 0, lay, 70, p), DT_OK), "save before read fault: %s", dt_err_msg());
      dt_ckpt__fault(v, phases[i]);
      bufs_t b = bufs(lay);
      dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
      st = dt_ckpt_load(&w, p, lay, &a, NULL);
      free(b.p), free(b.m), free(b.v);
    } else {
      dt_ckpt__fault(v, phases[i]);
      st = save_step(dir, 0, lay, 80 + i, p);
    }
    dt_ckpt__fault(-1, NULL);
    char want[32];
    snprintf(want, sizeof want, "rank %d: ", v);
    CHECK(all_agree(st, DT_ERR_IO) && strstr(dt_err_msg(), "simulated") && (rank == v || strstr(dt_err_msg(), want)),
          "fault %s on rank %d: %s", phases[i], v, dt_err_msg());
    if (rank == (v == 0 ? size - 1 : 0)) printf("ok fault '%s' on rank %d reached all ranks: %s\n", phases[i], v, dt_err_msg());
    dt_err_clear();
  }
  snprintf(p, sizeof p, "%s/ckpt_00000080.h5", dir);
  CHECK(access(p, F_OK) != 0, "failed save left %s", p);
  snprintf(p, sizeof p, "%s/.ckpt_00000081.h5.tmp", dir);
  CHECK(access(p, F_OK) != 0, "failed write left %s", p);
  snprintf(p, sizeof p, "%s/.ckpt_00000082.h5.tmp", dir);
  CHECK(access(p, F_OK) != 0, "failed commit left %s", p);
  snprintf(p, sizeof p, "%s/ckpt_00000082.h5", dir);
  CHECK(access(p, F_OK) != 0, "failed commit left %s", p);
  /* resume=auto on a fresh run: no directory is "no checkpoint" (DT_ERR_CKPT), not an I/O error */
  char used[1024];
  snprintf(p, sizeof p, "%s/does-not-exist", dir);
  MPI_Comm w2 = MPI_COMM_WORLD;
  dt_status_t st = dt_ckpt_find_latest(&w2, p, -1, used, sizeof used, NULL);
  CHECK(all_agree(st, DT_ERR_CKPT), "missing dir: %s", dt_err_msg());
  dt_err_clear();
}

/* Every MPI call of the checkpoint code is checked: on a communicator that returns errors, a failing
 * call (here: an invalid communicator) is an error naming the call, not MPI's abort or a crash. */
static void test_mpi_error(const char *dir, const dt_layout_t *lay) {
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm bad = MPI_COMM_NULL;
  bufs_t b = bufs(lay);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
  dt_ckpt_state_t s = mkstate(3);
  char p[1024];
  int64_t step;
  const char *names[] = {"save", "load", "find_latest"};
  for (int k = 0; k < 3; k++) {
    dt_status_t st = k == 0   ? dt_ckpt_save(&bad, dir, 0, lay, &a, &s, p, sizeof p)
                     : k == 1 ? dt_ckpt_load(&bad, "/nonexistent.h5", lay, &a, NULL)
                              : dt_ckpt_find_latest(&bad, dir, -1, p, sizeof p, &step);
    CHECK(st == DT_ERR_MPI && strstr(dt_err_msg(), "MPI_Comm_rank"), "%s on an invalid communicator: status %d, '%s'",
          names[k], (int)st, dt_err_msg());
  }
  free(b.p), free(b.m), free(b.v);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  if (rank == 0) printf("ok MPI errors: save, load and find_latest on an invalid communicator return DT_ERR_MPI naming the call\n");
}

static void test_crc(void) {
  CHECK(dt_crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c(123456789) = %08x", dt_crc32c(0, "123456789", 9));
  uint32_t a = dt_crc32c(0, "12345", 5), b = dt_crc32c(0, "6789", 4);
  CHECK(dt_crc32c_combine(a, b, 4) == 0xE3069283u, "combine");
}

/* Round trip with dimensions that are not multiples of 8 (uneven rank splits). */
static void test_odd(const char *dir) {
  dt_layout_t odd;
  layout(&odd, 1, 2, 20, 37, 5);
  bufs_t b = bufs(&odd);
  fill(&odd, b.p, b.m, b.v, 3);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
  dt_ckpt_state_t s = mkstate(3);
  MPI_Comm w = MPI_COMM_WORLD;
  char p[1024];
  dt_status_t st = dt_ckpt_save(&w, dir, 0, &odd, &a, rank == 0 ? &s : NULL, p, sizeof p);
  CHECK(all_agree(st, DT_OK), "odd save: %s", dt_err_msg());
  garbage(&odd, &b);
  st = dt_ckpt_load(&w, p, &odd, &a, NULL);
  long bad = compare(&odd, b.p, b.m, b.v, 3);
  CHECK(all_agree(st, DT_OK) && bad == 0, "odd load: %s, %ld values differ", dt_err_msg(), bad);
  if (rank == 0 && st == DT_OK && bad == 0) printf("ok odd dims: C=20, V=37 saved and loaded with %d ranks, bitwise equal\n", size);
  free(b.p), free(b.m), free(b.v), free(odd.tensors);
}

/* A checkpoint bug that sends one rank down another collective path leaves the others waiting
 * forever; every mode here takes seconds, so a rank still running at the deadline ends the job. */
static void on_deadline(int sig) {
  (void)sig;
  static const char m[] = "test_ckpt: a rank is still running at the deadline (DTRAIN_TEST_DEADLINE, "
                          "default 60 s): its collectives wait on a rank that took another path\n";
  ssize_t n = write(2, m, sizeof m - 1);
  (void)n;
  _exit(124);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char *dl = getenv("DTRAIN_TEST_DEADLINE");
  signal(SIGALRM, on_deadline);
  alarm(dl ? (unsigned)atoi(dl) : 60);
  if (argc < 3) {
    if (rank == 0)
      fprintf(stderr, "usage: test_ckpt all|save|load DIR [STEP] | bench DIR L C V T | corrupt FILE L C V T DATASET | refuse FILE WHY\n");
    MPI_Finalize();
    return 2;
  }
  dt_layout_t lay;
  layout(&lay, 2, 2, 32, 100, 16);
  const char *mode = argv[1], *dir = argv[2];
  long step = argc > 3 ? atol(argv[3]) : 0;
  char d[1000];
  if (strcmp(mode, "all") == 0) {
    test_crc();
    snprintf(d, sizeof d, "%s/odd", dir);
    test_odd(d);
    snprintf(d, sizeof d, "%s/roundtrip", dir);
    test_roundtrip(d, &lay);
    snprintf(d, sizeof d, "%s/sharded", dir);
    test_sharded(d, &lay);
    snprintf(d, sizeof d, "%s/conv4d", dir);
    test_conv4d(d);
    snprintf(d, sizeof d, "%s/damage", dir);
    test_damage(d, &lay);
    snprintf(d, sizeof d, "%s/faults", dir);
    test_faults(d, &lay);
    snprintf(d, sizeof d, "%s/mpi_error", dir);
    test_mpi_error(d, &lay);
  } else if (strcmp(mode, "save") == 0) {
    char p[1024];
    dt_status_t st = save_step(dir, 0, &lay, step, p);
    CHECK(all_agree(st, DT_OK), "save: %s", dt_err_msg());
    if (rank == 0 && st == DT_OK) printf("ok saved %s with %d ranks\n", p, size);
  } else if (strcmp(mode, "bench") == 0 && argc > 6) { /* bench DIR L C V T: GPT-2-sized timing */
    dt_layout_t big;
    layout(&big, atoi(argv[3]), 12, atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    bufs_t b = bufs(&big);
    fill(&big, b.p, b.m, b.v, 1);
    dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
    dt_ckpt_state_t s = mkstate(1);
    MPI_Comm w = MPI_COMM_WORLD;
    char p[1024];
    double t0 = MPI_Wtime();
    dt_status_t st = dt_ckpt_save(&w, dir, 1, &big, &a, &s, p, sizeof p);
    double t1 = MPI_Wtime();
    CHECK(st == DT_OK, "bench save: %s", dt_err_msg());
    garbage(&big, &b);
    st = dt_ckpt_load(&w, p, &big, &a, NULL);
    double t2 = MPI_Wtime();
    CHECK(st == DT_OK && compare(&big, b.p, b.m, b.v, 1) == 0, "bench load: %s", dt_err_msg());
    if (rank == 0)
      printf("bench %zu params x 3 (%.0f MB): save %.2f s, load+verify %.2f s with %d ranks\n", big.n_params,
             big.n_params * 12.0 / 1e6, t1 - t0, t2 - t1, size);
    free(b.p), free(b.m), free(b.v), free(big.tensors);
  } else if (strcmp(mode, "corrupt") == 0 && argc > 7) { /* corrupt FILE L C V T DATASET: load must refuse it */
    dt_layout_t big;
    layout(&big, atoi(argv[3]), 12, atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    bufs_t b = bufs(&big);
    dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
    MPI_Comm w = MPI_COMM_WORLD;
    dt_status_t st = dt_ckpt_load(&w, dir, &big, &a, NULL);
    CHECK(all_agree(st, DT_ERR_CKPT) && strstr(dt_err_msg(), "CRC32C mismatch") && strstr(dt_err_msg(), argv[7]),
          "corrupt %s: %s", argv[7], dt_err_msg());
    if (rank == 0) printf("ok flipped bit in %s detected with %d ranks: %s\n", argv[7], size, dt_err_msg());
    free(b.p), free(b.m), free(b.v), free(big.tensors);
  } else if (strcmp(mode, "refuse") == 0 && argc > 3) { /* refuse FILE WHY: load must fail, naming WHY */
    bufs_t b = bufs(&lay);
    dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
    dt_ckpt_state_t s;
    memset(&s, 0, sizeof s);
    MPI_Comm w = MPI_COMM_WORLD;
    dt_status_t st = dt_ckpt_load(&w, dir, &lay, &a, &s);
    CHECK(all_agree(st, DT_ERR_CKPT) && strstr(dt_err_msg(), argv[3]), "refuse %s: %s: %s", dir, dt_status_str(st),
          dt_err_msg());
    if (rank == 0 && st != DT_OK) printf("ok %s refused with %d ranks: %s\n", dir, size, dt_err_msg());
    if (st == DT_OK) dt_ckpt_state_free(&s);
    free(b.p), free(b.m), free(b.v);
  } else if (strcmp(mode, "load") == 0) {
    load_expect(dir, &lay, step, "cross-layout");
  } else { /* a typo must not run nothing and print PASSED */
    if (rank == 0)
      fprintf(stderr, "test_ckpt: unknown mode '%s' or too few arguments (all|save|load DIR [STEP], "
              "bench DIR L C V T, corrupt FILE L C V T DATASET)\n", mode);
    free(lay.tensors);
    MPI_Finalize();
    return 2;
  }
  int tot;
  MPI_Allreduce(&fails, &tot, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  const char *wr = getenv("DTRAIN_CKPT_WRITERS");
  if (rank == 0) printf("%s: %d failure(s) with %d ranks (replicated arenas written by %s)\n", tot ? "FAILED" : "PASSED", tot, size,
                        !wr ? "one rank per node" : !strcmp(wr, "all") ? "every rank" : "one rank per group of DTRAIN_CKPT_WRITERS ranks");
  free(lay.tensors);
  MPI_Finalize();
  return tot ? 1 : 0;
}
