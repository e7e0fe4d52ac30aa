/* The step loop shared by the trainers (run_loop.h). */
#include "run_loop.h"

#include <stdio.h>
#include <stdlib.h>

#include "straggler.h"
#include "train.h"

dt_status_t dt_run_straggler(const dt_mesh_t *mesh, const dt_config_t *cfg, int step, double busy, dt_step_row_t *row) {
  const int n = mesh->size;
  row->slowest_rank = -1;
  if (n < 2 || !dt_straggler_due(step, cfg->straggler_every, cfg->log_every)) return DT_OK;
  double *all = malloc(sizeof(double) * 2 * (size_t)n); /* every rank's time, then sort scratch */
  if (!all) return DT_ERR(DT_ERR_NOMEM, "rank %d: out of memory", mesh->rank);
  dt_status_t st = mesh->world->ops->allgather(mesh->world, &busy, all, 1, DT_F64, NULL, NULL);
  if (st == DT_OK) {
    dt_straggler_t s;
    dt_straggler_stats(all, n, all + n, &s);
    row->slowest_rank = s.slowest;
    row->rank_ms_min = 1e3 * s.min, row->rank_ms_median = 1e3 * s.median, row->rank_ms_max = 1e3 * s.max;
  }
  free(all);
  return st;
}

static void straggler_line(const dt_mesh_t *mesh, const dt_step_row_t *row) {
  printf("# straggler: step %d: ms per step outside communication over %d ranks: min %.1f, median %.1f, max %.1f "
         "(slowest: rank %d, host %s)\n",
         row->step, mesh->size, row->rank_ms_min, row->rank_ms_median, row->rank_ms_max, row->slowest_rank,
         mesh->ranks[row->slowest_rank].host);
}

dt_status_t dt_run_loop(const dt_run_loop_t *L, int *stopped) {
  const dt_config_t *c = L->cfg;
  const int root = L->mesh->rank == 0, start = *L->step;
  *stopped = 0;
  if (root) {
    printf("# effective configuration:\n");
    dt_config_write(c, stdout, "#   ");
    dt_mesh_print(L->mesh, stdout);
    L->header_fn(L->t);
    if (!c->ckpt_dir[0]) printf("# no checkpoints: checkpoint.dir is empty (none is read or written)\n");
    dt_metrics_header(L->metrics);
  }
  if (*L->step >= c->steps && root) printf("# nothing to do: step %d of %d already done\n", *L->step, c->steps);
  while (*L->step < c->steps) {
    dt_step_row_t row;
    DT_TRY(L->step_fn(L->t, &row));
    const int step = *L->step, last = step == c->steps;
    if (L->eval_fn && c->eval_every > 0 && (step % c->eval_every == 0 || last)) DT_TRY(L->eval_fn(L->t, &row));
    if ((root || L->metrics->jsonl) && (step % c->log_every == 0 || last || row.val_loss >= 0))
      dt_metrics_row(L->metrics, &row);
    if (root && row.slowest_rank >= 0) straggler_line(L->mesh, &row);
    /* All ranks agree whether a stop was requested. */
    int32_t sig = dt_train_signal_pending() ? 1 : 0;
    if (L->mesh->size > 1)
      DT_TRY(L->mesh->world->ops->allreduce(L->mesh->world, &sig, &sig, 1, DT_I32, DT_MAX, NULL, NULL));
    if (sig) {
      *stopped = 1;
      if (root)
        printf("# stop requested by signal at step %d: %s\n", step,
               c->ckpt_dir[0] ? "writing a checkpoint" : "no checkpoint (checkpoint.dir is empty)");
      return L->save_fn(L->t);
    }
    if (c->ckpt_every > 0 && step % c->ckpt_every == 0) DT_TRY(L->save_fn(L->t));
    if (c->stop_after > 0 && step - start >= c->stop_after) {
      if (root) printf("# stop_after=%d steps reached at step %d\n", c->stop_after, step);
      break;
    }
  }
  return DT_OK;
}
