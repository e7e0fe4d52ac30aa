/* CUDA emulation: a kernel launch. DT_LAUNCH (cuda/cuda_check.h) spells every launch as
 * dt_emu_launch(kernel, grid, block, shmem, stream, args...); the macro below turns that into
 * dt_emu_launch_named("kernel", kernel, ...), which copies the arguments converted to the
 * kernel's parameter types (as a launch does), notes the pointer arguments (device-memory checks)
 * and hands the launch to the runtime: checked at once against the sm_90 limits (an error is
 * returned and left for cudaGetLastError), then queued on the stream (stream.cpp) and run by the
 * executor (exec.cpp) when the stream is synchronised. */
#ifndef DT_EMU_LAUNCH_H
#define DT_EMU_LAUNCH_H

#include <stddef.h>

#include <tuple>
#include <type_traits>
#include <utility>

#define DT_EMU_MAX_PTR_ARGS 24

typedef struct dt_emu_launch {
  const char *name;             /* the kernel's name as written at the launch */
  const void *func;             /* the kernel (key for cudaFuncSetAttribute) */
  dim3 grid, block;
  size_t shmem;                 /* dynamic shared memory, bytes */
  void (*body)(void *ctx);      /* one thread: the kernel on the copied arguments */
  void (*destroy)(void *ctx);   /* frees ctx */
  void *ctx;
  int nptr;                     /* pointer arguments: value, position, written (not const) */
  const void *ptr[DT_EMU_MAX_PTR_ARGS];
  int ptr_pos[DT_EMU_MAX_PTR_ARGS];
  int ptr_written[DT_EMU_MAX_PTR_ARGS];
} dt_emu_launch_t;

/* Checks the launch, then queues it on stream (takes ctx in every case). */
cudaError_t dt_emu_submit(dt_emu_launch_t *l, cudaStream_t stream);

template <typename T>
static inline void dt_emu_note_arg(dt_emu_launch_t *l, int pos, const T &v) {
  if constexpr (std::is_pointer<T>::value) {
    if (l->nptr < DT_EMU_MAX_PTR_ARGS) {
      l->ptr[l->nptr] = (const void *)v;
      l->ptr_pos[l->nptr] = pos;
      l->ptr_written[l->nptr] = !std::is_const<typename std::remove_pointer<T>::type>::value;
      l->nptr++;
    }
  } else {
    (void)l;
    (void)pos;
    (void)v;
  }
}

template <typename Tup, size_t... I>
static inline void dt_emu_note_args(dt_emu_launch_t *l, const Tup &t, std::index_sequence<I...>) {
  (dt_emu_note_arg(l, (int)I, std::get<I>(t)), ...);
}

template <typename... P, typename... A>
static inline cudaError_t dt_emu_launch_named(const char *name, void (*kernel)(P...), dim3 grid, dim3 block,
                                              size_t shmem, cudaStream_t stream, A &&...args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  typedef std::tuple<typename std::decay<P>::type...> args_t;
  struct ctx_t {
    void (*k)(P...);
    args_t a;
  };
  ctx_t *c = new ctx_t{kernel, args_t(std::forward<A>(args)...)};
  dt_emu_launch_t l = {};
  l.name = name;
  l.func = (const void *)kernel;
  l.grid = grid;
  l.block = block;
  l.shmem = shmem;
  l.body = [](void *p) { std::apply(((ctx_t *)p)->k, ((ctx_t *)p)->a); };
  l.destroy = [](void *p) { delete (ctx_t *)p; };
  l.ctx = c;
  dt_emu_note_args(&l, c->a, std::index_sequence_for<P...>{});
  return dt_emu_submit(&l, stream);
}

#define dt_emu_launch(kernel, ...) dt_emu_launch_named(#kernel, kernel, __VA_ARGS__)

#endif
