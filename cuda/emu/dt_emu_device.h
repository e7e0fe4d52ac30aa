/* CUDA emulation: what device code sees. Kernel qualifiers, the built-in index variables of the
 * running thread, __syncthreads, warp shuffles/votes/reductions with their lane semantics and
 * atomics. The threads of a block are fibers on one host thread (cuda/emu/exec.cpp): they switch
 * only at __syncthreads and at warp-level operations, so atomics are plain read-modify-writes.
 * Included by cuda_runtime.h. */
#ifndef DT_EMU_DEVICE_H
#define DT_EMU_DEVICE_H

#include <stdint.h>
#include <string.h>

#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __constant__
/* Static shared memory: one copy (blocks run one after another), in a section of its own that the
 * executor fills with NaN bytes before every block, as a GPU leaves shared memory undefined.
 * `extern __shared__` (dynamic shared memory) is not supported: it does not compile. */
#define __shared__ static __attribute__((section("dt_emu_shared")))

/* The running thread's indices, set by the executor at every switch. */
struct dt_emu_ids_t {
  uint3 tid, bid;
  dim3 bdim, gdim;
};
extern dt_emu_ids_t dt_emu_ids;
#define threadIdx (static_cast<const uint3 &>(dt_emu_ids.tid))
#define blockIdx (static_cast<const uint3 &>(dt_emu_ids.bid))
#define blockDim (static_cast<const dim3 &>(dt_emu_ids.bdim))
#define gridDim (static_cast<const dim3 &>(dt_emu_ids.gdim))
static const int warpSize = 32;

/* ---- block barrier (exec.cpp): every live thread of the block, all at the same call site ---- */
enum { DT_EMU_BAR_PLAIN, DT_EMU_BAR_COUNT, DT_EMU_BAR_AND, DT_EMU_BAR_OR };
int dt_emu_barrier(int kind, int pred, const char *file, int line);
#define __syncthreads() ((void)dt_emu_barrier(DT_EMU_BAR_PLAIN, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) dt_emu_barrier(DT_EMU_BAR_COUNT, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_and(p) dt_emu_barrier(DT_EMU_BAR_AND, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_or(p) dt_emu_barrier(DT_EMU_BAR_OR, (p) != 0, __FILE__, __LINE__)

/* ---- warp-level operations (exec.cpp): every lane named in mask must arrive ----------------- */
enum {
  DT_EMU_W_SYNC,
  DT_EMU_W_IDX,
  DT_EMU_W_UP,
  DT_EMU_W_DOWN,
  DT_EMU_W_XOR,
  DT_EMU_W_BALLOT,
  DT_EMU_W_RADD,
  DT_EMU_W_RMIN,
  DT_EMU_W_RMAX,
  DT_EMU_W_RAND,
  DT_EMU_W_ROR,
  DT_EMU_W_RXOR,
};
/* One lane's part of a warp operation: its value (bits), the operation's lane argument and
 * width; returns this lane's result (bits). Signed reductions pass `is_signed`. */
uint64_t dt_emu_warp(int kind, unsigned mask, uint64_t val, int arg, int width, const char *what);
unsigned dt_emu_activemask(void);

template <typename T>
static inline T dt_emu_shfl(int kind, unsigned mask, T var, int arg, int width, const char *what) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
  uint64_t v = 0;
  memcpy(&v, &var, sizeof var);
  v = dt_emu_warp(kind, mask, v, arg, width, what);
  T r;
  memcpy(&r, &v, sizeof r);
  return r;
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
  return dt_emu_shfl(DT_EMU_W_IDX, mask, var, src, width, "__shfl_sync");
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return dt_emu_shfl(DT_EMU_W_UP, mask, var, (int)delta, width, "__shfl_up_sync");
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return dt_emu_shfl(DT_EMU_W_DOWN, mask, var, (int)delta, width, "__shfl_down_sync");
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return dt_emu_shfl(DT_EMU_W_XOR, mask, var, lane_mask, width, "__shfl_xor_sync");
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)dt_emu_warp(DT_EMU_W_SYNC, mask, 0, 0, 32, "__syncwarp");
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  return (unsigned)dt_emu_warp(DT_EMU_W_BALLOT, mask, pred != 0, 0, 32, "__ballot_sync");
}
static inline int __all_sync(unsigned mask, int pred) {
  return (unsigned)dt_emu_warp(DT_EMU_W_BALLOT, mask, pred != 0, 0, 32, "__all_sync") == mask;
}
static inline int __any_sync(unsigned mask, int pred) {
  return dt_emu_warp(DT_EMU_W_BALLOT, mask, pred != 0, 0, 32, "__any_sync") != 0;
}
static inline unsigned __activemask(void) { return dt_emu_activemask(); }
/* sm_80 warp reductions; the value travels sign-extended so min/max of int compare as signed */
#define DT_EMU_WRED(name, kind, T)                                                        \
  static inline T name(unsigned mask, T v) {                                              \
    return (T)dt_emu_warp(kind, mask, (uint64_t)(int64_t)v, std::is_signed<T>::value, 32, #name); \
  }
DT_EMU_WRED(__reduce_add_sync, DT_EMU_W_RADD, unsigned)
DT_EMU_WRED(__reduce_add_sync, DT_EMU_W_RADD, int)
DT_EMU_WRED(__reduce_min_sync, DT_EMU_W_RMIN, unsigned)
DT_EMU_WRED(__reduce_min_sync, DT_EMU_W_RMIN, int)
DT_EMU_WRED(__reduce_max_sync, DT_EMU_W_RMAX, unsigned)
DT_EMU_WRED(__reduce_max_sync, DT_EMU_W_RMAX, int)
DT_EMU_WRED(__reduce_and_sync, DT_EMU_W_RAND, unsigned)
DT_EMU_WRED(__reduce_or_sync, DT_EMU_W_ROR, unsigned)
DT_EMU_WRED(__reduce_xor_sync, DT_EMU_W_RXOR, unsigned)
#undef DT_EMU_WRED

/* ---- atomics: one host thread runs every thread of a kernel, so a read-modify-write is atomic -- */
#define DT_EMU_ATOMIC(name, T, expr) \
  static inline T name(T *a, T v) {  \
    T old = *a;                      \
    *a = (expr);                     \
    return old;                      \
  }
DT_EMU_ATOMIC(atomicAdd, float, old + v)
DT_EMU_ATOMIC(atomicAdd, double, old + v)
DT_EMU_ATOMIC(atomicAdd, int, (int)((unsigned)old + (unsigned)v))
DT_EMU_ATOMIC(atomicAdd, unsigned, old + v)
DT_EMU_ATOMIC(atomicAdd, unsigned long long, old + v)
DT_EMU_ATOMIC(atomicSub, int, (int)((unsigned)old - (unsigned)v))
DT_EMU_ATOMIC(atomicSub, unsigned, old - v)
DT_EMU_ATOMIC(atomicExch, int, v)
DT_EMU_ATOMIC(atomicExch, unsigned, v)
DT_EMU_ATOMIC(atomicExch, unsigned long long, v)
DT_EMU_ATOMIC(atomicExch, float, v)
DT_EMU_ATOMIC(atomicMax, int, old > v ? old : v)
DT_EMU_ATOMIC(atomicMax, unsigned, old > v ? old : v)
DT_EMU_ATOMIC(atomicMax, unsigned long long, old > v ? old : v)
DT_EMU_ATOMIC(atomicMin, int, old < v ? old : v)
DT_EMU_ATOMIC(atomicMin, unsigned, old < v ? old : v)
DT_EMU_ATOMIC(atomicMin, unsigned long long, old < v ? old : v)
DT_EMU_ATOMIC(atomicAnd, int, old & v)
DT_EMU_ATOMIC(atomicAnd, unsigned, old & v)
DT_EMU_ATOMIC(atomicOr, int, old | v)
DT_EMU_ATOMIC(atomicOr, unsigned, old | v)
DT_EMU_ATOMIC(atomicXor, int, old ^ v)
DT_EMU_ATOMIC(atomicXor, unsigned, old ^ v)
DT_EMU_ATOMIC(atomicInc, unsigned, old >= v ? 0u : old + 1u)
DT_EMU_ATOMIC(atomicDec, unsigned, (old == 0u || old > v) ? v : old - 1u)
#undef DT_EMU_ATOMIC
#define DT_EMU_CAS(T)                      \
  static inline T atomicCAS(T *a, T cmp, T v) { \
    T old = *a;                            \
    if (old == cmp) *a = v;                \
    return old;                            \
  }
DT_EMU_CAS(int)
DT_EMU_CAS(unsigned)
DT_EMU_CAS(unsigned long long)
#undef DT_EMU_CAS

/* ---- intrinsics ------------------------------------------------------------------------------ */
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T>
static inline T __ldg(const T *p) {
  return *p;
}
#define DT_EMU_BITCAST(name, From, To) \
  static inline To name(From x) {      \
    To y;                              \
    memcpy(&y, &x, sizeof y);          \
    return y;                          \
  }
DT_EMU_BITCAST(__int_as_float, int, float)
DT_EMU_BITCAST(__float_as_int, float, int)
DT_EMU_BITCAST(__uint_as_float, unsigned, float)
DT_EMU_BITCAST(__float_as_uint, float, unsigned)
DT_EMU_BITCAST(__longlong_as_double, long long, double)
DT_EMU_BITCAST(__double_as_longlong, double, long long)
#undef DT_EMU_BITCAST
/* glibc declares __expf and __logf itself: macros, not functions */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }

#endif
