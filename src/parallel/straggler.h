/* Straggler report: the spread over ranks of each rank's step time outside communication waits
 * (compute, data, host work), so the rank the others wait for shows as the slowest. Every
 * log.straggler_every steps the trainer gathers one double per rank and rank 0 prints it. */
#ifndef DT_STRAGGLER_H
#define DT_STRAGGLER_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  double min, median, max; /* over ranks; median of an even count: mean of the two middle values */
  int slowest;             /* the lowest rank holding max */
  int n;                   /* ranks */
} dt_straggler_t;

/* Statistics of t[0..n), n >= 1; scratch holds n doubles (t is left alone). */
void dt_straggler_stats(const double *t, int n, double *scratch, dt_straggler_t *out);
/* 1 when the report is due after completed step `step` (1-based): every `every` steps, where
 * every = -1 means log_every and 0 means never. */
int dt_straggler_due(int step, int every, int log_every);

#ifdef __cplusplus
}
#endif
#endif
