/* DT_MPI_CHECK: the one way dtrain calls MPI. A failing call records
 * "file:line: rank R (host H): MPI_Xxx failed: <MPI's error string>" as the dt_err message and
 * returns DT_ERR_MPI from the enclosing function. Only meaningful on communicators whose error
 * handler is MPI_ERRORS_RETURN (every communicator dtrain creates). Internal header. */
#ifndef DT_MPI_CHECK_H
#define DT_MPI_CHECK_H

#include <mpi.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For code that runs on to a cleanup label or a collective agreement: the first failing call's
 * error goes into the dt_status_t st (left alone when st already holds an error). */
#define DT_MPI_KEEP(st, call)                                                                \
  do {                                                                                       \
    int dt_mpi_rc_ = (call);                                                                 \
    if (dt_mpi_rc_ != MPI_SUCCESS && (st) == DT_OK) (st) = dt__mpi_error(dt_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

/* Record the failure of `call` (its source text) with return code rc; returns DT_ERR_MPI. */
dt_status_t dt__mpi_error(int rc, const char *call, const char *file, int line);
/* Collective over comm: every rank returns the status of the lowest failing rank, with that
 * rank's dt_err message recorded (DT_OK when no rank failed), so no rank goes on alone. */
dt_status_t dt_mpi_agree(MPI_Comm comm, dt_status_t st);
/* MPI_Init_thread(FUNNELED), as every dtrain command starts MPI; sets *rank (0 if MPI_Init
 * failed) and dt_err's rank; returns MPI's return code. */
int dt_mpi_init(int *argc, char ***argv, int *rank);
/* Hostname of this process (cached, never NULL). */
const char *dt__hostname(void);

#ifdef __cplusplus
}
#endif

#define DT_MPI_CHECK(call)                                                           \
  do {                                                                               \
    int dt_mpi_rc_ = (call);                                                         \
    if (dt_mpi_rc_ != MPI_SUCCESS) return dt__mpi_error(dt_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

#endif
