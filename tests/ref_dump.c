/* Dump a small GPT-2 run of the CPU backend for the PyTorch reference (tests/ref/ref_gpt2.py):
 * initial weights and batch, logits / loss / every parameter gradient of one forward+backward,
 * the parameters after 3 clipped AdamW steps on exactly those gradients (optimizer arithmetic in
 * isolation), then 10 AdamW steps (grad-norm clipping, warmup + cosine lr) with their losses and the final
 * parameters. File format: records of { char name[64]; int64 n; float32 data[n] }.
 * Usage: ref_dump OUT.bin */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dump.h"
#include "gpt2.h"
#include "optim.h"

enum { L = 2, NH = 4, C = 64, V = 97, T = 16, B = 3, STEPS = 10 };

static FILE *out;

static void rec(const char *name, const float *x, size_t n) { dump_rec(out, name, x, n); }

static void rec_ints(const char *name, const int *x, size_t n) {
  float *f = malloc(n * sizeof *f);
  for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
  rec(name, f, n);
  free(f);
}

static void rec_arena(const dt_layout_t *lay, const char *prefix, const float *arena) {
  char nm[96];
  for (int i = 0; i < lay->n_tensors; i++) {
    const dt_tensor_t *t = &lay->tensors[i];
    snprintf(nm, sizeof nm, "%s%s", prefix, t->name);
    rec(nm, arena + t->offset, (size_t)t->rows * t->cols);
  }
}

/* Learnable batches: each sequence walks tok[t+1] = (tok[t] + stride) mod V from a random start. */
static void make_batch(dt_rng_t *r, int *inp, int *tgt) {
  for (int b = 0; b < B; b++) {
    int tok = (int)(dt_rng_next(r) % V), stride = 1 + (int)(dt_rng_next(r) % 3);
    for (int t = 0; t < T; t++) {
      inp[b * T + t] = tok;
      tok = (tok + stride) % V;
      tgt[b * T + t] = tok;
    }
  }
}

#define CHECK(x)                                                            \
  do {                                                                      \
    if ((x) != DT_OK) {                                                     \
      fprintf(stderr, "ref_dump: %s failed: %s (%s)\n", #x, dt_err_msg(), dt_err_where()); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ref_dump OUT.bin\n");
    return 2;
  }
  dt_config_t cfg;
  dt_config_defaults(&cfg);
  cfg.n_layer = L;
  cfg.n_head = NH;
  cfg.n_embd = C;
  cfg.vocab_size = V;
  cfg.seq_len = T;
  cfg.steps = STEPS;
  cfg.warmup = 3;
  cfg.lr = 3e-3;
  cfg.min_lr = 3e-4;
  snprintf(cfg.lr_schedule, sizeof cfg.lr_schedule, "cosine");
  cfg.weight_decay = 0.1;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.grad_clip = 1.0;

  dt_layout_t lay;
  CHECK(dt_layout_init(&lay, dt_dims_from_config(&cfg)));
  dt_backend_t be = {0};
  CHECK(dt_backend_cpu.init(&be, &lay, B, T, 2));
  dt_gpt2_t gpt;
  CHECK(dt_gpt2_init(&gpt, &be, 1, 0));
  dt_model_init_params(&lay, be.params, 1234);
  /* give biases and layernorm parameters non-trivial values so their code paths are exercised */
  dt_rng_t r;
  dt_rng_seed(&r, 99);
  for (int i = 0; i < lay.n_tensors; i++) {
    const dt_tensor_t *t = &lay.tensors[i];
    if (t->ndim != 1) continue;
    for (int k = 0; k < t->cols; k++) be.params[t->offset + k] += (float)(0.1 * dt_rng_normal(&r));
  }

  out = fopen(argv[1], "wb");
  if (!out) {
    fprintf(stderr, "ref_dump: cannot open %s\n", argv[1]);
    return 1;
  }
  float dims[] = {L, NH, C, V, (float)lay.d.Vp, T, B, STEPS};
  rec("dims", dims, 8);
  float hp[] = {(float)cfg.lr, (float)cfg.min_lr, (float)cfg.warmup, (float)cfg.weight_decay,
                (float)cfg.beta1, (float)cfg.beta2, (float)cfg.eps, (float)cfg.grad_clip};
  rec("hparams", hp, 8);
  rec_arena(&lay, "param/", be.params);

  /* one forward + backward on a random batch */
  int inp[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) inp[i] = (int)(dt_rng_next(&r) % V), tgt[i] = (int)(dt_rng_next(&r) % V);
  rec_ints("inputs", inp, B * T);
  rec_ints("targets", tgt, B * T);
  float loss = 0;
  CHECK(be.ops->zero_grad(&be));
  CHECK(dt_gpt2_forward(&gpt, inp, tgt, B, T, &loss));
  CHECK(dt_gpt2_backward(&gpt, 1, NULL, NULL));
  float *logits = malloc(sizeof(float) * B * T * lay.d.Vp), *lv = malloc(sizeof(float) * B * T * V);
  CHECK(dt_gpt2_logits_to_host(&gpt, logits));
  for (int i = 0; i < B * T; i++) memcpy(lv + i * V, logits + (size_t)i * lay.d.Vp, V * sizeof(float));
  rec("logits", lv, (size_t)B * T * V);
  rec("loss", &loss, 1);
  rec_arena(&lay, "grad/", be.grads);
  printf("ref_dump: initial loss %.6f\n", loss);

  /* the optimizer alone on identical gradients: clip by the global norm, 3 AdamW steps (t = 1..3)
   * with these grads and lr = cfg.lr; then restore params and zero the moments */
  {
    size_t n = lay.n_params;
    float *p0 = malloc(n * sizeof *p0), *zero = calloc(n, sizeof *zero);
    CHECK(be.ops->copy_to_host(&be, DT_BUF_PARAMS, 0, n, p0));
    double ss;
    CHECK(be.ops->grad_sumsq(&be, &ss));
    float norm = (float)sqrt(ss), scale = dt_clip_scale(sqrt(ss), cfg.grad_clip);
    for (int t = 1; t <= 3; t++) {
      dt_adamw_args_t a = {.lr = (float)cfg.lr, .beta1 = (float)cfg.beta1, .beta2 = (float)cfg.beta2,
                           .eps = (float)cfg.eps, .weight_decay = (float)cfg.weight_decay, .grad_scale = scale,
                           .t = t};
      CHECK(be.ops->adamw(&be, &a));
    }
    rec("opt_norm", &norm, 1);
    rec_arena(&lay, "opt3/", be.params);
    printf("ref_dump: optimizer-only check: grad norm %.6f clip scale %.6f\n", norm, scale);
    CHECK(be.ops->copy_from_host(&be, DT_BUF_PARAMS, 0, n, p0));
    CHECK(be.ops->copy_from_host(&be, DT_BUF_M, 0, n, zero));
    CHECK(be.ops->copy_from_host(&be, DT_BUF_V, 0, n, zero));
    free(p0);
    free(zero);
  }

  /* 10 optimizer steps */
  int sin[STEPS * B * T], stg[STEPS * B * T];
  float losses[STEPS], norms[STEPS], lrs[STEPS], clipped[STEPS];
  for (int s = 0; s < STEPS; s++) make_batch(&r, sin + s * B * T, stg + s * B * T);
  for (int s = 0; s < STEPS; s++) {
    CHECK(be.ops->zero_grad(&be));
    CHECK(dt_gpt2_forward(&gpt, sin + s * B * T, stg + s * B * T, B, T, &losses[s]));
    CHECK(dt_gpt2_backward(&gpt, 1, NULL, NULL));
    double ss;
    CHECK(be.ops->grad_sumsq(&be, &ss));
    double norm = sqrt(ss);
    float scale = dt_clip_scale(norm, cfg.grad_clip);
    dt_adamw_args_t a = {.lr = (float)dt_lr_at(&cfg, s), .beta1 = (float)cfg.beta1, .beta2 = (float)cfg.beta2,
                         .eps = (float)cfg.eps, .weight_decay = (float)cfg.weight_decay, .grad_scale = scale,
                         .t = s + 1};
    CHECK(be.ops->adamw(&be, &a));
    norms[s] = (float)norm;
    lrs[s] = a.lr;
    clipped[s] = scale < 1.0f;
    printf("ref_dump: step %2d loss %.6f grad_norm %.6f lr %.6e clipped %s\n", s, losses[s], norm, a.lr,
           scale < 1.0f ? "yes" : "no");
  }
  rec_ints("step_inputs", sin, STEPS * B * T);
  rec_ints("step_targets", stg, STEPS * B * T);
  rec("step_loss", losses, STEPS);
  rec("step_norm", norms, STEPS);
  rec("step_lr", lrs, STEPS);
  rec("step_clipped", clipped, STEPS);
  rec_arena(&lay, "final/", be.params);
  if (fclose(out) != 0) {
    fprintf(stderr, "ref_dump: cannot write %s\n", argv[1]);
    return 1;
  }
  free(logits);
  free(lv);
  dt_gpt2_free(&gpt);
  be.ops->free(&be);
  dt_layout_free(&lay);
  return 0;
}
