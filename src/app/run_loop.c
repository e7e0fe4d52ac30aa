/* The step loop shared by the trainers (run_loop.h). */
#include "run_loop.h"

#include <stdio.h>

#include "train.h"

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
    if (root && L->row_fn) L->row_fn(L->t, &row);
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
