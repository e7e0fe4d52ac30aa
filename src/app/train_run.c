/* The training run: the step loop, evaluation, logging, checkpoints on schedule and on signals,
 * and the end-of-run reports (communication hidden, pipeline bubble, memory against the plan). */
#include "train_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_cuda.h"
#include "plan.h"
#include "run_loop.h"

static volatile sig_atomic_t signal_flag = 0;

static void on_signal(int sig) { signal_flag = sig; }

void dt_train_install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int dt_train_signal_pending(void) { return signal_flag; }

static void print_header(dt_trainer_t *tr) {
  const dt_dims_t *d = &tr->lay.d;
  FILE *o = stdout;
  fprintf(o, "# dtrain %s\n", tr->cfg_name);
  fprintf(o, "# model: L=%d NH=%d C=%d V=%d (padded %d) T=%d, %zu parameters (%.2f M)\n", d->L, d->NH, d->C, d->V,
          d->Vp, d->T, tr->lay.n_params_true, tr->lay.n_params_true * 1e-6);
  fprintf(o, "# batch: micro_batch=%d x grad_accum=%d x dp=%d = %d sequences = %d tokens per step\n", tr->B,
          tr->accum, tr->mesh.dp, tr->global_batch, tr->global_batch * tr->T);
  fprintf(o, "# data: %s: %d shards, %llu tokens, %llu samples of T+1\n", tr->cfg.train,
          dt_data_num_shards(tr->train), (unsigned long long)dt_data_num_tokens(tr->train),
          (unsigned long long)dt_data_num_samples(tr->train));
  fprintf(o, "# backend: %s, %d threads per rank, matmul: %s\n", tr->be.ops->name, tr->mesh.threads,
          tr->be.ops->engine(&tr->be));
  if (tr->mesh.dp > 1 && dt_sync_transport(&tr->sync)[0])
    fprintf(o, "# gradients: %d buckets, %s\n", tr->sync.ddp.n_buckets, dt_sync_transport(&tr->sync));
  if (!tr->be.ops->host_memory && tr->mesh.size > 1) {
    int aware = dt_mpi_cuda_aware();
    if (!strcmp(tr->cfg.device_comm, "mpi"))
      fprintf(o, "# device communication: MPI, each call staged through pinned host memory (system.device_comm = mpi; "
              "MPI reports CUDA-aware: %s)\n", aware > 0 ? "yes, unused" : aware == 0 ? "no" : "cannot say");
    else
      fprintf(o, "# device communication: NCCL on the GPUs' streams (system.device_comm = nccl)\n");
  }
  if (strcmp(tr->cfg.device_comm, "nccl") && tr->be.ops->host_memory)
    fprintf(o, "# note: system.device_comm = %s has no effect on the %s backend (its buffers go over MPI as they are)\n",
            tr->cfg.device_comm, tr->be.ops->name);
  if (tr->cfg.tf32 && tr->be.ops->host_memory)
    fprintf(o, "# note: system.tf32 = true has no effect on the %s backend (fp32 matmuls)\n", tr->be.ops->name);
  dt_train_print_precision(o, (dt_precision_t)tr->be.precision, &tr->scaler);
  if (tr->be.precision != DT_PREC_FP32 && !tr->be.ops->host_memory)
    fprintf(o, "# storage: %s (system.store16 = %s%s)\n",
            tr->be.act_bytes == 2 ? "16 bits for the activations, their gradients and the weights' working copy"
                                  : "float values rounded to the precision",
            tr->cfg.store16,
            tr->be.act_bytes == 2 || strcmp(tr->cfg.store16, "auto") ? ""
                                                                    : "; 16-bit storage needs system.attention = "
                                                                      "flash or cudnn");
  fprintf(o, "# FLOPs per token = 6*(12*L*C^2 + C*Vp) + 12*L*T*C = %.4g (fwd+bwd, full TxT attention)\n",
          tr->flops_per_token);
}

void dt_train_print_precision(FILE *o, dt_precision_t p, const dt_scaler_t *s) {
  if (p != DT_PREC_FP32)
    fprintf(o, "# precision: %s weights/activations/activation gradients, fp32 master weights and accumulation%s\n",
            dt_precision_name(p), s->enabled ? "; dynamic loss scaling (GradScaler rule)" : "");
  if (s->enabled)
    fprintf(o, "# loss scale: %g, x2 after %d clean steps, x0.5 and skip on inf/NaN (agreed over all ranks)\n",
            s->scale, s->interval);
}

/* Pipeline bubble: each stage's mean forward, backward and micro-step-loop time per step (over
 * pp_comm, collective), the idle share they imply, 1F1B's prediction for equal stages and the
 * schedule simulated with these stages' own compute times (pipeline.h). Rank 0 prints. */
static dt_status_t pp_report(dt_trainer_t *tr) {
  const int pp = tr->mesh.pp, m = tr->accum, n = tr->n_pp_steps;
  double mine[3] = {tr->t_pp_fwd / n, tr->t_pp_bwd / n, tr->t_pp_step / n}, *all = malloc(sizeof(double) * 3 * pp),
         *tf = malloc(sizeof(double) * 2 * pp);
  if (!all || !tf) {
    free(all);
    free(tf);
    return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", tr->mesh.rank);
  }
  dt_status_t st = tr->mesh.pp_comm->ops->allgather(tr->mesh.pp_comm, mine, all, 3, DT_F64, NULL, NULL);
  if (st == DT_OK && is_root(tr)) {
    double *tb = tf + pp, idle = 0;
    char line[2048];
    int k = 0;
    for (int s = 0; s < pp; s++) {
      const double *x = all + 3 * s;
      tf[s] = x[0] / m, tb[s] = x[1] / m;
      idle += 1.0 - (x[0] + x[1]) / x[2];
      if (k < (int)sizeof line - 96)
        k += snprintf(line + k, sizeof line - (size_t)k, "%s s%d %.1f/%.1f/%.1f", s ? "," : "", s, 1e3 * x[0], 1e3 * x[1],
                      1e3 * x[2]);
    }
    double T = dt_pp_simulate(pp, m, tf, tb, NULL), sim = 0;
    for (int s = 0; s < pp; s++) sim += 1.0 - m * (tf[s] + tb[s]) / T;
    printf("# pp: 1F1B over %d stages x %d micro-batches, ms per step forward/backward/whole micro-step loop:%s\n", pp,
           m, line);
    printf("# pp: bubble (idle share of the micro-step loop, mean over stages) %.1f%% measured; 1F1B predicts "
           "(pp-1)/(m+pp-1) = %.1f%% for equal stages, %.1f%% for these stages' measured compute times\n",
           100.0 * idle / pp, 100.0 * dt_pp_bubble(pp, m), T > 0 ? 100.0 * sim / pp : -1.0);
  }
  free(all);
  free(tf);
  return st;
}

/* dt_run_loop's view of the trainer (run_loop.h) */
static dt_status_t run_step(void *t, dt_step_row_t *row) { return dt_trainer_step(t, row); }
static dt_status_t run_save(void *t) { return dt_trainer_save(t); }
static dt_status_t run_eval(void *t, dt_step_row_t *row) {
  dt_trainer_t *tr = t;
  return dt_trainer_eval(tr, tr->val, tr->cfg.eval_batches, &row->val_loss);
}

/* the header, then the memory plan and roofline */
static void run_header(void *t) {
  dt_trainer_t *tr = t;
  print_header(tr);
  dt_plan_print_run(&tr->cfg, tr->cfg_name, tr->mesh.size, tr->mesh.threads, !tr->be.ops->host_memory, stdout);
}

dt_status_t dt_trainer_run(dt_trainer_t *tr) {
  const dt_config_t *c = &tr->cfg;
  const int start = tr->step;
  dt_run_loop_t L = {.t = tr,
                     .cfg = c,
                     .mesh = &tr->mesh,
                     .metrics = &tr->metrics,
                     .step = &tr->step,
                     .step_fn = run_step,
                     .eval_fn = tr->val ? run_eval : NULL,
                     .save_fn = run_save,
                     .header_fn = run_header};
  DT_TRY(dt_run_loop(&L, &tr->stopped_by_signal));
  if (tr->stopped_by_signal) return DT_OK;
  if (tr->mesh.pp > 1 && tr->n_pp_steps > 0) DT_TRY(pp_report(tr));
  int nsteps = tr->step - start;
  if (is_root(tr)) tr->sync.ops->report(&tr->sync, nsteps, stdout); /* communication hidden */
  if (is_root(tr)) /* measured vs plan */
    dt_plan_print_rss(c, tr->cfg_name, tr->mesh.size, tr->mesh.threads, !tr->be.ops->host_memory,
                      tr->saved_step >= 0 || tr->resumed_step >= 0, stdout);
  double dev_used = 0;
  if (is_root(tr) && tr->mesh.device >= 0 && dt_cuda_mem_used(tr->mesh.device, &dev_used) == DT_OK)
    dt_plan_print_device(c, tr->cfg_name, tr->mesh.size, tr->mesh.threads, dev_used, stdout);
  if (is_root(tr) && tr->be.sparse) dt_cuda_print_sparse(&tr->be, stdout);
  /* The final state is always saved, unless it is already on disk. */
  if (tr->saved_step != tr->step && tr->resumed_step != tr->step) DT_TRY(dt_trainer_save(tr));
  return DT_OK;
}
