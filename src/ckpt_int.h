/* Internals shared by ckpt.c (file contents) and ckpt_dir.c (commit protocol, find, rotation):
 * agreement on a status over the communicator, HDF5 error text, the fault-injection hook. */
#ifndef DT_CKPT_INT_H
#define DT_CKPT_INT_H

#include <mpi.h>

#include "status.h"

/* Collective: every rank returns the status of the lowest failing rank (DT_OK if none), and
 * ranks that did not fail record "rank R: <its message>". */
dt_status_t dt_ckpt__agree(MPI_Comm comm, dt_status_t st);
/* Innermost and outermost messages of the current HDF5 error stack (then cleared). */
const char *dt_ckpt__h5msg(char *buf, size_t n);
/* Turn off HDF5's automatic error printing (we report errors ourselves). */
void dt_ckpt__h5_quiet(void);
/* 1 if the test hook asks this rank to fail at `phase`. */
int dt_ckpt__faulty(MPI_Comm comm, const char *phase);
/* Communicator from the API's `const void *mpi_comm` (NULL = MPI_COMM_WORLD). */
MPI_Comm dt_ckpt__comm(const void *mpi_comm);

#endif
