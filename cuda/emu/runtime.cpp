/* CUDA emulation: devices and errors. The emulated devices are sm_90 parts (an H100 SXM's
 * limits), DTRAIN_EMU_DEVICES of them (default 1; 0 = no device, as on a machine without GPUs),
 * each with DTRAIN_EMU_MEM_MB of memory (default 16384). Errors follow the runtime: a failing call
 * returns its code and leaves it for cudaGetLastError, which clears it; a fault inside a kernel
 * is sticky: every later call on that device returns it and cudaGetLastError does not clear it.
 * cudaGetErrorString appends what the emulation found ("kernel ... wrote 4 bytes past the end of
 * allocation #3") to the runtime's message when the code is the one that detail belongs to. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_int.h"

extern "C" {
#include "fault.h"
}

namespace dt_emu {

struct device_t {
  cudaError_t sticky;
  char detail[768];
};

static std::vector<device_t> g_dev;
static int g_ndev = -1;
static thread_local int t_cur;
static thread_local cudaError_t t_last;
static char g_detail[768];
static cudaError_t g_detail_code;

const char *env_str(const char *name) {
  const char *e = getenv(name);
  return e && *e ? e : NULL;
}

int device_count(void) {
  if (g_ndev < 0) {
    const char *e = env_str("DTRAIN_EMU_DEVICES");
    g_ndev = e ? atoi(e) : 1;
    if (g_ndev < 0) g_ndev = 0;
    if (g_ndev > 64) g_ndev = 64;
    g_dev.assign((size_t)g_ndev, device_t{});
  }
  return g_ndev;
}

size_t device_mem(void) {
  const char *e = env_str("DTRAIN_EMU_MEM_MB");
  long long mb = e ? atoll(e) : 16384;
  return (size_t)(mb > 0 ? mb : 16384) << 20;
}

int quiet(void) {
  const char *e = env_str("DTRAIN_EMU_QUIET");
  return e && strcmp(e, "0") != 0;
}

void diag(const char *fmt, ...) {
  if (quiet()) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "dt_emu: %s\n", msg);
}

int current_device(void) { return t_cur; }

int planted(const char *name) {
  const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  int rank = 0;
  for (const char *v : vars)
    if (env_str(v)) {
      rank = atoi(env_str(v));
      break;
    }
  return dt_fault(name, rank, -1);
}

cudaError_t fail(cudaError_t e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_detail, sizeof g_detail, fmt, ap);
  va_end(ap);
  g_detail_code = e;
  t_last = e;
  return e;
}

void fail_sticky(int dev, cudaError_t e, const char *fmt, ...) {
  device_count();
  if (dev < 0 || dev >= g_ndev) dev = 0;
  if (g_ndev == 0 || g_dev[dev].sticky != cudaSuccess) return; /* the first fault is the one reported */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_dev[dev].detail, sizeof g_dev[dev].detail, fmt, ap);
  va_end(ap);
  g_dev[dev].sticky = e;
  if (!quiet()) fprintf(stderr, "dt_emu: device %d: %s\n", dev, g_dev[dev].detail);
}

cudaError_t sticky(int dev) {
  return dev >= 0 && dev < device_count() ? g_dev[dev].sticky : cudaSuccess;
}

cudaError_t entry(void) {
  cudaError_t s = sticky(t_cur);
  if (s != cudaSuccess) t_last = s;
  return s;
}

}  // namespace dt_emu

using namespace dt_emu;

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
  *count = device_count();
  if (*count == 0) return fail(cudaErrorNoDevice, "DTRAIN_EMU_DEVICES=0: the emulation has no devices");
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  int n = device_count();
  if (n == 0) return fail(cudaErrorNoDevice, "DTRAIN_EMU_DEVICES=0: the emulation has no devices");
  if (device < 0 || device >= n)
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): the emulation has %d device%s (DTRAIN_EMU_DEVICES)",
                device, n, n == 1 ? "" : "s");
  t_cur = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (device_count() == 0) return fail(cudaErrorNoDevice, "DTRAIN_EMU_DEVICES=0: the emulation has no devices");
  *device = t_cur;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d)", device);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "dtrain CUDA emulation (sm_90, H100 limits)");
  p->totalGlobalMem = device_mem();
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = 227 << 10;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->clockRate = 1980000;
  p->totalConstMem = 65536;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->l2CacheSize = 50 << 20;
  p->maxThreadsPerMultiProcessor = 2048;
  p->memoryBusWidth = 5120;
  p->pciBusID = device + 1;
  p->unifiedAddressing = 1;
  p->concurrentKernels = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice, "cudaDeviceGetPCIBusId(%d)", device);
  if (!bus_id || len < 13) return fail(cudaErrorInvalidValue, "cudaDeviceGetPCIBusId: buffer of %d bytes", len);
  snprintf(bus_id, (size_t)len, "0000:%02x:00.0", device + 1);
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute(%d): not emulated", (int)attr);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  note_host_wait("cudaDeviceSynchronize");
  sync_device(t_cur);
  return entry();
}

/* Drops the device's queued work and its sticky error (allocations stay: dtrain never resets). */
cudaError_t cudaDeviceReset(void) {
  if (device_count() == 0) return fail(cudaErrorNoDevice, "DTRAIN_EMU_DEVICES=0: the emulation has no devices");
  drop_device_streams(t_cur);
  g_dev[t_cur].sticky = cudaSuccess;
  g_dev[t_cur].detail[0] = '\0';
  t_last = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t s = sticky(t_cur);
  if (s != cudaSuccess) return s;
  cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  cudaError_t s = sticky(t_cur);
  return s != cudaSuccess ? s : t_last;
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define N(x) \
  case x: return #x;
    N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInitializationError)
    N(cudaErrorInvalidConfiguration) N(cudaErrorInvalidMemcpyDirection) N(cudaErrorInvalidDeviceFunction)
    N(cudaErrorNoDevice) N(cudaErrorInvalidDevice) N(cudaErrorInvalidResourceHandle) N(cudaErrorIllegalState)
    N(cudaErrorNotReady) N(cudaErrorIllegalAddress) N(cudaErrorLaunchOutOfResources) N(cudaErrorLaunchFailure)
    N(cudaErrorNotSupported) N(cudaErrorUnknown)
#undef N
  }
  return "cudaErrorUnknown";
}

static const char *base_string(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t e) {
  static char buf[8][1024];
  static int next;
  const char *d = NULL;
  if (e != cudaSuccess && e == sticky(t_cur) && g_dev[t_cur].detail[0]) d = g_dev[t_cur].detail;
  else if (e != cudaSuccess && e == g_detail_code && g_detail[0]) d = g_detail;
  if (!d) return base_string(e);
  char *b = buf[next++ % 8];
  snprintf(b, sizeof buf[0], "%s (CUDA emulation: %s)", base_string(e), d);
  return b;
}

}  // extern "C"
