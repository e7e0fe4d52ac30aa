/* CUDA emulation: the driver's virtual memory management (cuda.h: cuMemAddressReserve, cuMemCreate,
 * cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree), reached through
 * cudaGetDriverEntryPointByVersion as on a GPU. A reserved range is a heap allocation with nothing
 * mapped (heap_reserve); physical memory is a piece of one memory file per process (memfd), filled
 * with 0xff bytes when created and counted as device memory in use; cuMemMap maps it shared at the
 * address, so one piece can appear at several addresses (as CUDA allows). Each mapping has the
 * access its cuMemSetAccess gave (none until then), at all times: unlike other device memory it is
 * not closed to the host outside device work (each granule is its own kernel mapping, and
 * switching thousands of them at every stream run made ZeRO-3 runs 4x slower). So a kernel, a
 * copy or the host that writes a read-only mapping, or touches an address with nothing mapped,
 * faults, with the kernel's name where one runs; a host read of a mapped part is not caught.
 * As in CUDA: cuMemUnmap takes whole mappings only, and a piece's memory goes back once it is
 * released and no longer mapped. DTRAIN_EMU_GRANULE sets the granularity (default the page
 * size, so that small test models show the savings; a GPU reports 2 MiB). */
#define _GNU_SOURCE 1
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <iterator>
#include <map>

#include "cuda.h"
#include "emu_int.h"

namespace dt_emu {

struct phys_t {
  off_t off;
  size_t size;
  int device, released, maps;
};
struct map_t {
  size_t size;
  CUmemGenericAllocationHandle h;
  int prot; /* PROT_NONE, PROT_READ or PROT_READ | PROT_WRITE */
};

static int g_fd = -1;
static off_t g_fd_end;
static std::map<CUmemGenericAllocationHandle, phys_t> &g_phys = *new std::map<CUmemGenericAllocationHandle, phys_t>;
static std::map<uintptr_t, map_t> &g_maps = *new std::map<uintptr_t, map_t>; /* by address */
static CUmemGenericAllocationHandle g_next_h = 1;

static size_t granule(void) {
  const char *e = env_str("DTRAIN_EMU_GRANULE");
  size_t page = (size_t)sysconf(_SC_PAGESIZE), g = e ? (size_t)atoll(e) : page;
  return g < page || g % page ? page : g;
}

static void apply(uintptr_t va, const map_t &m) {
  if (mprotect((void *)va, m.size, m.prot) != 0) {
    perror("dt_emu: mprotect");
    abort();
  }
}

void vmm_describe(uintptr_t a, char *out, size_t n) {
  auto it = g_maps.upper_bound(a);
  if (it != g_maps.begin() && a < (--it)->first + it->second.size) {
    const int p = it->second.prot;
    snprintf(out, n, "mapped %s", p == (PROT_READ | PROT_WRITE) ? "read-write" : p == PROT_READ ? "read-only" : "with no access");
    return;
  }
  snprintf(out, n, "nothing mapped there");
}

/* The live reserved range that holds [va, va + size), else NULL. */
static const alloc_t *reserved(uintptr_t va, size_t size) {
  const alloc_t *x = heap_contains((void *)va) ? heap_find((void *)va) : NULL;
  return x && x->live && x->vmm && va + size <= x->base + x->size ? x : NULL;
}

static void give_back(CUmemGenericAllocationHandle h) {
  phys_t &p = g_phys[h];
  fallocate(g_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, p.off, (off_t)p.size);
  heap_account(p.device, -(long long)p.size);
  g_phys.erase(h);
}

}  // namespace dt_emu

using namespace dt_emu;

extern "C" {

CUresult cuGetErrorString(CUresult error, const char **pStr) {
  switch (error) {
    case CUDA_SUCCESS: *pStr = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *pStr = "out of memory"; break;
    case CUDA_ERROR_NOT_PERMITTED: *pStr = "operation not permitted"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *pStr = "operation not supported"; break;
    default: *pStr = "unknown error"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags o) {
  (void)o;
  if (!g || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: not pinned device memory");
  *g = granule();
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long f) {
  (void)addr, (void)f; /* the address is a hint */
  void *p = NULL;
  if (size % granule()) return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: %zu bytes, not a granule multiple", size);
  if (heap_reserve(current_device(), size, alignment, &p) != cudaSuccess) {
    cudaGetLastError();
    return EMU_BAD(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve of %zu bytes failed", size);
  }
  *ptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  auto it = g_maps.lower_bound((uintptr_t)ptr);
  if (it != g_maps.end() && it->first < (uintptr_t)ptr + size)
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree(0x%llx): the range still has mappings", ptr);
  if (heap_unreserve((void *)(uintptr_t)ptr, size) != cudaSuccess) {
    cudaGetLastError();
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree(0x%llx, %zu): not a reserved range", ptr, size);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long f) {
  (void)f;
  if (!h || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      prop->location.id < 0 || prop->location.id >= device_count())
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: not pinned memory of an existing device");
  if (size == 0 || size % granule()) return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: %zu bytes, not a granule multiple", size);
  if (g_fd < 0 && (g_fd = memfd_create("dt_emu_vmm", 0)) < 0) return EMU_BAD(CUDA_ERROR_OUT_OF_MEMORY, "memfd_create failed");
  if (!heap_account(prop->location.id, (long long)size))
    return EMU_BAD(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate of %zu bytes: device %d is full", size, prop->location.id);
  phys_t p = {g_fd_end, size, prop->location.id, 0, 0};
  void *m = MAP_FAILED;
  if (ftruncate(g_fd, g_fd_end + (off_t)size) == 0)
    m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, p.off);
  if (m == MAP_FAILED) {
    heap_account(prop->location.id, -(long long)size);
    return EMU_BAD(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate of %zu bytes: no host memory", size);
  }
  memset(m, 0xff, size); /* fresh device memory is not zero */
  munmap(m, size);
  g_fd_end += (off_t)size;
  *h = g_next_h++;
  g_phys[*h] = p;
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  auto it = g_phys.find(h);
  if (it == g_phys.end() || it->second.released) return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemRelease(%llu): not a live handle", h);
  it->second.released = 1;
  if (it->second.maps == 0) give_back(h);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long f) {
  (void)f;
  uintptr_t va = (uintptr_t)ptr;
  auto it = g_phys.find(h);
  if (it == g_phys.end() || it->second.released) return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemMap: handle %llu is not live", h);
  if (size == 0 || size % granule() || va % granule() || offset % granule() || offset + size > it->second.size)
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemMap(0x%llx, %zu, offset %zu): not granule-aligned or past the handle's %zu bytes",
                ptr, size, offset, it->second.size);
  if (!reserved(va, size)) return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemMap(0x%llx, %zu): not inside a reserved range", ptr, size);
  auto next = g_maps.lower_bound(va);
  if ((next != g_maps.end() && next->first < va + size) ||
      (next != g_maps.begin() && std::prev(next)->first + std::prev(next)->second.size > va))
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemMap(0x%llx, %zu): part of it is mapped already", ptr, size);
  if (mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, g_fd, it->second.off + (off_t)offset) == MAP_FAILED)
    return EMU_BAD(CUDA_ERROR_OUT_OF_MEMORY, "cuMemMap: mmap failed");
  g_maps[va] = map_t{size, h, PROT_NONE};
  it->second.maps++;
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  uintptr_t va = (uintptr_t)ptr;
  auto it = g_maps.find(va);
  if (it == g_maps.end() || it->second.size != size)
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap(0x%llx, %zu): not one whole mapping (CUDA unmaps no sub-range)", ptr, size);
  if (mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap: mmap failed");
  CUmemGenericAllocationHandle h = it->second.h;
  g_maps.erase(it);
  phys_t &p = g_phys[h];
  if (--p.maps == 0 && p.released) give_back(h);
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  uintptr_t va = (uintptr_t)ptr, end = va + size;
  if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: one device location expected");
  int prot = desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
             : desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                               : PROT_NONE;
  for (uintptr_t a = va; a < end;) { /* fully mapped, whole mappings */
    auto it = g_maps.find(a);
    if (it == g_maps.end() || a + it->second.size > end)
      return EMU_BAD(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess(0x%llx, %zu): not a fully mapped range", ptr, size);
    a += it->second.size;
  }
  for (auto it = g_maps.find(va); it != g_maps.end() && it->first < end; ++it) {
    it->second.prot = prot;
    apply(it->first, it->second);
  }
  return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult *status) {
  (void)version, (void)flags;
  static const struct {
    const char *name;
    void *f;
  } table[] = {
      {"cuGetErrorString", (void *)cuGetErrorString},
      {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
      {"cuMemAddressReserve", (void *)cuMemAddressReserve},
      {"cuMemAddressFree", (void *)cuMemAddressFree},
      {"cuMemCreate", (void *)cuMemCreate},
      {"cuMemRelease", (void *)cuMemRelease},
      {"cuMemMap", (void *)cuMemMap},
      {"cuMemUnmap", (void *)cuMemUnmap},
      {"cuMemSetAccess", (void *)cuMemSetAccess},
  };
  *fn = NULL;
  for (const auto &t : table)
    if (!strcmp(symbol, t.name)) *fn = t.f;
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

}  // extern "C"
