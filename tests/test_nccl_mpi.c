/* NCCL communicator set-up without a GPU (run by tests/nccl_mpi.sh under mpirun):
 *   id          rank 0's ncclGetUniqueId reaches every rank byte for byte (MPI allgather of the
 *               128 bytes, compared with rank 0's; not all zero).
 *   init-nodev  dt_comm_nccl_create with device -1: every rank reaches ncclCommInitRankConfig,
 *               which fails without a GPU; every rank must return DT_ERR_NCCL, none may hang.
 *   init-dev    device 0 on every rank: cudaSetDevice fails; every rank must return an error.
 *   init-rank1  only rank 1 asks for device 0 (fails), the others for -1: every rank must return
 *               rank 1's error, and nobody may be left inside ncclCommInitRankConfig.
 * Exit 0 when every rank saw what is expected, 1 otherwise. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "dt_cuda.h"
#include "status.h"

static int check_id(int rank, int size) {
  unsigned char id[DT_NCCL_ID_BYTES], all[64 * DT_NCCL_ID_BYTES];
  MPI_Comm w = MPI_COMM_WORLD;
  if (size > 64) return 1;
  dt_status_t st = dt_comm_nccl_unique_id(&w, id);
  int ok = st == DT_OK;
  if (!ok) printf("rank %d: dt_comm_nccl_unique_id failed: %s\n", rank, dt_err_msg());
  MPI_Allgather(id, DT_NCCL_ID_BYTES, MPI_BYTE, all, DT_NCCL_ID_BYTES, MPI_BYTE, w);
  if (rank == 0 && ok) {
    int nonzero = 0;
    for (int i = 0; i < DT_NCCL_ID_BYTES; i++) nonzero |= all[i] != 0;
    if (!nonzero) {
      printf("rank 0: the NCCL unique id is all zero\n");
      ok = 0;
    }
    for (int r = 1; r < size; r++) {
      int same = memcmp(all, all + (size_t)r * DT_NCCL_ID_BYTES, DT_NCCL_ID_BYTES) == 0;
      printf("rank %d: id bytes %s rank 0's (128 bytes compared, first 4: %02x%02x%02x%02x)\n", r,
             same ? "identical to" : "DIFFER from", all[r * DT_NCCL_ID_BYTES], all[r * DT_NCCL_ID_BYTES + 1],
             all[r * DT_NCCL_ID_BYTES + 2], all[r * DT_NCCL_ID_BYTES + 3]);
      ok &= same;
    }
  }
  return ok ? 0 : 1;
}

static int check_init(int rank, int size, const char *mode) {
  MPI_Comm w = MPI_COMM_WORLD;
  int device = !strcmp(mode, "init-nodev") ? -1 : !strcmp(mode, "init-dev") ? 0 : rank == 1 ? 0 : -1;
  dt_comm_t *c = NULL;
  dt_status_t st = dt_comm_nccl_create(&w, device, 20.0, &c);
  int ok = st != DT_OK && c == NULL;
  if (!strcmp(mode, "init-nodev")) ok &= st == DT_ERR_NCCL && strstr(dt_err_msg(), "ncclCommInitRank") != NULL;
  if (!strcmp(mode, "init-dev")) ok &= st == DT_ERR_CUDA && strstr(dt_err_msg(), "cudaSetDevice") != NULL;
  if (!strcmp(mode, "init-rank1")) ok &= st == DT_ERR_CUDA && strstr(dt_err_msg(), "rank 1 ") != NULL;
  printf("rank %d: device %d: dt_comm_nccl_create returned %s: %s -> %s\n", rank, device, dt_status_str(st),
         dt_err_msg(), ok ? "as expected" : "UNEXPECTED");
  if (c) c->ops->free(c);
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, w);
  if (rank == 0) printf("%s: %d ranks, %s\n", mode, size, all ? "every rank returned the expected error" : "FAIL");
  return all ? 0 : 1;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dt_err_set_rank(rank);
  const char *mode = argc > 1 ? argv[1] : "id";
  int rc = !strcmp(mode, "id") ? check_id(rank, size) : check_init(rank, size, mode);
  fflush(stdout);
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
