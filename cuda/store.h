/* How the kernels store activations (issue #22 item 1, docs/architecture.md step 7c). Internal (C++).
 *
 * A kernel that reads or writes activations (and the weights' working copy) is a template over the
 * storage type S:
 *   float      fp32 storage; a store rounds the value to the run's precision (precision.h), the
 *              emulation of 16-bit storage the CPU backend runs too;
 *   dt_bf16_t  the 16 bits of a bf16 value, dt_fp16_t those of an IEEE half.
 * A load gives the float of the stored value; a store rounds to nearest even (kmath.h). A 16-bit
 * store of v therefore keeps the same value as a float store of v at that precision, so a kernel's
 * 16-bit instantiation gives bit for bit the values of its float one (tests/gpu_parity_store.cu checks
 * every instantiation against the float path). Statistics (layernorm mean/rstd, the attention's
 * log-sum-exp, losses), parameter gradients and optimizer state stay float.
 *
 * The launchers (kernels.h) take the activations as void pointers and the precision `prec` with
 * DT_STORE16 or'ed in when they hold 16-bit values; DT_STORE_SWITCH picks the instantiation. */
#ifndef DT_CU_STORE_H
#define DT_CU_STORE_H

#include <stdint.h>

#include "kernels.h"
#include "kmath.h"
#include "precision.h"
#include "status.h"

struct dt_bf16_t {
  uint16_t bits;
};
struct dt_fp16_t {
  uint16_t bits;
};

DT_HD static inline float dt_ld(const float *p) { return *p; }
DT_HD static inline float dt_ld(const dt_bf16_t *p) { return dt_from16(p->bits, 0); }
DT_HD static inline float dt_ld(const dt_fp16_t *p) { return dt_from16(p->bits, 1); }

/* *p = v rounded to the storage (prec: the float storage's precision, DT_STORE16 masked off) */
DT_HD static inline void dt_st(float *p, float v, int prec) { *p = dt_prec_round1(v, prec); }
DT_HD static inline void dt_st(dt_bf16_t *p, float v, int) { p->bits = dt_to16(v, 0); }
DT_HD static inline void dt_st(dt_fp16_t *p, float v, int) { p->bits = dt_to16(v, 1); }

/* the precision without the storage flag */
static inline int dt_store_prec(int prec) { return prec & ~DT_STORE16; }

/* Run BODY with S typedef'd to the storage `prec` names (see above); fp32 with DT_STORE16 is an
 * argument error. BODY may return. */
#define DT_STORE_SWITCH(prec, S, ...)                                                          \
  do {                                                                                         \
    int dt_sp_ = (prec);                                                                       \
    if (!(dt_sp_ & DT_STORE16)) {                                                              \
      typedef float S;                                                                         \
      __VA_ARGS__;                                                                             \
    } else if (dt_store_prec(dt_sp_) == DT_PREC_BF16) {                                        \
      typedef dt_bf16_t S;                                                                     \
      __VA_ARGS__;                                                                             \
    } else if (dt_store_prec(dt_sp_) == DT_PREC_FP16) {                                        \
      typedef dt_fp16_t S;                                                                     \
      __VA_ARGS__;                                                                             \
    } else {                                                                                   \
      return DT_ERR(DT_ERR_ARG, "16-bit storage of precision %d: only bf16 and fp16", dt_sp_ & 0xff); \
    }                                                                                          \
  } while (0)

#endif
