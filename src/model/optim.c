/* Learning-rate schedule (linear warmup, then cosine decay to min_lr or constant) and the
 * global-norm clipping factor with torch.nn.utils.clip_grad_norm_ semantics. The per-element
 * AdamW arithmetic is dt_adamw_update in kmath.h, run by each backend. */
#include <math.h>
#include <string.h>

#include "optim.h"

double dt_lr_at(const dt_config_t *cfg, int step) {
  if (step < cfg->warmup) return cfg->lr * (step + 1) / cfg->warmup;
  if (strcmp(cfg->lr_schedule, "constant") == 0) return cfg->lr;
  int span = cfg->steps - cfg->warmup > 1 ? cfg->steps - cfg->warmup : 1;
  double p = (double)(step - cfg->warmup) / span;
  if (p > 1.0) p = 1.0;
  return cfg->min_lr + 0.5 * (cfg->lr - cfg->min_lr) * (1.0 + cos(M_PI * p));
}

float dt_clip_scale(double grad_norm, double clip) {
  if (clip <= 0.0) return 1.0f;
  double s = clip / (grad_norm + 1e-6);
  return s < 1.0 ? (float)s : 1.0f;
}
