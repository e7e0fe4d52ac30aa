/* CUDA emulation: cooperative fibers (fiber.cpp), one per running thread of a block. The
 * scheduler (exec.cpp) resumes a fiber; the fiber runs until it yields back or switches to another
 * fiber (a barrier or a warp operation) or exits (its thread returned). */
#ifndef DT_EMU_FIBER_H
#define DT_EMU_FIBER_H

#include "emu_int.h"

namespace dt_emu {

struct fiber_t;
fiber_t *fiber_acquire(void);       /* a stack from the pool */
void fiber_release(fiber_t *f);     /* back to the pool (its frames, if any, are abandoned) */
void fiber_prepare(fiber_t *f, void (*entry)(void)); /* the next resume starts entry() */
void fiber_resume(fiber_t *f);      /* scheduler -> f, until f yields or exits */
void fiber_yield(fiber_t *f);       /* f -> scheduler; returns at the next resume */
void fiber_switch(fiber_t *from, fiber_t *to); /* from -> to directly; returns when from is resumed */
/* f -> scheduler, for good. Not [[noreturn]]: AddressSanitizer would unpoison the whole stack (a
 * system call and a 128 KiB memset) before every call. */
void fiber_exit(fiber_t *f);

}  // namespace dt_emu

#endif
