/* CUDA emulation: the memory calls. cudaMalloc/cudaFree on the device heap (heap.cpp; cudaFree
 * first waits for the device, as CUDA does), pinned host memory (cudaMallocHost/cudaHostAlloc),
 * and copies and memsets as stream work with CUDA's host synchronisation rules:
 *   cudaMemcpy        to host: runs the legacy stream up to the copy (so it waits for blocking
 *                     streams, not for cudaStreamNonBlocking ones); from pageable host memory:
 *                     copies the source at the call, the device write is queued; device to
 *                     device: queued.
 *   cudaMemcpyAsync   from pageable memory: source copied at the call; to pageable memory: runs
 *                     the stream up to the copy; pinned memory on either side: read or written
 *                     only when the stream runs (a host read before a synchronisation is stale).
 *   cudaMemset(Async) queued.
 * Device ranges must lie inside one live allocation (else cudaErrorInvalidValue). A synchronous
 * read by the host of bytes that work queued on another stream may still write is reported
 * (cudaErrorIllegalState): the copy is not ordered after that work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <memory>

#include "emu_int.h"

namespace dt_emu {

static std::map<uintptr_t, size_t> g_pinned; /* start -> bytes */

int host_pinned(const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return 0;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

static const char *kind_name(int k) {
  static const char *n[] = {"host to host", "host to device", "device to host", "device to device", "default"};
  return k >= 0 && k <= 4 ? n[k] : "unknown";
}

/* The kind a copy really is; an error when the pointers contradict the kind asked for. */
static cudaError_t resolve_kind(const char *call, void *dst, const void *src, size_t n, int kind, int *out) {
  int dd = heap_contains(dst), sd = heap_contains(src);
  int real = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice) : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  if (kind < 0 || kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d", call, kind);
  if (kind != cudaMemcpyDefault && kind != real)
    return fail(cudaErrorInvalidValue, "%s (%s) of %zu bytes: dst %p is %s memory and src %p is %s memory", call,
                kind_name(kind), n, dst, dd ? "device" : "host", src, sd ? "device" : "host");
  char why[256];
  if (dd && heap_check_range(dst, n, -1, why, sizeof why))
    return fail(cudaErrorInvalidValue, "%s of %zu bytes: destination %s", call, n, why);
  if (sd && heap_check_range(src, n, -1, why, sizeof why))
    return fail(cudaErrorInvalidValue, "%s of %zu bytes: source %s", call, n, why);
  *out = real;
  return cudaSuccess;
}

/* Queue dst <- src on s. stage: copy the host source now. Returns the op's position. */
static uint64_t queue_copy(stream_t *s, const char *call, void *dst, const void *src, size_t n, int stage) {
  op_t op;
  op.what = call;
  if (heap_contains(dst)) op.writes.push_back(range_t{(uintptr_t)dst, (uintptr_t)dst + n});
  if (stage) {
    auto buf = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
    op.run = [dst, buf, n]() { memcpy(dst, buf->data(), n); };
  } else {
    op.run = [dst, src, n]() { memmove(dst, src, n); };
  }
  enqueue(s, std::move(op));
  return s->enq;
}

/* Run s up to the copy at `seq` that the host waits for; report unordered writers of src. */
static cudaError_t host_read(stream_t *s, uint64_t seq, const char *call, const void *src, size_t n) {
  note_host_wait(call);
  run_until(s, seq);
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  char why[400];
  if (pending_writer(s->device, (uintptr_t)src, (uintptr_t)src + n, s, why, sizeof why)) {
    char d[256], msg[768];
    heap_describe(src, d, sizeof d);
    snprintf(msg, sizeof msg, "%s (device to host) of %zu bytes at %p (%s): %s; synchronise that stream or make this "
             "one wait for an event recorded after it", call, n, src, d, why);
    if (!quiet()) fprintf(stderr, "dt_emu: %s\n", msg);
    e = fail(cudaErrorIllegalState, "%s", msg);
  }
  return e;
}

static cudaError_t memcpy_common(const char *call, void *dst, const void *src, size_t n, int kind, cudaStream_t stream,
                                 int is_async) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  stream_t *s = get_stream(stream, &e);
  if (!s) return e;
  int real;
  if ((e = resolve_kind(call, dst, src, n, kind, &real)) != cudaSuccess || n == 0) return e;
  switch (real) {
    case cudaMemcpyHostToHost:
      if (!is_async) {
        memmove(dst, src, n);
        return cudaSuccess;
      }
      queue_copy(s, call, dst, src, n, !host_pinned(src, n));
      return cudaSuccess;
    case cudaMemcpyHostToDevice: {
      uint64_t at = queue_copy(s, call, dst, src, n, !host_pinned(src, n));
      if (!is_async) note_host_wait(call);
      if (!is_async && host_pinned(src, n)) run_until(s, at);
      return entry();
    }
    case cudaMemcpyDeviceToHost: {
      uint64_t at = queue_copy(s, call, dst, src, n, 0);
      if (!is_async || !host_pinned(dst, n)) return host_read(s, at, call, src, n);
      return cudaSuccess;
    }
    default: queue_copy(s, call, dst, src, n, 0); return cudaSuccess;
  }
}

static cudaError_t memset_common(const char *call, void *p, int value, size_t n, cudaStream_t stream) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  stream_t *s = get_stream(stream, &e);
  if (!s) return e;
  char why[256];
  if (n == 0) return cudaSuccess;
  if (heap_check_range(p, n, -1, why, sizeof why)) return fail(cudaErrorInvalidValue, "%s of %zu bytes: %s", call, n, why);
  op_t op;
  op.what = call;
  op.writes.push_back(range_t{(uintptr_t)p, (uintptr_t)p + n});
  op.run = [p, value, n]() { memset(p, value, n); };
  enqueue(s, std::move(op));
  return cudaSuccess;
}

}  // namespace dt_emu

using namespace dt_emu;

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t size) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  if (device_count() == 0) return fail(cudaErrorNoDevice, "DTRAIN_EMU_DEVICES=0: the emulation has no devices");
  if (!ptr) return fail(cudaErrorInvalidValue, "cudaMalloc: NULL pointer");
  if (size == 0) {
    *ptr = NULL;
    return cudaSuccess;
  }
  return heap_alloc(current_device(), size, ptr);
}

cudaError_t cudaFree(void *ptr) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  if (!ptr) return cudaSuccess;
  const alloc_t *x = heap_find(ptr);
  if (x && x->live) { /* cudaFree waits for the device */
    note_host_wait("cudaFree");
    sync_device(x->device);
  }
  if ((e = entry()) != cudaSuccess) return e;
  return heap_free(ptr);
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  (void)flags;
  if (!ptr) return fail(cudaErrorInvalidValue, "cudaHostAlloc: NULL pointer");
  void *p = NULL;
  if (posix_memalign(&p, 4096, size ? size : 1) != 0) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc of %zu bytes", size);
  g_pinned[(uintptr_t)p] = size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void *ptr) {
  if (!ptr) return cudaSuccess;
  auto it = g_pinned.find((uintptr_t)ptr);
  if (it == g_pinned.end()) return fail(cudaErrorInvalidValue, "cudaFreeHost(%p): not from cudaMallocHost", ptr);
  g_pinned.erase(it);
  free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  *total_bytes = device_mem();
  *free_bytes = device_mem() - heap_used(current_device());
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return memcpy_common("cudaMemcpy", dst, src, count, kind, NULL, 0);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  return memcpy_common("cudaMemcpyAsync", dst, src, count, kind, stream, 1);
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
  return memset_common("cudaMemset", ptr, value, count, NULL);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
  return memset_common("cudaMemsetAsync", ptr, value, count, stream);
}

}  // extern "C"
