/* Checkpoint internals (dt_ckpt__*), shared by ckpt.c, ckpt_write.c, ckpt_read.c and ckpt_dir.c:
 * agreement on a status over the communicator, HDF5 error text and attributes, the fault hook,
 * and the boxes that map our arenas onto the Hugging Face file layout. */
#ifndef DT_CKPT_INT_H
#define DT_CKPT_INT_H

#include <mpi.h>

#include "ckpt.h"
#include "mpi_check.h"
#include "status.h"

/* Collective: every rank returns the status of the lowest failing rank (DT_OK if none), and
 * ranks that did not fail record "rank R: <its message>". */
dt_status_t dt_ckpt__agree(MPI_Comm comm, dt_status_t st);
/* Innermost and outermost messages of the current HDF5 error stack (then cleared). */
const char *dt_ckpt__h5msg(char *buf, size_t n);
/* Turn off HDF5's automatic error printing (we report errors ourselves). */
void dt_ckpt__h5_quiet(void);
/* 1 if the test hook asks this rank (its MPI_COMM_WORLD rank) to fail at `phase`. */
int dt_ckpt__faulty(MPI_Comm comm, const char *phase);
/* Replicated arenas (model and optimizer ranges `full` on every rank: pure data parallelism): the
 * file needs only one rank per node. Sets *use = 1, *node (the ranks of this shared-memory
 * node) and *lead (the node leaders, node rank 0, ordered by rank; MPI_COMM_NULL on the others);
 * *use = 0 (nothing set) when some rank holds boxes, every node has one rank, or
 * DTRAIN_CKPT_WRITERS=all asks for every rank to take part (DTRAIN_CKPT_WRITERS=K: groups of K
 * consecutive ranks act as nodes, for tests). Collective over comm. */
dt_status_t dt_ckpt__node_leaders(MPI_Comm comm, const dt_ckpt_arenas_t *a, MPI_Comm *lead, MPI_Comm *node, int *use);
dt_status_t dt_ckpt__node_leaders_free(MPI_Comm *lead, MPI_Comm *node);
/* The ranks of this rank's shared-memory node (MPI_Comm_split_type); DTRAIN_CKPT_WRITERS=K makes
 * groups of K consecutive ranks act as nodes, =all every rank its own node (tests). Collective. */
dt_status_t dt_ckpt__node_comm(MPI_Comm comm, MPI_Comm *node);
/* Barrier that sleeps while it waits (MPI_Ibarrier + 0.2 ms naps): ranks with no I/O wait here
 * without taking the cores from the node leaders doing it. */
dt_status_t dt_ckpt__quiet_barrier(MPI_Comm comm);
/* DTRAIN_CKPT_TIMES set: rank 0 prints "# ckpt-time <what> <s since t0>" to stderr (benchmarks). */
void dt_ckpt__time(MPI_Comm comm, const char *what, double t0);
double dt_ckpt__cpu(void); /* this process's CPU seconds so far (user + system) */
/* Communicator from the API's `const void *mpi_comm` (NULL = MPI_COMM_WORLD). */
MPI_Comm dt_ckpt__comm(const void *mpi_comm);

/* ---- shared by ckpt_write.c and ckpt_read.c ---- */
/* Large datasets (>= DT_CKPT_OWN_MIN bytes) move through dtrain's own file descriptors at the
 * dataset's file offset (H5Dget_offset), O_DIRECT where the file system takes it, in chunks of
 * DT_CKPT_CHUNK bytes through DT_CKPT_ALIGN-aligned buffers: writes of replicated arenas
 * (ckpt_write.c) and every read (ckpt_read.c). DTRAIN_CKPT_DIRECT=0: everything through HDF5;
 * DTRAIN_CKPT_DIRECT=buffered: own descriptors without O_DIRECT. */
#define DT_CKPT_ALIGN 4096u
#define DT_CKPT_OWN_MIN (1u << 20)
#define DT_CKPT_CHUNK (16u << 20)
int dt_ckpt__own_io(void);
/* A DT_CKPT_ALIGN-aligned staging buffer of n bytes in huge pages where the kernel has them
 * (large O_DIRECT requests); NULL when out of memory. Free with dt_ckpt__io_buf_free(p, n). */
void *dt_ckpt__io_buf(size_t n);
void dt_ckpt__io_buf_free(void *p, size_t n);
/* The alignment of file offset and memory that O_DIRECT on descriptor fd needs (statx
 * STATX_DIOALIGN where the kernel tells, else DT_CKPT_ALIGN); 0 for fd < 0. */
size_t dt_ckpt__dio_align(int fd);
/* An O_DIRECT descriptor of path (flags: O_RDONLY or O_WRONLY), or -1 when the file system refuses
 * it, the OS has none, or DTRAIN_CKPT_DIRECT=buffered asks for plain descriptors. */
int dt_ckpt__open_direct(const char *path, int flags);
/* Up to n bytes at off; the bytes read (fewer only at end of file), -1 on error (EINTR retried). */
ssize_t dt_ckpt__pread_full(int fd, void *buf, size_t n, uint64_t off);
/* len bytes of the file at off into dst: where file offset and dst agree modulo the direct-I/O
 * alignment *al, the aligned middle straight from fd_direct into dst, the rest through the
 * DT_CKPT_CHUNK bounce buffer (O_DIRECT reads of aligned covers, or plain reads from fd_buf when
 * O_DIRECT is unavailable or refuses: *al = 0 from then on). 0, or -1 with errno. */
int dt_ckpt__read_own(int fd_direct, int fd_buf, char *bounce, uint64_t off, size_t len, char *dst, size_t *al);
#include <hdf5.h>

#include "ckpt.h"
#include "mpi_check.h"

/* The file access list of the MPI-IO driver over comm and a collective transfer list (independent
 * MPI-IO underneath unless DTRAIN_CKPT_TWO_PHASE=1): what a save and a load open the file with. */
void dt_ckpt__mpio_plists(MPI_Comm comm, hid_t *fapl, hid_t *dxpl);

#define DT_CKPT_GROUPS 3 /* /model, /optim/exp_avg, /optim/exp_avg_sq */

/* A box in file coordinates (the arena's too): rows [r0, r1) x cols [c0, c1) of a tensor. */
typedef struct { hsize_t r0, r1, c0, c1; const dt_ckpt_range_t *src; } fbox_t;

/* File shape of a tensor and its (FR, FC) matrix view: (1, n) for 1-D tensors, the dims for 2-D
 * ones, (OC, C * KH * KW) for 4-D convolution weights (OC, C, KH, KW), which is the arena's layout
 * (a box that cuts a 4-D tensor's row, at a ZeRO shard's bound, is selected as the hyperslabs of
 * its pieces: dt_ckpt__select_box). */
typedef struct {
  int ndim;
  hsize_t dims[4];
  hsize_t FR, FC;
} fshape_t;

/* The datasets of one file: n_tensors per group, names "/model/<name>" etc. */
typedef struct {
  int n_ds;
  hid_t *ds;
  char (*names)[96];
  uint64_t *bytes;
} dsets_t;

/* A save's CRC32C runs: contiguous byte ranges of a dataset this rank wrote, each with its CRC;
 * rank 0 checks that they tile every dataset and combines them (ckpt_write.c). */
typedef struct { uint64_t ds, off, len; uint32_t crc, pad; } seg_t;

typedef struct {
  seg_t *s;
  size_t n, cap;
} segs_t;

/* Add bytes [off, off+len) of dataset ds (data) to the runs, extending the last run when it
 * continues it. Runs on packing threads: no DT_ERR here (one global message buffer); -1 = out
 * of memory. */
int dt_ckpt__segs_add(segs_t *g, uint64_t ds, uint64_t off, const void *data, uint64_t len);
/* This rank's byte range of every dataset in `own` (part rank of size, split at DT_CKPT_ALIGN),
 * written at its file offset foff[d] through fd_direct (O_DIRECT, -1 none) or fd_buf, packed on
 * a helper thread one chunk ahead of the writes, CRC runs into segs (ckpt_own.c). *n_direct
 * counts O_DIRECT bytes. */
dt_status_t dt_ckpt__write_own(const dt_layout_t *lay, const dt_ckpt_arenas_t *a, const dsets_t *D, const int *own,
                               const uint64_t *foff, int rank, int size, int fd_direct, int fd_buf, segs_t *segs,
                               uint64_t *n_direct, const char *path);

/* Record an HDF5 failure about object `obj` of file `path` (DT_ERR_HDF5). */
dt_status_t dt_ckpt__h5err(const char *path, const char *obj, const char *what);
int dt_ckpt__is_wte(const dt_tensor_t *t);
/* Rows of the global tensor in our layout as far as the file is concerned (wte: true V). */
int dt_ckpt__hf_rows(const dt_layout_t *lay, const dt_tensor_t *t);
fshape_t dt_ckpt__fshape(const dt_layout_t *lay, const dt_tensor_t *t);
/* Explicit boxes from `in`: its own list, or for full = 1 whole tensors (split = 0) or this
 * rank's 1/P of each tensor's first file dimension (split = 1, contiguous in the file). */
dt_status_t dt_ckpt__ranges_resolve(const dt_layout_t *lay, const dt_ckpt_ranges_t *in, int split, int rank, int size,
                                    dt_ckpt_ranges_t *out);
fbox_t dt_ckpt__to_file(const dt_ckpt_range_t *r);
/* Local float index of file element (i, j) of box b. */
size_t dt_ckpt__local_index(const fbox_t *b, hsize_t i, hsize_t j);
/* Select file box b in space sp (SET or OR). */
herr_t dt_ckpt__select_box(hid_t sp, const fshape_t *f, const fbox_t *b, H5S_seloper_t op);
herr_t dt_ckpt__select_rows(hid_t sp, const fshape_t *f, hsize_t lo, hsize_t hi);
/* This rank's share [*a, *z) of the first file dimension split evenly over `size` ranks. */
void dt_ckpt__split_first(const fshape_t *f, int rank, int size, hsize_t *a, hsize_t *z);
/* Boxes of rs on tensor ti as file boxes sorted by first column; returns their number. */
int dt_ckpt__boxes_of(const dt_ckpt_ranges_t *rs, int ti, fbox_t *out);
/* Floats in the largest tensor (file shape). */
size_t dt_ckpt__max_tensor(const dt_layout_t *lay);
herr_t dt_ckpt__attr_put(hid_t loc, const char *name, hid_t ftype, hid_t mtype, const void *val);
herr_t dt_ckpt__attr_get(hid_t loc, const char *name, hid_t mtype, void *val);
herr_t dt_ckpt__attr_put_str(hid_t loc, const char *name, const char *s);
herr_t dt_ckpt__attr_get_str(hid_t loc, const char *name, char *buf, size_t n);
dt_status_t dt_ckpt__dsets_init(dsets_t *D, const dt_layout_t *lay, int groups);
/* ckpt_meta.c, a load's metadata: the completion marker, format and shapes against lay (and the
 * state's scalars into s); the datasets opened with their stored CRCs; the state's datasets (RNG,
 * effective ini). Every rank calls them; errors name the file and the object. */
dt_status_t dt_ckpt__check_header(hid_t file, const dt_layout_t *lay, dt_ckpt_state_t *s, const char *path);
dt_status_t dt_ckpt__open_dsets(hid_t file, const dt_layout_t *lay, dsets_t *D, uint32_t *stored, const char *path);
dt_status_t dt_ckpt__read_state_data(hid_t file, dt_ckpt_state_t *s, hid_t dxpl, const char *path);
void dt_ckpt__dsets_free(dsets_t *D);

#endif
