/* Step rows for humans (fixed width) and for programs (JSONL). */
#include "metrics.h"

#include <errno.h>
#include <string.h>

dt_status_t dt_metrics_open(dt_metrics_t *m, const char *jsonl_path) {
  m->out = stdout;
  m->jsonl = NULL;
  if (jsonl_path && jsonl_path[0]) {
    m->jsonl = fopen(jsonl_path, "a");
    if (!m->jsonl) return DT_ERR(DT_ERR_IO, "%s: cannot open metrics file: %s", jsonl_path, strerror(errno));
  }
  return DT_OK;
}

void dt_metrics_close(dt_metrics_t *m) {
  if (m->jsonl) fclose(m->jsonl);
  m->jsonl = NULL;
}

void dt_metrics_header(dt_metrics_t *m) {
  fprintf(m->out, "# %6s %10s %10s %10s %10s %11s %9s %10s\n", "step", "loss", "lr", "grad_norm", "ms",
          "tok/s", "GFLOP/s", "val_loss");
  fflush(m->out);
}

void dt_metrics_row(dt_metrics_t *m, const dt_step_row_t *r) {
  char val[32] = "-";
  if (r->val_loss >= 0) snprintf(val, sizeof val, "%.6f", r->val_loss);
  fprintf(m->out, "  %6d %10.6f %10.3e %10.4f %10.1f %11.0f %9.2f %10s\n", r->step, r->loss, r->lr, r->grad_norm,
          r->ms, r->tok_per_s, r->gflops, val);
  fflush(m->out);
  if (m->jsonl) {
    fprintf(m->jsonl,
            "{\"step\": %d, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.9g, \"ms\": %.3f, \"tok_per_s\": %.1f, "
            "\"gflops\": %.3f",
            r->step, r->loss, r->lr, r->grad_norm, r->ms, r->tok_per_s, r->gflops);
    fprintf(m->jsonl, ", \"sample0\": %llu, \"samples\": %d", r->sample0, r->samples);
    if (r->val_loss >= 0) fprintf(m->jsonl, ", \"val_loss\": %.17g", r->val_loss);
    fprintf(m->jsonl, "}\n");
    fflush(m->jsonl);
  }
}
