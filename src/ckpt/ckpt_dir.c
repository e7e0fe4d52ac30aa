/* Checkpoint directory: the atomic commit protocol (tmp file, fsync, rename, fsync dir, latest),
 * keep-K rotation, finding the newest complete checkpoint and loading the newest valid one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_int.h"
#include "timer.h"
#include "watchdog.h"

/* Step of "ckpt_<digits>.h5", or -1. */
static long long name_step(const char *n) {
  if (strncmp(n, "ckpt_", 5) != 0) return -1;
  const char *p = n + 5, *q = p;
  while (*q >= '0' && *q <= '9') q++;
  if (q == p || q - p > 18 || strcmp(q, ".h5") != 0) return -1;
  return strtoll(p, NULL, 10);
}

static int fsync_path(const char *path, int dir) {
  int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return -1;
  int e = fsync(fd);
  close(fd);
  return e;
}

static int mkdir_p(const char *dir) {
  char p[DT_PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return errno = ENAMETOOLONG, -1;
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = '\0';
      if (mkdir(p, 0777) < 0 && errno != EEXIST) return -1;
      *s = '/';
    }
  return mkdir(p, 0777) < 0 && errno != EEXIST ? -1 : 0;
}

typedef struct { long long step; char name[256]; } entry_t;

static int entry_desc(const void *a, const void *b) {
  const entry_t *x = a, *y = b;
  return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

/* Checkpoints in dir, newest first. */
static dt_status_t list_ckpts(const char *dir, entry_t **out, int *n) {
  *out = NULL, *n = 0;
  DIR *d = opendir(dir);
  if (!d && errno == ENOENT) return DT_ERR(DT_ERR_CKPT, "%s: no complete checkpoint (no such directory)", dir);
  if (!d) return DT_ERR(DT_ERR_IO, "%s: cannot list checkpoint directory: %s", dir, strerror(errno));
  int cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long s = name_step(e->d_name);
    if (s < 0 || strlen(e->d_name) >= sizeof(*out)->name) continue;
    if (*n == cap) {
      entry_t *t = realloc(*out, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *t);
      if (!t) return closedir(d), free(*out), *out = NULL, DT_ERR(DT_ERR_NOMEM, "out of memory");
      *out = t;
    }
    (*out)[*n].step = s;
    snprintf((*out)[(*n)++].name, sizeof(*out)->name, "%s", e->d_name);
  }
  closedir(d);
  qsort(*out, (size_t)*n, sizeof **out, entry_desc);
  return DT_OK;
}

/* Rank 0: fsync the tmp file, rename, fsync dir, update latest, rotate. */
static dt_status_t commit(const char *dir, const char *tmp, const char *final, const char *base, int keep) {
  char lt[DT_PATH_MAX + 16], lf[DT_PATH_MAX + 16];
  if (fsync_path(tmp, 0) < 0) return DT_ERR(DT_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
  if (rename(tmp, final) < 0) return DT_ERR(DT_ERR_IO, "rename %s -> %s: %s", tmp, final, strerror(errno));
  if (fsync_path(dir, 1) < 0) return DT_ERR(DT_ERR_IO, "%s: fsync directory: %s", dir, strerror(errno));
  snprintf(lt, sizeof lt, "%s/latest.tmp", dir);
  snprintf(lf, sizeof lf, "%s/latest", dir);
  FILE *f = fopen(lt, "w");
  if (!f) return DT_ERR(DT_ERR_IO, "%s: %s", lt, strerror(errno));
  int bad = fprintf(f, "%s\n", base) < 0;
  bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
  bad |= fclose(f) != 0;
  if (bad) return DT_ERR(DT_ERR_IO, "%s: write: %s", lt, strerror(errno));
  if (rename(lt, lf) < 0) return DT_ERR(DT_ERR_IO, "rename %s -> %s: %s", lt, lf, strerror(errno));
  /* Rotation, only now that the new checkpoint is committed; also drop tmp files of
   * interrupted saves. */
  entry_t *e;
  int n;
  DT_TRY(list_ckpts(dir, &e, &n));
  for (int i = keep > 0 ? keep : n; i < n; i++) {
    if (strcmp(e[i].name, base) == 0) continue;
    snprintf(lt, sizeof lt, "%s/%s", dir, e[i].name);
    if (unlink(lt) < 0) fprintf(stderr, "dtrain: warning: cannot remove old checkpoint %s: %s\n", lt, strerror(errno));
  }
  free(e);
  DIR *d = opendir(dir);
  struct dirent *de;
  size_t tl = strlen(tmp) - strlen(dir) - 1;
  while (d && (de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (strncmp(de->d_name, ".ckpt_", 6) == 0 && l > 7 && strcmp(de->d_name + l - 7, ".h5.tmp") == 0 &&
        strncmp(de->d_name, tmp + strlen(dir) + 1, tl) != 0) {
      snprintf(lt, sizeof lt, "%s/%s", dir, de->d_name);
      unlink(lt);
    }
  }
  if (d) closedir(d);
  if (fsync_path(dir, 1) < 0) return DT_ERR(DT_ERR_IO, "%s: fsync directory: %s", dir, strerror(errno));
  return DT_OK;
}

dt_status_t dt_ckpt_save(const void *mpi_comm, const char *dir, int keep, const dt_layout_t *lay,
                         const dt_ckpt_arenas_t *a, const dt_ckpt_state_t *st_in, char *path, size_t path_size) {
  MPI_Comm comm = dt_ckpt__comm(mpi_comm);
  int rank;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  long long step = rank == 0 && st_in ? (long long)st_in->step : -1;
  DT_MPI_CHECK(dt_wd_bcast(&step, 1, MPI_LONG_LONG, 0, comm, "bcast (checkpoint directory)"));
  char base[64], tmp[DT_PATH_MAX + 80], final[DT_PATH_MAX + 80];
  snprintf(base, sizeof base, "ckpt_%08lld.h5", step);
  snprintf(tmp, sizeof tmp, "%s/.ckpt_%08lld.h5.tmp", dir, step);
  snprintf(final, sizeof final, "%s/%s", dir, base);

  dt_status_t st = DT_OK;
  if (step < 0) st = DT_ERR(DT_ERR_ARG, "checkpoint save: rank 0 passed no state or a negative step");
  else if (strlen(dir) >= DT_PATH_MAX) st = DT_ERR(DT_ERR_ARG, "checkpoint directory name too long: %s", dir);
  else if (rank == 0 && mkdir_p(dir) < 0) st = DT_ERR(DT_ERR_IO, "%s: cannot create checkpoint directory: %s", dir, strerror(errno));
  DT_TRY(dt_ckpt__agree(comm, st));
  /* Every rank must see the directory (a node without the shared file system fails here). */
  if (access(dir, W_OK | X_OK) < 0) st = DT_ERR(DT_ERR_IO, "%s: checkpoint directory not writable: %s", dir, strerror(errno));
  DT_TRY(dt_ckpt__agree(comm, st));

  double t0 = dt_time_now();
  st = dt_ckpt_write(mpi_comm, tmp, lay, a, st_in);
  if (st == DT_OK && dt_ckpt__faulty(comm, "commit")) st = DT_ERR(DT_ERR_IO, "%s: simulated commit failure (test hook)", final);
  else if (st == DT_OK && rank == 0) st = commit(dir, tmp, final, base, keep);
  st = dt_ckpt__agree(comm, st);
  dt_ckpt__time(comm, "save: committed", t0);
  if (st != DT_OK && rank == 0) unlink(tmp);
  if (st == DT_OK && path) snprintf(path, path_size, "%s", final);
  return st;
}

/* Rank 0: why `path` is not a complete checkpoint ("" if it is one). Opens it serially. */
static void probe(const char *path, char *why, size_t n) {
  why[0] = '\0';
  dt_ckpt__h5_quiet();
  char m[400];
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    snprintf(why, n, "cannot open as HDF5 (%s)", dt_ckpt__h5msg(m, sizeof m));
    return;
  }
  int v = 0, c = 0;
  if (H5Aexists(f, "format_version") <= 0 || H5Aexists(f, "complete") <= 0) {
    snprintf(why, n, H5Aexists(f, "format_version") > 0 ? "no completion marker (the save did not finish)" : "not a dtrain checkpoint");
  } else {
    if (dt_ckpt__attr_get(f, "format_version", H5T_NATIVE_INT, &v) < 0) /* one value, or an error */
      snprintf(why, n, "format_version is not one integer");
    else if (dt_ckpt__attr_get(f, "complete", H5T_NATIVE_INT, &c) < 0)
      snprintf(why, n, "completion marker is not one integer");
    else if (v != DT_CKPT_FORMAT_VERSION) snprintf(why, n, "format_version %d, this dtrain reads %d", v, DT_CKPT_FORMAT_VERSION);
    else if (c != 1) snprintf(why, n, "completion marker is %d, not 1", c);
  }
  H5Eclear2(H5E_DEFAULT);
  H5Fclose(f);
}

dt_status_t dt_ckpt_find_latest(const void *mpi_comm, const char *dir, int64_t before_step, char *path,
                                 size_t path_size, int64_t *step) {
  MPI_Comm comm = dt_ckpt__comm(mpi_comm);
  int rank;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  struct { long long step; char path[DT_PATH_MAX + 300]; } r = {-1, ""};
  dt_status_t st = DT_OK;
  if (rank == 0) {
    entry_t *e = NULL;
    int n = 0;
    st = list_ckpts(dir, &e, &n);
    for (int i = 0; st == DT_OK && i < n && r.step < 0; i++) {
      if (before_step >= 0 && e[i].step >= before_step) continue;
      char p[DT_PATH_MAX + 300], why[600];
      snprintf(p, sizeof p, "%s/%s", dir, e[i].name);
      probe(p, why, sizeof why);
      if (why[0]) fprintf(stderr, "dtrain: skipping checkpoint %s: %s\n", p, why);
      else r.step = e[i].step, snprintf(r.path, sizeof r.path, "%s", p);
    }
    free(e);
    if (st == DT_OK && r.step < 0) st = DT_ERR(DT_ERR_CKPT, "%s: no complete checkpoint%s", dir, before_step >= 0 ? " older than the ones tried" : "");
  }
  st = dt_ckpt__agree(comm, st);
  DT_MPI_KEEP(st, dt_wd_bcast(&r, (int)sizeof r, MPI_BYTE, 0, comm, "bcast (checkpoint directory)"));
  if (st != DT_OK) return st;
  if (strlen(r.path) >= path_size) return DT_ERR(DT_ERR_ARG, "%s: path buffer too small", r.path);
  snprintf(path, path_size, "%s", r.path);
  if (step) *step = r.step;
  return DT_OK;
}

dt_status_t dt_ckpt_load_latest(const void *mpi_comm, const char *dir, const dt_layout_t *lay,
                                const dt_ckpt_arenas_t *a, dt_ckpt_state_t *st, char *path, size_t path_size) {
  MPI_Comm comm = dt_ckpt__comm(mpi_comm);
  int rank;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int64_t before = -1, step;
  int skipped = 0;
  for (;;) {
    dt_status_t f = dt_ckpt_find_latest(mpi_comm, dir, before, path, path_size, &step);
    if (f == DT_ERR_CKPT && skipped) {
      /* The arenas may hold parts of a rejected file: never start training on them, and never
       * rotate the user's (possibly repairable) checkpoints away by starting over. */
      dt_err_clear();
      return DT_ERR(DT_ERR_IO, "%s: all %d checkpoint(s) are unusable (reasons above); move them away or set "
                    "checkpoint.resume=never to start over", dir, skipped);
    }
    DT_TRY(f);
    dt_status_t s = dt_ckpt_load(mpi_comm, path, lay, a, st);
    if (s == DT_OK || s == DT_ERR_CONFIG || s == DT_ERR_NOMEM || s == DT_ERR_ARG) return s;
    if (rank == 0) fprintf(stderr, "dtrain: skipping checkpoint: %s\n", dt_err_msg());
    dt_err_clear();
    before = step;
    skipped++;
  }
}
