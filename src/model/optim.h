/* Learning-rate schedule and the optimizer step around the backend's AdamW kernel:
 * warmup, cosine decay, global-norm gradient clipping. */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H

#include "config.h"

/* Learning rate for 0-based `step`:
 *   step < warmup: lr * (step + 1) / warmup
 *   cosine: min_lr + 0.5 (lr - min_lr) (1 + cos(pi * p)), p = (step - warmup) / max(1, steps - warmup)
 *   constant: lr */
double dt_lr_at(const dt_config_t *cfg, int step);

/* Scale applied to gradients for global-norm clipping (torch.nn.utils.clip_grad_norm_):
 * min(1, clip / (norm + 1e-6)); 1 when clip == 0. */
float dt_clip_scale(double grad_norm, double clip);

#endif
