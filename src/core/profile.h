/* Per-op-kind wall-clock timers of the model's kernel calls (gpt2.c, cnn.c) and the CPU backend's
 * optimizer calls (host time: on an asynchronous backend the time to queue the work). Off by
 * default (one predictable branch per op call); a benchmark sets dt_profile.enabled and reads the
 * accumulated seconds. Not thread safe by design: ops are timed from the thread that calls them. */
#ifndef DT_PROFILE_H
#define DT_PROFILE_H

typedef enum {
  DT_PROF_ENCODER, DT_PROF_LAYERNORM, DT_PROF_MATMUL, DT_PROF_LMHEAD, DT_PROF_ATTENTION, DT_PROF_GELU,
  DT_PROF_RESIDUAL, DT_PROF_XENT, DT_PROF_ZERO_GRAD, DT_PROF_GRAD_SUMSQ, DT_PROF_ADAMW,
  /* the image classifiers' kinds (cnn.c) from here on; GPT-2 and the optimizer use the ones above */
  DT_PROF_CONV, DT_PROF_CONV_BWD, DT_PROF_BATCHNORM, DT_PROF_RELU, DT_PROF_POOL,
  DT_PROF_N
} dt_prof_kind_t;

typedef struct {
  int enabled;
  double sec[DT_PROF_N]; /* accumulated since the last reset */
} dt_profile_t;

extern dt_profile_t dt_profile;
extern const char *const dt_prof_names[DT_PROF_N];

/* Wrap one op call: DT_PROF(DT_PROF_GELU, dt_gelu_forward(...)); */
double dt_profile_now(void);
#define DT_PROF(kind, call)                                              \
  do {                                                                   \
    double t0_ = dt_profile.enabled ? dt_profile_now() : 0.0;            \
    call;                                                                \
    if (dt_profile.enabled) dt_profile.sec[kind] += dt_profile_now() - t0_; \
  } while (0)

#endif
