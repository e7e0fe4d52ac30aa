/* ZeRO's sparse device arenas (issue #21): a parameter (ZeRO-3) or gradient (ZeRO-2/3) arena that
 * keeps the whole model's addresses, so the model and the collectives use it as any arena, but has
 * memory behind only the parts in use: this rank's shard, and what a gather or backward is using
 * now. As madvise(MADV_DONTNEED) on the CPU's host arenas (zero.c), with CUDA's virtual memory
 * management: the range is reserved once, every granule (2 MiB on a GPU) is mapped either to
 * memory of its own (read-write) or to one shared granule of zeros (read-only), so reading a
 * dropped part gives zeros, as on the CPU, and writing it is an illegal address.
 *   drop:     [lo, hi) cleared on the stream where it has memory; the granules entirely inside
 *             give their memory back once the work queued before now is done (an event: no host
 *             wait), to a spare list that later populates take from;
 *   populate: every granule touching [lo, hi) gets memory again, cleared on the stream (it was
 *             all zeros), before the next use; granules not yet given back simply stay.
 * The driver calls come through cudaGetDriverEntryPointByVersion (no link to libcuda: a machine
 * without a GPU still starts dtrain). */
#ifndef DT_CU_SPARSE_H
#define DT_CU_SPARSE_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "status.h"

typedef struct dt_cu_sparse dt_cu_sparse_t;

/* An arena of `bytes` on `device` that reads as zeros once `s` has run and has no memory of its
 * own yet (the first writers populate); *base its start. */
dt_status_t dt_cu_sparse_create(int device, size_t bytes, cudaStream_t s, dt_cu_sparse_t **out, void **base);
/* Does a hold p (inside its arena)? */
int dt_cu_sparse_holds(const dt_cu_sparse_t *a, const void *p);
/* Byte offsets [lo, hi) of the arena, as above. */
dt_status_t dt_cu_sparse_drop(dt_cu_sparse_t *a, size_t lo, size_t hi, cudaStream_t s);
dt_status_t dt_cu_sparse_populate(dt_cu_sparse_t *a, size_t lo, size_t hi, cudaStream_t s);
/* Device memory behind the arena now and at most so far (own, spare and the zero granule: the
 * same, as spares are kept), and the arena's size, bytes. */
void dt_cu_sparse_usage(const dt_cu_sparse_t *a, size_t *now, size_t *peak, size_t *size);
/* After the device has finished with it. NULL is fine. */
void dt_cu_sparse_free(dt_cu_sparse_t *a);

#endif
