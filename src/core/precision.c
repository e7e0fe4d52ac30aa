/* Mixed precision on the host: storage-format names, the OpenMP array rounding the CPU backend
 * applies at the points listed in precision.h, and the fp16 dynamic loss scaler (GradScaler's
 * update rule and the all-rank agreement on inf/NaN gradients). */
#include "precision.h"

#include <math.h>
#include <string.h>

#include "comm.h"
#include "ops_cpu.h" /* DT_CPU_VEC */

static const char *const names[] = {"fp32", "bf16", "fp16"};

const char *dt_precision_name(dt_precision_t p) {
  return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : NULL;
}

int dt_precision_parse(const char *name, dt_precision_t *p) {
  for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
    if (!strcmp(name, names[i])) {
      *p = (dt_precision_t)i;
      return 0;
    }
  return -1;
}

DT_CPU_VEC static void round_bf16(float *dst, const float *src, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; i++) dst[i] = dt_round_bf16(src[i]);
}

DT_CPU_VEC static void round_fp16(float *dst, const float *src, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; i++) dst[i] = dt_round_fp16(src[i]);
}

/* dst may equal src (each element is read before it is written, by the same iteration). */
static void round_any(float *dst, const float *src, size_t n, dt_precision_t p) {
  if (p == DT_PREC_BF16)
    round_bf16(dst, src, (long)n);
  else if (p == DT_PREC_FP16)
    round_fp16(dst, src, (long)n);
  else if (dst != src)
    memcpy(dst, src, n * sizeof(float));
}

void dt_prec_round(float *x, size_t n, dt_precision_t p) {
  if (p != DT_PREC_FP32) round_any(x, x, n, p);
}

void dt_prec_round_copy(float *dst, const float *src, size_t n, dt_precision_t p) { round_any(dst, src, n, p); }

void dt_scaler_init(dt_scaler_t *s, int enabled, double init_scale, int interval) {
  memset(s, 0, sizeof *s);
  s->enabled = enabled;
  s->scale = enabled ? (float)init_scale : 1.0f;
  s->interval = interval > 0 ? interval : 1;
}

void dt_scaler_update(dt_scaler_t *s, int found_inf) {
  if (!s->enabled) return;
  if (found_inf) {
    s->scale *= 0.5f;
    s->growth = 0;
    s->skipped++;
    return;
  }
  int64_t ok = s->growth + 1;
  if (ok == s->interval) {
    float grown = s->scale * 2.0f;
    if (isfinite(grown)) s->scale = grown; /* never grow past float to inf */
    s->growth = 0;
  } else {
    s->growth = ok;
  }
}

dt_status_t dt_scaler_agree(const dt_scaler_t *s, struct dt_comm *world, int rank, double local_sumsq,
                            int *found_inf) {
  /* one MAX reduction: the overflow flag, and each state word with both signs (max and -min) */
  double v[7] = {isfinite(local_sumsq) ? 0.0 : 1.0, s->scale, -(double)s->scale, (double)s->growth,
                 -(double)s->growth, (double)s->skipped, -(double)s->skipped};
  double r[7];
  DT_TRY(world->ops->allreduce(world, v, r, 7, DT_F64, DT_MAX, NULL, NULL));
  if (r[1] != -r[2] || r[3] != -r[4] || r[5] != -r[6])
    return DT_ERR(DT_ERR_INTERNAL,
                  "rank %d: loss-scaler state differs between ranks (scale %g..%g, growth %g..%g, skipped %g..%g)",
                  rank, -r[2], r[1], -r[4], r[3], -r[6], r[5]);
  *found_inf = r[0] != 0.0;
  return DT_OK;
}
