/* bench/step: time GPT-2 training steps of the CPU backend on random tokens and compare with the
 * sgemm ceiling measured in the same run (and optionally PyTorch). Built by plain `make` as a
 * noinst program (bench/step in the build dir); it is a benchmark, not a test.
 *
 * usage: bench/step [--config FILE.ini] [--layers 12 --heads 12 --embd 768 --vocab 50257
 *                   --batch 4 --seq 256 --threads 2 --steps 5 --warmup 2] [--torch] [--python PY]
 * --config takes [model] n_layer/n_head/n_embd/vocab_size/seq_len, [train] micro_batch/threads
 * from an .ini (dt_config_load); flags after it override. Prints medians over --steps steps. */
#include "dt_build.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend.h"
#include "config.h"
#include "gpt2.h"
#include "model.h"
#include "ops_cpu.h"
#include "optim.h"
#include "profile.h"

#ifndef DT_SRCDIR
#define DT_SRCDIR "."
#endif

typedef struct {
  int L, NH, C, V, B, T, threads, steps, warmup, torch;
  const char *python, *script;
} opts_t;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static int parse_args(opts_t *o, int argc, char **argv) {
  struct { const char *flag; int *dst; } ints[] = {
      {"--layers", &o->L}, {"--heads", &o->NH},   {"--embd", &o->C},   {"--vocab", &o->V},     {"--batch", &o->B},
      {"--seq", &o->T},    {"--threads", &o->threads}, {"--steps", &o->steps}, {"--warmup", &o->warmup}};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--torch")) { o->torch = 1; continue; }
    if (i + 1 >= argc) { fprintf(stderr, "step: %s needs a value\n", a); return 2; }
    const char *v = argv[++i];
    if (!strcmp(a, "--python")) { o->python = v; continue; }
    if (!strcmp(a, "--script")) { o->script = v; continue; }
    if (!strcmp(a, "--config")) {
      dt_config_t cfg;
      dt_config_defaults(&cfg);
      if (dt_config_load(&cfg, v) != DT_OK) { fprintf(stderr, "step: %s\n", dt_err_msg()); return 2; }
      o->L = cfg.n_layer, o->NH = cfg.n_head, o->C = cfg.n_embd, o->V = cfg.vocab_size, o->T = cfg.seq_len;
      o->B = cfg.micro_batch;
      if (cfg.threads > 0) o->threads = cfg.threads;
      continue;
    }
    size_t k = 0;
    for (; k < sizeof ints / sizeof ints[0]; k++)
      if (!strcmp(a, ints[k].flag)) break;
    char *end;
    long x = strtol(v, &end, 10);
    if (k == sizeof ints / sizeof ints[0] || *end || x < 0 || x > (1L << 30)) {
      fprintf(stderr, "step: bad option %s %s\n", a, v);
      return 2;
    }
    *ints[k].dst = (int)x;
  }
  if (o->L < 1 || o->NH < 1 || o->C % o->NH || o->V < 2 || o->B < 1 || o->T < 1 || o->threads < 1 || o->steps < 1) {
    fprintf(stderr, "step: need layers, heads, batch, seq, threads, steps >= 1, vocab >= 2, embd divisible by heads\n");
    return 2;
  }
  return 0;
}

/* The sgemm ceiling on the model's matmul shapes, through dt_cpu_sgemm (the engine the backend
 * uses), in all three forms a training step runs them (ops_cpu.c). The blocks' Conv1D weights W
 * (K,OC): forward out (N,OC) = inp (N,K) W [NN], backward dinp (N,K) = dout (N,OC) W^T [NT] and
 * dW (K,OC) += inp^T dout [TN]; the lm_head's wte (OC,K): forward inp W^T [NT], dinp = dout W
 * [NN], dW (OC,K) += dout^T inp [TN]. Measured
 * in two rounds, before and after the timed steps, so that a machine whose load changes during
 * the run affects the ceiling and the step alike; each (shape, form) time is the median of all
 * its samples. Returns the FLOP-weighted GFLOP/s (one step's matmul FLOPs / their total time). */
enum { SH_N = 5, FORMS = 3, CEIL_REPS = 3, CEIL_MAX = 2 * CEIL_REPS };
typedef struct {
  int N, C, Vp, L, n;
  double t[SH_N][FORMS][CEIL_MAX];
} ceil_t;

static void ceiling_round(ceil_t *c) {
  const int N = c->N, C = c->C, Vp = c->Vp;
  const int K[SH_N] = {C, C, C, 4 * C, C}, OC[SH_N] = {3 * C, C, 4 * C, C, Vp};
  size_t maxa = (size_t)N * 4 * C, maxw = (size_t)Vp * C > (size_t)16 * C * C ? (size_t)Vp * C : (size_t)16 * C * C;
  size_t maxo = (size_t)N * (Vp > 4 * C ? Vp : 4 * C);
  float *A = malloc(maxa * sizeof(float)), *W = malloc(maxw * sizeof(float)), *O = malloc(maxo * sizeof(float));
  float *G = malloc(maxw * sizeof(float));
  if (!A || !W || !O || !G) { fprintf(stderr, "step: out of memory for the sgemm ceiling\n"); exit(1); }
  dt_rng_t r;
  dt_rng_seed(&r, 3);
  for (size_t i = 0; i < maxa; i++) A[i] = (float)dt_rng_uniform(&r) - 0.5f;
  for (size_t i = 0; i < maxw; i++) W[i] = (float)dt_rng_uniform(&r) - 0.5f;
  for (size_t i = 0; i < maxo; i++) O[i] = (float)dt_rng_uniform(&r) - 0.5f;
  memset(G, 0, maxw * sizeof(float));
  for (int rep = -1; rep < CEIL_REPS; rep++) /* rep -1 warms up */
    for (int s = 0; s < SH_N; s++)
      for (int f = 0; f < FORMS; f++) {
        double t0 = omp_get_wtime();
        if (s < SH_N - 1) { /* Conv1D */
          if (f == 0) dt_cpu_sgemm(0, 0, N, OC[s], K[s], 1.0f, A, K[s], W, OC[s], 0.0f, O, OC[s]);
          if (f == 1) dt_cpu_sgemm(0, 1, N, K[s], OC[s], 1.0f, O, OC[s], W, OC[s], 0.0f, A, K[s]);
          if (f == 2) dt_cpu_sgemm(1, 0, K[s], OC[s], N, 1.0f, A, K[s], O, OC[s], 1.0f, G, OC[s]);
        } else { /* lm_head */
          if (f == 0) dt_cpu_sgemm(0, 1, N, OC[s], K[s], 1.0f, A, K[s], W, K[s], 0.0f, O, OC[s]);
          if (f == 1) dt_cpu_sgemm(0, 0, N, K[s], OC[s], 1.0f, O, OC[s], W, K[s], 0.0f, A, K[s]);
          if (f == 2) dt_cpu_sgemm(1, 0, OC[s], K[s], N, 1.0f, O, OC[s], A, K[s], 1.0f, G, K[s]);
        }
        if (rep >= 0) c->t[s][f][c->n + rep] = omp_get_wtime() - t0;
      }
  c->n += CEIL_REPS;
  free(A), free(W), free(O), free(G);
}

static double ceiling_report(ceil_t *c) {
  const int C = c->C, K[SH_N] = {C, C, C, 4 * C, C}, OC[SH_N] = {3 * C, C, 4 * C, C, c->Vp};
  const int count[SH_N] = {c->L, c->L, c->L, c->L, 1};
  const char *what[SH_N] = {"qkv   (BT x C) x (C x 3C)", "proj  (BT x C) x (C x C)", "fc    (BT x C) x (C x 4C)",
                            "fcprj (BT x 4C) x (4C x C)", "head  (BT x C) x (C x Vp)"};
  const char *form[2][FORMS] = {{"fwd NN", "dinp NT", "dW TN"}, {"fwd NT", "dinp NN", "dW TN"}};
  double tot_f = 0, tot_t = 0, fwd_f = 0, fwd_t = 0;
  for (int s = 0; s < SH_N; s++) {
    double f = 2.0 * c->N * K[s] * OC[s], gf[FORMS];
    for (int k = 0; k < FORMS; k++) {
      double tm = median(c->t[s][k], c->n);
      gf[k] = f / tm * 1e-9;
      tot_f += f * count[s], tot_t += tm * count[s];
      if (k == 0) fwd_f += f * count[s], fwd_t += tm * count[s];
    }
    const char *const *fm = form[s == SH_N - 1];
    printf("#   sgemm %-28s N=%-6d GFLOP/s %s %6.1f  %s %6.1f  %s %6.1f\n", what[s], c->N, fm[0], gf[0], fm[1], gf[1],
           fm[2], gf[2]);
  }
  printf("# sgemm ceiling: %.1f GFLOP/s over all three forms (forwards alone: %.1f), medians of %d samples taken "
         "before and after the steps\n", tot_f / tot_t * 1e-9, fwd_f / fwd_t * 1e-9, c->n);
  return tot_f / tot_t * 1e-9;
}

#define CK(x)                                                                  \
  do {                                                                         \
    if ((x) != DT_OK) {                                                        \
      fprintf(stderr, "step: %s failed: %s\n", #x, dt_err_msg());              \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  opts_t o = {.L = 12, .NH = 12, .C = 768, .V = 50257, .B = 4, .T = 256, .threads = 2, .steps = 5, .warmup = 2,
              .python = "/usr/bin/python3", .script = DT_SRCDIR "/bench/torch_gpt2.py"};
  int rc = parse_args(&o, argc, argv);
  if (rc) return rc;
  dt_dims_t d = {.L = o.L, .NH = o.NH, .C = o.C, .V = o.V, .Vp = (o.V + 127) / 128 * 128, .T = o.T};
  if (o.threads > 0) omp_set_num_threads(o.threads);
  static ceil_t cl; /* first ceiling round before the backend exists (peak RSS stays the step's) */
  cl = (ceil_t){.N = o.B * o.T, .C = d.C, .Vp = d.Vp, .L = d.L};
  ceiling_round(&cl);
  dt_layout_t lay;
  CK(dt_layout_init(&lay, d));
  dt_backend_t be = {0};
  CK(dt_backend_cpu.init(&be, &lay, o.B, o.T, o.threads));
  dt_gpt2_t gpt;
  CK(dt_gpt2_init(&gpt, &be, 1, 0));
  dt_model_init_params(&lay, be.params, 1337);
  const int N = o.B * o.T;
  int *inp = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
  dt_rng_t r;
  dt_rng_seed(&r, 42);
  for (int i = 0; i < N; i++) inp[i] = (int)(dt_rng_next(&r) % (uint64_t)o.V), tgt[i] = (int)(dt_rng_next(&r) % (uint64_t)o.V);

  const char *ct = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
  printf("# bench/step: L=%d NH=%d C=%d V=%d Vp=%d B=%d T=%d threads=%d params=%zu steps=%d warmup=%d\n", d.L, d.NH,
         d.C, d.V, d.Vp, o.B, o.T, o.threads, lay.n_params_true, o.steps, o.warmup);
  printf("# blas: %s (%s); OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s; omp_get_max_threads=%d\n", DT_BLAS_NAME,
         dt_cpu_gemm_engine(), ct ? ct : "(unset)", l2 ? l2 : "(unset)", omp_get_max_threads());

  enum { PH_TOTAL, PH_FWD, PH_BWD, PH_OPT, PH_N };
  int n = o.steps;
  double *ph[PH_N], *prof[DT_PROF_N];
  for (int k = 0; k < PH_N; k++) ph[k] = calloc((size_t)n, sizeof(double));
  for (int k = 0; k < DT_PROF_N; k++) prof[k] = calloc((size_t)n, sizeof(double));
  dt_adamw_args_t aw = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  float loss = 0;
  dt_profile.enabled = 1;
  for (int s = 0; s < o.warmup + n; s++) {
    memset(dt_profile.sec, 0, sizeof dt_profile.sec);
    double t0 = omp_get_wtime();
    CK(be.ops->zero_grad(&be));
    CK(dt_gpt2_forward(&gpt, inp, tgt, o.B, o.T, &loss));
    double t1 = omp_get_wtime();
    CK(dt_gpt2_backward(&gpt, 1, NULL, NULL));
    double t2 = omp_get_wtime();
    double ss = 0;
    CK(be.ops->grad_sumsq(&be, &ss));
    aw.grad_scale = dt_clip_scale(sqrt(ss), 1.0);
    aw.t = s + 1;
    CK(be.ops->adamw(&be, &aw));
    double t3 = omp_get_wtime();
    if (!isfinite(loss)) { fprintf(stderr, "step: loss is %g at step %d\n", loss, s); return 1; }
    if (s < o.warmup) continue;
    int i = s - o.warmup;
    ph[PH_TOTAL][i] = t3 - t0, ph[PH_FWD][i] = t1 - t0, ph[PH_BWD][i] = t2 - t1, ph[PH_OPT][i] = t3 - t2;
    for (int k = 0; k < DT_PROF_N; k++) prof[k][i] = dt_profile.sec[k];
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double med[PH_N];
  for (int k = 0; k < PH_N; k++) med[k] = median(ph[k], n);
  double fpt = dt_model_flops_per_token(&d, o.T), gflop = fpt * N * 1e-9;
  printf("# step medians (ms): total %.1f  forward %.1f (incl. zero_grad)  backward %.1f  optimizer %.1f "
         "(grad_sumsq + adamw)\n", med[PH_TOTAL] * 1e3, med[PH_FWD] * 1e3, med[PH_BWD] * 1e3, med[PH_OPT] * 1e3);
  printf("# per op kind (median ms, share of the median step):\n");
  double accounted = 0;
  for (int k = 0; k < DT_PROF_N; k++) {
    double m = median(prof[k], n);
    accounted += m;
    if (k < DT_PROF_CONV) /* GPT-2's kinds (profile.h) */
      printf("#   %-13s %9.1f ms %5.1f%%\n", dt_prof_names[k], m * 1e3, 100 * m / med[PH_TOTAL]);
  }
  printf("#   %-13s %9.1f ms %5.1f%%\n", "(other)", (med[PH_TOTAL] - accounted) * 1e3,
         100 * (med[PH_TOTAL] - accounted) / med[PH_TOTAL]);
  printf("# final loss %.4f; peak RSS %.0f MiB\n", loss, ru.ru_maxrss / 1024.0);
  dt_gpt2_free(&gpt);
  be.ops->free(&be);
  ceiling_round(&cl);
  double ceil = ceiling_report(&cl);
  double ach = gflop / med[PH_TOTAL];
  printf("RESULT dtrain step_ms=%.1f tok_s=%.0f gflop_per_step=%.1f gflops=%.1f sgemm_ceiling_gflops=%.1f "
         "of_ceiling=%.0f%% peak_rss_mb=%.0f\n",
         med[PH_TOTAL] * 1e3, N / med[PH_TOTAL], gflop, ach, ceil, 100 * ach / ceil, ru.ru_maxrss / 1024.0);
  fflush(stdout);
  if (o.torch) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s %s --layers %d --heads %d --embd %d --vocab %d --batch %d --seq %d --threads %d --steps %d --warmup %d",
             o.python, o.script, o.L, o.NH, o.C, o.V, o.B, o.T, o.threads, o.steps, o.warmup);
    printf("# + %s\n", cmd);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    char line[512];
    double tms = -1;
    while (p && fgets(line, sizeof line, p)) {
      printf("RESULT %s", line);
      const char *q = strstr(line, "step_ms=");
      if (q) tms = atof(q + 8);
    }
    int st = p ? pclose(p) : -1;
    if (st != 0 || tms <= 0) {
      fprintf(stderr, "step: the PyTorch comparison failed (exit status %d)\n", st);
      return 1;
    }
    printf("RESULT ratio torch_ms/dtrain_ms=%.2f (>1: dtrain faster)\n", tms / (med[PH_TOTAL] * 1e3));
  }
  for (int k = 0; k < PH_N; k++) free(ph[k]);
  for (int k = 0; k < DT_PROF_N; k++) free(prof[k]);
  free(inp), free(tgt);
  dt_layout_free(&lay);
  return 0;
}
