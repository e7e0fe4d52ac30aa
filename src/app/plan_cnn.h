/* Memory planner for the image classifiers (plan_cnn.c): per-rank host memory of the CPU
 * backend and device memory of the CUDA backend for parallel.zero = 0 to 3, from the model as
 * training builds it and the image sets' sizes. `dtrain plan` prints it; training prints the
 * configured stage against its peak RSS (CPU) or the device memory in use (CUDA). */
#ifndef DT_PLAN_CNN_H
#define DT_PLAN_CNN_H

#include <stdio.h>

#include "cnn.h"
#include "config.h"
#include "images.h"
#include "status.h"

#define DT_PLAN_CNN_STAGES 4 /* ZeRO 0, 1, 2, 3 */

typedef struct {
  double params, wparams, grads, m, v, comm, total; /* bytes per rank, host (CPU backend) */
  double total_gpu; /* device, CUDA backend (0: not built with CUDA) */
} dt_plan_cnn_zero_t;

typedef struct {
  int dp, accum, B, threads, zero, n_train, n_val, C, H, W;
  size_t params_true, bufs_true;
  double arena;  /* floats per arena (parameters, then running statistics; aligned tensors) */
  double model;  /* dt_cnn_alloc_bytes */
  double model_gpu; /* the same with the CUDA backend's convolution scratch (0 without CUDA) */
  double images; /* image sets, sampler order, batch */
  dt_plan_cnn_zero_t z[DT_PLAN_CNN_STAGES];
} dt_plan_cnn_t;

/* The plan of a built model m (micro_batch images, `threads` OpenMP threads) over dp ranks. */
void dt_plan_cnn_compute(dt_plan_cnn_t *p, const dt_config_t *cfg, const dt_cnn_t *m, const dt_images_t *train,
                         const dt_images_t *val, int dp, int accum, int threads);
void dt_plan_cnn_print(const dt_plan_cnn_t *p, const dt_config_t *cfg, FILE *out);
/* One line: rank 0's peak RSS against the configured stage's total (+ the baseline RSS). */
void dt_plan_cnn_print_rss(const dt_plan_cnn_t *p, FILE *out);
/* One line: the device memory in use (bytes, cudaMemGetInfo) against the configured stage's
 * device total. */
void dt_plan_cnn_print_device(const dt_plan_cnn_t *p, double used, FILE *out);
/* `dtrain plan` for model.arch != gpt2: builds the model, opens the image sets for their sizes,
 * prints the plan to out. Errors name the file or key. */
dt_status_t dt_plan_cnn_run(const dt_config_t *cfg, const char *name, int world, int threads, FILE *out);

#endif
