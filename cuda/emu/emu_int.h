/* CUDA emulation internals shared by the .cpp files of cuda/emu: the device heap (heap.cpp), errors and
 * devices (runtime.cpp), stream queues (stream.cpp), the SIMT executor (exec.cpp, fiber.cpp).
 * Not for the .cu files: they see only cuda_runtime.h, cublas_v2.h and nccl.h. */
#ifndef DT_EMU_INT_H
#define DT_EMU_INT_H

#include <stdint.h>

#include <deque>
#include <functional>
#include <vector>

#include "cuda_runtime.h"

namespace dt_emu {

/* ---- configuration and errors (runtime.cpp) ------------------------------------------------- */
int device_count(void);          /* DTRAIN_EMU_DEVICES, default 1 */
size_t device_mem(void);         /* bytes per device: DTRAIN_EMU_MEM_MB, default 16384 */
int current_device(void);
const char *env_str(const char *name);
/* A non-sticky error of the current API call: remembered for cudaGetLastError, printed. */
cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A sticky error on device dev (the context is unusable afterwards, as on a GPU). */
void fail_sticky(int dev, cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
cudaError_t sticky(int dev);
/* cudaSuccess, or the sticky error of the current device (also remembered as the last error). */
cudaError_t entry(void);
int quiet(void); /* DTRAIN_EMU_QUIET=1: no diagnostics on stderr */
/* "dt_emu: <message>" on stderr unless quiet(); EMU_BAD(r, fmt, ...) says it and is r (the NCCL
 * and driver API emulations' failures). */
void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define EMU_BAD(r, ...) (dt_emu::diag(__VA_ARGS__), (r))
/* A planted bug of the emulation itself (src/core/fault.h's DTRAIN_FAULT, this process's MPI rank from
 * the launcher's environment), for tests/emu_bugs.sh:
 *   emu_skip_sync   cudaStreamSynchronize returns without running the stream
 *   emu_no_barrier  __syncthreads() does nothing (every kernel lacks its barriers) */
int planted(const char *name);

/* ---- device heap (heap.cpp) ------------------------------------------------------------------ */
struct alloc_t {
  uintptr_t base;   /* what cudaMalloc returned */
  size_t size;      /* bytes asked for */
  uintptr_t lo, hi; /* the pages made accessible while device work runs (slack included) */
  int device;
  int live;
  int vmm;          /* a cuMemAddressReserve range: its pages are vmm.cpp's (mapped or not, with the
                       access of cuMemSetAccess, not switched by heap_open/close) */
  unsigned long id; /* 1, 2, ... in order of allocation */
};
cudaError_t heap_alloc(int device, size_t size, void **out);
cudaError_t heap_free(void *p);
int heap_contains(const void *p); /* inside the device address range at all */
/* The allocation (live or freed) that contains p, else NULL. */
const alloc_t *heap_find(const void *p);
/* "byte B of allocation #N (S bytes, device D)" or what p is near, for messages. */
void heap_describe(const void *p, char *out, size_t n);
/* [p, p+n) inside one live allocation of device dev: 0; else a message in why, -1. */
int heap_check_range(const void *p, size_t n, int dev, char *why, size_t nwhy);
/* Make every live allocation accessible (nested) / inaccessible again. */
void heap_open(void);
void heap_close(void);
/* The first allocation whose canary bytes around it changed: 0 and a message; else -1. */
int heap_check_canaries(char *why, size_t n);
size_t heap_used(int device);
/* Physical memory of device dev taken (delta > 0: 0 when it does not fit, else 1) or given back. */
int heap_account(int device, long long delta);
/* cuMemAddressReserve: size bytes (page multiple) of address range with nothing mapped, recorded
 * as an allocation (vmm = 1) for the range checks and messages; heap_unreserve ends it. */
cudaError_t heap_reserve(int device, size_t size, size_t align, void **out);
cudaError_t heap_unreserve(void *p, size_t size);
/* vmm.cpp: what is mapped at a, for messages. */
void vmm_describe(uintptr_t a, char *out, size_t n);
int host_pinned(const void *p, size_t n); /* inside a cudaMallocHost block (runtime.cpp) */

/* ---- streams (stream.cpp) -------------------------------------------------------------------- */
struct range_t {
  uintptr_t lo, hi;
};
struct stream_t;
struct op_t {
  const char *what = "";         /* kernel name or API call, for messages */
  std::function<void()> run;     /* the work; empty for a wait */
  std::function<bool()> step;    /* or work that waits for peers (NCCL's): called until it returns
                                    true; the stream stays at this op until then */
  stream_t *wait_s = nullptr;    /* a wait: run wait_s up to wait_seq first */
  uint64_t wait_seq = 0;
  std::vector<range_t> writes;   /* device bytes it may write (hazard check of host reads) */
};
struct stream_t {
  int device, id;
  unsigned flags;
  int legacy, destroyed;
  std::deque<op_t> q;
  uint64_t enq, done;            /* ops queued / run so far */
  uint64_t legacy_seen;          /* blocking stream: the legacy stream's count it already waits for */
  std::vector<uint64_t> seen;    /* legacy stream: per stream id, the count it already waits for */
};
/* The stream behind a handle (NULL and cudaStreamLegacy: the current device's legacy stream). */
stream_t *get_stream(cudaStream_t s, cudaError_t *err);
void enqueue(stream_t *s, op_t op);
op_t wait_op(stream_t *on, uint64_t seq); /* an op that runs `on` up to its op number seq */
void run_until(stream_t *s, uint64_t seq);
/* The same without waiting: 0 when an op that waits for peers (step) is not finished yet. */
int try_run_until(stream_t *s, uint64_t seq);
void run_stream(stream_t *s);
/* The stream op running on this thread (its name: a cuBLAS call, a memset, an NCCL call), else NULL:
 * for the fault handler's message. */
const char *stream_op(void);
void sync_device(int dev);
/* A host call that blocks until device work is done on a real GPU (stream, event and device
 * synchronisation, a copy to pageable host memory, cudaFree): counted by name, printed at exit
 * with DTRAIN_EMU_WAITS=1 (how many times a program stalls its GPU's queue). */
void note_host_wait(const char *call);
void drop_device_streams(int dev);
/* Ops still queued on other streams of the device that may write [lo, hi): their description in
 * out, 1; else 0. For reads done synchronously by the host. */
int pending_writer(int dev, uintptr_t lo, uintptr_t hi, const stream_t *except, char *out, size_t n);

/* ---- the SIMT executor (exec.cpp) ------------------------------------------------------------ */
/* Limits check of a launch on device dev: cudaSuccess or the error (with its message set). */
cudaError_t launch_check(const dt_emu_launch_t *l, int dev);
/* Runs the whole grid; a fault or a misuse found inside sets the device's sticky error. */
void exec_kernel(const dt_emu_launch_t *l, int dev);
/* Called by the fault handler while a kernel runs: "kernel K block (..) thread (..)" or NULL. */
const char *exec_where(void);
/* Called by the fault handler: abandon the running kernel (does not return) if one runs. */
void exec_abandon(void);
/* fiber.cpp: the guard pages below fiber stacks (stack overflow in a kernel) */
int fiber_guard(const void *p);

}  // namespace dt_emu

#endif
