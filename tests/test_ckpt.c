/* Multi-rank checkpoint tests (plain MPI program, run by tests/ckpt_mpi.sh with 1, 2, 4 ranks).
 *   test_ckpt all DIR         every scenario at this world size, in DIR (fresh)
 *   test_ckpt save DIR STEP   save a checkpoint of the deterministic fill at STEP into DIR
 *   test_ckpt load DIR STEP   load the newest valid checkpoint of DIR, expect the fill of STEP
 *   test_ckpt bench DIR L C V T | corrupt FILE L C V T DATASET | refuse FILE WHY   (tests/ckpt_*.sh)
 * The layout and its contents: tests/ckpt_fixture.h; the damaged files and faults:
 * tests/test_ckpt_damage.c. */
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

#include "ckpt_fixture.h"
#include "crc32c.h"
#include "dt_build.h"

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

/* bench DIR L C V T: a GPT-2-sized checkpoint saved, loaded and checked, timed */
static void mode_bench(const char *dir, char **dims) {
  dt_layout_t big;
  layout(&big, atoi(dims[0]), 12, atoi(dims[1]), atoi(dims[2]), atoi(dims[3]));
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
}

/* corrupt FILE L C V T DATASET: a file with a flipped bit in DATASET must be refused, naming it */
static void mode_corrupt(const char *file, char **args) {
  dt_layout_t big;
  layout(&big, atoi(args[0]), 12, atoi(args[1]), atoi(args[2]), atoi(args[3]));
  bufs_t b = bufs(&big);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
  MPI_Comm w = MPI_COMM_WORLD;
  dt_status_t st = dt_ckpt_load(&w, file, &big, &a, NULL);
  CHECK(all_agree(st, DT_ERR_CKPT) && strstr(dt_err_msg(), "CRC32C mismatch") && strstr(dt_err_msg(), args[4]),
        "corrupt %s: %s", args[4], dt_err_msg());
  if (rank == 0) printf("ok flipped bit in %s detected with %d ranks: %s\n", args[4], size, dt_err_msg());
  free(b.p), free(b.m), free(b.v), free(big.tensors);
}

/* refuse FILE WHY: loading FILE must fail on every rank with an error naming WHY */
static void mode_refuse(const char *file, const dt_layout_t *lay, const char *why) {
  bufs_t b = bufs(lay);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
  dt_ckpt_state_t s;
  memset(&s, 0, sizeof s);
  MPI_Comm w = MPI_COMM_WORLD;
  dt_status_t st = dt_ckpt_load(&w, file, lay, &a, &s);
  CHECK(all_agree(st, DT_ERR_CKPT) && strstr(dt_err_msg(), why), "refuse %s: %s: %s", file, dt_status_str(st),
        dt_err_msg());
  if (rank == 0 && st != DT_OK) printf("ok %s refused with %d ranks: %s\n", file, size, dt_err_msg());
  if (st == DT_OK) dt_ckpt_state_free(&s);
  free(b.p), free(b.m), free(b.v);
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
    test_refusals(d, &lay);
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
    mode_bench(dir, argv + 3);
  } else if (strcmp(mode, "corrupt") == 0 && argc > 7) { /* corrupt FILE L C V T DATASET: load must refuse it */
    mode_corrupt(dir, argv + 3);
  } else if (strcmp(mode, "refuse") == 0 && argc > 3) { /* refuse FILE WHY: load must fail, naming WHY */
    mode_refuse(dir, &lay, argv[3]);
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
