/* ZeRO's sparse device arenas (sparse.h) over CUDA's virtual memory management, and the CUDA
 * backend's clear and populate kernels over them (backend_cuda_int.h). Granule states:
 * OWN (its memory, read-write), PENDING (dropped: still its memory, all zeros, until the event
 * recorded after the drop's work says nothing queued uses it), ZERO (the shared zero granule,
 * read-only). Given-back memory goes to a spare list, never to the driver: the arena's memory is
 * then its shard plus the largest working set it has needed. */
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_int.h"
#include "cuda_check.h"
#include "sparse.h"

#define VMM_FUNCS(X)                                                                                     \
  X(cuGetErrorString) X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree)        \
  X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)

typedef struct {
#define FIELD(f) decltype(&::f) f;
  VMM_FUNCS(FIELD)
#undef FIELD
} vmm_t;

enum { G_OWN, G_PENDING, G_ZERO };

typedef struct {
  size_t g0, g1;  /* granules dropped together */
  unsigned seq;   /* their drop's number (a granule dropped again later carries a newer one) */
  cudaEvent_t ev; /* recorded after the drop's work */
} pend_t;

struct dt_cu_sparse {
  int device;
  size_t bytes, gran, n;            /* arena size, granule, granules */
  CUdeviceptr va;                   /* n granules, then the zero granule's own place */
  CUmemGenericAllocationHandle zero;
  CUmemAccess_flags zero_access;    /* READ, or READWRITE where the driver refuses read-only */
  CUmemGenericAllocationHandle *h;  /* per granule: its memory, or 0 (ZERO) */
  unsigned char *state;
  unsigned *seq;                    /* per granule: the drop that made it PENDING */
  CUmemGenericAllocationHandle *spare;
  size_t nspare, nown;              /* nown: granules with memory of their own (OWN, PENDING) */
  pend_t *pend;
  int npend, cap;
  unsigned next_seq;
};

static vmm_t g_vmm;
static int g_loaded; /* 1 loaded, -1 failed */

static dt_status_t load(void) {
  if (g_loaded > 0) return DT_OK;
  g_loaded = 1;
#define LOOK(f)                                                                                           \
  {                                                                                                       \
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;                               \
    void *p = NULL;                                                                                       \
    if (cudaGetDriverEntryPointByVersion(#f, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||          \
        q != cudaDriverEntryPointSuccess || !p)                                                           \
      g_loaded = -1;                                                                                      \
    g_vmm.f = (decltype(g_vmm.f))p;                                                                       \
  }
  VMM_FUNCS(LOOK)
#undef LOOK
  cudaGetLastError();
  if (g_loaded < 0)
    return DT_ERR(DT_ERR_CUDA, "cuda backend: the driver has no virtual memory management (cuMemCreate, cuMemMap: "
                               "ZeRO-2/3 need them for their device memory saving)");
  return DT_OK;
}

static dt_status_t cu_fail(CUresult r, const char *call) {
  const char *msg = NULL;
  if (!g_vmm.cuGetErrorString || g_vmm.cuGetErrorString(r, &msg) != CUDA_SUCCESS || !msg) msg = "unknown error";
  return DT_ERR(DT_ERR_CUDA, "cuda backend: %s failed: %s (error %d)", call, msg, (int)r);
}
#define CU_TRY(call)                          \
  do {                                        \
    CUresult r_ = g_vmm.call;                 \
    if (r_ != CUDA_SUCCESS) return cu_fail(r_, #call); \
  } while (0)

static CUmemAllocationProp prop_of(int device) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}

static CUmemAccessDesc access(const dt_cu_sparse_t *a, CUmemAccess_flags f) {
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = a->device;
  d.flags = f;
  return d;
}

static dt_status_t set_access(dt_cu_sparse_t *a, CUdeviceptr at, size_t size, CUmemAccess_flags f) {
  CUmemAccessDesc d = access(a, f);
  CU_TRY(cuMemSetAccess(at, size, &d, 1));
  return DT_OK;
}

static CUdeviceptr at(const dt_cu_sparse_t *a, size_t g) { return a->va + g * a->gran; }

/* Granule g gets memory of its own (a spare one, else new), read-write; not yet cleared. */
static dt_status_t own(dt_cu_sparse_t *a, size_t g) {
  CUmemGenericAllocationHandle h;
  if (a->nspare) h = a->spare[--a->nspare];
  else {
    CUmemAllocationProp p = prop_of(a->device);
    CU_TRY(cuMemCreate(&h, a->gran, &p, 0));
  }
  CU_TRY(cuMemMap(at(a, g), a->gran, 0, h, 0));
  a->h[g] = h;
  a->state[g] = G_OWN;
  a->nown++;
  return set_access(a, at(a, g), a->gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

/* The zero granule mapped at g (nothing mapped there now). */
static dt_status_t map_zero(dt_cu_sparse_t *a, size_t g) {
  CU_TRY(cuMemMap(at(a, g), a->gran, 0, a->zero, 0));
  CUmemAccessDesc d = access(a, a->zero_access);
  CUresult r = g_vmm.cuMemSetAccess(at(a, g), a->gran, &d, 1);
  if (r != CUDA_SUCCESS && a->zero_access == CU_MEM_ACCESS_FLAGS_PROT_READ) { /* no read-only mappings here */
    a->zero_access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d = access(a, a->zero_access);
    r = g_vmm.cuMemSetAccess(at(a, g), a->gran, &d, 1);
  }
  return r == CUDA_SUCCESS ? DT_OK : cu_fail(r, "cuMemSetAccess of the zero granule");
}

/* The zero granule in place of g's memory, which goes to the spare list. */
static dt_status_t to_zero(dt_cu_sparse_t *a, size_t g) {
  CU_TRY(cuMemUnmap(at(a, g), a->gran));
  a->spare[a->nspare++] = a->h[g];
  a->h[g] = 0;
  a->state[g] = G_ZERO;
  a->nown--;
  return map_zero(a, g);
}

/* The zero granule: mapped read-write at its own place once to be cleared; read-only where it
 * stands in for a dropped granule (read-write if this driver refuses that). */
static dt_status_t make_zero(dt_cu_sparse_t *a, cudaStream_t s) {
  CUmemAllocationProp p = prop_of(a->device);
  CU_TRY(cuMemCreate(&a->zero, a->gran, &p, 0));
  CU_TRY(cuMemMap(at(a, a->n), a->gran, 0, a->zero, 0));
  DT_TRY(set_access(a, at(a, a->n), a->gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  DT_CUDA_CHECK(cudaMemsetAsync((void *)(uintptr_t)at(a, a->n), 0, a->gran, s));
  a->zero_access = CU_MEM_ACCESS_FLAGS_PROT_READ;
  return DT_OK;
}

dt_status_t dt_cu_sparse_create(int device, size_t bytes, cudaStream_t s, dt_cu_sparse_t **out, void **base) {
  *out = NULL;
  DT_TRY(load());
  dt_cu_sparse_t *a = (dt_cu_sparse_t *)calloc(1, sizeof *a);
  if (!a) return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory");
  *out = a;
  a->device = device;
  a->bytes = bytes ? bytes : 1;
  CUmemAllocationProp p = prop_of(device);
  CU_TRY(cuMemGetAllocationGranularity(&a->gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  a->n = (a->bytes + a->gran - 1) / a->gran;
  a->h = (CUmemGenericAllocationHandle *)calloc(a->n, sizeof *a->h);
  a->spare = (CUmemGenericAllocationHandle *)calloc(a->n, sizeof *a->spare);
  a->state = (unsigned char *)calloc(a->n, 1);
  a->seq = (unsigned *)calloc(a->n, sizeof *a->seq);
  if (!a->h || !a->spare || !a->state || !a->seq) return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory");
  CU_TRY(cuMemAddressReserve(&a->va, (a->n + 1) * a->gran, a->gran, 0, 0));
  DT_TRY(make_zero(a, s));
  for (size_t g = 0; g < a->n; g++) { /* nothing backed yet: the first writes populate */
    a->state[g] = G_ZERO;
    DT_TRY(map_zero(a, g));
  }
  *base = (void *)(uintptr_t)a->va;
  return DT_OK;
}

int dt_cu_sparse_holds(const dt_cu_sparse_t *a, const void *p) {
  return a && (uintptr_t)p >= a->va && (uintptr_t)p < a->va + a->bytes;
}

/* Give back the memory of dropped granules whose work is done. */
static dt_status_t reclaim(dt_cu_sparse_t *a) {
  int k = 0;
  for (int i = 0; i < a->npend; i++) {
    pend_t *e = &a->pend[i];
    cudaError_t q = cudaEventQuery(e->ev);
    if (q == cudaErrorNotReady) {
      a->pend[k++] = *e;
      continue;
    }
    if (q != cudaSuccess) DT_CUDA_CHECK(q);
    for (size_t g = e->g0; g < e->g1; g++)
      if (a->state[g] == G_PENDING && a->seq[g] == e->seq) DT_TRY(to_zero(a, g));
    DT_CUDA_CHECK(cudaEventDestroy(e->ev));
  }
  a->npend = k;
  return DT_OK;
}

/* [lo, hi) = 0 on the stream where granules have memory of their own (OWN: PENDING ones are zeros
 * already, ZERO ones read-only), in runs. */
static dt_status_t clear(dt_cu_sparse_t *a, size_t lo, size_t hi, cudaStream_t s) {
  size_t run = hi;
  for (size_t g = lo / a->gran; g * a->gran < hi; g++) {
    size_t b = g * a->gran > lo ? g * a->gran : lo;
    if (a->state[g] == G_OWN) {
      if (run == hi) run = b;
    } else if (run < hi) {
      DT_CUDA_CHECK(cudaMemsetAsync((void *)(uintptr_t)(a->va + run), 0, b - run, s));
      run = hi;
    }
  }
  if (run < hi) DT_CUDA_CHECK(cudaMemsetAsync((void *)(uintptr_t)(a->va + run), 0, hi - run, s));
  return DT_OK;
}

dt_status_t dt_cu_sparse_drop(dt_cu_sparse_t *a, size_t lo, size_t hi, cudaStream_t s) {
  if (hi > a->bytes) hi = a->bytes;
  if (lo >= hi) return DT_OK;
  DT_TRY(clear(a, lo, hi, s));
  size_t g0 = (lo + a->gran - 1) / a->gran, g1 = hi == a->bytes ? a->n : hi / a->gran;
  if (g0 < g1) {
    unsigned seq = ++a->next_seq;
    int any = 0;
    for (size_t g = g0; g < g1; g++)
      if (a->state[g] == G_OWN) {
        a->state[g] = G_PENDING;
        a->seq[g] = seq;
        any = 1;
      }
    if (any) {
      if (a->npend == a->cap) {
        int cap = a->cap ? 2 * a->cap : 16;
        pend_t *q = (pend_t *)realloc(a->pend, (size_t)cap * sizeof *q);
        if (!q) return DT_ERR(DT_ERR_NOMEM, "cuda backend: out of memory");
        a->pend = q;
        a->cap = cap;
      }
      pend_t *e = &a->pend[a->npend];
      DT_CUDA_CHECK(cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming));
      DT_CUDA_CHECK(cudaEventRecord(e->ev, s));
      e->g0 = g0;
      e->g1 = g1;
      e->seq = seq;
      a->npend++;
    }
  }
  return reclaim(a);
}

dt_status_t dt_cu_sparse_populate(dt_cu_sparse_t *a, size_t lo, size_t hi, cudaStream_t s) {
  if (hi > a->bytes) hi = a->bytes;
  if (lo >= hi) return DT_OK;
  DT_TRY(reclaim(a));
  size_t g0 = lo / a->gran, g1 = (hi + a->gran - 1) / a->gran, run = g1;
  for (size_t g = g0; g <= g1; g++) {
    if (g < g1 && a->state[g] == G_PENDING) a->state[g] = G_OWN; /* its memory is still there, zeros */
    if (g < g1 && a->state[g] == G_ZERO) {
      CU_TRY(cuMemUnmap(at(a, g), a->gran));
      DT_TRY(own(a, g));
      if (run == g1) run = g;
    } else if (run < g1) { /* clear the run of granules just given memory */
      DT_CUDA_CHECK(cudaMemsetAsync((void *)(uintptr_t)at(a, run), 0, (g - run) * a->gran, s));
      run = g1;
    }
  }
  return DT_OK;
}

void dt_cu_sparse_usage(const dt_cu_sparse_t *a, size_t *now, size_t *peak, size_t *size) {
  *now = a ? (a->nown + a->nspare + 1) * a->gran : 0;
  *peak = *now; /* memory given back stays as spares, so the memory behind never shrinks */
  *size = a ? a->n * a->gran : 0;
}

void dt_cu_sparse_free(dt_cu_sparse_t *a) {
  if (!a) return;
  cudaDeviceSynchronize();
  for (int i = 0; i < a->npend; i++) cudaEventDestroy(a->pend[i].ev);
  if (a->va && g_loaded > 0) {
    for (size_t g = 0; g < a->n && a->state; g++)
      if (a->h[g] || a->state[g] == G_ZERO) {
        g_vmm.cuMemUnmap(at(a, g), a->gran);
        if (a->h[g]) g_vmm.cuMemRelease(a->h[g]);
      }
    for (size_t i = 0; i < a->nspare; i++) g_vmm.cuMemRelease(a->spare[i]);
    if (a->zero) {
      g_vmm.cuMemUnmap(at(a, a->n), a->gran);
      g_vmm.cuMemRelease(a->zero);
    }
    g_vmm.cuMemAddressFree(a->va, (a->n + 1) * a->gran);
  }
  free(a->h);
  free(a->spare);
  free(a->state);
  free(a->seq);
  free(a->pend);
  free(a);
}

/* ---- the backend's clear and populate (backend_cuda_int.h) ------------------------------------ */

/* The sparse arena that holds x and x's byte offset in it, else NULL. */
static dt_cu_sparse_t *sparse_of(dt_backend_t *be, const float *x, size_t *off) {
  cu_impl_t *im = impl(be);
  if (dt_cu_sparse_holds(im->sp_params, x)) return *off = (size_t)(x - be->params) * sizeof(float), im->sp_params;
  if (dt_cu_sparse_holds(im->sp_grads, x)) return *off = (size_t)(x - be->grads) * sizeof(float), im->sp_grads;
  if (dt_cu_sparse_holds(im->sp_wparams, x)) /* 16-bit storage: the offset in bytes, not floats */
    return *off = (size_t)((const char *)x - (const char *)be->wparams), im->sp_wparams;
  return NULL;
}

dt_status_t dt_cu_arena_clear(dt_backend_t *be, float *x, size_t n) {
  size_t off = 0;
  dt_cu_sparse_t *a = n ? sparse_of(be, x, &off) : NULL;
  if (a) return dt_cu_sparse_drop(a, off, off + n * sizeof(float), impl(be)->compute);
  if (n) DT_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), impl(be)->compute));
  return DT_OK;
}

dt_status_t dt_cu_arena_populate(dt_backend_t *be, float *x, size_t n) {
  size_t off = 0;
  dt_cu_sparse_t *a = n ? sparse_of(be, x, &off) : NULL;
  return a ? dt_cu_sparse_populate(a, off, off + n * sizeof(float), impl(be)->compute) : DT_OK;
}

extern "C" void dt_cuda_print_sparse(const dt_backend_t *be, FILE *out) {
  const cu_impl_t *im = (const cu_impl_t *)be->impl;
  if (!im || (!im->sp_params && !im->sp_grads)) return;
  const double M = 1048576.0;
  fprintf(out, "# memory: rank 0 sparse device arenas (ZeRO, memory only where in use)");
  const char *name[3] = {"parameters", "gradients", "working copy"};
  const dt_cu_sparse_t *a[3] = {im->sp_params, im->sp_grads, im->sp_wparams};
  for (int i = 0; i < 3; i++) {
    size_t now, peak, size;
    if (!a[i]) continue;
    dt_cu_sparse_usage(a[i], &now, &peak, &size);
    fprintf(out, "; %s %.1f MiB now, %.1f MiB at most, of %.1f MiB", name[i], now / M, peak / M, size / M);
  }
  fputc('\n', out);
}
