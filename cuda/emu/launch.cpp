/* CUDA emulation: kernel launches. A launch is checked at once against the limits of an sm_90
 * device, as the driver does: grid.x in [1, 2^31-1], grid.y and grid.z in [1, 65535], block
 * dimensions in [1, 1024] x [1, 1024] x [1, 64] with at most 1024 threads, dynamic shared memory
 * at most 48 KiB unless cudaFuncSetAttribute raised the kernel's limit (at most 227 KiB). A launch
 * over a limit is not queued; it returns cudaErrorInvalidConfiguration (shared memory:
 * cudaErrorInvalidValue) and leaves it for cudaGetLastError, with a line naming the kernel. A
 * good launch is queued on its stream and runs when the stream does (exec.cpp). Static __shared__
 * sizes are the compiler's to check (ptxas rejects more than 48 KiB). */
#include <stdio.h>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "emu_int.h"

namespace dt_emu {

static std::map<const void *, int> g_smem_optin; /* kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize */
static const size_t SMEM_DEFAULT = 48 << 10, SMEM_OPTIN_MAX = 227 << 10;

cudaError_t launch_check(const dt_emu_launch_t *l, int dev) {
  (void)dev;
  const dim3 &g = l->grid, &b = l->block;
  const char *why = NULL;
  char buf[160];
  if (g.x < 1 || g.x > 2147483647u) why = "grid.x outside [1, 2147483647]";
  else if (g.y < 1 || g.y > 65535) why = "grid.y outside [1, 65535]";
  else if (g.z < 1 || g.z > 65535) why = "grid.z outside [1, 65535]";
  else if (b.x < 1 || b.x > 1024) why = "block.x outside [1, 1024]";
  else if (b.y < 1 || b.y > 1024) why = "block.y outside [1, 1024]";
  else if (b.z < 1 || b.z > 64) why = "block.z outside [1, 64]";
  else if ((unsigned long long)b.x * b.y * b.z > 1024) why = "more than 1024 threads per block";
  cudaError_t e = cudaErrorInvalidConfiguration;
  if (!why) {
    auto it = g_smem_optin.find(l->func);
    size_t lim = it == g_smem_optin.end() ? SMEM_DEFAULT : (size_t)it->second;
    if (l->shmem > lim) {
      snprintf(buf, sizeof buf, "%zu bytes of dynamic shared memory exceed the kernel's %zu%s", l->shmem, lim,
               it == g_smem_optin.end() ? " (raise it with cudaFuncSetAttribute)" : "");
      why = buf;
      e = cudaErrorInvalidValue;
    }
  }
  if (!why) return cudaSuccess;
  char msg[400];
  snprintf(msg, sizeof msg, "launch of kernel %s<<<(%u,%u,%u), (%u,%u,%u), %zu>>>: %s", l->name, g.x, g.y, g.z, b.x,
           b.y, b.z, l->shmem, why);
  if (!quiet()) fprintf(stderr, "dt_emu: %s\n", msg);
  return fail(e, "%s", msg);
}

/* DTRAIN_EMU_LAUNCH_LOG=FILE: the name of every kernel launched, once each, appended to FILE
 * (tests/emu_parity.sh: which kernels the parity program really ran). */
static void log_launch(const char *name) {
  static std::set<std::string> seen;
  const char *path = env_str("DTRAIN_EMU_LAUNCH_LOG");
  if (!path || !seen.insert(name).second) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "%s\n", name);
  fclose(f);
}

}  // namespace dt_emu

using namespace dt_emu;

cudaError_t dt_emu_submit(dt_emu_launch_t *l, cudaStream_t stream) {
  std::shared_ptr<dt_emu_launch_t> p(new dt_emu_launch_t(*l), [](dt_emu_launch_t *x) {
    x->destroy(x->ctx);
    delete x;
  });
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  stream_t *s = get_stream(stream, &e);
  if (!s) return e;
  if ((e = launch_check(p.get(), s->device)) != cudaSuccess) return e;
  log_launch(p->name);
  op_t op;
  op.what = p->name;
  for (int i = 0; i < p->nptr; i++) { /* it may write from the pointer to the end of its allocation */
    const alloc_t *x = p->ptr_written[i] && heap_contains(p->ptr[i]) ? heap_find(p->ptr[i]) : NULL;
    if (x) op.writes.push_back(range_t{(uintptr_t)p->ptr[i], x->base + x->size});
  }
  int dev = s->device;
  op.run = [p, dev]() { exec_kernel(p.get(), dev); };
  enqueue(s, std::move(op));
  return cudaSuccess;
}

extern "C" cudaError_t dt_emu_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not emulated", (int)attr);
  if (value < 0 || (size_t)value > SMEM_OPTIN_MAX)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: %d bytes of dynamic shared memory (at most %zu)", value,
                SMEM_OPTIN_MAX);
  g_smem_optin[func] = value;
  return cudaSuccess;
}
