/* CUDA emulation: fibers for the threads of a block. On x86-64 a switch saves the six callee-saved
 * registers and swaps stack pointers (no system call); elsewhere ucontext. Stacks (256 KiB, 1 MiB
 * under AddressSanitizer, a guard page below each) come from a pool and are reused across
 * threads, blocks and launches: a thread that ends without blocking hands its stack to the next,
 * so a kernel without __syncthreads or warp operations runs on one stack, at about the cost of a
 * loop. AddressSanitizer is told about every switch. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fiber.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define DT_EMU_ASAN 1
static const size_t STACK = 1 << 20;
#else
#define DT_EMU_ASAN 0
static const size_t STACK = 256 << 10;
#endif

#if defined(__x86_64__)
/* dt_emu_switch(save, to): push callee-saved registers, *save = rsp, rsp = to, pop, ret. */
extern "C" void dt_emu_switch(void **save, void *to);
__asm__(
    ".text\n"
    ".globl dt_emu_switch\n"
    ".type dt_emu_switch,@function\n"
    "dt_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size dt_emu_switch,.-dt_emu_switch\n");
#else
#include <ucontext.h>
#endif

namespace dt_emu {

struct fiber_t {
  char *lo;   /* stack, above its guard page */
  size_t size;
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t uc;
#endif
  void *fake;   /* AddressSanitizer's fake stack of the suspended fiber */
  char *low;    /* lowest stack address seen at a switch out of the fiber: frames above it may still
                   be live (poisoned redzones) when the stack is reused */
};

/* Every fiber lives until the process exits. The lists are never destroyed (no static destructor
 * runs before LeakSanitizer's exit check, which would leave the fibers unreachable: reported). */
static std::vector<fiber_t *> &g_free = *new std::vector<fiber_t *>, &g_all = *new std::vector<fiber_t *>;
#if defined(__x86_64__)
static void *g_sched_sp;
#else
static ucontext_t g_sched_uc;
#endif
static void (*g_entry)(void);
#if DT_EMU_ASAN
static const void *g_sched_bottom;
static size_t g_sched_size;
static void *g_sched_fake;
/* The switch into a fiber came from the scheduler's stack (whose bounds the fiber then records
 * for its way back), not from another fiber's. */
static int g_from_sched;
#define FROM_SCHED_BOTTOM (g_from_sched ? &g_sched_bottom : NULL)
#define FROM_SCHED_SIZE (g_from_sched ? &g_sched_size : NULL)
#endif

fiber_t *fiber_acquire(void) {
  if (!g_free.empty()) {
    fiber_t *f = g_free.back();
    g_free.pop_back();
    return f;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char *m = (char *)mmap(NULL, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0) {
    perror("dt_emu: fiber stack");
    abort();
  }
  fiber_t *f = new fiber_t();
  f->lo = m + page;
  f->size = STACK;
  g_all.push_back(f);
  return f;
}

void fiber_release(fiber_t *f) { g_free.push_back(f); }

int fiber_guard(const void *p) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (const fiber_t *f : g_all)
    if ((const char *)p >= f->lo - page && (const char *)p < f->lo) return 1;
  return 0;
}

static void entry_trampoline(void) {
#if DT_EMU_ASAN
  __sanitizer_finish_switch_fiber(NULL, FROM_SCHED_BOTTOM, FROM_SCHED_SIZE);
#endif
  g_entry();
  fprintf(stderr, "dt_emu: a fiber's entry returned\n");
  abort();
}

void fiber_prepare(fiber_t *f, void (*entry)(void)) {
  g_entry = entry;
#if DT_EMU_ASAN /* the frames of the stack's last thread never returned: drop their redzones */
  if (f->low) __asan_unpoison_memory_region(f->low - 512, (size_t)(f->lo + f->size - (f->low - 512)));
  f->low = NULL;
#endif
#if defined(__x86_64__)
  /* [top-8]: 0 (entry's return address); [top-16]: entry (popped by ret); 6 registers below */
  uintptr_t top = ((uintptr_t)(f->lo + f->size)) & ~(uintptr_t)15;
  void **s = (void **)(top - 16);
  s[1] = NULL;
  s[0] = (void *)entry_trampoline;
  for (int i = 1; i <= 6; i++) s[-i] = NULL;
  f->sp = (void *)(s - 6);
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->lo;
  f->uc.uc_stack.ss_size = f->size;
  f->uc.uc_link = NULL;
  makecontext(&f->uc, entry_trampoline, 0);
#endif
}

void fiber_resume(fiber_t *f) {
#if DT_EMU_ASAN
  g_from_sched = 1;
  __sanitizer_start_switch_fiber(&g_sched_fake, f->lo, f->size);
#endif
#if defined(__x86_64__)
  dt_emu_switch(&g_sched_sp, f->sp);
#else
  swapcontext(&g_sched_uc, &f->uc);
#endif
#if DT_EMU_ASAN
  __sanitizer_finish_switch_fiber(g_sched_fake, NULL, NULL);
#endif
}

/* Frames below the switch returned normally and unpoisoned their redzones; those above did not. */
static void note_low(fiber_t *f, char *sp) {
  if (!f->low || sp < f->low) f->low = sp;
}

void fiber_yield(fiber_t *f) {
  char here;
  note_low(f, &here);
#if DT_EMU_ASAN
  __sanitizer_start_switch_fiber(&f->fake, g_sched_bottom, g_sched_size);
#endif
#if defined(__x86_64__)
  dt_emu_switch(&f->sp, g_sched_sp);
#else
  swapcontext(&f->uc, &g_sched_uc);
#endif
#if DT_EMU_ASAN
  __sanitizer_finish_switch_fiber(f->fake, FROM_SCHED_BOTTOM, FROM_SCHED_SIZE);
#endif
}

void fiber_switch(fiber_t *from, fiber_t *to) {
  char here;
  note_low(from, &here);
#if DT_EMU_ASAN
  g_from_sched = 0;
  __sanitizer_start_switch_fiber(&from->fake, to->lo, to->size);
#endif
#if defined(__x86_64__)
  dt_emu_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
#if DT_EMU_ASAN
  __sanitizer_finish_switch_fiber(from->fake, FROM_SCHED_BOTTOM, FROM_SCHED_SIZE);
#endif
}

void fiber_exit(fiber_t *f) {
  char here;
  note_low(f, &here);
#if DT_EMU_ASAN
  __sanitizer_start_switch_fiber(NULL, g_sched_bottom, g_sched_size);
#endif
#if defined(__x86_64__)
  void *dummy;
  dt_emu_switch(&dummy, g_sched_sp);
#else
  setcontext(&g_sched_uc);
#endif
  abort();
}

}  // namespace dt_emu
