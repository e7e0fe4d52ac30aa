/* Checkpoints that must be refused or survived (tests/test_ckpt.c runs these): rotation, a flipped
 * bit, a missing completion marker, a truncated file, another model's file, a weights-only file;
 * a failure on one rank in each phase reaching every rank; MPI errors returned, not fatal. */
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_fixture.h"

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

void test_damage(const char *dir, const dt_layout_t *lay) {
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
  if (f) {
    if (!fgets(l, sizeof l, f)) l[0] = 0;
    fclose(f);
  }
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
            strstr(dt_err_msg(), "/model/h.0.attn.c_attn.weight"),
        "bit flip: %s", dt_err_msg());
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
  free(b.p), free(b.m), free(b.v);
}

/* Files of another model, or without the optimizer state, are refused with an error naming why;
 * dir holds test_damage's step-50 checkpoint. */
void test_refusals(const char *dir, const dt_layout_t *lay) {
  MPI_Comm w = MPI_COMM_WORLD;
  char used[1024];
  /* shape mismatch: a model with another width -> config error naming both */
  dt_layout_t other;
  layout(&other, 2, 2, 48, 100, 16);
  bufs_t o = bufs(&other);
  dt_ckpt_arenas_t oa = dt_ckpt_arenas_full(o.p, o.m, o.v);
  dt_status_t st = dt_ckpt_load_latest(&w, dir, &other, &oa, NULL, used, sizeof used);
  CHECK(all_agree(st, DT_ERR_CONFIG) && strstr(dt_err_msg(), "n_embd=32") && strstr(dt_err_msg(), "n_embd=48"),
        "shape mismatch: %s", dt_err_msg());
  if (rank == 0) printf("ok model mismatch: %s\n", dt_err_msg());
  dt_err_clear();
  free(o.p), free(o.m), free(o.v), free(other.tensors);

  /* weights only (eval export): no /optim; loading moments from it fails clearly */
  bufs_t b = bufs(lay);
  dt_ckpt_arenas_t a = dt_ckpt_arenas_full(b.p, b.m, b.v);
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
void test_faults(const char *dir, const dt_layout_t *lay) {
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
    if (rank == (v == 0 ? size - 1 : 0))
      printf("ok fault '%s' on rank %d reached all ranks: %s\n", phases[i], v, dt_err_msg());
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
void test_mpi_error(const char *dir, const dt_layout_t *lay) {
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
  if (rank == 0)
    printf("ok MPI errors: save, load and find_latest on an invalid communicator return DT_ERR_MPI naming the call\n");
}
