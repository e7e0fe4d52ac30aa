/* Training output on rank 0: '#' header lines, one fixed-width row per step, and the same rows
 * as JSON lines in the metrics file. */
#ifndef DT_METRICS_H
#define DT_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef struct {
  int step;          /* 1-based step just completed */
  double loss;       /* global mean training loss of the step */
  double lr;
  double grad_norm;  /* before clipping */
  double ms;         /* step wall time, max over ranks */
  double tok_per_s;  /* global tokens / step time */
  double gflops;     /* achieved GFLOP/s over all ranks (model FLOPs formula) */
  double val_loss;   /* < 0: not evaluated this step */
  double val_acc;    /* image classifiers: top-1 accuracy of that evaluation (< 0: none) */
  double epoch;      /* image classifiers: epochs done after this step (samples / the training set) */
  unsigned long long sample0; /* global sample indices consumed: [sample0, sample0 + samples) */
  int samples;
  unsigned long long tokens; /* tokens consumed through this step: (sample0 + samples) x T */
  double loss_scale; /* fp16: the loss scale this step's backward used; 0 = no loss scaling */
  int skipped;       /* fp16: 1 when inf/NaN gradients (on any rank) skipped the update */
  int slowest_rank;  /* straggler report (straggler.h) this step: the rank with the longest step time
                      * outside communication waits; -1 = not measured this step */
  double rank_ms_min, rank_ms_median, rank_ms_max; /* that time over ranks, ms */
} dt_step_row_t;

typedef struct {
  FILE *out;         /* stdout, or NULL (ranks other than 0) */
  FILE *jsonl;       /* or NULL */
  int images;        /* image classifiers: images/s instead of tokens/s, a val_acc column */
} dt_metrics_t;

dt_status_t dt_metrics_open(dt_metrics_t *m, const char *jsonl_path);
/* Per rank: "{rank}" in jsonl_path is replaced by `rank` (every rank then writes its own file);
 * rank 0 prints the table on stdout, other ranks only write their file. */
dt_status_t dt_metrics_open_rank(dt_metrics_t *m, const char *jsonl_path, int rank);
void dt_metrics_close(dt_metrics_t *m);
void dt_metrics_header(dt_metrics_t *m);
void dt_metrics_row(dt_metrics_t *m, const dt_step_row_t *r);

#endif
