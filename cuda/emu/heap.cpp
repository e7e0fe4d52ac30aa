/* CUDA emulation: device memory. One reserved address range (PROT_NONE) holds every device
 * allocation; each gets its own pages, ends 256-byte aligned right before an inaccessible guard
 * page, and is kept inaccessible except while device work runs (heap_open/close around stream
 * work), so a host load or store into device memory faults. Fresh memory is filled with 0xff
 * bytes (NaN as float/double, -1 as int); the slack before and after an allocation holds canary
 * bytes that the executor checks after every kernel. Freed ranges are never reused, so a late
 * access faults too. The SIGSEGV handler names the kernel and the allocation (or the host). */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "emu_int.h"

namespace dt_emu {

static const unsigned char CANARY = 0xdb, POISON = 0xff;
static const size_t ALIGN = 256;     /* cudaMalloc's alignment */
static const size_t CANARY_FRONT = 256;

static char *g_base;
static size_t g_reserved, g_page;
static uintptr_t g_next;
static std::vector<alloc_t> g_allocs; /* in address order (addresses only grow) */
static std::vector<size_t> g_used;    /* bytes per device */
static std::vector<size_t> g_peak;    /* most bytes in use at once, per device (DTRAIN_EMU_PEAK) */
static int g_open, g_protect = -1;
static struct sigaction g_old_segv;

static int protect_on(void) {
  if (g_protect < 0) {
    const char *e = env_str("DTRAIN_EMU_PROTECT");
    g_protect = !(e && !strcmp(e, "0"));
  }
  return g_protect;
}

static void on_segv(int sig, siginfo_t *si, void *ucv);

/* DTRAIN_EMU_PEAK=1: one line per device at exit, the most device memory in use at once. */
static void print_peak(void) {
  for (size_t d = 0; d < g_peak.size(); d++)
    fprintf(stderr, "dt_emu: device %zu peak memory in use %zu bytes\n", d, g_peak[d]);
}

static void heap_init(void) {
  if (g_base) return;
  g_page = (size_t)sysconf(_SC_PAGESIZE);
  for (size_t gib = 256; gib >= 4 && !g_base; gib /= 2) {
    void *p = mmap(NULL, gib << 30, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      g_base = (char *)p;
      g_reserved = gib << 30;
    }
  }
  if (!g_base) {
    fprintf(stderr, "dt_emu: cannot reserve an address range for device memory\n");
    abort();
  }
  g_next = (uintptr_t)g_base + g_page;
  if (env_str("DTRAIN_EMU_PEAK") && strcmp(env_str("DTRAIN_EMU_PEAK"), "0") != 0) atexit(print_peak);
  /* faults on a fiber's guard page need a stack of their own */
  static char altstack[1 << 16];
  stack_t ss = {};
  ss.ss_sp = altstack;
  ss.ss_size = sizeof altstack;
  sigaltstack(&ss, NULL);
  struct sigaction sa = {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
}

int heap_contains(const void *p) {
  uintptr_t a = (uintptr_t)p;
  return g_base && a >= (uintptr_t)g_base && a < (uintptr_t)g_base + g_reserved;
}

/* The allocation whose pages (guard page after it included) contain p. */
static alloc_t *find_span(uintptr_t a) {
  size_t lo = 0, hi = g_allocs.size();
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_allocs[mid].hi + g_page <= a) lo = mid + 1;
    else hi = mid;
  }
  if (lo < g_allocs.size() && g_allocs[lo].lo <= a) return &g_allocs[lo];
  return NULL;
}

const alloc_t *heap_find(const void *p) {
  alloc_t *x = find_span((uintptr_t)p);
  return x && (uintptr_t)p >= x->base && (uintptr_t)p < x->base + x->size ? x : NULL;
}

void heap_describe(const void *p, char *out, size_t n) {
  uintptr_t a = (uintptr_t)p;
  alloc_t *x = heap_contains(p) ? find_span(a) : NULL;
  if (!x) {
    snprintf(out, n, "%s", heap_contains(p) ? "in no allocation" : "not device memory");
    return;
  }
  const char *st = x->live ? "" : "freed ";
  if (x->vmm && a >= x->base && a < x->base + x->size) {
    char m[120];
    vmm_describe(a, m, sizeof m);
    snprintf(out, n, "byte %zu of %sreserved range #%lu (%zu bytes, device %d; %s)", (size_t)(a - x->base), st, x->id,
             x->size, x->device, m);
    return;
  }
  if (a < x->base)
    snprintf(out, n, "%zu bytes before the start of %sallocation #%lu (%zu bytes, device %d)", (size_t)(x->base - a), st,
             x->id, x->size, x->device);
  else if (a >= x->base + x->size)
    snprintf(out, n, "%zu bytes past the end of %sallocation #%lu (%zu bytes, device %d)",
             (size_t)(a - x->base - x->size), st, x->id, x->size, x->device);
  else
    snprintf(out, n, "byte %zu of %sallocation #%lu (%zu bytes, device %d)", (size_t)(a - x->base), st, x->id, x->size,
             x->device);
}

int heap_check_range(const void *p, size_t n, int dev, char *why, size_t nwhy) {
  const alloc_t *x = heap_contains(p) ? heap_find(p) : NULL;
  char d[256];
  if (!x || !x->live) {
    heap_describe(p, d, sizeof d);
    snprintf(why, nwhy, "%p is %s", p, d);
    return -1;
  }
  if ((uintptr_t)p + n > x->base + x->size) {
    snprintf(why, nwhy, "%zu bytes at byte %zu of allocation #%lu (%zu bytes) run %zu bytes past its end", n,
             (size_t)((uintptr_t)p - x->base), x->id, x->size, (size_t)((uintptr_t)p + n - x->base - x->size));
    return -1;
  }
  if (dev >= 0 && x->device != dev) {
    snprintf(why, nwhy, "%p is memory of device %d, not of device %d", p, x->device, dev);
    return -1;
  }
  return 0;
}

static void set_access(const alloc_t &x, int on) {
  if (mprotect((void *)x.lo, x.hi - x.lo, on ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
    perror("dt_emu: mprotect");
    abort();
  }
}

void heap_open(void) {
  if (g_open++ == 0 && protect_on()) {
    for (const alloc_t &x : g_allocs)
      if (x.live && !x.vmm) set_access(x, 1);
  }
}

void heap_close(void) {
  if (--g_open == 0 && protect_on()) {
    for (const alloc_t &x : g_allocs)
      if (x.live && !x.vmm) set_access(x, 0);
  }
}


int heap_account(int device, long long delta) {
  if ((int)g_used.size() <= device) g_used.resize((size_t)device + 1, 0);
  if ((int)g_peak.size() <= device) g_peak.resize((size_t)device + 1, 0);
  if (delta > 0 && g_used[device] + (size_t)delta > device_mem()) return 0;
  g_used[device] += (size_t)delta; /* a negative delta wraps back down */
  if (g_used[device] > g_peak[device]) g_peak[device] = g_used[device];
  return 1;
}

cudaError_t heap_reserve(int device, size_t size, size_t align, void **out) {
  heap_init();
  if (align < g_page) align = g_page;
  uintptr_t lo = (g_next + align - 1) / align * align;
  if (size == 0 || size % g_page || lo + size + g_page > (uintptr_t)g_base + g_reserved)
    return fail(cudaErrorMemoryAllocation, "cuMemAddressReserve of %zu bytes: not a page multiple, or the range is used up",
                size);
  alloc_t x = {};
  x.lo = x.base = lo;
  x.hi = lo + size;
  x.size = size;
  x.device = device;
  x.live = 1;
  x.vmm = 1;
  x.id = g_allocs.size() + 1;
  g_next = x.hi + g_page;
  g_allocs.push_back(x);
  *out = (void *)lo;
  return cudaSuccess;
}

cudaError_t heap_unreserve(void *p, size_t size) {
  alloc_t *x = heap_contains(p) ? find_span((uintptr_t)p) : NULL;
  if (!x || !x->vmm || !x->live || x->base != (uintptr_t)p || x->size != size)
    return fail(cudaErrorInvalidValue, "cuMemAddressFree(%p, %zu): not a live reserved range", p, size);
  x->live = 0;
  return cudaSuccess;
}

cudaError_t heap_alloc(int device, size_t size, void **out) {
  heap_init();
  if ((int)g_used.size() <= device) g_used.resize((size_t)device + 1, 0);
  if (size > device_mem() || g_used[device] + size > device_mem())
    return fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes: device %d has %zu of %zu bytes in use", size,
                device, g_used[device], device_mem());
  heap_account(device, 0); /* the peak's slot */
  size_t r = (size + ALIGN - 1) / ALIGN * ALIGN, span = (r + g_page - 1) / g_page * g_page;
  if (span - r < CANARY_FRONT) span += g_page; /* room for the front canary */
  if (g_next + span + g_page > (uintptr_t)g_base + g_reserved)
    return fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes: the emulation's address range is used up", size);
  alloc_t x = {};
  x.lo = g_next;
  x.hi = g_next + span;
  x.base = x.hi - r;
  x.size = size;
  x.device = device;
  x.live = 1;
  x.id = g_allocs.size() + 1;
  g_next = x.hi + g_page; /* the guard page stays PROT_NONE */
  set_access(x, 1);
  memset((void *)(x.base - CANARY_FRONT), CANARY, CANARY_FRONT);
  memset((void *)x.base, POISON, size);
  memset((void *)(x.base + size), CANARY, r - size);
  if (protect_on() && !g_open) set_access(x, 0);
  g_allocs.push_back(x);
  heap_account(device, (long long)size);
  *out = (void *)x.base;
  return cudaSuccess;
}

cudaError_t heap_free(void *p) {
  alloc_t *x = heap_contains(p) ? find_span((uintptr_t)p) : NULL;
  if (!x || x->base != (uintptr_t)p || !x->live || x->vmm) {
    char d[256];
    heap_describe(p, d, sizeof d);
    return fail(cudaErrorInvalidValue, "cudaFree(%p): not the start of a live allocation (%s)", p, d);
  }
  x->live = 0;
  heap_account(x->device, -(long long)x->size);
  madvise((void *)x->lo, x->hi - x->lo, MADV_DONTNEED);
  set_access(*x, 0);
  return cudaSuccess;
}

size_t heap_used(int device) { return device < (int)g_used.size() ? g_used[device] : 0; }

int heap_check_canaries(char *why, size_t n) {
  for (const alloc_t &x : g_allocs) {
    if (!x.live || x.vmm) continue;
    const unsigned char *f = (const unsigned char *)(x.base - CANARY_FRONT);
    size_t r = (x.size + ALIGN - 1) / ALIGN * ALIGN;
    const unsigned char *t = (const unsigned char *)(x.base + x.size);
    for (size_t i = 0; i < CANARY_FRONT; i++)
      if (f[i] != CANARY) {
        snprintf(why, n, "the %zu bytes before allocation #%lu (%zu bytes, device %d) were written (byte -%zu)",
                 CANARY_FRONT, x.id, x.size, x.device, CANARY_FRONT - i);
        return 0;
      }
    for (size_t i = 0; i < r - x.size; i++)
      if (t[i] != CANARY) {
        snprintf(why, n, "byte %zu past the end of allocation #%lu (%zu bytes, device %d) was written", i, x.id,
                 x.size, x.device);
        return 0;
      }
  }
  return -1;
}

/* ---- faults -------------------------------------------------------------------------------- */

static int fault_is_write(void *ucv) {
#if defined(__x86_64__)
  return (((ucontext_t *)ucv)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
  (void)ucv;
  return -1;
#endif
}

static void chain(int sig, siginfo_t *si, void *ucv) {
  if (g_old_segv.sa_flags & SA_SIGINFO) {
    if (g_old_segv.sa_sigaction) {
      g_old_segv.sa_sigaction(sig, si, ucv);
      return;
    }
  } else if (g_old_segv.sa_handler != SIG_DFL && g_old_segv.sa_handler != SIG_IGN) {
    g_old_segv.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL); /* returning re-runs the access: the default action ends the process */
}

static void on_segv(int sig, siginfo_t *si, void *ucv) {
  void *a = si->si_addr;
  int w = fault_is_write(ucv);
  const char *rw = w < 0 ? "access" : w ? "write" : "read";
  const char *where = exec_where();
  char d[256];
  if (where && fiber_guard(a)) {
    fail_sticky(current_device(), cudaErrorIllegalAddress, "%s: stack overflow (the fiber's guard page at %p)", where,
                a);
    exec_abandon();
  }
  if (!heap_contains(a)) {
    chain(sig, si, ucv);
    return;
  }
  heap_describe(a, d, sizeof d);
  if (where) {
    fail_sticky(current_device(), cudaErrorIllegalAddress, "%s: %s of device memory at %p: %s", where, rw, a, d);
    exec_abandon();
  }
  char msg[480];
  const char *op = stream_op();
  int n = op ? snprintf(msg, sizeof msg, "dt_emu: %s (stream work, run on the host) tried to %s device memory at %p (%s)\n",
                        op, rw, a, d)
             : snprintf(msg, sizeof msg,
                        "dt_emu: the host tried to %s device memory at %p (%s) outside any kernel or copy: device "
                        "memory is not accessible from the host (use cudaMemcpy)\n",
                        rw, a, d);
  if (write(2, msg, (size_t)n) < 0) {
  }
  signal(sig, SIG_DFL);
}

}  // namespace dt_emu
