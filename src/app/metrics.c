/* Step rows for humans (fixed width) and for programs (JSONL). */
#include "metrics.h"

#include <errno.h>
#include <math.h>
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

dt_status_t dt_metrics_open_rank(dt_metrics_t *m, const char *jsonl_path, int rank) {
  char path[4096];
  const char *at = jsonl_path ? strstr(jsonl_path, "{rank}") : NULL;
  if (at) {
    int n = snprintf(path, sizeof path, "%.*s%d%s", (int)(at - jsonl_path), jsonl_path, rank, at + 6);
    if (n < 0 || (size_t)n >= sizeof path) return DT_ERR(DT_ERR_CONFIG, "%s: metrics path too long", jsonl_path);
  }
  DT_TRY(dt_metrics_open(m, at ? path : jsonl_path));
  if (rank != 0) m->out = NULL;
  return DT_OK;
}

void dt_metrics_close(dt_metrics_t *m) {
  if (m->jsonl) fclose(m->jsonl);
  m->jsonl = NULL;
}

void dt_metrics_header(dt_metrics_t *m) {
  if (!m->out) return;
  fprintf(m->out, "# %6s %10s %10s %10s %10s %11s %9s %10s%s\n", "step", "loss", "lr", "grad_norm", "ms",
          m->images ? "img/s" : "tok/s", "GFLOP/s", "val_loss", m->images ? "    val_acc    epoch" : "");
  fflush(m->out);
}

void dt_metrics_row(dt_metrics_t *m, const dt_step_row_t *r) {
  char val[32] = "-", acc[48] = "";
  if (r->val_loss >= 0) snprintf(val, sizeof val, "%.6f", r->val_loss);
  if (m->images && r->val_acc >= 0) snprintf(acc, sizeof acc, " %10.4f %8.3f", r->val_acc, r->epoch);
  else if (m->images) snprintf(acc, sizeof acc, " %10s %8.3f", "-", r->epoch);
  if (m->out) {
    fprintf(m->out, "  %6d %10.6f %10.3e %10.4f %10.1f %11.0f %9.2f %10s%s\n", r->step, r->loss, r->lr, r->grad_norm,
            r->ms, r->tok_per_s, r->gflops, val, acc);
    fflush(m->out);
  }
  if (m->jsonl) {
    char gn[32] = "null"; /* JSON has no inf/NaN (an fp16 step skipped for inf gradients) */
    if (isfinite(r->grad_norm)) snprintf(gn, sizeof gn, "%.9g", r->grad_norm);
    fprintf(m->jsonl,
            "{\"step\": %d, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %s, \"ms\": %.3f, \"%s\": %.1f, "
            "\"gflops\": %.3f",
            r->step, r->loss, r->lr, gn, r->ms, m->images ? "img_per_s" : "tok_per_s", r->tok_per_s, r->gflops);
    fprintf(m->jsonl, ", \"sample0\": %llu, \"samples\": %d", r->sample0, r->samples);
    if (!m->images) fprintf(m->jsonl, ", \"tokens\": %llu", r->tokens);
    else fprintf(m->jsonl, ", \"epoch\": %.9g", r->epoch);
    if (r->loss_scale > 0) fprintf(m->jsonl, ", \"loss_scale\": %.17g, \"skipped\": %d", r->loss_scale, r->skipped);
    if (r->val_loss >= 0) fprintf(m->jsonl, ", \"val_loss\": %.17g", r->val_loss);
    if (m->images && r->val_acc >= 0) fprintf(m->jsonl, ", \"val_acc\": %.9g", r->val_acc);
    if (r->slowest_rank >= 0)
      fprintf(m->jsonl, ", \"rank_ms_min\": %.3f, \"rank_ms_median\": %.3f, \"rank_ms_max\": %.3f, \"slowest_rank\": %d",
              r->rank_ms_min, r->rank_ms_median, r->rank_ms_max, r->slowest_rank);
    fprintf(m->jsonl, "}\n");
    fflush(m->jsonl);
  }
}
