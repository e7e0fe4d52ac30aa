/* MPI error recording (DT_MPI_CHECK's dt__mpi_error), start-up (dt_mpi_init), the host name,
 * dt_comm_abort and dt_mpi_agree: what every MPI-using module shares (mpi_check.h, comm.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "mpi_check.h"
#include "watchdog.h"

const char *dt__hostname(void) {
  static char host[256];
  if (!host[0]) {
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown-host");
    host[sizeof host - 1] = '\0';
  }
  return host;
}

int dt_mpi_init(int *argc, char ***argv, int *rank) {
  int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  *rank = 0;
  if (rc == MPI_SUCCESS) MPI_Comm_rank(MPI_COMM_WORLD, rank);
  dt_err_set_rank(*rank);
  return rc;
}

static int err_world_rank(void) {
  if (dt_err_rank() >= 0) return dt_err_rank();
  int init = 0, fin = 0, r = -1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

dt_status_t dt__mpi_error(int rc, const char *call, const char *file, int line) {
  char estr[MPI_MAX_ERROR_STRING + 1] = "";
  int elen = 0;
  if (MPI_Error_string(rc, estr, &elen) != MPI_SUCCESS) snprintf(estr, sizeof estr, "error code %d", rc);
  int fn = (int)strcspn(call, "(");
  return dt_err_set(DT_ERR_MPI, file, line, "%s:%d: rank %d (host %s): %.*s failed: %s", file, line,
                    err_world_rank(), dt__hostname(), fn, call, estr);
}

void dt_comm_abort(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  fflush(stdout);
  fflush(stderr);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

dt_status_t dt_mpi_agree(MPI_Comm comm, dt_status_t st) {
  int rank = 0, size = 1;
  DT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DT_MPI_CHECK(MPI_Comm_size(comm, &size));
  int mine = st != DT_OK ? rank : size, first = size;
  DT_MPI_CHECK(dt_wd_allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, "allreduce (error agreement)"));
  if (first == size) return DT_OK;
  struct {
    int code;
    char msg[1020];
  } b;
  memset(&b, 0, sizeof b);
  if (rank == first) {
    b.code = (int)st;
    snprintf(b.msg, sizeof b.msg, "%s", dt_err_msg());
  }
  DT_MPI_CHECK(dt_wd_bcast(&b, (int)sizeof b, MPI_BYTE, first, comm, "broadcast (error agreement)"));
  if (rank != first) {
    dt_err_clear();
    dt_err_set((dt_status_t)b.code, __FILE__, __LINE__, "%s", b.msg);
  }
  return (dt_status_t)b.code;
}
