/* Mixed precision (`[train] precision = fp32 | bf16 | fp16`): the storage formats, the array
 * rounding both backends apply where a GPU would store a low-precision tensor, and the dynamic
 * loss scaler for fp16 (PyTorch's torch.cuda.amp.GradScaler algorithm, agreed over all ranks).
 *
 * What is rounded (both backends, the same points; accumulation is fp32 everywhere):
 *   - the working copy of the parameters that forward and backward read (be->wparams), rounded
 *     from the fp32 master (be->params) at the start of every forward; AdamW, gradients and
 *     checkpoints use the fp32 master;
 *   - every activation an op writes: encoded, ln1, qkv, atty, residual2, ln2, fch, fch_gelu,
 *     residual3, lnf, logits (not the fp32 statistics ln mean/rstd, attention lse, losses);
 *   - every activation gradient an op writes: dlogits, dtmp, dres, dfch (after the matmul and
 *     again after GELU backward), dqkv;
 *   - not rounded: parameter gradients (fp32, accumulated), AdamW moments, the fp32 master,
 *     values inside an op (matmul sums, softmax probabilities inside attention, row sums).
 * On the CPU the rounding is emulated: arrays stay float, values are rounded (kmath.h
 * dt_round_bf16 / dt_round_fp16, round to nearest even, fp16 with overflow to inf and
 * subnormals). */
#ifndef DT_PRECISION_H
#define DT_PRECISION_H

#include <stddef.h>
#include <stdint.h>

#include "kmath.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_PREC_FP32 = 0, DT_PREC_BF16 = 1, DT_PREC_FP16 = 2 } dt_precision_t;

/* One value rounded to the storage format p (fp32: unchanged). */
DT_HD static inline float dt_prec_round1(float x, int p) {
  return p == DT_PREC_BF16 ? dt_round_bf16(x) : p == DT_PREC_FP16 ? dt_round_fp16(x) : x;
}

/* "fp32" | "bf16" | "fp16"; NULL for an unknown value. */
const char *dt_precision_name(dt_precision_t p);
/* Parse a name; 0 on success, -1 if unknown. */
int dt_precision_parse(const char *name, dt_precision_t *p);

/* CPU (OpenMP): x[0..n) rounded in place to p; dst = round(src). No-ops / memcpy for fp32. */
void dt_prec_round(float *x, size_t n, dt_precision_t p);
void dt_prec_round_copy(float *dst, const float *src, size_t n, dt_precision_t p);

/* Dynamic loss scaling, torch.cuda.amp.GradScaler (growth_factor 2, backoff_factor 0.5):
 * backward runs on loss * scale; a step whose gradients hold inf/NaN on ANY rank is skipped
 * (no AdamW update; AdamW's bias-correction count t does not advance, as torch's Adam state
 * 'step' does not) and halves the scale; after `interval` consecutive unskipped steps the scale
 * doubles (unless that overflows float). Gradients are unscaled (x 1/scale) before clipping.
 * Disabled (fp32, bf16): scale stays 1 and nothing is ever skipped. */
typedef struct {
  int enabled;
  float scale;          /* current loss scale (a power of two) */
  int64_t growth;       /* consecutive unskipped steps since the last overflow or growth (torch's
                           _growth_tracker); checkpoint attr loss_scale_growth */
  int interval;         /* growth_interval */
  int64_t skipped;      /* steps skipped so far in the run (checkpointed): AdamW t = steps - skipped */
} dt_scaler_t;

/* interval: growth_interval; below 1 it counts as 1. */
void dt_scaler_init(dt_scaler_t *s, int enabled, double init_scale, int interval);
/* torch's _amp_update_scale_ after a step: found_inf -> scale *= 0.5, growth = 0, skipped++;
 * else growth + 1 == interval -> scale *= 2 (if finite), growth = 0; else growth++. */
void dt_scaler_update(dt_scaler_t *s, int found_inf);

struct dt_comm;
/* Collective over `world` (every rank of the job): *found_inf = 1 on every rank when any rank's
 * local gradient sum of squares is not finite, i.e. some gradient it holds is inf/NaN. The same
 * reduction checks that every rank enters with the same scaler state (scale, growth, skipped):
 * DT_ERR_INTERNAL naming this rank otherwise. */
dt_status_t dt_scaler_agree(const dt_scaler_t *s, struct dt_comm *world, int rank, double local_sumsq,
                            int *found_inf);

#ifdef __cplusplus
}
#endif
#endif
